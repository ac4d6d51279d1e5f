//! Forwarding to the upstream: hyper-util's pooled client, bodies streamed both ways (never
//! buffered), hop-by-hop headers removed (RFC 9110 §7.6.1), the original `Host` kept (the
//! upstream's own for a request without one), and the
//! forwarding headers rewritten so the application can trust exactly one hop, door
//! (docs/design.md, "Client key", last paragraph).

use std::{
    future::Future,
    net::IpAddr,
    pin::Pin,
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicU64, Ordering},
    },
    task::{Context, Poll},
    time::Duration,
};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use tokio::{
    sync::oneshot,
    time::{Instant, Sleep},
};

use http::{
    HeaderMap, HeaderName, HeaderValue, Method, Request, Response, Uri, Version,
    header::{
        AUTHORIZATION, CACHE_CONTROL, CONNECTION, CONTENT_ENCODING, CONTENT_LENGTH, CONTENT_RANGE,
        CONTENT_TYPE, COOKIE, FORWARDED, HOST, MAX_FORWARDS, PROXY_AUTHENTICATE,
        PROXY_AUTHORIZATION, SET_COOKIE, TE, TRAILER, TRANSFER_ENCODING, UPGRADE,
    },
    uri::PathAndQuery,
};
use hyper::body::Incoming;
use hyper_util::{
    client::legacy::Client,
    rt::{TokioExecutor, TokioTimer},
};
use thiserror::Error;

use crate::{
    client::{X_FORWARDED_FOR, forwarded_readable_part},
    config::Upstream,
    http::{
        MAX_HEADER_BYTES,
        connect::{Connector, POOL_AUTHORITY},
        head::has_field,
        inflight::PassSlot,
        route::METHOD_OVERRIDES,
    },
};

/// `X-Forwarded-Proto`.
pub static X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
static KEEP_ALIVE: HeaderName = HeaderName::from_static("keep-alive");
static PROXY_CONNECTION: HeaderName = HeaderName::from_static("proxy-connection");

/// The request body door sends upstream: the client's body streamed through, optionally under a
/// read deadline (a limited route's `read_timeout`, docs/design.md "Limits") or an idle timeout
/// (a pass-through route's `body_read_timeout`), or none at all ([`UpstreamBody::empty`], door's
/// own health probe).
///
/// The idle timeout, like nginx's `client_body_timeout`, runs only while door waits for the
/// client's next part, from when it starts waiting; each part that arrives stops it. It reports
/// and fails as a missed read deadline does.
///
/// The read deadline counts the client's time only: the time door waits for the client's next
/// part of the body. While door holds a part the upstream has not taken (the upstream client
/// has not asked for the next frame: the connection is being made, or the application reads
/// slowly), the deadline stands still; after the first ask, up to `upstream_timeout` in all.
/// It reports once, to the [`BodyWatch`] [`UpstreamBody::new`] returns, whether the body ended
/// or missed its deadline. On a missed deadline the body also yields
/// [`UpstreamBodyError::TimedOut`], which makes the upstream client abort the request, so that
/// the request path can answer 408 (RFC 9110 §15.5.9). The body's own timer runs only while the
/// upstream client polls it; an upstream that stops taking the body stops that polling, which
/// is why the [`BodyWatch`] follows the body's progress and tells such a stall too.
#[derive(Debug)]
pub struct UpstreamBody {
    /// The client's body; `None` for an empty one.
    inner: Option<Incoming>,
    /// The read deadline; `None` without one, and once the body has reported.
    deadline: Option<ReadDeadline>,
    /// The idle timeout; `None` without one, and once the body has reported.
    idle: Option<IdleTimeout>,
    /// A pass-through request's slot, shared with its response ([`UpstreamBody::hold`]), when
    /// the body has no [`Progress`] to keep it in (a stream's); `None` without one, and once the
    /// body has reported.
    slot: Option<PassSlot>,
    events: Option<oneshot::Sender<BodyEvent>>,
}

/// How a request body must arrive, when it must ([`UpstreamBody::new`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyRead {
    /// Whole within this much of the client's time (a limited route's `read_timeout`).
    Deadline(Duration),
    /// With no wait for the client's next part longer than this (a pass-through route's
    /// `body_read_timeout`).
    Idle(Duration),
}

/// A request body's idle timeout as the body keeps it.
#[derive(Debug)]
struct IdleTimeout {
    /// The longest wait for the client's next part.
    limit: Duration,
    /// The timer of the waits: made at the body's first wait (a body that arrives whole with
    /// its head never has one), and set again when each later wait begins.
    timer: Option<Pin<Box<Sleep>>>,
    /// Whether `timer` is set for the current wait.
    waiting: bool,
    /// What the [`BodyWatch`] reads: whether door waits for the client or holds a part the
    /// upstream has not taken (since when), so that an upstream that stops taking the body is
    /// told ([`BodyEnd::UpstreamStalled`]).
    progress: Arc<Progress>,
}

impl IdleTimeout {
    /// Door waits for the client's next part: the timer, set when this wait began, is polled.
    fn waiting(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        if !self.waiting {
            self.waiting = true;
            self.progress
                .state
                .store(Progress::waiting(Duration::ZERO), Ordering::Release);
            let due = crate::time::now() + self.limit;
            if let Some(timer) = &mut self.timer {
                timer.as_mut().reset(due);
            } else {
                self.timer = Some(Box::pin(tokio::time::sleep_until(due)));
            }
        }
        self.timer
            .as_mut()
            .map_or(Poll::Pending, |timer| timer.as_mut().poll(cx))
    }

    /// A part has come and is handed over (not the last): the wait is over, and door holds the
    /// part until the upstream client asks again.
    fn holding(&mut self) {
        self.waiting = false;
        self.progress.state.store(
            Progress::holding(crate::time::now().saturating_duration_since(self.progress.start)),
            Ordering::Release,
        );
    }
}

/// A request body's read deadline as the body keeps it: its timer, and the time door held parts
/// of the body the upstream had not taken, which does not count.
#[derive(Debug)]
struct ReadDeadline {
    /// The body's own timer, set to `armed` (polled, and so registered with tokio's timer, only
    /// while door waits for the client).
    timer: Pin<Box<Sleep>>,
    /// What `timer` is set to.
    armed: Instant,
    /// The deadline had door never held a part: the body's creation plus `read_timeout`.
    due: Instant,
    /// From the body's creation to the upstream client's first ask for a frame (the connection
    /// to the upstream being made): `None` until then. It does not count, and is not taken from
    /// the credit.
    unasked: Option<Duration>,
    /// The time door held parts the upstream had not taken since, up to the current hold.
    held: Duration,
    /// Since when door holds a part the upstream has not taken: the body's creation until the
    /// upstream client first asks for a frame, then each frame's handing over until the next
    /// ask. `None` while door waits for the client.
    holding_since: Option<Instant>,
    /// What the [`BodyWatch`] reads.
    progress: Arc<Progress>,
}

impl ReadDeadline {
    /// The upstream client asks for the next frame: a hold, if any, ends, and counts in `held`
    /// (the first, before any ask, in `unasked`).
    fn asked(&mut self) {
        if let Some(since) = self.holding_since.take() {
            let hold = crate::time::now().saturating_duration_since(since);
            if self.unasked.is_none() {
                self.unasked = Some(hold);
                // Published before the state that follows this ask (a release store).
                self.progress.unasked.store(nanos(hold), Ordering::Relaxed);
            } else {
                self.held += hold;
            }
        }
    }

    /// The answer to that ask: door waits for the client (its next part has not come). The
    /// timer moves on by the holds since it was set (the holds after the first ask at most
    /// `credit` in all), and is polled.
    fn waiting(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        let moved = self.unasked.unwrap_or_default() + self.held.min(self.progress.credit);
        self.progress
            .state
            .store(Progress::waiting(moved), Ordering::Release);
        let late = self.due + moved;
        if late != self.armed {
            self.armed = late;
            self.timer.as_mut().reset(late);
        }
        self.timer.as_mut().poll(cx)
    }

    /// The answer to that ask: a frame handed over (not the last), which door holds until the
    /// upstream client asks again.
    fn holding(&mut self) {
        let now = crate::time::now();
        self.holding_since = Some(now);
        self.progress.state.store(
            Progress::holding(now.saturating_duration_since(self.progress.start)),
            Ordering::Release,
        );
    }
}

/// How far sending a request body upstream has got, as the [`BodyWatch`] reads it: whether door
/// waits for the client (with how far door's holds moved the deadline on) or holds a part the
/// upstream has not taken (since when), in one word so that the two are read together.
#[derive(Debug)]
struct Progress {
    /// The body's creation: the origin of the offsets in `state`.
    start: Instant,
    /// The most time door's holds after the first ask may add to the deadline, in all
    /// (`upstream_timeout`): a client that always has its next part ready before the upstream
    /// takes the last is never waited for, and without this bound its endless body would hold
    /// the request for as long as it kept sending.
    credit: Duration,
    /// Nanoseconds from the body's creation to the upstream client's first ask, written at that
    /// ask, before `state` leaves [`Progress::UNASKED`].
    unasked: AtomicU64,
    /// [`Progress::UNASKED`] until the upstream client first asks for a frame; then
    /// [`Progress::waiting`] or [`Progress::holding`].
    state: AtomicU64,
    /// The body's share of a pass-through request's slot ([`UpstreamBody::hold`]), kept here so
    /// that whichever ends the body's claim first lets it go: the body when it reports, or the
    /// [`BodyWatch`] when the upstream stalls (the body is not polled then, and the stuck
    /// upstream connection would otherwise keep the share for as long as it stays open).
    slot: Mutex<Option<PassSlot>>,
}

impl Progress {
    /// Set in `state` while door waits for the client.
    const WAITING: u64 = 1 << 63;
    /// `state` before the upstream client first asks for a frame (the upstream connection is
    /// being made, which `upstream_timeout` bounds).
    const UNASKED: u64 = u64::MAX;

    fn new(start: Instant, credit: Duration) -> Self {
        Self {
            start,
            credit,
            unasked: AtomicU64::new(0),
            state: AtomicU64::new(Self::UNASKED),
            slot: Mutex::new(None),
        }
    }

    /// The body's share of the slot, taken out (`None` if it has none, or has let it go).
    fn take_slot(&self) -> Option<PassSlot> {
        self.slot
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
    }

    /// Door waits for the client; its holds so far moved the deadline on by `moved`.
    fn waiting(moved: Duration) -> u64 {
        Self::WAITING | nanos(moved).min(Self::UNASKED - 1 - Self::WAITING)
    }

    /// Door holds a part since `since` after the body's creation.
    fn holding(since: Duration) -> u64 {
        nanos(since).min(Self::WAITING - 1)
    }
}

