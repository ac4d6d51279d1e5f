//! What a request head must satisfy before door routes it: the `Host` rules of RFC 9112 §3.2 and
//! RFC 9113 §8.3.1, a target whose authority is a valid `http` or `https` host without userinfo
//! (RFC 9110 §4.2), and `chunked` as the only transfer coding, applied once (RFC 9112 §6.1). hyper
//! parses the framing; these are the rules it leaves to the server. door itself routes on the
//! method and path alone, but the application, or a cache in front of or behind it, may resolve
//! an ambiguous `Host` another way than the next hop; and a body whose coding door dropped would
//! reach the application as bytes it cannot read. [`HeadError`] is also how
//! [`crate::http::upgrade::classify`] refuses a CONNECT door does not carry; every refusal is
//! answered by [`crate::http::answer::bad_head`] and counted in `door.requests_refused`.

use http::{Method, Request, StatusCode, Version, header};

/// At most this many characters of a client's value are repeated in an error message.
const SHOWN: usize = 64;

/// Why door refuses a request head (400, or 501 for a transfer coding it does not implement).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HeadError {
    /// An HTTP/1.1 request without a `Host` field (RFC 9112 §3.2: 400), whatever its target.
    #[error("an HTTP/1.1 request needs a Host field")]
    MissingHost,
    /// More than one `Host` field line (RFC 9112 §3.2: 400).
    #[error("the request has {0} Host fields; one is allowed")]
    RepeatedHost(usize),
    /// A `Host` value that is neither empty nor a host with an optional port (RFC 9110 §7.2; the
    /// forms door accepts are listed at `split_host`). The value as shown: at most 64 characters.
    #[error("Host {0:?} is not a host with an optional port")]
    BadHost(String),
    /// A request target with an authority that is not an `http` or `https` URI with a host and
    /// optional port (RFC 9110 §4.2.1: an empty host is invalid), in authority form (`host:port`)
    /// on a method other than CONNECT (RFC 9112 §3.2.3), or in asterisk form (`*`) on a method
    /// other than OPTIONS (RFC 9112 §3.2.4, RFC 9113 §8.3.1). The target as shown: at most 64
    /// characters.
    #[error("the request target {0:?} is not a path or an http or https URI with a host")]
    BadTarget(String),
    /// A request target whose authority carries userinfo (`user@host`), which RFC 9110 §4.2.4
    /// deprecates for `http` and `https` and asks recipients to treat as an error. The userinfo
    /// is not repeated: it may be a credential.
    #[error("the request target carries userinfo (user@host)")]
    Userinfo,
    /// An HTTP/2 request whose `Host` names another authority than its `:authority`, after
    /// scheme-based normalisation (RFC 9113 §8.3.1, RFC 3986 §6.2.3: host case, default port).
    #[error("Host {host:?} differs from :authority {authority:?}")]
    HostNotAuthority {
        /// The `Host` field's value, as shown: at most 64 characters.
        host: String,
        /// The `:authority` pseudo-header's value, as shown: at most 64 characters.
        authority: String,
    },
    /// A transfer coding other than `chunked`: door cannot undo it, and forwarding the body
    /// without it would hand the application bytes it cannot read (RFC 9112 §6.1: 501). The
    /// coding as shown: at most 64 characters.
    #[error("transfer coding {0:?} is not supported; only chunked is")]
    TransferCoding(String),
    /// `chunked` applied more than once (RFC 9112 §6.1 forbids it: hyper would remove one layer
    /// and door would forward the other as the body), or a `Transfer-Encoding` value that is not
    /// visible ASCII (400).
    #[error("Transfer-Encoding must name chunked once")]
    BadTransferEncoding,
    /// A plain CONNECT, in either protocol (RFC 9110 §9.3.6): door fronts one application and
    /// tunnels to no other host (501; [`crate::http::upgrade::classify`]).
    #[error("door does not tunnel CONNECT to other hosts")]
    Connect,
    /// An HTTP/2 extended CONNECT (RFC 8441) for a protocol other than `websocket`, the only one
    /// door carries (501; [`crate::http::upgrade::classify`]).
    #[error("extended CONNECT for a protocol door does not carry")]
    ConnectProtocol,
    /// With the request planes on, the session credential (its cookie, or `Authorization`)
    /// sent more than [`crate::client::credential::MAX_COPIES`] times (400): no client sends
    /// that many, and the plane would have to look each value up among the verified sessions
    /// ([`crate::http::plane::Sessions::choose`]). Found at the planes, after routing.
    #[error("the session credential is sent more than {max} times", max = crate::client::credential::MAX_COPIES)]
    CredentialCopies,
}

