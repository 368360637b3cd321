//! `symmSend` and `symmRecv` with buffers outside every window, through the C ABI: a send
//! through a ring in the communicator's staging window (`plan::peer_staging`), a receive
//! written in place. Batches mixing such buffers and in-window ones on either side of a pair
//! (sends to self included), messages from one element to many times the staging window, in
//! every layout: a thread per rank, one thread driving every rank in a group, a process per
//! rank; every message compared exactly. Ranks that group their calls differently (one rank's
//! group against the other's single calls) pair in call order, staged or not, messages past
//! the window included. Rings that cannot fit the staging window are refused on both ranks at
//! once; the first staged send is said once in the log; `SYMM_STRICT_WINDOWS=1` refuses them;
//! staged calls replay from a CUDA graph.
//!
//! The staging window is small here (`SYMM_STAGING_BYTES`, 64 KiB), so that messages pass it
//! many times over and a batch's refusal is cheap to reach. On the host backend by default;
//! with `SYMM_BACKEND=cuda` on the cuda backend (the simulated GPU runs it in
//! `cargo xtask sim --test`).

use std::ffi::c_void;
use std::ptr::null_mut;
use std::time::{Duration, Instant};
use symm::*;
use symm_tests::*;

const STAGING_BYTES: &str = "65536";
/// A size unit of the messages (f32): 512 bytes.
const PIECE: usize = 128;
const F32: i32 = symmDataType_t::symmFloat32 as i32;

fn setup() {
    use_backend_from_env();
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // SAFETY: before any communicator exists in this process (each test's first call;
        // Once blocks concurrent callers until then). Child processes inherit both.
        unsafe {
            std::env::set_var("SYMM_STAGING_BYTES", STAGING_BYTES);
            if std::env::var("SYMM_TIMEOUT_MS").is_err() {
                std::env::set_var("SYMM_TIMEOUT_MS", "20000");
            }
        }
    });
}

/// One message of a batch, as every rank knows it.
#[derive(Clone, Copy, Debug)]
struct Message {
    from: usize,
    to: usize,
    count: usize,
    /// Whether the sender's buffer, and the receiver's, are outside its windows.
    send_staged: bool,
    recv_staged: bool,
}

/// The values of message `tag` of a batch.
fn values(message: &Message, tag: usize) -> Vec<f32> {
    (0..message.count)
        .map(|i| (message.from * 1_000_000 + tag * 1_000 + i % 997) as f32 + 0.5)
        .collect()
}

/// A batch of `messages` between `nranks` ranks (random pairs, self included), counts around
/// the piece size, past several pieces, and past the staging window (160 KiB on 3 channels),
/// each side staged or not at random.
fn batch(nranks: usize, messages: usize, seed: u64) -> Vec<Message> {
    const COUNTS: [usize; 10] = [
        0,
        1,
        PIECE - 1,
        PIECE,
        PIECE + 1,
        3 * PIECE,
        1029,
        2500,
        9 * PIECE + 7,
        40_000 + 3,
    ];
    let mut rng = Rng(seed);
    (0..messages)
        .map(|_| Message {
            from: rng.next_u64() as usize % nranks,
            to: rng.next_u64() as usize % nranks,
            count: COUNTS[rng.next_u64() as usize % COUNTS.len()],
            send_staged: rng.next_u64().is_multiple_of(2),
            recv_staged: rng.next_u64().is_multiple_of(2),
        })
        .collect()
}

/// A rank's part of a batch: its window, its own memory, and where each of its sends and
/// receives lies.
struct RankPart {
    comm: symmComm_t,
    rank: usize,
    stream: RankStream,
    window: (*mut std::ffi::c_void, symmWindow_t),
    own: OwnMemory,
    /// (message index, send, address) in the batch's order.
    buffers: Vec<(usize, bool, *mut u8)>,
}

/// Elements of the window and of the own memory of every rank for `messages` (windows have
/// one size on every rank).
fn extent(messages: &[Message]) -> usize {
    let ranks = messages
        .iter()
        .map(|m| m.from.max(m.to) + 1)
        .max()
        .unwrap_or(1);
    (0..ranks)
        .map(|rank| {
            messages
                .iter()
                .map(|m| {
                    (m.from == rank) as usize * (m.count + 4)
                        + (m.to == rank) as usize * (m.count + 4)
                })
                .sum::<usize>()
        })
        .max()
        .unwrap_or(0)
        + 16
}

