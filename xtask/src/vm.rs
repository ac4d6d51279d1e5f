//! door's privileged suites inside Debian's own kernels (`cargo xtask test --vm`) and the demo in
//! a guest (`cargo xtask run --vm KERNEL`), under `qemu-system-x86_64 -accel tcg`
//! (software emulation: on the machines door is built on, `/dev/kvm` is a variant that cannot run
//! stock kernels, hanging or failing with "emulation failure", so KVM is never selected just
//! because `/dev/kvm` exists).
//!
//! Steps, each announced: install what is missing (qemu from bookworm-backports, busybox-static,
//! cpio, xz-utils, zstd, the musl target); fetch each kernel from Debian's archive through its
//! metapackage and cache its `vmlinux` and `veth.ko` under `target/vm/kernels/`; build the guest
//! binaries (the `guest` profile: optimised, without LTO; static musl); pack one initramfs per
//! kernel (busybox, Debian's `ip` and `curl` with their libraries, the binaries, an `/init`); boot the kernels one after another,
//! streaming the guest's console with a `[6.1]`-style prefix. The guest writes its status to the
//! `isa-debug-exit` port 0xf4 (qemu exits 1 = pass, 3 = fail); anything else (a panic, a hang past
//! the timeout) is a failure, reported with the log's tail.

use std::{
    collections::BTreeMap,
    fmt::Write as _,
    fs,
    io::{BufRead as _, BufReader, Read as _, Write as _},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::mpsc,
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};

use crate::{Skipped, cargo, display, setup, sh, step, test::Counts};

/// The kernels `cargo xtask test` boots by default: bookworm's own and its backported LTS.
pub(crate) const DEFAULT_KERNELS: [&str; 2] = ["6.1", "6.12"];

/// The guest binaries' target: static, so the initramfs needs no libc for them.
const MUSL: &str = "x86_64-unknown-linux-musl";
/// The cargo profile the guest binaries are built with (the workspace's `Cargo.toml`).
const GUEST_PROFILE: &str = "guest";

/// Bound on one guest's whole test run (boot, both suites) under emulation; a run takes about a
/// minute on a quiet host and past six on a busy one (tcg shares its cores), so this only ends
/// hangs.
const TEST_TIMEOUT: Duration = Duration::from_mins(12);

/// Bound on the `run --vm` demo.
const RUN_TIMEOUT: Duration = Duration::from_mins(4);

/// The `door-tests` suites the guests run: those that exercise the XDP program on the kernel
/// (`netns_streams`: a WebSocket's 1 MiB and an event stream through door with XDP on the veth;
/// `xdp_syn_cookie`: the SYN cookie answer against the guest kernel's own listeners;
/// `netns_syn_cookies`: clients served through a spoofed flood answered with cookies).
const GUEST_SUITES: [&str; 7] = [
    "bpf_test_run",
    "xdp_shield",
    "xdp_syn_cookie",
    "netns_e2e",
    "netns_flood",
    "netns_streams",
    "netns_syn_cookies",
];

/// Lines of the guest's log shown again when it crashed or hung.
const TAIL_LINES: usize = 40;

/// Debian packages the VM runs need besides qemu (which comes from backports). `musl-tools`
/// provides `x86_64-linux-musl-gcc`, which crates with C parts (ring, under rustls) need to build
/// the static guest binaries.
const VM_PACKAGES: &[&str] = &[
    "busybox-static",
    "musl-tools",
    "cpio",
    "xz-utils",
    "zstd",
    "iproute2",
    "curl",
];

/// What one kernel's guest reported.
#[derive(Debug)]
pub(crate) struct KernelResult {
    /// The kernel's exact release (`uname -r`), e.g. `6.1.0-41-amd64`.
    pub(crate) release: String,
    /// Tests passed, from libtest's `test result:` lines.
    pub(crate) passed: u64,
    /// Tests failed, plus one per suite binary or guest that failed without saying how many.
    pub(crate) failed: u64,
    /// Tests that did not run (skipped themselves, or ignored), as [`Counts`] has them.
    pub(crate) skipped: u64,
    /// What went wrong, for the summary.
    pub(crate) failures: Vec<String>,
    /// Wall time of the boot.
    pub(crate) elapsed: Duration,
}

/// Runs both privileged suites in a guest per kernel in `kernels` (short names: `6.1`, `6.12`),
/// one after another, and prints one result line per kernel and the totals. `before_boot` runs
/// once the guest binaries are built, before the first guest boots (the guests keep one core
/// busy: `cargo xtask test` builds the fuzz targets beside them).
///
/// # Errors
/// When the preparation fails (packages, downloads, builds); failures inside guests are results.
pub(crate) fn test(
    kernels: &[String],
    before_boot: impl FnOnce(),
) -> anyhow::Result<Vec<KernelResult>> {
    let start = Instant::now();
    prerequisites()?;
    let fetched = kernels
        .iter()
        .map(|k| fetch_kernel(k))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let bins = build_guest_binaries(true)?;
    before_boot();
    let mut results = Vec::new();
    for kernel in &fetched {
        let image = pack_initramfs(kernel, &bins, &Mode::Test)?;
        step(&format!(
            "booting {} under qemu (tcg): both privileged suites, at most {}s",
            kernel.release,
            TEST_TIMEOUT.as_secs()
        ));
        let boot = boot(kernel, &image, TEST_TIMEOUT)?;
        results.push(judge_tests(kernel, &boot));
    }
    eprintln!();
    for r in &results {
        for f in &r.failures {
            eprintln!("FAILED: {}: {f}", r.release);
        }
    }
    for r in &results {
        println!(
            "{}: {} passed, {} failed, {} skipped ({:.0?})",
            r.release, r.passed, r.failed, r.skipped, r.elapsed
        );
    }
    let (passed, failed, skipped) = results.iter().fold((0, 0, 0), |(p, f, s), r| {
        (p + r.passed, f + r.failed, s + r.skipped)
    });
    println!(
        "vm: {passed} passed, {failed} failed, {skipped} skipped ({} kernels, {:.0?} in all)",
        results.len(),
        start.elapsed()
    );
    Ok(results)
}

