//! `soak-client`: the traffic of `cargo xtask soak` (xtask/src/soak.rs), run in the client
//! namespace against door in the other one, between documentation-range addresses only
//! (192.0.2.0/24, 198.51.100.0/24, 203.0.113.0/24, 2001:db8::/32; anything else is refused).
//!
//! For `--seconds`, several tasks at once, each bounded in count and time:
//!
//! - well-formed requests over HTTP/1.1 (one request at a time per connection) and HTTP/2 (h2c
//!   with prior knowledge, six streams at a time per connection), from every `--sources`
//!   address, to the limited routes (`webhook`, charged on failure, some answered 400 by the
//!   upstream; `link`; `health`) and to pass-through ones (the demo upstream's `/echo-body`,
//!   `/slow`, `/stream`, a `text/event-stream` answer, a JSON page). Every answer is read to its end and
//!   checked where its content is known (an echo equals what was sent, a stream has its length,
//!   a webhook's `received_bytes` is the body's length);
//! - clients that abort: half a request head then a hang-up; a body shorter than its
//!   `Content-Length` then a hang-up (HTTP/1.1); a whole request to a slow answer, then a
//!   hang-up while door waits for the upstream; an HTTP/2 request broken off by `RST_STREAM` or
//!   by dropping the connection;
//! - slow readers of a 4 MiB answer (a tiny receive buffer, or a small HTTP/2 window; a few bytes
//!   a second), dropped after a few seconds;
//! - slowloris heads: a header line every 2 s, until door closes the connection (at most 30 s);
//! - request heads over 64 KiB, over HTTP/1.1 and HTTP/2, which must get 431.
//!
//! Every second it prints `soak-client: progress {json}`; at the end one line
//! `soak-client: report {json}`: per kind of traffic, the requests sent completely, the answers
//! read completely by status, those cut short or never answered, the aborts; and, with the Unix
//! time in milliseconds, every 5xx, cut, loss and content mismatch, which xtask sets against the
//! times the upstream was down.

use std::{
    collections::BTreeMap,
    net::{IpAddr, SocketAddr},
    pin::Pin,
    sync::{Arc, Mutex, PoisonError},
    task::{Context, Poll},
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use anyhow::{Context as _, bail};
use bytes::Bytes;
use clap::Parser;
use http::{Method, Request};
use http_body_util::{BodyExt as _, Full};
use hyper::body::{Body, Frame, Incoming};
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::{Value, json};
use tokio::{
    io::{AsyncReadExt as _, AsyncWriteExt as _},
    net::{TcpSocket, TcpStream},
    sync::mpsc,
    task::JoinSet,
    time::{Instant, sleep, timeout},
};

/// Soak traffic against door (see the module docs).
#[derive(Debug, Parser)]
#[command(name = "soak-client")]
struct Args {
    /// door's IPv4 listener, for the IPv4 sources.
    #[arg(long, default_value = "192.0.2.1:8443")]
    door: SocketAddr,
    /// door's IPv6 listener, for the IPv6 sources.
    #[arg(long, default_value = "[2001:db8:d00::1]:8443")]
    door6: SocketAddr,
    /// Addresses of this namespace to send from, comma-separated; tasks take them in turn.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "192.0.2.2,192.0.2.3,2001:db8:c1::2"
    )]
    sources: Vec<IpAddr>,
    /// Seconds of traffic (at most a day); then every task finishes what it is doing.
    #[arg(long, default_value_t = 60)]
    seconds: u64,
}

/// The longest any single exchange may take before it counts as unanswered.
const EXCHANGE_TIMEOUT: Duration = Duration::from_secs(30);
/// Connecting, bounded.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Events kept for the report (5xx, cuts, losses, mismatches); more are counted, not listed.
const MAX_EVENTS: usize = 200_000;
/// Requests one HTTP/1.1 connection carries before it is closed and another opened.
const H1_REQUESTS_PER_CONN: u32 = 50;
/// Requests one HTTP/2 stream slot carries before its connection is closed.
const H2_REQUESTS_PER_SLOT: u32 = 50;
/// Streams one HTTP/2 connection runs at once.
const H2_STREAMS: u64 = 6;
/// Rounds (connections, or attempts) one task makes at most, whatever the time left.
const MAX_ROUNDS: u32 = 1_000_000;
/// The bound of request heads door promises (64 KiB), and so what the oversized heads exceed.
const HEAD_LIMIT: usize = 64 << 10;

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    for addr in args
        .sources
        .iter()
        .copied()
        .chain([args.door.ip(), args.door6.ip()])
    {
        if !documentation(addr) {
            bail!(
                "soak-client only talks between documentation-range addresses (192.0.2.0/24, \
                 198.51.100.0/24, 203.0.113.0/24, 2001:db8::/32): {addr}"
            );
        }
    }
    if args.sources.is_empty() {
        bail!("--sources: at least one address");
    }
    if args.seconds > 86_400 {
        bail!("--seconds: at most a day");
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(run(args))
}

