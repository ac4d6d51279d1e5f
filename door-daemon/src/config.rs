//! door's configuration: the TOML file of ../shared/DESIGN.md ("Configuration"), overridden by
//! flags and `DOOR_*` environment variables (flag, then env, then file, then default), validated
//! into a [`Config`] before anything is bound.
//!
//! Every error names the offending key and value (`group.link.rate = -1: must be a positive
//! number of tokens per second`); unknown keys are errors too, so a typo never silently falls
//! back to a default.

use std::{
    collections::BTreeMap,
    fmt,
    net::SocketAddr,
    path::{Path, PathBuf},
    time::Duration,
};

use http::uri::{Authority, Scheme, Uri};
use ipnet::IpNet;
use serde::Deserialize;
use thiserror::Error;

use crate::{
    key::{ForwardedSource, TrustedProxies},
    limit::{Budget, Charge},
    route::Route,
};

/// Default `listen`: all addresses, port 8443.
pub const DEFAULT_LISTEN: &str = "[::]:8443";
/// Default `upstream`.
pub const DEFAULT_UPSTREAM: &str = "http://127.0.0.1:3000";
/// Default `admin_listen` (loopback only).
pub const DEFAULT_ADMIN_LISTEN: &str = "127.0.0.1:9901";
/// Default `[xdp] syn_rate`, SYNs per second per prefix.
pub const DEFAULT_SYN_RATE: f64 = 100.0;
/// Default `[xdp] syn_burst`, SYNs.
pub const DEFAULT_SYN_BURST: u32 = 200;
/// Default `[xdp] ports`: HTTPS.
pub const DEFAULT_PORTS: [u16; 1] = [443];
/// Default `[xdp] new_prefix_rate`, new prefixes per second.
pub const DEFAULT_NEW_PREFIX_RATE: f64 = 1_000.0;
/// Default `[xdp] new_prefix_burst`, new prefixes.
pub const DEFAULT_NEW_PREFIX_BURST: u32 = 10_000;
/// Default `[xdp] escalate_window`.
pub const DEFAULT_ESCALATE_WINDOW: Duration = Duration::from_secs(10);
/// Default `[xdp] block_for`.
pub const DEFAULT_BLOCK_FOR: Duration = Duration::from_mins(1);

/// `per_client` of a group that is not one of the defaults, when the file does not give it.
pub const NEW_GROUP_PER_CLIENT: u32 = 16;
/// `inflight` (group cap) of a group that is not one of the defaults, when the file does not
/// give it.
pub const NEW_GROUP_INFLIGHT: u32 = 64;

/// A configuration that cannot be used. Each variant's message names the key and the value.
#[derive(Debug, Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("reading {path}: {source}")]
    Read {
        /// The configuration file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file is not valid TOML for door (syntax error, unknown key, wrong type); the message
    /// shows the key and the line.
    #[error("{path}: {message}")]
    Parse {
        /// The configuration file.
        path: PathBuf,
        /// The parser's message, with the key, value and location.
        message: String,
    },
    /// A key has a value door cannot use.
    #[error("{key} = {value}: {reason}")]
    Invalid {
        /// The key, as a dotted path (`group.link.rate`, `route[1].path`).
        key: String,
        /// The offending value, as written.
        value: String,
        /// What is wrong with it.
        reason: String,
    },
}

fn invalid(
    key: impl Into<String>,
    value: impl fmt::Display,
    reason: impl Into<String>,
) -> ConfigError {
    ConfigError::Invalid {
        key: key.into(),
        value: value.to_string(),
        reason: reason.into(),
    }
}

/// How the XDP program is attached (`[xdp] mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum XdpMode {
    /// Try driver (native) mode, then generic (skb) mode; if both fail, keep serving at layer 7
    /// and log why.
    Auto,
    /// Native XDP in the driver; failing to attach is fatal.
    Driver,
    /// Generic XDP in the kernel's stack; failing to attach is fatal.
    Skb,
    /// No XDP program.
    Off,
}

