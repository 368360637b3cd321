//! Fused launches through the C ABI on the host backend: a group's collectives of one
//! (collective, operator, data type) run as one launch per device (see the group module of the `symm` crate, `fusion.rs`).
//!
//! Batches of 1 to 256 tasks with mixed counts (0 included), offsets, two windows per rank and
//! in-place tasks, for every collective and a data type of each width (1, 2, 4 and 8 bytes),
//! checked exactly against references computed here and bitwise equal across ranks; the
//! launch counter proves one launch per (tuple, device) per group; unfused calls on the same
//! windows afterwards (in a group of one, and one thread per rank without a group) prove that
//! a fused launch leaves every window's barrier epochs and LL call numbers in agreement.
//! Broadcasts with mixed roots fuse when the group drives every rank, and are fences when
//! ranks are driven by separate threads (only the root's thread knows what they read).

use std::ffi::c_void;
use std::sync::Arc;
use symm::internals::Comm;
use symm::*;
use symm_tests::*;

/// Bytes of each of a rank's two windows.
const WINDOW: usize = 1 << 20;

#[derive(Clone, Copy, Debug, PartialEq)]
enum Kind {
    AllReduce,
    AllGather,
    ReduceScatter,
    Broadcast,
}

impl Kind {
    /// Bytes of one rank's send and receive buffers for `bytes` per rank of payload (the
    /// collective's count in bytes) among `nranks` ranks.
    fn buffer_bytes(self, bytes: usize, nranks: usize) -> (usize, usize) {
        match self {
            Kind::AllReduce | Kind::Broadcast => (bytes, bytes),
            Kind::AllGather => (bytes, nranks * bytes),
            Kind::ReduceScatter => (nranks * bytes, bytes),
        }
    }
}

/// A data type with an exact reference: values are small integers, encoded per type.
#[derive(Clone, Copy, Debug)]
struct Type {
    dtype: symmDataType_t,
    op: symmRedOp_t,
}

impl Type {
    fn size(self) -> usize {
        match self.dtype {
            symmDataType_t::symmUint8 | symmDataType_t::symmInt8 => 1,
            symmDataType_t::symmBfloat16 => 2,
            symmDataType_t::symmInt32 => 4,
            symmDataType_t::symmFloat64 => 8,
            other => panic!("no reference for {other:?}"),
        }
    }

    /// The input value of element `index` of `rank`'s send buffer of task `task` (small, so
    /// that sums are exact in every type).
    fn value(self, rank: usize, task: usize, index: usize) -> i64 {
        let mix = (rank as i64 * 7919 + task as i64 * 104_729 + index as i64 * 31) % 61;
        match self.dtype {
            symmDataType_t::symmBfloat16 => mix % 31 - 15,
            symmDataType_t::symmFloat64 => mix * 1001 - 30_000,
            _ => mix * 5 - 100,
        }
    }

    fn combine(self, a: i64, b: i64) -> i64 {
        match self.op {
            symmRedOp_t::symmSum => a + b,
            symmRedOp_t::symmMax => a.max(b),
            other => panic!("no reference for {other:?}"),
        }
    }

    fn encode(self, v: i64) -> Vec<u8> {
        match self.dtype {
            symmDataType_t::symmUint8 | symmDataType_t::symmInt8 => vec![v as u8],
            // Integers of up to 8 significant bits are exact in bfloat16 (the top half of an
            // f32).
            symmDataType_t::symmBfloat16 => {
                (((v as f32).to_bits() >> 16) as u16).to_le_bytes().to_vec()
            }
            symmDataType_t::symmInt32 => (v as i32).to_le_bytes().to_vec(),
            symmDataType_t::symmFloat64 => (v as f64).to_le_bytes().to_vec(),
            other => panic!("no reference for {other:?}"),
        }
    }
}

const TYPES: [Type; 4] = [
    Type {
        dtype: symmDataType_t::symmUint8,
        op: symmRedOp_t::symmSum,
    },
    Type {
        dtype: symmDataType_t::symmBfloat16,
        op: symmRedOp_t::symmSum,
    },
    Type {
        dtype: symmDataType_t::symmInt32,
        op: symmRedOp_t::symmMax,
    },
    Type {
        dtype: symmDataType_t::symmFloat64,
        op: symmRedOp_t::symmSum,
    },
];

/// Every rank's two windows.
struct World {
    comms: Vec<symmComm_t>,
    /// `windows[w][rank]`.
    windows: [Vec<RankBuffer>; 2],
}

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

    fn nranks(&self) -> usize {
        self.comms.len()
    }

    fn at(&self, place: Place, rank: usize) -> *mut u8 {
        assert!(place.offset + place.bytes <= WINDOW);
        // SAFETY: inside the window's allocation (checked).
        unsafe { self.windows[place.window][rank].base.add(place.offset) }
    }

    fn write(&self, place: Place, rank: usize, at: usize, bytes: &[u8]) {
        assert!(at + bytes.len() <= place.bytes);
        // SAFETY: inside the region (checked), host memory, no collective running.
        unsafe {
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.at(place, rank).add(at), bytes.len())
        };
    }

    fn read(&self, place: Place, rank: usize) -> Vec<u8> {
        // SAFETY: inside the window (checked by `at`), host memory, no collective running.
        unsafe { std::slice::from_raw_parts(self.at(place, rank), place.bytes) }.to_vec()
    }

    fn launches(&self) -> Vec<u64> {
        self.comms
            .iter()
            .map(|&c| Comm::from_handle(c).unwrap().launch_count())
            .collect()
    }

    fn teardown(self) {
        for window in self.windows {
            for b in window {
                check(symmCommWindowDeregister(b.comm, b.window), b.comm);
                check(symmMemFree(b.comm, b.base.cast()), b.comm);
            }
        }
        for c in self.comms {
            check(symmCommDestroy(c), std::ptr::null_mut());
        }
    }
}

