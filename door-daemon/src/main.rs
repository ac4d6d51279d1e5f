//! The `door` binary.

fn main() {}
