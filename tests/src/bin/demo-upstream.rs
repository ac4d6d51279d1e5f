//! door's demo upstream: a tiny application answering the example routes, so `cargo xtask run`
//! and the end-to-end suites need nothing else.
//!
//! - `POST /webhooks/github`: 200 `{"received_bytes": N}` (reads the whole body).
//! - `GET /l/session/{id}`: 200, a one-line page naming the session.
//! - `/healthz`: 200 `ok`.
//! - anything else: 200, JSON echo of the method, path and the forwarding headers it received.
//!
//! Any request may carry `x-demo-status: NNN` (or `?status=NNN`) to get that status instead, which
//! is how tests make the upstream answer 4xx.

use std::{convert::Infallible, net::SocketAddr};

use anyhow::Context as _;
use bytes::Bytes;
use clap::Parser;
use http::{Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::{
    rt::{TokioExecutor, TokioIo},
    server::conn::auto,
};
use serde_json::json;

/// Demo upstream for door.
#[derive(Debug, Parser)]
struct Args {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:3000")]
    listen: SocketAddr,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(serve(args.listen))
}

async fn serve(addr: SocketAddr) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("binding {addr}"))?;
    println!(
        "demo upstream listening on http://{}",
        listener.local_addr()?
    );
    loop {
        let (stream, _) = listener.accept().await?;
        tokio::spawn(async move {
            let service = hyper::service::service_fn(handle);
            let _ = auto::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

async fn handle(req: Request<Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    let forced = req
        .headers()
        .get("x-demo-status")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
        .or_else(|| {
            req.uri()
                .query()
                .and_then(|q| q.split('&').find_map(|kv| kv.strip_prefix("status=")))
                .map(str::to_owned)
        })
        .and_then(|s| s.parse::<u16>().ok())
        .and_then(|s| StatusCode::from_u16(s).ok());
    let path = req.uri().path().to_owned();
    let header = |name: &str| {
        req.headers()
            .get_all(name)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .collect::<Vec<_>>()
            .join(", ")
    };
    let echo = json!({
        "method": req.method().as_str(),
        "path": path,
        "host": header("host"),
        "x_forwarded_for": header("x-forwarded-for"),
        "x_forwarded_proto": header("x-forwarded-proto"),
        "forwarded": header("forwarded"),
    });
    let (content_type, body) = if path == "/webhooks/github" {
        let n = req
            .into_body()
            .collect()
            .await
            .map_or(0, |b| b.to_bytes().len());
        (
            "application/json",
            json!({ "received_bytes": n }).to_string(),
        )
    } else if let Some(id) = path.strip_prefix("/l/session/") {
        ("text/plain", format!("session {id}\n"))
    } else if path == "/healthz" {
        ("text/plain", "ok\n".to_owned())
    } else {
        ("application/json", echo.to_string())
    };
    let mut res = Response::new(Full::new(Bytes::from(body)));
    *res.status_mut() = forced.unwrap_or(StatusCode::OK);
    res.headers_mut().insert(
        header::CONTENT_TYPE,
        http::HeaderValue::from_static(content_type),
    );
    Ok(res)
}