impl HeadError {
    /// The status door answers with: 501 for a transfer coding or a CONNECT it does not
    /// implement, 400 for the rest.
    pub const fn status(&self) -> StatusCode {
        match self {
            Self::TransferCoding(_) | Self::Connect | Self::ConnectProtocol => {
                StatusCode::NOT_IMPLEMENTED
            }
            _ => StatusCode::BAD_REQUEST,
        }
    }

    /// A short fixed name for the `door.reason` attribute of `door.requests_refused`
    /// ([`crate::obs::metrics::Metrics::request_refused`]): one of [`HeadError::REASONS`].
    pub const fn reason(&self) -> &'static str {
        match self {
            Self::MissingHost => "missing_host",
            Self::RepeatedHost(_) => "repeated_host",
            Self::BadHost(_) => "bad_host",
            Self::BadTarget(_) => "bad_target",
            Self::Userinfo => "userinfo",
            Self::HostNotAuthority { .. } => "host_not_authority",
            Self::TransferCoding(_) => "transfer_coding",
            Self::BadTransferEncoding => "bad_transfer_encoding",
            Self::Connect => "connect",
            Self::ConnectProtocol => "connect_protocol",
            Self::CredentialCopies => "credential_copies",
        }
    }

    /// Every value [`HeadError::reason`] returns, in the order docs/operations.md lists them.
    pub const REASONS: [&'static str; 11] = [
        "missing_host",
        "repeated_host",
        "bad_host",
        "bad_target",
        "userinfo",
        "host_not_authority",
        "bad_transfer_encoding",
        "transfer_coding",
        "connect",
        "connect_protocol",
        "credential_copies",
    ];
}

/// Checks `req`'s head (see the module docs). Reads the `Host` and `Transfer-Encoding` fields
/// and the target's authority, byte by byte; allocates only for an error.
///
/// # Errors
///
/// The first rule the head breaks, as a [`HeadError`]; `Ok` for a head door may forward.
pub fn check<B>(req: &Request<B>) -> Result<(), HeadError> {
    let mut hosts = req.headers().get_all(header::HOST).iter();
    let host = hosts.next();
    let extra = hosts.count();
    if extra > 0 {
        return Err(HeadError::RepeatedHost(extra + 1));
    }
    let host_parts = match host {
        Some(h) if !h.is_empty() => {
            Some(split_host(h.as_bytes()).ok_or_else(|| HeadError::BadHost(shown(h.as_bytes())))?)
        }
        _ => None,
    };
    if host.is_none() && req.version() == Version::HTTP_11 {
        return Err(HeadError::MissingHost);
    }
    if req.uri().path() == "*" && req.method() != Method::OPTIONS {
        return Err(HeadError::BadTarget("*".to_owned()));
    }
    // A plain CONNECT (authority form, no scheme) is `upgrade::classify`'s to answer (501); an
    // RFC 8441 extended CONNECT has a scheme and is checked like any request.
    if let Some(authority) = req.uri().authority()
        && !(req.method() == Method::CONNECT && req.uri().scheme().is_none())
    {
        let authority = authority.as_str().as_bytes();
        if authority.contains(&b'@') {
            return Err(HeadError::Userinfo);
        }
        let default_port = match req.uri().scheme_str() {
            Some(s) if s.eq_ignore_ascii_case("http") => 80,
            Some(s) if s.eq_ignore_ascii_case("https") => 443,
            _ => return Err(HeadError::BadTarget(shown(authority))),
        };
        let target = split_host(authority).ok_or_else(|| HeadError::BadTarget(shown(authority)))?;
        // An HTTP/1.1 absolute-form target's authority replaces `Host` (RFC 9112 §3.2.2), which
        // `upstream::prepare` does; an HTTP/2 `Host` must agree with `:authority`.
        if req.version() == Version::HTTP_2
            && let Some(host) = host
        {
            let same = host_parts.is_some_and(|h| same_origin(h, target, default_port));
            if !same {
                return Err(HeadError::HostNotAuthority {
                    host: shown(host.as_bytes()),
                    authority: shown(authority),
                });
            }
        }
    }
    check_transfer_encoding(req.headers())
}

