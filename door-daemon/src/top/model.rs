//! What `door top` shows: the admin API's JSON read leniently into plain data (a missing field
//! reads as zero or empty, never a panic; every string made [`printable`], so that no control
//! character from the API reaches the operator's terminal), and the view's state (the selected
//! group, the sort, the previous sample for the rates).

use std::{borrow::Cow, collections::BTreeMap};

use serde_json::Value;

/// One key's row (`GET /clients`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClientRow {
    /// The client key (`198.51.100.7/32`).
    pub key: String,
    /// Tokens it could spend now.
    pub tokens: u64,
    /// Tokens spent and not yet refilled.
    pub spent: u64,
    /// Requests in flight.
    pub inflight: u64,
    /// 429s decided on its row.
    pub rejections: u64,
}

/// One group: its budget, its state and its top keys.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Group {
    /// The group's name.
    pub name: String,
    /// Its bucket size, tokens.
    pub burst: u64,
    /// Requests in flight, and the group's cap.
    pub inflight: u64,
    /// The group's in-flight cap.
    pub inflight_cap: u64,
    /// Rows in its table, and the table's size.
    pub tracked: u64,
    /// The table's size.
    pub max_clients: u64,
    /// Streams open.
    pub streams: u64,
    /// Requests counted per outcome since door started.
    pub outcomes: BTreeMap<String, u64>,
    /// The keys with the most rejections and spend, most first.
    pub clients: Vec<ClientRow>,
}

/// The XDP shield's state (`GET /status`, `xdp`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Xdp {
    /// Whether the program is attached.
    pub attached: bool,
    /// `driver` or `skb` when attached, else the configured mode (`off`, `auto`, …).
    pub mode: String,
    /// Packets per `verdict/reason` since the program was loaded.
    pub counters: BTreeMap<String, u64>,
    /// The prefixes with the most SYNs: (prefix, SYNs, drops).
    pub top_prefixes: Vec<(String, u64, u64)>,
    /// Prefixes on the blocklist now.
    pub blocked: u64,
    /// Prefixes in the shield's LRU map.
    pub tracked_prefixes: u64,
    /// Whether a CPU is in cookie mode now (SYNs answered with SYN cookies at XDP).
    pub cookie_mode: bool,
}

/// The cluster sync's state (`GET /status`, `cluster`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Cluster {
    /// `off` (no `[cluster]`), `synced` or `degraded`.
    pub state: String,
    /// Doors alive by their heartbeats, this one included.
    pub doors: u64,
    /// Milliseconds since the last good sync; `None` before the first.
    pub last_sync_age_ms: Option<u64>,
}

impl Cluster {
    /// One line for the screen and the table, or `None` without `[cluster]`.
    pub fn line(&self) -> Option<String> {
        if self.state.is_empty() || self.state == "off" {
            return None;
        }
        let age = self.last_sync_age_ms.map_or_else(
            || "never synced".to_owned(),
            |ms| format!("last sync {ms} ms ago"),
        );
        Some(format!(
            "cluster {}: {} doors, {age}",
            self.state, self.doors
        ))
    }
}

/// The pass-through caps (`GET /status`, `passthrough`): requests to routes in no group.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PassThroughCounts {
    /// Requests holding a slot now.
    pub inflight: u64,
    /// `upstream_max_inflight`; 0 when the status has no `passthrough` (an older door).
    pub cap: u64,
    /// Refused at `upstream_max_inflight` (503) since door started.
    pub refused_door: u64,
    /// Refused at `upstream_max_inflight_per_client` (429) since door started.
    pub refused_client: u64,
}

impl PassThroughCounts {
    /// One line for the screen's header and the table, short enough for an 80-column header
    /// (in flight of the cap; refused door-wide with 503, per client with 429), or `None` when
    /// the status has no `passthrough`.
    pub fn line(&self) -> Option<String> {
        (self.cap > 0).then(|| {
            format!(
                "pass-through: {}/{} in flight, {} × 503, {} × 429",
                self.inflight, self.cap, self.refused_door, self.refused_client
            )
        })
    }
}

/// One refresh's data.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Snapshot {
    /// The groups, in the admin API's order (by name).
    pub groups: Vec<Group>,
    /// The shield.
    pub xdp: Xdp,
    /// The cluster sync.
    pub cluster: Cluster,
    /// The pass-through caps.
    pub passthrough: PassThroughCounts,
}

