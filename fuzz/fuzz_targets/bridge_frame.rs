//! Fuzz target `bridge_frame`: see `rollcall_fuzz::bridge::bridge_frame`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| rollcall_fuzz::bridge::bridge_frame(data));
