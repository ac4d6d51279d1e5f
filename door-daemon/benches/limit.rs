//! admit + settle, ns per operation, against `governor`'s keyed limiter on the same key stream.
//! 16,384 live keys (distinct IPv6 /64s, the default table size), one, two and four threads. door
//! reports to no observer (`Unobserved`) and reads the clock a running door reads (`TscClock`, the
//! TSC through `quanta`, which is also governor's clock): the limiter alone, as governor.
//!
//! After criterion's report, a plain timed loop prints the door/governor ratio at 1, 2 and 4
//! threads, each the median of nine interleaved runs, with the cost of door's synchronisation
//! alone (the *floor*: what an admit + settle pair must do whatever its table, measured in the
//! same rounds, see [`Floor`]) and of an admit + settle through a reference the caller clones
//! for the permit and drops after it, as door's request path holds its group ([`held_op`]);
//! then door's, governor's and the held form's fastest runs, the least disturbed by the
//! machine's other work.

use std::{
    hint::black_box,
    num::NonZeroU32,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use criterion::Criterion;
use door_common::prefix::PrefixKey;
use door_daemon::{
    limit::{Budget, Charge, DEFAULT_MAX_CLIENTS, GroupLimiter, Permit, Shards, ShardsRef},
    limit::{Spend, Unobserved},
    time::{Clock as _, TscClock},
};
use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};

const KEYS: usize = DEFAULT_MAX_CLIENTS;

fn keys() -> Vec<PrefixKey> {
    (0..KEYS as u64)
        .map(|i| {
            let mut octets = [0u8; 16];
            octets[0] = 0x20;
            octets[1] = 0x01;
            // A /64 key keeps octets 0..8: the index goes in octets 2..8.
            octets[2..8].copy_from_slice(&i.to_be_bytes()[2..]);
            octets[15] = 1;
            PrefixKey::from_ipv6(octets)
        })
        .collect()
}

/// A budget that never rejects on this stream: the hot path is lookup, bucket, slot, release.
fn door(charge: Charge) -> Arc<GroupLimiter> {
    let lim = Arc::new(GroupLimiter::new(
        "bench",
        Budget {
            rate: 1e9,
            burst: 1_000_000,
            per_client: 64,
            inflight: 1_000_000,
            max_clients: KEYS,
            charge,
        },
        true,
        Arc::new(TscClock::new()),
        Arc::new(Unobserved),
    ));
    for k in keys() {
        drop(lim.admit(k));
    }
    lim
}

fn governor() -> DefaultKeyedRateLimiter<PrefixKey> {
    let burst = NonZeroU32::new(1_000_000).unwrap_or(NonZeroU32::MIN);
    let lim = RateLimiter::keyed(Quota::per_second(burst));
    for k in keys() {
        let _ = lim.check_key(&k);
    }
    lim
}

/// The synchronisation an admit + settle pair of door's limiter needs, without its table or its
/// arithmetic: one clock read, the shard's mutex taken at admission and again at settlement. 16
/// shards, as a 16,384-entry table has. The group's in-flight slots are counted under the shard's
/// mutex; far from the cap the shard leases them from the group's pool 64 at a time, one atomic add
/// per 64 admissions, which the floor leaves out.
struct Floor {
    clock: TscClock,
    shards: Box<[Arc<Mutex<u64>>]>,
}

impl Floor {
    fn new() -> Self {
        Self {
            clock: TscClock::new(),
            shards: (0..16).map(|_| Arc::new(Mutex::new(0))).collect(),
        }
    }
}

fn floor_op(f: &Floor, k: PrefixKey) {
    let Some(shard) = f.shards.get(usize::from(black_box(k).addr[7] & 15)) else {
        return;
    };
    let now = f.clock.now_ns();
    if let Ok(mut v) = shard.lock() {
        *v = black_box(now);
    }
    if let Ok(mut v) = shard.lock() {
        *v += 1;
    }
}

