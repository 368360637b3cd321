//! `symmSend` and `symmRecv` through the C ABI: rings in both directions between rank threads
//! (grouped, and ungrouped in an order that pairs), one thread driving every rank in a group
//! (`batch_isend_irecv`), more sends to one peer in a group than a channel has slots, buffers
//! at different offsets on the two sides, empty messages, and messages on several channels;
//! a receive whose count differs fails both ranks well before the timeout, naming the sender;
//! refused arguments leave the communicator usable.
//!
//! On the host backend by default; with `SYMM_BACKEND=cuda` on the cuda backend (the simulated
//! GPU runs it in `cargo xtask sim --test`).

use std::ptr::null_mut;
use std::time::{Duration, Instant};
use symm::*;
use symm_tests::*;

/// Elements (f32) of every window: room for a send and a receive region of `MAX_COUNT` each,
/// twice.
const WINDOW_COUNT: usize = 4 * MAX_COUNT + 64;
/// The largest message (f32): 80 KiB per message, over two channels.
const MAX_COUNT: usize = 20_480;
/// Message sizes (f32): empty, one, an odd tail, and two channels' worth.
const COUNTS: [usize; 4] = [0, 1, 1029, MAX_COUNT];
const F32: i32 = symmDataType_t::symmFloat32 as i32;

fn setup() {
    use_backend_from_env();
    if std::env::var("SYMM_TIMEOUT_MS").is_err() {
        // SAFETY: before any communicator exists in this process (each test's first call).
        unsafe { std::env::set_var("SYMM_TIMEOUT_MS", "20000") };
    }
}

/// The values rank `from` sends in message `tag`.
fn message(from: usize, tag: usize, count: usize) -> Vec<f32> {
    (0..count)
        .map(|i| (from * 1_000_000 + tag * 10_000 + i % 9_973) as f32)
        .collect()
}

/// Element offsets of the send and receive buffers of message `k` on `rank`: different on
/// every rank, so that no rank's offsets say anything about its peer's.
fn offsets(rank: usize, k: usize) -> (usize, usize) {
    let send = k * MAX_COUNT + 3 * rank + 1;
    (send, 2 * MAX_COUNT + k * MAX_COUNT + 5 * rank + 2)
}

/// Every rank thread: send `count` to the next rank and receive from the previous one, then
/// the other way round; `grouped` in one group each, else the even ranks send first and the
/// odd ranks receive first (which pairs without a group for an even number of ranks, and for
/// messages the host backend's send completes before its receive is called).
fn ring_on_threads(nranks: usize, count: usize, grouped: bool) {
    setup();
    let id = new_unique_id();
    let comms = join_threads(id, nranks);
    on_rank_threads(&comms, |rank, comm| {
        let stream = RankStream::new();
        let (buffer, window) = window_of_bytes(comm, WINDOW_COUNT * 4);
        let base = buffer as *mut u8;
        let at = |offset: usize| {
            // SAFETY: offsets inside the window.
            unsafe { base.add(4 * offset) }
        };
        for (k, shift) in [1, nranks - 1].into_iter().enumerate() {
            let to = (rank + shift) % nranks;
            let from = (rank + nranks - shift) % nranks;
            let (send, recv) = offsets(rank, k);
            stream.put_f32(at(send), &message(rank, k, count));
            stream.put_f32(at(recv), &vec![-1.0; count]);
            let do_send = || {
                symmSend(
                    at(send).cast(),
                    count,
                    F32,
                    to as i32,
                    comm,
                    stream.handle(),
                )
            };
            let do_recv = || {
                symmRecv(
                    at(recv).cast(),
                    count,
                    F32,
                    from as i32,
                    comm,
                    stream.handle(),
                )
            };
            if grouped {
                check(symmGroupStart(), comm);
                check(do_recv(), comm);
                check(do_send(), comm);
                check(symmGroupEnd(), comm);
            } else if rank % 2 == 0 {
                check(do_send(), comm);
                check(do_recv(), comm);
            } else {
                check(do_recv(), comm);
                check(do_send(), comm);
            }
            stream.synchronize();
            check(async_error(comm), comm);
            let got = stream.get_f32(at(recv), count);
            assert!(
                got == message(from, k, count),
                "{nranks} ranks, count {count}, grouped {grouped}: rank {rank} from rank {from}"
            );
        }
        check(symmCommWindowDeregister(comm, window), comm);
        check(symmMemFree(comm, buffer), comm);
        check(symmCommDestroy(comm), null_mut());
    });
}

