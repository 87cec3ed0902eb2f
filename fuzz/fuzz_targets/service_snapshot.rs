//! Fuzz target `service_snapshot`: see `rollcall_fuzz::leases::service_snapshot`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| rollcall_fuzz::leases::service_snapshot(data));
