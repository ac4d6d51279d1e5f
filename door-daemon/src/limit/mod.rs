//! The per-group layer-7 limiter (docs/design.md, "Limits").
//!
//! This module decides admission and keeps the books; it knows nothing of HTTP, metrics or the
//! system clock: time comes from an injected [`Clock`], table and slot changes are reported to an
//! [`Observer`], and whether a settled request spends its held token is the caller's decision
//! ([`Spend`], decided in `crate::http::settle`). Its bucket arithmetic is
//! [`door_common::gcra`], the same GCRA the XDP program runs.
//!
//! A [`GroupLimiter`] guards one route group (`webhook`, `link`, `health`, ...). In shards by key
//! hash, each behind its own mutex, it holds a bounded table of per-client rows (a token bucket,
//! the tokens held by unsettled requests, the requests in flight), oldest first in an approximate
//! LRU order (CLOCK's second chance, `limit/table.rs`), and one *shared row* for the clients the
//! table cannot hold; the group's in-flight slots are a pool the shards lease from
//! (`limit/slots.rs`). [`GroupLimiter::admit`] checks, in order, the group's in-flight cap (503),
//! the row's in-flight cap (429) and the row's bucket (429), and hands out a [`Permit`] (borrowing
//! the limiter; [`Permit::admit`] takes instead a reference the caller keeps to the limiter's
//! [`Shards`], [`ShardsRef`]): an RAII guard that frees the slot however the request ends, and
//! under [`Charge::OnFailure`] spends a token only when the caller says the request failed on the
//! client's side ([`Spend`]; door's rule, `crate::http::settle::charge`: an upstream 4xx, a body
//! that missed its deadline, a client gone before the answer).
//!
//! # Token arithmetic
//!
//! Integer nanoseconds, no floats after construction. The rate is converted once to an emission
//! interval `T = ceil(1e9 / rate)` ns (rounding up makes the effective rate never exceed the
//! configured one). A bucket is one timestamp, `full_at`: the instant (clock ns) at which it is, or
//! was, full. At `now` its *deficit* is `full_at - now` (0 if past), and it holds
//! `burst - deficit / T` tokens. So:
//!
//! - `n` tokens are available iff `deficit ≤ (burst - n) · T`;
//! - spending one sets `full_at = max(full_at, now) + T`;
//! - the wait for `n` tokens is exactly `deficit - (burst - n) · T` ns, and `Retry-After` is that,
//!   rounded up to whole seconds, at least 1. Waiting `Retry-After` seconds therefore always makes
//!   `n` tokens available if nothing else happened (nothing else was admitted or settled).
//!
//! The invariant `deficit + held · T ≤ burst · T` holds for every row at every instant: tokens
//! never go negative and held tokens are always backed.

use std::{
    collections::HashSet,
    num::NonZeroUsize,
    sync::{
        Arc, Mutex, MutexGuard, PoisonError, Weak,
        atomic::{AtomicBool, Ordering},
    },
};

use door_common::{gcra, prefix::PrefixKey};
use lru::LruCache;

use crate::time::Clock;

mod slots;
mod table;

use slots::{Lease, Pool};
use table::Table;

/// How many of the oldest table entries a miss on a full table probes for a full, idle entry to
/// replace (docs/design.md, "Limits").
pub const EVICT_PROBE: usize = 8;

/// The most second chances a miss on a full table gives before it probes: entries at the old end
/// of the table used since they were placed there, moved to the front instead of being probed
/// (docs/design.md, "The bounded table and its shared row"). A bound on one request's work under
/// the shard's lock; the chances given never outnumber the uses that marked the entries.
pub const SECOND_CHANCES: usize = 64;

/// The default size of a group's client table, in entries (docs/design.md, "Limits").
pub const DEFAULT_MAX_CLIENTS: usize = 16_384;

/// The largest `max_clients` a table may have: 16,777,216 entries (2^24), about 1.1 GB (a 56-byte
/// entry and at least two 4-byte index slots per client). A table is allocated whole when its
/// group is built, so a larger value (the configuration's integers reach 4,294,967,295) would
/// abort door at start instead of being refused with the key named.
pub const MAX_CLIENTS: usize = 1 << 24;

/// The slowest accepted rate, in tokens per second: one token a day. Anything slower is refused by
/// [`Budget::validate`].
pub const MIN_RATE: f64 = 1.0 / 86_400.0;

/// The fastest accepted rate, in tokens per second: one token per nanosecond.
pub const MAX_RATE: f64 = 1e9;

/// The in-flight caps of a request plane ([`Budget::plane`]): more requests than a door can
/// have open, so they never bind.
pub const PLANE_UNCAPPED: u32 = 1 << 30;

/// The `Retry-After`, in seconds, of a rejection by an in-flight cap (the wait depends on other
/// requests finishing, so it cannot be exact; one second is the smallest legal value).
pub const CAP_RETRY_AFTER_S: u64 = 1;

const NS_PER_S: u64 = 1_000_000_000;

/// When a request's token is spent (docs/design.md, "Limits": the groups' column "token spent",
/// and "Charge on failure").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Charge {
    /// Every admitted request spends one token at admission (`link`, `health`).
    Always,
    /// Charge-on-failure (`webhook`; docs/design.md, "Limits"): an admitted request *holds* a token
    /// until it settles, and spends it only if it failed on the client's side (an upstream 4xx, a
    /// body that missed its deadline, a client gone before the answer:
    /// `crate::http::settle::charge`). Admission needs `tokens(now) ≥ 1 + held`.
    OnFailure,
}

impl Charge {
    /// The configuration spelling: `always` or `on_failure` (docs/design.md, "Configuration").
    pub const fn as_str(self) -> &'static str {
        match self {
            Charge::Always => "always",
            Charge::OnFailure => "on_failure",
        }
    }
}

impl core::str::FromStr for Charge {
    type Err = BudgetError;

    /// Parses `always` or `on_failure`; anything else is a [`BudgetError`] naming the key `charge`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "always" => Ok(Charge::Always),
            "on_failure" => Ok(Charge::OnFailure),
            other => Err(BudgetError {
                key: "charge".to_owned(),
                value: format!("{other:?}"),
                reason: "must be \"always\" or \"on_failure\"".to_owned(),
            }),
        }
    }
}

/// One group's limits (docs/design.md, "Limits" and "Configuration", `[group.NAME]`).
///
/// The defaults are [`Budget::webhook`], [`Budget::link`] and [`Budget::health`]. Check a budget
/// built from configuration with [`Budget::validate`] before handing it to [`GroupLimiter::new`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Budget {
    /// Refill rate, tokens per second (`group.NAME.rate`). Finite, in [`MIN_RATE`]..=[`MAX_RATE`].
    pub rate: f64,
    /// Bucket capacity, tokens (`group.NAME.burst`); a new client starts with a full bucket. ≥ 1.
    pub burst: u32,
    /// Requests one client (or the shared row) may have in flight (`group.NAME.per_client`).
    /// 1..=`inflight`; under [`Charge::OnFailure`] also ≤ `burst`.
    pub per_client: u32,
    /// Requests the whole group may have in flight (`group.NAME.inflight`), ≥ 1.
    pub inflight: u32,
    /// Entries in the client table, clients (`group.NAME.max_clients`), ≥ 1; default
    /// [`DEFAULT_MAX_CLIENTS`] (16,384) in every built-in group.
    pub max_clients: usize,
    /// When a token is spent (`group.NAME.charge`): [`Charge::OnFailure`] in the built-in `webhook`
    /// group, [`Charge::Always`] in the others and in a new group unless configured.
    pub charge: Charge,
}

impl Budget {
    /// `webhook`: 50 tokens/s, burst 500, 16 per client, 64 in the group, charge on failure,
    /// 16,384 clients (docs/design.md, "Limits").
    pub const fn webhook() -> Self {
        Self {
            rate: 50.0,
            burst: 500,
            per_client: 16,
            inflight: 64,
            max_clients: DEFAULT_MAX_CLIENTS,
            charge: Charge::OnFailure,
        }
    }

    /// `link`: 1 token/s, burst 20, 2 per client, 4 in the group, charge always, 16,384 clients.
    pub const fn link() -> Self {
        Self {
            rate: 1.0,
            burst: 20,
            per_client: 2,
            inflight: 4,
            max_clients: DEFAULT_MAX_CLIENTS,
            charge: Charge::Always,
        }
    }

    /// `health`: 5 tokens/s, burst 20, 4 per client, 32 in the group, charge always, 16,384
    /// clients.
    pub const fn health() -> Self {
        Self {
            rate: 5.0,
            burst: 20,
            per_client: 4,
            inflight: 32,
            max_clients: DEFAULT_MAX_CLIENTS,
            charge: Charge::Always,
        }
    }

    /// `stream`: long-lived requests (WebSockets, server-sent events): 1 token/s, burst 20 (each
    /// opening or re-opening spends one, so reconnect storms are limited), 16 open per client,
    /// 1,024 in the group (an open stream holds its slot until it closes), charge always, 16,384
    /// clients.
    pub const fn stream() -> Self {
        Self {
            rate: 1.0,
            burst: 20,
            per_client: 16,
            inflight: 1024,
            max_clients: DEFAULT_MAX_CLIENTS,
            charge: Charge::Always,
        }
    }

