//! The credential a request carries, for the session plane (docs/design.md, "Streams and
//! sessions", "Planes"): a named cookie (RFC 6265 §5.4, in any of the `cookie` fields an HTTP/2
//! client may send, RFC 9113 §8.2.3) or an `Authorization: Bearer` token (RFC 6750 §2.1).
//!
//! door never keeps a credential itself: [`CredentialHasher`] turns it into a 128-bit keyed hash
//! with a key drawn at random when the process starts, so the hash means nothing outside this
//! process, cannot be reversed, and is never logged, printed or exported. Two credentials that
//! differ in any byte get unrelated hashes (a forged copy of a victim's token with one byte
//! changed lands elsewhere); without the key, an attacker cannot aim a credential at another's
//! hash.

use std::hash::{BuildHasher, Hasher};

use door_common::prefix::PrefixKey;
use http::{
    HeaderMap,
    header::{AUTHORIZATION, COOKIE},
};

/// Where the session plane finds a request's credential (`[plane.session]`: `cookie = NAME`
/// or `header = "authorization"`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Credential {
    /// The value of the cookie of this name.
    Cookie(String),
    /// The token of `Authorization: Bearer TOKEN`.
    Bearer,
}

impl Credential {
    /// The credential bytes `headers` carry, if any: the first cookie named so across every
    /// `cookie` field, or the bearer token (scheme matched case-insensitively, RFC 9110 §11.1).
    /// An empty value is no credential.
    pub fn find<'h>(&self, headers: &'h HeaderMap) -> Option<&'h [u8]> {
        match self {
            Credential::Cookie(name) => headers
                .get_all(COOKIE)
                .iter()
                .flat_map(|v| v.as_bytes().split(|b| *b == b';'))
                .find_map(|pair| {
                    let pair = trim(pair);
                    let eq = pair.iter().position(|b| *b == b'=')?;
                    let (k, v) = (trim(pair.get(..eq)?), trim(pair.get(eq + 1..)?));
                    (k == name.as_bytes()).then_some(v)
                })
                .filter(|v| !v.is_empty()),
            Credential::Bearer => headers
                .get_all(AUTHORIZATION)
                .iter()
                .find_map(|v| {
                    let v = trim(v.as_bytes());
                    let scheme = v.get(..7)?;
                    scheme
                        .eq_ignore_ascii_case(b"bearer ")
                        .then(|| trim(v.get(7..).unwrap_or_default()))
                })
                .filter(|v| !v.is_empty()),
        }
    }

    /// `cookie NAME` or `authorization bearer`, for logs and `door key`.
    pub fn describe(&self) -> String {
        match self {
            Credential::Cookie(name) => format!("cookie {name}"),
            Credential::Bearer => "authorization bearer".to_owned(),
        }
    }
}

fn trim(mut b: &[u8]) -> &[u8] {
    while let [b' ' | b'\t', rest @ ..] = b {
        b = rest;
    }
    while let [rest @ .., b' ' | b'\t'] = b {
        b = rest;
    }
    b
}

/// Keyed 128-bit hashes of credentials: two SipHash-1-3 instances (std's `RandomState`, whose
/// keys are drawn from the OS at random), each giving 64 bits. Build one per process.
#[derive(Debug, Clone)]
pub struct CredentialHasher {
    a: std::collections::hash_map::RandomState,
    b: std::collections::hash_map::RandomState,
}

impl Default for CredentialHasher {
    fn default() -> Self {
        Self::new()
    }
}

impl CredentialHasher {
    /// A hasher with fresh random keys.
    pub fn new() -> Self {
        Self {
            a: std::collections::hash_map::RandomState::new(),
            b: std::collections::hash_map::RandomState::new(),
        }
    }

    /// The session plane's key for `credential`: its keyed hash, as the 16 bytes the limiter
    /// keys on.
    pub fn key(&self, credential: &[u8]) -> PrefixKey {
        let half = |s: &std::collections::hash_map::RandomState| {
            let mut h = s.build_hasher();
            h.write(credential);
            h.finish().to_be_bytes()
        };
        let (a, b) = (half(&self.a), half(&self.b));
        let mut addr = [0u8; 16];
        addr[..8].copy_from_slice(&a);
        addr[8..].copy_from_slice(&b);
        PrefixKey { addr }
    }
}

#[cfg(test)]
mod tests {
    use http::HeaderValue;

    use super::*;

    fn headers(fields: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in fields {
            h.append(*k, HeaderValue::from_static(v));
        }
        h
    }

    #[test]
    fn a_cookie_is_found_in_any_cookie_field() {
        let c = Credential::Cookie("malmo_session".to_owned());
        let h = headers(&[("cookie", "a=1; b=2"), ("cookie", "malmo_session=tok; c=3")]);
        assert_eq!(c.find(&h), Some(&b"tok"[..]));
        let h = headers(&[("cookie", " malmo_session = tok2 ;x=1")]);
        assert_eq!(c.find(&h), Some(&b"tok2"[..]));
        let h = headers(&[("cookie", "malmo_sessionx=no; xmalmo_session=no")]);
        assert_eq!(c.find(&h), None);
        let h = headers(&[("cookie", "malmo_session=")]);
        assert_eq!(c.find(&h), None, "an empty value is no credential");
    }

    #[test]
    fn a_bearer_token_is_found_with_any_case_of_the_scheme() {
        let c = Credential::Bearer;
        assert_eq!(
            c.find(&headers(&[("authorization", "Bearer abc.def")])),
            Some(&b"abc.def"[..])
        );
        assert_eq!(
            c.find(&headers(&[("authorization", "bearer  xyz ")])),
            Some(&b"xyz"[..])
        );
        assert_eq!(
            c.find(&headers(&[("authorization", "Basic dXNlcg==")])),
            None
        );
        assert_eq!(c.find(&headers(&[("authorization", "Bearer ")])), None);
    }

    #[test]
    fn one_byte_apart_is_another_key_and_keys_are_per_process() {
        let h = CredentialHasher::new();
        let victim = b"eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJ2aWN0aW0ifQ.c2lnbmF0dXJl";
        let mut forged = *victim;
        forged[forged.len() - 1] ^= 1;
        assert_eq!(h.key(victim), h.key(victim));
        assert_ne!(h.key(victim), h.key(&forged));
        assert_ne!(h.key(victim), CredentialHasher::new().key(victim));
    }
}