/// `d` in nanoseconds, saturating at `u64::MAX` (585 years).
fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// What the request path watches of a body being sent upstream ([`UpstreamBody::new`]): the
/// event the body reports, and its deadline.
#[derive(Debug)]
pub struct BodyWatch {
    events: oneshot::Receiver<BodyEvent>,
    /// The body's [`Progress`], and its deadline had door never held a part (the body's
    /// creation plus `read_timeout`; `None` under an idle timeout, which the body keeps itself).
    progress: Option<(Arc<Progress>, Option<Instant>)>,
    /// Whether the body keeps a share of a pass-through slot in its [`Progress`] for this
    /// watch to let go of ([`UpstreamBody::hold`]).
    guards_slot: bool,
}

/// How sending a request body upstream ended, as [`BodyWatch::end`] tells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyEnd {
    /// Sent to its end, or no longer needed (the upstream answered before it ended).
    Sent,
    /// The client's time ran past the deadline before the body ended, or door waited for its
    /// next part longer than the idle timeout: the client is late (408).
    TimedOut,
    /// Reading the client's body failed (the client went away, or broke the protocol).
    ClientGone,
    /// Door held a part of the body and the upstream went `stall` (`upstream_timeout`) without
    /// taking it: it stopped reading the request (an application whose workers are all busy
    /// accepts connections and reads nothing), which is not the client's doing.
    UpstreamStalled,
}

impl BodyWatch {
    /// Whether this watch can let go of a pass-through slot's share that the body holds: the
    /// request path keeps such a watch running after the response head has come (the upstream
    /// answered before it took the whole body), so that an upstream that stops reading the
    /// body and keeps its connection open does not hold the slot for as long as it does.
    pub(crate) const fn guards_slot(&self) -> bool {
        self.guards_slot
    }

    /// Waits until the body is sent, fails, or passes its deadline. The deadline counts the
    /// time door waits for the client only: while door holds a part the upstream has not taken
    /// it stands still (up to the body's credit in all, after which the body is late even while
    /// held), and an upstream that takes nothing for `stall` is [`BodyEnd::UpstreamStalled`].
    /// A body under an idle timeout keeps that timeout itself (it reports
    /// [`BodyEvent::TimedOut`]); its watch tells the upstream's stall the same way.
    /// Before the upstream client first asks for a frame (the
    /// connection is being made: its connect is bounded by `upstream_timeout`, which is `stall`),
    /// neither runs; a body not asked for within 2 × `stall` (a name lookup that never returns)
    /// is [`BodyEnd::UpstreamStalled`] too.
    ///
    /// A verdict of its own (late or stalled) also lets go of the body's share of a
    /// pass-through slot, if it holds one, which matters once the upstream has answered: the
    /// request path keeps the watch running then.
    pub async fn end(self, stall: Duration) -> BodyEnd {
        let Self {
            events, progress, ..
        } = self;
        let event = match progress {
            None => events.await,
            Some((progress, due)) => {
                tokio::pin!(events);
                loop {
                    let state = progress.state.load(Ordering::Acquire);
                    // Nothing wakes the watch when the body moves on: unless its verdict is
                    // due sooner, it looks again within `stall`, so that a hold that began
                    // meanwhile is still a stall `stall` after it began.
                    let soon = crate::time::now() + stall;
                    let (wake, verdict) = match verdict(&progress, state, due, stall) {
                        Some((at, verdict)) if at <= soon => (at, Some(verdict)),
                        _ => (soon, None),
                    };
                    tokio::select! {
                        biased;
                        ev = &mut events => break ev,
                        () = tokio::time::sleep_until(wake) => {}
                    }
                    // Still in the same state at its deadline: the body is late, or the
                    // upstream stalled, and its claim to the slot ends (it may never be
                    // polled again). Otherwise the body moved on: look again.
                    if let Some(verdict) = verdict
                        && progress.state.load(Ordering::Acquire) == state
                    {
                        drop(progress.take_slot());
                        return verdict;
                    }
                }
            }
        };
        match event {
            // A body dropped before its end: the upstream client no longer needs it.
            Ok(BodyEvent::Ended) | Err(_) => BodyEnd::Sent,
            Ok(BodyEvent::TimedOut) => BodyEnd::TimedOut,
            Ok(BodyEvent::Failed) => BodyEnd::ClientGone,
        }
    }
}

/// When the [`BodyWatch`] of a body in `state` gives its verdict, and which, if the body stays
/// in that state: `None` while door waits for the client under an idle timeout (the body keeps
/// that one itself). `due` is the read deadline had door never held a part (`None` under an
/// idle timeout); `stall` is `upstream_timeout`.
fn verdict(
    progress: &Progress,
    state: u64,
    due: Option<Instant>,
    stall: Duration,
) -> Option<(Instant, BodyEnd)> {
    if state == Progress::UNASKED {
        // A backstop: the connection's own timeout (`stall` too) bounds its connect, not a name
        // lookup that never returns.
        return Some((progress.start + stall * 2, BodyEnd::UpstreamStalled));
    }
    if state & Progress::WAITING != 0 {
        let moved = Duration::from_nanos(state & !Progress::WAITING);
        return due.map(|due| (due + moved, BodyEnd::TimedOut));
    }
    // Holding: a stall `stall` after the hold began, unless the holds have used up the credit
    // first. By then the client's time has run out however it was split between waits and
    // holds: the body is late even if door never waits for the client again (one always ahead
    // of the upstream).
    let since = progress.start + Duration::from_nanos(state);
    let stalled = (since + stall, BodyEnd::UpstreamStalled);
    let Some(due) = due else {
        return Some(stalled);
    };
    let unasked = Duration::from_nanos(progress.unasked.load(Ordering::Relaxed));
    let late = due + unasked + progress.credit;
    Some(if late < stalled.0 {
        (late, BodyEnd::TimedOut)
    } else {
        stalled
    })
}

/// What happened to a request body, reported once by [`UpstreamBody`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyEvent {
    /// The body was read to its end.
    Ended,
    /// The read deadline passed first, or door waited for the next part longer than the idle
    /// timeout.
    TimedOut,
    /// Reading the client's body failed: the client went away (connection closed or reset,
    /// HTTP/2 RST_STREAM) or broke the protocol.
    Failed,
}

/// Why the body door sends upstream failed.
#[derive(Debug, Error)]
pub enum UpstreamBodyError {
    /// The read deadline passed before the body ended, or door waited for its next part longer
    /// than its idle timeout.
    #[error("the request body did not arrive within its read timeout")]
    TimedOut,
    /// Reading the client's body failed (client gone, protocol error).
    #[error("reading the client's request body: {0}")]
    Client(#[from] hyper::Error),
}

impl UpstreamBody {
    /// The client's body, which must arrive as `read` says when it is given (streams have no
    /// bound; see [`UpstreamBody`]): with [`BodyRead::Deadline`], whole within that much of the
    /// client's time from now, door's holds adding at most `credit` (`upstream_timeout`) to it
    /// in all; with [`BodyRead::Idle`], with no longer wait for a part. A body that is already
    /// complete (no body, `Content-Length: 0`) gets neither timer nor watch; otherwise the
    /// [`BodyWatch`] tells how sending it ended.
    pub fn new(
        inner: Incoming,
        read: Option<BodyRead>,
        credit: Duration,
    ) -> (Self, Option<BodyWatch>) {
        if inner.is_end_stream() {
            let body = Self {
                inner: Some(inner),
                deadline: None,
                idle: None,
                slot: None,
                events: None,
            };
            return (body, None);
        }
        let (tx, rx) = oneshot::channel();
        let now = crate::time::now();
        let (deadline, idle) = match read {
            Some(BodyRead::Deadline(d)) => (Some(d), None),
            Some(BodyRead::Idle(limit)) => (
                None,
                Some(IdleTimeout {
                    limit,
                    timer: None,
                    waiting: false,
                    progress: Arc::new(Progress::new(now, credit)),
                }),
            ),
            None => (None, None),
        };
        let deadline = deadline.map(|d| {
            let due = now + d;
            ReadDeadline {
                timer: Box::pin(tokio::time::sleep_until(due)),
                armed: due,
                due,
                unasked: None,
                held: Duration::ZERO,
                holding_since: Some(now),
                progress: Arc::new(Progress::new(now, credit)),
            }
        });
        let watch = BodyWatch {
            events: rx,
            progress: match (&deadline, &idle) {
                (Some(d), _) => Some((Arc::clone(&d.progress), Some(d.due))),
                (None, Some(i)) => Some((Arc::clone(&i.progress), None)),
                (None, None) => None,
            },
            guards_slot: false,
        };
        let body = Self {
            inner: Some(inner),
            deadline,
            idle,
            slot: None,
            events: Some(tx),
        };
        (body, Some(watch))
    }

    /// No body: a request door makes itself (the health cache's refresh).
    pub const fn empty() -> Self {
        Self {
            inner: None,
            deadline: None,
            idle: None,
            slot: None,
            events: None,
        }
    }

    /// Holds a share of a pass-through request's `slot`, if it has one, until the body has been
    /// sent (or has failed, or been dropped), so that an upstream that answers before it has
    /// read the body still counts the request while it reads on; or, for a body with a read
    /// bound, until its `watch` finds the upstream stalled (the watch is told it guards the
    /// share). A body already complete holds nothing.
    pub(crate) fn hold(&mut self, slot: Option<&mut PassSlot>, watch: Option<&mut BodyWatch>) {
        let Some(slot) = slot else { return };
        if self.events.is_none() {
            return;
        }
        let share = slot.share();
        match self.progress() {
            Some(progress) => {
                *progress.slot.lock().unwrap_or_else(PoisonError::into_inner) = Some(share);
                if let Some(watch) = watch {
                    watch.guards_slot = true;
                }
            }
            None => self.slot = Some(share),
        }
    }

    /// What the [`BodyWatch`] reads, if the body has a read bound.
    fn progress(&self) -> Option<&Progress> {
        self.deadline
            .as_ref()
            .map(|d| &*d.progress)
            .or_else(|| self.idle.as_ref().map(|i| &*i.progress))
    }

