//! The program's clock: the kernel's `CLOCK_MONOTONIC_COARSE` in nanoseconds, the clock
//! `bpf_ktime_get_coarse_ns` reads and the daemon writes the blocklist's deadlines in
//! (docs/decisions.md, "XDP: the coarse clock"), asked of the kernel once per timer tick per CPU
//! (docs/decisions.md, "XDP: the coarse clock asked once per tick per CPU").
//!
//! The coarse clock only moves when the timekeeper advances it, on a timer tick, right after the
//! tick has advanced `jiffies` (kernel/time/tick-sched.c, `tick_do_update_jiffies64`, then
//! `update_wall_time`). So while `jiffies` stands still, the helper would return the value it
//! returned at the tick. Each CPU keeps its last reading beside the `jiffies` it was taken at
//! ([`DOOR_CLOCK`]), and [`now_ns`] reads `jiffies` (one load: the verifier inlines
//! `bpf_jiffies64`) and calls the helper only when `jiffies` moved. Under a kernel with return-
//! thunk mitigations (AMD's SRSO "safe RET") a helper's return costs a mispredicted branch: the
//! call measured 15 ns of a 73 ns SYN.
//!
//! What a reading may differ by: a CPU that reads the new `jiffies` before the timekeeper has
//! advanced the clock gets the old value from the helper; it then keeps its old reading's
//! `jiffies`, and asks again on its next packet. When the timekeeper advances the clock between
//! ticks (an NTP frequency change, `adjtimex(2)`), the cached reading lags the helper's by less
//! than one tick until the next tick. Readings never go backwards on a CPU.

use core::mem::offset_of;

use aya_ebpf::{macros::map, maps::PerCpuArray};

use crate::access::{MapValue, coarse_ns, jiffies};

/// One CPU's last reading of the coarse clock.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct TickClock {
    /// `jiffies` when [`TickClock::ns`] was read; 0 before the first reading.
    jiffies: u64,
    /// `bpf_ktime_get_coarse_ns()` at that tick, nanoseconds; 0 before the first reading.
    ns: u64,
}

const _: () = assert!(size_of::<TickClock>() == 16);

/// Each CPU's last reading of the coarse clock (one entry).
#[map(name = "DOOR_CLOCK")]
static DOOR_CLOCK: PerCpuArray<TickClock> = PerCpuArray::with_max_entries(1, 0);

/// The coarse clock now, nanoseconds (see the module docs): this CPU's reading at the current
/// tick, or the helper's when this CPU has none yet.
#[inline(always)]
pub(crate) fn now_ns() -> u64 {
    let tick = jiffies();
    let Some(last) = MapValue::in_per_cpu_array(&DOOR_CLOCK, 0) else {
        return coarse_ns();
    };
    let ns_at = offset_of!(TickClock, ns);
    let jiffies_at = offset_of!(TickClock, jiffies);
    let cached = last.load(ns_at);
    if last.load(jiffies_at) == tick && cached != 0 {
        return cached;
    }
    let now = coarse_ns();
    // Unchanged: the tick advanced `jiffies` and not yet the clock; ask again next time.
    // Per-CPU, so no other CPU writes these; the time is stored first, then its tick.
    if now != cached {
        last.store(ns_at, now);
        last.store(jiffies_at, tick);
    }
    now
}
