//! Cookie mode's answer (docs/design.md, "Flood shield", SYN cookies; RFC 4987 §3.6): a SYN that
//! passed every other check while this CPU is in cookie mode is rewritten in place into the
//! SYN-ACK the kernel would send with a SYN cookie, and sent back out of the interface it came in
//! on (`XDP_TX`). No state is kept per SYN.
//!
//! The cookie, and the MSS it encodes, come from the kernel (`bpf_tcp_gen_syncookie` for the
//! listening socket `bpf_skc_lookup_tcp` finds), computed with the kernel's own secret, so the
//! client's ACK is validated by the listener's usual path (`cookie_v4_check`, `cookie_v6_check`).
//! The helper parses the SYN's options itself (the MSS; anything malformed is skipped as the
//! kernel skips it).
//!
//! What the SYN-ACK carries (RFC 9293 §3.1): the ports and addresses swapped, `seq` = the cookie,
//! `ack` = the SYN's `seq` + 1, SYN|ACK, the window the kernel's initial receive window gives
//! (10 segments, fewer above an MSS of 1460; at most 65,535), and one option, the MSS, when the
//! SYN's TCP header had room for options (any SYN with options; every real stack sends one). No
//! window scale, SACK or timestamps: the kernel's cookie only carries those inside the timestamp
//! option, whose value also depends on a per-connection secret offset (`secure_tcp_ts_off`) that
//! the program cannot compute; without a timestamp in the SYN-ACK the client's ACK carries none,
//! and the kernel then builds the connection without them, as it does for its own cookies.
//!
//! Only a SYN the kernel would answer itself is answered: one without a group Ethernet address
//! either way, between unicast addresses that are not martians, that the kernel's routes deliver
//! to this host rather than forward (`bpf_fib_lookup`; on an interface that does not forward,
//! the lookup cannot tell, and a SYN for another host's address that reached this one is
//! answered as before), whose frame holds its datagram and whose datagram holds its TCP header,
//! options included, and, in IPv4, with a correct header checksum. A unicast frame for another
//! station's MAC address (promiscuous mode) is not told apart. The TCP checksum is not verified: a frame from a sender
//! on this host (over a veth pair, say) may carry only the pseudo-header's sum, which the kernel
//! accepts (`CHECKSUM_PARTIAL`); a segment whose checksum is wrong costs the sender as much as a
//! correct one, and its SYN-ACK answers an address the SYN named either way.
//!
//! Headers: the Ethernet addresses swapped and any VLAN tags kept as they were; IPv4 (only
//! without options and unfragmented) rewritten with DF, TTL 64, its checksum (RFC 791, RFC 1071);
//! IPv6 (only without extension headers) with hop limit 64 and no flow label; the TCP checksum
//! over the pseudo-header (RFC 9293 §3.1, RFC 8200 §8.1). The frame is then cut to the new
//! datagram's end (`bpf_xdp_adjust_tail`).
//!
//! Stack: the BPF stack holds 512 bytes for the whole call chain. The lookup tuple and the
//! header copies live in the per-CPU scratch map ([`crate::DOOR_SCRATCH`]), and the packet is
//! written 4 bytes at a time, so this function's own frame stays small.

use core::mem::offset_of;

use door_common::Counter;

use crate::{
    DOOR_SCRATCH,
    access::{CookieError, CookieScratch, MapValue, Packet},
    parse::TcpSegment,
};

/// SYN | ACK flags byte (RFC 9293 §3.1).
const SYN_ACK: u8 = 0x12;
/// TTL / hop limit of the SYN-ACK: the kernel's default (`net.ipv4.ip_default_ttl`).
const HOP_LIMIT: u8 = 64;
/// IP protocol number of TCP.
const IPPROTO_TCP: u8 = 6;
/// Byte offsets of the copies inside [`CookieScratch`].
const TUPLE: usize = offset_of!(CookieScratch, tuple);
const IP: usize = offset_of!(CookieScratch, ip);
const TCP: usize = offset_of!(CookieScratch, tcp);
/// The kernel's initial receive window, in segments (`TCP_DEFAULT_INIT_RCVWND`).
const INIT_RCVWND: u32 = 10;

