//! door's OpenTelemetry instruments (docs/design.md, "Observability").
//!
//! Instruments are built once from an [`opentelemetry::metrics::Meter`]; [`Metrics::noop`] gives a
//! set that records nothing, for when no exporter is configured (and for benchmarks).
//!
//! `door.requests` carries exactly two attributes, `door.group` and `door.outcome`, so its
//! cardinality is groups × outcomes by construction.

use std::{
    collections::HashMap,
    sync::{
        Arc, Mutex, PoisonError, Weak,
        atomic::{AtomicI64, AtomicU64, Ordering},
    },
};

use opentelemetry::{
    KeyValue,
    metrics::{
        Counter, InstrumentProvider, Meter, ObservableCounter, ObservableGauge,
        ObservableUpDownCounter,
    },
};

use crate::{
    http::inflight::{PassRefusal, PassThrough},
    limit::{GroupLimiter, InflightGauge},
};

/// The attribute naming a route group (`webhook`, `link`, `health`, ...).
pub const ATTR_GROUP: &str = "door.group";
/// The attribute naming a request's [`Outcome`].
pub const ATTR_OUTCOME: &str = "door.outcome";
/// The attribute naming why a connection or request was refused (`door.proxy_protocol_rejected`,
/// `door.connections_refused`, `door.requests_refused`, `door.cluster.errors`).
pub const ATTR_REASON: &str = "door.reason";

/// What happened to one request of a limited group: the value of `door.outcome` on
/// `door.requests` (docs/design.md, "Observability").
///
/// Each request is counted exactly once, by `crate::http::settle`. `would_*` outcomes are
/// counted in shadow mode (`disable_anon_route_limits`) instead of the rejection enforcement
/// would have made; such a request is not counted again when it settles.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// The upstream answered 1xx, 2xx or 3xx.
    Ok,
    /// The upstream answered 4xx, the request body missed its read deadline (408), or the client
    /// went away before door answered (docs/decisions.md, "A request without an upstream answer").
    ClientError,
    /// The upstream answered 5xx (or a status above 599), or gave no answer at all: upstream
    /// refused, failed or timed out.
    ServerError,
    /// Rejected with 429: the client's (or the shared row's) token bucket was empty.
    RateLimited,
    /// Rejected with 429: the client (or the shared row) had `per_client` requests in flight.
    ClientConcurrency,
    /// Rejected with 503: the group had `inflight` requests in flight.
    GroupConcurrency,
    /// Served from a cache instead of the upstream (health over budget).
    Cached,
    /// Shadow mode: would have been [`Outcome::RateLimited`]; admitted.
    WouldRateLimited,
    /// Shadow mode: would have been [`Outcome::ClientConcurrency`]; admitted.
    WouldClientConcurrency,
    /// Shadow mode: would have been [`Outcome::GroupConcurrency`]; admitted.
    WouldGroupConcurrency,
}

impl Outcome {
    /// Every outcome, in declaration order.
    pub const ALL: [Outcome; 10] = [
        Outcome::Ok,
        Outcome::ClientError,
        Outcome::ServerError,
        Outcome::RateLimited,
        Outcome::ClientConcurrency,
        Outcome::GroupConcurrency,
        Outcome::Cached,
        Outcome::WouldRateLimited,
        Outcome::WouldClientConcurrency,
        Outcome::WouldGroupConcurrency,
    ];

    /// The attribute value: `ok`, `client_error`, `server_error`, `rate_limited`,
    /// `client_concurrency`, `group_concurrency`, `cached`, `would_rate_limited`,
    /// `would_client_concurrency`, `would_group_concurrency`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::ClientError => "client_error",
            Outcome::ServerError => "server_error",
            Outcome::RateLimited => "rate_limited",
            Outcome::ClientConcurrency => "client_concurrency",
            Outcome::GroupConcurrency => "group_concurrency",
            Outcome::Cached => "cached",
            Outcome::WouldRateLimited => "would_rate_limited",
            Outcome::WouldClientConcurrency => "would_client_concurrency",
            Outcome::WouldGroupConcurrency => "would_group_concurrency",
        }
    }

    const fn index(self) -> usize {
        self as usize
    }
}

