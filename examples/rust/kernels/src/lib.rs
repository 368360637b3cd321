//! Kernels written with `symm_device::kernel!`: the same source is compiled to PTX for the GPU
//! (by the launching crate's build script, with `symm-build`) and, for the host, to functions
//! the host backend runs on emulated threads. No `unsafe` here.

#![no_std]
#![cfg_attr(target_arch = "nvptx64", feature(abi_ptx))]

use symm_device::kernel::{Sum, WindowArg, all_reduce};

symm_device::kernel! {
    /// Each rank's window holds `3n` elements: `[n, 2n)` gets `scale` times the next rank's
    /// `[0, n)` (read inside a frame), and `[2n, 3n)` is summed over the ranks in place, in the
    /// kernel.
    pub fn ring_then_sum(block, window: WindowArg<f32>, n: u64, scale: f32) {
        let _ = block.window(window, |block, win, mut slot| {
            let spans = (win.span(0..n), win.span(n..2 * n), win.span(2 * n..3 * n));
            let (Some(mine), Some(copy), Some(total)) = spans else {
                return;
            };
            let Some(next) = win.peer((win.rank() + 1) % win.world()) else {
                return;
            };
            let args = (win, next, mine, copy, scale);
            let read = slot.frame(block, |block, frame| {
                frame.per_thread(block, args, |lane, (win, next, mine, copy, scale)| {
                    for i in lane.share(mine.len()) {
                        if let Some(value) = lane.read_peer(win, next, mine, i) {
                            lane.write(win, copy, i, value * scale);
                        }
                    }
                })
            });
            if let Ok(Ok(_)) = read {
                let _ = all_reduce(block, win, &mut slot, total, Sum);
            }
        });
    }
}

symm_device::kernel! {
    /// Each rank's window holds `n` elements and then one per block: `[0, n)` is cut into
    /// `tiles` tiles that the blocks share out with the Cluster Launch Control scheduler (a
    /// block that finishes early steals tiles that are left), each tile writing
    /// `(rank + 1) · (i mod 97)` into its elements; then `[0, n)` is summed over the ranks in
    /// place, in the kernel. Element `n + b` gets the number of tiles block `b` ran.
    pub fn tiles_then_sum(block, window: WindowArg<f32>, n: u64, tiles: u32) {
        let _ = block.window(window, |block, win, mut slot| {
            let (Some(data), Some(counts)) =
                (win.span(0..n), win.span(n..n + block.blocks() as u64))
            else {
                return;
            };
            let args = (win, data, n, tiles);
            let ran = slot.for_each_tile(block, tiles, args, |lane, tile, (win, data, n, tiles)| {
                let per_tile = n.div_ceil(tiles as u64);
                let first = (tile.0 as u64 * per_tile).min(n);
                let end = (first + per_tile).min(n);
                let start = first + lane.thread() as u64;
                for i in (start..end).step_by(lane.threads() as usize) {
                    lane.write(win, data, i, (win.rank() + 1) as f32 * (i % 97) as f32);
                }
            });
            let Ok(stats) = ran else {
                return;
            };
            if all_reduce(block, win, &mut slot, data, Sum).is_err() {
                return;
            }
            let args = (win, counts, block.index() as u64, stats.tiles as f32);
            block.per_thread(args, |lane, (win, counts, index, ran)| {
                if lane.thread() == 0 {
                    lane.write(win, counts, index, ran);
                }
            });
        });
    }
}
