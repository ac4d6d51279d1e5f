//! An in-process door for the admin tests: a test upstream, door's front on 127.0.0.1 and its
//! admin listener, with a real meter provider (the Prometheus reader) behind the instruments.

#![expect(
    clippy::unwrap_used,
    dead_code,
    unreachable_pub,
    reason = "test support shared by several test binaries; each uses a part"
)]

use std::{
    collections::BTreeMap,
    convert::Infallible,
    net::SocketAddr,
    path::Path,
    sync::{Arc, Mutex},
    time::Duration,
};

use bytes::Bytes;
use door_common::PrefixKey;
use door_daemon::{
    admin::{AdminBlocklist, AdminListener, SocketFile, StatusSource},
    config::{AdminListen, Config},
    http::{App, ConnSettings, Front},
    obs::{
        metrics::{BudgetInstruments, Metrics, observe_budgets},
        otlp::Telemetry,
    },
    time::{Clock, MonotonicClock},
};
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpStream};

/// The upstream: `/l/session/missing` answers 404, everything else 200 `ok`.
pub async fn upstream() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((s, _)) = l.accept().await else { return };
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(|req: Request<Incoming>| async move {
                    let status = if req.uri().path().ends_with("/missing") {
                        StatusCode::NOT_FOUND
                    } else {
                        StatusCode::OK
                    };
                    let mut res = Response::new(Full::new(Bytes::from_static(b"ok")));
                    *res.status_mut() = status;
                    Ok::<_, Infallible>(res)
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(s), svc)
                    .await;
            });
        }
    });
    addr
}

/// door's configuration for the tests: link (burst 3, one token per 1000 s, so no token comes
/// back during a test), health and a `stream = true` route, `extra` appended.
pub fn config(upstream: SocketAddr, extra: &str) -> Config {
    let text = format!(
        r#"
listen = ["127.0.0.1:0"]
upstream = "http://{upstream}"
admin_listen = "off"
trusted_proxies = ["127.0.0.1/32"]

[[route]]
group = "link"
methods = ["GET"]
path = "/l/session/{{id}}"
[[route]]
group = "health"
path = "/healthz"
[[route]]
group = "link"
path = "/events"
stream = true

[group.link]
rate = 0.001
burst = 3
per_client = 2
inflight = 4
{extra}
"#
    );
    Config::from_toml("admin-test.toml", &text).unwrap()
}

/// A running in-process door.
pub struct Door {
    /// door's front (client traffic).
    pub addr: SocketAddr,
    /// The front and its app.
    pub front: Front,
    /// The meter provider behind the instruments.
    pub telemetry: Telemetry,
    /// What the admin listener serves.
    pub source: Arc<StatusSource>,
    /// `door.inflight_cap` and `door.max_clients`, as the daemon registers them.
    pub budgets: BudgetInstruments,
}

impl Door {
    /// door with `cfg` (its front on 127.0.0.1, an ephemeral port), no shield.
    pub async fn start(cfg: &Config) -> Self {
        Self::start_with(cfg, None).await
    }

    /// As [`Door::start`], the admin API's `/blocks` on `blocklist`.
    pub async fn start_with(cfg: &Config, blocklist: Option<Arc<dyn AdminBlocklist>>) -> Self {
        let telemetry = Telemetry::local();
        let metrics = Metrics::new(&telemetry.meter());
        let clock: Arc<dyn Clock> = Arc::new(MonotonicClock::new());
        let app = Arc::new(App::new(cfg, &clock, &metrics, None));
        let front = Front::new(Arc::clone(&app), ConnSettings::from_config(cfg), None);
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        front.serve(l, false);
        let for_budgets = Arc::clone(&app);
        let budgets = observe_budgets(metrics.meter(), move || for_budgets.limiters());
        let for_status = Arc::clone(&app);
        let for_unblock = Arc::clone(&app);
        let source = Arc::new(StatusSource {
            limiters: Arc::new(move || for_status.limiters()),
            passthrough: {
                let caps = Arc::clone(&app);
                Arc::new(move || caps.passthrough_status())
            },
            metrics: metrics.clone(),
            shield: None,
            xdp_mode: "off",
            cluster: Arc::new(door_daemon::cluster::ClusterStatus::off()),
            exposition: Some(telemetry.exposition()),
            blocklist,
            unblocked: Arc::new(move |key| for_unblock.forget_escalation(key)),
        });
        Self {
            addr,
            front,
            telemetry,
            source,
            budgets,
        }
    }

