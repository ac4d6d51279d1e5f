//! Builds door's XDP program (`door-ebpf`'s `door-xdp`, without its `reference` feature) with
//! aya-build and leaves the object in `OUT_DIR` for `door_daemon::shield` to embed. The
//! benchmark's reference programs are not built here: `tests/build.rs` builds them for
//! `xdp-bench`. With `AYA_BUILD_SKIP=1` the build is skipped and an empty placeholder is written
//! instead; door then says at start-up that it has no XDP program.

use std::{fs, path::PathBuf};

use anyhow::Context as _;

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
            ..Default::default()
        }],
        aya_build::Toolchain::Nightly,
    )
    .context("building the XDP program (needs the nightly toolchain with rust-src and bpf-linker; `cargo xtask setup` installs them, AYA_BUILD_SKIP=1 builds without it)")?;
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    let object = out.join("door-xdp");
    if !object.exists() {
        fs::write(&object, []).with_context(|| format!("writing {}", object.display()))?;
    }
    Ok(())
}
