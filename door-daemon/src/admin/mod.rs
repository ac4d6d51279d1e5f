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
//! the bad input (or 503 when the XDP shield is off). The admin listener has no authentication:
//! keep it on loopback or a Unix socket.

pub mod api;
pub mod listen;

pub use api::{AdminBlocklist, ApiError, ClusterBlocklist};
pub use listen::{AdminListener, SocketFile};

use std::{
    convert::Infallible,
    sync::{Arc, Mutex, PoisonError},
};

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode, header::CONTENT_TYPE};
use http_body_util::Full;
use hyper::body::Incoming;
use serde_json::{Value, json};

use crate::{
    limit::GroupLimiter,
    obs::{metrics::Metrics, prometheus::Exposition},
    shield::Shield,
};

/// How many source prefixes `/status` lists.
pub const TOP_PREFIXES: usize = 10;

/// The limit groups in force, read at each `/status` (a reload replaces them).
pub type LimiterSource = Arc<dyn Fn() -> Vec<Arc<GroupLimiter>> + Send + Sync>;

/// What `/status` reads.
#[derive(Clone)]
pub struct StatusSource {
    /// The limit groups in force.
    pub limiters: LimiterSource,
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

/// Serves the admin API on `listener` until the task is dropped.
pub async fn serve(listener: AdminListener, source: Arc<StatusSource>) {
    loop {
        let accepted = match &listener {
            AdminListener::Tcp(l) => l.accept().await.map(|(s, _)| {
                tokio::spawn(connection(s, Arc::clone(&source)));
            }),
            AdminListener::Unix(l) => l.accept().await.map(|(s, _)| {
                tokio::spawn(connection(s, Arc::clone(&source)));
            }),
        };
        if accepted.is_err() {
            // EMFILE and friends: back off instead of spinning (found by hostile testing).
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    }
}

/// Serves one admin connection (HTTP/1.1).
async fn connection<S>(stream: S, source: Arc<StatusSource>)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let service = hyper::service::service_fn(move |req| handle(req, Arc::clone(&source)));
    let io = hyper_util::rt::TokioIo::new(stream);
    if let Err(e) = hyper::server::conn::http1::Builder::new()
        .serve_connection(io, service)
        .await
    {
        tracing::debug!(error = %e, "admin connection ended with an error");
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
) -> Result<Response<Full<Bytes>>, Infallible> {
    let method = req.method().clone();
    let path = req.uri().path().to_owned();
    let query = req.uri().query().map(str::to_owned);
    let res = match (path.as_str(), method) {
        ("/status", Method::GET) => blocking(move || Ok(source.snapshot())).await,
        ("/metrics", Method::GET) => metrics(source).await,
        ("/clients", Method::GET) => {
            blocking(move || api::clients(&source, query.as_deref())).await
        }
        ("/status" | "/metrics" | "/clients", _) => not_allowed("GET"),
        ("/blocks", Method::GET) => blocking(move || api::blocks(&source, query.as_deref())).await,
        ("/blocks", Method::POST) => match api::read_body(req.into_body()).await {
            Ok(body) => blocking(move || api::block(&source, query.as_deref(), &body)).await,
            Err(e) => json_response(e.status, &e.body()),
        },
        ("/blocks", _) => not_allowed("GET, POST"),
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
