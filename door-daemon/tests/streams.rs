//! Long-lived traffic through door (docs/design.md, "Streams and sessions"): WebSockets over
//! HTTP/1.1 `Upgrade` and over HTTP/2 extended CONNECT (RFC 8441), plain and with TLS, against a
//! real WebSocket upstream (tokio-tungstenite); h2c and smuggled upgrades refused; server-sent
//! event streams with their own caps. In-process on 127.0.0.1; time-driven tests run on tokio's
//! paused clock.

#![expect(
    clippy::unwrap_used,
    clippy::panic,
    reason = "test helpers outside #[test] functions fail loudly by design"
)]

mod serving;

use std::{
    convert::Infallible,
    net::SocketAddr,
    sync::{
        Arc, Mutex,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use bytes::Bytes;
use door_daemon::{config::Config, obs::metrics::Outcome, time::MonotonicClock};
use futures_util::{SinkExt as _, StreamExt as _};
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt as _, Empty, StreamBody, combinators::BoxBody};
use hyper::body::{Frame, Incoming};
use hyper_util::rt::{TokioExecutor, TokioIo};
use serving::{Door, door_with};
use tokio::{
    io::{AsyncReadExt as _, AsyncWriteExt as _},
    net::{TcpListener, TcpStream},
    sync::mpsc,
};
use tokio_tungstenite::{
    WebSocketStream,
    tungstenite::{
        Message,
        handshake::server::{Request as WsRequest, Response as WsResponse},
        protocol::{CloseFrame, Role, frame::coding::CloseCode},
    },
};

/// The request heads the WebSocket upstream saw.
type Seen = Arc<Mutex<Vec<http::HeaderMap>>>;

/// A WebSocket echo server on 127.0.0.1 (tokio-tungstenite): echoes text and binary messages,
/// answers pings (tungstenite does), and closes with code 4000 when it receives the text
/// `"close please"`.
async fn ws_upstream(seen: Seen) -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            let seen = Arc::clone(&seen);
            tokio::spawn(async move {
                #[expect(
                    clippy::result_large_err,
                    reason = "tungstenite's callback type: its error is an HTTP response"
                )]
                let record = |req: &WsRequest, res: WsResponse| {
                    seen.lock().unwrap().push(req.headers().clone());
                    Ok(res)
                };
                let Ok(mut ws) = tokio_tungstenite::accept_hdr_async(s, record).await else {
                    return;
                };
                while let Some(Ok(msg)) = ws.next().await {
                    match msg {
                        Message::Text(t) if t.as_str() == "close please" => {
                            let _ = ws
                                .close(Some(CloseFrame {
                                    code: CloseCode::Library(4000),
                                    reason: "bye".into(),
                                }))
                                .await;
                        }
                        m @ (Message::Text(_) | Message::Binary(_)) => {
                            let sent = ws.send(m).await;
                            if sent.is_err() {
                                return;
                            }
                        }
                        _ => {}
                    }
                }
            });
        }
    });
    addr
}

fn config(upstream: SocketAddr, top: &str, tables: &str) -> Config {
    Config::from_toml(
        "streams.toml",
        &format!(
            r#"
listen = ["127.0.0.1:0"]
upstream = "http://{upstream}"
admin_listen = "off"
{top}
[[route]]
group = "stream"
path = "/events/{{x}}"
stream = true
{tables}
"#
        ),
    )
    .unwrap()
}

async fn door(cfg: &Config, tls: Option<Arc<rustls::ServerConfig>>) -> Door {
    door_with(cfg, Arc::new(MonotonicClock::new()), tls).await
}

// ---------------------------------------------------------------- TLS

struct Tls {
    dir: std::path::PathBuf,
    cert: rcgen::Certificate,
    server: Arc<rustls::ServerConfig>,
}

