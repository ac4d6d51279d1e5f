//! The shared XDP blocklist (docs/design.md, "Cluster"): a block put on one door's shield reaches
//! every door's within a sync interval, with its deadline, and an expired block vanishes
//! everywhere.
//!
//! In the store (written by the sync task's Lua script, in `cluster/mod.rs`):
//!
//! - [`BLOCKS_KEY`], a sorted set: member the prefix (32 hex digits, the [`PrefixKey`]'s 16
//!   bytes), score its deadline in the store's clock (`TIME`, ms). The script deletes members
//!   whose deadline has passed (`ZRANGEBYSCORE` then `ZREM`) on every sync, so an expired block is
//!   gone from the store at the next sync of any door.
//! - [`BLOCKS_SEQ_KEY`], a sorted set of the same members scored by a sequence number taken from
//!   [`BLOCKS_META_KEY`]'s `seq` field each time a member is added or its deadline extended. A
//!   door remembers the highest sequence number it has seen (its cursor) and fetches only the
//!   members above it, so a sync costs nothing when no block changed.
//! - [`BLOCKS_META_KEY`], a hash: `seq` and `epoch` (the store's clock when the hash was created).
//!   A store that lost its data (a restart without persistence) has a new epoch: a door that sees
//!   another epoch than its cursor's fetches everything again. A store whose `seq` went back
//!   (restored from an older snapshot, or a replica promoted before it caught up: the same epoch,
//!   a smaller `seq`) gets a new epoch from the first door whose cursor is past it, before that
//!   door publishes anything, so that every door fetches everything again: a door left on its
//!   cursor would never fetch the blocks numbered again up to it.
//!
//! A door publishes a block as a lifetime (ms), not a deadline: the script turns it into a
//! deadline with the store's clock, and answers every fetched block with its remaining lifetime
//! (ms), which the door maps onto its own `CLOCK_MONOTONIC_COARSE` when it puts the block on its shield
//! ([`crate::shield::Shield::block`]). No door's clock is compared with another's. A deadline is
//! only ever extended: a shorter block of a prefix already blocked leaves the longer one.
//!
//! The request path never waits for the network: [`SharedBlocklist::block`] (what the escalator
//! calls) puts the block on the local shield's writer queue and on a bounded in-memory queue that
//! the sync task drains ([`SharedBlocklist::publish`]).
//!
//! An unblock is not shared: removing a block on one door (`DELETE /blocks/{prefix}`) leaves the
//! others' copies to their deadline, and the block comes back on that door when another door
//! extends it or the door fetches everything again (a restart, a new epoch).

use std::{
    collections::VecDeque,
    fmt::Write as _,
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

use door_common::prefix::PrefixKey;

use crate::{shield::escalate::Blocklist, time::Clock};

/// The sorted set of shared blocks: member the prefix (hex), score its deadline (store ms).
pub const BLOCKS_KEY: &str = "door:blocks";
/// The sorted set of shared blocks scored by the sequence number of their last change.
pub const BLOCKS_SEQ_KEY: &str = "door:blocks:seq";
/// The hash with the blocks' `seq` counter and the store's `epoch`.
pub const BLOCKS_META_KEY: &str = "door:blocks:meta";
/// Blocks waiting to be published, at most; more are dropped (and logged once per sync).
pub const PENDING_BLOCKS: usize = 1_024;
/// Blocks one sync fetches from the store at most; the rest come with the next syncs.
pub const FETCH_BLOCKS: usize = 512;

/// A block waiting to be published: the prefix, its lifetime, and when it was queued (the
/// injected clock, ns).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Pending {
    pub(super) key: PrefixKey,
    pub(super) lifetime: Duration,
    pub(super) queued_ns: u64,
}

/// Where a door's blocks go in cluster mode: its own shield (at once) and the cluster (at the
/// next sync). Built by the daemon around the shield's [`crate::shield::BlocklistWriter`] and
/// given to both the escalator (as its [`Blocklist`]) and the sync task ([`super::spawn`]).
#[derive(Debug)]
pub struct SharedBlocklist {
    local: Arc<dyn Blocklist>,
    clock: Arc<dyn Clock>,
    pending: Mutex<VecDeque<Pending>>,
    dropped: std::sync::atomic::AtomicU64,
}

