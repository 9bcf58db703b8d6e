#![no_main]
// See scute::fuzz::layer_stream for what this target checks.
libfuzzer_sys::fuzz_target!(|data: &[u8]| scute::fuzz::layer_stream(data));
