//! Safe synchronization primitives built on [`crate::arch`]: the signal-pad layout, bounded
//! waits on another rank's flag, the cross-rank barrier, the PAT step flags, and the
//! point-to-point pairing.

pub mod abort;
pub mod barrier;
pub mod grid;
pub mod grid_barrier;
pub mod ll;
pub mod p2p;
pub mod pat_rounds;
pub mod signal_pad;
pub mod wait;
