//! The HTTP front, in-process on 127.0.0.1: door's [`Front`] in front of a test
//! upstream. Time-driven tests run on tokio's paused clock; none sleeps for time to pass.

#![expect(
    clippy::unwrap_used,
    clippy::panic,
    reason = "test helpers outside #[test] functions fail loudly by design"
)]

mod serving;
mod support;

use std::{
    convert::Infallible,
    fmt::Write as _,
    future::Future,
    net::SocketAddr,
    pin::Pin,
    sync::{
        Arc, Mutex,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use bytes::Bytes;
use door_daemon::{
    config::Config,
    http::{App, ConnSettings, Front, MAX_HEADER_BYTES},
    obs::metrics::{Metrics, Outcome},
    time::{Clock, ManualClock, MonotonicClock},
};
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Empty, Full, StreamBody, combinators::BoxBody};
use hyper::body::{Frame, Incoming};
use hyper_util::{
    rt::{TokioExecutor, TokioIo},
    server::conn::auto,
};
use serving::{Door, door_with};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream},
    sync::mpsc,
};

type UBody = BoxBody<Bytes, Infallible>;
type Handler = Arc<
    dyn Fn(Request<Incoming>) -> Pin<Box<dyn Future<Output = Response<UBody>> + Send>>
        + Send
        + Sync,
>;

fn full(s: impl Into<Bytes>) -> UBody {
    Full::new(s.into()).boxed()
}

/// A test upstream on 127.0.0.1 answering with `handler`.
async fn upstream(handler: Handler) -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((s, _)) = l.accept().await else { return };
            let h = Arc::clone(&handler);
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req| {
                    let h = Arc::clone(&h);
                    async move { Ok::<_, Infallible>(h(req).await) }
                });
                let mut b = auto::Builder::new(TokioExecutor::new());
                // The upstream must not be what bounds the header tests.
                b.http1().max_headers(4096);
                b.http2().max_header_list_size(1 << 20);
                let _ = b.serve_connection(TokioIo::new(s), svc).await;
            });
        }
    });
    addr
}

/// Echoes `METHOD PATH xfp=<X-Forwarded-Proto> len=<body bytes>`, after reading the whole body.
fn echo() -> Handler {
    Arc::new(|req: Request<Incoming>| {
        Box::pin(async move {
            let line = format!(
                "{} {} xfp={}",
                req.method(),
                req.uri().path(),
                req.headers()
                    .get("x-forwarded-proto")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("-")
            );
            let len = match req.into_body().collect().await {
                Ok(b) => b.to_bytes().len().to_string(),
                Err(_) => "error".to_owned(),
            };
            Response::new(full(format!("{line} len={len}")))
        })
    })
}

fn config(upstream: SocketAddr, top: &str, tables: &str) -> Config {
    let text = format!(
        r#"
listen = ["127.0.0.1:0"]
upstream = "http://{upstream}"
admin_listen = "off"
{top}
[[route]]
group = "webhook"
methods = ["POST"]
path = "/webhooks/github"
[[route]]
group = "link"
methods = ["GET"]
path = "/l/session/{{id}}"
[[route]]
group = "health"
path = "/healthz"
[[route]]
group = "api"
path = "/api/{{x}}"
[group.api]
rate = 1000.0
burst = 100000
per_client = 1000
inflight = 1000
{tables}
"#
    );
    Config::from_toml("front.toml", &text).unwrap()
}

async fn door(cfg: &Config) -> Door {
    door_with(cfg, Arc::new(MonotonicClock::new()), None).await
}

/// Writes `bytes` and reads until the server closes the connection.
async fn raw(addr: SocketAddr, bytes: &[u8]) -> String {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(bytes).await.unwrap();
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out).await;
    String::from_utf8_lossy(&out).into_owned()
}

/// An HTTP/1.1 client connection.
async fn h1(addr: SocketAddr) -> hyper::client::conn::http1::SendRequest<UBody> {
    let s = TcpStream::connect(addr).await.unwrap();
    let (send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(s))
        .await
        .unwrap();
    tokio::spawn(conn);
    send
}

fn get(path: &str) -> Request<UBody> {
    Request::get(path)
        .header("host", "door.test")
        .body(Empty::new().boxed())
        .unwrap()
}

async fn body_string(res: Response<Incoming>) -> String {
    String::from_utf8_lossy(&res.into_body().collect().await.unwrap().to_bytes()).into_owned()
}

/// Opens a stream for `req` (no body) on an HTTP/2 connection once it has room.
async fn h2_start(
    c: &h2::client::SendRequest<Bytes>,
    req: Request<()>,
) -> (h2::client::ResponseFuture, h2::SendStream<Bytes>) {
    c.clone()
        .ready()
        .await
        .unwrap()
        .send_request(req, true)
        .unwrap()
}

/// Sends `req` (no body) on an HTTP/2 connection: the answer's status and body.
async fn h2_send(c: &h2::client::SendRequest<Bytes>, req: Request<()>) -> (StatusCode, String) {
    let res = h2_start(c, req).await.0.await.unwrap();
    let status = res.status();
    let mut body = res.into_body();
    let mut got = Vec::new();
    while let Some(chunk) = body.data().await {
        got.extend_from_slice(&chunk.unwrap());
    }
    (status, String::from_utf8_lossy(&got).into_owned())
}

// ---------------------------------------------------------------- 1. TLS

fn tls_pair(dir: &std::path::Path) -> (std::path::PathBuf, std::path::PathBuf, rcgen::Certificate) {
    let ck = rcgen::generate_simple_self_signed(vec!["door.test".to_owned()]).unwrap();
    let cert = dir.join("cert.pem");
    let key = dir.join("key.pem");
    std::fs::write(&cert, ck.cert.pem()).unwrap();
    std::fs::write(&key, ck.signing_key.serialize_pem()).unwrap();
    (cert, key, ck.cert)
}

fn tempdir(name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("door-front-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn tls_client(cert: &rcgen::Certificate, alpn: &[u8]) -> tokio_rustls::TlsConnector {
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
    tokio_rustls::TlsConnector::from(Arc::new(cfg))
}

/// door over TLS in front of the echo upstream, with a new self-signed pair for `door.test` in
/// `dir` and `min_version` in its `[tls]` table; returns door and the pair's certificate.
#[expect(
    clippy::unnecessary_debug_formatting,
    reason = "Debug quotes and escapes the paths as TOML basic strings"
)]
async fn tls_door(dir: &std::path::Path, min_version: &str) -> (Door, rcgen::Certificate) {
    let (cert, key, c) = tls_pair(dir);
    let up = upstream(echo()).await;
    let cfg = config(
        up,
        "",
        &format!("[tls]\ncert = {cert:?}\nkey = {key:?}\nmin_version = {min_version:?}"),
    );
    let tls = door_daemon::http::tls::load(cfg.tls.as_ref().unwrap()).unwrap();
    let d = door_with(&cfg, Arc::new(MonotonicClock::new()), Some(tls)).await;
    (d, c)
}

