//! `cargo xtask bench instructions`: the user-space instructions each front executes per request,
//! counted by valgrind's callgrind: door, the bare hyper proxy of `bench proxy --floor`, nginx
//! and HAProxy, configured as in `bench proxy` (`bench.rs`), on its three routes.
//!
//! Where `bench proxy` measures time on two shared cores, and moves with whatever else the
//! machine runs, an instruction count does not: the same binary under the same load gives the
//! same count to a fraction of a percent, so a change of a few percent in door's own work shows
//! here where the timed rounds' spread hides it. It is not time: it ignores the kernel (about
//! half of a loopback proxy's CPU), cache misses and instructions per cycle, so it says what
//! door's code asks of the CPU, not how fast door is.
//!
//! Each front runs alone under `valgrind --tool=callgrind` (nginx as one process, `master_process
//! off`, HAProxy with one thread; valgrind serialises threads anyway), in front of the benchmark's
//! upstream. Per route: [`WARM_UP`] requests unrecorded, the counters zeroed
//! (`callgrind_control -z`), [`REQUESTS`] requests by h2load (`--h1 -c64` for HTTP/1.1, `-c32 -m10`
//! for h2c), then a dump (`callgrind_control -d`) whose total, over the requests h2load saw
//! succeed, is the count per request. About five minutes.

use std::{
    fmt::Write as _,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::Duration,
};

use anyhow::{Context as _, bail};

use crate::{
    bench::{self, Guard, Proxy, Route},
    setup, step,
};

/// Requests counted per (front, route).
const REQUESTS: u32 = 20_000;
/// Requests sent before the counters are zeroed: connections opened, pools and caches warm.
const WARM_UP: u32 = 3_000;
/// How long a front under valgrind may take to start listening.
const START_SECS: u64 = 120;

/// `cargo xtask bench instructions`: builds door and the bare hyper proxy (release), then counts.
pub(crate) fn run() -> anyhow::Result<()> {
    setup::require_debian_packages(setup::BENCH_PROXY_PACKAGES)?;
    setup::require_debian_packages(&["valgrind"])?;
    bench::build(true)?;
    let dir = std::env::temp_dir().join(format!("door-instructions-{}", std::process::id()));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let result = count_all(&dir);
    let _ = std::fs::remove_dir_all(&dir);
    result
}

/// The fronts, in the order they are counted and shown.
const FRONTS: [Proxy; 4] = [Proxy::Door, Proxy::Bare, Proxy::Nginx, Proxy::Haproxy];

fn count_all(dir: &Path) -> anyhow::Result<()> {
    step("starting the upstream (nginx return 200)");
    let _upstream = bench::nginx(dir, "upstream", &bench::upstream_conf(dir))?;
    bench::wait_listening(bench::UPSTREAM)?;
    let mut counts = Vec::new();
    for front in FRONTS {
        step(&format!(
            "{}: under callgrind, {REQUESTS} requests per route",
            front.name()
        ));
        let out = dir.join(format!("{}.callgrind", front.name()));
        let guard = under_callgrind(dir, front, &out)?;
        wait_started(front.h1(), START_SECS)?;
        let mut per_route = Vec::new();
        for (n, route) in Route::ALL.into_iter().enumerate() {
            let per_request = count(guard.0.id(), route, front, &out, n + 1)?;
            eprintln!(
                "  {}: {per_request:.0} instructions per request",
                route.name()
            );
            per_route.push(per_request);
        }
        drop(guard);
        counts.push(per_route);
    }
    print!("{}", table(&counts));
    Ok(())
}

/// Starts `front` under callgrind, writing its dumps to `out.N`.
fn under_callgrind(dir: &Path, front: Proxy, out: &Path) -> anyhow::Result<Guard> {
    let mut cmd = Command::new("valgrind");
    cmd.args(["--tool=callgrind", "--quiet"])
        .arg(format!("--callgrind-out-file={}", out.display()));
    match front {
        Proxy::Door => {
            let conf = dir.join("door.toml");
            write(&conf, &bench::door_toml(Proxy::Door, false))?;
            cmd.arg(crate::target_dir().join("release/door"))
                .arg("--config")
                .arg(conf)
                .env("RUST_LOG", "warn");
        }
        Proxy::Bare => {
            cmd.arg(crate::target_dir().join("release/bare-proxy"))
                .args(["--listen", bench::BARE_LISTEN, "--upstream"])
                .arg(format!("http://{}", bench::UPSTREAM));
        }
        Proxy::Nginx => {
            let conf: PathBuf = dir.join("front.conf");
            // One process: the master would fork the worker outside valgrind's count.
            write(
                &conf,
                &format!("master_process off;\n{}", bench::front_conf(dir, 1)),
            )?;
            cmd.arg("nginx").arg("-p").arg(dir).arg("-c").arg(conf);
        }
        Proxy::Haproxy => {
            let conf = dir.join("haproxy.cfg");
            write(&conf, &bench::haproxy_conf(1))?;
            cmd.args(["haproxy", "-db", "-f"]).arg(conf);
        }
        Proxy::DoorCluster => bail!("door with [cluster] is not counted"),
        Proxy::DoorPgo => bail!("door built with profile-guided optimisation is not counted"),
    }
    Ok(Guard(
        cmd.stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .with_context(|| format!("starting {} under valgrind", front.name()))?,
    ))
}

