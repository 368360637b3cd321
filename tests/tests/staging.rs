//! Staging through the C ABI: collectives whose buffers lie outside every registered window
//! (memory the caller allocated itself) run through the communicator's staging window, in
//! chunks, mixed on one communicator with calls in windows, for every collective, in every
//! layout (one thread driving every rank in groups, a thread per rank, a process per rank);
//! every result checked against a reference. A rank that stages a call its peers make in
//! their windows is refused on every rank at once; `SYMM_STRICT_WINDOWS=1` refuses staging;
//! the first staged call is said once in the log; arguments staging cannot take are refused
//! with nothing touched; a staged call replays from a CUDA graph.
//!
//! The staging window is small here (`SYMM_STAGING_BYTES`, 8 KiB) so that most calls take
//! several chunks. On the host backend by default; with `SYMM_BACKEND=cuda` on the cuda backend
//! (the simulated GPU runs it in `cargo xtask sim --test`).

use std::ptr::null_mut;
use std::time::{Duration, Instant};
use symm::*;
use symm_tests::*;

/// Bytes of every rank's window and of its own memory; the receive buffers start half-way.
const BYTES: usize = 64 * 1024;
const RECV_AT: usize = 32 * 1024;
/// The staging window's size in this test process.
const STAGING_BYTES: &str = "8192";

const F32: i32 = symmDataType_t::symmFloat32 as i32;
const SUM: i32 = symmRedOp_t::symmSum as i32;

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

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Op {
    AllReduce,
    Reduce,
    Broadcast,
    AllGather,
    ReduceScatter,
    AllToAll,
    Gather,
    Scatter,
}

const OPS: [Op; 8] = [
    Op::AllReduce,
    Op::Reduce,
    Op::Broadcast,
    Op::AllGather,
    Op::ReduceScatter,
    Op::AllToAll,
    Op::Gather,
    Op::Scatter,
];

/// One call of a sequence, the same on every rank.
#[derive(Clone, Copy, Debug)]
struct CallSpec {
    index: usize,
    op: Op,
    /// Elements per segment.
    n: usize,
    root: usize,
    /// In the rank's own memory (staged), or in its window.
    staged: bool,
    /// In place (all-reduce, all-gather, reduce-scatter).
    in_place: bool,
}

impl CallSpec {
    fn of(index: usize, nranks: usize) -> CallSpec {
        let op = OPS[index % OPS.len()];
        let n = [1, 7, 100, 333, 1000, 0, 257][index % 7];
        CallSpec {
            index,
            op,
            n,
            root: (index / 3) % nranks,
            staged: (index + index / OPS.len()).is_multiple_of(2),
            in_place: matches!(op, Op::AllReduce | Op::AllGather | Op::ReduceScatter)
                && index.is_multiple_of(3),
        }
    }

    /// Segments of the send and the receive buffer.
    fn segments(&self, nranks: usize) -> (usize, usize) {
        match self.op {
            Op::AllReduce | Op::Reduce | Op::Broadcast => (1, 1),
            Op::AllGather | Op::Gather => (1, nranks),
            Op::ReduceScatter | Op::Scatter => (nranks, 1),
            Op::AllToAll => (nranks, nranks),
        }
    }

    /// Whether `rank`'s receive buffer holds a result.
    fn receives(&self, rank: usize) -> bool {
        !matches!(self.op, Op::Reduce | Op::Gather) || rank == self.root
    }

    /// Element `i` of `rank`'s send buffer: small integers, so that f32 sums are exact.
    fn input(&self, rank: usize, i: usize) -> f32 {
        ((rank * 7 + self.index * 3 + i) % 13) as f32 + 1.0
    }

    /// `rank`'s expected receive buffer.
    fn expected(&self, rank: usize, nranks: usize) -> Vec<f32> {
        let n = self.n;
        let sum = |i: usize| (0..nranks).map(|r| self.input(r, i)).sum::<f32>();
        match self.op {
            Op::AllReduce | Op::Reduce => (0..n).map(sum).collect(),
            Op::Broadcast => (0..n).map(|i| self.input(self.root, i)).collect(),
            Op::AllGather | Op::Gather => (0..nranks * n)
                .map(|j| self.input(j / n.max(1), j % n.max(1)))
                .collect(),
            Op::ReduceScatter => (0..n).map(|i| sum(rank * n + i)).collect(),
            Op::AllToAll => (0..nranks * n)
                .map(|j| self.input(j / n.max(1), rank * n + j % n.max(1)))
                .collect(),
            Op::Scatter => (0..n)
                .map(|i| self.input(self.root, rank * n + i))
                .collect(),
        }
    }
}

/// A rank's buffers for the sequences: its window and its own memory.
struct RankMemory {
    comm: symmComm_t,
    rank: usize,
    window: *mut u8,
    own: OwnMemory,
}

const SENTINEL: f32 = -1.0;

impl RankMemory {
    /// The memory of a rank driven by its own thread (or process).
    fn new(comm: symmComm_t, rank: usize) -> RankMemory {
        let (window, _) = window_of_bytes(comm, BYTES);
        RankMemory {
            comm,
            rank,
            window: window.cast(),
            own: OwnMemory::new(BYTES),
        }
    }

