//! The limiter's behaviour (docs/design.md, "Limits": rate, charge on failure, in-flight caps,
//! the bounded table and its shared row, shadow mode, metrics), through the public API, with an
//! injected clock: no test sleeps.

use std::{
    collections::HashMap,
    panic::{AssertUnwindSafe, catch_unwind},
    sync::{
        Arc,
        atomic::{AtomicU32, AtomicUsize, Ordering},
    },
    time::Duration,
};

use door_common::prefix::PrefixKey;
use door_daemon::{
    http::{
        answer,
        settle::{self, End},
    },
    limit::{
        Budget, Charge, DEFAULT_MAX_CLIENTS, GroupLimiter, Permit, RejectReason, Scope, ShardsRef,
        Unobserved,
    },
    obs::metrics::{GroupMetrics, Metrics, Outcome},
    time::ManualClock,
};
use http::StatusCode;
use opentelemetry::metrics::MeterProvider as _;
use opentelemetry_sdk::metrics::{
    InMemoryMetricExporter, PeriodicReader, SdkMeterProvider,
    data::{AggregatedMetrics, MetricData},
};

fn peer(i: u32) -> PrefixKey {
    let [_, _, hi, lo] = i.to_be_bytes();
    PrefixKey::from_ipv4([198, 51, hi, lo])
}

fn v6(i: u64) -> PrefixKey {
    let mut octets = [0u8; 16];
    octets[..2].copy_from_slice(&[0x20, 0x01]);
    // A /64 key keeps octets 0..8: the index goes in octets 2..8.
    octets[2..8].copy_from_slice(&i.to_be_bytes()[2..]);
    PrefixKey::from_ipv6(octets)
}

/// Settling as the request path does: [`settle::settle`] decides from the upstream's status
/// whether the held token is spent (only a 4xx spends).
trait Answered {
    fn answered(self, status: StatusCode);
}

impl<H: ShardsRef> Answered for Permit<H> {
    fn answered(self, status: StatusCode) {
        settle::settle(
            self,
            End::Answered(status),
            &Metrics::noop().for_group("test"),
        );
    }
}

/// A group's limiter reporting to `metrics`, and the instruments its requests are counted on.
fn observed(
    name: &str,
    budget: Budget,
    enforce: bool,
    clock: &Arc<ManualClock>,
    metrics: &Metrics,
) -> (Arc<GroupLimiter>, Arc<GroupMetrics>) {
    let group = Arc::new(metrics.clone().for_group(name));
    let lim = Arc::new(GroupLimiter::new(
        name,
        budget,
        enforce,
        clock.clone(),
        Arc::clone(&group) as Arc<dyn door_daemon::limit::Observer>,
    ));
    (lim, group)
}

fn limiter(budget: Budget, clock: &Arc<ManualClock>) -> Arc<GroupLimiter> {
    Arc::new(GroupLimiter::new(
        "test",
        budget,
        true,
        clock.clone(),
        Arc::new(Unobserved),
    ))
}