#[tokio::test]
async fn tls_negotiates_h2_and_http11_by_alpn_and_says_https_upstream() {
    let dir = tempdir("tls");
    let (d, c) = tls_door(&dir, "1.2").await;
    let name = rustls::pki_types::ServerName::try_from("door.test").unwrap();

    // h2 by ALPN.
    let s = TcpStream::connect(d.addr).await.unwrap();
    let s = tls_client(&c, b"h2")
        .connect(name.clone(), s)
        .await
        .unwrap();
    assert_eq!(s.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    let (h2c, conn) = h2::client::handshake(s).await.unwrap();
    tokio::spawn(conn);
    let req = Request::get("https://door.test/anything").body(()).unwrap();
    assert_eq!(
        h2_send(&h2c, req).await,
        (StatusCode::OK, "GET /anything xfp=https len=0".to_owned())
    );

    // http/1.1 by ALPN.
    let s = TcpStream::connect(d.addr).await.unwrap();
    let mut s = tls_client(&c, b"http/1.1").connect(name, s).await.unwrap();
    assert_eq!(s.get_ref().1.alpn_protocol(), Some(&b"http/1.1"[..]));
    s.write_all(b"GET /x HTTP/1.1\r\nHost: door.test\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out).await;
    let out = String::from_utf8_lossy(&out);
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    assert!(out.ends_with("GET /x xfp=https len=0"), "{out}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test]
async fn tls_min_version_13_refuses_a_tls12_client() {
    let dir = tempdir("tls13");
    let (d, c) = tls_door(&dir, "1.3").await;
    let mut roots = rustls::RootCertStore::empty();
    roots.add(c.der().clone()).unwrap();
    let client12 = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_protocol_versions(&[&rustls::version::TLS12])
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let s = TcpStream::connect(d.addr).await.unwrap();
    let r = tokio_rustls::TlsConnector::from(Arc::new(client12))
        .connect(
            rustls::pki_types::ServerName::try_from("door.test").unwrap(),
            s,
        )
        .await;
    assert!(r.is_err(), "a TLS 1.2 client must be refused");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A connection to a TLS listener that sends something other than a TLS handshake, or closes
/// during one, is counted on `door.tls_handshake_failures` as `error`; one that sends nothing is
/// closed at `header_read_timeout` and counted as `timeout`; a completed handshake counts
/// nothing.
#[tokio::test(start_paused = true)]
async fn failed_tls_handshakes_are_counted_by_reason() {
    let dir = tempdir("tlsfail");
    let (cert, key, c) = tls_pair(&dir);
    let up = upstream(echo()).await;
    let cfg = config(up, "", &format!("[tls]\ncert = {cert:?}\nkey = {key:?}"));
    let tls = door_daemon::http::tls::load(cfg.tls.as_ref().unwrap()).unwrap();
    let (d, counted, _provider) = door_counting_tls(&cfg, Some(tls)).await;
    let failures = |reason: &str| counted("door.tls_handshake_failures", reason);

    // Plain HTTP on the TLS port: rustls refuses it at once.
    let out = raw(d.addr, b"GET / HTTP/1.1\r\nHost: door.test\r\n\r\n").await;
    assert!(!out.contains("HTTP/1.1"), "{out:?}");
    // A client that gives up after its hello.
    let s = TcpStream::connect(d.addr).await.unwrap();
    let mut half = tls_client(&c, b"http/1.1").connect(
        rustls::pki_types::ServerName::try_from("door.test").unwrap(),
        s,
    );
    // One poll sends the ClientHello; the connection is then dropped mid-handshake.
    assert!(poll_once(&mut half).await.is_none());
    drop(half);
    // A client that sends nothing: closed at header_read_timeout (10 s, on the paused clock).
    let start = door_daemon::time::now();
    let mut silent = TcpStream::connect(d.addr).await.unwrap();
    let mut out = Vec::new();
    let _ = silent.read_to_end(&mut out).await;
    let waited = start.elapsed();
    assert!(
        waited >= Duration::from_secs(10) && waited < Duration::from_secs(11),
        "header_read_timeout is 10 s: {waited:?}"
    );
    // A completed handshake and request count nothing.
    let s = TcpStream::connect(d.addr).await.unwrap();
    let mut ok = tls_client(&c, b"http/1.1")
        .connect(
            rustls::pki_types::ServerName::try_from("door.test").unwrap(),
            s,
        )
        .await
        .unwrap();
    ok.write_all(b"GET /x HTTP/1.1\r\nHost: door.test\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut out = Vec::new();
    let _ = ok.read_to_end(&mut out).await;
    assert!(String::from_utf8_lossy(&out).starts_with("HTTP/1.1 200"));

    assert_eq!(failures("error"), 2);
    assert_eq!(failures("timeout"), 1);
    assert_eq!(failures(""), 3);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Polls `f` once: `Some` of its output when it is ready at once, `None` when it is pending.
async fn poll_once<F: Future + Unpin>(f: &mut F) -> Option<F::Output> {
    match std::future::poll_fn(|cx| std::task::Poll::Ready(Pin::new(&mut *f).poll(cx))).await {
        std::task::Poll::Ready(out) => Some(out),
        std::task::Poll::Pending => None,
    }
}

#[tokio::test]
async fn a_bad_key_pair_fails_start_up_before_binding_naming_the_file() {
    let dir = tempdir("badtls");
    let (cert, _key, _) = tls_pair(&dir);
    let other = rcgen::KeyPair::generate().unwrap();
    let wrong = dir.join("wrong-key.pem");
    std::fs::write(&wrong, other.serialize_pem()).unwrap();
    let missing = dir.join("missing.pem");
    // A port this test listens on, given to door: had door bound its listeners before loading
    // the pair, it would fail with the port in use instead of naming the key file.
    let taken = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = taken.local_addr().unwrap().port();
    for (key, needle) in [(&missing, "missing.pem"), (&wrong, "wrong-key.pem")] {
        let mut cfg = config(
            "127.0.0.1:9".parse().unwrap(),
            "",
            &format!("[tls]\ncert = {cert:?}\nkey = {key:?}"),
        );
        cfg.listen = vec![SocketAddr::from(([127, 0, 0, 1], port))];
        let reload_same = cfg.clone();
        let reload: door_daemon::daemon::Reloader = Box::new(move || Ok(reload_same.clone()));
        let e = door_daemon::daemon::run(cfg, Metrics::noop(), None, reload)
            .await
            .unwrap_err()
            .to_string();
        assert!(e.contains(needle), "{e}");
        assert!(e.starts_with("tls.key"), "{e}");
    }
    let cfg = config(
        "127.0.0.1:9".parse().unwrap(),
        "",
        &format!("[tls]\ncert = {missing:?}\nkey = {wrong:?}"),
    );
    let e = door_daemon::http::tls::load(cfg.tls.as_ref().unwrap())
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with("tls.cert") && e.contains("missing.pem"),
        "{e}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

// ---------------------------------------------------------------- 2. header bound

/// An HTTP/1.1 request head with `fields` fields in all (`Host` and `Connection` included) of
/// `size`-byte values.
fn head_with(fields: usize, size: usize) -> String {
    let mut r = String::from("GET /h HTTP/1.1\r\nHost: door.test\r\nConnection: close\r\n");
    for i in 0..fields.saturating_sub(2) {
        let _ = write!(r, "x-f{i}: {}\r\n", "a".repeat(size));
    }
    r.push_str("\r\n");
    r
}

#[tokio::test]
async fn http1_heads_are_bounded_at_64_kib_and_100_fields_by_default() {
    let up = upstream(echo()).await;
    let d = door(&config(up, "", "")).await;
    // 100 fields pass, the 101st is refused, as by HAProxy's and Envoy's defaults.
    let ok = raw(d.addr, head_with(100, 10).as_bytes()).await;
    assert!(ok.starts_with("HTTP/1.1 200"), "{ok}");
    let many = raw(d.addr, head_with(101, 10).as_bytes()).await;
    assert!(many.starts_with("HTTP/1.1 431"), "{many}");
    // 128 KiB in 34 fields: 431.
    let big = raw(d.addr, head_with(34, 4096).as_bytes()).await;
    assert!(big.starts_with("HTTP/1.1 431"), "{big}");
    // Just under and just over the byte bound, in one field.
    let head = head_with(3, 0).len();
    let under = raw(
        d.addr,
        head_with(3, MAX_HEADER_BYTES - head - 4096).as_bytes(),
    )
    .await;
    assert!(
        under.starts_with("HTTP/1.1 200"),
        "{}",
        &under[..40.min(under.len())]
    );
    let over = raw(d.addr, head_with(3, MAX_HEADER_BYTES).as_bytes()).await;
    assert!(over.starts_with("HTTP/1.1 431"), "{over}");
}

#[tokio::test]
async fn max_header_fields_raises_or_lowers_the_field_count() {
    let up = upstream(echo()).await;
    // (setting, a head that passes: fields and value bytes, the field count refused). At 1,024,
    // 32 KiB in 320 fields stays well under 64 KiB, so the byte bound does not bind either.
    for (fields, pass, refused) in [(1024, (320, 100), 1025), (20, (20, 10), 21)] {
        let d = door(&config(up, &format!("max_header_fields = {fields}"), "")).await;
        let ok = raw(d.addr, head_with(pass.0, pass.1).as_bytes()).await;
        assert!(ok.starts_with("HTTP/1.1 200"), "{fields}: {ok}");
        let many = raw(d.addr, head_with(refused, 1).as_bytes()).await;
        assert!(many.starts_with("HTTP/1.1 431"), "{fields}: {many}");
    }
}

/// An HTTP/2 connection driven frame by frame with h2's codec (RFC 9113 framing, RFC 7541
/// HPACK; h2's `unstable` API, dev-only): the client preface, then an empty SETTINGS.
async fn h2_raw(addr: SocketAddr) -> h2::Codec<TcpStream, Bytes> {
    use futures_util::SinkExt as _;
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
        .await
        .unwrap();
    let mut c = h2::Codec::new(s);
    c.send(h2::frame::Frame::Settings(h2::frame::Settings::default()))
        .await
        .unwrap();
    c
}

/// A GET on `stream` with `n` copies of one 3,000-octet field. h2's HPACK encoder puts the field
/// in the dynamic table once (it is under 3/4 of the 4,096-octet table) and then references it
/// by index, so the whole block is about 2 KB, one HEADERS frame far below the 16 KiB frame
/// limit, while its decoded size (RFC 9113 §6.5.2: name + value + 32 per field) is n × 3,037
/// octets plus the pseudo-fields.
fn big_request(stream: u32, n: usize) -> h2::frame::Frame<Bytes> {
    let uri: http::Uri = "http://door.test/big".parse().unwrap();
    let pseudo = h2::frame::Pseudo::request(http::Method::GET, uri, None);
    let value = http::HeaderValue::from_str(&"a".repeat(3000)).unwrap();
    let mut fields = http::HeaderMap::new();
    for _ in 0..n {
        fields.append("x-big", value.clone());
    }
    let mut h = h2::frame::Headers::new(h2::frame::StreamId::from(stream), pseudo, fields);
    h.set_end_stream();
    h2::frame::Frame::Headers(h)
}

/// Reads frames until the response HEADERS of `stream`, acknowledging SETTINGS and noting the
/// server's SETTINGS_MAX_HEADER_LIST_SIZE; `None` on GOAWAY or end of stream.
async fn read_status(
    c: &mut h2::Codec<TcpStream, Bytes>,
    stream: u32,
    list_size: &mut Option<u32>,
) -> Option<u16> {
    use futures_util::{SinkExt as _, StreamExt as _};
    while let Some(f) = c.next().await {
        match f.unwrap() {
            h2::frame::Frame::Settings(s) if !s.is_ack() => {
                *list_size = s.max_header_list_size();
                c.send(h2::frame::Frame::Settings(h2::frame::Settings::ack()))
                    .await
                    .unwrap();
            }
            h2::frame::Frame::Headers(h) if h.stream_id() == h2::frame::StreamId::from(stream) => {
                return h.into_parts().0.status.map(|s| s.as_u16());
            }
            h2::frame::Frame::GoAway(_) => return None,
            _ => {}
        }
    }
    None
}

#[tokio::test]
async fn http2_advertises_64_kib_and_answers_431_past_the_list_limit_in_one_frame() {
    use futures_util::SinkExt as _;
    let up = upstream(echo()).await;
    let d = door(&config(up, "", "")).await;
    let mut c = h2_raw(d.addr).await;
    let mut list = None;
    // 22 fields: 66,814 octets of fields alone, over 65,536.
    c.send(big_request(1, 22)).await.unwrap();
    assert_eq!(read_status(&mut c, 1, &mut list).await, Some(431));
    assert_eq!(list, Some(u32::try_from(MAX_HEADER_BYTES).unwrap()));
    // The connection lives on, and 21 fields (63,777 + pseudo-fields < 65,536) pass.
    c.send(big_request(3, 21)).await.unwrap();
    assert_eq!(read_status(&mut c, 3, &mut list).await, Some(200));
    // Past four times the limit h2 stops decoding: GOAWAY.
    c.send(big_request(5, 90)).await.unwrap();
    assert_eq!(read_status(&mut c, 5, &mut list).await, None);
}

#[tokio::test]
async fn http2_client_over_the_list_limit_gets_431() {
    let up = upstream(echo()).await;
    let d = door(&config(up, "", "")).await;
    let s = TcpStream::connect(d.addr).await.unwrap();
    let (c, conn) = h2::client::handshake(s).await.unwrap();
    tokio::spawn(conn);
    let mut req = Request::get("http://door.test/h2").body(()).unwrap();
    for i in 0..32 {
        req.headers_mut().insert(
            http::HeaderName::try_from(format!("x-f{i}")).unwrap(),
            http::HeaderValue::from_str(&"a".repeat(4096)).unwrap(),
        );
    }
    assert_eq!(
        h2_send(&c, req).await.0,
        StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE
    );
    let mut req = Request::get("http://door.test/h2").body(()).unwrap();
    req.headers_mut().insert(
        "x-ok",
        http::HeaderValue::from_str(&"a".repeat(32 << 10)).unwrap(),
    );
    assert_eq!(h2_send(&c, req).await.0, StatusCode::OK);
}

// ---------------------------------------------------------------- 3. deadlines

fn aborted_upstream(seen: Arc<Mutex<Vec<String>>>) -> Handler {
    Arc::new(move |req: Request<Incoming>| {
        let seen = Arc::clone(&seen);
        Box::pin(async move {
            let r = req.into_body().collect().await;
            seen.lock().unwrap().push(match r {
                Ok(b) => format!("body {}", b.to_bytes().len()),
                Err(_) => "aborted".to_owned(),
            });
            Response::new(full("ok"))
        })
    })
}

/// A body still arriving at the read timeout gets 408; so does one whose request also asks for
/// an upgrade (`Upgrade: foo`): an HTTP/1.1 upgrade's body comes before the switch, and the
/// header does not lift its deadline.
#[tokio::test(start_paused = true)]
async fn a_body_still_arriving_at_the_read_timeout_gets_408_and_frees_the_slot() {
    for upgrade in ["", "Connection: upgrade\r\nUpgrade: foo\r\n"] {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let up = upstream(aborted_upstream(Arc::clone(&seen))).await;
        let d = door(&config(up, "", "")).await;
        let start = door_daemon::time::now();
        let mut s = TcpStream::connect(d.addr).await.unwrap();
        let head = format!(
            "POST /webhooks/github HTTP/1.1\r\nHost: door.test\r\n{upgrade}\
             Content-Length: 100\r\n\r\n0123456789"
        );
        s.write_all(head.as_bytes()).await.unwrap();
        // webhook's read_timeout is 10 s.
        let out = answer_within(&mut s, start, 10).await;
        assert!(out.starts_with("HTTP/1.1 408"), "{upgrade:?}: {out}");
        assert!(out.contains("request-timeout"), "{out}");
        d.eventually("the upstream saw the abort", |_| {
            seen.lock().unwrap().iter().any(|s| s == "aborted")
        })
        .await;
        assert_eq!(d.inflight("webhook"), 0);
        assert_eq!(d.count("webhook", Outcome::ClientError), 1);
        assert_eq!(d.app().requests_in_flight(), 0);
    }
}

/// A pass-through request's body (a route in no group: no read deadline) is ended once door
/// has waited `body_read_timeout` for its next part, as nginx's `client_body_timeout` ends one:
/// 408, the upstream call aborted, the pass-through slot freed, over HTTP/1.1 and HTTP/2 alike.
/// A client that keeps its body moving gets it through whole however long it takes in all: here
/// a part every 20 s for 60 s, under a 30 s timeout.
#[tokio::test(start_paused = true)]
async fn a_pass_through_body_that_stops_arriving_gets_408_at_the_body_read_timeout() {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let up = upstream(aborted_upstream(Arc::clone(&seen))).await;
    let (d, failed, _provider) =
        door_counting(&config(up, "body_read_timeout = \"30s\"", "")).await;

    let start = door_daemon::time::now();
    let mut s = TcpStream::connect(d.addr).await.unwrap();
    s.write_all(
        b"POST /upload HTTP/1.1\r\nHost: door.test\r\nContent-Length: 40\r\n\r\n0123456789",
    )
    .await
    .unwrap();
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_secs(20)).await;
        s.write_all(b"0123456789").await.unwrap();
    }
    let mut head = [0u8; 12];
    s.read_exact(&mut head).await.unwrap();
    assert_eq!(&head, b"HTTP/1.1 200", "a body kept moving for 60 s");
    answered_at(start, 60);
    assert_eq!(seen.lock().unwrap().as_slice(), ["body 40"]);
    drop(s);

    let start = door_daemon::time::now();
    let mut s = TcpStream::connect(d.addr).await.unwrap();
    s.write_all(
        b"POST /upload HTTP/1.1\r\nHost: door.test\r\nContent-Length: 100\r\n\r\n0123456789",
    )
    .await
    .unwrap();
    let out = answer_within(&mut s, start, 30).await;
    assert!(out.starts_with("HTTP/1.1 408"), "{out}");
    assert!(out.contains("request-timeout"), "{out}");
    d.eventually("the upstream saw the abort", |_| {
        seen.lock().unwrap().iter().any(|s| s == "aborted")
    })
    .await;
    assert_eq!(d.app().passthrough_in_flight(), 0);
    assert_eq!(d.app().requests_in_flight(), 0);

    // HTTP/2: a stream whose body stops after its first part is answered 408 too.
    let start = door_daemon::time::now();
    let (c, conn) = h2::client::handshake(TcpStream::connect(d.addr).await.unwrap())
        .await
        .unwrap();
    tokio::spawn(conn);
    let req = Request::post("http://door.test/upload").body(()).unwrap();
    let (res, mut body) = c
        .clone()
        .ready()
        .await
        .unwrap()
        .send_request(req, false)
        .unwrap();
    body.send_data(Bytes::from_static(b"0123456789"), false)
        .unwrap();
    let res = tokio::time::timeout(Duration::from_mins(5), res)
        .await
        .expect("no answer")
        .unwrap();
    answered_at(start, 30);
    assert_eq!(res.status(), StatusCode::REQUEST_TIMEOUT);
    // Both 408s counted, on a route in no group: `door.requests` does not see them.
    assert_eq!(failed("door.requests_failed", "body_timeout"), 2);
    assert_eq!(failed("door.requests_failed", ""), 2);
    d.eventually("the upstream saw the second abort", |_| {
        seen.lock()
            .unwrap()
            .iter()
            .filter(|s| *s == "aborted")
            .count()
            == 2
    })
    .await;
    assert_eq!(d.app().passthrough_in_flight(), 0);
    assert_eq!(d.app().requests_in_flight(), 0);
    drop(body);
}

/// An upstream that reads a request's head and then stops reading its body (an application
/// whose workers are all busy accepts connections and reads nothing) holds the request no longer
/// than `upstream_timeout` without taking anything: the body's own timer runs only while the
/// upstream takes the body, so without a deadline of its own the request would hold its slots
/// until the upstream closed. It is the upstream's doing: 504, counted as a server error,
/// nothing charged. A pass-through request's body (no read deadline, a 3 s
/// `body_read_timeout`) is told the same way, and its pass-through slot freed.
#[tokio::test(start_paused = true)]
async fn an_upstream_that_stops_reading_the_body_gets_504_after_the_upstream_timeout() {
    // The body at once: 5 s without progress (webhook's read_timeout, 10 s, stands still
    // meanwhile). One byte, then 3 s waiting for the client, then the rest: the hold begins at
    // 3 s and is a stall at 8 s, not at the read deadline.
    for (pause, secs) in [(Duration::ZERO, 5), (Duration::from_secs(3), 8)] {
        let d = stalled_upstream("/webhooks/github", pause, secs).await;
        assert_eq!(d.inflight("webhook"), 0);
        assert_eq!(d.count("webhook", Outcome::ServerError), 1);
        assert_eq!(d.count("webhook", Outcome::ClientError), 0);
    }
    // A pause of 2 s is not the client's 3 s wait; the hold after it is a stall at 7 s.
    for (pause, secs) in [(Duration::ZERO, 5), (Duration::from_secs(2), 7)] {
        let d = stalled_upstream("/upload", pause, secs).await;
        assert_eq!(d.app().passthrough_in_flight(), 0);
    }
}

/// door in front of an upstream that reads a request's head and nothing more, with
/// `upstream_timeout = "5s"` and `body_read_timeout = "3s"`, and a request to `path` whose
/// client sends one byte of its body, waits `pause`, then sends far more than the sockets hold:
/// door answers 504 `secs` seconds after the request.
async fn stalled_upstream(path: &str, pause: Duration, secs: u64) -> Door {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let up = l.local_addr().unwrap();
    let (held_tx, mut held_rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        let (mut s, _) = l.accept().await.unwrap();
        let mut head = vec![0u8; 4096];
        let _ = s.read(&mut head).await;
        // Reads nothing more, and keeps the connection open until the test ends.
        held_tx.send(s).unwrap();
    });
    let d = door(&config(
        up,
        "upstream_timeout = \"5s\"\nbody_read_timeout = \"3s\"",
        "",
    ))
    .await;
    let start = door_daemon::time::now();
    let (mut rd, writer) = big_post(d.addr, path, pause).await;
    let held = held_rx.recv().await.unwrap();
    // The client is still writing: read the answer, not to EOF.
    let out = read_until(&mut rd, "stopped reading the request").await;
    answered_at(start, secs);
    let out = String::from_utf8_lossy(&out);
    assert!(out.starts_with("HTTP/1.1 504"), "{out}");
    assert_eq!(d.app().requests_in_flight(), 0);
    writer.abort();
    drop(held);
    d
}

/// A POST of `path` to door at `addr` with a 64 MiB body, far more than the loopback sockets'
/// buffers hold (so door is left holding a part of it when the upstream stops reading): its
/// head and first byte at once, the rest `pause` later, written by the returned task until
/// door stops taking it. Returns the connection's read half and the writing task.
async fn big_post(
    addr: SocketAddr,
    path: &str,
    pause: Duration,
) -> (tokio::net::tcp::OwnedReadHalf, tokio::task::JoinHandle<()>) {
    let s = TcpStream::connect(addr).await.unwrap();
    let (rd, mut wr) = s.into_split();
    let len = (64 << 20) + 1;
    let request =
        format!("POST {path} HTTP/1.1\r\nHost: door.test\r\nContent-Length: {len}\r\n\r\nx");
    let writer = tokio::spawn(async move {
        wr.write_all(request.as_bytes()).await.unwrap();
        tokio::time::sleep(pause).await;
        let chunk = vec![b'x'; 64 << 10];
        for _ in 0..len / chunk.len() {
            if wr.write_all(&chunk).await.is_err() {
                return;
            }
        }
    });
    (rd, writer)
}

/// A client that sends its body on time is not late because the upstream was slow to take it:
/// the read timeout counts the time door waits for the client, not the time door holds a part
/// of the body the upstream has not taken. Here the upstream reads nothing for 9 s (its workers
/// busy), then everything; the client sends 32 MiB in 2 MiB parts every half second, held back
/// by the full sockets meanwhile, so that its last parts leave past the 10 s `read_timeout` of
/// webhook. The delivery goes through whole (charge on failure: nothing charged), where
/// counting from admission answered 408 and lost it. The same body on a pass-through route,
/// under a `body_read_timeout` of 5 s, is not ended either: the upstream's 9 s are not a wait
/// for the client.
#[tokio::test(start_paused = true)]
async fn a_body_on_time_behind_a_slow_upstream_is_not_late() {
    let d = body_behind_a_slow_upstream("/webhooks/github", "").await;
    assert_eq!(d.count("webhook", Outcome::ClientError), 0);
    assert_eq!(d.inflight("webhook"), 0);
    let d = body_behind_a_slow_upstream("/upload", "body_read_timeout = \"5s\"").await;
    assert_eq!(d.app().passthrough_in_flight(), 0);
}

/// door (`top` added to its configuration) in front of an upstream that reads nothing for 9 s
/// after a request's head, then all of it, and a client sending 32 MiB to `path` in 2 MiB parts
/// every half second: asserts that the body arrives whole and the client gets the upstream's 200
/// though its last parts left past 10 s.
async fn body_behind_a_slow_upstream(path: &str, top: &str) -> Door {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let up = l.local_addr().unwrap();
    let len: usize = 32 << 20;
    let upstream = tokio::spawn(async move {
        let (mut s, _) = l.accept().await.unwrap();
        // The head (and whatever of the body came with it), then nothing for 9 s.
        let mut got = Vec::new();
        let mut buf = vec![0u8; 64 << 10];
        let n = s.read(&mut buf).await.unwrap();
        got.extend_from_slice(buf.get(..n).unwrap());
        tokio::time::sleep(Duration::from_secs(9)).await;
        let head_end = loop {
            if let Some(i) = got.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
            let n = s.read(&mut buf).await.unwrap();
            got.extend_from_slice(buf.get(..n).unwrap());
        };
        while got.len() - head_end < len {
            let n = s.read(&mut buf).await.unwrap();
            assert_ne!(n, 0, "door closed after {} bytes", got.len() - head_end);
            got.extend_from_slice(buf.get(..n).unwrap());
        }
        s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            .await
            .unwrap();
        got.len() - head_end
    });
    let d = door(&config(up, top, "")).await;
    let start = door_daemon::time::now();
    let s = TcpStream::connect(d.addr).await.unwrap();
    let (mut rd, mut wr) = s.into_split();
    let head = format!("POST {path} HTTP/1.1\r\nHost: door.test\r\nContent-Length: {len}\r\n\r\n");
    let writer = tokio::spawn(async move {
        wr.write_all(head.as_bytes()).await.unwrap();
        let part = vec![b'x'; 2 << 20];
        let mut last = start;
        for _ in 0..len / part.len() {
            tokio::time::sleep(Duration::from_millis(500)).await;
            wr.write_all(&part).await.unwrap();
            last = door_daemon::time::now();
        }
        (wr, last.duration_since(start))
    });
    let mut out = Vec::new();
    let mut buf = [0u8; 1024];
    while !out.ends_with(b"ok") {
        let read = tokio::time::timeout(Duration::from_mins(5), rd.read(&mut buf)).await;
        assert!(read.is_ok(), "no answer");
        let n = read.unwrap().unwrap();
        assert_ne!(n, 0, "closed: {}", String::from_utf8_lossy(&out));
        out.extend_from_slice(buf.get(..n).unwrap());
    }
    let out = String::from_utf8_lossy(&out);
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    let (_wr, last_part) = writer.await.unwrap();
    assert!(
        last_part > Duration::from_secs(10),
        "the last part left after {last_part:?}: the sockets took it all before the read \
         timeout, so this test tells nothing"
    );
    assert_eq!(upstream.await.unwrap(), len);
    d
}

/// A client that always has its next part ready before a slow upstream takes the last is never
/// waited for: door's holds count as the upstream's time only up to `upstream_timeout` in all,
/// so an endless body is late at `read_timeout + upstream_timeout` (10 + 30 s for webhook), 408,
/// its token spent, instead of holding the request for as long as the client keeps sending. Over
/// HTTP/1.1, behind an upstream taking 256 KiB a second.
#[tokio::test(start_paused = true)]
async fn an_endless_body_behind_a_slow_upstream_is_late_after_read_timeout_and_upstream_timeout() {
    let (up, upstream) = slow_reader(256 << 10).await;
    let d = door(&config(up, "", "")).await;
    let start = door_daemon::time::now();
    let s = TcpStream::connect(d.addr).await.unwrap();
    let (mut rd, mut wr) = s.into_split();
    let writer = tokio::spawn(async move {
        wr.write_all(
            b"POST /webhooks/github HTTP/1.1\r\nHost: door.test\r\nContent-Length: 1099511627776\r\n\r\n",
        )
        .await
        .unwrap();
        let part = vec![b'x'; 64 << 10];
        // At most 256 MiB: far more than the upstream takes in the time the test allows.
        for _ in 0..4096 {
            if wr.write_all(&part).await.is_err() {
                return;
            }
        }
    });
    let out = read_until(&mut rd, "request-timeout").await;
    answered_at(start, 40);
    assert!(String::from_utf8_lossy(&out).starts_with("HTTP/1.1 408"));
    assert_eq!(d.count("webhook", Outcome::ClientError), 1);
    writer.abort();
    upstream.abort();
}

/// The same over HTTP/2, behind an upstream taking 48 KiB a second: late at 40 s too.
#[tokio::test(start_paused = true)]
async fn an_endless_http2_body_behind_a_slow_upstream_is_late_too() {
    let (up, upstream) = slow_reader(48 << 10).await;
    let d = door(&config(up, "", "")).await;
    let start = door_daemon::time::now();
    let s = TcpStream::connect(d.addr).await.unwrap();
    let (c, conn) = h2::client::handshake(s).await.unwrap();
    tokio::spawn(conn);
    let req = Request::post("http://door.test/webhooks/github")
        .header("content-length", "1099511627776")
        .body(())
        .unwrap();
    let (res, mut send) = c.ready().await.unwrap().send_request(req, false).unwrap();
    let writer = tokio::spawn(async move {
        let part = Bytes::from(vec![b'x'; 16 << 10]);
        // At most 64 MiB, as the stream's window lets it.
        for _ in 0..4096 {
            send.reserve_capacity(part.len());
            let n = match std::future::poll_fn(|cx| send.poll_capacity(cx)).await {
                Some(Ok(n)) => n.min(part.len()),
                _ => return,
            };
            if n > 0 && send.send_data(part.slice(..n), false).is_err() {
                return;
            }
        }
    });
    let res = tokio::time::timeout(Duration::from_mins(5), res).await;
    let waited = start.elapsed();
    let status = res.ok().and_then(Result::ok).map(|r| r.status());
    assert_eq!(
        status,
        Some(StatusCode::REQUEST_TIMEOUT),
        "after {waited:?}"
    );
    answered_at(start, 40);
    assert_eq!(d.count("webhook", Outcome::ClientError), 1);
    writer.abort();
    upstream.abort();
}

/// An upstream that takes `rate` bytes a second of what it is sent and never answers: its
/// address, and its task.
async fn slow_reader(rate: usize) -> (SocketAddr, tokio::task::JoinHandle<()>) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let up = l.local_addr().unwrap();
    let task = tokio::spawn(async move {
        let (mut s, _) = l.accept().await.unwrap();
        let mut buf = vec![0u8; rate];
        while matches!(s.read(&mut buf).await, Ok(n) if n > 0) {
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    });
    (up, task)
}

/// Checks that door answered `secs` seconds after `start` (on tokio's paused clock, within the
/// second after).
fn answered_at(start: tokio::time::Instant, secs: u64) {
    let waited = start.elapsed();
    assert!(
        waited >= Duration::from_secs(secs) && waited < Duration::from_secs(secs + 1),
        "answered after {waited:?}, not {secs} s"
    );
}

/// What door answers on `rd` up to `needle`, for a client still writing its request (so not
/// read to its end); fails when door closes first, or says nothing for five minutes (of tokio's
/// paused clock, which passes at once when nothing else can happen).
async fn read_until(rd: &mut tokio::net::tcp::OwnedReadHalf, needle: &str) -> Vec<u8> {
    let mut out = Vec::new();
    let mut buf = [0u8; 1024];
    while !String::from_utf8_lossy(&out).contains(needle) {
        let read = tokio::time::timeout(Duration::from_mins(5), rd.read(&mut buf)).await;
        assert!(read.is_ok(), "no answer");
        let n = read.unwrap().unwrap();
        assert_ne!(n, 0, "closed: {}", String::from_utf8_lossy(&out));
        out.extend_from_slice(buf.get(..n).unwrap());
    }
    out
}

/// What door answers on `s`, read to its end, and that it came `secs` seconds after `start` (on
/// tokio's paused clock: five minutes pass at once when nothing else can happen, so no answer
/// fails at once).
async fn answer_within(s: &mut TcpStream, start: tokio::time::Instant, secs: u64) -> String {
    let mut out = Vec::new();
    let read = tokio::time::timeout(Duration::from_mins(5), s.read_to_end(&mut out)).await;
    assert!(read.is_ok(), "no answer");
    answered_at(start, secs);
    String::from_utf8_lossy(&out).into_owned()
}

/// An upstream whose SYNs go unanswered (a listener whose accept queue is full: Linux drops the
/// SYN) holds a request with a body no longer than `upstream_timeout`: the connection attempt
/// gives up then, where the operating system would keep trying for about two minutes while
/// neither the body's deadline nor the upstream timeout has begun.
#[tokio::test(start_paused = true)]
async fn an_upstream_that_never_answers_the_syn_fails_a_request_with_a_body_in_time() {
    let silent = tokio::net::TcpSocket::new_v4().unwrap();
    silent.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let up = silent.local_addr().unwrap();
    // Backlog 0: one connection fills the accept queue; nobody accepts it.
    let _listener = silent.listen(0).unwrap();
    let _queued = TcpStream::connect(up).await.unwrap();
    let d = door(&config(up, "upstream_timeout = \"2s\"", "")).await;
    let start = door_daemon::time::now();
    let mut s = TcpStream::connect(d.addr).await.unwrap();
    s.write_all(b"POST /webhooks/github HTTP/1.1\r\nHost: door.test\r\nConnection: close\r\nContent-Length: 3\r\n\r\nabc")
        .await
        .unwrap();
    let out = answer_within(&mut s, start, 2).await;
    assert!(out.starts_with("HTTP/1.1 502"), "{out}");
    assert_eq!(d.inflight("webhook"), 0);
}

/// A `stream = true` route's body has no bound at all: a pause of 5 minutes between two parts of
/// it, past its group's `read_timeout` (30 s) and `body_read_timeout` (60 s), is kept.
#[tokio::test(start_paused = true)]
async fn streaming_routes_have_no_body_deadline() {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let up = upstream(aborted_upstream(Arc::clone(&seen))).await;
    let d = door(&config(
        up,
        "",
        "[[route]]\ngroup = \"api\"\npath = \"/stream\"\nstream = true",
    ))
    .await;
    let mut s = TcpStream::connect(d.addr).await.unwrap();
    s.write_all(b"POST /stream HTTP/1.1\r\nHost: door.test\r\nConnection: close\r\nContent-Length: 20\r\n\r\n0123456789")
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_mins(5)).await;
    s.write_all(b"0123456789").await.unwrap();
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out).await;
    let out = String::from_utf8_lossy(&out);
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    assert_eq!(seen.lock().unwrap().as_slice(), ["body 20"]);
}

#[tokio::test(start_paused = true)]
async fn slowloris_headers_are_closed_at_the_header_timeout() {
    let up = upstream(echo()).await;
    let d = door(&config(up, "", "")).await;
    let start = door_daemon::time::now();
    let mut s = TcpStream::connect(d.addr).await.unwrap();
    s.write_all(b"GET / HTTP/1.1\r\nHost: door.test\r\nX-Slow: a")
        .await
        .unwrap();
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out).await;
    let waited = start.elapsed();
    assert!(
        waited >= Duration::from_secs(10) && waited < Duration::from_secs(11),
        "header_read_timeout is 10 s: {waited:?}"
    );
    assert!(!String::from_utf8_lossy(&out).contains("200"));
}

/// After an answer on a kept-alive HTTP/1.1 connection the next head is due within the header
/// read timeout too, whether nothing of it has come or only part.
#[tokio::test(start_paused = true)]
async fn a_kept_alive_connection_whose_next_head_is_late_is_closed_at_the_header_timeout() {
    let up = upstream(echo()).await;
    let d = door(&config(up, "", "")).await;
    for next in [&b""[..], b"GET /y HTTP/1.1\r\nHost: door.test\r\nX-Slow: a"] {
        let start = door_daemon::time::now();
        let mut s = TcpStream::connect(d.addr).await.unwrap();
        s.write_all(b"GET /x HTTP/1.1\r\nHost: door.test\r\n\r\n")
            .await
            .unwrap();
        s.write_all(next).await.unwrap();
        let mut out = Vec::new();
        let _ = s.read_to_end(&mut out).await;
        let waited = start.elapsed();
        let out = String::from_utf8_lossy(&out);
        assert!(out.starts_with("HTTP/1.1 200"), "{out}");
        assert!(
            out.ends_with("GET /x xfp=http len=0"),
            "one answer only: {out}"
        );
        assert!(
            waited >= Duration::from_secs(10) && waited < Duration::from_secs(11),
            "sent {next:?} after the first request: header_read_timeout is 10 s, closed after {waited:?}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn a_connection_whose_first_head_never_comes_is_closed_at_the_header_timeout() {
    let up = upstream(echo()).await;
    let d = door(&config(up, "", "")).await;
    // Nothing at all, a byte of a request line, and part of the HTTP/2 preface: each closed at
    // 10 s, without a frame (the connection is not known to speak HTTP/2).
    for sent in [&b""[..], b"G", b"PRI * HTTP/2.0\r\n"] {
        let start = door_daemon::time::now();
        let mut s = TcpStream::connect(d.addr).await.unwrap();
        s.write_all(sent).await.unwrap();
        let mut out = Vec::new();
        let _ = s.read_to_end(&mut out).await;
        let waited = start.elapsed();
        assert!(
            waited >= Duration::from_secs(10) && waited < Duration::from_secs(11),
            "sent {sent:?}: header_read_timeout is 10 s, idle_timeout 60 s: closed after {waited:?}"
        );
        assert!(out.is_empty(), "sent {sent:?}: got {out:?}");
    }
}

/// A cleartext client that sent the whole HTTP/2 preface (h2c with prior knowledge, as gRPC
/// channels do before their first call) and no request gets a GOAWAY at the header read timeout,
/// as one that chose `h2` by ALPN does, and is dropped if it has not left the timeout after.
#[tokio::test(start_paused = true)]
async fn an_h2c_connection_whose_first_request_never_comes_gets_a_goaway() {
    let up = upstream(echo()).await;
    let d = door(&config(up, "", "")).await;
    // The preface, sent in two pieces, then an empty SETTINGS frame.
    let start = door_daemon::time::now();
    let mut s = TcpStream::connect(d.addr).await.unwrap();
    s.write_all(b"PRI * HTTP/2.0\r\n").await.unwrap();
    tokio::task::yield_now().await;
    s.write_all(b"\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0")
        .await
        .unwrap();
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out).await;
    let waited = start.elapsed();
    // Frames: a 9-byte header (length, type, flags, stream), then the payload.
    let mut types = Vec::new();
    let mut rest = &out[..];
    while let [a, b, c, kind, _, _, _, _, _, payload @ ..] = rest {
        let len = usize::from(*a) << 16 | usize::from(*b) << 8 | usize::from(*c);
        types.push(*kind);
        rest = payload.get(len..).unwrap_or_default();
    }
    assert!(
        types.contains(&0x7),
        "a GOAWAY (type 7) among door's frames: types {types:?}"
    );
    assert!(
        waited >= Duration::from_secs(20) && waited < Duration::from_secs(21),
        "the GOAWAY at 10 s, the connection dropped 10 s later: closed after {waited:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn idle_http2_connections_are_closed_at_the_idle_timeout() {
    let up = upstream(echo()).await;
    let d = door(&config(up, "idle_timeout = \"30s\"", "")).await;
    let start = door_daemon::time::now();
    let s = TcpStream::connect(d.addr).await.unwrap();
    let (c, conn) = h2::client::handshake(s).await.unwrap();
    let conn = tokio::spawn(conn);
    let req = Request::get("http://door.test/x").body(()).unwrap();
    let mut c = c.ready().await.unwrap();
    let (res, _) = c.send_request(req, true).unwrap();
    assert_eq!(res.await.unwrap().status(), StatusCode::OK);
    // The client keeps its handle: only door can end the connection.
    let _ = conn.await;
    drop(c);
    let waited = start.elapsed();
    assert!(
        waited >= Duration::from_secs(30) && waited < Duration::from_secs(31),
        "{waited:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn upstream_timeout_is_504_and_refused_is_502_both_settled_as_server_error() {
    let hang: Handler = Arc::new(|_req| {
        Box::pin(async {
            std::future::pending::<()>().await;
            Response::new(full(""))
        })
    });
    let up = upstream(hang).await;
    let (d, failed, _provider) = door_counting(&config(up, "upstream_timeout = \"2s\"", "")).await;
    let start = door_daemon::time::now();
    let res = h1(d.addr)
        .await
        .send_request(get("/api/slow"))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::GATEWAY_TIMEOUT);
    assert!(start.elapsed() >= Duration::from_secs(2));
    assert_eq!(d.inflight("api"), 0);
    assert_eq!(d.count("api", Outcome::ServerError), 1);
    assert_eq!(failed("door.requests_failed", "upstream_timeout"), 1);
    assert_eq!(failed("door.requests_failed", ""), 1);

    // A port bound but not listening: connections to it are refused, and no other test can
    // take it while this one holds it.
    let held = tokio::net::TcpSocket::new_v4().unwrap();
    held.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let closed = held.local_addr().unwrap();
    let (d, failed, _provider) = door_counting(&config(closed, "", "")).await;
    let res = h1(d.addr).await.send_request(get("/api/x")).await.unwrap();
    assert_eq!(res.status(), StatusCode::BAD_GATEWAY);
    assert_eq!(d.inflight("api"), 0);
    assert_eq!(d.count("api", Outcome::ServerError), 1);
    assert_eq!(failed("door.requests_failed", "upstream_error"), 1);
    assert_eq!(failed("door.requests_failed", ""), 1);
}

// ---------------------------------------------------------------- 4. streaming

/// Trailer fields cross door over HTTP/1.1 on both hops: the client's `TE: trailers` reaches
/// the upstream, which then sends the trailers its `Trailer` field names, and door's answer
/// keeps that field, without which hyper drops them.
#[tokio::test]
async fn response_trailers_cross_door_over_http11() {
    let handler: Handler = Arc::new(|req: Request<Incoming>| {
        let te = req
            .headers()
            .get("te")
            .map_or("-", |v| v.to_str().unwrap_or("?"))
            .to_owned();
        Box::pin(async move {
            let mut trailers = http::HeaderMap::new();
            trailers.insert("x-sum", http::HeaderValue::from_static("42"));
            let frames: Vec<Result<Frame<Bytes>, Infallible>> = vec![
                Ok(Frame::data(Bytes::from(format!("te={te}")))),
                Ok(Frame::trailers(trailers)),
            ];
            let mut res =
                Response::new(StreamBody::new(futures_util::stream::iter(frames)).boxed());
            res.headers_mut()
                .insert("trailer", http::HeaderValue::from_static("x-sum"));
            res
        })
    });
    let up = upstream(handler).await;
    let d = door(&config(up, "", "")).await;
    for path in ["/l/session/1", "/unlimited"] {
        let mut req = get(path);
        req.headers_mut()
            .insert("te", http::HeaderValue::from_static("trailers"));
        let res = h1(d.addr).await.send_request(req).await.unwrap();
        assert_eq!(res.status(), StatusCode::OK);
        let body = res.into_body().collect().await.unwrap();
        let trailers = body.trailers().cloned();
        assert_eq!(body.to_bytes(), "te=trailers", "{path}");
        assert_eq!(trailers.unwrap()["x-sum"], "42", "{path}");
    }
}

/// A response's trailers reach an h2c client without the connection-specific fields an HTTP/1.1
/// upstream may put there (`Connection`, `Keep-Alive`, `Upgrade`, `TE` other than `trailers`:
/// RFC 9113 §8.2.2 forbids them in any HEADERS frame, and the `h2` crate refuses to send them, so
/// passed on they would reset the stream after its last byte of data) nor the framing and control
/// fields RFC 9110 §6.5.1 keeps out of a trailer section (`Content-Length`, `Trailer`,
/// `Content-Type`…), which hyper's HTTP/1.1 server drops for an HTTP/1.1 client. Other trailer
/// fields pass, and over HTTP/1.1 (the upstream's `Trailer` names them all) the same ones arrive.
#[tokio::test]
async fn response_trailers_reach_the_client_without_connection_or_framing_fields() {
    const SENT: [(&str, &str); 7] = [
        ("x-sum", "42"),
        ("keep-alive", "timeout=5"),
        ("upgrade", "websocket"),
        ("connection", "x-hop"),
        ("x-hop", "1"),
        ("content-length", "9"),
        ("content-type", "text/plain"),
    ];
    let handler: Handler = Arc::new(|_req: Request<Incoming>| {
        Box::pin(async move {
            let mut trailers = http::HeaderMap::new();
            for (k, v) in SENT {
                trailers.insert(
                    http::HeaderName::from_static(k),
                    http::HeaderValue::from_static(v),
                );
            }
            let frames: Vec<Result<Frame<Bytes>, Infallible>> = vec![
                Ok(Frame::data(Bytes::from_static(b"payload"))),
                Ok(Frame::trailers(trailers)),
            ];
            let mut res =
                Response::new(StreamBody::new(futures_util::stream::iter(frames)).boxed());
            let names = SENT.map(|(k, _)| k).join(", ");
            res.headers_mut()
                .insert("trailer", http::HeaderValue::from_str(&names).unwrap());
            res
        })
    });
    let up = upstream(handler).await;
    let d = door(&config(up, "", "")).await;

    // h2c: the whole body, then the trailers, and the stream ends cleanly.
    let s = TcpStream::connect(d.addr).await.unwrap();
    let (c, conn) = h2::client::handshake(s).await.unwrap();
    tokio::spawn(conn);
    for path in ["/l/session/1", "/unlimited"] {
        let req = Request::get(format!("http://door.test{path}"))
            .header("te", "trailers")
            .body(())
            .unwrap();
        let mut c = c.clone().ready().await.unwrap();
        let (res, _) = c.send_request(req, true).unwrap();
        let res = res.await.unwrap();
        assert_eq!(res.status(), StatusCode::OK, "{path}");
        let mut body = res.into_body();
        let mut got = Vec::new();
        while let Some(chunk) = body.data().await {
            got.extend_from_slice(&chunk.unwrap());
        }
        assert_eq!(got, b"payload", "h2c {path}");
        let trailers = body.trailers().await.unwrap().unwrap();
        let mut names: Vec<&str> = trailers.keys().map(http::HeaderName::as_str).collect();
        names.sort_unstable();
        assert_eq!(names, ["x-sum"], "h2c {path}");
    }

    // HTTP/1.1: the same trailer fields.
    let mut req = get("/unlimited");
    req.headers_mut()
        .insert("te", http::HeaderValue::from_static("trailers"));
    let res = h1(d.addr).await.send_request(req).await.unwrap();
    let body = res.into_body().collect().await.unwrap();
    let trailers = body.trailers().cloned().unwrap();
    let mut names: Vec<&str> = trailers.keys().map(http::HeaderName::as_str).collect();
    names.sort_unstable();
    assert_eq!(names, ["x-sum"], "HTTP/1.1");
    assert_eq!(body.to_bytes(), "payload");
}

/// A request's trailers reach the upstream without the fields door reads or rewrites in the
/// header section: an upstream that merges trailers into the header section (Apache httpd's
/// `MergeTrailers On`) would otherwise take a client-chosen address or session from there. Other
/// trailer fields pass, and the request's `Trailer` field names only those. Over HTTP/1.1
/// (chunked, the fields named in `Trailer`) and h2c.
#[tokio::test]
async fn request_trailers_reach_the_upstream_without_identity_or_credential_fields() {
    let up = upstream(trailer_echo()).await;
    let d = door(&config(up, "", "")).await;
    let sent = [
        ("x-forwarded-for", "198.51.100.66"),
        ("forwarded", "for=198.51.100.70"),
        ("x-real-ip", "198.51.100.71"),
        ("x_forwarded_for", "198.51.100.72"),
        ("cookie", "sid=zzz"),
        ("authorization", "Bearer made-up"),
        ("x-http-method-override", "DELETE"),
        ("x-sum", "42"),
    ];
    let mut trailers = http::HeaderMap::new();
    for (k, v) in sent {
        trailers.insert(
            http::HeaderName::from_static(k),
            http::HeaderValue::from_static(v),
        );
    }
    let names = sent.map(|(k, _)| k).join(", ");

    // HTTP/1.1: hyper's client sends the trailer fields `Trailer` names, chunked.
    for path in ["/webhooks/github", "/unlimited"] {
        let frames: Vec<Result<Frame<Bytes>, Infallible>> = vec![
            Ok(Frame::data(Bytes::from_static(b"payload"))),
            Ok(Frame::trailers(trailers.clone())),
        ];
        let req = Request::post(path)
            .header("host", "door.test")
            .header("trailer", names.as_str())
            .body(StreamBody::new(futures_util::stream::iter(frames)).boxed())
            .unwrap();
        let res = h1(d.addr).await.send_request(req).await.unwrap();
        assert_eq!(res.status(), StatusCode::OK, "{path}");
        assert_eq!(body_string(res).await, "x-sum|x-sum", "HTTP/1.1 {path}");
    }

    // h2c: a HEADERS frame (with `Trailer`, which door's HTTP/1.1 hop to the upstream needs),
    // DATA, then the trailers in a last HEADERS frame.
    let s = TcpStream::connect(d.addr).await.unwrap();
    let (c, conn) = h2::client::handshake(s).await.unwrap();
    tokio::spawn(conn);
    let req = Request::post("http://door.test/unlimited")
        .header("trailer", names.as_str())
        .body(())
        .unwrap();
    let mut c = c.ready().await.unwrap();
    let (res, mut stream) = c.send_request(req, false).unwrap();
    stream
        .send_data(Bytes::from_static(b"payload"), false)
        .unwrap();
    stream.send_trailers(trailers).unwrap();
    let res = res.await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let mut body = res.into_body();
    let mut got = Vec::new();
    while let Some(chunk) = body.data().await {
        got.extend_from_slice(&chunk.unwrap());
    }
    assert_eq!(String::from_utf8_lossy(&got), "x-sum|x-sum", "h2c");

    // Trailers of stripped fields only: the body still ends, with no trailer section.
    let mut only = http::HeaderMap::new();
    only.insert("x-real-ip", http::HeaderValue::from_static("198.51.100.71"));
    let frames: Vec<Result<Frame<Bytes>, Infallible>> = vec![
        Ok(Frame::data(Bytes::from_static(b"payload"))),
        Ok(Frame::trailers(only)),
    ];
    let req = Request::post("/unlimited")
        .header("host", "door.test")
        .header("trailer", "x-real-ip")
        .body(StreamBody::new(futures_util::stream::iter(frames)).boxed())
        .unwrap();
    let res = h1(d.addr).await.send_request(req).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(
        body_string(res).await,
        "|",
        "no trailer field reached the upstream, and no `Trailer` naming one"
    );
}

/// An upstream handler that answers with the names of the trailer fields it got, sorted, then `|`
/// and the request's `Trailer` lines joined by `#`.
fn trailer_echo() -> Handler {
    Arc::new(|req: Request<Incoming>| {
        Box::pin(async move {
            let announced = req
                .headers()
                .get_all("trailer")
                .iter()
                .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
                .collect::<Vec<_>>()
                .join("#");
            let body = req.into_body().collect().await.unwrap();
            let mut names: Vec<String> = body
                .trailers()
                .map(|t| t.keys().map(|k| k.as_str().to_owned()).collect())
                .unwrap_or_default();
            names.sort();
            Response::new(full(format!("{}|{announced}", names.join(","))))
        })
    })
}

/// `Trailer` lines are pruned one by one: a line with a byte outside visible ASCII, which hyper's
/// client skips when it picks the trailer fields it may send, does not take the other line's
/// names with it (the upstream still gets `x-sum`).
#[tokio::test]
async fn a_trailer_line_hyper_skips_does_not_take_the_others_with_it() {
    let up = upstream(trailer_echo()).await;
    let d = door(&config(up, "", "")).await;
    let mut two = http::HeaderMap::new();
    two.insert("x-sum", http::HeaderValue::from_static("42"));
    two.insert("cookie", http::HeaderValue::from_static("sid=zzz"));
    let frames: Vec<Result<Frame<Bytes>, Infallible>> = vec![
        Ok(Frame::data(Bytes::from_static(b"payload"))),
        Ok(Frame::trailers(two)),
    ];
    let mut req = Request::post("/unlimited")
        .header("host", "door.test")
        .header("trailer", "x-sum")
        .body(StreamBody::new(futures_util::stream::iter(frames)).boxed())
        .unwrap();
    req.headers_mut().append(
        "trailer",
        http::HeaderValue::from_bytes(b"caf\xe9, cookie").unwrap(),
    );
    let res = h1(d.addr).await.send_request(req).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(body_string(res).await, "x-sum|x-sum#caf\u{fffd}");
}

/// A response head from the upstream is bounded as a request head is, at 64 KiB: a larger one is
/// a 502 (hyper's client would take about 400 KB, and relayed over HTTP/2 a head that size made
/// clients end the whole connection), a head just under it is relayed.
#[tokio::test]
async fn a_response_head_over_64_kib_is_a_502() {
    let handler: Handler = Arc::new(|req: Request<Incoming>| {
        let size: usize = req.uri().path()[1..].parse().unwrap();
        Box::pin(async move {
            let mut res = Response::new(full("ok"));
            res.headers_mut().insert(
                "x-big",
                http::HeaderValue::from_str(&"a".repeat(size)).unwrap(),
            );
            res
        })
    });
    let up = upstream(handler).await;
    let d = door(&config(up, "", "")).await;
    let res = h1(d.addr).await.send_request(get("/60000")).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(res.headers()["x-big"].len(), 60_000);
    let res = h1(d.addr).await.send_request(get("/70000")).await.unwrap();
    assert_eq!(res.status(), StatusCode::BAD_GATEWAY);
    let res = h1(d.addr).await.send_request(get("/10")).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK, "the next request is served");
}

/// Responses stream through unbuffered (docs/design.md, "Limits"): an upstream flush reaches the
/// client before the upstream finishes.
#[tokio::test]
async fn an_upstream_flush_reaches_the_client_before_the_upstream_finishes() {
    type Tx = mpsc::Sender<Result<Frame<Bytes>, Infallible>>;
    let slot: Arc<Mutex<Option<Tx>>> = Arc::new(Mutex::new(None));
    let s2 = Arc::clone(&slot);
    let handler: Handler = Arc::new(move |_req| {
        let (tx, rx) = mpsc::channel(4);
        let first = tx.clone();
        *s2.lock().unwrap() = Some(tx);
        Box::pin(async move {
            first
                .send(Ok(Frame::data(Bytes::from_static(b"first"))))
                .await
                .unwrap();
            let stream = futures_util::stream::unfold(rx, |mut rx| async move {
                rx.recv().await.map(|f| (f, rx))
            });
            Response::new(StreamBody::new(stream).boxed())
        })
    });
    let up = upstream(handler).await;
    let d = door(&config(up, "", "")).await;
    for path in ["/l/session/1", "/unlimited"] {
        let res = h1(d.addr).await.send_request(get(path)).await.unwrap();
        assert_eq!(res.status(), StatusCode::OK);
        let mut body = res.into_body();
        let f = body.frame().await.unwrap().unwrap().into_data().unwrap();
        assert_eq!(&f[..], b"first", "{path}");
        // Only now does the upstream finish.
        let tx = slot.lock().unwrap().take().unwrap();
        tx.send(Ok(Frame::data(Bytes::from_static(b"rest"))))
            .await
            .unwrap();
        drop(tx);
        let rest = body.collect().await.unwrap().to_bytes();
        assert_eq!(&rest[..], b"rest");
    }
    d.eventually("settled", |d| d.inflight("link") == 0).await;
}

// ---------------------------------------------------------------- 5. cached health

fn counting(n: Arc<AtomicUsize>) -> Handler {
    Arc::new(move |_req| {
        n.fetch_add(1, Ordering::SeqCst);
        Box::pin(async { Response::new(full("ok")) })
    })
}

/// Cached health (docs/design.md, "Limits"): burst+1 probes all succeed; the extra one is cached.
#[tokio::test]
async fn health_over_budget_is_served_from_the_cache_and_counted_as_cached() {
    let hits = Arc::new(AtomicUsize::new(0));
    let up = upstream(counting(Arc::clone(&hits))).await;
    let clock = Arc::new(ManualClock::at(1));
    // Rate 0.01/s: nothing refills within the test.
    let cfg = config(up, "", "[group.health]\nburst = 3\nrate = 0.01");
    let d = door_with(&cfg, clock.clone(), None).await;
    let mut c = h1(d.addr).await;
    for i in 0..4 {
        let res = c.send_request(get("/healthz")).await.unwrap();
        assert_eq!(res.status(), StatusCode::OK, "probe {i}");
        let cached = res.headers().get("cache-status").is_some();
        assert_eq!(cached, i == 3, "probe {i}");
        assert!(res.headers().contains_key("ratelimit"), "probe {i}");
        body_string(res).await;
    }
    assert_eq!(
        hits.load(Ordering::SeqCst),
        3,
        "the cached probe did not reach the upstream"
    );
    // Each probe has one outcome: the cached one is not also counted as refused.
    assert_eq!(d.count("health", Outcome::Cached), 1);
    assert_eq!(d.count("health", Outcome::Ok), 3);
    assert_eq!(d.count("health", Outcome::RateLimited), 0);
    // Past the ttl with no fresh status: one refresh, still 200, still cached.
    clock.advance(Duration::from_secs(1));
    let res = c.send_request(get("/healthz")).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    body_string(res).await;
    assert_eq!(hits.load(Ordering::SeqCst), 4);
    assert_eq!(d.count("health", Outcome::Cached), 2);
    assert_eq!(d.count("health", Outcome::RateLimited), 0);
    // Draining: 503 at once, cache bypassed, upstream not asked.
    d.app().begin_drain();
    let res = c.send_request(get("/healthz")).await.unwrap();
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(hits.load(Ordering::SeqCst), 4);
}

/// An upstream written by hand: for each connection, reads one request head and writes `answer`,
/// then closes. For answers hyper's server would never send.
async fn raw_upstream(answer: &'static [u8]) -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = l.accept().await else {
                return;
            };
            tokio::spawn(async move {
                if support::read_head(&mut s).await.is_none() {
                    return;
                }
                let _ = s.write_all(answer).await;
                let _ = s.shutdown().await;
            });
        }
    });
    addr
}