impl RankPart {
    /// Lay out `rank`'s buffers for `messages` (at offsets that differ between ranks) and write
    /// its sends' values and its receives' sentinels.
    fn new(comm: symmComm_t, rank: usize, messages: &[Message]) -> RankPart {
        let window = window_of_bytes(comm, extent(messages) * 4);
        RankPart::in_window(comm, rank, messages, window)
    }

    /// [`RankPart::new`] in a window already registered, of `extent(messages)` elements.
    fn in_window(
        comm: symmComm_t,
        rank: usize,
        messages: &[Message],
        window: (*mut std::ffi::c_void, symmWindow_t),
    ) -> RankPart {
        let elements = extent(messages);
        let own = OwnMemory::new(elements * 4);
        let stream = RankStream::new();
        let mut cursor = [rank % 3 + 1, 2 * rank % 5 + 1];
        let mut buffers = Vec::new();
        for (index, message) in messages.iter().enumerate() {
            for (send, staged) in [
                (true, message.send_staged && message.from == rank),
                (false, message.recv_staged && message.to == rank),
            ] {
                let mine = if send { message.from } else { message.to } == rank;
                if !mine {
                    continue;
                }
                let (base, at) = if staged {
                    (own.ptr, &mut cursor[1])
                } else {
                    (window.0 as *mut u8, &mut cursor[0])
                };
                // SAFETY: inside the window or the own memory (`extent`).
                let address = unsafe { base.add(4 * *at) };
                *at += message.count + 4;
                if send {
                    stream.put_f32(address, &values(message, index));
                } else {
                    stream.put_f32(address, &vec![-1.0; message.count]);
                }
                buffers.push((index, send, address));
            }
        }
        RankPart {
            comm,
            rank,
            stream,
            window,
            own,
            buffers,
        }
    }

    /// Issue this rank's sends and receives (inside the caller's group).
    fn issue(&self, messages: &[Message]) {
        for &(index, send, address) in &self.buffers {
            let m = &messages[index];
            let result = if send {
                symmSend(
                    address.cast(),
                    m.count,
                    F32,
                    m.to as i32,
                    self.comm,
                    self.stream.handle(),
                )
            } else {
                symmRecv(
                    address.cast(),
                    m.count,
                    F32,
                    m.from as i32,
                    self.comm,
                    self.stream.handle(),
                )
            };
            check(result, self.comm);
        }
    }

    /// Wait for the stream, then compare every receive with its message and every send buffer
    /// with what it held (a send never writes its buffer).
    fn check(&self, messages: &[Message], case: &str) {
        self.stream.synchronize();
        check(async_error(self.comm), self.comm);
        for &(index, send, address) in &self.buffers {
            let m = &messages[index];
            let got = self.stream.get_f32(address, m.count);
            assert!(
                got == values(m, index),
                "{case}: rank {}'s {} of message {index} {m:?} differs",
                self.rank,
                if send { "send buffer" } else { "receive" }
            );
        }
    }

    fn free(self) {
        check(
            symmCommWindowDeregister(self.comm, self.window.1),
            self.comm,
        );
        check(symmMemFree(self.comm, self.window.0), self.comm);
        drop(self.own);
    }
}

/// One batch of a rank in a group of its own, then checked.
fn rank_batch(comm: symmComm_t, rank: usize, messages: &[Message], case: &str) {
    let part = RankPart::new(comm, rank, messages);
    check(symmGroupStart(), comm);
    part.issue(messages);
    check(symmGroupEnd(), comm);
    part.check(messages, case);
    part.free();
}

/// Batches a thread per rank runs, several in a row on one communicator.
fn batches(nranks: usize) -> Vec<Vec<Message>> {
    (0..4)
        .map(|seed| batch(nranks, 6 + 2 * seed as usize, 17 * nranks as u64 + seed))
        .collect()
}

#[test]
fn a_thread_per_rank() {
    setup();
    for nranks in [2, 3] {
        let comms = join_threads(new_unique_id(), nranks);
        on_rank_threads(&comms, |rank, comm| {
            for (k, messages) in batches(nranks).iter().enumerate() {
                rank_batch(
                    comm,
                    rank,
                    messages,
                    &format!("{nranks} rank threads, batch {k}"),
                );
            }
            check(symmCommDestroy(comm), null_mut());
        });
    }
}

