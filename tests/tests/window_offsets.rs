//! Buffers at different offsets of their windows on different ranks. A peer reads and writes a
//! rank's buffer at the offset *it* was given, so every rank must pass its buffers at the same
//! offset of the same window registration: a call where they differ is refused on every rank
//! before anything is written — never success with wrong data, never a store outside the
//! buffer a receiver passed.
//!
//! Every collective × layout (a thread per rank, one thread driving the ranks in a group, a
//! process per rank) × size (16 elements: the low-latency path; 8192: the large-message
//! kernels). Each case first makes the call with every rank's buffers at the same non-zero
//! offset (it must succeed with exact data), then the call with rank `r`'s buffers `r` elements
//! further into the window: every rank must get an error (at least one naming the offsets) and
//! every byte of every rank's window must be unchanged.
//!
//! On the host backend by default; with `SYMM_BACKEND=cuda` on the cuda backend (the simulated
//! GPU runs it in `cargo xtask sim --test`), the windows filled and read through the driver.

use std::ffi::c_void;
use std::ptr::null_mut;
use std::time::{Duration, Instant};
use symm::*;
use symm_tests::*;

/// Ranks of every case.
const NRANKS: usize = 2;
/// Element counts: the low-latency path, and the large-message kernels.
const SIZES: [usize; 2] = [16, 8192];
/// Bound of every wait on a peer.
const TIMEOUT_MS: &str = "3000";
/// The environment variable that makes this binary a rank process.
const CHILD_ENV: &str = "SYMM_OFFSETS_CHILD";

/// The collectives, each with its buffers placed at a per-rank shift.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Coll {
    /// In place, at the shift.
    AllReduce,
    /// Out of place, to the root (rank 1).
    Reduce,
    /// Out of place: send at the shift, receive at the receive region plus the shift.
    AllGather,
    /// Out of place, like the all-gather.
    ReduceScatter,
    /// In place on the root (rank 1), at the shift.
    Broadcast,
    /// Out of place, like the all-gather.
    AllToAll,
    /// Out of place, to the root (rank 1).
    Gather,
    /// Out of place, from the root (rank 1).
    Scatter,
}

const COLLS: [Coll; 8] = [
    Coll::AllReduce,
    Coll::Reduce,
    Coll::AllGather,
    Coll::ReduceScatter,
    Coll::Broadcast,
    Coll::AllToAll,
    Coll::Gather,
    Coll::Scatter,
];

impl Coll {
    fn name(self) -> &'static str {
        match self {
            Coll::AllReduce => "allreduce",
            Coll::Reduce => "reduce",
            Coll::AllGather => "allgather",
            Coll::ReduceScatter => "reducescatter",
            Coll::Broadcast => "broadcast",
            Coll::AllToAll => "alltoall",
            Coll::Gather => "gather",
            Coll::Scatter => "scatter",
        }
    }

    fn from_name(name: &str) -> Coll {
        *COLLS
            .iter()
            .find(|c| c.name() == name)
            .expect("a collective")
    }
}

/// The broadcast's root.
const ROOT: usize = 1;

/// Elements of a window for `count`: a send region and a receive region, each room for every
/// rank's share plus the largest shift.
fn region(count: usize) -> usize {
    NRANKS * count + 2 * NRANKS
}

fn window_bytes(count: usize) -> usize {
    2 * region(count) * 4
}

/// Rank `rank`'s input element `i` (exact in f32, distinct per rank and element).
fn input_f32(rank: usize, i: usize) -> f32 {
    ((rank + 1) * 100_000 + i) as f32
}

/// Rank `rank`'s window before a call: the inputs of its call at `shift` (the rest of the send
/// region too), and a pattern in the receive region.
fn fill(rank: usize, count: usize) -> Vec<f32> {
    let r = region(count);
    (0..2 * r)
        .map(|i| {
            if i < r {
                input_f32(rank, i)
            } else {
                -((rank * 7 + i) as f32)
            }
        })
        .collect()
}

