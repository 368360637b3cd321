// Per-thread work is a `fn` pointer: a closure that captures the block (to reach a barrier
// from code that depends on the thread) does not coerce to one.
use symm_device::kernel::WindowArg;

symm_device::kernel! {
    fn k(block, window: WindowArg<f32>) {
        let _ = block.window(window, |block, _win, mut slot| {
            let slot = &mut slot;
            block.per_thread((), |lane, ()| {
                if lane.thread() == 0 {
                    let _ = symm_device::kernel::barrier(block, slot);
                }
            });
        });
    }
}

fn main() {}
