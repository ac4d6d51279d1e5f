//! `cargo xtask`: door's task runner. Orchestration only: it installs what a fresh machine lacks,
//! builds, runs the demo and runs every test suite. The eBPF objects themselves are built by
//! `door-daemon/build.rs` (door's program) and `tests/build.rs` (the benchmark's references).
//!
//! - `cargo xtask setup`: nightly `rust-src`, `bpf-linker` 0.10.0, and the Debian packages the
//!   tests use (idempotent: only what is missing is installed; the packages only as root).
//! - `cargo xtask run [-- ARGS]`: builds, starts the demo upstream and `door --config
//!   examples/door.toml ARGS`.
//! - `cargo xtask run --vm KERNEL`: the same demo inside a guest booting Debian's KERNEL (`6.1`,
//!   `6.12`) under qemu, with a scripted client (see [`vm`]).
//! - `cargo xtask test`: format and lint checks, unit and property tests, then the privileged
//!   suites (BPF_PROG_TEST_RUN, netns/veth, real proxies) one test at a time on this machine's
//!   kernel, the systemd unit and the Debian package, then the privileged suites inside guests
//!   booting Debian's 6.1 and 6.12 kernels (the fuzz targets built meanwhile), then fuzzing
//!   (with `--no-vm`, right after the unit tests); ends with `N passed, N failed, N skipped`
//!   (skipped: what could not run here, such as the privileged suites without root). `--vm` runs
//!   only the guests, `--no-vm` skips them, `--kernel 6.1,6.12` chooses them.
//! - `cargo xtask bench proxy [--rounds N] [--cluster] [--floor] [--clients N] [--pgo]`: door
//!   against nginx and HAProxy on loopback in N interleaved rounds, medians, and with `--cluster`
//!   door with `[cluster]` on a local `redis-server` too, with `--floor` a bare hyper proxy with
//!   door's serving design, with `--clients N` the HTTP/1.1 requests from N clients named by
//!   `X-Forwarded-For`, with `--pgo` door built with profile-guided optimisation too (see
//!   `bench.rs`); `cargo xtask bench xdp`: door's XDP program
//!   against reference programs, and on a veth against nftables; `cargo xtask bench
//!   instructions`: the user-space instructions per request of door, the bare hyper proxy, nginx
//!   and HAProxy under valgrind's callgrind (see `instructions.rs`).
//! - `cargo xtask soak [--minutes N]` (root): door for N minutes (default 2) under faults (aborted
//!   requests, slow readers, slowloris heads, oversized heads, upstream restarts, reloads) in two
//!   network namespaces, then checks that it leaks nothing (see [`soak`]); `cargo xtask test`
//!   runs it with the default length.
//! - `cargo xtask pgo`: door built with profile-guided optimisation (an instrumented build, a
//!   training run, the optimised build; see [`pgo`]); prints the binary's path.
//! - `cargo xtask deb [--install-test] [--pgo]`: the Debian package (cargo-deb, installed if
//!   missing); with `--install-test`, also `dpkg -i` it, check it and purge it; with `--pgo`,
//!   around door built with profile-guided optimisation.

mod bench;
mod deb;
mod instructions;
mod pgo;
mod service;
mod setup;
mod soak;
mod test;
mod vm;