#[test]
fn rings_both_ways_between_rank_threads_in_groups() {
    for nranks in [2, 3] {
        for count in COUNTS {
            ring_on_threads(nranks, count, true);
        }
    }
}

#[test]
fn sends_and_receives_pair_outside_groups() {
    for count in COUNTS {
        ring_on_threads(2, count, false);
    }
}

/// One thread drives every rank of a `symmCommInitAll` communicator: every rank sends to
/// every rank (itself included) and receives from every rank, `rounds` messages per pair (more
/// than a channel's slots), all in one group.
#[test]
fn one_thread_drives_every_rank_in_a_group() {
    setup();
    let nranks = 3;
    let rounds = symm_device::sync::p2p::SLOTS as usize + 3;
    let count = 257;
    let comms = init_all(nranks);
    let per_message = count + 3;
    let window = 2 * nranks * rounds * per_message + 16;
    let buffers = alloc_windows(&comms, window * 4);
    let send_at = |to: usize, k: usize| (to * rounds + k) * per_message;
    let recv_at = |from: usize, k: usize| (nranks * rounds + from * rounds + k) * per_message + 1;
    for (rank, b) in buffers.iter().enumerate() {
        for to in 0..nranks {
            for k in 0..rounds {
                // SAFETY: inside the window.
                put_f32(
                    unsafe { b.base.add(4 * send_at(to, k)) },
                    &message(rank, to * 100 + k, count),
                );
            }
        }
    }
    check(symmGroupStart(), null_mut());
    for (rank, b) in buffers.iter().enumerate() {
        for peer in 0..nranks {
            for k in 0..rounds {
                // SAFETY: inside the window.
                let (s, r) = unsafe {
                    (
                        b.base.add(4 * send_at(peer, k)),
                        b.base.add(4 * recv_at(peer, k)),
                    )
                };
                check(
                    symmSend(s.cast(), count, F32, peer as i32, b.comm, null_mut()),
                    b.comm,
                );
                check(
                    symmRecv(r.cast(), count, F32, peer as i32, b.comm, null_mut()),
                    b.comm,
                );
            }
            let _ = rank;
        }
    }
    check(symmGroupEnd(), null_mut());
    for (rank, b) in buffers.iter().enumerate() {
        for from in 0..nranks {
            for k in 0..rounds {
                // SAFETY: inside the window.
                let got = get_f32(unsafe { b.base.add(4 * recv_at(from, k)) }, count);
                assert!(
                    got == message(from, rank * 100 + k, count),
                    "rank {rank}, message {k} from rank {from}"
                );
            }
        }
    }
    teardown(buffers);
}

/// Rank 1 receives half of what rank 0 sends: both fail long before the 20 s bound, rank 1
/// naming rank 0 and the count; nothing lands in rank 1's buffer.
#[test]
fn a_receive_of_another_count_fails_both_promptly() {
    setup();
    let id = new_unique_id();
    let comms = join_threads(id, 2);
    let outcomes = on_rank_threads(&comms, |rank, comm| {
        let stream = RankStream::new();
        let (buffer, _window) = window_of_bytes(comm, WINDOW_COUNT * 4);
        let at = buffer as *mut u8;
        stream.put_f32(at, &vec![7.0; 1024]);
        let started = Instant::now();
        let result = if rank == 0 {
            stream.completed(
                comm,
                symmSend(at.cast(), 1024, F32, 1, comm, stream.handle()),
            )
        } else {
            std::thread::sleep(Duration::from_millis(200));
            let r = symmRecv(at.cast(), 512, F32, 0, comm, stream.handle());
            stream.completed(comm, r)
        };
        let took = started.elapsed();
        let message = last_error(comm);
        let untouched = rank == 0 || stream.get_f32(at, 4) == vec![7.0; 4];
        (result, took, message, untouched, buffer as usize)
    });
    for (rank, (result, took, message, untouched, _)) in outcomes.iter().enumerate() {
        assert_ne!(*result, symmResult_t::symmSuccess, "rank {rank}: {message}");
        assert!(
            *took < Duration::from_secs(5),
            "rank {rank} failed after {took:?}: {message}"
        );
        assert!(untouched, "rank {rank}'s receive buffer was written");
    }
    assert!(
        outcomes[1].2.contains("from rank 0") && outcomes[1].2.contains("count"),
        "{}",
        outcomes[1].2
    );
    for comm in comms {
        let _ = symmCommDestroy(comm);
    }
}

