//! `symmSend` and `symmRecv` with buffers outside every window, through the C ABI: staged
//! through the communicator's staging window, cut into pieces and rounds alike on every rank
//! (`plan::peer_rounds`). Batches mixing staged and in-window buffers on either side of a pair
//! (sends to self included, more staged pieces than a round holds, more messages than the
//! kernel's task table), in every layout: a thread per rank, one thread driving every rank in
//! a group, a process per rank; every message compared exactly. Counts that differ on a piece
//! boundary are refused on both ranks, never paired with the next receive; the first staged
//! send is said once in the log; `SYMM_STRICT_WINDOWS=1` refuses them.
//!
//! The staging window is small here (`SYMM_STAGING_BYTES`, 4 KiB: pieces of 512 bytes, eight
//! staged pieces per round) so that messages take several pieces and batches several rounds.
//! On the host backend by default; with `SYMM_BACKEND=cuda` on the cuda backend (the simulated
//! GPU runs it in `cargo xtask sim --test`).

use std::ptr::null_mut;
use std::time::{Duration, Instant};
use symm::*;
use symm_tests::*;

const STAGING_BYTES: &str = "4096";
/// Elements (f32) of a piece: an eighth of the staging window.
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
/// the piece size and past several pieces, each side staged or not at random.
fn batch(nranks: usize, messages: usize, seed: u64) -> Vec<Message> {
    const COUNTS: [usize; 9] = [
        0,
        1,
        PIECE - 1,
        PIECE,
        PIECE + 1,
        3 * PIECE,
        1029,
        2500,
        9 * PIECE + 7,
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
        .map(|seed| batch(nranks, 10 + 8 * seed as usize, 17 * nranks as u64 + seed))
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

/// One thread drives every rank of a `symmCommInitAll` communicator in one group: the ranks'
/// pieces share launches, round by round. The last batch holds more messages per rank than
/// the kernel's task table (256).
#[test]
fn one_thread_drives_every_rank_in_a_group() {
    setup();
    let nranks = 3;
    let comms = init_all(nranks);
    let mut all = batches(nranks);
    all.push(
        batch(nranks, 420, 99)
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

/// A ring both ways where every buffer is staged and each rank posts more staged pieces per
/// level than a round holds (the batch `torch.distributed.batch_isend_irecv` makes of a ring
/// exchange of many tensors): the pieces of one level split between rounds alike on both
/// sides of each pair.
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
                    count: 5 * PIECE + 3,
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

/// Rank 0 sends 3 pieces then 1; rank 1 receives 2 pieces, then 1, then 1. Cut into pieces
/// alone, the first send's third piece would pair with the second receive (same size): a
/// wrong message returned as success. The last piece is marked, so the first receive refuses
/// the first send's second piece, and both ranks fail promptly, naming the mismatch.
#[test]
fn counts_that_differ_on_a_piece_boundary_are_refused() {
    setup();
    let comms = join_threads(new_unique_id(), 2);
    let outcomes = on_rank_threads(&comms, |rank, comm| {
        let stream = RankStream::new();
        let own = OwnMemory::new(16 * PIECE * 4);
        let at = |k: usize| {
            // SAFETY: inside the own memory.
            unsafe { own.ptr.add(4 * k * 4 * PIECE) }
        };
        let counts: &[usize] = if rank == 0 {
            &[3 * PIECE, PIECE]
        } else {
            &[2 * PIECE, PIECE, PIECE]
        };
        let start = Instant::now();
        check(symmGroupStart(), comm);
        for (k, count) in counts.iter().enumerate() {
            stream.put_f32(at(k), &vec![rank as f32; *count]);
            let result = if rank == 0 {
                symmSend(at(k).cast(), *count, F32, 1, comm, stream.handle())
            } else {
                symmRecv(at(k).cast(), *count, F32, 0, comm, stream.handle())
            };
            check(result, comm);
        }
        let result = stream.completed(comm, symmGroupEnd());
        let took = start.elapsed();
        let message = last_error(comm);
        drop(stream);
        drop(own);
        check(symmCommDestroy(comm), null_mut());
        (result, took, message)
    });
    for (rank, (result, took, message)) in outcomes.into_iter().enumerate() {
        assert_ne!(result, symmResult_t::symmSuccess, "rank {rank}: {message}");
        assert!(
            took < Duration::from_secs(10),
            "rank {rank} took {took:?}: {message}"
        );
        assert!(
            message.contains("count or data type differs"),
            "rank {rank}: {message}"
        );
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
        // A window, so that the communicator has its point-to-point window.
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
            .all(|l| l.contains("is in no registered window") && l.contains("pieces of up to 512")),
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

/// Staged sends and receives (several pieces and rounds, both ways) captured into a CUDA graph
/// and replayed with new data each time: the copies and every round's launch are stream work,
/// and each replay takes new sequence numbers (the cuda backend: a GPU, or the simulated GPU).
#[test]
fn staged_sends_and_receives_replay_from_a_cuda_graph() {
    setup();
    if !on_cuda() {
        return;
    }
    use cudarc::driver::sys;
    let comms = init_all(2);
    let messages = 6;
    let count = 3 * PIECE + 5;
    let slot = count + 8;
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
        (0..count)
            .map(|i| (from * 100_000 + replay * 10_000 + k * 1_000 + i % 997) as f32)
            .collect()
    };
    let io = RankStream::new();
    cuda_context();
    // SAFETY: stream, graph and exec are made, used and destroyed here, in the current
    // context; the capture is ended before anything else is enqueued.
    unsafe {
        let mut stream = null_mut();
        sys::cuStreamCreate(&mut stream, 0).result().unwrap();
        let mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL;
        sys::cuStreamBeginCapture_v2(stream, mode).result().unwrap();
        check(symmGroupStart(), null_mut());
        let mut results = Vec::new();
        for (rank, comm) in comms.iter().enumerate() {
            for k in 0..messages {
                let peer = 1 - rank as i32;
                results.push(symmSend(
                    at(rank, true, k).cast(),
                    count,
                    F32,
                    peer,
                    *comm,
                    stream.cast(),
                ));
                results.push(symmRecv(
                    at(rank, false, k).cast(),
                    count,
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
                    io.put_f32(at(rank, false, k), &vec![-1.0; count]);
                }
            }
            sys::cuGraphLaunch(exec, stream).result().unwrap();
            sys::cuStreamSynchronize(stream).result().unwrap();
            for (rank, comm) in comms.iter().enumerate() {
                check(async_error(*comm), *comm);
                for k in 0..messages {
                    assert!(
                        io.get_f32(at(rank, false, k), count) == data(1 - rank, k, replay),
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
