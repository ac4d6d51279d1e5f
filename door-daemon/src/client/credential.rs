//! The credential a request carries, for the session plane (docs/design.md, "Streams and
//! sessions", Planes): a named cookie (RFC 6265 §5.4, in any of the `cookie` fields an HTTP/2
//! client may send, RFC 9113 §8.2.3) or an `Authorization: Bearer` token (RFC 6750 §2.1).
//!
//! door never keeps a credential itself: [`CredentialHasher`] turns it into a 128-bit keyed hash
//! with a key drawn at random when the process starts, so the hash means nothing outside this
//! process, cannot be reversed, and is never logged, printed or exported. Two credentials that
//! differ in any byte get unrelated hashes (a forged copy of a victim's token with one byte
//! changed lands elsewhere); without the key, an attacker cannot aim a credential at another's
//! hash.

use std::{
    borrow::Cow,
    hash::{BuildHasher, Hasher},
};

use door_common::prefix::PrefixKey;
use http::{
    HeaderMap,
    header::{AUTHORIZATION, COOKIE},
};
use smallvec::SmallVec;

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
    /// The credential bytes `headers` carry, if any: the value of the cookie of this name across
    /// every `cookie` field, or the bearer token (scheme matched case-insensitively, RFC 9110
    /// §11.1).
    ///
    /// `None` for a request the application may read another credential from than door would:
    /// door would verify its value on the application's answer to the other one, a fresh session
    /// bucket for every made-up value. So a request that carries the credential more than once
    /// with different values (`sid=made-up; sid=REAL`: Python's `http.cookies` and Django read
    /// the last, PHP and ASP.NET the first; `Authorization: Basic …` beside a `Bearer`), or a
    /// value outside its grammar (a cookie value that is not RFC 6265 §4.1.1 `cookie-octet`s once
    /// one pair of double quotes is taken off, as Python and Go take them off; a token that is
    /// not RFC 6750 §2.1 `b64token`), or an empty one, carries none, and is charged to the IP
    /// plane. Cookie names and values are read as the lenient applications read them, so that
    /// every spelling of one cookie is one credential: `%XX` escapes decoded (PHP, Rack, the
    /// `cookie` package of Express decode both), names compared without regard to case (ASP.NET),
    /// with a leading space or `+` dropped and `.`, ` ` and `[` read as `_` (PHP's `$_COOKIE`),
    /// and `,` read as a separator between cookies as `;` is (Rack 2).
    pub fn find<'h>(&self, headers: &'h HeaderMap) -> Option<Cow<'h, [u8]>> {
        Copies::of(self, headers).only_one()
    }

    /// `cookie NAME` or `authorization bearer`, for logs and `door key`.
    pub fn describe(&self) -> String {
        match self {
            Credential::Cookie(name) => format!("cookie {name}"),
            Credential::Bearer => "authorization bearer".to_owned(),
        }
    }
}

/// Every copy of the credential a request carries, in order: its value, or `None` for one that is
/// not a well-formed value ([`Credential::find`] says what each reads). Two inline: most requests
/// carry none or one.
#[derive(Debug, Default)]
pub struct Copies<'h>(SmallVec<[Option<Cow<'h, [u8]>>; 2]>);

/// The most copies of the credential a request may carry (the same value or not): past it the
/// request is refused (400, [`crate::http::head::HeadError::CredentialCopies`]), since an
/// ambiguous credential's values are each hashed and looked up ([`Copies::values`]). A browser
/// holding one cookie name for a few paths or domains sends a few.
pub const MAX_COPIES: usize = 16;

impl<'h> Copies<'h> {
    /// The copies of `credential` in `headers`, in order, at most [`MAX_COPIES`] + 1 of them:
    /// enough to tell a request that carries too many, without reading a head's every pair.
    pub fn of(credential: &Credential, headers: &'h HeaderMap) -> Self {
        Self(match credential {
            Credential::Cookie(name) => headers
                .get_all(COOKIE)
                .iter()
                // `,` too, as Rack 2 splits: a well-formed value never holds one.
                .flat_map(|v| v.as_bytes().split(|b| matches!(b, b';' | b',')))
                .filter_map(|pair| {
                    let pair = trim(pair);
                    let eq = pair.iter().position(|b| *b == b'=')?;
                    let (k, v) = (trim(pair.get(..eq)?), trim(pair.get(eq + 1..)?));
                    same_cookie_name(&percent_decoded(k), name.as_bytes()).then(|| cookie_value(v))
                })
                .take(MAX_COPIES + 1)
                .collect(),
            Credential::Bearer => headers
                .get_all(AUTHORIZATION)
                .iter()
                .map(|v| {
                    let v = trim(v.as_bytes());
                    // The scheme, then a space or a tab (RFC 9110 §11.4 asks for spaces;
                    // Django REST framework's `split()` takes a tab too).
                    let token = v
                        .get(..6)
                        .filter(|scheme| scheme.eq_ignore_ascii_case(b"bearer"))
                        .and_then(|_| v.get(6..))
                        .filter(|rest| matches!(rest.first(), Some(b' ' | b'\t')))
                        .map(trim)?;
                    is_b64token(token).then_some(Cow::Borrowed(token))
                })
                .take(MAX_COPIES + 1)
                .collect(),
        })
    }