fn u(v: &Value) -> u64 {
    v.as_u64().unwrap_or(0)
}

/// A string of the admin API's answer, [`printable`].
fn s(v: &Value) -> String {
    printable(v.as_str().unwrap_or("")).into_owned()
}

/// `{name: count}` of the admin API's answer, names [`printable`].
fn counts(v: Option<&Value>) -> BTreeMap<String, u64> {
    v.and_then(Value::as_object)
        .map(|o| {
            o.iter()
                .map(|(k, v)| (printable(k).into_owned(), u(v)))
                .collect()
        })
        .unwrap_or_default()
}

/// Whether `c` must not reach a terminal as is: a control character (C0, DEL, C1: ESC starts
/// the terminal's escape sequences) or a bidirectional formatting character (it reorders what
/// follows it on screen).
fn unsafe_on_screen(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{061c}' | '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}'
        )
}

/// `text` safe to print on a terminal: every control or bidirectional formatting character
/// written as a Rust escape (`\u{1b}`, `\n`), everything else as is. Borrowed when there is
/// nothing to escape.
pub fn printable(text: &str) -> Cow<'_, str> {
    if !text.chars().any(unsafe_on_screen) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if unsafe_on_screen(c) {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

impl Snapshot {
    /// Reads `GET /status` and `GET /clients` answers; anything missing reads as zero or empty.
    pub fn from_json(status: &Value, clients: &Value) -> Self {
        let empty = Vec::new();
        let mut top: BTreeMap<String, Vec<ClientRow>> = BTreeMap::new();
        for g in clients["groups"].as_array().unwrap_or(&empty) {
            let rows = g["clients"]
                .as_array()
                .unwrap_or(&empty)
                .iter()
                .map(|c| ClientRow {
                    key: s(&c["key"]),
                    tokens: u(&c["tokens"]),
                    spent: u(&c["spent"]),
                    inflight: u(&c["inflight"]),
                    rejections: u(&c["rejections"]),
                })
                .collect();
            top.insert(s(&g["group"]), rows);
        }
        let groups = status["groups"]
            .as_array()
            .unwrap_or(&empty)
            .iter()
            .map(|g| {
                let outcomes = counts(
                    status
                        .get("requests")
                        .and_then(|r| r.get(g["name"].as_str().unwrap_or(""))),
                );
                let name = s(&g["name"]);
                Group {
                    burst: u(&g["burst"]),
                    inflight: u(&g["inflight"]),
                    inflight_cap: u(&g["inflight_cap"]),
                    tracked: u(&g["tracked_clients"]),
                    max_clients: u(&g["max_clients"]),
                    streams: u(&g["streams"]),
                    outcomes,
                    clients: top.remove(&name).unwrap_or_default(),
                    name,
                }
            })
            .collect();
        let x = &status["xdp"];
        let attached = x["attached"].as_bool().unwrap_or(false);
        let xdp = Xdp {
            attached,
            mode: if attached {
                s(&x["mode"])
            } else {
                s(&x["configured_mode"])
            },
            counters: counts(x.get("counters")),
            top_prefixes: x["top_prefixes"]
                .as_array()
                .unwrap_or(&empty)
                .iter()
                .map(|p| (s(&p["prefix"]), u(&p["syns"]), u(&p["drops"])))
                .collect(),
            blocked: x["blocked"]
                .as_array()
                .map_or(0, |b| u64::try_from(b.len()).unwrap_or(u64::MAX)),
            tracked_prefixes: u(&x["tracked_prefixes"]),
            cookie_mode: x
                .get("cookie_mode")
                .and_then(|c| c.get("active"))
                .and_then(Value::as_bool)
                .unwrap_or(false),
        };
        let c = &status["cluster"];
        let cluster = Cluster {
            state: s(&c["state"]),
            doors: u(&c["doors"]),
            last_sync_age_ms: c["last_sync_age_ms"].as_u64(),
        };
        let p = &status["passthrough"];
        let refused = &p["refused"];
        let passthrough = PassThroughCounts {
            inflight: u(&p["inflight"]),
            cap: u(&p["cap"]),
            refused_door: u(&refused["upstream_max_inflight"]),
            refused_client: u(&refused["upstream_max_inflight_per_client"]),
        };
        Self {
            groups,
            xdp,
            cluster,
            passthrough,
        }
    }
}

/// How the selected group's keys are ordered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Sort {
    /// Most rejections first, then most spent (the admin API's order).
    #[default]
    Rejections,
    /// Most tokens spent first.
    Spent,
    /// Most requests in flight first.
    InFlight,
    /// By key.
    Key,
}