/// Boots `kernel` (short name) with door, the demo upstream and a client namespace inside, runs a
/// short scripted client (a legitimate client, a burst over the link budget, a one-address SYN
/// flood) and prints what door's `GET /status` says.
///
/// # Errors
/// When preparing fails, or the guest crashes, hangs or reports a failed step.
pub(crate) fn run(kernel: &str) -> anyhow::Result<()> {
    prerequisites()?;
    let kernel = fetch_kernel(kernel)?;
    let bins = build_guest_binaries(false)?;
    let image = pack_initramfs(&kernel, &bins, &Mode::Demo)?;
    step(&format!(
        "booting {} under qemu (tcg): door, the demo upstream and a scripted client",
        kernel.release
    ));
    let boot = boot(&kernel, &image, RUN_TIMEOUT)?;
    match boot.guest_status() {
        Some(0) => {
            println!("{}: demo finished ({:.0?})", kernel.release, boot.elapsed);
            Ok(())
        }
        other => {
            show_tail(&boot);
            bail!(
                "{}: the demo failed: {}",
                kernel.release,
                describe(other, &boot)
            )
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Prerequisites

/// qemu from the backports suite (the image's qemu-utils is from there and conflicts with the
/// stable qemu-system-x86), the other Debian packages, and the musl target.
fn prerequisites() -> anyhow::Result<()> {
    step(
        "checking what the VM runs need (qemu-system-x86, busybox-static, musl-tools, cpio, xz, zstd, musl target)",
    );
    let mut missing = Vec::new();
    if installed("qemu-system-x86") {
        eprintln!("    qemu-system-x86: present");
    } else if !setup::is_root() {
        eprintln!("    qemu-system-x86: missing; not root, so not installed (from backports)");
        missing.push("qemu-system-x86");
    } else {
        let suite = format!("{}-backports", codename()?);
        let source = Path::new("/etc/apt/sources.list.d/door-backports.sources");
        let has_backports = fs::read_dir("/etc/apt/sources.list.d")
            .into_iter()
            .flatten()
            .flatten()
            .any(|e| fs::read_to_string(e.path()).is_ok_and(|s| s.contains(&suite)));
        if !has_backports {
            let mirror = debian_mirror();
            eprintln!(
                "    adding the {suite} apt source ({mirror}) in {}",
                source.display()
            );
            fs::write(
                source,
                format!(
                    "Types: deb\nURIs: {mirror}\nSuites: {suite}\nComponents: main\n\
                     Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n"
                ),
            )
            .with_context(|| format!("writing {}", source.display()))?;
        }
        eprintln!("    installing qemu-system-x86 from {suite} (about 30 s)");
        sh(Command::new("apt-get").args(["update", "-q"]))?;
        sh(Command::new("apt-get")
            .args([
                "install",
                "-y",
                "-q",
                "--no-install-recommends",
                "-t",
                &suite,
            ])
            .arg("qemu-system-x86")
            .env("DEBIAN_FRONTEND", "noninteractive"))?;
    }
    missing.extend(setup::debian_packages(VM_PACKAGES)?);
    if !missing.is_empty() {
        return Err(Skipped(format!(
            "the VM runs need {} (run this as root once to install them)",
            missing.join(" ")
        ))
        .into());
    }
    let targets = output(Command::new("rustup").args(["target", "list", "--installed"]))?;
    if targets.lines().any(|l| l.trim() == MUSL) {
        eprintln!("    rust target {MUSL}: present");
    } else {
        eprintln!("    rust target {MUSL}: installing (a few seconds)");
        sh(Command::new("rustup").args(["target", "add", MUSL]))?;
    }
    Ok(())
}

fn installed(package: &str) -> bool {
    output(Command::new("dpkg-query").args(["-W", "-f=${Status}", package]))
        .is_ok_and(|s| s.contains("install ok installed"))
}

/// This Debian's codename (`bookworm`), from /etc/os-release.
fn codename() -> anyhow::Result<String> {
    let text = fs::read_to_string("/etc/os-release").context("reading /etc/os-release")?;
    text.lines()
        .find_map(|l| l.strip_prefix("VERSION_CODENAME="))
        .map(|v| v.trim_matches('"').to_owned())
        .filter(|v| !v.is_empty())
        .context("no VERSION_CODENAME in /etc/os-release")
}

/// The Debian mirror apt already uses (the first non-security `URIs:`/`deb` entry).
fn debian_mirror() -> String {
    let mut texts: Vec<String> = fs::read_dir("/etc/apt/sources.list.d")
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| {
            e.path()
                .extension()
                .is_some_and(|x| x == "sources" || x == "list")
        })
        .filter_map(|e| fs::read_to_string(e.path()).ok())
        .collect();
    texts.extend(fs::read_to_string("/etc/apt/sources.list").ok());
    texts
        .iter()
        .flat_map(|t| t.lines())
        .filter_map(|l| {
            let l = l.trim();
            l.strip_prefix("URIs:")
                .and_then(|u| u.split_whitespace().next())
                .or_else(|| {
                    l.strip_prefix("deb ")
                        .and_then(|r| r.split_whitespace().find(|w| w.contains("://")))
                })
        })
        .find(|u| u.contains("debian") && !u.contains("security"))
        .map_or_else(|| "http://deb.debian.org/debian".to_owned(), str::to_owned)
}

// ---------------------------------------------------------------------------------------------
// Kernels

/// A kernel ready to boot.
#[derive(Debug)]
struct Kernel {
    /// The short name asked for (`6.1`), used as the log prefix.
    short: String,
    /// `uname -r` of the kernel, e.g. `6.1.0-41-amd64`.
    release: String,
    /// The uncompressed ELF kernel (qemu boots it through PVH).
    vmlinux: PathBuf,
    /// The veth module, uncompressed (busybox's `insmod` takes plain `.ko`).
    veth: PathBuf,
}

fn vm_dir() -> PathBuf {
    crate::target_dir().join("vm")
}

/// Resolves `short` (`6.1`) to Debian's current image package through the metapackages, and
/// downloads and unpacks it unless it is cached already.
fn fetch_kernel(short: &str) -> anyhow::Result<Kernel> {
    step(&format!("kernel {short}: resolving Debian's package"));
    let dir = vm_dir().join("kernels");
    let package = match resolve_package(short) {
        Ok(p) => p,
        Err(e) => {
            // Offline, or apt's lists are gone: a cached kernel of that series still serves.
            let cached = fs::read_dir(&dir)
                .into_iter()
                .flatten()
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with(&format!("linux-image-{short}.")))
                .max();
            let Some(p) = cached else { return Err(e) };
            eprintln!("    could not resolve ({e:#}); using the cached {p}");
            p
        }
    };
    let cache = dir.join(&package);
    let (vmlinux, veth, release_file) = (
        cache.join("vmlinux"),
        cache.join("veth.ko"),
        cache.join("release"),
    );
    if vmlinux.exists() && veth.exists() && release_file.exists() {
        let release = fs::read_to_string(&release_file)?.trim().to_owned();
        eprintln!("    {package}: cached in {}", cache.display());
        return Ok(Kernel {
            short: short.to_owned(),
            release,
            vmlinux,
            veth,
        });
    }
    fs::create_dir_all(&cache).with_context(|| format!("creating {}", cache.display()))?;
    eprintln!("    {package}: downloading (70 to 110 MB; apt shows its progress)");
    sh(Command::new("apt-get")
        .args(["download", "-q", &package])
        .current_dir(&cache))?;
    let deb = fs::read_dir(&cache)?
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|x| x == "deb"))
        .context("apt-get download left no .deb")?;
    // `dpkg-deb -x` of the whole package is 400 MB of modules; only two files are needed.
    eprintln!(
        "    unpacking the kernel image and the veth module from {}",
        deb.display()
    );
    let unpacked = cache.join("unpacked");
    fs::create_dir_all(&unpacked)?;
    sh(Command::new("sh").arg("-c").arg(format!(
        "dpkg-deb --fsys-tarfile '{}' | tar -x -C '{}' --wildcards './boot/vmlinuz-*' '*/kernel/drivers/net/veth.ko*'",
        deb.display(),
        unpacked.display()
    )))?;
    let bzimage = find_file(&unpacked.join("boot"), |n| n.starts_with("vmlinuz-"))?;
    let release = bzimage
        .file_name()
        .and_then(|n| n.to_str())
        .and_then(|n| n.strip_prefix("vmlinuz-"))
        .context("naming the kernel release")?
        .to_owned();
    eprintln!("    extracting vmlinux from the bzImage of {release}");
    let elf = extract_vmlinux(&fs::read(&bzimage)?)?;
    fs::write(&vmlinux, elf)?;
    let module = find_file(&unpacked.join("lib"), |n| n.starts_with("veth.ko"))
        .or_else(|_| find_file(&unpacked.join("usr/lib"), |n| n.starts_with("veth.ko")))
        .context("no veth module in the package")?;
    let raw = fs::read(&module)?;
    let plain = match module.extension().and_then(|x| x.to_str()) {
        Some("xz") => decompress(&["xz", "-dc"], &raw)?,
        Some("zst") => decompress(&["zstd", "-dc"], &raw)?,
        Some("gz") => decompress(&["gzip", "-dc"], &raw)?,
        _ => raw,
    };
    fs::write(&veth, plain)?;
    fs::write(&release_file, format!("{release}\n"))?;
    fs::remove_dir_all(&unpacked)?;
    fs::remove_file(&deb)?;
    eprintln!("    {release}: cached in {}", cache.display());
    Ok(Kernel {
        short: short.to_owned(),
        release,
        vmlinux,
        veth,
    })
}