/// A region of one window, at the same offset on every rank.
#[derive(Clone, Copy, Debug)]
struct Place {
    window: usize,
    offset: usize,
    bytes: usize,
}

/// Bump allocation of symmetric regions in the two windows.
struct Layout {
    next: [usize; 2],
}

impl Layout {
    fn new() -> Layout {
        Layout { next: [0, 0] }
    }

    /// `bytes` in `window` at a multiple of `align` plus a random number of elements, so that
    /// buffers are sometimes 16-byte aligned and sometimes not.
    fn take(&mut self, rng: &mut Rng, window: usize, bytes: usize, align: usize) -> Place {
        let skip = if rng.next_u64().is_multiple_of(2) {
            0
        } else {
            (rng.next_u64() % 7) as usize * align
        };
        let offset = self.next[window].next_multiple_of(16) + skip;
        self.next[window] = offset + bytes;
        Place {
            window,
            offset,
            bytes,
        }
    }
}

/// One collective of a batch, as every rank calls it.
#[derive(Clone, Copy, Debug)]
struct Call {
    kind: Kind,
    ty: Type,
    count: usize,
    in_place: bool,
    /// Send buffer (in place: unused; the receive region holds it).
    send: Place,
    /// Receive buffer.
    recv: Place,
    /// Index of the call's inputs.
    id: usize,
    /// The broadcast's root (0 for the others).
    root: usize,
}

impl Call {
    /// A call with random count (0 included), windows, offsets and placement.
    fn random(
        rng: &mut Rng,
        layout: &mut Layout,
        kind: Kind,
        ty: Type,
        nranks: usize,
        id: usize,
        max_count: usize,
    ) -> Call {
        let count = match rng.next_u64() % 8 {
            0 => 0,
            1 => 1,
            2 => (rng.next_u64() % 20) as usize,
            _ => (rng.next_u64() % max_count as u64) as usize,
        };
        let size = ty.size();
        let bytes = count * size;
        let (send_bytes, recv_bytes) = kind.buffer_bytes(bytes, nranks);
        let root = if kind == Kind::Broadcast {
            (rng.next_u64() % nranks as u64) as usize
        } else {
            0
        };
        let in_place = rng.next_u64().is_multiple_of(3);
        let recv_window = (rng.next_u64() % 2) as usize;
        let send_window = (rng.next_u64() % 2) as usize;
        let (send, recv) = if in_place {
            // The whole buffer; the share is the rank's segment of it (all-reduce: itself).
            let whole = layout.take(rng, recv_window, send_bytes.max(recv_bytes), size);
            (whole, whole)
        } else {
            (
                layout.take(rng, send_window, send_bytes, size),
                layout.take(rng, recv_window, recv_bytes, size),
            )
        };
        Call {
            kind,
            ty,
            count,
            in_place,
            send,
            recv,
            id,
            root,
        }
    }

    /// Where rank `rank`'s send data lies: `(region, byte offset in it, bytes)`.
    fn send_of(&self, rank: usize, nranks: usize) -> (Place, usize, usize) {
        let bytes = self.count * self.ty.size();
        match (self.kind, self.in_place) {
            (Kind::AllGather, true) => (self.recv, rank * bytes, bytes),
            (Kind::ReduceScatter, _) => (self.send, 0, nranks * bytes),
            _ => (self.send, 0, bytes),
        }
    }

    /// Fill rank `rank`'s send data and poison the rest of its receive buffer.
    fn prepare(&self, world: &World, rank: usize) {
        let nranks = world.nranks();
        if !self.in_place {
            world.write(self.recv, rank, 0, &vec![0xA5; self.recv.bytes]);
        }
        let (place, at, bytes) = self.send_of(rank, nranks);
        let data: Vec<u8> = (0..bytes / self.ty.size())
            .flat_map(|i| self.ty.encode(self.ty.value(rank, self.id, i)))
            .collect();
        world.write(place, rank, at, &data);
    }

