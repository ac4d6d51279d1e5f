//! One request, from admission to settlement (docs/design.md, "Limits"): the route's group, the
//! client key, admission ([`crate::http::settle::admit`]), forwarding with the body read deadline
//! and the upstream timeout, door's own answers ([`crate::http::answer`]), cached health for an
//! over-budget probe, and the rules a reload swaps in place.

use std::{
    collections::HashMap,
    sync::{
        Arc, PoisonError,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use door_common::prefix::PrefixKey;
use http::{HeaderValue, Method, Request, Response, StatusCode, Version, header};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use ipnet::IpNet;
use tokio::task::JoinSet;

use crate::{
    client::{
        credential::Credential,
        key::{self, ForwardedSource, KeyDecision, TrustedProxies},
    },
    config::{Config, IP_PLANE, SESSION_PLANE, STREAM_GROUP},
    http::{
        answer::{self, Failure},
        body::ResponseBody,
        conn::ConnInfo,
        head::{self, HeadError},
        health::{CachedHealth, HEALTH_TTL},
        inflight::{
            Active, ActiveGuard, PassRefusal, PassSlot, PassThrough, PassThroughStatus, Whose,
        },
        plane::Sessions,
        route::{self, Router},
        settle::{self, End, Held},
        tunnel,
        upgrade::{self, Upgrade, UpgradeError},
        upstream::{BodyEnd, BodyRead, BodyWatch, Origin, Proxy, UpstreamBody, prepare},
    },
    limit::DEFAULT_MAX_CLIENTS,
    limit::{GroupLimiter, KeyKind},
    obs::metrics::{GroupMetrics, Metrics, Outcome},
    shield::escalate::{Blocklist, Escalator, KeySource},
    time::Clock,
};

/// A request on its way upstream: what the request path decided about it.
#[derive(Debug)]
struct Job<'p> {
    origin: Origin,
    upgrade: Option<Upgrade>,
    /// The route has `stream = true`.
    stream_route: bool,
    /// Admitted in a limited group (its permit also holds the plane's, if any).
    admitted: Option<Admitted<'p>>,
    /// A pass-through request's request-plane permit.
    plane: Option<Held>,
    /// An upgrade request's plane and key: not charged up front, since a stream is exempt from
    /// the planes, and settled by the answer ([`DeferredPlane`], made once the request is sent:
    /// a request refused before, by its group or the pass-through caps, charges nothing there).
    deferred_plane: Option<(&'p Limited, PrefixKey)>,
    /// The keyed hash of the credential the request carried, to learn from the upstream's
    /// answer whether it is valid.
    credential: Option<PrefixKey>,
    /// A pass-through request's `upstream_max_inflight` slot.
    passthrough: Option<PassSlot>,
    /// A pass-through request's client key: an event-stream answer is limited under it in the
    /// stream group. `None` for a client on the allow list, never limited.
    sse_key: Option<PrefixKey>,
}

impl Job<'_> {
    /// A request decided on nothing yet: no group, no plane, no slot.
    fn new(origin: Origin, upgrade: Option<Upgrade>, stream_route: bool) -> Self {
        Self {
            origin,
            upgrade,
            stream_route,
            admitted: None,
            plane: None,
            deferred_plane: None,
            credential: None,
            passthrough: None,
            sse_key: None,
        }
    }
}

/// A request admitted in `limited`, holding `permit`.
#[derive(Debug)]
struct Admitted<'p> {
    limited: &'p Limited,
    permit: Held,
}

/// A request its plane refused: the plane's 429 (not counted yet: a health probe is answered
/// from the cache instead, and counted there), the plane, and why.
struct PlaneRefusal<'p> {
    answer: Response<ResponseBody>,
    plane: &'p Limited,
    /// The key the plane refused: the client's, or the credential's hash.
    key: PrefixKey,
    rejection: crate::limit::Rejection,
}

/// Why a request does not pass its plane.
enum PlaneStop<'p> {
    /// Its plane refused it.
    Refused(Box<PlaneRefusal<'p>>),
    /// Its credential cannot be read ([`HeadError::CredentialCopies`]): a 400, as for a head
    /// door refuses.
    Bad(HeadError),
}

/// The permit a stream answer holds. A stream is exempt from the request planes: a plane's token
/// taken when the request was admitted is given back, a group's stream keeping its group permit
/// (`admitted`). A pass-through stream (its permit, if any, is the plane's) is limited in the
/// stream group instead, under `sse_key`, the client's key: the plane's token is given back only
/// once the stream group admits it, and spent when it refuses, so that an event-stream answer
/// never leaves a request charged nowhere. Without a key (a client on the allow list) the stream
/// is not limited.
///
/// # Errors
/// The stream group's 429 or 503 when it refuses the stream.
fn stream_permit(
    policy: &Policy,
    permit: Option<Held>,
    admitted: bool,
    sse_key: Option<PrefixKey>,
) -> Result<Option<Held>, Box<Response<ResponseBody>>> {
    if admitted {
        return Ok(permit.map(|mut p| {
            p.refund_plane();
            p
        }));
    }
    let (Some(key), Some(streams)) = (sse_key, policy.limited.get(STREAM_GROUP)) else {
        return Ok(permit);
    };
    match settle::admit(streams.group(), key) {
        Ok(stream) => {
            if let Some(plane) = permit {
                plane.refund();
            }
            Ok(Some(stream))
        }
        Err(r) => {
            settle::refused(streams.metrics(), &r);
            if let Some(plane) = permit {
                plane.settle(End::Answered(StatusCode::TOO_MANY_REQUESTS));
            }
            Err(Box::new(answer::rejected(STREAM_GROUP, &r)))
        }
    }
}

/// A layer-7 list: the top-level one (`allow`, `deny`) and the one written in the `[xdp]` table
/// (`xdp.allow`, `xdp.deny`), which is the same list (as a file that lists them after `[xdp]`
/// means: docs/decisions.md, "`xdp.allow` and `xdp.deny`").
fn listed_in(top: &[IpNet], xdp: &[IpNet]) -> Vec<IpNet> {
    top.iter().chain(xdp).copied().collect()
}

/// An upgrade request's request plane (`Job::deferred_plane`): not charged before the request is
/// sent, since a stream is exempt from the planes (an upgrade is never refused by a plane its
/// client spent on requests), and settled by the answer: [`DeferredPlane::stream`] for a `101` or
/// an event stream, [`DeferredPlane::answered`] for any other answer (which the plane may still
/// refuse: the header alone takes no request past the planes), [`DeferredPlane::failed`] for
/// none. Dropped unsettled (the client went away before the answer), it is charged as abandoned:
/// hanging up never helps a client.
#[derive(Debug)]
struct DeferredPlane<'p> {
    plane: &'p Limited,
    key: PrefixKey,
    settled: bool,
}