/// `linux-image-6.12-amd64` → `linux-image-6.12.117+deb12-amd64`; for the release's default
/// series (6.1 on bookworm) the versioned metapackage does not exist and `linux-image-amd64`
/// points to it.
fn resolve_package(short: &str) -> anyhow::Result<String> {
    let wanted = format!("linux-image-{short}.");
    let metas = [
        format!("linux-image-{short}-amd64"),
        "linux-image-amd64".to_owned(),
    ];
    let mut updated = false;
    loop {
        for meta in &metas {
            let Ok(text) = output(Command::new("apt-cache").args(["depends", meta])) else {
                continue;
            };
            let found = text
                .lines()
                .filter_map(|l| l.trim().strip_prefix("Depends: "))
                .map(str::trim)
                .find(|d| d.starts_with(&wanted) && d.ends_with("-amd64"));
            if let Some(p) = found {
                eprintln!("    {meta} -> {p}");
                return Ok(p.to_owned());
            }
        }
        if updated || !setup::is_root() {
            bail!(
                "no Debian kernel package for {short} (tried {}): is it a series this release ships?",
                metas.join(", ")
            );
        }
        eprintln!("    not in apt's lists: apt-get update");
        sh(Command::new("apt-get").args(["update", "-q"]))?;
        updated = true;
    }
}

