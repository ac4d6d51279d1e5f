//! door's XDP program (docs/design.md, "Flood shield").
//!
//! Every packet is parsed down to TCP ([`parse`](mod@parse)) and increments exactly one
//! verdict/reason counter in the per-CPU array [`door_common::MAP_COUNTERS`]. Only a SYN (SYN set,
//! ACK clear) to a protected port can be dropped; everything else passes (fail-open), and so does
//! anything the program cannot parse. A SYN is judged in this order:
//!
//! 1. an address in the LPM trie of the operator's lists ([`door_common::MAP_EXEMPT`]) passes
//!    when its longest matching prefix is exempt (a trusted proxy, `allow`), and is dropped when
//!    it is denied (`deny`); a bitmap in front of it ([`door_common::MAP_LIST_FILTER`]) spares
//!    most sources on no list the trie's walk;
//! 2. a prefix on the daemon's blocklist ([`door_common::MAP_BLOCKED`]) is dropped until its
//!    deadline, after which the entry is ignored (the daemon deletes it);
//! 3. a prefix with an entry in the LRU map ([`door_common::MAP_PREFIXES`]) takes a token from
//!    its GCRA bucket (`syn_rate`, `syn_burst`) or is dropped;
//! 4. a new prefix gets an entry if the churn guard has a new-prefix token (`new_prefix_rate`,
//!    `new_prefix_burst`); otherwise it is charged to the one overflow bucket all such prefixes
//!    share ([`door_common::MAP_GUARD`], `overflow_syn_rate`, `overflow_syn_burst`), so that an
//!    address-rotation flood cannot make the LRU map evict the prefixes it already tracks. The
//!    overflow bucket has its own, larger budget so that a small rotation flood cannot shut out
//!    every new legitimate client; the guard bounds entry creation, so a tracked prefix idle for
//!    less than about `(max_prefixes - new_prefix_burst) / new_prefix_rate` seconds is never
//!    evicted.
//!
//! 5. cookie mode ([`cookie_mode`], `[xdp] syn_cookies = "auto"`): while this CPU's rate of SYNs
//!    that passed the steps above is over its share of `cookie_threshold`, the CPU is in cookie
//!    mode (entered and left with hysteresis, counted as events in [`door_common::MAP_COOKIE`]),
//!    and such a SYN is answered in place with a SYN-ACK carrying the kernel's SYN cookie for the
//!    listening socket ([`cookie`], `XDP_TX`, [`Counter::TxSynCookie`]); the client's ACK then
//!    reaches the kernel, which validates the cookie. Without a listener, or when the kernel
//!    declines to make a cookie, the SYN passes to the kernel ([`Counter::PassNoListener`],
//!    [`Counter::PassCookieDeclined`]).
//!
//! Two shapes that could hide a SYN are judged too (see [`parse`](mod@parse)): a TCP first
//! fragment too short for the TCP header to a protected port is dropped (RFC 1858 §3.1), and an
//! IPv6 packet whose extension headers cannot be walked to the end is charged to its source's
//! bucket like a SYN.
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
mod clock;
mod cookie;
mod events;
mod key;
mod parse;

use core::mem::offset_of;

use aya_ebpf::{
    bindings::{BPF_NOEXIST, xdp_action},
    macros::{map, xdp},
    maps::{Array, LpmTrie, LruHashMap, PerCpuArray, lpm_trie::Key},
    programs::XdpContext,
};
use door_common::{
    BLOCKED_CAPACITY, COUNTER_COUNT, CookieState, Counter, DENIED, EXEMPT, EXEMPT_CAPACITY,
    ExemptKey, GuardState, PREFIX_MAP_CAPACITY, PrefixState, ShieldConfig, Verdict, gcra,
    list_filter::{LIST_FILTER_WORDS, V6_WORDS_START, filter_bit},
    shield::{
        CONFIG_ALL_PORTS, CONFIG_COOKIES, CONFIG_HAS_BLOCKLIST, CONFIG_HAS_EXEMPT,
        CONFIG_LIST_FILTER, CONFIG_WRITTEN, cookie_quiet,
    },
};

