//! Budget sharing between doors (docs/design.md, "Cluster"): Debian's `redis-server` on a free
//! loopback port, three door fronts in-process on 127.0.0.1 sharing it, each with its own clock.
//! The sync task runs on tokio's real time, because the store's script reads Redis's own clock
//! (`TIME`), which a paused tokio clock cannot move; every wait is bounded, and the latency
//! checks (p99 under 50 ms on loopback) leave a wide margin over the few milliseconds a request
//! takes. Without `redis-server` each test prints `door-test: skipped (needs redis-server):
//! cluster TEST` and passes.

#![expect(
    clippy::unwrap_used,
    clippy::indexing_slicing,
    clippy::panic,
    reason = "test helpers outside #[test] functions fail loudly by design"
)]

mod support;

use std::{
    convert::Infallible,
    fmt::Write as _,
    io::Write as _,
    net::SocketAddr,
    process::{Child, Command, Stdio},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use bytes::Bytes;
use door_common::prefix::PrefixKey;
use door_daemon::{
    admin::{AdminBlocklist, ClusterBlocklist, StatusSource},
    cluster::{self, Cluster, ClusterMetrics, SharedBlocklist, State},
    config::Config,
    http::{App, ConnSettings, Front},
    limit::{GroupLimiter, RejectReason, Rejection, Scope},
    obs::metrics::Metrics,
    shield::{
        ShieldError,
        escalate::{Blocklist, Escalator, KeySource},
    },
    time::{Clock, MonotonicClock},
};
use http::{Request, Response, StatusCode};
use http_body_util::{Empty, Full};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::{
    io::{AsyncReadExt as _, AsyncWriteExt as _},
    net::{TcpListener, TcpStream},
};

/// A 429 of the client's own row: one that counts towards escalation.
const OWN_429: Rejection = Rejection {
    reason: RejectReason::Rate,
    scope: Scope::Client,
    retry_after_s: 1,
};

const SYNC: Duration = Duration::from_millis(50);
const RATE: f64 = 2.0;
const BURST: u32 = 20;
/// `BURST / RATE`: the time an empty bucket takes to fill, in seconds.
const WINDOW_S: u64 = 10;
const DOORS: u32 = 3;

/// Whether `redis-server` is on this machine; if not, prints the skip marker for this test.
fn redis_or_skip() -> bool {
    let found = Command::new("redis-server")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !found {
        let thread = std::thread::current();
        let line = format!(
            "\ndoor-test: skipped (needs redis-server): cluster {}\n",
            thread.name().unwrap_or("(unnamed)")
        );
        let mut out = std::io::stdout().lock();
        let _ = out.write_all(line.as_bytes()).and_then(|()| out.flush());
    }
    found
}

/// A loopback port held for a whole test: bound with `SO_REUSEADDR` and never listening. No
/// port-0 bind (another test's listener or connection) is given it meanwhile, and Redis, which
/// sets `SO_REUSEADDR` too, binds and listens on it, again after a restart.
struct HeldPort {
    port: u16,
    _socket: tokio::net::TcpSocket,
}

impl HeldPort {
    fn new() -> Self {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.set_reuseaddr(true).unwrap();
        socket.bind(SocketAddr::from(([127, 0, 0, 1], 0))).unwrap();
        let port = socket.local_addr().unwrap().port();
        Self {
            port,
            _socket: socket,
        }
    }
}

/// How a started redis-server shows it is ready.
#[derive(Clone, Copy)]
enum Ready {
    /// It answers `PING` with `+PONG`.
    Pong,
    /// It accepts a TCP connection (a TLS-only server, which a plain `PING` cannot reach).
    Accepts,
}

/// A redis-server on a loopback port, killed on drop; its output in a file, shown when it fails.
struct Redis {
    child: Child,
    log: std::path::PathBuf,
}

impl Redis {
    /// Starts `redis-server` on a [`HeldPort`] of its own: the server, and the port, held as
    /// long as the returned [`HeldPort`] lives (kept for a restart with [`Redis::start_on`]).
    async fn start() -> (Self, HeldPort) {
        let held = HeldPort::new();
        (Self::start_on(held.port).await, held)
    }

    /// Starts `redis-server` on loopback `port` (a [`HeldPort`]'s).
    async fn start_on(port: u16) -> Self {
        Self::launch(
            &["--port".into(), port.to_string().into()],
            port,
            Ready::Pong,
        )
        .await
    }

    /// Starts `redis-server` with `args` (its port among them) and no persistence; waits (5 s at
    /// most) until it is `ready` on `port`. Fails the test with Redis's own output if it exits
    /// first (a port taken, a build without TLS) or is not ready in time.
    async fn launch(args: &[std::ffi::OsString], port: u16, ready: Ready) -> Self {
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let log =
            std::env::temp_dir().join(format!("door-redis-{}-{port}-{n}.log", std::process::id()));
        let out = std::fs::File::create(&log).unwrap();
        let child = Command::new("redis-server")
            .args(args)
            .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .unwrap();
        // Killed on drop from here on, whichever way this ends.
        let mut redis = Self { child, log };
        let deadline = door_daemon::time::now() + Duration::from_secs(5);
        loop {
            let up = match ready {
                Ready::Pong => pong(port).await,
                Ready::Accepts => TcpStream::connect(("127.0.0.1", port)).await.is_ok(),
            };
            if up {
                return redis;
            }
            if let Some(status) = redis.child.try_wait().unwrap() {
                panic!("redis-server exited ({status}):\n{}", redis.output());
            }
            assert!(
                door_daemon::time::now() < deadline,
                "redis-server was not ready on port {port} within 5 s:\n{}",
                redis.output()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// What redis-server printed so far.
    fn output(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Stops the server now, as dropping it does.
    fn kill(self) {
        drop(self);
    }

    /// Sends the server `signal` with kill(1): `STOP` freezes it with its connections open (a
    /// hung host, or a network that drops packets), `CONT` lets it go on.
    fn signal(&self, signal: &str) {
        let sent = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(self.child.id().to_string())
            .status()
            .unwrap();
        assert!(sent.success(), "kill -{signal}: {sent}");
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.log);
    }
}

/// Whether a Redis server on loopback `port` answers `PING` with `+PONG` (one second at most).
async fn pong(port: u16) -> bool {
    let exchange = async {
        let mut s = TcpStream::connect(("127.0.0.1", port)).await.ok()?;
        s.write_all(b"PING\r\n").await.ok()?;
        let mut reply = [0u8; 7];
        s.read_exact(&mut reply).await.ok()?;
        Some(reply == *b"+PONG\r\n")
    };
    tokio::time::timeout(Duration::from_secs(1), exchange)
        .await
        .ok()
        .flatten()
        .unwrap_or(false)
}

/// A door's clock: the monotonic clock moved `offset_ns` ahead.
#[derive(Debug)]
struct Offset(MonotonicClock, u64);

impl Clock for Offset {
    fn now_ns(&self) -> u64 {
        self.0.now_ns() + self.1
    }
}

async fn upstream() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(|_req: Request<Incoming>| async {
                    Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"ok"))))
                });
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(s), svc)
                    .await;
            });
        }
    });
    addr
}

fn config(upstream: SocketAddr, redis_port: u16) -> Config {
    config_with(upstream, redis_port, RATE, SYNC)
}

/// [`config`] with the `link` group's rate at `rate` tokens/s and a sync every `sync`.
fn config_with(upstream: SocketAddr, redis_port: u16, rate: f64, sync: Duration) -> Config {
    config_for(
        upstream,
        &format!("redis://127.0.0.1:{redis_port}/0"),
        rate,
        sync,
    )
}

