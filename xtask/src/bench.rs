//! `cargo xtask bench proxy`: door against Debian's nginx and HAProxy on loopback, same upstream,
//! same load tools, same run, in interleaved rounds.
//!
//! - Upstream: a static nginx `return 200` responder (127.0.0.1:18080, one worker), so no front
//!   is measured against a slow application.
//! - The fronts, each one worker per core: door (release build, tokio's multi-threaded runtime)
//!   on 127.0.0.1:18443 (HTTP/1.1 and h2c on one port); nginx (`worker_processes` = cores) on
//!   18444 (HTTP/1.1) and 18445 (h2c); HAProxy (`nbthread` = cores) on 18446 (HTTP/1.1) and
//!   18447 (`proto h2`, h2c with prior knowledge). Configured alike: keep-alive to the upstream
//!   (nginx `keepalive 64`, HAProxy `http-reuse always`, door's pool), `X-Forwarded-For`
//!   appended, the client address taken from `X-Forwarded-For` when the peer is loopback, and for
//!   the limited route a per-client budget so high that nothing is rejected: door's `bench`
//!   group, nginx's `limit_req`, HAProxy's stick table (`track-sc0 src` and a
//!   `sc_http_req_rate` check).
//! - Routes: HTTP/1.1 pass-through (`/static`), HTTP/1.1 limited (`/l/session/bench`), h2c
//!   pass-through (`/static`). HTTP/1.1 load: `wrk -t1 -c64 --latency`; h2c load:
//!   `h2load -t1 -c32 -m10 --log-file` (its per-request times give p50 and p99).
//! - Rounds: every (route, proxy) pair runs once for [`WARM_UP_SECS`] unrecorded, then `rounds`
//!   times for [`RUN_SECS`], each round visiting every pair once in an order rotated by the
//!   round (routes and, within a route, proxies), so slow drift in the machine's load spreads
//!   over all of them. The table shows per pair the medians across rounds (rps, p50, p99, and
//!   the CPU time the proxy's processes spent per request, read from `/proc`: what a request
//!   costs the proxy, however much of a core it got) and door / best peer ratios, on the medians
//!   and on each pair's best round (its highest rps, its lowest p99 and CPU per request: a round
//!   is only ever slowed by the machine's other load). Then one flooding client (`wrk -t1 -c4`,
//!   5 s) on door's default `link` budget (1/s, burst 20) for the rate of 429s.
//!
//! With `--cluster`, a fourth front joins every round: a second door (`door+cl`, 127.0.0.1:18448)
//! configured alike plus `[cluster]` on a `redis-server` the benchmark starts (127.0.0.1:18449, no
//! persistence), so the same table shows it next to the single door; then, per route, its rps and
//! p99 over the single door's and the store's operations per second at that load (from `INFO
//! commandstats` before and after each run: script calls, and every command including those the
//! script ran; one door, so per door).
//!
//! With `--floor`, another front joins every round: `hyper` (127.0.0.1:18450, HTTP/1.1 and h2c),
//! the tests crate's `bare-proxy`: door's serving design (a single-threaded runtime per core,
//! connections handed round robin, hyper-util's server and pooled client with door's settings and
//! upstream connector) doing only what any reverse proxy must (the target rewritten, hop-by-hop
//! fields removed, `X-Forwarded-For` appended), none of door's own work. It is no peer: the table
//! shows it, then per route its rps, p99 and user CPU per request against the best peer's (what
//! the design reaches without door) and door's against its own (what door's work costs).
//!
//! With `--pgo`, another front joins every round: `door+pgo` (127.0.0.1:18451), door built with
//! profile-guided optimisation ([`crate::pgo`]: trained on this benchmark's own loads) and
//! configured like door; the report then shows, per route, its rps, p99 and user CPU per request
//! against door's and against the best peer's.
//!
//! With `--clients N`, the HTTP/1.1 loads name N clients: wrk runs a Lua script
//! ([`CLIENTS_SCRIPT`]) that gives each request the `X-Forwarded-For` of the next of N addresses
//! ([`client_addresses`]: one in each of N IPv6 /64s of 2001:db8::/32, the documentation
//! prefix), in turn. Every front takes the client from that field (the peer is loopback, which
//! each trusts), so door's client key and limiter table, nginx's `limit_req` zone and HAProxy's
//! stick table each hold N clients, and door's pass-through requests count against their named
//! client's `upstream_max_inflight_per_client`. The h2c load is unchanged (h2load sends the same
//! fields on every request).
//!
//! The load tool, the proxy under test and the upstream share the machine's cores; nothing is
//! pinned. `nproc` and the load average are printed at the start and the end. About 50 s a
//! round plus half a minute of warm-up, a third more for each extra front; `--pgo` first builds
//! door afresh with profile-guided optimisation (two more release builds and half a minute of
//! training: about ten minutes here) (docs/performance.md: the method and the latest numbers).
//!
//! `cargo xtask bench xdp` (root): `xdp-bench` from the tests crate, release build. Nanoseconds
//! per packet of door's XDP program with BPF_PROG_TEST_RUN against an empty program and a
//! minimal parse + LRU-update program in the same run, one run per call for the SYN cookie path
//! (it rewrites its packet) next to the drop path and both references, the LRU table (the prefix
//! map under address rotation with one LRU list for all CPUs or one per CPU), then the veth flood
//! comparison (XDP vs an nftables per-/64 meter vs nothing, with a legitimate client's latency).
//! About four minutes.

use std::{
    collections::HashMap,
    fmt::Write as _,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::Duration,
};

use anyhow::{Context as _, bail};

use crate::{cargo, setup, sh, step};

/// The fewest rounds `cargo xtask bench proxy` runs without `--rounds`: it runs the smallest
/// multiple of the run's fronts that is at least this ([`default_rounds`]).
const MIN_DEFAULT_ROUNDS: u32 = 5;

/// The rounds of a run of `fronts` fronts without `--rounds`: the smallest multiple of `fronts`
/// that is at least [`MIN_DEFAULT_ROUNDS`], so that every front goes first, second and so on
/// equally often (6 for door, nginx and HAProxy; 8 with one more front; 5 with two more; 6 with
/// three more).
fn default_rounds(fronts: u32) -> u32 {
    let fronts = fronts.max(1);
    MIN_DEFAULT_ROUNDS.div_ceil(fronts) * fronts
}

/// Seconds of one recorded measurement of one (route, proxy) pair.
const RUN_SECS: u32 = 5;
/// Seconds of the unrecorded warm-up of each pair before the first round.
const WARM_UP_SECS: u32 = 2;
/// wrk's connections (one thread).
const WRK_CONNECTIONS: u32 = 64;
/// h2load's clients (connections), one thread.
const H2_CLIENTS: u32 = 32;
/// h2load's concurrent streams per connection.
const H2_STREAMS: u32 = 10;

pub(crate) const UPSTREAM: &str = "127.0.0.1:18080";
/// The store of `--cluster`.
const REDIS_PORT: u16 = 18449;
/// The bare hyper proxy of `--floor` (HTTP/1.1 and h2c).
pub(crate) const BARE_LISTEN: &str = "127.0.0.1:18450";
/// door built with profile-guided optimisation, `--pgo` (HTTP/1.1 and h2c).
const PGO_LISTEN: &str = "127.0.0.1:18451";

/// The most clients `--clients` takes: the fewest clients a front's table holds apart as
/// configured here (door's `bench` group, `max_clients` at its default of 16,384; nginx's
/// 10 MB `limit_req` zone holds about 80,000 IPv6 clients, HAProxy's stick table 100,000). Past
/// it, door's extra clients would share one row and the fronts would no longer key alike.
const MAX_CLIENTS: u32 = 16_384;

