//! The upstream connector: hyper-util's [`HttpConnector`] (TCP, `TCP_NODELAY`), whose
//! connections door reports to the pooled client without connection extras.
//!
//! hyper-util's connector tags every TCP connection with an `HttpInfo` extra (the two socket
//! addresses), and its pooled client copies an extra into the extensions of *every* response on
//! that connection: a map allocated, a boxed value cloned and inserted, per request. door reads
//! no response extension, so its connections carry none: [`UpstreamIo`] is the connector's
//! stream with a bare `Connected` (docs/decisions.md, "Upstream connections: no `HttpInfo` per
//! response").

use std::{
    future::Future,
    io,
    pin::Pin,
    task::{Context, Poll},
};

use http::Uri;
use hyper::rt::{Read, ReadBufCursor, Write};
use hyper_util::{
    client::legacy::connect::{Connected, Connection, HttpConnector},
    rt::TokioIo,
};
use tokio::net::TcpStream;
use tower_service::Service;

/// A connector for the upstream: [`HttpConnector`] with `TCP_NODELAY` set, yielding
/// [`UpstreamIo`]. Its errors are the connector's: refused, unresolvable, or the operating
/// system's connect timeout (no timeout of its own is set).
#[derive(Debug, Clone)]
pub struct Connector(HttpConnector);

impl Connector {
    /// A connector that opens plain TCP connections with `TCP_NODELAY` (each request is
    /// written in full at once; Nagle's algorithm would only delay it).
    pub fn new() -> Self {
        let mut http = HttpConnector::new();
        http.set_nodelay(true);
        Self(http)
    }
}

impl Default for Connector {
    fn default() -> Self {
        Self::new()
    }
}

impl Service<Uri> for Connector {
    type Response = UpstreamIo;
    type Error = <HttpConnector as Service<Uri>>::Error;
    type Future = Connecting;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, dst: Uri) -> Self::Future {
        Connecting(self.0.call(dst))
    }
}

/// A connection being opened by [`Connector`].
pub struct Connecting(<HttpConnector as Service<Uri>>::Future);

impl core::fmt::Debug for Connecting {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str("Connecting")
    }
}

impl Future for Connecting {
    type Output = Result<UpstreamIo, <HttpConnector as Service<Uri>>::Error>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Pin::new(&mut self.0).poll(cx).map_ok(UpstreamIo)
    }
}

/// One upstream TCP connection: the connector's stream, reported as a bare [`Connected`] (no
/// extras to copy into responses). Reads and writes go straight through, vectored writes
/// included.
#[derive(Debug)]
pub struct UpstreamIo(TokioIo<TcpStream>);

impl Connection for UpstreamIo {
    fn connected(&self) -> Connected {
        Connected::new()
    }
}

impl Read for UpstreamIo {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: ReadBufCursor<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl Write for UpstreamIo {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }

    fn is_write_vectored(&self) -> bool {
        self.0.is_write_vectored()
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write_vectored(cx, bufs)
    }
}
