#![no_main]
// See scute::fuzz::spdy_frames for what this target checks.
libfuzzer_sys::fuzz_target!(|data: &[u8]| scute::fuzz::spdy_frames(data));
