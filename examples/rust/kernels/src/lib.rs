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
