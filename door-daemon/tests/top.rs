//! `door top` against a door running in-process: `--once` (the binary and the library) shows the
//! key of a client that was limited, over TCP and over a Unix socket; the live view renders in a
//! pseudo-terminal (portable-pty, the screen read back with vt100) at 20x10 and 200x60 without
//! panicking, and quits on `q`.

#![expect(
    clippy::unwrap_used,
    reason = "test helpers outside #[test] functions fail loudly by design"
)]

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
    tokio::process::Command::new(env!("CARGO_BIN_EXE_door"))
        .arg("top")
        .args(args)
        .env_remove("DOOR_CONFIG")
        .output()
        .await
        .unwrap()
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

    // Over a Unix socket, and through the library.
    let dir = std::env::temp_dir().join(format!("door-top-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("admin.sock");
    let _file = door.admin_unix(&path).await;
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
    // Nothing listens there: exit 1, naming the address.
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    drop(l);
    let out = door_top(&["--once", "--admin", &addr]).await;
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains(&addr), "{stderr}");
}

/// Runs `door top --admin ADMIN` in a `cols`x`rows` pseudo-terminal; once it has drawn, types
/// `keys`, waits until the screen shows every one of `expect`, then types `q`: the screen, and
/// whether it exited 0 within 10 s.
fn live(admin: &str, cols: u16, rows: u16, keys: &[u8], expect: &[&str]) -> (String, bool) {
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
        if screen().contains("door top") {
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
    let mut exited = false;
    for _ in 0..200 {
        if let Some(status) = child.try_wait().unwrap() {
            exited = status.success();
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    if !exited {
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
        move || live(&admin, 20, 10, b"\ts", &["door top"])
    })
    .await
    .unwrap();
    assert!(
        small_exited,
        "door top did not quit on q at 20x10:\n{small}"
    );
    let (large, large_exited) = tokio::task::spawn_blocking(move || {
        // Tab: from the first group (health) to link.
        live(
            &admin,
            200,
            60,
            b"\t",
            &["198.51.100.7/32", "rate_limited", " link: ", "q quit"],
        )
    })
    .await
    .unwrap();
    assert!(
        large_exited,
        "door top did not quit on q at 200x60:\n{large}"
    );
    assert!(large.contains("0/3"), "{large}");
}
