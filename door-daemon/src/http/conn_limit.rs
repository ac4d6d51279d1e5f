//! Door-wide connection limits, decided at accept (before a byte is read): at most
//! `max_connections` client connections at once, and at most `max_connections_per_client` from
//! one TCP peer (its /32 or /64; trusted proxies are exempt, since they carry many clients), or
//! from one client a PROXY protocol header names (decided once the header is read). A
//! refused connection is closed at once, counted on `door.connections_refused` by reason, and
//! warned about at most once a minute per reason.
//!
//! The per-peer table holds only peers with a connection open, so it never has more entries
//! than `max_connections`. Each entry also carries the peer's count of pass-through requests
//! in flight, shared by its connections' slots, against `upstream_max_inflight_per_client`
//! (`http/request.rs`).

use std::{
    collections::HashMap,
    net::IpAddr,
    sync::{Arc, Mutex, PoisonError, atomic::AtomicU32},
};

use door_common::prefix::PrefixKey;

/// Why a connection was refused at accept: the value of `door.reason` on
/// `door.connections_refused`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// `max_connections` client connections were open.
    MaxConnections,
    /// The peer had `max_connections_per_client` connections open.
    MaxConnectionsPerClient,
}

impl Refusal {
    /// `max_connections` or `max_connections_per_client`: the configuration key that refused it.
    pub const fn as_str(self) -> &'static str {
        match self {
            Refusal::MaxConnections => "max_connections",
            Refusal::MaxConnectionsPerClient => "max_connections_per_client",
        }
    }
}

#[derive(Debug, Default)]
struct Open {
    total: u32,
    by_peer: HashMap<PrefixKey, Peer>,
}

impl Open {
    /// One connection of `key` ended (or moved to another peer): its entry goes with its last.
    fn leave(by_peer: &mut HashMap<PrefixKey, Peer>, key: PrefixKey) {
        if let Some(peer) = by_peer.get_mut(&key) {
            peer.connections = peer.connections.saturating_sub(1);
            if peer.connections == 0 {
                by_peer.remove(&key);
            }
        }
    }
}

/// One peer's open connections, and its pass-through requests in flight (shared with its
/// connections' slots: [`ConnSlot::peer_inflight`]).
#[derive(Debug, Default)]
struct Peer {
    connections: u32,
    inflight: Arc<AtomicU32>,
}

/// The connection limits of one front, shared by its accept loops.
#[derive(Debug)]
pub struct ConnLimits {
    max: u32,
    per_client: u32,
    open: Mutex<Open>,
}

impl ConnLimits {
    /// At most `max` connections door-wide and `per_client` per peer (both at least 1).
    pub fn new(max: u32, per_client: u32) -> Arc<Self> {
        Arc::new(Self {
            max: max.max(1),
            per_client: per_client.max(1),
            open: Mutex::new(Open::default()),
        })
    }

    /// Client connections open now.
    pub fn open(&self) -> u32 {
        self.lock().total
    }