/// wrk's script for `--clients`: reads the addresses of the file named by its first argument,
/// formats one request per address with that address as `X-Forwarded-For`, and sends them in
/// turn.
const CLIENTS_SCRIPT: &str = r#"-- door's proxy benchmark: each request names the next client in X-Forwarded-For.
local requests = {}
local next_one = 0
function init(args)
  if args[1] == nil then
    error("no file of client addresses: give its path after --")
  end
  for address in io.lines(args[1]) do
    requests[#requests + 1] = wrk.format(nil, nil, { ["X-Forwarded-For"] = address })
  end
  if #requests == 0 then
    error("no client addresses in " .. args[1])
  end
end
function request()
  next_one = next_one % #requests + 1
  return requests[next_one]
end
"#;

/// The `n` client addresses of `--clients`: `2001:db8:H:L::1`, where H and L are the high and
/// low 16 bits of the client's number (0 to `n - 1`), so each is alone in its /64 (door's client
/// key for IPv6) and all are in the documentation prefix 2001:db8::/32 (RFC 3849).
fn client_addresses(n: u32) -> impl Iterator<Item = std::net::Ipv6Addr> {
    (0..n).map(|i| {
        let [hi, lo] = [(i >> 16) as u16, (i & 0xffff) as u16];
        std::net::Ipv6Addr::new(0x2001, 0xdb8, hi, lo, 0, 0, 0, 1)
    })
}

/// The wrk script and address file of `--clients`, written into the benchmark's directory.
#[derive(Debug, Clone)]
pub(crate) struct Clients {
    /// How many clients.
    pub(crate) count: u32,
    /// [`CLIENTS_SCRIPT`].
    script: PathBuf,
    /// One address a line ([`client_addresses`]).
    addresses: PathBuf,
}

impl Clients {
    /// Writes the script and `count` addresses into `dir`.
    pub(crate) fn write(dir: &Path, count: u32) -> anyhow::Result<Self> {
        let script = dir.join("clients.lua");
        let addresses = dir.join("clients.txt");
        std::fs::write(&script, CLIENTS_SCRIPT)?;
        let mut text = String::new();
        for address in client_addresses(count) {
            let _ = writeln!(text, "{address}");
        }
        std::fs::write(&addresses, text)?;
        Ok(Self {
            count,
            script,
            addresses,
        })
    }
}

/// A front under test.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Proxy {
    Door,
    Nginx,
    Haproxy,
    /// door with `[cluster]` on (`--cluster`).
    DoorCluster,
    /// The bare hyper proxy (`--floor`): door's serving design without door's work.
    Bare,
    /// door built with profile-guided optimisation (`--pgo`; [`crate::pgo`]).
    DoorPgo,
}

/// The fronts a run adds to door and its peers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Extras {
    /// door with `[cluster]` on a local store (`--cluster`).
    pub(crate) cluster: bool,
    /// The bare hyper proxy (`--floor`).
    pub(crate) floor: bool,
    /// door built with profile-guided optimisation (`--pgo`).
    pub(crate) pgo: bool,
}

impl Proxy {
    /// door and its peers: the fronts of every run.
    const ALL: [Self; 3] = [Self::Door, Self::Nginx, Self::Haproxy];

    /// The fronts of a run: [`Proxy::ALL`], then those `extras` adds: door with `[cluster]`,
    /// the bare hyper proxy, door built with profile-guided optimisation.
    fn of_run(extras: Extras) -> Vec<Self> {
        let mut all = Self::ALL.to_vec();
        if extras.cluster {
            all.push(Self::DoorCluster);
        }
        if extras.floor {
            all.push(Self::Bare);
        }
        if extras.pgo {
            all.push(Self::DoorPgo);
        }
        all
    }

    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Door => "door",
            Self::Nginx => "nginx",
            Self::Haproxy => "haproxy",
            Self::DoorCluster => "door+cl",
            Self::Bare => "hyper",
            Self::DoorPgo => "door+pgo",
        }
    }

    /// Its HTTP/1.1 listener.
    pub(crate) fn h1(self) -> &'static str {
        match self {
            Self::Door => "127.0.0.1:18443",
            Self::Nginx => "127.0.0.1:18444",
            Self::Haproxy => "127.0.0.1:18446",
            Self::DoorCluster => "127.0.0.1:18448",
            Self::Bare => BARE_LISTEN,
            Self::DoorPgo => PGO_LISTEN,
        }
    }

    /// Its h2c (prior knowledge) listener.
    pub(crate) fn h2(self) -> &'static str {
        match self {
            Self::Door => "127.0.0.1:18443",
            Self::Nginx => "127.0.0.1:18445",
            Self::Haproxy => "127.0.0.1:18447",
            Self::DoorCluster => "127.0.0.1:18448",
            Self::Bare => BARE_LISTEN,
            Self::DoorPgo => PGO_LISTEN,
        }
    }
}

/// A route of the benchmark, with its protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Route {
    /// HTTP/1.1, no limit.
    Pass,
    /// HTTP/1.1, a per-client budget that never rejects.
    Limited,
    /// h2c, no limit.
    H2,
}

impl Route {
    pub(crate) const ALL: [Self; 3] = [Self::Pass, Self::Limited, Self::H2];

    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Pass => "h1 pass-through",
            Self::Limited => "h1 limited",
            Self::H2 => "h2c pass-through",
        }
    }

    pub(crate) fn url(self, proxy: Proxy) -> String {
        match self {
            Self::Pass => format!("http://{}/static", proxy.h1()),
            Self::Limited => format!("http://{}/l/session/bench", proxy.h1()),
            Self::H2 => format!("http://{}/static", proxy.h2()),
        }
    }
}

