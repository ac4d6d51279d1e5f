//! The listeners (docs/design.md, "Connections and deadlines" and "Operating contract"): the
//! accept loops, the connection limits decided at accept, the PROXY protocol header, the TLS
//! handshake, the worker threads connections are served on, and serving HTTP/1.1 and HTTP/2 (h2c
//! on cleartext listeners, ALPN `h2` / `http/1.1` under TLS) with the header bounds below and the
//! connection's idle watch, each request handed to [`App::handle`]; the SIGTERM drain's closing
//! of the connections.
//!
//! Connection limits (RFC 9110 §15.5.20 / RFC 6585 §5 for 431; RFC 9113 §6.5.2 for
//! `SETTINGS_MAX_HEADER_LIST_SIZE`):
//!
//! - HTTP/1.1: hyper reads the request head into a buffer of at most [`MAX_HEADER_BYTES`]
//!   (request line, fields and their CRLFs); a head that does not fit, or has more than
//!   [`Config::max_header_fields`] fields (default 100), gets 431 and the connection is closed.
//! - HTTP/2: door advertises `SETTINGS_MAX_HEADER_LIST_SIZE = MAX_HEADER_BYTES`. h2 sums the
//!   decoded fields as RFC 9113 §6.5.2 does (name + value + 32 octets each, pseudo-fields
//!   included); a list of `MAX_HEADER_BYTES` or more gets a 431 on that stream (the connection
//!   lives on); past four times the limit h2 stops decoding and ends the connection with GOAWAY
//!   `ENHANCE_YOUR_CALM`. A field literal longer than the HPACK decoder's buffer is a
//!   `COMPRESSION_ERROR` (RFC 7541 §4.2).

use std::{
    convert::Infallible,
    net::SocketAddr,
    sync::{
        Arc, Mutex, PoisonError, RwLock,
        atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering},
    },
    time::Duration,
};

use hyper_util::{
    rt::{TokioExecutor, TokioIo, TokioTimer},
    server::conn::auto,
};
use tokio::{
    io::{AsyncRead, AsyncWrite},
    net::{TcpListener, TcpStream},
    sync::watch,
    task::JoinSet,
};
use tokio_rustls::TlsAcceptor;

use crate::{
    config::{Config, DEFAULT_MAX_HEADER_FIELDS, TlsConfig},
    http::{
        conn::ConnInfo,
        conn_limit::{ConnLimits, ConnSlot, Refusal},
        idle::serve_watched,
        preface::PrefaceWatch,
        request::App,
        tls::TlsError,
    },
    obs::{logging::RateLimitedWarn, metrics::TlsFailure},
};

/// The request-head bound, bytes: 64 KiB on both protocols (docs/design.md, "Limits",
/// "Connections and deadlines").
pub const MAX_HEADER_BYTES: usize = 64 << 10;

/// HTTP/2 streams a client may have open at once (`SETTINGS_MAX_CONCURRENT_STREAMS`, RFC 9113
/// §6.5.2): 250, the default of Go's HTTP/2 server (`golang.org/x/net/http2`).
pub const MAX_CONCURRENT_STREAMS: u32 = 250;

/// Connection settings shared by every listener.
#[derive(Debug, Clone, Copy)]
pub struct ConnSettings {
    /// Request head timeout: every HTTP/1.1 head, the TLS handshake, and a connection's first
    /// head in either protocol (all counted by the connection's watch, `http/idle.rs`).
    pub header_read_timeout: Duration,
    /// A connection with no request in flight for this long, after its first request, is closed
    /// (HTTP/1.1 at `header_read_timeout` when that is shorter).
    pub idle_timeout: Duration,
    /// Client connections served at once ([`Config::effective_max_connections`]).
    pub max_connections: u32,
    /// Client connections one peer may have open at once.
    pub max_connections_per_client: u32,
    /// Header fields an HTTP/1.1 request head may have ([`Config::max_header_fields`]).
    pub max_header_fields: usize,
}

impl ConnSettings {
    /// The settings of `config`.
    pub fn from_config(config: &Config) -> Self {
        Self {
            header_read_timeout: config.header_read_timeout,
            idle_timeout: config.idle_timeout,
            max_connections: config.effective_max_connections(),
            max_connections_per_client: config.max_connections_per_client,
            max_header_fields: config.max_header_fields,
        }
    }