    fn call(&self, world: &World, rank: usize) -> symmResult_t {
        let comm = world.comms[rank];
        let bytes = self.count * self.ty.size();
        let recv = world.at(self.recv, rank) as *mut c_void;
        let (dtype, op) = (self.ty.dtype as i32, self.ty.op as i32);
        let null = std::ptr::null_mut();
        match (self.kind, self.in_place) {
            (Kind::AllReduce, true) => symmAllReduce(recv, recv, self.count, dtype, op, comm, null),
            (Kind::AllReduce, false) => {
                let send = world.at(self.send, rank) as *const c_void;
                symmAllReduce(send, recv, self.count, dtype, op, comm, null)
            }
            (Kind::AllGather, in_place) => {
                let send = if in_place {
                    // SAFETY: this rank's segment of the receive region.
                    unsafe { (recv as *mut u8).add(rank * bytes) as *const c_void }
                } else {
                    world.at(self.send, rank) as *const c_void
                };
                symmAllGather(send, recv, self.count, dtype, comm, null)
            }
            (Kind::Broadcast, in_place) => {
                let send = if in_place {
                    recv as *const c_void
                } else if rank != self.root && self.id % 2 == 1 {
                    // Ignored off the root: NULL is fine there.
                    std::ptr::null()
                } else {
                    world.at(self.send, rank) as *const c_void
                };
                symmBroadcast(send, recv, self.count, dtype, self.root as i32, comm, null)
            }
            (Kind::ReduceScatter, in_place) => {
                let send = world.at(self.send, rank);
                let recv = if in_place {
                    // SAFETY: this rank's segment of the send region.
                    unsafe { send.add(rank * bytes) as *mut c_void }
                } else {
                    recv
                };
                symmReduceScatter(
                    send as *const c_void,
                    recv,
                    self.count,
                    dtype,
                    op,
                    comm,
                    null,
                )
            }
        }
    }

    /// The exact result rank `rank` must hold: `(region, byte offset, bytes)`.
    fn expected(&self, rank: usize, nranks: usize) -> (Place, usize, Vec<u8>) {
        let ty = self.ty;
        let reduce = |index: usize| {
            (1..nranks).fold(ty.value(0, self.id, index), |acc, r| {
                ty.combine(acc, ty.value(r, self.id, index))
            })
        };
        match self.kind {
            Kind::AllReduce => {
                let data = (0..self.count).flat_map(|i| ty.encode(reduce(i))).collect();
                (self.recv, 0, data)
            }
            Kind::Broadcast => {
                let data = (0..self.count)
                    .flat_map(|i| ty.encode(ty.value(self.root, self.id, i)))
                    .collect();
                (self.recv, 0, data)
            }
            Kind::AllGather => {
                let data = (0..nranks)
                    .flat_map(|r| (0..self.count).map(move |i| (r, i)))
                    .flat_map(|(r, i)| ty.encode(ty.value(r, self.id, i)))
                    .collect();
                (self.recv, 0, data)
            }
            Kind::ReduceScatter => {
                let data = (0..self.count)
                    .flat_map(|i| ty.encode(reduce(rank * self.count + i)))
                    .collect();
                let at = if self.in_place {
                    rank * self.count * ty.size()
                } else {
                    0
                };
                (self.recv, at, data)
            }
        }
    }

    #[track_caller]
    fn check(&self, world: &World, what: &str) {
        let nranks = world.nranks();
        for rank in 0..nranks {
            let (place, at, expected) = self.expected(rank, nranks);
            let got = world.read(place, rank);
            let got = &got[at..at + expected.len()];
            if got != expected {
                let first = (0..expected.len())
                    .find(|&i| got[i] != expected[i])
                    .unwrap();
                panic!(
                    "{what}: {self:?}, rank {rank}: byte {first} is {:#04x}, expected {:#04x}",
                    got[first], expected[first]
                );
            }
        }
    }
}

/// Run `calls` in one group driven by this thread (every rank makes every call in order);
/// returns the launches each rank made.
fn run_group(world: &World, calls: &[Call]) -> Vec<u64> {
    for call in calls {
        for rank in 0..world.nranks() {
            call.prepare(world, rank);
        }
    }
    let before = world.launches();
    check(symmGroupStart(), std::ptr::null_mut());
    for call in calls {
        for rank in 0..world.nranks() {
            check(call.call(world, rank), world.comms[rank]);
        }
    }
    check(symmGroupEnd(), std::ptr::null_mut());
    world
        .launches()
        .iter()
        .zip(before)
        .map(|(after, before)| after - before)
        .collect()
}

/// Run `calls` in one group per rank, each driven by its own thread (every rank makes every
/// call in order); returns the launches each rank made.
fn run_group_per_thread(world: &World, calls: &[Call]) -> Vec<u64> {
    for call in calls {
        for rank in 0..world.nranks() {
            call.prepare(world, rank);
        }
    }
    issue_group_per_thread(world, calls)
}

/// [`run_group_per_thread`] without preparing the calls' buffers.
fn issue_group_per_thread(world: &World, calls: &[Call]) -> Vec<u64> {
    let before = world.launches();
    std::thread::scope(|scope| {
        for rank in 0..world.nranks() {
            scope.spawn(move || {
                let comm = world.comms[rank];
                check(symmGroupStart(), std::ptr::null_mut());
                for call in calls {
                    check(call.call(world, rank), comm);
                }
                check(symmGroupEnd(), comm);
            });
        }
    });
    world
        .launches()
        .iter()
        .zip(before)
        .map(|(after, before)| after - before)
        .collect()
}

/// Run `call` without a group: one thread per rank.
fn run_threads(world: &World, call: &Call) {
    for rank in 0..world.nranks() {
        call.prepare(world, rank);
    }
    std::thread::scope(|scope| {
        for rank in 0..world.nranks() {
            let comm = world.comms[rank] as usize;
            scope.spawn(move || {
                let result = call.call(world, rank);
                check(result, comm as symmComm_t);
            });
        }
    });
}

