//! `door check-config`'s output: a validated [`Config`] printed back as TOML, every default
//! filled in, that door itself accepts (printing, parsing and printing again gives the same
//! [`Config`], and the same text but for the notes below).
//!
//! A default that follows another key rather than its fixed value carries a note, a TOML comment
//! on its line (`per_client = 5  # follows burst (charge = "on_failure"; default 16)`). The note
//! describes the file that was read: the printed text writes the value out, so printing it again
//! shows the value without the note.
//!
//! Secrets never print. Every field is written by name through [`TomlWriter`], and each must
//! choose: [`TomlWriter::clear`] shows its value, [`TomlWriter::secret`] prints `"<elided>"`
//! without ever seeing the value. The printer destructures every configuration struct
//! exhaustively, so a field added to [`Config`] (or [`XdpConfig`], [`GroupConfig`]) does not
//! compile until it is added here, with that choice made. A key that names a file holding a
//! secret (`tls.key`) is not itself a secret and prints in clear; a key whose value *is* a secret
//! (a password, a token) must use `secret`, and then the output no longer parses back to the
//! same [`Config`] (an operator fills the secret in again).

use std::{fmt::Write as _, time::Duration};

use toml::Value;

use crate::{
    config::{Config, GroupConfig, XdpConfig},
    limit::Budget,
};

/// `admin_listen`'s spelling: the address or socket, or `off`.
fn off_or(at: Option<&crate::config::AdminListen>) -> String {
    at.map_or_else(|| "off".to_owned(), ToString::to_string)
}

/// What a secret value prints as.
pub const ELIDED: &str = "<elided>";

/// `[tls]`: the certificate's and the key's paths (the key file's path, not the key: not a
/// secret) and the minimum version.
fn write_tls(w: &mut TomlWriter, tls: &crate::config::TlsConfig) {
    let crate::config::TlsConfig {
        cert,
        key,
        min_version,
    } = tls;
    w.table("tls");
    w.clear("cert", cert.display().to_string());
    w.clear("key", key.display().to_string());
    w.clear("min_version", min_version.as_str());
}

impl Config {
    /// The effective configuration as TOML that door accepts back: every key with its value,
    /// defaults filled in, secrets as `"<elided>"`. Top-level keys first, then `[tls]`, `[otlp]`
    /// (when set), `[[route]]` in order, `[group.NAME]` by name, and `[xdp]`.
    pub fn to_toml(&self) -> String {
        let Config {
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
            header_read_timeout,
            idle_timeout,
            drain_grace,
            upstream_timeout,
            stream_idle_timeout,
            send_timeout,
            body_read_timeout,
            ratelimit_headers,
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
        } = self;
        let mut w = TomlWriter::default();
        let listen: Vec<Value> = listen
            .iter()
            .map(|addr| {
                if proxy_protocol_listen.contains(addr) {
                    let mut t = toml::map::Map::new();
                    t.insert("addr".to_owned(), Value::from(addr.to_string()));
                    t.insert("proxy_protocol".to_owned(), Value::from(true));
                    Value::Table(t)
                } else {
                    Value::from(addr.to_string())
                }
            })
            .collect();
        w.clear("listen", listen);
        w.clear("upstream", upstream.to_string());
        w.clear("admin_listen", off_or(admin_listen.as_ref()));
        w.clear("trusted_proxies", strings(trusted_proxies.nets()));
        w.clear("allow", strings(allow));
        w.clear("deny", strings(deny));
        w.clear(
            "forwarded_header",
            forwarded_header.to_string().to_ascii_lowercase(),
        );
        w.clear("disable_anon_route_limits", *disable_anon_route_limits);
        w.clear("header_read_timeout", duration(*header_read_timeout));
        w.clear("idle_timeout", duration(*idle_timeout));
        w.clear("drain_grace", duration(*drain_grace));
        w.clear("upstream_timeout", duration(*upstream_timeout));
        w.clear("stream_idle_timeout", duration(*stream_idle_timeout));
        w.clear("send_timeout", duration(*send_timeout));
        w.clear("body_read_timeout", duration(*body_read_timeout));
        w.clear("ratelimit_headers", *ratelimit_headers);
        write_connection_limits(
            &mut w,
            *max_connections,
            [
                *max_connections_per_client,
                *upstream_max_inflight,
                *upstream_max_inflight_per_client,
            ],
        );
        w.clear(
            "max_header_fields",
            i64::try_from(*max_header_fields).unwrap_or(i64::MAX),
        );
        if let Some(tls) = tls {
            write_tls(&mut w, tls);
        }
        write_otlp(&mut w, otlp);
        write_cluster(&mut w, cluster);
        for route in routes {
            write_route(&mut w, route);
        }
        for (name, group) in groups {
            w.table(&format!("group.{}", key_repr(name)));
            write_group(&mut w, group);
        }
        if let Some(planes) = planes {
            write_planes(&mut w, planes);
        }
        w.table("xdp");
        write_xdp(&mut w, xdp);
        w.out
    }
}