    /// The memory of every rank of `comms`, driven by the calling thread (windows registered
    /// in a group).
    fn of_all(comms: &[symmComm_t]) -> Vec<RankMemory> {
        alloc_windows(comms, BYTES)
            .into_iter()
            .enumerate()
            .map(|(rank, b)| RankMemory {
                comm: b.comm,
                rank,
                window: b.base,
                own: OwnMemory::new(BYTES),
            })
            .collect()
    }

    fn base(&self, call: &CallSpec) -> *mut u8 {
        if call.staged {
            self.own.ptr
        } else {
            self.window
        }
    }

    /// The send and receive buffers of `call` (in place: inside one another).
    fn buffers(&self, call: &CallSpec) -> (*mut u8, *mut u8) {
        let base = self.base(call);
        // Addresses only (wrapping: never dereferenced here); the sequences keep every buffer
        // inside the BYTES-long memory.
        let recv = base.wrapping_add(RECV_AT);
        if !call.in_place {
            return (base, recv);
        }
        let segment = call.n * 4;
        match call.op {
            Op::AllGather => (recv.wrapping_add(self.rank * segment), recv),
            Op::ReduceScatter => (base, base.wrapping_add(self.rank * segment)),
            _ => (recv, recv),
        }
    }

    /// Write `call`'s input (after filling the receive buffer with the sentinel: in place,
    /// the input lies inside it).
    fn prepare(&self, call: &CallSpec, nranks: usize, io: Io) {
        let (send_segments, recv_segments) = call.segments(nranks);
        let (send, recv) = self.buffers(call);
        io.put(recv, &vec![SENTINEL; recv_segments * call.n]);
        let input: Vec<f32> = (0..send_segments * call.n)
            .map(|i| call.input(self.rank, i))
            .collect();
        io.put(send, &input);
    }

    fn issue(&self, call: &CallSpec, stream: symmStream_t) -> symmResult_t {
        let (send, recv) = self.buffers(call);
        let (send, recv) = (send.cast(), recv.cast());
        let (n, root, comm) = (call.n, call.root as i32, self.comm);
        match call.op {
            Op::AllReduce => symmAllReduce(send, recv, n, F32, SUM, comm, stream),
            Op::Reduce => symmReduce(send, recv, n, F32, SUM, root, comm, stream),
            Op::Broadcast => symmBroadcast(send, recv, n, F32, root, comm, stream),
            Op::AllGather => symmAllGather(send, recv, n, F32, comm, stream),
            Op::ReduceScatter => symmReduceScatter(send, recv, n, F32, SUM, comm, stream),
            Op::AllToAll => symmAlltoAll(send, recv, n, F32, comm, stream),
            Op::Gather => symmGather(send, recv, n, F32, root, comm, stream),
            Op::Scatter => symmScatter(send, recv, n, F32, root, comm, stream),
        }
    }

    /// Check the receive buffer after `call`: the reference where the rank receives, the
    /// sentinel untouched where it does not.
    fn check(&self, call: &CallSpec, nranks: usize, io: Io, layout: &str) {
        let (_, recv_segments) = call.segments(nranks);
        let (_, recv) = self.buffers(call);
        let got = io.get(recv, recv_segments * call.n);
        let want = if call.receives(self.rank) {
            call.expected(self.rank, nranks)
        } else if call.in_place {
            return;
        } else {
            vec![SENTINEL; recv_segments * call.n]
        };
        assert!(
            got == want,
            "{layout}, {nranks} ranks, rank {}: call {:?} gave a wrong result: first difference \
             at {:?}",
            self.rank,
            call,
            got.iter().zip(&want).position(|(a, b)| a != b)
        );
    }
}

/// How a test reads and writes a rank's memory: in its rank stream's order, or after all of
/// the context's work (one thread driving every rank, on the legacy stream).
#[derive(Clone, Copy)]
enum Io<'a> {
    Stream(&'a RankStream),
    Context,
}

impl Io<'_> {
    fn put(self, ptr: *mut u8, values: &[f32]) {
        match self {
            Io::Stream(stream) => stream.put_f32(ptr, values),
            Io::Context => put_f32(ptr, values),
        }
    }

    fn get(self, ptr: *const u8, count: usize) -> Vec<f32> {
        match self {
            Io::Stream(stream) => stream.get_f32(ptr, count),
            Io::Context => get_f32(ptr, count),
        }
    }
}

/// Write `call`'s inputs on every rank of `ranks` (one thread driving them all) and make it
/// in one group, every rank's call accepted.
fn issue_in_group(ranks: &[RankMemory], call: &CallSpec, nranks: usize) {
    for rank in ranks {
        rank.prepare(call, nranks, Io::Context);
    }
    check(symmGroupStart(), null_mut());
    for rank in ranks {
        check(rank.issue(call, null_mut()), rank.comm);
    }
    check(symmGroupEnd(), null_mut());
}