impl<'p> DeferredPlane<'p> {
    fn new(plane: &'p Limited, key: PrefixKey) -> Self {
        Self {
            plane,
            key,
            settled: false,
        }
    }

    /// A stream answer: exempt, nothing spent. Returns whether the plane had a token for the
    /// request (taken and given back at once, as an event stream's is), which is what lets its
    /// answer verify its credential, as for any request a plane admits.
    fn stream(mut self) -> bool {
        self.settled = true;
        match settle::admit(self.plane.group(), self.key) {
            Ok(held) => {
                held.refund();
                true
            }
            Err(rejection) => {
                self.plane.limiter.uncount_rejection(&self.key, &rejection);
                false
            }
        }
    }

    /// An answer that is no stream, with `status`: charged to the plane as a request admitted
    /// before it was sent.
    ///
    /// # Errors
    /// The plane's 429, counted there, when it has no token: the upstream's answer is then not
    /// relayed (as a pass-through event stream the stream group refuses).
    fn answered(mut self, status: StatusCode) -> Result<(), Box<Response<ResponseBody>>> {
        self.settled = true;
        match settle::admit(self.plane.group(), self.key) {
            Ok(held) => {
                held.settle(End::Answered(status));
                Ok(())
            }
            Err(rejection) => {
                settle::refused(self.plane.metrics(), &rejection);
                Err(Box::new(answer::rejected_by_plane(
                    self.plane.limiter.group(),
                    &rejection,
                )))
            }
        }
    }

    /// Settles `deferred` (if any) by the answer's `status`: [`DeferredPlane::stream`] when the
    /// answer is a stream (`stream`), [`DeferredPlane::answered`] otherwise. Whether the plane
    /// admitted the request (`true` without a deferred plane: the plane, if any, admitted it
    /// before it was sent).
    ///
    /// # Errors
    /// The plane's 429 from [`DeferredPlane::answered`].
    fn settle(
        deferred: Option<Self>,
        status: StatusCode,
        stream: bool,
    ) -> Result<bool, Box<Response<ResponseBody>>> {
        match deferred {
            None => Ok(true),
            Some(d) if stream => Ok(d.stream()),
            Some(d) => d.answered(status).map(|()| true),
        }
    }

    /// No answer (`end`: the upstream failed, or the body missed its deadline): charged as any
    /// request the plane admits; nothing when it has no token left.
    fn failed(mut self, end: End) {
        self.settled = true;
        self.charge(end);
    }

    fn charge(&self, end: End) {
        match settle::admit(self.plane.group(), self.key) {
            Ok(held) => held.settle(end),
            Err(rejection) => self.plane.limiter.uncount_rejection(&self.key, &rejection),
        }
    }
}

/// How a request the upstream call `failed` ends, for its budget: its body missed its deadline,
/// its client went away, or the upstream gave no answer.
fn ending(failed: &Failure) -> End {
    match failed {
        Failure::BodyTimeout => End::BodyTimeout,
        Failure::ClientGone => End::Abandoned,
        _ => End::Unanswered,
    }
}

/// Settles a request that has no upstream answer to relay (`end`): its permit, and an upgrade's
/// deferred plane ([`DeferredPlane::failed`]).
fn settle_unanswered(permit: Option<Held>, deferred: Option<DeferredPlane<'_>>, end: End) {
    if let Some(permit) = permit {
        permit.settle(end);
    }
    if let Some(d) = deferred {
        d.failed(end);
    }
}

impl Drop for DeferredPlane<'_> {
    fn drop(&mut self) {
        if !self.settled {
            self.charge(End::Abandoned);
        }
    }
}

/// Whether a response is server-sent events (`Content-Type: text/event-stream`, WHATWG HTML
/// §9.2).
fn is_event_stream(headers: &http::HeaderMap) -> bool {
    const TYPE: &[u8] = b"text/event-stream";
    // Compared as bytes, without splitting or trimming a string: every response is asked.
    headers.get(header::CONTENT_TYPE).is_some_and(|v| {
        let v = v.as_bytes().trim_ascii_start();
        v.get(..TYPE.len())
            .is_some_and(|t| t.eq_ignore_ascii_case(TYPE))
            && v.get(TYPE.len()..)
                .is_some_and(|rest| matches!(rest.trim_ascii_start().first(), None | Some(b';')))
    })
}

/// The name of the group whose over-budget requests are answered from the health cache.
pub const HEALTH_GROUP: &str = "health";

/// One limited group on the request path.
#[derive(Debug)]
struct Limited {
    limiter: Arc<GroupLimiter>,
    /// The group's shards and instruments as an admitted request holds them (admissions and
    /// settlements are counted on the instruments): one holder per worker thread
    /// ([`Limited::group`]), this one worker 0's (and any other thread's)...
    group: Arc<settle::Group>,
    /// ... and these the other workers', in order.
    others: Box<[Arc<settle::Group>]>,
    read_timeout: Duration,
    /// The precomputed `RateLimit-Policy` value; `None` when the fields are off (or the group
    /// name cannot be a structured-field string).
    policy: Option<HeaderValue>,
    /// The group name as a structured-field string (`"link"`), for `RateLimit`.
    sf_name: String,
    health: bool,
    /// A request plane's (`session`, `ip`), not a group's: a reload never hands one's limiter,
    /// rows and all, to the other of the same name.
    plane: bool,
}

impl Limited {
    /// The group's holder for the worker thread running this code ([`crate::http::worker`]): what
    /// an admitted request's permit keeps a reference to.
    fn group(&self) -> &Arc<settle::Group> {
        crate::http::worker::index()
            .checked_sub(1)
            .and_then(|i| self.others.get(i))
            .unwrap_or(&self.group)
    }

    /// The group's instruments: admissions and settlements are counted here.
    fn metrics(&self) -> &GroupMetrics {
        self.group().metrics()
    }

