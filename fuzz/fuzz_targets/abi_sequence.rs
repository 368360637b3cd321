//! libFuzzer entry point: every input is a sequence of C ABI calls, run against the reference
//! model of `symm_fuzz` (see its documentation for the input format and what fails).

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    symm_fuzz::run_input(data);
});
