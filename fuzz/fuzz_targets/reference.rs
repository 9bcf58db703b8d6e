#![no_main]
// See scute::fuzz::reference for what this target checks.
libfuzzer_sys::fuzz_target!(|data: &[u8]| scute::fuzz::reference(data));
