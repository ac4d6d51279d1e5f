//! A small demo upstream for door.

fn main() {}
