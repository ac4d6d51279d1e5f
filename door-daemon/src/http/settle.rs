//! The accounting of one limited request, in one place: how its admission is counted and, when it
//! ends, whether it spends a token (docs/design.md, "Limits": charge on failure) and which
//! `door.outcome` it is counted as.
//!
//! [`admit`] asks the group's limiter and counts a rejection (or, in shadow mode, the would-be
//! rejection); an admitted request is a [`Held`] permit until [`Held::settle`] is called with how
//! it [`End`]ed, or until it is dropped (the client went away: [`End::Abandoned`]). [`charge`] is the whole
//! rule.

use std::sync::Arc;

use door_common::prefix::PrefixKey;
use http::StatusCode;

use crate::{
    limit::{GroupLimiter, Permit, RejectReason, Rejection, Shards, ShardsRef, Spend},
    obs::metrics::{GroupMetrics, Outcome},
};

/// One group as an admitted request holds it: its limiter's shards, which the permit settles
/// on, and its instruments, which the request's end is counted on, behind the one reference
/// count a request takes (a permit keeps no reference of its own: docs/decisions.md, "The permit
/// reaches its shards through its holder's reference"). Built with the configuration; a request
/// a reload left behind keeps the group it was admitted in.
///
/// Aligned to 128 bytes (two cache lines, the unit the processor's adjacent-line prefetcher moves
/// together): the holders of one group, one per worker thread, are allocated one after the other
/// when the configuration is built, and each must keep its reference count on lines no other
/// worker writes.
#[derive(Debug)]
#[repr(align(128))]
pub struct Group {
    shards: Arc<Shards>,
    metrics: Arc<GroupMetrics>,
}

const _: () = assert!(align_of::<Group>() == 128);

impl Group {
    /// `limiter`'s shards with `metrics`, the instruments its requests are counted on.
    pub fn new(limiter: &GroupLimiter, metrics: Arc<GroupMetrics>) -> Self {
        Self {
            shards: Arc::clone(limiter.shards()),
            metrics,
        }
    }

    /// The group's instruments.
    pub fn metrics(&self) -> &GroupMetrics {
        &self.metrics
    }
}

impl ShardsRef for Arc<Group> {
    fn shards(&self) -> &Shards {
        &self.shards
    }
}

/// How a limited request ended, as far as its budget is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    /// The upstream answered with this status (its response head reached door), whether or not
    /// the client stayed to read it.
    Answered(StatusCode),
    /// The client's request body missed the group's read deadline; door answered 408.
    BodyTimeout,
    /// No answer door could pass on: the upstream refused, failed or timed out (502/504).
    Unanswered,
    /// The client went away before door could answer: its connection closed or reset, an HTTP/2
    /// RST_STREAM, its request body broken off, or the request future dropped unsettled. The
    /// upstream call is aborted with it.
    Abandoned,
}

/// The rule: whether a request that ended as `end` spends its held token under charge on
/// failure, and the outcome it is counted as.
///
/// | end | spends | outcome |
/// |---|---|---|
/// | upstream 1xx–3xx | no | `ok` |
/// | upstream 4xx | **yes**: the client sent something the application refused | `client_error` |
/// | upstream 5xx (or 600–999) | no: the application's failure, not the client's | `server_error` |
/// | body missed the read deadline (408) | **yes**: the client's fault | `client_error` |
/// | client gone before the answer | **yes**: hanging up must never help a client | `client_error` |
/// | no answer from the upstream (502, 504) | no | `server_error` |
///
/// Under `charge = "always"` the token was spent at admission and "spends" changes nothing.
pub fn charge(end: End) -> (Spend, Outcome) {
    match end {
        End::Answered(status) if status.is_client_error() => (Spend::Token, Outcome::ClientError),
        End::Answered(status) if status.as_u16() < 400 => (Spend::Nothing, Outcome::Ok),
        End::Answered(_) | End::Unanswered => (Spend::Nothing, Outcome::ServerError),
        End::BodyTimeout | End::Abandoned => (Spend::Token, Outcome::ClientError),
    }
}

/// The `door.outcome` of a rejection by `reason`: the enforced one, or its `would_*` form in
/// shadow mode.
pub const fn rejected_outcome(reason: RejectReason, shadow: bool) -> Outcome {
    match (reason, shadow) {
        (RejectReason::Rate, false) => Outcome::RateLimited,
        (RejectReason::ClientConcurrency, false) => Outcome::ClientConcurrency,
        (RejectReason::GroupConcurrency, false) => Outcome::GroupConcurrency,
        (RejectReason::Rate, true) => Outcome::WouldRateLimited,
        (RejectReason::ClientConcurrency, true) => Outcome::WouldClientConcurrency,
        (RejectReason::GroupConcurrency, true) => Outcome::WouldGroupConcurrency,
    }
}