/// Whether `ip` is in a documentation range.
fn documentation(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => {
            let [a, b, c, _] = v4.octets();
            matches!((a, b, c), (192, 0, 2) | (198, 51, 100) | (203, 0, 113))
        }
        IpAddr::V6(v6) => v6.segments().starts_with(&[0x2001, 0x0db8]),
    }
}

/// Milliseconds since the Unix epoch: the time base xtask records the upstream's outages in.
fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// What became of the requests of one kind.
#[derive(Debug, Default)]
struct KindStats {
    /// Well-formed requests sent (hyper took them whole).
    sent: u64,
    /// Answers read to their end, by status.
    statuses: BTreeMap<u16, u64>,
    /// Answers whose head came but whose body broke off.
    cut: u64,
    /// Requests sent that got no answer (an error or [`EXCHANGE_TIMEOUT`]).
    lost: u64,
    /// Complete answers whose content was not what the upstream sends.
    mismatch: u64,
    /// Requests never sent: the connection was gone before hyper wrote them.
    not_sent: u64,
    /// Requests this client broke off on purpose.
    aborted: u64,
    /// Connections that could not be opened.
    connect_failed: u64,
    /// Connections door closed (slowloris heads, slow readers' cut answers).
    closed_by_door: u64,
    /// For slowloris heads: the longest door took to close one, in milliseconds.
    max_close_ms: u64,
    /// Slowloris heads door did not close within 30 s.
    not_closed: u64,
}

/// Everything the tasks record.
#[derive(Debug, Default)]
struct Stats {
    kinds: BTreeMap<&'static str, KindStats>,
    /// `(unix ms, kind, what)`: 5xx answers (`"502"`…), `"cut"`, `"lost"`, `"mismatch"`.
    events: Vec<(u64, &'static str, String)>,
    events_dropped: u64,
}

/// The shared recorder and the deadline.
#[derive(Debug, Clone)]
struct Ctx {
    stats: Arc<Mutex<Stats>>,
    end: Instant,
}

impl Ctx {
    fn over(&self) -> bool {
        Instant::now() >= self.end
    }

    fn with<R>(&self, kind: &'static str, f: impl FnOnce(&mut KindStats) -> R) -> R {
        let mut stats = self.stats.lock().unwrap_or_else(PoisonError::into_inner);
        f(stats.kinds.entry(kind).or_default())
    }

    fn event(&self, kind: &'static str, what: impl Into<String>) {
        let mut stats = self.stats.lock().unwrap_or_else(PoisonError::into_inner);
        if stats.events.len() < MAX_EVENTS {
            stats.events.push((unix_ms(), kind, what.into()));
        } else {
            stats.events_dropped += 1;
        }
    }

    /// Sleeps `d`, or until the deadline if that is sooner.
    async fn pause(&self, d: Duration) {
        let left = self.end.saturating_duration_since(Instant::now());
        sleep(d.min(left)).await;
    }
}

/// A small xorshift generator: the traffic's mix varies per task, needs no crate.
#[derive(Debug)]
struct Rng(u64);

impl Rng {
    fn new(task: u64) -> Self {
        Self(0x9E37_79B9_7F4A_7C15 ^ (task.wrapping_add(1)).wrapping_mul(0xBF58_476D_1CE4_E5B9))
    }

    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }

    /// A number in `lo..hi` (`lo` when the range is empty).
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        if hi <= lo {
            lo
        } else {
            lo + self.next() % (hi - lo)
        }
    }

    fn bytes(&mut self, n: usize) -> Bytes {
        let mut v = Vec::with_capacity(n);
        while v.len() < n {
            v.extend_from_slice(&self.next().to_le_bytes());
        }
        v.truncate(n);
        Bytes::from(v)
    }
}

/// What a complete 2xx answer must contain.
#[derive(Debug, Clone)]
enum Expect {
    /// Anything.
    Any,
    /// Exactly these bytes (an echo).
    Echo(Bytes),
    /// This many bytes (a stream).
    Len(usize),
    /// The webhook's `{"received_bytes": N}`.
    Received(usize),
}

impl Expect {
    fn holds(&self, body: &[u8]) -> bool {
        match self {
            Self::Any => true,
            Self::Echo(sent) => body == sent.as_ref(),
            Self::Len(n) => body.len() == *n,
            Self::Received(n) => serde_json::from_slice::<Value>(body)
                .ok()
                .and_then(|v| v.get("received_bytes")?.as_u64())
                .is_some_and(|got| usize::try_from(got).is_ok_and(|got| got == *n)),
        }
    }
}

/// One well-formed request of the mix.
#[derive(Debug, Clone)]
struct Planned {
    /// The route's name (`link`, `echo`…), without the protocol.
    route: &'static str,
    method: Method,
    path_and_query: String,
    body: Bytes,
    status: Option<&'static str>,
    expect: Expect,
}

