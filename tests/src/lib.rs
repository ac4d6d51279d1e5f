//! Support for door's privileged integration suites (`tests/tests/`): packet builders for
//! BPF_PROG_TEST_RUN, network namespaces for end-to-end runs, the privilege gate, and the
//! benchmark's reference XDP programs.

pub mod netns;
pub mod packets;
pub mod reference;

/// Whether this process may run the privileged suites (root, hence CAP_BPF and CAP_NET_ADMIN).
///
/// When it may not, the suites fail loudly rather than pass vacuously, unless the caller sets
/// `DOOR_SKIP_PRIVILEGED=1`, in which case they print that they were skipped.
///
/// # Panics
/// When not root and `DOOR_SKIP_PRIVILEGED` is not `1`.
#[expect(
    clippy::panic,
    reason = "test support: a missing privilege fails the suite loudly"
)]
pub fn privileged_or_skip(suite: &str) -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    #[expect(unsafe_code, reason = "geteuid is a libc call")]
    let root = unsafe { libc::geteuid() } == 0;
    if root {
        return true;
    }
    if std::env::var_os("DOOR_SKIP_PRIVILEGED").is_some_and(|v| v == "1") {
        eprintln!("SKIPPED {suite}: needs root (DOOR_SKIP_PRIVILEGED=1)");
        return false;
    }
    panic!(
        "{suite} needs root (CAP_BPF, CAP_NET_ADMIN); run `cargo xtask test` as root, or set DOOR_SKIP_PRIVILEGED=1 to skip it"
    );
}
