//! The admin listener in-process: `GET /metrics` (the Prometheus text exposition of every door
//! instrument, bounded labels only) beside `GET /status`; the operator's endpoints (`/clients`,
//! `/blocks`) with their happy paths and bad inputs; HEAD wherever GET is served; the listener on a
//! Unix socket; the connection bounds (head and body deadlines, the idle keep-alive bound, the
//! cap on connections), on tokio's paused clock where time must pass.

#![expect(
    clippy::unwrap_used,
    clippy::panic,
    clippy::indexing_slicing,
    reason = "test helpers fail loudly; serde_json's Index answers Null for a missing key"
)]

mod support;

use std::{collections::BTreeSet, os::unix::fs::PermissionsExt as _, sync::Arc, time::Duration};

use door_daemon::obs::metrics::Outcome;
use http::StatusCode;
use serde_json::Value;
use support::{Door, FakeBlocklist, config, request, request_unix, samples, upstream};
use tokio::{
    io::{AsyncReadExt as _, AsyncWriteExt as _},
    net::{TcpListener, TcpStream},
};

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

/// Over-budget health probes are answered from the cache, never refused: `/clients` shows no
/// rejection for their prober (`door top` ranks clients by it), only their tokens spent.
#[tokio::test]
async fn cached_health_answers_are_not_rejections() {
    let cfg = config(upstream().await, "[group.health]\nrate = 0.001\nburst = 1");
    let door = Door::start(&cfg).await;
    let admin = door.admin().await;
    for _ in 0..4 {
        assert_eq!(door.get("/healthz", "198.51.100.9").await, StatusCode::OK);
    }
    let (status, body) = request(admin, "GET", "/clients?group=health", &[], "").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let v = json(&body);
    let client = &v["groups"][0]["clients"][0];
    assert_eq!(client["key"], "198.51.100.9/32", "{body}");
    assert_eq!(client["spent"], 1, "{body}");
    assert_eq!(client["rejections"], 0, "{body}");
}

/// A quiet door's groups and outcomes are on `/metrics` from the start, at 0: dashboards list
/// their groups from `door_requests_total`, and `rate()` sees the first increment. So are the
/// counters of things that have not happened yet: `door.evictions` per group,
/// `door.untrusted_xff`, `door.allowed`, `door.denied` and `door.escalations`, and
/// `door.passthrough_refused` per cap, and `door.requests_failed` and `door.requests_refused` per
/// reason; `door.passthrough_inflight` is 0.
#[tokio::test]
async fn metrics_list_every_group_and_outcome_of_a_quiet_door() {
    let door = Door::start(&config(upstream().await, "")).await;
    let admin = door.admin().await;
    let (status, text) = request(admin, "GET", "/metrics", &[], "").await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let samples = samples(&text);
    // The sample `name` with exactly `labels` reads 0.
    let at_zero = |name: &str, labels: &[(&str, &str)]| {
        let labels: Vec<(String, String)> = labels
            .iter()
            .map(|&(k, v)| (k.to_owned(), v.to_owned()))
            .collect();
        let found = samples
            .iter()
            .find(|s| s.name == name && s.labels == labels);
        assert_eq!(
            found.map(|s| s.value.as_str()),
            Some("0"),
            "{name} {labels:?}:\n{text}"
        );
    };
    for group in ["link", "health"] {
        for outcome in Outcome::ALL {
            at_zero(
                "door_requests_total",
                &[("door_group", group), ("door_outcome", outcome.as_str())],
            );
        }
        at_zero("door_evictions_total", &[("door_group", group)]);
    }
    for name in [
        "door_untrusted_xff_total",
        "door_allowed_total",
        "door_denied_total",
        "door_escalations_total",
        "door_passthrough_inflight",
    ] {
        at_zero(name, &[]);
    }
    for reason in ["upstream_max_inflight", "upstream_max_inflight_per_client"] {
        at_zero("door_passthrough_refused_total", &[("door_reason", reason)]);
    }
    for reason in door_daemon::http::answer::Failure::REASONS {
        at_zero("door_requests_failed_total", &[("door_reason", reason)]);
    }
    for reason in door_daemon::http::head::HeadError::REASONS {
        at_zero("door_requests_refused_total", &[("door_reason", reason)]);
    }
}