/// A send from, or a receive into, pageable host memory outside every window: the kernel
/// itself reads or writes a buffer outside the windows, so on the cuda backend (a device that
/// cannot reach pageable memory; the simulated GPU is one) the call is refused, naming the
/// buffer, and the peer's matching call fails at once instead of a kernel faulting; on the
/// host backend the message arrives.
#[test]
fn a_buffer_the_device_cannot_reach_is_refused_on_both_ranks() {
    setup();
    let count = 1000;
    for pageable_rank in [0, 1] {
        let comms = join_threads(new_unique_id(), 2);
        on_rank_threads(&comms, |rank, comm| {
            let stream = RankStream::new();
            let (buffer, window) = window_of_bytes(comm, 4 * count);
            let mut pageable = vec![0f32; count];
            let sent: Vec<f32> = (0..count).map(|i| i as f32 + 0.5).collect();
            if rank == 0 {
                if pageable_rank == 0 {
                    pageable.copy_from_slice(&sent);
                } else {
                    stream.put_f32(buffer.cast(), &sent);
                }
            }
            let own = if rank == pageable_rank {
                pageable.as_mut_ptr().cast::<c_void>()
            } else {
                buffer
            };
            let start = Instant::now();
            let result = if rank == 0 {
                symmSend(own, count, F32, 1, comm, stream.handle())
            } else {
                symmRecv(own, count, F32, 0, comm, stream.handle())
            };
            let result = stream.completed(comm, result);
            let message = last_error(comm);
            if !on_cuda() {
                check(result, comm);
                if rank == 1 {
                    let got = if pageable_rank == 1 {
                        pageable.clone()
                    } else {
                        stream.get_f32(buffer.cast(), count)
                    };
                    assert!(got == sent, "rank 1 received {:?}", &got[..4]);
                }
            } else {
                assert_ne!(result, symmResult_t::symmSuccess, "rank {rank}");
                assert!(
                    start.elapsed() < Duration::from_secs(10),
                    "rank {rank}: {message}"
                );
                if rank == pageable_rank {
                    let name = if rank == 0 { "sendbuff" } else { "recvbuff" };
                    assert_eq!(result, symmResult_t::symmInvalidArgument, "{message}");
                    assert!(
                        message.contains(name) && message.contains("cannot reach"),
                        "rank {rank}: {message}"
                    );
                }
                if rank == 1 && pageable_rank == 1 {
                    assert!(
                        pageable.iter().all(|&v| v == 0.0),
                        "the refused receive wrote"
                    );
                }
            }
            let _ = symmCommWindowDeregister(comm, window);
            let _ = symmMemFree(comm, buffer);
            check(symmCommDestroy(comm), null_mut());
        });
    }
}

/// One thread drives every rank of a `symmCommInitAll` communicator in one group: the ranks'
/// tasks share one launch. The last batch holds many small messages (about a hundred per
/// rank).
#[test]
fn one_thread_drives_every_rank_in_a_group() {
    setup();
    let nranks = 3;
    let comms = init_all(nranks);
    let mut all = batches(nranks);
    all.push(
        batch(nranks, 150, 99)
            .into_iter()
            .map(|m| Message {
                count: m.count % 40,
                ..m
            })
            .collect(),
    );
    for (k, messages) in all.iter().enumerate() {
        let windows = alloc_windows(&comms, extent(messages) * 4);
        let parts: Vec<RankPart> = windows
            .iter()
            .enumerate()
            .map(|(rank, w)| RankPart::in_window(w.comm, rank, messages, (w.base.cast(), w.window)))
            .collect();
        check(symmGroupStart(), null_mut());
        for part in &parts {
            part.issue(messages);
        }
        check(symmGroupEnd(), null_mut());
        for part in parts {
            part.check(messages, &format!("one thread, batch {k}"));
            part.free();
        }
    }
    for comm in comms {
        check(symmCommDestroy(comm), null_mut());
    }
}

