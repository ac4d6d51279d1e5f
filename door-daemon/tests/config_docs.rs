//! `docs/configuration.md` cannot drift from the code: its key tables list exactly the keys the
//! configuration parser accepts ([`known_keys`]), and its defaults block is exactly what
//! `door check-config` prints without a file.

use std::collections::BTreeSet;

use door_daemon::config::{Config, known_keys};

#[expect(clippy::panic, reason = "test helper")]
fn doc() -> String {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/configuration.md");
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {path}: {e}"))
}

/// The first cell of every table row that is a backquoted key (`| \`xdp.mode\` | …`).
fn documented_keys(doc: &str) -> BTreeSet<String> {
    doc.lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .filter_map(|l| l.split_once("` |"))
        .map(|(key, _)| key.to_owned())
        .collect()
}

#[test]
fn the_reference_lists_exactly_the_keys_the_parser_accepts() {
    let documented = documented_keys(&doc());
    let known: BTreeSet<String> = known_keys().into_iter().collect();
    let missing: Vec<_> = known.difference(&documented).collect();
    let stale: Vec<_> = documented.difference(&known).collect();
    assert!(
        missing.is_empty() && stale.is_empty(),
        "docs/configuration.md is out of date: undocumented keys {missing:?}, documented keys \
         the parser refuses {stale:?}"
    );
}

#[test]
fn known_keys_come_from_the_parser() {
    let keys = known_keys();
    for k in [
        "listen",
        "route[].path",
        "group.NAME.charge",
        "xdp.block_for",
    ] {
        assert!(keys.iter().any(|x| x == k), "{k} missing from {keys:?}");
    }
    assert!(
        !keys
            .iter()
            .any(|k| k == "route" || k == "group" || k == "xdp"),
        "tables are expanded into their keys: {keys:?}"
    );
}

#[test]
fn the_defaults_block_is_what_check_config_prints() {
    let doc = doc();
    let block = doc
        .split_once("<!-- defaults: begin -->\n```toml\n")
        .and_then(|(_, rest)| rest.split_once("```\n<!-- defaults: end -->"))
        .map(|(block, _)| block)
        .expect("a defaults block in docs/configuration.md");
    let printed = Config::from_toml("defaults", "").unwrap().to_toml();
    assert_eq!(
        block.trim(),
        printed.trim(),
        "paste `door check-config` (without a file) into docs/configuration.md"
    );
}
