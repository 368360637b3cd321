//! The C ABI's entry points ([`api`]); their types are in [`crate::abi`].

pub mod api;
