//! The shield's instruments (docs/design.md, "Observability"): `door.xdp.packets` from the
//! per-CPU verdict counters, `door.xdp.tracked_prefixes`, and `door.xdp.cookie_mode` (cookie
//! mode's entered/left events), read from the maps at each collection.

use std::{
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

use opentelemetry::{
    KeyValue,
    metrics::{Meter, ObservableCounter, ObservableGauge},
};

use door_common::Counter;

use super::{CookieSummary, CounterValue, Shield, ShieldError};
use crate::obs::logging::RateLimitedWarn;

/// What the shield's instruments read at each collection: the loaded [`Shield`] in production
/// (behind its mutex), fixed values in tests of the exposition.
pub trait XdpReadings: Send + Sync + 'static {
    /// Every counter, summed over CPUs, in [`Counter::ALL`] order.
    ///
    /// # Errors
    /// [`ShieldError::Map`] if the counters cannot be read.
    fn counters(&self) -> Result<Vec<CounterValue>, ShieldError>;
    /// Prefixes in the per-prefix LRU map.
    ///
    /// # Errors
    /// [`ShieldError::Map`] if the map cannot be read.
    fn tracked_prefixes(&self) -> Result<usize, ShieldError>;
    /// Cookie mode across CPUs (events entered and left, CPUs in it). Readings without cookie
    /// mode report none.
    ///
    /// # Errors
    /// [`ShieldError::Map`] if the cookie-mode map cannot be read.
    fn cookies(&self) -> Result<CookieSummary, ShieldError> {
        Ok(CookieSummary::default())
    }
}

impl XdpReadings for Mutex<Shield> {
    fn counters(&self) -> Result<Vec<CounterValue>, ShieldError> {
        self.lock()
            .unwrap_or_else(PoisonError::into_inner)
            .counters()
    }

    fn tracked_prefixes(&self) -> Result<usize, ShieldError> {
        self.lock()
            .unwrap_or_else(PoisonError::into_inner)
            .tracked_prefixes()
    }

    fn cookies(&self) -> Result<CookieSummary, ShieldError> {
        self.lock()
            .unwrap_or_else(PoisonError::into_inner)
            .cookies()
    }
}

/// The shield's OpenTelemetry instruments; they report for as long as this value lives.
#[derive(Debug)]
pub struct ShieldInstruments {
    _packets: ObservableCounter<u64>,
    _tracked: ObservableGauge<u64>,
    _cookie_mode: ObservableCounter<u64>,
}

/// Attribute of `door.xdp.cookie_mode`: `entered` or `left`.
pub const ATTR_EVENT: &str = "door.xdp.event";

/// Attribute of `door.xdp.packets`: `pass` or `drop`.
pub const ATTR_VERDICT: &str = "door.xdp.verdict";
/// Attribute of `door.xdp.packets`: the reason ([`Counter::reason`]: `syn`, `syn_budget`, …).
pub const ATTR_REASON: &str = "door.xdp.reason";

/// An unreadable map fails at every collection: one warning line per 10 minutes, with the count.
static COUNTERS_UNREADABLE: RateLimitedWarn = RateLimitedWarn::new(Duration::from_mins(10));
/// As [`COUNTERS_UNREADABLE`], for the prefix map.
static PREFIXES_UNREADABLE: RateLimitedWarn = RateLimitedWarn::new(Duration::from_mins(10));
/// As [`COUNTERS_UNREADABLE`], for the cookie-mode map.
static COOKIES_UNREADABLE: RateLimitedWarn = RateLimitedWarn::new(Duration::from_mins(10));

/// Registers the shield's instruments on `meter`, read from the maps at each collection:
///
/// - `door.xdp.packets` (observable counter, `{packet}`): every packet the XDP program saw, by
///   `door.xdp.verdict` and `door.xdp.reason` (the per-CPU counters, summed);
/// - `door.xdp.tracked_prefixes` (observable gauge, `{prefix}`): entries in the per-prefix map;
/// - `door.xdp.cookie_mode` (observable counter, `{event}`): times a CPU entered or left cookie
///   mode, by `door.xdp.event` (`entered`, `left`), summed over CPUs. The SYN-ACKs sent with a
///   cookie are `door.xdp.packets` with verdict `tx`, reason `syn_cookie`.
///
/// A map that cannot be read is logged (at most once per 10 minutes) and reports nothing for that
/// collection.
pub fn observe(meter: &Meter, shield: &Arc<Mutex<Shield>>) -> ShieldInstruments {
    observe_readings(meter, Arc::clone(shield) as Arc<dyn XdpReadings>)
}

/// As [`observe`], reading from `source`.
pub fn observe_readings(meter: &Meter, source: Arc<dyn XdpReadings>) -> ShieldInstruments {
    let attrs: Vec<[KeyValue; 2]> = Counter::ALL
        .iter()
        .map(|c| {
            [
                KeyValue::new(ATTR_VERDICT, c.verdict().as_str()),
                KeyValue::new(ATTR_REASON, c.reason()),
            ]
        })
        .collect();
    let for_packets = Arc::clone(&source);
    let packets = meter
        .u64_observable_counter("door.xdp.packets")
        .with_description("Packets seen by the XDP flood shield, by verdict and reason")
        .with_unit("{packet}")
        .with_callback(move |observer| {
            match for_packets.counters() {
                Ok(values) => {
                    for (value, attrs) in values.iter().zip(&attrs) {
                        observer.observe(value.packets, attrs);
                    }
                }
                Err(e) => {
                    if let Some(suppressed) = COUNTERS_UNREADABLE.due() {
                        tracing::warn!(error = %e, suppressed, "reading the XDP counters (at most one line per 10 min)");
                    }
                }
            }
        })
        .build();
    let for_tracked = Arc::clone(&source);
    let tracked = meter
        .u64_observable_gauge("door.xdp.tracked_prefixes")
        .with_description("Source prefixes the XDP flood shield tracks in its LRU map")
        .with_unit("{prefix}")
        .with_callback(move |observer| {
            match for_tracked.tracked_prefixes() {
                Ok(n) => observer.observe(u64::try_from(n).unwrap_or(u64::MAX), &[]),
                Err(e) => {
                    if let Some(suppressed) = PREFIXES_UNREADABLE.due() {
                        tracing::warn!(error = %e, suppressed, "reading the XDP prefix map (at most one line per 10 min)");
                    }
                }
            }
        })
        .build();
    let for_cookies = source;
    let cookie_mode = meter
        .u64_observable_counter("door.xdp.cookie_mode")
        .with_description("Times a CPU entered or left the XDP flood shield's cookie mode")
        .with_unit("{event}")
        .with_callback(move |observer| {
            match for_cookies.cookies() {
                Ok(c) => {
                    observer.observe(c.entered, &[KeyValue::new(ATTR_EVENT, "entered")]);
                    observer.observe(c.left, &[KeyValue::new(ATTR_EVENT, "left")]);
                }
                Err(e) => {
                    if let Some(suppressed) = COOKIES_UNREADABLE.due() {
                        tracing::warn!(error = %e, suppressed, "reading the XDP cookie-mode map (at most one line per 10 min)");
                    }
                }
            }
        })
        .build();
    ShieldInstruments {
        _packets: packets,
        _tracked: tracked,
        _cookie_mode: cookie_mode,
    }
}