/// `/status` shows the pass-through caps (routes in no group): the caps, the requests holding a
/// slot now, and the refusals per cap, which an operator who sees 503 `upstream-busy` reads to
/// tell the door-wide cap from one client's.
#[tokio::test]
async fn status_shows_the_pass_through_caps_what_they_hold_and_what_they_refused() {
    // An upstream that reads a request and never answers: the first request holds its slot.
    let silent = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let up = silent.local_addr().unwrap();
    let (reached, arrived) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let (mut s, _) = silent.accept().await.unwrap();
        let mut buf = [0u8; 1024];
        let _ = s.read(&mut buf).await;
        let _ = reached.send(());
        // Held open, unanswered, until the test ends.
        let _ = s.read(&mut buf).await;
    });
    let mut cfg = config(up, "");
    cfg.upstream_max_inflight = 1;
    cfg.upstream_max_inflight_per_client = 1;
    let door = Door::start(&cfg).await;
    let admin = door.admin().await;
    let status = || async {
        let (status, body) = request(admin, "GET", "/status", &[], "").await;
        assert_eq!(status, StatusCode::OK, "{body}");
        json(&body)["passthrough"].clone()
    };
    let quiet = status().await;
    assert_eq!(quiet["cap"], 1, "{quiet}");
    assert_eq!(quiet["per_client_cap"], 1, "{quiet}");
    assert_eq!(quiet["inflight"], 0, "{quiet}");
    assert_eq!(quiet["refused"]["upstream_max_inflight"], 0, "{quiet}");
    assert_eq!(
        quiet["refused"]["upstream_max_inflight_per_client"], 0,
        "{quiet}"
    );

    let front = door.addr;
    let held = tokio::spawn(async move {
        request(
            front,
            "GET",
            "/pass/held",
            &[("x-forwarded-for", "198.51.100.1")],
            "",
        )
        .await
    });
    arrived.await.unwrap();
    // The same client again: its own cap; another client: the door-wide cap.
    assert_eq!(
        door.get("/pass/again", "198.51.100.1").await,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(
        door.get("/pass/other", "198.51.100.2").await,
        StatusCode::SERVICE_UNAVAILABLE
    );
    assert_eq!(
        door.get("/pass/other", "198.51.100.3").await,
        StatusCode::SERVICE_UNAVAILABLE
    );
    let busy = status().await;
    assert_eq!(busy["inflight"], 1, "{busy}");
    assert_eq!(busy["named_clients"], 1, "{busy}");
    assert_eq!(busy["refused"]["upstream_max_inflight"], 2, "{busy}");
    assert_eq!(
        busy["refused"]["upstream_max_inflight_per_client"], 1,
        "{busy}"
    );
    held.abort();
}

