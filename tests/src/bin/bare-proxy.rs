//! A bare reverse proxy on hyper: door's serving design with none of door's own work, the floor
//! of `cargo xtask bench proxy --floor`.
//!
//! What it shares with door: one `current_thread` tokio runtime per worker thread, one accept
//! loop handing each connection to the next worker in turn; hyper-util's `auto` server (HTTP/1.1
//! and h2c by prior knowledge) with door's connection settings (hyper's Tokio timer and a
//! header read timeout, a 64 KiB read buffer, 250 concurrent HTTP/2 streams); one hyper-util
//! pooled client per worker on door's upstream connector (`TCP_NODELAY`, no per-response
//! `HttpInfo`), every idle connection kept, door's idle timeout. The constants are door's own.
//!
//! What it does per request, what any reverse proxy must: the target rewritten to the upstream
//! (HTTP/1.1), `Host` kept (from the `:authority` of an HTTP/2 request), the hop-by-hop fields of
//! RFC 9110 §7.6.1 removed both ways, and the peer's address appended to `X-Forwarded-For`.
//!
//! What it does not do, and door does: routing, the client key, the limiter, checks of the
//! request head, health caching, deadlines per request, metrics, the idle watch, drain. The
//! difference between door and this proxy in the same run is the cost of those.

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
    config::DEFAULT_HEADER_READ_TIMEOUT as HEADER_READ_TIMEOUT,
    http::{
        connect::Connector,
        front::{MAX_CONCURRENT_STREAMS, MAX_HEADER_BYTES},
        upstream::POOL_IDLE_TIMEOUT,
    },
};
use http::{HeaderMap, HeaderValue, Request, Response, StatusCode, Uri, Version, header, uri};
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
    /// The upstream's address (HTTP/1.1).
    #[arg(long)]
    upstream: SocketAddr,
    /// Worker threads; the number of CPUs when not given.
    #[arg(long)]
    workers: Option<usize>,
}

type Body = BoxBody<Bytes, hyper::Error>;

/// What one worker serves with.
struct Worker {
    client: Client<Connector, Incoming>,
    authority: uri::Authority,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let workers = args.workers.unwrap_or_else(|| {
        std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
    });
    let authority: uri::Authority = args
        .upstream
        .to_string()
        .parse()
        .with_context(|| format!("upstream {} as an authority", args.upstream))?;
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
    accept.block_on(serve(args.listen, authority, &handles))
}

/// Accepts on `listen` and hands each connection to the next of `workers` in turn.
async fn serve(
    listen: SocketAddr,
    authority: uri::Authority,
    workers: &[Handle],
) -> anyhow::Result<()> {
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
        .max_concurrent_streams(MAX_CONCURRENT_STREAMS);
    let builder = Arc::new(builder);
    // One pool per worker, made on first use by the worker itself.
    let per_worker: Vec<Arc<std::sync::OnceLock<Arc<Worker>>>> = workers
        .iter()
        .map(|_| Arc::new(std::sync::OnceLock::new()))
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
        let (Some(handle), Some(slot)) = (workers.get(i), per_worker.get(i)) else {
            continue;
        };
        let slot = Arc::clone(slot);
        let builder = Arc::clone(&builder);
        let authority = authority.clone();
        handle.spawn(async move {
            let Ok(stream) = TcpStream::from_std(stream) else {
                return;
            };
            let worker = Arc::clone(slot.get_or_init(|| {
                Arc::new(Worker {
                    client: Client::builder(TokioExecutor::new())
                        .pool_max_idle_per_host(usize::MAX)
                        .pool_idle_timeout(POOL_IDLE_TIMEOUT)
                        .pool_timer(TokioTimer::new())
                        .build(Connector::new()),
                    authority,
                })
            }));
            let service = hyper::service::service_fn(move |req| {
                let worker = Arc::clone(&worker);
                async move { Ok::<_, Infallible>(forward(&worker, peer, req).await) }
            });
            let _ = builder
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

/// Sends `req` from `peer` to the upstream and returns its answer (502 when it cannot be had).
async fn forward(worker: &Worker, peer: SocketAddr, mut req: Request<Incoming>) -> Response<Body> {
    let path = req
        .uri()
        .path_and_query()
        .cloned()
        .unwrap_or_else(|| uri::PathAndQuery::from_static("/"));
    if !req.headers().contains_key(header::HOST) {
        let host = req
            .uri()
            .authority()
            .and_then(|a| HeaderValue::from_str(a.as_str()).ok());
        if let Some(host) = host {
            req.headers_mut().insert(header::HOST, host);
        }
    }
    let mut parts = uri::Parts::default();
    parts.scheme = Some(uri::Scheme::HTTP);
    parts.authority = Some(worker.authority.clone());
    parts.path_and_query = Some(path);
    let Ok(target) = Uri::from_parts(parts) else {
        return status(StatusCode::BAD_REQUEST);
    };
    *req.uri_mut() = target;
    *req.version_mut() = Version::HTTP_11;
    strip_hop_by_hop(req.headers_mut());
    append_forwarded_for(req.headers_mut(), peer);
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

/// Removes the fields `Connection` names, then the hop-by-hop fields themselves.
fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let named: Vec<header::HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        // The options every keep-alive answer carries name no field to remove.
        .filter(|name| {
            !name.eq_ignore_ascii_case("keep-alive") && !name.eq_ignore_ascii_case("close")
        })
        .filter_map(|name| header::HeaderName::from_bytes(name.as_bytes()).ok())
        .collect();
    for name in named {
        headers.remove(name);
    }
    for name in [
        header::CONNECTION,
        header::TE,
        header::TRAILER,
        header::TRANSFER_ENCODING,
        header::UPGRADE,
        header::PROXY_AUTHORIZATION,
        header::PROXY_AUTHENTICATE,
    ] {
        headers.remove(name);
    }
    headers.remove("keep-alive");
    headers.remove("proxy-connection");
}

/// Appends `peer`'s address to `X-Forwarded-For` (one field, comma-separated).
fn append_forwarded_for(headers: &mut HeaderMap, peer: SocketAddr) {
    let ip = peer.ip().to_string();
    let value = match headers.get(header::HeaderName::from_static("x-forwarded-for")) {
        Some(prior) => {
            let mut v = prior.as_bytes().to_vec();
            v.extend_from_slice(b", ");
            v.extend_from_slice(ip.as_bytes());
            HeaderValue::from_bytes(&v)
        }
        None => HeaderValue::from_str(&ip),
    };
    if let Ok(value) = value {
        headers.insert("x-forwarded-for", value);
    }
}
