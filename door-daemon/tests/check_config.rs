//! `door check-config` run as a program: a good file prints the effective configuration (which
//! door accepts back) and exits 0; a bad one exits 78 (EX_CONFIG) naming the key and the value.
//! Other start-up failures (a port in use) exit 1, so that systemd restarts door; every error
//! names its cause once.

mod ambient;

use std::{
    path::{Path, PathBuf},
    process::{Command, Output},
};

use door_daemon::config::{Config, XdpMode};

/// A file in a directory of its own, removed on drop.
struct TempFile {
    dir: PathBuf,
    path: PathBuf,
}

impl TempFile {
    #[expect(clippy::unwrap_used, reason = "test helper")]
    fn new(name: &str, text: &str) -> Self {
        let dir =
            std::env::temp_dir().join(format!("door-check-config-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("door.toml");
        std::fs::write(&path, text).unwrap();
        Self { dir, path }
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Runs `door check-config --config FILE` with no `DOOR_*` variables.
fn check_config(file: &TempFile) -> Output {
    check_config_at(&file.path)
}

/// The `door` binary as a command with none of this process's `DOOR_*` variables.
fn door_command() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_door"));
    for name in ambient::door_variables() {
        cmd.env_remove(name);
    }
    cmd
}

/// Runs `door check-config --config path` with no `DOOR_*` variables; fails the test if it has
/// not exited within 30 s (a file that blocks its reader once held it for ever).
#[expect(
    clippy::unwrap_used,
    clippy::panic,
    reason = "test helper: a failed step fails the test"
)]
fn check_config_at(path: &Path) -> Output {
    let mut child = door_command()
        .arg("check-config")
        .arg("--config")
        .arg(path)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = door_daemon::time::now() + std::time::Duration::from_secs(30);
    while child.try_wait().unwrap().is_none() {
        if door_daemon::time::now() > deadline {
            let _ = child.kill();
            panic!(
                "door check-config --config {} did not exit within 30 s",
                path.display()
            );
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    child.wait_with_output().unwrap()
}

#[test]
fn a_good_file_prints_the_effective_configuration_and_exits_0() {
    let example = include_str!("../../examples/door.toml");
    let file = TempFile::new("good", example);
    let out = check_config(&file);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{:?}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.trim_end().ends_with("# configuration OK"),
        "{stdout}"
    );
    assert!(
        stdout.contains("[group.webhook]"),
        "defaults filled in: {stdout}"
    );
    let printed = Config::from_toml("stdout", &stdout).expect("door accepts its own output");
    assert_eq!(printed, Config::from_toml("example", example).unwrap());
}

/// A reader that goes away before door has written everything (`door check-config | head`) ends
/// the output quietly: exit 0, no panic. Before, door panicked on the broken pipe and exited 101.
#[test]
fn a_reader_that_goes_away_ends_the_output_quietly() {
    let example = include_str!("../../examples/door.toml");
    let file = TempFile::new("pipe", example);
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let out = door_command()
        .arg("check-config")
        .arg("--config")
        .arg(&file.path)
        .stdout(writer)
        .stderr(std::process::Stdio::piped())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{:?}\n{stderr}", out.status);
    assert!(!stderr.contains("panicked"), "{stderr}");
}

/// `door check-config` on `text`: asserts exit 0 and that the output parses back to the same
/// configuration; returns the output.
#[expect(clippy::expect_used, reason = "test helper")]
fn check_config_ok(name: &str, text: &str) -> String {
    let file = TempFile::new(name, text);
    let out = check_config(&file);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{:?}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let printed = Config::from_toml("stdout", &stdout).expect("door accepts its own output");
    let read = Config::from_toml(name, text).expect("the file parses in-process too");
    assert_eq!(printed, read, "{stdout}");
    stdout
}

#[test]
fn the_default_xdp_ports_print_as_the_listen_ports() {
    let stdout = check_config_ok(
        "xdp-ports",
        "listen = [\"127.0.0.1:8080\", \"[::1]:8443\", \"127.0.0.1:8443\"]\n\
         [xdp]\ninterface = \"lo\"\n",
    );
    assert!(
        stdout.lines().any(|l| l == "ports = [8080, 8443]"),
        "{stdout}"
    );
}

#[test]
fn a_per_client_the_file_does_not_give_follows_burst_and_says_so() {
    let stdout = check_config_ok("follows-burst", "[group.webhook]\nburst = 5\n");
    assert!(
        stdout
            .lines()
            .any(|l| l == "per_client = 5  # follows burst (charge = \"on_failure\"; default 16)"),
        "{stdout}"
    );
}

#[test]
fn a_written_per_client_over_burst_exits_78_naming_both_keys() {
    let file = TempFile::new(
        "per-client-over-burst",
        "[group.webhook]\nburst = 5\nper_client = 16\n",
    );
    let out = check_config(&file);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(78), "{stderr}");
    assert!(stderr.contains("group.webhook.per_client = 16"), "{stderr}");
    assert!(stderr.contains("group.webhook.burst = 5"), "{stderr}");
}

/// The configuration the Debian package installs as `/etc/door/door.toml`.
const TEMPLATE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../packaging/door.toml");

#[test]
fn the_packaged_template_passes_check_config() {
    let out = check_config_at(Path::new(TEMPLATE));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "door check-config --config {TEMPLATE}:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.trim_end().ends_with("# configuration OK"),
        "{stdout}"
    );
    let text = std::fs::read_to_string(TEMPLATE).expect("reading the template");
    let template = Config::from_toml(TEMPLATE, &text).expect("the template parses");
    let printed = Config::from_toml("stdout", &stdout).expect("door accepts its own output");
    assert_eq!(printed, template);
    // Standard port, no TLS files needed, no interface needed, status on loopback only.
    assert_eq!(
        template.listen,
        vec!["[::]:80".parse().expect("an address")]
    );
    assert_eq!(
        template.tls, None,
        "[tls] needs files a template cannot ship"
    );
    assert_eq!(template.xdp.mode, XdpMode::Off);
    assert_eq!(
        template.xdp.ports,
        vec![80],
        "the shield would guard listen"
    );
    assert!(
        matches!(
            template.admin_listen,
            Some(door_daemon::config::AdminListen::Tcp(a)) if a.ip().is_loopback()
        ),
        "{:?}",
        template.admin_listen
    );
    let groups: Vec<&str> = template.routes.iter().map(|r| r.group.as_str()).collect();
    assert_eq!(groups, ["webhook", "link", "health"]);
    // The operator's values are marked.
    let marked = |key: &str| {
        let lines: Vec<&str> = text.lines().collect();
        lines.iter().enumerate().any(|(i, l)| {
            l.trim_start_matches("# ").starts_with(key)
                && lines[..i]
                    .iter()
                    .rev()
                    .take_while(|l| l.starts_with('#'))
                    .any(|l| l.contains("SET THIS"))
        })
    };
    assert!(marked("upstream ="), "upstream has no SET THIS comment");
    assert!(
        marked("interface ="),
        "[xdp] interface has no SET THIS comment"
    );
}

