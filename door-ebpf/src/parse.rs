//! Header parsing: Ethernet, up to two VLAN tags (802.1Q, 802.1ad), IPv4 (honouring IHL) or IPv6
//! (walking a bounded number of extension headers), then TCP; reading only through the
//! bounds-checked [`Packet::read`], which yields byte arrays (no enums built from packet bytes).
//! Reads stop at the end of the IP datagram (its total or payload length), so link-layer padding
//! is never parsed as a header.
//!
//! Two shapes an attacker could use to slip a SYN past a parser are reported rather than passed
//! as unparsed: a first fragment too short to hold the TCP header, or, in IPv6, one that ends
//! inside its extension-header chain (RFC 1858 §3.1: the flags would arrive in a later fragment,
//! and the kernel reassembles it), and an IPv6 packet whose extension-header chain is longer than
//! the program walks (the kernel would still deliver it).
//!
//! Sources: IEEE 802.3 (Ethernet II), IEEE 802.1Q (C-tag 0x8100, S-tag 0x88a8), RFC 791 (IPv4),
//! RFC 8200 §4 (IPv6 extension headers), RFC 4302 (AH length), RFC 9293 (TCP), RFC 1858.

use door_common::Counter;

use crate::{
    access::{MAX_OFFSET, Packet},
    key::Source,
};

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
    /// The destination port, host order.
    pub(crate) dst_port: u16,
    /// Offset of the IP header from the start of the packet.
    pub(crate) ip: usize,
    /// Offset of the TCP header from the start of the packet.
    pub(crate) tcp: usize,
    /// The TCP header's length (data offset × 4), bytes.
    pub(crate) tcp_len: usize,
    /// IPv6 (otherwise IPv4).
    pub(crate) v6: bool,
}

impl TcpSegment {
    /// The segment's source address.
    #[inline(always)]
    pub(crate) fn src(&self) -> Source {
        source(self.ip, self.v6)
    }

    /// Whether the segment is bare, read again from `pkt`, the packet it was parsed from: the
    /// TCP header follows a bare IP header (IPv4 without options and not a fragment, or IPv6
    /// without extension headers), the frame holds the whole datagram, and the datagram the
    /// whole TCP header, options included. Only such a SYN is answered with a cookie. Worked out
    /// on the cookie path, which needs it, rather than by the parser for every SYN; `false` when
    /// the IP header cannot be read (unreachable: the parser read it).
    #[inline(always)]
    pub(crate) fn bare(&self, pkt: &Packet) -> bool {
        let (hlen, end) = if self.v6 {
            let Some(ip) = pkt.read::<IPV6_HLEN>(self.ip) else {
                return false;
            };
            let payload = usize::from(u16::from_be_bytes([ip[4], ip[5]]));
            (IPV6_HLEN, self.ip + IPV6_HLEN + payload)
        } else {
            let Some(ip) = pkt.read::<IPV4_MIN_HLEN>(self.ip) else {
                return false;
            };
            // More fragments: a first fragment (a later one is never parsed as a segment).
            if u16::from_be_bytes([ip[6], ip[7]]) & 0x2000 != 0 {
                return false;
            }
            (
                IPV4_MIN_HLEN,
                self.ip + usize::from(u16::from_be_bytes([ip[2], ip[3]])),
            )
        };
        let datagram = pkt.limited_to(end);
        // Options that go on past the datagram's end are no options the kernel would read: it
        // drops such a segment.
        self.tcp == self.ip + hlen
            && datagram.frame_holds_datagram()
            && !datagram.datagram_ends_before(self.tcp + self.tcp_len)
    }
}

/// What the parser found.
pub(crate) enum Parsed {
    /// A TCP SYN (SYN set, ACK clear: a connection opening; a SYN-ACK is the other side's
    /// answer) whose fixed header is entirely inside the datagram. Any other TCP segment is
    /// `Other(Counter::PassNotSyn)`.
    Syn(TcpSegment),
    /// A TCP first fragment too short to hold the TCP header: its flags are unknown. The
    /// destination port, when its first 4 bytes are present.
    TinyFragment {
        /// The source address.
        src: Source,
        /// The destination port, if the fragment carries it.
        dst_port: Option<u16>,
    },
    /// An IPv6 packet whose extension headers go on past [`MAX_EXT_HEADERS`] or [`MAX_OFFSET`]:
    /// whether it is a SYN is unknown.
    Unwalkable {
        /// The source address.
        src: Source,
    },
    /// Anything else, with the pass counter it is recorded under.
    Other(Counter),
}

