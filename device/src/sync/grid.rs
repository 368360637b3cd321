//! A block's place in a launch that serves several ranks, and the partition of a range of items
//! among the blocks of one rank (the same on every rank, so block `b` of every rank handles the
//! same items).

/// The calling block's index among the blocks that serve its rank.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Grid {
    /// Block index within the rank, `0 <= block < blocks`.
    pub block: u32,
    /// Blocks serving the rank.
    pub blocks: u32,
}

/// The contiguous range `[lo, hi)` of `count` items owned by `block` of `blocks`.
/// Every rank computes the same partition, so block `b` of every rank handles the same range.
#[inline(always)]
pub fn block_range(count: u64, block: u32, blocks: u32) -> (u64, u64) {
    // `blocks` is never 0 (launch shapes are checked); `max` lets the compiler see it, so no
    // division-by-zero panic path is emitted.
    let per_block = count.div_ceil(blocks.max(1) as u64);
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
