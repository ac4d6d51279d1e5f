//! Drawing `door top`: the live screen ([`draw`], ratatui) and the `--once` table ([`plain`]).
//! Both lay out whatever size they get: a small terminal shows less, never panics.

use std::fmt::Write as _;

use ratatui::{
    Frame,
    layout::{Constraint, Layout, Rect},
    style::{Modifier, Style},
    text::Line,
    widgets::{Block, Borders, Cell, Paragraph, Row, Table, Tabs},
};

use super::model::{Group, View, Xdp};

/// The footer's key help.
pub const HELP: &str = "tab/←→ group  s sort  q quit";

fn bold() -> Style {
    Style::default().add_modifier(Modifier::BOLD)
}

/// Draws `view` on the whole frame.
pub fn draw(frame: &mut Frame<'_>, view: &View) {
    // The header and the footer first; the XDP pane only when the keys keep 5 lines.
    let area = frame.area();
    let row = |y: u16, height: u16| Rect::new(area.x, area.y + y, area.width, height);
    let h = area.height;
    let header = row(0, h.min(1));
    let footer = if h >= 2 {
        row(h - 1, 1)
    } else {
        Rect::default()
    };
    let middle = h.saturating_sub(2);
    let tabs = row(1, middle.min(1));
    let xdp_height = if middle >= 1 + 5 + 7 { 7 } else { 0 };
    let body_height = middle.saturating_sub(1 + xdp_height);
    let body = row(2, body_height);
    let xdp = row(2 + body_height, xdp_height);

    let state = match (&view.error, &view.snapshot) {
        (Some(e), _) => format!("  ERROR: {e}"),
        (None, None) => "  connecting…".to_owned(),
        // The pass-through counts first: every door has them, and an 80-column header keeps
        // them whole.
        (None, Some(s)) => [s.passthrough.line(), s.cluster.line()]
            .into_iter()
            .flatten()
            .fold(String::new(), |mut line, part| {
                line.push_str("  ");
                line.push_str(&part);
                line
            }),
    };
    frame.render_widget(
        Paragraph::new(format!("door top — {}{state}", view.admin)).style(bold()),
        header,
    );

    let Some(snapshot) = &view.snapshot else {
        frame.render_widget(Paragraph::new(HELP), footer);
        return;
    };
    let names: Vec<Line<'_>> = snapshot
        .groups
        .iter()
        .map(|g| Line::from(g.name.as_str()))
        .collect();
    frame.render_widget(
        Tabs::new(names)
            .select(view.selected)
            .highlight_style(bold().add_modifier(Modifier::REVERSED)),
        tabs,
    );

    if let Some(group) = view.group() {
        let [keys, side] =
            Layout::horizontal([Constraint::Min(20), Constraint::Length(34)]).areas(body);
        frame.render_widget(clients_table(view, group), keys);
        frame.render_widget(outcomes_table(view, group), side);
    }
    frame.render_widget(xdp_table(view), xdp);
    frame.render_widget(
        Paragraph::new(format!("{HELP}   sort: {}", view.sort.as_str())),
        footer,
    );
}

fn clients_table<'a>(view: &View, group: &Group) -> Table<'a> {
    let rows: Vec<Row<'_>> = view
        .sorted_clients(group)
        .into_iter()
        .map(|c| {
            Row::new(vec![
                Cell::from(c.key),
                Cell::from(format!("{}/{}", c.tokens, group.burst)),
                Cell::from(c.spent.to_string()),
                Cell::from(c.inflight.to_string()),
                Cell::from(c.rejections.to_string()),
            ])
        })
        .collect();
    Table::new(
        rows,
        [
            Constraint::Min(18),
            Constraint::Length(11),
            Constraint::Length(7),
            Constraint::Length(9),
            Constraint::Length(11),
        ],
    )
    .header(Row::new(["KEY", "TOKENS", "SPENT", "IN FLIGHT", "REJECTIONS"]).style(bold()))
    .block(Block::default().borders(Borders::TOP).title(format!(
        " {}: {} of {} clients, {} of {} in flight, {} streams ",
        group.name,
        group.tracked,
        group.max_clients,
        group.inflight,
        group.inflight_cap,
        group.streams
    )))
}

fn outcomes_table<'a>(view: &View, group: &Group) -> Table<'a> {
    let rates = view.outcome_rates.get(&group.name);
    let rows: Vec<Row<'_>> = group
        .outcomes
        .iter()
        .map(|(o, n)| {
            let r = rates
                .and_then(|r| r.get(o))
                .map_or_else(|| "-".to_owned(), |r| format!("{r:.1}"));
            Row::new(vec![o.clone(), r, n.to_string()])
        })
        .collect();
    Table::new(
        rows,
        [
            Constraint::Min(14),
            Constraint::Length(8),
            Constraint::Length(9),
        ],
    )
    .header(Row::new(["OUTCOME", "PER S", "TOTAL"]).style(bold()))
    .block(Block::default().borders(Borders::TOP).title(" outcomes "))
}

