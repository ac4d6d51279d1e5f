//! Which of a front's worker threads the code is running on (docs/decisions.md, "Serving: a
//! single-threaded runtime per core"), so that per-worker state (the upstream connection pool)
//! is the worker's own and a request's upstream connection is driven by the thread that serves
//! the request.

use std::{cell::Cell, sync::OnceLock};

thread_local! {
    static WORKER: Cell<usize> = const { Cell::new(0) };
}

/// The number of the worker thread running this code: set once by the worker at its start
/// (`set`); 0 on every other thread (a test's runtime, the control plane's).
pub fn index() -> usize {
    WORKER.with(Cell::get)
}

/// Marks the calling thread as worker `i`.
pub(crate) fn set(i: usize) {
    WORKER.with(|w| w.set(i));
}

/// How many worker threads a running door starts: one per CPU it may run on, as the kernel said
/// the first time door asked, so that everything sized by it (the front's workers, the upstream
/// client's pools) agrees even if door's CPU set changes later.
pub fn count() -> usize {
    static COUNT: OnceLock<usize> = OnceLock::new();
    *COUNT
        .get_or_init(|| std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get))
}
