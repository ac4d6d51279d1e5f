//! End to end with the `door` binary: SIGTERM drains (health 503 at once, new connections
//! refused, the in-flight request completes, exit 0), and the metrics reach an OTLP/HTTP receiver
//! built on the official protobuf definitions (`opentelemetry-proto`), configured only through
//! the standard `OTEL_EXPORTER_OTLP_ENDPOINT` variable, while `GET /metrics` on the admin
//! listener shows the same counts (two readers on one meter provider).

#![expect(
    clippy::unwrap_used,
    clippy::panic,
    reason = "test helpers outside #[test] functions fail loudly by design"
)]

mod ambient;

use std::{
    collections::{BTreeMap, BTreeSet},
    convert::Infallible,
    net::SocketAddr,
    process::{Command, Stdio},
    sync::{Arc, Mutex},
    time::Duration,
};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::Incoming;
use hyper_util::{
    rt::{TokioExecutor, TokioIo},
    server::conn::auto,
};
use opentelemetry_proto::tonic::{
    collector::metrics::v1::ExportMetricsServiceRequest, common::v1::any_value::Value,
    metrics::v1::metric::Data,
};
use prost::Message as _;
use tokio::{
    net::{TcpListener, TcpStream},
    sync::{mpsc, watch},
};

async fn serve<F, Fut>(l: TcpListener, f: F)
where
    F: Fn(Request<Incoming>) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Response<Full<Bytes>>> + Send + 'static,
{
    loop {
        let Ok((s, _)) = l.accept().await else { return };
        let f = f.clone();
        tokio::spawn(async move {
            let svc = hyper::service::service_fn(move |req| {
                let f = f.clone();
                async move { Ok::<_, Infallible>(f(req).await) }
            });
            let _ = auto::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(s), svc)
                .await;
        });
    }
}

/// `door.requests` points seen by the receiver: attribute map → value (the latest export wins,
/// the temporality is cumulative).
type Points = Arc<Mutex<BTreeMap<BTreeMap<String, String>, u64>>>;

async fn otlp_receiver(points: Points) -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(serve(l, move |req: Request<Incoming>| {
        let points = Arc::clone(&points);
        async move {
            assert_eq!(req.uri().path(), "/v1/metrics");
            let body = req.into_body().collect().await.unwrap().to_bytes();
            let export = ExportMetricsServiceRequest::decode(body).unwrap();
            for rm in export.resource_metrics {
                for sm in rm.scope_metrics {
                    for m in sm.metrics {
                        if m.name != "door.requests" {
                            continue;
                        }
                        let Some(Data::Sum(sum)) = m.data else {
                            panic!("door.requests is not a sum")
                        };
                        for p in sum.data_points {
                            let attrs: BTreeMap<String, String> = p
                                .attributes
                                .iter()
                                .map(|kv| {
                                    let v = match kv.value.as_ref().and_then(|v| v.value.clone()) {
                                        Some(Value::StringValue(s)) => s,
                                        other => format!("{other:?}"),
                                    };
                                    (kv.key.clone(), v)
                                })
                                .collect();
                            let v = match p.value {
                                Some(
                                    opentelemetry_proto::tonic::metrics::v1::number_data_point::Value::AsInt(i),
                                ) => u64::try_from(i).unwrap(),
                                other => panic!("not an integer: {other:?}"),
                            };
                            points.lock().unwrap().insert(attrs, v);
                        }
                    }
                }
            }
            Response::new(Full::new(Bytes::new()))
        }
    }));
    addr
}

/// The upstream: `/l/session/slow` answers when the test says so (and says when it got the
/// request); everything else answers 200 at once.
async fn app(started: mpsc::Sender<()>, release: watch::Receiver<bool>) -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(serve(l, move |req: Request<Incoming>| {
        let started = started.clone();
        let mut release = release.clone();
        async move {
            if req.uri().path() == "/l/session/slow" {
                started.send(()).await.unwrap();
                let _ = release.wait_for(|r| *r).await;
                return Response::new(Full::new(Bytes::from_static(b"slow done")));
            }
            Response::new(Full::new(Bytes::from_static(b"ok")))
        }
    }));
    addr
}

async fn h1(addr: SocketAddr) -> Option<hyper::client::conn::http1::SendRequest<Empty<Bytes>>> {
    let s = TcpStream::connect(addr).await.ok()?;
    let (send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(s))
        .await
        .ok()?;
    tokio::spawn(conn);
    Some(send)
}

