//! The command line and the `DOOR_*` environment variables: [`Overrides`], one field per flag
//! (its variable and help in clap's attributes), and the parsers of the values that are not
//! plain text.

use serde::Deserialize;

use super::file::{GroupFile, RouteFile, struct_fields};

/// A flag's value parser (`P`) whose error, for a value read from the flag's environment
/// variable, names the variable: clap names only the flag (`invalid value 'x' for
/// '--max-connections <MAX_CONNECTIONS>'`), where the operator wrote `DOOR_MAX_CONNECTIONS=x`.
#[derive(Debug, Clone)]
pub struct EnvNamed<P>(
    /// The parser of the value itself.
    pub P,
);

impl<P: clap::builder::TypedValueParser> clap::builder::TypedValueParser for EnvNamed<P> {
    type Value = P::Value;

    fn parse_ref(
        &self,
        cmd: &clap::Command,
        arg: Option<&clap::Arg>,
        value: &std::ffi::OsStr,
    ) -> Result<P::Value, clap::Error> {
        self.0.parse_ref(cmd, arg, value)
    }

    fn parse_ref_(
        &self,
        cmd: &clap::Command,
        arg: Option<&clap::Arg>,
        value: &std::ffi::OsStr,
        source: clap::parser::ValueSource,
    ) -> Result<P::Value, clap::Error> {
        self.0.parse_ref_(cmd, arg, value, source).map_err(|mut e| {
            if source == clap::parser::ValueSource::EnvVariable
                && let Some(name) = arg.and_then(clap::Arg::get_env)
            {
                e.insert(
                    clap::error::ContextKind::InvalidArg,
                    clap::error::ContextValue::String(name.to_string_lossy().into_owned()),
                );
            }
            e
        })
    }

    fn parse_(
        &self,
        cmd: &clap::Command,
        arg: Option<&clap::Arg>,
        value: std::ffi::OsString,
        source: clap::parser::ValueSource,
    ) -> Result<P::Value, clap::Error> {
        self.parse_ref_(cmd, arg, &value, source)
    }

    /// The inner parser's values (`--help` lists a switch's `true` and `false`).
    fn possible_values(
        &self,
    ) -> Option<Box<dyn Iterator<Item = clap::builder::PossibleValue> + '_>> {
        self.0.possible_values()
    }
}