/// Where each rank's buffers lie: rank `r`'s send buffer `send` elements into its send
/// region, its receive buffer `recv` elements into its receive region.
#[derive(Clone, Copy, Debug)]
struct Place {
    send: usize,
    recv: usize,
}

impl Place {
    /// Both buffers `shift` elements in.
    fn both(shift: usize) -> Place {
        Place {
            send: shift,
            recv: shift,
        }
    }
}

/// One rank's call of `coll` with its buffers at `place` in the window at `base` (in place:
/// at the send place).
fn call(
    coll: Coll,
    comm: symmComm_t,
    base: *mut u8,
    count: usize,
    place: Place,
    stream: symmStream_t,
) -> symmResult_t {
    let f32_ = symmDataType_t::symmFloat32 as i32;
    let sum = symmRedOp_t::symmSum as i32;
    let send = base.wrapping_add(4 * place.send).cast::<c_void>();
    let recv = base
        .wrapping_add(4 * (region(count) + place.recv))
        .cast::<c_void>();
    match coll {
        Coll::AllReduce => symmAllReduce(send, send, count, f32_, sum, comm, stream),
        Coll::Reduce => symmReduce(send, recv, count, f32_, sum, ROOT as i32, comm, stream),
        Coll::AllGather => symmAllGather(send, recv, count, f32_, comm, stream),
        Coll::ReduceScatter => symmReduceScatter(send, recv, count, f32_, sum, comm, stream),
        Coll::Broadcast => symmBroadcast(send, send, count, f32_, ROOT as i32, comm, stream),
        Coll::AllToAll => symmAlltoAll(send, recv, count, f32_, comm, stream),
        Coll::Gather => symmGather(send, recv, count, f32_, ROOT as i32, comm, stream),
        Coll::Scatter => symmScatter(send, recv, count, f32_, ROOT as i32, comm, stream),
    }
}

/// Rank `rank`'s window after a successful call of `coll` with every rank's buffers at
/// `place(rank)` on windows filled by [`fill`]: the exact result (the inputs are integers, so
/// every sum is exact).
fn expected(coll: Coll, rank: usize, count: usize, place: impl Fn(usize) -> Place) -> Vec<f32> {
    let mut window = fill(rank, count);
    let own = place(rank);
    let recv = region(count) + own.recv;
    let send_element = |r: usize, i: usize| input_f32(r, place(r).send + i);
    match coll {
        Coll::AllReduce => {
            for i in 0..count {
                window[own.send + i] = (0..NRANKS).map(|r| send_element(r, i)).sum();
            }
        }
        Coll::Reduce if rank == ROOT => {
            for i in 0..count {
                window[recv + i] = (0..NRANKS).map(|r| send_element(r, i)).sum();
            }
        }
        Coll::Reduce => {}
        Coll::AllGather => {
            for r in 0..NRANKS {
                for i in 0..count {
                    window[recv + r * count + i] = send_element(r, i);
                }
            }
        }
        Coll::ReduceScatter => {
            for i in 0..count {
                window[recv + i] = (0..NRANKS).map(|r| send_element(r, rank * count + i)).sum();
            }
        }
        Coll::Broadcast => {
            for i in 0..count {
                window[own.send + i] = send_element(ROOT, i);
            }
        }
        Coll::AllToAll => {
            for r in 0..NRANKS {
                for i in 0..count {
                    window[recv + r * count + i] = send_element(r, rank * count + i);
                }
            }
        }
        Coll::Gather if rank == ROOT => {
            for r in 0..NRANKS {
                for i in 0..count {
                    window[recv + r * count + i] = send_element(r, i);
                }
            }
        }
        Coll::Gather => {}
        Coll::Scatter => {
            for i in 0..count {
                window[recv + i] = send_element(ROOT, rank * count + i);
            }
        }
    }
    window
}

/// What one rank saw in a case.
struct Outcome {
    rank: usize,
    /// The matching call was right (exact data).
    agreed_ok: bool,
    /// The mismatched call's result and message.
    result: symmResult_t,
    message: String,
    /// The window was unchanged by the mismatched call.
    untouched: bool,
    /// How long the mismatched call took.
    took: Duration,
}

