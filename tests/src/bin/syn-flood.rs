//! A bounded TCP SYN flood for door's tests, benchmark and demos: at most `--count` SYNs, for at
//! most `--seconds`, to one destination, from one source address or from sources rotated across
//! door's prefixes. Needs CAP_NET_RAW; meant for network namespaces a test or a test VM made
//! itself, never for a real network: it refuses any source or destination outside the
//! documentation ranges (192.0.2.0/24, 198.51.100.0/24, 203.0.113.0/24, 2001:db8::/32).
//!
//! Two ways out, IPv4 or IPv6 either way:
//!
//! - by default, a raw IP socket (`IPPROTO_RAW`, so the header is the one built here, with the
//!   source given whatever the interface holds) and the kernel's routing:
//!   `syn-flood --source 192.0.2.66 --target 192.0.2.1:8443 --count 2000 --seconds 10`
//!   (`cargo xtask run --vm`'s demo);
//! - with `--iface` and `--dst-mac`, Ethernet frames written straight onto the interface
//!   (AF_PACKET), past routing and neighbour discovery:
//!   `syn-flood --iface veth-client --dst-mac 02:..:.. --dst 2001:db8:d00::1 --port 8443
//!   --src-prefix 2001:db8:bad:: --prefixes 1 --count 5000 --max-seconds 10`
//!   (the netns flood suite and `xdp-bench --veth`, through `door_tests::netns::SynFlood`).
//!
//! The destination is `--target ADDR:PORT` or, equivalently, `--dst ADDR --port PORT`. Sources
//! are `--source ADDR` (every SYN from it) or `--src-prefix ADDR --prefixes N`: N of door's
//! prefixes from ADDR's on, in turn, IPv6 /64s (the host part rotates within each /64) or IPv4
//! /32s (consecutive addresses). `--max-seconds` is `--seconds`. Every SYN has a new source port.
//!
//! Prints `syn-flood: sent N SYNs from … to … in …s (E send errors)` on stdout and exits
//! non-zero when it could send none.

use std::{
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr},
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};
use clap::{ArgGroup, Parser};
use etherparse::PacketBuilder;

/// Source MAC of the frames written with `--iface` (locally administered).
const SRC_MAC: [u8; 6] = [0x02, 0, 0, 0, 0xba, 0xd0];

/// Bounded SYN flood between documentation-range addresses (see the module docs).
#[derive(Debug, Parser)]
#[command(name = "syn-flood")]
#[command(group(ArgGroup::new("destination").required(true).args(["target", "dst"])))]
#[command(group(ArgGroup::new("sources").required(true).args(["source", "src_prefix"])))]
struct Args {
    /// Destination address and port (`192.0.2.1:8443`, `[2001:db8:d00::1]:8443`).
    #[arg(long)]
    target: Option<SocketAddr>,
    /// Destination address, with `--port`: the same as `--target`.
    #[arg(long, requires = "port")]
    dst: Option<IpAddr>,
    /// Destination port, with `--dst`.
    #[arg(long, requires = "dst")]
    port: Option<u16>,
    /// The one source address written into every SYN.
    #[arg(long)]
    source: Option<IpAddr>,
    /// The first source prefix (its host part is ignored for IPv6): SYNs rotate through
    /// `--prefixes` of door's prefixes (IPv6 /64s, IPv4 /32s) from this one on.
    #[arg(long)]
    src_prefix: Option<IpAddr>,
    /// Distinct prefixes to rotate through, with `--src-prefix`.
    #[arg(long, default_value_t = 1, requires = "src_prefix")]
    prefixes: u64,
    /// Write Ethernet frames onto this interface (AF_PACKET) instead of sending through a raw
    /// IP socket and the routing table; needs `--dst-mac`.
    #[arg(long, requires = "dst_mac")]
    iface: Option<String>,
    /// Destination MAC of the frames, `aa:bb:cc:dd:ee:ff`, with `--iface`.
    #[arg(long, requires = "iface")]
    dst_mac: Option<String>,
    /// SYNs to send at most (failed sends count).
    #[arg(long, default_value_t = 1000)]
    count: u64,
    /// Time bound in seconds, whatever the count.
    #[arg(long, visible_alias = "max-seconds", default_value_t = 10)]
    seconds: u64,
}

