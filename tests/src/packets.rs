//! Packets for BPF_PROG_TEST_RUN, built with `etherparse` (so the tests do not share the
//! program's parsing assumptions), and the header surgery etherparse does not offer (three VLAN
//! tags, IPv4 options, IPv6 extension header chains). Indexing here works on frames this module
//! built, whose layout is known.
#![expect(
    clippy::indexing_slicing,
    reason = "test support: offsets into frames built here"
)]

use etherparse::{IpFragOffset, Ipv4Header, PacketBuilder, PacketBuilderStep, TcpHeader};

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
    let b = PacketBuilder::ethernet2(SRC_MAC, DST_MAC).ipv4(src, dst, 64);
    segment(b.tcp(40_000, dport, 1, 64_240), flags)
}

/// An Ethernet/IPv6/TCP frame from `src` to `dst`:`dport`.
pub fn tcp6(src: [u8; 16], dst: [u8; 16], dport: u16, flags: Flags) -> Vec<u8> {
    let b = PacketBuilder::ethernet2(SRC_MAC, DST_MAC).ipv6(src, dst, 64);
    segment(b.tcp(40_000, dport, 1, 64_240), flags)
}

/// An Ethernet/IPv4 TCP SYN from `src`:`sport` to `dst`:`dport` with sequence number `seq` and
/// the raw TCP `options` (padded with zeros to a multiple of 4 bytes by etherparse), no payload.
pub fn syn4_with_options(
    src: [u8; 4],
    dst: [u8; 4],
    sport: u16,
    dport: u16,
    seq: u32,
    options: &[u8],
) -> Vec<u8> {
    let b = PacketBuilder::ethernet2(SRC_MAC, DST_MAC).ipv4(src, dst, 64);
    syn_with_options(b.tcp(sport, dport, seq, 64_240), options)
}

/// As [`syn4_with_options`], over IPv6.
pub fn syn6_with_options(
    src: [u8; 16],
    dst: [u8; 16],
    sport: u16,
    dport: u16,
    seq: u32,
    options: &[u8],
) -> Vec<u8> {
    let b = PacketBuilder::ethernet2(SRC_MAC, DST_MAC).ipv6(src, dst, 64);
    syn_with_options(b.tcp(sport, dport, seq, 64_240), options)
}

#[expect(
    clippy::panic,
    reason = "test support: options that cannot be set fail the test"
)]
fn syn_with_options(b: PacketBuilderStep<TcpHeader>, options: &[u8]) -> Vec<u8> {
    let b = match b.syn().options_raw(options) {
        Ok(b) => b,
        Err(e) => panic!("TCP options of a test SYN: {e}"),
    };
    write(b.size(0), |out| {
        b.write(out, &[]).map_err(|e| e.to_string())
    })
}

