//! Builds the benchmark's reference XDP programs (`door-ebpf` with its `reference` feature:
//! `ref_empty.rs`, `ref_minimal.rs`, `ref_churn_common.rs` and `ref_churn_percpu.rs`) with
//! aya-build and leaves the objects in `OUT_DIR` for `door_tests::reference` to embed. They live
//! here, not in `door-daemon`, so the shipped `door` binary carries only its own program. With `AYA_BUILD_SKIP=1` the build is skipped and empty
//! placeholders are written instead; loading one then fails with `ShieldError::NoProgram`.

use std::{fs, path::PathBuf};

use anyhow::Context as _;

/// The reference objects `door_tests::reference` embeds (`door-ebpf`'s bin names).
const OBJECTS: [&str; 4] = [
    "door-xdp-ref-empty",
    "door-xdp-ref-minimal",
    "door-xdp-ref-churn-common",
    "door-xdp-ref-churn-percpu",
];

fn main() -> anyhow::Result<()> {
    let manifest_dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?);
    let ebpf_dir = manifest_dir.join("../door-ebpf");
    let ebpf_dir = ebpf_dir
        .to_str()
        .context("the door-ebpf path is not UTF-8")?;
    let common_dir = manifest_dir.join("../door-common");
    println!("cargo:rerun-if-changed={}", common_dir.display());
    aya_build::build_ebpf(
        [aya_build::Package {
            name: "door-ebpf",
            root_dir: ebpf_dir,
            features: &["reference"],
            ..Default::default()
        }],
        aya_build::Toolchain::Nightly,
    )
    .context("building the reference XDP programs (needs the nightly toolchain with rust-src and bpf-linker; `cargo xtask setup` installs them, AYA_BUILD_SKIP=1 builds without it)")?;
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    for name in OBJECTS {
        let object = out.join(name);
        if !object.exists() {
            fs::write(&object, []).with_context(|| format!("writing {}", object.display()))?;
        }
    }
    Ok(())
}
