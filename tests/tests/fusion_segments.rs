//! Fused batches of all-to-all, gather and scatter on the host backend, against a sequential
//! reference of every byte of two windows per rank: independent calls of one kind fuse into
//! one launch (mixed roots, task 0 in place, buffers spread over both windows), dependent ones
//! keep their order, and where a thread drives a single rank the gathers and scatters fence
//! (only the root's thread knows what the root reads or writes) while all-to-alls still fuse.

use symm::internals::Comm;
use symm::*;
use symm_tests::*;

const WINDOW: usize = 1 << 16;

#[derive(Clone, Copy, Debug, PartialEq)]
enum Coll {
    AllToAll,
    Gather,
    Scatter,
}

#[derive(Clone, Copy, Debug)]
struct Call {
    coll: Coll,
    /// Elements per segment.
    count: usize,
    dtype: symmDataType_t,
    root: usize,
    /// (window, offset) of the send buffer; `send_shift * rank` is added to the offset.
    send: (usize, usize),
    send_shift: usize,
    recv: (usize, usize),
    recv_shift: usize,
}

impl Call {
    fn size(&self) -> usize {
        match self.dtype {
            symmDataType_t::symmUint8 => 1,
            symmDataType_t::symmFloat32 => 4,
            symmDataType_t::symmFloat64 => 8,
            _ => unreachable!(),
        }
    }
    fn send_at(&self, rank: usize) -> (usize, usize) {
        (self.send.0, self.send.1 + self.send_shift * rank)
    }
    fn recv_at(&self, rank: usize) -> (usize, usize) {
        (self.recv.0, self.recv.1 + self.recv_shift * rank)
    }
}

struct World {
    comms: Vec<symmComm_t>,
    windows: [Vec<RankBuffer>; 2],
}
// SAFETY: the handles are used by one thread per rank at a time (the library's rule); the
// windows' memory is only read or written between calls.
unsafe impl Sync for World {}

impl World {
    fn new(nranks: usize) -> World {
        use_host_backend();
        let comms = init_all(nranks);
        let mut a = alloc(&comms, WINDOW);
        let mut b = alloc(&comms, WINDOW);
        check(symmGroupStart(), std::ptr::null_mut());
        register_in_group(&mut a);
        register_in_group(&mut b);
        check(symmGroupEnd(), std::ptr::null_mut());
        World {
            comms,
            windows: [a, b],
        }
    }
    fn ptr(&self, rank: usize, (w, off): (usize, usize)) -> *mut u8 {
        self.windows[w][rank].base.wrapping_add(off)
    }
    fn snapshot(&self) -> Vec<[Vec<u8>; 2]> {
        (0..self.comms.len())
            .map(|r| {
                // SAFETY: host memory of the window, WINDOW bytes; no call is in flight.
                [0, 1].map(|w| unsafe {
                    std::slice::from_raw_parts(self.windows[w][r].base, WINDOW).to_vec()
                })
            })
            .collect()
    }
    fn fill(&self, seed: u64) {
        let mut rng = Rng(seed);
        for w in 0..2 {
            for r in 0..self.comms.len() {
                let bytes: Vec<u8> = (0..WINDOW).map(|_| rng.next_u64() as u8).collect();
                // SAFETY: host memory of the window, WINDOW bytes; no call is in flight.
                unsafe {
                    std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.windows[w][r].base, WINDOW)
                };
            }
        }
    }
    fn launches(&self) -> Vec<u64> {
        self.comms
            .iter()
            .map(|&c| Comm::from_handle(c).unwrap().launch_count())
            .collect()
    }
    fn issue(&self, call: &Call, rank: usize) -> symmResult_t {
        let comm = self.comms[rank];
        let s = self.ptr(rank, call.send_at(rank));
        let d = self.ptr(rank, call.recv_at(rank));
        let null = std::ptr::null_mut();
        match call.coll {
            Coll::AllToAll => symmAlltoAll(
                s.cast(),
                d.cast(),
                call.count,
                call.dtype as i32,
                comm,
                null,
            ),
            Coll::Gather => symmGather(
                s.cast(),
                if rank == call.root {
                    d.cast()
                } else {
                    std::ptr::null_mut()
                },
                call.count,
                call.dtype as i32,
                call.root as i32,
                comm,
                null,
            ),
            Coll::Scatter => symmScatter(
                if rank == call.root {
                    s.cast()
                } else {
                    std::ptr::null()
                },
                d.cast(),
                call.count,
                call.dtype as i32,
                call.root as i32,
                comm,
                null,
            ),
        }
    }
}

