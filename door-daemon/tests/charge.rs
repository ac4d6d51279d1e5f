//! Charge on failure cannot be dodged by hanging up (found by hostile testing): a webhook client
//! that sends its delivery and disconnects before the upstream's answer is still charged when
//! the upstream answers 4xx. In-process on 127.0.0.1; the upstream answers only when the test lets
//! it, after the client has gone.
#![expect(
    clippy::unwrap_used,
    clippy::indexing_slicing,
    reason = "test code: a failed step fails the test"
)]

use std::{
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use door_daemon::{
    config::Config,
    http::{App, ConnSettings, Front},
    obs::metrics::{Metrics, Outcome},
    time::{Clock, MonotonicClock},
};
use http_body_util::BodyExt;
use hyper::client::conn::http2::Builder;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream},
    sync::Semaphore,
};

/// An upstream that reads a request, then answers `400` once the test adds a permit to `go`.
async fn gated_upstream(go: Arc<Semaphore>) -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            let go = Arc::clone(&go);
            tokio::spawn(async move {
                let mut seen = Vec::new();
                let mut buf = [0u8; 4096];
                // Headers, then the 2-byte body the test sends.
                while !(seen.windows(4).any(|w| w == b"\r\n\r\n") && seen.ends_with(b"{}")) {
                    match s.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => seen.extend_from_slice(&buf[..n]),
                    }
                }
                go.acquire().await.unwrap().forget();
                let _ = s
                    .write_all(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 3\r\nconnection: close\r\n\r\nbad")
                    .await;
            });
        }
    });
    addr
}

fn client_errors(app: &App) -> u64 {
    app.outcome_totals("webhook")
        .into_iter()
        .find(|(o, _)| *o == Outcome::ClientError)
        .unwrap()
        .1
}

const DELIVERY: &[u8] =
    b"POST /webhooks/github HTTP/1.1\r\nhost: d\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{}";

#[tokio::test]
async fn hanging_up_before_the_answer_does_not_dodge_the_charge() {
    let go = Arc::new(Semaphore::new(0));
    let up = gated_upstream(Arc::clone(&go)).await;
    let cfg = Config::from_toml(
        "charge.toml",
        &format!(
            r#"
listen = ["127.0.0.1:0"]
upstream = "http://{up}"
admin_listen = "off"
[[route]]
group = "webhook"
methods = ["POST"]
path = "/webhooks/github"
[group.webhook]
rate = 0.001
burst = 2
per_client = 2
"#
        ),
    )
    .unwrap();
    let clock: Arc<dyn Clock> = Arc::new(MonotonicClock::new());
    let app = Arc::new(App::new(&cfg, &clock, &Metrics::noop(), None));
    let front = Front::new(Arc::clone(&app), ConnSettings::from_config(&cfg), None);
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    front.serve(listener, false);

    for delivered in 1..=2 {
        // The whole delivery, then the client hangs up before any answer.
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(DELIVERY).await.unwrap();
        s.flush().await.unwrap();
        drop(s);
        // Only now does the upstream answer 400; door must charge the delivery for it.
        go.add_permits(1);
        for _ in 0..500 {
            if client_errors(&app) == delivered {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(
            client_errors(&app),
            delivered,
            "delivery {delivered} settled as 4xx"
        );
    }
    // Both held tokens were spent: the bucket (burst 2) is empty.
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(DELIVERY).await.unwrap();
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out).await;
    let text = String::from_utf8_lossy(&out);
    assert!(text.starts_with("HTTP/1.1 429"), "{text}");
}

/// An upstream answering every request with the bytes `answer` makes, then holding the
/// connection until door closes it; `closed` counts the connections door closed (before or
/// after the answer was written whole: the socket buffers may take it all).
async fn upstream_answering(
    answer: impl Fn() -> Vec<u8> + Send + Sync + 'static,
) -> (SocketAddr, Arc<AtomicUsize>) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let closed = Arc::new(AtomicUsize::new(0));
    let count = Arc::clone(&closed);
    let answer = Arc::new(answer);
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            let (closed, answer) = (Arc::clone(&count), Arc::clone(&answer));
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                let _ = s.read(&mut buf).await;
                if s.write_all(&answer()).await.is_ok() {
                    let _ = s.read(&mut buf).await;
                }
                closed.fetch_add(1, Ordering::SeqCst);
            });
        }
    });
    (addr, closed)
}