#[test]
fn the_package_installs_the_template() {
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml"))
        .expect("reading door-daemon/Cargo.toml");
    let manifest: toml::Table = toml::from_str(&text).expect("door-daemon/Cargo.toml parses");
    let assets = manifest
        .get("package")
        .and_then(|p| p.get("metadata"))
        .and_then(|m| m.get("deb"))
        .and_then(|d| d.get("assets"))
        .and_then(toml::Value::as_array)
        .expect("[package.metadata.deb] assets");
    let conf: Vec<&toml::Value> = assets
        .iter()
        .filter(|a| a.get(1).and_then(toml::Value::as_str) == Some("etc/door/door.toml"))
        .collect();
    assert_eq!(conf.len(), 1, "{assets:?}");
    assert_eq!(
        conf[0].get(0).and_then(toml::Value::as_str),
        Some("../packaging/door.toml"),
        "{assets:?}"
    );
}

#[test]
fn a_bad_value_exits_78_naming_the_key_and_the_value() {
    let file = TempFile::new("bad-value", "[group.link]\nrate = -1.0\n");
    let out = check_config(&file);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(78), "{stderr}");
    assert!(stderr.contains("group.link.rate = -1"), "{stderr}");
    assert!(out.stdout.is_empty(), "nothing printed on stdout");
}