    /// Sets this group's `RateLimit-Policy` and `RateLimit` fields for client `key` on a
    /// response (appended to another group's or plane's, as a list), when they are on.
    fn ratelimit_fields(&self, headers: &mut http::HeaderMap, key: &PrefixKey) {
        if let Some(policy) = &self.policy {
            let q = self.limiter.quota(key);
            answer::ratelimit_fields(headers, policy, &self.sf_name, q);
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
    /// With `[plane.session]`: where a request's credential is (the planes are groups in
    /// `limited` named `session` and `ip`).
    credential: Option<Credential>,
    /// Clients never limited (`allow` and `xdp.allow`).
    allow: Vec<IpNet>,
    /// Clients refused with 403 (`deny` and `xdp.deny`).
    deny: Vec<IpNet>,
    forwarded_header: ForwardedSource,
    escalator: Option<Arc<Escalator>>,
    /// `(escalate_after, escalate_window, block_for)` the escalator was built with.
    escalation: (u32, Duration, Duration),
}

/// How many verified credentials the session plane remembers: its `max_clients`.
fn session_capacity(config: &Config) -> usize {
    config
        .planes
        .as_ref()
        .map_or(DEFAULT_MAX_CLIENTS, |p| p.session.max_clients)
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
    /// A stream silent this long is closed (`stream_idle_timeout`).
    stream_idle_timeout: Duration,
    /// A response held to its end whose client takes nothing of it this long is ended
    /// (`send_timeout`).
    send_timeout: Duration,
    /// A pass-through request body that gets no part from its client for this long while door
    /// waits for it is ended, 408 (`body_read_timeout`).
    body_read_timeout: Duration,
    /// Upgraded connections' tunnels, closed at the end of a drain.
    tunnels: std::sync::Mutex<JoinSet<()>>,
    /// Pass-through requests forwarded now, against `upstream_max_inflight`.
    passthrough: Arc<PassThrough>,
    /// Verified credentials, for the session plane (kept across reloads).
    sessions: Sessions,
    health: CachedHealth,
    draining: Arc<AtomicBool>,
    active: Arc<Active>,
}

impl Policy {
    /// The route of `req` ([`Router::route_for_either`]): its method, the methods it names in
    /// its method-override fields and `_method` parameters ([`route::method_override`]), its
    /// path.
    fn route<B>(&self, req: &Request<B>) -> Option<&route::Route> {
        let (method, uri) = (req.method(), req.uri());
        let overrides =
            || route::method_override(method, uri.query(), req.headers(), |m| self.router.lists(m));
        self.router.route_for_either(method, overrides, uri.path())
    }

    /// The rules of `config`; with `previous`, groups (and planes) that already existed keep their
    /// limiter, retuned in place to the new budget and shadow mode (buckets carry over in
    /// proportion, see [`GroupLimiter::retune`]) unless the charge mode changed; the escalator is
    /// kept if its settings did not change (its counts carry over). The request planes are
    /// limited groups named `session` and `ip`.
    fn build(
        config: &Config,
        clock: &Arc<dyn Clock>,
        metrics: &Metrics,
        blocklist: Option<&Arc<dyn Blocklist>>,
        previous: Option<&Policy>,
    ) -> Self {
        let enforce = !config.disable_anon_route_limits;
        let planes = config.planes.iter().flat_map(|p| {
            [(SESSION_PLANE, p.session), (IP_PLANE, p.ip)].map(|(name, budget)| {
                let read_timeout = config.upstream_timeout;
                (name.to_owned(), budget, read_timeout, true)
            })
        });
        let limited = config
            .groups
            .iter()
            .map(|(name, g)| (name.clone(), g.budget, g.read_timeout, false))
            .chain(planes)
            .map(|(name, budget, read_timeout, plane)| {
                let name = &name;
                let g = crate::config::GroupConfig {
                    budget,
                    read_timeout,
                    per_client_follows: None,
                };
                let g = &g;
                let kept = previous
                    .and_then(|p| p.limited.get(name))
                    .filter(|l| l.plane == plane)
                    .map(|l| &l.limiter)
                    .filter(|l| l.budget().charge == g.budget.charge);
                if let Some(l) = kept
                    && (l.configured_budget() != g.budget || l.enforcing() != enforce)
                {
                    l.retune(g.budget, enforce);
                }
                let group_metrics = Arc::new(metrics.clone().for_group(name));
                let limiter = match kept {
                    Some(l) => Arc::clone(l),
                    None => Arc::new(
                        GroupLimiter::new(
                            name,
                            g.budget,
                            enforce,
                            Arc::clone(clock),
                            Arc::clone(&group_metrics) as Arc<dyn crate::limit::Observer>,
                        )
                        .keyed_by(if plane && name == SESSION_PLANE {
                            KeyKind::Credential
                        } else {
                            KeyKind::Client
                        }),
                    ),
                };
                let sf_name = answer::sf_string(name);
                let policy = config
                    .ratelimit_headers
                    .then(|| answer::ratelimit_policy(&sf_name, g.budget.burst, limiter.window_s()))
                    .flatten();
                let l = Limited {
                    // One holder per worker thread, so that the reference a request's permit
                    // takes is counted on its own worker's cache line (docs/decisions.md, "The
                    // permit reaches its shards through its holder's reference").
                    group: Arc::new(settle::Group::new(&limiter, Arc::clone(&group_metrics))),
                    others: (1..crate::http::worker::count())
                        .map(|_| Arc::new(settle::Group::new(&limiter, Arc::clone(&group_metrics))))
                        .collect(),
                    limiter,
                    read_timeout: g.read_timeout,
                    policy,
                    sf_name,
                    health: name == HEALTH_GROUP,
                    plane,
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
            credential: config.planes.as_ref().map(|p| p.credential.clone()),
            allow: listed_in(&config.allow, &config.xdp.allow),
            deny: listed_in(&config.deny, &config.xdp.deny),
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
        let passthrough = Arc::new(PassThrough::new(
            config.upstream_max_inflight,
            config.upstream_max_inflight_per_client,
        ));
        // `door.passthrough_inflight` and `door.passthrough_refused`, read from the caps.
        metrics.observe_passthrough(&passthrough);
        Self {
            policy: std::sync::RwLock::new(Arc::new(policy)),
            clock: Arc::clone(clock),
            blocklist,
            proxy: Proxy::new(config.upstream.clone(), config.upstream_timeout),
            metrics: metrics.clone(),
            warned_untrusted_xff: AtomicBool::new(false),
            upstream_timeout: config.upstream_timeout,
            stream_idle_timeout: config.stream_idle_timeout,
            send_timeout: config.send_timeout,
            body_read_timeout: config.body_read_timeout,
            tunnels: std::sync::Mutex::new(JoinSet::new()),
            sessions: Sessions::new(session_capacity(config)),
            passthrough,
            health: CachedHealth::new(Arc::clone(clock), HEALTH_TTL, Arc::clone(&draining)),
            draining,
            active: Arc::default(),
        }
    }

    /// The rules in force now (a snapshot: a reload swaps in a new one).
    pub(crate) fn policy(&self) -> Arc<Policy> {
        Arc::clone(&self.policy.read().unwrap_or_else(PoisonError::into_inner))
    }

    /// Applies a reloaded configuration (SIGHUP) without touching connections: routes, groups,
    /// trusted proxies, the authoritative forwarding header and the escalation settings. A group
    /// that already existed keeps its limiter, retuned to its new budget: its clients' buckets
    /// carry over in proportion and in-flight counts carry over (a group whose charge mode
    /// changed, and a new group, start fresh); outcome counts always carry over. Settings read
    /// only at start (listen, upstream, TLS on or off, timeouts, XDP interface and mode) need a
    /// restart: the list of those in which `new` differs from `started`, the configuration door
    /// started with (whose values they keep until a restart), is returned so the caller can say
    /// so.
    pub fn reload(&self, new: &Config, started: &Config) -> Vec<&'static str> {
        let current = self.policy();
        let policy = Policy::build(
            new,
            &self.clock,
            &self.metrics,
            self.blocklist.as_ref(),
            Some(&current),
        );
        *self.policy.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(policy);
        self.sessions.set_capacity(session_capacity(new));
        crate::config::restart_only_changes(started, new)
    }

    /// Forgets the escalator's count for `key`, and its mark as blocked: an operator took it off
    /// the blocklist, so its next `escalate_after` 429s may block it again (nothing without an
    /// escalator).
    pub fn forget_escalation(&self, key: &PrefixKey) {
        if let Some(e) = &self.policy().escalator {
            e.forget(key);
        }
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

    /// Streams of `group` open now (`door.streams`: WebSockets and other tunnels, event-stream
    /// answers).
    pub fn streams_open(&self, group: &str) -> u64 {
        self.metrics.streams(group)
    }

    /// The pass-through caps, what they hold now and what they have refused (`GET /status`,
    /// `passthrough`).
    pub fn passthrough_status(&self) -> PassThroughStatus {
        self.passthrough.status()
    }

    /// Pass-through requests forwarded upstream now (≤ `upstream_max_inflight`).
    pub fn passthrough_in_flight(&self) -> u32 {
        self.passthrough.open()
    }

    /// Clients named by a trusted proxy's forwarding header that have pass-through requests in
    /// flight now, each held to `upstream_max_inflight_per_client` (at most
    /// `upstream_max_inflight`).
    pub fn passthrough_named_clients(&self) -> usize {
        self.passthrough.named_clients()
    }

    /// Requests door is answering now (until their response body has been sent or dropped).
    pub fn requests_in_flight(&self) -> usize {
        self.active.count()
    }

    /// Waits until no request is in flight, at most `grace`; `true` when none is left.
    pub async fn wait_idle(&self, grace: Duration) -> bool {
        self.active.wait_idle(grace).await
    }

    /// Handles one request on connection `conn`.
    ///
    /// The request counts as in flight (on the connection and door-wide) from this call, before
    /// the returned future is first polled: hyper calls the service when it has read a request
    /// head, and spawns an HTTP/2 stream's future to be polled later, so a connection's timers
    /// see the request as soon as its head has arrived.
    pub fn handle(
        self: Arc<Self>,
        conn: Arc<ConnInfo>,
        mut req: Request<Incoming>,
    ) -> impl Future<Output = Response<ResponseBody>> + Send + 'static {
        let guard = ActiveGuard::new(&self.active, &conn, req.version() < Version::HTTP_2);
        async move {
            // Decided when the request starts, like the health answer, so that a response to a
            // request that began before the drain never closes the connection under its client.
            let close = req.version() < Version::HTTP_2 && self.draining();
            // A head door refuses is answered before routing: it spends and holds nothing.
            let version = req.version();
            let mut res = match head::check(&req).and_then(|()| upgrade::classify(&mut req)) {
                Ok(upgrade) => self.route(&conn, req, upgrade).await,
                Err(e) => {
                    self.metrics.request_refused(e.reason());
                    answer::bad_head(&e, version)
                }
            };
            // Not on a `101`: `Connection: close` beside it would break the handshake (RFC 6455
            // §4.1); the tunnel is closed at the end of the drain's grace period instead.
            if close && res.status() != StatusCode::SWITCHING_PROTOCOLS {
                res.headers_mut()
                    .insert(header::CONNECTION, HeaderValue::from_static("close"));
            }
            res.body_mut().active = Some(guard);
            res
        }
    }

    async fn route(
        self: &Arc<Self>,
        conn: &Arc<ConnInfo>,
        req: Request<Incoming>,
        upgrade: Option<Upgrade>,
    ) -> Response<ResponseBody> {
        let policy = self.policy();
        let peer_ip = conn.peer_ip;
        let origin = Origin {
            peer: peer_ip,
            peer_value: conn.peer_value.clone(),
            peer_trusted: policy.trusted.contains(peer_ip) && !conn.unnamed,
            tls: conn.tls,
        };
        let route = policy.route(&req);
        let stream_route = route.is_some_and(|r| r.stream);
        // An upgrade on a route in no group is limited as a stream.
        let group = route
            .map(|r| r.group.as_str())
            .or_else(|| upgrade.as_ref().map(|_| STREAM_GROUP));
        let limited = group.and_then(|g| policy.limited.get(g));
        let listed = (!policy.allow.is_empty() || !policy.deny.is_empty())
            .then(|| self.client(conn, &policy, &req));
        if let Some(res) = self.refused_up_front(&policy, listed.as_ref(), limited) {
            return res;
        }
        if let Some(d) = &listed
            && crate::client::listed(&policy.allow, d.client)
        {
            // Never limited: forwarded as a request in no group, outside the planes.
            self.metrics.allowed();
            let job = Job::new(origin, upgrade, stream_route);
            return self.forward(conn, &policy, req, job).await;
        }
        // A request that only asks for an event stream is charged to its plane like any other
        // until its answer shows it is a stream (then the plane's token is given back, in
        // `forward`): a request header alone must not take a request past the planes. An upgrade
        // (a WebSocket) is not refused by its plane, whose client may have spent it on requests
        // (docs/design.md, "Streams and sessions"): its plane is charged after the answer,
        // unless the answer is a `101` or an event stream; its group (the route's, or the stream
        // group) is charged up front, which bounds what the header can take past the planes.
        let planes = policy.credential.as_ref().filter(|_| !stream_route);
        // Every request's key: a pass-through one's too, since any `text/event-stream` answer is
        // a stream, limited in the stream group under it.
        let decision = listed.unwrap_or_else(|| self.client(conn, &policy, &req));
        let mut job = Job::new(origin, upgrade, stream_route);
        // The request planes first: a request one of them refuses never reaches its group.
        let plane = match planes {
            Some(credential) => {
                // An upgrade's plane is settled by its answer (a stream is exempt), but a health
                // probe's is not: a plane's refusal of a probe is answered from the cache.
                let defer = job.upgrade.is_some() && !limited.is_some_and(|l| l.health);
                match self.admit_plane(&policy, credential, &req, decision.key, &mut job, defer) {
                    Ok(plane) => plane,
                    Err(PlaneStop::Refused(r)) => {
                        let refused =
                            self.plane_refused(limited, *r, req, job.origin, decision.key);
                        return Box::pin(refused).await;
                    }
                    Err(PlaneStop::Bad(e)) => {
                        self.metrics.request_refused(e.reason());
                        return answer::bad_head(&e, req.version());
                    }
                }
            }
            None => None,
        };
        let Some(limited) = limited else {
            let whose = Whose::of(conn.peer_inflight(), &decision);
            let slot = match self.passthrough.take(whose) {
                Ok(slot) => slot,
                Err(refusal) => {
                    if let Some(held) = job.plane.take() {
                        held.refund();
                    }
                    return answer::upstream_busy(refusal == PassRefusal::Client);
                }
            };
            job.passthrough = Some(slot);
            // An event-stream answer is limited in the stream group under the client's key.
            job.sse_key = Some(decision.key);
            let mut res = self.forward(conn, &policy, req, job).await;
            if let Some((p, key)) = plane {
                answer::clear_ratelimit_fields(res.headers_mut());
                p.ratelimit_fields(res.headers_mut(), &key);
            }
            return res;
        };
        let mut res = match settle::admit(limited.group(), decision.key) {
            Ok(permit) => {
                let permit = match job.plane.take() {
                    Some(plane) => permit.with_plane(plane),
                    None => permit,
                };
                job.admitted = Some(Admitted { limited, permit });
                self.forward(conn, &policy, req, job).await
            }
            Err(rejection) => {
                // Refused by its group: the plane spends nothing for it.
                if let Some(held) = job.plane.take() {
                    held.refund();
                }
                if limited.health {
                    // Never refused, so never escalated (probes of a load balancer or an uptime
                    // monitor past the budget must not get the prober's SYNs dropped), nor shown
                    // as a rejection of its row.
                    limited.limiter.uncount_rejection(&decision.key, &rejection);
                    Box::pin(self.cached_health(limited, req, job.origin)).await
                } else {
                    self.escalate(conn, &policy, &decision, &rejection);
                    settle::refused(limited.metrics(), &rejection);
                    answer::rejected(limited.limiter.group(), &rejection)
                }
            }
        };
        answer::clear_ratelimit_fields(res.headers_mut());
        limited.ratelimit_fields(res.headers_mut(), &decision.key);
        if let Some((p, key)) = plane {
            p.ratelimit_fields(res.headers_mut(), &key);
        }
        res
    }

    /// door's answer to a request it refuses before any limit: 403 to a client on the deny list
    /// (`listed` is its key when there are lists), 503 to a health probe while draining. Both come
    /// before the allow list: a load balancer on it must see the drain too.
    fn refused_up_front(
        &self,
        policy: &Policy,
        listed: Option<&KeyDecision>,
        limited: Option<&Limited>,
    ) -> Option<Response<ResponseBody>> {
        if listed.is_some_and(|d| crate::client::listed(&policy.deny, d.client)) {
            self.metrics.denied();
            return Some(answer::forbidden());
        }
        (limited.is_some_and(|l| l.health) && self.draining())
            .then(|| answer::health_response(StatusCode::SERVICE_UNAVAILABLE, "draining"))
    }

    /// Tells the escalator about a rejection of the TCP peer itself; the escalator counts only
    /// 429s of the client's own row ([`crate::shield::escalate::counts`]: a 429 of the shared row
    /// is the doing of every client without a row). A peer named by a trusted proxy's PROXY
    /// header was learned through that proxy and is never escalated (docs/design.md, "Flood
    /// shield"). A key put on the blocklist is counted on `door.escalations`.
    fn escalate(
        &self,
        conn: &ConnInfo,
        policy: &Policy,
        decision: &KeyDecision,
        rejection: &crate::limit::Rejection,
    ) {
        if let Some(e) = &policy.escalator {
            let source = if conn.proxied {
                KeySource::ThroughProxy
            } else {
                KeySource::of(decision)
            };
            if e.on_rejection(decision.key, source, rejection) {
                self.metrics.escalated();
            }
        }
    }

    /// Learns from the upstream's `status` whether the request's `credential` (if any) is valid
    /// ([`Sessions::learn`]): only from an answer its plane admitted (`admitted`), so that an
    /// answer a plane refused verifies nothing; a 401 or 403 unverifies it whatever the plane
    /// said.
    fn learn(&self, credential: Option<PrefixKey>, status: StatusCode, admitted: bool) {
        let unverifies = matches!(status, StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN);
        if (admitted || unverifies)
            && let Some(credential) = credential
        {
            self.sessions.learn(credential, status);
        }
    }

    /// Charges a request that is not a stream to its request plane (docs/design.md, "Streams and
    /// sessions", Planes): the plane's permit and the credential's hash go into `job`; the plane
    /// and key are returned for the `RateLimit` fields. An upgrade (`defer`) is not admitted: its
    /// plane and key go into `job` to be settled by its answer ([`DeferredPlane`]), and are
    /// returned as well.
    ///
    /// # Errors
    /// [`PlaneStop::Refused`] with the plane's 429 when it refuses the request;
    /// [`PlaneStop::Bad`] when its credential cannot be read ([`Sessions::choose`]).
    fn admit_plane<'p>(
        &self,
        policy: &'p Policy,
        credential: &Credential,
        req: &Request<Incoming>,
        client: PrefixKey,
        job: &mut Job<'p>,
        defer: bool,
    ) -> Result<Option<(&'p Limited, PrefixKey)>, PlaneStop<'p>> {
        let choice = self
            .sessions
            .choose(credential, req.headers(), client)
            .map_err(PlaneStop::Bad)?;
        job.credential = choice.credential;
        let Some(p) = policy.limited.get(choice.plane) else {
            return Ok(None);
        };
        if defer {
            job.deferred_plane = Some((p, choice.key));
            return Ok(Some((p, choice.key)));
        }
        match settle::admit(p.group(), choice.key) {
            Ok(held) => {
                job.plane = Some(held);
                Ok(Some((p, choice.key)))
            }
            Err(rejection) => {
                let mut answer = answer::rejected_by_plane(choice.plane, &rejection);
                p.ratelimit_fields(answer.headers_mut(), &choice.key);
                Err(PlaneStop::Refused(Box::new(PlaneRefusal {
                    answer,
                    plane: p,
                    key: choice.key,
                    rejection,
                })))
            }
        }
    }

    /// The answer to a request its plane refused: the plane's 429, counted on the plane, except
    /// for a probe of the health group, which is never refused (docs/design.md, "Cached health")
    /// and gets the cached status, counted as `cached`, as one its group refuses.
    ///
    /// `route` boxes its future, as it boxes [`Self::cached_health`]'s: they are rarely taken,
    /// and in place they would size every request's future (docs/decisions.md, "A request's
    /// future on the heap…").
    async fn plane_refused(
        &self,
        limited: Option<&Limited>,
        refused: PlaneRefusal<'_>,
        req: Request<Incoming>,
        origin: Origin,
        key: PrefixKey,
    ) -> Response<ResponseBody> {
        let Some(health) = limited.filter(|l| l.health) else {
            settle::refused(refused.plane.metrics(), &refused.rejection);
            return refused.answer;
        };
        // Answered from the cache, not refused: no rejection of the plane's row.
        refused
            .plane
            .limiter
            .uncount_rejection(&refused.key, &refused.rejection);
        let mut res = self.cached_health(health, req, origin).await;
        health.ratelimit_fields(res.headers_mut(), &key);
        res
    }

    /// The client key of `req`, counting (and warning once about) forwarding headers ignored
    /// from an untrusted local peer.
    fn client(&self, conn: &ConnInfo, policy: &Policy, req: &Request<Incoming>) -> KeyDecision {
        let peer_ip = key::canonical(conn.peer.ip());
        // A proxy that named no client in its PROXY header relays forwarding fields it did not
        // write: keyed as the proxy, as if no proxy were trusted.
        let none = TrustedProxies::default();
        let trusted = if conn.unnamed { &none } else { &policy.trusted };
        let decision = key::client_key(peer_ip, req.headers(), trusted, policy.forwarded_header);
        if decision.ignored_untrusted_xff {
            if conn.unnamed {
                self.unnamed_forwarding(peer_ip);
            } else {
                self.untrusted_forwarding(peer_ip);
            }
        }
        decision
    }

    /// Counts (and warns once about) forwarding headers ignored on a connection whose PROXY
    /// protocol header named no client: `door.untrusted_xff` too.
    fn unnamed_forwarding(&self, proxy: std::net::IpAddr) {
        static WARNED: AtomicBool = AtomicBool::new(false);
        self.metrics.untrusted_xff();
        if !WARNED.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                %proxy,
                "ignoring X-Forwarded-For/Forwarded on connections whose PROXY protocol header \
                 names no client (LOCAL, UNKNOWN, a Unix socket): their clients are keyed as the \
                 proxy; have the proxy send the client's address (counted in door.untrusted_xff; \
                 warned once)"
            );
        }
    }

    /// door's answer to `f` ([`answer::failure_response`]), counted in `door.requests_failed`.
    fn failed(&self, f: &Failure) -> Response<ResponseBody> {
        self.metrics.request_failed(f.reason());
        answer::failure_response(f)
    }

    /// Counts (and warns once about) forwarding headers ignored from `peer_ip`, an untrusted local
    /// peer: `door.untrusted_xff`.
    fn untrusted_forwarding(&self, peer_ip: std::net::IpAddr) {
        self.metrics.untrusted_xff();
        if !self.warned_untrusted_xff.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                %peer_ip,
                "ignoring X-Forwarded-For/Forwarded from an untrusted local peer: if it is a \
                 proxy, add it to trusted_proxies (counted in door.untrusted_xff; warned once)"
            );
        }
    }

