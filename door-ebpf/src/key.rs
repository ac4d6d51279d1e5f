//! The client's prefix key as the program builds it: where the source address lies in the packet
//! ([`Source`]), read where a judgement needs it, and the key in the form the maps take
//! ([`MapKey`]).
//!
//! A key is built on the stack and handed to the map helpers by address; the kernel's hash
//! (`jhash2`) and key comparison then read it in 4- and 8-byte words. Written one byte at a
//! time, as a `[u8; 16]` is, those wider loads cannot be forwarded from the pending narrow stores
//! (a store-forwarding stall: the "Store Forwarding" rules of Intel's 64 and IA-32 Optimization
//! Reference Manual), which cost about 10 ns a lookup on the benchmark's Intel Xeon. [`MapKey`]
//! is written as two 8-byte words instead, which the kernel's loads are forwarded from.

use door_common::{
    PrefixKey,
    list_filter::{lead_v4, lead_v6},
};

use crate::access::Packet;

/// A [`PrefixKey`] as the program's maps take it: the same 16 bytes in memory, held as two
/// native-order words so that building one on the stack takes two 8-byte stores rather than
/// sixteen 1-byte ones.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct MapKey([u64; 2]);

const _: () = assert!(size_of::<MapKey>() == size_of::<PrefixKey>());

impl MapKey {
    /// The key of `key`, byte for byte: each half's 8 bytes as a native-order word.
    #[inline(always)]
    pub(crate) fn new(key: PrefixKey) -> Self {
        let (halves, _) = key.addr.as_chunks::<8>();
        let half = |i: usize| halves.get(i).map_or(0, |h| u64::from_ne_bytes(*h));
        Self([half(0), half(1)])
    }
}

/// Where a datagram's source address lies in the packet. The address is read from the packet
/// where it is needed rather than carried through the parser: a SYN to judge needs only its
/// prefix key, and the exempt trie its whole address only when the operator's lists are set.
#[derive(Clone, Copy)]
pub(crate) struct Source {
    /// Offset of the address from the start of the packet (inside the datagram, checked by the
    /// parser).
    at: usize,
    /// An IPv6 address (16 bytes); otherwise IPv4 (4 bytes).
    v6: bool,
}

impl Source {
    /// The source address of the IPv4 header at offset `header` of the packet (its bytes 12–15).
    #[inline(always)]
    pub(crate) fn ipv4(header: usize) -> Self {
        Self {
            at: header + 12,
            v6: false,
        }
    }

    /// The source address of the IPv6 header at offset `header` of the packet (its bytes 8–23).
    #[inline(always)]
    pub(crate) fn ipv6(header: usize) -> Self {
        Self {
            at: header + 8,
            v6: true,
        }
    }

    /// The address in its 16-byte form (IPv4 as `::ffff:a.b.c.d`), unmasked: the exempt trie's
    /// key. `None` only if the packet no longer holds it, which a parsed packet always does.
    #[inline(always)]
    pub(crate) fn addr(&self, pkt: &Packet) -> Option<[u8; 16]> {
        if self.v6 {
            pkt.read::<16>(self.at)
        } else {
            pkt.read::<4>(self.at).map(|a| PrefixKey::from_ipv4(a).addr)
        }
    }

    /// The source's lead for the lists filter ([`door_common::list_filter`]): an IPv4 address
    /// whole, an IPv6 address's first 64 bits; and whether it is IPv6. `None` as for
    /// [`Source::addr`].
    #[inline(always)]
    pub(crate) fn lead(&self, pkt: &Packet) -> Option<(u64, bool)> {
        if self.v6 {
            pkt.read::<8>(self.at).map(|a| (lead_v6(a), true))
        } else {
            pkt.read::<4>(self.at).map(|a| (lead_v4(a), false))
        }
    }

    /// The source's prefix key (see [`Source::addr`] on `None`): an IPv4 address is built into
    /// its key directly, so only IPv6 pays for [`PrefixKey::from_ipv6`]'s checks.
    #[inline(always)]
    pub(crate) fn key(&self, pkt: &Packet) -> Option<MapKey> {
        if self.v6 {
            pkt.read::<16>(self.at)
                .map(|a| MapKey::new(PrefixKey::from_ipv6(a)))
        } else {
            pkt.read::<4>(self.at)
                .map(|a| MapKey::new(PrefixKey::from_ipv4(a)))
        }
    }
}
