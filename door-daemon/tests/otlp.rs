//! The OTLP exporter of the `door` binary against receivers the test runs: an `https://`
//! endpoint is verified against the system's roots (here the test's own, through the standard
//! `SSL_CERT_FILE`) and receives the metrics, and a receiver that refuses them is reported in
//! door's log at the default level, then reported again once it takes them.

#![expect(
    clippy::unwrap_used,
    clippy::panic,
    reason = "test helpers outside #[test] functions fail loudly by design"
)]

mod ambient;

use std::{
    convert::Infallible,
    net::SocketAddr,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    time::Duration,
};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt as _, Full};
use hyper::body::Incoming;
use hyper_util::{
    rt::{TokioExecutor, TokioIo},
    server::conn::auto,
};
use tokio::net::TcpListener;

/// What a receiver saw and how it answers.
#[derive(Debug, Default)]
struct Receiver {
    /// `POST /v1/metrics` requests with a body, answered 200.
    accepted: AtomicUsize,
    /// `POST /v1/metrics` requests answered 503.
    refused: AtomicUsize,
    /// Answer 503 while set.
    refuse: AtomicBool,
}

/// Serves `receiver` on a loopback listener, through TLS when `tls` is given; its port.
async fn receive(receiver: Arc<Receiver>, tls: Option<tokio_rustls::TlsAcceptor>) -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            let receiver = Arc::clone(&receiver);
            let tls = tls.clone();
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
                    let receiver = Arc::clone(&receiver);
                    async move {
                        let path_ok = req.uri().path() == "/v1/metrics";
                        let body = req.into_body().collect().await.unwrap().to_bytes();
                        let status = if receiver.refuse.load(Ordering::SeqCst) {
                            receiver.refused.fetch_add(1, Ordering::SeqCst);
                            StatusCode::SERVICE_UNAVAILABLE
                        } else if path_ok && !body.is_empty() {
                            receiver.accepted.fetch_add(1, Ordering::SeqCst);
                            StatusCode::OK
                        } else {
                            StatusCode::NOT_FOUND
                        };
                        let mut res = Response::new(Full::new(Bytes::new()));
                        *res.status_mut() = status;
                        Ok::<_, Infallible>(res)
                    }
                });
                let serve = auto::Builder::new(TokioExecutor::new());
                match tls {
                    Some(tls) => {
                        if let Ok(s) = tls.accept(s).await {
                            let _ = serve.serve_connection(TokioIo::new(s), svc).await;
                        }
                    }
                    None => {
                        let _ = serve.serve_connection(TokioIo::new(s), svc).await;
                    }
                }
            });
        }
    });
    port
}

/// A `door` process, killed on drop; its log in a file.
struct DoorProcess {
    child: Child,
    log: PathBuf,
}

impl DoorProcess {
    /// Starts `door` on loopback ports of its own, XDP off, in front of a closed upstream (no
    /// request is made), exporting to `endpoint` every 100 ms with `env` added.
    fn start(dir: &Path, endpoint: &str, env: &[(&str, &Path)]) -> Self {
        let log = dir.join("door.log");
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_door"));
        for name in ambient::door_variables() {
            cmd.env_remove(name);
        }
        for (name, _) in std::env::vars_os() {
            if name.to_string_lossy().starts_with("OTEL_") {
                cmd.env_remove(name);
            }
        }
        cmd.args(["--listen", "127.0.0.1:0", "--admin-listen", "off"])
            .args(["--upstream", "http://127.0.0.1:9", "--xdp-mode", "off"])
            .args(["--otlp-endpoint", endpoint, "--otlp-interval", "100ms"])
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap());
        for (name, value) in env {
            cmd.env(name, value);
        }
        Self {
            child: cmd.spawn().unwrap(),
            log,
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits (20 s at most) until `done` holds; fails the test with door's log if it does not,
    /// or if door exits first.
    async fn wait_for(&mut self, what: &str, done: impl Fn(&Self) -> bool) {
        for _ in 0..800 {
            if done(self) {
                return;
            }
            if let Some(status) = self.child.try_wait().unwrap() {
                panic!("door exited ({status}) before {what}:\n{}", self.log());
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        panic!("not within 20 s: {what}:\n{}", self.log());
    }
}

impl Drop for DoorProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn tempdir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("door-otlp-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// An `https://` collector is reached over TLS and verified against the system's roots: door
/// exports to a receiver whose certificate for `localhost` the test's `SSL_CERT_FILE` holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_reach_an_https_collector_verified_against_the_system_roots() {
    let dir = tempdir("https");
    let ck = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
    let roots = dir.join("roots.pem");
    std::fs::write(&roots, ck.cert.pem()).unwrap();
    let key = rustls::pki_types::PrivateKeyDer::try_from(ck.signing_key.serialize_der()).unwrap();
    let tls = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(vec![ck.cert.der().clone()], key)
    .unwrap();
    let receiver = Arc::new(Receiver::default());
    let port = receive(
        Arc::clone(&receiver),
        Some(tokio_rustls::TlsAcceptor::from(Arc::new(tls))),
    )
    .await;

    let endpoint = format!("https://localhost:{port}");
    let mut door = DoorProcess::start(&dir, &endpoint, &[("SSL_CERT_FILE", &roots)]);
    door.wait_for("an export over TLS", |_| {
        receiver.accepted.load(Ordering::SeqCst) > 0
    })
    .await;
    drop(door);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A collector that refuses the metrics is named in door's log at the default level (the SDK says
/// so at `debug` only), and so is the first export that works again; a collector that fails again
/// within the minute is not logged again, nor its recovery.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_export_and_its_recovery_are_logged() {
    let dir = tempdir("refused");
    let receiver = Arc::new(Receiver::default());
    receiver.refuse.store(true, Ordering::SeqCst);
    let port = receive(Arc::clone(&receiver), None).await;
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let mut door = DoorProcess::start(&dir, &format!("http://{addr}"), &[]);
    door.wait_for("a logged export failure", |d| {
        d.log().contains("OTLP export failed")
    })
    .await;
    assert!(receiver.refused.load(Ordering::SeqCst) > 0);
    receiver.refuse.store(false, Ordering::SeqCst);
    door.wait_for("a logged recovery", |d| {
        d.log().contains("OTLP export works again")
    })
    .await;
    assert!(receiver.accepted.load(Ordering::SeqCst) > 0);
    // Failing again within the minute: neither that failure nor its end is logged, so the last
    // line still says how exports stand.
    let refused = receiver.refused.load(Ordering::SeqCst);
    receiver.refuse.store(true, Ordering::SeqCst);
    door.wait_for("a second failure", |_| {
        receiver.refused.load(Ordering::SeqCst) > refused
    })
    .await;
    let accepted = receiver.accepted.load(Ordering::SeqCst);
    receiver.refuse.store(false, Ordering::SeqCst);
    door.wait_for("a second recovery", |_| {
        receiver.accepted.load(Ordering::SeqCst) > accepted
    })
    .await;
    let log = door.log();
    assert_eq!(log.matches("OTLP export failed").count(), 1, "{log}");
    assert_eq!(log.matches("OTLP export works again").count(), 1, "{log}");
    drop(door);
    let _ = std::fs::remove_dir_all(&dir);
}