    /// A request plane's budget (`[plane.session]`, `[plane.ip]`): `rate` tokens per second,
    /// `burst`, charge always, and no in-flight caps to speak of (both [`PLANE_UNCAPPED`]): a plane
    /// limits the request rate only.
    pub const fn plane(rate: f64, burst: u32, max_clients: usize) -> Self {
        Self {
            rate,
            burst,
            per_client: PLANE_UNCAPPED,
            inflight: PLANE_UNCAPPED,
            max_clients,
            charge: Charge::Always,
        }
    }

    /// The built-in budget of a group name (`webhook`, `link`, `health`, `stream`), if it has
    /// one.
    pub fn default_for(group: &str) -> Option<Self> {
        match group {
            "webhook" => Some(Self::webhook()),
            "link" => Some(Self::link()),
            "health" => Some(Self::health()),
            "stream" => Some(Self::stream()),
            _ => None,
        }
    }

    /// Checks the budget of group `group`.
    ///
    /// # Errors
    ///
    /// A [`BudgetError`] naming the first offending key (`group.<group>.<field>`) and its value
    /// when: `rate` is not finite, ≤ 0, below [`MIN_RATE`] or above [`MAX_RATE`]; `burst`,
    /// `per_client`, `inflight` or `max_clients` is 0; `max_clients` is above [`MAX_CLIENTS`];
    /// `per_client > inflight`; or, under
    /// [`Charge::OnFailure`], `per_client > burst` (a client's held tokens could then exceed the
    /// bucket and its `Retry-After` could not be exact).
    pub fn validate(&self, group: &str) -> Result<(), BudgetError> {
        self.validate_as(&format!("group.{group}"))
    }

    /// [`Budget::validate`] for a budget configured under `table` (`group.link`,
    /// `plane.session`): errors name `TABLE.FIELD`.
    ///
    /// # Errors
    /// As [`Budget::validate`].
    pub fn validate_as(&self, table: &str) -> Result<(), BudgetError> {
        let err = |field: &str, value: String, reason: String| BudgetError {
            key: format!("{table}.{field}"),
            value,
            reason,
        };
        if !self.rate.is_finite() || self.rate <= 0.0 {
            return Err(err(
                "rate",
                number_text(self.rate),
                "must be a positive, finite number of tokens per second".to_owned(),
            ));
        }
        if self.rate < MIN_RATE {
            return Err(err(
                "rate",
                number_text(self.rate),
                "is slower than one token a day".to_owned(),
            ));
        }
        if self.rate > MAX_RATE {
            return Err(err(
                "rate",
                number_text(self.rate),
                "is faster than one token per nanosecond".to_owned(),
            ));
        }
        for (field, value) in [
            ("burst", self.burst),
            ("per_client", self.per_client),
            ("inflight", self.inflight),
        ] {
            if value == 0 {
                return Err(err(
                    field,
                    value.to_string(),
                    "must be at least 1".to_owned(),
                ));
            }
        }
        if self.max_clients == 0 {
            return Err(err(
                "max_clients",
                "0".to_owned(),
                "must be at least 1".to_owned(),
            ));
        }
        if self.max_clients > MAX_CLIENTS {
            return Err(err(
                "max_clients",
                self.max_clients.to_string(),
                format!(
                    "exceeds {MAX_CLIENTS} (about 1.1 GB of table): the table is allocated \
                     whole at start"
                ),
            ));
        }
        if self.per_client > self.inflight {
            return Err(err(
                "per_client",
                self.per_client.to_string(),
                format!(
                    "exceeds {table}.inflight = {}: one client could take more than the group",
                    self.inflight
                ),
            ));
        }
        if self.charge == Charge::OnFailure && self.per_client > self.burst {
            return Err(err(
                "per_client",
                self.per_client.to_string(),
                format!(
                    "exceeds {table}.burst = {} with charge = \"on_failure\": each request in \
                     flight holds a token",
                    self.burst
                ),
            ));
        }
        Ok(())
    }

    /// This budget with its rate divided by `n` (0 counts as 1), at least [`MIN_RATE`] tokens per
    /// second: a cluster's degraded mode, `rate / N` for N doors.
    #[must_use]
    pub fn with_rate_divided(self, n: u32) -> Self {
        if n <= 1 {
            return self;
        }
        Self {
            rate: (self.rate / f64::from(n)).max(MIN_RATE),
            ..self
        }
    }

    /// The emission interval in nanoseconds: `ceil(1e9 / rate)`, clamped to
    /// `1..=ceil(1e9 / MIN_RATE)` (an unvalidated rate is clamped, never trusted).
    pub fn interval_ns(&self) -> u64 {
        let rate = if self.rate.is_finite() {
            self.rate.clamp(MIN_RATE, MAX_RATE)
        } else {
            MIN_RATE
        };
        gcra::interval_ns(rate)
    }
}

/// An invalid [`Budget`] value (docs/design.md, "Operating contract": bad configuration names the
/// offending key and value). Displays as `group.link.rate = -1: must be a positive, ...`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{key} = {value}: {reason}")]
pub struct BudgetError {
    /// The configuration key, e.g. `group.link.rate`.
    pub key: String,
    /// The offending value as written in the error.
    pub value: String,
    /// Why it is refused.
    pub reason: String,
}

/// Why a request was (or, in shadow mode, would have been) rejected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RejectReason {
    /// The row's bucket had fewer than `1 + held` tokens (answered 429).
    Rate,
    /// The row had `per_client` requests in flight (answered 429).
    ClientConcurrency,
    /// The group had `inflight` requests in flight (answered 503).
    GroupConcurrency,
}

impl RejectReason {
    /// `rate_limited`, `client_concurrency` or `group_concurrency`: the `door.outcome` spelling.
    pub const fn as_str(self) -> &'static str {
        match self {
            RejectReason::Rate => "rate_limited",
            RejectReason::ClientConcurrency => "client_concurrency",
            RejectReason::GroupConcurrency => "group_concurrency",
        }
    }
}

impl core::fmt::Display for RejectReason {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Whose budget a decision was made on: the `scope` of the 429/503 body (docs/design.md, "Limits").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Scope {
    /// The client's own table row.
    Client,
    /// The group's shared row (the client was not in the table and could not get an entry).
    Shared,
    /// The whole group (its in-flight cap).
    Group,
}

impl Scope {
    /// `client`, `shared` or `group`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Scope::Client => "client",
            Scope::Shared => "shared",
            Scope::Group => "group",
        }
    }
}

impl core::fmt::Display for Scope {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A rejected request (enforcing mode only): what door answers instead of calling the upstream.
/// A rejection spends and holds nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{reason} ({scope}), retry after {retry_after_s} s")]
pub struct Rejection {
    /// Which check failed.
    pub reason: RejectReason,
    /// Whose budget: `Client` or `Shared` for 429s, `Group` for 503s.
    pub scope: Scope,
    /// The `Retry-After` value in whole seconds, ≥ 1. For [`RejectReason::Rate`] it is exact: the
    /// wait until the row holds `1 + held` tokens, rounded up, so a retry after that long is
    /// admitted if nothing else happened. For the caps it is [`CAP_RETRY_AFTER_S`].
    pub retry_after_s: u64,
}

impl Rejection {
    fn cap(reason: RejectReason, scope: Scope) -> Self {
        Self {
            reason,
            scope,
            retry_after_s: CAP_RETRY_AFTER_S,
        }
    }

    /// The group's in-flight cap is reached (503).
    fn group_cap() -> Self {
        Self::cap(RejectReason::GroupConcurrency, Scope::Group)
    }
}

/// One token bucket with its in-flight and held counts: a table entry or the shared row.
/// 24 bytes (20 used); with its 16-byte key, the list's two links and its use mark a table entry
/// is 56 bytes, stored inline in the shard's entry array ([`table`]; docs/decisions.md, "Memory:
/// about 100 bytes per tracked client").
#[derive(Debug, Clone, Copy)]
struct Row {
    /// Clock ns at which the bucket is (or was) full.
    full_at: u64,
    /// Tokens held by unsettled requests (charge on failure only; 0 under `Charge::Always`).
    held: u32,
    /// Requests admitted on this row and not yet settled.
    inflight: u32,
    /// 429s decided on this row (rate and per-client cap; in shadow mode, the would-be ones),
    /// saturating. For the admin API only: no decision reads it.
    rejections: u32,
}

const _: () = assert!(size_of::<Row>() == 24);
const _: () = assert!(table::entry_size::<Row>() == 56);

impl Row {
    const fn full(now: u64) -> Self {
        Self {
            full_at: now,
            held: 0,
            inflight: 0,
            rejections: 0,
        }
    }
}

/// One row as the admin API shows it ([`GroupLimiter::top`], [`GroupLimiter::shared_row`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RowSnapshot {
    /// Whole tokens the row could spend now (held tokens subtracted), as
    /// [`Quota::remaining`].
    pub tokens: u32,
    /// Whole tokens missing from the bucket (spent and not yet refilled, rounded up): 0 for a
    /// full bucket, at most `burst`.
    pub spent: u32,
    /// Requests admitted on the row and not yet settled.
    pub inflight: u32,
    /// 429s decided on the row (rate and per-client cap; in shadow mode, the would-be ones)
    /// since it was created, saturating at `u32::MAX`.
    pub rejections: u32,
}

