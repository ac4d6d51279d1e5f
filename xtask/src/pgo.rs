//! `cargo xtask pgo`, and `--pgo` of `cargo xtask bench proxy`: door built with profile-guided
//! optimisation (rustc's `-Cprofile-generate` and `-Cprofile-use`, LLVM's instrumentation
//! profiles; the rustc book, "Profile-guided Optimization").
//!
//! Three steps, each announced with its progress:
//! 1. an instrumented release build of door (`-Cprofile-generate`), in `target/pgo/generate`;
//! 2. a training run: the instrumented door in front of the proxy benchmark's upstream (a static
//!    nginx), with the benchmark's configuration, loaded for [`TRAIN_SECS`] seconds on each of
//!    the benchmark's routes (HTTP/1.1 pass-through, from one client and from
//!    [`TRAIN_CLIENTS`] clients named by `X-Forwarded-For`; the limited route, the same two
//!    ways; h2c pass-through), then stopped with SIGTERM so that it writes its profile; the
//!    profiles merged with `llvm-profdata` from rustup's `llvm-tools` component (its LLVM is
//!    rustc's own: a profile is read only by the LLVM version that wrote its format);
//! 3. the optimised release build (`-Cprofile-use`), in `target/pgo/use`.
//!
//! Both builds name the host's target triple (`--target`), so that the flags reach door and
//! every crate it links but not the build scripts and procedural macros, which run at build
//! time; the XDP program's build sets its own flags (aya-build's `CARGO_ENCODED_RUSTFLAGS`).
//! The separate target directories keep the plain release build's cache as it is. The flags are
//! set as `CARGO_ENCODED_RUSTFLAGS`, which replaces any other rustflags (`RUSTFLAGS`,
//! `build.rustflags`) for these builds. Every call builds and trains afresh: a profile is valid
//! only for the source it was recorded from. About twice a release build's time, plus half a
//! minute of training.

use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail, ensure};

use crate::{
    bench::{self, Clients, Proxy, Route},
    cargo, sh, step,
};

/// The Debian packages the training run uses: nginx (the upstream), wrk and h2load.
const TRAIN_PACKAGES: &[&str] = &["nginx-light", "wrk", "nghttp2-client"];
/// Seconds of training load on each route.
const TRAIN_SECS: u32 = 6;
/// The clients named by `X-Forwarded-For` in the training's many-clients loads.
const TRAIN_CLIENTS: u32 = 1_000;
/// How long the instrumented door may take to drain and exit after SIGTERM.
const STOP_DEADLINE: Duration = Duration::from_secs(30);

/// door built with profile-guided optimisation.
pub(crate) struct Built {
    /// The optimised binary.
    pub(crate) door: PathBuf,
    /// The target directory of the optimised build (`target/pgo/use`).
    pub(crate) target_dir: PathBuf,
    /// The target triple it was built for (the host's).
    pub(crate) host: String,
}

/// Builds door with profile-guided optimisation (the three steps of the module's docs).
///
/// Errors: the training's tools (nginx, wrk, h2load) missing, `rustup` missing or failing to
/// add `llvm-tools`, the profiles of an earlier run that cannot be removed, a failed build, a
/// training load with an answer other than 2xx or an error, an instrumented door that does not
/// exit cleanly or writes no profile, a failed merge.
pub(crate) fn build() -> anyhow::Result<Built> {
    crate::setup::require_debian_packages(TRAIN_PACKAGES)?;
    let profdata = llvm_profdata()?;
    let host = host_triple()?;
    let root = crate::target_dir().join("pgo");
    let profiles = root.join("profiles");
    let merged = root.join("door.profdata");
    // An earlier run's profiles, from other code, must not be merged into this one's.
    match std::fs::remove_dir_all(&profiles) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            return Err(e).with_context(|| format!("removing {}", profiles.display()));
        }
        _ => {}
    }
    std::fs::create_dir_all(&profiles)
        .with_context(|| format!("creating {}", profiles.display()))?;

    step("PGO 1/3: instrumented release build of door (-Cprofile-generate; minutes)");
    let generate = root.join("generate");
    sh(&mut release_build(
        &generate,
        &host,
        &format!("-Cprofile-generate={}", profiles.display()),
    ))?;

    step(&format!(
        "PGO 2/3: training run, {TRAIN_SECS} s on each of the benchmark's five loads"
    ));
    train(&binary(&generate, &host), &profiles)?;
    sh(Command::new(&profdata)
        .arg("merge")
        .arg("-o")
        .arg(&merged)
        .arg(&profiles))?;

    step("PGO 3/3: optimised release build of door (-Cprofile-use; minutes)");
    let optimised = root.join("use");
    sh(&mut release_build(
        &optimised,
        &host,
        &format!("-Cprofile-use={}", merged.display()),
    ))?;
    let door = binary(&optimised, &host);
    eprintln!("    built {}", door.display());
    Ok(Built {
        door,
        target_dir: optimised,
        host,
    })
}

