//! door's configuration: the TOML file of docs/design.md ("Configuration"), overridden by
//! flags and `DOOR_*` environment variables (flag, then env, then file, then default), validated
//! into a [`Config`] before anything is bound.
//!
//! Every error names the offending key and value (`group.link.rate = -1: must be a positive
//! number of tokens per second`); unknown keys are errors too, so a typo never silently falls
//! back to a default.
//!
//! Here: [`ConfigError`], [`Config`] with [`Upstream`] and the top-level defaults, and
//! [`Config::load`] and [`Config::from_toml`], which run the steps below in order.
//!
//! - `file.rs`: the file's tables as serde reads them, the parser, [`known_keys`].
//! - `flags.rs`: the flags and `DOOR_*` variables ([`Overrides`]); `merge.rs` writes the flags of
//!   `[xdp]`, `[plane.*]`, `[group.NAME]` and `[[route]]` over the file's tables.
//! - One file per part of the configuration, each with its public type, its defaults and its
//!   checks: `listen.rs` (`listen`, `admin_listen`), `front.rs` (timeouts, connection caps),
//!   `groups.rs` (`[group.NAME]`, `[[route]]`), `planes.rs` (`[plane.*]`), `networks.rs` (CIDR
//!   lists), `durations.rs`, `tls.rs`, `cluster.rs`, `otlp.rs`, `xdp.rs`.
//! - `addresses.rs`: checks across the addresses door binds and calls.
//! - `print.rs`: `door check-config`'s output; `reload.rs`: which changes need a restart.

mod addresses;
pub mod bounded;
mod cluster;
mod durations;
mod file;
mod flags;
mod front;
mod groups;
mod listen;
mod merge;
mod networks;
mod otlp;
mod planes;
pub mod print;
mod reload;
mod tls;
mod xdp;

pub use cluster::{ClusterConfig, DEFAULT_CLUSTER_SYNC_INTERVAL, DEFAULT_CLUSTER_TIMEOUT};
pub use durations::{MAX_DURATION, MIN_DURATION};
pub use file::known_keys;
pub use flags::{EnvNamed, GroupSetting, Overrides, RouteList, RouteParser};
pub use groups::{
    GroupConfig, NEW_GROUP_INFLIGHT, NEW_GROUP_PER_CLIENT, PerClientFollows, STREAM_GROUP,
};
pub use listen::{AdminListen, MAX_UNIX_SOCKET_PATH};
pub use otlp::{DEFAULT_OTLP_INTERVAL, OtlpConfig};
pub use planes::{
    DEFAULT_IP_BURST, DEFAULT_IP_RATE, DEFAULT_SESSION_BURST, DEFAULT_SESSION_RATE, IP_PLANE,
    PlanesConfig, SESSION_PLANE,
};
pub use reload::restart_only_changes;
pub use tls::{TlsConfig, TlsVersion};
pub use xdp::{
    DEFAULT_BLOCK_FOR, DEFAULT_COOKIE_THRESHOLD, DEFAULT_ESCALATE_WINDOW, DEFAULT_MAX_PREFIXES,
    DEFAULT_NEW_PREFIX_BURST, DEFAULT_NEW_PREFIX_RATE, DEFAULT_OVERFLOW_SYN_BURST,
    DEFAULT_OVERFLOW_SYN_RATE, DEFAULT_SYN_BURST, DEFAULT_SYN_RATE, SynCookies, XdpConfig, XdpMode,
};