/// The next request of the mix.
fn plan(rng: &mut Rng) -> Planned {
    let id = rng.range(0, 1000);
    let get = |route, path: String, expect| Planned {
        route,
        method: Method::GET,
        path_and_query: path,
        body: Bytes::new(),
        status: None,
        expect,
    };
    match rng.range(0, 100) {
        0..20 => {
            if rng.range(0, 8) == 0 {
                // A limited answer streamed over a second.
                get(
                    "link",
                    format!("/l/session/{id}?chunks=8&chunk_bytes=4096&chunk_ms=100"),
                    Expect::Len(8 * 4096),
                )
            } else {
                get("link", format!("/l/session/{id}"), Expect::Any)
            }
        }
        20..30 => get("health", "/healthz".to_owned(), Expect::Any),
        30..45 => {
            let n = usize::try_from(rng.range(200, 8000)).unwrap_or(200);
            let body = rng.bytes(n);
            let echo = rng.range(0, 6) == 0;
            let reject = rng.range(0, 5) == 0;
            Planned {
                route: "webhook",
                method: Method::POST,
                path_and_query: if echo {
                    "/webhooks/github?echo=1".to_owned()
                } else {
                    "/webhooks/github".to_owned()
                },
                expect: if echo {
                    Expect::Echo(body.clone())
                } else {
                    Expect::Received(n)
                },
                body,
                status: reject.then_some("400"),
            }
        }
        45..60 => get("pass", format!("/pass/{id}"), Expect::Any),
        60..75 => {
            let n = usize::try_from(rng.range(0, 64 << 10)).unwrap_or(0);
            let body = rng.bytes(n);
            Planned {
                route: "echo",
                method: Method::POST,
                path_and_query: "/echo-body".to_owned(),
                expect: Expect::Echo(body.clone()),
                body,
                status: None,
            }
        }
        75..85 => get(
            "slow",
            format!("/slow?ms={}", rng.range(100, 1500)),
            Expect::Any,
        ),
        85..95 => get(
            "stream",
            "/stream?chunks=16&chunk_bytes=2048&chunk_ms=20".to_owned(),
            Expect::Len(16 * 2048),
        ),
        _ => get(
            "sse",
            "/events?chunks=4&chunk_bytes=64&chunk_ms=100&sse=1".to_owned(),
            Expect::Len(4 * 64),
        ),
    }
}

/// The kind a planned request is counted under.
fn kind(h2: bool, route: &str) -> &'static str {
    match (h2, route) {
        (false, "link") => "h1 link",
        (false, "health") => "h1 health",
        (false, "webhook") => "h1 webhook",
        (false, "pass") => "h1 pass",
        (false, "echo") => "h1 echo",
        (false, "slow") => "h1 slow",
        (false, "stream") => "h1 stream",
        (false, _) => "h1 sse",
        (true, "link") => "h2 link",
        (true, "health") => "h2 health",
        (true, "webhook") => "h2 webhook",
        (true, "pass") => "h2 pass",
        (true, "echo") => "h2 echo",
        (true, "slow") => "h2 slow",
        (true, "stream") => "h2 stream",
        (true, _) => "h2 sse",
    }
}

/// A task of the mix: its recorder, its source and door's address, its number.
type Task = fn(Ctx, Peer, u64) -> Pin<Box<dyn Future<Output = ()> + Send>>;

/// A task's source address and the door listener of its family.
#[derive(Debug, Clone, Copy)]
struct Peer {
    source: IpAddr,
    door: SocketAddr,
}

/// A TCP connection from `peer.source` to door, with a receive buffer of `rcvbuf` bytes if given.
async fn connect(peer: Peer, rcvbuf: Option<u32>) -> anyhow::Result<TcpStream> {
    let socket = if peer.door.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    if let Some(n) = rcvbuf {
        socket.set_recv_buffer_size(n)?;
    }
    socket.bind(SocketAddr::new(peer.source, 0))?;
    Ok(timeout(CONNECT_TIMEOUT, socket.connect(peer.door))
        .await
        .context("connect timed out")??)
}

/// The request of `p` for `authority` (HTTP/2 takes the absolute form).
fn build(p: &Planned, authority: &str, h2: bool) -> anyhow::Result<Request<Full<Bytes>>> {
    let mut b = Request::builder().method(p.method.clone());
    b = if h2 {
        b.uri(format!("http://{authority}{}", p.path_and_query))
    } else {
        b.uri(p.path_and_query.as_str()).header("host", authority)
    };
    if let Some(s) = p.status {
        b = b.header("x-demo-status", s);
    }
    Ok(b.body(Full::new(p.body.clone()))?)
}

