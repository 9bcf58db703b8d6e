#![no_main]
// See scute::fuzz::websocket_channels for what this target checks.
libfuzzer_sys::fuzz_target!(|data: &[u8]| scute::fuzz::websocket_channels(data));
