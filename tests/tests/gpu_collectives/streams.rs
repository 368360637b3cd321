//! Ordering across streams, threads and calls: teardown right after a collective, a stream
//! per rank in a group, a thread and a stream per rank, a seeded sequence of mixed calls on one
//! window against a host model, in-place sums chained across threads, and a rank running ahead
//! of a lagging peer.

use crate::per_rank::{GpuRank, per_rank_on_streams};
use crate::{
    count_under_forced_algorithm, cuda_ranks, download, download_bytes, forced_low_latency,
    largest_count, repeats, synchronize, upload, upload_bytes,
};
use cudarc::driver::sys;
use std::ptr::null_mut;
use std::time::Duration;
use symm::*;
use symm_device::DataType;
use symm_tests::*;

gpu_test! {
    /// Teardown right after a collective, without synchronizing its stream first: a large
    /// out-of-place all-reduce from each rank's send window into its receive window, all ranks on
    /// one stream of the caller's in a group (one launch, directly on that stream, not on the
    /// library's internal stream), then at once every send window deregistered and its memory
    /// freed. Deregistration waits for every stream a collective on the window was enqueued on,
    /// so the kernel never reads freed memory, and the sums are right. (Run it on the simulated
    /// GPU with `SYMM_SIM_STRICT_FREE=1`, where `cuMemFree` frees at once and a kernel reading
    /// freed memory faults; without it, the driver's implicit wait in `cuMemFree`, which the
    /// window's teardown calls, hides a missing wait.)
    fn gpu_teardown_right_after_a_collective_waits_for_the_callers_stream() {
        let nranks = 2;
        let count = count_under_forced_algorithm(largest_count());
        let bytes = 4 * count;
        let comms = cuda_ranks(nranks);
        let sends = alloc_windows(&comms, bytes);
        let recvs = alloc_windows(&comms, bytes);
        let stream = non_blocking_stream();
        let inputs = random_inputs(nranks, count, 4242);
        for (b, input) in sends.iter().zip(&inputs) {
            upload(b.base, input);
        }
        check(symmGroupStart(), null_mut());
        for (send, recv) in sends.iter().zip(&recvs) {
            let result = symmAllReduce(
                send.base.cast(),
                recv.base.cast(),
                count,
                symmDataType_t::symmFloat32 as i32,
                symmRedOp_t::symmSum as i32,
                send.comm,
                stream.cast(),
            );
            check(result, send.comm);
        }
        check(symmGroupEnd(), null_mut());
        // At once: nothing has synchronized the stream.
        for send in &sends {
            check(symmCommWindowDeregister(send.comm, send.window), send.comm);
            check(symmMemFree(send.comm, send.base.cast()), send.comm);
        }
        // SAFETY: the stream is this test's. A kernel fault would be its (sticky) error.
        unsafe { sys::cuStreamSynchronize(stream) }
            .result()
            .unwrap();
        for &comm in &comms {
            assert_eq!(
                async_error(comm),
                symmResult_t::symmSuccess,
                "{}",
                last_error(comm)
            );
        }
        let results: Vec<Vec<f32>> = recvs.iter().map(|b| download(b.base, count)).collect();
        assert_matches_f64_sum(&inputs, &results, &format!("{nranks} ranks, count {count}"));
        // SAFETY: created above, idle after the synchronization.
        unsafe { sys::cuStreamDestroy_v2(stream) }.result().unwrap();
        teardown(recvs);
    }
}

