//! A bare reverse proxy on hyper: door's serving design with none of door's own work, the floor
//! of `cargo xtask bench proxy --floor`.
//!
//! What it shares with door: one `current_thread` tokio runtime per worker thread, one accept
//! loop handing each connection to the next worker in turn (here on a runtime of its own; door's
//! runs on its control plane's); hyper-util's `auto` server (HTTP/1.1 and h2c by prior knowledge,
//! upgrades on) with door's connection settings (a 64 KiB read buffer and HTTP/2 header list, 250
//! concurrent HTTP/2 streams, extended CONNECT) and door's header read timeout, here kept by
//! hyper's own timer on every HTTP/1.1 head (door counts it in its connection watch, which this
//! proxy has not); one hyper-util pooled client per worker on door's upstream connector
//! (`TCP_NODELAY`, door's default upstream timeout as its connect timeout, no per-response
//! `HttpInfo`), every idle connection kept, door's idle timeout. The constants are door's own.
//!
//! What it does per request, what any reverse proxy must, with door's own functions where door
//! has one: the target rewritten to the upstream (HTTP/1.1, named by door's one-letter pool key,
//! which door's connector dials as the upstream) with `Host` from the target's authority when it
//! has one (door's `retarget`: an absolute-form target, an HTTP/2 `:authority`; RFC 9112 §3.2.2)
//! and the upstream's when there is none, the
//! hop-by-hop fields of RFC 9110 §7.6.1 removed both ways (door's `strip_hop_by_hop`), the peer's
//! address appended to `X-Forwarded-For` (the address's text made once per connection, as door
//! does), and an HTTP/2 request's `cookie` fields joined (door's `join_cookies`, RFC 9113 §8.2.3).
//!
//! What it does not do, and door does: routing, the client key, the limiter, checks of the
//! request head, identity fields dropped from untrusted peers, `Forwarded`, health caching,
//! deadlines per request, metrics, the idle watch, drain. The difference between door and this
//! proxy in the same run is the cost of those.

