//! Rebuild the XDP program when bpf-linker changes (it does the final link).

fn main() {
    if let Ok(linker) = which::which("bpf-linker") {
        println!("cargo:rerun-if-changed={}", linker.display());
    }
}