/// Whether `headers` has a field `name`, found by comparing the names rather than hashing `name`
/// as a lookup or removal does: cheaper for the handful of fields of a typical request head, and
/// used on the request path before a lookup or removal that is usually in vain.
pub(crate) fn has_field(headers: &http::HeaderMap, name: &http::HeaderName) -> bool {
    headers.keys().any(|k| k == name)
}

/// `chunked` at most once across every `Transfer-Encoding` line, and no other coding.
fn check_transfer_encoding(headers: &http::HeaderMap) -> Result<(), HeadError> {
    if !has_field(headers, &header::TRANSFER_ENCODING) {
        return Ok(());
    }
    let mut chunked = false;
    for line in headers.get_all(header::TRANSFER_ENCODING) {
        let codings = line.to_str().map_err(|_| HeadError::BadTransferEncoding)?;
        // Empty list elements are allowed (RFC 9110 §5.6.1).
        for coding in codings.split(',').map(str::trim).filter(|c| !c.is_empty()) {
            if !coding.eq_ignore_ascii_case("chunked") {
                return Err(HeadError::TransferCoding(shown(coding.as_bytes())));
            }
            if chunked {
                return Err(HeadError::BadTransferEncoding);
            }
            chunked = true;
        }
    }
    Ok(())
}

/// A host and its port digits (`None`: no `:`; empty: a `:` without digits).
type HostPort<'a> = (&'a [u8], Option<&'a [u8]>);

/// Splits `value` into host and port if it is `uri-host [ ":" port ]` (RFC 9110 §7.2, RFC 3986
/// §3.2.2) in the forms clients send: an IPv6 or IPv4 address in brackets (hex digits, `:` and
/// `.`; neither IPvFuture nor an RFC 6874 zone), or a non-empty reg-name or IPv4 address
/// (unreserved and sub-delims characters; RFC 9110 §4.2.1 makes an empty host invalid), then
/// optionally `:` and a port: digits, at most 65535. `None` for anything else. Byte by byte,
/// without copying: this runs for every request.
///
/// A percent-encoded octet, which RFC 3986 allows in a reg-name, is refused: no client sends
/// one (an internationalised name travels as its `xn--` A-label, RFC 5890), the `http` crate
/// refuses it in an authority, so hyper refuses it in an HTTP/2 `:authority`, and door answers
/// both protocols alike.
fn split_host(value: &[u8]) -> Option<HostPort<'_>> {
    let (host, rest) = if value.first() == Some(&b'[') {
        let close = value.iter().position(|&b| b == b']')?;
        let (host, rest) = value.split_at(close + 1);
        let literal = host.get(1..close)?;
        let ok = !literal.is_empty()
            && literal
                .iter()
                .all(|&b| b.is_ascii_hexdigit() || b == b':' || b == b'.');
        (ok.then_some(host)?, rest)
    } else {
        let end = value.iter().position(|&b| b == b':').unwrap_or(value.len());
        let (host, rest) = value.split_at(end);
        (
            (!host.is_empty() && is_reg_name(host)).then_some(host)?,
            rest,
        )
    };
    match rest.split_first() {
        None => Some((host, None)),
        Some((b':', digits)) if digits.is_empty() || port_number(digits).is_some() => {
            Some((host, Some(digits)))
        }
        Some(_) => None,
    }
}

