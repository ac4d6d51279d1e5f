//! door: a front door for one HTTP application (../shared/DESIGN.md).
//!
//! One concern per module: [`config`] (file, flags, env, validation), [`route`] (which group a
//! request belongs to), [`clock`] (injected time), [`limit`] (the layer-7 limiter), [`metrics`]
//! (its instruments), [`key`] (the client key; `forwarded` parses the wire syntax of
//! `X-Forwarded-For` and RFC 7239 `Forwarded` for it), [`proxy`] (forwarding to the upstream),
//! [`server`] (listeners and the request path), [`status`] (the admin endpoint), [`xdp`] (loading
//! and reading the flood shield), [`escalate`] (layer-7 rejections to the XDP blocklist).

pub mod clock;
pub mod config;
pub mod escalate;
mod forwarded;
pub mod key;
pub mod limit;
pub mod metrics;
pub mod proxy;
pub mod route;
pub mod server;
pub mod status;
pub mod xdp;
