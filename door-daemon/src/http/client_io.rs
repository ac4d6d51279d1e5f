//! A client connection's I/O as door watches it ([`ClientIo`]): the bytes hyper writes to the
//! client, and on a cleartext connection the HTTP/2 connection preface.
//!
//! The bytes written are counted in the connection's [`ConnInfo::written`], so that a response
//! that has not moved for a while can tell a client that stopped reading from one that reads
//! slowly: a response body takes a frame from the upstream only when hyper's write buffer has
//! room, which the socket's buffers leave in bursts far apart for a slow reader
//! (`crate::http::body`).
//!
//! A client that speaks h2c with prior knowledge says so with its first 24 bytes (RFC 9113
//! §3.4), before any request, where a TLS connection says so with ALPN. The connection's first
//! bytes are read as they pass to hyper and, once they are the whole preface, the connection's
//! idle watch is told ([`Activity::negotiated`](crate::http::idle::Activity::negotiated)), so
//! that a first request that is late ends the connection with a GOAWAY (RFC 9113 §6.8) instead
//! of a bare close, as it does after ALPN's `h2`.

use std::{
    io,
    pin::Pin,
    sync::{Arc, atomic::Ordering},
    task::{Context, Poll},
};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::http::conn::ConnInfo;

/// The client connection preface of HTTP/2 (RFC 9113 §3.4).
const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// A client connection's I/O: its writes counted on its [`ConnInfo`], and on a cleartext
/// connection its reads watched until they show whether it starts with the HTTP/2 preface; from
/// then on reads go straight through.
#[derive(Debug)]
pub(crate) struct ClientIo<I> {
    io: I,
    info: Arc<ConnInfo>,
    /// The connection's first bytes are still being looked at for the preface; `false` once
    /// they have been (the preface whole, another byte, or the end of the stream), and from the
    /// start on a TLS connection.
    watching: bool,
    /// Bytes of the preface read so far.
    matched: usize,
}

impl<I> ClientIo<I> {
    /// The I/O `io` of a cleartext connection, the one `info` describes: its first reads
    /// watched for the preface.
    pub(crate) fn cleartext(io: I, info: Arc<ConnInfo>) -> Self {
        Self {
            io,
            info,
            watching: true,
            matched: 0,
        }
    }

    /// The I/O `io` of a TLS connection (ALPN said its protocol), the one `info` describes.
    pub(crate) fn tls(io: I, info: Arc<ConnInfo>) -> Self {
        Self {
            io,
            info,
            watching: false,
            matched: 0,
        }
    }

    /// Looks at bytes just read: the next ones of the preface, or not.
    fn saw(&mut self, read: &[u8]) {
        let Some(rest) = PREFACE.get(self.matched..) else {
            return;
        };
        if read.is_empty() {
            // The end of the stream before the whole preface.
            self.watching = false;
            return;
        }
        let n = read.len().min(rest.len());
        if read.get(..n) != rest.get(..n) {
            self.watching = false;
            return;
        }
        self.matched += n;
        if self.matched == PREFACE.len() {
            self.watching = false;
            self.info.activity.negotiated(true);
        }
    }

    /// Counts `polled`'s bytes when it wrote some. Only the connection's task writes to it, so a
    /// plain load and store (no locked instruction) keep the count exact.
    fn count(&self, polled: &Poll<io::Result<usize>>) {
        if let Poll::Ready(Ok(n)) = polled {
            let written = &self.info.written;
            let n = u64::try_from(*n).unwrap_or(u64::MAX);
            written.store(
                written.load(Ordering::Relaxed).wrapping_add(n),
                Ordering::Relaxed,
            );
        }
    }
}

impl<I: AsyncRead + Unpin> AsyncRead for ClientIo<I> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if !this.watching {
            return Pin::new(&mut this.io).poll_read(cx, buf);
        }
        let before = buf.filled().len();
        let polled = Pin::new(&mut this.io).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = polled {
            this.saw(buf.filled().get(before..).unwrap_or_default());
        }
        polled
    }
}

impl<I: AsyncWrite + Unpin> AsyncWrite for ClientIo<I> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.io).poll_write(cx, buf);
        this.count(&polled);
        polled
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.io).poll_write_vectored(cx, bufs);
        this.count(&polled);
        polled
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn watch() -> (ClientIo<()>, Arc<ConnInfo>) {
        let info = Arc::new(ConnInfo::new("192.0.2.1:1234".parse().unwrap(), false));
        (ClientIo::cleartext((), Arc::clone(&info)), info)
    }

    /// Whether the idle watch was told the connection speaks HTTP/2: its first request late, it
    /// would be shut down (GOAWAY), not dropped.
    fn told(info: &ConnInfo) -> bool {
        let d = info
            .activity
            .idle_deadline(Duration::from_mins(1), Duration::from_secs(10));
        d.is_some_and(|d| !d.drop)
    }

    #[test]
    fn the_whole_preface_in_any_pieces_tells_the_idle_watch() {
        for cut in [1, 5, 23, 24] {
            let (mut w, info) = watch();
            let (a, b) = PREFACE.split_at(cut);
            w.saw(a);
            assert!(!told(&info) || cut == 24, "told after {cut} bytes");
            let mut rest = b.to_vec();
            rest.extend_from_slice(b"\0\0\0\x04\0\0\0\0\0");
            w.saw(&rest);
            assert!(told(&info), "cut at {cut}");
            assert!(!w.watching, "the watch ends with the preface");
        }
    }

    #[test]
    fn anything_else_ends_the_watch_untold() {
        for (first, then) in [
            (&b"GET / HTTP/1.1\r\n"[..], &b""[..]),
            (b"PRI * HTTP/2.0\r\n", b"\r\nXM\r\n\r\n"),
            (b"PRI", b""),
        ] {
            let (mut w, info) = watch();
            w.saw(first);
            w.saw(then);
            assert!(!told(&info), "{first:?} then {then:?}");
            assert!(!w.watching, "{first:?} then {then:?}: the watch ended");
        }
    }

    #[tokio::test]
    async fn every_byte_written_is_counted_whole_or_vectored() {
        let info = Arc::new(ConnInfo::new("192.0.2.1:1234".parse().unwrap(), true));
        let (io, mut peer) = tokio::io::duplex(1 << 16);
        let mut w = ClientIo::tls(io, Arc::clone(&info));
        tokio::io::AsyncWriteExt::write_all(&mut w, b"HTTP/1.1 200 OK\r\n")
            .await
            .unwrap();
        let bufs = [io::IoSlice::new(b"ab"), io::IoSlice::new(b"cde")];
        let n = tokio::io::AsyncWriteExt::write_vectored(&mut w, &bufs)
            .await
            .unwrap();
        assert_eq!(info.written.load(Ordering::Relaxed), 17 + n as u64);
        let mut read = vec![0u8; 17 + n];
        tokio::io::AsyncReadExt::read_exact(&mut peer, &mut read)
            .await
            .unwrap();
    }
}