impl XdpMode {
    /// Parses `auto|driver|skb|off`.
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] naming `xdp.mode` for anything else.
    pub fn parse(s: &str) -> Result<Self, ConfigError> {
        match s {
            "auto" => Ok(Self::Auto),
            "driver" => Ok(Self::Driver),
            "skb" => Ok(Self::Skb),
            "off" => Ok(Self::Off),
            _ => Err(invalid(
                "xdp.mode",
                format!("{s:?}"),
                "must be auto, driver, skb or off",
            )),
        }
    }

    /// `auto`, `driver`, `skb` or `off`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Auto => "auto",
            Self::Driver => "driver",
            Self::Skb => "skb",
            Self::Off => "off",
        }
    }
}

/// The flood shield's settings (`[xdp]`).
#[derive(Debug, Clone, PartialEq)]
pub struct XdpConfig {
    /// Interface to attach to; required unless `mode` is `off`.
    pub interface: Option<String>,
    /// Attach mode. Default: `off` without an `[xdp]` section, `auto` with one.
    pub mode: XdpMode,
    /// SYNs per second per source prefix. Default 100.
    pub syn_rate: f64,
    /// SYN burst per source prefix. Default 200.
    pub syn_burst: u32,
    /// Protected destination ports; empty means all. Default `[443]`.
    pub ports: Vec<u16>,
    /// Churn guard: new source prefixes per second that get their own entry; above it, new
    /// prefixes share one overflow bucket. 0 turns the guard off. Default 1000.
    pub new_prefix_rate: f64,
    /// Churn guard burst, new prefixes. Default 10,000.
    pub new_prefix_burst: u32,
    /// Operator allowlist: CIDRs the shield never sheds (trusted proxies are always exempt too).
    /// Default none.
    pub allow: Vec<IpNet>,
    /// 429s from one TCP-peer key within `escalate_window` that put it on the XDP blocklist;
    /// 0 (the default) turns escalation off.
    pub escalate_after: u32,
    /// Window for `escalate_after`. Default 10 s.
    pub escalate_window: Duration,
    /// How long an escalated key's SYNs are dropped. Default 60 s.
    pub block_for: Duration,
}

/// One limit group: its budget and its body read timeout.
#[derive(Debug, Clone, PartialEq)]
pub struct GroupConfig {
    /// Rates, burst, caps, table size and charge policy.
    pub budget: Budget,
    /// How long a limited request's body may take to arrive. Default: webhook 10 s, others 30 s.
    pub read_timeout: Duration,
}

/// The upstream application: `http://host:port`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Upstream {
    /// `http`.
    pub scheme: Scheme,
    /// `host:port`.
    pub authority: Authority,
}

impl fmt::Display for Upstream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}://{}", self.scheme, self.authority)
    }
}

impl Upstream {
    /// Parses an upstream URL: `http://host[:port]`, no path, query or credentials.
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] naming `upstream` otherwise.
    pub fn parse(s: &str) -> Result<Self, ConfigError> {
        let bad = |reason: &str| invalid("upstream", format!("{s:?}"), reason);
        let uri: Uri = s.parse().map_err(|e| bad(&format!("not a URL ({e})")))?;
        let scheme = uri
            .scheme()
            .cloned()
            .ok_or_else(|| bad("needs a scheme: http://host:port"))?;
        if scheme != Scheme::HTTP {
            return Err(bad("only http:// upstreams are supported"));
        }
        let authority = uri
            .authority()
            .cloned()
            .ok_or_else(|| bad("needs a host"))?;
        if authority.as_str().contains('@') {
            return Err(bad("must not carry credentials"));
        }
        if uri.path_and_query().is_some_and(|pq| pq.as_str() != "/") {
            return Err(bad("must not have a path or query"));
        }
        Ok(Self { scheme, authority })
    }
}

