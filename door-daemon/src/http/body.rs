//! The response body door streams to the client: an upstream body passed through frame by frame
//! (never buffered, so an upstream's flush reaches the client at once), or door's own small body.
//! It carries the request's limiter permit until the body has been sent (or a send deadline
//! passes) and the request's in-flight count until it is dropped.

use std::{
    pin::Pin,
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicBool, Ordering},
    },
    task::{Context, Poll},
    time::Duration,
};

use bytes::Bytes;
use http::StatusCode;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use tokio::time::Sleep;

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
#[derive(Debug)]
pub struct ResponseBody {
    kind: Kind,
    permit: Option<HeldPermit>,
    pub(crate) active: Option<ActiveGuard>,
    /// A pass-through request's `upstream_max_inflight` slot.
    pub(crate) passthrough: Option<PassSlot>,
    /// A stream's place in `door.streams`, while it is open.
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
}

/// A limited request's permit while its response is sent: settled when the body ends or is
/// dropped, or by a timer at the send deadline, whichever comes first, so that a client reading
/// slowly (or an HTTP/2 client keeping its window shut) cannot hold a limiter slot for longer
/// than the deadline.
///
/// The timer is a task of its own (a body nobody polls cannot time itself out), but it is only
/// started once the body has not ended at its first poll: a response sent at once (most are) never
/// pays for a task.
#[derive(Debug)]
enum HeldPermit {
    /// Not armed yet: the permit, its status, and the instant its send deadline falls (`None` for
    /// a stream, which holds its slot until it ends).
    Waiting(Option<(Held, StatusCode)>, Option<tokio::time::Instant>),
    /// Armed: the timer task settles the permit at the deadline unless the body ends first.
    Armed {
        slot: Arc<Mutex<Option<(Held, StatusCode)>>>,
        timer: tokio::task::JoinHandle<()>,
    },
}

impl HeldPermit {
    fn new(permit: Held, status: StatusCode, deadline: Option<Duration>) -> Self {
        HeldPermit::Waiting(
            Some((permit, status)),
            deadline.map(|d| crate::time::now() + d),
        )
    }

    /// Starts a stream's idle timer, if it is not running yet: a task that settles the permit
    /// once no frame has gone to the client for `idle` since `last` (the time of the last one),
    /// and sets `expired`. hyper stops polling a body its client does not take (HTTP/1.1 with a
    /// full send buffer, HTTP/2 with a shut window), so the body's own timer alone would never
    /// fire and the stream would hold its slot for as long as the client likes.
    fn arm_idle(&mut self, idle: Duration, last: &Arc<StreamClock>) {
        if let HeldPermit::Waiting(held, None) = self {
            let slot = Arc::new(Mutex::new(held.take()));
            let for_timer = Arc::clone(&slot);
            let last = Arc::clone(last);
            let timer = tokio::spawn(async move {
                loop {
                    let due = last.last() + idle;
                    if crate::time::now() >= due {
                        break;
                    }
                    tokio::time::sleep_until(due).await;
                }
                last.expire();
                settle_held(&for_timer);
            });
            *self = HeldPermit::Armed { slot, timer };
        }
    }

    /// Starts the send deadline's timer, if there is one and it is not running yet.
    fn arm(&mut self) {
        if let HeldPermit::Waiting(held, Some(deadline)) = self {
            let slot = Arc::new(Mutex::new(held.take()));
            let for_timer = Arc::clone(&slot);
            let deadline = *deadline;
            let timer = tokio::spawn(async move {
                tokio::time::sleep_until(deadline).await;
                settle_held(&for_timer);
            });
            *self = HeldPermit::Armed { slot, timer };
        }
    }

    fn settle(&mut self) {
        match self {
            HeldPermit::Waiting(held, _) => {
                if let Some((permit, status)) = held.take() {
                    permit.settle(End::Answered(status));
                }
            }
            HeldPermit::Armed { slot, timer } => {
                timer.abort();
                settle_held(slot);
            }
        }
    }
}

fn settle_held(slot: &Mutex<Option<(Held, StatusCode)>>) {
    let taken = slot.lock().unwrap_or_else(PoisonError::into_inner).take();
    if let Some((permit, status)) = taken {
        permit.settle(End::Answered(status));
    }
}

/// When a stream last sent the client a frame, and whether its idle timer task ended it.
#[derive(Debug)]
struct StreamClock {
    last: Mutex<tokio::time::Instant>,
    expired: AtomicBool,
}

impl StreamClock {
    fn new() -> Self {
        Self {
            last: Mutex::new(crate::time::now()),
            expired: AtomicBool::new(false),
        }
    }

