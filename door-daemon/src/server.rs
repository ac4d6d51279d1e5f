//! The request path and the daemon's lifecycle: listeners serving HTTP/1.1 and h2c, route
//! matching, admission by the group's limiter, forwarding, and the 429/503 answers
//! (../shared/DESIGN.md, "Limits"); start-up (XDP, then listeners) and shutdown on SIGTERM/SIGINT.

use std::{
    collections::HashMap,
    convert::Infallible,
    net::SocketAddr,
    pin::Pin,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    task::{Context, Poll},
    time::Duration,
};

use bytes::Bytes;
use http::{HeaderValue, Request, Response, StatusCode, header};
use http_body::{Body, Frame, SizeHint};
use http_body_util::{BodyExt, Full, combinators::BoxBody};
use hyper::body::Incoming;
use hyper_util::{
    rt::{TokioExecutor, TokioIo},
    server::conn::auto,
};
use thiserror::Error;
use tokio::{net::TcpListener, task::JoinSet};

use crate::{
    clock::{Clock, MonotonicClock},
    config::{Config, XdpMode},
    escalate::{Blocklist, Escalator, KeySource},
    key::{self, ForwardedSource, TrustedProxies},
    limit::{GroupLimiter, Permit, Rejection},
    metrics::Metrics,
    proxy::{Origin, Proxy, prepare},
    route::Router,
    status::StatusSource,
    xdp::{Shield, ShieldError},
};

/// The response body type: upstream bodies streamed through, or door's own small bodies.
pub type ResponseBody = BoxBody<Bytes, hyper::Error>;

/// How long in-flight requests get to finish after SIGTERM before door exits anyway.
pub const DRAIN_GRACE: Duration = Duration::from_secs(10);

/// Start-up failures.
#[derive(Debug, Error)]
pub enum ServeError {
    /// A listener could not be bound.
    #[error("binding {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The OS error.
        source: std::io::Error,
    },
    /// The XDP program could not be attached in a strict mode (`driver`, `skb`).
    #[error("xdp.mode = {mode:?}: {source}")]
    Xdp {
        /// The configured mode.
        mode: &'static str,
        /// Why.
        source: ShieldError,
    },
}

/// Everything the request path needs, shared by all connections.
#[derive(Debug)]
pub struct App {
    router: Router,
    limiters: HashMap<String, Arc<GroupLimiter>>,
    proxy: Proxy,
    trusted: TrustedProxies,
    forwarded_header: ForwardedSource,
    metrics: Metrics,
    warned_untrusted_xff: AtomicBool,
    escalator: Option<Escalator>,
}

impl App {
    /// Builds the request path from a validated configuration, reading time from `clock` and
    /// recording into `metrics`; `blocklist` receives escalated keys when `[xdp] escalate_after`
    /// is set.
    pub fn new(
        config: &Config,
        clock: &Arc<dyn Clock>,
        metrics: &Metrics,
        blocklist: Option<Arc<dyn Blocklist>>,
    ) -> Self {
        let enforce = !config.disable_anon_route_limits;
        let limiters = config
            .groups
            .iter()
            .map(|(name, g)| {
                let limiter =
                    GroupLimiter::new(name, g.budget, enforce, Arc::clone(clock), metrics.clone());
                (name.clone(), Arc::new(limiter))
            })
            .collect();
        Self {
            router: Router::new(config.routes.clone()),
            limiters,
            proxy: Proxy::new(config.upstream.clone()),
            trusted: config.trusted_proxies.clone(),
            forwarded_header: config.forwarded_header,
            metrics: metrics.clone(),
            warned_untrusted_xff: AtomicBool::new(false),
            escalator: blocklist
                .filter(|_| config.xdp.escalate_after > 0)
                .map(|b| {
                    Escalator::new(
                        config.xdp.escalate_after,
                        config.xdp.escalate_window,
                        config.xdp.block_for,
                        Arc::clone(clock),
                        b,
                    )
                }),
        }
    }

    /// The groups' limiters, sorted by name.
    pub fn limiters(&self) -> Vec<Arc<GroupLimiter>> {
        let mut v: Vec<_> = self.limiters.values().cloned().collect();
        v.sort_by(|a, b| a.group().cmp(b.group()));
        v
    }