/// Answers the SYN `seg` of `pkt` with a SYN-ACK carrying a SYN cookie (see the module docs):
/// [`Counter::TxSynCookie`] when the packet now holds it, otherwise the pass counter saying why
/// not (the packet is then unchanged). Not inlined: its frame comes on top of the entry point's,
/// and sharing one frame would put both within the 512 bytes at once.
#[inline(never)]
pub(crate) fn answer(pkt: &Packet, seg: &TcpSegment) -> Counter {
    if !seg.bare(pkt) {
        return Counter::PassCookieUnavailable;
    }
    let Some(scratch) = MapValue::in_per_cpu_array(&DOOR_SCRATCH, 0) else {
        return Counter::PassCookieUnavailable;
    };
    let ip_words = if seg.v6 { 10 } else { 5 };
    if !copy_words(pkt, seg.ip, ip_words, &scratch, IP)
        || !copy_words(pkt, seg.tcp, seg.tcp_len / 4, &scratch, TCP)
    {
        return Counter::PassTruncated;
    }
    if !seg.v6 && fold(sum_words(&scratch, IP, 5)) != 0 {
        return Counter::PassMalformed;
    }
    if !unicast_macs(pkt) || !answerable(&scratch, seg.v6) || !pkt.delivered_here(&scratch, seg.v6)
    {
        return Counter::PassCookieUnavailable;
    }
    // The tuple: the SYN's source and destination addresses, then its ports.
    let ports = scratch.load_u32(TCP);
    let addr_words = if seg.v6 { 8 } else { 2 };
    // IPv4 addresses start at byte 12 of the header (word 3), IPv6 ones at byte 8 (word 2).
    let addr_at = if seg.v6 { IP + 8 } else { IP + 12 };
    for i in 0..8 {
        if i < addr_words {
            scratch.store_u32(TUPLE + 4 * i, scratch.load_u32(addr_at + 4 * i));
        }
    }
    scratch.store_u32(TUPLE + 4 * addr_words, ports);
    let (cookie, mss) = match pkt.syn_cookie(&scratch, seg.v6) {
        Ok(c) => c,
        Err(CookieError::NoListener) => return Counter::PassNoListener,
        Err(CookieError::Declined) => return Counter::PassCookieDeclined,
    };
    if write_syn_ack(pkt, seg, &scratch, cookie, mss) {
        Counter::TxSynCookie
    } else {
        Counter::PassTruncated
    }
}

/// Whether the frame came to this host alone from a station: its Ethernet destination is not a
/// group address (broadcast or multicast: the low bit of the first octet, IEEE 802-2014 §8.2),
/// nor its source, which the SYN-ACK goes back to. The kernel answers only a frame addressed to
/// the host (`PACKET_HOST`).
#[inline(always)]
fn unicast_macs(pkt: &Packet) -> bool {
    let (Some([dst, ..]), Some([src, ..])) = (pkt.read::<1>(0), pkt.read::<1>(6)) else {
        return false;
    };
    dst & 1 == 0 && src & 1 == 0
}

/// Whether the kernel would answer a SYN between these addresses (the copies in `scratch`):
/// neither is multicast or the same as the other; an IPv4 source and destination in none of
/// 0/8, 127/8, 224/4 (multicast), 240/4 (class E and the limited broadcast), which the kernel
/// treats as martians or refuses to answer (`ip_route_input_slow`, `tcp_v4_conn_request`); IPv6
/// addresses that are not `::`, `::1` or IPv4-mapped, which `tcp_v6_conn_request` and
/// `ip6_rcv_core` drop. Whether the destination is this host's is not told here (see
/// [`crate::access::Packet::delivered_here`]).
#[inline(always)]
fn answerable(scratch: &MapValue<CookieScratch>, v6: bool) -> bool {
    if v6 {
        let (s0, s1, s2, s3) = (
            be(scratch, IP + 8),
            be(scratch, IP + 12),
            be(scratch, IP + 16),
            be(scratch, IP + 20),
        );
        let (d0, d1, d2, d3) = (
            be(scratch, IP + 24),
            be(scratch, IP + 28),
            be(scratch, IP + 32),
            be(scratch, IP + 36),
        );
        // `::`, `::1` and IPv4-mapped addresses, either way.
        let special = |a0: u32, a1: u32, a2: u32, a3: u32| {
            a0 == 0 && a1 == 0 && ((a2 == 0 && a3 <= 1) || a2 == 0x0000_ffff)
        };
        let same = (s0, s1, s2, s3) == (d0, d1, d2, d3);
        s0 >> 24 != 0xff
            && d0 >> 24 != 0xff
            && !special(s0, s1, s2, s3)
            && !special(d0, d1, d2, d3)
            && !same
    } else {
        let (src, dst) = (be(scratch, IP + 12), be(scratch, IP + 16));
        let martian = |a: u32| a >> 28 >= 0xe || a >> 24 == 0 || a >> 24 == 127;
        !martian(src) && !martian(dst) && src != dst
    }
}

