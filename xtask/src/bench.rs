//! `cargo xtask bench proxy`: door against Debian's nginx on loopback, same upstream, same load
//! tools, same run.
//!
//! - Upstream: a static nginx `return 200` responder (127.0.0.1:18080), so neither front is
//!   measured against a slow application.
//! - door (release build) on 127.0.0.1:18443; nginx as the peer on 127.0.0.1:18444 (HTTP/1.1) and
//!   18445 (h2c), configured the same way: `proxy_pass` to the upstream, `realip` from loopback,
//!   and for the limited route a `limit_req` budget high enough that nothing is rejected (door's
//!   group likewise).
//! - Load: `wrk` (HTTP/1.1, 2 threads, 64 connections, 8 s, `--latency`) for a pass-through route
//!   and a limited route; `h2load` (HTTP/2, 32 clients × 10 streams) for the pass-through route;
//!   then one flooding client (`wrk`, 1 thread, 4 connections, 5 s) on door's default `link`
//!   budget (1/s, burst 20) for the rate of 429s.
//!
//! Prints requests per second, p50/p99 latency and door/nginx ratios. About a minute.
//!
//! `cargo xtask bench xdp` (root): `xdp-bench` from the tests crate, release build. Nanoseconds
//! per packet of door's XDP program with BPF_PROG_TEST_RUN against an empty program and a
//! minimal parse + LRU-update program in the same run, then the veth flood comparison (XDP vs an
//! nftables per-/64 meter vs nothing, with a legitimate client's latency). About a minute.

use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::Duration,
};

use anyhow::{Context as _, bail};

use crate::{cargo, setup, sh, step};

const UPSTREAM: &str = "127.0.0.1:18080";
const DOOR: &str = "127.0.0.1:18443";
const NGINX: &str = "127.0.0.1:18444";
const NGINX_H2: &str = "127.0.0.1:18445";

/// Kills a child process when dropped.
struct Guard(Child);

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// One wrk or h2load result.
#[derive(Debug, Default, Clone, Copy)]
struct Run {
    rps: f64,
    p50_ms: f64,
    p99_ms: f64,
    requests: f64,
    non_2xx: f64,
}

/// Runs the `proxy` benchmark.
/// `cargo xtask bench xdp`: builds the benchmark and the binaries it starts (release), installs
/// nftables if missing, and runs it.
pub(crate) fn xdp() -> anyhow::Result<()> {
    setup::toolchain()?;
    setup::require_debian_packages(&["nftables", "iproute2", "curl"])?;
    step("building the XDP benchmark, door and the demo upstream (release)");
    sh(cargo().args([
        "build",
        "--release",
        "--package",
        "door-tests",
        "--bin",
        "xdp-bench",
        "--bin",
        "syn-flood",
        "--bin",
        "demo-upstream",
        "--package",
        "door-daemon",
        "--bin",
        "door",
    ]))?;
    let dir = crate::target_dir();
    step("BPF_PROG_TEST_RUN per packet, then the veth flood comparison");
    sh(Command::new(dir.join("release/xdp-bench")).arg("--veth"))
}