/// A ring both ways where every buffer is staged, many messages per rank (the batch
/// `torch.distributed.batch_isend_irecv` makes of a ring exchange of many tensors).
#[test]
fn staged_rings_of_many_messages_both_ways() {
    setup();
    let nranks = 4;
    let mut messages = Vec::new();
    for _ in 0..6 {
        for from in 0..nranks {
            for shift in [1, nranks - 1] {
                messages.push(Message {
                    from,
                    to: (from + shift) % nranks,
                    count: 2 * PIECE + 43,
                    send_staged: true,
                    recv_staged: true,
                });
            }
        }
    }
    let comms = join_threads(new_unique_id(), nranks);
    on_rank_threads(&comms, |rank, comm| {
        rank_batch(comm, rank, &messages, "staged rings");
        check(symmCommDestroy(comm), null_mut());
    });
}

/// Rank 0 stages more sends in one group than their smallest rings fit in the staging window
/// (129 one-channel messages, 512 bytes of ring each): refused before anything is launched, on
/// that rank naming the bytes and `SYMM_STAGING_BYTES`, and the peer's matching calls fail at
/// once (not at the wait bound).
#[test]
fn a_group_whose_rings_do_not_fit_the_window_is_refused_on_both_ranks() {
    setup();
    let comms = join_threads(new_unique_id(), 2);
    let (sends, count) = (129, 256);
    let outcomes = on_rank_threads(&comms, |rank, comm| {
        let stream = RankStream::new();
        let s = stream.handle();
        let own = OwnMemory::new(sends * count * 4);
        let (buffer, window) = window_of_bytes(comm, sends * count * 4);
        let started = Instant::now();
        let mut results = vec![symmGroupStart()];
        for k in 0..sends {
            results.push(if rank == 0 {
                // SAFETY: inside the own memory.
                let at = unsafe { own.ptr.add(4 * k * count) };
                symmSend(at.cast(), count, F32, 1, comm, s)
            } else {
                // In windows: calls that are fine on this rank, refused because of rank 0's.
                // SAFETY: inside the window.
                let at = unsafe { (buffer as *mut u8).add(4 * k * count) };
                symmRecv(at.cast(), count, F32, 0, comm, s)
            });
        }
        results.push(stream.completed(comm, symmGroupEnd()));
        let result = results
            .into_iter()
            .find(|r| *r != symmResult_t::symmSuccess)
            .unwrap_or(symmResult_t::symmSuccess);
        let outcome = (result, started.elapsed(), last_error(comm));
        let _ = symmCommWindowDeregister(comm, window);
        let _ = symmMemFree(comm, buffer);
        drop(own);
        let _ = symmCommDestroy(comm);
        outcome
    });
    for (rank, (result, took, message)) in outcomes.into_iter().enumerate() {
        assert_ne!(result, symmResult_t::symmSuccess, "rank {rank}: {message}");
        assert!(
            took < Duration::from_secs(10),
            "rank {rank} took {took:?}: {message}"
        );
        assert!(
            message.contains("SYMM_STAGING_BYTES") && message.contains("66048"),
            "rank {rank}: {message}"
        );
    }
}

/// Messages of 16 times the staging window, both ways between two ranks, every combination
/// of the two sides' buffers (in windows or not), as an exchange in one group on rank 0 and
/// as a send then a receive, each alone, on rank 1: the messages pass through the rings in one
/// launch per call, however the ranks group their calls.
#[test]
fn messages_many_times_the_staging_window_pass_both_ways() {
    setup();
    let count = 4 * 65536 + 13; // 1 MiB and a tail: four channels of 256 KiB.
    let comms = join_threads(new_unique_id(), 2);
    on_rank_threads(&comms, |rank, comm| {
        let stream = RankStream::new();
        let s = stream.handle();
        let own = OwnMemory::new(2 * count * 4);
        let (buffer, window) = window_of_bytes(comm, 2 * count * 4);
        let peer = 1 - rank;
        let vals = |from: usize, round: usize| -> Vec<f32> {
            (0..count)
                .map(|i| (from * 1_000_000 + round * 100_000 + i % 65_521) as f32)
                .collect()
        };
        for round in 0..4 {
            // Bit 0: this rank's send buffer outside its windows; bit 1: its receive buffer.
            let send_staged = (round + rank) & 1 == 1;
            let recv_staged = round & 2 == 2;
            let base = |staged: bool| if staged { own.ptr } else { buffer as *mut u8 };
            let send_at = base(send_staged);
            // SAFETY: inside the window or the own memory.
            let recv_at = unsafe { base(recv_staged).add(4 * count) };
            stream.put_f32(send_at, &vals(rank, round));
            stream.put_f32(recv_at, &vec![-1.0; count]);
            let send = || symmSend(send_at.cast(), count, F32, peer as i32, comm, s);
            let recv = || symmRecv(recv_at.cast(), count, F32, peer as i32, comm, s);
            if rank == 0 {
                check(symmGroupStart(), comm);
                check(send(), comm);
                check(recv(), comm);
                check(stream.completed(comm, symmGroupEnd()), comm);
            } else {
                check(stream.completed(comm, send()), comm);
                check(stream.completed(comm, recv()), comm);
            }
            let got = stream.get_f32(recv_at, count);
            let want = vals(peer, round);
            if let Some(i) = (0..count).find(|&i| got[i] != want[i]) {
                panic!(
                    "round {round}: rank {rank}'s receive (staged {recv_staged}, peer's send \
                     staged {}), element {i}: {} instead of {}",
                    (round + peer) & 1 == 1,
                    got[i],
                    want[i]
                );
            }
            assert!(stream.get_f32(send_at, count) == vals(rank, round));
        }
        check(async_error(comm), comm);
        check(symmCommWindowDeregister(comm, window), comm);
        check(symmMemFree(comm, buffer), comm);
        drop(own);
        check(symmCommDestroy(comm), null_mut());
    });
}

