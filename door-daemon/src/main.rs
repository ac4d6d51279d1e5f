//! The `door` binary: parses flags (with `DOOR_*` environment fallbacks), loads and validates
//! the configuration before binding anything, and runs the daemon.

use std::{path::PathBuf, process::ExitCode};

use anyhow::Context as _;
use clap::{Args, Parser, Subcommand};
use door_daemon::config::{Config, Overrides};

/// door: a front door for one HTTP application.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    settings: Settings,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Validate the configuration and print the effective settings.
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
}

impl Settings {
    fn overrides(&self) -> Overrides {
        let non_empty = |v: &Vec<String>| (!v.is_empty()).then(|| v.clone());
        Overrides {
            listen: non_empty(&self.listen),
            upstream: self.upstream.clone(),
            admin_listen: self.admin_listen.clone(),
            trusted_proxies: non_empty(&self.trusted_proxies),
            forwarded_header: self.forwarded_header.clone(),
            disable_anon_route_limits: self.disable_anon_route_limits,
            xdp_interface: self.xdp_interface.clone(),
            xdp_mode: self.xdp_mode.clone(),
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    match run(&cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("door: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn run(cli: &Cli) -> anyhow::Result<()> {
    let config = Config::load(cli.settings.config.as_deref(), &cli.settings.overrides())
        .context("invalid configuration")?;
    match &cli.command {
        Some(Command::CheckConfig) => {
            println!("{config:#?}");
            println!("configuration OK");
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
            let d = door_daemon::key::client_key(
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
            if door_daemon::xdp::PROGRAM.is_empty() {
                tracing::warn!(
                    "this binary was built with AYA_BUILD_SKIP=1: it has no XDP program"
                );
            }
            let runtime = tokio::runtime::Runtime::new().context("starting the tokio runtime")?;
            runtime.block_on(door_daemon::server::run(config))?;
            Ok(())
        }
    }
}