fn find_file(dir: &Path, matches: impl Fn(&str) -> bool + Copy) -> anyhow::Result<PathBuf> {
    for entry in fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let path = entry?.path();
        if path.is_dir() {
            if let Ok(p) = find_file(&path, matches) {
                return Ok(p);
            }
        } else if path
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(matches)
        {
            return Ok(path);
        }
    }
    bail!("not found under {}", dir.display())
}

/// The ELF kernel inside a bzImage: the payload starts at a compressor's magic (zstd on 6.12,
/// xz on 6.1, gzip on older configs); decompressing from there yields the ELF followed by
/// trailing bytes the tool complains about, so the tool's status is ignored and the ELF magic
/// checked instead.
fn extract_vmlinux(bzimage: &[u8]) -> anyhow::Result<Vec<u8>> {
    let formats: [(&[u8], &[&str]); 3] = [
        (&[0x28, 0xb5, 0x2f, 0xfd], &["zstd", "-dc"]),
        (&[0xfd, b'7', b'z', b'X', b'Z', 0], &["xz", "-dc"]),
        (&[0x1f, 0x8b, 0x08], &["gzip", "-dc"]),
    ];
    for (magic, tool) in formats {
        let mut from = 0;
        for _ in 0..4 {
            let Some(at) = bzimage
                .get(from..)
                .and_then(|rest| rest.windows(magic.len()).position(|w| w == magic))
            else {
                break;
            };
            let at = from + at;
            let out = decompress_lenient(tool, bzimage.get(at..).unwrap_or_default())?;
            if out.starts_with(b"\x7fELF") {
                return Ok(out);
            }
            from = at + 1;
        }
    }
    bail!("no compressed ELF kernel found in the bzImage")
}

/// Pipes `input` through `tool`, failing when it exits non-zero.
fn decompress(tool: &[&str], input: &[u8]) -> anyhow::Result<Vec<u8>> {
    let (out, ok) = pipe(tool, input)?;
    if !ok {
        bail!("{} failed", tool.join(" "));
    }
    Ok(out)
}

/// Pipes `input` through `tool`, keeping whatever it wrote whatever its status.
fn decompress_lenient(tool: &[&str], input: &[u8]) -> anyhow::Result<Vec<u8>> {
    Ok(pipe(tool, input)?.0)
}

fn pipe(tool: &[&str], input: &[u8]) -> anyhow::Result<(Vec<u8>, bool)> {
    let (program, args) = tool.split_first().context("empty command")?;
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .with_context(|| format!("starting {program}"))?;
    let mut stdin = child.stdin.take().context("piped stdin")?;
    let input = input.to_vec();
    // The tool may stop reading early (trailing garbage): a write error is expected then.
    let writer = std::thread::spawn(move || {
        let _ = stdin.write_all(&input);
    });
    let mut out = Vec::new();
    child
        .stdout
        .take()
        .context("piped stdout")?
        .read_to_end(&mut out)?;
    let status = child.wait()?;
    let _ = writer.join();
    Ok((out, status.success()))
}

// ---------------------------------------------------------------------------------------------
// Guest binaries

/// The static binaries that go into a guest, laid out there like `target/<profile>/`: binaries
/// in `/door/`, test executables in `/door/deps/`, so the suites find `door` and their helper
/// binaries next to themselves as they do on the host.
#[derive(Debug)]
struct GuestBinaries {
    /// Integration-test executables of `door-tests` by target name (`bpf_test_run`, …).
    tests: BTreeMap<String, PathBuf>,
    /// Every binary of `door-daemon` and `door-tests` by name (`door`, `demo-upstream`, …).
    bins: BTreeMap<String, PathBuf>,
}

/// Builds every binary of `door-daemon` and `door-tests` (door, the demo upstream, the SYN flood
/// tool, …) and (with `want_tests`) the privileged suites for the musl target with the workspace's
/// `guest` profile: optimised as a release build (a debug aya load takes seconds under
/// emulation), without the release profile's fat LTO (one link of the whole program per test
/// executable).
fn build_guest_binaries(want_tests: bool) -> anyhow::Result<GuestBinaries> {
    step(&format!(
        "building the guest binaries (profile guest: optimised, no LTO; static {MUSL}; cargo shows its progress)"
    ));
    let bins = cargo_executables(
        cargo().args([
            "build",
            "--profile",
            GUEST_PROFILE,
            "--target",
            MUSL,
            "--package",
            "door-daemon",
            "--package",
            "door-tests",
            "--bins",
        ]),
        "bin",
    )?;
    for needed in ["door", "demo-upstream", "syn-flood"] {
        if !bins.contains_key(needed) {
            bail!("cargo built no {needed} executable");
        }
    }
    let tests = if want_tests {
        cargo_executables(
            cargo().args([
                "test",
                "--profile",
                GUEST_PROFILE,
                "--target",
                MUSL,
                "--package",
                "door-tests",
                "--tests",
                "--no-run",
            ]),
            "test",
        )?
    } else {
        BTreeMap::new()
    };
    if want_tests && tests.is_empty() {
        bail!("cargo built no integration-test executables");
    }
    Ok(GuestBinaries { tests, bins })
}

