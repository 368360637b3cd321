//! f32 sum all-reduce on the host backend, through the C ABI, checked against a reference
//! computed independently in f64, and for bitwise equality across ranks; all-gather,
//! reduce-scatter and every data type and operator; the broadcast from every root (the root's
//! bytes, exactly).

use symm::*;
use symm_tests::*;

/// Where a case puts its buffers, in bytes from the window base.
#[derive(Clone, Copy, Debug)]
struct Placement {
    send: usize,
    recv: usize,
}

impl Placement {
    fn in_place(offset: usize) -> Self {
        Placement {
            send: offset,
            recv: offset,
        }
    }
}

const SENTINEL: f32 = -12345.5;

/// Run one all-reduce on every rank (one thread driving all ranks, in a group) and check it.
fn check_all_reduce(buffers: &[RankBuffer], count: usize, at: Placement, seed: u64) {
    let nranks = buffers.len();
    let inputs = random_inputs(nranks, count, seed);
    for (b, input) in buffers.iter().zip(&inputs) {
        assert!(at.send + 4 * count <= b.bytes && at.recv + 4 * count + 4 <= b.bytes);
        // SAFETY: host memory of the window, range checked above.
        unsafe {
            if at.recv != at.send {
                write_f32(b.base.add(at.recv), &vec![SENTINEL; count + 1]);
            }
            write_f32(b.base.add(at.send), input);
        }
    }

    check(symmGroupStart(), std::ptr::null_mut());
    for b in buffers {
        // SAFETY: pointers inside the window (host memory).
        let (send, recv) = unsafe { (b.base.add(at.send), b.base.add(at.recv)) };
        check(all_reduce_f32_sum(b.comm, send, recv, count), b.comm);
    }
    check(symmGroupEnd(), std::ptr::null_mut());

    // SAFETY: host memory of the window.
    let results: Vec<Vec<f32>> = buffers
        .iter()
        .map(|b| unsafe { read_f32(b.base.add(at.recv), count + 1) })
        .collect();
    let case = format!("{nranks} ranks, count {count}, {at:?}");
    let values: Vec<Vec<f32>> = results.iter().map(|r| r[..count].to_vec()).collect();
    assert_matches_f64_sum(&inputs, &values, &case);
    if at.recv != at.send {
        for r in &results {
            assert_eq!(r[count], SENTINEL, "wrote past the end of recvbuff");
        }
    }
}

#[test]
fn matches_f64_reference_for_1_to_8_ranks_odd_counts_in_and_out_of_place() {
    use_host_backend();
    let counts = [1usize, 7, 1023, 4099];
    let max = *counts.iter().max().unwrap();
    for nranks in 1..=8 {
        let comms = init_all(nranks);
        assert_eq!(backend(comms[0]), "host");
        let buffers = alloc_windows(&comms, 4 * (2 * max + 64));
        for (k, &count) in counts.iter().enumerate() {
            let seed = (nranks * 100 + k) as u64;
            check_all_reduce(&buffers, count, Placement::in_place(0), seed);
            check_all_reduce(&buffers, count, Placement::in_place(12), seed + 1);
            let out = Placement {
                send: 4,
                recv: 4 * (count + 3),
            };
            check_all_reduce(&buffers, count, out, seed + 2);
            let reversed = Placement {
                send: 4 * (count + 5),
                recv: 8,
            };
            check_all_reduce(&buffers, count, reversed, seed + 3);
        }
        teardown(buffers);
    }
}

#[test]
fn large_count_with_a_tail() {
    use_host_backend();
    let count = (1 << 20) + 5;
    for nranks in [3, 8] {
        let comms = init_all(nranks);
        let buffers = alloc_windows(&comms, 4 * (2 * count + 8));
        check_all_reduce(&buffers, count, Placement::in_place(0), 7);
        let out = Placement {
            send: 0,
            recv: 4 * (count + 2),
        };
        check_all_reduce(&buffers, count, out, 8);
        teardown(buffers);
    }
}