/// [`issue_in_group`], then every rank's result checked (`layout` names the case).
fn run_in_group(ranks: &[RankMemory], call: &CallSpec, nranks: usize, layout: &str) {
    issue_in_group(ranks, call, nranks);
    for rank in ranks {
        rank.check(call, nranks, Io::Context, layout);
    }
}

/// Free the ranks' own memory, then destroy the communicators (which frees their windows).
fn destroy_all(ranks: Vec<RankMemory>, comms: impl IntoIterator<Item = symmComm_t>) {
    drop(ranks);
    for comm in comms {
        check(symmCommDestroy(comm), null_mut());
    }
}

/// The calls of a sequence on `nranks` ranks: every collective, staged and in windows, in
/// and out of place, chunked and not, several roots.
fn sequence(nranks: usize, calls: usize) -> Vec<CallSpec> {
    (0..calls).map(|i| CallSpec::of(i, nranks)).collect()
}

#[test]
fn one_thread_drives_every_rank_in_groups() {
    setup();
    for nranks in 1..=4 {
        let comms = init_all(nranks);
        let ranks = RankMemory::of_all(&comms);
        for call in sequence(nranks, 42) {
            run_in_group(&ranks, &call, nranks, "one thread");
        }
        destroy_all(ranks, comms);
    }
}

/// Two staged calls and a call in a window in one group, the second staged call writing over
/// part of the first one's result: the staged calls run one after the other (they share the
/// staging window) in call order, each correct, and the window's call beside them.
#[test]
fn staged_calls_share_a_group_with_calls_in_windows() {
    setup();
    let nranks = 3;
    let comms = init_all(nranks);
    let ranks = RankMemory::of_all(&comms);
    let spec = |index, op, n, staged, in_place| CallSpec {
        index,
        op,
        n,
        root: 0,
        staged,
        in_place,
    };
    // The all-reduce's result (in place, at RECV_AT) is then partly overwritten by the
    // reduce-scatter's (out of place, into RECV_AT).
    let all_reduce = spec(1, Op::AllReduce, 1000, true, true);
    let all_gather = spec(2, Op::AllGather, 500, false, false);
    let reduce_scatter = spec(3, Op::ReduceScatter, 400, true, false);
    for rank in &ranks {
        rank.prepare(&reduce_scatter, nranks, Io::Context);
        rank.prepare(&all_reduce, nranks, Io::Context);
        rank.prepare(&all_gather, nranks, Io::Context);
    }
    check(symmGroupStart(), null_mut());
    for rank in &ranks {
        for call in [&all_reduce, &all_gather, &reduce_scatter] {
            check(rank.issue(call, null_mut()), rank.comm);
        }
    }
    check(symmGroupEnd(), null_mut());
    for rank in &ranks {
        rank.check(&all_gather, nranks, Io::Context, "group, in the window");
        rank.check(&reduce_scatter, nranks, Io::Context, "group, staged second");
        let (_, recv) = rank.buffers(&all_reduce);
        let got = get_f32(recv, 1000);
        let want = all_reduce.expected(rank.rank, nranks);
        assert!(
            got[400..] == want[400..],
            "rank {}: the first staged call's result past the second's",
            rank.rank
        );
    }
    destroy_all(ranks, comms);
}

/// The sequence on one rank of `nranks`, driven by the calling thread (a thread or a process
/// per rank).
fn run_rank_sequence(comm: symmComm_t, rank: usize, nranks: usize, calls: usize, layout: &str) {
    let stream = RankStream::new();
    let memory = RankMemory::new(comm, rank);
    for call in sequence(nranks, calls) {
        memory.prepare(&call, nranks, Io::Stream(&stream));
        let result = memory.issue(&call, stream.handle());
        check(stream.completed(comm, result), comm);
        memory.check(&call, nranks, Io::Stream(&stream), layout);
    }
    stream.synchronize();
}

#[test]
fn a_thread_per_rank() {
    setup();
    for nranks in [2, 3] {
        let comms = join_threads(new_unique_id(), nranks);
        on_rank_threads(&comms, |rank, comm| {
            run_rank_sequence(comm, rank, nranks, 42, "a thread per rank")
        });
        for comm in comms {
            check(symmCommDestroy(comm), null_mut());
        }
    }
}

const CHILD_ENV: &str = "SYMM_TEST_STAGING_RANK";
const ID_ENV: &str = "SYMM_TEST_STAGING_ID";
const MODE_ENV: &str = "SYMM_TEST_STAGING_MODE";

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
    for (rank, (ok, log)) in rank_processes("sequence", 2).iter().enumerate() {
        assert!(ok, "rank process {rank} failed:\n{log}");
    }
}

