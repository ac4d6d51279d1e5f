//! `cargo xtask deb`: the Debian package, built with cargo-deb from `[package.metadata.deb]` in
//! `door-daemon/Cargo.toml` (release build of door with its XDP program embedded, the systemd
//! unit, `/etc/door/door.toml` as a conffile, the docs), and its install test: `dpkg -i`, the
//! files and maintainer scripts checked, `door check-config` on the installed configuration (the
//! production template `packaging/door.toml`, not the demo of `examples/`), then `dpkg --purge`.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, bail, ensure};

use crate::{cargo, service, sh, step};

/// The cargo-deb release installed when missing: the newest one that builds on rustc 1.95
/// (its `rust-version` is 1.85).
const CARGO_DEB_VERSION: &str = "3.8.0";
/// The package's name (`[package.metadata.deb] name`).
const PACKAGE: &str = "door";
/// The configuration template the package installs as `/etc/door/door.toml` (relative to the
/// workspace root, where xtask runs).
const CONFIG_TEMPLATE: &str = "packaging/door.toml";

/// Installs cargo-deb if missing, then builds the package; returns the `.deb`'s path. With
/// `pgo`, door is built with profile-guided optimisation first ([`crate::pgo::build`]) and the
/// package takes that binary (cargo-deb's `--no-build`, in the optimised build's target
/// directory and triple); the package goes to that directory's `debian/`.
pub(crate) fn build(pgo: bool) -> anyhow::Result<PathBuf> {
    ensure_cargo_deb()?;
    let mut cmd = cargo();
    cmd.args(["deb", "--package", "door-daemon"]);
    if pgo {
        let built = crate::pgo::build()?;
        step("building the Debian package around door built with profile-guided optimisation");
        cmd.env("CARGO_TARGET_DIR", &built.target_dir).args([
            "--no-build",
            "--target",
            &built.host,
        ]);
    } else {
        step(
            "building the Debian package (release build of door with its XDP program; minutes the first time)",
        );
    }
    let out = cmd
        .stderr(std::process::Stdio::inherit())
        .output()
        .context("running cargo deb")?;
    if !out.status.success() {
        bail!("cargo deb failed ({})", out.status);
    }
    // cargo-deb prints the package's path as its last line of stdout.
    let stdout = String::from_utf8_lossy(&out.stdout);
    let deb = stdout
        .lines()
        .rev()
        .map(str::trim)
        .find(|l| {
            Path::new(l)
                .extension()
                .is_some_and(|e| e.eq_ignore_ascii_case("deb"))
        })
        .map(PathBuf::from)
        .context("cargo deb printed no .deb path")?;
    eprintln!("    built {}", deb.display());
    Ok(deb)
}

