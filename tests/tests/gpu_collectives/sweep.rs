//! The cases the data-type sweeps run: rank counts, element counts, buffer placements, the
//! `SYMM_GPU_TEST_SUBSET` rotation, window sizes, and the upload of each rank's inputs.

use crate::reference::{encode_all, parallel_map};
use crate::{largest_count, upload_bytes};
use symm_device::DataType;
use symm_tests::*;

pub(crate) const RANKS: [usize; 4] = [2, 3, 4, 8];

/// The counts every collective is checked at: small, odd tails, and [`largest_count`].
pub(crate) fn counts() -> [usize; 5] {
    [1, 7, 1023, 4099, largest_count()]
}

/// `SYMM_GPU_TEST_SUBSET=1`: run case `index` of a rank-count sweep only at one rank count
/// (`index` rotates through them), so every kernel still runs, at a quarter of the cost.
pub(crate) fn runs_at(nranks: usize, index: usize) -> bool {
    let subset = std::env::var("SYMM_GPU_TEST_SUBSET").is_ok_and(|v| v == "1");
    !subset || RANKS[index % RANKS.len()] == nranks
}

/// Window bytes for the largest case of any collective: 8-byte elements, the biggest count,
/// up to 8 ranks' segments for all-gather and reduce-scatter.
pub(crate) fn window_bytes(nranks: usize, count: usize) -> usize {
    2 * 8 * nranks * count + 4096
}

/// Where a case puts its buffers, in bytes from the window base.
#[derive(Clone, Copy, Debug)]
pub(crate) struct At {
    pub(crate) send: usize,
    pub(crate) recv: usize,
}

impl At {
    /// Rank `rank`'s offset for the buffer that, in place, is its own `segment`-byte segment
    /// of the other buffer (all-gather's send, reduce-scatter's receive); `out_of_place`
    /// otherwise.
    pub(crate) fn rank_offset(self, rank: usize, segment: usize, out_of_place: usize) -> usize {
        if self.send == self.recv {
            self.send + rank * segment
        } else {
            out_of_place
        }
    }
}

/// The placements every case runs with: in place and aligned, out of place and aligned, out
/// of place at offsets that are multiples of the element size but not of 16.
pub(crate) fn placements(size: usize, send_bytes: usize, recv_bytes: usize) -> [At; 3] {
    let region = send_bytes.max(recv_bytes).next_multiple_of(256);
    [
        At { send: 0, recv: 0 },
        At {
            send: 256,
            recv: 512 + region,
        },
        At {
            send: 3 * size,
            recv: 512 + region + 5 * size,
        },
    ]
}

/// Upload each rank's inputs, encoded as `dtype`, at `offset(rank)` of its window.
pub(crate) fn upload_inputs(
    buffers: &[RankBuffer],
    dtype: DataType,
    inputs: &[Vec<f64>],
    offset: impl Fn(usize) -> usize,
) {
    let encoded = parallel_map(inputs.len(), |r| encode_all(dtype, &inputs[r]));
    for (r, (b, bytes)) in buffers.iter().zip(&encoded).enumerate() {
        // SAFETY: offsets inside the window (the callers size it with window_bytes).
        upload_bytes(unsafe { b.base.add(offset(r)) }, bytes);
    }
}
