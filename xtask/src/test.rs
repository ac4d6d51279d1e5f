//! `cargo xtask test`: every check and suite, in order, each said before it runs; the run goes on
//! after a failure so one report shows everything, and ends with the totals on a line of their
//! own: `xtask: N passed, N failed, N skipped`. Skipped is what could not run here: a privileged
//! test without root (it prints [`SKIP_MARKER`] and passes; it is counted as skipped, not passed),
//! a test libtest ignored, and a step whose prerequisites this user cannot install (the Debian
//! package install test without root, the VM matrix without qemu).

use std::{
    collections::BTreeSet,
    fs,
    io::{BufRead as _, BufReader},
    path::PathBuf,
    process::{Child, Command, Stdio},
    time::Instant,
};

use anyhow::{Context as _, bail};

use crate::{Skipped, cargo, deb, display, service, setup, sh, soak, step, vm};

/// The line a privileged test of `door-tests` prints when it skips itself, followed by
/// `: SUITE TEST` (`door_tests::SKIP_MARKER`; the same text: xtask does not link door-tests).
pub(crate) const SKIP_MARKER: &str = "door-test: skipped (needs root)";

/// The same, for a test that needs `redis-server` on this machine (`door-daemon/tests/cluster.rs`).
pub(crate) const REDIS_SKIP_MARKER: &str = "door-test: skipped (needs redis-server)";

/// libtest's summary of one test binary: `test result: ok. 12 passed; 0 failed; 1 ignored; …`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Summary {
    /// Tests that passed (including those that skipped themselves).
    pub(crate) passed: u64,
    /// Tests that failed.
    pub(crate) failed: u64,
    /// Tests libtest did not run (`#[ignore]`).
    pub(crate) ignored: u64,
}

/// Parses libtest's `test result:` line.
pub(crate) fn parse_result(line: &str) -> Option<Summary> {
    let rest = line.trim().strip_prefix("test result: ")?;
    let mut passed = None;
    let mut failed = None;
    let mut ignored = 0;
    for part in rest.split([';', '.']) {
        let mut words = part.split_whitespace();
        if let (Some(n), Some(what)) = (words.next(), words.next()) {
            match what {
                "passed" => passed = n.parse().ok(),
                "failed" => failed = n.parse().ok(),
                "ignored" => ignored = n.parse().unwrap_or(0),
                _ => {}
            }
        }
    }
    Some(Summary {
        passed: passed?,
        failed: failed?,
        ignored,
    })
}

/// Adds up libtest output, line by line, over any number of test binaries: each `test result:`
/// line, less the tests of that binary that printed [`SKIP_MARKER`] (counted once per test,
/// moved from passed to skipped), plus the tests libtest ignored (skipped too).
#[derive(Debug, Default)]
pub(crate) struct Counts {
    /// Tests that passed and ran.
    pub(crate) passed: u64,
    /// Tests that failed.
    pub(crate) failed: u64,
    /// Tests that did not run: skipped themselves, or ignored.
    pub(crate) skipped: u64,
    /// The current binary's tests that skipped themselves (`SUITE TEST`).
    marked: BTreeSet<String>,
}

impl Counts {
    /// Takes one line of output; true when it was a `test result:` line.
    pub(crate) fn line(&mut self, line: &str) -> bool {
        let trimmed = line.trim();
        if let Some(test) = trimmed
            .strip_prefix(SKIP_MARKER)
            .or_else(|| trimmed.strip_prefix(REDIS_SKIP_MARKER))
        {
            self.marked
                .insert(test.trim_start_matches(':').trim().to_owned());
            return false;
        }
        if trimmed.starts_with("running ") && trimmed.ends_with(" tests")
            || trimmed == "running 1 test"
        {
            // A new binary: a marker from one that died without a result line is not carried.
            self.marked.clear();
            return false;
        }
        let Some(summary) = parse_result(trimmed) else {
            return false;
        };
        let skipped = u64::try_from(self.marked.len())
            .unwrap_or(u64::MAX)
            .min(summary.passed);
        self.marked.clear();
        self.passed += summary.passed - skipped;
        self.failed += summary.failed;
        self.skipped += skipped + summary.ignored;
        true
    }
}

/// Totals over every `cargo test` run and every check.
#[derive(Debug, Default)]
struct Tally {
    passed: u64,
    failed: u64,
    skipped: u64,
    failures: Vec<String>,
    skips: Vec<String>,
}