/// The bucket parameters in integer form.
#[derive(Debug, Clone, Copy)]
struct Bucket {
    /// Emission interval, ns per token.
    interval: u64,
    burst: u32,
}

impl Bucket {
    fn deficit(row: &Row, now: u64) -> u64 {
        gcra::deficit_ns(row.full_at, now)
    }

    /// Whether `n` tokens are available at `now`.
    fn has(self, row: &Row, n: u64, now: u64) -> bool {
        gcra::available(row.full_at, now, self.interval, self.burst, n)
    }

    /// Nanoseconds until `n` tokens are available (0 if they are); `u64::MAX` if never.
    fn wait_ns(self, row: &Row, n: u64, now: u64) -> u64 {
        gcra::wait_ns(row.full_at, now, self.interval, self.burst, n)
    }

    fn is_full(row: &Row, now: u64) -> bool {
        Self::deficit(row, now) == 0
    }

    /// The quota view of `row` at `now`: whole tokens available beyond those held, and whole
    /// seconds (rounded up) until the bucket is full again.
    fn quota(self, row: &Row, now: u64) -> Quota {
        let deficit = Self::deficit(row, now);
        let missing = deficit.div_ceil(self.interval);
        let tokens = u64::from(self.burst).saturating_sub(missing);
        let remaining = tokens.saturating_sub(u64::from(row.held));
        Quota {
            remaining: u32::try_from(remaining).unwrap_or(u32::MAX),
            reset_s: deficit.div_ceil(NS_PER_S),
        }
    }

    /// The admin view of `row` at `now`.
    fn snapshot(self, row: &Row, now: u64) -> RowSnapshot {
        let missing = Self::deficit(row, now).div_ceil(self.interval);
        RowSnapshot {
            tokens: self.quota(row, now).remaining,
            spent: u32::try_from(missing.min(u64::from(self.burst))).unwrap_or(u32::MAX),
            inflight: row.inflight,
            rejections: row.rejections,
        }
    }

    fn spend(self, row: &mut Row, now: u64) {
        row.full_at = gcra::spend(row.full_at, now, self.interval);
    }

    /// Moves `row` from this bucket to `new` at `now`, keeping the fraction of the burst it is
    /// missing (`deficit / (burst × interval)`), and keeping its held tokens backed (`deficit +
    /// held × interval ≤ burst × interval` under `new`).
    fn rescale(self, new: Bucket, row: &mut Row, now: u64) {
        let deficit = u128::from(Self::deficit(row, now));
        if deficit == 0 {
            return;
        }
        let old_full = u128::from(self.burst) * u128::from(self.interval);
        let new_full = u128::from(new.burst) * u128::from(new.interval);
        let scaled = (deficit * new_full).div_ceil(old_full.max(1));
        let backed = new_full.saturating_sub(u128::from(row.held) * u128::from(new.interval));
        let deficit = u64::try_from(scaled.min(backed)).unwrap_or(u64::MAX);
        row.full_at = now.saturating_add(deficit);
    }
}

/// What a client's bucket holds right now, for the `RateLimit` response field
/// (draft-ietf-httpapi-ratelimit-headers-10, its `r` and `t` parameters). Read with [`GroupLimiter::quota`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Quota {
    /// Whole tokens the row could spend now: `floor(tokens(now))` minus the tokens held by its
    /// unsettled requests (charge on failure), never below 0.
    pub remaining: u32,
    /// Whole seconds, rounded up, until the row's bucket is full again (0 when it is full).
    pub reset_s: u64,
}

/// Which row a permit holds its slot on: a table entry, by its number, or the shared row.
///
/// The number alone finds the entry at settlement, without a lookup and without the key: an
/// entry with requests in flight is never removed or taken over until its table is cleared (a
/// miss takes over only idle entries, [`find_row`]; `forget`, a shrink and a shed keep busy
/// ones), and a cleared entry is no longer in the table ([`table::Table::live_at_mut`]).
///
/// One `u32`, written and read whole: a decision is handed between calls through memory, and a
/// read wider than the writes it reads (a 16-byte key written in pieces, or an enum's tag and
/// number written apart and read as one word) waits for the writes to reach the cache
/// (docs/decisions.md, "The limiter's admission inlined, its permit without the key").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct RowId(u32);

const _: () = assert!(size_of::<RowId>() == 4);

impl RowId {
    /// The shared row: a number no entry has ([`table::Table::insert`] hands out numbers below
    /// `u32::MAX - 1`, and a table holds at most [`MAX_CLIENTS`] entries).
    const SHARED: RowId = RowId(u32::MAX);

    /// Table entry number `at`.
    const fn entry(at: u32) -> Self {
        debug_assert!(at != Self::SHARED.0, "no entry has the shared row's number");
        RowId(at)
    }

    /// The entry's number; `None` for the shared row.
    const fn entry_number(self) -> Option<u32> {
        if self.0 == Self::SHARED.0 {
            None
        } else {
            Some(self.0)
        }
    }

    const fn scope(self) -> Scope {
        match self.entry_number() {
            Some(_) => Scope::Client,
            None => Scope::Shared,
        }
    }
}

/// The group's budget in force, in the forms the decisions use; replaced by
/// [`GroupLimiter::retune`].
#[derive(Debug, Clone, Copy)]
struct Tuning {
    budget: Budget,
    bucket: Bucket,
    enforce: bool,
}

impl Tuning {
    /// `budget` clamped as [`GroupLimiter::new`] documents.
    fn of(budget: Budget, enforce: bool) -> Self {
        let budget = Budget {
            burst: budget.burst.max(1),
            per_client: budget.per_client.max(1),
            inflight: budget.inflight.max(1),
            max_clients: budget.max_clients.max(1),
            ..budget
        };
        Self {
            bucket: Bucket {
                interval: budget.interval_ns(),
                burst: budget.burst,
            },
            budget,
            enforce,
        }
    }
}

/// What a [`GroupLimiter`] reports as its table changes, so that metrics (`door.clients`,
/// `door.evictions`) follow it without the limiter knowing them (implemented by
/// `crate::obs::metrics::GroupMetrics`); `door.inflight` is read when it is reported, from the
/// [`InflightGauge`] the limiter hands over as it is built. Called after the group's lock is
/// released; must not block (but for [`Observer::watch_inflight`], called once, while the limiter
/// is built, with no lock held).
pub trait Observer: Send + Sync + core::fmt::Debug {
    /// `delta` entries were added to (positive) or removed from the client table.
    fn clients_changed(&self, delta: i64);
    /// A full, idle table entry was replaced by a new client.
    fn evicted(&self);
    /// Called once, by [`GroupLimiter::new`]: `gauge` reads the new limiter's requests in flight
    /// whenever the observer reports them. Nothing is reported per admission or settlement,
    /// which would cost every request two calls and, in a shared counter, two atomic additions
    /// on a cache line every core writes (docs/decisions.md, "`door.inflight` read, not
    /// counted").
    fn watch_inflight(&self, gauge: InflightGauge);
}

/// The requests in flight on one [`GroupLimiter`], read when asked ([`InflightGauge::read`]): what
/// `door.inflight` reports. It reaches the limiter's shards without keeping them alive, so that it
/// also reads the requests of a limiter a reload removed or rebuilt while they settle (their
/// permits' holders keep the shards), and reads 0 for good once the limiter and every permit are
/// gone ([`InflightGauge::is_gone`]).
#[derive(Debug, Clone)]
pub struct InflightGauge {
    shards: Arc<[Weak<Shard>]>,
}

impl InflightGauge {
    /// Requests holding a slot on the limiter now, as [`GroupLimiter::inflight`]: takes each
    /// remaining shard's lock in turn (for collection, not the request path).
    pub fn read(&self) -> u32 {
        self.shards
            .iter()
            .filter_map(Weak::upgrade)
            .map(|s| s.lock().slots.taken())
            .fold(0, u32::saturating_add)
    }

    /// Whether the limiter and all its permits are gone: [`InflightGauge::read`] is 0 from now
    /// on, and the gauge can be dropped.
    pub fn is_gone(&self) -> bool {
        self.shards.iter().all(|s| s.strong_count() == 0)
    }
}

/// An [`Observer`] that ignores everything (benchmarks, tests of the limiter alone).
#[derive(Debug, Clone, Copy, Default)]
pub struct Unobserved;

impl Observer for Unobserved {
    fn clients_changed(&self, _: i64) {}
    fn evicted(&self) {}
    fn watch_inflight(&self, _: InflightGauge) {}
}

/// Whether a settled request spends the token it holds under [`Charge::OnFailure`] (under
/// [`Charge::Always`] the token was spent at admission and this changes nothing). The caller
/// decides: door's rule, "only an upstream 4xx spends", is `crate::http::settle::charge`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Spend {
    /// Spend the held token (the request failed on the client's side).
    Token,
    /// Release the held token unspent.
    Nothing,
}