/// Settings given as flags or `DOOR_*` environment variables; each beats the file. The `door`
/// binary parses them with clap (flag, then environment variable); every field here is one key of
/// the file (but `group`, any key of any `[group.NAME]`, and `routes`, the whole `[[route]]`
/// list), declared once: its flag, variable and help are the attributes below.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct Overrides {
    /// Address to serve on (repeatable or comma-separated). Default `[::]:8443`: port 8443 on
    /// every IPv6 address, and on every IPv4 address too under Linux's default
    /// `net.ipv6.bindv6only = 0`. `[::]:P` beside an IPv4 address on port P (a `listen` entry or
    /// `admin_listen`) is bound IPv6-only, so both bind.
    #[arg(
        long,
        env = "DOOR_LISTEN",
        value_delimiter = ',',
        global = true,
        help = "Address to serve on (repeatable or comma-separated). Default [::]:8443"
    )]
    pub listen: Option<Vec<String>>,

    /// Address to serve on whose connections must start with a PROXY protocol v1/v2 header from a
    /// trusted proxy (repeatable or comma-separated; with --listen, replaces the file's listen).
    /// Default: none.
    #[arg(
        long,
        env = "DOOR_LISTEN_PROXY_PROTOCOL",
        value_delimiter = ',',
        global = true
    )]
    pub listen_proxy_protocol: Option<Vec<String>>,

    /// The application: http://host:port. Default http://127.0.0.1:3000.
    #[arg(long, env = "DOOR_UPSTREAM", global = true)]
    pub upstream: Option<String>,

    /// Admin status address, or "off". Default 127.0.0.1:9901.
    #[arg(long, env = "DOOR_ADMIN_LISTEN", global = true)]
    pub admin_listen: Option<String>,

    /// Trusted proxy CIDR (repeatable or comma-separated); a /0 is refused. Default: none.
    #[arg(
        long = "trusted-proxy",
        env = "DOOR_TRUSTED_PROXIES",
        value_delimiter = ',',
        global = true
    )]
    pub trusted_proxies: Option<Vec<String>>,

    /// Authoritative header when a trusted proxy sends both: x-forwarded-for or forwarded.
    /// Default x-forwarded-for.
    #[arg(long, env = "DOOR_FORWARDED_HEADER", global = true)]
    pub forwarded_header: Option<String>,

    /// Shadow mode: admit everything, count what would have been refused. `true`/`false`, or
    /// `1`/`0`, `yes`/`no`, `on`/`off`. Default false.
    #[arg(long, env = "DOOR_DISABLE_ANON_ROUTE_LIMITS", global = true, num_args = 0..=1, default_missing_value = "true", value_parser = EnvNamed(clap::builder::BoolishValueParser::new()))]
    pub disable_anon_route_limits: Option<bool>,

    /// Interface the XDP program attaches to. Required unless --xdp-mode is off; default: none.
    #[arg(long, env = "DOOR_XDP_INTERFACE", global = true)]
    pub xdp_interface: Option<String>,

    /// XDP attach mode: auto, driver, skb or off. Default off without an xdp section or --xdp-*
    /// flag, auto with one.
    #[arg(long, env = "DOOR_XDP_MODE", global = true)]
    pub xdp_mode: Option<String>,

    /// TLS certificate chain (PEM); needs --tls-key. Default: none (plain HTTP only).
    #[arg(long, env = "DOOR_TLS_CERT", global = true)]
    pub tls_cert: Option<String>,

    /// TLS private key (PEM: PKCS#8, PKCS#1 or SEC1); needs --tls-cert.
    #[arg(long, env = "DOOR_TLS_KEY", global = true)]
    pub tls_key: Option<String>,

    /// Lowest TLS version: 1.2 or 1.3. Default 1.2.
    #[arg(long, env = "DOOR_TLS_MIN_VERSION", global = true)]
    pub tls_min_version: Option<String>,

    /// Time for a request head to arrive (e.g. 10s). Default 10s.
    #[arg(long, env = "DOOR_HEADER_READ_TIMEOUT", global = true)]
    pub header_read_timeout: Option<String>,

    /// Close connections with no request in flight for this long (e.g. 90s). Default 1m.
    #[arg(long, env = "DOOR_IDLE_TIMEOUT", global = true)]
    pub idle_timeout: Option<String>,

    /// Grace period for in-flight requests after SIGTERM. Default 10s.
    #[arg(long, env = "DOOR_DRAIN_GRACE", global = true)]
    pub drain_grace: Option<String>,

    /// Time for the upstream's response head before a 504. Default 30s.
    #[arg(long, env = "DOOR_UPSTREAM_TIMEOUT", global = true)]
    pub upstream_timeout: Option<String>,

    /// Send RateLimit-Policy and RateLimit fields on limited routes. Default true. `true`/`false`,
    /// or `1`/`0`, `yes`/`no`, `on`/`off`.
    #[arg(long, env = "DOOR_RATELIMIT_HEADERS", global = true, num_args = 0..=1, default_missing_value = "true", value_parser = EnvNamed(clap::builder::BoolishValueParser::new()))]
    pub ratelimit_headers: Option<bool>,

    /// OTLP/HTTP collector base URL (e.g. http://127.0.0.1:4318); OTEL_EXPORTER_OTLP_* also work.
    /// Default: none (no OTLP export).
    #[arg(long, env = "DOOR_OTLP_ENDPOINT", global = true)]
    pub otlp_endpoint: Option<String>,

    /// OTLP export interval (e.g. 10s). Default 10s.
    #[arg(long, env = "DOOR_OTLP_INTERVAL", global = true)]
    pub otlp_interval: Option<String>,
    /// Redis or Valkey URL (redis://HOST:PORT/DB or rediss://) to share budgets through.
    /// Default: none (no cluster).
    #[arg(long, env = "DOOR_CLUSTER_REDIS", global = true)]
    pub cluster_redis: Option<String>,

    /// How often a door syncs with the cluster store (e.g. 250ms). Default 250ms.
    #[arg(long, env = "DOOR_CLUSTER_SYNC_INTERVAL", global = true)]
    pub cluster_sync_interval: Option<String>,

    /// How long the connection and each script call of a cluster sync may take (e.g. 100ms).
    /// Default 100ms.
    #[arg(long, env = "DOOR_CLUSTER_TIMEOUT", global = true)]
    pub cluster_timeout: Option<String>,

    /// PEM file of the CAs a rediss:// store's certificate must chain to. Default: system roots.
    #[arg(long, env = "DOOR_CLUSTER_CA_FILE", global = true)]
    pub cluster_ca_file: Option<String>,
    /// Client connections served at once, door-wide. Default: from the open-file limit.
    #[arg(long, env = "DOOR_MAX_CONNECTIONS", global = true, value_parser = EnvNamed(clap::value_parser!(i64)))]
    pub max_connections: Option<i64>,
    /// Client connections one TCP peer may have open at once. Default 256.
    #[arg(long, env = "DOOR_MAX_CONNECTIONS_PER_CLIENT", global = true, value_parser = EnvNamed(clap::value_parser!(i64)))]
    pub max_connections_per_client: Option<i64>,
    /// Pass-through requests forwarded upstream at once; past it, 503. Default 4096.
    #[arg(long, env = "DOOR_UPSTREAM_MAX_INFLIGHT", global = true, value_parser = EnvNamed(clap::value_parser!(i64)))]
    pub upstream_max_inflight: Option<i64>,
    /// Pass-through requests one TCP peer may have forwarded at once; past it, 429. Default 256.
    #[arg(long, env = "DOOR_UPSTREAM_MAX_INFLIGHT_PER_CLIENT", global = true, value_parser = EnvNamed(clap::value_parser!(i64)))]
    pub upstream_max_inflight_per_client: Option<i64>,
    /// Header fields an HTTP/1.1 request head may have (1 to 1024); past it, 431. Default 100.
    #[arg(long, env = "DOOR_MAX_HEADER_FIELDS", global = true, value_parser = EnvNamed(clap::value_parser!(i64)))]
    pub max_header_fields: Option<i64>,
    /// Close a stream (WebSocket, server-sent events) silent this long (e.g. 5m). Default 5m.
    #[arg(long, env = "DOOR_STREAM_IDLE_TIMEOUT", global = true)]
    pub stream_idle_timeout: Option<String>,
    /// End a response held to its end (pass-through) whose client takes nothing of it this long
    /// (e.g. 60s). Default 60s.
    #[arg(long, env = "DOOR_SEND_TIMEOUT", global = true)]
    pub send_timeout: Option<String>,
    /// End a pass-through request whose body stops arriving this long, with 408 (e.g. 60s).
    /// Default 60s.
    #[arg(long, env = "DOOR_BODY_READ_TIMEOUT", global = true)]
    pub body_read_timeout: Option<String>,
    /// Clients never limited nor shed: CIDRs (repeatable or comma-separated). Default: none.
    #[arg(long, env = "DOOR_ALLOW", value_delimiter = ',', global = true)]
    pub allow: Option<Vec<String>>,
    /// Clients refused (403, SYNs dropped): CIDRs (repeatable or comma-separated). Default: none.
    #[arg(long, env = "DOOR_DENY", value_delimiter = ',', global = true)]
    pub deny: Option<Vec<String>>,

    /// XDP: SYNs per second per source prefix. Default 100.
    #[arg(long, env = "DOOR_XDP_SYN_RATE", global = true, value_parser = EnvNamed(number))]
    pub xdp_syn_rate: Option<f64>,
    /// XDP: SYN burst per source prefix. Default 200.
    #[arg(long, env = "DOOR_XDP_SYN_BURST", global = true, value_parser = EnvNamed(clap::value_parser!(i64)))]
    pub xdp_syn_burst: Option<i64>,
    /// XDP: protected TCP ports (repeatable or comma-separated; "" protects every port). Default:
    /// the ports of listen.
    #[arg(long, env = "DOOR_XDP_PORTS", value_delimiter = ',', global = true)]
    pub xdp_ports: Option<Vec<String>>,
    /// XDP: new source prefixes per second given their own entry; 0 turns the churn guard off.
    /// Default 200.
    #[arg(long, env = "DOOR_XDP_NEW_PREFIX_RATE", global = true, value_parser = EnvNamed(number))]
    pub xdp_new_prefix_rate: Option<f64>,
    /// XDP: churn guard burst, new prefixes. Default 2000.
    #[arg(long, env = "DOOR_XDP_NEW_PREFIX_BURST", global = true, value_parser = EnvNamed(clap::value_parser!(i64)))]
    pub xdp_new_prefix_burst: Option<i64>,
    /// XDP: SYNs per second of the overflow bucket new prefixes share. Default 10000.
    #[arg(long, env = "DOOR_XDP_OVERFLOW_SYN_RATE", global = true, value_parser = EnvNamed(number))]
    pub xdp_overflow_syn_rate: Option<f64>,
    /// XDP: burst of the overflow bucket, SYNs. Default 20000.
    #[arg(long, env = "DOOR_XDP_OVERFLOW_SYN_BURST", global = true, value_parser = EnvNamed(clap::value_parser!(i64)))]
    pub xdp_overflow_syn_burst: Option<i64>,
    /// XDP: entries of the per-prefix map. Default 65536.
    #[arg(long, env = "DOOR_XDP_MAX_PREFIXES", global = true, value_parser = EnvNamed(clap::value_parser!(i64)))]
    pub xdp_max_prefixes: Option<i64>,
    /// XDP: more of the allow list, as xdp.allow: never shed, never limited (repeatable or
    /// comma-separated). Default: none.
    #[arg(long, env = "DOOR_XDP_ALLOW", value_delimiter = ',', global = true)]
    pub xdp_allow: Option<Vec<String>>,
    /// XDP: more of the deny list, as xdp.deny: every SYN dropped, 403 at layer 7 (repeatable
    /// or comma-separated). Default: none.
    #[arg(long, env = "DOOR_XDP_DENY", value_delimiter = ',', global = true)]
    pub xdp_deny: Option<Vec<String>>,
    /// XDP: 429s within --xdp-escalate-window that block a peer's SYNs; 0 is off. Default 0.
    #[arg(long, env = "DOOR_XDP_ESCALATE_AFTER", global = true, value_parser = EnvNamed(clap::value_parser!(i64)))]
    pub xdp_escalate_after: Option<i64>,
    /// XDP: window for --xdp-escalate-after (e.g. 10s). Default 10s.
    #[arg(long, env = "DOOR_XDP_ESCALATE_WINDOW", global = true)]
    pub xdp_escalate_window: Option<String>,
    /// XDP: how long an escalated peer's SYNs are dropped (e.g. 1m). Default 1m.
    #[arg(long, env = "DOOR_XDP_BLOCK_FOR", global = true)]
    pub xdp_block_for: Option<String>,
    /// XDP: SYN cookie mode: auto or off. Default auto.
    #[arg(long, env = "DOOR_XDP_SYN_COOKIES", global = true)]
    pub xdp_syn_cookies: Option<String>,
    /// XDP: SYNs per second of all sources above which cookie mode starts. Default 20000.
    #[arg(long, env = "DOOR_XDP_COOKIE_THRESHOLD", global = true, value_parser = EnvNamed(number))]
    pub xdp_cookie_threshold: Option<f64>,

    /// Session plane: the cookie holding the credential (turns the planes on). Replaces the
    /// file's cookie or header. Default: none (planes off).
    #[arg(long, env = "DOOR_PLANE_SESSION_COOKIE", global = true)]
    pub plane_session_cookie: Option<String>,
    /// Session plane: "authorization" for a Bearer token (turns the planes on). Replaces the
    /// file's cookie or header. Default: none (planes off).
    #[arg(long, env = "DOOR_PLANE_SESSION_HEADER", global = true)]
    pub plane_session_header: Option<String>,
    /// Session plane: tokens per second per verified credential. Default 2.
    #[arg(long, env = "DOOR_PLANE_SESSION_RATE", global = true, value_parser = EnvNamed(number))]
    pub plane_session_rate: Option<f64>,
    /// Session plane: burst per verified credential. Default 60.
    #[arg(long, env = "DOOR_PLANE_SESSION_BURST", global = true, value_parser = EnvNamed(clap::value_parser!(i64)))]
    pub plane_session_burst: Option<i64>,
    /// Session plane: sessions tracked. Default 16384.
    #[arg(long, env = "DOOR_PLANE_SESSION_MAX_CLIENTS", global = true, value_parser = EnvNamed(clap::value_parser!(i64)))]
    pub plane_session_max_clients: Option<i64>,
    /// IP plane: tokens per second per client without a verified credential. Default 0.5.
    #[arg(long, env = "DOOR_PLANE_IP_RATE", global = true, value_parser = EnvNamed(number))]
    pub plane_ip_rate: Option<f64>,
    /// IP plane: burst per client. Default 30.
    #[arg(long, env = "DOOR_PLANE_IP_BURST", global = true, value_parser = EnvNamed(clap::value_parser!(i64)))]
    pub plane_ip_burst: Option<i64>,
    /// IP plane: clients tracked. Default 16384.
    #[arg(long, env = "DOOR_PLANE_IP_MAX_CLIENTS", global = true, value_parser = EnvNamed(clap::value_parser!(i64)))]
    pub plane_ip_max_clients: Option<i64>,

    /// A limit group's key: NAME.KEY=VALUE, e.g. link.rate=2 or webhook.read_timeout=20s
    /// (repeatable or comma-separated). A new group needs rate and burst.
    #[arg(long = "group", value_name = "NAME.KEY=VALUE", env = "DOOR_GROUP", value_delimiter = ',', global = true, value_parser = EnvNamed(GroupSetting::parse))]
    pub group: Vec<GroupSetting>,

    /// A route, as a TOML inline table: `{ group = "link", methods = ["GET"], path = "/l/{id}" }`
    /// (repeatable; DOOR_ROUTES holds a TOML array of them). Replaces the file's routes.
    #[arg(long = "route", value_name = "TABLE", env = "DOOR_ROUTES", global = true, value_parser = EnvNamed(RouteParser))]
    pub routes: Option<Vec<RouteList>>,
}