#[test]
fn an_unknown_key_exits_78_naming_it() {
    let file = TempFile::new("bad-key", "listen = [\"127.0.0.1:1\"]\nupstrem = \"x\"\n");
    let out = check_config(&file);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(78), "{stderr}");
    assert!(stderr.contains("upstrem"), "{stderr}");
}

/// `door` with `args` and no `DOOR_*` variables.
#[expect(clippy::unwrap_used, reason = "test helper")]
fn door(args: &[&str]) -> Output {
    door_command().args(args).output().unwrap()
}

#[test]
fn a_missing_file_exits_78_naming_its_cause_once() {
    let out = door(&["check-config", "--config", "/nonexistent/door.toml"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(78), "{stderr}");
    assert!(stderr.contains("/nonexistent/door.toml"), "{stderr}");
    assert_eq!(
        stderr.matches("No such file or directory").count(),
        1,
        "the cause once: {stderr}"
    );
}

/// A configuration path that is not a regular file is refused at once, naming it: a FIFO nothing
/// writes to (reading it would wait for a writer, holding a reload and the SIGTERM behind it) and
/// a device that never ends (`/dev/zero` once grew a reloading door by gigabytes); a file that is
/// not UTF-8 is named with the line of its first bad byte.
#[test]
fn a_configuration_that_is_not_a_regular_utf8_file_exits_78_naming_why() {
    let notes = TempFile::new("latin1", "listen = []\n# caf\u{e9}\n");
    let latin1 = notes.dir.join("latin1.toml");
    std::fs::write(&latin1, b"listen = []\n# caf\xe9\n").expect("write the file");
    let fifo = notes.dir.join("door.fifo");
    let made = Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .expect("run mkfifo");
    assert!(made.success(), "mkfifo {fifo:?}");
    for (path, why) in [
        (fifo.as_path(), "not a regular file"),
        (Path::new("/dev/zero"), "not a regular file"),
        (
            latin1.as_path(),
            "not UTF-8 (TOML is): the first bad byte is at offset 17, on line 2",
        ),
    ] {
        let out = check_config_at(path);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(78), "{}: {stderr}", path.display());
        assert!(stderr.contains(&path.display().to_string()), "{stderr}");
        assert!(stderr.contains(why), "{}: {stderr}", path.display());
    }
}

#[test]
fn a_bad_flag_value_and_an_unknown_flag_exit_78() {
    let out = door(&["check-config", "--xdp-mode", "sideways"]);
    assert_eq!(out.status.code(), Some(78), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("sideways"));
    let out = door(&["--no-such-flag"]);
    assert_eq!(out.status.code(), Some(78), "{out:?}");
}

/// clap names the flag of a value it cannot parse; a value from the environment is named by its
/// variable, which is what the operator wrote.
#[test]
fn a_bad_environment_value_exits_78_naming_the_variable() {
    for (var, value, want) in [
        (
            "DOOR_MAX_CONNECTIONS",
            "x",
            "error: invalid value 'x' for 'DOOR_MAX_CONNECTIONS': invalid digit found in string",
        ),
        (
            "DOOR_RATELIMIT_HEADERS",
            "maybe",
            "error: invalid value 'maybe' for 'DOOR_RATELIMIT_HEADERS': value was not a boolean",
        ),
        (
            "DOOR_CONFIG",
            "",
            "error: a value is required for 'DOOR_CONFIG' but none was supplied",
        ),
    ] {
        let out = door_command()
            .arg("check-config")
            .env(var, value)
            .output()
            .expect("run door");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(78), "{var}: {stderr}");
        assert_eq!(stderr.lines().next(), Some(want), "{var}: {stderr}");
    }
    // The same value given as the flag's is named by the flag.
    let out = door(&["check-config", "--max-connections", "x"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(78), "{stderr}");
    assert!(
        stderr.starts_with("error: invalid value 'x' for '--max-connections <MAX_CONNECTIONS>'"),
        "{stderr}"
    );
    // The wrapper keeps what the inner parser tells `--help`: a switch's values.
    let help = String::from_utf8_lossy(&door(&["--help"]).stdout).into_owned();
    for flag in ["--ratelimit-headers", "--disable-anon-route-limits"] {
        let entry = help.split(flag).nth(1).unwrap_or_default();
        let entry = entry.split("\n      --").next().unwrap_or_default();
        assert!(
            entry.contains("[possible values: true, false]"),
            "{flag}: {entry}"
        );
    }
}

