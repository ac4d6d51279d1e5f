//! The group's in-flight cap across shards: a pool of `cap` slots that the shards lease from in
//! batches, so that an admission far from the cap writes no cache line another core writes too.
//!
//! Each shard keeps a [`Lease`] under its own mutex: the slots its requests hold (`taken`) and
//! the slots it has leased from the group's [`Pool`] (`leased ≥ taken`). Taking a slot is a
//! plain increment while the shard has an idle leased slot; only when it has none does the shard
//! lease a batch from the pool, one atomic add checked against the cap (backed out with one
//! subtract when it would pass the cap). Freeing a slot keeps at most one batch idle and returns
//! the rest. The pool never leases past the cap, so the slots held in the whole group never pass
//! it either: the cap stays exact.
//!
//! Idle leased slots would otherwise refuse requests below the cap, so when the pool runs dry the
//! group turns *tight* ([`Pool::tighten`]): every shard gives its idle slots back, and until the
//! slots in use fall to half the cap, shards lease one slot at a time and keep none idle, which
//! is the plain shared count. A batch is `cap / (8 · shards)` slots, at most [`MAX_BATCH`]; a group
//! whose cap is smaller than 16 slots per shard leases one at a time always (the default groups'
//! caps of 4 to 64 among them).
//!
//! The scheme is Linux's batched per-CPU counter (`lib/percpu_counter.c`) and the "sloppy
//! counters" of Boyd-Wickizer et al., *An Analysis of Linux Scalability to Many Cores* (OSDI
//! 2010), with a comparison that stays exact because slots are leased, not counted after the fact.

use core::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use crossbeam_utils::CachePadded;

/// The most slots a shard leases at once.
pub(super) const MAX_BATCH: u32 = 64;

/// The group's slots: how many the shards have leased, against the cap.
#[derive(Debug)]
pub(super) struct Pool {
    /// Slots leased to the shards (the sum of their [`Lease::leased`]): at most the cap, but for
    /// an instant while a lease past it backs out, and after a retune lowered the cap below the
    /// slots in use. Alone on its cache line: it is the one value of the group that leasing on
    /// any core writes. 64 bits, so that no add of a batch wraps.
    leased: CachePadded<AtomicU64>,
    /// The group's in-flight cap (`inflight`), in slots.
    cap: AtomicU64,
    /// Slots a shard leases at once when the group is not tight: at least 1.
    batch: AtomicU64,
    /// Set when the pool ran dry, until the slots in use fall to half the cap: shards lease one
    /// slot at a time and keep none idle meanwhile.
    tight: AtomicBool,
}

impl Pool {
    /// A pool of `cap` slots for `shards` shards, nothing leased.
    pub(super) fn new(cap: u32, shards: usize) -> Self {
        let pool = Self {
            leased: CachePadded::new(AtomicU64::new(0)),
            cap: AtomicU64::new(0),
            batch: AtomicU64::new(1),
            tight: AtomicBool::new(false),
        };
        pool.set_cap(cap, shards);
        pool
    }

    /// Sets the cap (a retune) and the batch that goes with it. Slots already leased stay
    /// leased: call [`Pool::tighten`]'s sweep after it so that idle ones come back.
    pub(super) fn set_cap(&self, cap: u32, shards: usize) {
        let shards = u64::try_from(shards.max(1)).unwrap_or(u64::MAX);
        let batch = (u64::from(cap) / shards.saturating_mul(8)).clamp(1, u64::from(MAX_BATCH));
        self.cap.store(u64::from(cap), Ordering::Release);
        self.batch.store(batch, Ordering::Release);
    }

    /// The cap, in slots.
    pub(super) fn cap(&self) -> u64 {
        self.cap.load(Ordering::Acquire)
    }

    /// Leases `n` slots, or none and `false` when that would pass the cap: one add (and one
    /// subtract when over), never a loop. While a lease past the cap backs out, the count is
    /// over for an instant, and a concurrent lease may be refused with slots free.
    fn lease(&self, n: u64) -> bool {
        let cap = self.cap();
        let before = self.leased.fetch_add(n, Ordering::AcqRel);
        if before.saturating_add(n) <= cap {
            true
        } else {
            self.leased.fetch_sub(n, Ordering::AcqRel);
            false
        }
    }