/// Sequential reference of `call` on `state`.
fn reference(state: &mut [[Vec<u8>; 2]], call: &Call) {
    let n = state.len();
    let b = call.count * call.size();
    let old: Vec<[Vec<u8>; 2]> = state.to_vec();
    match call.coll {
        Coll::AllToAll => {
            for p in 0..n {
                for r in 0..n {
                    let (sw, so) = call.send_at(r);
                    let (rw, ro) = call.recv_at(p);
                    let src = old[r][sw][so + p * b..so + p * b + b].to_vec();
                    state[p][rw][ro + r * b..ro + r * b + b].copy_from_slice(&src);
                }
            }
        }
        Coll::Gather => {
            for r in 0..n {
                let (sw, so) = call.send_at(r);
                let (rw, ro) = call.recv_at(call.root);
                let src = old[r][sw][so..so + b].to_vec();
                state[call.root][rw][ro + r * b..ro + r * b + b].copy_from_slice(&src);
            }
        }
        Coll::Scatter => {
            for p in 0..n {
                let (sw, so) = call.send_at(call.root);
                let (rw, ro) = call.recv_at(p);
                let src = old[call.root][sw][so + p * b..so + p * b + b].to_vec();
                state[p][rw][ro..ro + b].copy_from_slice(&src);
            }
        }
    }
}

fn compare(world: &World, want: &[[Vec<u8>; 2]], what: &str) {
    let got = world.snapshot();
    for r in 0..want.len() {
        for w in 0..2 {
            if let Some(at) = (0..WINDOW).find(|&i| got[r][w][i] != want[r][w][i]) {
                panic!(
                    "{what}: rank {r} window {w} byte {at}: {} vs {}",
                    got[r][w][at], want[r][w][at]
                );
            }
        }
    }
}

fn run_one_group(world: &World, calls: &[Call], seed: u64, what: &str) -> Vec<u64> {
    world.fill(seed);
    let mut want = world.snapshot();
    for c in calls {
        reference(&mut want, c);
    }
    let before = world.launches();
    check(symmGroupStart(), std::ptr::null_mut());
    for c in calls {
        for r in 0..world.comms.len() {
            check(world.issue(c, r), world.comms[r]);
        }
    }
    check(symmGroupEnd(), std::ptr::null_mut());
    compare(world, &want, what);
    world
        .launches()
        .iter()
        .zip(before)
        .map(|(a, b)| a - b)
        .collect()
}

fn run_per_thread_groups(world: &World, calls: &[Call], seed: u64, what: &str) -> Vec<u64> {
    world.fill(seed);
    let mut want = world.snapshot();
    for c in calls {
        reference(&mut want, c);
    }
    let before = world.launches();
    std::thread::scope(|scope| {
        for rank in 0..world.comms.len() {
            scope.spawn(move || {
                let comm = world.comms[rank];
                check(symmGroupStart(), std::ptr::null_mut());
                for c in calls {
                    check(world.issue(c, rank), comm);
                }
                check(symmGroupEnd(), comm);
            });
        }
    });
    compare(world, &want, what);
    world
        .launches()
        .iter()
        .zip(before)
        .map(|(a, b)| a - b)
        .collect()
}

fn run_threads_unfused(world: &World, calls: &[Call], seed: u64, what: &str) {
    world.fill(seed);
    let mut want = world.snapshot();
    for c in calls {
        reference(&mut want, c);
    }
    std::thread::scope(|scope| {
        for rank in 0..world.comms.len() {
            scope.spawn(move || {
                for c in calls {
                    check(world.issue(c, rank), world.comms[rank]);
                }
            });
        }
    });
    compare(world, &want, what);
}

fn c(
    coll: Coll,
    count: usize,
    dtype: symmDataType_t,
    root: usize,
    send: (usize, usize),
    recv: (usize, usize),
) -> Call {
    Call {
        coll,
        count,
        dtype,
        root,
        send,
        send_shift: 0,
        recv,
        recv_shift: 0,
    }
}

const U8: symmDataType_t = symmDataType_t::symmUint8;