#[test]
fn a_port_in_use_exits_1_naming_its_cause_once() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
    let addr = taken.local_addr().expect("its address").to_string();
    let out = door(&[
        "--listen",
        &addr,
        "--admin-listen",
        "off",
        "--xdp-mode",
        "off",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains(&addr), "{stderr}");
    assert_eq!(
        stderr.matches("Address already in use").count(),
        1,
        "the cause once: {stderr}"
    );
}

#[test]
fn door_key_says_which_plane_a_credential_is_charged_to_and_never_prints_it() {
    let file = TempFile::new("key-planes", "[plane.session]\ncookie = \"sid\"\n");
    let path = file.path.to_str().unwrap();
    let many = vec!["sid=a"; 17].join("; ");
    for (cookie, says) in [
        (
            "theme=dark; sid=s3cr3t-value",
            "plane: ip, key 198.51.100.7/32, while the credential (cookie sid) is not verified; \
             once the upstream answers a request carrying it with a status other than 401 or \
             403, the session plane",
        ),
        (
            "theme=dark",
            "plane: ip, key 198.51.100.7/32 (no credential: cookie sid not found)",
        ),
        ("sid=a; sid=b", "is ambiguous: 2 copies that differ"),
        (
            "sid=",
            "no credential: the cookie sid value is empty or not well-formed",
        ),
        (
            many.as_str(),
            "refused: 400, the credential (cookie sid) is sent more than 16 times",
        ),
    ] {
        let out = door(&[
            "key",
            "--config",
            path,
            "--peer",
            "198.51.100.7",
            "--cookie",
            cookie,
        ]);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert_eq!(out.status.code(), Some(0), "{cookie}: {out:?}");
        assert!(stdout.contains(says), "{cookie}: {stdout}");
        assert!(
            !stdout.contains("s3cr3t"),
            "the credential is printed: {stdout}"
        );
    }
}

#[test]
fn door_key_names_the_flag_of_a_header_line_no_header_can_carry() {
    let out = door(&["key", "--peer", "198.51.100.7", "--xff", "a\u{1}b"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(78), "{out:?}");
    assert!(
        stderr.contains("--xff \"a\\u{1}b\" is not a valid header value"),
        "{stderr}"
    );
}

/// The files the configuration names are read by `check-config` as at start: a certificate that
/// is not PEM and a path to something endless (as certificate or cluster CA file) exit 78 naming
/// the file, where start-up used to fail with 1 (or read `/dev/zero` without end). A file that
/// cannot be read here (a systemd credential exists only for the running unit) is noted, and
/// the check passes.
#[test]
fn unusable_tls_and_cluster_files_exit_78_naming_the_file() {
    let notes = TempFile::new("not-pem", "");
    let not_pem = notes.dir.join("cert.pem");
    std::fs::write(&not_pem, "not a certificate\n").expect("write the file");
    // A FIFO nothing writes to: opening it for reading used to wait for a writer, holding
    // check-config (and a running door's reload, and its SIGTERM behind it) for ever.
    let fifo = notes.dir.join("cert.fifo");
    let made = Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .expect("run mkfifo");
    assert!(made.success(), "mkfifo {fifo:?}");
    let fifo_path = fifo.display().to_string();
    for (name, text, named) in [
        (
            "tls-not-pem",
            format!(
                "listen = [\"127.0.0.1:0\"]\n[tls]\ncert = {:?}\nkey = {:?}\n",
                not_pem.display().to_string(),
                not_pem.display().to_string()
            ),
            format!("tls.cert = {not_pem:?}: no PEM CERTIFICATE block"),
        ),
        (
            "tls-endless",
            "listen = [\"127.0.0.1:0\"]\n[tls]\ncert = \"/dev/zero\"\nkey = \"/dev/zero\"\n"
                .to_owned(),
            "tls.cert = \"/dev/zero\": not a regular file".to_owned(),
        ),
        (
            "cluster-ca",
            "[cluster]\nredis = \"rediss://127.0.0.1:6380\"\nca_file = \"/dev/zero\"\n".to_owned(),
            "cluster.ca_file /dev/zero: not a regular file".to_owned(),
        ),
        (
            "tls-fifo",
            format!(
                "listen = [\"127.0.0.1:0\"]\n[tls]\ncert = {fifo_path:?}\nkey = {fifo_path:?}\n"
            ),
            format!("tls.cert = {fifo:?}: not a regular file"),
        ),
    ] {
        let file = TempFile::new(name, &text);
        let out = check_config(&file);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(78), "{name}: {stderr}");
        assert!(stderr.contains(&named), "{name}: {stderr}");
        assert!(out.stdout.is_empty(), "{name}: nothing printed on stdout");
    }
    let text = format!(
        "listen = [\"127.0.0.1:0\"]\n[tls]\ncert = {:?}\nkey = \"/run/credentials/door.service/key.pem\"\n",
        not_pem.display().to_string()
    );
    let file = TempFile::new("tls-unreadable", &text.replace("cert.pem", "missing.pem"));
    let out = check_config(&file);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(
        stderr.contains("missing.pem\": No such file or directory")
            && stderr.contains("not checked here"),
        "{stderr}"
    );
}

