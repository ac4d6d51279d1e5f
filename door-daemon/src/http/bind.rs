//! Binding a listening TCP socket: door's `listen` addresses and a TCP `admin_listen`.
//!
//! As tokio's `TcpListener::bind` binds (`SO_REUSEADDR`, the standard library's backlog of 128),
//! and, where asked, with `IPV6_V6ONLY` (RFC 3493 §5.3): under Linux's default
//! `net.ipv6.bindv6only = 0` the IPv6 wildcard `[::]:P` also claims port `P` on every IPv4
//! address (as IPv4-mapped addresses, RFC 4291 §2.5.5.2), so an IPv4 listener on the same port
//! could not bind beside it. [`crate::config::Config::binds_v6_only`] says when.

use std::{io, net::SocketAddr};

use tokio::net::{TcpListener, TcpSocket};

/// The listen backlog: the standard library's, which tokio's `TcpListener::bind` uses too.
pub const BACKLOG: u32 = 128;

/// A listener on `addr`; with `v6_only` (meaningful for an IPv6 address only), one that accepts
/// IPv6 connections alone.
///
/// # Errors
/// The socket's I/O errors: creating it, setting its options, binding (`AddrInUse` when another
/// socket holds the address), listening.
///
/// # Panics
/// Outside a tokio runtime with I/O enabled (tokio registers the socket with its reactor).
pub fn tcp(addr: SocketAddr, v6_only: bool) -> io::Result<TcpListener> {
    let socket = match addr {
        SocketAddr::V4(_) => TcpSocket::new_v4()?,
        SocketAddr::V6(_) => TcpSocket::new_v6()?,
    };
    socket.set_reuseaddr(true)?;
    if v6_only && addr.is_ipv6() {
        socket2::SockRef::from(&socket).set_only_v6(true)?;
    }
    socket.bind(addr)?;
    socket.listen(BACKLOG)
}
