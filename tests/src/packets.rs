//! Packets for BPF_PROG_TEST_RUN, built with `etherparse` (so the tests do not share the
//! program's parsing assumptions).

use etherparse::PacketBuilder;

const SRC_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 1];
const DST_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 2];

/// TCP flags to set on a built segment.
#[derive(Debug, Clone, Copy, Default)]
pub struct Flags {
    /// SYN.
    pub syn: bool,
    /// ACK.
    pub ack: bool,
    /// RST.
    pub rst: bool,
}

impl Flags {
    /// SYN only: a connection opening.
    pub const SYN: Self = Self {
        syn: true,
        ack: false,
        rst: false,
    };
    /// SYN and ACK: the answer to a SYN.
    pub const SYN_ACK: Self = Self {
        syn: true,
        ack: true,
        rst: false,
    };
    /// ACK only.
    pub const ACK: Self = Self {
        syn: false,
        ack: true,
        rst: false,
    };
    /// RST only.
    pub const RST: Self = Self {
        syn: false,
        ack: false,
        rst: true,
    };
}

/// An Ethernet/IPv4/TCP frame from `src` to `dst`:`dport`.
pub fn tcp4(src: [u8; 4], dst: [u8; 4], dport: u16, flags: Flags) -> Vec<u8> {
    let mut b = PacketBuilder::ethernet2(SRC_MAC, DST_MAC)
        .ipv4(src, dst, 64)
        .tcp(40_000, dport, 1, 64_240);
    if flags.syn {
        b = b.syn();
    }
    if flags.ack {
        b = b.ack(1);
    }
    if flags.rst {
        b = b.rst();
    }
    write(b.size(0), |out| {
        b.write(out, &[]).map_err(|e| e.to_string())
    })
}

/// An Ethernet/IPv6/TCP frame from `src` to `dst`:`dport`.
pub fn tcp6(src: [u8; 16], dst: [u8; 16], dport: u16, flags: Flags) -> Vec<u8> {
    let mut b = PacketBuilder::ethernet2(SRC_MAC, DST_MAC)
        .ipv6(src, dst, 64)
        .tcp(40_000, dport, 1, 64_240);
    if flags.syn {
        b = b.syn();
    }
    if flags.ack {
        b = b.ack(1);
    }
    if flags.rst {
        b = b.rst();
    }
    write(b.size(0), |out| {
        b.write(out, &[]).map_err(|e| e.to_string())
    })
}

/// An Ethernet/IPv4/UDP frame.
pub fn udp4(src: [u8; 4], dst: [u8; 4], dport: u16) -> Vec<u8> {
    let b = PacketBuilder::ethernet2(SRC_MAC, DST_MAC)
        .ipv4(src, dst, 64)
        .udp(40_000, dport);
    write(b.size(4), |out| {
        b.write(out, b"ping").map_err(|e| e.to_string())
    })
}

/// An ARP request frame (EtherType 0x0806) asking for `target` from `sender`.
pub fn arp(sender: [u8; 4], target: [u8; 4]) -> Vec<u8> {
    let mut f = Vec::with_capacity(42);
    f.extend_from_slice(&[0xff; 6]);
    f.extend_from_slice(&SRC_MAC);
    f.extend_from_slice(&[0x08, 0x06]);
    // htype Ethernet, ptype IPv4, hlen 6, plen 4, op request.
    f.extend_from_slice(&[0, 1, 0x08, 0, 6, 4, 0, 1]);
    f.extend_from_slice(&SRC_MAC);
    f.extend_from_slice(&sender);
    f.extend_from_slice(&[0; 6]);
    f.extend_from_slice(&target);
    f
}

#[expect(
    clippy::panic,
    reason = "test support: a packet that cannot be built fails the test"
)]
fn write(size: usize, f: impl FnOnce(&mut Vec<u8>) -> Result<(), String>) -> Vec<u8> {
    let mut out = Vec::with_capacity(size);
    if let Err(e) = f(&mut out) {
        // Building a packet from fixed, valid inputs cannot fail; a failure is a bug in the test.
        panic!("building a test packet: {e}");
    }
    out
}
