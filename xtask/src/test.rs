//! `cargo xtask test`: every check and suite, in order, each said before it runs; the run goes on
//! after a failure so one report shows everything, and ends with the totals.

use std::{
    io::{BufRead as _, BufReader},
    process::{Command, Stdio},
};

use anyhow::{Context as _, bail};

use crate::{cargo, deb, display, service, setup, sh, step, vm};

/// Totals over every `cargo test` run (from libtest's `test result:` lines) and every check.
#[derive(Debug, Default)]
struct Tally {
    passed: u64,
    failed: u64,
    failures: Vec<String>,
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

    /// Runs `cargo test …`, echoing its output and adding up its `test result:` lines.
    fn suite(&mut self, name: &str, cmd: &mut Command) -> anyhow::Result<()> {
        step(name);
        eprintln!("    $ {}", display(cmd));
        let mut child = cmd
            .stdout(Stdio::piped())
            .spawn()
            .with_context(|| display(cmd))?;
        let stdout = child.stdout.take().context("piped stdout")?;
        let mut saw_result = false;
        for line in BufReader::new(stdout).lines() {
            let line = line?;
            println!("{line}");
            if let Some((passed, failed)) = parse_result(&line) {
                saw_result = true;
                self.passed += passed;
                self.failed += failed;
            }
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

    /// Runs a check written in Rust (systemd unit, Debian package): one pass or one failure.
    fn task(&mut self, name: &str, f: impl FnOnce() -> anyhow::Result<()>) {
        if let Err(e) = f() {
            eprintln!("    FAILED: {e:#}");
            self.fail(format!("{name}: {e:#}"));
        } else {
            self.passed += 1;
        }
    }

    fn fail(&mut self, what: String) {
        self.failed += 1;
        self.failures.push(what);
    }
}

/// Parses libtest's `test result: ok. 12 passed; 0 failed; …` into (passed, failed).
pub(crate) fn parse_result(line: &str) -> Option<(u64, u64)> {
    let rest = line.trim().strip_prefix("test result: ")?;
    let mut passed = None;
    let mut failed = None;
    for part in rest.split([';', '.']) {
        let mut words = part.split_whitespace();
        if let (Some(n), Some(what)) = (words.next(), words.next()) {
            match what {
                "passed" => passed = n.parse().ok(),
                "failed" => failed = n.parse().ok(),
                _ => {}
            }
        }
    }
    Some((passed?, failed?))
}

/// Runs everything; with `kernels`, the privileged suites also run inside a guest per kernel.
pub(crate) fn all(kernels: Option<&[String]>) -> anyhow::Result<()> {
    setup::all()?;
    let mut t = Tally::default();
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
    t.suite(
        "unit, property and daemon tests",
        cargo().args(["test", "--workspace", "--exclude", "door-tests"]),
    )?;
    fuzz(&mut t);
    // The netns suite starts the `door` binary next to its own executable: build it, since
    // `cargo test` builds a package's binaries only for that package's own integration tests.
    t.check(
        "building door for the netns suite",
        cargo().args(["build", "--package", "door-daemon", "--bin", "door"]),
    );
    let mut privileged = cargo();
    privileged.args(["test", "--package", "door-tests", "--", "--test-threads=1"]);
    if setup::is_root() {
        t.suite(
            "privileged suites: BPF_PROG_TEST_RUN and netns/veth (root)",
            &mut privileged,
        )?;
    } else {
        eprintln!("\n==> privileged suites SKIPPED: not root (CI runs them as root)");
        privileged.env("DOOR_SKIP_PRIVILEGED", "1");
        t.suite("privileged suites (skipping without root)", &mut privileged)?;
    }
    t.task("systemd unit", service::check);
    if setup::is_root() {
        t.task("Debian package", deb::install_test);
    } else {
        eprintln!("\n==> Debian package install test SKIPPED: not root (dpkg -i needs it)");
    }
    if let Some(kernels) = kernels {
        t.vm(kernels);
    }
    t.finish()
}

/// Only the privileged suites inside the guests (`cargo xtask test --vm`).
pub(crate) fn vm_only(kernels: &[String]) -> anyhow::Result<()> {
    let mut t = Tally::default();
    t.vm(kernels);
    t.finish()
}

impl Tally {
    /// The VM matrix: one result per kernel, added to the totals; a failed preparation (no
    /// network for the kernels, a build error) is one failure.
    fn vm(&mut self, kernels: &[String]) {
        step(&format!(
            "privileged suites inside qemu guests: kernels {}",
            kernels.join(", ")
        ));
        match vm::test(kernels) {
            Ok(results) => {
                for r in results {
                    self.passed += r.passed;
                    self.failed += r.failed;
                    self.failures.extend(
                        r.failures
                            .into_iter()
                            .map(|f| format!("{}: {f}", r.release)),
                    );
                }
            }
            Err(e) => self.fail(format!("VM matrix: {e:#}")),
        }
    }

    /// Prints the failures and the total line; an error when anything failed.
    fn finish(&self) -> anyhow::Result<()> {
        eprintln!();
        for f in &self.failures {
            eprintln!("FAILED: {f}");
        }
        println!("xtask: {} passed, {} failed", self.passed, self.failed);
        if self.failed > 0 || !self.failures.is_empty() {
            bail!("{} failed", self.failures.len().max(1));
        }
        Ok(())
    }
}

/// The cargo-fuzz targets (`fuzz/`), each run briefly.
const FUZZ_TARGETS: &[&str] = &["client_key", "proxy_protocol"];
/// Seconds each fuzz target runs (libFuzzer's `-max_total_time`).
const FUZZ_SECONDS: u32 = 20;

/// Runs every fuzz target for [`FUZZ_SECONDS`] with the nightly toolchain, installing cargo-fuzz
/// first when it is missing. `AYA_BUILD_SKIP=1`: the targets do not need the XDP program.
fn fuzz(t: &mut Tally) {
    let present = Command::new("rustup")
        .args(["run", "nightly", "cargo", "fuzz", "--version"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !present {
        step(
            "installing cargo-fuzz (cargo install cargo-fuzz --locked; a few minutes, once per machine)",
        );
        if let Err(e) = sh(cargo().args(["install", "cargo-fuzz", "--locked"])) {
            t.fail(format!("installing cargo-fuzz: {e:#}"));
            return;
        }
    }
    for target in FUZZ_TARGETS {
        t.check(
            &format!("fuzzing {target} for {FUZZ_SECONDS} s (cargo +nightly fuzz run)"),
            Command::new("rustup")
                .args(["run", "nightly", "cargo", "fuzz", "run", target, "--"])
                .arg(format!("-max_total_time={FUZZ_SECONDS}"))
                .env("AYA_BUILD_SKIP", "1"),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::parse_result;

    #[test]
    fn parses_libtest_summaries() {
        assert_eq!(
            parse_result(
                "test result: ok. 12 passed; 0 failed; 1 ignored; 0 measured; 0 filtered out; finished in 0.01s"
            ),
            Some((12, 0))
        );
        assert_eq!(
            parse_result(
                "test result: FAILED. 3 passed; 2 failed; 0 ignored; 0 measured; 0 filtered out"
            ),
            Some((3, 2))
        );
        assert_eq!(parse_result("running 3 tests"), None);
    }
}