/// The switches take the spellings systemd units and shells use: `1`, `yes`, `on` as well as
/// `true`, from the environment or as a flag's value.
#[test]
fn switches_take_1_yes_and_on() {
    for (how, value) in [("env", "1"), ("env", "yes"), ("flag", "on"), ("env", "0")] {
        let mut cmd = door_command();
        cmd.arg("check-config");
        if how == "env" {
            cmd.env("DOOR_DISABLE_ANON_ROUTE_LIMITS", value);
        } else {
            cmd.arg(format!("--disable-anon-route-limits={value}"));
        }
        let out = cmd.output().expect("run door");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{how} {value}: {out:?}");
        let want = format!("disable_anon_route_limits = {}", value != "0");
        assert!(stdout.lines().any(|l| l == want), "{how} {value}: {stdout}");
    }
}

/// `--peer` takes a peer as `ss` or a log shows it: with a port, bracketed, with a zone, or
/// IPv4-mapped; each is keyed as door keys that peer. Anything else is refused, named.
#[test]
fn door_key_takes_the_peer_as_a_socket_address_too() {
    for (peer, key) in [
        ("198.51.100.7:443", "198.51.100.7/32"),
        ("[2001:db8:1:2::7]:443", "2001:db8:1:2::/64"),
        ("[::ffff:198.51.100.7]:80", "198.51.100.7/32"),
        ("fe80::1%eth0", "fe80::/64"),
    ] {
        let out = door(&["key", "--peer", peer]);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert_eq!(out.status.code(), Some(0), "{peer}: {out:?}");
        assert_eq!(stdout.lines().next(), Some(key), "{peer}: {stdout}");
    }
    let out = door(&["key", "--peer", "door.example:443"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(78), "{out:?}");
    assert!(
        stderr.contains("'door.example:443'") && stderr.contains("expected an IP address"),
        "{stderr}"
    );
}

/// `door check-config --config FILE` with `args` and the `DOOR_*` variables `env`.
#[expect(clippy::unwrap_used, reason = "test helper")]
fn check_config_with(file: &TempFile, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = door_command();
    cmd.arg("check-config")
        .arg("--config")
        .arg(&file.path)
        .args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().unwrap()
}

/// The printed configuration's table `[name]` (or `[[name]]`s), up to the next table.
fn printed_table<'a>(stdout: &'a str, header: &str) -> Vec<&'a str> {
    stdout
        .lines()
        .skip_while(|l| *l != header)
        .skip(1)
        .take_while(|l| !l.starts_with('['))
        .collect()
}