gpu_test! {
    /// The ranks of one device driven from one thread in a group, each on its own non-blocking
    /// stream (one launch on the library's internal stream, ordered with the callers' streams
    /// by events). What each caller queues after the collective on its own stream — here a copy
    /// of the result — must see the result; nothing else is synchronized before it is read.
    fn gpu_group_with_a_stream_per_rank_orders_later_work_on_each_stream() {
        let nranks = 4;
        let count = count_under_forced_algorithm(4099);
        let bytes = 4 * count;
        let (send, recv, copy) = (
            0,
            bytes.next_multiple_of(256),
            2 * bytes.next_multiple_of(256),
        );
        let comms = cuda_ranks(nranks);
        let buffers = alloc_windows(&comms, copy + bytes + 4096);
        let streams: Vec<sys::CUstream> = (0..nranks).map(|_| non_blocking_stream()).collect();
        for iteration in 0..repeats(100) {
            let inputs = random_inputs(nranks, count, 7000 + iteration);
            for (b, input) in buffers.iter().zip(&inputs) {
                // SAFETY: offsets inside the window.
                upload(unsafe { b.base.add(send) }, input);
            }
            check(symmGroupStart(), null_mut());
            for (b, &stream) in buffers.iter().zip(&streams) {
                // SAFETY: offsets inside the window.
                let (s, r) = unsafe { (b.base.add(send), b.base.add(recv)) };
                let result = symmAllReduce(
                    s.cast(),
                    r.cast(),
                    count,
                    symmDataType_t::symmFloat32 as i32,
                    symmRedOp_t::symmSum as i32,
                    b.comm,
                    stream.cast(),
                );
                check(result, b.comm);
            }
            check(symmGroupEnd(), null_mut());
            for (b, &stream) in buffers.iter().zip(&streams) {
                // SAFETY: device ranges inside the window; the stream is this test's.
                unsafe {
                    sys::cuMemcpyDtoDAsync_v2(
                        b.base.add(copy) as sys::CUdeviceptr,
                        b.base.add(recv) as sys::CUdeviceptr,
                        bytes,
                        stream,
                    )
                    .result()
                    .unwrap();
                    sys::cuStreamSynchronize(stream).result().unwrap();
                }
            }
            // SAFETY: offsets inside the window.
            let results: Vec<Vec<f32>> = buffers
                .iter()
                .map(|b| download(unsafe { b.base.add(copy) }, count))
                .collect();
            assert_matches_f64_sum(&inputs, &results, &format!("iteration {iteration}"));
        }
        for stream in streams {
            // SAFETY: created above; idle after the synchronizations.
            unsafe { sys::cuStreamDestroy_v2(stream) }.result().unwrap();
        }
        teardown(buffers);
    }
}

gpu_test! {
    /// One thread per rank, every rank of the device on its own non-blocking stream: separate
    /// launches that wait for each other on the device, which the library allows only when the
    /// occupancy API proves that all of them are resident at once (its grids are sized so).
    fn gpu_one_thread_per_rank_each_on_its_own_stream() {
        let nranks = 8;
        let comms = cuda_ranks(nranks);
        let max = count_under_forced_algorithm(4099);
        let bytes = (4 * max).next_multiple_of(256);
        let buffers = alloc_windows(&comms, 2 * bytes + 4096);
        let iterations = repeats(50);
        std::thread::scope(|scope| {
            for (rank, b) in buffers.iter().enumerate() {
                let (comm, base) = (b.comm as usize, b.base as usize);
                scope.spawn(move || {
                    cuda_context();
                    let (comm, base) = (comm as symmComm_t, base as *mut u8);
                    let stream = non_blocking_stream();
                    for iteration in 0..iterations {
                        // Small (low-latency) and larger calls alternate.
                        let count = if iteration % 2 == 0 { 255 } else { max };
                        let inputs = random_inputs(nranks, count, 9000 + iteration);
                        upload(base, &inputs[rank]);
                        // SAFETY: offsets inside the window.
                        let recv = unsafe { base.add(bytes) };
                        let result = symmAllReduce(
                            base.cast(),
                            recv.cast(),
                            count,
                            symmDataType_t::symmFloat32 as i32,
                            symmRedOp_t::symmSum as i32,
                            comm,
                            stream.cast(),
                        );
                        check(result, comm);
                        // SAFETY: the stream is this thread's.
                        unsafe { sys::cuStreamSynchronize(stream) }
                            .result()
                            .unwrap();
                        let got = download(recv, count);
                        assert_matches_f64_sum(
                            &inputs,
                            &[got],
                            &format!("rank {rank} iteration {iteration}"),
                        );
                    }
                    // SAFETY: created above, idle after the synchronization.
                    unsafe { sys::cuStreamDestroy_v2(stream) }.result().unwrap();
                });
            }
        });
        teardown(buffers);
    }
}