/// Runs a cargo build with `--message-format=json` and returns the executables of targets of
/// `kind` (`bin`, or `test` for integration tests) it produced, by target name. Compiler messages
/// are shown.
fn cargo_executables(cmd: &mut Command, kind: &str) -> anyhow::Result<BTreeMap<String, PathBuf>> {
    cmd.arg("--message-format=json-render-diagnostics");
    eprintln!("    $ {}", display(cmd));
    let mut child = cmd
        .stdout(Stdio::piped())
        .spawn()
        .with_context(|| display(cmd))?;
    let stdout = child.stdout.take().context("piped stdout")?;
    let mut found = BTreeMap::new();
    for line in BufReader::new(stdout).lines() {
        let line = line?;
        let Ok(msg) = serde_json::from_str::<serde_json::Value>(&line) else {
            continue;
        };
        let field = |pointer: &str| msg.pointer(pointer).and_then(serde_json::Value::as_str);
        if field("/reason") != Some("compiler-artifact") {
            continue;
        }
        let (Some(exe), Some(name)) = (field("/executable"), field("/target/name")) else {
            continue;
        };
        // A `cargo test` build also links the package's binaries (and its unit-test harness);
        // keep only the kind asked for.
        if msg
            .pointer("/target/kind")
            .and_then(serde_json::Value::as_array)
            .is_some_and(|k| k.iter().any(|k| k == kind))
        {
            found.insert(name.to_owned(), PathBuf::from(exe));
        }
    }
    let status = child.wait()?;
    if !status.success() {
        bail!("{} failed ({status})", display(cmd));
    }
    let names: Vec<&str> = found.keys().map(String::as_str).collect();
    eprintln!("    built: {}", names.join(", "));
    Ok(found)
}

// ---------------------------------------------------------------------------------------------
// Initramfs

/// What the guest's `/init` does.
#[derive(Debug)]
enum Mode {
    /// Run every suite binary under `/tests`, one test at a time.
    Test,
    /// The scripted demo.
    Demo,
}

/// Host programs copied into every guest with their shared libraries: Debian's `ip` (busybox's
/// does not know XDP) and `curl` (the e2e suite's client).
const HOST_PROGRAMS: &[&str] = &["ip", "curl"];

/// Packs `kernel`'s initramfs (an uncompressed newc cpio) and returns its path.
fn pack_initramfs(kernel: &Kernel, bins: &GuestBinaries, mode: &Mode) -> anyhow::Result<PathBuf> {
    let base = vm_dir().join("initramfs");
    let root = base.join(format!("{}-root", kernel.release));
    let image = base.join(format!(
        "{}-{}.cpio",
        kernel.release,
        match mode {
            Mode::Test => "test",
            Mode::Demo => "run",
        }
    ));
    step(&format!("packing the initramfs for {}", kernel.release));
    if root.exists() {
        fs::remove_dir_all(&root).with_context(|| format!("clearing {}", root.display()))?;
    }
    for dir in [
        "bin",
        "dev",
        "proc",
        "sys",
        "tmp",
        "run",
        "etc",
        "root",
        "door/deps",
        "usr/local/bin",
        "lib/modules",
    ] {
        fs::create_dir_all(root.join(dir))?;
    }
    copy_exec(Path::new("/bin/busybox"), &root.join("bin/busybox"))?;
    for program in HOST_PROGRAMS {
        let path = which(program)?;
        copy_exec(&path, &root.join("usr/local/bin").join(program))?;
        for lib in shared_libraries(&path)? {
            let dest = root.join(lib.strip_prefix("/").unwrap_or(&lib));
            if !dest.exists() {
                fs::create_dir_all(dest.parent().context("library path")?)?;
                // The resolved file under the name the loader asks for.
                fs::copy(fs::canonicalize(&lib)?, &dest)
                    .with_context(|| format!("copying {}", lib.display()))?;
            }
        }
    }
    for (name, exe) in &bins.bins {
        copy_exec(exe, &root.join("door").join(name))?;
    }
    if matches!(mode, Mode::Test) {
        // The guests run the XDP suites (BPF_PROG_TEST_RUN, netns/veth, floods); the nginx and
        // HAProxy suite needs Debian's proxies, which the initramfs does not carry.
        for (name, exe) in bins
            .tests
            .iter()
            .filter(|(n, _)| GUEST_SUITES.contains(&n.as_str()))
        {
            copy_exec(exe, &root.join("door/deps").join(name))?;
        }
    }
    fs::copy(&kernel.veth, root.join("lib/modules/veth.ko"))?;
    let init = root.join("init");
    fs::write(&init, init_script(mode))?;
    make_executable(&init)?;
    sh(Command::new("sh").arg("-c").arg(format!(
        "cd '{}' && find . -print | cpio -o -H newc --quiet -R 0:0 > '{}'",
        root.display(),
        image.display()
    )))?;
    let size = fs::metadata(&image)?.len();
    eprintln!("    {} ({} MiB)", image.display(), size / (1 << 20));
    Ok(image)
}

fn which(program: &str) -> anyhow::Result<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/sbin"].map(PathBuf::from))
        .map(|d| d.join(program))
        .find(|p| p.is_file())
        .with_context(|| format!("{program} not found (install it: apt-get install iproute2 curl)"))
}

