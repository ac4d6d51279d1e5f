//! The configuration file as serde reads it: one struct per table, every key optional; the
//! parser, whose errors name a key by its dotted path; and [`known_keys`], every key it accepts.

use std::{borrow::Cow, collections::BTreeMap, path::Path};

use serde::Deserialize;
use unicode_width::UnicodeWidthChar;

use super::{ConfigError, QUOTED_CHARS, clipped, listen::LISTEN_TABLE_KEYS, printable, quoted};

/// The file's top level as written: every key optional, checked and given its default by
/// [`Config`](super::Config), whose fields (and docs/configuration.md) state each key's unit and
/// default. The tables below mirror the file's sections the same way.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct File {
    pub(super) listen: Option<Vec<toml::Value>>,
    pub(super) upstream: Option<String>,
    pub(super) trusted_proxies: Option<Vec<String>>,
    pub(super) allow: Option<Vec<String>>,
    pub(super) deny: Option<Vec<String>>,
    pub(super) forwarded_header: Option<String>,
    pub(super) disable_anon_route_limits: Option<bool>,
    pub(super) admin_listen: Option<String>,
    #[serde(default)]
    pub(super) route: Vec<RouteFile>,
    #[serde(default)]
    pub(super) group: BTreeMap<String, GroupFile>,
    pub(super) plane: Option<PlaneFile>,
    pub(super) xdp: Option<XdpFile>,
    pub(super) tls: Option<TlsFile>,
    pub(super) header_read_timeout: Option<String>,
    pub(super) idle_timeout: Option<String>,
    pub(super) drain_grace: Option<String>,
    pub(super) upstream_timeout: Option<String>,
    pub(super) stream_idle_timeout: Option<String>,
    pub(super) send_timeout: Option<String>,
    pub(super) body_read_timeout: Option<String>,
    pub(super) ratelimit_headers: Option<bool>,
    pub(super) otlp: Option<OtlpFile>,
    pub(super) cluster: Option<ClusterFile>,
    pub(super) max_connections: Option<i64>,
    pub(super) max_connections_per_client: Option<i64>,
    pub(super) upstream_max_inflight: Option<i64>,
    pub(super) upstream_max_inflight_per_client: Option<i64>,
    pub(super) max_header_fields: Option<i64>,
}

/// `[tls]` as written; checked into [`TlsConfig`](super::TlsConfig).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct TlsFile {
    pub(super) cert: Option<String>,
    pub(super) key: Option<String>,
    pub(super) min_version: Option<String>,
}

/// `[cluster]` as written; checked into [`ClusterConfig`](super::ClusterConfig).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ClusterFile {
    pub(super) redis: Option<String>,
    pub(super) sync_interval: Option<String>,
    pub(super) timeout: Option<String>,
    pub(super) ca_file: Option<String>,
}

/// `[otlp]` as written; checked into [`OtlpConfig`](super::OtlpConfig).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct OtlpFile {
    pub(super) endpoint: Option<String>,
    pub(super) interval: Option<String>,
}

/// One `[[route]]` as written (`group` and `path` required, `methods` every method when empty,
/// `stream` false when absent); checked into a [`Route`](crate::http::route::Route).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RouteFile {
    pub(super) group: String,
    #[serde(default)]
    pub(super) methods: Vec<String>,
    pub(super) path: String,
    #[serde(default)]
    pub(super) stream: bool,
}

/// `[plane]` as written: its two tables, checked together into
/// [`PlanesConfig`](super::PlanesConfig).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct PlaneFile {
    pub(super) session: Option<SessionPlaneFile>,
    pub(super) ip: Option<IpPlaneFile>,
}

/// `[plane.session]` as written (the credential's `cookie` or `header`, the plane's budget).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct SessionPlaneFile {
    pub(super) cookie: Option<String>,
    pub(super) header: Option<String>,
    pub(super) rate: Option<f64>,
    pub(super) burst: Option<i64>,
    pub(super) max_clients: Option<i64>,
}

/// `[plane.ip]` as written (the plane's budget).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct IpPlaneFile {
    pub(super) rate: Option<f64>,
    pub(super) burst: Option<i64>,
    pub(super) max_clients: Option<i64>,
}

/// One `[group.NAME]` as written: every key optional, a built-in group's defaults filling the
/// rest; checked into a [`GroupConfig`](super::GroupConfig).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct GroupFile {
    pub(super) rate: Option<f64>,
    pub(super) burst: Option<i64>,
    pub(super) per_client: Option<i64>,
    pub(super) inflight: Option<i64>,
    pub(super) max_clients: Option<i64>,
    pub(super) read_timeout: Option<String>,
    pub(super) charge: Option<String>,
}

