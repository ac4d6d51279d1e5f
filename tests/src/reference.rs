//! The benchmark's reference XDP programs, built by `tests/build.rs` from `door-ebpf` (with its
//! `reference` feature) and embedded here rather than in `door`: `xdp-bench` measures door's
//! program against them. Both name their entry point like door's, so
//! [`Shield::load_object`](door_daemon::shield::Shield::load_object) loads them; only
//! [`Shield::test_run`](door_daemon::shield::Shield::test_run) applies to them (they have none
//! of door's maps). Each is empty when built with `AYA_BUILD_SKIP=1`.

/// The empty XDP program, which passes every packet (the floor), from `door-ebpf`'s
/// `ref_empty.rs`.
pub static EMPTY: &[u8] =
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/door-xdp-ref-empty"));

/// Parse Ethernet/IPv4/TCP and one LRU-hash update keyed by the source prefix (the irreducible
/// work of per-prefix state), from `door-ebpf`'s `ref_minimal.rs`.
pub static MINIMAL: &[u8] =
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/door-xdp-ref-minimal"));
