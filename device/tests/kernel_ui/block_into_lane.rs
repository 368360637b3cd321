// The block cannot be handed to per-thread work as an argument either: a reference to it is
// not `Send`.
use symm_device::kernel::{Block, WindowArg};

fn on_thread(_lane: symm_device::kernel::Lane<'_>, _block: &Block) {}

symm_device::kernel! {
    fn k(block, window: WindowArg<f32>) {
        let _ = window;
        let shared: &Block = block;
        shared.per_thread(shared, on_thread);
    }
}

fn main() {}