/// Parses `pkt` down to its TCP header.
#[inline(always)]
pub(crate) fn parse(pkt: &Packet) -> Parsed {
    let Some(eth) = pkt.read::<ETH_HLEN>(0) else {
        return Parsed::Other(Counter::PassTruncated);
    };
    let mut ethertype = u16::from_be_bytes([eth[12], eth[13]]);
    let mut offset = ETH_HLEN;
    for _ in 0..MAX_VLAN_TAGS {
        if ethertype != ETHERTYPE_8021Q && ethertype != ETHERTYPE_8021AD {
            break;
        }
        // TCI (2 bytes), then the encapsulated EtherType.
        let Some(tag) = pkt.read::<VLAN_HLEN>(offset) else {
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
    let Some(ip) = pkt.read::<IPV4_MIN_HLEN>(offset) else {
        return Parsed::Other(Counter::PassTruncated);
    };
    let ihl = usize::from(ip[0] & 0x0f) * 4;
    let total = usize::from(u16::from_be_bytes([ip[2], ip[3]]));
    if ip[0] >> 4 != 4 || ihl < IPV4_MIN_HLEN || total < ihl {
        return Parsed::Other(Counter::PassMalformed);
    }
    if ip[9] != IPPROTO_TCP {
        return Parsed::Other(Counter::PassNotTcp);
    }
    // Fragment offset (13 bits): non-zero means a later fragment, which has no TCP header. A
    // first fragment (offset 0, more-fragments set) carries the TCP header and is judged.
    let frag = u16::from_be_bytes([ip[6], ip[7]]);
    if frag & 0x1fff != 0 {
        return Parsed::Other(Counter::PassFragment);
    }
    let first_fragment = frag & 0x2000 != 0;
    let pkt = pkt.limited_to(offset + total);
    let at = L3 {
        ip: offset,
        v6: false,
    };
    tcp(&pkt, offset + ihl, first_fragment, at)
}

#[inline(always)]
fn ipv6(pkt: &Packet, offset: usize) -> Parsed {
    let Some(ip) = pkt.read::<IPV6_HLEN>(offset) else {
        return Parsed::Other(Counter::PassTruncated);
    };
    if ip[0] >> 4 != 6 {
        return Parsed::Other(Counter::PassMalformed);
    }
    // Payload length 0 means a jumbogram (RFC 2675), whose length is in a hop-by-hop option: no
    // bound from the header. Without a hop-by-hop header it is no jumbogram, and the kernel trims
    // the packet to its fixed header (`ip6_rcv_core`).
    let payload = usize::from(u16::from_be_bytes([ip[4], ip[5]]));
    let pkt = if payload == 0 && ip[6] == IPPROTO_HOPOPTS {
        *pkt
    } else {
        pkt.limited_to(offset + IPV6_HLEN + payload)
    };
    let pkt = &pkt;
    let src = Source::ipv6(offset);
    let mut next = ip[6];
    let ip_at = offset;
    let mut offset = offset + IPV6_HLEN;
    let mut first_fragment = false;
    for _ in 0..MAX_EXT_HEADERS {
        if offset > MAX_OFFSET {
            return Parsed::Unwalkable { src };
        }
        match next {
            IPPROTO_TCP => {
                let at = L3 {
                    ip: ip_at,
                    v6: true,
                };
                return tcp(pkt, offset, first_fragment, at);
            }
            IPPROTO_HOPOPTS | IPPROTO_ROUTING | IPPROTO_DSTOPTS => {
                // Next header, length in 8-octet units not counting the first 8 (RFC 8200 §4.3).
                let Some(h) = pkt.read::<2>(offset) else {
                    return cut_chain(pkt, offset, src, first_fragment);
                };
                next = h[0];
                offset += (usize::from(h[1]) + 1) * 8;
            }
            IPPROTO_AH => {
                // Length in 4-octet units, minus 2 (RFC 4302 §2.2).
                let Some(h) = pkt.read::<2>(offset) else {
                    return cut_chain(pkt, offset, src, first_fragment);
                };
                next = h[0];
                offset += (usize::from(h[1]) + 2) * 4;
            }
            IPPROTO_FRAGMENT => {
                // 8 bytes; fragment offset in the top 13 bits of bytes 2-3 (RFC 8200 §4.5).
                let Some(h) = pkt.read::<8>(offset) else {
                    return Parsed::Other(Counter::PassTruncated);
                };
                let frag = u16::from_be_bytes([h[2], h[3]]);
                if frag >> 3 != 0 {
                    return Parsed::Other(Counter::PassFragment);
                }
                first_fragment = frag & 1 != 0;
                next = h[0];
                offset += 8;
            }
            _ => return Parsed::Other(Counter::PassNotTcp),
        }
    }
    if next == IPPROTO_TCP && offset <= MAX_OFFSET {
        let at = L3 {
            ip: ip_at,
            v6: true,
        };
        return tcp(pkt, offset, first_fragment, at);
    }
    Parsed::Unwalkable { src }
}

/// An IPv6 extension header at `offset` that cannot be read. In a first fragment whose datagram
/// ends there, the rest of the chain, and the TCP header with its flags, come in a later fragment
/// that the kernel reassembles with it (Linux does not discard such a first fragment, although RFC
/// 8200 §4.5 says the first fragment carries the whole chain): a tiny fragment, as in [`tcp`].
/// Otherwise the frame is merely cut short of its datagram, and the kernel drops it too.
#[inline(always)]
fn cut_chain(pkt: &Packet, offset: usize, src: Source, first_fragment: bool) -> Parsed {
    if first_fragment && pkt.datagram_ends_before(offset + 2) {
        return Parsed::TinyFragment {
            src,
            dst_port: None,
        };
    }
    Parsed::Other(Counter::PassTruncated)
}

/// Where the IP header of a segment is, and its version.
#[derive(Clone, Copy)]
struct L3 {
    ip: usize,
    v6: bool,
}

impl L3 {
    /// The datagram's source address.
    #[inline(always)]
    fn src(&self) -> Source {
        source(self.ip, self.v6)
    }
}

/// The source address of the IP header at offset `ip`, IPv6 or IPv4.
#[inline(always)]
fn source(ip: usize, v6: bool) -> Source {
    if v6 {
        Source::ipv6(ip)
    } else {
        Source::ipv4(ip)
    }
}

/// The TCP header at `offset`; `first_fragment` when the datagram is the first of several, in
/// which case a header cut short is a tiny fragment rather than a truncated packet.
#[inline(always)]
fn tcp(pkt: &Packet, offset: usize, first_fragment: bool, at: L3) -> Parsed {
    let Some(tcp) = pkt.read::<TCP_MIN_HLEN>(offset) else {
        // A datagram that says it ends inside the TCP header is a tiny fragment; a frame cut short
        // of its datagram is merely truncated (the kernel drops it too).
        if first_fragment && pkt.datagram_ends_before(offset + TCP_MIN_HLEN) {
            let dst_port = pkt
                .read::<4>(offset)
                .map(|p| u16::from_be_bytes([p[2], p[3]]));
            return Parsed::TinyFragment {
                src: at.src(),
                dst_port,
            };
        }
        return Parsed::Other(Counter::PassTruncated);
    };
    let tcp_len = usize::from(tcp[12] >> 4) * 4;
    if tcp_len < TCP_MIN_HLEN {
        return Parsed::Other(Counter::PassMalformed);
    }
    // Only a SYN is judged: any other segment is counted as such without building the rest.
    let flags = tcp[13];
    if flags & TCP_SYN == 0 || flags & TCP_ACK != 0 {
        return Parsed::Other(Counter::PassNotSyn);
    }
    Parsed::Syn(TcpSegment {
        dst_port: u16::from_be_bytes([tcp[2], tcp[3]]),
        ip: at.ip,
        tcp: offset,
        tcp_len,
        v6: at.v6,
    })
}
