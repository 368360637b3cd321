//! `symmCommShrink`, NCCL's semantics: the ranks that remain make a new communicator without
//! the parent's bootstrap root, register the same memory (its data kept) on it and go on.
//!
//! A process per rank, 4 ranks, mixed collectives checked exactly: one process is killed
//! (SIGKILL) part-way — once an ordinary rank, once rank 0, whose process runs the bootstrap
//! root — and the others get an error naming it, shrink, re-register and run 100 more
//! collectives exactly. Ranks of one process: shrink by threads and by one thread in a group.
//! Bad arguments refused by name.
//!
//! On the host backend by default; with `SYMM_BACKEND=cuda` on the cuda backend (the rank
//! processes inherit it; the simulated GPU runs every layout in `cargo xtask sim --test`).

use std::ffi::c_void;
use std::ptr::null_mut;
use std::time::Duration;
use symm::*;
use symm_tests::*;

const NRANKS: usize = 4;
/// Elements each collective reduces (the window holds twice as many: the second half is a
/// pattern no collective touches, which must survive the shrink).
const COUNT: usize = 512;
/// The environment variable that makes a test process one rank of `shrink_child_rank`.
const CHILD_ENV: &str = "SYMM_SHRINK_CHILD";

/// Rank `rank`'s values for call `call`: small integers, so that f32 sums are exact.
fn values(rank: usize, call: usize) -> Vec<f32> {
    (0..COUNT)
        .map(|i| ((rank + 1) * 7 + (i + call) % 13) as f32)
        .collect()
}

/// The pattern in the untouched half of rank `rank`'s window.
fn pattern(rank: usize) -> Vec<f32> {
    (0..COUNT).map(|i| (rank * 1000 + i) as f32).collect()
}

/// Call `call` on `comm` (ranks `ranks` of the parent, in new-rank order): an in-place sum
/// all-reduce on even calls, an all-gather into the window's first half on odd ones (each
/// rank's share is `COUNT / nranks` elements, the rest of the half untouched); checked exactly
/// against f64.
fn run_call(
    comm: symmComm_t,
    base: *mut c_void,
    ranks: &[usize],
    me: usize,
    call: usize,
    stream: &RankStream,
) {
    let new_rank = ranks.iter().position(|&r| r == me).unwrap();
    let n = ranks.len();
    if call.is_multiple_of(2) {
        stream.put_f32(base.cast(), &values(me, call));
        let result = symmAllReduce(
            base,
            base,
            COUNT,
            symmDataType_t::symmFloat32 as i32,
            symmRedOp_t::symmSum as i32,
            comm,
            stream.handle(),
        );
        check(stream.completed(comm, result), comm);
        let expected: Vec<f32> = (0..COUNT)
            .map(|i| {
                ranks
                    .iter()
                    .map(|&r| values(r, call)[i] as f64)
                    .sum::<f64>() as f32
            })
            .collect();
        let got = stream.get_f32(base.cast(), COUNT);
        assert_eq!(got, expected, "rank {me}, call {call} (all-reduce)");
    } else {
        let share = COUNT / n;
        let own: Vec<f32> = values(me, call)[..share].to_vec();
        // SAFETY: within the window's first half.
        let at = unsafe { base.cast::<u8>().add(new_rank * share * 4) };
        stream.put_f32(at, &own);
        let result = symmAllGather(
            at.cast(),
            base,
            share,
            symmDataType_t::symmFloat32 as i32,
            comm,
            stream.handle(),
        );
        check(stream.completed(comm, result), comm);
        let expected: Vec<f32> = ranks
            .iter()
            .flat_map(|&r| values(r, call)[..share].to_vec())
            .collect();
        let got = stream.get_f32(base.cast(), share * n);
        assert_eq!(got, expected, "rank {me}, call {call} (all-gather)");
    }
}

/// The untouched half of the window still holds `pattern(me)`.
fn check_pattern(base: *mut c_void, me: usize, stream: &RankStream) {
    // SAFETY: the window's second half.
    let half = unsafe { base.cast::<u8>().add(COUNT * 4) };
    assert_eq!(
        stream.get_f32(half, COUNT),
        pattern(me),
        "rank {me}: the pattern"
    );
}

