//! What door counts in flight on the request path: the caps on pass-through requests
//! (`upstream_max_inflight` door-wide, `upstream_max_inflight_per_client` per client: a TCP peer,
//! or a client a trusted proxy names), and the requests door is answering, door-wide and per
//! connection, which the SIGTERM drain waits for (docs/design.md, "Operating contract"). Each
//! count is held by an RAII guard that the response body carries ([`crate::http::body`]), and a
//! pass-through slot also by its request body while that is still being sent upstream
//! ([`PassSlot`]), so it is given back however the request ends.

use std::{
    collections::{HashMap, hash_map::Entry},
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering},
    },
    time::Duration,
};

use door_common::prefix::PrefixKey;
use tokio::sync::Notify;

use crate::{
    client::key::{KeyDecision, Rule},
    http::conn::ConnInfo,
};

/// The caps on pass-through requests (routes in no group) forwarded at once: door-wide
/// (`upstream_max_inflight`), so that an application behind door is never sent more than this
/// many of them together, however many connections clients open; and per client
/// (`upstream_max_inflight_per_client`), so that one client cannot hold them all (its requests'
/// bodies sent slowly: a pass-through body has no deadline for the whole, only
/// `body_read_timeout` for each part, and a response whose client reads slowly is ended only
/// once it takes nothing for `send_timeout`).
#[derive(Debug)]
pub(crate) struct PassThrough {
    cap: u32,
    per_client: u32,
    open: AtomicU32,
    /// Requests refused at `upstream_max_inflight` since door started.
    refused_door: AtomicU64,
    /// Requests refused at `upstream_max_inflight_per_client` since door started.
    refused_client: AtomicU64,
    /// The requests in flight of each client a trusted proxy named ([`Whose::Named`]): an entry
    /// only while its count is above zero, so at most `cap` entries (each holds a door-wide
    /// place, or is about to give its count back).
    named: Mutex<NamedCounts>,
}

/// The counts of [`PassThrough::named`], hashed as the limiter's table hashes its keys
/// (`foldhash` under a random key per map, which a client would have to learn to choose
/// addresses that collide; foldhash does not claim resistance to an attacker who can time many
/// lookups, and the map's size, at most `upstream_max_inflight` entries, bounds what collisions
/// could cost). A key costs a few instructions to hash where the standard library's SipHash took
/// about 250 a lookup.
type NamedCounts = HashMap<PrefixKey, u32, foldhash::fast::RandomState>;

/// Whose per-client count a pass-through request is held against.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Whose<'a> {
    /// The TCP peer's, shared by all its connections ([`ConnInfo::peer_inflight`]).
    Peer(&'a Arc<AtomicU32>),
    /// A client a trusted proxy named in its forwarding header (the client key), whose requests
    /// all come over the proxy's connections.
    Named(PrefixKey),
    /// Nobody's: a trusted proxy's own requests, which carry many clients, or a connection made
    /// outside the accept loop.
    Exempt,
}

impl<'a> Whose<'a> {
    /// Whose count a request is held against: its TCP peer's count `peer` (`None` for a
    /// trusted proxy, which is exempt); through a trusted proxy, the client its forwarding
    /// header names ([`Rule::FirstUntrustedEntry`]); a request that names none, or only trusted
    /// hops, or whose entry cannot be read (keyed as a trusted hop) is the proxy's own.
    pub(crate) fn of(peer: Option<&'a Arc<AtomicU32>>, decision: &KeyDecision) -> Self {
        match peer {
            Some(peer) => Self::Peer(peer),
            None if matches!(decision.rule, Rule::FirstUntrustedEntry { .. }) => {
                Self::Named(decision.key)
            }
            None => Self::Exempt,
        }
    }
}

/// Which pass-through cap refused a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PassRefusal {
    /// `upstream_max_inflight`: 503.
    Door,
    /// `upstream_max_inflight_per_client`: 429.
    Client,
}

impl PassRefusal {
    /// Both caps.
    pub(crate) const ALL: [Self; 2] = [Self::Door, Self::Client];

    /// The `door.reason` value it is counted under in `door.passthrough_refused`: the name of
    /// the cap.
    pub(crate) const fn reason(self) -> &'static str {
        match self {
            Self::Door => "upstream_max_inflight",
            Self::Client => "upstream_max_inflight_per_client",
        }
    }
}

/// What the pass-through caps hold now and have refused, for `GET /status` (`passthrough`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PassThroughStatus {
    /// `upstream_max_inflight`, requests.
    pub cap: u32,
    /// `upstream_max_inflight_per_client`, requests.
    pub per_client_cap: u32,
    /// Pass-through requests holding a slot now.
    pub inflight: u32,
    /// Clients a trusted proxy named with pass-through requests in flight now.
    pub named_clients: usize,
    /// Requests refused at `upstream_max_inflight` (503) since door started.
    pub refused_door: u64,
    /// Requests refused at `upstream_max_inflight_per_client` (429) since door started.
    pub refused_client: u64,
}

