//! The response body door streams to the client: an upstream body passed through frame by frame
//! (never buffered, so an upstream's flush reaches the client at once), or door's own small body.
//! It carries the request's limiter permit until the body has been sent (or a send deadline
//! passes) and the request's in-flight count until it ends, or is ended.

use std::{
    pin::Pin,
    sync::{
        Arc, Mutex, MutexGuard, PoisonError,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    task::{Context, Poll, Waker},
    time::Duration,
};

use bytes::{Buf, Bytes};
use http::StatusCode;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;

use crate::{
    http::{
        inflight::{ActiveGuard, PassSlot},
        settle::{End, Held},
        upstream::strip_response_trailers,
    },
    obs::metrics::StreamOpen,
};

/// The response body: an upstream body streamed through frame by frame (never buffered, so an
/// upstream's flush reaches the client at once), or door's own small body. It settles the
/// request's limiter permit when the body ends, fails or is dropped (client gone), and counts
/// the request as in flight until then.
///
/// A body that has not ended at its first poll and has a rule to keep (a stream's idle timeout,
/// a limited response's send deadline, a pass-through response's send timeout: every upstream
/// body has one) is *watched*: its upstream body moves into a watch that a task of its own
/// shares, and the parts it gives hyper count the bytes hyper sends ([`Part`]). hyper stops polling a body its client does not take (HTTP/1.1
/// with a full send buffer, HTTP/2 with a shut window), so a timer inside the body alone would
/// never fire; the task settles the permit on time and, when the rule says so, ends the exchange:
/// the upstream's answer is dropped at once (its connection closed, the application's handler
/// freed), and the client's stream is reset, or its connection closed, when hyper next polls the
/// body. A response whose whole body comes with its first poll (most small ones) never pays for
/// the task.
#[derive(Debug)]
pub struct ResponseBody {
    kind: Kind,
    /// The request's permit and its status, until the body ends or is watched.
    permit: Option<(Held, StatusCode)>,
    /// The rule a watch keeps, once the body has not ended at a poll; `None` for door's own
    /// bodies, and once the watch has it.
    rule: Option<Rule>,
    /// The watch's task, once there is one: stopped when the body ends first.
    watcher: Option<tokio::task::JoinHandle<()>>,
    pub(crate) active: Option<ActiveGuard>,
    /// A pass-through request's `upstream_max_inflight` slot (in the watch once there is one).
    pub(crate) passthrough: Option<PassSlot>,
    /// A stream's place in `door.streams`, while it is open (in the watch once there is one).
    stream: Option<StreamOpen>,
}

/// Why door ended a response body early.
#[derive(Debug, thiserror::Error)]
pub enum ResponseBodyError {
    /// The upstream's body failed mid-way.
    #[error(transparent)]
    Upstream(#[from] hyper::Error),
    /// A stream sent nothing for `stream_idle_timeout`.
    #[error("the stream was idle for {0:?}")]
    Idle(Duration),
    /// A limited response moved no frame to its client for its group's `read_timeout` after the
    /// send deadline (as long).
    #[error("the response moved nothing for {0:?} after the send deadline")]
    Stalled(Duration),
    /// A response held to its end (pass-through) had a part waiting that its client took
    /// nothing of for `send_timeout`.
    #[error("the client took nothing of the response for {0:?}")]
    Unsent(Duration),
}

/// Why a watch ended an exchange early ([`Watch::end_if_still`]).
#[derive(Debug, Clone, Copy)]
enum Early {
    Idle(Duration),
    Stalled(Duration),
    Unsent(Duration),
}

impl From<Early> for ResponseBodyError {
    fn from(early: Early) -> Self {
        match early {
            Early::Idle(d) => Self::Idle(d),
            Early::Stalled(d) => Self::Stalled(d),
            Early::Unsent(d) => Self::Unsent(d),
        }
    }
}

/// What a watched body's task keeps.
#[derive(Debug, Clone, Copy)]
enum Rule {
    /// A stream's: ended once no frame has gone to the client for this long (the upstream
    /// silent, or the client not reading), its permit settled then.
    Idle(Duration),
    /// A limited response's: its permit settled at `at` (the send deadline, the group's
    /// `read_timeout` after the head), and after it the exchange ended once no frame has gone
    /// to the client for `stall` (as nginx's `send_timeout` and `proxy_read_timeout` end one
    /// that stops moving: a slow reader keeps its response; one that stopped reading does not
    /// keep the upstream's).
    Deadline {
        at: tokio::time::Instant,
        stall: Duration,
    },
    /// A pass-through response's (one with no permit, or a request plane's only, held to its end):
    /// ended once its client has taken nothing for this long while door holds a part for it,
    /// as nginx's `send_timeout` closes such a connection. An upstream that is silent (door
    /// waits on it, not on the client) keeps it: a long poll is not a stalled client.
    Send(Duration),
}

/// A watched body's state, shared by the body and its task ([`ResponseBody`]).
#[derive(Debug)]
struct Watch {
    state: Mutex<WatchState>,
    /// Whether the upstream's body has ended, as it said after the last frame it gave: read by
    /// [`Watch::is_end_stream`] (after every frame, by door and by hyper) without the lock.
    at_end: AtomicBool,
    /// Bytes of the body sent to the client so far, counted by its [`Part`]s as hyper sends
    /// them: this response's own, where its connection's writes would count other streams' and
    /// the answers to the client's PINGs too.
    sent: AtomicU64,
}

#[derive(Debug)]
struct WatchState {
    /// The upstream body; `None` once the task ended the exchange (`ended` says why).
    body: Option<Incoming>,
    ended: Option<Early>,
    /// When the body last gave hyper a frame (or was watched); moved on by the task too, when
    /// it finds bytes sent or door waiting on the upstream, and at the send deadline.
    last: tokio::time::Instant,
    /// Whether the body's last poll found no frame: door waits on the upstream, not on the
    /// client (hyper polls again once a frame is written, unless its client takes nothing).
    waiting: bool,
    /// Who polled the body last, woken when the task ends the exchange.
    waker: Option<Waker>,
    permit: Option<(Held, StatusCode)>,
    open: Option<StreamOpen>,
    /// A pass-through request's `upstream_max_inflight` slot: let go with the upstream's body
    /// (the request body may still hold a share of it: [`PassSlot`]), given back at once when
    /// the watch ends the exchange.
    passthrough: Option<PassSlot>,
    /// The request's count on its connection: freed with the upstream's body too, so that a
    /// connection whose client stopped reading is closed once idle (`idle_timeout`, the header
    /// read timeout on HTTP/1.1) with nothing else in flight, where hyper would hold it until
    /// the client read again.
    active: Option<ActiveGuard>,
}

impl Watch {
    fn lock(&self) -> MutexGuard<'_, WatchState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn poll_frame(
        &self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, ResponseBodyError>>> {
        let mut s = self.lock();
        let Some(body) = s.body.as_mut() else {
            return Poll::Ready(s.ended.map(|early| Err(early.into())));
        };
        match Pin::new(&mut *body).poll_frame(cx) {
            Poll::Ready(frame) => {
                self.at_end.store(body.is_end_stream(), Ordering::Relaxed);
                s.last = crate::time::now();
                s.waiting = false;
                Poll::Ready(frame.map(|r| r.map_err(ResponseBodyError::from)))
            }
            Poll::Pending => {
                s.waiting = true;
                if !s.waker.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                    s.waker = Some(cx.waker().clone());
                }
                Poll::Pending
            }
        }
    }

    /// Whether the upstream's body has ended; not one the watch ended, which ends in an error
    /// (hyper would otherwise end the response as if it were whole).
    fn is_end_stream(&self) -> bool {
        self.at_end.load(Ordering::Relaxed)
    }

    fn size_hint(&self) -> SizeHint {
        self.lock()
            .body
            .as_ref()
            .map_or_else(SizeHint::default, Body::size_hint)
    }

    /// Settles the permit, if it is still held.
    fn settle(&self) {
        let permit = self.lock().permit.take();
        if let Some((permit, status)) = permit {
            permit.settle(End::Answered(status));
        }
    }

    /// Ends the exchange for `why` unless a frame went to the client within `still` (or, for
    /// [`Early::Unsent`], door is waiting on the upstream): the upstream's body, the stream's
    /// place and the pass-through slot dropped, the permit settled, and whoever polled the body
    /// woken to find it ended. Whether it ended.
    fn end_if_still(&self, still: Duration, why: Early) -> bool {
        let (body, open, passthrough, active, waker) = {
            let mut s = self.lock();
            // Checked again under the lock that takes the body: a frame taken since the task
            // looked keeps the response.
            if crate::time::now() < s.last + still || waits_on_upstream(&s, why) {
                return false;
            }
            s.ended = Some(why);
            (
                s.body.take(),
                s.open.take(),
                s.passthrough.take(),
                s.active.take(),
                s.waker.take(),
            )
        };
        drop((body, open, active));
        // Given back now, though the request body may still hold a share in its upstream
        // connection: the exchange is over.
        if let Some(slot) = passthrough {
            slot.ended();
        }
        tracing::debug!(why = %ResponseBodyError::from(why), "ended a response upstream");
        self.settle();
        if let Some(waker) = waker {
            waker.wake();
        }
        true
    }

    /// Ends the exchange for `why` once it has not moved for `still`: no frame taken from the
    /// upstream and, but for a stream's idle timeout, no byte of it sent to the client (for
    /// [`Early::Unsent`], while door was not waiting on the upstream either). The bytes sent,
    /// and whether door waits on the upstream, are looked at every eighth of `still` (they move
    /// no timer of their own), so a response is ended between `still` and 1.125 × `still` after
    /// its last byte sent. A stream's idle timeout counts frames only: it ends a stream `still`
    /// after its last event, whether the upstream fell silent or the client stopped reading.
    async fn end_when_still(&self, still: Duration, why: Early) {
        let bytes = !matches!(why, Early::Idle(_));
        let sent = || bytes.then(|| self.sent.load(Ordering::Relaxed));
        let look = if bytes { still / 8 } else { still };
        let mut seen = sent();
        loop {
            let now = crate::time::now();
            let sent = sent();
            let due = {
                let mut s = self.lock();
                if sent != seen || waits_on_upstream(&s, why) {
                    seen = sent;
                    s.last = s.last.max(now);
                }
                s.last + still
            };
            if now < due {
                tokio::time::sleep_until(due.min(now + look)).await;
                continue;
            }
            if self.end_if_still(still, why) {
                return;
            }
        }
    }

    /// The watch's task: keeps `rule` until the exchange ends, or the body (which aborts this
    /// task when it ends first) no longer needs it.
    async fn keep(self: Arc<Self>, rule: Rule) {
        match rule {
            Rule::Idle(idle) => self.end_when_still(idle, Early::Idle(idle)).await,
            Rule::Send(stall) => self.end_when_still(stall, Early::Unsent(stall)).await,
            Rule::Deadline { at, stall } => {
                tokio::time::sleep_until(at).await;
                self.settle();
                // Still from the deadline on: a response the upstream paused since its head
                // has `stall` more.
                {
                    let mut s = self.lock();
                    s.last = s.last.max(at);
                }
                self.end_when_still(stall, Early::Stalled(stall)).await;
            }
        }
    }
}

/// Whether `why` spares a response because door waits on its upstream, not on its client: only a
/// send timeout does ([`Rule::Send`]); an idle stream and a limited response the upstream
/// paused are ended all the same.
fn waits_on_upstream(s: &WatchState, why: Early) -> bool {
    matches!(why, Early::Unsent(_)) && s.waiting
}

#[derive(Debug)]
enum Kind {
    Upstream(Incoming),
    Watched(Arc<Watch>),
    Full(Option<Bytes>),
}

impl ResponseBody {
    fn new(kind: Kind, permit: Option<(Held, StatusCode)>, rule: Option<Rule>) -> Self {
        Self {
            kind,
            permit,
            rule,
            watcher: None,
            active: None,
            passthrough: None,
            stream: None,
        }
    }

    /// An upstream body on a route without a permit, ended if its client takes nothing of a part
    /// door holds for `send_timeout` ([`Rule::Send`]).
    pub(crate) fn upstream(body: Incoming, send_timeout: Duration) -> Self {
        Self::new(Kind::Upstream(body), None, Some(Rule::Send(send_timeout)))
    }

    /// A stream's body (server-sent events, a `stream = true` route): holds `permit` until the
    /// stream ends (no send deadline), counted in `door.streams` by `open`, and ended by door once
    /// no frame came for `idle`.
    pub(crate) fn stream(
        body: Incoming,
        permit: Option<(Held, StatusCode)>,
        idle: Duration,
        open: Option<StreamOpen>,
    ) -> Self {
        let mut stream = Self::new(Kind::Upstream(body), permit, Some(Rule::Idle(idle)));
        stream.stream = open;
        stream
    }

    /// An empty body (a `101`'s, an extended CONNECT's `200`).
    pub(crate) fn empty() -> Self {
        Self::new(Kind::Full(None), None, None)
    }

    /// An upstream body whose request holds `permit` until the body is sent, at most `deadline`
    /// when one is given (and then ended if its client stops taking it for as long again);
    /// without one, held to its end, and ended if its client takes nothing of a part door holds
    /// for `send_timeout`.
    pub(crate) fn settling(
        body: Incoming,
        permit: Held,
        status: StatusCode,
        deadline: Option<Duration>,
        send_timeout: Duration,
    ) -> Self {
        let rule = deadline.map_or(Rule::Send(send_timeout), |d| Rule::Deadline {
            at: crate::time::now() + d,
            stall: d,
        });
        Self::new(Kind::Upstream(body), Some((permit, status)), Some(rule))
    }

    /// door's own body of `bytes`.
    pub(crate) fn full(bytes: Bytes) -> Self {
        Self::new(Kind::Full(Some(bytes)), None, None)
    }

    /// The body has not ended at this poll, which found no frame when `waiting`: with a rule to
    /// keep, its upstream body moves into a watch and the watch's task starts (once).
    fn watch(&mut self, waiting: bool) {
        let Some(rule) = self.rule.take() else {
            return;
        };
        let Kind::Upstream(_) = &self.kind else {
            return;
        };
        let Kind::Upstream(body) = core::mem::replace(&mut self.kind, Kind::Full(None)) else {
            return;
        };
        let watch = Arc::new(Watch {
            state: Mutex::new(WatchState {
                body: Some(body),
                ended: None,
                last: crate::time::now(),
                waiting,
                waker: None,
                permit: self.permit.take(),
                open: self.stream.take(),
                passthrough: self.passthrough.take(),
                active: self.active.take(),
            }),
            at_end: AtomicBool::new(false),
            sent: AtomicU64::new(0),
        });
        self.watcher = Some(tokio::spawn(Arc::clone(&watch).keep(rule)));
        self.kind = Kind::Watched(watch);
    }

    fn finish(&mut self) {
        if let Some(watcher) = self.watcher.take() {
            watcher.abort();
        }
        if let Kind::Watched(watch) = &self.kind {
            watch.settle();
            let held = {
                let mut s = watch.lock();
                (s.open.take(), s.passthrough.take(), s.active.take())
            };
            drop(held);
        }
        if let Some((permit, status)) = self.permit.take() {
            permit.settle(End::Answered(status));
        }
        self.active = None;
        self.passthrough = None;
        self.stream = None;
    }
}

impl Body for ResponseBody {
    type Data = Part;
    type Error = ResponseBodyError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Part>, ResponseBodyError>>> {
        let this = &mut *self;
        let mut poll = match &mut this.kind {
            Kind::Upstream(b) => Pin::new(b)
                .poll_frame(cx)
                .map(|f| f.map(|r| r.map_err(ResponseBodyError::from))),
            Kind::Watched(watch) => watch.poll_frame(cx),
            Kind::Full(b) => Poll::Ready(b.take().map(|b| Ok(Frame::data(b)))),
        };
        if let Poll::Ready(Some(Ok(frame))) = &mut poll
            && let Some(trailers) = frame.trailers_mut()
        {
            strip_response_trailers(trailers);
        }
        match &poll {
            Poll::Ready(None | Some(Err(_))) => this.finish(),
            Poll::Ready(Some(Ok(_))) if this.is_end_stream() => this.finish(),
            // Not over at this poll: the send deadline, a stream's idle timeout or the send
            // timeout must be able to fire without us.
            _ => this.watch(poll.is_pending()),
        }
        let watch = match &this.kind {
            Kind::Watched(watch) => Some(watch),
            Kind::Upstream(_) | Kind::Full(_) => None,
        };
        poll.map(|f| {
            f.map(|r| {
                r.map(|frame| {
                    frame.map_data(|bytes| Part {
                        bytes,
                        watch: watch.map(Arc::clone),
                    })
                })
            })
        })
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Upstream(b) => b.is_end_stream(),
            Kind::Watched(watch) => watch.is_end_stream(),
            Kind::Full(b) => b.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Upstream(b) => b.size_hint(),
            Kind::Watched(watch) => watch.size_hint(),
            Kind::Full(Some(b)) => SizeHint::with_exact(b.len() as u64),
            Kind::Full(None) => SizeHint::with_exact(0),
        }
    }
}