impl Sort {
    /// The next sort (`s`).
    #[must_use]
    pub fn next(self) -> Self {
        match self {
            Self::Rejections => Self::Spent,
            Self::Spent => Self::InFlight,
            Self::InFlight => Self::Key,
            Self::Key => Self::Rejections,
        }
    }

    /// `rejections`, `spent`, `in flight` or `key`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Rejections => "rejections",
            Self::Spent => "spent",
            Self::InFlight => "in flight",
            Self::Key => "key",
        }
    }
}

/// The view's state across refreshes.
#[derive(Debug, Clone, Default)]
pub struct View {
    /// The admin address shown in the header.
    pub admin: String,
    /// The latest snapshot.
    pub snapshot: Option<Snapshot>,
    /// Per group, per outcome: requests per second between the last two refreshes.
    pub outcome_rates: BTreeMap<String, BTreeMap<String, f64>>,
    /// Per `verdict/reason`: packets per second between the last two refreshes.
    pub xdp_rates: BTreeMap<String, f64>,
    /// The selected group's index.
    pub selected: usize,
    /// The keys' order.
    pub sort: Sort,
    /// The last refresh's error, if it failed (the previous snapshot stays shown).
    pub error: Option<String>,
    /// When the snapshot was taken (clock ns), for the rates.
    taken_ns: u64,
}

/// `(now - before) / seconds`, 0 for a counter that went back (door restarted).
#[expect(
    clippy::cast_precision_loss,
    reason = "rates of counters: f64 is exact up to 2^53"
)]
fn rate(now: u64, before: u64, seconds: f64) -> f64 {
    now.saturating_sub(before) as f64 / seconds
}

impl View {
    /// An empty view of `admin`.
    pub fn new(admin: String) -> Self {
        Self {
            admin,
            ..Self::default()
        }
    }