fn door_op(lim: &Arc<GroupLimiter>, k: PrefixKey) {
    if let Ok(p) = lim.admit(black_box(k)) {
        p.settle(Spend::Nothing);
    }
}

/// What door's request path keeps a limited request's group alive through: one `Arc` per worker
/// thread of a holder of the group's shards (`http::settle::Group`, which also holds the group's
/// instruments, and is aligned as this is), so that two threads never count references on one
/// cache line.
#[repr(align(128))]
struct Holder(Arc<Shards>);

/// A permit's reference to its thread's [`Holder`].
struct Handle(Arc<Holder>);

impl ShardsRef for Handle {
    fn shards(&self) -> &Shards {
        &self.0.0
    }
}

/// The holders the timed threads take theirs from, made one after the other on one thread, as
/// door builds them with its configuration: [`MAX_THREADS`] of them.
static HOLDERS: std::sync::OnceLock<Vec<Arc<Holder>>> = std::sync::OnceLock::new();

/// The most threads a run times.
const MAX_THREADS: usize = 4;

thread_local! {
    /// This thread's number among those that took a holder, made at its first use: the threads
    /// of one run take consecutive numbers, so at most [`MAX_THREADS`] of them never share one.
    static THREAD: usize = {
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    };
}

/// An admit + settle whose permit holds a reference the caller cloned for it, as door's request
/// path does: its thread's holder of the group ([`Holder`]), cloned for the permit and dropped
/// when it settles.
fn held_op(lim: &Arc<GroupLimiter>, k: PrefixKey) {
    let holders = HOLDERS.get_or_init(|| {
        (0..MAX_THREADS)
            .map(|_| Arc::new(Holder(Arc::clone(lim.shards()))))
            .collect()
    });
    let Some(holder) = holders.get(THREAD.with(|t| *t) % MAX_THREADS) else {
        return;
    };
    if let Ok(p) = Permit::admit(Handle(Arc::clone(holder)), black_box(k)) {
        p.settle(Spend::Nothing);
    }
}

fn governor_op(lim: &DefaultKeyedRateLimiter<PrefixKey>, k: PrefixKey) {
    let _ = black_box(lim.check_key(&black_box(k)));
}

/// Runs `op` `iters` times split over `threads` threads on the key stream; wall time.
fn run<L: Sync>(
    lim: &L,
    keys: &[PrefixKey],
    threads: u64,
    iters: u64,
    op: fn(&L, PrefixKey),
) -> Duration {
    let per_thread = iters.div_ceil(threads);
    #[expect(
        clippy::disallowed_methods,
        reason = "a benchmark measures wall time; the limiter under test reads its ManualClock"
    )]
    let start = Instant::now();
    std::thread::scope(|s| {
        for t in 0..threads {
            s.spawn(move || {
                let start = usize::try_from(t).unwrap_or(0) * 7919;
                let n = usize::try_from(per_thread).unwrap_or(usize::MAX);
                for i in (start..).take(n) {
                    if let Some(k) = keys.get(i % keys.len()) {
                        op(lim, *k);
                    }
                }
            });
        }
    });
    start.elapsed()
}

fn bench(c: &mut Criterion) {
    let keys = keys();
    let door_always = door(Charge::Always);
    let door_on_failure = door(Charge::OnFailure);
    let gov = governor();
    for threads in [1u64, 2, 4] {
        let mut g = c.benchmark_group(format!("admit_settle/{threads}_thread"));
        g.measurement_time(Duration::from_secs(3))
            .warm_up_time(Duration::from_secs(1))
            .sample_size(20);
        g.bench_function("door_always", |b| {
            b.iter_custom(|iters| run(&door_always, &keys, threads, iters, door_op));
        });
        g.bench_function("door_on_failure", |b| {
            b.iter_custom(|iters| run(&door_on_failure, &keys, threads, iters, door_op));
        });
        g.bench_function("governor_keyed", |b| {
            b.iter_custom(|iters| run(&gov, &keys, threads, iters, governor_op));
        });
        g.finish();
    }
}