    fn builder(self) -> auto::Builder<TokioExecutor> {
        let mut b = auto::Builder::new(TokioExecutor::new());
        // No timer for HTTP/1.1: every head's deadline is the connection's watch's
        // (`http/idle.rs`), one timer per connection instead of one per request head.
        b.http1()
            .header_read_timeout(None)
            .max_buf_size(MAX_HEADER_BYTES);
        // hyper's own limit, the default, is 100 fields parsed into arrays on its stack; any
        // limit set, even 100, makes it build and fill two arrays of that many entries for every
        // request head (hyper's `Server::parse`: `smallvec!` instead of `smallvec_inline!`).
        if self.max_header_fields != DEFAULT_MAX_HEADER_FIELDS {
            b.http1().max_headers(self.max_header_fields);
        }
        // hyper's flow-control windows (1 MiB per stream and per connection, not adaptive) and
        // one listening socket per address: both measured against the alternatives
        // (docs/decisions.md, "Accept, upstream pool and HTTP/2 windows").
        b.http2()
            .timer(TokioTimer::new())
            .max_header_list_size(u32::try_from(MAX_HEADER_BYTES).unwrap_or(u32::MAX))
            .max_concurrent_streams(MAX_CONCURRENT_STREAMS)
            // WebSockets over HTTP/2 (RFC 8441 §3: SETTINGS_ENABLE_CONNECT_PROTOCOL = 1).
            .enable_connect_protocol();
        b
    }
}

/// The TLS acceptor shared by a front's accept loops (`None`: cleartext).
type Tls = Arc<RwLock<Option<TlsAcceptor>>>;

/// The threads a [`Front`] serves connections on when built with [`Front::with_workers`]: each
/// runs a single-threaded tokio runtime and serves the connections the accept loop hands it to
/// their end, so a request never moves between threads (docs/decisions.md, "Serving: a
/// single-threaded runtime per core").
struct Workers {
    handles: Arc<[tokio::runtime::Handle]>,
    /// Connections handed out so far, by every listener: the next goes to this modulo the
    /// workers' count.
    handed: Arc<AtomicUsize>,
    /// Per worker: the last ping sent to it and the last one it answered ([`Workers::alive`]).
    pings: Arc<[Ping]>,
    /// Dropped with the front: each worker thread then returns, dropping its runtime.
    _stop: Vec<tokio::sync::oneshot::Sender<()>>,
}

/// One worker's liveness probe: numbered pings, each answered by a task on the worker.
#[derive(Debug, Default)]
struct Ping {
    sent: AtomicU64,
    answered: AtomicU64,
}

impl Workers {
    /// Starts `n` worker threads (at least 1).
    ///
    /// # Errors
    /// The I/O error of a runtime or thread that could not be started.
    fn start(n: usize) -> std::io::Result<Self> {
        let n = n.max(1);
        let mut handles = Vec::new();
        let mut stop = Vec::new();
        for i in 0..n {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            handles.push(runtime.handle().clone());
            let (tx, rx) = tokio::sync::oneshot::channel::<()>();
            stop.push(tx);
            std::thread::Builder::new()
                .name(format!("door-worker-{i}"))
                .spawn(move || {
                    crate::http::worker::set(i);
                    // Returns when the front drops its sender; the runtime's tasks go with it.
                    let _ = runtime.block_on(rx);
                })?;
        }
        Ok(Self {
            handles: handles.into(),
            handed: Arc::new(AtomicUsize::new(0)),
            pings: (0..n).map(|_| Ping::default()).collect(),
            _stop: stop,
        })
    }

    /// Whether every worker answered the last ping it was sent; sends each worker that did a
    /// new one (a task that records its number). A worker that has not run that task since the
    /// previous call is wedged (a task that blocks or spins without yielding holds its whole
    /// runtime) or too busy to run a trivial task within a watchdog period: `false`.
    fn alive(&self) -> bool {
        let mut all = true;
        for (i, (handle, ping)) in self.handles.iter().zip(self.pings.iter()).enumerate() {
            let sent = ping.sent.load(Ordering::Acquire);
            if ping.answered.load(Ordering::Acquire) < sent {
                all = false;
                continue;
            }
            let next = sent + 1;
            ping.sent.store(next, Ordering::Release);
            let pings = Arc::clone(&self.pings);
            handle.spawn(async move {
                if let Some(p) = pings.get(i) {
                    p.answered.store(next, Ordering::Release);
                }
            });
        }
        all
    }
}