/// Table changes made by one admission, reported to the observer after the lock is released.
#[derive(Debug, Default, Clone, Copy)]
struct TableChange {
    inserted: bool,
    evicted: bool,
}

/// The most shards a group's table is split into.
pub const MAX_SHARDS: usize = 16;

/// Table entries per shard below which the table is not split further: small tables keep one
/// order (and the [`EVICT_PROBE`] oldest entries are the group's oldest).
pub const MIN_SHARD_ENTRIES: usize = 1024;

/// The shards a table of `max_clients` entries is split into: a power of two, at most
/// [`MAX_SHARDS`], each of at least [`MIN_SHARD_ENTRIES`] entries (one shard below that).
pub const fn shards_for(max_clients: usize) -> usize {
    let mut n = 1;
    while n < MAX_SHARDS && max_clients / (n * 2) >= MIN_SHARD_ENTRIES {
        n *= 2;
    }
    n
}

/// What one shard's mutex guards: its slice of the client table (or, for the group's shared
/// shard, the shared row), and a copy of the tuning.
///
/// In declaration order (`repr(C)`): the slots every admission and settlement writes come first,
/// next to the mutex's own word, so that both share a cache line (see [`Shard`]); the rest is
/// only read by a request of a client in the table, and written when the table changes or the
/// shared row decides.
#[derive(Debug)]
#[repr(C)]
struct ShardState {
    /// The group's in-flight slots this shard holds and has leased ([`slots`]).
    slots: Lease,
    tuning: Tuning,
    table: Table<Row>,
    /// The shared row (used in the group's shared shard only).
    shared: Row,
    /// Tokens spent per client since the last [`GroupLimiter::drain_spent`], when
    /// [`GroupLimiter::record_spent`] turned it on (a cluster sync); `None` otherwise.
    journal: Option<Journal>,
}

/// Tokens spent per client since the last drain, less those refunded: a bounded map, the oldest
/// entry dropped (and counted) when a new client would pass its capacity. A refund of a token an
/// earlier drain took makes a count of -1: the sync gives the token back to the store.
#[derive(Debug)]
struct Journal {
    spent: LruCache<PrefixKey, i32>,
    dropped: u64,
    /// Clients forgotten ([`GroupLimiter::forget`]) since the last drain: a sync under way, which
    /// drained before, must not fold their debts back ([`GroupLimiter::fold_deficit`]).
    forgotten: HashSet<PrefixKey>,
}

impl ShardState {
    /// The row a permit's slot is on: for a table entry its key and number beside the row;
    /// `None` for an entry no longer in the table (its table was cleared).
    fn row(&mut self, id: RowId) -> (Option<(PrefixKey, u32)>, Option<&mut Row>) {
        match id.entry_number() {
            Some(at) => match self.table.live_at_mut(at) {
                Some((key, row)) => {
                    // Not while unwinding: a permit dropped by a failing test would abort the
                    // test binary.
                    debug_assert!(
                        row.inflight > 0 || std::thread::panicking(),
                        "a permit's entry counts its slot"
                    );
                    (Some((key, at)), Some(row))
                }
                None => (None, None),
            },
            None => (None, Some(&mut self.shared)),
        }
    }

    /// Removes `key`'s entry number `at` if it is idle and the table is over its capacity (a
    /// reload shrank `max_clients` while the entry was busy: [`GroupLimiter::retune`]); returns
    /// whether it did.
    fn shed_if_over(&mut self, key: &PrefixKey, at: u32) -> bool {
        self.table.over_cap()
            && self
                .table
                .at_mut(at, key)
                .is_some_and(|row| row.inflight == 0)
            && self.table.remove(key).is_some()
    }

    /// Records that `key` spent one token (`+1`) or had one refunded (`-1`): a refund of a spend
    /// recorded since the last drain cancels it, one of a spend an earlier drain took is
    /// recorded as `-1` of its own, so that the store gets the token back too.
    ///
    /// Inlined: without a cluster there is no journal, and the request path pays one test for it,
    /// not a call.
    #[inline]
    fn note(&mut self, key: PrefixKey, spent: bool) {
        if let Some(j) = self.journal.as_mut() {
            j.note(key, spent);
        }
    }
}

impl Journal {
    /// [`ShardState::note`] with a journal.
    fn note(&mut self, key: PrefixKey, spent: bool) {
        let delta = if spent { 1 } else { -1 };
        if let Some(n) = self.spent.get_mut(&key) {
            *n = n.saturating_add(delta);
        } else if self.spent.push(key, delta).is_some() {
            self.dropped += 1;
        }
    }
}

/// One shard: a part of the table behind its own mutex. A permit names its shard (not the whole
/// table), so settling touches only that shard (and, now and then, the group's pool of slots).
///
/// The mutex comes first (`repr(C)`), right after the `Arc`'s reference counts: the words every
/// request writes, the mutex's word and the shard's slots, lie within the first 32 bytes of the
/// allocation, as std lays out `Arc` and, on Linux, its futex `Mutex` today (the word before the
/// data, 8 bytes in; not a documented promise). With two cores they then move between the cores
/// as one cache line (two when glibc's 16-byte aligned allocation starts in the last 16 bytes of
/// a line); the slots used to be 184 bytes after the mutex's word, on a line of their own
/// (docs/decisions.md, "The shard's hot words on one cache line"). A permit no longer takes the
/// `Arc`'s strong count ("The permit reaches its shards through its holder's reference").
#[derive(Debug)]
#[repr(C)]
struct Shard {
    state: Mutex<ShardState>,
    core: Arc<Core>,
}

const _: () = assert!(core::mem::offset_of!(Shard, state) == 0);
const _: () = assert!(core::mem::offset_of!(ShardState, slots) == 0);

/// A number as an error message names it: as Rust writes it (`0.5`, `2`, `NaN`) when that takes
/// at most 24 characters, otherwise in exponent form (`1e-300`, `1.5e40`), so that a value far
/// out of range is named in one short line rather than in hundreds of digits.
#[must_use]
pub fn number_text(value: f64) -> String {
    let plain = value.to_string();
    if plain.len() <= 24 {
        plain
    } else {
        format!("{value:e}")
    }
}

/// What every shard of a group shares: the pool of in-flight slots against the cap, the clock
/// and the observer.
#[derive(Debug)]
struct Core {
    /// The group's in-flight slots, leased to the shards in batches ([`slots`]).
    pool: Pool,
    clock: Arc<dyn Clock>,
    observer: Arc<dyn Observer>,
}

impl Shard {
    fn lock(&self) -> MutexGuard<'_, ShardState> {
        // Nothing panics while the lock is held, but a poisoned lock must not take the door down.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// What follows a freed slot once the lock is released: `shed` when the slot's entry left
    /// the table with it ([`ShardState::shed_if_over`]), for the observer.
    fn slot_freed(&self, shed: bool) {
        if shed {
            self.core.observer.clients_changed(-1);
        }
    }

    /// Frees a slot taken on row `id` of this shard; under charge on failure, releases the held
    /// token and spends it if `spend` says so. A table entry left idle past a shrunk capacity
    /// leaves the table.
    fn release(&self, id: RowId, spend: Spend) {
        let shed;
        {
            let mut state = self.lock();
            let state = &mut *state;
            let t = state.tuning;
            let (entry, row) = state.row(id);
            if let Some(row) = row {
                row.inflight = row.inflight.saturating_sub(1);
                if t.budget.charge == Charge::OnFailure {
                    row.held = row.held.saturating_sub(1);
                    if spend == Spend::Token {
                        // The clock is read only when a token is spent.
                        t.bucket.spend(row, self.core.clock.now_ns());
                        if let Some((k, _)) = entry {
                            state.note(k, true);
                        }
                    }
                }
            }
            free_slot(&mut state.slots, id, &self.core.pool);
            shed = entry.is_some_and(|(k, at)| state.shed_if_over(&k, at));
        }
        self.slot_freed(shed);
    }

    /// Frees a slot and un-spends its token ([`Permit::refund`]); as [`Shard::release`], an
    /// idle entry past a shrunk capacity leaves the table.
    fn refund(&self, id: RowId) {
        let shed;
        {
            let mut state = self.lock();
            let state = &mut *state;
            let t = state.tuning;
            let (entry, row) = state.row(id);
            if let Some(row) = row {
                row.inflight = row.inflight.saturating_sub(1);
                match t.budget.charge {
                    Charge::OnFailure => row.held = row.held.saturating_sub(1),
                    Charge::Always => {
                        row.full_at = row.full_at.saturating_sub(t.bucket.interval);
                        if let Some((k, _)) = entry {
                            state.note(k, false);
                        }
                    }
                }
            }
            free_slot(&mut state.slots, id, &self.core.pool);
            shed = entry.is_some_and(|(k, at)| state.shed_if_over(&k, at));
        }
        self.slot_freed(shed);
    }
}

