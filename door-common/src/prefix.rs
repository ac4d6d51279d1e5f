//! The source prefix both layers key on: IPv4 /32, IPv6 /64, NAT64 (64:ff9b::/96) and
//! IPv4-mapped IPv6 (::ffff:0:0/96) as their embedded IPv4 /32 (docs/design.md, "Client key").

use core::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// A client's source prefix, 16 bytes in network order.
///
/// An IPv4 /32 is stored as its IPv4-mapped form `::ffff:a.b.c.d`; an IPv6 /64 keeps its first 8
/// bytes and zeroes the last 8. The two never collide: a masked IPv6 prefix has zero bytes 10 and
/// 11, an IPv4 key has `0xff` there. Used as the key of the XDP program's LRU map and of the
/// daemon's per-group limiter tables, so that layer 4 and layer 7 agree on who a client is.
#[repr(C)]
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct PrefixKey {
    /// The masked address, network byte order.
    pub addr: [u8; 16],
}

const _: () = assert!(size_of::<PrefixKey>() == 16);
const _: () = assert!(align_of::<PrefixKey>() == 1);

/// The NAT64 well-known prefix 64:ff9b::/96 (RFC 6052 §2.1), first 12 bytes.
const NAT64_PREFIX: [u8; 12] = [0x00, 0x64, 0xff, 0x9b, 0, 0, 0, 0, 0, 0, 0, 0];
/// The IPv4-mapped prefix ::ffff:0:0/96 (RFC 4291 §2.5.5.2), first 12 bytes.
const MAPPED_PREFIX: [u8; 12] = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff];

impl PrefixKey {
    /// The /32 key of an IPv4 address given as its four octets in network order.
    pub const fn from_ipv4(octets: [u8; 4]) -> Self {
        let mut addr = [0u8; 16];
        addr[10] = 0xff;
        addr[11] = 0xff;
        addr[12] = octets[0];
        addr[13] = octets[1];
        addr[14] = octets[2];
        addr[15] = octets[3];
        Self { addr }
    }

    /// The key of an IPv6 address given as its sixteen octets in network order: the embedded
    /// IPv4 /32 for NAT64 (64:ff9b::/96) and IPv4-mapped (::ffff:0:0/96) addresses, otherwise
    /// the /64 prefix.
    pub const fn from_ipv6(octets: [u8; 16]) -> Self {
        let [
            a0,
            a1,
            a2,
            a3,
            a4,
            a5,
            a6,
            a7,
            a8,
            a9,
            a10,
            a11,
            a12,
            a13,
            a14,
            a15,
        ] = octets;
        let head = [a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11];
        if eq_12(&head, &NAT64_PREFIX) || eq_12(&head, &MAPPED_PREFIX) {
            return Self::from_ipv4([a12, a13, a14, a15]);
        }
        Self {
            addr: [a0, a1, a2, a3, a4, a5, a6, a7, 0, 0, 0, 0, 0, 0, 0, 0],
        }
    }

    /// The key of an address (see [`PrefixKey::from_ipv4`] and [`PrefixKey::from_ipv6`]).
    pub const fn from_ip(ip: IpAddr) -> Self {
        match ip {
            IpAddr::V4(v4) => Self::from_ipv4(v4.octets()),
            IpAddr::V6(v6) => Self::from_ipv6(v6.octets()),
        }
    }

    /// The embedded IPv4 address when this is an IPv4 /32 key.
    pub const fn ipv4(&self) -> Option<Ipv4Addr> {
        let [
            a0,
            a1,
            a2,
            a3,
            a4,
            a5,
            a6,
            a7,
            a8,
            a9,
            a10,
            a11,
            a12,
            a13,
            a14,
            a15,
        ] = self.addr;
        if eq_12(
            &[a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11],
            &MAPPED_PREFIX,
        ) {
            Some(Ipv4Addr::new(a12, a13, a14, a15))
        } else {
            None
        }
    }

    /// The network address of the prefix (an IPv4 address for /32 keys, the /64's first address
    /// otherwise).
    pub const fn network(&self) -> IpAddr {
        match self.ipv4() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(Ipv6Addr::from_bits(u128::from_be_bytes(self.addr))),
        }
    }

    /// The prefix length in bits: 32 for IPv4 keys, 64 for IPv6 keys.
    pub const fn prefix_len(&self) -> u8 {
        if self.ipv4().is_some() { 32 } else { 64 }
    }
}

const fn eq_12(a: &[u8; 12], b: &[u8; 12]) -> bool {
    u128::from_be_bytes(pad_12(a)) == u128::from_be_bytes(pad_12(b))
}

const fn pad_12(a: &[u8; 12]) -> [u8; 16] {
    let [a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11] = *a;
    [a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, 0, 0, 0, 0]
}

impl core::fmt::Display for PrefixKey {
    /// `192.0.2.7/32` or `2001:db8:1:2::/64`.
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "{}/{}", self.network(), self.prefix_len())
    }
}

impl core::fmt::Debug for PrefixKey {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        core::fmt::Display::fmt(self, f)
    }
}

#[cfg(test)]
mod tests {
    extern crate std;
    use std::string::ToString as _;

    use super::*;

    fn key(s: &str) -> PrefixKey {
        PrefixKey::from_ip(s.parse().unwrap())
    }

    #[test]
    fn ipv4_is_a_slash_32() {
        assert_eq!(key("192.0.2.7").ipv4(), Some(Ipv4Addr::new(192, 0, 2, 7)));
        assert_ne!(key("192.0.2.7"), key("192.0.2.8"));
    }

    #[test]
    fn ipv6_is_masked_to_slash_64() {
        assert_eq!(
            key("2001:db8:1:2::1"),
            key("2001:db8:1:2:ffff:ffff:ffff:ffff")
        );
        assert_ne!(key("2001:db8:1:2::1"), key("2001:db8:1:3::1"));
        assert_eq!(key("2001:db8:1:2:abcd::1").to_string(), "2001:db8:1:2::/64");
    }

    #[test]
    fn nat64_and_mapped_key_on_the_embedded_ipv4() {
        assert_eq!(key("64:ff9b::c000:207"), key("192.0.2.7"));
        assert_eq!(key("::ffff:192.0.2.7"), key("192.0.2.7"));
        assert_ne!(key("64:ff9b::c000:207"), key("64:ff9b::c000:208"));
        assert_eq!(key("64:ff9b::c000:207").to_string(), "192.0.2.7/32");
    }

    #[test]
    fn ipv4_and_ipv6_keys_never_collide() {
        // The /64 that contains ::ffff:0:0/96 is ::/64; its key has zero bytes 10..12.
        assert_ne!(key("::ffff:192.0.2.7"), key("::1"));
        assert_eq!(key("::1").prefix_len(), 64);
    }
}
