// A communicator outlives its windows.
use symm::{Comm, Window};

fn main() {
    let comm = Comm::init_all(&[0]).unwrap().pop().unwrap();
    let w: Window<f32> = comm.window(8).unwrap();
    drop(comm);
    let _ = w.len();
}