impl Drop for Tls {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn tls(name: &str) -> (Tls, String) {
    let dir = std::env::temp_dir().join(format!("door-streams-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let ck = rcgen::generate_simple_self_signed(vec!["door.test".to_owned()]).unwrap();
    let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
    std::fs::write(&cert, ck.cert.pem()).unwrap();
    std::fs::write(&key, ck.signing_key.serialize_pem()).unwrap();
    let table = format!(
        "[tls]\ncert = \"{}\"\nkey = \"{}\"",
        cert.display(),
        key.display()
    );
    let cfg = Config::from_toml("tls.toml", &format!("{table}\n")).unwrap();
    let server = door_daemon::http::tls::load(cfg.tls.as_ref().unwrap()).unwrap();
    (
        Tls {
            dir,
            cert: ck.cert,
            server,
        },
        table,
    )
}

/// A TLS connection to door offering `alpn`, trusting `cert`.
async fn tls_connect(
    addr: SocketAddr,
    cert: &rcgen::Certificate,
    alpn: &[u8],
) -> tokio_rustls::client::TlsStream<TcpStream> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(cert.der().clone()).unwrap();
    let mut cfg = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    cfg.alpn_protocols = vec![alpn.to_vec()];
    let name = rustls::pki_types::ServerName::try_from("door.test").unwrap();
    let s = TcpStream::connect(addr).await.unwrap();
    tokio_rustls::TlsConnector::from(Arc::new(cfg))
        .connect(name, s)
        .await
        .unwrap()
}

// ---------------------------------------------------------------- WebSocket clients

type Io = Box<dyn AsyncIo>;
trait AsyncIo: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send> AsyncIo for T {}

/// A WebSocket client over HTTP/1.1 `Upgrade` on `io` (tokio-tungstenite's client handshake).
async fn ws_http1(io: Io, scheme: &str) -> WebSocketStream<Io> {
    let url = format!("{scheme}://door.test/chat");
    let (ws, res) = tokio_tungstenite::client_async(url, io).await.unwrap();
    assert_eq!(res.status(), StatusCode::SWITCHING_PROTOCOLS);
    ws
}

/// A WebSocket client over HTTP/2 extended CONNECT (RFC 8441) on `io`: hyper's HTTP/2 client
/// sends `:method CONNECT`, `:protocol websocket`; on 200 the stream carries WebSocket frames.
async fn ws_http2(io: Io, scheme: &str) -> WebSocketStream<TokioIo<hyper::upgrade::Upgraded>> {
    let mut res = extended_connect(io, scheme).await;
    assert_eq!(res.status(), StatusCode::OK, "{res:?}");
    let upgraded = hyper::upgrade::on(&mut res).await.unwrap();
    WebSocketStream::from_raw_socket(TokioIo::new(upgraded), Role::Client, None).await
}

/// Text and binary echo, a 1 MiB message, ping/pong, and a close from the client.
async fn chat<S>(mut ws: WebSocketStream<S>)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    ws.send(Message::text("hello")).await.unwrap();
    assert_eq!(ws.next().await.unwrap().unwrap(), Message::text("hello"));
    ws.send(Message::binary(vec![0u8, 1, 2, 255]))
        .await
        .unwrap();
    assert_eq!(
        ws.next().await.unwrap().unwrap(),
        Message::binary(vec![0u8, 1, 2, 255])
    );
    let big: Vec<u8> = (0..1 << 20).map(|i: u32| (i % 251) as u8).collect();
    ws.send(Message::binary(big.clone())).await.unwrap();
    assert_eq!(ws.next().await.unwrap().unwrap(), Message::binary(big));
    ws.send(Message::Ping(Bytes::from_static(b"are you there")))
        .await
        .unwrap();
    assert_eq!(
        ws.next().await.unwrap().unwrap(),
        Message::Pong(Bytes::from_static(b"are you there"))
    );
    ws.close(None).await.unwrap();
    // The upstream's close answer comes back through door, then the stream ends.
    while let Some(msg) = ws.next().await {
        match msg {
            Ok(Message::Close(_)) | Err(_) => {}
            Ok(other) => panic!("after close: {other:?}"),
        }
    }
}

/// The upstream closes (code 4000): the client sees the close frame.
async fn closed_by_upstream<S>(mut ws: WebSocketStream<S>)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    ws.send(Message::text("close please")).await.unwrap();
    match ws.next().await.unwrap().unwrap() {
        Message::Close(Some(frame)) => assert_eq!(frame.code, CloseCode::Library(4000)),
        other => panic!("expected the upstream's close, got {other:?}"),
    }
}

#[tokio::test]
async fn websocket_over_http11_echoes_text_binary_1_mib_and_ping_and_closes_from_either_side() {
    let seen = Seen::default();
    let up = ws_upstream(Arc::clone(&seen)).await;
    let d = door(&config(up, "", ""), None).await;
    let io: Io = Box::new(TcpStream::connect(d.addr).await.unwrap());
    chat(ws_http1(io, "ws").await).await;
    let io: Io = Box::new(TcpStream::connect(d.addr).await.unwrap());
    closed_by_upstream(ws_http1(io, "ws").await).await;
    // The forwarding headers were rewritten: the upstream sees door's peer, not the client's.
    {
        let seen = seen.lock().unwrap();
        assert_eq!(seen.len(), 2);
        assert_eq!(seen[0]["x-forwarded-for"], "127.0.0.1");
        assert_eq!(seen[0]["x-forwarded-proto"], "http");
    }
    d.eventually("both streams closed", |d| d.inflight("stream") == 0)
        .await;
    assert_eq!(d.count("stream", Outcome::Ok), 2);
}

#[tokio::test]
async fn websocket_over_http2_extended_connect_reaches_an_http11_upstream() {
    let seen = Seen::default();
    let up = ws_upstream(Arc::clone(&seen)).await;
    let d = door(&config(up, "", ""), None).await;
    let io: Io = Box::new(TcpStream::connect(d.addr).await.unwrap());
    chat(ws_http2(io, "http").await).await;
    let io: Io = Box::new(TcpStream::connect(d.addr).await.unwrap());
    closed_by_upstream(ws_http2(io, "http").await).await;
    {
        let seen = seen.lock().unwrap();
        assert_eq!(seen[0]["upgrade"], "websocket");
        assert_eq!(seen[0]["x-forwarded-for"], "127.0.0.1");
    }
    d.eventually("both streams closed", |d| d.inflight("stream") == 0)
        .await;
}

