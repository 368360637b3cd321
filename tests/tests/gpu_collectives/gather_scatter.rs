//! The collectives that move segments or a root's data: all-gather with reduce-scatter,
//! broadcast from every root, all-to-all, gather and scatter, and all-to-all-v with its counts
//! in device memory (also replayed in a graph).

use crate::graphs::replay_graph;
use crate::reference::{
    decode_all, encode_all, input_value, parallel_map, rank_inputs, wrong_reduction,
};
use crate::sweep::{RANKS, counts, placements, runs_at, upload_inputs, window_bytes};
use crate::{cuda_ranks, download_bytes, largest_count, repeats, run_group, upload_bytes};
use cudarc::driver::sys;
use std::ptr::null_mut;
use symm::*;
use symm_device::DataType;
use symm_tests::*;

gpu_test! {
    fn gpu_all_gather_and_reduce_scatter_every_dtype() {
        for nranks in RANKS {
            let comms = cuda_ranks(nranks);
            let max = largest_count();
            let buffers = alloc_windows(&comms, window_bytes(nranks, max));
            for (d, dtype) in DataType::ALL.into_iter().enumerate() {
                let size = dtype.size_bytes();
                for (k, count) in counts().into_iter().enumerate() {
                    if !runs_at(nranks, d + k) {
                        continue;
                    }
                    let segment = count * size;
                    for at in placements(size, nranks * segment, nranks * segment) {
                        let seed = (nranks * 100 + count) as u64;
                        // All-gather: rank r's `count` elements land in segment r of every rank.
                        let inputs = rank_inputs(dtype, nranks, count, seed);
                        upload_inputs(&buffers, dtype, &inputs, |_| at.send);
                        if at.send == at.recv {
                            // In place: the send buffer is the rank's own segment of the output.
                            upload_inputs(&buffers, dtype, &inputs, |r| at.recv + r * segment);
                        }
                        run_group(
                            |rank, b| {
                                let send = at.rank_offset(rank, segment, at.send);
                                // SAFETY: offsets inside the window.
                                let (s, r) = unsafe { (b.base.add(send), b.base.add(at.recv)) };
                                symmAllGather(
                                    s.cast(),
                                    r.cast(),
                                    count,
                                    dtype as i32,
                                    b.comm,
                                    null_mut(),
                                )
                            },
                            &buffers,
                        );
                        let case = format!("all_gather {nranks} ranks {dtype:?} count {count} {at:?}");
                        let all: Vec<u8> =
                            parallel_map(nranks, |r| encode_all(dtype, &inputs[r])).concat();
                        for b in &buffers {
                            // SAFETY: offsets inside the window.
                            let out = download_bytes(unsafe { b.base.add(at.recv) }, nranks * segment);
                            assert!(out == all, "{case}");
                        }

                        // Reduce-scatter (sum): rank r receives the sum of segment r over ranks.
                        let inputs = rank_inputs(dtype, nranks, nranks * count, seed + 1);
                        upload_inputs(&buffers, dtype, &inputs, |_| at.send);
                        run_group(
                            |rank, b| {
                                let recv = at.rank_offset(rank, segment, at.recv);
                                // SAFETY: offsets inside the window.
                                let (s, r) = unsafe { (b.base.add(at.send), b.base.add(recv)) };
                                symmReduceScatter(
                                    s.cast(),
                                    r.cast(),
                                    count,
                                    dtype as i32,
                                    0,
                                    b.comm,
                                    null_mut(),
                                )
                            },
                            &buffers,
                        );
                        let case =
                            format!("reduce_scatter {nranks} ranks {dtype:?} count {count} {at:?}");
                        for (rank, b) in buffers.iter().enumerate() {
                            let recv = at.rank_offset(rank, segment, at.recv);
                            // SAFETY: offsets inside the window.
                            let got = decode_all(
                                dtype,
                                &download_bytes(unsafe { b.base.add(recv) }, segment),
                            );
                            let case = format!("{case}: rank {rank}");
                            let first = rank * count;
                            if let Some(wrong) = wrong_reduction(dtype, 0, &inputs, first, &got, &case)
                            {
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
    /// Broadcast of every data type, at every count and placement, the root rotating so that each
    /// rank count sees every root: the root's bytes, exactly, on every rank; nothing written past
    /// the receive buffer; the other ranks' send buffers (NULL on some calls) untouched.
    fn gpu_broadcast_every_dtype_from_every_root() {
        for nranks in RANKS {
            let comms = cuda_ranks(nranks);
            let max = largest_count();
            let buffers = alloc_windows(&comms, window_bytes(1, max));
            let mut case_index = 0usize;
            for (d, dtype) in DataType::ALL.into_iter().enumerate() {
                let size = dtype.size_bytes();
                for (k, count) in counts().into_iter().enumerate() {
                    if !runs_at(nranks, d + k) {
                        continue;
                    }
                    let bytes = count * size;
                    for at in placements(size, bytes, bytes) {
                        let root = case_index % nranks;
                        case_index += 1;
                        let seed = (nranks * 100 + count + d) as u64;
                        let inputs: Vec<Vec<u8>> = parallel_map(nranks, |r| {
                            let values: Vec<f64> =
                                (0..count).map(|i| input_value(dtype, r, i, seed)).collect();
                            encode_all(dtype, &values)
                        });
                        let guard = vec![0x5Au8; 16];
                        for (b, input) in buffers.iter().zip(&inputs) {
                            // SAFETY: offsets inside the window (window_bytes).
                            unsafe {
                                if at.send != at.recv {
                                    upload_bytes(b.base.add(at.recv), &vec![0xA5; bytes]);
                                }
                                upload_bytes(b.base.add(at.send), input);
                                upload_bytes(b.base.add(at.recv + bytes), &guard);
                            }
                        }
                        run_group(
                            |rank, b| {
                                // SAFETY: offsets inside the window.
                                let (s, r) = unsafe { (b.base.add(at.send), b.base.add(at.recv)) };
                                let s = if rank != root && case_index.is_multiple_of(2) {
                                    std::ptr::null_mut()
                                } else {
                                    s
                                };
                                symmBroadcast(
                                    s.cast(),
                                    r.cast(),
                                    count,
                                    dtype as i32,
                                    root as i32,
                                    b.comm,
                                    null_mut(),
                                )
                            },
                            &buffers,
                        );
                        let case = format!(
                            "broadcast {nranks} ranks {dtype:?} count {count} root {root} {at:?}"
                        );
                        for (rank, b) in buffers.iter().enumerate() {
                            // SAFETY: offsets inside the window.
                            let out = download_bytes(unsafe { b.base.add(at.recv) }, bytes + 16);
                            assert!(out[..bytes] == inputs[root][..], "{case}: rank {rank}");
                            assert!(
                                out[bytes..] == guard[..],
                                "{case}: rank {rank}: past the end"
                            );
                            if at.send != at.recv {
                                // SAFETY: offsets inside the window.
                                let sent = download_bytes(unsafe { b.base.add(at.send) }, bytes);
                                assert!(sent == inputs[rank], "{case}: rank {rank}'s sendbuff");
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
    /// All-to-all, gather and scatter of a data type of each size, at every count, the root
    /// rotating: every rank's send and receive regions (and 16 guard bytes after them) compared
    /// byte for byte with a reference built from the inputs; the ranks that do not use a buffer
    /// pass NULL for it on every other call.
    fn gpu_all_to_all_gather_and_scatter() {
        #[derive(Clone, Copy, Debug, PartialEq)]
        enum Coll {
            AllToAll,
            Gather,
            Scatter,
        }
        for nranks in RANKS {
            let comms = cuda_ranks(nranks);
            let buffers = alloc_windows(&comms, window_bytes(nranks, largest_count().min(70_001)));
            let mut case_index = 0usize;
            let dtypes = [
                DataType::Uint8,
                DataType::Bfloat16,
                DataType::Float32,
                DataType::Float64,
            ];
            // Whole windows are compared on the host: the largest count is kept to 70001.
            let counts = counts().map(|c| c.min(70_001));
            for (d, dtype) in dtypes.into_iter().enumerate() {
                let size = dtype.size_bytes();
                for (k, count) in counts.into_iter().enumerate() {
                    if !runs_at(nranks, d + k) {
                        continue;
                    }
                    let whole = nranks * count * size;
                    // The send region first, one element past 64 bytes; the receive region after it.
                    let send = 64 + size;
                    let recv = (send + whole + 64).next_multiple_of(16) + size;
                    let span = recv + whole + 16;
                    for coll in [Coll::AllToAll, Coll::Gather, Coll::Scatter] {
                        let root = case_index % nranks;
                        case_index += 1;
                        let before: Vec<Vec<u8>> = parallel_map(nranks, |r| {
                            (0..span)
                                .map(|i| (i * 131 + r * 7 + case_index * 13) as u8)
                                .collect()
                        });
                        for (b, bytes) in buffers.iter().zip(&before) {
                            upload_bytes(b.base, bytes);
                        }
                        let null_off_root = case_index.is_multiple_of(2);
                        run_group(
                            |rank, b| {
                                // SAFETY: offsets inside the window (window_bytes).
                                let (s, d) = unsafe { (b.base.add(send), b.base.add(recv)) };
                                let unused = rank != root && null_off_root;
                                match coll {
                                    Coll::AllToAll => symmAlltoAll(
                                        s.cast(),
                                        d.cast(),
                                        count,
                                        dtype as i32,
                                        b.comm,
                                        null_mut(),
                                    ),
                                    Coll::Gather => symmGather(
                                        s.cast(),
                                        if unused { null_mut() } else { d.cast() },
                                        count,
                                        dtype as i32,
                                        root as i32,
                                        b.comm,
                                        null_mut(),
                                    ),
                                    Coll::Scatter => symmScatter(
                                        if unused { null_mut() } else { s.cast() },
                                        d.cast(),
                                        count,
                                        dtype as i32,
                                        root as i32,
                                        b.comm,
                                        null_mut(),
                                    ),
                                }
                            },
                            &buffers,
                        );
                        let share = count * size;
                        let mut want = before.clone();
                        match coll {
                            Coll::AllToAll => {
                                for (p, window) in want.iter_mut().enumerate() {
                                    for (r, sender) in before.iter().enumerate() {
                                        window[recv + r * share..][..share]
                                            .copy_from_slice(&sender[send + p * share..][..share]);
                                    }
                                }
                            }
                            Coll::Gather => {
                                for (r, sender) in before.iter().enumerate() {
                                    want[root][recv + r * share..][..share]
                                        .copy_from_slice(&sender[send..][..share]);
                                }
                            }
                            Coll::Scatter => {
                                for (p, window) in want.iter_mut().enumerate() {
                                    window[recv..][..share]
                                        .copy_from_slice(&before[root][send + p * share..][..share]);
                                }
                            }
                        }
                        let case =
                            format!("{coll:?} {nranks} ranks {dtype:?} count {count} root {root}");
                        for (rank, b) in buffers.iter().enumerate() {
                            let got = download_bytes(b.base, span);
                            if let Some(at) = (0..span).find(|&i| got[i] != want[rank][i]) {
                                panic!(
                                    "{case}: rank {rank}, byte {at}: {} instead of {}",
                                    got[at], want[rank][at]
                                );
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
    /// All-to-all-v with its counts in device memory, 4 ranks on one GPU: a large call (many
    /// blocks, segments of odd lengths) checked against the reference, then a group captured in a
    /// graph and replayed 30 times with new counts and data written before each replay: the
    /// kernel reads the counts at each replay, no host synchronization, exact.
    fn gpu_all_to_all_v_with_device_counts_and_graph_replays() {
        let nranks = 4;
        let element = 4usize;
        let bound = 100_003usize;
        let (send, recv) = (0usize, (bound * element).div_ceil(256) * 256);
        let table = recv + (bound * element).div_ceil(256) * 256;
        let comms = cuda_ranks(nranks);
        let buffers = alloc_windows(&comms, table + 4096);
        let f32_type = symmDataType_t::symmFloat32 as i32;
        let counts_of = |seed: u64| -> Vec<Vec<i64>> {
            let mut rng = Rng(seed);
            let share = (bound / nranks) as u64;
            (0..nranks)
                .map(|_| {
                    (0..nranks)
                        .map(|_| match rng.next_u64() % 4 {
                            0 => 0,
                            1 => share as i64,
                            _ => (rng.next_u64() % (share + 1)) as i64,
                        })
                        .collect()
                })
                .collect()
        };
        let plant = |seed: u64, counts: &[Vec<i64>]| -> Vec<Vec<u8>> {
            buffers
                .iter()
                .enumerate()
                .map(|(rank, b)| {
                    let data: Vec<u8> = (0..bound * element)
                        .map(|i| (i * 5 + rank * 17 + seed as usize * 3 + i / 509) as u8)
                        .collect();
                    let row: Vec<u8> = counts[rank].iter().flat_map(|v| v.to_ne_bytes()).collect();
                    // SAFETY: offsets inside the window.
                    unsafe {
                        put_bytes(b.base.add(send), &data);
                        put_bytes(b.base.add(table), &row);
                    }
                    data
                })
                .collect()
        };
        let check_all = |counts: &[Vec<i64>], data: &[Vec<u8>], what: &str| {
            for (rank, b) in buffers.iter().enumerate() {
                let mut want = Vec::new();
                let mut rows = vec![0i64; 2 * nranks];
                for from in 0..nranks {
                    let start = counts[from][..rank].iter().sum::<i64>() as usize * element;
                    let n = counts[from][rank] as usize * element;
                    rows[from] = counts[from][rank];
                    rows[nranks + from] = (want.len() / element) as i64;
                    want.extend_from_slice(&data[from][start..start + n]);
                }
                // SAFETY: offsets inside the window.
                let (got, got_table) = unsafe {
                    (
                        get_bytes(b.base.add(recv), want.len()),
                        get_bytes(b.base.add(table + 8 * nranks), 16 * nranks),
                    )
                };
                assert!(got == want, "{what}: rank {rank}'s received segments");
                let got_rows: Vec<i64> = got_table
                    .chunks(8)
                    .map(|c| i64::from_ne_bytes(c.try_into().unwrap()))
                    .collect();
                assert_eq!(got_rows, rows, "{what}: rank {rank}'s rows 1 and 2");
            }
        };
        let issue = |stream: sys::CUstream| {
            check(symmGroupStart(), null_mut());
            for b in &buffers {
                // SAFETY: offsets inside the window.
                let result = unsafe {
                    symmAlltoAllvDevice(
                        b.base.add(send).cast(),
                        bound,
                        b.base.add(recv).cast(),
                        bound,
                        b.base.add(table).cast(),
                        f32_type,
                        b.comm,
                        stream.cast(),
                    )
                };
                check(result, b.comm);
            }
            check(symmGroupEnd(), null_mut());
        };
        let counts = counts_of(1);
        let data = plant(1, &counts);
        issue(null_mut());
        // SAFETY: a context is current (the windows were made in it).
        unsafe { sys::cuCtxSynchronize() }.result().unwrap();
        check_all(&counts, &data, "a call");
        replay_graph(&buffers, repeats(30), issue, |replay, run| {
            let counts = counts_of(replay + 2);
            let data = plant(replay + 2, &counts);
            run();
            check_all(&counts, &data, &format!("graph replay {replay}"));
        });
        teardown(buffers);
    }
}
