//! Unit tests of the limit module.
use std::{collections::HashMap, time::Duration};

use proptest::prelude::*;

use super::*;
use crate::time::ManualClock;

fn key(i: u32) -> PrefixKey {
    PrefixKey::from_ipv4(i.to_be_bytes())
}

/// An [`Observer`] that keeps the running totals it is told and the in-flight gauges it is
/// handed, as the metrics do.
#[derive(Debug, Default)]
struct Totals {
    clients: std::sync::atomic::AtomicI64,
    gauges: Mutex<Vec<InflightGauge>>,
}

impl Observer for Totals {
    fn clients_changed(&self, delta: i64) {
        self.clients.fetch_add(delta, Ordering::Relaxed);
    }
    fn evicted(&self) {}
    fn watch_inflight(&self, gauge: InflightGauge) {
        self.gauges
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(gauge);
    }
}

impl Totals {
    /// The requests in flight the gauges read, over every limiter built with this observer.
    fn inflight(&self) -> i64 {
        self.gauges
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .map(|g| i64::from(g.read()))
            .sum()
    }

    /// Checks that the totals reported match the limiter's own counts.
    fn check(&self, lim: &GroupLimiter) -> Result<(), String> {
        let clients = self.clients.load(Ordering::Relaxed);
        let inflight = self.inflight();
        if usize::try_from(clients).ok() != Some(lim.tracked_clients()) {
            return Err(format!(
                "observer counts {clients} clients, the table {}",
                lim.tracked_clients()
            ));
        }
        if inflight != i64::from(lim.inflight()) {
            return Err(format!(
                "observer counts {inflight} in flight, the group {}",
                lim.inflight()
            ));
        }
        Ok(())
    }
}

/// Every row of a shard: its table entries (with their keys), then its shared row (`None`).
fn rows_of(state: &ShardState) -> impl Iterator<Item = (Option<PrefixKey>, &Row)> {
    state
        .table
        .iter()
        .map(|(k, r)| (Some(*k), r))
        .chain(core::iter::once((None, &state.shared)))
}

impl GroupLimiter {
    /// Checks every invariant of the state; returns a description of the first violation.
    fn check_invariants(&self) -> Result<(), String> {
        let now = self.set.core.clock.now_ns();
        let enforce = self.enforcing();
        let mut sum = 0u32;
        let mut leased = 0u64;
        let mut tracked = 0;
        let mut busy = 0;
        let mut b = None;
        for shard in self.set.list.iter().chain([&self.set.shared]) {
            let state = shard.lock();
            let budget = state.tuning.budget;
            let bucket = state.tuning.bucket;
            b = Some(budget);
            tracked += state.table.len();
            let shard_busy = state.table.iter().filter(|(_, r)| r.inflight > 0).count();
            busy += shard_busy;
            if state.table.over_cap() && shard_busy < state.table.len() {
                return Err(format!(
                    "{} entries past the shard's capacity, {shard_busy} busy",
                    state.table.len()
                ));
            }
            leased += u64::from(state.slots.leased());
            let shard_inflight: u32 = rows_of(&state).map(|(_, r)| r.inflight).sum();
            if shard_inflight != state.slots.taken() || state.slots.taken() > state.slots.leased() {
                return Err(format!(
                    "a shard's rows hold {shard_inflight} slots, it has taken {} of {} leased",
                    state.slots.taken(),
                    state.slots.leased()
                ));
            }
            let rows = rows_of(&state);
            for (k, row) in rows {
                sum += row.inflight;
                if enforce && row.inflight > budget.per_client {
                    return Err(format!("{k:?} inflight {} > per_client", row.inflight));
                }
                let expect_held = match budget.charge {
                    Charge::Always => 0,
                    Charge::OnFailure => row.inflight,
                };
                if row.held != expect_held {
                    return Err(format!("{k:?} held {} != {expect_held}", row.held));
                }
                let debt = Bucket::deficit(row, now) + u64::from(row.held) * bucket.interval;
                if debt > u64::from(budget.burst) * bucket.interval {
                    return Err(format!("{k:?} owes more than its burst: {debt} ns"));
                }
            }
        }
        let b = b.ok_or("no shard")?;
        if tracked > b.max_clients.max(busy) {
            return Err(format!(
                "table {tracked} > max {} with {busy} busy",
                b.max_clients
            ));
        }
        let inflight = self.inflight();
        if enforce && inflight > b.inflight {
            return Err(format!("group inflight {inflight} > cap"));
        }
        if sum != inflight {
            return Err(format!("rows hold {sum}, group counts {inflight}"));
        }
        if leased != self.set.core.pool.leased() {
            return Err(format!(
                "shards hold {leased} leased slots, the pool counts {}",
                self.set.core.pool.leased()
            ));
        }
        Ok(())
    }

    /// Checks that no row, in the table or shared, holds a slot or a token (every permit is
    /// gone); returns the first row that does.
    fn check_idle(&self) -> Result<(), String> {
        for shard in self.set.list.iter().chain([&self.set.shared]) {
            let state = shard.lock();
            let rows = rows_of(&state);
            for (k, row) in rows {
                if row.inflight != 0 || row.held != 0 {
                    return Err(format!(
                        "{k:?} holds {} slots, {} tokens",
                        row.inflight, row.held
                    ));
                }
            }
        }
        Ok(())
    }
}

