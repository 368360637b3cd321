// Peer access takes a span of the window, never a raw offset.
use symm_device::kernel::WindowArg;

symm_device::kernel! {
    fn k(block, window: WindowArg<f32>) {
        let _ = block.window(window, |block, win, mut slot| {
            let me = win.me();
            let _ = slot.frame(block, |block, frame| {
                frame.per_thread(block, (win, me), |lane, (win, me)| lane.read_peer(win, me, 17u64, 0));
            });
        });
    }
}

fn main() {}
