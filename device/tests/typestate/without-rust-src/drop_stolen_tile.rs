// The same program as ../drop_stolen_tile.rs, checked against the error rustc prints when the
// toolchain has no `rust-src` component (see tests/typestate.rs).
include!("../drop_stolen_tile.rs");
