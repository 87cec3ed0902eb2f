//! Fuzz target `session_up`: see `rollcall_fuzz::leases::session_up`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| rollcall_fuzz::leases::session_up(data));