/// A call expected to be refused.
type RefusedCall<'a> = Box<dyn Fn() -> symmResult_t + 'a>;

/// A peer outside the communicator is refused and leaves the communicator usable (no call
/// can pair with it).
#[test]
fn a_peer_outside_the_communicator_is_refused() {
    setup();
    let id = new_unique_id();
    let comms = join_threads(id, 2);
    on_rank_threads(&comms, |rank, comm| {
        let stream = RankStream::new();
        let s = stream.handle();
        let peer = 1 - rank as i32;
        let (buffer, window) = window_of_bytes(comm, WINDOW_COUNT * 4);
        let at = buffer as *mut u8;
        let cases: [(&str, RefusedCall); 2] = [
            (
                "peer = 2",
                Box::new(|| symmSend(at.cast(), 4, F32, 2, comm, s)),
            ),
            (
                "peer = -1",
                Box::new(|| symmRecv(at.cast(), 4, F32, -1, comm, s)),
            ),
        ];
        for (text, call) in cases {
            let r = call();
            let message = last_error(comm);
            assert_eq!(r, symmResult_t::symmInvalidArgument, "{text}: {message}");
            assert!(message.contains(text), "{text}: {message}");
        }
        // Still usable: one exchange in a group.
        stream.put_f32(at, &message(rank, 0, 64));
        check(symmGroupStart(), comm);
        // SAFETY: inside the window.
        let recv = unsafe { at.add(4096) };
        check(symmSend(at.cast(), 64, F32, peer, comm, s), comm);
        check(symmRecv(recv.cast(), 64, F32, peer, comm, s), comm);
        check(symmGroupEnd(), comm);
        stream.synchronize();
        check(async_error(comm), comm);
        assert!(stream.get_f32(recv, 64) == message(peer as usize, 0, 64));
        check(symmCommWindowDeregister(comm, window), comm);
        check(symmMemFree(comm, buffer), comm);
        check(symmCommDestroy(comm), null_mut());
    });
}

/// A call refused once its peer is known (a bad data type, a NULL or overrunning buffer)
/// names what is wrong and fails the communicator on every rank at once: the
/// peer's matching call would otherwise wait for it, or pair with the next one. The peer's
/// send, already waiting, fails well before the 20 s bound.
#[test]
fn a_refused_call_with_a_peer_fails_both_ranks_at_once() {
    setup();
    let cases = ["datatype = 99", "recvbuff is NULL", "overruns"];
    for case in cases {
        let id = new_unique_id();
        let comms = join_threads(id, 2);
        let outcomes = on_rank_threads(&comms, |rank, comm| {
            let stream = RankStream::new();
            let s = stream.handle();
            let (buffer, _) = window_of_bytes(comm, WINDOW_COUNT * 4);
            let at = buffer as *mut u8;
            let started = Instant::now();
            let result = if rank == 0 {
                std::thread::sleep(Duration::from_millis(200));
                match case {
                    "datatype = 99" => symmRecv(at.cast(), 4, 99, 1, comm, s),
                    "recvbuff is NULL" => symmRecv(null_mut(), 4, F32, 1, comm, s),
                    _ => symmRecv(at.cast(), WINDOW_COUNT + 1, F32, 1, comm, s),
                }
            } else {
                stream.completed(comm, symmSend(at.cast(), 4, F32, 0, comm, s))
            };
            (result, started.elapsed(), last_error(comm))
        });
        let (result, _, message) = &outcomes[0];
        assert_ne!(*result, symmResult_t::symmSuccess, "{case}");
        assert!(
            message.contains(case) && message.contains("failed on every rank"),
            "{case}: {message}"
        );
        let (result, took, message) = &outcomes[1];
        assert_ne!(*result, symmResult_t::symmSuccess, "{case}: rank 1");
        // Rank 1's send was waiting for rank 0's receive when rank 0 refused it.
        assert!(
            *took < Duration::from_secs(5),
            "{case}: rank 1 failed after {took:?}: {message}"
        );
        for comm in comms {
            let _ = symmCommDestroy(comm);
        }
    }
}