// SAFETY: the raw handles and host pointers of `World` are used by one thread per rank at a
// time (the library validates handles and serializes per-communicator state).
unsafe impl Sync for World {}

/// One fused batch of `tasks` calls of `kind` and `ty`, then unfused calls on the same
/// windows.
fn fused_batch_then_unfused(nranks: usize, kind: Kind, ty: Type, tasks: usize, seed: u64) {
    fused_batch_then(nranks, kind, ty, tasks, seed, &[5, 3000, 1], true);
}

/// One fused batch (one launch when `one_launch`, else at least one), then unfused calls of
/// `unfused` elements on the same windows.
fn fused_batch_then(
    nranks: usize,
    kind: Kind,
    ty: Type,
    tasks: usize,
    seed: u64,
    unfused: &[usize],
    one_launch: bool,
) {
    let world = World::new(nranks);
    let mut rng = Rng(seed);
    // Keep every batch inside the windows: 256 tasks of up to ~600 elements of 8 bytes, times
    // the ranks, spread over two windows.
    let max_count = (WINDOW / 2 / (tasks * nranks * ty.size() + 1)).clamp(2, 600);
    let mut layout = Layout::new();
    let calls: Vec<Call> = (0..tasks)
        .map(|id| Call::random(&mut rng, &mut layout, kind, ty, nranks, id, max_count))
        .collect();
    let what = format!("{nranks} ranks, {kind:?} {ty:?}, {tasks} tasks, seed {seed:#x}");
    let launches = run_group(&world, &calls);
    let expected = u64::from(calls.iter().any(|c| c.count > 0));
    if one_launch {
        assert_eq!(
            launches,
            vec![expected; nranks],
            "{what}: launches per rank of one fused group"
        );
    } else {
        assert!(launches.iter().all(|l| *l == launches[0] && *l >= expected));
    }
    for call in &calls {
        call.check(&world, &what);
    }
    // Unfused calls on the same windows: in a group of one (all ranks one launch), and one
    // thread per rank without a group, small (LL) and larger (barrier kernels).
    let mut layout = Layout::new();
    for (i, &count) in unfused.iter().enumerate() {
        let mut call = Call::random(&mut rng, &mut layout, kind, ty, nranks, 1000 + i, 2);
        call.count = count;
        let size = ty.size();
        let whole = nranks * count * size;
        call.send = Place {
            window: 0,
            offset: 64,
            bytes: whole,
        };
        call.recv = Place {
            window: 1,
            offset: 128 + 8 * size,
            bytes: whole,
        };
        call.in_place = false;
        let launches = run_group(&world, &[call]);
        assert_eq!(launches, vec![1; nranks], "{what}: one call, one launch");
        call.check(&world, &format!("{what}, then a group of one ({count})"));
        call.id += 10;
        call.send.window = 1;
        call.recv.window = 0;
        run_threads(&world, &call);
        call.check(
            &world,
            &format!("{what}, then one thread per rank ({count})"),
        );
    }
    world.teardown();
}

#[test]
fn fused_all_reduce_every_width() {
    for (i, ty) in TYPES.into_iter().enumerate() {
        for (nranks, tasks) in [(2, 1), (3, 7), (4, 64), (2, 256)] {
            fused_batch_then_unfused(nranks, Kind::AllReduce, ty, tasks, 0xA11 + i as u64);
        }
    }
}

#[test]
fn fused_all_gather_every_width() {
    for (i, ty) in TYPES.into_iter().enumerate() {
        for (nranks, tasks) in [(2, 1), (4, 9), (3, 64), (2, 256)] {
            fused_batch_then_unfused(nranks, Kind::AllGather, ty, tasks, 0xA6 + i as u64);
        }
    }
}

#[test]
fn fused_reduce_scatter_every_width() {
    for (i, ty) in TYPES.into_iter().enumerate() {
        for (nranks, tasks) in [(2, 1), (4, 5), (3, 64), (2, 256)] {
            fused_batch_then_unfused(nranks, Kind::ReduceScatter, ty, tasks, 0x55 + i as u64);
        }
    }
}

#[test]
fn fused_broadcast_every_width_mixed_roots() {
    for (i, ty) in TYPES.into_iter().enumerate() {
        for (nranks, tasks) in [(2, 1), (5, 9), (3, 64), (8, 40), (2, 256)] {
            fused_batch_then_unfused(nranks, Kind::Broadcast, ty, tasks, 0xB0 + i as u64);
        }
    }
}