fn ensure_cargo_deb() -> anyhow::Result<()> {
    step("checking cargo-deb");
    let version = cargo()
        .args(["deb", "--version"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    if version.contains(CARGO_DEB_VERSION) {
        eprintln!("    cargo-deb {CARGO_DEB_VERSION}: present");
        return Ok(());
    }
    eprintln!(
        "    cargo-deb {CARGO_DEB_VERSION}: installing with cargo install --locked (builds it from \
         crates.io: about 3 minutes, once per machine; cargo shows its progress)"
    );
    sh(cargo().args([
        "install",
        &format!("cargo-deb@{CARGO_DEB_VERSION}"),
        "--locked",
    ]))
}

/// Builds the package, installs it with `dpkg -i`, checks what it installed and that the service
/// was neither enabled nor started, runs `door check-config` on the shipped configuration, and
/// purges it (also when a check fails). Root only; refuses to touch a `door` package that was
/// already installed. With `pgo`, the package of [`build`]'s `pgo`.
pub(crate) fn install_test(pgo: bool) -> anyhow::Result<()> {
    let deb = build(pgo)?;
    step("Debian package: dpkg -i, checks, dpkg --purge");
    if installed_status().contains("install ok installed") {
        bail!(
            "a {PACKAGE} package is already installed on this machine: not replacing it (remove \
             it with `dpkg --purge {PACKAGE}` to run this test)"
        );
    }
    let purge = Purge;
    sh(Command::new("dpkg").arg("-i").arg(&deb))?;
    checks_installed()?;
    drop(purge);
    ensure!(
        !Path::new("/usr/bin/door").exists() && !Path::new("/etc/door/door.toml").exists(),
        "dpkg --purge left /usr/bin/door or /etc/door/door.toml behind"
    );
    eprintln!("    purged: /usr/bin/door and /etc/door/door.toml are gone");
    Ok(())
}

fn checks_installed() -> anyhow::Result<()> {
    let files = text(Command::new("dpkg").args(["-L", PACKAGE]))?;
    for f in [
        "/usr/bin/door",
        "/usr/lib/systemd/system/door.service",
        "/etc/door/door.toml",
        "/usr/share/doc/door/operations.md",
        "/usr/share/doc/door/configuration.md",
        "/usr/share/doc/door/troubleshooting.md",
        "/usr/share/doc/door/design.md",
        "/usr/share/doc/door/decisions.md",
        "/usr/share/doc/door/performance.md",
        "/usr/share/doc/door/performance-history.md",
        "/usr/share/doc/door/README.md",
        "/usr/share/doc/door/grafana/door.json",
    ] {
        ensure!(
            files.lines().any(|l| l == f),
            "the package does not ship {f}:\n{files}"
        );
    }
    // Debian 12 has a merged /usr: the unit is also /lib/systemd/system/door.service.
    let unit = std::fs::read_to_string("/lib/systemd/system/door.service")
        .context("reading /lib/systemd/system/door.service")?;
    let shipped = std::fs::read_to_string(service::UNIT)?;
    ensure!(
        unit == shipped,
        "the installed unit differs from {}",
        service::UNIT
    );
    let config =
        std::fs::read_to_string("/etc/door/door.toml").context("reading /etc/door/door.toml")?;
    let template = std::fs::read_to_string(CONFIG_TEMPLATE)
        .with_context(|| format!("reading {CONFIG_TEMPLATE}"))?;
    ensure!(
        config == template,
        "the installed /etc/door/door.toml differs from {CONFIG_TEMPLATE} (one kept from an \
         earlier install? `dpkg --purge {PACKAGE}` removes it)"
    );
    let conffiles = text(Command::new("dpkg-query").args(["-W", "-f=${Conffiles}", PACKAGE]))?;
    ensure!(
        conffiles.contains("/etc/door/door.toml"),
        "/etc/door/door.toml is not a conffile: {conffiles:?}"
    );
    ensure!(
        !Path::new("/etc/systemd/system/multi-user.target.wants/door.service").exists(),
        "installing the package enabled door.service; it must wait to be configured"
    );
    eprintln!(
        "    files, conffile (packaging/door.toml) and unit as expected; door.service not enabled"
    );
    let check = Command::new("/usr/bin/door")
        .args(["check-config", "--config", "/etc/door/door.toml"])
        .env_remove("DOOR_CONFIG")
        .output()
        .context("running /usr/bin/door check-config")?;
    let stdout = String::from_utf8_lossy(&check.stdout);
    ensure!(
        check.status.success() && stdout.contains("# configuration OK"),
        "door check-config --config /etc/door/door.toml: {}\n{stdout}{}",
        check.status,
        String::from_utf8_lossy(&check.stderr)
    );
    eprintln!("    /usr/bin/door check-config --config /etc/door/door.toml: OK");
    let door = std::fs::read("/usr/bin/door").context("reading /usr/bin/door")?;
    ensure!(
        embeds_bpf_object(&door),
        "/usr/bin/door carries no eBPF object: built with AYA_BUILD_SKIP=1?"
    );
    eprintln!("    /usr/bin/door embeds its XDP program (an EM_BPF ELF object)");
    let version = text(Command::new("/usr/bin/door").arg("--version"))?;
    eprintln!("    {}", version.trim());
    Ok(())
}

/// Whether `binary` contains an ELF object for the BPF machine (`e_machine` = EM_BPF, 247): the
/// XDP program `build.rs` embeds.
fn embeds_bpf_object(binary: &[u8]) -> bool {
    const EM_BPF: [u8; 2] = 247u16.to_le_bytes();
    binary
        .windows(20)
        .any(|w| w.starts_with(b"\x7fELF") && w.get(18..20) == Some(EM_BPF.as_slice()))
}

/// `dpkg --purge door` on drop, so a failed check leaves nothing installed.
struct Purge;

impl Drop for Purge {
    fn drop(&mut self) {
        eprintln!("    $ dpkg --purge {PACKAGE}");
        match Command::new("dpkg").args(["--purge", PACKAGE]).status() {
            Ok(s) if s.success() => {}
            Ok(s) => eprintln!("    dpkg --purge {PACKAGE} failed ({s}): remove it by hand"),
            Err(e) => eprintln!("    dpkg --purge {PACKAGE}: {e}: remove it by hand"),
        }
    }
}

fn installed_status() -> String {
    text(Command::new("dpkg-query").args(["-W", "-f=${Status}", PACKAGE])).unwrap_or_default()
}

fn text(cmd: &mut Command) -> anyhow::Result<String> {
    let out = cmd
        .output()
        .with_context(|| format!("running {}", crate::display(cmd)))?;
    ensure!(
        out.status.success(),
        "{} failed ({})",
        crate::display(cmd),
        out.status
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

#[cfg(test)]
mod tests {
    use super::embeds_bpf_object;

    #[test]
    fn finds_an_embedded_bpf_object() {
        let mut elf = vec![0u8; 64];
        elf[..4].copy_from_slice(b"\x7fELF");
        elf[18] = 247;
        let mut binary = b"host code".to_vec();
        binary.extend_from_slice(&elf);
        assert!(embeds_bpf_object(&binary));
        elf[18] = 62; // EM_X86_64
        assert!(!embeds_bpf_object(&elf));
        assert!(!embeds_bpf_object(b"short"));
    }
}