/// Every kind of setting outside the top level and `[tls]`, `[otlp]`, `[cluster]`: an `[xdp]`
/// key, a plane key, a group key, the routes. A variable beats the file, a flag beats the
/// variable, the file beats the default; `check-config` prints the effective value.
#[test]
fn xdp_plane_group_and_route_settings_take_flags_and_variables() {
    let file = TempFile::new(
        "every-kind",
        "[xdp]\nmode = \"off\"\nsyn_burst = 300\n\
         [plane.session]\ncookie = \"sid\"\nrate = 3.0\n\
         [group.link]\nrate = 2.5\n\
         [[route]]\ngroup = \"link\"\npath = \"/from-file\"\n",
    );
    let run = |args: &[&str], env: &[(&str, &str)]| {
        let out = check_config_with(&file, args, env);
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(out.status.success(), "{args:?} {env:?}: {out:?}");
        stdout
    };
    // The file beats the defaults.
    let stdout = run(&[], &[]);
    assert!(
        printed_table(&stdout, "[xdp]").contains(&"syn_burst = 300"),
        "{stdout}"
    );
    assert!(
        printed_table(&stdout, "[xdp]").contains(&"syn_rate = 100.0"),
        "{stdout}"
    );
    assert!(
        printed_table(&stdout, "[plane.session]").contains(&"rate = 3.0"),
        "{stdout}"
    );
    assert!(
        printed_table(&stdout, "[plane.ip]").contains(&"rate = 0.5"),
        "{stdout}"
    );
    assert!(
        printed_table(&stdout, "[group.link]").contains(&"rate = 2.5"),
        "{stdout}"
    );
    assert!(
        printed_table(&stdout, "[group.link]").contains(&"burst = 20"),
        "{stdout}"
    );
    assert!(stdout.contains("path = \"/from-file\""), "{stdout}");
    // The variables beat the file.
    let env = [
        ("DOOR_XDP_SYN_BURST", "400"),
        ("DOOR_PLANE_SESSION_RATE", "4"),
        ("DOOR_GROUP", "link.rate=2,link.burst=40"),
        (
            "DOOR_ROUTES",
            "[{ group = \"link\", methods = [\"GET\"], path = \"/l/session/{id}\" }, \
             { group = \"health\", path = \"/healthz\" }]",
        ),
    ];
    let stdout = run(&[], &env);
    assert!(
        printed_table(&stdout, "[xdp]").contains(&"syn_burst = 400"),
        "{stdout}"
    );
    assert!(
        printed_table(&stdout, "[plane.session]").contains(&"rate = 4.0"),
        "{stdout}"
    );
    let link = printed_table(&stdout, "[group.link]");
    assert!(
        link.contains(&"rate = 2.0") && link.contains(&"burst = 40"),
        "{stdout}"
    );
    assert!(
        !stdout.contains("/from-file"),
        "DOOR_ROUTES replaces the file's routes: {stdout}"
    );
    assert_eq!(stdout.matches("[[route]]").count(), 2, "{stdout}");
    assert!(stdout.contains("path = \"/l/session/{id}\""), "{stdout}");
    // The flags beat the variables.
    let stdout = run(
        &[
            "--xdp-syn-burst",
            "500",
            "--plane-session-rate",
            "5",
            "--group",
            "link.rate=3",
            "--route",
            "{ group = \"webhook\", methods = [\"POST\"], path = \"/hook\" }",
        ],
        &env,
    );
    assert!(
        printed_table(&stdout, "[xdp]").contains(&"syn_burst = 500"),
        "{stdout}"
    );
    assert!(
        printed_table(&stdout, "[plane.session]").contains(&"rate = 5.0"),
        "{stdout}"
    );
    let link = printed_table(&stdout, "[group.link]");
    // --group replaces DOOR_GROUP as a whole (clap: a flag, then its variable).
    assert!(
        link.contains(&"rate = 3.0") && link.contains(&"burst = 20"),
        "{stdout}"
    );
    assert_eq!(stdout.matches("[[route]]").count(), 1, "{stdout}");
    assert!(stdout.contains("path = \"/hook\""), "{stdout}");
    // And what it prints is what it read.
    let printed = Config::from_toml("stdout", &stdout).expect("door accepts its own output");
    assert_eq!(printed.routes.len(), 1);
}

