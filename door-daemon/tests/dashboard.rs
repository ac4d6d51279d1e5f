//! `packaging/grafana/door.json` cannot drift from the metrics: every metric name its PromQL
//! expressions (panels and variables) use is one that door's `GET /metrics` shows after some
//! traffic, and every label it groups or filters by is one those metrics carry (or `instance` and
//! `job`, which Prometheus adds). A renamed metric or label fails here.

#![expect(
    clippy::unwrap_used,
    clippy::panic,
    reason = "test helpers outside #[test] functions fail loudly by design"
)]
#![expect(
    clippy::indexing_slicing,
    reason = "serde_json's Index answers Null for a missing key; token slices are in bounds"
)]

mod support;

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::Arc,
    time::Duration,
};

use door_common::Counter;
use door_daemon::shield::{CookieSummary, CounterValue, ShieldError, XdpReadings};
use http::StatusCode;
use serde_json::Value;
use support::{Door, config, request, samples, upstream};

/// Fixed XDP readings, as a loaded shield would report them.
struct FakeXdp;

impl XdpReadings for FakeXdp {
    fn counters(&self) -> Result<Vec<CounterValue>, ShieldError> {
        Ok(Counter::ALL
            .iter()
            .zip(1..)
            .map(|(c, n)| CounterValue {
                counter: *c,
                packets: n,
            })
            .collect())
    }

    fn tracked_prefixes(&self) -> Result<usize, ShieldError> {
        Ok(3)
    }

    fn cookies(&self) -> Result<CookieSummary, ShieldError> {
        Ok(CookieSummary {
            active_cpus: 1,
            entered: 2,
            left: 1,
        })
    }
}

fn dashboard() -> Value {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../packaging/grafana/door.json"
    );
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {path}: {e}"));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path} is not JSON: {e}"))
}

/// Every PromQL expression of the dashboard: panel targets (rows' panels included) and query
/// variables (`label_values(EXPR, LABEL)` gives EXPR, and LABEL as a label use).
fn expressions(d: &Value) -> (Vec<String>, BTreeSet<String>) {
    fn walk(panels: &Value, out: &mut Vec<String>) {
        for p in panels.as_array().into_iter().flatten() {
            for t in p["targets"].as_array().into_iter().flatten() {
                if let Some(e) = t["expr"].as_str() {
                    out.push(e.to_owned());
                }
            }
            walk(&p["panels"], out);
        }
    }
    let mut exprs = Vec::new();
    walk(&d["panels"], &mut exprs);
    let mut labels = BTreeSet::new();
    for v in d["templating"]["list"].as_array().into_iter().flatten() {
        if v["type"] != "query" {
            continue;
        }
        let q = v["query"]["query"]
            .as_str()
            .or_else(|| v["query"].as_str())
            .unwrap();
        let inner = q
            .strip_prefix("label_values(")
            .and_then(|r| r.strip_suffix(')'))
            .unwrap_or_else(|| panic!("variable query {q:?} is not label_values(EXPR, LABEL)"));
        let (expr, label) = inner.rsplit_once(',').unwrap();
        exprs.push(expr.trim().to_owned());
        labels.insert(label.trim().to_owned());
    }
    (exprs, labels)
}

/// The metric names and label names one PromQL expression uses. A small tokenizer, enough for
/// PromQL as dashboards write it: strings, range and subquery brackets and Grafana variables are
/// skipped; an identifier followed by `(` is a function, an aggregation's name is not a metric
/// either; `by`, `without`, `on`,
/// `ignoring`, `group_left` and `group_right` are followed by a list of labels; inside `{…}`,
/// the identifiers before an operator are labels.
fn names(expr: &str) -> (BTreeSet<String>, BTreeSet<String>) {
    // Binary keywords, and aggregations (which may be followed by `by (…)` instead of `(`).
    const KEYWORDS: [&str; 18] = [
        "bool",
        "offset",
        "and",
        "or",
        "unless",
        "atan2",
        "sum",
        "min",
        "max",
        "avg",
        "group",
        "stddev",
        "stdvar",
        "count",
        "count_values",
        "bottomk",
        "topk",
        "quantile",
    ];
    const LABEL_LISTS: [&str; 6] = [
        "by",
        "without",
        "on",
        "ignoring",
        "group_left",
        "group_right",
    ];
    let chars: Vec<char> = expr.chars().collect();
    let (mut metrics, mut labels) = (BTreeSet::new(), BTreeSet::new());
    let mut i = 0;
    let mut in_braces = false;
    let mut in_list = false;
    let ident = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == ':';
    while let Some(&c) = chars.get(i) {
        match c {
            '"' | '\'' | '`' => {
                i += 1;
                while chars.get(i).is_some_and(|&d| d != c) {
                    if chars.get(i) == Some(&'\\') {
                        i += 1;
                    }
                    i += 1;
                }
                i += 1;
            }
            '[' => {
                while chars.get(i).is_some_and(|&d| d != ']') {
                    i += 1;
                }
                i += 1;
            }
            '$' => {
                i += 1;
                while chars
                    .get(i)
                    .is_some_and(|&d| ident(d) || d == '{' || d == '}')
                {
                    i += 1;
                }
            }
            '{' => {
                in_braces = true;
                i += 1;
            }
            '}' => {
                in_braces = false;
                i += 1;
            }
            ')' => {
                in_list = false;
                i += 1;
            }
            c if c.is_ascii_alphabetic() || c == '_' => {
                let start = i;
                while chars.get(i).is_some_and(|&d| ident(d)) {
                    i += 1;
                }
                let word: String = chars[start..i].iter().collect();
                let mut j = i;
                while chars.get(j).is_some_and(|d| d.is_whitespace()) {
                    j += 1;
                }
                let call = chars.get(j) == Some(&'(');
                if in_braces || in_list {
                    labels.insert(word);
                } else if LABEL_LISTS.contains(&word.as_str()) {
                    in_list = call;
                    i = j + 1;
                } else if !call && !KEYWORDS.contains(&word.as_str()) {
                    metrics.insert(word);
                }
            }
            _ => i += 1,
        }
    }
    (metrics, labels)
}