    fn report(&mut self, event: BodyEvent) {
        if let Some(progress) = self.progress() {
            drop(progress.take_slot());
        }
        self.deadline = None;
        self.idle = None;
        self.slot = None;
        if let Some(tx) = self.events.take() {
            let _ = tx.send(event);
        }
    }
}

impl Body for UpstreamBody {
    type Data = Bytes;
    type Error = UpstreamBodyError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = &mut *self;
        let Some(inner) = this.inner.as_mut() else {
            return Poll::Ready(None);
        };
        if let Some(d) = &mut this.deadline {
            d.asked();
        }
        let Poll::Ready(frame) = Pin::new(&mut *inner).poll_frame(cx) else {
            let late = this
                .deadline
                .as_mut()
                .is_some_and(|d| d.waiting(cx).is_ready())
                || this.idle.as_mut().is_some_and(|i| i.waiting(cx).is_ready());
            if late {
                this.report(BodyEvent::TimedOut);
                return Poll::Ready(Some(Err(UpstreamBodyError::TimedOut)));
            }
            return Poll::Pending;
        };
        match &frame {
            None => this.report(BodyEvent::Ended),
            Some(Ok(_)) if inner.is_end_stream() => this.report(BodyEvent::Ended),
            Some(Err(_)) => this.report(BodyEvent::Failed),
            Some(Ok(_)) => {
                if let Some(d) = &mut this.deadline {
                    d.holding();
                }
                if let Some(idle) = &mut this.idle {
                    idle.holding();
                }
            }
        }
        Poll::Ready(frame.map(|f| {
            f.map(|mut frame| {
                if let Some(trailers) = frame.trailers_mut() {
                    strip_request_trailers(trailers);
                }
                frame
            })
            .map_err(UpstreamBodyError::Client)
        }))
    }

    fn is_end_stream(&self) -> bool {
        self.inner.as_ref().is_none_or(Body::is_end_stream)
    }

    fn size_hint(&self) -> SizeHint {
        self.inner
            .as_ref()
            .map_or_else(|| SizeHint::with_exact(0), Body::size_hint)
    }
}

/// The upstream could not be reached or failed mid-response.
#[derive(Debug, Error)]
#[error("upstream {upstream}: {source}")]
pub struct ProxyError {
    upstream: String,
    #[source]
    source: hyper_util::client::legacy::Error,
}

impl ProxyError {
    /// Whether the upstream refused or could not be connected to (as opposed to failing later).
    pub fn is_connect(&self) -> bool {
        self.source.is_connect()
    }

    /// What lies under the HTTP client's error, outermost first, each joined by `": "`
    /// (`connection closed before message completed`, `connection error: Connection reset by
    /// peer (os error 104)`): the client's own message names only the stage that failed
    /// (`client error (SendRequest)`). Empty when it has no cause.
    pub fn causes(&self) -> String {
        let mut out = String::new();
        let mut next = std::error::Error::source(&self.source);
        while let Some(cause) = next {
            if !out.is_empty() {
                out.push_str(": ");
            }
            out.push_str(&cause.to_string());
            next = cause.source();
        }
        out
    }
}

/// Where the request came from, as far as the forwarding headers are concerned.
#[derive(Debug, Clone)]
pub struct Origin {
    /// The TCP peer (canonical form: IPv4-mapped unmapped).
    pub peer: IpAddr,
    /// `peer` as text, the element door appends to `X-Forwarded-For` (a connection formats it
    /// once; cloning a `HeaderValue` copies no bytes).
    pub peer_value: HeaderValue,
    /// Whether the peer is a trusted proxy (its forwarding headers are kept and appended to).
    pub peer_trusted: bool,
    /// Whether door received the request over TLS.
    pub tls: bool,
}

/// How long an idle upstream connection stays in the pool: 90 s, hyper-util's default. The pool
/// checks its idle connections once per this period, so one is closed between 90 and 180 s after
/// its last use. An upstream that closes idle connections sooner is fine: the connection's task
/// sees the close, and a request hyper-util finds its connection closed under before sending
/// anything is retried on a new one.
pub const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(90);

/// The upstream client: one connection pool per worker thread ([`crate::http::worker`]), so
/// that a request's upstream connection is one its own thread opened and drives.
#[derive(Debug, Clone)]
pub struct Proxy {
    /// Worker 0's client (and that of every thread that is not a worker).
    first: Client<Connector, UpstreamBody>,
    /// The clients of workers 1, 2, ...
    others: Arc<[Client<Connector, UpstreamBody>]>,
    upstream: Upstream,
}

impl Proxy {
    /// A pooled HTTP/1.1 client for `upstream`: every idle connection kept (the pool is bounded
    /// by the requests in flight, themselves bounded by `upstream_max_inflight` and the groups'
    /// caps), each closed 90 to 180 s after its last use ([`POOL_IDLE_TIMEOUT`]). A smaller pool
    /// measured 2.4 times door's CPU per request under 64 clients (docs/decisions.md, "Accept,
    /// upstream pool and HTTP/2 windows").
    ///
    /// One pool per worker a running door starts ([`crate::http::worker::count`]); an empty
    /// pool costs nothing until it opens a connection. A connection not made within
    /// `connect_timeout` fails the request ([`Connector::new`]).
    pub fn new(upstream: Upstream, connect_timeout: Duration) -> Self {
        let client = || {
            Client::builder(TokioExecutor::new())
                .pool_max_idle_per_host(usize::MAX)
                .pool_idle_timeout(POOL_IDLE_TIMEOUT)
                // Without a timer the pool only notices an expired connection when a request
                // would take it: an idle connection stayed open for as long as no request came.
                .pool_timer(TokioTimer::new())
                // `Host` is door's to set (`retarget`): the URI's authority is the pool's key.
                .set_host(false)
                // A response head is bounded as a request head is (a larger one fails the
                // request: 502); hyper's default would take about 400 KB, which relayed over
                // HTTP/2 makes clients end the connection. Body reads stay in 64 KiB pieces.
                .http1_max_buf_size(MAX_HEADER_BYTES)
                .build(Connector::new(&upstream, connect_timeout))
        };
        Self {
            first: client(),
            others: (1..crate::http::worker::count())
                .map(|_| client())
                .collect(),
            upstream,
        }
    }

    /// The calling worker's client (workers past the pools' count share them in turn).
    fn client(&self) -> &Client<Connector, UpstreamBody> {
        let pools = self.others.len() + 1;
        (crate::http::worker::index() % pools)
            .checked_sub(1)
            .and_then(|i| self.others.get(i))
            .unwrap_or(&self.first)
    }

    /// Sends `req` (already prepared with [`prepare`]) upstream and returns its response head;
    /// the body streams as the upstream sends it.
    ///
    /// Not an `async fn`: the request moves into the pooled client's boxed future at once, so the
    /// returned future holds that future and a reference, not a second copy of the request (it
    /// is part of every request's future, which is built on the stack and copied into its box,
    /// and moved by each level that holds it).
    ///
    /// # Errors
    /// [`ProxyError`] when the upstream cannot be connected to or fails before its head.
    pub fn forward(
        &self,
        req: Request<UpstreamBody>,
    ) -> impl Future<Output = Result<Response<Incoming>, ProxyError>> + Send + '_ {
        let sent = self.client().request(req);
        async move {
            let mut res = sent.await.map_err(|source| ProxyError {
                upstream: self.upstream.to_string(),
                source,
            })?;
            // A response with both is framed by Transfer-Encoding, and a proxy that forwards it
            // must remove Content-Length first (RFC 9112 §6.3): kept, it would frame door's
            // answer to the client by the wrong length (a truncated body over HTTP/1.1, a reset
            // over HTTP/2).
            if has_field(res.headers(), &TRANSFER_ENCODING) {
                res.headers_mut().remove(CONTENT_LENGTH);
            } else {
                single_content_length(res.headers_mut());
            }
            // A 101's Connection and Upgrade are the upgrade's answer (crate::http::upgrade).
            if res.status() != http::StatusCode::SWITCHING_PROTOCOLS {
                strip_hop_by_hop(res.headers_mut());
            }
            Ok(res)
        }
    }

    /// The upstream this proxy sends to.
    pub fn upstream(&self) -> &Upstream {
        &self.upstream
    }
}

/// Replaces a `Content-Length` sent as several fields or as a list of the same value (`5, 5`),
/// which hyper's client accepts (RFC 9112 §6.3 lets a recipient take such a list as the one
/// value; differing values fail the response), with one field of that value, as RFC 9110 §8.6
/// asks of a recipient that accepts the list: forwarded as they came, an HTTP/2 client resets
/// the stream (two `content-length` fields are malformed, RFC 9113 §8.1.1) and HTTP/1.1 parsers
/// such as Node's refuse the list. One field of one value, the usual case, is left as it is.
fn single_content_length(headers: &mut HeaderMap) {
    let mut fields = headers.get_all(CONTENT_LENGTH).iter();
    let Some(first) = fields.next() else {
        return;
    };
    if fields.next().is_none() && !first.as_bytes().contains(&b',') {
        return;
    }
    // hyper checked the values agree only where they frame a body: not for a HEAD, 204 or 304,
    // whose length is the resource's. Equal numbers are kept as one; anything else goes.
    let mut values = headers
        .get_all(CONTENT_LENGTH)
        .iter()
        .flat_map(|v| v.as_bytes().split(|&b| b == b','))
        .map(|v| {
            std::str::from_utf8(v)
                .ok()
                .and_then(|v| v.trim().parse::<u64>().ok())
        });
    let one = values.next().flatten();
    let agreed = one.filter(|n| values.all(|v| v == Some(*n)));
    match agreed {
        Some(n) => {
            headers.insert(CONTENT_LENGTH, HeaderValue::from(n));
        }
        None => {
            headers.remove(CONTENT_LENGTH);
        }
    }
}

/// Rewrites a client's request for the upstream: absolute URI on the pool's key, HTTP/1.1, the
/// client's `Host` kept or set from the target, or the upstream's without either
/// ([`retarget`]), hop-by-hop headers removed (a client's `TE` listing `trailers` passed on as
/// `TE: trailers`), the names of the trailer fields door drops taken out of `Trailer`
/// (`prune_trailer_names`), forwarding headers rewritten per `origin`, an HTTP/2 request's
/// `cookie` fields joined. A `GET` or `HEAD` that came with a chunked body (HTTP/1.1) is sent chunked:
/// hyper's client drops a body of unknown length on those methods unless told, where it forwards
/// one with a `Content-Length`. (An HTTP/2 request's body has no transfer coding to keep: one
/// without `Content-Length` on those methods is as likely an empty DATA frame as a body.)
pub fn prepare<B: Body>(mut req: Request<B>, upstream: &Upstream, origin: &Origin) -> Request<B> {
    retarget(&mut req, upstream);
    let chunked_body = matches!(*req.method(), Method::GET | Method::HEAD)
        && !req.body().is_end_stream()
        && has_field(req.headers(), &TRANSFER_ENCODING);
    let headers = req.headers_mut();
    let trailers = has_field(headers, &TE) && accepts_trailers(headers);
    strip_hop_by_hop(headers);
    if chunked_body {
        headers.insert(TRANSFER_ENCODING, HeaderValue::from_static("chunked"));
    }
    if trailers {
        // The one transfer coding door's own hop honours: trailers cross door both ways. TE is
        // hop-by-hop, so it goes with its connection option (RFC 9110 §10.1.4).
        headers.insert(TE, HeaderValue::from_static("trailers"));
        headers.append(CONNECTION, HeaderValue::from_static("te"));
    }
    if has_field(headers, &TRAILER) {
        prune_trailer_names(headers);
    }
    rewrite_forwarding(headers, origin);
    join_cookies(headers);
    req
}

