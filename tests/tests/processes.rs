//! Ranks in separate processes (host backend): a rank that dies, resources after destroy, and
//! the bootstrap facing a rank with the wrong id. (Every collective × data type × operator
//! across processes, checked exactly, runs in `sequences.rs`, `processes_*`.)
//!
//! The ranks are child processes running this binary's `child_rank` test with
//! `SYMM_PROC_CHILD=<scenario>,<rank>,<nranks>,<id in hex>`; the unique id (and so the
//! bootstrap root) is made in the test process.

use std::ffi::c_void;
use std::process::{Child, Command, Stdio};
use std::ptr::null_mut;
use std::time::{Duration, Instant};
use symm::*;
use symm_tests::*;

/// Bound of every wait on a peer in the children.
const TIMEOUT_MS: u64 = 3000;
/// Bound of the children's joining (they start one after another on a loaded machine).
const JOIN_TIMEOUT_MS: &str = "60000";
/// Elements of each all-reduce.
const COUNT: usize = 4099;
const CHILD_ENV: &str = "SYMM_PROC_CHILD";

fn new_id() -> symmUniqueId {
    use_host_backend();
    let mut id = symmUniqueId {
        internal: [0; SYMM_UNIQUE_ID_BYTES],
    };
    // SAFETY: valid out-pointer.
    check(unsafe { symmGetUniqueId(&mut id) }, null_mut());
    id
}

fn spawn(scenario: &str, rank: usize, nranks: usize, id: &str) -> Child {
    spawn_with(scenario, rank, nranks, id, &[])
}

