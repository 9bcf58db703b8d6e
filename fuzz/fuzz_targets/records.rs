#![no_main]
// See scute::fuzz::records for what this target checks.
libfuzzer_sys::fuzz_target!(|data: &[u8]| scute::fuzz::records(data));
