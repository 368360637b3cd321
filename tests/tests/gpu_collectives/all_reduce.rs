//! All-reduce and reduce on several ranks of one GPU: f32 sums at every count and placement
//! (refused beyond the LL buffers under `SYMM_ALGO=ll`), the same buffers reused, every data
//! type and operator, and reduce to every root.

use crate::reference::{decode_all, encode_all, rank_inputs, wrong_reduction};
use crate::sweep::{RANKS, counts, placements, runs_at, upload_inputs, window_bytes};
use crate::{
    cuda_ranks, download, download_bytes, forced_low_latency, largest_count, repeats, run_group,
    synchronize, upload, upload_bytes,
};
use std::ptr::null_mut;
use symm::*;
use symm_device::DataType;
use symm_tests::*;

fn run_and_check(buffers: &[RankBuffer], count: usize, send: usize, recv: usize, seed: u64) {
    let nranks = buffers.len();
    if forced_low_latency() && 4 * count > symm_device::sync::signal_pad::LL_MAX_BYTES {
        assert_low_latency_refuses(buffers, count, send, recv);
        return;
    }
    let inputs = random_inputs(nranks, count, seed);
    for (b, input) in buffers.iter().zip(&inputs) {
        // SAFETY: offsets inside the window (checked by the callers' sizes).
        upload(unsafe { b.base.add(send) }, input);
    }
    check(symmGroupStart(), null_mut());
    for b in buffers {
        // SAFETY: offsets inside the window.
        let (s, r) = unsafe { (b.base.add(send), b.base.add(recv)) };
        check(all_reduce_f32_sum(b.comm, s, r, count), b.comm);
    }
    check(symmGroupEnd(), null_mut());
    synchronize();
    // SAFETY: offsets inside the window.
    let results: Vec<Vec<f32>> = buffers
        .iter()
        .map(|b| download(unsafe { b.base.add(recv) }, count))
        .collect();
    assert_matches_f64_sum(&inputs, &results, &format!("{nranks} ranks, count {count}"));
}

/// Under `SYMM_ALGO=ll`, an all-reduce of more than the LL buffers hold is refused on every
/// rank with `symmInvalidArgument` (at the call or at the group's end), nothing runs, and the
/// communicators stay usable (the callers go on with smaller counts).
fn assert_low_latency_refuses(buffers: &[RankBuffer], count: usize, send: usize, recv: usize) {
    check(symmGroupStart(), null_mut());
    let mut refused = 0;
    for b in buffers {
        // SAFETY: offsets inside the window.
        let (s, r) = unsafe { (b.base.add(send), b.base.add(recv)) };
        let result = all_reduce_f32_sum(b.comm, s, r, count);
        if result != symmResult_t::symmSuccess {
            assert_eq!(
                result,
                symmResult_t::symmInvalidArgument,
                "{}",
                last_error(b.comm)
            );
            refused += 1;
        }
    }
    let end = symmGroupEnd();
    assert!(
        refused == buffers.len() || end == symmResult_t::symmInvalidArgument,
        "SYMM_ALGO=ll with {count} f32: {refused} of {} calls refused, group end {end:?}",
        buffers.len()
    );
    for b in buffers {
        assert_eq!(
            async_error(b.comm),
            symmResult_t::symmSuccess,
            "{}",
            last_error(b.comm)
        );
    }
}

gpu_test! {
    fn gpu_f32_sum_2_4_8_ranks_on_one_gpu() {
        for nranks in [2, 3, 4, 8] {
            let comms = cuda_ranks(nranks);
            let max = largest_count();
            let buffers = alloc_windows(&comms, 4 * (2 * max + 64));
            for (k, count) in [1usize, 7, 1023, 4099, max].into_iter().enumerate() {
                let seed = (nranks * 10 + k) as u64;
                run_and_check(&buffers, count, 0, 0, seed);
                run_and_check(&buffers, count, 16, 16, seed + 1);
                run_and_check(&buffers, count, 4, 4 * (count + 8), seed + 2);
            }
            teardown(buffers);
        }
    }
}

gpu_test! {
    fn gpu_same_buffers_1000_times() {
        let comms = cuda_ranks(8);
        let buffers = alloc_windows(&comms, 1 << 16);
        for iteration in 0..repeats(1000) {
            run_and_check(&buffers, 256, 0, 0, iteration);
        }
        teardown(buffers);
    }
}

