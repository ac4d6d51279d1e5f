//! OTLP export of door's metrics (docs/design.md, "Observability"): OTLP/HTTP with protobuf
//! bodies (`opentelemetry-otlp` 0.31, reqwest's blocking client without TLS features, so no system
//! libraries), a periodic reader, cumulative temporality.
//!
//! The exporter runs when `[otlp] endpoint` (or `--otlp-endpoint` / `DOOR_OTLP_ENDPOINT`) is set,
//! or when the standard `OTEL_EXPORTER_OTLP_METRICS_ENDPOINT` or `OTEL_EXPORTER_OTLP_ENDPOINT`
//! variable is; door's own key wins over the standard variables. The other standard variables
//! (`OTEL_EXPORTER_OTLP_HEADERS`, `_TIMEOUT`, `_COMPRESSION`, `OTEL_METRIC_EXPORT_INTERVAL`,
//! `OTEL_RESOURCE_ATTRIBUTES`, `OTEL_SERVICE_NAME`) apply as the SDK defines them. With neither,
//! no exporter is built and the global meter stays the API's no-op.

use std::time::Duration;

use opentelemetry::metrics::{Meter, MeterProvider as _};
use opentelemetry_otlp::{MetricExporter, Protocol, WithExportConfig};
use opentelemetry_sdk::{
    Resource,
    metrics::{PeriodicReader, SdkMeterProvider},
};
use thiserror::Error;

use crate::config::{DEFAULT_OTLP_INTERVAL, OtlpConfig};

/// The instrumentation scope door's instruments are created under.
pub const SCOPE: &str = "door";

/// The OTLP/HTTP path of metrics, appended to a base `endpoint` (OTLP specification, "OTLP/HTTP").
pub const METRICS_PATH: &str = "/v1/metrics";

/// The standard variables that turn the exporter on when `otlp.endpoint` is unset.
pub const ENDPOINT_VARS: [&str; 2] = [
    "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
];

/// The exporter could not be built.
#[derive(Debug, Error)]
#[error("otlp.endpoint: cannot build the OTLP exporter: {0}")]
pub struct TelemetryError(#[from] opentelemetry_otlp::ExporterBuildError);

/// door's meter provider: an OTLP exporter, or none.
#[derive(Debug)]
pub struct Telemetry {
    provider: Option<SdkMeterProvider>,
}

impl Telemetry {
    /// Builds the exporter per `cfg` and the environment (see the module docs) and installs it
    /// as the global meter provider. Blocking (it spawns the reader's thread); call it outside
    /// async code or in `spawn_blocking`.
    ///
    /// # Errors
    /// [`TelemetryError`] when the endpoint cannot be used.
    pub fn init(cfg: &OtlpConfig) -> Result<Self, TelemetryError> {
        let env_set = ENDPOINT_VARS
            .iter()
            .any(|v| std::env::var(v).is_ok_and(|s| !s.trim().is_empty()));
        if cfg.endpoint.is_none() && !env_set {
            return Ok(Self { provider: None });
        }
        let mut builder = MetricExporter::builder()
            .with_http()
            .with_protocol(Protocol::HttpBinary);
        if let Some(endpoint) = &cfg.endpoint {
            builder =
                builder.with_endpoint(format!("{}{METRICS_PATH}", endpoint.trim_end_matches('/')));
        }
        let exporter = builder.build()?;
        let mut reader = PeriodicReader::builder(exporter);
        let sdk_env = std::env::var("OTEL_METRIC_EXPORT_INTERVAL").is_ok();
        match cfg.interval {
            Some(interval) => reader = reader.with_interval(interval),
            None if !sdk_env => reader = reader.with_interval(DEFAULT_OTLP_INTERVAL),
            None => {}
        }
        let provider = SdkMeterProvider::builder()
            .with_reader(reader.build())
            .with_resource(Resource::builder().with_service_name("door").build())
            .build();
        opentelemetry::global::set_meter_provider(provider.clone());
        Ok(Self {
            provider: Some(provider),
        })
    }

    /// Whether an exporter runs.
    pub fn exporting(&self) -> bool {
        self.provider.is_some()
    }

    /// The meter door's instruments are built from: the exporter's, or the global (no-op) one.
    pub fn meter(&self) -> Meter {
        match &self.provider {
            Some(p) => p.meter(SCOPE),
            None => opentelemetry::global::meter(SCOPE),
        }
    }

    /// Exports what has been recorded now (blocking, bounded by the exporter's timeout).
    pub fn flush(&self) {
        if let Some(p) = &self.provider
            && let Err(e) = p.force_flush()
        {
            tracing::warn!(error = %e, "OTLP export failed");
        }
    }

    /// Flushes and stops the exporter (blocking; at most `timeout`).
    pub fn shutdown(self, timeout: Duration) {
        if let Some(p) = self.provider
            && let Err(e) = p.shutdown_with_timeout(timeout)
        {
            tracing::warn!(error = %e, "OTLP exporter shutdown failed");
        }
    }
}
