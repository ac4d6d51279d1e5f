//! door's upstream connections, seen from the upstream: an in-process door in front of a
//! hand-written HTTP/1.1 upstream that counts the connections it accepts and says when they
//! close. Keep-alive connections are reused across requests and clients; one the upstream closed
//! while idle, announced `Connection: close` on, or that still carries an abandoned response is
//! never reused; an idle one is closed 90 to 180 s after its last use.
#![expect(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::panic,
    reason = "test helpers outside #[test] functions fail loudly by design"
)]

#[expect(
    dead_code,
    clippy::panic,
    reason = "these tests read the upstream's side only, not the door's counts and slots (whose \
              helper panics when they never settle)"
)]
mod serving;

use std::{
    net::SocketAddr,
    sync::{
        Arc, Mutex,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use door_daemon::{config::Config, time::MonotonicClock};
use serving::{Door, door_with};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream},
    sync::mpsc,
};

/// How the upstream answers every request on one of its connections.
#[derive(Debug, Clone, Copy)]
enum Answer {
    /// `200 ok`, and the connection stays open.
    KeepAlive,
    /// `200 ok`, then the upstream closes the connection without having announced it.
    ThenClose,
    /// `200 ok` with `Connection: close`, then the upstream closes the connection.
    ConnectionClose,
    /// A head announcing 100 bytes and 10 of them; the rest never comes.
    Partial,
}

/// What happened to one of the upstream's connections.
#[derive(Debug)]
enum Event {
    /// The upstream closed it after answering.
    Closed,
    /// door closed it.
    PeerClosed,
}

/// A hand-written HTTP/1.1 upstream on 127.0.0.1.
struct Upstream {
    addr: SocketAddr,
    accepted: Arc<AtomicUsize>,
    events: mpsc::UnboundedReceiver<Event>,
}

impl Upstream {
    /// Answers its connections as `plan` says, one entry per connection in the order accepted;
    /// connections past the plan keep alive.
    async fn start(plan: &[Answer]) -> Self {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let accepted = Arc::new(AtomicUsize::new(0));
        let (tx, events) = mpsc::unbounded_channel();
        let plan = Arc::new(Mutex::new(plan.iter().rev().copied().collect::<Vec<_>>()));
        let count = Arc::clone(&accepted);
        tokio::spawn(async move {
            loop {
                let Ok((s, _)) = l.accept().await else { return };
                count.fetch_add(1, Ordering::SeqCst);
                let answer = plan.lock().unwrap().pop().unwrap_or(Answer::KeepAlive);
                tokio::spawn(serve(s, answer, tx.clone()));
            }
        });
        Self {
            addr,
            accepted,
            events,
        }
    }

    fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }

    /// The next event, waiting at most `limit`.
    async fn next(&mut self, limit: Duration) -> Event {
        tokio::time::timeout(limit, self.events.recv())
            .await
            .expect("the upstream saw no connection end in time")
            .unwrap()
    }

    /// The next event, for a test on tokio's paused clock: polled between yields (a million at
    /// most), so that no timer, and no paused time, passes while the upstream's end of the
    /// connection sees what door did.
    async fn next_now(&mut self) -> Event {
        for _ in 0..1_000_000 {
            if let Ok(event) = self.events.try_recv() {
                return event;
            }
            tokio::task::yield_now().await;
        }
        panic!("the upstream saw no connection end in time");
    }
}

