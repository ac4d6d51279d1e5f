//! door as a systemd service: readiness, watchdog and stopping over a `NOTIFY_SOCKET` this test
//! owns, and SIGHUP reloads end to end (the `door` binary on loopback, XDP off, a tiny upstream
//! in the test). Waiting is for messages door sends, each with a bounded deadline.
#![expect(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    reason = "test code: a failed step fails the test"
)]

mod ambient;

use std::{
    io::{Read as _, Write as _},
    net::{SocketAddr, TcpListener, TcpStream},
    os::unix::net::UnixDatagram,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

/// A temp directory removed on drop.
struct Dir(PathBuf);

impl Dir {
    fn new(tag: &str) -> Self {
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("door-{tag}-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The `door` process, killed on drop if still running.
struct Door(Child);

impl Drop for Door {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Door {
    /// SIGTERM, a clean exit within 20 s, and door's log (started with [`start_logging`] and
    /// `Stdio::piped()`).
    fn stop_and_read_log(&mut self) -> String {
        self.signal("-TERM");
        assert_eq!(self.wait(Duration::from_secs(20)), Some(0));
        let mut log = String::new();
        self.0
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut log)
            .unwrap();
        log
    }

    fn signal(&self, sig: &str) {
        let status = Command::new("kill")
            .args([sig, &self.0.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
    }

    /// Waits (bounded) for the process to exit; its exit code.
    fn wait(&mut self, limit: Duration) -> Option<i32> {
        #[expect(
            clippy::disallowed_methods,
            reason = "bounds a wait on another process, whose clock door's cannot drive"
        )]
        let start = Instant::now();
        while start.elapsed() < limit {
            if let Some(status) = self.0.try_wait().unwrap() {
                return status.code();
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        panic!("door did not exit within {limit:?}");
    }
}

/// A minimal HTTP/1.1 upstream answering `200 ok` to every request, for as long as the test runs.
fn upstream() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            std::thread::spawn(move || {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 1024];
                while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                    match stream.read(&mut chunk) {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                }
                let _ = stream.write_all(
                    b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok",
                );
            });
        }
    });
    addr
}

/// One GET to `127.0.0.1:port` on a fresh connection; the status code.
fn get(port: u16, path: &str, xff: Option<&str>) -> u16 {
    get_at(SocketAddr::from(([127, 0, 0, 1], port)), path, xff)
}

/// One GET to `addr` on a fresh connection; the status code.
fn get_at(addr: SocketAddr, path: &str, xff: Option<&str>) -> u16 {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let xff = xff
        .map(|x| format!("x-forwarded-for: {x}\r\n"))
        .unwrap_or_default();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nhost: door.test\r\n{xff}connection: close\r\n\r\n"
    )
    .unwrap();
    let mut response = String::new();
    let _ = s.read_to_string(&mut response);
    response
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no status line in {response:?}"))
}

/// The systemd side of `NOTIFY_SOCKET`.
struct Notify {
    socket: UnixDatagram,
    path: PathBuf,
}

impl Notify {
    fn bind(dir: &Path) -> Self {
        let path = dir.join("notify.sock");
        let socket = UnixDatagram::bind(&path).unwrap();
        socket
            .set_read_timeout(Some(Duration::from_secs(20)))
            .unwrap();
        Self { socket, path }
    }

    /// The next datagram (20 s at most).
    fn next(&self) -> String {
        let mut buf = [0u8; 4096];
        let n = self
            .socket
            .recv(&mut buf)
            .expect("a notification from door within 20 s");
        String::from_utf8_lossy(&buf[..n]).into_owned()
    }

    /// Waits for the start-up `READY=1`; the port door's listener got, from the `STATUS=` sent
    /// with it ([`serving_port`]).
    fn ready_port(&self) -> u16 {
        serving_port(self.until("READY=1").last().unwrap())
    }

