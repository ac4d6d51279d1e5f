//! Protocol upgrades through door (docs/design.md, "Streams and sessions"): an HTTP/1.1
//! `Upgrade` (RFC 9110 §7.8; WebSocket, RFC 6455 §4) and a WebSocket over HTTP/2 (extended
//! CONNECT, RFC 8441), both sent upstream as an HTTP/1.1 upgrade; once the upstream answers `101`,
//! the two connections become a [`crate::http::tunnel`].
//!
//! What a client cannot do through here:
//! - upgrade to `h2c` (RFC 7540 §3.2, removed by RFC 9113): the token and `HTTP2-Settings` never
//!   reach the upstream, so a client cannot smuggle an HTTP/2 connection past door's routes and
//!   limits (h2c smuggling);
//! - switch a connection without the upstream's `101`: any other answer is relayed as a normal
//!   response and the connection stays HTTP (WebSocket request smuggling, where a proxy trusts
//!   the client's `Upgrade` and tunnels anyway);
//! - get a tunnel from a `101` the request did not ask for, or from a WebSocket handshake that is
//!   not a `GET` (RFC 6455 §4.1): door answers 502 instead;
//! - read an upstream's refusal as an open WebSocket: over HTTP/2 a `2xx` to an extended CONNECT
//!   means the tunnel is open (RFC 8441 §5, RFC 9110 §9.3.6), so an upstream's `2xx` other than
//!   `101` to the handshake door sent is a 502, not relayed.

use base64::{Engine as _, engine::general_purpose::STANDARD as BASE64};

use crate::http::head::{HeadError, has_field};
use http::{
    HeaderMap, HeaderName, HeaderValue, Method, Request, Response, StatusCode, Version,
    header::{
        CONNECTION, CONTENT_LENGTH, SEC_WEBSOCKET_ACCEPT, SEC_WEBSOCKET_KEY, SEC_WEBSOCKET_VERSION,
        TE, UPGRADE,
    },
};

/// `HTTP2-Settings` (RFC 7540 §3.2.1): only meaningful with `Upgrade: h2c`, always removed.
static HTTP2_SETTINGS: HeaderName = HeaderName::from_static("http2-settings");

/// The GUID RFC 6455 §1.3 appends to `Sec-WebSocket-Key` for `Sec-WebSocket-Accept`.
const WEBSOCKET_GUID: &str = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11";

/// How a request asks to leave HTTP.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Upgrade {
    /// HTTP/1.1 `Connection: upgrade` with these `Upgrade` tokens (`h2c` removed).
    Http1 {
        /// The `Upgrade` field as sent upstream.
        protocols: HeaderValue,
        /// Whether `websocket` is among them (the handshake must then be a `GET`).
        websocket: bool,
    },
    /// HTTP/2 extended CONNECT (RFC 8441 §4) with `:protocol = websocket`: sent upstream as an
    /// HTTP/1.1 WebSocket handshake with the key door generated.
    ExtendedConnect {
        /// The `Sec-WebSocket-Key` door sent upstream, for checking its `Sec-WebSocket-Accept`.
        key: HeaderValue,
    },
}

/// Why door cannot carry the upstream's answer to an upgrade (a 502). A client's upgrade door
/// refuses is a [`HeadError`] ([`classify`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum UpgradeError {
    /// The upstream answered `101` to a request that asked for no upgrade.
    #[error("the upstream switched protocols on a request that asked for no upgrade")]
    Unrequested,
    /// The upstream answered `101` to a WebSocket handshake that is not a `GET`.
    #[error("the upstream accepted a WebSocket handshake that is not a GET")]
    NotGet,
    /// The upstream's `101` does not carry the `Sec-WebSocket-Accept` of door's key.
    #[error("the upstream's Sec-WebSocket-Accept does not match door's key")]
    BadAccept,
    /// The upstream answered an extended CONNECT's WebSocket handshake with a `2xx` other than
    /// `101`: relayed, it would tell the HTTP/2 client that its WebSocket is open.
    #[error("the upstream answered the WebSocket handshake with a 2xx instead of 101")]
    NotSwitched,
}

