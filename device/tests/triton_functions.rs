//! The device functions that Triton kernels link (`symm_all_reduce`, `symm_all_gather`,
//! `symm_barrier`), run on the host emulation with one independent grid per rank, as separate
//! launches of a kernel that calls them.

mod harness;

use harness::{Ranks, Rng};
use symm_device::symmetric::CollectiveArgs;
use symm_device::symmetric::FLAG_IN_PLACE;
use symm_device::symmetric::dispatch::kernel;
use symm_device::symmetric::{ABORT_INVALID_LAUNCH, Algorithm};
use symm_device::triton::{
    MAX_PROGRAMS, status, symm_all_gather_device, symm_all_reduce_device, symm_barrier_device,
};
use symm_device::{DataType, RedOp};

const SECOND: u64 = 1_000_000_000;
const OPS: [RedOp; 5] = [RedOp::Sum, RedOp::Prod, RedOp::Max, RedOp::Min, RedOp::Avg];

fn random_bytes(rng: &mut Rng, n: usize) -> Vec<u8> {
    (0..n).map(|_| rng.next_u64() as u8).collect()
}

/// Small finite values of `dtype` as bytes (floats: exactly representable small integers, so
/// that products and sums stay finite in every width; integers: any bits).
fn sample(rng: &mut Rng, dtype: DataType, count: usize) -> Vec<u8> {
    let size = dtype.size_bytes();
    let mut out = Vec::with_capacity(count * size);
    for _ in 0..count {
        let small = (rng.next_u64() % 5) as i32 - 2; // -2..=2
        let value: Vec<u8> = match dtype {
            DataType::Float32 => (small as f32).to_le_bytes().to_vec(),
            DataType::Float64 => (small as f64).to_le_bytes().to_vec(),
            // f16 / bf16 / fp8: the top bits of the f32 pattern (exact for -2..=2 in bf16);
            // for f16 and fp8 build the patterns directly.
            DataType::Bfloat16 => ((small as f32).to_bits() >> 16).to_le_bytes()[..2].to_vec(),
            DataType::Float16 => {
                let bits: u16 = match small {
                    -2 => 0xC000,
                    -1 => 0xBC00,
                    0 => 0,
                    1 => 0x3C00,
                    _ => 0x4000,
                };
                bits.to_le_bytes().to_vec()
            }
            DataType::Float8E4M3 => vec![match small {
                -2 => 0xC0,
                -1 => 0xB8,
                0 => 0,
                1 => 0x38,
                _ => 0x40,
            }],
            DataType::Float8E5M2 => vec![match small {
                -2 => 0xC0,
                -1 => 0xBC,
                0 => 0,
                1 => 0x3C,
                _ => 0x40,
            }],
            _ => random_bytes(rng, size),
        };
        out.extend_from_slice(&value);
    }
    out
}

/// Every data type and operator, 1 to 4 ranks, odd counts: the device function's result is
/// bitwise the launched one-shot kernel's for the same (type, operator) on the same inputs
/// (the kernels are checked against f64 references in `collectives.rs`), so the dispatch on the
/// raw `dtype` / `op` integers picks the right instance.
#[test]
fn all_reduce_matches_the_kernel_for_every_dtype_and_op() {
    let mut rng = Rng(7);
    for world in 1..=4usize {
        for dtype in DataType::ALL {
            for op in OPS {
                let count = [1usize, 5, 33][(world + dtype as usize) % 3];
                let offset = 64usize;
                let bytes = count * dtype.size_bytes();
                let inputs: Vec<Vec<u8>> =
                    (0..world).map(|_| sample(&mut rng, dtype, count)).collect();

                let by_function = Ranks::new(world, 4096, 5 * SECOND);
                let mut by_function = by_function;
                for (r, input) in inputs.iter().enumerate() {
                    by_function.write(r, offset, input);
                }
                let ranks = &*by_function;
                let statuses = ranks.run_per_rank(2, 8, None, &|r| {
                    // SAFETY: a live context of this model; the range fits the window.
                    unsafe {
                        symm_all_reduce_device(
                            ranks.context_address(r),
                            ranks.base(r),
                            offset as i64,
                            count as i64,
                            op as i32,
                            dtype as i32,
                        )
                    }
                });
                assert!(
                    statuses.iter().all(|s| *s == status::SUCCESS),
                    "{statuses:?}"
                );

                let mut by_kernel = Ranks::new(world, 4096, 5 * SECOND);
                for (r, input) in inputs.iter().enumerate() {
                    by_kernel.write(r, offset, input);
                }
                let args = CollectiveArgs {
                    send_offset: offset as u64,
                    recv_offset: offset as u64,
                    count: count as u64,
                    flags: FLAG_IN_PLACE,
                };
                by_kernel.launch(
                    kernel(Algorithm::OneShotAllReduce, dtype, op),
                    args,
                    2,
                    8,
                    None,
                );
                let expected = by_kernel.read::<u8>(0, offset, bytes);
                for r in 0..world {
                    assert_eq!(
                        by_function.read::<u8>(r, offset, bytes),
                        expected,
                        "{world} ranks, {dtype:?} {op:?}, rank {r}"
                    );
                }
            }
        }
    }
}

