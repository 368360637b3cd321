//! Compile tests of the typed device API (`symm_device::kernel`): each contract broken in a
//! small kernel must not compile, with the error checked in next to it; the API used as
//! intended compiles (built, not only checked).

/// Each case breaks one contract: a forged peer, a raw offset instead of a span, a span of
/// another window, a window's handles leaving their closure, peer access outside a frame, a
/// barrier reached from per-thread code, the block handed to per-thread code, a branch on a
/// per-thread value, a frame kept past its closing barrier, a collective inside a frame, a
/// block token made outside a kernel's entry or inside its body, a window argument opened
/// twice, an element type that is not the window's, a kernel parameter that is not bytes the
/// host passes, and a user's element type.
const CASES: [&str; 16] = [
    "forge_peer",
    "raw_offset",
    "span_of_another_window",
    "window_escapes",
    "peer_outside_frame",
    "barrier_in_per_thread",
    "block_into_lane",
    "branch_on_varying",
    "frame_escapes",
    "collective_in_frame",
    "forge_block",
    "window_arg_twice",
    "dtype_mismatch",
    "enter_inside_body",
    "block_parameter",
    "foreign_element",
];

#[test]
fn kernel_contracts_are_enforced_at_compile_time() {
    let t = trybuild::TestCases::new();
    t.pass("tests/kernel_ui/correct_use.rs");
    for case in CASES {
        t.compile_fail(format!("tests/kernel_ui/{case}.rs"));
    }
}
