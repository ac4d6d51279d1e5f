//! The admin API client of `door top`: `GET` a path on a TCP address or a Unix socket, JSON back.

use std::{path::PathBuf, time::Duration};

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body::Body as _;
use http_body_util::{BodyExt as _, Empty, LengthLimitError, Limited};
use hyper_util::rt::TokioIo;
use serde_json::Value;
use tokio::net::{TcpStream, UnixStream};

use super::{TopError, model::printable};

/// How long one admin request may take: the connection, the answer's head and body, and reading
/// its JSON.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(3);

/// The largest answer body `door top` reads, in bytes (8 MiB: `GET /clients?top=50` on a
/// door with many groups is a few hundred KiB).
pub const MAX_BODY: usize = 8 << 20;

/// How many characters of a non-200 answer's body an error quotes.
pub const ERROR_BODY_CHARS: usize = 200;

/// Where the admin listener is: `host:port` or `unix:/path`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AdminAddr {
    /// A TCP `host:port` (a name is resolved at each connection).
    Tcp(String),
    /// A Unix socket.
    Unix(PathBuf),
}

impl AdminAddr {
    /// Parses `host:port`, `[v6]:port` or `unix:/path`; a TCP address may also be written as the
    /// URL door logs for its admin listener (`http://127.0.0.1:9901`, with or without a final
    /// `/`).
    ///
    /// # Errors
    /// [`TopError::Address`] naming the input when it is none of these.
    pub fn parse(raw: &str) -> Result<Self, TopError> {
        if let Some(path) = raw.strip_prefix("unix:") {
            if path.is_empty() {
                return Err(TopError::Address(raw.to_owned()));
            }
            return Ok(Self::Unix(PathBuf::from(path)));
        }
        let authority = raw
            .strip_prefix("http://")
            .map_or(raw, |rest| rest.strip_suffix('/').unwrap_or(rest));
        // host:port, with a port that is a number.
        match authority.rsplit_once(':') {
            Some((host, port))
                if !host.is_empty() && !host.contains('/') && port.parse::<u16>().is_ok() =>
            {
                Ok(Self::Tcp(authority.to_owned()))
            }
            _ => Err(TopError::Address(raw.to_owned())),
        }
    }
}

impl std::fmt::Display for AdminAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Tcp(a) => f.write_str(a),
            Self::Unix(p) => write!(f, "unix:{}", p.display()),
        }
    }
}

/// `GET path` on `addr` (HTTP/1.1, a fresh connection), its JSON body, all within
/// [`REQUEST_TIMEOUT`].
///
/// # Errors
/// [`TopError::Connect`] when nothing answers, [`TopError::Http`] for a broken exchange or a
/// timeout, [`TopError::TooLarge`] for a body over [`MAX_BODY`], [`TopError::Status`] for a
/// non-200 answer (quoting at most [`ERROR_BODY_CHARS`] of its body, control characters
/// escaped), [`TopError::Json`] for a body that is not JSON.
pub async fn get_json(addr: &AdminAddr, path: &str) -> Result<Value, TopError> {
    let exchange = async {
        let (status, body) = match addr {
            AdminAddr::Tcp(a) => {
                let s = TcpStream::connect(a.as_str())
                    .await
                    .map_err(|e| TopError::Connect(addr.to_string(), e))?;
                get(s, path).await?
            }
            AdminAddr::Unix(p) => {
                let s = UnixStream::connect(p)
                    .await
                    .map_err(|e| TopError::Connect(addr.to_string(), e))?;
                get(s, path).await?
            }
        };
        if status != StatusCode::OK {
            return Err(TopError::Status(
                path.to_owned(),
                status.as_u16(),
                excerpt(&String::from_utf8_lossy(&body)),
            ));
        }
        serde_json::from_slice(&body).map_err(|e| TopError::Json(path.to_owned(), e))
    };
    tokio::time::timeout(REQUEST_TIMEOUT, exchange)
        .await
        .unwrap_or_else(|_| Err(TopError::Http(path.to_owned(), "timed out".to_owned())))
}

/// The first [`ERROR_BODY_CHARS`] characters of `body`, trimmed, control characters escaped,
/// with `…` when cut.
fn excerpt(body: &str) -> String {
    let body = body.trim();
    let mut out: String = body.chars().take(ERROR_BODY_CHARS).collect();
    if out.len() < body.len() {
        out.push('…');
    }
    printable(&out).into_owned()
}

async fn get<S>(stream: S, path: &str) -> Result<(StatusCode, Bytes), TopError>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let http = |e: hyper::Error| TopError::Http(path.to_owned(), e.to_string());
    let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(http)?;
    tokio::spawn(conn);
    let req = Request::get(path)
        .header(http::header::HOST, "door-admin")
        .body(Empty::<Bytes>::new())
        .map_err(|e| TopError::Http(path.to_owned(), e.to_string()))?;
    let res = send.send_request(req).await.map_err(http)?;
    let status = res.status();
    let too_large = || TopError::TooLarge(path.to_owned(), MAX_BODY);
    // An announced length past the limit fails at once, without reading.
    if res.body().size_hint().lower() > MAX_BODY as u64 {
        return Err(too_large());
    }
    let body = match Limited::new(res.into_body(), MAX_BODY).collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) if e.is::<LengthLimitError>() => return Err(too_large()),
        Err(e) => return Err(TopError::Http(path.to_owned(), e.to_string())),
    };
    Ok((status, body))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_are_host_port_or_unix_paths() {
        assert_eq!(
            AdminAddr::parse("127.0.0.1:9901").unwrap(),
            AdminAddr::Tcp("127.0.0.1:9901".to_owned())
        );
        assert_eq!(
            AdminAddr::parse("[::1]:9901").unwrap(),
            AdminAddr::Tcp("[::1]:9901".to_owned())
        );
        assert_eq!(
            AdminAddr::parse("localhost:9901").unwrap().to_string(),
            "localhost:9901"
        );
        assert_eq!(
            AdminAddr::parse("unix:/run/door/admin.sock").unwrap(),
            AdminAddr::Unix(PathBuf::from("/run/door/admin.sock"))
        );
        // The URL door logs for its admin listener.
        for url in ["http://127.0.0.1:9901", "http://127.0.0.1:9901/"] {
            assert_eq!(
                AdminAddr::parse(url).unwrap(),
                AdminAddr::Tcp("127.0.0.1:9901".to_owned()),
                "{url}"
            );
        }
        for bad in [
            "",
            "9901",
            "host:",
            ":9901",
            "host:99999",
            "unix:",
            "http://",
            "https://127.0.0.1:9901",
            "http://127.0.0.1:9901/status",
        ] {
            assert!(AdminAddr::parse(bad).is_err(), "{bad}");
        }
    }
}
