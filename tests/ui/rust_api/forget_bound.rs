// Forgetting the bound window ends no borrow: the borrow is the scope's, not a guard's.
use symm::{Comm, ReduceOp, Stream, Window, scope};

fn main() {
    let comms = Comm::init_all(&[0]).unwrap();
    let mut w: Window<f32> = comms[0].window(8).unwrap();
    let _ = scope(|s| {
        let b = s.bind(&mut w, Stream::default_stream());
        s.all_reduce(b.all(), b.all(), ReduceOp::Sum).unwrap();
        std::mem::forget(b);
        let _ = w.to_vec();
    });
}
