// A span's element type is its window's: a span of an f32 window does not reduce as i32.
use symm_device::kernel::{Sum, WindowArg, all_reduce};

symm_device::kernel! {
    fn k(block, window: WindowArg<f32>) {
        let _ = block.window(window, |block, win, mut slot| {
            let span = win.span(0..4).unwrap();
            let _ = all_reduce::<i32, Sum>(block, win, &mut slot, span, Sum);
        });
    }
}

fn main() {}
