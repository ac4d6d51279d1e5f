//! Budget sharing between doors (`[cluster]`): the store's URL and CA file, the sync interval and
//! the timeout.

use std::{path::PathBuf, time::Duration};

use super::{ConfigError, durations::parse_duration, file::ClusterFile, flags::Overrides, invalid};

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
    /// How long the connection and each of a sync's script calls may take before the door counts
    /// the sync failed; the whole sync may take 3 × `sync_interval`, or `timeout` when that is
    /// longer (`cluster.timeout`; `--cluster-timeout` / `DOOR_CLUSTER_TIMEOUT`). Default 100 ms.
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

pub(super) fn build_cluster(
    file: Option<ClusterFile>,
    o: &Overrides,
) -> Result<ClusterConfig, ConfigError> {
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
