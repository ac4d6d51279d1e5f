//! OTLP metrics export (`[otlp]`): the collector's URL and the export interval.

use std::time::Duration;

use http::uri::{Scheme, Uri};

use super::{ConfigError, durations::parse_duration, file::OtlpFile, flags::Overrides, invalid};

/// Default `[otlp] interval`: metrics are exported every 10 s.
pub const DEFAULT_OTLP_INTERVAL: Duration = Duration::from_secs(10);

/// OTLP metrics export (`[otlp]`). The exporter runs when `endpoint` is set here or when one of
/// the standard `OTEL_EXPORTER_OTLP_ENDPOINT` / `OTEL_EXPORTER_OTLP_METRICS_ENDPOINT` variables
/// is set; otherwise the global meter stays a no-op.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OtlpConfig {
    /// Collector base URL for OTLP/HTTP protobuf, e.g. `http://127.0.0.1:4318` (`/v1/metrics` is
    /// appended) (`otlp.endpoint`; `--otlp-endpoint` / `DOOR_OTLP_ENDPOINT`). Default: none (the
    /// `OTEL_EXPORTER_OTLP_*` variables decide).
    pub endpoint: Option<String>,
    /// Export interval (`otlp.interval`; `--otlp-interval` / `DOOR_OTLP_INTERVAL`). Default 10 s,
    /// or `OTEL_METRIC_EXPORT_INTERVAL` (milliseconds) when set and this key is not.
    pub interval: Option<Duration>,
}

pub(super) fn build_otlp(file: Option<OtlpFile>, o: &Overrides) -> Result<OtlpConfig, ConfigError> {
    let f = file.unwrap_or_default();
    let endpoint = o.otlp_endpoint.clone().or(f.endpoint);
    if let Some(e) = &endpoint {
        let ok = e.parse::<Uri>().ok().is_some_and(|u| {
            (u.scheme() == Some(&Scheme::HTTP) || u.scheme() == Some(&Scheme::HTTPS))
                && u.authority().is_some()
        });
        if !ok {
            return Err(invalid(
                "otlp.endpoint",
                format!("{e:?}"),
                "not an http:// or https:// URL",
            ));
        }
    }
    let interval = match o.otlp_interval.clone().or(f.interval) {
        Some(s) => Some(parse_duration("otlp.interval", &s)?),
        None => None,
    };
    Ok(OtlpConfig { endpoint, interval })
}
