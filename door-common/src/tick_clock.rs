//! The XDP program's clock, asked of the kernel about once per timer tick per CPU: which reading
//! of the kernel's `CLOCK_MONOTONIC_COARSE` (`bpf_ktime_get_coarse_ns`, a helper call) a CPU may
//! serve again while `jiffies` (`bpf_jiffies64`, one inlined load) stands still.
//!
//! The coarse clock moves when the timekeeper accumulates time, on a timer tick, right *after*
//! the tick has advanced `jiffies` (Linux, kernel/time/tick-sched.c: `tick_do_update_jiffies64`
//! advances `jiffies_64`, then calls `update_wall_time`). For a few microseconds a CPU can see
//! the new `jiffies` with the old time (the *gap*), so the first reading after a tick may be the
//! previous tick's value. A reading is therefore served for its tick only once it is *settled*:
//!
//! - by a change: it is at least [`TICK_STEP_MIN_NS`] greater than a reading taken earlier in
//!   the same tick (the timekeeper's update came in between). It is served for the rest of the
//!   tick without asking again;
//! - by a step: it is at least [`TICK_STEP_MIN_NS`] past a reading taken in the previous tick (a
//!   reading in the gap equals that one, or exceeds it by what the timekeeper moved the clock
//!   between ticks; one after the update is a whole tick on). Such a reading is served for
//!   [`RECHECK_EVERY`] packets, then the kernel is asked once more: a greater value replaces
//!   it, and either is served for the rest of the tick. The step alone cannot tell a reading
//!   after the update from one in the gap when the kept reading was itself a tick behind; without
//!   the check, a flood (every tick's first reading then falls in the gap) would carry such a
//!   lag from tick to tick.
//!
//! A reading within a step of the previous tick's (before the tick's update, or at a tick the
//! clock skips), the first reading, and the first after an idle tick or more, are kept
//! unsettled: the next packet asks again, and a change within the tick, or a step at the next
//! tick, settles.
//!
//! Bounds (the tests below check them against a model of the tick): a served time never goes
//! back on a CPU, is never ahead of a value the kernel returned, and is at most one clock update
//! behind the kernel's. It is behind only after two consecutive ticks were each read inside
//! their gaps (the first reading after an idle spell, then the next tick's first), and then for
//! at most [`RECHECK_EVERY`] packets after the update; if that tick's gap itself held that many
//! packets (its check fell inside it too), for the rest of the tick, and of every following tick
//! whose gap holds that many. Apart from that it is the kernel's, less what the timekeeper moved
//! the clock since the reading (a clock step, an NTP adjustment) until the next tick.
//!
//! Cost: a CPU asks the kernel at a tick's first reading, at every reading inside its gap, and,
//! when none fell in the gap, once more for the check; at a tick the clock skips, at every
//! reading of that tick. Before Linux's "timekeeping: Fix possible inconsistencies in
//! _COARSE clockids" (2025), an NTP adjustment could move the coarse clock back by a fraction of
//! a tick; a served time then stays where it was, ahead of the kernel's by that fraction, until
//! the clock passes it. On the same CPU, a program preempted between its reading and its stores
//! (`BPF_PROG_TEST_RUN` only disables migration) can overwrite a newer reading another run kept
//! meanwhile, by at most the update between them.

/// Set in [`TickClock::tick`] once [`TickClock::ns`] is served for that tick (see the module
/// docs).
pub const SETTLED: u64 = 1 << 63;

/// The bits of [`TickClock::tick`] that hold the `jiffies` value (48: 8,900 years of ticks at
/// `CONFIG_HZ=1000`).
pub const JIFFIES_MASK: u64 = (1 << 48) - 1;

/// The lowest bit of the countdown in [`TickClock::tick`] (bits 48–62): packets a reading settled
/// by a step is served for before the kernel is asked again; 0 once checked.
const COUNT_ONE: u64 = 1 << 48;

/// Packets a reading settled by a step from the previous tick's is served for before the kernel
/// is asked once more (module docs): under a flood, about 4 µs at 60 ns a packet, longer than
/// the microseconds between a tick's `jiffies` and its clock update.
pub const RECHECK_EVERY: u64 = 64;

/// The countdown field of a reading just settled by a step: [`RECHECK_EVERY`] packets.
const RECHECK: u64 = RECHECK_EVERY * COUNT_ONE;

/// The least step, in nanoseconds, by which a reading at the tick after a kept reading's must
/// exceed it to be settled as the new tick's value: half the shortest timer tick Linux offers
/// (1 ms, `CONFIG_HZ=1000`; 4 ms at 250, 10 ms at 100). A reading before the tick's update equals
/// the previous tick's value, or exceeds it by what the timekeeper moved the clock between ticks.
pub const TICK_STEP_MIN_NS: u64 = 500_000;

