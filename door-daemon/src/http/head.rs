//! What a request head must satisfy before door routes it: the `Host` rules of RFC 9112 §3.2 and
//! RFC 9113 §8.3.1, a request target without userinfo (RFC 9110 §4.2.4), and no transfer coding
//! but `chunked` (RFC 9112 §6.1). hyper parses the framing; these are the rules it leaves to the
//! server, and a proxy that let them pass would let the application and door disagree about which
//! host a request is for, or forward a body whose coding it dropped.

use http::{HeaderValue, Request, StatusCode, Version, header};

/// Why door refuses a request head (400, or 501 for a transfer coding).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HeadError {
    /// An HTTP/1.1 request without a `Host` field (RFC 9112 §3.2: 400).
    #[error("an HTTP/1.1 request needs a Host field")]
    MissingHost,
    /// More than one `Host` field line (RFC 9112 §3.2: 400).
    #[error("the request has {0} Host fields; one is allowed")]
    RepeatedHost(usize),
    /// A `Host` value that is neither empty nor `uri-host [ ":" port ]` (RFC 9110 §7.2).
    #[error("Host {0:?} is not a host with an optional port")]
    BadHost(String),
    /// A request target whose authority carries userinfo (`user@host`), which RFC 9110 §4.2.4
    /// deprecates for `http` and `https` and asks recipients to treat as an error.
    #[error("the request target {0:?} carries userinfo")]
    Userinfo(String),
    /// An HTTP/2 request whose `Host` names another authority than its `:authority` (RFC 9113
    /// §8.3.1: malformed).
    #[error("Host {host:?} differs from :authority {authority:?}")]
    HostNotAuthority {
        /// The `Host` field's value.
        host: String,
        /// The `:authority` pseudo-header's value.
        authority: String,
    },
    /// A transfer coding other than `chunked`: door cannot undo it, and forwarding the body
    /// without it would hand the application bytes it cannot read (RFC 9112 §6.1: 501).
    #[error("transfer coding {0:?} is not supported; only chunked is")]
    TransferCoding(String),
}

impl HeadError {
    /// The status door answers with: 501 for a transfer coding, 400 for the rest.
    pub const fn status(&self) -> StatusCode {
        match self {
            Self::TransferCoding(_) => StatusCode::NOT_IMPLEMENTED,
            _ => StatusCode::BAD_REQUEST,
        }
    }
}

/// Checks `req`'s head (see the module docs).
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
    if let Some(host) = host
        && !host.is_empty()
        && !is_host(host.as_bytes())
    {
        return Err(HeadError::BadHost(lossy(host)));
    }
    if let Some(authority) = req.uri().authority() {
        if authority.as_str().contains('@') {
            return Err(HeadError::Userinfo(authority.as_str().to_owned()));
        }
        // HTTP/1.1 absolute form: the target's authority replaces `Host` (RFC 9112 §3.2.2),
        // which `upstream::prepare` does.
        if req.version() == Version::HTTP_2
            && let Some(host) = host
            && !host
                .as_bytes()
                .eq_ignore_ascii_case(authority.as_str().as_bytes())
        {
            return Err(HeadError::HostNotAuthority {
                host: lossy(host),
                authority: authority.as_str().to_owned(),
            });
        }
    } else if host.is_none() && req.version() == Version::HTTP_11 {
        return Err(HeadError::MissingHost);
    }
    for line in req.headers().get_all(header::TRANSFER_ENCODING) {
        let codings = line
            .to_str()
            .map_err(|_| HeadError::TransferCoding(lossy(line)))?;
        if let Some(other) = codings
            .split(',')
            .map(str::trim)
            // Empty list elements are allowed (RFC 9110 §5.6.1).
            .find(|c| !c.is_empty() && !c.eq_ignore_ascii_case("chunked"))
        {
            return Err(HeadError::TransferCoding(other.to_owned()));
        }
    }
    Ok(())
}

/// Whether `value` is `uri-host [ ":" port ]` (RFC 9110 §7.2, RFC 3986 §3.2.2): an IP literal in
/// brackets (hex digits, `:` and `.`) or a reg-name / IPv4 address (unreserved, sub-delims and `%`
/// characters), then an optional `:` and port of digits only. Checked byte by byte, without
/// copying the value: this runs for every request.
fn is_host(value: &[u8]) -> bool {
    let (host, port) = if let Some(rest) = value.strip_prefix(b"[") {
        let Some(close) = rest.iter().position(|&b| b == b']') else {
            return false;
        };
        let (literal, after) = rest.split_at(close);
        if literal.is_empty()
            || !literal
                .iter()
                .all(|&b| b.is_ascii_hexdigit() || b == b':' || b == b'.')
        {
            return false;
        }
        (&[][..], after.get(1..).unwrap_or_default())
    } else {
        match value.iter().position(|&b| b == b':') {
            Some(i) => value.split_at(i),
            None => (value, &[][..]),
        }
    };
    let reg_name = |b: &u8| b.is_ascii_alphanumeric() || b"-._~%!$&'()*+,;=".contains(b);
    let port_ok = match port.split_first() {
        None => true,
        Some((b':', digits)) => digits.iter().all(u8::is_ascii_digit),
        Some(_) => false,
    };
    port_ok && host.iter().all(reg_name)
}