use crate::{
    access::{CookieScratch, MapValue, Packet},
    clock::Reading,
    key::{MapKey, Source},
    parse::{Parsed, TcpSegment, parse},
};

/// Per-prefix SYN state; name and layout shared with the daemon through `door-common`.
#[map(name = "DOOR_PREFIXES")]
static DOOR_PREFIXES: LruHashMap<MapKey, PrefixState> =
    LruHashMap::with_max_entries(PREFIX_MAP_CAPACITY, 0);

/// One `u64` per [`Counter`], per CPU.
#[map(name = "DOOR_COUNTERS")]
static DOOR_COUNTERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(COUNTER_COUNT, 0);

/// The daemon's settings (one entry).
#[map(name = "DOOR_CONFIG")]
static DOOR_CONFIG: Array<ShieldConfig> = Array::with_max_entries(1, 0);

/// The operator's lists: exempt addresses (trusted proxies, allowlist) and denied ones.
#[map(name = "DOOR_EXEMPT")]
static DOOR_EXEMPT: LpmTrie<ExemptKey, u32> = LpmTrie::with_max_entries(EXEMPT_CAPACITY, 0);

/// The lists filter in front of [`DOOR_EXEMPT`]: a bitmap per address family
/// ([`door_common::list_filter`]).
#[map(name = "DOOR_LIST_FILTER")]
static DOOR_LIST_FILTER: Array<u64> = Array::with_max_entries(LIST_FILTER_WORDS, 0);

/// Blocklist: prefix → deadline (ns, `bpf_ktime_get_coarse_ns` clock). An LRU map, so that it can never
/// fill up: when full, the least recently used entry (most likely an expired one) makes room.
#[map(name = "DOOR_BLOCKED")]
static DOOR_BLOCKED: LruHashMap<MapKey, u64> = LruHashMap::with_max_entries(BLOCKED_CAPACITY, 0);

/// The churn guard (one entry).
#[map(name = "DOOR_GUARD")]
static DOOR_GUARD: Array<GuardState> = Array::with_max_entries(1, 0);

/// Each CPU's cookie-mode state (one entry).
#[map(name = "DOOR_COOKIE")]
static DOOR_COOKIE: PerCpuArray<CookieState> = PerCpuArray::with_max_entries(1, 0);

/// Scratch space of the SYN cookie path (one entry per CPU; see [`cookie`]): kept off the stack.
#[map(name = "DOOR_SCRATCH")]
static DOOR_SCRATCH: PerCpuArray<CookieScratch> = PerCpuArray::with_max_entries(1, 0);

/// The XDP entry point: classify, count, and return the verdict.
#[xdp]
#[expect(
    clippy::needless_pass_by_value,
    reason = "#[xdp] hands the context over by value"
)]
fn door_xdp(ctx: XdpContext) -> u32 {
    let packet = Packet::new(&ctx);
    let counter = match parse(&packet) {
        Parsed::Syn(segment) => syn(&ctx, &packet, &segment),
        Parsed::TinyFragment { src, dst_port } => {
            judge_at(&ctx, &packet, src, dst_port, Kind::TinyFragment)
        }
        Parsed::Unwalkable { src } => judge_at(&ctx, &packet, src, None, Kind::Unwalkable),
        Parsed::Other(counter) => counter,
    };
    count(counter);
    match counter.verdict() {
        Verdict::Pass => xdp_action::XDP_PASS,
        Verdict::Drop => xdp_action::XDP_DROP,
        Verdict::Tx => xdp_action::XDP_TX,
    }
}

/// What is being judged: a SYN, or a packet that may hide one.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// A TCP SYN (SYN set, ACK clear).
    Syn,
    /// A TCP first fragment too short for the TCP header (RFC 1858 §3.1): no legitimate stack
    /// sends one, so on a protected port it is dropped outright.
    TinyFragment,
    /// An IPv6 packet whose extension headers the program cannot walk to the end: charged to its
    /// source's bucket like a SYN, so the shape cannot carry a flood past the budget.
    Unwalkable,
}

