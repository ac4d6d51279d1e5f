//! door's configuration: the TOML file of docs/design.md ("Configuration"), overridden by
//! flags and `DOOR_*` environment variables (flag, then env, then file, then default), validated
//! into a [`Config`] before anything is bound.
//!
//! Every error names the offending key and value (`group.link.rate = -1: must be a positive
//! number of tokens per second`); unknown keys are errors too, so a typo never silently falls
//! back to a default.

mod addresses;
mod durations;
mod file;
mod flags;
mod groups;
mod merge;
mod networks;
mod planes;
pub mod print;
mod reload;

pub use durations::{MAX_DURATION, MIN_DURATION};
pub use file::known_keys;
pub use flags::{EnvNamed, GroupSetting, Overrides, RouteList, RouteParser};
pub use groups::{
    GroupConfig, NEW_GROUP_INFLIGHT, NEW_GROUP_PER_CLIENT, PerClientFollows, STREAM_GROUP,
};
pub use planes::{
    DEFAULT_IP_BURST, DEFAULT_IP_RATE, DEFAULT_SESSION_BURST, DEFAULT_SESSION_RATE, IP_PLANE,
    PlanesConfig, SESSION_PLANE,
};
pub use reload::restart_only_changes;

use std::{
    collections::BTreeMap,
    fmt,
    net::SocketAddr,
    path::{Path, PathBuf},
    time::Duration,
};

use http::uri::{Authority, Scheme, Uri};
use ipnet::IpNet;
use thiserror::Error;

use crate::{
    client::key::{ForwardedSource, TrustedProxies},
    http::route::Route,
};
use durations::parse_duration;
use file::{ClusterFile, File, OtlpFile, TlsFile, XdpFile, parse_file};
use groups::{build_groups, build_routes};
use merge::written_over;
use networks::{access_list, parse_cidrs};
use planes::build_planes;

// What the unit tests (`use super::*`) name besides this module's items.
#[cfg(test)]
use crate::{
    client::credential::Credential,
    limit::{Budget, Charge},
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
/// Default `[xdp] new_prefix_rate`, new prefixes per second: with the default `max_prefixes`, a
/// tracked prefix idle for less than 65,536 / 200 ≈ 5.5 minutes is never evicted by churn.
pub const DEFAULT_NEW_PREFIX_RATE: f64 = 200.0;
/// Default `[xdp] new_prefix_burst`, new prefixes.
pub const DEFAULT_NEW_PREFIX_BURST: u32 = 2_000;
/// Default `[xdp] overflow_syn_rate`, SYNs per second shared by new prefixes while the churn
/// guard is closed.
pub const DEFAULT_OVERFLOW_SYN_RATE: f64 = 10_000.0;
/// Default `[xdp] overflow_syn_burst`, SYNs.
pub const DEFAULT_OVERFLOW_SYN_BURST: u32 = 20_000;
/// Default `[xdp] max_prefixes`: entries of the per-prefix LRU map.
pub const DEFAULT_MAX_PREFIXES: u32 = door_common::PREFIX_MAP_CAPACITY;
/// Slowest rate accepted for `[xdp]` rates: one per day (as the limiter's `MIN_RATE`).
const MIN_XDP_RATE: f64 = crate::limit::MIN_RATE;
/// Fastest rate accepted for `[xdp]` rates: one per nanosecond.
const MAX_XDP_RATE: f64 = crate::limit::MAX_RATE;
/// Default `[xdp] escalate_window`.
pub const DEFAULT_ESCALATE_WINDOW: Duration = Duration::from_secs(10);
/// Default `[xdp] block_for`.
pub const DEFAULT_BLOCK_FOR: Duration = Duration::from_mins(1);

/// Default `header_read_timeout`: a request head (line and fields) must arrive within 10 s.
pub const DEFAULT_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// Default `idle_timeout`: a connection with no request in flight for 60 s is closed.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_mins(1);
/// Default `drain_grace`: in-flight requests get 10 s after SIGTERM.
pub const DEFAULT_DRAIN_GRACE: Duration = Duration::from_secs(10);
/// Default `upstream_timeout`: the upstream must answer (its response head) within 30 s.
pub const DEFAULT_UPSTREAM_TIMEOUT: Duration = Duration::from_secs(30);

/// Default `[otlp] interval`: metrics are exported every 10 s.
pub const DEFAULT_OTLP_INTERVAL: Duration = Duration::from_secs(10);

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

fn positive_u32(key: &str, v: i64) -> Result<u32, ConfigError> {
    u32::try_from(v)
        .ok()
        .filter(|v| *v > 0)
        .ok_or_else(|| invalid(key, v, "must be a whole number from 1 to 4294967295"))
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

/// Cookie mode of the flood shield (`[xdp] syn_cookies`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SynCookies {
    /// While the SYN rate of all sources is over `cookie_threshold`, answer SYNs from XDP with a
    /// SYN-ACK carrying the kernel's SYN cookie.
    Auto,
    /// Never (the default).
    Off,
}

impl SynCookies {
    /// Parses `auto|off`.
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] naming `xdp.syn_cookies` for anything else.
    pub fn parse(s: &str) -> Result<Self, ConfigError> {
        match s {
            "auto" => Ok(Self::Auto),
            "off" => Ok(Self::Off),
            _ => Err(invalid(
                "xdp.syn_cookies",
                format!("{s:?}"),
                "must be auto or off",
            )),
        }
    }

    /// `auto` or `off`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Auto => "auto",
            Self::Off => "off",
        }
    }
}

