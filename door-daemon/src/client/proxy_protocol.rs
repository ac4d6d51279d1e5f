//! The PROXY protocol (versions 1 and 2) on a listener configured for it
//! (`listen = [{ addr = "…", proxy_protocol = true }]`; docs/design.md, "Client key").
//!
//! An L4 proxy (HAProxy `send-proxy`/`send-proxy-v2`, a cloud load balancer, a tunnel) that
//! cannot add `X-Forwarded-For` prepends one header to the TCP stream naming the client's
//! address. The rules, from the specification (haproxy.org/download/2.9/doc/proxy-protocol.txt):
//!
//! - The header is **required** on such a listener, and never guessed (§2, §5): a connection that
//!   does not start with one is dropped.
//! - It is accepted only from a peer in `trusted_proxies` (§2: "only trusted proxies are allowed
//!   to use this protocol"; §5): any other peer is disconnected before a byte is read, and
//!   counted in `door.proxy_protocol_rejected`.
//! - The source address it carries becomes the connection's peer for everything else (the client
//!   key, the forwarding headers door writes, escalation). A v2 `LOCAL` command, a v1 `UNKNOWN`
//!   line, and a v2 header whose family or transport door does not use (`AF_UNSPEC`, `AF_UNIX`,
//!   `UNSPEC` or `DGRAM`) keep the real peer (§2.1, §2.2).
//! - The header must be complete within [`HEADER_TIMEOUT`] (§2 allows "a short timeout … at least
//!   3 seconds"), and is bounded: a v1 line is at most 107 bytes including CRLF (§2.1), a v2
//!   header at most [`MAX_V2_HEADER`] bytes (the 16-byte fixed part plus addresses and TLVs, §2.2).
//! - Exactly the header is read, never a byte more, so the stream can be handed to the HTTP server
//!   as it is. A header arriving in fragments is accepted ("recommendation is to be tolerant", §2).
//!
//! Parsing is the `ppp` crate's; this module frames the header on the wire (signature, length,
//! bounds), applies the rules above and maps the result to an address.

use core::net::{IpAddr, SocketAddr};
use std::time::Duration;

use ppp::v2;
use tokio::io::{AsyncRead, AsyncReadExt};

use crate::{client::key::TrustedProxies, obs::metrics::Metrics};

/// How long a trusted proxy has to deliver the complete header after the connection is accepted.
/// 5 s: longer than the 3 s the specification asks for (one TCP retransmission, §2).
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(5);

/// The longest v1 line, CRLF included (§2.1: `PROXY TCP6` with two full IPv6 addresses and two
/// 5-digit ports).
pub const MAX_V1_HEADER: usize = 107;

/// The longest v2 header door reads, in bytes: the 16-byte fixed part plus up to 2032 bytes of
/// addresses and TLVs. The wire format allows 16 + 65,535; real senders stay far below (IPv6
/// addresses are 36 bytes, HAProxy's SSL and unique-id TLVs a few hundred), and the specification
/// designs the header to fit one 536-byte segment (§2).
pub const MAX_V2_HEADER: usize = 2048;

/// The v1 signature (§2.1).
const V1_SIGNATURE: &[u8; 6] = b"PROXY ";
/// The v2 signature (§2.2).
const V2_SIGNATURE: &[u8; 12] = b"\r\n\r\n\0\r\nQUIT\n";
/// The v2 fixed part: signature, version and command, family and transport, length (§2.2).
const V2_FIXED: usize = 16;