impl Kind {
    /// The counter when passed within budget (or while only observing).
    fn pass(self) -> Counter {
        match self {
            Kind::Syn => Counter::PassSyn,
            Kind::TinyFragment => Counter::PassTruncated,
            Kind::Unwalkable => Counter::PassTooManyHeaders,
        }
    }

    /// The counter when dropped over budget.
    fn drop(self) -> Counter {
        match self {
            Kind::Syn => Counter::DropSynBudget,
            Kind::TinyFragment => Counter::DropTinyFragment,
            Kind::Unwalkable => Counter::DropUnwalkable,
        }
    }
}

/// The shield's settings as the program uses them: the configuration map's value, read field by
/// field where a path needs it (a counted SYN reads its own bucket, not the churn guard's or the
/// overflow bucket's), or nothing while the daemon has not written it (observe only).
struct Settings {
    /// `None` while only observing.
    cfg: Option<MapValue<ShieldConfig>>,
    /// [`ShieldConfig::flags`]; 0 while only observing.
    flags: u64,
}

/// A GCRA bucket's parameters ([`gcra::take`]).
#[derive(Clone, Copy)]
struct Bucket {
    /// Nanoseconds between two tokens; 0 for a bucket that is never charged.
    interval: u64,
    /// Nanoseconds a bucket's TAT may run ahead of now: burst × interval.
    tolerance: u64,
}

impl Settings {
    /// Reads the settings, or `None` when `port` is known and not protected (an unknown port
    /// counts as protected). Without a written configuration: observe only (every port, nothing
    /// dropped).
    #[inline(always)]
    fn read(port: Option<u16>) -> Option<Self> {
        let observe = Self {
            cfg: None,
            flags: 0,
        };
        let Some(cfg) = MapValue::in_array(&DOOR_CONFIG, 0) else {
            return Some(observe);
        };
        let flags = cfg.load(offset_of!(ShieldConfig, flags));
        if flags & CONFIG_WRITTEN == 0 {
            return Some(observe);
        }
        if flags & CONFIG_ALL_PORTS == 0
            && let Some(port) = port
        {
            let word = offset_of!(ShieldConfig, ports) + usize::from(port / 64) * 8;
            if cfg.load(word) & (1 << (port % 64)) == 0 {
                return None;
            }
        }
        Some(Self {
            cfg: Some(cfg),
            flags,
        })
    }

    /// Whether over-budget packets are dropped (the daemon wrote the configuration).
    #[inline(always)]
    fn enforce(&self) -> bool {
        self.cfg.is_some()
    }

    /// Whether the exempt trie may have entries.
    #[inline(always)]
    fn exempt(&self) -> bool {
        self.flags & CONFIG_HAS_EXEMPT != 0
    }

    /// Whether the lists trie may decide `source`: `false` only when the lists filter is on and
    /// the source's bit is clear ([`door_common::list_filter`]). Fail-open toward the trie: a
    /// source or a filter word that cannot be read is looked up.
    #[inline(always)]
    fn may_be_listed(&self, source: Source, packet: &Packet) -> bool {
        let Some(cfg) = self
            .cfg
            .as_ref()
            .filter(|_| self.flags & CONFIG_LIST_FILTER != 0)
        else {
            return true;
        };
        let Some((lead, v6)) = source.lead(packet) else {
            return true;
        };
        let (mask, start) = if v6 {
            (
                cfg.load(offset_of!(ShieldConfig, lead_mask_v6)),
                V6_WORDS_START,
            )
        } else {
            (cfg.load(offset_of!(ShieldConfig, lead_mask_v4)), 0)
        };
        let (word, bit) = filter_bit(lead, mask);
        MapValue::in_array(&DOOR_LIST_FILTER, start + word)
            .is_none_or(|w| w.load(0) & (1 << bit) != 0)
    }