/// A group mixing tuples: one launch per tuple per rank, and every result exact.
#[test]
fn mixed_tuples_one_launch_each_in_call_order() {
    let world = World::new(3);
    let mut rng = Rng(0x31);
    let mut layout = Layout::new();
    let plan = [
        (Kind::AllReduce, TYPES[3]),
        (Kind::Broadcast, TYPES[1]),
        (Kind::AllGather, TYPES[0]),
        (Kind::AllReduce, TYPES[3]),
        (Kind::ReduceScatter, TYPES[2]),
        (Kind::AllReduce, TYPES[1]),
        (Kind::AllGather, TYPES[0]),
        (Kind::AllReduce, TYPES[3]),
        (Kind::ReduceScatter, TYPES[2]),
        (Kind::Broadcast, TYPES[1]),
    ];
    let mut calls: Vec<Call> = plan
        .iter()
        .enumerate()
        .map(|(id, (kind, ty))| Call::random(&mut rng, &mut layout, *kind, *ty, 3, id, 300))
        .collect();
    for call in &mut calls {
        call.count = call.count.max(1);
        let size = call.ty.size();
        let (send_bytes, recv_bytes) = call.kind.buffer_bytes(call.count * size, 3);
        call.send = layout.take(&mut rng, 0, send_bytes, size);
        call.recv = if call.in_place {
            call.send = layout.take(&mut rng, 1, send_bytes.max(recv_bytes), size);
            call.send
        } else {
            layout.take(&mut rng, 1, recv_bytes, size)
        };
    }
    // Tuples: all-reduce f64 sum, broadcast (bf16), all-gather (u8), reduce-scatter i32 max,
    // all-reduce bf16.
    let launches = run_group(&world, &calls);
    assert_eq!(launches, vec![5; 3]);
    for call in &calls {
        call.check(&world, "mixed tuples");
    }
    world.teardown();
}

/// Rank 0 makes `plan`'s calls (kind, type, count) in a group, rank 1 the same calls one by one.
/// The group's calls of one kind fuse into one launch, which a peer that makes them one by one
/// does not pair with: the communicator fails on both ranks with the mismatch (a documented
/// limit), found by the call agreement — never a hang, and never another call's data. Returns
/// rank 1's last error.
fn group_against_one_by_one(plan: &[(Kind, Type, usize)]) -> String {
    let world = World::new(2);
    let mut rng = Rng(0x32);
    let mut layout = Layout::new();
    let calls: Vec<Call> = plan
        .iter()
        .enumerate()
        .map(|(id, (kind, ty, count))| {
            let mut call = Call::random(&mut rng, &mut layout, *kind, *ty, 2, id, 1);
            let size = call.ty.size();
            call.count = *count;
            call.in_place = false;
            let (send_bytes, recv_bytes) = call.kind.buffer_bytes(call.count * size, 2);
            call.send = layout.take(&mut rng, 0, send_bytes, size);
            call.recv = layout.take(&mut rng, 1, recv_bytes, size);
            call
        })
        .collect();
    for call in &calls {
        for rank in 0..2 {
            call.prepare(&world, rank);
        }
    }
    let (shared, calls) = (&world, &calls);
    let started = std::time::Instant::now();
    let (grouped, one_by_one) = std::thread::scope(|scope| {
        let grouped = scope.spawn(move || {
            check(symmGroupStart(), std::ptr::null_mut());
            for call in calls {
                let _ = call.call(shared, 0);
            }
            symmGroupEnd()
        });
        let one_by_one = scope.spawn(move || {
            calls
                .iter()
                .map(|call| call.call(shared, 1))
                .collect::<Vec<_>>()
        });
        (grouped.join().unwrap(), one_by_one.join().unwrap())
    });
    assert_ne!(grouped, symmResult_t::symmSuccess);
    assert!(one_by_one.iter().any(|r| *r != symmResult_t::symmSuccess));
    for rank in 0..2 {
        let mut state = symmResult_t::symmSuccess;
        // SAFETY: a live communicator and a valid out-pointer.
        unsafe { symmCommGetAsyncError(world.comms[rank], &mut state) };
        assert_ne!(state, symmResult_t::symmSuccess, "rank {rank}");
    }
    // Found by the call agreement, not by a timeout.
    assert!(started.elapsed() < std::time::Duration::from_secs(5));
    let message = last_error(world.comms[1]);
    world.teardown();
    message
}

/// See [`group_against_one_by_one`]: fusion moves the second all-reduce ahead of the
/// all-gather (the calls differ by number), and the first all-reduce is the first of a fused
/// launch of two.
#[test]
fn a_rank_grouping_calls_its_peer_makes_one_by_one_fails_the_communicator() {
    let message = group_against_one_by_one(&[
        (Kind::AllReduce, TYPES[3], 37),
        (Kind::AllGather, TYPES[0], 9),
        (Kind::AllReduce, TYPES[3], 12),
    ]);
    assert!(message.contains("group them alike"), "{message}");
}

/// See [`group_against_one_by_one`]: the same calls in the same order, but rank 0's two
/// all-reduces are one fused launch (one LL call on the window where rank 1 makes two). The
/// place in the launch is part of what the ranks compare.
#[test]
fn a_fused_launch_does_not_pair_with_the_same_calls_made_one_by_one() {
    let message = group_against_one_by_one(&[
        (Kind::AllReduce, TYPES[3], 37),
        (Kind::AllReduce, TYPES[3], 12),
    ]);
    assert!(
        message.contains("fused into one launch in a group"),
        "{message}"
    );
}