    /// Handles one request from `peer`.
    pub async fn handle(
        self: Arc<Self>,
        peer: SocketAddr,
        req: Request<Incoming>,
    ) -> Response<ResponseBody> {
        let peer_ip = key::canonical(peer.ip());
        let origin = Origin {
            peer: peer_ip,
            peer_trusted: self.trusted.contains(peer_ip),
            tls: false,
        };
        let group = self.router.group_for(req.method(), req.uri().path());
        let Some(limiter) = group.and_then(|g| self.limiters.get(g)).cloned() else {
            return self.forward(req, origin, None).await;
        };
        let decision =
            key::client_key(peer_ip, req.headers(), &self.trusted, self.forwarded_header);
        if decision.ignored_untrusted_xff {
            self.metrics.untrusted_xff();
            if !self.warned_untrusted_xff.swap(true, Ordering::Relaxed) {
                tracing::warn!(
                    %peer_ip,
                    "ignoring X-Forwarded-For/Forwarded from an untrusted local peer: if it is a \
                     proxy, add it to trusted_proxies (counted in door.untrusted_xff; warned once)"
                );
            }
        }
        match limiter.admit(decision.key) {
            Ok(permit) => self.forward(req, origin, Some(permit)).await,
            Err(rejection) => {
                if rejection.status == StatusCode::TOO_MANY_REQUESTS
                    && let Some(e) = &self.escalator
                {
                    let source = if decision.is_untrusted_peer() {
                        KeySource::Peer
                    } else {
                        KeySource::ThroughProxy
                    };
                    e.on_rejection(decision.key, source);
                }
                rejected(limiter.group(), &rejection)
            }
        }
    }

    async fn forward(
        &self,
        req: Request<Incoming>,
        origin: Origin,
        permit: Option<Permit>,
    ) -> Response<ResponseBody> {
        let req = prepare(req, self.proxy.upstream(), origin);
        match self.proxy.forward(req).await {
            Ok(res) => {
                let status = res.status();
                match permit {
                    Some(permit) => res.map(|body| Settling::new(body, permit, status).boxed()),
                    None => res.map(BodyExt::boxed),
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, refused = e.is_connect(), "upstream request failed");
                // The permit (if any) is dropped here unsettled: its slot is freed, nothing is
                // spent, and it counts as server_error.
                drop(permit);
                json_response(
                    StatusCode::BAD_GATEWAY,
                    &serde_json::json!({
                        "code": "bad-gateway",
                        "message": "the application behind door did not answer",
                    }),
                )
            }
        }
    }
}

/// The 429/503 answer of ../shared/DESIGN.md ("Limits"): `Retry-After` in whole seconds and the
/// JSON envelope `{"code":"rate-limited","message":…,"details":{"group","scope","retry_after_s"}}`.
pub fn rejected(group: &str, r: &Rejection) -> Response<ResponseBody> {
    let body = serde_json::json!({
        "code": "rate-limited",
        "message": format!("too many requests to {group}; retry in {} s", r.retry_after_s),
        "details": {
            "group": group,
            "scope": r.scope.as_str(),
            "retry_after_s": r.retry_after_s,
        },
    });
    let mut res = json_response(r.status, &body);
    res.headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from(r.retry_after_s));
    res
}

fn json_response(status: StatusCode, body: &serde_json::Value) -> Response<ResponseBody> {
    let full = Full::new(Bytes::from(body.to_string())).map_err(|never: Infallible| match never {});
    let mut res = Response::new(full.boxed());
    *res.status_mut() = status;
    res.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    res
}

/// A response body that settles its request's permit when the body ends or is dropped (client
/// gone), so the request counts as in flight until its response has been sent.
struct Settling<B> {
    inner: B,
    permit: Option<Permit>,
    status: StatusCode,
}

impl<B> Settling<B> {
    fn new(inner: B, permit: Permit, status: StatusCode) -> Self {
        Self {
            inner,
            permit: Some(permit),
            status,
        }
    }

    fn settle(&mut self) {
        if let Some(permit) = self.permit.take() {
            permit.settle(self.status);
        }
    }
}

impl<B: Body + Unpin> Body for Settling<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let poll = Pin::new(&mut self.inner).poll_frame(cx);
        if matches!(poll, Poll::Ready(None | Some(Err(_)))) {
            self.settle();
        }
        poll
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl<B> Drop for Settling<B> {
    fn drop(&mut self) {
        self.settle();
    }
}

/// Serves HTTP/1.1 and h2c (prior knowledge) on `listener` until `shutdown` fires; connections
/// in progress are tracked in `connections`.
async fn accept_loop(
    listener: TcpListener,
    app: Arc<App>,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
    connections: Arc<Mutex<JoinSet<()>>>,
) {
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = shutdown.changed() => return,
        };
        let (stream, peer) = match accepted {
            Ok(a) => a,
            Err(e) => {
                tracing::warn!(error = %e, "accept failed");
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let app = Arc::clone(&app);
        let mut shutdown = shutdown.clone();
        let task = async move {
            let service = hyper::service::service_fn(move |req| {
                let app = Arc::clone(&app);
                async move { Ok::<_, Infallible>(app.handle(peer, req).await) }
            });
            let builder = auto::Builder::new(TokioExecutor::new());
            let conn = builder.serve_connection(TokioIo::new(stream), service);
            tokio::pin!(conn);
            tokio::select! {
                r = conn.as_mut() => if let Err(e) = r { tracing::debug!(%peer, error = %e, "connection ended with an error") },
                _ = shutdown.changed() => {
                    conn.as_mut().graceful_shutdown();
                    let _ = conn.await;
                }
            }
        };
        connections
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .spawn(task);
    }
}