impl Tally {
    /// Runs a check (fmt, clippy): one pass or one failure.
    fn check(&mut self, name: &str, cmd: &mut Command) {
        step(name);
        eprintln!("    $ {}", display(cmd));
        match cmd.status() {
            Ok(s) if s.success() => self.passed += 1,
            Ok(s) => self.fail(format!("{name} ({s})")),
            Err(e) => self.fail(format!("{name}: {e}")),
        }
    }

    /// Runs `cargo test …`, echoing its output and adding it up with [`Counts`].
    fn suite(&mut self, name: &str, cmd: &mut Command) -> anyhow::Result<()> {
        step(name);
        eprintln!("    $ {}", display(cmd));
        let mut child = cmd
            .stdout(Stdio::piped())
            .spawn()
            .with_context(|| display(cmd))?;
        let stdout = child.stdout.take().context("piped stdout")?;
        let mut counts = Counts::default();
        let mut saw_result = false;
        for line in BufReader::new(stdout).lines() {
            let line = line?;
            println!("{line}");
            saw_result |= counts.line(&line);
        }
        self.passed += counts.passed;
        self.failed += counts.failed;
        self.skipped += counts.skipped;
        if counts.skipped > 0 {
            self.skips
                .push(format!("{name}: {} test(s) did not run", counts.skipped));
        }
        let status = child.wait()?;
        if !status.success() {
            // A build failure or a crash: count it even if no `test result:` line said so.
            self.failures.push(format!("{name} ({status})"));
            if !saw_result {
                self.failed += 1;
            }
        }
        Ok(())
    }

    /// Runs a check written in Rust (systemd unit, Debian package): one pass, one failure, or
    /// one skip when it returns [`Skipped`].
    fn task(&mut self, name: &str, f: impl FnOnce() -> anyhow::Result<()>) {
        let Err(e) = f() else {
            self.passed += 1;
            return;
        };
        if let Some(Skipped(why)) = e.downcast_ref::<Skipped>() {
            eprintln!("    SKIPPED: {why}");
            self.skip(1, format!("{name}: {why}"));
        } else {
            eprintln!("    FAILED: {e:#}");
            self.fail(format!("{name}: {e:#}"));
        }
    }

    fn fail(&mut self, what: String) {
        self.failed += 1;
        self.failures.push(what);
    }

    fn skip(&mut self, n: u64, what: String) {
        self.skipped += n;
        self.skips.push(what);
    }
}

/// Formatting, lints (host and bpf target) and documentation: checks that run nothing.
fn static_checks(t: &mut Tally) {
    t.check(
        "formatting (cargo fmt --check)",
        cargo().args(["fmt", "--all", "--check"]),
    );
    t.check(
        "lints (cargo clippy, warnings are errors)",
        cargo().args([
            "clippy",
            "--workspace",
            "--all-targets",
            "--",
            "-D",
            "warnings",
        ]),
    );
    t.check(
        "lints of the XDP program for the bpf target (nightly clippy)",
        Command::new("rustup")
            .args([
                "run",
                "nightly",
                "cargo",
                "clippy",
                "--package",
                "door-ebpf",
                "--release",
                // The benchmark's reference programs too (tests/build.rs builds them).
                "--features",
                "reference",
            ])
            .args([
                "--target",
                "bpfel-unknown-none",
                "-Z",
                "build-std=core",
                "--target-dir",
            ])
            .arg(crate::target_dir().join("ebpf-clippy"))
            .args(["--", "-D", "warnings"]),
    );
    t.check(
        "documentation (cargo doc, warnings are errors: broken links, bad code blocks)",
        cargo()
            .args([
                "doc",
                "--workspace",
                "--no-deps",
                "--document-private-items",
                // The test hooks' documentation too (only the test crate enables them).
                "--features",
                "door-daemon/test-hooks",
            ])
            .env("RUSTDOCFLAGS", "-D warnings"),
    );
}

