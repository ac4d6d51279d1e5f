//! Streams end to end in network namespaces (root): door in its namespace with XDP attached to
//! its end of the veth pair in driver mode, in front of the demo upstream's WebSocket echo
//! (`GET /ws`) and event stream (`GET /events`); a WebSocket client (tokio-tungstenite) and an
//! event-stream client (hyper) in the client's namespace, over HTTP/1.1. door's `/status`, read
//! from inside door's namespace over its loopback (never over the veth, so never a SYN the shield
//! sees), shows the built-in `stream` group's slot taken while a stream is open and given back
//! when it closes, and the shield's SYN counters show the WebSocket took exactly one connection.
//! Namespaces are removed on drop, also when an assertion fails.
#![expect(
    clippy::unwrap_used,
    clippy::indexing_slicing,
    clippy::panic,
    reason = "test helpers: a failed step fails the test"
)]

use std::{
    future::Future,
    net::{IpAddr, SocketAddr},
    time::{Duration, Instant},
};

use bytes::{Bytes, BytesMut};
use door_tests::{
    netns::{self, CLIENT_ADDR, DOOR_ADDR, TempDir, Topology, syns_of},
    privileged_or_skip,
};
use futures_util::{SinkExt as _, StreamExt as _};
use http::{Request, StatusCode};
use http_body_util::{BodyExt as _, Empty};
use hyper_util::rt::TokioIo;
use serde_json::Value;
use tokio::net::{TcpSocket, TcpStream};
use tokio_tungstenite::tungstenite::Message;

/// door's listener on its end of the veth.
const DOOR_PORT: u16 = 8443;
/// Bound on every single network step of the clients (a handshake, one message, one event).
const STEP: Duration = Duration::from_secs(20);
/// Events the event-stream client reads before it closes.
const EVENTS: usize = 5;
/// The size of the large binary message.
const BIG: usize = 1 << 20;

/// No route: `/ws` and `/events` pass through, and their streams are limited in the built-in
/// `stream` group (the WebSocket as an upgrade, the event stream by its answer's type).
fn config(topo: &Topology) -> String {
    format!(
        r#"
listen = ["{DOOR_ADDR}:{DOOR_PORT}"]
upstream = "http://127.0.0.1:3000"
admin_listen = "127.0.0.1:9901"

[xdp]
interface = "{}"
mode = "driver"
ports = [{DOOR_PORT}]
"#,
        topo.door_if
    )
}

fn status(door_ns: &str) -> Value {
    netns::status(door_ns).unwrap()
}

/// The `stream` group's entry of `/status`'s `groups`.
fn stream_group(st: &Value) -> &Value {
    st["groups"]
        .as_array()
        .unwrap()
        .iter()
        .find(|g| g["name"] == "stream")
        .unwrap_or_else(|| panic!("no stream group in /status: {st:#}"))
}

fn stream_inflight(st: &Value) -> u64 {
    stream_group(st)["inflight"].as_u64().unwrap()
}

fn counter(st: &Value, name: &str) -> u64 {
    st["xdp"]["counters"][name].as_u64().unwrap_or(0)
}

/// The SYNs the shield counted for the client's /32 (0 before its first).
fn client_syns(st: &Value) -> u64 {
    syns_of(st, &format!("{CLIENT_ADDR}/32")).unwrap_or(0)
}

/// Every packet the shield dropped, by any reason.
fn drops(st: &Value) -> u64 {
    st["xdp"]["counters"]
        .as_object()
        .unwrap()
        .iter()
        .filter(|(name, _)| name.starts_with("drop/"))
        .filter_map(|(_, n)| n.as_u64())
        .sum()
}