/// What the keys of a limiter's table stand for: how the admin API writes them
/// (`GET /clients`) and reads them back (`DELETE /clients/{key}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KeyKind {
    /// Client keys (`crate::client::key`): an IPv4 /32 or IPv6 /64 prefix, written as one
    /// (`198.51.100.7/32`, `2001:db8:1:2::/64`). Every route group and the IP plane.
    #[default]
    Client,
    /// Keyed hashes of credentials (`crate::client::credential`, the session plane): 16 bytes
    /// that are no address, written [`CREDENTIAL_KEY_PREFIX`] and 32 lower-case hex digits. The
    /// hash's key is random per process, so the text names the same credential only until door
    /// restarts.
    Credential,
}

/// How the admin API writes a [`KeyKind::Credential`] key: `credential:` then its 16 bytes in hex.
pub const CREDENTIAL_KEY_PREFIX: &str = "credential:";

impl KeyKind {
    /// `key` as the admin API writes it for a table of this kind.
    pub fn text(self, key: &PrefixKey) -> String {
        match self {
            Self::Client => key.to_string(),
            Self::Credential => format!(
                "{CREDENTIAL_KEY_PREFIX}{:032x}",
                u128::from_be_bytes(key.addr)
            ),
        }
    }

    /// The credential key `raw` writes ([`KeyKind::text`] of a [`KeyKind::Credential`] key):
    /// [`CREDENTIAL_KEY_PREFIX`] and exactly 32 hex digits (either case); `None` for anything
    /// else.
    pub fn parse_credential(raw: &str) -> Option<PrefixKey> {
        let hex = raw.strip_prefix(CREDENTIAL_KEY_PREFIX)?;
        if hex.len() != 32 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        let n = u128::from_str_radix(hex, 16).ok()?;
        Some(PrefixKey {
            addr: n.to_be_bytes(),
        })
    }
}

/// The limiter of one route group (docs/design.md, "Limits").
///
/// `Send + Sync`; share it as `Arc<GroupLimiter>`. The client table is split into
/// [`shards_for`]`(max_clients)` shards by key hash, each a bounded LRU table of its share of
/// `max_clients` behind its own mutex; the shared row has a shard of its own; the group's
/// in-flight slots are a pool the shards lease from in batches (`limit/slots.rs`), exact against
/// the cap. An admission takes one shard lock (two when it is decided on the shared row; every
/// shard's in turn, once, when the pool runs dry), a settlement one; no lock is held across an
/// await, and none allocates once the table is full.
#[derive(Debug)]
pub struct GroupLimiter {
    group: String,
    /// The shards, which outlive the limiter while permits reach them ([`Shards`]).
    set: Arc<Shards>,
    /// What the table's keys stand for ([`GroupLimiter::keyed_by`]).
    keys: KeyKind,
    /// The configured budget and the divisor of its rate in force, under one lock, so that a
    /// reload ([`GroupLimiter::retune`]) and a cluster's degraded mode
    /// ([`GroupLimiter::divide_rate`]) each change their own part and never undo the other's.
    tune: Mutex<Tune>,
}

/// What a limiter is tuned to: the budget in force is `configured` with its rate divided by
/// `divisor`.
#[derive(Debug, Clone, Copy)]
struct Tune {
    configured: Budget,
    divisor: u32,
}

impl GroupLimiter {
    /// A limiter for group `group` with `budget` (check it with [`Budget::validate`] first; an
    /// invalid budget is clamped: zero counts act as 1, the rate as in [`Budget::interval_ns`]).
    /// `enforce = false` is shadow mode (`disable_anon_route_limits`): every request is admitted
    /// and [`Permit::shadow_rejection`] says what enforcement would have done. Time comes only from
    /// `clock`; table changes go to `observer`, which is handed the limiter's [`InflightGauge`].
    pub fn new(
        group: &str,
        budget: Budget,
        enforce: bool,
        clock: Arc<dyn Clock>,
        observer: Arc<dyn Observer>,
    ) -> Self {
        let tuning = Tuning::of(budget, enforce);
        let now = clock.now_ns();
        let n = shards_for(tuning.budget.max_clients);
        let core = Arc::new(Core {
            // The table's shards and the shared row's.
            pool: Pool::new(tuning.budget.inflight, n + 1),
            clock,
            observer,
        });
        let shard = |cap: usize| {
            Arc::new(Shard {
                state: Mutex::new(ShardState {
                    tuning,
                    table: Table::new(cap),
                    shared: Row::full(now),
                    slots: Lease::default(),
                    journal: None,
                }),
                core: Arc::clone(&core),
            })
        };
        let shards: Box<[Arc<Shard>]> = (0..n)
            .map(|i| shard(share(tuning.budget.max_clients, n, i)))
            .collect();
        let shared_shard = shard(1);
        core.observer.watch_inflight(InflightGauge {
            shards: shards
                .iter()
                .chain([&shared_shard])
                .map(Arc::downgrade)
                .collect(),
        });
        Self {
            group: group.to_owned(),
            set: Arc::new(Shards {
                list: shards,
                shared: shared_shard,
                core,
                enforce: AtomicBool::new(tuning.enforce),
            }),
            keys: KeyKind::Client,
            tune: Mutex::new(Tune {
                configured: budget,
                divisor: 1,
            }),
        }
    }

    /// The group's name (`door.group`).
    pub fn group(&self) -> &str {
        &self.group
    }

    /// This limiter, its keys standing for `keys` (a new limiter's are [`KeyKind::Client`]). Only
    /// what the admin API shows changes: the limiter decides on any key alike.
    #[must_use]
    pub fn keyed_by(mut self, keys: KeyKind) -> Self {
        self.keys = keys;
        self
    }

    /// What the table's keys stand for ([`GroupLimiter::keyed_by`]).
    pub fn key_kind(&self) -> KeyKind {
        self.keys
    }

    /// The budget in force (after clamping, see [`GroupLimiter::new`]): the configured one with
    /// its rate divided while a cluster is degraded ([`GroupLimiter::divide_rate`]).
    pub fn budget(&self) -> Budget {
        self.set.shared.lock().tuning.budget
    }

    /// The budget the limiter was last given by [`GroupLimiter::new`] or
    /// [`GroupLimiter::retune`], whatever [`GroupLimiter::divide_rate`] divides.
    pub fn configured_budget(&self) -> Budget {
        self.tune().configured
    }

    /// The divisor of the configured rate in force: 1 unless [`GroupLimiter::divide_rate`] set
    /// another.
    pub fn rate_divisor(&self) -> u32 {
        self.tune().divisor
    }

    fn tune(&self) -> MutexGuard<'_, Tune> {
        self.tune.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Runs the configured rate divided by `n` (tokens per second; at least [`MIN_RATE`]), as a
    /// cluster's degraded mode does (`rate / N` for N doors), until called again (`n = 1`
    /// restores it). A later [`GroupLimiter::retune`] keeps the divisor, so a reload while
    /// degraded applies its new budget divided. Rows are rescaled as for a retune. Does nothing
    /// when `n` (0 counts as 1) is the divisor in force.
    pub fn divide_rate(&self, n: u32) {
        let n = n.max(1);
        let mut tune = self.tune();
        if tune.divisor == n {
            return;
        }
        tune.divisor = n;
        self.apply(tune.configured.with_rate_divided(n), self.enforcing());
    }

    /// `false` in shadow mode.
    pub fn enforcing(&self) -> bool {
        self.set.enforcing()
    }

    /// Applies a reloaded `budget` and shadow mode to the live group (SIGHUP), keeping every
    /// client's row: a bucket keeps the *fraction* of its burst it was missing (a drained client
    /// stays drained, a half-full one is half full of the new burst; nothing is refilled to
    /// full), in-flight requests keep their slots (caps lowered below them admit nothing new until
    /// they settle), and a smaller `max_clients` drops each shard's oldest idle entries (the
    /// number of shards stays, each keeping room for at least one entry). Entries with requests
    /// in flight stay, so their per-client caps hold and their permits settle on them; each
    /// leaves the table when its last request settles, until the table is within its new size.
    /// The charge mode must not change (a held token's meaning would); the caller builds a new
    /// limiter then. While [`GroupLimiter::divide_rate`] divides the rate, `budget`'s rate is
    /// divided alike.
    pub fn retune(&self, budget: Budget, enforce: bool) {
        let mut tune = self.tune();
        tune.configured = budget;
        self.apply(budget.with_rate_divided(tune.divisor), enforce);
    }

    /// Puts `budget` in force (the retune of [`GroupLimiter::retune`]); the caller holds the
    /// tune lock, so that two retunes never interleave.
    fn apply(&self, budget: Budget, enforce: bool) {
        let new = Tuning::of(budget, enforce);
        let now = self.set.core.clock.now_ns();
        let n = self.set.list.len();
        let mut dropped = 0;
        let pool = &self.set.core.pool;
        if pool.cap() != u64::from(new.budget.inflight) {
            pool.set_cap(new.budget.inflight, n + 1);
            // Idle slots leased under the old cap come back, the new batch applies from now.
            self.set.sweep();
        }
        for (i, shard) in self.set.list.iter().chain([&self.set.shared]).enumerate() {
            let mut state = shard.lock();
            let old = state.tuning.bucket;
            for row in state.table.values_mut() {
                old.rescale(new.bucket, row, now);
            }
            old.rescale(new.bucket, &mut state.shared, now);
            if i < n {
                dropped += state
                    .table
                    .resize(share(new.budget.max_clients, n, i), |row| row.inflight > 0);
            }
            state.tuning = new;
        }
        self.set.enforce.store(enforce, Ordering::Release);
        if dropped > 0 {
            self.set
                .core
                .observer
                .clients_changed(-i64::try_from(dropped).unwrap_or(i64::MAX));
        }
    }

