//! The per-session and per-IP request planes (docs/design.md, "Streams and sessions",
//! Planes): with `[plane.session]` configured, every request that is not a stream is charged to
//! one plane on top of its route group, the session plane for a *verified* credential and the IP
//! plane for everything else.
//!
//! A credential is verified once the upstream answered a request carrying it with a status other
//! than 401 or 403, and unverified again by a 401 or 403. Until then its requests are charged to
//! the IP plane under the client's key, so rotating made-up tokens the application refuses never
//! earns a fresh bucket, and a forged copy of a victim's token never reaches the victim's bucket
//! (it hashes elsewhere, and it is not verified). What door cannot tell apart: a stolen *valid*
//! credential is its owner's session, and shares its bucket; and a made-up token sent where the
//! application ignores credentials (a public page's 200) is verified, each such verification
//! being one request charged to the sender's IP plane (so at most its burst, then its rate).
//! The fix for that is the application's: a 401 for any credential it does not accept.
//!
//! The verified set is a bounded LRU table of keyed hashes ([`crate::client::credential`]), kept
//! for the life of the process (a reload keeps it, resized to the new `max_clients`); a credential
//! that falls out of it is charged to the IP plane again until its next answered request.

use std::sync::{
    Mutex, PoisonError,
    atomic::{AtomicUsize, Ordering},
};

use door_common::prefix::PrefixKey;
use http::{HeaderMap, StatusCode};
use lru::LruCache;

use smallvec::SmallVec;

use crate::{
    client::credential::{Copies, Credential, CredentialHasher},
    http::head::HeadError,
};

/// Which plane a request is charged to, and under which key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlaneChoice {
    /// `session` or `ip` ([`crate::config::SESSION_PLANE`], [`crate::config::IP_PLANE`]).
    pub plane: &'static str,
    /// The key in that plane: the credential's hash, or the client key.
    pub key: PrefixKey,
    /// The credential's hash when the request carried one (verified or not), to learn from the
    /// upstream's answer.
    pub credential: Option<PrefixKey>,
}

/// The credentials door has seen verified, as keyed hashes.
#[derive(Debug)]
pub struct Sessions {
    hasher: CredentialHasher,
    /// Grows as credentials are verified, up to `capacity`: an LRU cache made with its capacity
    /// allocates all of it at once, which `plane.session.max_clients = 4294967295` (a value the
    /// configuration accepts) turned into an abort at start-up.
    verified: Mutex<LruCache<PrefixKey, ()>>,
    /// At most this many verified credentials (`plane.session.max_clients`; a reload sets it).
    capacity: AtomicUsize,
}

impl Sessions {
    /// At most `capacity` verified credentials remembered (the least recently used forgotten).
    pub fn new(capacity: usize) -> Self {
        Self {
            hasher: CredentialHasher::new(),
            verified: Mutex::new(LruCache::unbounded()),
            capacity: AtomicUsize::new(capacity.max(1)),
        }
    }

    /// Remembers at most `capacity` verified credentials from now on (a reload of
    /// `plane.session.max_clients`): a smaller value forgets the least recently used at once.
    pub fn set_capacity(&self, capacity: usize) {
        /// Entries forgotten per hold of the lock, which every plane request takes: shrinking
        /// millions of entries never stalls the planes for long.
        const BATCH: usize = 4_096;
        let capacity = capacity.max(1);
        self.capacity.store(capacity, Ordering::Relaxed);
        loop {
            let mut verified = self.lock();
            for _ in 0..BATCH {
                if verified.len() <= capacity {
                    return;
                }
                verified.pop_lru();
            }
        }
    }

