// A window's handles cannot leave the closure that opened it.
use symm_device::kernel::WindowArg;

symm_device::kernel! {
    fn k(block, window: WindowArg<f32>) {
        let _escaped = block.window(window, |_, win, _| win);
    }
}

fn main() {}
