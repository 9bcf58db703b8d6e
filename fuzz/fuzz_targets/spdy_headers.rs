#![no_main]
// See scute::fuzz::spdy_headers for what this target checks.
libfuzzer_sys::fuzz_target!(|data: &[u8]| scute::fuzz::spdy_headers(data));
