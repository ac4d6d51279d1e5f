//! One request, from admission to settlement (docs/design.md, "Limits"): the route's group, the
//! client key, admission ([`crate::http::settle::admit`]), forwarding with the body read deadline
//! and the upstream timeout, door's own answers ([`crate::http::answer`]), cached health for an
//! over-budget probe, and the rules a reload swaps in place.

use std::{
    collections::HashMap,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering},
    },
    time::Duration,
};

use http::{HeaderValue, Method, Request, Response, StatusCode, Version, header};
use hyper::body::Incoming;
use tokio::sync::{Notify, oneshot};

use crate::{
    client::key::{self, ForwardedSource, TrustedProxies},
    config::Config,
    http::{
        answer::{self, Failure},
        body::ResponseBody,
        front::ConnInfo,
        health::{CachedHealth, HEALTH_TTL},
        route::Router,
        settle::{self, End, Held},
        upstream::{BodyEvent, Origin, Proxy, UpstreamBody, prepare},
    },
    limit::GroupLimiter,
    obs::metrics::{GroupMetrics, Metrics, Outcome},
    shield::escalate::{Blocklist, Escalator, KeySource},
    time::Clock,
};

/// The name of the group whose over-budget requests are answered from the health cache.
pub const HEALTH_GROUP: &str = "health";

/// One limited group on the request path.
#[derive(Debug)]
struct Limited {
    limiter: Arc<GroupLimiter>,
    /// The group's instruments: admissions and settlements are counted here.
    metrics: GroupMetrics,
    read_timeout: Duration,
    /// The precomputed `RateLimit-Policy` value; `None` when the fields are off (or the group
    /// name cannot be a structured-field string).
    policy: Option<HeaderValue>,
    /// The group name as a structured-field string (`"link"`), for `RateLimit`.
    sf_name: String,
    health: bool,
}

/// The cap on pass-through requests (routes in no group) forwarded at once
/// (`upstream_max_inflight`): an application behind door is never sent more than this many of
/// them together, however many connections clients open.
#[derive(Debug)]
pub(crate) struct PassThrough {
    cap: u32,
    open: AtomicU32,
}

impl PassThrough {
    /// A slot, or `None` when `cap` requests are in flight.
    fn take(self: &Arc<Self>) -> Option<PassSlot> {
        self.open
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.cap).then_some(n + 1)
            })
            .ok()
            .map(|_| PassSlot(Arc::clone(self)))
    }
}

/// One pass-through request's slot, held until its response body has been sent or dropped.
#[derive(Debug)]
pub(crate) struct PassSlot(Arc<PassThrough>);

impl Drop for PassSlot {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Requests door is answering, door-wide: the drain waits for this to reach zero.
#[derive(Debug, Default)]
struct Active {
    count: AtomicUsize,
    zero: Notify,
}

/// Counts one request on the door-wide and per-connection in-flight counts until dropped.
#[derive(Debug)]
pub(crate) struct ActiveGuard {
    app: Arc<App>,
    conn: Arc<ConnInfo>,
}

impl ActiveGuard {
    pub(crate) fn new(app: &Arc<App>, conn: &Arc<ConnInfo>) -> Self {
        app.active.count.fetch_add(1, Ordering::AcqRel);
        conn.request_started();
        Self {
            app: Arc::clone(app),
            conn: Arc::clone(conn),
        }
    }
}

impl Drop for ActiveGuard {
    fn drop(&mut self) {
        self.conn.request_ended();
        if self.app.active.count.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.app.active.zero.notify_waiters();
        }
    }
}

/// What a reload (SIGHUP) replaces as a whole: routes, limit groups, trusted proxies and the
/// escalation settings. Requests take a snapshot when they start, so a reload never changes the
/// rules under a request in flight.
#[derive(Debug)]
pub(crate) struct Policy {
    router: Router,
    limited: HashMap<String, Limited>,
    pub(crate) trusted: TrustedProxies,
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
    pub(crate) metrics: Metrics,
    warned_untrusted_xff: AtomicBool,
    upstream_timeout: Duration,
    /// Pass-through requests forwarded now, against `upstream_max_inflight`.
    passthrough: Arc<PassThrough>,
    health: CachedHealth,
    draining: Arc<AtomicBool>,
    active: Active,
}