pub(crate) fn proxy() -> anyhow::Result<()> {
    setup::require_debian_packages(&["wrk", "nginx-light", "nghttp2-client"])?;
    step("building door (release)");
    sh(cargo().args([
        "build",
        "--release",
        "--package",
        "door-daemon",
        "--bin",
        "door",
    ]))?;
    let dir = std::env::temp_dir().join(format!("door-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let result = run_all(&dir);
    let _ = std::fs::remove_dir_all(&dir);
    result
}

fn run_all(dir: &Path) -> anyhow::Result<()> {
    step("starting the upstream (nginx return 200), nginx and door");
    let _upstream = nginx(dir, "upstream", &upstream_conf(dir))?;
    let _nginx = nginx(dir, "front", &front_conf(dir))?;
    let door_conf = dir.join("door.toml");
    std::fs::write(&door_conf, door_toml())?;
    let _door = Guard(
        Command::new(crate::target_dir().join("release/door"))
            .args(["--config"])
            .arg(&door_conf)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .spawn()
            .context("starting door")?,
    );
    for addr in [UPSTREAM, NGINX, NGINX_H2, DOOR] {
        wait_listening(addr)?;
    }

    step("HTTP/1.1, wrk -t2 -c64 -d8s");
    let mut rows = Vec::new();
    for (route, path) in [("pass-through", "/static"), ("limited", "/l/session/bench")] {
        let d = wrk(&format!("http://{DOOR}{path}"), 2, 64, 8)?;
        let n = wrk(&format!("http://{NGINX}{path}"), 2, 64, 8)?;
        rows.push((format!("{route} (h1)"), d, n));
    }
    step("HTTP/2, h2load -c32 -m10 -n200000");
    let d = h2load(&format!("http://{DOOR}/static"))?;
    let n = h2load(&format!("http://{NGINX_H2}/static"))?;
    rows.push(("pass-through (h2)".to_owned(), d, n));

    step("one flooding client on door's link budget (1/s, burst 20): wrk -t1 -c4 -d5s");
    let flood = wrk(&format!("http://{DOOR}/flood/x"), 1, 4, 5)?;

    println!();
    println!(
        "{:<20} {:>12} {:>12} {:>8} {:>9} {:>9} {:>9} {:>9}",
        "route", "door rps", "nginx rps", "ratio", "door p50", "nginx p50", "door p99", "nginx p99"
    );
    for (name, d, n) in &rows {
        println!(
            "{:<20} {:>12.0} {:>12.0} {:>8.2} {:>7.2}ms {:>7.2}ms {:>7.2}ms {:>7.2}ms",
            name,
            d.rps,
            n.rps,
            d.rps / n.rps.max(1.0),
            d.p50_ms,
            n.p50_ms,
            d.p99_ms,
            n.p99_ms
        );
    }
    println!(
        "flood: {:.0} requests in 5 s, {:.0} answered 429 ({:.2}% rejected, {:.0} rps)",
        flood.requests,
        flood.non_2xx,
        100.0 * flood.non_2xx / flood.requests.max(1.0),
        flood.rps
    );
    println!("(h2 latencies: h2load reports mean request time; shown as p50, p99 not measured)");
    Ok(())
}

fn door_toml() -> String {
    format!(
        r#"listen = ["{DOOR}"]
upstream = "http://{UPSTREAM}"
admin_listen = "off"
trusted_proxies = ["127.0.0.1/32"]
[[route]]
group = "bench"
methods = ["GET"]
path = "/l/session/{{id}}"
[[route]]
group = "link"
methods = ["GET"]
path = "/flood/{{id}}"
[group.bench]
rate = 1000000.0
burst = 1000000
per_client = 100000
inflight = 100000
"#
    )
}

fn upstream_conf(dir: &Path) -> String {
    format!(
        "worker_processes 1;\ndaemon off;\npid {d}/upstream.pid;\nerror_log {d}/upstream.err;\n\
         events {{ worker_connections 4096; }}\n\
         http {{ access_log off; server {{ listen {UPSTREAM}; keepalive_requests 1000000; \
         location / {{ return 200 \"ok\\n\"; }} }} }}\n",
        d = dir.display()
    )
}

fn front_conf(dir: &Path) -> String {
    format!(
        "worker_processes 1;\ndaemon off;\npid {d}/front.pid;\nerror_log {d}/front.err;\n\
         events {{ worker_connections 4096; }}\n\
         http {{\n access_log off;\n\
          upstream app {{ server {UPSTREAM}; keepalive 64; }}\n\
          limit_req_zone $binary_remote_addr zone=bench:10m rate=1000000r/s;\n\
          set_real_ip_from 127.0.0.1/32; real_ip_header X-Forwarded-For;\n\
          server {{ listen {NGINX}; listen {NGINX_H2} http2; keepalive_requests 1000000;\n\
           proxy_http_version 1.1; proxy_set_header Connection \"\";\n\
           proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;\n\
           location /l/session/ {{ limit_req zone=bench burst=1000000 nodelay; proxy_pass http://app; }}\n\
           location / {{ proxy_pass http://app; }}\n\
          }}\n}}\n",
        d = dir.display()
    )
}

fn nginx(dir: &Path, name: &str, conf: &str) -> anyhow::Result<Guard> {
    let path: PathBuf = dir.join(format!("{name}.conf"));
    std::fs::write(&path, conf)?;
    let child = Command::new("nginx")
        .args(["-p"])
        .arg(dir)
        .arg("-c")
        .arg(&path)
        .stdin(Stdio::null())
        .spawn()
        .with_context(|| format!("starting nginx ({name})"))?;
    Ok(Guard(child))
}

fn wait_listening(addr: &str) -> anyhow::Result<()> {
    for _ in 0..200 {
        if std::net::TcpStream::connect(addr).is_ok() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    bail!("{addr} never listened")
}

fn capture(cmd: &mut Command) -> anyhow::Result<String> {
    let out = cmd.output().with_context(|| format!("running {cmd:?}"))?;
    if !out.status.success() {
        bail!("{cmd:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn wrk(url: &str, threads: u32, conns: u32, secs: u32) -> anyhow::Result<Run> {
    let out = capture(Command::new("wrk").args([
        &format!("-t{threads}"),
        &format!("-c{conns}"),
        &format!("-d{secs}s"),
        "--latency",
        url,
    ]))?;
    let mut run = Run::default();
    for line in out.lines().map(str::trim) {
        let mut words = line.split_whitespace();
        match (words.next(), words.next()) {
            (Some("Requests/sec:"), Some(v)) => run.rps = v.parse().unwrap_or(0.0),
            (Some("50%"), Some(v)) => run.p50_ms = ms(v),
            (Some("99%"), Some(v)) => run.p99_ms = ms(v),
            (Some(n), Some("requests")) => run.requests = n.parse().unwrap_or(0.0),
            (Some("Non-2xx"), _) => {
                run.non_2xx = line
                    .rsplit(' ')
                    .next()
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0.0);
            }
            _ => {}
        }
    }
    eprintln!(
        "    {url}: {:.0} rps, p50 {:.2} ms, p99 {:.2} ms",
        run.rps, run.p50_ms, run.p99_ms
    );
    Ok(run)
}

/// wrk's latency with its unit (`812.00us`, `1.20ms`, `2.01s`) in milliseconds.
fn ms(v: &str) -> f64 {
    let (num, scale) = if let Some(n) = v.strip_suffix("us") {
        (n, 0.001)
    } else if let Some(n) = v.strip_suffix("ms") {
        (n, 1.0)
    } else if let Some(n) = v.strip_suffix('s') {
        (n, 1000.0)
    } else {
        (v, 1.0)
    };
    num.parse::<f64>().unwrap_or(0.0) * scale
}

fn h2load(url: &str) -> anyhow::Result<Run> {
    let out = capture(Command::new("h2load").args(["-c32", "-m10", "-n200000", "-t2", url]))?;
    let mut run = Run::default();
    for line in out.lines().map(str::trim) {
        if let Some(rest) = line.strip_prefix("finished in") {
            // "finished in 1.23s, 161234.56 req/s, 5.12MB/s"
            run.rps = rest
                .split(',')
                .nth(1)
                .and_then(|s| s.trim().strip_suffix(" req/s"))
                .and_then(|s| s.parse().ok())
                .unwrap_or(0.0);
        }
        if let Some(rest) = line.strip_prefix("time for request:") {
            // "min max mean sd +/- sd"
            let cols: Vec<&str> = rest.split_whitespace().collect();
            if let Some(mean) = cols.get(2) {
                run.p50_ms = ms(mean);
            }
        }
        if let Some(rest) = line.strip_prefix("requests:") {
            run.requests = rest
                .split_whitespace()
                .next()
                .and_then(|s| s.parse().ok())
                .unwrap_or(0.0);
        }
    }
    eprintln!("    {url}: {:.0} rps, mean {:.2} ms", run.rps, run.p50_ms);
    Ok(run)
}