#[tokio::test]
async fn websocket_with_tls_over_http11_and_http2() {
    let seen = Seen::default();
    let up = ws_upstream(Arc::clone(&seen)).await;
    let (t, table) = tls("ws");
    let d = door(&config(up, "", &table), Some(Arc::clone(&t.server))).await;
    let io: Io = Box::new(tls_connect(d.addr, &t.cert, b"http/1.1").await);
    chat(ws_http1(io, "wss").await).await;
    let io: Io = Box::new(tls_connect(d.addr, &t.cert, b"h2").await);
    chat(ws_http2(io, "https").await).await;
    let seen = seen.lock().unwrap();
    assert!(seen.iter().all(|h| h["x-forwarded-proto"] == "https"));
}

// ---------------------------------------------------------------- refused upgrades

/// A scripted HTTP/1.1 upstream: records each request head it reads and answers `answer`.
async fn raw_upstream(answer: &'static [u8], heads: Arc<Mutex<Vec<String>>>) -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            let heads = Arc::clone(&heads);
            tokio::spawn(async move {
                loop {
                    let mut head = Vec::new();
                    let mut byte = [0u8; 1];
                    while !head.ends_with(b"\r\n\r\n") {
                        match s.read(&mut byte).await {
                            Ok(1) => head.push(byte[0]),
                            _ => return,
                        }
                    }
                    heads
                        .lock()
                        .unwrap()
                        .push(String::from_utf8_lossy(&head).to_ascii_lowercase());
                    if s.write_all(answer).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    addr
}

/// Writes `request` on `s` and reads one response head.
async fn exchange(s: &mut TcpStream, request: &[u8]) -> String {
    s.write_all(request).await.unwrap();
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        assert_eq!(s.read(&mut byte).await.unwrap(), 1, "{head:?}");
        head.push(byte[0]);
    }
    String::from_utf8_lossy(&head).into_owned()
}

const OK: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";

#[tokio::test]
async fn h2c_upgrades_never_reach_the_upstream_in_any_case() {
    let heads = Arc::new(Mutex::new(Vec::new()));
    let up = raw_upstream(OK, Arc::clone(&heads)).await;
    let d = door(&config(up, "", ""), None).await;
    let mut s = TcpStream::connect(d.addr).await.unwrap();
    for token in ["h2c", "H2C", "H2c"] {
        let req = format!(
            "GET /api HTTP/1.1\r\nHost: door.test\r\nConnection: Upgrade, HTTP2-Settings\r\n\
             Upgrade: {token}\r\nHTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n\r\n"
        );
        let head = exchange(&mut s, req.as_bytes()).await;
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        let mut body = [0u8; 2];
        s.read_exact(&mut body).await.unwrap();
    }
    // HTTP2-Settings alone, without Connection naming it, is removed too.
    let head = exchange(
        &mut s,
        b"GET /api HTTP/1.1\r\nHost: door.test\r\nHTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n\r\n",
    )
    .await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let heads = heads.lock().unwrap();
    assert_eq!(heads.len(), 4);
    for h in heads.iter() {
        assert!(
            !h.contains("h2c") && !h.contains("http2-settings") && !h.contains("upgrade"),
            "{h}"
        );
    }
}

#[tokio::test]
async fn an_upgrade_answered_without_101_stays_http() {
    let heads = Arc::new(Mutex::new(Vec::new()));
    let up = raw_upstream(OK, Arc::clone(&heads)).await;
    let d = door(&config(up, "", ""), None).await;
    let mut s = TcpStream::connect(d.addr).await.unwrap();
    let upgrade =
        b"GET /chat HTTP/1.1\r\nHost: door.test\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\
        Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n";
    let head = exchange(&mut s, upgrade).await;
    assert!(
        head.starts_with("HTTP/1.1 200"),
        "relayed as a normal response: {head}"
    );
    let mut body = [0u8; 2];
    s.read_exact(&mut body).await.unwrap();
    // The connection was never switched to a tunnel: the next request on it is HTTP again, and
    // the upstream reads it as a request of its own.
    let head = exchange(&mut s, b"GET /next HTTP/1.1\r\nHost: door.test\r\n\r\n").await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    {
        let heads = heads.lock().unwrap();
        assert!(heads[0].contains("upgrade: websocket"), "{}", heads[0]);
        assert!(heads[1].starts_with("get /next"), "{}", heads[1]);
    }
    d.eventually("the stream slot freed", |d| d.inflight("stream") == 0)
        .await;
}

/// Sends an HTTP/2 extended CONNECT for a WebSocket (RFC 8441) to door at `addr` and returns the
/// status door answered.
async fn extended_connect_status(addr: SocketAddr) -> StatusCode {
    let io: Io = Box::new(TcpStream::connect(addr).await.unwrap());
    extended_connect(io, "http").await.status()
}

/// An HTTP/2 connection on `io` (its driver spawned) and on it one extended CONNECT for a
/// WebSocket (RFC 8441: `:method CONNECT`, `:protocol websocket`) to `scheme://door.test/chat`:
/// door's answer.
async fn extended_connect(io: Io, scheme: &str) -> Response<Incoming> {
    let (mut send, conn) = hyper::client::conn::http2::handshake::<_, _, Empty<Bytes>>(
        TokioExecutor::new(),
        TokioIo::new(io),
    )
    .await
    .unwrap();
    tokio::spawn(conn);
    let mut req = Request::connect(format!("{scheme}://door.test/chat"))
        .version(http::Version::HTTP_2)
        .header("sec-websocket-version", "13")
        .body(Empty::new())
        .unwrap();
    req.extensions_mut()
        .insert(hyper::ext::Protocol::from_static("websocket"));
    send.send_request(req).await.unwrap()
}

#[tokio::test]
async fn an_extended_connect_answered_with_a_2xx_instead_of_101_is_a_502() {
    // Over HTTP/2 a 2xx to an extended CONNECT means the tunnel is open (RFC 8441 §5): the
    // upstream's 200 (or 204) without a 101 refused the WebSocket, and relaying it would tell the
    // client the opposite (a 200 with a body was reset instead).
    for answer in [
        OK,
        &b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n"[..],
        &b"HTTP/1.1 204 No Content\r\n\r\n"[..],
    ] {
        let heads = Arc::new(Mutex::new(Vec::new()));
        let up = raw_upstream(answer, Arc::clone(&heads)).await;
        let d = door(&config(up, "", ""), None).await;
        assert_eq!(
            extended_connect_status(d.addr).await,
            StatusCode::BAD_GATEWAY,
            "{}",
            String::from_utf8_lossy(answer)
        );
        assert!(heads.lock().unwrap()[0].contains("upgrade: websocket"));
        d.eventually("nothing held", |d| d.inflight("stream") == 0)
            .await;
    }
    // A refusal that is not a 2xx reaches the client as it is.
    let heads = Arc::new(Mutex::new(Vec::new()));
    let up = raw_upstream(
        b"HTTP/1.1 403 Forbidden\r\ncontent-length: 2\r\n\r\nno",
        Arc::clone(&heads),
    )
    .await;
    let d = door(&config(up, "", ""), None).await;
    assert_eq!(extended_connect_status(d.addr).await, StatusCode::FORBIDDEN);
}

const SWITCH: &[u8] =
    b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\
    Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n\r\n";

#[tokio::test]
async fn a_101_to_a_request_that_asked_for_no_upgrade_or_to_a_post_is_a_502() {
    let heads = Arc::new(Mutex::new(Vec::new()));
    let up = raw_upstream(SWITCH, Arc::clone(&heads)).await;
    let d = door(&config(up, "", ""), None).await;
    let mut s = TcpStream::connect(d.addr).await.unwrap();
    let head = exchange(
        &mut s,
        b"GET /plain HTTP/1.1\r\nHost: door.test\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert!(head.starts_with("HTTP/1.1 502"), "{head}");
    let mut s = TcpStream::connect(d.addr).await.unwrap();
    let post = b"POST /chat HTTP/1.1\r\nHost: door.test\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\
        Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nContent-Length: 0\r\n\r\n";
    let head = exchange(&mut s, post).await;
    assert!(head.starts_with("HTTP/1.1 502"), "{head}");
    d.eventually("nothing held", |d| d.inflight("stream") == 0)
        .await;
}

// ---------------------------------------------------------------- server-sent events

/// An upstream of server-sent events: after `head_delay`, answers `text/event-stream` and sends
/// `events` events `every` apart (on tokio's clock), then stays open and silent.
async fn sse_upstream(head_delay: Duration, every: Duration, events: usize) -> SocketAddr {
    serve_events(head_delay, every, events, None).await.0
}

/// An event-stream upstream that sends `events` events of 64 KiB as fast as they are read; with
/// the count of its connections open.
async fn flooding_sse_upstream(events: usize) -> (SocketAddr, Arc<AtomicUsize>) {
    let event = Bytes::from(format!("data: {}\n\n", "x".repeat(65_536)));
    serve_events(Duration::ZERO, Duration::ZERO, events, Some(event)).await
}

/// An event-stream upstream: after `head_delay`, `events` events `every` apart (`fixed`, or
/// `data: event N`), then silent but open until the client goes away; with the count of its
/// connections open.
async fn serve_events(
    head_delay: Duration,
    every: Duration,
    events: usize,
    fixed: Option<Bytes>,
) -> (SocketAddr, Arc<AtomicUsize>) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let open = Arc::new(AtomicUsize::new(0));
    let count = Arc::clone(&open);
    tokio::spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            let fixed = fixed.clone();
            let open = Arc::clone(&count);
            open.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |_req: Request<Incoming>| {
                    let fixed = fixed.clone();
                    async move {
                        tokio::time::sleep(head_delay).await;
                        let (tx, rx) = mpsc::channel::<Result<Frame<Bytes>, Infallible>>(4);
                        tokio::spawn(async move {
                            for i in 0..events {
                                let event = fixed
                                    .clone()
                                    .unwrap_or_else(|| Bytes::from(format!("data: event {i}\n\n")));
                                if tx.send(Ok(Frame::data(event))).await.is_err() {
                                    return;
                                }
                                tokio::time::sleep(every).await;
                            }
                            // Silent, but open, until the client (door) goes away.
                            tx.closed().await;
                        });
                        let body: BoxBody<Bytes, Infallible> =
                            http_body_util::BodyExt::boxed(StreamBody::new(tokio_stream_of(rx)));
                        let res = Response::builder()
                            .header("content-type", "text/event-stream")
                            .header("cache-control", "no-cache")
                            .body(body)
                            .unwrap();
                        Ok::<_, Infallible>(res)
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(s), svc)
                    .await;
                open.fetch_sub(1, Ordering::SeqCst);
            });
        }
    });
    (addr, open)
}