    /// Takes a slot for a connection from `peer` (a canonical address); `exempt` peers (trusted
    /// proxies) count door-wide only.
    ///
    /// # Errors
    /// The [`Refusal`] when a limit is reached; nothing is taken then.
    pub fn admit(self: &Arc<Self>, peer: IpAddr, exempt: bool) -> Result<ConnSlot, Refusal> {
        let key = (!exempt).then(|| PrefixKey::from_ip(peer));
        let mut open = self.lock();
        if open.total >= self.max {
            return Err(Refusal::MaxConnections);
        }
        let mut inflight = None;
        if let Some(key) = key {
            let peer = open.by_peer.entry(key).or_default();
            if peer.connections >= self.per_client {
                return Err(Refusal::MaxConnectionsPerClient);
            }
            peer.connections += 1;
            inflight = Some(Arc::clone(&peer.inflight));
        }
        open.total += 1;
        Ok(ConnSlot {
            limits: Arc::clone(self),
            key,
            inflight,
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Open> {
        self.open.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// One open connection's slot; freed when dropped (the connection ended).
#[derive(Debug)]
pub struct ConnSlot {
    limits: Arc<ConnLimits>,
    key: Option<PrefixKey>,
    /// The peer's pass-through requests in flight; `None` for an exempt peer.
    inflight: Option<Arc<AtomicU32>>,
}

impl ConnSlot {
    /// The count of pass-through requests in flight that every connection of this slot's peer
    /// shares; `None` for a trusted proxy, which is exempt.
    pub fn peer_inflight(&self) -> Option<&Arc<AtomicU32>> {
        self.inflight.as_ref()
    }

    /// Counts this connection for `peer` instead of the TCP peer it was admitted for: a trusted
    /// proxy's PROXY protocol header named `peer` (a canonical address) as the client. The
    /// connection then counts among `peer`'s connections against `max_connections_per_client`
    /// and shares its pass-through count (neither for an `exempt` peer).
    ///
    /// # Errors
    /// [`Refusal::MaxConnectionsPerClient`] when `peer` has that many connections open already;
    /// the slot is left as it was (the caller drops the connection, which frees it).
    pub fn rekey(&mut self, peer: IpAddr, exempt: bool) -> Result<(), Refusal> {
        let key = (!exempt).then(|| PrefixKey::from_ip(peer));
        if key == self.key {
            return Ok(());
        }
        let per_client = self.limits.per_client;
        let mut open = self.limits.lock();
        if let Some(new) = key
            && open
                .by_peer
                .get(&new)
                .is_some_and(|p| p.connections >= per_client)
        {
            return Err(Refusal::MaxConnectionsPerClient);
        }
        if let Some(old) = self.key {
            Open::leave(&mut open.by_peer, old);
        }
        self.inflight = key.map(|key| {
            let entry = open.by_peer.entry(key).or_default();
            entry.connections += 1;
            Arc::clone(&entry.inflight)
        });
        self.key = key;
        Ok(())
    }
}

impl Drop for ConnSlot {
    fn drop(&mut self) {
        let mut open = self.limits.lock();
        open.total = open.total.saturating_sub(1);
        if let Some(key) = self.key {
            Open::leave(&mut open.by_peer, key);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use super::*;

    #[test]
    fn limits_hold_and_slots_come_back() {
        let limits = ConnLimits::new(3, 2);
        let a = IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1));
        let b = IpAddr::V4(Ipv4Addr::new(192, 0, 2, 2));
        let a1 = limits.admit(a, false).unwrap();
        let _a2 = limits.admit(a, false).unwrap();
        assert_eq!(
            limits.admit(a, false).unwrap_err(),
            Refusal::MaxConnectionsPerClient
        );
        let proxy = limits.admit(b, true).unwrap();
        assert_eq!(limits.admit(b, false).unwrap_err(), Refusal::MaxConnections);
        drop(proxy);
        drop(a1);
        assert_eq!(limits.open(), 1);
        let _b = limits.admit(b, false).unwrap();
        let _a3 = limits.admit(a, false).unwrap();
        assert_eq!(limits.lock().by_peer.len(), 2);
    }

    /// A peer's connections share one count of its pass-through requests; an exempt peer has
    /// none, and another peer its own.
    #[test]
    fn a_peers_connections_share_its_in_flight_count() {
        let limits = ConnLimits::new(10, 10);
        let a = IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1));
        let b = IpAddr::V4(Ipv4Addr::new(192, 0, 2, 2));
        let (a1, a2, b1) = (
            limits.admit(a, false).unwrap(),
            limits.admit(a, false).unwrap(),
            limits.admit(b, false).unwrap(),
        );
        let count = |s: &ConnSlot| Arc::as_ptr(s.peer_inflight().unwrap());
        assert_eq!(count(&a1), count(&a2));
        assert_ne!(count(&a1), count(&b1));
        assert!(limits.admit(a, true).unwrap().peer_inflight().is_none());
    }

    /// A trusted proxy's connection, rekeyed to the client its PROXY header names, shares that
    /// client's count and leaves the table with it; rekeyed to a trusted address, it has none.
    #[test]
    fn a_rekeyed_connection_counts_for_the_named_client() {
        let limits = ConnLimits::new(10, 10);
        let proxy = IpAddr::V4(Ipv4Addr::new(192, 0, 2, 9));
        let client = IpAddr::V4(Ipv4Addr::new(198, 51, 100, 1));
        let direct = limits.admit(client, false).unwrap();
        let mut named = limits.admit(proxy, true).unwrap();
        assert!(named.peer_inflight().is_none());
        named.rekey(client, false).unwrap();
        assert_eq!(
            Arc::as_ptr(named.peer_inflight().unwrap()),
            Arc::as_ptr(direct.peer_inflight().unwrap())
        );
        assert_eq!(
            limits.lock().by_peer[&PrefixKey::from_ip(client)].connections,
            2
        );
        named.rekey(proxy, true).unwrap();
        assert!(named.peer_inflight().is_none());
        assert_eq!(
            limits.lock().by_peer[&PrefixKey::from_ip(client)].connections,
            1
        );
        named.rekey(client, false).unwrap();
        drop((direct, named));
        assert!(limits.lock().by_peer.is_empty());
        assert_eq!(limits.open(), 0);
    }

    /// A client a PROXY header names is held to `max_connections_per_client` too: past it the
    /// rekey is refused and leaves the slot (and the client's count) as they were.
    #[test]
    fn a_named_client_past_its_cap_is_refused() {
        let limits = ConnLimits::new(10, 2);
        let proxy = IpAddr::V4(Ipv4Addr::new(192, 0, 2, 9));
        let client = IpAddr::V4(Ipv4Addr::new(198, 51, 100, 1));
        let mut first = limits.admit(proxy, true).unwrap();
        let mut second = limits.admit(proxy, true).unwrap();
        let mut third = limits.admit(proxy, true).unwrap();
        first.rekey(client, false).unwrap();
        second.rekey(client, false).unwrap();
        assert_eq!(
            third.rekey(client, false),
            Err(Refusal::MaxConnectionsPerClient)
        );
        assert!(third.peer_inflight().is_none(), "left as it was");
        assert_eq!(
            limits.lock().by_peer[&PrefixKey::from_ip(client)].connections,
            2
        );
        drop(third);
        assert_eq!(limits.open(), 2);
        drop((first, second));
        assert!(limits.lock().by_peer.is_empty());
    }

    #[test]
    fn the_peer_table_empties_as_connections_close() {
        let limits = ConnLimits::new(100, 100);
        let slots: Vec<_> = (0..50u8)
            .map(|i| {
                limits
                    .admit(IpAddr::V4(Ipv4Addr::new(198, 51, 100, i)), false)
                    .unwrap()
            })
            .collect();
        assert_eq!(limits.lock().by_peer.len(), 50);
        drop(slots);
        assert_eq!(limits.lock().by_peer.len(), 0);
        assert_eq!(limits.open(), 0);
    }
}
