//! Observability (docs/design.md, "Observability"): the metric instruments door records into
//! ([`metrics`]), their OTLP/HTTP export ([`otlp`], through [`otlp_http`]'s client), their Prometheus text exposition
//! ([`prometheus`], `GET /metrics`) and journald-friendly logging with warnings
//! that never repeat per request ([`logging`]). Nothing here decides anything.

pub mod logging;
pub mod metrics;
pub mod otlp;
pub mod otlp_http;
pub mod prometheus;