/// One CPU's kept reading of the coarse clock: the value of the per-CPU array the XDP program
/// keeps it in (`DOOR_CLOCK`, [`crate::MAP_CLOCK`], entry 0). All zero before the first reading.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TickClock {
    /// The `jiffies` value the reading was taken at ([`JIFFIES_MASK`]), with [`SETTLED`] set
    /// while it is served for that tick, and a countdown of packets before the kernel is asked
    /// again (bits 48–62, [`RECHECK_EVERY`]); 0 before the first reading.
    pub tick: u64,
    /// The reading: `CLOCK_MONOTONIC_COARSE`, nanoseconds.
    pub ns: u64,
}

const _: () = assert!(size_of::<TickClock>() == 16);
const _: () = assert!(align_of::<TickClock>() == 8);

/// What [`TickClock::at`] says to do at a tick.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kept {
    /// Serve this kept reading, nanoseconds.
    Serve(u64),
    /// Serve the kept reading `ns` and store `tick` as the kept tick word (the countdown moved).
    Count {
        /// The reading to serve, nanoseconds.
        ns: u64,
        /// The new [`TickClock::tick`].
        tick: u64,
    },
    /// Ask the kernel, then [`TickClock::after`].
    Ask,
}

impl TickClock {
    /// What to serve at `tick` (a `jiffies` value) without asking the kernel: the kept reading
    /// while it is settled for `tick` ([`Kept::Serve`], [`Kept::Count`]), [`Kept::Ask`]
    /// otherwise and when its countdown is due.
    #[inline]
    #[must_use]
    pub const fn at(&self, tick: u64) -> Kept {
        if self.tick & (SETTLED | JIFFIES_MASK) != (tick & JIFFIES_MASK) | SETTLED {
            return Kept::Ask;
        }
        match self.tick & !(SETTLED | JIFFIES_MASK) {
            0 => Kept::Serve(self.ns),
            COUNT_ONE => Kept::Ask,
            _ => Kept::Count {
                ns: self.ns,
                tick: self.tick - COUNT_ONE,
            },
        }
    }

    /// After the kernel read `now` (ns) at `tick` (the `jiffies` value read before asking it):
    /// the time to serve, nanoseconds (`now`, or the kept reading if the clock went back below
    /// it), and what to keep by the rules of the module docs (`None`: keep what is kept).
    #[inline]
    #[must_use]
    pub const fn after(&self, tick: u64, now: u64) -> (u64, Option<Self>) {
        let serve = if now > self.ns { now } else { self.ns };
        let tick = tick & JIFFIES_MASK;
        let seen = self.tick & JIFFIES_MASK;
        if self.tick == 0 || seen.wrapping_add(1) < tick {
            // The first reading, or the first after an idle tick or more.
            return (serve, Some(Self { tick, ns: serve }));
        }
        if seen == tick {
            // A reading later in the kept one's tick: a value a step greater is after the tick's
            // update, and settled for the rest of the tick; so is the kept one, settled by a
            // step, at its check. An unsettled kept reading stays unsettled, raised to a greater
            // value (the timekeeper nudged the clock).
            let keep =
                if now >= self.ns.saturating_add(TICK_STEP_MIN_NS) || self.tick & SETTLED != 0 {
                    Some(Self {
                        tick: tick | SETTLED,
                        ns: serve,
                    })
                } else if now > self.ns {
                    Some(Self { tick, ns: serve })
                } else {
                    None
                };
            return (serve, keep);
        }
        if seen.wrapping_add(1) == tick {
            // A step on from the previous tick's reading: served, and checked once more. Within
            // a step (before the tick's update, or a tick the clock skips): kept unsettled under
            // this tick, so that a change later in it, or a step at the next, settles.
            let keep = if now >= self.ns.saturating_add(TICK_STEP_MIN_NS) {
                Self {
                    tick: tick | SETTLED | RECHECK,
                    ns: now,
                }
            } else {
                Self { tick, ns: serve }
            };
            return (serve, Some(keep));
        }
        // Older than the kept one (a program that interrupted this one on its CPU kept a newer
        // one): the tick word stays, and a greater value is kept under it, so that the kept
        // reading is always the greatest served, and none served later is less.
        let keep = if now > self.ns {
            Some(Self {
                tick: self.tick,
                ns: now,
            })
        } else {
            None
        };
        (serve, keep)
    }
}

#[cfg(test)]
mod tests;
