// The element type is the data type: an all-reduce of f32 into i32 does not compile.
use symm::{Comm, ReduceOp, Stream, Window, scope};

fn main() {
    let comms = Comm::init_all(&[0]).unwrap();
    let mut a: Window<f32> = comms[0].window(8).unwrap();
    let mut b: Window<i32> = comms[0].window(8).unwrap();
    let _ = scope(|s| {
        let ab = s.bind(&mut a, Stream::default_stream());
        let bb = s.bind(&mut b, Stream::default_stream());
        s.all_reduce(ab.all(), bb.all(), ReduceOp::Sum)
    });
}
