//! The checks of every fuzz target, one module per crate under test
//! (`fuzz/checks/*.rs`, which the crates' `tests/fuzz_corpus.rs` compile
//! too, to replay the committed corpora on stable).

#[path = "../checks/leases.rs"]
pub mod leases;
#[path = "../checks/node.rs"]
pub mod node;
#[path = "../checks/gossip.rs"]
pub mod gossip;
#[path = "../checks/bridge.rs"]
pub mod bridge;
#[path = "../checks/config.rs"]
pub mod config;