/// An mpsc receiver as a `Stream`.
fn tokio_stream_of<T: Send + 'static>(
    mut rx: mpsc::Receiver<T>,
) -> impl futures_util::Stream<Item = T> + Send {
    futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx))
}

/// Opens an event stream on a connection of its own, asking for one as an EventSource does: the
/// response, or its status if refused.
async fn open_events(addr: SocketAddr, path: &str) -> Result<Response<Incoming>, StatusCode> {
    get_on_own_connection(addr, path, Some("text/event-stream")).await
}

/// `GET path` accepting `text/event-stream`, over HTTP/2 on a connection of its own: the
/// response, asserted 200.
async fn open_events_over_http2(addr: SocketAddr, path: &str) -> Response<Incoming> {
    let s = TcpStream::connect(addr).await.unwrap();
    let (mut send, conn) = hyper::client::conn::http2::handshake::<_, _, Empty<Bytes>>(
        TokioExecutor::new(),
        TokioIo::new(s),
    )
    .await
    .unwrap();
    tokio::spawn(conn);
    let req = Request::get(format!("http://door.test{path}"))
        .header("accept", "text/event-stream")
        .body(Empty::new())
        .unwrap();
    let res = send.send_request(req).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK, "{path}");
    res
}

/// `GET path` on a connection of its own, with `accept` if given: the response, or its status if
/// it is not 200.
async fn get_on_own_connection(
    addr: SocketAddr,
    path: &str,
    accept: Option<&str>,
) -> Result<Response<Incoming>, StatusCode> {
    let s = TcpStream::connect(addr).await.unwrap();
    let (mut send, conn) =
        hyper::client::conn::http1::handshake::<_, Empty<Bytes>>(TokioIo::new(s))
            .await
            .unwrap();
    tokio::spawn(conn);
    let mut req = Request::get(path).header("host", "door.test");
    if let Some(accept) = accept {
        req = req.header("accept", accept);
    }
    let req = req.body(Empty::new()).unwrap();
    let res = send.send_request(req).await.unwrap();
    if res.status() == StatusCode::OK {
        Ok(res)
    } else {
        Err(res.status())
    }
}

