//! Fuzz target `regions_file`: see `rollcall_fuzz::node::regions_file`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| rollcall_fuzz::node::regions_file(data));