/// An upstream answering every request with a body of `size` bytes ([`upstream_answering`]).
async fn big_upstream(size: usize) -> (SocketAddr, Arc<AtomicUsize>) {
    upstream_answering(move || {
        let mut answer = format!("HTTP/1.1 200 OK\r\ncontent-length: {size}\r\n\r\n").into_bytes();
        answer.resize(answer.len() + size, b'x');
        answer
    })
    .await
}

/// door in front of `up` with one limited group, `link` (`/l/{id}`), whose `read_timeout` is 5 s,
/// and a `send_timeout` of 5 s for the rest (pass-through); its address, and a reader of the
/// requests in flight (the group's, and pass-through) and of the client connections open.
async fn slow_reader_door(up: SocketAddr) -> (SocketAddr, impl Fn() -> (u32, u32, u32)) {
    let cfg = Config::from_toml(
        "slow-reader.toml",
        &format!(
            r#"
listen = ["127.0.0.1:0"]
upstream = "http://{up}"
admin_listen = "off"
send_timeout = "5s"
[[route]]
group = "link"
path = "/l/{{id}}"
[group.link]
read_timeout = "5s"
"#
        ),
    )
    .unwrap();
    let clock: Arc<dyn Clock> = Arc::new(MonotonicClock::new());
    let app = Arc::new(App::new(&cfg, &clock, &Metrics::noop(), None));
    let front = Front::new(Arc::clone(&app), ConnSettings::from_config(&cfg), None);
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    front.serve(listener, false);
    // The front lives as long as its app's reader: the test's.
    let inflight = move || {
        let limiters = app.limiters();
        let link = limiters.iter().find(|l| l.group() == "link").unwrap();
        (
            link.inflight(),
            app.passthrough_in_flight(),
            front.connections_open(),
        )
    };
    (addr, inflight)
}

