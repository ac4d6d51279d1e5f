//! Benchmark reference: the irreducible work of keeping per-prefix state — parse Ethernet, IPv4
//! (honouring IHL) and TCP, then one LRU-hash update keyed by the source prefix — and nothing
//! else (no VLANs, no IPv6, no budget, no counters). The key is built as door builds it
//! (`key::MapKey`, two 8-byte stores). `cargo xtask bench xdp` compares door's program with it.
//! Its entry point is named like door's so the daemon's loader runs it unchanged; it reads
//! packets through door's bounds-checked accessor.
#![cfg_attr(target_arch = "bpf", no_std)]
#![cfg_attr(target_arch = "bpf", no_main)]
#![expect(
    clippy::inline_always,
    reason = "eBPF: helpers are inlined so the verifier checks one function with known bounds"
)]

#[path = "../access.rs"]
#[expect(dead_code, reason = "the reference uses only part of the accessor")]
mod access;
#[path = "../key.rs"]
#[expect(
    dead_code,
    reason = "the reference builds its key from the header it read"
)]
mod key;

use aya_ebpf::{
    bindings::xdp_action,
    macros::{map, xdp},
    maps::LruHashMap,
    programs::XdpContext,
};
use door_common::{PREFIX_MAP_CAPACITY, PrefixKey};

use crate::{
    access::{MapValue, Packet},
    key::MapKey,
};

/// Source prefix → packets seen.
#[map(name = "REF_PREFIXES")]
static REF_PREFIXES: LruHashMap<MapKey, u64> = LruHashMap::with_max_entries(PREFIX_MAP_CAPACITY, 0);

/// Parse to TCP, count the source prefix, pass.
#[xdp]
#[expect(
    clippy::needless_pass_by_value,
    reason = "#[xdp] hands the context over by value"
)]
fn door_xdp(ctx: XdpContext) -> u32 {
    let pkt = Packet::new(&ctx);
    let Some(eth) = pkt.read::<14>(0) else {
        return xdp_action::XDP_PASS;
    };
    if eth[12] != 0x08 || eth[13] != 0x00 {
        return xdp_action::XDP_PASS;
    }
    let Some(ip) = pkt.read::<20>(14) else {
        return xdp_action::XDP_PASS;
    };
    if ip[9] != 6 {
        return xdp_action::XDP_PASS;
    }
    let ihl = usize::from(ip[0] & 0x0f) * 4;
    if pkt.read::<20>(14 + ihl).is_none() {
        return xdp_action::XDP_PASS;
    }
    let key = MapKey::new(PrefixKey::from_ipv4([ip[12], ip[13], ip[14], ip[15]]));
    match MapValue::in_lru(&REF_PREFIXES, &key) {
        Some(count) => count.store(0, count.load(0) + 1),
        None => {
            let _ = REF_PREFIXES.insert(key, 1, 0);
        }
    }
    xdp_action::XDP_PASS
}

#[cfg(not(target_arch = "bpf"))]
fn main() {}

#[cfg(target_arch = "bpf")]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}