/// Independent references for a few cases: f32 sum against f64, exact integer products and
/// sums with wrap-around.
#[test]
fn all_reduce_against_independent_references() {
    let world = 3;
    let count = 257;
    let mut rng = Rng(11);
    let mut ranks = Ranks::new(world, 1 << 16, 5 * SECOND);
    let f32_inputs: Vec<Vec<f32>> = (0..world)
        .map(|_| {
            (0..count)
                .map(|_| (rng.next_u64() % 1000) as f32 / 8.0)
                .collect()
        })
        .collect();
    let i64_inputs: Vec<Vec<i64>> = (0..world)
        .map(|_| (0..count).map(|_| rng.next_u64() as i64).collect())
        .collect();
    let i32_inputs: Vec<Vec<i32>> = (0..world)
        .map(|_| {
            (0..count)
                .map(|_| (rng.next_u64() % 7) as i32 - 3)
                .collect()
        })
        .collect();
    for r in 0..world {
        ranks.write(r, 0, &f32_inputs[r]);
        ranks.write(r, 4096, &i64_inputs[r]);
        ranks.write(r, 8192, &i32_inputs[r]);
    }
    let shared = &*ranks;
    let calls: [(i64, i32, i32); 3] = [
        (0, RedOp::Sum as i32, DataType::Float32 as i32),
        (4096, RedOp::Sum as i32, DataType::Int64 as i32),
        (8192, RedOp::Prod as i32, DataType::Int32 as i32),
    ];
    for (offset, op, dtype) in calls {
        let statuses = shared.run_per_rank(3, 4, None, &|r| {
            // SAFETY: a live context; the ranges fit the window.
            unsafe {
                symm_all_reduce_device(
                    shared.context_address(r),
                    0,
                    offset,
                    count as i64,
                    op,
                    dtype,
                )
            }
        });
        assert_eq!(statuses, vec![status::SUCCESS; world]);
    }
    for r in 0..world {
        let sums = ranks.read::<f32>(r, 0, count);
        let wrapped = ranks.read::<i64>(r, 4096, count);
        let products = ranks.read::<i32>(r, 8192, count);
        for i in 0..count {
            let exact: f64 = f32_inputs.iter().map(|v| v[i] as f64).sum();
            assert_eq!(sums[i] as f64, exact, "f32 sum, element {i}");
            let sum = i64_inputs.iter().fold(0i64, |a, v| a.wrapping_add(v[i]));
            assert_eq!(wrapped[i], sum, "i64 sum, element {i}");
            let product = i32_inputs.iter().fold(1i32, |a, v| a.wrapping_mul(v[i]));
            assert_eq!(products[i], product, "i32 product, element {i}");
        }
    }
}

/// Out of place and in place, 1 to 5 ranks, byte counts of every alignment: every rank ends
/// with every rank's bytes in rank order.
#[test]
fn all_gather_in_and_out_of_place() {
    let mut rng = Rng(3);
    for world in 1..=5usize {
        for n_bytes in [0usize, 1, 3, 8, 17, 64, 333] {
            for in_place in [false, true] {
                let recv = 1024usize;
                let mut ranks = Ranks::new(world, 8192, 5 * SECOND);
                let inputs: Vec<Vec<u8>> = (0..world)
                    .map(|_| random_bytes(&mut rng, n_bytes))
                    .collect();
                let send_of = |r: usize| if in_place { recv + r * n_bytes } else { 16 };
                for (r, input) in inputs.iter().enumerate() {
                    ranks.write(r, send_of(r), input);
                }
                let shared = &*ranks;
                let statuses = shared.run_per_rank(2, 8, None, &|r| {
                    // SAFETY: a live context; the ranges fit the window.
                    unsafe {
                        symm_all_gather_device(
                            shared.context_address(r),
                            send_of(r) as i64,
                            recv as i64,
                            n_bytes as i64,
                        )
                    }
                });
                assert_eq!(statuses, vec![status::SUCCESS; world]);
                let expected: Vec<u8> = inputs.concat();
                for r in 0..world {
                    assert_eq!(
                        ranks.read::<u8>(r, recv, world * n_bytes),
                        expected,
                        "{world} ranks, {n_bytes} bytes, in place {in_place}, rank {r}"
                    );
                }
            }
        }
    }
}

