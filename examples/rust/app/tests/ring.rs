//! The example's kernel on every rank, a thread each: launched through `Scope::launch` (on the
//! host backend by default, on the cuda backend with `SYMM_BACKEND=cuda`), checked against the
//! values written.

use symm::{Comm, Stream, UniqueId, Window, scope};
use symm_example::RING_THEN_SUM;

fn value(rank: usize, i: usize) -> f32 {
    (rank * 100 + i) as f32
}

#[test]
fn ring_then_sum_on_every_rank() {
    for nranks in [1usize, 2, 3] {
        let n = 257usize;
        let id = UniqueId::new().unwrap();
        std::thread::scope(|s| {
            for rank in 0..nranks {
                s.spawn(move || {
                    let comm = Comm::init_rank(nranks, &id, rank).unwrap();
                    let stream = Stream::new(&comm).unwrap();
                    let mut window: Window<f32> = comm.window(3 * n).unwrap();
                    let data: Vec<f32> = (0..n).map(|i| value(rank, i)).collect();
                    window.write(0, &data).unwrap();
                    window.write(2 * n, &data).unwrap();
                    scope(|s| {
                        let bound = s.bind(&mut window, &stream);
                        let args = (bound.kernel_arg(), n as u64, 0.5f32);
                        s.launch(&bound, &RING_THEN_SUM, 2, 64, args)
                    })
                    .unwrap()
                    .unwrap();
                    let got = window.to_vec().unwrap();
                    let next = (rank + 1) % nranks;
                    for i in 0..n {
                        let sum: f32 = (0..nranks).map(|r| value(r, i)).sum();
                        assert_eq!(
                            got[i],
                            value(rank, i),
                            "{nranks} ranks: data {i} on rank {rank}"
                        );
                        assert_eq!(got[n + i], value(next, i) * 0.5, "copy {i} on rank {rank}");
                        assert_eq!(
                            got[2 * n + i],
                            sum,
                            "{nranks} ranks: sum {i} on rank {rank}"
                        );
                    }
                    drop(window);
                    comm.destroy().unwrap();
                });
            }
        });
    }
}