/// `[xdp]` as written; checked into [`XdpConfig`](super::XdpConfig).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct XdpFile {
    pub(super) interface: Option<String>,
    pub(super) mode: Option<String>,
    pub(super) syn_rate: Option<f64>,
    pub(super) syn_burst: Option<i64>,
    pub(super) ports: Option<Vec<i64>>,
    pub(super) new_prefix_rate: Option<f64>,
    pub(super) new_prefix_burst: Option<i64>,
    pub(super) overflow_syn_rate: Option<f64>,
    pub(super) overflow_syn_burst: Option<i64>,
    pub(super) max_prefixes: Option<i64>,
    pub(super) allow: Option<Vec<String>>,
    pub(super) deny: Option<Vec<String>>,
    pub(super) escalate_after: Option<i64>,
    pub(super) escalate_window: Option<String>,
    pub(super) block_for: Option<String>,
    pub(super) syn_cookies: Option<String>,
    pub(super) cookie_threshold: Option<f64>,
}

/// Parses the file's text. A value of the wrong type, an unknown key or a missing one is named by
/// its dotted key (serde_path_to_error follows the deserializer down), with the value as written
/// (once) and its line and column: `group.link.burst = 1.5: expected a whole number, found
/// floating point (line 2, column 9)`. A syntax error keeps toml's own message, which quotes the
/// line.
pub(super) fn parse_file(path: &Path, text: &str) -> Result<File, ConfigError> {
    let parse_error = |message: String| ConfigError::Parse {
        path: path.to_owned(),
        message,
    };
    let syntax = |e: toml::de::Error| parse_error(syntax_message(text, &e));
    let de = toml::Deserializer::parse(text).map_err(syntax)?;
    serde_path_to_error::deserialize(de).map_err(|e| {
        let key = quoted(&e.path().to_string());
        let inner = e.into_inner();
        let Some(span) = inner.span().filter(|_| key != ".") else {
            return syntax(inner);
        };
        let written = quoted(text.get(span.clone()).unwrap_or_default());
        let before = text.get(..span.start).unwrap_or_default();
        let line = before.matches('\n').count() + 1;
        let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
        let message = plain_types(inner.message());
        let at = format!("(line {line}, column {column})");
        // serde's "unknown field `x`, expected one of …": the path already names `x`.
        if let Some(rest) = message.strip_prefix("unknown field ") {
            let expected = rest.split_once(", ").map_or("", |(_, e)| e);
            return parse_error(format!("{key}: unknown key; {expected} {at}"));
        }
        // "missing field `x`": the table is where the key is missing.
        if let Some(field) = message.strip_prefix("missing field ") {
            let field = field.trim_matches('`');
            return parse_error(format!("{key}.{field}: required, and missing {at}"));
        }
        // "invalid type: floating point `1.5`, expected …": the value is named once, before it.
        if let Some((found, expected)) = message
            .strip_prefix("invalid type: ")
            .and_then(|m| m.split_once(", expected "))
        {
            let kind = found.split(['`', '"']).next().unwrap_or(found).trim();
            // An integer a whole-number key cannot hold: past 64 bits.
            if kind == "integer" && expected == "a whole number" {
                return parse_error(format!("{key} = {written}: too large {at}"));
            }
            return parse_error(format!(
                "{key} = {written}: expected {expected}, found {kind} {at}"
            ));
        }
        parse_error(format!("{key} = {written}: {message} {at}"))
    })
}

