#![no_main]
// See scute::fuzz::cdi_spec for what this target checks.
libfuzzer_sys::fuzz_target!(|data: &[u8]| scute::fuzz::cdi_spec(data));
