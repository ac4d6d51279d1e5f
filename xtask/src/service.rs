//! Checks of `packaging/door.service`: `systemd-analyze verify` (syntax, directives, the binaries
//! it runs) and `systemd-analyze security` (the sandbox's exposure score stays low).

use std::{path::Path, process::Command};

use anyhow::{Context as _, bail};

use crate::{setup, sh, step};

/// The unit, as shipped in the Debian package.
pub(crate) const UNIT: &str = "packaging/door.service";
/// Where the unit runs door from; the check rewrites it to the binary just built.
const INSTALLED_BIN: &str = "/usr/bin/door";
/// Highest `systemd-analyze security` exposure accepted, in tenths (2.0 = "OK"; the unit scores
/// 1.7 with systemd 252: what is left is what an XDP-loading network daemon needs).
const MAX_EXPOSURE: &str = "20";

/// Verifies a copy of the unit that runs door's debug binary, and checks its exposure score. The
/// binary is the one `cargo test --workspace` built for door-daemon's integration tests, which
/// `cargo xtask test` runs first: it is checked for again here (`cargo test --no-run`, at once
/// when it is up to date), not built with `cargo build`, whose features differ (tokio's
/// `test-util`, a dev-dependency feature) and would rebuild 67 crates.
pub(crate) fn check() -> anyhow::Result<()> {
    step("systemd unit: systemd-analyze verify and security (packaging/door.service)");
    setup::require_debian_packages(&["systemd"])?;
    sh(crate::daemon_tests().arg("--no-run"))?;
    let door = crate::target_dir().join("debug/door");
    let door = door
        .canonicalize()
        .with_context(|| format!("the door binary just built: {}", door.display()))?;
    let dir = std::env::temp_dir().join(format!("door-unit-check-{}", std::process::id()));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let result = verify_in(&dir, &door);
    let _ = std::fs::remove_dir_all(&dir);
    result
}

fn verify_in(dir: &Path, door: &Path) -> anyhow::Result<()> {
    let unit = std::fs::read_to_string(UNIT).with_context(|| format!("reading {UNIT}"))?;
    if !unit.contains(INSTALLED_BIN) {
        bail!("{UNIT} does not run {INSTALLED_BIN}");
    }
    let copy = dir.join("door.service");
    let door = door.to_str().context("a UTF-8 path to door")?;
    std::fs::write(&copy, unit.replace(INSTALLED_BIN, door))
        .with_context(|| format!("writing {}", copy.display()))?;
    eprintln!("    (a copy of {UNIT} with {INSTALLED_BIN} -> {door})");
    // verify prints its findings and exits non-zero on errors; warnings on stderr fail too.
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .arg(&copy)
        .output()
        .context("running systemd-analyze verify")?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprint!("{stderr}");
    if !out.status.success() || !stderr.trim().is_empty() {
        bail!("systemd-analyze verify {UNIT}: {}", out.status);
    }
    eprintln!("    verify: clean");
    // security prints a table of ~80 checks: show what is left exposed and the score.
    let out = Command::new("systemd-analyze")
        .args([
            "security",
            "--offline=true",
            &format!("--threshold={MAX_EXPOSURE}"),
        ])
        .arg(&copy)
        .output()
        .context("running systemd-analyze security")?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    for line in stdout.lines() {
        if line.starts_with('✗') || line.contains("Overall exposure") {
            eprintln!("    {}", line.trim_end());
        }
    }
    eprint!("{}", String::from_utf8_lossy(&out.stderr));
    if !out.status.success() {
        bail!(
            "systemd-analyze security {UNIT}: exposure above {MAX_EXPOSURE} tenths ({})",
            out.status
        );
    }
    Ok(())
}
