//! The one clock. The limiter, the health cache, the escalator, the warning limiter and the
//! connection timers ask a [`Clock`] (or tokio's timer, which reads the same time); nothing else in
//! door reads the system clock, so a test under `#[tokio::test(start_paused = true)]` moves all of
//! them together with `tokio::time::advance`, and unit tests drive a [`ManualClock`]. No test
//! sleeps for time to pass, with one exception: the cluster tests against a real Redis
//! (`tests/cluster.rs`), whose sync script reads the store's own clock (`TIME`), which no test
//! can move; they pace their requests on tokio's real time, every wait bounded.
//!
//! `clippy.toml` (this crate's) disallows `std::time::Instant::now`, `SystemTime::now` and
//! `tokio::time::Instant::now` everywhere in door-daemon but [`now`]. A running door injects
//! [`production_clock`]: the TSC ([`TscClock`]) where the kernel itself uses it, else
//! [`MonotonicClock`], built on `tokio::time::Instant`, which is also what the tests inject. The one other time source is
//! [`kernel_monotonic_ns`]: the kernel's `CLOCK_MONOTONIC_COARSE`, which the XDP program reads
//! with `bpf_ktime_get_coarse_ns` and in which the blocklist's deadlines are therefore written.

use std::{
    fmt::Debug,
    sync::atomic::{AtomicU64, Ordering},
    time::Duration,
};

/// A monotonic source of time in nanoseconds since an arbitrary, fixed origin.
pub trait Clock: Send + Sync + Debug + 'static {
    /// Nanoseconds since this clock's origin; never decreases.
    fn now_ns(&self) -> u64;
}

/// A clock on `tokio::time::Instant` (`CLOCK_MONOTONIC` on Linux, or tokio's paused test clock
/// when the runtime is paused) measured from the moment the clock was created: what the tests
/// inject, and a running door where the kernel does not use the TSC ([`production_clock`]).
#[derive(Debug, Clone, Copy)]
pub struct MonotonicClock {
    origin: tokio::time::Instant,
}

impl MonotonicClock {
    /// A clock whose origin is now.
    pub fn new() -> Self {
        Self { origin: now() }
    }
}

impl Default for MonotonicClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for MonotonicClock {
    fn now_ns(&self) -> u64 {
        // Saturates after 584 years of uptime.
        u64::try_from(self.origin.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }
}

/// The production clock of the limiters and the other [`Clock`] users in a running door: the
/// CPU's time-stamp counter, read with `rdtsc` through the `quanta` crate and scaled to
/// nanoseconds since the clock was created (`quanta` calibrates the counter against
/// `CLOCK_MONOTONIC` once per process, in at most 200 ms). A read costs a few nanoseconds against
/// about 25 for `clock_gettime` (docs/decisions.md, "The limiter's clock: the TSC"). Where the
/// CPU has no invariant TSC, `quanta` reads `CLOCK_MONOTONIC` instead. Monotonic on the terms
/// `CLOCK_MONOTONIC` itself is when the kernel's clock source is the TSC (its vDSO reads the same
/// counter): Linux uses the TSC as its clock source only after checking that the CPUs' counters
/// are synchronized, which is why [`production_clock`] picks this clock only then. Not moved by
/// tokio's paused test clock: tests use [`MonotonicClock`] or [`ManualClock`].
#[derive(Debug, Clone)]
pub struct TscClock {
    clock: quanta::Clock,
    origin: u64,
}

impl TscClock {
    /// A clock whose origin is now (calibrating the counter first if this process has not yet).
    pub fn new() -> Self {
        let clock = quanta::Clock::new();
        let origin = clock.raw();
        Self { clock, origin }
    }
}

impl Default for TscClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for TscClock {
    fn now_ns(&self) -> u64 {
        self.clock.delta_as_nanos(self.origin, self.clock.raw())
    }
}

/// The file naming the kernel's current clock source (Documentation/timers/timekeeping.rst).
const CLOCKSOURCE: &str = "/sys/devices/system/clocksource/clocksource0/current_clocksource";

/// The clock a running door injects everywhere: a [`TscClock`] when the kernel's own clock
/// source is the TSC (read from sysfs), else a [`MonotonicClock`]. Read once, at start-up.
pub fn production_clock() -> std::sync::Arc<dyn Clock> {
    let tsc = std::fs::read_to_string(CLOCKSOURCE).is_ok_and(|s| s.trim() == "tsc");
    if tsc {
        std::sync::Arc::new(TscClock::new())
    } else {
        std::sync::Arc::new(MonotonicClock::new())
    }
}

/// The instant door measures wall-clock-free intervals from (warning limits, connection idle
/// deadlines): `tokio::time::Instant::now()`, so that paused-time tests move it too.
#[expect(
    clippy::disallowed_methods,
    reason = "the one place door reads tokio's clock; everything else calls this"
)]
pub fn now() -> tokio::time::Instant {
    tokio::time::Instant::now()
}