    /// The one value every copy carries: `None` when there is no copy, when one of them is not a
    /// well-formed value, when two differ, when the value is empty, or when there are more than
    /// [`MAX_COPIES`] (the ones past those were not read).
    pub fn one(&self) -> Option<&[u8]> {
        if self.is_too_many() {
            return None;
        }
        let mut copies = self.0.iter();
        let first: &[u8] = copies.next()?.as_deref()?;
        copies
            .all(|next| next.as_deref() == Some(first))
            .then_some(first)
            .filter(|v| !v.is_empty())
    }

    /// As [`Copies::one`], the value kept.
    pub fn only_one(self) -> Option<Cow<'h, [u8]>> {
        let one = self.one().is_some();
        self.0.into_iter().next().flatten().filter(|_| one)
    }

    /// The distinct well-formed, non-empty values among the copies, in order: for a request
    /// whose credential is ambiguous, the values the application may read. (A request with more
    /// than [`MAX_COPIES`] copies is refused before this is asked.)
    pub fn values(&self) -> SmallVec<[&[u8]; 2]> {
        let mut out: SmallVec<[&[u8]; 2]> = SmallVec::new();
        for v in self.0.iter().flatten() {
            if !v.is_empty() && !out.contains(&v.as_ref()) {
                out.push(v);
            }
        }
        out
    }

    /// How many copies there are, well-formed or not: at most [`MAX_COPIES`] + 1, as
    /// [`Copies::of`] reads no more.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether the request carries more than [`MAX_COPIES`] copies: it is refused then.
    pub fn is_too_many(&self) -> bool {
        self.0.len() > MAX_COPIES
    }

    /// Whether the request carries no copy.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// Whether the cookie named `got` (escapes decoded) is the cookie named `want`, as the lenient
/// servers read names: without regard to ASCII case, with `+` read as a space and leading
/// spaces dropped (PHP's `urldecode` and its variable names), and with `.`, ` ` and `[` read as
/// `_`.
fn same_cookie_name(got: &[u8], want: &[u8]) -> bool {
    let start = got
        .iter()
        .position(|b| !matches!(b, b' ' | b'+'))
        .unwrap_or(got.len());
    let got = got.get(start..).unwrap_or_default();
    got.len() == want.len()
        && got.iter().zip(want).all(|(g, w)| {
            g.eq_ignore_ascii_case(w) || (*w == b'_' && matches!(g, b'.' | b' ' | b'[' | b'+'))
        })
}

/// A cookie's value as applications read it: one pair of surrounding double quotes taken off,
/// then its `%XX` escapes decoded; `None` unless it is made of RFC 6265 `cookie-octet`s
/// (printable US-ASCII but for `"`, `,`, `;`, `\` and space).
fn cookie_value(v: &[u8]) -> Option<Cow<'_, [u8]>> {
    let v = match v {
        [b'"', inner @ .., b'"'] => inner,
        _ => v,
    };
    v.iter()
        .all(|b| matches!(b, 0x21 | 0x23..=0x2B | 0x2D..=0x3A | 0x3C..=0x5B | 0x5D..=0x7E))
        .then(|| percent_decoded(v))
}

/// `b` with its `%XX` escapes decoded, once; a `%` not followed by two hex digits stays as is
/// (the rust-url project's `percent-encoding`).
fn percent_decoded(b: &[u8]) -> Cow<'_, [u8]> {
    percent_encoding::percent_decode(b).into()
}

