//! Escalation to the XDP blocklist through the request path (docs/design.md, "Flood shield"):
//! only a key that was the TCP peer itself may be escalated. A client named by a trusted proxy,
//! whether through `X-Forwarded-For` or a PROXY protocol header, never is; nor is a health probe
//! answered from the cache. In-process on 127.0.0.1 with a recording blocklist; no XDP needed.
#![expect(
    clippy::unwrap_used,
    clippy::indexing_slicing,
    reason = "test code: a failed step fails the test"
)]

mod support;

use std::{
    net::SocketAddr,
    sync::{Arc, Mutex},
    time::Duration,
};

use door_common::PrefixKey;
use door_daemon::{
    admin::{AdminBlocklist, StatusSource},
    cluster::ClusterStatus,
    config::Config,
    http::{App, ConnInfo, ConnSettings, Front},
    obs::metrics::Metrics,
    shield::{ShieldError, escalate::Blocklist},
    time::{Clock, MonotonicClock},
};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream},
};

#[derive(Debug, Default)]
struct Recorder(Mutex<Vec<PrefixKey>>);

impl Blocklist for Recorder {
    fn block(&self, key: PrefixKey, _duration: Duration) -> bool {
        self.0.lock().unwrap().push(key);
        true
    }
}

/// The admin API's view of the same recorder: what is on it is what was escalated, less what
/// was unblocked.
impl AdminBlocklist for Recorder {
    fn list(&self) -> Result<Vec<(PrefixKey, u64)>, ShieldError> {
        Ok(self.0.lock().unwrap().iter().map(|k| (*k, 60)).collect())
    }

    fn block(&self, key: PrefixKey, _duration: Duration) -> Result<(), ShieldError> {
        self.0.lock().unwrap().push(key);
        Ok(())
    }

    fn unblock(&self, key: &PrefixKey) -> Result<bool, ShieldError> {
        let mut list = self.0.lock().unwrap();
        let before = list.len();
        list.retain(|k| k != key);
        Ok(list.len() != before)
    }
}

/// An upstream answering `200 ok` to anything.
async fn upstream() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            tokio::spawn(async move {
                let mut buf = vec![0u8; 4096];
                let mut seen = Vec::new();
                while !seen.windows(4).any(|w| w == b"\r\n\r\n") {
                    match s.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => seen.extend_from_slice(&buf[..n]),
                    }
                }
                let _ = s
                    .write_all(
                        b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok",
                    )
                    .await;
            });
        }
    });
    addr
}

/// An app in front of an upstream answering 200, with a `link` route (one token, refilled after
/// about 17 minutes), escalation after two 429s, `top` (top-level keys) and `tables` added, and
/// the recording blocklist it escalates to.
async fn app(top: &str, tables: &str) -> (Arc<App>, Config, Arc<Recorder>) {
    app_counting(top, tables, &Metrics::noop()).await
}

/// [`app`], its instruments recording into `metrics`.
async fn app_counting(
    top: &str,
    tables: &str,
    metrics: &Metrics,
) -> (Arc<App>, Config, Arc<Recorder>) {
    let up = upstream().await;
    let cfg = Config::from_toml(
        "escalation.toml",
        &format!(
            r#"
listen = ["127.0.0.1:0"]
upstream = "http://{up}"
admin_listen = "off"
{top}
[[route]]
group = "link"
path = "/l/{{id}}"
[group.link]
rate = 0.001
burst = 1
[xdp]
mode = "off"
escalate_after = 2
{tables}
"#
        ),
    )
    .unwrap();
    let clock: Arc<dyn Clock> = Arc::new(MonotonicClock::new());
    let recorder = Arc::new(Recorder::default());
    let app = Arc::new(App::new(&cfg, &clock, metrics, Some(recorder.clone())));
    (app, cfg, recorder)
}

/// Sends `bytes` on a fresh connection and returns the status code door answered.
async fn status(addr: SocketAddr, bytes: &[u8]) -> u16 {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(bytes).await.unwrap();
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out).await;
    let text = String::from_utf8_lossy(&out);
    text.split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0)
}