/// A port's digits as a TCP port number (at most 65535); `None` for anything else. Not
/// `str::parse::<u16>`, which also takes a leading `+` (RFC 3986 §3.2.3: `port = *DIGIT`).
fn port_number(digits: &[u8]) -> Option<u16> {
    if digits.is_empty() || digits.len() > 5 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let n = digits
        .iter()
        .fold(0_u32, |n, d| n * 10 + u32::from(d - b'0'));
    u16::try_from(n).ok()
}

/// Whether `b` stands for itself in a `reg-name` (RFC 3986 §3.2.2): unreserved (ALPHA, DIGIT,
/// `-._~`) and sub-delims (`!$&'()*+,;=`). A `match` rather than a search of a string of them,
/// since every request's `Host` is read through it.
const fn is_reg_name_char(b: u8) -> bool {
    b.is_ascii_alphanumeric()
        || matches!(
            b,
            b'-' | b'.'
                | b'_'
                | b'~'
                | b'!'
                | b'$'
                | b'&'
                | b'\''
                | b'('
                | b')'
                | b'*'
                | b'+'
                | b','
                | b';'
                | b'='
        )
}

/// RFC 3986 §3.2.2 `reg-name` (which includes IPv4 addresses) without percent-encoded octets
/// (see [`split_host`]): unreserved and sub-delims characters.
fn is_reg_name(host: &[u8]) -> bool {
    host.iter().all(|&b| is_reg_name_char(b))
}

/// Whether two host-and-port pairs name the same origin after scheme-based normalisation (RFC
/// 3986 §6.2.3): hosts without regard to case, an absent or empty port read as `default_port`.
fn same_origin(a: HostPort<'_>, b: HostPort<'_>, default_port: u16) -> bool {
    let port = |p: Option<&[u8]>| match p {
        None | Some([]) => Some(default_port),
        Some(digits) => port_number(digits),
    };
    a.0.eq_ignore_ascii_case(b.0) && port(a.1).is_some() && port(a.1) == port(b.1)
}

/// A client's value for an error message: its bytes as UTF-8 (invalid sequences replaced), at
/// most [`SHOWN`] characters, `…` marking a cut.
fn shown(value: &[u8]) -> String {
    let text = String::from_utf8_lossy(value);
    let mut out: String = text.chars().take(SHOWN).collect();
    if text.chars().nth(SHOWN).is_some() {
        out.push('…');
    }
    out
}

#[cfg(test)]
mod tests {
    use http::{Method, Request, StatusCode, Version};

    use super::{HeadError, check};

    /// Every variant has its own `door.reason`, listed in `REASONS` (which the docs repeat), and
    /// its status.
    #[test]
    fn each_refusal_has_its_own_reason_and_status() {
        let s = String::new;
        let all = [
            HeadError::MissingHost,
            HeadError::RepeatedHost(2),
            HeadError::BadHost(s()),
            HeadError::BadTarget(s()),
            HeadError::Userinfo,
            HeadError::HostNotAuthority {
                host: s(),
                authority: s(),
            },
            HeadError::BadTransferEncoding,
            HeadError::TransferCoding(s()),
            HeadError::Connect,
            HeadError::ConnectProtocol,
            HeadError::CredentialCopies,
        ];
        let reasons: Vec<_> = all.iter().map(HeadError::reason).collect();
        assert_eq!(reasons, HeadError::REASONS);
        let not_implemented: Vec<_> = all
            .iter()
            .filter(|e| e.status() == StatusCode::NOT_IMPLEMENTED)
            .map(HeadError::reason)
            .collect();
        assert_eq!(
            not_implemented,
            ["transfer_coding", "connect", "connect_protocol"]
        );
    }

