//! Benchmark reference, shared by `ref_churn_common.rs` and `ref_churn_percpu.rs`: an LRU hash
//! map under address rotation. Every packet inserts a prefix the map has not seen, so once the
//! map is full every packet evicts one: the work a rotation flood's new prefixes ask of door's
//! `DOOR_PREFIXES`, whose two possible kinds (one LRU list for all CPUs, the default, or one per
//! CPU, `BPF_F_NO_COMMON_LRU`) the two programs differ only in. Not part of door's program.
//!
//! The prefix is this CPU's number and a per-CPU count of its packets, so two CPUs running the
//! program at once insert different prefixes: an IPv4 /32 `C.x.y.z` with C the CPU's number
//! modulo 256 (distinct for hosts of up to 256 CPUs) and `x.y.z` the count's low 24 bits (after
//! 2^24 packets a CPU's prefixes come round again, long evicted). It inserts without looking the
//! prefix up first, where door looks a SYN's prefix up and inserts only one it did not find (with
//! `BPF_NOEXIST`): the lookup of a prefix that is not there is left out of both kinds alike.

use aya_ebpf::{
    bindings::xdp_action,
    maps::{LruHashMap, PerCpuArray},
};
pub(crate) use aya_ebpf::{
    macros::{map as map_attribute, xdp as xdp_attribute},
    programs::XdpContext,
};
use door_common::{PrefixKey, PrefixState};

use crate::{
    access::{MapValue, cpu},
    key::MapKey,
};

/// Inserts this CPU's next prefix into `prefixes` (a fresh [`PrefixState`] of one SYN), counting
/// it in `next`; passes the packet.
#[inline(always)]
pub(crate) fn insert_next(
    prefixes: &LruHashMap<MapKey, PrefixState>,
    next: &PerCpuArray<u64>,
) -> u32 {
    let Some(count) = MapValue::in_per_cpu_array(next, 0) else {
        return xdp_action::XDP_PASS;
    };
    let packets = count.load(0);
    count.store(0, packets.wrapping_add(1));
    let [_, _, _, _, _, high, middle, low] = packets.to_be_bytes();
    #[expect(
        clippy::cast_possible_truncation,
        reason = "a CPU's number, which one byte of the prefix holds"
    )]
    let this_cpu = cpu() as u8;
    let key = MapKey::new(PrefixKey::from_ipv4([this_cpu, high, middle, low]));
    let state = PrefixState {
        syns: 1,
        drops: 0,
        tat_ns: 0,
        last_ns: 0,
    };
    let _ = prefixes.insert(key, state, 0);
    xdp_action::XDP_PASS
}

/// The whole reference program around [`insert_next`], its prefix map created with `$flags`
/// (`BPF_MAP_CREATE` map flags): the map (named like door's, `DOOR_PREFIXES`, so the daemon's
/// loader counts its entries), the per-CPU count, the entry point (named like door's), and what
/// every eBPF binary needs (a `main` for the host build, a panic handler for the `bpf` target).
macro_rules! reference_program {
    ($flags:expr) => {
        /// The map under test.
        #[$crate::churn::map_attribute(name = "DOOR_PREFIXES")]
        static DOOR_PREFIXES: ::aya_ebpf::maps::LruHashMap<
            $crate::key::MapKey,
            ::door_common::PrefixState,
        > = ::aya_ebpf::maps::LruHashMap::with_max_entries(
            ::door_common::PREFIX_MAP_CAPACITY,
            $flags,
        );

        /// Each CPU's count of packets, which names its next prefix.
        #[$crate::churn::map_attribute(name = "REF_NEXT")]
        static REF_NEXT: ::aya_ebpf::maps::PerCpuArray<u64> =
            ::aya_ebpf::maps::PerCpuArray::with_max_entries(1, 0);

        /// Inserts this CPU's next prefix, passes.
        #[$crate::churn::xdp_attribute]
        fn door_xdp(_ctx: $crate::churn::XdpContext) -> u32 {
            $crate::churn::insert_next(&DOOR_PREFIXES, &REF_NEXT)
        }

        #[cfg(not(target_arch = "bpf"))]
        fn main() {}

        #[cfg(target_arch = "bpf")]
        #[panic_handler]
        fn panic(_info: &core::panic::PanicInfo) -> ! {
            loop {}
        }
    };
}
pub(crate) use reference_program;
