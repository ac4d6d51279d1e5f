//! Cached health (docs/design.md, "Limits", "Cached health"): a probe of the `health` group that
//! is over budget is never refused; it gets the last status the upstream gave for health, cached
//! for [`HEALTH_TTL`], refreshed single-flight when it is older (the other probes get the last
//! status meanwhile if it is younger than [`HEALTH_STALE`], or wait for the refresh's answer).
//! While door drains the cache is bypassed and health answers 503 at once.
//!
//! Only a status that speaks for the application is kept ([`speaks_for_health`]): any client may
//! probe, and a 4xx (a `Host` the application refuses, a bad `Authorization`), a 3xx (a redirect
//! to the canonical host or to the path with a trailing `/`), a `304` (a conditional request) or
//! a `206` (a range) answers that client's request, not the question every prober asks; kept, it
//! would be served to every over-budget probe.
//!
//! Time comes only from the injected [`Clock`]; tests never sleep.

use std::{
    future::Future,
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::Duration,
};

use http::StatusCode;

use crate::time::Clock;

/// How long an upstream health status is served to over-budget probes: 1 s.
pub const HEALTH_TTL: Duration = Duration::from_secs(1);

/// How old the last status may be and still be served to an over-budget probe while a refresh is
/// under way (RFC 5861's `stale-while-revalidate`, which bounds the stale window too): 10 s. An
/// older one is no answer for the application now (a 503 from minutes ago, while the upstream is
/// well again, would fail every probe until the refresh lands), so the probe waits for the
/// refresh's answer instead.
pub const HEALTH_STALE: Duration = Duration::from_secs(10);

/// Whether `status` speaks for the application's health, whoever asked: a 2xx but `206 Partial
/// Content`, or a 5xx (the upstream's own, or door's 502/504 when the upstream failed). Not a
/// 4xx, a 3xx or a `206`, which depend on the request (its `Host`, credentials, target,
/// conditionals or range: RFC 9110 §15.5, §15.4, §15.3.7): a redirect to the canonical host or
/// to the path with a trailing `/` answers how the asker spelt its request, and kept, it would
/// fail every load balancer that expects a 200.
pub fn speaks_for_health(status: StatusCode) -> bool {
    (status.is_success() && status != StatusCode::PARTIAL_CONTENT) || status.is_server_error()
}

/// The last upstream health status and the clock reading when it was taken.
#[derive(Debug, Clone, Copy)]
struct Entry {
    status: StatusCode,
    at_ns: u64,
}

/// The health cache of one door.
///
/// `Send + Sync`. The cached entry sits behind a `std::sync::Mutex` held only to copy it in or
/// out; the single-flight refresh is a `tokio::sync::Mutex` whose guard is held across the
/// refresh (that is its purpose: one refresh at a time; the others get a recent last status, or
/// wait for the refresh's result: [`CachedHealth::status`]).
#[derive(Debug)]
pub struct CachedHealth {
    clock: Arc<dyn Clock>,
    ttl_ns: u64,
    /// [`HEALTH_STALE`], nanoseconds.
    stale_ns: u64,
    draining: Arc<AtomicBool>,
    last: Mutex<Option<Entry>>,
    flight: tokio::sync::Mutex<()>,
    /// Refreshes that ran to their answer (kept or not): a probe that waited for the flight
    /// tells a refresh that answered from one cancelled with its prober.
    refreshed: AtomicU64,
}

impl CachedHealth {
    /// A cache whose entries live `ttl` (normally [`HEALTH_TTL`]), and are served while a refresh
    /// is under way until [`HEALTH_STALE`] old, reading time from `clock`, and answering 503
    /// whenever `draining` is set.
    pub fn new(clock: Arc<dyn Clock>, ttl: Duration, draining: Arc<AtomicBool>) -> Self {
        let ns = |d: Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        Self {
            clock,
            ttl_ns: ns(ttl),
            stale_ns: ns(HEALTH_STALE.max(ttl)),
            draining,
            last: Mutex::new(None),
            flight: tokio::sync::Mutex::new(()),
            refreshed: AtomicU64::new(0),
        }
    }

    /// Whether door is draining (health is NOT_SERVING).
    pub fn draining(&self) -> bool {
        self.draining.load(Ordering::Acquire)
    }

    /// Records a status the upstream just gave for health (every admitted `GET`/`HEAD` probe and
    /// every refresh does); one that does not [speak for health](speaks_for_health) is ignored.
    pub fn record(&self, status: StatusCode) {
        if !speaks_for_health(status) {
            return;
        }
        let entry = Entry {
            status,
            at_ns: self.clock.now_ns(),
        };
        *self.last.lock().unwrap_or_else(PoisonError::into_inner) = Some(entry);
    }

