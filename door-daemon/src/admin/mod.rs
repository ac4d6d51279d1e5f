//! The admin listener (`admin_listen`: loopback by default, or a Unix socket, [`listen`]):
//!
//! - `GET /status`: JSON with the groups and their budgets, tracked clients, request outcome
//!   counts, whether the XDP program is attached and how, its counters, the blocklist and the top
//!   source prefixes by SYN count;
//! - `GET /metrics`: the Prometheus text exposition of every door instrument
//!   ([`crate::obs::prometheus`]);
//! - `GET /clients`, `DELETE /clients/{prefix}`, `GET /blocks`, `POST /blocks`,
//!   `DELETE /blocks/{prefix}`: the operator's endpoints ([`api`]).
//!
//! Every answer but `/metrics` is JSON; every refusal is `{"code", "message"}` with a 4xx naming
//! the bad input (or 503 when the XDP shield is off); `HEAD` is answered wherever `GET` is. The
//! admin listener has no authentication: keep it on loopback or a Unix socket. Requests a web
//! page made a browser send are refused ([`browser`]); a `POST` must be `application/json`. It
//! serves at most [`MAX_CONNECTIONS`] connections at once, each bounded by [`HEAD_TIMEOUT`],
//! [`IDLE_TIMEOUT`] and [`BODY_TIMEOUT`] (docs/operations.md, "Admin API").

pub mod api;
pub mod browser;
pub mod listen;

pub use api::{AdminBlocklist, ApiError, ClusterBlocklist};
pub use listen::{AdminListener, SocketFile};

use std::{
    convert::Infallible,
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

use bytes::Bytes;
use door_common::PrefixKey;
use http::{Method, Request, Response, StatusCode, header::CONTENT_TYPE};
use http_body_util::Full;
use hyper::body::Incoming;
use serde_json::{Value, json};
use tokio::sync::Semaphore;

use crate::{
    http::{
        PassThroughStatus,
        front::accept_failed,
        idle::{Activity, serve_watched},
    },
    limit::GroupLimiter,
    obs::{logging::RateLimitedWarn, metrics::Metrics, prometheus::Exposition},
    shield::Shield,
};

/// How many source prefixes `/status` lists.
pub const TOP_PREFIXES: usize = 10;

/// The limit groups in force, read at each `/status` (a reload replaces them).
pub type LimiterSource = Arc<dyn Fn() -> Vec<Arc<GroupLimiter>> + Send + Sync>;

/// The pass-through caps' state, read at each `/status` ([`crate::http::App::passthrough_status`]).
pub type PassThroughSource = Arc<dyn Fn() -> PassThroughStatus + Send + Sync>;

/// Called with a prefix an operator took off the blocklist (`DELETE /blocks/{prefix}`): the
/// escalator forgets it, so that it may be escalated again ([`crate::http::App::forget_escalation`]).
pub type UnblockHook = Arc<dyn Fn(&PrefixKey) + Send + Sync>;

/// What `/status` reads.
#[derive(Clone)]
pub struct StatusSource {
    /// The limit groups in force.
    pub limiters: LimiterSource,
    /// The caps on requests to routes in no group.
    pub passthrough: PassThroughSource,
    /// The instruments, for the groups' outcome totals.
    pub metrics: Metrics,
    /// The flood shield, when loaded.
    pub shield: Option<Arc<Mutex<Shield>>>,
    /// The configured XDP mode (`off`, `auto`, …), shown when the program is not attached.
    pub xdp_mode: &'static str,
    /// The cluster sync's state (`"state": "off"` without `[cluster]`).
    pub cluster: Arc<crate::cluster::ClusterStatus>,
    /// The Prometheus reader behind `GET /metrics` (`None`: answered 503).
    pub exposition: Option<Exposition>,
    /// The XDP blocklist for `/blocks` (`None` without the shield: answered 503).
    pub blocklist: Option<Arc<dyn AdminBlocklist>>,
    /// Told of every prefix `DELETE /blocks/{prefix}` names.
    pub unblocked: UnblockHook,
}

impl std::fmt::Debug for StatusSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StatusSource")
            .field("shield", &self.shield)
            .field("xdp_mode", &self.xdp_mode)
            .field("blocklist", &self.blocklist.is_some())
            .finish_non_exhaustive()
    }
}