/// Program `p` of every rank stores into every peer's window, calls the barrier, and then
/// reads what program `p` of every rank stored into its own window: all of it must be there.
/// Repeated on one window so that the barrier's epochs carry over between calls.
#[test]
fn barrier_publishes_stores_of_the_same_program_index() {
    let world = 4usize;
    let programs = 3u32;
    let ranks = Ranks::new(world, 8192, 5 * SECOND);
    for round in 1..=20u32 {
        let results = ranks.run_per_rank(programs, 4, None, &|r| {
            let block = symm_device::arch::block_idx_x() as usize;
            let thread = symm_device::arch::thread_idx_x();
            if thread == 0 {
                for peer in 0..world {
                    let slot = ranks.base(peer) as u64 + ((block * world + r) * 4) as u64;
                    // SAFETY: the slot lies in the peer's window; each (block, source) pair
                    // has one writer, and readers read only after the barrier.
                    unsafe { std::ptr::write_volatile(slot as *mut u32, round) };
                }
            }
            // SAFETY: a live context of this model.
            let code = unsafe { symm_barrier_device(ranks.context_address(r)) };
            if code != status::SUCCESS {
                return code;
            }
            for source in 0..world {
                let slot = ranks.base(r) as u64 + ((block * world + source) * 4) as u64;
                // SAFETY: the slot lies in this rank's window; written before the barrier.
                let seen = unsafe { std::ptr::read_volatile(slot as *const u32) };
                if seen != round {
                    return 1000 + source as i32;
                }
            }
            status::SUCCESS
        });
        assert_eq!(results, vec![status::SUCCESS; world], "round {round}");
    }
}

/// Device-function calls and launched kernels share a window's barrier epochs: a long mixed
/// sequence on one window stays correct.
#[test]
fn device_functions_and_launched_kernels_interleave_on_one_window() {
    let world = 3usize;
    let count = 40usize;
    let mut ranks = Ranks::new(world, 8192, 5 * SECOND);
    for step in 0..60u32 {
        let values: Vec<Vec<i32>> = (0..world)
            .map(|r| {
                (0..count)
                    .map(|i| (step as i32) * 100 + (r * count + i) as i32)
                    .collect()
            })
            .collect();
        for (r, v) in values.iter().enumerate() {
            ranks.write(r, 0, v);
        }
        let expected: Vec<i32> = (0..count)
            .map(|i| values.iter().map(|v| v[i]).sum())
            .collect();
        match step % 3 {
            0 => {
                let shared = &*ranks;
                let statuses = shared.run_per_rank(2, 8, None, &|r| {
                    // SAFETY: a live context; the range fits the window.
                    unsafe {
                        symm_all_reduce_device(
                            shared.context_address(r),
                            0,
                            0,
                            count as i64,
                            RedOp::Sum as i32,
                            DataType::Int32 as i32,
                        )
                    }
                });
                assert_eq!(statuses, vec![status::SUCCESS; world], "step {step}");
            }
            1 => {
                let args = CollectiveArgs {
                    send_offset: 0,
                    recv_offset: 0,
                    count: count as u64,
                    flags: FLAG_IN_PLACE,
                };
                let kernel = kernel(Algorithm::TwoShotAllReduce, DataType::Int32, RedOp::Sum);
                ranks.launch(kernel, args, 2, 8, None);
            }
            _ => {
                let shared = &*ranks;
                let statuses = shared.run_per_rank(2, 8, None, &|r| {
                    // SAFETY: a live context.
                    unsafe { symm_barrier_device(shared.context_address(r)) }
                });
                assert_eq!(statuses, vec![status::SUCCESS; world], "step {step}");
                let args = CollectiveArgs {
                    send_offset: 0,
                    recv_offset: 0,
                    count: count as u64,
                    flags: FLAG_IN_PLACE,
                };
                let kernel = kernel(Algorithm::OneShotAllReduce, DataType::Int32, RedOp::Sum);
                ranks.launch(kernel, args, 2, 8, None);
            }
        }
        for r in 0..world {
            assert_eq!(
                ranks.read::<i32>(r, 0, count),
                expected,
                "step {step}, rank {r}"
            );
        }
    }
}

