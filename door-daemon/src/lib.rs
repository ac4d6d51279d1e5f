//! door: a front door for one HTTP application (../shared/DESIGN.md).
//!
//! One concern per module: [`clock`] (injected time), [`limit`] (the layer-7 limiter),
//! [`key`] (the client key), [`metrics`] (OpenTelemetry instruments).

pub mod clock;
pub mod key;
pub mod limit;
pub mod metrics;
