//! The example's kernels on every rank, a thread each: launched through `Scope::launch` (on the
//! host backend by default, on the cuda backend with `SYMM_BACKEND=cuda`), checked against the
//! values written. The `on_a_gpu_*` tests are the same checks, ignored unless asked for and
//! insisting on the cuda backend: the `gpu` nextest profile runs them with the GPU set.

use symm::{Comm, Stream, UniqueId, Window, scope};
use symm_example::{RING_THEN_SUM, TILES_THEN_SUM};

fn value(rank: usize, i: usize) -> f32 {
    (rank * 100 + i) as f32
}

/// Run `body` on `nranks` ranks of a new communicator, a thread each, with the rank, its
/// communicator and a stream; destroy the communicator after. With `gpu`, fail unless the
/// ranks run on the cuda backend.
fn on_every_rank(nranks: usize, gpu: bool, body: impl Fn(usize, &Comm, &Stream) + Sync) {
    let id = UniqueId::new().unwrap();
    std::thread::scope(|s| {
        for rank in 0..nranks {
            let (id, body) = (&id, &body);
            s.spawn(move || {
                let comm = Comm::init_rank(nranks, id, rank).unwrap();
                if gpu {
                    let backend = comm.backend();
                    assert_eq!(backend, "cuda", "run the GPU tests with SYMM_BACKEND=cuda");
                }
                let stream = Stream::new(&comm).unwrap();
                body(rank, &comm, &stream);
                drop(stream);
                comm.destroy().unwrap();
            });
        }
    });
}

#[test]
fn ring_then_sum_on_every_rank() {
    ring_then_sum(false);
}

#[test]
#[ignore = "needs a CUDA GPU: SYMM_BACKEND=cuda cargo test -p symm-example -- --ignored"]
fn on_a_gpu_ring_then_sum() {
    ring_then_sum(true);
}

#[test]
fn tiles_then_sum_on_every_rank() {
    tiles_then_sum(false);
}

#[test]
#[ignore = "needs a CUDA GPU: SYMM_BACKEND=cuda cargo test -p symm-example -- --ignored"]
fn on_a_gpu_tiles_then_sum() {
    tiles_then_sum(true);
}

fn ring_then_sum(gpu: bool) {
    for nranks in [1usize, 2, 3] {
        let n = 257usize;
        on_every_rank(nranks, gpu, |rank, comm, stream| {
            let mut window: Window<f32> = comm.window(3 * n).unwrap();
            let data: Vec<f32> = (0..n).map(|i| value(rank, i)).collect();
            window.write(0, &data).unwrap();
            window.write(2 * n, &data).unwrap();
            scope(|s| {
                let bound = s.bind(&mut window, stream);
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
        });
    }
}

fn tiles_then_sum(gpu: bool) {
    for (nranks, blocks, tiles) in [(1usize, 2u32, 5u32), (2, 3, 40), (3, 4, 4), (2, 4, 3)] {
        let n = 1001usize;
        on_every_rank(nranks, gpu, |_, comm, stream| {
            let mut window: Window<f32> = comm.window(n + blocks as usize).unwrap();
            // Twice on one window: the scheduler's state is reused.
            for round in 0..2 {
                window
                    .write(0, &vec![-1.0f32; n + blocks as usize])
                    .unwrap();
                scope(|s| {
                    let bound = s.bind(&mut window, stream);
                    let args = (bound.kernel_arg(), n as u64, tiles);
                    s.launch(&bound, &TILES_THEN_SUM, blocks, 64, args)
                })
                .unwrap()
                .unwrap();
                let got = window.to_vec().unwrap();
                let case = format!("{nranks} ranks, {blocks} blocks, {tiles} tiles");
                let ranks_sum = (nranks * (nranks + 1) / 2) as f32;
                for (i, value) in got[..n].iter().enumerate() {
                    let want = ranks_sum * (i % 97) as f32;
                    assert_eq!(*value, want, "{case}, round {round}: element {i}");
                }
                let ran: f32 = got[n..].iter().sum();
                assert_eq!(ran, tiles as f32, "{case}: tiles the blocks ran");
            }
        });
    }
}