#[test]
fn retune_keeps_the_missing_fraction_and_the_slots() {
    let clock = Arc::new(ManualClock::at(1_000));
    let budget = Budget {
        rate: 1.0,
        burst: 10,
        per_client: 10,
        inflight: 10,
        max_clients: 4,
        charge: Charge::Always,
    };
    let lim = Arc::new(GroupLimiter::new(
        "r",
        budget,
        true,
        clock.clone(),
        Arc::new(Unobserved),
    ));
    // Client 1 drained, client 2 half full; client 2 keeps one request in flight.
    for _ in 0..10 {
        lim.admit(key(1)).unwrap().settle(Spend::Nothing);
    }
    for _ in 0..4 {
        lim.admit(key(2)).unwrap().settle(Spend::Nothing);
    }
    let busy = lim.admit(key(2)).unwrap();
    lim.retune(
        Budget {
            burst: 20,
            rate: 2.0,
            ..budget
        },
        true,
    );
    assert_eq!(lim.quota(&key(1)).remaining, 0, "drained stays drained");
    assert_eq!(lim.quota(&key(2)).remaining, 10, "half of 10 is half of 20");
    assert_eq!(lim.inflight(), 1, "slots carry over");
    busy.settle(Spend::Nothing);
    assert_eq!(lim.inflight(), 0);
    lim.check_invariants().unwrap();
    // A smaller table drops the oldest entries.
    lim.retune(
        Budget {
            max_clients: 1,
            ..budget
        },
        true,
    );
    assert_eq!(lim.tracked_clients(), 1);
    assert!(lim.is_tracked(&key(2)));
    lim.check_invariants().unwrap();
}

/// A cluster's degraded mode divides the rate, a reload sets the configured budget, and neither
/// undoes the other: a reload while degraded applies its budget divided, and the end of the
/// degraded mode brings back the reload's rate, not the one before it (which the cluster used to
/// restore when the reload's rate happened to equal the divided one).
#[test]
fn a_reload_while_the_rate_is_divided_is_divided_and_kept() {
    let lim = GroupLimiter::new(
        "link",
        Budget {
            rate: 10.0,
            ..Budget::link()
        },
        true,
        Arc::new(ManualClock::at(1_000)),
        Arc::new(Unobserved),
    );
    lim.divide_rate(2);
    assert!((lim.budget().rate - 5.0).abs() < 1e-9);
    assert_eq!(lim.rate_divisor(), 2);
    let reloaded = Budget {
        rate: 5.0,
        ..Budget::link()
    };
    lim.retune(reloaded, true);
    assert!((lim.budget().rate - 2.5).abs() < 1e-9, "{:?}", lim.budget());
    assert_eq!(lim.configured_budget(), reloaded);
    lim.divide_rate(1);
    assert!((lim.budget().rate - 5.0).abs() < 1e-9, "{:?}", lim.budget());
    // The division never goes below the slowest rate, and 0 counts as 1.
    let slow = Budget {
        rate: MIN_RATE,
        ..Budget::link()
    };
    assert!(slow.with_rate_divided(3).rate >= MIN_RATE);
    assert_eq!(slow.with_rate_divided(0), slow);
}

/// A reload that shrinks `max_clients` below the clients with requests in flight keeps their
/// entries: their per-client caps still hold, and each entry leaves the table when its last
/// request settles, until the table is within its new size.
#[test]
fn a_shrinking_reload_keeps_busy_clients_until_they_settle() {
    let clock = Arc::new(ManualClock::at(1_000));
    let budget = Budget {
        rate: 100.0,
        burst: 100,
        per_client: 1,
        inflight: 10,
        max_clients: 4,
        charge: Charge::OnFailure,
    };
    let lim = Arc::new(GroupLimiter::new(
        "k",
        budget,
        true,
        clock,
        Arc::new(Unobserved),
    ));
    let a = lim.admit(key(1)).unwrap();
    let b = lim.admit(key(2)).unwrap();
    lim.admit(key(3)).unwrap().settle(Spend::Nothing);
    lim.retune(
        Budget {
            max_clients: 1,
            ..budget
        },
        true,
    );
    assert_eq!(
        lim.tracked_clients(),
        2,
        "the idle client left, the busy ones stayed"
    );
    assert!(!lim.is_tracked(&key(3)));
    let again = lim.admit(key(1)).map(|p| p.scope());
    assert_eq!(
        again.err().map(|r| r.reason),
        Some(RejectReason::ClientConcurrency),
        "client 1 still holds its one slot"
    );
    lim.check_invariants().unwrap();
    a.settle(Spend::Token);
    assert_eq!(lim.tracked_clients(), 1, "client 1 left as it went idle");
    assert!(lim.is_tracked(&key(2)));
    // Client 1 comes back while the table is full of a busy client: the shared row decides, and
    // its slot is the shared row's, not client 2's.
    let c = lim.admit(key(1)).unwrap();
    assert_eq!(c.scope(), Scope::Shared);
    lim.check_invariants().unwrap();
    b.settle(Spend::Nothing);
    c.settle(Spend::Nothing);
    assert_eq!(
        lim.tracked_clients(),
        1,
        "within the new size, client 2 stays"
    );
    assert_eq!(lim.inflight(), 0);
    lim.check_invariants().unwrap();
    lim.check_idle().unwrap();
}

