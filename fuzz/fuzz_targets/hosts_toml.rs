#![no_main]
// See scute::fuzz::hosts_toml for what this target checks.
libfuzzer_sys::fuzz_target!(|data: &[u8]| scute::fuzz::hosts_toml(data));