/// Whether the client's `TE` lists `trailers` (RFC 9110 §10.1.4): it will take trailer fields,
/// so door asks the upstream for them too (hyper's server sends a response's trailers to an
/// HTTP/1.1 client only when it asked so).
fn accepts_trailers(headers: &HeaderMap) -> bool {
    headers.get_all(TE).iter().any(|v| {
        v.as_bytes()
            .split(|&b| b == b',')
            .any(|coding| coding.trim_ascii().eq_ignore_ascii_case(b"trailers"))
    })
}

/// Points `req` at `upstream` over HTTP/1.1: the target becomes the absolute URI on the pool's
/// key ([`POOL_AUTHORITY`], which [`Connector`] dials as `upstream`) with the client's path and
/// query, and `Host` is kept, or, when the request target has an authority (HTTP/2's
/// `:authority`, an HTTP/1.1 absolute-form target), set to it (RFC 9113 §8.3.1, RFC 9112 §3.2.2;
/// on door's request path the head passed [`crate::http::head::check`], so an HTTP/2 `Host`
/// already agrees with it). A request with neither (HTTP/1.0 may omit `Host`) gets the
/// upstream's host, and its port unless it is 80. A target that cannot be rebuilt is left as it
/// was (the pooled client then refuses it).
pub fn retarget<B>(req: &mut Request<B>, upstream: &Upstream) {
    if let Some(authority) = req.uri().authority() {
        if req
            .headers()
            .get(HOST)
            .is_none_or(|h| h.as_bytes() != authority.as_str().as_bytes())
            && let Ok(host) = HeaderValue::from_str(authority.as_str())
        {
            req.headers_mut().insert(HOST, host);
        }
    } else if !has_field(req.headers(), &HOST) {
        let host = match upstream.authority.port_u16() {
            None | Some(80) => upstream.authority.host(),
            Some(_) => upstream.authority.as_str(),
        };
        if let Ok(host) = HeaderValue::from_str(host) {
            req.headers_mut().insert(HOST, host);
        }
    }
    let path = req
        .uri()
        .path_and_query()
        .cloned()
        .unwrap_or_else(|| PathAndQuery::from_static("/"));
    let mut parts = http::uri::Parts::default();
    parts.scheme = Some(upstream.scheme.clone());
    parts.authority = Some(POOL_AUTHORITY);
    parts.path_and_query = Some(path);
    if let Ok(uri) = Uri::from_parts(parts) {
        *req.uri_mut() = uri;
    }
    *req.version_mut() = Version::HTTP_11;
}

/// Joins several `cookie` fields into one, in their order, with "; " (RFC 9113 §8.2.3: an
/// HTTP/2 client may send one field per cookie-pair, and they must be concatenated this way
/// before the request goes to an HTTP/1.1 upstream, where RFC 6265 §5.4 allows one `Cookie`
/// line; frameworks that read one line would otherwise lose cookies). A single field is left
/// untouched.
pub fn join_cookies(headers: &mut HeaderMap) {
    // Compared, not hashed, first: most requests have one `Cookie` field or none.
    if !headers.keys().any(|k| k == COOKIE) {
        return;
    }
    let mut fields = headers.get_all(COOKIE).iter();
    let (Some(_), Some(_)) = (fields.next(), fields.next()) else {
        return;
    };
    let lines: Vec<&[u8]> = headers
        .get_all(COOKIE)
        .iter()
        .map(HeaderValue::as_bytes)
        .collect();
    if let Ok(joined) = HeaderValue::from_bytes(&lines.join(&b"; "[..])) {
        headers.insert(COOKIE, joined);
    }
}

/// The hop-by-hop fields of RFC 9110 §7.6.1 (plus the legacy `Keep-Alive` and
/// `Proxy-Connection`), `Connection` first. `Trailer` is not one (RFC 9110 §6.6.2): it names the
/// trailer fields end to end, and hyper's HTTP/1.1 encoder sends only the trailer fields it names.
static HOP_BY_HOP: [&HeaderName; 8] = [
    &CONNECTION,
    &KEEP_ALIVE,
    &PROXY_CONNECTION,
    &PROXY_AUTHENTICATE,
    &PROXY_AUTHORIZATION,
    &TE,
    &TRANSFER_ENCODING,
    &UPGRADE,
];

/// Removes the hop-by-hop fields (RFC 9110 §7.6.1): those named in `Connection`, and those of
/// `HOP_BY_HOP`.
///
/// Most requests carry none of them: one pass over the field names (compared, not hashed)
/// finds that out, and then nothing is removed (a removal hashes its name); otherwise only the
/// fields of `HOP_BY_HOP` that pass found are removed. Most responses carry
/// `Connection: keep-alive`: an option naming a field of `HOP_BY_HOP`, or no field present,
/// allocates no name.
pub fn strip_hop_by_hop(headers: &mut HeaderMap) {
    // Bit `i` set: `HOP_BY_HOP[i]` is present. Only those are removed.
    let present = headers
        .keys()
        .filter_map(|name| HOP_BY_HOP.iter().position(|h| *h == name))
        .fold(0_u16, |bits, i| bits | 1 << i);
    if present == 0 {
        return;
    }
    // Options that name a field of HOP_BY_HOP (`keep-alive`, usually) or no field present
    // (`close`) make no name: only a field still to remove allocates one. The value is split as
    // bytes, so that an option that is not a field name (non-ASCII bytes) spares none of the
    // others in its line.
    let named: Vec<HeaderName> = headers
        .get_all(CONNECTION)
        .iter()
        .flat_map(|v| v.as_bytes().split(|&b| b == b','))
        .filter_map(|option| core::str::from_utf8(option).ok())
        // OWS is spaces and tabs (RFC 9110 §5.6.3), not every Unicode space.
        .map(|option| option.trim_matches([' ', '\t']))
        .filter(|name| {
            !HOP_BY_HOP
                .iter()
                .any(|h| h.as_str().eq_ignore_ascii_case(name))
                && headers.contains_key(*name)
        })
        .filter_map(|name| HeaderName::from_bytes(name.as_bytes()).ok())
        .collect();
    for name in named {
        // `Connection: Host` or `Connection: X-Forwarded-For` must not remove what door itself
        // relies on or rewrites (found by hostile testing).
        if !PROTECTED.contains(&&name) {
            headers.remove(name);
        }
    }
    for (i, name) in HOP_BY_HOP.iter().enumerate() {
        if present & 1 << i != 0 {
            headers.remove(*name);
        }
    }
}

/// Fields a `Connection` header may not name for removal: `Host` and the forwarding fields door
/// rewrites itself, and the credential fields door reads for its request planes (a client that
/// named `Authorization` there would have its made-up token counted by door and hidden from the
/// application, which then could not refuse it: docs/design.md, "Streams and sessions", Planes).
/// All are end to end; RFC 9110 §7.6.1 forbids naming such a field as a connection option.
static PROTECTED: [&HeaderName; 6] = [
    &HOST,
    &X_FORWARDED_FOR,
    &FORWARDED,
    &X_FORWARDED_PROTO,
    &AUTHORIZATION,
    &COOKIE,
];

/// Client-identity, client-scheme and rewritten-target fields other proxies, platforms and
/// frameworks read (`X-Real-IP` by nginx's realip and chi's RealIP, `True-Client-IP` by Akamai
/// and chi, `X-Forwarded-Ssl`, `X-Forwarded-Scheme` and `X-Forwarded-Port` by Rack,
/// `X-Forwarded-Port` and `X-Forwarded-Prefix` by Werkzeug's `ProxyFix` and Spring,
/// `Front-End-Https` by IIS, `Client-IP` by PHP applications, `X-Scheme` by Tornado (before
/// `X-Forwarded-Proto`), `Forwarded-For` and `X-Forwarded` by django-ipware, `X-Original-URL` and
/// `X-Rewrite-URL` by IIS rewrites and the frameworks that honoured them (CVE-2018-14773), the
/// platforms' client-address fields, …): from an untrusted peer they are dropped, so that the
/// application can trust exactly one hop, door (docs/design.md, "Client key"). door's own
/// `X-Forwarded-Proto` says which scheme the client used. A list of 32 names, so a field no
/// framework door knows of passes: an application must trust only door's fields. Whether `name`
/// (lower case, as `http` keeps names) is one: a `match`, one comparison by length and bytes per
/// request field, where a list of `HeaderName`s cost several times as much.
fn is_identity(name: &str) -> bool {
    matches!(
        name,
        "x-real-ip"
            | "true-client-ip"
            | "x-client-ip"
            | "x-cluster-client-ip"
            | "cf-connecting-ip"
            | "fastly-client-ip"
            | "client-ip"
            | "x-originating-ip"
            | "x-original-forwarded-for"
            | "x-forwarded-host"
            | "x-forwarded-server"
            | "x-forwarded-port"
            | "x-forwarded-ssl"
            | "x-forwarded-scheme"
            | "x-forwarded-prefix"
            | "x-url-scheme"
            | "front-end-https"
            | "x-scheme"
            | "x-forwarded-protocol"
            | "x-forwarded-uri"
            | "x-original-url"
            | "x-rewrite-url"
            | "x-original-host"
            | "x-host"
            | "forwarded-for"
            | "x-forwarded"
            | "x-envoy-external-address"
            | "fly-client-ip"
            | "x-appengine-user-ip"
            | "x-azure-clientip"
            | "x-azure-socketip"
            | "x-proxyuser-ip"
    )
}

/// Drops the fields whose name, with `_` read as `-`, is a forwarding or identity field door
/// rewrites or drops (`X_Forwarded_For`, `Client_IP`, …): CGI, WSGI, Rack and PHP turn both
/// spellings into the same `HTTP_X_FORWARDED_FOR` variable, so the underscore one would stand in
/// for the field door wrote (the trick behind CVE-2024-45614 in Puma).
fn drop_underscore_aliases(headers: &mut HeaderMap) {
    let aliases: Vec<HeaderName> = headers
        .keys()
        .filter(|k| {
            k.as_str().contains('_') && is_forwarding_or_identity(&k.as_str().replace('_', "-"))
        })
        .cloned()
        .collect();
    for name in aliases {
        headers.remove(name);
    }
}

/// Whether `name` (lower case, `_` already read as `-`) is a forwarding or identity field door
/// writes or drops: `X-Forwarded-For`, `Forwarded`, `X-Forwarded-Proto`, or one of
/// [`is_identity`].
fn is_forwarding_or_identity(name: &str) -> bool {
    is_identity(name)
        || [&X_FORWARDED_FOR, &FORWARDED, &X_FORWARDED_PROTO]
            .iter()
            .any(|n| n.as_str() == name)
}

