//! The `DOOR_*` variables of the environment the tests run in, which a test takes off every `door`
//! process it starts: door reads them as flags, so a developer's `DOOR_UPSTREAM` or `DOOR_GROUP`
//! would change the configuration under test.

use std::ffi::OsString;

/// The names of this process's `DOOR_*` variables.
pub(crate) fn door_variables() -> Vec<OsString> {
    std::env::vars_os()
        .map(|(name, _)| name)
        .filter(|name| name.to_string_lossy().starts_with("DOOR_"))
        .collect()
}