/// One device-function call with its raw arguments.
#[derive(Clone, Copy)]
enum Call {
    Reduce(i64, i64, i64, i64, i32, i32),
    Gather(i64, i64, i64, i64),
    Barrier(i64),
}

impl Call {
    fn run(self) -> i32 {
        // SAFETY: every context passed is 0 or a live context of the test's model; the
        // functions check the ranges before touching memory.
        unsafe {
            match self {
                Call::Reduce(c, l, o, n, op, d) => symm_all_reduce_device(c, l, o, n, op, d),
                Call::Gather(c, s, r, n) => symm_all_gather_device(c, s, r, n),
                Call::Barrier(c) => symm_barrier_device(c),
            }
        }
    }
}

/// Every refusal comes back at once, on every thread, with the window's data untouched. A
/// refusal on a live context fails the window (its abort word is raised; see
/// `a_refused_call_fails_its_window_so_no_later_call_pairs_wrongly`); one without a usable
/// context cannot.
#[test]
fn bad_arguments_are_refused_before_anything_is_touched() {
    let world = 2usize;
    let mut ranks = Ranks::new(world, 1024, SECOND);
    let mut rng = Rng(5);
    let pattern = random_bytes(&mut rng, 1024);
    ranks.write(0, 0, &pattern);
    let shared = &*ranks;
    let context = shared.context_address(0);
    let base = shared.base(0);
    let f32_code = DataType::Float32 as i32;
    let sum = RedOp::Sum as i32;
    use Call::*;
    let calls = [
        (
            "null context",
            1,
            status::NULL_CONTEXT,
            Reduce(0, 0, 0, 1, sum, f32_code),
        ),
        (
            "unknown dtype",
            1,
            status::UNSUPPORTED_DTYPE,
            Reduce(context, 0, 0, 1, sum, 12),
        ),
        (
            "negative dtype",
            1,
            status::UNSUPPORTED_DTYPE,
            Reduce(context, 0, 0, 1, sum, -1),
        ),
        (
            "unknown op",
            1,
            status::UNSUPPORTED_OP,
            Reduce(context, 0, 0, 1, 5, f32_code),
        ),
        (
            "past the window",
            1,
            status::INVALID_ARGUMENT,
            Reduce(context, 0, 1020, 2, sum, f32_code),
        ),
        (
            "negative offset",
            1,
            status::INVALID_ARGUMENT,
            Reduce(context, 0, -4, 1, sum, f32_code),
        ),
        (
            "negative count",
            1,
            status::INVALID_ARGUMENT,
            Reduce(context, 0, 0, -1, sum, f32_code),
        ),
        (
            "overflowing count",
            1,
            status::INVALID_ARGUMENT,
            Reduce(context, 0, 0, i64::MAX / 2, sum, f32_code),
        ),
        (
            "misaligned",
            1,
            status::INVALID_ARGUMENT,
            Reduce(context, 0, 2, 1, sum, f32_code),
        ),
        (
            "foreign local_ptr",
            1,
            status::INVALID_ARGUMENT,
            Reduce(context, base + 8, 0, 1, sum, f32_code),
        ),
        (
            "too many programs",
            MAX_PROGRAMS + 1,
            status::INVALID_ARGUMENT,
            Reduce(context, 0, 0, 1, sum, f32_code),
        ),
        (
            "gather past the window",
            1,
            status::INVALID_ARGUMENT,
            Gather(context, 0, 600, 256),
        ),
        (
            "gather overlapping",
            1,
            status::INVALID_ARGUMENT,
            Gather(context, 8, 0, 16),
        ),
        (
            "gather negative",
            1,
            status::INVALID_ARGUMENT,
            Gather(context, 0, 64, -1),
        ),
        (
            "gather overflowing",
            1,
            status::INVALID_ARGUMENT,
            Gather(context, 0, 64, i64::MAX / 2 + 1),
        ),
        ("barrier null", 1, status::NULL_CONTEXT, Barrier(0)),
        (
            "barrier too many programs",
            MAX_PROGRAMS + 1,
            status::INVALID_ARGUMENT,
            Barrier(context),
        ),
    ];
    for (what, programs, expected, call) in &calls {
        let got = shared.run_per_rank(*programs, 2, Some(&[0]), &|_| call.run());
        assert_eq!(got, vec![*expected], "{what}");
    }
    assert_eq!(
        ranks.read::<u8>(0, 0, 1024),
        pattern,
        "a refused call touched the window"
    );
    assert_eq!(ranks.abort_word(0), ABORT_INVALID_LAUNCH);
    // Without a usable context, nothing can be raised.
    let fresh = Ranks::new(world, 1024, SECOND);
    let got = fresh.run_per_rank(1, 2, Some(&[0]), &|_| Barrier(0).run());
    assert_eq!(got, vec![status::NULL_CONTEXT]);
    assert!(!fresh.aborted(0) && !fresh.aborted(1));
}