/// From an untrusted peer, client-sent `X-Forwarded-For` and `Forwarded` (and the other identity
/// fields of `is_identity`) are dropped and replaced by the peer; from a trusted proxy the chains
/// are kept byte for byte and the peer appended, but for the part of a `Forwarded` chain the
/// client key cannot read (`readable_forwarded`). `X-Forwarded-Proto` always says what door
/// received.
pub fn rewrite_forwarding(headers: &mut HeaderMap, origin: &Origin) {
    // One pass over the names says what is there (compared, not hashed): a lookup or removal
    // hashes its name, and most requests carry none of these fields.
    let (mut identity, mut underscore, mut xff, mut forwarded) = (false, false, false, false);
    for k in headers.keys() {
        xff |= k == X_FORWARDED_FOR;
        forwarded |= k == FORWARDED;
        if !origin.peer_trusted {
            identity |= is_identity(k.as_str());
            underscore |= k.as_str().contains('_');
        }
    }
    if !origin.peer_trusted && identity {
        let names: Vec<HeaderName> = headers
            .keys()
            .filter(|k| is_identity(k.as_str()))
            .cloned()
            .collect();
        for name in names {
            headers.remove(name);
        }
    }
    if !origin.peer_trusted && underscore {
        drop_underscore_aliases(headers);
    }
    let peer = origin.peer_value.as_bytes();
    let forwarded_for = || {
        let mut v = Vec::with_capacity(peer.len() + 8);
        match origin.peer {
            IpAddr::V4(_) => {
                v.extend_from_slice(b"for=");
                v.extend_from_slice(peer);
            }
            IpAddr::V6(_) => {
                v.extend_from_slice(b"for=\"[");
                v.extend_from_slice(peer);
                v.extend_from_slice(b"]\"");
            }
        }
        v
    };
    let append = |mut prior: Vec<u8>, own: &[u8]| {
        prior.extend_from_slice(b", ");
        prior.extend_from_slice(own);
        prior
    };
    // The common case, a client talking to door directly: X-Forwarded-For is the peer alone,
    // inserted without formatting or copying. Through a trusted proxy, the chain and the peer
    // are written once, into a buffer of exactly their length that becomes the value as it is.
    let prior_xff = if origin.peer_trusted && xff {
        join_lines(headers, &X_FORWARDED_FOR, 2 + peer.len())
    } else {
        None
    };
    let prior_forwarded = if forwarded && origin.peer_trusted {
        // `, ` + `for="[` + the peer + `]"`: room for the longest own element.
        readable_forwarded(headers, 2 + 6 + peer.len() + 2)
    } else {
        None
    };
    match prior_xff {
        Some(x) => {
            if let Ok(v) = HeaderValue::from_maybe_shared(Bytes::from(append(x, peer))) {
                headers.insert(&X_FORWARDED_FOR, v);
            }
        }
        None => {
            headers.insert(&X_FORWARDED_FOR, origin.peer_value.clone());
        }
    }
    if forwarded {
        let value = match prior_forwarded {
            Some(fwd) => append(fwd, &forwarded_for()),
            None => forwarded_for(),
        };
        if let Ok(v) = HeaderValue::from_bytes(&value) {
            headers.insert(&FORWARDED, v);
        }
    }
    headers.insert(
        &X_FORWARDED_PROTO,
        HeaderValue::from_static(if origin.tls { "https" } else { "http" }),
    );
}

/// Drops from a request's trailer section every field door reads, rewrites or drops in the header
/// section, whoever the peer: the hop-by-hop fields and `Content-Length`, `Host`, the forwarding
/// and identity fields (`X-Forwarded-For`, `Forwarded`, `X-Forwarded-Proto`, those of
/// `is_identity`), the method overrides routing reads ([`METHOD_OVERRIDES`]), the credentials the
/// request planes read (`Authorization`, `Cookie`), and the `_` spellings of them all. None of them
/// belongs in a trailer (RFC 9110 §6.5.1: fields for framing, routing, authentication and request
/// modifiers are not to be sent there), yet an application or server that merges trailers into the
/// header section (Apache httpd's `MergeTrailers On`, for one) would take a client-chosen address
/// or session from there, past door's rewrite and its planes (found by hostile testing). Other
/// trailer fields (a checksum, a signature) pass. Trailers are rare: a body without them never
/// calls this.
fn strip_request_trailers(trailers: &mut HeaderMap) {
    let names: Vec<HeaderName> = trailers
        .keys()
        .filter(|k| barred_from_trailers(k.as_str()))
        .cloned()
        .collect();
    for name in names {
        trailers.remove(name);
    }
}

/// Drops from a response's trailer section the hop-by-hop fields (RFC 9110 §7.6.1: those of
/// `HOP_BY_HOP` and those its `Connection` names) and the fields RFC 9110 §6.5.1 keeps out of a
/// trailer section because a recipient needs them before the content (framing, routing,
/// authentication, response controls, the content's format: the list hyper's HTTP/1.1 server
/// drops, [`BARRED_FROM_RESPONSE_TRAILERS`]). Over HTTP/2 the hop-by-hop ones are not only
/// meaningless but forbidden (RFC 9113 §8.2.2): the `h2` crate refuses to send them, and passed
/// on from an HTTP/1.1 upstream they would reset the client's stream after its last byte of data
/// (found by a test). Of the rest, hyper's HTTP/1.1 server sends those the response's `Trailer`
/// field names; an HTTP/2 client gets them all. Trailers are rare: a body without them never
/// calls this.
pub(crate) fn strip_response_trailers(trailers: &mut HeaderMap) {
    strip_hop_by_hop(trailers);
    for name in BARRED_FROM_RESPONSE_TRAILERS {
        if trailers.contains_key(name) {
            trailers.remove(name);
        }
    }
}

/// The fields hyper's HTTP/1.1 server leaves out of a response's trailer section (its
/// `is_valid_trailer_field`), after RFC 9110 §6.5.1; [`strip_response_trailers`] drops them for
/// every client.
static BARRED_FROM_RESPONSE_TRAILERS: [&HeaderName; 12] = [
    &AUTHORIZATION,
    &CACHE_CONTROL,
    &CONTENT_ENCODING,
    &CONTENT_LENGTH,
    &CONTENT_RANGE,
    &CONTENT_TYPE,
    &HOST,
    &MAX_FORWARDS,
    &SET_COOKIE,
    &TE,
    &TRAILER,
    &TRANSFER_ENCODING,
];

/// Whether door drops a request trailer field named `name` (lower case) in
/// [`strip_request_trailers`], which says which and why.
fn barred_from_trailers(name: &str) -> bool {
    let dashed = name.replace('_', "-");
    is_forwarding_or_identity(&dashed)
        || HOP_BY_HOP
            .iter()
            .chain([
                &&HOST,
                &&AUTHORIZATION,
                &&COOKIE,
                &&CONTENT_LENGTH,
                &&TRAILER,
            ])
            .any(|h| h.as_str() == dashed)
        || METHOD_OVERRIDES.iter().any(|h| h.as_str() == dashed)
}

/// Takes out of a request's `Trailer` field (RFC 9110 §6.6.2: the names of the trailer fields the
/// sender means to send) the names door drops from the trailer section
/// ([`strip_request_trailers`]), so that the upstream is not told to expect fields that will not
/// come. Line by line: a line that names none of them is kept byte for byte; one that does is
/// written again with the other names, each trimmed of OWS, joined by `, ` (its empty elements
/// go, as RFC 9110 §5.6.1 lets a recipient drop them); a line left naming nothing is removed.
/// Lines are not merged: hyper's HTTP/1.1 client reads the names it may send line by line and
/// skips a line holding a byte outside visible ASCII, so one such name must not take the others
/// with it. Called only when the request has a `Trailer` field.
fn prune_trailer_names(headers: &mut HeaderMap) {
    /// The non-empty elements of one line of a list field, trimmed of OWS (spaces and tabs,
    /// RFC 9110 §5.6.3).
    fn names(line: &HeaderValue) -> Vec<&[u8]> {
        line.as_bytes()
            .split(|&b| b == b',')
            .map(<[u8]>::trim_ascii)
            .filter(|n| !n.is_empty())
            .collect()
    }
    let barred = |n: &[u8]| {
        core::str::from_utf8(n).is_ok_and(|n| barred_from_trailers(&n.to_ascii_lowercase()))
    };
    if !headers
        .get_all(TRAILER)
        .iter()
        .any(|line| names(line).into_iter().any(barred))
    {
        return;
    }
    let lines: Vec<HeaderValue> = headers
        .get_all(TRAILER)
        .iter()
        .filter_map(|line| {
            let all = names(line);
            if !all.iter().any(|n| barred(n)) {
                return Some(line.clone());
            }
            let kept: Vec<&[u8]> = all.into_iter().filter(|n| !barred(n)).collect();
            if kept.is_empty() {
                return None;
            }
            // Made of a valid value's bytes and `, `: always a valid value.
            HeaderValue::from_bytes(&kept.join(&b", "[..])).ok()
        })
        .collect();
    headers.remove(TRAILER);
    for line in lines {
        headers.append(TRAILER, line);
    }
}

/// A trusted proxy's `Forwarded` chain as door passes it on, before its own element: byte for
/// byte when the client key reads it to its start; otherwise what the client key read of it
/// (the well-formed elements right of the first malformed one, [`forwarded_readable_part`]),
/// after `for=unknown` (RFC 7239 §6.3) in place of the rest. Kept whole, a malformed element could
/// swallow door's (`for="198.51.100.66` leaves a quoted string open) or be read by the
/// application as naming a client door did not key on: the application's walk from the right
/// stops where door's did (found by hostile testing). `None` when there is no `Forwarded` field.
///
/// The value has room for `room` more bytes (door's own element).
fn readable_forwarded(headers: &HeaderMap, room: usize) -> Option<Vec<u8>> {
    const UNKNOWN: &[u8] = b"for=unknown";
    let Some(readable) = forwarded_readable_part(headers) else {
        return join_lines(headers, &FORWARDED, room);
    };
    let len = readable
        .iter()
        .fold(UNKNOWN.len(), |len, element| len + 2 + element.len());
    let mut value = Vec::with_capacity(len + room);
    value.extend_from_slice(UNKNOWN);
    for element in readable {
        value.extend_from_slice(b", ");
        value.extend_from_slice(element);
    }
    Some(value)
}

