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
    // A commit or a checkout moves HEAD or the branch it names (a loose
    // ref file, or packed-refs once git has packed it); staging changes the
    // index. Only files that exist are named: cargo takes a missing file
    // as changed on every build, which relinked the binary each time in a
    // checkout without packed-refs. When git packs or unpacks the branch's
    // ref, the named file changes or goes, which reruns this script once.
    if let Some(dir) = git(&["rev-parse", "--git-dir"]) {
        let mut files = vec![
            "HEAD".to_owned(),
            "index".to_owned(),
            "packed-refs".to_owned(),
        ];
        files.extend(git(&["symbolic-ref", "-q", "HEAD"]));
        for file in files {
            let path = std::path::Path::new(&dir).join(file);
            if path.exists() {
                println!("cargo:rerun-if-changed={}", path.display());
            }
        }
    }
    let commit = git(&["rev-parse", "HEAD"]).unwrap_or_else(|| "unknown".to_owned());
    // `--no-optional-locks`: status must not refresh the index, which would
    // change a file this script watches and rerun it on the next build.
    let mut status = vec![
        "--no-optional-locks",
        "status",
        "--porcelain",
        "--untracked-files=normal",
        "--",
    ];
    status.extend(SOURCES);
    let dirty = git(&status).is_some_and(|s| !s.is_empty());
    println!("cargo:rustc-env=ROLLCALL_GIT_COMMIT={commit}");
    println!("cargo:rustc-env=ROLLCALL_GIT_DIRTY={dirty}");
}