/// The shared libraries `ldd` lists for `exe`, the dynamic loader included.
fn shared_libraries(exe: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let text = output(Command::new("ldd").arg(exe))?;
    Ok(text
        .lines()
        .filter_map(|l| {
            let l = l.trim();
            let path = match l.split_once("=>") {
                Some((_, right)) => right.split_whitespace().next()?,
                None => l.split_whitespace().next()?,
            };
            path.starts_with('/').then(|| PathBuf::from(path))
        })
        .collect())
}

fn copy_exec(from: &Path, to: &Path) -> anyhow::Result<()> {
    fs::copy(from, to)
        .with_context(|| format!("copying {} to {}", from.display(), to.display()))?;
    make_executable(to)
}

fn make_executable(path: &Path) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    fs::set_permissions(path, fs::Permissions::from_mode(0o755))
        .with_context(|| format!("chmod {}", path.display()))
}

/// The common start of every `/init`: mounts, busybox applets, veth, loopback; and `finish`,
/// which hands the status to qemu through the isa-debug-exit port (0xf4 = byte 244 of
/// /dev/port; qemu exits with 2 × status + 1).
const INIT_PRELUDE: &str = r#"#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/usr/local/bin:/bin
export HOME=/root TMPDIR=/tmp NO_COLOR=1
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
mount -t tmpfs tmp /tmp
mount -t tmpfs run /run
mount -t bpf bpf /sys/fs/bpf
mount -t debugfs debugfs /sys/kernel/debug 2>/dev/null
mount -t tracefs tracefs /sys/kernel/tracing 2>/dev/null
finish() {
    echo "door-vm: done status=$1"
    printf "\\$(printf %o "$1")" | dd of=/dev/port bs=1 seek=244 count=1 2>/dev/null
    # Not reached when qemu has the isa-debug-exit device; without it, stop the machine.
    poweroff -f
}
echo "door-vm: kernel $(uname -r), $(nproc) cpu(s)"
insmod /lib/modules/veth.ko || { echo "door-vm: insmod veth failed"; finish 1; }
ip link set lo up || finish 1
"#;

fn init_script(mode: &Mode) -> String {
    let mut s = INIT_PRELUDE.to_owned();
    match mode {
        Mode::Test => s.push_str(
            r#"export DOOR_BIN=/door/door DEMO_UPSTREAM_BIN=/door/demo-upstream
cd /tmp
status=0
for t in /door/deps/*; do
    name=${t##*/}
    echo "door-vm: begin $name"
    "$t" --test-threads=1
    rc=$?
    echo "door-vm: end $name rc=$rc"
    [ "$rc" = 0 ] || status=1
done
finish $status
"#,
        ),
        Mode::Demo => s.push_str(DEMO_SCRIPT),
    }
    s
}

/// `cargo xtask run --vm`: the demo topology and client script (busybox sh).
const DEMO_SCRIPT: &str = r#"
set -u
fail() { echo "door-vm: demo step failed: $*"; finish 1; }
# Debian's busybox runs its own applets before PATH: Debian's ip and curl by full path.
ip=/usr/local/bin/ip curl=/usr/local/bin/curl
C="$ip netns exec client"; D="$ip netns exec door"
$ip netns add client && $ip netns add door || fail "ip netns add"
$ip link add veth-door netns door type veth peer name veth-client netns client || fail "veth"
$D $ip addr add 192.0.2.1/24 dev veth-door
$D $ip link set veth-door up
$D $ip link set lo up
$C $ip addr add 192.0.2.2/24 dev veth-client
$C $ip addr add 192.0.2.3/24 dev veth-client
$C $ip link set veth-client up
$C $ip link set lo up
cat > /tmp/door.toml <<'EOF'
listen = ["192.0.2.1:8443"]
upstream = "http://127.0.0.1:3000"
admin_listen = "127.0.0.1:9901"

[[route]]
group = "link"
methods = ["GET"]
path = "/l/session/{id}"

[[route]]
group = "health"
path = "/healthz"

[group.link]
rate = 1.0
burst = 20

[xdp]
interface = "veth-door"
mode = "driver"
ports = [8443]
syn_rate = 10.0
syn_burst = 50
EOF
echo "== door's config (/tmp/door.toml): link budget 1/s burst 20; XDP in driver mode on veth-door, SYN budget 10/s burst 50 per prefix"
$D /door/demo-upstream --listen 127.0.0.1:3000 > /tmp/upstream.log 2>&1 &
$D /door/door --config /tmp/door.toml > /tmp/door.log 2>&1 &
i=0
until $D $curl -s -o /dev/null --max-time 2 http://127.0.0.1:9901/status; do
    i=$((i + 1))
    [ $i -lt 60 ] || { cat /tmp/door.log; fail "door did not answer on its admin port"; }
    sleep 1
done
sed 's/^/door| /' /tmp/door.log
codes() { sort | uniq -c | while read n c; do printf ' %s x %s' "$n" "$c"; done; echo; }
echo "== 1. a legitimate client (192.0.2.2): 5 GET /l/session/demo, one per second"
for i in 1 2 3 4 5; do
    $C $curl -s -o /dev/null --max-time 10 --interface 192.0.2.2 -w '%{http_code}\n' http://192.0.2.1:8443/l/session/demo
    sleep 1
done | codes
echo "== 2. a burst over the link budget (192.0.2.3): 30 GET /l/session/demo at once"
for i in $(seq 30); do
    $C $curl -s -o /dev/null --max-time 10 --interface 192.0.2.3 -w '%{http_code}\n' http://192.0.2.1:8443/l/session/demo
