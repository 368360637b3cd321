//! The parts of `symm-perf` that the workspace's tests use too.

pub mod work_stealing;
