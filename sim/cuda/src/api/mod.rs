//! The exported driver functions (C ABI, `#[no_mangle]`), by area.

pub mod device;
pub mod device_code;
pub mod errors;
pub mod link;
pub mod memory;
pub mod module;
pub mod stream;
pub mod vmm;