    /// Whether the blocklist may have entries.
    #[inline(always)]
    fn blocklist(&self) -> bool {
        self.flags & CONFIG_HAS_BLOCKLIST != 0
    }

    /// The configuration, when cookie mode is configured (`syn_cookies = "auto"`).
    #[inline(always)]
    fn cookies(&self) -> Option<&MapValue<ShieldConfig>> {
        self.cfg
            .as_ref()
            .filter(|_| self.flags & CONFIG_COOKIES != 0)
    }

    /// The bucket whose interval and tolerance (nanoseconds) are the `u64` fields at byte
    /// offsets `interval` and `tolerance` of [`ShieldConfig`], or `observe` while observing.
    #[inline(always)]
    fn bucket(&self, interval: usize, tolerance: usize, observe: Bucket) -> Bucket {
        match &self.cfg {
            Some(cfg) => Bucket {
                interval: cfg.load(interval),
                tolerance: cfg.load(tolerance),
            },
            None => observe,
        }
    }

    /// Each prefix's SYN bucket (`syn_rate`, `syn_burst`); while observing, one that never
    /// runs out.
    #[inline(always)]
    fn syn(&self) -> Bucket {
        self.bucket(
            offset_of!(ShieldConfig, syn_interval_ns),
            offset_of!(ShieldConfig, syn_tolerance_ns),
            Bucket {
                interval: 0,
                tolerance: u64::MAX,
            },
        )
    }

    /// The churn guard's new-prefix bucket (`new_prefix_rate`, `new_prefix_burst`); interval 0
    /// when the guard is off, and while observing.
    #[inline(always)]
    fn new_prefix(&self) -> Bucket {
        self.bucket(
            offset_of!(ShieldConfig, new_prefix_interval_ns),
            offset_of!(ShieldConfig, new_prefix_tolerance_ns),
            Bucket {
                interval: 0,
                tolerance: 0,
            },
        )
    }

    /// The overflow bucket new prefixes share while the guard is closed (`overflow_syn_rate`,
    /// `overflow_syn_burst`); while observing, one that never runs out (unused: the guard runs
    /// only when enforcing).
    #[inline(always)]
    fn overflow(&self) -> Bucket {
        self.bucket(
            offset_of!(ShieldConfig, overflow_interval_ns),
            offset_of!(ShieldConfig, overflow_tolerance_ns),
            Bucket {
                interval: 0,
                tolerance: u64::MAX,
            },
        )
    }
}

/// Judges a SYN (see the crate docs for the order) and, when it passes within budget while this
/// CPU is in cookie mode, answers it with a SYN cookie ([`cookie::answer`]).
#[inline(always)]
fn syn(ctx: &XdpContext, packet: &Packet, segment: &TcpSegment) -> Counter {
    let Some(settings) = Settings::read(Some(segment.dst_port)) else {
        return Counter::PassUnprotectedPort;
    };
    let clock = Reading::new();
    let counter = judge(ctx, &settings, packet, segment.src(), Kind::Syn, &clock);
    // Written without a closure: LLVM made `is_some_and`'s closure a BPF function of its own,
    // and a call costs a return, a mispredicted branch under the kernel's SRSO mitigation.
    if matches!(counter, Counter::PassSyn | Counter::PassOverflowSyn)
        && let Some(cfg) = settings.cookies()
        && cookie_mode(ctx, cfg, clock.ns())
    {
        return cookie::answer(packet, segment);
    }
    counter
}

/// Judges a packet that may hide a SYN (`kind` is not [`Kind::Syn`]) from `src`, charged to
/// `src`'s prefix, to `port`: [`Counter::PassUnprotectedPort`] when `port` is known and not
/// protected; `None` (the port is not in the packet) counts as protected.
#[inline(always)]
fn judge_at(
    ctx: &XdpContext,
    packet: &Packet,
    src: Source,
    port: Option<u16>,
    kind: Kind,
) -> Counter {
    match Settings::read(port) {
        Some(settings) => judge(ctx, &settings, packet, src, kind, &Reading::new()),
        None => Counter::PassUnprotectedPort,
    }
}

