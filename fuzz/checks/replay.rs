//! Replays committed fuzz inputs on stable: every file of
//! `fuzz/corpus/<target>/` (inputs that reached new coverage, minimized
//! with `cargo fuzz cmin`) and `fuzz/regressions/<target>/` (inputs that
//! once crashed a target) goes through the target's check, and a failure
//! names the file. Compiled into each crate's `tests/fuzz_corpus.rs`.

use std::path::{Path, PathBuf};

/// A target's name and its check, as the `checks` module beside this one
/// (which the crate's test names so) declares it.
use crate::checks::Target;

fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz")
}

fn files(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut files: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    files
}

/// Stack for one replayed input. The parsers bound their own nesting (the
/// TOML parser refuses about 80 levels), but an unoptimized build spends
/// far more stack per level than the release build libFuzzer runs, and a
/// test thread has 2 MiB: 80 levels of TOML overflow it in a debug build
/// although the release binary refuses 100,000 with a parse error.
const REPLAY_STACK_BYTES: usize = 64 << 20;

fn run(check: fn(&[u8]), what: &str, data: &[u8]) {
    let data = data.to_vec();
    let outcome = std::thread::Builder::new()
        .stack_size(REPLAY_STACK_BYTES)
        .spawn(move || check(&data))
        .expect("a replay thread starts")
        .join();
    if let Err(panic) = outcome {
        let message = panic
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_default();
        panic!("{what} fails its check: {message}");
    }
}

/// Runs every committed input of every target; each target must have a
/// corpus. Returns how many inputs ran.
pub fn committed(targets: &[Target]) -> usize {
    let mut count = 0;
    for (name, check) in targets {
        let corpus = files(&fuzz_dir().join("corpus").join(name));
        assert!(!corpus.is_empty(), "fuzz/corpus/{name} holds no input");
        let regressions = files(&fuzz_dir().join("regressions").join(name));
        for path in corpus.iter().chain(&regressions) {
            let data = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            run(*check, &path.display().to_string(), &data);
            count += 1;
        }
    }
    count
}

/// Runs the seeds through their targets' checks.
pub fn seeds(targets: &[Target], seeds: &[(&'static str, Vec<u8>)]) {
    for (i, (name, data)) in seeds.iter().enumerate() {
        let (_, check) = targets
            .iter()
            .find(|(t, _)| t == name)
            .unwrap_or_else(|| panic!("a seed for unknown target {name}"));
        run(*check, &format!("seed {i} of {name}"), data);
    }
}

/// Writes the seeds into their targets' corpus directories as
/// `seed-<n>`, replacing earlier seeds of that name.
pub fn write_seeds(seeds: &[(&'static str, Vec<u8>)]) {
    for (i, (name, data)) in seeds.iter().enumerate() {
        let dir = fuzz_dir().join("corpus").join(name);
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        let path = dir.join(format!("seed-{i}"));
        std::fs::write(&path, data).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    }
}

/// The replay tests of one crate's `tests/fuzz_corpus.rs`, which declares
/// `mod checks` (that crate's `fuzz/checks/<crate>.rs`) and this module
/// with `#[macro_use]` before calling it.
macro_rules! replay_tests {
    () => {
        #[test]
        fn committed_fuzz_inputs_hold() {
            assert!(replay::committed(checks::TARGETS) > 0);
        }

        #[test]
        fn seed_inputs_hold() {
            replay::seeds(checks::TARGETS, &checks::seeds());
        }

        /// Refreshes the seeds in `fuzz/corpus/` after a format change:
        /// `cargo test -p <crate> --test fuzz_corpus -- --ignored`.
        #[test]
        #[ignore = "writes into fuzz/corpus; run by hand to refresh the seeds"]
        fn write_seed_inputs() {
            replay::write_seeds(&checks::seeds());
        }
    };
}