/// Kills a child process when dropped: SIGTERM (nginx's master then stops its workers), SIGKILL
/// if it is still there after 5 s.
pub(crate) struct Guard(pub(crate) Child);

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(self.0.id().to_string())
            .stderr(Stdio::null())
            .status();
        for _ in 0..100 {
            if matches!(self.0.try_wait(), Ok(Some(_))) {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// One wrk or h2load result.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Run {
    rps: f64,
    p50_ms: f64,
    /// `None` for h2load when its log gave no per-request times.
    p99_ms: Option<f64>,
    /// Requests: wrk's count of responses read, h2load's `total`.
    requests: f64,
    non_2xx: f64,
    /// wrk's socket errors (connect, read, write, timeout); h2load's failed and errored requests.
    errors: f64,
    /// CPU time (user + system) the proxy's processes spent per request during the run, in
    /// microseconds; `None` when `/proc` could not tell.
    cpu_us: Option<f64>,
    /// The user-space part of `cpu_us`, in microseconds per request; `None` when `/proc` could
    /// not tell.
    user_us: Option<f64>,
    /// door+cl only: the store's script calls and commands (those the script ran included) per
    /// second during the run.
    store_ops: Option<(f64, f64)>,
}

impl Run {
    /// Whether the load got answers and nothing else: at least one request, no answer outside
    /// 2xx and 3xx (h2load: outside 2xx), no socket error, failed or errored request.
    pub(crate) fn all_answered(&self) -> bool {
        self.requests > 0.0 && self.non_2xx == 0.0 && self.errors == 0.0
    }
}

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

/// `cargo xtask bench proxy`: installs the load tools, nginx and HAProxy if missing, builds door
/// (release) and runs `rounds` interleaved rounds; `extras` adds fronts measured in every round
/// too: door with `[cluster]` on a `redis-server` it starts, the bare hyper proxy, door built
/// with profile-guided optimisation ([`crate::pgo::build`]). Without `rounds`,
/// [`default_rounds`]; with `clients`, the HTTP/1.1 loads name that many clients ([`Clients`]).
///
/// Errors: `rounds` of 0, `clients` outside 1 to [`MAX_CLIENTS`], a missing package, a failed
/// build or run.
pub(crate) fn proxy(
    rounds: Option<u32>,
    extras: Extras,
    clients: Option<u32>,
) -> anyhow::Result<()> {
    let fronts = u32::try_from(Proxy::of_run(extras).len()).unwrap_or(u32::MAX);
    let rounds = rounds.unwrap_or_else(|| default_rounds(fronts));
    if rounds == 0 {
        bail!("--rounds must be at least 1");
    }
    if let Some(n) = clients
        && !(1..=MAX_CLIENTS).contains(&n)
    {
        bail!("--clients {n}: must be from 1 to {MAX_CLIENTS}");
    }
    if !rounds.is_multiple_of(fronts) {
        eprintln!(
            "note: {rounds} rounds are not a multiple of the run's {fronts} fronts: some fronts \
             will go first (or last) on a route more often than others"
        );
    }
    setup::require_debian_packages(setup::BENCH_PROXY_PACKAGES)?;
    if extras.cluster {
        setup::require_debian_packages(&["redis-server"])?;
    }
    build(extras.floor)?;
    let pgo = extras
        .pgo
        .then(crate::pgo::build)
        .transpose()?
        .map(|built| built.door);
    let dir = std::env::temp_dir().join(format!("door-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let result = clients
        .map(|n| Clients::write(&dir, n))
        .transpose()
        .and_then(|clients| run_all(&dir, (rounds, extras), pgo.as_deref(), clients.as_ref()));
    let _ = std::fs::remove_dir_all(&dir);
    result
}

/// Builds door, and with `floor` the bare hyper proxy, in one release build (the tests crate's
/// features unified into door's, the same for every benchmark that runs both).
pub(crate) fn build(floor: bool) -> anyhow::Result<()> {
    let mut build = cargo();
    build.args([
        "build",
        "--release",
        "--package",
        "door-daemon",
        "--bin",
        "door",
    ]);
    if floor {
        step("building door and the bare hyper proxy (release)");
        build.args(["--package", "door-tests", "--bin", "bare-proxy"]);
    } else {
        step("building door (release)");
    }
    sh(&mut build)
}

/// Starts door (the release build, or `binary`) with `--config` `toml` (written to
/// `dir/NAME.toml`).
fn start_door(dir: &Path, name: &str, toml: &str, binary: Option<&Path>) -> anyhow::Result<Guard> {
    let conf = dir.join(format!("{name}.toml"));
    std::fs::write(&conf, toml)?;
    let door = binary.map_or_else(
        || crate::target_dir().join("release/door"),
        Path::to_path_buf,
    );
    Ok(Guard(
        Command::new(door)
            .args(["--config"])
            .arg(&conf)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .spawn()
            .with_context(|| format!("starting {name}"))?,
    ))
}

/// Starts `cmd` (`what`, for the error) without stdin or stdout; stopped when dropped.
fn start_quiet(cmd: &mut Command, what: &str) -> anyhow::Result<Guard> {
    Ok(Guard(
        cmd.stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .with_context(|| format!("starting {what}"))?,
    ))
}

/// The fronts `extras` adds, running; dropped in the order of the fields (door with
/// `[cluster]` before its store).
struct ExtraFronts {
    door_pgo: Option<Guard>,
    bare: Option<Guard>,
    door_cluster: Option<Guard>,
    /// door+cl's store: only held, to be stopped last.
    _redis: Option<Guard>,
}

/// Starts the fronts of `extras` (door+pgo from the binary `pgo`), and the store door+cl needs.
fn start_extras(dir: &Path, extras: Extras, pgo: Option<&Path>) -> anyhow::Result<ExtraFronts> {
    let redis = if extras.cluster {
        Some(start_quiet(
            Command::new("redis-server")
                .args(["--port", &REDIS_PORT.to_string(), "--bind", "127.0.0.1"])
                .args(["--save", "", "--appendonly", "no", "--loglevel", "warning"]),
            "redis-server",
        )?)
    } else {
        None
    };
    let door_cluster = if extras.cluster {
        wait_listening(&format!("127.0.0.1:{REDIS_PORT}"))?;
        Some(start_door(
            dir,
            "door-cluster",
            &door_toml(Proxy::DoorCluster, true),
            None,
        )?)
    } else {
        None
    };
    let door_pgo = pgo
        .map(|binary| {
            start_door(
                dir,
                "door-pgo",
                &door_toml(Proxy::DoorPgo, false),
                Some(binary),
            )
        })
        .transpose()?;
    let bare = if extras.floor {
        Some(start_quiet(
            Command::new(crate::target_dir().join("release/bare-proxy"))
                .args(["--listen", BARE_LISTEN, "--upstream"])
                .arg(format!("http://{UPSTREAM}")),
            "the bare hyper proxy",
        )?)
    } else {
        None
    };
    Ok(ExtraFronts {
        door_pgo,
        bare,
        door_cluster,
        _redis: redis,
    })
}

/// The run: the fronts started, the warm-up, `rounds` rounds over door, its peers and the
/// fronts of `extras`, the report. door+pgo runs from the binary `pgo`, and only when one is
/// given, whatever `extras.pgo` says.
fn run_all(
    dir: &Path,
    (rounds, extras): (u32, Extras),
    pgo: Option<&Path>,
    clients: Option<&Clients>,
) -> anyhow::Result<()> {
    let extras = Extras {
        pgo: pgo.is_some(),
        ..extras
    };
    let cores = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
    step("starting the upstream (nginx return 200), nginx, HAProxy and door");
    let _upstream = nginx(dir, "upstream", &upstream_conf(dir))?;
    let front = nginx(dir, "front", &front_conf(dir, cores))?;
    let haproxy = haproxy(dir, cores)?;
    let door = start_door(dir, "door", &door_toml(Proxy::Door, false), None)?;
    let more = start_extras(dir, extras, pgo)?;
    let pids = Pids {
        door: door.0.id(),
        nginx: front.0.id(),
        haproxy: haproxy.0.id(),
        door_cluster: more.door_cluster.as_ref().map(|g| g.0.id()),
        bare: more.bare.as_ref().map(|g| g.0.id()),
        door_pgo: more.door_pgo.as_ref().map(|g| g.0.id()),
        ticks_per_sec: clock_ticks(),
    };
    let proxies = Proxy::of_run(extras);
    let proxies = proxies.as_slice();
    wait_listening(UPSTREAM)?;
    for &p in proxies {
        wait_listening(p.h1())?;
        wait_listening(p.h2())?;
    }
    check_routes(proxies)?;

    let load_start = loadavg();
    eprintln!("    nproc {cores}; load average at start: {load_start}");
    step(&format!(
        "warm-up: every (route, proxy) pair once for {WARM_UP_SECS} s, not recorded"
    ));
    for route in Route::ALL {
        for &proxy in proxies {
            measure(dir, &pids, (route, proxy), clients, WARM_UP_SECS)?;
        }
    }
    let mut results: HashMap<(Route, Proxy), Vec<Run>> = HashMap::new();
    for round in 0..rounds {
        step(&format!(
            "round {}/{rounds} ({RUN_SECS} s a pair; load average {})",
            round + 1,
            loadavg()
        ));
        for (route, proxy) in order(round, proxies) {
            let run = measure(dir, &pids, (route, proxy), clients, RUN_SECS)?;
            results.entry((route, proxy)).or_default().push(run);
        }
    }

    step("one flooding client on door's link budget (1/s, burst 20): wrk -t1 -c4 -d5s");
    let flood = wrk(&format!("http://{}/flood/x", Proxy::Door.h1()), 4, 5, None)?;
    let load_end = loadavg();

    println!();
    print!(
        "{}",
        report(
            &results,
            proxies,
            (rounds, clients.map(|c| c.count)),
            cores,
            (&load_start, &load_end)
        )
    );
    println!(
        "flood: {:.0} requests in 5 s, {:.0} answered 429 ({:.2}% rejected, {:.0} rps)",
        flood.requests,
        flood.non_2xx,
        100.0 * flood.non_2xx / flood.requests.max(1.0),
        flood.rps
    );
    drop(more);
    Ok(())
}

/// The pairs of round `round`: the routes rotated by `round`, and within each route the proxies
/// (`of_run`) rotated by `round`, so that over as many rounds as proxies each goes first, second,
/// and so on.
fn order(round: u32, of_run: &[Proxy]) -> Vec<(Route, Proxy)> {
    let r = usize::try_from(round).unwrap_or(0);
    let mut routes = Route::ALL;
    routes.rotate_left(r % Route::ALL.len());
    let mut proxies = of_run.to_vec();
    proxies.rotate_left(r % of_run.len().max(1));
    routes
        .iter()
        .flat_map(|&route| proxies.iter().map(move |&proxy| (route, proxy)))
        .collect()
}

/// The processes of each front, to read their CPU time from `/proc`.
struct Pids {
    door: u32,
    /// nginx's master: its workers are its children.
    nginx: u32,
    haproxy: u32,
    /// door with `[cluster]`, with `--cluster`.
    door_cluster: Option<u32>,
    /// The bare hyper proxy, with `--floor`.
    bare: Option<u32>,
    /// door built with profile-guided optimisation, with `--pgo`.
    door_pgo: Option<u32>,
    /// `getconf CLK_TCK`: the unit of `/proc/PID/stat`'s times.
    ticks_per_sec: Option<f64>,
}

impl Pids {
    /// The CPU time (all threads) of `proxy`'s processes so far, in seconds: user and system.
    fn cpu_secs(&self, proxy: Proxy) -> Option<(f64, f64)> {
        let (user, system) = match proxy {
            Proxy::Door => cpu_ticks(self.door)?,
            Proxy::Haproxy => cpu_ticks(self.haproxy)?,
            Proxy::DoorCluster => cpu_ticks(self.door_cluster?)?,
            Proxy::Bare => cpu_ticks(self.bare?)?,
            Proxy::DoorPgo => cpu_ticks(self.door_pgo?)?,
            Proxy::Nginx => children(self.nginx)
                .into_iter()
                .filter_map(cpu_ticks)
                .fold(cpu_ticks(self.nginx)?, |(u, s), (cu, cs)| (u + cu, s + cs)),
        };
        let per_sec = self.ticks_per_sec?;
        #[expect(clippy::cast_precision_loss, reason = "clock ticks far below 2^52")]
        Some((user as f64 / per_sec, system as f64 / per_sec))
    }
}

/// `/proc/PID/stat`'s utime and stime (fields 14 and 15, in clock ticks).
fn cpu_ticks(pid: u32) -> Option<(u64, u64)> {
    parse_stat(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// utime and stime from the text of a `/proc/PID/stat` (proc(5)).
fn parse_stat(stat: &str) -> Option<(u64, u64)> {
    // The command name (field 2) is in parentheses and may hold spaces and parentheses: count
    // after the last `)`.
    let rest = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some((utime, stime))
}

/// The processes whose parent is `pid` (nginx's workers).
fn children(pid: u32) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&child| {
            std::fs::read_to_string(format!("/proc/{child}/stat")).is_ok_and(|stat| {
                stat.rsplit_once(')')
                    .and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse::<u32>().ok())
                    == Some(pid)
            })
        })
        .collect()
}

/// `getconf CLK_TCK`.
fn clock_ticks() -> Option<f64> {
    capture(Command::new("getconf").arg("CLK_TCK"))
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// One run of `pair` for `secs` seconds, its CPU time read around it; with `clients`, the
/// HTTP/1.1 load names them.
fn measure(
    dir: &Path,
    pids: &Pids,
    (route, proxy): (Route, Proxy),
    clients: Option<&Clients>,
    secs: u32,
) -> anyhow::Result<Run> {
    let cpu_before = pids.cpu_secs(proxy);
    let store_before = (proxy == Proxy::DoorCluster).then(store_calls).flatten();
    let mut run = load(dir, route, proxy, clients, secs)?;
    if let (Some(before), Some(after)) = (
        store_before,
        store_before.is_some().then(store_calls).flatten(),
    ) {
        let s = f64::from(secs);
        run.store_ops = Some(((after.0 - before.0) / s, (after.1 - before.1) / s));
    }
    if let (Some(before), Some(after)) = (cpu_before, pids.cpu_secs(proxy))
        && run.requests > 0.0
    {
        let user = after.0 - before.0;
        let total = user + after.1 - before.1;
        run.cpu_us = Some(total * 1e6 / run.requests);
        run.user_us = Some(user * 1e6 / run.requests);
    }
    let p99 = run
        .p99_ms
        .map_or_else(|| "n/a".to_owned(), |v| format!("{v:.2} ms"));
    let cpu = cpu_column(run.cpu_us, run.user_us);
    let store = run.store_ops.map_or_else(String::new, |(calls, cmds)| {
        format!("  store {calls:.1} scripts/s {cmds:.1} commands/s")
    });
    eprintln!(
        "    {:<17} {:<8} {:>9.0} rps  p50 {:.2} ms  p99 {p99}  cpu/req {cpu}{store}{}",
        route.name(),
        proxy.name(),
        run.rps,
        run.p50_ms,
        if run.non_2xx > 0.0 || run.errors > 0.0 {
            format!("  ({} non-2xx, {} errors)", run.non_2xx, run.errors)
        } else {
            String::new()
        }
    );
    Ok(run)
}

/// One load of `route` on `proxy` for `secs` seconds: wrk (HTTP/1.1, naming `clients` when
/// given) or h2load (h2c); `dir` holds h2load's log.
///
/// Errors: the tool fails to start or exits with a failure.
pub(crate) fn load(
    dir: &Path,
    route: Route,
    proxy: Proxy,
    clients: Option<&Clients>,
    secs: u32,
) -> anyhow::Result<Run> {
    let url = route.url(proxy);
    match route {
        Route::Pass | Route::Limited => wrk(&url, WRK_CONNECTIONS, secs, clients),
        Route::H2 => h2load(dir, &url, secs),
    }
}

/// The report's line on the clients the HTTP/1.1 loads named (`--clients n`).
fn clients_line(n: u32) -> String {
    if n == 1 {
        "HTTP/1.1 requests from 1 client: X-Forwarded-For naming one IPv6 /64 of 2001:db8::/32 \
         (h2c: one client)"
            .to_owned()
    } else {
        format!(
            "HTTP/1.1 requests from {n} clients: X-Forwarded-For rotated over {n} IPv6 /64s of \
             2001:db8::/32 (h2c: one client)"
        )
    }
}

/// The result table: per pair the medians across rounds, then door / best peer.
///
/// `(rounds, clients)`: the rounds run, and the clients the HTTP/1.1 loads named (`--clients`);
/// `(load_start, load_end)`: the load average at the start and the end.
fn report(
    results: &HashMap<(Route, Proxy), Vec<Run>>,
    proxies: &[Proxy],
    (rounds, clients): (u32, Option<u32>),
    cores: usize,
    (load_start, load_end): (&str, &str),
) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "proxy benchmark: {rounds} interleaved round(s), {RUN_SECS} s per pair a round; medians \
         across rounds (rps range in brackets)"
    );
    if let Some(n) = clients {
        let _ = writeln!(out, "{}", clients_line(n));
    }
    let medians = table(&mut out, results, proxies);
    ratios(&mut out, "door / best peer", &medians);
    let _ = write!(
        out,
        "\nThe same on each pair's best round (its highest rps, its lowest p99 and CPU per \
         request, each from whichever round had it: the least disturbed):"
    );
    ratios(&mut out, "best rounds", &best_rounds(results));
    if proxies.contains(&Proxy::DoorCluster) {
        cluster_lines(&mut out, &medians);
    }
    if proxies.contains(&Proxy::Bare) {
        floor_lines(&mut out, &medians);
    }
    if proxies.contains(&Proxy::DoorPgo) {
        pgo_lines(&mut out, &medians);
    }
    notes(&mut out, cores, load_start, load_end);
    out
}

/// The medians table, one line per pair; returns the medians.
fn table(
    out: &mut String,
    results: &HashMap<(Route, Proxy), Vec<Run>>,
    proxies: &[Proxy],
) -> HashMap<(Route, Proxy), Medians> {
    let _ = writeln!(
        out,
        "{:<17} {:<8} {:>9} {:>19} {:>9} {:>9} {:>22} {:>8} {:>7}",
        "route", "proxy", "rps", "[min-max]", "p50", "p99", "cpu/req (user)", "non-2xx", "errors"
    );
    let mut medians: HashMap<(Route, Proxy), Medians> = HashMap::new();
    for route in Route::ALL {
        for &proxy in proxies {
            let runs = results.get(&(route, proxy)).map_or(&[][..], Vec::as_slice);
            let rps: Vec<f64> = runs.iter().map(|r| r.rps).collect();
            let p50: Vec<f64> = runs.iter().map(|r| r.p50_ms).collect();
            let p99: Option<Vec<f64>> = runs.iter().map(|r| r.p99_ms).collect();
            let cpu: Option<Vec<f64>> = runs.iter().map(|r| r.cpu_us).collect();
            let user: Option<Vec<f64>> = runs.iter().map(|r| r.user_us).collect();
            let store: Option<Vec<(f64, f64)>> = runs.iter().map(|r| r.store_ops).collect();
            let m = Medians {
                rps: median(&rps),
                p99_ms: p99.as_deref().map(median),
                cpu_us: cpu.as_deref().map(median),
                user_us: user.as_deref().map(median),
                store_ops: store.filter(|v| !v.is_empty()).map(|v| {
                    let calls: Vec<f64> = v.iter().map(|x| x.0).collect();
                    let cmds: Vec<f64> = v.iter().map(|x| x.1).collect();
                    (median(&calls), median(&cmds))
                }),
            };
            medians.insert((route, proxy), m);
            let lo = rps.iter().copied().fold(f64::INFINITY, f64::min);
            let hi = rps.iter().copied().fold(0.0, f64::max);
            let _ = writeln!(
                out,
                "{:<17} {:<8} {:>9} {:>19} {:>6.2} ms {:>9} {:>22} {:>8.0} {:>7.0}",
                route.name(),
                proxy.name(),
                thousands(m.rps),
                format!("[{}-{}]", thousands(lo), thousands(hi)),
                median(&p50),
                m.p99_ms
                    .map_or_else(|| "n/a".to_owned(), |v| format!("{v:.2} ms")),
                cpu_column(m.cpu_us, m.user_us),
                runs.iter().map(|r| r.non_2xx).sum::<f64>(),
                runs.iter().map(|r| r.errors).sum::<f64>(),
            );
        }
    }
    medians
}

/// Each pair's best round: the highest rps and the lowest p99 and CPU per request among its
/// rounds, each figure from whichever round had it. A round is only ever slowed by the machine's
/// other load, so a pair's best round is its least disturbed one.
fn best_rounds(results: &HashMap<(Route, Proxy), Vec<Run>>) -> HashMap<(Route, Proxy), Medians> {
    let least = |runs: &[Run], get: fn(&Run) -> Option<f64>| {
        runs.iter().filter_map(get).min_by(f64::total_cmp)
    };
    results
        .iter()
        .map(|(&pair, runs)| {
            let best = Medians {
                rps: runs.iter().map(|r| r.rps).fold(0.0, f64::max),
                p99_ms: least(runs, |r| r.p99_ms),
                cpu_us: least(runs, |r| r.cpu_us),
                user_us: least(runs, |r| r.user_us),
                store_ops: None,
            };
            (pair, best)
        })
        .collect()
}

/// door / best peer per route, under the heading `title`, from each pair's figures in `medians`
/// (the medians across rounds, or the best rounds): rps (over the highest peer's), p99 and CPU
/// per request (over the lowest peer's).
fn ratios(out: &mut String, title: &str, medians: &HashMap<(Route, Proxy), Medians>) {
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "{:<17} {:<30} {:<30} {:<30} user/req (lower is better)",
        title, "rps (higher is better)", "p99 (lower is better)", "cpu/req (lower is better)",
    );
    for route in Route::ALL {
        let door = medians
            .get(&(route, Proxy::Door))
            .copied()
            .unwrap_or_default();
        let peers = [Proxy::Nginx, Proxy::Haproxy]
            .map(|p| (p, medians.get(&(route, p)).copied().unwrap_or_default()));
        let rps_col = peers
            .iter()
            .max_by(|a, b| a.1.rps.total_cmp(&b.1.rps))
            .map_or_else(String::new, |(p, m)| {
                format!(
                    "{:.2} ({} {})",
                    door.rps / m.rps.max(1.0),
                    p.name(),
                    thousands(m.rps)
                )
            });
        let lowest = |get: fn(&Medians) -> Option<f64>, unit: &str| {
            let best = peers
                .iter()
                .filter_map(|(p, m)| get(m).map(|v| (p, v)))
                .min_by(|a, b| a.1.total_cmp(&b.1));
            match (get(&door), best) {
                (Some(d), Some((p, v))) => format!(
                    "{:.2} ({} {v:.2} {unit})",
                    d / v.max(f64::MIN_POSITIVE),
                    p.name()
                ),
                _ => "n/a".to_owned(),
            }
        };
        let _ = writeln!(
            out,
            "{:<17} {rps_col:<30} {:<30} {:<30} {}",
            route.name(),
            lowest(|m| m.p99_ms, "ms"),
            lowest(|m| m.cpu_us, "us"),
            lowest(|m| m.user_us, "us")
        );
    }
}