/// A value a flag or variable cannot take exits 78 naming the flag or the variable and the value
/// (clap's parse), or the key and the value (the configuration's check).
#[test]
fn bad_xdp_plane_group_and_route_values_exit_78_naming_them() {
    let file = TempFile::new("every-kind-bad", "[xdp]\nmode = \"off\"\n");
    for (args, env, want) in [
        (
            &[][..],
            &[("DOOR_XDP_SYN_RATE", "fast")][..],
            "invalid value 'fast' for 'DOOR_XDP_SYN_RATE'",
        ),
        (
            &["--xdp-syn-rate", "fast"][..],
            &[][..],
            "invalid value 'fast' for '--xdp-syn-rate <XDP_SYN_RATE>'",
        ),
        (
            &[],
            &[("DOOR_PLANE_IP_BURST", "many")],
            "invalid value 'many' for 'DOOR_PLANE_IP_BURST'",
        ),
        (
            &[],
            &[("DOOR_GROUP", "link.rate=2,link.rte=2")],
            "invalid value 'link.rte=2' for 'DOOR_GROUP': unknown key \"rte\"",
        ),
        (
            &["--group", "link.rte=2"],
            &[],
            "invalid value 'link.rte=2' for '--group <NAME.KEY=VALUE>': unknown key \"rte\"",
        ),
        (
            &[],
            &[("DOOR_ROUTES", "{ group = \"link\", path = \"/x\" }")],
            "invalid value '{ group = \"link\", path = \"/x\" }' for 'DOOR_ROUTES': invalid type: \
             map, expected a sequence (a TOML array of route tables",
        ),
        (
            &["--route", "{ group = \"link\" }"],
            &[],
            "invalid value '{ group = \"link\" }' for '--route <TABLE>': missing field `path`",
        ),
        (
            &["--xdp-ports", "80,0"],
            &[],
            "xdp.ports[1] = 0: not a TCP port (1-65535)",
        ),
        (
            &[],
            &[("DOOR_PLANE_SESSION_RATE", "3")],
            "plane.session.rate = 3: needs plane.session.cookie",
        ),
        (&["--group", "link.burst=0"], &[], "group.link.burst = 0"),
        (
            &[
                "--route",
                "{ group = \"link\", methods = [\"G ET\"], path = \"/x\" }",
            ],
            &[],
            "route[0].methods = \"G ET\": not an HTTP method",
        ),
    ] {
        let out = check_config_with(&file, args, env);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(78), "{args:?} {env:?}: {stderr}");
        assert!(stderr.contains(want), "{args:?} {env:?}: {stderr}");
        assert!(
            out.stdout.is_empty(),
            "{args:?} {env:?}: nothing printed on stdout"
        );
    }
}

#[test]
fn help_lists_the_xdp_plane_group_and_route_flags() {
    let help = String::from_utf8_lossy(&door(&["--help"]).stdout).into_owned();
    for (flag, var) in [
        ("--xdp-syn-rate", "DOOR_XDP_SYN_RATE"),
        ("--xdp-ports", "DOOR_XDP_PORTS"),
        ("--xdp-cookie-threshold", "DOOR_XDP_COOKIE_THRESHOLD"),
        ("--plane-session-cookie", "DOOR_PLANE_SESSION_COOKIE"),
        ("--plane-session-header", "DOOR_PLANE_SESSION_HEADER"),
        ("--plane-ip-max-clients", "DOOR_PLANE_IP_MAX_CLIENTS"),
        ("--group <NAME.KEY=VALUE>", "DOOR_GROUP"),
        ("--route <TABLE>", "DOOR_ROUTES"),
    ] {
        let entry = help.split(flag).nth(1).unwrap_or_default();
        let entry = entry.split("\n      --").next().unwrap_or_default();
        assert!(entry.contains(&format!("[env: {var}=")), "{flag}: {entry}");
    }
}