/// A flag's number (a rate), as Rust reads an `f64`: `2`, `0.5`, `1e9`. The range is checked with
/// the rest of the configuration, naming the key.
///
/// # Errors
/// Text that is not a number, which clap shows with the flag or variable.
fn number(s: &str) -> Result<f64, std::num::ParseFloatError> {
    s.trim().parse()
}

/// One `--group NAME.KEY=VALUE` item (or one element of `DOOR_GROUP`): a key of `[group.NAME]`
/// and its value, typed as the file's. Parsed by [`GroupSetting::parse`].
#[derive(Debug, Clone)]
pub struct GroupSetting {
    /// The group's name (everything before the last `.` left of the `=`).
    pub(super) name: String,
    /// The key, set in an otherwise empty table.
    value: GroupFile,
}

impl GroupSetting {
    /// Parses `NAME.KEY=VALUE`: `KEY` is one of `[group.NAME]`'s keys, `VALUE` a number for
    /// `rate` (tokens per second), a whole number for `burst`, `per_client`, `inflight` and
    /// `max_clients`, and text for `read_timeout` and `charge` (checked with the rest of the
    /// configuration, naming `group.NAME.KEY`).
    ///
    /// # Errors
    /// The reason, for clap to show after the flag or variable and the item: no `=`, no `.`, an
    /// unknown key, a value that is not a number.
    pub fn parse(item: &str) -> Result<Self, String> {
        // `DOOR_GROUP=` (set, empty) sets nothing, as an empty list variable does.
        if item.trim().is_empty() {
            return Ok(Self {
                name: String::new(),
                value: GroupFile::default(),
            });
        }
        let keys = || struct_fields::<GroupFile>().join(", ");
        let (path, value) = item
            .split_once('=')
            .ok_or_else(|| "expected NAME.KEY=VALUE (no '=')".to_owned())?;
        let (name, key) = path
            .trim()
            .rsplit_once('.')
            .ok_or_else(|| "expected NAME.KEY=VALUE (no '.' between group and key)".to_owned())?;
        if name.is_empty() {
            // Not the blank item above: a typo must not set nothing silently.
            return Err(format!(
                "expected NAME.KEY=VALUE (no group name before .{key})"
            ));
        }
        let value = value.trim();
        let whole = || {
            value
                .parse::<i64>()
                .map_err(|_| format!("{key} must be a whole number, not {value:?}"))
        };
        let mut g = GroupFile::default();
        match key {
            "rate" => {
                g.rate = Some(
                    value
                        .parse::<f64>()
                        .map_err(|_| format!("rate must be a number, not {value:?}"))?,
                );
            }
            "burst" => g.burst = Some(whole()?),
            "per_client" => g.per_client = Some(whole()?),
            "inflight" => g.inflight = Some(whole()?),
            "max_clients" => g.max_clients = Some(whole()?),
            "read_timeout" => g.read_timeout = Some(value.to_owned()),
            "charge" => g.charge = Some(value.to_owned()),
            other => return Err(format!("unknown key {other:?} (expected {})", keys())),
        }
        Ok(Self {
            name: name.to_owned(),
            value: g,
        })
    }

