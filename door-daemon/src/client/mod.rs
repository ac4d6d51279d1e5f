//! Who the client is (docs/design.md, "Client key"): the key a request is limited under, the
//! proxies whose forwarding headers are believed, the wire syntax of `X-Forwarded-For` and RFC 7239
//! `Forwarded`, and PROXY protocol v1/v2 on a listener.
//!
//! Pure functions of addresses and header bytes, plus the PROXY protocol reader on an async
//! stream; nothing here knows about limits, the upstream or metrics (a rejected PROXY header is
//! reported to the caller, which counts it).

pub mod credential;
mod forwarded;
pub mod key;
pub mod proxy_protocol;

pub use forwarded::X_FORWARDED_FOR;
pub(crate) use forwarded::forwarded_readable_part;

use std::net::{IpAddr, Ipv4Addr};

use ipnet::IpNet;

/// Whether `ip` is a local or private address: loopback, RFC 1918 private, link-local, shared
/// address space (100.64.0.0/10, RFC 6598), IPv6 unique-local (fc00::/7, RFC 4193) or IPv6
/// link-local. Forwarding headers from such an untrusted peer are ignored and counted (it is
/// likely a proxy missing from `trusted_proxies`), and such a peer is never escalated to the XDP
/// blocklist.
pub fn is_local(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => {
            let [a, b, ..] = v4.octets();
            v4.is_loopback()
                || v4.is_private()
                || v4.is_link_local()
                || (a == 100 && (64..128).contains(&b))
        }
        IpAddr::V6(v6) => v6.is_loopback() || v6.is_unique_local() || v6.is_unicast_link_local(),
    }
}

/// The IPv4 address a NAT64 address embeds (the well-known prefix `64:ff9b::/96`, RFC 6052
/// §2.1), which door keys its client on, as it keys an IPv4 client (`door_common::PrefixKey`).
pub fn nat64_embedded(ip: IpAddr) -> Option<Ipv4Addr> {
    let IpAddr::V6(v6) = ip else { return None };
    let octets = v6.octets();
    let (prefix, embedded) = octets.split_last_chunk::<4>()?;
    (*prefix == [0, 0x64, 0xff, 0x9b, 0, 0, 0, 0, 0, 0, 0, 0]).then(|| Ipv4Addr::from(*embedded))
}

/// Whether the client `ip` is on the list `nets` (`allow`, `deny`): by its address, or by the
/// IPv4 address it embeds as NAT64, under which door keys, limits and shows it (`/clients` lists
/// `64:ff9b::c000:207` as `192.0.2.7/32`, so an operator denies `192.0.2.7`).
pub fn listed(nets: &[IpNet], ip: IpAddr) -> bool {
    let v4 = nat64_embedded(ip).map(IpAddr::V4);
    nets.iter()
        .any(|n| n.contains(&ip) || v4.is_some_and(|v4| n.contains(&v4)))
}

/// Whether `net` is an IPv6 network that covers every IPv4-mapped address (`::ffff:0:0/96`, RFC
/// 4291 §2.5.5.2), `::/8` for one. door keys an IPv4-mapped client as the IPv4 address it maps
/// and never matches an IPv4 address against an IPv6 network ([`listed`]), so such a network
/// lists no IPv4 client; the XDP program, which looks IPv4 sources up in their mapped form, is
/// told so (`door_common::UNLISTED`).
pub fn covers_ipv4_mapped(net: &IpNet) -> bool {
    const MAPPED: std::net::Ipv6Addr = Ipv4Addr::UNSPECIFIED.to_ipv6_mapped();
    matches!(net, IpNet::V6(v6) if v6.prefix_len() <= 96 && v6.contains(&MAPPED))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_nat64_client_is_listed_under_its_ipv4_address_too() {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let nets: Vec<IpNet> = vec!["192.0.2.7/32".parse().unwrap()];
        assert!(listed(&nets, ip("192.0.2.7")));
        assert!(listed(&nets, ip("64:ff9b::c000:207")));
        assert!(!listed(&nets, ip("64:ff9b::c000:208")));
        assert!(!listed(&nets, ip("64:ff9c::c000:207")));
        let v6: Vec<IpNet> = vec!["64:ff9b::/96".parse().unwrap()];
        assert!(listed(&v6, ip("64:ff9b::c000:207")));
        assert!(!listed(&v6, ip("192.0.2.7")));
        assert_eq!(nat64_embedded(ip("192.0.2.7")), None);
    }

    #[test]
    fn ipv6_networks_that_cover_the_mapped_addresses_are_told_apart() {
        let covers = |s: &str| covers_ipv4_mapped(&s.parse().unwrap());
        assert!(covers("::/8"));
        assert!(covers("::/1"));
        assert!(covers("::fffe:0:0/95"));
        assert!(covers("::ffff:0:0/96"));
        assert!(!covers("2001:db8::/32"));
        assert!(!covers("64:ff9b::/96"));
        assert!(!covers("::ffff:0:0/97"));
        assert!(!covers("192.0.2.0/24"));
    }
}
