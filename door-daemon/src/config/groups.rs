//! Limit groups (`[group.NAME]`, the built-in ones merged with the file's) and the route table
//! (`[[route]]`) that sends requests to them.

use std::{collections::BTreeMap, fmt, time::Duration};

use http::Method;

use super::{
    ConfigError, clipped,
    durations::parse_duration,
    file::{GroupFile, RouteFile},
    invalid, invisible, positive_u32, table_size,
};
use crate::{
    http::route::Route,
    limit::{Budget, Charge, DEFAULT_MAX_CLIENTS},
};

/// `per_client` of a group that is not one of the defaults, when the file does not give it (and
/// `inflight` and, with `charge = "on_failure"`, `burst` are not lower: see [`PerClientFollows`]).
pub const NEW_GROUP_PER_CLIENT: u32 = 16;
/// `inflight` (group cap) of a group that is not one of the defaults, when the file does not
/// give it.
pub const NEW_GROUP_INFLIGHT: u32 = 64;

/// One limit group: its budget and its body read timeout.
#[derive(Debug, Clone)]
pub struct GroupConfig {
    /// Rates, burst, caps, table size and charge policy.
    pub budget: Budget,
    /// How long a limited request's body may take to arrive. Default: webhook 10 s, others 30 s.
    pub read_timeout: Duration,
    /// Why `budget.per_client` is below the group's default, when it is: the file did not give
    /// `per_client`, and `inflight` or (with `charge = "on_failure"`) `burst` is lower than that
    /// default. `None` when the file gives `per_client` or the default fits. `door check-config`
    /// prints it as a comment; it is not compared by `==` (it tells where a value came from, not
    /// what door does: a printed configuration, which writes `per_client` out, equals the one it
    /// was printed from).
    pub per_client_follows: Option<PerClientFollows>,
}

impl PartialEq for GroupConfig {
    /// Equal when they limit alike: `budget` and `read_timeout`; `per_client_follows` is ignored.
    fn eq(&self, other: &Self) -> bool {
        let Self {
            budget,
            read_timeout,
            per_client_follows: _,
        } = self;
        *budget == other.budget && *read_timeout == other.read_timeout
    }
}

/// A `per_client` the file did not give, lowered from the group's default so that the budget the
/// operator wrote is valid: `per_client` = min(default, `inflight`, `burst` under
/// `charge = "on_failure"`). Displays as the note `door check-config` prints after it:
/// `follows burst (charge = "on_failure"; default 16)`, `follows inflight (default 2)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PerClientFollows {
    /// The default it replaces: the built-in group's `per_client`, or [`NEW_GROUP_PER_CLIENT`].
    pub default: u32,
    /// `per_client` is the group's `inflight`.
    pub inflight: bool,
    /// `per_client` is the group's `burst` (under `charge = "on_failure"`).
    pub burst: bool,
}

impl fmt::Display for PerClientFollows {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Self {
            default,
            inflight,
            burst,
        } = *self;
        let keys = match (inflight, burst) {
            (true, true) => "inflight and burst",
            (true, false) => "inflight",
            (false, _) => "burst",
        };
        let charge = if burst {
            "charge = \"on_failure\"; "
        } else {
            ""
        };
        write!(f, "follows {keys} ({charge}default {default})")
    }
}

/// Lowers `b.per_client` (the group's default: the file did not give it) to `b.inflight` and,
/// under `charge = "on_failure"`, to `b.burst`, when they are lower; says why when it did.
fn fit_per_client(b: &mut Budget) -> Option<PerClientFollows> {
    let default = b.per_client;
    let burst = (b.charge == Charge::OnFailure).then_some(b.burst);
    let fitted = burst.map_or(b.inflight, |burst| burst.min(b.inflight));
    if fitted >= default {
        return None;
    }
    b.per_client = fitted;
    Some(PerClientFollows {
        default,
        inflight: b.inflight == fitted,
        burst: burst == Some(fitted),
    })
}

/// The built-in group long-lived requests are limited in: WebSockets and other upgrades, and
/// server-sent event responses, on routes in no other group ([`Budget::stream`]).
pub const STREAM_GROUP: &str = "stream";

fn default_groups() -> BTreeMap<String, GroupConfig> {
    BTreeMap::from([
        (
            "webhook".to_owned(),
            GroupConfig {
                budget: Budget::webhook(),
                read_timeout: Duration::from_secs(10),
                per_client_follows: None,
            },
        ),
        (
            "link".to_owned(),
            GroupConfig {
                budget: Budget::link(),
                read_timeout: Duration::from_secs(30),
                per_client_follows: None,
            },
        ),
        (
            "health".to_owned(),
            GroupConfig {
                budget: Budget::health(),
                read_timeout: Duration::from_secs(30),
                per_client_follows: None,
            },
        ),
        (
            STREAM_GROUP.to_owned(),
            GroupConfig {
                budget: Budget::stream(),
                read_timeout: Duration::from_secs(30),
                per_client_follows: None,
            },
        ),
    ])
}

/// The longest group name, in bytes.
const LONGEST_GROUP_NAME: usize = 64;

/// A group's name is shown in metrics (`door.group`), `/status`, the 429 body, `door top`'s
/// terminal and the printed configuration (as a TOML key on one line): 1 to
/// [`LONGEST_GROUP_NAME`] bytes without control characters, and without the characters that
/// change how the text around them is shown ([`invisible`]).
fn check_group_name(name: &str) -> Result<(), ConfigError> {
    if !name.is_empty()
        && name.len() <= LONGEST_GROUP_NAME
        && name.trim() == name
        && !name
            .chars()
            .any(|c| c.is_control() || invisible(c) || (c.is_whitespace() && c != ' '))
    {
        Ok(())
    } else {
        Err(invalid(
            "group",
            format!("{name:?}"),
            "a group name is 1 to 64 bytes without control characters or invisible ones \
             (bidirectional controls, zero-width and other format characters), spaces other \
             than U+0020, or a space at either end",
        ))
    }
}

