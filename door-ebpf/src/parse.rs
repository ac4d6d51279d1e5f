//! Header parsing: Ethernet, up to two VLAN tags (802.1Q, 802.1ad), IPv4 (honouring IHL) or IPv6
//! (walking a bounded number of extension headers), then TCP; reading only through the
//! bounds-checked [`Packet::read`]. Headers are read as byte arrays, so every bit pattern the wire
//! can carry is a valid value (no enums built from packet bytes).
//!
//! Sources: IEEE 802.3 (Ethernet II), IEEE 802.1Q (C-tag 0x8100, S-tag 0x88a8), RFC 791 (IPv4),
//! RFC 8200 §4 (IPv6 extension headers), RFC 4302 (AH length), RFC 9293 (TCP).

use door_common::{Counter, PrefixKey};

use crate::access::Packet;

const ETH_HLEN: usize = 14;
const VLAN_HLEN: usize = 4;
/// VLAN tags walked; a third tag passes as [`Counter::PassTooManyHeaders`].
const MAX_VLAN_TAGS: usize = 2;
const ETHERTYPE_IPV4: u16 = 0x0800;
const ETHERTYPE_IPV6: u16 = 0x86dd;
const ETHERTYPE_8021Q: u16 = 0x8100;
const ETHERTYPE_8021AD: u16 = 0x88a8;
const IPPROTO_HOPOPTS: u8 = 0;
const IPPROTO_TCP: u8 = 6;
const IPPROTO_ROUTING: u8 = 43;
const IPPROTO_FRAGMENT: u8 = 44;
const IPPROTO_AH: u8 = 51;
const IPPROTO_DSTOPTS: u8 = 60;
/// IPv6 extension headers walked before giving up ([`Counter::PassTooManyHeaders`]).
const MAX_EXT_HEADERS: usize = 6;
const IPV4_MIN_HLEN: usize = 20;
const IPV6_HLEN: usize = 40;
const TCP_MIN_HLEN: usize = 20;
/// TCP flag bits in byte 13 of the header (RFC 9293 §3.1).
const TCP_SYN: u8 = 0x02;
const TCP_ACK: u8 = 0x10;

/// The facts the program needs about a TCP segment.
#[derive(Clone, Copy)]
pub(crate) struct TcpSegment {
    /// The source address, 16 bytes (IPv4 as `::ffff:a.b.c.d`), unmasked: the exempt trie's key.
    pub(crate) addr: [u8; 16],
    /// The destination port, host order.
    pub(crate) dst_port: u16,
    /// The TCP flags byte (CWR ECE URG ACK PSH RST SYN FIN).
    pub(crate) flags: u8,
}

impl TcpSegment {
    /// A connection opening: SYN set, ACK clear (a SYN-ACK is the other side's answer).
    pub(crate) fn is_syn(&self) -> bool {
        self.flags & TCP_SYN != 0 && self.flags & TCP_ACK == 0
    }

    /// The source's prefix (IPv4 /32, IPv6 /64, NAT64 as its IPv4).
    pub(crate) fn prefix(&self) -> PrefixKey {
        PrefixKey::from_ipv6(self.addr)
    }
}

/// What the parser found: a TCP segment, or the pass counter that explains why not.
pub(crate) enum Parsed {
    /// A TCP segment whose fixed header is entirely inside the packet.
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
    let mut ethertype = u16::from_be_bytes([eth[12], eth[13]]);
    let mut offset = ETH_HLEN;
    for _ in 0..MAX_VLAN_TAGS {
        if ethertype != ETHERTYPE_8021Q && ethertype != ETHERTYPE_8021AD {
            break;
        }
        // TCI (2 bytes), then the encapsulated EtherType.
        let Some(tag) = pkt.read::<[u8; VLAN_HLEN]>(offset) else {
            return Parsed::Other(Counter::PassTruncated);
        };
        ethertype = u16::from_be_bytes([tag[2], tag[3]]);
        offset += VLAN_HLEN;
    }
    match ethertype {
        ETHERTYPE_IPV4 => ipv4(pkt, offset),
        ETHERTYPE_IPV6 => ipv6(pkt, offset),
        ETHERTYPE_8021Q | ETHERTYPE_8021AD => Parsed::Other(Counter::PassTooManyHeaders),
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
    // Fragment offset (13 bits): non-zero means a later fragment, which has no TCP header. A
    // first fragment (offset 0, more-fragments set) carries the TCP header and is judged.
    if u16::from_be_bytes([ip[6], ip[7]]) & 0x1fff != 0 {
        return Parsed::Other(Counter::PassFragment);
    }
    let addr = PrefixKey::from_ipv4([ip[12], ip[13], ip[14], ip[15]]).addr;
    tcp(pkt, offset + ihl, addr)
}

#[inline(always)]
fn ipv6(pkt: &Packet, offset: usize) -> Parsed {
    let Some(ip) = pkt.read::<[u8; IPV6_HLEN]>(offset) else {
        return Parsed::Other(Counter::PassTruncated);
    };
    if ip[0] >> 4 != 6 {
        return Parsed::Other(Counter::PassMalformed);
    }
    let addr = [
        ip[8], ip[9], ip[10], ip[11], ip[12], ip[13], ip[14], ip[15], ip[16], ip[17], ip[18],
        ip[19], ip[20], ip[21], ip[22], ip[23],
    ];
    let mut next = ip[6];
    let mut offset = offset + IPV6_HLEN;
    for _ in 0..MAX_EXT_HEADERS {
        match next {
            IPPROTO_TCP => return tcp(pkt, offset, addr),
            IPPROTO_HOPOPTS | IPPROTO_ROUTING | IPPROTO_DSTOPTS => {
                // Next header, length in 8-octet units not counting the first 8 (RFC 8200 §4.3).
                let Some(h) = pkt.read::<[u8; 2]>(offset) else {
                    return Parsed::Other(Counter::PassTruncated);
                };
                next = h[0];
                offset += (usize::from(h[1]) + 1) * 8;
            }
            IPPROTO_AH => {
                // Length in 4-octet units, minus 2 (RFC 4302 §2.2).
                let Some(h) = pkt.read::<[u8; 2]>(offset) else {
                    return Parsed::Other(Counter::PassTruncated);
                };
                next = h[0];
                offset += (usize::from(h[1]) + 2) * 4;
            }
            IPPROTO_FRAGMENT => {
                // 8 bytes; fragment offset in the top 13 bits of bytes 2-3 (RFC 8200 §4.5).
                let Some(h) = pkt.read::<[u8; 8]>(offset) else {
                    return Parsed::Other(Counter::PassTruncated);
                };
                if u16::from_be_bytes([h[2], h[3]]) >> 3 != 0 {
                    return Parsed::Other(Counter::PassFragment);
                }
                next = h[0];
                offset += 8;
            }
            _ => return Parsed::Other(Counter::PassNotTcp),
        }
    }
    if next == IPPROTO_TCP {
        return tcp(pkt, offset, addr);
    }
    Parsed::Other(Counter::PassTooManyHeaders)
}

#[inline(always)]
fn tcp(pkt: &Packet, offset: usize, addr: [u8; 16]) -> Parsed {
    let Some(tcp) = pkt.read::<[u8; TCP_MIN_HLEN]>(offset) else {
        return Parsed::Other(Counter::PassTruncated);
    };
    if usize::from(tcp[12] >> 4) * 4 < TCP_MIN_HLEN {
        return Parsed::Other(Counter::PassMalformed);
    }
    Parsed::Tcp(TcpSegment {
        addr,
        dst_port: u16::from_be_bytes([tcp[2], tcp[3]]),
        flags: tcp[13],
    })
}