/// A field value for a message: its bytes as UTF-8, invalid sequences replaced.
fn lossy(value: &HeaderValue) -> String {
    String::from_utf8_lossy(value.as_bytes()).into_owned()
}

#[cfg(test)]
mod tests {
    use http::{Request, Version};

    use super::{HeadError, check};

    fn req(version: Version, target: &str, fields: &[(&str, &str)]) -> Request<()> {
        let mut b = Request::get(target).version(version);
        for (k, v) in fields {
            b = b.header(*k, *v);
        }
        b.body(()).unwrap()
    }

    #[test]
    fn host_rules_of_http11() {
        let v = Version::HTTP_11;
        assert_eq!(check(&req(v, "/", &[("host", "door.test")])), Ok(()));
        for good in [
            "[2001:db8::1]:8443",
            "[2001:db8::1]",
            "192.0.2.1:80",
            "door.test:",
        ] {
            assert_eq!(check(&req(v, "/", &[("host", good)])), Ok(()), "{good}");
        }
        // RFC 9110 §7.2: an empty Host is what a client sends for a target without authority.
        assert_eq!(check(&req(v, "/", &[("host", "")])), Ok(()));
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
            "[::1",
            "[::1]:x1",
            "[::1]x",
            "[]",
            "a.test:80:80",
        ] {
            assert_eq!(
                check(&req(v, "/", &[("host", bad)])),
                Err(HeadError::BadHost(bad.to_owned())),
                "{bad}"
            );
        }
        // Absolute form: the target's authority decides, whatever `Host` says.
        assert_eq!(
            check(&req(v, "http://door.test/x", &[("host", "other.test")])),
            Ok(())
        );
        assert_eq!(check(&req(v, "http://door.test/x", &[])), Ok(()));
        assert_eq!(
            check(&req(v, "http://u:p@door.test/x", &[("host", "door.test")])),
            Err(HeadError::Userinfo("u:p@door.test".to_owned()))
        );
    }

    #[test]
    fn http10_may_omit_host() {
        assert_eq!(check(&req(Version::HTTP_10, "/", &[])), Ok(()));
    }

    #[test]
    fn http2_host_must_name_the_authority() {
        let v = Version::HTTP_2;
        assert_eq!(check(&req(v, "https://door.test/x", &[])), Ok(()));
        assert_eq!(
            check(&req(v, "https://door.test/x", &[("host", "DOOR.test")])),
            Ok(())
        );
        assert_eq!(
            check(&req(v, "https://door.test/x", &[("host", "other.test")])),
            Err(HeadError::HostNotAuthority {
                host: "other.test".to_owned(),
                authority: "door.test".to_owned(),
            })
        );
        // No :authority: `Host` alone names the target.
        assert_eq!(check(&req(v, "/x", &[("host", "door.test")])), Ok(()));
    }

    #[test]
    fn only_chunked_is_a_transfer_coding_door_forwards() {
        let v = Version::HTTP_11;
        let host = ("host", "door.test");
        assert_eq!(
            check(&req(v, "/", &[host, ("transfer-encoding", "chunked")])),
            Ok(())
        );
        assert_eq!(
            check(&req(v, "/", &[host, ("transfer-encoding", "Chunked")])),
            Ok(())
        );
        assert_eq!(
            check(&req(v, "/", &[host, ("transfer-encoding", ", chunked")])),
            Ok(())
        );
        assert_eq!(
            check(&req(
                v,
                "/",
                &[host, ("transfer-encoding", "gzip, chunked")]
            )),
            Err(HeadError::TransferCoding("gzip".to_owned()))
        );
        assert_eq!(
            check(&req(
                v,
                "/",
                &[
                    host,
                    ("transfer-encoding", "chunked"),
                    ("transfer-encoding", "x-custom")
                ]
            )),
            Err(HeadError::TransferCoding("x-custom".to_owned()))
        );
        assert_eq!(
            HeadError::TransferCoding("gzip".to_owned()).status(),
            http::StatusCode::NOT_IMPLEMENTED
        );
        assert_eq!(
            HeadError::MissingHost.status(),
            http::StatusCode::BAD_REQUEST
        );
    }
}
