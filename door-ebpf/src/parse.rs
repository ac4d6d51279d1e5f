//! Header parsing: Ethernet → IPv4 (honouring IHL) or IPv6 → TCP, reading only through the
//! bounds-checked [`Packet::read`]. Headers are read as byte arrays, so every bit pattern the
//! wire can carry is a valid value (no enums built from packet bytes).
//!
//! Sources: IEEE 802.3 (Ethernet II), RFC 791 (IPv4), RFC 8200 (IPv6), RFC 9293 (TCP).

use door_common::{Counter, PrefixKey};

use crate::access::Packet;

const ETH_HLEN: usize = 14;
const ETHERTYPE_IPV4: u16 = 0x0800;
const ETHERTYPE_IPV6: u16 = 0x86dd;
const IPPROTO_TCP: u8 = 6;
const IPV4_MIN_HLEN: usize = 20;
const IPV6_HLEN: usize = 40;
const TCP_MIN_HLEN: usize = 20;
/// TCP flag bits in byte 13 of the header (RFC 9293 §3.1).
const TCP_SYN: u8 = 0x02;
const TCP_ACK: u8 = 0x10;

/// The facts the program needs about a TCP segment.
#[derive(Clone, Copy)]
pub(crate) struct TcpSegment {
    /// The source address's prefix (IPv4 /32, IPv6 /64, NAT64 as its IPv4).
    pub(crate) src: PrefixKey,
    /// The TCP flags byte (CWR ECE URG ACK PSH RST SYN FIN).
    pub(crate) flags: u8,
}

impl TcpSegment {
    /// A connection opening: SYN set, ACK clear (a SYN-ACK is the other side's answer).
    pub(crate) fn is_syn(&self) -> bool {
        self.flags & TCP_SYN != 0 && self.flags & TCP_ACK == 0
    }
}

/// What the parser found: a TCP segment, or the pass counter that explains why not.
pub(crate) enum Parsed {
    /// A TCP segment whose header is entirely inside the packet.
    Tcp(TcpSegment),
    /// Anything else, with the counter it is recorded under.
    Other(Counter),
}

/// Parses `pkt` down to its TCP header.
#[inline(always)]
pub(crate) fn parse(pkt: &Packet) -> Parsed {
    let Some(eth) = pkt.read::<[u8; ETH_HLEN]>(0) else {
        return Parsed::Other(Counter::PassTruncated);
    };
    match u16::from_be_bytes([eth[12], eth[13]]) {
        ETHERTYPE_IPV4 => ipv4(pkt, ETH_HLEN),
        ETHERTYPE_IPV6 => ipv6(pkt, ETH_HLEN),
        _ => Parsed::Other(Counter::PassNotIp),
    }
}

#[inline(always)]
fn ipv4(pkt: &Packet, offset: usize) -> Parsed {
    let Some(ip) = pkt.read::<[u8; IPV4_MIN_HLEN]>(offset) else {
        return Parsed::Other(Counter::PassTruncated);
    };
    let ihl = usize::from(ip[0] & 0x0f) * 4;
    if ip[0] >> 4 != 4 || ihl < IPV4_MIN_HLEN {
        return Parsed::Other(Counter::PassMalformed);
    }
    if ip[9] != IPPROTO_TCP {
        return Parsed::Other(Counter::PassNotTcp);
    }
    // Fragment offset (13 bits): non-zero means a later fragment, which has no TCP header.
    if u16::from_be_bytes([ip[6], ip[7]]) & 0x1fff != 0 {
        return Parsed::Other(Counter::PassFragment);
    }
    let src = PrefixKey::from_ipv4([ip[12], ip[13], ip[14], ip[15]]);
    tcp(pkt, offset + ihl, src)
}

#[inline(always)]
fn ipv6(pkt: &Packet, offset: usize) -> Parsed {
    let Some(ip) = pkt.read::<[u8; IPV6_HLEN]>(offset) else {
        return Parsed::Other(Counter::PassTruncated);
    };
    if ip[0] >> 4 != 6 {
        return Parsed::Other(Counter::PassMalformed);
    }
    if ip[6] != IPPROTO_TCP {
        return Parsed::Other(Counter::PassNotTcp);
    }
    let src = PrefixKey::from_ipv6([
        ip[8], ip[9], ip[10], ip[11], ip[12], ip[13], ip[14], ip[15], ip[16], ip[17], ip[18],
        ip[19], ip[20], ip[21], ip[22], ip[23],
    ]);
    tcp(pkt, offset + IPV6_HLEN, src)
}

#[inline(always)]
fn tcp(pkt: &Packet, offset: usize, src: PrefixKey) -> Parsed {
    let Some(tcp) = pkt.read::<[u8; TCP_MIN_HLEN]>(offset) else {
        return Parsed::Other(Counter::PassTruncated);
    };
    if usize::from(tcp[12] >> 4) * 4 < TCP_MIN_HLEN {
        return Parsed::Other(Counter::PassMalformed);
    }
    Parsed::Tcp(TcpSegment {
        src,
        flags: tcp[13],
    })
}
