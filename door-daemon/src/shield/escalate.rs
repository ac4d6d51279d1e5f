//! Escalation from layer 7 to layer 4 (docs/design.md, "Flood shield"): a key that was the
//! TCP peer itself and collected `escalate_after` rejections (429, rate or per-client cap, on its
//! own table row: [`counts`]) within `escalate_window` is put on the XDP blocklist for
//! `block_for`, once (not again while blocked).
//! Keys learned through a trusted proxy, and trusted proxies themselves, are never escalated:
//! blocking the proxy would block everyone behind it. Nor are loopback, private, link-local or
//! unique-local peers, nor peers that sent forwarding headers door ignored: those are most likely
//! a proxy or tunnel missing from `trusted_proxies`, and blocking it would take the site down.
//!
//! Memory is bounded: at most [`TRACKED_KEYS`] keys are counted (least recently rejected
//! forgotten first). Time comes from the injected [`Clock`].

use std::{
    num::NonZeroUsize,
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

use door_common::PrefixKey;
use lru::LruCache;

use crate::{
    client::key::KeyDecision,
    limit::{RejectReason, Rejection, Scope},
    obs::logging::RateLimitedWarn,
    time::Clock,
};

/// Keys whose rejections are being counted, at most.
pub const TRACKED_KEYS: usize = 16_384;

/// Whether `rejection` counts towards its client's escalation: a 429 (rate or per-client cap)
/// decided on the client's own table row. A 429 of the group's shared row (the table was full:
/// docs/design.md, "Limits") is the doing of every client without a row, and a 503 of the group
/// cap that of the whole group; neither is counted against the client that happened to ask.
pub fn counts(rejection: &Rejection) -> bool {
    rejection.scope == Scope::Client
        && matches!(
            rejection.reason,
            RejectReason::Rate | RejectReason::ClientConcurrency
        )
}

/// Where escalated keys go: the XDP blocklist in production, a recorder in tests.
pub trait Blocklist: Send + Sync + std::fmt::Debug {
    /// Drops SYNs from `key` for `duration` (or longer, if it is blocked longer already).
    /// Returns whether the block was taken: `false` when it was dropped (a writer's full queue),
    /// which the implementation logs; a failure to write it later is logged too.
    fn block(&self, key: PrefixKey, duration: Duration) -> bool;
}

/// Where a rejected request's key came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeySource {
    /// The untrusted TCP peer itself, a public address: may be escalated.
    Peer,
    /// An address learned through a trusted proxy's headers, or the trusted proxy itself: never.
    ThroughProxy,
    /// An untrusted peer that is local or private, or sent forwarding headers door ignored
    /// (probably a proxy missing from `trusted_proxies`): never.
    LocalPeer,
}