use std::{
    convert::Infallible,
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use anyhow::Context as _;
use clap::Parser;
use door_daemon::{
    config::{
        DEFAULT_HEADER_READ_TIMEOUT as HEADER_READ_TIMEOUT,
        DEFAULT_UPSTREAM_TIMEOUT as UPSTREAM_TIMEOUT, Upstream,
    },
    http::{
        connect::Connector,
        front::{MAX_CONCURRENT_STREAMS, MAX_HEADER_BYTES},
        upstream::{POOL_IDLE_TIMEOUT, join_cookies, retarget, strip_hop_by_hop},
    },
};
use http::{HeaderMap, HeaderValue, Request, Response, StatusCode, header};
use http_body_util::{BodyExt as _, Empty, combinators::BoxBody};
use hyper::body::{Bytes, Incoming};
use hyper_util::{
    client::legacy::Client,
    rt::{TokioExecutor, TokioIo, TokioTimer},
    server::conn::auto,
};
use tokio::{net::TcpStream, runtime::Handle};

/// The benchmark's bare hyper reverse proxy (the floor of door's design).
#[derive(Debug, Parser)]
struct Args {
    /// Address to listen on (HTTP/1.1 and h2c).
    #[arg(long)]
    listen: SocketAddr,
    /// The upstream's URL, `http://host:port` (HTTP/1.1), as door's `upstream`.
    #[arg(long)]
    upstream: String,
    /// Worker threads; the number of CPUs when not given.
    #[arg(long)]
    workers: Option<usize>,
}

type Body = BoxBody<Bytes, hyper::Error>;

/// What one worker serves with: its own pooled client (door keeps one per worker too).
struct Worker {
    client: Client<Connector, Incoming>,
    upstream: Upstream,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let workers = args.workers.unwrap_or_else(|| {
        std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
    });
    let upstream = Upstream::parse(&args.upstream)?;
    let mut handles = Vec::new();
    for i in 0..workers.max(1) {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        handles.push(runtime.handle().clone());
        std::thread::Builder::new()
            .name(format!("bare-worker-{i}"))
            .spawn(move || runtime.block_on(std::future::pending::<()>()))?;
    }
    let accept = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    accept.block_on(serve(args.listen, &upstream, &handles))
}

/// Accepts on `listen` and hands each connection to the next of `workers` in turn.
async fn serve(listen: SocketAddr, upstream: &Upstream, workers: &[Handle]) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .with_context(|| format!("binding {listen}"))?;
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT)
        .max_buf_size(MAX_HEADER_BYTES);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_header_list_size(u32::try_from(MAX_HEADER_BYTES).unwrap_or(u32::MAX))
        .max_concurrent_streams(MAX_CONCURRENT_STREAMS)
        .enable_connect_protocol();
    let builder = Arc::new(builder);
    let pools: Vec<Arc<Worker>> = workers
        .iter()
        .map(|_| {
            Arc::new(Worker {
                client: Client::builder(TokioExecutor::new())
                    .pool_max_idle_per_host(usize::MAX)
                    .pool_idle_timeout(POOL_IDLE_TIMEOUT)
                    .pool_timer(TokioTimer::new())
                    .set_host(false)
                    .build(Connector::new(upstream, UPSTREAM_TIMEOUT)),
                upstream: upstream.clone(),
            })
        })
        .collect();
    let turn = AtomicUsize::new(0);
    println!("bare proxy listening on http://{listen}");
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                eprintln!("accept: {e}");
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let Ok(stream) = stream.into_std() else {
            continue;
        };
        let i = turn.fetch_add(1, Ordering::Relaxed) % workers.len();
        let (Some(handle), Some(worker)) = (workers.get(i), pools.get(i)) else {
            continue;
        };
        let worker = Arc::clone(worker);
        let builder = Arc::clone(&builder);
        handle.spawn(async move {
            let Ok(stream) = TcpStream::from_std(stream) else {
                return;
            };
            let Ok(peer) = HeaderValue::from_str(&peer.ip().to_string()) else {
                return;
            };
            let service = hyper::service::service_fn(move |req| {
                let worker = Arc::clone(&worker);
                let peer = peer.clone();
                async move { Ok::<_, Infallible>(forward(&worker, &peer, req).await) }
            });
            let _ = builder
                .serve_connection_with_upgrades(TokioIo::new(stream), service)
                .await;
        });
    }
}

/// Sends `req` from the peer whose address is `peer` (made once per connection) to the upstream
/// and returns its answer (502 when it cannot be had).
async fn forward(
    worker: &Worker,
    peer: &HeaderValue,
    mut req: Request<Incoming>,
) -> Response<Body> {
    retarget(&mut req, &worker.upstream);
    let headers = req.headers_mut();
    strip_hop_by_hop(headers);
    append_forwarded_for(headers, peer);
    join_cookies(headers);
    match worker.client.request(req).await {
        Ok(resp) => {
            let (mut parts, body) = resp.into_parts();
            strip_hop_by_hop(&mut parts.headers);
            Response::from_parts(parts, body.boxed())
        }
        Err(_) => status(StatusCode::BAD_GATEWAY),
    }
}

/// An empty answer with `code`.
fn status(code: StatusCode) -> Response<Body> {
    let mut resp = Response::new(Empty::new().map_err(|never| match never {}).boxed());
    *resp.status_mut() = code;
    resp
}

/// Appends `peer` to `X-Forwarded-For`: the prior lines joined with `, ` and `peer` after them,
/// or `peer` alone.
fn append_forwarded_for(headers: &mut HeaderMap, peer: &HeaderValue) {
    let xff = header::HeaderName::from_static("x-forwarded-for");
    let mut prior = headers.get_all(&xff).iter();
    let value = match prior.next() {
        None => peer.clone(),
        Some(first) => {
            let mut v = first.as_bytes().to_vec();
            for line in prior {
                v.extend_from_slice(b", ");
                v.extend_from_slice(line.as_bytes());
            }
            v.extend_from_slice(b", ");
            v.extend_from_slice(peer.as_bytes());
            match HeaderValue::from_bytes(&v) {
                Ok(v) => v,
                Err(_) => return,
            }
        }
    };
    headers.insert(xff, value);
}