/// Why a connection on a PROXY protocol listener was dropped.
#[derive(Debug, thiserror::Error)]
pub enum ProxyProtocolError {
    /// The TCP peer is not in `trusted_proxies`: its header would let it choose its own address
    /// (§5). Nothing was read.
    #[error(
        "{peer} is not a trusted proxy: a PROXY protocol header is accepted only from trusted_proxies"
    )]
    Untrusted {
        /// The TCP peer.
        peer: IpAddr,
    },
    /// The header was not complete within the deadline.
    #[error("no complete PROXY protocol header within {limit:?}")]
    Timeout {
        /// The deadline ([`HEADER_TIMEOUT`] on the listener).
        limit: Duration,
    },
    /// The peer closed the connection before the header was complete (§2.2: partial headers are
    /// rejected).
    #[error(
        "the connection ended after {read} bytes, before the PROXY protocol header was complete"
    )]
    Truncated {
        /// Bytes of header received.
        read: usize,
    },
    /// The connection does not start with either signature (`PROXY ` or the v2 signature): the
    /// peer does not speak the protocol (§2, §5: never guessed).
    #[error(
        "not a PROXY protocol header: the connection must start with \"PROXY \" (v1) or the v2 signature"
    )]
    NotProxyProtocol,
    /// The header is longer than door accepts: no CRLF within 107 bytes (v1, §2.1), or a v2
    /// length field above [`MAX_V2_HEADER`] − 16.
    #[error("PROXY protocol v{version} header longer than {limit} bytes")]
    TooLong {
        /// 1 or 2.
        version: u8,
        /// The bound, in bytes, fixed part included.
        limit: usize,
    },
    /// The header is framed but does not parse (bad address, port, token, version or command).
    #[error("malformed PROXY protocol v{version} header: {reason}")]
    Malformed {
        /// 1 or 2.
        version: u8,
        /// The parser's message.
        reason: String,
    },
    /// Reading from the socket failed.
    #[error("reading the PROXY protocol header: {0}")]
    Io(#[from] std::io::Error),
}

impl ProxyProtocolError {
    /// A short fixed name for the `door.reason` attribute of `door.proxy_protocol_rejected`:
    /// `untrusted`, `timeout`, `truncated`, `not_proxy_protocol`, `too_long`, `malformed` or `io`.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Untrusted { .. } => "untrusted",
            Self::Timeout { .. } => "timeout",
            Self::Truncated { .. } => "truncated",
            Self::NotProxyProtocol => "not_proxy_protocol",
            Self::TooLong { .. } => "too_long",
            Self::Malformed { .. } => "malformed",
            Self::Io(_) => "io",
        }
    }
}

/// What a well-formed header says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Header {
    /// A proxied TCP connection from `source` (v1 `TCP4`/`TCP6`, v2 `PROXY` over `STREAM` with
    /// `AF_INET`/`AF_INET6`).
    Proxied {
        /// The client's address and port.
        source: SocketAddr,
    },
    /// The header names no client door uses: v2 `LOCAL` (the proxy's own health check), v1
    /// `UNKNOWN`, or a v2 family or transport other than TCP over IPv4/IPv6. The real peer stays.
    Unknown,
}

/// Reads one PROXY protocol header from a connection accepted on a PROXY protocol listener, and
/// returns the peer the rest of door must use: the header's source address, or `peer` itself for
/// [`Header::Unknown`].
///
/// `peer` is the TCP peer; it must be in `trusted` (checked before anything is read). The header
/// must be complete within [`HEADER_TIMEOUT`]. Exactly the header's bytes are consumed: what
/// follows (the HTTP request) is still in `stream`.
///
/// # Errors
///
/// [`ProxyProtocolError::Untrusted`] when `peer` is not trusted, [`ProxyProtocolError::Timeout`]
/// after [`HEADER_TIMEOUT`], and those of [`read_header`]. The caller drops the connection.
pub async fn accept<S: AsyncRead + Unpin>(
    stream: &mut S,
    peer: SocketAddr,
    trusted: &TrustedProxies,
) -> Result<SocketAddr, ProxyProtocolError> {
    accept_within(stream, peer, trusted, HEADER_TIMEOUT).await
}

/// [`accept`] with a deadline other than [`HEADER_TIMEOUT`].
///
/// # Errors
///
/// As [`accept`], with `limit` in [`ProxyProtocolError::Timeout`].
pub async fn accept_within<S: AsyncRead + Unpin>(
    stream: &mut S,
    peer: SocketAddr,
    trusted: &TrustedProxies,
    limit: Duration,
) -> Result<SocketAddr, ProxyProtocolError> {
    Ok(accept_header(stream, peer, trusted, limit).await?.peer)
}

/// What a PROXY protocol header left door with: the peer the rest of door uses, and whether the
/// header named it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Accepted {
    /// The client the header names, or the proxy itself ([`Header::Unknown`]).
    pub peer: SocketAddr,
    /// `false` for a header that names no client (v2 `LOCAL`, v1 `UNKNOWN`, an `AF_UNSPEC`,
    /// `AF_UNIX` or datagram source, or the unspecified address `0.0.0.0` or `::`): the proxy
    /// opened the connection itself (a health check) or does not know whom it relays (a frontend
    /// on a Unix socket), so the forwarding fields on the connection come from no proxy door
    /// trusts and must not be believed.
    pub named: bool,
}

