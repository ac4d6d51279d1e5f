//! The Prometheus text exposition of door's instruments (`GET /metrics` on the admin listener;
//! docs/design.md, "Observability"), beside the OTLP export.
//!
//! door's [`SdkMeterProvider`](opentelemetry_sdk::metrics::SdkMeterProvider) always has this
//! module's reader: an SDK [`ManualReader`] (cumulative, like Prometheus) that is collected on
//! every scrape. When OTLP is configured, the periodic OTLP reader sits beside it on the same
//! provider; each reader has its own aggregation, so a scrape never resets what OTLP exports or
//! the other way round. The collected data is rendered in the Prometheus text format (version
//! 0.0.4) by the `prometheus-client` crate's encoder (docs/decisions.md, "Prometheus exposition:
//! a ManualReader and prometheus-client").
//!
//! Names follow the OpenTelemetry-to-Prometheus mapping, so that a Prometheus ingesting door's
//! OTLP sees the same series as one scraping `/metrics`:
//!
//! - the metric name with every character outside `[a-zA-Z0-9_:]` replaced by `_`
//!   (`door.xdp.packets` → `door_xdp_packets`), plus a unit suffix for a unit Prometheus has a name
//!   for (`s` → `_seconds`, `By` → `_bytes`); annotations (`{request}`) are dropped;
//! - a monotonic sum (a counter) gets `_total` and type `counter`; an up-down counter and a gauge
//!   become a `gauge`; a histogram a `histogram` (`_bucket` with cumulative counts up to `+Inf`,
//!   `_sum`, `_count`);
//! - attribute keys the same way (`door.group` → `door_group`); values as they are.
//!
//! No scope labels and no `target_info` are added: every series carries only the instrument's
//! own attributes, which are bounded by construction (groups, outcomes, reasons, verdicts; never
//! a client).

use std::{
    collections::BTreeMap,
    sync::{Arc, Weak},
    time::Duration,
};

use opentelemetry::KeyValue;
use opentelemetry_sdk::{
    error::OTelSdkResult,
    metrics::{
        InstrumentKind, ManualReader, Pipeline, Temporality,
        data::{AggregatedMetrics, MetricData, ResourceMetrics},
        reader::MetricReader,
    },
};
use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, NoLabelSet},
    metrics::MetricType,
    registry::Registry,
};
use thiserror::Error;

/// The `Content-Type` of `GET /metrics`: the Prometheus text format, version 0.0.4.
pub const CONTENT_TYPE: &str = prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

/// The exposition could not be produced.
#[derive(Debug, Error)]
pub enum ExpositionError {
    /// The SDK refused to collect (the meter provider was shut down).
    #[error("collecting the metrics: {0}")]
    Collect(String),
    /// The encoder failed (it only fails when writing fails, which a `String` never does).
    #[error("encoding the metrics")]
    Encode(#[from] std::fmt::Error),
}

/// A handle on door's Prometheus reader: cheap to clone; [`Exposition::render`] collects and
/// renders on demand. Register [`Exposition::reader`] with the meter provider first.
#[derive(Debug, Clone)]
pub struct Exposition {
    reader: Arc<ManualReader>,
}

impl Default for Exposition {
    fn default() -> Self {
        Self::new()
    }
}

impl Exposition {
    /// A new reader, not yet registered with a provider (a render then shows nothing).
    pub fn new() -> Self {
        Self {
            reader: Arc::new(
                ManualReader::builder()
                    .with_temporality(Temporality::Cumulative)
                    .build(),
            ),
        }
    }

    /// The reader to register with the meter provider (`SdkMeterProvider::builder().with_reader`).
    pub fn reader(&self) -> impl MetricReader {
        SharedReader(Arc::clone(&self.reader))
    }

    /// Collects every instrument now (running the observable instruments' callbacks, which read
    /// the XDP maps: call it off the async workers) and renders the Prometheus text exposition.
    ///
    /// # Errors
    /// [`ExpositionError::Collect`] when the provider was shut down.
    pub fn render(&self) -> Result<String, ExpositionError> {
        let mut rm = ResourceMetrics::default();
        self.reader
            .collect(&mut rm)
            .map_err(|e| ExpositionError::Collect(e.to_string()))?;
        let mut registry = Registry::default();
        registry.register_collector(Box::new(Snapshot(families(&rm))));
        let mut out = String::new();
        prometheus_client::encoding::prometheus_text::encode(&mut out, &registry)?;
        Ok(out)
    }
}

/// The [`ManualReader`] shared between the provider (which owns its reader) and [`Exposition`].
#[derive(Debug)]
struct SharedReader(Arc<ManualReader>);

impl MetricReader for SharedReader {
    fn register_pipeline(&self, pipeline: Weak<Pipeline>) {
        self.0.register_pipeline(pipeline);
    }

    fn collect(&self, rm: &mut ResourceMetrics) -> OTelSdkResult {
        self.0.collect(rm)
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.0.force_flush()
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.0.shutdown_with_timeout(timeout)
    }

