// Shared by the compile tests: a block-level kernel body over the software source. Every case
// includes this file and then misuses (or uses) the typestate.
#[allow(unused_imports)]
use symm_device::scheduler::TileId;
use symm_device::scheduler::source::SoftwareSource;
#[allow(unused_imports)]
use symm_device::scheduler::steal::{Election, Outcome, Steal};

#[allow(dead_code)]
unsafe fn source() -> SoftwareSource {
    unsafe { SoftwareSource::new(core::ptr::null_mut(), 1) }
}

#[allow(dead_code)]
fn run(_tile: TileId) {}
