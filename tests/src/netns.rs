//! Network namespaces for end-to-end runs: a client namespace and a door namespace joined by a
//! veth pair, with addresses from the documentation ranges (RFC 5737, RFC 3849). Everything is
//! removed on drop, also when the test fails; names are unique per process and per topology.

use std::{
    io::{BufRead, BufReader},
    path::{Path, PathBuf},
    process::{Child, Command, Output, Stdio},
    sync::{
        atomic::{AtomicU32, Ordering},
        mpsc,
    },
    time::{Duration, Instant},
};

use rustix::{
    process::{Pid, Signal, kill_process},
    thread::{LinkNameSpaceType, UnshareFlags, move_into_link_name_space, unshare_unsafe},
};

static NEXT: AtomicU32 = AtomicU32::new(0);

/// The door side's address on the veth.
pub const DOOR_ADDR: &str = "192.0.2.1";
/// The first client's address.
pub const CLIENT_ADDR: &str = "192.0.2.2";
/// A second client address on the same link (another /32).
pub const CLIENT2_ADDR: &str = "192.0.2.3";
/// The door side's IPv6 address.
pub const DOOR_ADDR6: &str = "2001:db8:d00::1";
/// The client's IPv6 address.
pub const CLIENT_ADDR6: &str = "2001:db8:c1::2";