/// A send or receive to the calling rank itself outside a group can never pair (its match
/// would have to be in the same launch): refused at once, and the communicator goes on.
#[test]
fn a_send_to_itself_outside_a_group_is_refused_at_once() {
    setup();
    let comms = join_threads(new_unique_id(), 2);
    on_rank_threads(&comms, |rank, comm| {
        let stream = RankStream::new();
        let (buffer, window) = window_of_bytes(comm, 4096);
        let started = Instant::now();
        let result = symmSend(buffer, 4, F32, rank as i32, comm, stream.handle());
        assert_eq!(result, symmResult_t::symmInvalidUsage, "rank {rank}");
        assert!(started.elapsed() < Duration::from_secs(2));
        let message = last_error(comm);
        assert!(
            message.contains("pairs only with its matching call"),
            "{message}"
        );
        // The communicator goes on: a send to itself in a group pairs.
        let at = buffer as *mut u8;
        stream.put_f32(at, &[1.0, 2.0, 3.0, 4.0]);
        check(symmGroupStart(), comm);
        check(
            symmSend(buffer, 4, F32, rank as i32, comm, stream.handle()),
            comm,
        );
        // SAFETY: inside the window.
        let into = unsafe { at.add(1024) };
        check(
            symmRecv(into.cast(), 4, F32, rank as i32, comm, stream.handle()),
            comm,
        );
        check(symmGroupEnd(), comm);
        stream.synchronize();
        assert_eq!(stream.get_f32(into, 4), [1.0, 2.0, 3.0, 4.0]);
        check(symmCommWindowDeregister(comm, window), comm);
        check(symmMemFree(comm, buffer), comm);
        check(symmCommDestroy(comm), null_mut());
    });
}

/// A rank that aborts and frees everything never unmaps memory a peer's kernel still writes
/// into: rank 1's send is captured into a CUDA graph while both ranks are healthy, rank 0
/// aborts (destroying its communicator and freeing its windows and memory), then rank 1 replays
/// the graph. Its kernel's first store goes into rank 0's point-to-point window, which rank 1's
/// windows keep alive; the kernel then sees the raised abort word and ends. The device stays
/// healthy: the stream synchronizes, rank 1 reports the abort, and a new pair of ranks in the
/// same process exchanges messages. (The cuda backend only, where a store into unmapped memory
/// faults, stickily: on the host backend it would land in freed heap memory unseen; a unit
/// test of `comm::windows` checks the hold there.)
#[test]
fn a_peer_that_aborts_and_frees_leaves_the_memory_a_kernel_writes() {
    setup();
    if !on_cuda() {
        return;
    }
    use cudarc::driver::sys;
    let count = 1029;
    let comms = init_all(2);
    let mut buffers = alloc_windows(&comms, WINDOW_COUNT * 4);
    cuda_context();
    // SAFETY: stream, graph and exec are made, used and destroyed here, in the current
    // context; the capture is ended before anything else is enqueued.
    unsafe {
        let stream = capturing_stream();
        let send = symmSend(
            buffers[1].base.cast(),
            count,
            F32,
            0,
            buffers[1].comm,
            stream.cast(),
        );
        let mut graph = null_mut();
        sys::cuStreamEndCapture(stream, &mut graph)
            .result()
            .unwrap();
        check(send, buffers[1].comm);
        let mut exec = null_mut();
        sys::cuGraphInstantiateWithFlags(&mut exec, graph, 0)
            .result()
            .unwrap();
        let gone = buffers.remove(0);
        check(symmCommAbort(gone.comm), null_mut());
        sys::cuGraphLaunch(exec, stream).result().unwrap();
        assert_eq!(
            sys::cuStreamSynchronize(stream),
            sys::CUresult::CUDA_SUCCESS,
            "the replayed send took the device down"
        );
        let comm = buffers[0].comm;
        assert_ne!(async_error(comm), symmResult_t::symmSuccess);
        assert!(
            last_error(comm).contains("symmCommAbort"),
            "{}",
            last_error(comm)
        );
        sys::cuGraphExecDestroy(exec).result().unwrap();
        sys::cuGraphDestroy(graph).result().unwrap();
        sys::cuStreamDestroy_v2(stream).result().unwrap();
    }
    for b in buffers {
        check(symmCommWindowDeregister(b.comm, b.window), b.comm);
        check(symmMemFree(b.comm, b.base.cast()), b.comm);
        check(symmCommDestroy(b.comm), null_mut());
    }
    // The process's device still works: a new pair of ranks exchanges messages.
    ring_on_threads(2, count, true);
}