/// A call that reads what an earlier call of the same tuple writes is not fused with it (it
/// would run concurrently): two launches, and the second sees the first's result.
#[test]
fn dependent_calls_of_one_tuple_keep_their_order() {
    let world = World::new(2);
    let ty = TYPES[3];
    let count = 100;
    let bytes = count * ty.size();
    let x = Place {
        window: 0,
        offset: 0,
        bytes,
    };
    let y = Place {
        window: 1,
        offset: 4096,
        bytes,
    };
    let z = Place {
        window: 0,
        offset: 8192,
        bytes,
    };
    let independent = Place {
        window: 1,
        offset: 16384,
        bytes,
    };
    for rank in 0..2 {
        let data: Vec<u8> = (0..count)
            .flat_map(|i| ty.encode(ty.value(rank, 0, i)))
            .collect();
        world.write(x, rank, 0, &data);
        world.write(independent, rank, 0, &data);
    }
    let before = world.launches();
    check(symmGroupStart(), std::ptr::null_mut());
    for rank in 0..2 {
        let comm = world.comms[rank];
        let (dt, op) = (ty.dtype as i32, ty.op as i32);
        let at = |p: Place| world.at(p, rank) as *mut c_void;
        let null = std::ptr::null_mut();
        check(symmAllReduce(at(x), at(y), count, dt, op, comm, null), comm);
        // Independent of the first: fuses with it.
        check(
            symmAllReduce(at(independent), at(independent), count, dt, op, comm, null),
            comm,
        );
        // Reads y, which the first writes: a second launch.
        check(symmAllReduce(at(y), at(z), count, dt, op, comm, null), comm);
    }
    check(symmGroupEnd(), std::ptr::null_mut());
    let after = world.launches();
    assert_eq!(
        after
            .iter()
            .zip(&before)
            .map(|(a, b)| a - b)
            .collect::<Vec<_>>(),
        vec![2, 2]
    );
    let sum = |i: usize| ty.value(0, 0, i) + ty.value(1, 0, i);
    for rank in 0..2 {
        let z_expected: Vec<u8> = (0..count).flat_map(|i| ty.encode(2 * sum(i))).collect();
        let y_expected: Vec<u8> = (0..count).flat_map(|i| ty.encode(sum(i))).collect();
        assert_eq!(world.read(z, rank), z_expected, "rank {rank}: z = 2 · sum");
        assert_eq!(world.read(y, rank), y_expected, "rank {rank}: y = sum");
        assert_eq!(world.read(independent, rank), y_expected, "rank {rank}");
    }
    world.teardown();
}

/// Broadcasts of one group that depend on each other through the root's send buffer (which
/// only the root's part shows) keep their order; independent ones fuse. B1 (root 1) sends x
/// into y; B2 (root 2) is in place elsewhere; B3 (root 0) sends y, which B1 writes, into z;
/// B4 (root 0) is in place on x, which B1 reads on its root. Launches: [B1, B2], [B3, B4].
#[test]
fn broadcasts_that_read_an_earlier_result_keep_their_order() {
    let nranks = 3;
    let world = World::new(nranks);
    let ty = TYPES[1];
    let count = 300;
    let bytes = count * ty.size();
    let place = |window, offset| Place {
        window,
        offset,
        bytes,
    };
    let (x, y, z, w) = (place(0, 0), place(1, 4096), place(0, 8192), place(1, 16384));
    let call = |id, root, send, recv, in_place| Call {
        kind: Kind::Broadcast,
        ty,
        count,
        in_place,
        send,
        recv,
        id,
        root,
    };
    let calls = [
        call(1, 1, x, y, false),
        call(2, 2, w, w, true),
        call(3, 0, y, z, false),
        call(4, 0, x, x, true),
    ];
    // Preparing the calls in order leaves B2's inputs in w, B3's in y and B4's in x (B1's
    // inputs in x are overwritten by B4's): rank r's x holds `data(r, 4)`.
    let launches = run_group(&world, &calls);
    assert_eq!(launches, vec![2; nranks]);
    let data = |rank: usize, id: usize| -> Vec<u8> {
        (0..count)
            .flat_map(|i| ty.encode(ty.value(rank, id, i)))
            .collect()
    };
    for rank in 0..nranks {
        // Before B4 overwrote rank 1's x with rank 0's.
        assert_eq!(
            world.read(y, rank),
            data(1, 4),
            "rank {rank}: y = rank 1's x"
        );
        // After B1 wrote y (not rank 0's stale y, `data(0, 3)`).
        assert_eq!(
            world.read(z, rank),
            data(1, 4),
            "rank {rank}: z = y, after B1"
        );
        assert_eq!(
            world.read(w, rank),
            data(2, 2),
            "rank {rank}: w = rank 2's w"
        );
        assert_eq!(
            world.read(x, rank),
            data(0, 4),
            "rank {rank}: x = rank 0's x"
        );
    }
    world.teardown();
}