use std::{
    fmt::Write as _,
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use anyhow::{Context as _, bail};
use clap::{Parser, Subcommand};

/// door's task runner.
#[derive(Debug, Parser)]
#[command(name = "cargo xtask")]
struct Cli {
    #[command(subcommand)]
    command: Task,
}

#[derive(Debug, Subcommand)]
enum Task {
    /// Install what a fresh machine lacks (nightly rust-src, bpf-linker, Debian packages).
    Setup,
    /// Build door and run it in front of the demo upstream (examples/door.toml).
    Run {
        /// Run the demo inside a qemu guest booting Debian's kernel KERNEL (`6.1`, `6.12`), with
        /// a scripted client (legitimate requests, a burst, a SYN flood) instead of on this host.
        #[arg(long, value_name = "KERNEL")]
        vm: Option<String>,
        /// Arguments passed to door (after `--`).
        #[arg(last = true)]
        args: Vec<String>,
    },
    /// Run every test: lints, unit and property tests, the privileged suites on this kernel and
    /// inside qemu guests booting Debian's kernels.
    Test {
        /// Run only the privileged suites inside the qemu guests.
        #[arg(long, conflicts_with = "no_vm")]
        vm: bool,
        /// Skip the qemu guests.
        #[arg(long)]
        no_vm: bool,
        /// The Debian kernel series to boot, comma-separated.
        #[arg(long, value_delimiter = ',', default_values_t = vm::DEFAULT_KERNELS.map(String::from))]
        kernel: Vec<String>,
    },
    /// Benchmarks: `proxy` compares door with nginx and HAProxy on loopback (wrk, h2load) in
    /// interleaved rounds; `xdp` measures door's XDP program per packet against reference
    /// programs and on a veth; `instructions` counts the user-space instructions per request of
    /// door, the bare hyper proxy, nginx and HAProxy under valgrind's callgrind.
    Bench {
        /// What to benchmark: `proxy`, `xdp` or `instructions`.
        target: String,
        /// `proxy` only: rounds, each measuring every (route, proxy) pair once; the table shows
        /// medians across them (default: the smallest multiple of the run's fronts from 5 up, so
        /// each front takes each place equally often: 6; 8 with one of `--cluster`, `--floor` and
        /// `--pgo`; 5 with two; 6 with all three).
        #[arg(long, value_name = "N")]
        rounds: Option<u32>,
        /// `proxy` only: also door with `[cluster]` on a `redis-server` the benchmark starts,
        /// and the store's operations per second at that load.
        #[arg(long)]
        cluster: bool,
        /// `proxy` only: also a bare hyper reverse proxy with door's serving design and none of
        /// door's own work (the tests crate's `bare-proxy`): the floor of door's design.
        #[arg(long)]
        floor: bool,
        /// `proxy` only: the HTTP/1.1 loads come from N clients, each request's
        /// `X-Forwarded-For` naming the next of N addresses in distinct IPv6 /64s of
        /// 2001:db8::/32 (1 to 16,384: door's default table size), so every front keys and
        /// limits N clients.
        #[arg(long, value_name = "N")]
        clients: Option<u32>,
        /// `proxy` only: also door built with profile-guided optimisation, afresh as `cargo
        /// xtask pgo` builds it (trained on the benchmark's own loads; about ten minutes more),
        /// measured beside the plain release build.
        #[arg(long)]
        pgo: bool,
    },
    /// Build door with profile-guided optimisation: an instrumented release build, a training
    /// run in front of the proxy benchmark's upstream, the optimised build; prints its path.
    Pgo,
    /// Soak test (root): door under faults in two network namespaces for N minutes, then checks
    /// that its memory, descriptors and slots are back to their baseline and every request was
    /// answered.
    Soak {
        /// Minutes of traffic (after a warm-up of 10 s).
        #[arg(long, default_value_t = soak::DEFAULT_MINUTES)]
        minutes: u64,
    },
    /// Build the Debian package (cargo-deb; release build): prints the .deb's path.
    Deb {
        /// Also install it (dpkg -i, root), check it and purge it, as `cargo xtask test` does.
        #[arg(long)]
        install_test: bool,
        /// Package door built with profile-guided optimisation, afresh as `cargo xtask pgo`
        /// builds it (about ten minutes more), instead of the plain release build.
        #[arg(long)]
        pgo: bool,
    },
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    std::sync::LazyLock::force(&STARTED);
    let root = workspace_root()?;
    std::env::set_current_dir(&root).with_context(|| format!("entering {}", root.display()))?;
    match cli.command {
        Task::Setup => {
            let missing = setup::all()?;
            if !missing.is_empty() {
                bail!(
                    "missing Debian packages: {0}; install them as root: apt-get install -y {0}",
                    missing.join(" ")
                );
            }
            Ok(())
        }
        Task::Run {
            vm: Some(kernel),
            args,
        } => {
            if !args.is_empty() {
                bail!("`run --vm` takes no door arguments: the guest's config is scripted");
            }
            vm::run(&kernel)
        }
        Task::Run { vm: None, args } => run(&args),
        Task::Test {
            vm: true, kernel, ..
        } => test::vm_only(&kernel),
        Task::Test { no_vm, kernel, .. } => test::all((!no_vm).then_some(kernel.as_slice())),
        Task::Bench {
            target,
            rounds,
            cluster,
            floor,
            clients,
            pgo,
        } => match target.as_str() {
            "proxy" => bench::proxy(
                rounds,
                bench::Extras {
                    cluster,
                    floor,
                    pgo,
                },
                clients,
            ),
            "xdp" | "instructions"
                if rounds.is_some() || cluster || floor || pgo || clients.is_some() =>
            {
                bail!("--rounds, --cluster, --floor, --clients and --pgo are for `bench proxy`")
            }
            "xdp" => bench::xdp(),
            "instructions" => instructions::run(),
            other => bail!("unknown bench target {other:?} (known: proxy, xdp, instructions)"),
        },
        Task::Soak { minutes } => match soak::run(minutes, soak::Unprivileged::from_env()) {
            // DOOR_SKIP_PRIVILEGED=1 without root: the skip line was printed; not a failure.
            Err(e) if e.is::<Skipped>() => {
                eprintln!("{e}");
                Ok(())
            }
            other => other,
        },
        Task::Pgo => pgo::build().map(|built| println!("{}", built.door.display())),
        Task::Deb {
            install_test: true,
            pgo,
        } => deb::install_test(pgo),
        Task::Deb {
            install_test: false,
            pgo,
        } => deb::build(pgo).map(|deb| println!("{}", deb.display())),
    }
}

/// Cargo's target directory, absolute: `$CARGO_TARGET_DIR`, else `target` under the workspace
/// root (xtask runs from the root; steps that change directory need an absolute path).
pub(crate) fn target_dir() -> PathBuf {
    let dir =
        std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| PathBuf::from("target"), PathBuf::from);
    if dir.is_absolute() {
        dir
    } else {
        std::env::current_dir().map_or(dir.clone(), |cwd| cwd.join(&dir))
    }
}