impl SharedBlocklist {
    /// Shares the blocks of the door whose shield `local` writes; `clock` (the door's injected
    /// clock) measures how long a block waited to be published, which is taken off its lifetime.
    pub fn new(local: Arc<dyn Blocklist>, clock: Arc<dyn Clock>) -> Arc<Self> {
        Arc::new(Self {
            local,
            clock,
            pending: Mutex::new(VecDeque::new()),
            dropped: std::sync::atomic::AtomicU64::new(0),
        })
    }

    /// Publishes a block of `key` for `lifetime` to every door of the cluster, without putting
    /// it on this door's shield (the caller did, or will). This is the entry point for any
    /// source of blocks (the escalator through [`SharedBlocklist::block`]; an admin endpoint
    /// after its own `Shield::block`). Never waits for the network: the block is queued and sent
    /// by the next sync (the time it waited is taken off its lifetime); when [`PENDING_BLOCKS`]
    /// are already waiting it is dropped and counted (the sync task logs it). A zero lifetime
    /// publishes nothing.
    pub fn publish(&self, key: PrefixKey, lifetime: Duration) {
        if lifetime.is_zero() {
            return;
        }
        let queued_ns = self.clock.now_ns();
        let mut q = self.pending.lock().unwrap_or_else(PoisonError::into_inner);
        if q.len() >= PENDING_BLOCKS {
            self.dropped
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            return;
        }
        q.push_back(Pending {
            key,
            lifetime,
            queued_ns,
        });
    }

    /// Takes every waiting block, each with the lifetime it has left now (blocks whose lifetime
    /// ran out while waiting are dropped), and how many were dropped since the last call because
    /// the queue was full.
    pub(super) fn take(&self) -> (Vec<Pending>, u64) {
        let now = self.clock.now_ns();
        let q = std::mem::take(&mut *self.pending.lock().unwrap_or_else(PoisonError::into_inner));
        let dropped = self.dropped.swap(0, std::sync::atomic::Ordering::Relaxed);
        let live = q
            .into_iter()
            .filter_map(|p| {
                let waited = Duration::from_nanos(now.saturating_sub(p.queued_ns));
                let left = p.lifetime.saturating_sub(waited);
                (!left.is_zero()).then_some(Pending {
                    lifetime: left,
                    queued_ns: now,
                    ..p
                })
            })
            .collect();
        (live, dropped)
    }

    /// Puts blocks a failed sync could not send back in front of the queue (within its bound),
    /// so that they go with the next sync.
    pub(super) fn requeue(&self, blocks: Vec<Pending>) {
        let mut q = self.pending.lock().unwrap_or_else(PoisonError::into_inner);
        for p in blocks.into_iter().rev() {
            if q.len() >= PENDING_BLOCKS {
                break;
            }
            q.push_front(p);
        }
    }

    /// Puts a block fetched from the cluster on this door's shield for the `left` it has left.
    pub(super) fn apply(&self, key: PrefixKey, left: Duration) {
        // A block dropped by the shield's full queue is logged there.
        let _ = self.local.block(key, left);
    }
}

impl Blocklist for SharedBlocklist {
    /// Blocks `key` on this door's shield for `duration` and publishes it to the cluster
    /// ([`SharedBlocklist::publish`]).
    /// Whether this door's shield took it; it is published to the cluster either way.
    fn block(&self, key: PrefixKey, duration: Duration) -> bool {
        let taken = self.local.block(key, duration);
        self.publish(key, duration);
        taken
    }
}

/// The store's member for `key`: its 16 bytes in 32 lowercase hex digits.
pub(super) fn member(key: &PrefixKey) -> String {
    let mut s = String::with_capacity(32);
    for b in key.addr {
        let _ = write!(s, "{b:02x}");
    }
    s
}

/// The key a store member names, if it is 32 hex digits.
pub(super) fn parse_member(m: &str) -> Option<PrefixKey> {
    let bytes = m.as_bytes();
    if bytes.len() != 32 {
        return None;
    }
    let mut key = PrefixKey::default();
    for (i, out) in key.addr.iter_mut().enumerate() {
        let hex = m.get(2 * i..2 * i + 2)?;
        *out = u8::from_str_radix(hex, 16).ok()?;
    }
    Some(key)
}

/// A door's position in the store's block changes: the store's epoch and the last sequence
/// number fetched (empty epoch, 0: nothing fetched yet).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct Cursor {
    pub(super) epoch: String,
    pub(super) seq: u64,
}

