//! Helpers shared by the integration tests.

#![allow(dead_code)]

use std::path::{Path, PathBuf};

pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

pub fn fixture(rel: &str) -> PathBuf {
    root().join("fixtures").join(rel)
}

/// Every snapshot fixture (real and synthetic), sorted.
pub fn snapshot_fixtures() -> Vec<PathBuf> {
    let mut out = Vec::new();
    for dir in ["captured", "real", "synth", "torch215"] {
        let d = root().join("fixtures").join(dir);
        for e in std::fs::read_dir(&d).expect("fixtures dir") {
            let p = e.expect("entry").path();
            let name = p.file_name().unwrap().to_string_lossy().to_string();
            if name.ends_with(".pickle") || name.ends_with(".pickle.gz") {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

/// Path relative to the repository root, with forward slashes (as in expected files).
pub fn rel(p: &Path) -> String {
    p.strip_prefix(root())
        .unwrap_or(p)
        .to_string_lossy()
        .replace('\\', "/")
}

pub fn snapscan() -> assert_cmd::Command {
    assert_cmd::Command::cargo_bin("snapscan").expect("binary")
}

/// `snapscan ARGS` run to success, its stdout read as JSON.
pub fn snapscan_json(args: &[&str]) -> serde_json::Value {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_snapscan"))
        .args(args)
        .output()
        .expect("runs");
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("JSON")
}
