//! The daemon's life (docs/design.md, "Operating contract"): check the TLS pair, load and attach
//! the XDP shield, bind every listener, tell systemd it is ready, serve until SIGTERM while
//! reloading on SIGHUP and pinging the watchdog, then drain and detach.
//!
//! This is the only module that owns signals, `sd_notify` and the order of start-up and shutdown;
//! what it starts lives in [`crate::http`], [`crate::shield`] and [`crate::admin`].

use std::{
    net::SocketAddr,
    sync::{Arc, Mutex},
    time::Duration,
};

use thiserror::Error;

use crate::{
    admin::{AdminListener, StatusSource},
    config::{Config, ConfigError, XdpMode},
    http::{
        front::{ConnSettings, Front},
        request::App,
        tls::TlsError,
    },
    obs::{metrics::Metrics, prometheus::Exposition},
    shield::{BlocklistWriter, Shield, ShieldError, escalate::Blocklist},
    time::Clock,
};

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
    /// The admin listener could not be bound (`admin_listen`).
    #[error("admin_listen = {at}: {source}")]
    AdminBind {
        /// The address or Unix socket, as configured.
        at: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// The TLS certificate or key cannot be used (checked before anything is bound).
    #[error(transparent)]
    Tls(#[from] TlsError),
    /// `[cluster] redis` cannot be used.
    #[error(transparent)]
    Cluster(#[from] crate::cluster::ClusterError),
    /// The worker threads that serve connections could not be started.
    #[error("starting the worker threads: {0}")]
    Workers(std::io::Error),
}

impl ServeError {
    /// Whether the configuration is at fault, so that restarting cannot help and `door` exits
    /// with `EX_CONFIG`: a TLS pair or cluster CA file that holds no usable PEM (or is larger
    /// than [`crate::http::tls::MAX_PEM_FILE`]), a key that does not fit its certificate, a
    /// cluster URL the client refuses. A file that cannot be read is not: it may yet appear (a
    /// credential systemd provides to the running unit, a mount, a renewal), so a restart may
    /// help.
    pub fn is_config(&self) -> bool {
        use crate::{cluster::ClusterError, http::tls::TlsError};
        match self {
            Self::Tls(TlsError::Read { .. }) => false,
            Self::Tls(_) | Self::Cluster(ClusterError::Url(_)) => true,
            Self::Cluster(ClusterError::CaFile { source, .. }) => {
                crate::http::tls::is_unusable(source)
            }
            _ => false,
        }
    }
}

/// What start-up reads besides the configuration, read without binding or connecting anything:
/// the TLS pair, and the cluster store's URL and CA file. `door check-config` runs it, so that a
/// configuration it accepts does not fail at start on these.
///
/// # Errors
///
/// [`ServeError::Tls`], [`ServeError::Cluster`]; [`ServeError::is_config`] tells a bad file
/// from one that could not be read.
pub fn preflight(config: &Config) -> Result<(), ServeError> {
    if let Some(tls) = &config.tls {
        crate::http::tls::load(tls)?;
    }
    if config.cluster.redis.is_some() {
        crate::cluster::client(&config.cluster)?;
    }
    Ok(())
}

/// Re-reads the configuration for a reload (flags, environment and the file, as at start).
pub type Reloader = Box<dyn Fn() -> Result<Config, ConfigError> + Send>;

/// Runs door with `config` until SIGTERM or SIGINT: checks the TLS key pair, attaches the XDP
/// program (per `xdp.mode`), binds every listener (nothing is served until all are bound),
/// tells systemd it is ready (`READY=1`), serves, then drains within `drain_grace`
/// (`STOPPING=1`) and detaches the XDP program. SIGHUP reloads the configuration with `reload`
/// (see [`App::reload`]; the XDP settings and exempt prefixes are updated in place); a
/// configuration that does not validate is logged and the running one kept. Under systemd's
/// watchdog (`WATCHDOG_USEC`), `WATCHDOG=1` is sent from this serving loop, and only while every
/// accept loop is alive and every worker thread answers its pings ([`Front::accepting`]), so
/// a wedged runtime, a wedged worker or a dead listener stops the pings.
///
/// `metrics` are the instruments door records into; `exposition`, when given, is served as
/// `GET /metrics` on the admin listener (built from the same meter provider as `metrics`).
///
/// # Errors
/// [`ServeError`] when the TLS pair is unusable, a listener cannot be bound or a strict XDP mode
/// cannot attach.
pub async fn run(
    config: Config,
    metrics: Metrics,
    exposition: Option<Exposition>,
    reload: Reloader,
) -> Result<(), ServeError> {
    // First: a SIGTERM or SIGHUP while door starts (an XDP attach, a slow store) waits for the
    // serving loop instead of killing door with the default action, which would leave a Unix
    // admin socket behind and skip the drain.
    let signals = Signals::install();
    let tls = config
        .tls
        .as_ref()
        .map(crate::http::tls::load)
        .transpose()?;
    let shield = start_shield(&config)?;
    forward_xdp_log(shield.as_ref());
    let listeners = bind_listeners(&config)?;
    // A Unix socket's file is removed when `_admin_socket` drops, at the end of this function.
    let (admin, _admin_socket) = bind_admin(&config)?;

    let clock: Arc<dyn Clock> = crate::time::production_clock();
    let (blocklist, shared_blocklist) = blocklists(shield.as_ref(), &config, &clock);
    let _shield_instruments = shield
        .as_ref()
        .map(|s| crate::shield::observe(metrics.meter(), s));
    let app = Arc::new(App::new(&config, &clock, &metrics, blocklist));
    let admin_blocklist = admin_blocklist(shield.as_ref(), shared_blocklist.as_ref());
    let (cluster, cluster_status) = start_cluster(&config, &app, shared_blocklist)?;
    let _budget_instruments = budget_instruments(&metrics, &app);
    let front = Front::with_workers(
        Arc::clone(&app),
        ConnSettings::from_config(&config),
        tls,
        crate::http::worker::count(),
    )
    .map_err(ServeError::Workers)?;
    let proto = if config.tls.is_some() {
        "TLS: h2 and http/1.1 by ALPN"
    } else {
        "HTTP/1.1 and h2c"
    };
    let mut bound = Vec::with_capacity(listeners.len());
    for ((l, proxy_protocol), configured) in listeners.into_iter().zip(&config.listen) {
        // The address bound (a configured port 0 is the one the kernel chose).
        let addr = l.local_addr().unwrap_or(*configured);
        tracing::info!(%addr, upstream = %config.upstream, proxy_protocol, "listening ({proto})");
        bound.push(addr.to_string());
        front.serve(l, proxy_protocol);
    }
    let admin_task = admin.map(|l| {
        tracing::info!(at = %l.describe(), "admin status (GET /status, /metrics, /clients, /blocks)");
        let (limiters, passthrough, unblocked) = admin_hooks(&app);
        let source = Arc::new(StatusSource {
            limiters,
            passthrough,
            metrics: metrics.clone(),
            shield: shield.clone(),
            xdp_mode: config.xdp.mode.as_str(),
            cluster: cluster_status,
            exposition,
            blocklist: admin_blocklist,
            unblocked,
        });
        tokio::spawn(crate::admin::serve(l, source))
    });

    let status = status_line(&bound, shield.as_ref());
    notify(&[
        sd_notify::NotifyState::Ready,
        sd_notify::NotifyState::Status(&status),
    ]);
    serve_until_term(
        &front,
        &app,
        shield.as_ref(),
        &config,
        &reload,
        signals,
        &status,
    )
    .await;

    notify(&[
        sd_notify::NotifyState::Stopping,
        sd_notify::NotifyState::Status("draining"),
    ]);
    // Read at start only (a reload that changes it says it needs a restart).
    let grace = config.drain_grace;
    tracing::info!(?grace, "draining: health is 503, listeners closed");
    if !front.drain(grace).await {
        tracing::warn!(
            ?grace,
            "in-flight requests did not finish within the grace period"
        );
    }
    if let Some(t) = admin_task {
        t.abort();
    }
    drop(cluster);
    if let Some(shield) = shield {
        lock(&shield).detach();
        tracing::info!("XDP flood shield detached");
    }
    Ok(())
}

/// Binds every `listen` address, each with whether it requires the PROXY protocol header.
///
/// # Errors
/// [`ServeError::Bind`] naming the first address that could not be bound.
fn bind_listeners(config: &Config) -> Result<Vec<(tokio::net::TcpListener, bool)>, ServeError> {
    config
        .listen
        .iter()
        .map(|addr| {
            let l =
                crate::http::bind::tcp(*addr, config.binds_v6_only(*addr)).map_err(|source| {
                    ServeError::Bind {
                        addr: *addr,
                        source,
                    }
                })?;
            Ok((l, config.requires_proxy_protocol(*addr)))
        })
        .collect()
}

/// The `STATUS=` door sends with `READY=1`, which `systemctl status` shows: the request
/// listeners' bound addresses and the XDP state (`serving on 127.0.0.1:8443; XDP off`).
fn status_line(bound: &[String], shield: Option<&Arc<Mutex<Shield>>>) -> String {
    let xdp_state = match shield {
        Some(s) => match lock(s).attached() {
            Some((interface, mode)) => format!("XDP on {interface} ({mode})"),
            None => "XDP not attached".to_owned(),
        },
        None => "XDP off".to_owned(),
    };
    format!("serving on {}; {xdp_state}", bound.join(", "))
}

/// The admin API's three hooks into the request path: the groups in force (a reload replaces
/// them), the pass-through caps, and the escalator to tell of an operator's unblock.
fn admin_hooks(
    app: &Arc<App>,
) -> (
    crate::admin::LimiterSource,
    crate::admin::PassThroughSource,
    crate::admin::UnblockHook,
) {
    let for_status = Arc::clone(app);
    let for_caps = Arc::clone(app);
    let for_unblock = Arc::clone(app);
    (
        Arc::new(move || for_status.limiters()),
        Arc::new(move || for_caps.passthrough_status()),
        Arc::new(move |key| for_unblock.forget_escalation(key)),
    )
}

/// The blocklist of `POST /blocks` and its kin: `shield`'s (none without one), and in cluster
/// mode also published to every door through `shared`.
fn admin_blocklist(
    shield: Option<&Arc<Mutex<Shield>>>,
    shared: Option<&Arc<crate::cluster::SharedBlocklist>>,
) -> Option<Arc<dyn crate::admin::AdminBlocklist>> {
    let local: Arc<dyn crate::admin::AdminBlocklist> = Arc::clone(shield?) as _;
    Some(match shared {
        Some(shared) => Arc::new(crate::admin::ClusterBlocklist {
            local,
            shared: Arc::clone(shared),
        }),
        None => local,
    })
}

/// The escalator's blocklist for `shield` (none without one) and, in cluster mode, the same
/// blocklist shared with the other doors (`cluster::blocks`), for the sync task.
fn blocklists(
    shield: Option<&Arc<Mutex<Shield>>>,
    config: &Config,
    clock: &Arc<dyn Clock>,
) -> (
    Option<Arc<dyn Blocklist>>,
    Option<Arc<crate::cluster::SharedBlocklist>>,
) {
    let local =
        shield.map(|s| Arc::new(BlocklistWriter::spawn(Arc::clone(s))) as Arc<dyn Blocklist>);
    match local {
        Some(local) if config.cluster.redis.is_some() => {
            let shared = crate::cluster::SharedBlocklist::new(local, Arc::clone(clock));
            (
                Some(Arc::clone(&shared) as Arc<dyn Blocklist>),
                Some(shared),
            )
        }
        local => (local, None),
    }
}

/// Starts the cluster sync when `[cluster] redis` is set; the status `/status` shows either way.
fn start_cluster(
    config: &Config,
    app: &Arc<App>,
    blocks: Option<Arc<crate::cluster::SharedBlocklist>>,
) -> Result<
    (
        Option<crate::cluster::Cluster>,
        Arc<crate::cluster::ClusterStatus>,
    ),
    ServeError,
> {
    if config.cluster.redis.is_none() {
        return Ok((None, Arc::new(crate::cluster::ClusterStatus::off())));
    }
    let c = crate::cluster::spawn(
        &config.cluster,
        Arc::clone(app),
        blocks,
        crate::cluster::ClusterMetrics::new(&opentelemetry::global::meter("door")),
        crate::cluster::door_id(),
    )?;
    tracing::info!(interval = ?config.cluster.sync_interval, "cluster: sharing budgets");
    let status = c.status();
    Ok((Some(c), status))
}

/// `door.inflight_cap` and `door.max_clients`, read from the groups in force.
fn budget_instruments(metrics: &Metrics, app: &Arc<App>) -> crate::obs::metrics::BudgetInstruments {
    let app = Arc::clone(app);
    crate::obs::metrics::observe_budgets(metrics.meter(), move || app.limiters())
}

/// Binds `admin_listen` (nothing when it is `off`), with the Unix socket's file to keep.
fn bind_admin(
    config: &Config,
) -> Result<(Option<AdminListener>, Option<crate::admin::SocketFile>), ServeError> {
    let Some(at) = &config.admin_listen else {
        return Ok((None, None));
    };
    let v6_only = at.tcp().is_some_and(|addr| config.binds_v6_only(addr));
    let (l, file) = AdminListener::bind(at, v6_only).map_err(|source| ServeError::AdminBind {
        at: at.to_string(),
        source,
    })?;
    Ok((Some(l), file))
}

/// Sends `states` to systemd when it is listening (`NOTIFY_SOCKET`); failures are logged, never
/// fatal.
fn notify(states: &[sd_notify::NotifyState<'_>]) {
    if let Err(e) = sd_notify::notify(false, states) {
        tracing::debug!(error = %e, "sd_notify failed");
    }
}

/// door's handlers of SIGTERM, SIGINT and SIGHUP. They are installed before door tells systemd
/// `READY=1`: the default action of all three ends the process, so a reload or a stop sent as
/// soon as door says it is ready must find them in place.
struct Signals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
    hup: tokio::signal::unix::Signal,
}

impl Signals {
    /// Installs the three handlers.
    ///
    /// # Errors
    /// When tokio cannot register a handler (no signal driver, or the kernel refused).
    fn install() -> std::io::Result<Self> {
        use tokio::signal::unix::{SignalKind, signal};
        Ok(Self {
            term: signal(SignalKind::terminate())?,
            int: signal(SignalKind::interrupt())?,
            hup: signal(SignalKind::hangup())?,
        })
    }
}

/// Serves until SIGTERM or SIGINT, reloading on SIGHUP and pinging the watchdog. `started` is
/// the configuration door started with: what a reload says needs a restart is what differs from
/// it (the settings read only at start keep its values until then), not from the last reload.
/// `status` is the start-up `STATUS=`, sent again after each reload with how it went.
async fn serve_until_term(
    front: &Front,
    app: &App,
    shield: Option<&Arc<Mutex<Shield>>>,
    started: &Config,
    reload: &Reloader,
    signals: std::io::Result<Signals>,
    status: &str,
) {
    let mut signals = match signals {
        Ok(signals) => signals,
        Err(e) => {
            tracing::error!(error = %e, "cannot install signal handlers; stopping on Ctrl-C only");
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    let mut usec = 0;
    let watchdog = sd_notify::watchdog_enabled(false, &mut usec);
    let period = Duration::from_micros(usec / 2).max(Duration::from_millis(100));
    let mut tick = tokio::time::interval(period);
    let mut routes = started.routes.len();
    loop {
        tokio::select! {
            _ = signals.term.recv() => return,
            _ = signals.int.recv() => return,
            _ = signals.hup.recv() => {
                notify(&[sd_notify::NotifyState::Reloading]);
                let outcome = match reload() {
                    Ok(new) => {
                        if new.routes.is_empty() && routes > 0 {
                            // A file without routes is a valid configuration (an empty one is
                            // refused: `Config::reload`).
                            tracing::warn!(
                                before = routes,
                                "the reloaded configuration has no routes: no route group limits a request now"
                            );
                        }
                        let restart = app.reload(&new, started);
                        reconfigure_shield(shield, &new);
                        // Turning TLS on or off needs a restart (in `restart`).
                        if started.tls.is_some() {
                            reload_tls(front, &new);
                        }
                        if restart.is_empty() {
                            tracing::info!("configuration reloaded");
                        } else {
                            tracing::warn!(needs_restart = ?restart, "configuration reloaded; these settings only change on restart");
                        }
                        routes = new.routes.len();
                        "reloaded"
                    }
                    Err(e) => {
                        tracing::error!(error = %e, "reload refused: invalid configuration, keeping the running one");
                        "reload refused, the running configuration kept"
                    }
                };
                notify(&[
                    sd_notify::NotifyState::Ready,
                    sd_notify::NotifyState::Status(&format!("{status}; {outcome}")),
                ]);
            }
            _ = tick.tick(), if watchdog => {
                if front.accepting() {
                    notify(&[sd_notify::NotifyState::Watchdog]);
                } else {
                    tracing::error!("an accept loop has stopped or a worker thread is wedged: no longer pinging the watchdog");
                }
            }
        }
    }
}

/// Re-reads a reloaded configuration's TLS certificate and key (a renewal's deploy hook runs
/// `systemctl reload door`): new handshakes get the new pair, open connections keep theirs. A
/// pair that does not load is refused and the running one kept. Only for a door that serves TLS.
fn reload_tls(front: &Front, config: &Config) {
    let Some(tls) = &config.tls else { return };
    match front.reload_tls(tls) {
        Ok(()) => tracing::info!(cert = %tls.cert.display(), "TLS certificate and key reloaded"),
        Err(e) => tracing::error!(
            error = %e,
            "reload: the new TLS certificate or key cannot be used; keeping the running pair"
        ),
    }
}

/// Writes a reloaded configuration's XDP settings, exempt prefixes ([`Config::shield_exempt`]:
/// trusted proxies, `allow` and `xdp.allow`) and denied ones ([`Config::shield_denied`]: `deny`
/// and `xdp.deny`) into the attached program's maps, in place.
fn reconfigure_shield(shield: Option<&Arc<Mutex<Shield>>>, config: &Config) {
    let Some(shield) = shield else { return };
    if let Err(e) = lock(shield).configure(
        &config.xdp,
        &config.shield_exempt(),
        &config.shield_denied(),
    ) {
        tracing::error!(error = %e, "reload: could not update the XDP maps; the shield keeps its previous settings where they were not written");
    }
}

/// Forwards the XDP program's rare events (aya-log records) to door's log on a task of its own.
fn forward_xdp_log(shield: Option<&Arc<Mutex<Shield>>>) {
    let log = shield.and_then(|s| {
        s.lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take_log()
    });
    if let Some(log) = log {
        tokio::spawn(crate::shield::forward_log(log));
    }
}

fn start_shield(config: &Config) -> Result<Option<Arc<Mutex<Shield>>>, ServeError> {
    let mode = config.xdp.mode;
    if !config.xdp.allow.is_empty() || !config.xdp.deny.is_empty() {
        // Lists written after `[xdp]` land here: say that they act at layer 7 too.
        tracing::info!(
            xdp_allow = config.xdp.allow.len(),
            xdp_deny = config.xdp.deny.len(),
            "xdp.allow and xdp.deny are more of the allow and deny lists: never limited, or 403, \
             at layer 7 too"
        );
    }
    if mode == XdpMode::Off {
        tracing::info!("XDP flood shield off (xdp.mode = \"off\")");
        return Ok(None);
    }
    let interface = config.xdp.interface.clone().unwrap_or_default();
    if config.xdp.syn_cookies == crate::config::SynCookies::Auto {
        let kernel = crate::shield::KernelCookies::read();
        if kernel.works() {
            tracing::info!(
                threshold = config.xdp.cookie_threshold,
                "{}",
                kernel.describe()
            );
        } else {
            tracing::warn!(
                threshold = config.xdp.cookie_threshold,
                "{}",
                kernel.describe()
            );
        }
    }
    let attached = Shield::load_with_capacity(config.xdp.max_prefixes).and_then(|mut s| {
        s.configure(
            &config.xdp,
            &config.shield_exempt(),
            &config.shield_denied(),
        )?;
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

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}
