//! `symmAlltoAll`, `symmGather` and `symmScatter` on the host backend, through the C ABI, one
//! thread driving every rank in a group: 1 to 6 ranks, every root, data types of every size,
//! odd counts, in place and out of place; every byte of every window checked against a
//! reference built from the inputs (the results land bit for bit, and nothing else changes);
//! then the refusals (a bad root, overlapping buffers), which leave the ranks in step.

use symm::*;
use symm_tests::*;

/// The three collectives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Coll {
    AllToAll,
    Gather,
    Scatter,
}

/// Bytes of each window.
const WINDOW: usize = 2 * 6 * 8 * 1031 + 512;

/// Random bytes in every rank's whole window; returns them.
fn fill(buffers: &[RankBuffer], rng: &mut Rng) -> Vec<Vec<u8>> {
    buffers
        .iter()
        .map(|b| {
            let bytes: Vec<u8> = (0..WINDOW).map(|_| rng.next_u64() as u8).collect();
            // SAFETY: host memory of the window, WINDOW bytes.
            unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), b.base, WINDOW) };
            bytes
        })
        .collect()
}

/// One call of `coll` on every rank in a group, `count` elements of `dtype` per segment, the
/// send buffer at `send` and the receive buffer at `recv` (bytes into the window); ranks that
/// do not use a buffer pass NULL for it on odd ranks. Checks every window byte for byte.
fn check_case(
    buffers: &[RankBuffer],
    coll: Coll,
    dtype: i32,
    count: usize,
    root: usize,
    (send, recv): (usize, usize),
    seed: u64,
) {
    let nranks = buffers.len();
    let size = symm_device::DataType::from_raw(dtype as u32)
        .unwrap()
        .size_bytes();
    let bytes = count * size;
    let mut rng = Rng(seed);
    let before = fill(buffers, &mut rng);
    check(symmGroupStart(), std::ptr::null_mut());
    for (r, b) in buffers.iter().enumerate() {
        // SAFETY: offsets inside the window (the cases keep them so).
        let (s, d) = unsafe { (b.base.add(send), b.base.add(recv)) };
        let unused_null = r != root && r % 2 == 1;
        let result = match coll {
            Coll::AllToAll => symmAlltoAll(
                s.cast(),
                d.cast(),
                count,
                dtype,
                b.comm,
                std::ptr::null_mut(),
            ),
            Coll::Gather => symmGather(
                s.cast(),
                if unused_null {
                    std::ptr::null_mut()
                } else {
                    d.cast()
                },
                count,
                dtype,
                root as i32,
                b.comm,
                std::ptr::null_mut(),
            ),
            Coll::Scatter => symmScatter(
                if unused_null {
                    std::ptr::null()
                } else {
                    s.cast()
                },
                d.cast(),
                count,
                dtype,
                root as i32,
                b.comm,
                std::ptr::null_mut(),
            ),
        };
        check(result, b.comm);
    }
    check(symmGroupEnd(), std::ptr::null_mut());
    let mut want = before.clone();
    match coll {
        Coll::AllToAll => {
            for (p, window) in want.iter_mut().enumerate() {
                for (r, sender) in before.iter().enumerate() {
                    let from = send + p * bytes;
                    window[recv + r * bytes..][..bytes].copy_from_slice(&sender[from..][..bytes]);
                }
            }
        }
        Coll::Gather => {
            for (r, sender) in before.iter().enumerate() {
                want[root][recv + r * bytes..][..bytes].copy_from_slice(&sender[send..][..bytes]);
            }
        }
        Coll::Scatter => {
            for (p, window) in want.iter_mut().enumerate() {
                let from = send + p * bytes;
                window[recv..][..bytes].copy_from_slice(&before[root][from..][..bytes]);
            }
        }
    }
    let case = format!(
        "{coll:?}: {nranks} ranks, dtype {dtype}, count {count}, root {root}, send {send}, recv {recv}"
    );
    for (r, b) in buffers.iter().enumerate() {
        // SAFETY: host memory of the window.
        let got = unsafe { std::slice::from_raw_parts(b.base, WINDOW) };
        if let Some(at) = (0..WINDOW).find(|&i| got[i] != want[r][i]) {
            panic!(
                "{case}: rank {r}, byte {at}: {} instead of {}",
                got[at], want[r][at]
            );
        }
    }
}