/// `max_connections` (a comment when it is derived at start), then `max_connections_per_client`,
/// `upstream_max_inflight` and `upstream_max_inflight_per_client` (`caps`, in that order).
/// The connection caps and the pass-through caps; a per-client cap above its total is noted
/// (accepted, but then it never binds: one client can take everything).
fn write_connection_limits(w: &mut TomlWriter, max_connections: Option<u32>, caps: [u32; 3]) {
    match max_connections {
        Some(n) => w.clear("max_connections", i64::from(n)),
        None => w.comment("max_connections: not set, derived at start from the open-file limit"),
    }
    let [per_client, inflight, inflight_per_client] = caps;
    let per_client_cap =
        |w: &mut TomlWriter, key: &str, cap: u32, total: Option<u32>, of: &str| match total
            .filter(|total| cap > *total)
        {
            Some(total) => w.clear_noted(
                key,
                i64::from(cap),
                &format!("above {of} ({total}): one client can take all {total}"),
            ),
            None => w.clear(key, i64::from(cap)),
        };
    per_client_cap(
        w,
        "max_connections_per_client",
        per_client,
        max_connections,
        "max_connections",
    );
    w.clear("upstream_max_inflight", i64::from(inflight));
    per_client_cap(
        w,
        "upstream_max_inflight_per_client",
        inflight_per_client,
        Some(inflight),
        "upstream_max_inflight",
    );
}

fn write_planes(w: &mut TomlWriter, p: &crate::config::PlanesConfig) {
    let crate::config::PlanesConfig {
        credential,
        session,
        ip,
    } = p;
    w.table("plane.session");
    match credential {
        crate::client::credential::Credential::Cookie(name) => w.clear("cookie", name.clone()),
        crate::client::credential::Credential::Bearer => w.clear("header", "authorization"),
    }
    for (table, b) in [("plane.session", session), ("plane.ip", ip)] {
        if table == "plane.ip" {
            w.table(table);
        }
        w.clear("rate", b.rate);
        w.clear("burst", i64::from(b.burst));
        w.clear(
            "max_clients",
            i64::try_from(b.max_clients).unwrap_or(i64::MAX),
        );
    }
}

/// `[otlp]`, when either key is set.
fn write_otlp(w: &mut TomlWriter, otlp: &crate::config::OtlpConfig) {
    let crate::config::OtlpConfig { endpoint, interval } = otlp;
    if endpoint.is_some() || interval.is_some() {
        w.table("otlp");
        if let Some(endpoint) = endpoint {
            // As `cluster.redis`: a URL with credentials (`https://user:token@collector`) is a
            // secret, and check-config's output reaches the journal.
            if endpoint.contains('@') {
                w.clear("endpoint", ELIDED);
            } else {
                w.clear("endpoint", endpoint.clone());
            }
        }
        if let Some(interval) = interval {
            w.clear("interval", duration(*interval));
        }
    }
}

