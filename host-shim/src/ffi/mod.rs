//! The C ABI: types mirrored in `symm.h` ([`types`]) and the exported functions ([`api`]).

pub mod api;
pub mod types;