/// Runs everything; with `kernels`, the privileged suites also run inside a guest per kernel.
pub(crate) fn all(kernels: Option<&[String]>) -> anyhow::Result<()> {
    let missing = setup::all()?;
    let mut t = Tally::default();
    static_checks(&mut t);
    t.suite(
        "unit, property and daemon tests",
        &mut crate::daemon_tests(),
    )?;
    // With the guests, the fuzz targets are built beside them and run after them.
    if kernels.is_none() {
        fuzz(&mut t, None);
    }
    // The netns suite starts the `door` binary next to its own executable: the one the step
    // above built for door-daemon's integration tests (docs/decisions.md, "The netns suite runs
    // the test build's door"). Checked up to date (at once, unless a test target failed to
    // build above, which could have left an older binary there).
    t.check(
        "door's test build, for the netns suite (cargo test --no-run)",
        crate::daemon_tests().arg("--no-run"),
    );
    let mut privileged = cargo();
    privileged.args(["test", "--package", "door-tests", "--", "--test-threads=1"]);
    if setup::is_root() {
        t.suite(
            "privileged suites: BPF_PROG_TEST_RUN and netns/veth (root)",
            &mut privileged,
        )?;
    } else {
        // Without root nothing is installed either: the suites that need the missing packages
        // (ip, curl, nginx, HAProxy) are among those that skip themselves.
        step(&format!(
            "privileged suites SKIPPED: not root (CI runs them as root){}",
            if missing.is_empty() {
                String::new()
            } else {
                format!("; missing Debian packages: {}", missing.join(" "))
            }
        ));
        privileged.env("DOOR_SKIP_PRIVILEGED", "1");
        t.suite(
            "privileged suites (each skips itself without root; the others run)",
            &mut privileged,
        )?;
    }
    t.task("systemd unit", service::check);
    if setup::is_root() {
        t.task("Debian package", || deb::install_test(false));
    } else {
        step("Debian package install test SKIPPED: not root (dpkg -i needs it)");
        t.skip(
            1,
            "Debian package install test: not root (dpkg -i needs it)".to_owned(),
        );
    }
    // Without root it prints the privileged suites' skip line and is counted as skipped.
    t.task(
        &format!("soak test ({} min)", soak::DEFAULT_MINUTES),
        || soak::run(soak::DEFAULT_MINUTES, soak::Unprivileged::Skip),
    );
    if let Some(kernels) = kernels {
        let mut built = None;
        t.vm(kernels, || built = FuzzBuild::start());
        fuzz(&mut t, built);
    }
    t.finish()
}

/// Only the privileged suites inside the guests (`cargo xtask test --vm`).
pub(crate) fn vm_only(kernels: &[String]) -> anyhow::Result<()> {
    let mut t = Tally::default();
    t.vm(kernels, || ());
    t.finish()
}

impl Tally {
    /// The VM matrix: one result per kernel, added to the totals; a failed preparation (no
    /// network for the kernels, a build error) is one failure. `before_boot` runs once the guest
    /// binaries are built, before the first guest boots.
    fn vm(&mut self, kernels: &[String], before_boot: impl FnOnce()) {
        step(&format!(
            "privileged suites inside qemu guests: kernels {}",
            kernels.join(", ")
        ));
        match vm::test(kernels, before_boot) {
            Ok(results) => {
                for r in results {
                    self.passed += r.passed;
                    self.failed += r.failed;
                    self.skipped += r.skipped;
                    self.failures.extend(
                        r.failures
                            .into_iter()
                            .map(|f| format!("{}: {f}", r.release)),
                    );
                }
            }
            Err(e) => match e.downcast_ref::<Skipped>() {
                // One skip per kernel that did not boot.
                Some(Skipped(why)) => {
                    eprintln!("    SKIPPED: {why}");
                    self.skip(
                        u64::try_from(kernels.len()).unwrap_or(1),
                        format!("VM matrix ({}): {why}", kernels.join(", ")),
                    );
                }
                None => self.fail(format!("VM matrix: {e:#}")),
            },
        }
    }

    /// Prints the skips, the failures and the total line; an error when anything failed.
    fn finish(&self) -> anyhow::Result<()> {
        eprintln!();
        for s in &self.skips {
            eprintln!("SKIPPED: {s}");
        }
        for f in &self.failures {
            eprintln!("FAILED: {f}");
        }
        step("done");
        println!("{}", total_line(self.passed, self.failed, self.skipped));
        if self.failed > 0 || !self.failures.is_empty() {
            bail!("{} failed", self.failures.len().max(1));
        }
        Ok(())
    }
}

/// The last line of `cargo xtask test`, alone on its line.
fn total_line(passed: u64, failed: u64, skipped: u64) -> String {
    format!("xtask: {passed} passed, {failed} failed, {skipped} skipped")
}

