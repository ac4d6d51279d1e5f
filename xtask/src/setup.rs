//! Installs what a fresh Debian 12 machine lacks, idempotently: the nightly toolchain's
//! `rust-src` and `bpf-linker` 0.10.0 (which uses the nightly's own LLVM; 0.11+ wants a system
//! LLVM 23) to build the XDP program, and the Debian packages the suites use.

use std::process::Command;

use anyhow::{Context as _, bail};

use crate::{Skipped, cargo, sh, step};

/// The bpf-linker release that uses the nightly toolchain's own LLVM (newer ones want a system
/// LLVM this machine does not have).
const BPF_LINKER_VERSION: &str = "0.10.0";

/// Debian packages the test suites and the demo use: `ip` (netns, veth), curl (the e2e client),
/// nginx and HAProxy (the real proxies door runs behind in `tests/tests/proxies_e2e.rs`), Redis
/// (the store three in-process doors share in `door-daemon/tests/cluster.rs`), Prometheus and its
/// `promtool` (scraping door's `GET /metrics` in `tests/tests/prometheus_scrape.rs`).
pub(crate) const DEBIAN_PACKAGES: &[&str] = &[
    "iproute2",
    "curl",
    "nginx-light",
    "haproxy",
    "redis-server",
    "prometheus",
];

/// Debian packages `cargo xtask bench proxy` uses: the load tools (`wrk`; `h2load` from
/// nghttp2-client), nginx (the upstream and a peer) and HAProxy (the other peer); curl checks
/// each route before the load.
pub(crate) const BENCH_PROXY_PACKAGES: &[&str] =
    &["wrk", "nghttp2-client", "nginx-light", "haproxy", "curl"];

/// Everything: toolchain pieces, then Debian packages. Returns the packages still missing (only
/// when not root: nothing is installed then).
pub(crate) fn all() -> anyhow::Result<Vec<&'static str>> {
    toolchain()?;
    debian_packages(DEBIAN_PACKAGES)
}

/// The nightly toolchain's `rust-src` and `bpf-linker`, needed to build the XDP program.
pub(crate) fn toolchain() -> anyhow::Result<()> {
    step("checking the eBPF toolchain (nightly rust-src, bpf-linker)");
    let installed = output(Command::new("rustup").args([
        "component",
        "list",
        "--toolchain",
        "nightly",
        "--installed",
    ]))
    .context("rustup is needed to build the XDP program with the nightly toolchain")?;
    if installed.lines().any(|l| l.starts_with("rust-src")) {
        eprintln!("    nightly rust-src: present");
    } else {
        eprintln!("    nightly rust-src: installing (a few seconds)");
        sh(Command::new("rustup").args([
            "component",
            "add",
            "rust-src",
            "--toolchain",
            "nightly",
        ]))?;
    }
    let version = output(Command::new("bpf-linker").arg("--version")).unwrap_or_default();
    if version.contains(BPF_LINKER_VERSION) {
        eprintln!("    bpf-linker {BPF_LINKER_VERSION}: present");
    } else {
        eprintln!(
            "    bpf-linker {BPF_LINKER_VERSION}: installing with cargo install (about 5 minutes, once per machine; cargo shows its progress)"
        );
        sh(cargo().args([
            "install",
            &format!("bpf-linker@{BPF_LINKER_VERSION}"),
            "--locked",
        ]))?;
    }
    Ok(())
}

/// Installs the missing ones of `packages` with apt-get as root, and returns none. Not root, it
/// installs nothing: it says what is missing and how to install it, and returns those, for the
/// caller to skip what needs them.
///
/// # Errors
/// When apt-get fails.
pub(crate) fn debian_packages<'a>(packages: &[&'a str]) -> anyhow::Result<Vec<&'a str>> {
    step("checking Debian packages");
    let missing: Vec<&str> = packages
        .iter()
        .copied()
        .filter(|p| {
            !output(Command::new("dpkg-query").args(["-W", "-f=${Status}", p]))
                .is_ok_and(|s| s.contains("install ok installed"))
        })
        .collect();
    if missing.is_empty() {
        eprintln!("    present: {}", packages.join(" "));
        return Ok(missing);
    }
    if !is_root() {
        eprintln!(
            "    missing: {0} (not root, so not installed; as root: apt-get install -y {0})",
            missing.join(" ")
        );
        return Ok(missing);
    }
    eprintln!("    installing: {}", missing.join(" "));
    sh(Command::new("apt-get").arg("update").arg("-q"))?;
    sh(Command::new("apt-get")
        .args(["install", "-y", "-q", "--no-install-recommends"])
        .args(&missing)
        .env("DEBIAN_FRONTEND", "noninteractive"))?;
    Ok(Vec::new())
}

/// As [`debian_packages`], for a caller that cannot do without them: a [`Skipped`] error when
/// one is missing and this process may not install it.
///
/// # Errors
/// When apt-get fails, or (as [`Skipped`]) when a package is missing and this is not root.
pub(crate) fn require_debian_packages(packages: &[&str]) -> anyhow::Result<()> {
    let missing = debian_packages(packages)?;
    if missing.is_empty() {
        return Ok(());
    }
    Err(Skipped(format!(
        "missing Debian packages {0} (install them as root: apt-get install -y {0})",
        missing.join(" ")
    ))
    .into())
}

/// Whether this process runs as root (`id -u` is 0).
pub(crate) fn is_root() -> bool {
    output(Command::new("id").arg("-u")).is_ok_and(|s| s.trim() == "0")
}

fn output(cmd: &mut Command) -> anyhow::Result<String> {
    let out = cmd.output()?;
    if !out.status.success() {
        bail!("exit status {}", out.status);
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}