/// Reads how `req` asks to upgrade, and makes it safe to forward: `h2c` tokens and
/// `HTTP2-Settings` are removed in every case; an extended CONNECT becomes an HTTP/1.1
/// WebSocket handshake (`GET`, `Upgrade: websocket`, a fresh `Sec-WebSocket-Key`). `None` for a
/// request that does not ask (or only asked for `h2c`, which is dropped).
///
/// # Errors
/// [`HeadError::ConnectProtocol`] for an extended CONNECT that is not `websocket`;
/// [`HeadError::Connect`] for a plain CONNECT, in either protocol.
pub fn classify<B>(req: &mut Request<B>) -> Result<Option<Upgrade>, HeadError> {
    // Found by comparing names first: most requests carry neither, and a removal hashes its name.
    if has_field(req.headers(), &HTTP2_SETTINGS) {
        req.headers_mut().remove(&HTTP2_SETTINGS);
    }
    if req.method() == Method::CONNECT {
        let protocol = req.extensions_mut().remove::<hyper::ext::Protocol>();
        let Some(protocol) = protocol.filter(|_| req.version() == Version::HTTP_2) else {
            return Err(HeadError::Connect);
        };
        if !protocol.as_str().eq_ignore_ascii_case("websocket") {
            return Err(HeadError::ConnectProtocol);
        }
        let key = websocket_key();
        *req.method_mut() = Method::GET;
        let h = req.headers_mut();
        h.insert(SEC_WEBSOCKET_KEY, key.clone());
        if !h.contains_key(SEC_WEBSOCKET_VERSION) {
            h.insert(SEC_WEBSOCKET_VERSION, HeaderValue::from_static("13"));
        }
        return Ok(Some(Upgrade::ExtendedConnect { key }));
    }
    if !has_field(req.headers(), &UPGRADE) {
        return Ok(None);
    }
    if req.version() != Version::HTTP_11 || !has_token(req.headers(), &CONNECTION, "upgrade") {
        req.headers_mut().remove(UPGRADE);
        return Ok(None);
    }
    let tokens: Vec<String> = req
        .headers()
        .get_all(UPGRADE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .filter(|t| !t.is_empty() && !t.eq_ignore_ascii_case("h2c"))
        .map(str::to_owned)
        .collect();
    req.headers_mut().remove(UPGRADE);
    if tokens.is_empty() {
        return Ok(None);
    }
    let websocket = tokens.iter().any(|t| t.eq_ignore_ascii_case("websocket"));
    let Ok(protocols) = HeaderValue::from_str(&tokens.join(", ")) else {
        return Ok(None);
    };
    Ok(Some(Upgrade::Http1 {
        protocols,
        websocket,
    }))
}

impl Upgrade {
    /// Puts the upgrade back on the request door sends upstream, after its hop-by-hop fields were
    /// removed: `Connection: upgrade` (with `te` when `TE: trailers` was passed on) and `Upgrade`.
    pub fn restore<B>(&self, req: &mut Request<B>) {
        let protocols = match self {
            Upgrade::Http1 { protocols, .. } => protocols.clone(),
            Upgrade::ExtendedConnect { .. } => HeaderValue::from_static("websocket"),
        };
        let h = req.headers_mut();
        // One line (some servers read only the first), keeping the `te` option of a passed-on
        // `TE: trailers` (`upstream::prepare`; RFC 9110 §10.1.4).
        let options = if h.contains_key(TE) {
            "upgrade, te"
        } else {
            "upgrade"
        };
        h.insert(CONNECTION, HeaderValue::from_static(options));
        h.insert(UPGRADE, protocols);
    }

    /// Checks the upstream's `101` against what was asked, for a request of `method`.
    ///
    /// # Errors
    /// [`UpgradeError::NotGet`] for a WebSocket handshake that was not a `GET`;
    /// [`UpgradeError::BadAccept`] when an extended CONNECT's accept value is wrong.
    pub fn check(&self, method: &Method, res: &Response<impl Sized>) -> Result<(), UpgradeError> {
        match self {
            Upgrade::Http1 { websocket, .. } => {
                if *websocket && method != Method::GET {
                    return Err(UpgradeError::NotGet);
                }
                Ok(())
            }
            Upgrade::ExtendedConnect { key } => {
                let accept = res.headers().get(SEC_WEBSOCKET_ACCEPT);
                if accept.map(HeaderValue::as_bytes) == Some(websocket_accept(key).as_bytes()) {
                    Ok(())
                } else {
                    Err(UpgradeError::BadAccept)
                }
            }
        }
    }

    /// Checks an upstream's answer other than `101` before it is relayed as a normal response:
    /// for an extended CONNECT a `2xx` would read as the tunnel opened (RFC 8441 §5), so only
    /// other statuses (the upstream's refusal: 4xx, 3xx, 5xx) are relayed.
    ///
    /// # Errors
    /// [`UpgradeError::NotSwitched`] for a `2xx` to an extended CONNECT.
    pub fn check_refusal(&self, status: StatusCode) -> Result<(), UpgradeError> {
        match self {
            Upgrade::ExtendedConnect { .. } if status.is_success() => {
                Err(UpgradeError::NotSwitched)
            }
            _ => Ok(()),
        }
    }

    /// The answer the client gets for the upstream's `101` headers `upstream`: for HTTP/1.1 the
    /// `101` itself with the upstream's end-to-end fields (its `Upgrade`, `Sec-WebSocket-*`,
    /// cookies…); for an extended CONNECT a `200` with the same end-to-end fields but the
    /// switch's own (RFC 8441 §5: no `Upgrade`, `Connection` or accept value over HTTP/2) and any
    /// framing of a body (a `2xx` to a CONNECT has none, RFC 9110 §9.3.6).
    pub fn client_response(&self, upstream: &HeaderMap) -> Response<()> {
        let mut res = Response::new(());
        match self {
            Upgrade::Http1 { .. } => {
                *res.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
                // The upstream's fields but its hop-by-hop ones (`Keep-Alive`, `Proxy-*`, those
                // its `Connection` names: RFC 9110 §7.6.1), then the switch's own two.
                let mut headers = upstream.clone();
                let upgrade: Vec<HeaderValue> = headers.get_all(UPGRADE).iter().cloned().collect();
                crate::http::upstream::strip_hop_by_hop(&mut headers);
                for value in upgrade {
                    headers.append(UPGRADE, value);
                }
                headers.insert(CONNECTION, HeaderValue::from_static("upgrade"));
                *res.headers_mut() = headers;
            }
            Upgrade::ExtendedConnect { .. } => {
                // Its cookies and the application's own fields too, as over HTTP/1.1.
                let mut headers = upstream.clone();
                crate::http::upstream::strip_hop_by_hop(&mut headers);
                for name in [SEC_WEBSOCKET_ACCEPT, CONTENT_LENGTH] {
                    headers.remove(name);
                }
                *res.headers_mut() = headers;
            }
        }
        res
    }
}

/// Whether the comma-separated field `name` lists `token` (case-insensitive, RFC 9110 §5.6.1).
fn has_token(headers: &HeaderMap, name: &HeaderName, token: &str) -> bool {
    headers
        .get_all(name)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| t.trim().eq_ignore_ascii_case(token))
}

