//! `door check-config` run as a program: a good file prints the effective configuration (which
//! door accepts back) and exits 0; a bad one exits 2 naming the key and the value.

use std::{
    path::PathBuf,
    process::{Command, Output},
};

use door_daemon::config::Config;

/// A file in a directory of its own, removed on drop.
struct TempFile {
    dir: PathBuf,
    path: PathBuf,
}

impl TempFile {
    #[expect(clippy::unwrap_used, reason = "test helper")]
    fn new(name: &str, text: &str) -> Self {
        let dir =
            std::env::temp_dir().join(format!("door-check-config-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("door.toml");
        std::fs::write(&path, text).unwrap();
        Self { dir, path }
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Runs `door check-config --config FILE` with no `DOOR_*` variables.
#[expect(clippy::unwrap_used, reason = "test helper")]
fn check_config(file: &TempFile) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_door"));
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("DOOR_") {
            cmd.env_remove(k);
        }
    }
    cmd.arg("check-config")
        .arg("--config")
        .arg(&file.path)
        .output()
        .unwrap()
}

#[test]
fn a_good_file_prints_the_effective_configuration_and_exits_0() {
    let example = include_str!("../../examples/door.toml");
    let file = TempFile::new("good", example);
    let out = check_config(&file);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{:?}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.trim_end().ends_with("# configuration OK"),
        "{stdout}"
    );
    assert!(
        stdout.contains("[group.webhook]"),
        "defaults filled in: {stdout}"
    );
    let printed = Config::from_toml("stdout", &stdout).expect("door accepts its own output");
    assert_eq!(printed, Config::from_toml("example", example).unwrap());
}

#[test]
fn a_bad_value_exits_2_naming_the_key_and_the_value() {
    let file = TempFile::new("bad-value", "[group.link]\nrate = -1.0\n");
    let out = check_config(&file);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("group.link.rate = -1"), "{stderr}");
    assert!(out.stdout.is_empty(), "nothing printed on stdout");
}

#[test]
fn an_unknown_key_exits_2_naming_it() {
    let file = TempFile::new("bad-key", "listen = [\"127.0.0.1:1\"]\nupstrem = \"x\"\n");
    let out = check_config(&file);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("upstrem"), "{stderr}");
}