fn workspace_root() -> anyhow::Result<PathBuf> {
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    manifest
        .parent()
        .map(Path::to_path_buf)
        .context("xtask lives one level below the workspace root")
}

/// Why a step did not run (not root, a prerequisite this user cannot install): an error that
/// `cargo xtask test` counts as skipped rather than failed.
#[derive(Debug)]
pub(crate) struct Skipped(pub(crate) String);

impl std::fmt::Display for Skipped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "skipped: {}", self.0)
    }
}

impl std::error::Error for Skipped {}

/// When this xtask started: the origin of the elapsed time every step banner shows.
static STARTED: std::sync::LazyLock<std::time::Instant> =
    std::sync::LazyLock::new(std::time::Instant::now);

/// The time since this xtask started, as `m:ss`.
fn elapsed() -> String {
    minutes_seconds(STARTED.elapsed().as_secs())
}

/// `secs` seconds as `m:ss`: minutes unbounded (a run of over an hour shows `75:03`), seconds
/// two digits.
fn minutes_seconds(secs: u64) -> String {
    format!("{}:{:02}", secs / 60, secs % 60)
}

/// Prints a step banner, with the minutes and seconds since this xtask started, so that a log
/// shows where a long run's time went.
fn step(what: &str) {
    eprintln!("\n==> [{}] {what}", elapsed());
}

/// Runs `cmd` with inherited stdio, failing when it exits non-zero.
fn sh(cmd: &mut Command) -> anyhow::Result<()> {
    eprintln!("    $ {}", display(cmd));
    let status = cmd
        .status()
        .with_context(|| format!("starting {}", display(cmd)))?;
    if !status.success() {
        bail!("{} failed ({status})", display(cmd));
    }
    Ok(())
}

fn display(cmd: &Command) -> String {
    // Variables set on the command first, as a shell line would have them.
    let mut s = String::new();
    for (k, v) in cmd.get_envs() {
        if let Some(v) = v {
            let v = v.to_string_lossy();
            let v = if v.contains(' ') {
                format!("'{v}'")
            } else {
                v.into_owned()
            };
            let _ = write!(s, "{}={v} ", k.to_string_lossy());
        }
    }
    s.push_str(&cmd.get_program().to_string_lossy());
    for a in cmd.get_args() {
        s.push(' ');
        s.push_str(&a.to_string_lossy());
    }
    s
}

fn cargo() -> Command {
    Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
}

/// `cargo test` over every crate but the privileged suites (`door-tests`): the unit, property
/// and daemon tests. Building them builds `target/debug/door` too (door-daemon's integration
/// tests need the binary), which the netns suite and the systemd unit's check run.
pub(crate) fn daemon_tests() -> Command {
    let mut c = cargo();
    c.args(["test", "--workspace", "--exclude", "door-tests"]);
    c
}

fn run(args: &[String]) -> anyhow::Result<()> {
    setup::toolchain()?;
    step("building door and the demo upstream");
    sh(cargo().args([
        "build",
        "--package",
        "door-daemon",
        "--package",
        "door-tests",
        "--bin",
        "door",
        "--bin",
        "demo-upstream",
    ]))?;
    let bin = target_dir().join("debug");
    step("starting the demo upstream on 127.0.0.1:3000");
    let mut upstream = Command::new(bin.join("demo-upstream"))
        .args(["--listen", "127.0.0.1:3000"])
        .stdin(Stdio::null())
        .spawn()
        .with_context(|| format!("starting {}", bin.join("demo-upstream").display()))?;
    step("starting door --config examples/door.toml");
    eprintln!(
        "    door serves http://127.0.0.1:8443 (and [::1]:8443); try:\n\
         \x20     curl -i http://127.0.0.1:8443/l/session/demo      # link: 20 x 200, then 429\n\
         \x20     curl -i -X POST -d '{{}}' http://127.0.0.1:8443/webhooks/github\n\
         \x20     curl -s http://127.0.0.1:9901/status               # groups, outcomes, XDP counters\n\
         \x20   XDP attaches to lo when run as root (CAP_BPF, CAP_NET_ADMIN); otherwise door says so\n\
         \x20   and serves with layer-7 limits only. Ctrl-C stops both."
    );
    let status = Command::new(bin.join("door"))
        .args(["--config", "examples/door.toml"])
        .args(args)
        .status()
        .context("starting door");
    let _ = upstream.kill();
    let _ = upstream.wait();
    let status = status?;
    if !status.success() {
        bail!("door exited with {status}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::minutes_seconds;

    #[test]
    fn step_banners_show_minutes_and_two_digit_seconds() {
        assert_eq!(minutes_seconds(0), "0:00");
        assert_eq!(minutes_seconds(59), "0:59");
        assert_eq!(minutes_seconds(60), "1:00");
        assert_eq!(minutes_seconds(4_503), "75:03");
    }
}
