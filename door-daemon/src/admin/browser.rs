//! Refusing what a web page makes a browser send to the admin API.
//!
//! The admin API has no authentication: whoever can reach it is its operator (keep it on
//! loopback or a Unix socket). A browser on the operator's machine can reach a loopback listener
//! too, on behalf of any page it shows:
//!
//! - **Cross-site requests.** A form on any site can `POST` a `text/plain` body to
//!   `http://127.0.0.1:9901/blocks` without JavaScript and without a CORS preflight, and such a
//!   body can be shaped into JSON. So a `POST` must say `Content-Type: application/json`, which a
//!   form cannot send and a script can only after a preflight the admin API never grants.
//! - **DNS rebinding.** A page whose own name the attacker then resolves to 127.0.0.1 reads the
//!   admin API as its own origin (`GET /clients` lists client addresses). Its requests carry the
//!   attacker's name in `Host`, so on a connection made to a loopback address (a loopback
//!   listener's, or `127.0.0.1` through a `0.0.0.0` or `[::]` one) a `Host` naming a DNS name is
//!   refused,
//!   except names that never resolve in public DNS: `localhost` and the special-use domains
//!   `localhost`, `test`, `invalid`, `example` (RFC 6761), `home.arpa` (RFC 8375) and `internal`
//!   (ICANN, 2024), and names without a dot (`door top` sends `door-admin`).
//! - **Whatever a page sends.** A request with an `Origin` field, or with `Sec-Fetch-Site` other
//!   than `none` (what a browser sends when its user typed the address), was made by a page
//!   (Fetch Metadata, W3C; RFC 6454 §7), and is refused whatever its target.
//!
//! `curl`, `door top` and scripts send none of these, and are unaffected. Transmission's RPC
//! host whitelist and Jupyter's local host check answer the same attacks the same way.

use http::{HeaderMap, HeaderValue, StatusCode, header};

use super::ApiError;

/// Special-use domains whose names never resolve in public DNS, so no page can rebind one.
const PRIVATE_SUFFIXES: [&str; 6] = [
    "localhost",
    "test",
    "invalid",
    "example",
    "home.arpa",
    "internal",
];

/// Refuses a request a web page made: one with `Origin` or a page's `Sec-Fetch-Site`, and on a
/// connection made to a `loopback` address one whose `Host` (or absolute-form target's host,
/// `authority`) could be a rebound DNS name. The `Host` rule applies on loopback only: an
/// operator who reaches the listener on another address does so by names of their own.
///
/// # Errors
/// The refusal as an [`ApiError`] naming the value: 403 `cross-origin` for an `Origin` or
/// `Sec-Fetch-Site` field, 403 `host-refused` for the `Host`.
pub fn check(authority: Option<&str>, headers: &HeaderMap, loopback: bool) -> Result<(), ApiError> {
    if let Some(origin) = headers.get(header::ORIGIN) {
        return Err(cross_origin(&format!("Origin: {origin:?}")));
    }
    if let Some(site) = headers.get("sec-fetch-site")
        && site.as_bytes() != b"none"
    {
        return Err(cross_origin(&format!("Sec-Fetch-Site: {site:?}")));
    }
    if loopback {
        // Every host the request names: the target's authority and each `Host` line (hyper
        // serves a head with two), one that is not text refused as a name would be.
        let hosts = authority.map(str::as_bytes).into_iter().chain(
            headers
                .get_all(header::HOST)
                .iter()
                .map(HeaderValue::as_bytes),
        );
        for host in hosts {
            if core::str::from_utf8(host).is_ok_and(rebind_proof) {
                continue;
            }
            let host = String::from_utf8_lossy(host);
            return Err(ApiError::new(
                StatusCode::FORBIDDEN,
                "host-refused",
                format!(
                    "Host {host:?} names a DNS name on a loopback admin listener, as a DNS \
                     rebinding page would: use an address (127.0.0.1), localhost or a name \
                     without a dot"
                ),
            ));
        }
    }
    Ok(())
}

/// Refuses a request body that is not declared `application/json` (parameters allowed): what a
/// `POST` endpoint reads, so that no web form can post to it.
///
/// # Errors
/// 415 `unsupported-media-type` naming the `Content-Type` given.
pub fn json_body(headers: &HeaderMap) -> Result<(), ApiError> {
    let content_type = headers.get(header::CONTENT_TYPE);
    let json = content_type
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|t| t.trim().eq_ignore_ascii_case("application/json"));
    if json {
        return Ok(());
    }
    let given = content_type.map_or_else(|| "none".to_owned(), |v| format!("{v:?}"));
    Err(ApiError::new(
        StatusCode::UNSUPPORTED_MEDIA_TYPE,
        "unsupported-media-type",
        format!(
            "Content-Type {given}: declare the body application/json (curl: -H 'content-type: \
             application/json'); a web form cannot, so no page can post here"
        ),
    ))
}

fn cross_origin(what: &str) -> ApiError {
    ApiError::new(
        StatusCode::FORBIDDEN,
        "cross-origin",
        format!(
            "{what}: requests made by web pages are refused (the admin API has no authentication)"
        ),
    )
}