/// Judges `packet`, from `source`, to a protected port under `settings` (see the crate docs
/// for the order), reading the clock through `clock` once it gets past the lists.
#[inline(always)]
fn judge(
    ctx: &XdpContext,
    settings: &Settings,
    packet: &Packet,
    source: Source,
    kind: Kind,
    clock: &Reading,
) -> Counter {
    let enforce = settings.enforce();
    if !enforce && kind != Kind::Syn {
        return kind.pass();
    }
    // The parser read the address already: `None` is unreachable, and would pass (fail-open).
    let Some(src) = source.key(packet) else {
        return kind.pass();
    };
    if settings.exempt() && settings.may_be_listed(source, packet) {
        // As above: unreachable, and `None` passes (fail-open).
        let Some(addr) = source.addr(packet) else {
            return kind.pass();
        };
        match DOOR_EXEMPT.get(Key::new(128, addr)).copied() {
            Some(DENIED) => return Counter::DropDenied,
            Some(EXEMPT) => return Counter::PassExempt,
            // Not listed, or UNLISTED: an IPv4 source under an IPv6 network that covers
            // `::ffff:0:0/96`.
            _ => {}
        }
    }
    let now = clock.ns();
    // Expired entries are ignored, never deleted here: the daemon owns the blocklist's entries,
    // and the LRU map makes room for new ones on its own.
    if settings.blocklist()
        && let Some(deadline) = MapValue::in_lru(&DOOR_BLOCKED, &src)
        && now < deadline.load(0)
    {
        if let Some(state) = MapValue::in_lru(&DOOR_PREFIXES, &src) {
            bump(&state, offset_of!(PrefixState, drops));
        }
        return Counter::DropBlocked;
    }
    if kind == Kind::TinyFragment {
        return kind.drop();
    }
    if let Some(state) = MapValue::in_lru(&DOOR_PREFIXES, &src) {
        return charge(&state, now, settings.syn(), enforce, kind);
    }
    let p = settings.new_prefix();
    if enforce
        && p.interval != 0
        && let Some(guard) = MapValue::in_array(&DOOR_GUARD, 0)
    {
        let tat_at = offset_of!(GuardState, new_prefix_tat_ns);
        let Some(tat) = gcra::take(guard.load(tat_at), now, p.interval, p.tolerance) else {
            events::guard_closed(ctx, now);
            return match guard.project::<PrefixState>(offset_of!(GuardState, overflow)) {
                Some(overflow) => match charge(&overflow, now, settings.overflow(), true, kind) {
                    c if c == kind.pass() => Counter::PassOverflowSyn,
                    _ => Counter::DropOverflow,
                },
                None => Counter::PassMapFull,
            };
        };
        guard.store(tat_at, tat);
        events::guard_open();
    }
    // A new prefix: its bucket starts full, and this packet takes its first token.
    let syn = settings.syn();
    let fresh = PrefixState {
        syns: 1,
        drops: 0,
        tat_ns: gcra::take(0, now, syn.interval, syn.tolerance).unwrap_or(now),
        last_ns: now,
    };
    // BPF_NOEXIST: if another CPU created the entry since our lookup, charge that one.
    if DOOR_PREFIXES
        .insert(src, fresh, u64::from(BPF_NOEXIST))
        .is_ok()
    {
        return kind.pass();
    }
    if let Some(state) = MapValue::in_lru(&DOOR_PREFIXES, &src) {
        return charge(&state, now, syn, enforce, kind);
    }
    events::map_full(ctx, now);
    Counter::PassMapFull
}