use std::{
    borrow::Cow,
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
use cluster::build_cluster;
use file::{File, parse_file};
use front::{build_connection_limits, build_front, build_max_header_fields};
use groups::{build_groups, build_routes};
use listen::{build_admin_listen, build_listen, proxy_protocol_listeners};
use merge::written_over;
pub use networks::shield_list_entries;
use networks::{access_list, parse_cidrs};
use otlp::build_otlp;
use planes::build_planes;
use tls::build_tls;
use xdp::build_xdp;

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

/// Default `header_read_timeout`: a request head (line and fields) must arrive within 10 s.
pub const DEFAULT_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// Default `idle_timeout`: a connection with no request in flight for 60 s is closed.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_mins(1);
/// Default `drain_grace`: in-flight requests get 10 s after SIGTERM.
pub const DEFAULT_DRAIN_GRACE: Duration = Duration::from_secs(10);
/// Default `upstream_timeout`: the upstream must answer (its response head) within 30 s.
pub const DEFAULT_UPSTREAM_TIMEOUT: Duration = Duration::from_secs(30);

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

/// A key with a value door cannot use, the key and the value each quoted as [`quoted`].
fn invalid(
    key: impl Into<String>,
    value: impl fmt::Display,
    reason: impl Into<String>,
) -> ConfigError {
    ConfigError::Invalid {
        key: quoted(&key.into()),
        value: quoted(&value.to_string()),
        reason: reason.into(),
    }
}

/// Text from the file as an error message quotes it: [`printable`], then [`clipped`].
fn quoted(text: &str) -> String {
    clipped(&printable(text)).into_owned()
}

/// `text` with nothing a terminal would act on or hide: a tab, a line feed or a carriage return
/// as one space, every other control character and every [`invisible`] one as U+FFFD, so that a
/// message shows the file's text on one line, in its order, each character in one column.
fn printable(text: &str) -> Cow<'_, str> {
    if !text.chars().any(|c| c.is_control() || invisible(c)) {
        return Cow::Borrowed(text);
    }
    Cow::Owned(
        text.chars()
            .map(|c| match c {
                '\t' | '\n' | '\r' => ' ',
                c if c.is_control() || invisible(c) => '\u{fffd}',
                c => c,
            })
            .collect(),
    )
}

/// The characters that reorder or hide text where a name is shown: Unicode's format characters
/// (general category Cf: the bidirectional controls of UAX #9, which CVE-2021-42574, "Trojan
/// Source", used to make text read otherwise than it is; the zero-width characters; the
/// invisible operators; the tag characters; the prepended concatenation marks), the line and
/// paragraph separators (Zl, Zp), and the rest of Unicode's Default_Ignorable_Code_Point set
/// (DerivedCoreProperties.txt), which shows as nothing: the combining grapheme joiner, the
/// variation selectors, the Hangul fillers, the Khmer inherent vowels, the reserved U+FFF0–U+FFF8
/// and U+E0000–U+E0FFF. Two names that differ only by these look alike.
fn invisible(c: char) -> bool {
    matches!(
        c,
        '\u{00ad}'
            | '\u{034f}'
            | '\u{0600}'..='\u{0605}'
            | '\u{061c}'
            | '\u{06dd}'
            | '\u{070f}'
            | '\u{0890}'..='\u{0891}'
            | '\u{08e2}'
            | '\u{115f}'..='\u{1160}'
            | '\u{17b4}'..='\u{17b5}'
            | '\u{180b}'..='\u{180f}'
            | '\u{200b}'..='\u{200f}'
            | '\u{2028}'..='\u{202e}'
            | '\u{2060}'..='\u{206f}'
            | '\u{3164}'
            | '\u{fe00}'..='\u{fe0f}'
            | '\u{feff}'
            | '\u{ffa0}'
            | '\u{fff0}'..='\u{fffb}'
            | '\u{110bd}'
            | '\u{110cd}'
            | '\u{13430}'..='\u{1343f}'
            | '\u{1bca0}'..='\u{1bca3}'
            | '\u{1d173}'..='\u{1d17a}'
            | '\u{e0000}'..='\u{e0fff}'
    )
}

/// The most characters of the file's text (a key, a value, a line) an error message quotes.
const QUOTED_CHARS: usize = 120;

/// `text` as an error message quotes it: whole up to [`QUOTED_CHARS`] characters, otherwise
/// their first [`QUOTED_CHARS`] and `…`, so that a value or a line of hundreds of kilobytes is
/// named in one line.
fn clipped(text: &str) -> Cow<'_, str> {
    match text.char_indices().nth(QUOTED_CHARS) {
        Some((end, _)) => Cow::Owned(format!("{}…", text.get(..end).unwrap_or_default())),
        None => Cow::Borrowed(text),
    }
}

fn positive_u32(key: &str, v: i64) -> Result<u32, ConfigError> {
    u32::try_from(v)
        .ok()
        .filter(|v| *v > 0)
        .ok_or_else(|| invalid(key, v, "must be a whole number from 1 to 4294967295"))
}

