//! The door-wide request planes (`[plane.session]`, `[plane.ip]`): their credential and budgets.

use std::collections::BTreeMap;

use super::{
    ConfigError,
    file::{PlaneFile, SessionPlaneFile},
    groups::GroupConfig,
    invalid, positive_u32, table_size,
};
use crate::{
    client::credential::Credential,
    limit::{Budget, DEFAULT_MAX_CLIENTS},
};

/// The two door-wide request planes (docs/design.md, "Streams and sessions"): every request
/// that is not a stream passes one of them on top of its route group.
#[derive(Debug, Clone, PartialEq)]
pub struct PlanesConfig {
    /// Where the session plane finds a request's credential (`plane.session.cookie` or
    /// `plane.session.header = "authorization"`).
    pub credential: Credential,
    /// The session plane: per verified credential. Default 2 tokens/s (120 a minute), burst 60,
    /// 16,384 sessions tracked.
    pub session: Budget,
    /// The IP plane: per client key, for requests without a verified credential. Default 0.5
    /// tokens/s (30 a minute), burst 30, 16,384 clients tracked.
    pub ip: Budget,
}

/// The session plane's name: its `door.group` and the `scope` of its 429s.
pub const SESSION_PLANE: &str = "session";
/// The IP plane's name: its `door.group` and the `scope` of its 429s.
pub const IP_PLANE: &str = "ip";
/// The session plane's default rate, tokens per second (120 a minute).
pub const DEFAULT_SESSION_RATE: f64 = 2.0;
/// The session plane's default burst.
pub const DEFAULT_SESSION_BURST: u32 = 60;
/// The IP plane's default rate, tokens per second (30 a minute).
pub const DEFAULT_IP_RATE: f64 = 0.5;
/// The IP plane's default burst.
pub const DEFAULT_IP_BURST: u32 = 30;

/// The first budget key a plane's table gives, as (key, value), to name in an error.
fn first_given(
    table: &str,
    rate: Option<f64>,
    burst: Option<i64>,
    max_clients: Option<i64>,
) -> (String, String) {
    let given = [
        ("rate", rate.map(|v| v.to_string())),
        ("burst", burst.map(|v| v.to_string())),
        ("max_clients", max_clients.map(|v| v.to_string())),
    ];
    given
        .into_iter()
        .find_map(|(key, v)| v.map(|v| (format!("{table}.{key}"), v)))
        .unwrap_or_else(|| (table.to_owned(), "{…}".to_owned()))
}

/// `[plane.session]`'s credential: `cookie = NAME` (an RFC 6265 token) or
/// `header = "authorization"`, exactly one; without either, the error names the first budget key
/// the table gives.
fn plane_credential(session: &SessionPlaneFile) -> Result<Credential, ConfigError> {
    let credential = match (session.cookie.clone(), session.header.as_deref()) {
        (Some(name), None) => {
            let token = !name.is_empty()
                && name
                    .bytes()
                    .all(|b| b.is_ascii_graphic() && !b"()<>@,;:\\\"/[]?={}".contains(&b));
            if !token {
                return Err(invalid(
                    "plane.session.cookie",
                    format!("{name:?}"),
                    "not a cookie name (RFC 6265 §4.1.1: a token)",
                ));
            }
            Credential::Cookie(name)
        }
        (None, Some(h)) if h.eq_ignore_ascii_case("authorization") => Credential::Bearer,
        (None, Some(h)) => {
            return Err(invalid(
                "plane.session.header",
                format!("{h:?}"),
                "must be \"authorization\" (a Bearer token)",
            ));
        }
        (Some(name), Some(h)) => {
            return Err(invalid(
                "plane.session.cookie",
                format!("{name:?}"),
                format!(
                    "given with plane.session.header = {h:?}: give exactly one (from the file, \
                     --plane-session-cookie / DOOR_PLANE_SESSION_COOKIE or \
                     --plane-session-header / DOOR_PLANE_SESSION_HEADER)"
                ),
            ));
        }
        (None, None) => {
            let (key, value) = first_given(
                "plane.session",
                session.rate,
                session.burst,
                session.max_clients,
            );
            return Err(invalid(
                key,
                value,
                "needs plane.session.cookie = NAME or plane.session.header = \"authorization\": \
                 the session plane is keyed on that credential",
            ));
        }
    };
    Ok(credential)
}

/// `[plane.session]` and `[plane.ip]`: `None` without `[plane.session]` (an `[plane.ip]` alone is
/// an error: it would limit nothing); the planes' names must not also be group names.
pub(super) fn build_planes(
    file: Option<PlaneFile>,
    groups: &BTreeMap<String, GroupConfig>,
) -> Result<Option<PlanesConfig>, ConfigError> {
    let Some(file) = file else { return Ok(None) };
    let Some(session) = file.session else {
        if let Some(ip) = &file.ip {
            let (key, value) = first_given("plane.ip", ip.rate, ip.burst, ip.max_clients);
            return Err(invalid(
                key,
                value,
                "needs [plane.session]: the planes are enabled by the session plane",
            ));
        }
        return Ok(None);
    };
    for name in [SESSION_PLANE, IP_PLANE] {
        if groups.contains_key(name) {
            return Err(invalid(
                format!("group.{name}"),
                "{…}",
                format!("\"{name}\" is a plane's name while [plane.session] is set"),
            ));
        }
    }
    let credential = plane_credential(&session)?;
    let budget =
        |table: &str, rate: Option<f64>, burst: Option<i64>, max: Option<i64>, d_rate, d_burst| {
            let burst =
                burst.map_or(Ok(d_burst), |v| positive_u32(&format!("{table}.burst"), v))?;
            let max_clients = max.map_or(Ok(DEFAULT_MAX_CLIENTS), |v| {
                table_size(&format!("{table}.max_clients"), v)
            })?;
            let b = Budget::plane(rate.unwrap_or(d_rate), burst, max_clients);
            b.validate_as(table).map_err(|e| ConfigError::Invalid {
                key: e.key,
                value: e.value,
                reason: e.reason,
            })?;
            Ok::<_, ConfigError>(b)
        };
    let session = budget(
        "plane.session",
        session.rate,
        session.burst,
        session.max_clients,
        DEFAULT_SESSION_RATE,
        DEFAULT_SESSION_BURST,
    )?;
    let ip_file = file.ip.unwrap_or_default();
    let ip = budget(
        "plane.ip",
        ip_file.rate,
        ip_file.burst,
        ip_file.max_clients,
        DEFAULT_IP_RATE,
        DEFAULT_IP_BURST,
    )?;
    Ok(Some(PlanesConfig {
        credential,
        session,
        ip,
    }))
}
