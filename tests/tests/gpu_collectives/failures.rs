//! Failures and refusals: a missing peer raising the abort word, mismatched calls failing the
//! communicator on every rank, calls refused on one rank or in a group, more ranks on one GPU
//! than it holds blocks, and a second thread on a rank.

use crate::per_rank::{GpuRank, on_own_stream, per_rank_on_streams};
use crate::probes::{driver_calls, simulator_call_counter};
use crate::{cuda_ranks, largest_count, multiprocessors, repeats, synchronize};
use cudarc::driver::{result, sys};
use std::ffi::c_void;
use std::ptr::null_mut;
use std::time::{Duration, Instant};
use symm::*;
use symm_tests::*;

gpu_test! {
    fn gpu_missing_peer_raises_the_abort_word_instead_of_hanging() {
        // Default SYMM_TIMEOUT_MS (10 s) applies.
        let comms = cuda_ranks(2);
        let buffers = alloc_windows(&comms, 4096);
        let b = &buffers[0];
        let start = Instant::now();
        // Rank 0 launches alone while rank 1 shares the GPU: a separate launch, which needs a
        // non-blocking stream (the NULL stream is refused).
        let mut stream = null_mut();
        // SAFETY: a context is current (see `cuda_ranks`); the stream is destroyed below.
        unsafe { sys::cuStreamCreate(&mut stream, 1) }
            .result()
            .unwrap();
        let (f32_, sum) = (
            symmDataType_t::symmFloat32 as i32,
            symmRedOp_t::symmSum as i32,
        );
        let p = b.base as *mut c_void;
        check(
            symmAllReduce(p, p, 64, f32_, sum, b.comm, stream.cast()),
            b.comm,
        );
        synchronize();
        // SAFETY: created above, idle after the synchronize.
        unsafe { sys::cuStreamDestroy_v2(stream) }.result().unwrap();
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the kernel did not give up"
        );
        let mut ctx: *const c_void = std::ptr::null();
        // SAFETY: valid out-pointer.
        check(
            unsafe { symmCommGetDeviceContext(b.comm, b.window, &mut ctx) },
            b.comm,
        );
        let mut image = [0u8; 96];
        // SAFETY: the context is 96 bytes of device memory.
        unsafe { result::memcpy_dtoh_sync(&mut image, ctx as sys::CUdeviceptr) }.unwrap();
        let abort_flag = u64::from_ne_bytes(image[56..64].try_into().unwrap());
        let mut word = [0u32; 1];
        // SAFETY: the abort word is a u32 in device memory.
        unsafe { result::memcpy_dtoh_sync(&mut word, abort_flag) }.unwrap();
        // Raised as a timeout that names the peer it waited for (rank 1).
        assert_eq!(
            word[0] & 0xFF,
            symm_device::symmetric::ABORT_TIMED_OUT,
            "abort word not raised as a timeout: {:#x}",
            word[0]
        );
        assert_eq!(
            symm_device::symmetric::timed_out_peer(word[0]),
            Some(1),
            "the abort word names the wrong peer: {:#x}",
            word[0]
        );
        teardown(buffers);
    }
}

