//! A served connection's idle watch, shared by the front's listeners and the admin listener
//! (docs/decisions.md, "Front: deadlines"): [`Activity`] records when the connection last had a
//! request in flight, and [`serve_watched`] drives the connection, shuts it down gracefully once it
//! has been idle for too long, and drops it if it does not leave after that.
//!
//! The watch is also the HTTP/1.1 header read timeout: a next request head is due within it after
//! each answer, as it is for the first from the connection's start. One timer per connection,
//! re-armed only when it fires, does what hyper's header timer does with a timer armed and
//! cancelled for every request head.

use std::{
    fmt::Display,
    pin::Pin,
    sync::atomic::{AtomicBool, AtomicU8, AtomicU64, AtomicUsize, Ordering},
    time::Duration,
};

use tokio::time::Instant;

/// [`Activity`]'s protocol before the connection's first request, ALPN or its HTTP/2 preface has
/// told it.
const UNKNOWN: u8 = 0;
/// [`Activity`]'s protocol: HTTP/1.x.
const HTTP1: u8 = 1;
/// [`Activity`]'s protocol: HTTP/2.
const HTTP2: u8 = 2;

/// A connection's next deadline ([`Activity::idle_deadline`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Deadline {
    /// When it passes.
    pub(crate) at: Instant,
    /// Missed, the connection is dropped at once instead of shut down gracefully: its first
    /// request head has not arrived and it is not known to speak HTTP/2. hyper carries an
    /// HTTP/1.1 connection whose first head is partly read through a graceful shutdown, waiting
    /// for the rest; nothing has been answered on it, so dropping it loses nothing.
    pub(crate) drop: bool,
}

/// When a connection last had a request in flight: requests count from the moment hyper calls
/// the service (its head has arrived) until [`Activity::request_ended`].
#[derive(Debug)]
pub(crate) struct Activity {
    origin: Instant,
    active: AtomicUsize,
    /// A request has started on this connection (until then its first head is awaited).
    started: AtomicBool,
    /// The connection's protocol as far as it is known: [`UNKNOWN`], [`HTTP1`] or [`HTTP2`]
    /// (from ALPN or a cleartext connection's HTTP/2 preface, else from its first request). Between requests HTTP/1.x awaits a head, due
    /// within the header read timeout; HTTP/2 awaits nothing between its streams.
    protocol: AtomicU8,
    /// Nanoseconds after `origin` of the last request end.
    last_ns: AtomicU64,
}

impl Activity {
    /// A connection that starts now, its first request head awaited.
    pub(crate) fn new() -> Self {
        Self {
            origin: crate::time::now(),
            active: AtomicUsize::new(0),
            started: AtomicBool::new(false),
            protocol: AtomicU8::new(UNKNOWN),
            last_ns: AtomicU64::new(0),
        }
    }

    /// A request on this connection started; `http1` when it came over HTTP/1.x (the first
    /// request's protocol is the connection's). No clock read: while a request is in flight
    /// there is no deadline, and the one after it counts from [`Activity::request_ended`].
    pub(crate) fn request_started(&self, http1: bool) {
        self.active.fetch_add(1, Ordering::AcqRel);
        if !self.started.load(Ordering::Relaxed) {
            let protocol = if http1 { HTTP1 } else { HTTP2 };
            self.protocol.store(protocol, Ordering::Relaxed);
            self.started.store(true, Ordering::Release);
        }
    }