/// Rank 0's sends are in one group, rank 1's receives are single calls (and the other way
/// round): they pair in call order per pair, as in NCCL, whether the buffers are in windows or
/// staged, and an exchange grouped on one rank and made as a send then a receive on the other
/// completes.
#[test]
fn ranks_that_group_their_calls_differently_pair_in_call_order() {
    setup();
    for staged in [false, true] {
        let comms = join_threads(new_unique_id(), 2);
        let (a, b) = (3 * PIECE + 8, 8);
        let outcomes = on_rank_threads(&comms, |rank, comm| {
            let stream = RankStream::new();
            let s = stream.handle();
            let own = OwnMemory::new(8 * a * 4);
            let (buffer, window) = window_of_bytes(comm, 8 * a * 4);
            let base = if staged { own.ptr } else { buffer as *mut u8 };
            // SAFETY: inside the window or the own memory.
            let at = |k: usize| unsafe { base.add(4 * k * a) };
            let vals = |tag: usize, n: usize| -> Vec<f32> {
                (0..n).map(|i| (tag * 10_000 + i) as f32).collect()
            };
            let (x, y);
            if rank == 0 {
                stream.put_f32(at(0), &vals(1, a));
                stream.put_f32(at(1), &vals(2, b));
                stream.put_f32(at(2), &vals(3, a));
                check(symmGroupStart(), comm);
                check(symmSend(at(0).cast(), a, F32, 1, comm, s), comm);
                check(symmSend(at(1).cast(), b, F32, 1, comm, s), comm);
                check(symmGroupEnd(), comm);
                // An exchange in one group against the peer's send, then receive.
                check(symmGroupStart(), comm);
                check(symmSend(at(2).cast(), a, F32, 1, comm, s), comm);
                check(symmRecv(at(3).cast(), a, F32, 1, comm, s), comm);
                check(stream.completed(comm, symmGroupEnd()), comm);
                x = stream.get_f32(at(3), a);
                y = Vec::new();
                assert!(x == vals(4, a), "staged {staged}: rank 0's exchange");
            } else {
                stream.put_f32(at(4), &vals(4, a));
                check(symmRecv(at(0).cast(), a, F32, 0, comm, s), comm);
                check(symmRecv(at(1).cast(), b, F32, 0, comm, s), comm);
                check(
                    stream.completed(comm, symmSend(at(4).cast(), a, F32, 0, comm, s)),
                    comm,
                );
                check(
                    stream.completed(comm, symmRecv(at(2).cast(), a, F32, 0, comm, s)),
                    comm,
                );
                x = stream.get_f32(at(0), a);
                y = stream.get_f32(at(1), b);
                assert!(x == vals(1, a), "staged {staged}: the first receive");
                assert!(y == vals(2, b), "staged {staged}: the second receive");
                assert!(
                    stream.get_f32(at(2), a) == vals(3, a),
                    "staged {staged}: rank 1's exchange"
                );
            }
            check(async_error(comm), comm);
            check(symmCommWindowDeregister(comm, window), comm);
            check(symmMemFree(comm, buffer), comm);
            drop(own);
            check(symmCommDestroy(comm), null_mut());
            (x.len(), y.len())
        });
        assert_eq!(outcomes.len(), 2);
    }
}