/// `cargo build --release` of door into `target_dir` for `host`, with `rustflag` (one flag) as
/// its only rustflags.
fn release_build(target_dir: &Path, host: &str, rustflag: &str) -> Command {
    let mut cmd = cargo();
    cmd.env("CARGO_TARGET_DIR", target_dir)
        .env("CARGO_ENCODED_RUSTFLAGS", rustflag)
        .args(["build", "--release", "--package", "door-daemon", "--bin"])
        .args(["door", "--target", host]);
    cmd
}

/// The door binary a [`release_build`] into `target_dir` for `host` makes.
fn binary(target_dir: &Path, host: &str) -> PathBuf {
    target_dir.join(host).join("release/door")
}

/// The host's target triple (`rustc -vV`'s `host:` line).
///
/// Errors: rustc fails or prints no `host:` line.
fn host_triple() -> anyhow::Result<String> {
    let rustc = std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let out = bench::capture(Command::new(rustc).arg("-vV"))?;
    parse_host(&out).context("rustc -vV printed no `host:` line")
}

/// The triple of `rustc -vV`'s `host:` line.
fn parse_host(version: &str) -> Option<String> {
    version
        .lines()
        .find_map(|l| l.strip_prefix("host: "))
        .map(|h| h.trim().to_owned())
}

/// `llvm-profdata` of rustc's own LLVM (rustup's `llvm-tools` component, added when missing):
/// `SYSROOT/lib/rustlib/HOST/bin/llvm-profdata`.
///
/// Errors: rustc or rustup fails, or the tool is still missing after adding the component.
fn llvm_profdata() -> anyhow::Result<PathBuf> {
    step("checking llvm-profdata (rustup's llvm-tools component)");
    let rustc = std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let sysroot = bench::capture(Command::new(&rustc).args(["--print", "sysroot"]))?;
    let tool = Path::new(sysroot.trim())
        .join("lib/rustlib")
        .join(host_triple()?)
        .join("bin/llvm-profdata");
    if tool.exists() {
        eprintln!("    {}: present", tool.display());
        return Ok(tool);
    }
    eprintln!("    llvm-tools: installing with rustup (a download of a few tens of MB, once)");
    sh(Command::new("rustup").args(["component", "add", "llvm-tools"]))?;
    ensure!(
        tool.exists(),
        "rustup added llvm-tools, but {} is missing",
        tool.display()
    );
    Ok(tool)
}