impl core::fmt::Display for Outcome {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a TLS handshake did not complete (`door.tls_handshake_failures`' `door.reason`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TlsFailure {
    /// rustls refused the handshake (no protocol version or cipher suite in common, a message
    /// that is not TLS, an SNI name it rejects) or the client closed the connection during it.
    Error,
    /// The handshake was not done within `header_read_timeout`.
    Timeout,
}

impl TlsFailure {
    /// The `door.reason` value: `error` or `timeout`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Error => "error",
            Self::Timeout => "timeout",
        }
    }
}

/// door's instruments (docs/design.md, "Observability"). Cheap to clone (the instruments are
/// `Arc`s).
///
/// - `door.requests` (counter, `{request}`): attributes `door.group`, `door.outcome`, nothing else.
/// - `door.inflight` (up-down counter, `{request}`): requests holding a limiter slot, per
///   `door.group`. In shadow mode a request enforcement would have rejected holds no slot and is
///   not counted here.
/// - `door.streams` (up-down counter, `{stream}`): streams open now (WebSockets and other
///   upgraded connections, server-sent event responses), per `door.group`.
/// - `door.clients` (up-down counter, `{client}`): entries in a group's client table, per
///   `door.group` (the shared row is not an entry).
/// - `door.evictions` (counter, `{client}`): table entries replaced by a new client, per
///   `door.group`; every group reported from the start, at 0 (so are `door.untrusted_xff`,
///   `door.allowed`, `door.denied` and `door.escalations`).
/// - `door.untrusted_xff` (counter, `{request}`): forwarding headers ignored because an untrusted
///   loopback or private peer sent them (docs/design.md, "Client key").
/// - `door.proxy_protocol_rejected` (counter, `{connection}`): connections dropped on a PROXY
///   protocol listener, per `door.reason` ([`crate::client::proxy_protocol::ProxyProtocolError::reason`]:
///   a fixed set of seven values).
/// - `door.allowed`, `door.denied` (counters, `{request}`): requests from clients on the `allow`
///   list (forwarded unlimited) and the `deny` list (answered 403).
/// - `door.connections_refused` (counter, `{connection}`): client connections closed at accept,
///   per `door.reason` (`max_connections`, `max_connections_per_client`).
/// - `door.requests_refused` (counter, `{request}`): requests door answers 400 or 501 itself
///   before routing (or, for `credential_copies`, at the request planes), per `door.reason`
///   ([`crate::http::head::HeadError::REASONS`]), every reason from the start. hyper's own
///   answers to a head it cannot parse (400, 431) are not counted.
/// - `door.requests_failed` (counter, `{request}`): requests door answered itself once it had
///   begun to forward them, on any route, per `door.reason`
///   ([`crate::http::answer::Failure::REASONS`]: the body timed out, 408, or broke off, 400;
///   the upstream timed out or stopped reading, 504, or failed, 502).
/// - `door.escalations` (counter, `{prefix}`): client keys put on the XDP blocklist by
///   escalation (`[xdp] escalate_after` 429s within `escalate_window`; a block the blocklist's
///   writer dropped is not counted).
/// - `door.passthrough_refused` (counter, `{request}`): requests on routes in no group refused
///   at a pass-through cap, per `door.reason` (`upstream_max_inflight`, answered 503;
///   `upstream_max_inflight_per_client`, answered 429); both reasons reported from the start.
/// - `door.passthrough_inflight` (up-down counter, `{request}`): requests on routes in no group
///   holding an `upstream_max_inflight` slot now. Both `door.passthrough_` instruments are read
///   from the caps at collection.
/// - `door.tls_handshake_failures` (counter, `{connection}`): connections to a TLS listener
///   closed before the handshake completed, per `door.reason` ([`TlsFailure::as_str`]: `error`,
///   a handshake rustls refused or the client abandoned; `timeout`, none within
///   `header_read_timeout`).
///
/// The groups' caps are registered separately, once the groups exist ([`observe_budgets`]).
#[derive(Clone, Debug)]
pub struct Metrics {
    meter: Meter,
    /// `door.requests`, `door.inflight`, `door.streams` and `door.clients`, read from
    /// [`Counts`] at each collection: recording one is an atomic add on the request path, never
    /// an instrument call; `door.inflight` costs the request path nothing, its limiters' shards
    /// are read at collection ([`InflightGauge`]).
    _observed: Arc<Observed>,
    evictions: Counter<u64>,
    untrusted_xff: Counter<u64>,
    proxy_protocol_rejected: Counter<u64>,
    connections_refused: Counter<u64>,
    requests_refused: Counter<u64>,
    requests_failed: Counter<u64>,
    tls_handshake_failures: Counter<u64>,
    escalations: Counter<u64>,
    allowed: Counter<u64>,
    denied: Counter<u64>,
    /// Per-group outcome totals by group name, shared by every [`GroupMetrics`] of that name, so
    /// that the counts `/status` shows survive a reload that rebuilds a group's limiter.
    totals: Arc<Mutex<HashMap<String, Totals>>>,
}