    /// Entries in the client table (for `/status` and `door.clients`); at most `max_clients`,
    /// except after a reload shrank it while more clients had requests in flight, or below the
    /// number of shards ([`GroupLimiter::retune`]).
    pub fn tracked_clients(&self) -> usize {
        self.set.list.iter().map(|s| s.lock().table.len()).sum()
    }

    /// Requests holding a slot in the group (≤ `inflight` when enforcing, except after a reload
    /// lowered the cap below the requests then in flight). Takes every shard's lock in turn: for
    /// `/status` and tests, not the request path.
    pub fn inflight(&self) -> u32 {
        self.set
            .list
            .iter()
            .chain([&self.set.shared])
            .map(|s| s.lock().slots.taken())
            .fold(0, u32::saturating_add)
    }

    /// The quota of client `key` now, read-only: its table entry if it has one (not marked
    /// used), else a new full bucket if its shard has room, else the shared row (which is where
    /// [`GroupLimiter::admit`] would decide it). Changes nothing.
    pub fn quota(&self, key: &PrefixKey) -> Quota {
        let now = self.set.core.clock.now_ns();
        let (row, bucket) = {
            let state = self.set.shard(key).lock();
            match state.table.peek(key) {
                Some(row) => (Some(*row), state.tuning.bucket),
                None if !state.table.is_full() => (Some(Row::full(now)), state.tuning.bucket),
                None => (None, state.tuning.bucket),
            }
        };
        let row = row.unwrap_or_else(|| self.set.shared.lock().shared);
        bucket.quota(&row, now)
    }

    /// The policy window in whole seconds (rounded up): the time an empty bucket takes to
    /// refill its `burst` tokens, the `w` of the `RateLimit-Policy` field
    /// (draft-ietf-httpapi-ratelimit-headers-10).
    pub fn window_s(&self) -> u64 {
        let bucket = self.set.shared.lock().tuning.bucket;
        u64::from(bucket.burst)
            .saturating_mul(bucket.interval)
            .div_ceil(NS_PER_S)
            .max(1)
    }

    /// Whether `key` has a table entry, without refreshing it.
    pub fn is_tracked(&self, key: &PrefixKey) -> bool {
        self.set.shard(key).lock().table.contains(key)
    }

    /// Starts recording, per client, the tokens spent on its table entry (for a cluster sync,
    /// `crate::cluster`): at most `capacity` clients in all (split over the shards), the oldest
    /// dropped (and counted, see [`GroupLimiter::drain_spent`]) when a new one would pass it.
    /// Spends on the shared row are not recorded (they have no client). Idempotent: a second call
    /// keeps what is recorded. Off by default; costs one map update per spend when on.
    pub fn record_spent(&self, capacity: usize) {
        let n = self.set.list.len();
        for (i, shard) in self.set.list.iter().enumerate() {
            let mut state = shard.lock();
            if state.journal.is_none() {
                let cap = NonZeroUsize::new(share(capacity, n, i)).unwrap_or(NonZeroUsize::MIN);
                state.journal = Some(Journal {
                    spent: LruCache::new(cap),
                    dropped: 0,
                    forgotten: HashSet::new(),
                });
            }
        }
    }

    /// Moves the clients charged or refunded since the last call, with the tokens each spent
    /// here less those refunded, into `out` (cleared first; clients whose spends and refunds
    /// cancel out are skipped), and returns how many clients were dropped from the record since
    /// the last call because it was full. A count is negative when refunds of tokens an earlier
    /// call took outnumber the new spends (a request admitted before that call and refunded
    /// after it: a stream's plane token, [`Permit::refund`]). Empty unless
    /// [`GroupLimiter::record_spent`] was called.
    pub fn drain_spent(&self, out: &mut Vec<(PrefixKey, i32)>) -> u64 {
        out.clear();
        let mut dropped = 0;
        for shard in &self.set.list {
            let mut state = shard.lock();
            if let Some(j) = state.journal.as_mut() {
                out.extend(core::iter::from_fn(|| j.spent.pop_lru()).filter(|&(_, n)| n != 0));
                dropped += core::mem::take(&mut j.dropped);
                j.forgotten.clear();
            }
        }
        dropped
    }

    /// Folds a remote deficit for client `key` into its table entry: its bucket becomes
    /// `full_at = now + max(local deficit, deficit_ns)` (ns on this limiter's clock), so that it
    /// holds no more than the cluster's shared bucket. The remote deficit is not capped at
    /// `burst × interval`: tokens the cluster admitted past its budget between syncs are a debt
    /// this client repays before it is admitted again (a retune caps it, see
    /// [`GroupLimiter::retune`]). Tokens refunded here since the last drain, which the deficit
    /// still holds (the store gets them back at the next sync), are taken off it first. Does
    /// nothing (and returns `false`) when `key` has no entry, or was forgotten since the last
    /// [`GroupLimiter::drain_spent`] (its reset row keeps its full bucket; the cluster deletes the
    /// debt at its next sync).
    pub fn fold_deficit(&self, key: &PrefixKey, deficit_ns: u64) -> bool {
        let now = self.set.core.clock.now_ns();
        let mut state = self.set.shard(key).lock();
        let state = &mut *state;
        let refunded = match &state.journal {
            Some(j) if j.forgotten.contains(key) => return false,
            Some(j) => j.spent.peek(key).map_or(0, |&n| n.min(0).unsigned_abs()),
            None => 0,
        };
        let deficit_ns = deficit_ns
            .saturating_sub(u64::from(refunded).saturating_mul(state.tuning.bucket.interval));
        match state.table.peek_mut(key) {
            Some(row) => {
                row.full_at = row.full_at.max(now.saturating_add(deficit_ns));
                true
            }
            None => false,
        }
    }

    /// The `n` table entries with the most rejections, then the most tokens spent (ties by
    /// key), most first: read-only (no entry is marked used). Walks every shard, one lock
    /// at a time: O(`max_clients`), for the admin API, never the request path.
    pub fn top(&self, n: usize) -> Vec<(PrefixKey, RowSnapshot)> {
        let now = self.set.core.clock.now_ns();
        let mut rows: Vec<(PrefixKey, RowSnapshot)> = Vec::new();
        for shard in &self.set.list {
            let state = shard.lock();
            let bucket = state.tuning.bucket;
            rows.extend(
                state
                    .table
                    .iter()
                    .map(|(k, row)| (*k, bucket.snapshot(row, now))),
            );
        }
        let order = |a: &(PrefixKey, RowSnapshot), b: &(PrefixKey, RowSnapshot)| {
            b.1.rejections
                .cmp(&a.1.rejections)
                .then(b.1.spent.cmp(&a.1.spent))
                .then(a.0.cmp(&b.0))
        };
        if n < rows.len() {
            rows.select_nth_unstable_by(n, order);
            rows.truncate(n);
        }
        rows.sort_unstable_by(order);
        rows
    }

    /// The shared row (the clients the full table could not hold), read-only.
    pub fn shared_row(&self) -> RowSnapshot {
        let now = self.set.core.clock.now_ns();
        let state = self.set.shared.lock();
        state.tuning.bucket.snapshot(&state.shared, now)
    }

    /// Forgets `key` (the admin API's `DELETE /clients/{prefix}`): its entry is removed, so its
    /// next request starts with a full bucket and no rejections, and its spends not yet drained
    /// for a cluster ([`GroupLimiter::record_spent`]) are dropped. An entry with requests in
    /// flight is kept for their slots (and held tokens) and reset instead: a full bucket, no
    /// rejections. Returns whether the key had an entry.
    pub fn forget(&self, key: &PrefixKey) -> bool {
        let now = self.set.core.clock.now_ns();
        let removed = {
            let mut state = self.set.shard(key).lock();
            // Its spends not yet sent to a cluster are forgotten with it, and a sync under way
            // does not fold its debt back.
            if let Some(j) = state.journal.as_mut() {
                j.spent.pop(key);
                j.forgotten.insert(*key);
            }
            match state.table.peek_mut(key) {
                None => return false,
                Some(row) if row.inflight > 0 => {
                    // Full is always backed: held ≤ per_client ≤ burst under charge on failure.
                    row.full_at = now;
                    row.rejections = 0;
                    false
                }
                Some(_) => state.table.remove(key).is_some(),
            }
        };
        if removed {
            self.set.core.observer.clients_changed(-1);
        }
        true
    }

    /// Takes back the count of `rejection`, a refusal of `key` this limiter made, from the row
    /// that counted it (the client's, or the shared row): the caller answered the request anyway
    /// (an over-budget health probe gets the cached status, never a 429), so it is not one of the
    /// rejections `/clients` shows. A group-cap refusal counted on no row; nothing to take back.
    pub fn uncount_rejection(&self, key: &PrefixKey, rejection: &Rejection) {
        let take_back = |row: &mut Row| row.rejections = row.rejections.saturating_sub(1);
        match rejection.scope {
            Scope::Client => {
                if let Some(row) = self.set.shard(key).lock().table.peek_mut(key) {
                    take_back(row);
                }
            }
            Scope::Shared => take_back(&mut self.set.shared.lock().shared),
            Scope::Group => {}
        }
    }

