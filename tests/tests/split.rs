//! `symmCommSplit`, NCCL's semantics, in every layout: ranks of `symmCommInitAll` driven by a
//! thread each and by one thread in a group, ranks of `symmCommInitRank` on threads, and one
//! process per rank. Four ranks split into two halves, ordered by a key that reverses them;
//! the halves run different collectives at once on their new communicators, checked exactly
//! against an f64 reference; the parent still works afterwards; a rank with
//! `SYMM_SPLIT_NOCOLOR` gets NULL; bad arguments are refused with the argument named.
//!
//! On the host backend by default; with `SYMM_BACKEND=cuda` on the cuda backend (the rank
//! processes inherit it; the simulated GPU runs every layout in `cargo xtask sim --test`).

use std::ffi::c_void;
use std::ptr::null_mut;
use std::time::Duration;
use symm::*;
use symm_tests::*;

const NRANKS: usize = 4;
/// Elements each rank contributes.
const COUNT: usize = 1000;
/// The environment variable that makes a test process one rank of `split_child_rank`.
const CHILD_ENV: &str = "SYMM_SPLIT_CHILD";

/// A handle that may cross threads (the library looks every handle up).
#[derive(Clone, Copy)]
struct Handle(symmComm_t);
// SAFETY: the library looks a handle up in its table of live communicators on every call.
unsafe impl Send for Handle {}

/// Rank `rank`'s color and key: even and odd ranks split apart, each half in reverse order.
fn color_key(rank: usize) -> (i32, i32) {
    ((rank % 2) as i32, (NRANKS - rank) as i32)
}

/// Rank `rank`'s values.
fn values(rank: usize) -> Vec<f32> {
    (0..COUNT)
        .map(|i| ((rank + 1) * 3 + i % 17) as f32)
        .collect()
}

/// The parent ranks of rank `rank`'s half, in new-rank order.
fn half_of(rank: usize) -> Vec<usize> {
    let mut members: Vec<usize> = (0..NRANKS).filter(|r| r % 2 == rank % 2).collect();
    members.sort_by_key(|&r| color_key(r).1);
    members
}

/// The new communicator's count and rank are NCCL's.
fn check_shape(child: symmComm_t, rank: usize) {
    assert!(!child.is_null(), "rank {rank}: no new communicator");
    let (mut count, mut new_rank) = (0, 0);
    // SAFETY: valid out-pointers.
    unsafe {
        check(symmCommCount(child, &mut count), child);
        check(symmCommUserRank(child, &mut new_rank), child);
    }
    let members = half_of(rank);
    assert_eq!(count as usize, members.len(), "rank {rank}: size");
    assert_eq!(
        members[new_rank as usize], rank,
        "rank {rank}: new rank {new_rank} is not ordered by key"
    );
}

/// What one rank's half computes (even half: a sum all-reduce, odd half: an all-gather), and
/// the exact expected result, from f64.
fn expected(rank: usize) -> Vec<f32> {
    let members = half_of(rank);
    if rank.is_multiple_of(2) {
        (0..COUNT)
            .map(|i| members.iter().map(|&r| values(r)[i] as f64).sum::<f64>() as f32)
            .collect()
    } else {
        members.iter().flat_map(|&r| values(r)).collect()
    }
}

/// Issue this rank's half's collective on its window (`base`: room for the all-gather), on
/// `stream`.
fn issue(child: symmComm_t, rank: usize, base: *mut c_void, stream: symmStream_t) -> symmResult_t {
    let bytes = COUNT * 4;
    if rank.is_multiple_of(2) {
        symmAllReduce(
            base,
            base,
            COUNT,
            symmDataType_t::symmFloat32 as i32,
            symmRedOp_t::symmSum as i32,
            child,
            stream,
        )
    } else {
        let mut new_rank = 0;
        // SAFETY: valid out-pointer.
        check(unsafe { symmCommUserRank(child, &mut new_rank) }, child);
        // SAFETY: in bounds of the window of `members * COUNT` elements.
        let own = unsafe { base.cast::<u8>().add(new_rank as usize * bytes) };
        symmAllGather(
            own.cast(),
            base,
            COUNT,
            symmDataType_t::symmFloat32 as i32,
            child,
            stream,
        )
    }
}