/// Rank 0 refuses a call (an offset past its window) that rank 1 makes, then makes the next
/// call. Had the refusal left the window usable, rank 0's next call would pair with rank 1's
/// current one and both would return success with each other's data. The refusal fails the
/// window: rank 0's next call returns `TIMEOUT` at once, and rank 1's call times out. Each
/// refusing path in turn (type, operator, range), for the all-reduce and the all-gather.
#[test]
fn a_refused_call_fails_its_window_so_no_later_call_pairs_wrongly() {
    let f32_code = DataType::Float32 as i32;
    let sum = RedOp::Sum as i32;
    /// What is refused, the refused call on a context, and its status.
    type Refusal = (&'static str, fn(i64) -> Call, i32);
    let refusals: [Refusal; 5] = [
        (
            "dtype",
            |c| Call::Reduce(c, 0, 0, 16, RedOp::Sum as i32, 99),
            status::UNSUPPORTED_DTYPE,
        ),
        (
            "op",
            |c| Call::Reduce(c, 0, 0, 16, 99, DataType::Float32 as i32),
            status::UNSUPPORTED_OP,
        ),
        (
            "range",
            |c| Call::Reduce(c, 0, 4096, 16, RedOp::Sum as i32, DataType::Float32 as i32),
            status::INVALID_ARGUMENT,
        ),
        (
            "gather range",
            |c| Call::Gather(c, 0, 4096, 16),
            status::INVALID_ARGUMENT,
        ),
        (
            "gather overlap",
            |c| Call::Gather(c, 0, 8, 64),
            status::INVALID_ARGUMENT,
        ),
    ];
    for (what, refused, code) in refusals {
        let ranks = Ranks::new(2, 1024, SECOND / 5);
        let started = std::time::Instant::now();
        let statuses = ranks.run_per_rank(2, 4, None, &|r| {
            let context = ranks.context_address(r);
            let valid = Call::Reduce(context, 0, 0, 16, sum, f32_code);
            if r == 0 {
                let first = refused(context).run();
                let second = valid.run();
                first * 100 + second
            } else {
                valid.run()
            }
        });
        assert_eq!(
            statuses,
            vec![code * 100 + status::TIMEOUT, status::TIMEOUT],
            "{what}: rank 0 (refused, then next) and rank 1"
        );
        assert_eq!(ranks.abort_word(0), ABORT_INVALID_LAUNCH, "{what}");
        assert!(
            started.elapsed() < std::time::Duration::from_secs(5),
            "{what}"
        );
    }
}

/// A rank that never calls: the others return `TIMEOUT` within the window's bound.
#[test]
fn a_missing_rank_times_out_instead_of_hanging() {
    let ranks = Ranks::new(3, 1024, SECOND / 5);
    let started = std::time::Instant::now();
    let statuses = ranks.run_per_rank(2, 4, Some(&[0, 1]), &|r| {
        // SAFETY: a live context; the range fits the window.
        unsafe {
            symm_all_reduce_device(
                ranks.context_address(r),
                0,
                0,
                16,
                RedOp::Sum as i32,
                DataType::Float32 as i32,
            )
        }
    });
    assert_eq!(statuses, vec![status::TIMEOUT; 2]);
    assert!(ranks.aborted(0) && ranks.aborted(1));
    assert!(started.elapsed() < std::time::Duration::from_secs(5));
    // An aborted window refuses further calls at once.
    let again = ranks.run_per_rank(1, 4, Some(&[0]), &|r| {
        // SAFETY: a live context.
        unsafe { symm_barrier_device(ranks.context_address(r)) }
    });
    assert_eq!(again, vec![status::TIMEOUT]);
}