    fn temporality(&self, _kind: InstrumentKind) -> Temporality {
        Temporality::Cumulative
    }
}

/// One sample's value.
#[derive(Debug, Clone, PartialEq)]
enum Value {
    Int(i64),
    Uint(u64),
    Float(f64),
    /// A histogram: the sum and count of what was recorded, and each bucket's upper bound with
    /// what fell in it alone (not cumulative), the last bound `+Inf`.
    Histogram {
        sum: f64,
        count: u64,
        buckets: Vec<(f64, u64)>,
    },
}

/// A sample's labels, sorted by key, and its value.
type Sample = (Vec<(String, String)>, Value);

/// The Prometheus type of a family.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Counter,
    Gauge,
    Histogram,
}

/// One metric family: its Prometheus base name (without `_total`), help, type and samples
/// (labels sorted by key).
#[derive(Debug, Clone, PartialEq)]
struct Family {
    name: String,
    help: String,
    kind: Kind,
    samples: Vec<Sample>,
}

/// The collected metrics as families, by name (two scopes exporting one name are merged into
/// one family, as the text format requires).
fn families(rm: &ResourceMetrics) -> Vec<Family> {
    let mut out: BTreeMap<String, Family> = BTreeMap::new();
    for sm in rm.scope_metrics() {
        for m in sm.metrics() {
            let Some((kind, samples)) = samples(m.data()) else {
                continue;
            };
            let name = format!("{}{}", sanitize(m.name()), unit_suffix(m.unit()));
            let family = out.entry(name.clone()).or_insert_with(|| Family {
                name,
                help: m.description().to_owned(),
                kind,
                samples: Vec::new(),
            });
            if family.kind == kind {
                family.samples.extend(samples);
            }
        }
    }
    out.into_values().collect()
}

/// The family type of `data`, and its samples; `None` for exponential histograms, which door
/// does not record.
fn samples(data: &AggregatedMetrics) -> Option<(Kind, Vec<Sample>)> {
    fn of<T: Copy>(
        data: &MetricData<T>,
        value: fn(T) -> Value,
        float: fn(T) -> f64,
    ) -> Option<(Kind, Vec<Sample>)> {
        match data {
            MetricData::Sum(sum) => Some((
                if sum.is_monotonic() {
                    Kind::Counter
                } else {
                    Kind::Gauge
                },
                sum.data_points()
                    .map(|p| (labels(p.attributes()), value(p.value())))
                    .collect(),
            )),
            MetricData::Gauge(gauge) => Some((
                Kind::Gauge,
                gauge
                    .data_points()
                    .map(|p| (labels(p.attributes()), value(p.value())))
                    .collect(),
            )),
            MetricData::Histogram(h) => Some((
                Kind::Histogram,
                h.data_points()
                    .map(|p| {
                        // One count more than bounds: the last bucket is everything above.
                        let bounds = p.bounds().chain(core::iter::once(f64::INFINITY));
                        let histogram = Value::Histogram {
                            sum: float(p.sum()),
                            count: p.count(),
                            buckets: bounds.zip(p.bucket_counts()).collect(),
                        };
                        (labels(p.attributes()), histogram)
                    })
                    .collect(),
            )),
            MetricData::ExponentialHistogram(_) => None,
        }
    }
    #[expect(
        clippy::cast_precision_loss,
        reason = "a histogram's sum as the text format's float; door records f64 histograms only"
    )]
    match data {
        AggregatedMetrics::U64(d) => of(d, Value::Uint, |v| v as f64),
        AggregatedMetrics::I64(d) => of(d, Value::Int, |v| v as f64),
        AggregatedMetrics::F64(d) => of(d, Value::Float, |v| v),
    }
}

fn labels<'a>(attrs: impl Iterator<Item = &'a KeyValue>) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = attrs
        .map(|kv| (sanitize(kv.key.as_str()), kv.value.as_str().into_owned()))
        .collect();
    out.sort();
    out
}

/// An OpenTelemetry name as a Prometheus name: every character outside `[a-zA-Z0-9_:]` becomes
/// `_`, and a leading digit gets a `_` in front.
pub fn sanitize(name: &str) -> String {
    let mut out: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == ':' {
                c
            } else {
                '_'
            }
        })
        .collect();
    if out.starts_with(|c: char| c.is_ascii_digit()) {
        out.insert(0, '_');
    }
    out
}

/// The name suffix of a unit: `_seconds`, `_milliseconds`, `_bytes`; nothing for annotations
/// (`{request}`) and units Prometheus has no name for.
fn unit_suffix(unit: &str) -> &'static str {
    match unit {
        "s" => "_seconds",
        "ms" => "_milliseconds",
        "By" => "_bytes",
        _ => "",
    }
}

/// One scrape's families, handed to the encoder.
#[derive(Debug)]
struct Snapshot(Vec<Family>);

