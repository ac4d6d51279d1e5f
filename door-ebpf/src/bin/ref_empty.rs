//! Benchmark reference: the empty XDP program (returns `XDP_PASS` and does nothing else), the
//! floor of `cargo xtask bench xdp`. Its entry point is named like door's so the daemon's loader
//! runs it unchanged.
#![cfg_attr(target_arch = "bpf", no_std)]
#![cfg_attr(target_arch = "bpf", no_main)]

use aya_ebpf::{bindings::xdp_action, macros::xdp, programs::XdpContext};

/// Passes every packet.
#[xdp]
fn door_xdp(_ctx: XdpContext) -> u32 {
    xdp_action::XDP_PASS
}

#[cfg(not(target_arch = "bpf"))]
fn main() {}

#[cfg(target_arch = "bpf")]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}