/// Counts a SYN on `state` and takes a token from its bucket: `kind.pass()` when it had one (or
/// when only observing), `kind.drop()` otherwise.
#[inline(always)]
fn charge(
    state: &MapValue<PrefixState>,
    now: u64,
    bucket: Bucket,
    enforce: bool,
    kind: Kind,
) -> Counter {
    bump(state, offset_of!(PrefixState, syns));
    state.store(offset_of!(PrefixState, last_ns), now);
    let tat_at = offset_of!(PrefixState, tat_ns);
    match gcra::take(state.load(tat_at), now, bucket.interval, bucket.tolerance) {
        Some(tat) => {
            state.store(tat_at, tat);
            kind.pass()
        }
        None if !enforce => kind.pass(),
        None => {
            bump(state, offset_of!(PrefixState, drops));
            kind.drop()
        }
    }
}

/// Whether cookie mode is on for this CPU after counting one more SYN, entering or leaving it as
/// the rate says (see [`CookieState`]), under the configuration `cfg` (cookie mode configured:
/// [`Settings::cookies`]), at `now` (ns, the clock the SYN was judged at).
#[inline(always)]
fn cookie_mode(ctx: &XdpContext, cfg: &MapValue<ShieldConfig>, now: u64) -> bool {
    let Some(state) = MapValue::in_per_cpu_array(&DOOR_COOKIE, 0) else {
        return false;
    };
    let active = offset_of!(CookieState, active);
    let tat_at = offset_of!(CookieState, tat_ns);
    let leave_at = offset_of!(CookieState, leave_tat_ns);
    let since_at = offset_of!(CookieState, below_since_ns);
    if state.load(active) == 0 {
        let interval = cfg.load(offset_of!(ShieldConfig, cookie_interval_ns));
        let tolerance = cfg.load(offset_of!(ShieldConfig, cookie_tolerance_ns));
        if let Some(tat) = gcra::take(state.load(tat_at), now, interval, tolerance) {
            state.store(tat_at, tat);
            return false;
        }
        // Over the threshold: enter, with the leave bucket empty (it must drain first).
        state.store(active, 1);
        bump(&state, offset_of!(CookieState, entered));
        events::cookie_mode(ctx, true);
        let leave_tolerance = cfg.load(offset_of!(ShieldConfig, cookie_leave_tolerance_ns));
        state.store(leave_at, now.saturating_add(leave_tolerance));
        state.store(since_at, 0);
        return true;
    }
    let interval = cfg.load(offset_of!(ShieldConfig, cookie_leave_interval_ns));
    let tolerance = cfg.load(offset_of!(ShieldConfig, cookie_leave_tolerance_ns));
    let hold = cfg.load(offset_of!(ShieldConfig, cookie_hold_ns));
    let before = state.load(leave_at);
    let Some(tat) = gcra::take(before, now, interval, tolerance) else {
        // Still over 80% of the threshold.
        state.store(since_at, 0);
        return true;
    };
    state.store(leave_at, tat);
    // Quiet for the whole hold before this SYN (a flood that stopped): leave now, not at a later
    // SYN a hold from this one.
    if !cookie_quiet(before, hold, now) {
        let since = state.load(since_at);
        if since == 0 {
            state.store(since_at, now | 1);
            return true;
        }
        if now.saturating_sub(since) < hold {
            return true;
        }
    }
    // Under 80% for the hold time: leave, with a full bucket.
    state.store(active, 0);
    state.store(tat_at, 0);
    state.store(since_at, 0);
    bump(&state, offset_of!(CookieState, left));
    events::cookie_mode(ctx, false);
    false
}

/// Adds one to the `u64` at `offset` of a shared map value (see the crate docs on concurrency).
#[inline(always)]
fn bump<T>(value: &MapValue<T>, offset: usize) {
    value.store(offset, value.load(offset) + 1);
}

/// Increments this CPU's slot of `counter` (per-CPU: no other CPU writes it).
#[inline(always)]
fn count(counter: Counter) {
    if let Some(slot) = MapValue::in_per_cpu_array(&DOOR_COUNTERS, counter.index()) {
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