/// The validated, effective configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// Addresses to serve on. Default `[::]:8443`.
    pub listen: Vec<SocketAddr>,
    /// The application behind door. Default `http://127.0.0.1:3000`.
    pub upstream: Upstream,
    /// Where `GET /status` is served; `None` disables it. Default `127.0.0.1:9901`.
    pub admin_listen: Option<SocketAddr>,
    /// Proxies whose forwarding headers are believed. Default: none.
    pub trusted_proxies: TrustedProxies,
    /// Which header is authoritative when a trusted proxy sends both `X-Forwarded-For` and
    /// `Forwarded` (`forwarded_header = "x-forwarded-for" | "forwarded"`). Default
    /// `x-forwarded-for`, as the seed.
    pub forwarded_header: ForwardedSource,
    /// Shadow mode: admit everything, count what would have been refused. Default `false`.
    pub disable_anon_route_limits: bool,
    /// Route table, first match wins.
    pub routes: Vec<Route>,
    /// Limit groups by name: the defaults (webhook, link, health) merged with `[group.NAME]`.
    pub groups: BTreeMap<String, GroupConfig>,
    /// The flood shield.
    pub xdp: XdpConfig,
}

/// Settings given as flags or environment variables; each beats the file.
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    /// `--listen` / `DOOR_LISTEN`.
    pub listen: Option<Vec<String>>,
    /// `--upstream` / `DOOR_UPSTREAM`.
    pub upstream: Option<String>,
    /// `--admin-listen` / `DOOR_ADMIN_LISTEN` (`off` disables it).
    pub admin_listen: Option<String>,
    /// `--trusted-proxy` / `DOOR_TRUSTED_PROXIES`.
    pub trusted_proxies: Option<Vec<String>>,
    /// `--forwarded-header` / `DOOR_FORWARDED_HEADER`.
    pub forwarded_header: Option<String>,
    /// `--disable-anon-route-limits` / `DOOR_DISABLE_ANON_ROUTE_LIMITS`.
    pub disable_anon_route_limits: Option<bool>,
    /// `--xdp-interface` / `DOOR_XDP_INTERFACE`.
    pub xdp_interface: Option<String>,
    /// `--xdp-mode` / `DOOR_XDP_MODE`.
    pub xdp_mode: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    listen: Option<Vec<String>>,
    upstream: Option<String>,
    trusted_proxies: Option<Vec<String>>,
    forwarded_header: Option<String>,
    disable_anon_route_limits: Option<bool>,
    admin_listen: Option<String>,
    #[serde(default)]
    route: Vec<RouteFile>,
    #[serde(default)]
    group: BTreeMap<String, GroupFile>,
    xdp: Option<XdpFile>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RouteFile {
    group: String,
    #[serde(default)]
    methods: Vec<String>,
    path: String,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct GroupFile {
    rate: Option<f64>,
    burst: Option<i64>,
    per_client: Option<i64>,
    inflight: Option<i64>,
    max_clients: Option<i64>,
    read_timeout: Option<String>,
    charge: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct XdpFile {
    interface: Option<String>,
    mode: Option<String>,
    syn_rate: Option<f64>,
    syn_burst: Option<i64>,
    ports: Option<Vec<i64>>,
    new_prefix_rate: Option<f64>,
    new_prefix_burst: Option<i64>,
    allow: Option<Vec<String>>,
    escalate_after: Option<i64>,
    escalate_window: Option<String>,
    block_for: Option<String>,
}

impl Config {
    /// Reads `path` (if any), applies `overrides`, fills in defaults and validates.
    ///
    /// # Errors
    /// [`ConfigError`] naming the file, key and value at fault.
    pub fn load(path: Option<&Path>, overrides: &Overrides) -> Result<Self, ConfigError> {
        let file = match path {
            Some(path) => {
                let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
                    path: path.to_owned(),
                    source,
                })?;
                toml::from_str::<File>(&text).map_err(|e| ConfigError::Parse {
                    path: path.to_owned(),
                    message: e.to_string().trim_end().to_owned(),
                })?
            }
            None => File::default(),
        };
        Self::build(file, overrides)
    }

    /// Parses a configuration from TOML text (as if read from `name`) with no overrides.
    ///
    /// # Errors
    /// As [`Config::load`].
    pub fn from_toml(name: &str, text: &str) -> Result<Self, ConfigError> {
        let file = toml::from_str::<File>(text).map_err(|e| ConfigError::Parse {
            path: PathBuf::from(name),
            message: e.to_string().trim_end().to_owned(),
        })?;
        Self::build(file, &Overrides::default())
    }

    fn build(file: File, o: &Overrides) -> Result<Self, ConfigError> {
        let listen_raw = o
            .listen
            .clone()
            .or(file.listen)
            .unwrap_or_else(|| vec![DEFAULT_LISTEN.to_owned()]);
        let mut listen = Vec::new();
        for (i, raw) in listen_raw.iter().flat_map(|s| s.split(',')).enumerate() {
            let raw = raw.trim();
            listen.push(raw.parse::<SocketAddr>().map_err(|_| {
                invalid(
                    format!("listen[{i}]"),
                    format!("{raw:?}"),
                    "not a socket address (ip:port, [v6]:port)",
                )
            })?);
        }
        if listen.is_empty() {
            return Err(invalid("listen", "[]", "needs at least one address"));
        }

        let upstream = Upstream::parse(
            o.upstream
                .as_deref()
                .or(file.upstream.as_deref())
                .unwrap_or(DEFAULT_UPSTREAM),
        )?;

        let admin_raw = o
            .admin_listen
            .clone()
            .or(file.admin_listen)
            .unwrap_or_else(|| DEFAULT_ADMIN_LISTEN.to_owned());
        let admin_listen = if admin_raw == "off" {
            None
        } else {
            Some(admin_raw.parse::<SocketAddr>().map_err(|_| {
                invalid(
                    "admin_listen",
                    format!("{admin_raw:?}"),
                    "not a socket address (or \"off\")",
                )
            })?)
        };

        let trusted_raw = o
            .trusted_proxies
            .clone()
            .or(file.trusted_proxies)
            .unwrap_or_default();
        let trusted_proxies = parse_cidrs("trusted_proxies", &trusted_raw)?;
        let forwarded_raw = o.forwarded_header.clone().or(file.forwarded_header);
        let forwarded_header = match forwarded_raw {
            Some(h) => h.parse::<ForwardedSource>().map_err(|_| {
                invalid(
                    "forwarded_header",
                    format!("{h:?}"),
                    "must be \"x-forwarded-for\" or \"forwarded\"",
                )
            })?,
            None => ForwardedSource::default(),
        };

        let disable_anon_route_limits = o
            .disable_anon_route_limits
            .or(file.disable_anon_route_limits)
            .unwrap_or(false);

        let groups = build_groups(file.group)?;

        let mut routes = Vec::new();
        for (i, r) in file.route.into_iter().enumerate() {
            if !groups.contains_key(&r.group) {
                let known: Vec<&str> = groups.keys().map(String::as_str).collect();
                return Err(invalid(
                    format!("route[{i}].group"),
                    format!("{:?}", r.group),
                    format!("unknown group (known: {})", known.join(", ")),
                ));
            }
            let route = Route::new(&r.group, &r.methods, &r.path).map_err(|e| {
                invalid(
                    format!("route[{i}]"),
                    format!("{:?}", r.path),
                    e.to_string(),
                )
            })?;
            routes.push(route);
        }

        let xdp = build_xdp(file.xdp, o)?;

        Ok(Self {
            listen,
            upstream,
            admin_listen,
            trusted_proxies,
            forwarded_header,
            disable_anon_route_limits,
            routes,
            groups,
            xdp,
        })
    }
}