/// What a group counts whatever is exported: requests per outcome (in [`Outcome::ALL`] order),
/// its streams open now, its tracked clients; and the gauges its requests holding a slot are
/// read from, one per limiter built for the group (a reload that rebuilds the limiter adds one;
/// the old one reads its requests still in flight until it is gone).
#[derive(Debug, Default)]
struct Counts {
    outcomes: [AtomicU64; Outcome::ALL.len()],
    streams: AtomicU64,
    inflight: Mutex<Vec<InflightGauge>>,
    clients: AtomicI64,
}

impl Counts {
    /// The group's requests holding a slot now, over every limiter built for it; forgets the
    /// gauges of limiters that are gone.
    fn inflight(&self) -> i64 {
        let mut gauges = self.inflight.lock().unwrap_or_else(PoisonError::into_inner);
        gauges.retain(|g| !g.is_gone());
        gauges.iter().map(|g| i64::from(g.read())).sum()
    }
}

/// The observable instruments, alive as long as a [`Metrics`] is.
#[derive(Debug)]
struct Observed {
    _requests: ObservableCounter<u64>,
    _inflight: ObservableUpDownCounter<i64>,
    _streams: ObservableUpDownCounter<i64>,
    _clients: ObservableUpDownCounter<i64>,
}

/// Every group's counts by name.
type Registry = Arc<Mutex<HashMap<String, Totals>>>;

/// Calls `f` with each group's attribute and counts (at collection time). A group a reload
/// removed is still reported: the SDK (0.31) keeps every attribute set an asynchronous instrument
/// ever reported in its cumulative output, so leaving it out would freeze its series at their
/// last values; reported, they settle to what is left (in-flight requests finishing, streams
/// closing).
fn each_group(registry: &Registry, mut f: impl FnMut(&KeyValue, &Counts)) {
    let groups: Vec<(String, Totals)> = registry
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .iter()
        .map(|(k, v)| (k.clone(), Arc::clone(v)))
        .collect();
    for (name, counts) in groups {
        f(&KeyValue::new(ATTR_GROUP, name), &counts);
    }
}

type Totals = Arc<Counts>;

impl Observed {
    fn new(meter: &Meter, registry: &Registry) -> Self {
        let r = Arc::clone(registry);
        let requests = meter
            .u64_observable_counter("door.requests")
            .with_description("Requests to limited route groups, by group and outcome")
            .with_unit("{request}")
            .with_callback(move |o| {
                each_group(&r, |group, c| {
                    // Zeros included: a quiet door's groups and outcomes exist from the start,
                    // so dashboards list them and `rate()` sees the first increment.
                    for (outcome, n) in Outcome::ALL.iter().zip(&c.outcomes) {
                        o.observe(
                            n.load(Ordering::Relaxed),
                            &[group.clone(), KeyValue::new(ATTR_OUTCOME, outcome.as_str())],
                        );
                    }
                });
            })
            .build();
        let gauge = |name: &'static str,
                     description: &'static str,
                     unit: &'static str,
                     pick: fn(&Counts) -> i64| {
            let r = Arc::clone(registry);
            meter
                .i64_observable_up_down_counter(name)
                .with_description(description)
                .with_unit(unit)
                .with_callback(move |o| {
                    each_group(&r, |group, c| {
                        o.observe(pick(c), std::slice::from_ref(group));
                    });
                })
                .build()
        };
        Self {
            _requests: requests,
            _inflight: gauge(
                "door.inflight",
                "Requests holding a limiter slot, by group",
                "{request}",
                Counts::inflight,
            ),
            _streams: gauge(
                "door.streams",
                "Streams open (WebSockets and other upgraded connections, server-sent event \
                 responses), by group",
                "{stream}",
                |c| i64::try_from(c.streams.load(Ordering::Relaxed)).unwrap_or(i64::MAX),
            ),
            _clients: gauge(
                "door.clients",
                "Clients tracked in a group's bounded table, by group",
                "{client}",
                |c| c.clients.load(Ordering::Relaxed),
            ),
        }
    }
}

