//! The abort word of a window: how a kernel that gives up (a peer did not arrive, a refused
//! launch) tells the host, and how the host tells pending kernels that the communicator failed.
//! The word is a `u32` in host-visible memory ([`crate::SymmContext::abort_flag`]); its low
//! byte is one of the `ABORT_*` values below.

/// Abort-word value (low byte) of a window whose kernel gave up waiting for a peer; the word
/// of a wait that knew which peer it waited for is [`abort_timed_out_waiting_for`].
pub const ABORT_TIMED_OUT: u32 = 1;
/// Abort-word value raised by the host, never by a kernel: another rank found the
/// communicator failed (a mismatched or refused call, a peer's timeout), so this rank's
/// pending kernels give up at once instead of waiting for their own timeout.
pub const ABORT_PEER_FAILED: u32 = 3;

/// The abort word of a wait that timed out waiting for `peer`: [`ABORT_TIMED_OUT`] in the low
/// byte, `peer + 1` above it (so that the host can name the rank that did not arrive).
#[inline(always)]
pub const fn abort_timed_out_waiting_for(peer: u32) -> u32 {
    ABORT_TIMED_OUT | (peer.wrapping_add(1) << 8)
}

/// Raise this rank's abort word with a timed-out wait's `word` unless it is raised already:
/// the first cause stays — the host's [`ABORT_PEER_FAILED`], or the first wait that timed
/// out — and is what the host reports. (A wait looks at the abort word only every so many
/// polls, so it can time out after the host raised the word.)
///
/// # Safety
/// `abort` is this rank's abort word (valid, aligned, accessed atomically).
#[inline(always)]
pub unsafe fn raise_timeout(abort: *mut u32, word: u32) {
    // SAFETY: forwarded contract.
    unsafe { crate::arch::compare_exchange_sys_u32(abort, 0, word) };
}

/// The rank a timed-out wait was waiting for, when the abort word names one.
pub const fn timed_out_peer(word: u32) -> Option<u32> {
    if word & 0xFF != ABORT_TIMED_OUT || word >> 8 == 0 {
        None
    } else {
        Some((word >> 8) - 1)
    }
}
/// Abort-word value of a window whose kernel refused its launch (shape or arguments outside the
/// kernel's limits); nothing was touched.
pub const ABORT_INVALID_LAUNCH: u32 = 2;

/// Abort-word value of a window on which block `b` of two ranks' user kernels made different
/// calls at one barrier (`kernel`: a frame, a barrier or an in-kernel collective whose kind,
/// spans, element type, operator or grid differ); nothing of that call was done.
pub const ABORT_KERNEL_CALLS_DIFFER: u32 = 6;

/// Abort-word value of a window on which a block of a user's kernel waited at the grid barrier
/// (`sync::grid_barrier`) past the window's timeout for a block of its own launch: the blocks
/// made different sequences of calls, or were not all resident.
pub const ABORT_GRID_TIMED_OUT: u32 = 7;

/// Abort-word value of a window on which the blocks of one launch of a user's kernel made
/// different calls at one grid barrier (`kernel`: a frame, a barrier, an in-kernel collective or
/// `for_each_tile` on some blocks and not others, or with other arguments); nothing of that
/// call was done.
pub const ABORT_KERNEL_BLOCKS_DIFFER: u32 = 8;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_timeout_word_names_the_peer_it_waited_for() {
        for peer in [0u32, 1, 7, 63] {
            let word = abort_timed_out_waiting_for(peer);
            assert_eq!(word & 0xFF, ABORT_TIMED_OUT);
            assert_eq!(timed_out_peer(word), Some(peer));
        }
        assert_eq!(timed_out_peer(ABORT_TIMED_OUT), None);
        assert_eq!(timed_out_peer(ABORT_INVALID_LAUNCH), None);
        assert_eq!(timed_out_peer(ABORT_PEER_FAILED), None);
    }

    /// A wait that times out raises the word only if nothing raised it first: the host's
    /// "a peer failed", or an earlier wait's timeout, is what the host reports.
    #[cfg(not(loom))]
    #[test]
    fn a_timeout_keeps_the_first_cause() {
        let mut word = 0u32;
        // SAFETY: a live local, accessed only here.
        unsafe { raise_timeout(&mut word, abort_timed_out_waiting_for(2)) };
        assert_eq!(timed_out_peer(word), Some(2));
        // SAFETY: as above.
        unsafe { raise_timeout(&mut word, abort_timed_out_waiting_for(5)) };
        assert_eq!(timed_out_peer(word), Some(2));
        let mut word = ABORT_PEER_FAILED;
        // SAFETY: as above.
        unsafe { raise_timeout(&mut word, abort_timed_out_waiting_for(1)) };
        assert_eq!(word, ABORT_PEER_FAILED);
    }
}