    /// The protocol is known before the first request (`http2`): TLS's ALPN chose it (`h2`), or a
    /// cleartext connection sent the HTTP/2 preface (`crate::http::preface`). A connection known
    /// to speak HTTP/2 whose first request is late gets a GOAWAY, not a close.
    pub(crate) fn negotiated(&self, http2: bool) {
        let protocol = if http2 { HTTP2 } else { HTTP1 };
        self.protocol.store(protocol, Ordering::Relaxed);
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
    /// flight; `header` (the header read timeout, at most `idle`) after this value was made while
    /// its first request head has not arrived (a client that connects and sends nothing, or only
    /// part of a head, holds a connection slot no longer than a slow head would), and after the
    /// last request ended on HTTP/1.x (its next head is as due); `idle` after the last request
    /// ended on HTTP/2.
    ///
    /// Before the first request the deadline is [`Deadline::drop`] unless the connection is known
    /// to speak HTTP/2.
    pub(crate) fn idle_deadline(&self, idle: Duration, header: Duration) -> Option<Deadline> {
        if self.active.load(Ordering::Acquire) > 0 {
            return None;
        }
        // `started` first: once it reads true, the first request's protocol is visible.
        let started = self.started.load(Ordering::Acquire);
        let protocol = self.protocol.load(Ordering::Relaxed);
        if !started {
            return Some(Deadline {
                at: self.origin + header.min(idle),
                drop: protocol != HTTP2,
            });
        }
        let last = Duration::from_nanos(self.last_ns.load(Ordering::Acquire));
        let wait = if protocol == HTTP2 {
            idle
        } else {
            header.min(idle)
        };
        Some(Deadline {
            at: self.origin + last + wait,
            drop: false,
        })
    }
}

/// Drives `conn` (a hyper connection whose service reports to `activity`) to its end, or until
/// `stop` resolves or [`Activity::idle_deadline`] passes (`header` for the first head and every
/// HTTP/1.1 head after it, `idle` after an HTTP/2 request); then `shutdown` (hyper's
/// `graceful_shutdown`: HTTP/2 GOAWAY, HTTP/1.1 closed once idle) and, if the connection is still
/// there `header` later with no request in flight, drops it. While a request is in flight the
/// deadline is looked at again every `header` (at most `idle`). `peer` names the connection in
/// debug lines.
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
            .map_or_else(|| crate::time::now() + header.min(idle), |d| d.at);
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
                let now = crate::time::now();
                match activity.idle_deadline(idle, header) {
                    Some(d) if d.at <= now && d.drop => {
                        tracing::debug!(%peer, "closing a connection whose first request head did not come in time");
                        return;
                    }
                    Some(d) if d.at <= now => {
                        tracing::debug!(%peer, "closing an idle connection");
                        break;
                    }
                    _ => {}
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

#[cfg(test)]
mod tests {
    use super::*;

    const HEADER: Duration = Duration::from_secs(10);
    const IDLE: Duration = Duration::from_mins(1);

    fn deadline(a: &Activity) -> Option<Deadline> {
        a.idle_deadline(IDLE, HEADER)
    }

    #[tokio::test(start_paused = true)]
    async fn a_first_head_is_due_within_the_header_timeout_and_a_late_one_drops_the_connection() {
        let start = crate::time::now();
        let plain = Activity::new();
        assert_eq!(
            deadline(&plain),
            Some(Deadline {
                at: start + HEADER,
                drop: true
            })
        );
        // ALPN said h2: a late first request gets a GOAWAY instead.
        let h2 = Activity::new();
        h2.negotiated(true);
        assert_eq!(
            deadline(&h2),
            Some(Deadline {
                at: start + HEADER,
                drop: false
            })
        );
        // An idle timeout below the header timeout bounds the first head too.
        assert_eq!(
            plain.idle_deadline(Duration::from_secs(3), HEADER),
            Some(Deadline {
                at: start + Duration::from_secs(3),
                drop: true
            })
        );
    }

    #[tokio::test(start_paused = true)]
    async fn after_a_request_http1_awaits_its_next_head_and_http2_idles() {
        for (http1, wait) in [(true, HEADER), (false, IDLE)] {
            let a = Activity::new();
            tokio::time::advance(Duration::from_secs(2)).await;
            a.request_started(http1);
            assert_eq!(
                deadline(&a),
                None,
                "no deadline while a request is in flight"
            );
            tokio::time::advance(Duration::from_secs(5)).await;
            a.request_ended();
            let ended = crate::time::now();
            assert_eq!(
                deadline(&a),
                Some(Deadline {
                    at: ended + wait,
                    drop: false
                }),
                "http1 = {http1}"
            );
        }
    }
}