/// An [`InstrumentProvider`] whose every instrument is the API's no-op.
#[derive(Debug)]
struct NoopProvider;

impl InstrumentProvider for NoopProvider {}

impl Metrics {
    /// Builds the instruments from `meter` (usually `global::meter("door")`, or a test's
    /// in-memory provider).
    pub fn new(meter: &Meter) -> Self {
        let totals: Registry = Arc::default();
        let metrics = Self {
            meter: meter.clone(),
            _observed: Arc::new(Observed::new(meter, &totals)),
            evictions: meter
                .u64_counter("door.evictions")
                .with_description("Full, idle table entries replaced by a new client, by group")
                .with_unit("{client}")
                .build(),
            untrusted_xff: meter
                .u64_counter("door.untrusted_xff")
                .with_description(
                    "Requests whose X-Forwarded-For or Forwarded was ignored: sent by an untrusted \
                     loopback or private peer (a proxy missing from trusted_proxies?)",
                )
                .with_unit("{request}")
                .build(),
            proxy_protocol_rejected: meter
                .u64_counter("door.proxy_protocol_rejected")
                .with_description(
                    "Connections dropped on a PROXY protocol listener (untrusted sender, missing, \
                     slow or malformed header), by reason",
                )
                .with_unit("{connection}")
                .build(),
            connections_refused: meter
                .u64_counter("door.connections_refused")
                .with_description(
                    "Client connections closed at accept: max_connections or \
                     max_connections_per_client reached, by reason",
                )
                .with_unit("{connection}")
                .build(),
            requests_refused: meter
                .u64_counter("door.requests_refused")
                .with_description(
                    "Requests door answered 400 or 501 before routing: a head that breaks HTTP's \
                     rules (Host, target, transfer coding) or a CONNECT door does not carry, by \
                     reason",
                )
                .with_unit("{request}")
                .build(),
            requests_failed: meter
                .u64_counter("door.requests_failed")
                .with_description(
                    "Requests door answered itself after forwarding began: the request body \
                     timed out (408) or broke off (400), the upstream timed out or stopped \
                     reading (504) or failed (502), by reason",
                )
                .with_unit("{request}")
                .build(),
            tls_handshake_failures: meter
                .u64_counter("door.tls_handshake_failures")
                .with_description(
                    "Connections to a TLS listener closed before the handshake completed: refused \
                     or abandoned (error), or not done within header_read_timeout (timeout), by \
                     reason",
                )
                .with_unit("{connection}")
                .build(),
            escalations: meter
                .u64_counter("door.escalations")
                .with_description(
                    "Client keys put on the XDP blocklist by escalation (escalate_after 429s \
                     within escalate_window)",
                )
                .with_unit("{prefix}")
                .build(),
            allowed: meter
                .u64_counter("door.allowed")
                .with_description("Requests from clients on the allow list, forwarded unlimited")
                .with_unit("{request}")
                .build(),
            denied: meter
                .u64_counter("door.denied")
                .with_description("Requests from clients on the deny list, answered 403")
                .with_unit("{request}")
                .build(),
            totals,
        };
        // The counters without attributes exist from the start, at 0, as `door.requests` does:
        // a scrape of a quiet door lists them, and `rate()` sees their first increment.
        for counter in [
            &metrics.untrusted_xff,
            &metrics.allowed,
            &metrics.denied,
            &metrics.escalations,
        ] {
            counter.add(0, &[]);
        }
        for reason in crate::http::answer::Failure::REASONS {
            metrics
                .requests_failed
                .add(0, &[KeyValue::new(ATTR_REASON, reason)]);
        }
        for reason in crate::http::head::HeadError::REASONS {
            metrics
                .requests_refused
                .add(0, &[KeyValue::new(ATTR_REASON, reason)]);
        }
        metrics
    }

