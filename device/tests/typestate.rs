//! Compile tests of the work-stealing typestate: each hardware rule broken in a small program
//! must not compile, with the error checked in next to it; the correct protocol compiles
//! (which also makes trybuild build rather than only check, so the post-monomorphization
//! errors of the drop guards are seen).

#[test]
fn typestate_rules_are_enforced_at_compile_time() {
    let t = trybuild::TestCases::new();
    t.pass("tests/typestate/correct_use.rs");
    for case in [
        "submit_after_failure",
        "query_before_wait",
        "id_of_failed_response",
        "drop_stolen_tile",
        "submit_without_election",
        "use_after_consume",
        "drop_request_in_flight",
    ] {
        t.compile_fail(format!("tests/typestate/{case}.rs"));
    }
}