    /// Starts an admin listener on 127.0.0.1 (an ephemeral port) and returns its address.
    pub async fn admin(&self) -> SocketAddr {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        tokio::spawn(door_daemon::admin::serve(
            AdminListener::Tcp(l),
            Arc::clone(&self.source),
        ));
        addr
    }

    /// Starts an admin listener bound to `bind` as door binds `admin_listen` (`"[::]:0"`: every
    /// address of both families, IPv6-only off whatever the host's `bindv6only`) and returns its
    /// address.
    pub fn admin_on(&self, bind: &str) -> SocketAddr {
        let (l, _) = AdminListener::bind(&AdminListen::Tcp(bind.parse().unwrap()), false).unwrap();
        let addr = match &l {
            AdminListener::Tcp(tcp) => tcp.local_addr().unwrap(),
            AdminListener::Unix(_) => unreachable!("bound as a TCP address"),
        };
        tokio::spawn(door_daemon::admin::serve(l, Arc::clone(&self.source)));
        addr
    }

    /// Starts an admin listener on the Unix socket `path`; the socket file goes when the
    /// returned value drops.
    pub fn admin_unix(&self, path: &Path) -> SocketFile {
        let (l, file) = AdminListener::bind(&AdminListen::Unix(path.to_owned()), false).unwrap();
        tokio::spawn(door_daemon::admin::serve(l, Arc::clone(&self.source)));
        file.unwrap()
    }

    /// One GET through door's front with `X-Forwarded-For: xff` (door trusts 127.0.0.1, so the
    /// key is `xff`'s /32): the status.
    pub async fn get(&self, path: &str, xff: &str) -> StatusCode {
        let (status, _) = request(self.addr, "GET", path, &[("x-forwarded-for", xff)], "").await;
        status
    }
}

/// An in-memory blocklist: prefix → seconds left (time does not pass).
#[derive(Debug, Default)]
pub struct FakeBlocklist(pub Mutex<BTreeMap<PrefixKey, u64>>);

impl AdminBlocklist for FakeBlocklist {
    fn list(&self) -> Result<Vec<(PrefixKey, u64)>, door_daemon::shield::ShieldError> {
        Ok(self
            .0
            .lock()
            .unwrap()
            .iter()
            .map(|(k, s)| (*k, *s))
            .collect())
    }

    fn block(
        &self,
        key: PrefixKey,
        duration: Duration,
    ) -> Result<(), door_daemon::shield::ShieldError> {
        self.0.lock().unwrap().insert(key, duration.as_secs());
        Ok(())
    }

    fn unblock(&self, key: &PrefixKey) -> Result<bool, door_daemon::shield::ShieldError> {
        Ok(self.0.lock().unwrap().remove(key).is_some())
    }
}

/// One HTTP/1.1 request over the Unix socket `path`: status and body.
pub async fn request_unix(
    path: &Path,
    method: &str,
    target: &str,
    body: &str,
) -> (StatusCode, String) {
    let s = tokio::net::UnixStream::connect(path).await.unwrap();
    send(s, method, target, &[], body).await
}

/// One HTTP/1.1 request on a fresh connection to `addr`: status and body.
pub async fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (StatusCode, String) {
    let s = TcpStream::connect(addr).await.unwrap();
    send(s, method, path, headers, body).await
}

async fn send<S>(
    s: S,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (StatusCode, String)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(s))
        .await
        .unwrap();
    tokio::spawn(conn);
    let mut req = Request::builder().method(method).uri(path);
    if !headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("host")) {
        req = req.header("host", "door.test");
    }
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let res = send
        .send_request(req.body(Full::new(Bytes::from(body.to_owned()))).unwrap())
        .await
        .unwrap();
    let status = res.status();
    let body = res.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned())
}

