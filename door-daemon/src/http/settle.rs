//! The accounting of one limited request, in one place: how its admission is counted and, when it
//! ends, whether it spends a token (docs/design.md, "Limits": charge on failure) and which
//! `door.outcome` it is counted as.
//!
//! [`admit`] asks the group's limiter and counts a rejection (or, in shadow mode, the would-be
//! rejection); an admitted request is a [`Held`] permit until [`Held::settle`] is called with how
//! it [`End`]ed, or until it is dropped (the client went away: [`End::Abandoned`]). [`charge`] is the whole
//! rule.

use door_common::prefix::PrefixKey;
use http::StatusCode;

use crate::{
    limit::{GroupLimiter, Permit, RejectReason, Rejection, Spend},
    obs::metrics::{GroupMetrics, Outcome},
};

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

/// Admits a request of client `key` on `limiter`; in shadow mode a would-be rejection is counted
/// on `metrics` and the request is admitted.
///
/// # Errors
/// The limiter's [`Rejection`] when enforcing and a check fails; it spends and holds nothing,
/// and is not counted yet: the caller counts it with [`refused`] when it answers the request as
/// refused (an over-budget health probe is answered from the cache and counted as `cached`
/// instead, so that each request has one outcome).
pub fn admit(
    limiter: &std::sync::Arc<GroupLimiter>,
    metrics: &std::sync::Arc<GroupMetrics>,
    key: PrefixKey,
) -> Result<Held, Rejection> {
    match limiter.admit(key) {
        Ok(permit) => {
            if let Some(reason) = permit.shadow_rejection() {
                metrics.record(rejected_outcome(reason, true));
            }
            Ok(Held {
                permit: Some(permit),
                metrics: std::sync::Arc::clone(metrics),
                plane: None,
            })
        }
        Err(rejection) => Err(rejection),
    }
}

/// Counts a request [`admit`] refused and door answers as refused (429 or 503), by its reason.
pub fn refused(metrics: &GroupMetrics, rejection: &Rejection) {
    metrics.record(rejected_outcome(rejection.reason, false));
}

/// Settles `permit` as `end` by [`charge`]'s rule, counting the outcome on `metrics` unless the
/// permit holds no slot (a shadow-mode would-be rejection, counted at admission).
pub fn settle(permit: Permit, end: End, metrics: &GroupMetrics) {
    let (spend, outcome) = charge(end);
    if permit.holds_slot() {
        metrics.record(outcome);
    }
    permit.settle(spend);
}

/// An admitted request's permit with the metrics its end is counted on. Settle it with
/// [`Held::settle`]; dropped unsettled (the request future was dropped: the client went away),
/// it settles as [`End::Abandoned`].
#[derive(Debug)]
#[must_use = "dropping a held permit at once settles the request as abandoned"]
pub struct Held {
    permit: Option<Permit>,
    /// The group's instruments: shared, so that holding them costs one reference count.
    metrics: std::sync::Arc<GroupMetrics>,
    /// The request plane's permit the request also holds (docs/design.md, "Streams and sessions",
    /// Planes), settled with this one.
    plane: Option<Box<Held>>,
}

impl Held {
    /// Settles the request as `end` (see [`charge`]), and its plane's permit with it.
    pub fn settle(mut self, end: End) {
        if let Some(permit) = self.permit.take() {
            settle(permit, end, &self.metrics);
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

    /// The instruments this request is counted on.
    pub fn metrics(&self) -> &GroupMetrics {
        &self.metrics
    }

    /// The permit (its scope, its limiter).
    pub fn permit(&self) -> Option<&Permit> {
        self.permit.as_ref()
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        if let Some(permit) = self.permit.take() {
            settle(permit, End::Abandoned, &self.metrics);
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
