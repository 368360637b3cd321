// A peer's window is reachable only inside a frame: a plain lane has no peer access.
use symm_device::kernel::WindowArg;

symm_device::kernel! {
    fn k(block, window: WindowArg<f32>) {
        let _ = block.window(window, |block, win, _| {
            let (peer, span) = (win.peer(0).unwrap(), win.span(0..4).unwrap());
            block.per_thread((win, peer, span), |lane, (win, peer, span)| lane.read_peer(win, peer, span, 0));
        });
    }
}

fn main() {}
