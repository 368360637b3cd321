// The same program as ../drop_request_in_flight.rs, checked against the error rustc prints when the
// toolchain has no `rust-src` component (see tests/typestate.rs).
include!("../drop_request_in_flight.rs");