/// Parses a CIDR list for `key` (each entry may itself be comma-separated; a bare address is a
/// /32 or /128) with [`TrustedProxies::parse_list`]'s checks: a /0 or host bits set are errors.
fn parse_cidrs(key: &str, raw: &[String]) -> Result<TrustedProxies, ConfigError> {
    TrustedProxies::parse_list(&raw.join(",")).map_err(|e| {
        let value = match &e {
            crate::key::KeyError::BadCidr { value }
            | crate::key::KeyError::ZeroPrefix { value }
            | crate::key::KeyError::HostBitsSet { value, .. }
            | crate::key::KeyError::BadSource { value } => value.clone(),
        };
        invalid(key, format!("{value:?}"), e.to_string())
    })
}

fn default_groups() -> BTreeMap<String, GroupConfig> {
    BTreeMap::from([
        (
            "webhook".to_owned(),
            GroupConfig {
                budget: Budget::webhook(),
                read_timeout: Duration::from_secs(10),
            },
        ),
        (
            "link".to_owned(),
            GroupConfig {
                budget: Budget::link(),
                read_timeout: Duration::from_secs(30),
            },
        ),
        (
            "health".to_owned(),
            GroupConfig {
                budget: Budget::health(),
                read_timeout: Duration::from_secs(30),
            },
        ),
    ])
}

