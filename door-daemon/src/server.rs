//! The request path and the daemon's lifecycle (../shared/DESIGN.md, "Limits" and "Operating
//! contract"): listeners serving HTTP/1.1 and HTTP/2 (h2c on cleartext listeners, ALPN `h2` /
//! `http/1.1` under TLS), route matching, admission by the group's limiter, forwarding with the
//! body read deadline and the upstream timeout, the 408/429/431/502/503/504 answers, the
//! `RateLimit-Policy` / `RateLimit` fields, cached health, and the SIGTERM drain.
//!
//! Connection limits (RFC 9110 §15.5.20 / RFC 6585 §5 for 431; RFC 9113 §6.5.2 for
//! `SETTINGS_MAX_HEADER_LIST_SIZE`):
//!
//! - HTTP/1.1: hyper reads the request head into a buffer of at most [`MAX_HEADER_BYTES`]
//!   (request line, fields and their CRLFs); a head that does not fit, or has more than
//!   [`MAX_HEADER_FIELDS`] fields, gets 431 and the connection is closed.
//! - HTTP/2: door advertises `SETTINGS_MAX_HEADER_LIST_SIZE = MAX_HEADER_BYTES`. h2 sums the
//!   decoded fields as RFC 9113 §6.5.2 does (name + value + 32 octets each, pseudo-fields
//!   included); a list of `MAX_HEADER_BYTES` or more gets a 431 on that stream (the connection
//!   lives on); past four times the limit h2 stops decoding and ends the connection with GOAWAY
//!   `ENHANCE_YOUR_CALM`. A field literal longer than the HPACK decoder's buffer is a
//!   `COMPRESSION_ERROR` (RFC 7541 §4.2).

use std::{
    collections::HashMap,
    convert::Infallible,
    net::SocketAddr,
    pin::Pin,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering},
    },
    task::{Context, Poll},
    time::Duration,
};

use bytes::Bytes;
use http::{HeaderName, HeaderValue, Method, Request, Response, StatusCode, Version, header};
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use hyper_util::{
    rt::{TokioExecutor, TokioIo, TokioTimer},
    server::conn::auto,
};
use thiserror::Error;
use tokio::{
    io::{AsyncRead, AsyncWrite},
    net::{TcpListener, TcpStream},
    sync::{Notify, oneshot, watch},
    task::JoinSet,
    time::Instant,
};
use tokio_rustls::TlsAcceptor;

use crate::{
    clock::{Clock, MonotonicClock},
    config::{Config, XdpMode},
    escalate::{Blocklist, Escalator, KeySource},
    health::{CachedHealth, HEALTH_TTL},
    key::{self, ForwardedSource, TrustedProxies},
    limit::{GroupLimiter, Permit, Rejection},
    logging::RateLimitedWarn,
    metrics::{Metrics, Outcome},
    proxy::{BodyEvent, Origin, Proxy, UpstreamBody, prepare},
    route::Router,
    status::StatusSource,
    tls::TlsError,
    xdp::{Shield, ShieldError},
};

/// The request-head bound, bytes: 64 KiB on both protocols (DESIGN.md, "Limits"; the seed's
/// `MaxHeaderBytes = 64 << 10`).
pub const MAX_HEADER_BYTES: usize = 64 << 10;

/// HTTP/1.1 request fields door parses at most (hyper's default is 100). Raised so that the byte
/// bound, not the count, is what binds for requests whose fields average 64 bytes or more; hyper
/// allocates 64 bytes of parse state per allowed field for each request head.
pub const MAX_HEADER_FIELDS: usize = 1024;

/// HTTP/2 streams a client may have open at once (`SETTINGS_MAX_CONCURRENT_STREAMS`, RFC 9113
/// §6.5.2), as the seed's Go server.
pub const MAX_CONCURRENT_STREAMS: u32 = 250;

/// The name of the group whose over-budget requests are answered from the health cache.
pub const HEALTH_GROUP: &str = "health";

/// `RateLimit-Policy` (draft-ietf-httpapi-ratelimit-headers-10).
pub static RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
/// `RateLimit` (draft-ietf-httpapi-ratelimit-headers-10).
pub static RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
/// `Cache-Status` (RFC 9211), set on health answers served from the cache.
pub static CACHE_STATUS: HeaderName = HeaderName::from_static("cache-status");

/// Start-up failures.
#[derive(Debug, Error)]
pub enum ServeError {
    /// A listener could not be bound.
    #[error("binding {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The OS error.
        source: std::io::Error,
    },
    /// The XDP program could not be attached in a strict mode (`driver`, `skb`).
    #[error("xdp.mode = {mode:?}: {source}")]
    Xdp {
        /// The configured mode.
        mode: &'static str,
        /// Why.
        source: ShieldError,
    },
    /// The TLS certificate or key cannot be used (checked before anything is bound).
    #[error(transparent)]
    Tls(#[from] TlsError),
}

/// One limited group on the request path.
#[derive(Debug)]
struct Limited {
    limiter: Arc<GroupLimiter>,
    read_timeout: Duration,
    /// The precomputed `RateLimit-Policy` value; `None` when the fields are off (or the group
    /// name cannot be a structured-field string).
    policy: Option<HeaderValue>,
    /// The group name as a structured-field string (`"link"`), for `RateLimit`.
    sf_name: String,
    health: bool,
}

/// Requests door is answering, door-wide: the drain waits for this to reach zero.
#[derive(Debug, Default)]
struct Active {
    count: AtomicUsize,
    zero: Notify,
}

/// Per-connection state: where it comes from and when it last had a request in flight.
#[derive(Debug)]
pub struct ConnInfo {
    peer: SocketAddr,
    tls: bool,
    /// The peer address came from a PROXY protocol header sent by a trusted proxy.
    proxied: bool,
    origin: Instant,
    active: AtomicUsize,
    /// Nanoseconds after `origin` of the last request start or end.
    last_ns: AtomicU64,
}

