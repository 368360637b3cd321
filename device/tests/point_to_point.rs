//! Send and receive (`symmetric::point_to_point`) on the host backend's emulated grids: rings
//! in both directions, several sends to one peer in one launch, every rank count from 1 to 5,
//! counts with odd tails and on several channels, one grid for every rank and one grid per
//! rank, sequences across the u32 wrap; and the receiver's refusals (sizes, data types,
//! unknown windows, ranges outside the window), each naming the sender.

mod harness;

use harness::{Ranks, Rng};
use symm_device::symmetric::dispatch::kernel;
use symm_device::symmetric::point_to_point::{
    ABORT_P2P_REFUSED, PeerTask, RefusalReason, assign_ordinals, refused_peer,
};
use symm_device::symmetric::{Algorithm, KernelStatus, TaskArgs, timed_out_peer};
use symm_device::sync::p2p::{RegionLayout, WindowTable, pair_region_bytes, ring_bytes};
use symm_device::{DataType, RedOp};

const TIMEOUT_NS: u64 = 20_000_000_000;
/// The registration number of the data windows in the tests.
const WINDOW: u64 = 5;

/// `world` ranks with a data window of `bytes` each and the point-to-point window, the data
/// window entered in every rank's window table.
struct World {
    data: Box<Ranks>,
    pairs: Box<Ranks>,
}

impl World {
    fn new(world: usize, bytes: usize, timeout_ns: u64) -> World {
        let data = Ranks::new(world, bytes, timeout_ns);
        let mut pairs = Ranks::new(world, pair_region_bytes(world as u32) as usize, timeout_ns);
        let layout = RegionLayout::new(world as u32);
        for rank in 0..world {
            let entry = [WINDOW + 1, data.context_address(rank) as u64];
            pairs.write(rank, layout.window_table() as usize, &entry);
        }
        World { data, pairs }
    }

    /// Plant every sequence word of every pair and channel at `value` (as after `value`
    /// messages on each).
    fn set_sequences(&mut self, value: u32) {
        let world = self.data.world() as u32;
        let layout = RegionLayout::new(world);
        for rank in 0..world as usize {
            for peer in 0..world {
                for channel in 0..symm_device::sync::p2p::CHANNELS {
                    for offset in [
                        layout.posted(peer, channel),
                        layout.done(peer, channel),
                        layout.sent(peer, channel),
                        layout.received(peer, channel),
                        layout.filled(peer, channel),
                        layout.drained(peer, channel),
                        layout.fills(peer, channel),
                        layout.drains(peer, channel),
                    ] {
                        self.pairs.write(rank, offset as usize, &[value]);
                    }
                }
            }
        }
    }

    /// A send (or receive) task of `rank` with `peer`: `bytes` of `datatype` at `offset` of
    /// its data window.
    fn task(&self, rank: usize, send: bool, peer: usize, offset: usize, bytes: usize) -> TaskArgs {
        PeerTask {
            send,
            peer: peer as u32,
            datatype: DataType::Uint8 as u32,
            bytes: bytes as u64,
            buffer_context: self.data.context_address(rank) as u64,
            offset: offset as u64,
            window: WINDOW,
            pairs_context: self.pairs.context_address(rank) as u64,
            slot: peer as u32,
            ordinals: 0,
            staged_address: 0,
            piece: 0,
        }
        .to_args()
    }

    /// A task of `rank` with `peer` whose buffer lies outside the windows, at `address`: a
    /// receive writes it directly; a send goes through its `ring`, `(offset, piece)`: pieces of
    /// `piece` bytes at that offset of the rank's data window (standing in for its staging
    /// window).
    fn staged_task(
        &self,
        rank: usize,
        send: bool,
        peer: usize,
        address: *const u8,
        bytes: usize,
        ring: Option<(usize, u64)>,
    ) -> TaskArgs {
        let (ring_at, piece) = ring.unwrap_or((0, 0));
        let buffer = if send { &self.data } else { &self.pairs };
        PeerTask {
            send,
            peer: peer as u32,
            datatype: DataType::Uint8 as u32,
            bytes: bytes as u64,
            buffer_context: buffer.context_address(rank) as u64,
            offset: if send { ring_at as u64 } else { 0 },
            window: WINDOW,
            pairs_context: self.pairs.context_address(rank) as u64,
            slot: peer as u32,
            ordinals: 0,
            staged_address: address as u64,
            piece: if send { piece } else { 0 },
        }
        .to_args()
    }