/// door+cl / door per route: rps and p99, and the store's operations per second at that load.
fn cluster_lines(out: &mut String, medians: &HashMap<(Route, Proxy), Medians>) {
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "{:<17} {:<14} {:<14} store operations per second (one door)",
        "door+cl / door", "rps", "p99",
    );
    for route in Route::ALL {
        let (Some(door), Some(cl)) = (
            medians.get(&(route, Proxy::Door)),
            medians.get(&(route, Proxy::DoorCluster)),
        ) else {
            continue;
        };
        let p99 = match (cl.p99_ms, door.p99_ms) {
            (Some(c), Some(d)) => format!("{:.2}", c / d.max(f64::MIN_POSITIVE)),
            _ => "n/a".to_owned(),
        };
        let store = cl.store_ops.map_or_else(
            || "n/a".to_owned(),
            |(calls, cmds)| format!("{calls:.1} script calls/s, {cmds:.1} commands/s"),
        );
        let _ = writeln!(
            out,
            "{:<17} {:<14} {p99:<14} {store}",
            route.name(),
            format!("{:.2}", cl.rps / door.rps.max(1.0)),
        );
    }
}

/// Per route, the bare hyper proxy against the best peer, and door against the bare proxy: what
/// door's design reaches without door's work, and what that work costs.
fn floor_lines(out: &mut String, medians: &HashMap<(Route, Proxy), Medians>) {
    comparison_lines(
        out,
        medians,
        "floor",
        [
            (Proxy::Bare, Against::BestPeer),
            (Proxy::Door, Against::Front(Proxy::Bare)),
        ],
    );
}

