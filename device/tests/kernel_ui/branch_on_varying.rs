// A value that differs by thread cannot be branched on outside a lane: `Varying` has no
// comparison and no accessor but a lane's.
use symm_device::kernel::WindowArg;

symm_device::kernel! {
    fn k(block, window: WindowArg<f32>) {
        let _ = window;
        let index = block.per_thread((), |lane, ()| lane.thread());
        if index == 0 {
            block.sync();
        }
    }
}

fn main() {}