/// Fill this rank's part of its window with its values, in `stream`'s order.
fn fill(child: symmComm_t, rank: usize, base: *mut c_void, stream: &RankStream) {
    let mut new_rank = 0;
    // SAFETY: valid out-pointer.
    check(unsafe { symmCommUserRank(child, &mut new_rank) }, child);
    let at = if rank.is_multiple_of(2) {
        0
    } else {
        new_rank as usize * COUNT * 4
    };
    // SAFETY: within the window.
    stream.put_f32(unsafe { base.cast::<u8>().add(at) }, &values(rank));
}

/// Window bytes of every half (the all-gather's result).
fn window_bytes() -> usize {
    NRANKS / 2 * COUNT * 4
}

/// One rank's whole part, on a thread or process of its own: split, check the shape, run the
/// half's collective three times (refilled each time) and check it exactly, then an
/// all-reduce on the parent, then free.
fn rank_part(parent: symmComm_t, rank: usize) {
    let (color, key) = color_key(rank);
    let mut child = null_mut();
    // SAFETY: valid out-pointer; NULL config.
    check(
        unsafe { symmCommSplit(parent, color, key, &mut child, std::ptr::null()) },
        parent,
    );
    check_shape(child, rank);
    let (base, window) = window_of_bytes(child, window_bytes());
    let stream = RankStream::new();
    for round in 0..3 {
        fill(child, rank, base, &stream);
        let result = issue(child, rank, base, stream.handle());
        check(stream.completed(child, result), child);
        let got = stream.get_f32(base.cast(), expected(rank).len());
        assert_eq!(got, expected(rank), "rank {rank}, round {round}");
    }
    check(symmCommWindowDeregister(child, window), child);
    check(symmMemFree(child, base), child);
    check(symmCommDestroy(child), null_mut());
    // The parent still works.
    let (base, window) = window_of_bytes(parent, COUNT * 4);
    stream.put_f32(base.cast(), &values(rank));
    let result = symmAllReduce(
        base,
        base,
        COUNT,
        symmDataType_t::symmFloat32 as i32,
        symmRedOp_t::symmSum as i32,
        parent,
        stream.handle(),
    );
    check(stream.completed(parent, result), parent);
    let sum: Vec<f32> = (0..COUNT)
        .map(|i| (0..NRANKS).map(|r| values(r)[i] as f64).sum::<f64>() as f32)
        .collect();
    assert_eq!(
        stream.get_f32(base.cast(), COUNT),
        sum,
        "rank {rank}: parent"
    );
    check(symmCommWindowDeregister(parent, window), parent);
    check(symmMemFree(parent, base), parent);
}

fn on_threads(comms: Vec<symmComm_t>) {
    on_rank_threads(&comms, |rank, comm| rank_part(comm, rank));
    for comm in comms {
        check(symmCommDestroy(comm), null_mut());
    }
}

#[test]
fn split_of_init_all_ranks_on_a_thread_each() {
    use_backend_from_env();
    on_threads(init_all(NRANKS));
}

#[test]
fn split_of_init_rank_ranks_on_a_thread_each() {
    use_backend_from_env();
    on_threads(join_threads(new_unique_id(), NRANKS));
}

/// One thread drives every rank: the splits in a group (the group's end sets every new
/// handle), then registration and the two halves' collectives in groups.
#[test]
fn split_of_every_rank_by_one_thread_in_a_group() {
    use_backend_from_env();
    let parents = init_all(NRANKS);
    let mut children = vec![null_mut(); NRANKS];
    check(symmGroupStart(), null_mut());
    for (rank, (&parent, child)) in parents.iter().zip(children.iter_mut()).enumerate() {
        let (color, key) = color_key(rank);
        // SAFETY: `child` outlives the group.
        check(
            unsafe { symmCommSplit(parent, color, key, child, std::ptr::null()) },
            parent,
        );
    }
    check(symmGroupEnd(), null_mut());
    for (rank, &child) in children.iter().enumerate() {
        check_shape(child, rank);
    }
    let mut buffers = alloc(&children, window_bytes());
    check(symmGroupStart(), null_mut());
    register_in_group(&mut buffers);
    check(symmGroupEnd(), null_mut());
    let stream = RankStream::new();
    for (rank, b) in buffers.iter().enumerate() {
        fill(b.comm, rank, b.base.cast(), &stream);
    }
    check(symmGroupStart(), null_mut());
    for (rank, b) in buffers.iter().enumerate() {
        check(issue(b.comm, rank, b.base.cast(), null_mut()), b.comm);
    }
    check(symmGroupEnd(), null_mut());
    for (rank, b) in buffers.iter().enumerate() {
        let got = get_f32(b.base.cast(), expected(rank).len());
        assert_eq!(got, expected(rank), "rank {rank}");
    }
    teardown(buffers);
    for comm in parents {
        check(symmCommDestroy(comm), null_mut());
    }
}

