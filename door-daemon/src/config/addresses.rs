//! Checks across the addresses door binds and calls: two `listen` entries that are the same
//! socket, an `admin_listen` on a `listen` socket, an `upstream` that is one of door's own
//! listeners. Each would pass every key's own check and then fail at start with "address already
//! in use" (exit 1, restarted by systemd in a loop), or, for the upstream, send every request
//! back into door until a limit stopped it.

use std::net::{IpAddr, Ipv6Addr, SocketAddr};

use super::{AdminListen, ConfigError, Upstream, invalid};

/// Whether a socket bound to `a` and one bound to `b` would claim the same port: the same port
/// (not 0, which the kernel picks) and the same address, or the unspecified address of the same
/// family on one side. `[::]` and an IPv4 address on one port are different sockets: door binds
/// `[::]` with `IPV6_V6ONLY` then ([`super::Config::binds_v6_only`]), so both bind whatever
/// `net.ipv6.bindv6only` says.
fn same_socket(a: SocketAddr, b: SocketAddr) -> bool {
    a.port() != 0
        && a.port() == b.port()
        && (a.ip() == b.ip()
            || (a.is_ipv4() == b.is_ipv4() && (a.ip().is_unspecified() || b.ip().is_unspecified())))
}

/// Whether door binds `addr` with `IPV6_V6ONLY`, `tcp` being every TCP address door binds
/// (the `listen` entries and a TCP `admin_listen`): `addr` is the IPv6 wildcard `[::]:P` and
/// an IPv4 address of `tcp` has port `P` (see [`super::Config::binds_v6_only`]).
pub(super) fn binds_v6_only(addr: SocketAddr, tcp: impl IntoIterator<Item = SocketAddr>) -> bool {
    addr.port() != 0
        && addr.ip() == IpAddr::V6(Ipv6Addr::UNSPECIFIED)
        && tcp
            .into_iter()
            .any(|a| a.is_ipv4() && a.port() == addr.port())
}

/// Whether a connection to `upstream` (the host as written, `port` its port) would reach a
/// listener bound to `listen` (IPv6 only with `v6_only`, [`binds_v6_only`]): the same port,
/// and the host is the listener's address, or the listener is on an unspecified address and
/// the host is a loopback or unspecified address (or `localhost`, `localhost.`, an IPv4-mapped
/// spelling) it accepts: `0.0.0.0` IPv4
/// ones, `[::]` IPv6 ones, and IPv4 ones too unless it is bound IPv6-only (it accepts them
/// where the kernel allows it). A name other than `localhost` is not resolved (nor the legacy
/// numeric forms `inet_aton(3)` accepts, `127.1` or `2130706433`), and an address of this
/// machine's that the listener covers through its wildcard is not known here: none is refused
/// (such a loop ends at `max_connections_per_client`).
fn reaches(host: &str, port: u16, listen: SocketAddr, v6_only: bool) -> bool {
    if listen.port() == 0 || port != listen.port() {
        return false;
    }
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    // `localhost` (`localhost.` fully qualified) resolves to either loopback address.
    if host.eq_ignore_ascii_case("localhost") || host.eq_ignore_ascii_case("localhost.") {
        return ["127.0.0.1", "[::1]"]
            .into_iter()
            .any(|ip| reaches(ip, port, listen, v6_only));
    }
    let ip = if let Ok(ip) = host.parse::<IpAddr>() {
        // An IPv4-mapped address connects to the IPv4 address it maps.
        ip.to_canonical()
    } else {
        // A name door does not resolve here: it may well be another machine.
        return false;
    };
    if listen.ip().is_unspecified() {
        let family = if listen.is_ipv6() {
            ip.is_ipv6() || !v6_only
        } else {
            ip.is_ipv4()
        };
        (ip.is_loopback() || ip.is_unspecified()) && family
    } else {
        let unmapped = |ip: IpAddr| match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
            v4 @ IpAddr::V4(_) => v4,
        };
        unmapped(ip) == unmapped(listen.ip())
    }
}