    fn last(&self) -> tokio::time::Instant {
        *self.last.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn sent(&self) {
        *self.last.lock().unwrap_or_else(PoisonError::into_inner) = crate::time::now();
    }

    fn expire(&self) {
        self.expired.store(true, Ordering::Release);
    }

    fn expired(&self) -> bool {
        self.expired.load(Ordering::Acquire)
    }
}

#[derive(Debug)]
enum Kind {
    Upstream(Incoming),
    /// A stream's body: ended by door after `idle` without a frame, by its own timer while hyper
    /// polls it, and by its permit's idle task ([`HeldPermit::arm_idle`]) when hyper does not.
    Stream {
        body: Incoming,
        idle: Duration,
        timer: Pin<Box<Sleep>>,
        clock: Arc<StreamClock>,
    },
    Full(Option<Bytes>),
}

impl ResponseBody {
    /// An upstream body on a route without a permit.
    pub(crate) fn upstream(body: Incoming) -> Self {
        Self {
            kind: Kind::Upstream(body),
            permit: None,
            active: None,
            passthrough: None,
            stream: None,
        }
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
        Self {
            kind: Kind::Stream {
                body,
                idle,
                timer: Box::pin(tokio::time::sleep(idle)),
                clock: Arc::new(StreamClock::new()),
            },
            permit: permit.map(|(p, status)| HeldPermit::new(p, status, None)),
            active: None,
            passthrough: None,
            stream: open,
        }
    }

    /// An empty body (a `101`'s, an extended CONNECT's `200`).
    pub(crate) fn empty() -> Self {
        Self {
            kind: Kind::Full(None),
            permit: None,
            active: None,
            passthrough: None,
            stream: None,
        }
    }

    /// An upstream body whose request holds `permit` until the body is sent, at most `deadline`
    /// when one is given.
    pub(crate) fn settling(
        body: Incoming,
        permit: Held,
        status: StatusCode,
        deadline: Option<Duration>,
    ) -> Self {
        Self {
            kind: Kind::Upstream(body),
            permit: Some(HeldPermit::new(permit, status, deadline)),
            active: None,
            passthrough: None,
            stream: None,
        }
    }

    /// door's own body of `bytes`.
    pub(crate) fn full(bytes: Bytes) -> Self {
        Self {
            kind: Kind::Full(Some(bytes)),
            permit: None,
            active: None,
            passthrough: None,
            stream: None,
        }
    }

    fn finish(&mut self) {
        if let Some(mut held) = self.permit.take() {
            held.settle();
        }
        self.active = None;
        self.passthrough = None;
        self.stream = None;
    }
}

impl Body for ResponseBody {
    type Data = Bytes;
    type Error = ResponseBodyError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, ResponseBodyError>>> {
        let this = &mut *self;
        let mut poll = match &mut this.kind {
            Kind::Upstream(b) => Pin::new(b)
                .poll_frame(cx)
                .map(|f| f.map(|r| r.map_err(ResponseBodyError::from))),
            // Ended by the idle task while hyper was not polling: closed at this poll.
            Kind::Stream { idle, clock, .. } if clock.expired() => {
                Poll::Ready(Some(Err(ResponseBodyError::Idle(*idle))))
            }
            Kind::Stream {
                body,
                idle,
                timer,
                clock,
            } => match Pin::new(body).poll_frame(cx) {
                Poll::Ready(frame) => {
                    timer.as_mut().reset(crate::time::now() + *idle);
                    clock.sent();
                    Poll::Ready(frame.map(|r| r.map_err(ResponseBodyError::from)))
                }
                Poll::Pending => match timer.as_mut().poll(cx) {
                    Poll::Ready(()) => Poll::Ready(Some(Err(ResponseBodyError::Idle(*idle)))),
                    Poll::Pending => Poll::Pending,
                },
            },
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
            // Not over at this poll: the send deadline, or a stream's idle timeout, must be able
            // to fire without us.
            _ => {
                if let Some(held) = &mut this.permit {
                    match &this.kind {
                        Kind::Stream { idle, clock, .. } => held.arm_idle(*idle, clock),
                        _ => held.arm(),
                    }
                }
            }
        }
        poll
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Upstream(b) | Kind::Stream { body: b, .. } => b.is_end_stream(),
            Kind::Full(b) => b.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Upstream(b) | Kind::Stream { body: b, .. } => b.size_hint(),
            Kind::Full(Some(b)) => SizeHint::with_exact(b.len() as u64),
            Kind::Full(None) => SizeHint::with_exact(0),
        }
    }
}

impl Drop for ResponseBody {
    fn drop(&mut self) {
        self.finish();
    }
}
