//! Fuzz target `session_down`: see `rollcall_fuzz::leases::session_down`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| rollcall_fuzz::leases::session_down(data));
