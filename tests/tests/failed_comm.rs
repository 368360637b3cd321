//! What a program gets after something went wrong: once any rank finds that the ranks' calls
//! no longer pair up (a mismatched or refused call, a peer that did not arrive, two threads on
//! one rank), the communicator is failed on every rank, and no call ever returns success with
//! another call's data. Layouts: one thread per rank (`symmCommInitRank`), one thread driving
//! every rank in groups (`symmCommInitAll`); processes are in `processes.rs`. And: the calls of
//! a rank are ordered — a second thread entering a collective on a rank another thread is
//! using is refused, while different communicators stay concurrent.
//!
//! This binary sets `SYMM_TIMEOUT_MS` for itself.

use std::ptr::null_mut;
use std::time::{Duration, Instant};
use symm::*;
use symm_tests::*;

const TIMEOUT_MS: u64 = 1000;

fn configure() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    use_host_backend();
    ONCE.call_once(|| {
        // SAFETY: as in `use_host_backend`: set once, before any communicator is created.
        unsafe { std::env::set_var("SYMM_TIMEOUT_MS", TIMEOUT_MS.to_string()) };
    });
}

fn new_id() -> symmUniqueId {
    let mut id = symmUniqueId {
        internal: [0; SYMM_UNIQUE_ID_BYTES],
    };
    // SAFETY: valid out-pointer.
    check(unsafe { symmGetUniqueId(&mut id) }, null_mut());
    id
}

/// A rank's window, as integers (to cross threads).
#[derive(Clone, Copy)]
struct Rank {
    comm: usize,
    base: usize,
}

impl Rank {
    fn comm(self) -> symmComm_t {
        self.comm as symmComm_t
    }

    fn at(self, bytes: usize) -> *mut u8 {
        (self.base + bytes) as *mut u8
    }

    /// Fill `count` floats at `offset` with `value`.
    fn fill(self, offset: usize, count: usize, value: f32) {
        // SAFETY: host memory of the window, inside it (callers' offsets).
        unsafe { write_f32(self.at(offset), &vec![value; count]) };
    }

    fn read(self, offset: usize, count: usize) -> Vec<f32> {
        // SAFETY: as above.
        unsafe { read_f32(self.at(offset), count) }
    }

    /// In-place all-reduce (sum) of `count` floats at `offset`.
    fn all_reduce(self, offset: usize, count: usize) -> symmResult_t {
        all_reduce_f32_sum(self.comm(), self.at(offset), self.at(offset), count)
    }

    /// Broadcast of `count` floats at `offset` from `root`, in place (`sendbuff` is the
    /// receive buffer on every rank).
    fn broadcast(self, offset: usize, count: usize, root: usize) -> symmResult_t {
        symmBroadcast(
            self.at(offset).cast(),
            self.at(offset).cast(),
            count,
            symmDataType_t::symmFloat32 as i32,
            root as i32,
            self.comm(),
            null_mut(),
        )
    }
}

fn ranks_of(buffers: &[RankBuffer]) -> Vec<Rank> {
    buffers
        .iter()
        .map(|b| Rank {
            comm: b.comm as usize,
            base: b.base as usize,
        })
        .collect()
}

/// Two ranks, one thread each (joined with `symmCommInitRank`), each with a window of
/// `bytes`.
fn two_threads(bytes: usize) -> Vec<RankBuffer> {
    let comms = join_threads(new_id(), 2);
    let handles: Vec<(usize, usize)> = comms
        .iter()
        .map(|c| {
            let comm = *c as usize;
            std::thread::spawn(move || {
                let comm = comm as symmComm_t;
                let mut buffers = alloc(&[comm], bytes);
                register_all(&mut buffers);
                let b = &buffers[0];
                (b.base as usize, b.window as usize)
            })
        })
        .collect::<Vec<_>>()
        .into_iter()
        .map(|h| h.join().unwrap())
        .collect();
    comms
        .iter()
        .zip(handles)
        .map(|(&comm, (base, window))| RankBuffer {
            comm,
            base: base as *mut u8,
            bytes,
            window: window as symmWindow_t,
        })
        .collect()
}