    /// The cached status if it is younger than the ttl; `None` otherwise or while draining.
    pub fn fresh(&self) -> Option<StatusCode> {
        if self.draining() {
            return None;
        }
        self.younger_than(self.ttl_ns)
    }

    /// The last status recorded if it is younger than `age_ns` nanoseconds.
    fn younger_than(&self, age_ns: u64) -> Option<StatusCode> {
        let entry = *self.last.lock().unwrap_or_else(PoisonError::into_inner);
        let now = self.clock.now_ns();
        entry
            .filter(|e| now.saturating_sub(e.at_ns) < age_ns)
            .map(|e| e.status)
    }

    /// The last status recorded, however old; `None` before the first.
    fn last(&self) -> Option<StatusCode> {
        self.younger_than(u64::MAX)
    }

    /// The status for an over-budget probe: 503 while draining; else the fresh cached status;
    /// else one caller runs `refresh` (asks the upstream) and its result is cached if it speaks
    /// for health (else only that caller gets it). A concurrent caller gets the last status at
    /// once if it is younger than [`HEALTH_STALE`] (an upstream slow to answer the refresh delays
    /// that one probe, not every probe behind it), and otherwise waits for the refresh under way
    /// and gets its result; when that result was not kept, the last status however old (so
    /// probes whose refreshes the application answers with a 4xx cannot queue a prober behind
    /// one refresh after another), and a refresh of its own before the first status or when the
    /// refresh waited for was cancelled (its prober gave up) before it answered.
    /// Never a 429 and never door's own 503 (an upstream's 503 is passed on).
    pub async fn status<F, Fut>(&self, refresh: F) -> StatusCode
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = StatusCode>,
    {
        if self.draining() {
            return StatusCode::SERVICE_UNAVAILABLE;
        }
        if let Some(s) = self.fresh() {
            return s;
        }
        let (_flight, answered) = if let Ok(flight) = self.flight.try_lock() {
            (flight, false)
        } else {
            // A refresh is under way: the last status until it lands, if it is recent.
            if let Some(s) = self.younger_than(self.stale_ns) {
                return s;
            }
            let before = self.refreshed.load(Ordering::Acquire);
            let flight = self.flight.lock().await;
            (flight, self.refreshed.load(Ordering::Acquire) != before)
        };
        // Whoever held the flight before us may have refreshed it.
        if let Some(s) = self.fresh() {
            return s;
        }
        if self.draining() {
            return StatusCode::SERVICE_UNAVAILABLE;
        }
        // The refresh waited for answered, and was not kept (an answer to its asker alone): the
        // last status, not a refresh of our own behind every other such probe. One cancelled
        // with its prober answered nothing: this probe asks the upstream itself.
        if answered && let Some(s) = self.last() {
            return s;
        }
        let status = refresh().await;
        self.record(status);
        self.refreshed.fetch_add(1, Ordering::Release);
        status
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;

    use super::*;
    use crate::time::ManualClock;

    fn cache() -> (Arc<ManualClock>, Arc<AtomicBool>, Arc<CachedHealth>) {
        let clock = Arc::new(ManualClock::at(1));
        let draining = Arc::new(AtomicBool::new(false));
        let c = Arc::new(CachedHealth::new(
            Arc::clone(&clock) as Arc<dyn Clock>,
            HEALTH_TTL,
            Arc::clone(&draining),
        ));
        (clock, draining, c)
    }

    /// A probe over budget, spawned, whose refresh answers `answer` once the returned sender
    /// sends `true`: the refresh under way while a test asks for the status meanwhile.
    fn held_refresh(
        c: &Arc<CachedHealth>,
        answer: StatusCode,
    ) -> (
        tokio::sync::watch::Sender<bool>,
        tokio::task::JoinHandle<StatusCode>,
    ) {
        let (release_tx, mut release_rx) = tokio::sync::watch::channel(false);
        let c = Arc::clone(c);
        let refreshing = tokio::spawn(async move {
            c.status(|| async move {
                let _ = release_rx.wait_for(|r| *r).await;
                answer
            })
            .await
        });
        (release_tx, refreshing)
    }

    /// The inner checker runs once per ttl; a drain shows at once.
    #[tokio::test]
    async fn inner_checker_runs_once_per_ttl_and_a_drain_shows_at_once() {
        let (clock, draining, c) = cache();
        let runs = Arc::new(AtomicUsize::new(0));
        let check = || {
            let runs = Arc::clone(&runs);
            move || async move {
                runs.fetch_add(1, Ordering::SeqCst);
                StatusCode::OK
            }
        };
        for _ in 0..10 {
            assert_eq!(c.status(check()).await, StatusCode::OK);
        }
        assert_eq!(runs.load(Ordering::SeqCst), 1);
        clock.advance(HEALTH_TTL.checked_sub(Duration::from_nanos(1)).unwrap());
        assert_eq!(c.status(check()).await, StatusCode::OK);
        assert_eq!(
            runs.load(Ordering::SeqCst),
            1,
            "still fresh 1 ns before the ttl"
        );
        clock.advance(Duration::from_nanos(1));
        assert_eq!(c.status(check()).await, StatusCode::OK);
        assert_eq!(runs.load(Ordering::SeqCst), 2, "refreshed at the ttl");
        draining.store(true, Ordering::Release);
        assert_eq!(c.status(check()).await, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(c.fresh(), None);
        assert_eq!(
            runs.load(Ordering::SeqCst),
            2,
            "a drain never asks the upstream"
        );
    }

    #[tokio::test]
    async fn concurrent_misses_refresh_once() {
        let (_clock, _draining, c) = cache();
        let runs = Arc::new(AtomicUsize::new(0));
        let (release_tx, release_rx) = tokio::sync::watch::channel(false);
        let mut tasks = Vec::new();
        for _ in 0..8 {
            let c = Arc::clone(&c);
            let runs = Arc::clone(&runs);
            let mut rx = release_rx.clone();
            tasks.push(tokio::spawn(async move {
                c.status(|| async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    let _ = rx.wait_for(|r| *r).await;
                    StatusCode::NO_CONTENT
                })
                .await
            }));
        }
        tokio::task::yield_now().await;
        let _ = release_tx.send(true);
        for t in tasks {
            assert_eq!(t.await.unwrap(), StatusCode::NO_CONTENT);
        }
        assert_eq!(runs.load(Ordering::SeqCst), 1);
    }

    /// Once a status exists, a refresh the upstream is slow to answer holds up only the probe
    /// that runs it: the others get the last status at once, and the refresh's answer after it.
    #[tokio::test]
    async fn a_slow_refresh_holds_up_only_its_own_probe() {
        let (clock, _draining, c) = cache();
        c.record(StatusCode::OK);
        clock.advance(HEALTH_TTL);
        let (release_tx, refreshing) = held_refresh(&c, StatusCode::SERVICE_UNAVAILABLE);
        tokio::task::yield_now().await;
        let runs = Arc::new(AtomicUsize::new(0));
        for _ in 0..3 {
            let runs = Arc::clone(&runs);
            let s = c
                .status(|| async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    StatusCode::OK
                })
                .await;
            assert_eq!(s, StatusCode::OK, "the last status, while the refresh runs");
        }
        assert_eq!(runs.load(Ordering::SeqCst), 0, "no second refresh");
        let _ = release_tx.send(true);
        assert_eq!(refreshing.await.unwrap(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(
            c.status(|| async { StatusCode::OK }).await,
            StatusCode::SERVICE_UNAVAILABLE
        );
    }

    /// A status older than [`HEALTH_STALE`] is not served while a refresh runs: the probes wait
    /// for the refresh and get its answer (an upstream that was failing minutes ago and is well
    /// now does not fail them).
    #[tokio::test]
    async fn an_old_status_is_not_served_while_a_refresh_runs() {
        let (clock, _draining, c) = cache();
        c.record(StatusCode::SERVICE_UNAVAILABLE);
        clock.advance(HEALTH_STALE);
        let (release_tx, refreshing) = held_refresh(&c, StatusCode::OK);
        tokio::task::yield_now().await;
        let waiting = {
            let c = Arc::clone(&c);
            tokio::spawn(async move { c.status(|| async { StatusCode::IM_A_TEAPOT }).await })
        };
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished(), "waits for the refresh under way");
        let _ = release_tx.send(true);
        assert_eq!(refreshing.await.unwrap(), StatusCode::OK);
        assert_eq!(
            waiting.await.unwrap(),
            StatusCode::OK,
            "the refresh's answer, not the 503 of 10 s ago, and no second refresh"
        );
    }

    /// A probe that waited for a refresh whose answer was not kept (a 4xx, which answers its
    /// asker alone) gets the last status, however old, and runs no refresh of its own: probes
    /// whose refreshes the application refuses cannot queue a prober behind one after another.
    #[tokio::test]
    async fn a_probe_waits_for_one_refresh_at_most() {
        let (clock, _draining, c) = cache();
        c.record(StatusCode::OK);
        clock.advance(HEALTH_STALE + Duration::from_secs(1));
        let (release_tx, refreshing) = held_refresh(&c, StatusCode::BAD_REQUEST);
        tokio::task::yield_now().await;
        let runs = Arc::new(AtomicUsize::new(0));
        let waiting: Vec<_> = (0..3)
            .map(|_| {
                let c = Arc::clone(&c);
                let runs = Arc::clone(&runs);
                tokio::spawn(async move {
                    c.status(|| async move {
                        runs.fetch_add(1, Ordering::SeqCst);
                        StatusCode::BAD_REQUEST
                    })
                    .await
                })
            })
            .collect();
        tokio::task::yield_now().await;
        let _ = release_tx.send(true);
        assert_eq!(refreshing.await.unwrap(), StatusCode::BAD_REQUEST);
        for w in waiting {
            assert_eq!(w.await.unwrap(), StatusCode::OK, "the last status kept");
        }
        assert_eq!(
            runs.load(Ordering::SeqCst),
            0,
            "no refresh behind the first"
        );
    }

    /// A probe that waited for a refresh cancelled before it answered (its prober gave up: the
    /// application's health endpoint hangs) asks the upstream itself instead of getting a status
    /// older than [`HEALTH_STALE`], which would report a hung application as well.
    #[tokio::test]
    async fn a_probe_behind_a_cancelled_refresh_refreshes_itself() {
        let (clock, _draining, c) = cache();
        c.record(StatusCode::OK);
        clock.advance(HEALTH_STALE + Duration::from_secs(1));
        let refreshing = {
            let c = Arc::clone(&c);
            tokio::spawn(async move { c.status(std::future::pending::<StatusCode>).await })
        };
        tokio::task::yield_now().await;
        let waiting = {
            let c = Arc::clone(&c);
            tokio::spawn(async move { c.status(|| async { StatusCode::GATEWAY_TIMEOUT }).await })
        };
        tokio::task::yield_now().await;
        refreshing.abort();
        assert_eq!(
            waiting.await.unwrap(),
            StatusCode::GATEWAY_TIMEOUT,
            "its own refresh's answer, not the 200 of 11 s ago"
        );
    }

    /// A status that answers the asker's own request (its `Host`, credentials, conditionals or
    /// range) is never kept: the next probe gets the last status that speaks for health, and a
    /// refresh answered so goes to its own caller only.
    #[tokio::test]
    async fn a_status_that_answers_the_request_not_the_application_is_never_kept() {
        let (clock, _draining, c) = cache();
        for own in [
            StatusCode::BAD_REQUEST,
            StatusCode::UNAUTHORIZED,
            StatusCode::FORBIDDEN,
            StatusCode::PRECONDITION_FAILED,
            StatusCode::RANGE_NOT_SATISFIABLE,
            StatusCode::NOT_MODIFIED,
            StatusCode::PARTIAL_CONTENT,
            StatusCode::MOVED_PERMANENTLY,
            StatusCode::FOUND,
            StatusCode::TEMPORARY_REDIRECT,
            StatusCode::PERMANENT_REDIRECT,
        ] {
            c.record(own);
            assert_eq!(c.last(), None, "{own} kept");
        }
        c.record(StatusCode::OK);
        c.record(StatusCode::BAD_REQUEST);
        assert_eq!(c.fresh(), Some(StatusCode::OK), "the 200 stays");
        clock.advance(HEALTH_TTL);
        let s = c.status(|| async { StatusCode::BAD_REQUEST }).await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "the refresh's own caller");
        let runs = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&runs);
        let s = c
            .status(|| async move {
                counted.fetch_add(1, Ordering::SeqCst);
                StatusCode::OK
            })
            .await;
        assert_eq!(s, StatusCode::OK);
        assert_eq!(
            runs.load(Ordering::SeqCst),
            1,
            "refreshed: the 400 was not kept"
        );
        for kept in [
            StatusCode::NO_CONTENT,
            StatusCode::OK,
            StatusCode::SERVICE_UNAVAILABLE,
            StatusCode::GATEWAY_TIMEOUT,
        ] {
            c.record(kept);
            assert_eq!(c.last(), Some(kept));
        }
    }

    #[tokio::test]
    async fn recorded_statuses_are_served_including_upstream_failures() {
        let (_clock, _draining, c) = cache();
        c.record(StatusCode::SERVICE_UNAVAILABLE);
        let s = c.status(|| async { StatusCode::OK }).await;
        assert_eq!(
            s,
            StatusCode::SERVICE_UNAVAILABLE,
            "the upstream's own 503 is its health"
        );
    }
}
