//! door: a front door for one HTTP application (docs/design.md).
//!
//! One folder or file per concern; each module's doc says what lives there and what it may use.
//!
//! | module | what |
//! |---|---|
//! | [`daemon`] | the process's life: bind, shield start, systemd notifications, signals, reload, drain |
//! | [`cluster`] | budget sharing between doors through Redis or Valkey: the sync task, membership, degraded mode, the shared XDP blocklist |
//! | [`config`] | the validated [`config::Config`], its errors, the file, flags and environment, the printer, the reload diff |
//! | [`client`] | who the client is: the key, trusted proxies, forwarding headers, PROXY protocol |
//! | [`limit`] | the layer-7 limiter: token buckets, in-flight caps, the bounded table (no HTTP, no metrics) |
//! | [`http`] | the request path: listeners, admit → forward → settle, door's own answers, the upstream client |
//! | [`shield`] | the XDP flood shield's daemon side: load and attach, maps, blocklist, escalation, its metrics |
//! | [`admin`] | the admin listener: `GET /status`, `GET /metrics`, the operator's `/clients` and `/blocks` |
//! | [`obs`] | observability: metric instruments, OTLP export, the Prometheus exposition, logging |
//! | [`time`] | the one clock |
//! | [`top`] | `door top`: the terminal view of the admin API |

pub mod admin;
pub mod client;
pub mod cluster;
pub mod config;
pub mod daemon;
pub mod http;
pub mod limit;
pub mod obs;
pub mod shield;
pub mod time;
pub mod top;