    /// The plane of a request with `headers` from client `client`, credentials found by
    /// `credential`: the session plane under a verified credential, else the IP plane under
    /// `client`.
    ///
    /// A request whose credential is ambiguous (copies with different values, [`Credential::find`])
    /// verifies nothing. When one of its values is verified already, it is charged to that
    /// session (the first such, in order) and not to the IP plane: a second, made-up copy beside
    /// a session's own (`sid=REAL; SID=x`) must not take its holder off the session's bucket
    /// and onto the IP plane's, a fresh one per client key.
    ///
    /// # Errors
    /// [`HeadError::CredentialCopies`] for a request with more than
    /// [`MAX_COPIES`](crate::client::credential::MAX_COPIES) copies of the credential: every one
    /// of its values would have to be looked up, and leaving any out would let the holder of a
    /// spent session hide its value behind made-up ones.
    pub fn choose(
        &self,
        credential: &Credential,
        headers: &HeaderMap,
        client: PrefixKey,
    ) -> Result<PlaneChoice, HeadError> {
        let copies = Copies::of(credential, headers);
        if copies.is_too_many() {
            return Err(HeadError::CredentialCopies);
        }
        let ip = |credential| PlaneChoice {
            plane: crate::config::IP_PLANE,
            key: client,
            credential,
        };
        let session = |key, credential| PlaneChoice {
            plane: crate::config::SESSION_PLANE,
            key,
            credential,
        };
        if let Some(value) = copies.one() {
            let key = self.hasher.key(value);
            return Ok(if self.is_verified(&key) {
                session(key, Some(key))
            } else {
                ip(Some(key))
            });
        }
        if copies.len() > 1 {
            let keys: SmallVec<[PrefixKey; 2]> =
                copies.values().iter().map(|v| self.hasher.key(v)).collect();
            // One hold of the lock for them all.
            let verified = self.lock();
            if let Some(&key) = keys.iter().find(|k| verified.contains(k)) {
                return Ok(session(key, None));
            }
        }
        Ok(ip(None))
    }

    /// Learns from the upstream's `status` to a request carrying `credential`: 401 and 403
    /// unverify it, anything else verifies it.
    pub fn learn(&self, credential: PrefixKey, status: StatusCode) {
        let mut verified = self.lock();
        if matches!(status, StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN) {
            verified.pop(&credential);
        } else if verified.put(credential, ()).is_none()
            && verified.len() > self.capacity.load(Ordering::Relaxed)
        {
            verified.pop_lru();
        }
    }

    /// Whether `credential` is verified (refreshing it in the LRU order).
    pub fn is_verified(&self, credential: &PrefixKey) -> bool {
        self.lock().get(credential).is_some()
    }