/// Sets `flags` on a TCP segment being built and writes the frame (no payload).
fn segment(mut b: PacketBuilderStep<TcpHeader>, flags: Flags) -> Vec<u8> {
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

/// Byte offset of the IP header in a frame without VLAN tags.
pub const ETH_HLEN: usize = 14;

/// `frame` with VLAN tags inserted after the MAC addresses, outermost first: each tag is its
/// TPID (0x8100 for 802.1Q, 0x88a8 for 802.1ad) and a TCI carrying VLAN id 100 + its index.
pub fn with_vlans(frame: &[u8], tpids: &[u16]) -> Vec<u8> {
    let (macs, rest) = frame.split_at(12);
    let mut out = macs.to_vec();
    for (i, tpid) in (0u16..).zip(tpids) {
        out.extend_from_slice(&tpid.to_be_bytes());
        out.extend_from_slice(&(100 + i).to_be_bytes());
    }
    out.extend_from_slice(rest);
    out
}

/// An IPv4 frame (from [`tcp4`] or [`udp4`]) with `words` 4-byte words of IPv4 options (NOPs)
/// inserted, IHL and total length updated: `words = 10` gives IHL 15, the maximum.
pub fn with_ipv4_options(frame: &[u8], words: u8) -> Vec<u8> {
    let ip = ETH_HLEN;
    let mut out = frame[..ip + 20].to_vec();
    out.extend(std::iter::repeat_n(1u8, usize::from(words) * 4));
    out.extend_from_slice(&frame[ip + 20..]);
    out[ip] = 0x40 | (5 + words);
    let total = u16::from_be_bytes([out[ip + 2], out[ip + 3]]) + u16::from(words) * 4;
    out[ip + 2..ip + 4].copy_from_slice(&total.to_be_bytes());
    out
}

/// The IPv4 frame `frame` marked as a fragment of its datagram, well formed: offset
/// `offset_units` (8-byte units, at most 8,191), the more-fragments flag `more`, don't-fragment
/// clear, and the header checksum recomputed (etherparse's `Ipv4Header::write` computes it), so
/// that a path which checks checksums sees a valid header. The IPv4 total length is left as it
/// was.
///
/// # Panics
///
/// If `frame` holds no IPv4 header after its Ethernet header, or `offset_units` exceeds 8,191.
pub fn ipv4_fragment(frame: &[u8], offset_units: u16, more: bool) -> Vec<u8> {
    write(frame.len(), |out| {
        let (mut ip, _) = Ipv4Header::from_slice(&frame[ETH_HLEN..]).map_err(|e| e.to_string())?;
        ip.fragment_offset = IpFragOffset::try_new(offset_units).map_err(|e| e.to_string())?;
        ip.more_fragments = more;
        ip.dont_fragment = false;
        out.extend_from_slice(&frame[..ETH_HLEN]);
        ip.write(out).map_err(|e| e.to_string())?;
        out.extend_from_slice(&frame[ETH_HLEN + ip.header_len()..]);
        Ok(())
    })
}

/// An IPv6 extension header to insert with [`with_ipv6_extensions`].
#[derive(Debug, Clone, Copy)]
pub enum Ext {
    /// Hop-by-hop options (next header 0), 8 bytes of padding options.
    HopByHop,
    /// Routing (43), type 0 with no segments left, 8 bytes.
    Routing,
    /// Destination options (60), 8 bytes; `extra` more 8-byte units of padding.
    DestOpts {
        /// Additional 8-octet units.
        extra: u8,
    },
    /// Fragment (44): offset in 8-byte units and the more-fragments flag.
    Fragment {
        /// Fragment offset, 8-byte units.
        offset: u16,
        /// More fragments follow.
        more: bool,
    },
    /// Authentication header (51), 12 bytes (payload length 1).
    Ah,
    /// ESP (50): the program cannot look past it.
    Esp,
}

impl Ext {
    fn proto(self) -> u8 {
        match self {
            Ext::HopByHop => 0,
            Ext::Routing => 43,
            Ext::DestOpts { .. } => 60,
            Ext::Fragment { .. } => 44,
            Ext::Ah => 51,
            Ext::Esp => 50,
        }
    }

    fn bytes(self, next: u8) -> Vec<u8> {
        match self {
            // PadN option covering the 6 bytes after next-header and length.
            Ext::HopByHop => vec![next, 0, 1, 4, 0, 0, 0, 0],
            Ext::Routing => vec![next, 0, 0, 0, 0, 0, 0, 0],
            Ext::DestOpts { extra } => {
                let mut v = vec![next, extra, 1, 4, 0, 0, 0, 0];
                for _ in 0..extra {
                    v.extend_from_slice(&[1, 6, 0, 0, 0, 0, 0, 0]);
                }
                v
            }
            Ext::Fragment { offset, more } => {
                let v = (offset << 3) | u16::from(more);
                let [a, b] = v.to_be_bytes();
                vec![next, 0, a, b, 0, 0, 0, 42]
            }
            Ext::Ah => vec![next, 1, 0, 0, 0, 0, 0, 1, 0, 0, 0, 1],
            Ext::Esp => vec![0, 0, 0, 1, 0, 0, 0, 1],
        }
    }
}

/// An IPv6 frame (from [`tcp6`]) with `exts` inserted between the IPv6 header and the TCP
/// header, in order, chained through their next-header fields; payload length updated.
pub fn with_ipv6_extensions(frame: &[u8], exts: &[Ext]) -> Vec<u8> {
    let ip = ETH_HLEN;
    let transport = frame[ip + 6];
    let mut chain = Vec::new();
    for (i, ext) in exts.iter().enumerate() {
        let next = exts.get(i + 1).map_or(transport, |e| e.proto());
        chain.extend(ext.bytes(next));
    }
    let mut out = frame[..ip + 40].to_vec();
    if let Some(first) = exts.first() {
        out[ip + 6] = first.proto();
    }
    out.extend_from_slice(&chain);
    out.extend_from_slice(&frame[ip + 40..]);
    let len =
        u16::from_be_bytes([out[ip + 4], out[ip + 5]]) + u16::try_from(chain.len()).unwrap_or(0);
    out[ip + 4..ip + 6].copy_from_slice(&len.to_be_bytes());
    out
}
