//! door: a front door for one HTTP application (../shared/DESIGN.md).
//!
//! One concern per module: [`config`] (file, flags, env, validation), [`config_print`] (the
//! effective configuration printed back as TOML), [`route`] (which group a
//! request belongs to), [`clock`] (injected time), [`limit`] (the layer-7 limiter), [`metrics`]
//! (its instruments), [`key`] (the client key; `forwarded` parses the wire syntax of
//! `X-Forwarded-For` and RFC 7239 `Forwarded` for it), [`proxy`] (forwarding to the upstream), [`proxy_protocol`] (PROXY protocol v1/v2 on a listener),
//! [`server`] (listeners and the request path), [`status`] (the admin endpoint), [`xdp`] (loading
//! and reading the flood shield), [`escalate`] (layer-7 rejections to the XDP blocklist),
//! [`health`] (cached health for over-budget probes), [`tls`] (rustls termination),
//! [`telemetry`] (OTLP export).
//! [`logging`] (journald-friendly `tracing` output, warnings that must not repeat per request).

pub mod clock;
pub mod config;
pub mod config_print;
pub mod escalate;
mod forwarded;
pub mod health;
pub mod key;
pub mod limit;
pub mod logging;
pub mod metrics;
pub mod proxy;
pub mod proxy_protocol;
pub mod route;
pub mod server;
pub mod status;
pub mod telemetry;
pub mod tls;
pub mod xdp;