/// door's listeners and their connections: serves, and drains on request.
pub struct Front {
    app: Arc<App>,
    settings: ConnSettings,
    builder: Arc<auto::Builder<TokioExecutor>>,
    /// The TLS acceptor new connections use; [`Front::reload_tls`] swaps it (a certificate renewal
    /// reloaded with SIGHUP) without touching open connections.
    tls: Tls,
    stop: watch::Sender<bool>,
    loops: Mutex<JoinSet<()>>,
    connections: Arc<Mutex<JoinSet<()>>>,
    limits: Arc<ConnLimits>,
    /// Set when an accept loop ended before the drain (its listener is gone).
    loop_died: AtomicBool,
    /// The worker threads ([`Front::with_workers`]); `None`: connections are served on the
    /// runtime that called [`Front::serve`].
    workers: Option<Workers>,
}

impl Front {
    /// Whether every accept loop is still running and every worker thread is alive. An accept
    /// loop only ends at the drain, so one that ended before means a listener stopped serving; a
    /// worker that has not answered the ping the previous call sent it is wedged. Either way
    /// the watchdog (which calls this once per period) should notice.
    pub fn accepting(&self) -> bool {
        let mut loops = lock(&self.loops);
        while loops.try_join_next().is_some() {
            self.loop_died.store(true, Ordering::Release);
        }
        !self.loop_died.load(Ordering::Acquire)
            && !loops.is_empty()
            && self.workers.as_ref().is_none_or(Workers::alive)
    }

    /// A front for `app`; `tls` (from [`crate::http::tls::load`]) terminates TLS on every listener.
    pub fn new(
        app: Arc<App>,
        settings: ConnSettings,
        tls: Option<Arc<rustls::ServerConfig>>,
    ) -> Self {
        Self {
            app,
            settings,
            builder: Arc::new(settings.builder()),
            tls: Arc::new(RwLock::new(tls.map(TlsAcceptor::from))),
            stop: watch::channel(false).0,
            loops: Mutex::new(JoinSet::new()),
            connections: Arc::new(Mutex::new(JoinSet::new())),
            limits: ConnLimits::new(
                settings.max_connections,
                settings.max_connections_per_client,
            ),
            loop_died: AtomicBool::new(false),
            workers: None,
        }
    }

    /// As [`Front::new`], serving on `workers` threads of its own, each with a single-threaded
    /// runtime (what a running door uses: one per core).
    ///
    /// # Errors
    /// The I/O error of a worker thread or runtime that could not be started.
    pub fn with_workers(
        app: Arc<App>,
        settings: ConnSettings,
        tls: Option<Arc<rustls::ServerConfig>>,
        workers: usize,
    ) -> std::io::Result<Self> {
        Ok(Self {
            workers: Some(Workers::start(workers)?),
            ..Self::new(app, settings, tls)
        })
    }

    /// Re-reads the TLS certificate and key of `config` (a renewal reloaded with SIGHUP): new
    /// handshakes from now on get the new pair, connections already open keep theirs. A cleartext
    /// front is left alone (turning TLS on or off needs a restart).
    ///
    /// # Errors
    /// [`TlsError`] when the new pair cannot be used; the running one is kept.
    pub fn reload_tls(&self, config: &TlsConfig) -> Result<(), TlsError> {
        let server = crate::http::tls::load(config)?;
        let mut tls = self.tls.write().unwrap_or_else(PoisonError::into_inner);
        if tls.is_some() {
            *tls = Some(TlsAcceptor::from(server));
        }
        Ok(())
    }

    /// The request path.
    pub fn app(&self) -> &Arc<App> {
        &self.app
    }

    /// Client connections open now, against `max_connections`.
    pub fn connections_open(&self) -> u32 {
        self.limits.open()
    }

    /// Serves `listener` until [`Front::drain`]; with `proxy_protocol`, every connection must
    /// start with a PROXY protocol header from a trusted proxy.
    ///
    /// The accept loop runs on the calling runtime. With workers ([`Front::with_workers`]), it
    /// hands each accepted connection to the next worker in turn (round robin, as actix-server's
    /// acceptor does), which serves it to its end.
    pub fn serve(&self, listener: TcpListener, proxy_protocol: bool) {
        lock(&self.loops).spawn(accept_loop(listener, self.accept(proxy_protocol)));
    }

