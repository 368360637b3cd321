// A frame is lent to its closure: it cannot be kept past its closing barrier.
use symm_device::kernel::WindowArg;

symm_device::kernel! {
    fn k(block, window: WindowArg<f32>) {
        let _ = block.window(window, |block, _win, mut slot| {
            let _kept = slot.frame(block, |_, frame| frame);
        });
    }
}

fn main() {}