gpu_test! {
    fn gpu_all_reduce_every_dtype_and_op() {
        for nranks in RANKS {
            let comms = cuda_ranks(nranks);
            let buffers = alloc_windows(&comms, window_bytes(1, largest_count()));
            for (d, dtype) in DataType::ALL.into_iter().enumerate() {
                let size = dtype.size_bytes();
                for op in 0..5 {
                    if !runs_at(nranks, d * 5 + op as usize) {
                        continue;
                    }
                    for (k, count) in counts().into_iter().enumerate() {
                        if forced_low_latency()
                            && count * size > symm_device::sync::signal_pad::LL_MAX_BYTES
                        {
                            // SYMM_ALGO=ll refuses payloads beyond the LL buffers (plan tests).
                            continue;
                        }
                        for at in placements(size, count * size, count * size) {
                            let seed = (nranks * 1000 + k * 10 + op as usize) as u64;
                            let inputs = rank_inputs(dtype, nranks, count, seed);
                            upload_inputs(&buffers, dtype, &inputs, |_| at.send);
                            run_group(
                                |_, b| {
                                    // SAFETY: offsets inside the window.
                                    let (s, r) = unsafe { (b.base.add(at.send), b.base.add(at.recv)) };
                                    symmAllReduce(
                                        s.cast(),
                                        r.cast(),
                                        count,
                                        dtype as i32,
                                        op,
                                        b.comm,
                                        null_mut(),
                                    )
                                },
                                &buffers,
                            );
                            // SAFETY: offsets inside the window.
                            let outputs: Vec<Vec<u8>> = buffers
                                .iter()
                                .map(|b| download_bytes(unsafe { b.base.add(at.recv) }, count * size))
                                .collect();
                            let case = format!("{nranks} ranks {dtype:?} op {op} count {count} {at:?}");
                            for out in &outputs[1..] {
                                assert!(out == &outputs[0], "{case}: ranks differ");
                            }
                            let got = decode_all(dtype, &outputs[0]);
                            if let Some(wrong) = wrong_reduction(dtype, op, &inputs, 0, &got, &case) {
                                panic!("{wrong}");
                            }
                        }
                    }
                }
            }
            teardown(buffers);
        }
    }
}

gpu_test! {
    /// `symmReduce` of every data type × operator (rotating over the rank counts), every root in
    /// turn, every placement: the root's result against the reference; every other rank's send
    /// buffer unchanged and its receive buffer (NULL on every other call) untouched.
    fn gpu_reduce_every_dtype_and_op_to_every_root() {
        for nranks in RANKS {
            let comms = cuda_ranks(nranks);
            let buffers = alloc_windows(&comms, window_bytes(1, largest_count()));
            let mut case_index = 0usize;
            for (d, dtype) in DataType::ALL.into_iter().enumerate() {
                let size = dtype.size_bytes();
                for op in 0..5 {
                    if !runs_at(nranks, d * 5 + op as usize) {
                        continue;
                    }
                    for (k, count) in counts().into_iter().enumerate() {
                        for at in placements(size, count * size, count * size) {
                            let root = case_index % nranks;
                            case_index += 1;
                            let seed = (nranks * 1000 + k * 10 + op as usize) as u64;
                            let inputs = rank_inputs(dtype, nranks, count, seed);
                            upload_inputs(&buffers, dtype, &inputs, |_| at.send);
                            let stale = vec![0xA5u8; count * size];
                            if at.recv != at.send {
                                for b in &buffers {
                                    // SAFETY: offsets inside the window.
                                    upload_bytes(unsafe { b.base.add(at.recv) }, &stale);
                                }
                            }
                            let null_off_root = case_index.is_multiple_of(2);
                            run_group(
                                |rank, b| {
                                    // SAFETY: offsets inside the window.
                                    let (s, r) = unsafe { (b.base.add(at.send), b.base.add(at.recv)) };
                                    let r = if rank != root && null_off_root {
                                        null_mut()
                                    } else {
                                        r
                                    };
                                    symmReduce(
                                        s.cast(),
                                        r.cast(),
                                        count,
                                        dtype as i32,
                                        op,
                                        root as i32,
                                        b.comm,
                                        null_mut(),
                                    )
                                },
                                &buffers,
                            );
                            let case = format!(
                                "reduce: {nranks} ranks {dtype:?} op {op} count {count} root {root} {at:?}"
                            );
                            // SAFETY: offsets inside the window.
                            let out = download_bytes(
                                unsafe { buffers[root].base.add(at.recv) },
                                count * size,
                            );
                            let got = decode_all(dtype, &out);
                            if let Some(wrong) = wrong_reduction(dtype, op, &inputs, 0, &got, &case) {
                                panic!("{wrong}");
                            }
                            for (rank, b) in buffers.iter().enumerate() {
                                if rank == root {
                                    continue;
                                }
                                // SAFETY: offsets inside the window.
                                let sent = download_bytes(unsafe { b.base.add(at.send) }, count * size);
                                assert!(
                                    sent == encode_all(dtype, &inputs[rank]),
                                    "{case}: rank {rank}'s send buffer changed"
                                );
                                if at.recv != at.send {
                                    // SAFETY: offsets inside the window.
                                    let received =
                                        download_bytes(unsafe { b.base.add(at.recv) }, count * size);
                                    assert!(
                                        received == stale,
                                        "{case}: rank {rank}'s receive buffer was written"
                                    );
                                }
                            }
                        }
                    }
                }
            }
            teardown(buffers);
        }
    }
}
