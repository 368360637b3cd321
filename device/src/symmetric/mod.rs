//! Symmetric-memory collective kernels, one module per collective. Each kernel is a plain
//! function that every thread of the grid calls; the PTX entry points in
//! [`crate::exports`] and the host backend both call these same functions.

pub mod all_reduce;
pub mod reduce;

/// How a kernel ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KernelStatus {
    /// The collective completed on this rank.
    Completed,
    /// A wait on a peer timed out or the window was already aborted; the abort word is set.
    Aborted,
    /// The launch shape or context violates the kernel's limits; nothing was touched.
    InvalidLaunch,
}

/// The contiguous range `[lo, hi)` of `count` elements owned by `block` of `blocks`.
/// Every rank computes the same partition, so block `b` of every rank handles the same range.
#[inline(always)]
pub fn block_range(count: u64, block: u32, blocks: u32) -> (u64, u64) {
    let per_block = count.div_ceil(blocks as u64);
    let lo = (block as u64 * per_block).min(count);
    let hi = (lo + per_block).min(count);
    (lo, hi)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_ranges_tile_the_count() {
        for count in [0u64, 1, 7, 63, 64, 65, 1000, 4099] {
            for blocks in 1..=9u32 {
                let mut next = 0;
                for b in 0..blocks {
                    let (lo, hi) = block_range(count, b, blocks);
                    assert_eq!(lo, next.min(count));
                    assert!(hi >= lo);
                    next = hi;
                }
                assert_eq!(next, count);
            }
        }
    }
}
