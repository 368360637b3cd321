// A window cannot be dropped (deregistered and freed) while a scope holds it.
use symm::{Comm, Stream, Window, scope};

fn main() {
    let comms = Comm::init_all(&[0]).unwrap();
    let mut w: Window<f32> = comms[0].window(8).unwrap();
    let _ = scope(|s| {
        let _b = s.bind(&mut w, Stream::default_stream());
        drop(w);
    });
}