/// `/status`'s `passthrough`: the caps, the requests holding a slot now, the clients a trusted
/// proxy named among them, and the refusals per cap since door started (by the cap's name, as
/// `door.passthrough_refused` counts them).
fn passthrough_json(p: &PassThroughStatus) -> Value {
    json!({
        "cap": p.cap,
        "per_client_cap": p.per_client_cap,
        "inflight": p.inflight,
        "named_clients": p.named_clients,
        "refused": p
            .refused()
            .into_iter()
            .map(|(reason, n)| (reason.to_owned(), json!(n)))
            .collect::<serde_json::Map<_, _>>(),
    })
}

impl StatusSource {
    /// The `/status` document.
    pub fn snapshot(&self) -> Value {
        let limiters = (self.limiters)();
        let groups: Vec<Value> = limiters
            .iter()
            .map(|l| {
                let b = l.budget();
                json!({
                    "name": l.group(),
                    "rate_per_s": b.rate,
                    "burst": b.burst,
                    "per_client": b.per_client,
                    "inflight_cap": b.inflight,
                    "max_clients": b.max_clients,
                    "charge": b.charge.as_str(),
                    "enforcing": l.enforcing(),
                    "tracked_clients": l.tracked_clients(),
                    "inflight": l.inflight(),
                    "streams": self.metrics.streams(l.group()),
                })
            })
            .collect();
        json!({
            "groups": groups,
            "requests": requests_json(&limiters, &self.metrics),
            "passthrough": passthrough_json(&(self.passthrough)()),
            "xdp": self.xdp_json(),
            "cluster": self.cluster.json(),
        })
    }

    fn xdp_json(&self) -> Value {
        let Some(shield) = &self.shield else {
            return json!({ "attached": false, "configured_mode": self.xdp_mode });
        };
        let shield = shield.lock().unwrap_or_else(PoisonError::into_inner);
        let attached = shield.attached();
        let counters = match shield.counters() {
            Ok(values) => {
                let mut m = serde_json::Map::new();
                for v in values {
                    m.insert(
                        format!("{}/{}", v.counter.verdict().as_str(), v.counter.reason()),
                        json!(v.packets),
                    );
                }
                Value::Object(m)
            }
            Err(e) => json!({ "error": e.to_string() }),
        };
        let top = match shield.top_prefixes(TOP_PREFIXES) {
            Ok(top) => Value::Array(
                top.into_iter()
                    .map(|(k, s)| json!({ "prefix": k.to_string(), "syns": s.syns, "drops": s.drops }))
                    .collect(),
            ),
            Err(e) => json!({ "error": e.to_string() }),
        };
        let blocked = match shield.blocked() {
            Ok(list) => {
                let now = crate::time::kernel_monotonic_ns();
                Value::Array(
                    list.into_iter()
                        .filter(|(_, deadline)| *deadline > now)
                        .map(|(k, deadline)| {
                            json!({ "prefix": k.to_string(), "seconds_left": (deadline - now).div_ceil(1_000_000_000) })
                        })
                        .collect(),
                )
            }
            Err(e) => json!({ "error": e.to_string() }),
        };
        let guard = match shield.guard() {
            Ok(g) => {
                json!({ "overflow_syns": g.overflow.syns, "overflow_drops": g.overflow.drops })
            }
            Err(e) => json!({ "error": e.to_string() }),
        };
        let cookies = match shield.cookies() {
            Ok(c) => json!({
                "active": c.active_cpus > 0,
                "active_cpus": c.active_cpus,
                "entered": c.entered,
                "left": c.left,
            }),
            Err(e) => json!({ "error": e.to_string() }),
        };
        let tracked = shield
            .tracked_prefixes()
            .map_or_else(|e| json!(e.to_string()), |n| json!(n));
        json!({
            "attached": attached.is_some(),
            "tracked_prefixes": tracked,
            "blocked": blocked,
            "churn_guard": guard,
            "cookie_mode": cookies,
            "configured_mode": self.xdp_mode,
            "interface": attached.map(|(i, _)| i),
            "mode": attached.map(|(_, m)| m.as_str()),
            "counters": counters,
            "top_prefixes": top,
        })
    }
}