impl ConnInfo {
    /// A connection from `peer`; `tls` when door terminated TLS on it.
    pub fn new(peer: SocketAddr, tls: bool) -> Self {
        Self {
            peer,
            tls,
            proxied: false,
            origin: Instant::now(),
            active: AtomicUsize::new(0),
            last_ns: AtomicU64::new(0),
        }
    }

    fn touch(&self) {
        let ns = u64::try_from(self.origin.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.last_ns.store(ns, Ordering::Release);
    }

    /// When the connection becomes idle-expired if nothing happens: `None` while a request is in
    /// flight.
    fn idle_deadline(&self, idle: Duration) -> Option<Instant> {
        if self.active.load(Ordering::Acquire) > 0 {
            return None;
        }
        let last = Duration::from_nanos(self.last_ns.load(Ordering::Acquire));
        Some(self.origin + last + idle)
    }
}

/// Counts one request on the door-wide and per-connection in-flight counts until dropped.
#[derive(Debug)]
struct ActiveGuard {
    app: Arc<App>,
    conn: Arc<ConnInfo>,
}

impl ActiveGuard {
    fn new(app: &Arc<App>, conn: &Arc<ConnInfo>) -> Self {
        app.active.count.fetch_add(1, Ordering::AcqRel);
        conn.active.fetch_add(1, Ordering::AcqRel);
        conn.touch();
        Self {
            app: Arc::clone(app),
            conn: Arc::clone(conn),
        }
    }
}

impl Drop for ActiveGuard {
    fn drop(&mut self) {
        self.conn.touch();
        self.conn.active.fetch_sub(1, Ordering::AcqRel);
        if self.app.active.count.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.app.active.zero.notify_waiters();
        }
    }
}

/// What a reload (SIGHUP) replaces as a whole: routes, limit groups, trusted proxies and the
/// escalation settings. Requests take a snapshot when they start, so a reload never changes the
/// rules under a request in flight.
#[derive(Debug)]
struct Policy {
    router: Router,
    limited: HashMap<String, Limited>,
    trusted: TrustedProxies,
    forwarded_header: ForwardedSource,
    escalator: Option<Arc<Escalator>>,
    /// `(escalate_after, escalate_window, block_for)` the escalator was built with.
    escalation: (u32, Duration, Duration),
}

/// Everything the request path needs, shared by all connections.
#[derive(Debug)]
pub struct App {
    policy: std::sync::RwLock<Arc<Policy>>,
    clock: Arc<dyn Clock>,
    blocklist: Option<Arc<dyn Blocklist>>,
    proxy: Proxy,
    metrics: Metrics,
    warned_untrusted_xff: AtomicBool,
    upstream_timeout: Duration,
    health: CachedHealth,
    draining: Arc<AtomicBool>,
    active: Active,
}

impl Policy {
    /// The rules of `config`; with `previous`, limiters of groups whose budget and shadow mode
    /// did not change are kept (buckets carry over), and so is the escalator if its settings did
    /// not change (its counts carry over).
    fn build(
        config: &Config,
        clock: &Arc<dyn Clock>,
        metrics: &Metrics,
        blocklist: Option<&Arc<dyn Blocklist>>,
        previous: Option<&Policy>,
    ) -> Self {
        let enforce = !config.disable_anon_route_limits;
        let limited = config
            .groups
            .iter()
            .map(|(name, g)| {
                let kept = previous
                    .and_then(|p| p.limited.get(name))
                    .map(|l| &l.limiter)
                    .filter(|l| *l.budget() == g.budget && l.enforcing() == enforce);
                let limiter = match kept {
                    Some(l) => Arc::clone(l),
                    None => Arc::new(GroupLimiter::new(
                        name,
                        g.budget,
                        enforce,
                        Arc::clone(clock),
                        metrics.clone(),
                    )),
                };
                let sf_name = sf_string(name);
                let policy = config
                    .ratelimit_headers
                    .then(|| {
                        HeaderValue::try_from(format!(
                            "{sf_name};q={};w={}",
                            g.budget.burst,
                            limiter.window_s()
                        ))
                        .ok()
                    })
                    .flatten();
                let l = Limited {
                    limiter,
                    read_timeout: g.read_timeout,
                    policy,
                    sf_name,
                    health: name == HEALTH_GROUP,
                };
                (name.clone(), l)
            })
            .collect();
        let x = &config.xdp;
        let escalation = (x.escalate_after, x.escalate_window, x.block_for);
        let escalator = match previous {
            Some(p) if p.escalation == escalation => p.escalator.clone(),
            _ => blocklist.filter(|_| x.escalate_after > 0).map(|b| {
                Arc::new(Escalator::new(
                    x.escalate_after,
                    x.escalate_window,
                    x.block_for,
                    Arc::clone(clock),
                    Arc::clone(b),
                ))
            }),
        };
        Self {
            router: Router::new(config.routes.clone()),
            limited,
            trusted: config.trusted_proxies.clone(),
            forwarded_header: config.forwarded_header,
            escalator,
            escalation,
        }
    }
}

/// The settings read only at start that differ between `old` and `new` (a reload cannot apply
/// them; a restart does).
fn restart_only_changes(old: &Config, new: &Config) -> Vec<&'static str> {
    let mut changed = Vec::new();
    let mut check = |name: &'static str, differs: bool| {
        if differs {
            changed.push(name);
        }
    };
    check(
        "listen",
        old.listen != new.listen || old.proxy_protocol_listen != new.proxy_protocol_listen,
    );
    check("upstream", old.upstream != new.upstream);
    check("admin_listen", old.admin_listen != new.admin_listen);
    check("tls", old.tls != new.tls);
    check(
        "header_read_timeout",
        old.header_read_timeout != new.header_read_timeout,
    );
    check("idle_timeout", old.idle_timeout != new.idle_timeout);
    check(
        "upstream_timeout",
        old.upstream_timeout != new.upstream_timeout,
    );
    check("drain_grace", old.drain_grace != new.drain_grace);
    check("otlp", old.otlp != new.otlp);
    check("xdp.interface", old.xdp.interface != new.xdp.interface);
    check("xdp.mode", old.xdp.mode != new.xdp.mode);
    check(
        "xdp.max_prefixes",
        old.xdp.max_prefixes != new.xdp.max_prefixes,
    );
    changed
}