/// `[cluster]`, when `redis` is set.
fn write_cluster(w: &mut TomlWriter, cluster: &crate::config::ClusterConfig) {
    if let Some(redis) = &cluster.redis {
        w.table("cluster");
        // A URL with credentials (`redis://user:password@host`) is a secret.
        if redis.contains('@') {
            w.clear("redis", ELIDED);
        } else {
            w.clear("redis", redis.clone());
        }
        w.clear("sync_interval", duration(cluster.sync_interval));
        w.clear("timeout", duration(cluster.timeout));
        if let Some(ca) = &cluster.ca_file {
            w.clear("ca_file", ca.display().to_string());
        }
    }
}

fn write_route(w: &mut TomlWriter, route: &crate::http::route::Route) {
    let crate::http::route::Route {
        group,
        methods,
        path,
        stream,
    } = route;
    w.array_table("route");
    w.clear("group", group.clone());
    w.clear(
        "methods",
        methods
            .iter()
            .map(|m| Value::from(m.as_str()))
            .collect::<Vec<_>>(),
    );
    w.clear("path", path.as_str());
    w.clear("stream", *stream);
}

fn write_group(w: &mut TomlWriter, g: &GroupConfig) {
    let GroupConfig {
        budget,
        read_timeout,
        per_client_follows,
    } = g;
    let Budget {
        rate,
        burst,
        per_client,
        inflight,
        max_clients,
        charge,
    } = budget;
    w.clear("rate", *rate);
    w.clear("burst", i64::from(*burst));
    match per_client_follows {
        Some(follows) => w.clear_noted("per_client", i64::from(*per_client), &follows.to_string()),
        None => w.clear("per_client", i64::from(*per_client)),
    }
    w.clear("inflight", i64::from(*inflight));
    w.clear(
        "max_clients",
        i64::try_from(*max_clients).unwrap_or(i64::MAX),
    );
    w.clear("read_timeout", duration(*read_timeout));
    w.clear("charge", charge.as_str());
}

fn write_xdp(w: &mut TomlWriter, x: &XdpConfig) {
    let XdpConfig {
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
    } = x;
    // No interface (mode "off") is the key's absence: TOML has no null.
    if let Some(interface) = interface {
        w.clear("interface", interface.clone());
    }
    w.clear("mode", mode.as_str());
    w.clear("syn_rate", *syn_rate);
    w.clear("syn_burst", i64::from(*syn_burst));
    w.clear(
        "ports",
        ports
            .iter()
            .map(|p| Value::from(i64::from(*p)))
            .collect::<Vec<_>>(),
    );
    w.clear("new_prefix_rate", *new_prefix_rate);
    w.clear("new_prefix_burst", i64::from(*new_prefix_burst));
    w.clear("overflow_syn_rate", *overflow_syn_rate);
    w.clear("overflow_syn_burst", i64::from(*overflow_syn_burst));
    w.clear("max_prefixes", i64::from(*max_prefixes));
    w.clear("allow", strings(allow));
    w.clear("deny", strings(deny));
    w.clear("escalate_after", i64::from(*escalate_after));
    w.clear("escalate_window", duration(*escalate_window));
    w.clear("block_for", duration(*block_for));
    w.clear("syn_cookies", syn_cookies.as_str());
    w.clear("cookie_threshold", *cookie_threshold);
}

/// Writes TOML one key at a time; every value goes through [`TomlWriter::clear`] or
/// [`TomlWriter::secret`].
#[derive(Debug, Default)]
pub struct TomlWriter {
    out: String,
}

impl TomlWriter {
    /// Starts `[name]` (`name` already a valid dotted key).
    pub fn table(&mut self, name: &str) {
        let _ = write!(self.out, "\n[{name}]\n");
    }

    /// Starts one `[[name]]` element.
    pub fn array_table(&mut self, name: &str) {
        let _ = write!(self.out, "\n[[{name}]]\n");
    }