    /// Waits (20 s at most) for `READY=1` or for `door` to exit, whichever comes first: whether
    /// door became ready.
    fn ready_or_exit(&self, door: &mut Door) -> bool {
        self.socket
            .set_read_timeout(Some(Duration::from_millis(100)))
            .unwrap();
        let mut buf = [0u8; 4096];
        let mut ready = false;
        for _ in 0..200 {
            match self.socket.recv(&mut buf) {
                Ok(n) => {
                    if String::from_utf8_lossy(&buf[..n])
                        .lines()
                        .any(|l| l == "READY=1")
                    {
                        ready = true;
                        break;
                    }
                }
                Err(_) if door.0.try_wait().unwrap().is_some() => break,
                Err(_) => {}
            }
        }
        self.socket
            .set_read_timeout(Some(Duration::from_secs(20)))
            .unwrap();
        ready
    }

    /// Reads datagrams until one contains `state` (at most 50), returning those before it too.
    fn until(&self, state: &str) -> Vec<String> {
        let mut seen = Vec::new();
        for _ in 0..50 {
            let msg = self.next();
            let done = msg.lines().any(|l| l == state);
            seen.push(msg);
            if done {
                return seen;
            }
        }
        panic!("no {state} in {seen:?}");
    }
}

/// The port in a `STATUS=serving on 127.0.0.1:PORT; …` notification. door listens on
/// `127.0.0.1:0` here, so no port is picked ahead and lost to another test running meanwhile.
fn serving_port(notification: &str) -> u16 {
    notification
        .lines()
        .find_map(|l| l.strip_prefix("STATUS=serving on 127.0.0.1:"))
        .and_then(|rest| rest.split(';').next())
        .and_then(|port| port.parse().ok())
        .unwrap_or_else(|| panic!("no listening address in {notification:?}"))
}

fn config(upstream: SocketAddr, link_burst: u32, trusted: &str, link_rate: &str) -> String {
    format!(
        r#"
listen = ["127.0.0.1:0"]
upstream = "http://{upstream}"
admin_listen = "off"
trusted_proxies = [{trusted}]

[[route]]
group = "link"
path = "/l/{{id}}"

[group.link]
rate = {link_rate}
burst = {link_burst}
"#
    )
}

fn start(dir: &Dir, notify: &Notify, cfg: &str, watchdog_usec: Option<u64>) -> Door {
    start_logging(dir, notify, cfg, watchdog_usec, Stdio::inherit())
}

