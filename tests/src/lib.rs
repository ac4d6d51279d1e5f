//! Support for door's privileged integration suites (`tests/tests/`): packet builders for
//! BPF_PROG_TEST_RUN, network namespaces for end-to-end runs, the privilege gate, and the
//! benchmark's reference XDP programs.

pub mod netns;
pub mod packets;
pub mod reference;

use std::{cell::RefCell, io::Write as _};

/// The line a privileged test prints when it skips itself (not root, `DOOR_SKIP_PRIVILEGED=1`),
/// followed by `: SUITE TEST`. `cargo xtask test` counts such a test as skipped, not passed
/// (`xtask/src/test.rs` matches the same text).
pub const SKIP_MARKER: &str = "door-test: skipped (needs root)";

/// Whether this process may run the privileged suites (root, hence CAP_BPF and CAP_NET_ADMIN).
///
/// When it may not, the suites fail loudly rather than pass vacuously, unless the caller sets
/// `DOOR_SKIP_PRIVILEGED=1`: then the test prints a [`SKIP_MARKER`] line (once per test) and
/// the caller returns early.
///
/// # Panics
/// When not root and `DOOR_SKIP_PRIVILEGED` is not `1`.
#[expect(
    clippy::panic,
    reason = "test support: a missing privilege fails the suite loudly"
)]
pub fn privileged_or_skip(suite: &str) -> bool {
    if is_root() {
        return true;
    }
    if std::env::var_os("DOOR_SKIP_PRIVILEGED").is_some_and(|v| v == "1") {
        mark_skipped(suite);
        return false;
    }
    panic!(
        "{suite} needs root (CAP_BPF, CAP_NET_ADMIN); run `cargo xtask test` as root, or set DOOR_SKIP_PRIVILEGED=1 to skip it"
    );
}

/// Whether every one of `tools` is on `PATH` (Debian packages `cargo xtask setup` installs, such
/// as `prometheus` and `promtool`). When one is missing and this process is not root (so setup
/// could not install it), the test prints a [`SKIP_MARKER`] line and the caller returns early.
///
/// # Panics
/// When one is missing and this process is root: `cargo xtask setup` (which `cargo xtask test`
/// runs first) installs them.
pub fn tools_or_skip(suite: &str, tools: &[&str]) -> bool {
    let missing: Vec<&str> = tools.iter().copied().filter(|t| !on_path(t)).collect();
    if missing.is_empty() {
        return true;
    }
    assert!(
        !is_root(),
        "{suite} needs {}: run `cargo xtask setup` (it installs the Debian packages)",
        missing.join(", ")
    );
    mark_skipped(suite);
    false
}

/// Pins the calling thread to the CPU it is running on, so that every later step of it sees the
/// same per-CPU state (the XDP program's cookie mode is per CPU).
///
/// # Errors
/// When `sched_setaffinity` fails.
pub fn pin_to_one_cpu() -> std::io::Result<()> {
    let mut set = rustix::thread::CpuSet::new();
    set.set(rustix::thread::sched_getcpu());
    rustix::thread::sched_setaffinity(None, &set)?;
    Ok(())
}

/// Pins the calling thread to CPU `cpu`.
///
/// # Errors
/// When `sched_setaffinity` fails (no such CPU, or not one this process may use).
pub fn pin_to_cpu(cpu: usize) -> std::io::Result<()> {
    let mut set = rustix::thread::CpuSet::new();
    set.set(cpu);
    rustix::thread::sched_setaffinity(None, &set)?;
    Ok(())
}

/// The CPUs this thread may run on, in order (`sched_getaffinity`).
///
/// # Errors
/// When `sched_getaffinity` fails.
pub fn allowed_cpus() -> std::io::Result<Vec<usize>> {
    let set = rustix::thread::sched_getaffinity(None)?;
    Ok((0..rustix::thread::CpuSet::MAX_CPU)
        .filter(|&cpu| set.is_set(cpu))
        .collect())
}

/// Whether this process runs as root (effective user ID 0).
fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

/// Whether an executable named `tool` is in a directory of `PATH`.
fn on_path(tool: &str) -> bool {
    use std::os::unix::fs::PermissionsExt as _;
    std::env::var_os("PATH").is_some_and(|path| {
        std::env::split_paths(&path).any(|dir| {
            std::fs::metadata(dir.join(tool))
                .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
    })
}

/// Prints `SKIP_MARKER: SUITE TEST` once per test (libtest names each test's thread after it).
///
/// Written to the process's stdout itself rather than with `println!`, which libtest captures and
/// shows only for failures: the line shows in every run, and on a line of its own after libtest's
/// `test NAME ... `.
fn mark_skipped(suite: &str) {
    thread_local! {
        static MARKED: RefCell<Option<String>> = const { RefCell::new(None) };
    }
    let thread = std::thread::current();
    let test = thread.name().unwrap_or("(unnamed)");
    let first = MARKED.with_borrow_mut(|marked| {
        if marked.as_deref() == Some(test) {
            false
        } else {
            *marked = Some(test.to_owned());
            true
        }
    });
    if first {
        let line = format!("\n{SKIP_MARKER}: {suite} {test}\n");
        let mut out = std::io::stdout().lock();
        // Nothing to do if stdout is gone; the test still skips.
        let _ = out.write_all(line.as_bytes()).and_then(|()| out.flush());
    }
}

/// Readies `command`, which starts door or a program beside it, for a test: logging at
/// `RUST_LOG=info` (where door says which addresses it listens on) and none of the caller's
/// `DOOR_*` settings, whatever the environment the tests run in holds.
pub fn test_environment(command: &mut std::process::Command) -> &mut std::process::Command {
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("DOOR_") {
            command.env_remove(key);
        }
    }
    command.env("RUST_LOG", "info")
}