impl PassThroughStatus {
    /// The refusals per cap, each under its `door.reason` in `door.passthrough_refused`.
    pub fn refused(&self) -> [(&'static str, u64); 2] {
        PassRefusal::ALL.map(|why| {
            let n = match why {
                PassRefusal::Door => self.refused_door,
                PassRefusal::Client => self.refused_client,
            };
            (why.reason(), n)
        })
    }
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
            refused_door: AtomicU64::new(0),
            refused_client: AtomicU64::new(0),
            named: Mutex::new(NamedCounts::default()),
        }
    }

    /// Requests refused at the cap `why` since door started.
    pub(crate) fn refused(&self, why: PassRefusal) -> u64 {
        self.refusals(why).load(Ordering::Relaxed)
    }

    fn refusals(&self, why: PassRefusal) -> &AtomicU64 {
        match why {
            PassRefusal::Door => &self.refused_door,
            PassRefusal::Client => &self.refused_client,
        }
    }

    /// The caps, what they hold now and what they have refused.
    pub(crate) fn status(&self) -> PassThroughStatus {
        PassThroughStatus {
            cap: self.cap,
            per_client_cap: self.per_client,
            inflight: self.open(),
            named_clients: self.named_clients(),
            refused_door: self.refused(PassRefusal::Door),
            refused_client: self.refused(PassRefusal::Client),
        }
    }

    /// Pass-through requests forwarded now (≤ `cap`).
    pub(crate) fn open(&self) -> u32 {
        self.open.load(Ordering::Acquire)
    }

    /// Clients a trusted proxy named that have pass-through requests in flight now.
    pub(crate) fn named_clients(&self) -> usize {
        self.named_counts().len()
    }

    fn named_counts(&self) -> std::sync::MutexGuard<'_, NamedCounts> {
        // Nothing panics while the lock is held, but a poisoned lock must not take door down.
        self.named.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Takes one of the named client `key`'s places; whether there was one. One lookup.
    fn take_named(&self, key: PrefixKey) -> bool {
        let mut named = self.named_counts();
        match named.entry(key) {
            Entry::Occupied(mut held) if *held.get() < self.per_client => *held.get_mut() += 1,
            Entry::Vacant(none) if self.per_client > 0 => {
                none.insert(1);
            }
            Entry::Occupied(_) | Entry::Vacant(_) => return false,
        }
        true
    }

    /// Gives one of the named client `key`'s places back; its entry goes with its last. One
    /// lookup.
    fn give_named(&self, key: &PrefixKey) {
        let mut named = self.named_counts();
        if let Entry::Occupied(mut held) = named.entry(*key) {
            if *held.get() > 1 {
                *held.get_mut() -= 1;
            } else {
                held.remove();
            }
        }
    }

    /// A slot for a request held against `whose` per-client count, or the cap that refused it,
    /// counted ([`Self::refused`]); a refused request holds nothing.
    pub(crate) fn take(self: &Arc<Self>, whose: Whose<'_>) -> Result<PassSlot, PassRefusal> {
        self.try_take(whose).inspect_err(|why| {
            self.refusals(*why).fetch_add(1, Ordering::Relaxed);
        })
    }

    fn try_take(self: &Arc<Self>, whose: Whose<'_>) -> Result<PassSlot, PassRefusal> {
        let client = match whose {
            Whose::Peer(peer) if !take_one(peer, self.per_client) => {
                return Err(PassRefusal::Client);
            }
            Whose::Peer(peer) => Client::Peer(Arc::clone(peer)),
            Whose::Named(key) if !self.take_named(key) => return Err(PassRefusal::Client),
            Whose::Named(key) => Client::Named(key),
            Whose::Exempt => Client::Exempt,
        };
        // Dropped on refusal, it gives the client's place back.
        let mut place = Place {
            door: Arc::clone(self),
            client,
            counted: false,
            given_back: AtomicBool::new(false),
        };
        if !take_one(&self.open, self.cap) {
            return Err(PassRefusal::Door);
        }
        place.counted = true;
        Ok(PassSlot {
            own: Some(place),
            shared: None,
            answered: false,
        })
    }
}

/// Whose per-client place a [`PassSlot`] holds.
#[derive(Debug)]
enum Client {
    Peer(Arc<AtomicU32>),
    Named(PrefixKey),
    Exempt,
}

