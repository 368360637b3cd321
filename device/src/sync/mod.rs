//! Safe synchronization primitives built on [`crate::arch`]: the signal-pad layout, bounded
//! waits on another rank's flag, the cross-rank barrier, and the PAT step flags.

pub mod abort;
pub mod barrier;
pub mod grid;
pub mod ll;
pub mod pat_rounds;
pub mod signal_pad;
pub mod wait;