/// With the table split into shards, every permit settles on the row that admitted it, however
/// it ends (settled spending or not, refunded, dropped), on its own entry or on the shared row,
/// across a retune that also shrinks the table below its busy entries: the rows' counts add up
/// to the group's at every step, the observer's totals match, and all return to zero with the
/// table within its new size.
#[test]
fn permits_settle_on_their_own_shard() {
    let clock = Arc::new(ManualClock::at(1_000));
    let budget = Budget {
        rate: 1_000.0,
        burst: 1_000,
        // The shared row's cap too: room for every client the table cannot hold.
        per_client: 1_000,
        inflight: 100_000,
        max_clients: 2 * MIN_SHARD_ENTRIES,
        charge: Charge::OnFailure,
    };
    let totals = Arc::new(Totals::default());
    let lim = Arc::new(GroupLimiter::new(
        "s",
        budget,
        true,
        clock.clone(),
        totals.clone(),
    ));
    assert_eq!(lim.set.list.len(), 2);
    // More clients than the table holds, each with two requests in flight: the table fills with
    // busy entries, and the rest are decided on the shared row.
    let n = u32::try_from(2 * MIN_SHARD_ENTRIES + 200).unwrap();
    let mut permits: Vec<_> = (0..n)
        .flat_map(|i| [lim.admit(key(i)).unwrap(), lim.admit(key(i)).unwrap()])
        .collect();
    let shared = permits
        .iter()
        .filter(|p| p.scope() == Scope::Shared)
        .count();
    assert!(
        shared > 0 && shared < permits.len(),
        "{shared} on the shared row"
    );
    assert_eq!(lim.inflight(), 2 * n);
    lim.check_invariants().unwrap();
    let mut rest = permits.split_off(permits.len() / 2);
    for (i, p) in permits.into_iter().enumerate() {
        match i % 3 {
            0 => p.settle(Spend::Token),
            1 => p.settle(Spend::Nothing),
            _ => p.refund(),
        }
    }
    lim.check_invariants().unwrap();
    // The first half of the clients is idle now, the table's others busy; a table of a quarter
    // of its size keeps the busy ones, past it.
    let smaller = MIN_SHARD_ENTRIES / 2;
    lim.retune(
        Budget {
            rate: 500.0,
            max_clients: smaller,
            ..budget
        },
        true,
    );
    assert_eq!(lim.set.list.len(), 2, "the number of shards stays");
    assert!(lim.tracked_clients() > smaller, "busy entries stay");
    clock.advance(Duration::from_millis(10));
    lim.check_invariants().unwrap();
    totals.check(&lim).unwrap();
    for p in rest.drain(..rest.len() / 2) {
        p.settle(Spend::Token);
    }
    lim.check_invariants().unwrap();
    drop(rest);
    assert_eq!(lim.inflight(), 0);
    assert!(
        lim.tracked_clients() <= smaller,
        "{}",
        lim.tracked_clients()
    );
    lim.check_invariants().unwrap();
    lim.check_idle().unwrap();
    totals.check(&lim).unwrap();
}

#[test]
fn interval_rounds_up() {
    let b = |rate| {
        Budget {
            rate,
            ..Budget::link()
        }
        .interval_ns()
    };
    assert_eq!(b(1.0), 1_000_000_000);
    assert_eq!(b(3.0), 333_333_334);
    assert_eq!(b(50.0), 20_000_000);
    assert_eq!(b(1e9), 1);
    assert_eq!(b(f64::NAN), 86_400_000_000_000);
}

#[test]
fn retry_after_is_rounded_up_not_down() {
    // 0.4 tokens/s: one token every 2.5 s. After the burst, Retry-After is 3 (2.5 rounded
    // up); 2 s is not enough, 2.5 s is.
    let clock = Arc::new(ManualClock::at(0));
    let budget = Budget {
        rate: 0.4,
        burst: 1,
        per_client: 1,
        inflight: 1,
        max_clients: 4,
        charge: Charge::Always,
    };
    let lim = Arc::new(GroupLimiter::new(
        "t",
        budget,
        true,
        clock.clone(),
        Arc::new(Unobserved),
    ));
    lim.admit(key(1)).unwrap().settle(Spend::Nothing);
    let r = lim.admit(key(1)).unwrap_err();
    assert_eq!(r.retry_after_s, 3);
    clock.advance(Duration::from_secs(2));
    assert_eq!(lim.admit(key(1)).unwrap_err().retry_after_s, 1);
    clock.advance(Duration::from_millis(499));
    assert_eq!(lim.admit(key(1)).unwrap_err().retry_after_s, 1);
    clock.advance(Duration::from_millis(1));
    lim.admit(key(1)).unwrap().settle(Spend::Nothing);
}

#[test]
fn quota_reads_without_changing_anything() {
    let clock = Arc::new(ManualClock::at(0));
    let lim = Arc::new(GroupLimiter::new(
        "link",
        Budget {
            max_clients: 1,
            ..Budget::link()
        },
        true,
        clock.clone(),
        Arc::new(Unobserved),
    ));
    assert_eq!(lim.window_s(), 20);
    let full = Quota {
        remaining: 20,
        reset_s: 0,
    };
    assert_eq!(lim.quota(&key(1)), full, "an unknown key with room is full");
    assert!(!lim.is_tracked(&key(1)), "reading does not insert");
    for _ in 0..3 {
        lim.admit(key(1)).unwrap().settle(Spend::Nothing);
    }
    assert_eq!(
        lim.quota(&key(1)),
        Quota {
            remaining: 17,
            reset_s: 3
        }
    );
    clock.advance(Duration::from_millis(1500));
    assert_eq!(
        lim.quota(&key(1)),
        Quota {
            remaining: 18,
            reset_s: 2
        },
        "1.5 s refilled one whole token; 1.5 s left rounds up to 2"
    );
    // The table (1 entry) is full and key(1) is not idle-full: key(2) is on the shared row.
    assert_eq!(lim.quota(&key(2)), full);
    for _ in 0..20 {
        if let Ok(p) = lim.admit(key(1)) {
            p.settle(Spend::Nothing);
        }
    }
    let q = lim.quota(&key(1));
    assert_eq!(q.remaining, 0);
    assert_eq!(lim.admit(key(1)).unwrap_err().retry_after_s, 1);
    assert!(q.reset_s >= 19);
    lim.check_invariants().unwrap();
}

