//! The per-session and per-IP request planes through the daemon (docs/design.md, "Streams and
//! sessions", Planes): door's front in-process on 127.0.0.1 in front of an upstream that accepts
//! some bearer tokens (or a session cookie) and answers 401 to the rest. No test sleeps: the
//! planes' rates are so slow that only bursts matter.

#![expect(
    clippy::unwrap_used,
    clippy::indexing_slicing,
    reason = "test helpers outside #[test] functions fail loudly by design"
)]

#[expect(
    clippy::panic,
    reason = "the shared helper that waits for a count panics when it never comes"
)]
mod serving;

use std::{
    convert::Infallible,
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
};

use bytes::Bytes;
use door_daemon::{
    config::Config,
    obs::metrics::Outcome,
    time::{Clock, MonotonicClock},
};
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt as _, Empty, Full};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use serving::{Door, door_with};
use tokio::{
    io::{AsyncReadExt as _, AsyncWriteExt as _},
    net::{TcpListener, TcpStream},
};

/// The tokens (and session cookie values) the upstream accepts.
const VALID: [&str; 3] = [
    "alice",
    "bob",
    "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJ2aWN0aW0ifQ.c2ln",
];

/// Counts the requests it sees; 401 for a credential it does not know, 200 with the request's
/// `cookie` lines (joined by `|`) otherwise. Requests without any credential get 200.
async fn upstream(hits: Arc<AtomicUsize>) -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            let hits = Arc::clone(&hits);
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
                    hits.fetch_add(1, Ordering::SeqCst);
                    let token = req
                        .headers()
                        .get("authorization")
                        .and_then(|v| v.to_str().ok())
                        .and_then(|v| v.strip_prefix("Bearer "))
                        .map(str::to_owned);
                    let cookies: Vec<String> = req
                        .headers()
                        .get_all("cookie")
                        .iter()
                        .map(|v| v.to_str().unwrap().to_owned())
                        .collect();
                    // The last `sid` wins, as in Python's `http.cookies` and Django.
                    let session = cookies
                        .iter()
                        .flat_map(|c| c.split(';'))
                        .rev()
                        .find_map(|p| p.trim().strip_prefix("sid=").map(str::to_owned));
                    let status = match token.or(session) {
                        Some(t) if !VALID.contains(&t.as_str()) => StatusCode::UNAUTHORIZED,
                        _ => StatusCode::OK,
                    };
                    let mut res = Response::new(Full::new(Bytes::from(cookies.join("|"))));
                    *res.status_mut() = status;
                    async move { Ok::<_, Infallible>(res) }
                });
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(s), svc)
                    .await;
            });
        }
    });
    addr
}

fn config(upstream: SocketAddr, plane: &str, tables: &str) -> Config {
    Config::from_toml(
        "planes.toml",
        &format!(
            r#"
listen = ["127.0.0.1:0"]
upstream = "http://{upstream}"
admin_listen = "off"
trusted_proxies = ["127.0.0.1/32"]
[[route]]
group = "link"
path = "/l/{{id}}"
[[route]]
group = "stream"
path = "/events/{{x}}"
stream = true
[group.link]
rate = 0.001
burst = 4
per_client = 4
[plane.session]
{plane}
rate = 0.001
burst = 3
[plane.ip]
rate = 0.001
burst = 5
{tables}
"#
        ),
    )
    .unwrap()
}

async fn door(cfg: &Config) -> Door {
    let clock: Arc<dyn Clock> = Arc::new(MonotonicClock::new());
    door_with(cfg, clock, None).await
}

/// What came back: status, the JSON body's `details.scope`, `Retry-After`, `RateLimit`.
#[derive(Debug)]
struct Answer {
    status: StatusCode,
    scope: Option<String>,
    retry_after: Option<String>,
    ratelimit: String,
    policy: String,
    body: String,
}

/// One request from client `client` (named by X-Forwarded-For through the trusted test proxy)
/// with `headers`.
async fn send(d: &Door, path: &str, client: &str, headers: &[(&str, &str)]) -> Answer {
    let s = TcpStream::connect(d.addr).await.unwrap();
    let (mut c, conn) = hyper::client::conn::http1::handshake(TokioIo::new(s))
        .await
        .unwrap();
    tokio::spawn(conn);
    let mut req = Request::get(path)
        .header("host", "door.test")
        .header("x-forwarded-for", client);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let res = c
        .send_request(req.body(Empty::<Bytes>::new()).unwrap())
        .await
        .unwrap();
    answer(res).await
}