/// Whether `host` (a `Host` value, port and all) cannot be a rebound public name: an IP
/// literal, a name without a dot, or a name under a special-use domain. A value that is no
/// authority at all (RFC 3986 §3.2, as the `http` crate reads it) names no DNS name either.
fn rebind_proof(host: &str) -> bool {
    let Ok(authority) = host.parse::<http::uri::Authority>() else {
        return true;
    };
    // An IPv6 literal comes bracketed.
    let name = authority.host();
    if name.starts_with('[') {
        return true;
    }
    let name = name.strip_suffix('.').unwrap_or(name).to_ascii_lowercase();
    if name.parse::<std::net::Ipv4Addr>().is_ok() || !name.contains('.') {
        return true;
    }
    PRIVATE_SUFFIXES.iter().any(|suffix| {
        name.strip_suffix(suffix)
            .is_some_and(|rest| rest.ends_with('.'))
    })
}

#[cfg(test)]
mod tests {
    use http::{HeaderName, HeaderValue};

    use super::*;

    fn headers(fields: &[(&'static str, &'static str)]) -> HeaderMap {
        fields
            .iter()
            .map(|(k, v)| (HeaderName::from_static(k), HeaderValue::from_static(v)))
            .collect()
    }

    /// What a GET (`post = false`) or a POST to a `POST` endpoint with `fields` gets.
    fn code(fields: &[(&'static str, &'static str)], loopback: bool, post: bool) -> &'static str {
        let h = headers(fields);
        check(None, &h, loopback)
            .and_then(|()| if post { json_body(&h) } else { Ok(()) })
            .err()
            .map_or("ok", |e| e.code)
    }

    #[test]
    fn a_form_post_from_a_page_is_refused() {
        // What the browser sends for `<form method=POST enctype="text/plain">` on another site.
        let form = [("host", "127.0.0.1:9901"), ("content-type", "text/plain")];
        assert_eq!(code(&form, true, true), "unsupported-media-type");
        let message = json_body(&headers(&form)).err().map(|e| e.message);
        assert_eq!(
            message.as_deref(),
            Some(
                "Content-Type \"text/plain\": declare the body application/json (curl: -H \
                 'content-type: application/json'); a web form cannot, so no page can post here"
            )
        );
        let with_origin = [
            ("host", "127.0.0.1:9901"),
            ("origin", "https://evil.example"),
            ("content-type", "application/json"),
        ];
        assert_eq!(code(&with_origin, true, true), "cross-origin");
        assert_eq!(
            code(&[("host", "127.0.0.1:9901")], true, true),
            "unsupported-media-type"
        );
        // curl with `-H 'content-type: application/json'`.
        let curl = [
            ("host", "127.0.0.1:9901"),
            ("content-type", "Application/JSON; charset=utf-8"),
        ];
        assert_eq!(code(&curl, true, true), "ok");
    }

    #[test]
    fn a_rebound_name_is_refused_on_loopback_only() {
        let rebound = [("host", "rebind.attacker.com:9901")];
        assert_eq!(code(&rebound, true, false), "host-refused");
        assert_eq!(code(&rebound, false, false), "ok");
        for host in [
            "127.0.0.1:9901",
            "127.0.0.1",
            "[::1]:9901",
            "localhost:9901",
            "LOCALHOST.",
            "door-admin",
            "door.localhost",
            "door.test",
            "admin.home.arpa:9901",
        ] {
            let h: HeaderMap = [(
                header::HOST,
                HeaderValue::from_str(host).unwrap_or(HeaderValue::from_static("x")),
            )]
            .into_iter()
            .collect();
            assert!(check(None, &h, true).is_ok(), "{host}");
        }
        for host in [
            "evil.com",
            "localhost.evil.com",
            "attesttest.com",
            "a.xtest",
        ] {
            assert!(!rebind_proof(host), "{host}");
        }
        // An absolute-form target's authority is the host (RFC 9112 §3.2.2).
        let ok_host = headers(&[("host", "127.0.0.1")]);
        assert_eq!(
            check(Some("rebind.attacker.com:9901"), &ok_host, true).map_err(|e| e.code),
            Err("host-refused")
        );
        // Every `Host` line is checked, and one that is not text is refused.
        let two = headers(&[("host", "localhost"), ("host", "rebind.attacker.com")]);
        assert_eq!(
            check(None, &two, true).map_err(|e| e.code),
            Err("host-refused")
        );
        let mut bytes = HeaderMap::new();
        bytes.insert(
            header::HOST,
            HeaderValue::from_bytes(b"caf\xe9.com").unwrap(),
        );
        assert_eq!(
            check(None, &bytes, true).map_err(|e| e.code),
            Err("host-refused")
        );
    }

    #[test]
    fn fetch_metadata_of_a_page_is_refused_but_a_typed_address_is_not() {
        let page = [
            ("host", "127.0.0.1:9901"),
            ("sec-fetch-site", "same-origin"),
        ];
        assert_eq!(code(&page, false, false), "cross-origin");
        let typed = [("host", "127.0.0.1:9901"), ("sec-fetch-site", "none")];
        assert_eq!(code(&typed, true, false), "ok");
    }
}