/// Whether `t` is an RFC 6750 `b64token`: `1*( ALPHA / DIGIT / "-" / "." / "_" / "~" / "+" /
/// "/" ) *"="`.
fn is_b64token(t: &[u8]) -> bool {
    let body = t.iter().rposition(|b| *b != b'=').map_or(0, |i| i + 1);
    body > 0
        && t.get(..body).is_some_and(|b| {
            b.iter().all(|c| {
                c.is_ascii_alphanumeric() || matches!(c, b'-' | b'.' | b'_' | b'~' | b'+' | b'/')
            })
        })
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
        assert_eq!(c.find(&h).as_deref(), Some(&b"tok"[..]));
        let h = headers(&[("cookie", " malmo_session = tok2 ;x=1")]);
        assert_eq!(c.find(&h).as_deref(), Some(&b"tok2"[..]));
        let h = headers(&[("cookie", "malmo_sessionx=no; xmalmo_session=no")]);
        assert_eq!(c.find(&h).as_deref(), None);
        let h = headers(&[("cookie", "malmo_session=")]);
        assert_eq!(
            c.find(&h).as_deref(),
            None,
            "an empty value is no credential"
        );
    }

    #[test]
    fn a_bearer_token_is_found_with_any_case_of_the_scheme() {
        let c = Credential::Bearer;
        assert_eq!(
            c.find(&headers(&[("authorization", "Bearer abc.def")]))
                .as_deref(),
            Some(&b"abc.def"[..])
        );
        assert_eq!(
            c.find(&headers(&[("authorization", "bearer  xyz ")]))
                .as_deref(),
            Some(&b"xyz"[..])
        );
        assert_eq!(
            c.find(&headers(&[("authorization", "Bearer\txyz")]))
                .as_deref(),
            Some(&b"xyz"[..])
        );
        for none in ["Bearerxyz", "Bearer", "Basic dXNlcg=="] {
            assert_eq!(
                c.find(&headers(&[("authorization", none)])).as_deref(),
                None,
                "{none}"
            );
        }
        assert_eq!(
            c.find(&headers(&[("authorization", "Bearer ")])).as_deref(),
            None
        );
    }

    /// A request the application may read another credential from than door would carries
    /// none: the cookie twice with different values (in one field or two), an empty copy beside
    /// a full one, a value with an escape, a second `Authorization` field of any scheme, a
    /// token outside `b64token`.
    #[test]
    fn a_credential_the_application_may_read_otherwise_is_none() {
        let c = Credential::Cookie("sid".to_owned());
        for fields in [
            &[("cookie", "sid=made-up; sid=real")][..],
            &[("cookie", "sid=made-up"), ("cookie", "sid=real")][..],
            &[("cookie", "sid=; sid=real")][..],
            &[("cookie", "sid=\\123eal")][..],
            &[("cookie", "sid=\"real")][..],
            &[("cookie", "sid=re al")][..],
            &[("cookie", "sid=\"\"")][..],
        ] {
            assert_eq!(c.find(&headers(fields)).as_deref(), None, "{fields:?}");
        }
        // The same value twice is that value; quotes come off as Python and Go take them off.
        let h = headers(&[("cookie", "sid=real; a=1"), ("cookie", "sid=\"real\"")]);
        assert_eq!(c.find(&h).as_deref(), Some(&b"real"[..]));
        // PHP reads `laravel.session` as `laravel_session`: it is the same cookie.
        let c = Credential::Cookie("laravel_session".to_owned());
        let h = headers(&[("cookie", "laravel.session=real; laravel_session=made-up")]);
        assert_eq!(c.find(&h).as_deref(), None);
        assert_eq!(
            c.find(&headers(&[("cookie", "laravel[session=real")]))
                .as_deref(),
            Some(&b"real"[..])
        );
        // Escapes and case: every spelling of one cookie is one credential, and a second
        // spelling of the name with another value makes it none.
        let c = Credential::Cookie("sid".to_owned());
        for (cookie, found) in [
            ("sid=%72eal", Some(&b"real"[..])),
            ("sid=real; sid=%72%65al", Some(&b"real"[..])),
            ("SID=real", Some(&b"real"[..])),
            ("s%69d=real", Some(&b"real"[..])),
            ("s%69d=real; sid=made-up", None),
            ("SID=real; sid=made-up", None),
            ("sid=100%", Some(&b"100%"[..])),
            ("sid=s%3Aabc.def", Some(&b"s:abc.def"[..])),
        ] {
            let h = headers(&[("cookie", cookie)]);
            assert_eq!(c.find(&h).as_deref(), found, "{cookie}");
        }
        let b = Credential::Bearer;
        for fields in [
            &[
                ("authorization", "Basic dXNlcg=="),
                ("authorization", "Bearer made-up"),
            ][..],
            &[
                ("authorization", "Bearer made-up"),
                ("authorization", "Bearer real"),
            ][..],
            &[("authorization", "Bearer a, Bearer b")][..],
            &[("authorization", "Bearer \"real\"")][..],
            &[("authorization", "Bearer ==")][..],
        ] {
            assert_eq!(b.find(&headers(fields)).as_deref(), None, "{fields:?}");
        }
        let h = headers(&[("authorization", "Bearer a.b-c_d~e+f/g==")]);
        assert_eq!(b.find(&h).as_deref(), Some(&b"a.b-c_d~e+f/g=="[..]));
    }

    #[test]
    fn the_copies_past_the_most_read_are_not_read_and_make_no_value() {
        let c = Credential::Cookie("sid".to_owned());
        let read = |n: usize| {
            let field = vec!["sid=real"; n].join("; ");
            let mut h = HeaderMap::new();
            h.insert("cookie", HeaderValue::from_str(&field).unwrap());
            let copies = Copies::of(&c, &h);
            (copies.len(), copies.is_too_many(), c.find(&h).is_some())
        };
        assert_eq!(read(MAX_COPIES), (MAX_COPIES, false, true));
        // One past the most is enough to refuse: a head's every pair is not read for it.
        assert_eq!(read(MAX_COPIES + 1), (MAX_COPIES + 1, true, false));
        assert_eq!(read(5_000), (MAX_COPIES + 1, true, false));
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
