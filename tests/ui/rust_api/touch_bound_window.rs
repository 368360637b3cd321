// A window bound to a scope cannot be written while the scope may still use it.
use symm::{Comm, ReduceOp, Stream, Window, scope};

fn main() {
    let comms = Comm::init_all(&[0]).unwrap();
    let mut w: Window<f32> = comms[0].window(8).unwrap();
    let _ = scope(|s| {
        let b = s.bind(&mut w, Stream::default_stream());
        s.all_reduce(b.all(), b.all(), ReduceOp::Sum).unwrap();
        w.write(0, &[2.0; 8]).unwrap();
    });
}
