//! Safe synchronization primitives built on [`crate::arch`]: the signal-pad layout, bounded
//! waits on another rank's flag, and the cross-rank barrier.

pub mod barrier;
pub mod ll;
pub mod signal_pad;
pub mod wait;
