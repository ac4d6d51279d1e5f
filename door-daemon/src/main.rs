//! The `door` binary: parses flags (with `DOOR_*` environment fallbacks), loads and validates
//! the configuration before binding anything, and runs the daemon.

use std::{fmt::Write as _, io::Write as _, path::PathBuf, process::ExitCode};

use anyhow::Context as _;
use clap::{Args, Parser, Subcommand};
use door_daemon::config::{Config, ConfigError, EnvNamed, Overrides};

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
    /// secrets elided); exit 78 (EX_CONFIG) naming the offending key and value if it is invalid.
    CheckConfig,
    /// Print the client key a request would get, and which rule chose it (for debugging proxies).
    Key {
        // The help is an attribute, not a doc comment: rustdoc would read the bracketed IPv6
        // socket address as a link.
        #[arg(
            long,
            value_parser = peer_address,
            help = "The TCP peer's address (the proxy's, behind one): 192.0.2.10, 192.0.2.10:443, \
                    2001:db8::1, [2001:db8::1]:443 or fe80::1%eth0"
        )]
        peer: std::net::IpAddr,
        /// An X-Forwarded-For header line, as received (repeatable, in wire order).
        #[arg(long = "xff")]
        xff: Vec<String>,
        /// A Forwarded (RFC 7239) header line, as received (repeatable, in wire order).
        #[arg(long = "forwarded")]
        forwarded: Vec<String>,
        /// A Cookie header line, as received (repeatable): which request plane it is charged to.
        #[arg(long = "cookie")]
        cookie: Vec<String>,
        /// An Authorization header line, as received (e.g. "Bearer TOKEN").
        #[arg(long = "authorization")]
        authorization: Vec<String>,
    },
    /// A live view of a running door, from its admin API: per group the keys with the most
    /// rejections and spend, outcome rates, streams; XDP verdicts and top prefixes. Keys: tab or
    /// arrows switch groups, s sorts, q quits.
    Top {
        /// The admin listener: host:port, http://host:port or unix:/path. Default: admin_listen
        /// of the configuration (flags, DOOR_* variables, --config file), else 127.0.0.1:9901.
        #[arg(long)]
        admin: Option<String>,
        /// Print one plain-text table and exit (for scripts).
        #[arg(long)]
        once: bool,
    },
}

/// Settings: flag, then environment variable, then configuration file, then default.
#[derive(Debug, Args)]
struct Settings {
    /// Configuration file (TOML).
    #[arg(long, env = "DOOR_CONFIG", global = true, value_parser = EnvNamed(clap::builder::PathBufValueParser::new()))]
    config: Option<PathBuf>,
    #[command(flatten)]
    overrides: Overrides,
}

/// Exit status of a configuration error (sysexits.h `EX_CONFIG`): bad file, key, value or flag.
/// `door.service` does not restart on it; restarting cannot fix the configuration.
const EX_CONFIG: u8 = 78;

/// Exit status of every other failure (a port in use, a strict XDP attach refused, a runtime
/// error): systemd restarts door after it.
const EX_FAILURE: u8 = 1;

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) if e.use_stderr() => {
            let _ = e.print();
            return ExitCode::from(EX_CONFIG);
        }
        Err(e) => {
            // --help, --version.
            let _ = e.print();
            return ExitCode::SUCCESS;
        }
    };
    door_daemon::obs::logging::init();
    match run(&cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("door: {}", describe(&e));
            if e.chain().any(|c| {
                c.is::<ConfigError>()
                    || c.is::<UsageError>()
                    || c.downcast_ref::<door_daemon::daemon::ServeError>()
                        .is_some_and(door_daemon::daemon::ServeError::is_config)
            }) {
                ExitCode::from(EX_CONFIG)
            } else {
                ExitCode::from(EX_FAILURE)
            }
        }
    }
}

/// A bad argument to a subcommand (`door key --xff` with bytes no header can carry).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct UsageError(String);

/// `e` and its causes joined by ": ", each said once: an error whose message already ends with
/// its cause's (`binding [::]:8443: Address already in use (os error 98)`) does not repeat it.
fn describe(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if out.ends_with(&text) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&text);
    }
    out
}

/// `--peer`'s parser: an address or a socket address, canonicalised as door does a real peer.
fn peer_address(text: &str) -> Result<std::net::IpAddr, String> {
    door_daemon::client::key::parse_peer(text).ok_or_else(|| {
        "expected an IP address or socket address (192.0.2.10, 192.0.2.10:443, \
         [2001:db8::1]:443, fe80::1%eth0)"
            .to_owned()
    })
}

