//! Fuzz target `arbiter_rpc`: see `rollcall_fuzz::leases::arbiter_rpc`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| rollcall_fuzz::leases::arbiter_rpc(data));