/// One sample line of a Prometheus text exposition.
#[derive(Debug, Clone)]
pub struct Sample {
    /// The series name (`door_requests_total`).
    pub name: String,
    /// Its labels, in order.
    pub labels: Vec<(String, String)>,
    /// The value, as written.
    pub value: String,
}

/// The samples of an exposition (door's label values hold no `,`, `"` or `}`).
pub fn samples(text: &str) -> Vec<Sample> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| {
            let (series, value) = l.rsplit_once(' ').unwrap();
            let (name, labels) = match series.split_once('{') {
                Some((n, rest)) => (n, rest.trim_end_matches('}')),
                None => (series, ""),
            };
            let labels = labels
                .split(',')
                .filter(|kv| !kv.is_empty())
                .map(|kv| {
                    let (k, v) = kv.split_once('=').unwrap();
                    (k.to_owned(), v.trim_matches('"').to_owned())
                })
                .collect();
            Sample {
                name: name.to_owned(),
                labels,
                value: value.to_owned(),
            }
        })
        .collect()
}

/// Reads from `s` until a whole HTTP/1.1 head has arrived, a request's or a response's (it and
/// whatever came with it); `None` when the peer closes first. For hand-written peers in tests:
/// an upstream or an admin listener that answers what hyper's server never would, a client that
/// reads an answer's head byte for byte.
pub async fn read_head(s: &mut TcpStream) -> Option<Vec<u8>> {
    use tokio::io::AsyncReadExt as _;
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        match s.read(&mut buf).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => head.extend_from_slice(buf.get(..n).unwrap_or_default()),
        }
    }
    Some(head)
}

/// The sum of `sum`'s data points that count for attribute value `attr` (every point when
/// `attr` is empty), each read as a `u64` by `value`.
fn total<T: Copy>(
    sum: &opentelemetry_sdk::metrics::data::Sum<T>,
    attr: &str,
    value: fn(T) -> u64,
) -> u64 {
    sum.data_points()
        .filter(|p| attr.is_empty() || p.attributes().any(|kv| kv.value.as_str() == attr))
        .map(|p| value(p.value()))
        .sum()
}

/// door's instruments on a meter provider whose reader exports to memory, and a reader of a
/// counter's total, or an up-down counter's value: `(name, attribute value)`, the attribute
/// value empty to add up every data point (a counter without attributes, or all of its
/// reasons). The reader flushes the provider first; keep the provider for as long as the
/// instruments record.
pub fn counting_metrics() -> (
    Metrics,
    impl Fn(&str, &str) -> u64 + use<>,
    opentelemetry_sdk::metrics::SdkMeterProvider,
) {
    use opentelemetry::metrics::MeterProvider as _;
    use opentelemetry_sdk::metrics::{
        InMemoryMetricExporter, PeriodicReader, SdkMeterProvider,
        data::{AggregatedMetrics, MetricData, ScopeMetrics},
    };
    let exporter = InMemoryMetricExporter::default();
    let provider = SdkMeterProvider::builder()
        .with_reader(PeriodicReader::builder(exporter.clone()).build())
        .build();
    let metrics = Metrics::new(&provider.meter("door"));
    let for_reader = provider.clone();
    let counted = move |name: &str, attr: &str| {
        for_reader.force_flush().unwrap();
        let all = exporter.get_finished_metrics().unwrap();
        let Some(last) = all.last() else { return 0 };
        let mut n = 0;
        for m in last
            .scope_metrics()
            .flat_map(ScopeMetrics::metrics)
            .filter(|m| m.name() == name)
        {
            n += match m.data() {
                AggregatedMetrics::U64(MetricData::Sum(sum)) => total(sum, attr, |v| v),
                // Up-down counters (gauges of what is held now): never below 0 here.
                AggregatedMetrics::I64(MetricData::Sum(sum)) => {
                    total(sum, attr, |v| u64::try_from(v).unwrap())
                }
                _ => 0,
            };
        }
        n
    };
    (metrics, counted, provider)
}
