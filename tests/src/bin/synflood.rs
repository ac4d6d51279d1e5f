//! A bounded TCP SYN generator for door's flood tests: writes Ethernet frames built with
//! etherparse straight onto an interface (AF_PACKET), so sources can be spoofed and rotated.
//! Only for namespaces a test made itself: it refuses destinations outside the documentation
//! ranges (192.0.2.0/24, 198.51.100.0/24, 203.0.113.0/24, 2001:db8::/32).
//!
//! `synflood --iface veth-client --dst-mac 02:..:.. --dst 2001:db8:d00::1 --port 8443
//!  --src-prefix 2001:db8:bad:: --prefixes 1 --count 5000 --max-seconds 10`
//!
//! sends `count` SYNs from `prefixes` distinct /64s starting at `src-prefix` (the host part
//! rotates within each /64), stopping early after `max-seconds`. Prints how many it sent.

use std::{
    net::{IpAddr, Ipv6Addr},
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};
use clap::Parser;
use etherparse::PacketBuilder;

/// Bounded SYN generator (see the module docs).
#[derive(Debug, Parser)]
struct Args {
    /// Interface to write frames to.
    #[arg(long)]
    iface: String,
    /// Destination MAC, `aa:bb:cc:dd:ee:ff`.
    #[arg(long)]
    dst_mac: String,
    /// Destination address (a documentation-range IPv6 address).
    #[arg(long)]
    dst: Ipv6Addr,
    /// Destination port.
    #[arg(long)]
    port: u16,
    /// First source /64 (its low 64 bits are ignored).
    #[arg(long)]
    src_prefix: Ipv6Addr,
    /// Distinct /64s to rotate through.
    #[arg(long, default_value_t = 1)]
    prefixes: u64,
    /// SYNs to send.
    #[arg(long)]
    count: u64,
    /// Stop after this many seconds even if `count` was not reached.
    #[arg(long, default_value_t = 10)]
    max_seconds: u64,
}

fn documentation_range(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => {
            let [a, b, c, _] = v4.octets();
            matches!((a, b, c), (192, 0, 2) | (198, 51, 100) | (203, 0, 113))
        }
        IpAddr::V6(v6) => v6.segments()[..2] == [0x2001, 0x0db8],
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
    if !documentation_range(IpAddr::V6(args.dst))
        || !documentation_range(IpAddr::V6(args.src_prefix))
    {
        bail!("synflood only sends between documentation-range addresses (2001:db8::/32)");
    }
    let dst_mac = parse_mac(&args.dst_mac)?;
    let socket = raw::PacketSocket::open(&args.iface)?;
    let base = u128::from(args.src_prefix) & !u128::from(u64::MAX);
    let deadline = Instant::now() + Duration::from_secs(args.max_seconds);
    let mut sent = 0u64;
    let mut frame = Vec::with_capacity(80);
    while sent < args.count && Instant::now() < deadline {
        let prefix = u128::from(sent % args.prefixes.max(1)) << 64;
        let host = u128::from(sent / args.prefixes.max(1) + 1);
        let src = Ipv6Addr::from(base.wrapping_add(prefix) | host);
        let sport = 1024 + u16::try_from(sent % 60_000).unwrap_or(0);
        let builder = PacketBuilder::ethernet2([0x02, 0, 0, 0, 0xba, 0xd0], dst_mac)
            .ipv6(src.octets(), args.dst.octets(), 64)
            .tcp(
                sport,
                args.port,
                u32::try_from(sent & 0xffff_ffff).unwrap_or(0),
                64_240,
            )
            .syn();
        frame.clear();
        builder.write(&mut frame, &[]).context("building a SYN")?;
        socket.send(&frame)?;
        sent += 1;
    }
    println!("synflood sent {sent}");
    Ok(())
}

mod raw {
    //! The AF_PACKET socket: the only `unsafe` of this binary.
    #![expect(
        unsafe_code,
        reason = "AF_PACKET sockets are only reachable through libc"
    )]

    use std::{
        ffi::CString,
        io,
        os::fd::{AsRawFd, FromRawFd, OwnedFd},
    };

    use anyhow::Context as _;

    pub(crate) struct PacketSocket {
        fd: OwnedFd,
        addr: libc::sockaddr_ll,
    }

    impl PacketSocket {
        pub(crate) fn open(iface: &str) -> anyhow::Result<Self> {
            let name = CString::new(iface).context("interface name")?;
            // SAFETY: `name` is a valid NUL-terminated string for the duration of the call.
            let index = unsafe { libc::if_nametoindex(name.as_ptr()) };
            if index == 0 {
                return Err(io::Error::last_os_error())
                    .with_context(|| format!("interface {iface}"));
            }
            let protocol = u16::try_from(libc::ETH_P_ALL).unwrap_or(3).to_be();
            // SAFETY: plain socket(2) call with constant arguments.
            let fd = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW, i32::from(protocol)) };
            if fd < 0 {
                return Err(io::Error::last_os_error())
                    .context("socket(AF_PACKET) (needs CAP_NET_RAW)");
            }
            // SAFETY: `fd` was just returned by socket(2) and is owned by nobody else.
            let fd = unsafe { OwnedFd::from_raw_fd(fd) };
            // SAFETY: sockaddr_ll is plain old data; all-zero is a valid value.
            let mut addr: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
            addr.sll_family = u16::try_from(libc::AF_PACKET).unwrap_or(17);
            addr.sll_protocol = protocol;
            addr.sll_ifindex = i32::try_from(index).context("interface index")?;
            addr.sll_halen = 6;
            Ok(Self { fd, addr })
        }

        pub(crate) fn send(&self, frame: &[u8]) -> anyhow::Result<()> {
            let len = u32::try_from(size_of::<libc::sockaddr_ll>()).unwrap_or(20);
            // SAFETY: `frame` is a live buffer of `frame.len()` bytes; `addr` is a valid
            // sockaddr_ll of `len` bytes; the fd is open.
            let n = unsafe {
                libc::sendto(
                    self.fd.as_raw_fd(),
                    frame.as_ptr().cast(),
                    frame.len(),
                    0,
                    (&raw const self.addr).cast(),
                    len,
                )
            };
            if n < 0 {
                return Err(io::Error::last_os_error()).context("sendto");
            }
            Ok(())
        }
    }
}
