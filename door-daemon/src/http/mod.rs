//! The request path (docs/design.md, "Limits"): the listeners ([`front`]) and their sockets
//! ([`bind`]), one client connection ([`conn`]) and its limits at accept ([`conn_limit`]), one
//! request from admission to settlement ([`request`]), what is counted in flight (`inflight`:
//! the pass-through caps, the requests the drain waits for), the *one* place a limiter
//! decision becomes a status, body and `RateLimit` fields ([`answer`]), the *one* function that
//! decides whether a request's end spends a token ([`settle`]), the streamed response body that
//! holds the permit ([`body`]), the upstream client and forwarding-header rewrite ([`upstream`])
//! and its connector ([`connect`]), the checks of a request head ([`head`]), routes ([`route`]),
//! the request planes' verified credentials ([`plane`]), protocol upgrades ([`upgrade`]) and the
//! upgraded connection's copy ([`tunnel`]), cached health ([`health`]), TLS ([`tls`]), the worker
//! threads' identity ([`worker`]), the connections' idle watch (`idle`, also the admin
//! listener's) and the HTTP/2 preface it learns a cleartext connection's protocol from
//! (`preface`).
//!
//! May use [`crate::client`], [`crate::limit`], [`crate::obs`], [`crate::shield::escalate`] and
//! [`crate::time`]; it never touches the XDP program itself.

pub mod answer;
pub mod bind;
pub mod body;
pub mod conn;
pub mod conn_limit;
pub mod connect;
pub mod front;
pub mod head;
pub mod health;
pub(crate) mod idle;
pub(crate) mod inflight;
pub mod plane;
pub(crate) mod preface;
pub mod request;
pub mod route;
pub mod settle;
pub mod tls;
pub mod tunnel;
pub mod upgrade;
pub mod upstream;
pub mod worker;

pub use conn::ConnInfo;
pub use front::{ConnSettings, Front, MAX_CONCURRENT_STREAMS, MAX_HEADER_BYTES};
pub use inflight::PassThroughStatus;
pub use request::{App, HEALTH_GROUP};
