#![no_main]
// See scute::fuzz::shim_frames for what this target checks.
libfuzzer_sys::fuzz_target!(|data: &[u8]| scute::fuzz::shim_frames(data));
