//! Replays, on stable, the committed fuzz inputs of this crate's
//! decoders (`fuzz/corpus/<target>/` and the crash regressions in
//! `fuzz/regressions/<target>/`) and the seed inputs through the very
//! checks the fuzz targets run (`fuzz/checks/gossip.rs`), so a decoder change
//! that breaks one fails `cargo test` without nightly or libFuzzer.

#[path = "../../fuzz/checks/gossip.rs"]
mod checks;
#[path = "../../fuzz/checks/replay.rs"]
mod replay;

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