    /// Verified credentials remembered now.
    pub fn verified(&self) -> usize {
        self.lock().len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, LruCache<PrefixKey, ()>> {
        self.verified.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use http::HeaderValue;

    use crate::client::credential::MAX_COPIES;

    use super::*;

    #[test]
    fn a_credential_is_charged_to_the_ip_plane_until_the_upstream_accepts_it() {
        let sessions = Sessions::new(4);
        let cred = Credential::Bearer;
        let mut h = HeaderMap::new();
        h.insert("authorization", HeaderValue::from_static("Bearer tok"));
        let client = PrefixKey::from_ipv4([192, 0, 2, 1]);
        let first = sessions.choose(&cred, &h, client).unwrap();
        assert_eq!(first.plane, "ip");
        assert_eq!(first.key, client);
        let hash = first.credential.unwrap();
        sessions.learn(hash, StatusCode::UNAUTHORIZED);
        assert_eq!(sessions.choose(&cred, &h, client).unwrap().plane, "ip");
        sessions.learn(hash, StatusCode::OK);
        let verified = sessions.choose(&cred, &h, client).unwrap();
        assert_eq!((verified.plane, verified.key), ("session", hash));
        // A later 403 takes the session back.
        sessions.learn(hash, StatusCode::FORBIDDEN);
        assert_eq!(sessions.choose(&cred, &h, client).unwrap().plane, "ip");
        // No credential: the IP plane, nothing to learn.
        let none = sessions.choose(&cred, &HeaderMap::new(), client).unwrap();
        assert_eq!((none.plane, none.credential), ("ip", None));
    }

    /// A verified session's holder who adds a second copy of the cookie (another value, another
    /// spelling of the name) stays on the session's bucket; copies of which none is verified
    /// stay on the IP plane; neither kind is learnt from.
    #[test]
    fn an_ambiguous_credential_is_charged_to_a_verified_value_among_its_copies() {
        let sessions = Sessions::new(4);
        let cred = Credential::Cookie("sid".into());
        let client = PrefixKey::from_ipv4([192, 0, 2, 1]);
        let cookie = |v: &'static str| {
            let mut h = HeaderMap::new();
            h.insert("cookie", HeaderValue::from_static(v));
            sessions.choose(&cred, &h, client).unwrap()
        };
        let real = cookie("sid=REAL").credential.unwrap();
        sessions.learn(real, StatusCode::OK);
        assert_eq!(cookie("sid=REAL").plane, "session");
        for ambiguous in [
            "sid=REAL; SID=x",
            "sid=x; sid=REAL",
            "sid=made-up; sid=other; Sid=REAL",
            "sid=\"unterminated; sid=REAL",
            // PHP's names: a leading space or `+` dropped; Rack 2 splits at `,` too.
            "%20sid=REAL; sid=x",
            "+sid=REAL; sid=x",
            "x=1, sid=REAL; sid=x",
        ] {
            let choice = cookie(ambiguous);
            assert_eq!(
                (choice.plane, choice.key, choice.credential),
                ("session", real, None),
                "{ambiguous}"
            );
        }
        let none = cookie("sid=x; sid=y");
        assert_eq!(
            (none.plane, none.key, none.credential),
            ("ip", client, None)
        );
        // The same value twice is one credential, learnt from as such.
        assert_eq!(cookie("sid=REAL; sid=REAL").credential, Some(real));
        // Made-up values in front of it, up to the most copies read: still the session.
        let padded: String = (0..MAX_COPIES - 1)
            .map(|i| format!("sid=x{i}; "))
            .chain(["sid=REAL".to_owned()])
            .collect();
        let mut h = HeaderMap::new();
        h.insert("cookie", HeaderValue::from_str(&padded).unwrap());
        let choice = sessions.choose(&cred, &h, client).unwrap();
        assert_eq!((choice.plane, choice.key), ("session", real));
        // One more copy and the request is refused, not sent to the IP plane.
        let over = format!("sid=y; {padded}");
        h.insert("cookie", HeaderValue::from_str(&over).unwrap());
        assert_eq!(
            sessions.choose(&cred, &h, client),
            Err(HeadError::CredentialCopies)
        );
        // Unverified, the session's value no longer keeps an ambiguous request off the IP plane.
        sessions.learn(real, StatusCode::UNAUTHORIZED);
        assert_eq!(cookie("sid=REAL; SID=x").plane, "ip");
    }

    #[test]
    fn the_verified_table_is_bounded() {
        let sessions = Sessions::new(2);
        for i in 0..100u8 {
            sessions.learn(PrefixKey::from_ipv4([i, 0, 0, 0]), StatusCode::OK);
        }
        assert_eq!(sessions.verified(), 2);
    }

    /// A reload's `max_clients` applies: more room keeps more sessions, less forgets the least
    /// recently used at once.
    #[test]
    fn the_capacity_follows_a_reload() {
        let sessions = Sessions::new(1);
        let key = |i: u8| PrefixKey::from_ipv4([i, 0, 0, 0]);
        sessions.set_capacity(3);
        for i in 0..3 {
            sessions.learn(key(i), StatusCode::OK);
        }
        assert_eq!(sessions.verified(), 3);
        assert!(sessions.is_verified(&key(0)));
        sessions.set_capacity(2);
        assert_eq!(sessions.verified(), 2);
        assert!(
            !sessions.is_verified(&key(1)),
            "the least recently used goes first"
        );
        assert!(sessions.is_verified(&key(0)) && sessions.is_verified(&key(2)));
    }

    #[test]
    fn a_huge_capacity_allocates_nothing_up_front() {
        // plane.session.max_clients may be 4294967295: the table grows as credentials are
        // verified instead of allocating its capacity at start (which aborted door there, and
        // panics here at usize::MAX).
        let sessions = Sessions::new(usize::MAX);
        let hash = PrefixKey::from_ipv4([192, 0, 2, 1]);
        sessions.learn(hash, StatusCode::OK);
        assert!(sessions.is_verified(&hash));
        assert_eq!(sessions.verified(), 1);
    }
}