/// What the script answered about blocks: the store's epoch, the cursor to keep, and the blocks
/// changed since the cursor sent, each with its lifetime left (ms).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Fetched {
    pub(super) cursor: Cursor,
    pub(super) blocks: Vec<(PrefixKey, u64)>,
}

/// Reads the script's block answer: `{epoch, seq, member, left_ms, member, left_ms, …}`, all
/// strings. `None` if it is not that shape; members that are not 32 hex digits are skipped.
pub(super) fn parse_fetched(v: &[String]) -> Option<Fetched> {
    let (epoch, rest) = v.split_first()?;
    let (seq, rest) = rest.split_first()?;
    let seq = seq.parse::<u64>().ok()?;
    if rest.len() % 2 != 0 {
        return None;
    }
    let blocks = rest
        .chunks_exact(2)
        .filter_map(|pair| match pair {
            [m, left] => Some((parse_member(m)?, left.parse::<u64>().ok()?)),
            _ => None,
        })
        .collect();
    Some(Fetched {
        cursor: Cursor {
            epoch: epoch.clone(),
            seq,
        },
        blocks,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::time::ManualClock;

    #[derive(Debug, Default)]
    struct Recorder(Mutex<Vec<(PrefixKey, Duration)>>);

    impl Blocklist for Recorder {
        fn block(&self, key: PrefixKey, duration: Duration) -> bool {
            self.0.lock().unwrap().push((key, duration));
            true
        }
    }

    fn key(s: &str) -> PrefixKey {
        PrefixKey::from_ip(s.parse().unwrap())
    }

    #[test]
    fn members_spell_the_key_and_read_back() {
        for k in ["192.0.2.7", "2001:db8:1:2::9"] {
            let m = member(&key(k));
            assert_eq!(m.len(), 32);
            assert_eq!(parse_member(&m), Some(key(k)));
        }
        assert_eq!(parse_member("zz"), None);
        assert_eq!(parse_member(&"g".repeat(32)), None);
    }

    #[test]
    fn a_block_goes_to_the_shield_at_once_and_to_the_cluster_with_what_is_left() {
        let clock = Arc::new(ManualClock::at(1_000));
        let local = Arc::new(Recorder::default());
        let shared = SharedBlocklist::new(local.clone(), clock.clone());
        shared.block(key("192.0.2.7"), Duration::from_mins(1));
        assert_eq!(
            *local.0.lock().unwrap(),
            vec![(key("192.0.2.7"), Duration::from_mins(1))]
        );
        clock.advance(Duration::from_secs(2));
        let (taken, dropped) = shared.take();
        assert_eq!(dropped, 0);
        assert_eq!(taken.len(), 1);
        assert_eq!(taken[0].lifetime, Duration::from_secs(58));
        // Requeued after a failed sync, it keeps losing the time it waits.
        shared.requeue(taken);
        clock.advance(Duration::from_secs(3));
        let (taken, _) = shared.take();
        assert_eq!(taken[0].lifetime, Duration::from_secs(55));
        // One whose lifetime ran out while waiting is not sent.
        shared.publish(key("192.0.2.8"), Duration::from_secs(1));
        clock.advance(Duration::from_secs(1));
        assert!(shared.take().0.is_empty());
    }

    #[test]
    fn the_queue_is_bounded() {
        let clock = Arc::new(ManualClock::at(1));
        let shared = SharedBlocklist::new(Arc::new(Recorder::default()), clock);
        for _ in 0..PENDING_BLOCKS + 5 {
            shared.publish(key("192.0.2.7"), Duration::from_secs(1));
        }
        let (taken, dropped) = shared.take();
        assert_eq!(taken.len(), PENDING_BLOCKS);
        assert_eq!(dropped, 5);
    }

    #[test]
    fn fetched_blocks_are_parsed_and_bad_members_skipped() {
        let m = member(&key("192.0.2.7"));
        let v: Vec<String> = ["1764.5", "7", &m, "59000", "bad", "1"]
            .iter()
            .map(|s| (*s).to_owned())
            .collect();
        let f = parse_fetched(&v).unwrap();
        assert_eq!(f.cursor.epoch, "1764.5");
        assert_eq!(f.cursor.seq, 7);
        assert_eq!(f.blocks, vec![(key("192.0.2.7"), 59_000)]);
        assert_eq!(parse_fetched(&v[..3]), None);
        assert_eq!(parse_fetched(&[]), None);
    }
}
