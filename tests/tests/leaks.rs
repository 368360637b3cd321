//! Nothing outlives `symmCommDestroy`: after communicators made by `symmCommInitAll`, by
//! `symmCommInitRank` with one thread per rank, and by `symmCommInitRank` with a rank in
//! another process have run collectives and been destroyed, this process holds no more heap
//! memory (counted by this binary's global allocator: the host backend's windows, signal pads
//! and contexts are heap memory), threads (`/proc/self/task`), file descriptors
//! (`/proc/self/fd`; memfd windows show there) or shared-memory mappings (`/proc/self/maps`)
//! than before.
//!
//! A first round of every scenario runs before the baseline is taken, so that state made once
//! per process (the host backend, the thread's error message, lazily built tables) is not
//! counted. Then every scenario runs several more times: anything kept per communicator would
//! grow with the rounds.

use std::alloc::{GlobalAlloc, Layout, System};
use std::process::{Command, Stdio};
use std::ptr::null_mut;
use std::sync::atomic::{AtomicIsize, Ordering};
use std::time::{Duration, Instant};
use symm::*;
use symm_tests::*;

/// The system allocator, counting the bytes and blocks currently allocated.
struct Counting;

static LIVE_BYTES: AtomicIsize = AtomicIsize::new(0);
static LIVE_BLOCKS: AtomicIsize = AtomicIsize::new(0);

// SAFETY: every call is forwarded to the system allocator with the caller's arguments; the
// counters are only bookkeeping.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded contract.
        let ptr = unsafe { System.alloc(layout) };
        if !ptr.is_null() {
            LIVE_BYTES.fetch_add(layout.size() as isize, Ordering::Relaxed);
            LIVE_BLOCKS.fetch_add(1, Ordering::Relaxed);
        }
        ptr
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded contract.
        let ptr = unsafe { System.alloc_zeroed(layout) };
        if !ptr.is_null() {
            LIVE_BYTES.fetch_add(layout.size() as isize, Ordering::Relaxed);
            LIVE_BLOCKS.fetch_add(1, Ordering::Relaxed);
        }
        ptr
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded contract.
        unsafe { System.dealloc(ptr, layout) };
        LIVE_BYTES.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        LIVE_BLOCKS.fetch_sub(1, Ordering::Relaxed);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: forwarded contract.
        let new = unsafe { System.realloc(ptr, layout, new_size) };
        if !new.is_null() {
            LIVE_BYTES.fetch_add(
                new_size as isize - layout.size() as isize,
                Ordering::Relaxed,
            );
        }
        new
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

const COUNT: usize = 1000;
/// Rounds of every scenario after the baseline.
const ROUNDS: usize = 5;
/// Heap bytes and blocks the end may hold beyond the baseline (less than one block, and less
/// than 103 bytes, per round).
const SLACK_BYTES: isize = 512;
const SLACK_BLOCKS: isize = 4;
const CHILD_ENV: &str = "SYMM_LEAKS_CHILD";

/// What the process holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Held {
    bytes: isize,
    blocks: isize,
    threads: usize,
    fds: usize,
    shared_mappings: usize,
}

fn held() -> Held {
    let count = |dir: &str| std::fs::read_dir(dir).expect(dir).count();
    let shared_mappings = std::fs::read_to_string("/proc/self/maps")
        .expect("/proc/self/maps")
        .lines()
        .filter(|l| l.contains("memfd:") || l.contains("/dev/shm/"))
        .count();
    let threads = count("/proc/self/task");
    let fds = count("/proc/self/fd");
    Held {
        bytes: LIVE_BYTES.load(Ordering::Relaxed),
        blocks: LIVE_BLOCKS.load(Ordering::Relaxed),
        threads,
        fds,
        shared_mappings,
    }
}

/// An in-place f32 sum all-reduce of every rank (one thread driving all, in a group), checked.
fn all_reduce_checked(buffers: &[RankBuffer]) {
    let n = buffers.len();
    check(symmGroupStart(), null_mut());
    for (rank, b) in buffers.iter().enumerate() {
        let values: Vec<f32> = (0..COUNT).map(|i| (rank + i % 5) as f32).collect();
        // SAFETY: the window holds COUNT f32; no collective is running.
        unsafe { write_f32(b.base, &values) };
        check(all_reduce_f32_sum(b.comm, b.base, b.base, COUNT), b.comm);
    }
    check(symmGroupEnd(), null_mut());
    for b in buffers {
        // SAFETY: as above; the group has completed.
        let got = unsafe { read_f32(b.base, COUNT) };
        for (i, v) in got.iter().enumerate() {
            let want = (0..n).map(|r| (r + i % 5) as f32).sum::<f32>();
            assert_eq!(*v, want, "element {i}");
        }
    }
}

fn init_all_round() {
    let comms = init_all(4);
    let buffers = alloc_windows(&comms, COUNT * 4);
    all_reduce_checked(&buffers);
    teardown(buffers);
}

fn new_id() -> symmUniqueId {
    let mut id = symmUniqueId {
        internal: [0; SYMM_UNIQUE_ID_BYTES],
    };
    // SAFETY: valid out-pointer.
    check(unsafe { symmGetUniqueId(&mut id) }, null_mut());
    id
}

