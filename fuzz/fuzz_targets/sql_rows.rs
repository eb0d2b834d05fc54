//! Fuzz target: see `checks::sql_rows` (`fuzz/checks.rs`).
#![no_main]

#[path = "../checks.rs"]
mod checks;

libfuzzer_sys::fuzz_target!(|data: &[u8]| checks::sql_rows(data));