/// Check the outcomes of every rank of one case.
#[track_caller]
fn check_case(layout: &str, coll: Coll, count: usize, outcomes: &[Outcome]) {
    let case = format!("{layout}, {coll:?} of {count}");
    for o in outcomes {
        assert!(
            o.agreed_ok,
            "{case}: rank {}'s call with symmetric offsets was wrong",
            o.rank
        );
        assert_ne!(
            o.result,
            symmResult_t::symmSuccess,
            "{case}: rank {} returned success for a call whose offsets differ between ranks",
            o.rank
        );
        assert!(
            o.untouched,
            "{case}: rank {}'s window was written by a refused call ({:?}: {})",
            o.rank, o.result, o.message
        );
    }
    assert!(
        outcomes
            .iter()
            .any(|o| o.result == symmResult_t::symmInvalidUsage
                && o.message.contains("window offset")),
        "{case}: no rank was refused naming the offsets: {:?}",
        outcomes
            .iter()
            .map(|o| format!("rank {}: {:?}: {}", o.rank, o.result, o.message))
            .collect::<Vec<_>>()
    );
    let slowest = outcomes.iter().map(|o| o.took).max().unwrap();
    println!("{case}: every rank failed, the slowest after {slowest:?}");
}

/// One rank's part of a case, outside a group: the matching call (checked), then the
/// mismatched one; its outcome. Every rank calls it on its own thread or process.
fn run_rank(comm: symmComm_t, rank: usize, base: *mut u8, coll: Coll, count: usize) -> Outcome {
    let stream = RankStream::new();
    put_f32(base, &fill(rank, count));
    let result = call(coll, comm, base, count, Place::both(1), stream.handle());
    let result = stream.completed(comm, result);
    assert_eq!(result, symmResult_t::symmSuccess, "{}", last_error(comm));
    let window_len = 2 * region(count);
    let agreed_ok = get_f32(base, window_len) == expected(coll, rank, count, |_| Place::both(1));
    put_f32(base, &fill(rank, count));
    let started = Instant::now();
    // On the cuda backend an enqueued call fails once its kernel gave up.
    let result = call(coll, comm, base, count, Place::both(rank), stream.handle());
    let result = stream.completed(comm, result);
    let took = started.elapsed();
    let message = last_error(comm);
    let untouched = get_f32(base, window_len) == fill(rank, count);
    Outcome {
        rank,
        agreed_ok,
        result,
        message,
        untouched,
        took,
    }
}

/// Allocate and register this rank's window (collective: every rank calls it).
fn own_window(comm: symmComm_t, count: usize) -> (*mut u8, symmWindow_t) {
    let (buffer, window) = window_of_bytes(comm, window_bytes(count));
    (buffer.cast(), window)
}

/// Teardown of a failed communicator's rank: deregistration and free may report the failure;
/// destroy must succeed.
fn leave(comm: symmComm_t, base: *mut u8, window: symmWindow_t) {
    let _ = symmCommWindowDeregister(comm, window);
    let _ = symmMemFree(comm, base.cast());
    check(symmCommDestroy(comm), null_mut());
}

fn new_id() -> symmUniqueId {
    use_backend_from_env();
    new_unique_id()
}

/// A thread per rank (`symmGetUniqueId` + `symmCommInitRank`), each making its own calls.
#[test]
fn a_thread_per_rank_refuses_different_offsets_on_every_rank() {
    for coll in COLLS {
        for count in SIZES {
            let id = new_id();
            let outcomes: Vec<Outcome> = std::thread::scope(|scope| {
                let handles: Vec<_> = (0..NRANKS)
                    .map(|rank| {
                        scope.spawn(move || {
                            let mut comm = null_mut();
                            // SAFETY: valid out-pointer.
                            check(
                                unsafe {
                                    symmCommInitRank(&mut comm, NRANKS as i32, id, rank as i32)
                                },
                                null_mut(),
                            );
                            let (base, window) = own_window(comm, count);
                            let outcome = run_rank(comm, rank, base, coll, count);
                            leave(comm, base, window);
                            outcome
                        })
                    })
                    .collect();
                handles.into_iter().map(|h| h.join().unwrap()).collect()
            });
            check_case("a thread per rank", coll, count, &outcomes);
        }
    }
}