/// Why door answered instead of the upstream.
#[derive(Debug)]
enum Failure {
    BodyTimeout,
    UpstreamTimeout,
    Upstream(crate::proxy::ProxyError),
}

impl App {
    /// Builds the request path from a validated configuration, reading time from `clock` and
    /// recording into `metrics`; `blocklist` receives escalated keys when `[xdp] escalate_after`
    /// is set.
    pub fn new(
        config: &Config,
        clock: &Arc<dyn Clock>,
        metrics: &Metrics,
        blocklist: Option<Arc<dyn Blocklist>>,
    ) -> Self {
        let policy = Policy::build(config, clock, metrics, blocklist.as_ref(), None);
        let draining = Arc::new(AtomicBool::new(false));
        Self {
            policy: std::sync::RwLock::new(Arc::new(policy)),
            clock: Arc::clone(clock),
            blocklist,
            proxy: Proxy::new(config.upstream.clone()),
            metrics: metrics.clone(),
            warned_untrusted_xff: AtomicBool::new(false),
            upstream_timeout: config.upstream_timeout,
            health: CachedHealth::new(Arc::clone(clock), HEALTH_TTL, Arc::clone(&draining)),
            draining,
            active: Active::default(),
        }
    }

    /// The rules in force now (a snapshot: a reload swaps in a new one).
    fn policy(&self) -> Arc<Policy> {
        Arc::clone(
            &self
                .policy
                .read()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        )
    }