/// A rank process of `a_process_per_rank` and `a_mismatch_between_processes_fails_both`.
#[test]
#[ignore = "child process of the process tests"]
fn rank_process() {
    let Ok(rank) = std::env::var(CHILD_ENV) else {
        return;
    };
    setup();
    let rank: usize = rank.parse().unwrap();
    let id = id_from_hex(&std::env::var(ID_ENV).unwrap());
    let mut comm = null_mut();
    let start = Instant::now();
    // SAFETY: valid out-pointer.
    let made = unsafe { symmCommInitRank(&mut comm, 2, id, rank as i32) };
    if std::env::var(MODE_ENV).unwrap() == "strict on one rank" {
        print_outcome(made, start.elapsed(), &last_error(null_mut()));
        return;
    }
    check(made, null_mut());
    match std::env::var(MODE_ENV).unwrap().as_str() {
        "sequence" => run_rank_sequence(comm, rank, 2, 30, "a process per rank"),
        _ => {
            let (result, took, message) = mismatched_all_reduce(comm, rank);
            print_outcome(result, took, &message);
        }
    }
    check(symmCommDestroy(comm), null_mut());
}

/// Rank 0 stages an all-reduce (its buffers in its own memory), rank 1 makes it in its
/// window: the result, time and message of the call on this rank.
fn mismatched_all_reduce(comm: symmComm_t, rank: usize) -> (symmResult_t, Duration, String) {
    let stream = RankStream::new();
    let memory = RankMemory::new(comm, rank);
    let call = CallSpec {
        index: 0,
        op: Op::AllReduce,
        n: 100,
        root: 0,
        staged: rank == 0,
        in_place: false,
    };
    memory.prepare(&call, 2, Io::Stream(&stream));
    let start = Instant::now();
    let result = memory.issue(&call, stream.handle());
    let result = stream.completed(comm, result);
    let took = start.elapsed();
    let message = last_error(comm);
    // Nothing was written, but by a staged call on the cuda backend: its copy out of the
    // staging window is enqueued behind its kernel, and runs when the kernel gives up (the
    // failure is reported all the same).
    let (_, recv) = memory.buffers(&call);
    if !(call.staged && on_cuda()) {
        assert_eq!(
            Io::Stream(&stream).get(recv, call.n),
            vec![SENTINEL; call.n],
            "rank {rank}: the refused call wrote its receive buffer"
        );
    }
    (result, took, message)
}

fn check_mismatch_outcome(rank: usize, result: symmResult_t, took: Duration, message: &str) {
    assert_ne!(result, symmResult_t::symmSuccess, "rank {rank}: {message}");
    assert!(
        took < Duration::from_secs(5),
        "rank {rank} took {took:?} (bound 20 s): {message}"
    );
    assert!(
        message.contains("staged vs in windows") || message.contains("in windows vs staged"),
        "rank {rank}: {message}"
    );
}

#[test]
fn a_mismatch_between_threads_fails_both_at_once() {
    setup();
    let comms = join_threads(new_unique_id(), 2);
    let outcomes = on_rank_threads(&comms, |rank, comm| mismatched_all_reduce(comm, rank));
    for (rank, (result, took, message)) in outcomes.into_iter().enumerate() {
        check_mismatch_outcome(rank, result, took, &message);
    }
    for comm in comms {
        check(symmCommDestroy(comm), null_mut());
    }
}

#[test]
fn a_mismatch_between_processes_fails_both_at_once() {
    setup();
    for (rank, (ok, log)) in rank_processes("mismatch", 2).iter().enumerate() {
        assert!(ok, "rank process {rank} failed:\n{log}");
        let outcome =
            parse_outcome(rank, log).unwrap_or_else(|| panic!("rank {rank}: no outcome:\n{log}"));
        check_mismatch_outcome(rank, outcome.result, outcome.took, &outcome.message);
    }
}

/// One thread stages a group's calls on one rank and not on the other: refused on both, as
/// a group whose parts differ, and nothing is written.
#[test]
fn a_group_whose_ranks_differ_in_staging_is_refused() {
    setup();
    let comms = init_all(2);
    let ranks = RankMemory::of_all(&comms);
    let calls: Vec<CallSpec> = (0..2)
        .map(|r| CallSpec {
            index: 5,
            op: Op::AllGather,
            n: 50,
            root: 0,
            staged: r == 1,
            in_place: false,
        })
        .collect();
    for (rank, call) in ranks.iter().zip(&calls) {
        rank.prepare(call, 2, Io::Context);
    }
    check(symmGroupStart(), null_mut());
    for (rank, call) in ranks.iter().zip(&calls) {
        check(rank.issue(call, null_mut()), rank.comm);
    }
    let end = symmGroupEnd();
    let message = last_error(null_mut());
    assert_ne!(end, symmResult_t::symmSuccess);
    assert!(
        message.contains("staged vs in windows") || message.contains("in windows vs staged"),
        "{message}"
    );
    for (rank, call) in ranks.iter().zip(&calls) {
        let (_, recv) = rank.buffers(call);
        assert_eq!(get_f32(recv, 100), vec![SENTINEL; 100], "nothing written");
    }
    destroy_all(ranks, comms);
}