    /// `key = value`, shown in clear: for settings that are not secrets.
    pub fn clear(&mut self, key: &str, value: impl Into<Value>) {
        let _ = writeln!(self.out, "{} = {}", key_repr(key), value.into());
    }

    /// `key = value  # note`, shown in clear, with a comment saying where the value comes from
    /// (a default that follows another key). The note is one line: line breaks print as spaces.
    pub fn clear_noted(&mut self, key: &str, value: impl Into<Value>, note: &str) {
        let note = note.replace(['\r', '\n'], " ");
        let _ = writeln!(self.out, "{} = {}  # {note}", key_repr(key), value.into());
    }

    /// `key = "<elided>"`: for a setting whose value is a secret. Takes no value, so the secret
    /// cannot reach the output by mistake.
    pub fn secret(&mut self, key: &str) {
        self.clear(key, ELIDED);
    }

    /// `# text`: a remark for the reader, which door ignores when it reads the file back.
    pub fn comment(&mut self, text: &str) {
        for line in text.lines() {
            let _ = writeln!(self.out, "# {line}");
        }
    }

    /// The text written so far.
    pub fn as_str(&self) -> &str {
        &self.out
    }
}

/// A key as TOML spells it: bare if it only has `A-Za-z0-9_-`, quoted otherwise.
fn key_repr(key: &str) -> String {
    if !key.is_empty()
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    {
        key.to_owned()
    } else {
        Value::from(key).to_string()
    }
}

/// A duration as the configuration writes it, in days at most (`"30s"`, `"1m"`, `"1s 500ms"`,
/// `"365d"`): each unit's part, largest first, those that are zero left out. humantime's own
/// printer counts months and years of 30.44 and 365.25 days, so `"365d"` came back as
/// `"11months 30days 3h 50m 24s"`; both read as the same duration.
fn duration(d: Duration) -> String {
    const UNITS: [(&str, u128); 7] = [
        ("d", 86_400_000_000_000),
        ("h", 3_600_000_000_000),
        ("m", 60_000_000_000),
        ("s", 1_000_000_000),
        ("ms", 1_000_000),
        ("us", 1_000),
        ("ns", 1),
    ];
    let mut left = d.as_nanos();
    let mut parts = Vec::new();
    for (unit, nanos) in UNITS {
        let n = left / nanos;
        left %= nanos;
        if n > 0 {
            parts.push(format!("{n}{unit}"));
        }
    }
    if parts.is_empty() {
        "0s".to_owned()
    } else {
        parts.join(" ")
    }
}