    /// What an accept loop of this front shares with it.
    fn accept(&self, proxy_protocol: bool) -> Accept {
        Accept {
            app: Arc::clone(&self.app),
            settings: self.settings,
            builder: Arc::clone(&self.builder),
            tls: Arc::clone(&self.tls),
            stop: self.stop.subscribe(),
            connections: Arc::clone(&self.connections),
            limits: Arc::clone(&self.limits),
            proxy_protocol,
            workers: self
                .workers
                .as_ref()
                .map(|w| (Arc::clone(&w.handles), Arc::clone(&w.handed))),
        }
    }

    /// Drains (docs/design.md, "Operating contract"): health turns 503 at once, the listeners are
    /// closed (new connections are refused), in-flight requests get `grace` to finish, then every
    /// connection is shut down gracefully (HTTP/2 GOAWAY; HTTP/1.1 closed once idle) and, after
    /// at most the rest of the grace period, dropped. `true` when everything finished in time.
    pub async fn drain(&self, grace: Duration) -> bool {
        let start = crate::time::now();
        self.app.begin_drain();
        let mut loops = std::mem::take(&mut *lock(&self.loops));
        loops.abort_all();
        while loops.join_next().await.is_some() {}
        let finished = self.app.wait_idle(grace).await;
        let _ = self.stop.send(true);
        let mut conns = std::mem::take(&mut *lock(&self.connections));
        let left = grace
            .saturating_sub(start.elapsed())
            .max(Duration::from_millis(100));
        let closed =
            tokio::time::timeout(left, async { while conns.join_next().await.is_some() {} })
                .await
                .is_ok();
        conns.abort_all();
        self.app.close_streams();
        finished && closed
    }
}

impl std::fmt::Debug for Front {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Front")
            .field("settings", &self.settings)
            .field(
                "tls",
                &self
                    .tls
                    .read()
                    .unwrap_or_else(PoisonError::into_inner)
                    .is_some(),
            )
            .finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// An accept loop's share of its [`Front`]: the request path, the connection settings and
/// builder, the TLS acceptor, the drain signal, the connection set and the connection limits.
struct Accept {
    app: Arc<App>,
    settings: ConnSettings,
    builder: Arc<auto::Builder<TokioExecutor>>,
    tls: Tls,
    stop: watch::Receiver<bool>,
    connections: Arc<Mutex<JoinSet<()>>>,
    limits: Arc<ConnLimits>,
    /// Every connection must start with a PROXY protocol header from a trusted proxy.
    proxy_protocol: bool,
    /// The workers connections are handed to, in turn, and the count of connections handed out
    /// by every listener; `None`: served on the accept loop's runtime.
    workers: Option<(Arc<[tokio::runtime::Handle]>, Arc<AtomicUsize>)>,
}

/// `TCP_NOTSENT_LOWAT` on client connections, bytes: the socket takes more of a response only
/// once less than this is waiting to be sent, where it would wait until a third of a send buffer
/// of megabytes had drained. A client reading slowly then takes bytes from door every
/// 128 KiB, often enough that a response watched for moving nothing sees it read
/// (`crate::http::body`), and little of a response sits in the kernel unsent (Linux 3.12;
/// Cloudflare sets it for HTTP/2 prioritisation: "Optimizing HTTP/2 prioritization with BBR
/// and tcp_notsent_lowat", 2018).
const CLIENT_NOTSENT_LOWAT: u32 = 128 * 1024;

async fn accept_loop(listener: TcpListener, accept: Accept) {
    let Accept {
        app,
        settings,
        builder,
        tls,
        stop,
        connections,
        limits,
        proxy_protocol,
        workers,
    } = accept;
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(a) => a,
            Err(e) => {
                static ACCEPT_FAILED: RateLimitedWarn =
                    RateLimitedWarn::new(Duration::from_secs(10));
                accept_failed(&ACCEPT_FAILED, "client", &e).await;
                continue;
            }
        };
        let peer_ip = crate::client::key::canonical(peer.ip());
        let exempt = app.policy().trusted.contains(peer_ip);
        let slot = match limits.admit(peer_ip, exempt) {
            Ok(slot) => slot,
            Err(refusal) => {
                refused(&app, refusal, peer);
                drop(stream);
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let _ = socket2::SockRef::from(&stream).set_tcp_notsent_lowat(CLIENT_NOTSENT_LOWAT);
        let conn = Connection {
            peer,
            slot,
            proxy_protocol,
            app: Arc::clone(&app),
            settings,
            builder: Arc::clone(&builder),
            tls: tls.read().unwrap_or_else(PoisonError::into_inner).clone(),
            stop: stop.clone(),
        };
        let Some((handles, handed)) = &workers else {
            spawn_connection(&connections, None, connection(stream, conn));
            continue;
        };
        // Handed over: deregistered from this runtime's reactor, registered with the worker's.
        let stream = match stream.into_std() {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, %peer, "a connection could not be handed to a worker");
                continue;
            }
        };
        let turn = handed.fetch_add(1, Ordering::Relaxed);
        let handle = handles.get(turn % handles.len().max(1));
        spawn_connection(&connections, handle, async move {
            match TcpStream::from_std(stream) {
                Ok(stream) => connection(stream, conn).await,
                Err(e) => tracing::warn!(error = %e, %peer, "a worker could not take a connection"),
            }
        });
    }
}