fn unique_id_round() {
    let comms = join_threads(new_id(), 3);
    let buffers = alloc_windows(&comms, COUNT * 4);
    all_reduce_checked(&buffers);
    teardown(buffers);
}

/// One rank of a two-process communicator: join, all-reduce (in place, sum of `rank + 1`),
/// check, tear down.
fn process_rank(id: symmUniqueId, rank: usize) {
    let mut comm = null_mut();
    // SAFETY: valid out-pointer.
    check(
        unsafe { symmCommInitRank(&mut comm, 2, id, rank as i32) },
        null_mut(),
    );
    let mut buffers = alloc(&[comm], COUNT * 4);
    register_all(&mut buffers);
    let b = &buffers[0];
    // SAFETY: the window holds COUNT f32; no collective is running.
    unsafe { write_f32(b.base, &vec![(rank + 1) as f32; COUNT]) };
    check(all_reduce_f32_sum(comm, b.base, b.base, COUNT), comm);
    // SAFETY: as above; the all-reduce has completed.
    let got = unsafe { read_f32(b.base, COUNT) };
    assert!(got.iter().all(|v| *v == 3.0), "all-reduce across processes");
    teardown(buffers);
}

fn processes_round() {
    let id = new_id();
    let child = Command::new(std::env::current_exe().expect("this test binary"))
        .args(["--ignored", "--exact", "child_rank", "--nocapture"])
        .env("SYMM_BACKEND", "host")
        .env("SYMM_BOOTSTRAP_TIMEOUT_MS", "60000")
        .env(CHILD_ENV, id_to_hex(&id))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting the rank process");
    process_rank(id, 0);
    let output = child.wait_with_output().expect("the rank process");
    assert!(
        output.status.success(),
        "rank 1:\n{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// Register every rank's allocation in a group, rank 0's at base + 4 (so `bytes` must leave
/// room): the group's end refuses the registration on every rank.
fn refused_misaligned_registration(buffers: &[RankBuffer], bytes: usize) {
    check(symmGroupStart(), null_mut());
    for (rank, b) in buffers.iter().enumerate() {
        let mut win = null_mut();
        // SAFETY: [base + 4, base + 4 + bytes) lies inside the allocation; valid out-pointer.
        let r = unsafe {
            symmCommWindowRegister(
                b.comm,
                b.base.add(if rank == 0 { 4 } else { 0 }).cast(),
                bytes,
                &mut win,
                SYMM_WIN_COLL_SYMMETRIC,
            )
        };
        check(r, b.comm);
    }
    assert_eq!(symmGroupEnd(), symmResult_t::symmInvalidArgument);
}

/// A registration refused for a misaligned base leaves nothing behind: on ranks of one
/// process (which then register aligned windows and all-reduce), and through the bootstrap
/// (where the communicator refuses later registrations: freed and destroyed).
fn misaligned_round() {
    let comms = init_all(2);
    let mut buffers = alloc(&comms, COUNT * 4 + 64);
    refused_misaligned_registration(&buffers, COUNT * 4);
    register_all(&mut buffers);
    all_reduce_checked(&buffers);
    teardown(buffers);

    let comms = join_threads(new_id(), 2);
    let buffers = alloc(&comms, COUNT * 4 + 64);
    refused_misaligned_registration(&buffers, COUNT * 4);
    for b in buffers {
        check(symmMemFree(b.comm, b.base.cast()), b.comm);
        check(symmCommDestroy(b.comm), null_mut());
    }
}

fn every_scenario() {
    init_all_round();
    unique_id_round();
    processes_round();
    misaligned_round();
}

/// Wait (bounded) until the process runs no more threads and holds no more descriptors than
/// `start`: bootstrap roots end by themselves, shortly after their ranks left.
fn settled(start: Held) -> Held {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let now = held();
        if (now.threads <= start.threads && now.fds <= start.fds) || Instant::now() > deadline {
            return now;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn destroy_leaves_no_memory_thread_descriptor_or_mapping() {
    use_host_backend();
    let start = held();
    every_scenario();
    let baseline = settled(start);
    assert_eq!(
        (baseline.threads, baseline.fds, baseline.shared_mappings),
        (start.threads, start.fds, start.shared_mappings),
        "threads, descriptors or mappings left by the first round"
    );
    for _ in 0..ROUNDS {
        every_scenario();
    }
    let now = settled(start);
    assert_eq!(
        (now.threads, now.fds, now.shared_mappings),
        (baseline.threads, baseline.fds, baseline.shared_mappings),
        "threads, descriptors or mappings held after {ROUNDS} more rounds"
    );
    // The heap may differ by what a finished bootstrap root keeps until the next one starts;
    // anything kept per round (a communicator, a window, a pad, a message) exceeds the slack
    // after ROUNDS rounds.
    assert!(
        now.bytes <= baseline.bytes + SLACK_BYTES && now.blocks <= baseline.blocks + SLACK_BLOCKS,
        "heap grew over {ROUNDS} rounds: {baseline:?} -> {now:?}"
    );
}

/// Rank 1 of `processes_round`, in a child process.
#[test]
#[ignore = "child process of destroy_leaves_no_memory_thread_descriptor_or_mapping"]
fn child_rank() {
    let id = id_from_hex(&std::env::var(CHILD_ENV).expect("run by the leak test"));
    process_rank(id, 1);
}
