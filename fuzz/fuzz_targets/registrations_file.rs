//! Fuzz target `registrations_file`: see `rollcall_fuzz::node::registrations_file`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| rollcall_fuzz::node::registrations_file(data));
