//! The HTTP/2 connection preface (RFC 9113 §3.4) seen on a cleartext connection: a client that
//! speaks h2c with prior knowledge says so with its first 24 bytes, before any request, where a TLS
//! connection says so with ALPN. [`PrefaceWatch`] reads the connection's first bytes as they pass
//! to hyper and, once they are the whole preface, tells the connection's idle watch
//! ([`Activity::negotiated`](crate::http::idle::Activity::negotiated)), so that a first request
//! that is late ends the connection with a GOAWAY (RFC 9113 §6.8) instead of a bare close, as it
//! does after ALPN's `h2`.

use std::{
    io,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::http::conn::ConnInfo;

/// The client connection preface of HTTP/2 (RFC 9113 §3.4).
const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// A connection's I/O, reads watched until they show whether it starts with the HTTP/2 preface;
/// from then on every call goes straight through.
#[derive(Debug)]
pub(crate) struct PrefaceWatch<I> {
    io: I,
    /// The connection whose idle watch learns of the preface; `None` once its first bytes have
    /// been looked at (the preface whole, another byte, or the end of the stream).
    watching: Option<Arc<ConnInfo>>,
    /// Bytes of the preface read so far.
    matched: usize,
}

impl<I> PrefaceWatch<I> {
    /// Watches the reads of `io`, the connection `info` describes.
    pub(crate) fn new(io: I, info: Arc<ConnInfo>) -> Self {
        Self {
            io,
            watching: Some(info),
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
            self.watching = None;
            return;
        }
        let n = read.len().min(rest.len());
        if read.get(..n) != rest.get(..n) {
            self.watching = None;
            return;
        }
        self.matched += n;
        if self.matched == PREFACE.len()
            && let Some(info) = self.watching.take()
        {
            info.activity.negotiated(true);
        }
    }
}

impl<I: AsyncRead + Unpin> AsyncRead for PrefaceWatch<I> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.watching.is_none() {
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

impl<I: AsyncWrite + Unpin> AsyncWrite for PrefaceWatch<I> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
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

    fn watch() -> (PrefaceWatch<()>, Arc<ConnInfo>) {
        let info = Arc::new(ConnInfo::new("192.0.2.1:1234".parse().unwrap(), false));
        (PrefaceWatch::new((), Arc::clone(&info)), info)
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
            assert!(w.watching.is_none(), "the watch ends with the preface");
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
            assert!(
                w.watching.is_none(),
                "{first:?} then {then:?}: the watch ended"
            );
        }
    }
}
