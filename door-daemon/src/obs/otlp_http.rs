//! The OTLP exporter's HTTP client: reqwest's blocking client, as `opentelemetry-otlp` builds it
//! (its timeout from `OTEL_EXPORTER_OTLP_METRICS_TIMEOUT` or `OTEL_EXPORTER_OTLP_TIMEOUT`, in
//! milliseconds, else 10 s; TLS through rustls with the system's roots), with two bounds of its
//! own. An answer's body is read up to [`MAX_ANSWER_BYTES`]: the SDK's own client reads any `2xx`
//! body whole into memory, so a collector (or anything on the path to an `http://` endpoint) that
//! answered with gigabytes would grow door by as much until the timeout. And redirects are not
//! followed: a collector's `3xx` fails the export, rather than sending its body and
//! `OTEL_EXPORTER_OTLP_HEADERS` (often a credential) to whatever host the answer names. The
//! timeout bounds the whole exchange, the body's reading included, where reqwest's blocking
//! client bounds each read on its own.

use std::{io::Read, time::Duration};

use opentelemetry_http::{Bytes, HttpClient, HttpError, Request, Response};

/// The most of an answer's body door reads, bytes: an OTLP/HTTP answer is an
/// `ExportMetricsServiceResponse`, a few bytes unless it lists rejected points.
pub const MAX_ANSWER_BYTES: u64 = 64 * 1024;

/// An export's timeout when no variable sets one (the OTLP specification's default).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// The variables that set an export's timeout, in milliseconds, the first set and valid winning
/// (the OTLP exporter specification, "Configuration Options").
pub const TIMEOUT_VARS: [&str; 2] = [
    "OTEL_EXPORTER_OTLP_METRICS_TIMEOUT",
    "OTEL_EXPORTER_OTLP_TIMEOUT",
];

/// The exporter's client (see the module docs).
#[derive(Debug, Clone)]
pub struct BoundedClient {
    client: reqwest::blocking::Client,
    /// The whole exchange's bound: reqwest's blocking client bounds each read of the body on
    /// its own, so a collector dripping a byte at a time would never meet it.
    timeout: Duration,
}

/// Why an answer was not taken.
#[derive(Debug, thiserror::Error)]
pub enum AnswerError {
    /// The body is longer than [`MAX_ANSWER_BYTES`] (announced, or as read).
    #[error("the collector's answer is longer than {MAX_ANSWER_BYTES} bytes: not read")]
    TooLong,
    /// The body did not arrive within the export's timeout, counted from the request's start.
    #[error("the collector's answer did not arrive within {0:?}")]
    Late(Duration),
}

/// The client could not be built: TLS could not be set up (no usable system roots, say), or the
/// thread it is built on failed.
#[derive(Debug, thiserror::Error)]
#[error("cannot build the OTLP exporter's HTTP client: {0}")]
pub struct ClientError(String);

impl BoundedClient {
    /// A client whose exports time out `timeout` after they start: connecting, sending and
    /// reading the answer, together (a read already under way may take up to `timeout` more).
    ///
    /// Built on a thread of its own: reqwest's blocking client starts (and, dropped, stops) an
    /// internal runtime, which must not happen on a thread already running tokio.
    ///
    /// # Errors
    /// [`ClientError`] when reqwest cannot build the client.
    pub fn new(timeout: Duration) -> Result<Self, ClientError> {
        let build = move || {
            reqwest::blocking::Client::builder()
                .timeout(timeout)
                .redirect(reqwest::redirect::Policy::none())
                .build()
                .map_err(|e| ClientError(e.to_string()))
        };
        let client = std::thread::spawn(build)
            .join()
            .map_err(|_| ClientError("the thread building it panicked".to_owned()))??;
        Ok(Self { client, timeout })
    }

    /// The timeout the environment sets ([`TIMEOUT_VARS`]), else [`DEFAULT_TIMEOUT`].
    pub fn timeout_from_env() -> Duration {
        timeout_from(|name| std::env::var(name).ok())
    }
}

/// The timeout of the first of [`TIMEOUT_VARS`] that `var` has as a whole number of
/// milliseconds, else [`DEFAULT_TIMEOUT`].
fn timeout_from(var: impl Fn(&str) -> Option<String>) -> Duration {
    TIMEOUT_VARS
        .iter()
        .find_map(|name| var(name)?.trim().parse().ok())
        .map_or(DEFAULT_TIMEOUT, Duration::from_millis)
}