#[test]
fn spends_are_recorded_drained_once_and_remote_deficits_fold_in() {
    let clock = Arc::new(ManualClock::at(1_000));
    let budget = Budget {
        rate: 1.0,
        burst: 4,
        per_client: 4,
        charge: Charge::Always,
        ..Budget::webhook()
    };
    let lim = Arc::new(GroupLimiter::new(
        "g",
        budget,
        true,
        clock,
        Arc::new(Unobserved),
    ));
    let mut out = Vec::new();
    // Off by default: nothing is recorded.
    lim.admit(key(1)).unwrap().settle(Spend::Token);
    assert_eq!(lim.drain_spent(&mut out), 0);
    assert!(out.is_empty());
    lim.record_spent(16);
    lim.admit(key(1)).unwrap().settle(Spend::Token);
    lim.admit(key(1)).unwrap().settle(Spend::Token);
    lim.admit(key(2)).unwrap().refund();
    lim.drain_spent(&mut out);
    out.sort_by_key(|(k, _)| k.addr);
    assert_eq!(out, vec![(key(1), 2)]);
    lim.drain_spent(&mut out);
    assert!(out.is_empty());
    // Key 1 holds 1 token here; a remote deficit of 4 tokens leaves it none.
    assert_eq!(lim.quota(&key(1)).remaining, 1);
    assert!(lim.fold_deficit(&key(1), 4 * budget.interval_ns()));
    assert_eq!(lim.quota(&key(1)).remaining, 0);
    assert!(lim.admit(key(1)).is_err());
    // A smaller remote deficit changes nothing; an unknown key is left alone.
    assert!(lim.fold_deficit(&key(1), 1));
    assert_eq!(lim.quota(&key(1)).remaining, 0);
    assert!(!lim.fold_deficit(&key(9), 1));
}

#[test]
fn quota_subtracts_held_tokens() {
    let clock = Arc::new(ManualClock::at(0));
    let lim = Arc::new(GroupLimiter::new(
        "webhook",
        Budget {
            burst: 4,
            per_client: 4,
            ..Budget::webhook()
        },
        true,
        clock,
        Arc::new(Unobserved),
    ));
    let a = lim.admit(key(1)).unwrap();
    let b = lim.admit(key(1)).unwrap();
    assert_eq!(lim.quota(&key(1)).remaining, 2);
    a.settle(Spend::Token);
    assert_eq!(
        lim.quota(&key(1)),
        Quota {
            remaining: 2,
            reset_s: 1
        }
    );
    drop(b);
    assert_eq!(lim.quota(&key(1)).remaining, 3);
}

#[test]
fn top_orders_by_rejections_then_spend_and_forget_starts_afresh() {
    let clock = Arc::new(ManualClock::at(0));
    let lim = Arc::new(GroupLimiter::new(
        "link",
        Budget {
            burst: 3,
            rate: 0.001,
            per_client: 2,
            ..Budget::link()
        },
        true,
        clock.clone(),
        Arc::new(Unobserved),
    ));
    // key 1: 3 spent, 2 rejected; key 2: 1 spent; key 3: 2 spent, one in flight.
    for _ in 0..5 {
        if let Ok(p) = lim.admit(key(1)) {
            p.settle(Spend::Nothing);
        }
    }
    lim.admit(key(2)).unwrap().settle(Spend::Nothing);
    lim.admit(key(3)).unwrap().settle(Spend::Nothing);
    let busy = lim.admit(key(3)).unwrap();
    let top = lim.top(10);
    let keys: Vec<_> = top.iter().map(|(k, _)| *k).collect();
    assert_eq!(keys, [key(1), key(3), key(2)]);
    assert_eq!(
        top[0].1,
        RowSnapshot {
            tokens: 0,
            spent: 3,
            inflight: 0,
            rejections: 2
        }
    );
    assert_eq!(top[1].1.inflight, 1);
    assert_eq!(lim.top(1).len(), 1);
    assert_eq!(lim.top(1)[0].0, key(1));
    assert_eq!(lim.shared_row().tokens, 3, "the shared row was never used");
    // A client at its per-client cap is counted too.
    let busy2 = lim.admit(key(3)).unwrap();
    let capped = lim.admit(key(3)).unwrap_err();
    assert_eq!(capped.reason, RejectReason::ClientConcurrency);
    assert_eq!(lim.top(3)[1].1.rejections, 1);

    assert!(lim.forget(&key(1)));
    assert!(!lim.is_tracked(&key(1)));
    assert!(!lim.forget(&key(1)), "already forgotten");
    assert_eq!(
        lim.quota(&key(1)).remaining,
        3,
        "a forgotten key starts full"
    );
    // With a request in flight the entry stays, reset, and keeps its slot.
    assert!(lim.forget(&key(3)));
    assert!(lim.is_tracked(&key(3)));
    let row = lim
        .top(10)
        .into_iter()
        .find(|(k, _)| *k == key(3))
        .unwrap()
        .1;
    assert_eq!((row.spent, row.rejections, row.inflight), (0, 0, 2));
    assert_eq!(lim.inflight(), 2);
    busy.settle(Spend::Nothing);
    busy2.settle(Spend::Nothing);
    assert_eq!(lim.inflight(), 0);
    lim.check_invariants().unwrap();
}