/// [`start`] with door's log (stderr) sent to `log`.
fn start_logging(
    dir: &Dir,
    notify: &Notify,
    cfg: &str,
    watchdog_usec: Option<u64>,
    log: Stdio,
) -> Door {
    let file = dir.0.join("door.toml");
    std::fs::write(&file, cfg).unwrap();
    // Through `sh -c 'exec …'` so that, as systemd does, WATCHDOG_PID names door's own pid ($$
    // survives the exec).
    let mut cmd = Command::new("sh");
    for name in ambient::door_variables() {
        cmd.env_remove(name);
    }
    cmd.arg("-c")
        .arg(r#"WATCHDOG_PID=$$ exec "$0" --config "$1""#)
        .arg(env!("CARGO_BIN_EXE_door"))
        .arg(&file)
        .env("NOTIFY_SOCKET", &notify.path)
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stderr(log);
    if let Some(usec) = watchdog_usec {
        cmd.env("WATCHDOG_USEC", usec.to_string());
    }
    Door(cmd.spawn().unwrap())
}

#[test]
fn ready_only_once_listening_then_watchdog_reloading_and_stopping() {
    let dir = Dir::new("notify");
    let notify = Notify::bind(&dir.0);
    let mut door = start(
        &dir,
        &notify,
        &config(upstream(), 20, "", "1.0"),
        Some(200_000),
    );

    let before_ready = notify.until("READY=1");
    let ready = before_ready.last().unwrap();
    let port = serving_port(ready);
    let status = format!("STATUS=serving on 127.0.0.1:{port}; XDP off");
    assert!(ready.lines().any(|l| l == status), "{before_ready:?}");
    // READY=1 came after the listener was bound: connecting now works at once.
    assert_eq!(get(port, "/l/x", None), 200);
    // The watchdog is pinged from the serving loop (every WATCHDOG_USEC / 2).
    notify.until("WATCHDOG=1");
    notify.until("WATCHDOG=1");

    door.signal("-HUP");
    notify.until("RELOADING=1");
    let reloaded = notify.until("READY=1");
    let after = format!("{status}; reloaded");
    assert!(
        reloaded.last().unwrap().lines().any(|l| l == after),
        "{reloaded:?}"
    );

    door.signal("-TERM");
    notify.until("STOPPING=1");
    assert_eq!(door.wait(Duration::from_secs(20)), Some(0));
}

#[test]
fn the_ipv6_and_ipv4_wildcards_on_one_port_both_serve() {
    // Under Linux's default net.ipv6.bindv6only = 0, `[::]:P` claims P on the IPv4 addresses
    // too: door used to fail to bind `0.0.0.0:P` beside it and exit at start.
    let dir = Dir::new("dual");
    let notify = Notify::bind(&dir.0);
    let up = upstream();
    // The port is picked here, free on both families now (`[::]:0` claims the IPv4 port too
    // where it can); another process may take it before door binds it, so a door that exits
    // instead of becoming ready is started again on another port (door's bind error is in the
    // test's output).
    let mut started = None;
    for _ in 0..5 {
        let port = TcpListener::bind("[::]:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let cfg = format!(
            "listen = [\"[::]:{port}\", \"0.0.0.0:{port}\"]\nupstream = \"http://{up}\"\n\
             admin_listen = \"off\"\n"
        );
        let mut door = start(&dir, &notify, &cfg, None);
        if notify.ready_or_exit(&mut door) {
            started = Some((door, port));
            break;
        }
    }
    let (mut door, port) = started.expect("door serving both wildcards on one of five ports");
    let v4 = SocketAddr::from(([127, 0, 0, 1], port));
    let v6 = SocketAddr::from((std::net::Ipv6Addr::LOCALHOST, port));
    assert_eq!(get_at(v4, "/", None), 200);
    assert_eq!(get_at(v6, "/", None), 200);
    door.signal("-TERM");
    assert_eq!(door.wait(Duration::from_secs(20)), Some(0));
}

#[test]
fn reload_keeps_drained_buckets_in_proportion_and_applies_new_trusted_proxies_at_once() {
    let dir = Dir::new("reload");
    let notify = Notify::bind(&dir.0);
    let up = upstream();
    let file = dir.0.join("door.toml");
    let mut door = start(&dir, &notify, &config(up, 3, "", "0.001"), None);
    let port = notify.ready_port();
    let reload = |cfg: &str| {
        std::fs::write(&file, cfg).unwrap();
        door.signal("-HUP");
        notify.until("RELOADING=1");
        notify.until("READY=1");
    };

    for _ in 0..3 {
        assert_eq!(get(port, "/l/a", None), 200);
    }
    assert_eq!(get(port, "/l/a", None), 429, "drained");

    // A reload that leaves the link budget alone keeps its buckets: still drained.
    reload(&(config(up, 3, "", "0.001") + "\n[group.webhook]\nburst = 7\nper_client = 4\n"));
    assert_eq!(
        get(port, "/l/a", None),
        429,
        "a reload must not refill a drained bucket"
    );

    // A new trusted proxy takes effect at once: behind 127.0.0.1, the XFF client is the key.
    reload(&config(up, 3, "\"127.0.0.1/32\"", "0.001"));
    assert_eq!(get(port, "/l/a", Some("203.0.113.5")), 200);
    // ...and the proxy's own key (no XFF) is the one that was drained before.
    assert_eq!(get(port, "/l/a", None), 429);

    // An invalid configuration is refused and the running one kept.
    reload(&config(up, 3, "\"127.0.0.1/32\"", "-1.0"));
    assert_eq!(
        get(port, "/l/a", Some("203.0.113.5")),
        200,
        "still behind the trusted proxy"
    );

    // A changed burst applies to the live buckets, in proportion: the drained proxy key stays
    // drained (0 of 3 → 0 of 5); the XFF client, which spent 2 of 3, has 1⅔ of 5 left: one more.
    reload(&config(up, 5, "\"127.0.0.1/32\"", "0.001"));
    assert_eq!(
        get(port, "/l/a", None),
        429,
        "a drained client stays drained"
    );
    assert_eq!(get(port, "/l/a", Some("203.0.113.5")), 200);
    assert_eq!(get(port, "/l/a", Some("203.0.113.5")), 429);

    door.signal("-TERM");
    assert_eq!(door.wait(Duration::from_secs(20)), Some(0));
}

/// A reload to an empty file (being written, or truncated by mistake) is refused and the running
/// configuration kept. A file without routes (cut short, or whose routes were removed) is a valid
/// configuration, and lifts every limit: door applies it and says so in its log.
#[test]
fn a_reload_that_removes_every_route_is_applied_with_a_warning() {
    let dir = Dir::new("no-routes");
    let notify = Notify::bind(&dir.0);
    let up = upstream();
    let cfg = config(up, 1, "", "0.001");
    let mut door = start_logging(&dir, &notify, &cfg, None, Stdio::piped());
    let port = notify.ready_port();
    assert_eq!(get(port, "/l/a", None), 200);
    assert_eq!(get(port, "/l/a", None), 429);

    std::fs::write(dir.0.join("door.toml"), " \n\n").unwrap();
    door.signal("-HUP");
    notify.until("RELOADING=1");
    notify.until("READY=1");
    assert_eq!(
        get(port, "/l/a", None),
        429,
        "an empty file is not reloaded"
    );

    let bare =
        format!("listen = [\"127.0.0.1:0\"]\nupstream = \"http://{up}\"\nadmin_listen = \"off\"\n");
    std::fs::write(dir.0.join("door.toml"), bare).unwrap();
    door.signal("-HUP");
    notify.until("RELOADING=1");
    notify.until("READY=1");
    assert_eq!(get(port, "/l/a", None), 200, "no route: no limit");

    let log = door.stop_and_read_log();
    assert!(
        log.contains("the reloaded configuration has no routes"),
        "{log}"
    );
    assert!(
        log.contains("reload refused") && log.contains("the file is empty"),
        "{log}"
    );
}

/// What a reload says needs a restart is measured against what door runs, the configuration it
/// started with: a reload back to it needs none, and changing the setting again needs one again,
/// since door still runs the value it started with.
#[test]
fn needs_restart_is_judged_against_the_running_configuration() {
    let dir = Dir::new("needs-restart");
    let notify = Notify::bind(&dir.0);
    let up = upstream();
    let cfg = config(up, 20, "", "1.0");
    let mut door = start_logging(&dir, &notify, &cfg, None, Stdio::piped());
    let port = notify.ready_port();
    let moved = cfg.replace(&format!("http://{up}"), "http://127.0.0.1:9");
    for file in [&moved, &cfg, &moved] {
        std::fs::write(dir.0.join("door.toml"), file).unwrap();
        door.signal("-HUP");
        notify.until("RELOADING=1");
        notify.until("READY=1");
    }
    assert_eq!(
        get(port, "/l/a", None),
        200,
        "the upstream is still the one door started with"
    );
    let log = door.stop_and_read_log();
    let restarts: Vec<_> = log
        .lines()
        .filter(|l| l.contains("needs_restart"))
        .collect();
    assert_eq!(restarts.len(), 2, "{log}");
    assert!(restarts.iter().all(|l| l.contains("upstream")), "{log}");
}
