//! The upstream connector: hyper-util's [`HttpConnector`] (TCP, `TCP_NODELAY`), dialling the
//! configured upstream whatever authority a request's URI names, whose connections door reports
//! to the pooled client without connection extras.
//!
//! door has one upstream, and hyper-util's pool keys its connections by the request URI's scheme
//! and authority, hashed with SipHash byte by byte at every checkout and every return: for
//! `127.0.0.1:18080`, about 2,100 instructions a request, 4 % of door's user-space work. So the
//! requests door sends upstream carry the one-letter authority [`POOL_AUTHORITY`] (never written
//! on the wire: hyper writes an origin-form target, and door sets `Host` itself), and this
//! connector dials the configured address (docs/decisions.md, "Upstream requests: a one-letter
//! pool key").
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
    time::Duration,
};

use http::{
    Uri,
    uri::{Authority, PathAndQuery},
};
use hyper::rt::{Read, ReadBufCursor, Write};
use hyper_util::{
    client::legacy::connect::{Connected, Connection, HttpConnector},
    rt::TokioIo,
};
use tokio::net::TcpStream;
use tower_service::Service;

use crate::config::Upstream;

/// The authority of every request URI door hands its pooled client: the pool's key, one byte to
/// hash (see the module docs). Not a host name anything resolves: [`Connector`] ignores it.
pub const POOL_AUTHORITY: Authority = Authority::from_static("u");

/// A connector for the upstream: [`HttpConnector`] with `TCP_NODELAY` set, dialling the
/// configured upstream, yielding [`UpstreamIo`]. Its errors are the connector's: refused,
/// unresolvable, or not connected within its connect timeout.
#[derive(Debug, Clone)]
pub struct Connector {
    http: HttpConnector,
    /// `http://host:port` of the upstream: what every connection dials.
    upstream: Uri,
}

impl Connector {
    /// A connector that opens plain TCP connections to `upstream` with `TCP_NODELAY` (each
    /// request is written in full at once; Nagle's algorithm would only delay it), giving up on
    /// a connection not made within `connect_timeout` (door's `upstream_timeout`: an upstream
    /// whose SYNs go unanswered would otherwise hold a request with a body for the operating
    /// system's own connect timeout, about two minutes, as neither its read deadline, which counts
    /// only the time door waits for the client once the body is asked for, nor the upstream
    /// timeout, which starts once it is sent, has begun).
    pub fn new(upstream: &Upstream, connect_timeout: Duration) -> Self {
        let mut http = HttpConnector::new();
        http.set_nodelay(true);
        http.set_connect_timeout(Some(connect_timeout));
        let mut parts = http::uri::Parts::default();
        parts.scheme = Some(upstream.scheme.clone());
        parts.authority = Some(upstream.authority.clone());
        parts.path_and_query = Some(PathAndQuery::from_static("/"));
        // A scheme, an authority and a path always make a URI.
        let upstream = Uri::from_parts(parts).unwrap_or_default();
        Self { http, upstream }
    }
}

impl Service<Uri> for Connector {
    type Response = UpstreamIo;
    type Error = <HttpConnector as Service<Uri>>::Error;
    type Future = Connecting;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.http.poll_ready(cx)
    }

    /// Dials the upstream; `dst`, whose authority is [`POOL_AUTHORITY`], is not read.
    fn call(&mut self, _dst: Uri) -> Self::Future {
        Connecting(self.http.call(self.upstream.clone()))
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
