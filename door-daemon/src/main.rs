//! The `door` binary: parses flags (with `DOOR_*` environment fallbacks), loads and validates
//! the configuration before binding anything, and runs the daemon.

use std::{path::PathBuf, process::ExitCode};

use anyhow::Context as _;
use clap::{Args, Parser, Subcommand};
use door_daemon::config::{Config, Overrides};

/// door: a front door for one HTTP application.
#[derive(Debug, Parser)]
#[command(name = "door", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    settings: Settings,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Validate the configuration and print the effective settings as TOML (defaults filled in,
    /// secrets elided); exit 2 naming the offending key and value if it is invalid.
    CheckConfig,
    /// Print the client key a request would get, and which rule chose it (for debugging proxies).
    Key {
        /// The TCP peer's address (the proxy's, behind one).
        #[arg(long)]
        peer: std::net::IpAddr,
        /// An X-Forwarded-For header line, as received (repeatable, in wire order).
        #[arg(long = "xff")]
        xff: Vec<String>,
        /// A Forwarded (RFC 7239) header line, as received (repeatable, in wire order).
        #[arg(long = "forwarded")]
        forwarded: Vec<String>,
    },
}

/// Settings: flag, then environment variable, then configuration file, then default.
#[derive(Debug, Args)]
struct Settings {
    /// Configuration file (TOML).
    #[arg(long, env = "DOOR_CONFIG", global = true)]
    config: Option<PathBuf>,
    /// Address to serve on (repeatable or comma-separated). Default [::]:8443.
    #[arg(long, env = "DOOR_LISTEN", value_delimiter = ',', global = true)]
    listen: Vec<String>,
    /// Address to serve on whose connections must start with a PROXY protocol v1/v2 header from a
    /// trusted proxy (repeatable or comma-separated; with --listen, replaces the file's listen).
    #[arg(
        long,
        env = "DOOR_LISTEN_PROXY_PROTOCOL",
        value_delimiter = ',',
        global = true
    )]
    listen_proxy_protocol: Vec<String>,
    /// The application: http://host:port. Default http://127.0.0.1:3000.
    #[arg(long, env = "DOOR_UPSTREAM", global = true)]
    upstream: Option<String>,
    /// Admin status address, or "off". Default 127.0.0.1:9901.
    #[arg(long, env = "DOOR_ADMIN_LISTEN", global = true)]
    admin_listen: Option<String>,
    /// Trusted proxy CIDR (repeatable or comma-separated); a /0 is refused.
    #[arg(
        long = "trusted-proxy",
        env = "DOOR_TRUSTED_PROXIES",
        value_delimiter = ',',
        global = true
    )]
    trusted_proxies: Vec<String>,
    /// Authoritative header when a trusted proxy sends both: x-forwarded-for or forwarded.
    #[arg(long, env = "DOOR_FORWARDED_HEADER", global = true)]
    forwarded_header: Option<String>,
    /// Shadow mode: admit everything, count what would have been refused.
    #[arg(long, env = "DOOR_DISABLE_ANON_ROUTE_LIMITS", global = true, num_args = 0..=1, default_missing_value = "true")]
    disable_anon_route_limits: Option<bool>,
    /// Interface the XDP program attaches to.
    #[arg(long, env = "DOOR_XDP_INTERFACE", global = true)]
    xdp_interface: Option<String>,
    /// XDP attach mode: auto, driver, skb or off.
    #[arg(long, env = "DOOR_XDP_MODE", global = true)]
    xdp_mode: Option<String>,
    /// TLS certificate chain (PEM); needs --tls-key.
    #[arg(long, env = "DOOR_TLS_CERT", global = true)]
    tls_cert: Option<String>,
    /// TLS private key (PEM: PKCS#8, PKCS#1 or SEC1); needs --tls-cert.
    #[arg(long, env = "DOOR_TLS_KEY", global = true)]
    tls_key: Option<String>,
    /// Lowest TLS version: 1.2 or 1.3. Default 1.2.
    #[arg(long, env = "DOOR_TLS_MIN_VERSION", global = true)]
    tls_min_version: Option<String>,
    /// Time for a request head to arrive (e.g. 10s). Default 10s.
    #[arg(long, env = "DOOR_HEADER_READ_TIMEOUT", global = true)]
    header_read_timeout: Option<String>,
    /// Close connections with no request in flight for this long. Default 60s.
    #[arg(long, env = "DOOR_IDLE_TIMEOUT", global = true)]
    idle_timeout: Option<String>,
    /// Grace period for in-flight requests after SIGTERM. Default 10s.
    #[arg(long, env = "DOOR_DRAIN_GRACE", global = true)]
    drain_grace: Option<String>,
    /// Time for the upstream's response head before a 504. Default 30s.
    #[arg(long, env = "DOOR_UPSTREAM_TIMEOUT", global = true)]
    upstream_timeout: Option<String>,
    /// Send RateLimit-Policy and RateLimit fields on limited routes. Default true.
    #[arg(long, env = "DOOR_RATELIMIT_HEADERS", global = true, num_args = 0..=1, default_missing_value = "true")]
    ratelimit_headers: Option<bool>,
    /// OTLP/HTTP collector base URL (e.g. http://127.0.0.1:4318); OTEL_EXPORTER_OTLP_* also work.
    #[arg(long, env = "DOOR_OTLP_ENDPOINT", global = true)]
    otlp_endpoint: Option<String>,
    /// OTLP export interval (e.g. 10s). Default 10s.
    #[arg(long, env = "DOOR_OTLP_INTERVAL", global = true)]
    otlp_interval: Option<String>,
}