/// Default `[xdp] cookie_threshold`, SYNs per second of all sources together.
pub const DEFAULT_COOKIE_THRESHOLD: f64 = 20_000.0;

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
    /// Protected destination ports; empty means all. Default: the ports of [`Config::listen`]
    /// (every listener: plain, TLS and PROXY protocol ones), deduplicated and sorted; a listener
    /// on port 0 (chosen when it binds) adds none.
    pub ports: Vec<u16>,
    /// Churn guard: new source prefixes per second that get their own entry; above it, new
    /// prefixes share one overflow bucket. 0 turns the guard off. Default 200.
    pub new_prefix_rate: f64,
    /// Churn guard burst, new prefixes. Default 2,000.
    pub new_prefix_burst: u32,
    /// SYNs per second of the one overflow bucket new prefixes share while the churn guard is
    /// closed. Default 10,000.
    pub overflow_syn_rate: f64,
    /// Burst of the overflow bucket, SYNs. Default 20,000.
    pub overflow_syn_burst: u32,
    /// Entries of the per-prefix LRU map (memory: about 100 bytes each in the kernel). Default
    /// 65,536.
    pub max_prefixes: u32,
    /// Operator allowlist: CIDRs the shield never sheds (trusted proxies are always exempt too).
    /// Default none.
    pub allow: Vec<IpNet>,
    /// CIDRs whose every SYN the shield drops, at XDP only (the top-level `deny` does this and
    /// answers 403 at layer 7 too). It shares the shield's LPM trie with the allow lists and the
    /// trusted proxies: the longest matching prefix decides, and a prefix on both is denied.
    /// Default none.
    pub deny: Vec<IpNet>,
    /// 429s from one TCP-peer key within `escalate_window` that put it on the XDP blocklist;
    /// 0 (the default) turns escalation off.
    pub escalate_after: u32,
    /// Window for `escalate_after`. Default 10 s.
    pub escalate_window: Duration,
    /// How long an escalated key's SYNs are dropped. Default 60 s.
    pub block_for: Duration,
    /// Cookie mode. Default [`SynCookies::Off`].
    pub syn_cookies: SynCookies,
    /// SYNs per second of all sources together (after the per-prefix budgets) above which cookie
    /// mode starts. Default 20,000.
    pub cookie_threshold: f64,
}

/// The lowest TLS protocol version door accepts (`[tls] min_version`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TlsVersion {
    /// TLS 1.2 (RFC 5246) and 1.3: the default.
    Tls12,
    /// TLS 1.3 (RFC 8446) only.
    Tls13,
}

impl TlsVersion {
    /// `"1.2"` or `"1.3"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Tls12 => "1.2",
            Self::Tls13 => "1.3",
        }
    }
}

/// TLS termination (`[tls]`): ALPN `h2` and `http/1.1`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsConfig {
    /// PEM certificate chain, leaf first (`tls.cert`; `--tls-cert` / `DOOR_TLS_CERT`).
    pub cert: PathBuf,
    /// PEM private key: PKCS#8, PKCS#1 or SEC1 (`tls.key`; `--tls-key` / `DOOR_TLS_KEY`).
    pub key: PathBuf,
    /// Lowest protocol version (`tls.min_version = "1.2" | "1.3"`; `--tls-min-version` /
    /// `DOOR_TLS_MIN_VERSION`). Default `"1.2"`.
    pub min_version: TlsVersion,
}

/// OTLP metrics export (`[otlp]`). The exporter runs when `endpoint` is set here or when one of
/// the standard `OTEL_EXPORTER_OTLP_ENDPOINT` / `OTEL_EXPORTER_OTLP_METRICS_ENDPOINT` variables
/// is set; otherwise the global meter stays a no-op.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OtlpConfig {
    /// Collector base URL for OTLP/HTTP protobuf, e.g. `http://127.0.0.1:4318` (`/v1/metrics` is
    /// appended) (`otlp.endpoint`; `--otlp-endpoint` / `DOOR_OTLP_ENDPOINT`). Default: none (the
    /// `OTEL_EXPORTER_OTLP_*` variables decide).
    pub endpoint: Option<String>,
    /// Export interval (`otlp.interval`; `--otlp-interval` / `DOOR_OTLP_INTERVAL`). Default 10 s,
    /// or `OTEL_METRIC_EXPORT_INTERVAL` (milliseconds) when set and this key is not.
    pub interval: Option<Duration>,
}

/// Default `[cluster] sync_interval`: 250 ms.
pub const DEFAULT_CLUSTER_SYNC_INTERVAL: Duration = Duration::from_millis(250);

/// Default `[cluster] timeout`: 100 ms.
pub const DEFAULT_CLUSTER_TIMEOUT: Duration = Duration::from_millis(100);

/// Budget sharing between doors through Redis or Valkey (`[cluster]`, docs/design.md,
/// "Cluster"). Off unless `redis` is set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterConfig {
    /// `redis://HOST:PORT/DB` or `rediss://…` (TLS) (`cluster.redis`; `--cluster-redis` /
    /// `DOOR_CLUSTER_REDIS`). Default: none (every door's budgets are its own).
    pub redis: Option<String>,
    /// How often a door syncs its consumption (`cluster.sync_interval`;
    /// `--cluster-sync-interval` / `DOOR_CLUSTER_SYNC_INTERVAL`). Default 250 ms.
    pub sync_interval: Duration,
    /// How long one sync (connect, script) may take before the door counts it failed
    /// (`cluster.timeout`; `--cluster-timeout` / `DOOR_CLUSTER_TIMEOUT`). Default 100 ms.
    pub timeout: Duration,
    /// PEM file of the certificate authorities a `rediss://` store's certificate must chain to,
    /// instead of the system's roots (`cluster.ca_file`; `--cluster-ca-file` /
    /// `DOOR_CLUSTER_CA_FILE`). Read when door starts. Default: none (the system's roots).
    pub ca_file: Option<PathBuf>,
}

