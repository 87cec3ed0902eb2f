//! Fuzz target `config_toml`: see `rollcall_fuzz::config::config_toml`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| rollcall_fuzz::config::config_toml(data));