impl Collector for Snapshot {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        for f in &self.0 {
            let kind = match f.kind {
                Kind::Counter => MetricType::Counter,
                Kind::Gauge => MetricType::Gauge,
                Kind::Histogram => MetricType::Histogram,
            };
            let mut metric = encoder.encode_descriptor(&f.name, &f.help, None, kind)?;
            for (labels, value) in &f.samples {
                let mut sample = metric.encode_family(labels)?;
                match (f.kind, value) {
                    (Kind::Counter, Value::Uint(v)) => {
                        sample.encode_counter::<NoLabelSet, _, f64>(v, None)?;
                    }
                    (Kind::Counter, Value::Int(v)) => sample.encode_counter::<NoLabelSet, _, f64>(
                        &u64::try_from(*v).unwrap_or(0),
                        None,
                    )?,
                    (Kind::Counter, Value::Float(v)) => {
                        sample.encode_counter::<NoLabelSet, _, f64>(v, None)?;
                    }
                    (_, Value::Uint(v)) => sample.encode_gauge(v)?,
                    (_, Value::Int(v)) => sample.encode_gauge(v)?,
                    (_, Value::Float(v)) => sample.encode_gauge(v)?,
                    (
                        _,
                        Value::Histogram {
                            sum,
                            count,
                            buckets,
                        },
                    ) => sample.encode_histogram::<NoLabelSet>(*sum, *count, buckets, None)?,
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use opentelemetry::metrics::MeterProvider as _;
    use opentelemetry_sdk::metrics::SdkMeterProvider;

    use super::*;

    #[test]
    fn names_labels_and_types_follow_the_otel_mapping() {
        let exposition = Exposition::new();
        let provider = SdkMeterProvider::builder()
            .with_reader(exposition.reader())
            .build();
        let meter = provider.meter("door");
        let requests = meter
            .u64_counter("door.requests")
            .with_description("Requests")
            .with_unit("{request}")
            .build();
        requests.add(
            3,
            &[
                KeyValue::new("door.group", "link"),
                KeyValue::new("door.outcome", "ok"),
            ],
        );
        let inflight = meter.i64_up_down_counter("door.inflight").build();
        inflight.add(2, &[KeyValue::new("door.group", "link")]);
        inflight.add(-1, &[KeyValue::new("door.group", "link")]);
        let _gauge = meter
            .u64_observable_gauge("door.xdp.tracked_prefixes")
            .with_callback(|o| o.observe(7, &[]))
            .build();
        let text = exposition.render().unwrap();
        assert!(
            text.contains("# TYPE door_requests_total counter\n"),
            "{text}"
        );
        assert!(
            text.contains("door_requests_total{door_group=\"link\",door_outcome=\"ok\"} 3\n"),
            "{text}"
        );
        assert!(text.contains("# TYPE door_inflight gauge\n"), "{text}");
        assert!(
            text.contains("door_inflight{door_group=\"link\"} 1\n"),
            "{text}"
        );
        assert!(text.contains("door_xdp_tracked_prefixes 7\n"), "{text}");
        assert!(!text.contains("otel_scope"), "{text}");
        assert!(!text.contains("target_info"), "{text}");
        // A scrape does not reset anything: cumulative.
        assert_eq!(exposition.render().unwrap(), text);
    }

    #[test]
    fn sanitize_replaces_what_prometheus_refuses() {
        assert_eq!(sanitize("door.xdp.packets"), "door_xdp_packets");
        assert_eq!(sanitize("a-b/c"), "a_b_c");
        assert_eq!(sanitize("9lives"), "_9lives");
        assert_eq!(unit_suffix("{request}"), "");
        assert_eq!(unit_suffix("s"), "_seconds");
    }

    /// A histogram (the cluster's `door.cluster.sync_duration`, in seconds) is exposed as one:
    /// `_bucket` lines with cumulative counts up to `+Inf`, `_sum` and `_count`.
    #[test]
    fn histograms_are_exposed_with_cumulative_buckets() {
        let exposition = Exposition::new();
        let provider = SdkMeterProvider::builder()
            .with_reader(exposition.reader())
            .build();
        let duration = provider
            .meter("door")
            .f64_histogram("door.cluster.sync_duration")
            .with_unit("s")
            .with_boundaries(vec![0.01, 0.1])
            .build();
        for v in [0.005, 0.05, 0.07, 3.0] {
            duration.record(v, &[]);
        }
        let text = exposition.render().unwrap();
        for line in [
            "# TYPE door_cluster_sync_duration_seconds histogram\n",
            "door_cluster_sync_duration_seconds_bucket{le=\"0.01\"} 1\n",
            "door_cluster_sync_duration_seconds_bucket{le=\"0.1\"} 3\n",
            "door_cluster_sync_duration_seconds_bucket{le=\"+Inf\"} 4\n",
            "door_cluster_sync_duration_seconds_sum 3.125\n",
            "door_cluster_sync_duration_seconds_count 4\n",
        ] {
            assert!(text.contains(line), "no {line:?} in:\n{text}");
        }
    }

    #[test]
    fn an_unregistered_reader_is_an_error_not_a_panic() {
        let exposition = Exposition::new();
        assert!(exposition.render().is_err());
    }
}