    /// The limiter's shards, for a caller whose permits must outlive a borrow of the limiter
    /// ([`Permit::admit`] through a reference it keeps).
    pub fn shards(&self) -> &Arc<Shards> {
        &self.set
    }

    /// Admits a request from client `key` through a borrow of this limiter
    /// ([`Permit::admit`], which says how it decides); the permit settles before the borrow ends.
    ///
    /// # Errors
    ///
    /// As [`Permit::admit`].
    #[expect(
        clippy::inline_always,
        reason = "inlined as Permit::admit is (docs/decisions.md, \"The limiter's admission inlined, its permit without the key\")"
    )]
    #[inline(always)]
    pub fn admit(&self, key: PrefixKey) -> Result<Permit<&Shards>, Rejection> {
        Permit::admit(&*self.set, key)
    }
}

/// The shards of one group's limiter: its client table in parts, each behind its own mutex, the
/// shared row's, and what they share (the pool of in-flight slots, the clock, the observer, the
/// shadow-mode switch). Admission and settlement touch only this. A [`GroupLimiter`] owns it and
/// permits reach it ([`ShardsRef`]): borrowed from the limiter, or through a reference the
/// caller keeps, so that a request a reload left behind (its group removed or rebuilt) settles on
/// the shards that admitted it.
#[derive(Debug)]
pub struct Shards {
    core: Arc<Core>,
    /// The client table's shards, by key hash ([`shard_index`]).
    list: Box<[Arc<Shard>]>,
    shared: Arc<Shard>,
    /// `false` in shadow mode.
    enforce: AtomicBool,
}

impl Shards {
    /// `false` in shadow mode.
    fn enforcing(&self) -> bool {
        self.enforce.load(Ordering::Acquire)
    }

    /// The shard of `key`, with its number: its place in the table's shards.
    fn shard_of(&self, key: &PrefixKey) -> (u32, &Arc<Shard>) {
        let i = shard_index(key, self.list.len());
        match self.list.get(i) {
            Some(shard) => (u32::try_from(i).unwrap_or(u32::MAX), shard),
            None => (self.shared_number(), &self.shared),
        }
    }

    /// The shard of `key`.
    fn shard(&self, key: &PrefixKey) -> &Shard {
        self.shard_of(key).1
    }

    /// The shared row's shard's number: one past the table's.
    fn shared_number(&self) -> u32 {
        u32::try_from(self.list.len()).unwrap_or(u32::MAX)
    }

    /// Shard number `number` ([`Shards::shard_of`]); the shared row's for any number past the
    /// table's.
    fn at(&self, number: u32) -> &Shard {
        usize::try_from(number)
            .ok()
            .and_then(|i| self.list.get(i))
            .unwrap_or(&self.shared)
    }

    /// The decision: the group cap (a slot taken on the deciding shard), then the row's cap and
    /// bucket; on admission the slot stays taken, with the row's slot (and token).
    /// Returns the deciding shard's number ([`Shards::at`]) with the row. Inlined into
    /// [`Permit::admit`], for the reason given there.
    #[expect(
        clippy::inline_always,
        reason = "measured: returned from a call, the decision is read back through a store-forwarding stall"
    )]
    #[inline(always)]
    fn decide(&self, key: PrefixKey) -> (Result<(u32, RowId), Rejection>, TableChange) {
        let mut change = TableChange::default();
        let now = self.core.clock.now_ns();
        let pool = &self.core.pool;
        let (number, shard) = self.shard_of(&key);
        // At the group cap, refused without touching the shard ([`Pool::is_full`]).
        if pool.is_full() {
            return (Err(Rejection::group_cap()), change);
        }
        let moved = {
            let Some(mut state) = self.slot_on(shard) else {
                return (Err(Rejection::group_cap()), change);
            };
            let t = state.tuning;
            let spends = t.budget.charge == Charge::Always;
            // Hit: one lookup (which also marks the entry used).
            let decision = if let Some((at, row)) = state.table.get_mut(&key) {
                Some(take(&t, row, RowId::entry(at), now))
            } else {
                find_row(&mut state.table, key, now, &mut change).map(|at| {
                    match state.table.at_mut(at, &key) {
                        Some(row) => take(&t, row, RowId::entry(at), now),
                        // find_row only says so for a key it just inserted; unreachable, and
                        // harmless: the request is refused rather than admitted without
                        // accounting.
                        None => Err(Rejection::cap(
                            RejectReason::ClientConcurrency,
                            Scope::Client,
                        )),
                    }
                })
            };
            match decision {
                Some(Ok(id)) => {
                    if spends {
                        state.note(key, true);
                    }
                    return (Ok((number, id)), change);
                }
                Some(Err(rejection)) => {
                    state.slots.free(pool);
                    return (Err(rejection), change);
                }
                // The shared row decides: the slot moves to its shard, leased still.
                None => state.slots.hand_over(),
            }
        };
        let mut state = if moved {
            let mut state = self.shared.lock();
            state.slots.receive();
            state
        } else {
            // Unreachable (the slot was taken under the same lock), and harmless: the shared
            // row's shard takes a slot of its own.
            let Some(state) = self.slot_on(&self.shared) else {
                return (Err(Rejection::group_cap()), change);
            };
            state
        };
        let t = state.tuning;
        let decision = take(&t, &mut state.shared, RowId::SHARED, now);
        if decision.is_err() {
            free_slot(&mut state.slots, RowId::SHARED, pool);
        }
        (decision.map(|id| (self.shared_number(), id)), change)
    }

    /// Takes one of the group's slots on `shard` and returns the shard's lock, or `None` when the
    /// group cap is reached (without taking the lock when the pool says so, [`Pool::is_full`]).
    /// When the pool is dry and the group not yet tight, other shards may hold idle leased slots:
    /// the lock is released, the group turned tight and every shard's idle slots taken back
    /// ([`Pool::tighten`]), and the slot tried once more.
    #[expect(
        clippy::inline_always,
        reason = "measured: called, its guard is returned through memory and read back, 8 ns an admission on one thread"
    )]
    #[inline(always)]
    fn slot_on<'s>(&'s self, shard: &'s Shard) -> Option<MutexGuard<'s, ShardState>> {
        let pool = &self.core.pool;
        if pool.is_full() {
            return None;
        }
        let mut state = shard.lock();
        if state.slots.take(pool) {
            return Some(state);
        }
        // No shard keeps an idle slot while the group is tight or leases one slot at a time.
        if pool.is_tight() || !pool.leases_batches() {
            return None;
        }
        drop(state);
        self.sweep();
        state = shard.lock();
        state.slots.take(pool).then_some(state)
    }

    /// Turns the group tight and takes every shard's idle leased slots back, one shard lock at a
    /// time (none may be held by the caller); the group stays tight only while more than half the
    /// cap is in use ([`Pool::tighten`]).
    fn sweep(&self) {
        let pool = &self.core.pool;
        pool.tighten();
        for s in self.list.iter().chain([&self.shared]) {
            s.lock().slots.give_back_idle(pool);
        }
        pool.swept();
    }
}

/// What a [`Permit`] reaches its group's [`Shards`] through, from its admission to its
/// settlement: a borrow of the limiter's (`&Shards`, [`GroupLimiter::admit`]: no reference
/// count), an `Arc<Shards>`, or any holder the caller keeps anyway (door's request path: the
/// group's shards and its instruments behind one reference, `crate::http::settle::Group`).
///
/// An implementation must reach the same [`Shards`] for as long as it lives: a permit settles on
/// the shards its handle reaches then, and other shards would be freed a slot they never gave.
pub trait ShardsRef {
    /// The shards this reaches: the same ones every time.
    fn shards(&self) -> &Shards;
}

impl ShardsRef for &Shards {
    fn shards(&self) -> &Shards {
        self
    }
}

impl ShardsRef for Arc<Shards> {
    fn shards(&self) -> &Shards {
        self
    }
}

/// A limiter that goes (its group removed by a reload, or rebuilt for a new charge mode) empties
/// its table and takes the entries out of the observer's count, as a shrinking reload does: the
/// group's `door.clients` would otherwise keep them, and a group removed and added again would
/// count its clients twice. Its requests still in flight keep their slots (their permits' holders
/// keep the shards, which its [`InflightGauge`] goes on reading until they settle); their rows are
/// gone, so a settlement no longer sheds (and counts) a row a second time.
impl Drop for GroupLimiter {
    fn drop(&mut self) {
        // Each table is replaced by an empty one of one entry, which frees its memory: the shards
        // live on while a request the limiter admitted is in flight (a stream may last hours),
        // and settling needs no row.
        let tracked: usize = self
            .set
            .list
            .iter()
            .map(|s| core::mem::replace(&mut s.lock().table, Table::new(1)).len())
            .sum();
        if tracked > 0 {
            self.set
                .core
                .observer
                .clients_changed(-i64::try_from(tracked).unwrap_or(i64::MAX));
        }
    }
}