fn xdp_table<'a>(view: &View) -> Table<'a> {
    let Some(snapshot) = &view.snapshot else {
        return Table::default();
    };
    let shield = &snapshot.xdp;
    let mut verdicts: Vec<(String, f64, u64)> = shield
        .counters
        .iter()
        .filter(|(_, n)| **n > 0)
        .map(|(c, n)| (c.clone(), view.xdp_rates.get(c).copied().unwrap_or(0.0), *n))
        .collect();
    verdicts.sort_by(|a, b| b.1.total_cmp(&a.1).then(b.2.cmp(&a.2)));
    let lines = verdicts.len().max(shield.top_prefixes.len()).min(5);
    let mut rows = Vec::new();
    let mut verdicts = verdicts.into_iter();
    let mut prefixes = shield.top_prefixes.iter();
    for _ in 0..lines {
        let (c, r, n) = verdicts.next().map_or(
            (String::new(), String::new(), String::new()),
            |(c, r, n)| (c, format!("{r:.1}"), n.to_string()),
        );
        let (pre, syns, drops) = prefixes.next().map_or(
            (String::new(), String::new(), String::new()),
            |(k, s, d)| (k.clone(), s.to_string(), d.to_string()),
        );
        rows.push(Row::new(vec![c, r, n, pre, syns, drops]));
    }
    let title = if shield.attached {
        format!(
            " XDP ({}): {} tracked prefixes, {} blocked{} ",
            shield.mode,
            shield.tracked_prefixes,
            shield.blocked,
            cookie_note(shield)
        )
    } else {
        format!(" XDP not attached (xdp.mode = {}) ", shield.mode)
    };
    Table::new(
        rows,
        [
            Constraint::Length(26),
            Constraint::Length(9),
            Constraint::Length(11),
            Constraint::Min(18),
            Constraint::Length(9),
            Constraint::Length(8),
        ],
    )
    .header(
        Row::new([
            "VERDICT/REASON",
            "PER S",
            "TOTAL",
            "TOP PREFIX",
            "SYNS",
            "DROPS",
        ])
        .style(bold()),
    )
    .block(Block::default().borders(Borders::TOP).title(title))
}

/// `, cookie mode on` while the shield answers SYNs with cookies, else nothing.
fn cookie_note(x: &Xdp) -> &'static str {
    if x.cookie_mode {
        ", cookie mode on"
    } else {
        ""
    }
}

/// `door top --once`: every group's top keys, outcome counts (and rates, when `view` has two
/// snapshots) and streams, then the shield's counters and top prefixes, as plain text.
pub fn plain(view: &View) -> String {
    let mut out = String::new();
    let Some(s) = &view.snapshot else {
        return format!("door top — {}: no data\n", view.admin);
    };
    // Writing to a String cannot fail.
    let _ = writeln!(out, "door top — {}", view.admin);
    for line in [s.passthrough.line(), s.cluster.line()]
        .into_iter()
        .flatten()
    {
        let _ = writeln!(out, "{line}");
    }
    for g in &s.groups {
        let _ = writeln!(
            out,
            "\n== group {}: {} of {} clients tracked, {} of {} in flight, {} streams",
            g.name, g.tracked, g.max_clients, g.inflight, g.inflight_cap, g.streams
        );
        let _ = writeln!(
            out,
            "{:<43} {:>12} {:>8} {:>10} {:>11}",
            "KEY", "TOKENS", "SPENT", "IN FLIGHT", "REJECTIONS"
        );
        for c in view.sorted_clients(g) {
            let _ = writeln!(
                out,
                "{:<43} {:>12} {:>8} {:>10} {:>11}",
                c.key,
                format!("{}/{}", c.tokens, g.burst),
                c.spent,
                c.inflight,
                c.rejections
            );
        }
        if !g.outcomes.is_empty() {
            let _ = writeln!(out, "{:<28} {:>12} {:>10}", "OUTCOME", "TOTAL", "PER S");
            for (o, n) in &g.outcomes {
                let r = view
                    .outcome_rates
                    .get(&g.name)
                    .and_then(|r| r.get(o))
                    .map_or_else(|| "-".to_owned(), |r| format!("{r:.1}"));
                let _ = writeln!(out, "{o:<28} {n:>12} {r:>10}");
            }
        }
    }
    let x = &s.xdp;
    if x.attached {
        let _ = writeln!(
            out,
            "\n== XDP ({}): {} tracked prefixes, {} blocked{}",
            x.mode,
            x.tracked_prefixes,
            x.blocked,
            cookie_note(x)
        );
        let _ = writeln!(out, "{:<28} {:>14}", "VERDICT/REASON", "PACKETS");
        for (c, n) in x.counters.iter().filter(|(_, n)| **n > 0) {
            let _ = writeln!(out, "{c:<28} {n:>14}");
        }
        let _ = writeln!(out, "{:<40} {:>10} {:>10}", "TOP PREFIX", "SYNS", "DROPS");
        for (p, syns, drops) in &x.top_prefixes {
            let _ = writeln!(out, "{p:<40} {syns:>10} {drops:>10}");
        }
    } else {
        let _ = writeln!(out, "\n== XDP not attached (xdp.mode = {})", x.mode);
    }
    out
}