/// A syntax error's message: toml's reason (with the key, for a duplicate key), the line and
/// column (in characters), and the line quoted with a caret under the column as a terminal shows
/// it: the whole line up to [`QUOTED_CHARS`] characters, otherwise that many around the column,
/// so that a line of hundreds of kilobytes is quoted in one screen line. Without a location,
/// toml's own message, each line clipped.
fn syntax_message(text: &str, e: &toml::de::Error) -> String {
    let Some(span) = e.span() else {
        let message = e.to_string();
        let lines: Vec<Cow<'_, str>> = message.trim_end().lines().map(clipped).collect();
        return lines.join("\n");
    };
    let start = span.start.min(text.len());
    let before = text.get(..start).unwrap_or_default();
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    let rest = text.get(line_start..).unwrap_or_default();
    // The line without a CRLF file's CR, as [`printable`] shows it: one character a column, so
    // the caret keeps its place.
    let line_text = rest.split('\n').next().unwrap_or_default();
    let line_text = line_text.strip_suffix('\r').unwrap_or(line_text);
    let line_chars: Vec<char> = printable(line_text).chars().collect();
    let column = before.get(line_start..).unwrap_or_default().chars().count();
    let from = column
        .saturating_sub(QUOTED_CHARS / 2)
        .min(line_chars.len().saturating_sub(QUOTED_CHARS));
    let to = (from + QUOTED_CHARS).min(line_chars.len());
    let mut shown: String = line_chars
        .get(from..to)
        .unwrap_or_default()
        .iter()
        .collect();
    // The caret goes under the column as a terminal shows the line: a wide character (CJK, most
    // emoji) takes two cells, a combining mark none (Unicode's East Asian Width, UAX #11).
    let mut caret: usize = line_chars
        .get(from..column.min(to))
        .unwrap_or_default()
        .iter()
        .map(|&c| c.width().unwrap_or(0))
        .sum::<usize>()
        + column.saturating_sub(to);
    if from > 0 {
        shown.insert(0, '…');
        caret += 1;
    }
    if to < line_chars.len() {
        shown.push('…');
    }
    // toml names no key in "duplicate key": its span is the key as written.
    let message = e.message().trim_end();
    let named = text
        .get(span.clone())
        .filter(|k| message == "duplicate key" && !k.is_empty() && !k.contains('\n'))
        .map_or_else(String::new, |k| format!(" `{}`", quoted(k.trim())));
    format!(
        "{message}{named} (line {line}, column {})\n  {shown}\n  {:caret$}^",
        column + 1,
        ""
    )
}

/// serde's Rust type names in an "expected …" message in an operator's words.
fn plain_types(message: &str) -> String {
    [
        ("expected i64", "expected a whole number"),
        ("expected u64", "expected a whole number"),
        ("expected u32", "expected a whole number"),
        ("expected u16", "expected a whole number"),
        ("expected usize", "expected a whole number"),
        ("expected f64", "expected a number"),
    ]
    .iter()
    .fold(message.to_owned(), |m, (rust, plain)| {
        m.replace(rust, plain)
    })
}

/// Every key the configuration file accepts, as a dotted path: `listen`, `route[].path`,
/// `group.NAME.rate`, `xdp.mode`. Read from the file's serde structs (the names they pass to
/// serde), so it is exactly the set the parser accepts; `docs/configuration.md` is checked
/// against it.
pub fn known_keys() -> Vec<String> {
    let mut keys = Vec::new();
    for top in struct_fields::<File>() {
        let (prefix, fields) = match *top {
            "route" => ("route[].", struct_fields::<RouteFile>()),
            "group" => ("group.NAME.", struct_fields::<GroupFile>()),
            "xdp" => ("xdp.", struct_fields::<XdpFile>()),
            "tls" => ("tls.", struct_fields::<TlsFile>()),
            "otlp" => ("otlp.", struct_fields::<OtlpFile>()),
            "cluster" => ("cluster.", struct_fields::<ClusterFile>()),
            "plane" => {
                keys.extend(
                    struct_fields::<SessionPlaneFile>()
                        .iter()
                        .map(|f| format!("plane.session.{f}")),
                );
                keys.extend(
                    struct_fields::<IpPlaneFile>()
                        .iter()
                        .map(|f| format!("plane.ip.{f}")),
                );
                continue;
            }
            "listen" => {
                keys.push("listen".to_owned());
                keys.extend(LISTEN_TABLE_KEYS.iter().map(|k| format!("listen[].{k}")));
                continue;
            }
            key => {
                keys.push(key.to_owned());
                continue;
            }
        };
        keys.extend(fields.iter().map(|f| format!("{prefix}{f}")));
    }
    keys
}

/// The field names a `#[derive(Deserialize)]` struct hands to `deserialize_struct`.
pub(super) fn struct_fields<T: serde::de::DeserializeOwned>() -> &'static [&'static str] {
    use serde::de::{self, value::Error};

    struct Probe<'a>(&'a mut &'static [&'static str]);

    impl<'de> de::Deserializer<'de> for Probe<'_> {
        type Error = Error;

        fn deserialize_any<V: de::Visitor<'de>>(self, _: V) -> Result<V::Value, Error> {
            Err(de::Error::custom("not a struct"))
        }

        fn deserialize_struct<V: de::Visitor<'de>>(
            self,
            _name: &'static str,
            fields: &'static [&'static str],
            _visitor: V,
        ) -> Result<V::Value, Error> {
            *self.0 = fields;
            Err(de::Error::custom("probed"))
        }

        serde::forward_to_deserialize_any! {
            bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes
            byte_buf option unit unit_struct newtype_struct seq tuple tuple_struct map enum
            identifier ignored_any
        }
    }

    let mut fields: &'static [&'static str] = &[];
    let _ = T::deserialize(Probe(&mut fields));
    fields
}