    /// Run every rank's `tasks[r]` (padded with nothing: every rank has the same count) in one
    /// grid of `blocks` blocks per rank.
    fn launch_together(
        &self,
        tasks: &[Vec<TaskArgs>],
        blocks: u32,
        threads: u32,
    ) -> Vec<KernelStatus> {
        let tasks = numbered(tasks);
        let count = tasks[0].len();
        assert!(tasks.iter().all(|t| t.len() == count));
        let table: Vec<TaskArgs> = tasks.iter().flatten().copied().collect();
        let body = kernel(Algorithm::SendReceive, DataType::Uint8, RedOp::Sum);
        self.data
            .run_table(&table, count as u32, body, blocks, threads)
    }

    /// [`World::launch_together`] or [`World::launch_apart`], on a `(blocks, threads)` grid.
    fn launch(
        &self,
        tasks: &[Vec<TaskArgs>],
        (blocks, threads): (u32, u32),
        together: bool,
    ) -> Vec<KernelStatus> {
        if together {
            self.launch_together(tasks, blocks, threads)
        } else {
            self.launch_apart(tasks, blocks, threads)
        }
    }

    /// Run every rank's tasks in a grid of its own, the grids concurrently (one thread per
    /// rank, each launching its own kernel).
    fn launch_apart(
        &self,
        tasks: &[Vec<TaskArgs>],
        blocks: u32,
        threads: u32,
    ) -> Vec<KernelStatus> {
        let tasks = &numbered(tasks);
        let body = kernel(Algorithm::SendReceive, DataType::Uint8, RedOp::Sum);
        std::thread::scope(|scope| {
            let handles: Vec<_> = tasks
                .iter()
                .map(|table| {
                    scope.spawn(move || {
                        self.data
                            .run_table(table, table.len() as u32, body, blocks, threads)[0]
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        })
    }
}

/// Bytes of a message: empty, one, odd tails around 16 bytes and 1 KiB, and past one, two and
/// three channels' worth.
const COUNTS: [usize; 8] = [0, 1, 7, 1023, 1040, 70_001, 140_000, 300_017];

fn fill(world: &mut World, ranks: usize, bytes: usize, rng: &mut Rng) -> Vec<Vec<u8>> {
    (0..ranks)
        .map(|rank| {
            let data: Vec<u8> = (0..bytes).map(|_| rng.next_u64() as u8).collect();
            world.data.write(rank, 0, &data);
            data
        })
        .collect()
}

/// Every rank sends `count` bytes to each rank `shift` ahead and receives from each rank
/// `shift` behind, for every shift in `shifts` (in that order), in one launch (together or
/// apart); the receive buffers are checked byte for byte, and every other byte of the windows
/// is unchanged.
fn ring(
    world_size: usize,
    count: usize,
    shifts: &[usize],
    together: bool,
    grid: (u32, u32),
    seed: u64,
) {
    let n = shifts.len();
    // Layout: the send buffers (one per shift) at 16-byte boundaries plus a lead of 3, then
    // the receive buffers.
    let lead = 3;
    let stride = count.next_multiple_of(16) + 16;
    let send_at = |k: usize| lead + k * stride;
    let recv_at = |k: usize| lead + (n + k) * stride + 5;
    let bytes = lead + 2 * n * stride + 32;
    let mut world = World::new(world_size, bytes, TIMEOUT_NS);
    let mut rng = Rng(seed);
    let before = fill(&mut world, world_size, bytes, &mut rng);
    let tasks: Vec<Vec<TaskArgs>> = (0..world_size)
        .map(|rank| {
            let mut tasks = Vec::new();
            for (k, shift) in shifts.iter().enumerate() {
                let to = (rank + shift) % world_size;
                let from = (rank + world_size - shift % world_size) % world_size;
                tasks.push(world.task(rank, true, to, send_at(k), count));
                tasks.push(world.task(rank, false, from, recv_at(k), count));
            }
            tasks
        })
        .collect();
    let statuses = world.launch(&tasks, grid, together);
    let case = format!(
        "world {world_size} count {count} shifts {shifts:?} together {together} grid {grid:?}"
    );
    assert!(
        statuses.iter().all(|s| *s == KernelStatus::Completed),
        "{case}: {statuses:?}, abort words {:x?}",
        (0..world_size)
            .map(|r| world.pairs.abort_word(r))
            .collect::<Vec<_>>()
    );
    for rank in 0..world_size {
        let mut want = before[rank].clone();
        for (k, shift) in shifts.iter().enumerate() {
            let from = (rank + world_size - shift % world_size) % world_size;
            want[recv_at(k)..recv_at(k) + count]
                .copy_from_slice(&before[from][send_at(k)..send_at(k) + count]);
        }
        let got: Vec<u8> = world.data.read(rank, 0, bytes);
        if let Some(at) = (0..bytes).find(|&i| got[i] != want[i]) {
            panic!(
                "{case}: rank {rank}, byte {at}: {} instead of {}",
                got[at], want[at]
            );
        }
    }
}

#[test]
fn rings_in_both_directions_for_1_to_5_ranks() {
    let mut seed = 0;
    for world in 1..=5 {
        for count in COUNTS {
            for (together, grid) in [(true, (1, 1)), (false, (3, 4)), (true, (5, 8))] {
                seed += 1;
                ring(world, count, &[1, world - 1], together, grid, seed);
            }
        }
    }
}

/// Several sends to one peer in one launch (as many as a channel has slots), as
/// `batch_isend_irecv` makes them: they pair in order.
#[test]
fn several_sends_to_one_peer_pair_in_order() {
    let slots = symm_device::sync::p2p::SLOTS as usize;
    for world in [2, 3] {
        for count in [5, 1040, 70_001] {
            ring(
                world,
                count,
                &vec![1; slots],
                false,
                (2, 4),
                77 + count as u64,
            );
            ring(
                world,
                count,
                &vec![1; slots],
                true,
                (1, 1),
                78 + count as u64,
            );
        }
    }
}

/// One launch of `case` ([`Staged`]): every rank sends `count` bytes to each rank `shift` ahead
/// and receives from each rank `shift` behind, for every shift; bit `2k` of `staged` puts the
/// sends of shift `k` outside the windows (through rings of `piece`-byte pieces), bit `2k + 1`
/// its receives.
/// Every received byte is checked, and every other byte of the windows and of the ranks' own
/// memory but the rings is unchanged.
fn ring_through_staging(case: &Staged<'_>, seed: u64) {
    staged_launches(case, None, 1, seed);
}

/// One case of [`ring_through_staging`].
struct Staged<'a> {
    world_size: usize,
    count: usize,
    shifts: &'a [usize],
    piece: u64,
    staged: u32,
    together: bool,
    grid: (u32, u32),
}

/// `launches` launches of `case` on one world, each with new data, its sequence and ring
/// counts first planted at `counts` (when given).
fn staged_launches(case: &Staged<'_>, counts: Option<u32>, launches: usize, seed: u64) {
    let Staged {
        world_size,
        count,
        shifts,
        piece,
        staged,
        together,
        grid,
    } = *case;
    let n = shifts.len();
    let stride = count.next_multiple_of(16) + 16;
    let send_at = |k: usize| 3 + k * stride;
    let recv_at = |k: usize| 3 + (n + k) * stride + 5;
    let ring_size = ring_bytes(count as u64, piece) as usize;
    let rings_at = (3 + 2 * n * stride).next_multiple_of(256);
    let ring_at = |k: usize| rings_at + k * ring_size;
    let bytes = rings_at + n * ring_size + 32;
    let send_staged = |k: usize| staged >> (2 * k) & 1 == 1;
    let recv_staged = |k: usize| staged >> (2 * k + 1) & 1 == 1;
    let mut world = World::new(world_size, bytes, TIMEOUT_NS);
    if let Some(counts) = counts {
        world.set_sequences(counts);
    }
    let mut rng = Rng(seed);
    for launch in 0..launches {
        let before = fill(&mut world, world_size, bytes, &mut rng);
        // Each rank's own memory: its staged sends' data, then its staged receives.
        let mut own: Vec<Vec<u8>> = (0..world_size)
            .map(|_| (0..2 * n * stride).map(|_| rng.next_u64() as u8).collect())
            .collect();
        let own_before = own.clone();
        let sent = |rank: usize, k: usize, own: &[Vec<u8>]| -> Vec<u8> {
            if send_staged(k) {
                own[rank][send_at(k)..send_at(k) + count].to_vec()
            } else {
                before[rank][send_at(k)..send_at(k) + count].to_vec()
            }
        };
        let tasks: Vec<Vec<TaskArgs>> = (0..world_size)
            .map(|rank| {
                let mut tasks = Vec::new();
                let base = own[rank].as_mut_ptr();
                for (k, shift) in shifts.iter().enumerate() {
                    let to = (rank + shift) % world_size;
                    let from = (rank + world_size - shift % world_size) % world_size;
                    tasks.push(if send_staged(k) {
                        // SAFETY: inside the rank's own memory.
                        let at = unsafe { base.add(send_at(k)) };
                        world.staged_task(rank, true, to, at, count, Some((ring_at(k), piece)))
                    } else {
                        world.task(rank, true, to, send_at(k), count)
                    });
                    tasks.push(if recv_staged(k) {
                        // SAFETY: as above.
                        let at = unsafe { base.add(recv_at(k)) };
                        world.staged_task(rank, false, from, at, count, None)
                    } else {
                        world.task(rank, false, from, recv_at(k), count)
                    });
                }
                tasks
            })
            .collect();
        let statuses = world.launch(&tasks, grid, together);
        let case = format!(
            "world {world_size} count {count} shifts {shifts:?} piece {piece} staged {staged:b} \
         together {together} grid {grid:?} launch {launch}"
        );
        assert!(
            statuses.iter().all(|s| *s == KernelStatus::Completed),
            "{case}: {statuses:?}, abort words {:x?}",
            (0..world_size)
                .map(|r| world.pairs.abort_word(r))
                .collect::<Vec<_>>()
        );
        for rank in 0..world_size {
            let mut want = before[rank].clone();
            let mut want_own = own_before[rank].clone();
            for (k, shift) in shifts.iter().enumerate() {
                let from = (rank + world_size - shift % world_size) % world_size;
                let message = sent(from, k, &own_before);
                if recv_staged(k) {
                    want_own[recv_at(k)..recv_at(k) + count].copy_from_slice(&message);
                } else {
                    want[recv_at(k)..recv_at(k) + count].copy_from_slice(&message);
                }
            }
            let mut got: Vec<u8> = world.data.read(rank, 0, bytes);
            // The rings hold pieces now.
            got[rings_at..rings_at + n * ring_size]
                .copy_from_slice(&want[rings_at..rings_at + n * ring_size]);
            if let Some(at) = (0..bytes).find(|&i| got[i] != want[i]) {
                panic!(
                    "{case}: rank {rank}, window byte {at}: {} instead of {}",
                    got[at], want[at]
                );
            }
            if let Some(at) = (0..want_own.len()).find(|&i| own[rank][i] != want_own[i]) {
                panic!(
                    "{case}: rank {rank}, own byte {at}: {} instead of {}",
                    own[rank][at], want_own[at]
                );
            }
        }
        own.clear();
    }
}

/// Sends and receives outside the windows: sends through rings of a few pieces and of many
/// (a 300 017-byte message in 256-byte pieces: about 300 per channel), receives written in
/// place, mixed with buffers in windows on either side, for 1 to 4 ranks, several messages
/// per pair and channel (a ring behind a ring, a window send behind a ring).
#[test]
fn messages_outside_the_windows_pass_through_rings_of_any_size() {
    let mut seed = 500;
    for world in 1..=4 {
        for count in [1, 7, 1023, 1040, 70_001, 300_017] {
            for piece in [256, 4096] {
                for (together, grid) in [(true, (1, 1)), (false, (3, 4)), (true, (5, 8))] {
                    seed += 1;
                    let staged = (seed as u32).wrapping_mul(2_654_435_761) >> 8;
                    let case = Staged {
                        world_size: world,
                        count,
                        shifts: &[1, world - 1, 1],
                        piece,
                        staged,
                        together,
                        grid,
                    };
                    ring_through_staging(&case, seed);
                }
            }
        }
    }
    // Every combination of one pair's two sides, on one channel and on four.
    for staged in 0..16 {
        for count in [5000, 262_145] {
            let case = Staged {
                world_size: 2,
                count,
                shifts: &[1, 1],
                piece: 512,
                staged,
                together: false,
                grid: (2, 4),
            };
            ring_through_staging(&case, 900 + staged as u64);
        }
    }
}

/// Ring messages launch after launch on one pair, every count planted just before the u32
/// wrap: sequences and piece counts carry from launch to launch and across the wrap.
#[test]
fn rings_carry_across_launches_and_the_wrap() {
    for (planted, together) in [(u32::MAX - 1, true), (u32::MAX - 300, false)] {
        let case = Staged {
            world_size: 2,
            count: 70_001,
            shifts: &[1, 1, 1],
            piece: 256,
            staged: 0b01_11_01,
            together,
            grid: (2, 4),
        };
        staged_launches(&case, Some(planted), 4, planted as u64);
    }
}

/// Each rank's tasks numbered as the host numbers a launch's (`assign_ordinals`).
fn numbered(tasks: &[Vec<TaskArgs>]) -> Vec<Vec<TaskArgs>> {
    tasks
        .iter()
        .map(|rank| {
            let mut rank = rank.clone();
            assign_ordinals(&mut rank);
            rank
        })
        .collect()
}

/// Every rank runs its own sequence of launches, the ranks concurrently.
fn launch_sequences(
    world: &World,
    sequences: &[Vec<Vec<TaskArgs>>],
    blocks: u32,
) -> Vec<Vec<KernelStatus>> {
    let sequences: Vec<Vec<Vec<TaskArgs>>> = sequences.iter().map(|s| numbered(s)).collect();
    let sequences = &sequences;
    let body = kernel(Algorithm::SendReceive, DataType::Uint8, RedOp::Sum);
    std::thread::scope(|scope| {
        let handles: Vec<_> = sequences
            .iter()
            .map(|launches| {
                scope.spawn(move || {
                    launches
                        .iter()
                        .map(|table| {
                            world
                                .data
                                .run_table(table, table.len() as u32, body, blocks, 4)[0]
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// A launch's receives progress in any order: rank 0 receives from 1 and from 2 in one launch
/// (both owned by one block when it has two), rank 1 receives from 2 before it sends to 0, and
/// rank 2 sends to 0 before it sends to 1, each call its own launch. A block that took its
/// receives one after the other would wait for rank 1's send, which waits for rank 2's second
/// send, which waits for rank 0's second receive. Likewise nine sends to one peer in one launch
/// while the peer receives them one launch at a time, then sends back.
#[test]
fn receives_and_sends_progress_in_any_order() {
    let world = World::new(3, 4096, TIMEOUT_NS);
    let bytes = 64;
    let sequences = vec![
        vec![vec![
            world.task(0, false, 1, 0, bytes),
            world.task(0, false, 2, 512, bytes),
        ]],
        vec![
            vec![world.task(1, false, 2, 0, bytes)],
            vec![world.task(1, true, 0, 1024, bytes)],
        ],
        vec![
            vec![world.task(2, true, 0, 1024, bytes)],
            vec![world.task(2, true, 1, 2048, bytes)],
        ],
    ];
    for blocks in [1, 2, 3] {
        let statuses = launch_sequences(&world, &sequences, blocks);
        assert!(
            statuses
                .iter()
                .flatten()
                .all(|s| *s == KernelStatus::Completed),
            "{blocks} blocks: {statuses:?}"
        );
    }
    let world = World::new(2, 16 * 1024, TIMEOUT_NS);
    let mut first: Vec<TaskArgs> = (0..9).map(|k| world.task(0, true, 1, 64 * k, 64)).collect();
    first.push(world.task(0, false, 1, 8192, 64));
    let mut second: Vec<Vec<TaskArgs>> = (0..9)
        .map(|k| vec![world.task(1, false, 0, 64 * k, 64)])
        .collect();
    second.push(vec![world.task(1, true, 0, 8192, 64)]);
    let statuses = launch_sequences(&world, &[vec![first], second], 2);
    assert!(
        statuses
            .iter()
            .flatten()
            .all(|s| *s == KernelStatus::Completed),
        "{statuses:?}"
    );
}

/// Launch after launch on one pair, across the u32 wrap of every sequence word: the own
/// counters carry the sequence from one launch to the next.
#[test]
fn sequences_carry_across_launches_and_the_wrap() {
    let count: usize = 70_001;
    let bytes = 2 * count.next_multiple_of(16) + 64;
    let mut world = World::new(2, bytes, TIMEOUT_NS);
    world.set_sequences(u32::MAX - 2);
    let mut rng = Rng(9);
    for round in 0..6 {
        let before = fill(&mut world, 2, bytes, &mut rng);
        let recv_at = count.next_multiple_of(16) + 16;
        let tasks = vec![
            vec![
                world.task(0, true, 1, 0, count),
                world.task(0, false, 1, recv_at, count),
            ],
            vec![
                world.task(1, false, 0, recv_at, count),
                world.task(1, true, 0, 0, count),
            ],
        ];
        let statuses = world.launch_apart(&tasks, 2, 4);
        assert!(
            statuses.iter().all(|s| *s == KernelStatus::Completed),
            "round {round}: {statuses:?}"
        );
        for rank in 0..2 {
            let got: Vec<u8> = world.data.read(rank, recv_at, count);
            assert!(
                got == before[1 - rank][..count],
                "round {round}, rank {rank}"
            );
        }
    }
}

/// Run one send from rank 0 and one receive at rank 1 (the sender's task `send`, the
/// receiver's `recv`) with a short timeout; returns both abort words of the point-to-point
/// window.
fn refused_pair(send: TaskArgs, recv: TaskArgs, world: &World) -> (Vec<KernelStatus>, u32, u32) {
    let statuses = world.launch_apart(&[vec![send], vec![recv]], 2, 4);
    (
        statuses,
        world.pairs.abort_word(0),
        world.pairs.abort_word(1),
    )
}

const SHORT_NS: u64 = 300_000_000;

#[test]
fn a_receive_of_another_size_refuses_the_send_naming_it() {
    let mut world = World::new(2, 4096, SHORT_NS);
    let (statuses, sender, receiver) = refused_pair(
        world.task(0, true, 1, 0, 100),
        world.task(1, false, 0, 1024, 200),
        &world,
    );
    assert_eq!(statuses, [KernelStatus::Aborted, KernelStatus::Aborted]);
    assert_eq!(receiver & 0xFF, ABORT_P2P_REFUSED);
    assert_eq!(
        RefusalReason::from_word(receiver),
        Some(RefusalReason::Mismatch)
    );
    assert_eq!(refused_peer(receiver), Some(0));
    // Nothing was stored into the sender's region: its wait for "done" ran out.
    assert_eq!(timed_out_peer(sender), Some(1), "{sender:#x}");
    let untouched: Vec<u8> = world.data.read(1, 1024, 200);
    assert!(untouched.iter().all(|b| *b == 0));
}

#[test]
fn a_receive_of_another_data_type_refuses_the_send() {
    let world = World::new(2, 4096, SHORT_NS);
    let mut send = PeerTask::from_args(&world.task(0, true, 1, 0, 64));
    send.datatype = DataType::Float32 as u32;
    let (_, _, receiver) = refused_pair(send.to_args(), world.task(1, false, 0, 1024, 64), &world);
    assert_eq!(
        RefusalReason::from_word(receiver),
        Some(RefusalReason::Mismatch)
    );
}

#[test]
fn a_send_from_a_window_the_receiver_does_not_know_is_refused() {
    let world = World::new(2, 4096, SHORT_NS);
    let mut send = PeerTask::from_args(&world.task(0, true, 1, 0, 64));
    send.window = WINDOW + 1;
    let (_, _, receiver) = refused_pair(send.to_args(), world.task(1, false, 0, 1024, 64), &world);
    assert_eq!(
        RefusalReason::from_word(receiver),
        Some(RefusalReason::UnknownWindow)
    );
    assert_eq!(refused_peer(receiver), Some(0));
}

#[test]
fn a_send_outside_the_receivers_view_of_the_window_is_refused() {
    let mut world = World::new(2, 4096, SHORT_NS);
    // The receiver's context of the window says it is smaller than the sender's buffer reaches.
    // SAFETY: the address of a live context of the model.
    let real =
        unsafe { *(world.data.context_address(1) as *const symm_device::context::SymmContext) };
    let mut small = symm_device::context::SymmContext {
        window_size: 32,
        ..real
    };
    let layout = RegionLayout::new(2);
    let entry = [WINDOW + 1, &mut small as *mut _ as u64];
    world.pairs.write(
        1,
        (layout.window_table() + WindowTable::entry(0)) as usize,
        &entry,
    );
    let (_, _, receiver) = refused_pair(
        world.task(0, true, 1, 16, 64),
        world.task(1, false, 0, 1024, 64),
        &world,
    );
    assert_eq!(
        RefusalReason::from_word(receiver),
        Some(RefusalReason::OutOfBounds)
    );
}

#[test]
fn a_task_outside_its_window_or_communicator_is_refused_before_anything_moves() {
    let world = World::new(2, 4096, SHORT_NS);
    for task in [
        world.task(0, true, 1, 4000, 200),
        world.task(0, true, 2, 0, 8),
    ] {
        let statuses = world.data.run_table(
            &[task],
            1,
            kernel(Algorithm::SendReceive, DataType::Uint8, RedOp::Sum),
            1,
            4,
        );
        assert_eq!(statuses, [KernelStatus::Aborted]);
        let word = world.pairs.abort_word(0);
        assert_eq!(
            RefusalReason::from_word(word),
            Some(RefusalReason::InvalidTask)
        );
    }
}