/// The outcome of sending one well-formed request, recorded under `kind`.
async fn exchange<F>(ctx: &Ctx, kind: &'static str, expect: &Expect, send: F)
where
    F: Future<Output = Result<http::Response<Incoming>, hyper::Error>>,
{
    let deadline = Instant::now() + EXCHANGE_TIMEOUT;
    let response = match tokio::time::timeout_at(deadline, send).await {
        Ok(Ok(r)) => r,
        Ok(Err(e)) if e.is_canceled() => {
            // hyper never wrote it: the connection was gone first.
            ctx.with(kind, |k| k.not_sent += 1);
            return;
        }
        Ok(Err(e)) => {
            ctx.with(kind, |k| {
                k.sent += 1;
                k.lost += 1;
            });
            ctx.event(kind, format!("lost: {e}"));
            return;
        }
        Err(_) => {
            ctx.with(kind, |k| {
                k.sent += 1;
                k.lost += 1;
            });
            ctx.event(kind, "lost: no answer within 30 s");
            return;
        }
    };
    ctx.with(kind, |k| k.sent += 1);
    let status = response.status();
    match tokio::time::timeout_at(deadline, response.into_body().collect()).await {
        Ok(Ok(body)) => {
            let body = body.to_bytes();
            let ok = !status.is_success() || expect.holds(&body);
            ctx.with(kind, |k| {
                *k.statuses.entry(status.as_u16()).or_default() += 1;
                if !ok {
                    k.mismatch += 1;
                }
            });
            if status.is_server_error() {
                ctx.event(kind, status.as_str());
                // Back off a little, as clients do: a fast 502 loop while the upstream is down
                // would be most of the traffic otherwise.
                ctx.pause(Duration::from_millis(200)).await;
            }
            if !ok {
                ctx.event(
                    kind,
                    format!("mismatch: {status}, {} bytes: {expect:?}", body.len()),
                );
            }
        }
        Ok(Err(e)) => {
            ctx.with(kind, |k| k.cut += 1);
            ctx.event(kind, format!("cut: {status}: {e}"));
        }
        Err(_) => {
            ctx.with(kind, |k| k.cut += 1);
            ctx.event(kind, format!("cut: {status}: body not done within 30 s"));
        }
    }
}

/// Well-formed HTTP/1.1 requests, one at a time, [`H1_REQUESTS_PER_CONN`] per connection.
async fn h1_task(ctx: Ctx, peer: Peer, task: u64) {
    let mut rng = Rng::new(task);
    let authority = peer.door.to_string();
    for _ in 0..MAX_ROUNDS {
        if ctx.over() {
            break;
        }
        let stream = match connect(peer, None).await {
            Ok(s) => s,
            Err(e) => {
                ctx.with("h1 connect", |k| k.connect_failed += 1);
                ctx.event("h1 connect", format!("connect: {e:#}"));
                ctx.pause(Duration::from_millis(200)).await;
                continue;
            }
        };
        let Ok((mut sender, conn)) =
            hyper::client::conn::http1::handshake::<_, Full<Bytes>>(TokioIo::new(stream)).await
        else {
            ctx.pause(Duration::from_millis(200)).await;
            continue;
        };
        let conn = tokio::spawn(conn);
        for _ in 0..H1_REQUESTS_PER_CONN {
            if ctx.over() || sender.ready().await.is_err() {
                break;
            }
            let p = plan(&mut rng);
            let k = kind(false, p.route);
            let Ok(req) = build(&p, &authority, false) else {
                break;
            };
            exchange(&ctx, k, &p.expect, sender.send_request(req)).await;
            ctx.pause(Duration::from_millis(rng.range(2, 20))).await;
        }
        drop(sender);
        // The connection ends once its sender is gone; bounded all the same.
        let _ = timeout(Duration::from_secs(5), conn).await;
    }
}

/// Well-formed HTTP/2 requests (h2c, prior knowledge), [`H2_STREAMS`] at a time on one
/// connection, a new connection after [`H2_REQUESTS_PER_SLOT`] requests per stream slot.
async fn h2_task(ctx: Ctx, peer: Peer, task: u64) {
    let authority = peer.door.to_string();
    let mut round = 0;
    for _ in 0..MAX_ROUNDS {
        if ctx.over() {
            break;
        }
        round += 1;
        let stream = match connect(peer, None).await {
            Ok(s) => s,
            Err(e) => {
                ctx.with("h2 connect", |k| k.connect_failed += 1);
                ctx.event("h2 connect", format!("connect: {e:#}"));
                ctx.pause(Duration::from_millis(200)).await;
                continue;
            }
        };
        let Ok((sender, conn)) = hyper::client::conn::http2::handshake::<_, _, Full<Bytes>>(
            TokioExecutor::new(),
            TokioIo::new(stream),
        )
        .await
        else {
            ctx.pause(Duration::from_millis(200)).await;
            continue;
        };
        let conn = tokio::spawn(conn);
        let mut slots = JoinSet::new();
        for slot in 0..H2_STREAMS {
            let (ctx, authority, mut sender) = (ctx.clone(), authority.clone(), sender.clone());
            let mut rng = Rng::new(task * 1000 + round * 10 + slot);
            slots.spawn(async move {
                for _ in 0..H2_REQUESTS_PER_SLOT {
                    if ctx.over() || sender.ready().await.is_err() {
                        break;
                    }
                    let p = plan(&mut rng);
                    let k = kind(true, p.route);
                    let Ok(req) = build(&p, &authority, true) else {
                        break;
                    };
                    exchange(&ctx, k, &p.expect, sender.send_request(req)).await;
                    ctx.pause(Duration::from_millis(rng.range(2, 20))).await;
                }
            });
        }
        while slots.join_next().await.is_some() {}
        drop(sender);
        let _ = timeout(Duration::from_secs(5), conn).await;
    }
}

/// Connections that each send the chunks `send` makes (one write each), wait a random `hold`
/// (ms, `lo..hi`) and hang up, one every 100 ms or so, counted under `kind` (`aborted`, or
/// `connect_failed`).
async fn hang_up_loop(
    ctx: &Ctx,
    peer: Peer,
    task: u64,
    kind: &'static str,
    hold: (u64, u64),
    mut send: impl FnMut(&mut Rng) -> Vec<Vec<u8>>,
) {
    let mut rng = Rng::new(task);
    for _ in 0..MAX_ROUNDS {
        if ctx.over() {
            break;
        }
        match connect(peer, None).await {
            Ok(mut s) => {
                for chunk in send(&mut rng) {
                    let _ = s.write_all(&chunk).await;
                }
                ctx.pause(Duration::from_millis(rng.range(hold.0, hold.1)))
                    .await;
                drop(s);
                ctx.with(kind, |k| k.aborted += 1);
            }
            Err(_) => ctx.with(kind, |k| k.connect_failed += 1),
        }
        ctx.pause(Duration::from_millis(rng.range(50, 150))).await;
    }
}

/// Half a request head, then a hang-up.
async fn abort_head_task(ctx: Ctx, peer: Peer, task: u64) {
    hang_up_loop(&ctx, peer, task, "h1 abort head", (0, 500), |rng| {
        let target = if rng.range(0, 2) == 0 {
            "/l/session/abort"
        } else {
            "/pass/abort"
        };
        vec![format!("GET {target} HTTP/1.1\r\nHost: {}\r\nUser-Ag", peer.door).into_bytes()]
    })
    .await;
}

/// A `Content-Length` of 64 KiB, 1,000 bytes of it sent, then a hang-up (HTTP/1.1), to a
/// limited route charged on failure and to the pass-through echo in turn.
async fn abort_body_task(ctx: Ctx, peer: Peer, task: u64) {
    hang_up_loop(&ctx, peer, task, "h1 abort body", (100, 600), |rng| {
        let target = if rng.range(0, 2) == 0 {
            "/webhooks/github"
        } else {
            "/echo-body"
        };
        let head = format!(
            "POST {target} HTTP/1.1\r\nHost: {}\r\nContent-Length: 65536\r\n\
             Content-Type: application/octet-stream\r\n\r\n",
            peer.door
        );
        vec![head.into_bytes(), rng.bytes(1000).to_vec()]
    })
    .await;
}

/// Whole requests to slow answers (a limited route, a webhook, a pass-through route), the
/// client hanging up while door waits for the upstream: door must abort the upstream call and
/// release the request's slot.
async fn abort_wait_task(ctx: Ctx, peer: Peer, task: u64) {
    hang_up_loop(&ctx, peer, task, "h1 abort waiting", (100, 800), |rng| {
        let request = match rng.range(0, 3) {
            0 => format!(
                "GET /l/session/wait?delay_ms=2000 HTTP/1.1\r\nHost: {}\r\n\r\n",
                peer.door
            ),
            1 => format!(
                "POST /webhooks/github?delay_ms=2000 HTTP/1.1\r\nHost: {}\r\n\
                 Content-Length: 2\r\n\r\n{{}}",
                peer.door
            ),
            _ => format!("GET /slow?ms=2000 HTTP/1.1\r\nHost: {}\r\n\r\n", peer.door),
        }
        .into_bytes();
        vec![request]
    })
    .await;
}

/// A request body fed from a channel, so that it can be broken off.
struct Fed(mpsc::Receiver<Bytes>);

impl Body for Fed {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        self.get_mut()
            .0
            .poll_recv(cx)
            .map(|c| c.map(|c| Ok(Frame::data(c))))
    }
}

