//! Where door listens: `listen` (its PROXY protocol listeners too) and `admin_listen`.

use std::{fmt, net::SocketAddr, path::PathBuf};

use super::{ConfigError, DEFAULT_LISTEN, flags::Overrides, invalid};
use crate::client::key::TrustedProxies;

/// One validated `listen` entry.
pub(super) struct ListenEntry {
    /// `listen[i]`, for later errors.
    pub(super) key: String,
    pub(super) addr: SocketAddr,
    proxy_protocol: bool,
}

/// `listen` from the flags (which replace the file's list when either flag is given: the
/// `--listen` addresses, then the `--listen-proxy-protocol` ones, each possibly comma-separated),
/// else from the file, else the default. File entries are `"ip:port"` or
/// `{ addr = "ip:port", proxy_protocol = bool }`.
pub(super) fn build_listen(
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
pub(super) const LISTEN_TABLE_KEYS: [&str; 2] = ["addr", "proxy_protocol"];

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

/// The listeners given with `proxy_protocol = true`; each needs `trusted_proxies` (the header is
/// accepted only from a trusted proxy, so every connection would be refused).
pub(super) fn proxy_protocol_listeners(
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

impl AdminListen {
    /// The TCP socket address, `None` for a Unix socket.
    pub fn tcp(&self) -> Option<SocketAddr> {
        match self {
            Self::Tcp(addr) => Some(*addr),
            Self::Unix(_) => None,
        }
    }
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
pub(super) fn build_admin_listen(raw: &str) -> Result<Option<AdminListen>, ConfigError> {
    if raw == "off" {
        return Ok(None);
    }
    raw.parse().map(Some)
}