/// `{group: {outcome: count}}`, outcomes with a zero count left out.
fn requests_json(limiters: &[Arc<GroupLimiter>], metrics: &Metrics) -> Value {
    let mut out = serde_json::Map::new();
    for l in limiters {
        let counts: serde_json::Map<String, Value> = metrics
            .totals(l.group())
            .into_iter()
            .filter(|(_, n)| *n > 0)
            .map(|(o, n)| (o.as_str().to_owned(), json!(n)))
            .collect();
        out.insert(l.group().to_owned(), Value::Object(counts));
    }
    Value::Object(out)
}

/// How long an admin connection may take to send a request head, in seconds: from its start,
/// and from the end of each answer (an idle keep-alive connection is closed then). 10 s.
pub const HEAD_TIMEOUT: Duration = Duration::from_secs(10);
/// An admin connection with no request in flight for this long after its last answer is shut
/// down (a client that does not read its answer holds it no longer), in seconds: 60 s.
pub const IDLE_TIMEOUT: Duration = Duration::from_mins(1);
/// How long a `POST` body may take to arrive, from the end of its head: 10 s (else 408).
pub const BODY_TIMEOUT: Duration = Duration::from_secs(10);
/// Admin connections served at once: 64. Past it, a new connection is closed at accept, before a
/// byte is read.
pub const MAX_CONNECTIONS: usize = 64;

/// Serves the admin API on `listener` until the task is dropped: at most [`MAX_CONNECTIONS`]
/// at once, each with [`HEAD_TIMEOUT`], [`IDLE_TIMEOUT`] and [`BODY_TIMEOUT`].
pub async fn serve(listener: AdminListener, source: Arc<StatusSource>) {
    static ACCEPT_FAILED: RateLimitedWarn = RateLimitedWarn::new(Duration::from_secs(10));
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        let (stream, peer): (Stream, String) = match &listener {
            AdminListener::Tcp(l) => match l.accept().await {
                Ok((s, peer)) => (Stream::Tcp(s), peer.to_string()),
                Err(e) => {
                    accept_failed(&ACCEPT_FAILED, "admin", &e).await;
                    continue;
                }
            },
            AdminListener::Unix(l) => match l.accept().await {
                Ok((s, _)) => (Stream::Unix(s), "unix socket".to_owned()),
                Err(e) => {
                    accept_failed(&ACCEPT_FAILED, "admin", &e).await;
                    continue;
                }
            },
        };
        let Ok(slot) = Arc::clone(&slots).try_acquire_owned() else {
            refused(&peer);
            drop(stream);
            continue;
        };
        let source = Arc::clone(&source);
        tokio::spawn(async move {
            match stream {
                Stream::Tcp(s) => {
                    // The address the client connected to: 127.0.0.1 through a `[::]` listener
                    // is `::ffff:127.0.0.1`.
                    let loopback = s
                        .local_addr()
                        .is_ok_and(|a| a.ip().to_canonical().is_loopback());
                    connection(s, source, peer, loopback).await;
                }
                Stream::Unix(s) => connection(s, source, peer, false).await,
            }
            drop(slot);
        });
    }
}

/// An accepted admin connection.
enum Stream {
    Tcp(tokio::net::TcpStream),
    Unix(tokio::net::UnixStream),
}