impl KeySource {
    /// Classifies a client-key decision (see the module docs).
    pub fn of(decision: &KeyDecision) -> Self {
        if !decision.is_untrusted_peer() {
            Self::ThroughProxy
        } else if decision.ignored_untrusted_xff || crate::client::is_local(decision.client) {
            Self::LocalPeer
        } else {
            Self::Peer
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Window {
    start_ns: u64,
    rejections: u32,
    /// Clock time until which the key is blocked (0: not blocked).
    blocked_until_ns: u64,
}

/// Counts 429s per key and escalates repeat offenders.
#[derive(Debug)]
pub struct Escalator {
    after: u32,
    window_ns: u64,
    block_for: Duration,
    clock: Arc<dyn Clock>,
    blocklist: Arc<dyn Blocklist>,
    windows: Mutex<LruCache<PrefixKey, Window>>,
    /// Escalations are logged at most once a minute: an attacker with many prefixes (IPv6 /64s
    /// come cheap) would otherwise write a line per prefix; `GET /blocks` lists every block.
    warned: RateLimitedWarn,
}

/// How often an escalation is logged at `warn`, at most (the others at `debug`).
pub const ESCALATION_WARN_INTERVAL: Duration = Duration::from_mins(1);

impl Escalator {
    /// Escalates after `after` rejections within `window` (both from `[xdp]`), blocking for
    /// `block_for`. `after` must be at least 1 (0 means "off": build no escalator).
    pub fn new(
        after: u32,
        window: Duration,
        block_for: Duration,
        clock: Arc<dyn Clock>,
        blocklist: Arc<dyn Blocklist>,
    ) -> Self {
        Self {
            after: after.max(1),
            window_ns: u64::try_from(window.as_nanos()).unwrap_or(u64::MAX),
            block_for,
            clock,
            blocklist,
            windows: Mutex::new(LruCache::new(
                NonZeroUsize::new(TRACKED_KEYS).unwrap_or(NonZeroUsize::MIN),
            )),
            warned: RateLimitedWarn::new(ESCALATION_WARN_INTERVAL),
        }
    }

    /// Records `rejection` of a request of `key` if it [`counts`] (a 429 of the client's own
    /// row) and `key` was the TCP peer itself; returns whether this one put it on the blocklist.
    pub fn on_rejection(&self, key: PrefixKey, source: KeySource, rejection: &Rejection) -> bool {
        if source != KeySource::Peer || !counts(rejection) {
            return false;
        }
        let now = self.clock.now_ns();
        let escalate = {
            let mut windows = self.windows.lock().unwrap_or_else(PoisonError::into_inner);
            let w = windows.get_or_insert_mut(key, || Window {
                start_ns: now,
                rejections: 0,
                blocked_until_ns: 0,
            });
            if now < w.blocked_until_ns {
                // Already blocked: its SYNs are being dropped; nothing to add.
                return false;
            }
            if now.saturating_sub(w.start_ns) > self.window_ns {
                *w = Window {
                    start_ns: now,
                    rejections: 0,
                    blocked_until_ns: 0,
                };
            }
            w.rejections += 1;
            if w.rejections >= self.after {
                *w = Window {
                    start_ns: now,
                    rejections: 0,
                    blocked_until_ns: now.saturating_add(
                        u64::try_from(self.block_for.as_nanos()).unwrap_or(u64::MAX),
                    ),
                };
                true
            } else {
                false
            }
        };
        if !escalate {
            return false;
        }
        if let Some(suppressed) = self.warned.due() {
            tracing::warn!(
                %key,
                after = self.after,
                block_for = ?self.block_for,
                suppressed,
                "escalating to the XDP blocklist (at most one line a minute, `suppressed` escalations since the last; GET /blocks lists them)"
            );
        } else {
            tracing::debug!(%key, "escalating to the XDP blocklist");
        }
        if self.blocklist.block(key, self.block_for) {
            return true;
        }
        // Dropped: the key is not blocked, so its next 429s may escalate it again.
        if let Some(w) = self
            .windows
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .peek_mut(&key)
        {
            w.blocked_until_ns = 0;
        }
        false
    }

    /// Forgets what was counted for `key`, its mark as blocked included: called when an operator
    /// takes it off the blocklist (`DELETE /blocks/{prefix}`), so that its next `escalate_after`
    /// 429s within `escalate_window` block it again. Without this, the key would not be escalated
    /// again until the `block_for` of its last escalation had passed.
    pub fn forget(&self, key: &PrefixKey) {
        self.windows
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pop(key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::time::ManualClock;

    /// Records the blocks it takes; refuses every one while its flag is set (a writer's full
    /// queue).
    #[derive(Debug, Default)]
    struct Recorder(
        Mutex<Vec<(PrefixKey, Duration)>>,
        std::sync::atomic::AtomicBool,
    );

    impl Blocklist for Recorder {
        fn block(&self, key: PrefixKey, duration: Duration) -> bool {
            if self.1.load(std::sync::atomic::Ordering::Relaxed) {
                return false;
            }
            self.0.lock().unwrap().push((key, duration));
            true
        }
    }

    fn key(s: &str) -> PrefixKey {
        PrefixKey::from_ip(s.parse().unwrap())
    }

    /// A 429 of the client's own row: what the request path passes for a rate-limited client.
    const OWN_429: Rejection = Rejection {
        reason: RejectReason::Rate,
        scope: Scope::Client,
        retry_after_s: 1,
    };

    /// Only a client's own 429s count: a full table's shared row refuses clients for what others
    /// did, and the group cap is the whole group's. However many of those a peer collects, it is
    /// not escalated.
    #[test]
    fn only_429s_on_the_clients_own_row_count() {
        let r = |reason, scope| Rejection {
            reason,
            scope,
            retry_after_s: 1,
        };
        assert!(counts(&r(RejectReason::Rate, Scope::Client)));
        assert!(counts(&r(RejectReason::ClientConcurrency, Scope::Client)));
        let others = [
            r(RejectReason::Rate, Scope::Shared),
            r(RejectReason::ClientConcurrency, Scope::Shared),
            r(RejectReason::GroupConcurrency, Scope::Group),
        ];
        let (_, rec, e) = setup();
        for other in &others {
            assert!(!counts(other));
            for _ in 0..5 {
                assert!(!e.on_rejection(key("192.0.2.7"), KeySource::Peer, other));
            }
        }
        assert!(rec.0.lock().unwrap().is_empty());
        // Three of its own (`setup`'s threshold) do.
        assert!(!e.on_rejection(key("192.0.2.7"), KeySource::Peer, &OWN_429));
        assert!(!e.on_rejection(key("192.0.2.7"), KeySource::Peer, &OWN_429));
        assert!(e.on_rejection(key("192.0.2.7"), KeySource::Peer, &OWN_429));
    }

    fn setup() -> (Arc<ManualClock>, Arc<Recorder>, Escalator) {
        let clock = Arc::new(ManualClock::at(1_000));
        let rec = Arc::new(Recorder::default());
        let e = Escalator::new(
            3,
            Duration::from_secs(10),
            Duration::from_mins(1),
            clock.clone(),
            rec.clone(),
        );
        (clock, rec, e)
    }

    #[test]
    fn a_peer_with_enough_rejections_in_the_window_is_blocked_once() {
        let (_, rec, e) = setup();
        assert!(!e.on_rejection(key("192.0.2.7"), KeySource::Peer, &OWN_429));
        assert!(!e.on_rejection(key("192.0.2.7"), KeySource::Peer, &OWN_429));
        assert!(e.on_rejection(key("192.0.2.7"), KeySource::Peer, &OWN_429));
        assert_eq!(
            *rec.0.lock().unwrap(),
            vec![(key("192.0.2.7"), Duration::from_mins(1))]
        );
        // The count starts over after an escalation.
        assert!(!e.on_rejection(key("192.0.2.7"), KeySource::Peer, &OWN_429));
    }

    #[test]
    fn many_prefixes_escalated_at_once_make_one_warning() {
        let (_, rec, e) = setup();
        let log = crate::obs::logging::capture::Capture::default();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(log.clone())
            .with_ansi(false)
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            for i in 1..=50u16 {
                let prefix = key(&format!("2001:db8:{i:x}::1"));
                for _ in 0..3 {
                    e.on_rejection(prefix, KeySource::Peer, &OWN_429);
                }
            }
        });
        assert_eq!(rec.0.lock().unwrap().len(), 50, "every prefix is blocked");
        let text = log.text();
        let warnings = text.lines().filter(|l| l.contains("WARN")).count();
        assert_eq!(warnings, 1, "one line for 50 escalations: {text}");
        assert!(
            text.contains("2001:db8:1::/64"),
            "the first names its prefix: {text}"
        );
    }

    /// A block the blocklist could not take (its writer's queue was full) does not count as made:
    /// the key's next 429s escalate it again, where it would otherwise go unblocked for
    /// `block_for`.
    #[test]
    fn a_dropped_block_does_not_count_as_made() {
        let (_, rec, e) = setup();
        rec.1.store(true, std::sync::atomic::Ordering::Relaxed);
        for _ in 0..3 {
            assert!(!e.on_rejection(key("192.0.2.7"), KeySource::Peer, &OWN_429));
        }
        rec.1.store(false, std::sync::atomic::Ordering::Relaxed);
        assert!(!e.on_rejection(key("192.0.2.7"), KeySource::Peer, &OWN_429));
        assert!(!e.on_rejection(key("192.0.2.7"), KeySource::Peer, &OWN_429));
        assert!(e.on_rejection(key("192.0.2.7"), KeySource::Peer, &OWN_429));
        assert_eq!(rec.0.lock().unwrap().len(), 1);
    }

    /// A key its operator unblocked is escalated again by its next 429s, not only once the
    /// `block_for` of its last escalation has passed.
    #[test]
    fn an_unblocked_key_is_escalated_again() {
        let (clock, rec, e) = setup();
        for _ in 0..3 {
            e.on_rejection(key("192.0.2.7"), KeySource::Peer, &OWN_429);
        }
        assert_eq!(rec.0.lock().unwrap().len(), 1);
        clock.advance(Duration::from_secs(5));
        e.forget(&key("192.0.2.7"));
        assert!(!e.on_rejection(key("192.0.2.7"), KeySource::Peer, &OWN_429));
        assert!(!e.on_rejection(key("192.0.2.7"), KeySource::Peer, &OWN_429));
        assert!(e.on_rejection(key("192.0.2.7"), KeySource::Peer, &OWN_429));
        assert_eq!(rec.0.lock().unwrap().len(), 2);
    }

    #[test]
    fn rejections_spread_beyond_the_window_do_not_add_up() {
        let (clock, rec, e) = setup();
        e.on_rejection(key("192.0.2.7"), KeySource::Peer, &OWN_429);
        e.on_rejection(key("192.0.2.7"), KeySource::Peer, &OWN_429);
        clock.advance(Duration::from_secs(11));
        assert!(!e.on_rejection(key("192.0.2.7"), KeySource::Peer, &OWN_429));
        assert!(!e.on_rejection(key("192.0.2.7"), KeySource::Peer, &OWN_429));
        assert!(rec.0.lock().unwrap().is_empty());
        assert!(e.on_rejection(key("192.0.2.7"), KeySource::Peer, &OWN_429));
    }

    #[test]
    fn keys_learned_through_a_trusted_proxy_are_never_escalated() {
        let (_, rec, e) = setup();
        for _ in 0..100 {
            assert!(!e.on_rejection(key("203.0.113.9"), KeySource::ThroughProxy, &OWN_429));
        }
        assert!(rec.0.lock().unwrap().is_empty());
    }

    #[test]
    fn after_the_block_expires_the_count_starts_over() {
        let (clock, rec, e) = setup();
        for _ in 0..3 {
            e.on_rejection(key("192.0.2.7"), KeySource::Peer, &OWN_429);
        }
        clock.advance(Duration::from_secs(61));
        assert!(!e.on_rejection(key("192.0.2.7"), KeySource::Peer, &OWN_429));
        assert!(!e.on_rejection(key("192.0.2.7"), KeySource::Peer, &OWN_429));
        assert!(e.on_rejection(key("192.0.2.7"), KeySource::Peer, &OWN_429));
        assert_eq!(rec.0.lock().unwrap().len(), 2);
    }

    #[test]
    fn local_peers_are_never_escalated() {
        let (_, rec, e) = setup();
        for _ in 0..100 {
            assert!(!e.on_rejection(key("10.0.0.7"), KeySource::LocalPeer, &OWN_429));
        }
        assert!(rec.0.lock().unwrap().is_empty());
    }

    #[test]
    fn key_source_follows_the_client_key_decision() {
        use crate::client::key::{ForwardedSource, TrustedProxies, client_key};

        let trusted = TrustedProxies::parse_list("192.0.2.10/32").unwrap();
        let source = |peer: &str, xff: Option<&str>| {
            let mut headers = http::HeaderMap::new();
            if let Some(x) = xff {
                headers.insert("x-forwarded-for", x.parse().unwrap());
            }
            let d = client_key(
                peer.parse().unwrap(),
                &headers,
                &trusted,
                ForwardedSource::Xff,
            );
            KeySource::of(&d)
        };
        // A public peer talking to door directly: its own key, escalatable.
        assert_eq!(source("203.0.113.9", None), KeySource::Peer);
        assert_eq!(source("2001:db8::9", None), KeySource::Peer);
        assert_eq!(source("::ffff:203.0.113.9", None), KeySource::Peer);
        // A public peer sending XFF that door ignores is still the peer.
        assert_eq!(source("203.0.113.9", Some("198.51.100.1")), KeySource::Peer);
        // Behind the trusted proxy, the client learned from XFF is never escalated, and neither is
        // the proxy itself.
        assert_eq!(
            source("192.0.2.10", Some("203.0.113.9")),
            KeySource::ThroughProxy
        );
        assert_eq!(source("192.0.2.10", None), KeySource::ThroughProxy);
        // A local or private peer (a proxy missing from trusted_proxies?) is never escalated.
        assert_eq!(source("127.0.0.1", None), KeySource::LocalPeer);
        assert_eq!(
            source("10.1.2.3", Some("203.0.113.9")),
            KeySource::LocalPeer
        );
        assert_eq!(source("fd00::1", None), KeySource::LocalPeer);
        assert_eq!(source("100.64.0.1", None), KeySource::LocalPeer);
    }

    #[test]
    fn keys_are_counted_separately() {
        let (_, rec, e) = setup();
        for i in 0..2 {
            for k in ["192.0.2.1", "192.0.2.2", "2001:db8::1"] {
                assert!(
                    !e.on_rejection(key(k), KeySource::Peer, &OWN_429),
                    "{k} round {i}"
                );
            }
        }
        assert!(rec.0.lock().unwrap().is_empty());
    }
}
