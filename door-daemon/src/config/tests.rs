//! Unit tests of the config module.
use super::*;

fn err(text: &str) -> String {
    Config::from_toml("door.toml", text)
        .unwrap_err()
        .to_string()
}

const EXAMPLE: &str = r#"
listen = ["[::]:8443", "127.0.0.1:8080"]
upstream = "http://127.0.0.1:3000"
trusted_proxies = ["192.0.2.10/32"]
admin_listen = "127.0.0.1:9901"

[[route]]
group = "webhook"
methods = ["POST"]
path = "/webhooks/github"
[[route]]
group = "link"
methods = ["GET"]
path = "/l/session/{id}"
[[route]]
group = "health"
path = "/healthz"

[group.link]
rate = 2.5
burst = 5
read_timeout = "15s"

[xdp]
interface = "lo"
mode = "skb"
ports = [8443]
"#;

#[test]
fn the_design_example_parses_with_defaults_filled_in() {
    let c = Config::from_toml("door.toml", EXAMPLE).unwrap();
    assert_eq!(c.listen.len(), 2);
    assert_eq!(c.upstream.to_string(), "http://127.0.0.1:3000");
    assert_eq!(c.routes.len(), 3);
    let link = &c.groups["link"];
    assert!((link.budget.rate - 2.5).abs() < f64::EPSILON);
    assert_eq!(link.budget.burst, 5);
    assert_eq!(
        link.budget.per_client, 2,
        "unset keys keep the group's default"
    );
    assert_eq!(link.read_timeout, Duration::from_secs(15));
    assert_eq!(c.groups["webhook"].budget, Budget::webhook());
    assert_eq!(c.groups["webhook"].read_timeout, Duration::from_secs(10));
    assert_eq!(c.xdp.mode, XdpMode::Skb);
    assert_eq!(c.xdp.ports, vec![8443]);
    assert_eq!(c.xdp.syn_burst, DEFAULT_SYN_BURST);
}

#[test]
fn defaults_without_a_file() {
    let c = Config::load(None, &Overrides::default()).unwrap();
    assert_eq!(
        c.listen,
        vec![DEFAULT_LISTEN.parse::<SocketAddr>().unwrap()]
    );
    assert_eq!(c.admin_listen, Some(DEFAULT_ADMIN_LISTEN.parse().unwrap()));
    assert!(matches!(c.admin_listen, Some(AdminListen::Tcp(_))));
    assert_eq!(c.xdp.mode, XdpMode::Off);
    assert!(c.routes.is_empty());
    assert!(!c.disable_anon_route_limits);
}

