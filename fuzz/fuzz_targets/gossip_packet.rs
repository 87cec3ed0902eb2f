//! Fuzz target `gossip_packet`: see `rollcall_fuzz::gossip::gossip_packet`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| rollcall_fuzz::gossip::gossip_packet(data));
