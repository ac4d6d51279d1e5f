//! door's XDP program (../shared/DESIGN.md, "Flood shield").
//!
//! Every packet is parsed down to TCP ([`parse`]); a SYN (SYN set, ACK clear) is counted against
//! its source prefix (IPv4 /32, IPv6 /64, NAT64 as its IPv4) in the LRU hash map
//! [`door_common::MAP_PREFIXES`], and every packet increments exactly one verdict/reason counter in
//! the per-CPU array [`door_common::MAP_COUNTERS`]. Every packet is passed (`XDP_PASS`): this
//! version observes, it does not shed yet.
//!
//! On a host target (`cargo check --workspace`, clippy) the crate builds as an empty `std` binary
//! so the workspace type-checks it; only the `bpf` target produces the program.
#![cfg_attr(target_arch = "bpf", no_std)]
#![cfg_attr(target_arch = "bpf", no_main)]

mod access;
mod parse;

use core::mem::offset_of;

use aya_ebpf::{
    bindings::{BPF_NOEXIST, xdp_action},
    macros::{map, xdp},
    maps::{LruHashMap, PerCpuArray},
    programs::XdpContext,
};
use door_common::{COUNTER_COUNT, Counter, PREFIX_MAP_CAPACITY, PrefixKey, PrefixState, Verdict};

use crate::{
    access::{MapValue, Packet, now_ns},
    parse::{Parsed, parse},
};

/// Per-prefix SYN state; name and layout shared with the daemon through `door-common`.
#[map(name = "DOOR_PREFIXES")]
static DOOR_PREFIXES: LruHashMap<PrefixKey, PrefixState> =
    LruHashMap::with_max_entries(PREFIX_MAP_CAPACITY, 0);

/// One `u64` per [`Counter`], per CPU.
#[map(name = "DOOR_COUNTERS")]
static DOOR_COUNTERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(COUNTER_COUNT, 0);

/// The XDP entry point: classify, count, and return the verdict.
#[xdp]
fn door_xdp(ctx: XdpContext) -> u32 {
    let counter = match parse(&Packet::new(&ctx)) {
        Parsed::Tcp(segment) if segment.is_syn() => record_syn(&segment.src),
        Parsed::Tcp(_) => Counter::PassNotSyn,
        Parsed::Other(counter) => counter,
    };
    count(counter);
    match counter.verdict() {
        Verdict::Pass => xdp_action::XDP_PASS,
        Verdict::Drop => xdp_action::XDP_DROP,
    }
}

/// Counts a SYN against `src`, creating its entry on first sight.
///
/// Several CPUs may update the same entry at once. The count is a load and a store
/// ([`MapValue`]): when `k` CPUs count a SYN from the same
/// prefix in the same instant, up to `k - 1` of those SYNs can go uncounted (never over-counted).
/// `last_ns` may keep either CPU's timestamp (they differ by nanoseconds).
#[inline(always)]
fn record_syn(src: &PrefixKey) -> Counter {
    let now = now_ns();
    if bump(src, now) {
        return Counter::PassSyn;
    }
    let fresh = PrefixState {
        syns: 1,
        drops: 0,
        first_ns: now,
        last_ns: now,
    };
    // BPF_NOEXIST: if another CPU created the entry since our lookup, count on that one.
    if DOOR_PREFIXES
        .insert(src, &fresh, u64::from(BPF_NOEXIST))
        .is_ok()
        || bump(src, now)
    {
        Counter::PassSyn
    } else {
        Counter::PassMapFull
    }
}

/// Adds one SYN to `src`'s existing entry; `false` when it has none.
#[inline(always)]
fn bump(src: &PrefixKey, now: u64) -> bool {
    let Some(state) = MapValue::from_lookup(DOOR_PREFIXES.get_ptr_mut(src)) else {
        return false;
    };
    let syns = offset_of!(PrefixState, syns);
    state.store(syns, state.load(syns) + 1);
    state.store(offset_of!(PrefixState, last_ns), now);
    true
}

/// Increments this CPU's slot of `counter` (per-CPU: no other CPU writes it).
#[inline(always)]
fn count(counter: Counter) {
    let Some(slot) = MapValue::from_lookup(DOOR_COUNTERS.get_ptr_mut(counter.index())) else {
        return;
    };
    slot.store(0, slot.load(0) + 1);
}

#[cfg(not(target_arch = "bpf"))]
fn main() {}

#[cfg(target_arch = "bpf")]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    // The verifier rejects programs with reachable loops that never end, so this is only ever
    // linked, never reached: every fallible step above returns a pass counter instead.
    loop {}
}