impl Default for ClusterConfig {
    fn default() -> Self {
        Self {
            redis: None,
            sync_interval: DEFAULT_CLUSTER_SYNC_INTERVAL,
            timeout: DEFAULT_CLUSTER_TIMEOUT,
            ca_file: None,
        }
    }
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
        // `http://:3000` parses with an empty host: every request would fail to connect (502).
        if authority.host().is_empty() {
            return Err(bad("needs a host"));
        }
        if uri.path_and_query().is_some_and(|pq| pq.as_str() != "/") {
            return Err(bad("must not have a path or query"));
        }
        // The `http` crate keeps a port it cannot read as a number without complaint.
        let port_text = (!authority.as_str().ends_with(']'))
            .then(|| authority.as_str().rsplit_once(':'))
            .flatten()
            .map(|(_, p)| p);
        if let Some(p) = port_text
            && (!p.bytes().all(|b| b.is_ascii_digit()) || !p.parse::<u16>().is_ok_and(|n| n > 0))
        {
            return Err(bad(&format!("port {p:?} is not a TCP port (1-65535)")));
        }
        Ok(Self { scheme, authority })
    }
}

/// The validated, effective configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// Addresses to serve on. Default `[::]:8443`. In the file, each entry is an address string or
    /// a table `{ addr = "[::]:8443", proxy_protocol = true }`.
    pub listen: Vec<SocketAddr>,
    /// The entries of `listen` given with `proxy_protocol = true` (or `--listen-proxy-protocol`):
    /// every connection on them must start with a PROXY protocol v1/v2 header from a trusted proxy
    /// ([`crate::client::proxy_protocol`]). Default: none.
    pub proxy_protocol_listen: Vec<SocketAddr>,
    /// The application behind door. Default `http://127.0.0.1:3000`.
    pub upstream: Upstream,
    /// Where the admin listener (`GET /status`, `/metrics`, `/clients`, `/blocks`) is served:
    /// a TCP address or a Unix socket (`unix:/run/door/admin.sock`); `None` (`"off"`) disables
    /// it. Default `127.0.0.1:9901`.
    pub admin_listen: Option<AdminListen>,
    /// Proxies whose forwarding headers are believed. Default: none.
    pub trusted_proxies: TrustedProxies,
    /// Which header is authoritative when a trusted proxy sends both `X-Forwarded-For` and
    /// `Forwarded` (`forwarded_header = "x-forwarded-for" | "forwarded"`). Default
    /// `x-forwarded-for`.
    pub forwarded_header: ForwardedSource,
    /// Shadow mode: admit everything, count what would have been refused. Default `false`.
    pub disable_anon_route_limits: bool,
    /// Route table (`[[route]]`; `--route` / `DOOR_ROUTES` replace it), first match wins; a
    /// request matching none passes through unlimited. Default: empty.
    pub routes: Vec<Route>,
    /// Limit groups by name: the defaults (webhook, link, health, stream) merged with
    /// `[group.NAME]` and `--group NAME.KEY=VALUE` / `DOOR_GROUP`.
    pub groups: BTreeMap<String, GroupConfig>,
    /// The flood shield.
    pub xdp: XdpConfig,
    /// TLS termination on every `listen` address (`[tls]`); `None`, the default, serves
    /// cleartext HTTP/1.1 and h2c.
    pub tls: Option<TlsConfig>,
    /// Time allowed for a request head (request line and header fields) to arrive, from the
    /// moment door waits for it (`header_read_timeout`; `--header-read-timeout` /
    /// `DOOR_HEADER_READ_TIMEOUT`): every HTTP/1.1 head (hyper's timer), a TLS handshake, and a
    /// connection's first head in either protocol, counted from the end of the TLS handshake (or
    /// of the PROXY protocol header); the connection is closed (HTTP/2: a GOAWAY). Default 10 s.
    pub header_read_timeout: Duration,
    /// A connection with no request in flight for this long, after its first request, is closed
    /// (`idle_timeout`; `--idle-timeout` / `DOOR_IDLE_TIMEOUT`): HTTP/2 gets a GOAWAY. Default
    /// 60 s.
    pub idle_timeout: Duration,
    /// After SIGTERM, how long in-flight requests get before door exits anyway (`drain_grace`;
    /// `--drain-grace` / `DOOR_DRAIN_GRACE`). Default 10 s.
    pub drain_grace: Duration,
    /// How long the upstream has to send its response head; past it door answers 504
    /// (`upstream_timeout`; `--upstream-timeout` / `DOOR_UPSTREAM_TIMEOUT`). Default 30 s.
    pub upstream_timeout: Duration,
    /// A stream (an upgraded connection such as a WebSocket, a server-sent events response, a
    /// `stream = true` route) with no byte either way for this long is closed
    /// (`stream_idle_timeout`; `--stream-idle-timeout` / `DOOR_STREAM_IDLE_TIMEOUT`). Default 5 min.
    pub stream_idle_timeout: Duration,
    /// Whether limited routes' responses carry the `RateLimit-Policy` and `RateLimit` fields
    /// (`ratelimit_headers`; `--ratelimit-headers` / `DOOR_RATELIMIT_HEADERS`). Default `true`.
    pub ratelimit_headers: bool,
    /// OTLP metrics export.
    pub otlp: OtlpConfig,
    /// Budget sharing between doors (`[cluster]`).
    pub cluster: ClusterConfig,
    /// Client connections door serves at once, door-wide (`max_connections`;
    /// `--max-connections` / `DOOR_MAX_CONNECTIONS`); past it new connections are closed at
    /// accept without a byte read. `None` (the default): derived at start from the open-file limit
    /// by [`derived_max_connections`], leaving room for one upstream socket per connection.
    pub max_connections: Option<u32>,
    /// Client connections one TCP peer (its /32 or /64) may have open at once
    /// (`max_connections_per_client`; `--max-connections-per-client` /
    /// `DOOR_MAX_CONNECTIONS_PER_CLIENT`). Trusted proxies are exempt: they carry many clients.
    /// Default 256.
    pub max_connections_per_client: u32,
    /// Requests on routes in no group (pass-through) door forwards to the upstream at once
    /// (`upstream_max_inflight`; `--upstream-max-inflight` / `DOOR_UPSTREAM_MAX_INFLIGHT`); past
    /// it door answers 503 with `Retry-After: 1`. Default 4096.
    pub upstream_max_inflight: u32,
    /// Header fields an HTTP/1.1 request head may have (`max_header_fields`;
    /// `--max-header-fields` / `DOOR_MAX_HEADER_FIELDS`); past it door answers 431 and closes the
    /// connection. From 1 to [`MAX_HEADER_FIELDS_LIMIT`]; default
    /// [`DEFAULT_MAX_HEADER_FIELDS`] (100, as HAProxy's `tune.http.maxhdr`, Envoy's
    /// `max_headers_count` and Apache's `LimitRequestFields`). hyper prepares parse state for this
    /// many fields on every request head: 100 fit on the stack, more cost a heap allocation of
    /// 64 bytes per field per request. The head's 64 KiB byte bound applies either way; HTTP/2 has
    /// only the byte bound (`SETTINGS_MAX_HEADER_LIST_SIZE`).
    pub max_header_fields: usize,
    /// The per-session and per-IP request planes (`[plane.session]`, `[plane.ip]`); `None`
    /// (the default) when `[plane.session]` is absent.
    pub planes: Option<PlanesConfig>,
    /// Clients never limited at layer 7 and never shed at XDP (`allow`; `--allow` /
    /// `DOOR_ALLOW`): CIDRs, matched against the client key's address. Default: none.
    pub allow: Vec<IpNet>,
    /// Clients refused: 403 at layer 7 before any bucket, every SYN dropped at XDP (`deny`;
    /// `--deny` / `DOOR_DENY`): CIDRs. A client in both is denied. Default: none.
    pub deny: Vec<IpNet>,
}

