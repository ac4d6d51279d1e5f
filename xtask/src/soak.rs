//! `cargo xtask soak [--minutes N]` (root; `cargo xtask test` runs it for [`DEFAULT_MINUTES`]):
//! door under faults for a while, then proof that it leaks nothing.
//!
//! - Two network namespaces joined by a veth pair, documentation-range addresses as in
//!   `tests/src/netns.rs` (192.0.2.1 and 2001:db8:d00::1 on door's side; 192.0.2.2, 192.0.2.3
//!   and 2001:db8:c1::2 on the client's). In door's namespace: the release `door`, XDP attached in
//!   driver mode on its veth end, in front of `demo-upstream` on 127.0.0.1:3000, `/status` on
//!   127.0.0.1:9901 (read with curl inside the namespace). door's stderr goes to
//!   `target/soak/door.log`.
//! - The traffic is `soak-client` (tests/src/bin/soak-client.rs) in the client namespace:
//!   HTTP/1.1 and h2c, limited and pass-through routes, aborted heads and bodies, hang-ups while
//!   door waits for a slow answer, reset streams, slow readers, slowloris heads, heads over
//!   64 KiB.
//! - Meanwhile door gets SIGHUP every [`RELOAD_EVERY`] (two valid configurations in turn, the
//!   `link` rate differing), and the upstream is killed every [`OUTAGE_EVERY`] and started again
//!   [`OUTAGE_FOR`] later (502s are expected then, and only then).
//! - First a warm-up of [`WARMUP_SECONDS`] with the same traffic; then the baseline is measured
//!   with nothing in flight: door's VmRSS (`/proc/PID/status`) and open descriptors
//!   (`/proc/PID/fd`). Before that measurement and the final one the upstream is restarted once
//!   more, so that door's pool of idle upstream connections (kept 90 to 180 s after their last use
//!   by design, not a leak) is empty both times; a descriptor door did not close then shows up.
//! - After the traffic, a settle period (at least [`SETTLE_MIN`], polling up to [`SETTLE_MAX`]),
//!   then the checks: RSS within [`RSS_MARGIN_KIB`] of the baseline, descriptors within
//!   [`FD_MARGIN`], every group's `inflight` and `streams` at 0, no "panicked" in door's log,
//!   every well-formed request the client sent answered completely (an answer cut short only while
//!   the upstream was down), 502s only during outages, every oversized head answered 431, every
//!   slowloris head closed by door, every reload applied, XDP still attached, and a clean drain on
//!   SIGTERM (exit 0).
//!
//! Prints a progress line every [`PROGRESS_EVERY`], then a table of what was sent and what came
//! back, then the checks with their measured values and limits; fails when any check fails.

use std::{
    collections::BTreeMap,
    fmt::Write as _,
    fs,
    io::{BufRead as _, BufReader, Read, Write as _},
    path::{Path, PathBuf},
    process::{Child, Command, ExitStatus, Stdio},
    sync::{
        Arc, Mutex, PoisonError,
        mpsc::{self, Receiver, RecvTimeoutError},
    },
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use anyhow::{Context as _, bail};
use rustix::process::{Pid, Signal, kill_process};
use serde_json::Value;

use crate::{Skipped, cargo, setup, sh, step, test::SKIP_MARKER};

/// The soak's length when `--minutes` is not given (and in `cargo xtask test`).
pub(crate) const DEFAULT_MINUTES: u64 = 2;
/// The longest soak accepted.
const MAX_MINUTES: u64 = 24 * 60;
/// The warm-up before the baseline is measured: every kind of traffic, no outage, no reload.
const WARMUP_SECONDS: u64 = 10;
/// How far door's VmRSS may end above the baseline.
const RSS_MARGIN_KIB: u64 = 16 * 1024;
/// How many more descriptors door may hold at the end than at the baseline.
const FD_MARGIN: u64 = 8;
/// SIGHUP period (the first one after half of it).
const RELOAD_EVERY: Duration = Duration::from_secs(20);
/// Upstream outage period (the first one after half of it).
const OUTAGE_EVERY: Duration = Duration::from_secs(30);
/// How long each outage lasts.
const OUTAGE_FOR: Duration = Duration::from_secs(5);
/// A 502 or a cut answer this long before an outage began still belongs to it (clock reads).
const OUTAGE_LEAD: Duration = Duration::from_millis(500);
/// …and this long after the upstream listened again (door's pool reconnects, the health cache's
/// 1 s).
const OUTAGE_TAIL: Duration = Duration::from_secs(2);
/// Progress line period.
const PROGRESS_EVERY: Duration = Duration::from_secs(10);
/// The shortest settle period after the traffic stops.
const SETTLE_MIN: Duration = Duration::from_secs(3);
/// The longest settle period: the checks are taken then, whatever they show.
const SETTLE_MAX: Duration = Duration::from_secs(30);
/// door's `header_read_timeout` in the soak's configuration (its default).
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// How long after [`HEADER_READ_TIMEOUT`] a slowloris head may still be open.
const SLOWLORIS_SLACK: Duration = Duration::from_secs(5);
/// The `link` rate of the two configurations reloaded in turn.
const LINK_RATES: [f64; 2] = [5.0, 10.0];
/// The namespaces' addresses (as `tests/src/netns.rs`).
const DOOR_ADDR: &str = "192.0.2.1";
const DOOR_ADDR6: &str = "2001:db8:d00::1";
const CLIENT_ADDRS: [&str; 2] = ["192.0.2.2", "192.0.2.3"];
const CLIENT_ADDR6: &str = "2001:db8:c1::2";
/// door's veth end.
const DOOR_IF: &str = "veth-door";
/// The upstream's and the admin listener's addresses inside door's namespace.
const UPSTREAM: &str = "127.0.0.1:3000";
const ADMIN: &str = "127.0.0.1:9901";

/// What to do without root.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Unprivileged {
    /// Fail (a plain `cargo xtask soak`).
    Fail,
    /// Print the privileged suites' skip line and return [`Skipped`] (`cargo xtask test`, or
    /// `DOOR_SKIP_PRIVILEGED=1`).
    Skip,
}

impl Unprivileged {
    /// `Skip` when `DOOR_SKIP_PRIVILEGED=1`, as the privileged suites read it.
    pub(crate) fn from_env() -> Self {
        if std::env::var_os("DOOR_SKIP_PRIVILEGED").is_some_and(|v| v == "1") {
            Self::Skip
        } else {
            Self::Fail
        }
    }
}