/// One process per rank: each splits, runs its half's collective, then the parent's.
#[test]
fn split_of_a_process_per_rank() {
    let id = new_unique_id();
    let ranks: Vec<Vec<(String, String)>> = (0..NRANKS)
        .map(|rank| vec![(CHILD_ENV.to_string(), format!("{rank},{}", id_to_hex(&id)))])
        .collect();
    for (rank, (ok, log)) in run_rank_processes("split_child_rank", &ranks, Duration::from_secs(90))
        .into_iter()
        .enumerate()
    {
        assert!(ok, "rank {rank} failed:\n{log}");
        assert!(log.contains("split rank done"), "rank {rank}:\n{log}");
    }
}

#[test]
#[ignore = "a rank process of split_of_a_process_per_rank (needs SYMM_SPLIT_CHILD)"]
fn split_child_rank() {
    let spec = std::env::var(CHILD_ENV).expect("run through split_of_a_process_per_rank");
    let (rank, id) = spec.split_once(',').unwrap();
    let rank: usize = rank.parse().unwrap();
    use_backend_from_env();
    let mut parent = null_mut();
    // SAFETY: valid out-pointer.
    check(
        unsafe { symmCommInitRank(&mut parent, NRANKS as i32, id_from_hex(id), rank as i32) },
        null_mut(),
    );
    rank_part(parent, rank);
    check(symmCommDestroy(parent), null_mut());
    println!("split rank done");
}

/// A rank with `SYMM_SPLIT_NOCOLOR` gets NULL; the others form one communicator ordered by
/// parent rank (equal keys).
#[test]
fn a_rank_without_a_color_gets_no_communicator() {
    use_backend_from_env();
    let parents = init_all(3);
    let mut children = [null_mut(); 3];
    check(symmGroupStart(), null_mut());
    for (rank, (&parent, child)) in parents.iter().zip(children.iter_mut()).enumerate() {
        let color = if rank == 1 { SYMM_SPLIT_NOCOLOR } else { 7 };
        *child = 1 as symmComm_t; // overwritten with NULL for no color
        // SAFETY: `child` outlives the group.
        check(
            unsafe { symmCommSplit(parent, color, 0, child, std::ptr::null()) },
            parent,
        );
    }
    check(symmGroupEnd(), null_mut());
    assert!(children[1].is_null());
    for (rank, expected) in [(0usize, 0), (2, 1)] {
        let (mut count, mut new_rank) = (0, 0);
        // SAFETY: valid out-pointers.
        unsafe {
            check(symmCommCount(children[rank], &mut count), children[rank]);
            check(
                symmCommUserRank(children[rank], &mut new_rank),
                children[rank],
            );
        }
        assert_eq!((count, new_rank), (2, expected), "rank {rank}");
    }
    for comm in [children[0], children[2]].into_iter().chain(parents) {
        check(symmCommDestroy(comm), null_mut());
    }
}