/// One pass-through request's place under both caps, held until its response body has been sent
/// or dropped, and, when its request body was still arriving as the request went upstream, until
/// that body has been sent or dropped too ([`PassSlot::share`]), or its upstream has taken none
/// of it for `upstream_timeout` (the body's watch lets its share go then): an upstream that
/// answers before it has read the body, and reads on, still has the request in hand. A request
/// that fails, or whose exchange door ends, gives the place back at once, whatever holds a share
/// of it: the request body's share may live on in an upstream connection stuck writing it.
#[derive(Debug)]
pub(crate) struct PassSlot {
    /// The place, held by this slot alone; `None` once shared.
    own: Option<Place>,
    /// The place, shared with the slots [`PassSlot::share`] made; `None` until then.
    shared: Option<Arc<Place>>,
    /// Whether dropping this slot leaves a shared place to its other holders (the request was
    /// answered: [`PassSlot::answered`], and every share); otherwise it gives the place back.
    answered: bool,
}

impl PassSlot {
    /// A second holder of this slot's place (the request body's), which is given back once both
    /// are dropped, or once this slot is dropped unanswered or [`ended`](Self::ended). The first
    /// share allocates the place's `Arc`.
    pub(crate) fn share(&mut self) -> Self {
        if let Some(place) = self.own.take() {
            self.shared = Some(Arc::new(place));
        }
        Self {
            own: None,
            shared: self.shared.clone(),
            answered: true,
        }
    }

    /// The slot of a request whose answer is being relayed: dropped at the answer's end, it
    /// leaves the place to the request body's share, if that is still being sent.
    pub(crate) fn answered(mut self) -> Self {
        self.answered = true;
        self
    }

    /// Gives the place back now, whatever shares of it are held: door ended the exchange.
    pub(crate) fn ended(mut self) {
        self.answered = false;
    }
}

impl Drop for PassSlot {
    fn drop(&mut self) {
        if !self.answered
            && let Some(place) = &self.shared
        {
            place.give_back();
        }
    }
}

/// A pass-through request's place under both caps: given back when dropped, or before.
#[derive(Debug)]
struct Place {
    door: Arc<PassThrough>,
    client: Client,
    /// Whether it holds a door-wide place too (`false` only while [`PassThrough::take`] runs).
    counted: bool,
    /// Whether it has been given back.
    given_back: AtomicBool,
}

impl Drop for Place {
    fn drop(&mut self) {
        self.give_back();
    }
}

impl Place {
    /// Gives the place back, once.
    fn give_back(&self) {
        if self.given_back.swap(true, Ordering::AcqRel) {
            return;
        }
        if self.counted {
            self.door.open.fetch_sub(1, Ordering::AcqRel);
        }
        match &self.client {
            Client::Peer(peer) => {
                peer.fetch_sub(1, Ordering::AcqRel);
            }
            Client::Named(key) => self.door.give_named(key),
            Client::Exempt => {}
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

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use door_common::prefix::PrefixKey;

    use super::{PassRefusal, PassThrough, Whose};

    /// A named client gets `per_client` places and no more, another client keeps its own, the
    /// door-wide cap counts them all, and each place comes back with its slot: the last one takes
    /// the client's entry with it.
    #[test]
    fn a_named_client_holds_at_most_its_places_and_its_entry_goes_with_the_last() {
        let door = Arc::new(PassThrough::new(3, 2));
        let a = PrefixKey::from_ipv4([198, 51, 100, 7]);
        let b = PrefixKey::from_ipv4([203, 0, 113, 9]);
        let first = door.take(Whose::Named(a)).unwrap();
        let second = door.take(Whose::Named(a)).unwrap();
        assert_eq!(door.take(Whose::Named(a)).unwrap_err(), PassRefusal::Client);
        let other = door.take(Whose::Named(b)).unwrap();
        assert_eq!((door.open(), door.named_clients()), (3, 2));
        // The door-wide cap refuses a fourth, and the refused request keeps no place.
        assert_eq!(door.take(Whose::Exempt).unwrap_err(), PassRefusal::Door);
        drop(other);
        assert_eq!(
            door.take(Whose::Named(b)).map(drop),
            Ok(()),
            "b's place came back"
        );
        drop(first);
        assert_eq!((door.open(), door.named_clients()), (1, 1));
        let again = door.take(Whose::Named(a)).unwrap();
        drop(again);
        drop(second);
        assert_eq!((door.open(), door.named_clients()), (0, 0));
        // Each refusal counted under its cap, as `/status` and `door.passthrough_refused` show.
        assert_eq!(
            door.status().refused(),
            [
                ("upstream_max_inflight", 1),
                ("upstream_max_inflight_per_client", 1)
            ]
        );
    }

    /// With `upstream_max_inflight_per_client = 0` a named client is refused and leaves no entry.
    #[test]
    fn no_places_per_client_refuses_a_named_client_and_keeps_nothing() {
        let door = Arc::new(PassThrough::new(8, 0));
        let a = PrefixKey::from_ipv4([198, 51, 100, 7]);
        assert_eq!(door.take(Whose::Named(a)).unwrap_err(), PassRefusal::Client);
        assert_eq!((door.open(), door.named_clients()), (0, 0));
    }
}