    /// Applies a reloaded configuration (SIGHUP) without touching connections: routes, groups,
    /// trusted proxies, the authoritative forwarding header and the escalation settings. A group
    /// whose budget (and shadow mode) did not change keeps its limiter, so its clients' buckets
    /// and in-flight counts carry over; a changed or new group starts fresh. Settings read only at
    /// start (listen, upstream, TLS, timeouts, XDP interface and mode) need a restart: the list of
    /// those that changed is returned so the caller can say so.
    pub fn reload(&self, new: &Config, old: &Config) -> Vec<&'static str> {
        let current = self.policy();
        let policy = Policy::build(
            new,
            &self.clock,
            &self.metrics,
            self.blocklist.as_ref(),
            Some(&current),
        );
        *self
            .policy
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Arc::new(policy);
        restart_only_changes(old, new)
    }

    /// The groups' limiters, sorted by name.
    pub fn limiters(&self) -> Vec<Arc<GroupLimiter>> {
        let policy = self.policy();
        let mut v: Vec<_> = policy.limited.values().map(|l| l.limiter.clone()).collect();
        v.sort_by(|a, b| a.group().cmp(b.group()));
        v
    }

    /// Starts draining: from now on health answers 503 (cache bypassed) and HTTP/1.1 responses
    /// carry `Connection: close`.
    pub fn begin_drain(&self) {
        self.draining.store(true, Ordering::Release);
    }

    /// Whether door is draining.
    pub fn draining(&self) -> bool {
        self.draining.load(Ordering::Acquire)
    }

    /// Requests door is answering now (until their response body has been sent or dropped).
    pub fn requests_in_flight(&self) -> usize {
        self.active.count.load(Ordering::Acquire)
    }

    /// Waits until no request is in flight, at most `grace`; `true` when none is left.
    pub async fn wait_idle(&self, grace: Duration) -> bool {
        let wait = async {
            loop {
                let zero = self.active.zero.notified();
                tokio::pin!(zero);
                zero.as_mut().enable();
                if self.requests_in_flight() == 0 {
                    return;
                }
                zero.await;
            }
        };
        tokio::time::timeout(grace, wait).await.is_ok()
    }

    /// Handles one request on connection `conn`.
    pub async fn handle(
        self: Arc<Self>,
        conn: Arc<ConnInfo>,
        req: Request<Incoming>,
    ) -> Response<ResponseBody> {
        let guard = ActiveGuard::new(&self, &conn);
        // Decided when the request starts, like the health answer, so that a response to a
        // request that began before the drain never closes the connection under its client.
        let close = req.version() < Version::HTTP_2 && self.draining();
        let mut res = self.route(&conn, req).await;
        if close {
            res.headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        res.body_mut().active = Some(guard);
        res
    }

    async fn route(
        self: &Arc<Self>,
        conn: &ConnInfo,
        req: Request<Incoming>,
    ) -> Response<ResponseBody> {
        let policy = self.policy();
        let peer_ip = key::canonical(conn.peer.ip());
        let origin = Origin {
            peer: peer_ip,
            peer_trusted: policy.trusted.contains(peer_ip),
            tls: conn.tls,
        };
        let group = policy.router.group_for(req.method(), req.uri().path());
        let Some(limited) = group.and_then(|g| policy.limited.get(g)) else {
            let (parts, body) = req.into_parts();
            let (body, events) = UpstreamBody::new(body, None);
            return match self
                .call(Request::from_parts(parts, body), origin, events)
                .await
            {
                Ok(res) => res.map(ResponseBody::upstream),
                Err(f) => failure_response(&f),
            };
        };
        if limited.health && self.draining() {
            return health_response(StatusCode::SERVICE_UNAVAILABLE, "draining");
        }
        let decision = key::client_key(
            peer_ip,
            req.headers(),
            &policy.trusted,
            policy.forwarded_header,
        );
        if decision.ignored_untrusted_xff {
            self.metrics.untrusted_xff();
            if !self.warned_untrusted_xff.swap(true, Ordering::Relaxed) {
                tracing::warn!(
                    %peer_ip,
                    "ignoring X-Forwarded-For/Forwarded from an untrusted local peer: if it is a \
                     proxy, add it to trusted_proxies (counted in door.untrusted_xff; warned once)"
                );
            }
        }
        let mut res = match limited.limiter.admit(decision.key) {
            Ok(permit) => self.forward_limited(req, origin, permit, limited).await,
            Err(rejection) => {
                if rejection.status == StatusCode::TOO_MANY_REQUESTS
                    && let Some(e) = &policy.escalator
                {
                    // A peer named by a trusted proxy's PROXY header was learned through that
                    // proxy: never escalated (DESIGN.md, "Flood shield").
                    let source = if conn.proxied {
                        KeySource::ThroughProxy
                    } else {
                        KeySource::of(&decision)
                    };
                    e.on_rejection(decision.key, source);
                }
                if limited.health {
                    self.cached_health(&limited.limiter, req, origin).await
                } else {
                    rejected(limited.limiter.group(), &rejection)
                }
            }
        };
        if let Some(policy) = &limited.policy {
            let q = limited.limiter.quota(&decision.key);
            let headers = res.headers_mut();
            headers.insert(&RATELIMIT_POLICY, policy.clone());
            if let Ok(v) = HeaderValue::try_from(format!(
                "{};r={};t={}",
                limited.sf_name, q.remaining, q.reset_s
            )) {
                headers.insert(&RATELIMIT, v);
            }
        }
        res
    }

    /// An admitted request of a limited group: the body must arrive within the group's read
    /// timeout (else 408, upstream aborted); the permit settles when the response body ends, or
    /// once the response has been sending for the group's read timeout (a slow reader keeps its
    /// connection, not a limiter slot).
    ///
    /// The upstream call runs in its own task, so that a client that hangs up once its request
    /// was sent cannot escape the charge: the upstream's answer still settles the permit (a 4xx
    /// spends the held token under charge on failure). The call is bounded by `upstream_timeout`.
    async fn forward_limited(
        self: &Arc<Self>,
        req: Request<Incoming>,
        origin: Origin,
        permit: Permit,
        limited: &Limited,
    ) -> Response<ResponseBody> {
        let (parts, body) = req.into_parts();
        // Only a body-less probe's answer may stand for the application's health (a POST's 405, or
        // a 502 door gave for a client's broken body, must not be served to other probes).
        let feeds_cache = limited.health && matches!(parts.method, Method::GET | Method::HEAD);
        let (body, events) = UpstreamBody::new(body, Some(limited.read_timeout));
        let req = Request::from_parts(parts, body);
        let (tx, rx) = oneshot::channel();
        let app = Arc::clone(self);
        tokio::spawn(async move {
            let result = app.call(req, origin, events).await;
            if let Err((result, permit)) = tx.send((result, permit)) {
                // The client left before the response head: settle with what happened upstream.
                match result {
                    Ok(res) => permit.settle(res.status()),
                    Err(Failure::BodyTimeout) => permit.settle(StatusCode::REQUEST_TIMEOUT),
                    Err(_) => drop(permit),
                }
            }
        });
        let Ok((result, permit)) = rx.await else {
            // The call task panicked; its permit was dropped with it (slot freed).
            return failure_response(&Failure::UpstreamTimeout);
        };
        match result {
            Ok(res) => {
                let status = res.status();
                if feeds_cache {
                    self.health.record(status);
                }
                res.map(|b| ResponseBody::settling(b, permit, status, limited.read_timeout))
            }
            Err(Failure::BodyTimeout) => {
                // The client's fault: settled as 408 (client_error; under charge on failure the
                // held token is spent).
                permit.settle(StatusCode::REQUEST_TIMEOUT);
                failure_response(&Failure::BodyTimeout)
            }
            Err(f) => {
                // Dropped unsettled: slot freed, nothing spent, counted as server_error.
                drop(permit);
                let res = failure_response(&f);
                if feeds_cache {
                    self.health.record(res.status());
                }
                res
            }
        }
    }

    /// Sends `req` upstream. While the request body is still arriving, only its read deadline
    /// applies (`events` says when it ended or missed the deadline); once it has been sent in
    /// full (at once for a request without a body), the upstream has `upstream_timeout` to
    /// answer with its response head.
    async fn call(
        &self,
        req: Request<UpstreamBody>,
        origin: Origin,
        events: Option<oneshot::Receiver<BodyEvent>>,
    ) -> Result<Response<Incoming>, Failure> {
        let req = prepare(req, self.proxy.upstream(), origin);
        let upstream = self.proxy.forward(req);
        tokio::pin!(upstream);
        if let Some(events) = events {
            tokio::select! {
                biased;
                ev = events => {
                    if matches!(ev, Ok(BodyEvent::TimedOut)) {
                        return Err(Failure::BodyTimeout);
                    }
                    // Ended, or the body failed (the upstream call fails with it).
                }
                r = upstream.as_mut() => return r.map_err(Failure::Upstream),
            }
        }
        match tokio::time::timeout(self.upstream_timeout, upstream).await {
            Ok(r) => r.map_err(Failure::Upstream),
            Err(_) => Err(Failure::UpstreamTimeout),
        }
    }

    /// Seed L3: an over-budget health probe gets the last upstream status (cached
    /// [`HEALTH_TTL`], refreshed single-flight by forwarding this probe), counted as `cached`.
    async fn cached_health(
        &self,
        limiter: &GroupLimiter,
        req: Request<Incoming>,
        origin: Origin,
    ) -> Response<ResponseBody> {
        let status = self
            .health
            .status(|| async move {
                let (parts, body) = req.into_parts();
                let (body, events) = UpstreamBody::new(body, None);
                match self
                    .call(Request::from_parts(parts, body), origin, events)
                    .await
                {
                    Ok(res) => res.status(),
                    Err(f) => failure_status(&f),
                }
            })
            .await;
        limiter.record(Outcome::Cached);
        health_response(status, "door; hit")
    }
}