/// Reads `body` to its end, at most [`MAX_ANSWER_BYTES`], checking `late` after each read.
///
/// # Errors
/// [`AnswerError::TooLong`] past the bound, [`AnswerError::Late`] (with `timeout`) once `late`
/// says so, and the reader's own errors.
fn read_bounded(
    body: &mut impl Read,
    mut late: impl FnMut() -> bool,
    timeout: Duration,
) -> Result<Vec<u8>, HttpError> {
    let mut out = Vec::new();
    let mut chunk = [0u8; 8 * 1024];
    loop {
        let n = body.read(&mut chunk)?;
        if n == 0 {
            return Ok(out);
        }
        out.extend_from_slice(chunk.get(..n).unwrap_or_default());
        if out.len() as u64 > MAX_ANSWER_BYTES {
            return Err(Box::new(AnswerError::TooLong));
        }
        if late() {
            return Err(Box::new(AnswerError::Late(timeout)));
        }
    }
}

#[async_trait::async_trait]
impl HttpClient for BoundedClient {
    /// Sends `request` and reads the answer: a `2xx` answer's body, at most
    /// [`MAX_ANSWER_BYTES`]; any other answer (a `3xx`, not followed) with an empty body, so that
    /// what a collector writes there never reaches door's log through the SDK's error.
    ///
    /// # Errors
    /// reqwest's error when the request cannot be sent or the answer's head read (a refused
    /// connection, the timeout), or its status is an error (`4xx`, `5xx`: the body is not read);
    /// [`AnswerError`] when the body is longer than the bound (its `Content-Length` says so, or
    /// its bytes do) or not all there by the timeout.
    async fn send_bytes(&self, request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        let started = crate::time::now();
        let mut answer = self
            .client
            .execute(request.try_into()?)?
            .error_for_status()?;
        let status = answer.status();
        let headers = std::mem::take(answer.headers_mut());
        let body = if !status.is_success() {
            Vec::new()
        } else if answer.content_length().unwrap_or(0) > MAX_ANSWER_BYTES {
            return Err(Box::new(AnswerError::TooLong));
        } else {
            let timeout = self.timeout;
            read_bounded(
                &mut answer,
                || crate::time::now().saturating_duration_since(started) > timeout,
                timeout,
            )?
        };
        let mut response = Response::builder().status(status).body(Bytes::from(body))?;
        *response.headers_mut() = headers;
        Ok(response)
    }
}

#[cfg(test)]
mod tests {
    use std::{
        io::{Read as _, Write as _},
        net::TcpListener,
        thread,
    };

    use super::*;

    /// A collector on loopback that reads one request and answers with `head`, then writes
    /// `body_bytes` zeros (in 64 KiB writes, until the client stops reading); returns its
    /// address and a handle that yields how many body bytes it got written.
    fn collector(head: String, body_bytes: u64) -> (String, thread::JoinHandle<u64>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = format!("http://{}/v1/metrics", listener.local_addr().unwrap());
        let handle = thread::spawn(move || {
            let (mut conn, _) = listener.accept().unwrap();
            let mut request = [0u8; 4096];
            let _ = conn.read(&mut request);
            conn.write_all(head.as_bytes()).unwrap();
            let chunk = vec![0u8; 64 * 1024];
            let mut written = 0;
            while written < body_bytes {
                match conn.write(&chunk) {
                    Ok(n) if n > 0 => written += n as u64,
                    _ => break,
                }
            }
            written
        });
        (addr, handle)
    }

    fn export(client: &BoundedClient, to: &str) -> Result<Response<Bytes>, HttpError> {
        let request = Request::post(to)
            .header("content-type", "application/x-protobuf")
            .body(Bytes::from_static(b"\x0a\x00"))
            .unwrap();
        futures_util::FutureExt::now_or_never(client.send_bytes(request))
            .expect("the blocking client completes within the call")
    }

    #[test]
    fn a_short_answer_is_read_whole() {
        let (to, collector) = collector(
            "HTTP/1.1 200 OK\r\ncontent-type: application/x-protobuf\r\ncontent-length: 5\r\n\r\n"
                .to_owned(),
            5,
        );
        let response = export(&BoundedClient::new(Duration::from_secs(10)).unwrap(), &to).unwrap();
        assert_eq!(response.status(), 200);
        assert_eq!(response.body().len(), 5);
        assert!(response.headers().contains_key("content-type"));
        collector.join().unwrap();
    }