/// Runs the soak for `minutes`.
///
/// # Errors
/// When it cannot be set up, when a check fails, or ([`Skipped`]) without root under
/// [`Unprivileged::Skip`].
pub(crate) fn run(minutes: u64, unprivileged: Unprivileged) -> anyhow::Result<()> {
    step(&format!(
        "soak test: {minutes} min of faults against door in two network namespaces (root)"
    ));
    if !(1..=MAX_MINUTES).contains(&minutes) {
        bail!("--minutes {minutes}: from 1 to {MAX_MINUTES}");
    }
    if !setup::is_root() {
        if unprivileged == Unprivileged::Skip {
            println!("{SKIP_MARKER}: xtask soak");
            return Err(Skipped("soak test: not root (netns, XDP attach)".to_owned()).into());
        }
        bail!(
            "the soak test needs root (network namespaces, XDP attach); run it as root, or set \
             DOOR_SKIP_PRIVILEGED=1 to skip it"
        );
    }
    setup::toolchain()?;
    setup::require_debian_packages(&["iproute2", "curl"])?;
    step("building door, demo-upstream and soak-client (release)");
    // door on its own, with the features it ships with (as cargo deb builds it), not unified
    // with the tests crate's.
    sh(cargo().args([
        "build",
        "--release",
        "--package",
        "door-daemon",
        "--bin",
        "door",
    ]))?;
    sh(cargo().args([
        "build",
        "--release",
        "--package",
        "door-tests",
        "--bin",
        "demo-upstream",
        "--bin",
        "soak-client",
    ]))?;
    let bins = crate::target_dir().join("release");
    let dir = crate::target_dir().join("soak");
    if dir.exists() {
        fs::remove_dir_all(&dir).with_context(|| format!("clearing {}", dir.display()))?;
    }
    fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let soak = Soak::set_up(&bins, &dir)?;
    soak.run(Duration::from_secs(minutes * 60))
}

/// The two namespaces and their veth pair; removed on drop.
#[derive(Debug)]
struct Netns {
    client: String,
    door: String,
}

impl Netns {
    fn new() -> anyhow::Result<Self> {
        let id = std::process::id();
        let ns = Self {
            client: format!("doorsoakc{id}"),
            door: format!("doorsoakd{id}"),
        };
        // A leftover of an earlier run with the same pid would make `add` fail.
        ns.remove();
        remove_stale_namespaces();
        // From here on, Drop removes whatever was created.
        ip(&["netns", "add", &ns.client])?;
        ip(&["netns", "add", &ns.door])?;
        ip(&[
            "link",
            "add",
            DOOR_IF,
            "netns",
            &ns.door,
            "type",
            "veth",
            "peer",
            "name",
            "veth-client",
            "netns",
            &ns.client,
        ])?;
        let (c, d) = (ns.client.as_str(), ns.door.as_str());
        let door4 = format!("{DOOR_ADDR}/24");
        let door6 = format!("{DOOR_ADDR6}/64");
        let client6 = format!("{CLIENT_ADDR6}/64");
        let mut steps: Vec<(&str, Vec<&str>)> = vec![
            (d, vec!["addr", "add", &door4, "dev", DOOR_IF]),
            (
                d,
                vec!["-6", "addr", "add", &door6, "dev", DOOR_IF, "nodad"],
            ),
            (d, vec!["link", "set", DOOR_IF, "up"]),
            (d, vec!["link", "set", "lo", "up"]),
            (
                d,
                vec!["-6", "route", "add", "2001:db8:c1::/64", "dev", DOOR_IF],
            ),
        ];
        let client4: Vec<String> = CLIENT_ADDRS.iter().map(|a| format!("{a}/24")).collect();
        for a in &client4 {
            steps.push((c, vec!["addr", "add", a, "dev", "veth-client"]));
        }
        steps.extend([
            (
                c,
                vec!["-6", "addr", "add", &client6, "dev", "veth-client", "nodad"],
            ),
            (c, vec!["link", "set", "veth-client", "up"]),
            (c, vec!["link", "set", "lo", "up"]),
            (
                c,
                vec![
                    "-6",
                    "route",
                    "add",
                    "2001:db8:d00::/64",
                    "dev",
                    "veth-client",
                ],
            ),
        ]);
        for (namespace, args) in steps {
            let mut all = vec!["-n", namespace];
            all.extend(args);
            ip(&all)?;
        }
        Ok(ns)
    }

    fn remove(&self) {
        // Deleting a namespace deletes the veth end inside it, and so the pair.
        for name in [&self.client, &self.door] {
            let _ = Command::new("ip")
                .args(["netns", "del", name])
                .stderr(Stdio::null())
                .status();
        }
    }

    /// A command running `program` inside namespace `ns`.
    fn command(ns: &str, program: impl AsRef<Path>) -> Command {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", ns]).arg(program.as_ref());
        cmd
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        self.remove();
    }
}

/// Deletes the namespaces of soaks whose xtask process is gone (killed before its guards ran):
/// `doorsoakc<pid>` and `doorsoakd<pid>` with no process `<pid>`.
fn remove_stale_namespaces() {
    let Ok(out) = Command::new("ip").args(["netns", "list"]).output() else {
        return;
    };
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Some(name) = line.split_whitespace().next() else {
            continue;
        };
        let pid = name
            .strip_prefix("doorsoakc")
            .or_else(|| name.strip_prefix("doorsoakd"))
            .filter(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()));
        if let Some(pid) = pid
            && !Path::new("/proc").join(pid).exists()
        {
            eprintln!(
                "    removing namespace {name}, left by an earlier soak (process {pid} is gone)"
            );
            let _ = ip(&["netns", "del", name]);
        }
    }
}