async fn answer(res: Response<Incoming>) -> Answer {
    let status = res.status();
    let header = |n: &str| res.headers().get(n).map(|v| v.to_str().unwrap().to_owned());
    let (retry_after, ratelimit, policy) = (
        header("retry-after"),
        header("ratelimit").unwrap_or_default(),
        header("ratelimit-policy").unwrap_or_default(),
    );
    let body =
        String::from_utf8_lossy(&res.into_body().collect().await.unwrap().to_bytes()).into_owned();
    let scope = serde_json::from_str::<serde_json::Value>(&body)
        .ok()
        .and_then(|v| v["details"]["scope"].as_str().map(str::to_owned));
    Answer {
        status,
        scope,
        retry_after,
        ratelimit,
        policy,
        body,
    }
}

const BEARER: &str = "header = \"authorization\"";

/// A door whose session plane reads the cookie `sid`.
async fn cookie_door() -> Door {
    let hits = Arc::new(AtomicUsize::new(0));
    door(&config(upstream(hits).await, "cookie = \"sid\"", "")).await
}

#[tokio::test]
async fn a_verified_session_has_its_own_burst_and_anonymous_requests_go_to_the_ip_plane() {
    let hits = Arc::new(AtomicUsize::new(0));
    let d = door(&config(upstream(Arc::clone(&hits)).await, BEARER, "")).await;
    let alice = [("authorization", "Bearer alice")];
    // The first request carries a credential not yet verified: the IP plane (1 of its 5).
    let first = send(&d, "/api/a", "198.51.100.1", &alice).await;
    assert_eq!(first.status, StatusCode::OK);
    assert!(first.ratelimit.starts_with("\"ip\";"), "{first:?}");
    // Verified by the upstream's 200: alice now has the session plane's burst of 3.
    for _ in 0..3 {
        let a = send(&d, "/api/a", "198.51.100.1", &alice).await;
        assert_eq!(a.status, StatusCode::OK, "{a:?}");
        assert!(a.ratelimit.starts_with("\"session\";"), "{a:?}");
    }
    let over = send(&d, "/api/a", "198.51.100.1", &alice).await;
    assert_eq!(over.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(over.scope.as_deref(), Some("session"));
    assert!(over.retry_after.is_some(), "{over:?}");
    assert!(over.policy.starts_with("\"session\";q=3;"), "{over:?}");
    assert!(over.ratelimit.starts_with("\"session\";r=0;"), "{over:?}");
    let v: serde_json::Value = serde_json::from_str(&over.body).unwrap();
    assert_eq!(v["code"], "rate-limited");
    assert_eq!(v["details"]["group"], "session");
    // A second verified session from the same address has its own bucket.
    let bob = [("authorization", "Bearer bob")];
    assert_eq!(
        send(&d, "/api/b", "198.51.100.1", &bob).await.status,
        StatusCode::OK
    );
    for _ in 0..3 {
        assert_eq!(
            send(&d, "/api/b", "198.51.100.1", &bob).await.status,
            StatusCode::OK
        );
    }
    // No credential: the IP plane, which has 5 - 2 = 3 left for this address.
    for _ in 0..3 {
        let a = send(&d, "/api/c", "198.51.100.1", &[]).await;
        assert_eq!(a.status, StatusCode::OK, "{a:?}");
    }
    let anon = send(&d, "/api/c", "198.51.100.1", &[]).await;
    assert_eq!(anon.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(anon.scope.as_deref(), Some("ip"));
    assert_eq!(d.count("session", Outcome::Ok), 6);
    assert_eq!(d.count("session", Outcome::RateLimited), 1);
    assert_eq!(d.count("ip", Outcome::Ok), 5);
}

#[tokio::test]
async fn rotating_made_up_tokens_earn_nothing() {
    let hits = Arc::new(AtomicUsize::new(0));
    let d = door(&config(upstream(Arc::clone(&hits)).await, BEARER, "")).await;
    let mut limited = 0;
    for i in 0..200 {
        let token = format!("Bearer made-up-{i}");
        let a = send(&d, "/api/x", "198.51.100.9", &[("authorization", &token)]).await;
        match a.status {
            StatusCode::UNAUTHORIZED => {}
            StatusCode::TOO_MANY_REQUESTS => {
                assert_eq!(a.scope.as_deref(), Some("ip"), "{a:?}");
                limited += 1;
            }
            other => panic!("{other}: {a:?}"),
        }
    }
    // At most the IP plane's burst reached the upstream.
    assert_eq!(hits.load(Ordering::SeqCst), 5);
    assert_eq!(limited, 195);
    // A token the upstream refused never got a session bucket: from a fresh address, a refused
    // token is charged to that address's IP plane, not a session plane of its own.
    let a = send(
        &d,
        "/api/x",
        "198.51.100.10",
        &[("authorization", "Bearer made-up-0")],
    )
    .await;
    assert_eq!(a.status, StatusCode::UNAUTHORIZED);
    assert!(a.ratelimit.starts_with("\"ip\";r=4;"), "{a:?}");
    assert_eq!(d.count("session", Outcome::Ok), 0);
}

/// A `Connection` option cannot hide a made-up token from the upstream once door has read it:
/// the upstream sees it and refuses it, so it is never verified and earns no session bucket.
#[tokio::test]
async fn a_connection_option_cannot_hide_a_made_up_token_from_the_upstream() {
    let hits = Arc::new(AtomicUsize::new(0));
    let d = door(&config(upstream(Arc::clone(&hits)).await, BEARER, "")).await;
    let hidden = [
        ("authorization", "Bearer made-up"),
        ("connection", "authorization"),
    ];
    for i in 0..2 {
        let a = send(&d, "/api/x", "198.51.100.11", &hidden).await;
        assert_eq!(a.status, StatusCode::UNAUTHORIZED, "request {i}: {a:?}");
        assert!(a.ratelimit.starts_with("\"ip\";"), "request {i}: {a:?}");
    }
    assert_eq!(d.count("session", Outcome::Ok), 0);
}

#[tokio::test]
async fn a_forged_copy_of_a_victims_token_never_touches_the_victims_bucket() {
    let hits = Arc::new(AtomicUsize::new(0));
    let d = door(&config(upstream(Arc::clone(&hits)).await, BEARER, "")).await;
    let victim = format!("Bearer {}", VALID[2]);
    // The victim's session is verified.
    assert_eq!(
        send(&d, "/api/v", "198.51.100.20", &[("authorization", &victim)])
            .await
            .status,
        StatusCode::OK
    );
    // An attacker elsewhere replays the victim's claims with a bad signature (one byte off), and
    // the victim's exact token from another address is not the attacker's to spend either:
    // forged copies are charged to the attacker's IP plane.
    let mut forged = victim.clone();
    forged.pop();
    forged.push('X');
    for _ in 0..50 {
        let a = send(&d, "/api/v", "203.0.113.66", &[("authorization", &forged)]).await;
        assert!(
            matches!(
                a.status,
                StatusCode::UNAUTHORIZED | StatusCode::TOO_MANY_REQUESTS
            ),
            "{a:?}"
        );
        assert_ne!(a.scope.as_deref(), Some("session"));
    }
    // The victim's bucket is untouched: its whole burst of 3 is there.
    for _ in 0..3 {
        let a = send(&d, "/api/v", "198.51.100.20", &[("authorization", &victim)]).await;
        assert_eq!(a.status, StatusCode::OK, "{a:?}");
    }
}

/// A session cookie sent twice earns no session bucket: the application reads the last `sid`
/// (the test upstream, as Python's `http.cookies` does) and accepts it, and door must not verify
/// the first on that answer. Before, every made-up first value beside one real session became a
/// fresh session bucket. Nor does it take the session's holder off its bucket: with a verified
/// value among the copies the request is that session's (before, it went to the IP plane, whose
/// bucket a rotating client key renews). A quoted copy of the real value is the real session, as
/// the application reads it.
#[tokio::test]
async fn a_cookie_sent_twice_earns_no_session_bucket() {
    let d = cookie_door().await;
    let client = "198.51.100.40";
    // alice's session: verified by its first answer, then its burst of 3 spent.
    assert!(
        send(&d, "/api/a", client, &[("cookie", "sid=alice")])
            .await
            .ratelimit
            .starts_with("\"ip\";")
    );
    for _ in 0..3 {
        let a = send(&d, "/api/a", client, &[("cookie", "sid=alice")]).await;
        assert_eq!(a.status, StatusCode::OK, "{a:?}");
    }
    let over = send(&d, "/api/a", client, &[("cookie", "sid=\"alice\"")]).await;
    assert_eq!(over.status, StatusCode::TOO_MANY_REQUESTS, "{over:?}");
    assert_eq!(over.scope.as_deref(), Some("session"), "{over:?}");
    // Made-up values beside alice's, from one client key and from others: alice's spent
    // session each time, never the IP plane.
    for (i, from) in ["198.51.100.40", "198.51.100.41", "198.51.100.42"]
        .into_iter()
        .enumerate()
    {
        for cookie in [
            format!("sid=made-up-{i}; sid=alice"),
            format!("sid=alice; SID=made-up-{i}"),
        ] {
            let a = send(&d, "/api/a", from, &[("cookie", &cookie)]).await;
            assert_eq!(a.status, StatusCode::TOO_MANY_REQUESTS, "{cookie}: {a:?}");
            assert_eq!(a.scope.as_deref(), Some("session"), "{cookie}: {a:?}");
        }
    }
    // Made-up values beside bob's, which is not verified: the IP plane, and none verified by
    // the 200.
    for i in 0..3 {
        let cookie = format!("sid=made-up-{i}; sid=bob");
        let a = send(&d, "/api/a", client, &[("cookie", &cookie)]).await;
        assert_eq!(a.status, StatusCode::OK, "{a:?}");
        assert!(a.ratelimit.starts_with("\"ip\";"), "{a:?}");
    }
    let alone = send(&d, "/api/a", client, &[("cookie", "sid=made-up-0")]).await;
    assert!(
        alone.ratelimit.starts_with("\"ip\";"),
        "a made-up value was verified: {alone:?}"
    );
    assert_eq!(d.count("session", Outcome::Ok), 3);
}

/// A request carrying the session cookie more than 16 times is refused with 400, before any
/// plane: door would have to look each value up among the verified sessions, and leaving some
/// out would let made-up copies hide a spent session's own. Sixteen are read.
#[tokio::test]
async fn a_session_cookie_sent_more_than_sixteen_times_is_refused() {
    let d = cookie_door().await;
    let cookies = |n: usize| {
        (0..n)
            .map(|i| format!("sid=v{i}"))
            .collect::<Vec<_>>()
            .join("; ")
    };
    let over = send(&d, "/api/a", "198.51.100.60", &[("cookie", &cookies(17))]).await;
    assert_eq!(over.status, StatusCode::BAD_REQUEST, "{over:?}");
    assert!(
        over.body.contains("\"bad-request\"") && over.body.contains("more than 16 times"),
        "{over:?}"
    );
    assert!(over.ratelimit.is_empty(), "charged to no plane: {over:?}");
    let read = send(&d, "/api/a", "198.51.100.60", &[("cookie", &cookies(16))]).await;
    // Through the IP plane to the upstream, which knows none of these values.
    assert_eq!(read.status, StatusCode::UNAUTHORIZED, "{read:?}");
    assert!(read.ratelimit.starts_with("\"ip\";"), "{read:?}");
}

#[tokio::test]
async fn a_session_cookie_split_over_http2_cookie_fields_is_found_and_joined() {
    let d = cookie_door().await;
    let s = TcpStream::connect(d.addr).await.unwrap();
    let (mut c, conn) = hyper::client::conn::http2::handshake::<_, _, Empty<Bytes>>(
        TokioExecutor::new(),
        TokioIo::new(s),
    )
    .await
    .unwrap();
    tokio::spawn(conn);
    let request = || {
        let mut req = Request::get("http://door.test/api/cookie")
            .header("x-forwarded-for", "198.51.100.30")
            .body(Empty::new())
            .unwrap();
        for pair in ["theme=dark", "sid=alice", "lang=en"] {
            req.headers_mut()
                .append("cookie", http::HeaderValue::from_static(pair));
        }
        req
    };
    let first = answer(c.send_request(request()).await.unwrap()).await;
    assert_eq!(first.status, StatusCode::OK);
    assert_eq!(
        first.body, "theme=dark; sid=alice; lang=en",
        "one Cookie line, in order"
    );
    assert!(first.ratelimit.starts_with("\"ip\";"), "{first:?}");
    let second = answer(c.send_request(request()).await.unwrap()).await;
    assert!(
        second.ratelimit.starts_with("\"session\";"),
        "the cookie was found in the second field: {second:?}"
    );
}

#[tokio::test]
async fn streams_are_exempt_from_both_planes_and_groups_apply_on_top() {
    let hits = Arc::new(AtomicUsize::new(0));
    let d = door(&config(upstream(Arc::clone(&hits)).await, BEARER, "")).await;
    // A stream route: charged to its group only, never to a plane.
    for _ in 0..10 {
        let a = send(
            &d,
            "/events/e",
            "198.51.100.40",
            &[("accept", "text/event-stream")],
        )
        .await;
        assert_eq!(a.status, StatusCode::OK);
    }
    assert_eq!(d.count("ip", Outcome::Ok), 0);
    // A limited route with a plane: both apply. link's burst is 4, the IP plane's 5: the fifth
    // request is refused by link, and the plane spends nothing for it.
    for _ in 0..4 {
        assert_eq!(
            send(&d, "/l/x", "198.51.100.41", &[]).await.status,
            StatusCode::OK
        );
    }
    let refused = send(&d, "/l/x", "198.51.100.41", &[]).await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        refused.scope.as_deref(),
        Some("client"),
        "refused by its group"
    );
    // The IP plane still has its fifth token: the refused request spent none.
    let a = send(&d, "/api/after", "198.51.100.41", &[]).await;
    assert_eq!(a.status, StatusCode::OK, "{a:?}");
    let over = send(&d, "/api/after", "198.51.100.41", &[]).await;
    assert_eq!(over.scope.as_deref(), Some("ip"));
}

/// Asking for an event stream (`Accept: text/event-stream`) does not take a request past the
/// planes: an answer that is not an event stream was charged to the IP plane like any other, so
/// the header cannot lift the per-IP limit.
#[tokio::test]
async fn asking_for_an_event_stream_does_not_take_a_request_past_the_planes() {
    let hits = Arc::new(AtomicUsize::new(0));
    let d = door(&config(upstream(Arc::clone(&hits)).await, BEARER, "")).await;
    let sse = [("accept", "text/event-stream")];
    for i in 0..5 {
        let a = send(&d, "/api/plain", "198.51.100.50", &sse).await;
        assert_eq!(a.status, StatusCode::OK, "request {i}: {a:?}");
    }
    let over = send(&d, "/api/plain", "198.51.100.50", &sse).await;
    assert_eq!(over.status, StatusCode::TOO_MANY_REQUESTS, "{over:?}");
    assert_eq!(over.scope.as_deref(), Some("ip"));
    assert_eq!(
        hits.load(Ordering::SeqCst),
        5,
        "the sixth never reached the upstream"
    );
}

/// Asking for an upgrade (`Connection: upgrade`, `Upgrade: foo`) takes no request past its plane:
/// an upgrade is not refused by its plane before it is sent (a stream is exempt from the planes),
/// but an answer that is no stream (here a `200`) is charged to the plane then, and refused with
/// the plane's 429 when the plane has no token; the upstream saw the request, as far as the
/// stream group (charged up front) lets it. A made-up token such a refused answer carried is not
/// verified by it, and a client that hangs up before the answer is charged all the same.
#[tokio::test]
async fn asking_for_an_upgrade_does_not_take_a_request_past_the_planes() {
    let hits = Arc::new(AtomicUsize::new(0));
    let streams = "[group.stream]\nrate = 0.001\nburst = 8\nper_client = 8";
    let d = door(&config(upstream(Arc::clone(&hits)).await, BEARER, streams)).await;
    let upgrade = [("connection", "upgrade"), ("upgrade", "foo")];
    for i in 0..5 {
        let a = send(&d, "/api/plain", "198.51.100.51", &upgrade).await;
        assert_eq!(a.status, StatusCode::OK, "request {i}: {a:?}");
    }
    assert_eq!(d.count("ip", Outcome::Ok), 5, "charged to the IP plane");
    let over = send(&d, "/api/plain", "198.51.100.51", &upgrade).await;
    assert_eq!(over.status, StatusCode::TOO_MANY_REQUESTS, "{over:?}");
    assert_eq!(over.scope.as_deref(), Some("ip"), "{over:?}");
    assert!(
        over.ratelimit.contains("\"ip\";r=0"),
        "the plane's item: {over:?}"
    );
    assert_eq!(hits.load(Ordering::SeqCst), 6, "the upstream answered it");
    // A token on an upgrade the plane refused is not verified by its answer (the upstream took
    // it, but any page that ignores credentials would): its plain request is still the IP
    // plane's.
    let token = [
        ("connection", "upgrade"),
        ("upgrade", "foo"),
        ("authorization", "Bearer alice"),
    ];
    let refused = send(&d, "/api/plain", "198.51.100.51", &token).await;
    assert_eq!(refused.scope.as_deref(), Some("ip"), "{refused:?}");
    let plain = send(
        &d,
        "/api/plain",
        "198.51.100.51",
        &[("authorization", "Bearer alice")],
    )
    .await;
    assert_eq!(
        plain.scope.as_deref(),
        Some("ip"),
        "not verified: {plain:?}"
    );
    assert_eq!(
        hits.load(Ordering::SeqCst),
        7,
        "the plain request never reached it"
    );
}

/// An upgrade its group refuses before it is sent charges its plane nothing (a request refused
/// by one limiter spends nothing in the others): a page that reconnects its WebSocket in a loop
/// does not spend its own requests' budget.
#[tokio::test]
async fn an_upgrade_its_group_refuses_charges_its_plane_nothing() {
    let hits = Arc::new(AtomicUsize::new(0));
    let streams = "[group.stream]\nrate = 0.001\nburst = 2\nper_client = 8";
    let d = door(&config(upstream(Arc::clone(&hits)).await, BEARER, streams)).await;
    let upgrade = [("connection", "upgrade"), ("upgrade", "foo")];
    for i in 0..2 {
        let a = send(&d, "/api/plain", "198.51.100.55", &upgrade).await;
        assert_eq!(a.status, StatusCode::OK, "upgrade {i}: {a:?}");
    }
    for i in 0..3 {
        let r = send(&d, "/api/plain", "198.51.100.55", &upgrade).await;
        assert_eq!(
            r.status,
            StatusCode::TOO_MANY_REQUESTS,
            "upgrade {i}: {r:?}"
        );
        assert!(
            r.body.contains("\"stream\""),
            "refused by the stream group: {r:?}"
        );
    }
    assert_eq!(
        d.count("ip", Outcome::ClientError),
        0,
        "nothing charged as abandoned"
    );
    // The two answered upgrades spent two of the IP plane's five tokens; the refused ones none.
    for i in 0..3 {
        let a = send(&d, "/api/plain", "198.51.100.55", &[]).await;
        assert_eq!(a.status, StatusCode::OK, "request {i}: {a:?}");
    }
    let over = send(&d, "/api/plain", "198.51.100.55", &[]).await;
    assert_eq!(over.scope.as_deref(), Some("ip"), "{over:?}");
}

/// A client that hangs up on an upgrade before its answer is charged to its plane as any
/// request is: hanging up never helps a client.
#[tokio::test]
async fn an_upgrade_whose_client_hangs_up_is_charged_to_its_plane() {
    let silent = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let up = silent.local_addr().unwrap();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((s, _)) = silent.accept().await {
            held.push(s);
        }
    });
    let d = door(&config(up, BEARER, "")).await;
    let mut s = TcpStream::connect(d.addr).await.unwrap();
    s.write_all(
        b"GET /api/plain HTTP/1.1\r\nhost: door.test\r\nx-forwarded-for: 198.51.100.54\r\n\
          connection: upgrade\r\nupgrade: foo\r\n\r\n",
    )
    .await
    .unwrap();
    d.eventually("sent upstream", |d| d.inflight("stream") == 1)
        .await;
    drop(s);
    d.eventually("charged to the IP plane", |d| {
        d.count("ip", Outcome::ClientError) == 1
    })
    .await;
}