pub(super) fn build_groups(
    files: BTreeMap<String, GroupFile>,
) -> Result<BTreeMap<String, GroupConfig>, ConfigError> {
    let mut groups = default_groups();
    for (name, g) in files {
        check_group_name(&name)?;
        let key = |k: &str| format!("group.{name}.{k}");
        let mut cfg = if let Some(existing) = groups.get(&name) {
            existing.clone()
        } else {
            {
                let (Some(rate), Some(_)) = (g.rate, g.burst) else {
                    return Err(invalid(
                        format!("group.{name}"),
                        "{…}",
                        "a new group must give at least rate and burst",
                    ));
                };
                GroupConfig {
                    budget: Budget {
                        rate,
                        burst: 1,
                        per_client: NEW_GROUP_PER_CLIENT,
                        inflight: NEW_GROUP_INFLIGHT,
                        max_clients: DEFAULT_MAX_CLIENTS,
                        charge: Charge::Always,
                    },
                    read_timeout: Duration::from_secs(30),
                    per_client_follows: None,
                }
            }
        };
        let b = &mut cfg.budget;
        if let Some(rate) = g.rate {
            b.rate = rate;
        }
        if let Some(v) = g.burst {
            b.burst = positive_u32(&key("burst"), v)?;
        }
        if let Some(v) = g.inflight {
            b.inflight = positive_u32(&key("inflight"), v)?;
        }
        if let Some(v) = g.max_clients {
            b.max_clients = table_size(&key("max_clients"), v)?;
        }
        if let Some(c) = &g.charge {
            b.charge = c
                .parse::<Charge>()
                .map_err(|e| invalid(key("charge"), e.value, e.reason))?;
        }
        // A per_client the file gives is checked as written; the default follows the keys the
        // file gives instead of refusing a value the operator never wrote.
        cfg.per_client_follows = match g.per_client {
            Some(v) => {
                b.per_client = positive_u32(&key("per_client"), v)?;
                None
            }
            None => fit_per_client(b),
        };
        cfg.budget
            .validate(&name)
            .map_err(|e| ConfigError::Invalid {
                key: e.key,
                value: e.value,
                reason: e.reason,
            })?;
        if let Some(t) = &g.read_timeout {
            cfg.read_timeout = parse_duration(&key("read_timeout"), t)?;
        }
        groups.insert(name, cfg);
    }
    Ok(groups)
}

/// The most `[[route]]` entries a configuration may list. A request is matched against the
/// routes in order, and each route is checked against the ones above it when the configuration
/// is loaded ([`Route::shadowed_by`]); far fewer are expected.
pub(super) const MAX_ROUTES: usize = 2_000;

pub(super) fn build_routes(
    files: Vec<RouteFile>,
    groups: &BTreeMap<String, GroupConfig>,
) -> Result<Vec<Route>, ConfigError> {
    if files.len() > MAX_ROUTES {
        return Err(invalid(
            "route".to_owned(),
            format!("{} entries", files.len()),
            format!("at most {MAX_ROUTES} routes (each request is matched against them in order)"),
        ));
    }
    let mut routes = Vec::new();
    for (i, r) in files.into_iter().enumerate() {
        if !groups.contains_key(&r.group) {
            let known: Vec<&str> = groups.keys().map(String::as_str).collect();
            return Err(invalid(
                format!("route[{i}].group"),
                format!("{:?}", r.group),
                format!("unknown group (known: {})", known.join(", ")),
            ));
        }
        let route = Route::new(&r.group, &r.methods, &r.path)
            .map(|route| route.streaming(r.stream))
            .map_err(|e| {
                invalid(
                    format!("route[{i}].{}", e.key()),
                    format!("{:?}", e.value()),
                    e.to_string(),
                )
            })?;
        if let Some(by) = route.shadowed_by(&routes) {
            // At most three named; a method may have its own route above.
            let mut names: Vec<String> = by
                .iter()
                .take(3)
                .filter_map(|&j| routes.get(j).map(|r| describe(j, r)))
                .collect();
            if by.len() > 3 {
                names.push(format!("{} more", by.len() - 3));
            }
            let (come, take) = if by.len() == 1 {
                ("comes", "takes")
            } else {
                ("come", "take")
            };
            return Err(invalid(
                format!("route[{i}].path"),
                format!("{:?}", r.path),
                format!(
                    "is never used: {} {come} first and {take} every request it matches (first \
                     match wins); remove it, or move it above {first}",
                    names.join(" and "),
                    first = by
                        .first()
                        .map_or_else(String::new, |j| format!("route[{j}]")),
                ),
            ));
        }
        routes.push(route);
    }
    Ok(routes)
}

/// `route[j] ("/l/{id}", GET)`: a route as an error names it, with its path as written and its
/// methods (`every method` when it lists none).
fn describe(j: usize, route: &Route) -> String {
    let methods = if route.methods.is_empty() {
        "every method".to_owned()
    } else {
        route
            .methods
            .iter()
            .map(Method::as_str)
            .collect::<Vec<_>>()
            .join(", ")
    };
    format!(
        "route[{j}] ({}, {methods})",
        clipped(&format!("{:?}", route.path.as_str()))
    )
}