#[test]
fn overrides_beat_the_file() {
    let dir = std::env::temp_dir().join(format!("door-config-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("door.toml");
    std::fs::write(&path, EXAMPLE).unwrap();
    let o = Overrides {
        listen: Some(vec!["127.0.0.1:1,127.0.0.1:2".into()]),
        upstream: Some("http://[::1]:9".into()),
        xdp_mode: Some("off".into()),
        ..Overrides::default()
    };
    let c = Config::load(Some(&path), &o).unwrap();
    assert_eq!(c.listen.len(), 2);
    assert_eq!(c.listen[1].port(), 2);
    assert_eq!(c.upstream.to_string(), "http://[::1]:9");
    assert_eq!(c.xdp.mode, XdpMode::Off);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn unknown_keys_are_named() {
    let e = err("lisen = [\"[::]:1\"]");
    assert!(
        e.starts_with("door.toml: lisen: unknown key; expected one of"),
        "{e}"
    );
    assert!(e.ends_with("(line 1, column 1)"), "{e}");
    let e = err("[group.link]\nrat = 1.0");
    assert!(
        e.starts_with("door.toml: group.link.rat: unknown key;"),
        "{e}"
    );
    assert!(e.ends_with("(line 2, column 1)"), "{e}");
    let e = err("[tls]\ncert = \"x\"");
    assert!(e.contains("tls"), "{e}");
}

/// A value of the wrong type is named by its dotted key and its text as written, once, with
/// where it is; a syntax error keeps the parser's quote of the line.
#[test]
fn values_of_the_wrong_type_are_named_by_their_dotted_key() {
    for (text, expected) in [
        (
            "[group.link]\nburst = 1.5",
            "door.toml: group.link.burst = 1.5: expected a whole number, found floating point \
             (line 2, column 9)",
        ),
        (
            "[group.link]\nrate = \"fast\"",
            "door.toml: group.link.rate = \"fast\": expected a number, found string (line 2, \
             column 8)",
        ),
        (
            "[[route]]\ngroup = \"link\"\npath = \"/a\"\n[[route]]\ngroup = 7\npath = \"/b\"",
            "door.toml: route[1].group = 7: expected a string, found integer (line 5, column 9)",
        ),
        (
            "[plane.session]\ncookie = 5",
            "door.toml: plane.session.cookie = 5: expected a string, found integer (line 2, \
             column 10)",
        ),
        (
            "[[route]]\ngroup = \"link\"",
            "door.toml: route[0].path: required, and missing (line 1, column 1)",
        ),
        (
            "[group.link]\nburst = 99999999999999999999",
            "door.toml: group.link.burst = 99999999999999999999: too large (line 2, column 9)",
        ),
    ] {
        assert_eq!(err(text), expected);
    }
    let e = err("deny = [\"192.0.2.0/24\"");
    assert!(
        e.contains("line 1, column 23") && e.contains("unclosed array"),
        "{e}"
    );
}

#[test]
fn a_huge_value_or_line_is_quoted_clipped() {
    // A 200 KB value of the wrong type: named by its first 120 characters.
    let huge = "x".repeat(200_000);
    let e = err(&format!("[group.link]\nburst = \"{huge}\""));
    assert!(e.len() < 400, "{} bytes", e.len());
    assert!(
        e.starts_with(&format!(
            "door.toml: group.link.burst = \"{}…",
            "x".repeat(119)
        )),
        "{e}"
    );
    assert!(
        e.ends_with("expected a whole number, found string (line 2, column 9)"),
        "{e}"
    );
    // A syntax error on a 200 KB line: the line is quoted around the column, with the caret.
    let e = err(&format!("deny = [\"{huge}\""));
    assert!(e.len() < 1_000, "{} bytes", e.len());
    let lines: Vec<&str> = e.lines().collect();
    assert!(
        lines[0].contains("unclosed array") && lines[0].contains("line 1, column 200011"),
        "{e}"
    );
    // The error is past the line's end: its last 120 characters, the caret after them.
    assert_eq!(lines[1], format!("  …{}\"", "x".repeat(119)), "{e}");
    assert_eq!(lines[2], format!("  {}^", " ".repeat(121)), "{e}");
    // In the middle of a long line: 60 characters either side of the column.
    let e = err(&format!(
        "listen = [\"{}\" \"{}\"]",
        "a".repeat(1000),
        "b".repeat(1000)
    ));
    let lines: Vec<&str> = e.lines().collect();
    assert!(lines[0].contains("(line 1, column 1014)"), "{e}");
    let around = format!("  …{}\" \"{}…", "a".repeat(58), "b".repeat(59));
    assert_eq!(lines[1], around, "{e}");
    assert_eq!(lines[2], format!("  {}^", " ".repeat(61)), "{e}");
    // A short line is quoted whole, the caret under the column.
    let e = err("listen = [\"[::]:8443\"]\nupstream = = 1");
    let lines: Vec<&str> = e.lines().collect();
    assert!(lines[0].contains("(line 2, column 12)"), "{e}");
    assert_eq!(lines[1], "  upstream = = 1", "{e}");
    assert_eq!(lines[2], "             ^", "{e}");
    // A duplicate key is named, as the file writes it.
    let e = err("[group.link]\nrate = 1.0\n\"rate\" = 2.0");
    assert!(
        e.contains("duplicate key `\"rate\"` (line 3, column 1)"),
        "{e}"
    );
    // Wide characters take two cells of the terminal, a combining mark none: the caret stays
    // under the column as the line shows it, while the column is counted in characters.
    let e = err("# 入口の設定\nlisten = [\"門\"] =");
    let lines: Vec<&str> = e.lines().collect();
    assert!(lines[0].contains("(line 2, column 16)"), "{e}");
    assert_eq!(lines[1], "  listen = [\"門\"] =", "{e}");
    assert_eq!(lines[2], format!("  {}^", " ".repeat(16)), "{e}");
    let e = err("upstream = \"cafe\u{301}\" =");
    let lines: Vec<&str> = e.lines().collect();
    assert!(lines[0].contains("(line 1, column 20)"), "{e}");
    assert_eq!(lines[2], format!("  {}^", " ".repeat(18)), "{e}");
    // A control character on the quoted line shows as a replacement character.
    let e = err("listen = = \"\u{1b}[2J\"");
    assert!(e.contains("  listen = = \"\u{fffd}[2J\""), "{e:?}");
    assert!(!e.contains('\u{1b}'), "{e:?}");
    // Nothing from the file reaches the terminal raw: an escape in an unknown key, in a group's
    // name before its values are checked, a bidirectional override; a value over several lines
    // is quoted on one; a CRLF file's CR is not quoted.
    for text in [
        "\"\\u001b[2J\" = 1",
        "[group.\"x\\u001b[2J\"]\nrate = \"a\"\nburst = 1",
        "[group.\"x\\u202Ey\"]\nrate = \"a\"\nburst = 1",
    ] {
        let e = err(text);
        assert!(!e.contains(['\u{1b}', '\u{202e}']), "{e:?}");
        assert!(e.contains('\u{fffd}'), "{e:?}");
    }
    let e = err("upstream = [\n\"a\",\n\"b\"\n]");
    assert!(
        e.starts_with("door.toml: upstream = [ \"a\", \"b\" ]: expected"),
        "{e:?}"
    );
    let e = err("listen = [\"[::]:8443\"]\r\nupstream = = 1\r\n");
    assert!(e.contains("\n  upstream = = 1\n"), "{e:?}");
    // A bad wildcard segment is quoted by its first 60 characters.
    let e = err(&format!(
        "[[route]]\ngroup = \"link\"\npath = \"/x{{{}\"",
        "a".repeat(100_000)
    ));
    assert!(e.len() < 500, "{} bytes", e.len());
    // The file's own checks quote a key or a value as clipped: a 300-character path.
    let long = format!("/{}", "p".repeat(300));
    let e = err(&format!("[[route]]\ngroup = \"link\"\npath = \"{long}?\""));
    assert!(
        e.starts_with(&format!("route[0].path = \"/{}…: ", "p".repeat(118))),
        "{e}"
    );
}

#[test]
fn bad_addresses_are_named() {
    assert_eq!(
        err("listen = [\"8443\"]"),
        "listen[0] = \"8443\": not a socket address (ip:port, [v6]:port)"
    );
    assert!(err("admin_listen = \"localhost:1\"").starts_with("admin_listen = \"localhost:1\""));
    assert!(err("admin_listen = \"unix:admin.sock\"").contains("absolute path"));
    assert!(err("admin_listen = \"unix:\"").contains("absolute path"));
    assert!(err("admin_listen = \"unix:/run/door/\"").contains("not a directory"));
    let long = format!(
        "admin_listen = \"unix:/{}\"",
        "a".repeat(MAX_UNIX_SOCKET_PATH)
    );
    assert!(err(&long).contains("at most 107 bytes"), "{}", err(&long));
    assert!(err("upstream = \"https://x:1\"").starts_with("upstream = \"https://x:1\""));
    assert!(err("upstream = \"http://x:1/app\"").contains("path"));
    for fragment in ["http://x:1#a", "http://x:1/#a", "http://x:1#"] {
        let e = err(&format!("upstream = \"{fragment}\""));
        assert!(
            e.starts_with(&format!("upstream = \"{fragment}\"")) && e.contains("fragment"),
            "{e}"
        );
    }
    for method in ["CONNECT", "connect"] {
        let e = err(&format!(
            "[[route]]\ngroup = \"link\"\nmethods = [\"{method}\"]\npath = \"/x\""
        ));
        assert!(e.contains(method) && e.contains("501"), "{e}");
    }
    assert!(err("upstream = \"127.0.0.1:3000\"").starts_with("upstream = \"127.0.0.1:3000\""));
}

#[test]
fn admin_listen_may_be_a_unix_socket() {
    let c = Config::from_toml("t", "admin_listen = \"unix:/run/door/admin.sock\"").unwrap();
    assert_eq!(
        c.admin_listen,
        Some(AdminListen::Unix(PathBuf::from("/run/door/admin.sock")))
    );
    assert_eq!(
        c.admin_listen.unwrap().to_string(),
        "unix:/run/door/admin.sock"
    );
    let off = Config::from_toml("t", "admin_listen = \"off\"").unwrap();
    assert_eq!(off.admin_listen, None);
}

#[test]
fn listen_entries_may_be_tables_with_proxy_protocol() {
    let c = Config::from_toml(
        "t",
        r#"
listen = ["127.0.0.1:8080", { addr = "[::]:8443", proxy_protocol = true }, { addr = "127.0.0.1:8081" }]
trusted_proxies = ["192.0.2.10"]
"#,
    )
    .unwrap();
    let addrs: Vec<SocketAddr> = ["127.0.0.1:8080", "[::]:8443", "127.0.0.1:8081"]
        .iter()
        .map(|a| a.parse().unwrap())
        .collect();
    assert_eq!(c.listen, addrs);
    assert_eq!(c.proxy_protocol_listen, vec![addrs[1]]);
    assert!(!c.requires_proxy_protocol(addrs[0]));
    assert!(c.requires_proxy_protocol(addrs[1]));
    assert!(!c.requires_proxy_protocol(addrs[2]));
    let c = Config::from_toml("t", "listen = [\"127.0.0.1:1\"]").unwrap();
    assert!(c.proxy_protocol_listen.is_empty());
}

#[test]
fn bad_listen_tables_are_named() {
    assert_eq!(
        err(
            "listen = [\"127.0.0.1:1\", { addr = \"8443\", proxy_protocol = true }]\ntrusted_proxies = [\"192.0.2.10\"]"
        ),
        "listen[1].addr = \"8443\": not a socket address (ip:port, [v6]:port)"
    );
    assert_eq!(
        err("listen = [{ addr = \"[::]:1\", proxy_protocol = \"yes\" }]"),
        "listen[0].proxy_protocol = \"yes\": must be true or false"
    );
    assert_eq!(
        err("listen = [{ addr = \"[::]:1\", proxy = true }]"),
        "listen[0].proxy = true: unknown key (expected addr, proxy_protocol)"
    );
    assert!(
        err("listen = [{ proxy_protocol = true }]")
            .starts_with("listen[0] = { proxy_protocol = true }: needs addr"),
        "{}",
        err("listen = [{ proxy_protocol = true }]")
    );
    assert!(err("listen = [8443]").starts_with("listen[0] = 8443: must be an address string"));
    assert_eq!(
        err("listen = []"),
        "listen = []: needs at least one address"
    );
}

#[test]
fn a_proxy_protocol_listener_needs_trusted_proxies() {
    assert_eq!(
        err("listen = [{ addr = \"[::]:1\", proxy_protocol = true }]"),
        "listen[0].proxy_protocol = true: needs trusted_proxies: the PROXY protocol header is \
         accepted only from a trusted proxy, so every connection would be refused"
    );
}

#[test]
fn listen_flags_replace_the_file_list() {
    let dir = std::env::temp_dir().join(format!("door-config-pp-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("door.toml");
    std::fs::write(
        &path,
        "listen = [{ addr = \"127.0.0.1:9\", proxy_protocol = true }]\ntrusted_proxies = [\"192.0.2.10\"]",
    )
    .unwrap();
    let o = Overrides {
        listen: Some(vec!["127.0.0.1:1".into()]),
        listen_proxy_protocol: Some(vec!["127.0.0.1:2,127.0.0.1:3".into()]),
        ..Overrides::default()
    };
    let c = Config::load(Some(&path), &o).unwrap();
    assert_eq!(c.listen.len(), 3);
    assert_eq!(
        c.proxy_protocol_listen,
        vec![
            "127.0.0.1:2".parse::<SocketAddr>().unwrap(),
            "127.0.0.1:3".parse().unwrap()
        ]
    );
    let o = Overrides {
        listen_proxy_protocol: Some(vec!["nope".into()]),
        ..Overrides::default()
    };
    let e = Config::load(Some(&path), &o).unwrap_err().to_string();
    assert_eq!(
        e,
        "listen[0] = \"nope\": not a socket address (ip:port, [v6]:port)"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn bad_cidrs_are_named() {
    assert!(
        err("trusted_proxies = [\"0.0.0.0/0\"]")
            .starts_with("trusted_proxies = \"0.0.0.0/0\": a /0 covers every address")
    );
    assert!(err("trusted_proxies = [\"::/0\"]").contains("/0"));
    assert!(
        err("trusted_proxies = [\"192.0.2.1/24\"]")
            .contains("host bits set (did you mean 192.0.2.0/24?)")
    );
    assert!(
        err("trusted_proxies = [\"192.0.2.300/32\"]")
            .starts_with("trusted_proxies = \"192.0.2.300/32\": not an IP address or CIDR")
    );
    let c = Config::from_toml("t", "trusted_proxies = [\"192.0.2.10, 2001:db8::/64\"]").unwrap();
    assert_eq!(c.trusted_proxies.nets().len(), 2);
    assert_eq!(c.trusted_proxies.nets()[0].prefix_len(), 32);
    assert!(
        c.trusted_proxies
            .contains("::ffff:192.0.2.10".parse().unwrap())
    );
}

#[test]
fn empty_cidr_entries_are_named_by_position() {
    assert_eq!(
        err("trusted_proxies = [\"192.0.2.10\", \"\"]"),
        "trusted_proxies[1] = \"\": empty: write a network or remove the entry"
    );
    assert_eq!(
        err("trusted_proxies = [\" \\t\", \"192.0.2.10\"]"),
        "trusted_proxies[0] = \" \\t\": empty: write a network or remove the entry"
    );
    assert_eq!(
        err("trusted_proxies = [\"192.0.2.10, \"]"),
        "trusted_proxies[0] = \"192.0.2.10, \": an element is empty (a stray comma?): remove it"
    );
    assert_eq!(
        err("allow = [\"10.0.0.0/8,,192.0.2.0/24\"]"),
        "allow[0] = \"10.0.0.0/8,,192.0.2.0/24\": an element is empty (a stray comma?): remove it"
    );
    assert_eq!(
        err("deny = [\"\", \"\"]"),
        "deny[0] = \"\": empty: write a network or remove the entry"
    );
    assert_eq!(
        err("[xdp]\nmode = \"off\"\nallow = [\"10.0.0.0/8\", \"\"]"),
        "xdp.allow[1] = \"\": empty: write a network or remove the entry"
    );
    // A flag's or variable's value is split on commas by clap, so the position is the element's.
    let overrides = flags(&["--trusted-proxy", "192.0.2.10,,"]).unwrap();
    assert_eq!(
        Config::load(None, &overrides).unwrap_err().to_string(),
        "trusted_proxies[1] = \"\": empty: write a network or remove the entry"
    );
    // No entry at all is the empty list, and so is one blank value alone: how a flag or a
    // variable empties the file's list.
    let c = Config::from_toml("t", "trusted_proxies = []\nallow = [\" \"]").unwrap();
    assert!(c.trusted_proxies.is_empty());
    assert!(c.allow.is_empty());
    let dir = std::env::temp_dir().join(format!("door-config-empty-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("door.toml");
    std::fs::write(&path, "trusted_proxies = [\"192.0.2.10\"]").unwrap();
    let overrides = flags(&["--trusted-proxy", ""]).unwrap();
    let loaded = Config::load(Some(&path), &overrides);
    std::fs::remove_dir_all(&dir).unwrap();
    let c = loaded.unwrap();
    assert!(
        c.trusted_proxies.is_empty(),
        "the flag's empty list beats the file's"
    );
}

#[test]
fn cidrs_that_together_cover_a_family_are_refused() {
    assert_eq!(
        err("trusted_proxies = [\"192.0.2.10\", \"0.0.0.0/1\", \"128.0.0.0/1\"]"),
        "trusted_proxies = [\"192.0.2.10/32\", \"0.0.0.0/1\", \"128.0.0.0/1\"]: together these \
         cover every IPv4 address (as trusted proxies, any client could choose its own key)"
    );
    // IPv4-mapped networks are IPv4 networks.
    assert_eq!(
        err(
            "trusted_proxies = [\"::ffff:0.0.0.0/97, 2001:db8::/32\", \"128.0.0.0/2\", \"192.0.0.0/2\"]"
        ),
        "trusted_proxies = [\"0.0.0.0/1\", \"128.0.0.0/2\", \"192.0.0.0/2\"]: together these cover \
         every IPv4 address (as trusted proxies, any client could choose its own key)"
    );
    assert_eq!(
        err("deny = [\"::/1\", \"8000::/1\"]"),
        "deny = [\"::/1\", \"8000::/1\"]: together these cover every IPv6 address: list the \
         networks you mean"
    );
    assert_eq!(
        err("allow = [\"0.0.0.0/1\", \"128.0.0.0/1\"]"),
        "allow = [\"0.0.0.0/1\", \"128.0.0.0/1\"]: together these cover every IPv4 address: list \
         the networks you mean"
    );
    assert_eq!(
        err("[xdp]\nmode = \"off\"\nallow = [\"::/1\", \"8000::/2\", \"c000::/2\"]"),
        "xdp.allow = [\"::/1\", \"8000::/2\", \"c000::/2\"]: together these cover every IPv6 \
         address: list the networks you mean"
    );
    // Halves of both families, each family with a gap, pass.
    let ok = "trusted_proxies = [\"0.0.0.0/1\", \"128.0.0.0/2\", \"::/1\", \"8000::/2\"]";
    assert_eq!(
        Config::from_toml("t", ok)
            .unwrap()
            .trusted_proxies
            .nets()
            .len(),
        4
    );
}

#[test]
fn front_defaults() {
    let c = Config::from_toml("t", "").unwrap();
    assert_eq!(c.tls, None);
    assert_eq!(c.header_read_timeout, DEFAULT_HEADER_READ_TIMEOUT);
    assert_eq!(c.idle_timeout, DEFAULT_IDLE_TIMEOUT);
    assert_eq!(c.drain_grace, DEFAULT_DRAIN_GRACE);
    assert_eq!(c.upstream_timeout, DEFAULT_UPSTREAM_TIMEOUT);
    assert_eq!(c.send_timeout, Duration::from_mins(1));
    assert_eq!(c.body_read_timeout, Duration::from_mins(1));
    assert!(c.ratelimit_headers);
    assert_eq!(
        c.otlp,
        OtlpConfig {
            endpoint: None,
            interval: None
        }
    );
}

#[test]
fn front_keys_parse() {
    let c = Config::from_toml(
        "t",
        "header_read_timeout = \"5s\"\nidle_timeout = \"2m\"\ndrain_grace = \"3s\"\n\
         upstream_timeout = \"1s\"\nsend_timeout = \"90s\"\nbody_read_timeout = \"45s\"\n\
         ratelimit_headers = false\n\
         [tls]\ncert = \"/c.pem\"\nkey = \"/k.pem\"\nmin_version = \"1.3\"\n\
         [otlp]\nendpoint = \"http://127.0.0.1:4318\"\ninterval = \"500ms\"",
    )
    .unwrap();
    assert_eq!(c.header_read_timeout, Duration::from_secs(5));
    assert_eq!(c.idle_timeout, Duration::from_mins(2));
    assert_eq!(c.drain_grace, Duration::from_secs(3));
    assert_eq!(c.upstream_timeout, Duration::from_secs(1));
    assert_eq!(c.send_timeout, Duration::from_secs(90));
    assert_eq!(c.body_read_timeout, Duration::from_secs(45));
    assert!(!c.ratelimit_headers);
    let tls = c.tls.unwrap();
    assert_eq!(tls.cert, PathBuf::from("/c.pem"));
    assert_eq!(tls.min_version, TlsVersion::Tls13);
    assert_eq!(c.otlp.endpoint.as_deref(), Some("http://127.0.0.1:4318"));
    assert_eq!(c.otlp.interval, Some(Duration::from_millis(500)));
}

#[test]
fn bad_front_keys_are_named() {
    assert_eq!(
        err("[tls]\ncert = \"/c.pem\""),
        "tls.key = (none): required with tls.cert"
    );
    assert_eq!(
        err("[tls]\ncert = \"/c\"\nkey = \"/k\"\nmin_version = \"1.1\""),
        "tls.min_version = \"1.1\": must be \"1.2\" or \"1.3\""
    );
    assert!(err("header_read_timeout = \"0s\"").starts_with("header_read_timeout = \"0s\""));
    assert!(err("idle_timeout = \"x\"").starts_with("idle_timeout = \"x\""));
    assert!(err("drain_grace = \"-1s\"").starts_with("drain_grace = \"-1s\""));
    assert!(err("upstream_timeout = \"0ms\"").starts_with("upstream_timeout = \"0ms\""));
    assert!(err("send_timeout = \"0s\"").starts_with("send_timeout = \"0s\""));
    assert!(err("body_read_timeout = \"1x\"").starts_with("body_read_timeout = \"1x\""));
    assert!(
        err("[otlp]\nendpoint = \"127.0.0.1:4318\"")
            .starts_with("otlp.endpoint = \"127.0.0.1:4318\"")
    );
    assert!(err("[otlp]\ninterval = \"0s\"").starts_with("otlp.interval = \"0s\""));
    for key in [
        "max_connections",
        "max_connections_per_client",
        "upstream_max_inflight",
        "upstream_max_inflight_per_client",
    ] {
        for v in ["0", "-3", "4294967296"] {
            assert_eq!(
                err(&format!("{key} = {v}")),
                format!("{key} = {v}: must be a whole number from 1 to 4294967295")
            );
        }
    }
    for v in ["0", "1025", "-3"] {
        assert_eq!(
            err(&format!("max_header_fields = {v}")),
            format!("max_header_fields = {v}: must be a whole number from 1 to 1024")
        );
    }
    assert!(
        err("[cluster]\nredis = \"http://127.0.0.1:6379\"")
            .starts_with("cluster.redis = \"http://127.0.0.1:6379\"")
    );
    assert!(
        err("[cluster]\nredis = \"redis://h\"\nsync_interval = \"0s\"")
            .starts_with("cluster.sync_interval = \"0s\"")
    );
    // A CA file is for a TLS store only.
    assert!(
        err("[cluster]\nredis = \"redis://h\"\nca_file = \"/etc/door/ca.pem\"")
            .starts_with("cluster.ca_file = \"/etc/door/ca.pem\"")
    );
    assert!(err("[cluster]\nca_file = \"/etc/door/ca.pem\"").starts_with("cluster.ca_file"));
}

#[test]
fn unknown_groups_are_named() {
    let e = err("[[route]]\ngroup = \"linkk\"\npath = \"/x\"");
    assert_eq!(
        e,
        "route[0].group = \"linkk\": unknown group (known: health, link, stream, webhook)"
    );
}

#[test]
fn bad_routes_name_the_key_and_the_value_once() {
    assert_eq!(
        err("[[route]]\ngroup = \"link\"\npath = \"x\""),
        "route[0].path = \"x\": must start with '/'"
    );
    assert_eq!(
        err(
            "[[route]]\ngroup = \"link\"\npath = \"/x\"\n[[route]]\ngroup = \"link\"\nmethods = [\"GET\", \"G ET\"]\npath = \"/y\""
        ),
        "route[1].methods = \"G ET\": not an HTTP method (a token of at most 32 characters)"
    );
    assert_eq!(
        err("[[route]]\ngroup = \"link\"\npath = \"/l/x{id}\""),
        "route[0].path = \"/l/x{id}\": segment \"x{id}\" must be literal text or a whole {name}"
    );
    assert!(
        err("[[route]]\ngroup = \"link\"\npath = \"/q?x=1\"")
            .starts_with("route[0].path = \"/q?x=1\": '?' never appears in a request path"),
    );
}

/// `[[route]]` entries as `(group, methods, path)`, in order.
fn routes_toml(routes: &[(&str, &[&str], &str)]) -> String {
    use std::fmt::Write as _;
    let mut text = String::new();
    for (group, methods, path) in routes {
        let _ = write!(
            text,
            "[[route]]\ngroup = \"{group}\"\nmethods = {methods:?}\npath = \"{path}\"\n"
        );
    }
    text
}

#[test]
fn a_route_that_earlier_routes_always_take_is_refused_naming_them() {
    // The same route twice: the second never decides a request.
    assert_eq!(
        err(&routes_toml(&[
            ("webhook", &["POST"], "/webhooks/github"),
            ("link", &["post"], "/webhooks/github/"),
        ])),
        "route[1].path = \"/webhooks/github/\": is never used: route[0] (\"/webhooks/github\", \
         POST) comes first and takes every request it matches (first match wins); remove it, or \
         move it above route[0]"
    );
    // A wildcard route above a specific one, for every method.
    assert_eq!(
        err(&routes_toml(&[
            ("link", &[], "/l/{kind}/{id}"),
            ("health", &["GET"], "/l/session/special"),
        ])),
        "route[1].path = \"/l/session/special\": is never used: route[0] (\"/l/{kind}/{id}\", \
         every method) comes first and takes every request it matches (first match wins); remove \
         it, or move it above route[0]"
    );
    // Two routes above that take its methods between them (HEAD with GET).
    assert_eq!(
        err(&routes_toml(&[
            ("link", &["GET"], "/s/{token}"),
            ("webhook", &["POST"], "/s/{id}"),
            ("link", &["HEAD", "POST"], "/s/abc"),
        ])),
        "route[2].path = \"/s/abc\": is never used: route[0] (\"/s/{token}\", GET) and route[1] \
         (\"/s/{id}\", POST) come first and take every request it matches (first match wins); \
         remove it, or move it above route[0]"
    );
}

#[test]
fn a_shadowed_route_names_at_most_three_routes_above_it_and_a_long_path_clipped() {
    let methods = ["GET", "POST", "PUT", "DELETE", "PATCH"];
    let mut routes: Vec<(&str, &[&str], &str)> = methods
        .iter()
        .map(|m| ("link", std::slice::from_ref(m), "/s/{id}"))
        .collect();
    routes.push(("webhook", &methods, "/s/x"));
    let e = err(&routes_toml(&routes));
    assert!(
        e.contains(
            "route[0] (\"/s/{id}\", GET) and route[1] (\"/s/{id}\", POST) and route[2] \
             (\"/s/{id}\", PUT) and 2 more come first"
        ),
        "{e}"
    );
    let long = format!("/{}/{{id}}", "p".repeat(300));
    let e = err(&routes_toml(&[
        ("link", &[], &long),
        ("webhook", &[], &format!("/{}/x", "p".repeat(300))),
    ]));
    assert!(
        e.contains(&format!("route[0] (\"/{}…, every method)", "p".repeat(118))),
        "{e}"
    );
    assert!(e.len() < 500, "{e}");
}

#[test]
fn a_shadowed_route_names_the_routes_that_decide_its_requests() {
    // The GET route above decides GET, not the later route for every method.
    let e = err(&routes_toml(&[
        ("link", &["GET"], "/s/{id}"),
        ("link", &[], "/s/{id}"),
        ("webhook", &["GET"], "/s/x"),
    ]));
    assert!(e.ends_with("move it above route[0]"), "{e}");
    assert!(e.contains("route[0] (\"/s/{id}\", GET) comes first"), "{e}");
    let e = err(&routes_toml(&[
        ("link", &["GET"], "/s/{id}"),
        ("link", &[], "/s/{id}"),
        ("webhook", &["GET", "POST"], "/s/x"),
    ]));
    assert!(
        e.contains("route[0] (\"/s/{id}\", GET) and route[1] (\"/s/{id}\", every method) come"),
        "{e}"
    );
}

#[test]
fn a_route_path_has_at_most_32_segments() {
    let path = "/a".repeat(33);
    assert_eq!(
        err(&routes_toml(&[("link", &[], &path)])),
        format!("route[0].path = \"{path}\": has 33 segments; a route's path has at most 32")
    );
    assert!(
        Config::from_toml(
            "door.toml",
            &routes_toml(&[("link", &[], &"/a".repeat(32))])
        )
        .is_ok()
    );
}

#[test]
fn routes_that_some_request_reaches_are_kept_in_order() {
    for routes in [
        // The specific route above the wildcard one: the documented way to single one out.
        &[
            ("health", &["GET"][..], "/l/session/special"),
            ("link", &[][..], "/l/session/{id}"),
        ][..],
        // A route above for some of the methods only; HEAD alone does not take GET.
        &[
            ("link", &["GET"], "/s/{token}"),
            ("webhook", &[], "/s/{token}"),
        ],
        &[("link", &["HEAD"], "/x"), ("webhook", &["GET"], "/x")],
        // Another segment count, or a literal above a wildcard.
        &[("link", &[], "/l/{id}"), ("link", &[], "/l/{id}/more")],
        &[("link", &[], "/l/a"), ("webhook", &[], "/l/{id}")],
        // Literals differing in case are not compared: the lenient reading lets the first take
        // most spellings of the second's path, but not every one (`Route::shadowed_by` claims
        // only what holds for all).
        &[("link", &[], "/API/x"), ("webhook", &[], "/api/x")],
    ] {
        let config = Config::from_toml("door.toml", &routes_toml(routes))
            .unwrap_or_else(|e| panic!("{routes:?}: {e}"));
        let paths: Vec<&str> = config.routes.iter().map(|r| r.path.as_str()).collect();
        let want: Vec<&str> = routes.iter().map(|r| r.2).collect();
        assert_eq!(paths, want);
    }
}

#[test]
fn more_routes_than_door_matches_are_refused_with_their_count() {
    let text = "[[route]]\ngroup = \"link\"\npath = \"/x\"\n".repeat(groups::MAX_ROUTES + 1);
    assert_eq!(
        err(&text),
        "route = 2001 entries: at most 2000 routes (each request is matched against them in order)"
    );
}

#[test]
fn a_plane_budget_without_a_credential_is_named() {
    assert_eq!(
        err("[plane.session]\nburst = 5"),
        "plane.session.burst = 5: needs plane.session.cookie = NAME or plane.session.header = \
         \"authorization\": the session plane is keyed on that credential"
    );
    assert_eq!(
        err("[plane.session]\nrate = 3.0\nburst = 5"),
        "plane.session.rate = 3: needs plane.session.cookie = NAME or plane.session.header = \
         \"authorization\": the session plane is keyed on that credential"
    );
    assert_eq!(
        err("[plane.ip]\nmax_clients = 9"),
        "plane.ip.max_clients = 9: needs [plane.session]: the planes are enabled by the session \
         plane"
    );
    assert_eq!(
        err("[plane.ip]"),
        "plane.ip = {…}: needs [plane.session]: the planes are enabled by the session plane"
    );
    assert!(
        err("[plane.session]\ncookie = \"sid\"\nheader = \"authorization\"").starts_with(
            "plane.session.cookie = \"sid\": given with plane.session.header = \"authorization\": \
             give exactly one"
        )
    );
}

#[test]
fn bad_durations_are_named() {
    assert!(
        err("[group.link]\nread_timeout = \"30 parsecs\"")
            .starts_with("group.link.read_timeout = \"30 parsecs\": not a duration")
    );
    assert!(err("[group.link]\nread_timeout = \"0s\"").contains("longer than zero"));
    // Past the clock's range, a deadline computed from it panicked on the request path.
    assert_eq!(
        err("header_read_timeout = \"9223372036854775807s\""),
        "header_read_timeout = \"9223372036854775807s\": must be at most 365 days"
    );
    assert_eq!(
        err("[group.link]\nread_timeout = \"366days\""),
        "group.link.read_timeout = \"366days\": must be at most 365 days"
    );
    assert_eq!(
        err("header_read_timeout = \"999us\""),
        "header_read_timeout = \"999us\": must be at least 1ms"
    );
    // humantime's `M` is a month: an operator writing "1M" for a minute is told.
    assert!(
        err("[xdp]\nmode = \"off\"\nblock_for = \"1M\"")
            .starts_with("xdp.block_for = \"1M\": \"M\" is a month in this syntax"),
        "{}",
        err("[xdp]\nmode = \"off\"\nblock_for = \"1M\"")
    );
    for ok in ["1ms", "365days", "1month", "2m 30s"] {
        let text = format!("[group.link]\nread_timeout = \"{ok}\"");
        assert!(Config::from_toml("door.toml", &text).is_ok(), "{ok}");
    }
}

#[test]
fn bad_budgets_are_named() {
    assert!(
        err("[group.link]\nrate = -1.0").starts_with("group.link.rate = -1: must be a positive")
    );
    assert!(err("[group.link]\nrate = 0.0").starts_with("group.link.rate = 0"));
    // Far out of range, a number is named in exponent form, not in hundreds of digits.
    assert_eq!(
        err("[group.link]\nrate = 1e-300"),
        "group.link.rate = 1e-300: is slower than one token a day"
    );
    assert_eq!(
        err("[group.link]\nrate = 1.5e300"),
        "group.link.rate = 1.5e300: is faster than one token per nanosecond"
    );
    assert!(
        err("[xdp]\ninterface = \"lo\"\nsyn_rate = 1e-300")
            .starts_with("xdp.syn_rate = 1e-300: must be a number per second")
    );
    assert!(err("[group.link]\nburst = 0").starts_with("group.link.burst = 0"));
    assert!(err("[group.link]\ninflight = 0").starts_with("group.link.inflight = 0"));
    assert!(
        err("[group.link]\nper_client = 5")
            .starts_with("group.link.per_client = 5: exceeds group.link.inflight = 4")
    );
    assert!(
        err("[group.link]\ncharge = \"sometimes\"")
            .starts_with("group.link.charge = \"sometimes\"")
    );
    assert!(err("[group.api]\nrate = 1.0").contains("new group must give at least rate and burst"));
    let c = Config::from_toml("t", "[group.api]\nrate = 3.0\nburst = 7").unwrap();
    assert_eq!(c.groups["api"].budget.burst, 7);
}

fn group(text: &str, name: &str) -> GroupConfig {
    Config::from_toml("t", text)
        .unwrap_or_else(|e| panic!("{e}"))
        .groups
        .remove(name)
        .unwrap()
}

#[test]
fn per_client_follows_a_lower_burst_under_on_failure() {
    let g = group("[group.webhook]\nburst = 5", "webhook");
    assert_eq!(g.budget.per_client, 5);
    assert_eq!(
        g.per_client_follows,
        Some(PerClientFollows {
            default: 16,
            inflight: false,
            burst: true
        })
    );
    assert_eq!(
        g.per_client_follows.unwrap().to_string(),
        "follows burst (charge = \"on_failure\"; default 16)"
    );
    let g = group(
        "[group.api]\nrate = 1.0\nburst = 3\ncharge = \"on_failure\"",
        "api",
    );
    assert_eq!(g.budget.per_client, 3, "a new group's default too");
    let g = group("[group.link]\nburst = 1\ncharge = \"on_failure\"", "link");
    assert_eq!(g.budget.per_client, 1);
    // Under charge = "always" a request holds no token: burst does not bound per_client.
    let g = group("[group.api]\nrate = 1.0\nburst = 3", "api");
    assert_eq!(g.budget.per_client, NEW_GROUP_PER_CLIENT);
    assert_eq!(g.per_client_follows, None);
    let g = group("[group.webhook]\nburst = 5\ncharge = \"always\"", "webhook");
    assert_eq!(g.budget.per_client, 16);
    // A burst at or above the default changes nothing.
    let g = group("[group.webhook]\nburst = 16", "webhook");
    assert_eq!((g.budget.per_client, g.per_client_follows), (16, None));
}

#[test]
fn per_client_follows_a_lower_inflight() {
    let g = group("[group.link]\ninflight = 1", "link");
    assert_eq!(g.budget.per_client, 1);
    assert_eq!(
        g.per_client_follows.map(|f| f.to_string()).as_deref(),
        Some("follows inflight (default 2)")
    );
    let g = group("[group.api]\nrate = 1.0\nburst = 100\ninflight = 8", "api");
    assert_eq!(g.budget.per_client, 8);
    // The lower of the two; both named when they are equal.
    let g = group("[group.webhook]\ninflight = 8\nburst = 5", "webhook");
    assert_eq!(g.budget.per_client, 5);
    assert!(!g.per_client_follows.unwrap().inflight);
    let g = group("[group.webhook]\ninflight = 3\nburst = 5", "webhook");
    assert_eq!(g.budget.per_client, 3);
    assert!(!g.per_client_follows.unwrap().burst);
    let g = group("[group.webhook]\ninflight = 4\nburst = 4", "webhook");
    assert_eq!(
        g.per_client_follows.map(|f| f.to_string()).as_deref(),
        Some("follows inflight and burst (charge = \"on_failure\"; default 16)")
    );
}

#[test]
fn a_per_client_the_file_gives_is_checked_as_written() {
    assert_eq!(
        err("[group.webhook]\nburst = 5\nper_client = 16"),
        "group.webhook.per_client = 16: exceeds group.webhook.burst = 5 with charge = \
         \"on_failure\": each request in flight holds a token"
    );
    assert!(
        err("[group.link]\ninflight = 1\nper_client = 2")
            .starts_with("group.link.per_client = 2: exceeds group.link.inflight = 1"),
    );
    let g = group("[group.webhook]\nburst = 5\nper_client = 3", "webhook");
    assert_eq!((g.budget.per_client, g.per_client_follows), (3, None));
}

#[test]
fn bad_xdp_settings_are_named() {
    assert!(err("[xdp]\nmode = \"auto\"").starts_with("xdp.interface = (none): required"));
    assert!(err("[xdp]\ninterface = \"lo\"\nmode = \"turbo\"").starts_with("xdp.mode = \"turbo\""));
    assert!(err("[xdp]\ninterface = \"lo\"\nports = [70000]").starts_with("xdp.ports[0] = 70000"));
    assert!(err("[xdp]\ninterface = \"lo\"\nsyn_rate = -5.0").starts_with("xdp.syn_rate = -5"));
    let c = Config::from_toml("t", "[xdp]\nmode = \"off\"").unwrap();
    assert_eq!(c.xdp.mode, XdpMode::Off);
}

#[test]
fn xdp_ports_default_to_the_ports_of_listen() {
    // Plain, PROXY protocol and (with [tls]) TLS listeners alike; duplicates once; sorted.
    let c = Config::from_toml(
        "t",
        r#"
listen = ["127.0.0.1:8443", "[::1]:8443", { addr = "[::]:80", proxy_protocol = true }, "0.0.0.0:443"]
trusted_proxies = ["192.0.2.10"]
[tls]
cert = "/c.pem"
key = "/k.pem"
[xdp]
interface = "eth0"
"#,
    )
    .unwrap();
    assert_eq!(c.xdp.ports, vec![80, 443, 8443]);
    let c = Config::from_toml("t", "").unwrap();
    assert_eq!(c.xdp.ports, vec![8443], "the default listen's port");
}

#[test]
fn xdp_ports_follow_the_listen_flags() {
    let o = Overrides {
        listen: Some(vec!["127.0.0.1:9000,[::1]:80".into()]),
        listen_proxy_protocol: Some(vec!["[::1]:9000".into()]),
        trusted_proxies: Some(vec!["192.0.2.10".into()]),
        xdp_interface: Some("eth0".into()),
        ..Overrides::default()
    };
    let c = Config::load(None, &o).unwrap();
    assert_eq!(c.xdp.mode, XdpMode::Auto);
    assert_eq!(c.xdp.ports, vec![80, 9000]);
}

#[test]
fn explicit_xdp_ports_win_over_listen() {
    let c = Config::from_toml(
        "t",
        "listen = [\"[::]:80\"]\n[xdp]\ninterface = \"eth0\"\nports = [22, 443]",
    )
    .unwrap();
    assert_eq!(c.xdp.ports, vec![22, 443]);
    let c = Config::from_toml(
        "t",
        "listen = [\"[::]:80\"]\n[xdp]\ninterface = \"eth0\"\nports = []",
    )
    .unwrap();
    assert!(c.xdp.ports.is_empty(), "[] still means every port");
}

#[test]
fn listeners_on_port_0_give_no_default_xdp_ports() {
    let c = Config::from_toml(
        "t",
        "listen = [\"127.0.0.1:0\", \"127.0.0.1:8080\"]\n[xdp]\ninterface = \"lo\"",
    )
    .unwrap();
    assert_eq!(c.xdp.ports, vec![8080]);
    assert!(
        err("listen = [\"127.0.0.1:0\"]\n[xdp]\ninterface = \"lo\"")
            .starts_with("xdp.ports = (none): the default is the ports of listen"),
        "{}",
        err("listen = [\"127.0.0.1:0\"]\n[xdp]\ninterface = \"lo\"")
    );
    let c = Config::from_toml("t", "listen = [\"127.0.0.1:0\"]").unwrap();
    assert!(c.xdp.ports.is_empty(), "no shield, no ports to protect");
}

#[test]
fn sockets_bound_twice_and_an_upstream_that_is_door_are_named() {
    assert_eq!(
        err("listen = [\"127.0.0.1:8443\", \"0.0.0.0:8443\"]"),
        "listen[1] = \"0.0.0.0:8443\": is the same socket as listen[0]"
    );
    assert!(
        err("listen = [\"[::]:8443\"]\nadmin_listen = \"[::1]:8443\"")
            .starts_with("admin_listen = \"[::1]:8443\": is the same socket as listen[0]")
    );
    assert_eq!(
        err("listen = [\"[::]:8443\"]\nupstream = \"http://127.0.0.1:8443\""),
        "upstream = \"http://127.0.0.1:8443\": is door's own listen[0]: every request would come \
         back into door"
    );
    assert_eq!(
        err("upstream = \"http://127.0.0.1:99999\""),
        "upstream = \"http://127.0.0.1:99999\": port \"99999\" is not a TCP port (1-65535)"
    );
    assert!(err("upstream = \"http://127.0.0.1:0\"").contains("is not a TCP port"));
    // The IPv6 and IPv4 wildcards on one port: door binds `[::]` IPv6-only, so both bind. An
    // upstream on another port is fine.
    let text = "listen = [\"[::]:8443\", \"0.0.0.0:8443\"]\nupstream = \"http://[::1]:3000\"";
    assert!(Config::from_toml("door.toml", text).is_ok());
}

#[test]
fn the_ipv6_wildcard_is_bound_ipv6_only_beside_an_ipv4_listener_on_its_port() {
    let a = |s: &str| s.parse::<SocketAddr>().unwrap();
    let config = |listen: &str, admin: &str| {
        let text = format!(
            "listen = [{listen}]\nadmin_listen = \"{admin}\"\nupstream = \"http://[::1]:3000\""
        );
        Config::from_toml("door.toml", &text).unwrap()
    };
    let both = config("\"[::]:8443\", \"0.0.0.0:8443\"", "off");
    assert!(both.binds_v6_only(a("[::]:8443")));
    assert!(!both.binds_v6_only(a("0.0.0.0:8443")));
    // One IPv4 address on the port is enough: `[::]` would claim it too.
    let one = config("\"[::]:8443\", \"127.0.0.1:8443\"", "off");
    assert!(one.binds_v6_only(a("[::]:8443")));
    // The admin listener's port counts as a listen port does.
    let admin = config("\"[::]:9901\"", "127.0.0.1:9901");
    assert!(admin.binds_v6_only(a("[::]:9901")));
    // Alone on its port, or beside IPv6 addresses only, `[::]` keeps accepting IPv4.
    let alone = config("\"[::]:8443\", \"127.0.0.1:8444\"", "127.0.0.1:9901");
    assert!(!alone.binds_v6_only(a("[::]:8443")));
    let v6 = config("\"[::]:8443\", \"[::1]:8444\"", "off");
    assert!(!v6.binds_v6_only(a("[::]:8443")));
    // A specific IPv6 address never claims IPv4 addresses.
    let specific = config("\"[::1]:8443\", \"127.0.0.1:8443\"", "off");
    assert!(!specific.binds_v6_only(a("[::1]:8443")));
    // Bound IPv6-only, `[::]` no longer takes the upstream's IPv4 loopback connections: not a
    // loop.
    let text =
        "listen = [\"[::]:8443\", \"192.0.2.10:8443\"]\nupstream = \"http://127.0.0.1:8443\"";
    assert!(Config::from_toml("door.toml", text).is_ok());
}

#[test]
fn an_ipv4_mapped_listen_address_is_refused_with_its_ipv4_form() {
    assert_eq!(
        err("listen = [\"[::ffff:127.0.0.1]:8443\"]"),
        "listen[0] = \"[::ffff:127.0.0.1]:8443\": is an IPv4-mapped IPv6 address: write the IPv4 \
         address (127.0.0.1:8443)"
    );
    assert_eq!(
        err("admin_listen = \"[::ffff:127.0.0.1]:9901\""),
        "admin_listen = \"[::ffff:127.0.0.1]:9901\": is an IPv4-mapped IPv6 address: write the \
         IPv4 address (127.0.0.1:9901)"
    );
}

#[test]
fn an_upstream_without_a_host_is_refused() {
    // `http://:3000` parses as a URI with an empty host; door then answered every request 502.
    assert_eq!(
        err("upstream = \"http://:3000\""),
        "upstream = \"http://:3000\": needs a host"
    );
    assert_eq!(
        err("upstream = \"http://\""),
        "upstream = \"http://\": not a URL (empty string)"
    );
}

#[test]
fn xdp_allow_refuses_a_zero_prefix_in_its_own_words() {
    let e = err("[xdp]\nmode = \"off\"\nallow = [\"0.0.0.0/0\"]");
    assert!(
        e.starts_with("xdp.allow = \"0.0.0.0/0\": a /0 covers every address"),
        "{e}"
    );
}

#[test]
fn a_redis_url_the_client_cannot_read_is_named_without_its_password() {
    let e = err("[cluster]\nredis = \"redis://:hunter2@127.0.0.1:99999/0\"");
    assert_eq!(
        e,
        "cluster.redis = \"redis://<elided>@127.0.0.1:99999/0\": not a URL (invalid port number)"
    );
    let e = err("[cluster]\nredis = \"redis://127.0.0.1:6379/notanumber\"");
    assert!(
        e.starts_with("cluster.redis = \"redis://127.0.0.1:6379/notanumber\": "),
        "{e}"
    );
    assert!(e.to_lowercase().contains("database"), "{e}");
    // A password with a `/` (base64) is elided whole.
    let e = err("[cluster]\nredis = \"redis://:ab/cd+ef@127.0.0.1:99999/0\"");
    assert!(!e.contains("cd+ef"), "{e}");
    assert!(
        e.starts_with("cluster.redis = \"redis://<elided>@127.0.0.1:99999/0\""),
        "{e}"
    );
    let e = err("[cluster]\nredis = \":secret@127.0.0.1\"");
    assert!(!e.contains("secret"), "{e}");
    let ok = "[cluster]\nredis = \"rediss://door:pw@redis.internal:6380/2\"";
    assert!(Config::from_toml("door.toml", ok).is_ok());
}

#[test]
fn group_names_have_no_control_characters() {
    // An escape sequence would reach door top's terminal; a newline broke the printed file.
    assert_eq!(
        err("[group.\"a\\u001b[2J\"]\nrate = 1.0\nburst = 1"),
        "group = \"a\\u{1b}[2J\": a group name is 1 to 64 bytes without control characters or \
         invisible ones (bidirectional controls, zero-width and other format characters), spaces \
         other than U+0020, or a space at either end"
    );
    // Names that read as `webhook`: a space at an end, a no-break or ideographic space, a Khmer
    // inherent vowel, a reserved default-ignorable character.
    for name in [
        "webhook ",
        " webhook",
        "web\\u00A0hook",
        "web\\u3000hook",
        "webhook\\u17B4",
        "webhook\\uFFF0",
        "webhook\\U000E0080",
    ] {
        let e = err(&format!("[group.\"{name}\"]\nrate = 1.0\nburst = 1"));
        assert!(e.contains("a group name is"), "{name}: {e}");
    }
    // A soft hyphen, a variation selector, a tag character, a Hangul filler, a line separator.
    for c in ["\\u00AD", "\\uFE0F", "\\U000E0041", "\\u3164", "\\u2028"] {
        let e = err(&format!("[group.\"link{c}\"]\nrate = 1.0\nburst = 1"));
        assert!(e.contains("a group name is"), "{c}: {e}");
    }
    // A right-to-left override would show `[group.ab]` as `[group.ba]` in the printed file; a
    // zero-width space makes a second `link` that reads as the first.
    assert!(
        err("[group.\"a\\u202Eb\"]\nrate = 1.0\nburst = 1")
            .starts_with("group = \"a\\u{202e}b\": a group name is")
    );
    assert!(
        err("[group.\"link\\u200B\"]\nrate = 1.0\nburst = 1")
            .starts_with("group = \"link\\u{200b}\": a group name is")
    );
    let ok = "[group.\"caf\u{e9}\"]\nrate = 1.0\nburst = 1";
    assert!(Config::from_toml("door.toml", ok).is_ok());
    assert!(err("[group.\"a\\nb\"]\nrate = 1.0\nburst = 1").starts_with("group = \"a\\nb\""));
    assert!(err("[group.\"\"]\nrate = 1.0\nburst = 1").starts_with("group = \"\""));
    let long = "g".repeat(65);
    assert!(err(&format!("[group.{long}]\nrate = 1.0\nburst = 1")).contains("1 to 64 bytes"));
    let ok = "[group.\"api v2_write\"]\nrate = 1.0\nburst = 1";
    assert!(Config::from_toml("door.toml", ok).is_ok());
}

/// `door`'s settings parsed as the binary parses its flags.
#[derive(clap::Parser)]
struct Flags {
    #[command(flatten)]
    overrides: Overrides,
}

/// `args` parsed as `door`'s flags, as [`clap::Parser::try_parse_from`] does, but with no
/// environment: every flag's `DOOR_*` variable is taken off the command first, so that a variable
/// set where the tests run (`DOOR_UPSTREAM`, `DOOR_GROUP`) is not read as a flag.
fn flags(args: &[&str]) -> Result<Overrides, String> {
    let command_line = std::iter::once("door").chain(args.iter().copied());
    let mut cmd = <Flags as clap::CommandFactory>::command().mut_args(|a| a.env(None::<&str>));
    let mut matches = cmd
        .try_get_matches_from_mut(command_line)
        .map_err(|e| e.to_string())?;
    <Flags as clap::FromArgMatches>::from_arg_matches_mut(&mut matches)
        .map(|f| f.overrides)
        .map_err(|e| e.format(&mut cmd).to_string())
}

/// The configuration of `text` (a file) under `args` (flags).
fn load_with(name: &str, text: &str, args: &[&str]) -> Result<Config, String> {
    let dir = std::env::temp_dir().join(format!("door-config-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("door.toml");
    std::fs::write(&path, text).unwrap();
    let loaded = flags(args).and_then(|o| Config::load(Some(&path), &o).map_err(|e| e.to_string()));
    std::fs::remove_dir_all(&dir).unwrap();
    loaded
}

#[test]
fn xdp_flags_beat_the_file_and_the_file_beats_the_default() {
    let file = "[xdp]\nmode = \"off\"\nsyn_rate = 50.0\nports = [22]\nblock_for = \"2m\"";
    let c = load_with("xdp", file, &[]).unwrap();
    assert!((c.xdp.syn_rate - 50.0).abs() < f64::EPSILON);
    assert_eq!(c.xdp.ports, vec![22]);
    assert_eq!(c.xdp.block_for, Duration::from_mins(2));
    assert_eq!(
        c.xdp.syn_burst, DEFAULT_SYN_BURST,
        "the default where neither gives it"
    );
    let c = load_with(
        "xdp-flags",
        file,
        &[
            "--xdp-syn-rate",
            "70",
            "--xdp-ports",
            "80,443",
            "--xdp-block-for",
            "30s",
            "--xdp-syn-cookies",
            "auto",
            "--xdp-allow",
            "10.0.0.0/8",
        ],
    )
    .unwrap();
    assert!((c.xdp.syn_rate - 70.0).abs() < f64::EPSILON);
    assert_eq!(c.xdp.ports, vec![80, 443]);
    assert_eq!(c.xdp.block_for, Duration::from_secs(30));
    assert_eq!(c.xdp.syn_cookies, SynCookies::Auto);
    assert_eq!(c.xdp.allow, vec!["10.0.0.0/8".parse::<IpNet>().unwrap()]);
    // An empty value is the empty list: every port.
    let c = load_with("xdp-empty", file, &["--xdp-ports", ""]).unwrap();
    assert!(c.xdp.ports.is_empty());
}

#[test]
fn bad_xdp_flag_values_are_named() {
    assert_eq!(
        load_with(
            "xdp-bad-port",
            "",
            &["--xdp-mode", "off", "--xdp-ports", "80,x"]
        )
        .unwrap_err(),
        "xdp.ports[1] = \"x\": not a TCP port (1-65535)"
    );
    assert_eq!(
        load_with(
            "xdp-big-port",
            "",
            &["--xdp-mode", "off", "--xdp-ports", "70000"]
        )
        .unwrap_err(),
        "xdp.ports[0] = 70000: not a TCP port (1-65535)"
    );
    assert!(
        load_with(
            "xdp-bad-rate",
            "",
            &["--xdp-mode", "off", "--xdp-syn-rate=-5"]
        )
        .unwrap_err()
        .starts_with("xdp.syn_rate = -5: must be a number per second")
    );
    assert!(
        load_with(
            "xdp-bad-window",
            "",
            &["--xdp-mode", "off", "--xdp-escalate-window", "x"]
        )
        .unwrap_err()
        .starts_with("xdp.escalate_window = \"x\": not a duration")
    );
    let e = flags(&["--xdp-syn-rate", "fast"]).unwrap_err();
    assert!(
        e.starts_with("error: invalid value 'fast' for '--xdp-syn-rate <XDP_SYN_RATE>'"),
        "{e}"
    );
    // An [xdp] key given as a flag turns the shield on as the section does: it needs an
    // interface, unless the mode is off.
    assert!(
        load_with("xdp-on", "", &["--xdp-syn-burst", "10"])
            .unwrap_err()
            .starts_with("xdp.interface = (none): required with xdp.mode = \"auto\"")
    );
    let c = load_with(
        "xdp-on-lo",
        "",
        &["--xdp-syn-burst", "10", "--xdp-interface", "lo"],
    )
    .unwrap();
    assert_eq!((c.xdp.mode, c.xdp.syn_burst), (XdpMode::Auto, 10));
}

#[test]
fn plane_flags_beat_the_file_and_the_file_beats_the_default() {
    let file = "[plane.session]\ncookie = \"sid\"\nrate = 3.0\n[plane.ip]\nburst = 10";
    let c = load_with("plane", file, &[]).unwrap();
    let p = c.planes.unwrap();
    assert!((p.session.rate - 3.0).abs() < f64::EPSILON);
    assert_eq!(p.session.burst, DEFAULT_SESSION_BURST);
    assert_eq!(p.ip.burst, 10);
    assert!((p.ip.rate - DEFAULT_IP_RATE).abs() < f64::EPSILON);
    let c = load_with(
        "plane-flags",
        file,
        &[
            "--plane-session-rate",
            "5",
            "--plane-ip-burst",
            "12",
            "--plane-session-header",
            "authorization",
        ],
    )
    .unwrap();
    let p = c.planes.unwrap();
    assert!((p.session.rate - 5.0).abs() < f64::EPSILON);
    assert_eq!(p.ip.burst, 12);
    assert_eq!(
        p.credential,
        Credential::Bearer,
        "the flag replaces the file's cookie"
    );
    // Without a file, a credential flag turns the planes on.
    let c = load_with("plane-none", "", &["--plane-session-cookie", "sid"]).unwrap();
    let p = c.planes.unwrap();
    assert_eq!(p.credential, Credential::Cookie("sid".into()));
    assert!((p.session.rate - DEFAULT_SESSION_RATE).abs() < f64::EPSILON);
}

#[test]
fn plane_flags_without_a_credential_are_named() {
    assert_eq!(
        load_with("plane-rate", "", &["--plane-session-rate", "3"]).unwrap_err(),
        "plane.session.rate = 3: needs plane.session.cookie = NAME or plane.session.header = \
         \"authorization\": the session plane is keyed on that credential"
    );
    assert_eq!(
        load_with("plane-ip", "", &["--plane-ip-burst", "5"]).unwrap_err(),
        "plane.ip.burst = 5: needs [plane.session]: the planes are enabled by the session plane"
    );
    assert!(
        load_with("plane-bad-cookie", "", &["--plane-session-cookie", "a b"])
            .unwrap_err()
            .starts_with("plane.session.cookie = \"a b\": not a cookie name")
    );
    assert!(
        load_with(
            "plane-both",
            "[plane.session]\ncookie = \"sid\"",
            &[
                "--plane-session-cookie",
                "s",
                "--plane-session-header",
                "authorization"
            ]
        )
        .unwrap_err()
        .starts_with(
            "plane.session.cookie = \"s\": given with plane.session.header = \"authorization\""
        )
    );
}

#[test]
fn group_flags_beat_the_file_and_the_file_beats_the_default() {
    let file = "[group.link]\nrate = 2.5\nburst = 5\nread_timeout = \"15s\"";
    let c = load_with("group", file, &[]).unwrap();
    assert!((c.groups["link"].budget.rate - 2.5).abs() < f64::EPSILON);
    assert_eq!(c.groups["link"].budget.inflight, Budget::link().inflight);
    let c = load_with(
        "group-flags",
        file,
        &[
            "--group",
            "link.rate=2,link.burst=40",
            "--group",
            "webhook.read_timeout=20s",
            "--group",
            "api.rate=1.5,api.burst=3,api.charge=on_failure",
        ],
    )
    .unwrap();
    let link = &c.groups["link"];
    assert!((link.budget.rate - 2.0).abs() < f64::EPSILON);
    assert_eq!(link.budget.burst, 40);
    assert_eq!(
        link.read_timeout,
        Duration::from_secs(15),
        "the file's, not given as a flag"
    );
    assert_eq!(c.groups["webhook"].read_timeout, Duration::from_secs(20));
    let api = &c.groups["api"];
    assert_eq!(
        (api.budget.burst, api.budget.charge),
        (3, Charge::OnFailure)
    );
    assert_eq!(
        api.budget.per_client, 3,
        "a new group's per_client follows burst"
    );
}

#[test]
fn bad_group_items_are_named() {
    let e = flags(&["--group", "link.rte=2"]).unwrap_err();
    assert!(
        e.starts_with(
            "error: invalid value 'link.rte=2' for '--group <NAME.KEY=VALUE>': unknown key \"rte\" \
             (expected rate, burst, per_client, inflight, max_clients, read_timeout, charge)"
        ),
        "{e}"
    );
    for (item, why) in [
        ("link.rate", "no '='"),
        ("rate=2", "no '.'"),
        (
            "link.burst=many",
            "burst must be a whole number, not \"many\"",
        ),
        ("link.rate=x", "rate must be a number, not \"x\""),
        (".rate=1", "no group name before .rate"),
        (" .burst=3", "no group name before .burst"),
    ] {
        let e = flags(&["--group", item]).unwrap_err();
        assert!(
            e.contains(&format!("'{item}'")) && e.contains(why),
            "{item}: {e}"
        );
    }
    // A stray comma is refused, naming the item; one blank value alone sets nothing.
    for list in ["link.rate=2,", "link.rate=2,,link.burst=3"] {
        let e = load_with("group-comma", "", &["--group", list]).unwrap_err();
        assert!(
            e.starts_with("--group / DOOR_GROUP[") && e.contains("a stray comma"),
            "{list}: {e}"
        );
    }
    assert!(load_with("group-blank", "", &["--group", ""]).is_ok());
    assert!(
        load_with("group-neg", "", &["--group", "link.rate=-1"])
            .unwrap_err()
            .starts_with("group.link.rate = -1: must be a positive")
    );
    assert!(
        load_with("group-new", "", &["--group", "api.rate=1"])
            .unwrap_err()
            .contains("a new group must give at least rate and burst")
    );
    assert!(
        load_with("group-timeout", "", &["--group", "link.read_timeout=soon"])
            .unwrap_err()
            .starts_with("group.link.read_timeout = \"soon\": not a duration")
    );
}

#[test]
fn route_flags_replace_the_file_routes() {
    let c = load_with("routes", EXAMPLE, &["--xdp-mode", "off"]).unwrap();
    assert_eq!(c.routes.len(), 3);
    let c = load_with(
        "routes-flags",
        EXAMPLE,
        &[
            "--xdp-mode",
            "off",
            "--route",
            "{ group = \"link\", methods = [\"GET\"], path = \"/l/session/{id}\" }",
            "--route",
            "{ group = \"health\", path = \"/up\", stream = true }",
        ],
    )
    .unwrap();
    assert_eq!(c.routes.len(), 2);
    assert_eq!(c.routes[0].path.as_str(), "/l/session/{id}");
    assert_eq!(c.routes[0].methods, vec![::http::Method::GET]);
    assert!(c.routes[1].stream);
    let c = load_with("routes-none", "", &[]).unwrap();
    assert!(c.routes.is_empty(), "the default");
}

#[test]
fn bad_route_flags_are_named() {
    let e = flags(&["--route", "{ grup = \"link\", path = \"/x\" }"]).unwrap_err();
    assert!(
        e.starts_with("error: invalid value '{ grup = \"link\", path = \"/x\" }' for '--route <TABLE>': unknown field `grup`"),
        "{e}"
    );
    let e = flags(&["--route", "[{ group = \"link\", path = \"/x\" }]"]).unwrap_err();
    assert!(e.contains("for '--route <TABLE>'"), "{e}");
    assert_eq!(
        load_with(
            "route-bad",
            "",
            &["--route", "{ group = \"link\", path = \"x\" }"]
        )
        .unwrap_err(),
        "route[0].path = \"x\": must start with '/'"
    );
    assert_eq!(
        load_with(
            "route-group",
            "",
            &["--route", "{ group = \"api\", path = \"/x\" }"]
        )
        .unwrap_err(),
        "route[0].group = \"api\": unknown group (known: health, link, stream, webhook)"
    );
    // A group the flags create can be routed to.
    let c = load_with(
        "route-new-group",
        "",
        &[
            "--group",
            "api.rate=1,api.burst=2",
            "--route",
            "{ group = \"api\", path = \"/x\" }",
        ],
    )
    .unwrap();
    assert_eq!(c.routes[0].group, "api");
}

/// A reload (SIGHUP) loads the file again under the flags door started with, as `door`'s
/// reloader does: the new flags keep beating the file, and the file's other changes apply.
#[test]
fn a_reload_keeps_the_table_flags_winning() {
    let dir = std::env::temp_dir().join(format!("door-config-reload-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("door.toml");
    std::fs::write(
        &path,
        "[group.link]\nrate = 2.5\n[xdp]\nmode = \"off\"\nsyn_rate = 50.0",
    )
    .unwrap();
    let o = flags(&[
        "--group",
        "link.rate=2",
        "--xdp-syn-rate",
        "70",
        "--plane-session-cookie",
        "sid",
        "--route",
        "{ group = \"link\", path = \"/l/{id}\" }",
    ])
    .unwrap();
    let reload: crate::daemon::Reloader = {
        let path = path.clone();
        Box::new(move || Config::load(Some(&path), &o))
    };
    let before = reload().unwrap();
    std::fs::write(
        &path,
        "[group.link]\nrate = 4.0\nburst = 7\n[xdp]\nmode = \"off\"\nsyn_rate = 60.0\n\
         [[route]]\ngroup = \"webhook\"\npath = \"/hook\"",
    )
    .unwrap();
    let after = reload();
    std::fs::remove_dir_all(&dir).unwrap();
    let after = after.unwrap();
    for c in [&before, &after] {
        assert!((c.groups["link"].budget.rate - 2.0).abs() < f64::EPSILON);
        assert!((c.xdp.syn_rate - 70.0).abs() < f64::EPSILON);
        assert!(c.planes.is_some());
        assert_eq!(c.routes.len(), 1);
        assert_eq!(c.routes[0].path.as_str(), "/l/{id}");
    }
    assert_eq!(
        after.groups["link"].budget.burst, 7,
        "the file's other keys reload"
    );
}

/// `allow` and `deny` written after `[xdp]` are, to TOML, `xdp.allow` and `xdp.deny`: both are
/// accepted as such (the top-level lists stay empty; the request path reads both,
/// `tests/front.rs`).
#[test]
fn allow_and_deny_after_the_xdp_table_are_read_as_the_xdp_tables_lists() {
    let c = Config::from_toml(
        "door.toml",
        "[xdp]\ninterface = \"lo\"\nallow = [\"192.0.2.0/24\"]\ndeny = [\"203.0.113.0/24\"]\n",
    )
    .unwrap();
    assert_eq!(c.xdp.allow, vec!["192.0.2.0/24".parse::<IpNet>().unwrap()]);
    assert_eq!(c.xdp.deny, vec!["203.0.113.0/24".parse::<IpNet>().unwrap()]);
    assert!(c.allow.is_empty() && c.deny.is_empty());
    // One list at layer 7: together they may not cover a whole family either.
    let e = err("allow = [\"0.0.0.0/1\"]\n[xdp]\nmode = \"off\"\nallow = [\"128.0.0.0/1\"]");
    assert!(
        e.starts_with(
            "allow with xdp.allow = [\"0.0.0.0/1\", \"128.0.0.0/1\"]: together these cover every \
             IPv4 address"
        ),
        "{e}"
    );
    let e = err("[xdp]\nmode = \"off\"\ndeny = [\"0.0.0.0/0\"]");
    assert!(
        e.starts_with("xdp.deny = \"0.0.0.0/0\": a /0 covers every address"),
        "{e}"
    );
}

/// A table is allocated whole when its group or plane is built: a `max_clients` past
/// [`crate::limit::MAX_CLIENTS`] is refused, named, instead of aborting door at start.
#[test]
fn a_table_too_large_to_allocate_is_refused_by_name() {
    assert_eq!(
        err("[group.link]\nmax_clients = 4294967295"),
        "group.link.max_clients = 4294967295: exceeds 16777216 (about 1.1 GB of table): the \
         table is allocated whole at start"
    );
    let e = err("[plane.session]\ncookie = \"sid\"\nmax_clients = 16777217");
    assert!(
        e.starts_with("plane.session.max_clients = 16777217: exceeds"),
        "{e}"
    );
    Config::from_toml("door.toml", "[group.link]\nmax_clients = 16777216").unwrap();
    // Below 1, and past what the file's integers hold, the range given is the table's.
    for (file, key) in [
        (
            "[group.link]\nmax_clients = 0",
            "group.link.max_clients = 0",
        ),
        (
            "[plane.session]\ncookie = \"sid\"\n[plane.ip]\nmax_clients = -5",
            "plane.ip.max_clients = -5",
        ),
    ] {
        assert_eq!(
            err(file),
            format!("{key}: must be a whole number from 1 to 16777216")
        );
    }
}

/// An empty list flag is the empty list, as for the other list flags: `--xdp-allow ""` empties
/// the file's list without turning the shield on, and an empty `--group ""` sets nothing.
#[test]
fn empty_list_flags_empty_a_list_and_turn_nothing_on() {
    let c = load_with(
        "empty-lists",
        "",
        &[
            "--xdp-allow",
            "",
            "--xdp-deny",
            "",
            "--xdp-ports",
            "",
            "--group",
            "",
        ],
    )
    .unwrap();
    assert_eq!(c.xdp.mode, XdpMode::Off, "no [xdp] key was given");
    assert!(c.xdp.allow.is_empty() && c.xdp.deny.is_empty());
    assert_eq!(c.groups, Config::from_toml("d.toml", "").unwrap().groups);
    let c = load_with(
        "empty-list-over-file",
        "[xdp]\nmode = \"off\"\nallow = [\"192.0.2.0/24\"]\n",
        &["--xdp-allow", ""],
    )
    .unwrap();
    assert!(c.xdp.allow.is_empty(), "the flag empties the file's list");
}

/// Lists that take more entries of the XDP shield's lists map than it holds are refused, naming
/// the longest list and the count (an IPv4 network takes two); with `xdp.mode = "off"` they apply
/// at layer 7 only, and any length is accepted.
#[test]
fn lists_longer_than_the_shields_map_are_refused() {
    let nets = |n: u32, first: u8| -> String {
        (0..n)
            .map(|i| {
                let [_, _, a, b] = i.to_be_bytes();
                format!("\"{first}.0.{a}.{b}\"")
            })
            .collect::<Vec<_>>()
            .join(", ")
    };
    let text = |deny: u32, allow: u32, mode: &str| {
        format!(
            "deny = [{}]\nallow = [{}]\n[xdp]\ninterface = \"lo\"\nmode = \"{mode}\"\n",
            nets(deny, 203),
            nets(allow, 198)
        )
    };
    let e = err(&text(2000, 50, "auto"));
    assert!(
        e.starts_with(
            "deny = [2000 networks]: with trusted_proxies, allow, deny, xdp.allow and \
                       xdp.deny these take 4100 entries of the XDP shield's lists, which hold \
                       4096"
        ),
        "{e}"
    );
    assert!(Config::from_toml("door.toml", &text(2000, 48, "auto")).is_ok());
    assert!(Config::from_toml("door.toml", &text(2000, 50, "off")).is_ok());
    // An IPv6 network that covers the IPv4-mapped addresses takes one more entry.
    assert_eq!(
        shield_list_entries(
            &["192.0.2.0/24".parse().unwrap()],
            &["::/8".parse().unwrap(), "192.0.2.0/24".parse().unwrap()]
        ),
        4
    );
}