/// Independent fused calls of each kind, mixed roots, task 0 in place on its root, buffers
/// spread over both windows; then unfused calls on the same windows.
#[test]
fn fused_independent_batches() {
    let n = 3;
    let world = World::new(n);
    // Gathers: task 0 root 2 in place (send = recv + 2*b) in window 1; others out of place.
    // Task 0 in place on its root (send = recv + root × count), in window 1.
    let g0 = c(Coll::Gather, 37, U8, 2, (1, 400 + 2 * 37), (1, 400));
    let g1 = Call {
        recv_shift: 8,
        ..c(Coll::Gather, 1500, U8, 0, (0, 0), (1, 4096))
    };
    let g2 = c(Coll::Gather, 3, U8, 1, (0, 8192), (0, 9000));
    let gathers = vec![g0, g1, g2];
    assert_eq!(run_one_group(&world, &gathers, 1, "fused gathers"), [1; 3]);
    // A thread per rank: each gather is a fence (its own launch).
    assert_eq!(
        run_per_thread_groups(&world, &gathers, 2, "per-thread gathers"),
        [3; 3]
    );
    // Scatters: task 0 root 1 in place.
    let s0 = c(Coll::Scatter, 37, U8, 1, (1, 200), (1, 200 + 37));
    let s1 = Call {
        send_shift: 16,
        ..c(Coll::Scatter, 1500, U8, 0, (0, 100), (1, 20000))
    };
    let s2 = c(Coll::Scatter, 5, U8, 2, (0, 30000), (0, 40000));
    let scatters = [s0, s1, s2];
    assert_eq!(
        run_one_group(&world, &scatters, 3, "fused scatters"),
        [1; 3]
    );
    assert_eq!(
        run_per_thread_groups(&world, &scatters, 4, "per-thread scatters"),
        [3; 3]
    );
    // All-to-alls, send at per-rank offsets.
    let a0 = Call {
        send_shift: 24,
        ..c(Coll::AllToAll, 37, U8, 0, (1, 0), (0, 1000))
    };
    let a1 = c(Coll::AllToAll, 1100, U8, 0, (0, 5000), (1, 20000));
    let a2 = c(Coll::AllToAll, 3, U8, 0, (1, 40000), (1, 41000));
    let a2as = [a0, a1, a2];
    assert_eq!(run_one_group(&world, &a2as, 5, "fused a2a"), [1; 3]);
    // Every rank knows what an all-to-all reads and writes: they fuse a thread per rank too.
    assert_eq!(
        run_per_thread_groups(&world, &a2as, 6, "per-thread a2a"),
        [1; 3]
    );
    // Then unfused, one thread per rank, on the same windows.
    let mut all = gathers.clone();
    all.extend(scatters);
    all.extend(a2as);
    run_threads_unfused(&world, &all, 7, "unfused after");
    // One launch per kind.
    assert_eq!(run_one_group(&world, &all, 8, "mixed group"), [3; 3]);
}

/// Dependent calls of one kind in one group: the second reads what the first wrote.
#[test]
fn fused_dependent_calls_keep_their_order() {
    let n = 3;
    let world = World::new(n);
    // G1 root 0 gathers W0:0 into root 0's W0:4096.. ; G2 root 1 gathers W0:4096 (rank 0's was
    // written by G1) into root 1's W1:0.
    let g1 = c(Coll::Gather, 16, U8, 0, (0, 0), (0, 4096));
    let g2 = c(Coll::Gather, 16, U8, 1, (0, 4096), (1, 0));
    assert_eq!(
        run_one_group(&world, &[g1, g2], 11, "dependent gathers"),
        [2; 3]
    );
    assert_eq!(
        run_per_thread_groups(&world, &[g1, g2], 12, "dependent gathers per thread"),
        [2; 3]
    );
    // G3 root 1 writes root 1's W0:0.. which G1 (earlier) reads on rank 1 (WAR).
    let g3 = c(Coll::Gather, 16, U8, 1, (1, 100), (0, 0));
    assert_eq!(run_one_group(&world, &[g1, g3], 13, "WAR gathers"), [2; 3]);
    assert_eq!(
        run_per_thread_groups(&world, &[g1, g3], 14, "WAR gathers per thread"),
        [2; 3]
    );
    // Scatters: S1 root 0 writes every rank's W0:0..16; S2 root 2 reads root 2's W0:0..48.
    let s1 = c(Coll::Scatter, 16, U8, 0, (1, 0), (0, 0));
    let s2 = c(Coll::Scatter, 16, U8, 2, (0, 0), (1, 4096));
    assert_eq!(
        run_one_group(&world, &[s1, s2], 15, "dependent scatters"),
        [2; 3]
    );
    assert_eq!(
        run_per_thread_groups(&world, &[s1, s2], 16, "dependent scatters per thread"),
        [2; 3]
    );
    // All-to-alls: A2 reads (send, rank-local, per-rank shifted) what A1 wrote.
    let a1 = c(Coll::AllToAll, 16, U8, 0, (1, 0), (0, 0));
    let a2 = Call {
        send_shift: 0,
        ..c(Coll::AllToAll, 16, U8, 0, (0, 0), (1, 4096))
    };
    assert_eq!(
        run_one_group(&world, &[a1, a2], 17, "dependent a2a"),
        [2; 3]
    );
    assert_eq!(
        run_per_thread_groups(&world, &[a1, a2], 18, "dependent a2a per thread"),
        [2; 3]
    );
}