/// Per route, door built with profile-guided optimisation against door, and against the best
/// peer.
fn pgo_lines(out: &mut String, medians: &HashMap<(Route, Proxy), Medians>) {
    comparison_lines(
        out,
        medians,
        "pgo",
        [
            (Proxy::DoorPgo, Against::Front(Proxy::Door)),
            (Proxy::DoorPgo, Against::BestPeer),
        ],
    );
}

/// What a front is compared with in [`comparison_lines`].
#[derive(Clone, Copy)]
enum Against {
    /// Another front of the run.
    Front(Proxy),
    /// The better of nginx and HAProxy: the higher rps, the lower p99 and user CPU per request.
    BestPeer,
}

/// A table under `label`: per route, two comparisons side by side, each a front against what
/// `Against` names (rps, p99, user CPU per request). Routes where a front did not run are left
/// out.
fn comparison_lines(
    out: &mut String,
    medians: &HashMap<(Route, Proxy), Medians>,
    label: &str,
    pairs: [(Proxy, Against); 2],
) {
    let heading = |(front, against): (Proxy, Against)| {
        let of = match against {
            Against::Front(p) => p.name(),
            Against::BestPeer => "best peer",
        };
        format!("{} / {of}", front.name())
    };
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "{:<17} {:<34} {:<30}",
        "",
        heading(pairs[0]),
        heading(pairs[1])
    );
    let _ = writeln!(
        out,
        "{label:<17} {:<10} {:<10} {:<12} {:<10} {:<10} user/req",
        "rps", "p99", "user/req", "rps", "p99"
    );
    for route in Route::ALL {
        let cols = pairs.map(|(front, against)| compare(medians, route, front, against));
        let [Some(a), Some(b)] = cols else {
            continue;
        };
        let _ = writeln!(
            out,
            "{:<17} {:<10} {:<10} {:<12} {:<10} {:<10} {}",
            route.name(),
            a[0],
            a[1],
            a[2],
            b[0],
            b[1],
            b[2]
        );
    }
}

/// `front` against `against` on `route`: rps, p99 and user CPU per request as ratios (`n/a`
/// where a side has no value); `None` when either side did not run.
fn compare(
    medians: &HashMap<(Route, Proxy), Medians>,
    route: Route,
    front: Proxy,
    against: Against,
) -> Option<[String; 3]> {
    let ratio = |a: Option<f64>, b: Option<f64>| match (a, b) {
        (Some(a), Some(b)) => format!("{:.2}", a / b.max(f64::MIN_POSITIVE)),
        _ => "n/a".to_owned(),
    };
    let m = medians.get(&(route, front))?;
    let (rps, p99, user) = match against {
        Against::Front(other) => {
            let o = medians.get(&(route, other))?;
            (Some(o.rps), o.p99_ms, o.user_us)
        }
        Against::BestPeer => {
            let peers: Vec<Medians> = [Proxy::Nginx, Proxy::Haproxy]
                .iter()
                .filter_map(|p| medians.get(&(route, *p)).copied())
                .collect();
            if peers.is_empty() {
                return None;
            }
            let lowest = |get: fn(&Medians) -> Option<f64>| {
                peers.iter().filter_map(get).min_by(f64::total_cmp)
            };
            (
                peers.iter().map(|p| p.rps).max_by(f64::total_cmp),
                lowest(|p| p.p99_ms),
                lowest(|p| p.user_us),
            )
        }
    };
    Some([
        ratio(Some(m.rps), rps),
        ratio(m.p99_ms, p99),
        ratio(m.user_us, user),
    ])
}

/// The store's script calls and commands so far (`INFO commandstats`: `evalsha` and `eval`
/// calls, and the calls of every command, those run by scripts included); `None` if
/// `redis-cli` fails.
fn store_calls() -> Option<(f64, f64)> {
    let out = capture(Command::new("redis-cli").args([
        "-p",
        &REDIS_PORT.to_string(),
        "INFO",
        "commandstats",
    ]))
    .ok()?;
    Some(parse_commandstats(&out))
}

/// `(script calls, all calls)` of an `INFO commandstats` answer.
fn parse_commandstats(out: &str) -> (f64, f64) {
    let mut scripts = 0.0;
    let mut all = 0.0;
    for line in out.lines() {
        let Some((name, rest)) = line.trim().split_once(':') else {
            continue;
        };
        let Some(calls) = rest
            .split(',')
            .find_map(|kv| kv.strip_prefix("calls="))
            .and_then(|v| v.parse::<f64>().ok())
        else {
            continue;
        };
        all += calls;
        if matches!(name, "cmdstat_evalsha" | "cmdstat_eval") {
            scripts += calls;
        }
    }
    (scripts, all)
}