    /// Sets this item's key in `table` (the file's `[group.NAME]`, or an empty one).
    pub(super) fn write_into(&self, table: &mut GroupFile) {
        let GroupFile {
            rate,
            burst,
            per_client,
            inflight,
            max_clients,
            read_timeout,
            charge,
        } = self.value.clone();
        table.rate = rate.or(table.rate);
        table.burst = burst.or(table.burst);
        table.per_client = per_client.or(table.per_client);
        table.inflight = inflight.or(table.inflight);
        table.max_clients = max_clients.or(table.max_clients);
        table.read_timeout = read_timeout.or(table.read_timeout.take());
        table.charge = charge.or(table.charge.take());
    }
}

/// The routes of one `--route` value (one) or of `DOOR_ROUTES` (any number), as the file's
/// `[[route]]` tables, not yet checked: [`Config::load`] checks them as it checks the file's.
///
/// [`Config::load`]: super::Config::load
#[derive(Debug, Clone)]
pub struct RouteList(pub(super) Vec<RouteFile>);

/// Parses a `--route` value as one TOML inline table and `DOOR_ROUTES` as a TOML array of them,
/// with the keys of `[[route]]`; an error is clap's (exit 78), naming the flag or (through
/// [`EnvNamed`]) the variable, the value and the TOML parser's reason.
#[derive(Debug, Clone, Copy)]
pub struct RouteParser;

