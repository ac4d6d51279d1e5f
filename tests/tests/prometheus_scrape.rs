//! A real Prometheus (Debian's `prometheus` package) scrapes door's `GET /metrics`: door and the
//! demo upstream on loopback, a Prometheus with a 1 s scrape interval pointed at door's admin
//! listener, some traffic, then Prometheus's HTTP API (`/api/v1/query`) returns
//! `door_requests_total` series with the counts of what happened; and `promtool check
//! metrics` accepts door's exposition as it is.
//!
//! Every process binds port 0 and the test reads the address it got from its log, so no port is
//! picked ahead and lost to another test running at the same time.
//!
//! Needs the `prometheus` package (`prometheus` and `promtool`), which `cargo xtask setup`
//! installs as root; without them and without root, the test skips itself (`door-test: skipped`).
//! Every process is a child killed on drop, and its temporary directory removed.
#![expect(
    clippy::unwrap_used,
    clippy::panic,
    reason = "test helpers: a failed step fails the test"
)]
#![expect(
    clippy::indexing_slicing,
    reason = "serde_json's Index answers Null for a missing key; the chunk slice is length-checked"
)]

use std::{
    io::{Read as _, Write as _},
    net::{SocketAddr, TcpStream},
    path::PathBuf,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use door_tests::{netns::door_bin, test_environment, tools_or_skip};

/// How long a started process gets to answer, and Prometheus to show the series.
const READY: Duration = Duration::from_mins(1);

/// Children killed (and reaped) on drop, and a temporary directory removed.
struct Run {
    dir: PathBuf,
    children: Vec<(String, Child)>,
}

impl Run {
    fn new() -> Self {
        let dir = std::env::temp_dir().join(format!("door-prometheus-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Self {
            dir,
            children: Vec::new(),
        }
    }

    fn write(&self, name: &str, text: &str) -> PathBuf {
        let path = self.dir.join(name);
        std::fs::write(&path, text).unwrap();
        path
    }

    /// Starts `program` with `args`, its output in `DIR/NAME.log`, logging at `info` (which is
    /// where the listening addresses are), and none of the caller's `DOOR_*` settings.
    fn spawn(&mut self, name: &str, program: &std::path::Path, args: &[&str]) {
        let log = std::fs::File::create(self.dir.join(format!("{name}.log"))).unwrap();
        let child = test_environment(&mut Command::new(program))
            .args(args)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", program.display()));
        self.children.push((name.to_owned(), child));
    }

    /// The address child `name` logged it listens on: the first complete line (one a newline
    /// ends: a line still being written could end inside the address) holding `marker`, the word
    /// in it that starts with `key` (an optional `http://` after `key` is skipped). Waits at most
    /// [`READY`]; fails at once, with the log, if the child has exited.
    fn logged_address(&mut self, name: &str, marker: &str, key: &str) -> SocketAddr {
        wait_for(&format!("{name} to log its address"), || {
            let log = self.log(name);
            let complete = log.rsplit_once('\n').map_or("", |(done, _)| done);
            let found = complete
                .lines()
                .filter(|l| l.contains(marker))
                .flat_map(str::split_whitespace)
                .find_map(|w| w.strip_prefix(key))
                .map(|a| a.trim_start_matches("http://").parse::<SocketAddr>());
            if let Some(addr) = found {
                return Some(addr.unwrap_or_else(|e| panic!("{name}: {e} in its log:\n{log}")));
            }
            self.fail_if_exited(name, "before listening");
            None
        })
    }

    /// Fails the test, with child `name`'s log, if it has exited.
    fn fail_if_exited(&mut self, name: &str, when: &str) {
        let (_, child) = self.children.iter_mut().find(|(n, _)| n == name).unwrap();
        if let Some(status) = child.try_wait().unwrap() {
            panic!("{name} exited ({status}) {when}:\n{}", self.log(name));
        }
    }

    /// The log of child `name`, for failure messages.
    fn log(&self, name: &str) -> String {
        std::fs::read_to_string(self.dir.join(format!("{name}.log"))).unwrap_or_default()
    }
}

impl Drop for Run {
    fn drop(&mut self) {
        for (_, child) in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// One HTTP/1.1 GET on a fresh connection: status and body; `None` when nothing answers.
fn get(addr: SocketAddr, target: &str) -> Option<(u16, String)> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    write!(
        s,
        "GET {target} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut out = Vec::new();
    s.read_to_end(&mut out).ok()?;
    let text = String::from_utf8_lossy(&out).into_owned();
    let status = text.split(' ').nth(1)?.parse().ok()?;
    let (_, body) = text.split_once("\r\n\r\n")?;
    // Prometheus's API answers chunked; the JSON is what matters here, so strip chunk sizes.
    let body = if text
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(body)
    } else {
        body.to_owned()
    };
    Some((status, body))
}

fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let Ok(n) = usize::from_str_radix(size.trim(), 16) else {
            break;
        };
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        body = rest[n..].trim_start_matches("\r\n");
    }
    out
}

/// Waits until `f` returns `Some`, at most [`READY`].
fn wait_for<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let start = Instant::now();
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(start.elapsed() < READY, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Starts the demo upstream and door (link: burst 3 and one token per 1000 s, so the 4th request
/// is refused; health) on loopback; returns door's and its admin listener's addresses.
fn start_door(run: &mut Run) -> (SocketAddr, SocketAddr) {
    run.spawn(
        "upstream",
        &PathBuf::from(env!("CARGO_BIN_EXE_demo-upstream")),
        &["--listen", "127.0.0.1:0"],
    );
    let upstream = run.logged_address("upstream", "demo upstream listening on", "http://");
    let config = run.write(
        "door.toml",
        &format!(
            r#"
listen = ["127.0.0.1:0"]
upstream = "http://{upstream}"
admin_listen = "127.0.0.1:0"
[xdp]
mode = "off"
[[route]]
group = "link"
methods = ["GET"]
path = "/l/session/{{id}}"
[[route]]
group = "health"
path = "/healthz"
[group.link]
rate = 0.001
burst = 3
"#
        ),
    );
    run.spawn(
        "door",
        &door_bin().unwrap(),
        &["--config", config.to_str().unwrap()],
    );
    let door = run.logged_address("door", "listening (", "addr=");
    let admin = run.logged_address("door", "admin status", "at=");
    wait_for("door's admin listener", || get(admin, "/status"));
    wait_for("the upstream", || get(upstream, "/healthz"));
    (door, admin)
}

/// `promtool check metrics` on `exposition`: no complaint, exit 0.
fn promtool_accepts(exposition: &str) {
    let mut promtool = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    promtool
        .stdin
        .take()
        .unwrap()
        .write_all(exposition.as_bytes())
        .unwrap();
    let checked = promtool.wait_with_output().unwrap();
    assert!(
        checked.status.success() && checked.stdout.is_empty() && checked.stderr.is_empty(),
        "promtool check metrics: {}\n{}{}\n--- exposition:\n{exposition}",
        checked.status,
        String::from_utf8_lossy(&checked.stdout),
        String::from_utf8_lossy(&checked.stderr)
    );
}

/// Starts Prometheus on loopback, scraping `admin` every second; returns its address.
fn start_prometheus(run: &mut Run, admin: SocketAddr) -> SocketAddr {
    let config = run.write(
        "prometheus.yml",
        &format!(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n\
             scrape_configs:\n  - job_name: door\n    static_configs:\n      - targets: [\"{admin}\"]\n"
        ),
    );
    let data = run.dir.join("data");
    run.spawn(
        "prometheus",
        std::path::Path::new("prometheus"),
        &[
            &format!("--config.file={}", config.display()),
            &format!("--storage.tsdb.path={}", data.display()),
            "--web.listen-address=127.0.0.1:0",
        ],
    );
    // The exporter toolkit's line names the bound address; the line before it says `:0`.
    let prometheus = run.logged_address("prometheus", "msg=\"Listening on\"", "address=");
    wait_for("Prometheus to be ready", || {
        run.fail_if_exited("prometheus", "before it was ready");
        get(prometheus, "/-/ready").filter(|(s, _)| *s == 200)
    });
    prometheus
}

/// The `door_requests_total` series Prometheus returns, once those of link/ok, link/rate_limited
/// and health/ok are all there.
fn requests_series(prometheus: SocketAddr) -> Vec<serde_json::Value> {
    wait_for("door_requests_total in Prometheus", || {
        let (status, body) = get(prometheus, "/api/v1/query?query=door_requests_total")?;
        if status != 200 {
            return None;
        }
        let v: serde_json::Value = serde_json::from_str(&body).ok()?;
        let result = v["data"]["result"].as_array()?.clone();
        let has = |group: &str, outcome: &str| {
            result.iter().any(|r| {
                r["metric"]["door_group"] == group && r["metric"]["door_outcome"] == outcome
            })
        };
        (has("link", "ok") && has("link", "rate_limited") && has("health", "ok")).then_some(result)
    })
}

#[test]
fn prometheus_scrapes_door_and_promtool_accepts_its_exposition() {
    if !tools_or_skip("prometheus_scrape", &["prometheus", "promtool"]) {
        return;
    }
    let mut run = Run::new();
    let (door, admin) = start_door(&mut run);
    // A request that gets no answer fails the test with door's log.
    let answer = |addr: SocketAddr, target: &str| {
        get(addr, target)
            .unwrap_or_else(|| panic!("no answer to {target} at {addr}:\n{}", run.log("door")))
    };
    let mut statuses = Vec::new();
    for _ in 0..5 {
        statuses.push(answer(door, "/l/session/abc").0);
    }
    assert_eq!(statuses, [200, 200, 200, 429, 429], "{}", run.log("door"));
    assert_eq!(answer(door, "/l/session/x?status=404").0, 429);
    assert_eq!(answer(door, "/healthz").0, 200);

    let (status, exposition) = answer(admin, "/metrics");
    assert_eq!(status, 200, "{exposition}");
    promtool_accepts(&exposition);

    let prometheus = start_prometheus(&mut run, admin);
    for r in &requests_series(prometheus) {
        let m = &r["metric"];
        assert_eq!(m["job"], "door", "{r}");
        assert_eq!(m["instance"], admin.to_string(), "{r}");
        for l in m.as_object().unwrap().keys() {
            assert!(
                ["__name__", "job", "instance", "door_group", "door_outcome"].contains(&l.as_str()),
                "unexpected label {l} in {r}"
            );
        }
        let link = m["door_group"] == "link";
        if link && m["door_outcome"] == "ok" {
            assert_eq!(r["value"][1], "3", "{r}");
        }
        if link && m["door_outcome"] == "rate_limited" {
            assert_eq!(r["value"][1], "3", "{r}");
        }
    }
    // The scrape itself is healthy.
    let (_, targets) = get(prometheus, "/api/v1/targets").unwrap();
    assert!(targets.contains("\"health\":\"up\""), "{targets}");
}
