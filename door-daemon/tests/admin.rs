//! The admin listener in-process: `GET /metrics` (the Prometheus text exposition of every door
//! instrument, bounded labels only) beside `GET /status`.

mod support;

use std::collections::BTreeSet;

use http::StatusCode;
use support::{Door, config, request, samples, upstream};

/// The label keys door's series may carry: bounded by construction, never a client.
const BOUNDED_LABELS: [&str; 5] = [
    "door_group",
    "door_outcome",
    "door_reason",
    "door_xdp_verdict",
    "door_xdp_reason",
];

#[tokio::test]
async fn metrics_exposes_every_instrument_with_prometheus_names_and_bounded_labels() {
    let door = Door::start(&config(upstream().await, "")).await;
    let admin = door.admin().await;
    for _ in 0..5 {
        door.get("/l/session/abc", "198.51.100.7").await;
    }
    assert_eq!(
        door.get("/l/session/missing", "198.51.100.8").await,
        StatusCode::NOT_FOUND
    );
    assert_eq!(door.get("/healthz", "198.51.100.9").await, StatusCode::OK);
    assert_eq!(door.get("/events", "198.51.100.9").await, StatusCode::OK);

    let (status, text) = request(admin, "GET", "/metrics", &[], "").await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let samples = samples(&text);
    let value = |name: &str, labels: &[(&str, &str)]| {
        samples
            .iter()
            .find(|s| {
                s.name == name
                    && labels
                        .iter()
                        .all(|(k, v)| s.labels.iter().any(|(lk, lv)| lk == k && lv == v))
            })
            .map(|s| s.value.clone())
    };
    let link = ("door_group", "link");
    assert_eq!(
        value("door_requests_total", &[link, ("door_outcome", "ok")]).as_deref(),
        Some("4"),
        "{text}"
    );
    assert_eq!(
        value(
            "door_requests_total",
            &[link, ("door_outcome", "rate_limited")]
        )
        .as_deref(),
        Some("2"),
        "{text}"
    );
    assert_eq!(
        value(
            "door_requests_total",
            &[link, ("door_outcome", "client_error")]
        )
        .as_deref(),
        Some("1"),
        "{text}"
    );
    assert_eq!(
        value("door_inflight", &[link]).as_deref(),
        Some("0"),
        "{text}"
    );
    assert_eq!(
        value("door_inflight_cap", &[link]).as_deref(),
        Some("4"),
        "{text}"
    );
    assert_eq!(
        value("door_clients", &[link]).as_deref(),
        Some("3"),
        "{text}"
    );
    assert_eq!(
        value("door_max_clients", &[link]).as_deref(),
        Some("16384"),
        "{text}"
    );
    assert_eq!(
        value("door_streams", &[link]).as_deref(),
        Some("0"),
        "{text}"
    );
    assert!(
        value("door_requests_total", &[("door_group", "health")]).is_some(),
        "{text}"
    );

    // Counters end in _total, and every family is typed.
    for line in text.lines().filter(|l| l.starts_with("# TYPE ")) {
        let mut parts = line.split(' ').skip(2);
        let (name, kind) = (parts.next().unwrap(), parts.next().unwrap());
        assert!(name.starts_with("door_"), "{line}");
        assert_eq!(kind == "counter", name.ends_with("_total"), "{line}");
    }
    // Bounded labels only: no client address anywhere, no label outside the known keys.
    assert!(!text.contains("198.51.100"), "{text}");
    let keys: BTreeSet<String> = samples
        .iter()
        .flat_map(|s| s.labels.iter().map(|(k, _)| k.clone()))
        .collect();
    for k in &keys {
        assert!(BOUNDED_LABELS.contains(&k.as_str()), "label {k} in {text}");
    }

    // /status still answers, and other methods and paths are refused with JSON.
    let (status, body) = request(admin, "GET", "/status", &[], "").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (status, _) = request(admin, "POST", "/metrics", &[], "").await;
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
    let (status, body) = request(admin, "GET", "/nope", &[], "").await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
}

#[tokio::test]
async fn metrics_content_type_is_the_prometheus_text_format() {
    let door = Door::start(&config(upstream().await, "")).await;
    let admin = door.admin().await;
    let s = tokio::net::TcpStream::connect(admin).await.unwrap();
    let (mut send, conn) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(s))
        .await
        .unwrap();
    tokio::spawn(conn);
    let res = send
        .send_request(
            http::Request::get("/metrics")
                .header("host", "admin")
                .body(http_body_util::Empty::<bytes::Bytes>::new())
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(
        res.headers()["content-type"],
        "text/plain; version=0.0.4; charset=utf-8"
    );
}