/// The training run of the instrumented `door` (module docs, step 2); its profiles go to
/// `profiles`.
///
/// Errors: nginx, wrk or h2load failing, a load with an answer other than 2xx or an error, door
/// not exiting with status 0 within [`STOP_DEADLINE`] of SIGTERM, no profile written.
fn train(door: &Path, profiles: &Path) -> anyhow::Result<()> {
    let dir = std::env::temp_dir().join(format!("door-pgo-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let result = train_in(&dir, door);
    let _ = std::fs::remove_dir_all(&dir);
    result?;
    let written = std::fs::read_dir(profiles)?
        .filter_map(Result::ok)
        .filter(|e| e.path().extension().is_some_and(|x| x == "profraw"))
        .count();
    ensure!(
        written > 0,
        "the training run wrote no profile into {}",
        profiles.display()
    );
    eprintln!("    {written} profile(s) written");
    Ok(())
}

/// [`train`] with its scratch directory `dir`.
fn train_in(dir: &Path, door: &Path) -> anyhow::Result<()> {
    let _upstream = bench::nginx(dir, "upstream", &bench::upstream_conf(dir))?;
    let conf = dir.join("door.toml");
    std::fs::write(&conf, bench::door_toml(Proxy::Door, false))?;
    let mut training = Training(Some(
        Command::new(door)
            .arg("--config")
            .arg(&conf)
            .env("RUST_LOG", "warn")
            // A profile path set in the environment would take the place of the build's.
            .env_remove("LLVM_PROFILE_FILE")
            .stdin(Stdio::null())
            .spawn()
            .with_context(|| format!("starting {}", door.display()))?,
    ));
    let loads = loads(dir);
    let stopped = training.stop();
    loads?;
    stopped
}

/// The instrumented door while it trains: killed if dropped before [`Training::stop`] (a load
/// that failed or panicked), so that it never outlives the run holding the benchmark's port.
struct Training(Option<Child>);

impl Drop for Training {
    fn drop(&mut self) {
        if let Some(mut child) = self.0.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The training loads on the instrumented door.
fn loads(dir: &Path) -> anyhow::Result<()> {
    bench::wait_listening(bench::UPSTREAM)?;
    bench::wait_listening(Proxy::Door.h1())?;
    let many = Clients::write(dir, TRAIN_CLIENTS)?;
    let plan = [
        (Route::Pass, None),
        (Route::Pass, Some(&many)),
        (Route::Limited, None),
        (Route::Limited, Some(&many)),
        (Route::H2, None),
    ];
    for (i, (route, clients)) in plan.into_iter().enumerate() {
        eprintln!(
            "    load {}/{}: {}, {}",
            i + 1,
            plan.len(),
            route.name(),
            clients.map_or_else(
                || "one client".to_owned(),
                |c| format!("{} clients", c.count)
            )
        );
        let run = bench::load(dir, route, Proxy::Door, clients, TRAIN_SECS)?;
        ensure!(
            run.all_answered(),
            "the training load on {} got an answer other than 2xx, or an error: {run:?}",
            route.name(),
        );
    }
    Ok(())
}

impl Training {
    /// Stops the instrumented door with SIGTERM (it drains and exits, writing its profile on
    /// the way out), killing it if it is still there after [`STOP_DEADLINE`].
    ///
    /// Errors: door still running at the deadline, or exiting with a failure status.
    fn stop(&mut self) -> anyhow::Result<()> {
        let Some(mut child) = self.0.take() else {
            return Ok(());
        };
        stop(&mut child)
    }
}

/// [`Training::stop`] of `child`.
fn stop(child: &mut Child) -> anyhow::Result<()> {
    let _ = Command::new("kill")
        .arg("-TERM")
        .arg(child.id().to_string())
        .status();
    let deadline = Instant::now() + STOP_DEADLINE;
    loop {
        if let Some(status) = child.try_wait()? {
            ensure!(
                status.success(),
                "the instrumented door exited with {status}"
            );
            return Ok(());
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            bail!(
                "the instrumented door did not exit within {} s of SIGTERM",
                STOP_DEADLINE.as_secs()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::{binary, parse_host, release_build};

    #[test]
    fn the_host_triple_is_read_from_rustc() {
        let version = "rustc 1.95.0 (59807616e 2026-04-14)\nbinary: rustc\n\
                       host: x86_64-unknown-linux-gnu\nrelease: 1.95.0\nLLVM version: 22.1.2\n";
        assert_eq!(
            parse_host(version).as_deref(),
            Some("x86_64-unknown-linux-gnu")
        );
        assert_eq!(parse_host("rustc 1.95.0\n"), None);
    }

    #[test]
    fn both_builds_name_the_host_and_keep_apart_from_the_plain_release() {
        let dir = Path::new("/t/pgo/use");
        let cmd = release_build(dir, "x86_64-unknown-linux-gnu", "-Cprofile-use=/t/p");
        let args: Vec<_> = cmd.get_args().map(|a| a.to_string_lossy()).collect();
        assert!(
            args.windows(2)
                .any(|w| w[0] == "--target" && w[1] == "x86_64-unknown-linux-gnu")
        );
        let envs: Vec<_> = cmd.get_envs().collect();
        assert!(envs.contains(&(
            "CARGO_ENCODED_RUSTFLAGS".as_ref(),
            Some("-Cprofile-use=/t/p".as_ref())
        )));
        assert!(envs.contains(&("CARGO_TARGET_DIR".as_ref(), Some(dir.as_os_str()))));
        assert_eq!(
            binary(dir, "x86_64-unknown-linux-gnu"),
            Path::new("/t/pgo/use/x86_64-unknown-linux-gnu/release/door")
        );
    }
}