/// The default of [`Config::stream_idle_timeout`]: 5 minutes.
pub const DEFAULT_STREAM_IDLE_TIMEOUT: Duration = Duration::from_mins(5);

/// The default of [`Config::max_connections_per_client`].
pub const DEFAULT_MAX_CONNECTIONS_PER_CLIENT: u32 = 256;
/// The default of [`Config::upstream_max_inflight`].
pub const DEFAULT_UPSTREAM_MAX_INFLIGHT: u32 = 4096;
/// The default of [`Config::max_header_fields`]: hyper's own default, the most it parses with
/// no allocation.
pub const DEFAULT_MAX_HEADER_FIELDS: usize = 100;
/// The largest [`Config::max_header_fields`] accepted: at 1,024 hyper's per-request parse state
/// is already 64 KiB, the size of the largest head door reads.
pub const MAX_HEADER_FIELDS_LIMIT: usize = 1024;
/// File descriptors [`derived_max_connections`] keeps aside for listeners, the admin endpoint,
/// BPF maps, logs and the like.
pub const RESERVED_FDS: u64 = 128;

/// The door-wide connection limit when `max_connections` is not set: half of what the soft
/// open-file limit (`RLIMIT_NOFILE`, `nofile`) leaves after [`RESERVED_FDS`], since each client
/// connection may hold one upstream connection too; at least 16. With systemd's default soft
/// limit of 1,024 that is 448; the unit raises `LimitNOFILE` (docs/operations.md).
pub fn derived_max_connections(nofile_soft: u64) -> u32 {
    let n = nofile_soft.saturating_sub(RESERVED_FDS) / 2;
    u32::try_from(n).unwrap_or(u32::MAX).max(16)
}

impl Config {
    /// [`Config::max_connections`], or the value derived from this process's soft open-file
    /// limit.
    pub fn effective_max_connections(&self) -> u32 {
        self.max_connections.unwrap_or_else(|| {
            let soft = rustix::process::getrlimit(rustix::process::Resource::Nofile)
                .current
                .unwrap_or(u64::MAX);
            derived_max_connections(soft)
        })
    }
}

