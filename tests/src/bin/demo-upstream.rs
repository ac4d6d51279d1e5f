//! door's demo upstream: a tiny application answering the example routes, so `cargo xtask run`
//! and the end-to-end suites need nothing else.
//!
//! - `POST /webhooks/github`: 200 `{"received_bytes": N}` (reads the whole body).
//! - `GET /l/session/{id}`: 200, a one-line page naming the session.
//! - `/healthz`: 200 `ok`.
//! - `GET /ws` with `Upgrade: websocket`: 101, then a WebSocket echo (tokio-tungstenite): text and
//!   binary messages come back as sent, pings are answered, a close is answered and ends it.
//! - `GET /events` (without a query): 200 `text/event-stream`, `data: tick N` (N from 0) every
//!   100 ms, at most [`EVENTS`] of them (then the stream ends), until the client goes away.
//! - `/slow`: as `?delay_ms=1000` below (`?ms=N` sets the delay).
//! - `/stream`: as `?chunks=16&chunk_bytes=1024&chunk_ms=50` below.
//! - `/echo-body`: as `?echo=1` below (`/echo` is the JSON echo of the next line).
//! - anything else: 200, JSON echo of the method, path and the forwarding headers it received.
//!
//! Any request may carry `x-demo-status: NNN` (or `?status=NNN`) to get that status instead, which
//! is how tests make the upstream answer 4xx. Any request may also carry, in its query:
//!
//! - `delay_ms=N`: the response head is sent after N ms (at most [`MAX_DELAY_MS`]);
//! - `chunks=N&chunk_bytes=S&chunk_ms=M`: the body is N chunks of S bytes (`x`), one every M ms,
//!   streamed (at most [`MAX_CHUNKS`] chunks of [`MAX_CHUNK_BYTES`]); the soak test's streaming
//!   responses and slow readers;
//!   with `sse=1`, typed `text/event-stream` (a stream to door);
//! - `echo=1`: the body is the request body, streamed back as it arrives.

use std::{
    convert::Infallible,
    net::SocketAddr,
    pin::Pin,
    task::{Context, Poll},
    time::Duration,
};

use anyhow::Context as _;
use bytes::Bytes;
use clap::Parser;
use futures_util::{SinkExt as _, StreamExt as _};
use http::{HeaderValue, Method, Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Full, StreamBody, combinators::UnsyncBoxBody};
use hyper::body::{Body, Frame, Incoming};
use hyper_util::{
    rt::{TokioExecutor, TokioIo},
    server::conn::auto,
};
use serde_json::json;
use tokio::sync::mpsc;
use tokio_tungstenite::{
    WebSocketStream,
    tungstenite::{handshake::derive_accept_key, protocol::Role},
};

/// The events `GET /events` sends at most (a minute's worth) before it ends the stream.
const EVENTS: u64 = 600;
/// The time between two events of `GET /events`.
const EVENT_EVERY: Duration = Duration::from_millis(100);

/// Demo upstream for door.
#[derive(Debug, Parser)]
struct Args {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:3000")]
    listen: SocketAddr,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(serve(args.listen))
}

async fn serve(addr: SocketAddr) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("binding {addr}"))?;
    println!(
        "demo upstream listening on http://{}",
        listener.local_addr()?
    );
    loop {
        let (stream, _) = listener.accept().await?;
        tokio::spawn(async move {
            let service = hyper::service::service_fn(handle);
            // With upgrades: `GET /ws` takes the connection over once its 101 is written.
            let _ = auto::Builder::new(TokioExecutor::new())
                .serve_connection_with_upgrades(TokioIo::new(stream), service)
                .await;
        });
    }
}

/// The longest `delay_ms` honoured.
const MAX_DELAY_MS: u64 = 10_000;
/// The most chunks a streamed body has.
const MAX_CHUNKS: u64 = 10_000;
/// The largest chunk of a streamed body.
const MAX_CHUNK_BYTES: usize = 64 << 10;

