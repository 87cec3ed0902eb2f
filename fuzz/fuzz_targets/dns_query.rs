//! Fuzz target `dns_query`: see `rollcall_fuzz::node::dns_query`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| rollcall_fuzz::node::dns_query(data));
