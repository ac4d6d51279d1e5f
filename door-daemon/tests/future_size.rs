//! The future that serves one request (`App::handle`) is allocated and copied once per request:
//! hyper is given a box of it and moves only the pointer (docs/decisions.md, "A request's future
//! on the heap"). Its size is therefore a cost on every request, and a change that keeps one more
//! value across an await grows it silently. This test pins it.

use std::sync::Arc;

use door_daemon::http::{App, ConnInfo};
use http::Request;
use hyper::body::Incoming;

/// The largest the future may be, in bytes: it measured 2,456 bytes when this bound was set, in
/// the test build as in the release build (`-Zprint-type-sizes`). The margin is less than one
/// request (`http::Request`, 264 bytes) kept across an await. Futures `App::handle` boxes where
/// it takes them (a plane's refusal, a refused probe's cached answer) are not counted; a new
/// toolchain may move the size a little, and then the bound is set again.
const MAX_FUTURE_BYTES: usize = 2_560;

/// The size of what `handle` returns: the type's size, so no request has to be made.
fn returned_size<F, R>(_: F) -> usize
where
    F: FnOnce(Arc<App>, Arc<ConnInfo>, Request<Incoming>) -> R,
{
    size_of::<R>()
}

#[test]
fn the_request_future_stays_small() {
    let size = returned_size(App::handle);
    assert!(
        size <= MAX_FUTURE_BYTES,
        "App::handle's future is {size} bytes, over {MAX_FUTURE_BYTES}: something new is kept \
         across an await on the request path (box it where it is taken, or drop it before the \
         await)"
    );
}