gpu_test! {
    /// The new user's report on the cuda backend (a thread and a stream per rank): rank 0
    /// all-reduces 1024 floats, rank 1 only 512, then both all-reduce 16 elements of 10·(r+1).
    /// Launches do not wait for the kernels, so the rank that launched first may see its calls
    /// accepted; but the communicator fails on both ranks (the asynchronous error says so), the
    /// refused rank is told why, no later call is accepted once a rank knows of the failure, and
    /// nothing ever returns success with a stale pairing (21.0 where 30.0 is right).
    fn gpu_a_mismatch_between_threads_fails_the_communicator_on_every_rank() {
        let comms = cuda_ranks(2);
        let buffers = alloc_windows(&comms, 8192);
        let ranks = GpuRank::of(&buffers);
        let outcomes = per_rank_on_streams(&ranks, |r, rank, stream| {
            rank.fill(0, 1024, 1.0);
            let count = if r == 0 { 1024 } else { 512 };
            let first = rank.all_reduce(0, count, stream);
            let first_message = last_error(rank.comm());
            rank.read(0, 1, stream);
            let status_after_first = async_error(rank.comm());
            rank.fill(0, 16, 10.0 * (r as f32 + 1.0));
            let second = rank.all_reduce(0, 16, stream);
            let second_message = last_error(rank.comm());
            let data = rank.read(0, 16, stream);
            (
                first,
                first_message,
                status_after_first,
                second,
                second_message,
                data,
            )
        });
        let refused: Vec<usize> = (0..2)
            .filter(|&r| outcomes[r].0 != symmResult_t::symmSuccess)
            .collect();
        assert!(!refused.is_empty(), "both mismatched calls were accepted");
        for (r, (first, first_message, after_first, second, second_message, data)) in
            outcomes.iter().enumerate()
        {
            if *first != symmResult_t::symmSuccess {
                assert!(
                    first_message.contains("symmAllReduce of 1024") && first_message.contains("of 512"),
                    "rank {r}: {first_message}"
                );
                // A rank that knows of the failure accepts nothing more.
                assert_ne!(*after_first, symmResult_t::symmSuccess, "rank {r}");
            }
            if *after_first != symmResult_t::symmSuccess {
                assert_ne!(
                    *second,
                    symmResult_t::symmSuccess,
                    "rank {r}'s call after the failure was accepted: {data:?}"
                );
                assert!(
                    second_message.contains("the communicator has failed"),
                    "rank {r}: {second_message}"
                );
            }
            // Whatever was accepted, the communicator has failed on this rank.
            assert_ne!(
                async_error(ranks[r].comm()),
                symmResult_t::symmSuccess,
                "rank {r}: the communicator did not fail (second call's data {data:?})"
            );
            if *second == symmResult_t::symmSuccess {
                assert_ne!(data, &vec![21.0; 16], "rank {r} paired with a stale call");
            }
        }
        teardown(buffers);
    }
}

gpu_test! {
    /// A call refused on one rank for a bad argument (beyond its window) while its peer made the
    /// call, on the cuda backend: the refusal is still that rank's call, so neither rank's next
    /// call pairs with the peer's stale one; the communicator fails on both. Ranks that all
    /// refuse the same call stay in step and go on.
    fn gpu_a_call_refused_on_one_rank_is_still_its_call() {
        let comms = cuda_ranks(2);
        let buffers = alloc_windows(&comms, 4096);
        let ranks = GpuRank::of(&buffers);
        let refused = per_rank_on_streams(&ranks, |_, rank, stream| rank.all_reduce(0, 5000, stream));
        assert!(
            refused
                .iter()
                .all(|r| *r == symmResult_t::symmInvalidArgument),
            "{refused:?}"
        );
        let sums = per_rank_on_streams(&ranks, |r, rank, stream| {
            rank.fill(0, 64, r as f32 + 1.0);
            (rank.all_reduce(0, 64, stream), rank.read(0, 64, stream))
        });
        for (result, data) in &sums {
            assert_eq!(*result, symmResult_t::symmSuccess);
            assert_eq!(data, &vec![3.0; 64]);
        }
        let outcomes = per_rank_on_streams(&ranks, |r, rank, stream| {
            rank.fill(0, 64, r as f32 + 1.0);
            let first = if r == 0 {
                rank.all_reduce(0, 64, stream)
            } else {
                rank.all_reduce(4000, 64, stream)
            };
            rank.read(0, 1, stream);
            rank.fill(0, 64, 10.0 * (r as f32 + 1.0));
            let second = rank.all_reduce(0, 64, stream);
            (first, second, rank.read(0, 64, stream))
        });
        assert_eq!(outcomes[1].0, symmResult_t::symmInvalidArgument);
        assert_ne!(
            outcomes[1].1,
            symmResult_t::symmSuccess,
            "{:?}",
            outcomes[1].2
        );
        for (r, (_, _, data)) in outcomes.iter().enumerate() {
            assert_ne!(
                async_error(ranks[r].comm()),
                symmResult_t::symmSuccess,
                "rank {r}: {data:?}"
            );
            // Rank 0's second call (#3) may have been accepted before rank 1's refusal was known;
            // it then ends with the failure, never with a stale pairing (rank 1's 2.0 + 10.0).
            assert_ne!(data, &vec![12.0; 64], "rank {r} paired with a stale call");
        }
        teardown(buffers);
    }
}