/// HTTP/2 request bodies broken off: a `content-length` of 64 KiB, 1,000 bytes sent, then either
/// the stream is reset (its request and answer dropped; the connection carries on) or the whole
/// connection is dropped, in turn.
async fn h2_abort_task(ctx: Ctx, peer: Peer, task: u64) {
    let mut rng = Rng::new(task);
    let authority = peer.door.to_string();
    for _ in 0..MAX_ROUNDS {
        if ctx.over() {
            break;
        }
        let Ok(stream) = connect(peer, None).await else {
            ctx.with("h2 abort body", |k| k.connect_failed += 1);
            ctx.pause(Duration::from_millis(200)).await;
            continue;
        };
        let Ok((mut sender, conn)) = hyper::client::conn::http2::handshake::<_, _, Fed>(
            TokioExecutor::new(),
            TokioIo::new(stream),
        )
        .await
        else {
            ctx.pause(Duration::from_millis(200)).await;
            continue;
        };
        let conn = tokio::spawn(conn);
        // A few resets on this connection, then a dropped connection.
        for i in 0..4 {
            if ctx.over() || sender.ready().await.is_err() {
                break;
            }
            let (tx, rx) = mpsc::channel(4);
            let (target, whole) = match rng.range(0, 3) {
                0 => ("/webhooks/github", false),
                1 => ("/echo-body", false),
                // A whole request, reset while door waits for the upstream's answer.
                _ => ("/l/session/wait?delay_ms=2000", true),
            };
            let req = if whole {
                Request::get(format!("http://{authority}{target}")).body(Fed(rx))
            } else {
                Request::post(format!("http://{authority}{target}"))
                    .header("content-length", "65536")
                    .body(Fed(rx))
            };
            let Ok(req) = req else {
                break;
            };
            let tx = if whole {
                drop(tx);
                None
            } else {
                let _ = tx.send(rng.bytes(1000)).await;
                Some(tx)
            };
            let response = sender.send_request(req);
            // The answer's head may come (the echo answers at once) or not (the webhook reads
            // the whole body first, the slow link waits 2 s): either way, give up after a moment.
            let _ = timeout(Duration::from_millis(rng.range(100, 500)), response).await;
            drop(tx);
            let kind = if i < 3 {
                "h2 reset stream"
            } else {
                "h2 drop connection"
            };
            ctx.with(kind, |k| k.aborted += 1);
            if i == 3 {
                conn.abort();
                break;
            }
        }
        drop(sender);
        ctx.pause(Duration::from_millis(rng.range(50, 150))).await;
    }
}

