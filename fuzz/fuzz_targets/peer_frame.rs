//! Fuzz target `peer_frame`: see `rollcall_fuzz::leases::peer_frame`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| rollcall_fuzz::leases::peer_frame(data));