/// Admits a request of client `key` in `group`; in shadow mode a would-be rejection is counted
/// on its instruments and the request is admitted. The permit holds `group` (one reference
/// count, taken before the decision; a refused request drops it again).
///
/// # Errors
/// The limiter's [`Rejection`] when enforcing and a check fails; it spends and holds nothing,
/// and is not counted yet: the caller counts it with [`refused`] when it answers the request as
/// refused (an over-budget health probe is answered from the cache and counted as `cached`
/// instead, so that each request has one outcome).
pub fn admit(group: &Arc<Group>, key: PrefixKey) -> Result<Held, Rejection> {
    let permit = Permit::admit(Arc::clone(group), key)?;
    if let Some(reason) = permit.shadow_rejection() {
        group.metrics.record(rejected_outcome(reason, true));
    }
    Ok(Held {
        permit: Some(permit),
        plane: None,
    })
}

/// Counts a request [`admit`] refused and door answers as refused (429 or 503), by its reason.
pub fn refused(metrics: &GroupMetrics, rejection: &Rejection) {
    metrics.record(rejected_outcome(rejection.reason, false));
}

/// Settles `permit` as `end` by [`charge`]'s rule, counting the outcome on `metrics` unless the
/// permit holds no slot (a shadow-mode would-be rejection, counted at admission).
pub fn settle<H: ShardsRef>(permit: Permit<H>, end: End, metrics: &GroupMetrics) {
    let spend = counted(&permit, end, metrics);
    permit.settle(spend);
}

/// Counts how `permit`'s request ended on `metrics` (unless it holds no slot) and returns what
/// it spends, by [`charge`]'s rule.
fn counted<H: ShardsRef>(permit: &Permit<H>, end: End, metrics: &GroupMetrics) -> Spend {
    let (spend, outcome) = charge(end);
    if permit.holds_slot() {
        metrics.record(outcome);
    }
    spend
}

/// Settles a held `permit` as `end`, counted on its group's instruments ([`settle`]).
fn settle_held(permit: Permit<Arc<Group>>, end: End) {
    let spend = counted(&permit, end, permit.via().metrics());
    permit.settle(spend);
}

/// An admitted request's permit, holding its [`Group`]. Settle it with [`Held::settle`];
/// dropped unsettled (the request future was dropped: the client went away), it settles as
/// [`End::Abandoned`].
#[derive(Debug)]
#[must_use = "dropping a held permit at once settles the request as abandoned"]
pub struct Held {
    /// `None` only once settled or given back.
    permit: Option<Permit<Arc<Group>>>,
    /// The request plane's permit the request also holds (docs/design.md, "Streams and sessions",
    /// Planes), settled with this one.
    plane: Option<Box<Held>>,
}

impl Held {
    /// Settles the request as `end` (see [`charge`]), and its plane's permit with it.
    pub fn settle(mut self, end: End) {
        if let Some(permit) = self.permit.take() {
            settle_held(permit, end);
        }
        if let Some(plane) = self.plane.take() {
            plane.settle(end);
        }
    }

    /// Gives everything back uncounted, as if the request had never been admitted (another
    /// limiter refused it: it must spend nothing here); the plane's permit too.
    pub fn refund(mut self) {
        if let Some(permit) = self.permit.take() {
            permit.refund();
        }
        if let Some(plane) = self.plane.take() {
            plane.refund();
        }
    }

    /// Gives back the plane's permit this one holds, if any, uncounted (the request turned out to
    /// be a stream, which the planes do not charge); this permit stays.
    pub fn refund_plane(&mut self) {
        if let Some(plane) = self.plane.take() {
            plane.refund();
        }
    }

    /// This permit, also holding `plane` (a request plane's permit): both settle together.
    pub fn with_plane(mut self, plane: Held) -> Self {
        self.plane = Some(Box::new(plane));
        self
    }

    /// The instruments this request is counted on; `None` only once settled.
    pub fn metrics(&self) -> Option<&GroupMetrics> {
        self.permit.as_ref().map(|p| p.via().metrics())
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        if let Some(permit) = self.permit.take() {
            settle_held(permit, End::Abandoned);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_client_failures_spend() {
        let s = |code| charge(End::Answered(StatusCode::from_u16(code).unwrap()));
        assert_eq!(s(100), (Spend::Nothing, Outcome::Ok));
        assert_eq!(s(200), (Spend::Nothing, Outcome::Ok));
        assert_eq!(s(302), (Spend::Nothing, Outcome::Ok));
        assert_eq!(s(400), (Spend::Token, Outcome::ClientError));
        assert_eq!(s(404), (Spend::Token, Outcome::ClientError));
        assert_eq!(s(499), (Spend::Token, Outcome::ClientError));
        assert_eq!(s(502), (Spend::Nothing, Outcome::ServerError));
        assert_eq!(s(799), (Spend::Nothing, Outcome::ServerError));
        assert_eq!(
            charge(End::BodyTimeout),
            (Spend::Token, Outcome::ClientError)
        );
        assert_eq!(
            charge(End::Unanswered),
            (Spend::Nothing, Outcome::ServerError)
        );
        assert_eq!(charge(End::Abandoned), (Spend::Token, Outcome::ClientError));
    }
}