    #[test]
    fn an_answer_longer_than_the_bound_is_refused_without_being_read() {
        // A gibibyte with no length announced (the end of the connection ends it): the client
        // stops after the bound, so the collector's writes stop once the socket buffers are
        // full, far short of it.
        let gib = 1 << 30;
        let (to, peer) = collector(
            "HTTP/1.1 200 OK\r\nconnection: close\r\n\r\n".to_owned(),
            gib,
        );
        let client = BoundedClient::new(Duration::from_secs(10)).unwrap();
        let err = export(&client, &to).unwrap_err();
        assert!(
            matches!(err.downcast_ref(), Some(AnswerError::TooLong)),
            "{err}"
        );
        let written = peer.join().unwrap();
        assert!(written < 64 << 20, "the collector wrote {written} bytes");
        // Announced: refused before a byte of the body is read.
        let (to, peer) = collector(
            format!("HTTP/1.1 200 OK\r\ncontent-length: {gib}\r\n\r\n"),
            0,
        );
        let err = export(&client, &to).unwrap_err();
        assert!(
            matches!(err.downcast_ref(), Some(AnswerError::TooLong)),
            "{err}"
        );
        peer.join().unwrap();
    }

    /// A collector dripping its answer: one byte a read, without end.
    struct Dripping;

    impl Read for Dripping {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            Ok(buf.first_mut().map_or(0, |b| {
                *b = b'x';
                1
            }))
        }
    }

    /// Each read is quick, and the clock moves a second a read: late at the first read past
    /// the timeout, where a bound on each read alone would go on to the size bound.
    #[test]
    fn an_answer_dripped_past_the_timeout_is_late_although_each_read_is_quick() {
        let timeout = Duration::from_secs(10);
        let mut reads = 0u64;
        let err = read_bounded(
            &mut Dripping,
            || {
                reads += 1;
                Duration::from_secs(reads) > timeout
            },
            timeout,
        )
        .unwrap_err();
        assert!(
            matches!(err.downcast_ref(), Some(AnswerError::Late(t)) if *t == timeout),
            "{err}"
        );
        assert_eq!(reads, 11);
        // Within the timeout, a whole short body is read.
        let body = read_bounded(&mut std::io::repeat(b'x').take(1_000), || false, timeout).unwrap();
        assert_eq!(body.len(), 1_000);
    }

    #[test]
    fn a_redirect_is_not_followed() {
        let (target, never) = {
            let listener = TcpListener::bind("127.0.0.1:0").unwrap();
            let addr = listener.local_addr().unwrap();
            listener.set_nonblocking(true).unwrap();
            (format!("http://{addr}/v1/metrics"), listener)
        };
        let (to, collector) = collector(
            format!(
                "HTTP/1.1 307 Temporary Redirect\r\nlocation: {target}\r\ncontent-length: 11\r\n\r\n"
            ),
            11,
        );
        let response = export(&BoundedClient::new(Duration::from_secs(10)).unwrap(), &to).unwrap();
        assert_eq!(
            response.status(),
            307,
            "the exporter sees the 3xx and fails the export"
        );
        assert!(
            never.accept().is_err(),
            "nothing connected to the redirect's target"
        );
        collector.join().unwrap();
    }

    #[test]
    fn the_timeout_is_the_first_valid_variable_or_the_default() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |name: &str| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == name)
                    .map(|(_, v)| (*v).to_owned())
            }
        };
        assert_eq!(timeout_from(env(&[])), DEFAULT_TIMEOUT);
        assert_eq!(
            timeout_from(env(&[("OTEL_EXPORTER_OTLP_TIMEOUT", "2500")])),
            Duration::from_millis(2500)
        );
        assert_eq!(
            timeout_from(env(&[
                ("OTEL_EXPORTER_OTLP_TIMEOUT", "2500"),
                ("OTEL_EXPORTER_OTLP_METRICS_TIMEOUT", "700"),
            ])),
            Duration::from_millis(700),
            "the metrics signal's own variable first"
        );
        assert_eq!(
            timeout_from(env(&[("OTEL_EXPORTER_OTLP_METRICS_TIMEOUT", "soon")])),
            DEFAULT_TIMEOUT
        );
    }
}