#[test]
fn the_tokenizer_finds_metrics_and_labels() {
    let (m, l) = names(
        r#"sum by (door_group, door_outcome) (rate(door_requests_total{instance=~"$instance", door_outcome=~"a|b"}[$__rate_interval])) / on(door_group) door_inflight_cap"#,
    );
    assert_eq!(
        m,
        BTreeSet::from(["door_requests_total".into(), "door_inflight_cap".into()])
    );
    assert_eq!(
        l,
        BTreeSet::from([
            "door_group".into(),
            "door_outcome".into(),
            "instance".into()
        ])
    );
}

#[tokio::test(start_paused = true)]
async fn every_metric_and_label_the_dashboard_uses_is_one_door_exports() {
    let up = upstream().await;
    // health: one row of burst 1 refilled in 1 ms, so a second client evicts the first.
    let door = Door::start(&config(
        up,
        "[group.health]\nrate = 1000.0\nburst = 1\nper_client = 1\nmax_clients = 1\n",
    ))
    .await;
    let _xdp = door_daemon::shield::observe_readings(&door.telemetry.meter(), Arc::new(FakeXdp));
    let admin = door.admin().await;
    for _ in 0..5 {
        door.get("/l/session/abc", "198.51.100.7").await;
    }
    assert_eq!(door.get("/events", "198.51.100.8").await, StatusCode::OK);
    assert_eq!(door.get("/healthz", "198.51.100.1").await, StatusCode::OK);
    tokio::time::advance(Duration::from_millis(20)).await;
    assert_eq!(door.get("/healthz", "198.51.100.2").await, StatusCode::OK);
    let (status, text) = request(admin, "GET", "/metrics", &[], "").await;
    assert_eq!(status, StatusCode::OK);

    // What door exports: series name → label names.
    let mut exported: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for s in samples(&text) {
        exported
            .entry(s.name)
            .or_default()
            .extend(s.labels.into_iter().map(|(k, _)| k));
    }

    let d = dashboard();
    assert_eq!(d["templating"]["list"][0]["type"], "datasource");
    assert_eq!(d["templating"]["list"][0]["query"], "prometheus");
    let (exprs, mut labels) = expressions(&d);
    assert!(exprs.len() >= 10, "{exprs:?}");
    let mut metrics = BTreeSet::new();
    for e in &exprs {
        let (m, l) = names(e);
        assert!(!m.is_empty(), "no metric in {e:?}");
        metrics.extend(m);
        labels.extend(l);
    }
    for m in &metrics {
        assert!(
            exported.contains_key(m),
            "the dashboard uses {m}, which door does not export: {:?}",
            exported.keys().collect::<Vec<_>>()
        );
    }
    let carried: BTreeSet<&String> = metrics.iter().flat_map(|m| &exported[m]).collect();
    for l in &labels {
        assert!(
            l == "instance" || l == "job" || carried.contains(l),
            "the dashboard uses the label {l}, which no metric it reads carries: {carried:?}"
        );
    }
    // The panels the dashboard promises.
    for m in [
        "door_requests_total",
        "door_inflight",
        "door_inflight_cap",
        "door_clients",
        "door_streams",
        "door_passthrough_inflight",
        "door_passthrough_refused_total",
        "door_requests_failed_total",
        "door_requests_refused_total",
        "door_xdp_packets_total",
        "door_xdp_tracked_prefixes",
        "door_xdp_cookie_mode_total",
    ] {
        assert!(metrics.contains(m), "no panel reads {m}");
    }
    // Every panel that queries reads through the datasource variable.
    for p in d["panels"].as_array().unwrap() {
        if p["type"] != "row" && p["type"] != "text" {
            assert_eq!(p["datasource"]["uid"], "${datasource}", "{}", p["title"]);
        }
    }
}