done | codes
echo "   (expected: 20 x 200, plus one per second the burst takes, then 429: burst 20, 1 token/s)"
echo "== 3. a one-address SYN flood (192.0.2.66 -> 192.0.2.1:8443): at most 2000 SYNs in 10 s"
$C /door/syn-flood --source 192.0.2.66 --target 192.0.2.1:8443 --count 2000 --seconds 10 || fail "syn-flood"
sleep 1
echo "== 4. the legitimate client again, after the flood"
$C $curl -s -o /dev/null --max-time 10 --interface 192.0.2.2 -w '%{http_code}\n' http://192.0.2.1:8443/l/session/demo | codes
echo "== door's GET /status (admin port 9901): requests, XDP attach mode, counters, top prefixes"
$D $curl -s --max-time 10 http://127.0.0.1:9901/status || fail "GET /status"
echo
finish 0
"#;

// ---------------------------------------------------------------------------------------------
// Booting

/// What a boot produced.
#[derive(Debug)]
struct Boot {
    /// qemu's exit code; `None` when it was killed at the timeout or by a signal.
    exit: Option<i32>,
    /// Whether the timeout ended it.
    timed_out: bool,
    /// The console, line by line.
    lines: Vec<String>,
    /// Wall time.
    elapsed: Duration,
}

impl Boot {
    /// The status the guest wrote to port 0xf4 (qemu exits with 2 × status + 1); `None` when
    /// the guest never wrote one (crash, panic, hang, reboot).
    fn guest_status(&self) -> Option<i32> {
        match self.exit {
            Some(code) if code % 2 == 1 => Some(code / 2),
            _ => None,
        }
    }
}