    fn req(version: Version, target: &str, fields: &[(&str, &str)]) -> Request<()> {
        let mut b = Request::get(target).version(version);
        for (k, v) in fields {
            b = b.header(*k, *v);
        }
        b.body(()).unwrap()
    }

    fn host(value: &str) -> Result<(), HeadError> {
        check(&req(Version::HTTP_11, "/", &[("host", value)]))
    }

    #[test]
    fn host_rules_of_http11() {
        let v = Version::HTTP_11;
        for good in [
            "door.test",
            "[2001:db8::1]:8443",
            "[2001:db8::1]",
            "192.0.2.1:80",
            "door.test:",
            "xn--dr-fka.test",
            "door.test:65535",
            // RFC 9110 §7.2: an empty Host is what a client sends for a target without
            // authority.
            "",
        ] {
            assert_eq!(host(good), Ok(()), "{good}");
        }
        assert_eq!(check(&req(v, "/", &[])), Err(HeadError::MissingHost));
        assert_eq!(
            check(&req(v, "/", &[("host", "a.test"), ("host", "b.test")])),
            Err(HeadError::RepeatedHost(2))
        );
        for bad in [
            "a b",
            "user@door.test",
            "door.test/x",
            "door.test:port",
            "door.test:65536",
            "door.test:+80",
            ":80",
            "a%zz",
            "%",
            "%a0",
            "d%C3%B6r.test",
            "[::1",
            "[::1]:x1",
            "[::1]x",
            "[]",
            "[fe80::1%25eth0]",
            "a.test:80:80",
        ] {
            assert_eq!(host(bad), Err(HeadError::BadHost(bad.to_owned())), "{bad}");
        }
        let long = "a".repeat(100);
        let Err(HeadError::BadHost(shown)) = host(&format!("{long} ")) else {
            panic!("a long bad Host must be refused");
        };
        assert_eq!(shown.chars().count(), 65, "64 characters and the cut mark");
    }

    #[test]
    fn absolute_and_authority_form_targets() {
        let v = Version::HTTP_11;
        // The target's authority decides, whatever `Host` says; `Host` must still be there.
        assert_eq!(
            check(&req(v, "http://door.test/x", &[("host", "other.test")])),
            Ok(())
        );
        assert_eq!(
            check(&req(v, "https://door.test:8443/x", &[("host", "")])),
            Ok(())
        );
        assert_eq!(
            check(&req(v, "http://door.test/x", &[])),
            Err(HeadError::MissingHost)
        );
        let h = [("host", "door.test")];
        assert_eq!(
            check(&req(v, "http://u:p@door.test/x", &h)),
            Err(HeadError::Userinfo)
        );
        assert!(
            !HeadError::Userinfo.to_string().contains("u:p"),
            "credentials are not repeated"
        );
        for bad in [
            "http://door.test:http/x",
            "http://door.test:99999/x",
            "http://[fe80::1%25eth0]/x",
            "ftp://door.test/x",
            // Authority form is for CONNECT only.
            "door.test:443",
        ] {
            assert!(
                matches!(check(&req(v, bad, &h)), Err(HeadError::BadTarget(_))),
                "{bad}"
            );
        }
        // The asterisk form is for a server-wide OPTIONS only.
        let mut options = req(v, "*", &h);
        *options.method_mut() = Method::OPTIONS;
        assert_eq!(check(&options), Ok(()));
        assert_eq!(
            check(&req(v, "*", &h)),
            Err(HeadError::BadTarget("*".to_owned()))
        );
        // A plain CONNECT is refused later, with 501 (`upgrade::classify`).
        let mut connect = req(v, "door.test:443", &h);
        *connect.method_mut() = Method::CONNECT;
        assert_eq!(check(&connect), Ok(()));
    }

    #[test]
    fn http10_may_omit_host() {
        assert_eq!(check(&req(Version::HTTP_10, "/", &[])), Ok(()));
    }