/// A rejection the caller answered anyway (a cached health answer) is taken back from the row
/// that counted it: the client's, or the shared row when the table was full.
#[test]
fn an_uncounted_rejection_leaves_its_row_as_before() {
    let clock = Arc::new(ManualClock::at(0));
    let lim = Arc::new(GroupLimiter::new(
        "health",
        Budget {
            burst: 1,
            rate: 0.001,
            max_clients: 1,
            ..Budget::link()
        },
        true,
        clock,
        Arc::new(Unobserved),
    ));
    lim.admit(key(1)).unwrap().settle(Spend::Nothing);
    let own = lim.admit(key(1)).unwrap_err();
    assert_eq!(lim.top(1)[0].1.rejections, 1);
    lim.uncount_rejection(&key(1), &own);
    assert_eq!(lim.top(1)[0].1.rejections, 0);
    // key 2 finds the table full: the shared row decides, and counts.
    lim.admit(key(2)).unwrap().settle(Spend::Nothing);
    let shared = lim.admit(key(2)).unwrap_err();
    assert_eq!(shared.scope, Scope::Shared);
    assert_eq!(lim.shared_row().rejections, 1);
    lim.uncount_rejection(&key(2), &shared);
    assert_eq!(lim.shared_row().rejections, 0);
    assert_eq!(lim.top(1)[0].1.rejections, 0, "key 1's row is untouched");
}

/// A case the property below once shrank to, kept by name: one slow token (0.3/s, burst 1), one
/// slot, a one-entry table. The spent token is back exactly at Retry-After, and the client's own
/// request in flight then refuses the next ones on the group cap (checked first), not on the rate.
#[test]
fn retry_after_is_exact_for_a_slow_rate_and_the_group_cap_follows() {
    let budget = Budget {
        rate: 0.3,
        burst: 1,
        per_client: 1,
        inflight: 1,
        max_clients: 1,
        charge: Charge::Always,
    };
    let clock = Arc::new(ManualClock::at(1_000));
    let totals = Arc::new(Totals::default());
    let lim = Arc::new(GroupLimiter::new(
        "p",
        budget,
        true,
        clock.clone(),
        totals.clone(),
    ));
    lim.admit(key(0)).unwrap().settle(Spend::Nothing);
    let refused = lim.admit(key(0)).unwrap_err();
    assert_eq!(refused.reason, RejectReason::Rate);
    // 1 / 0.3 tokens per second is 3.33 s, rounded up to whole seconds.
    assert_eq!(refused.retry_after_s, 4);
    clock.advance(Duration::from_millis(3_333));
    assert_eq!(
        lim.admit(key(0)).unwrap_err().reason,
        RejectReason::Rate,
        "the token is not back before 1 / rate"
    );
    clock.advance(Duration::from_millis(667));
    let held = lim.admit(key(0)).unwrap();
    for _ in 0..2 {
        let refused = lim.admit(key(0)).unwrap_err();
        assert_eq!(refused.reason, RejectReason::GroupConcurrency);
        assert_eq!(refused.retry_after_s, CAP_RETRY_AFTER_S);
    }
    lim.check_invariants().unwrap();
    totals.check(&lim).unwrap();
    drop(held);
    assert_eq!(lim.inflight(), 0);
    lim.check_idle().unwrap();
}

#[derive(Debug, Clone)]
enum Op {
    Admit(u32),
    Settle(usize, u16),
    Drop(usize),
    Refund(usize),
    Advance(u64),
    Forget(u32),
    /// A reload that changes only `max_clients`.
    Resize(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0u32..6).prop_map(Op::Admit),
        2 => (any::<usize>(), prop_oneof![Just(200u16), Just(404), Just(500)])
            .prop_map(|(i, s)| Op::Settle(i, s)),
        1 => any::<usize>().prop_map(Op::Drop),
        1 => any::<usize>().prop_map(Op::Refund),
        2 => (0u64..3_000_000_000).prop_map(Op::Advance),
        1 => (0u32..6).prop_map(Op::Forget),
        1 => (1usize..8).prop_map(Op::Resize),
    ]
}

