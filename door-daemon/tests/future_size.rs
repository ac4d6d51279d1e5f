//! The future that serves one request (`App::handle`) is allocated and copied once per request:
//! hyper is given a box of it and moves only the pointer (docs/decisions.md, "A request's future
//! on the heap"). Its size is therefore a cost on every request, and a change that keeps one more
//! value across an await grows it silently. This test pins it.
#![expect(
    clippy::unwrap_used,
    reason = "test code: a failed step fails the test"
)]

mod support;

use std::{
    convert::Infallible,
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
};

use bytes::Bytes;
use door_daemon::{
    http::{App, ConnInfo},
    obs::metrics::Metrics,
    time::{Clock, MonotonicClock},
};
use http::Response;
use http_body_util::Empty;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

/// The largest the future may be, in bytes: it measured 2,456 bytes when this bound was set, in
/// the test build as in the release build (`-Zprint-type-sizes`). The margin is less than one
/// request (`http::Request`, 264 bytes) kept across an await.
const MAX_FUTURE_BYTES: usize = 2_560;

/// The size of `App::handle`'s future for one HTTP/1.1 request `head`, made by hyper from bytes
/// written into an in-memory pipe (the future itself is dropped unpolled: only its size is read).
async fn future_size(head: &'static [u8]) -> usize {
    let cfg = support::config(support::upstream().await, "");
    let clock: Arc<dyn Clock> = Arc::new(MonotonicClock::new());
    let app = Arc::new(App::new(&cfg, &clock, &Metrics::noop(), None));
    let peer: SocketAddr = ([192, 0, 2, 1], 40_000).into();
    let size = Arc::new(AtomicUsize::new(0));
    let seen = Arc::clone(&size);
    let service = hyper::service::service_fn(move |req| {
        let handled = Arc::clone(&app).handle(Arc::new(ConnInfo::new(peer, false)), req);
        seen.store(size_of_val(&handled), Ordering::Relaxed);
        drop(handled);
        async { Ok::<_, Infallible>(Response::new(Empty::<Bytes>::new())) }
    });
    let (mut client, server) = tokio::io::duplex(4096);
    let conn = tokio::spawn(
        hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(server), service),
    );
    client.write_all(head).await.unwrap();
    let mut answer = Vec::new();
    client.read_to_end(&mut answer).await.unwrap();
    assert!(answer.starts_with(b"HTTP/1.1 200"), "{answer:?}");
    conn.await.unwrap().unwrap();
    size.load(Ordering::Relaxed)
}

#[tokio::test]
async fn the_request_future_stays_small() {
    let size = future_size(b"GET / HTTP/1.1\r\nhost: door.test\r\nconnection: close\r\n\r\n").await;
    assert!(size > 0, "the service was called");
    assert!(
        size <= MAX_FUTURE_BYTES,
        "App::handle's future is {size} bytes, over {MAX_FUTURE_BYTES}: something new is kept \
         across an await on the request path (box it where it is taken, or drop it before the \
         await)"
    );
}
