// A span (or a peer) of one window cannot be used with another: each opening brands its own.
use symm_device::kernel::WindowArg;

symm_device::kernel! {
    fn k(block, a: WindowArg<f32>, b: WindowArg<f32>) {
        let _ = block.window(a, |block, win_a, _| {
            let span_a = win_a.span(0..4).unwrap();
            let _ = block.window(b, |block, win_b, _| {
                block.per_thread((win_b, span_a), |lane, (win_b, span_a)| lane.read(win_b, span_a, 0));
            });
        });
    }
}

fn main() {}