fn build_groups(
    files: BTreeMap<String, GroupFile>,
) -> Result<BTreeMap<String, GroupConfig>, ConfigError> {
    let mut groups = default_groups();
    for (name, g) in files {
        let key = |k: &str| format!("group.{name}.{k}");
        let mut cfg = if let Some(existing) = groups.get(&name) {
            existing.clone()
        } else {
            {
                let (Some(rate), Some(_)) = (g.rate, g.burst) else {
                    return Err(invalid(
                        format!("group.{name}"),
                        "{…}",
                        "a new group must give at least rate and burst",
                    ));
                };
                GroupConfig {
                    budget: Budget {
                        rate,
                        burst: 1,
                        per_client: NEW_GROUP_PER_CLIENT,
                        inflight: NEW_GROUP_INFLIGHT,
                        max_clients: 16_384,
                        charge: Charge::Always,
                    },
                    read_timeout: Duration::from_secs(30),
                }
            }
        };
        let b = &mut cfg.budget;
        if let Some(rate) = g.rate {
            b.rate = rate;
        }
        if let Some(v) = g.burst {
            b.burst = positive_u32(&key("burst"), v)?;
        }
        if let Some(v) = g.per_client {
            b.per_client = positive_u32(&key("per_client"), v)?;
        }
        if let Some(v) = g.inflight {
            b.inflight = positive_u32(&key("inflight"), v)?;
        }
        if let Some(v) = g.max_clients {
            b.max_clients = usize::try_from(positive_u32(&key("max_clients"), v)?)
                .map_err(|_| invalid(key("max_clients"), v, "too large"))?;
        }
        if let Some(c) = &g.charge {
            b.charge = match c.as_str() {
                "always" => Charge::Always,
                "on_failure" => Charge::OnFailure,
                _ => {
                    return Err(invalid(
                        key("charge"),
                        format!("{c:?}"),
                        "must be \"always\" or \"on_failure\"",
                    ));
                }
            };
        }
        b.validate(&name).map_err(|e| ConfigError::Invalid {
            key: e.key,
            value: e.value,
            reason: e.reason,
        })?;
        if let Some(t) = &g.read_timeout {
            cfg.read_timeout = parse_duration(&key("read_timeout"), t)?;
        }
        groups.insert(name, cfg);
    }
    Ok(groups)
}

fn positive_u32(key: &str, v: i64) -> Result<u32, ConfigError> {
    u32::try_from(v)
        .ok()
        .filter(|v| *v > 0)
        .ok_or_else(|| invalid(key, v, "must be a whole number from 1 to 4294967295"))
}