impl Config {
    /// Reads `path` (if any), applies `overrides`, fills in defaults and validates.
    ///
    /// # Errors
    /// [`ConfigError`] naming the file, key and value at fault.
    pub fn load(path: Option<&Path>, overrides: &Overrides) -> Result<Self, ConfigError> {
        let mut file = match path {
            Some(path) => {
                let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
                    path: path.to_owned(),
                    source,
                })?;
                parse_file(path, &text)?
            }
            None => File::default(),
        };
        written_over(&mut file, overrides)?;
        Self::build(file, overrides)
    }

    /// Parses a configuration from TOML text (as if read from `name`) with no overrides.
    ///
    /// # Errors
    /// As [`Config::load`].
    pub fn from_toml(name: &str, text: &str) -> Result<Self, ConfigError> {
        let file = parse_file(Path::new(name), text)?;
        Self::build(file, &Overrides::default())
    }

    /// Checks `file` (with the flags [`written_over`] writes already in it), reading every other
    /// setting's flag from `o`.
    fn build(file: File, o: &Overrides) -> Result<Self, ConfigError> {
        let listeners = build_listen(file.listen, o)?;
        let listen: Vec<SocketAddr> = listeners.iter().map(|l| l.addr).collect();

        let upstream = Upstream::parse(
            o.upstream
                .as_deref()
                .or(file.upstream.as_deref())
                .unwrap_or(DEFAULT_UPSTREAM),
        )?;

        let pick = |flag: &Option<Vec<String>>, file: &Option<Vec<String>>| {
            flag.as_ref()
                .or(file.as_ref())
                .map_or(Vec::new(), Clone::clone)
        };
        let admin_listen = build_admin_listen(
            o.admin_listen
                .as_deref()
                .or(file.admin_listen.as_deref())
                .unwrap_or(DEFAULT_ADMIN_LISTEN),
        )?;
        let trusted_raw = pick(&o.trusted_proxies, &file.trusted_proxies);
        let trusted_proxies = parse_cidrs("trusted_proxies", &trusted_raw)?;
        let (allow, deny) = (
            access_list("allow", &pick(&o.allow, &file.allow))?,
            access_list("deny", &pick(&o.deny, &file.deny))?,
        );
        let proxy_protocol_listen = proxy_protocol_listeners(&listeners, &trusted_proxies)?;
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
        let planes = build_planes(file.plane, &groups)?;

        let routes = build_routes(file.route, &groups)?;

        let xdp = build_xdp(file.xdp, o, &listen)?;
        let tls = build_tls(file.tls, o)?;
        let front = build_front(
            [
                file.header_read_timeout,
                file.idle_timeout,
                file.drain_grace,
                file.upstream_timeout,
                file.stream_idle_timeout,
            ],
            file.ratelimit_headers,
            o,
        )?;
        let otlp = build_otlp(file.otlp, o)?;
        let cluster = build_cluster(file.cluster, o)?;
        let (max_connections, max_connections_per_client, upstream_max_inflight) =
            build_connection_limits(
                [
                    file.max_connections,
                    file.max_connections_per_client,
                    file.upstream_max_inflight,
                ],
                o,
            )?;

        let max_header_fields = build_max_header_fields(file.max_header_fields, o)?;
        let keyed: Vec<(String, SocketAddr)> =
            listeners.iter().map(|l| (l.key.clone(), l.addr)).collect();
        addresses::check(&keyed, admin_listen.as_ref(), &upstream)?;

        Ok(Self {
            listen,
            proxy_protocol_listen,
            upstream,
            admin_listen,
            trusted_proxies,
            forwarded_header,
            disable_anon_route_limits,
            routes,
            groups,
            xdp,
            tls,
            header_read_timeout: front.header_read_timeout,
            idle_timeout: front.idle_timeout,
            drain_grace: front.drain_grace,
            upstream_timeout: front.upstream_timeout,
            stream_idle_timeout: front.stream_idle_timeout,
            ratelimit_headers: front.ratelimit_headers,
            otlp,
            cluster,
            max_connections,
            max_connections_per_client,
            upstream_max_inflight,
            max_header_fields,
            planes,
            allow,
            deny,
        })
    }
}

impl Config {
    /// Whether connections on the listener bound to `addr` (an entry of [`Config::listen`]) must
    /// start with a PROXY protocol header.
    pub fn requires_proxy_protocol(&self, addr: SocketAddr) -> bool {
        self.proxy_protocol_listen.contains(&addr)
    }
}

/// One validated `listen` entry.
struct ListenEntry {
    /// `listen[i]`, for later errors.
    key: String,
    addr: SocketAddr,
    proxy_protocol: bool,
}

/// `listen` from the flags (which replace the file's list when either flag is given: the
/// `--listen` addresses, then the `--listen-proxy-protocol` ones, each possibly comma-separated),
/// else from the file, else the default. File entries are `"ip:port"` or
/// `{ addr = "ip:port", proxy_protocol = bool }`.
fn build_listen(
    file: Option<Vec<toml::Value>>,
    o: &Overrides,
) -> Result<Vec<ListenEntry>, ConfigError> {
    let mut raw: Vec<(String, String, bool)> = Vec::new();
    let key = |i: usize| format!("listen[{i}]");
    if o.listen.is_some() || o.listen_proxy_protocol.is_some() {
        let plain = o.listen.iter().flatten().map(|s| (s, false));
        let proxied = o.listen_proxy_protocol.iter().flatten().map(|s| (s, true));
        for (s, proxy_protocol) in plain.chain(proxied) {
            for part in s.split(',') {
                raw.push((key(raw.len()), part.trim().to_owned(), proxy_protocol));
            }
        }
    } else if let Some(values) = file {
        for (i, value) in values.into_iter().enumerate() {
            raw.push(listen_entry(&key(i), value)?);
        }
    } else {
        raw.push((key(0), DEFAULT_LISTEN.to_owned(), false));
    }
    if raw.is_empty() {
        return Err(invalid("listen", "[]", "needs at least one address"));
    }
    raw.into_iter()
        .map(|(key, text, proxy_protocol)| {
            let addr = text.parse::<SocketAddr>().map_err(|_| {
                invalid(
                    key.clone(),
                    format!("{text:?}"),
                    "not a socket address (ip:port, [v6]:port)",
                )
            })?;
            // Table entries report the address as `listen[i].addr`; the entry is `listen[i]`.
            let key = key.strip_suffix(".addr").map_or(key.clone(), str::to_owned);
            Ok(ListenEntry {
                key,
                addr,
                proxy_protocol,
            })
        })
        .collect()
}

/// The keys of a `listen` entry written as a table (parsed by [`listen_entry`]).
const LISTEN_TABLE_KEYS: [&str; 2] = ["addr", "proxy_protocol"];

/// One file entry of `listen` as (key, address text, proxy_protocol).
fn listen_entry(key: &str, value: toml::Value) -> Result<(String, String, bool), ConfigError> {
    const SHAPE: &str = "must be an address string (\"[::]:8443\") or a table \
                         { addr = \"[::]:8443\", proxy_protocol = true }";
    match value {
        toml::Value::String(text) => Ok((key.to_owned(), text, false)),
        toml::Value::Table(table) => {
            let mut addr = None;
            let mut proxy_protocol = false;
            for (name, v) in &table {
                match (name.as_str(), v) {
                    ("addr", toml::Value::String(text)) => addr = Some(text.clone()),
                    ("proxy_protocol", toml::Value::Boolean(b)) => proxy_protocol = *b,
                    ("addr", other) => {
                        return Err(invalid(format!("{key}.addr"), other, "must be a string"));
                    }
                    ("proxy_protocol", other) => {
                        return Err(invalid(
                            format!("{key}.proxy_protocol"),
                            other,
                            "must be true or false",
                        ));
                    }
                    (other, v) => {
                        return Err(invalid(
                            format!("{key}.{other}"),
                            v,
                            "unknown key (expected addr, proxy_protocol)",
                        ));
                    }
                }
            }
            let addr = addr.ok_or_else(|| {
                invalid(
                    key,
                    toml::Value::Table(table.clone()),
                    "needs addr = \"ip:port\"",
                )
            })?;
            Ok((format!("{key}.addr"), addr, proxy_protocol))
        }
        other => Err(invalid(key, other, SHAPE)),
    }
}

