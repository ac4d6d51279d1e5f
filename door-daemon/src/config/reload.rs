//! The reload diff: which settings a SIGHUP cannot apply.

use super::Config;

/// The settings read only at start that differ between `old` and `new` (a reload cannot apply
/// them; a restart does).
pub fn restart_only_changes(old: &Config, new: &Config) -> Vec<&'static str> {
    let mut changed = Vec::new();
    let mut check = |name: &'static str, differs: bool| {
        if differs {
            changed.push(name);
        }
    };
    check(
        "listen",
        old.listen != new.listen || old.proxy_protocol_listen != new.proxy_protocol_listen,
    );
    check("upstream", old.upstream != new.upstream);
    check("admin_listen", old.admin_listen != new.admin_listen);
    check("tls", old.tls != new.tls);
    check(
        "header_read_timeout",
        old.header_read_timeout != new.header_read_timeout,
    );
    check("idle_timeout", old.idle_timeout != new.idle_timeout);
    check(
        "upstream_timeout",
        old.upstream_timeout != new.upstream_timeout,
    );
    check("drain_grace", old.drain_grace != new.drain_grace);
    check("otlp", old.otlp != new.otlp);
    check("xdp.interface", old.xdp.interface != new.xdp.interface);
    check("xdp.mode", old.xdp.mode != new.xdp.mode);
    check(
        "xdp.max_prefixes",
        old.xdp.max_prefixes != new.xdp.max_prefixes,
    );
    changed
}