/// A health refresh the upstream answers with `101` (it switched although door's probe asked for
/// no upgrade) is a failure, 502, as on the forwarding path: a `101` served to a plain probe
/// would close an HTTP/1.1 client's connection and reset an HTTP/2 client's stream.
#[tokio::test]
async fn a_health_refresh_answered_with_101_is_served_as_502() {
    let up = raw_upstream(
        b"HTTP/1.1 101 Switching Protocols\r\nConnection: upgrade\r\nUpgrade: foo\r\n\r\n",
    )
    .await;
    let clock = Arc::new(ManualClock::at(1));
    let cfg = config(up, "", "[group.health]\nburst = 1\nrate = 0.01");
    let d = door_with(&cfg, clock.clone(), None).await;
    // Within budget, forwarded: the unrequested switch is a 502.
    let mut c = h1(d.addr).await;
    let res = c.send_request(get("/healthz")).await.unwrap();
    assert_eq!(res.status(), StatusCode::BAD_GATEWAY);
    body_string(res).await;
    // Over budget past the ttl: the refresh gets the 101.
    clock.advance(Duration::from_secs(2));
    let mut c = h1(d.addr).await;
    let res = c.send_request(get("/healthz")).await.unwrap();
    assert_eq!(res.status(), StatusCode::BAD_GATEWAY);
    assert!(res.headers().contains_key("cache-status"));
    assert_eq!(d.count("health", Outcome::Cached), 1);
}

