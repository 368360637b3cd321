// An in-kernel collective takes the window's slot, which an open frame holds: it cannot run
// inside a frame (the two would share the slot's epochs).
use symm_device::kernel::{Sum, WindowArg, all_reduce};

symm_device::kernel! {
    fn k(block, window: WindowArg<f32>) {
        let _ = block.window(window, |block, win, mut slot| {
            let span = win.span(0..4).unwrap();
            let slot_ref = &mut slot;
            let _ = slot_ref.frame(block, |block, _frame| all_reduce(block, win, &mut slot, span, Sum));
        });
    }
}

fn main() {}