/// One thread drives every rank, its calls in a group (`symmCommInitAll`).
#[test]
fn a_group_refuses_different_offsets_on_every_rank() {
    use_backend_from_env();
    for coll in COLLS {
        for count in SIZES {
            let comms = init_all(NRANKS);
            let buffers = alloc_windows(&comms, window_bytes(count));
            let group = |place: &dyn Fn(usize) -> Place| {
                check(symmGroupStart(), null_mut());
                for (rank, b) in buffers.iter().enumerate() {
                    let r = call(coll, b.comm, b.base, count, place(rank), null_mut());
                    assert_eq!(r, symmResult_t::symmSuccess, "{}", last_error(b.comm));
                }
                let result = symmGroupEnd();
                (result, last_error(null_mut()))
            };
            for (rank, b) in buffers.iter().enumerate() {
                put_f32(b.base, &fill(rank, count));
            }
            let (result, message) = group(&|_| Place::both(1));
            assert_eq!(result, symmResult_t::symmSuccess, "{message}");
            let window_len = 2 * region(count);
            let agreed: Vec<bool> = buffers
                .iter()
                .enumerate()
                .map(|(rank, b)| {
                    get_f32(b.base, window_len) == expected(coll, rank, count, |_| Place::both(1))
                })
                .collect();
            for (rank, b) in buffers.iter().enumerate() {
                put_f32(b.base, &fill(rank, count));
            }
            let started = Instant::now();
            let (result, message) = group(&Place::both);
            let took = started.elapsed();
            let outcomes: Vec<Outcome> = buffers
                .iter()
                .enumerate()
                .map(|(rank, b)| Outcome {
                    rank,
                    agreed_ok: agreed[rank],
                    result,
                    message: message.clone(),
                    untouched: get_f32(b.base, window_len) == fill(rank, count),
                    took,
                })
                .collect();
            check_case("a group", coll, count, &outcomes);
            for b in buffers {
                leave(b.comm, b.base, b.window);
            }
        }
    }
}

/// A buffer that no peer's kernel touches may lie anywhere in its rank's windows: an
/// all-gather's and an all-to-all's send buffer (each rank pushes its own), a reduce-scatter's
/// receive buffer (each rank writes its own), a reduce's and a gather's receive buffer (the root
/// writes its own) and a scatter's send buffer (the root reads its own) at a different offset on every
/// rank, the other buffer at the same offset. Exact results, a thread per rank and in a
/// group.
#[test]
fn buffers_no_peer_touches_may_lie_anywhere() {
    use_backend_from_env();
    let cases = [
        (
            Coll::AllGather,
            (|rank| Place {
                send: rank,
                recv: 1,
            }) as fn(usize) -> Place,
        ),
        (Coll::ReduceScatter, |rank| Place {
            send: 1,
            recv: rank,
        }),
        (Coll::AllToAll, |rank| Place {
            send: rank,
            recv: 1,
        }),
        (Coll::Reduce, |rank| Place {
            send: 1,
            recv: rank,
        }),
        (Coll::Gather, |rank| Place {
            send: 1,
            recv: rank,
        }),
        (Coll::Scatter, |rank| Place {
            send: rank,
            recv: 1,
        }),
    ];
    for (coll, place) in cases {
        for count in SIZES {
            let window_len = 2 * region(count);
            // A thread per rank.
            let id = new_id();
            std::thread::scope(|scope| {
                for rank in 0..NRANKS {
                    scope.spawn(move || {
                        let mut comm = null_mut();
                        // SAFETY: valid out-pointer.
                        check(
                            unsafe { symmCommInitRank(&mut comm, NRANKS as i32, id, rank as i32) },
                            null_mut(),
                        );
                        let (base, window) = own_window(comm, count);
                        let stream = RankStream::new();
                        put_f32(base, &fill(rank, count));
                        let result = call(coll, comm, base, count, place(rank), stream.handle());
                        let result = stream.completed(comm, result);
                        assert_eq!(result, symmResult_t::symmSuccess, "{}", last_error(comm));
                        let right = get_f32(base, window_len) == expected(coll, rank, count, place);
                        leave(comm, base, window);
                        assert!(
                            right,
                            "a thread per rank, {coll:?} of {count}: rank {rank} wrong"
                        );
                    });
                }
            });
            // A group.
            let comms = init_all(NRANKS);
            let buffers = alloc_windows(&comms, window_bytes(count));
            for (rank, b) in buffers.iter().enumerate() {
                put_f32(b.base, &fill(rank, count));
            }
            check(symmGroupStart(), null_mut());
            for (rank, b) in buffers.iter().enumerate() {
                let r = call(coll, b.comm, b.base, count, place(rank), null_mut());
                assert_eq!(r, symmResult_t::symmSuccess, "{}", last_error(b.comm));
            }
            check(symmGroupEnd(), null_mut());
            for (rank, b) in buffers.iter().enumerate() {
                assert!(
                    get_f32(b.base, window_len) == expected(coll, rank, count, place),
                    "a group, {coll:?} of {count}: rank {rank} wrong"
                );
            }
            teardown(buffers);
        }
    }
}