/// The cargo-fuzz targets (`fuzz/`), each run briefly.
const FUZZ_TARGETS: &[&str] = &["client_key", "proxy_protocol"];
/// Seconds each fuzz target runs (libFuzzer's `-max_total_time`).
const FUZZ_SECONDS: u32 = 20;
/// The build options of every `cargo fuzz` command here, so that the targets built in the
/// background are the ones `cargo fuzz run` finds. `--sanitizer none`: door-daemon denies
/// `unsafe_code`, so AddressSanitizer would guard only the dependencies' unsafe code, for a build
/// about 2 minutes longer and a third of the executions per second (docs/decisions.md, "Fuzz
/// targets run in `cargo xtask test`").
const FUZZ_BUILD_OPTIONS: &[&str] = &["--sanitizer", "none"];

/// `rustup run nightly cargo fuzz SUBCOMMAND` with the fuzz build's options and environment
/// (`AYA_BUILD_SKIP=1`: the targets do not need the XDP program).
fn cargo_fuzz(subcommand: &str) -> Command {
    let mut cmd = Command::new("rustup");
    cmd.args(["run", "nightly", "cargo", "fuzz", subcommand])
        .args(FUZZ_BUILD_OPTIONS)
        .env("AYA_BUILD_SKIP", "1");
    cmd
}

