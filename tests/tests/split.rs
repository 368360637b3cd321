//! `symmCommSplit`, NCCL's semantics, in every layout: ranks of `symmCommInitAll` driven by a
//! thread each and by one thread in a group, ranks of `symmCommInitRank` on threads, and one
//! process per rank. Four ranks split into two halves, ordered by a key that reverses them;
//! the halves run different collectives at once on their new communicators, checked exactly
//! against an f64 reference; the parent still works afterwards; a rank with
//! `SYMM_SPLIT_NOCOLOR` gets NULL; bad arguments are refused with the argument named.
//!
//! On the host backend by default; with `SYMM_BACKEND=cuda` on the cuda backend.

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
    let handles: Vec<_> = comms
        .iter()
        .enumerate()
        .map(|(rank, &comm)| {
            let comm = Handle(comm);
            std::thread::spawn(move || {
                let comm = comm;
                rank_part(comm.0, rank)
            })
        })
        .collect();
    for h in handles {
        h.join().expect("a rank thread failed");
    }
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
    if on_cuda() {
        return; // the processes of the cuda backend run in the GPU set's process tests
    }
    let id = new_unique_id();
    let ranks: Vec<Vec<(String, String)>> = (0..NRANKS)
        .map(|rank| {
            vec![
                (CHILD_ENV.to_string(), format!("{rank},{}", id_to_hex(&id))),
                ("SYMM_BACKEND".to_string(), "host".to_string()),
            ]
        })
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

/// Bad arguments are refused before anything is exchanged, naming the argument; the parent
/// stays usable (a split afterwards works).
#[test]
fn bad_split_arguments_are_refused_by_name() {
    use_backend_from_env();
    let parents = init_all(2);
    let mut child = null_mut();
    let refused = |result: symmResult_t, comm: symmComm_t, needle: &str| {
        assert_eq!(result, symmResult_t::symmInvalidArgument, "{needle}");
        let message = last_error(comm);
        assert!(message.contains(needle), "{needle}: {message}");
    };
    // SAFETY: valid or deliberately NULL out-pointers; the configurations live on the stack.
    unsafe {
        refused(
            symmCommSplit(parents[0], -5, 0, &mut child, std::ptr::null()),
            parents[0],
            "color = -5",
        );
        refused(
            symmCommSplit(parents[0], 0, 0, null_mut(), std::ptr::null()),
            parents[0],
            "newcomm",
        );
        let mut config = default_config();
        config.magic = 0;
        refused(
            symmCommSplit(parents[0], 0, 0, &mut child, &config),
            parents[0],
            "SYMM_CONFIG_INITIALIZER",
        );
        let mut config = default_config();
        config.blocking = 0;
        refused(
            symmCommSplit(parents[0], 0, 0, &mut child, &config),
            parents[0],
            "config->blocking",
        );
        let mut config = default_config();
        config.minCTAs = 4;
        config.maxCTAs = 2;
        refused(
            symmCommSplit(parents[0], 0, 0, &mut child, &config),
            parents[0],
            "config->minCTAs",
        );
    }
    assert!(child.is_null(), "a refused split wrote newcomm");
    // Still usable: a split with a configuration of one block per rank.
    let mut children = [null_mut(); 2];
    let mut config = default_config();
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