/// Arguments staging cannot take are refused by name, with nothing written: buffers that
/// overlap other than in place, a NULL buffer, a buffer that overruns a window.
#[test]
fn bad_arguments_of_staged_calls_are_refused() {
    setup();
    let comms = init_all(1);
    let comm = comms[0];
    let memory = RankMemory::new(comm, 0);
    let own = memory.own.ptr;
    put_f32(own, &vec![SENTINEL; 64]);
    let window = memory.window;
    // Addresses only: the library checks them before any use.
    let at = |base: *mut u8, bytes: usize| base.wrapping_add(bytes).cast();
    type Case<'a> = (Box<dyn Fn() -> symmResult_t + 'a>, &'a str);
    let cases: Vec<Case> = vec![
        (
            Box::new(|| symmAllReduce(at(own, 0), at(own, 8), 8, F32, SUM, comm, null_mut())),
            "overlap without being in place",
        ),
        (
            Box::new(|| symmAllGather(at(own, 0), at(own, 8), 8, F32, comm, null_mut())),
            "overlap without being in place",
        ),
        (
            Box::new(|| symmAllReduce(std::ptr::null(), at(own, 0), 8, F32, SUM, comm, null_mut())),
            "sendbuff is NULL",
        ),
        (
            Box::new(|| {
                symmAllReduce(
                    at(window, BYTES - 8),
                    at(own, 0),
                    8,
                    F32,
                    SUM,
                    comm,
                    null_mut(),
                )
            }),
            "overruns its end",
        ),
    ];
    for (call, needle) in &cases {
        assert_eq!(call(), symmResult_t::symmInvalidArgument);
        let message = last_error(comm);
        assert!(message.contains(needle), "{message:?} lacks {needle:?}");
    }
    assert_eq!(get_f32(own, 64), vec![SENTINEL; 64], "nothing written");
    // Still usable: a staged call.
    let call = CallSpec::of(3, 1);
    memory.prepare(&call, 1, Io::Context);
    check(memory.issue(&call, null_mut()), comm);
    memory.check(&call, 1, Io::Context, "after refusals");
    drop(memory);
    check(symmCommDestroy(comm), null_mut());
}

/// `SYMM_STRICT_WINDOWS=1`: a call outside the windows is refused, and the message says why.
#[test]
fn strict_windows_refuse_staging() {
    setup();
    let output = rerun_ignored_test("strict_child", &[("SYMM_STRICT_WINDOWS", "1")]);
    let log = String::from_utf8_lossy(&output.stdout).into_owned()
        + &String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{log}");
    assert!(log.contains("strict refusal checked"), "{log}");
}

#[test]
#[ignore = "child process of strict_windows_refuse_staging"]
fn strict_child() {
    setup();
    let comms = init_all(1);
    let memory = RankMemory::new(comms[0], 0);
    let call = CallSpec::of(0, 1);
    let call = CallSpec {
        staged: true,
        ..call
    };
    memory.prepare(&call, 1, Io::Context);
    assert_eq!(
        memory.issue(&call, null_mut()),
        symmResult_t::symmInvalidArgument
    );
    let message = last_error(comms[0]);
    assert!(message.contains("SYMM_STRICT_WINDOWS=1"), "{message}");
    println!("strict refusal checked");
    drop(memory);
    check(symmCommDestroy(comms[0]), null_mut());
}

/// The first staged call of a communicator is said once, at INFO, on each rank.
#[test]
fn the_first_staged_call_is_logged_once() {
    setup();
    let output = rerun_ignored_test("logging_child", &[]);
    let log = String::from_utf8_lossy(&output.stdout).into_owned()
        + &String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{log}");
    let lines: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("staged through the communicator's staging window"))
        .collect();
    assert_eq!(lines.len(), 2, "one line per rank:\n{log}");
    assert!(
        lines.iter().all(|l| l.contains("symmAllReduce")),
        "{lines:?}"
    );
}

#[test]
#[ignore = "child process of the_first_staged_call_is_logged_once"]
fn logging_child() {
    setup();
    let comms = init_all(2);
    let ranks = RankMemory::of_all(&comms);
    for index in [0, 8, 16] {
        let call = CallSpec {
            staged: true,
            ..CallSpec::of(index, 2)
        };
        issue_in_group(&ranks, &call, 2);
    }
    destroy_all(ranks, comms);
}

/// A staged all-reduce of several chunks captured into a CUDA graph and replayed with new
/// inputs each time (the cuda backend: a GPU, or the simulated GPU).
#[test]
fn a_staged_call_replays_from_a_cuda_graph() {
    setup();
    if !on_cuda() {
        return;
    }
    use cudarc::driver::sys;
    let nranks = 2;
    let comms = init_all(nranks);
    let ranks = RankMemory::of_all(&comms);
    let call = |index: usize| CallSpec {
        index,
        op: Op::AllReduce,
        n: 3000,
        root: 0,
        staged: true,
        in_place: false,
    };
    cuda_context();
    // SAFETY: stream, graph and exec are made, used and destroyed here, in the current
    // context; the capture is ended before anything else is enqueued.
    unsafe {
        let stream = capturing_stream();
        check(symmGroupStart(), null_mut());
        let results: Vec<symmResult_t> = ranks
            .iter()
            .map(|rank| rank.issue(&call(0), stream.cast()))
            .collect();
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
        for replay in 0..4 {
            // Every replay's inputs are those of a call numbered after it (same buffers).
            let this = call(replay + 1);
            for rank in &ranks {
                rank.prepare(&this, nranks, Io::Context);
            }
            sys::cuGraphLaunch(exec, stream).result().unwrap();
            sys::cuStreamSynchronize(stream).result().unwrap();
            for rank in &ranks {
                rank.check(
                    &this,
                    nranks,
                    Io::Context,
                    &format!("graph replay {replay}"),
                );
            }
        }
        sys::cuGraphExecDestroy(exec).result().unwrap();
        sys::cuGraphDestroy(graph).result().unwrap();
        sys::cuStreamDestroy_v2(stream).result().unwrap();
    }
    destroy_all(ranks, comms);
}