/// The kernel's `CLOCK_MONOTONIC_COARSE` in nanoseconds (`CLOCK_MONOTONIC` as of the last timer
/// tick): the clock the XDP program reads with `bpf_ktime_get_coarse_ns` (kernel/bpf/helpers.c
/// returns `ktime_get_coarse_ns`, the value this clock id reads), so deadlines written into BPF
/// maps (the blocklist) and the times read from them (a prefix's last SYN) are on the program's
/// own clock. Not paused by tokio's test clock.
pub fn kernel_monotonic_ns() -> u64 {
    timespec_ns(rustix::time::clock_gettime(
        rustix::time::ClockId::MonotonicCoarse,
    ))
}

/// A `timespec` in nanoseconds (0 for a negative one, saturating).
fn timespec_ns(t: rustix::time::Timespec) -> u64 {
    u64::try_from(t.tv_sec)
        .unwrap_or(0)
        .saturating_mul(1_000_000_000)
        .saturating_add(u64::try_from(t.tv_nsec).unwrap_or(0))
}

/// The step of [`kernel_monotonic_ns`] and of the XDP program's clock, in nanoseconds: the
/// resolution `clock_getres(CLOCK_MONOTONIC_COARSE)` reports (one timer tick, 4 ms at
/// `CONFIG_HZ=250`). The shield adds it to its buckets' tolerances, so that a bucket's rate
/// holds although its clock stands still for a tick at a time. 0 if the kernel does not say.
pub fn kernel_coarse_step_ns() -> u64 {
    timespec_ns(rustix::time::clock_getres(
        rustix::time::ClockId::MonotonicCoarse,
    ))
}

/// A clock that only moves when told to: for tests and benchmarks.
#[derive(Debug, Default)]
pub struct ManualClock {
    ns: AtomicU64,
}

impl ManualClock {
    /// A clock at `start_ns` nanoseconds.
    pub fn at(start_ns: u64) -> Self {
        Self {
            ns: AtomicU64::new(start_ns),
        }
    }

    /// Moves the clock forward by `by` (saturating).
    pub fn advance(&self, by: Duration) {
        let by = u64::try_from(by.as_nanos()).unwrap_or(u64::MAX);
        // fetch_update never fails with a closure that always returns Some.
        let _ = self
            .ns
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |ns| {
                Some(ns.saturating_add(by))
            });
    }
}

impl Clock for ManualClock {
    fn now_ns(&self) -> u64 {
        self.ns.load(Ordering::SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manual_clock_moves_only_when_advanced() {
        let clock = ManualClock::at(5);
        assert_eq!(clock.now_ns(), 5);
        clock.advance(Duration::from_millis(2));
        assert_eq!(clock.now_ns(), 2_000_005);
    }

    #[test]
    fn monotonic_clock_never_goes_back() {
        let clock = MonotonicClock::new();
        let a = clock.now_ns();
        assert!(clock.now_ns() >= a);
    }

    #[test]
    fn tsc_clock_never_goes_back_and_agrees_with_the_kernel() {
        let clock = TscClock::new();
        let kernel = kernel_monotonic_ns();
        let origin = clock.now_ns();
        let mut last = origin;
        let mut kernel_elapsed = 0;
        // Spin (bounded in reads) until the kernel's clock has moved 100 ms: both clocks
        // measure the same interval.
        for _ in 0..500_000_000_u64 {
            let now = clock.now_ns();
            assert!(
                now >= last,
                "the TSC clock went back from {last} to {now} ns"
            );
            last = now;
            kernel_elapsed = kernel_monotonic_ns().saturating_sub(kernel);
            if kernel_elapsed >= 100_000_000 {
                break;
            }
        }
        let tsc_elapsed = last - origin;
        // The coarse clock is up to one tick (4 ms at CONFIG_HZ=250, 10 ms at 100) off at each
        // end; an unscaled counter (cycles, not ns) would be off by a factor of the CPU's GHz.
        assert!(
            tsc_elapsed.abs_diff(kernel_elapsed) <= 25_000_000,
            "TSC {tsc_elapsed} ns against the kernel's {kernel_elapsed} ns"
        );
    }

    #[test]
    fn the_coarse_clock_steps_by_one_tick() {
        // One tick: 1 ms (HZ=1000) to 10 ms (HZ=100).
        let step = kernel_coarse_step_ns();
        assert!(
            (1_000_000..=10_000_000).contains(&step),
            "CLOCK_MONOTONIC_COARSE resolution {step} ns"
        );
    }

    #[test]
    fn the_production_clock_reads_forward() {
        let clock = production_clock();
        let a = clock.now_ns();
        assert!(clock.now_ns() >= a);
    }

    /// [`MonotonicClock`], which the tests of the daemon's paths inject, moves with tokio's
    /// paused time.
    #[tokio::test(start_paused = true)]
    async fn the_monotonic_clock_follows_paused_tokio_time() {
        let clock = MonotonicClock::new();
        let a = clock.now_ns();
        tokio::time::advance(Duration::from_secs(3)).await;
        assert_eq!(clock.now_ns() - a, 3_000_000_000);
    }
}