/// Run `work(rank, ranks)` on one thread per rank and collect what each returns.
fn per_rank<T: Send>(ranks: &[Rank], work: impl Fn(usize, Rank) -> T + Sync) -> Vec<T> {
    std::thread::scope(|scope| {
        let work = &work;
        let handles: Vec<_> = ranks
            .iter()
            .enumerate()
            .map(|(r, &rank)| scope.spawn(move || work(r, rank)))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// The new user's report: rank 0 all-reduces 1024 floats, rank 1 only 512 (a thread each).
/// Then rank 1 all-reduces 16 elements of 10·(r+1) and rank 0 does too. Before, rank 1 got
/// `symmSuccess` with 21.0 (its 20 plus rank 0's stale 1.0). Now every call after the
/// mismatch fails on both ranks, naming the cause, and the asynchronous error says so at once.
#[test]
fn a_mismatch_between_threads_fails_the_communicator_on_every_rank() {
    configure();
    let buffers = two_threads(8192);
    let ranks = ranks_of(&buffers);
    let outcomes = per_rank(&ranks, |r, rank| {
        rank.fill(0, 1024, 1.0);
        let count = if r == 0 { 1024 } else { 512 };
        let start = Instant::now();
        let first = rank.all_reduce(0, count);
        let first_message = last_error(rank.comm());
        let first_took = start.elapsed();
        // Rank 1 goes on at once, as the user's program did.
        let status_now = async_error(rank.comm());
        rank.fill(0, 16, 10.0 * (r as f32 + 1.0));
        let second = rank.all_reduce(0, 16);
        let second_message = last_error(rank.comm());
        (
            first,
            first_message,
            first_took,
            status_now,
            second,
            second_message,
            rank.read(0, 16),
        )
    });
    for (r, (first, first_message, took, status, second, second_message, data)) in
        outcomes.iter().enumerate()
    {
        assert_ne!(
            *first,
            symmResult_t::symmSuccess,
            "rank {r}: {first_message}"
        );
        assert!(
            first_message.contains("symmAllReduce of 1024") && first_message.contains("of 512"),
            "rank {r}: {first_message}"
        );
        // The launched rank is woken by the refusing one, not by its own timeout.
        assert!(
            *took < Duration::from_millis(TIMEOUT_MS),
            "rank {r} waited {took:?}"
        );
        assert_ne!(*status, symmResult_t::symmSuccess, "rank {r}");
        assert_ne!(
            *second,
            symmResult_t::symmSuccess,
            "rank {r}'s next call succeeded with {data:?}"
        );
        assert!(
            second_message.contains("the communicator has failed"),
            "rank {r}: {second_message}"
        );
    }
    // The refused rank is told it was refused; the launched one that another rank failed it.
    let codes: Vec<_> = outcomes.iter().map(|o| o.0).collect();
    assert!(
        codes.contains(&symmResult_t::symmInvalidUsage)
            && codes.contains(&symmResult_t::symmRemoteError),
        "{codes:?}"
    );
    teardown(buffers);
}

/// A rank whose call is refused for a bad argument (here: beyond its window) while its peer
/// made the call: the refusal is still that rank's call, so its next call never pairs with
/// the peer's stale one; the communicator fails on both. Ranks that all refuse the same call
/// stay in step and go on.
#[test]
fn a_call_refused_on_one_rank_is_still_its_call() {
    configure();
    let buffers = two_threads(4096);
    let ranks = ranks_of(&buffers);
    // Every rank refuses the same call: nobody is out of step.
    let refused = per_rank(&ranks, |_, rank| rank.all_reduce(0, 5000));
    assert!(
        refused
            .iter()
            .all(|r| *r == symmResult_t::symmInvalidArgument)
    );
    let sums = per_rank(&ranks, |r, rank| {
        rank.fill(0, 64, r as f32 + 1.0);
        (rank.all_reduce(0, 64), rank.read(0, 64))
    });
    for (result, data) in &sums {
        assert_eq!(*result, symmResult_t::symmSuccess);
        assert_eq!(data, &vec![3.0; 64]);
    }
    // Only rank 1 refuses: then nothing pairs wrongly.
    let outcomes = per_rank(&ranks, |r, rank| {
        rank.fill(0, 64, r as f32 + 1.0);
        let first = if r == 0 {
            rank.all_reduce(0, 64)
        } else {
            rank.all_reduce(4000, 64)
        };
        rank.fill(0, 64, 10.0 * (r as f32 + 1.0));
        let second = rank.all_reduce(0, 64);
        (first, second, rank.read(0, 64), last_error(rank.comm()))
    });
    assert_eq!(outcomes[1].0, symmResult_t::symmInvalidArgument);
    for (r, (first, second, data, message)) in outcomes.iter().enumerate() {
        if *first == symmResult_t::symmSuccess || *second == symmResult_t::symmSuccess {
            // Only a correct pairing may succeed.
            assert_eq!(data, &vec![30.0; 64], "rank {r}: {message}");
        }
        assert_ne!(*second, symmResult_t::symmSuccess, "rank {r}: {data:?}");
        assert_ne!(async_error(ranks[r].comm()), symmResult_t::symmSuccess);
    }
    teardown(buffers);
}

/// Two threads' ranks broadcast with different roots (each names itself, so each would push
/// its data into the other), or from one root with different counts: never success with
/// wrong data. Each call fails naming both calls, nothing is exchanged (each buffer keeps its
/// own data), and the next call fails on both ranks (the communicator has failed).
#[test]
fn broadcasts_that_disagree_on_root_or_count_fail_the_communicator_on_every_rank() {
    configure();
    for (roots, counts, names) in [
        ([0, 1], [64, 64], ["from root 0", "from root 1"]),
        ([1, 0], [64, 64], ["from root 1", "from root 0"]),
        (
            [1, 1],
            [64, 32],
            ["symmBroadcast of 64", "symmBroadcast of 32"],
        ),
    ] {
        let buffers = two_threads(4096);
        let ranks = ranks_of(&buffers);
        let outcomes = per_rank(&ranks, |r, rank| {
            rank.fill(0, 64, r as f32 + 1.0);
            let first = rank.broadcast(0, counts[r], roots[r]);
            let first_message = last_error(rank.comm());
            let data = rank.read(0, 64);
            let second = rank.broadcast(0, 16, 0);
            (first, first_message, data, second, last_error(rank.comm()))
        });
        let case = format!("roots {roots:?}, counts {counts:?}");
        for (r, (first, first_message, data, second, second_message)) in outcomes.iter().enumerate()
        {
            assert_ne!(
                *first,
                symmResult_t::symmSuccess,
                "{case}: rank {r}: {data:?}"
            );
            assert!(
                names.iter().all(|n| first_message.contains(n)),
                "{case}: rank {r}: {first_message}"
            );
            assert_eq!(data, &vec![r as f32 + 1.0; 64], "{case}: rank {r} got data");
            assert_ne!(*second, symmResult_t::symmSuccess, "{case}: rank {r}");
            assert!(
                second_message.contains("the communicator has failed"),
                "{case}: rank {r}: {second_message}"
            );
            assert_ne!(async_error(ranks[r].comm()), symmResult_t::symmSuccess);
        }
        teardown(buffers);
    }
}

/// One thread driving both ranks in a group whose broadcasts disagree on the root:
/// `symmGroupEnd` refuses the group naming both roots, nothing runs, and the communicator
/// stays usable (the ranks refused the same call): an agreeing broadcast then works.
#[test]
fn a_group_whose_broadcasts_disagree_on_the_root_is_refused_whole() {
    configure();
    let comms = init_all(2);
    let buffers = alloc_windows(&comms, 4096);
    let ranks = ranks_of(&buffers);
    check(symmGroupStart(), null_mut());
    for (r, rank) in ranks.iter().enumerate() {
        rank.fill(0, 16, r as f32 + 1.0);
        check(rank.broadcast(0, 16, r), rank.comm());
    }
    let end = symmGroupEnd();
    let message = last_error(null_mut());
    assert_eq!(end, symmResult_t::symmInvalidUsage, "{message}");
    assert!(
        message.contains("root 0 vs 1") && message.contains("nothing of this group was launched"),
        "{message}"
    );
    for (r, rank) in ranks.iter().enumerate() {
        assert_eq!(rank.read(0, 16), vec![r as f32 + 1.0; 16]);
        assert_eq!(async_error(rank.comm()), symmResult_t::symmSuccess);
    }
    check(symmGroupStart(), null_mut());
    for rank in &ranks {
        check(rank.broadcast(0, 16, 1), rank.comm());
    }
    check(symmGroupEnd(), null_mut());
    for rank in &ranks {
        assert_eq!(rank.read(0, 16), vec![2.0; 16]);
    }
    teardown(buffers);
}

/// A count of 0 is a call too: rank 0 all-reduces nothing where rank 1 all-reduces 64
/// floats; rank 0's next call must not pair with rank 1's first.
#[test]
fn a_count_of_zero_against_a_real_count_is_a_mismatch() {
    configure();
    let buffers = two_threads(4096);
    let ranks = ranks_of(&buffers);
    let outcomes = per_rank(&ranks, |r, rank| {
        rank.fill(0, 64, r as f32 + 1.0);
        let first = rank.all_reduce(0, if r == 0 { 0 } else { 64 });
        let first_data = rank.read(0, 64);
        rank.fill(0, 64, 10.0 * (r as f32 + 1.0));
        let second = if r == 0 {
            rank.all_reduce(0, 64)
        } else {
            symmResult_t::symmInvalidUsage
        };
        (first, first_data, second, rank.read(0, 64))
    });
    // Rank 1's first call pairs with nothing: it fails (never 11.0 = its 1 + rank 0's 10).
    assert_ne!(
        outcomes[1].0,
        symmResult_t::symmSuccess,
        "{:?}",
        outcomes[1].1
    );
    assert_ne!(
        outcomes[0].2,
        symmResult_t::symmSuccess,
        "{:?}",
        outcomes[0].3
    );
    teardown(buffers);
}

/// The report's second case, one thread driving both ranks: inside a group rank 0's
/// all-reduce is valid and rank 1's overruns its window. The whole group is refused before
/// anything is launched (the thread saw every rank's call), `symmGroupEnd` returns the bad
/// argument's error at once, and the communicator stays usable: the next grouped all-reduce
/// gives 30.0 on both ranks.
#[test]
fn a_bad_call_in_a_group_refuses_the_group_and_keeps_the_communicator() {
    configure();
    let comms = init_all(2);
    let buffers = alloc_windows(&comms, 4096);
    let ranks = ranks_of(&buffers);
    check(symmGroupStart(), null_mut());
    ranks[0].fill(0, 16, 1.0);
    ranks[1].fill(0, 16, 2.0);
    check(ranks[0].all_reduce(0, 16), ranks[0].comm());
    assert_eq!(
        ranks[1].all_reduce(4090, 16),
        symmResult_t::symmInvalidArgument
    );
    let message = last_error(ranks[1].comm());
    assert!(message.contains("overruns its end by"), "{message}");
    let start = Instant::now();
    let end = symmGroupEnd();
    let group_message = last_error(null_mut());
    assert_eq!(end, symmResult_t::symmInvalidArgument, "{group_message}");
    assert!(
        group_message.contains("nothing of this group was launched"),
        "{group_message}"
    );
    assert!(start.elapsed() < Duration::from_millis(TIMEOUT_MS / 2));
    // Nothing ran.
    assert_eq!(ranks[0].read(0, 16), vec![1.0; 16]);
    for rank in &ranks {
        assert_eq!(async_error(rank.comm()), symmResult_t::symmSuccess);
    }
    check(symmGroupStart(), null_mut());
    for (r, rank) in ranks.iter().enumerate() {
        rank.fill(0, 16, 10.0 * (r as f32 + 1.0));
        check(rank.all_reduce(0, 16), rank.comm());
    }
    check(symmGroupEnd(), null_mut());
    for rank in &ranks {
        assert_eq!(rank.read(0, 16), vec![30.0; 16]);
    }
    teardown(buffers);
}

/// One thread driving both ranks, and a group that holds only rank 0's call times out: rank
/// 1's next grouped call must not return its own data unreduced (the report: 20.0 where 30.0
/// is right); both ranks report the failure.
#[test]
fn a_timed_out_group_fails_both_ranks() {
    configure();
    let comms = init_all(2);
    let buffers = alloc_windows(&comms, 4096);
    let ranks = ranks_of(&buffers);
    // Rank 0 alone in a group: it waits for rank 1, which never comes.
    check(symmGroupStart(), null_mut());
    check(ranks[0].all_reduce(0, 16), ranks[0].comm());
    let end = symmGroupEnd();
    assert_eq!(end, symmResult_t::symmTimeout, "{}", last_error(null_mut()));
    // Then both ranks in a group: refused on both, never rank 1's 20.0 unreduced.
    check(symmGroupStart(), null_mut());
    for (r, rank) in ranks.iter().enumerate() {
        rank.fill(0, 16, 10.0 * (r as f32 + 1.0));
        let call = rank.all_reduce(0, 16);
        assert_ne!(call, symmResult_t::symmSuccess, "rank {r}");
    }
    let end = symmGroupEnd();
    assert_ne!(end, symmResult_t::symmSuccess, "{:?}", ranks[1].read(0, 16));
    assert_eq!(async_error(ranks[0].comm()), symmResult_t::symmTimeout);
    assert_eq!(async_error(ranks[1].comm()), symmResult_t::symmRemoteError);
    teardown(buffers);
}

/// Issue scenario: two threads of rank 0 start all-reduces on one communicator at the same
/// moment (region A with n elements, region B with 2n) while rank 1 calls A then B. Whatever
/// the interleaving, no call returns success with a wrong result; a call that finds another
/// thread's call in progress on its rank is refused, naming both calls.
#[test]
fn two_threads_on_one_rank_never_pair_wrongly() {
    configure();
    let mut refused_seen = false;
    let mut rounds = 0;
    for n in [1024usize, 4096, 16 * 1024, 64 * 1024] {
        for round in 0..6 {
            rounds += 1;
            let buffers = two_threads(4 * 3 * n * 4);
            let ranks = ranks_of(&buffers);
            let (a, b) = (0usize, 4 * n); // region A: n floats; B: 2n floats after it
            let value = |r: usize, region: usize| (100 * (r + 1) + 10 * region + round) as f32;
            for (r, rank) in ranks.iter().enumerate() {
                rank.fill(a, n, value(r, 1));
                rank.fill(b, 2 * n, value(r, 2));
            }
            let want = |region: usize| value(0, region) + value(1, region);
            let barrier = std::sync::Barrier::new(3);
            let results: Vec<(usize, usize, symmResult_t, Vec<f32>, String)> =
                std::thread::scope(|scope| {
                    let barrier = &barrier;
                    let mut handles = Vec::new();
                    for (region, offset, count) in [(1, a, n), (2, b, 2 * n)] {
                        let rank = ranks[0];
                        handles.push(scope.spawn(move || {
                            barrier.wait();
                            let result = rank.all_reduce(offset, count);
                            (
                                0,
                                region,
                                result,
                                rank.read(offset, count),
                                last_error(rank.comm()),
                            )
                        }));
                    }
                    let rank = ranks[1];
                    let peer = scope.spawn(move || {
                        barrier.wait();
                        let mut out = Vec::new();
                        for (region, offset, count) in [(1, a, n), (2, b, 2 * n)] {
                            let result = rank.all_reduce(offset, count);
                            out.push((
                                1,
                                region,
                                result,
                                rank.read(offset, count),
                                last_error(rank.comm()),
                            ));
                        }
                        out
                    });
                    let mut all: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
                    all.extend(peer.join().unwrap());
                    all
                });
            for (r, region, result, data, message) in &results {
                if *result == symmResult_t::symmSuccess {
                    assert!(
                        data.iter().all(|x| *x == want(*region)),
                        "n {n} round {round}: rank {r}'s region {region} returned success with \
                         {} where {} is right",
                        data.iter().find(|x| **x != want(*region)).unwrap(),
                        want(*region)
                    );
                } else if message.starts_with("symmAllReduce: comm is in use by another thread") {
                    refused_seen = true;
                    assert_eq!(*result, symmResult_t::symmInvalidUsage, "{message}");
                    assert!(
                        message.contains("symmAllReduce of")
                            && message.matches("symmAllReduce").count() >= 2,
                        "{message}"
                    );
                }
            }
            teardown(buffers);
        }
    }
    // On the host backend a call is in progress for its whole run, so the two threads of
    // rank 0 overlap in most rounds.
    assert!(refused_seen, "no call was refused in {rounds} rounds");
}

/// Threads on different communicators stay concurrent: while a rank of communicator X waits
/// for its late peer, a rank of communicator Y on another thread completes calls.
#[test]
fn different_communicators_stay_concurrent() {
    configure();
    let x = two_threads(4096);
    let y = two_threads(4096);
    let (xr, yr) = (ranks_of(&x), ranks_of(&y));
    let (x0, x1) = (xr[0], xr[1]);
    let late = Duration::from_millis(TIMEOUT_MS / 2);
    std::thread::scope(|scope| {
        let waiting = scope.spawn(move || {
            let start = Instant::now();
            let result = x0.all_reduce(0, 64);
            (result, start.elapsed())
        });
        let peer = scope.spawn(move || {
            std::thread::sleep(late);
            x1.all_reduce(0, 64)
        });
        // Meanwhile communicator Y runs calls to completion.
        let start = Instant::now();
        for _ in 0..3 {
            let done = per_rank(&yr, |_, rank| rank.all_reduce(0, 64));
            assert!(done.iter().all(|r| *r == symmResult_t::symmSuccess));
        }
        assert!(
            start.elapsed() < late,
            "communicator Y waited for X: {:?}",
            start.elapsed()
        );
        let (result, took) = waiting.join().unwrap();
        assert_eq!(result, symmResult_t::symmSuccess);
        assert!(took >= late);
        assert_eq!(peer.join().unwrap(), symmResult_t::symmSuccess);
    });
    teardown(x);
    teardown(y);
}

/// Regression (found in review): a rank far ahead of a lagging peer in the same process —
/// count-0 calls launch nothing, so rank 0 makes thousands of them before rank 1 makes its
/// first call. The call log cannot keep every number; the lagging rank's call must then fail,
/// never pair unchecked with rank 0's latest (both returned success with 3.0 before).
#[test]
fn a_rank_far_ahead_never_pairs_with_a_lagging_peer_unchecked() {
    configure();
    let buffers = two_threads(4096);
    let ranks = ranks_of(&buffers);
    let ahead = std::sync::Barrier::new(2);
    let outcomes = per_rank(&ranks, |r, rank| {
        rank.fill(0, 64, r as f32 + 1.0);
        if r == 0 {
            for _ in 0..5000 {
                assert_eq!(rank.all_reduce(0, 0), symmResult_t::symmSuccess);
            }
            ahead.wait();
        } else {
            ahead.wait();
        }
        (rank.all_reduce(0, 64), rank.read(0, 64))
    });
    for (r, (result, data)) in outcomes.iter().enumerate() {
        assert_ne!(*result, symmResult_t::symmSuccess, "rank {r}: {data:?}");
    }
    teardown(buffers);
}