/// The environment variable that makes this binary a rank process (its value: the rank).
const CHILD_ENV: &str = "SYMM_P2P_CHILD";
/// The unique id the rank processes join, as hex.
const ID_ENV: &str = "SYMM_P2P_ID";

/// A process per rank: rings both ways in groups for every size, bit for bit; then rank 1
/// receives half of what rank 0 sends, and both fail well before the 20 s bound (the
/// receiver's refusal reaches the sender's process at once), rank 1 naming rank 0.
#[test]
fn a_process_per_rank() {
    setup();
    let id = new_unique_id();
    let ranks: Vec<Vec<(String, String)>> = (0..2)
        .map(|rank| {
            vec![
                (CHILD_ENV.to_string(), rank.to_string()),
                (ID_ENV.to_string(), id_to_hex(&id)),
                ("SYMM_TIMEOUT_MS".to_string(), "20000".to_string()),
            ]
        })
        .collect();
    let results = run_rank_processes("rank_process", &ranks, Duration::from_secs(300));
    for (rank, (ok, log)) in results.iter().enumerate() {
        assert!(ok, "rank process {rank} failed:\n{log}");
        let outcome =
            parse_outcome(rank, log).unwrap_or_else(|| panic!("rank {rank}: no outcome:\n{log}"));
        assert_ne!(
            outcome.result,
            symmResult_t::symmSuccess,
            "rank {rank}: {}",
            outcome.message
        );
        assert!(
            outcome.took < Duration::from_secs(5),
            "rank {rank} failed after {:?}: {}",
            outcome.took,
            outcome.message
        );
        if rank == 1 {
            assert!(
                outcome.message.contains("from rank 0"),
                "{}",
                outcome.message
            );
        }
    }
}

/// One rank of [`a_process_per_rank`] (run by it, in a process of its own).
#[test]
#[ignore = "a rank process of a_process_per_rank"]
fn rank_process() {
    let Ok(rank) = std::env::var(CHILD_ENV) else {
        return;
    };
    setup();
    let rank: usize = rank.parse().unwrap();
    let id = id_from_hex(&std::env::var(ID_ENV).unwrap());
    let mut comm = null_mut();
    // SAFETY: valid out-pointer.
    check(
        unsafe { symmCommInitRank(&mut comm, 2, id, rank as i32) },
        null_mut(),
    );
    let stream = RankStream::new();
    let s = stream.handle();
    let (buffer, _window) = window_of_bytes(comm, WINDOW_COUNT * 4);
    let base = buffer as *mut u8;
    let at = |offset: usize| {
        // SAFETY: offsets inside the window.
        unsafe { base.add(4 * offset) }
    };
    let peer = 1 - rank;
    for count in COUNTS {
        let (send, recv) = offsets(rank, 0);
        stream.put_f32(at(send), &message(rank, count, count));
        check(symmGroupStart(), comm);
        check(
            symmSend(at(send).cast(), count, F32, peer as i32, comm, s),
            comm,
        );
        check(
            symmRecv(at(recv).cast(), count, F32, peer as i32, comm, s),
            comm,
        );
        check(symmGroupEnd(), comm);
        stream.synchronize();
        check(async_error(comm), comm);
        assert!(
            stream.get_f32(at(recv), count) == message(peer, count, count),
            "count {count}"
        );
    }
    let started = Instant::now();
    let result = if rank == 0 {
        stream.completed(comm, symmSend(at(0).cast(), 1024, F32, 1, comm, s))
    } else {
        std::thread::sleep(Duration::from_millis(200));
        let r = symmRecv(at(0).cast(), 512, F32, 0, comm, s);
        stream.completed(comm, r)
    };
    print_outcome(result, started.elapsed(), &last_error(comm));
    let _ = symmCommDestroy(comm);
}
