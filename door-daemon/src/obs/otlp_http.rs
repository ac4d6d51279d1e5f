//! The OTLP exporter's HTTP client: reqwest's blocking client, as `opentelemetry-otlp` builds it
//! (its timeout from `OTEL_EXPORTER_OTLP_METRICS_TIMEOUT` or `OTEL_EXPORTER_OTLP_TIMEOUT`, in
//! milliseconds, else 10 s; TLS through rustls with the system's roots), with two bounds of its
//! own. An answer's body is read up to [`MAX_ANSWER_BYTES`]: the SDK's own client reads any `2xx`
//! body whole into memory, so a collector (or anything on the path to an `http://` endpoint) that
//! answered with gigabytes would grow door by as much until the timeout. And redirects are not
//! followed: a collector's `3xx` fails the export, rather than sending its body and
//! `OTEL_EXPORTER_OTLP_HEADERS` (often a credential) to whatever host the answer names.

use std::{io::Read as _, time::Duration};

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
pub struct BoundedClient(reqwest::blocking::Client);

/// An answer whose body is longer than [`MAX_ANSWER_BYTES`].
#[derive(Debug, thiserror::Error)]
#[error("the collector's answer is longer than {MAX_ANSWER_BYTES} bytes: not read")]
pub struct AnswerTooLong;

impl BoundedClient {
    /// A client whose requests time out after `timeout` (the whole exchange: connecting, sending,
    /// reading the answer).
    ///
    /// Built on a thread of its own: reqwest's blocking client starts (and, dropped, stops) an
    /// internal runtime, which must not happen on a thread already running tokio. Falls back to
    /// reqwest's defaults (no timeout, redirects followed) only if the TLS backend cannot be set
    /// up, as the SDK's own client does.
    pub fn new(timeout: Duration) -> Self {
        let build = move || {
            reqwest::blocking::Client::builder()
                .timeout(timeout)
                .redirect(reqwest::redirect::Policy::none())
                .build()
                .unwrap_or_else(|_| reqwest::blocking::Client::new())
        };
        let client = std::thread::spawn(build)
            .join()
            .unwrap_or_else(|_| reqwest::blocking::Client::new());
        Self(client)
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

#[async_trait::async_trait]
impl HttpClient for BoundedClient {
    /// Sends `request` and reads the answer, its body at most [`MAX_ANSWER_BYTES`].
    ///
    /// # Errors
    /// reqwest's error when the request cannot be sent or the answer read (a refused connection,
    /// the timeout), or its status is an error (`4xx`, `5xx`: the body is not read);
    /// [`AnswerTooLong`] when the body is longer than the bound.
    async fn send_bytes(&self, request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        let mut answer = self.0.execute(request.try_into()?)?.error_for_status()?;
        let status = answer.status();
        let headers = std::mem::take(answer.headers_mut());
        let mut body = Vec::new();
        answer.take(MAX_ANSWER_BYTES + 1).read_to_end(&mut body)?;
        if body.len() as u64 > MAX_ANSWER_BYTES {
            return Err(Box::new(AnswerTooLong));
        }
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
        let response = export(&BoundedClient::new(Duration::from_secs(10)), &to).unwrap();
        assert_eq!(response.status(), 200);
        assert_eq!(response.body().len(), 5);
        assert!(response.headers().contains_key("content-type"));
        collector.join().unwrap();
    }

    #[test]
    fn an_answer_longer_than_the_bound_is_refused_without_being_read() {
        // A gibibyte announced; the client stops after the bound, so the collector's writes stop
        // once the socket buffers are full, far short of it.
        let gib = 1 << 30;
        let (to, collector) = collector(
            format!("HTTP/1.1 200 OK\r\ncontent-length: {gib}\r\n\r\n"),
            gib,
        );
        let err = export(&BoundedClient::new(Duration::from_secs(10)), &to).unwrap_err();
        assert!(err.is::<AnswerTooLong>(), "{err}");
        let written = collector.join().unwrap();
        assert!(written < 64 << 20, "the collector wrote {written} bytes");
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
                "HTTP/1.1 307 Temporary Redirect\r\nlocation: {target}\r\ncontent-length: 0\r\n\r\n"
            ),
            0,
        );
        let response = export(&BoundedClient::new(Duration::from_secs(10)), &to).unwrap();
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