impl Settings {
    fn overrides(&self) -> Overrides {
        let non_empty = |v: &Vec<String>| (!v.is_empty()).then(|| v.clone());
        Overrides {
            listen: non_empty(&self.listen),
            listen_proxy_protocol: non_empty(&self.listen_proxy_protocol),
            upstream: self.upstream.clone(),
            admin_listen: self.admin_listen.clone(),
            trusted_proxies: non_empty(&self.trusted_proxies),
            forwarded_header: self.forwarded_header.clone(),
            disable_anon_route_limits: self.disable_anon_route_limits,
            xdp_interface: self.xdp_interface.clone(),
            xdp_mode: self.xdp_mode.clone(),
            tls_cert: self.tls_cert.clone(),
            tls_key: self.tls_key.clone(),
            tls_min_version: self.tls_min_version.clone(),
            header_read_timeout: self.header_read_timeout.clone(),
            idle_timeout: self.idle_timeout.clone(),
            drain_grace: self.drain_grace.clone(),
            upstream_timeout: self.upstream_timeout.clone(),
            ratelimit_headers: self.ratelimit_headers,
            otlp_endpoint: self.otlp_endpoint.clone(),
            otlp_interval: self.otlp_interval.clone(),
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    door_daemon::obs::logging::init();
    match run(&cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("door: {e:#}");
            ExitCode::from(2)
        }
    }
}

/// `door check-config`: the effective configuration as TOML door accepts back (defaults filled
/// in, secrets elided), then a comment saying it is valid.
fn print_effective_config(config: &Config) {
    println!("# door: effective configuration (flags, DOOR_* variables, file, defaults)");
    print!("{}", config.to_toml());
    println!("\n# configuration OK");
}

fn run(cli: &Cli) -> anyhow::Result<()> {
    let config = Config::load(cli.settings.config.as_deref(), &cli.settings.overrides())
        .context("invalid configuration")?;
    match &cli.command {
        Some(Command::CheckConfig) => {
            print_effective_config(&config);
            Ok(())
        }
        Some(Command::Key {
            peer,
            xff,
            forwarded,
        }) => {
            let mut headers = http::HeaderMap::new();
            for (name, lines) in [("x-forwarded-for", xff), ("forwarded", forwarded)] {
                for line in lines {
                    let value = http::HeaderValue::from_str(line).with_context(|| {
                        format!("--{name} {line:?} is not a valid header value")
                    })?;
                    headers.append(name, value);
                }
            }
            let d = door_daemon::client::key::client_key(
                *peer,
                &headers,
                &config.trusted_proxies,
                config.forwarded_header,
            );
            println!("{}", d.key);
            println!("{d}");
            if d.ignored_untrusted_xff {
                println!(
                    "note: the peer is a local or private address that is not in trusted_proxies; its forwarding headers were ignored"
                );
            }
            Ok(())
        }
        None => {
            if door_daemon::shield::PROGRAM.is_empty() {
                tracing::warn!(
                    "this binary was built with AYA_BUILD_SKIP=1: it has no XDP program"
                );
            }
            let telemetry = door_daemon::obs::otlp::Telemetry::init(&config.otlp)?;
            if telemetry.exporting() {
                tracing::info!("exporting metrics over OTLP/HTTP");
            }
            let metrics = door_daemon::obs::metrics::Metrics::new(&telemetry.meter());
            let runtime = tokio::runtime::Runtime::new().context("starting the tokio runtime")?;
            let path = cli.settings.config.clone();
            let overrides = cli.settings.overrides();
            let reload: door_daemon::daemon::Reloader =
                Box::new(move || Config::load(path.as_deref(), &overrides));
            let served = runtime.block_on(door_daemon::daemon::run(config, metrics, reload));
            drop(runtime);
            telemetry.shutdown(std::time::Duration::from_secs(5));
            served?;
            Ok(())
        }
    }
}
