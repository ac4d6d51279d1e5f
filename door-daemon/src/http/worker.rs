//! Which of a front's worker threads the code is running on (docs/decisions.md, "Serving: a
//! single-threaded runtime per core"), so that per-worker state (the upstream connection pool)
//! is the worker's own and a request's upstream connection is driven by the thread that serves
//! the request.

use std::cell::Cell;

thread_local! {
    static WORKER: Cell<usize> = const { Cell::new(0) };
}

/// The number of the worker thread running this code: set once by the worker at its start
/// ([`set`]); 0 on every other thread (a test's runtime, the control plane's).
pub fn index() -> usize {
    WORKER.with(Cell::get)
}

/// Marks the calling thread as worker `i`.
pub(crate) fn set(i: usize) {
    WORKER.with(|w| w.set(i));
}

/// How many worker threads a running door starts: one per CPU it may run on.
pub fn count() -> usize {
    std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
}