/// [`config_with`] sharing through the store at `redis` (a URL).
fn config_for(upstream: SocketAddr, redis: &str, rate: f64, sync: Duration) -> Config {
    let sync_ms = sync.as_millis();
    Config::from_toml(
        "cluster.toml",
        &format!(
            r#"
listen = ["127.0.0.1:0"]
upstream = "http://{upstream}"
admin_listen = "off"
trusted_proxies = ["127.0.0.1/32"]
[[route]]
group = "link"
path = "/l/{{id}}"
[group.link]
rate = {rate}
burst = {BURST}
per_client = 4
charge = "always"
[cluster]
redis = "{redis}"
sync_interval = "{sync_ms}ms"
timeout = "100ms"
"#
        ),
    )
    .unwrap()
}

struct Door {
    addr: SocketAddr,
    front: Front,
    cluster: Cluster,
}

async fn door(cfg: &Config, clock: Arc<dyn Clock>, id: &str) -> Door {
    door_with(cfg, clock, id, None).await
}

async fn door_with(
    cfg: &Config,
    clock: Arc<dyn Clock>,
    id: &str,
    blocks: Option<Arc<SharedBlocklist>>,
) -> Door {
    let blocklist = blocks.clone().map(|b| b as Arc<dyn Blocklist>);
    let app = Arc::new(App::new(cfg, &clock, &Metrics::noop(), blocklist));
    let meter = opentelemetry::global::meter("door-test");
    let cluster = cluster::spawn(
        &cfg.cluster,
        Arc::clone(&app),
        blocks,
        ClusterMetrics::new(&meter),
        id.to_owned(),
    )
    .unwrap();
    let front = Front::new(app, ConnSettings::from_config(cfg), None);
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    front.serve(l, false);
    Door {
        addr,
        front,
        cluster,
    }
}

async fn doors(cfg: &Config, offsets_s: [u64; 3]) -> Vec<Door> {
    let mut v = Vec::new();
    for (i, off) in offsets_s.into_iter().enumerate() {
        let clock: Arc<dyn Clock> = Arc::new(Offset(MonotonicClock::new(), off * 1_000_000_000));
        v.push(door(cfg, clock, &format!("door-{i}")).await);
    }
    v
}

/// Three doors on `cfg` (clocks `offsets_s` ahead), once every one has synced and sees the
/// other two.
async fn synced_doors(cfg: &Config, offsets_s: [u64; 3]) -> Vec<Door> {
    let doors = doors(cfg, offsets_s).await;
    assert!(
        all_reach(&doors, State::Synced, Duration::from_secs(3)).await,
        "the doors did not sync"
    );
    assert!(
        all_see_each_other(&doors).await,
        "the doors did not see each other"
    );
    doors
}

