//! door's OpenTelemetry instruments (../shared/DESIGN.md, "Observability"; seed
//! network-door-limits.txt, "Counters").
//!
//! Instruments are built once from an [`opentelemetry::metrics::Meter`]; [`Metrics::noop`] gives a
//! set that records nothing, for when no exporter is configured (and for benchmarks).
//!
//! `door.requests` carries exactly two attributes, `door.group` and `door.outcome`, so its
//! cardinality is groups × outcomes by construction.

use std::sync::{
    Arc,
    atomic::{AtomicU64, Ordering},
};

use opentelemetry::{
    KeyValue,
    metrics::{Counter, InstrumentProvider, Meter, UpDownCounter},
};

/// The attribute naming a route group (`webhook`, `link`, `health`, ...).
pub const ATTR_GROUP: &str = "door.group";
/// The attribute naming a request's [`Outcome`].
pub const ATTR_OUTCOME: &str = "door.outcome";

/// What happened to one request of a limited group: the value of `door.outcome` on
/// `door.requests` (DESIGN.md, "Observability").
///
/// Each request is counted exactly once. `would_*` outcomes are counted in shadow mode
/// (`disable_anon_route_limits`) instead of the rejection enforcement would have made; such a
/// request is not counted again when it settles (see [`crate::limit::Permit`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// The upstream answered 1xx, 2xx or 3xx.
    Ok,
    /// The upstream answered 4xx.
    ClientError,
    /// The upstream answered 5xx (or a status above 599), or gave no answer at all: upstream error,
    /// client disconnect, panic or cancelled request (a [`crate::limit::Permit`] dropped without
    /// being settled).
    ServerError,
    /// Rejected with 429: the client's (or the shared row's) token bucket was empty.
    RateLimited,
    /// Rejected with 429: the client (or the shared row) had `per_client` requests in flight.
    ClientConcurrency,
    /// Rejected with 503: the group had `inflight` requests in flight.
    GroupConcurrency,
    /// Served from a cache instead of the upstream (health over budget; recorded by the HTTP
    /// layer through [`Metrics::record_outcome`]).
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

    /// The outcome of an upstream answer: 1xx–3xx `ok`, 4xx `client_error`, anything else
    /// (5xx, or the 600–999 range `http` also accepts) `server_error`.
    pub fn from_status(status: http::StatusCode) -> Self {
        if status.is_client_error() {
            Outcome::ClientError
        } else if status.as_u16() < 400 {
            Outcome::Ok
        } else {
            Outcome::ServerError
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

/// door's instruments (DESIGN.md, "Observability"). Cheap to clone (the instruments are `Arc`s).
///
/// - `door.requests` (counter, `{request}`): attributes `door.group`, `door.outcome`, nothing else.
/// - `door.inflight` (up-down counter, `{request}`): requests holding a limiter slot, per
///   `door.group`. In shadow mode a request enforcement would have rejected holds no slot and is
///   not counted here.
/// - `door.clients` (up-down counter, `{client}`): entries in a group's client table, per
///   `door.group` (the shared row is not an entry).
/// - `door.evictions` (counter, `{client}`): table entries replaced by a new client, per
///   `door.group`.
/// - `door.untrusted_xff` (counter, `{request}`): forwarding headers ignored because an untrusted
///   loopback or private peer sent them (DESIGN.md, "Client key").
#[derive(Clone, Debug)]
pub struct Metrics {
    requests: Counter<u64>,
    inflight: UpDownCounter<i64>,
    clients: UpDownCounter<i64>,
    evictions: Counter<u64>,
    untrusted_xff: Counter<u64>,
}

/// An [`InstrumentProvider`] whose every instrument is the API's no-op.
#[derive(Debug)]
struct NoopProvider;

impl InstrumentProvider for NoopProvider {}

impl Metrics {
    /// Builds the instruments from `meter` (usually `global::meter("door")`, or a test's
    /// in-memory provider).
    pub fn new(meter: &Meter) -> Self {
        Self {
            requests: meter
                .u64_counter("door.requests")
                .with_description("Requests to limited route groups, by group and outcome")
                .with_unit("{request}")
                .build(),
            inflight: meter
                .i64_up_down_counter("door.inflight")
                .with_description("Requests holding a limiter slot, by group")
                .with_unit("{request}")
                .build(),
            clients: meter
                .i64_up_down_counter("door.clients")
                .with_description("Clients tracked in a group's bounded table, by group")
                .with_unit("{client}")
                .build(),
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
        }
    }

    /// Counts one request on `door.untrusted_xff` (no attributes).
    pub fn untrusted_xff(&self) {
        self.untrusted_xff.add(1, &[]);
    }

    /// Instruments that record nothing (no exporter configured; benchmarks).
    pub fn noop() -> Self {
        Self::new(&Meter::new(Arc::new(NoopProvider)))
    }

    /// Counts one request of `group` on `door.requests` with `outcome`. Allocates the group
    /// attribute; hot paths use [`Metrics::for_group`].
    pub fn record_outcome(&self, group: &str, outcome: Outcome) {
        self.requests.add(
            1,
            &[
                KeyValue::new(ATTR_GROUP, group.to_owned()),
                KeyValue::new(ATTR_OUTCOME, outcome.as_str()),
            ],
        );
    }

    /// The instruments bound to one group, with every attribute set built once.
    pub fn for_group(self, group: &str) -> GroupMetrics {
        let group_kv = KeyValue::new(ATTR_GROUP, group.to_owned());
        GroupMetrics {
            metrics: self,
            outcome_attrs: Outcome::ALL
                .map(|o| [group_kv.clone(), KeyValue::new(ATTR_OUTCOME, o.as_str())]),
            group_attrs: [group_kv],
            totals: Arc::new(std::array::from_fn(|_| AtomicU64::new(0))),
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
    outcome_attrs: [[KeyValue; 2]; Outcome::ALL.len()],
    group_attrs: [KeyValue; 1],
    totals: Arc<[AtomicU64; Outcome::ALL.len()]>,
}

impl core::fmt::Debug for GroupMetrics {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("GroupMetrics")
            .field("group", &self.group_attrs[0].value)
            .finish_non_exhaustive()
    }
}

impl GroupMetrics {
    /// Counts one request with `outcome` on `door.requests`.
    pub fn record(&self, outcome: Outcome) {
        if let Some(attrs) = self.outcome_attrs.get(outcome.index()) {
            self.metrics.requests.add(1, attrs);
        }
        if let Some(total) = self.totals.get(outcome.index()) {
            total.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Requests counted per outcome since start, in [`Outcome::ALL`] order (zeros included).
    pub fn totals(&self) -> Vec<(Outcome, u64)> {
        Outcome::ALL
            .iter()
            .zip(self.totals.iter())
            .map(|(o, n)| (*o, n.load(Ordering::Relaxed)))
            .collect()
    }

    /// Adds `delta` (±1) to `door.inflight`.
    pub fn inflight_add(&self, delta: i64) {
        self.metrics.inflight.add(delta, &self.group_attrs);
    }

    /// Adds `delta` to `door.clients`.
    pub fn clients_add(&self, delta: i64) {
        self.metrics.clients.add(delta, &self.group_attrs);
    }

    /// Counts one eviction on `door.evictions`.
    pub fn evicted(&self) {
        self.metrics.evictions.add(1, &self.group_attrs);
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

    #[test]
    fn status_classes() {
        use http::StatusCode;
        assert_eq!(Outcome::from_status(StatusCode::CONTINUE), Outcome::Ok);
        assert_eq!(Outcome::from_status(StatusCode::OK), Outcome::Ok);
        assert_eq!(Outcome::from_status(StatusCode::FOUND), Outcome::Ok);
        assert_eq!(
            Outcome::from_status(StatusCode::BAD_REQUEST),
            Outcome::ClientError
        );
        assert_eq!(
            Outcome::from_status(StatusCode::BAD_GATEWAY),
            Outcome::ServerError
        );
        assert_eq!(
            Outcome::from_status(StatusCode::from_u16(799).unwrap()),
            Outcome::ServerError
        );
    }
}
