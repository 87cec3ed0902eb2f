//! Fuzz target `catalog_snapshot`: see `rollcall_fuzz::leases::catalog_snapshot`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| rollcall_fuzz::leases::catalog_snapshot(data));
