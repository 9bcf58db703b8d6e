#![no_main]
// See scute::fuzz::layer_tar for what this target checks.
libfuzzer_sys::fuzz_target!(|data: &[u8]| scute::fuzz::layer_tar(data));
