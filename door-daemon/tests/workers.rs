//! door's worker threads (`Front::with_workers`, what a running door uses): the accept loop
//! hands connections to several single-threaded runtimes in turn, each sending upstream through
//! its own pool, while the limiters stay one per group, so a client's budget is exact whichever
//! worker serves its connections; the drain closes the listener.

mod support;

use std::{sync::Arc, time::Duration};

use door_daemon::{
    http::{App, ConnSettings, Front},
    obs::{metrics::Metrics, otlp::Telemetry},
    time::{Clock, MonotonicClock},
};
use http::StatusCode;
use tokio::net::{TcpListener, TcpStream};

#[tokio::test]
async fn workers_share_one_budget_per_client_and_all_stop_at_the_drain() {
    let upstream = support::upstream().await;
    let cfg = support::config(upstream, "");
    let telemetry = Telemetry::local();
    let metrics = Metrics::new(&telemetry.meter());
    let clock: Arc<dyn Clock> = Arc::new(MonotonicClock::new());
    let app = Arc::new(App::new(&cfg, &clock, &metrics, None));
    // As many workers as a running door starts here, and at least two.
    let workers = door_daemon::http::worker::count().max(2);
    let front = Front::with_workers(app, ConnSettings::from_config(&cfg), None, workers).unwrap();
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    front.serve(l, false);
    assert!(front.accepting());

    // Twelve connections at once, each one request from the same client (named by the trusted
    // proxy's X-Forwarded-For): spread over the workers, they still share the client's bucket
    // of 3 (and its in-flight cap of 2).
    let xff = [("x-forwarded-for", "192.0.2.7")];
    let answers = futures_util::future::join_all(
        (0..12).map(|_| support::request(addr, "GET", "/l/session/abc", &xff, "")),
    )
    .await;
    let ok = answers.iter().filter(|(s, _)| *s == StatusCode::OK).count();
    let limited = answers
        .iter()
        .filter(|(s, _)| *s == StatusCode::TOO_MANY_REQUESTS)
        .count();
    assert!(ok <= 3, "{ok} admitted past a burst of 3: {answers:?}");
    assert_eq!(ok + limited, 12, "{answers:?}");
    // Sequentially, on new connections, the budget is spent exactly.
    let mut more_ok = 0;
    for _ in 0..6 {
        let (status, _) = support::request(addr, "GET", "/l/session/abc", &xff, "").await;
        more_ok += usize::from(status == StatusCode::OK);
    }
    assert_eq!(
        ok + more_ok,
        3,
        "the client's 3 tokens, whichever worker served it"
    );
    // Pass-through requests, on connections handed to each worker in turn, go upstream through
    // the workers' pools.
    for i in 0..12 {
        let (status, body) = support::request(addr, "GET", &format!("/static/{i}"), &[], "").await;
        assert_eq!((status, body.as_str()), (StatusCode::OK, "ok"));
    }

    assert!(front.drain(Duration::from_secs(2)).await);
    assert!(!front.accepting());
    assert!(
        TcpStream::connect(addr).await.is_err(),
        "a drained front's listener is closed"
    );
}
