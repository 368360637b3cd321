// Only the element types the kernels move are windows' element types (Element is sealed).
use symm::{Comm, Window};

#[derive(Clone, Copy, Default)]
struct Pair(f32, f32);

fn main() {
    let comms = Comm::init_all(&[0]).unwrap();
    let _w: Window<Pair> = comms[0].window(8).unwrap();
}
