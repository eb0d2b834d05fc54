//! Fuzz target: see `checks::etcd_key` (`fuzz/checks.rs`).
#![no_main]

#[path = "../checks.rs"]
mod checks;

libfuzzer_sys::fuzz_target!(|data: &[u8]| checks::etcd_key(data));