/// Logs (at most once a minute) an admin connection closed at accept: [`MAX_CONNECTIONS`] were
/// open.
fn refused(peer: &str) {
    static REFUSED: RateLimitedWarn = RateLimitedWarn::new(Duration::from_mins(1));
    if let Some(suppressed) = REFUSED.due() {
        tracing::warn!(
            %peer, limit = MAX_CONNECTIONS, suppressed,
            "admin connection refused at accept: the admin listener serves {MAX_CONNECTIONS} \
             connections at once (at most one line a minute)"
        );
    }
}

/// Serves one admin connection (HTTP/1.1) to its end, or until it has waited [`HEAD_TIMEOUT`]
/// for a request head or been idle for [`IDLE_TIMEOUT`]. `loopback`: it was made to a loopback
/// address ([`browser::check`]).
async fn connection<S>(stream: S, source: Arc<StatusSource>, peer: String, loopback: bool)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let activity = Arc::new(Activity::new());
    let for_service = Arc::clone(&activity);
    let service = hyper::service::service_fn(move |req| {
        let requests = Arc::clone(&for_service);
        let source = Arc::clone(&source);
        async move {
            requests.request_started(true);
            let _ended = RequestEnd(&requests);
            handle(req, source, loopback).await
        }
    });
    let io = hyper_util::rt::TokioIo::new(stream);
    // The watch closes a connection whose request head has not arrived within the timeout,
    // from its start and after each answer, and bounds the rest (an answer not read): hyper's
    // own header timer is off, as on the front.
    let conn = hyper::server::conn::http1::Builder::new()
        .header_read_timeout(None)
        .serve_connection(io, service);
    tokio::pin!(conn);
    serve_watched(
        conn,
        &activity,
        HEAD_TIMEOUT,
        IDLE_TIMEOUT,
        std::future::pending(),
        hyper::server::conn::http1::Connection::graceful_shutdown,
        format!("admin {peer}"),
    )
    .await;
}

/// Ends a request on its connection's [`Activity`] when dropped (answered, or given up by hyper).
struct RequestEnd<'a>(&'a Activity);

impl Drop for RequestEnd<'_> {
    fn drop(&mut self) {
        self.0.request_ended();
    }
}

/// The endpoints, for 404s.
const ENDPOINTS: &str = "GET /status, GET /metrics, GET /clients?group=G&top=N, \
                         DELETE /clients/{prefix}, GET /blocks, POST /blocks, DELETE /blocks/{prefix}";

fn not_allowed(allow: &'static str) -> Response<Full<Bytes>> {
    let mut res = json_response(
        StatusCode::METHOD_NOT_ALLOWED,
        &json!({ "code": "method-not-allowed", "message": format!("{allow} only") }),
    );
    res.headers_mut()
        .insert(http::header::ALLOW, http::HeaderValue::from_static(allow));
    res
}

/// Runs `f` off the async workers (the shield's maps and the limiters' tables are read under
/// locks), as a JSON answer.
async fn blocking(
    f: impl FnOnce() -> Result<Value, ApiError> + Send + 'static,
) -> Response<Full<Bytes>> {
    let result = tokio::task::spawn_blocking(f).await.unwrap_or_else(|e| {
        Err(ApiError {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            code: "internal",
            message: e.to_string(),
        })
    });
    match result {
        Ok(v) => json_response(StatusCode::OK, &v),
        Err(e) => json_response(e.status, &e.body()),
    }
}