/// A response body: a whole one, streamed chunks, or the request body echoed back.
enum Reply {
    Whole(Full<Bytes>),
    Chunks(mpsc::Receiver<Bytes>),
    Echo(Incoming),
    /// `GET /events`' stream of events.
    Events(UnsyncBoxBody<Bytes, Infallible>),
}

impl Body for Reply {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        match self.get_mut() {
            Self::Whole(full) => Pin::new(full)
                .poll_frame(cx)
                .map_err(|never| match never {}),
            Self::Chunks(rx) => rx.poll_recv(cx).map(|c| c.map(|c| Ok(Frame::data(c)))),
            Self::Echo(body) => Pin::new(body).poll_frame(cx),
            Self::Events(body) => Pin::new(body)
                .poll_frame(cx)
                .map_err(|never| match never {}),
        }
    }
}

/// The query parameter `name` as a number.
fn query_num(req: &Request<Incoming>, name: &str) -> Option<u64> {
    req.uri().query()?.split('&').find_map(|kv| {
        kv.strip_prefix(name)?
            .strip_prefix('=')
            .and_then(|v| v.parse().ok())
    })
}

/// The body of `chunks` chunks of `bytes` bytes, one every `every`, sent by a task that ends when
/// the body is dropped (door or its client went away).
fn chunked(chunks: u64, bytes: usize, every: Duration) -> Reply {
    let (tx, rx) = mpsc::channel(1);
    let chunk = Bytes::from(vec![b'x'; bytes.min(MAX_CHUNK_BYTES)]);
    tokio::spawn(async move {
        for i in 0..chunks.min(MAX_CHUNKS) {
            if i > 0 && !every.is_zero() {
                tokio::time::sleep(every).await;
            }
            if tx.send(chunk.clone()).await.is_err() {
                return;
            }
        }
    });
    Reply::Chunks(rx)
}

async fn handle(req: Request<Incoming>) -> Result<Response<Reply>, Infallible> {
    // A query (`?chunks=…&sse=1`, the soak's) asks for the generic streamed body instead.
    if req.method() == Method::GET && req.uri().query().is_none() {
        match req.uri().path() {
            "/ws" => return Ok(websocket(req)),
            "/events" => return Ok(events()),
            _ => {}
        }
    }
    let forced = req
        .headers()
        .get("x-demo-status")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
        .or_else(|| {
            req.uri()
                .query()
                .and_then(|q| q.split('&').find_map(|kv| kv.strip_prefix("status=")))
                .map(str::to_owned)
        })
        .and_then(|s| s.parse::<u16>().ok())
        .and_then(|s| StatusCode::from_u16(s).ok());
    let path = req.uri().path().to_owned();
    let delay = query_num(&req, "delay_ms")
        .or_else(|| (path == "/slow").then(|| query_num(&req, "ms").unwrap_or(1000)))
        .map(|ms| Duration::from_millis(ms.min(MAX_DELAY_MS)));
    let chunks = query_num(&req, "chunks").map(|n| {
        (
            n,
            query_num(&req, "chunk_bytes").unwrap_or(1024),
            query_num(&req, "chunk_ms").unwrap_or(0),
        )
    });
    let chunks = chunks.or_else(|| (path == "/stream").then_some((16, 1024, 50)));
    let echo_body = path == "/echo-body" || query_num(&req, "echo") == Some(1);
    let sse = query_num(&req, "sse") == Some(1);
    if let Some(delay) = delay {
        tokio::time::sleep(delay).await;
    }
    let header = |name: &str| {
        req.headers()
            .get_all(name)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .collect::<Vec<_>>()
            .join(", ")
    };
    let echo = json!({
        "method": req.method().as_str(),
        "path": path,
        "host": header("host"),
        "x_forwarded_for": header("x-forwarded-for"),
        "x_forwarded_proto": header("x-forwarded-proto"),
        "forwarded": header("forwarded"),
    });
    let (content_type, body) = if echo_body {
        let mut res = Response::new(Reply::Echo(req.into_body()));
        *res.status_mut() = forced.unwrap_or(StatusCode::OK);
        res.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/octet-stream"),
        );
        return Ok(res);
    } else if let Some((n, bytes, ms)) = chunks {
        let bytes = usize::try_from(bytes).unwrap_or(MAX_CHUNK_BYTES);
        let mut res = Response::new(chunked(n, bytes, Duration::from_millis(ms)));
        *res.status_mut() = forced.unwrap_or(StatusCode::OK);
        res.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static(if sse {
                "text/event-stream"
            } else {
                "text/plain"
            }),
        );
        return Ok(res);
    } else if path == "/webhooks/github" {
        let n = req
            .into_body()
            .collect()
            .await
            .map_or(0, |b| b.to_bytes().len());
        (
            "application/json",
            json!({ "received_bytes": n }).to_string(),
        )
    } else if let Some(id) = path.strip_prefix("/l/session/") {
        ("text/plain", format!("session {id}\n"))
    } else if path == "/healthz" {
        ("text/plain", "ok\n".to_owned())
    } else {
        ("application/json", echo.to_string())
    };
    let mut res = Response::new(Reply::Whole(Full::new(Bytes::from(body))));
    *res.status_mut() = forced.unwrap_or(StatusCode::OK);
    res.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    Ok(res)
}