/// A part of a response body as hyper sends it ([`ResponseBody`]'s data): its bytes and, for a
/// watched body, the watch, whose count of bytes sent it moves on as hyper sends them (HTTP/1.1:
/// as the socket takes them; HTTP/2: as hyper encodes this stream's DATA frames, which its
/// window allows), so that a response read slowly is told from one whose client stopped.
#[derive(Debug)]
pub struct Part {
    bytes: Bytes,
    watch: Option<Arc<Watch>>,
}

impl Part {
    /// Counts `n` bytes sent. Only the connection's task sends them, so a plain load and store
    /// (no locked instruction) keep the count exact.
    fn sent(&self, n: usize) {
        if let Some(watch) = &self.watch {
            let n = u64::try_from(n).unwrap_or(u64::MAX);
            let sent = &watch.sent;
            sent.store(
                sent.load(Ordering::Relaxed).wrapping_add(n),
                Ordering::Relaxed,
            );
        }
    }
}

impl Buf for Part {
    fn remaining(&self) -> usize {
        self.bytes.remaining()
    }

    fn chunk(&self) -> &[u8] {
        self.bytes.chunk()
    }

    fn advance(&mut self, cnt: usize) {
        self.bytes.advance(cnt);
        self.sent(cnt);
    }

    fn copy_to_bytes(&mut self, len: usize) -> Bytes {
        let out = self.bytes.copy_to_bytes(len);
        self.sent(len);
        out
    }
}

impl Drop for ResponseBody {
    fn drop(&mut self) {
        self.finish();
    }
}
