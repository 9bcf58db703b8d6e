#![no_main]
// See scute::fuzz::cni_result for what this target checks.
libfuzzer_sys::fuzz_target!(|data: &[u8]| scute::fuzz::cni_result(data));
