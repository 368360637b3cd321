//! Sends and receives between ranks of one GPU: rings of messages in groups, and a ring
//! captured in a graph and replayed.

use crate::graphs::replay_graph;
use crate::{cuda_ranks, download, repeats, synchronize, upload};
use cudarc::driver::sys;
use std::ptr::null_mut;
use symm::*;
use symm_device::DataType;
use symm_tests::*;

/// Every rank sends `count` f32 to each rank `shift` ahead and receives from the rank `shift`
/// behind, for each shift of `shifts` in turn, in one group over `buffers`: rank `r`'s `k`-th
/// message leaves from slot `k` of its window and lands in slot `shifts.len() + k` (slots of
/// `count + 5` elements, so that the two sides' offsets differ from the collectives' layout).
fn issue_ring(buffers: &[RankBuffer], count: usize, shifts: &[usize], stream: sys::CUstream) {
    let nranks = buffers.len();
    let slot = count + 5;
    check(symmGroupStart(), null_mut());
    for (rank, b) in buffers.iter().enumerate() {
        for (k, shift) in shifts.iter().enumerate() {
            let to = (rank + shift) % nranks;
            let from = (rank + nranks - shift % nranks) % nranks;
            // SAFETY: slots inside the window (sized by the callers).
            let (send, recv) = unsafe {
                (
                    b.base.add(4 * k * slot),
                    b.base.add(4 * (shifts.len() + k) * slot),
                )
            };
            let f32_ = DataType::Float32 as i32;
            let s = stream.cast();
            check(
                symmSend(send.cast(), count, f32_, to as i32, b.comm, s),
                b.comm,
            );
            check(
                symmRecv(recv.cast(), count, f32_, from as i32, b.comm, s),
                b.comm,
            );
        }
    }
    check(symmGroupEnd(), null_mut());
}

/// Check the receive slots of [`issue_ring`] against the inputs each rank sent (`inputs[r][k]`
/// its `k`-th message).
fn check_ring(
    buffers: &[RankBuffer],
    count: usize,
    shifts: &[usize],
    inputs: &[Vec<Vec<f32>>],
    what: &str,
) {
    let nranks = buffers.len();
    let slot = count + 5;
    for (rank, b) in buffers.iter().enumerate() {
        for (k, shift) in shifts.iter().enumerate() {
            let from = (rank + nranks - shift % nranks) % nranks;
            // SAFETY: a slot inside the window.
            let got = download(unsafe { b.base.add(4 * (shifts.len() + k) * slot) }, count);
            assert!(
                got == inputs[from][k],
                "{what}: rank {rank}, message {k} from rank {from} (count {count})"
            );
        }
    }
}

/// Random messages, `shifts.len()` per rank, uploaded into the send slots of [`issue_ring`].
fn ring_inputs(
    buffers: &[RankBuffer],
    count: usize,
    shifts: &[usize],
    seed: u64,
) -> Vec<Vec<Vec<f32>>> {
    let slot = count + 5;
    buffers
        .iter()
        .enumerate()
        .map(|(rank, b)| {
            (0..shifts.len())
                .map(|k| {
                    let values =
                        random_inputs(1, count, seed * 1000 + (rank * 64 + k) as u64).remove(0);
                    // SAFETY: a slot inside the window.
                    upload(unsafe { b.base.add(4 * k * slot) }, &values);
                    values
                })
                .collect()
        })
        .collect()
}

gpu_test! {
    /// Sends and receives between ranks of one GPU in groups (one launch serving every rank):
    /// rings both ways and to oneself, empty messages, odd tails, messages on four channels, and
    /// more sends to one peer than a channel has slots; repeated on the same windows, exact.
    fn gpu_send_and_recv_rings_on_one_gpu() {
        let nranks = 4;
        let comms = cuda_ranks(nranks);
        let largest = 300_017;
        let buffers = alloc_windows(&comms, 4 * 2 * 12 * (largest + 5) + 4096);
        let cases: [(usize, Vec<usize>); 5] = [
            (0, vec![1, 3]),
            (1, vec![1, 3, 0]),
            (4099, vec![1, 2, 3]),
            (largest, vec![1, 3]),
            (1029, vec![1; 11]),
        ];
        for round in 0..repeats(3) {
            for (count, shifts) in &cases {
                let inputs = ring_inputs(&buffers, *count, shifts, round);
                issue_ring(&buffers, *count, shifts, null_mut());
                synchronize();
                check_ring(&buffers, *count, shifts, &inputs, &format!("round {round}"));
            }
        }
        teardown(buffers);
    }
}

gpu_test! {
    /// A group of sends and receives (a ring both ways) captured in a graph and replayed with new
    /// inputs: every replay pairs anew (the sequence numbers live in device memory), exact.
    fn gpu_graph_capture_of_send_and_recv() {
        let nranks = 4;
        let count = 70_001;
        let shifts = [1, 3];
        let comms = cuda_ranks(nranks);
        let buffers = alloc_windows(&comms, 4 * 4 * (count + 5) + 4096);
        replay_graph(
            &buffers,
            repeats(50),
            |stream| issue_ring(&buffers, count, &shifts, stream),
            |replay, run| {
                let inputs = ring_inputs(&buffers, count, &shifts, replay + 7);
                run();
                check_ring(
                    &buffers,
                    count,
                    &shifts,
                    &inputs,
                    &format!("graph replay {replay}"),
                );
            },
        );
        teardown(buffers);
    }
}