gpu_test! {
    /// One thread driving both ranks in a group, on the cuda backend: rank 0's all-reduce is valid
    /// and rank 1's overruns its window. The whole group is refused before anything is launched,
    /// `symmGroupEnd` returns the bad argument's error, and the communicator stays usable.
    fn gpu_a_bad_call_in_a_group_refuses_the_group_and_keeps_the_communicator() {
        let comms = cuda_ranks(2);
        let buffers = alloc_windows(&comms, 4096);
        let ranks = GpuRank::of(&buffers);
        let stream = non_blocking_stream();
        ranks[0].fill(0, 16, 1.0);
        ranks[1].fill(0, 16, 2.0);
        check(symmGroupStart(), null_mut());
        check(ranks[0].all_reduce(0, 16, stream), ranks[0].comm());
        assert_eq!(
            ranks[1].all_reduce(4090, 16, stream),
            symmResult_t::symmInvalidArgument
        );
        let end = symmGroupEnd();
        let message = last_error(null_mut());
        assert_eq!(end, symmResult_t::symmInvalidArgument, "{message}");
        assert!(
            message.contains("nothing of this group was launched"),
            "{message}"
        );
        assert_eq!(ranks[0].read(0, 16, stream), vec![1.0; 16], "something ran");
        for rank in &ranks {
            assert_eq!(async_error(rank.comm()), symmResult_t::symmSuccess);
        }
        check(symmGroupStart(), null_mut());
        for (r, rank) in ranks.iter().enumerate() {
            rank.fill(0, 16, 10.0 * (r as f32 + 1.0));
            check(rank.all_reduce(0, 16, stream), rank.comm());
        }
        check(symmGroupEnd(), null_mut());
        for rank in &ranks {
            assert_eq!(rank.read(0, 16, stream), vec![30.0; 16]);
        }
        // SAFETY: created above, idle after the reads.
        unsafe { sys::cuStreamDestroy_v2(stream) }.result().unwrap();
        teardown(buffers);
    }
}

gpu_test! {
    /// More ranks on one GPU than it holds blocks of the kernel at once, driven from one thread
    /// in a group (one cooperative launch, whose blocks wait for each other): the group is refused
    /// with `symmInvalidUsage` naming the residency, before its calls are numbered. Nothing is
    /// launched, no communicator is failed, and teardown completes. (The driver's
    /// `CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE` after the numbering failed the communicator on
    /// every rank.) Five ranks need a device of one multiprocessor, which holds at most four blocks
    /// of 512 threads: the simulated GPU with `SYMM_SIM_SMS=1`; skipped on a larger one.
    fn gpu_more_ranks_on_one_gpu_than_it_holds_blocks_are_refused_before_launch() {
        let nranks = 5;
        let comms = cuda_ranks(nranks);
        let buffers = alloc_windows(&comms, 4096);
        if multiprocessors(0) > 1 {
            eprintln!("skipped: needs a device of one multiprocessor (SYMM_SIM_SMS=1)");
            teardown(buffers);
            return;
        }
        let ranks = GpuRank::of(&buffers);
        let stream = non_blocking_stream();
        for (r, rank) in ranks.iter().enumerate() {
            rank.fill(0, 16, r as f32 + 1.0);
        }
        let launches = || {
            simulator_call_counter().map(|counter| {
                let (_, table) = driver_calls(counter);
                table
                    .iter()
                    .filter(|(name, _)| name.starts_with("cuLaunch"))
                    .map(|(_, n)| n)
                    .sum::<u64>()
            })
        };
        let launched_before = launches();
        check(symmGroupStart(), null_mut());
        for rank in &ranks {
            check(rank.all_reduce(0, 16, stream), rank.comm());
        }
        let end = symmGroupEnd();
        let message = last_error(null_mut());
        assert_eq!(end, symmResult_t::symmInvalidUsage, "{message}");
        assert!(
            message.contains("must be resident at once") && message.contains("holds only"),
            "{message}"
        );
        assert_eq!(launches(), launched_before, "a kernel was launched");
        for (r, rank) in ranks.iter().enumerate() {
            assert_eq!(
                rank.read(0, 16, stream),
                vec![r as f32 + 1.0; 16],
                "rank {r}: something ran"
            );
            assert_eq!(
                async_error(rank.comm()),
                symmResult_t::symmSuccess,
                "rank {r}: {}",
                last_error(rank.comm())
            );
        }
        // SAFETY: created above, idle after the reads.
        unsafe { sys::cuStreamDestroy_v2(stream) }.result().unwrap();
        teardown(buffers);
    }
}