/// [`spawn`], with `env` added to the child's environment.
fn spawn_with(scenario: &str, rank: usize, nranks: usize, id: &str, env: &[(&str, &str)]) -> Child {
    Command::new(std::env::current_exe().unwrap())
        .args([
            "--include-ignored",
            "--exact",
            "child_rank",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("SYMM_BACKEND", "host")
        .env("SYMM_TIMEOUT_MS", TIMEOUT_MS.to_string())
        .env("SYMM_BOOTSTRAP_TIMEOUT_MS", JOIN_TIMEOUT_MS)
        .env(CHILD_ENV, format!("{scenario},{rank},{nranks},{id}"))
        .envs(env.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting a rank process")
}

/// Wait for `child` (killed after `limit`); its success and its output. The output is read
/// while it runs (a thread), so a chatty child never blocks on a full pipe.
fn finish(child: Child, limit: Duration) -> (bool, String) {
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    let output = match rx.recv_timeout(limit) {
        Ok(output) => output.unwrap(),
        Err(_) => {
            // SAFETY: signals the child we started (it has not been reaped: its waiter still
            // runs).
            unsafe { kill_process(pid) };
            rx.recv().unwrap().unwrap()
        }
    };
    let mut log = String::from_utf8_lossy(&output.stdout).into_owned();
    log.push_str(&String::from_utf8_lossy(&output.stderr));
    (output.status.success(), log)
}

// ---------------------------------------------------------------------------------------------
// The parent side

/// A rank process killed while the others run all-reduces back to back: every survivor's
/// pending or next collective returns `symmRemoteError` naming the killed rank's process (the
/// watch on it, `comm::watch`), or `symmTimeout` where it cannot be watched, within the bound
/// (never hangs), the next
/// call is refused, and `symmCommDestroy` still works.
#[test]
fn a_killed_rank_makes_the_others_time_out_within_the_bound() {
    for nranks in [2, 4] {
        let id = id_to_hex(&new_id());
        let mut survivors: Vec<Child> = (1..nranks)
            .map(|rank| spawn("survive", rank, nranks, &id))
            .collect();
        let victim = spawn("die", 0, nranks, &id);
        let (_, victim_log) = finish(victim, Duration::from_secs(60));
        assert!(
            victim_log.contains("dying after"),
            "the victim did not run collectives before dying:\n{victim_log}"
        );
        for (i, child) in survivors.drain(..).enumerate() {
            let (ok, log) = finish(child, Duration::from_secs(60));
            assert!(ok, "{nranks} ranks: survivor rank {} failed:\n{log}", i + 1);
            assert!(log.contains("timed out after"), "{log}");
        }
    }
}

/// After `symmCommDestroy`, a rank process holds no more file descriptors and no shared
/// memory than before `symmCommInitRank` (three windows, collectives, teardown), for 3
/// processes.
/// Two processes with different `SYMM_HOST_MODE`s (rank 0 `testing`, rank 1 `fast`): they agree
/// at start-up on the testing mode (every rank must run the same block size), say so in rank 1's
/// log, and their in-place all-reduces are exact.
#[test]
fn processes_with_different_host_modes_agree_on_one() {
    let id = id_to_hex(&new_id());
    let children: Vec<Child> = [("testing", "WARN"), ("fast", "INFO")]
        .iter()
        .enumerate()
        .map(|(rank, (mode, log))| {
            spawn_with(
                "allreduce",
                rank,
                2,
                &id,
                &[
                    ("SYMM_HOST_MODE", mode),
                    ("SYMM_DEBUG", log),
                    ("SYMM_DEBUG_SUBSYS", "INIT"),
                ],
            )
        })
        .collect();
    let logs: Vec<(bool, String)> = children
        .into_iter()
        .map(|child| finish(child, Duration::from_secs(60)))
        .collect();
    for (rank, (ok, log)) in logs.iter().enumerate() {
        assert!(*ok && log.contains("all-reduces OK"), "rank {rank}:\n{log}");
    }
    assert!(
        logs[1].1.contains("another rank runs the testing mode"),
        "rank 1:\n{}",
        logs[1].1
    );
}

#[test]
fn destroy_releases_every_descriptor_and_mapping() {
    let nranks = 3;
    let id = id_to_hex(&new_id());
    let children: Vec<Child> = (0..nranks)
        .map(|rank| spawn("leaks", rank, nranks, &id))
        .collect();
    for (rank, child) in children.into_iter().enumerate() {
        let (ok, log) = finish(child, Duration::from_secs(120));
        assert!(ok, "rank {rank}:\n{log}");
        assert!(log.contains("no leaks"), "rank {rank}:\n{log}");
    }
}

/// Two rank processes that disagree on a call (rank 1 all-gathers, or all-reduces another
/// count, where rank 0 all-reduces 64 floats; or each broadcasts 64 floats from itself as the
/// root): never success with wrong data. A rank that finds
/// its peer's other call on record is refused with `symmInvalidUsage` (nothing launched); a
/// rank that launched before its peer's call was on record times out; every message names both
/// calls. Then three calls that agree after a fresh start show that agreeing ranks are not
/// refused.
#[test]
fn processes_that_disagree_on_the_call_get_an_error_naming_both() {
    for (scenario, [first, second]) in [
        (
            "disagree_gather",
            ["symmAllReduce of 64", "symmAllGather of 32"],
        ),
        (
            "disagree_count",
            ["symmAllReduce of 64", "symmAllReduce of 128"],
        ),
        (
            "disagree_root",
            [
                "symmBroadcast of 64 x Float32 from root 0",
                "symmBroadcast of 64 x Float32 from root 1",
            ],
        ),
    ] {
        let id = id_to_hex(&new_id());
        let children: Vec<Child> = (0..2).map(|rank| spawn(scenario, rank, 2, &id)).collect();
        let mut codes = Vec::new();
        for (rank, child) in children.into_iter().enumerate() {
            let (ok, log) = finish(child, Duration::from_secs(60));
            assert!(ok, "{scenario}, rank {rank}:\n{log}");
            // The test harness may print its own words before the child's on the line.
            let line = log
                .lines()
                .find_map(|l| l.find("result symm").map(|at| &l[at..]))
                .unwrap_or_else(|| panic!("{scenario}, rank {rank}: no result:\n{log}"));
            assert!(
                line.contains(first) && line.contains(second),
                "{scenario}, rank {rank}: {line}"
            );
            codes.push(
                line.split_whitespace()
                    .nth(1)
                    .unwrap()
                    .trim_end_matches(':')
                    .to_string(),
            );
        }
        // Each call is refused, or fails with the refusing rank's error (learnt from its
        // record, after this rank's own wait timed out), and at least one is refused (both
        // are when each saw the other's record).
        assert!(
            codes
                .iter()
                .all(|c| c == "symmInvalidUsage" || c == "symmTimeout" || c == "symmRemoteError"),
            "{scenario}: {codes:?}"
        );
        assert!(
            codes.iter().any(|c| c == "symmInvalidUsage"),
            "{scenario}: {codes:?}"
        );
    }
}

/// A process joining with an id whose secret was altered is refused, and does not disturb
/// the ranks that hold the right id.
#[test]
fn a_rank_with_a_forged_secret_is_refused_and_the_others_complete() {
    let good = new_id();
    let id = id_to_hex(&good);
    let mut forged = good;
    // The secret: bytes 32..64 of the id (the rest must stay as it is, or the id is refused
    // before it is used).
    for b in forged.internal[32..64].iter_mut() {
        *b = !*b;
    }
    let intruder = std::thread::spawn(move || {
        let mut comm = null_mut();
        // SAFETY: valid out-pointer.
        let r = unsafe { symmCommInitRank(&mut comm, 2, forged, 1) };
        (r, last_error(null_mut()))
    });
    let children: Vec<Child> = (0..2)
        .map(|rank| spawn("allreduce", rank, 2, &id))
        .collect();
    for (rank, child) in children.into_iter().enumerate() {
        let (ok, log) = finish(child, Duration::from_secs(60));
        assert!(ok, "rank {rank}:\n{log}");
        assert!(log.contains("all-reduces OK"), "rank {rank}:\n{log}");
    }
    let (result, message) = intruder.join().unwrap();
    assert_ne!(result, symmResult_t::symmSuccess, "{message}");
    // Its secret differs from the root's: the root's proof does not check for it, and it
    // refuses the root before sending its own proof.
    assert_eq!(result, symmResult_t::symmSystemError, "{message}");
    assert!(message.contains("secret is refused"), "{message}");
    assert!(
        message.contains("did not prove it knows the communicator's secret"),
        "{message}"
    );
}

/// Ranks of a communicator made by `symmCommInitRank` in threads of this process, then
/// driven by one thread in groups: every registration's confirmation round waits for every
/// rank, so a group must start all of them before finishing any.
#[test]
fn one_thread_drives_init_rank_ranks_in_groups() {
    let id = new_id();
    let comms = join_threads(id, 3);
    let mut buffers = alloc(&comms, COUNT * 4);
    register_all(&mut buffers);
    for round in 0..3 {
        check(symmGroupStart(), null_mut());
        for (rank, b) in buffers.iter().enumerate() {
            let values: Vec<f32> = (0..COUNT).map(|i| (rank + i % 5 + round) as f32).collect();
            // SAFETY: the window holds COUNT f32; no collective is in flight.
            unsafe { write_f32(b.base, &values) };
        }
        for b in &buffers {
            let p = b.base as *mut c_void;
            check(
                all_reduce_f32_sum(b.comm, p.cast(), p.cast(), COUNT),
                b.comm,
            );
        }
        check(symmGroupEnd(), null_mut());
        for b in &buffers {
            // SAFETY: as above; the group has completed.
            let got = unsafe { read_f32(b.base as *const u8, COUNT) };
            for (i, v) in got.iter().enumerate() {
                assert_eq!(
                    *v,
                    (3 + 3 * (i % 5 + round)) as f32,
                    "round {round} index {i}"
                );
            }
        }
    }
    teardown(buffers);
}

/// Ranks that register windows of different sizes all fail (the confirmation round), and
/// every later registration on those communicators is refused with a clear error.
#[test]
fn a_failed_registration_fails_every_rank_and_later_ones_are_refused() {
    let id = new_id();
    let comms = join_threads(id, 2);
    let results: Vec<(symmResult_t, symmResult_t, String)> = std::thread::scope(|scope| {
        let handles: Vec<_> = comms
            .iter()
            .enumerate()
            .map(|(rank, &comm)| {
                let comm = comm as usize;
                scope.spawn(move || {
                    let comm = comm as symmComm_t;
                    let bytes = 4096 * (rank + 1);
                    let mut buffer = null_mut();
                    let mut window = null_mut();
                    // SAFETY: valid out-pointers; a live allocation.
                    unsafe {
                        check(symmMemAlloc(comm, &mut buffer, bytes), comm);
                        let first = symmCommWindowRegister(
                            comm,
                            buffer,
                            bytes,
                            &mut window,
                            SYMM_WIN_COLL_SYMMETRIC,
                        );
                        let second = symmCommWindowRegister(
                            comm,
                            buffer,
                            bytes,
                            &mut window,
                            SYMM_WIN_COLL_SYMMETRIC,
                        );
                        let message = last_error(comm);
                        check(symmMemFree(comm, buffer), comm);
                        (first, second, message)
                    }
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (rank, (first, second, message)) in results.iter().enumerate() {
        assert_ne!(*first, symmResult_t::symmSuccess, "rank {rank}");
        assert_eq!(
            *second,
            symmResult_t::symmInvalidUsage,
            "rank {rank}: {message}"
        );
        assert!(message.contains("earlier window registration"), "{message}");
    }
    for comm in comms {
        check(symmCommDestroy(comm), null_mut());
    }
}

/// A rank whose communicator is destroyed makes another rank's registration fail promptly
/// with `symmRemoteError`, not after the bound.
#[test]
fn a_departed_rank_fails_a_registration_promptly() {
    let id = new_id();
    let comms = join_threads(id, 2);
    check(symmCommDestroy(comms[1]), null_mut());
    let comm = comms[0];
    let mut buffer = null_mut();
    let mut window = null_mut();
    let start = Instant::now();
    // SAFETY: valid out-pointers; a live allocation.
    let result = unsafe {
        check(symmMemAlloc(comm, &mut buffer, 4096), comm);
        symmCommWindowRegister(comm, buffer, 4096, &mut window, SYMM_WIN_COLL_SYMMETRIC)
    };
    assert_eq!(
        result,
        symmResult_t::symmRemoteError,
        "{}",
        last_error(comm)
    );
    assert!(
        last_error(comm).contains("rank 1 left"),
        "{}",
        last_error(comm)
    );
    assert!(start.elapsed() < Duration::from_secs(5));
    check(symmMemFree(comm, buffer), comm);
    check(symmCommDestroy(comm), null_mut());
}

// ---------------------------------------------------------------------------------------------
// The child side

/// One rank's communicator, buffer and window.
struct Rank {
    comm: symmComm_t,
    buffer: *mut c_void,
    window: symmWindow_t,
}

fn join(id: &symmUniqueId, rank: usize, nranks: usize) -> Rank {
    let mut comm = null_mut();
    // SAFETY: valid out-pointer.
    check(
        unsafe { symmCommInitRank(&mut comm, nranks as i32, *id, rank as i32) },
        null_mut(),
    );
    let bytes = COUNT * 4;
    let mut buffer = null_mut();
    // SAFETY: valid out-pointers; a live allocation of `bytes`.
    unsafe {
        check(symmMemAlloc(comm, &mut buffer, bytes), comm);
        let mut window = null_mut();
        check(
            symmCommWindowRegister(comm, buffer, bytes, &mut window, SYMM_WIN_COLL_SYMMETRIC),
            comm,
        );
        Rank {
            comm,
            buffer,
            window,
        }
    }
}

/// All-reduce (sum, in place) of `rank + 1 + i % 7` over the ranks; returns the result and
/// whether every element is right.
fn all_reduce(r: &Rank, rank: usize, nranks: usize, round: usize) -> (symmResult_t, bool) {
    let values: Vec<f32> = (0..COUNT)
        .map(|i| (rank + 1 + (i + round) % 7) as f32)
        .collect();
    // SAFETY: the window holds COUNT f32; this rank's previous call has returned.
    unsafe { write_f32(r.buffer.cast(), &values) };
    let result = all_reduce_f32_sum(r.comm, r.buffer.cast(), r.buffer.cast(), COUNT);
    if result != symmResult_t::symmSuccess {
        return (result, false);
    }
    // SAFETY: as above.
    let got = unsafe { read_f32(r.buffer.cast(), COUNT) };
    let base: usize = (1..=nranks).sum();
    let right = got
        .iter()
        .enumerate()
        .all(|(i, v)| *v == (base + nranks * ((i + round) % 7)) as f32);
    (result, right)
}

fn leave(r: Rank) {
    check(symmCommWindowDeregister(r.comm, r.window), r.comm);
    check(symmMemFree(r.comm, r.buffer), r.comm);
    check(symmCommDestroy(r.comm), null_mut());
}

/// The process's open descriptors, and how many of them are shared memory.
fn descriptors() -> (usize, usize) {
    let mut total = 0;
    let mut memfds = 0;
    for entry in std::fs::read_dir("/proc/self/fd").unwrap().flatten() {
        total += 1;
        if std::fs::read_link(entry.path())
            .is_ok_and(|target| target.to_string_lossy().contains("memfd:"))
        {
            memfds += 1;
        }
    }
    (total, memfds)
}

/// Shared-memory mappings of the process.
fn shared_mappings() -> usize {
    std::fs::read_to_string("/proc/self/maps")
        .unwrap()
        .lines()
        .filter(|l| l.contains("memfd:"))
        .count()
}

/// Runs in a child process (see the module docs).
#[test]
#[ignore = "child process of the other tests of this file (needs SYMM_PROC_CHILD)"]
fn child_rank() {
    let spec = std::env::var(CHILD_ENV).expect("run through the other tests of this file");
    let fields: Vec<&str> = spec.split(',').collect();
    let (scenario, rank, nranks) = (
        fields[0],
        fields[1].parse::<usize>().unwrap(),
        fields[2].parse::<usize>().unwrap(),
    );
    let id = id_from_hex(fields[3]);
    match scenario {
        "allreduce" => {
            let r = join(&id, rank, nranks);
            for round in 0..5 {
                let (result, right) = all_reduce(&r, rank, nranks, round);
                assert_eq!(result, symmResult_t::symmSuccess, "{}", last_error(r.comm));
                assert!(right, "round {round}: wrong result");
            }
            leave(r);
            println!("rank {rank}: all-reduces OK");
        }
        "die" => {
            let r = join(&id, rank, nranks);
            for round in 0..3 {
                let (result, right) = all_reduce(&r, rank, nranks, round);
                assert!(result == symmResult_t::symmSuccess && right);
            }
            println!("rank {rank}: dying after 3 all-reduces");
            // Killed at a point of its choosing while the next collectives run: from another
            // thread, a few milliseconds into the loop.
            std::thread::spawn(|| {
                std::thread::sleep(Duration::from_millis(5));
                // SAFETY: ends this process at once, like `kill -9`.
                unsafe { libc_kill_self() };
            });
            let mut round = 3;
            loop {
                let _ = all_reduce(&r, rank, nranks, round);
                round += 1;
            }
        }
        "survive" => {
            let r = join(&id, rank, nranks);
            let bound = Duration::from_millis(TIMEOUT_MS);
            let mut round = 0;
            let (result, elapsed) = loop {
                let start = Instant::now();
                let (result, right) = all_reduce(&r, rank, nranks, round);
                if result != symmResult_t::symmSuccess {
                    break (result, start.elapsed());
                }
                assert!(right, "round {round}: wrong result before the peer died");
                round += 1;
            };
            // Its own wait timed out, or another survivor's did first and failed the
            // communicator for every rank; either way the message names the rank that died.
            let message = last_error(r.comm);
            assert!(
                result == symmResult_t::symmTimeout || result == symmResult_t::symmRemoteError,
                "{result:?}: {message}"
            );
            assert!(
                message.contains("rank 0 did not arrive") || message.contains("rank 0's process"),
                "{message}"
            );
            assert!(
                elapsed < bound * 2 + Duration::from_secs(2),
                "the failed call took {elapsed:?}, bound {bound:?}"
            );
            // The communicator refuses further collectives, and tears down.
            let (again, _) = all_reduce(&r, rank, nranks, round + 1);
            assert_ne!(again, symmResult_t::symmSuccess);
            let _ = symmCommWindowDeregister(r.comm, r.window);
            let _ = symmMemFree(r.comm, r.buffer);
            check(symmCommDestroy(r.comm), null_mut());
            println!(
                "rank {rank}: timed out after {} ms (round {round})",
                elapsed.as_millis()
            );
        }
        "leaks" => {
            let before = descriptors();
            let maps_before = shared_mappings();
            let r = join(&id, rank, nranks);
            let mut extra = Vec::new();
            for _ in 0..2 {
                let mut buffer = null_mut();
                let mut window = null_mut();
                // SAFETY: valid out-pointers; a live allocation.
                unsafe {
                    check(symmMemAlloc(r.comm, &mut buffer, 1 << 16), r.comm);
                    check(
                        symmCommWindowRegister(
                            r.comm,
                            buffer,
                            1 << 16,
                            &mut window,
                            SYMM_WIN_COLL_SYMMETRIC,
                        ),
                        r.comm,
                    );
                }
                extra.push((buffer, window));
            }
            for round in 0..3 {
                let (result, right) = all_reduce(&r, rank, nranks, round);
                assert!(result == symmResult_t::symmSuccess && right);
            }
            assert!(descriptors().1 > before.1, "windows are shared memory");
            for (buffer, window) in extra {
                check(symmCommWindowDeregister(r.comm, window), r.comm);
                check(symmMemFree(r.comm, buffer), r.comm);
            }
            leave(r);
            let after = descriptors();
            assert_eq!(
                after, before,
                "descriptors (all, shared memory) before and after"
            );
            assert_eq!(shared_mappings(), maps_before, "shared-memory mappings");
            println!("rank {rank}: no leaks ({} descriptors)", after.0);
        }
        "disagree_gather" | "disagree_count" | "disagree_root" => {
            // Calls that agree first: refused by nobody.
            let r = join(&id, rank, nranks);
            for round in 0..3 {
                let (result, right) = all_reduce(&r, rank, nranks, round);
                assert_eq!(result, symmResult_t::symmSuccess, "{}", last_error(r.comm));
                assert!(right, "round {round}: wrong result");
            }
            if scenario == "disagree_root" {
                // Broadcasts that agree, from each root: the root's data on both ranks.
                for root in 0..nranks {
                    let own: Vec<f32> = (0..COUNT).map(|i| (100 * rank + i) as f32).collect();
                    // SAFETY: the window holds COUNT f32; this rank's previous call returned.
                    unsafe { write_f32(r.buffer.cast(), &own) };
                    let f32_ = symmDataType_t::symmFloat32 as i32;
                    let result = symmBroadcast(
                        r.buffer,
                        r.buffer,
                        COUNT,
                        f32_,
                        root as i32,
                        r.comm,
                        null_mut(),
                    );
                    assert_eq!(result, symmResult_t::symmSuccess, "{}", last_error(r.comm));
                    // SAFETY: as above.
                    let got = unsafe { read_f32(r.buffer.cast(), COUNT) };
                    let want: Vec<f32> = (0..COUNT).map(|i| (100 * root + i) as f32).collect();
                    assert_eq!(got, want, "broadcast from root {root}");
                }
            }
            let f32_ = symmDataType_t::symmFloat32 as i32;
            let sum = symmRedOp_t::symmSum as i32;
            let result = if rank == 1 && scenario == "disagree_gather" {
                // In place: rank 1's share is the second 32 elements.
                // SAFETY: inside the window of COUNT floats.
                let share = unsafe { r.buffer.cast::<f32>().add(32) }.cast::<c_void>();
                symmAllGather(share, r.buffer, 32, f32_, r.comm, null_mut())
            } else if scenario == "disagree_root" {
                // Each names itself the root: each would push its data into the other.
                let root = rank as i32;
                symmBroadcast(r.buffer, r.buffer, 64, f32_, root, r.comm, null_mut())
            } else {
                let count = if rank == 1 { 128 } else { 64 };
                symmAllReduce(r.buffer, r.buffer, count, f32_, sum, r.comm, null_mut())
            };
            println!("result {result:?}: {}", last_error(r.comm));
            assert_ne!(result, symmResult_t::symmSuccess);
            let _ = symmCommWindowDeregister(r.comm, r.window);
            let _ = symmMemFree(r.comm, r.buffer);
            check(symmCommDestroy(r.comm), null_mut());
        }
        other => panic!("unknown scenario {other}"),
    }
}

unsafe extern "C" {
    fn kill(pid: i32, sig: i32) -> i32;
}
const SIGKILL: i32 = 9;

/// Send SIGKILL to this process.
///
/// # Safety
/// Ends the process without unwinding or running destructors.
unsafe fn libc_kill_self() {
    // SAFETY: kill(2) with our own pid; the caller accepts the end of the process.
    unsafe { kill(std::process::id() as i32, SIGKILL) };
}

/// Send SIGKILL to process `pid`.
///
/// # Safety
/// `pid` must be a child of this process that has not been reaped.
unsafe fn kill_process(pid: u32) {
    // SAFETY: kill(2) of our own unreaped child (caller's contract).
    unsafe { kill(pid as i32, SIGKILL) };
}