/// A `max_clients` value: a table size from 1 to [`crate::limit::MAX_CLIENTS`] entries (the
/// upper bound checked, with its reason, by [`crate::limit::Budget::validate`]).
fn table_size(key: &str, v: i64) -> Result<usize, ConfigError> {
    usize::try_from(v).ok().filter(|n| *n > 0).ok_or_else(|| {
        invalid(
            key,
            v,
            format!(
                "must be a whole number from 1 to {}",
                crate::limit::MAX_CLIENTS
            ),
        )
    })
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
    /// Parses an upstream URL: `http://host[:port]`, no path, query, fragment or credentials.
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
        // The `http` crate drops a fragment without a word.
        if s.contains('#') {
            return Err(bad("must not have a fragment"));
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
    /// The flood shield (`[xdp]`; `--xdp-*` / `DOOR_XDP_*`). Default: off (`mode = "off"`) without
    /// an `[xdp]` section or flag; each key's unit and default are on [`XdpConfig`].
    pub xdp: XdpConfig,
    /// TLS termination on every `listen` address (`[tls]`); `None`, the default, serves
    /// cleartext HTTP/1.1 and h2c.
    pub tls: Option<TlsConfig>,
    /// Time allowed for a request head (request line and header fields) to arrive, from the
    /// moment door waits for it (`header_read_timeout`; `--header-read-timeout` /
    /// `DOOR_HEADER_READ_TIMEOUT`): a TLS handshake, a connection's first head in either
    /// protocol, counted from the end of the TLS handshake (or of the PROXY protocol header), and
    /// every next HTTP/1.1 head, counted from the end of the answer before it; the connection is
    /// closed (an HTTP/2 one, known by ALPN, gets a GOAWAY). Default 10 s.
    pub header_read_timeout: Duration,
    /// A connection with no request in flight for this long, after its first request, is closed
    /// (`idle_timeout`; `--idle-timeout` / `DOOR_IDLE_TIMEOUT`): HTTP/2 gets a GOAWAY; an
    /// HTTP/1.1 connection is closed at `header_read_timeout` already, when that is the shorter.
    /// Default 60 s.
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
    /// A response held to its end (a pass-through route's, not a stream's) whose client takes
    /// nothing of a part door holds for it this long is ended, its upstream connection closed,
    /// as nginx's `send_timeout` closes such a connection; an upstream that sends nothing (a long
    /// poll) does not count (`send_timeout`; `--send-timeout` / `DOOR_SEND_TIMEOUT`). Default
    /// 60 s.
    pub send_timeout: Duration,
    /// A pass-through request's body (a route in no group, not a stream) from which door, waiting
    /// for its next part, gets no byte for this long is ended: the upstream call is aborted and
    /// the client answered 408, as nginx's `client_body_timeout` ends one. Only the time door
    /// waits for the client counts, and every part that arrives starts it again
    /// (`body_read_timeout`; `--body-read-timeout` / `DOOR_BODY_READ_TIMEOUT`). Default 60 s.
    pub body_read_timeout: Duration,
    /// Whether limited routes' responses carry the `RateLimit-Policy` and `RateLimit` fields
    /// (`ratelimit_headers`; `--ratelimit-headers` / `DOOR_RATELIMIT_HEADERS`). Default `true`.
    pub ratelimit_headers: bool,
    /// OTLP metrics export (`[otlp]`; `--otlp-*` / `DOOR_OTLP_*`). Default: no export (no
    /// endpoint); the interval's unit and default are on [`OtlpConfig`].
    pub otlp: OtlpConfig,
    /// Budget sharing between doors (`[cluster]`; `--cluster-*` / `DOOR_CLUSTER_*`). Default: off
    /// (no `redis` URL); each key's unit and default are on [`ClusterConfig`].
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
    /// Of those, the requests one TCP peer (its /32 or /64) may have forwarded at once
    /// (`upstream_max_inflight_per_client`; `--upstream-max-inflight-per-client` /
    /// `DOOR_UPSTREAM_MAX_INFLIGHT_PER_CLIENT`); past it door answers 429 with `Retry-After: 1`.
    /// Trusted proxies are exempt, as for `max_connections_per_client`. Default 256.
    pub upstream_max_inflight_per_client: u32,
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

/// The default of [`Config::send_timeout`]: 60 seconds, nginx's `send_timeout`.
pub const DEFAULT_SEND_TIMEOUT: Duration = Duration::from_mins(1);

/// The default of [`Config::body_read_timeout`]: 60 seconds, nginx's `client_body_timeout`.
pub const DEFAULT_BODY_READ_TIMEOUT: Duration = Duration::from_mins(1);

/// The default of [`Config::max_connections_per_client`].
pub const DEFAULT_MAX_CONNECTIONS_PER_CLIENT: u32 = 256;
/// The default of [`Config::upstream_max_inflight`].
pub const DEFAULT_UPSTREAM_MAX_INFLIGHT: u32 = 4096;
/// The default of [`Config::upstream_max_inflight_per_client`]: as many as
/// [`DEFAULT_MAX_CONNECTIONS_PER_CLIENT`] HTTP/1.1 connections carry.
pub const DEFAULT_UPSTREAM_MAX_INFLIGHT_PER_CLIENT: u32 = 256;
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

/// `forwarded_header` (the flag or env beating the file; default `x-forwarded-for`).
///
/// # Errors
/// A value other than `x-forwarded-for` or `forwarded`, named.
fn build_forwarded_header(raw: Option<String>) -> Result<ForwardedSource, ConfigError> {
    match raw {
        Some(h) => h.parse::<ForwardedSource>().map_err(|_| {
            invalid(
                "forwarded_header",
                format!("{h:?}"),
                "must be \"x-forwarded-for\" or \"forwarded\"",
            )
        }),
        None => Ok(ForwardedSource::default()),
    }
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

/// The largest configuration file door reads, in bytes: 4 MiB. A file of many routes and long
/// `allow` and `deny` lists is a few hundred KiB; a path to something else (`/dev/zero`, a log)
/// must not be read without end.
pub const MAX_CONFIG_FILE: u64 = 4 * 1024 * 1024;

/// The configuration file at `path` as text ([`bounded::read`], at most [`MAX_CONFIG_FILE`]
/// bytes).
///
/// # Errors
/// [`ConfigError::Read`] when it cannot be read, is not a regular file, is too large, or is not
/// UTF-8 (naming the offset and line of the first bad byte).
fn read_file(path: &Path) -> Result<String, ConfigError> {
    let read_error = |source| ConfigError::Read {
        path: path.to_owned(),
        source,
    };
    let bytes = bounded::read(path, MAX_CONFIG_FILE).map_err(read_error)?;
    String::from_utf8(bytes).map_err(|e| {
        let at = e.utf8_error().valid_up_to();
        let before = e.as_bytes().get(..at).unwrap_or_default();
        let line = before.split(|&b| b == b'\n').count();
        read_error(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("not UTF-8 (TOML is): the first bad byte is at offset {at}, on line {line}"),
        ))
    })
}

impl Config {
    /// Reads `path` (if any), applies `overrides`, fills in defaults and validates.
    ///
    /// # Errors
    /// [`ConfigError`] naming the file, key and value at fault.
    pub fn load(path: Option<&Path>, overrides: &Overrides) -> Result<Self, ConfigError> {
        Self::load_file(path, overrides, false)
    }

    /// As [`Config::load`], for a reload (SIGHUP) of a running door: a file with nothing in it
    /// but whitespace is refused. Read at a reload, such a file is far more likely one being
    /// written, or truncated by mistake (`>` for `>>`), than a wish for the defaults, and it would
    /// drop every route, group, plane and list of the running door; a file of defaults says so
    /// with a comment. At start an empty file is the defaults.
    ///
    /// # Errors
    /// As [`Config::load`], and [`ConfigError::Parse`] for an empty file.
    pub fn reload(path: Option<&Path>, overrides: &Overrides) -> Result<Self, ConfigError> {
        Self::load_file(path, overrides, true)
    }

    /// [`Config::load`] and [`Config::reload`]: `refuse_empty` refuses a file of whitespace only.
    fn load_file(
        path: Option<&Path>,
        overrides: &Overrides,
        refuse_empty: bool,
    ) -> Result<Self, ConfigError> {
        let mut file = match path {
            Some(path) => {
                let text = read_file(path)?;
                if refuse_empty && text.trim().is_empty() {
                    return Err(ConfigError::Parse {
                        path: path.to_owned(),
                        message: "the file is empty: a reload would drop every route, group and \
                                  list (a file of defaults needs a comment)"
                            .to_owned(),
                    });
                }
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
        let front = build_front(&file, o)?;
        let (
            max_connections,
            [
                max_connections_per_client,
                upstream_max_inflight,
                upstream_max_inflight_per_client,
            ],
        ) = build_connection_limits(&file, o)?;
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
        let forwarded_header =
            build_forwarded_header(o.forwarded_header.clone().or(file.forwarded_header))?;

        let disable_anon_route_limits = o
            .disable_anon_route_limits
            .or(file.disable_anon_route_limits)
            .unwrap_or(false);

        let groups = build_groups(file.group)?;
        let planes = build_planes(file.plane, &groups)?;

        let routes = build_routes(file.route, &groups)?;

        let xdp = build_xdp(file.xdp, o, &listen, (&allow, &deny))?;
        let tls = build_tls(file.tls, o)?;
        let otlp = build_otlp(file.otlp, o)?;
        let cluster = build_cluster(file.cluster, o)?;

        let max_header_fields = build_max_header_fields(file.max_header_fields, o)?;
        let keyed: Vec<(String, SocketAddr)> =
            listeners.iter().map(|l| (l.key.clone(), l.addr)).collect();
        addresses::check(&keyed, admin_listen.as_ref(), &upstream)?;

        let config = Self {
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
            send_timeout: front.send_timeout,
            body_read_timeout: front.body_read_timeout,
            ratelimit_headers: front.ratelimit_headers,
            otlp,
            cluster,
            max_connections,
            max_connections_per_client,
            upstream_max_inflight,
            upstream_max_inflight_per_client,
            max_header_fields,
            planes,
            allow,
            deny,
        };
        check_shield_lists(&config).map(|()| config)
    }
}

/// Refuses lists that take more entries of the XDP shield's lists map than it holds
/// ([`door_common::EXEMPT_CAPACITY`], [`shield_list_entries`]), naming the longest: written to
/// the shield they would fail, and door would start without it (`xdp.mode = "auto"`). Not
/// checked with `xdp.mode = "off"`, where the lists apply at layer 7 only.
fn check_shield_lists(config: &Config) -> Result<(), ConfigError> {
    if config.xdp.mode == XdpMode::Off {
        return Ok(());
    }
    let entries = shield_list_entries(&config.shield_exempt(), &config.shield_denied());
    let capacity = door_common::EXEMPT_CAPACITY as usize;
    if entries <= capacity {
        return Ok(());
    }
    let lists = [
        ("trusted_proxies", config.trusted_proxies.nets()),
        ("allow", config.allow.as_slice()),
        ("deny", config.deny.as_slice()),
        ("xdp.allow", config.xdp.allow.as_slice()),
        ("xdp.deny", config.xdp.deny.as_slice()),
    ];
    let (key, longest) = lists
        .iter()
        .max_by_key(|(_, nets)| nets.len())
        .copied()
        .unwrap_or(("deny", &[]));
    Err(invalid(
        key,
        format!("[{} networks]", longest.len()),
        format!(
            "with trusted_proxies, allow, deny, xdp.allow and xdp.deny these take {entries} \
             entries of the XDP shield's lists, which hold {capacity} (an IPv4 network takes \
             two: its own and its NAT64 form); aggregate them, or set xdp.mode = \"off\""
        ),
    ))
}

impl Config {
    /// The networks the XDP shield never sheds: the trusted proxies (blocking one would block
    /// everyone behind it), `xdp.allow` and `allow`.
    pub fn shield_exempt(&self) -> Vec<IpNet> {
        let mut exempt = self.trusted_proxies.nets().to_vec();
        exempt.extend(self.xdp.allow.iter().copied());
        exempt.extend(self.allow.iter().copied());
        exempt
    }

    /// The networks whose SYNs the XDP shield drops: `deny` and `xdp.deny` (one list, also 403
    /// at layer 7).
    pub fn shield_denied(&self) -> Vec<IpNet> {
        let mut denied = self.deny.clone();
        denied.extend(self.xdp.deny.iter().copied());
        denied
    }

    /// Whether connections on the listener bound to `addr` (an entry of [`Config::listen`]) must
    /// start with a PROXY protocol header.
    pub fn requires_proxy_protocol(&self, addr: SocketAddr) -> bool {
        self.proxy_protocol_listen.contains(&addr)
    }

    /// Whether door binds `addr` (a [`Config::listen`] entry or a TCP [`Config::admin_listen`])
    /// with `IPV6_V6ONLY`: it is the IPv6 wildcard `[::]:P` and door also binds an IPv4 address
    /// on port `P`. Under Linux's default `net.ipv6.bindv6only = 0` the wildcard would claim
    /// that port on the IPv4 addresses too and the IPv4 listener would fail to bind; the IPv4
    /// listener takes IPv4 connections instead. Alone on its port, `[::]` accepts both
    /// families where the kernel lets it.
    pub fn binds_v6_only(&self, addr: SocketAddr) -> bool {
        let admin = self.admin_listen.as_ref().and_then(AdminListen::tcp);
        addresses::binds_v6_only(addr, self.listen.iter().copied().chain(admin))
    }
}

#[cfg(test)]
mod tests;
