// The typed device API used as intended compiles: a window opened once, spans and peers from
// it, peer access inside a frame, the in-kernel collectives outside frames.
use symm_device::kernel::{Sum, WindowArg, all_reduce, barrier};

symm_device::kernel! {
    fn ring(block, window: WindowArg<f32>, n: u64) {
        let _ = block.window(window, |block, win, mut slot| {
            let (Some(data), Some(next)) = (win.span(0..n), win.peer((win.rank() + 1) % win.world())) else {
                return;
            };
            let _ = slot.frame(block, |block, frame| {
                let read = frame.per_thread(block, (win, next, data), |lane, (win, next, data)| {
                    lane.read_peer(win, next, data, lane.thread() as u64).unwrap_or(0.0)
                });
                read.map(|read| {
                    let positive = block.per_thread(read, |lane, read| read.get(&lane) > 0.0);
                    block.any(positive)
                })
            });
            let _ = all_reduce(block, win, &mut slot, data, Sum);
            let _ = barrier(block, &mut slot);
        });
    }
}

fn main() {
    let _ = ring as fn(WindowArg<f32>, u64);
}