fn strings<T: ToString>(items: &[T]) -> Vec<Value> {
    items.iter().map(|i| Value::from(i.to_string())).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every key given a non-default value, a new group with an awkward name, two routes.
    const FULL: &str = r#"
listen = ["127.0.0.1:8443", "[::1]:8443"]
upstream = "http://[::1]:3001"
admin_listen = "off"
trusted_proxies = ["192.0.2.10", "2001:db8::/64"]
forwarded_header = "forwarded"
disable_anon_route_limits = true

[[route]]
group = "webhook"
methods = ["post", "PUT"]
path = "/webhooks/github"
[[route]]
group = "my api"
path = "/api/{version}/items"

[group.link]
rate = 0.25
burst = 3
per_client = 1
inflight = 2
max_clients = 100
read_timeout = "1500ms"
charge = "on_failure"

[group."my api"]
rate = 1e-3
burst = 7

[xdp]
interface = "eth0"
mode = "driver"
syn_rate = 12.5
syn_burst = 25
ports = []
new_prefix_rate = 0.0
new_prefix_burst = 5
allow = ["198.51.100.0/24"]
escalate_after = 5
escalate_window = "2m"
block_for = "1h 30m"
"#;

    /// A per-client cap above its total is accepted, and `check-config` says it never binds.
    #[test]
    fn a_per_client_cap_above_its_total_is_noted() {
        let text = "listen = [\"127.0.0.1:8443\"]\nupstream = \"http://127.0.0.1:3000\"\n\
                    max_connections = 10\nmax_connections_per_client = 20\n\
                    upstream_max_inflight = 5\nupstream_max_inflight_per_client = 6\n";
        let printed = Config::from_toml("door.toml", text).unwrap().to_toml();
        assert!(
            printed.contains(
                "max_connections_per_client = 20  # above max_connections (10): one client can \
                 take all 10"
            ),
            "{printed}"
        );
        assert!(
            printed.contains(
                "upstream_max_inflight_per_client = 6  # above upstream_max_inflight (5): one \
                 client can take all 5"
            ),
            "{printed}"
        );
        assert_eq!(
            Config::from_toml("printed", &printed).unwrap(),
            Config::from_toml("door.toml", text).unwrap()
        );
        let within = text.replace("= 20", "= 10").replace("= 6", "= 5");
        assert!(
            !Config::from_toml("door.toml", &within)
                .unwrap()
                .to_toml()
                .contains("above")
        );
    }

    /// Durations print in the units an operator writes, never months, and read back as the
    /// same duration.
    #[test]
    fn durations_print_in_days_at_most_and_read_back() {
        for (d, text) in [
            (Duration::from_hours(365 * 24), "365d"),
            (Duration::from_secs(90), "1m 30s"),
            (Duration::from_millis(1500), "1s 500ms"),
            (Duration::from_hours(30 * 24 + 1), "30d 1h"),
            (Duration::from_millis(1), "1ms"),
            (Duration::from_nanos(1_001), "1us 1ns"),
            (Duration::ZERO, "0s"),
        ] {
            assert_eq!(duration(d), text);
            assert_eq!(humantime::parse_duration(text).unwrap(), d, "{text}");
        }
    }

    proptest::proptest! {
        #[test]
        fn every_duration_reads_back_as_printed(nanos in 0..=crate::config::durations::MAX_DURATION.as_nanos()) {
            let d = Duration::from_nanos(u64::try_from(nanos).unwrap());
            proptest::prop_assert_eq!(humantime::parse_duration(&duration(d)).unwrap(), d);
        }
    }

    fn round_trip(text: &str) {
        let first = Config::from_toml("door.toml", text).unwrap();
        let printed = first.to_toml();
        let second = Config::from_toml("printed", &printed)
            .unwrap_or_else(|e| panic!("the printed configuration does not parse: {e}\n{printed}"));
        assert_eq!(first, second, "{printed}");
        assert_eq!(
            without_notes(&printed),
            second.to_toml(),
            "printing is stable (the printed file writes out the values the notes explain)"
        );
    }

    /// `text` with each line's note (`  # …`) cut off.
    fn without_notes(text: &str) -> String {
        let mut out = String::new();
        for line in text.lines() {
            out.push_str(line.split_once("  # ").map_or(line, |(kv, _)| kv));
            out.push('\n');
        }
        out
    }

    #[test]
    fn defaults_round_trip() {
        round_trip("");
    }

    #[test]
    fn every_key_round_trips() {
        round_trip(FULL);
    }

    #[test]
    fn the_example_round_trips() {
        round_trip(include_str!("../../../examples/door.toml"));
    }

    #[test]
    fn defaults_are_filled_in() {
        let printed = Config::from_toml("t", "").unwrap().to_toml();
        for line in [
            "listen = [\"[::]:8443\"]",
            "upstream = \"http://127.0.0.1:3000\"",
            "admin_listen = \"127.0.0.1:9901\"",
            "trusted_proxies = []",
            "forwarded_header = \"x-forwarded-for\"",
            "disable_anon_route_limits = false",
            "[group.webhook]",
            "charge = \"on_failure\"",
            "read_timeout = \"10s\"",
            "[xdp]",
            "mode = \"off\"",
            "ports = [8443]",
            "block_for = \"1m\"",
        ] {
            assert!(
                printed.lines().any(|l| l == line),
                "{line:?} missing:\n{printed}"
            );
        }
        assert!(
            !printed.contains("interface"),
            "no interface without one: {printed}"
        );
        assert!(
            !printed.contains("  # "),
            "no notes on fixed defaults: {printed}"
        );
    }

    #[test]
    fn a_per_client_that_follows_another_key_says_so() {
        let text = "[group.webhook]\nburst = 5\n[group.link]\ninflight = 1\n\
                    [group.health]\ninflight = 3\nburst = 3\ncharge = \"on_failure\"\n";
        let printed = Config::from_toml("t", text).unwrap().to_toml();
        for line in [
            "per_client = 5  # follows burst (charge = \"on_failure\"; default 16)",
            "per_client = 1  # follows inflight (default 2)",
            "per_client = 3  # follows inflight and burst (charge = \"on_failure\"; default 4)",
        ] {
            assert!(
                printed.lines().any(|l| l == line),
                "{line:?} missing:\n{printed}"
            );
        }
        round_trip(text);
        let written = Config::from_toml("t", "[group.webhook]\nburst = 5\nper_client = 5\n")
            .unwrap()
            .to_toml();
        assert!(
            written.lines().any(|l| l == "per_client = 5"),
            "a value the file gives has no note:\n{written}"
        );
    }

    #[test]
    fn the_default_xdp_ports_print_as_the_listen_ports() {
        let text = "listen = [\"127.0.0.1:8080\", \"[::1]:8443\", \"[::]:8080\"]\n\
                    [xdp]\ninterface = \"lo\"\n";
        let printed = Config::from_toml("t", text).unwrap().to_toml();
        assert!(
            printed.lines().any(|l| l == "ports = [8080, 8443]"),
            "{printed}"
        );
        round_trip(text);
    }

    #[test]
    fn a_unix_admin_socket_prints_back() {
        let text = "admin_listen = \"unix:/run/door/admin.sock\"\n";
        let printed = Config::from_toml("t", text).unwrap().to_toml();
        assert!(
            printed.contains("admin_listen = \"unix:/run/door/admin.sock\""),
            "{printed}"
        );
        round_trip(text);
    }

    #[test]
    fn unusual_values_are_spelled_back_exactly() {
        let printed = Config::from_toml("t", FULL).unwrap().to_toml();
        assert!(printed.contains("\n[group.\"my api\"]\n"), "{printed}");
        assert!(
            printed.contains("methods = [\"POST\", \"PUT\"]"),
            "{printed}"
        );
        assert!(printed.contains("read_timeout = \"1s 500ms\""), "{printed}");
        assert!(printed.contains("block_for = \"1h 30m\""), "{printed}");
        assert!(printed.contains("admin_listen = \"off\""), "{printed}");
        assert!(
            printed.contains("trusted_proxies = [\"192.0.2.10/32\", \"2001:db8::/64\"]"),
            "{printed}"
        );
    }

    #[test]
    fn urls_with_credentials_print_elided() {
        let text = "[otlp]\nendpoint = \"http://user:secret@collector:4318\"\n\
                    [cluster]\nredis = \"redis://:secret@127.0.0.1:6379\"\n";
        let printed = Config::from_toml("door.toml", text).unwrap().to_toml();
        assert!(!printed.contains("secret"), "{printed}");
        assert!(printed.contains("endpoint = \"<elided>\""), "{printed}");
        assert!(printed.contains("redis = \"<elided>\""), "{printed}");
    }

    #[test]
    fn secrets_print_elided() {
        let mut w = TomlWriter::default();
        w.clear("cert", "/etc/door/cert.pem");
        w.secret("password");
        assert_eq!(
            w.as_str(),
            "cert = \"/etc/door/cert.pem\"\npassword = \"<elided>\"\n"
        );
    }

    #[test]
    fn keys_are_quoted_when_needed() {
        assert_eq!(key_repr("link"), "link");
        assert_eq!(key_repr("a-b_c9"), "a-b_c9");
        assert_eq!(key_repr("my api"), "\"my api\"");
        assert_eq!(key_repr("a.b"), "\"a.b\"");
        assert_eq!(key_repr(""), "\"\"");
    }
}
