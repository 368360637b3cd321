// A bound window cannot leave its scope.
use symm::{Comm, Stream, Window, scope};

fn main() {
    let comms = Comm::init_all(&[0]).unwrap();
    let mut w: Window<f32> = comms[0].window(8).unwrap();
    let _escaped = scope(|s| s.bind(&mut w, Stream::default_stream()));
}
