// The contracts' correct use compiles: a window bound for a scope, spans of it in collectives,
// and the window readable again once the scope has returned.
use symm::{Comm, ReduceOp, Stream, Window, scope};

fn main() -> Result<(), symm::Error> {
    let comms = Comm::init_all(&[0])?;
    let stream = Stream::new(&comms[0])?;
    let mut w: Window<f32> = comms[0].window(8)?;
    w.write(0, &[1.0; 8])?;
    scope(|s| {
        let b = s.bind(&mut w, &stream);
        s.all_reduce(b.all(), b.all(), ReduceOp::Sum)
    })??;
    assert_eq!(w.to_vec()?, vec![1.0; 8]);
    Ok(())
}
