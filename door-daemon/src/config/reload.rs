//! The reload diff: which settings a SIGHUP applies in place and which need a restart
//! (docs/operations.md, "Reload").
//!
//! [`restart_only_changes`] destructures [`Config`] and [`XdpConfig`] exhaustively: a field added
//! to either does not compile until it is classed here as reloadable or restart-only.

use super::{Config, XdpConfig};

/// The settings read only at start whose values differ between `old` and `new`, by their
/// configuration key (a reload cannot apply them; a restart does). Everything else (routes,
/// groups, the request planes, trusted proxies, the forwarding header, shadow mode, the
/// `RateLimit` fields, `allow` and `deny`, the TLS certificate, key and minimum version, and the
/// XDP budgets, ports, churn guard, lists, escalation and SYN cookie settings) is applied by the
/// reload itself.
pub fn restart_only_changes(old: &Config, new: &Config) -> Vec<&'static str> {
    let Config {
        listen,
        proxy_protocol_listen,
        upstream,
        admin_listen,
        trusted_proxies: _,
        forwarded_header: _,
        disable_anon_route_limits: _,
        routes: _,
        groups: _,
        xdp,
        tls,
        header_read_timeout,
        idle_timeout,
        drain_grace,
        upstream_timeout,
        stream_idle_timeout,
        send_timeout,
        body_read_timeout,
        ratelimit_headers: _,
        otlp,
        cluster,
        max_connections,
        max_connections_per_client,
        upstream_max_inflight,
        upstream_max_inflight_per_client,
        max_header_fields,
        planes: _,
        allow: _,
        deny: _,
    } = old;
    let checks = [
        (
            "listen",
            *listen != new.listen || *proxy_protocol_listen != new.proxy_protocol_listen,
        ),
        ("upstream", *upstream != new.upstream),
        ("admin_listen", *admin_listen != new.admin_listen),
        // The certificate, key and minimum version reload; turning TLS on or off does not.
        ("tls", tls.is_some() != new.tls.is_some()),
        (
            "header_read_timeout",
            *header_read_timeout != new.header_read_timeout,
        ),
        ("idle_timeout", *idle_timeout != new.idle_timeout),
        (
            "upstream_timeout",
            *upstream_timeout != new.upstream_timeout,
        ),
        ("drain_grace", *drain_grace != new.drain_grace),
        (
            "stream_idle_timeout",
            *stream_idle_timeout != new.stream_idle_timeout,
        ),
        ("send_timeout", *send_timeout != new.send_timeout),
        (
            "body_read_timeout",
            *body_read_timeout != new.body_read_timeout,
        ),
        ("otlp", *otlp != new.otlp),
        ("cluster", *cluster != new.cluster),
        ("max_connections", *max_connections != new.max_connections),
        (
            "max_connections_per_client",
            *max_connections_per_client != new.max_connections_per_client,
        ),
        (
            "upstream_max_inflight",
            *upstream_max_inflight != new.upstream_max_inflight,
        ),
        (
            "upstream_max_inflight_per_client",
            *upstream_max_inflight_per_client != new.upstream_max_inflight_per_client,
        ),
        (
            "max_header_fields",
            *max_header_fields != new.max_header_fields,
        ),
    ];
    checks
        .into_iter()
        .chain(xdp_restart_only_changes(xdp, &new.xdp))
        .filter_map(|(key, differs)| differs.then_some(key))
        .collect()
}

/// The `[xdp]` keys of [`restart_only_changes`], each with whether it differs: the interface and
/// mode the program is attached with, and the size of its maps.
fn xdp_restart_only_changes(old: &XdpConfig, new: &XdpConfig) -> [(&'static str, bool); 3] {
    let XdpConfig {
        interface,
        mode,
        syn_rate: _,
        syn_burst: _,
        ports: _,
        new_prefix_rate: _,
        new_prefix_burst: _,
        overflow_syn_rate: _,
        overflow_syn_burst: _,
        max_prefixes,
        allow: _,
        deny: _,
        escalate_after: _,
        escalate_window: _,
        block_for: _,
        syn_cookies: _,
        cookie_threshold: _,
    } = old;
    [
        ("xdp.interface", *interface != new.interface),
        ("xdp.mode", *mode != new.mode),
        ("xdp.max_prefixes", *max_prefixes != new.max_prefixes),
    ]
}