gpu_test! {
    /// Two threads of rank 0 start all-reduces on one communicator at the same moment (region A
    /// with n floats, region B with 2n, each thread on its own stream) while rank 1 calls A then B,
    /// on the cuda backend. The library numbers and launches a rank's calls in one order (a second
    /// thread entering a collective while another's is being launched is refused), so whatever the
    /// interleaving, no call is accepted and then completes with another call's data: a call
    /// whose rank's communicator did not fail returned the right sum.
    fn gpu_two_threads_on_one_rank_never_pair_wrongly() {
        let sizes: &[usize] = if largest_count() < 64 * 1024 {
            &[1024, 4096]
        } else {
            &[1024, 4096, 16 * 1024, 64 * 1024]
        };
        let rounds = repeats(6).min(6);
        let (mut clean, mut failed) = (0, 0);
        for &n in sizes {
            for round in 0..rounds {
                let comms = cuda_ranks(2);
                let buffers = alloc_windows(&comms, 4 * 3 * n + 4096);
                let ranks = GpuRank::of(&buffers);
                let (a, b) = (0usize, 4 * n);
                let value =
                    |r: usize, region: usize| (100 * (r + 1) + 10 * region) as f32 + round as f32;
                for (r, rank) in ranks.iter().enumerate() {
                    rank.fill(a, n, value(r, 1));
                    rank.fill(b, 2 * n, value(r, 2));
                }
                let want = |region: usize| value(0, region) + value(1, region);
                let start = std::sync::Barrier::new(3);
                // (rank, region, result, data once its stream finished, message)
                let results: Vec<(usize, usize, symmResult_t, Vec<f32>, String)> =
                    std::thread::scope(|scope| {
                        let start = &start;
                        let call = |r: usize, rank: GpuRank, region: usize, stream| {
                            let (offset, count) = if region == 1 { (a, n) } else { (b, 2 * n) };
                            let result = rank.all_reduce(offset, count, stream);
                            let message = last_error(rank.comm());
                            (r, region, result, rank.read(offset, count, stream), message)
                        };
                        let mut handles = Vec::new();
                        for region in [1, 2] {
                            let rank = ranks[0];
                            handles.push(scope.spawn(move || {
                                on_own_stream(|stream| {
                                    start.wait();
                                    vec![call(0, rank, region, stream)]
                                })
                            }));
                        }
                        let rank = ranks[1];
                        handles.push(scope.spawn(move || {
                            on_own_stream(|stream| {
                                start.wait();
                                vec![call(1, rank, 1, stream), call(1, rank, 2, stream)]
                            })
                        }));
                        handles
                            .into_iter()
                            .flat_map(|h| h.join().unwrap())
                            .collect()
                    });
                let healthy: Vec<bool> = ranks
                    .iter()
                    .map(|rank| async_error(rank.comm()) == symmResult_t::symmSuccess)
                    .collect();
                for (r, region, result, data, message) in &results {
                    if *result == symmResult_t::symmSuccess && healthy[*r] {
                        if let Some(x) = data.iter().find(|x| **x != want(*region)) {
                            panic!(
                                "n {n} round {round}: rank {r}'s region {region} succeeded with {x} \
                                 where {} is right",
                                want(*region)
                            );
                        }
                    } else if *result != symmResult_t::symmSuccess
                        && message.starts_with("symmAllReduce: comm is in use by another thread")
                    {
                        // (The last error is the rank's, shared by its two threads: a call that
                        // succeeded may find the other thread's refusal there.)
                        assert_eq!(*result, symmResult_t::symmInvalidUsage, "{message}");
                        assert!(
                            message.matches("symmAllReduce").count() >= 2,
                            "the refusal does not name both calls: {message}"
                        );
                    }
                }
                if healthy.iter().all(|h| *h) {
                    clean += 1;
                } else {
                    failed += 1;
                }
                teardown(buffers);
            }
        }
        eprintln!("{clean} rounds completed, {failed} failed the communicator (never wrongly paired)");
    }
}