/// All lines of `name` joined with `", "` in wire order (RFC 9110 §5.3), byte for byte (obs-text
/// included: the chain the upstream sees is the chain door walked), or `None` when absent. Built
/// in one buffer with room for `room` more bytes, so that door's own element is appended without
/// growing it.
fn join_lines(headers: &HeaderMap, name: &HeaderName, room: usize) -> Option<Vec<u8>> {
    let lines = headers.get_all(name);
    let len = lines
        .iter()
        .map(HeaderValue::len)
        .reduce(|joined, line| joined + 2 + line)?;
    let mut joined = Vec::with_capacity(len + room);
    for (i, line) in lines.iter().enumerate() {
        if i > 0 {
            joined.extend_from_slice(b", ");
        }
        joined.extend_from_slice(line.as_bytes());
    }
    Some(joined)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    /// An upstream that closes a connection without answering fails the request with an error
    /// whose causes say so: the log line of a 502 names what happened, not only the client's
    /// stage (`client error (SendRequest)`).
    #[tokio::test]
    async fn a_failed_upstream_call_names_its_cause() {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        tokio::spawn(async move {
            // Reads the head, then closes without a byte of answer.
            let (mut s, _) = l.accept().await.unwrap();
            let mut buf = [0u8; 1024];
            let _ = tokio::io::AsyncReadExt::read(&mut s, &mut buf).await;
        });
        let upstream = Upstream::parse(&format!("http://{addr}")).unwrap();
        let proxy = Proxy::new(upstream, Duration::from_secs(5));
        let req = Request::get(format!("http://{addr}/x"))
            .body(UpstreamBody::empty())
            .unwrap();
        let e = proxy.forward(req).await.unwrap_err();
        assert!(!e.is_connect(), "{e}");
        let causes = e.causes();
        assert!(
            causes.contains("connection closed before message completed"),
            "{e}: {causes}"
        );
        assert!(!e.to_string().contains(&causes), "{e}");
        // The 502's log line carries it (the only upstream failure logged in these tests, so
        // the once-a-minute limit lets it through).
        let log = crate::obs::logging::capture::Capture::default();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(log.clone())
            .with_ansi(false)
            .finish();
        let res = tracing::subscriber::with_default(subscriber, || {
            crate::http::answer::failure_response(&crate::http::answer::Failure::Upstream(e))
        });
        assert_eq!(res.status(), http::StatusCode::BAD_GATEWAY);
        let text = log.text();
        assert!(
            text.contains("cause=connection closed before message completed"),
            "{text}"
        );
    }

    /// Several `Content-Length` values become one when they agree, and none when they do not
    /// (hyper checks them only where they frame a body: not for a HEAD, 204 or 304).
    #[test]
    fn a_repeated_content_length_becomes_one_or_none() {
        let of = |values: &[&str]| {
            let mut h = HeaderMap::new();
            for v in values {
                h.append(CONTENT_LENGTH, v.parse().unwrap());
            }
            single_content_length(&mut h);
            h.get_all(CONTENT_LENGTH)
                .iter()
                .map(|v| v.to_str().unwrap().to_owned())
                .collect::<Vec<_>>()
        };
        assert_eq!(of(&["5"]), ["5"]);
        assert_eq!(of(&["5", "5"]), ["5"]);
        assert_eq!(of(&["5, 5"]), ["5"]);
        assert_eq!(of(&[" 5 ,5", "5"]), ["5"]);
        assert!(of(&["5, 6"]).is_empty());
        assert!(of(&["5", "6"]).is_empty());
        assert!(of(&["abc, 5"]).is_empty());
        assert!(of(&["5,"]).is_empty());
        assert!(of(&[]).is_empty());
    }

    /// A watch on a body created now with a 10 s read deadline, before the upstream client
    /// asked for a frame, with the sender of its body's events and its progress.
    fn new_watch() -> (BodyWatch, oneshot::Sender<BodyEvent>, Arc<Progress>) {
        let (tx, rx) = oneshot::channel();
        let now = crate::time::now();
        let progress = Arc::new(Progress::new(now, Duration::from_secs(30)));
        let watch = BodyWatch {
            events: rx,
            progress: Some((Arc::clone(&progress), Some(now + Duration::from_secs(10)))),
            guards_slot: false,
        };
        (watch, tx, progress)
    }

    /// The same under an idle timeout (no read deadline): waits for the client never end in
    /// the watch (the body keeps that timeout), a part the upstream does not take for the stall
    /// time is its stall.
    #[tokio::test(start_paused = true)]
    async fn under_an_idle_timeout_the_watch_tells_only_the_upstreams_stall() {
        let (tx, rx) = oneshot::channel();
        let progress = Arc::new(Progress::new(crate::time::now(), Duration::from_secs(30)));
        let watch = BodyWatch {
            events: rx,
            progress: Some((Arc::clone(&progress), None)),
            guards_slot: false,
        };
        let start = crate::time::now();
        let end = tokio::spawn(watch.end(STALL));
        set(&progress, Progress::waiting(Duration::ZERO));
        tokio::time::sleep(Duration::from_mins(10)).await;
        assert!(
            !end.is_finished(),
            "a wait for the client ended in the watch"
        );
        set(
            &progress,
            Progress::holding(crate::time::now().duration_since(start)),
        );
        assert_eq!(end.await.unwrap(), BodyEnd::UpstreamStalled);
        assert_eq!(start.elapsed(), Duration::from_mins(10) + STALL);
        drop(tx);
    }

    fn set(progress: &Progress, state: u64) {
        progress.state.store(state, Ordering::Release);
    }

    const STALL: Duration = Duration::from_secs(5);

    /// Waiting for the client from the start: timed out at the deadline.
    #[tokio::test(start_paused = true)]
    async fn a_body_waiting_for_the_client_times_out_at_its_deadline() {
        let (watch, _tx, progress) = new_watch();
        set(&progress, Progress::waiting(Duration::ZERO));
        let start = crate::time::now();
        assert_eq!(watch.end(STALL).await, BodyEnd::TimedOut);
        assert_eq!(start.elapsed(), Duration::from_secs(10));
    }

    /// The time door held parts the upstream had not taken does not count: after 7 s of holds,
    /// a body waiting for the client times out 7 s past the deadline; a client that finishes
    /// within its own 10 s is not late.
    #[tokio::test(start_paused = true)]
    async fn the_time_door_holds_a_part_for_the_upstream_does_not_count() {
        let (watch, _tx, progress) = new_watch();
        set(&progress, Progress::waiting(Duration::from_secs(7)));
        let start = crate::time::now();
        assert_eq!(watch.end(STALL).await, BodyEnd::TimedOut);
        assert_eq!(start.elapsed(), Duration::from_secs(17));

        let (watch, tx, progress) = new_watch();
        set(&progress, Progress::waiting(Duration::ZERO));
        let end = tokio::spawn(watch.end(STALL));
        // 4 s waiting for the client, then 9 s held for the upstream, taking a part every 4 s,
        // then 5 s waiting for the client again, and the body ends (18 s in all).
        tokio::time::sleep(Duration::from_secs(4)).await;
        for at in [4, 8, 12] {
            set(&progress, Progress::holding(Duration::from_secs(at)));
            tokio::time::sleep(Duration::from_secs(if at == 12 { 1 } else { 4 })).await;
        }
        set(&progress, Progress::waiting(Duration::from_secs(9)));
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert!(!end.is_finished(), "late with 9 s of the client's time");
        tx.send(BodyEvent::Ended).unwrap();
        assert_eq!(end.await.unwrap(), BodyEnd::Sent);
    }

    /// Holds after the first ask add at most the credit (here 30 s) to the deadline: a body
    /// always held for an upstream that keeps taking its parts, never waiting for the client, is
    /// late at 10 + 30 s; the wait before the first ask (2 s here) does not use the credit.
    #[tokio::test(start_paused = true)]
    async fn holds_add_at_most_the_credit_to_the_deadline() {
        let (watch, _tx, progress) = new_watch();
        let start = crate::time::now();
        let end = tokio::spawn(async move { (watch.end(STALL).await, start.elapsed()) });
        tokio::time::sleep(Duration::from_secs(2)).await;
        progress
            .unasked
            .store(nanos(Duration::from_secs(2)), Ordering::Relaxed);
        for at in (2..60).step_by(4) {
            set(&progress, Progress::holding(Duration::from_secs(at)));
            tokio::time::sleep(Duration::from_secs(4)).await;
        }
        assert_eq!(
            end.await.unwrap(),
            (BodyEnd::TimedOut, Duration::from_secs(42))
        );
    }

    /// A part held for the upstream that it does not take for the stall time is the upstream's
    /// stall, whatever the read deadline; one it takes in time is not.
    #[tokio::test(start_paused = true)]
    async fn a_part_the_upstream_does_not_take_is_a_stall_after_the_stall_time() {
        let (watch, _tx, progress) = new_watch();
        set(&progress, Progress::holding(Duration::from_secs(1)));
        let start = crate::time::now();
        assert_eq!(watch.end(STALL).await, BodyEnd::UpstreamStalled);
        assert_eq!(start.elapsed(), Duration::from_secs(6));

        // Holds of 4 s each, past the read deadline (10 s) and short of the credit's end (40 s):
        // no stall, no time out.
        let (watch, tx, progress) = new_watch();
        let end = tokio::spawn(watch.end(STALL));
        for at in (0..36).step_by(4) {
            set(&progress, Progress::holding(Duration::from_secs(at)));
            tokio::time::sleep(Duration::from_secs(4)).await;
        }
        assert!(!end.is_finished(), "a stall while the upstream took parts");
        tx.send(BodyEvent::Ended).unwrap();
        assert_eq!(end.await.unwrap(), BodyEnd::Sent);
    }

    /// A hold that begins while the watch sleeps toward the client's deadline is still a stall
    /// `stall` after it began, not at that deadline.
    #[tokio::test(start_paused = true)]
    async fn a_stall_that_begins_after_a_wait_for_the_client_is_told_after_the_stall_time() {
        let (watch, _tx, progress) = new_watch();
        set(&progress, Progress::waiting(Duration::ZERO));
        let start = crate::time::now();
        let end = tokio::spawn(watch.end(STALL));
        tokio::time::sleep(Duration::from_secs(1)).await;
        set(&progress, Progress::holding(Duration::from_secs(1)));
        assert_eq!(end.await.unwrap(), BodyEnd::UpstreamStalled);
        assert_eq!(start.elapsed(), Duration::from_secs(6));
    }

    /// Before the upstream client first asks for a frame (the connection to the upstream being
    /// made, whose connect `upstream_timeout` bounds on its own), neither the deadline nor the
    /// stall runs; a body never asked for is a stall at 2 × the stall time (a name lookup that
    /// never returns).
    #[tokio::test(start_paused = true)]
    async fn nothing_runs_before_the_upstream_client_asks_for_the_body_but_a_backstop() {
        let (watch, tx, _progress) = new_watch();
        let end = tokio::spawn(watch.end(STALL));
        tokio::time::sleep(Duration::from_millis(9_999)).await;
        assert!(!end.is_finished());
        tx.send(BodyEvent::Ended).unwrap();
        assert_eq!(end.await.unwrap(), BodyEnd::Sent);

        let (watch, _tx, _progress) = new_watch();
        let start = crate::time::now();
        assert_eq!(watch.end(STALL).await, BodyEnd::UpstreamStalled);
        assert_eq!(start.elapsed(), STALL * 2);
    }

    use super::*;

    fn origin(peer: &str, trusted: bool) -> Origin {
        let peer: IpAddr = peer.parse().unwrap();
        Origin {
            peer,
            peer_value: HeaderValue::try_from(peer.to_string()).unwrap(),
            peer_trusted: trusted,
            tls: false,
        }
    }

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        h
    }

    #[test]
    fn a_request_without_host_gets_the_upstreams_host_and_every_request_the_pool_key() {
        for (upstream, host) in [
            ("http://127.0.0.1:3000", "127.0.0.1:3000"),
            ("http://app.internal", "app.internal"),
            ("http://app.internal:80", "app.internal"),
            ("http://[2001:db8::1]:8080", "[2001:db8::1]:8080"),
            ("http://[2001:db8::1]", "[2001:db8::1]"),
        ] {
            let upstream = Upstream::parse(upstream).unwrap();
            let mut req = Request::builder()
                .version(Version::HTTP_10)
                .uri("/p?q=1")
                .body(())
                .unwrap();
            retarget(&mut req, &upstream);
            assert_eq!(req.headers()[HOST], host, "{upstream}");
            assert_eq!(req.uri().authority(), Some(&POOL_AUTHORITY));
            assert_eq!(req.uri().path_and_query().unwrap().as_str(), "/p?q=1");
            assert_eq!(req.version(), Version::HTTP_11);

            let mut req = Request::builder()
                .uri("/p")
                .header(HOST, "door.test")
                .body(())
                .unwrap();
            retarget(&mut req, &upstream);
            assert_eq!(req.headers()[HOST], "door.test", "a client's Host is kept");
        }
    }

    /// Trailers cross door: a client's `TE` listing `trailers` reaches the upstream as
    /// `TE: trailers` with its connection option, any other `TE` not at all, and `Trailer`
    /// (which names the trailer fields, end to end) always.
    #[test]
    fn a_clients_te_trailers_and_trailer_reach_the_upstream() {
        let upstream = Upstream::parse("http://127.0.0.1:3000").unwrap();
        let prepared = |pairs: &[(&str, &str)]| {
            let mut req = Request::builder()
                .uri("/p")
                .body(http_body_util::Empty::<Bytes>::new())
                .unwrap();
            *req.headers_mut() = headers(pairs);
            prepare(req, &upstream, &origin("192.0.2.1", false))
        };
        for te in ["trailers", "gzip, Trailers", "deflate,trailers ,gzip"] {
            let req = prepared(&[("te", te), ("connection", "te"), ("trailer", "x-sum")]);
            assert_eq!(req.headers()[TE], "trailers", "{te}");
            assert_eq!(req.headers()[CONNECTION], "te", "{te}");
            assert_eq!(req.headers()[TRAILER], "x-sum", "{te}");
        }
        let req = prepared(&[("te", "gzip"), ("connection", "te")]);
        assert!(!req.headers().contains_key(TE));
        assert!(!req.headers().contains_key(CONNECTION));
    }

    /// `Trailer` names no field door drops from the trailer section: such names are taken out,
    /// a field naming only them goes, and one naming none of them is kept byte for byte.
    #[test]
    fn trailer_names_no_field_door_drops_from_the_trailers() {
        let upstream = Upstream::parse("http://127.0.0.1:3000").unwrap();
        let announced = |pairs: &[(&str, &str)]| {
            let mut req = Request::builder()
                .uri("/p")
                .body(http_body_util::Empty::<Bytes>::new())
                .unwrap();
            *req.headers_mut() = headers(pairs);
            let req = prepare(req, &upstream, &origin("192.0.2.1", false));
            req.headers()
                .get_all(TRAILER)
                .iter()
                .map(|v| v.to_str().unwrap().to_owned())
                .collect::<Vec<_>>()
        };
        assert_eq!(
            announced(&[("trailer", "x-sum, X-Forwarded-For ,cookie,\tdigest")]),
            ["x-sum, digest"]
        );
        assert_eq!(
            announced(&[("trailer", "x-sum"), ("trailer", "X_Real_IP, host")]),
            ["x-sum"]
        );
        assert_eq!(
            announced(&[("trailer", "a,,b , cookie"), ("trailer", "x-sum,,digest")]),
            ["a, b", "x-sum,,digest"]
        );
        assert!(announced(&[("trailer", "forwarded, Authorization, content-length")]).is_empty());
        assert_eq!(
            announced(&[("trailer", "X-Sum ,Digest")]),
            ["X-Sum ,Digest"]
        );
    }

    #[test]
    fn untrusted_peers_cannot_inject_forwarding_headers() {
        let mut h = headers(&[
            ("x-forwarded-for", "203.0.113.66"),
            ("x-forwarded-for", "198.51.100.1"),
            ("forwarded", "for=203.0.113.66"),
            ("x-forwarded-proto", "https"),
        ]);
        rewrite_forwarding(&mut h, &origin("192.0.2.7", false));
        assert_eq!(
            h.get_all("x-forwarded-for").iter().collect::<Vec<_>>(),
            ["192.0.2.7"]
        );
        assert_eq!(h["forwarded"], "for=192.0.2.7");
        assert_eq!(h["x-forwarded-proto"], "http");
    }

    #[test]
    fn untrusted_peer_without_headers_gets_only_xff() {
        let mut h = HeaderMap::new();
        rewrite_forwarding(&mut h, &origin("2001:db8::7", false));
        assert_eq!(h["x-forwarded-for"], "2001:db8::7");
        assert!(h.get("forwarded").is_none());
    }

    #[test]
    fn trusted_proxies_get_the_peer_appended_to_every_line() {
        let mut h = headers(&[
            ("x-forwarded-for", "203.0.113.9"),
            ("x-forwarded-for", "198.51.100.3"),
            ("forwarded", "for=203.0.113.9;proto=https"),
        ]);
        rewrite_forwarding(&mut h, &origin("2001:db8::10", true));
        assert_eq!(
            h["x-forwarded-for"],
            "203.0.113.9, 198.51.100.3, 2001:db8::10"
        );
        assert_eq!(
            h["forwarded"],
            "for=203.0.113.9;proto=https, for=\"[2001:db8::10]\""
        );
        let mut h = HeaderMap::new();
        rewrite_forwarding(&mut h, &origin("192.0.2.10", true));
        assert_eq!(h["x-forwarded-for"], "192.0.2.10");
    }

    #[test]
    fn connection_cannot_remove_host_the_forwarding_chain_or_a_credential() {
        let mut h = headers(&[
            (
                "connection",
                "host, x-forwarded-for, forwarded, authorization, Cookie, x-other",
            ),
            ("host", "door.test"),
            ("x-forwarded-for", "203.0.113.9"),
            ("authorization", "Bearer t"),
            ("cookie", "sid=s"),
            ("x-other", "1"),
        ]);
        strip_hop_by_hop(&mut h);
        assert_eq!(h["host"], "door.test");
        assert_eq!(h["x-forwarded-for"], "203.0.113.9");
        assert_eq!(h["authorization"], "Bearer t");
        assert_eq!(h["cookie"], "sid=s");
        assert!(h.get("x-other").is_none());
    }

    /// A trusted proxy's `Forwarded` chain gets door's element appended; the part of it the
    /// client key cannot read (from the first malformed element leftwards) is replaced by
    /// `for=unknown`, so that the application reads the chain as door did and a malformed element
    /// cannot swallow door's.
    #[test]
    fn a_forwarded_chain_is_passed_on_as_far_as_the_client_key_reads_it() {
        let proxy = origin("192.0.2.10", true);
        for (sent, upstream) in [
            (
                &[r#"for="[2001:db8::1]:80", for=198.51.100.9;proto=https;by=203.0.113.1"#][..],
                r#"for="[2001:db8::1]:80", for=198.51.100.9;proto=https;by=203.0.113.1, for=192.0.2.10"#,
            ),
            (&[r#"for="198.51.100.66"#], "for=unknown, for=192.0.2.10"),
            (&[r#"for="a\"#], "for=unknown, for=192.0.2.10"),
            (
                &[r#"for="a\"b", for=198.51.100.9"#],
                "for=unknown, for=198.51.100.9, for=192.0.2.10",
            ),
            (
                &[r#"for="a\", for=198.51.100.9"#],
                "for=unknown, for=198.51.100.9, for=192.0.2.10",
            ),
            (
                &[r#"for=a"b, for=198.51.100.9"#],
                "for=unknown, for=198.51.100.9, for=192.0.2.10",
            ),
            (
                &[r#"for="x"#, "for=198.51.100.9"],
                "for=unknown, for=198.51.100.9, for=192.0.2.10",
            ),
            (
                &["for=198.51.100.9, by=203.0.113.1", "for=203.0.113.7"],
                "for=unknown, for=203.0.113.7, for=192.0.2.10",
            ),
        ] {
            let lines: Vec<(&str, &str)> = sent.iter().map(|l| ("forwarded", *l)).collect();
            let mut h = headers(&lines);
            rewrite_forwarding(&mut h, &proxy);
            assert_eq!(h["forwarded"], upstream, "{sent:?}");
        }
        // An untrusted peer's chain is replaced whole, malformed or not.
        let mut h = headers(&[("forwarded", r#"for="198.51.100.66"#)]);
        rewrite_forwarding(&mut h, &origin("192.0.2.7", false));
        assert_eq!(h["forwarded"], "for=192.0.2.7");
    }

    /// A request's trailers lose the fields door reads or rewrites in the header section,
    /// whoever sent them; other fields pass.
    #[test]
    fn request_trailers_lose_forwarding_identity_framing_and_credential_fields() {
        let mut t = headers(&[
            ("x-forwarded-for", "198.51.100.66"),
            ("forwarded", "for=198.51.100.66"),
            ("x-forwarded-proto", "https"),
            ("x-real-ip", "198.51.100.66"),
            ("client_ip", "198.51.100.66"),
            ("host", "evil.example"),
            ("cookie", "sid=made-up"),
            ("authorization", "Bearer made-up"),
            ("content-length", "5"),
            ("trailer", "x-sum"),
            ("connection", "close"),
            ("x-http-method-override", "DELETE"),
            ("x_method_override", "DELETE"),
            ("x-sum", "42"),
            (
                "digest",
                "sha-256=X48E9qOokqqrvdts8nOJRJN3OWDUoyWxBf7kbu9DBPE=",
            ),
        ]);
        strip_request_trailers(&mut t);
        let mut left: Vec<&str> = t.keys().map(HeaderName::as_str).collect();
        left.sort_unstable();
        assert_eq!(left, ["digest", "x-sum"]);
    }

    #[test]
    fn identity_fields_from_untrusted_peers_are_dropped_and_chains_kept_byte_for_byte() {
        let sent = [
            ("x-real-ip", "6.6.6.6"),
            ("true-client-ip", "6.6.6.6"),
            ("x-client-ip", "6.6.6.6"),
            ("x-cluster-client-ip", "6.6.6.6"),
            ("cf-connecting-ip", "6.6.6.6"),
            ("fastly-client-ip", "6.6.6.6"),
            ("client-ip", "6.6.6.6"),
            ("x-originating-ip", "6.6.6.6"),
            ("x-original-forwarded-for", "6.6.6.6"),
            ("x-forwarded-host", "evil"),
            ("x-forwarded-server", "evil"),
            ("x-forwarded-port", "443"),
            ("x-forwarded-ssl", "on"),
            ("x-forwarded-scheme", "https"),
            ("x-url-scheme", "https"),
            ("front-end-https", "on"),
            ("x-forwarded-prefix", "/admin"),
            ("x-scheme", "https"),
            ("x-forwarded-protocol", "https"),
            ("x-forwarded-uri", "/admin"),
            ("x-original-url", "/admin"),
            ("x-rewrite-url", "/admin"),
            ("x-original-host", "evil"),
            ("x-host", "evil"),
            ("forwarded-for", "6.6.6.6"),
            ("x-forwarded", "for=6.6.6.6"),
            ("x-envoy-external-address", "6.6.6.6"),
            ("fly-client-ip", "6.6.6.6"),
            ("x-appengine-user-ip", "6.6.6.6"),
            ("x-azure-clientip", "6.6.6.6"),
            ("x-azure-socketip", "6.6.6.6"),
            ("x-proxyuser-ip", "6.6.6.6"),
            ("x_forwarded_for", "6.6.6.6"),
            ("x_forwarded_proto", "https"),
            ("client_ip", "6.6.6.6"),
            ("x-forwarded_ssl", "on"),
        ];
        let mut h = headers(&sent);
        rewrite_forwarding(&mut h, &origin("192.0.2.7", false));
        for (name, _) in sent {
            assert!(h.get(name).is_none(), "{name} reached the upstream");
        }
        assert_eq!(
            h["x-forwarded-proto"], "http",
            "door says the scheme itself"
        );
        let mut h = headers(&[("x_request_id", "7"), ("x_forwarded_for", "6.6.6.6")]);
        rewrite_forwarding(&mut h, &origin("192.0.2.7", false));
        assert_eq!(h["x_request_id"], "7", "other underscore fields pass");
        assert!(h.get("x_forwarded_for").is_none());
        let mut h = HeaderMap::new();
        h.append(
            "x-forwarded-for",
            HeaderValue::from_bytes(b"1.2.3.4\xff, 203.0.113.9").unwrap(),
        );
        h.append("x-real-ip", HeaderValue::from_static("203.0.113.9"));
        rewrite_forwarding(&mut h, &origin("192.0.2.10", true));
        assert_eq!(
            h["x-forwarded-for"].as_bytes(),
            b"1.2.3.4\xff, 203.0.113.9, 192.0.2.10"
        );
        assert_eq!(
            h["x-real-ip"], "203.0.113.9",
            "a trusted proxy's fields are kept"
        );
    }

    #[test]
    fn a_message_without_hop_by_hop_fields_keeps_every_field() {
        let mut h = headers(&[("host", "door.test"), ("x-kept", "1"), ("x-kept", "2")]);
        strip_hop_by_hop(&mut h);
        assert_eq!(h.len(), 3, "{h:?}");
        let mut h = headers(&[("keep-alive", "timeout=5"), ("x-kept", "1")]);
        strip_hop_by_hop(&mut h);
        assert_eq!(h.len(), 1, "{h:?}");
        assert!(
            h.get("keep-alive").is_none(),
            "found without a Connection field"
        );
    }

    #[test]
    fn every_connection_line_counts_and_may_name_hop_by_hop_fields() {
        let mut h = headers(&[
            ("connection", "x-one"),
            ("connection", "Connection, TE, x-two"),
            ("te", "trailers"),
            ("x-one", "1"),
            ("x-two", "2"),
            ("x-kept", "yes"),
        ]);
        strip_hop_by_hop(&mut h);
        assert_eq!(h.len(), 1, "{h:?}");
        assert_eq!(h["x-kept"], "yes");
    }

    #[test]
    fn hop_by_hop_headers_are_removed() {
        let mut h = headers(&[
            ("connection", "keep-alive, x-secret"),
            ("x-secret", "1"),
            ("keep-alive", "timeout=5"),
            ("te", "trailers"),
            ("upgrade", "h2c"),
            ("transfer-encoding", "chunked"),
            ("x-kept", "yes"),
        ]);
        strip_hop_by_hop(&mut h);
        assert_eq!(h.len(), 1, "{h:?}");
        assert_eq!(h["x-kept"], "yes");
    }

    #[test]
    fn options_are_matched_without_regard_to_case_and_absent_ones_change_nothing() {
        let long = format!("X-{}", "Long-Field-Name".repeat(6));
        let options = format!(" Keep-Alive ,close,, X-Secret, x-absent, bad name, HOST, {long}");
        let lower = long.to_ascii_lowercase();
        let mut h = headers(&[
            ("connection", &options),
            ("keep-alive", "timeout=5"),
            ("x-secret", "1"),
            ("close", "a field named by an option"),
            (&lower, "a name longer than 64 bytes"),
            ("host", "app.example"),
            ("x-kept", "yes"),
        ]);
        strip_hop_by_hop(&mut h);
        assert_eq!(h.len(), 2, "{h:?}");
        assert_eq!(h["x-kept"], "yes");
        assert_eq!(h["host"], "app.example", "Host is never removed");
    }

    #[test]
    fn an_option_that_is_not_a_field_name_spares_none_of_the_others() {
        let mut h = HeaderMap::new();
        h.append(
            CONNECTION,
            HeaderValue::from_bytes(b"x-one, caf\xc3\xa9, x-two").unwrap(),
        );
        h.append("x-one", HeaderValue::from_static("1"));
        h.append("x-two", HeaderValue::from_static("2"));
        h.append("x-kept", HeaderValue::from_static("yes"));
        strip_hop_by_hop(&mut h);
        assert_eq!(h.len(), 1, "{h:?}");
        assert_eq!(h["x-kept"], "yes");
    }

    /// The model's own lists, written out from RFC 9110 §7.6.1 (and the legacy `Keep-Alive`
    /// and `Proxy-Connection`), and the fields door never lets an option remove.
    const MODEL_HOP_BY_HOP: [&str; 8] = [
        "connection",
        "keep-alive",
        "proxy-connection",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "transfer-encoding",
        "upgrade",
    ];
    const MODEL_PROTECTED: [&str; 6] = [
        "host",
        "x-forwarded-for",
        "forwarded",
        "x-forwarded-proto",
        "authorization",
        "cookie",
    ];
    /// Other names: an option that is no field (`close`), ordinary fields, one past 64 bytes.
    const OTHERS: [&str; 5] = [
        "close",
        "x-a",
        "x-b",
        "cookie",
        "x-long-field-name-x-long-field-name-x-long-field-name-x-long-field-name",
    ];

    /// A field name the generated messages use: hop-by-hop, protected, or another.
    fn name() -> impl Strategy<Value = &'static str> {
        prop_oneof![
            prop::sample::select(&MODEL_HOP_BY_HOP[..]),
            prop::sample::select(&MODEL_PROTECTED[..]),
            prop::sample::select(&OTHERS[..]),
        ]
    }

    /// One `Connection` option as a client might spell it: a name in any case, padded with
    /// spaces, tabs or a no-break space, or something that is no field name at all.
    fn option() -> impl Strategy<Value = Vec<u8>> {
        prop_oneof![
            (name(), any::<bool>(), 0..5usize, 0..5usize).prop_map(|(name, upper, left, right)| {
                let name = if upper {
                    name.to_ascii_uppercase()
                } else {
                    name.to_owned()
                };
                let pads = [&b""[..], b" ", b"\t", b" \t  ", "\u{a0}".as_bytes()];
                let pad = |i: usize| pads.get(i).copied().unwrap_or_default();
                [pad(left), name.as_bytes(), pad(right)].concat()
            }),
            Just(b"".to_vec()),
            Just(b"bad name".to_vec()),
            Just(b"caf\xc3\xa9".to_vec()),
            Just(b"\xff".to_vec()),
        ]
    }

    /// A message's fields: names from [`name`], `Connection` lines of generated options.
    fn fields() -> impl Strategy<Value = Vec<(String, Vec<u8>)>> {
        let field = prop_oneof![
            name().prop_map(|name| (name.to_owned(), b"v".to_vec())),
            prop::collection::vec(option(), 1..5)
                .prop_map(|options| ("connection".to_owned(), options.join(&b","[..]))),
        ];
        prop::collection::vec(field, 0..12)
    }

    proptest::proptest! {
        /// What remains is exactly the fields that are not hop-by-hop and not named by a
        /// `Connection` option (unless protected), each with all its lines in order.
        #[test]
        fn removes_exactly_the_hop_by_hop_fields(fields in fields()) {
            let mut h = HeaderMap::new();
            for (name, value) in &fields {
                if let (Ok(n), Ok(v)) = (HeaderName::from_bytes(name.as_bytes()), HeaderValue::from_bytes(value)) {
                    h.append(n, v);
                }
            }
            let named: Vec<HeaderName> = fields
                .iter()
                .filter(|(name, _)| name == "connection")
                .flat_map(|(_, value)| value.split(|&b| b == b','))
                .map(<[u8]>::trim_ascii)
                .filter_map(|option| HeaderName::from_bytes(option).ok())
                .collect();
            let kept = |name: &HeaderName| {
                !MODEL_HOP_BY_HOP.contains(&name.as_str())
                    && (!named.contains(name) || MODEL_PROTECTED.contains(&name.as_str()))
            };
            // Per name, its lines in order (a removal may reorder the names in the map).
            let lines = |h: &HeaderMap| -> std::collections::BTreeMap<String, Vec<HeaderValue>> {
                h.keys()
                    .map(|n| (n.as_str().to_owned(), h.get_all(n).iter().cloned().collect()))
                    .collect()
            };
            let mut want = lines(&h);
            want.retain(|name, _| HeaderName::from_bytes(name.as_bytes()).is_ok_and(|n| kept(&n)));
            strip_hop_by_hop(&mut h);
            prop_assert_eq!(lines(&h), want);
        }
    }
}