impl RouteParser {
    /// The TOML parser's reason; when the value is of the wrong shape, what shape is expected.
    fn reason(e: &toml::de::Error, shape: &str) -> String {
        let message = e.message().trim_end();
        if message.starts_with("invalid type") {
            format!("{message} ({shape})")
        } else {
            message.to_owned()
        }
    }

    /// One `--route` value: `{ group = "link", path = "/l/{id}" }`.
    fn table(value: &str) -> Result<RouteList, String> {
        const SHAPE: &str = "one TOML inline table: { group = \"…\", path = \"/…\" }";
        let de = toml::de::ValueDeserializer::parse(value).map_err(|e| Self::reason(&e, SHAPE))?;
        let route = RouteFile::deserialize(de).map_err(|e| Self::reason(&e, SHAPE))?;
        Ok(RouteList(vec![route]))
    }

    /// `DOOR_ROUTES`: `[{ group = "link", path = "/l/{id}" }, …]`.
    fn array(value: &str) -> Result<RouteList, String> {
        const SHAPE: &str = "a TOML array of route tables: [{ group = \"…\", path = \"/…\" }]";
        let de = toml::de::ValueDeserializer::parse(value).map_err(|e| Self::reason(&e, SHAPE))?;
        Vec::<RouteFile>::deserialize(de)
            .map(RouteList)
            .map_err(|e| Self::reason(&e, SHAPE))
    }
}

impl clap::builder::TypedValueParser for RouteParser {
    type Value = RouteList;

    fn parse_ref(
        &self,
        cmd: &clap::Command,
        arg: Option<&clap::Arg>,
        value: &std::ffi::OsStr,
    ) -> Result<RouteList, clap::Error> {
        self.parse_ref_(cmd, arg, value, clap::parser::ValueSource::CommandLine)
    }

    fn parse_ref_(
        &self,
        cmd: &clap::Command,
        arg: Option<&clap::Arg>,
        value: &std::ffi::OsStr,
        source: clap::parser::ValueSource,
    ) -> Result<RouteList, clap::Error> {
        let parse: fn(&str) -> Result<RouteList, String> =
            if source == clap::parser::ValueSource::EnvVariable {
                Self::array
            } else {
                Self::table
            };
        parse.parse_ref(cmd, arg, value)
    }
}
