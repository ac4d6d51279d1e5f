//! door: a front door for one HTTP application (../shared/DESIGN.md).
//!
//! One concern per module: [`clock`] (injected time), [`limit`] (the layer-7 limiter),
//! [`key`] (the client key), `forwarded` (the wire syntax of `X-Forwarded-For` and RFC 7239
//! `Forwarded`, private to [`key`]).

pub mod clock;
mod forwarded;
pub mod key;
pub mod limit;