    /// Registers `door.passthrough_inflight` and `door.passthrough_refused`, read from `caps`
    /// (its count of requests holding a slot, and of refusals per cap, both reasons from the
    /// start, at 0) at each collection: the request path pays nothing for them. The callbacks
    /// stay registered for the meter provider's life (OpenTelemetry has no unregistering), and
    /// hold `caps` weakly: once it is gone, a cumulative reader keeps its last values. One
    /// door's caps per provider: a second's observations would replace the first's, not add.
    pub(crate) fn observe_passthrough(&self, caps: &Arc<PassThrough>) {
        let open = Arc::downgrade(caps);
        let refusals = Weak::clone(&open);
        self.meter
            .i64_observable_up_down_counter("door.passthrough_inflight")
            .with_description(
                "Requests on routes in no group holding an upstream_max_inflight slot now",
            )
            .with_unit("{request}")
            .with_callback(move |o| {
                if let Some(caps) = open.upgrade() {
                    o.observe(i64::from(caps.open()), &[]);
                }
            })
            .build();
        self.meter
            .u64_observable_counter("door.passthrough_refused")
            .with_description(
                "Requests on routes in no group refused at upstream_max_inflight (503) or \
                 upstream_max_inflight_per_client (429), by reason",
            )
            .with_unit("{request}")
            .with_callback(move |o| {
                if let Some(caps) = refusals.upgrade() {
                    for why in PassRefusal::ALL {
                        o.observe(
                            caps.refused(why),
                            &[KeyValue::new(ATTR_REASON, why.reason())],
                        );
                    }
                }
            })
            .build();
    }

    /// The meter these instruments were built from, for the instruments registered later (the
    /// shield's, [`observe_budgets`]).
    pub fn meter(&self) -> &Meter {
        &self.meter
    }

    /// Counts one request on `door.untrusted_xff` (no attributes).
    pub fn untrusted_xff(&self) {
        self.untrusted_xff.add(1, &[]);
    }

    /// Counts one connection on `door.proxy_protocol_rejected`, with `door.reason` = `reason`
    /// (one of [`crate::client::proxy_protocol::ProxyProtocolError::reason`]'s fixed names).
    pub fn proxy_protocol_rejected(&self, reason: &'static str) {
        self.proxy_protocol_rejected
            .add(1, &[KeyValue::new(ATTR_REASON, reason)]);
    }

    /// Counts one connection on `door.connections_refused`, with `door.reason` = `reason`
    /// (`max_connections` or `max_connections_per_client`).
    pub fn connection_refused(&self, reason: &'static str) {
        self.connections_refused
            .add(1, &[KeyValue::new(ATTR_REASON, reason)]);
    }

    /// Counts one request on `door.requests_refused`, with `door.reason` = `reason` (one of
    /// [`crate::http::head::HeadError::REASONS`]).
    pub fn request_refused(&self, reason: &'static str) {
        self.requests_refused
            .add(1, &[KeyValue::new(ATTR_REASON, reason)]);
    }

    /// Counts one request on `door.requests_failed`, with `door.reason` = `reason` (one of
    /// [`crate::http::answer::Failure::REASONS`]).
    pub fn request_failed(&self, reason: &'static str) {
        self.requests_failed
            .add(1, &[KeyValue::new(ATTR_REASON, reason)]);
    }

    /// Counts one connection on `door.tls_handshake_failures`, with `door.reason` = `failure`'s
    /// name.
    pub fn tls_handshake_failed(&self, failure: TlsFailure) {
        self.tls_handshake_failures
            .add(1, &[KeyValue::new(ATTR_REASON, failure.as_str())]);
    }

    /// Counts one key on `door.escalations` (no attributes).
    pub fn escalated(&self) {
        self.escalations.add(1, &[]);
    }

    /// Counts one request on `door.allowed` (no attributes).
    pub fn allowed(&self) {
        self.allowed.add(1, &[]);
    }

    /// Counts one request on `door.denied` (no attributes).
    pub fn denied(&self) {
        self.denied.add(1, &[]);
    }