    /// Takes `next`, taken at `now_ns` (clock ns): rates are the counts' differences with the
    /// previous snapshot, per second.
    pub fn update(&mut self, next: Snapshot, now_ns: u64) {
        #[expect(
            clippy::cast_precision_loss,
            reason = "a refresh interval in ns is far below 2^53"
        )]
        let seconds = now_ns.saturating_sub(self.taken_ns) as f64 / 1e9;
        self.outcome_rates.clear();
        self.xdp_rates.clear();
        if let Some(prev) = &self.snapshot
            && seconds > 0.0
        {
            // By name, so that a status of many groups (a hostile or broken admin endpoint)
            // costs one lookup per group, not a scan of the previous list.
            let previous: BTreeMap<&str, &Group> =
                prev.groups.iter().map(|p| (p.name.as_str(), p)).collect();
            for g in &next.groups {
                let before = previous.get(g.name.as_str()).copied();
                let rates = g
                    .outcomes
                    .iter()
                    .map(|(o, n)| {
                        let b = before.and_then(|p| p.outcomes.get(o)).copied().unwrap_or(0);
                        (o.clone(), rate(*n, b, seconds))
                    })
                    .collect();
                self.outcome_rates.insert(g.name.clone(), rates);
            }
            for (c, n) in &next.xdp.counters {
                let b = prev.xdp.counters.get(c).copied().unwrap_or(0);
                self.xdp_rates.insert(c.clone(), rate(*n, b, seconds));
            }
        }
        // The same group stays selected when a reload adds or removes one before it.
        let name = self.group().map(|g| g.name.clone());
        self.selected = name
            .and_then(|name| next.groups.iter().position(|g| g.name == name))
            .unwrap_or(self.selected)
            .min(next.groups.len().saturating_sub(1));
        self.snapshot = Some(next);
        self.taken_ns = now_ns;
        self.error = None;
    }

    /// A refresh failed with `error`: shown ([`printable`]), the last snapshot kept.
    pub fn failed(&mut self, error: &str) {
        self.error = Some(printable(error).into_owned());
    }

    /// Whether rates are known (two snapshots were taken).
    pub fn has_rates(&self) -> bool {
        !self.outcome_rates.is_empty() || !self.xdp_rates.is_empty()
    }

    /// Selects the next group (tab, →), wrapping around.
    pub fn next_group(&mut self) {
        let n = self.snapshot.as_ref().map_or(0, |s| s.groups.len());
        if n > 0 {
            self.selected = (self.selected + 1) % n;
        }
    }

    /// Selects the previous group (shift-tab, ←), wrapping around.
    pub fn previous_group(&mut self) {
        let n = self.snapshot.as_ref().map_or(0, |s| s.groups.len());
        if n > 0 {
            self.selected = (self.selected + n - 1) % n;
        }
    }

    /// The next sort (`s`).
    pub fn next_sort(&mut self) {
        self.sort = self.sort.next();
    }

    /// The selected group.
    pub fn group(&self) -> Option<&Group> {
        self.snapshot.as_ref()?.groups.get(self.selected)
    }

    /// `group`'s keys in the view's order.
    pub fn sorted_clients(&self, group: &Group) -> Vec<ClientRow> {
        let mut rows = group.clients.clone();
        match self.sort {
            Sort::Rejections => {}
            Sort::Spent => rows.sort_by(|a, b| b.spent.cmp(&a.spent).then(a.key.cmp(&b.key))),
            Sort::InFlight => {
                rows.sort_by(|a, b| b.inflight.cmp(&a.inflight).then(a.key.cmp(&b.key)));
            }
            Sort::Key => rows.sort_by(|a, b| a.key.cmp(&b.key)),
        }
        rows
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn status(ok: u64, syn: u64) -> Value {
        json!({
            "groups": [
                {"name": "health", "burst": 20, "inflight": 0, "inflight_cap": 32, "tracked_clients": 1, "max_clients": 16384, "streams": 0},
                {"name": "link", "burst": 3, "inflight": 1, "inflight_cap": 4, "tracked_clients": 2, "max_clients": 16384, "streams": 1},
            ],
            "requests": {"link": {"ok": ok, "rate_limited": 2}},
            "xdp": {"attached": true, "mode": "skb", "configured_mode": "auto",
                    "counters": {"pass/syn": syn, "drop/syn_budget": 1},
                    "top_prefixes": [{"prefix": "198.51.100.7/32", "syns": 9, "drops": 1}],
                    "blocked": [], "tracked_prefixes": 1},
        })
    }

    fn clients() -> Value {
        json!({"groups": [{"group": "link", "clients": [
            {"key": "198.51.100.7/32", "tokens": 0, "spent": 3, "inflight": 0, "rejections": 2},
            {"key": "198.51.100.8/32", "tokens": 1, "spent": 2, "inflight": 1, "rejections": 0},
        ]}]})
    }

    #[test]
    fn rates_are_differences_per_second_and_sorts_cycle() {
        let mut view = View::new("127.0.0.1:9901".to_owned());
        view.update(
            Snapshot::from_json(&status(10, 100), &clients()),
            1_000_000_000,
        );
        assert!(!view.has_rates());
        view.update(
            Snapshot::from_json(&status(14, 300), &clients()),
            3_000_000_000,
        );
        let near = |a: f64, b: f64| (a - b).abs() < 1e-9;
        assert!(near(view.outcome_rates["link"]["ok"], 2.0));
        assert!(near(view.outcome_rates["link"]["rate_limited"], 0.0));
        assert!(near(view.xdp_rates["pass/syn"], 100.0));
        view.next_group();
        let link = view.group().unwrap().clone();
        assert_eq!(link.name, "link");
        assert_eq!(link.clients[0].key, "198.51.100.7/32");
        view.next_sort();
        view.next_sort();
        assert_eq!(view.sort, Sort::InFlight);
        assert_eq!(view.sorted_clients(&link)[0].key, "198.51.100.8/32");
        view.next_group();
        assert_eq!(view.group().unwrap().name, "health");
        view.previous_group();
        assert_eq!(view.group().unwrap().name, "link");
    }

    /// Rates pair each group with its own previous counts, whatever the order of the groups (a
    /// reload may change it) and however many there are.
    #[test]
    fn rates_pair_groups_by_name() {
        let many = |ok_of: fn(u64) -> u64, reversed: bool| {
            let mut names: Vec<u64> = (0..5_000).collect();
            if reversed {
                names.reverse();
            }
            let groups: Vec<Value> = names
                .iter()
                .map(|i| json!({"name": format!("g{i}")}))
                .collect();
            let requests: serde_json::Map<String, Value> = names
                .iter()
                .map(|i| (format!("g{i}"), json!({"ok": ok_of(*i)})))
                .collect();
            json!({"groups": groups, "requests": requests})
        };
        let mut view = View::new(String::new());
        view.update(Snapshot::from_json(&many(|i| i, false), &json!({})), 0);
        view.update(
            Snapshot::from_json(&many(|i| 3 * i, true), &json!({})),
            1_000_000_000,
        );
        assert_eq!(view.outcome_rates.len(), 5_000);
        for i in [0u32, 1, 2_500, 4_999] {
            let r = view.outcome_rates[&format!("g{i}")]["ok"];
            assert!((r - 2.0 * f64::from(i)).abs() < 1e-9, "g{i}: {r}");
        }
    }

    /// The selected group stays selected when a reload adds a group before it or removes one.
    #[test]
    fn the_selection_follows_its_group_by_name() {
        let mut view = View::new(String::new());
        view.update(Snapshot::from_json(&status(1, 1), &clients()), 0);
        view.next_group();
        assert_eq!(view.group().map(|g| g.name.as_str()), Some("link"));
        let mut st = status(1, 1);
        st["groups"]
            .as_array_mut()
            .unwrap()
            .insert(0, json!({"name": "api", "burst": 1}));
        view.update(Snapshot::from_json(&st, &clients()), 1);
        assert_eq!(view.group().map(|g| g.name.as_str()), Some("link"));
        st["groups"].as_array_mut().unwrap().truncate(2);
        view.update(Snapshot::from_json(&st, &clients()), 2);
        assert_eq!(view.group().map(|g| g.name.as_str()), Some("health"));
    }

    #[test]
    fn the_pass_through_line_shows_the_caps_of_a_door_that_reports_them() {
        let mut st = status(1, 1);
        assert_eq!(
            Snapshot::from_json(&st, &clients()).passthrough.line(),
            None
        );
        st["passthrough"] = json!({"cap": 64, "per_client_cap": 8, "inflight": 3,
            "named_clients": 1,
            "refused": {"upstream_max_inflight": 5, "upstream_max_inflight_per_client": 7}});
        assert_eq!(
            Snapshot::from_json(&st, &clients())
                .passthrough
                .line()
                .as_deref(),
            Some("pass-through: 3/64 in flight, 5 × 503, 7 × 429")
        );
    }

    #[test]
    fn the_cluster_line_shows_only_with_a_cluster() {
        let mut st = status(1, 1);
        assert_eq!(Snapshot::from_json(&st, &clients()).cluster.line(), None);
        st["cluster"] = json!({"state": "off", "doors": 0, "last_sync_age_ms": null});
        assert_eq!(Snapshot::from_json(&st, &clients()).cluster.line(), None);
        st["cluster"] = json!({"state": "degraded", "doors": 3, "last_sync_age_ms": 1200});
        assert_eq!(
            Snapshot::from_json(&st, &clients())
                .cluster
                .line()
                .as_deref(),
            Some("cluster degraded: 3 doors, last sync 1200 ms ago")
        );
        st["cluster"] = json!({"state": "synced", "doors": 1, "last_sync_age_ms": null});
        assert_eq!(
            Snapshot::from_json(&st, &clients())
                .cluster
                .line()
                .as_deref(),
            Some("cluster synced: 1 doors, never synced")
        );
    }

    #[test]
    fn control_and_bidi_characters_are_escaped_and_the_rest_kept() {
        for (raw, shown) in [
            ("link", "link"),
            ("caf\u{e9} \u{65e5}\u{672c}", "caf\u{e9} \u{65e5}\u{672c}"),
            ("a\u{1b}[31mb", r"a\u{1b}[31mb"),
            ("a\u{7}\u{7f}\u{9b}", r"a\u{7}\u{7f}\u{9b}"),
            ("a\r\n\tb", r"a\r\n\tb"),
            ("a\u{202e}b\u{2066}", r"a\u{202e}b\u{2066}"),
        ] {
            assert_eq!(printable(raw), shown, "{raw:?}");
        }
        assert!(matches!(printable("link"), Cow::Borrowed(_)));
    }

    #[test]
    fn anything_missing_reads_as_empty() {
        let s = Snapshot::from_json(&json!(null), &json!({"groups": 7}));
        assert_eq!(s, Snapshot::default());
        let mut view = View::new(String::new());
        view.next_group();
        view.previous_group();
        view.update(s, 0);
        assert!(view.group().is_none());
    }
}
