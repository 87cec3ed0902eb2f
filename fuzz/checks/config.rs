//! What the fuzz target of the TOML loaders asserts (issue 20), shared by
//! `fuzz/fuzz_targets/config_toml.rs` and the stable replay of the
//! committed corpus in `config/tests/fuzz_corpus.rs`.
//!
//! The input's first byte picks the loader (agent, arbiter, bridge or
//! policy file, in that order, modulo 4); the rest is the file's text. No
//! loader panics; a refusal says what is wrong; a config that loads
//! writes back as TOML that loads to the same config.

use rollcall_config::{AgentConfig, ArbiterConfig, BridgeConfig, ConfigFile, PolicyFile};

fn stable<T: ConfigFile + serde::Serialize + PartialEq + std::fmt::Debug>(
    text: &str,
    write: fn(&T) -> String,
) {
    let config = match T::from_toml_str(text) {
        Ok(config) => config,
        Err(error) => {
            assert!(!error.to_string().is_empty(), "an empty refusal");
            return;
        }
    };
    let written = write(&config);
    let again = T::from_toml_str(&written)
        .unwrap_or_else(|e| panic!("a loaded config written back does not load: {e}\n{written}"));
    assert_eq!(again, config, "load → write → load changed the config");
}

fn to_toml<T: serde::Serialize>(config: &T) -> String {
    toml::to_string(config).unwrap_or_else(|e| panic!("a loaded config does not write: {e}"))
}

/// `config_toml`: see the module comment.
pub fn config_toml(data: &[u8]) {
    let Some((&which, text)) = data.split_first() else {
        return;
    };
    let Ok(text) = std::str::from_utf8(text) else {
        return;
    };
    match which % 4 {
        0 => stable::<AgentConfig>(text, to_toml),
        1 => stable::<ArbiterConfig>(text, to_toml),
        2 => stable::<BridgeConfig>(text, to_toml),
        _ => stable::<PolicyFile>(text, PolicyFile::to_toml),
    }
}

/// The example files of `config/examples`, each behind its loader's byte.
pub fn seeds() -> Vec<(&'static str, Vec<u8>)> {
    [
        (0u8, include_str!("../../config/examples/agent.toml")),
        (1, include_str!("../../config/examples/arbiter.toml")),
        (2, include_str!("../../config/examples/bridge.toml")),
        (3, include_str!("../../config/examples/policy.toml")),
    ]
    .into_iter()
    .map(|(which, text)| ("config_toml", [&[which][..], text.as_bytes()].concat()))
    .collect()
}

/// A fuzz target: its name and its check.
pub type Target = (&'static str, fn(&[u8]));

/// Every fuzz target of this module and its check, by target name.
pub const TARGETS: &[Target] = &[("config_toml", config_toml)];