/// Parses a duration such as `"30s"`, `"1500ms"` or `"2m"` (humantime syntax); zero is refused.
fn parse_duration(key: &str, s: &str) -> Result<Duration, ConfigError> {
    let d = humantime::parse_duration(s).map_err(|e| {
        invalid(
            key,
            format!("{s:?}"),
            format!("not a duration like \"30s\" ({e})"),
        )
    })?;
    if d.is_zero() {
        return Err(invalid(key, format!("{s:?}"), "must be longer than zero"));
    }
    Ok(d)
}

fn build_xdp(file: Option<XdpFile>, o: &Overrides) -> Result<XdpConfig, ConfigError> {
    let section = file.is_some();
    let f = file.unwrap_or_default();
    let mode = match o.xdp_mode.as_deref().or(f.mode.as_deref()) {
        Some(m) => XdpMode::parse(m)?,
        None if section || o.xdp_interface.is_some() => XdpMode::Auto,
        None => XdpMode::Off,
    };
    let interface = o.xdp_interface.clone().or(f.interface);
    if mode != XdpMode::Off {
        match &interface {
            None => {
                return Err(invalid(
                    "xdp.interface",
                    "(none)",
                    format!("required with xdp.mode = {:?}", mode.as_str()),
                ));
            }
            Some(i) if i.is_empty() || i.len() >= 16 || i.contains(['/', ' ', '\0']) => {
                return Err(invalid(
                    "xdp.interface",
                    format!("{i:?}"),
                    "not an interface name",
                ));
            }
            Some(_) => {}
        }
    }
    let syn_rate = f.syn_rate.unwrap_or(DEFAULT_SYN_RATE);
    if !(syn_rate.is_finite() && syn_rate > 0.0) {
        return Err(invalid(
            "xdp.syn_rate",
            syn_rate,
            "must be a positive number of SYNs per second",
        ));
    }
    let syn_burst = match f.syn_burst {
        Some(v) => positive_u32("xdp.syn_burst", v)?,
        None => DEFAULT_SYN_BURST,
    };
    let ports = match f.ports {
        Some(ports) => ports
            .into_iter()
            .enumerate()
            .map(|(i, p)| {
                u16::try_from(p).ok().filter(|p| *p > 0).ok_or_else(|| {
                    invalid(format!("xdp.ports[{i}]"), p, "not a TCP port (1-65535)")
                })
            })
            .collect::<Result<Vec<_>, _>>()?,
        None => DEFAULT_PORTS.to_vec(),
    };
    let new_prefix_rate = f.new_prefix_rate.unwrap_or(DEFAULT_NEW_PREFIX_RATE);
    if !(new_prefix_rate.is_finite() && new_prefix_rate >= 0.0) {
        return Err(invalid(
            "xdp.new_prefix_rate",
            new_prefix_rate,
            "must be a number of new prefixes per second, 0 to turn the guard off",
        ));
    }
    let new_prefix_burst = match f.new_prefix_burst {
        Some(v) => positive_u32("xdp.new_prefix_burst", v)?,
        None => DEFAULT_NEW_PREFIX_BURST,
    };
    let allow = parse_cidrs("xdp.allow", &f.allow.unwrap_or_default())?
        .nets()
        .to_vec();
    let escalate_after = match f.escalate_after {
        Some(0) | None => 0,
        Some(v) => positive_u32("xdp.escalate_after", v)?,
    };
    let escalate_window = match &f.escalate_window {
        Some(s) => parse_duration("xdp.escalate_window", s)?,
        None => DEFAULT_ESCALATE_WINDOW,
    };
    let block_for = match &f.block_for {
        Some(s) => parse_duration("xdp.block_for", s)?,
        None => DEFAULT_BLOCK_FOR,
    };
    Ok(XdpConfig {
        interface,
        mode,
        syn_rate,
        syn_burst,
        ports,
        new_prefix_rate,
        new_prefix_burst,
        allow,
        escalate_after,
        escalate_window,
        block_for,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(text: &str) -> String {
        Config::from_toml("door.toml", text)
            .unwrap_err()
            .to_string()
    }

    const EXAMPLE: &str = r#"
listen = ["[::]:8443", "127.0.0.1:8080"]
upstream = "http://127.0.0.1:3000"
trusted_proxies = ["192.0.2.10/32"]
admin_listen = "127.0.0.1:9901"

[[route]]
group = "webhook"
methods = ["POST"]
path = "/webhooks/github"
[[route]]
group = "link"
methods = ["GET"]
path = "/l/session/{id}"
[[route]]
group = "health"
path = "/healthz"

[group.link]
rate = 2.5
burst = 5
read_timeout = "15s"

[xdp]
interface = "lo"
mode = "skb"
ports = [8443]
"#;

    #[test]
    fn the_design_example_parses_with_defaults_filled_in() {
        let c = Config::from_toml("door.toml", EXAMPLE).unwrap();
        assert_eq!(c.listen.len(), 2);
        assert_eq!(c.upstream.to_string(), "http://127.0.0.1:3000");
        assert_eq!(c.routes.len(), 3);
        let link = &c.groups["link"];
        assert!((link.budget.rate - 2.5).abs() < f64::EPSILON);
        assert_eq!(link.budget.burst, 5);
        assert_eq!(
            link.budget.per_client, 2,
            "unset keys keep the group's default"
        );
        assert_eq!(link.read_timeout, Duration::from_secs(15));
        assert_eq!(c.groups["webhook"].budget, Budget::webhook());
        assert_eq!(c.groups["webhook"].read_timeout, Duration::from_secs(10));
        assert_eq!(c.xdp.mode, XdpMode::Skb);
        assert_eq!(c.xdp.ports, vec![8443]);
        assert_eq!(c.xdp.syn_burst, DEFAULT_SYN_BURST);
    }

    #[test]
    fn defaults_without_a_file() {
        let c = Config::load(None, &Overrides::default()).unwrap();
        assert_eq!(
            c.listen,
            vec![DEFAULT_LISTEN.parse::<SocketAddr>().unwrap()]
        );
        assert_eq!(c.admin_listen, Some(DEFAULT_ADMIN_LISTEN.parse().unwrap()));
        assert_eq!(c.xdp.mode, XdpMode::Off);
        assert!(c.routes.is_empty());
        assert!(!c.disable_anon_route_limits);
    }

    #[test]
    fn overrides_beat_the_file() {
        let dir = std::env::temp_dir().join(format!("door-config-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("door.toml");
        std::fs::write(&path, EXAMPLE).unwrap();
        let o = Overrides {
            listen: Some(vec!["127.0.0.1:1,127.0.0.1:2".into()]),
            upstream: Some("http://[::1]:9".into()),
            xdp_mode: Some("off".into()),
            ..Overrides::default()
        };
        let c = Config::load(Some(&path), &o).unwrap();
        assert_eq!(c.listen.len(), 2);
        assert_eq!(c.listen[1].port(), 2);
        assert_eq!(c.upstream.to_string(), "http://[::1]:9");
        assert_eq!(c.xdp.mode, XdpMode::Off);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn unknown_keys_are_named() {
        let e = err("lisen = [\"[::]:1\"]");
        assert!(e.contains("lisen"), "{e}");
        let e = err("[group.link]\nrat = 1.0");
        assert!(e.contains("rat"), "{e}");
        let e = err("[tls]\ncert = \"x\"");
        assert!(e.contains("tls"), "{e}");
    }

    #[test]
    fn bad_addresses_are_named() {
        assert_eq!(
            err("listen = [\"8443\"]"),
            "listen[0] = \"8443\": not a socket address (ip:port, [v6]:port)"
        );
        assert!(
            err("admin_listen = \"localhost:1\"").starts_with("admin_listen = \"localhost:1\"")
        );
        assert!(err("upstream = \"https://x:1\"").starts_with("upstream = \"https://x:1\""));
        assert!(err("upstream = \"http://x:1/app\"").contains("path"));
        assert!(err("upstream = \"127.0.0.1:3000\"").starts_with("upstream = \"127.0.0.1:3000\""));
    }

    #[test]
    fn bad_cidrs_are_named() {
        assert!(
            err("trusted_proxies = [\"0.0.0.0/0\"]")
                .starts_with("trusted_proxies = \"0.0.0.0/0\": a /0 covers every address")
        );
        assert!(err("trusted_proxies = [\"::/0\"]").contains("/0"));
        assert!(
            err("trusted_proxies = [\"192.0.2.1/24\"]")
                .contains("host bits set (did you mean 192.0.2.0/24?)")
        );
        assert!(
            err("trusted_proxies = [\"192.0.2.300/32\"]")
                .starts_with("trusted_proxies = \"192.0.2.300/32\": not an IP address or CIDR")
        );
        let c =
            Config::from_toml("t", "trusted_proxies = [\"192.0.2.10, 2001:db8::/64\"]").unwrap();
        assert_eq!(c.trusted_proxies.nets().len(), 2);
        assert_eq!(c.trusted_proxies.nets()[0].prefix_len(), 32);
        assert!(
            c.trusted_proxies
                .contains("::ffff:192.0.2.10".parse().unwrap())
        );
    }

    #[test]
    fn unknown_groups_are_named() {
        let e = err("[[route]]\ngroup = \"linkk\"\npath = \"/x\"");
        assert_eq!(
            e,
            "route[0].group = \"linkk\": unknown group (known: health, link, webhook)"
        );
    }

    #[test]
    fn bad_durations_are_named() {
        assert!(
            err("[group.link]\nread_timeout = \"30 parsecs\"")
                .starts_with("group.link.read_timeout = \"30 parsecs\": not a duration")
        );
        assert!(err("[group.link]\nread_timeout = \"0s\"").contains("longer than zero"));
    }

    #[test]
    fn bad_budgets_are_named() {
        assert!(
            err("[group.link]\nrate = -1.0")
                .starts_with("group.link.rate = -1: must be a positive")
        );
        assert!(err("[group.link]\nrate = 0.0").starts_with("group.link.rate = 0"));
        assert!(err("[group.link]\nburst = 0").starts_with("group.link.burst = 0"));
        assert!(err("[group.link]\ninflight = 0").starts_with("group.link.inflight = 0"));
        assert!(
            err("[group.link]\nper_client = 5")
                .starts_with("group.link.per_client = 5: exceeds group.link.inflight = 4")
        );
        assert!(
            err("[group.link]\ncharge = \"sometimes\"")
                .starts_with("group.link.charge = \"sometimes\"")
        );
        assert!(
            err("[group.api]\nrate = 1.0").contains("new group must give at least rate and burst")
        );
        let c = Config::from_toml("t", "[group.api]\nrate = 3.0\nburst = 7").unwrap();
        assert_eq!(c.groups["api"].budget.burst, 7);
    }

    #[test]
    fn bad_xdp_settings_are_named() {
        assert!(err("[xdp]\nmode = \"auto\"").starts_with("xdp.interface = (none): required"));
        assert!(
            err("[xdp]\ninterface = \"lo\"\nmode = \"turbo\"").starts_with("xdp.mode = \"turbo\"")
        );
        assert!(
            err("[xdp]\ninterface = \"lo\"\nports = [70000]").starts_with("xdp.ports[0] = 70000")
        );
        assert!(err("[xdp]\ninterface = \"lo\"\nsyn_rate = -5.0").starts_with("xdp.syn_rate = -5"));
        let c = Config::from_toml("t", "[xdp]\nmode = \"off\"").unwrap();
        assert_eq!(c.xdp.mode, XdpMode::Off);
    }
}