/// Polls door's `/status` (every 100 ms, 10 s at most) until `f` holds; the last document.
fn eventually(door_ns: &str, what: &str, f: impl Fn(&Value) -> bool) -> Value {
    let start = Instant::now();
    loop {
        let st = status(door_ns);
        if f(&st) {
            return st;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "never: {what}: {st:#}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `fut`, failing the test when it takes longer than [`STEP`].
async fn within<T>(what: &str, fut: impl Future<Output = T>) -> T {
    tokio::time::timeout(STEP, fut)
        .await
        .unwrap_or_else(|_| panic!("{what}: nothing within {STEP:?}"))
}

/// A TCP connection to door from the client's address (one SYN on the veth).
async fn connect() -> TcpStream {
    let source: IpAddr = CLIENT_ADDR.parse().unwrap();
    let door: IpAddr = DOOR_ADDR.parse().unwrap();
    let socket = TcpSocket::new_v4().unwrap();
    socket.bind(SocketAddr::new(source, 0)).unwrap();
    within(
        "connecting to door",
        socket.connect(SocketAddr::new(door, DOOR_PORT)),
    )
    .await
    .unwrap()
}

/// The next event (up to its blank line) of an event stream, reading frames into `buf`; `None`
/// when the stream ended first.
async fn next_event(
    res: &mut http::Response<hyper::body::Incoming>,
    buf: &mut BytesMut,
) -> Option<String> {
    loop {
        if let Some(end) = buf.windows(2).position(|w| w == b"\n\n") {
            let event = buf.split_to(end + 2);
            return Some(String::from_utf8(event.to_vec()).unwrap());
        }
        match within("the next event", res.body_mut().frame()).await {
            Some(Ok(frame)) => {
                if let Some(data) = frame.data_ref() {
                    buf.extend_from_slice(data);
                }
            }
            Some(Err(e)) => panic!("the event stream failed: {e}"),
            None => return None,
        }
    }
}

#[test]
fn websocket_and_event_stream_through_door_with_xdp_in_driver_mode() {
    if !privileged_or_skip("netns_streams") {
        return;
    }
    let dir = TempDir::new("streams").unwrap();
    let mut topo = Topology::new().unwrap();
    topo.start_door(&dir.0, &config(&topo)).unwrap();
    let door_ns = topo.door_ns.as_str();

    let st = status(door_ns);
    assert_eq!(st["xdp"]["attached"], true, "{st:#}");
    assert_eq!(st["xdp"]["mode"], "driver", "{st:#}");
    assert_eq!(stream_inflight(&st), 0, "{st:#}");

    netns::block_on_in(&topo.client_ns, move || async move {
        websocket(door_ns).await;
        event_stream(door_ns).await;
    })
    .unwrap();

    let st = status(door_ns);
    assert_eq!(
        st["requests"]["stream"]["ok"], 2,
        "both streams were counted in the stream group: {st:#}"
    );
}

/// A WebSocket through door from the client's namespace: text, 1 MiB binary, ping, close; one
/// SYN for all of it, and the `stream` slot held while it is open and given back after.
async fn websocket(door_ns: &str) {
    // Nothing else connects over the veth from here to `open`: the client makes this one
    // connection, and `/status` is read over door's namespace's loopback.
    let before = status(door_ns);
    let tcp = connect().await;
    let url = format!("ws://{DOOR_ADDR}:{DOOR_PORT}/ws");
    let (mut ws, res) = within(
        "the WebSocket handshake",
        tokio_tungstenite::client_async(url, tcp),
    )
    .await
    .unwrap();
    assert_eq!(res.status(), StatusCode::SWITCHING_PROTOCOLS);
    let open = status(door_ns);
    assert_eq!(
        counter(&open, "pass/syn"),
        counter(&before, "pass/syn") + 1,
        "one connection, one SYN passed: {open:#}"
    );
    assert_eq!(
        client_syns(&open),
        client_syns(&before) + 1,
        "the SYN was counted for the client's /32: {open:#}"
    );
    assert_eq!(
        stream_inflight(&open),
        1,
        "the WebSocket holds a slot: {open:#}"
    );
    assert_eq!(stream_group(&open)["streams"], 1, "{open:#}");

    ws.send(Message::text("hello across the veth"))
        .await
        .unwrap();
    assert_eq!(
        within("the text echo", ws.next()).await.unwrap().unwrap(),
        Message::text("hello across the veth")
    );
    let big: Vec<u8> = (0..=250u8).cycle().take(BIG).collect();
    within("sending 1 MiB", ws.send(Message::binary(big.clone())))
        .await
        .unwrap();
    match within("the 1 MiB echo", ws.next()).await.unwrap().unwrap() {
        Message::Binary(echo) => {
            assert_eq!(echo.len(), BIG);
            assert!(echo == big, "the 1 MiB echo differs from what was sent");
        }
        other => panic!("expected the binary echo, got {other:?}"),
    }
    ws.send(Message::Ping(Bytes::from_static(b"still there?")))
        .await
        .unwrap();
    assert_eq!(
        within("the pong", ws.next()).await.unwrap().unwrap(),
        Message::Pong(Bytes::from_static(b"still there?"))
    );
    ws.close(None).await.unwrap();
    // The upstream's close answer comes back through door, then the stream ends.
    let mut after_close = 0;
    while let Some(msg) = within("the end of the WebSocket", ws.next()).await {
        match msg {
            Ok(Message::Close(_)) | Err(_) => {}
            Ok(other) => panic!("after close: {other:?}"),
        }
        after_close += 1;
        assert!(after_close < 10, "the WebSocket does not end");
    }
    drop(ws);
    let closed = eventually(door_ns, "the WebSocket's slot is given back", |st| {
        stream_inflight(st) == 0
    });
    assert_eq!(stream_group(&closed)["streams"], 0, "{closed:#}");
    assert_eq!(
        counter(&closed, "pass/syn"),
        counter(&before, "pass/syn") + 1,
        "the whole WebSocket session took one SYN: {closed:#}"
    );
    // The 1 MiB crossed the shield as segments, however large the veth's offloads make them.
    let segments = counter(&closed, "pass/not_syn") - counter(&before, "pass/not_syn");
    assert!(
        segments >= (BIG / 65_536) as u64,
        "{segments} segments passed the shield: {closed:#}"
    );
    assert_eq!(
        drops(&closed),
        drops(&before),
        "nothing dropped: {closed:#}"
    );
}

/// An event stream through door from the client's namespace: the first [`EVENTS`] events in
/// order, then the client closes; the `stream` slot is held while it is open and given back after.
async fn event_stream(door_ns: &str) {
    let tcp = connect().await;
    let (mut send, conn) = within(
        "the HTTP/1.1 handshake",
        hyper::client::conn::http1::handshake::<_, Empty<Bytes>>(TokioIo::new(tcp)),
    )
    .await
    .unwrap();
    let conn = tokio::spawn(conn);
    // An EventSource's request: door admits the answer to the stream group by its type.
    let req = Request::get("/events")
        .header("host", format!("{DOOR_ADDR}:{DOOR_PORT}"))
        .header("accept", "text/event-stream")
        .body(Empty::new())
        .unwrap();
    let mut res = within("the event stream's head", send.send_request(req))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK, "{res:?}");
    assert_eq!(res.headers()["content-type"], "text/event-stream");
    let mut buf = BytesMut::new();
    for n in 0..EVENTS {
        assert_eq!(
            next_event(&mut res, &mut buf).await.as_deref(),
            Some(format!("data: tick {n}\n\n").as_str()),
            "event {n}"
        );
    }
    let open = status(door_ns);
    assert_eq!(
        stream_inflight(&open),
        1,
        "the event stream holds a slot: {open:#}"
    );
    assert_eq!(stream_group(&open)["streams"], 1, "{open:#}");
    // Closing: the response, the request half and the connection itself.
    drop(res);
    drop(send);
    conn.abort();
    let _ = conn.await;
    let closed = eventually(door_ns, "the event stream's slot is given back", |st| {
        stream_inflight(st) == 0
    });
    assert_eq!(stream_group(&closed)["streams"], 0, "{closed:#}");
}