/// The response head door relays for `answer`'s, over HTTP/1.1: its lines, lower-cased.
async fn relayed_head(answer: &'static [u8]) -> Vec<String> {
    let up = raw_upstream(answer).await;
    let d = door(&config(up, "", "")).await;
    let mut s = TcpStream::connect(d.addr).await.unwrap();
    s.write_all(b"GET /static HTTP/1.1\r\nHost: door.test\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut out))
        .await
        .unwrap()
        .unwrap();
    let out = String::from_utf8_lossy(&out).to_ascii_lowercase();
    let (head, body) = out.split_once("\r\n\r\n").unwrap();
    assert_eq!(body, "hello", "{out}");
    head.lines().map(str::to_owned).collect()
}

/// A `Content-Length` the upstream sent twice, or as a list of one value, which hyper's client
/// accepts, reaches the client as one field of one value (RFC 9110 §8.6): two fields would make
/// an HTTP/2 client reset the stream, and HTTP/1.1 parsers such as Node's refuse the list.
#[tokio::test]
async fn a_repeated_content_length_from_the_upstream_is_relayed_as_one() {
    for answer in [
        &b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\nhello"[..],
        b"HTTP/1.1 200 OK\r\nContent-Length: 5, 5\r\n\r\nhello",
    ] {
        let head = relayed_head(answer).await;
        let lengths: Vec<_> = head
            .iter()
            .filter(|l| l.starts_with("content-length:"))
            .collect();
        assert_eq!(lengths, ["content-length: 5"], "{head:?}");
    }
}

/// An upgrade's `101` reaches the client with the upstream's end-to-end fields and its `Upgrade`,
/// but not its hop-by-hop ones (`Keep-Alive`, `Proxy-Authenticate`, a field its `Connection`
/// names: RFC 9110 §7.6.1).
#[tokio::test]
async fn an_upgrade_answer_loses_the_upstreams_hop_by_hop_fields() {
    let up = raw_upstream(
        b"HTTP/1.1 101 Switching Protocols\r\nConnection: upgrade, x-hop\r\nUpgrade: foo\r\n\
          Keep-Alive: timeout=5\r\nProxy-Authenticate: Basic\r\nX-Hop: 1\r\nX-App: 1\r\n\r\n",
    )
    .await;
    let d = door(&config(up, "", "")).await;
    let mut s = TcpStream::connect(d.addr).await.unwrap();
    s.write_all(
        b"GET /static HTTP/1.1\r\nHost: door.test\r\nConnection: upgrade\r\nUpgrade: foo\r\n\r\n",
    )
    .await
    .unwrap();
    let out = tokio::time::timeout(Duration::from_secs(10), support::read_head(&mut s))
        .await
        .expect("no answer")
        .expect("closed before a whole head");
    let head = String::from_utf8_lossy(&out).to_ascii_lowercase();
    assert!(head.starts_with("http/1.1 101"), "{head}");
    for kept in ["upgrade: foo", "connection: upgrade", "x-app: 1"] {
        assert!(head.contains(kept), "{kept}: {head}");
    }
    for gone in ["keep-alive", "proxy-authenticate", "x-hop"] {
        assert!(!head.contains(gone), "{gone}: {head}");
    }
}

/// A health upstream that answers 400 to a `Host` it does not serve (as Django's
/// `ALLOWED_HOSTS` does) and 200 otherwise; `seen` gets each request's method, `Host` and body
/// length.
fn picky_health(seen: Arc<Mutex<Vec<(String, String, usize)>>>) -> Handler {
    Arc::new(move |req: Request<Incoming>| {
        let seen = Arc::clone(&seen);
        Box::pin(async move {
            let method = req.method().to_string();
            let host = req
                .headers()
                .get("host")
                .and_then(|v| v.to_str().ok())
                .unwrap_or("-")
                .to_owned();
            let len = req
                .into_body()
                .collect()
                .await
                .map_or(0, |b| b.to_bytes().len());
            let status = match host.as_str() {
                "evil.test" => StatusCode::BAD_REQUEST,
                // A redirect to the canonical host, as many applications answer any other.
                "www.door.test" => StatusCode::PERMANENT_REDIRECT,
                _ => StatusCode::OK,
            };
            seen.lock().unwrap().push((method, host.clone(), len));
            let mut res = Response::new(full(host));
            *res.status_mut() = status;
            res
        })
    })
}

fn probe(method: &str, host: &str, body: &'static str) -> Request<UBody> {
    Request::builder()
        .method(method)
        .uri("/healthz")
        .header("host", host)
        .body(full(body))
        .unwrap()
}

/// Any client may probe, so a status that answers its own request (a 400 for a `Host` the
/// application refuses) is never served to the others: neither an admitted probe's nor a
/// refresh's. An over-budget request of another method, with a body, reaches the upstream only
/// as door's own body-less `GET`.
#[tokio::test]
async fn a_probe_with_a_host_the_application_refuses_cannot_poison_the_cached_health() {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let up = upstream(picky_health(Arc::clone(&seen))).await;
    let clock = Arc::new(ManualClock::at(1));
    // Rate 0.01/s: nothing refills within the test.
    let cfg = config(up, "", "[group.health]\nburst = 3\nrate = 0.01");
    let d = door_with(&cfg, clock.clone(), None).await;
    let mut c = h1(d.addr).await;
    let mut status = async |req| {
        let res = c.send_request(req).await.unwrap();
        let s = res.status();
        body_string(res).await;
        s
    };
    // Admitted: two good probes, then a bad one, which gets its own 400.
    assert_eq!(status(probe("GET", "door.test", "")).await, StatusCode::OK);
    assert_eq!(status(probe("GET", "door.test", "")).await, StatusCode::OK);
    assert_eq!(
        status(probe("GET", "evil.test", "")).await,
        StatusCode::BAD_REQUEST
    );
    // Over budget: the last status that speaks for health, not the 400.
    assert_eq!(status(probe("GET", "door.test", "")).await, StatusCode::OK);
    assert_eq!(seen.lock().unwrap().len(), 3, "served from the cache");
    // Stale: the bad probe's refresh answers it alone; the next probe refreshes again.
    clock.advance(Duration::from_secs(1));
    assert_eq!(
        status(probe("GET", "evil.test", "")).await,
        StatusCode::BAD_REQUEST
    );
    assert_eq!(status(probe("GET", "door.test", "")).await, StatusCode::OK);
    assert_eq!(seen.lock().unwrap().len(), 5);
    // A POST with a body, over budget with a stale status: door's own GET, no body.
    clock.advance(Duration::from_secs(1));
    assert_eq!(
        status(probe("POST", "door.test", "payload")).await,
        StatusCode::OK
    );
    assert_eq!(
        seen.lock().unwrap().last().unwrap(),
        &("GET".to_owned(), "door.test".to_owned(), 0)
    );
    assert_eq!(d.count("health", Outcome::Cached), 4);
}

/// A redirect answers how its asker spelt the request: an over-budget probe whose refresh the
/// application answers 308 gets the 308 alone; the next probe is not served it from the cache.
#[tokio::test]
async fn a_redirect_for_one_probe_is_not_served_to_the_next() {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let up = upstream(picky_health(Arc::clone(&seen))).await;
    let clock = Arc::new(ManualClock::at(1));
    let cfg = config(up, "", "[group.health]\nburst = 1\nrate = 0.01");
    let d = door_with(&cfg, clock.clone(), None).await;
    let mut c = h1(d.addr).await;
    let mut status = async |req| {
        let res = c.send_request(req).await.unwrap();
        let s = res.status();
        body_string(res).await;
        s
    };
    assert_eq!(status(probe("GET", "door.test", "")).await, StatusCode::OK);
    clock.advance(Duration::from_secs(1));
    // Over budget with a stale status: this probe's refresh is redirected, for it alone.
    assert_eq!(
        status(probe("GET", "www.door.test", "")).await,
        StatusCode::PERMANENT_REDIRECT
    );
    assert_eq!(status(probe("GET", "door.test", "")).await, StatusCode::OK);
    assert_eq!(seen.lock().unwrap().len(), 3, "the next probe refreshed");
}

/// A load balancer on the allow list sees the drain: its probe is answered 503 by door, not
/// forwarded, while its other requests still pass unlimited.
#[tokio::test]
async fn a_health_probe_from_an_allowed_client_sees_the_drain() {
    let hits = Arc::new(AtomicUsize::new(0));
    let up = upstream(counting(Arc::clone(&hits))).await;
    let d = door(&config(up, "allow = [\"127.0.0.1/32\"]", "")).await;
    let mut c = h1(d.addr).await;
    let res = c.send_request(get("/healthz")).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    body_string(res).await;
    assert_eq!(hits.load(Ordering::SeqCst), 1);
    d.app().begin_drain();
    let res = c.send_request(get("/healthz")).await.unwrap();
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    body_string(res).await;
    assert_eq!(
        hits.load(Ordering::SeqCst),
        1,
        "the probe was not forwarded"
    );
}

// ---------------------------------------------------------------- 6. RateLimit fields

#[tokio::test]
async fn ratelimit_fields_on_every_limited_response() {
    let up = upstream(echo()).await;
    let clock = Arc::new(ManualClock::at(1));
    let d = door_with(&config(up, "", ""), clock, None).await;
    let mut c = h1(d.addr).await;
    let res = c.send_request(get("/l/session/a")).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(res.headers()["ratelimit-policy"], "\"link\";q=20;w=20");
    assert_eq!(res.headers()["ratelimit"], "\"link\";r=19;t=1");
    body_string(res).await;
    for _ in 0..19 {
        body_string(c.send_request(get("/l/session/a")).await.unwrap()).await;
    }
    let res = c.send_request(get("/l/session/a")).await.unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(res.headers()["retry-after"], "1");
    assert_eq!(res.headers()["ratelimit-policy"], "\"link\";q=20;w=20");
    assert_eq!(res.headers()["ratelimit"], "\"link\";r=0;t=20");
    let body: serde_json::Value = serde_json::from_str(&body_string(res).await).unwrap();
    assert_eq!(body["code"], "rate-limited");
    assert_eq!(body["details"]["group"], "link");
    assert_eq!(body["details"]["scope"], "client");
    assert_eq!(body["details"]["retry_after_s"], 1);
    let res = c.send_request(get("/unlimited")).await.unwrap();
    assert!(!res.headers().contains_key("ratelimit"));
    assert!(!res.headers().contains_key("ratelimit-policy"));
}

#[tokio::test]
async fn ratelimit_fields_can_be_turned_off() {
    let up = upstream(echo()).await;
    let d = door(&config(up, "ratelimit_headers = false", "")).await;
    let res = h1(d.addr)
        .await
        .send_request(get("/l/session/a"))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert!(!res.headers().contains_key("ratelimit"));
    assert!(!res.headers().contains_key("ratelimit-policy"));
}

// ---------------------------------------------------------------- robustness

#[tokio::test]
async fn http2_rapid_reset_leaves_door_responsive_and_the_limiter_clean() {
    let handler: Handler = Arc::new(|req: Request<Incoming>| {
        Box::pin(async move {
            if req.uri().path() == "/api/reset" {
                std::future::pending::<()>().await;
            }
            Response::new(full("ok"))
        })
    });
    let up = upstream(handler).await;
    let d = door(&config(up, "", "")).await;
    let s = TcpStream::connect(d.addr).await.unwrap();
    let (c, conn) = h2::client::handshake(s).await.unwrap();
    let conn = tokio::spawn(conn);
    let mut c = c.ready().await.unwrap();
    let mut sent = 0;
    for _ in 0..1000 {
        let req = Request::post("http://door.test/api/reset")
            .body(())
            .unwrap();
        let Ok((res, mut body)) = c.send_request(req, false) else {
            break;
        };
        body.send_reset(h2::Reason::CANCEL);
        drop(res);
        sent += 1;
        let Ok(ready) = c.ready().await else { break };
        c = ready;
    }
    assert!(sent >= 100, "only {sent} streams opened");
    // A second client is served at once.
    let res = h1(d.addr).await.send_request(get("/api/ok")).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    d.eventually("every reset stream settled", |d| d.inflight("api") == 0)
        .await;
    d.eventually("nothing in flight", |d| d.app().requests_in_flight() == 0)
        .await;
    conn.abort();
}

#[tokio::test]
async fn a_client_gone_mid_body_frees_its_slot() {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let up = upstream(aborted_upstream(Arc::clone(&seen))).await;
    let d = door(&config(up, "", "")).await;
    let mut s = TcpStream::connect(d.addr).await.unwrap();
    s.write_all(
        b"POST /webhooks/github HTTP/1.1\r\nHost: door.test\r\nContent-Length: 1000\r\n\r\n0123456789",
    )
    .await
    .unwrap();
    d.eventually("admitted", |d| d.inflight("webhook") == 1)
        .await;
    drop(s);
    d.eventually("slot freed", |d| d.inflight("webhook") == 0)
        .await;
    d.eventually("nothing in flight", |d| d.app().requests_in_flight() == 0)
        .await;
    // Abandoned: counted as the client's failure (and its held token spent).
    assert_eq!(d.count("webhook", Outcome::ClientError), 1);
}

#[tokio::test]
async fn http1_pipelined_requests_are_answered_in_order() {
    let up = upstream(echo()).await;
    let d = door(&config(up, "", "")).await;
    let out = raw(
        d.addr,
        b"GET /p/1 HTTP/1.1\r\nHost: d\r\n\r\nGET /l/session/2 HTTP/1.1\r\nHost: d\r\n\r\n\
          POST /webhooks/github HTTP/1.1\r\nHost: d\r\nContent-Length: 3\r\n\r\nabc\
          GET /p/4 HTTP/1.1\r\nHost: d\r\nConnection: close\r\n\r\n",
    )
    .await;
    let order: Vec<usize> = [
        "GET /p/1 ",
        "GET /l/session/2 ",
        "POST /webhooks/github xfp=http len=3",
        "GET /p/4 ",
    ]
    .iter()
    .map(|n| {
        out.find(n)
            .unwrap_or_else(|| panic!("{n} missing in {out}"))
    })
    .collect();
    assert!(order.windows(2).all(|w| w[0] < w[1]), "{out}");
    assert_eq!(out.matches("HTTP/1.1 200").count(), 4);
}

/// Answers `host=<Host the upstream received>` and counts its calls.
fn host_echo(calls: Arc<AtomicUsize>) -> Handler {
    Arc::new(move |req: Request<Incoming>| {
        calls.fetch_add(1, Ordering::SeqCst);
        let host = req
            .headers()
            .get_all("host")
            .iter()
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
            .collect::<Vec<_>>()
            .join("|");
        Box::pin(async move { Response::new(full(format!("host={host}"))) })
    })
}

/// A `GET`'s body reaches the upstream however it was framed: with `Content-Length` as chunked
/// (hyper's client drops a `GET` body of unknown length unless told to send it chunked).
#[tokio::test]
async fn a_get_body_reaches_the_upstream_chunked_or_not() {
    let d = door(&config(upstream(echo()).await, "", "")).await;
    for framing in [
        "Content-Length: 5\r\n\r\nhello",
        "Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
    ] {
        for path in ["/pass/x", "/l/session/a"] {
            let head =
                format!("GET {path} HTTP/1.1\r\nHost: door.test\r\nConnection: close\r\n{framing}");
            let out = raw(d.addr, head.as_bytes()).await;
            assert!(out.starts_with("HTTP/1.1 200"), "{out}");
            assert!(
                out.ends_with(&format!("GET {path} xfp=http len=5")),
                "{framing:?}: {out}"
            );
        }
    }
}

/// Heads door refuses before the upstream: the bytes, the status, a phrase of the answer and
/// the `door.reason` it is counted under.
const REFUSED_HEADS: [(&[u8], &str, &str, &str); 10] = [
    (
        b"GET /p HTTP/1.1\r\n\r\n",
        "400",
        "needs a Host",
        "missing_host",
    ),
    (
        b"GET /p HTTP/1.1\r\nHost: a.test\r\nHost: b.test\r\n\r\n",
        "400",
        "2 Host fields",
        "repeated_host",
    ),
    (
        b"GET /p HTTP/1.1\r\nHost: a.test:http\r\n\r\n",
        "400",
        "not a host",
        "bad_host",
    ),
    (
        b"GET http://door.test/p HTTP/1.1\r\n\r\n",
        "400",
        "needs a Host",
        "missing_host",
    ),
    (
        b"GET door.test:443 HTTP/1.1\r\nHost: a.test\r\n\r\n",
        "400",
        "not a path or an http or https URI",
        "bad_target",
    ),
    (
        b"POST /webhooks/github HTTP/1.1\r\nHost: a.test\r\n\
          Transfer-Encoding: gzip, chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
        "501",
        "transfer coding \\\"gzip\\\"",
        "transfer_coding",
    ),
    (
        // Chunked twice: hyper would remove one layer and the other reach the application.
        b"POST /webhooks/github HTTP/1.1\r\nHost: a.test\r\n\
          Transfer-Encoding: chunked, chunked\r\n\r\n\
          f\r\n5\r\nhello\r\n0\r\n\r\n\r\n0\r\n\r\n",
        "400",
        "chunked once",
        "bad_transfer_encoding",
    ),
    (
        b"GET http://user:secret@door.test/p HTTP/1.1\r\nHost: door.test\r\n\r\n",
        "400",
        "carries userinfo",
        "userinfo",
    ),
    (
        // The asterisk form is for OPTIONS only.
        b"GET * HTTP/1.1\r\nHost: door.test\r\n\r\n",
        "400",
        "request target \\\"*\\\"",
        "bad_target",
    ),
    (
        b"CONNECT door.test:443 HTTP/1.1\r\nHost: door.test:443\r\n\r\n",
        "501",
        "does not tunnel CONNECT",
        "connect",
    ),
];

/// RFC 9112 §3.2 and §6.1: an HTTP/1.1 head without `Host` (whatever its target), with two, with
/// an authority-form target on a method other than CONNECT, with a transfer coding door cannot
/// undo or `chunked` twice, or a plain CONNECT, is refused before the upstream (400, 501), the
/// connection closed and the refusal counted by reason; an absolute-form target's authority
/// replaces `Host`; HTTP/1.0 may omit it.
#[tokio::test]
async fn http1_heads_with_a_bad_host_or_transfer_coding_are_refused_before_the_upstream() {
    let calls = Arc::new(AtomicUsize::new(0));
    let up = upstream(host_echo(Arc::clone(&calls))).await;
    let cfg = config(up, "", "");
    let (d, counted, _provider) = door_counting(&cfg).await;
    for (head, status, message, reason) in REFUSED_HEADS {
        let before = counted("door.requests_refused", reason);
        // No `Connection: close` asked: door closes after its answer, or `raw` would not return.
        let out = tokio::time::timeout(Duration::from_secs(5), raw(d.addr, head))
            .await
            .unwrap_or_else(|_| panic!("{reason}: door kept the connection open"));
        assert!(!out.contains("secret"), "{out}");
        assert!(out.starts_with(&format!("HTTP/1.1 {status}")), "{out}");
        assert!(out.contains(message), "{out}");
        assert!(
            out.to_ascii_lowercase().contains("connection: close"),
            "{out}"
        );
        assert_eq!(
            counted("door.requests_refused", reason),
            before + 1,
            "{reason}: {out}"
        );
    }
    assert_eq!(
        calls.load(Ordering::SeqCst),
        0,
        "a refused head reached the upstream"
    );

    let out = raw(
        d.addr,
        b"GET http://door.test/p HTTP/1.1\r\nHost: other.test\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    assert!(out.ends_with("host=door.test"), "{out}");
    let out = raw(d.addr, b"GET /p HTTP/1.0\r\n\r\n").await;
    assert!(out.starts_with("HTTP/1.0 200"), "{out}");
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    assert_eq!(
        counted("door.requests_refused", ""),
        10,
        "one count per refusal, none for the heads forwarded"
    );
}

/// HTTP/1.0 may omit `Host` (RFC 9112 §3.2 binds HTTP/1.1 only): the upstream is then told its
/// own address, as the pooled client did before door named the upstream by its pool key.
#[tokio::test]
async fn an_http1_0_request_without_host_reaches_the_upstream_with_its_address() {
    let calls = Arc::new(AtomicUsize::new(0));
    let up = upstream(host_echo(Arc::clone(&calls))).await;
    let cfg = config(up, "", "");
    let (d, _counted, _provider) = door_counting(&cfg).await;
    let out = raw(d.addr, b"GET /p HTTP/1.0\r\n\r\n").await;
    assert!(out.starts_with("HTTP/1.0 200"), "{out}");
    assert!(out.ends_with(&format!("host={up}")), "{out}");
}

/// RFC 9113 §8.3.1: an HTTP/2 request whose `Host` names another authority than `:authority` is
/// malformed (400, counted, the connection kept); one that agrees, or sends `:authority` alone,
/// reaches the upstream with that authority as `Host`. A CONNECT door does not carry is a 501 on
/// its stream.
#[tokio::test]
async fn http2_host_must_agree_with_the_authority() {
    let calls = Arc::new(AtomicUsize::new(0));
    let up = upstream(host_echo(Arc::clone(&calls))).await;
    let cfg = config(up, "", "");
    let (d, counted, _provider) = door_counting(&cfg).await;
    let s = TcpStream::connect(d.addr).await.unwrap();
    let (c, conn) = h2::client::handshake(s).await.unwrap();
    let conn = tokio::spawn(conn);
    for (host, status, body) in [
        (
            Some("other.test"),
            StatusCode::BAD_REQUEST,
            "differs from :authority",
        ),
        (Some("DOOR.test"), StatusCode::OK, "host=door.test"),
        (None, StatusCode::OK, "host=door.test"),
    ] {
        let mut req = Request::get("http://door.test/p").body(()).unwrap();
        if let Some(h) = host {
            req.headers_mut()
                .insert("host", http::HeaderValue::from_static(h));
        }
        let (got, text) = h2_send(&c, req).await;
        assert_eq!(got, status, "{host:?}");
        assert!(text.contains(body), "{host:?}: {text}");
    }
    // A plain CONNECT, and an extended CONNECT for a protocol other than WebSocket: 501 on the
    // stream, the connection kept.
    let (got, text) = h2_send(&c, Request::connect("door.test:443").body(()).unwrap()).await;
    assert_eq!(got, StatusCode::NOT_IMPLEMENTED, "{text}");
    let mut udp = Request::connect("http://door.test/udp").body(()).unwrap();
    udp.extensions_mut()
        .insert(h2::ext::Protocol::from_static("connect-udp"));
    let (got, text) = h2_send(&c, udp).await;
    assert_eq!(got, StatusCode::NOT_IMPLEMENTED, "{text}");
    let (got, _) = h2_send(&c, Request::get("http://door.test/p").body(()).unwrap()).await;
    assert_eq!(got, StatusCode::OK);
    assert_eq!(calls.load(Ordering::SeqCst), 3);
    assert_eq!(counted("door.requests_refused", "host_not_authority"), 1);
    assert_eq!(counted("door.requests_refused", "connect"), 1);
    assert_eq!(counted("door.requests_refused", "connect_protocol"), 1);
    assert_eq!(counted("door.requests_refused", ""), 3);
    conn.abort();
}

#[tokio::test]
async fn expect_100_continue_on_a_webhook() {
    let up = upstream(echo()).await;
    let d = door(&config(up, "", "")).await;
    let mut s = TcpStream::connect(d.addr).await.unwrap();
    s.write_all(
        b"POST /webhooks/github HTTP/1.1\r\nHost: d\r\nExpect: 100-continue\r\nContent-Length: 5\r\nConnection: close\r\n\r\n",
    )
    .await
    .unwrap();
    let mut buf = [0u8; 25];
    s.read_exact(&mut buf).await.unwrap();
    assert_eq!(&buf, b"HTTP/1.1 100 Continue\r\n\r\n");
    s.write_all(b"hello").await.unwrap();
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out).await;
    let out = String::from_utf8_lossy(&out);
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    assert!(
        out.ends_with("POST /webhooks/github xfp=http len=5"),
        "{out}"
    );
    assert_eq!(d.inflight("webhook"), 0);
}

// ---------------------------------------------------------------- clients that leave

/// An upstream that never answers `…/slow` (counting the calls it has open, and those door has
/// closed on it) and answers anything else at once.
fn slow_upstream(open: Arc<AtomicUsize>, closed: Arc<AtomicUsize>) -> Handler {
    struct Closed(Arc<AtomicUsize>, Arc<AtomicUsize>);
    impl Drop for Closed {
        fn drop(&mut self) {
            self.0.fetch_sub(1, Ordering::SeqCst);
            self.1.fetch_add(1, Ordering::SeqCst);
        }
    }
    Arc::new(move |req: Request<Incoming>| {
        let (open, closed) = (Arc::clone(&open), Arc::clone(&closed));
        Box::pin(async move {
            if req.uri().path().ends_with("/slow") {
                open.fetch_add(1, Ordering::SeqCst);
                let _guard = Closed(open, closed);
                std::future::pending::<()>().await;
            }
            Response::new(full("ok"))
        })
    })
}

/// Opens a request on a connection of its own and waits (bounded) until door has admitted it.
async fn hold_one(d: &Door, group: &str, head: &[u8]) -> TcpStream {
    let before = d.inflight(group);
    let mut s = TcpStream::connect(d.addr).await.unwrap();
    s.write_all(head).await.unwrap();
    d.eventually("admitted", |d| d.inflight(group) == before + 1)
        .await;
    s
}

async fn status_of(addr: SocketAddr, path: &str) -> StatusCode {
    h1(addr)
        .await
        .send_request(get(path))
        .await
        .unwrap()
        .status()
}

#[tokio::test]
async fn http1_clients_that_close_free_their_slots_at_once_and_the_upstream_call_is_closed() {
    let (open, closed) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let up = upstream(slow_upstream(Arc::clone(&open), Arc::clone(&closed))).await;
    let d = door(&config(up, "", "")).await;
    let head = b"GET /l/session/slow HTTP/1.1\r\nHost: door.test\r\n\r\n";
    // link: 2 per client. Two slow requests hold both of this client's slots.
    let a = hold_one(&d, "link", head).await;
    let b = hold_one(&d, "link", head).await;
    assert_eq!(
        status_of(d.addr, "/l/session/x").await,
        StatusCode::TOO_MANY_REQUESTS
    );
    d.eventually("both calls reached the upstream", |_| {
        open.load(Ordering::SeqCst) == 2
    })
    .await;
    let left = door_daemon::time::now();
    drop((a, b));
    d.eventually("both slots freed", |d| d.inflight("link") == 0)
        .await;
    d.eventually("the upstream saw both calls closed", |_| {
        closed.load(Ordering::SeqCst) == 2
    })
    .await;
    assert!(
        left.elapsed() < Duration::from_secs(1),
        "{:?}",
        left.elapsed()
    );
    assert_eq!(status_of(d.addr, "/l/session/x").await, StatusCode::OK);
    assert_eq!(
        d.count("link", Outcome::ClientError),
        2,
        "counted as abandoned"
    );
}

#[tokio::test]
async fn four_abandoned_requests_do_not_shut_the_group_out() {
    let (open, closed) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let up = upstream(slow_upstream(Arc::clone(&open), Arc::clone(&closed))).await;
    // Behind a trusted proxy (the test), clients are named by X-Forwarded-For. One table entry:
    // the first client takes it, the others are decided on the shared row.
    let d = door(&config(
        up,
        "trusted_proxies = [\"127.0.0.1/32\"]",
        "[group.link]\nmax_clients = 1\n",
    ))
    .await;
    let slow = |client: &str| {
        format!(
            "GET /l/session/slow HTTP/1.1\r\nHost: door.test\r\nX-Forwarded-For: {client}\r\n\r\n"
        )
    };
    let mut streams = Vec::new();
    for client in [
        "198.51.100.1",
        "198.51.100.1",
        "198.51.100.2",
        "198.51.100.3",
    ] {
        streams.push(hold_one(&d, "link", slow(client).as_bytes()).await);
    }
    // The group cap (4) is reached: everyone gets 503; the shared row holds two slots.
    let probe = |client: &'static str| {
        Request::get("/l/session/x")
            .header("host", "door.test")
            .header("x-forwarded-for", client)
            .body(Empty::new().boxed())
            .unwrap()
    };
    let res = h1(d.addr)
        .await
        .send_request(probe("198.51.100.4"))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    drop(streams);
    d.eventually("the group is free", |d| d.inflight("link") == 0)
        .await;
    d.eventually("the upstream saw every call closed", |_| {
        closed.load(Ordering::SeqCst) == 4
    })
    .await;
    // The shared row's slots are free again: two clients on it are admitted at once.
    let mut c = h1(d.addr).await;
    for client in ["198.51.100.4", "198.51.100.5"] {
        let res = c.send_request(probe(client)).await.unwrap();
        assert_eq!(res.status(), StatusCode::OK, "{client}");
    }
    assert_eq!(open.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn http2_rst_stream_frees_the_slot_and_closes_the_upstream_call() {
    let (open, closed) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let up = upstream(slow_upstream(Arc::clone(&open), Arc::clone(&closed))).await;
    let d = door(&config(up, "", "[group.link]\nmax_clients = 1\n")).await;
    let s = TcpStream::connect(d.addr).await.unwrap();
    let (c, conn) = h2::client::handshake(s).await.unwrap();
    let conn = tokio::spawn(conn);
    let mut streams = Vec::new();
    for _ in 0..2 {
        let req = Request::get("http://door.test/l/session/slow")
            .body(())
            .unwrap();
        streams.push(h2_start(&c, req).await);
    }
    d.eventually("both admitted", |d| d.inflight("link") == 2)
        .await;
    d.eventually("both calls reached the upstream", |_| {
        open.load(Ordering::SeqCst) == 2
    })
    .await;
    let left = door_daemon::time::now();
    for (res, mut body) in streams {
        body.send_reset(h2::Reason::CANCEL);
        drop(res);
    }
    d.eventually("both slots freed", |d| d.inflight("link") == 0)
        .await;
    d.eventually("the upstream saw both calls closed", |_| {
        closed.load(Ordering::SeqCst) == 2
    })
    .await;
    assert!(
        left.elapsed() < Duration::from_secs(1),
        "{:?}",
        left.elapsed()
    );
    // The connection lives on and is served.
    let req = Request::get("http://door.test/l/session/x")
        .body(())
        .unwrap();
    let (res, _) = c.ready().await.unwrap().send_request(req, true).unwrap();
    assert_eq!(res.await.unwrap().status(), StatusCode::OK);
    conn.abort();
}

#[tokio::test]
async fn hanging_up_on_a_slow_webhook_spends_its_held_token() {
    let (open, closed) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let up = upstream(slow_upstream(Arc::clone(&open), Arc::clone(&closed))).await;
    let d = door(&config(
        up,
        "",
        "[[route]]\ngroup = \"webhook\"\npath = \"/hooks/slow\"\n[group.webhook]\nrate = 0.001\nburst = 2\nper_client = 2\n",
    ))
    .await;
    let head = b"POST /hooks/slow HTTP/1.1\r\nHost: door.test\r\nContent-Length: 2\r\n\r\n{}";
    let a = hold_one(&d, "webhook", head).await;
    let b = hold_one(&d, "webhook", head).await;
    drop((a, b));
    d.eventually("both slots freed", |d| d.inflight("webhook") == 0)
        .await;
    // Both held tokens were spent: hanging up did not help; the bucket (burst 2) is empty.
    let res = h1(d.addr)
        .await
        .send_request(
            Request::post("/hooks/slow")
                .header("host", "door.test")
                .body(full("{}"))
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(d.count("webhook", Outcome::ClientError), 2);
}

// ---------------------------------------------------------------- HTTP/2 specifics

#[tokio::test(start_paused = true)]
async fn http2_a_body_still_arriving_at_the_read_timeout_gets_408() {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let up = upstream(aborted_upstream(Arc::clone(&seen))).await;
    let d = door(&config(up, "", "")).await;
    let s = TcpStream::connect(d.addr).await.unwrap();
    let (c, conn) = h2::client::handshake(s).await.unwrap();
    let conn = tokio::spawn(conn);
    let req = Request::post("http://door.test/webhooks/github")
        .header("content-length", "100")
        .body(())
        .unwrap();
    let (res, mut body) = c.ready().await.unwrap().send_request(req, false).unwrap();
    body.send_data(Bytes::from_static(b"0123456789"), false)
        .unwrap();
    let start = door_daemon::time::now();
    let res = res.await.unwrap();
    assert_eq!(res.status(), StatusCode::REQUEST_TIMEOUT);
    let waited = start.elapsed();
    assert!(
        waited >= Duration::from_secs(10) && waited < Duration::from_secs(11),
        "webhook read_timeout is 10 s: {waited:?}"
    );
    d.eventually("slot freed", |d| d.inflight("webhook") == 0)
        .await;
    assert_eq!(d.count("webhook", Outcome::ClientError), 1);
    conn.abort();
}

/// Echoes every `cookie` field line the upstream received, one per line.
fn cookie_echo() -> Handler {
    Arc::new(|req: Request<Incoming>| {
        Box::pin(async move {
            let lines: Vec<String> = req
                .headers()
                .get_all("cookie")
                .iter()
                .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
                .collect();
            Response::new(full(lines.join("\n")))
        })
    })
}

#[tokio::test]
async fn http2_cookie_fields_reach_an_http11_upstream_as_one_line_in_order() {
    let up = upstream(cookie_echo()).await;
    let d = door(&config(up, "", "")).await;
    let s = TcpStream::connect(d.addr).await.unwrap();
    let (c, conn) = h2::client::handshake(s).await.unwrap();
    let conn = tokio::spawn(conn);
    // RFC 9113 §8.2.3: a client may split the cookie field into one field per cookie-pair.
    let mut req = Request::get("http://door.test/api/cookies")
        .body(())
        .unwrap();
    for pair in ["a=1", "session=s3cr3t", "b=2"] {
        req.headers_mut()
            .append("cookie", http::HeaderValue::from_static(pair));
    }
    assert_eq!(
        h2_send(&c, req).await,
        (StatusCode::OK, "a=1; session=s3cr3t; b=2".to_owned())
    );
    conn.abort();
}

// ---------------------------------------------------------------- reload

#[tokio::test(start_paused = true)]
async fn reload_retunes_live_buckets_in_proportion_and_keeps_outcome_counts() {
    let up = upstream(echo()).await;
    let cfg = config(up, "", "[group.link]\nrate = 0.001\nburst = 4\n");
    let d = door(&cfg).await;
    let mut c = h1(d.addr).await;
    for _ in 0..4 {
        assert_eq!(
            c.send_request(get("/l/session/a")).await.unwrap().status(),
            StatusCode::OK
        );
    }
    assert_eq!(
        c.send_request(get("/l/session/a")).await.unwrap().status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(d.count("link", Outcome::Ok), 4);
    // Burst 4 → 8: the drained client stays drained (nothing is refilled to full).
    let bigger = config(up, "", "[group.link]\nrate = 0.001\nburst = 8\n");
    assert!(d.app().reload(&bigger, &cfg).is_empty());
    assert_eq!(
        c.send_request(get("/l/session/a")).await.unwrap().status(),
        StatusCode::TOO_MANY_REQUESTS,
        "a drained client stays drained"
    );
    // The counts of the group survive the reload.
    assert_eq!(d.count("link", Outcome::Ok), 4);
    assert_eq!(d.count("link", Outcome::RateLimited), 2);
}

/// The leaf certificate a TLS handshake with `d` presents, trusting `roots`.
async fn served_cert(addr: SocketAddr, trusted: &rcgen::Certificate) -> Option<Vec<u8>> {
    let name = rustls::pki_types::ServerName::try_from("door.test").unwrap();
    let s = TcpStream::connect(addr).await.unwrap();
    let s = tls_client(trusted, b"http/1.1")
        .connect(name, s)
        .await
        .ok()?;
    s.get_ref()
        .1
        .peer_certificates()
        .and_then(|c| c.first())
        .map(|c| c.to_vec())
}

#[tokio::test]
async fn reload_tls_serves_the_renewed_pair_to_new_handshakes_and_refuses_a_bad_one() {
    let dir = tempdir("tls-reload");
    let (cert, key, first) = tls_pair(&dir);
    let up = upstream(echo()).await;
    let tls_table = format!("[tls]\ncert = {cert:?}\nkey = {key:?}");
    let cfg = config(up, "", &tls_table);
    let tls = door_daemon::http::tls::load(cfg.tls.as_ref().unwrap()).unwrap();
    let d = door_with(&cfg, Arc::new(MonotonicClock::new()), Some(tls)).await;
    assert_eq!(
        served_cert(d.addr, &first).await,
        Some(first.der().to_vec())
    );

    // An open connection from before the renewal.
    let name = rustls::pki_types::ServerName::try_from("door.test").unwrap();
    let s = TcpStream::connect(d.addr).await.unwrap();
    let s = tls_client(&first, b"http/1.1")
        .connect(name, s)
        .await
        .unwrap();
    let (mut open, conn) = hyper::client::conn::http1::handshake(TokioIo::new(s))
        .await
        .unwrap();
    tokio::spawn(conn);

    // The renewal writes a new pair over the files; the reload re-reads them.
    let (_, _, second) = tls_pair(&dir);
    d.front.reload_tls(cfg.tls.as_ref().unwrap()).unwrap();
    assert_eq!(
        served_cert(d.addr, &second).await,
        Some(second.der().to_vec())
    );
    let res = open.send_request(get("/api/old")).await.unwrap();
    assert_eq!(
        res.status(),
        StatusCode::OK,
        "open connections are untouched"
    );

    // A broken key is refused, and the running pair kept.
    std::fs::write(&key, "not a key").unwrap();
    let e = d.front.reload_tls(cfg.tls.as_ref().unwrap()).unwrap_err();
    assert!(e.to_string().contains("tls.key"), "{e}");
    assert_eq!(
        served_cert(d.addr, &second).await,
        Some(second.der().to_vec())
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

// ---------------------------------------------------------------- connection limits

/// door with its instruments exported to memory, and a reader of a counter's value: `(name,
/// attribute value)`, the attribute value empty to add up every data point (a counter without
/// attributes, or all of its reasons).
async fn door_counting(
    cfg: &Config,
) -> (
    Door,
    impl Fn(&str, &str) -> u64 + use<>,
    opentelemetry_sdk::metrics::SdkMeterProvider,
) {
    door_counting_tls(cfg, None).await
}

/// [`door_counting`], terminating TLS with `tls` when given.
async fn door_counting_tls(
    cfg: &Config,
    tls: Option<Arc<rustls::ServerConfig>>,
) -> (
    Door,
    impl Fn(&str, &str) -> u64 + use<>,
    opentelemetry_sdk::metrics::SdkMeterProvider,
) {
    let (metrics, counted, provider) = support::counting_metrics();
    let clock: Arc<dyn Clock> = Arc::new(MonotonicClock::new());
    let app = Arc::new(App::new(cfg, &clock, &metrics, None));
    let front = Front::new(app, ConnSettings::from_config(cfg), tls);
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    front.serve(l, false);
    (Door { addr, front }, counted, provider)
}

/// Whether door closes `s` without answering (EOF, or a reset, before any byte).
async fn closed_unanswered(mut s: TcpStream) -> bool {
    let _ = s
        .write_all(b"GET /api/x HTTP/1.1\r\nHost: door.test\r\n\r\n")
        .await;
    let mut buf = [0u8; 64];
    matches!(s.read(&mut buf).await, Ok(0) | Err(_))
}

#[tokio::test]
async fn connections_past_the_per_client_limit_are_closed_at_accept_and_counted() {
    let up = upstream(echo()).await;
    let cfg = config(up, "max_connections_per_client = 2", "");
    let (d, refused, _provider) = door_counting(&cfg).await;
    let mut a = h1(d.addr).await;
    let b = h1(d.addr).await;
    assert_eq!(
        a.send_request(get("/api/a")).await.unwrap().status(),
        StatusCode::OK
    );
    let third = TcpStream::connect(d.addr).await.unwrap();
    assert!(
        closed_unanswered(third).await,
        "the third connection is refused"
    );
    assert_eq!(
        refused("door.connections_refused", "max_connections_per_client"),
        1
    );
    // One closes: a new connection is served.
    drop(b);
    let mut served = false;
    for _ in 0..100 {
        let s = TcpStream::connect(d.addr).await.unwrap();
        if !closed_unanswered(s).await {
            served = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(served, "a slot came back when a connection closed");
    assert_eq!(
        a.send_request(get("/api/a")).await.unwrap().status(),
        StatusCode::OK
    );
}

#[tokio::test]
async fn connections_past_max_connections_are_closed_at_accept_and_counted() {
    let up = upstream(echo()).await;
    let cfg = config(
        up,
        "max_connections = 2\nmax_connections_per_client = 100",
        "",
    );
    let (d, refused, _provider) = door_counting(&cfg).await;
    let _a = h1(d.addr).await;
    let mut b = h1(d.addr).await;
    assert_eq!(
        b.send_request(get("/api/b")).await.unwrap().status(),
        StatusCode::OK
    );
    let third = TcpStream::connect(d.addr).await.unwrap();
    assert!(closed_unanswered(third).await);
    assert_eq!(refused("door.connections_refused", "max_connections"), 1);
    assert_eq!(
        refused("door.connections_refused", "max_connections_per_client"),
        0
    );
}

/// door with `top` in front of an upstream that never answers `/pass/slow`, and a connection
/// from 127.0.0.1 whose request for it has reached the upstream (a pass-through request in
/// flight until the connection is dropped); with door's counters ([`door_counting`]).
async fn holding_a_pass_through_request(
    top: &str,
) -> (
    Door,
    TcpStream,
    impl Fn(&str, &str) -> u64 + use<>,
    opentelemetry_sdk::metrics::SdkMeterProvider,
) {
    let (open, closed) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let up = upstream(slow_upstream(Arc::clone(&open), closed)).await;
    let (d, counted, provider) = door_counting(&config(up, top, "")).await;
    let mut s = TcpStream::connect(d.addr).await.unwrap();
    s.write_all(b"GET /pass/slow HTTP/1.1\r\nHost: door.test\r\n\r\n")
        .await
        .unwrap();
    d.eventually("the slow call reached the upstream", |_| {
        open.load(Ordering::SeqCst) == 1
    })
    .await;
    (d, s, counted, provider)
}

/// Drops `held` (the request [`holding_a_pass_through_request`] made), waits for its slot to come
/// back, and checks that a pass-through request passes again.
async fn let_go_and_pass_again(d: &Door, held: TcpStream) {
    drop(held);
    d.eventually("the slot came back", |d| {
        d.app().passthrough_in_flight() == 0
    })
    .await;
    let res = h1(d.addr).await.send_request(get("/pass/x")).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
}

#[tokio::test]
async fn pass_through_requests_past_upstream_max_inflight_get_503_with_retry_after() {
    let (d, s, refused, _provider) =
        holding_a_pass_through_request("upstream_max_inflight = 1").await;
    assert_eq!(d.app().passthrough_in_flight(), 1);
    assert_eq!(refused("door.passthrough_inflight", ""), 1);
    let res = h1(d.addr).await.send_request(get("/pass/x")).await.unwrap();
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(res.headers()["retry-after"], "1");
    assert!(body_string(res).await.contains("upstream-busy"));
    assert_eq!(
        refused("door.passthrough_refused", "upstream_max_inflight"),
        1
    );
    assert_eq!(
        refused(
            "door.passthrough_refused",
            "upstream_max_inflight_per_client"
        ),
        0
    );
    // Limited routes are not counted against it.
    let res = h1(d.addr).await.send_request(get("/api/x")).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let_go_and_pass_again(&d, s).await;
    assert_eq!(refused("door.passthrough_inflight", ""), 0);
}

/// One client cannot hold every pass-through slot: past `upstream_max_inflight_per_client` its
/// requests get 429 while another client's still pass, and its slot comes back with its answer.
#[tokio::test]
async fn one_client_past_upstream_max_inflight_per_client_gets_429_and_others_still_pass() {
    let (d, s, refused, _provider) =
        holding_a_pass_through_request("upstream_max_inflight_per_client = 1").await;
    // Another connection of the same peer, 127.0.0.1.
    let res = h1(d.addr).await.send_request(get("/pass/x")).await.unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        refused(
            "door.passthrough_refused",
            "upstream_max_inflight_per_client"
        ),
        1
    );
    assert_eq!(res.headers()["retry-after"], "1");
    let body: serde_json::Value = serde_json::from_str(&body_string(res).await).unwrap();
    assert_eq!(body["code"], "upstream-busy");
    assert_eq!(body["details"]["scope"], "client");
    // Another peer (127.0.0.2, also loopback) is not held up.
    let other = tokio::net::TcpSocket::new_v4().unwrap();
    other.bind("127.0.0.2:0".parse().unwrap()).unwrap();
    let io = other.connect(d.addr).await.unwrap();
    let (mut c, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io))
        .await
        .unwrap();
    tokio::spawn(conn);
    let res = c.send_request(get("/pass/x")).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    body_string(res).await;
    let_go_and_pass_again(&d, s).await;
}

/// An upstream that answers a pass-through request before it has read the body, and reads on,
/// still has the request in hand: its slot is held until the body has been sent too, so a
/// client cannot pile up requests past `upstream_max_inflight_per_client` by keeping the bodies
/// of answered requests open (a hostile-input pass held 120 upstream connections so, against a
/// cap of 10).
#[tokio::test]
async fn a_pass_through_request_answered_before_its_body_ends_holds_its_slot_until_it_ends() {
    let got = Arc::new(Mutex::new(Vec::new()));
    let seen = Arc::clone(&got);
    // One connection: answers its request at once, then reads the body on, to 20 bytes.
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let up = l.local_addr().unwrap();
    tokio::spawn(async move {
        let (mut s, _) = l.accept().await.unwrap();
        let mut buf = vec![0u8; 4096];
        let mut request = Vec::new();
        let head_end = loop {
            let n = s.read(&mut buf).await.unwrap();
            request.extend_from_slice(buf.get(..n).unwrap());
            if let Some(i) = request.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
        };
        s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nearly")
            .await
            .unwrap();
        while request.len() - head_end < 20 {
            let n = s.read(&mut buf).await.unwrap();
            if n == 0 {
                break;
            }
            request.extend_from_slice(buf.get(..n).unwrap());
        }
        seen.lock().unwrap().push(request.len() - head_end);
        // Keeps the connection open until the test ends.
        let _ = s.read(&mut buf).await;
    });
    let d = door(&config(up, "upstream_max_inflight_per_client = 1", "")).await;
    let mut s = TcpStream::connect(d.addr).await.unwrap();
    s.write_all(
        b"POST /upload HTTP/1.1\r\nHost: door.test\r\nContent-Length: 20\r\n\r\n0123456789",
    )
    .await
    .unwrap();
    let mut answer = [0u8; 12];
    s.read_exact(&mut answer).await.unwrap();
    assert_eq!(&answer, b"HTTP/1.1 200", "answered before the body ended");
    // The answer is sent; the body is not: another request of the same client is over the cap.
    let res = h1(d.addr).await.send_request(get("/pass/x")).await.unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(d.app().passthrough_in_flight(), 1);
    s.write_all(b"0123456789").await.unwrap();
    d.eventually("the body's end gave the slot back", |d| {
        d.app().passthrough_in_flight() == 0
    })
    .await;
    d.eventually("the upstream read the body", |_| {
        !got.lock().unwrap().is_empty()
    })
    .await;
    assert_eq!(got.lock().unwrap().as_slice(), [20], "the whole body");
}

/// An upstream that answers a pass-through request early, then stops reading its body and
/// keeps the connection open (a misbehaving application) holds the request's slot only until
/// it has taken nothing for `upstream_timeout`: the body's share of the slot is let go then,
/// and the client passes again. Without this the slot stayed held for as long as the upstream
/// kept its connection.
#[tokio::test(start_paused = true)]
async fn an_upstream_that_answers_early_then_stops_reading_the_body_frees_the_slot() {
    let (d, mut rd, writer, held) = answered_early_then_unread(b"Content-Length: 5").await;
    let out = read_until(&mut rd, "early").await;
    assert!(
        out.starts_with(b"HTTP/1.1 200"),
        "answered before the body ended"
    );
    let answered = door_daemon::time::now();
    // The upstream might still read on: the slot is held, the client is over its cap.
    let res = h1(d.addr).await.send_request(get("/pass/x")).await.unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(d.app().passthrough_in_flight(), 1);
    // Still within `upstream_timeout` of the upstream's last read: still held.
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(d.app().passthrough_in_flight(), 1);
    d.eventually("the stalled body let its slot go", |d| {
        d.app().passthrough_in_flight() == 0
    })
    .await;
    assert!(
        answered.elapsed() < Duration::from_secs(6),
        "let go {:?} after the answer",
        answered.elapsed()
    );
    let res = h1(d.addr).await.send_request(get("/pass/x")).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    writer.abort();
    drop(held);
}

/// The same while the answer is still being sent: the body's stall ends only the body's hold on
/// the slot, and the answer keeps it until it ends.
#[tokio::test(start_paused = true)]
async fn an_answer_still_being_sent_keeps_the_slot_past_its_bodys_stall() {
    let (d, mut rd, writer, mut held) = answered_early_then_unread(b"Content-Length: 10").await;
    read_until(&mut rd, "early").await;
    // Twice `upstream_timeout`: the body's share is long gone, the answer's is not.
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(d.app().passthrough_in_flight(), 1);
    held.write_all(b"later").await.unwrap();
    read_until(&mut rd, "later").await;
    d.eventually("the answer's end gave the slot back", |d| {
        d.app().passthrough_in_flight() == 0
    })
    .await;
    writer.abort();
}

/// door (`upstream_timeout` 5 s, one pass-through request per client) in front of an upstream
/// whose first connection answers at once with `200 OK`, the header `length` and the body
/// `early`, then reads nothing more (later connections get a plain `200 ok`), and a client's
/// 64 MiB POST of `/upload` to it ([`big_post`]): door, the client's read half, its writing
/// task, and the upstream's end of the first connection.
async fn answered_early_then_unread(
    length: &'static [u8],
) -> (
    Door,
    tokio::net::tcp::OwnedReadHalf,
    tokio::task::JoinHandle<()>,
    TcpStream,
) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let up = l.local_addr().unwrap();
    let (held_tx, mut held_rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut first = true;
        loop {
            let (mut s, _) = l.accept().await.unwrap();
            let mut head = vec![0u8; 4096];
            let _ = s.read(&mut head).await;
            if first {
                first = false;
                let answer = [b"HTTP/1.1 200 OK\r\n", length, b"\r\n\r\nearly"].concat();
                s.write_all(&answer).await.unwrap();
                held_tx.send(s).unwrap();
            } else {
                s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                    .await
                    .unwrap();
            }
        }
    });
    let d = door(&config(
        up,
        "upstream_timeout = \"5s\"\nupstream_max_inflight_per_client = 1",
        "",
    ))
    .await;
    let (rd, writer) = big_post(d.addr, "/upload", Duration::ZERO).await;
    let held = held_rx.recv().await.unwrap();
    (d, rd, writer, held)
}

/// Behind a trusted proxy speaking PROXY protocol, the client it names, not the proxy, holds
/// the per-client pass-through cap: one client past it gets 429, another client through the same
/// proxy still passes.
#[tokio::test]
async fn behind_a_proxy_protocol_listener_the_named_client_holds_the_per_client_cap() {
    let (open, closed) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let up = upstream(slow_upstream(Arc::clone(&open), closed)).await;
    let top = "trusted_proxies = [\"127.0.0.1/32\"]\nupstream_max_inflight_per_client = 1";
    let d = door(&config(up, top, "")).await;
    let proxied = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = proxied.local_addr().unwrap();
    d.front.serve(proxied, true);
    let named = |client: &str, path: &str| {
        format!(
            "PROXY TCP4 {client} 192.0.2.1 40000 8443\r\n\
             GET {path} HTTP/1.1\r\nHost: door.test\r\nConnection: close\r\n\r\n"
        )
    };
    let mut held = TcpStream::connect(addr).await.unwrap();
    held.write_all(named("203.0.113.9", "/pass/slow").as_bytes())
        .await
        .unwrap();
    d.eventually("the slow call reached the upstream", |_| {
        open.load(Ordering::SeqCst) == 1
    })
    .await;
    let out = raw(addr, named("203.0.113.9", "/pass/x").as_bytes()).await;
    assert!(out.starts_with("HTTP/1.1 429"), "{out}");
    let out = raw(addr, named("203.0.113.10", "/pass/x").as_bytes()).await;
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    drop(held);
}

/// Behind a trusted proxy that names its clients in `X-Forwarded-For` (all of them on the
/// proxy's connections), the client it names holds the per-client pass-through cap: one client
/// past it gets 429 while another client, and the proxy's own requests (naming nobody), still
/// pass; the client's place comes back with its answer, and no count is kept once it has none.
#[tokio::test]
async fn behind_a_trusted_proxy_the_client_its_header_names_holds_the_per_client_cap() {
    let (open, closed) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let up = upstream(slow_upstream(Arc::clone(&open), closed)).await;
    let top = "trusted_proxies = [\"127.0.0.1/32\"]\nupstream_max_inflight_per_client = 1";
    let d = door(&config(up, top, "")).await;
    let from = |client: Option<&str>, path: &str| {
        let xff = client.map_or(String::new(), |c| format!("X-Forwarded-For: {c}\r\n"));
        format!("GET {path} HTTP/1.1\r\nHost: door.test\r\n{xff}Connection: close\r\n\r\n")
    };
    let mut held = TcpStream::connect(d.addr).await.unwrap();
    held.write_all(from(Some("203.0.113.9"), "/pass/slow").as_bytes())
        .await
        .unwrap();
    d.eventually("the slow call reached the upstream", |_| {
        open.load(Ordering::SeqCst) == 1
    })
    .await;
    assert_eq!(d.app().passthrough_named_clients(), 1);
    let out = raw(d.addr, from(Some("203.0.113.9"), "/pass/x").as_bytes()).await;
    assert!(out.starts_with("HTTP/1.1 429"), "{out}");
    assert!(out.contains("upstream-busy"), "{out}");
    // Its /32 is the key: another client, and the proxy itself, pass.
    let out = raw(d.addr, from(Some("203.0.113.10"), "/pass/x").as_bytes()).await;
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    let out = raw(d.addr, from(None, "/pass/x").as_bytes()).await;
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    drop(held);
    d.eventually("the held request's place came back", |d| {
        d.app().passthrough_in_flight() == 0 && d.app().passthrough_named_clients() == 0
    })
    .await;
    let out = raw(d.addr, from(Some("203.0.113.9"), "/pass/x").as_bytes()).await;
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    assert_eq!(d.app().passthrough_named_clients(), 0);
}

/// `max_connections_per_client` holds for a client a PROXY header names, as for a direct one:
/// its connection past the cap is closed once the header is read; another client's is served.
#[tokio::test]
async fn behind_a_proxy_protocol_listener_the_named_client_holds_the_connection_cap() {
    let up = upstream(echo()).await;
    let top = "trusted_proxies = [\"127.0.0.1/32\"]\nmax_connections_per_client = 1";
    let d = door(&config(up, top, "")).await;
    let proxied = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = proxied.local_addr().unwrap();
    d.front.serve(proxied, true);
    let header = |client: &str| format!("PROXY TCP4 {client} 192.0.2.1 40000 8443\r\n");
    let request = |client: &str| {
        format!(
            "{}GET /pass/x HTTP/1.1\r\nHost: door.test\r\nConnection: close\r\n\r\n",
            header(client)
        )
    };
    // 203.0.113.9's one connection, open and idle after its header and one request.
    let mut held = TcpStream::connect(addr).await.unwrap();
    held.write_all(
        format!(
            "{}GET /pass/x HTTP/1.1\r\nHost: door.test\r\n\r\n",
            header("203.0.113.9")
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    let mut first = [0u8; 12];
    held.read_exact(&mut first).await.unwrap();
    assert_eq!(&first, b"HTTP/1.1 200");
    let out = raw(addr, request("203.0.113.9").as_bytes()).await;
    assert_eq!(out, "", "closed without an answer");
    let out = raw(addr, request("203.0.113.10").as_bytes()).await;
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    drop(held);
}

/// A trusted proxy whose PROXY header names no client (v1 `UNKNOWN`, v2 `LOCAL`: a health check,
/// or a frontend on a Unix socket relaying whoever connects) leaves the proxy as the peer, and the
/// `X-Forwarded-For` on that connection, which the proxy relays unchecked, is not believed: a
/// client there cannot pick an allowed address or another client's key.
#[tokio::test]
async fn a_proxy_protocol_header_naming_no_client_leaves_forwarding_fields_unbelieved() {
    // Echoes the X-Forwarded-For the upstream received.
    let xff_echo: Handler = Arc::new(|req: Request<Incoming>| {
        Box::pin(async move {
            let xff = req
                .headers()
                .get("x-forwarded-for")
                .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
                .unwrap_or_default();
            Response::new(full(format!("xff={xff}")))
        })
    });
    let up = upstream(xff_echo).await;
    let top = "trusted_proxies = [\"127.0.0.1/32\"]\nallow = [\"198.51.100.0/24\"]";
    let d = door(&config(up, top, "[group.link]\nrate = 0.001\nburst = 1")).await;
    let proxied = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = proxied.local_addr().unwrap();
    d.front.serve(proxied, true);
    let request = |header: &str, xff: &str| {
        format!(
            "{header}GET /l/session/x HTTP/1.1\r\nHost: door.test\r\n\
             X-Forwarded-For: {xff}\r\nConnection: close\r\n\r\n"
        )
    };
    let status = async |header: &str, xff: &str| {
        let out = raw(addr, request(header, xff).as_bytes()).await;
        out.get(9..12).unwrap_or_default().to_owned()
    };
    let unknown = "PROXY UNKNOWN\r\n";
    // Keyed as the proxy: its burst of 1, whatever address the client wrote; the upstream is
    // told the proxy's address alone, not the client's chain.
    let out = raw(addr, request(unknown, "198.51.100.7").as_bytes()).await;
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    assert!(out.ends_with("xff=127.0.0.1"), "{out}");
    assert_eq!(status(unknown, "198.51.100.7").await, "429", "not allowed");
    assert_eq!(status(unknown, "203.0.113.5").await, "429", "the same key");
    // A header that names the client still lets its proxy chain speak.
    let named = "PROXY TCP4 127.0.0.1 192.0.2.1 40000 8443\r\n";
    for _ in 0..3 {
        assert_eq!(status(named, "198.51.100.7").await, "200", "allowed");
    }
}

// ---------------------------------------------------------------- allow and deny

#[tokio::test]
async fn denied_clients_get_403_before_any_bucket_and_allowed_ones_are_never_limited() {
    let up = upstream(echo()).await;
    let lists = "trusted_proxies = [\"127.0.0.1/32\"]\nallow = [\"198.51.100.0/24\"]\n\
                 deny = [\"203.0.113.0/24\", \"198.51.100.66/32\"]";
    let cfg = config(up, lists, "");
    let (d, counted, _provider) = door_counting(&cfg).await;
    let mut c = h1(d.addr).await;
    // Denied (by the client key behind the trusted proxy): 403, and no bucket is touched.
    for _ in 0..30 {
        let res = c.send_request(from("203.0.113.9")).await.unwrap();
        assert_eq!(res.status(), StatusCode::FORBIDDEN);
        assert!(body_string(res).await.contains("\"forbidden\""));
    }
    // A /32 deny inside an allowed /24: denied wins.
    let res = c.send_request(from("198.51.100.66")).await.unwrap();
    assert_eq!(res.status(), StatusCode::FORBIDDEN);
    // A NAT64 client (RFC 6052) is keyed, and listed, under the IPv4 address it embeds.
    let res = c.send_request(from("64:ff9b::cb00:7109")).await.unwrap();
    assert_eq!(res.status(), StatusCode::FORBIDDEN);
    assert_eq!(d.count("link", Outcome::Ok), 0, "no bucket was charged");
    // Allowed: far past link's burst of 20, never limited, and no RateLimit fields.
    for i in 0..40 {
        let res = c.send_request(from("198.51.100.7")).await.unwrap();
        assert_eq!(res.status(), StatusCode::OK, "request {i}");
        assert!(res.headers().get("ratelimit").is_none());
    }
    assert_eq!(counted("door.denied", ""), 32);
    assert_eq!(counted("door.allowed", ""), 40);
    // Anyone else is limited as before.
    let mut last = StatusCode::OK;
    for _ in 0..21 {
        last = c.send_request(from("192.0.2.77")).await.unwrap().status();
    }
    assert_eq!(last, StatusCode::TOO_MANY_REQUESTS);
    // The lists reload: the denied network's client is let in, with a full bucket.
    let open = config(up, "trusted_proxies = [\"127.0.0.1/32\"]", "");
    assert!(d.app().reload(&open, &cfg).is_empty());
    let res = c.send_request(from("203.0.113.9")).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(res.headers()["ratelimit"], "\"link\";r=19;t=1");
}

/// `allow` and `deny` written after `[xdp]`, as the shape in docs/design.md writes them, are to
/// TOML `xdp.allow` and `xdp.deny`: they are the same lists as the top-level ones, and act at
/// layer 7 too (never limited; 403), as their comments in the sample say.
#[tokio::test]
async fn allow_and_deny_written_in_the_xdp_table_act_at_layer_7_too() {
    let up = upstream(echo()).await;
    let top = "trusted_proxies = [\"127.0.0.1/32\"]";
    let xdp = "[xdp]\nmode = \"off\"\nallow = [\"192.0.2.0/24\"]\ndeny = [\"203.0.113.0/24\"]";
    let d = door(&config(up, top, xdp)).await;
    let mut c = h1(d.addr).await;
    let res = c.send_request(from("203.0.113.9")).await.unwrap();
    assert_eq!(res.status(), StatusCode::FORBIDDEN);
    for i in 0..30 {
        let res = c.send_request(from("192.0.2.7")).await.unwrap();
        assert_eq!(
            res.status(),
            StatusCode::OK,
            "request {i}: past link's burst of 20"
        );
    }
}

/// A `GET` of `/l/session/x` from `client`, named by `X-Forwarded-For` (through a trusted proxy
/// on loopback, in the tests that trust one).
fn from(client: &'static str) -> Request<UBody> {
    Request::get("/l/session/x")
        .header("host", "door.test")
        .header("x-forwarded-for", client)
        .body(Empty::new().boxed())
        .unwrap()
}

/// An upstream that answers every request head it reads with `answer`, on one connection after
/// another.
async fn scripted_upstream(answer: &'static [u8]) -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut byte = [0u8; 1];
                loop {
                    match s.read(&mut byte).await {
                        Ok(1) => head.push(byte[0]),
                        _ => return,
                    }
                    if head.ends_with(b"\r\n\r\n") {
                        head.clear();
                        if s.write_all(answer).await.is_err() {
                            return;
                        }
                    }
                }
            });
        }
    });
    addr
}

#[tokio::test]
async fn an_upstream_answer_with_content_length_and_transfer_encoding_is_framed_by_the_latter() {
    // RFC 9112 §6.3: Transfer-Encoding overrides Content-Length, and a proxy forwarding such a
    // message must remove Content-Length first; kept, door framed its answer by the wrong one
    // (the client got "hel" of "hello" over HTTP/1.1, a reset over HTTP/2).
    let up = scripted_upstream(
        b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n\
          5\r\nhello\r\n0\r\n\r\n",
    )
    .await;
    let d = door(&config(up, "", "")).await;
    let mut send = h1(d.addr).await;
    let res = send.send_request(get("/p")).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert!(res.headers().get("content-length").is_none(), "{res:?}");
    assert_eq!(body_string(res).await, "hello");
    let s = TcpStream::connect(d.addr).await.unwrap();
    let (c, conn) = h2::client::handshake(s).await.unwrap();
    tokio::spawn(conn);
    let (status, body) = h2_send(&c, Request::get("http://door.test/p").body(()).unwrap()).await;
    assert_eq!((status, body.as_str()), (StatusCode::OK, "hello"));
}

/// Spellings of a limited route that applications route as it, at the request level: a target
/// that begins with `//host` (a URL parser's authority), and a `POST` naming the route's method in
/// `X-HTTP-Method-Override` or in its query's `_method`, are charged to the route's group, not
/// passed through.
#[tokio::test]
async fn a_network_path_and_a_method_override_are_charged_to_the_route() {
    let up = upstream(echo()).await;
    let d = door(&config(up, "", "[group.link]\nrate = 0.001\nburst = 1")).await;
    let status = async |request: &str| {
        let text = raw(d.addr, request.as_bytes()).await;
        text.get(9..12).unwrap_or_default().to_owned()
    };
    let close = "Host: door.test\r\nConnection: close\r\n";
    assert_eq!(
        status(&format!("GET /l/session/a HTTP/1.1\r\n{close}\r\n")).await,
        "200"
    );
    assert_eq!(
        status(&format!("GET //x/l/session/a HTTP/1.1\r\n{close}\r\n")).await,
        "429",
        "a network-path spelling is the route's"
    );
    assert_eq!(
        status(&format!(
            "POST /l/session/a HTTP/1.1\r\n{close}X-HTTP-Method-Override: GET\r\n\
             Content-Length: 0\r\n\r\n"
        ))
        .await,
        "429",
        "a POST that says it is a GET is the GET route's"
    );
    assert_eq!(
        status(&format!(
            "POST /l/session/a?x=1&_method=GET HTTP/1.1\r\n{close}Content-Length: 0\r\n\r\n"
        ))
        .await,
        "429",
        "a POST that says so in its query's _method is the GET route's"
    );
    assert_eq!(
        status(&format!(
            "POST /l/session/a HTTP/1.1\r\n{close}Content-Length: 0\r\n\r\n"
        ))
        .await,
        "200",
        "a plain POST is no GET route's"
    );
}