/// The next event's text from an open stream, or `None` when the stream ended.
async fn next_event(res: &mut Response<Incoming>) -> Option<String> {
    loop {
        match res.body_mut().frame().await {
            Some(Ok(f)) => {
                if let Some(data) = f.data_ref() {
                    return Some(String::from_utf8_lossy(data).into_owned());
                }
            }
            Some(Err(_)) | None => return None,
        }
    }
}

#[tokio::test]
async fn two_event_streams_receive_while_a_third_gets_429_and_closing_one_frees_its_slot() {
    let up = sse_upstream(Duration::ZERO, Duration::from_millis(10), 1000).await;
    let d = door(&config(up, "", "[group.stream]\nper_client = 2\n"), None).await;
    let mut a = open_events(d.addr, "/events/a").await.unwrap();
    let mut b = open_events(d.addr, "/events/b").await.unwrap();
    assert_eq!(next_event(&mut a).await.unwrap(), "data: event 0\n\n");
    assert_eq!(next_event(&mut b).await.unwrap(), "data: event 0\n\n");
    assert_eq!(
        open_events(d.addr, "/events/c").await.unwrap_err(),
        StatusCode::TOO_MANY_REQUESTS
    );
    // Both keep receiving.
    assert_eq!(next_event(&mut a).await.unwrap(), "data: event 1\n\n");
    assert_eq!(next_event(&mut b).await.unwrap(), "data: event 1\n\n");
    assert_eq!(
        d.app()
            .limiters()
            .iter()
            .find(|l| l.group() == "stream")
            .unwrap()
            .inflight(),
        2
    );
    drop(a);
    d.eventually("the closed stream's slot is free", |d| {
        d.inflight("stream") == 1
    })
    .await;
    let mut c = open_events(d.addr, "/events/c").await.unwrap();
    assert!(next_event(&mut c).await.is_some());
    assert!(next_event(&mut b).await.is_some());
}

/// Any `text/event-stream` answer on a pass-through route is a stream of the stream group,
/// whether or not the request asked for one (`Accept`): a script's plain `GET` holds a slot too.
#[tokio::test]
async fn an_event_stream_on_a_pass_through_route_is_limited_in_the_stream_group() {
    let up = sse_upstream(Duration::ZERO, Duration::from_millis(10), 1000).await;
    let d = door(&config(up, "", "[group.stream]\nper_client = 1\n"), None).await;
    for accept in [Some("text/event-stream"), None, Some("*/*")] {
        let mut a = get_on_own_connection(d.addr, "/live", accept)
            .await
            .unwrap();
        assert!(next_event(&mut a).await.is_some());
        assert_eq!(d.inflight("stream"), 1, "{accept:?}");
        for again in [Some("text/event-stream"), None] {
            assert_eq!(
                get_on_own_connection(d.addr, "/live", again)
                    .await
                    .unwrap_err(),
                StatusCode::TOO_MANY_REQUESTS,
                "{accept:?} then {again:?}"
            );
        }
        drop(a);
        d.eventually("freed", |d| d.inflight("stream") == 0).await;
    }
}

