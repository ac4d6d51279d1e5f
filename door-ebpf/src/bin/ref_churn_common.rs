//! Benchmark reference: a new prefix every packet into an LRU hash map of door's capacity with
//! one LRU list for all CPUs (the kernel's default, as door's `DOOR_PREFIXES`); see `churn.rs`.
#![cfg_attr(target_arch = "bpf", no_std)]
#![cfg_attr(target_arch = "bpf", no_main)]
#![expect(
    clippy::inline_always,
    reason = "eBPF: helpers are inlined so the verifier checks one function with known bounds"
)]

#[path = "../access.rs"]
#[expect(dead_code, reason = "the reference uses only part of the accessor")]
mod access;
#[path = "../churn.rs"]
mod churn;
#[path = "../key.rs"]
#[expect(dead_code, reason = "the reference builds its key from a count")]
mod key;

churn::reference_program!(0);