/// A structured-field string (RFC 8941 §3.3.3) of `s`: quoted, `"` and `\` escaped; characters
/// outside printable ASCII replaced by `?`.
fn sf_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' | '\\' => {
                out.push('\\');
                out.push(c);
            }
            ' '..='~' => out.push(c),
            _ => out.push('?'),
        }
    }
    out.push('"');
    out
}

fn failure_status(f: &Failure) -> StatusCode {
    match f {
        Failure::BodyTimeout => StatusCode::REQUEST_TIMEOUT,
        Failure::UpstreamTimeout => StatusCode::GATEWAY_TIMEOUT,
        Failure::Upstream(_) => StatusCode::BAD_GATEWAY,
    }
}

fn failure_response(f: &Failure) -> Response<ResponseBody> {
    let (code, message) = match f {
        Failure::BodyTimeout => (
            "request-timeout",
            "the request body did not arrive in time".to_owned(),
        ),
        Failure::UpstreamTimeout => (
            "gateway-timeout",
            "the application behind door did not answer in time".to_owned(),
        ),
        Failure::Upstream(e) => {
            // An upstream down fails every request: one line a minute, with the count skipped.
            static UPSTREAM_FAILED: RateLimitedWarn = RateLimitedWarn::new(Duration::from_mins(1));
            if let Some(suppressed) = UPSTREAM_FAILED.due() {
                tracing::warn!(error = %e, refused = e.is_connect(), suppressed, "upstream request failed (at most one line a minute)");
            }
            (
                "bad-gateway",
                "the application behind door did not answer".to_owned(),
            )
        }
    };
    let mut res = json_response(
        failure_status(f),
        &serde_json::json!({ "code": code, "message": message }),
    );
    if matches!(f, Failure::BodyTimeout) {
        // The rest of the body is never read: the connection cannot be reused.
        res.headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    res
}

fn health_response(status: StatusCode, cache_status: &'static str) -> Response<ResponseBody> {
    let mut res = Response::new(ResponseBody::full(Bytes::from_static(
        status.canonical_reason().unwrap_or("unknown").as_bytes(),
    )));
    *res.status_mut() = status;
    let h = res.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    h.insert(&CACHE_STATUS, HeaderValue::from_static(cache_status));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    res
}

/// The 429/503 answer of ../shared/DESIGN.md ("Limits"): `Retry-After` in whole seconds and the
/// JSON envelope `{"code":"rate-limited","message":…,"details":{"group","scope","retry_after_s"}}`.
pub fn rejected(group: &str, r: &Rejection) -> Response<ResponseBody> {
    let body = serde_json::json!({
        "code": "rate-limited",
        "message": format!("too many requests to {group}; retry in {} s", r.retry_after_s),
        "details": {
            "group": group,
            "scope": r.scope.as_str(),
            "retry_after_s": r.retry_after_s,
        },
    });
    let mut res = json_response(r.status, &body);
    res.headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from(r.retry_after_s));
    res
}

fn json_response(status: StatusCode, body: &serde_json::Value) -> Response<ResponseBody> {
    let mut res = Response::new(ResponseBody::full(Bytes::from(body.to_string())));
    *res.status_mut() = status;
    res.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    res
}

/// The response body: an upstream body streamed through frame by frame (never buffered, so an
/// upstream's flush reaches the client at once), or door's own small body. It settles the
/// request's limiter permit when the body ends, fails or is dropped (client gone), and counts
/// the request as in flight until then.
#[derive(Debug)]
pub struct ResponseBody {
    kind: Kind,
    permit: Option<HeldPermit>,
    active: Option<ActiveGuard>,
}

/// A limited request's permit while its response is sent: settled when the body ends or is
/// dropped, or by a timer at the send deadline, whichever comes first, so that a client reading
/// slowly (or an HTTP/2 client keeping its window shut) cannot hold a limiter slot for longer
/// than the deadline.
#[derive(Debug)]
struct HeldPermit {
    slot: Arc<Mutex<Option<(Permit, StatusCode)>>>,
    timer: tokio::task::JoinHandle<()>,
}

impl HeldPermit {
    fn new(permit: Permit, status: StatusCode, deadline: Duration) -> Self {
        let slot = Arc::new(Mutex::new(Some((permit, status))));
        let for_timer = Arc::clone(&slot);
        let timer = tokio::spawn(async move {
            tokio::time::sleep(deadline).await;
            settle_held(&for_timer);
        });
        Self { slot, timer }
    }

    fn settle(&self) {
        self.timer.abort();
        settle_held(&self.slot);
    }
}

fn settle_held(slot: &Mutex<Option<(Permit, StatusCode)>>) {
    if let Some((permit, status)) = lock(slot).take() {
        permit.settle(status);
    }
}

#[derive(Debug)]
enum Kind {
    Upstream(Incoming),
    Full(Option<Bytes>),
}

impl ResponseBody {
    fn upstream(body: Incoming) -> Self {
        Self {
            kind: Kind::Upstream(body),
            permit: None,
            active: None,
        }
    }

    /// An upstream body whose request holds `permit` until the body is sent, at most `deadline`.
    fn settling(body: Incoming, permit: Permit, status: StatusCode, deadline: Duration) -> Self {
        Self {
            kind: Kind::Upstream(body),
            permit: Some(HeldPermit::new(permit, status, deadline)),
            active: None,
        }
    }

    fn full(bytes: Bytes) -> Self {
        Self {
            kind: Kind::Full(Some(bytes)),
            permit: None,
            active: None,
        }
    }

    fn finish(&mut self) {
        if let Some(held) = self.permit.take() {
            held.settle();
        }
        self.active = None;
    }
}

