//! `libsymm.a` and `libsymm.so`: the C ABI of the `symm` crate (`ffi-headers/symm.h`) as C
//! libraries. Every `symm*` function is defined there, as `#[no_mangle] extern "C"`; linking the
//! crate here makes the static library carry them and the shared library export them. Nothing
//! else lives here.

#![no_std]

extern crate symm_rs;