#[test]
fn door_limits_rate() {
    let clock = Arc::new(ManualClock::at(7));
    let link = limiter(Budget::link(), &clock);
    let a = peer(1);
    for _ in 0..20 {
        link.admit(a).unwrap().answered(StatusCode::OK);
    }
    let r = link.admit(a).unwrap_err();
    assert_eq!(answer::status(r.reason), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(r.reason, RejectReason::Rate);
    assert_eq!(r.scope, Scope::Client);
    assert_eq!(r.retry_after_s, 1);
    // Another peer has its own bucket.
    link.admit(peer(2)).unwrap().answered(StatusCode::OK);
    // Just short of Retry-After is still too early; exactly Retry-After readmits.
    clock.advance(Duration::from_nanos(999_999_999));
    assert_eq!(link.admit(a).unwrap_err().retry_after_s, 1);
    clock.advance(Duration::from_nanos(1));
    link.admit(a).unwrap().answered(StatusCode::OK);
    // One token a second: the next is again 429.
    assert_eq!(link.admit(a).unwrap_err().reason, RejectReason::Rate);
    // door's own 429 charged nothing: after 20 s the bucket is full again.
    clock.advance(Duration::from_secs(20));
    for _ in 0..20 {
        link.admit(a).unwrap().answered(StatusCode::OK);
    }
    assert!(link.admit(a).is_err());
}

#[test]
fn door_limits_rate_retry_after_counts_whole_seconds() {
    // A 0.1/s bucket of 2, drained at t = 0: the next token is 10 s away. After 5.3 s it is
    // 4.7 s away (Retry-After 5), after 9.3 s 0.7 s away (Retry-After 1).
    let clock = Arc::new(ManualClock::at(0));
    let slow = limiter(
        Budget {
            rate: 0.1,
            burst: 2,
            ..Budget::link()
        },
        &clock,
    );
    slow.admit(peer(1)).unwrap().answered(StatusCode::OK);
    slow.admit(peer(1)).unwrap().answered(StatusCode::OK);
    assert_eq!(slow.admit(peer(1)).unwrap_err().retry_after_s, 10);
    clock.advance(Duration::from_millis(5_300));
    assert_eq!(slow.admit(peer(1)).unwrap_err().retry_after_s, 5);
    clock.advance(Duration::from_secs(4));
    assert_eq!(slow.admit(peer(1)).unwrap_err().retry_after_s, 1);
    clock.advance(Duration::from_millis(700));
    slow.admit(peer(1)).unwrap().answered(StatusCode::OK);
}

#[test]
fn door_limits_charge_on_failure() {
    let clock = Arc::new(ManualClock::at(0));
    let webhook = limiter(Budget::webhook(), &clock);
    let burst = Budget::webhook().burst;

    // burst 400s drain the bucket: the next request is 429.
    let bad = peer(1);
    for _ in 0..burst {
        webhook
            .admit(bad)
            .unwrap()
            .answered(StatusCode::BAD_REQUEST);
    }
    let r = webhook.admit(bad).unwrap_err();
    assert_eq!((r.reason, r.scope), (RejectReason::Rate, Scope::Client));
    assert_eq!(r.retry_after_s, 1); // 50/s: the next token is 20 ms away

    // 2 × burst successes never drain anything.
    let good = peer(2);
    for _ in 0..2 * burst {
        webhook.admit(good).unwrap().answered(StatusCode::OK);
    }
    // 5xx and dropped permits spend nothing either.
    webhook
        .admit(good)
        .unwrap()
        .answered(StatusCode::BAD_GATEWAY);
    drop(webhook.admit(good).unwrap());
    webhook.admit(good).unwrap().answered(StatusCode::OK);

    // With one token left, a concurrent second request (the first unsettled) gets 429.
    let edge = peer(3);
    for _ in 0..burst - 1 {
        webhook.admit(edge).unwrap().answered(StatusCode::NOT_FOUND);
    }
    let first = webhook.admit(edge).unwrap();
    let second = webhook.admit(edge).unwrap_err();
    assert_eq!(second.reason, RejectReason::Rate);
    assert_eq!(answer::status(second.reason), StatusCode::TOO_MANY_REQUESTS);
    // Retry-After is exact for the held token too: 20 ms to the next token, 1 s rounded up.
    assert_eq!(second.retry_after_s, 1);
    // The first one succeeds: its held token returns, and a second may proceed.
    first.answered(StatusCode::OK);
    webhook
        .admit(edge)
        .unwrap()
        .answered(StatusCode::BAD_REQUEST);
    assert!(webhook.admit(edge).is_err());
    clock.advance(Duration::from_secs(1));
    webhook.admit(edge).unwrap().answered(StatusCode::OK);
}

#[test]
fn door_limits_charge_always_spends_on_admission() {
    let clock = Arc::new(ManualClock::at(0));
    let link = limiter(Budget::link(), &clock);
    for _ in 0..20 {
        // Successes spend under Charge::Always.
        link.admit(peer(1)).unwrap().answered(StatusCode::OK);
    }
    assert!(link.admit(peer(1)).is_err());
}

#[test]
fn door_limits_concurrency() {
    let clock = Arc::new(ManualClock::at(0));
    let link = limiter(Budget::link(), &clock); // per_client 2, inflight 4
    let a1 = link.admit(peer(1)).unwrap();
    let a2 = link.admit(peer(1)).unwrap();
    let r = link.admit(peer(1)).unwrap_err();
    assert_eq!(r.reason, RejectReason::ClientConcurrency);
    assert_eq!(answer::status(r.reason), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(r.scope, Scope::Client);
    assert_eq!(r.retry_after_s, 1);

    let b1 = link.admit(peer(2)).unwrap();
    let b2 = link.admit(peer(2)).unwrap();
    assert_eq!(link.inflight(), 4);
    let r = link.admit(peer(3)).unwrap_err();
    assert_eq!(r.reason, RejectReason::GroupConcurrency);
    assert_eq!(answer::status(r.reason), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(r.scope, Scope::Group);
    assert_eq!(r.retry_after_s, 1);

    a1.answered(StatusCode::OK);
    link.admit(peer(3)).unwrap().answered(StatusCode::OK);
    drop((a2, b1, b2));
    assert_eq!(link.inflight(), 0);

    // A panic in code holding a permit frees the slot.
    let held = catch_unwind(AssertUnwindSafe(|| {
        let _p1 = link.admit(peer(4)).unwrap();
        let _p2 = link.admit(peer(4)).unwrap();
        assert_eq!(link.inflight(), 2);
        panic!("handler panicked");
    }));
    assert!(held.is_err());
    assert_eq!(link.inflight(), 0);
    link.admit(peer(4)).unwrap().answered(StatusCode::OK);
}

#[tokio::test]
async fn door_limits_concurrency_panicking_and_cancelled_tasks_free_their_slots() {
    let clock = Arc::new(ManualClock::at(0));
    let link = limiter(
        Budget {
            rate: 1000.0,
            burst: 1000,
            ..Budget::link()
        },
        &clock,
    );
    // A task that panics while holding a permit.
    let l = link.clone();
    let task = tokio::spawn(async move {
        let _p = l.admit(peer(1)).unwrap();
        tokio::task::yield_now().await;
        panic!("upstream handler panicked");
    });
    assert!(task.await.unwrap_err().is_panic());
    assert_eq!(link.inflight(), 0);

    // A task cancelled while waiting on the upstream.
    let l = link.clone();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        let p = l.admit(peer(1)).unwrap();
        let _ = tx.send(());
        std::future::pending::<()>().await;
        p.answered(StatusCode::OK);
    });
    rx.await.unwrap();
    assert_eq!(link.inflight(), 1);
    task.abort();
    assert!(task.await.unwrap_err().is_cancelled());
    assert_eq!(link.inflight(), 0);
    // Both slots are usable again.
    let p1 = link.admit(peer(1)).unwrap();
    let p2 = link.admit(peer(1)).unwrap();
    drop((p1, p2));
}

#[test]
fn door_limits_bounded() {
    let clock = Arc::new(ManualClock::at(0)); // frozen: never advanced until the refill
    let budget = Budget {
        rate: 1.0,
        burst: 10,
        per_client: 2,
        inflight: 4,
        max_clients: 2,
        charge: Charge::OnFailure,
    };
    let lim = limiter(budget, &clock);
    let (a, b) = (peer(1), peer(2));
    for k in [a, b] {
        for _ in 0..10 {
            lim.admit(k).unwrap().answered(StatusCode::BAD_REQUEST);
        }
        assert_eq!(lim.admit(k).unwrap_err().scope, Scope::Client);
    }
    assert_eq!(lim.tracked_clients(), 2);

    // 100 rotating peers (distinct /64s) share one bucket: exactly 10 admissions, then 429 on
    // the shared row.
    let rotating: std::collections::HashSet<_> = (0..100).map(v6).collect();
    assert_eq!(rotating.len(), 100);
    let mut admitted = 0;
    for i in 0..100 {
        match lim.admit(v6(i)) {
            Ok(p) => {
                assert_eq!(p.scope(), Scope::Shared);
                admitted += 1;
                p.answered(StatusCode::UNAUTHORIZED);
            }
            Err(r) => {
                assert_eq!(r.scope, Scope::Shared);
                assert_eq!(r.reason, RejectReason::Rate);
                assert_eq!(r.retry_after_s, 1);
            }
        }
    }
    assert_eq!(admitted, 10);
    // The table is unchanged: the same two clients, still drained.
    assert_eq!(lim.tracked_clients(), 2);
    assert!(lim.is_tracked(&a) && lim.is_tracked(&b));
    assert!(!lim.is_tracked(&v6(0)));
    assert_eq!(lim.admit(a).unwrap_err().scope, Scope::Client);

    // A shared refill admits a new peer (the entries are not full yet: no eviction).
    clock.advance(Duration::from_secs(1));
    let p = lim.admit(v6(1_000)).unwrap();
    assert_eq!(p.scope(), Scope::Shared);
    p.answered(StatusCode::OK);
    assert!(lim.is_tracked(&a) && lim.is_tracked(&b));

    // A fresh table with full buckets: A admitted first and still in flight, B served and idle.
    let clock = Arc::new(ManualClock::at(0));
    let lim = limiter(budget, &clock);
    let a_permit = lim.admit(a).unwrap();
    lim.admit(b).unwrap().answered(StatusCode::OK);
    let c = peer(3);
    let p = lim.admit(c).unwrap();
    assert_eq!(p.scope(), Scope::Client);
    assert!(lim.is_tracked(&a), "A is in flight: never evicted");
    assert!(!lim.is_tracked(&b), "B is full and idle: evicted");
    assert!(lim.is_tracked(&c));
    assert_eq!(lim.tracked_clients(), 2);
    drop((a_permit, p));
}

#[test]
fn door_limits_bounded_drained_entries_are_not_replaced_until_full() {
    // A drained, idle entry is not eligible; once it refills to burst it is.
    let clock = Arc::new(ManualClock::at(0));
    let lim = limiter(
        Budget {
            rate: 1.0,
            burst: 3,
            per_client: 1,
            inflight: 4,
            max_clients: 1,
            charge: Charge::Always,
        },
        &clock,
    );
    for _ in 0..3 {
        lim.admit(peer(1)).unwrap().answered(StatusCode::OK);
    }
    assert_eq!(lim.admit(peer(2)).unwrap().scope(), Scope::Shared);
    clock.advance(Duration::from_millis(2_999));
    assert_eq!(lim.admit(peer(3)).unwrap().scope(), Scope::Shared);
    assert!(lim.is_tracked(&peer(1)));
    clock.advance(Duration::from_millis(1));
    assert_eq!(lim.admit(peer(4)).unwrap().scope(), Scope::Client);
    assert!(!lim.is_tracked(&peer(1)));
    assert!(lim.is_tracked(&peer(4)));
}

/// A limiter of `max_clients` entries (one shard) at 1 token/s, burst 5, one request in flight
/// per client, 64 in the group.
fn small_table(max_clients: usize, charge: Charge, clock: &Arc<ManualClock>) -> Arc<GroupLimiter> {
    limiter(
        Budget {
            rate: 1.0,
            burst: 5,
            per_client: 1,
            inflight: 64,
            max_clients,
            charge,
        },
        clock,
    )
}

#[test]
fn door_limits_probe_refreshes_ineligible_entries() {
    // Table of 9 busy entries: a miss probes the 8 oldest, refreshes them, and the 9th (never
    // probed) becomes the oldest; it is full and idle, so the next miss evicts it.
    let clock = Arc::new(ManualClock::at(0));
    let lim = small_table(9, Charge::Always, &clock);
    let busy: Vec<_> = (0..8).map(|i| lim.admit(peer(i)).unwrap()).collect();
    lim.admit(peer(8)).unwrap().answered(StatusCode::OK); // newest, idle, not full (one spent)
    clock.advance(Duration::from_secs(1)); // now peer(8) is full again
    // Miss: probes peer 0..7 (busy) then stops at 8 entries; none eligible: shared.
    assert_eq!(lim.admit(peer(100)).unwrap().scope(), Scope::Shared);
    // peer(8) is now the oldest: the next miss replaces it.
    assert_eq!(lim.admit(peer(101)).unwrap().scope(), Scope::Client);
    assert!(!lim.is_tracked(&peer(8)));
    assert!((0..8).all(|i| lim.is_tracked(&peer(i))));
    drop(busy);
}

#[test]
fn door_limits_a_returning_client_keeps_its_entry() {
    // A full table of full, idle entries: a miss replaces the oldest entry, except that a client
    // that came back since its entry was placed keeps it, and the next oldest goes instead.
    let clock = Arc::new(ManualClock::at(0));
    let lim = small_table(4, Charge::OnFailure, &clock);
    for i in 0..4 {
        lim.admit(peer(i)).unwrap().answered(StatusCode::OK); // a 200 spends nothing: full
    }
    // The oldest client comes back with two requests at once: its cap of 1 refuses the second.
    let first = lim.admit(peer(0)).unwrap();
    assert!(lim.admit(peer(0)).is_err());
    first.answered(StatusCode::OK);
    assert_eq!(lim.admit(peer(100)).unwrap().scope(), Scope::Client);
    let top: Vec<_> = lim
        .top(1)
        .into_iter()
        .map(|(k, r)| (k, r.rejections))
        .collect();
    assert_eq!(
        top,
        [(peer(0), 1)],
        "the returning client keeps its row and its 429 count"
    );
    assert!(!lim.is_tracked(&peer(1)), "the oldest of the others goes");
    lim.admit(peer(2)).unwrap().answered(StatusCode::OK);
    assert_eq!(lim.admit(peer(101)).unwrap().scope(), Scope::Client);
    assert!(lim.is_tracked(&peer(2)) && !lim.is_tracked(&peer(3)));
    // peer(0) had its second chance and did not come back again: it is the oldest now.
    assert_eq!(lim.admit(peer(102)).unwrap().scope(), Scope::Client);
    assert!(!lim.is_tracked(&peer(0)));
}

#[test]
fn door_limits_shadow_mode_admits_everything_and_takes_nothing() {
    let clock = Arc::new(ManualClock::at(0));
    let shadow = Arc::new(GroupLimiter::new(
        "link",
        Budget::link(),
        false,
        clock.clone(),
        Arc::new(Unobserved),
    ));
    for _ in 0..20 {
        let p = shadow.admit(peer(1)).unwrap();
        assert_eq!(p.shadow_rejection(), None);
        p.answered(StatusCode::OK);
    }
    // Over the rate: admitted, flagged, and it spends nothing, so decisions stay those of
    // enforcement: after 1 s exactly one more would pass.
    for _ in 0..5 {
        let p = shadow.admit(peer(1)).unwrap();
        assert_eq!(p.shadow_rejection(), Some(RejectReason::Rate));
    }
    clock.advance(Duration::from_secs(1));
    assert_eq!(shadow.admit(peer(1)).unwrap().shadow_rejection(), None);
    assert_eq!(
        shadow.admit(peer(1)).unwrap().shadow_rejection(),
        Some(RejectReason::Rate)
    );

    // Concurrency: would-be rejections hold no slot.
    let held: Vec<_> = (0..2).map(|_| shadow.admit(peer(2)).unwrap()).collect();
    let extra = shadow.admit(peer(2)).unwrap();
    assert_eq!(
        extra.shadow_rejection(),
        Some(RejectReason::ClientConcurrency)
    );
    assert_eq!(shadow.inflight(), 2);
    let more: Vec<_> = (3..5).map(|i| shadow.admit(peer(i)).unwrap()).collect();
    let over = shadow.admit(peer(9)).unwrap();
    assert_eq!(
        over.shadow_rejection(),
        Some(RejectReason::GroupConcurrency)
    );
    assert_eq!(over.scope(), Scope::Group);
    assert_eq!(shadow.inflight(), 4);
    drop((held, extra, more, over));
    assert_eq!(shadow.inflight(), 0);
}

/// Sum-type points of one metric: (attributes, value).
#[expect(clippy::unwrap_used, clippy::panic, reason = "test helper")]
fn points(exporter: &InMemoryMetricExporter, name: &str) -> Vec<(Vec<(String, String)>, i128)> {
    let mut out = Vec::new();
    let all = exporter.get_finished_metrics().unwrap();
    let Some(last) = all.last() else {
        return out;
    };
    for scope in last.scope_metrics() {
        for metric in scope.metrics().filter(|m| m.name() == name) {
            let attrs = |it: &mut dyn Iterator<Item = &opentelemetry::KeyValue>| {
                it.map(|kv| (kv.key.to_string(), kv.value.to_string()))
                    .collect::<Vec<_>>()
            };
            match metric.data() {
                AggregatedMetrics::U64(MetricData::Sum(sum)) => {
                    for p in sum.data_points() {
                        out.push((attrs(&mut p.attributes()), i128::from(p.value())));
                    }
                }
                AggregatedMetrics::I64(MetricData::Sum(sum)) => {
                    for p in sum.data_points() {
                        out.push((attrs(&mut p.attributes()), i128::from(p.value())));
                    }
                }
                other => panic!("{name}: unexpected data {other:?}"),
            }
        }
    }
    out
}

/// door's instruments on a meter provider whose reader exports to memory: read them with
/// [`points`] after `provider.force_flush()`.
fn exported() -> (InMemoryMetricExporter, SdkMeterProvider, Metrics) {
    let exporter = InMemoryMetricExporter::default();
    let provider = SdkMeterProvider::builder()
        .with_reader(PeriodicReader::builder(exporter.clone()).build())
        .build();
    let metrics = Metrics::new(&provider.meter("door"));
    (exporter, provider, metrics)
}

#[test]
fn door_limits_metrics() {
    let (exporter, provider, metrics) = exported();
    let clock = Arc::new(ManualClock::at(0));
    let budget = Budget {
        rate: 1.0,
        burst: 2,
        per_client: 1,
        inflight: 2,
        max_clients: 1,
        charge: Charge::Always,
    };
    let (enforce, enforce_m) = observed("link", budget, true, &clock, &metrics);
    let (shadow, shadow_m) = observed("shadow", budget, false, &clock, &metrics);

    let group = |lim: &GroupLimiter, m: &Arc<GroupMetrics>| {
        Arc::new(settle::Group::new(lim, Arc::clone(m)))
    };
    for (lim, m) in [(&enforce, &enforce_m), (&shadow, &shadow_m)] {
        // As the request path does: a refusal answered as one is counted.
        let g = group(lim, m);
        let admit = |k| settle::admit(&g, k).inspect_err(|r| settle::refused(m, r));
        admit(peer(1))
            .unwrap()
            .settle(End::Answered(StatusCode::OK)); // ok
        let p = admit(peer(1)).unwrap(); // the last token
        let _ = admit(peer(1)); // client cap: peer 1 has one in flight
        // Peer 2 cannot evict peer 1 (busy): the shared row admits it. The group is now full.
        let s1 = admit(peer(2)).unwrap();
        let _ = admit(peer(3)); // group cap
        p.settle(End::Answered(StatusCode::NOT_FOUND)); // client_error
        let _ = admit(peer(1)); // rate: burst 2 spent
        s1.settle(End::Unanswered); // server_error (the upstream gave no answer)
        admit(peer(4))
            .unwrap()
            .settle(End::Answered(StatusCode::BAD_GATEWAY)); // server_error
    }
    // Peer 1 refills, idle: a new peer evicts it.
    clock.advance(Duration::from_secs(2));
    settle::admit(&group(&enforce, &enforce_m), peer(5))
        .unwrap()
        .settle(End::Answered(StatusCode::OK)); // ok
    metrics.clone().for_group("health").record(Outcome::Cached);
    provider.force_flush().unwrap();

    let requests = points(&exporter, "door.requests");
    let mut seen: HashMap<(String, String), i128> = HashMap::new();
    for (attrs, value) in &requests {
        let keys: Vec<_> = attrs.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(keys.len(), 2, "door.requests attributes: {attrs:?}");
        assert!(keys.contains(&"door.group") && keys.contains(&"door.outcome"));
        let get = |k: &str| attrs.iter().find(|(a, _)| a == k).unwrap().1.clone();
        seen.insert((get("door.group"), get("door.outcome")), *value);
    }
    let expect = [
        ("link", "ok", 2),
        ("link", "client_error", 1),
        ("link", "server_error", 2),
        ("link", "rate_limited", 1),
        ("link", "client_concurrency", 1),
        ("link", "group_concurrency", 1),
        ("health", "cached", 1),
        ("shadow", "ok", 1),
        ("shadow", "client_error", 1),
        ("shadow", "server_error", 2),
        ("shadow", "would_rate_limited", 1),
        ("shadow", "would_client_concurrency", 1),
        ("shadow", "would_group_concurrency", 1),
    ];
    for (g, o, n) in expect {
        assert_eq!(
            seen.get(&(g.to_owned(), o.to_owned())),
            Some(&n),
            "{g}/{o} in {seen:?}"
        );
    }
    // Every other group and outcome is reported, at 0 (a quiet door lists them all).
    for ((g, o), n) in &seen {
        if !expect.iter().any(|(eg, eo, _)| eg == g && eo == o) {
            assert_eq!(*n, 0, "{g}/{o} in {seen:?}");
        }
    }
    assert_eq!(seen.len(), 3 * Outcome::ALL.len(), "{seen:?}");

    let by_group = |name: &str| -> HashMap<String, i128> {
        points(&exporter, name)
            .into_iter()
            .map(|(attrs, v)| {
                assert_eq!(attrs.len(), 1, "{name}: {attrs:?}");
                assert_eq!(attrs[0].0, "door.group");
                (attrs[0].1.clone(), v)
            })
            .collect()
    };
    let inflight = by_group("door.inflight");
    assert_eq!(inflight.get("link"), Some(&0));
    assert_eq!(inflight.get("shadow"), Some(&0));
    let clients = by_group("door.clients");
    assert_eq!(clients.get("link"), Some(&1));
    assert_eq!(clients.get("shadow"), Some(&1));
    let evictions = by_group("door.evictions");
    assert_eq!(evictions.get("link"), Some(&1));
    assert_eq!(
        evictions.get("shadow"),
        Some(&0),
        "a group without evictions is listed at 0"
    );
}

#[test]
fn door_limits_metrics_count_inflight_while_held() {
    let (exporter, provider, metrics) = exported();
    let clock = Arc::new(ManualClock::at(0));
    let (lim, _) = observed("webhook", Budget::webhook(), true, &clock, &metrics);
    let held: Vec<_> = (0..3).map(|i| lim.admit(peer(i)).unwrap()).collect();
    provider.force_flush().unwrap();
    let inflight = points(&exporter, "door.inflight");
    assert_eq!(inflight.len(), 1);
    assert_eq!(inflight[0].1, 3);
    assert_eq!(points(&exporter, "door.clients")[0].1, 3);
    drop(held);
}

/// A reload that rebuilds a group's limiter (a new charge mode) leaves the old limiter's requests
/// in flight on `door.inflight` beside the new one's until they settle, and the series ends at
/// zero once both are done.
#[test]
fn door_limits_inflight_spans_a_rebuilt_limiter() {
    let (exporter, provider, metrics) = exported();
    let clock = Arc::new(ManualClock::at(0));
    let inflight = |exporter: &InMemoryMetricExporter| {
        provider.force_flush().unwrap();
        let p = points(exporter, "door.inflight");
        assert_eq!(p.len(), 1, "{p:?}");
        p[0].1
    };
    let (old, _) = observed("webhook", Budget::webhook(), true, &clock, &metrics);
    // Held as the request path holds them: through a reference to the shards, which outlives the
    // limiter.
    let held: Vec<_> = (0..2)
        .map(|i| Permit::admit(Arc::clone(old.shards()), peer(i)).unwrap())
        .collect();
    drop(old);
    let (new, _) = observed("webhook", Budget::link(), true, &clock, &metrics);
    let fresh = new.admit(peer(9)).unwrap();
    assert_eq!(inflight(&exporter), 3);
    drop(held);
    assert_eq!(inflight(&exporter), 1);
    drop(fresh);
    assert_eq!(inflight(&exporter), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn door_limits_caps_hold_under_concurrency() {
    const PEERS: u32 = 6;
    let budget = Budget {
        rate: 1e6,
        burst: 1_000_000,
        per_client: 3,
        inflight: 8,
        max_clients: 4, // fewer than the peers: the shared row takes part too
        charge: Charge::OnFailure,
    };
    let lim = Arc::new(GroupLimiter::new(
        "webhook",
        budget,
        true,
        Arc::new(ManualClock::at(0)),
        Arc::new(Unobserved),
    ));
    let group_now = Arc::new(AtomicU32::new(0));
    let group_max = Arc::new(AtomicU32::new(0));
    let client_now: Arc<Vec<AtomicU32>> = Arc::new((0..PEERS).map(|_| AtomicU32::new(0)).collect());
    let client_max = Arc::new(AtomicU32::new(0));
    let shared_now = Arc::new(AtomicU32::new(0));
    let admitted = Arc::new(AtomicUsize::new(0));
    let rejected = Arc::new(AtomicUsize::new(0));

    let mut tasks = Vec::new();
    for t in 0..64u32 {
        let (lim, group_now, group_max, client_now, client_max, shared_now, admitted, rejected) = (
            lim.clone(),
            group_now.clone(),
            group_max.clone(),
            client_now.clone(),
            client_max.clone(),
            shared_now.clone(),
            admitted.clone(),
            rejected.clone(),
        );
        tasks.push(tokio::spawn(async move {
            for j in 0..200u32 {
                let i = (t + j) % PEERS;
                let Ok(permit) = lim.admit(peer(i)) else {
                    rejected.fetch_add(1, Ordering::Relaxed);
                    tokio::task::yield_now().await;
                    continue;
                };
                admitted.fetch_add(1, Ordering::Relaxed);
                // Per row: a client's own entry, or the shared row.
                let row = if permit.scope() == Scope::Shared {
                    &*shared_now
                } else {
                    &client_now[i as usize]
                };
                let g = group_now.fetch_add(1, Ordering::SeqCst) + 1;
                group_max.fetch_max(g, Ordering::SeqCst);
                let c = row.fetch_add(1, Ordering::SeqCst) + 1;
                client_max.fetch_max(c, Ordering::SeqCst);
                tokio::task::yield_now().await;
                row.fetch_sub(1, Ordering::SeqCst);
                group_now.fetch_sub(1, Ordering::SeqCst);
                permit.answered(if j % 3 == 0 {
                    StatusCode::BAD_REQUEST
                } else {
                    StatusCode::OK
                });
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert!(group_max.load(Ordering::SeqCst) <= budget.inflight);
    assert!(client_max.load(Ordering::SeqCst) <= budget.per_client);
    assert!(admitted.load(Ordering::SeqCst) > 0);
    assert_eq!(
        admitted.load(Ordering::SeqCst) + rejected.load(Ordering::SeqCst),
        64 * 200
    );
    assert_eq!(lim.inflight(), 0);
    assert!(lim.tracked_clients() <= budget.max_clients);
}

/// What [`hammer`] saw: the most requests its threads held at once, how many were admitted and
/// how many refused for the group cap, and what fresh clients got after them.
struct Hammered {
    /// Then, one new client after another: how many were admitted until one was refused (or the
    /// cap's worth), and why the next was refused.
    after: (usize, Option<RejectReason>),
    group_max: u32,
    admitted: usize,
    capped: usize,
    /// Admitted on the shared row.
    on_shared: usize,
}

/// 8 OS threads admitting and settling at once across 4,096 keys on a fresh limiter of `budget`
/// (16 shards at the default table size, one below 2,048 entries), 20,000 admissions each; a
/// thread holds up to `max_held` requests and then settles its `settle` oldest, and settles every
/// 5th round too when `max_held` is 2. Checks that nothing is in flight at the end and the table
/// stays within its size; then admits fresh clients one after another, for
/// [`assert_cap_held`].
fn hammer(budget: Budget, max_held: usize, settle: usize) -> Hammered {
    const PEERS: u32 = 4096;
    const THREADS: u32 = 8;
    let lim = Arc::new(GroupLimiter::new(
        "webhook",
        budget,
        true,
        Arc::new(ManualClock::at(0)),
        Arc::new(Unobserved),
    ));
    let group_now = AtomicU32::new(0);
    let group_max = AtomicU32::new(0);
    let admitted = AtomicUsize::new(0);
    let capped = AtomicUsize::new(0);
    let on_shared = AtomicUsize::new(0);
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let (lim, group_now, group_max, admitted, capped, on_shared) =
                (&lim, &group_now, &group_max, &admitted, &capped, &on_shared);
            s.spawn(move || {
                let mut held = Vec::new();
                for j in 0..20_000u32 {
                    let key = peer((t * 7919 + j * 31) % PEERS);
                    match lim.admit(key) {
                        Ok(p) => {
                            admitted.fetch_add(1, Ordering::Relaxed);
                            if p.scope() == Scope::Shared {
                                on_shared.fetch_add(1, Ordering::Relaxed);
                            }
                            let g = group_now.fetch_add(1, Ordering::SeqCst) + 1;
                            group_max.fetch_max(g, Ordering::SeqCst);
                            held.push(p);
                        }
                        Err(r) => {
                            if r.reason == RejectReason::GroupConcurrency {
                                capped.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                    }
                    // Settle the oldest first.
                    if held.len() >= max_held || (max_held == 2 && j % 5 == 0) {
                        let n = settle.min(held.len());
                        for p in held.drain(..n) {
                            group_now.fetch_sub(1, Ordering::SeqCst);
                            p.answered(StatusCode::OK);
                        }
                    }
                }
                for p in held {
                    group_now.fetch_sub(1, Ordering::SeqCst);
                    p.answered(StatusCode::OK);
                }
            });
        }
    });
    assert_eq!(lim.inflight(), 0);
    assert!(lim.tracked_clients() <= budget.max_clients);
    // No slot was lost on the way: the whole cap admits, one new client after another, and no
    // more.
    let all: Vec<_> = (0..budget.inflight)
        .map_while(|i| lim.admit(peer(PEERS + i)).ok())
        .collect();
    let then = lim
        .admit(peer(PEERS + budget.inflight))
        .err()
        .map(|r| r.reason);
    let after = (all.len(), then);
    drop(all);
    Hammered {
        after,
        group_max: group_max.load(Ordering::SeqCst),
        admitted: admitted.load(Ordering::Relaxed),
        capped: capped.load(Ordering::Relaxed),
        on_shared: on_shared.load(Ordering::Relaxed),
    }
}

/// A webhook-like budget that never runs out of tokens: `per_client`, a cap of `inflight`, a
/// table of `max_clients`.
fn roomy(per_client: u32, inflight: u32, max_clients: usize) -> Budget {
    Budget {
        rate: 1e6,
        burst: 1_000_000,
        per_client,
        inflight,
        max_clients,
        charge: Charge::OnFailure,
    }
}

/// What every [`hammer`] run must show: the cap never passed, reached (and held) at least once,
/// and afterwards the whole cap admitting fresh clients one after another, and no more.
fn assert_cap_held(h: &Hammered, cap: u32) {
    assert!(h.group_max <= cap, "group cap exceeded: {}", h.group_max);
    assert!(h.capped > 0, "the cap was reached and held");
    let all = usize::try_from(cap).unwrap_or(usize::MAX);
    assert_eq!(
        h.after,
        (all, Some(RejectReason::GroupConcurrency)),
        "every slot came back"
    );
}

/// The sharded table under contention: 16 shards (the default table), OS threads admitting and
/// settling at once across many keys, and the group cap never exceeded, every slot returned.
/// A cap of 6 over 17 shards leases one slot at a time; each thread holds up to two requests.
#[test]
fn door_limits_group_cap_holds_across_shards_under_contention() {
    let h = hammer(roomy(2, 6, DEFAULT_MAX_CLIENTS), 2, 2);
    assert_cap_held(&h, 6);
    assert!(h.admitted > 10_000);
}

/// The same under a cap large enough that the shards lease slots in batches (2,048 over 17
/// shards: 15 at a time): each thread holds 256 to 512 requests, so that the cap is reached
/// again and again while idle leased slots sit on other shards.
#[test]
fn door_limits_group_cap_holds_when_shards_lease_slots_in_batches() {
    let h = hammer(roomy(4, 2_048, DEFAULT_MAX_CLIENTS), 512, 256);
    assert_cap_held(&h, 2_048);
}

/// The same with a table of 320 entries for the 4,096 clients, as many as the cap (so that the
/// closing check's 320 fresh clients fit): with up to 320 requests in flight its entries are
/// often all busy, so that many requests are decided on the shared row, each taking its slot
/// along to the shared row's shard (a cap of 320 over 2 shards leases 20 at a time). A table of
/// 1,024 entries let a run go by without one request there.
#[test]
fn door_limits_group_cap_holds_when_slots_move_to_the_shared_row() {
    let h = hammer(roomy(4, 320, 320), 128, 64);
    assert_cap_held(&h, 320);
    assert!(h.on_shared > 0, "the shared row admitted");
}

#[test]
fn budget_defaults_match_the_design_table() {
    // rate, burst, per client, in the group, clients, charge.
    let row = |b: Budget| {
        (
            b.rate,
            b.burst,
            b.per_client,
            b.inflight,
            b.max_clients,
            b.charge,
        )
    };
    let (w, l, h) = (Budget::webhook(), Budget::link(), Budget::health());
    assert_eq!(row(w), (50.0, 500, 16, 64, 16_384, Charge::OnFailure));
    assert_eq!(row(l), (1.0, 20, 2, 4, 16_384, Charge::Always));
    assert_eq!(row(h), (5.0, 20, 4, 32, 16_384, Charge::Always));
    for (name, b) in [("webhook", w), ("link", l), ("health", h)] {
        b.validate(name).unwrap();
        assert_eq!(Budget::default_for(name), Some(b));
    }
    assert_eq!(Budget::default_for("other"), None);
}

#[test]
fn budget_validate_names_key_and_value() {
    let link = Budget::link();
    let cases: [(Budget, &str); 10] = [
        (Budget { rate: -1.0, ..link }, "group.link.rate = -1"),
        (Budget { rate: 0.0, ..link }, "group.link.rate = 0"),
        (
            Budget {
                rate: f64::NAN,
                ..link
            },
            "group.link.rate = NaN",
        ),
        (
            Budget {
                rate: f64::INFINITY,
                ..link
            },
            "group.link.rate = inf",
        ),
        (
            Budget { rate: 1e-9, ..link },
            "group.link.rate = 0.000000001",
        ),
        (Budget { burst: 0, ..link }, "group.link.burst = 0"),
        (
            Budget {
                per_client: 0,
                ..link
            },
            "group.link.per_client = 0",
        ),
        (
            Budget {
                inflight: 0,
                ..link
            },
            "group.link.inflight = 0",
        ),
        (
            Budget {
                max_clients: 0,
                ..link
            },
            "group.link.max_clients = 0",
        ),
        (
            Budget {
                per_client: 5,
                ..link
            },
            "group.link.per_client = 5",
        ),
    ];
    for (budget, prefix) in cases {
        let err = budget.validate("link").unwrap_err().to_string();
        assert!(
            err.starts_with(prefix),
            "{err:?} should start with {prefix:?}"
        );
    }
    let err = Budget {
        per_client: 30,
        inflight: 64,
        burst: 20,
        ..Budget::webhook()
    }
    .validate("webhook")
    .unwrap_err();
    assert_eq!(err.key, "group.webhook.per_client");
    assert!(err.reason.contains("burst"));
    assert_eq!("on_failure".parse::<Charge>(), Ok(Charge::OnFailure));
    assert_eq!("always".parse::<Charge>(), Ok(Charge::Always));
    assert!("sometimes".parse::<Charge>().is_err());
}