/// An `[xdp]` rate (per second): `default` when absent; finite, from one a day to one a
/// nanosecond.
fn xdp_rate(key: &str, value: Option<f64>, default: f64) -> Result<f64, ConfigError> {
    let rate = value.unwrap_or(default);
    if rate.is_finite() && (MIN_XDP_RATE..=MAX_XDP_RATE).contains(&rate) {
        Ok(rate)
    } else {
        Err(invalid(
            key,
            rate,
            "must be a number per second from one a day (0.0000116) to 1e9",
        ))
    }
}

/// The connection-level settings, before they are copied into [`Config`].
struct Front {
    header_read_timeout: Duration,
    idle_timeout: Duration,
    drain_grace: Duration,
    upstream_timeout: Duration,
    stream_idle_timeout: Duration,
    ratelimit_headers: bool,
}

/// `header_read_timeout`, `idle_timeout`, `drain_grace`, `upstream_timeout`,
/// `stream_idle_timeout` (file values in that order) and `ratelimit_headers`, each flag or env
/// beating the file.
fn build_front(
    file: [Option<String>; 5],
    ratelimit_headers: Option<bool>,
    o: &Overrides,
) -> Result<Front, ConfigError> {
    let [header_read, idle, drain, upstream, stream_idle] = file;
    let duration = |key: &str, flag: &Option<String>, file: Option<String>, default| match flag
        .clone()
        .or(file)
    {
        Some(s) => parse_duration(key, &s),
        None => Ok(default),
    };
    Ok(Front {
        header_read_timeout: duration(
            "header_read_timeout",
            &o.header_read_timeout,
            header_read,
            DEFAULT_HEADER_READ_TIMEOUT,
        )?,
        idle_timeout: duration("idle_timeout", &o.idle_timeout, idle, DEFAULT_IDLE_TIMEOUT)?,
        drain_grace: duration("drain_grace", &o.drain_grace, drain, DEFAULT_DRAIN_GRACE)?,
        upstream_timeout: duration(
            "upstream_timeout",
            &o.upstream_timeout,
            upstream,
            DEFAULT_UPSTREAM_TIMEOUT,
        )?,
        stream_idle_timeout: duration(
            "stream_idle_timeout",
            &o.stream_idle_timeout,
            stream_idle,
            DEFAULT_STREAM_IDLE_TIMEOUT,
        )?,
        ratelimit_headers: o.ratelimit_headers.or(ratelimit_headers).unwrap_or(true),
    })
}

/// The listeners given with `proxy_protocol = true`; each needs `trusted_proxies` (the header is
/// accepted only from a trusted proxy, so every connection would be refused).
fn proxy_protocol_listeners(
    listeners: &[ListenEntry],
    trusted: &TrustedProxies,
) -> Result<Vec<SocketAddr>, ConfigError> {
    let mut out = Vec::new();
    for l in listeners.iter().filter(|l| l.proxy_protocol) {
        if trusted.is_empty() {
            return Err(invalid(
                format!("{}.proxy_protocol", l.key),
                "true",
                "needs trusted_proxies: the PROXY protocol header is accepted only from a \
                 trusted proxy, so every connection would be refused",
            ));
        }
        out.push(l.addr);
    }
    Ok(out)
}

/// The longest Unix socket path, in bytes: `sun_path` is 108 bytes with its terminating NUL.
pub const MAX_UNIX_SOCKET_PATH: usize = 107;

/// Where the admin listener is served (`admin_listen`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AdminListen {
    /// A TCP socket address (`127.0.0.1:9901`).
    Tcp(SocketAddr),
    /// A Unix domain socket at this absolute path (`unix:/run/door/admin.sock`): created with
    /// mode 0600 (the owner, root or the service's user, only), removed on exit.
    Unix(PathBuf),
}

impl fmt::Display for AdminListen {
    /// `127.0.0.1:9901` or `unix:/run/door/admin.sock`: the spelling `admin_listen` accepts.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Tcp(addr) => write!(f, "{addr}"),
            Self::Unix(path) => write!(f, "unix:{}", path.display()),
        }
    }
}

impl std::str::FromStr for AdminListen {
    type Err = ConfigError;

    /// A socket address, or `unix:` and an absolute path of at most [`MAX_UNIX_SOCKET_PATH`]
    /// bytes. `off` is not an address: see `admin_listen`.
    fn from_str(raw: &str) -> Result<Self, ConfigError> {
        let bad = |reason: &str| invalid("admin_listen", format!("{raw:?}"), reason);
        if let Some(path) = raw.strip_prefix("unix:") {
            if !path.starts_with('/') {
                return Err(bad(
                    "a Unix socket needs an absolute path (unix:/run/door/admin.sock)",
                ));
            }
            if path.ends_with('/') {
                return Err(bad("a Unix socket path must name a file, not a directory"));
            }
            if path.len() > MAX_UNIX_SOCKET_PATH {
                return Err(bad(&format!(
                    "a Unix socket path is at most {MAX_UNIX_SOCKET_PATH} bytes"
                )));
            }
            if path.contains('\0') {
                return Err(bad("a Unix socket path cannot contain a NUL byte"));
            }
            return Ok(Self::Unix(PathBuf::from(path)));
        }
        raw.parse::<SocketAddr>().map(Self::Tcp).map_err(|_| {
            bad("not a socket address (ip:port, [v6]:port), unix:/absolute/path or \"off\"")
        })
    }
}