gpu_test! {
    /// The refusal made certain: thread A of rank 0 holds the rank with a call queued in its open
    /// group while thread B of rank 0 makes another call. B is refused at once with
    /// `symmInvalidUsage` naming both calls, nothing of B's runs, and the communicator fails on
    /// both ranks, so A's group and rank 1's call end in an error, never in a wrong pairing.
    fn gpu_a_second_thread_is_refused_while_another_holds_the_rank() {
        let comms = cuda_ranks(2);
        let buffers = alloc_windows(&comms, 8192);
        let ranks = GpuRank::of(&buffers);
        for (r, rank) in ranks.iter().enumerate() {
            rank.fill(0, 512, 1.0 + r as f32);
            rank.fill(4096, 256, 10.0 + r as f32);
        }
        let queued = std::sync::Barrier::new(2);
        let refused = std::sync::Barrier::new(2);
        let (group_end, (b_result, b_message, b_data)) = std::thread::scope(|scope| {
            let (queued, refused) = (&queued, &refused);
            let rank = ranks[0];
            let a = scope.spawn(move || {
                on_own_stream(|stream| {
                    check(symmGroupStart(), null_mut());
                    check(rank.all_reduce(0, 512, stream), rank.comm());
                    queued.wait();
                    refused.wait();
                    let end = symmGroupEnd();
                    rank.read(0, 1, stream);
                    end
                })
            });
            let b = scope.spawn(move || {
                on_own_stream(|stream| {
                    queued.wait();
                    let result = rank.all_reduce(4096, 256, stream);
                    let message = last_error(rank.comm());
                    refused.wait();
                    (result, message, rank.read(4096, 256, stream))
                })
            });
            (a.join().unwrap(), b.join().unwrap())
        });
        assert_eq!(b_result, symmResult_t::symmInvalidUsage, "{b_message}");
        assert!(
            b_message.starts_with("symmAllReduce: comm is in use by another thread")
                && b_message.contains("symmAllReduce of 256")
                && b_message.contains("symmAllReduce of 512"),
            "{b_message}"
        );
        assert_eq!(b_data, vec![10.0; 256], "the refused call ran");
        // Rank 1 makes its first call: it must not pair with anything of rank 0's.
        let (peer, peer_data) = on_own_stream(|stream| {
            (
                ranks[1].all_reduce(0, 512, stream),
                ranks[1].read(0, 512, stream),
            )
        });
        assert_ne!(group_end, symmResult_t::symmSuccess, "thread A's group ran");
        assert_ne!(peer, symmResult_t::symmSuccess, "rank 1: {peer_data:?}");
        for rank in &ranks {
            assert_ne!(async_error(rank.comm()), symmResult_t::symmSuccess);
        }
        teardown(buffers);
    }
}
