//! OTLP export of door's metrics (docs/design.md, "Observability"): OTLP/HTTP with protobuf
//! bodies (`opentelemetry-otlp` 0.31, reqwest's blocking client with its answers bounded and no
//! redirects: [`crate::obs::otlp_http`]), a periodic reader, cumulative
//! temporality. An `https://` endpoint is verified against the system's roots (rustls with the
//! `ring` provider, `rustls-native-certs`: `/etc/ssl/certs`, or `SSL_CERT_FILE` / `SSL_CERT_DIR`),
//! with no system TLS library. Where the SDK reports a failed export at `debug` only, door logs
//! the change: the first export that fails, at `warn` (at most once every
//! [`EXPORT_WARN_INTERVAL`], with how many such lines were held back), and the first that works
//! again, at `info`, when its failure was logged: the last line logged says how exports stand.
//!
//! The exporter runs when `[otlp] endpoint` (or `--otlp-endpoint` / `DOOR_OTLP_ENDPOINT`) is set,
//! or when the standard `OTEL_EXPORTER_OTLP_METRICS_ENDPOINT` or `OTEL_EXPORTER_OTLP_ENDPOINT`
//! variable is; door's own key wins over the standard variables. The other standard variables
//! (`OTEL_EXPORTER_OTLP_HEADERS`, `_TIMEOUT`, `_COMPRESSION`, `OTEL_METRIC_EXPORT_INTERVAL`,
//! `OTEL_RESOURCE_ATTRIBUTES`, `OTEL_SERVICE_NAME`) apply as the SDK defines them. With neither,
//! no exporter is built. Either way the provider carries the Prometheus reader of
//! [`crate::obs::prometheus`] (`GET /metrics`): the two readers aggregate separately.

use std::{
    sync::atomic::{AtomicBool, Ordering},
    time::Duration,
};