/// `admin_listen`: a socket address, `unix:/path`, or `off` (`None`).
fn build_admin_listen(raw: &str) -> Result<Option<AdminListen>, ConfigError> {
    if raw == "off" {
        return Ok(None);
    }
    raw.parse().map(Some)
}

/// `max_connections` (`None`: derived at start), `max_connections_per_client` and
/// `upstream_max_inflight` (file values in that order), each flag or env beating the file.
fn build_connection_limits(
    file: [Option<i64>; 3],
    o: &Overrides,
) -> Result<(Option<u32>, u32, u32), ConfigError> {
    let [total, per_client, upstream] = file;
    let max_connections = o
        .max_connections
        .or(total)
        .map(|v| positive_u32("max_connections", v))
        .transpose()?;
    let per_client = o
        .max_connections_per_client
        .or(per_client)
        .map_or(Ok(DEFAULT_MAX_CONNECTIONS_PER_CLIENT), |v| {
            positive_u32("max_connections_per_client", v)
        })?;
    let upstream = o
        .upstream_max_inflight
        .or(upstream)
        .map_or(Ok(DEFAULT_UPSTREAM_MAX_INFLIGHT), |v| {
            positive_u32("upstream_max_inflight", v)
        })?;
    Ok((max_connections, per_client, upstream))
}

/// `max_header_fields`, the flag or env beating the file: from 1 to [`MAX_HEADER_FIELDS_LIMIT`].
fn build_max_header_fields(file: Option<i64>, o: &Overrides) -> Result<usize, ConfigError> {
    let Some(v) = o.max_header_fields.or(file) else {
        return Ok(DEFAULT_MAX_HEADER_FIELDS);
    };
    usize::try_from(v)
        .ok()
        .filter(|n| (1..=MAX_HEADER_FIELDS_LIMIT).contains(n))
        .ok_or_else(|| {
            invalid(
                "max_header_fields",
                v,
                format!("must be a whole number from 1 to {MAX_HEADER_FIELDS_LIMIT}"),
            )
        })
}

fn build_tls(file: Option<TlsFile>, o: &Overrides) -> Result<Option<TlsConfig>, ConfigError> {
    let f = file.unwrap_or_default();
    let cert = o.tls_cert.clone().or(f.cert);
    let key = o.tls_key.clone().or(f.key);
    let min_raw = o.tls_min_version.clone().or(f.min_version);
    let (cert, key) = match (cert, key) {
        (None, None) => {
            if let Some(v) = min_raw {
                return Err(invalid(
                    "tls.min_version",
                    format!("{v:?}"),
                    "needs tls.cert and tls.key",
                ));
            }
            return Ok(None);
        }
        (Some(_), None) => return Err(invalid("tls.key", "(none)", "required with tls.cert")),
        (None, Some(_)) => return Err(invalid("tls.cert", "(none)", "required with tls.key")),
        (Some(c), Some(k)) => (c, k),
    };
    for (k, v) in [("tls.cert", &cert), ("tls.key", &key)] {
        if v.is_empty() {
            return Err(invalid(k, "\"\"", "must be a file path"));
        }
    }
    let min_version = match min_raw.as_deref() {
        None | Some("1.2") => TlsVersion::Tls12,
        Some("1.3") => TlsVersion::Tls13,
        Some(v) => {
            return Err(invalid(
                "tls.min_version",
                format!("{v:?}"),
                "must be \"1.2\" or \"1.3\"",
            ));
        }
    };
    Ok(Some(TlsConfig {
        cert: PathBuf::from(cert),
        key: PathBuf::from(key),
        min_version,
    }))
}

/// `url` as an error message may show it: everything before its last `@` (after the scheme)
/// replaced by `<elided>`, since a user name or password may hold any character, `/` included
/// (the message reaches the journal).
fn redis_url_shown(url: &str) -> String {
    let (scheme, rest) = url.split_once("://").unwrap_or(("", url));
    let Some(at) = rest.rfind('@') else {
        return url.to_owned();
    };
    let separator = if scheme.is_empty() { "" } else { "://" };
    format!(
        "{scheme}{separator}<elided>{}",
        rest.get(at..).unwrap_or_default()
    )
}

fn build_cluster(file: Option<ClusterFile>, o: &Overrides) -> Result<ClusterConfig, ConfigError> {
    let f = file.unwrap_or_default();
    let redis = o.cluster_redis.clone().or(f.redis);
    if let Some(url) = &redis {
        let shown = format!("{:?}", redis_url_shown(url));
        let scheme_ok = url
            .split_once("://")
            .is_some_and(|(scheme, rest)| matches!(scheme, "redis" | "rediss") && !rest.is_empty());
        if !scheme_ok {
            return Err(invalid(
                "cluster.redis",
                shown,
                "not a redis:// or rediss:// URL",
            ));
        }
        // What the Redis client will read at start: host, a port up to 65535, a database number.
        let parsed = url::Url::parse(url)
            .map_err(|e| invalid("cluster.redis", &shown, format!("not a URL ({e})")))?;
        redis::IntoConnectionInfo::into_connection_info(parsed)
            .map_err(|e| invalid("cluster.redis", &shown, e.to_string()))?;
    }
    let nonzero = |key: &str, s: Option<String>, default: Duration| match s {
        Some(s) => {
            let d = parse_duration(key, &s)?;
            if d.is_zero() {
                return Err(invalid(key, format!("{s:?}"), "must be more than 0"));
            }
            Ok(d)
        }
        None => Ok(default),
    };
    let sync_interval = nonzero(
        "cluster.sync_interval",
        o.cluster_sync_interval.clone().or(f.sync_interval),
        DEFAULT_CLUSTER_SYNC_INTERVAL,
    )?;
    let timeout = nonzero(
        "cluster.timeout",
        o.cluster_timeout.clone().or(f.timeout),
        DEFAULT_CLUSTER_TIMEOUT,
    )?;
    let ca_file = o.cluster_ca_file.clone().or(f.ca_file);
    if let Some(ca) = &ca_file
        && !redis.as_deref().is_some_and(|u| u.starts_with("rediss://"))
    {
        return Err(invalid(
            "cluster.ca_file",
            format!("{ca:?}"),
            "needs a rediss:// cluster.redis",
        ));
    }
    Ok(ClusterConfig {
        redis,
        sync_interval,
        timeout,
        ca_file: ca_file.map(PathBuf::from),
    })
}

