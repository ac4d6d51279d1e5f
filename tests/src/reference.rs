//! The benchmark's reference XDP programs, built by `tests/build.rs` from `door-ebpf` (with its
//! `reference` feature) and embedded here rather than in `door`: `xdp-bench` measures door's
//! program against them. All name their entry point like door's, so
//! [`Shield::load_object`](door_daemon::shield::Shield::load_object) loads them; only
//! [`Shield::test_run`](door_daemon::shield::Shield::test_run) applies to them (they have none
//! of door's maps), and to the churn references
//! [`Shield::tracked_prefixes`](door_daemon::shield::Shield::tracked_prefixes) too (their map is
//! named like door's prefix map). Each is empty when built with `AYA_BUILD_SKIP=1`.

/// The empty XDP program, which passes every packet (the floor), from `door-ebpf`'s
/// `ref_empty.rs`.
pub static EMPTY: &[u8] =
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/door-xdp-ref-empty"));

/// Parse Ethernet/IPv4/TCP and one LRU-hash update keyed by the source prefix (the irreducible
/// work of per-prefix state), from `door-ebpf`'s `ref_minimal.rs`.
pub static MINIMAL: &[u8] =
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/door-xdp-ref-minimal"));

/// A new prefix every packet into an LRU hash map of door's capacity with one LRU list for all
/// CPUs, as door's prefix map (`DOOR_PREFIXES`, named alike); from `door-ebpf`'s
/// `ref_churn_common.rs`.
pub static CHURN_COMMON: &[u8] =
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/door-xdp-ref-churn-common"));

/// The same with one LRU list per CPU (`BPF_F_NO_COMMON_LRU`); from `door-ebpf`'s
/// `ref_churn_percpu.rs`.
pub static CHURN_PERCPU: &[u8] =
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/door-xdp-ref-churn-percpu"));