/// Ranks driven by separate threads, each in its own group: a thread that does not drive a
/// broadcast's root cannot see what it reads, so every broadcast is a fence (its own launch,
/// nothing moves across it) on every rank alike, and every result is exact. One thread
/// driving every rank fuses the same calls into one launch.
#[test]
fn broadcasts_of_separately_driven_ranks_are_fences() {
    let nranks = 3;
    let world = World::new(nranks);
    let ty = TYPES[2];
    let mut rng = Rng(0xFE);
    let mut layout = Layout::new();
    let calls: Vec<Call> = (0..6)
        .map(|id| {
            let mut call =
                Call::random(&mut rng, &mut layout, Kind::Broadcast, ty, nranks, id, 400);
            call.count = call.count.max(1);
            call.root = id % nranks;
            let bytes = call.count * ty.size();
            call.send = layout.take(&mut rng, 0, bytes, ty.size());
            call.recv = if call.in_place {
                call.send
            } else {
                layout.take(&mut rng, 1, bytes, ty.size())
            };
            call
        })
        .collect();
    let launches = run_group_per_thread(&world, &calls);
    assert_eq!(launches, vec![calls.len() as u64; nranks]);
    for call in &calls {
        call.check(&world, "one thread per rank");
    }
    let launches = run_group(&world, &calls);
    assert_eq!(launches, vec![1; nranks]);
    for call in &calls {
        call.check(&world, "one thread for every rank");
    }
    world.teardown();
}

/// The case the fence is for: B1 (root 0) sends x into y, B2 (root 1) sends w into x, in
/// groups driven by one thread per rank. Only rank 0's thread sees that B2 overwrites what B1
/// reads; a thread that fused the two would run B2's stores into rank 0's x while rank 0 reads
/// it, and pair its one launch with rank 0's two. As fences, both run alone on every rank, in
/// call order.
#[test]
fn separately_driven_ranks_keep_a_broadcast_before_one_that_overwrites_its_source() {
    let nranks = 3;
    let world = World::new(nranks);
    let ty = TYPES[3];
    let count = 2000;
    let bytes = count * ty.size();
    let place = |window, offset| Place {
        window,
        offset,
        bytes,
    };
    let (x, y, w) = (place(0, 0), place(1, 0), place(1, 32768));
    let call = |id, root, send, recv| Call {
        kind: Kind::Broadcast,
        ty,
        count,
        in_place: false,
        send,
        recv,
        id,
        root,
    };
    let calls = [call(1, 0, x, y), call(2, 1, w, x)];
    let data = |rank: usize, id: usize| -> Vec<u8> {
        (0..count)
            .flat_map(|i| ty.encode(ty.value(rank, id, i)))
            .collect()
    };
    for round in 0..3 {
        for rank in 0..nranks {
            for call in &calls {
                call.prepare(&world, rank);
            }
            // B2's preparation poisoned x, B1's source: B1's inputs again.
            world.write(x, rank, 0, &data(rank, 1));
        }
        let launches = issue_group_per_thread(&world, &calls);
        assert_eq!(launches, vec![2; nranks], "round {round}");
        for rank in 0..nranks {
            assert_eq!(
                world.read(y, rank),
                data(0, 1),
                "round {round}, rank {rank}: y"
            );
            assert_eq!(
                world.read(x, rank),
                data(1, 2),
                "round {round}, rank {rank}: x"
            );
        }
    }
    world.teardown();
}

/// `Arc` keeps the comm handle alive across the counter's reads.
#[test]
fn the_launch_counter_counts_unfused_calls_too() {
    let world = World::new(2);
    let comm: Arc<Comm> = Comm::from_handle(world.comms[0]).unwrap();
    let before = comm.launch_count();
    let ty = TYPES[2];
    let call = Call {
        kind: Kind::AllReduce,
        ty,
        count: 10,
        in_place: true,
        send: Place {
            window: 0,
            offset: 0,
            bytes: 40,
        },
        recv: Place {
            window: 0,
            offset: 0,
            bytes: 40,
        },
        id: 0,
        root: 0,
    };
    for _ in 0..3 {
        run_threads(&world, &call);
    }
    assert_eq!(comm.launch_count() - before, 3);
    drop(comm);
    world.teardown();
}

/// Fused batches with the all-reduce algorithm forced (`SYMM_ALGO`, read when a communicator
/// is created): run in a child process with the variable set (see
/// [`forced_algorithms_run_fused_batches`]).
#[test]
#[ignore = "run by forced_algorithms_run_fused_batches with SYMM_ALGO set"]
fn child_fused_all_reduce_with_forced_algorithm() {
    let ll = std::env::var("SYMM_ALGO").is_ok_and(|a| a == "ll");
    for (i, ty) in TYPES.into_iter().enumerate() {
        for (nranks, tasks) in [(2, 64), (4, 17), (3, 2)] {
            // LL may split a batch that would not fit its buffers.
            let unfused: &[usize] = if ll { &[5, 1] } else { &[5, 3000] };
            let seed = 0xF0 + i as u64 + tasks as u64;
            fused_batch_then(nranks, Kind::AllReduce, ty, tasks, seed, unfused, !ll);
        }
    }
}

/// Fused and single calls with the blocks bounded (`SYMM_MIN_BLOCKS`, `SYMM_MAX_BLOCKS`, read
/// when a communicator is created): run in a child process with the variables set (see
/// [`block_bounds_set_every_grid`]).
#[test]
#[ignore = "run by block_bounds_set_every_grid with SYMM_MIN_BLOCKS / SYMM_MAX_BLOCKS set"]
fn child_calls_with_bounded_blocks() {
    for kind in [Kind::AllReduce, Kind::AllGather] {
        fused_batch_then(3, kind, TYPES[0], 17, 0xB10C, &[5, 3000], true);
    }
}