/// With the request planes on, an event stream on a pass-through route is charged to the plane
/// when it is asked for and given back once the answer is an event stream: streams are exempt
/// from the planes, so opening more of them than the IP plane's burst is not refused by it.
#[tokio::test]
async fn an_event_stream_gives_back_the_plane_token_it_was_admitted_with() {
    let up = sse_upstream(Duration::ZERO, Duration::from_millis(10), 1000).await;
    let planes = "[plane.session]\ncookie = \"sid\"\n[plane.ip]\nrate = 0.001\nburst = 2\n";
    let d = door(&config(up, "", planes), None).await;
    for i in 0..4 {
        let mut s = open_events(d.addr, "/live").await.unwrap_or_else(|status| {
            panic!("stream {i}: {status}");
        });
        assert!(next_event(&mut s).await.is_some());
        drop(s);
        d.eventually("freed", |d| d.inflight("stream") == 0).await;
    }
}

/// A pass-through event stream the stream group refuses keeps the plane's token spent: the
/// request reached the upstream, so it is charged somewhere. Two refusals empty an IP plane of
/// burst 2, and the next stream is refused by the plane although the stream group has room.
#[tokio::test]
async fn an_event_stream_the_stream_group_refuses_spends_its_plane_token() {
    let up = sse_upstream(Duration::ZERO, Duration::from_millis(10), 1000).await;
    let tables = "[group.stream]\nper_client = 1\n\
                  [plane.session]\ncookie = \"sid\"\n[plane.ip]\nrate = 0.001\nburst = 2\n";
    let d = door(&config(up, "", tables), None).await;
    let mut open = open_events(d.addr, "/live").await.unwrap();
    assert!(next_event(&mut open).await.is_some());
    for _ in 0..2 {
        assert_eq!(
            open_events(d.addr, "/live").await.unwrap_err(),
            StatusCode::TOO_MANY_REQUESTS,
            "refused by the stream group: one open per client"
        );
    }
    drop(open);
    d.eventually("freed", |d| d.inflight("stream") == 0).await;
    assert_eq!(
        open_events(d.addr, "/live").await.unwrap_err(),
        StatusCode::TOO_MANY_REQUESTS,
        "refused by the IP plane, emptied by the two refused streams"
    );
    assert_eq!(d.inflight("stream"), 0);
}

#[tokio::test(start_paused = true)]
async fn an_open_stream_outlives_the_read_and_upstream_timeouts() {
    // The upstream takes 5 s for its head and sends an event every 10 s: longer than both
    // upstream_timeout (2 s) and the group's read_timeout (1 s).
    let up = sse_upstream(Duration::from_secs(5), Duration::from_secs(10), 7).await;
    let d = door(
        &config(
            up,
            "upstream_timeout = \"2s\"",
            "[group.stream]\nread_timeout = \"1s\"\n",
        ),
        None,
    )
    .await;
    let start = door_daemon::time::now();
    let mut s = open_events(d.addr, "/events/slow").await.unwrap();
    for i in 0..7 {
        assert_eq!(
            next_event(&mut s).await.unwrap(),
            format!("data: event {i}\n\n")
        );
    }
    assert!(
        start.elapsed() >= Duration::from_secs(65),
        "{:?}",
        start.elapsed()
    );
    assert_eq!(d.inflight("stream"), 1, "the stream still holds its slot");
}

#[tokio::test(start_paused = true)]
async fn the_idle_timeout_closes_a_silent_stream() {
    let up = sse_upstream(Duration::ZERO, Duration::from_secs(1), 1).await;
    let d = door(&config(up, "stream_idle_timeout = \"30s\"", ""), None).await;
    let start = door_daemon::time::now();
    let mut s = open_events(d.addr, "/events/quiet").await.unwrap();
    assert!(next_event(&mut s).await.is_some());
    assert_eq!(
        next_event(&mut s).await,
        None,
        "door ends the silent stream"
    );
    let waited = start.elapsed();
    assert!(
        waited >= Duration::from_secs(30) && waited < Duration::from_secs(31),
        "{waited:?}"
    );
    d.eventually("freed", |d| d.inflight("stream") == 0).await;
}

#[tokio::test]
async fn a_client_reconnecting_in_a_loop_is_limited_by_the_groups_bucket() {
    let up = sse_upstream(Duration::ZERO, Duration::from_secs(1), 1).await;
    let d = door(&config(up, "", "[group.stream]\nrate = 0.01\n"), None).await;
    // Burst 20: twenty (re)connections, then 429 until the bucket refills.
    let mut opened = 0;
    for _ in 0..25 {
        match open_events(d.addr, "/events/storm").await {
            Ok(mut s) => {
                assert!(next_event(&mut s).await.is_some());
                opened += 1;
            }
            Err(status) => assert_eq!(status, StatusCode::TOO_MANY_REQUESTS),
        }
    }
    assert_eq!(opened, 20);
    assert_eq!(d.count("stream", Outcome::RateLimited), 5);
}