#[cfg(test)]
mod tests {
    use ratatui::{Terminal, backend::TestBackend};

    use super::*;
    use crate::top::model::{ClientRow, Cluster, PassThroughCounts, Snapshot};

    fn view() -> View {
        let mut v = View::new("127.0.0.1:9901".to_owned());
        v.update(
            Snapshot {
                groups: vec![Group {
                    name: "link".to_owned(),
                    burst: 3,
                    inflight_cap: 4,
                    max_clients: 16_384,
                    tracked: 1,
                    outcomes: [("ok".to_owned(), 3), ("rate_limited".to_owned(), 2)].into(),
                    clients: vec![ClientRow {
                        key: "198.51.100.7/32".to_owned(),
                        spent: 3,
                        rejections: 2,
                        ..ClientRow::default()
                    }],
                    ..Group::default()
                }],
                xdp: Xdp {
                    attached: true,
                    mode: "skb".to_owned(),
                    counters: [("drop/syn_budget".to_owned(), 7)].into(),
                    top_prefixes: vec![("203.0.113.9/32".to_owned(), 9, 7)],
                    cookie_mode: true,
                    ..Xdp::default()
                },
                cluster: Cluster {
                    state: "synced".to_owned(),
                    doors: 3,
                    last_sync_age_ms: Some(120),
                },
                passthrough: PassThroughCounts {
                    inflight: 2,
                    cap: 64,
                    refused_door: 0,
                    refused_client: 4,
                },
            },
            1,
        );
        v
    }

    fn screen(width: u16, height: u16, view: &View) -> String {
        let mut t = Terminal::new(TestBackend::new(width, height)).unwrap();
        t.draw(|f| draw(f, view)).unwrap();
        let buffer = t.backend().buffer().clone();
        let mut out = String::new();
        for y in 0..height {
            for x in 0..width {
                out.push_str(buffer[(x, y)].symbol());
            }
            out.push('\n');
        }
        out
    }

    #[test]
    fn draws_at_any_size() {
        let v = view();
        for (w, h) in [(1, 1), (20, 10), (80, 24), (200, 60)] {
            let text = screen(w, h, &v);
            assert_eq!(text.lines().count(), usize::from(h));
        }
        let big = screen(200, 60, &v);
        assert!(big.contains("198.51.100.7/32"), "{big}");
        assert!(big.contains("rate_limited"), "{big}");
        assert!(big.contains("203.0.113.9/32"), "{big}");
        assert!(big.contains("drop/syn_budget"), "{big}");
        assert!(big.contains("cluster synced: 3 doors"), "{big}");
        assert!(
            big.contains("pass-through: 2/64 in flight, 0 × 503, 4 × 429"),
            "{big}"
        );
        // An 80-column header keeps the pass-through counts whole.
        let small = screen(80, 24, &v);
        let header = small.lines().next().unwrap_or_default();
        assert!(header.contains("0 × 503, 4 × 429"), "{header}");
        let empty = screen(40, 5, &View::new("x".to_owned()));
        assert!(empty.contains("connecting"), "{empty}");
    }

    #[test]
    fn plain_lists_every_group_and_the_shield() {
        let text = plain(&view());
        assert!(
            text.contains("cluster synced: 3 doors, last sync 120 ms ago"),
            "{text}"
        );
        assert!(
            text.contains("pass-through: 2/64 in flight, 0 × 503, 4 × 429"),
            "{text}"
        );
        assert!(text.contains("== group link"), "{text}");
        assert!(text.contains("blocked, cookie mode on"), "{text}");
        assert!(text.contains("198.51.100.7/32"), "{text}");
        assert!(text.contains("0/3"), "{text}");
        assert!(text.contains("rate_limited"), "{text}");
        assert!(text.contains("203.0.113.9/32"), "{text}");
    }
}