const CHILD_ENV: &str = "SYMM_TEST_STAGED_P2P_RANK";
const ID_ENV: &str = "SYMM_TEST_STAGED_P2P_ID";
const MODE_ENV: &str = "SYMM_TEST_STAGED_P2P_MODE";

fn rank_processes(mode: &str, nranks: usize) -> Vec<(bool, String)> {
    let id = new_unique_id();
    let ranks: Vec<Vec<(String, String)>> = (0..nranks)
        .map(|rank| {
            vec![
                (CHILD_ENV.to_string(), rank.to_string()),
                (ID_ENV.to_string(), id_to_hex(&id)),
                (MODE_ENV.to_string(), mode.to_string()),
            ]
        })
        .collect();
    run_rank_processes("rank_process", &ranks, Duration::from_secs(300))
}

#[test]
fn a_process_per_rank() {
    setup();
    for (rank, (ok, log)) in rank_processes("batches", 2).iter().enumerate() {
        assert!(ok, "rank process {rank} failed:\n{log}");
    }
}

/// `SYMM_STRICT_WINDOWS=1`: a send outside the windows is refused on the calling rank, naming
/// the setting, and fails the communicator (its peer's receive would wait for it).
#[test]
fn strict_windows_refuse_staged_sends() {
    setup();
    for (rank, (ok, log)) in rank_processes("strict", 2).iter().enumerate() {
        assert!(ok, "rank process {rank} failed:\n{log}");
    }
}

/// A rank process of the process tests.
#[test]
#[ignore = "child process of the process tests"]
fn rank_process() {
    let Ok(rank) = std::env::var(CHILD_ENV) else {
        return;
    };
    let mode = std::env::var(MODE_ENV).unwrap();
    if mode == "strict" {
        // SAFETY: before any communicator exists in this process.
        unsafe { std::env::set_var("SYMM_STRICT_WINDOWS", "1") };
    }
    setup();
    let rank: usize = rank.parse().unwrap();
    let id = id_from_hex(&std::env::var(ID_ENV).unwrap());
    let mut comm = null_mut();
    // SAFETY: valid out-pointer.
    check(
        unsafe { symmCommInitRank(&mut comm, 2, id, rank as i32) },
        null_mut(),
    );
    if mode == "strict" {
        let stream = RankStream::new();
        let own = OwnMemory::new(4096);
        // An empty message needs no window, before any is registered too.
        let empty = if rank == 0 {
            symmSend(null_mut(), 0, F32, 1, comm, stream.handle())
        } else {
            symmRecv(null_mut(), 0, F32, 0, comm, stream.handle())
        };
        check(stream.completed(comm, empty), comm);
        let (buffer, window) = window_of_bytes(comm, 4096);
        let start = Instant::now();
        let result = if rank == 0 {
            symmSend(own.ptr.cast(), 16, F32, 1, comm, stream.handle())
        } else {
            symmRecv(buffer, 16, F32, 0, comm, stream.handle())
        };
        let result = stream.completed(comm, result);
        let message = last_error(comm);
        assert_ne!(result, symmResult_t::symmSuccess, "rank {rank}");
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "rank {rank}: {message}"
        );
        if rank == 0 {
            assert!(
                message.contains("SYMM_STRICT_WINDOWS=1"),
                "rank {rank}: {message}"
            );
        }
        let _ = symmCommWindowDeregister(comm, window);
        let _ = symmMemFree(comm, buffer);
    } else {
        for (k, messages) in batches(2).iter().enumerate() {
            rank_batch(
                comm,
                rank,
                messages,
                &format!("a process per rank, batch {k}"),
            );
        }
    }
    check(symmCommDestroy(comm), null_mut());
}

/// The first staged send is said in the log (`SYMM_DEBUG=INFO`), once per communicator.
#[test]
fn the_first_staged_send_is_logged_once() {
    setup();
    let output = rerun_ignored_test(
        "logging_child",
        &[("SYMM_DEBUG", "INFO"), ("SYMM_TEST_STAGED_P2P_LOG", "1")],
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    let said: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("staged through the communicator's staging window"))
        .collect();
    assert_eq!(said.len(), 2, "one line per rank:\n{stderr}");
    assert!(
        said.iter()
            .all(|l| l.contains("is in no registered window") && l.contains("pieces of")),
        "{said:?}"
    );
}

