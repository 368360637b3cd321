//! Work stealing with Cluster Launch Control (CLC), with the hardware rules as types.
//!
//! Layers, bottom to top:
//! * [`crate::arch`] — the CLC instructions, mbarriers and proxy fences (`arch::clc`, sm_100a).
//! * [`source`] — where stolen tiles come from: `source::HardwareSource` (CLC, sm_100a PTX
//!   only) or [`source::SoftwareSource`] (a global atomic ticket, every target and the host).
//! * [`steal`] — the typestate: a request can only be submitted with an [`steal::Election`],
//!   its response only read after the barrier wait, a failure ends the handle, a failed
//!   response has no tile, and a stolen tile ([`steal::Stolen`]) cannot be dropped unrun.
//! * [`policy`] — when to ask (static dispatch, decided by one thread, broadcast to the block).
//! * [`driver::for_each_tile`] — the persistent loop that owns the whole protocol.

pub mod driver;
pub mod policy;
pub mod source;
pub mod steal;
pub mod workload;

/// A tile (a block index of the grid the work was written for).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TileId(pub u32);

/// What one block did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BlockStats {
    /// Tiles this block ran (its own and stolen ones).
    pub tiles: u32,
    /// Successful steals.
    pub steals: u32,
}