gpu_test! {
    /// A seeded sequence of 300 mixed calls on one window of 3 ranks — all-reduce (sum,
    /// max, min), all-gather, reduce-scatter, broadcast and reduce of int32, in place and out of
    /// place, at counts
    /// that pick every algorithm — each reading what earlier calls wrote on the device (nothing is
    /// uploaded between calls, so a kernel that reads a stale value is caught), checked against a
    /// host model of the window every 10 calls and at the end. Int32 sums wrap exactly, and 3
    /// ranks never wrap every value to zero.
    fn gpu_sequence_of_mixed_calls_on_one_window() {
        const NRANKS: usize = 3;
        const COUNTS: [usize; 6] = [1, 5, 255, 1023, 1537, 4099];
        let max = *COUNTS.iter().max().unwrap();
        // Two regions of NRANKS × max elements; calls go between them or stay in one.
        let region = NRANKS * max;
        let comms = cuda_ranks(NRANKS);
        let buffers = alloc_windows(&comms, 2 * 4 * region + 4096);
        let mut rng = Rng(0x5E0_0E5C);
        let mut model: Vec<Vec<i32>> = (0..NRANKS)
            .map(|_| {
                (0..2 * region)
                    .map(|_| rng.next_u64() as i32 >> 8)
                    .collect()
            })
            .collect();
        for (b, m) in buffers.iter().zip(&model) {
            upload_bytes(
                b.base,
                &m.iter().flat_map(|v| v.to_ne_bytes()).collect::<Vec<u8>>(),
            );
        }
        let int32 = DataType::Int32 as i32;
        let calls = 300;
        for call in 0..calls {
            let count =
                count_under_forced_algorithm(COUNTS[(rng.next_u64() % COUNTS.len() as u64) as usize]);
            let kind = rng.next_u64() % 5;
            let op = [0, 2, 3][(rng.next_u64() % 3) as usize];
            let in_place = rng.next_u64().is_multiple_of(2);
            let from = (rng.next_u64() % 2) as usize * region;
            let to = if in_place { from } else { region - from };
            let root = if kind >= 3 {
                (rng.next_u64() % NRANKS as u64) as usize
            } else {
                0
            };
            check(symmGroupStart(), null_mut());
            for (rank, b) in buffers.iter().enumerate() {
                // Element offsets: all-gather sends its own segment in place, reduce-scatter
                // receives into its own segment in place.
                let (send, recv) = match kind {
                    1 if in_place => (to + rank * count, to),
                    2 if in_place => (from, from + rank * count),
                    _ => (from, to),
                };
                // SAFETY: element offsets inside the two regions of the window.
                let (s, r) = unsafe { (b.base.add(4 * send).cast(), b.base.add(4 * recv).cast()) };
                let result = match kind {
                    0 => symmAllReduce(s, r, count, int32, op, b.comm, null_mut()),
                    1 => symmAllGather(s, r, count, int32, b.comm, null_mut()),
                    2 => symmReduceScatter(s, r, count, int32, op, b.comm, null_mut()),
                    4 => {
                        // Off the root, recvbuff is not used: NULL on every other call.
                        let r = if rank != root && call % 2 == 1 {
                            null_mut()
                        } else {
                            r
                        };
                        symmReduce(s, r, count, int32, op, root as i32, b.comm, null_mut())
                    }
                    _ => {
                        // Off the root, sendbuff is ignored: NULL on every other call.
                        let s = if rank != root && call % 2 == 1 {
                            std::ptr::null()
                        } else {
                            s
                        };
                        symmBroadcast(s, r, count, int32, root as i32, b.comm, null_mut())
                    }
                };
                check(result, b.comm);
            }
            check(symmGroupEnd(), null_mut());
            // The model, from the inputs as they were before the call.
            let before = model.clone();
            let reduce = |values: &mut dyn Iterator<Item = i32>| -> i32 {
                match op {
                    0 => values.fold(0i32, i32::wrapping_add),
                    2 => values.max().unwrap(),
                    _ => values.min().unwrap(),
                }
            };
            for (rank, m) in model.iter_mut().enumerate() {
                match kind {
                    0 => {
                        for i in 0..count {
                            m[to + i] = reduce(&mut before.iter().map(|x| x[from + i]));
                        }
                    }
                    1 => {
                        for (peer, x) in before.iter().enumerate() {
                            let send = if in_place { to + peer * count } else { from };
                            m[to + peer * count..to + (peer + 1) * count]
                                .copy_from_slice(&x[send..send + count]);
                        }
                    }
                    3 => m[to..to + count].copy_from_slice(&before[root][from..from + count]),
                    4 if rank == root => {
                        for i in 0..count {
                            m[to + i] = reduce(&mut before.iter().map(|x| x[from + i]));
                        }
                    }
                    4 => {}
                    _ => {
                        let recv = if in_place { from + rank * count } else { to };
                        for i in 0..count {
                            m[recv + i] =
                                reduce(&mut before.iter().map(|x| x[from + rank * count + i]));
                        }
                    }
                }
            }
            if call % 10 == 9 || call + 1 == calls {
                synchronize();
                for (rank, (b, m)) in buffers.iter().zip(&model).enumerate() {
                    let got: Vec<i32> = download_bytes(b.base, 2 * 4 * region)
                        .chunks(4)
                        .map(|c| i32::from_ne_bytes(c.try_into().unwrap()))
                        .collect();
                    if let Some(i) = (0..got.len()).find(|&i| got[i] != m[i]) {
                        panic!(
                            "after call {call} (the last: kind {kind} op {op} count {count} \
                             in place {in_place} root {root}): rank {rank} element {i} = {}, \
                             expected {}",
                            got[i], m[i]
                        );
                    }
                }
            }
        }
        teardown(buffers);
    }
}

