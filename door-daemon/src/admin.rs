//! The admin endpoint (`admin_listen`, loopback by default): `GET /status` answers JSON with the
//! groups and their budgets, tracked clients, request outcome counts, whether the XDP program is
//! attached and how, its counters, and the top source prefixes by SYN count; `GET /metrics`
//! answers the Prometheus text exposition of every door instrument ([`crate::obs::prometheus`]).

use std::{
    convert::Infallible,
    net::SocketAddr,
    sync::{Arc, Mutex, PoisonError},
};

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode, header::CONTENT_TYPE};
use http_body_util::Full;
use hyper::body::Incoming;
use serde_json::{Value, json};
use tokio::net::TcpListener;

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
}

impl std::fmt::Debug for StatusSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StatusSource")
            .field("shield", &self.shield)
            .field("xdp_mode", &self.xdp_mode)
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
        let tracked = shield
            .tracked_prefixes()
            .map_or_else(|e| json!(e.to_string()), |n| json!(n));
        json!({
            "attached": attached.is_some(),
            "tracked_prefixes": tracked,
            "blocked": blocked,
            "churn_guard": guard,
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

/// Serves `GET /status` and `GET /metrics` on `listener` until the task is dropped.
pub async fn serve(listener: TcpListener, source: Arc<StatusSource>) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            // EMFILE and friends: back off instead of spinning (found by hostile testing).
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            continue;
        };
        let source = Arc::clone(&source);
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req| handle(req, Arc::clone(&source)));
            let io = hyper_util::rt::TokioIo::new(stream);
            if let Err(e) = hyper::server::conn::http1::Builder::new()
                .serve_connection(io, service)
                .await
            {
                tracing::debug!(error = %e, "admin connection ended with an error");
            }
        });
    }
}

async fn handle(
    req: Request<Incoming>,
    source: Arc<StatusSource>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let path = req.uri().path();
    if path != "/status" && path != "/metrics" {
        return Ok(json_response(
            StatusCode::NOT_FOUND,
            &json!({ "code": "not-found", "message": "try GET /status or GET /metrics" }),
        ));
    }
    if req.method() != Method::GET {
        return Ok(json_response(
            StatusCode::METHOD_NOT_ALLOWED,
            &json!({ "code": "method-not-allowed", "message": "GET only" }),
        ));
    }
    if path == "/metrics" {
        return Ok(metrics(source).await);
    }
    // Reading the maps is a few thousand syscalls at most: keep it off the async workers.
    let (status, body) = match tokio::task::spawn_blocking(move || source.snapshot()).await {
        Ok(v) => (StatusCode::OK, v),
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            json!({ "code": "internal", "message": e.to_string() }),
        ),
    };
    Ok(json_response(status, &body))
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

/// The address `/status` is served on, for log lines.
pub fn url(addr: SocketAddr) -> String {
    format!("http://{addr}/status")
}