#[test]
#[ignore = "child process of the_first_staged_send_is_logged_once"]
fn logging_child() {
    if std::env::var("SYMM_TEST_STAGED_P2P_LOG").is_err() {
        return;
    }
    setup();
    let comms = join_threads(new_unique_id(), 2);
    let messages = [0, 1].map(|from| Message {
        from,
        to: 1 - from,
        count: 3 * PIECE,
        send_staged: true,
        recv_staged: true,
    });
    on_rank_threads(&comms, |rank, comm| {
        for _ in 0..3 {
            rank_batch(comm, rank, &messages, "logging");
        }
        check(symmCommDestroy(comm), null_mut());
    });
}

/// Staged sends and receives (seven messages each way, the last past the staging window)
/// captured into a CUDA graph and replayed with new data each time: the launch is stream work,
/// and each replay takes new sequence numbers and piece counts (the cuda backend: a GPU, or the
/// simulated GPU).
#[test]
fn staged_sends_and_receives_replay_from_a_cuda_graph() {
    setup();
    if !on_cuda() {
        return;
    }
    use cudarc::driver::sys;
    let comms = init_all(2);
    let messages = 7;
    let count_of = |k: usize| {
        if k + 1 == messages {
            40_003
        } else {
            3 * PIECE + 5
        }
    };
    let slot = 40_003 + 8;
    let own: Vec<OwnMemory> = (0..2)
        .map(|_| OwnMemory::new(2 * messages * slot * 4))
        .collect();
    let at = |rank: usize, send: bool, k: usize| {
        // SAFETY: inside the rank's own memory.
        unsafe {
            own[rank]
                .ptr
                .add(4 * ((!send) as usize * messages + k) * slot)
        }
    };
    let data = |from: usize, k: usize, replay: usize| -> Vec<f32> {
        (0..count_of(k))
            .map(|i| (from * 100_000 + replay * 10_000 + k * 1_000 + i % 997) as f32)
            .collect()
    };
    let io = RankStream::new();
    cuda_context();
    // SAFETY: stream, graph and exec are made, used and destroyed here, in the current
    // context; the capture is ended before anything else is enqueued.
    unsafe {
        let stream = capturing_stream();
        check(symmGroupStart(), null_mut());
        let mut results = Vec::new();
        for (rank, comm) in comms.iter().enumerate() {
            for k in 0..messages {
                let peer = 1 - rank as i32;
                results.push(symmSend(
                    at(rank, true, k).cast(),
                    count_of(k),
                    F32,
                    peer,
                    *comm,
                    stream.cast(),
                ));
                results.push(symmRecv(
                    at(rank, false, k).cast(),
                    count_of(k),
                    F32,
                    peer,
                    *comm,
                    stream.cast(),
                ));
            }
        }
        let end = symmGroupEnd();
        let mut graph = null_mut();
        sys::cuStreamEndCapture(stream, &mut graph)
            .result()
            .unwrap();
        assert!(results.iter().all(|r| *r == symmResult_t::symmSuccess));
        check(end, null_mut());
        let mut exec = null_mut();
        sys::cuGraphInstantiateWithFlags(&mut exec, graph, 0)
            .result()
            .unwrap();
        for replay in 0..3 {
            for rank in 0..2 {
                for k in 0..messages {
                    io.put_f32(at(rank, true, k), &data(rank, k, replay));
                    io.put_f32(at(rank, false, k), &vec![-1.0; count_of(k)]);
                }
            }
            sys::cuGraphLaunch(exec, stream).result().unwrap();
            sys::cuStreamSynchronize(stream).result().unwrap();
            for (rank, comm) in comms.iter().enumerate() {
                check(async_error(*comm), *comm);
                for k in 0..messages {
                    assert!(
                        io.get_f32(at(rank, false, k), count_of(k)) == data(1 - rank, k, replay),
                        "replay {replay}: rank {rank}'s message {k}"
                    );
                }
            }
        }
        sys::cuGraphExecDestroy(exec).result().unwrap();
        sys::cuGraphDestroy(graph).result().unwrap();
        sys::cuStreamDestroy_v2(stream).result().unwrap();
    }
    drop(own);
    for comm in comms {
        check(symmCommDestroy(comm), null_mut());
    }
}