/// Which request plane a request with `headers` from client `key` is charged to (`door key`).
/// The session plane's key is a keyed hash with a key random per process: it means nothing
/// outside a running door and is never printed.
fn plane_line(config: &Config, headers: &http::HeaderMap, key: door_common::PrefixKey) -> String {
    use door_daemon::client::credential::{Copies, MAX_COPIES};
    let Some(planes) = &config.planes else {
        return "planes: off ([plane.session] is not set)".to_owned();
    };
    let how = planes.credential.describe();
    let copies = Copies::of(&planes.credential, headers);
    if copies.is_too_many() {
        format!(
            "refused: 400, the credential ({how}) is sent more than {MAX_COPIES} times; door \
             would have to look up every value"
        )
    } else if copies.one().is_some() {
        format!(
            "plane: ip, key {key}, while the credential ({how}) is not verified; once the \
             upstream answers a request carrying it with a status other than 401 or 403, the \
             session plane, keyed on the credential's keyed hash (random per process, never \
             printed)"
        )
    } else if copies.is_empty() {
        format!("plane: ip, key {key} (no credential: {how} not found)")
    } else if copies.len() > 1 && !copies.values().is_empty() {
        format!(
            "plane: ip, key {key} (the credential, {how}, is ambiguous: {} copies that differ; \
             nothing is verified from it, and the request goes to a session only if one of its \
             values is verified already)",
            copies.len()
        )
    } else {
        format!("plane: ip, key {key} (no credential: the {how} value is empty or not well-formed)")
    }
}

/// `door check-config`: the effective configuration as TOML door accepts back (defaults filled
/// in, secrets elided), then a comment saying it is valid.
fn print_effective_config(config: &Config) -> anyhow::Result<()> {
    let mut out =
        String::from("# door: effective configuration (flags, DOOR_* variables, file, defaults)\n");
    out.push_str(&config.to_toml());
    if config.max_connections.is_none() {
        let _ = writeln!(
            out,
            "# max_connections derived from this process's open-file limit: {}",
            config.effective_max_connections()
        );
    }
    out.push_str("\n# configuration OK\n");
    print_out(&out)
}

/// Writes `text` to standard output. A reader that went away (`door check-config | head`) ends
/// the output quietly, as it does any Unix filter's, instead of a panic.
///
/// # Errors
/// Any other failure to write.
fn print_out(text: &str) -> anyhow::Result<()> {
    let mut stdout = std::io::stdout().lock();
    match stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
    {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        result => result.context("writing to standard output"),
    }
}

/// `door top`: `--admin`, else the configuration's `admin_listen`.
fn top(cli: &Cli, admin: Option<&str>, once: bool) -> anyhow::Result<()> {
    let raw = if let Some(a) = admin {
        a.to_owned()
    } else {
        let config = Config::load(cli.settings.config.as_deref(), &cli.settings.overrides)
            .context("invalid configuration")?;
        let Some(at) = config.admin_listen else {
            return Err(UsageError(
                "admin_listen is \"off\": give door top --admin host:port or unix:/path".to_owned(),
            )
            .into());
        };
        at.to_string()
    };
    let addr = door_daemon::top::AdminAddr::parse(&raw).map_err(|e| UsageError(e.to_string()))?;
    if once {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("starting the tokio runtime")?;
        return print_out(&runtime.block_on(door_daemon::top::once(&addr))?);
    }
    door_daemon::top::live(&addr)?;
    Ok(())
}

fn run(cli: &Cli) -> anyhow::Result<()> {
    if let Some(Command::Top { admin, once }) = &cli.command {
        return top(cli, admin.as_deref(), *once);
    }
    let config = Config::load(cli.settings.config.as_deref(), &cli.settings.overrides)
        .context("invalid configuration")?;
    match &cli.command {
        Some(Command::CheckConfig) => {
            match door_daemon::daemon::preflight(&config) {
                Ok(()) => {}
                Err(e) if e.is_config() => return Err(e.into()),
                // A file this process cannot read may be readable by door's unit (a systemd
                // credential exists only while the unit runs): noted, not refused.
                Err(e) => eprintln!("door: note: {e}: not checked here; door reads it at start"),
            }
            print_effective_config(&config)
        }
        Some(Command::Key {
            peer,
            xff,
            forwarded,
            cookie,
            authorization,
        }) => {
            let mut headers = http::HeaderMap::new();
            for (flag, name, lines) in [
                ("xff", "x-forwarded-for", xff),
                ("forwarded", "forwarded", forwarded),
                ("cookie", "cookie", cookie),
                ("authorization", "authorization", authorization),
            ] {
                for line in lines {
                    let value = http::HeaderValue::from_str(line).map_err(|_| {
                        UsageError(format!("--{flag} {line:?} is not a valid header value"))
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
            let mut out = format!("{}\n{d}\n", d.key);
            if d.ignored_untrusted_xff {
                out.push_str(
                    "note: the peer is a local or private address that is not in trusted_proxies; its forwarding headers were ignored\n",
                );
            }
            out.push_str(&plane_line(&config, &headers, d.key));
            out.push('\n');
            print_out(&out)
        }
        Some(Command::Top { .. }) => Ok(()),
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
            let overrides = cli.settings.overrides.clone();
            let reload: door_daemon::daemon::Reloader =
                Box::new(move || Config::reload(path.as_deref(), &overrides));
            let served = runtime.block_on(door_daemon::daemon::run(
                config,
                metrics,
                Some(telemetry.exposition()),
                reload,
            ));
            drop(runtime);
            telemetry.shutdown(std::time::Duration::from_secs(5));
            served?;
            Ok(())
        }
    }
}