/// The one's-complement sum (RFC 1071, not yet folded) of `words` (at most 16) 4-byte words of
/// the scratch value at `at`.
#[inline(always)]
fn sum_words(scratch: &MapValue<CookieScratch>, at: usize, words: usize) -> u32 {
    let mut acc = 0;
    for i in 0..16 {
        if i >= words {
            break;
        }
        acc = add32(acc, be(scratch, at + 4 * i));
    }
    acc
}

/// Copies `words` (at most 16) 4-byte words of the packet at `from` to the scratch value at
/// `to`; `false` if the packet ends first.
#[inline(always)]
fn copy_words(
    pkt: &Packet,
    from: usize,
    words: usize,
    scratch: &MapValue<CookieScratch>,
    to: usize,
) -> bool {
    for i in 0..16 {
        if i >= words {
            break;
        }
        let Some(word) = pkt.read::<4>(from + 4 * i) else {
            return false;
        };
        scratch.store_u32(to + 4 * i, u32::from_ne_bytes(word));
    }
    true
}

/// The scratch word at `offset` as the big-endian number its bytes spell.
#[inline(always)]
fn be(scratch: &MapValue<CookieScratch>, offset: usize) -> u32 {
    u32::from_be_bytes(scratch.load_u32(offset).to_ne_bytes())
}

/// Adds a 32-bit word to a one's-complement sum as its two 16-bit halves (RFC 1071).
#[inline(always)]
fn add32(acc: u32, word: u32) -> u32 {
    acc + (word >> 16) + (word & 0xffff)
}

/// Folds a one's-complement sum and complements it: the checksum field's value.
#[inline(always)]
fn fold(acc: u32) -> u16 {
    let a = (acc & 0xffff) + (acc >> 16);
    let a = (a & 0xffff) + (a >> 16);
    #[expect(
        clippy::cast_possible_truncation,
        reason = "folded twice: at most 16 bits remain"
    )]
    !(a as u16)
}

/// The window of the SYN-ACK: the kernel's initial receive window for `mss`
/// (`tcp_select_initial_window`: 10 segments, or at least 2 segments of 14,600 bytes above an
/// MSS of 1460), at most 65,535 bytes since no window scale is offered.
#[inline(always)]
fn window(mss: u16) -> u16 {
    let mss = u32::from(mss.max(1));
    let segments = if mss > 1460 {
        (1460 * INIT_RCVWND / mss).max(2)
    } else {
        INIT_RCVWND
    };
    u16::try_from(segments * mss).unwrap_or(u16::MAX)
}

