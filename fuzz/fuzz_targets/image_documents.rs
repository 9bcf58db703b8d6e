#![no_main]
// See scute::fuzz::image_documents for what this target checks.
libfuzzer_sys::fuzz_target!(|data: &[u8]| scute::fuzz::image_documents(data));
