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

use std::net::IpAddr;

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