    /// Instruments that record nothing (no exporter configured; benchmarks).
    pub fn noop() -> Self {
        Self::new(&Meter::new(Arc::new(NoopProvider)))
    }

    /// Requests of `group` counted per outcome since start, in [`Outcome::ALL`] order (zeros
    /// included; all zeros for a group never seen). Kept across reloads.
    pub fn totals(&self, group: &str) -> Vec<(Outcome, u64)> {
        let totals = self
            .totals
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(group)
            .cloned();
        Outcome::ALL
            .iter()
            .enumerate()
            .map(|(i, o)| {
                let n = totals
                    .as_ref()
                    .and_then(|t| t.outcomes.get(i))
                    .map_or(0, |n| n.load(Ordering::Relaxed));
                (*o, n)
            })
            .collect()
    }

    /// Streams of `group` open now (WebSockets and other tunnels, server-sent event responses).
    pub fn streams(&self, group: &str) -> u64 {
        self.totals
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(group)
            .map_or(0, |c| c.streams.load(Ordering::Relaxed))
    }

    /// The instruments bound to one group, with every attribute set built once. Every
    /// `GroupMetrics` of the same `group` from this `Metrics` (or its clones) shares one set of
    /// outcome totals.
    pub fn for_group(self, group: &str) -> GroupMetrics {
        let group_kv = KeyValue::new(ATTR_GROUP, group.to_owned());
        let totals = Arc::clone(
            self.totals
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .entry(group.to_owned())
                .or_insert_with(|| Arc::new(Counts::default())),
        );
        // A group's `door.evictions` exists from the start, at 0 (see [`Metrics::new`]).
        self.evictions.add(0, std::slice::from_ref(&group_kv));
        GroupMetrics {
            metrics: self,
            group_attrs: [group_kv],
            totals,
        }
    }
}

impl Default for Metrics {
    /// [`Metrics::noop`].
    fn default() -> Self {
        Self::noop()
    }
}

/// [`Metrics`] bound to one group: recording allocates nothing. It also keeps its own totals per
/// outcome, which `/status` shows whether or not anything is exported.
#[derive(Clone)]
pub struct GroupMetrics {
    metrics: Metrics,
    group_attrs: [KeyValue; 1],
    totals: Totals,
}

impl core::fmt::Debug for GroupMetrics {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("GroupMetrics")
            .field("group", &self.group_attrs[0].value)
            .finish_non_exhaustive()
    }
}

impl crate::limit::Observer for GroupMetrics {
    fn clients_changed(&self, delta: i64) {
        self.clients_add(delta);
    }

    fn evicted(&self) {
        GroupMetrics::evicted(self);
    }

    /// Keeps `gauge` beside the group's others, dropping those that are gone: without a
    /// collection (no exporter, no scrape) every rebuilding reload would otherwise leave one.
    fn watch_inflight(&self, gauge: InflightGauge) {
        let mut gauges = self
            .totals
            .inflight
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        gauges.retain(|g| !g.is_gone());
        gauges.push(gauge);
    }
}

