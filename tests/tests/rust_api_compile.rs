//! Compile tests of the Rust API's contracts: each broken in a small program (`tests/ui/
//! rust_api/`) must not compile, with the error checked in next to it; the correct use
//! compiles and runs (on the host backend).
//!
//! - A window bound to a scope is neither written, read nor dropped until the scope returns,
//!   also after `std::mem::forget` of its `Bound`, and a `Bound` cannot leave the scope.
//! - The stream a window is bound on lives as long as the scope; a communicator outlives its
//!   windows.
//! - The element type is the data type (an `f32` span into an `i32` span does not compile),
//!   and only the kernels' element types make windows.

const CASES: [&str; 8] = [
    "touch_bound_window",
    "forget_bound",
    "bound_escapes",
    "dtype_mismatch",
    "drop_window_in_scope",
    "stream_dropped_in_scope",
    "comm_dropped_before_window",
    "foreign_element",
];

#[test]
fn the_rust_api_contracts_are_enforced_at_compile_time() {
    let cases = trybuild::TestCases::new();
    cases.pass("ui/rust_api/correct_use.rs");
    for case in CASES {
        cases.compile_fail(format!("ui/rust_api/{case}.rs"));
    }
}