/// What shares the machine, how each front runs, what the h2c latencies are, the load.
fn notes(out: &mut String, cores: usize, load_start: &str, load_end: &str) {
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "wrk -t1 -c{WRK_CONNECTIONS} (HTTP/1.1) or h2load -t1 -c{H2_CLIENTS} -m{H2_STREAMS} \
         (h2c), the proxy under test and the upstream share {cores} core(s); nothing is pinned"
    );
    let _ = writeln!(
        out,
        "door: {cores} worker threads, a single-threaded tokio runtime each; nginx: worker_processes {cores}; \
         HAProxy: nbthread {cores}; upstream: nginx, 1 worker"
    );
    let _ = writeln!(
        out,
        "cpu/req: user + system CPU time of the proxy's processes during the run (nginx: master \
         and workers) over the requests answered: what a request costs the proxy, however much of \
         a core it got; (user): its user-space part, the rest is the kernel's (loopback TCP, \
         epoll, scheduling)"
    );
    let _ = writeln!(
        out,
        "h2c p50/p99: from h2load --log-file (per-request time until the end of the response, \
         which includes waiting for one of the connection's {H2_STREAMS} stream slots)"
    );
    let _ = writeln!(
        out,
        "nproc {cores}; load average (1, 5, 15 min) at start: {load_start}; at end: {load_end}"
    );
}

/// One pair's medians across rounds.
#[derive(Debug, Default, Clone, Copy)]
struct Medians {
    rps: f64,
    p99_ms: Option<f64>,
    cpu_us: Option<f64>,
    /// The user-space part of `cpu_us`.
    user_us: Option<f64>,
    /// door+cl: the store's script calls and commands per second.
    store_ops: Option<(f64, f64)>,
}

/// `23.1 us (8.9 user)`: CPU time per request and its user-space part; `n/a` when `/proc` could
/// not tell.
fn cpu_column(cpu_us: Option<f64>, user_us: Option<f64>) -> String {
    match (cpu_us, user_us) {
        (Some(cpu), Some(user)) => format!("{cpu:.1} us ({user:.1} user)"),
        _ => "n/a".to_owned(),
    }
}

/// The median of `values` (the mean of the middle two for an even count); 0 for none.
fn median(values: &[f64]) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    match (v.get(n / 2), n.checked_sub(1).and_then(|m| v.get(m / 2))) {
        (Some(&hi), Some(&lo)) if n.is_multiple_of(2) => f64::midpoint(lo, hi),
        (Some(&mid), _) => mid,
        _ => 0.0,
    }
}

/// The nearest-rank `q` quantile (0 < q ≤ 1) of sorted `values`; 0 for none.
fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    #[expect(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        clippy::cast_precision_loss,
        reason = "a rank within a slice's length, from a fraction in (0, 1]"
    )]
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted.get(rank - 1).copied().unwrap_or(0.0)
}

/// `1234567.8` as `1,234,568`.
fn thousands(v: f64) -> String {
    if !v.is_finite() {
        return "-".to_owned();
    }
    let digits = format!("{:.0}", v.abs());
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    if v < -0.5 { format!("-{out}") } else { out }
}

/// `/proc/loadavg`'s three averages.
fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg").map_or_else(
        |_| "unknown".to_owned(),
        |s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "),
    )
}

/// One request on each route of each proxy must answer 200, before any load.
fn check_routes(proxies: &[Proxy]) -> anyhow::Result<()> {
    for &proxy in proxies {
        for route in [Route::Pass, Route::Limited] {
            let url = route.url(proxy);
            let code = capture(Command::new("curl").args([
                "-s",
                "-o",
                "/dev/null",
                "-w",
                "%{http_code}",
                "--max-time",
                "5",
                &url,
            ]))?;
            if code.trim() != "200" {
                bail!("{} answered {} to {url}", proxy.name(), code.trim());
            }
        }
        let url = Route::H2.url(proxy);
        let code = capture(Command::new("curl").args([
            "-s",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code} %{http_version}",
            "--max-time",
            "5",
            "--http2-prior-knowledge",
            &url,
        ]))?;
        if code.trim() != "200 2" {
            bail!(
                "{} answered {} over h2c to {url}",
                proxy.name(),
                code.trim()
            );
        }
    }
    Ok(())
}

/// door's configuration for `proxy` (door, door+cl or door+pgo), with `[cluster]` on the
/// benchmark's store when `cluster`.
pub(crate) fn door_toml(proxy: Proxy, cluster: bool) -> String {
    let cluster = if cluster {
        format!("[cluster]\nredis = \"redis://127.0.0.1:{REDIS_PORT}/0\"\n")
    } else {
        String::new()
    };
    format!(
        r#"listen = ["{door}"]
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
{cluster}"#,
        door = proxy.h1()
    )
}

pub(crate) fn upstream_conf(dir: &Path) -> String {
    format!(
        "worker_processes 1;\ndaemon off;\npid {d}/upstream.pid;\nerror_log {d}/upstream.err;\n\
         events {{ worker_connections 4096; }}\n\
         http {{ access_log off; server {{ listen {UPSTREAM}; keepalive_requests 1000000; \
         location / {{ return 200 \"ok\\n\"; }} }} }}\n",
        d = dir.display()
    )
}

pub(crate) fn front_conf(dir: &Path, workers: usize) -> String {
    format!(
        "worker_processes {workers};\ndaemon off;\npid {d}/front.pid;\nerror_log {d}/front.err;\n\
         events {{ worker_connections 4096; }}\n\
         http {{\n access_log off;\n\
          upstream app {{ server {UPSTREAM}; keepalive 64; }}\n\
          limit_req_zone $binary_remote_addr zone=bench:10m rate=1000000r/s;\n\
          set_real_ip_from 127.0.0.1/32; real_ip_header X-Forwarded-For;\n\
          server {{ listen {h1}; listen {h2} http2; keepalive_requests 1000000;\n\
           proxy_http_version 1.1; proxy_set_header Connection \"\";\n\
           proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;\n\
           location /l/session/ {{ limit_req zone=bench burst=1000000 nodelay; proxy_pass http://app; }}\n\
           location / {{ proxy_pass http://app; }}\n\
          }}\n}}\n",
        d = dir.display(),
        h1 = Proxy::Nginx.h1(),
        h2 = Proxy::Nginx.h2(),
    )
}

/// HAProxy configured like the nginx front: keep-alive to the upstream with `http-reuse always`,
/// the client address from `X-Forwarded-For` when the peer is loopback (nginx's `realip`),
/// `X-Forwarded-For` appended, and on the limited route a stick table keyed on that address
/// with a request-rate check so high it never rejects (nginx's `limit_req`).
pub(crate) fn haproxy_conf(threads: usize) -> String {
    format!(
        "global\n\
         \x20   nbthread {threads}\n\
         \x20   maxconn 4096\n\
         defaults\n\
         \x20   mode http\n\
         \x20   timeout connect 5s\n\
         \x20   timeout client 30s\n\
         \x20   timeout server 30s\n\
         \x20   option http-keep-alive\n\
         frontend bench\n\
         \x20   bind {h1}\n\
         \x20   bind {h2} proto h2\n\
         \x20   http-request set-src hdr_ip(x-forwarded-for,-1) if {{ src 127.0.0.1 }} {{ req.hdr(x-forwarded-for) -m found }}\n\
         \x20   option forwardfor\n\
         \x20   acl limited path_beg /l/session/\n\
         \x20   http-request track-sc0 src table limits if limited\n\
         \x20   http-request deny deny_status 429 if limited {{ sc_http_req_rate(0) gt 1000000000 }}\n\
         \x20   default_backend app\n\
         backend limits\n\
         \x20   stick-table type ipv6 size 100k expire 60s store http_req_rate(1s)\n\
         backend app\n\
         \x20   http-reuse always\n\
         \x20   server upstream {UPSTREAM}\n",
        h1 = Proxy::Haproxy.h1(),
        h2 = Proxy::Haproxy.h2(),
    )
}

fn haproxy(dir: &Path, threads: usize) -> anyhow::Result<Guard> {
    let path = dir.join("haproxy.cfg");
    std::fs::write(&path, haproxy_conf(threads))?;
    let child = Command::new("haproxy")
        .arg("-db")
        .arg("-f")
        .arg(&path)
        .stdin(Stdio::null())
        .spawn()
        .context("starting haproxy")?;
    Ok(Guard(child))
}