use opentelemetry::metrics::{Meter, MeterProvider as _};
use opentelemetry_otlp::{MetricExporter, Protocol, WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::{
    Resource,
    error::OTelSdkResult,
    metrics::{
        PeriodicReader, SdkMeterProvider, Temporality, data::ResourceMetrics,
        exporter::PushMetricExporter,
    },
};
use thiserror::Error;

use crate::{
    config::{DEFAULT_OTLP_INTERVAL, OtlpConfig},
    obs::{
        logging::RateLimitedWarn,
        otlp_http::{BoundedClient, ClientError},
        prometheus::Exposition,
    },
};

/// How often exports that start failing are logged, at most.
pub const EXPORT_WARN_INTERVAL: Duration = Duration::from_mins(1);

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
pub enum TelemetryError {
    /// The SDK refused the exporter's settings (the endpoint, say).
    #[error("otlp.endpoint: cannot build the OTLP exporter: {0}")]
    Exporter(#[from] opentelemetry_otlp::ExporterBuildError),
    /// The HTTP client could not be built ([`BoundedClient::new`]).
    #[error("otlp.endpoint: {0}")]
    Client(#[from] ClientError),
}

/// door's meter provider: always the Prometheus reader behind `GET /metrics`
/// ([`crate::obs::prometheus`]), and the OTLP exporter beside it when configured.
#[derive(Debug)]
pub struct Telemetry {
    provider: SdkMeterProvider,
    exposition: Exposition,
    exporting: bool,
}

impl Telemetry {
    /// A provider with the Prometheus reader only, not installed as the global provider (for
    /// tests, and a door without OTLP).
    pub fn local() -> Self {
        let exposition = Exposition::new();
        let provider = SdkMeterProvider::builder()
            .with_reader(exposition.reader())
            .with_resource(resource())
            .build();
        Self {
            provider,
            exposition,
            exporting: false,
        }
    }

    /// Builds the provider: the Prometheus reader, plus the OTLP exporter per `cfg` and the
    /// environment (see the module docs), and installs it as the global meter provider.
    /// Blocking (the OTLP reader spawns its thread); call it outside async code or in
    /// `spawn_blocking`.
    ///
    /// # Errors
    /// [`TelemetryError`] when the endpoint cannot be used.
    pub fn init(cfg: &OtlpConfig) -> Result<Self, TelemetryError> {
        let env_set = ENDPOINT_VARS
            .iter()
            .any(|v| std::env::var(v).is_ok_and(|s| !s.trim().is_empty()));
        let exposition = Exposition::new();
        let mut provider = SdkMeterProvider::builder()
            .with_reader(exposition.reader())
            .with_resource(resource());
        let exporting = cfg.endpoint.is_some() || env_set;
        if exporting {
            let mut builder = MetricExporter::builder()
                .with_http()
                .with_protocol(Protocol::HttpBinary)
                .with_http_client(BoundedClient::new(BoundedClient::timeout_from_env())?);
            if let Some(endpoint) = &cfg.endpoint {
                builder = builder
                    .with_endpoint(format!("{}{METRICS_PATH}", endpoint.trim_end_matches('/')));
            }
            let exporter = Logged {
                inner: builder.build()?,
                failing: AtomicBool::new(false),
                told: AtomicBool::new(false),
            };
            let mut reader = PeriodicReader::builder(exporter);
            let sdk_env = std::env::var("OTEL_METRIC_EXPORT_INTERVAL").is_ok();
            match cfg.interval {
                Some(interval) => reader = reader.with_interval(interval),
                None if !sdk_env => reader = reader.with_interval(DEFAULT_OTLP_INTERVAL),
                None => {}
            }
            provider = provider.with_reader(reader.build());
        }
        let provider = provider.build();
        opentelemetry::global::set_meter_provider(provider.clone());
        Ok(Self {
            provider,
            exposition,
            exporting,
        })
    }

    /// Whether the OTLP exporter runs.
    pub fn exporting(&self) -> bool {
        self.exporting
    }

    /// The meter door's instruments are built from.
    pub fn meter(&self) -> Meter {
        self.provider.meter(SCOPE)
    }

    /// The Prometheus exposition of everything recorded through [`Telemetry::meter`].
    pub fn exposition(&self) -> Exposition {
        self.exposition.clone()
    }

    /// Exports what has been recorded now over OTLP (blocking, bounded by the exporter's
    /// timeout); nothing without an exporter.
    pub fn flush(&self) {
        if self.exporting
            && let Err(e) = self.provider.force_flush()
        {
            tracing::warn!(error = %e, "OTLP export failed");
        }
    }

    /// Flushes and stops the exporter (blocking; at most `timeout`).
    pub fn shutdown(self, timeout: Duration) {
        if let Err(e) = self.provider.shutdown_with_timeout(timeout)
            && self.exporting
        {
            tracing::warn!(error = %e, "OTLP exporter shutdown failed");
        }
    }
}

/// The OTLP exporter, saying in door's log when exports start failing and when they work again.
#[derive(Debug)]
struct Logged {
    inner: MetricExporter,
    /// Whether the last export failed.
    failing: AtomicBool,
    /// Whether the failure that started the current run of failures was logged (so its end is).
    told: AtomicBool,
}

impl PushMetricExporter for Logged {
    async fn export(&self, metrics: &ResourceMetrics) -> OTelSdkResult {
        static FAILED: RateLimitedWarn = RateLimitedWarn::new(EXPORT_WARN_INTERVAL);
        let result = self.inner.export(metrics).await;
        match &result {
            Err(e) => {
                if !self.failing.swap(true, Ordering::Relaxed) {
                    let due = FAILED.due();
                    if let Some(suppressed) = due {
                        tracing::warn!(error = %e, suppressed, "OTLP export failed; the next export that works carries the totals (logged when exports start failing, at most once a minute)");
                    }
                    self.told.store(due.is_some(), Ordering::Relaxed);
                }
            }
            Ok(()) => {
                if self.failing.swap(false, Ordering::Relaxed)
                    && self.told.swap(false, Ordering::Relaxed)
                {
                    tracing::info!("OTLP export works again");
                }
            }
        }
        result
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn temporality(&self) -> Temporality {
        self.inner.temporality()
    }
}

fn resource() -> Resource {
    Resource::builder().with_service_name("door").build()
}