/// Boots `kernel` with `initramfs` under TCG, streaming the console prefixed with `[short]`,
/// killing qemu after `timeout`.
fn boot(kernel: &Kernel, initramfs: &Path, timeout: Duration) -> anyhow::Result<Boot> {
    let mut cmd = Command::new("qemu-system-x86_64");
    cmd.args(["-accel", "tcg", "-m", "1024", "-smp", "1"])
        .args([
            "-nodefaults",
            "-display",
            "none",
            "-serial",
            "stdio",
            "-no-reboot",
        ])
        .args(["-device", "isa-debug-exit,iobase=0xf4,iosize=0x04"])
        .arg("-kernel")
        .arg(&kernel.vmlinux)
        .arg("-initrd")
        .arg(initramfs)
        .args(["-append", "console=ttyS0 panic=-1 quiet"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    eprintln!("    $ {}", display(&cmd));
    let start = Instant::now();
    let mut child = cmd.spawn().context("starting qemu-system-x86_64")?;
    let (tx, rx) = mpsc::channel::<String>();
    let mut readers = Vec::new();
    for stream in [
        child
            .stdout
            .take()
            .map(|s| Box::new(s) as Box<dyn std::io::Read + Send>),
        child
            .stderr
            .take()
            .map(|s| Box::new(s) as Box<dyn std::io::Read + Send>),
    ]
    .into_iter()
    .flatten()
    {
        let tx = tx.clone();
        readers.push(std::thread::spawn(move || {
            let mut reader = BufReader::new(stream);
            let mut buf = Vec::new();
            // Lines as bytes: a guest may print anything, valid UTF-8 or not.
            while reader.read_until(b'\n', &mut buf).is_ok_and(|n| n > 0) {
                let line = String::from_utf8_lossy(&buf)
                    .trim_end_matches(['\r', '\n'])
                    .to_owned();
                if tx.send(line).is_err() {
                    break;
                }
                buf.clear();
            }
        }));
    }
    drop(tx);
    let prefix = format!("[{}]", kernel.short);
    let mut lines = Vec::new();
    let mut timed_out = false;
    loop {
        let Some(left) = timeout.checked_sub(start.elapsed()) else {
            timed_out = true;
            break;
        };
        match rx.recv_timeout(left) {
            Ok(line) => {
                println!("{prefix} {line}");
                lines.push(line);
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {
                timed_out = true;
                break;
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        }
    }
    if timed_out {
        eprintln!("{prefix} TIMEOUT after {timeout:?}: stopping qemu");
        let _ = child.kill();
    }
    let status = child.wait()?;
    // After a kill the readers end with the pipes; collect what they still had.
    for line in rx.try_iter() {
        println!("{prefix} {line}");
        lines.push(line);
    }
    for r in readers {
        let _ = r.join();
    }
    let elapsed = start.elapsed();
    eprintln!(
        "{prefix} qemu exited: {status} after {:.1}s",
        elapsed.as_secs_f64()
    );
    Ok(Boot {
        exit: if timed_out { None } else { status.code() },
        timed_out,
        lines,
        elapsed,
    })
}

/// Adds up a test guest's console: libtest's `test result:` lines between the `/init`'s
/// `begin`/`end` markers, a failure for every suite binary that failed without a result line
/// (a crash, a panic outside a test) or never ended, and one for a guest that did not report
/// its status (kernel panic, hang).
fn judge_tests(kernel: &Kernel, boot: &Boot) -> KernelResult {
    let mut r = KernelResult {
        release: kernel.release.clone(),
        passed: 0,
        failed: 0,
        skipped: 0,
        failures: Vec::new(),
        elapsed: boot.elapsed,
    };
    let mut counts = Counts::default();
    let mut current: Option<(String, u64)> = None;
    let mut suites = 0;
    for line in &boot.lines {
        if let Some(name) = line.strip_prefix("door-vm: begin ") {
            current = Some((name.trim().to_owned(), 0));
            suites += 1;
        } else if let Some(rest) = line.strip_prefix("door-vm: end ") {
            let (name, rc) = rest.split_once(" rc=").unwrap_or((rest, "?"));
            let results = current.take().map_or(0, |(_, n)| n);
            if rc.trim() != "0" {
                r.failures.push(format!("{name} exited with {}", rc.trim()));
                if results == 0 {
                    r.failed += 1;
                }
            }
        } else if counts.line(line)
            && let Some((_, n)) = current.as_mut()
        {
            *n += 1;
        }
    }
    r.passed += counts.passed;
    r.failed += counts.failed;
    r.skipped += counts.skipped;
    if let Some((name, _)) = current {
        r.failures.push(format!("{name} never finished"));
        r.failed += 1;
    }
    let status = boot.guest_status();
    if status.is_none() {
        r.failures.push(describe(status, boot));
        if r.failed == 0 {
            r.failed += 1;
        }
        show_tail(boot);
    } else if suites == 0 {
        r.failures.push("the guest ran no suite".to_owned());
        r.failed += 1;
        show_tail(boot);
    } else if status != Some(0) && r.failures.is_empty() {
        r.failures.push("the guest reported a failure".to_owned());
        r.failed = r.failed.max(1);
    }
    r
}

fn describe(status: Option<i32>, boot: &Boot) -> String {
    match (status, boot.exit) {
        (Some(0), _) => "ok".to_owned(),
        (Some(s), _) => format!("the guest reported status {s}"),
        _ if boot.timed_out => format!(
            "the guest did not finish within {:.0?} (hung or too slow)",
            boot.elapsed
        ),
        (None, Some(code)) => format!(
            "the guest stopped without reporting a status (qemu exit {code}: kernel panic, crash or reboot)"
        ),
        (None, None) => "qemu was killed by a signal".to_owned(),
    }
}

fn show_tail(boot: &Boot) {
    let from = boot.lines.len().saturating_sub(TAIL_LINES);
    let mut tail = String::new();
    for line in boot.lines.get(from..).unwrap_or_default() {
        let _ = writeln!(tail, "    | {line}");
    }
    eprintln!(
        "\n    last {} lines of the guest's console:\n{tail}",
        boot.lines.len() - from
    );
}

fn output(cmd: &mut Command) -> anyhow::Result<String> {
    let out = cmd.output().with_context(|| display(cmd))?;
    if !out.status.success() {
        bail!("{} failed ({})", display(cmd), out.status);
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

#[cfg(test)]
mod tests {
    use std::{path::PathBuf, time::Duration};

    use super::{Boot, Kernel, judge_tests};

    fn kernel() -> Kernel {
        Kernel {
            short: "6.1".to_owned(),
            release: "6.1.0-41-amd64".to_owned(),
            vmlinux: PathBuf::new(),
            veth: PathBuf::new(),
        }
    }

    fn boot(exit: Option<i32>, timed_out: bool, lines: &[&str]) -> Boot {
        Boot {
            exit,
            timed_out,
            lines: lines.iter().map(|l| (*l).to_owned()).collect(),
            elapsed: Duration::from_secs(1),
        }
    }

    const PASSING: &[&str] = &[
        "door-vm: begin bpf_test_run",
        "test result: ok. 4 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out",
        "door-vm: end bpf_test_run rc=0",
        "door-vm: begin netns_e2e",
        "test result: ok. 2 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out",
        "door-vm: end netns_e2e rc=0",
        "door-vm: done status=0",
    ];

    #[test]
    fn a_clean_run_passes() {
        let r = judge_tests(&kernel(), &boot(Some(1), false, PASSING));
        assert_eq!((r.passed, r.failed), (6, 0));
        assert!(r.failures.is_empty(), "{:?}", r.failures);
    }

    #[test]
    fn a_failed_test_is_counted_once() {
        let lines = [
            "door-vm: begin bpf_test_run",
            "test result: FAILED. 3 passed; 1 failed; 0 ignored; 0 measured; 0 filtered out",
            "door-vm: end bpf_test_run rc=101",
            "door-vm: done status=1",
        ];
        let r = judge_tests(&kernel(), &boot(Some(3), false, &lines));
        assert_eq!((r.passed, r.failed), (3, 1));
    }

    #[test]
    fn a_suite_that_crashes_without_a_result_line_fails() {
        let lines = [
            "door-vm: begin netns_e2e",
            "door-vm: end netns_e2e rc=139",
            "door-vm: done status=1",
        ];
        let r = judge_tests(&kernel(), &boot(Some(3), false, &lines));
        assert_eq!((r.passed, r.failed), (0, 1));
    }

    #[test]
    fn a_kernel_panic_after_passing_tests_is_a_failure() {
        // qemu exits 0 when the guest reboots (panic=-1 with -no-reboot) instead of writing 0xf4.
        let r = judge_tests(&kernel(), &boot(Some(0), false, &PASSING[..6]));
        assert_eq!((r.passed, r.failed), (6, 1));
        assert!(r.failures.iter().any(|f| f.contains("without reporting")));
    }

    #[test]
    fn a_hang_is_a_failure() {
        let r = judge_tests(&kernel(), &boot(None, true, &PASSING[..4]));
        assert_eq!((r.passed, r.failed), (4, 1), "{:?}", r.failures);
        assert!(r.failures.iter().any(|f| f.contains("never finished")));
        assert!(r.failures.iter().any(|f| f.contains("did not finish")));
    }

    #[test]
    fn a_guest_that_runs_nothing_fails() {
        let r = judge_tests(
            &kernel(),
            &boot(Some(1), false, &["door-vm: done status=0"]),
        );
        assert_eq!(r.failed, 1);
    }
}