    /// Forwards a request door decided to send: admitted in its group (`job.admitted`) or
    /// pass-through (`job.passthrough`).
    ///
    /// - A limited request's body must arrive within the group's read timeout (else 408,
    ///   upstream aborted), a pass-through request's body must not keep door waiting for its
    ///   next part for `body_read_timeout` (else the same); the permit settles when the
    ///   response body ends, or once the response has been sending for the group's read timeout
    ///   (a slow reader keeps its connection, not a limiter slot). From that deadline on, a
    ///   response that moves nothing (no frame from the upstream, no byte of it sent to the
    ///   client) for another read timeout is ended upstream (see [`crate::http::body`]); a
    ///   pass-through response whose client takes nothing of a frame door holds for
    ///   `send_timeout` is too.
    /// - A stream (a `stream = true` route, a `text/event-stream` answer) has no body deadline
    ///   and no upstream timeout; it holds its slot until it ends and is ended, upstream too,
    ///   after `stream_idle_timeout` without a frame. A pass-through `text/event-stream` answer is admitted
    ///   in the stream group when it arrives (429 if over).
    /// - An upgrade whose upstream answers `101` becomes a tunnel (see [`crate::http::upgrade`]);
    ///   any other answer is relayed as a normal response, but for a `2xx` to an extended CONNECT
    ///   (a 502: to an HTTP/2 client it would mean the tunnel is open).
    ///
    /// The call runs inside this request's future: a client that goes away (connection closed or
    /// reset, HTTP/2 RST_STREAM) drops it, which aborts the upstream call and drops the permit
    /// unsettled, settling it as abandoned (docs/design.md, "Limits"). The request is rewritten
    /// and handed to the pooled client when this is called (from the request's future); the
    /// returned future holds the call, the permit and what the answer needs, not the request
    /// (docs/decisions.md, "A request's future on the heap…").
    fn forward<'a>(
        self: &'a Arc<Self>,
        conn: &'a Arc<ConnInfo>,
        policy: &'a Policy,
        mut req: Request<Incoming>,
        job: Job<'a>,
    ) -> impl Future<Output = Response<ResponseBody>> + Send + use<'a> {
        let Job {
            origin,
            upgrade,
            stream_route,
            admitted,
            plane,
            deferred_plane,
            credential,
            mut passthrough,
            sse_key,
        } = job;
        let on_client = upgrade.as_ref().map(|_| hyper::upgrade::on(&mut req));
        // From here on the request goes upstream: an upgrade's plane is settled by its answer,
        // or as abandoned if this future is dropped first.
        let deferred_plane = deferred_plane.map(|(p, key)| DeferredPlane::new(p, key));
        let (parts, body) = req.into_parts();
        let method = parts.method.clone();
        let health = admitted.as_ref().is_some_and(|a| a.limited.health);
        // Only a body-less probe's answer may stand for the application's health (a POST's 405, or
        // a 502 door gave for a client's broken body, must not be served to other probes), and of
        // its answers only those that do not depend on who asked (`health::speaks_for_health`).
        let feeds_cache = health && matches!(method, Method::GET | Method::HEAD);
        let read = self.body_read(admitted.as_ref(), stream_route, upgrade.as_ref());
        let (mut body, mut watch) = UpstreamBody::new(body, read, self.upstream_timeout);
        // A pass-through request holds its slot until its body has been sent too.
        body.hold(passthrough.as_mut(), watch.as_mut());
        let up = Request::from_parts(parts, body);
        // Handed to the upstream now: the future below holds the call, not the request.
        // A stream's response has no head deadline, but an upgrade's `101` is a handshake: it
        // must come within `upstream_timeout` on a stream route too.
        let head_timeout = !stream_route || upgrade.is_some();
        let call = self.call(up, &origin, watch, upgrade.as_ref(), head_timeout);
        async move {
            let result = call.await;
            let (permit, read_timeout) = match admitted {
                Some(a) => (Some(a.permit), Some(a.limited.read_timeout)),
                None => (plane, None),
            };
            let res = match result {
                Ok(res) => res,
                Err(f) => {
                    settle_unanswered(permit, deferred_plane, ending(&f));
                    let res = self.failed(&f);
                    if feeds_cache
                        && !matches!(
                            f,
                            Failure::BodyTimeout | Failure::ClientGone | Failure::UpstreamStalled
                        )
                    {
                        self.health.record(res.status());
                    }
                    return res;
                }
            };
            let status = res.status();
            let switched = status == StatusCode::SWITCHING_PROTOCOLS;
            let streams = stream_route || is_event_stream(res.headers());
            if !switched && let Some(Err(e)) = upgrade.as_ref().map(|u| u.check_refusal(status)) {
                settle_unanswered(permit, deferred_plane, End::Unanswered);
                return self.failed(&Failure::Protocol(e));
            }
            // Only an answer the plane admitted verifies a credential.
            let admitted_by_plane =
                match DeferredPlane::settle(deferred_plane, status, switched || streams) {
                    Ok(admitted) => admitted,
                    Err(refused) => {
                        if let Some(permit) = permit {
                            permit.settle(End::Answered(status));
                        }
                        return *refused;
                    }
                };
            self.learn(credential, status, admitted_by_plane);
            if switched {
                return self.switch(conn, &method, upgrade, on_client, res, permit);
            }
            if feeds_cache {
                self.health.record(status);
            }
            if streams {
                let admitted_in_group = read_timeout.is_some();
                let permit = match stream_permit(policy, permit, admitted_in_group, sse_key) {
                    Ok(permit) => permit,
                    Err(refused) => return *refused,
                };
                let open = permit
                    .as_ref()
                    .and_then(Held::metrics)
                    .map(GroupMetrics::stream_opened);
                let idle = self.stream_idle_timeout;
                let mut out =
                    res.map(|b| ResponseBody::stream(b, permit.map(|p| (p, status)), idle, open));
                out.body_mut().passthrough = passthrough.map(PassSlot::answered);
                return out;
            }
            let mut out = match (permit, read_timeout) {
                (Some(p), Some(deadline)) => res.map(|b| {
                    ResponseBody::settling(b, p, status, Some(deadline), self.send_timeout)
                }),
                // A pass-through request's plane permit: no caps to free early, held to the end.
                (Some(p), None) => {
                    res.map(|b| ResponseBody::settling(b, p, status, None, self.send_timeout))
                }
                (None, _) => res.map(|b| ResponseBody::upstream(b, self.send_timeout)),
            };
            out.body_mut().passthrough = passthrough.map(PassSlot::answered);
            out
        }
    }

    /// How the body of a request forwarded with `admitted` (`None`: pass-through) must arrive:
    /// whole within its group's `read_timeout`, or, pass-through, with no wait for a part longer
    /// than `body_read_timeout`; streams (a `stream = true` route, an extended CONNECT, whose
    /// request body is its tunnel) under no bound. An HTTP/1.1 upgrade's body (if any) comes
    /// before the switch, so it has the bound of any other.
    fn body_read(
        &self,
        admitted: Option<&Admitted<'_>>,
        stream_route: bool,
        upgrade: Option<&Upgrade>,
    ) -> Option<BodyRead> {
        let tunnel_body = matches!(upgrade, Some(Upgrade::ExtendedConnect { .. }));
        (!stream_route && !tunnel_body).then(|| {
            admitted.map_or(BodyRead::Idle(self.body_read_timeout), |a| {
                BodyRead::Deadline(a.limited.read_timeout)
            })
        })
    }

    /// Sends `req` upstream. While the request body is still being sent, only its read deadline
    /// or idle timeout applies (`body` says when it ended or missed it, and, when the upstream
    /// was not taking it then, whether it took nothing for a further `upstream_timeout`:
    /// [`BodyWatch::end`]); once it has been sent in full (at once for a request without a
    /// body), the upstream has `upstream_timeout` to answer with its response head.
    ///
    /// The request is prepared and handed to the pooled client before the returned future is
    /// first polled: that future holds the client's future, the body's events and the upstream
    /// head timeout, not the request (docs/decisions.md, "A request's future on the heap…").
    fn call<'a>(
        &'a self,
        req: Request<UpstreamBody>,
        origin: &Origin,
        body: Option<BodyWatch>,
        upgrade: Option<&Upgrade>,
        head_timeout: bool,
    ) -> impl Future<Output = Result<Response<Incoming>, Failure>> + Send + use<'a> {
        let mut req = prepare(req, self.proxy.upstream(), origin);
        if let Some(upgrade) = upgrade {
            upgrade.restore(&mut req);
        }
        let upstream = self.proxy.forward(req);
        let upstream_timeout = head_timeout.then_some(self.upstream_timeout);
        // Boxed: only a request with a body pays for the watch's future.
        let body = body.map(|w| (w.guards_slot(), Box::pin(w.end(self.upstream_timeout))));
        async move {
            tokio::pin!(upstream);
            if let Some((guards_slot, mut body)) = body {
                tokio::select! {
                    biased;
                    end = &mut body => match end {
                        BodyEnd::TimedOut => return Err(Failure::BodyTimeout),
                        BodyEnd::ClientGone => return Err(Failure::ClientGone),
                        BodyEnd::UpstreamStalled => return Err(Failure::UpstreamStalled),
                        BodyEnd::Sent => {}
                    },
                    r = upstream.as_mut() => {
                        // Answered before the body was sent: the upstream may read on, or stop
                        // reading and keep its connection open; the watch goes on in a task of
                        // its own, to let go of the body's share of the slot if it does.
                        if guards_slot && r.is_ok() {
                            drop(tokio::spawn(body));
                        }
                        return r.map_err(Failure::Upstream);
                    }
                }
            }
            let Some(upstream_timeout) = upstream_timeout else {
                return upstream.await.map_err(Failure::Upstream);
            };
            match tokio::time::timeout(upstream_timeout, upstream).await {
                Ok(r) => r.map_err(Failure::Upstream),
                Err(_) => Err(Failure::UpstreamTimeout),
            }
        }
    }

    /// The upstream switched protocols: checks that the request asked for it, answers the client
    /// (`101`, or `200` to an extended CONNECT), and once both sides have switched, runs the
    /// tunnel in a task of its own, holding the stream's limiter slot (and the client
    /// connection's) until it closes.
    fn switch(
        self: &Arc<Self>,
        conn: &Arc<ConnInfo>,
        method: &Method,
        upgrade: Option<Upgrade>,
        on_client: Option<hyper::upgrade::OnUpgrade>,
        mut res: Response<Incoming>,
        permit: Option<Held>,
    ) -> Response<ResponseBody> {
        let checked = match (upgrade, on_client) {
            (Some(upgrade), Some(on_client)) => {
                upgrade.check(method, &res).map(|()| (upgrade, on_client))
            }
            _ => Err(UpgradeError::Unrequested),
        };
        let (upgrade, on_client) = match checked {
            Ok(ok) => ok,
            Err(e) => {
                if let Some(permit) = permit {
                    permit.settle(End::Unanswered);
                }
                return self.failed(&Failure::Protocol(e));
            }
        };
        // A stream now: the request planes do not charge it.
        let permit = permit.map(|mut p| {
            p.refund_plane();
            p
        });
        let on_upstream = hyper::upgrade::on(&mut res);
        let answer = upgrade.client_response(res.headers());
        let open = permit
            .as_ref()
            .and_then(Held::metrics)
            .map(GroupMetrics::stream_opened);
        // In flight until it closes: the drain waits for it within its grace period.
        let http1 = matches!(upgrade, Upgrade::Http1 { .. });
        let active = ActiveGuard::new(&self.active, conn, http1);
        let conn = Arc::clone(conn);
        let clock = Arc::clone(&self.clock);
        let idle = self.stream_idle_timeout;
        let tunnel = async move {
            let (client, upstream) = tokio::join!(on_client, on_upstream);
            if let (Ok(client), Ok(upstream)) = (client, upstream) {
                let (end, up, down) =
                    tunnel::run(TokioIo::new(client), TokioIo::new(upstream), idle, &clock).await;
                tracing::debug!(peer = %conn.peer, ?end, up, down, "tunnel closed");
            }
            if let Some(permit) = permit {
                permit.settle(End::Answered(StatusCode::SWITCHING_PROTOCOLS));
            }
            drop((open, active, conn));
        };
        let mut tunnels = self.tunnels.lock().unwrap_or_else(PoisonError::into_inner);
        while tunnels.try_join_next().is_some() {}
        tunnels.spawn(tunnel);
        answer.map(|()| ResponseBody::empty())
    }

    /// Closes every tunnel (WebSockets and other upgraded connections): the end of a drain's
    /// grace period.
    pub fn close_streams(&self) {
        self.tunnels
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .abort_all();
    }

    /// Upgraded connections open now.
    pub fn tunnels_open(&self) -> usize {
        let mut tunnels = self.tunnels.lock().unwrap_or_else(PoisonError::into_inner);
        while tunnels.try_join_next().is_some() {}
        tunnels.len()
    }

    /// An over-budget health probe gets the last upstream status (cached [`HEALTH_TTL`],
    /// refreshed single-flight), counted as `cached`: a probe never fails because of door's own
    /// limit (docs/design.md, "Limits"). The refresh is door's own probe made from this one: its
    /// target and fields, no body, `HEAD` for a `HEAD` and `GET` otherwise, under
    /// `upstream_timeout`. So an over-budget request of any method reaches the upstream only as a
    /// refresh, one at a time, and never sends it a body door would have to wait for.
    async fn cached_health(
        &self,
        limited: &Limited,
        req: Request<Incoming>,
        origin: Origin,
    ) -> Response<ResponseBody> {
        let refresh = || async move {
            let (mut parts, _body) = req.into_parts();
            if parts.method != Method::HEAD {
                parts.method = Method::GET;
            }
            for framing in [
                header::CONTENT_LENGTH,
                header::TRANSFER_ENCODING,
                header::EXPECT,
            ] {
                parts.headers.remove(framing);
            }
            let probe = Request::from_parts(parts, UpstreamBody::empty());
            match self.call(probe, &origin, None, None, true).await {
                // A 1xx is no answer to a probe door sent without `Upgrade` (hyper's client
                // passes a `101` on): 502, as the forwarding path answers an unrequested switch.
                Ok(res) if res.status().is_informational() => StatusCode::BAD_GATEWAY,
                Ok(res) => res.status(),
                Err(f) => answer::failure_status(&f),
            }
        };
        let status = self.health.status(refresh).await;
        limited.metrics().record(Outcome::Cached);
        answer::health_response(status, "door; hit")
    }
}

#[cfg(test)]
mod tests {
    use super::is_event_stream;

    #[test]
    fn an_event_stream_is_told_by_its_media_type_whatever_its_case_spaces_and_parameters() {
        let of = |value: &str| {
            let mut h = http::HeaderMap::new();
            h.insert(
                http::header::CONTENT_TYPE,
                http::HeaderValue::from_str(value).unwrap(),
            );
            is_event_stream(&h)
        };
        for yes in [
            "text/event-stream",
            "Text/Event-Stream",
            " text/event-stream",
            "text/event-stream;charset=utf-8",
            "text/event-stream ; charset=utf-8",
        ] {
            assert!(of(yes), "{yes:?}");
        }
        for no in [
            "text/event-streams",
            "text/event-stream-x",
            "text/event",
            "text/html",
            "application/json; x=text/event-stream",
            "",
        ] {
            assert!(!of(no), "{no:?}");
        }
        assert!(!is_event_stream(&http::HeaderMap::new()));
    }
}