/// `GET /ws`: answers a WebSocket handshake (RFC 6455 §4.2) with 101 and echoes on the upgraded
/// connection; anything else is a 400.
fn websocket(mut req: Request<Incoming>) -> Response<Reply> {
    let headers = req.headers();
    let asked = headers
        .get(header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("websocket"));
    let key = headers
        .get(header::SEC_WEBSOCKET_KEY)
        .map(|k| derive_accept_key(k.as_bytes()));
    let (true, Some(accept)) = (asked, key) else {
        let mut res = Response::new(Reply::Whole(Full::new(Bytes::from_static(
            b"a WebSocket handshake, please\n",
        ))));
        *res.status_mut() = StatusCode::BAD_REQUEST;
        return res;
    };
    let upgrade = hyper::upgrade::on(&mut req);
    tokio::spawn(async move {
        let Ok(upgraded) = upgrade.await else {
            return;
        };
        let mut ws =
            WebSocketStream::from_raw_socket(TokioIo::new(upgraded), Role::Server, None).await;
        // Ends with the connection: tungstenite answers a ping with a pong and a close with a
        // close, after which the stream ends.
        while let Some(Ok(msg)) = ws.next().await {
            if (msg.is_text() || msg.is_binary()) && ws.send(msg).await.is_err() {
                return;
            }
        }
    });
    let mut res = Response::new(Reply::Whole(Full::new(Bytes::new())));
    *res.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    let h = res.headers_mut();
    h.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    h.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
    if let Ok(accept) = HeaderValue::from_str(&accept) {
        h.insert(header::SEC_WEBSOCKET_ACCEPT, accept);
    }
    res
}

/// `GET /events`: `data: tick N` every [`EVENT_EVERY`], the first at once, [`EVENTS`] at most.
/// The stream (and its timer) is dropped when the client goes away.
fn events() -> Response<Reply> {
    let ticks = futures_util::stream::unfold(0u64, |n| async move {
        if n >= EVENTS {
            return None;
        }
        if n > 0 {
            tokio::time::sleep(EVENT_EVERY).await;
        }
        let event = Frame::data(Bytes::from(format!("data: tick {n}\n\n")));
        Some((Ok::<_, Infallible>(event), n + 1))
    });
    let mut res = Response::new(Reply::Events(StreamBody::new(ticks).boxed_unsync()));
    let h = res.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    res
}