/// Register `base` (2 × `COUNT` f32) on `comm`.
fn register(comm: symmComm_t, base: *mut c_void) -> symmWindow_t {
    let mut window = null_mut();
    // SAFETY: valid out-pointer; memory of this rank's allocation.
    check(
        unsafe {
            symmCommWindowRegister(comm, base, COUNT * 8, &mut window, SYMM_WIN_COLL_SYMMETRIC)
        },
        comm,
    );
    window
}

/// One process's rank: join, register, write the pattern, run calls; the victim kills itself
/// (SIGKILL) before call `kill_at`; the others see their call fail naming it, shrink it away,
/// register the same memory on the new communicator (the pattern is still there) and run 100
/// more calls exactly.
#[test]
#[ignore = "a rank process of the process tests of this file (needs SYMM_SHRINK_CHILD)"]
fn shrink_child_rank() {
    let spec = std::env::var(CHILD_ENV).expect("run through the process tests of this file");
    let fields: Vec<&str> = spec.split(',').collect();
    let rank: usize = fields[0].parse().unwrap();
    let victim: usize = fields[1].parse().unwrap();
    let marks = std::path::PathBuf::from(fields[3]);
    let id = if fields[2] == "env" {
        // SYMM_COMM_ID: rank 0 opens the root, so rank 0's process runs it.
        let mut id = symmUniqueId {
            internal: [0; SYMM_UNIQUE_ID_BYTES],
        };
        // SAFETY: valid out-pointer.
        check(unsafe { symmGetUniqueId(&mut id) }, null_mut());
        id
    } else {
        id_from_hex(fields[2])
    };
    use_backend_from_env();
    let mut parent = null_mut();
    // SAFETY: valid out-pointer.
    check(
        unsafe { symmCommInitRank(&mut parent, NRANKS as i32, id, rank as i32) },
        null_mut(),
    );
    let mut base: *mut c_void = null_mut();
    // SAFETY: valid out-pointer.
    check(
        unsafe { symmMemAlloc(parent, &mut base, COUNT * 8) },
        parent,
    );
    let window = register(parent, base);
    let stream = RankStream::new();
    // SAFETY: the window's second half.
    stream.put_f32(unsafe { base.cast::<u8>().add(COUNT * 4) }, &pattern(rank));
    let all: Vec<usize> = (0..NRANKS).collect();
    let kill_at = 6;
    for call in 0..kill_at {
        run_call(parent, base, &all, rank, call, &stream);
    }
    if rank == victim {
        // Only once every other rank has returned from the last call: a peer still inside it
        // would see that call fail instead of the next one.
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while (0..NRANKS).any(|r| r != rank && !marks.join(format!("rank-{r}")).exists()) {
            assert!(
                std::time::Instant::now() < deadline,
                "the peers never finished call {}",
                kill_at - 1
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        // SAFETY: signals this process.
        unsafe { libc_kill(std::process::id() as i32, 9) };
    }
    std::fs::write(marks.join(format!("rank-{rank}")), b"").unwrap();
    // The next call fails, naming the lost rank (its process watch or the bootstrap).
    let started = std::time::Instant::now();
    stream.put_f32(base.cast(), &values(rank, kill_at));
    let result = symmAllReduce(
        base,
        base,
        COUNT,
        symmDataType_t::symmFloat32 as i32,
        symmRedOp_t::symmSum as i32,
        parent,
        stream.handle(),
    );
    let result = stream.completed(parent, result);
    let message = last_error(parent);
    assert_ne!(
        result,
        symmResult_t::symmSuccess,
        "rank {rank}: a call after the kill"
    );
    assert!(
        message.contains(&format!("rank {victim}")),
        "rank {rank}: the error does not name rank {victim}: {message}"
    );
    println!(
        "rank {rank}: failed after {:?}: {message}",
        started.elapsed()
    );
    let mut child = null_mut();
    let exclude = [victim as i32];
    // SAFETY: valid pointers; NULL config.
    check(
        unsafe {
            symmCommShrink(
                parent,
                exclude.as_ptr(),
                1,
                &mut child,
                std::ptr::null(),
                SYMM_SHRINK_ABORT,
            )
        },
        parent,
    );
    let survivors: Vec<usize> = (0..NRANKS).filter(|&r| r != victim).collect();
    let (mut count, mut new_rank) = (0, 0);
    // SAFETY: valid out-pointers.
    unsafe {
        check(symmCommCount(child, &mut count), child);
        check(symmCommUserRank(child, &mut new_rank), child);
    }
    assert_eq!(count as usize, survivors.len());
    assert_eq!(survivors[new_rank as usize], rank);
    // The same memory, its data kept, on the new communicator.
    check_pattern(base, rank, &stream);
    let child_window = register(child, base);
    for call in 0..100 {
        run_call(child, base, &survivors, rank, kill_at + 1 + call, &stream);
    }
    check_pattern(base, rank, &stream);
    check(symmCommWindowDeregister(child, child_window), child);
    check(symmCommWindowDeregister(parent, window), parent);
    // The allocation moved: the parent no longer frees it, the new communicator does.
    assert_eq!(symmMemFree(parent, base), symmResult_t::symmInvalidArgument);
    check(symmMemFree(child, base), child);
    check(symmCommDestroy(child), null_mut());
    check(symmCommDestroy(parent), null_mut());
    println!("rank {rank}: shrink done");
}

unsafe extern "C" {
    #[link_name = "kill"]
    fn libc_kill(pid: i32, sig: i32) -> i32;
}

fn processes_with_a_victim(victim: usize, root_in_rank_0: bool) {
    let id_field = if root_in_rank_0 {
        "env".to_string()
    } else {
        id_to_hex(&new_unique_id())
    };
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    // Where each rank marks that it returned from its last call before the kill.
    let marks = std::env::temp_dir().join(format!(
        "symm-shrink-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    ));
    std::fs::create_dir_all(&marks).unwrap();
    let ranks: Vec<Vec<(String, String)>> = (0..NRANKS)
        .map(|rank| {
            let mut env = vec![
                (
                    CHILD_ENV.to_string(),
                    format!("{rank},{victim},{id_field},{}", marks.display()),
                ),
                ("SYMM_TIMEOUT_MS".to_string(), "20000".to_string()),
            ];
            if root_in_rank_0 {
                env.push(("SYMM_COMM_ID".to_string(), format!("127.0.0.1:{port}")));
            }
            env
        })
        .collect();
    let started = std::time::Instant::now();
    let outcomes = run_rank_processes("shrink_child_rank", &ranks, Duration::from_secs(120));
    let _ = std::fs::remove_dir_all(&marks);
    for (rank, (ok, log)) in outcomes.into_iter().enumerate() {
        if rank == victim {
            assert!(!ok, "the victim, rank {rank}, was not killed:\n{log}");
            continue;
        }
        assert!(ok, "rank {rank} failed:\n{log}");
        assert!(log.contains("shrink done"), "rank {rank}:\n{log}");
    }
    // Well within the 20 s bound: the loss was found at once, not at the timeout.
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "took {:?}",
        started.elapsed()
    );
}

/// An ordinary rank's process (rank 2) is killed; the root runs in this test's process.
#[test]
fn an_ordinary_rank_killed_the_others_shrink_and_go_on() {
    processes_with_a_victim(2, false);
}

/// Rank 0's process, which runs the bootstrap root (`SYMM_COMM_ID`), is killed: the shrink
/// does not need it.
#[test]
fn the_root_s_process_killed_the_others_shrink_and_go_on() {
    processes_with_a_victim(0, true);
}

/// Ranks of one process, a thread each: rank 1 is gone (its thread never comes back); the
/// others shrink with the abort flag, keep their data and go on.
#[test]
fn ranks_of_one_process_shrink_by_threads() {
    use_backend_from_env();
    let comms = init_all(NRANKS);
    let victim = 1;
    on_rank_threads(&comms, |rank, comm| {
        if rank == victim {
            return;
        }
        let stream = RankStream::new();
        let mut base: *mut c_void = null_mut();
        // SAFETY: valid out-pointer.
        check(unsafe { symmMemAlloc(comm, &mut base, COUNT * 8) }, comm);
        // SAFETY: the second half.
        stream.put_f32(unsafe { base.cast::<u8>().add(COUNT * 4) }, &pattern(rank));
        let mut child = null_mut();
        let exclude = [victim as i32];
        // SAFETY: valid pointers; NULL config.
        check(
            unsafe {
                symmCommShrink(
                    comm,
                    exclude.as_ptr(),
                    1,
                    &mut child,
                    std::ptr::null(),
                    SYMM_SHRINK_ABORT,
                )
            },
            comm,
        );
        let survivors: Vec<usize> = (0..NRANKS).filter(|&r| r != victim).collect();
        check_pattern(base, rank, &stream);
        let window = register(child, base);
        for call in 0..20 {
            run_call(child, base, &survivors, rank, call, &stream);
        }
        check(symmCommWindowDeregister(child, window), child);
        check(symmMemFree(child, base), child);
        check(symmCommDestroy(child), null_mut());
    });
    for comm in comms {
        check(symmCommDestroy(comm), null_mut());
    }
}

/// One thread drives the survivors: their shrinks in a group; then groups of collectives.
#[test]
fn ranks_of_one_process_shrink_in_a_group() {
    use_backend_from_env();
    let parents = init_all(3);
    let exclude = [0];
    let mut children = [null_mut(); 3];
    check(symmGroupStart(), null_mut());
    for rank in 1..3 {
        // SAFETY: `children` outlives the group; NULL config.
        check(
            unsafe {
                symmCommShrink(
                    parents[rank],
                    exclude.as_ptr(),
                    1,
                    &mut children[rank],
                    std::ptr::null(),
                    SYMM_SHRINK_DEFAULT,
                )
            },
            parents[rank],
        );
    }
    check(symmGroupEnd(), null_mut());
    let mut buffers = alloc(&children[1..], 64);
    check(symmGroupStart(), null_mut());
    register_in_group(&mut buffers);
    check(symmGroupEnd(), null_mut());
    for (i, b) in buffers.iter().enumerate() {
        put_f32(b.base, &[(i + 1) as f32; 16]);
    }
    check(symmGroupStart(), null_mut());
    for b in &buffers {
        check(
            symmAllReduce(
                b.base.cast(),
                b.base.cast(),
                16,
                symmDataType_t::symmFloat32 as i32,
                symmRedOp_t::symmSum as i32,
                b.comm,
                null_mut(),
            ),
            b.comm,
        );
    }
    check(symmGroupEnd(), null_mut());
    for b in &buffers {
        assert_eq!(get_f32(b.base, 16), [3.0; 16]);
    }
    teardown(buffers);
    for comm in parents {
        check(symmCommDestroy(comm), null_mut());
    }
}

/// Bad arguments are refused by name, before anything is exchanged.
#[test]
fn bad_shrink_arguments_are_refused_by_name() {
    use_backend_from_env();
    let parents = init_all(2);
    let mut child = null_mut();
    let cases: [(&[i32], i32, &str); 5] = [
        (&[2], 0, "excludeRanksList[0] = 2"),
        (&[1, 1], 0, "listed twice"),
        (&[0], 0, "holds this rank (0)"),
        (&[0, 1], 0, "excludes every rank"),
        (&[1], 5, "shrinkFlags = 5"),
    ];
    for (list, flags, needle) in cases {
        // SAFETY: valid pointers; NULL config.
        let result = unsafe {
            symmCommShrink(
                parents[0],
                list.as_ptr(),
                list.len() as i32,
                &mut child,
                std::ptr::null(),
                flags,
            )
        };
        assert_eq!(result, symmResult_t::symmInvalidArgument, "{needle}");
        let message = last_error(parents[0]);
        assert!(message.contains(needle), "{needle}: {message}");
    }
    // SAFETY: deliberately bad pointers, refused before use.
    unsafe {
        assert_eq!(
            symmCommShrink(
                parents[0],
                std::ptr::null(),
                1,
                &mut child,
                std::ptr::null(),
                0
            ),
            symmResult_t::symmInvalidArgument
        );
        assert!(last_error(parents[0]).contains("excludeRanksList is NULL"));
        assert_eq!(
            symmCommShrink(parents[0], [1].as_ptr(), 1, null_mut(), std::ptr::null(), 0),
            symmResult_t::symmInvalidArgument
        );
        assert!(last_error(parents[0]).contains("newcomm is NULL"));
    }
    assert!(child.is_null());
    // Rank 0 alone shrinks away rank 1: a communicator of one rank.
    // SAFETY: valid pointers; NULL config.
    check(
        unsafe { symmCommShrink(parents[0], [1].as_ptr(), 1, &mut child, std::ptr::null(), 0) },
        parents[0],
    );
    let mut count = 0;
    // SAFETY: valid out-pointer.
    check(unsafe { symmCommCount(child, &mut count) }, child);
    assert_eq!(count, 1);
    check(symmCommDestroy(child), null_mut());
    for comm in parents {
        check(symmCommDestroy(comm), null_mut());
    }
}

/// Memory a shrink moved to the new communicator is not freed there while a window of the
/// parent still covers it (with the default flag the parent is not revoked); once that window
/// is deregistered, it is.
#[test]
fn moved_memory_is_not_freed_while_the_parent_s_window_covers_it() {
    use_backend_from_env();
    let parents = init_all(2);
    let mut buffers = alloc(&parents, 256);
    check(symmGroupStart(), null_mut());
    register_in_group(&mut buffers);
    check(symmGroupEnd(), null_mut());
    // Rank 1 alone remains: a communicator of one rank.
    let mut child = null_mut();
    // SAFETY: valid pointers; NULL config.
    check(
        unsafe {
            symmCommShrink(
                parents[1],
                [0].as_ptr(),
                1,
                &mut child,
                std::ptr::null(),
                SYMM_SHRINK_DEFAULT,
            )
        },
        parents[1],
    );
    let moved = buffers.pop().unwrap();
    assert_eq!(
        symmMemFree(child, moved.base.cast()),
        symmResult_t::symmInvalidUsage
    );
    let message = last_error(child);
    assert!(message.contains("of another communicator"), "{message}");
    assert_eq!(
        symmMemFree(parents[1], moved.base.cast()),
        symmResult_t::symmInvalidArgument,
        "the parent no longer owns it"
    );
    check(
        symmCommWindowDeregister(parents[1], moved.window),
        parents[1],
    );
    check(symmMemFree(child, moved.base.cast()), child);
    check(symmCommDestroy(child), null_mut());
    check(symmCommDestroy(parents[1]), null_mut());
    teardown(buffers);
}

/// Survivors that pass different lists never meet: the ones that agree form their
/// communicator, the other times out; none gets a communicator of the wrong ranks.
#[test]
fn survivors_with_different_lists_do_not_meet() {
    use_backend_from_env();
    let comms = init_all(3);
    let outcomes = on_rank_threads(&comms, |rank, comm| {
        // Ranks 0 and 1 leave out rank 2; rank 2 leaves out rank 1.
        let exclude = [if rank == 2 { 1 } else { 2 }];
        let mut child = null_mut();
        // SAFETY: valid pointers; NULL config.
        let result =
            unsafe { symmCommShrink(comm, exclude.as_ptr(), 1, &mut child, std::ptr::null(), 0) };
        let count = (!child.is_null()).then(|| {
            let mut count = 0;
            // SAFETY: valid out-pointer.
            check(unsafe { symmCommCount(child, &mut count) }, child);
            check(symmCommDestroy(child), null_mut());
            count
        });
        (result, count)
    });
    assert_eq!(outcomes[0], (symmResult_t::symmSuccess, Some(2)));
    assert_eq!(outcomes[1], (symmResult_t::symmSuccess, Some(2)));
    assert_eq!(outcomes[2].1, None, "rank 2 got a communicator");
    assert_ne!(outcomes[2].0, symmResult_t::symmSuccess);
    for comm in comms {
        check(symmCommDestroy(comm), null_mut());
    }
}
