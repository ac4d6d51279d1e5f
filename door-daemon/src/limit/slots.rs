//! The group's in-flight cap across shards: a pool of `cap` slots that the shards lease from in
//! batches, so that an admission far from the cap writes no cache line another core writes too.
//!
//! Each shard keeps a [`Lease`] under its own mutex: the slots its requests hold (`taken`) and
//! the slots it has leased from the group's [`Pool`] (`leased ≥ taken`). Taking a slot is a
//! plain increment while the shard has an idle leased slot; only when it has none does the shard
//! lease a batch from the pool, one atomic add checked against the cap (backed out with one
//! subtract when it would pass the cap). Freeing a slot keeps up to two batches idle; past that it
//! returns all but one. The pool never leases past the cap, so the slots held in the whole group
//! never pass it either: the cap stays exact.
//!
//! Idle leased slots would otherwise refuse requests below the cap, so when the pool runs dry the
//! group turns *tight* ([`Pool::tighten`]): every shard gives its idle slots back, and until the
//! slots in use fall to half the cap, shards lease one slot at a time and keep none idle, which
//! is the plain shared count. A batch is `cap / (8 · shards)` slots, at most [`MAX_BATCH`]; a group
//! whose cap is smaller than 16 slots per shard leases one at a time always (the default groups'
//! caps of 4 to 64 among them; the default `stream` group's 1,024 leases 7 at a time).
//!
//! Used by one thread, a request is refused for the cap only when the cap's slots are all held.
//! Under concurrency a refusal may come with a slot free for an instant, as with any shared count
//! checked by add and back-out: while another request's lease past the cap backs out, or while
//! another request is still sweeping the idle slots back.
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
        if n > 0 {
            let before = self.leased.fetch_sub(n, Ordering::AcqRel);
            self.relax(before.saturating_sub(n));
        }
    }

    /// Clears [`Pool::tight`] when `leased` slots (the pool's count now) are at most half the cap.
    fn relax(&self, leased: u64) {
        if self.tight.load(Ordering::Acquire) && leased <= self.cap() / 2 {
            self.tight.store(false, Ordering::Release);
        }
    }

    /// Ends a sweep (after [`Pool::tighten`] and every shard's [`Lease::give_back_idle`]): the
    /// group stays tight only while more than half the cap is in use.
    pub(super) fn swept(&self) {
        self.relax(self.leased.load(Ordering::Acquire));
    }

    /// Whether a request is sure to be refused for the cap without looking at any shard: no shard
    /// keeps idle slots (the group is tight or leases one slot at a time) and the cap's slots are
    /// all leased, so all held. The shared count's check of before: one load of the shared count
    /// (beside the read-mostly flags and cap) and no lock, for a flood at the cap.
    pub(super) fn is_full(&self) -> bool {
        (self.is_tight() || !self.leases_batches())
            && self.leased.load(Ordering::Acquire) >= self.cap()
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

    /// Frees a slot taken with [`Lease::take`]; past two idle batches, returns all idle slots but
    /// one batch to the pool (all of them when the group is tight or leases one at a time).
    pub(super) fn free(&mut self, pool: &Pool) {
        self.taken = self.taken.saturating_sub(1);
        let keep = pool.batch_now().unwrap_or(0);
        let idle = u64::from(self.leased.saturating_sub(self.taken));
        if idle > keep.saturating_mul(2) {
            self.give_back(pool, idle - keep);
        }
    }

    /// Slots leased from the pool (≥ [`Lease::taken`]).
    #[cfg(test)]
    pub(super) fn leased(self) -> u32 {
        self.leased
    }

    /// Hands one taken slot over to another shard's lease ([`Lease::receive`]) without the pool:
    /// the slot stays leased and held, by the request that moves from this shard to the other.
    /// `false` (nothing changed) when this lease holds no slot.
    pub(super) fn hand_over(&mut self) -> bool {
        if self.taken == 0 {
            return false;
        }
        self.taken -= 1;
        self.leased -= 1;
        true
    }

    /// Receives a slot handed over by [`Lease::hand_over`], taken.
    pub(super) fn receive(&mut self) {
        self.taken = self.taken.saturating_add(1);
        self.leased = self.leased.saturating_add(1);
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

    #[test]
    fn a_full_pool_refuses_without_a_shard_only_when_no_shard_keeps_idle_slots() {
        // Loose, with batches: the pool may be dry while a shard has idle slots.
        let pool = Pool::new(100, 1);
        let mut a = Lease::default();
        assert_eq!(take_n(&mut a, &pool, 100), 100);
        assert!(!pool.is_full(), "loose: a shard may hold idle slots");
        pool.tighten();
        assert!(pool.is_full());
        a.free(&pool);
        assert!(!pool.is_full());
        // One slot at a time: the pool's count is the slots held.
        let small = Pool::new(4, 17);
        let mut b = Lease::default();
        assert_eq!(take_n(&mut b, &small, 5), 4);
        assert!(small.is_full());
    }

    #[test]
    fn a_slot_handed_over_stays_leased_and_held() {
        let pool = Pool::new(100, 1);
        let (mut a, mut shared) = (Lease::default(), Lease::default());
        assert!(a.take(&pool));
        assert!(a.hand_over());
        shared.receive();
        assert_eq!((a.taken(), a.leased()), (0, 11));
        assert_eq!((shared.taken(), shared.leased()), (1, 1));
        assert_eq!(pool.leased(), 12);
        assert!(!Lease::default().hand_over(), "nothing to hand over");
        shared.free(&pool);
        assert_eq!(
            (shared.taken(), shared.leased()),
            (0, 1),
            "one idle slot kept"
        );
    }

    #[test]
    fn a_sweep_that_leaves_half_the_cap_free_loosens_the_group() {
        let pool = Pool::new(100, 1);
        let mut a = Lease::default();
        assert_eq!(take_n(&mut a, &pool, 12), 12);
        pool.tighten();
        // No idle slot to give back: nothing on the way looks at the count.
        a.give_back_idle(&pool);
        assert_eq!(pool.leased(), 12);
        assert!(pool.is_tight());
        pool.swept();
        assert!(!pool.is_tight(), "12 of 100 in use");
    }
}