/// Reads a 4 MiB answer a few bytes a second, then drops it: over HTTP/1.1 through a 4 KiB
/// receive buffer, to the pass-through stream and to a limited route in turn.
async fn slow_reader_task(ctx: Ctx, peer: Peer, task: u64) {
    let mut rng = Rng::new(task);
    let kind = "h1 slow reader";
    for _ in 0..MAX_ROUNDS {
        if ctx.over() {
            break;
        }
        let Ok(mut s) = connect(peer, Some(4096)).await else {
            ctx.with(kind, |k| k.connect_failed += 1);
            ctx.pause(Duration::from_millis(200)).await;
            continue;
        };
        let target = if rng.range(0, 2) == 0 {
            "/stream?chunks=256&chunk_bytes=16384&chunk_ms=0"
        } else {
            "/l/session/slowread?chunks=256&chunk_bytes=16384&chunk_ms=0"
        };
        let head = format!("GET {target} HTTP/1.1\r\nHost: {}\r\n\r\n", peer.door);
        if s.write_all(head.as_bytes()).await.is_err() {
            ctx.pause(Duration::from_millis(200)).await;
            continue;
        }
        let until = Instant::now() + Duration::from_secs(rng.range(4, 10));
        let mut buf = [0_u8; 8];
        let mut closed = false;
        while Instant::now() < until {
            if let Ok(Ok(0) | Err(_)) = timeout(Duration::from_secs(2), s.read(&mut buf)).await {
                closed = true;
                break;
            }
            sleep(Duration::from_millis(500)).await;
        }
        drop(s);
        ctx.with(kind, |k| {
            k.aborted += 1;
            if closed {
                k.closed_by_door += 1;
            }
        });
        ctx.pause(Duration::from_millis(rng.range(100, 300))).await;
    }
}

/// The HTTP/2 slow reader: a 16 KiB stream window, one data frame read every 500 ms, dropped
/// after a few seconds (the stream reset).
async fn h2_slow_reader_task(ctx: Ctx, peer: Peer, task: u64) {
    let mut rng = Rng::new(task);
    let kind = "h2 slow reader";
    let authority = peer.door.to_string();
    for _ in 0..MAX_ROUNDS {
        if ctx.over() {
            break;
        }
        let Ok(stream) = connect(peer, None).await else {
            ctx.with(kind, |k| k.connect_failed += 1);
            ctx.pause(Duration::from_millis(200)).await;
            continue;
        };
        let mut builder = hyper::client::conn::http2::Builder::new(TokioExecutor::new());
        builder
            .initial_stream_window_size(16 << 10)
            .initial_connection_window_size(16 << 10);
        let Ok((mut sender, conn)) = builder
            .handshake::<_, Full<Bytes>>(TokioIo::new(stream))
            .await
        else {
            ctx.pause(Duration::from_millis(200)).await;
            continue;
        };
        let conn = tokio::spawn(conn);
        let target = if rng.range(0, 2) == 0 {
            "/stream?chunks=256&chunk_bytes=16384&chunk_ms=0"
        } else {
            "/l/session/slowread?chunks=256&chunk_bytes=16384&chunk_ms=0"
        };
        let Ok(req) =
            Request::get(format!("http://{authority}{target}")).body(Full::new(Bytes::new()))
        else {
            break;
        };
        let mut closed = false;
        if let Ok(Ok(response)) = timeout(EXCHANGE_TIMEOUT, sender.send_request(req)).await {
            let mut body = response.into_body();
            let until = Instant::now() + Duration::from_secs(rng.range(4, 10));
            while Instant::now() < until {
                if let Ok(None | Some(Err(_))) = timeout(Duration::from_secs(2), body.frame()).await
                {
                    closed = true;
                    break;
                }
                sleep(Duration::from_millis(500)).await;
            }
        }
        drop(sender);
        conn.abort();
        ctx.with(kind, |k| {
            k.aborted += 1;
            if closed {
                k.closed_by_door += 1;
            }
        });
        ctx.pause(Duration::from_millis(rng.range(100, 300))).await;
    }
}