/// After a failed accept on the `listener` (`client` or `admin`): warns at most once per `warn`'s
/// interval (out of file descriptors repeats on every accept), then pauses 10 ms (EMFILE and
/// friends: back off instead of spinning).
pub(crate) async fn accept_failed(warn: &RateLimitedWarn, listener: &str, e: &std::io::Error) {
    if let Some(suppressed) = warn.due() {
        tracing::warn!(
            error = %e, listener, suppressed,
            "accept failed (at most one line per 10 s for client listeners, and for the admin one)"
        );
    }
    tokio::time::sleep(Duration::from_millis(10)).await;
}

/// Adds a connection's task to the front's set, on `worker` (the accept loop's runtime when
/// `None`), reaping finished ones first so the set does not grow with every connection served.
fn spawn_connection(
    connections: &Mutex<JoinSet<()>>,
    worker: Option<&tokio::runtime::Handle>,
    task: impl Future<Output = ()> + Send + 'static,
) {
    let mut set = lock(connections);
    while set.try_join_next().is_some() {}
    match worker {
        Some(handle) => set.spawn_on(task, handle),
        None => set.spawn(task),
    };
}

/// Counts and (at most once a minute per reason) logs a connection refused at accept.
fn refused(app: &App, refusal: Refusal, peer: SocketAddr) {
    static TOTAL: RateLimitedWarn = RateLimitedWarn::new(Duration::from_mins(1));
    static PER_CLIENT: RateLimitedWarn = RateLimitedWarn::new(Duration::from_mins(1));
    app.metrics.connection_refused(refusal.as_str());
    let warn = match refusal {
        Refusal::MaxConnections => &TOTAL,
        Refusal::MaxConnectionsPerClient => &PER_CLIENT,
    };
    if let Some(suppressed) = warn.due() {
        tracing::warn!(
            %peer, limit = refusal.as_str(), suppressed,
            "connection refused at accept (counted in door.connections_refused; at most one line a minute)"
        );
    }
}

/// One accepted connection's inputs: its peer and its slot, whether it starts with a PROXY
/// protocol header, the request path, the connection settings and builder, the TLS acceptor in
/// force when it was accepted, and the drain signal.
struct Connection {
    peer: SocketAddr,
    /// Its slot against the connection limits, handed to its [`ConnInfo`].
    slot: ConnSlot,
    proxy_protocol: bool,
    app: Arc<App>,
    settings: ConnSettings,
    builder: Arc<auto::Builder<TokioExecutor>>,
    tls: Option<TlsAcceptor>,
    stop: watch::Receiver<bool>,
}