/// One process strict (`SYMM_STRICT_WINDOWS=1`), the other not: the communicator is refused at
/// its creation on both, at once, naming the staging settings (not a hang, and never one
/// rank's window paired with the other's staging window).
#[test]
fn ranks_that_disagree_on_staging_are_refused_at_init() {
    setup();
    let id = new_unique_id();
    let ranks: Vec<Vec<(String, String)>> = (0..2)
        .map(|rank| {
            let mut env = vec![
                (CHILD_ENV.to_string(), rank.to_string()),
                (ID_ENV.to_string(), id_to_hex(&id)),
                (MODE_ENV.to_string(), "strict on one rank".to_string()),
            ];
            if rank == 0 {
                env.push(("SYMM_STRICT_WINDOWS".to_string(), "1".to_string()));
            }
            env
        })
        .collect();
    let results = run_rank_processes("rank_process", &ranks, Duration::from_secs(120));
    for (rank, (ok, log)) in results.iter().enumerate() {
        assert!(ok, "rank process {rank} failed:\n{log}");
        let outcome =
            parse_outcome(rank, log).unwrap_or_else(|| panic!("rank {rank}: no outcome:\n{log}"));
        assert_ne!(outcome.result, symmResult_t::symmSuccess, "rank {rank}");
        assert!(
            outcome.took < Duration::from_secs(5),
            "rank {rank}: {:?}: {}",
            outcome.took,
            outcome.message
        );
        assert!(
            outcome.message.contains("staging window"),
            "rank {rank}: {}",
            outcome.message
        );
    }
}

/// Rank 0 makes one staged all-reduce of 2000 elements, rank 1 two of 1000: their first
/// chunks have the same size (the staging window holds 992), but not the same call, and both
/// ranks fail at the first chunk instead of pairing halves of different calls.
#[test]
fn a_staged_call_never_pairs_with_a_different_staged_call() {
    setup();
    let comms = join_threads(new_unique_id(), 2);
    let outcomes = on_rank_threads(&comms, |rank, comm| {
        let stream = RankStream::new();
        let memory = RankMemory::new(comm, rank);
        let spec = |n| CallSpec {
            index: 9,
            op: Op::AllReduce,
            n,
            root: 0,
            staged: true,
            in_place: false,
        };
        let calls = if rank == 0 {
            vec![spec(2000)]
        } else {
            vec![spec(1000), spec(1000)]
        };
        let mut results = Vec::new();
        for call in &calls {
            memory.prepare(call, 2, Io::Stream(&stream));
            let result = memory.issue(call, stream.handle());
            results.push((stream.completed(comm, result), last_error(comm)));
        }
        stream.synchronize();
        results
    });
    for (rank, results) in outcomes.iter().enumerate() {
        let (result, message) = &results[0];
        assert_ne!(*result, symmResult_t::symmSuccess, "rank {rank}: {message}");
        assert!(
            message.contains("staged call of 2000 vs 1000")
                || message.contains("staged call of 1000 vs 2000")
                || message.contains("has failed"),
            "rank {rank}: {message}"
        );
    }
    for comm in comms {
        check(symmCommDestroy(comm), null_mut());
    }
}

/// A group whose calls depend on each other through memory no footprint covers: an
/// all-reduce in the windows whose result a staged all-reduce then reads (its send buffer in
/// a window, its receive buffer the rank's own memory), then a staged call whose result the
/// next call in the windows reads (through a copy the test makes after the group, not in
/// it). Every result is the one of running the calls in order.
#[test]
fn a_group_keeps_staged_calls_in_order_with_the_calls_around_them() {
    setup();
    let nranks = 2;
    let comms = init_all(nranks);
    let ranks = RankMemory::of_all(&comms);
    let n = 300;
    for (r, rank) in ranks.iter().enumerate() {
        put_f32(rank.window, &vec![r as f32 + 1.0; n]);
        put_f32(rank.own.ptr, &vec![SENTINEL; n]);
    }
    let middle = |rank: &RankMemory| rank.window.wrapping_add(RECV_AT);
    check(symmGroupStart(), null_mut());
    for rank in &ranks {
        check(
            symmAllReduce(
                rank.window.cast(),
                middle(rank).cast(),
                n,
                F32,
                SUM,
                rank.comm,
                null_mut(),
            ),
            rank.comm,
        );
        check(
            symmAllReduce(
                middle(rank).cast(),
                rank.own.ptr.cast(),
                n,
                F32,
                SUM,
                rank.comm,
                null_mut(),
            ),
            rank.comm,
        );
    }
    check(symmGroupEnd(), null_mut());
    // 1 + 2 = 3 after the first, 3 + 3 = 6 after the second.
    for rank in &ranks {
        assert_eq!(
            get_f32(middle(rank), n),
            vec![3.0; n],
            "the first call's result"
        );
        assert_eq!(
            get_f32(rank.own.ptr, n),
            vec![6.0; n],
            "the staged call read it"
        );
    }
    destroy_all(ranks, comms);
}