/// Slowloris heads: a request line, then a header line every 2 s, until door closes the
/// connection (or 30 s pass: not closed).
async fn slowloris_task(ctx: Ctx, peer: Peer, task: u64) {
    let mut rng = Rng::new(task);
    let kind = "h1 slowloris";
    for _ in 0..MAX_ROUNDS {
        if ctx.over() {
            break;
        }
        let Ok(mut s) = connect(peer, None).await else {
            ctx.with(kind, |k| k.connect_failed += 1);
            ctx.pause(Duration::from_millis(200)).await;
            continue;
        };
        let start = Instant::now();
        let line = format!("GET /l/session/loris HTTP/1.1\r\nHost: {}\r\n", peer.door);
        let mut closed = s.write_all(line.as_bytes()).await.is_err();
        let mut buf = [0_u8; 512];
        for n in 0..15 {
            if closed {
                break;
            }
            // Anything read (an answer door chose to send) or EOF ends it: door acted.
            if timeout(Duration::from_secs(2), s.read(&mut buf))
                .await
                .is_ok()
            {
                closed = true;
            } else {
                let more = format!("X-Loris-{n}: {}\r\n", rng.range(0, 1_000_000));
                closed = s.write_all(more.as_bytes()).await.is_err();
            }
        }
        let ms = u64::try_from(start.elapsed().as_millis()).unwrap_or(u64::MAX);
        drop(s);
        ctx.with(kind, |k| {
            k.aborted += 1;
            if closed {
                k.closed_by_door += 1;
                k.max_close_ms = k.max_close_ms.max(ms);
            } else {
                k.not_closed += 1;
            }
        });
        ctx.pause(Duration::from_millis(rng.range(100, 500))).await;
    }
}

/// Request heads of about 70 KiB (over door's 64 KiB), over HTTP/1.1 (raw) and HTTP/2 in turn,
/// to a limited and a pass-through route; each must be answered 431.
async fn oversized_task(ctx: Ctx, peer: Peer, task: u64) {
    let mut rng = Rng::new(task);
    let authority = peer.door.to_string();
    let big = "a".repeat(HEAD_LIMIT + 6 * 1024);
    let mut round = 0_u64;
    for _ in 0..MAX_ROUNDS {
        if ctx.over() {
            break;
        }
        round += 1;
        let target = if round.is_multiple_of(2) {
            "/l/session/big"
        } else {
            "/pass/big"
        };
        if round % 4 < 2 {
            oversized_h1(&ctx, peer, target, &big).await;
        } else {
            oversized_h2(&ctx, peer, &authority, target, &big).await;
        }
        ctx.pause(Duration::from_millis(rng.range(200, 600))).await;
    }
}

async fn oversized_h1(ctx: &Ctx, peer: Peer, target: &str, big: &str) {
    let kind = "h1 oversized head";
    let Ok(mut s) = connect(peer, None).await else {
        ctx.with(kind, |k| k.connect_failed += 1);
        return;
    };
    let head = format!(
        "GET {target} HTTP/1.1\r\nHost: {}\r\nX-Big: {big}\r\n\r\n",
        peer.door
    );
    let wrote = s.write_all(head.as_bytes()).await;
    ctx.with(kind, |k| k.sent += 1);
    let mut answer = Vec::new();
    let mut buf = [0_u8; 4096];
    let read = timeout(Duration::from_secs(10), async {
        loop {
            match s.read(&mut buf).await {
                Ok(0) => return Ok(()),
                Ok(n) => {
                    answer.extend_from_slice(buf.get(..n).unwrap_or_default());
                    if answer.windows(4).any(|w| w == b"\r\n\r\n") {
                        return Ok(());
                    }
                }
                Err(e) => return Err(e),
            }
        }
    })
    .await;
    let status = std::str::from_utf8(&answer)
        .ok()
        .and_then(|t| t.strip_prefix("HTTP/1.1 "))
        .and_then(|t| t.get(..3))
        .and_then(|t| t.parse::<u16>().ok());
    if let Some(code) = status {
        ctx.with(kind, |k| *k.statuses.entry(code).or_default() += 1);
        if code >= 500 {
            ctx.event(kind, code.to_string());
        }
    } else {
        ctx.with(kind, |k| k.lost += 1);
        ctx.event(
            kind,
            format!("lost: no status line (write {wrote:?}, read {read:?})"),
        );
    }
}