#[tokio::test]
async fn an_event_stream_over_http2() {
    let up = sse_upstream(Duration::ZERO, Duration::from_millis(10), 1000).await;
    let d = door(&config(up, "", ""), None).await;
    let mut res = open_events_over_http2(d.addr, "/events/h2").await;
    assert_eq!(next_event(&mut res).await.unwrap(), "data: event 0\n\n");
    assert_eq!(next_event(&mut res).await.unwrap(), "data: event 1\n\n");
    assert_eq!(d.inflight("stream"), 1);
    drop(res);
    d.eventually("freed", |d| d.inflight("stream") == 0).await;
}

/// Over HTTP/2 too, a stream whose client stops reading (its flow-control window spent, so door
/// can send nothing more) is ended at the idle timeout: its slot and upstream connection are
/// freed, and when the client reads again it gets what was sent, then a reset, not an end that
/// would pass for the whole stream.
#[tokio::test(start_paused = true)]
async fn an_http2_stream_whose_client_stops_reading_is_reset_at_the_idle_timeout() {
    let (up, upstream_open) = flooding_sse_upstream(1_024).await;
    let d = door(&config(up, "stream_idle_timeout = \"30s\"", ""), None).await;
    let mut res = open_events_over_http2(d.addr, "/events/stalled").await;
    assert!(next_event(&mut res).await.is_some());
    assert_eq!(d.inflight("stream"), 1);
    tokio::time::sleep(Duration::from_secs(29)).await;
    assert_eq!(d.inflight("stream"), 1, "freed before the idle timeout");
    tokio::time::sleep(Duration::from_secs(1)).await;
    d.eventually("the stalled stream's slot is free", |d| {
        d.inflight("stream") == 0
    })
    .await;
    d.eventually("the stalled stream's upstream is closed", |_| {
        upstream_open.load(Ordering::SeqCst) == 0
    })
    .await;
    assert_eq!(d.app().streams_open("stream"), 0);
    // The client reads again: what was sent, then the reset.
    let mut received = 0_usize;
    let end = loop {
        match res.body_mut().frame().await {
            Some(Ok(f)) => received += f.data_ref().map_or(0, Bytes::len),
            Some(Err(e)) => break Some(e),
            None => break None,
        }
    };
    let whole = 1_024 * (65_536 + "data: \n\n".len());
    assert!(received < whole, "{received} bytes: the whole stream");
    let e = end.expect("the stream ended as if whole, where it was cut");
    let reason = std::error::Error::source(&e)
        .and_then(|s| s.downcast_ref::<h2::Error>())
        .and_then(h2::Error::reason);
    assert!(reason.is_some(), "not a reset: {e:?}");
}

#[tokio::test]
async fn the_drain_closes_open_streams_after_the_grace_period() {
    let seen = Seen::default();
    let up = ws_upstream(Arc::clone(&seen)).await;
    let d = door(&config(up, "", ""), None).await;
    let io: Io = Box::new(TcpStream::connect(d.addr).await.unwrap());
    let mut ws = ws_http1(io, "ws").await;
    ws.send(Message::text("still here")).await.unwrap();
    assert_eq!(
        ws.next().await.unwrap().unwrap(),
        Message::text("still here")
    );
    assert_eq!(d.app().tunnels_open(), 1);
    let start = door_daemon::time::now();
    let finished = d.front.drain(Duration::from_millis(300)).await;
    assert!(!finished, "an open stream cannot finish on its own");
    assert!(start.elapsed() >= Duration::from_millis(300));
    // The tunnel is gone: the client's stream ends.
    let end = tokio::time::timeout(Duration::from_secs(5), async {
        while let Some(Ok(_)) = ws.next().await {}
    })
    .await;
    assert!(end.is_ok(), "the WebSocket was closed by the drain");
    assert_eq!(d.app().tunnels_open(), 0);
    d.eventually("freed", |d| d.inflight("stream") == 0).await;
}

/// A WebSocket handshake during the drain still succeeds: door closes HTTP/1.1 connections it
/// drains with `Connection: close`, but never beside a `101`, whose `Connection: upgrade` the
/// client checks (RFC 6455 §4.1).
#[tokio::test]
async fn a_websocket_handshake_during_the_drain_succeeds() {
    let seen = Seen::default();
    let up = ws_upstream(Arc::clone(&seen)).await;
    let d = door(&config(up, "", ""), None).await;
    let io: Io = Box::new(TcpStream::connect(d.addr).await.unwrap());
    d.app().begin_drain();
    let mut ws = ws_http1(io, "ws").await;
    ws.send(Message::text("draining")).await.unwrap();
    assert_eq!(ws.next().await.unwrap().unwrap(), Message::text("draining"));
}