/// Runs per thread count behind each closing ratio line.
const RATIO_RUNS: usize = 9;

/// The fastest of `values`, the least-disturbed run: on a shared machine a run is only ever
/// slowed by what else runs; 0 for none.
fn fastest(values: &[f64]) -> f64 {
    values.iter().copied().min_by(f64::total_cmp).unwrap_or(0.0)
}

/// The median of `values` (the mean of the middle two for an even count); 0 for none.
fn median(values: &[f64]) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    match (v.get(n / 2), n.checked_sub(1).and_then(|m| v.get(m / 2))) {
        (Some(&hi), Some(&lo)) if n.is_multiple_of(2) => f64::midpoint(lo, hi),
        (Some(&mid), _) => mid,
        _ => 0.0,
    }
}

/// The closing lines: door/governor at 1, 2 and 4 threads from [`RATIO_RUNS`] interleaved runs
/// (door then governor, then governor then door, ...), so a busy 2-core machine's load drifts
/// over both alike: the median ns/op of each, and the median of the runs' paired ratios; then the
/// fastest run of each, which a busy machine's load moves least.
fn ratio() {
    const OPS: u64 = 4_000_000;
    let keys = keys();
    let door = door(Charge::Always);
    let gov = governor();
    let floor = Floor::new();
    #[expect(
        clippy::cast_precision_loss,
        reason = "an operation count far below 2^52"
    )]
    let ns = |t: Duration| t.as_secs_f64() * 1e9 / OPS as f64;
    for threads in [1u64, 2, 4] {
        let mut d = Vec::with_capacity(RATIO_RUNS);
        let mut g = Vec::with_capacity(RATIO_RUNS);
        let mut f = Vec::with_capacity(RATIO_RUNS);
        let mut h = Vec::with_capacity(RATIO_RUNS);
        for i in 0..RATIO_RUNS {
            f.push(ns(run(&floor, &keys, threads, OPS, floor_op)));
            h.push(ns(run(&door, &keys, threads, OPS, held_op)));
            if i.is_multiple_of(2) {
                d.push(ns(run(&door, &keys, threads, OPS, door_op)));
                g.push(ns(run(&gov, &keys, threads, OPS, governor_op)));
            } else {
                g.push(ns(run(&gov, &keys, threads, OPS, governor_op)));
                d.push(ns(run(&door, &keys, threads, OPS, door_op)));
            }
        }
        let ratios: Vec<f64> = d.iter().zip(&g).map(|(d, g)| d / g).collect();
        println!(
            "{threads} thread(s), {KEYS} live keys, median of {RATIO_RUNS} interleaved runs: door {:.1} ns/op, governor {:.1} ns/op, door/governor = {:.2}; door's synchronisation alone {:.1} ns/op ({:.2} x governor)",
            median(&d),
            median(&g),
            median(&ratios),
            median(&f),
            median(&f) / median(&g).max(0.1)
        );
        println!(
            "  door holding a reference for the permit, as its request path does: {:.1} ns/op ({:.2} x governor)",
            median(&h),
            median(&h) / median(&g).max(0.1)
        );
        println!(
            "  fastest of the {RATIO_RUNS} runs (the least disturbed): door {:.1} ns/op, governor {:.1} ns/op, door/governor = {:.2}; held as the request path holds it {:.1} ns/op ({:.2} x governor)",
            fastest(&d),
            fastest(&g),
            fastest(&d) / fastest(&g).max(0.1),
            fastest(&h),
            fastest(&h) / fastest(&g).max(0.1)
        );
    }
}

fn main() {
    let mut c = Criterion::default().configure_from_args();
    bench(&mut c);
    c.final_summary();
    ratio();
}