/// Waits (at most `within`) until every door is in `state`; false if not all got there.
async fn all_reach(doors: &[Door], state: State, within: Duration) -> bool {
    let deadline = door_daemon::time::now() + within;
    loop {
        if doors
            .iter()
            .all(|d| d.cluster.status().snapshot().state == state)
        {
            return true;
        }
        if door_daemon::time::now() > deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Waits (at most 3 s) until every door has seen all [`DOORS`] alive.
async fn all_see_each_other(doors: &[Door]) -> bool {
    let deadline = door_daemon::time::now() + Duration::from_secs(3);
    while doors
        .iter()
        .any(|d| d.cluster.status().snapshot().doors != DOORS)
    {
        if door_daemon::time::now() > deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    true
}

/// The `link` group's limiter on door `d`.
fn link(d: &Door) -> Arc<GroupLimiter> {
    d.front
        .app()
        .limiters()
        .iter()
        .find(|l| l.group() == "link")
        .unwrap()
        .clone()
}

/// The `link` group's rate on door `d`, tokens/s.
fn link_rate(d: &Door) -> f64 {
    link(d).budget().rate
}

/// A connection to the test's store on `port`.
async fn store(port: u16) -> redis::aio::MultiplexedConnection {
    redis::Client::open(format!("redis://127.0.0.1:{port}/0"))
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

/// The store's budget key of `client` in the `link` group set to `value`, as door would not
/// write it.
async fn set_budget(con: &mut redis::aio::MultiplexedConnection, client: &str, value: &str) {
    let key = PrefixKey::from_ip(client.parse().unwrap());
    let () = redis::cmd("SET")
        .arg(format!("door:{{link}}:{}", hex(key)))
        .arg(value)
        .query_async(con)
        .await
        .unwrap();
}

/// The seconds until `client`'s row on `l` is full, once a store's deficit past `above` seconds
/// was folded into it (waiting at most 2 s for the sync); what it is then if none was.
async fn folded_reset_s(l: &GroupLimiter, client: &str, above: u64) -> u64 {
    let key = PrefixKey::from_ip(client.parse().unwrap());
    let deadline = door_daemon::time::now() + Duration::from_secs(2);
    while l.quota(&key).reset_s <= above && door_daemon::time::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    l.quota(&key).reset_s
}

/// One request from `client`: its status and how long it took.
async fn send(d: &Door, client: &str) -> (StatusCode, Duration) {
    let started = door_daemon::time::now();
    let s = TcpStream::connect(d.addr).await.unwrap();
    let (mut c, conn) = hyper::client::conn::http1::handshake(TokioIo::new(s))
        .await
        .unwrap();
    tokio::spawn(conn);
    let req = Request::get("/l/x")
        .header("host", "door.test")
        .header("x-forwarded-for", client)
        .body(Empty::<Bytes>::new())
        .unwrap();
    let res = c.send_request(req).await.unwrap();
    (res.status(), started.elapsed())
}

/// Requests from `client` every `pace` for `for_`, round-robin over `doors`: admitted per door,
/// the latencies, and the time it took.
async fn spread(
    doors: &[&Door],
    client: &str,
    pace: Duration,
    for_: Duration,
) -> (Vec<u32>, Vec<Duration>, Duration) {
    let started = door_daemon::time::now();
    let mut admitted = vec![0; doors.len()];
    let mut latencies = Vec::new();
    let mut i = 0;
    let mut tick = tokio::time::interval(pace);
    while started.elapsed() < for_ {
        tick.tick().await;
        let (status, took) = send(doors[i % doors.len()], client).await;
        latencies.push(took);
        match status {
            StatusCode::OK => admitted[i % doors.len()] += 1,
            StatusCode::TOO_MANY_REQUESTS => {}
            s => assert_eq!(s, StatusCode::OK, "unexpected status"),
        }
        i += 1;
    }
    (admitted, latencies, started.elapsed())
}

/// The documented worst case (docs/design.md, "Cluster"): `burst + rate × t + (N − 1) × burst
/// + N × rate × sync_interval`, in tokens.
fn worst_case(t: Duration, rate: f64) -> f64 {
    let n = f64::from(DOORS);
    f64::from(BURST)
        + rate * t.as_secs_f64()
        + (n - 1.0) * f64::from(BURST)
        + n * rate * SYNC.as_secs_f64()
}

fn p99(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[(v.len() * 99 / 100).min(v.len() - 1)]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_spread_over_three_doors_gets_one_budget_whatever_their_clocks() {
    if !redis_or_skip() {
        return;
    }
    let (_redis, held) = Redis::start().await;
    let port = held.port;
    let cfg = config(upstream().await, port);
    // The third door's clock is 7 s ahead of the others': only the store's clock counts.
    let doors = synced_doors(&cfg, [0, 0, 7]).await;
    let refs: Vec<&Door> = doors.iter().collect();
    let (admitted, latencies, took) = spread(
        &refs,
        "198.51.100.7",
        Duration::from_millis(10),
        Duration::from_secs(3),
    )
    .await;
    let total: u32 = admitted.iter().sum();
    let alone = f64::from(BURST) + RATE * took.as_secs_f64();
    eprintln!(
        "admitted per door {admitted:?}, total {total}, one door alone {alone:.1}, took {took:?}"
    );
    assert!(f64::from(total) >= f64::from(BURST), "{total} < burst");
    assert!(
        f64::from(total) <= worst_case(took, RATE),
        "{total} over the documented bound"
    );
    // Paced requests: far below three budgets, and below two.
    assert!(
        total < 2 * BURST,
        "{total} admitted: the doors did not share the budget"
    );
    // The door whose clock is off admits like the others.
    let (lo, hi) = (
        admitted[..2].iter().min().unwrap(),
        admitted[..2].iter().max().unwrap(),
    );
    assert!(
        admitted[2] + 3 >= *lo && admitted[2] <= hi + 3,
        "the offset door admitted {} against {admitted:?}",
        admitted[2]
    );
    assert!(p99(latencies) < Duration::from_millis(50));

    // Another client is independent: its whole burst, at once, on one door.
    let mut other = 0;
    for _ in 0..BURST {
        if send(&doors[1], "203.0.113.9").await.0 == StatusCode::OK {
            other += 1;
        }
    }
    assert_eq!(other, BURST);
    drop(doors);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_store_doors_serve_at_rate_over_n_and_resync_when_it_returns() {
    if !redis_or_skip() {
        return;
    }
    let (redis, held) = Redis::start().await;
    let port = held.port;
    let up = upstream().await;
    let cfg = config(up, port);
    let doors = synced_doors(&cfg, [0, 0, 0]).await;

    redis.kill();
    assert!(
        all_reach(&doors, State::Degraded, Duration::from_secs(2)).await,
        "the doors did not notice the store was gone"
    );
    for d in &doors {
        let rate = link_rate(d);
        assert!((rate - RATE / f64::from(DOORS)).abs() < 1e-9, "rate {rate}");
    }
    // A new client on one door: its burst, then rate / N, and no request waits on the store.
    let (admitted, latencies, took) = spread(
        &[&doors[0]],
        "198.51.100.8",
        Duration::from_millis(10),
        Duration::from_secs(2),
    )
    .await;
    let bound = f64::from(BURST) + RATE / f64::from(DOORS) * took.as_secs_f64() + 1.0;
    eprintln!("degraded: admitted {admitted:?} in {took:?} (bound {bound:.1})");
    assert!(f64::from(admitted[0]) <= bound);
    assert!(admitted[0] >= BURST);
    let p = p99(latencies);
    assert!(
        p < Duration::from_millis(50),
        "p99 {p:?} while the store is gone"
    );
    for d in &doors {
        assert_eq!(d.cluster.status().snapshot().state, State::Degraded);
    }
    // A reload of door 0 meanwhile, to the very rate the doors run at (an operator matching what
    // /status shows): it runs divided too, and stays once the store is back.
    let third = RATE / f64::from(DOORS);
    let reloaded = config_with(up, port, third, SYNC);
    assert!(doors[0].front.app().reload(&reloaded, &cfg).is_empty());
    let rate = link_rate(&doors[0]);
    assert!(
        (rate - third / f64::from(DOORS)).abs() < 1e-9,
        "rate {rate}"
    );

    let _redis = Redis::start_on(port).await;
    assert!(
        all_reach(&doors, State::Synced, Duration::from_secs(5)).await,
        "the doors did not sync again"
    );
    let rate = link_rate(&doors[0]);
    assert!(
        (rate - third).abs() < 1e-9,
        "the reload's rate {third} was undone: {rate}"
    );
    for d in &doors[1..] {
        assert!((link_rate(d) - RATE).abs() < 1e-9);
    }
    for d in &doors {
        let json = d.cluster.status().json();
        assert_eq!(json["state"], "synced");
    }
}

/// A store that stops answering, its connection open (a hung host, a network that drops
/// packets), is given up `cluster.timeout` into the door's next call, not at the whole sync's
/// bound of 3 × `sync_interval`; the door syncs again once the store answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_that_stops_answering_is_given_up_within_the_timeout() {
    if !redis_or_skip() {
        return;
    }
    let (redis, held) = Redis::start().await;
    // A sync a second: the call's bound is 100 ms, the whole sync's 3 s.
    let cfg = config_with(upstream().await, held.port, RATE, Duration::from_secs(1));
    let d = door(&cfg, Arc::new(MonotonicClock::new()), "door-a").await;
    let d = std::slice::from_ref(&d);
    assert!(all_reach(d, State::Synced, Duration::from_secs(3)).await);

    redis.signal("STOP");
    // The next sync starts within a second and gives up 100 ms into its call; bounded by the
    // whole sync alone, it would take 3 s more.
    assert!(
        all_reach(d, State::Degraded, Duration::from_millis(2_500)).await,
        "the door waited on a store that does not answer"
    );
    redis.signal("CONT");
    assert!(
        all_reach(d, State::Synced, Duration::from_secs(5)).await,
        "the door did not sync again once the store answered"
    );
}

/// Copies `from` to `to` until either ends, dropping what it reads once `silent` is set (a
/// connection whose packets go nowhere, neither refused nor reset).
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    silent: Arc<AtomicBool>,
) {
    let mut buf = vec![0u8; 16 * 1024];
    while let Ok(n) = from.read(&mut buf).await {
        if n == 0 {
            return;
        }
        if silent.load(Ordering::Relaxed) {
            continue;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

/// A store connection that goes silent for good while the store itself is healthy (a NAT or a
/// firewall that forgot the connection, a reply lost on the way) is dropped after the sync it
/// failed: the next sync opens a new connection and the door syncs again, rather than writing to
/// the silent one until TCP gives up on it (found by hostile testing).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_connection_gone_silent_is_replaced_after_the_sync_it_failed() {
    if !redis_or_skip() {
        return;
    }
    let (_redis, held) = Redis::start().await;
    // A relay in front of the store: the door's first connection goes silent when told, every
    // later one is relayed as it is.
    let relay = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let relay_port = relay.local_addr().unwrap().port();
    let store_port = held.port;
    let silent = Arc::new(AtomicBool::new(false));
    let silence = Arc::clone(&silent);
    tokio::spawn(async move {
        let mut first = true;
        while let Ok((conn, _)) = relay.accept().await {
            let Ok(store) = TcpStream::connect(("127.0.0.1", store_port)).await else {
                continue;
            };
            let flag = if std::mem::take(&mut first) {
                Arc::clone(&silence)
            } else {
                Arc::new(AtomicBool::new(false))
            };
            let (from_door, to_door) = conn.into_split();
            let (from_store, to_store) = store.into_split();
            tokio::spawn(pump(from_door, to_store, Arc::clone(&flag)));
            tokio::spawn(pump(from_store, to_door, flag));
        }
    });
    let redis = format!("redis://127.0.0.1:{relay_port}/0");
    let cfg = config_for(upstream().await, &redis, RATE, Duration::from_millis(200));
    let d = door(&cfg, Arc::new(MonotonicClock::new()), "door-a").await;
    let d = std::slice::from_ref(&d);
    assert!(all_reach(d, State::Synced, Duration::from_secs(3)).await);
    silent.store(true, Ordering::Relaxed);
    assert!(
        all_reach(d, State::Degraded, Duration::from_secs(3)).await,
        "a sync on the silent connection failed"
    );
    assert!(
        all_reach(d, State::Synced, Duration::from_secs(5)).await,
        "the door kept waiting on its silent connection to a healthy store"
    );
}

/// Answers one RESP request read from `r` as a store that lost its scripts and loads a script
/// under a wrong hash would: `EVALSHA` gets `NOSCRIPT`, `SCRIPT LOAD` a hash that is not the
/// script's, anything else `+OK`. `None` once the connection ends.
async fn lying_store_answer(
    r: &mut tokio::io::BufReader<tokio::net::tcp::OwnedReadHalf>,
) -> Option<&'static [u8]> {
    use tokio::io::AsyncBufReadExt as _;
    let mut line = String::new();
    r.read_line(&mut line).await.ok().filter(|&n| n > 0)?;
    let n: usize = line.trim().strip_prefix('*')?.parse().ok()?;
    let mut args = Vec::new();
    for _ in 0..n {
        line.clear();
        r.read_line(&mut line).await.ok()?;
        let len: usize = line.trim().strip_prefix('$')?.parse().ok()?;
        let mut arg = vec![0u8; len + 2];
        r.read_exact(&mut arg).await.ok()?;
        arg.truncate(len);
        args.push(String::from_utf8_lossy(&arg).to_uppercase());
    }
    Some(match args.first().map(String::as_str) {
        Some("EVALSHA") => b"-NOSCRIPT No matching script.\r\n",
        Some("SCRIPT") => b"$40\r\n0000000000000000000000000000000000000000\r\n",
        _ => b"+OK\r\n",
    })
}

/// A sync that panics (here the redis crate's debug assertion on a store that loads the script
/// under a wrong hash) counts as a failed sync and the next one still comes: the sync task does
/// not end with its state frozen (found by hostile testing). Debug builds only, where the
/// assertion is compiled in, as tests are.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sync_that_panics_is_counted_as_failed_and_the_syncs_go_on() {
    let store = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = store.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((conn, _)) = store.accept().await {
            tokio::spawn(async move {
                let (r, mut w) = conn.into_split();
                let mut r = tokio::io::BufReader::new(r);
                while let Some(answer) = lying_store_answer(&mut r).await {
                    if w.write_all(answer).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    let (_, counted, provider) = support::counting_metrics();
    let redis = format!("redis://127.0.0.1:{port}/0");
    let cfg = config_for(upstream().await, &redis, RATE, Duration::from_millis(100));
    let clock: Arc<dyn Clock> = Arc::new(MonotonicClock::new());
    let app = Arc::new(App::new(&cfg, &clock, &Metrics::noop(), None));
    let meter = opentelemetry::metrics::MeterProvider::meter(&provider, "door-test");
    let c = cluster::spawn(
        &cfg.cluster,
        app,
        None,
        ClusterMetrics::new(&meter),
        "door-a".into(),
    )
    .unwrap();
    let deadline = door_daemon::time::now() + Duration::from_secs(5);
    while counted("door.cluster.errors", "") < 3 {
        assert!(
            door_daemon::time::now() < deadline,
            "the syncs stopped after one panicked ({} failures counted)",
            counted("door.cluster.errors", "")
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(c.status().snapshot().state, State::Degraded);
}

/// A door's shield as the sync task sees it: what was put on it, and for how long.
#[derive(Debug, Default)]
struct Shield(Mutex<Vec<(PrefixKey, Duration)>>);

impl Blocklist for Shield {
    fn block(&self, key: PrefixKey, duration: Duration) -> bool {
        self.0.lock().unwrap().push((key, duration));
        true
    }
}

impl Shield {
    /// The lifetimes `key` was put on this shield with, in order.
    fn of(&self, key: PrefixKey) -> Vec<Duration> {
        self.0
            .lock()
            .unwrap()
            .iter()
            .filter(|(k, _)| *k == key)
            .map(|(_, d)| *d)
            .collect()
    }

    /// Waits (at most `within`) until `key` is on this shield; its first lifetime.
    async fn wait_for(&self, key: PrefixKey, within: Duration) -> Option<Duration> {
        let deadline = door_daemon::time::now() + within;
        loop {
            if let Some(d) = self.of(key).first() {
                return Some(*d);
            }
            if door_daemon::time::now() > deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

/// A door with a recording shield, sharing its blocks: the door, its shared blocklist, its shield.
async fn door_with_shield(
    cfg: &Config,
    clock: Arc<dyn Clock>,
    id: &str,
) -> (Door, Arc<SharedBlocklist>, Arc<Shield>) {
    let shield = Arc::new(Shield::default());
    let shared = SharedBlocklist::new(shield.clone(), Arc::clone(&clock));
    let d = door_with(cfg, clock, id, Some(Arc::clone(&shared))).await;
    (d, shared, shield)
}

fn hex(key: PrefixKey) -> String {
    key.addr.iter().fold(String::new(), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

/// Whether `key` is in the store's blocks set and in its sequence set.
async fn in_store(con: &mut redis::aio::MultiplexedConnection, key: PrefixKey) -> (bool, bool) {
    let mut found = [false; 2];
    for (i, set) in [cluster::blocks::BLOCKS_KEY, cluster::blocks::BLOCKS_SEQ_KEY]
        .into_iter()
        .enumerate()
    {
        let score: Option<f64> = redis::cmd("ZSCORE")
            .arg(set)
            .arg(hex(key))
            .query_async(con)
            .await
            .unwrap();
        found[i] = score.is_some();
    }
    (found[0], found[1])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_escalation_on_one_door_reaches_the_others_with_its_deadline_and_expires_everywhere() {
    if !redis_or_skip() {
        return;
    }
    let (_redis, held) = Redis::start().await;
    let port = held.port;
    let cfg = config(upstream().await, port);
    let clock_a: Arc<dyn Clock> = Arc::new(Offset(MonotonicClock::new(), 0));
    // Door B's clock is 7 s ahead: deadlines cross the wire as lifetimes, in the store's clock.
    let clock_b: Arc<dyn Clock> = Arc::new(Offset(MonotonicClock::new(), 7_000_000_000));
    let (a, shared_a, shield_a) = door_with_shield(&cfg, Arc::clone(&clock_a), "door-a").await;
    let (b, _, shield_b) = door_with_shield(&cfg, clock_b, "door-b").await;
    let both = [a, b];
    assert!(
        all_reach(&both, State::Synced, Duration::from_secs(3)).await,
        "the doors did not sync"
    );

    // Door A's escalator blocks a peer for 60 s, and a second one for 300 ms.
    let long = PrefixKey::from_ip("198.51.100.7".parse().unwrap());
    let short = PrefixKey::from_ip("2001:db8:bad:1::9".parse().unwrap());
    let esc_long = Escalator::new(
        1,
        Duration::from_secs(10),
        Duration::from_mins(1),
        Arc::clone(&clock_a),
        shared_a.clone(),
    );
    let esc_short = Escalator::new(
        1,
        Duration::from_secs(10),
        Duration::from_millis(300),
        Arc::clone(&clock_a),
        shared_a.clone(),
    );
    let escalated = door_daemon::time::now();
    assert!(esc_long.on_rejection(long, KeySource::Peer, &OWN_429));
    assert!(esc_short.on_rejection(short, KeySource::Peer, &OWN_429));
    // On A's own shield at once, with the escalator's lifetime.
    assert_eq!(shield_a.of(long).first(), Some(&Duration::from_mins(1)));

    let got = shield_b
        .wait_for(long, Duration::from_secs(2))
        .await
        .expect("door B's shield never got door A's block");
    let took = escalated.elapsed();
    eprintln!("door B blocked {long} for {got:?}, {took:?} after door A escalated");
    // Within a sync interval of each door (A's publish, B's fetch) on a loaded machine.
    assert!(took < SYNC * 2 + Duration::from_millis(400), "{took:?}");
    // The lifetime left: 60 s less the time it took, to the store's millisecond.
    assert!(got <= Duration::from_mins(1), "{got:?}");
    assert!(
        got + took >= Duration::from_mins(1) - Duration::from_millis(5),
        "{got:?} after {took:?}"
    );
    let short_left = shield_b
        .wait_for(short, Duration::from_secs(2))
        .await
        .expect("door B's shield never got the short block");
    assert!(short_left <= Duration::from_millis(300), "{short_left:?}");

    // Once its deadline passed, the short block is gone from the store (the next sync of either
    // door deletes it).
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}/0")).unwrap();
    let mut con = client.get_multiplexed_async_connection().await.unwrap();
    let deadline = door_daemon::time::now() + Duration::from_secs(3);
    while in_store(&mut con, short).await != (false, false) {
        assert!(
            escalated.elapsed() < Duration::from_millis(300) || door_daemon::time::now() < deadline,
            "the expired block is still in the store"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(escalated.elapsed() >= Duration::from_millis(300));
    assert_eq!(
        in_store(&mut con, long).await,
        (true, true),
        "the live block was pruned"
    );

    // A door that joins now learns the live block with what is left of it, never the expired one.
    let clock_c: Arc<dyn Clock> = Arc::new(Offset(MonotonicClock::new(), 3_000_000_000));
    let (c, _, shield_c) = door_with_shield(&cfg, clock_c, "door-c").await;
    let got_c = shield_c
        .wait_for(long, Duration::from_secs(2))
        .await
        .expect("a joining door never got the live block");
    let took_c = escalated.elapsed();
    assert!(got_c + took_c >= Duration::from_mins(1) - Duration::from_millis(5));
    assert!(got_c <= Duration::from_mins(1) - Duration::from_millis(300));
    assert!(
        all_reach(
            std::slice::from_ref(&c),
            State::Synced,
            Duration::from_secs(2)
        )
        .await,
        "door C did not sync"
    );
    assert!(
        shield_c.of(short).is_empty(),
        "the expired block reached door C"
    );
    // Door A's blocks were published once each: B saw the long one once, not at every sync.
    assert_eq!(shield_b.of(long).len(), 1, "{:?}", shield_b.of(long));
    drop(both);
}

/// The operator's side of a door's shield (`GET`/`POST /blocks`, `DELETE /blocks/{prefix}`):
/// what was blocked, for how long (whole seconds as listed).
impl AdminBlocklist for Shield {
    fn list(&self) -> Result<Vec<(PrefixKey, u64)>, ShieldError> {
        Ok(self
            .0
            .lock()
            .unwrap()
            .iter()
            .map(|(k, d)| (*k, d.as_secs()))
            .collect())
    }

    fn block(&self, key: PrefixKey, duration: Duration) -> Result<(), ShieldError> {
        Blocklist::block(self, key, duration);
        Ok(())
    }

    fn unblock(&self, key: &PrefixKey) -> Result<bool, ShieldError> {
        let mut list = self.0.lock().unwrap();
        let before = list.len();
        list.retain(|(k, _)| k != key);
        Ok(list.len() != before)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_block_the_operator_posts_on_one_door_reaches_the_others_but_an_unblock_stays_local() {
    if !redis_or_skip() {
        return;
    }
    let (_redis, held) = Redis::start().await;
    let port = held.port;
    let cfg = config(upstream().await, port);
    let clock: Arc<dyn Clock> = Arc::new(MonotonicClock::new());
    let (a, shared_a, shield_a) = door_with_shield(&cfg, Arc::clone(&clock), "door-a").await;
    let (b, _, shield_b) = door_with_shield(&cfg, clock, "door-b").await;
    let both = [a, b];
    assert!(
        all_reach(&both, State::Synced, Duration::from_secs(3)).await,
        "the doors did not sync"
    );
    // What POST /blocks on door A uses in cluster mode (the daemon builds the same).
    let admin_a = ClusterBlocklist {
        local: shield_a.clone(),
        shared: shared_a,
    };
    let key = PrefixKey::from_ip("2001:db8:77::1".parse().unwrap());
    let posted = door_daemon::time::now();
    admin_a.block(key, Duration::from_mins(10)).unwrap();
    assert_eq!(shield_a.of(key), vec![Duration::from_mins(10)]);
    let got = shield_b
        .wait_for(key, Duration::from_secs(2))
        .await
        .expect("door B's shield never got the block posted on door A");
    let took = posted.elapsed();
    assert!(took < SYNC * 2 + Duration::from_millis(400), "{took:?}");
    assert!(got <= Duration::from_mins(10), "{got:?}");
    assert!(got + took >= Duration::from_mins(10) - Duration::from_millis(5));
    // DELETE /blocks/{prefix} on door A lifts it there only.
    assert!(admin_a.unblock(&key).unwrap());
    assert!(admin_a.list().unwrap().is_empty());
    assert_eq!(shield_b.of(key).len(), 1);
    drop(both);
}

/// A certificate authority and a server certificate for 127.0.0.1 and `localhost` it signed,
/// written as PEM to `dir`: (CA file, certificate file, key file).
fn test_ca(dir: &std::path::Path) -> (std::path::PathBuf, std::path::PathBuf, std::path::PathBuf) {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair, KeyUsagePurpose};
    let ca_key = KeyPair::generate().unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    ca_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "door test CA");
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(ca_params, ca_key);
    let key = KeyPair::generate().unwrap();
    let params =
        CertificateParams::new(vec!["127.0.0.1".to_owned(), "localhost".to_owned()]).unwrap();
    let cert = params.signed_by(&key, &issuer).unwrap();
    let paths = (
        dir.join("ca.pem"),
        dir.join("redis.crt"),
        dir.join("redis.key"),
    );
    std::fs::write(&paths.0, ca.pem()).unwrap();
    std::fs::write(&paths.1, cert.pem()).unwrap();
    std::fs::write(&paths.2, key.serialize_pem()).unwrap();
    paths
}

/// A redis-server that listens only for TLS, with `cert` and `key`, on a [`HeldPort`] of its own;
/// killed on drop. Fails the test with redis-server's own words if it exits (a build without TLS
/// says so) or does not accept connections within 5 s.
async fn start_tls_redis(cert: &std::path::Path, key: &std::path::Path) -> (Redis, HeldPort) {
    let held = HeldPort::new();
    let args = [
        "--port".into(),
        "0".into(),
        "--tls-port".into(),
        held.port.to_string().into(),
        "--tls-cert-file".into(),
        cert.as_os_str().to_owned(),
        "--tls-key-file".into(),
        key.as_os_str().to_owned(),
        "--tls-auth-clients".into(),
        "no".into(),
    ];
    (Redis::launch(&args, held.port, Ready::Accepts).await, held)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn doors_sync_over_rediss_verifying_the_store_against_the_configured_ca() {
    if !redis_or_skip() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("door-rediss-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (ca, cert, key) = test_ca(&dir);
    // Another CA, which did not sign the store's certificate.
    let other_dir = dir.join("other");
    std::fs::create_dir_all(&other_dir).unwrap();
    let (other_ca, _, _) = test_ca(&other_dir);
    let (_redis, held) = start_tls_redis(&cert, &key).await;
    let port = held.port;
    let up = upstream().await;
    let tls_config = |ca: &std::path::Path| {
        let mut cfg = config(up, port);
        cfg.cluster.redis = Some(format!("rediss://127.0.0.1:{port}/0"));
        cfg.cluster.ca_file = Some(ca.to_owned());
        cfg
    };
    // The key is what the file form spells, too.
    let from_file = Config::from_toml(
        "rediss.toml",
        &format!(
            "upstream = \"http://{up}\"\n[cluster]\nredis = \"rediss://127.0.0.1:{port}/0\"\nca_file = {:?}\n",
            ca.display().to_string()
        ),
    )
    .unwrap();
    assert_eq!(from_file.cluster.ca_file.as_deref(), Some(ca.as_path()));

    let cfg = tls_config(&ca);
    let mut both = Vec::new();
    for id in ["tls-a", "tls-b"] {
        let clock: Arc<dyn Clock> = Arc::new(MonotonicClock::new());
        both.push(door(&cfg, clock, id).await);
    }
    assert!(
        all_reach(&both, State::Synced, Duration::from_secs(5)).await,
        "the doors did not sync over rediss://: {:?}",
        both.iter()
            .map(|d| d.cluster.status().json())
            .collect::<Vec<_>>()
    );
    let deadline = door_daemon::time::now() + Duration::from_secs(3);
    while both
        .iter()
        .any(|d| d.cluster.status().snapshot().doors != 2)
    {
        assert!(
            door_daemon::time::now() < deadline,
            "the doors did not see each other"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    // A door that trusts another CA never syncs: the store's certificate is verified.
    let wrong = door(
        &tls_config(&other_ca),
        Arc::new(MonotonicClock::new()),
        "tls-wrong",
    )
    .await;
    tokio::time::timeout(Duration::from_secs(1), async {
        // Several sync intervals, every one of them refused.
        while wrong.cluster.status().snapshot().last_sync.is_none() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect_err("a door that does not trust the store's CA synced");
    assert_eq!(wrong.cluster.status().snapshot().state, State::Degraded);
    drop(both);
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blocks_made_while_the_store_is_gone_are_shared_when_it_returns_empty() {
    if !redis_or_skip() {
        return;
    }
    let (redis, held) = Redis::start().await;
    let port = held.port;
    let cfg = config(upstream().await, port);
    let clock_a: Arc<dyn Clock> = Arc::new(MonotonicClock::new());
    let (a, shared_a, _) = door_with_shield(&cfg, Arc::clone(&clock_a), "door-a").await;
    let (b, _, shield_b) = door_with_shield(&cfg, Arc::new(MonotonicClock::new()), "door-b").await;
    let both = [a, b];
    assert!(
        all_reach(&both, State::Synced, Duration::from_secs(3)).await,
        "the doors did not sync"
    );
    let escalator = Escalator::new(
        1,
        Duration::from_secs(10),
        Duration::from_mins(1),
        Arc::clone(&clock_a),
        shared_a.clone(),
    );
    let first = PrefixKey::from_ip("198.51.100.20".parse().unwrap());
    assert!(escalator.on_rejection(first, KeySource::Peer, &OWN_429));
    assert!(
        shield_b
            .wait_for(first, Duration::from_secs(2))
            .await
            .is_some(),
        "door B never got the first block"
    );

    // The store goes away, and comes back empty (no persistence): its block counter starts over,
    // below door B's cursor. A block made meanwhile waits on door A, then reaches door B.
    redis.kill();
    assert!(
        all_reach(&both, State::Degraded, Duration::from_secs(2)).await,
        "the doors did not notice the store was gone"
    );
    let second = PrefixKey::from_ip("198.51.100.21".parse().unwrap());
    assert!(escalator.on_rejection(second, KeySource::Peer, &OWN_429));
    let _redis = Redis::start_on(port).await;
    let left = shield_b
        .wait_for(second, Duration::from_secs(5))
        .await
        .expect("the block made while the store was gone never reached door B");
    assert!(left <= Duration::from_mins(1), "{left:?}");
    // And a block made after the store came back reaches it too.
    let third = PrefixKey::from_ip("198.51.100.22".parse().unwrap());
    assert!(escalator.on_rejection(third, KeySource::Peer, &OWN_429));
    assert!(
        shield_b
            .wait_for(third, Duration::from_secs(2))
            .await
            .is_some(),
        "a block made after the store came back never reached door B"
    );
    drop(both);
}

/// A store restored from an older snapshot, or a replica promoted before it caught up, keeps its
/// epoch with a smaller block counter: a door whose cursor is past it starts from the beginning,
/// or the blocks numbered again up to its cursor would never reach it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_whose_block_counter_went_back_still_reaches_every_door() {
    if !redis_or_skip() {
        return;
    }
    let (_redis, held) = Redis::start().await;
    let up = upstream().await;
    let cfg = config(up, held.port);
    // Door B syncs every second, so that door A's syncs publish before door B's next one.
    let slow = config_with(up, held.port, RATE, Duration::from_secs(1));
    let (a, shared_a, _) = door_with_shield(&cfg, Arc::new(MonotonicClock::new()), "door-a").await;
    let (b, _, shield_b) = door_with_shield(&slow, Arc::new(MonotonicClock::new()), "door-b").await;
    let both = [a, b];
    assert!(
        all_reach(&both, State::Synced, Duration::from_secs(3)).await,
        "the doors did not sync"
    );
    let reaches_b = |last: u8| {
        let key = PrefixKey::from_ip(std::net::Ipv4Addr::new(198, 51, 100, last).into());
        Blocklist::block(&*shared_a, key, Duration::from_mins(1));
        let shield_b = Arc::clone(&shield_b);
        async move {
            shield_b
                .wait_for(key, Duration::from_secs(3))
                .await
                .is_some()
        }
    };
    for last in 30..33 {
        assert!(reaches_b(last).await, "door B never got block {last}");
    }
    // Door B's cursor is at 3; the store comes back with its counter at 1, epoch unchanged.
    let () = redis::cmd("HSET")
        .arg(cluster::blocks::BLOCKS_META_KEY)
        .arg("seq")
        .arg(1)
        .query_async(&mut store(held.port).await)
        .await
        .unwrap();
    // Three blocks, published by door A before door B syncs again: the counter passes door B's
    // cursor again.
    let keys: Vec<PrefixKey> = (40..43)
        .map(|last| {
            let key = PrefixKey::from_ip(std::net::Ipv4Addr::new(198, 51, 100, last).into());
            Blocklist::block(&*shared_a, key, Duration::from_mins(1));
            key
        })
        .collect();
    for key in keys {
        assert!(
            shield_b
                .wait_for(key, Duration::from_secs(3))
                .await
                .is_some(),
            "{key}, numbered 2 to 4 again, never reached door B, whose cursor was 3"
        );
    }
    drop(both);
}

/// One door with a recording shield sharing the store on `port`, once it has synced.
async fn lone_synced_door(port: u16) -> Door {
    let cfg = config(upstream().await, port);
    let (d, _, _) = door_with_shield(&cfg, Arc::new(MonotonicClock::new()), "door-a").await;
    once_synced(d).await
}

/// `d` once it has synced (within 3 s).
async fn once_synced(d: Door) -> Door {
    assert!(
        all_reach(
            std::slice::from_ref(&d),
            State::Synced,
            Duration::from_secs(3)
        )
        .await,
        "the door did not sync"
    );
    d
}

/// A shared TAT far past any debt (the store's clock stepped back an hour, say) locks the client
/// out for a bounded time, `(N + 1) × (burst × interval + 3 × sync_interval)`, not for the hour.
/// With one door, burst 20 and 2 tokens/s: 2 × (10 s + 0.15 s), plus the request's own token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_clock_that_stepped_back_locks_a_client_out_for_a_bounded_time() {
    if !redis_or_skip() {
        return;
    }
    let (_redis, held) = Redis::start().await;
    let d = lone_synced_door(held.port).await;
    let mut con = store(held.port).await;
    let (s, us): (u64, u64) = redis::cmd("TIME").query_async(&mut con).await.unwrap();
    let client = "198.51.100.7";
    set_budget(
        &mut con,
        client,
        &format!("{}.000", s * 1_000_000 + us + 3_600_000_000),
    )
    .await;

    // Admitted locally, sent with the next sync, and the store's deficit folded in.
    assert_eq!(send(&d, client).await.0, StatusCode::OK);
    let reset_s = folded_reset_s(&link(&d), client, WINDOW_S).await;
    assert!(
        (WINDOW_S + 1..=21).contains(&reset_s),
        "a TAT an hour ahead was folded as {reset_s} s (never, or past the cap)"
    );
    assert_eq!(send(&d, client).await.0, StatusCode::TOO_MANY_REQUESTS);
}

/// Values door did not write (a budget key holding `inf` or `nan`, a block member numbered past
/// the store's counter) neither stop the sync nor lock a client out for longer than the cap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn values_door_did_not_write_do_not_stop_the_sync() {
    if !redis_or_skip() {
        return;
    }
    let (_redis, held) = Redis::start().await;
    let d = lone_synced_door(held.port).await;
    let mut con = store(held.port).await;
    let (inf, nan) = ("198.51.100.11", "198.51.100.12");
    set_budget(&mut con, inf, "inf").await;
    set_budget(&mut con, nan, "nan").await;
    let () = redis::cmd("ZADD")
        .arg(cluster::blocks::BLOCKS_SEQ_KEY)
        .arg(1e300)
        .arg("not-a-door-member")
        .query_async(&mut con)
        .await
        .unwrap();
    for client in [inf, nan] {
        assert_eq!(send(&d, client).await.0, StatusCode::OK);
    }
    let reset_s = folded_reset_s(&link(&d), inf, WINDOW_S).await;
    assert!(
        (WINDOW_S + 1..=21).contains(&reset_s),
        "an infinite TAT was folded as {reset_s} s (never, or past the cap)"
    );
    let nan_key = PrefixKey::from_ip(nan.parse().unwrap());
    assert!(
        link(&d).quota(&nan_key).reset_s <= 1,
        "a NaN TAT is no debt"
    );
    assert_eq!(d.cluster.status().snapshot().state, State::Synced);
}

/// The shared debt of `client` in the `link` group, in seconds past the store's now; `None`
/// when the store holds none.
async fn store_debt_s(con: &mut redis::aio::MultiplexedConnection, client: &str) -> Option<f64> {
    store_debt_in(con, "link", client).await
}

/// The shared debt of `client` in `group` (a group or a plane), as [`store_debt_s`].
async fn store_debt_in(
    con: &mut redis::aio::MultiplexedConnection,
    group: &str,
    client: &str,
) -> Option<f64> {
    let key = PrefixKey::from_ip(client.parse().unwrap());
    let tat: Option<f64> = redis::cmd("GET")
        .arg(format!("door:{{{group}}}:{}", hex(key)))
        .query_async(con)
        .await
        .unwrap();
    let (s, us): (u64, u64) = redis::cmd("TIME").query_async(con).await.unwrap();
    #[expect(clippy::cast_precision_loss, reason = "µs since 1970, within 2^53")]
    let now_us = (s * 1_000_000 + us) as f64;
    tat.map(|t| (t - now_us) / 1e6)
}

/// `DELETE /clients/{prefix}` in a cluster deletes the client's shared debt too: otherwise the
/// next sync folds it straight back into the row the operator just reset.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forgetting_a_client_deletes_its_shared_debt() {
    if !redis_or_skip() {
        return;
    }
    let (_redis, held) = Redis::start().await;
    let d = lone_synced_door(held.port).await;
    let mut con = store(held.port).await;
    let client = "198.51.100.7";
    for _ in 0..BURST {
        assert_eq!(send(&d, client).await.0, StatusCode::OK);
    }
    assert_eq!(send(&d, client).await.0, StatusCode::TOO_MANY_REQUESTS);
    // The whole burst is the store's debt once a sync has sent it.
    let deadline = door_daemon::time::now() + Duration::from_secs(2);
    while store_debt_s(&mut con, client).await.is_none_or(|s| s < 5.0) {
        assert!(
            door_daemon::time::now() < deadline,
            "the debt never reached the store"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    forget(&d, client);
    assert_eq!(send(&d, client).await.0, StatusCode::OK);
    // The next sync deletes the debt, then sends that one request's token.
    let deadline = door_daemon::time::now() + Duration::from_secs(2);
    loop {
        let debt = store_debt_s(&mut con, client).await;
        if debt.is_some_and(|s| s < 2.0) {
            break;
        }
        assert!(
            door_daemon::time::now() < deadline,
            "the store still holds a debt of {debt:?} s"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // And the reset row keeps what is left of its burst.
    let remaining = link(&d)
        .quota(&PrefixKey::from_ip(client.parse().unwrap()))
        .remaining;
    assert!(
        remaining >= BURST - 2,
        "{remaining} tokens left after the sync"
    );
}

/// `DELETE /clients/{client}` on door `d`, through the admin API's function.
fn forget(d: &Door, client: &str) {
    let app = Arc::clone(d.front.app());
    let source = StatusSource {
        limiters: Arc::new(move || app.limiters()),
        passthrough: {
            let caps = Arc::clone(d.front.app());
            Arc::new(move || caps.passthrough_status())
        },
        metrics: Metrics::noop(),
        shield: None,
        xdp_mode: "off",
        cluster: d.cluster.status(),
        exposition: None,
        blocklist: None,
        unblocked: Arc::new(|_| {}),
    };
    door_daemon::admin::api::forget(&source, client, None).unwrap();
}

/// A store whose ACL refuses `DEL` cannot delete a forgotten client's debt, and must not make
/// every sync fail for it: the door stays synced (the debt folds back, and the log says so).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_that_refuses_del_keeps_the_door_synced() {
    if !redis_or_skip() {
        return;
    }
    let (_redis, held) = Redis::start().await;
    let mut con = store(held.port).await;
    let d = door_as_store_user(&mut con, held.port, "~* &* +@all -del").await;
    let client = "198.51.100.7";
    assert_eq!(send(&d, client).await.0, StatusCode::OK);
    forget(&d, client);
    let forgot = door_daemon::time::now();
    // Good syncs go on after the refused DEL.
    let deadline = forgot + Duration::from_secs(2);
    loop {
        let s = d.cluster.status().snapshot();
        if s.last_sync.is_some_and(|t| t > forgot + SYNC * 3) {
            break;
        }
        assert!(
            door_daemon::time::now() < deadline,
            "no good sync since the forget: {:?}",
            s.state
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(d.cluster.status().snapshot().state, State::Synced);
}

/// The ACL docs/operations.md gives the doors' store user ("Trust"): the `door:` keys, and only
/// the commands door and its script send. A door under it syncs, and shares a client's budget.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_user_limited_to_the_documented_acl_keeps_the_door_synced() {
    if !redis_or_skip() {
        return;
    }
    let (_redis, held) = Redis::start().await;
    let mut con = store(held.port).await;
    let rules = format!("~door:* -@all {DOOR_ACL_COMMANDS}");
    let d = door_as_store_user(&mut con, held.port, &rules).await;
    let client = "198.51.100.7";
    assert_eq!(send(&d, client).await.0, StatusCode::OK);
    // The client's debt reaches the store under the limited user.
    let deadline = door_daemon::time::now() + Duration::from_secs(5);
    loop {
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg("door:{link}:*")
            .query_async(&mut con)
            .await
            .unwrap();
        if !keys.is_empty() {
            break;
        }
        assert!(door_daemon::time::now() < deadline, "no debt in the store");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(d.cluster.status().snapshot().state, State::Synced);
    let log: Vec<redis::Value> = redis::cmd("ACL")
        .arg("LOG")
        .query_async(&mut con)
        .await
        .unwrap();
    assert!(log.is_empty(), "the ACL refused something: {log:?}");
}

/// A door, synced, that reaches the store on `port` as the user `door`, which `con` (the store's
/// default user) first makes with the ACL `rules` (`ACL SETUSER door on >PASSWORD RULES…`).
async fn door_as_store_user(
    con: &mut redis::aio::MultiplexedConnection,
    port: u16,
    rules: &str,
) -> Door {
    let mut setuser = vec!["SETUSER", "door", "on", ">door-test"];
    setuser.extend(rules.split_whitespace());
    let () = redis::cmd("ACL")
        .arg(&setuser[..])
        .query_async(con)
        .await
        .unwrap();
    let url = format!("redis://door:door-test@127.0.0.1:{port}/0");
    let cfg = config_for(upstream().await, &url, RATE, SYNC);
    once_synced(door(&cfg, Arc::new(MonotonicClock::new()), "door-a").await).await
}

/// The commands of the doors' store user in docs/operations.md ("Trust"), as `ACL SETUSER` takes
/// them: `EVALSHA` and `SCRIPT LOAD` (the sync's script, loaded when the store lacks it), `DEL`
/// (the debts of forgotten clients), `SELECT` (a database other than 0), and what the script
/// calls.
const DOOR_ACL_COMMANDS: &str = "+evalsha +script|load +del +select +time +zadd \
     +zremrangebyscore +pexpire +zcard +hget +hset +hincrby +zrangebyscore +zrem +zscore +get +set";

/// An upstream that answers every request with a short `text/event-stream` once `gate` is
/// notified (one request per notification).
async fn gated_event_stream(gate: Arc<tokio::sync::Notify>) -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let up = l.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            let opened = Arc::clone(&gate);
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |_req: Request<Incoming>| {
                    let opened = Arc::clone(&opened);
                    async move {
                        opened.notified().await;
                        let res = Response::builder()
                            .header("content-type", "text/event-stream")
                            .body(Full::new(Bytes::from_static(b"data: one\n\n")))
                            .unwrap();
                        Ok::<_, Infallible>(res)
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(s), svc)
                    .await;
            });
        }
    });
    up
}

/// door with the request planes on (the IP plane: burst 5, one token per 1,000 s), in front of
/// `up`, sharing through the store on `redis_port` every 50 ms.
fn planes_config(up: SocketAddr, redis_port: u16) -> Config {
    Config::from_toml(
        "cluster-planes.toml",
        &format!(
            r#"
listen = ["127.0.0.1:0"]
upstream = "http://{up}"
admin_listen = "off"
trusted_proxies = ["127.0.0.1/32"]
[plane.session]
header = "authorization"
rate = 0.001
burst = 3
[plane.ip]
rate = 0.001
burst = 5
[cluster]
redis = "redis://127.0.0.1:{redis_port}/0"
sync_interval = "50ms"
timeout = "100ms"
"#
        ),
    )
    .unwrap()
}

/// One `GET /events` asking for an event stream from `client` (by `X-Forwarded-For`), on a task:
/// its status once the head arrives.
fn spawn_event_stream(
    addr: SocketAddr,
    client: &'static str,
) -> tokio::task::JoinHandle<StatusCode> {
    tokio::spawn(async move {
        let s = TcpStream::connect(addr).await.unwrap();
        let (mut c, conn) = hyper::client::conn::http1::handshake(TokioIo::new(s))
            .await
            .unwrap();
        tokio::spawn(conn);
        let req = Request::get("/events")
            .header("host", "door.test")
            .header("x-forwarded-for", client)
            .header("accept", "text/event-stream")
            .body(Empty::<Bytes>::new())
            .unwrap();
        c.send_request(req).await.unwrap().status()
    })
}

/// Waits (at most 3 s) until the store holds `client`'s IP-plane token: 1,000 s of debt or more.
async fn until_store_debt(con: &mut redis::aio::MultiplexedConnection, client: &str) {
    let deadline = door_daemon::time::now() + Duration::from_secs(3);
    while store_debt_in(con, "ip", client)
        .await
        .is_none_or(|s| s < 900.0)
    {
        assert!(
            door_daemon::time::now() < deadline,
            "the plane's spend never reached the store"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Waits (at most 2 s) until `d` has synced three sync intervals after `since`: at least two
/// whole syncs later.
async fn until_synced_after(d: &Door, since: tokio::time::Instant) {
    while d
        .cluster
        .status()
        .snapshot()
        .last_sync
        .is_none_or(|t| t < since + SYNC * 3)
    {
        assert!(door_daemon::time::now() < since + Duration::from_secs(2));
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A refund whose debt the store no longer holds (repaid, or gone) writes nothing: a repaid key
/// keeps the value it had, and a gone one stays gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refund_of_a_repaid_debt_writes_nothing() {
    if !redis_or_skip() {
        return;
    }
    let (_redis, held) = Redis::start().await;
    let gate = Arc::new(tokio::sync::Notify::new());
    let cfg = planes_config(gated_event_stream(Arc::clone(&gate)).await, held.port);
    let d = once_synced(door(&cfg, Arc::new(MonotonicClock::new()), "door-a").await).await;
    let mut con = store(held.port).await;
    let client = "198.51.100.7";
    let store_key = format!(
        "door:{{ip}}:{}",
        hex(PrefixKey::from_ip(client.parse().unwrap()))
    );
    let stream = spawn_event_stream(d.addr, client);
    until_store_debt(&mut con, client).await;
    // The debt repaid (as if its time had passed): a TAT a second ago, kept a minute.
    let (s, us): (u64, u64) = redis::cmd("TIME").query_async(&mut con).await.unwrap();
    let repaid = format!("{}.000", (s - 1) * 1_000_000 + us);
    let () = redis::cmd("SET")
        .arg(&store_key)
        .arg(&repaid)
        .arg("PX")
        .arg(60_000)
        .query_async(&mut con)
        .await
        .unwrap();
    gate.notify_one();
    assert_eq!(stream.await.unwrap(), StatusCode::OK);
    // Two syncs after the refund: the key is as the test left it.
    until_synced_after(&d, door_daemon::time::now()).await;
    let now: Option<String> = redis::cmd("GET")
        .arg(&store_key)
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(
        now.as_deref(),
        Some(repaid.as_str()),
        "rewritten by the refund"
    );
}

/// With the planes on, a request that turns out to be an event stream gives its plane token back
/// (docs/design.md, "Streams and sessions", Streams). When a sync has already sent that token to
/// the store, the next sync takes it back there too: the store's debt goes, and is not folded back
/// into the client's row, so each stream opened in a cluster costs the client nothing on its plane.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plane_token_refunded_after_a_sync_is_taken_back_from_the_store() {
    if !redis_or_skip() {
        return;
    }
    let (_redis, held) = Redis::start().await;
    let gate = Arc::new(tokio::sync::Notify::new());
    let cfg = planes_config(gated_event_stream(Arc::clone(&gate)).await, held.port);
    let d = once_synced(door(&cfg, Arc::new(MonotonicClock::new()), "door-a").await).await;
    let mut con = store(held.port).await;
    let client = "198.51.100.7";
    let key = PrefixKey::from_ip(client.parse().unwrap());
    let ip = d
        .front
        .app()
        .limiters()
        .into_iter()
        .find(|l| l.group() == "ip")
        .unwrap();

    let stream = spawn_event_stream(d.addr, client);
    // The plane's token reaches the store (one token: 1,000 s of debt) while the upstream has
    // not answered yet.
    until_store_debt(&mut con, client).await;
    assert_eq!(ip.quota(&key).remaining, 4);
    gate.notify_one();
    assert_eq!(stream.await.unwrap(), StatusCode::OK);

    // Refunded here at once, and taken back from the store by a later sync: the client's row is
    // full again and stays so over further syncs.
    let deadline = door_daemon::time::now() + Duration::from_secs(3);
    loop {
        let debt = store_debt_in(&mut con, "ip", client).await;
        if debt.is_none_or(|s| s < 1.0) {
            break;
        }
        assert!(
            door_daemon::time::now() < deadline,
            "the store kept the refunded token: {debt:?} s of debt"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    until_synced_after(&d, door_daemon::time::now()).await;
    assert_eq!(ip.quota(&key).remaining, 5, "the debt was folded back");
}