/// Where the SYNs come from.
#[derive(Debug, Clone, Copy)]
enum Sources {
    /// Every SYN from this address.
    One(IpAddr),
    /// IPv6: `prefixes` /64s from `base` (host part zero) on, the host part rotating within each.
    V6 { base: u128, prefixes: u64 },
    /// IPv4: `prefixes` consecutive /32s from `base` on.
    V4 { base: u32, prefixes: u64 },
}

impl Sources {
    fn from_args(args: &Args) -> anyhow::Result<Self> {
        let prefixes = args.prefixes.max(1);
        let sources = match (args.source, args.src_prefix) {
            (Some(one), _) => Self::One(one),
            (None, Some(IpAddr::V6(p))) => Self::V6 {
                base: u128::from(p) & !u128::from(u64::MAX),
                prefixes,
            },
            (None, Some(IpAddr::V4(p))) => Self::V4 {
                base: u32::from(p),
                prefixes,
            },
            (None, None) => bail!("--source or --src-prefix is required"),
        };
        // Documentation blocks are contiguous: the first and the last source in one block means
        // every source between them is in it.
        let (first, last) = (sources.nth(0), sources.last()?);
        match (documentation_block(first), documentation_block(last)) {
            (Some(a), Some(b)) if a == b => Ok(sources),
            _ => bail!(
                "syn-flood only sends from documentation-range sources (192.0.2.0/24, \
                 198.51.100.0/24, 203.0.113.0/24, 2001:db8::/32), all in one block: {first} to {last}"
            ),
        }
    }

    /// The source of the `n`th SYN.
    fn nth(self, n: u64) -> IpAddr {
        match self {
            Self::One(ip) => ip,
            Self::V6 { base, prefixes } => {
                let prefix = u128::from(n % prefixes) << 64;
                let host = u128::from(n / prefixes + 1);
                IpAddr::V6(Ipv6Addr::from(base.wrapping_add(prefix) | host))
            }
            Self::V4 { base, prefixes } => {
                let offset = u32::try_from(n % prefixes).unwrap_or(u32::MAX);
                IpAddr::V4(Ipv4Addr::from(base.wrapping_add(offset)))
            }
        }
    }

    /// The last prefix's first source, for the range check.
    fn last(self) -> anyhow::Result<IpAddr> {
        match self {
            Self::One(ip) => Ok(ip),
            Self::V6 { base, prefixes } => base
                .checked_add(u128::from(prefixes - 1) << 64)
                .map(|a| IpAddr::V6(Ipv6Addr::from(a | 1)))
                .context("--prefixes runs past the end of the address space"),
            Self::V4 { base, prefixes } => u32::try_from(prefixes - 1)
                .ok()
                .and_then(|n| base.checked_add(n))
                .map(|a| IpAddr::V4(Ipv4Addr::from(a)))
                .context("--prefixes runs past the end of the address space"),
        }
    }
}

impl std::fmt::Display for Sources {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            Self::One(ip) => write!(f, "{ip}"),
            Self::V6 { base, prefixes } => {
                write!(f, "{prefixes} /64(s) from {}/64", Ipv6Addr::from(base))
            }
            Self::V4 { base, prefixes } => {
                write!(f, "{prefixes} /32(s) from {}", Ipv4Addr::from(base))
            }
        }
    }
}

/// The documentation block `ip` is in (its /24 or the /32 of 2001:db8::), if any.
fn documentation_block(ip: IpAddr) -> Option<u128> {
    match ip {
        IpAddr::V4(v4) => {
            let [a, b, c, _] = v4.octets();
            matches!((a, b, c), (192, 0, 2) | (198, 51, 100) | (203, 0, 113))
                .then(|| u128::from(u32::from(v4) >> 8))
        }
        IpAddr::V6(v6) => (v6.segments()[..2] == [0x2001, 0x0db8]).then_some(0x2001_0db8 << 96),
    }
}

