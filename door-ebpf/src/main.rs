//! door's XDP program (../shared/DESIGN.md, "Flood shield").
//!
//! Every packet is parsed down to TCP ([`parse`]) and increments exactly one verdict/reason
//! counter in the per-CPU array [`door_common::MAP_COUNTERS`]. Only a SYN (SYN set, ACK clear) to a
//! protected port can be dropped; everything else passes (fail-open), and so does anything the
//! program cannot parse. A SYN is judged in this order:
//!
//! 1. an address in the exempt LPM trie ([`door_common::MAP_EXEMPT`]) passes;
//! 2. a prefix on the daemon's blocklist ([`door_common::MAP_BLOCKED`]) is dropped until its
//!    deadline, after which its entry is deleted;
//! 3. a prefix with an entry in the LRU map ([`door_common::MAP_PREFIXES`]) takes a token from
//!    its GCRA bucket (`syn_rate`, `syn_burst`) or is dropped;
//! 4. a new prefix gets an entry if the churn guard has a new-prefix token; otherwise it is
//!    charged to the one shared overflow bucket ([`door_common::MAP_GUARD`]), so that an
//!    address-rotation flood cannot make the LRU map evict the prefixes it already tracks.
//!
//! Until the daemon writes [`door_common::MAP_CONFIG`], the program only observes: it counts
//! SYNs per prefix on every port and drops nothing. The exempt trie and the blocklist are only
//! looked up when the configuration's flags say they may have entries.
//!
//! Concurrency: map values shared between CPUs are updated with plain 8-byte loads and stores
//! ([`access::MapValue`]). When `k` CPUs judge SYNs of the same prefix at the same instant, each
//! may read the same TAT and store its own successor: up to `k - 1` extra SYNs are admitted in
//! that instant and up to `k - 1` counts are lost; never fewer admissions than the budget.
//!
//! On a host target (`cargo check --workspace`, clippy) the crate builds as an empty `std` binary
//! so the workspace type-checks it; only the `bpf` target produces the program.
#![cfg_attr(target_arch = "bpf", no_std)]
#![cfg_attr(target_arch = "bpf", no_main)]
#![expect(
    clippy::inline_always,
    reason = "eBPF: helpers are inlined so the verifier checks one function with known bounds"
)]

mod access;
mod parse;

use core::mem::offset_of;

use aya_ebpf::{
    bindings::{BPF_NOEXIST, xdp_action},
    macros::{map, xdp},
    maps::{Array, HashMap, LpmTrie, LruHashMap, PerCpuArray, lpm_trie::Key},
    programs::XdpContext,
};
use door_common::{
    BLOCKED_CAPACITY, COUNTER_COUNT, Counter, EXEMPT_CAPACITY, ExemptKey, GuardState,
    PREFIX_MAP_CAPACITY, PrefixKey, PrefixState, ShieldConfig, Verdict, gcra,
    shield::{CONFIG_ALL_PORTS, CONFIG_HAS_BLOCKLIST, CONFIG_HAS_EXEMPT, CONFIG_WRITTEN},
};

use crate::{
    access::{MapValue, Packet, now_ns},
    parse::{Parsed, TcpSegment, parse},
};

/// Per-prefix SYN state; name and layout shared with the daemon through `door-common`.
#[map(name = "DOOR_PREFIXES")]
static DOOR_PREFIXES: LruHashMap<PrefixKey, PrefixState> =
    LruHashMap::with_max_entries(PREFIX_MAP_CAPACITY, 0);

/// One `u64` per [`Counter`], per CPU.
#[map(name = "DOOR_COUNTERS")]
static DOOR_COUNTERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(COUNTER_COUNT, 0);

/// The daemon's settings (one entry).
#[map(name = "DOOR_CONFIG")]
static DOOR_CONFIG: Array<ShieldConfig> = Array::with_max_entries(1, 0);

/// Exempt addresses (trusted proxies, allowlist).
#[map(name = "DOOR_EXEMPT")]
static DOOR_EXEMPT: LpmTrie<ExemptKey, u32> = LpmTrie::with_max_entries(EXEMPT_CAPACITY, 0);

/// Blocklist: prefix → deadline (ns, `bpf_ktime_get_ns` clock).
#[map(name = "DOOR_BLOCKED")]
static DOOR_BLOCKED: HashMap<PrefixKey, u64> = HashMap::with_max_entries(BLOCKED_CAPACITY, 0);

/// The churn guard (one entry).
#[map(name = "DOOR_GUARD")]
static DOOR_GUARD: Array<GuardState> = Array::with_max_entries(1, 0);

/// The XDP entry point: classify, count, and return the verdict.
#[xdp]
#[expect(
    clippy::needless_pass_by_value,
    reason = "#[xdp] hands the context over by value"
)]
fn door_xdp(ctx: XdpContext) -> u32 {
    let counter = match parse(&Packet::new(&ctx)) {
        Parsed::Tcp(segment) if segment.is_syn() => judge_syn(&segment),
        Parsed::Tcp(_) => Counter::PassNotSyn,
        Parsed::Other(counter) => counter,
    };
    count(counter);
    match counter.verdict() {
        Verdict::Pass => xdp_action::XDP_PASS,
        Verdict::Drop => xdp_action::XDP_DROP,
    }
}

/// The shield's settings as the program uses them.
struct Settings {
    enforce: bool,
    exempt: bool,
    blocklist: bool,
    syn_interval: u64,
    syn_tolerance: u64,
    new_prefix_interval: u64,
    new_prefix_tolerance: u64,
}