gpu_test! {
    /// One thread per rank (separate launches on separate non-blocking streams, so one rank's
    /// kernel may start while a peer's previous kernel still runs), 60 in-place int32
    /// sums chained on the device: each call reads what the previous calls of every rank wrote,
    /// ordered only by the kernels' cross-rank barriers. After call k every element is
    /// 3^(k-1) × the sum of the initial values (wrapping), checked every 10 calls.
    fn gpu_threads_chain_in_place_all_reduces() {
        const NRANKS: usize = 3;
        // Low-latency and one-shot calls alternate on the window (under SYMM_ALGO=ll, all fit the
        // low-latency buffers of 16 KiB per rank). The largest count gives each block of a one-shot
        // call (up to 5 blocks per rank on a 16-SM device) more than one round of packs, so with
        // every rank in place the ranks share the work out instead of taking rounds.
        let (max, counts) = if forced_low_latency() {
            (4093, vec![4093, 255, 1537])
        } else {
            (5 * 4096 + 3, vec![4099, 255, 1537, 5 * 4096 + 3])
        };
        let comms = cuda_ranks(NRANKS);
        let buffers = alloc_windows(&comms, 4 * max + 4096);
        let initial: Vec<Vec<i32>> = (0..NRANKS)
            .map(|r| {
                let mut rng = Rng(0xC4A1 + r as u64);
                (0..max).map(|_| rng.next_u64() as i32 >> 4).collect()
            })
            .collect();
        for (b, x) in buffers.iter().zip(&initial) {
            upload_bytes(
                b.base,
                &x.iter().flat_map(|v| v.to_ne_bytes()).collect::<Vec<u8>>(),
            );
        }
        // Element i after the calls so far (every call covers a prefix of the buffer).
        let calls = 60;
        let schedule: Vec<usize> = (0..calls).map(|k| counts[k % counts.len()]).collect();
        let expected_after = |k: usize| -> Vec<i32> {
            let mut v: Vec<Vec<i32>> = initial.clone();
            for &count in &schedule[..k] {
                let sums: Vec<i32> = (0..count)
                    .map(|i| v.iter().fold(0i32, |a, x| a.wrapping_add(x[i])))
                    .collect();
                for x in v.iter_mut() {
                    x[..count].copy_from_slice(&sums);
                }
            }
            v.swap_remove(0)
        };
        let checkpoints: Vec<(usize, Vec<i32>)> = (1..=calls)
            .filter(|k| k % 10 == 0 || *k == calls)
            .map(|k| (k, expected_after(k)))
            .collect();
        std::thread::scope(|scope| {
            for (rank, b) in buffers.iter().enumerate() {
                let (comm, base) = (b.comm as usize, b.base as usize);
                let (schedule, checkpoints) = (&schedule, &checkpoints);
                scope.spawn(move || {
                    cuda_context();
                    let (comm, base) = (comm as symmComm_t, base as *mut u8);
                    let stream = non_blocking_stream();
                    for (k, &count) in schedule.iter().enumerate() {
                        let result = symmAllReduce(
                            base.cast(),
                            base.cast(),
                            count,
                            DataType::Int32 as i32,
                            symmRedOp_t::symmSum as i32,
                            comm,
                            stream.cast(),
                        );
                        check(result, comm);
                        if let Some((_, want)) = checkpoints.iter().find(|(c, _)| *c == k + 1) {
                            // SAFETY: the stream is this thread's.
                            unsafe { sys::cuStreamSynchronize(stream) }
                                .result()
                                .unwrap();
                            let got: Vec<i32> = download_bytes(base, 4 * max)
                                .chunks(4)
                                .map(|c| i32::from_ne_bytes(c.try_into().unwrap()))
                                .collect();
                            if let Some(i) = (0..max).find(|&i| got[i] != want[i]) {
                                panic!(
                                    "rank {rank} after call {}: element {i} = {}, expected {}",
                                    k + 1,
                                    got[i],
                                    want[i]
                                );
                            }
                        }
                    }
                    // SAFETY: the stream is this thread's; created above.
                    unsafe {
                        sys::cuStreamSynchronize(stream).result().unwrap();
                        sys::cuStreamDestroy_v2(stream).result().unwrap();
                    }
                });
            }
        });
        teardown(buffers);
    }
}