async fn handle(
    req: Request<Incoming>,
    source: Arc<StatusSource>,
    loopback: bool,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let authority = req.uri().authority().map(http::uri::Authority::as_str);
    if let Err(e) = browser::check(authority, req.headers(), loopback) {
        // Its body, if any, is not read.
        return Ok(closing(json_response(e.status, &e.body())));
    }
    let method = req.method().clone();
    let path = req.uri().path().to_owned();
    let query = req.uri().query().map(str::to_owned);
    // HEAD is answered as GET; hyper sends the head only (RFC 9110 §9.3.2).
    let read = method == Method::GET || method == Method::HEAD;
    let res = match (path.as_str(), method) {
        ("/status", _) if read => blocking(move || api::status(&source, query.as_deref())).await,
        ("/metrics", _) if read => metrics(source).await,
        ("/clients", _) if read => blocking(move || api::clients(&source, query.as_deref())).await,
        ("/status" | "/metrics" | "/clients", _) => not_allowed("GET, HEAD"),
        ("/blocks", _) if read => blocking(move || api::blocks(&source, query.as_deref())).await,
        ("/blocks", Method::POST) => {
            let body = match browser::json_body(req.headers()) {
                Ok(()) => api::read_body(req.into_body(), BODY_TIMEOUT).await,
                Err(e) => Err(e),
            };
            match body {
                Ok(body) => blocking(move || api::block(&source, query.as_deref(), &body)).await,
                Err(e) => closing(json_response(e.status, &e.body())),
            }
        }
        ("/blocks", _) => not_allowed("GET, HEAD, POST"),
        (p, m) => match (p.strip_prefix("/clients/"), p.strip_prefix("/blocks/")) {
            (Some(_), _) | (_, Some(_)) if m != Method::DELETE => not_allowed("DELETE"),
            (Some(raw), _) => match decode(raw) {
                Ok(raw) => blocking(move || api::forget(&source, &raw, query.as_deref())).await,
                Err(e) => json_response(e.status, &e.body()),
            },
            (_, Some(raw)) => match decode(raw) {
                Ok(raw) => blocking(move || api::unblock(&source, &raw, query.as_deref())).await,
                Err(e) => json_response(e.status, &e.body()),
            },
            _ => json_response(
                StatusCode::NOT_FOUND,
                &json!({ "code": "not-found", "message": format!("no such endpoint; try {ENDPOINTS}") }),
            ),
        },
    };
    Ok(res)
}

/// `res` with `Connection: close`: the request's body was not read to its end, so the
/// connection cannot carry another request.
fn closing(mut res: Response<Full<Bytes>>) -> Response<Full<Bytes>> {
    res.headers_mut().insert(
        http::header::CONNECTION,
        http::HeaderValue::from_static("close"),
    );
    res
}

/// A path's `{prefix}`, percent-decoded (`198.51.100.7%2F32` and `198.51.100.7/32` alike).
fn decode(raw: &str) -> Result<String, ApiError> {
    percent_encoding::percent_decode_str(raw)
        .decode_utf8()
        .map(std::borrow::Cow::into_owned)
        .map_err(|_| ApiError {
            status: StatusCode::BAD_REQUEST,
            code: "bad-prefix",
            message: format!("{raw:?} is not UTF-8 once percent-decoded"),
        })
}

/// `GET /metrics`: collected off the async workers (the shield's callbacks read the XDP maps).
async fn metrics(source: Arc<StatusSource>) -> Response<Full<Bytes>> {
    let Some(exposition) = source.exposition.clone() else {
        return json_response(
            StatusCode::SERVICE_UNAVAILABLE,
            &json!({ "code": "no-metrics", "message": "this door collects no metrics" }),
        );
    };
    let rendered = tokio::task::spawn_blocking(move || exposition.render())
        .await
        .map_err(|e| e.to_string())
        .and_then(|r| r.map_err(|e| e.to_string()));
    match rendered {
        Ok(text) => {
            let mut res = Response::new(Full::new(Bytes::from(text)));
            res.headers_mut().insert(
                CONTENT_TYPE,
                http::HeaderValue::from_static(crate::obs::prometheus::CONTENT_TYPE),
            );
            res
        }
        Err(e) => json_response(
            StatusCode::INTERNAL_SERVER_ERROR,
            &json!({ "code": "internal", "message": e }),
        ),
    }
}

/// `body` as pretty JSON with a trailing newline.
fn json_response(status: StatusCode, body: &Value) -> Response<Full<Bytes>> {
    let mut res = Response::new(Full::new(Bytes::from(format!("{body:#}\n"))));
    *res.status_mut() = status;
    res.headers_mut().insert(
        CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    res
}