    /// Takes `n` leased slots back; clears [`Pool::tight`] once what stays leased is at most
    /// half the cap.
    fn give_back(&self, n: u64) {
        if n == 0 {
            return;
        }
        let before = self.leased.fetch_sub(n, Ordering::AcqRel);
        if self.tight.load(Ordering::Acquire) && before.saturating_sub(n) <= self.cap() / 2 {
            self.tight.store(false, Ordering::Release);
        }
    }

    /// Whether shards lease one slot at a time now (the pool ran dry, or the batch is 1), and
    /// otherwise the batch.
    fn batch_now(&self) -> Option<u64> {
        let batch = self.batch.load(Ordering::Acquire);
        (batch > 1 && !self.tight.load(Ordering::Acquire)).then_some(batch)
    }

    /// Whether shards lease more than one slot at a time when the group is not tight (the cap
    /// is at least 16 slots per shard).
    pub(super) fn leases_batches(&self) -> bool {
        self.batch.load(Ordering::Acquire) > 1
    }

    /// Whether the group is tight (see [`Pool`]'s `tight`).
    pub(super) fn is_tight(&self) -> bool {
        self.tight.load(Ordering::Acquire)
    }

    /// Turns the group tight. The caller then sweeps every shard with [`Lease::give_back_idle`],
    /// one shard lock at a time and none held before: a shard that leases after its sweep sees
    /// the flag (the shard's mutex orders the two), so once the sweep is done no shard keeps an
    /// idle slot while the group stays tight.
    pub(super) fn tighten(&self) {
        self.tight.store(true, Ordering::Release);
    }

    /// Slots leased to the shards now (≥ the slots in use).
    #[cfg(test)]
    pub(super) fn leased(&self) -> u64 {
        self.leased.load(Ordering::Acquire)
    }
}

/// One shard's share of the group's slots, kept under the shard's mutex.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Lease {
    /// Slots held by the shard's requests.
    taken: u32,
    /// Slots leased from the pool: at least `taken`.
    leased: u32,
}

impl Lease {
    /// Slots held by this shard's requests.
    pub(super) fn taken(self) -> u32 {
        self.taken
    }

    /// Takes a slot: an idle leased one, else a new lease of a batch (or of one slot when the
    /// group is tight or the batch would pass the cap). `false` when the pool has no slot left;
    /// nothing changed then.
    pub(super) fn take(&mut self, pool: &Pool) -> bool {
        if self.taken >= self.leased {
            let batch = pool.batch_now().unwrap_or(1);
            let got = if pool.lease(batch) {
                batch
            } else if batch > 1 && pool.lease(1) {
                1
            } else {
                return false;
            };
            let Some(leased) = u32::try_from(got)
                .ok()
                .and_then(|g| self.leased.checked_add(g))
            else {
                pool.give_back(got);
                return false;
            };
            self.leased = leased;
        }
        self.taken += 1;
        true
    }

    /// Frees a slot taken with [`Lease::take`]; returns idle slots to the pool past one batch
    /// (all of them when the group is tight).
    pub(super) fn free(&mut self, pool: &Pool) {
        self.taken = self.taken.saturating_sub(1);
        let keep = pool.batch_now().unwrap_or(0);
        let idle = u64::from(self.leased.saturating_sub(self.taken));
        if idle > keep.saturating_mul(2) || (keep == 0 && idle > 0) {
            self.give_back(pool, idle - keep);
        }
    }

    /// Slots leased from the pool (≥ [`Lease::taken`]).
    #[cfg(test)]
    pub(super) fn leased(self) -> u32 {
        self.leased
    }

    /// Returns every idle leased slot to the pool (a sweep of [`Pool::tighten`], a retune).
    pub(super) fn give_back_idle(&mut self, pool: &Pool) {
        self.give_back(pool, u64::from(self.leased.saturating_sub(self.taken)));
    }

