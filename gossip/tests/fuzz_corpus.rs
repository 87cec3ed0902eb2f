//! Replays, on stable, the committed fuzz inputs of this crate's
//! decoders (`fuzz/corpus/<target>/` and the crash regressions in
//! `fuzz/regressions/<target>/`) and the seed inputs through the very
//! checks the fuzz targets run (`fuzz/checks/gossip.rs`), so a decoder change
//! that breaks one fails `cargo test` without nightly or libFuzzer.

#[path = "../../fuzz/checks/gossip.rs"]
mod checks;
#[macro_use]
#[path = "../../fuzz/checks/replay.rs"]
mod replay;

replay_tests!();