pub(crate) fn nginx(dir: &Path, name: &str, conf: &str) -> anyhow::Result<Guard> {
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

pub(crate) fn wait_listening(addr: &str) -> anyhow::Result<()> {
    for _ in 0..200 {
        if std::net::TcpStream::connect(addr).is_ok() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    bail!("{addr} never listened")
}

pub(crate) fn capture(cmd: &mut Command) -> anyhow::Result<String> {
    let out = cmd.output().with_context(|| format!("running {cmd:?}"))?;
    if !out.status.success() {
        bail!("{cmd:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// `cmd ARGS` under coreutils' `timeout`: killed if it outlives its own duration by 30 s.
pub(crate) fn bounded(secs: u32, program: &str) -> Command {
    let mut cmd = Command::new("timeout");
    cmd.args(["--kill-after=5", &format!("{}", secs + 30), program]);
    cmd
}

/// `wrk -t1` with `conns` connections for `secs` seconds on `url`, with `clients` its requests
/// naming them ([`CLIENTS_SCRIPT`]).
fn wrk(url: &str, conns: u32, secs: u32, clients: Option<&Clients>) -> anyhow::Result<Run> {
    let mut cmd = bounded(secs, "wrk");
    cmd.args([
        "-t1",
        &format!("-c{conns}"),
        &format!("-d{secs}s"),
        "--latency",
    ]);
    if let Some(clients) = clients {
        cmd.arg("--script").arg(&clients.script);
    }
    cmd.arg(url);
    if let Some(clients) = clients {
        cmd.arg("--").arg(&clients.addresses);
    }
    let out = capture(&mut cmd)?;
    Ok(parse_wrk(&out))
}

/// wrk's report: `Requests/sec:`, the `--latency` percentiles, the request count, `Non-2xx or
/// 3xx responses:` and `Socket errors:`.
fn parse_wrk(out: &str) -> Run {
    let mut run = Run::default();
    for line in out.lines().map(str::trim) {
        let mut words = line.split_whitespace();
        match (words.next(), words.next()) {
            (Some("Requests/sec:"), Some(v)) => run.rps = v.parse().unwrap_or(0.0),
            (Some("50%"), Some(v)) => run.p50_ms = ms(v),
            (Some("99%"), Some(v)) => run.p99_ms = Some(ms(v)),
            (Some(n), Some("requests")) => run.requests = n.parse().unwrap_or(0.0),
            (Some("Non-2xx"), _) => {
                run.non_2xx = line
                    .rsplit(' ')
                    .next()
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0.0);
            }
            (Some("Socket"), Some("errors:")) => {
                // "Socket errors: connect 0, read 0, write 0, timeout 0"
                run.errors = line
                    .split(',')
                    .filter_map(|part| part.split_whitespace().last()?.parse::<f64>().ok())
                    .sum();
            }
            _ => {}
        }
    }
    run
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

fn h2load(dir: &Path, url: &str, secs: u32) -> anyhow::Result<Run> {
    let log = dir.join("h2load.log");
    let _ = std::fs::remove_file(&log);
    let out = capture(
        bounded(secs, "h2load")
            .args([
                "-t1",
                &format!("-c{H2_CLIENTS}"),
                &format!("-m{H2_STREAMS}"),
                &format!("-D{secs}"),
            ])
            .arg(format!("--log-file={}", log.display()))
            .arg(url),
    )?;
    let mut run = parse_h2load(&out);
    let (latencies, non_2xx) = h2load_log(&std::fs::read_to_string(&log).unwrap_or_default());
    run.non_2xx = non_2xx;
    if latencies.is_empty() {
        // No per-request log: h2load's mean request time stands in for p50, no p99.
        run.p99_ms = None;
    } else {
        run.p50_ms = quantile(&latencies, 0.50);
        run.p99_ms = Some(quantile(&latencies, 0.99));
    }
    Ok(run)
}

/// h2load's summary: `finished in`'s req/s, `requests:` (total, failed, errored) and the mean of
/// `time for request:` (kept as p50 until the log replaces it).
fn parse_h2load(out: &str) -> Run {
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
            // "N total, N started, N done, N succeeded, N failed, N errored, N timeout"
            for part in rest.split(',') {
                let mut words = part.split_whitespace();
                if let (Some(n), Some(what)) = (words.next(), words.next()) {
                    let n = n.parse().unwrap_or(0.0);
                    match what {
                        "total" => run.requests = n,
                        "failed" | "errored" => run.errors += n,
                        _ => {}
                    }
                }
            }
        }
    }
    run
}

/// h2load's `--log-file` (start µs, status, µs until the end of the response, per line): the
/// 2xx answers' times in milliseconds, sorted, and the count of the other answers.
fn h2load_log(log: &str) -> (Vec<f64>, f64) {
    let mut times = Vec::new();
    let mut other = 0.0;
    for line in log.lines() {
        let cols: Vec<&str> = line.split('\t').collect();
        let (Some(status), Some(us)) = (cols.get(1), cols.get(2)) else {
            continue;
        };
        match (status.trim().parse::<i32>(), us.trim().parse::<f64>()) {
            (Ok(200..=299), Ok(us)) => times.push(us / 1000.0),
            _ => other += 1.0,
        }
    }
    times.sort_by(f64::total_cmp);
    (times, other)
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::{
        Clients, Extras, HashMap, Medians, Proxy, Route, Run, client_addresses, clients_line,
        cpu_column, cpu_ticks, default_rounds, floor_lines, h2load_log, median, order,
        parse_commandstats, parse_h2load, parse_stat, parse_wrk, pgo_lines, quantile, report,
    };

    #[test]
    fn cpu_times_are_read_for_a_live_process_and_shown_with_their_user_part() {
        // The test's own process is alive; no process has the largest pid.
        assert!(cpu_ticks(std::process::id()).is_some());
        assert_eq!(cpu_ticks(u32::MAX), None);
        assert_eq!(cpu_column(Some(21.94), Some(8.66)), "21.9 us (8.7 user)");
        assert_eq!(cpu_column(Some(21.9), None), "n/a");
        // proc(5): pid (comm) state ppid pgrp session tty_nr tpgid flags minflt cminflt majflt
        // cmajflt utime stime ...; a command name may hold spaces and parentheses.
        let stat = "4242 (door) (a b) S 1 4242 4242 0 -1 4194560 812 0 3 0 1234 567 8 9 20 0";
        assert_eq!(parse_stat(stat), Some((1234, 567)));
        assert_eq!(parse_stat("4242 (door"), None);
    }

    #[test]
    fn every_round_visits_every_pair_once_and_each_proxy_takes_each_place() {
        for bits in 0..8_u8 {
            let extras = Extras {
                cluster: bits & 1 != 0,
                floor: bits & 2 != 0,
                pgo: bits & 4 != 0,
            };
            let proxies = Proxy::of_run(extras);
            let proxies = proxies.as_slice();
            let n = proxies.len();
            assert_eq!(n, 3 + bits.count_ones() as usize, "{extras:?}");
            assert_eq!(
                proxies.len(),
                proxies.iter().collect::<HashSet<_>>().len(),
                "{extras:?}"
            );
            for round in 0..6 {
                let pairs = order(round, proxies);
                assert_eq!(pairs.len(), 3 * n);
                assert_eq!(pairs.iter().collect::<HashSet<_>>().len(), 3 * n);
            }
            for route in Route::ALL {
                let firsts: HashSet<Proxy> = (0..u32::try_from(n).unwrap())
                    .filter_map(|r| {
                        order(r, proxies)
                            .into_iter()
                            .find(|p| p.0 == route)
                            .map(|p| p.1)
                    })
                    .collect();
                assert_eq!(firsts.len(), n, "{route:?}");
            }
        }
    }

    #[test]
    fn commandstats_count_scripts_and_every_command() {
        let out = "# Commandstats\r\ncmdstat_evalsha:calls=40,usec=900,usec_per_call=22.5,rejected_calls=0,failed_calls=0\r\n\
                   cmdstat_zadd:calls=80,usec=100,usec_per_call=1.25,rejected_calls=0,failed_calls=0\r\n\
                   cmdstat_script|load:calls=1,usec=50,usec_per_call=50.00,rejected_calls=0,failed_calls=0\r\n";
        assert_eq!(parse_commandstats(out), (40.0, 121.0));
    }

    #[test]
    fn each_client_has_its_own_documentation_prefix_slash_64() {
        let addresses: Vec<_> = client_addresses(70_000).collect();
        assert_eq!(addresses.len(), 70_000);
        assert!(
            addresses
                .iter()
                .all(|a| a.segments()[..2] == [0x2001, 0xdb8])
        );
        let prefixes: HashSet<_> = addresses.iter().map(|a| u128::from(*a) >> 64).collect();
        assert_eq!(prefixes.len(), 70_000, "two clients share a /64");
        assert_eq!(addresses[0].to_string(), "2001:db8::1");
        assert_eq!(addresses[65_537].to_string(), "2001:db8:1:1::1");
    }

    #[test]
    fn the_report_counts_one_client_and_many() {
        assert!(clients_line(1).starts_with("HTTP/1.1 requests from 1 client: "));
        assert!(clients_line(10_000).starts_with("HTTP/1.1 requests from 10000 clients: "));
    }

    #[test]
    fn the_clients_file_holds_one_address_a_line() {
        let dir = std::env::temp_dir().join(format!("door-bench-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let clients = Clients::write(&dir, 3).unwrap();
        let text = std::fs::read_to_string(&clients.addresses).unwrap();
        let script = std::fs::read_to_string(&clients.script).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(text, "2001:db8::1\n2001:db8:0:1::1\n2001:db8:0:2::1\n");
        assert!(script.contains("X-Forwarded-For"));
    }

    #[test]
    fn default_rounds_are_a_multiple_of_the_fronts() {
        assert_eq!(default_rounds(3), 6);
        assert_eq!(default_rounds(4), 8);
        assert_eq!(default_rounds(5), 5);
        assert_eq!(default_rounds(0), 5);
    }

    /// A front's medians with `rps`, `p99` (ms) and `user` (µs per request).
    fn m(rps: f64, p99: f64, user: f64) -> Medians {
        Medians {
            rps,
            p99_ms: Some(p99),
            cpu_us: None,
            user_us: Some(user),
            store_ops: None,
        }
    }

    #[test]
    fn the_floor_is_set_against_the_best_peer_and_door_against_the_floor() {
        let mut medians = HashMap::new();
        medians.insert((Route::Pass, Proxy::Door), m(40_000.0, 5.0, 10.0));
        medians.insert((Route::Pass, Proxy::Nginx), m(50_000.0, 4.0, 4.0));
        medians.insert((Route::Pass, Proxy::Haproxy), m(45_000.0, 3.0, 6.0));
        medians.insert((Route::Pass, Proxy::Bare), m(45_000.0, 3.3, 8.0));
        let mut out = String::new();
        floor_lines(&mut out, &medians);
        let line = out
            .lines()
            .find(|l| l.starts_with("h1 pass-through"))
            .unwrap();
        // hyper / best peer: rps over nginx's, p99 over HAProxy's, user CPU over nginx's; then
        // door / hyper.
        let cols: Vec<&str> = line["h1 pass-through".len()..].split_whitespace().collect();
        assert_eq!(cols, ["0.90", "1.10", "2.00", "0.89", "1.52", "1.25"]);
        // Routes the bare proxy did not run are left out.
        assert!(!out.contains("h1 limited"));
    }

    /// A round with `rps`, `p99` (ms) and `user` (µs per request).
    fn round(rps: f64, p99: f64, user: f64) -> Run {
        Run {
            rps,
            p50_ms: p99 / 2.0,
            p99_ms: Some(p99),
            requests: rps * 10.0,
            non_2xx: 0.0,
            errors: 0.0,
            cpu_us: Some(user * 2.0),
            user_us: Some(user),
            store_ops: None,
        }
    }

    #[test]
    fn best_rounds_set_each_sides_least_disturbed_figures_against_each_other() {
        let mut results = HashMap::new();
        // Each side's best rps, p99 and user CPU come from different rounds.
        let door = vec![
            round(30_000.0, 6.0, 11.0),
            round(36_000.0, 5.0, 12.0),
            round(33_000.0, 4.4, 10.0),
        ];
        let nginx = vec![round(40_000.0, 4.0, 5.0), round(38_000.0, 3.9, 4.0)];
        let haproxy = vec![round(39_000.0, 4.4, 6.0), round(41_000.0, 4.0, 6.5)];
        results.insert((Route::Pass, Proxy::Door), door);
        results.insert((Route::Pass, Proxy::Nginx), nginx);
        results.insert((Route::Pass, Proxy::Haproxy), haproxy);
        let proxies = [Proxy::Door, Proxy::Nginx, Proxy::Haproxy];
        let out = report(&results, &proxies, (3, None), 2, ("0.1", "0.2"));
        let best = out
            .split("best rounds")
            .nth(1)
            .expect("a best rounds section");
        let line = best
            .lines()
            .find(|l| l.starts_with("h1 pass-through"))
            .unwrap();
        // rps 36,000 over HAProxy's 41,000; p99 4.4 over nginx's 3.9; CPU 20 over nginx's 8;
        // user 10 over nginx's 4.
        let cols: Vec<&str> = line["h1 pass-through".len()..].split_whitespace().collect();
        assert_eq!(
            cols,
            [
                "0.88", "(haproxy", "41,000)", "1.13", "(nginx", "3.90", "ms)", "2.50", "(nginx",
                "8.00", "us)", "2.50", "(nginx", "4.00", "us)"
            ]
        );
        // The medians' section comes first and reads differently: 33,000 over HAProxy's 40,000.
        let medians = out.split("best rounds").next().unwrap();
        assert!(medians.contains("0.82 (haproxy 40,000)"), "{out}");
    }

    #[test]
    fn the_pgo_build_is_set_against_door_and_against_the_best_peer() {
        let mut medians = HashMap::new();
        medians.insert((Route::Limited, Proxy::Door), m(40_000.0, 5.0, 10.0));
        medians.insert((Route::Limited, Proxy::DoorPgo), m(44_000.0, 4.0, 8.0));
        medians.insert((Route::Limited, Proxy::Nginx), m(50_000.0, 4.0, 4.0));
        medians.insert((Route::Limited, Proxy::Haproxy), m(55_000.0, 3.2, 6.0));
        let mut out = String::new();
        pgo_lines(&mut out, &medians);
        assert!(out.contains("door+pgo / door"), "{out}");
        let line = out.lines().find(|l| l.starts_with("h1 limited")).unwrap();
        // door+pgo / door, then door+pgo / best peer: rps over HAProxy's, p99 over HAProxy's,
        // user CPU over nginx's.
        let cols: Vec<&str> = line["h1 limited".len()..].split_whitespace().collect();
        assert_eq!(cols, ["1.10", "0.80", "0.80", "0.80", "1.25", "2.00"]);
        assert!(!out.contains("h1 pass-through"));
    }

    #[test]
    fn medians_and_quantiles() {
        assert!((median(&[3.0, 1.0, 2.0]) - 2.0).abs() < 1e-9);
        assert!((median(&[4.0, 1.0, 2.0, 3.0]) - 2.5).abs() < 1e-9);
        assert!(median(&[]).abs() < 1e-9);
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert!((quantile(&v, 0.5) - 50.0).abs() < 1e-9);
        assert!((quantile(&v, 0.99) - 99.0).abs() < 1e-9);
        assert!((quantile(&[7.0], 0.99) - 7.0).abs() < 1e-9);
    }

    #[test]
    fn parses_wrk() {
        let out = "Running 5s test @ http://127.0.0.1:18443/static
  1 threads and 64 connections
  Latency Distribution
     50%    2.10ms
     75%    2.50ms
     90%    3.00ms
     99%  812.00us
  110000 requests in 5.00s, 9.00MB read
  Socket errors: connect 0, read 2, write 0, timeout 1
  Non-2xx or 3xx responses: 7
Requests/sec:  22000.50
";
        let run = parse_wrk(out);
        assert!((run.rps - 22000.5).abs() < 1e-6);
        assert!((run.p50_ms - 2.1).abs() < 1e-9);
        assert!((run.p99_ms.unwrap_or(0.0) - 0.812).abs() < 1e-9);
        assert!((run.requests - 110_000.0).abs() < 1e-9);
        assert!((run.non_2xx - 7.0).abs() < 1e-9);
        assert!((run.errors - 3.0).abs() < 1e-9);
    }

    #[test]
    fn parses_h2load_and_its_log() {
        let out = "finished in 5.00s, 45000.10 req/s, 1.20MB/s
requests: 225000 total, 225100 started, 225000 done, 224990 succeeded, 10 failed, 2 errored, 0 timeout
time for request:      120us     20.1ms      6.91ms      1.2ms    70.00%
";
        let run = parse_h2load(out);
        assert!((run.rps - 45000.1).abs() < 1e-6);
        assert!((run.requests - 225_000.0).abs() < 1e-9);
        assert!((run.errors - 12.0).abs() < 1e-9);
        assert!((run.p50_ms - 6.91).abs() < 1e-9);
        let (times, other) = h2load_log("1\t200\t3000\n2\t200\t1000\n3\t-1\t5\n4\t429\t9\n");
        assert_eq!(times, vec![1.0, 3.0]);
        assert!((other - 2.0).abs() < 1e-9);
    }
}