/// A group refused at its end (rank 0 stages a call of several chunks, rank 1 makes it in its
/// window) counts the staged call once: the ranks stay in step and the next group runs.
#[test]
fn a_refused_group_with_a_staged_call_of_several_chunks_keeps_the_ranks_in_step() {
    setup();
    let comms = init_all(2);
    let ranks = RankMemory::of_all(&comms);
    let calls: Vec<CallSpec> = (0..2)
        .map(|r| CallSpec {
            index: 4,
            op: Op::AllReduce,
            n: 2000,
            root: 0,
            staged: r == 0,
            in_place: false,
        })
        .collect();
    for (rank, call) in ranks.iter().zip(&calls) {
        rank.prepare(call, 2, Io::Context);
    }
    check(symmGroupStart(), null_mut());
    for (rank, call) in ranks.iter().zip(&calls) {
        check(rank.issue(call, null_mut()), rank.comm);
    }
    assert_ne!(symmGroupEnd(), symmResult_t::symmSuccess);
    for index in 0..3 {
        let call = CallSpec {
            index,
            staged: index % 2 == 0,
            ..calls[0]
        };
        run_in_group(&ranks, &call, 2, "after a refused group");
    }
    destroy_all(ranks, comms);
}

/// A communicator split in this process has a staging window too.
#[test]
fn a_split_communicator_stages() {
    setup();
    let parents = init_all(2);
    let mut children = vec![null_mut(); 2];
    check(symmGroupStart(), null_mut());
    for (parent, child) in parents.iter().zip(children.iter_mut()) {
        // SAFETY: valid out-pointer, written at the group's end; NULL config.
        check(
            unsafe { symmCommSplit(*parent, 0, 0, child, std::ptr::null()) },
            *parent,
        );
    }
    check(symmGroupEnd(), null_mut());
    let ranks = RankMemory::of_all(&children);
    let call = CallSpec {
        staged: true,
        ..CallSpec::of(4, 2)
    };
    run_in_group(&ranks, &call, 2, "a split communicator");
    destroy_all(ranks, children.into_iter().chain(parents));
}

/// Staged calls of one rank on two streams, not ordered by the caller (different buffers):
/// they share the staging window, which the library orders between the streams.
#[test]
fn staged_calls_on_two_streams_of_a_rank() {
    setup();
    let comms = join_threads(new_unique_id(), 2);
    on_rank_threads(&comms, |rank, comm| {
        let streams = [RankStream::new(), RankStream::new()];
        let memories = [RankMemory::new(comm, rank), RankMemory::new(comm, rank)];
        for round in 0..3 {
            let calls: Vec<CallSpec> = (0..2)
                .map(|k| CallSpec {
                    index: 10 + round * 2 + k,
                    op: Op::AllReduce,
                    n: 2500,
                    root: 0,
                    staged: true,
                    in_place: false,
                })
                .collect();
            for k in 0..2 {
                memories[k].prepare(&calls[k], 2, Io::Stream(&streams[k]));
            }
            for k in 0..2 {
                check(memories[k].issue(&calls[k], streams[k].handle()), comm);
            }
            for k in 0..2 {
                memories[k].check(&calls[k], 2, Io::Stream(&streams[k]), "two streams");
            }
        }
        for stream in &streams {
            stream.synchronize();
        }
    });
    for comm in comms {
        check(symmCommDestroy(comm), null_mut());
    }
}