impl Policy {
    /// The rules of `config`; with `previous`, groups that already existed keep their limiter, retuned in place to the new budget and shadow mode (buckets carry over
    /// in proportion, see [`GroupLimiter::retune`]) unless the charge mode changed; the escalator
    /// is kept if its settings did not change (its counts carry over).
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
                    .filter(|l| l.budget().charge == g.budget.charge);
                if let Some(l) = kept
                    && (l.budget() != g.budget || l.enforcing() != enforce)
                {
                    l.retune(g.budget, enforce);
                }
                let group_metrics = metrics.clone().for_group(name);
                let limiter = match kept {
                    Some(l) => Arc::clone(l),
                    None => Arc::new(GroupLimiter::new(
                        name,
                        g.budget,
                        enforce,
                        Arc::clone(clock),
                        Arc::new(group_metrics.clone()),
                    )),
                };
                let sf_name = answer::sf_string(name);
                let policy = config
                    .ratelimit_headers
                    .then(|| answer::ratelimit_policy(&sf_name, g.budget.burst, limiter.window_s()))
                    .flatten();
                let l = Limited {
                    limiter,
                    metrics: group_metrics,
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
            passthrough: Arc::new(PassThrough {
                cap: config.upstream_max_inflight,
                open: AtomicU32::new(0),
            }),
            health: CachedHealth::new(Arc::clone(clock), HEALTH_TTL, Arc::clone(&draining)),
            draining,
            active: Active::default(),
        }
    }

    /// The rules in force now (a snapshot: a reload swaps in a new one).
    pub(crate) fn policy(&self) -> Arc<Policy> {
        Arc::clone(
            &self
                .policy
                .read()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        )
    }

    /// Applies a reloaded configuration (SIGHUP) without touching connections: routes, groups,
    /// trusted proxies, the authoritative forwarding header and the escalation settings. A group
    /// that already existed keeps its limiter, retuned to its new budget: its clients' buckets
    /// carry over in proportion and in-flight counts carry over (a group whose charge mode
    /// changed, and a new group, start fresh); outcome counts always carry over. Settings read
    /// only at start (listen, upstream, TLS on or off, timeouts, XDP interface and mode) need a
    /// restart: the list of those that changed is returned so the caller can say so.
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
        crate::config::restart_only_changes(old, new)
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

    /// Requests of `group` counted per `door.requests` outcome since start (kept across reloads).
    pub fn outcome_totals(&self, group: &str) -> Vec<(Outcome, u64)> {
        self.metrics.totals(group)
    }

    /// Pass-through requests forwarded upstream now (≤ `upstream_max_inflight`).
    pub fn passthrough_in_flight(&self) -> u32 {
        self.passthrough.open.load(Ordering::Acquire)
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
            let Some(slot) = self.passthrough.take() else {
                return answer::upstream_busy();
            };
            let (parts, body) = req.into_parts();
            let (body, events) = UpstreamBody::new(body, None);
            return match self
                .call(Request::from_parts(parts, body), origin, events)
                .await
            {
                Ok(res) => {
                    let mut res = res.map(ResponseBody::upstream);
                    res.body_mut().passthrough = Some(slot);
                    res
                }
                Err(f) => answer::failure_response(&f),
            };
        };
        if limited.health && self.draining() {
            return answer::health_response(StatusCode::SERVICE_UNAVAILABLE, "draining");
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
        let mut res = match settle::admit(&limited.limiter, &limited.metrics, decision.key) {
            Ok(permit) => self.forward_limited(req, origin, permit, limited).await,
            Err(rejection) => {
                if answer::status(rejection.reason) == StatusCode::TOO_MANY_REQUESTS
                    && let Some(e) = &policy.escalator
                {
                    // A peer named by a trusted proxy's PROXY header was learned through that
                    // proxy: never escalated (docs/design.md, "Flood shield").
                    let source = if conn.proxied {
                        KeySource::ThroughProxy
                    } else {
                        KeySource::of(&decision)
                    };
                    e.on_rejection(decision.key, source);
                }
                if limited.health {
                    self.cached_health(limited, req, origin).await
                } else {
                    answer::rejected(limited.limiter.group(), &rejection)
                }
            }
        };
        if let Some(policy) = &limited.policy {
            let q = limited.limiter.quota(&decision.key);
            answer::ratelimit_fields(res.headers_mut(), policy, &limited.sf_name, q);
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
        permit: Held,
        limited: &Limited,
    ) -> Response<ResponseBody> {
        let (parts, body) = req.into_parts();
        // Only a body-less probe's answer may stand for the application's health (a POST's 405, or
        // a 502 door gave for a client's broken body, must not be served to other probes).
        let feeds_cache = limited.health && matches!(parts.method, Method::GET | Method::HEAD);
        let (body, events) = UpstreamBody::new(body, Some(limited.read_timeout));
        let req = Request::from_parts(parts, body);
        // The call runs inside this request's future: a client that goes away (connection
        // closed or reset, HTTP/2 RST_STREAM) drops it, which aborts the upstream call and drops
        // `permit` unsettled, settling it as abandoned (docs/design.md, "Limits").
        let result = self.call(req, origin, events).await;
        match result {
            Ok(res) => {
                let status = res.status();
                if feeds_cache {
                    self.health.record(status);
                }
                res.map(|b| ResponseBody::settling(b, permit, status, limited.read_timeout))
            }
            Err(Failure::BodyTimeout) => {
                permit.settle(End::BodyTimeout);
                answer::failure_response(&Failure::BodyTimeout)
            }
            Err(Failure::ClientGone) => {
                permit.settle(End::Abandoned);
                answer::failure_response(&Failure::ClientGone)
            }
            Err(f) => {
                permit.settle(End::Unanswered);
                let res = answer::failure_response(&f);
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
                ev = events => match ev {
                    Ok(BodyEvent::TimedOut) => return Err(Failure::BodyTimeout),
                    Ok(BodyEvent::Failed) => return Err(Failure::ClientGone),
                    Ok(BodyEvent::Ended) | Err(_) => {}
                },
                r = upstream.as_mut() => return r.map_err(Failure::Upstream),
            }
        }
        match tokio::time::timeout(self.upstream_timeout, upstream).await {
            Ok(r) => r.map_err(Failure::Upstream),
            Err(_) => Err(Failure::UpstreamTimeout),
        }
    }

    /// An over-budget health probe gets the last upstream status (cached [`HEALTH_TTL`],
    /// refreshed single-flight by forwarding this probe), counted as `cached`: a probe never fails
    /// because of door's own limit (docs/design.md, "Limits").
    async fn cached_health(
        &self,
        limited: &Limited,
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
                    Err(f) => answer::failure_status(&f),
                }
            })
            .await;
        limited.metrics.record(Outcome::Cached);
        answer::health_response(status, "door; hit")
    }
}