/// An upstream that switches protocols on `Upgrade: foo` (and keeps the connection, saying
/// nothing more) and answers 200 to everything else.
async fn switching_upstream() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            tokio::spawn(async move {
                loop {
                    let Some(head) = read_head(&mut s).await else {
                        return;
                    };
                    let answer: &[u8] = if head.contains("upgrade: foo") {
                        b"HTTP/1.1 101 Switching Protocols\r\nconnection: upgrade\r\nupgrade: foo\r\n\r\n"
                    } else {
                        b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"
                    };
                    if s.write_all(answer).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    addr
}

/// One request head from `s`, lower-cased; `None` at the end of the stream.
async fn read_head(s: &mut TcpStream) -> Option<String> {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        match s.read(&mut byte).await {
            Ok(1) => head.push(byte[0]),
            _ => return None,
        }
    }
    Some(String::from_utf8_lossy(&head).to_ascii_lowercase())
}

/// An upgrade the upstream accepts is a stream: the plane's token it was charged with is given
/// back at the `101`, so upgrades never use up a client's plane.
#[tokio::test]
async fn an_upgrade_the_upstream_accepts_gives_back_its_plane_token() {
    let d = door(&config(switching_upstream().await, BEARER, "")).await;
    for i in 0..8 {
        let head = upgrade_head(&d, "198.51.100.52").await;
        assert!(head.starts_with("http/1.1 101"), "upgrade {i}: {head}");
    }
    // The IP plane's burst of 5 is whole.
    for i in 0..5 {
        let a = send(&d, "/api/plain", "198.51.100.52", &[]).await;
        assert_eq!(a.status, StatusCode::OK, "request {i}: {a:?}");
    }
}

/// An upgrade is not refused by a plane its client has spent on requests (docs/design.md,
/// "Streams and sessions": a stream is exempt from the planes), so an application whose page used
/// up its budget can still open its WebSocket.
#[tokio::test]
async fn an_upgrade_opens_when_its_clients_plane_is_spent() {
    let d = door(&config(switching_upstream().await, BEARER, "")).await;
    for i in 0..5 {
        let a = send(&d, "/api/plain", "198.51.100.53", &[]).await;
        assert_eq!(a.status, StatusCode::OK, "request {i}: {a:?}");
    }
    let spent = send(&d, "/api/plain", "198.51.100.53", &[]).await;
    assert_eq!(spent.scope.as_deref(), Some("ip"), "{spent:?}");
    let head = upgrade_head(&d, "198.51.100.53").await;
    assert!(head.starts_with("http/1.1 101"), "{head}");
}

/// The head of door's answer to an HTTP/1.1 upgrade to `foo` from `client` (named by
/// X-Forwarded-For through the trusted test proxy), lower-cased.
async fn upgrade_head(d: &Door, client: &str) -> String {
    let mut s = TcpStream::connect(d.addr).await.unwrap();
    let request = format!(
        "GET /api/tunnel HTTP/1.1\r\nhost: door.test\r\nx-forwarded-for: {client}\r\n\
         connection: upgrade\r\nupgrade: foo\r\n\r\n"
    );
    s.write_all(request.as_bytes()).await.unwrap();
    read_head(&mut s).await.unwrap()
}

#[tokio::test]
async fn a_health_probe_the_ip_plane_refuses_gets_the_cached_status_not_a_429() {
    // Cached health (docs/design.md): a probe of the health group is never refused. A load
    // balancer probing more often than the IP plane's rate drained its bucket, and then got the
    // plane's 429 while its group would have answered from the cache.
    let hits = Arc::new(AtomicUsize::new(0));
    let cfg = config(
        upstream(Arc::clone(&hits)).await,
        BEARER,
        "[[route]]\ngroup = \"health\"\npath = \"/healthz\"",
    );
    // A clock that does not move: the cached status stays fresh however slow the machine.
    let d = door_with(&cfg, Arc::new(door_daemon::time::ManualClock::at(1)), None).await;
    // The IP plane's burst of 5 admits the first five probes, which reach the upstream.
    for _ in 0..5 {
        let a = send(&d, "/healthz", "198.51.100.50", &[]).await;
        assert_eq!(a.status, StatusCode::OK, "{a:?}");
    }
    assert_eq!(hits.load(Ordering::SeqCst), 5);
    for _ in 0..5 {
        let a = send(&d, "/healthz", "198.51.100.50", &[]).await;
        assert_eq!(a.status, StatusCode::OK, "{a:?}");
        assert_eq!(a.scope, None, "{a:?}");
    }
    assert_eq!(hits.load(Ordering::SeqCst), 5, "served from the cache");
    assert_eq!(d.count("health", Outcome::Cached), 5);
    // Each probe has one outcome: the plane does not also count the cached ones as refused,
    // nor does its row (what `/clients` and `door top` show).
    assert_eq!(d.count("ip", Outcome::RateLimited), 0);
    let ip = d
        .front
        .app()
        .limiters()
        .into_iter()
        .find(|l| l.group() == "ip")
        .unwrap();
    assert_eq!(ip.top(1)[0].1.rejections, 0);
}

/// A reload of `plane.session.max_clients` resizes the set of verified credentials: with room
/// for one, two sessions push each other back to the IP plane; after a reload to 100, both stay
/// verified.
#[tokio::test]
async fn a_reload_resizes_the_verified_credentials() {
    let hits = Arc::new(AtomicUsize::new(0));
    let up = upstream(Arc::clone(&hits)).await;
    let small = config(up, &format!("{BEARER}\nmax_clients = 1"), "");
    let d = door(&small).await;
    let plane = async |token: &str| {
        let auth = format!("Bearer {token}");
        let a = send(&d, "/api/a", "198.51.100.50", &[("authorization", &auth)]).await;
        assert_eq!(a.status, StatusCode::OK, "{a:?}");
        a.ratelimit.split(';').next().unwrap().to_owned()
    };
    // Room for one: bob's verification pushes alice out.
    assert_eq!(plane("alice").await, "\"ip\"");
    assert_eq!(plane("bob").await, "\"ip\"");
    assert_eq!(plane("alice").await, "\"ip\"", "alice was still verified");
    let big = config(up, &format!("{BEARER}\nmax_clients = 100"), "");
    assert!(d.front.app().reload(&big, &small).is_empty());
    assert_eq!(plane("bob").await, "\"ip\"");
    assert_eq!(plane("alice").await, "\"session\"", "bob pushed alice out");
    assert_eq!(plane("bob").await, "\"session\"");
}

/// A group named like a plane (`ip`, allowed while the planes are off) hands nothing to the
/// plane a reload turns on: the client that drained the group starts the IP plane with its whole
/// burst, as every other client.
#[tokio::test]
async fn a_reload_that_turns_the_planes_on_gives_them_fresh_tables() {
    let hits = Arc::new(AtomicUsize::new(0));
    let up = upstream(Arc::clone(&hits)).await;
    let before = Config::from_toml(
        "planes-off.toml",
        &format!(
            r#"
listen = ["127.0.0.1:0"]
upstream = "http://{up}"
admin_listen = "off"
trusted_proxies = ["127.0.0.1/32"]
[[route]]
group = "ip"
path = "/l/{{id}}"
[group.ip]
rate = 0.001
burst = 2
"#
        ),
    )
    .unwrap();
    let d = door(&before).await;
    let client = "198.51.100.7";
    let mut codes = Vec::new();
    for _ in 0..3 {
        codes.push(send(&d, "/l/a", client, &[]).await.status);
    }
    assert_eq!(
        codes,
        [
            StatusCode::OK,
            StatusCode::OK,
            StatusCode::TOO_MANY_REQUESTS
        ]
    );
    // Planes on (the IP plane's burst is 5), the group gone.
    let after = config(up, BEARER, "");
    assert!(d.front.app().reload(&after, &before).is_empty());
    for i in 0..5 {
        let a = send(&d, "/page", client, &[]).await;
        assert_eq!(a.status, StatusCode::OK, "request {i}: {}", a.body);
    }
    assert_eq!(
        send(&d, "/page", client, &[]).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
}
