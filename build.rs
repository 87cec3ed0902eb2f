//! Records the git commit the `rollcall` binary is built from, and whether
//! the tree had uncommitted changes, so that every chaos and simulation
//! report can say which code produced it. Outside a git checkout they read
//! "unknown" and false.

use std::process::Command;

/// The folders whose sources make the binary.
const SOURCES: [&str; 9] = [
    "src",
    "config",
    "leases",
    "gossip",
    "node",
    "region-bridge",
    "chaos/src",
    "Cargo.toml",
    "Cargo.lock",
];

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

fn main() {
    for path in SOURCES {
        println!("cargo:rerun-if-changed={path}");
    }
    // A commit or a checkout moves HEAD or the branch it names; staging
    // changes the index.
    if let Some(dir) = git(&["rev-parse", "--git-dir"]) {
        for file in ["HEAD", "index", "packed-refs"] {
            println!("cargo:rerun-if-changed={dir}/{file}");
        }
        if let Some(head) = git(&["symbolic-ref", "-q", "HEAD"]) {
            println!("cargo:rerun-if-changed={dir}/{head}");
        }
    }
    let commit = git(&["rev-parse", "HEAD"]).unwrap_or_else(|| "unknown".to_owned());
    let mut status = vec!["status", "--porcelain", "--untracked-files=normal", "--"];
    status.extend(SOURCES);
    let dirty = git(&status).is_some_and(|s| !s.is_empty());
    println!("cargo:rustc-env=ROLLCALL_GIT_COMMIT={commit}");
    println!("cargo:rustc-env=ROLLCALL_GIT_DIRTY={dirty}");
}