/// Every collective on 1 to 6 ranks from every root, a data type of each size in turn, odd
/// counts, the buffers apart or (gather, scatter) in place.
#[test]
fn all_to_all_gather_and_scatter_match_the_reference_for_1_to_6_ranks() {
    use_host_backend();
    let counts = [1usize, 7, 1031, 130];
    let dtypes = [0, 9, 7, 4]; // int8, bfloat16, float32, int64
    let mut seed = 0u64;
    for nranks in 1..=6 {
        let comms = init_all(nranks);
        let buffers = alloc_windows(&comms, WINDOW);
        for root in 0..nranks {
            for (k, &dtype) in dtypes.iter().enumerate() {
                let count = counts[(k + root + nranks) % counts.len()];
                let size = symm_device::DataType::from_raw(dtype as u32)
                    .unwrap()
                    .size_bytes();
                let whole = nranks * count * size;
                let apart = (64 + size, (64 + whole + 16).next_multiple_of(size));
                for coll in [Coll::AllToAll, Coll::Gather, Coll::Scatter] {
                    if coll == Coll::AllToAll && root > 0 {
                        continue;
                    }
                    seed += 1;
                    check_case(&buffers, coll, dtype, count, root, apart, seed);
                }
                // In place: the root's own segment of the whole buffer is the other buffer.
                let share = count * size;
                seed += 1;
                let gather_in_place = (64 + root * share, 64);
                check_case(
                    &buffers,
                    Coll::Gather,
                    dtype,
                    count,
                    root,
                    gather_in_place,
                    seed,
                );
                seed += 1;
                let scatter_in_place = (64, 64 + root * share);
                check_case(
                    &buffers,
                    Coll::Scatter,
                    dtype,
                    count,
                    root,
                    scatter_in_place,
                    seed,
                );
            }
        }
        teardown(buffers);
    }
}

/// The refusals, made on every rank alike (each an invalid-argument error naming what is
/// wrong, nothing written), after which the ranks are still in step.
#[test]
fn bad_roots_and_overlapping_buffers_are_refused() {
    use_host_backend();
    let nranks = 3;
    let comms = init_all(nranks);
    let buffers = alloc_windows(&comms, WINDOW);
    let f32_ = symmDataType_t::symmFloat32 as i32;
    let null = std::ptr::null_mut();
    let before = fill(&buffers, &mut Rng(7));
    for b in &buffers {
        let at = |bytes: usize| b.base.wrapping_add(bytes).cast::<std::ffi::c_void>();
        type Call<'a> = Box<dyn Fn() -> symmResult_t + 'a>;
        let refusals: [(Call, &str); 4] = [
            (
                Box::new(|| symmGather(at(64), at(1024), 4, f32_, 3, b.comm, null)),
                "root = 3",
            ),
            (
                Box::new(|| symmScatter(at(64), at(1024), 4, f32_, -1, b.comm, null)),
                "root = -1",
            ),
            // 3 ranks × 4 floats = 48 bytes: the receive buffer starts inside the send buffer.
            (
                Box::new(|| symmAlltoAll(at(64), at(96), 4, f32_, b.comm, null)),
                "overlap",
            ),
            (
                Box::new(|| symmAlltoAll(at(64), at(1024), usize::MAX / 2, f32_, b.comm, null)),
                "overflow",
            ),
        ];
        for (call, says) in refusals {
            assert_eq!(call(), symmResult_t::symmInvalidArgument);
            let message = last_error(b.comm);
            assert!(message.contains(says), "{message:?} does not say {says:?}");
        }
    }
    for (r, b) in buffers.iter().enumerate() {
        // SAFETY: host memory of the window.
        let got = unsafe { std::slice::from_raw_parts(b.base, WINDOW) };
        assert!(
            got == before[r].as_slice(),
            "rank {r}: a refused call wrote"
        );
    }
    // Still in step.
    check_case(&buffers, Coll::AllToAll, f32_, 5, 0, (64, 1024), 11);
    check_case(&buffers, Coll::Scatter, f32_, 5, 2, (64, 1024), 12);
    // The root alone checks its own buffers: an overlapping gather is refused on the root
    // only. In a group that one thread drives, the group's end refuses the whole group,
    // naming the root's refusal, and launches nothing of it.
    let before = fill(&buffers, &mut Rng(8));
    check(symmGroupStart(), std::ptr::null_mut());
    for (r, b) in buffers.iter().enumerate() {
        let (send, recv) = if r == 1 { (68, 64) } else { (64, 1024) };
        let result = symmGather(
            b.base.wrapping_add(send).cast(),
            b.base.wrapping_add(recv).cast(),
            4,
            f32_,
            1,
            b.comm,
            null,
        );
        if r == 1 {
            assert_eq!(result, symmResult_t::symmInvalidArgument);
            assert!(
                last_error(b.comm).contains("overlaps"),
                "{}",
                last_error(b.comm)
            );
        } else {
            check(result, b.comm);
        }
    }
    assert_ne!(symmGroupEnd(), symmResult_t::symmSuccess);
    let message = last_error(std::ptr::null_mut());
    assert!(
        message.contains("overlaps") && message.contains("nothing of this group was launched"),
        "{message}"
    );
    for (r, b) in buffers.iter().enumerate() {
        // SAFETY: host memory of the window.
        let got = unsafe { std::slice::from_raw_parts(b.base, WINDOW) };
        assert!(
            got == before[r].as_slice(),
            "rank {r}: a refused group wrote"
        );
    }
    // Still in step.
    check_case(&buffers, Coll::Gather, f32_, 5, 1, (64, 1024), 13);
    teardown(buffers);
}