/// Reads the settings, or `None` when `port` is not protected. Without a written configuration:
/// observe only (every port, nothing dropped).
#[inline(always)]
fn settings(port: u16) -> Option<Settings> {
    let observe = Settings {
        enforce: false,
        exempt: false,
        blocklist: false,
        syn_interval: 0,
        syn_tolerance: u64::MAX,
        new_prefix_interval: 0,
        new_prefix_tolerance: 0,
    };
    let Some(cfg) = MapValue::from_lookup(DOOR_CONFIG.get_ptr_mut(0)) else {
        return Some(observe);
    };
    let flags = cfg.load(offset_of!(ShieldConfig, flags));
    if flags & CONFIG_WRITTEN == 0 {
        return Some(observe);
    }
    if flags & CONFIG_ALL_PORTS == 0 {
        let word = offset_of!(ShieldConfig, ports) + usize::from(port / 64) * 8;
        if cfg.load(word) & (1 << (port % 64)) == 0 {
            return None;
        }
    }
    Some(Settings {
        enforce: true,
        exempt: flags & CONFIG_HAS_EXEMPT != 0,
        blocklist: flags & CONFIG_HAS_BLOCKLIST != 0,
        syn_interval: cfg.load(offset_of!(ShieldConfig, syn_interval_ns)),
        syn_tolerance: cfg.load(offset_of!(ShieldConfig, syn_tolerance_ns)),
        new_prefix_interval: cfg.load(offset_of!(ShieldConfig, new_prefix_interval_ns)),
        new_prefix_tolerance: cfg.load(offset_of!(ShieldConfig, new_prefix_tolerance_ns)),
    })
}

/// Judges a SYN (see the crate docs for the order).
#[inline(always)]
fn judge_syn(segment: &TcpSegment) -> Counter {
    let Some(settings) = settings(segment.dst_port) else {
        return Counter::PassUnprotectedPort;
    };
    if settings.exempt && DOOR_EXEMPT.get(Key::new(128, segment.addr)).is_some() {
        return Counter::PassExempt;
    }
    let now = now_ns();
    let src = segment.prefix();
    if settings.blocklist
        && let Some(deadline) = MapValue::from_lookup(DOOR_BLOCKED.get_ptr_mut(src))
    {
        if now < deadline.load(0) {
            if let Some(state) = MapValue::from_lookup(DOOR_PREFIXES.get_ptr_mut(src)) {
                bump(&state, offset_of!(PrefixState, drops));
            }
            return Counter::DropBlocked;
        }
        // Expired: forget it. A failed delete only means another CPU deleted it first.
        let _ = DOOR_BLOCKED.remove(src);
    }
    if let Some(state) = MapValue::from_lookup(DOOR_PREFIXES.get_ptr_mut(src)) {
        return charge(
            &state,
            now,
            &settings,
            Counter::PassSyn,
            Counter::DropSynBudget,
        );
    }
    if settings.enforce
        && settings.new_prefix_interval != 0
        && let Some(guard) = MapValue::from_lookup(DOOR_GUARD.get_ptr_mut(0))
    {
        let tat_at = offset_of!(GuardState, new_prefix_tat_ns);
        match gcra::take(
            guard.load(tat_at),
            now,
            settings.new_prefix_interval,
            settings.new_prefix_tolerance,
        ) {
            Some(tat) => guard.store(tat_at, tat),
            None => {
                return match guard.project::<PrefixState>(offset_of!(GuardState, overflow)) {
                    Some(overflow) => charge(
                        &overflow,
                        now,
                        &settings,
                        Counter::PassOverflowSyn,
                        Counter::DropOverflow,
                    ),
                    None => Counter::PassMapFull,
                };
            }
        }
    }
    // A new prefix: its bucket starts full, and this SYN takes its first token.
    let fresh = PrefixState {
        syns: 1,
        drops: 0,
        tat_ns: gcra::take(0, now, settings.syn_interval, settings.syn_tolerance).unwrap_or(now),
        last_ns: now,
    };
    // BPF_NOEXIST: if another CPU created the entry since our lookup, charge that one.
    if DOOR_PREFIXES
        .insert(src, fresh, u64::from(BPF_NOEXIST))
        .is_ok()
    {
        return Counter::PassSyn;
    }
    match MapValue::from_lookup(DOOR_PREFIXES.get_ptr_mut(src)) {
        Some(state) => charge(
            &state,
            now,
            &settings,
            Counter::PassSyn,
            Counter::DropSynBudget,
        ),
        None => Counter::PassMapFull,
    }
}

/// Counts a SYN on `state` and takes a token from its bucket: `pass` when it had one (or when only
/// observing), `drop` otherwise.
#[inline(always)]
fn charge(
    state: &MapValue<PrefixState>,
    now: u64,
    s: &Settings,
    pass: Counter,
    drop: Counter,
) -> Counter {
    bump(state, offset_of!(PrefixState, syns));
    state.store(offset_of!(PrefixState, last_ns), now);
    let tat_at = offset_of!(PrefixState, tat_ns);
    match gcra::take(state.load(tat_at), now, s.syn_interval, s.syn_tolerance) {
        Some(tat) => {
            state.store(tat_at, tat);
            pass
        }
        None if !s.enforce => pass,
        None => {
            bump(state, offset_of!(PrefixState, drops));
            drop
        }
    }
}

/// Adds one to the `u64` at `offset` of a shared map value (see the crate docs on concurrency).
#[inline(always)]
fn bump<T>(value: &MapValue<T>, offset: usize) {
    value.store(offset, value.load(offset) + 1);
}

/// Increments this CPU's slot of `counter` (per-CPU: no other CPU writes it).
#[inline(always)]
fn count(counter: Counter) {
    if let Some(slot) = MapValue::from_lookup(DOOR_COUNTERS.get_ptr_mut(counter.index())) {
        bump(&slot, 0);
    }
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
