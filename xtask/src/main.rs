//! `cargo xtask`: door's task runner.

fn main() {}