#[test]
fn same_buffers_many_times_in_a_row() {
    use_host_backend();
    let comms = init_all(4);
    let buffers = alloc_windows(&comms, 4096);
    for iteration in 0..300 {
        check_all_reduce(&buffers, 33, Placement::in_place(64), iteration);
    }
    teardown(buffers);
}

#[test]
fn count_zero_is_a_validated_no_op() {
    use_host_backend();
    let comms = init_all(2);
    let buffers = alloc_windows(&comms, 256);
    for b in &buffers {
        // SAFETY: host memory of the window.
        unsafe { write_f32(b.base, &[1.5; 4]) };
        let r = all_reduce_f32_sum(b.comm, b.base, b.base, 0);
        assert_eq!(r, symmResult_t::symmSuccess);
        // Count 0 still validates its arguments.
        let r = all_reduce_f32_sum(b.comm, std::ptr::null(), b.base, 0);
        assert_eq!(r, symmResult_t::symmInvalidArgument);
        // SAFETY: host memory of the window.
        assert_eq!(unsafe { read_f32(b.base, 4) }, vec![1.5; 4]);
    }
    teardown(buffers);
}

#[test]
fn receive_buffer_in_another_window() {
    use_host_backend();
    let comms = init_all(3);
    let send = alloc_windows(&comms, 4 * 600);
    let mut recv = alloc(&comms, 4 * 600);
    register_all(&mut recv);
    for (r, b) in send.iter().enumerate() {
        // SAFETY: host memory of the windows.
        unsafe { write_f32(b.base, &vec![r as f32 + 0.5; 500]) };
    }
    check(symmGroupStart(), std::ptr::null_mut());
    for (s, r) in send.iter().zip(&recv) {
        check(all_reduce_f32_sum(s.comm, s.base, r.base, 500), s.comm);
    }
    check(symmGroupEnd(), std::ptr::null_mut());
    for r in &recv {
        // SAFETY: host memory of the window.
        assert_eq!(unsafe { read_f32(r.base, 500) }, vec![0.5 + 1.5 + 2.5; 500]);
    }
    for b in recv {
        check(symmCommWindowDeregister(b.comm, b.window), b.comm);
        check(symmMemFree(b.comm, b.base.cast()), b.comm);
    }
    teardown(send);
}