fn budget() -> impl Strategy<Value = Budget> {
    (
        prop_oneof![Just(0.3), Just(1.0), Just(3.0), Just(7.5), Just(50.0)],
        1u32..6,
        1u32..4,
        0u32..4,
        1usize..8,
        any::<bool>(),
    )
        .prop_map(
            |(rate, burst, per_client, extra, max_clients, on_failure)| {
                let charge = if on_failure {
                    Charge::OnFailure
                } else {
                    Charge::Always
                };
                let per_client = if on_failure {
                    per_client.min(burst)
                } else {
                    per_client
                };
                Budget {
                    rate,
                    burst,
                    per_client,
                    inflight: per_client + extra,
                    max_clients,
                    charge,
                }
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// Random request/settle/forget/clock sequences keep every invariant; Retry-After is exact; a
    /// client alone in its row never gets more than burst + rate × elapsed tokens; everything
    /// returns to zero when all permits are gone.
    #[test]
    fn limiter_invariants(
        budget in budget(),
        enforce in prop::bool::weighted(0.8),
        ops in prop::collection::vec(op(), 1..120),
    ) {
        prop_assert!(budget.validate("p").is_ok());
        let clock = Arc::new(ManualClock::at(1_000));
        let totals = Arc::new(Totals::default());
        let lim = Arc::new(GroupLimiter::new("p", budget, enforce, clock.clone(), totals.clone()));
        let mut permits: Vec<(u32, Permit<&Shards>)> = Vec::new();
        // Per key: first-seen time and tokens spent while on its own row.
        let mut first: HashMap<u32, u64> = HashMap::new();
        let mut spent: HashMap<u32, u64> = HashMap::new();
        // Keys that ever used the shared row or lost their entry are excluded from the bound.
        let mut own_rows_only = budget.max_clients >= 6;
        for op in ops {
            match op {
                Op::Admit(k) => {
                    first.entry(k).or_insert_with(|| clock.now_ns());
                    match lim.admit(key(k)) {
                        Ok(p) => {
                            if enforce {
                                prop_assert!(p.shadow_rejection().is_none());
                            }
                            if p.shadow_rejection().is_none() && budget.charge == Charge::Always {
                                *spent.entry(k).or_default() += 1;
                            }
                            permits.push((k, p));
                        }
                        Err(r) => {
                            prop_assert!(enforce);
                            prop_assert!(r.retry_after_s >= 1);
                            if r.reason == RejectReason::Rate {
                                // Waiting Retry-After out readmits, nothing else happening.
                                clock.advance(Duration::from_secs(r.retry_after_s));
                                let p = lim.admit(key(k));
                                prop_assert!(p.is_ok(), "retry after {} s: {:?}", r.retry_after_s, p.err());
                                if let Ok(p) = p {
                                    if budget.charge == Charge::Always {
                                        *spent.entry(k).or_default() += 1;
                                    }
                                    permits.push((k, p));
                                }
                            } else {
                                prop_assert_eq!(r.retry_after_s, CAP_RETRY_AFTER_S);
                            }
                        }
                    }
                }
                Op::Settle(i, status) => {
                    if !permits.is_empty() {
                        let (k, p) = permits.swap_remove(i % permits.len());
                        let counts = p.shadow_rejection().is_none();
                        p.settle(if (400..500).contains(&status) { Spend::Token } else { Spend::Nothing });
                        if counts && budget.charge == Charge::OnFailure && status == 404 {
                            *spent.entry(k).or_default() += 1;
                        }
                    }
                }
                Op::Drop(i) => {
                    if !permits.is_empty() {
                        drop(permits.swap_remove(i % permits.len()));
                    }
                }
                Op::Refund(i) => {
                    if !permits.is_empty() {
                        let (k, p) = permits.swap_remove(i % permits.len());
                        let counts = p.shadow_rejection().is_none();
                        p.refund();
                        if counts && budget.charge == Charge::Always {
                            // The token admission spent is given back.
                            if let Some(n) = spent.get_mut(&k) {
                                *n = n.saturating_sub(1);
                            }
                        }
                    }
                }
                Op::Advance(ns) => clock.advance(Duration::from_nanos(ns)),
                Op::Forget(k) => {
                    // A forgotten key starts afresh: its bound restarts now.
                    if lim.forget(&key(k)) {
                        first.insert(k, clock.now_ns());
                        spent.insert(k, 0);
                    }
                }
                Op::Resize(n) => {
                    own_rows_only &= n >= 6;
                    lim.retune(Budget { max_clients: n, ..budget }, enforce);
                }
            }
            if let Err(e) = lim.check_invariants().and_then(|()| totals.check(&lim)) {
                prop_assert!(false, "{}", e);
            }
            // Each client's entry counts exactly the slots of its own permits: a permit settles
            // on the entry it was admitted on, by number, whatever entries came and went since.
            for k in 0..6 {
                let own = permits
                    .iter()
                    .filter(|(pk, p)| *pk == k && p.holds_slot() && p.scope() == Scope::Client)
                    .count();
                let shard = lim.set.shard(&key(k)).lock();
                let row = shard.table.peek(&key(k)).map_or(0, |r| r.inflight);
                drop(shard);
                prop_assert_eq!(row as usize, own, "key {}'s entry", k);
            }
            if own_rows_only {
                let interval = budget.interval_ns();
                for (k, n) in &spent {
                    let elapsed = clock.now_ns() - first[k];
                    let bound = u64::from(budget.burst) + elapsed / interval;
                    prop_assert!(*n <= bound, "key {} spent {} > {}", k, n, bound);
                    // And the real-valued bound burst + rate × elapsed.
                    #[expect(clippy::cast_precision_loss, reason = "test magnitudes are small")]
                    let real = f64::from(budget.burst) + budget.rate * (elapsed as f64) / 1e9;
                    #[expect(clippy::cast_precision_loss, reason = "test magnitudes are small")]
                    let n_f = *n as f64;
                    prop_assert!(n_f <= real + 1e-9);
                }
            }
        }
        permits.clear();
        prop_assert_eq!(lim.inflight(), 0);
        if let Err(e) = lim.check_invariants() {
            prop_assert!(false, "{}", e);
        }
        if let Err(e) = lim.check_idle() {
            prop_assert!(false, "{}", e);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// With caps large enough that the shards lease slots in batches, the group cap stays exact:
    /// a request is refused for it (or, in shadow mode, would have been) exactly when the cap's
    /// slots are all held, never below, whatever shards the idle leased slots sit on. The table
    /// is either two shards of 1,024 entries or one of 16, where most of the 64 clients are decided
    /// on the shared row (the slot moving to the shared row's shard); lulls end most requests at
    /// once, and reloads change the cap and switch shadow mode. Every invariant holds at every
    /// step, the pool's count among them, and every slot comes back.
    #[test]
    fn the_group_cap_is_exact_when_shards_lease_batches(
        cap in 48u32..120,
        per_client in 4u32..9,
        max_clients in prop_oneof![Just(16usize), Just(2 * MIN_SHARD_ENTRIES)],
        ops in prop::collection::vec((0u32..64, 0u8..16, any::<usize>()), 1..600),
    ) {
        let budget = Budget {
            rate: 1e6,
            burst: 1_000_000,
            per_client,
            inflight: cap,
            max_clients,
            charge: Charge::OnFailure,
        };
        let lim = Arc::new(GroupLimiter::new(
            "p",
            budget,
            true,
            Arc::new(ManualClock::at(1_000)),
            Arc::new(Unobserved),
        ));
        prop_assert!(lim.set.core.pool.leases_batches());
        let mut cap = cap;
        let mut permits: Vec<Permit<&Shards>> = Vec::new();
        for (k, what, i) in ops {
            match what {
                // Admissions more often than ends, so that the cap is reached.
                0..=10 => {
                    let before = lim.inflight();
                    match lim.admit(key(k)) {
                        Ok(p) => {
                            if p.shadow_rejection() == Some(RejectReason::GroupConcurrency) {
                                prop_assert!(before >= cap, "{} held, cap {}", before, cap);
                            }
                            permits.push(p);
                        }
                        Err(r) if r.reason == RejectReason::GroupConcurrency => {
                            prop_assert!(
                                before >= cap,
                                "refused with {} held, cap {}",
                                before,
                                cap
                            );
                        }
                        Err(r) => prop_assert_eq!(r.reason, RejectReason::ClientConcurrency),
                    }
                }
                11 | 12 if !permits.is_empty() => {
                    permits.swap_remove(i % permits.len()).settle(Spend::Token);
                }
                13 if !permits.is_empty() => drop(permits.swap_remove(i % permits.len())),
                // A lull: all but a quarter of the requests end (refunded), so that a tight group
                // loosens again and leases batches.
                14 if i % 8 == 0 => {
                    for p in permits.drain(permits.len() / 4..) {
                        p.refund();
                    }
                }
                15 if i % 4 == 0 => {
                    // A reload: a new cap from 16 to 207 (batches or not), not below the slots
                    // held (a cap below them is `slots`' own test), shadow mode now and then.
                    cap = (16 + u32::try_from(i % 192).unwrap_or(0)).max(lim.inflight());
                    let enforce = i % 7 != 0;
                    let per_client = per_client.min(cap);
                    lim.retune(Budget { inflight: cap, per_client, ..budget }, enforce);
                }
                _ => {}
            }
            let holding = permits.iter().filter(|p| p.holds_slot()).count();
            prop_assert_eq!(lim.inflight(), u32::try_from(holding).unwrap_or(u32::MAX));
            if let Err(e) = lim.check_invariants() {
                prop_assert!(false, "{}", e);
            }
        }
        permits.clear();
        prop_assert_eq!(lim.inflight(), 0);
        if let Err(e) = lim.check_idle() {
            prop_assert!(false, "{}", e);
        }
    }
}

/// A limiter dropped by a reload (its group removed, or rebuilt for a new charge mode) takes its
/// entries out of the observer's client count, and its requests still in flight count until
/// they settle, beside those of the limiter that replaced it: `door.clients` and
/// `door.inflight` end at what the new limiter holds, not at what the old table held, and the
/// old limiter's gauge is gone once nothing holds its shards.
#[test]
fn a_dropped_limiter_takes_its_clients_out_of_the_count() {
    let totals = Arc::new(Totals::default());
    let small = Budget {
        max_clients: 3,
        ..Budget::link()
    };
    let lim = Arc::new(GroupLimiter::new(
        "link",
        small,
        true,
        Arc::new(ManualClock::at(1_000)),
        totals.clone(),
    ));
    for i in 0..3 {
        lim.admit(key(i)).unwrap().settle(Spend::Nothing);
    }
    // Held as door's request path holds them: through a reference to the shards, which outlives
    // the limiter.
    let owned = |k| Permit::admit(Arc::clone(lim.shards()), key(k)).unwrap();
    let held = [owned(0), owned(1)];
    assert_eq!(totals.clients.load(Ordering::Relaxed), 3);
    // A reload shrank the table while keys 0 and 1 were busy: their rows stay past the new
    // size, to be shed as they settle.
    lim.retune(
        Budget {
            max_clients: 1,
            ..small
        },
        true,
    );
    assert_eq!(totals.clients.load(Ordering::Relaxed), 2);
    drop(lim);
    assert_eq!(totals.clients.load(Ordering::Relaxed), 0);
    assert_eq!(
        totals.inflight(),
        2,
        "the gone limiter's requests still count"
    );
    // The group rebuilt (a new charge mode): its new limiter reports to the same observer, whose
    // in-flight count spans both.
    let rebuilt = Arc::new(GroupLimiter::new(
        "link",
        small,
        true,
        Arc::new(ManualClock::at(1_000)),
        totals.clone(),
    ));
    let fresh = rebuilt.admit(key(7)).unwrap();
    assert_eq!(totals.inflight(), 3);
    let [first, second] = held;
    first.settle(Spend::Nothing);
    assert_eq!(totals.inflight(), 2);
    let gone = || {
        totals
            .gauges
            .lock()
            .unwrap()
            .iter()
            .filter(|g| g.is_gone())
            .count()
    };
    assert_eq!(
        gone(),
        0,
        "a permit still holds a shard of the gone limiter"
    );
    second.settle(Spend::Nothing);
    assert_eq!(totals.inflight(), 1);
    assert_eq!(
        gone(),
        1,
        "nothing holds the gone limiter's shards any more"
    );
    assert_eq!(
        totals.clients.load(Ordering::Relaxed),
        1,
        "a settled row was shed and counted again"
    );
    fresh.settle(Spend::Nothing);
    drop(rebuilt);
    assert_eq!(totals.inflight(), 0);
    assert_eq!(gone(), 2);
}

/// A token refunded after a cluster sync drained its spend (a stream's plane token, given back
/// when the answer turns out to be a stream) is drained as -1 by the next sync, so that the store
/// gives it back too; a refund of a spend not yet drained cancels it.
#[test]
fn a_refund_after_the_drain_is_drained_as_a_negative_spend() {
    let lim = Arc::new(GroupLimiter::new(
        "link",
        Budget::link(),
        true,
        Arc::new(ManualClock::at(1_000)),
        Arc::new(Unobserved),
    ));
    lim.record_spent(16);
    let mut spent = Vec::new();
    let long = lim.admit(key(1)).unwrap();
    lim.admit(key(2)).unwrap().settle(Spend::Nothing);
    lim.drain_spent(&mut spent);
    spent.sort_by_key(|(k, _)| k.addr);
    assert_eq!(spent, vec![(key(1), 1), (key(2), 1)]);
    long.refund();
    // Key 2 spends one and has it refunded within the same interval: nothing to send.
    lim.admit(key(2)).unwrap().refund();
    lim.drain_spent(&mut spent);
    assert_eq!(spent, vec![(key(1), -1)]);
    lim.drain_spent(&mut spent);
    assert!(spent.is_empty());
}

/// A refund that lands while a sync is under way (after its drain took the spend, before its
/// answer folds the store's deficit, which still holds that token) is not charged again by the
/// fold.
#[test]
fn a_refund_during_a_sync_is_not_folded_back() {
    let lim = Arc::new(GroupLimiter::new(
        "link",
        Budget::link(),
        true,
        Arc::new(ManualClock::at(1_000)),
        Arc::new(Unobserved),
    ));
    lim.record_spent(16);
    let burst = Budget::link().burst;
    let interval = Budget::link().interval_ns();
    let mut spent = Vec::new();
    let p = lim.admit(key(1)).unwrap();
    lim.drain_spent(&mut spent);
    p.refund();
    assert_eq!(lim.quota(&key(1)).remaining, burst);
    // The store's answer: the one token this door sent.
    assert!(lim.fold_deficit(&key(1), interval));
    assert_eq!(lim.quota(&key(1)).remaining, burst, "the refunded token");
    // A deficit past the refund still folds.
    assert!(lim.fold_deficit(&key(1), 3 * interval));
    assert_eq!(lim.quota(&key(1)).remaining, burst - 2);
    lim.drain_spent(&mut spent);
    assert_eq!(spent, vec![(key(1), -1)]);
}

/// A client forgotten while a cluster sync is under way (after the sync drained the spends, before
/// it folds the store's answers) keeps its reset row: that sync's fold of its old debt is
/// skipped. From the next drain on, folds apply again.
#[test]
fn a_client_forgotten_during_a_sync_is_not_folded_back() {
    let lim = Arc::new(GroupLimiter::new(
        "link",
        Budget::link(),
        true,
        Arc::new(ManualClock::at(1_000)),
        Arc::new(Unobserved),
    ));
    lim.record_spent(16);
    let mut spent = Vec::new();
    lim.admit(key(1)).unwrap().settle(Spend::Nothing);
    lim.drain_spent(&mut spent);
    assert_eq!(spent, vec![(key(1), 1)]);
    // The admin API forgets it; the client comes back before the sync's answer.
    assert!(lim.forget(&key(1)));
    lim.admit(key(1)).unwrap().settle(Spend::Nothing);
    let full = Budget::link().burst;
    assert!(!lim.fold_deficit(&key(1), 3_600 * NS_PER_S), "folded back");
    assert_eq!(lim.quota(&key(1)).remaining, full - 1);
    // The next sync drains its new spend, and its answer folds as usual.
    lim.drain_spent(&mut spent);
    assert_eq!(spent, vec![(key(1), 1)]);
    assert!(lim.fold_deficit(&key(1), 3_600 * NS_PER_S));
    assert_eq!(lim.quota(&key(1)).remaining, 0);
}

#[test]
fn credential_keys_are_written_in_hex_and_read_back() {
    let key = PrefixKey {
        addr: core::array::from_fn(|i| u8::try_from(i * 17).unwrap_or(0)),
    };
    let text = KeyKind::Credential.text(&key);
    assert_eq!(text, "credential:00112233445566778899aabbccddeeff");
    assert_eq!(KeyKind::parse_credential(&text), Some(key));
    assert_eq!(
        KeyKind::parse_credential(
            &text
                .to_ascii_uppercase()
                .replace("CREDENTIAL", "credential")
        ),
        Some(key)
    );
    for bad in [
        "credential:",
        "credential:00112233445566778899aabbccddeef",
        "credential:00112233445566778899aabbccddeeff0",
        "credential:+0112233445566778899aabbccddeeff",
        "credential:0x12233445566778899aabbccddeeff0",
        "Credential:00112233445566778899aabbccddeeff",
        "00112233445566778899aabbccddeeff",
        "198.51.100.7/32",
    ] {
        assert_eq!(KeyKind::parse_credential(bad), None, "{bad}");
    }
    // A client key stays an address.
    let client = PrefixKey::from_ipv4([198, 51, 100, 7]);
    assert_eq!(KeyKind::Client.text(&client), "198.51.100.7/32");
}