impl Body for ResponseBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = &mut *self;
        let poll = match &mut this.kind {
            Kind::Upstream(b) => Pin::new(b).poll_frame(cx),
            Kind::Full(b) => Poll::Ready(b.take().map(|b| Ok(Frame::data(b)))),
        };
        match &poll {
            Poll::Ready(None | Some(Err(_))) => this.finish(),
            Poll::Ready(Some(Ok(_))) if this.is_end_stream() => this.finish(),
            _ => {}
        }
        poll
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Upstream(b) => b.is_end_stream(),
            Kind::Full(b) => b.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Upstream(b) => b.size_hint(),
            Kind::Full(Some(b)) => SizeHint::with_exact(b.len() as u64),
            Kind::Full(None) => SizeHint::with_exact(0),
        }
    }
}

impl Drop for ResponseBody {
    fn drop(&mut self) {
        self.finish();
    }
}

/// Connection settings shared by every listener.
#[derive(Debug, Clone, Copy)]
pub struct ConnSettings {
    /// Request head timeout (HTTP/1.1, and the TLS handshake).
    pub header_read_timeout: Duration,
    /// A connection with no request in flight for this long is closed.
    pub idle_timeout: Duration,
}

impl ConnSettings {
    /// The settings of `config`.
    pub fn from_config(config: &Config) -> Self {
        Self {
            header_read_timeout: config.header_read_timeout,
            idle_timeout: config.idle_timeout,
        }
    }

    fn builder(self) -> auto::Builder<TokioExecutor> {
        let mut b = auto::Builder::new(TokioExecutor::new());
        b.http1()
            .timer(TokioTimer::new())
            .header_read_timeout(self.header_read_timeout)
            .max_buf_size(MAX_HEADER_BYTES)
            .max_headers(MAX_HEADER_FIELDS);
        b.http2()
            .timer(TokioTimer::new())
            .max_header_list_size(u32::try_from(MAX_HEADER_BYTES).unwrap_or(u32::MAX))
            .max_concurrent_streams(MAX_CONCURRENT_STREAMS);
        b
    }
}

/// door's listeners and their connections: serves, and drains on request.
pub struct Front {
    app: Arc<App>,
    settings: ConnSettings,
    builder: Arc<auto::Builder<TokioExecutor>>,
    tls: Option<TlsAcceptor>,
    stop: watch::Sender<bool>,
    loops: Mutex<JoinSet<()>>,
    connections: Arc<Mutex<JoinSet<()>>>,
    /// Set when an accept loop ended before the drain (its listener is gone).
    loop_died: AtomicBool,
}

impl Front {
    /// Whether every accept loop is still running. An accept loop only ends at the drain, so one
    /// that ended before means a listener stopped serving (and the watchdog should notice).
    pub fn accepting(&self) -> bool {
        let mut loops = lock(&self.loops);
        while loops.try_join_next().is_some() {
            self.loop_died.store(true, Ordering::Release);
        }
        !self.loop_died.load(Ordering::Acquire) && !loops.is_empty()
    }

    /// A front for `app`; `tls` (from [`crate::tls::load`]) terminates TLS on every listener.
    pub fn new(
        app: Arc<App>,
        settings: ConnSettings,
        tls: Option<Arc<rustls::ServerConfig>>,
    ) -> Self {
        Self {
            app,
            settings,
            builder: Arc::new(settings.builder()),
            tls: tls.map(TlsAcceptor::from),
            stop: watch::channel(false).0,
            loops: Mutex::new(JoinSet::new()),
            connections: Arc::new(Mutex::new(JoinSet::new())),
            loop_died: AtomicBool::new(false),
        }
    }

    /// The request path.
    pub fn app(&self) -> &Arc<App> {
        &self.app
    }

    /// Serves `listener` until [`Front::drain`]; with `proxy_protocol`, every connection must
    /// start with a PROXY protocol header from a trusted proxy.
    pub fn serve(&self, listener: TcpListener, proxy_protocol: bool) {
        let task = accept_loop(
            listener,
            Arc::clone(&self.app),
            self.settings,
            Arc::clone(&self.builder),
            self.tls.clone(),
            self.stop.subscribe(),
            Arc::clone(&self.connections),
            proxy_protocol,
        );
        lock(&self.loops).spawn(task);
    }

    /// Drains (DESIGN.md, "Operating contract"): health turns 503 at once, the listeners are
    /// closed (new connections are refused), in-flight requests get `grace` to finish, then every
    /// connection is shut down gracefully (HTTP/2 GOAWAY; HTTP/1.1 closed once idle) and, after
    /// at most the rest of the grace period, dropped. `true` when everything finished in time.
    pub async fn drain(&self, grace: Duration) -> bool {
        let start = Instant::now();
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
        finished && closed
    }
}