gpu_test! {
    /// One thread per rank on one GPU, rank 0 issuing its collectives back to back while rank 1
    /// lags (a pause before each call): rank 0's kernel n+1 waits on its stream for its kernel n,
    /// which spins until rank 1's kernel n runs. Were kernel n+1 to enter a hardware queue ahead of
    /// rank 1's kernel n, that kernel could never start; the library paces launches so that it
    /// cannot. On the simulated GPU run it with `SYMM_SIM_HW_QUEUES=1` (every stream's kernels
    /// in one first-in-first-out queue, the worst aliasing `CUDA_DEVICE_MAX_CONNECTIONS` allows).
    fn gpu_a_rank_running_ahead_never_queues_before_a_lagging_peer() {
        let nranks = 2;
        let calls = 4;
        let count = 64;
        let region = 4 * count;
        let comms = cuda_ranks(nranks);
        let buffers = alloc_windows(&comms, calls * region);
        let ranks = GpuRank::of(&buffers);
        let results = per_rank_on_streams(&ranks, |rank, gpu, stream| {
            for k in 0..calls {
                gpu.fill(k * region, count, ((rank + 1) * (k + 1)) as f32);
            }
            for k in 0..calls {
                if rank == 1 {
                    std::thread::sleep(Duration::from_millis(300));
                }
                check(gpu.all_reduce(k * region, count, stream), gpu.comm());
            }
            (0..calls)
                .map(|k| gpu.read(k * region, count, stream))
                .collect::<Vec<_>>()
        });
        for (rank, regions) in results.iter().enumerate() {
            for (k, values) in regions.iter().enumerate() {
                let want = (3 * (k + 1)) as f32;
                assert!(
                    values.iter().all(|v| *v == want),
                    "rank {rank}, call {k}: {:?}, want {want}",
                    &values[..4]
                );
            }
        }
        for b in &buffers {
            assert_eq!(
                async_error(b.comm),
                symmResult_t::symmSuccess,
                "{}",
                last_error(b.comm)
            );
        }
        teardown(buffers);
    }
}