fn build_otlp(file: Option<OtlpFile>, o: &Overrides) -> Result<OtlpConfig, ConfigError> {
    let f = file.unwrap_or_default();
    let endpoint = o.otlp_endpoint.clone().or(f.endpoint);
    if let Some(e) = &endpoint {
        let ok = e.parse::<Uri>().ok().is_some_and(|u| {
            (u.scheme() == Some(&Scheme::HTTP) || u.scheme() == Some(&Scheme::HTTPS))
                && u.authority().is_some()
        });
        if !ok {
            return Err(invalid(
                "otlp.endpoint",
                format!("{e:?}"),
                "not an http:// or https:// URL",
            ));
        }
    }
    let interval = match o.otlp_interval.clone().or(f.interval) {
        Some(s) => Some(parse_duration("otlp.interval", &s)?),
        None => None,
    };
    Ok(OtlpConfig { endpoint, interval })
}

/// `[xdp] ports` as written (each a TCP port, 1-65535), or by default the ports of `listen`
/// (every listener: plain, TLS and PROXY protocol ones), deduplicated and sorted. Port 0 (chosen
/// when the listener binds) is left out of the default: the shield cannot know it.
fn xdp_ports(
    file: Option<Vec<i64>>,
    listen: &[SocketAddr],
    mode: XdpMode,
) -> Result<Vec<u16>, ConfigError> {
    if let Some(ports) = file {
        return ports
            .into_iter()
            .enumerate()
            .map(|(i, p)| {
                u16::try_from(p).ok().filter(|p| *p > 0).ok_or_else(|| {
                    invalid(format!("xdp.ports[{i}]"), p, "not a TCP port (1-65535)")
                })
            })
            .collect();
    }
    let mut ports: Vec<u16> = listen
        .iter()
        .map(SocketAddr::port)
        .filter(|p| *p != 0)
        .collect();
    ports.sort_unstable();
    ports.dedup();
    // An empty list means every port: never the default by accident.
    if ports.is_empty() && mode != XdpMode::Off {
        return Err(invalid(
            "xdp.ports",
            "(none)",
            "the default is the ports of listen, and every listen address has port 0 (chosen \
             when it binds): give the ports to protect ([] protects every port)",
        ));
    }
    Ok(ports)
}

/// `[xdp]`, with `listen` (the effective one, flags applied) for the default `ports`.
fn build_xdp(
    file: Option<XdpFile>,
    o: &Overrides,
    listen: &[SocketAddr],
) -> Result<XdpConfig, ConfigError> {
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
    let syn_rate = xdp_rate("xdp.syn_rate", f.syn_rate, DEFAULT_SYN_RATE)?;
    let syn_burst = match f.syn_burst {
        Some(v) => positive_u32("xdp.syn_burst", v)?,
        None => DEFAULT_SYN_BURST,
    };
    let ports = xdp_ports(f.ports, listen, mode)?;
    let new_prefix_rate = match f.new_prefix_rate {
        Some(0.0) => 0.0,
        r => xdp_rate("xdp.new_prefix_rate", r, DEFAULT_NEW_PREFIX_RATE)?,
    };
    let new_prefix_burst = match f.new_prefix_burst {
        Some(v) => positive_u32("xdp.new_prefix_burst", v)?,
        None => DEFAULT_NEW_PREFIX_BURST,
    };
    let overflow_syn_rate = xdp_rate(
        "xdp.overflow_syn_rate",
        f.overflow_syn_rate,
        DEFAULT_OVERFLOW_SYN_RATE,
    )?;
    let overflow_syn_burst = match f.overflow_syn_burst {
        Some(v) => positive_u32("xdp.overflow_syn_burst", v)?,
        None => DEFAULT_OVERFLOW_SYN_BURST,
    };
    let max_prefixes = match f.max_prefixes {
        Some(v) => positive_u32("xdp.max_prefixes", v)?,
        None => DEFAULT_MAX_PREFIXES,
    };
    let allow = access_list("xdp.allow", &f.allow.unwrap_or_default())?;
    let deny = access_list("xdp.deny", &f.deny.unwrap_or_default())?;
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
    let syn_cookies = match f.syn_cookies.as_deref() {
        Some(s) => SynCookies::parse(s)?,
        None => SynCookies::Off,
    };
    let cookie_threshold = xdp_rate(
        "xdp.cookie_threshold",
        f.cookie_threshold,
        DEFAULT_COOKIE_THRESHOLD,
    )?;
    Ok(XdpConfig {
        interface,
        mode,
        syn_rate,
        syn_burst,
        ports,
        new_prefix_rate,
        new_prefix_burst,
        overflow_syn_rate,
        overflow_syn_burst,
        max_prefixes,
        allow,
        deny,
        escalate_after,
        escalate_window,
        block_for,
        syn_cookies,
        cookie_threshold,
    })
}

#[cfg(test)]
mod tests;
