// A peer is made only by `Win::me` and `Win::peer` (which checks the rank): its field is private.
use symm_device::kernel::{Peer, WindowArg};

symm_device::kernel! {
    fn k(block, window: WindowArg<f32>) {
        let _ = block.window(window, |_, _win, _| {
            let _peer = Peer { rank: 3, brand: core::marker::PhantomData };
        });
    }
}

fn main() {}