/// Checks `listen` (each entry with its key, `listen[i]`), `admin_listen` and `upstream`
/// against each other.
///
/// # Errors
///
/// [`ConfigError::Invalid`] naming an IPv4-mapped IPv6 address (`[::ffff:127.0.0.1]:8443`:
/// whether it claims the IPv4 address depends on the socket's `IPV6_V6ONLY`), the later of two
/// `listen` entries on the same socket, `admin_listen` on a `listen` socket, or `upstream` when
/// it is one of door's listeners.
pub(super) fn check(
    listen: &[(String, SocketAddr)],
    admin: Option<&AdminListen>,
    upstream: &Upstream,
) -> Result<(), ConfigError> {
    let admin_tcp = admin
        .and_then(AdminListen::tcp)
        .map(|a| ("admin_listen".to_owned(), a));
    for (key, addr) in listen.iter().chain(admin_tcp.iter()) {
        if let IpAddr::V6(v6) = addr.ip()
            && let Some(v4) = v6.to_ipv4_mapped()
        {
            return Err(invalid(
                key.as_str(),
                format!("{:?}", addr.to_string()),
                format!(
                    "is an IPv4-mapped IPv6 address: write the IPv4 address ({})",
                    SocketAddr::from((v4, addr.port()))
                ),
            ));
        }
    }
    for (i, (key, addr)) in listen.iter().enumerate() {
        if let Some((other, _)) = listen.iter().take(i).find(|(_, a)| same_socket(*a, *addr)) {
            return Err(invalid(
                key.as_str(),
                format!("{:?}", addr.to_string()),
                format!("is the same socket as {other}"),
            ));
        }
    }
    if let Some((_, admin)) = &admin_tcp
        && let Some((other, _)) = listen.iter().find(|(_, a)| same_socket(*a, *admin))
    {
        return Err(invalid(
            "admin_listen",
            format!("{:?}", admin.to_string()),
            format!("is the same socket as {other}: give the admin listener a port of its own"),
        ));
    }
    let host = upstream.authority.host();
    let port = upstream.authority.port_u16().unwrap_or(80);
    let tcp = || listen.iter().chain(admin_tcp.iter()).map(|(_, a)| *a);
    if let Some((other, _)) = listen
        .iter()
        .find(|(_, a)| reaches(host, port, *a, binds_v6_only(*a, tcp())))
    {
        return Err(invalid(
            "upstream",
            format!("{:?}", upstream.to_string()),
            format!("is door's own {other}: every request would come back into door"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{binds_v6_only, reaches, same_socket};

    fn a(s: &str) -> std::net::SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn sockets_overlap_on_the_same_port_and_address_or_a_wildcard_of_the_family() {
        assert!(same_socket(a("127.0.0.1:8443"), a("127.0.0.1:8443")));
        assert!(same_socket(a("0.0.0.0:8443"), a("127.0.0.1:8443")));
        assert!(same_socket(a("[::1]:8443"), a("[::]:8443")));
        assert!(!same_socket(a("[::]:8443"), a("0.0.0.0:8443")));
        assert!(!same_socket(a("127.0.0.1:8443"), a("127.0.0.2:8443")));
        assert!(!same_socket(a("127.0.0.1:8443"), a("127.0.0.1:8444")));
        assert!(!same_socket(a("127.0.0.1:0"), a("127.0.0.1:0")));
    }

    #[test]
    fn an_upstream_reaches_a_listener_on_its_address_or_a_wildcard() {
        assert!(reaches("127.0.0.1", 8443, a("[::]:8443"), false));
        assert!(reaches("localhost", 8443, a("0.0.0.0:8443"), false));
        assert!(reaches("[::1]", 8443, a("[::1]:8443"), false));
        assert!(reaches("192.0.2.1", 8443, a("192.0.2.1:8443"), false));
        assert!(reaches(
            "[::ffff:192.0.2.1]",
            8443,
            a("192.0.2.1:8443"),
            false
        ));
        assert!(!reaches("192.0.2.1", 8443, a("[::]:8443"), false));
        // An application on [::1]:8443 and door on 0.0.0.0:8443 both bind.
        assert!(!reaches("[::1]", 8443, a("0.0.0.0:8443"), false));
        assert!(reaches("[::1]", 8443, a("[::]:8443"), false));
        assert!(!reaches("127.0.0.1", 3000, a("[::]:8443"), false));
        assert!(!reaches("app.internal", 8443, a("[::]:8443"), false));
        assert!(!reaches("127.0.0.1", 0, a("127.0.0.1:0"), false));
        // Bound IPv6-only (an IPv4 listener of door's shares the port), `[::]` takes no IPv4.
        assert!(!reaches("127.0.0.1", 8443, a("[::]:8443"), true));
        assert!(reaches("[::1]", 8443, a("[::]:8443"), true));
        // Other spellings of loopback: mapped, and a fully qualified localhost.
        assert!(reaches("[::ffff:127.0.0.1]", 8443, a("[::]:8443"), false));
        assert!(reaches(
            "[::ffff:127.0.0.1]",
            8443,
            a("0.0.0.0:8443"),
            false
        ));
        assert!(reaches("localhost.", 8443, a("0.0.0.0:8443"), false));
        assert!(reaches("localhost", 8443, a("[::1]:8443"), false));
        assert!(!reaches("[::ffff:127.0.0.1]", 8443, a("[::]:8443"), true));
    }

    #[test]
    fn the_ipv6_wildcard_is_ipv6_only_beside_an_ipv4_address_on_its_port() {
        let on = |addr: &str, tcp: &[&str]| binds_v6_only(a(addr), tcp.iter().map(|t| a(t)));
        assert!(on("[::]:8443", &["[::]:8443", "0.0.0.0:8443"]));
        assert!(on("[::]:8443", &["192.0.2.1:8443"]));
        assert!(!on(
            "[::]:8443",
            &["[::]:8443", "0.0.0.0:8444", "[::1]:8443"]
        ));
        assert!(!on("[::1]:8443", &["127.0.0.1:8443"]));
        assert!(!on("0.0.0.0:8443", &["[::]:8443", "0.0.0.0:8443"]));
        // Port 0 is the kernel's pick: never the same port.
        assert!(!on("[::]:0", &["0.0.0.0:0"]));
    }
}