/// Installs cargo-fuzz for the nightly toolchain unless it is there.
///
/// # Errors
/// When `cargo install` fails.
fn install_cargo_fuzz() -> anyhow::Result<()> {
    let present = Command::new("rustup")
        .args(["run", "nightly", "cargo", "fuzz", "--version"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if present {
        return Ok(());
    }
    step(
        "installing cargo-fuzz (cargo install cargo-fuzz --locked; a few minutes, once per machine)",
    );
    sh(cargo().args(["install", "cargo-fuzz", "--locked"]))
}

/// The fuzz targets' build, running in the background at a lower priority while the kernel
/// matrix's guests run: qemu's TCG guest (`-smp 1`) keeps one core busy, and the build takes
/// several minutes of compiling that the other core would otherwise spend idle. Its output goes
/// to a log file, shown when it fails.
struct FuzzBuild {
    child: Child,
    log: PathBuf,
    started: Instant,
}

impl FuzzBuild {
    /// Installs cargo-fuzz if it is missing, then starts `nice -n 10 cargo fuzz build` (every
    /// target); `None` (the targets are then built in the foreground by [`fuzz`]) when either
    /// fails.
    fn start() -> Option<Self> {
        if let Err(e) = install_cargo_fuzz() {
            eprintln!("    not building the fuzz targets in the background: {e:#}");
            return None;
        }
        let log = crate::target_dir().join("fuzz-build.log");
        let file = fs::create_dir_all(crate::target_dir())
            .and_then(|()| fs::File::create(&log))
            .and_then(|f| Ok((f.try_clone()?, f)));
        let (out, err) = match file {
            Ok(files) => files,
            Err(e) => {
                eprintln!(
                    "    not building the fuzz targets in the background: {}: {e}",
                    log.display()
                );
                return None;
            }
        };
        let fuzz = cargo_fuzz("build");
        let mut cmd = Command::new("nice");
        cmd.args(["-n", "10"])
            .arg(fuzz.get_program())
            .args(fuzz.get_args())
            .envs(fuzz.get_envs().filter_map(|(k, v)| Some((k, v?))))
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err);
        step(&format!(
            "building the fuzz targets in the background while the guests run (nice 10; output in {})",
            log.display()
        ));
        eprintln!("    $ {}", display(&cmd));
        match cmd.spawn() {
            Ok(child) => Some(Self {
                child,
                log,
                started: Instant::now(),
            }),
            Err(e) => {
                eprintln!("    not building the fuzz targets in the background: {e}");
                None
            }
        }
    }

    /// Waits for the build; an error with the log's tail when it failed.
    fn wait(mut self) -> anyhow::Result<()> {
        step("waiting for the fuzz targets' background build");
        let waiting = Instant::now();
        let status = self.child.wait().context("waiting for cargo fuzz build")?;
        if status.success() {
            let (since_start, waited) = (
                self.started.elapsed().as_secs(),
                waiting.elapsed().as_secs(),
            );
            eprintln!(
                "    done {}:{:02} after it started, after a wait of {}:{:02}",
                since_start / 60,
                since_start % 60,
                waited / 60,
                waited % 60
            );
            return Ok(());
        }
        let text = fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        for line in lines.iter().skip(lines.len().saturating_sub(40)) {
            eprintln!("    | {line}");
        }
        bail!(
            "cargo fuzz build failed ({status}); its output: {}",
            self.log.display()
        )
    }
}

impl Drop for FuzzBuild {
    /// A build nobody waited for (an error or a panic on the way) is stopped, not left running.
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Runs every fuzz target for [`FUZZ_SECONDS`] with the nightly toolchain, installing cargo-fuzz
/// first when it is missing; with `built`, after that background build has finished (a failed
/// build is one failure, and nothing runs).
fn fuzz(t: &mut Tally, built: Option<FuzzBuild>) {
    if let Some(build) = built {
        if let Err(e) = build.wait() {
            eprintln!("    FAILED: {e:#}");
            t.fail(format!("building the fuzz targets: {e:#}"));
            return;
        }
    } else if let Err(e) = install_cargo_fuzz() {
        t.fail(format!("installing cargo-fuzz: {e:#}"));
        return;
    }
    for target in FUZZ_TARGETS {
        t.check(
            &format!(
                "fuzzing {target} for {FUZZ_SECONDS} s (cargo +nightly fuzz run, no sanitizer)"
            ),
            cargo_fuzz("run")
                .args([target, "--"])
                .arg(format!("-max_total_time={FUZZ_SECONDS}")),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::{Counts, Summary, parse_result, total_line};

    #[test]
    fn parses_libtest_summaries() {
        assert_eq!(
            parse_result(
                "test result: ok. 12 passed; 0 failed; 1 ignored; 0 measured; 0 filtered out; finished in 0.01s"
            ),
            Some(Summary {
                passed: 12,
                failed: 0,
                ignored: 1
            })
        );
        assert_eq!(
            parse_result(
                "test result: FAILED. 3 passed; 2 failed; 0 ignored; 0 measured; 0 filtered out"
            ),
            Some(Summary {
                passed: 3,
                failed: 2,
                ignored: 0
            })
        );
        assert_eq!(parse_result("running 3 tests"), None);
    }

    fn count(output: &str) -> Counts {
        let mut c = Counts::default();
        for line in output.lines() {
            c.line(line);
        }
        c
    }

    /// What a privileged suite prints without root under `DOOR_SKIP_PRIVILEGED=1` (two of its
    /// tests skip themselves, one needs no root), then a binary with an ignored test.
    const UNPRIVILEGED_RUN: &str = "
running 3 tests
test ipv4_syn_increments_exactly_its_slash_32 ... 
door-test: skipped (needs root): bpf_test_run ipv4_syn_increments_exactly_its_slash_32
ok
test ipv6_syn_increments_its_slash_64 ... 
door-test: skipped (needs root): bpf_test_run ipv6_syn_increments_its_slash_64
ok
test builds_frames ... ok

test result: ok. 3 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.00s

running 2 tests
test a ... ok
test b ... ignored

test result: ok. 1 passed; 0 failed; 1 ignored; 0 measured; 0 filtered out; finished in 0.00s
";

    #[test]
    fn tests_that_skip_themselves_are_skipped_not_passed() {
        let c = count(UNPRIVILEGED_RUN);
        assert_eq!((c.passed, c.failed, c.skipped), (2, 0, 3));
    }

    #[test]
    fn a_test_marked_twice_is_skipped_once_and_markers_stay_in_their_binary() {
        let c = count(
            "running 1 test
door-test: skipped (needs root): xdp_shield observing_never_drops
door-test: skipped (needs root): xdp_shield observing_never_drops
test observing_never_drops ... ok
test result: ok. 1 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out
running 2 tests
door-test: skipped (needs root): netns_e2e crashed_before_its_result_line
running 2 tests
test x ... ok
test y ... ok
test result: ok. 2 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out
",
        );
        assert_eq!((c.passed, c.failed, c.skipped), (2, 0, 1));
    }

    #[test]
    fn the_total_line_is_passed_failed_skipped() {
        assert_eq!(
            total_line(277, 0, 12),
            "xtask: 277 passed, 0 failed, 12 skipped"
        );
    }
}