/// What a namespace helper failed at: the step it was taking, and why.
#[derive(Debug, thiserror::Error)]
pub enum NetnsError {
    /// A file, a process or a system call failed: `what` says which step.
    #[error("{what}")]
    Io {
        /// The step (`running ip (iproute2)`, `opening /run/netns/NS`, …).
        what: String,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
    /// A program ran but failed, or did not report what was expected: `what` says which, with
    /// its output.
    #[error("{what}")]
    Failed {
        /// The program, its arguments and what it printed.
        what: String,
    },
}

/// The result of a namespace helper.
pub type Result<T> = std::result::Result<T, NetnsError>;

/// An I/O error of the step `what`.
fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> NetnsError {
    let what = what.into();
    move |source| NetnsError::Io { what, source }
}

/// A failure described by `what`.
fn failed(what: impl Into<String>) -> NetnsError {
    NetnsError::Failed { what: what.into() }
}

/// Runs `ip` with `args`, failing with its stderr.
///
/// # Errors
/// When `ip` cannot be run or exits non-zero.
pub fn ip(args: &[&str]) -> Result<()> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(io("running ip (iproute2)"))?;
    if !out.status.success() {
        return Err(failed(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(())
}

/// A client namespace and a door namespace joined by a veth pair.
#[derive(Debug)]
pub struct Topology {
    /// The client's namespace.
    pub client_ns: String,
    /// door's namespace.
    pub door_ns: String,
    /// The veth end inside door's namespace (where XDP attaches).
    pub door_if: String,
    children: Vec<Child>,
}

impl Topology {
    /// Creates both namespaces, the veth pair, addresses (IPv4 /24 and IPv6 with routes), and
    /// brings every link (and each namespace's loopback) up.
    ///
    /// # Errors
    /// When any `ip` command fails (not root, no veth support).
    pub fn new() -> Result<Self> {
        let id = format!(
            "{}x{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        let topo = Self {
            client_ns: format!("doorc{id}"),
            door_ns: format!("doord{id}"),
            door_if: "veth-door".to_owned(),
            children: Vec::new(),
        };
        // From here on, Drop removes whatever was created.
        ip(&["netns", "add", &topo.client_ns])?;
        ip(&["netns", "add", &topo.door_ns])?;
        ip(&[
            "link",
            "add",
            "veth-door",
            "netns",
            &topo.door_ns,
            "type",
            "veth",
            "peer",
            "name",
            "veth-client",
            "netns",
            &topo.client_ns,
        ])?;
        let (c, d) = (topo.client_ns.as_str(), topo.door_ns.as_str());
        for (ns, cmd) in [
            (d, vec!["addr", "add", "192.0.2.1/24", "dev", "veth-door"]),
            (
                d,
                vec![
                    "-6",
                    "addr",
                    "add",
                    "2001:db8:d00::1/64",
                    "dev",
                    "veth-door",
                    "nodad",
                ],
            ),
            (d, vec!["link", "set", "veth-door", "up"]),
            (d, vec!["link", "set", "lo", "up"]),
            (
                d,
                vec!["-6", "route", "add", "2001:db8:c1::/64", "dev", "veth-door"],
            ),
            (c, vec!["addr", "add", "192.0.2.2/24", "dev", "veth-client"]),
            (c, vec!["addr", "add", "192.0.2.3/24", "dev", "veth-client"]),
            (
                c,
                vec![
                    "-6",
                    "addr",
                    "add",
                    "2001:db8:c1::2/64",
                    "dev",
                    "veth-client",
                    "nodad",
                ],
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
        ] {
            let mut args = vec!["-n", ns];
            args.extend(cmd);
            ip(&args)?;
        }
        Ok(topo)
    }

    /// A command that runs `program` inside `ns`.
    pub fn command(ns: &str, program: impl AsRef<Path>) -> Command {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", ns]).arg(program.as_ref());
        cmd
    }

    /// Runs `program args` in `ns` to completion, with a 30 s bound.
    ///
    /// # Errors
    /// When it cannot be started or runs longer than 30 s.
    pub fn run(ns: &str, program: &str, args: &[&str]) -> Result<Output> {
        let child = Self::command(ns, program)
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(io(format!("running {program} in {ns}")))?;
        wait_bounded(child, Duration::from_secs(30)).map_err(|e| match e {
            NetnsError::Io { what, source } => NetnsError::Io {
                what: format!("{program} {}: {what}", args.join(" ")),
                source,
            },
            NetnsError::Failed { what } => failed(format!("{program} {}: {what}", args.join(" "))),
        })
    }

    /// Starts `program args` in `ns`, kept until the topology drops, and waits (at most
    /// `deadline`) for a line of its stdout or stderr containing `ready`. The program logs at
    /// `RUST_LOG=info` (where door says it listens) and sees none of the caller's `DOOR_*`
    /// settings, whatever the caller's environment holds.
    ///
    /// # Errors
    /// When it cannot start, exits, or does not print `ready` in time (its output is included).
    pub fn spawn_until(
        &mut self,
        ns: &str,
        program: &Path,
        args: &[&str],
        ready: &str,
        deadline: Duration,
    ) -> Result<()> {
        let mut child = crate::test_environment(&mut Self::command(ns, program))
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(io(format!("starting {}", program.display())))?;
        let (tx, rx) = mpsc::channel::<String>();
        for stream in [
            child
                .stdout
                .take()
                .map(|s| Box::new(s) as Box<dyn std::io::Read + Send>),
            child
                .stderr
                .take()
                .map(|s| Box::new(s) as Box<dyn std::io::Read + Send>),
        ]
        .into_iter()
        .flatten()
        {
            let tx = tx.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stream)
                    .lines()
                    .map_while(std::result::Result::ok)
                {
                    eprintln!("    | {line}");
                    if tx.send(line).is_err() {
                        // Nobody listens any more; keep draining so the child never blocks.
                    }
                }
            });
        }
        self.children.push(child);
        let start = Instant::now();
        let mut seen = Vec::new();
        while let Some(left) = deadline.checked_sub(start.elapsed()) {
            match rx.recv_timeout(left) {
                Ok(line) if line.contains(ready) => return Ok(()),
                Ok(line) => seen.push(line),
                Err(mpsc::RecvTimeoutError::Timeout) => break,
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    return Err(failed(format!(
                        "{} exited before printing {ready:?}:\n{}",
                        program.display(),
                        seen.join("\n")
                    )));
                }
            }
        }
        Err(failed(format!(
            "{} did not print {ready:?} within {deadline:?}:\n{}",
            program.display(),
            seen.join("\n")
        )))
    }

