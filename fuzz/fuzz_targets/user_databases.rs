#![no_main]
// See scute::fuzz::user_databases for what this target checks.
libfuzzer_sys::fuzz_target!(|data: &[u8]| scute::fuzz::user_databases(data));
