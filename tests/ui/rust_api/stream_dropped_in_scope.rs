// The stream a window is bound on lives as long as the scope.
use symm::{Comm, Stream, Window, scope};

fn main() {
    let comms = Comm::init_all(&[0]).unwrap();
    let stream = Stream::new(&comms[0]).unwrap();
    let mut w: Window<f32> = comms[0].window(8).unwrap();
    let _ = scope(|s| {
        let _b = s.bind(&mut w, &stream);
        drop(stream);
    });
}