/// A process per rank (this binary's `offsets_child_rank`), on one machine.
#[test]
fn a_process_per_rank_refuses_different_offsets_on_every_rank() {
    for coll in COLLS {
        for count in SIZES {
            let id = id_to_hex(&new_id());
            let ranks: Vec<Vec<(String, String)>> = (0..NRANKS)
                .map(|rank| {
                    vec![
                        ("SYMM_TIMEOUT_MS".to_string(), TIMEOUT_MS.to_string()),
                        ("SYMM_BOOTSTRAP_TIMEOUT_MS".to_string(), "60000".to_string()),
                        (
                            CHILD_ENV.to_string(),
                            format!("{},{count},{rank},{id}", coll.name()),
                        ),
                    ]
                })
                .collect();
            let outcomes: Vec<Outcome> =
                run_rank_processes("offsets_child_rank", &ranks, Duration::from_secs(90))
                    .into_iter()
                    .enumerate()
                    .map(|(rank, (ok, log))| {
                        // The child checked its matching call and its window itself.
                        assert!(ok, "rank {rank}:\n{log}");
                        let o = parse_outcome(rank, &log)
                            .unwrap_or_else(|| panic!("rank {rank}: no outcome:\n{log}"));
                        Outcome {
                            rank,
                            agreed_ok: true,
                            result: o.result,
                            message: o.message,
                            untouched: true,
                            took: o.took,
                        }
                    })
                    .collect();
            check_case("a process per rank", coll, count, &outcomes);
        }
    }
}

/// A rank process of [`a_process_per_rank_refuses_different_offsets_on_every_rank`]: checks
/// its matching call and that the mismatched one left its window unchanged, and prints the
/// mismatched call's outcome.
#[test]
#[ignore = "a rank process of the other tests of this file (needs SYMM_OFFSETS_CHILD)"]
fn offsets_child_rank() {
    let spec = std::env::var(CHILD_ENV).expect("run through the other tests of this file");
    let fields: Vec<&str> = spec.split(',').collect();
    let coll = Coll::from_name(fields[0]);
    let count: usize = fields[1].parse().unwrap();
    let rank: usize = fields[2].parse().unwrap();
    let id = id_from_hex(fields[3]);
    use_backend_from_env();
    let mut comm = null_mut();
    // SAFETY: valid out-pointer.
    check(
        unsafe { symmCommInitRank(&mut comm, NRANKS as i32, id, rank as i32) },
        null_mut(),
    );
    let (base, window) = own_window(comm, count);
    let o = run_rank(comm, rank, base, coll, count);
    assert!(o.agreed_ok, "the call with symmetric offsets was wrong");
    assert!(
        o.untouched,
        "the refused call wrote the window ({:?}: {})",
        o.result, o.message
    );
    print_outcome(o.result, o.took, &o.message);
    leave(comm, base, window);
}
