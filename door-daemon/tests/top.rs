//! `door top` against a door running in-process: `--once` (the binary and the library) shows the
//! key of a client that was limited, over TCP and over a Unix socket; the live view renders in a
//! pseudo-terminal (portable-pty, the screen read back with vt100) at 20x10 and 200x60 without
//! panicking, and quits on `q`. Against a hostile fake admin listener: answers over 8 MiB are
//! refused naming the limit, a body that never ends times out with its request, an error quotes
//! only the start of its body, and no control character from the API is printed.

#![expect(
    clippy::unwrap_used,
    reason = "test helpers outside #[test] functions fail loudly by design"
)]

mod ambient;
mod support;

use std::{
    io::{Read as _, Write as _},
    net::SocketAddr,
    sync::{Arc, Mutex},
    time::Duration,
};

use door_daemon::top::AdminAddr;
use http::StatusCode;
use support::{Door, config, upstream};
use tokio::{
    io::{AsyncReadExt as _, AsyncWriteExt as _},
    net::TcpListener,
};

/// A door whose link group refused 198.51.100.7 twice (burst 3, 5 requests).
async fn limited_door() -> (Door, SocketAddr) {
    let door = Door::start(&config(upstream().await, "")).await;
    let admin = door.admin().await;
    for _ in 0..5 {
        door.get("/l/session/abc", "198.51.100.7").await;
    }
    assert_eq!(
        door.get("/l/session/abc", "198.51.100.7").await,
        StatusCode::TOO_MANY_REQUESTS
    );
    (door, admin)
}

async fn door_top(args: &[&str]) -> std::process::Output {
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_door"));
    for name in ambient::door_variables() {
        cmd.env_remove(name);
    }
    cmd.arg("top").args(args).output().await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn top_once_shows_the_limited_client() {
    let (door, admin) = limited_door().await;
    let out = door_top(&["--once", "--admin", &admin.to_string()]).await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}\n{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line = stdout
        .lines()
        .find(|l| l.starts_with("198.51.100.7/32"))
        .unwrap_or_else(|| panic!("no row for the limited client:\n{stdout}"));
    let cells: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(cells, ["198.51.100.7/32", "0/3", "3", "0", "3"], "{line}");
    assert!(stdout.contains("== group link"), "{stdout}");
    assert!(stdout.contains("rate_limited"), "{stdout}");
    assert!(stdout.contains("XDP not attached"), "{stdout}");
    // The pass-through caps at their defaults, nothing held or refused.
    assert!(
        stdout.contains("pass-through: 0/4096 in flight, 0 × 503, 0 × 429"),
        "{stdout}"
    );

    // Over a Unix socket, and through the library.
    let dir = std::env::temp_dir().join(format!("door-top-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("admin.sock");
    let _file = door.admin_unix(&path);
    let unix = format!("unix:{}", path.display());
    let out = door_top(&["--once", "--admin", &unix]).await;
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("198.51.100.7/32"));
    let text = door_daemon::top::once(&AdminAddr::parse(&unix).unwrap())
        .await
        .unwrap();
    assert!(text.contains("198.51.100.7/32"), "{text}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn top_says_what_is_wrong_with_its_admin_address() {
    let out = door_top(&["--once", "--admin", "nonsense"]).await;
    assert_eq!(out.status.code(), Some(78));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--admin \"nonsense\""), "{stderr}");
    // Nothing listens there (a port bound, not listening, held until the end): exit 1, naming
    // the address.
    let held = tokio::net::TcpSocket::new_v4().unwrap();
    held.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = held.local_addr().unwrap().to_string();
    let out = door_top(&["--once", "--admin", &addr]).await;
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains(&addr), "{stderr}");
}