/// A WebSocket is a connection for `max_connections` until its tunnel closes, though hyper
/// stops serving the connection when it switches protocols.
#[tokio::test]
async fn an_open_websocket_holds_its_connection_slot_until_it_closes() {
    let seen = Seen::default();
    let up = ws_upstream(Arc::clone(&seen)).await;
    let d = door(&config(up, "max_connections = 1", ""), None).await;
    let io: Io = Box::new(TcpStream::connect(d.addr).await.unwrap());
    let mut first = ws_http1(io, "ws").await;
    first.send(Message::text("one")).await.unwrap();
    assert_eq!(first.next().await.unwrap().unwrap(), Message::text("one"));
    let io: Io = Box::new(TcpStream::connect(d.addr).await.unwrap());
    let second = tokio_tungstenite::client_async("ws://door.test/chat", io).await;
    assert!(
        second.is_err(),
        "a second connection past max_connections = 1"
    );
    first.close(None).await.unwrap();
    while let Some(Ok(_)) = first.next().await {}
    drop(first);
    // The slot comes back when the tunnel's task has ended: retried, bounded.
    for _ in 0..500 {
        let io: Io = Box::new(TcpStream::connect(d.addr).await.unwrap());
        if let Ok((mut ws, _)) = tokio_tungstenite::client_async("ws://door.test/chat", io).await {
            ws.send(Message::text("two")).await.unwrap();
            assert_eq!(ws.next().await.unwrap().unwrap(), Message::text("two"));
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the first WebSocket's slot never came back");
}

/// A WebSocket on a stream route: the stream is exempt from the upstream timeout once open, but
/// its handshake is not: an upstream that never answers the upgrade gets a 504 after
/// `upstream_timeout`, and the stream's slot comes back.
#[tokio::test(start_paused = true)]
async fn a_websocket_handshake_the_upstream_never_answers_is_a_504_on_a_stream_route() {
    // Accepts and reads, never answers.
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let up = l.local_addr().unwrap();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((s, _)) = l.accept().await {
            held.push(s);
        }
    });
    let d = door(&config(up, "upstream_timeout = \"2s\"", ""), None).await;
    let start = door_daemon::time::now();
    let mut s = TcpStream::connect(d.addr).await.unwrap();
    let handshake = exchange(
        &mut s,
        b"GET /events/ws HTTP/1.1\r\nhost: door.test\r\nconnection: upgrade\r\n\
          upgrade: websocket\r\nsec-websocket-version: 13\r\n\
          sec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n",
    );
    // On tokio's paused clock: a minute passes at once when nothing else can happen.
    let head = tokio::time::timeout(Duration::from_mins(1), handshake)
        .await
        .expect("door answered the handshake");
    assert!(head.starts_with("HTTP/1.1 504"), "{head}");
    let waited = start.elapsed();
    assert!(
        waited >= Duration::from_secs(2) && waited < Duration::from_secs(3),
        "{waited:?}"
    );
    d.eventually("freed", |d| d.inflight("stream") == 0).await;
}

/// A stream whose client stops reading while the upstream has plenty to send sends nothing: it
/// gives its slot back at the idle timeout, though hyper no longer polls its body (the client's
/// socket is full), where it held the slot for as long as the client kept the connection; and
/// it is no longer open: its upstream connection is closed then (where it stayed open, so that
/// a client could open `per_client` more streams every idle timeout), and neither
/// `door.streams` nor `upstream_max_inflight` counts it any more.
#[tokio::test(start_paused = true)]
async fn a_stream_whose_client_stops_reading_gives_its_slot_back_at_the_idle_timeout() {
    // At most 64 MiB: far more than the loopback socket buffers take.
    let (up, upstream_open) = flooding_sse_upstream(1_024).await;
    let d = door(&config(up, "stream_idle_timeout = \"30s\"", ""), None).await;
    let start = door_daemon::time::now();
    // One on a stream route, one on a pass-through route (a pass-through request's slot too).
    let mut s = open_events(d.addr, "/events/stalled").await.unwrap();
    assert!(next_event(&mut s).await.is_some());
    let mut p = open_events(d.addr, "/feed").await.unwrap();
    assert!(next_event(&mut p).await.is_some());
    assert_eq!(d.inflight("stream"), 2);
    assert_eq!(d.app().passthrough_in_flight(), 1);
    // The client reads no more, and keeps the connection (the clock is tokio's, paused).
    tokio::time::sleep(Duration::from_secs(29)).await;
    assert_eq!(d.inflight("stream"), 2, "freed before the idle timeout");
    tokio::time::sleep(Duration::from_secs(1)).await;
    d.eventually("the stalled stream's slot is free", |d| {
        d.inflight("stream") == 0
    })
    .await;
    let waited = start.elapsed();
    assert!(waited < Duration::from_secs(32), "{waited:?}");
    d.eventually("the stalled stream's upstream is closed", |_| {
        upstream_open.load(Ordering::SeqCst) == 0
    })
    .await;
    assert_eq!(d.app().streams_open("stream"), 0);
    // Nor does it hold its pass-through slot (`upstream_max_inflight`) for an upstream request
    // that is no more.
    assert_eq!(d.app().passthrough_in_flight(), 0);
    drop((s, p));
}