/// Writes the SYN-ACK over the SYN (see the module docs) from the header copies in `scratch`;
/// `false` if a write fell outside the packet (then the packet may be partly rewritten, and is
/// passed: the kernel drops what it cannot parse or checksum).
#[inline(always)]
fn write_syn_ack(
    pkt: &Packet,
    seg: &TcpSegment,
    scratch: &MapValue<CookieScratch>,
    cookie: u32,
    mss: u16,
) -> bool {
    let with_mss = seg.tcp_len >= 24;
    let tcp_len: u16 = if with_mss { 24 } else { 20 };
    // TCP: the ports swapped, seq = cookie, ack = the SYN's seq + 1.
    let ports = be(scratch, TCP).rotate_left(16);
    let ack = be(scratch, TCP + 4).wrapping_add(1);
    let flags =
        (u32::from(tcp_len / 4) << 28) | (u32::from(SYN_ACK) << 16) | u32::from(window(mss));
    let option = 0x0204_0000 | u32::from(mss);
    // The pseudo-header: both addresses (their sum is the same in either order), the protocol
    // and the TCP length (RFC 9293 §3.1; RFC 8200 §8.1 for IPv6).
    let mut addrs = 0;
    let (addr_at, addr_words) = if seg.v6 { (IP + 8, 8) } else { (IP + 12, 2) };
    for i in 0..8 {
        if i < addr_words {
            addrs = add32(addrs, be(scratch, addr_at + 4 * i));
        }
    }
    let mut acc = add32(add32(add32(add32(addrs, ports), cookie), ack), flags);
    if with_mss {
        acc = add32(acc, option);
    }
    acc += u32::from(IPPROTO_TCP) + u32::from(tcp_len);
    let check = fold(acc);
    let t = seg.tcp;
    let tcp_ok = pkt.write(t, ports.to_be_bytes())
        && pkt.write(t + 4, cookie.to_be_bytes())
        && pkt.write(t + 8, ack.to_be_bytes())
        && pkt.write(t + 12, flags.to_be_bytes())
        && pkt.write(t + 16, (u32::from(check) << 16).to_be_bytes())
        && (!with_mss || pkt.write(t + 20, option.to_be_bytes()));
    let ip_ok = if seg.v6 {
        write_ipv6(pkt, seg.ip, scratch, tcp_len)
    } else {
        write_ipv4(pkt, seg.ip, scratch, addrs, tcp_len)
    };
    if !(tcp_ok && ip_ok && swap_macs(pkt)) {
        return false;
    }
    // Cut off the SYN's other options, any payload and padding. Failing to cut leaves them
    // after the datagram's end, where the receiver ignores them.
    let _ = (*pkt).truncate(seg.tcp + usize::from(tcp_len));
    true
}

/// Swaps the Ethernet destination and source addresses (VLAN tags after them stay as they are).
#[inline(always)]
fn swap_macs(pkt: &Packet) -> bool {
    let (Some(dst), Some(src)) = (pkt.read::<6>(0), pkt.read::<6>(6)) else {
        return false;
    };
    pkt.write(0, src) && pkt.write(6, dst)
}

/// Rewrites the IPv6 header at `ip` for a SYN-ACK with a TCP header of `tcp_len` bytes: version
/// 6, no traffic class or flow label, hop limit 64, the addresses swapped.
#[inline(always)]
fn write_ipv6(pkt: &Packet, ip: usize, scratch: &MapValue<CookieScratch>, tcp_len: u16) -> bool {
    let [l0, l1] = tcp_len.to_be_bytes();
    let mut ok =
        pkt.write(ip, [0x60, 0, 0, 0]) && pkt.write(ip + 4, [l0, l1, IPPROTO_TCP, HOP_LIMIT]);
    // Source (bytes 8..24) ← the SYN's destination (24..40), and the other way round.
    for i in 0..4 {
        ok = ok
            && pkt.write(ip + 8 + 4 * i, be(scratch, IP + 24 + 4 * i).to_be_bytes())
            && pkt.write(ip + 24 + 4 * i, be(scratch, IP + 8 + 4 * i).to_be_bytes());
    }
    ok
}

/// Rewrites the IPv4 header (no options) at `ip` for a SYN-ACK with a TCP header of `tcp_len`
/// bytes: no TOS, identification 0 with DF, TTL 64, the addresses swapped, the header checksum.
/// `addrs` is the one's-complement sum of the two addresses.
#[inline(always)]
fn write_ipv4(
    pkt: &Packet,
    ip: usize,
    scratch: &MapValue<CookieScratch>,
    addrs: u32,
    tcp_len: u16,
) -> bool {
    let first = 0x4500_0000 | u32::from(20 + tcp_len);
    let second = 0x0000_4000;
    let third = (u32::from(HOP_LIMIT) << 24) | (u32::from(IPPROTO_TCP) << 16);
    let check = fold(add32(add32(add32(addrs, first), second), third));
    pkt.write(ip, first.to_be_bytes())
        && pkt.write(ip + 4, u32::to_be_bytes(second))
        && pkt.write(ip + 8, (third | u32::from(check)).to_be_bytes())
        && pkt.write(ip + 12, be(scratch, IP + 16).to_be_bytes())
        && pkt.write(ip + 16, be(scratch, IP + 12).to_be_bytes())
}