    #[test]
    fn http2_host_must_name_the_authority() {
        let v = Version::HTTP_2;
        assert_eq!(check(&req(v, "https://door.test/x", &[])), Ok(()));
        for same in ["DOOR.test", "door.test:443", "door.test:"] {
            assert_eq!(
                check(&req(v, "https://door.test/x", &[("host", same)])),
                Ok(()),
                "{same}"
            );
        }
        assert_eq!(
            check(&req(v, "http://door.test:80/x", &[("host", "door.test")])),
            Ok(())
        );
        assert_eq!(
            check(&req(v, "https://door.test/x", &[("host", "other.test")])),
            Err(HeadError::HostNotAuthority {
                host: "other.test".to_owned(),
                authority: "door.test".to_owned(),
            })
        );
        assert!(matches!(
            check(&req(v, "https://door.test/x", &[("host", "door.test:80")])),
            Err(HeadError::HostNotAuthority { .. })
        ));
        assert_eq!(
            check(&req(
                v,
                "https://door.test/x",
                &[("host", "a"), ("host", "a")]
            )),
            Err(HeadError::RepeatedHost(2))
        );
        // No :authority: `Host` alone names the target.
        assert_eq!(check(&req(v, "/x", &[("host", "door.test")])), Ok(()));
    }

    fn te(lines: &[&str]) -> Result<(), HeadError> {
        let mut fields = vec![("host", "door.test")];
        fields.extend(lines.iter().map(|l| ("transfer-encoding", *l)));
        check(&req(Version::HTTP_11, "/", &fields))
    }

    #[test]
    fn only_chunked_once_is_a_transfer_coding_door_forwards() {
        for good in [
            &["chunked"][..],
            &["Chunked"],
            &[", chunked"],
            &["", "chunked"],
        ] {
            assert_eq!(te(good), Ok(()), "{good:?}");
        }
        assert_eq!(
            te(&["gzip, chunked"]),
            Err(HeadError::TransferCoding("gzip".to_owned()))
        );
        assert_eq!(
            te(&["chunked", "x-custom"]),
            Err(HeadError::TransferCoding("x-custom".to_owned()))
        );
        for twice in [
            &["chunked, chunked"][..],
            &["chunked", "chunked"],
            &["chunked, , chunked"],
        ] {
            assert_eq!(te(twice), Err(HeadError::BadTransferEncoding), "{twice:?}");
        }
        assert_eq!(
            HeadError::TransferCoding("gzip".to_owned()).status(),
            StatusCode::NOT_IMPLEMENTED
        );
        assert_eq!(
            HeadError::BadTransferEncoding.status(),
            StatusCode::BAD_REQUEST
        );
        assert_eq!(HeadError::MissingHost.status(), StatusCode::BAD_REQUEST);
    }

    proptest::proptest! {
        /// Whatever bytes a client puts in `Host` (any value hyper would accept as a field),
        /// `check` answers without panicking, and a non-empty `Host` it lets through is one the
        /// `http` crate parses as an authority: the upstream never gets a `Host` door could not
        /// read itself.
        #[test]
        fn any_host_is_answered_and_an_accepted_one_parses(
            bytes in proptest::collection::vec(
                proptest::prop_oneof![
                    proptest::sample::select(b"az09.-:[]%@_~!$&'()*+,;=/?# ".to_vec()),
                    proptest::num::u8::ANY,
                ],
                0..24,
            )
        ) {
            let Ok(value) = http::HeaderValue::from_bytes(&bytes) else {
                return Ok(());
            };
            let mut r = req(Version::HTTP_11, "/", &[]);
            r.headers_mut().insert("host", value.clone());
            if check(&r).is_ok() && !value.is_empty() {
                proptest::prop_assert!(
                    http::uri::Authority::try_from(value.as_bytes()).is_ok(),
                    "{value:?}"
                );
            }
        }
    }
}