/// Runs door with `config` until SIGTERM or SIGINT: attaches the XDP program (per `xdp.mode`),
/// binds every listener (nothing is served until all are bound), serves, then drains and detaches.
///
/// # Errors
/// [`ServeError`] when a listener cannot be bound or a strict XDP mode cannot attach.
pub async fn run(config: Config) -> Result<(), ServeError> {
    let shield = start_shield(&config)?;
    let mut listeners = Vec::new();
    for addr in &config.listen {
        let l = TcpListener::bind(addr)
            .await
            .map_err(|source| ServeError::Bind {
                addr: *addr,
                source,
            })?;
        listeners.push(l);
    }
    let admin = match config.admin_listen {
        Some(addr) => Some(
            TcpListener::bind(addr)
                .await
                .map_err(|source| ServeError::Bind { addr, source })?,
        ),
        None => None,
    };

    let clock: Arc<dyn Clock> = Arc::new(MonotonicClock::new());
    let blocklist = shield
        .clone()
        .map(|s| Arc::new(ShieldBlocklist(s)) as Arc<dyn Blocklist>);
    let meter = opentelemetry::global::meter("door");
    let metrics = Metrics::new(&meter);
    let _shield_instruments = shield.as_ref().map(|s| crate::xdp::observe(&meter, s));
    let app = Arc::new(App::new(&config, &clock, &metrics, blocklist));
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let connections = Arc::new(Mutex::new(JoinSet::new()));
    let mut loops = JoinSet::new();
    for l in listeners {
        if let Ok(addr) = l.local_addr() {
            tracing::info!(%addr, upstream = %config.upstream, "listening (HTTP/1.1 and h2c)");
        }
        loops.spawn(accept_loop(
            l,
            Arc::clone(&app),
            stop_rx.clone(),
            Arc::clone(&connections),
        ));
    }
    let admin_task = admin.map(|l| {
        if let Ok(addr) = l.local_addr() {
            tracing::info!(url = %crate::status::url(addr), "admin status");
        }
        let source = Arc::new(StatusSource {
            limiters: app.limiters(),
            shield: shield.clone(),
            xdp_mode: config.xdp.mode.as_str(),
        });
        tokio::spawn(crate::status::serve(l, source))
    });

    wait_for_signal().await;
    tracing::info!("shutting down: closing listeners, draining in-flight requests");
    let _ = stop_tx.send(true);
    while loops.join_next().await.is_some() {}
    let mut conns = std::mem::take(
        &mut *connections
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner),
    );
    if tokio::time::timeout(DRAIN_GRACE, async {
        while conns.join_next().await.is_some() {}
    })
    .await
    .is_err()
    {
        tracing::warn!(grace = ?DRAIN_GRACE, "in-flight requests did not finish within the grace period");
    }
    if let Some(t) = admin_task {
        t.abort();
    }
    if let Some(shield) = shield {
        shield
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .detach();
    }
    Ok(())
}

fn start_shield(config: &Config) -> Result<Option<Arc<Mutex<Shield>>>, ServeError> {
    let mode = config.xdp.mode;
    if mode == XdpMode::Off {
        tracing::info!("XDP flood shield off (xdp.mode = \"off\")");
        return Ok(None);
    }
    let interface = config.xdp.interface.clone().unwrap_or_default();
    let mut exempt = config.trusted_proxies.nets().to_vec();
    exempt.extend(config.xdp.allow.iter().copied());
    let attached = Shield::load().and_then(|mut s| {
        s.configure(&config.xdp, &exempt)?;
        s.attach(&interface, mode).map(|m| (s, m))
    });
    match attached {
        Ok((shield, m)) => {
            tracing::info!(%interface, mode = %m, "XDP flood shield attached");
            Ok(Some(Arc::new(Mutex::new(shield))))
        }
        Err(source) if mode == XdpMode::Auto => {
            tracing::error!(
                %interface, error = %source,
                "XDP FLOOD SHIELD NOT ATTACHED: serving with layer-7 limits only (xdp.mode = \"auto\")"
            );
            Ok(None)
        }
        Err(source) => Err(ServeError::Xdp {
            mode: mode.as_str(),
            source,
        }),
    }
}

/// The XDP blocklist as the escalator's [`Blocklist`].
#[derive(Debug)]
struct ShieldBlocklist(Arc<Mutex<Shield>>);

impl Blocklist for ShieldBlocklist {
    fn block(&self, key: door_common::PrefixKey, duration: Duration) {
        let result = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .block(key, duration);
        if let Err(e) = result {
            tracing::warn!(%key, error = %e, "could not add to the XDP blocklist");
        }
    }
}

async fn wait_for_signal() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        () = term => {}
        _ = tokio::signal::ctrl_c() => {}
    }
}