/// One upstream connection: reads request heads (requests without bodies) and answers each.
async fn serve(mut s: TcpStream, answer: Answer, events: mpsc::UnboundedSender<Event>) {
    let mut buf = Vec::new();
    loop {
        while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
            let mut chunk = [0u8; 4096];
            match s.read(&mut chunk).await {
                Ok(0) | Err(_) => {
                    let _ = events.send(Event::PeerClosed);
                    return;
                }
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
        buf.clear();
        let reply: &[u8] = match answer {
            Answer::KeepAlive | Answer::ThenClose => {
                b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"
            }
            Answer::ConnectionClose => {
                b"HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 2\r\n\r\nok"
            }
            Answer::Partial => b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n0123456789",
        };
        s.write_all(reply).await.unwrap();
        if matches!(answer, Answer::ThenClose | Answer::ConnectionClose) {
            drop(s);
            let _ = events.send(Event::Closed);
            return;
        }
    }
}

fn config(upstream: SocketAddr) -> Config {
    let text = format!(
        r#"
listen = ["127.0.0.1:0"]
upstream = "http://{upstream}"
admin_listen = "off"
"#
    );
    Config::from_toml("pool.toml", &text).unwrap()
}

async fn door(upstream: &Upstream) -> Door {
    door_with(
        &config(upstream.addr),
        Arc::new(MonotonicClock::new()),
        None,
    )
    .await
}

/// Sends `GET /static` on `c` and reads the response head: its status, and the body's first
/// bytes when the head came with them.
async fn get_head(c: &mut TcpStream) -> (u16, Vec<u8>) {
    c.write_all(b"GET /static HTTP/1.1\r\nhost: door.test\r\n\r\n")
        .await
        .unwrap();
    let mut buf = Vec::new();
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let status = std::str::from_utf8(&buf[9..12]).unwrap().parse().unwrap();
            return (status, buf.split_off(end + 4));
        }
        let mut chunk = [0u8; 4096];
        let n = c.read(&mut chunk).await.unwrap();
        assert!(n > 0, "door closed the connection before a response head");
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// Reads from `c` onto `body` until it holds `len` bytes.
async fn read_to(c: &mut TcpStream, body: &mut Vec<u8>, len: usize) {
    while body.len() < len {
        let mut chunk = [0u8; 16];
        let n = c.read(&mut chunk).await.unwrap();
        assert!(n > 0, "door closed the connection mid-body");
        body.extend_from_slice(&chunk[..n]);
    }
}

/// Sends `GET /static` on `c` and reads the whole `200 ok` answer.
async fn get_ok(c: &mut TcpStream) {
    let (status, mut body) = get_head(c).await;
    assert_eq!(status, 200);
    read_to(c, &mut body, 2).await;
    assert_eq!(body, b"ok");
}

#[tokio::test]
async fn keep_alive_requests_reuse_one_upstream_connection_across_clients() {
    let up = Upstream::start(&[]).await;
    let door = door(&up).await;
    let mut c = TcpStream::connect(door.addr).await.unwrap();
    for _ in 0..10 {
        get_ok(&mut c).await;
    }
    drop(c);
    for _ in 0..10 {
        let mut c = TcpStream::connect(door.addr).await.unwrap();
        get_ok(&mut c).await;
    }
    assert_eq!(
        up.accepted(),
        1,
        "20 requests one after another need one connection"
    );
}

#[tokio::test]
async fn a_connection_the_upstream_closed_is_not_reused() {
    let plan = [
        Answer::ThenClose,
        Answer::ConnectionClose,
        Answer::ThenClose,
    ];
    let mut up = Upstream::start(&plan).await;
    let door = door(&up).await;
    let mut c = TcpStream::connect(door.addr).await.unwrap();
    for _ in plan {
        get_ok(&mut c).await;
        assert!(matches!(
            up.next(Duration::from_secs(10)).await,
            Event::Closed
        ));
    }
    get_ok(&mut c).await;
    assert_eq!(
        up.accepted(),
        4,
        "one connection per closed one, then one more"
    );
}

#[tokio::test]
async fn a_response_the_client_abandons_takes_its_upstream_connection_with_it() {
    let mut up = Upstream::start(&[Answer::Partial]).await;
    let door = door(&up).await;
    let mut c = TcpStream::connect(door.addr).await.unwrap();
    let (status, mut body) = get_head(&mut c).await;
    assert_eq!(status, 200);
    read_to(&mut c, &mut body, 10).await;
    assert_eq!(body, b"0123456789");
    drop(c);
    assert!(matches!(
        up.next(Duration::from_secs(10)).await,
        Event::PeerClosed
    ));
    let mut c = TcpStream::connect(door.addr).await.unwrap();
    get_ok(&mut c).await;
    assert_eq!(up.accepted(), 2, "the half-read connection was not reused");
}

/// The idle timeout is 90 s, and hyper-util's pool looks at its idle connections once per
/// timeout: a connection is closed between 90 and 180 s after its last use.
#[tokio::test(start_paused = true)]
async fn an_idle_upstream_connection_is_kept_for_its_idle_timeout_then_closed() {
    let mut up = Upstream::start(&[]).await;
    let door = door(&up).await;
    let mut c = TcpStream::connect(door.addr).await.unwrap();
    get_ok(&mut c).await;
    tokio::time::advance(Duration::from_secs(89)).await;
    for _ in 0..1000 {
        tokio::task::yield_now().await;
    }
    assert!(
        up.events.try_recv().is_err(),
        "closed before 89 s of idleness"
    );
    tokio::time::advance(Duration::from_secs(92)).await;
    assert!(
        matches!(up.next_now().await, Event::PeerClosed),
        "still open after 181 s of idleness"
    );
    // The next request opens a new one.
    let mut c = TcpStream::connect(door.addr).await.unwrap();
    get_ok(&mut c).await;
    assert_eq!(up.accepted(), 2);
}
