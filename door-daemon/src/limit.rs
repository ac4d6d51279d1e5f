//! The per-group layer-7 limiter (../shared/seeds/network-door-limits.txt, "Approach" and L1).
//!
//! First version: one token bucket per client key per group, in integer nanoseconds, with the
//! clock injected. The bounded table, shared row, in-flight caps and charge-on-failure replace it.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, PoisonError},
};

use door_common::PrefixKey;
use http::StatusCode;

use crate::clock::Clock;

const NANOS_PER_SEC: u64 = 1_000_000_000;

/// When a group spends a token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Charge {
    /// Every admitted request spends one token.
    Always,
    /// Only requests the upstream answered 4xx spend a token.
    OnFailure,
}

/// A group's budget (../shared/DESIGN.md, "Limits").
#[derive(Debug, Clone, PartialEq)]
pub struct Budget {
    /// Refill rate, tokens per second.
    pub rate: f64,
    /// Bucket capacity, tokens.
    pub burst: u32,
    /// In-flight requests per client.
    pub per_client: u32,
    /// In-flight requests for the whole group.
    pub inflight: u32,
    /// Client entries the group's table holds.
    pub max_clients: usize,
    /// When a token is spent.
    pub charge: Charge,
}

impl Budget {
    /// webhook: 50/s, burst 500, 16 per client, 64 per group, charged on 4xx.
    pub fn webhook() -> Self {
        Self::of(50.0, 500, 16, 64, Charge::OnFailure)
    }
    /// link: 1/s, burst 20, 2 per client, 4 per group, always charged.
    pub fn link() -> Self {
        Self::of(1.0, 20, 2, 4, Charge::Always)
    }
    /// health: 5/s, burst 20, 4 per client, 32 per group, always charged.
    pub fn health() -> Self {
        Self::of(5.0, 20, 4, 32, Charge::Always)
    }
    fn of(rate: f64, burst: u32, per_client: u32, inflight: u32, charge: Charge) -> Self {
        Self {
            rate,
            burst,
            per_client,
            inflight,
            max_clients: 16_384,
            charge,
        }
    }
}

/// Why a request was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RejectReason {
    /// The bucket is empty.
    Rate,
}

/// Which bucket or cap refused a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// The client's own row.
    Client,
}

impl Scope {
    /// `"client"`, as in the 429 body.
    pub fn as_str(self) -> &'static str {
        "client"
    }
}

/// A refusal, with what the client is told.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejection {
    /// Why.
    pub reason: RejectReason,
    /// Which bucket.
    pub scope: Scope,
    /// Seconds until a retry succeeds, rounded up, at least 1.
    pub retry_after_s: u64,
    /// 429.
    pub status: StatusCode,
}

/// An admitted request.
#[derive(Debug)]
pub struct Permit;

impl Permit {
    /// Reports the upstream's status.
    pub fn settle(self, _status: StatusCode) {}
}

/// A group's limiter.
#[derive(Debug)]
pub struct GroupLimiter {
    group: String,
    budget: Budget,
    clock: Arc<dyn Clock>,
    interval_ns: u64,
    tat: Mutex<HashMap<PrefixKey, u64>>,
}

impl GroupLimiter {
    /// A limiter for `group` with `budget`, reading time from `clock`.
    pub fn new(group: &str, budget: Budget, clock: Arc<dyn Clock>) -> Self {
        #[expect(
            clippy::cast_possible_truncation,
            clippy::cast_sign_loss,
            clippy::cast_precision_loss,
            reason = "rate is validated positive; the interval fits u64 for any rate above 1e-10/s"
        )]
        let interval_ns = (NANOS_PER_SEC as f64 / budget.rate).ceil() as u64;
        Self {
            group: group.to_owned(),
            budget,
            clock,
            interval_ns,
            tat: Mutex::new(HashMap::new()),
        }
    }

    /// The group's name.
    pub fn group(&self) -> &str {
        &self.group
    }

    /// The group's budget.
    pub fn budget(&self) -> &Budget {
        &self.budget
    }

    /// Number of client keys with state.
    pub fn tracked_clients(&self) -> usize {
        self.tat
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    /// Admits or refuses a request from `key` (GCRA: a theoretical arrival time per key).
    ///
    /// # Errors
    /// A [`Rejection`] when the key's bucket is empty.
    pub fn admit(self: &Arc<Self>, key: PrefixKey) -> Result<Permit, Rejection> {
        let now = self.clock.now_ns();
        let tolerance = self.interval_ns * u64::from(self.budget.burst);
        let mut table = self.tat.lock().unwrap_or_else(PoisonError::into_inner);
        let tat = table.entry(key).or_insert(0);
        let start = (*tat).max(now);
        let next = start + self.interval_ns;
        if next > now + tolerance {
            let wait = next - (now + tolerance);
            return Err(Rejection {
                reason: RejectReason::Rate,
                scope: Scope::Client,
                retry_after_s: wait.div_ceil(NANOS_PER_SEC).max(1),
                status: StatusCode::TOO_MANY_REQUESTS,
            });
        }
        *tat = next;
        Ok(Permit)
    }
}