async fn connection(mut stream: TcpStream, conn: Connection) {
    let Connection {
        peer,
        mut slot,
        proxy_protocol,
        app,
        settings,
        builder,
        tls,
        stop,
    } = conn;
    // PROXY protocol listener: the header, read before any TLS, names the peer.
    let (peer, unnamed) = if proxy_protocol {
        let policy = app.policy();
        let accepted = crate::client::proxy_protocol::accept_or_reject(
            &mut stream,
            peer,
            &policy.trusted,
            &app.metrics,
        );
        let Some(accepted) = accepted.await else {
            return;
        };
        // The named client, not the proxy, holds the per-client caps.
        let ip = crate::client::key::canonical(accepted.peer.ip());
        if let Err(refusal) = slot.rekey(ip, policy.trusted.contains(ip)) {
            refused(&app, refusal, accepted.peer);
            return;
        }
        (accepted.peer, !accepted.named)
    } else {
        (peer, false)
    };
    match tls {
        None => {
            let info = Arc::new(ConnInfo {
                proxied: proxy_protocol,
                unnamed,
                slot: Some(slot),
                ..ConnInfo::new(peer, false)
            });
            // Cleartext: the HTTP/2 preface, not ALPN, says whether the client speaks h2c.
            let stream = PrefaceWatch::new(stream, Arc::clone(&info));
            serve_io(stream, info, app, settings, &builder, stop).await;
        }
        Some(acceptor) => {
            let handshake =
                tokio::time::timeout(settings.header_read_timeout, acceptor.accept(stream)).await;
            match handshake {
                Ok(Ok(tls_stream)) => {
                    let info = Arc::new(ConnInfo {
                        proxied: proxy_protocol,
                        unnamed,
                        slot: Some(slot),
                        ..ConnInfo::new(peer, true)
                    });
                    let h2 = tls_stream.get_ref().1.alpn_protocol() == Some(b"h2".as_slice());
                    info.activity.negotiated(h2);
                    serve_io(tls_stream, info, app, settings, &builder, stop).await;
                }
                Ok(Err(e)) => {
                    app.metrics.tls_handshake_failed(TlsFailure::Error);
                    tracing::debug!(%peer, error = %e, "TLS handshake failed");
                }
                Err(_) => {
                    app.metrics.tls_handshake_failed(TlsFailure::Timeout);
                    tracing::debug!(%peer, "TLS handshake timed out");
                }
            }
        }
    }
}

async fn serve_io<I>(
    io: I,
    info: Arc<ConnInfo>,
    app: Arc<App>,
    settings: ConnSettings,
    builder: &auto::Builder<TokioExecutor>,
    mut stop: watch::Receiver<bool>,
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let peer = info.peer;
    let conn_info = Arc::clone(&info);
    // The request's future is boxed where it is made: hyper moves the service's future into
    // its dispatcher, and for HTTP/2 into a task of its own, and each move copies it whole
    // (docs/decisions.md, "A request's future on the heap").
    let service = hyper::service::service_fn(move |req| {
        let handled = Box::pin(Arc::clone(&app).handle(Arc::clone(&conn_info), req));
        async move { Ok::<_, Infallible>(handled.await) }
    });
    let conn = builder.serve_connection_with_upgrades(TokioIo::new(io), service);
    tokio::pin!(conn);
    // The first head of a connection, in either protocol, is due within the header read timeout
    // from the end of the TLS handshake or the PROXY protocol header (when `info` was made): a
    // client that sends nothing, or only part of the HTTP/2 preface, holds a slot no longer than
    // a slow HTTP/1.1 head would; one that sent the preface (or chose `h2` by ALPN) and then no
    // request gets a GOAWAY then, and is dropped if it is still there the timeout after.
    let stop = async move {
        let _ = stop.changed().await;
    };
    serve_watched(
        conn,
        &info.activity,
        settings.header_read_timeout,
        settings.idle_timeout,
        stop,
        auto::UpgradeableConnection::graceful_shutdown,
        peer,
    )
    .await;
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc;

    use super::*;

    /// Spins (bounded, yielding the CPU) until `f` holds: for work another thread does.
    fn until(what: &str, f: impl Fn() -> bool) {
        for _ in 0..50_000_000_u64 {
            if f() {
                return;
            }
            std::thread::yield_now();
        }
        panic!("never: {what}");
    }

    fn answered(w: &Workers, i: usize) -> u64 {
        w.pings
            .get(i)
            .map_or(0, |p| p.answered.load(Ordering::Acquire))
    }

    #[test]
    fn a_wedged_worker_stops_answering_and_comes_back() {
        let w = Workers::start(2).unwrap();
        assert!(w.alive(), "nothing sent yet");
        until("both answer ping 1", || {
            answered(&w, 0) == 1 && answered(&w, 1) == 1
        });
        // Worker 1 runs a task that blocks its thread until the test lets it go.
        let (started_tx, started) = mpsc::channel();
        let (release, released) = mpsc::channel::<()>();
        w.handles[1].spawn(async move {
            let _ = started_tx.send(());
            let _ = released.recv();
        });
        started.recv().unwrap();
        assert!(w.alive(), "ping 1 was answered by both; ping 2 goes out");
        until("worker 0 answers ping 2", || answered(&w, 0) == 2);
        assert!(!w.alive(), "worker 1 cannot answer ping 2");
        assert_eq!(answered(&w, 1), 1);
        release.send(()).unwrap();
        until("worker 1 answers ping 2", || answered(&w, 1) == 2);
        until("worker 0 answers ping 3", || {
            w.alive() && answered(&w, 0) >= 2
        });
    }
}
