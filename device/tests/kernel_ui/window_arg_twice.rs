// A window argument is opened once per kernel (two openings would share its barrier slots).
use symm_device::kernel::WindowArg;

symm_device::kernel! {
    fn k(block, window: WindowArg<f32>) {
        let _ = block.window(window, |_, _, _| ());
        let _ = block.window(window, |_, _, _| ());
    }
}

fn main() {}