async fn accept_header<S: AsyncRead + Unpin>(
    stream: &mut S,
    peer: SocketAddr,
    trusted: &TrustedProxies,
    limit: Duration,
) -> Result<Accepted, ProxyProtocolError> {
    if !trusted.contains(peer.ip()) {
        return Err(ProxyProtocolError::Untrusted { peer: peer.ip() });
    }
    let header = tokio::time::timeout(limit, read_header(stream))
        .await
        .map_err(|_| ProxyProtocolError::Timeout { limit })??;
    Ok(match header {
        // `::ffff:0.0.0.0` is the unspecified IPv4 address too (found by hostile testing).
        Header::Proxied { source } if !source.ip().to_canonical().is_unspecified() => Accepted {
            peer: source,
            named: true,
        },
        Header::Proxied { .. } | Header::Unknown => Accepted { peer, named: false },
    })
}

/// [`accept`] for the accept loop, saying whether the header named the peer ([`Accepted`]): on
/// failure, logs at debug level, counts the rejection in `door.proxy_protocol_rejected` and
/// returns `None` (the caller drops the connection).
pub async fn accept_or_reject<S: AsyncRead + Unpin>(
    stream: &mut S,
    peer: SocketAddr,
    trusted: &TrustedProxies,
    metrics: &Metrics,
) -> Option<Accepted> {
    match accept_header(stream, peer, trusted, HEADER_TIMEOUT).await {
        Ok(accepted) => Some(accepted),
        Err(e) => {
            tracing::debug!(%peer, error = %e, "dropping connection on a PROXY protocol listener");
            metrics.proxy_protocol_rejected(e.reason());
            None
        }
    }
}

/// Reads and parses one header (v1 or v2) from the start of `stream`, consuming exactly its bytes.
/// No deadline and no trust check: see [`accept`].
///
/// Fragmented headers are read to the end; a v1 line is read at most two bytes at a time once its
/// first 12 bytes are in (so that nothing past its CRLF is read), a v2 header in three reads.
///
/// # Errors
///
/// [`ProxyProtocolError::NotProxyProtocol`] as soon as the first bytes match neither signature,
/// [`ProxyProtocolError::Truncated`] at end of stream, [`ProxyProtocolError::TooLong`] past the
/// bounds, [`ProxyProtocolError::Malformed`] when the framed header does not parse,
/// [`ProxyProtocolError::Io`] when reading fails.
pub async fn read_header<S: AsyncRead + Unpin>(
    stream: &mut S,
) -> Result<Header, ProxyProtocolError> {
    // 12 bytes tell the versions apart and are never past the end of a header: the shortest one
    // is `PROXY UNKNOWN\r\n` (15 bytes).
    let mut buf = Vec::with_capacity(V2_FIXED);
    while buf.len() < V2_SIGNATURE.len() {
        let want = V2_SIGNATURE.len() - buf.len();
        read_more(stream, &mut buf, want).await?;
        let v1 = buf.len().min(V1_SIGNATURE.len());
        if buf.get(..v1) != V1_SIGNATURE.get(..v1) && !V2_SIGNATURE.starts_with(&buf) {
            return Err(ProxyProtocolError::NotProxyProtocol);
        }
    }
    if buf.starts_with(V2_SIGNATURE) {
        read_v2(stream, buf).await
    } else {
        read_v1(stream, buf).await
    }
}

/// Appends at most `max` (≥ 1) bytes from `stream` to `buf` with one read.
async fn read_more<S: AsyncRead + Unpin>(
    stream: &mut S,
    buf: &mut Vec<u8>,
    max: usize,
) -> Result<(), ProxyProtocolError> {
    let start = buf.len();
    buf.resize(start + max, 0);
    let n = match buf.get_mut(start..) {
        Some(space) => stream.read(space).await,
        None => Ok(0),
    };
    let n = match n {
        Ok(n) => n,
        Err(e) => {
            buf.truncate(start);
            return Err(e.into());
        }
    };
    buf.truncate(start + n);
    if n == 0 {
        return Err(ProxyProtocolError::Truncated { read: start });
    }
    Ok(())
}

/// Appends exactly `len` bytes.
async fn read_exactly<S: AsyncRead + Unpin>(
    stream: &mut S,
    buf: &mut Vec<u8>,
    len: usize,
) -> Result<(), ProxyProtocolError> {
    let end = buf.len() + len;
    while buf.len() < end {
        let want = end - buf.len();
        read_more(stream, buf, want).await?;
    }
    Ok(())
}