impl GroupMetrics {
    /// Counts one request with `outcome` on `door.requests`: one atomic add.
    pub fn record(&self, outcome: Outcome) {
        if let Some(total) = self.totals.outcomes.get(outcome.index()) {
            total.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Requests counted per outcome since start, in [`Outcome::ALL`] order (zeros included).
    pub fn totals(&self) -> Vec<(Outcome, u64)> {
        Outcome::ALL
            .iter()
            .zip(self.totals.outcomes.iter())
            .map(|(o, n)| (*o, n.load(Ordering::Relaxed)))
            .collect()
    }

    /// Adds `delta` to `door.clients`.
    pub fn clients_add(&self, delta: i64) {
        self.totals.clients.fetch_add(delta, Ordering::Relaxed);
    }

    /// Counts one eviction on `door.evictions`.
    pub fn evicted(&self) {
        self.metrics.evictions.add(1, &self.group_attrs);
    }

    /// A stream of this group opened: counted on `door.streams` until the returned guard drops.
    pub fn stream_opened(&self) -> StreamOpen {
        self.totals.streams.fetch_add(1, Ordering::Relaxed);
        StreamOpen(Arc::clone(&self.totals))
    }
}

/// One open stream on `door.streams` (see [`GroupMetrics::stream_opened`]); closed when dropped.
/// Holds only the group's counters: one reference count, 8 bytes in every response body.
#[derive(Debug)]
pub struct StreamOpen(Totals);

impl Drop for StreamOpen {
    fn drop(&mut self) {
        self.0.streams.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The budget instruments of [`observe_budgets`]; they report for as long as this value lives.
#[derive(Debug)]
pub struct BudgetInstruments {
    _inflight_cap: ObservableGauge<u64>,
    _max_clients: ObservableGauge<u64>,
}

/// Registers, per `door.group`, read from `limiters` (the groups in force: a reload replaces
/// them) at each collection:
///
/// - `door.inflight_cap` (observable gauge, `{request}`): the group's in-flight cap
///   (`group.NAME.inflight`), to read `door.inflight` against;
/// - `door.max_clients` (observable gauge, `{client}`): the size of the group's client table
///   (`group.NAME.max_clients`), to read `door.clients` against.
pub fn observe_budgets(
    meter: &Meter,
    limiters: impl Fn() -> Vec<Arc<GroupLimiter>> + Send + Sync + 'static,
) -> BudgetInstruments {
    let limiters = Arc::new(limiters);
    let for_cap = Arc::clone(&limiters);
    let inflight_cap = meter
        .u64_observable_gauge("door.inflight_cap")
        .with_description("The group's in-flight cap (group.NAME.inflight), by group")
        .with_unit("{request}")
        .with_callback(move |o| {
            for l in for_cap() {
                o.observe(
                    u64::from(l.budget().inflight),
                    &[KeyValue::new(ATTR_GROUP, l.group().to_owned())],
                );
            }
        })
        .build();
    let max_clients = meter
        .u64_observable_gauge("door.max_clients")
        .with_description("Entries of the group's client table (group.NAME.max_clients), by group")
        .with_unit("{client}")
        .with_callback(move |o| {
            for l in limiters() {
                o.observe(
                    u64::try_from(l.budget().max_clients).unwrap_or(u64::MAX),
                    &[KeyValue::new(ATTR_GROUP, l.group().to_owned())],
                );
            }
        })
        .build();
    BudgetInstruments {
        _inflight_cap: inflight_cap,
        _max_clients: max_clients,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outcome_names_match_the_design() {
        let names: Vec<_> = Outcome::ALL.iter().map(|o| o.as_str()).collect();
        assert_eq!(
            names,
            [
                "ok",
                "client_error",
                "server_error",
                "rate_limited",
                "client_concurrency",
                "group_concurrency",
                "cached",
                "would_rate_limited",
                "would_client_concurrency",
                "would_group_concurrency"
            ]
        );
        for (i, o) in Outcome::ALL.iter().enumerate() {
            assert_eq!(o.index(), i);
        }
    }

    /// A group's metrics keep the in-flight gauge of a limiter a reload replaced while its
    /// requests are in flight, and drop it once they have settled, at the next limiter built for
    /// the group even when nothing collects (no exporter, no scrape).
    #[test]
    fn gone_limiters_gauges_are_dropped_without_a_collection() {
        use crate::limit::{Budget, GroupLimiter, Observer, Spend};
        let group = Arc::new(Metrics::noop().for_group("link"));
        let clock = Arc::new(crate::time::ManualClock::at(0));
        let build = || {
            GroupLimiter::new(
                "link",
                Budget::link(),
                true,
                clock.clone(),
                Arc::clone(&group) as Arc<dyn Observer>,
            )
        };
        let kept = |g: &GroupMetrics| {
            g.totals
                .inflight
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .len()
        };
        let key = door_common::PrefixKey::from_ipv4([192, 0, 2, 1]);
        let old = Arc::new(build());
        let permit = crate::limit::Permit::admit(Arc::clone(old.shards()), key).unwrap();
        drop(old);
        let new = Arc::new(build());
        assert_eq!(kept(&group), 2, "the old limiter's request is in flight");
        permit.settle(Spend::Nothing);
        drop(new);
        // No collection since: building the next limiter drops the two gone gauges.
        let _newest = build();
        assert_eq!(kept(&group), 1, "only the newest limiter's gauge is left");
        assert_eq!(group.totals.inflight(), 0);
    }
}