/// Bad arguments are refused, naming the argument, on the rank that passed them (at the call,
/// inside a group too) and on its peer (at the group's end, naming the rank); nothing is made,
/// and the parent stays usable: the splits stay in step (a split afterwards works).
#[test]
fn bad_split_arguments_are_refused_by_name() {
    use_backend_from_env();
    let parents = init_all(2);
    let mut config = default_config();
    let bad_magic = symmConfig_t { magic: 0, ..config };
    let non_blocking = symmConfig_t {
        blocking: 0,
        ..config
    };
    let crossed = symmConfig_t {
        minCTAs: 4,
        maxCTAs: 2,
        ..config
    };
    let cases: [(i32, bool, &symmConfig_t, &str); 5] = [
        (-5, true, &config, "color = -5"),
        (0, false, &config, "newcomm is NULL"),
        (0, true, &bad_magic, "SYMM_CONFIG_INITIALIZER"),
        (0, true, &non_blocking, "config->blocking"),
        (0, true, &crossed, "config->minCTAs"),
    ];
    for (color, with_out, bad, needle) in cases {
        let mut children = [null_mut(); 2];
        check(symmGroupStart(), null_mut());
        let [first, second] = &mut children;
        let out: *mut symmComm_t = if with_out { first } else { null_mut() };
        // SAFETY: valid or deliberately NULL out-pointers that outlive the group; the
        // configurations live on the stack.
        let refused = unsafe { symmCommSplit(parents[0], color, 0, out, bad) };
        assert_eq!(refused, symmResult_t::symmInvalidArgument, "{needle}");
        let message = last_error(parents[0]);
        assert!(message.contains(needle), "{needle}: {message}");
        // SAFETY: as above.
        check(
            unsafe { symmCommSplit(parents[1], 0, 0, second, &config) },
            parents[1],
        );
        // The group's own refusal, not its echo on the peer.
        assert_eq!(
            symmGroupEnd(),
            symmResult_t::symmInvalidArgument,
            "{needle}"
        );
        let message = last_error(parents[1]);
        assert!(
            message.contains("rank 0 refused its split") && message.contains(needle),
            "{needle}: {message}"
        );
        assert_eq!(
            children,
            [null_mut(); 2],
            "{needle}: a refused split made a communicator"
        );
    }
    // Still usable: a split with a configuration of one block per rank.
    let mut children = [null_mut(); 2];
    config.maxCTAs = 1;
    check(symmGroupStart(), null_mut());
    for (rank, child) in children.iter_mut().enumerate() {
        // SAFETY: `child` outlives the group; the config lives on the stack.
        check(
            unsafe { symmCommSplit(parents[rank], 0, 0, child, &config) },
            parents[rank],
        );
    }
    check(symmGroupEnd(), null_mut());
    for comm in children.into_iter().chain(parents) {
        assert!(!comm.is_null());
        check(symmCommDestroy(comm), null_mut());
    }
}

/// `SYMM_CONFIG_INITIALIZER`'s values.
fn default_config() -> symmConfig_t {
    symmConfig_t {
        size: std::mem::size_of::<symmConfig_t>(),
        magic: SYMM_CONFIG_MAGIC,
        version: SYMM_VERSION_CODE as u32,
        blocking: SYMM_CONFIG_UNDEF_INT,
        minCTAs: SYMM_CONFIG_UNDEF_INT,
        maxCTAs: SYMM_CONFIG_UNDEF_INT,
    }
}

/// The sum over the ranks of `children` (ranks of new communicators, driven by this thread)
/// of the parent rank each stands for: tells which parent ranks a new communicator holds.
fn sums_of_parent_ranks(children: &[symmComm_t]) -> Vec<f32> {
    let mut buffers = alloc(children, 16);
    check(symmGroupStart(), null_mut());
    register_in_group(&mut buffers);
    check(symmGroupEnd(), null_mut());
    // One thread drives every rank, on the legacy stream: the context-wide copies are in
    // order with the group's launches.
    for (rank, b) in buffers.iter().enumerate() {
        put_f32(b.base, &[rank as f32; 4]);
    }
    check(symmGroupStart(), null_mut());
    for b in &buffers {
        check(
            symmAllReduce(
                b.base.cast(),
                b.base.cast(),
                4,
                symmDataType_t::symmFloat32 as i32,
                symmRedOp_t::symmSum as i32,
                b.comm,
                null_mut(),
            ),
            b.comm,
        );
    }
    check(symmGroupEnd(), null_mut());
    let sums = buffers.iter().map(|b| get_f32(b.base, 1)[0]).collect();
    teardown(buffers);
    sums
}

/// Two splits of every rank in one group pair with the peers' in call order: by parity, then
/// by halves, each new communicator holding the ranks its colors say.
#[test]
fn two_splits_in_one_group_keep_their_order() {
    use_backend_from_env();
    let parents = init_all(NRANKS);
    let mut by_parity = [null_mut(); NRANKS];
    let mut by_half = [null_mut(); NRANKS];
    check(symmGroupStart(), null_mut());
    for rank in 0..NRANKS {
        // SAFETY: both outlive the group; NULL configs.
        unsafe {
            check(
                symmCommSplit(
                    parents[rank],
                    (rank % 2) as i32,
                    0,
                    &mut by_parity[rank],
                    std::ptr::null(),
                ),
                parents[rank],
            );
            check(
                symmCommSplit(
                    parents[rank],
                    (rank / 2) as i32,
                    0,
                    &mut by_half[rank],
                    std::ptr::null(),
                ),
                parents[rank],
            );
        }
    }
    check(symmGroupEnd(), null_mut());
    // Each rank's value is its parent rank: parity {0, 2} and {1, 3}, halves {0, 1}, {2, 3}.
    assert_eq!(sums_of_parent_ranks(&by_parity), [2.0, 4.0, 2.0, 4.0]);
    assert_eq!(sums_of_parent_ranks(&by_half), [1.0, 1.0, 5.0, 5.0]);
    for comm in parents {
        check(symmCommDestroy(comm), null_mut());
    }
}