/// `symmAlltoAllvDevice` with its buffers and count table in the ranks' own memory: staged
/// whole (send buffer, receive buffer and table in; receive buffer and rows 1 and 2 out), the
/// bytes past the received segments unchanged; one whose buffers do not fit the staging window
/// is refused on every rank alike, and the communicator stays usable.
#[test]
fn all_to_all_v_outside_windows_is_staged_whole() {
    setup();
    let nranks = 3;
    let comms = join_threads(new_unique_id(), nranks);
    let i32_type = symmDataType_t::symmInt32 as i32;
    on_rank_threads(&comms, |rank, comm| {
        let stream = RankStream::new();
        let memory = OwnMemory::new(BYTES);
        let (send, recv, table) = (
            memory.ptr,
            memory.ptr.wrapping_add(16 * 1024),
            memory.ptr.wrapping_add(32 * 1024),
        );
        let bound = 300usize;
        for call in 0..4u64 {
            // counts[from][to], the same on every rank; each row and column within the bound.
            let counts: Vec<Vec<i64>> = (0..nranks)
                .map(|from| {
                    (0..nranks)
                        .map(|to| {
                            ((from * 37 + to * 11 + call as usize * 5) % (bound / nranks)) as i64
                        })
                        .collect()
                })
                .collect();
            let data = |from: usize| -> Vec<i32> {
                (0..bound)
                    .map(|i| (from * 100_000 + call as usize * 1000 + i) as i32)
                    .collect()
            };
            let bytes = |v: &[i32]| -> Vec<u8> { v.iter().flat_map(|x| x.to_ne_bytes()).collect() };
            let row: Vec<u8> = counts[rank].iter().flat_map(|c| c.to_ne_bytes()).collect();
            stream.put_bytes(send, &bytes(&data(rank)));
            stream.put_bytes(recv, &vec![0x5A; bound * 4]);
            stream.put_bytes(table, &row);
            stream.put_bytes(table.wrapping_add(8 * nranks), &vec![0xEE; 16 * nranks]);
            let result = symmAlltoAllvDevice(
                send.cast(),
                bound,
                recv.cast(),
                bound,
                table.cast(),
                i32_type,
                comm,
                stream.handle(),
            );
            check(stream.completed(comm, result), comm);
            let mut want = Vec::new();
            let mut rows = vec![0i64; 2 * nranks];
            for from in 0..nranks {
                let start: i64 = counts[from][..rank].iter().sum();
                let n = counts[from][rank];
                rows[from] = n;
                rows[nranks + from] = want.len() as i64;
                want.extend_from_slice(&data(from)[start as usize..(start + n) as usize]);
            }
            let got = stream.get_bytes(recv, bound * 4);
            assert_eq!(
                &got[..want.len() * 4],
                &bytes(&want)[..],
                "rank {rank}, call {call}"
            );
            assert!(
                got[want.len() * 4..].iter().all(|b| *b == 0x5A),
                "past the segments"
            );
            let got_rows: Vec<i64> = stream
                .get_bytes(table.wrapping_add(8 * nranks), 16 * nranks)
                .chunks(8)
                .map(|c| i64::from_ne_bytes(c.try_into().unwrap()))
                .collect();
            assert_eq!(got_rows, rows, "rank {rank}, call {call}: rows 1 and 2");
        }
        // Too large to stage whole in 8 KiB: refused alike on every rank.
        let result = symmAlltoAllvDevice(
            send.cast(),
            4000,
            recv.cast(),
            4000,
            table.cast(),
            i32_type,
            comm,
            stream.handle(),
        );
        assert_eq!(result, symmResult_t::symmInvalidArgument);
        assert!(
            last_error(comm).contains("raise SYMM_STAGING_BYTES"),
            "{}",
            last_error(comm)
        );
        // Still usable.
        let call = CallSpec {
            staged: true,
            ..CallSpec::of(0, nranks)
        };
        let memory = RankMemory::new(comm, rank);
        memory.prepare(&call, nranks, Io::Stream(&stream));
        check(
            stream.completed(comm, memory.issue(&call, stream.handle())),
            comm,
        );
        memory.check(
            &call,
            nranks,
            Io::Stream(&stream),
            "after a refused all-to-all-v",
        );
        stream.synchronize();
    });
    for comm in comms {
        check(symmCommDestroy(comm), null_mut());
    }
}

/// A peer that never makes the call: the staged call times out within the bound, returns the
/// timeout (never success), and leaves its receive buffer as it was.
#[test]
fn a_staged_call_whose_peer_never_arrives_times_out() {
    setup();
    let output = rerun_ignored_test("absent_peer_child", &[("SYMM_TIMEOUT_MS", "2000")]);
    let log = String::from_utf8_lossy(&output.stdout).into_owned()
        + &String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{log}");
    assert!(log.contains("timed out as it should"), "{log}");
}

#[test]
#[ignore = "child process of a_staged_call_whose_peer_never_arrives_times_out"]
fn absent_peer_child() {
    setup();
    let comms = init_all(2);
    let ranks = RankMemory::of_all(&comms);
    let call = CallSpec {
        staged: true,
        ..CallSpec::of(4, 2)
    };
    // Rank 0's call alone, outside a group: rank 1 makes none (the host backend, where the
    // call returns once it ended).
    ranks[0].prepare(&call, 2, Io::Context);
    let start = Instant::now();
    let result = ranks[0].issue(&call, null_mut());
    let took = start.elapsed();
    let message = last_error(comms[0]);
    let (_, recv) = ranks[0].buffers(&call);
    assert_eq!(result, symmResult_t::symmTimeout, "{message}");
    assert!(took < Duration::from_secs(10), "{took:?}");
    assert_eq!(get_f32(recv, call.n), vec![SENTINEL; call.n], "untouched");
    println!("timed out as it should: {message}");
    drop(ranks);
    for comm in comms {
        let _ = symmCommDestroy(comm);
    }
}