/// Sends `GET path` and reads the head and a little of the body: the connection, and how many
/// bytes of the body came with the head.
async fn get_big(addr: SocketAddr, path: &str) -> (TcpStream, usize) {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(format!("GET {path} HTTP/1.1\r\nhost: d\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut first = [0u8; 1024];
    let n = s.read(&mut first).await.unwrap();
    assert!(
        first[..n].starts_with(b"HTTP/1.1 200"),
        "{:?}",
        String::from_utf8_lossy(&first[..n])
    );
    let head = first[..n]
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap()
        + 4;
    (s, n - head)
}

/// The sender of an HTTP/2 connection the tests' clients make.
type H2Send = hyper::client::conn::http2::SendRequest<http_body_util::Empty<bytes::Bytes>>;

/// An HTTP/2 connection to `addr` made by `builder`: its sender, and its driver's task.
async fn h2_connect(
    addr: SocketAddr,
    builder: &Builder<TokioExecutor>,
) -> (H2Send, tokio::task::JoinHandle<hyper::Result<()>>) {
    let s = TcpStream::connect(addr).await.unwrap();
    let (send, conn) = builder
        .handshake(hyper_util::rt::TokioIo::new(s))
        .await
        .unwrap();
    (send, tokio::spawn(conn))
}

/// `GET path` on `send`: the response, asserted 200.
async fn h2_get(send: &mut H2Send, path: &str) -> hyper::Response<hyper::body::Incoming> {
    let req = hyper::Request::get(format!("http://d{path}"))
        .body(http_body_util::Empty::new())
        .unwrap();
    let res = send.send_request(req).await.unwrap();
    assert_eq!(res.status(), 200, "{path}");
    res
}

/// Waits (at most a minute of the paused clock from `start`) for the upstream's connection to be
/// closed: its answer dropped.
async fn upstream_closed(closed: &AtomicUsize, start: tokio::time::Instant) {
    while closed.load(Ordering::SeqCst) == 0 && start.elapsed() < Duration::from_mins(1) {
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    assert_eq!(
        closed.load(Ordering::SeqCst),
        1,
        "the upstream's answer is dropped"
    );
}

/// Waits (at most two minutes of the paused clock from `start`) for door to close the client's
/// connection, which reads nothing meanwhile: once its exchange was ended, the connection has
/// nothing in flight and is closed once idle, where hyper held it until the client read again.
async fn client_connection_closed(open: impl Fn() -> u32, start: tokio::time::Instant) {
    while open() != 0 && start.elapsed() < Duration::from_mins(2) {
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    assert_eq!(open(), 0, "the client's connection is still open");
}

/// The client, reading again, finds the response of `size` bytes cut short: never a whole one.
async fn reads_a_cut_response(s: &mut TcpStream, size: usize) {
    let mut rest = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(30), s.read_to_end(&mut rest)).await;
    assert!(
        matches!(read, Ok(Ok(_))),
        "door does not close the connection: {read:?}"
    );
    assert!(rest.len() < size, "{} bytes", rest.len());
}

/// A client that stops reading gives its limiter slot back at the send deadline (the group's
/// `read_timeout` after the head), and once the response has moved nothing for as long again,
/// the upstream's answer is dropped: its connection closed, where it used to stay open, the
/// application's handler writing, for as long as the client kept its connection.
#[tokio::test(start_paused = true)]
async fn a_client_that_stops_reading_gives_its_slot_back_at_the_deadline() {
    // 64 MiB: far more than the loopback socket buffers take, so the upstream is still writing
    // when the client stops.
    let (up, closed) = big_upstream(64 << 20).await;
    let (addr, both) = slow_reader_door(up).await;
    let inflight = || both().0;
    let start = door_daemon::time::now();
    // Read the head and a little of the body, then stop reading (keeping the connection open).
    let (mut s, _) = get_big(addr, "/l/big").await;
    assert_eq!(inflight(), 1, "the response is being sent");
    // The paused clock moves on to the next timer when nothing else can run: the send deadline.
    while inflight() != 0 && start.elapsed() < Duration::from_mins(1) {
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    assert_eq!(
        inflight(),
        0,
        "a slow reader keeps its connection, not a limiter slot"
    );
    assert!(
        start.elapsed() < Duration::from_secs(7),
        "{:?}",
        start.elapsed()
    );
    // Nothing moves for 5 s more: the upstream's answer is dropped.
    upstream_closed(&closed, start).await;
    // Not before (the clock is exact there); when the closing reaches the upstream depends on
    // the sockets, and the paused clock moves on while nothing else runs.
    let waited = start.elapsed();
    assert!(waited >= Duration::from_secs(10), "{waited:?}");
    client_connection_closed(|| both().2, start).await;
    reads_a_cut_response(&mut s, 64 << 20).await;
}

/// A client that reads slowly but steadily gets the whole response, past the send deadline (a
/// limited route's) or the send timeout (pass-through), though the response takes frames from the
/// upstream only in bursts far apart (the socket buffers drain slowly): only a client that stops
/// taking it loses it.
#[tokio::test(start_paused = true)]
async fn a_client_reading_slowly_gets_the_whole_response() {
    // 64 MiB: far more than the socket buffers hold, so the response is still being sent long
    // after the deadline.
    let size = 64 << 20;
    for path in ["/l/big", "/p/big"] {
        // Its upstream answers one request per connection.
        let (up, _) = big_upstream(size).await;
        let (addr, inflight) = slow_reader_door(up).await;
        let (s, mut got) = get_big(addr, path).await;
        let start = door_daemon::time::now();
        let mut freed_at = None;
        // Each read blocking, on tokio's blocking pool: the paused clock does not move on while
        // it waits for bytes (it would while an async read waited), so a second passes only
        // where the reader sleeps.
        let mut s = s.into_std().unwrap();
        s.set_nonblocking(false).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        // At most 256 KiB a second: the 64 MiB take over four minutes, fifty times the deadline.
        while got < size && start.elapsed() < Duration::from_mins(10) {
            let (back, n) = tokio::task::spawn_blocking(move || {
                let mut buf = vec![0u8; 256 << 10];
                let n = std::io::Read::read(&mut s, &mut buf).unwrap();
                (s, n)
            })
            .await
            .unwrap();
            s = back;
            if n == 0 {
                break;
            }
            got += n;
            if freed_at.is_none() && inflight().0 == 0 {
                freed_at = Some(got);
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        assert_eq!(got, size, "{path}: the response was cut");
        if path.starts_with("/l/") {
            let freed_at = freed_at.expect("the deadline freed the slot");
            assert!(freed_at < size / 2, "freed only after {freed_at} bytes");
        }
    }
}

/// A client that stops reading a pass-through response (no deadline, no limiter slot) has it
/// ended once it has taken nothing for `send_timeout`: the upstream's connection is closed and
/// the `upstream_max_inflight` slot freed, where both were held for as long as the client kept
/// its connection.
#[tokio::test(start_paused = true)]
async fn a_pass_through_client_that_stops_reading_is_ended_at_the_send_timeout() {
    let (up, closed) = big_upstream(64 << 20).await;
    let (addr, inflight) = slow_reader_door(up).await;
    let start = door_daemon::time::now();
    let (mut s, _) = get_big(addr, "/p/big").await;
    assert_eq!(inflight(), (0, 1, 1), "the response is being sent");
    upstream_closed(&closed, start).await;
    // The bytes the sockets took at once are the last sent: ended 5 s to 5.625 s after them
    // (seen within a second: `upstream_closed` looks once a second), so by 6.625 s. The bound
    // is 8 s, well short of a second send timeout (10 s), so that a paused clock's jump while
    // the runtime waits on the sockets cannot fail a door that ends it on time.
    let waited = start.elapsed();
    assert!(
        waited >= Duration::from_secs(5) && waited <= Duration::from_secs(8),
        "{waited:?}"
    );
    assert_eq!(inflight().1, 0, "the pass-through slot is freed");
    client_connection_closed(|| inflight().2, start).await;
    reads_a_cut_response(&mut s, 64 << 20).await;
}

/// A pass-through response whose upstream sends nothing for a while (a long poll) is not ended
/// at the send timeout, over HTTP/1.1 or HTTP/2: door waits on the upstream, not on the client.
#[tokio::test(start_paused = true)]
async fn a_pass_through_response_the_upstream_pauses_is_kept() {
    let (up, closed) = pausing_upstream().await;
    let (addr, inflight) = slow_reader_door(up).await;
    let (s, got) = get_big(addr, "/p/poll").await;
    assert_eq!(got, 1);
    let (mut send, _conn) = h2_connect(addr, &Builder::new(TokioExecutor::new())).await;
    let mut res = h2_get(&mut send, "/p/poll").await;
    assert!(res.body_mut().frame().await.is_some());
    // Six send timeouts.
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert_eq!(
        closed.load(Ordering::SeqCst),
        0,
        "ended while the upstream was silent"
    );
    assert_eq!(inflight(), (0, 2, 2));
    drop((s, res));
}

/// An upstream that answers its head and one byte of a 10-byte body, then nothing, holding the
/// connection ([`upstream_answering`]).
async fn pausing_upstream() -> (SocketAddr, Arc<AtomicUsize>) {
    upstream_answering(|| b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nx".to_vec()).await
}

/// A response whose upstream pauses after its head gives its slot back at the send deadline and
/// is ended once it has moved nothing for `read_timeout` after that deadline: at twice the
/// timeout, not at the deadline itself.
#[tokio::test(start_paused = true)]
async fn a_response_the_upstream_pauses_is_ended_read_timeout_after_the_deadline() {
    let (up, closed) = pausing_upstream().await;
    let (addr, both) = slow_reader_door(up).await;
    let inflight = || both().0;
    let start = door_daemon::time::now();
    let (mut s, got) = get_big(addr, "/l/big").await;
    assert_eq!(got, 1);
    while inflight() != 0 && start.elapsed() < Duration::from_mins(1) {
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    assert!(
        start.elapsed() < Duration::from_secs(7),
        "{:?}",
        start.elapsed()
    );
    tokio::time::sleep_until(start + Duration::from_secs(9)).await;
    assert_eq!(
        closed.load(Ordering::SeqCst),
        0,
        "ended before 2 × read_timeout"
    );
    // The client, reading on, sees the response end short of its 10 bytes.
    let mut rest = Vec::new();
    tokio::time::timeout(Duration::from_mins(1), s.read_to_end(&mut rest))
        .await
        .expect("door closes the connection")
        .unwrap();
    assert!(rest.is_empty(), "{rest:?}");
    let waited = start.elapsed();
    assert!(waited >= Duration::from_secs(10), "{waited:?}");
    while closed.load(Ordering::SeqCst) == 0 && start.elapsed() < Duration::from_mins(1) {
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    assert_eq!(
        closed.load(Ordering::SeqCst),
        1,
        "the upstream's connection is closed"
    );
}

/// An HTTP/2 client that stops reading its responses (their windows shut) but keeps its
/// connection busy, here with a PING every second, still has them ended: a limited one
/// `read_timeout` after its deadline, a pass-through one at the send timeout. Judged by the bytes
/// the connection wrote, the PINGs' answers kept both open for as long as the client pinged.
#[tokio::test(start_paused = true)]
async fn an_http2_client_that_stops_reading_is_ended_though_it_pings() {
    // Two upstream connections: one per request.
    let (up, closed) = big_upstream(64 << 20).await;
    let (addr, inflight) = slow_reader_door(up).await;
    let start = door_daemon::time::now();
    let mut builder = Builder::new(TokioExecutor::new());
    builder
        .timer(TokioTimer::new())
        .keep_alive_interval(Duration::from_secs(1))
        .keep_alive_while_idle(true);
    let (mut send, pinging) = h2_connect(addr, &builder).await;
    let mut held = Vec::new();
    for path in ["/l/big", "/p/big"] {
        let mut res = h2_get(&mut send, path).await;
        assert!(res.body_mut().frame().await.is_some(), "{path}");
        held.push(res);
    }
    assert_eq!(inflight(), (1, 1, 1));
    while closed.load(Ordering::SeqCst) < 2 && start.elapsed() < Duration::from_mins(1) {
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    assert_eq!(
        closed.load(Ordering::SeqCst),
        2,
        "an upstream's answer is held"
    );
    assert_eq!(inflight().0, 0);
    assert_eq!(inflight().1, 0);
    assert!(
        !pinging.is_finished(),
        "the client's connection stays open, pinging"
    );
    drop(held);
}

/// An HTTP/2 client that reads slowly but steadily (its windows opened as it reads, 48 KiB a
/// second) gets the whole response past the send deadline: the parts it takes show it reads,
/// though its connection writes nothing else.
#[tokio::test(start_paused = true)]
async fn an_http2_client_reading_slowly_gets_the_whole_response() {
    let size = 8 << 20;
    let (up, _) = big_upstream(size).await;
    let (addr, _door) = slow_reader_door(up).await;
    let mut builder = Builder::new(TokioExecutor::new());
    builder
        .initial_stream_window_size(64 << 10)
        .initial_connection_window_size(64 << 10);
    let (mut send, _conn) = h2_connect(addr, &builder).await;
    let mut res = h2_get(&mut send, "/l/big").await;
    let start = door_daemon::time::now();
    let (mut got, mut this_second) = (0, 0);
    while got < size && start.elapsed() < Duration::from_mins(10) {
        match res.body_mut().frame().await {
            Some(Ok(f)) => {
                let n = f.data_ref().map_or(0, bytes::Bytes::len);
                got += n;
                this_second += n;
            }
            Some(Err(e)) => panic!("cut after {got} bytes: {e}"),
            None => break,
        }
        if this_second >= 48 << 10 {
            this_second = 0;
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }
    assert_eq!(got, size);
}

/// Eight pass-through downloads on one HTTP/2 connection, each read slowly but steadily (8 KiB a
/// second: one DATA frame of at most 16 KiB every two seconds), all arrive whole: each moves as
/// its own bytes are sent, though hyper takes a frame from its upstream only once the stream has
/// sent most of what it holds, longer apart than the send timeout.
#[tokio::test(start_paused = true)]
async fn streams_sharing_a_slow_http2_connection_arrive_whole() {
    let size = 512 << 10;
    let (up, closed) = big_upstream(size).await;
    let (addr, _door) = slow_reader_door(up).await;
    let mut builder = Builder::new(TokioExecutor::new());
    builder
        .initial_stream_window_size(16 << 10)
        .initial_connection_window_size(1 << 20);
    let (mut send, _conn) = h2_connect(addr, &builder).await;
    let mut streams = Vec::new();
    for i in 0..8 {
        streams.push((h2_get(&mut send, &format!("/p/{i}")).await, 0_usize));
    }
    // The clock moves only where the reader says: a task always ready keeps the paused clock from
    // jumping to door's next timer while the reader waits for a frame on the socket.
    let spinner = tokio::spawn(async {
        loop {
            tokio::task::yield_now().await;
        }
    });
    let start = door_daemon::time::now();
    while streams.iter().any(|(_, got)| *got < size) && start.elapsed() < Duration::from_mins(10) {
        for (i, (res, got)) in streams.iter_mut().enumerate() {
            if *got == size {
                continue;
            }
            match res.body_mut().frame().await {
                Some(Ok(f)) => *got += f.data_ref().map_or(0, bytes::Bytes::len),
                other => panic!("stream {i} cut after {got} bytes: {other:?}"),
            }
        }
        tokio::time::advance(Duration::from_secs(2)).await;
    }
    spinner.abort();
    assert!(streams.iter().all(|(_, got)| *got == size));
    assert_eq!(
        closed.load(Ordering::SeqCst),
        0,
        "an upstream's answer was dropped"
    );
}