fn ip(args: &[&str]) -> anyhow::Result<()> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .context("running ip (iproute2)")?;
    if !out.status.success() {
        bail!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// A process started by the soak: its output lines go to a log file and to [`Proc::lines`].
/// Dropped while running, it gets SIGTERM, then SIGKILL after 10 s.
struct Proc {
    name: &'static str,
    child: Child,
    lines: Receiver<String>,
}

impl Proc {
    /// Starts `cmd` (inside a namespace: `ip netns exec` execs the program, so the child is the
    /// program itself), appending its stdout and stderr to `log`.
    fn spawn(name: &'static str, mut cmd: Command, log: &Path) -> anyhow::Result<Self> {
        let file = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .with_context(|| format!("opening {}", log.display()))?;
        let file = Arc::new(Mutex::new(file));
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("starting {name}"))?;
        let (tx, rx) = mpsc::channel();
        let streams: [Option<Box<dyn Read + Send>>; 2] = [
            child
                .stdout
                .take()
                .map(|s| Box::new(s) as Box<dyn Read + Send>),
            child
                .stderr
                .take()
                .map(|s| Box::new(s) as Box<dyn Read + Send>),
        ];
        for stream in streams.into_iter().flatten() {
            let (tx, file) = (tx.clone(), Arc::clone(&file));
            std::thread::spawn(move || {
                for line in BufReader::new(stream).lines().map_while(Result::ok) {
                    {
                        let mut f = file.lock().unwrap_or_else(PoisonError::into_inner);
                        let _ = writeln!(f, "{line}");
                    }
                    // Nobody listening any more is fine: the log has the line.
                    let _ = tx.send(line);
                }
            });
        }
        Ok(Self {
            name,
            child,
            lines: rx,
        })
    }

    fn pid(&self) -> Pid {
        Pid::from_child(&self.child)
    }

    fn signal(&self, sig: Signal) -> anyhow::Result<()> {
        kill_process(self.pid(), sig).with_context(|| format!("signalling {}", self.name))
    }

    /// Waits (at most `limit`) for an output line containing `needle`.
    fn wait_for(&mut self, needle: &str, limit: Duration) -> anyhow::Result<()> {
        let start = Instant::now();
        while let Some(left) = limit.checked_sub(start.elapsed()) {
            match self.lines.recv_timeout(left) {
                Ok(line) if line.contains(needle) => return Ok(()),
                Ok(_) => {}
                Err(RecvTimeoutError::Timeout) => break,
                Err(RecvTimeoutError::Disconnected) => {
                    bail!("{} exited before saying {needle:?}", self.name)
                }
            }
        }
        bail!("{} did not say {needle:?} within {limit:?}", self.name)
    }

    fn exited(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// SIGTERM, then at most `grace` for it to exit (SIGKILL after): its exit status, `None` when
    /// it had to be killed.
    fn stop(&mut self, grace: Duration) -> Option<ExitStatus> {
        if let Some(status) = self.exited() {
            return Some(status);
        }
        let _ = self.signal(Signal::TERM);
        let start = Instant::now();
        while start.elapsed() < grace {
            if let Some(status) = self.exited() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.kill();
        None
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.stop(Duration::from_secs(10));
    }
}

/// Milliseconds since the Unix epoch: the time base `soak-client` stamps its events with.
fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// door's footprint at one moment.
#[derive(Debug, Clone, Default)]
struct Sample {
    rss_kib: u64,
    fds: u64,
    /// The descriptors by kind (`12 client ESTABLISHED, 2 listen, …`).
    fd_kinds: String,
}

/// VmRSS and the descriptors of process `pid`.
fn sample(pid: Pid) -> anyhow::Result<Sample> {
    let pid = pid.as_raw_nonzero().get();
    let status = fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("reading /proc/{pid}/status"))?;
    let rss_kib = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .context("no VmRSS in /proc/PID/status")?;
    let tcp = tcp_sockets(pid);
    let mut kinds: BTreeMap<String, u64> = BTreeMap::new();
    let mut fds = 0;
    for entry in fs::read_dir(format!("/proc/{pid}/fd"))?.flatten() {
        fds += 1;
        let target = fs::read_link(entry.path())
            .map(|t| t.to_string_lossy().into_owned())
            .unwrap_or_default();
        *kinds.entry(fd_kind(&target, &tcp)).or_default() += 1;
    }
    let mut fd_kinds = String::new();
    for (kind, n) in &kinds {
        if !fd_kinds.is_empty() {
            fd_kinds.push_str(", ");
        }
        let _ = write!(fd_kinds, "{n} {kind}");
    }
    Ok(Sample {
        rss_kib,
        fds,
        fd_kinds,
    })
}

/// door's TCP sockets by inode: what each is (listener, client or upstream connection) and its
/// state, from `/proc/PID/net/tcp{,6}` (the process's namespace).
fn tcp_sockets(pid: i32) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for table in ["tcp", "tcp6"] {
        let Ok(text) = fs::read_to_string(format!("/proc/{pid}/net/{table}")) else {
            continue;
        };
        for line in text.lines().skip(1) {
            let cols: Vec<&str> = line.split_whitespace().collect();
            let (Some(local), Some(remote), Some(state), Some(inode)) =
                (cols.get(1), cols.get(2), cols.get(3), cols.get(9))
            else {
                continue;
            };
            let port = |a: &str| {
                a.rsplit(':')
                    .next()
                    .and_then(|p| u16::from_str_radix(p, 16).ok())
            };
            let state = match *state {
                "01" => "ESTABLISHED",
                "02" => "SYN_SENT",
                "03" => "SYN_RECV",
                "04" => "FIN_WAIT1",
                "05" => "FIN_WAIT2",
                "06" => "TIME_WAIT",
                "07" => "CLOSE",
                "08" => "CLOSE_WAIT",
                "09" => "LAST_ACK",
                "0A" => "LISTEN",
                "0B" => "CLOSING",
                _ => "?",
            };
            let what = match (port(local), port(remote)) {
                _ if state == "LISTEN" => "listen".to_owned(),
                (Some(8443), _) => format!("client {state}"),
                (_, Some(3000)) => format!("upstream {state}"),
                (Some(9901), _) => format!("admin {state}"),
                _ => format!("tcp {state}"),
            };
            out.insert((*inode).to_owned(), what);
        }
    }
    out
}

fn fd_kind(target: &str, tcp: &BTreeMap<String, String>) -> String {
    if let Some(inode) = target
        .strip_prefix("socket:[")
        .and_then(|s| s.strip_suffix(']'))
    {
        return tcp
            .get(inode)
            .cloned()
            .unwrap_or_else(|| "socket (netlink, unix)".to_owned());
    }
    if let Some(anon) = target.strip_prefix("anon_inode:") {
        return anon.trim_matches(['[', ']']).to_owned();
    }
    if target.starts_with("pipe:") {
        return "pipe".to_owned();
    }
    "file".to_owned()
}

/// Milliseconds as seconds with one decimal (`10.2`).
fn secs(ms: u64) -> String {
    format!("{}.{}", ms / 1000, (ms % 1000) / 100)
}

fn mib(kib: u64) -> String {
    format!("{}.{} MiB", kib / 1024, (kib % 1024) * 10 / 1024)
}

/// door's configuration for the soak; `link_rate` is what the two reloaded variants differ in.
fn door_config(link_rate: f64) -> String {
    format!(
        r#"# cargo xtask soak: door in the server namespace (link rate {link_rate})
listen = ["{DOOR_ADDR}:8443", "[{DOOR_ADDR6}]:8443"]
upstream = "http://{UPSTREAM}"
admin_listen = "{ADMIN}"
drain_grace = "2s"

[[route]]
group = "webhook"
methods = ["POST"]
path = "/webhooks/github"
[[route]]
group = "link"
methods = ["GET"]
path = "/l/session/{{id}}"
[[route]]
group = "health"
path = "/healthz"
# Everything else (/echo-body, /slow, /stream, /events, /pass/...) passes through.

[group.webhook]
charge = "on_failure"

# A group cap below 3 clients x per_client, so that 503s show up too; the slow readers' answers
# are cut after read_timeout.
[group.link]
rate = {link_rate:.1}
burst = 40
per_client = 3
inflight = 6
read_timeout = "5s"

[xdp]
interface = "{DOOR_IF}"
mode = "driver"
ports = [8443]
syn_rate = 1000.0
syn_burst = 2000
"#
    )
}

/// door's `/status`, read with curl inside its namespace.
fn status(ns: &str) -> anyhow::Result<Value> {
    let out = Netns::command(ns, "curl")
        .args(["-s", "--max-time", "5", &format!("http://{ADMIN}/status")])
        .stdin(Stdio::null())
        .output()
        .context("running curl")?;
    if !out.status.success() {
        bail!("curl /status: {}", out.status);
    }
    serde_json::from_slice(&out.stdout).context("/status is not JSON")
}