#[test]
fn one_thread_per_rank_with_init_rank() {
    use_host_backend();
    let nranks = 5;
    let count = 4099;
    let mut id = symmUniqueId {
        internal: [0; SYMM_UNIQUE_ID_BYTES],
    };
    // SAFETY: valid out-pointer.
    check(unsafe { symmGetUniqueId(&mut id) }, std::ptr::null_mut());
    let results: Vec<Vec<f32>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..nranks)
            .map(|rank| {
                scope.spawn(move || {
                    let mut comm = std::ptr::null_mut();
                    // SAFETY: valid out-pointer.
                    check(
                        unsafe { symmCommInitRank(&mut comm, nranks, id, rank) },
                        comm,
                    );
                    let mut ptr = std::ptr::null_mut();
                    // SAFETY: valid out-pointer.
                    check(unsafe { symmMemAlloc(comm, &mut ptr, 4 * count) }, comm);
                    let mut window = std::ptr::null_mut();
                    // SAFETY: valid out-pointer; live allocation.
                    check(
                        unsafe {
                            symmCommWindowRegister(
                                comm,
                                ptr,
                                4 * count,
                                &mut window,
                                SYMM_WIN_COLL_SYMMETRIC,
                            )
                        },
                        comm,
                    );
                    let input: Vec<f32> = (0..count)
                        .map(|i| (rank as f32 + 1.0) * (i % 11) as f32)
                        .collect();
                    // SAFETY: host memory of the window.
                    unsafe { write_f32(ptr.cast(), &input) };
                    check(
                        all_reduce_f32_sum(comm, ptr.cast(), ptr.cast(), count),
                        comm,
                    );
                    // SAFETY: host memory of the window.
                    let out = unsafe { read_f32(ptr.cast(), count) };
                    check(symmCommWindowDeregister(comm, window), comm);
                    check(symmMemFree(comm, ptr), comm);
                    check(symmCommDestroy(comm), std::ptr::null_mut());
                    out
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let rank_sum: f32 = (1..=nranks).map(|r| r as f32).sum();
    for out in results {
        for (i, v) in out.iter().enumerate() {
            assert_eq!(*v, rank_sum * (i % 11) as f32);
        }
    }
}

/// All-gather and reduce-scatter through the C ABI, one thread driving the ranks in a group,
/// out of place and in place.
#[test]
fn all_gather_and_reduce_scatter_through_the_c_abi() {
    use_host_backend();
    for nranks in [1usize, 3, 8] {
        let count = 1031;
        let comms = init_all(nranks);
        let bytes = 4 * count * nranks;
        let buffers = alloc_windows(&comms, 2 * bytes + 64);
        let inputs: Vec<Vec<f32>> = (0..nranks)
            .map(|r| {
                (0..count * nranks)
                    .map(|i| (r * 7 + i % 19) as f32)
                    .collect()
            })
            .collect();
        for in_place in [false, true] {
            // All-gather: rank r's first `count` inputs.
            for (r, b) in buffers.iter().enumerate() {
                let send = if in_place { 4 * count * r } else { bytes };
                // SAFETY: host memory of the window.
                unsafe { write_f32(b.base.add(send), &inputs[r][..count]) };
            }
            check(symmGroupStart(), std::ptr::null_mut());
            for (r, b) in buffers.iter().enumerate() {
                let send = if in_place { 4 * count * r } else { bytes };
                // SAFETY: offsets inside the window.
                let (s, d) = unsafe { (b.base.add(send), b.base) };
                check(
                    symmAllGather(
                        s.cast(),
                        d.cast(),
                        count,
                        symmDataType_t::symmFloat32 as i32,
                        b.comm,
                        std::ptr::null_mut(),
                    ),
                    b.comm,
                );
            }
            check(symmGroupEnd(), std::ptr::null_mut());
            for b in &buffers {
                // SAFETY: host memory of the window.
                let out = unsafe { read_f32(b.base, count * nranks) };
                for (i, v) in out.iter().enumerate() {
                    assert_eq!(
                        *v,
                        inputs[i / count][i % count],
                        "all-gather {nranks} ranks"
                    );
                }
            }

            // Reduce-scatter (max): segment r of every rank's send buffer, into rank r.
            for (r, b) in buffers.iter().enumerate() {
                // SAFETY: host memory of the window.
                unsafe { write_f32(b.base, &inputs[r]) };
            }
            check(symmGroupStart(), std::ptr::null_mut());
            for (r, b) in buffers.iter().enumerate() {
                let recv = if in_place { 4 * count * r } else { bytes };
                // SAFETY: offsets inside the window.
                let (s, d) = unsafe { (b.base, b.base.add(recv)) };
                check(
                    symmReduceScatter(
                        s.cast(),
                        d.cast(),
                        count,
                        symmDataType_t::symmFloat32 as i32,
                        symmRedOp_t::symmMax as i32,
                        b.comm,
                        std::ptr::null_mut(),
                    ),
                    b.comm,
                );
            }
            check(symmGroupEnd(), std::ptr::null_mut());
            for (r, b) in buffers.iter().enumerate() {
                let recv = if in_place { 4 * count * r } else { bytes };
                // SAFETY: host memory of the window.
                let out = unsafe { read_f32(b.base.add(recv), count) };
                for (i, v) in out.iter().enumerate() {
                    let expected = inputs
                        .iter()
                        .map(|x| x[r * count + i])
                        .fold(f32::MIN, f32::max);
                    assert_eq!(
                        *v, expected,
                        "reduce-scatter {nranks} ranks rank {r} index {i}"
                    );
                }
            }
        }
        teardown(buffers);
    }
}

/// Every data type and operator through the C ABI (the planner picks the algorithm).
#[test]
fn every_dtype_and_op_through_the_c_abi() {
    use_host_backend();
    let nranks = 3;
    let count = 515;
    let comms = init_all(nranks);
    let buffers = alloc_windows(&comms, 16 * count);
    for dtype in 0..12 {
        for op in 0..5 {
            // Small integers, exactly representable and exactly reducible in every type.
            for (r, b) in buffers.iter().enumerate() {
                let values: Vec<f64> = (0..count).map(|i| ((r + i) % 3) as f64 + 1.0).collect();
                // SAFETY: host memory of the window, 16·count bytes.
                unsafe { write_as(b.base, dtype, &values) };
            }
            check(symmGroupStart(), std::ptr::null_mut());
            for b in &buffers {
                check(
                    symmAllReduce(
                        b.base.cast(),
                        b.base.cast(),
                        count,
                        dtype,
                        op,
                        b.comm,
                        std::ptr::null_mut(),
                    ),
                    b.comm,
                );
            }
            check(symmGroupEnd(), std::ptr::null_mut());
            for b in &buffers {
                // SAFETY: host memory of the window.
                let out = unsafe { read_as(b.base, dtype, count) };
                for (i, v) in out.iter().enumerate() {
                    let xs: Vec<f64> = (0..nranks).map(|r| ((r + i) % 3) as f64 + 1.0).collect();
                    let expected = match op {
                        0 => xs.iter().sum::<f64>(),
                        1 => xs.iter().product::<f64>(),
                        2 => xs.iter().copied().fold(f64::MIN, f64::max),
                        3 => xs.iter().copied().fold(f64::MAX, f64::min),
                        _ => xs.iter().sum::<f64>() / nranks as f64,
                    };
                    // Integer avg truncates; fp8 e4m3/e5m2 round 6/3 = 2 exactly.
                    let expected = if dtype <= 5 {
                        expected.trunc()
                    } else {
                        expected
                    };
                    assert_eq!(*v, expected, "dtype {dtype} op {op} index {i}");
                }
            }
        }
    }
    teardown(buffers);
}

/// Write `values` (small integers) as data type `dtype`.
///
/// # Safety
/// `ptr` is valid for `values.len()` elements of the type.
unsafe fn write_as(ptr: *mut u8, dtype: i32, values: &[f64]) {
    let dtype = symm_device::DataType::from_raw(dtype as u32).unwrap();
    let size = dtype.size_bytes();
    // SAFETY: forwarded contract.
    let bytes = unsafe { std::slice::from_raw_parts_mut(ptr, values.len() * size) };
    for (chunk, v) in bytes.chunks_mut(size).zip(values) {
        symm_device::numeric::dynamic::encode(dtype, *v, chunk);
    }
}

/// Read `count` elements of data type `dtype` as f64.
///
/// # Safety
/// `ptr` is valid for `count` elements of the type.
unsafe fn read_as(ptr: *const u8, dtype: i32, count: usize) -> Vec<f64> {
    let dtype = symm_device::DataType::from_raw(dtype as u32).unwrap();
    let size = dtype.size_bytes();
    // SAFETY: forwarded contract.
    let bytes = unsafe { std::slice::from_raw_parts(ptr, count * size) };
    bytes
        .chunks(size)
        .map(|chunk| symm_device::numeric::dynamic::decode(dtype, chunk))
        .collect()
}

/// `symmBroadcast` of `count` elements of `dtype` from `root`, one thread driving every rank in
/// a group. Every rank's send region holds its own random bytes (the root's must arrive bit for
/// bit, NaNs and all; the others' must arrive nowhere); every receive buffer is poisoned first
/// and followed by a guard that must not change. In place, the root passes `sendbuff ==
/// recvbuff` (its data is in its receive buffer). The ranks that are not the root pass, by
/// turns, NULL, a pointer that is no memory of the comm, or a buffer of their window, as
/// `sendbuff` (ignored there, as in NCCL).
fn check_broadcast(buffers: &[RankBuffer], dtype: i32, count: usize, root: usize, in_place: bool) {
    let nranks = buffers.len();
    let size = symm_device::DataType::from_raw(dtype as u32)
        .unwrap()
        .size_bytes();
    let bytes = count * size;
    // Element-aligned offsets: 16-byte aligned when the count is even, else 16 + one element.
    let send_at = if count.is_multiple_of(2) {
        64
    } else {
        64 + size
    };
    let recv_at = if in_place {
        send_at
    } else {
        (send_at + bytes + 16).next_multiple_of(size) + size
    };
    let mut rng = Rng((nranks * 1000 + root * 100 + count) as u64 ^ dtype as u64);
    let mut random_bytes = |n: usize| -> Vec<u8> { (0..n).map(|_| rng.next_u64() as u8).collect() };
    let inputs: Vec<Vec<u8>> = (0..nranks).map(|_| random_bytes(bytes)).collect();
    let guards: Vec<Vec<u8>> = (0..nranks).map(|_| random_bytes(16)).collect();
    for (r, b) in buffers.iter().enumerate() {
        assert!(recv_at.max(send_at) + bytes + 16 <= b.bytes);
        // SAFETY: host memory of the window, range checked above.
        unsafe {
            if !in_place {
                std::ptr::write_bytes(b.base.add(recv_at), 0xA5, bytes);
            }
            std::ptr::copy_nonoverlapping(inputs[r].as_ptr(), b.base.add(send_at), bytes);
            std::ptr::copy_nonoverlapping(guards[r].as_ptr(), b.base.add(recv_at + bytes), 16);
        }
    }
    let mut foreign = [0u8; 8];
    check(symmGroupStart(), std::ptr::null_mut());
    for (r, b) in buffers.iter().enumerate() {
        // SAFETY: offsets inside the window (checked above).
        let (own_send, recv) = unsafe { (b.base.add(send_at), b.base.add(recv_at)) };
        let send: *const u8 = match (r == root, (r + count) % 3) {
            (true, _) => own_send,
            (false, 0) => std::ptr::null(),
            (false, 1) => foreign.as_mut_ptr(),
            (false, _) => own_send,
        };
        check(
            symmBroadcast(
                send.cast(),
                recv.cast(),
                count,
                dtype,
                root as i32,
                b.comm,
                std::ptr::null_mut(),
            ),
            b.comm,
        );
    }
    check(symmGroupEnd(), std::ptr::null_mut());
    let case =
        format!("{nranks} ranks, dtype {dtype}, count {count}, root {root}, in place {in_place}");
    for (r, b) in buffers.iter().enumerate() {
        // SAFETY: host memory of the window.
        let (got, guard, sent) = unsafe {
            (
                std::slice::from_raw_parts(b.base.add(recv_at), bytes),
                std::slice::from_raw_parts(b.base.add(recv_at + bytes), 16),
                std::slice::from_raw_parts(b.base.add(send_at), bytes),
            )
        };
        assert!(
            got == inputs[root].as_slice(),
            "{case}: rank {r} did not receive the root's data"
        );
        assert_eq!(
            guard,
            guards[r].as_slice(),
            "{case}: rank {r}: written past recvbuff"
        );
        if !in_place {
            assert_eq!(
                sent,
                inputs[r].as_slice(),
                "{case}: rank {r}'s sendbuff changed"
            );
        }
    }
    assert_eq!(
        foreign, [0; 8],
        "{case}: a non-root's ignored sendbuff was touched"
    );
}

/// Broadcast on 1 to 8 ranks from every root, every data type at every (rank count, root),
/// odd counts and in place or not in turn; then every count at one data type.
#[test]
fn broadcast_from_every_root_every_dtype_for_1_to_8_ranks() {
    use_host_backend();
    let counts = [1usize, 7, 1023, 4099];
    for nranks in 1..=8 {
        let comms = init_all(nranks);
        let buffers = alloc_windows(&comms, 2 * 8 * 4099 + 256);
        for root in 0..nranks {
            for dtype in 0..12 {
                let k = dtype as usize + root + nranks;
                check_broadcast(&buffers, dtype, counts[k % 4], root, k.is_multiple_of(2));
            }
            for count in counts {
                for in_place in [false, true] {
                    check_broadcast(&buffers, 7, count, root, in_place);
                }
            }
        }
        teardown(buffers);
    }
}

/// A large broadcast (past many cells and blocks), and count 0 (a validated no-op that still
/// refuses a bad root).
#[test]
fn broadcast_large_and_empty() {
    use_host_backend();
    let comms = init_all(3);
    let count = (1 << 20) + 3;
    let buffers = alloc_windows(&comms, 2 * 4 * count + 256);
    check_broadcast(&buffers, 7, count, 2, false);
    check_broadcast(&buffers, 0, 4 * count, 1, true);
    for (rank, b) in buffers.iter().enumerate() {
        // SAFETY: host memory of the window.
        unsafe { write_f32(b.base, &[1.5; 4]) };
        let f32_ = symmDataType_t::symmFloat32 as i32;
        let null = std::ptr::null_mut();
        // Root 1's sendbuff is validated; the others' is ignored.
        let send = if rank == 1 {
            b.base
        } else {
            std::ptr::null_mut()
        };
        let r = symmBroadcast(send.cast(), b.base.cast(), 0, f32_, 1, b.comm, null);
        assert_eq!(r, symmResult_t::symmSuccess, "{}", last_error(b.comm));
        // Refused on every rank alike: the ranks stay in step.
        let r = symmBroadcast(b.base.cast(), b.base.cast(), 0, f32_, 3, b.comm, null);
        assert_eq!(r, symmResult_t::symmInvalidArgument);
        assert!(
            last_error(b.comm).contains("root = 3"),
            "{}",
            last_error(b.comm)
        );
        // SAFETY: host memory of the window.
        assert_eq!(unsafe { read_f32(b.base, 4) }, vec![1.5; 4]);
    }
    // Still in step: a broadcast after the refusals works.
    check_broadcast(&buffers, 9, 5, 0, false);
    teardown(buffers);
}

/// One thread per rank (`symmCommInitRank`), no group: every rank broadcasts from each root in
/// turn, in place, into one buffer, and the rank after the root then holds that root's data.
#[test]
fn broadcast_one_thread_per_rank() {
    use_host_backend();
    let nranks = 4;
    let count = 3001;
    let mut id = symmUniqueId {
        internal: [0; SYMM_UNIQUE_ID_BYTES],
    };
    // SAFETY: valid out-pointer.
    check(unsafe { symmGetUniqueId(&mut id) }, std::ptr::null_mut());
    let comms = join_threads(id, nranks);
    let handles: Vec<_> = comms
        .iter()
        .enumerate()
        .map(|(rank, &comm)| {
            let comm = comm as usize;
            std::thread::spawn(move || {
                let comm = comm as symmComm_t;
                let mut buffers = alloc(&[comm], 4 * count);
                register_all(&mut buffers);
                let b = &buffers[0];
                let mut seen = Vec::new();
                for root in 0..nranks {
                    let mine: Vec<f32> = (0..count)
                        .map(|i| (rank * 10_000 + root * 100 + i) as f32)
                        .collect();
                    // SAFETY: host memory of the window.
                    unsafe { write_f32(b.base, &mine) };
                    let send = if rank == root {
                        b.base as *const u8
                    } else {
                        std::ptr::null()
                    };
                    let r = symmBroadcast(
                        send.cast(),
                        b.base.cast(),
                        count,
                        symmDataType_t::symmFloat32 as i32,
                        root as i32,
                        comm,
                        std::ptr::null_mut(),
                    );
                    check(r, comm);
                    // SAFETY: host memory of the window.
                    seen.push(unsafe { read_f32(b.base, count) });
                }
                teardown(buffers);
                seen
            })
        })
        .collect();
    for (rank, h) in handles.into_iter().enumerate() {
        let seen = h.join().unwrap();
        for (root, got) in seen.iter().enumerate() {
            let expected: Vec<f32> = (0..count)
                .map(|i| (root * 10_000 + root * 100 + i) as f32)
                .collect();
            assert_eq!(*got, expected, "rank {rank}, root {root}");
        }
    }
}