impl std::fmt::Debug for Front {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Front")
            .field("settings", &self.settings)
            .field("tls", &self.tls.is_some())
            .finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[expect(
    clippy::too_many_arguments,
    reason = "the listener's inputs, passed once from Front::serve"
)]
async fn accept_loop(
    listener: TcpListener,
    app: Arc<App>,
    settings: ConnSettings,
    builder: Arc<auto::Builder<TokioExecutor>>,
    tls: Option<TlsAcceptor>,
    stop: watch::Receiver<bool>,
    connections: Arc<Mutex<JoinSet<()>>>,
    proxy_protocol: bool,
) {
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(a) => a,
            Err(e) => {
                // Out of file descriptors repeats on every accept: one line per 10 s.
                static ACCEPT_FAILED: RateLimitedWarn =
                    RateLimitedWarn::new(Duration::from_secs(10));
                if let Some(suppressed) = ACCEPT_FAILED.due() {
                    tracing::warn!(error = %e, suppressed, "accept failed (at most one line per 10 s)");
                }
                // EMFILE and friends: back off instead of spinning.
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let task = connection(
            stream,
            peer,
            proxy_protocol,
            Arc::clone(&app),
            settings,
            Arc::clone(&builder),
            tls.clone(),
            stop.clone(),
        );
        let mut set = lock(&connections);
        // Reap finished connections so the set does not grow with every connection ever served.
        while set.try_join_next().is_some() {}
        set.spawn(task);
    }
}

#[expect(
    clippy::too_many_arguments,
    reason = "one connection's inputs, passed once from the accept loop"
)]
async fn connection(
    mut stream: TcpStream,
    peer: SocketAddr,
    proxy_protocol: bool,
    app: Arc<App>,
    settings: ConnSettings,
    builder: Arc<auto::Builder<TokioExecutor>>,
    tls: Option<TlsAcceptor>,
    stop: watch::Receiver<bool>,
) {
    // PROXY protocol listener (issue 4): the header, read before any TLS, names the peer.
    let peer = if proxy_protocol {
        let policy = app.policy();
        let accepted = crate::proxy_protocol::accept_or_reject(
            &mut stream,
            peer,
            &policy.trusted,
            &app.metrics,
        );
        let Some(peer) = accepted.await else {
            return;
        };
        peer
    } else {
        peer
    };
    match tls {
        None => {
            let info = Arc::new(ConnInfo {
                proxied: proxy_protocol,
                ..ConnInfo::new(peer, false)
            });
            serve_io(stream, info, app, settings, &builder, stop).await;
        }
        Some(acceptor) => {
            let handshake =
                tokio::time::timeout(settings.header_read_timeout, acceptor.accept(stream)).await;
            match handshake {
                Ok(Ok(tls_stream)) => {
                    let info = Arc::new(ConnInfo {
                        proxied: proxy_protocol,
                        ..ConnInfo::new(peer, true)
                    });
                    serve_io(tls_stream, info, app, settings, &builder, stop).await;
                }
                Ok(Err(e)) => tracing::debug!(%peer, error = %e, "TLS handshake failed"),
                Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
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
    let service = hyper::service::service_fn(move |req| {
        let app = Arc::clone(&app);
        let info = Arc::clone(&conn_info);
        async move { Ok::<_, Infallible>(app.handle(info, req).await) }
    });
    let conn = builder.serve_connection(TokioIo::new(io), service);
    tokio::pin!(conn);
    loop {
        let idle_at = info
            .idle_deadline(settings.idle_timeout)
            .unwrap_or_else(|| Instant::now() + settings.idle_timeout);
        tokio::select! {
            r = conn.as_mut() => {
                if let Err(e) = r {
                    tracing::debug!(%peer, error = %e, "connection ended with an error");
                }
                return;
            }
            _ = stop.changed() => break,
            () = tokio::time::sleep_until(idle_at) => {
                if info.idle_deadline(settings.idle_timeout).is_some_and(|d| d <= Instant::now()) {
                    tracing::debug!(%peer, "closing an idle connection");
                    break;
                }
            }
        }
    }
    conn.as_mut().graceful_shutdown();
    // A client that ignores the HTTP/2 GOAWAY and PING would keep this forever (found by hostile
    // testing): after the header read timeout more, the connection is dropped.
    let _ = tokio::time::timeout(settings.header_read_timeout, conn).await;
}

/// Re-reads the configuration for a reload (flags, environment and the file, as at start).
pub type Reloader = Box<dyn Fn() -> Result<Config, crate::config::ConfigError> + Send>;

/// Runs door with `config` until SIGTERM or SIGINT: checks the TLS key pair, attaches the XDP
/// program (per `xdp.mode`), binds every listener (nothing is served until all are bound),
/// tells systemd it is ready (`READY=1`), serves, then drains within `drain_grace`
/// (`STOPPING=1`) and detaches the XDP program. SIGHUP reloads the configuration with `reload`
/// (see [`App::reload`]; the XDP settings and exempt prefixes are updated in place); a
/// configuration that does not validate is logged and the running one kept. Under systemd's
/// watchdog (`WATCHDOG_USEC`), `WATCHDOG=1` is sent from this serving loop, and only while every
/// accept loop is alive, so a wedged runtime or a dead listener stops the pings.
///
/// # Errors
/// [`ServeError`] when the TLS pair is unusable, a listener cannot be bound or a strict XDP mode
/// cannot attach.
pub async fn run(config: Config, metrics: Metrics, reload: Reloader) -> Result<(), ServeError> {
    let tls = config.tls.as_ref().map(crate::tls::load).transpose()?;
    let shield = start_shield(&config)?;
    let mut listeners = Vec::new();
    for addr in &config.listen {
        let l = TcpListener::bind(addr)
            .await
            .map_err(|source| ServeError::Bind {
                addr: *addr,
                source,
            })?;
        listeners.push((l, config.requires_proxy_protocol(*addr)));
    }
    let admin = match config.admin_listen {
        Some(addr) => Some(
            TcpListener::bind(addr)
                .await
                .map_err(|source| ServeError::Bind { addr, source })?,
        ),
        None => None,
    };

    let clock: Arc<dyn Clock> = Arc::new(MonotonicClock::new());
    let blocklist = shield
        .clone()
        .map(|s| Arc::new(crate::xdp::BlocklistWriter::spawn(s)) as Arc<dyn Blocklist>);
    let _shield_instruments = shield
        .as_ref()
        .map(|s| crate::xdp::observe(&opentelemetry::global::meter("door"), s));
    let app = Arc::new(App::new(&config, &clock, &metrics, blocklist));
    let front = Front::new(Arc::clone(&app), ConnSettings::from_config(&config), tls);
    let proto = if config.tls.is_some() {
        "TLS: h2 and http/1.1 by ALPN"
    } else {
        "HTTP/1.1 and h2c"
    };
    for (l, proxy_protocol) in listeners {
        if let Ok(addr) = l.local_addr() {
            tracing::info!(%addr, upstream = %config.upstream, proxy_protocol, "listening ({proto})");
        }
        front.serve(l, proxy_protocol);
    }
    let admin_task = admin.map(|l| {
        if let Ok(addr) = l.local_addr() {
            tracing::info!(url = %crate::status::url(addr), "admin status");
        }
        let for_status = Arc::clone(&app);
        let source = Arc::new(StatusSource {
            limiters: Arc::new(move || for_status.limiters()),
            shield: shield.clone(),
            xdp_mode: config.xdp.mode.as_str(),
        });
        tokio::spawn(crate::status::serve(l, source))
    });

    let xdp_state = match &shield {
        Some(s) => match lock(s).attached() {
            Some((interface, mode)) => format!("XDP on {interface} ({mode})"),
            None => "XDP not attached".to_owned(),
        },
        None => "XDP off".to_owned(),
    };
    notify(&[
        sd_notify::NotifyState::Ready,
        sd_notify::NotifyState::Status(&format!(
            "serving on {} listener(s); {xdp_state}",
            config.listen.len()
        )),
    ]);
    let config = serve_until_term(&front, &app, shield.as_ref(), config, &reload).await;

    notify(&[
        sd_notify::NotifyState::Stopping,
        sd_notify::NotifyState::Status("draining"),
    ]);
    let grace = config.drain_grace;
    tracing::info!(?grace, "draining: health is 503, listeners closed");
    if !front.drain(grace).await {
        tracing::warn!(
            ?grace,
            "in-flight requests did not finish within the grace period"
        );
    }
    if let Some(t) = admin_task {
        t.abort();
    }
    if let Some(shield) = shield {
        lock(&shield).detach();
        tracing::info!("XDP flood shield detached");
    }
    Ok(())
}

/// Sends `states` to systemd when it is listening (`NOTIFY_SOCKET`); failures are logged, never
/// fatal.
fn notify(states: &[sd_notify::NotifyState<'_>]) {
    if let Err(e) = sd_notify::notify(false, states) {
        tracing::debug!(error = %e, "sd_notify failed");
    }
}

/// Serves until SIGTERM or SIGINT, reloading on SIGHUP and pinging the watchdog; returns the
/// configuration in force at the end.
async fn serve_until_term(
    front: &Front,
    app: &App,
    shield: Option<&Arc<Mutex<Shield>>>,
    mut config: Config,
    reload: &Reloader,
) -> Config {
    use tokio::signal::unix::{SignalKind, signal};

    let (Ok(mut term), Ok(mut hup)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::hangup()),
    ) else {
        tracing::error!("cannot install signal handlers; stopping on Ctrl-C only");
        let _ = tokio::signal::ctrl_c().await;
        return config;
    };
    let mut usec = 0;
    let watchdog = sd_notify::watchdog_enabled(false, &mut usec);
    let period = Duration::from_micros(usec / 2).max(Duration::from_millis(100));
    let mut tick = tokio::time::interval(period);
    loop {
        tokio::select! {
            _ = term.recv() => return config,
            _ = tokio::signal::ctrl_c() => return config,
            _ = hup.recv() => {
                notify(&[sd_notify::NotifyState::Reloading]);
                match reload() {
                    Ok(new) => {
                        let restart = app.reload(&new, &config);
                        reconfigure_shield(shield, &new);
                        if restart.is_empty() {
                            tracing::info!("configuration reloaded");
                        } else {
                            tracing::warn!(needs_restart = ?restart, "configuration reloaded; these settings only change on restart");
                        }
                        config = new;
                    }
                    Err(e) => tracing::error!(error = %e, "reload refused: invalid configuration, keeping the running one"),
                }
                notify(&[sd_notify::NotifyState::Ready, sd_notify::NotifyState::Status("serving (reloaded)")]);
            }
            _ = tick.tick(), if watchdog => {
                if front.accepting() {
                    notify(&[sd_notify::NotifyState::Watchdog]);
                } else {
                    tracing::error!("an accept loop has stopped: no longer pinging the watchdog");
                }
            }
        }
    }
}

/// Writes a reloaded configuration's XDP settings and exempt prefixes (trusted proxies and
/// `xdp.allow`) into the attached program's maps, in place.
fn reconfigure_shield(shield: Option<&Arc<Mutex<Shield>>>, config: &Config) {
    let Some(shield) = shield else { return };
    let mut exempt = config.trusted_proxies.nets().to_vec();
    exempt.extend(config.xdp.allow.iter().copied());
    if let Err(e) = lock(shield).configure(&config.xdp, &exempt) {
        tracing::error!(error = %e, "reload: could not update the XDP maps; the shield keeps its previous settings where they were not written");
    }
}

fn start_shield(config: &Config) -> Result<Option<Arc<Mutex<Shield>>>, ServeError> {
    let mode = config.xdp.mode;
    if mode == XdpMode::Off {
        tracing::info!("XDP flood shield off (xdp.mode = \"off\")");
        return Ok(None);
    }
    let interface = config.xdp.interface.clone().unwrap_or_default();
    let mut exempt = config.trusted_proxies.nets().to_vec();
    exempt.extend(config.xdp.allow.iter().copied());
    let attached = Shield::load_with_capacity(config.xdp.max_prefixes).and_then(|mut s| {
        s.configure(&config.xdp, &exempt)?;
        s.attach(&interface, mode).map(|m| (s, m))
    });
    match attached {
        Ok((shield, m)) => {
            tracing::info!(%interface, mode = %m, "XDP flood shield attached");
            Ok(Some(Arc::new(Mutex::new(shield))))
        }
        Err(source) if mode == XdpMode::Auto => {
            tracing::error!(
                %interface, error = %source,
                "XDP FLOOD SHIELD NOT ATTACHED: serving with layer-7 limits only (xdp.mode = \"auto\")"
            );
            Ok(None)
        }
        Err(source) => Err(ServeError::Xdp {
            mode: mode.as_str(),
            source,
        }),
    }
}