/// Runs `door top --admin ADMIN` in a `cols`x`rows` pseudo-terminal; once its screen shows
/// `ready`, types `keys`, waits until the screen shows every one of `expect`, then types `q`:
/// the screen, and how long after `q` it exited 0 (`None`: not within 10 s).
fn live(
    admin: &str,
    (cols, rows): (u16, u16),
    ready: &str,
    keys: &[u8],
    expect: &[&str],
) -> (String, Option<Duration>) {
    use portable_pty::{CommandBuilder, PtySize, native_pty_system};

    let pair = native_pty_system()
        .openpty(PtySize {
            rows,
            cols,
            pixel_width: 0,
            pixel_height: 0,
        })
        .unwrap();
    let mut cmd = CommandBuilder::new(env!("CARGO_BIN_EXE_door"));
    for name in ambient::door_variables() {
        cmd.env_remove(name);
    }
    cmd.args(["top", "--admin", admin]);
    cmd.env("TERM", "xterm-256color");
    let mut child = pair.slave.spawn_command(cmd).unwrap();
    drop(pair.slave);
    let mut reader = pair.master.try_clone_reader().unwrap();
    let mut writer = pair.master.take_writer().unwrap();
    let parser = Arc::new(Mutex::new(vt100::Parser::new(
        std::num::NonZeroU16::new(rows).unwrap(),
        std::num::NonZeroU16::new(cols).unwrap(),
        0,
    )));
    let for_reader = Arc::clone(&parser);
    let pump = std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n) = reader.read(&mut buf) {
            if n == 0 {
                break;
            }
            for_reader
                .lock()
                .unwrap()
                .process(buf.get(..n).unwrap_or_default());
        }
    });
    let screen = || parser.lock().unwrap().screen().contents();
    for _ in 0..200 {
        if screen().contains(ready) {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    writer.write_all(keys).unwrap();
    writer.flush().unwrap();
    let mut shown = false;
    for _ in 0..200 {
        if expect.iter().all(|e| screen().contains(e)) {
            shown = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let seen = screen();
    assert!(shown, "the screen never showed {expect:?}:\n{seen}");
    writer.write_all(b"q").unwrap();
    writer.flush().unwrap();
    let quit = door_daemon::time::now();
    let mut exited = None;
    for _ in 0..1000 {
        if let Some(status) = child.try_wait().unwrap() {
            exited = status.success().then(|| quit.elapsed());
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    if exited.is_none() {
        let _ = child.kill();
    }
    drop(writer);
    drop(pair.master);
    let _ = pump.join();
    (seen, exited)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn top_renders_in_a_small_and_a_large_terminal_and_quits_on_q() {
    let (_door, admin) = limited_door().await;
    let admin = admin.to_string();
    let (small, small_exited) = tokio::task::spawn_blocking({
        let admin = admin.clone();
        move || live(&admin, (20, 10), "door top", b"\ts", &["door top"])
    })
    .await
    .unwrap();
    assert!(
        small_exited.is_some(),
        "door top did not quit on q at 20x10:\n{small}"
    );
    let (large, large_exited) = tokio::task::spawn_blocking(move || {
        // Tab: from the first group (health) to link.
        live(
            &admin,
            (200, 60),
            "health:",
            b"\t",
            &["198.51.100.7/32", "rate_limited", " link: ", "q quit"],
        )
    })
    .await
    .unwrap();
    assert!(
        large_exited.is_some(),
        "door top did not quit on q at 200x60:\n{large}"
    );
    assert!(large.contains("0/3"), "{large}");
}

// ------------------------------------------------------------- a hostile admin listener

/// A fake admin listener on 127.0.0.1: reads each request head and writes `answer(path)` as is,
/// then holds the connection until the client goes.
async fn fake_admin(answer: impl Fn(&str) -> Vec<u8> + Send + Sync + 'static) -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let answer = Arc::new(answer);
    tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = l.accept().await else {
                return;
            };
            let answer = Arc::clone(&answer);
            tokio::spawn(async move {
                let Some(head) = support::read_head(&mut s).await else {
                    return;
                };
                let text = String::from_utf8_lossy(&head).into_owned();
                let path = text.split_whitespace().nth(1).unwrap_or("");
                let _ = s.write_all(&answer(path)).await;
                let _ = s.read(&mut [0u8; 1]).await;
            });
        }
    });
    addr
}

/// Keys are read while the admin listener is slow to answer: against one that never does (each
/// request waits for its 3 s timeout), `q` quits at once. Before, the view waited on each fetch,
/// so a key was read only between two of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn top_quits_at_once_while_the_admin_listener_hangs() {
    let admin = fake_admin(|_| Vec::new()).await.to_string();
    let (screen, exited) =
        tokio::task::spawn_blocking(move || live(&admin, (80, 24), "door top", b"", &["door top"]))
            .await
            .unwrap();
    let took = exited.unwrap_or_else(|| panic!("door top did not quit on q:\n{screen}"));
    assert!(took < Duration::from_secs(1), "q took {took:?}");
}

/// A 200 answer with `body` and its length.
fn ok_json(body: &str) -> Vec<u8> {
    format!(
        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

#[tokio::test]
async fn top_reads_at_most_8_mib_of_an_answer_and_says_so() {
    // Chunked, so only reading it tells its size: valid JSON of 9 MiB.
    let chunked = fake_admin(|_| {
        let body = format!(r#"{{"groups":[],"pad":"{}"}}"#, "x".repeat(9 << 20));
        let mut out = format!(
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n{:x}\r\n",
            body.len()
        )
        .into_bytes();
        out.extend_from_slice(body.as_bytes());
        out.extend_from_slice(b"\r\n0\r\n\r\n");
        out
    })
    .await;
    // A gigabyte announced, one byte sent: refused at once, without waiting for the rest.
    let announced = fake_admin(|_| {
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 1073741824\r\n\r\n{"
            .to_vec()
    })
    .await;
    for addr in [chunked, announced] {
        let addr = AdminAddr::Tcp(addr.to_string());
        // Within the request's timeout: past it the error would be a timeout, not TooLarge.
        let Err(err) = door_daemon::top::client::get_json(&addr, "/status").await else {
            panic!("{addr}: the whole answer was read");
        };
        assert!(
            matches!(err, door_daemon::top::TopError::TooLarge(..)),
            "{addr}: {err}"
        );
        assert!(err.to_string().contains("over 8 MiB"), "{err}");
    }
}

/// A JSON answer without door's `groups` list (an application's own `/status`, reached through
/// door's front) is no snapshot: before, `door top --once` printed an empty table and exited 0.
#[tokio::test]
async fn top_says_a_json_answer_without_groups_is_not_doors() {
    let addr = fake_admin(|_| ok_json(r#"{"status":"ok","uptime":12}"#)).await;
    let err = door_daemon::top::fetch(&AdminAddr::Tcp(addr.to_string()))
        .await
        .unwrap_err();
    assert!(
        matches!(err, door_daemon::top::TopError::NotDoor(..)),
        "{err}"
    );
    let text = err.to_string();
    assert!(
        text.contains("GET /status") && text.contains(&addr.to_string()),
        "{text}"
    );
    let out = door_top(&["--admin", &addr.to_string(), "--once"]).await;
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("not door's admin listener"), "{stderr}");
}

#[tokio::test(start_paused = true)]
async fn a_body_that_never_ends_times_out_with_the_request() {
    let addr = fake_admin(|_| {
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{"
            .to_vec()
    })
    .await;
    let start = door_daemon::time::now();
    let err = door_daemon::top::client::get_json(&AdminAddr::Tcp(addr.to_string()), "/status")
        .await
        .unwrap_err();
    assert!(err.to_string().contains("timed out"), "{err}");
    let waited = start.elapsed();
    let limit = door_daemon::top::client::REQUEST_TIMEOUT;
    assert!(
        waited >= limit && waited < limit + Duration::from_secs(1),
        "{waited:?}"
    );
}

#[tokio::test]
async fn top_quotes_only_the_start_of_an_error_body_escaped() {
    let addr = fake_admin(|_| {
        let body = format!("\u{1b}[2Jbroken{}", "x".repeat(10_000));
        format!(
            "HTTP/1.1 500 Internal Server Error\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .into_bytes()
    })
    .await;
    let err = door_daemon::top::client::get_json(&AdminAddr::Tcp(addr.to_string()), "/status")
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("status 500"), "{err}");
    assert!(err.contains(r"\u{1b}[2Jbroken"), "{err}");
    assert!(!err.contains('\u{1b}'), "{err}");
    assert!(err.ends_with('…'), "{err}");
    assert!(
        err.chars().count() < 300,
        "{} characters",
        err.chars().count()
    );
}

#[tokio::test]
async fn top_once_prints_no_control_character_from_the_api() {
    let status = serde_json::json!({
        "groups": [{"name": "li\u{1b}[31mnk", "burst": 3, "inflight_cap": 4, "max_clients": 10}],
        "requests": {"li\u{1b}[31mnk": {"ok\u{7}": 1}},
        "xdp": {"attached": true, "mode": "skb\u{202e}",
                "counters": {"pass/\u{1b}]0;owned\u{7}": 3},
                "top_prefixes": [{"prefix": "203.0.113.9/32\r\n", "syns": 1, "drops": 0}]},
        "cluster": {"state": "synced\u{9b}2J", "doors": 2},
    })
    .to_string();
    let clients = serde_json::json!({"groups": [{"group": "li\u{1b}[31mnk", "clients": [
        {"key": "198.51.100.7/32\u{1b}[8m", "tokens": 0, "spent": 3, "inflight": 0, "rejections": 2},
    ]}]})
    .to_string();
    let addr = fake_admin(move |path| {
        if path.starts_with("/clients") {
            ok_json(&clients)
        } else {
            ok_json(&status)
        }
    })
    .await;
    let text = door_daemon::top::once(&AdminAddr::Tcp(addr.to_string()))
        .await
        .unwrap();
    let raw: Vec<char> = text
        .chars()
        .filter(|c| *c != '\n' && (c.is_control() || *c == '\u{202e}'))
        .collect();
    assert!(raw.is_empty(), "{raw:?} in:\n{text}");
    for shown in [
        r"== group li\u{1b}[31mnk",
        r"198.51.100.7/32\u{1b}[8m",
        r"ok\u{7}",
        r"pass/\u{1b}]0;owned\u{7}",
        r"203.0.113.9/32\r\n",
        r"skb\u{202e}",
        r"synced\u{9b}2J",
    ] {
        assert!(text.contains(shown), "{shown} not in:\n{text}");
    }
}