#[test]
fn block_bounds_set_every_grid() {
    // The host backend lets a rank use 2 blocks; its model picks 1 for small calls and 2 for
    // large ones. A bound past the cap is lowered to it.
    for (min, max, blocks) in [("2", "", 2), ("", "1", 1), ("5", "", 2), ("1", "1", 1)] {
        let output = rerun_ignored_test(
            "child_calls_with_bounded_blocks",
            &[("SYMM_MIN_BLOCKS", min), ("SYMM_MAX_BLOCKS", max)],
        );
        let log = String::from_utf8_lossy(&output.stderr);
        let stdout = String::from_utf8_lossy(&output.stdout);
        let setting = format!("SYMM_MIN_BLOCKS={min:?} SYMM_MAX_BLOCKS={max:?}");
        assert!(output.status.success(), "{setting}:\n{stdout}\n{log}");
        assert!(
            stdout.contains("1 passed"),
            "{setting}: the child ran nothing"
        );
        let launches: Vec<&str> = log
            .lines()
            .filter(|l| l.contains("symm INFO launch: "))
            .collect();
        assert!(launches.len() >= 4, "{setting}: launches:\n{log}");
        let grid = format!(", {blocks} blocks x ");
        for line in launches {
            assert!(line.contains(&grid), "{setting}: {line}");
        }
    }
}

#[test]
fn forced_algorithms_run_fused_batches() {
    for (algo, kernel) in [
        ("twoshot", "kernel symm_two_shot_all_reduce_"),
        ("oneshot", "kernel symm_one_shot_all_reduce_"),
        ("ll", "kernel symm_one_shot_ll_all_reduce_"),
    ] {
        let output = rerun_ignored_test(
            "child_fused_all_reduce_with_forced_algorithm",
            &[("SYMM_ALGO", algo)],
        );
        let log = String::from_utf8_lossy(&output.stderr);
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(
            output.status.success(),
            "SYMM_ALGO={algo}:\n{stdout}\n{log}"
        );
        assert!(
            stdout.contains("1 passed"),
            "SYMM_ALGO={algo}: the child ran nothing"
        );
        // One line per launch: collective, tasks fused, bytes, kernel, blocks, threads,
        // predicted time.
        let fused: Vec<&str> = log
            .lines()
            .filter(|l| l.contains("symm INFO launch: all_reduce of 17 task(s)"))
            .collect();
        assert!(
            !fused.is_empty(),
            "SYMM_ALGO={algo}: no fused launch logged:\n{log}"
        );
        for line in fused {
            assert!(line.contains(kernel), "SYMM_ALGO={algo}: {line}");
            assert!(
                line.contains(" B per rank") && line.contains(" blocks x "),
                "{line}"
            );
            assert!(line.contains(" threads, predicted "), "{line}");
        }
    }
}

/// A group of all-gathers and reduce-scatters with PAT forced (`SYMM_ALGO=pat`): the PAT
/// kernels run one task per launch, so each call with elements is its own launch, in call
/// order, and every result is exact; then unfused calls on the same windows. Run in a child
/// process with the variable set (see [`symm_algo_pat_runs_each_call_of_a_group_alone`]).
#[test]
#[ignore = "run by symm_algo_pat_runs_each_call_of_a_group_alone with SYMM_ALGO=pat"]
fn child_group_with_pat_forced() {
    for (i, ty) in TYPES.into_iter().enumerate() {
        for kind in [Kind::AllGather, Kind::ReduceScatter] {
            for (nranks, tasks) in [(3, 9), (5, 4), (2, 17)] {
                let seed = 0x9A7 + i as u64 + tasks as u64;
                fused_batch_then(nranks, kind, ty, tasks, seed, &[5, 3000], false);
                let world = World::new(nranks);
                let mut rng = Rng(seed);
                let mut layout = Layout::new();
                let calls: Vec<Call> = (0..tasks)
                    .map(|id| Call::random(&mut rng, &mut layout, kind, ty, nranks, id, 300))
                    .collect();
                let launches = run_group(&world, &calls);
                let with_elements = calls.iter().filter(|c| c.count > 0).count() as u64;
                let what = format!("{nranks} ranks, {kind:?} {ty:?}, {tasks} calls, PAT");
                assert_eq!(launches, vec![with_elements; nranks], "{what}: launches");
                for call in &calls {
                    call.check(&world, &what);
                }
                world.teardown();
            }
        }
    }
}

#[test]
fn symm_algo_pat_runs_each_call_of_a_group_alone() {
    let output = rerun_ignored_test("child_group_with_pat_forced", &[("SYMM_ALGO", "pat")]);
    let log = String::from_utf8_lossy(&output.stderr);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout}\n{log}");
    assert!(stdout.contains("1 passed"), "the child ran nothing");
    let launches: Vec<&str> = log
        .lines()
        .filter(|l| {
            l.contains("symm INFO launch: all_gather")
                || l.contains("symm INFO launch: reduce_scatter")
        })
        .collect();
    assert!(!launches.is_empty(), "no launch logged:\n{log}");
    for line in launches {
        assert!(line.contains(" of 1 task(s)"), "{line}");
        assert!(
            line.contains("kernel symm_pat_all_gather")
                || line.contains("kernel symm_pat_reduce_scatter_"),
            "{line}"
        );
    }
}
