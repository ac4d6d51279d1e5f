//! The program's rare events, logged through aya-log (its ring buffer `AYA_LOGS`; the daemon
//! forwards each record to its own log): a CPU entering or leaving cookie mode, the churn guard
//! closing, the per-prefix map refusing an entry. Never per packet: cookie mode's transitions are
//! edges already; the guard's closing is logged on the edge from open to closed (state in
//! [`DOOR_EVENTS`]), at most once every 10 seconds with the closings not logged since (under a
//! sustained rotation flood every refilled token reopens the guard, and the next new prefix
//! closes it again), and a full map at most once a second. With the daemon's level below them
//! (`AYA_LOG_LEVEL`, set at load) a record costs one load of that global, only on these paths.
//!
//! Each logging function is its own BPF function (`#[inline(never)]`), so the record's assembly
//! does not add to the frame of the packet path's function.

use core::mem::offset_of;

use aya_ebpf::{macros::map, maps::Array, programs::XdpContext};
use aya_log_ebpf::{info, warn};

use crate::access::{MapValue, cpu};

/// The edges the program logs on, shared by every CPU (one entry). Two CPUs seeing the same edge
/// at once may both log it.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct EventState {
    /// 1 while the churn guard is closed (its new-prefix bucket was empty at the last new
    /// prefix), 0 otherwise.
    guard_closed: u64,
    /// `bpf_ktime_get_coarse_ns` of the last "prefix map full" record, ns.
    map_full_ns: u64,
    /// `bpf_ktime_get_coarse_ns` of the last "churn guard closed" record, ns.
    guard_logged_ns: u64,
    /// Closings of the churn guard since that record, not logged.
    guard_unlogged: u64,
}

const _: () = assert!(size_of::<EventState>() == 32);

/// State of the logged edges (one entry).
#[map(name = "DOOR_EVENTS")]
static DOOR_EVENTS: Array<EventState> = Array::with_max_entries(1, 0);

/// At most one "prefix map full" record per this many nanoseconds (one second).
const MAP_FULL_EVERY_NS: u64 = 1_000_000_000;

/// At most one "churn guard closed" record per this many nanoseconds (ten seconds).
const GUARD_CLOSED_EVERY_NS: u64 = 10_000_000_000;

/// This CPU entered (`true`) or left cookie mode.
#[inline(never)]
pub(crate) fn cookie_mode(ctx: &XdpContext, entered: bool) {
    let cpu = cpu();
    if entered {
        info!(
            ctx,
            "cookie mode entered on CPU {}: SYNs are answered with SYN cookies", cpu
        );
    } else {
        info!(ctx, "cookie mode left on CPU {}", cpu);
    }
}

/// The churn guard had no new-prefix token for a new prefix at `now`: logged when it was open
/// before, at most once every [`GUARD_CLOSED_EVERY_NS`], with the count of closings not logged
/// since the last record.
#[inline(never)]
pub(crate) fn guard_closed(ctx: &XdpContext, now: u64) {
    let Some(state) = MapValue::in_array(&DOOR_EVENTS, 0) else {
        return;
    };
    let at = offset_of!(EventState, guard_closed);
    if state.load(at) != 0 {
        return;
    }
    state.store(at, 1);
    let logged_at = offset_of!(EventState, guard_logged_ns);
    let unlogged_at = offset_of!(EventState, guard_unlogged);
    let last = state.load(logged_at);
    if last != 0 && now.saturating_sub(last) < GUARD_CLOSED_EVERY_NS {
        state.store(unlogged_at, state.load(unlogged_at).saturating_add(1));
        return;
    }
    let unlogged = state.load(unlogged_at);
    state.store(logged_at, now | 1);
    state.store(unlogged_at, 0);
    info!(
        ctx,
        "churn guard closed: new prefixes share the overflow bucket until its new-prefix bucket refills ({} closings not logged since the last record)",
        unlogged
    );
}

/// The churn guard gave a new prefix its token: open again (not logged).
#[inline(always)]
pub(crate) fn guard_open() {
    if let Some(state) = MapValue::in_array(&DOOR_EVENTS, 0) {
        let at = offset_of!(EventState, guard_closed);
        if state.load(at) != 0 {
            state.store(at, 0);
        }
    }
}

/// The per-prefix map refused a new entry (SYNs pass as `pass/map_full`): logged at most once a
/// second.
#[inline(never)]
pub(crate) fn map_full(ctx: &XdpContext, now: u64) {
    let Some(state) = MapValue::in_array(&DOOR_EVENTS, 0) else {
        return;
    };
    let at = offset_of!(EventState, map_full_ns);
    let last = state.load(at);
    if last != 0 && now.saturating_sub(last) < MAP_FULL_EVERY_NS {
        return;
    }
    state.store(at, now | 1);
    warn!(
        ctx,
        "the per-prefix map refused an entry: SYNs from new prefixes pass uncounted (pass/map_full)"
    );
}
