//! Fuzz target `cache_file`: see `rollcall_fuzz::node::cache_file`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| rollcall_fuzz::node::cache_file(data));