fn parse_mac(s: &str) -> anyhow::Result<[u8; 6]> {
    let parts: Vec<u8> = s
        .split(':')
        .map(|p| u8::from_str_radix(p, 16))
        .collect::<Result<_, _>>()
        .with_context(|| format!("--dst-mac {s:?}"))?;
    parts
        .try_into()
        .map_err(|_| anyhow::anyhow!("--dst-mac {s:?}: six bytes expected"))
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let target = match (args.target, args.dst, args.port) {
        (Some(target), _, _) => target,
        (None, Some(dst), Some(port)) => SocketAddr::new(dst, port),
        _ => bail!("--target, or --dst with --port, is required"),
    };
    if documentation_block(target.ip()).is_none() {
        bail!(
            "syn-flood only sends to documentation-range addresses (192.0.2.0/24, \
             198.51.100.0/24, 203.0.113.0/24, 2001:db8::/32), not {}",
            target.ip()
        );
    }
    let sources = Sources::from_args(&args)?;
    if sources.nth(0).is_ipv4() != target.is_ipv4() {
        bail!("the sources ({sources}) and the target ({target}) are not of one address family");
    }
    let (socket, ethernet) = match (&args.iface, &args.dst_mac) {
        (Some(iface), Some(mac)) => {
            let ethertype: u16 = if target.is_ipv4() { 0x0800 } else { 0x86dd };
            let mut header = Vec::with_capacity(14);
            header.extend_from_slice(&parse_mac(mac)?);
            header.extend_from_slice(&SRC_MAC);
            header.extend_from_slice(&ethertype.to_be_bytes());
            (sys::Socket::packet(iface)?, header)
        }
        _ => (sys::Socket::ip(target.ip())?, Vec::new()),
    };

    let limit = Duration::from_secs(args.seconds);
    let start = Instant::now();
    let (mut sent, mut errors) = (0_u64, 0_u64);
    let mut last_error = None;
    let mut frame = Vec::with_capacity(ethernet.len() + 60);
    while sent + errors < args.count && start.elapsed() < limit {
        let n = sent + errors;
        frame.clear();
        frame.extend_from_slice(&ethernet);
        syn(&mut frame, sources.nth(n), target, n)?;
        match socket.send(&frame) {
            Ok(()) => sent += 1,
            Err(e) => {
                errors += 1;
                last_error = Some(e);
            }
        }
    }
    println!(
        "syn-flood: sent {sent} SYNs from {sources} to {target} in {:.1?} ({errors} send errors)",
        start.elapsed()
    );
    match last_error {
        Some(e) if sent == 0 => Err(e).context("every send failed"),
        _ => Ok(()),
    }
}

/// Appends the `n`th SYN, an IP packet from `src` to `dst`, to `out`: a new source port per SYN,
/// as a flood tool would send (every SYN opens a new half-connection).
fn syn(out: &mut Vec<u8>, src: IpAddr, dst: SocketAddr, n: u64) -> anyhow::Result<()> {
    let builder = match (src, dst.ip()) {
        (IpAddr::V4(s), IpAddr::V4(d)) => PacketBuilder::ipv4(s.octets(), d.octets(), 64),
        (IpAddr::V6(s), IpAddr::V6(d)) => PacketBuilder::ipv6(s.octets(), d.octets(), 64),
        _ => bail!("{src} and {dst} are not of one address family"),
    };
    let sport = 1024 + u16::try_from(n % 60_000).unwrap_or(0);
    let seq = u32::try_from(n & 0xffff_ffff)
        .unwrap_or(0)
        .wrapping_mul(2_654_435_761);
    builder
        .tcp(sport, dst.port(), seq, 64_240)
        .syn()
        .write(out, &[])
        .context("building a SYN")
}

mod sys {
    //! The raw sockets, through rustix. Its one `unsafe` is the AF_PACKET socket address
    //! (`struct sockaddr_ll`), for which rustix has no type.

    use std::{
        io,
        net::{IpAddr, SocketAddrV4, SocketAddrV6},
        os::fd::OwnedFd,
    };

