//! The XDP program's clock, asked of the kernel once per timer tick per CPU: which reading of the
//! kernel's `CLOCK_MONOTONIC_COARSE` (`bpf_ktime_get_coarse_ns`, a helper call) a CPU may reuse
//! while `jiffies` (`bpf_jiffies64`, one inlined load) stands still.
//!
//! The coarse clock moves when the timekeeper accumulates time, on a timer tick, right *after*
//! the tick has advanced `jiffies` (Linux, kernel/time/tick-sched.c: `tick_do_update_jiffies64`
//! advances `jiffies_64`, then calls `update_wall_time`). For a few microseconds a CPU can see
//! the new `jiffies` with the old time, so the first reading after a tick may be the previous
//! tick's value. A reading is therefore reused for a tick only once it is *settled*, known to be
//! that tick's value:
//!
//! - it differs from a reading taken earlier in the same tick (the timekeeper moved the clock in
//!   between, so the later one is after the update); or
//! - it is at least [`TICK_STEP_MIN_NS`] past a reading taken in the previous tick (a reading
//!   before the update equals that one, give or take the nanoseconds an NTP adjustment can move
//!   the clock between ticks; one after it is a whole tick on).
//!
//! A reading equal to the one kept (the update has not happened yet) keeps what is kept, and the
//! next packet asks again. The first reading after an idle tick or more is kept unsettled, and
//! settles at its tick's next change or at the next tick.
//!
//! Bounds (the property test below checks them against a model of the tick): a value served is
//! never ahead of the kernel's, never behind a reading this CPU made before, and at most one
//! clock update behind the kernel's. It is behind at all only when the timekeeper moves the
//! clock between ticks (a clock step, a change of clock source: the kept reading lags the new
//! value until the next tick), or when an unsettled reading was the previous tick's value and
//! the next tick's first reading fell before its update too (two readings, at consecutive
//! ticks, each within microseconds of a tick), which settles the previous tick's value for one
//! tick.

/// Set in [`TickClock::tick`] once [`TickClock::ns`] is known to be the clock's value at that
/// tick (see the module docs).
pub const SETTLED: u64 = 1 << 63;

/// The least step, in nanoseconds, by which a reading at the tick after a kept reading's must
/// exceed it to be taken as the new tick's value: half the shortest timer tick Linux offers
/// (1 ms, `CONFIG_HZ=1000`; 4 ms at 250, 10 ms at 100). A reading before the tick's update
/// differs from the previous tick's value by nothing or by an NTP adjustment's nanoseconds.
pub const TICK_STEP_MIN_NS: u64 = 500_000;

/// One CPU's kept reading of the coarse clock: the value of the per-CPU array the XDP program
/// keeps it in (`DOOR_CLOCK`, [`crate::MAP_CLOCK`], entry 0). All zero before the first reading.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TickClock {
    /// The `jiffies` value the reading was taken at, with [`SETTLED`] set once it is known to be
    /// the clock's value at that tick; 0 before the first reading.
    pub tick: u64,
    /// The reading: `CLOCK_MONOTONIC_COARSE`, nanoseconds.
    pub ns: u64,
}

const _: () = assert!(size_of::<TickClock>() == 16);
const _: () = assert!(align_of::<TickClock>() == 8);

impl TickClock {
    /// The clock at `tick` (a `jiffies` value) without asking the kernel: the kept reading when
    /// it is settled for `tick`, `None` otherwise.
    #[inline]
    #[must_use]
    pub const fn at(&self, tick: u64) -> Option<u64> {
        if self.tick == tick | SETTLED {
            Some(self.ns)
        } else {
            None
        }
    }

    /// What to keep after the kernel read `now` (ns) at `tick` (the `jiffies` value read before
    /// asking it), by the rules of the module docs; `None` to keep what is kept.
    #[inline]
    #[must_use]
    pub const fn after(&self, tick: u64, now: u64) -> Option<Self> {
        let seen = self.tick & !SETTLED;
        let settled = Self {
            tick: tick | SETTLED,
            ns: now,
        };
        if self.tick != 0 && seen == tick {
            // Unsettled at this tick: a different value is after the tick's update.
            return if now == self.ns { None } else { Some(settled) };
        }
        if self.tick != 0 && seen.wrapping_add(1) == tick {
            // From the previous tick: equal (or nearly) is the previous tick's value still.
            return if now >= self.ns.saturating_add(TICK_STEP_MIN_NS) {
                Some(settled)
            } else {
                None
            };
        }
        Some(Self { tick, ns: now })
    }
}

#[cfg(test)]
mod tests;
