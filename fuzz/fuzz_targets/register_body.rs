//! Fuzz target `register_body`: see `rollcall_fuzz::node::register_body`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| rollcall_fuzz::node::register_body(data));