    use anyhow::Context as _;
    use rustix::net::{
        AddressFamily, SendFlags, SocketType,
        addr::{SocketAddrArg, SocketAddrLen, SocketAddrOpaque},
        eth, ipproto, netdevice, sendto, socket,
    };

    /// Where `sendto` sends.
    enum Addr {
        V4(SocketAddrV4),
        V6(SocketAddrV6),
        Link(LinkAddr),
    }

    /// An AF_PACKET socket address: the interface frames are written onto.
    struct LinkAddr(libc::sockaddr_ll);

    #[expect(
        unsafe_code,
        reason = "rustix has no AF_PACKET address type: sendto takes this one through its unsafe trait"
    )]
    // SAFETY: `with_sockaddr` calls `f` with a pointer to the `sockaddr_ll` that `self` holds and
    // its size (or 0), so the pointer is readable for the length passed, during the call; the
    // address is a valid AF_PACKET one (`sll_family` is AF_PACKET, set in `Socket::packet`).
    unsafe impl SocketAddrArg for LinkAddr {
        unsafe fn with_sockaddr<R>(
            &self,
            f: impl FnOnce(*const SocketAddrOpaque, SocketAddrLen) -> R,
        ) -> R {
            let len = SocketAddrLen::try_from(size_of::<libc::sockaddr_ll>()).unwrap_or_default();
            f((&raw const self.0).cast(), len)
        }
    }

    /// A raw IP socket to one destination, or an AF_PACKET socket on one interface.
    pub(crate) struct Socket {
        fd: OwnedFd,
        addr: Addr,
    }

    impl Socket {
        /// A raw IP socket that sends complete IP packets to `dst` (`IPPROTO_RAW` implies
        /// `IP_HDRINCL`, and on IPv6 `IPV6_HDRINCL`): the kernel routes them.
        pub(crate) fn ip(dst: IpAddr) -> anyhow::Result<Self> {
            let (domain, addr) = match dst {
                IpAddr::V4(v4) => (AddressFamily::INET, Addr::V4(SocketAddrV4::new(v4, 0))),
                IpAddr::V6(v6) => (
                    AddressFamily::INET6,
                    Addr::V6(SocketAddrV6::new(v6, 0, 0, 0)),
                ),
            };
            let fd = socket(domain, SocketType::RAW, Some(ipproto::RAW))
                .context("opening a raw IP socket (needs CAP_NET_RAW)")?;
            Ok(Self { fd, addr })
        }

        /// An AF_PACKET socket that writes whole Ethernet frames onto `iface`.
        pub(crate) fn packet(iface: &str) -> anyhow::Result<Self> {
            // Every EtherType, in network byte order (rustix's `eth` constants are).
            let protocol = eth::ALL;
            let fd = socket(AddressFamily::PACKET, SocketType::RAW, Some(protocol))
                .context("socket(AF_PACKET) (needs CAP_NET_RAW)")?;
            let index = netdevice::name_to_index(&fd, iface)
                .with_context(|| format!("interface {iface}"))?;
            let addr = libc::sockaddr_ll {
                sll_family: AddressFamily::PACKET.as_raw(),
                sll_protocol: u16::try_from(protocol.as_raw().get()).context("the EtherType")?,
                sll_ifindex: i32::try_from(index).context("interface index")?,
                sll_hatype: 0,
                sll_pkttype: 0,
                sll_halen: 6,
                sll_addr: [0; 8],
            };
            Ok(Self {
                fd,
                addr: Addr::Link(LinkAddr(addr)),
            })
        }

        /// Sends one packet (raw IP) or frame (AF_PACKET).
        pub(crate) fn send(&self, bytes: &[u8]) -> io::Result<()> {
            let flags = SendFlags::empty();
            match &self.addr {
                Addr::V4(a) => sendto(&self.fd, bytes, flags, a),
                Addr::V6(a) => sendto(&self.fd, bytes, flags, a),
                Addr::Link(a) => sendto(&self.fd, bytes, flags, a),
            }?;
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use std::net::IpAddr;

    use clap::Parser as _;

    use super::{Args, Sources};

    fn sources(argv: &[&str]) -> anyhow::Result<Sources> {
        let mut all = vec!["syn-flood"];
        all.extend_from_slice(argv);
        Sources::from_args(&Args::try_parse_from(all)?)
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn both_command_lines_parse() {
        let demo = Args::try_parse_from([
            "syn-flood",
            "--source",
            "192.0.2.66",
            "--target",
            "192.0.2.1:8443",
            "--count",
            "2000",
            "--seconds",
            "10",
        ])
        .unwrap();
        assert_eq!((demo.count, demo.seconds, demo.iface), (2000, 10, None));
        let suite = Args::try_parse_from([
            "syn-flood",
            "--iface",
            "veth-client",
            "--dst-mac",
            "02:00:00:00:00:01",
            "--dst",
            "2001:db8:d00::1",
            "--port",
            "8443",
            "--src-prefix",
            "2001:db8:bad::",
            "--prefixes",
            "3",
            "--count",
            "5000",
            "--max-seconds",
            "7",
        ])
        .unwrap();
        assert_eq!((suite.count, suite.seconds, suite.prefixes), (5000, 7, 3));
    }

    #[test]
    fn a_destination_and_a_source_are_required_and_exclusive() {
        assert!(Args::try_parse_from(["syn-flood", "--source", "192.0.2.2"]).is_err());
        assert!(Args::try_parse_from(["syn-flood", "--target", "192.0.2.1:80"]).is_err());
        assert!(
            Args::try_parse_from([
                "syn-flood",
                "--target",
                "192.0.2.1:80",
                "--dst",
                "192.0.2.1",
                "--port",
                "80",
                "--source",
                "192.0.2.2",
            ])
            .is_err()
        );
        assert!(
            Args::try_parse_from(["syn-flood", "--dst", "192.0.2.1", "--source", "192.0.2.2"])
                .is_err(),
            "--dst needs --port"
        );
        assert!(
            Args::try_parse_from([
                "syn-flood",
                "--target",
                "192.0.2.1:80",
                "--source",
                "192.0.2.2",
                "--iface",
                "veth0",
            ])
            .is_err(),
            "--iface needs --dst-mac"
        );
    }

    #[test]
    fn ipv6_rotation_walks_slash_64s_then_hosts() {
        let s = sources(&[
            "--target",
            "[2001:db8:d00::1]:8443",
            "--src-prefix",
            "2001:db8:bad::77",
            "--prefixes",
            "2",
        ])
        .unwrap();
        assert_eq!(s.nth(0), ip("2001:db8:bad::1"));
        assert_eq!(s.nth(1), ip("2001:db8:bad:1::1"));
        assert_eq!(s.nth(2), ip("2001:db8:bad::2"));
    }

    #[test]
    fn ipv4_rotation_walks_slash_32s() {
        let s = sources(&[
            "--target",
            "192.0.2.1:8443",
            "--src-prefix",
            "198.51.100.10",
            "--prefixes",
            "3",
        ])
        .unwrap();
        let seen: Vec<IpAddr> = (0..4).map(|n| s.nth(n)).collect();
        assert_eq!(
            seen,
            [
                "198.51.100.10",
                "198.51.100.11",
                "198.51.100.12",
                "198.51.100.10"
            ]
            .map(ip)
        );
    }

    #[test]
    fn sources_outside_the_documentation_ranges_are_refused() {
        let target = ["--target", "192.0.2.1:8443"];
        for bad in [
            &["--source", "10.0.0.1"][..],
            &["--src-prefix", "192.0.2.250", "--prefixes", "10"],
            &["--src-prefix", "2001:db8:ffff:ffff::", "--prefixes", "2"],
            &["--src-prefix", "2001:db9::"],
        ] {
            let mut argv = target.to_vec();
            argv.extend_from_slice(bad);
            assert!(sources(&argv).is_err(), "{bad:?}");
        }
        let mut argv = target.to_vec();
        argv.extend_from_slice(&["--src-prefix", "192.0.2.200", "--prefixes", "56"]);
        assert!(sources(&argv).is_ok());
    }
}