    /// Sends SIGTERM to every started process and waits (bounded) for them.
    pub fn stop_all(&mut self) {
        for child in &mut self.children {
            // A child that is already gone is what this wants: the error is of no use.
            let _ = kill_process(Pid::from_child(child), Signal::TERM);
        }
        let start = Instant::now();
        for child in &mut self.children {
            while start.elapsed() < Duration::from_secs(15) {
                if let Ok(Some(_)) = child.try_wait() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        self.children.clear();
    }
}

impl Drop for Topology {
    fn drop(&mut self) {
        self.stop_all();
        // Deleting a namespace deletes the veth end inside it, and so the pair.
        let _ = ip(&["netns", "del", &self.client_ns]);
        let _ = ip(&["netns", "del", &self.door_ns]);
    }
}

/// Waits for `child` at most `limit`, killing it after that.
///
/// # Errors
/// When it had to be killed, or waiting failed.
pub fn wait_bounded(mut child: Child, limit: Duration) -> Result<Output> {
    let start = Instant::now();
    loop {
        if child.try_wait().map_err(io("waiting"))?.is_some() {
            return child.wait_with_output().map_err(io("reading its output"));
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            return Err(failed(format!("timed out after {limit:?}")));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The `door` binary of this build: `$DOOR_BIN`, or `door` next to the test executable's
/// `deps/` directory (`target/<profile>/door`, built by `cargo test --workspace`).
///
/// # Errors
/// When neither exists.
pub fn door_bin() -> Result<PathBuf> {
    if let Some(p) = std::env::var_os("DOOR_BIN") {
        return Ok(PathBuf::from(p));
    }
    sibling_bin("door")
}

/// A binary of this workspace's build: `target/<profile>/<name>`, next to the running executable
/// (or to the `deps/` directory a test executable runs from; `cargo test --workspace` builds every
/// binary).
///
/// # Errors
/// When it does not exist.
pub fn sibling_bin(name: &str) -> Result<PathBuf> {
    let exe = std::env::current_exe().map_err(io("locating the running executable"))?;
    let mut dir = exe
        .parent()
        .ok_or_else(|| failed(format!("{} has no parent directory", exe.display())))?;
    // Test executables live in target/<profile>/deps; binaries in target/<profile>.
    if dir.file_name().is_some_and(|n| n == "deps") {
        dir = dir
            .parent()
            .ok_or_else(|| failed(format!("{} has no parent directory", dir.display())))?;
    }
    let candidate = dir.join(name);
    if !candidate.exists() {
        return Err(failed(format!(
            "{} not found: build the workspace's binaries first (cargo build --workspace)",
            candidate.display()
        )));
    }
    Ok(candidate)
}

/// One HTTP request with curl from namespace `ns`, bound to `source`, on a fresh connection:
/// (status code, response head and body). `args` are curl arguments (URL, `-X`, …).
///
/// # Errors
/// When curl cannot be run or runs longer than 30 s.
pub fn curl(ns: &str, source: &str, args: &[&str]) -> Result<(u16, String)> {
    let mut all = vec![
        "-s",
        "-i",
        "--max-time",
        "10",
        "--interface",
        source,
        "-w",
        "\n%{http_code}",
    ];
    all.extend_from_slice(args);
    let out = Topology::run(ns, "curl", &all)?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", "0"));
    Ok((code.trim().parse().unwrap_or(0), body.to_owned()))
}

/// Runs the future `make` returns on a thread of its own that entered the network namespace `ns`
/// (`/run/netns/NS`, as `ip netns` names it), on a current-thread tokio runtime there, so every
/// socket it opens is that namespace's; waits for it and returns its output. The thread is named
/// after the caller's (libtest names a test's thread after the test).
///
/// # Errors
/// When the thread cannot start, the namespace cannot be entered or the runtime cannot be built.
///
/// # Panics
/// When the future panics: its panic is resumed on the calling thread, so a failed assertion in
/// it fails the calling test with its own message.
pub fn block_on_in<F, Fut>(ns: &str, make: F) -> Result<Fut::Output>
where
    F: FnOnce() -> Fut + Send,
    Fut: Future,
    Fut::Output: Send,
{
    std::thread::scope(|scope| {
        let caller = std::thread::current();
        let name = format!("{} in {ns}", caller.name().unwrap_or("(unnamed)"));
        let thread = std::thread::Builder::new()
            .name(name)
            .spawn_scoped(scope, move || {
                enter_netns(ns)?;
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .map_err(io("building the client's runtime"))?;
                Ok(rt.block_on(make()))
            });
        thread
            .map_err(io("starting the namespace's thread"))?
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
    })
}

/// Moves the calling thread (only it: `unshare(CLONE_NEWNET)`) into a new network namespace of
/// its own, and sets `net.ipv4.tcp_syncookies = tcp_syncookies` there. BPF_PROG_TEST_RUN runs
/// an XDP program in the calling thread's namespace, so the program's socket lookups see the
/// listeners this thread opens afterwards.
///
/// # Errors
/// When `unshare` fails (it needs CAP_SYS_ADMIN) or the sysctl cannot be written.
pub fn enter_new_netns(tcp_syncookies: u8) -> Result<()> {
    #[expect(
        unsafe_code,
        reason = "rustix's unshare is unsafe (its safe form is deprecated)"
    )]
    // SAFETY: `unshare_unsafe` is unsafe because of CLONE_FILES (a thread with a descriptor
    // table of its own must never see descriptors from another); CLONE_NEWNET alone changes only
    // the calling thread's network namespace and leaves its descriptors as they are.
    let unshared = unsafe { unshare_unsafe(UnshareFlags::NEWNET) };
    unshared.map_err(|e| NetnsError::Io {
        what: "unshare(CLONE_NEWNET)".to_owned(),
        source: e.into(),
    })?;
    // /proc/sys/net is the calling thread's namespace's.
    std::fs::write(
        "/proc/sys/net/ipv4/tcp_syncookies",
        format!("{tcp_syncookies}\n"),
    )
    .map_err(io("setting net.ipv4.tcp_syncookies in the new namespace"))
}

/// Moves the calling thread (only it) into the network namespace `ns`.
fn enter_netns(ns: &str) -> Result<()> {
    use std::os::fd::AsFd as _;
    let path = Path::new("/run/netns").join(ns);
    let file = std::fs::File::open(&path).map_err(io(format!("opening {}", path.display())))?;
    move_into_link_name_space(file.as_fd(), Some(LinkNameSpaceType::Network)).map_err(|e| {
        NetnsError::Io {
            what: format!("setns({})", path.display()),
            source: e.into(),
        }
    })
}

/// door's `GET /status` document, fetched from inside `door_ns` on the admin port 9901.
///
/// # Errors
/// When curl fails or the answer is not JSON.
pub fn status(door_ns: &str) -> Result<serde_json::Value> {
    let out = Topology::run(
        door_ns,
        "curl",
        &["-s", "--max-time", "10", "http://127.0.0.1:9901/status"],
    )?;
    serde_json::from_slice(&out.stdout).map_err(|e| {
        failed(format!(
            "/status is not JSON ({e}): {}",
            String::from_utf8_lossy(&out.stdout)
        ))
    })
}

/// The SYN count `/status` lists for `prefix` (`192.0.2.2/32`, `2001:db8:c1::/64`) among the top
/// prefixes.
pub fn syns_of(status: &serde_json::Value, prefix: &str) -> Option<u64> {
    status
        .pointer("/xdp/top_prefixes")?
        .as_array()?
        .iter()
        .find(|p| p.get("prefix").and_then(serde_json::Value::as_str) == Some(prefix))
        .and_then(|p| p.get("syns")?.as_u64())
}

impl Topology {
    /// Starts the demo upstream on 127.0.0.1:3000 and door with the configuration `config_toml`
    /// (written to `dir`), both in the door namespace, and waits (30 s at most) until each says
    /// it is ready.
    ///
    /// # Errors
    /// When either fails to start (their output is included).
    pub fn start_door(&mut self, dir: &Path, config_toml: &str) -> Result<()> {
        let deadline = Duration::from_secs(30);
        let ns = self.door_ns.clone();
        self.spawn_until(
            &ns,
            &sibling_bin("demo-upstream")?,
            &["--listen", "127.0.0.1:3000"],
            "listening",
            deadline,
        )?;
        let path = dir.join("door.toml");
        std::fs::write(&path, config_toml).map_err(io(format!("writing {}", path.display())))?;
        let path = path
            .to_str()
            .ok_or_else(|| failed(format!("{} is not UTF-8", path.display())))?
            .to_owned();
        self.spawn_until(
            &ns,
            &door_bin()?,
            &["--config", &path],
            "admin status",
            deadline,
        )
    }
}

/// A fresh temporary directory, removed on drop.
#[derive(Debug)]
pub struct TempDir(pub PathBuf);

impl TempDir {
    /// Creates `$TMPDIR/door-<tag>-<pid>-<n>`.
    ///
    /// # Errors
    /// When it cannot be created.
    pub fn new(tag: &str) -> Result<Self> {
        let dir = std::env::temp_dir().join(format!(
            "door-{tag}-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).map_err(io(format!("creating {}", dir.display())))?;
        Ok(Self(dir))
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A SYN flood written by `syn-flood` (AF_PACKET) onto the client end of the veth, at the door
/// end's MAC, to `[2001:db8:d00::1]:8443`: `count` SYNs at most, for `max_seconds` at most, from
/// `prefixes` /64s starting at `src_prefix` (documentation range).
#[derive(Debug, Clone, Copy)]
pub struct SynFlood {
    /// First source prefix: an IPv6 /64 (`2001:db8:bad::`), flooding door's IPv6 address, or an
    /// IPv4 /32 (`198.51.100.0`), flooding [`DOOR_ADDR`]; port 8443 either way.
    pub src_prefix: &'static str,
    /// Distinct prefixes (/64s or /32s) to rotate through.
    pub prefixes: u64,
    /// SYNs to send, at most.
    pub count: u64,
    /// Seconds to send for, at most.
    pub max_seconds: u64,
}

/// The SYN count of `syn-flood`'s report (`syn-flood: sent N SYNs from … to … in …`).
pub fn syn_flood_sent(stdout: &str) -> Option<u64> {
    stdout
        .lines()
        .find_map(|l| l.trim().strip_prefix("syn-flood: sent "))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

impl Topology {
    /// Starts `flood` from the client namespace on a thread, which returns the SYNs sent and the
    /// seconds it took.
    ///
    /// # Errors
    /// When the door end's MAC cannot be read or `syn-flood` is not built; the thread's result
    /// is an error when `syn-flood` fails or does not report what it sent.
    pub fn spawn_flood(
        &self,
        flood: SynFlood,
    ) -> Result<std::thread::JoinHandle<Result<(u64, f64)>>> {
        let mac = Self::run(&self.door_ns, "cat", &["/sys/class/net/veth-door/address"])?;
        let mac = String::from_utf8_lossy(&mac.stdout).trim().to_owned();
        let syn_flood = sibling_bin("syn-flood")?;
        let client_ns = self.client_ns.clone();
        Ok(std::thread::spawn(move || {
            let start = Instant::now();
            let (prefixes, count, secs) = (
                flood.prefixes.to_string(),
                flood.count.to_string(),
                flood.max_seconds.to_string(),
            );
            let target = if flood.src_prefix.parse::<std::net::Ipv4Addr>().is_ok() {
                format!("{DOOR_ADDR}:8443")
            } else {
                format!("[{DOOR_ADDR6}]:8443")
            };
            let args = [
                "--iface",
                "veth-client",
                "--dst-mac",
                &mac,
                "--target",
                &target,
                "--src-prefix",
                flood.src_prefix,
                "--prefixes",
                &prefixes,
                "--count",
                &count,
                "--seconds",
                &secs,
            ];
            let out = Self::run(
                &client_ns,
                syn_flood
                    .to_str()
                    .ok_or_else(|| failed(format!("{} is not UTF-8", syn_flood.display())))?,
                &args,
            )?;
            let text = String::from_utf8_lossy(&out.stdout);
            let sent = syn_flood_sent(&text)
                .filter(|_| out.status.success())
                .ok_or_else(|| {
                    failed(format!(
                        "syn-flood ({}) said {text:?}, {}",
                        out.status,
                        String::from_utf8_lossy(&out.stderr)
                    ))
                })?;
            Ok((sent, start.elapsed().as_secs_f64()))
        }))
    }
}