/// Waits until `addr` accepts connections, for at most `secs` (valgrind starts a program tens of
/// times slower than it runs natively).
fn wait_started(addr: &str, secs: u64) -> anyhow::Result<()> {
    for _ in 0..secs * 10 {
        if std::net::TcpStream::connect(addr).is_ok() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    bail!("{addr} did not listen within {secs} s under valgrind")
}

/// One route on the front under callgrind (`pid`): warm-up, counters zeroed, the counted
/// requests, then dump number `dump` (`out.DUMP`) read. Instructions per succeeded request.
fn count(pid: u32, route: Route, front: Proxy, out: &Path, dump: usize) -> anyhow::Result<f64> {
    let url = route.url(front);
    h2load(route, &url, WARM_UP)?;
    callgrind_control("-z", pid)?;
    let done = h2load(route, &url, REQUESTS)?;
    callgrind_control("-d", pid)?;
    let path = PathBuf::from(format!("{}.{dump}", out.display()));
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("reading callgrind's dump {}", path.display()))?;
    let total = summary(&text).with_context(|| format!("no summary in {}", path.display()))?;
    if done == 0 {
        bail!("no request to {url} succeeded");
    }
    #[expect(
        clippy::cast_precision_loss,
        reason = "counts far below 2^52; a ratio is shown"
    )]
    Ok(total as f64 / f64::from(done))
}

/// `n` requests to `url` with h2load, HTTP/1.1 or h2c as `route` says; the number that succeeded.
fn h2load(route: Route, url: &str, n: u32) -> anyhow::Result<u32> {
    let mut cmd = bench::bounded(600, "h2load");
    if matches!(route, Route::H2) {
        cmd.args(["-c32", "-m10"]);
    } else {
        cmd.args(["--h1", "-c64", "-m1"]);
    }
    let text = bench::capture(cmd.args(["-t1", "-n", &n.to_string(), url]))?;
    succeeded(&text).with_context(|| format!("h2load printed no request count for {url}"))
}

/// `callgrind_control WHAT PID` (`-z` zeroes the counters, `-d` dumps them), bounded in time: it
/// waits for the program to reach valgrind's scheduler.
fn callgrind_control(what: &str, pid: u32) -> anyhow::Result<()> {
    bench::capture(
        bench::bounded(30, "callgrind_control")
            .arg(what)
            .arg(pid.to_string()),
    )
    .map(drop)
}

/// Writes a front's configuration, naming the file on failure.
fn write(path: &Path, text: &str) -> anyhow::Result<()> {
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}

/// The `summary:` (or, in newer callgrind, `totals:`) line of a callgrind dump: instructions.
fn summary(dump: &str) -> Option<u64> {
    dump.lines()
        .find_map(|l| l.strip_prefix("summary:").or(l.strip_prefix("totals:")))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
}

/// h2load's `requests: … N succeeded, …`.
fn succeeded(out: &str) -> Option<u32> {
    let line = out.lines().find(|l| l.starts_with("requests:"))?;
    let before = line.split(" succeeded").next()?;
    before.rsplit(' ').next()?.parse().ok()
}

/// The table: per route, each front's instructions per request (thousands), door / best peer
/// (the fewer of nginx's and HAProxy's), and door / the floor. `counts` follows [`FRONTS`], each
/// row [`Route::ALL`].
fn table(counts: &[Vec<f64>]) -> String {
    let at = |front: Proxy, route: usize| {
        FRONTS
            .iter()
            .position(|f| *f == front)
            .and_then(|i| counts.get(i))
            .and_then(|row| row.get(route))
            .copied()
            .unwrap_or(f64::NAN)
    };
    let mut out = format!(
        "\ninstructions per request (thousands, user space, callgrind)\n{:<18}{:>8}{:>8}{:>8}{:>9}{:>12}{:>12}\n",
        "route", "door", "hyper", "nginx", "haproxy", "door/best", "door/floor"
    );
    for (i, route) in Route::ALL.into_iter().enumerate() {
        let door = at(Proxy::Door, i);
        let best = at(Proxy::Nginx, i).min(at(Proxy::Haproxy, i));
        let _ = writeln!(
            out,
            "{:<18}{:>8.1}{:>8.1}{:>8.1}{:>9.1}{:>12.2}{:>12.2}",
            route.name(),
            door / 1e3,
            at(Proxy::Bare, i) / 1e3,
            at(Proxy::Nginx, i) / 1e3,
            at(Proxy::Haproxy, i) / 1e3,
            door / best,
            door / at(Proxy::Bare, i),
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::{succeeded, summary, table};

    #[test]
    fn a_dump_total_and_the_requests_that_succeeded_are_read() {
        let dump = "# callgrind format\nversion: 1\npositions: line\nevents: Ir\nsummary: 735793025\n\nob=(3)\n";
        assert_eq!(summary(dump), Some(735_793_025));
        assert_eq!(summary("totals: 42\n"), Some(42));
        assert_eq!(summary("events: Ir\n"), None);
        let h2load = "finished in 13.2s, 1514.00 req/s, 100KB/s\nrequests: 20000 total, 20000 started, 20000 done, 19990 succeeded, 10 failed, 0 errored, 0 timeout\n";
        assert_eq!(succeeded(h2load), Some(19_990));
        assert_eq!(succeeded("nothing\n"), None);
    }

    #[test]
    fn the_table_sets_door_against_the_fewer_of_the_peers_and_against_the_floor() {
        let counts = vec![
            vec![44_000.0, 48_000.0, 58_000.0],
            vec![35_200.0, 35_200.0, 48_000.0],
            vec![22_000.0, 22_000.0, 25_000.0],
            vec![40_000.0, 40_000.0, 20_000.0],
        ];
        let out = table(&counts);
        let pass = out
            .lines()
            .find(|l| l.starts_with("h1 pass-through"))
            .unwrap();
        assert!(pass.ends_with("2.00        1.25"), "{pass}");
        let h2 = out
            .lines()
            .find(|l| l.starts_with("h2c pass-through"))
            .unwrap();
        assert!(h2.ends_with("2.90        1.21"), "{h2}");
    }
}