/// One rank's refused split (a bad color) reaches every rank at once, naming it, not at the
/// timeout; then every rank splits again, correctly.
#[test]
fn a_refused_split_fails_every_rank_at_once_and_a_retry_works() {
    use_backend_from_env();
    // SAFETY: set before this test's communicators are made (each test file is one process;
    // the other tests of this file do not depend on the bound).
    unsafe { std::env::set_var("SYMM_TIMEOUT_MS", "20000") };
    let comms = join_threads(new_unique_id(), 3);
    let outcomes = on_rank_threads(&comms, |rank, comm| {
        let mut child = null_mut();
        let color = if rank == 1 { -5 } else { 0 };
        let started = std::time::Instant::now();
        // SAFETY: valid out-pointer; NULL config.
        let result = unsafe { symmCommSplit(comm, color, 0, &mut child, std::ptr::null()) };
        let took = started.elapsed();
        let message = last_error(comm);
        assert!(child.is_null(), "rank {rank}: a failed split set newcomm");
        // SAFETY: as above.
        let retry = unsafe { symmCommSplit(comm, 0, 0, &mut child, std::ptr::null()) };
        check(retry, comm);
        check(symmCommDestroy(child), null_mut());
        (result, took, message)
    });
    for (rank, (result, took, message)) in outcomes.into_iter().enumerate() {
        assert!(took < Duration::from_secs(5), "rank {rank} took {took:?}");
        if rank == 1 {
            assert_eq!(result, symmResult_t::symmInvalidArgument, "{message}");
            assert!(message.contains("color = -5"), "{message}");
        } else {
            assert_eq!(result, symmResult_t::symmRemoteError, "{message}");
            assert!(
                message.contains("rank 1 refused its split") && message.contains("color = -5"),
                "{message}"
            );
        }
    }
    for comm in comms {
        check(symmCommDestroy(comm), null_mut());
    }
}

