//! One client connection as the request path sees it ([`ConnInfo`]): its peer, whether door
//! terminated TLS on it or a trusted proxy named the client in a PROXY protocol header, the value
//! door appends to `X-Forwarded-For` for it, its idle watch and its slot against the connection
//! limits. Built by the accept loop ([`crate::http::front`]), shared by the connection's requests.

use std::{
    net::SocketAddr,
    sync::{Arc, atomic::AtomicU32},
};

use crate::http::{conn_limit::ConnSlot, idle::Activity};

/// Per-connection state: where it comes from, when it last had a request in flight, and its slot
/// against the connection limits.
#[derive(Debug)]
pub struct ConnInfo {
    pub(crate) peer: SocketAddr,
    pub(crate) tls: bool,
    /// The connection came in on a PROXY protocol listener (its peer from the header a trusted
    /// proxy sent).
    pub(crate) proxied: bool,
    /// The PROXY protocol header named no client (v2 `LOCAL`, v1 `UNKNOWN`, a Unix or datagram
    /// source): the peer is the proxy itself, and the forwarding fields on the connection, which
    /// such a proxy relays unchecked from whoever it serves, are not believed.
    pub(crate) unnamed: bool,
    /// The peer's address in canonical form (IPv4-mapped unmapped, zone dropped).
    pub(crate) peer_ip: std::net::IpAddr,
    /// `peer_ip` as the `X-Forwarded-For` element door appends: formatted once per connection.
    pub(crate) peer_value: http::HeaderValue,
    /// When it last had a request in flight, for the idle watch.
    pub(super) activity: Activity,
    /// The connection's slot against `max_connections` and `max_connections_per_client`
    /// (`None` for a connection made outside the accept loop, in tests). Freed when the last
    /// holder of this info lets go: an HTTP/1.1 connection that switched protocols is no longer
    /// served by hyper, and its tunnel holds the info, and the slot, until it closes.
    pub(super) slot: Option<ConnSlot>,
}

impl ConnInfo {
    /// A connection from `peer`; `tls` when door terminated TLS on it.
    pub fn new(peer: SocketAddr, tls: bool) -> Self {
        let peer_ip = crate::client::key::canonical(peer.ip());
        Self {
            peer,
            tls,
            proxied: false,
            unnamed: false,
            peer_ip,
            peer_value: http::HeaderValue::try_from(peer_ip.to_string())
                .unwrap_or_else(|_| http::HeaderValue::from_static("unknown")),
            activity: Activity::new(),
            slot: None,
        }
    }

    /// The pass-through requests in flight of this connection's TCP peer, shared by all its
    /// connections ([`ConnSlot::peer_inflight`]); `None` for an exempt peer or a connection
    /// made outside the accept loop.
    pub(crate) fn peer_inflight(&self) -> Option<&Arc<AtomicU32>> {
        self.slot.as_ref().and_then(ConnSlot::peer_inflight)
    }

    /// A request on this connection started; `http1` when it came over HTTP/1.x.
    pub(crate) fn request_started(&self, http1: bool) {
        self.activity.request_started(http1);
    }

    /// A request on this connection ended (its response body was sent or dropped).
    pub(crate) fn request_ended(&self) {
        self.activity.request_ended();
    }
}
