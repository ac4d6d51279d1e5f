//! The program's clock: the kernel's `CLOCK_MONOTONIC_COARSE` in nanoseconds, the clock
//! `bpf_ktime_get_coarse_ns` reads and the daemon writes the blocklist's deadlines in
//! (docs/decisions.md, "XDP: the coarse clock"), asked of the kernel about once per timer tick
//! per CPU (docs/decisions.md, "XDP: the coarse clock asked once per tick per CPU").
//!
//! Each CPU keeps a reading and the `jiffies` it was taken at ([`DOOR_CLOCK`]); [`now_ns`] reads
//! `jiffies` (one load: the verifier inlines `bpf_jiffies64`) and serves the kept reading while
//! it is settled for that tick, asking the kernel otherwise. Which readings settle, and the
//! bounds that keeps the served time within, are [`door_common::tick_clock`]'s. Under a kernel
//! that mitigates SRSO with "safe RET" every return from a helper is a mispredicted branch: the
//! helper call took 15 ns of a 73 ns SYN.

use core::{cell::Cell, mem::offset_of};

use aya_ebpf::{macros::map, maps::PerCpuArray};
use door_common::tick_clock::{Kept, TickClock};

use crate::access::{MapValue, coarse_ns, jiffies};

/// Each CPU's kept reading of the coarse clock (one entry, [`door_common::MAP_CLOCK`]).
#[map(name = "DOOR_CLOCK")]
static DOOR_CLOCK: PerCpuArray<TickClock> = PerCpuArray::with_max_entries(1, 0);

/// The coarse clock now, nanoseconds: this CPU's kept reading while it is settled for the
/// current tick, the kernel's otherwise (see the module docs).
#[inline(always)]
pub(crate) fn now_ns() -> u64 {
    let tick = jiffies();
    let Some(last) = MapValue::in_per_cpu_array(&DOOR_CLOCK, 0) else {
        return coarse_ns();
    };
    let tick_at = offset_of!(TickClock, tick);
    let ns_at = offset_of!(TickClock, ns);
    let kept = TickClock {
        tick: last.load(tick_at),
        ns: last.load(ns_at),
    };
    match kept.at(tick) {
        Kept::Serve(ns) => return ns,
        Kept::Count { ns, tick } => {
            last.store(tick_at, tick);
            return ns;
        }
        Kept::Ask => {}
    }
    let (now, keep) = kept.after(tick, coarse_ns());
    if let Some(next) = keep {
        // Per-CPU: only a program interrupting this one on the same CPU sees the two stores
        // apart. The reading first, then its tick: it may see this fresh reading under the
        // tick kept before, and serve it (as fresh as its own would be) or ask the kernel.
        last.store(ns_at, next.ns);
        last.store(tick_at, next.tick);
    }
    now
}

/// The coarse clock read at most once per packet: the first [`Reading::ns`] asks [`now_ns`], every
/// later one on the same packet gets that reading. A SYN judged and then weighed for cookie mode
/// reads the clock once for both.
pub(crate) struct Reading(Cell<Option<u64>>);

impl Reading {
    /// A reading not yet taken.
    #[inline(always)]
    pub(crate) const fn new() -> Self {
        Self(Cell::new(None))
    }

    /// The coarse clock, nanoseconds: read now if this packet has not read it yet.
    #[inline(always)]
    pub(crate) fn ns(&self) -> u64 {
        if let Some(ns) = self.0.get() {
            return ns;
        }
        let ns = now_ns();
        self.0.set(Some(ns));
        ns
    }
}