#[tokio::test]
async fn metrics_content_type_is_the_prometheus_text_format() {
    let door = Door::start(&config(upstream().await, "")).await;
    let admin = door.admin().await;
    let s = TcpStream::connect(admin).await.unwrap();
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

fn json(body: &str) -> Value {
    serde_json::from_str(body).unwrap_or_else(|e| panic!("not JSON ({e}): {body}"))
}

/// A refusal: `status`, JSON `{"code", "message"}` with `code`, and a message containing `names`.
/// The field a `POST` to the admin API must carry.
const JSON: &[(&str, &str)] = &[("content-type", "application/json")];

async fn refused(
    admin: std::net::SocketAddr,
    method: &str,
    target: &str,
    body: &str,
    status: StatusCode,
    code: &str,
    names: &str,
) {
    let headers: &[(&str, &str)] = if method == "POST" { JSON } else { &[] };
    let (got, text) = request(admin, method, target, headers, body).await;
    assert_eq!(got, status, "{method} {target}: {text}");
    let v = json(&text);
    assert_eq!(v["code"], code, "{method} {target}: {text}");
    assert!(
        v["message"].as_str().unwrap().contains(names),
        "{method} {target}: {text} does not name {names:?}"
    );
}

#[tokio::test]
async fn clients_lists_the_most_rejected_keys_and_forget_starts_them_afresh() {
    let door = Door::start(&config(upstream().await, "")).await;
    let admin = door.admin().await;
    // 198.51.100.7: 3 admitted, 2 refused; .8: 1 admitted; 2001:db8:1:2::5: 2 admitted.
    for _ in 0..5 {
        door.get("/l/session/abc", "198.51.100.7").await;
    }
    door.get("/l/session/abc", "198.51.100.8").await;
    for _ in 0..2 {
        door.get("/l/session/abc", "2001:db8:1:2::5").await;
    }

    let (status, body) = request(admin, "GET", "/clients?group=link&top=2", &[], "").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let v = json(&body);
    let groups = v["groups"].as_array().unwrap();
    assert_eq!(groups.len(), 1, "{body}");
    let link = &groups[0];
    assert_eq!(link["group"], "link");
    assert_eq!(link["burst"], 3);
    assert_eq!(link["tracked_clients"], 3);
    let clients = link["clients"].as_array().unwrap();
    assert_eq!(clients.len(), 2, "top=2: {body}");
    assert_eq!(clients[0]["key"], "198.51.100.7/32", "{body}");
    assert_eq!(clients[0]["tokens"], 0);
    assert_eq!(clients[0]["spent"], 3);
    assert_eq!(clients[0]["inflight"], 0);
    assert_eq!(clients[0]["rejections"], 2);
    assert_eq!(clients[1]["key"], "2001:db8:1:2::/64", "{body}");
    assert_eq!(clients[1]["rejections"], 0);
    assert_eq!(clients[1]["tokens"], 1);
    assert_eq!(link["shared"]["tokens"], 3, "{body}");
    // Without a group: every group, top 10 by default.
    let (_, body) = request(admin, "GET", "/clients", &[], "").await;
    let all = json(&body);
    let names: Vec<&str> = all["groups"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["group"].as_str().unwrap())
        .collect();
    assert!(
        names.contains(&"link") && names.contains(&"health"),
        "{names:?}"
    );
    let (_, body) = request(admin, "GET", "/clients?group=link", &[], "").await;
    assert_eq!(
        json(&body)["groups"][0]["clients"]
            .as_array()
            .unwrap()
            .len(),
        3
    );

    // Forget it (the prefix percent-encoded or not): its next request is admitted.
    assert_eq!(
        door.get("/l/session/abc", "198.51.100.7").await,
        StatusCode::TOO_MANY_REQUESTS
    );
    let (status, body) = request(admin, "DELETE", "/clients/198.51.100.7%2F32", &[], "").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(json(&body)["key"], "198.51.100.7/32");
    assert_eq!(json(&body)["forgotten_in"], serde_json::json!(["link"]));
    assert_eq!(
        door.get("/l/session/abc", "198.51.100.7").await,
        StatusCode::OK
    );
    // Only in one group; a bare IPv6 address names its /64.
    let (status, body) = request(
        admin,
        "DELETE",
        "/clients/2001:db8:1:2::99?group=link",
        &[],
        "",
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(json(&body)["key"], "2001:db8:1:2::/64");
    refused(
        admin,
        "DELETE",
        "/clients/2001:db8:1:2::/64",
        "",
        StatusCode::NOT_FOUND,
        "not-tracked",
        "2001:db8:1:2::/64",
    )
    .await;
}

/// The session plane's keys are credential hashes, no addresses: `GET /clients` writes them as
/// `credential:` and 32 hex digits (not as a made-up IPv6 /64), and `DELETE /clients/{key}`
/// takes that back and forgets the session; an address key never matches in the session plane,
/// nor a credential key in a group.
#[tokio::test]
async fn session_keys_are_listed_and_forgotten_as_credentials() {
    let planes = "[plane.session]\nheader = \"authorization\"\nrate = 0.001\nburst = 2\n\
                  [plane.ip]\nrate = 0.001\nburst = 50";
    let door = Door::start(&config(upstream().await, planes)).await;
    let admin = door.admin().await;
    let bearer = [
        ("x-forwarded-for", "198.51.100.7"),
        ("authorization", "Bearer alice"),
    ];
    let get = async || request(door.addr, "GET", "/api/a", &bearer, "").await.0;
    // The first request verifies the credential (on the IP plane); the next two spend the
    // session's burst of 2, the third is refused.
    for _ in 0..3 {
        assert_eq!(get().await, StatusCode::OK);
    }
    assert_eq!(get().await, StatusCode::TOO_MANY_REQUESTS);

    let (status, body) = request(admin, "GET", "/clients?group=session", &[], "").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let session = &json(&body)["groups"][0];
    assert_eq!(session["tracked_clients"], 1, "{body}");
    let row = &session["clients"][0];
    let key = row["key"].as_str().unwrap().to_owned();
    let hex = key
        .strip_prefix("credential:")
        .unwrap_or_else(|| panic!("{body}"));
    assert!(
        hex.len() == 32 && hex.bytes().all(|b| b.is_ascii_hexdigit()),
        "{body}"
    );
    assert_eq!(row["spent"], 2, "{body}");
    assert_eq!(row["rejections"], 1, "{body}");
    // The IP plane's keys are still addresses.
    let (_, body) = request(admin, "GET", "/clients?group=ip", &[], "").await;
    assert_eq!(
        json(&body)["groups"][0]["clients"][0]["key"],
        "198.51.100.7/32",
        "{body}"
    );

    // A credential key is not looked for in the groups and the IP plane, nor an address in the
    // session plane.
    refused(
        admin,
        "DELETE",
        &format!("/clients/{key}?group=ip"),
        "",
        StatusCode::BAD_REQUEST,
        "bad-prefix",
        "credential",
    )
    .await;
    refused(
        admin,
        "DELETE",
        "/clients/198.51.100.7?group=session",
        "",
        StatusCode::BAD_REQUEST,
        "bad-prefix",
        "\"session\"",
    )
    .await;
    let (status, body) = request(admin, "DELETE", "/clients/198.51.100.7", &[], "").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(json(&body)["forgotten_in"], serde_json::json!(["ip"]));
    assert_eq!(get().await, StatusCode::TOO_MANY_REQUESTS, "still refused");

    // Forgotten by its credential key (hex digits in either case): the session starts afresh.
    let upper = format!("credential:{}", hex.to_ascii_uppercase());
    let (status, body) = request(admin, "DELETE", &format!("/clients/{upper}"), &[], "").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(json(&body)["key"], key.as_str(), "{body}");
    assert_eq!(json(&body)["forgotten_in"], serde_json::json!(["session"]));
    assert_eq!(get().await, StatusCode::OK);
    refused(
        admin,
        "DELETE",
        &format!("/clients/{}", key.replace("credential:", "credential:0")),
        "",
        StatusCode::BAD_REQUEST,
        "bad-prefix",
        "32 hex digits",
    )
    .await;
    refused(
        admin,
        "DELETE",
        "/clients/credential:0123456789abcdef0123456789abcdeg",
        "",
        StatusCode::BAD_REQUEST,
        "bad-prefix",
        "abcdeg",
    )
    .await;
}

/// (method, target, body, status, code, what the message names).
type Refusal = (
    &'static str,
    &'static str,
    &'static str,
    StatusCode,
    &'static str,
    &'static str,
);

async fn all_refused(admin: std::net::SocketAddr, cases: &[Refusal]) {
    for (method, target, body, status, code, names) in cases {
        refused(admin, method, target, body, *status, code, names).await;
    }
}

#[tokio::test]
async fn clients_bad_inputs_are_named() {
    let door = Door::start(&config(upstream().await, "")).await;
    let admin = door.admin().await;
    let bad = StatusCode::BAD_REQUEST;
    let not_allowed = StatusCode::METHOD_NOT_ALLOWED;
    all_refused(
        admin,
        &[
            (
                "GET",
                "/clients?group=nope",
                "",
                bad,
                "unknown-group",
                "\"nope\"",
            ),
            (
                "GET",
                "/clients?group=nope",
                "",
                bad,
                "unknown-group",
                "link",
            ),
            ("GET", "/clients?top=0", "", bad, "bad-top", "top = \"0\""),
            ("GET", "/clients?top=1001", "", bad, "bad-top", "1001"),
            ("GET", "/clients?top=-1", "", bad, "bad-top", "-1"),
            ("GET", "/clients?top=ten", "", bad, "bad-top", "ten"),
            ("GET", "/clients?top=%2B5", "", bad, "bad-top", "+5"),
            (
                "GET",
                "/clients?grup=link",
                "",
                bad,
                "unknown-parameter",
                "grup",
            ),
            (
                "DELETE",
                "/clients/198.51.100.0/24",
                "",
                bad,
                "bad-prefix",
                "/24",
            ),
            (
                "DELETE",
                "/clients/300.1.1.1",
                "",
                bad,
                "bad-prefix",
                "300.1.1.1",
            ),
            ("DELETE", "/clients/", "", bad, "bad-prefix", "empty"),
            ("DELETE", "/clients/%ff", "", bad, "bad-prefix", "UTF-8"),
            (
                "DELETE",
                "/clients/198.51.100.7?group=nope",
                "",
                bad,
                "unknown-group",
                "nope",
            ),
            (
                "POST",
                "/clients",
                "",
                not_allowed,
                "method-not-allowed",
                "GET",
            ),
            (
                "GET",
                "/clients/198.51.100.7",
                "",
                not_allowed,
                "method-not-allowed",
                "DELETE",
            ),
        ],
    )
    .await;
}

#[tokio::test]
async fn blocks_answer_503_without_the_shield() {
    let door = Door::start(&config(upstream().await, "")).await;
    let admin = door.admin().await;
    let off = StatusCode::SERVICE_UNAVAILABLE;
    refused(
        admin,
        "GET",
        "/blocks",
        "",
        off,
        "xdp-off",
        "XDP shield is not running",
    )
    .await;
    refused(
        admin,
        "POST",
        "/blocks",
        r#"{"prefix":"198.51.100.7/32","for_s":600}"#,
        off,
        "xdp-off",
        "xdp.mode",
    )
    .await;
    refused(
        admin,
        "DELETE",
        "/blocks/198.51.100.7",
        "",
        off,
        "xdp-off",
        "blocklist",
    )
    .await;
    // Bad input is still named first.
    refused(
        admin,
        "POST",
        "/blocks",
        "{",
        StatusCode::BAD_REQUEST,
        "bad-json",
        "prefix",
    )
    .await;
}

#[tokio::test]
async fn blocks_are_added_listed_and_removed_through_the_blocklist() {
    let list = Arc::new(FakeBlocklist::default());
    let door = Door::start_with(&config(upstream().await, ""), Some(list.clone())).await;
    let admin = door.admin().await;
    let (status, body) = request(admin, "GET", "/blocks", &[], "").await;
    assert_eq!(
        (status, json(&body)),
        (StatusCode::OK, serde_json::json!({ "blocks": [] }))
    );
    let (status, body) = request(
        admin,
        "POST",
        "/blocks",
        JSON,
        r#"{"prefix":"198.51.100.7/32","for_s":600}"#,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(json(&body)["prefix"], "198.51.100.7/32");
    request(
        admin,
        "POST",
        "/blocks",
        JSON,
        r#"{"prefix":"2001:db8::1","for_s":1}"#,
    )
    .await;
    let (_, body) = request(admin, "GET", "/blocks", &[], "").await;
    assert_eq!(
        json(&body),
        serde_json::json!({ "blocks": [
            { "prefix": "198.51.100.7/32", "seconds_left": 600 },
            { "prefix": "2001:db8::/64", "seconds_left": 1 },
        ]}),
        "{body}"
    );
    let (status, body) = request(admin, "DELETE", "/blocks/198.51.100.7/32", &[], "").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(list.0.lock().unwrap().len(), 1);
    refused(
        admin,
        "DELETE",
        "/blocks/198.51.100.7",
        "",
        StatusCode::NOT_FOUND,
        "not-blocked",
        "198.51.100.7/32",
    )
    .await;
}

/// A blocklist whose shield never sheds `exempt` (on `allow`, say).
struct ExemptOne {
    list: FakeBlocklist,
    exempt: door_common::PrefixKey,
}

impl door_daemon::admin::AdminBlocklist for ExemptOne {
    fn list(&self) -> Result<Vec<(door_common::PrefixKey, u64)>, door_daemon::shield::ShieldError> {
        self.list.list()
    }
    fn block(
        &self,
        key: door_common::PrefixKey,
        duration: Duration,
    ) -> Result<(), door_daemon::shield::ShieldError> {
        self.list.block(key, duration)
    }
    fn unblock(
        &self,
        key: &door_common::PrefixKey,
    ) -> Result<bool, door_daemon::shield::ShieldError> {
        self.list.unblock(key)
    }
    fn exempt(
        &self,
        key: &door_common::PrefixKey,
    ) -> Result<bool, door_daemon::shield::ShieldError> {
        Ok(*key == self.exempt)
    }
}

/// Blocking a prefix the shield never sheds would drop nothing while answering 200: it is
/// refused with 409 naming the lists, and nothing is blocked; other prefixes block as before.
#[tokio::test]
async fn blocking_an_exempt_prefix_is_refused() {
    let list = Arc::new(ExemptOne {
        list: FakeBlocklist::default(),
        exempt: door_common::PrefixKey::from_ipv4([198, 51, 100, 7]),
    });
    let door = Door::start_with(&config(upstream().await, ""), Some(list.clone())).await;
    let admin = door.admin().await;
    refused(
        admin,
        "POST",
        "/blocks",
        r#"{"prefix":"198.51.100.7","for_s":600}"#,
        StatusCode::CONFLICT,
        "exempt",
        "198.51.100.7/32 is on allow, xdp.allow or trusted_proxies",
    )
    .await;
    assert!(list.list.0.lock().unwrap().is_empty());
    let (status, body) = request(
        admin,
        "POST",
        "/blocks",
        JSON,
        r#"{"prefix":"198.51.100.8","for_s":600}"#,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
}

/// Posts each body to `/blocks` of a door with a blocklist and asserts the 400 with `code` naming
/// `names` in its detail, and that nothing was blocked.
async fn blocks_refused(cases: impl IntoIterator<Item = (String, &'static str, String)>) {
    let list = Arc::new(FakeBlocklist::default());
    let door = Door::start_with(&config(upstream().await, ""), Some(list.clone())).await;
    let admin = door.admin().await;
    for (body, code, names) in cases {
        let bad = StatusCode::BAD_REQUEST;
        refused(admin, "POST", "/blocks", &body, bad, code, &names).await;
    }
    assert!(list.0.lock().unwrap().is_empty());
}

/// Every `for_s` that is not a whole number of seconds from 1 to 604,800 is refused as
/// `bad-for-s`, naming the value (as JSON reads it), and blocks nothing.
#[tokio::test]
async fn a_block_duration_that_is_no_whole_number_in_range_is_named() {
    blocks_refused(
        [
            ("0", "0"),
            ("604801", "604801"),
            ("-5", "-5"),
            ("1.5", "1.5"),
            ("600.0", "600.0"),
            (r#""600""#, r#""600""#),
            ("1e23", "1e+23"),
            ("null", "null"),
        ]
        .map(|(sent, named)| {
            (
                format!(r#"{{"prefix":"198.51.100.7","for_s":{sent}}}"#),
                "bad-for-s",
                format!("for_s = {named}: must be a whole number of seconds"),
            )
        }),
    )
    .await;
}

/// A field given twice is refused, whichever copy is good: JSON leaves duplicate names to the
/// reader (RFC 8259 §4), and an operator's tool may not read the last one as door would.
#[tokio::test]
async fn a_block_field_given_twice_is_refused() {
    blocks_refused(
        [
            (
                r#"{"prefix":"nonsense","prefix":"198.51.100.7","for_s":600}"#,
                "prefix",
            ),
            (
                r#"{"prefix":"198.51.100.7","for_s":-1,"for_s":600}"#,
                "for_s",
            ),
        ]
        .map(|(body, field)| {
            let names = format!("duplicate field `{field}`");
            (body.to_owned(), "bad-json", names)
        }),
    )
    .await;
}

#[tokio::test]
async fn blocks_bad_inputs_are_named() {
    let list = Arc::new(FakeBlocklist::default());
    let door = Door::start_with(&config(upstream().await, ""), Some(list.clone())).await;
    let admin = door.admin().await;
    let bad = StatusCode::BAD_REQUEST;
    for (body, code, names) in [
        ("", "bad-json", "EOF"),
        ("not json", "bad-json", "prefix"),
        (
            r#"{"prefix":"198.51.100.7"}"#,
            "bad-json",
            "missing field `for_s`",
        ),
        (r#"{"for_s":60}"#, "bad-json", "missing field `prefix`"),
        (
            r#"{"prefix":7,"for_s":60}"#,
            "bad-json",
            "prefix = 7: must be a string",
        ),
        (
            r#"{"prefix":"198.51.100.7","for_s":60,"x":1}"#,
            "bad-json",
            "unknown field `x`",
        ),
        // serde reads a struct from an array too; the API documents an object.
        (r#"["198.51.100.7",60]"#, "bad-json", "prefix"),
        (
            r#"{"prefix":"198.51.100.0/24","for_s":60}"#,
            "bad-prefix",
            "/24",
        ),
        (
            r#"{"prefix":"example.com","for_s":60}"#,
            "bad-prefix",
            "example.com",
        ),
    ] {
        refused(admin, "POST", "/blocks", body, bad, code, names).await;
    }
    let huge = format!(r#"{{"prefix":"{}","for_s":60}}"#, "1".repeat(10_000));
    refused(
        admin,
        "POST",
        "/blocks",
        &huge,
        StatusCode::PAYLOAD_TOO_LARGE,
        "body-too-large",
        "4096",
    )
    .await;
    refused(
        admin,
        "POST",
        "/blocks?x=1",
        "{}",
        bad,
        "unknown-parameter",
        "x",
    )
    .await;
    refused(
        admin,
        "PUT",
        "/blocks",
        "",
        StatusCode::METHOD_NOT_ALLOWED,
        "method-not-allowed",
        "GET, HEAD, POST",
    )
    .await;
    assert!(
        list.0.lock().unwrap().is_empty(),
        "no bad input reached the blocklist"
    );
}

#[tokio::test]
async fn hostile_requests_get_4xx_and_the_listener_keeps_serving() {
    let door = Door::start_with(
        &config(upstream().await, ""),
        Some(Arc::new(FakeBlocklist::default())),
    )
    .await;
    let admin = door.admin().await;
    let long = "9".repeat(5_000);
    let targets = [
        (
            "GET",
            "/clients?top=99999999999999999999999".to_owned(),
            String::new(),
        ),
        ("GET", format!("/clients?group={long}"), String::new()),
        ("GET", "/clients?group=%00%ff".to_owned(), String::new()),
        ("GET", "/clients?&&&=&=".to_owned(), String::new()),
        ("DELETE", format!("/clients/{long}"), String::new()),
        (
            "DELETE",
            "/clients/198.51.100.7/32/".to_owned(),
            String::new(),
        ),
        ("DELETE", "/clients/::/0".to_owned(), String::new()),
        ("DELETE", "/blocks/%".to_owned(), String::new()),
        ("POST", "/blocks".to_owned(), "\u{0}\u{1}".to_owned()),
        ("POST", "/blocks".to_owned(), "[1,2,3]".to_owned()),
        (
            "POST",
            "/blocks".to_owned(),
            r#"{"prefix":null,"for_s":1}"#.to_owned(),
        ),
        (
            "POST",
            "/blocks".to_owned(),
            r#"{"prefix":"1.2.3.4","for_s":18446744073709551616}"#.to_owned(),
        ),
        ("POST", "/blocks".to_owned(), "[".repeat(3_000)),
        ("GET", "/../status".to_owned(), String::new()),
    ];
    for (method, target, body) in &targets {
        let headers: &[(&str, &str)] = if *method == "POST" { JSON } else { &[] };
        let (status, text) = request(admin, method, target, headers, body).await;
        assert!(
            status.is_client_error(),
            "{method} {target}: {status} {text}"
        );
        let v = json(&text);
        assert!(v["code"].is_string() && v["message"].is_string(), "{text}");
    }
    let (status, _) = request(admin, "GET", "/status", &[], "").await;
    assert_eq!(status, StatusCode::OK);
}

#[tokio::test]
async fn the_admin_listener_serves_on_a_unix_socket_with_mode_0600() {
    let dir = std::env::temp_dir().join(format!("door-admin-unix-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("admin.sock");
    let door = Door::start(&config(upstream().await, "")).await;
    // A stale socket file (its door gone) is replaced.
    drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
    assert!(path.exists());
    let file = door.admin_unix(&path);
    let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "{mode:o}");

    door.get("/l/session/abc", "198.51.100.7").await;
    let (status, body) = request_unix(&path, "GET", "/status", "").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (status, body) = request_unix(&path, "GET", "/clients?group=link", "").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        json(&body)["groups"][0]["clients"][0]["key"],
        "198.51.100.7/32"
    );
    let (status, text) = request_unix(&path, "GET", "/metrics", "").await;
    assert_eq!(status, StatusCode::OK);
    assert!(text.contains("door_requests_total"), "{text}");
    let (status, _) = request_unix(&path, "DELETE", "/clients/198.51.100.7", "").await;
    assert_eq!(status, StatusCode::OK);

    // A live socket is not taken over; a path that is not a socket is not removed.
    let again = door_daemon::admin::AdminListener::bind(
        &door_daemon::config::AdminListen::Unix(path.clone()),
        false,
    );
    assert_eq!(again.unwrap_err().kind(), std::io::ErrorKind::AddrInUse);
    let plain = dir.join("plain");
    std::fs::write(&plain, "x").unwrap();
    let refused = door_daemon::admin::AdminListener::bind(
        &door_daemon::config::AdminListen::Unix(plain.clone()),
        false,
    );
    assert_eq!(
        refused.unwrap_err().kind(),
        std::io::ErrorKind::AlreadyExists
    );
    assert!(plain.exists());

    // Removed when door lets go of it.
    assert_eq!(file.path(), path);
    drop(file);
    assert!(!path.exists());
    std::fs::remove_dir_all(&dir).unwrap();
}

// ------------------------------------------------------------- connection bounds

/// Connects to `admin`, sends `bytes`, reads until the listener closes: what came back and how
/// long that took (tokio's clock: paused in most of these tests, so the timeouts pass at once).
/// Fails if the listener has not closed within 5 minutes.
async fn until_closed(admin: std::net::SocketAddr, bytes: &[u8]) -> (String, Duration) {
    let start = door_daemon::time::now();
    let mut s = TcpStream::connect(admin).await.unwrap();
    s.write_all(bytes).await.unwrap();
    let mut out = Vec::new();
    let read = tokio::time::timeout(Duration::from_mins(5), s.read_to_end(&mut out)).await;
    let out = String::from_utf8_lossy(&out).into_owned();
    assert!(read.is_ok(), "sent {bytes:?}: never closed; got {out:?}");
    (out, start.elapsed())
}

#[tokio::test(start_paused = true)]
async fn admin_connections_that_send_nothing_part_of_a_head_or_idle_are_closed() {
    let door = Door::start(&config(upstream().await, "")).await;
    let admin = door.admin().await;
    let head = door_daemon::admin::HEAD_TIMEOUT;
    assert_eq!(head, Duration::from_secs(10));
    for sent in [
        &b""[..],
        b"G",
        b"GET /status HTTP/1.1\r\nHost: door.test\r\nX-Slow: a",
    ] {
        let (out, waited) = until_closed(admin, sent).await;
        assert!(
            waited >= head && waited < head + Duration::from_secs(1),
            "sent {sent:?}: closed after {waited:?}"
        );
        assert!(!out.contains("200 OK"), "{out}");
    }
    // Answered, then idle on keep-alive: closed once a next head has been awaited as long.
    let (out, waited) =
        until_closed(admin, b"GET /status HTTP/1.1\r\nHost: door.test\r\n\r\n").await;
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    assert!(
        waited >= head && waited < head + Duration::from_secs(1),
        "closed after {waited:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn admin_post_bodies_are_bounded_in_size_at_once_and_in_time() {
    let door = Door::start(&config(upstream().await, "")).await;
    let admin = door.admin().await;
    // Announced past 4 KiB, one byte sent: 413 at once. Announced within it, never finished:
    // 408 at the body deadline. Either way the connection closes.
    let deadline = door_daemon::admin::BODY_TIMEOUT;
    for (length, answer, code, after) in [
        (
            "99999999999",
            "HTTP/1.1 413",
            "body-too-large",
            Duration::ZERO,
        ),
        ("100", "HTTP/1.1 408", "request-timeout", deadline),
    ] {
        let head = format!(
            "POST /blocks HTTP/1.1\r\nHost: door.test\r\nContent-Type: application/json\r\n\
             Content-Length: {length}\r\n\r\n{{"
        );
        let (out, waited) = until_closed(admin, head.as_bytes()).await;
        assert!(out.starts_with(answer), "{length}: {out}");
        assert!(out.contains(code), "{length}: {out}");
        assert!(
            waited >= after && waited < after + Duration::from_secs(1),
            "{length}: closed after {waited:?}"
        );
    }
}

#[tokio::test]
async fn admin_connections_past_the_cap_are_closed_at_accept() {
    let door = Door::start(&config(upstream().await, "")).await;
    let admin = door.admin().await;
    let mut open = Vec::new();
    for _ in 0..door_daemon::admin::MAX_CONNECTIONS {
        open.push(TcpStream::connect(admin).await.unwrap());
    }
    // One more is closed without an answer.
    let mut past = TcpStream::connect(admin).await.unwrap();
    let _ = past
        .write_all(b"GET /status HTTP/1.1\r\nHost: door.test\r\n\r\n")
        .await;
    let mut buf = [0u8; 64];
    let read = tokio::time::timeout(Duration::from_secs(10), past.read(&mut buf)).await;
    assert!(
        matches!(read, Ok(Ok(0) | Err(_))),
        "past the cap: {read:?} {:?}",
        String::from_utf8_lossy(&buf)
    );
    // One of the open ones is served, and closes: /status answers again.
    let mut first = open.remove(0);
    first
        .write_all(b"GET /status HTTP/1.1\r\nHost: door.test\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut out = Vec::new();
    first.read_to_end(&mut out).await.unwrap();
    assert!(out.starts_with(b"HTTP/1.1 200"));
    let (status, body) = request(admin, "GET", "/status", &[], "").await;
    assert_eq!(status, StatusCode::OK, "{body}");
}

// ------------------------------------------------------------- HEAD and repeated parameters

#[tokio::test]
async fn head_is_served_wherever_get_is_without_a_body() {
    let list = Arc::new(FakeBlocklist::default());
    let door = Door::start_with(&config(upstream().await, ""), Some(list)).await;
    let admin = door.admin().await;
    for path in ["/status", "/metrics", "/clients?group=link", "/blocks"] {
        let head = format!("HEAD {path} HTTP/1.1\r\nHost: door.test\r\nConnection: close\r\n\r\n");
        let (out, _) = until_closed(admin, head.as_bytes()).await;
        assert!(out.starts_with("HTTP/1.1 200"), "HEAD {path}: {out}");
        let (fields, body) = out.split_once("\r\n\r\n").unwrap();
        assert_eq!(body, "", "HEAD {path}: a body came: {out}");
        assert!(
            fields.to_ascii_lowercase().contains("content-type:"),
            "{out}"
        );
    }
    for (path, allow) in [
        ("/status", "GET, HEAD"),
        ("/metrics", "GET, HEAD"),
        ("/clients", "GET, HEAD"),
        ("/blocks", "GET, HEAD, POST"),
    ] {
        let put = format!(
            "PUT {path} HTTP/1.1\r\nHost: door.test\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        );
        let (out, _) = until_closed(admin, put.as_bytes()).await;
        assert!(out.starts_with("HTTP/1.1 405"), "PUT {path}: {out}");
        assert!(
            out.to_ascii_lowercase()
                .contains(&format!("\r\nallow: {}\r\n", allow.to_ascii_lowercase())),
            "PUT {path}: {out}"
        );
    }
}

#[tokio::test]
async fn status_takes_no_query_parameters_and_metrics_ignores_its_query() {
    let door = Door::start(&config(upstream().await, "")).await;
    let admin = door.admin().await;
    let bad = StatusCode::BAD_REQUEST;
    // Answered with every group, `?group=link` would look like a filter that worked.
    let name = "\"group\"";
    refused(
        admin,
        "GET",
        "/status?group=link",
        "",
        bad,
        "unknown-parameter",
        name,
    )
    .await;
    let (status, body) = request(admin, "GET", "/status", &[], "").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    // A scraper's `params` (repeated ones too) never fail a scrape.
    let (status, text) = request(admin, "GET", "/metrics?a=1&a=2&collect%5B%5D=x", &[], "").await;
    assert_eq!(status, StatusCode::OK, "{text}");
    assert!(text.contains("# TYPE door_clients gauge"), "{text}");
}

/// A query parameter given twice (`repeated-parameter`), or not UTF-8 once percent-decoded
/// (`bad-parameter`), is refused by name; the latter is named as sent: decoded, it read as U+FFFD
/// in the error (`unknown group "\u{fffd}"`).
#[tokio::test]
async fn a_repeated_or_undecodable_query_parameter_is_refused_by_name() {
    let door = Door::start(&config(upstream().await, "")).await;
    let admin = door.admin().await;
    let (repeated, undecodable) = ("repeated-parameter", "bad-parameter");
    for (method, target, code, name) in [
        ("GET", "/clients?group=link&group=health", repeated, "group"),
        ("GET", "/clients?top=abc&top=5", repeated, "top"),
        ("GET", "/clients?top=5&group=link&top=5", repeated, "top"),
        (
            "DELETE",
            "/clients/198.51.100.7?group=link&group=link",
            repeated,
            "group",
        ),
        ("GET", "/clients?group=%ff", undecodable, "group=%ff"),
        ("GET", "/clients?top=5&%C3%28=1", undecodable, "%C3%28=1"),
        (
            "DELETE",
            "/clients/198.51.100.7?group=li%80nk",
            undecodable,
            "group=li%80nk",
        ),
    ] {
        let name = format!("\"{name}\"");
        refused(
            admin,
            method,
            target,
            "",
            StatusCode::BAD_REQUEST,
            code,
            &name,
        )
        .await;
    }
    for target in ["/clients?group=link&top=5", "/clients?group=%6Cink"] {
        let (status, body) = request(admin, "GET", target, &[], "").await;
        assert_eq!(status, StatusCode::OK, "{target}: {body}");
    }
}

/// `X-Forwarded-For` from an untrusted local peer (here 127.0.0.1, once it is not a trusted
/// proxy) is ignored and counted in `door.untrusted_xff` on every route: a pass-through route
/// drops the header too, and counts it as a limited route does. A request without one is not
/// counted.
#[tokio::test]
async fn forwarding_headers_from_an_untrusted_local_peer_are_counted_on_every_route() {
    let mut cfg = config(upstream().await, "");
    cfg.trusted_proxies = door_daemon::client::key::TrustedProxies::from_nets(Vec::new()).unwrap();
    let door = Door::start(&cfg).await;
    let admin = door.admin().await;
    door.get("/unlimited", "203.0.113.5").await;
    door.get("/unlimited", "203.0.113.5").await;
    door.get("/l/session/abc", "203.0.113.5").await;
    request(door.addr, "GET", "/unlimited", &[], "").await;
    let (status, text) = request(admin, "GET", "/metrics", &[], "").await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let counted: Vec<_> = samples(&text)
        .into_iter()
        .filter(|s| s.name == "door_untrusted_xff_total")
        .map(|s| s.value)
        .collect();
    assert_eq!(counted, ["3"], "{text}");
}

/// What a web page can make a browser send to a loopback admin listener is refused, and reaches
/// nothing: a cross-site form's `text/plain` body shaped into JSON (no JavaScript, no CORS
/// preflight), any request with `Origin` or a page's `Sec-Fetch-Site`, and a DNS-rebinding page's
/// requests, which name its own host.
#[tokio::test]
async fn requests_a_web_page_makes_are_refused() {
    let list = Arc::new(FakeBlocklist::default());
    let door = Door::start_with(&config(upstream().await, ""), Some(list.clone())).await;
    let admin = door.admin().await;
    // `<form method=POST enctype="text/plain"><input name='{"prefix":"junk'
    // value='","prefix":"198.51.100.9","for_s":604800}'>`, as a browser sends it.
    let form = "{\"prefix\":\"junk=\",\"prefix\":\"198.51.100.9\",\"for_s\":604800}\r\n";
    for (headers, code) in [
        (
            &[("content-type", "text/plain")][..],
            "unsupported-media-type",
        ),
        (&[][..], "unsupported-media-type"),
        (
            &[
                ("content-type", "application/json"),
                ("origin", "https://attacker.example"),
            ][..],
            "cross-origin",
        ),
    ] {
        let (status, text) = request(admin, "POST", "/blocks", headers, form).await;
        assert!(status.is_client_error(), "{headers:?}: {status} {text}");
        assert_eq!(json(&text)["code"], code, "{headers:?}: {text}");
    }
    assert!(list.0.lock().unwrap().is_empty(), "a page blocked a prefix");
    // A page rebound to 127.0.0.1 reads as its own origin; its requests name its host.
    for headers in [
        &[("host", "rebind.attacker.com:9901")][..],
        &[("sec-fetch-site", "same-origin")][..],
    ] {
        let (status, text) = request(admin, "GET", "/clients", headers, "").await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{headers:?}: {text}");
        assert!(!text.contains("groups"), "{text}");
    }
    // An address typed into the browser, curl, and `door top` are served.
    for headers in [
        &[("sec-fetch-site", "none"), ("host", "127.0.0.1:9901")][..],
        &[("host", "localhost:9901")][..],
        &[("host", "door-admin")][..],
    ] {
        let (status, text) = request(admin, "GET", "/status", headers, "").await;
        assert_eq!(status, StatusCode::OK, "{headers:?}: {text}");
    }
}

/// A listener on every address (`[::]`) refuses a rebound `Host` on connections made to a
/// loopback address of either family: `127.0.0.1` reaches it as `::ffff:127.0.0.1`, which is
/// loopback too. A name of the operator's own is served on any other address.
#[tokio::test]
async fn a_listener_on_every_address_refuses_rebound_hosts_on_loopback() {
    let door = Door::start(&config(upstream().await, "")).await;
    let port = door.admin_on("[::]:0").port();
    let rebound = &[("host", "rebind.attacker.com")][..];
    for ip in ["127.0.0.1", "::1"] {
        let admin = std::net::SocketAddr::new(ip.parse().unwrap(), port);
        let (status, text) = request(admin, "GET", "/clients", rebound, "").await;
        assert_eq!(status, StatusCode::FORBIDDEN, "through {ip}: {text}");
        assert_eq!(json(&text)["code"], "host-refused", "through {ip}: {text}");
        let (status, text) = request(admin, "GET", "/status", &[], "").await;
        assert_eq!(status, StatusCode::OK, "through {ip}: {text}");
    }
}
