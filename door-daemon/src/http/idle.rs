//! A served connection's idle watch, shared by the front's listeners and the admin listener
//! (docs/decisions.md, "Front: deadlines"): [`Activity`] records when the connection last had a
//! request in flight, and [`serve_watched`] drives the connection, shuts it down gracefully once it
//! has been idle for too long, and drops it if it does not leave after that.

use std::{
    fmt::Display,
    pin::Pin,
    sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering},
    time::Duration,
};

use tokio::time::Instant;

/// When a connection last had a request in flight: requests count from the moment hyper calls
/// the service (its head has arrived) until [`Activity::request_ended`].
#[derive(Debug)]
pub(crate) struct Activity {
    origin: Instant,
    active: AtomicUsize,
    /// A request has started on this connection (until then its first head is awaited).
    started: AtomicBool,
    /// Nanoseconds after `origin` of the last request start or end.
    last_ns: AtomicU64,
}

impl Activity {
    /// A connection that starts now, its first request head awaited.
    pub(crate) fn new() -> Self {
        Self {
            origin: crate::time::now(),
            active: AtomicUsize::new(0),
            started: AtomicBool::new(false),
            last_ns: AtomicU64::new(0),
        }
    }

    /// A request on this connection started.
    pub(crate) fn request_started(&self) {
        self.active.fetch_add(1, Ordering::AcqRel);
        if !self.started.load(Ordering::Relaxed) {
            self.started.store(true, Ordering::Release);
        }
        self.touch();
    }

    /// A request on this connection ended.
    pub(crate) fn request_ended(&self) {
        self.touch();
        self.active.fetch_sub(1, Ordering::AcqRel);
    }

    fn touch(&self) {
        let ns = u64::try_from(self.origin.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.last_ns.store(ns, Ordering::Release);
    }

    /// When the connection becomes idle-expired if nothing happens: `None` while a request is in
    /// flight; `first` (the header read timeout, at most `idle`) after this value was made while
    /// its first request head has not arrived (a client that connects and sends nothing, or only
    /// part of a head, holds a connection slot no longer than a slow head would); `idle` after the
    /// last request ended otherwise.
    pub(crate) fn idle_deadline(&self, idle: Duration, first: Duration) -> Option<Instant> {
        if self.active.load(Ordering::Acquire) > 0 {
            return None;
        }
        if !self.started.load(Ordering::Acquire) {
            return Some(self.origin + first.min(idle));
        }
        let last = Duration::from_nanos(self.last_ns.load(Ordering::Acquire));
        Some(self.origin + last + idle)
    }
}

/// Drives `conn` (a hyper connection whose service reports to `activity`) to its end, or until
/// `stop` resolves or [`Activity::idle_deadline`] passes (`header` for the first head, `idle`
/// after a request); then `shutdown` (hyper's `graceful_shutdown`: HTTP/2 GOAWAY, HTTP/1.1 closed
/// once idle) and, if the connection is still there `header` later with no request in flight,
/// drops it. `peer` names the connection in debug lines.
pub(crate) async fn serve_watched<C, E>(
    mut conn: Pin<&mut C>,
    activity: &Activity,
    header: Duration,
    idle: Duration,
    stop: impl Future<Output = ()>,
    shutdown: impl FnOnce(Pin<&mut C>),
    peer: impl Display,
) where
    C: Future<Output = Result<(), E>>,
    E: Display,
{
    tokio::pin!(stop);
    loop {
        let idle_at = activity
            .idle_deadline(idle, header)
            .unwrap_or_else(|| crate::time::now() + idle);
        // The connection first, every time (it is what woke this future nearly always); the
        // drain signal and the idle timer after it, without select!'s random start.
        tokio::select! {
            biased;
            r = conn.as_mut() => {
                if let Err(e) = r {
                    tracing::debug!(%peer, error = %e, "connection ended with an error");
                }
                return;
            }
            () = &mut stop => break,
            () = tokio::time::sleep_until(idle_at) => {
                if activity
                    .idle_deadline(idle, header)
                    .is_some_and(|d| d <= crate::time::now())
                {
                    tracing::debug!(%peer, "closing an idle connection");
                    break;
                }
            }
        }
    }
    shutdown(conn.as_mut());
    // A client that ignores the HTTP/2 GOAWAY and PING would keep this forever (found by hostile
    // testing): after the header read timeout more with no request in flight, the connection is
    // dropped. A request accepted while the GOAWAY was on its way is served to its end (its own
    // deadlines bound it; a drain ends with the process after `drain_grace`).
    loop {
        let until = crate::time::now() + header;
        tokio::select! {
            _ = conn.as_mut() => return,
            () = tokio::time::sleep_until(until) => {
                if activity.idle_deadline(idle, header).is_some() {
                    tracing::debug!(%peer, "dropping a connection that did not close after its shutdown");
                    return;
                }
            }
        }
    }
}