async fn oversized_h2(ctx: &Ctx, peer: Peer, authority: &str, target: &str, big: &str) {
    let kind = "h2 oversized head";
    let Ok(stream) = connect(peer, None).await else {
        ctx.with(kind, |k| k.connect_failed += 1);
        return;
    };
    let Ok((mut sender, conn)) = hyper::client::conn::http2::handshake::<_, _, Full<Bytes>>(
        TokioExecutor::new(),
        TokioIo::new(stream),
    )
    .await
    else {
        return;
    };
    let conn = tokio::spawn(conn);
    if sender.ready().await.is_ok()
        && let Ok(req) = Request::get(format!("http://{authority}{target}"))
            .header("x-big", big)
            .body(Full::new(Bytes::new()))
    {
        exchange(ctx, kind, &Expect::Any, sender.send_request(req)).await;
    }
    drop(sender);
    let _ = timeout(Duration::from_secs(5), conn).await;
}

/// Prints `soak-client: progress {…}` every second until the deadline.
async fn progress(ctx: Ctx, start: Instant) {
    for _ in 0..MAX_ROUNDS {
        if ctx.over() {
            break;
        }
        ctx.pause(Duration::from_secs(1)).await;
        let (sent, answered, aborted) = {
            let stats = ctx.stats.lock().unwrap_or_else(PoisonError::into_inner);
            stats.kinds.values().fold((0, 0, 0), |(s, a, b), k| {
                (
                    s + k.sent,
                    a + k.statuses.values().sum::<u64>(),
                    b + k.aborted,
                )
            })
        };
        println!(
            "soak-client: progress {}",
            json!({
                "elapsed_s": start.elapsed().as_secs(),
                "sent": sent,
                "answered": answered,
                "aborted": aborted,
            })
        );
    }
}

async fn run(args: Args) -> anyhow::Result<()> {
    let start = Instant::now();
    let ctx = Ctx {
        stats: Arc::default(),
        end: start + Duration::from_secs(args.seconds),
    };
    let peers: Vec<Peer> = args
        .sources
        .iter()
        .map(|&source| Peer {
            source,
            door: if source.is_ipv4() {
                args.door
            } else {
                args.door6
            },
        })
        .collect();
    let mut n = 0_u64;
    let mut next_peer = || {
        let p = peers
            .get(usize::try_from(n).unwrap_or(0) % peers.len())
            .copied();
        n += 1;
        p.map(|p| (p, n))
    };
    let mut tasks = JoinSet::new();
    let plan: [(usize, Task); 10] = [
        (6, |c, p, t| Box::pin(h1_task(c, p, t))),
        (3, |c, p, t| Box::pin(h2_task(c, p, t))),
        (1, |c, p, t| Box::pin(abort_head_task(c, p, t))),
        (1, |c, p, t| Box::pin(abort_body_task(c, p, t))),
        (1, |c, p, t| Box::pin(abort_wait_task(c, p, t))),
        (1, |c, p, t| Box::pin(h2_abort_task(c, p, t))),
        (1, |c, p, t| Box::pin(slow_reader_task(c, p, t))),
        (1, |c, p, t| Box::pin(h2_slow_reader_task(c, p, t))),
        (2, |c, p, t| Box::pin(slowloris_task(c, p, t))),
        (1, |c, p, t| Box::pin(oversized_task(c, p, t))),
    ];
    for (count, f) in plan {
        for _ in 0..count {
            if let Some((p, t)) = next_peer() {
                tasks.spawn(f(ctx.clone(), p, t));
            }
        }
    }
    tasks.spawn(progress(ctx.clone(), start));
    // Every task stops starting new work at the deadline; what it is doing is bounded by
    // EXCHANGE_TIMEOUT (and a slowloris by 30 s).
    let grace = Instant::now() + Duration::from_secs(args.seconds) + Duration::from_secs(45);
    let mut unfinished = 0;
    loop {
        match tokio::time::timeout_at(grace, tasks.join_next()).await {
            Ok(Some(_)) => {}
            Ok(None) => break,
            Err(_) => {
                unfinished = tasks.len();
                tasks.abort_all();
                break;
            }
        }
    }
    let stats = ctx.stats.lock().unwrap_or_else(PoisonError::into_inner);
    println!("soak-client: report {}", report(&stats, unfinished));
    Ok(())
}

fn report(stats: &Stats, unfinished: usize) -> Value {
    let kinds: serde_json::Map<String, Value> = stats
        .kinds
        .iter()
        .map(|(name, k)| {
            let statuses: serde_json::Map<String, Value> = k
                .statuses
                .iter()
                .map(|(s, n)| (s.to_string(), json!(n)))
                .collect();
            (
                (*name).to_owned(),
                json!({
                    "sent": k.sent,
                    "statuses": statuses,
                    "cut": k.cut,
                    "lost": k.lost,
                    "mismatch": k.mismatch,
                    "not_sent": k.not_sent,
                    "aborted": k.aborted,
                    "connect_failed": k.connect_failed,
                    "closed_by_door": k.closed_by_door,
                    "max_close_ms": k.max_close_ms,
                    "not_closed": k.not_closed,
                }),
            )
        })
        .collect();
    let events: Vec<Value> = stats
        .events
        .iter()
        .map(|(t, kind, what)| json!([t, kind, what]))
        .collect();
    json!({
        "kinds": kinds,
        "events": events,
        "events_dropped": stats.events_dropped,
        "unfinished_tasks": unfinished,
    })
}