/// A fresh `Sec-WebSocket-Key`: 16 random bytes, base64 (RFC 6455 §4.1).
fn websocket_key() -> HeaderValue {
    let mut nonce = [0u8; 16];
    // The system RNG does not fail on Linux; a zero nonce would still be a valid key.
    let _ = ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut nonce);
    HeaderValue::from_str(&BASE64.encode(nonce))
        .unwrap_or(HeaderValue::from_static("AAAAAAAAAAAAAAAAAAAAAA=="))
}

/// `Sec-WebSocket-Accept` for `key`: base64(SHA-1(key + GUID)) (RFC 6455 §4.2.2).
fn websocket_accept(key: &HeaderValue) -> String {
    let mut input = key.as_bytes().to_vec();
    input.extend_from_slice(WEBSOCKET_GUID.as_bytes());
    let digest = ring::digest::digest(&ring::digest::SHA1_FOR_LEGACY_USE_ONLY, &input);
    BASE64.encode(digest.as_ref())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h1(headers: &[(&str, &str)]) -> Request<()> {
        let mut b = Request::get("/chat").version(Version::HTTP_11);
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        b.body(()).unwrap()
    }

    /// The upgrade is put back on one `Connection` line, beside the `te` option of a passed-on
    /// `TE: trailers`.
    #[test]
    fn restore_keeps_the_te_option() {
        let upgrade = Upgrade::Http1 {
            protocols: HeaderValue::from_static("websocket"),
            websocket: true,
        };
        let mut plain = h1(&[]);
        upgrade.restore(&mut plain);
        assert_eq!(plain.headers()[CONNECTION], "upgrade");
        assert_eq!(plain.headers()[UPGRADE], "websocket");
        let mut trailers = h1(&[("te", "trailers"), ("connection", "te")]);
        upgrade.restore(&mut trailers);
        let lines: Vec<_> = trailers.headers().get_all(CONNECTION).iter().collect();
        assert_eq!(lines, ["upgrade, te"]);
    }

    #[test]
    fn the_accept_value_of_rfc_6455() {
        // RFC 6455 §1.3's example.
        let key = HeaderValue::from_static("dGhlIHNhbXBsZSBub25jZQ==");
        assert_eq!(websocket_accept(&key), "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=");
    }

    #[test]
    fn websocket_is_an_upgrade_and_h2c_never_is() {
        let mut req = h1(&[("connection", "Upgrade"), ("upgrade", "websocket")]);
        let up = classify(&mut req).unwrap().unwrap();
        assert!(matches!(
            up,
            Upgrade::Http1 {
                websocket: true,
                ..
            }
        ));
        for h2c in ["h2c", "H2C", " h2c "] {
            let mut req = h1(&[
                ("connection", "Upgrade, HTTP2-Settings"),
                ("upgrade", h2c),
                ("http2-settings", "AAMAAABkAARAAAAAAAIAAAAA"),
            ]);
            assert_eq!(classify(&mut req).unwrap(), None, "{h2c}");
            assert!(req.headers().get(UPGRADE).is_none());
            assert!(req.headers().get(&HTTP2_SETTINGS).is_none());
        }
        let mut req = h1(&[("connection", "upgrade"), ("upgrade", "h2c, websocket")]);
        let Some(Upgrade::Http1 { protocols, .. }) = classify(&mut req).unwrap() else {
            panic!("websocket stays")
        };
        assert_eq!(protocols, "websocket");
        // Without Connection: upgrade, Upgrade is only a hop-by-hop field.
        let mut req = h1(&[("upgrade", "websocket")]);
        assert_eq!(classify(&mut req).unwrap(), None);
    }

    #[test]
    fn a_plain_connect_is_refused_and_an_extended_one_needs_websocket() {
        for version in [Version::HTTP_11, Version::HTTP_2] {
            let mut req = Request::connect("127.0.0.1:22")
                .version(version)
                .body(())
                .unwrap();
            assert_eq!(classify(&mut req), Err(HeadError::Connect), "{version:?}");
        }
        let extended = |protocol: &str| {
            let mut req = Request::connect("/chat")
                .version(Version::HTTP_2)
                .body(())
                .unwrap();
            req.extensions_mut()
                .insert(hyper::ext::Protocol::from(protocol));
            req
        };
        assert_eq!(
            classify(&mut extended("connect-udp")),
            Err(HeadError::ConnectProtocol)
        );
        let mut req = extended("websocket");
        assert!(matches!(
            classify(&mut req),
            Ok(Some(Upgrade::ExtendedConnect { .. }))
        ));
        assert_eq!(req.method(), Method::GET);
    }

    #[test]
    fn a_101_must_answer_a_get_websocket_handshake() {
        let up = Upgrade::Http1 {
            protocols: HeaderValue::from_static("websocket"),
            websocket: true,
        };
        let res = Response::builder().status(101).body(()).unwrap();
        assert_eq!(up.check(&Method::GET, &res), Ok(()));
        assert_eq!(up.check(&Method::POST, &res), Err(UpgradeError::NotGet));
    }

    /// An HTTP/2 client gets the upstream's end-to-end fields of its `101` (a cookie, the
    /// subprotocol, the application's own), as an HTTP/1.1 client does; not the switch's own.
    #[test]
    fn an_extended_connect_answer_carries_the_upstreams_fields() {
        let mut upstream = HeaderMap::new();
        for (k, v) in [
            ("upgrade", "websocket"),
            ("connection", "upgrade, x-hop"),
            ("x-hop", "1"),
            ("sec-websocket-accept", "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="),
            ("sec-websocket-protocol", "chat"),
            ("set-cookie", "sticky=abc"),
            ("x-app", "1"),
            ("content-length", "0"),
        ] {
            upstream.append(k, HeaderValue::from_static(v));
        }
        let up = Upgrade::ExtendedConnect {
            key: HeaderValue::from_static("dGhlIHNhbXBsZSBub25jZQ=="),
        };
        let res = up.client_response(&upstream);
        let mut names: Vec<&str> = res.headers().keys().map(HeaderName::as_str).collect();
        names.sort_unstable();
        assert_eq!(names, ["sec-websocket-protocol", "set-cookie", "x-app"]);
    }
}