/// The rest of a v1 line (§2.1), whose first 12 bytes are in `buf`.
async fn read_v1<S: AsyncRead + Unpin>(
    stream: &mut S,
    mut buf: Vec<u8>,
) -> Result<Header, ProxyProtocolError> {
    let too_long = ProxyProtocolError::TooLong {
        version: 1,
        limit: MAX_V1_HEADER,
    };
    loop {
        // The line ends at the first CR and the byte after it (ppp rejects anything but CRLF).
        if let Some(cr) = buf.iter().position(|b| *b == b'\r')
            && cr + 1 < buf.len()
        {
            buf.truncate(cr + 2);
            break;
        }
        if buf.len() >= MAX_V1_HEADER {
            return Err(too_long);
        }
        // The line ends with CRLF: unless the last byte is a CR, two more bytes are certainly
        // part of it. Never read past the bound (the next round reports it).
        let want = if buf.last() == Some(&b'\r') { 1 } else { 2 };
        let want = want.min(MAX_V1_HEADER - buf.len());
        read_more(stream, &mut buf, want).await?;
    }
    // A line ends with CRLF (§2.1). ppp is lax after `UNKNOWN`, so a CR followed by anything else
    // (found by fuzzing: `PROXY UNKNOWN \n\r\r`) is refused here.
    if !buf.ends_with(b"\r\n") {
        return Err(malformed(
            1,
            &"a CR not followed by LF before the end of the line",
        ));
    }
    // After `UNKNOWN` the receiver ignores everything up to the CRLF (§2.1), which ppp refuses
    // when it holds more fields (found by hostile testing: `PROXY UNKNOWN a b 1 2\r\n`).
    if let Some(rest) = buf.strip_prefix(b"PROXY UNKNOWN")
        && matches!(rest.first(), Some(b' ' | b'\r'))
    {
        return Ok(Header::Unknown);
    }
    let header = ppp::v1::Header::try_from(buf.as_slice()).map_err(|e| malformed(1, &e))?;
    Ok(match header.addresses {
        ppp::v1::Addresses::Tcp4(a) => Header::Proxied {
            source: SocketAddr::new(IpAddr::V4(a.source_address), a.source_port),
        },
        ppp::v1::Addresses::Tcp6(a) => Header::Proxied {
            source: SocketAddr::new(IpAddr::V6(a.source_address), a.source_port),
        },
        ppp::v1::Addresses::Unknown => Header::Unknown,
    })
}

/// The rest of a v2 header (§2.2), whose 12-byte signature is in `buf`.
async fn read_v2<S: AsyncRead + Unpin>(
    stream: &mut S,
    mut buf: Vec<u8>,
) -> Result<Header, ProxyProtocolError> {
    let want = V2_FIXED - buf.len();
    read_exactly(stream, &mut buf, want).await?;
    let len = match buf.get(14..16) {
        Some(&[hi, lo]) => usize::from(u16::from_be_bytes([hi, lo])),
        _ => 0,
    };
    if V2_FIXED + len > MAX_V2_HEADER {
        return Err(ProxyProtocolError::TooLong {
            version: 2,
            limit: MAX_V2_HEADER,
        });
    }
    read_exactly(stream, &mut buf, len).await?;
    let header = v2::Header::try_from(buf.as_slice()).map_err(|e| malformed(2, &e))?;
    // TLVs (§2.2.1–2.2.8) are framed by the length and otherwise ignored; malformed TLVs are
    // ignored too, as door uses none of them.
    Ok(match (header.command, header.protocol, header.addresses) {
        (v2::Command::Proxy, v2::Protocol::Stream, v2::Addresses::IPv4(a)) => Header::Proxied {
            source: SocketAddr::new(IpAddr::V4(a.source_address), a.source_port),
        },
        (v2::Command::Proxy, v2::Protocol::Stream, v2::Addresses::IPv6(a)) => Header::Proxied {
            source: SocketAddr::new(IpAddr::V6(a.source_address), a.source_port),
        },
        _ => Header::Unknown,
    })
}

fn malformed(version: u8, e: &impl std::fmt::Display) -> ProxyProtocolError {
    ProxyProtocolError::Malformed {
        version,
        reason: e.to_string(),
    }
}

#[cfg(test)]
mod tests;
