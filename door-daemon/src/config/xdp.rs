//! The flood shield (`[xdp]`): its attach mode, SYN budgets, churn guard, lists, escalation and
//! cookie mode.

use std::{net::SocketAddr, time::Duration};

use ipnet::IpNet;

use super::{
    ConfigError,
    durations::parse_duration,
    file::XdpFile,
    flags::Overrides,
    invalid,
    networks::{access_list, lists_together},
    positive_u32,
};

/// Default `[xdp] syn_rate`, SYNs per second per prefix.
pub const DEFAULT_SYN_RATE: f64 = 100.0;
/// Default `[xdp] syn_burst`, SYNs.
pub const DEFAULT_SYN_BURST: u32 = 200;
/// Default `[xdp] new_prefix_rate`, new prefixes per second: with the defaults, a tracked prefix
/// idle for less than (`max_prefixes` − `new_prefix_burst`) / `new_prefix_rate` = (65,536 − 2,000)
/// / 200 ≈ 318 s is never evicted by churn (docs/configuration.md, `[xdp]`).
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
    /// SYN-ACK carrying the kernel's SYN cookie (the default).
    Auto,
    /// Never.
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
    ///
    /// [`Config::listen`]: super::Config::listen
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
    /// Operator allowlist written in the `[xdp]` table: the top-level `allow`'s networks too
    /// (never shed at XDP, never limited at layer 7), as a file that lists `allow` after `[xdp]`
    /// means (trusted proxies are always exempt from the shield too). Default none.
    pub allow: Vec<IpNet>,
    /// Deny list written in the `[xdp]` table: the top-level `deny`'s networks too (every SYN
    /// dropped at XDP, 403 at layer 7). It shares the shield's LPM trie with the allow lists and
    /// the trusted proxies: the longest matching prefix decides, and a prefix on both is denied.
    /// Default none.
    pub deny: Vec<IpNet>,
    /// 429s from one TCP-peer key within `escalate_window` that put it on the XDP blocklist;
    /// 0 (the default) turns escalation off.
    pub escalate_after: u32,
    /// Window for `escalate_after`. Default 10 s.
    pub escalate_window: Duration,
    /// How long an escalated key's SYNs are dropped. Default 60 s.
    pub block_for: Duration,
    /// Cookie mode. Default [`SynCookies::Auto`].
    pub syn_cookies: SynCookies,
    /// SYNs per second of all sources together (after the per-prefix budgets) above which cookie
    /// mode starts. Default 20,000.
    pub cookie_threshold: f64,
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
            crate::limit::number_text(rate),
            "must be a number per second from one a day (0.0000116) to 1e9",
        ))
    }
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

/// `[xdp]`, with `listen` (the effective one, flags applied) for the default `ports`, and the
/// top-level `allow` and `deny` (`lists`), of which `xdp.allow` and `xdp.deny` are more.
pub(super) fn build_xdp(
    file: Option<XdpFile>,
    o: &Overrides,
    listen: &[SocketAddr],
    lists: (&[IpNet], &[IpNet]),
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
    lists_together(&[("allow", lists.0, &allow), ("deny", lists.1, &deny)])?;
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
        None => SynCookies::Auto,
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