#[tokio::test]
async fn clients_named_by_a_trusted_proxy_are_never_escalated() {
    let (app, cfg, recorder) = app(r#"trusted_proxies = ["127.0.0.1/32"]"#, "").await;
    let front = Front::new(app, ConnSettings::from_config(&cfg), None);
    let plain = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let proxied = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let (plain_addr, proxied_addr) = (plain.local_addr().unwrap(), proxied.local_addr().unwrap());
    front.serve(plain, false);
    front.serve(proxied, true);

    // Through PROXY protocol v1 from the trusted proxy: the client 203.0.113.9 is the key...
    let via_pp = b"PROXY TCP4 203.0.113.9 192.0.2.1 40000 8443\r\nGET /l/x HTTP/1.1\r\nhost: d\r\nconnection: close\r\n\r\n";
    let codes: Vec<u16> = sequential(proxied_addr, via_pp, 6).await;
    assert_eq!(codes[0], 200, "{codes:?}");
    assert!(codes[1..].iter().all(|c| *c == 429), "{codes:?}");
    // ...and through X-Forwarded-For from the trusted proxy: 198.51.100.7 is the key.
    let via_xff = b"GET /l/x HTTP/1.1\r\nhost: d\r\nx-forwarded-for: 198.51.100.7\r\nconnection: close\r\n\r\n";
    let codes = sequential(plain_addr, via_xff, 6).await;
    assert_eq!(codes[0], 200, "{codes:?}");
    assert!(codes[1..].iter().all(|c| *c == 429), "{codes:?}");

    // Five 429s each, well past escalate_after = 2: nothing was sent to the blocklist.
    assert!(
        recorder.0.lock().unwrap().is_empty(),
        "{:?}",
        recorder.0.lock().unwrap()
    );
}

/// `n` requests, one after another, each on a fresh connection.
async fn sequential(addr: SocketAddr, bytes: &[u8], n: usize) -> Vec<u16> {
    let mut codes = Vec::with_capacity(n);
    for _ in 0..n {
        codes.push(status(addr, bytes).await);
    }
    codes
}

/// Serves `app` on a loopback listener as if every connection came from `peer` (the accept loop
/// would see 127.0.0.1, which is never escalated).
async fn serve_as(app: Arc<App>, peer: SocketAddr) -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            let app = Arc::clone(&app);
            let info = Arc::new(ConnInfo::new(peer, false));
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req| {
                    let answer = App::handle(Arc::clone(&app), Arc::clone(&info), req);
                    async move { Ok::<_, std::convert::Infallible>(answer.await) }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(s), svc)
                    .await;
            });
        }
    });
    addr
}

/// Over-budget health probes get the cached status, never a 429, so they never escalate their
/// prober (a load balancer or an uptime monitor on a public address would otherwise have its SYNs
/// dropped); the same client's 429s on another route do.
#[tokio::test]
async fn over_budget_health_probes_are_not_escalated() {
    let health = r#"
[[route]]
group = "health"
path = "/healthz"
[group.health]
rate = 0.001
burst = 1
"#;
    let (app, _, recorder) = app("", health).await;
    let prober: SocketAddr = "203.0.113.9:40000".parse().unwrap();
    let addr = serve_as(app, prober).await;

    let probe = b"GET /healthz HTTP/1.1\r\nhost: d\r\nconnection: close\r\n\r\n";
    let codes = sequential(addr, probe, 6).await;
    assert!(codes.iter().all(|c| *c == 200), "{codes:?}");
    assert!(
        recorder.0.lock().unwrap().is_empty(),
        "five over-budget probes escalated their prober: {:?}",
        recorder.0.lock().unwrap()
    );

    // The same public peer's 429s on a limited route are escalated: the harness can tell.
    let link = b"GET /l/x HTTP/1.1\r\nhost: d\r\nconnection: close\r\n\r\n";
    let codes = sequential(addr, link, 3).await;
    assert_eq!(codes, vec![200, 429, 429]);
    assert_eq!(
        *recorder.0.lock().unwrap(),
        vec![PrefixKey::from_ip(prober.ip())]
    );
}

/// A client its operator took off the blocklist (`DELETE /blocks/{prefix}`) and that goes on
/// collecting 429s is blocked again after `escalate_after` of them, not only once the
/// `block_for` of its first escalation (an hour by default) has passed.
#[tokio::test]
async fn an_unblocked_client_is_escalated_again() {
    let (metrics, counted, _provider) = support::counting_metrics();
    let escalations = || counted("door.escalations", "");
    let (app, _, recorder) = app_counting("", "", &metrics).await;
    let peer: SocketAddr = "203.0.113.9:40000".parse().unwrap();
    let addr = serve_as(Arc::clone(&app), peer).await;
    let link = b"GET /l/x HTTP/1.1\r\nhost: d\r\nconnection: close\r\n\r\n";
    assert_eq!(sequential(addr, link, 3).await, vec![200, 429, 429]);
    let key = PrefixKey::from_ip(peer.ip());
    assert_eq!(*recorder.0.lock().unwrap(), vec![key]);
    assert_eq!(escalations(), 1, "door.escalations");

    // The operator lifts the block through the admin API's function, wired as the daemon wires it.
    let for_unblock = Arc::clone(&app);
    let for_status = Arc::clone(&app);
    let source = StatusSource {
        limiters: Arc::new(move || for_status.limiters()),
        passthrough: {
            let caps = Arc::clone(&app);
            Arc::new(move || caps.passthrough_status())
        },
        metrics: Metrics::noop(),
        shield: None,
        xdp_mode: "off",
        cluster: Arc::new(ClusterStatus::off()),
        exposition: None,
        blocklist: Some(recorder.clone()),
        unblocked: Arc::new(move |key| for_unblock.forget_escalation(key)),
    };
    door_daemon::admin::api::unblock(&source, "203.0.113.9", None).unwrap();
    assert!(recorder.0.lock().unwrap().is_empty());

    // Two more 429s (escalate_after = 2) put it back on the blocklist.
    assert_eq!(sequential(addr, link, 2).await, vec![429, 429]);
    assert_eq!(
        *recorder.0.lock().unwrap(),
        vec![key],
        "the unblocked client was not escalated again"
    );
    assert_eq!(escalations(), 2, "door.escalations");
}
