//! What door counts in flight on the request path: the caps on pass-through requests
//! (`upstream_max_inflight` door-wide, `upstream_max_inflight_per_client` per TCP peer), and the
//! requests door is answering, door-wide and per connection, which the SIGTERM drain waits for
//! (docs/design.md, "Operating contract"). Each count is held by an RAII guard that the
//! response body carries ([`crate::http::body`]), so it is given back however the request ends.

use std::{
    sync::{
        Arc,
        atomic::{AtomicU32, AtomicUsize, Ordering},
    },
    time::Duration,
};

use tokio::sync::Notify;

use crate::http::conn::ConnInfo;

/// The caps on pass-through requests (routes in no group) forwarded at once: door-wide
/// (`upstream_max_inflight`), so that an application behind door is never sent more than this
/// many of them together, however many connections clients open; and per TCP peer
/// (`upstream_max_inflight_per_client`), so that one client cannot hold them all (its requests'
/// bodies or its HTTP/2 window left open, for as long as it likes: pass-through requests have no
/// deadline).
#[derive(Debug)]
pub(crate) struct PassThrough {
    cap: u32,
    per_client: u32,
    open: AtomicU32,
}

/// Which pass-through cap refused a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PassRefusal {
    /// `upstream_max_inflight`: 503.
    Door,
    /// `upstream_max_inflight_per_client`: 429.
    Client,
}

/// Takes one of `count`'s `cap` places; whether there was one.
fn take_one(count: &AtomicU32, cap: u32) -> bool {
    count
        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
            (n < cap).then_some(n + 1)
        })
        .is_ok()
}

impl PassThrough {
    /// The caps `upstream_max_inflight` (`cap`) and `upstream_max_inflight_per_client`
    /// (`per_client`), nothing forwarded yet.
    pub(crate) fn new(cap: u32, per_client: u32) -> Self {
        Self {
            cap,
            per_client,
            open: AtomicU32::new(0),
        }
    }

    /// Pass-through requests forwarded now (≤ `cap`).
    pub(crate) fn open(&self) -> u32 {
        self.open.load(Ordering::Acquire)
    }

    /// A slot for a request of the peer whose in-flight count is `peer` (`None`: exempt), or the
    /// cap that refused it; a refused request holds nothing.
    pub(crate) fn take(
        self: &Arc<Self>,
        peer: Option<&Arc<AtomicU32>>,
    ) -> Result<PassSlot, PassRefusal> {
        if let Some(peer) = peer
            && !take_one(peer, self.per_client)
        {
            return Err(PassRefusal::Client);
        }
        if !take_one(&self.open, self.cap) {
            if let Some(peer) = peer {
                peer.fetch_sub(1, Ordering::AcqRel);
            }
            return Err(PassRefusal::Door);
        }
        Ok(PassSlot {
            door: Arc::clone(self),
            peer: peer.map(Arc::clone),
        })
    }
}

/// One pass-through request's place under both caps, held until its response body has been sent
/// or dropped.
#[derive(Debug)]
pub(crate) struct PassSlot {
    door: Arc<PassThrough>,
    peer: Option<Arc<AtomicU32>>,
}

impl Drop for PassSlot {
    fn drop(&mut self) {
        self.door.open.fetch_sub(1, Ordering::AcqRel);
        if let Some(peer) = &self.peer {
            peer.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

/// Requests door is answering, door-wide: the drain waits for this to reach zero.
#[derive(Debug, Default)]
pub(crate) struct Active {
    count: AtomicUsize,
    zero: Notify,
}

impl Active {
    /// Requests (and tunnels) counted now.
    pub(crate) fn count(&self) -> usize {
        self.count.load(Ordering::Acquire)
    }

    /// Waits until no request is counted, at most `grace`; `true` when none is left.
    pub(crate) async fn wait_idle(&self, grace: Duration) -> bool {
        let wait = async {
            loop {
                let zero = self.zero.notified();
                tokio::pin!(zero);
                zero.as_mut().enable();
                if self.count() == 0 {
                    return;
                }
                zero.await;
            }
        };
        tokio::time::timeout(grace, wait).await.is_ok()
    }
}

/// Counts one request on the door-wide and per-connection in-flight counts until dropped.
#[derive(Debug)]
pub(crate) struct ActiveGuard {
    active: Arc<Active>,
    conn: Arc<ConnInfo>,
}

impl ActiveGuard {
    /// Counts a request (or a tunnel) on `active` and on `conn`, which speaks HTTP/1.x when
    /// `http1`.
    pub(crate) fn new(active: &Arc<Active>, conn: &Arc<ConnInfo>, http1: bool) -> Self {
        active.count.fetch_add(1, Ordering::AcqRel);
        conn.request_started(http1);
        Self {
            active: Arc::clone(active),
            conn: Arc::clone(conn),
        }
    }
}

impl Drop for ActiveGuard {
    fn drop(&mut self) {
        self.conn.request_ended();
        if self.active.count.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.active.zero.notify_waiters();
        }
    }
}
