//! Types shared by door's XDP program (`door-ebpf`) and its daemon (`door-daemon`).
//!
//! Everything here is `#![no_std]` and allocation-free so that the eBPF program can use it: the
//! names of the BPF maps, the `#[repr(C)]` layouts of their keys and values (sizes asserted at
//! compile time, no implicit padding), and the prefix math that both layers key on
//! (docs/design.md, "Client key" and "Flood shield": IPv4 /32, IPv6 /64, NAT64 as its IPv4).
//!
//! With the `user` feature the map types implement `aya::Pod` so the daemon can read and write them.
#![no_std]

pub mod counter;
pub mod gcra;
pub mod list_filter;
pub mod prefix;
pub mod shield;
pub mod tick_clock;

pub use counter::{COUNTER_COUNT, Counter, Verdict};
pub use prefix::PrefixKey;
pub use shield::{CookieState, ExemptKey, GuardState, ShieldConfig};

/// Name of the XDP program inside the eBPF object (the function marked `#[xdp]`).
pub const PROGRAM_NAME: &str = "door_xdp";

/// Name of the LRU hash map from source prefix ([`PrefixKey`]) to its SYN state ([`PrefixState`]).
pub const MAP_PREFIXES: &str = "DOOR_PREFIXES";

/// Name of the per-CPU array of `u64` packet counters, indexed by [`Counter`].
pub const MAP_COUNTERS: &str = "DOOR_COUNTERS";

/// Name of the one-entry array holding the [`ShieldConfig`] the daemon writes.
pub const MAP_CONFIG: &str = "DOOR_CONFIG";

/// Name of the LPM trie of the operator's address lists ([`ExemptKey`] → `u32`): [`EXEMPT`] for
/// trusted proxies and the allowlist (never shed), [`DENIED`] for the deny list (every SYN
/// dropped). The longest matching prefix decides.
pub const MAP_EXEMPT: &str = "DOOR_EXEMPT";

/// Name of the array of `u64` words of the lists filter ([`list_filter`]): a bitmap per address
/// family in front of [`MAP_EXEMPT`], so that a source no list can decide skips the trie.
pub const MAP_LIST_FILTER: &str = "DOOR_LIST_FILTER";

/// [`MAP_EXEMPT`] value: never shed.
pub const EXEMPT: u32 = 1;

/// [`MAP_EXEMPT`] value: every SYN dropped.
pub const DENIED: u32 = 2;

/// [`MAP_EXEMPT`] value: on no list. Written at `::ffff:0:0/96` when an IPv6 network on a list
/// covers it: the program looks an IPv4 source up in its mapped form, which such a network
/// would otherwise list, where layer 7 never matches an IPv4 client against an IPv6 network.
pub const UNLISTED: u32 = 0;

/// Name of the hash map blocklist: [`PrefixKey`] → `u64` deadline (`bpf_ktime_get_coarse_ns` clock,
/// nanoseconds). SYNs from a listed prefix are dropped until the deadline, then the entry is
/// deleted.
pub const MAP_BLOCKED: &str = "DOOR_BLOCKED";

/// Name of the one-entry array holding the churn guard's [`GuardState`].
pub const MAP_GUARD: &str = "DOOR_GUARD";

/// Name of the per-CPU one-entry array of [`CookieState`]: each CPU's cookie-mode state.
pub const MAP_COOKIE: &str = "DOOR_COOKIE";

/// Name of the per-CPU one-entry array of [`tick_clock::TickClock`]: each CPU's kept reading of
/// the coarse clock. The program's alone; the daemon neither reads nor writes it.
pub const MAP_CLOCK: &str = "DOOR_CLOCK";

/// Entries of [`MAP_EXEMPT`].
pub const EXEMPT_CAPACITY: u32 = 4_096;

/// Entries of [`MAP_BLOCKED`].
pub const BLOCKED_CAPACITY: u32 = 65_536;

/// Number of source prefixes the LRU map [`MAP_PREFIXES`] tracks before it evicts the least
/// recently used one (entries; each costs `size_of::<PrefixKey>() + size_of::<PrefixState>()`
/// bytes of map value plus the kernel's per-element overhead).
pub const PREFIX_MAP_CAPACITY: u32 = 65_536;

/// Per-prefix state kept by the XDP program in [`MAP_PREFIXES`].
///
/// All fields are written by the XDP program and only read by the daemon. Counts are totals since
/// the entry was created (an LRU eviction forgets them).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PrefixState {
    /// TCP SYNs (SYN set, ACK clear) seen from this prefix.
    pub syns: u64,
    /// SYNs from this prefix that the program dropped (`XDP_DROP`).
    pub drops: u64,
    /// The SYN bucket's theoretical arrival time ([`gcra`]), `bpf_ktime_get_coarse_ns` clock, ns.
    pub tat_ns: u64,
    /// The program's clock (CLOCK_MONOTONIC_COARSE, the clock `bpf_ktime_get_coarse_ns` reads;
    /// [`tick_clock`]), nanoseconds, at the latest SYN seen.
    pub last_ns: u64,
}

const _: () = assert!(size_of::<PrefixState>() == 32);
const _: () = assert!(align_of::<PrefixState>() == 8);

#[cfg(feature = "user")]
mod pod {
    #![expect(
        unsafe_code,
        reason = "aya::Pod is an unsafe marker trait; the types below are plain old data"
    )]

    // SAFETY: `PrefixKey` is `#[repr(C)]`, 16 bytes of `u8` with no padding (size asserted in
    // `prefix`), and every bit pattern is a valid value.
    unsafe impl aya::Pod for super::PrefixKey {}
    // SAFETY: `PrefixState` is `#[repr(C)]`, four `u64` with no padding (size asserted above), and
    // every bit pattern is a valid value.
    unsafe impl aya::Pod for super::PrefixState {}
    // SAFETY: `ShieldConfig` is `#[repr(C)]`, only `u64` fields and a `u64` array, no padding
    // (size asserted in `shield`); every bit pattern is valid.
    unsafe impl aya::Pod for super::ShieldConfig {}
    // SAFETY: `GuardState` is `#[repr(C)]`, a `u64` and a `PrefixState`, no padding (size
    // asserted in `shield`); every bit pattern is valid.
    unsafe impl aya::Pod for super::GuardState {}
    // SAFETY: `CookieState` is `#[repr(C)]`, six `u64`, no padding (size asserted in `shield`);
    // every bit pattern is valid.
    unsafe impl aya::Pod for super::CookieState {}
}