/// Recovery without a new unique id: rank 2 hangs (never makes the all-reduce that ranks 0
/// and 1 wait in); a watchdog revokes rank 0, which ends both waits at once; every rank
/// revokes; collectives are then refused naming the revoke; the ranks split the revoked
/// communicator and the new one sums exactly.
#[test]
fn revoke_with_work_in_flight_then_split_and_continue() {
    use_backend_from_env();
    // SAFETY: set before this test's communicators are made; a longer bound only.
    unsafe { std::env::set_var("SYMM_TIMEOUT_MS", "20000") };
    const RANKS: usize = 3;
    let comms = join_threads(new_unique_id(), RANKS);
    let windows: Vec<(usize, usize)> = on_rank_threads(&comms, |_, comm| {
        let (base, window) = window_of_bytes(comm, COUNT * 4);
        (base as usize, window as usize)
    });
    let (revoked_tx, revoked_rx) = std::sync::mpsc::channel::<()>();
    let watchdog = {
        let rank0 = Handle(comms[0]);
        std::thread::spawn(move || {
            let rank0 = rank0;
            std::thread::sleep(Duration::from_millis(300));
            let started = std::time::Instant::now();
            let result = symmCommRevoke(rank0.0, SYMM_REVOKE_DEFAULT);
            let took = started.elapsed();
            revoked_tx.send(()).unwrap();
            (result, took)
        })
    };
    let mut revoked_rx = Some(revoked_rx);
    let handles: Vec<_> = comms
        .iter()
        .zip(&windows)
        .enumerate()
        .map(|(rank, (&comm, &(base, window)))| {
            let comm = Handle(comm);
            let signal = if rank == 2 { revoked_rx.take() } else { None };
            std::thread::spawn(move || {
                let comm = comm;
                let base = base as *mut c_void;
                let stream = RankStream::new();
                let all_reduce = |c: symmComm_t, at: *mut c_void| {
                    symmAllReduce(
                        at,
                        at,
                        COUNT,
                        symmDataType_t::symmFloat32 as i32,
                        symmRedOp_t::symmSum as i32,
                        c,
                        stream.handle(),
                    )
                };
                let mut waited = None;
                if let Some(signal) = signal {
                    // The hanging rank: it comes back only after the revoke.
                    signal.recv().unwrap();
                } else {
                    let started = std::time::Instant::now();
                    let result = stream.completed(comm.0, all_reduce(comm.0, base));
                    waited = Some((result, started.elapsed(), last_error(comm.0)));
                }
                if rank != 0 {
                    check(symmCommRevoke(comm.0, SYMM_REVOKE_DEFAULT), comm.0);
                }
                assert_eq!(
                    symmCommRevoke(comm.0, 7),
                    symmResult_t::symmInvalidArgument,
                    "revokeFlags 7"
                );
                let refused = all_reduce(comm.0, base);
                let refusal = last_error(comm.0);
                assert_eq!(
                    refused,
                    symmResult_t::symmInvalidUsage,
                    "rank {rank}: {refusal}"
                );
                assert!(refusal.contains("revoked"), "rank {rank}: {refusal}");
                // Recovery: a split of the revoked communicator, then exact sums on it.
                let mut child = null_mut();
                // SAFETY: valid out-pointer; NULL config.
                check(
                    unsafe { symmCommSplit(comm.0, 0, rank as i32, &mut child, std::ptr::null()) },
                    comm.0,
                );
                let (cbase, cwindow) = window_of_bytes(child, COUNT * 4);
                for round in 0..3 {
                    stream.put_f32(cbase.cast(), &values(rank + round));
                    check(stream.completed(child, all_reduce(child, cbase)), child);
                    let sum: Vec<f32> = (0..COUNT)
                        .map(|i| {
                            (0..RANKS).map(|r| values(r + round)[i] as f64).sum::<f64>() as f32
                        })
                        .collect();
                    assert_eq!(
                        stream.get_f32(cbase.cast(), COUNT),
                        sum,
                        "rank {rank}, round {round}"
                    );
                }
                check(symmCommWindowDeregister(child, cwindow), child);
                check(symmMemFree(child, cbase), child);
                check(symmCommDestroy(child), null_mut());
                check(
                    symmCommWindowDeregister(comm.0, window as symmWindow_t),
                    comm.0,
                );
                check(symmMemFree(comm.0, base), comm.0);
                waited
            })
        })
        .collect();
    let (result, took) = watchdog.join().unwrap();
    assert_eq!(result, symmResult_t::symmSuccess, "the revoke");
    assert!(took < Duration::from_secs(5), "the revoke took {took:?}");
    for (rank, h) in handles.into_iter().enumerate() {
        let waited = h.join().expect("a rank thread failed");
        if let Some((result, took, message)) = waited {
            assert_ne!(
                result,
                symmResult_t::symmSuccess,
                "rank {rank}'s pending all-reduce"
            );
            assert!(
                took < Duration::from_secs(8),
                "rank {rank} waited {took:?}: {message}"
            );
            assert!(message.contains("revoked"), "rank {rank}: {message}");
        }
    }
    for comm in comms {
        check(symmCommDestroy(comm), null_mut());
    }
}

/// A rank destroyed before its split (ranks of one process): the others' split fails at once,
/// naming it, instead of at the timeout; the ranks that did call are not named.
#[test]
fn a_split_with_a_destroyed_peer_fails_at_once_naming_it() {
    use_backend_from_env();
    let parents = init_all(3);
    check(symmCommDestroy(parents[0]), null_mut());
    let mut children = [null_mut(); 3];
    let started = std::time::Instant::now();
    check(symmGroupStart(), null_mut());
    for rank in 1..3 {
        // SAFETY: `children` outlives the group; NULL config.
        check(
            unsafe { symmCommSplit(parents[rank], 0, 0, &mut children[rank], std::ptr::null()) },
            parents[rank],
        );
    }
    assert_eq!(symmGroupEnd(), symmResult_t::symmRemoteError);
    let took = started.elapsed();
    assert!(took < Duration::from_secs(2), "took {took:?}");
    for rank in 1..3 {
        let message = last_error(parents[rank]);
        assert!(
            message.contains("ranks [0] were destroyed"),
            "rank {rank}: {message}"
        );
        assert!(children[rank].is_null());
    }
    for comm in &parents[1..] {
        check(symmCommDestroy(*comm), null_mut());
    }
}