    fn give_back(&mut self, pool: &Pool, n: u64) {
        let n32 = u32::try_from(n).unwrap_or(u32::MAX).min(self.leased);
        self.leased -= n32;
        pool.give_back(u64::from(n32));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Takes `n` slots on `lease`; how many it got.
    fn take_n(lease: &mut Lease, pool: &Pool, n: u32) -> u32 {
        (0..n).map(|_| u32::from(lease.take(pool))).sum()
    }

    #[test]
    fn a_batch_is_a_share_of_the_cap_per_shard_clamped() {
        let batch = |cap, shards| Pool::new(cap, shards).batch.load(Ordering::Relaxed);
        assert_eq!(batch(1_000_000, 17), u64::from(MAX_BATCH));
        assert_eq!(batch(1_000, 17), 7);
        // The default groups' caps (4, 32, 64) over 17 shards: one slot at a time.
        for cap in [4, 32, 64, 135] {
            assert_eq!(batch(cap, 17), 1, "cap {cap}");
            assert!(!Pool::new(cap, 17).leases_batches());
        }
        assert_eq!(batch(u32::MAX, 1), u64::from(MAX_BATCH));
    }

    #[test]
    fn slots_are_leased_in_batches_and_idle_ones_come_back_past_two() {
        let pool = Pool::new(10_000, 4);
        let mut a = Lease::default();
        assert!(a.take(&pool));
        assert_eq!((a.taken(), a.leased(), pool.leased()), (1, 64, 64));
        assert_eq!(take_n(&mut a, &pool, 64), 64);
        assert_eq!((a.taken(), a.leased(), pool.leased()), (65, 128, 128));
        for _ in 0..65 {
            a.free(&pool);
        }
        // Two batches idle at most: all 128 stay.
        assert_eq!((a.taken(), a.leased(), pool.leased()), (0, 128, 128));
        let mut b = Lease::default();
        assert_eq!(take_n(&mut b, &pool, 129), 129);
        assert_eq!(b.leased(), 3 * 64);
        for _ in 0..129 {
            b.free(&pool);
        }
        // Past two batches idle, all but one batch goes back.
        assert_eq!((b.taken(), b.leased()), (0, 127));
        assert_eq!(pool.leased(), 128 + 127);
    }

    /// The cap holds however the slots are spread, and idle leases swept back make room.
    #[test]
    fn the_pool_never_leases_past_the_cap_and_a_sweep_frees_idle_slots() {
        let pool = Pool::new(100, 1);
        assert_eq!(pool.batch.load(Ordering::Relaxed), 12);
        let (mut a, mut b) = (Lease::default(), Lease::default());
        assert!(a.take(&pool));
        // b gets all the rest, in batches and then one slot at a time at the end.
        assert_eq!(take_n(&mut b, &pool, 200), 88);
        assert_eq!((a.leased(), b.leased(), pool.leased()), (12, 88, 100));
        assert!(!b.take(&pool), "dry: a's 11 idle slots are leased to a");
        assert_eq!(b.taken(), 88, "a refused take changes nothing");
        pool.tighten();
        a.give_back_idle(&pool);
        assert_eq!((a.leased(), pool.leased()), (1, 89));
        assert_eq!(take_n(&mut b, &pool, 20), 11);
        assert_eq!(pool.leased(), 100);
        assert_eq!(a.taken() + b.taken(), 100);
        // Tight: a slot freed goes back at once, and one taken is leased alone.
        b.free(&pool);
        assert_eq!((b.leased(), pool.leased()), (98, 99));
        assert!(a.take(&pool));
        assert_eq!((a.leased(), pool.leased()), (2, 100));
    }

    #[test]
    fn a_tight_group_loosens_when_half_the_cap_is_free() {
        let pool = Pool::new(100, 1);
        let mut a = Lease::default();
        assert_eq!(take_n(&mut a, &pool, 100), 100);
        assert_eq!((a.leased(), pool.leased()), (100, 100));
        pool.tighten();
        a.free(&pool);
        assert_eq!((a.leased(), pool.leased()), (99, 99));
        for _ in 0..48 {
            a.free(&pool);
        }
        assert!(pool.is_tight());
        assert_eq!(pool.leased(), 51);
        a.free(&pool);
        assert!(!pool.is_tight(), "50 of 100 leased");
        assert!(a.take(&pool));
        // Loose again: a slot comes with a batch.
        assert_eq!((a.taken(), a.leased(), pool.leased()), (51, 62, 62));
    }

    #[test]
    fn a_lower_cap_leases_nothing_until_the_slots_in_use_fall_below_it() {
        let pool = Pool::new(1_000, 1);
        let mut a = Lease::default();
        assert_eq!(take_n(&mut a, &pool, 10), 10);
        pool.set_cap(5, 1);
        pool.tighten();
        a.give_back_idle(&pool);
        assert_eq!(pool.leased(), 10);
        let mut b = Lease::default();
        assert!(!b.take(&pool));
        for _ in 0..6 {
            a.free(&pool);
        }
        assert!(b.take(&pool));
        assert_eq!(pool.leased(), 5);
    }
}
