//! door: a front door for one HTTP application (../shared/DESIGN.md).
//!
//! One concern per module: [`config`] (file, flags, env, validation), [`route`] (which group a
//! request belongs to), [`clock`] (injected time), [`limit`] (the layer-7 limiter), [`key`] (the
//! client key), [`proxy`] (forwarding to the upstream), [`server`] (listeners and the request
//! path), [`status`] (the admin endpoint), [`xdp`] (loading and reading the flood shield).

pub mod clock;
pub mod config;
pub mod escalate;
pub mod key;
pub mod limit;
pub mod proxy;
pub mod route;
pub mod server;
pub mod status;
pub mod xdp;