fn get(path: &str) -> Request<Empty<Bytes>> {
    Request::get(path)
        .header("host", "door.test")
        .body(Empty::new())
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drains_in_flight_requests_then_exits_0_and_exports_metrics() {
    let points: Points = Arc::default();
    let otlp = otlp_receiver(Arc::clone(&points)).await;
    let (started_tx, mut started_rx) = mpsc::channel(1);
    let (release_tx, release_rx) = watch::channel(false);
    let upstream = app(started_tx, release_rx).await;
    let dir = std::env::temp_dir().join(format!("door-drain-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (mut door, door_addr, admin_addr) = spawn_door(&dir, upstream, otlp).await;
    let mut probe = h1(door_addr).await.expect("door listens once it logged so");
    let res = probe.send_request(get("/healthz")).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    res.into_body().collect().await.unwrap();

    // The Prometheus reader sees it, beside the OTLP exporter.
    let mut admin = h1(admin_addr).await.expect("the admin listener");
    let res = admin.send_request(get("/metrics")).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let text =
        String::from_utf8(res.into_body().collect().await.unwrap().to_bytes().to_vec()).unwrap();
    assert!(
        text.contains("door_requests_total{door_group=\"health\",door_outcome=\"ok\"} 1\n"),
        "{text}"
    );

    // One request held in flight at the slow upstream.
    let mut slow = h1(door_addr).await.unwrap();
    let in_flight = tokio::spawn(async move {
        let res = slow.send_request(get("/l/session/slow")).await.unwrap();
        let status = res.status();
        let body = res.into_body().collect().await.unwrap().to_bytes();
        (status, body)
    });
    started_rx.recv().await.unwrap();

    let killed = Command::new("kill")
        .args(["-TERM", &door.child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());

    // Health turns 503 at once on the kept-alive connection.
    let mut status = StatusCode::OK;
    let mut healthy = 1;
    for _ in 0..100 {
        let res = probe.send_request(get("/healthz")).await.unwrap();
        status = res.status();
        if status == StatusCode::OK {
            // Forwarded before door saw the signal.
            healthy += 1;
        }
        res.into_body().collect().await.unwrap();
        if status == StatusCode::SERVICE_UNAVAILABLE {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);

    // New connections are refused.
    let mut refused = false;
    for _ in 0..100 {
        if TcpStream::connect(door_addr).await.is_err() {
            refused = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(refused, "door still accepts connections while draining");
    assert!(
        door.child.try_wait().unwrap().is_none(),
        "door exited with a request in flight:\n{}",
        door.log()
    );

    // The in-flight request completes, then door exits 0.
    release_tx.send(true).unwrap();
    let (status, body) = in_flight.await.unwrap();
    assert_eq!(status, StatusCode::OK);
    assert_eq!(&body[..], b"slow done");
    let mut exit = None;
    for _ in 0..500 {
        if let Some(s) = door.child.try_wait().unwrap() {
            exit = Some(s);
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let exit = exit.unwrap_or_else(|| {
        panic!(
            "door did not exit after its in-flight request ended:\n{}",
            door.log()
        )
    });
    assert_eq!(exit.code(), Some(0), "{}", door.log());

    check_exported(&points, healthy);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The shutdown flush exported `door.requests` with exactly `door.group` and `door.outcome`.
fn check_exported(points: &Points, healthy: u64) {
    let points = points.lock().unwrap().clone();
    assert!(!points.is_empty(), "no door.requests point exported");
    for attrs in points.keys() {
        let keys: BTreeSet<&str> = attrs.keys().map(String::as_str).collect();
        assert_eq!(keys, BTreeSet::from(["door.group", "door.outcome"]));
    }
    let value = |g: &str, o: &str| {
        points
            .get(&BTreeMap::from([
                ("door.group".to_owned(), g.to_owned()),
                ("door.outcome".to_owned(), o.to_owned()),
            ]))
            .copied()
    };
    assert_eq!(value("health", "ok"), Some(healthy), "{points:?}");
    assert_eq!(value("link", "ok"), Some(1), "{points:?}");
}

/// The `door` process, killed on drop if still running, and its log.
struct DoorProcess {
    child: std::process::Child,
    log: std::path::PathBuf,
}

impl DoorProcess {
    /// What door has logged so far, for failure messages.
    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for DoorProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts the `door` binary, its listener and admin listener on `127.0.0.1:0`, in front of
/// `upstream`, exporting to `otlp` through the standard variable only; waits (20 s at most) until
/// its log, `DIR/door.log`, names the addresses it got: the process and those two addresses.
/// Binding port 0 leaves no port picked ahead to be lost to another test running meanwhile.
async fn spawn_door(
    dir: &std::path::Path,
    upstream: SocketAddr,
    otlp: SocketAddr,
) -> (DoorProcess, SocketAddr, SocketAddr) {
    let config = dir.join("door.toml");
    std::fs::write(
        &config,
        "drain_grace = \"20s\"\n\
         [[route]]\ngroup = \"link\"\nmethods = [\"GET\"]\npath = \"/l/session/{id}\"\n\
         [[route]]\ngroup = \"health\"\npath = \"/healthz\"\n",
    )
    .unwrap();
    let log_path = dir.join("door.log");
    let log = std::fs::File::create(&log_path).unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_door"));
    for name in ambient::door_variables() {
        cmd.env_remove(name);
    }
    cmd.arg("--config")
        .arg(&config)
        .args(["--listen", "127.0.0.1:0"])
        .args(["--upstream", &format!("http://{upstream}")])
        .args(["--admin-listen", "127.0.0.1:0", "--xdp-mode", "off"])
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", format!("http://{otlp}"))
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stderr(log);
    let mut door = DoorProcess {
        child: cmd.spawn().unwrap(),
        log: log_path,
    };
    for _ in 0..800 {
        let text = door.log();
        let listen = logged_address(&text, "listening (", "addr=");
        let admin = logged_address(&text, "admin status", "at=http://");
        if let (Some(listen), Some(admin)) = (listen, admin) {
            return (door, listen, admin);
        }
        if let Some(status) = door.child.try_wait().unwrap() {
            panic!("door exited ({status}) before listening:\n{text}");
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!(
        "door did not log its addresses within 20 s:\n{}",
        door.log()
    );
}

/// In `log`, the address after `key` in the first complete line (one a newline ends: a line
/// still being written could end inside the address) holding `marker`.
fn logged_address(log: &str, marker: &str, key: &str) -> Option<SocketAddr> {
    let complete = log.rsplit_once('\n').map_or("", |(done, _)| done);
    complete
        .lines()
        .filter(|l| l.contains(marker))
        .flat_map(str::split_whitespace)
        .find_map(|w| w.strip_prefix(key)?.parse().ok())
}