/// Every group's `inflight` and `streams`: `(name, inflight, streams)`.
fn group_slots(st: &Value) -> Vec<(String, u64, u64)> {
    st.get("groups")
        .and_then(Value::as_array)
        .map(|groups| {
            groups
                .iter()
                .map(|g| {
                    (
                        g.get("name")
                            .and_then(Value::as_str)
                            .unwrap_or("?")
                            .to_owned(),
                        g.get("inflight").and_then(Value::as_u64).unwrap_or(0),
                        g.get("streams").and_then(Value::as_u64).unwrap_or(0),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

/// An upstream outage, in Unix ms: killed at `from`, listening again at `to`.
#[derive(Debug, Clone, Copy)]
struct Outage {
    from: u64,
    to: u64,
}

/// The running soak: namespaces, door, the upstream, and what happened.
struct Soak {
    dir: PathBuf,
    bins: PathBuf,
    config: PathBuf,
    // Dropped in reverse: the processes before the namespaces they run in.
    netns: Netns,
    upstream: Option<Proc>,
    door: Option<Proc>,
    outages: Vec<Outage>,
    reloads: u64,
    failures: Vec<String>,
}

impl Drop for Soak {
    fn drop(&mut self) {
        // The processes first, then (by field drop) the namespaces.
        self.door = None;
        self.upstream = None;
    }
}

impl Soak {
    fn set_up(bins: &Path, dir: &Path) -> anyhow::Result<Self> {
        step("network namespaces, the upstream, door (XDP in driver mode on the veth)");
        let netns = Netns::new()?;
        eprintln!(
            "    namespaces {} (client: {}, {}) and {} (door: {DOOR_ADDR}, {DOOR_ADDR6})",
            netns.client,
            CLIENT_ADDRS.join(", "),
            CLIENT_ADDR6,
            netns.door
        );
        // Both configurations the reloads alternate between must be valid.
        let config = dir.join("door.toml");
        for rate in LINK_RATES.iter().rev() {
            fs::write(&config, door_config(*rate))?;
            let out = Command::new(bins.join("door"))
                .arg("check-config")
                .arg("--config")
                .arg(&config)
                .output()
                .context("running door check-config")?;
            if !out.status.success() {
                bail!(
                    "door check-config refused the soak's configuration (link rate {rate}): {}",
                    String::from_utf8_lossy(&out.stderr).trim()
                );
            }
        }
        let mut soak = Self {
            dir: dir.to_owned(),
            bins: bins.to_owned(),
            config,
            netns,
            upstream: None,
            door: None,
            outages: Vec::new(),
            reloads: 0,
            failures: Vec::new(),
        };
        soak.start_upstream()?;
        let mut cmd = Netns::command(&soak.netns.door, bins.join("door"));
        cmd.arg("--config").arg(&soak.config);
        let mut door = Proc::spawn("door", cmd, &dir.join("door.log"))?;
        door.wait_for("admin status", Duration::from_secs(30))
            .with_context(|| {
                format!("door did not start; see {}", dir.join("door.log").display())
            })?;
        let comm = fs::read_to_string(format!("/proc/{}/comm", door.pid().as_raw_nonzero()))
            .unwrap_or_default();
        if comm.trim() != "door" {
            bail!("the process started is {comm:?}, not door: cannot measure it");
        }
        soak.door = Some(door);
        let st = status(&soak.netns.door)?;
        let mode = st.pointer("/xdp/mode").and_then(Value::as_str);
        if mode != Some("driver") {
            bail!(
                "XDP is not attached in driver mode: {}",
                st.get("xdp").unwrap_or(&Value::Null)
            );
        }
        eprintln!(
            "    door pid {} serving {DOOR_ADDR}:8443 and [{DOOR_ADDR6}]:8443, XDP driver mode on {DOOR_IF}; log {}",
            soak.door_pid()?.as_raw_nonzero(),
            dir.join("door.log").display()
        );
        Ok(soak)
    }

    fn door_pid(&self) -> anyhow::Result<Pid> {
        self.door
            .as_ref()
            .map(Proc::pid)
            .context("door is not running")
    }

    fn start_upstream(&mut self) -> anyhow::Result<()> {
        let mut cmd = Netns::command(&self.netns.door, self.bins.join("demo-upstream"));
        cmd.args(["--listen", UPSTREAM]);
        let mut up = Proc::spawn("demo-upstream", cmd, &self.dir.join("upstream.log"))?;
        up.wait_for("listening", Duration::from_secs(10))?;
        self.upstream = Some(up);
        Ok(())
    }

    fn kill_upstream(&mut self) {
        if let Some(mut up) = self.upstream.take() {
            // SIGKILL: the upstream dies as a crashed application does, mid-answer.
            up.kill();
        }
    }

    /// Kills and restarts the upstream: door's idle pooled connections to it close.
    fn flush_upstream_pool(&mut self) -> anyhow::Result<()> {
        self.kill_upstream();
        self.start_upstream()
    }

    fn reload(&mut self) -> anyhow::Result<()> {
        self.reloads += 1;
        let rate = LINK_RATES
            .get(usize::try_from(self.reloads % 2).unwrap_or(0))
            .copied()
            .unwrap_or(LINK_RATES[0]);
        let tmp = self.config.with_extension("toml.new");
        fs::write(&tmp, door_config(rate))?;
        fs::rename(&tmp, &self.config)?;
        self.door
            .as_ref()
            .context("door is not running")?
            .signal(Signal::HUP)
    }

    fn current_link_rate(&self) -> f64 {
        LINK_RATES
            .get(usize::try_from(self.reloads % 2).unwrap_or(0))
            .copied()
            .unwrap_or(LINK_RATES[0])
    }

    /// Starts `soak-client` for `seconds` in the client namespace.
    fn client(&self, seconds: u64, log: &str) -> anyhow::Result<Proc> {
        let mut cmd = Netns::command(&self.netns.client, self.bins.join("soak-client"));
        cmd.args([
            "--door",
            &format!("{DOOR_ADDR}:8443"),
            "--door6",
            &format!("[{DOOR_ADDR6}]:8443"),
            "--sources",
            &format!("{},{CLIENT_ADDR6}", CLIENT_ADDRS.join(",")),
            "--seconds",
            &seconds.to_string(),
        ]);
        Proc::spawn("soak-client", cmd, &self.dir.join(log))
    }

    /// Waits for the client's report line, bounded by `limit`, calling `tick` with its latest
    /// progress line every 100 ms meanwhile.
    fn await_report(
        &mut self,
        client: &mut Proc,
        limit: Duration,
        mut tick: impl FnMut(&mut Self, Option<&Value>) -> anyhow::Result<()>,
    ) -> anyhow::Result<Value> {
        let start = Instant::now();
        let mut last_progress: Option<Value> = None;
        loop {
            if start.elapsed() > limit {
                bail!("soak-client did not report within {limit:?}");
            }
            match client.lines.recv_timeout(Duration::from_millis(100)) {
                Ok(line) => {
                    if let Some(json) = line.strip_prefix("soak-client: report ") {
                        return serde_json::from_str(json).context("soak-client's report");
                    }
                    if let Some(json) = line.strip_prefix("soak-client: progress ") {
                        last_progress = serde_json::from_str(json).ok();
                    }
                }
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => {
                    bail!(
                        "soak-client exited without a report ({:?}); see {}",
                        client.exited(),
                        self.dir.join("client.log").display()
                    )
                }
            }
            tick(self, last_progress.as_ref())?;
        }
    }

    /// Waits at least [`SETTLE_MIN`] and until nothing is in flight and door is back within its
    /// margins of `baseline` (when given), at most [`SETTLE_MAX`]; returns the last sample and
    /// status (an empty sample and `null` when door or its `/status` did not answer: the checks
    /// then fail and say so).
    fn settle(&self, baseline: Option<&Sample>) -> (Sample, Value, Duration) {
        let start = Instant::now();
        std::thread::sleep(SETTLE_MIN);
        loop {
            let st = status(&self.netns.door).unwrap_or(Value::Null);
            let s = self.door_pid().and_then(sample).unwrap_or_default();
            let idle = !st.is_null() && group_slots(&st).iter().all(|(_, i, s)| *i == 0 && *s == 0);
            let back = baseline.is_none_or(|b| {
                s.rss_kib <= b.rss_kib + RSS_MARGIN_KIB && s.fds <= b.fds + FD_MARGIN
            });
            if (idle && back) || start.elapsed() >= SETTLE_MAX {
                return (s, st, start.elapsed());
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    fn run(mut self, length: Duration) -> anyhow::Result<()> {
        let baseline = self.warm_up()?;
        let report = self.traffic(length)?;
        self.judge(length, &baseline, &report)
    }

    /// The warm-up: the same traffic, no faults of door's surroundings; then the baseline.
    fn warm_up(&mut self) -> anyhow::Result<Sample> {
        step(&format!(
            "warm-up: {WARMUP_SECONDS} s of the same traffic, then the baseline with nothing in flight"
        ));
        let mut warm = self.client(WARMUP_SECONDS, "warmup.log")?;
        let warm_report = self.await_report(
            &mut warm,
            Duration::from_secs(WARMUP_SECONDS + 90),
            |_, _| Ok(()),
        )?;
        drop(warm);
        let (warm_sent, _) = totals(&warm_report);
        self.flush_upstream_pool()?;
        let (baseline, st, settled) = self.settle(None);
        if st.is_null() || baseline.fds == 0 {
            bail!("door did not answer /status or could not be measured after the warm-up");
        }
        eprintln!(
            "    warm-up: {warm_sent} requests; baseline after {:.1} s: RSS {}, {} fds ({})",
            settled.as_secs_f64(),
            mib(baseline.rss_kib),
            baseline.fds,
            baseline.fd_kinds
        );
        Ok(baseline)
    }

    /// The soak's traffic, with reloads and outages meanwhile: the client's report.
    fn traffic(&mut self, length: Duration) -> anyhow::Result<Value> {
        step(&format!(
            "soak: {} s of traffic; SIGHUP every {} s, upstream killed every {} s for {} s",
            length.as_secs(),
            RELOAD_EVERY.as_secs(),
            OUTAGE_EVERY.as_secs(),
            OUTAGE_FOR.as_secs()
        ));
        let mut client = self.client(length.as_secs(), "client.log")?;
        let start = Instant::now();
        let mut next_reload = RELOAD_EVERY / 2;
        let mut next_outage = OUTAGE_EVERY / 2;
        let mut next_progress = PROGRESS_EVERY;
        let mut restart_at: Option<(Instant, u64)> = None;
        let report = self.await_report(
            &mut client,
            length + Duration::from_secs(90),
            |soak, progress| {
                let t = start.elapsed();
                if let Some(door) = soak.door.as_mut()
                    && let Some(exit) = door.exited()
                {
                    soak.failures
                        .push(format!("door exited during the soak ({exit})"));
                    soak.door = None;
                }
                if t >= next_reload && t + Duration::from_secs(1) < length {
                    next_reload += RELOAD_EVERY;
                    if soak.door.is_some() {
                        soak.reload()?;
                    }
                }
                if restart_at.is_none() && t >= next_outage && t + OUTAGE_FOR + OUTAGE_TAIL < length
                {
                    next_outage += OUTAGE_EVERY;
                    let from = unix_ms();
                    soak.kill_upstream();
                    restart_at = Some((Instant::now() + OUTAGE_FOR, from));
                }
                if let Some((at, from)) = restart_at
                    && Instant::now() >= at
                {
                    restart_at = None;
                    soak.start_upstream()?;
                    soak.outages.push(Outage {
                        from,
                        to: unix_ms(),
                    });
                }
                if t >= next_progress {
                    next_progress += PROGRESS_EVERY;
                    soak.progress(t, length, progress);
                }
                Ok(())
            },
        )?;
        if let Some((_, from)) = restart_at {
            self.start_upstream()?;
            self.outages.push(Outage {
                from,
                to: unix_ms(),
            });
        }
        drop(client);
        fs::write(self.dir.join("report.json"), format!("{report:#}\n"))?;
        Ok(report)
    }

    /// Settles, measures, stops door, prints the table and the checks.
    fn judge(&mut self, length: Duration, baseline: &Sample, report: &Value) -> anyhow::Result<()> {
        step(
            "settling: the upstream restarted once more (door's idle pool empties), nothing in flight",
        );
        self.flush_upstream_pool()?;
        let (end, st, settled) = if self.door.is_some() {
            self.settle(Some(baseline))
        } else {
            (Sample::default(), Value::Null, Duration::ZERO)
        };
        eprintln!(
            "    after {:.1} s: RSS {}, {} fds ({})",
            settled.as_secs_f64(),
            mib(end.rss_kib),
            end.fds,
            end.fd_kinds
        );
        let log_path = self.dir.join("door.log");
        // door's drain on SIGTERM is part of the proof: it must exit 0, in time.
        let drained = match self.door.as_mut().map(|d| d.stop(Duration::from_secs(15))) {
            Some(Some(status)) => Drain::Exited(status),
            Some(None) => Drain::Killed,
            None => Drain::NotRunning,
        };
        self.door = None;
        let log = fs::read_to_string(&log_path).unwrap_or_default();
        let verdict = Verdict {
            report,
            outages: &self.outages,
            baseline,
            end: &end,
            status: &st,
            log: &log,
            reloads: self.reloads,
            link_rate: self.current_link_rate(),
            drained,
        };
        let mut failed = verdict.print();
        failed.append(&mut self.failures);
        if failed.is_empty() {
            println!(
                "soak: every check passed ({} s of traffic)",
                length.as_secs()
            );
            return Ok(());
        }
        for f in &failed {
            println!("soak: FAILED: {f}");
        }
        println!(
            "soak: logs and the client's report in {}",
            self.dir.display()
        );
        let tail: Vec<&str> = log.lines().rev().take(20).collect();
        if !tail.is_empty() {
            println!("soak: the end of door's log:");
            for line in tail.iter().rev() {
                println!("    | {line}");
            }
        }
        bail!("soak: {} check(s) failed", failed.len())
    }

    fn progress(&self, t: Duration, length: Duration, client: Option<&Value>) {
        let n = |k: &str| client.and_then(|c| c.get(k)?.as_u64()).unwrap_or(0);
        let door = self
            .door
            .as_ref()
            .and_then(|d| sample(d.pid()).ok())
            .map_or_else(
                || "door not running".to_owned(),
                |s| format!("door RSS {}, {} fds", mib(s.rss_kib), s.fds),
            );
        let inflight: u64 = status(&self.netns.door)
            .map_or(0, |st| group_slots(&st).iter().map(|(_, i, _)| i).sum());
        eprintln!(
            "    [{:>4} s / {} s] requests {} sent, {} answered, {} aborted | {door}, {inflight} in flight | reloads {}, outages {}{}",
            t.as_secs(),
            length.as_secs(),
            n("sent"),
            n("answered"),
            n("aborted"),
            self.reloads,
            self.outages.len(),
            if self.upstream.is_none() {
                " (upstream down)"
            } else {
                ""
            }
        );
    }
}

/// The sum of `sent` and of the answers over every kind of the report.
fn totals(report: &Value) -> (u64, u64) {
    let mut sent = 0;
    let mut answered = 0;
    if let Some(kinds) = report.get("kinds").and_then(Value::as_object) {
        for k in kinds.values() {
            sent += k.get("sent").and_then(Value::as_u64).unwrap_or(0);
            answered += k
                .get("statuses")
                .and_then(Value::as_object)
                .map_or(0, |s| s.values().filter_map(Value::as_u64).sum());
        }
    }
    (sent, answered)
}

/// One kind's row of the table.
#[derive(Debug, Default, Clone)]
struct Row {
    sent: u64,
    answered: u64,
    ok: u64,
    client_error: u64,
    too_many: u64,
    too_large: u64,
    unavailable: u64,
    bad_gateway_outage: u64,
    bad_gateway_other: u64,
    other_5xx: u64,
    cut_outage: u64,
    cut_other: u64,
    lost: u64,
    mismatch: u64,
    aborted: u64,
    connect_failed: u64,
}

impl Row {
    fn add(&mut self, o: &Self) {
        self.sent += o.sent;
        self.answered += o.answered;
        self.ok += o.ok;
        self.client_error += o.client_error;
        self.too_many += o.too_many;
        self.too_large += o.too_large;
        self.unavailable += o.unavailable;
        self.bad_gateway_outage += o.bad_gateway_outage;
        self.bad_gateway_other += o.bad_gateway_other;
        self.other_5xx += o.other_5xx;
        self.cut_outage += o.cut_outage;
        self.cut_other += o.cut_other;
        self.lost += o.lost;
        self.mismatch += o.mismatch;
        self.aborted += o.aborted;
        self.connect_failed += o.connect_failed;
    }
}

/// What the checks read.
struct Verdict<'a> {
    report: &'a Value,
    outages: &'a [Outage],
    baseline: &'a Sample,
    end: &'a Sample,
    status: &'a Value,
    log: &'a str,
    reloads: u64,
    link_rate: f64,
    drained: Drain,
}

/// One check: what, the measured value, the limit, whether it passed.
type Check = (String, String, String, bool);

/// How door ended when sent SIGTERM at the end.
#[derive(Debug, Clone, Copy)]
enum Drain {
    Exited(ExitStatus),
    /// Still running after the grace period: killed.
    Killed,
    /// It had exited during the soak already.
    NotRunning,
}

impl Verdict<'_> {
    fn in_outage(&self, t: u64) -> bool {
        let lead = u64::try_from(OUTAGE_LEAD.as_millis()).unwrap_or(0);
        let tail = u64::try_from(OUTAGE_TAIL.as_millis()).unwrap_or(0);
        self.outages
            .iter()
            .any(|o| t + lead >= o.from && t <= o.to + tail)
    }

    /// The table's rows, and the events that no outage explains.
    fn rows(&self) -> (BTreeMap<String, Row>, Vec<String>) {
        let mut rows: BTreeMap<String, Row> = BTreeMap::new();
        let num = |v: &Value, k: &str| v.get(k).and_then(Value::as_u64).unwrap_or(0);
        if let Some(kinds) = self.report.get("kinds").and_then(Value::as_object) {
            for (name, k) in kinds {
                let row = rows.entry(name.clone()).or_default();
                row.sent = num(k, "sent");
                row.lost = num(k, "lost");
                row.mismatch = num(k, "mismatch");
                row.aborted = num(k, "aborted");
                row.connect_failed = num(k, "connect_failed");
                for (code, n) in k
                    .get("statuses")
                    .and_then(Value::as_object)
                    .into_iter()
                    .flatten()
                {
                    let n = n.as_u64().unwrap_or(0);
                    row.answered += n;
                    match code.parse::<u16>().unwrap_or(0) {
                        200..=299 => row.ok += n,
                        429 => row.too_many += n,
                        431 => row.too_large += n,
                        400..=499 => row.client_error += n,
                        503 => row.unavailable += n,
                        502 => {}
                        _ => row.other_5xx += n,
                    }
                }
            }
        }
        let mut unexplained = Vec::new();
        for e in self
            .report
            .get("events")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let (Some(t), Some(kind), Some(what)) = (
                e.get(0).and_then(Value::as_u64),
                e.get(1).and_then(Value::as_str),
                e.get(2).and_then(Value::as_str),
            ) else {
                continue;
            };
            let outage = self.in_outage(t);
            let row = rows.entry(kind.to_owned()).or_default();
            if what == "502" {
                if outage {
                    row.bad_gateway_outage += 1;
                } else {
                    row.bad_gateway_other += 1;
                    unexplained.push(format!("{kind}: 502 with the upstream up"));
                }
            } else if what.starts_with("cut") {
                if outage {
                    row.cut_outage += 1;
                } else {
                    row.cut_other += 1;
                    unexplained.push(format!("{kind}: {what}"));
                }
            } else if what.starts_with("lost") || what.starts_with("mismatch") {
                unexplained.push(format!("{kind}: {what}"));
            }
        }
        (rows, unexplained)
    }

    /// Prints the table and the checks; returns the failed checks.
    fn print(&self) -> Vec<String> {
        let (rows, unexplained) = self.rows();
        let total = self.print_table(&rows);
        let checks = self.checks(&rows, &total);
        println!();
        println!("soak: checks");
        println!("{:<52} {:<56} {:<26} result", "check", "measured", "limit");
        let mut failed = Vec::new();
        for (name, measured, limit, ok) in &checks {
            println!(
                "{name:<52} {measured:<56} {limit:<26} {}",
                if *ok { "ok" } else { "FAILED" }
            );
            if !ok {
                failed.push(format!("{name}: {measured} (limit: {limit})"));
            }
        }
        println!(
            "(fds at the baseline: {}; at the end: {})",
            self.baseline.fd_kinds, self.end.fd_kinds
        );
        if !unexplained.is_empty() {
            println!("soak: the first events no outage explains:");
            for u in unexplained.iter().take(20) {
                println!("    {u}");
            }
        }
        failed
    }

    fn reload_counts(&self) -> (u64, u64) {
        let count = |needle: &str| u64::try_from(self.log.matches(needle).count()).unwrap_or(0);
        (count("configuration reloaded"), count("reload refused"))
    }

    /// Prints the table of what was sent and what came back; returns its total row.
    fn print_table(&self, rows: &BTreeMap<String, Row>) -> Row {
        println!();
        println!("soak: what was sent and what came back");
        let header = [
            "kind", "sent", "answered", "2xx", "4xx", "429", "431", "503", "502 out", "502 up",
            "5xx", "cut out", "cut up", "lost", "wrong", "aborted",
        ];
        let mut line = format!("{:<20}", header.first().copied().unwrap_or_default());
        for h in header.iter().skip(1) {
            let _ = write!(line, " {h:>8}");
        }
        println!("{line}");
        let mut total = Row::default();
        let print_row = |name: &str, r: &Row| {
            let mut line = format!("{name:<20}");
            for v in [
                r.sent,
                r.answered,
                r.ok,
                r.client_error,
                r.too_many,
                r.too_large,
                r.unavailable,
                r.bad_gateway_outage,
                r.bad_gateway_other,
                r.other_5xx,
                r.cut_outage,
                r.cut_other,
                r.lost,
                r.mismatch,
                r.aborted,
            ] {
                let _ = write!(line, " {v:>8}");
            }
            println!("{line}");
        };
        for (name, r) in rows {
            print_row(name, r);
            total.add(r);
        }
        print_row("total", &total);
        println!(
            "sent: well-formed requests sent whole; answered: answers read to their end (by status \
             class: 2xx, 4xx other than 429 and 431, ...); 502 out / cut out: while the upstream \
             was down ({} ms before an outage to {} ms after it); 502 up / cut up: with it up; \
             wrong: a complete 2xx whose content is not what the upstream sent; aborted: broken \
             off by the client on purpose",
            OUTAGE_LEAD.as_millis(),
            OUTAGE_TAIL.as_millis()
        );
        let mut downs = String::new();
        for o in self.outages {
            let _ = write!(downs, " {} s", secs(o.to.saturating_sub(o.from)));
        }
        let (applied, refused) = self.reload_counts();
        println!(
            "reloads (SIGHUP; link rate {} and {} in turn): {} sent, {applied} applied, {refused} \
             refused. Upstream outages: {} (down{downs}).",
            LINK_RATES[0],
            LINK_RATES[1],
            self.reloads,
            self.outages.len(),
        );
        let kind = |k: &str, field: &str| {
            self.report
                .pointer(&format!("/kinds/{k}/{field}"))
                .and_then(Value::as_u64)
                .unwrap_or(0)
        };
        let sum = |field: &str| -> u64 {
            self.report
                .get("kinds")
                .and_then(Value::as_object)
                .map_or(0, |ks| {
                    ks.values().filter_map(|k| k.get(field)?.as_u64()).sum()
                })
        };
        println!(
            "slow readers: {} over HTTP/1.1, {} over HTTP/2 ({} of those cut by door: a limited \
             answer's read_timeout). Slowloris heads: {}, closed by door {}. Requests hyper never \
             sent (connection gone first): {}. Connections that failed: {}.",
            kind("h1 slow reader", "aborted"),
            kind("h2 slow reader", "aborted"),
            kind("h2 slow reader", "closed_by_door"),
            kind("h1 slowloris", "aborted"),
            kind("h1 slowloris", "closed_by_door"),
            sum("not_sent"),
            total.connect_failed,
        );
        total
    }

    /// Every check.
    fn checks(&self, rows: &BTreeMap<String, Row>, total: &Row) -> Vec<Check> {
        let mut checks = self.footprint_checks();
        checks.extend(self.answer_checks(rows, total));
        checks.extend(self.control_checks());
        checks
    }

    /// door's memory, descriptors, slots and log.
    fn footprint_checks(&self) -> Vec<Check> {
        let mut checks = Vec::new();
        let b = self.baseline;
        let e = self.end;
        checks.push((
            "door RSS (VmRSS) back to baseline".to_owned(),
            format!("{} (baseline {})", mib(e.rss_kib), mib(b.rss_kib)),
            format!("<= baseline + {}", mib(RSS_MARGIN_KIB)),
            e.rss_kib > 0 && e.rss_kib <= b.rss_kib + RSS_MARGIN_KIB,
        ));
        checks.push((
            "door open fds back to baseline".to_owned(),
            format!("{} (baseline {})", e.fds, b.fds),
            format!("<= baseline + {FD_MARGIN}"),
            e.fds > 0 && e.fds <= b.fds + FD_MARGIN,
        ));
        let slots = group_slots(self.status);
        let slots_text = slots
            .iter()
            .map(|(g, i, s)| format!("{g} {i}/{s}"))
            .collect::<Vec<_>>()
            .join(", ");
        checks.push((
            "every group's inflight/streams at 0".to_owned(),
            if slots.is_empty() {
                "no /status".to_owned()
            } else {
                slots_text
            },
            "0/0 each".to_owned(),
            !slots.is_empty() && slots.iter().all(|(_, i, s)| *i == 0 && *s == 0),
        ));
        let panics = self.log.matches("panicked").count();
        checks.push((
            "no \"panicked\" in door's log".to_owned(),
            format!("{panics} line(s)"),
            "0".to_owned(),
            panics == 0,
        ));
        checks
    }

    /// What the client got back.
    fn answer_checks(&self, rows: &BTreeMap<String, Row>, total: &Row) -> Vec<Check> {
        let mut checks = Vec::new();
        let explained_cuts = total.cut_outage;
        let complete = total.answered;
        let dropped = self
            .report
            .get("events_dropped")
            .and_then(Value::as_u64)
            .unwrap_or(0);
        checks.push((
            "every request sent whole answered whole".to_owned(),
            format!(
                "{} = {complete} + {explained_cuts} cut in outages; {} lost, {} cut, {} wrong",
                total.sent, total.lost, total.cut_other, total.mismatch
            ),
            "sent = answered + cut in outages".to_owned(),
            total.sent > 0
                && total.sent == complete + explained_cuts
                && total.lost == 0
                && total.cut_other == 0
                && total.mismatch == 0
                && dropped == 0,
        ));
        checks.push((
            "502s only while the upstream was down".to_owned(),
            format!(
                "{} during outages, {} with it up",
                total.bad_gateway_outage, total.bad_gateway_other
            ),
            "0 with it up".to_owned(),
            total.bad_gateway_other == 0,
        ));
        checks.push((
            "no other 5xx (504, 500)".to_owned(),
            format!("{}", total.other_5xx),
            "0".to_owned(),
            total.other_5xx == 0,
        ));
        let oversized: Row = rows.iter().filter(|(k, _)| k.contains("oversized")).fold(
            Row::default(),
            |mut acc, (_, r)| {
                acc.add(r);
                acc
            },
        );
        checks.push((
            "every head over 64 KiB answered 431".to_owned(),
            format!("{} of {} sent", oversized.too_large, oversized.sent),
            "all".to_owned(),
            oversized.sent > 0 && oversized.too_large == oversized.sent,
        ));
        let loris = self.report.pointer("/kinds/h1 slowloris");
        let loris_n = |k: &str| loris.and_then(|l| l.get(k)?.as_u64()).unwrap_or(0);
        let bound = HEADER_READ_TIMEOUT + SLOWLORIS_SLACK;
        checks.push((
            "slowloris heads closed by door".to_owned(),
            format!(
                "{} of {}, the slowest after {} s",
                loris_n("closed_by_door"),
                loris_n("aborted"),
                secs(loris_n("max_close_ms"))
            ),
            format!("all, within {} s", bound.as_secs()),
            loris_n("aborted") > 0
                && loris_n("not_closed") == 0
                && loris_n("closed_by_door") == loris_n("aborted")
                && u128::from(loris_n("max_close_ms")) <= bound.as_millis(),
        ));
        checks
    }

    /// Reloads, the shield and the drain.
    fn control_checks(&self) -> Vec<Check> {
        let (applied, refused) = self.reload_counts();
        let mut checks = Vec::new();
        let rate = self
            .status
            .get("groups")
            .and_then(Value::as_array)
            .and_then(|g| {
                g.iter()
                    .find(|g| g.get("name").and_then(Value::as_str) == Some("link"))
            })
            .and_then(|g| g.get("rate_per_s")?.as_f64());
        checks.push((
            "every SIGHUP reloaded (log), the last rate in force".to_owned(),
            format!(
                "{applied} of {} applied, {refused} refused; link rate {}",
                self.reloads,
                rate.map_or_else(|| "?".to_owned(), |r| r.to_string())
            ),
            format!("all, rate {}", self.link_rate),
            self.reloads > 0
                && applied == self.reloads
                && refused == 0
                && rate.is_some_and(|r| (r - self.link_rate).abs() < 1e-9),
        ));
        let xdp = self.status.pointer("/xdp/mode").and_then(Value::as_str);
        let syns = self
            .status
            .pointer("/xdp/counters/pass~1syn")
            .and_then(Value::as_u64)
            .unwrap_or(0);
        checks.push((
            "XDP still attached, counting SYNs".to_owned(),
            format!("mode {}, {syns} SYNs passed", xdp.unwrap_or("none")),
            "driver, > 0".to_owned(),
            xdp == Some("driver") && syns > 0,
        ));
        let drained = match self.drained {
            Drain::Exited(s) => (format!("exited: {s}"), s.success()),
            Drain::Killed => ("still running after 15 s: killed".to_owned(), false),
            Drain::NotRunning => ("not running".to_owned(), false),
        };
        checks.push((
            "door drains on SIGTERM and exits 0".to_owned(),
            drained.0,
            "exit 0 within 15 s".to_owned(),
            drained.1,
        ));
        let unfinished = self
            .report
            .get("unfinished_tasks")
            .and_then(Value::as_u64)
            .unwrap_or(0);
        checks.push((
            "every client task finished in time".to_owned(),
            format!("{unfinished} unfinished"),
            "0".to_owned(),
            unfinished == 0,
        ));

        checks
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use serde_json::json;

    use super::{Drain, Outage, Sample, Verdict, fd_kind, mib, secs};

    fn verdict<'a>(report: &'a serde_json::Value, outages: &'a [Outage]) -> Verdict<'a> {
        static SAMPLE: Sample = Sample {
            rss_kib: 0,
            fds: 0,
            fd_kinds: String::new(),
        };
        static NULL: serde_json::Value = serde_json::Value::Null;
        Verdict {
            report,
            outages,
            baseline: &SAMPLE,
            end: &SAMPLE,
            status: &NULL,
            log: "",
            reloads: 0,
            link_rate: 0.0,
            drained: Drain::NotRunning,
        }
    }

    #[test]
    fn an_outage_covers_its_lead_and_tail() {
        let outages = [Outage {
            from: 10_000,
            to: 15_000,
        }];
        let report = json!({});
        let v = verdict(&report, &outages);
        assert!(!v.in_outage(9_499));
        assert!(v.in_outage(9_500));
        assert!(v.in_outage(12_000));
        assert!(v.in_outage(17_000));
        assert!(!v.in_outage(17_001));
    }

    #[test]
    fn events_are_set_against_the_outages() {
        let outages = [Outage {
            from: 10_000,
            to: 15_000,
        }];
        let report = json!({
            "kinds": {
                "h1 link": {"sent": 5, "statuses": {"200": 1, "429": 1, "502": 2}, "cut": 1},
                "h2 echo": {"sent": 2, "statuses": {"200": 1}, "lost": 1},
            },
            "events": [
                [11_000, "h1 link", "502"],
                [30_000, "h1 link", "502"],
                [12_000, "h1 link", "cut: 200 OK: error reading a body"],
                [31_000, "h2 echo", "lost: connection reset"],
            ],
        });
        let v = verdict(&report, &outages);
        let (rows, unexplained) = v.rows();
        let link = rows.get("h1 link").unwrap();
        assert_eq!(
            (link.sent, link.answered, link.ok, link.too_many),
            (5, 4, 1, 1)
        );
        assert_eq!((link.bad_gateway_outage, link.bad_gateway_other), (1, 1));
        assert_eq!((link.cut_outage, link.cut_other), (1, 0));
        assert_eq!(rows.get("h2 echo").unwrap().lost, 1);
        assert_eq!(
            unexplained,
            [
                "h1 link: 502 with the upstream up",
                "h2 echo: lost: connection reset"
            ]
        );
    }

    #[test]
    fn descriptors_are_named_by_kind() {
        let tcp = BTreeMap::from([("42".to_owned(), "client ESTABLISHED".to_owned())]);
        assert_eq!(fd_kind("socket:[42]", &tcp), "client ESTABLISHED");
        assert_eq!(fd_kind("socket:[7]", &tcp), "socket (netlink, unix)");
        assert_eq!(fd_kind("anon_inode:[eventpoll]", &tcp), "eventpoll");
        assert_eq!(fd_kind("anon_inode:bpf-map", &tcp), "bpf-map");
        assert_eq!(fd_kind("pipe:[123]", &tcp), "pipe");
        assert_eq!(fd_kind("/dev/null", &tcp), "file");
    }

    #[test]
    fn sizes_and_times_print_with_one_decimal() {
        assert_eq!(mib(16 * 1024), "16.0 MiB");
        assert_eq!(mib(14_438), "14.0 MiB");
        assert_eq!(secs(10_002), "10.0");
        assert_eq!(secs(5_950), "5.9");
    }
}