/// Frees the slot of a request decided on row `id`. The shared row's shard only ever receives
/// slots handed over ([`slots::Lease::receive`]) and never takes one, so it keeps none idle: its
/// freed slot goes back to the pool at once.
fn free_slot(slots: &mut Lease, id: RowId, pool: &Pool) {
    slots.free(pool);
    if id == RowId::SHARED {
        slots.give_back_idle(pool);
    }
}

/// The table entries of shard `i` of `n` for a table of `max_clients`: an even split, the first
/// `max_clients % n` shards one more, so that the shards hold exactly `max_clients` in all.
fn share(max_clients: usize, n: usize, i: usize) -> usize {
    let n = n.max(1);
    max_clients / n + usize::from(i < max_clients % n)
}

/// The shard of `key` among `n` (a power of two): a multiplicative hash of its 16 bytes.
fn shard_index(key: &PrefixKey, n: usize) -> usize {
    // Little-endian: the low half is the key's first eight bytes, the high half its last eight.
    let x = u128::from_le_bytes(key.addr);
    #[expect(
        clippy::cast_possible_truncation,
        reason = "the two 64-bit halves of the key"
    )]
    let (first, last) = (x as u64, (x >> 64) as u64);
    let h = (first ^ last.rotate_left(29)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    // The top bits mix best; n ≤ MAX_SHARDS.
    usize::try_from(h >> 60).unwrap_or(0) & (n.max(1) - 1)
}

/// The per-client cap and the bucket on `row`; on admission takes the slot (and the token, or
/// holds one under charge on failure).
fn take(t: &Tuning, row: &mut Row, id: RowId, now: u64) -> Result<RowId, Rejection> {
    if row.inflight >= t.budget.per_client {
        row.rejections = row.rejections.saturating_add(1);
        return Err(Rejection::cap(RejectReason::ClientConcurrency, id.scope()));
    }
    let need = 1 + u64::from(row.held);
    if !t.bucket.has(row, need, now) {
        row.rejections = row.rejections.saturating_add(1);
        let wait = t.bucket.wait_ns(row, need, now);
        return Err(Rejection {
            reason: RejectReason::Rate,
            scope: id.scope(),
            retry_after_s: wait.div_ceil(NS_PER_S).max(1),
        });
    }
    match t.budget.charge {
        Charge::Always => t.bucket.spend(row, now),
        Charge::OnFailure => row.held += 1,
    }
    row.inflight += 1;
    Ok(id)
}

/// Finds a place for `key`, which is not in `table`: a new full entry if the table has room,
/// else, after up to [`SECOND_CHANCES`] second chances, the first full and idle entry among the
/// [`EVICT_PROBE`] oldest, replaced in place (each ineligible one probed is refreshed). Returns
/// the entry's number; `None` when there is none (the shared row decides).
fn find_row(
    table: &mut Table<Row>,
    key: PrefixKey,
    now: u64,
    change: &mut TableChange,
) -> Option<u32> {
    if !table.is_full() {
        let at = table.insert(key, Row::full(now));
        change.inserted = at.is_some();
        return at;
    }
    table.second_chances(SECOND_CHANCES);
    let (oldest, probed) = table.oldest::<EVICT_PROBE>();
    for &at in oldest.iter().take(probed) {
        let eligible = table
            .value_at(at)
            .is_some_and(|row| row.inflight == 0 && Bucket::is_full(row, now));
        if eligible && table.replace(at, key, Row::full(now)) {
            change.evicted = true;
            return Some(at);
        }
        table.promote(at);
    }
    None
}

/// An admitted request's slot (docs/design.md, "Limits": settle always runs), reaching its
/// group's shards through `H` ([`ShardsRef`]).
///
/// Call [`Permit::settle`] when the request ends, saying whether it spends its held token.
/// Dropping a permit without settling it (panic, cancelled future) frees the slot and releases
/// the held token without spending it, as [`Spend::Nothing`] would.
///
/// A shadow-mode permit for a request enforcement would have rejected
/// ([`Permit::shadow_rejection`] is `Some`) holds no slot and no token ([`Permit::holds_slot`] is
/// `false`), so that later decisions stay exactly those enforcement would have made.
#[derive(Debug)]
#[must_use = "dropping a permit at once frees its slot"]
pub struct Permit<H: ShardsRef> {
    /// What the permit settles through.
    via: H,
    /// The number of the shard the slot is on ([`Shards::at`]); `None` once settled, and for a
    /// shadow rejection.
    shard: Option<u32>,
    slot: RowId,
    scope: Scope,
    shadow: Option<RejectReason>,
}

impl<H: ShardsRef> Permit<H> {
    /// Admits a request from client `key`, or rejects it (docs/design.md, "Limits").
    ///
    /// The group cap first (503, scope `group`: a slot taken under the client's shard lock,
    /// leased from the group's pool, see `limit/slots.rs`), then, under the same lock, the
    /// per-client cap of the client's row (429, scope `client` or `shared`), then its bucket
    /// (429): under [`Charge::Always`] a token is spent now; under [`Charge::OnFailure`]
    /// admission needs `1 + held` tokens and the request holds one until it settles.
    ///
    /// A client not in the table gets a new, full entry if its shard has room; otherwise the
    /// [`EVICT_PROBE`] oldest entries of the shard are probed (after up to [`SECOND_CHANCES`]
    /// entries at the old end that were used since they were placed there are moved to the
    /// front), each ineligible one is refreshed, and the first that is full and idle is replaced
    /// by a new, full entry; if none is, the request is decided on the shared row.
    ///
    /// # Errors
    ///
    /// A [`Rejection`] when enforcing and a check fails; it spends and holds nothing. In shadow
    /// mode this never fails: the permit says what would have happened
    /// ([`Permit::shadow_rejection`]) and holds nothing either.
    ///
    /// The permit reaches the shards through `via` ([`ShardsRef`]), which it keeps until it
    /// settles: taking a reference the caller keeps anyway, not one of the limiter's own, is what
    /// spares admission and settlement a reference count (docs/decisions.md, "The permit reaches
    /// its shards through its holder's reference").
    ///
    /// Inlined into its caller (door calls it from one place on the request path): returned
    /// from a call, the result is written to the caller's stack a field at a time and read back
    /// in wider pieces, and a read that no single write covers waits until the writes reach the
    /// cache (docs/decisions.md, "The limiter's admission inlined, its permit without the key").
    #[expect(
        clippy::inline_always,
        reason = "measured, 5 ns an admission; a plain #[inline] is not taken for a body this size"
    )]
    #[inline(always)]
    pub fn admit(via: H, key: PrefixKey) -> Result<Self, Rejection> {
        let shards = via.shards();
        let enforce = shards.enforcing();
        let (decision, change) = shards.decide(key);
        if change.inserted {
            shards.core.observer.clients_changed(1);
        }
        if change.evicted {
            shards.core.observer.evicted();
        }
        match decision {
            Ok((shard, row)) => Ok(Permit {
                via,
                shard: Some(shard),
                slot: row,
                scope: row.scope(),
                shadow: None,
            }),
            Err(rejection) if enforce => Err(rejection),
            Err(rejection) => Ok(Permit {
                via,
                shard: None,
                slot: RowId::SHARED,
                scope: rejection.scope,
                shadow: Some(rejection.reason),
            }),
        }
    }

    /// Ends the request: frees the slot, and under [`Charge::OnFailure`] releases the held token,
    /// spending it when `spend` is [`Spend::Token`].
    pub fn settle(mut self, spend: Spend) {
        if let Some(shard) = self.shard.take() {
            self.via.shards().at(shard).release(self.slot, spend);
        }
    }

    /// Gives everything back, as if the request had never been admitted: frees the slot, releases
    /// a held token, and under [`Charge::Always`] un-spends the token admission took (exactly, if
    /// nothing else was spent on the row since). For a request another limiter then refused
    /// (docs/design.md, "Streams and sessions", Planes: a request rejected by one plane or group
    /// spends nothing in the others).
    pub fn refund(mut self) {
        if let Some(shard) = self.shard.take() {
            self.via.shards().at(shard).refund(self.slot);
        }
    }

    /// Whether this permit holds a slot (and, under charge on failure, a token): `false` only for
    /// a shadow-mode permit of a request enforcement would have rejected.
    pub fn holds_slot(&self) -> bool {
        self.shard.is_some()
    }

    /// In shadow mode, the rejection enforcement would have made; `None` when enforcing or when
    /// the request would have been admitted.
    pub fn shadow_rejection(&self) -> Option<RejectReason> {
        self.shadow
    }

    /// The row the request was decided on: `Client` (its own table entry) or `Shared`; for a
    /// shadow rejection, the rejection's scope (which may be `Group`).
    pub fn scope(&self) -> Scope {
        self.scope
    }

    /// What this permit settles through.
    pub fn via(&self) -> &H {
        &self.via
    }
}

impl<H: ShardsRef> Drop for Permit<H> {
    fn drop(&mut self) {
        if let Some(shard) = self.shard.take() {
            self.via
                .shards()
                .at(shard)
                .release(self.slot, Spend::Nothing);
        }
    }
}

#[cfg(test)]
mod tests;
