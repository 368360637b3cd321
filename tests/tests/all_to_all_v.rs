//! `symmAlltoAllvDevice` (all-to-all-v whose counts are in device memory) through the C ABI,
//! against a reference: one thread driving every rank in a group (1 to 5 ranks, element sizes
//! 1 to 8, random counts with zeros; two calls per rank fused into one launch), rank threads
//! making long sequences mixed with
//! `symmAlltoAll` and `symmAllReduce` on one window, and a process per rank; counts beyond the
//! bound fail every rank promptly with the cause and change nothing; bad arguments are refused
//! alone and leave the communicator usable; the count table may lie in another window.
//!
//! On the host backend by default; with `SYMM_BACKEND=cuda` on the cuda backend (the simulated
//! GPU runs it in `cargo xtask sim --test`).

use std::ptr::null_mut;
use std::time::{Duration, Instant};
use symm::*;
use symm_tests::*;

/// Bytes of every window.
const WINDOW: usize = 64 * 1024;
/// Where the send buffer, the receive buffer and the count table start in every window.
const SEND: usize = 256;
const RECV: usize = 24 * 1024;
const TABLE: usize = 48 * 1024 + 8;
/// A region for the all-reduces mixed into the sequences.
const REDUCE: usize = 56 * 1024;

const DTYPES: [(i32, usize); 4] = [
    (symmDataType_t::symmUint8 as i32, 1),
    (symmDataType_t::symmFloat16 as i32, 2),
    (symmDataType_t::symmFloat32 as i32, 4),
    (symmDataType_t::symmFloat64 as i32, 8),
];

fn setup() {
    use_backend_from_env();
    if std::env::var("SYMM_TIMEOUT_MS").is_err() {
        // SAFETY: before any communicator exists in this process (each test's first call).
        unsafe { std::env::set_var("SYMM_TIMEOUT_MS", "20000") };
    }
}

/// Random counts `[from][to]` whose rows and columns fit `bound`, zeros and full shares among
/// them; the same for every caller with the same seed.
fn random_counts(seed: u64, nranks: usize, bound: usize) -> Vec<Vec<i64>> {
    let mut rng = Rng(seed);
    let share = (bound / nranks) as u64;
    (0..nranks)
        .map(|_| {
            (0..nranks)
                .map(|_| match rng.next_u64() % 4 {
                    0 => 0,
                    1 => share as i64,
                    _ => (rng.next_u64() % (share + 1)) as i64,
                })
                .collect()
        })
        .collect()
}

/// The bytes rank `rank` sends in call `call` (its whole send buffer).
fn send_bytes(rank: usize, call: usize, bytes: usize) -> Vec<u8> {
    (0..bytes)
        .map(|i| (i * 7 + rank * 31 + call * 13 + i / 251) as u8)
        .collect()
}

fn table_bytes(row: &[i64]) -> Vec<u8> {
    row.iter().flat_map(|v| v.to_ne_bytes()).collect()
}

fn table_of(bytes: &[u8]) -> Vec<i64> {
    bytes
        .chunks(8)
        .map(|c| i64::from_ne_bytes(c.try_into().unwrap()))
        .collect()
}

/// What rank `rank` holds after call `call` with `counts`: its receive buffer's first bytes
/// (the segments packed in rank order) and its table's rows 1 and 2.
fn expected(
    rank: usize,
    call: usize,
    counts: &[Vec<i64>],
    element: usize,
    bound: usize,
) -> (Vec<u8>, Vec<i64>) {
    let nranks = counts.len();
    let mut received = Vec::new();
    let mut rows = vec![0i64; 2 * nranks];
    for from in 0..nranks {
        let n = counts[from][rank] as usize * element;
        let start: usize = counts[from][..rank].iter().sum::<i64>() as usize * element;
        let data = send_bytes(from, call, bound * element);
        rows[from] = counts[from][rank];
        rows[nranks + from] = (received.len() / element) as i64;
        received.extend_from_slice(&data[start..start + n]);
    }
    (received, rows)
}

/// Check rank `rank`'s window after call `call`: the received segments, then the unchanged
/// rest of the receive buffer (`filler`), the table's rows.
fn check_rank(
    got_recv: &[u8],
    got_table: &[i64],
    expected: &(Vec<u8>, Vec<i64>),
    filler: u8,
    what: &str,
) {
    let (want, rows) = expected;
    assert!(
        got_recv[..want.len()] == want[..],
        "{what}: the received segments differ"
    );
    assert!(
        got_recv[want.len()..].iter().all(|b| *b == filler),
        "{what}: bytes past the received segments changed"
    );
    let nranks = rows.len() / 2;
    assert_eq!(
        &got_table[nranks..],
        &rows[..],
        "{what}: rows 1 and 2 of the table"
    );
}

#[test]
fn one_thread_drives_every_rank_in_a_group() {
    setup();
    for nranks in 1..=5usize {
        let comms = init_all(nranks);
        let buffers = alloc_windows(&comms, WINDOW);
        for (call, (dtype, element)) in DTYPES.into_iter().enumerate() {
            let bound = (RECV - SEND) / element / 2 - call * 3 - 1;
            let counts = random_counts(nranks as u64 * 100 + call as u64, nranks, bound);
            let filler = 0xA0 + call as u8;
            for (rank, b) in buffers.iter().enumerate() {
                // SAFETY: offsets inside the window.
                unsafe {
                    put_bytes(b.base.add(SEND), &send_bytes(rank, call, bound * element));
                    put_bytes(b.base.add(RECV), &vec![filler; bound * element]);
                    put_bytes(b.base.add(TABLE), &table_bytes(&counts[rank]));
                    put_bytes(b.base.add(TABLE + 8 * nranks), &vec![0xEE; 16 * nranks]);
                }
            }
            check(symmGroupStart(), null_mut());
            for b in &buffers {
                // SAFETY: offsets inside the window.
                let result = unsafe {
                    symmAlltoAllvDevice(
                        b.base.add(SEND).cast(),
                        bound,
                        b.base.add(RECV).cast(),
                        bound + 5,
                        b.base.add(TABLE).cast(),
                        dtype,
                        b.comm,
                        null_mut(),
                    )
                };
                check(result, b.comm);
            }
            check(symmGroupEnd(), null_mut());
            for (rank, b) in buffers.iter().enumerate() {
                // SAFETY: offsets inside the window.
                let (recv, table) = unsafe {
                    (
                        get_bytes(b.base.add(RECV), bound * element),
                        table_of(&get_bytes(b.base.add(TABLE), 24 * nranks)),
                    )
                };
                assert_eq!(&table[..nranks], &counts[rank][..], "row 0 unchanged");
                let what = format!("{nranks} ranks, {element}-byte elements, rank {rank}");
                check_rank(
                    &recv,
                    &table,
                    &expected(rank, call, &counts, element, bound),
                    filler,
                    &what,
                );
            }
        }
        teardown(buffers);
    }
}

/// Two all-to-all-v calls of every rank in one group (one thread driving every rank), each with
/// its own buffers and table: they run fused into one launch, both exact.
#[test]
fn two_calls_in_a_group_run_fused() {
    setup();
    let nranks = 3;
    let comms = init_all(nranks);
    let buffers = alloc_windows(&comms, WINDOW);
    let u16_type = symmDataType_t::symmFloat16 as i32;
    let element = 2;
    // (send, recv, table) of each call, in bytes.
    let places = [(0usize, 8192usize, 16384usize), (20480, 28672, 36864)];
    let bound = 1500;
    let all_counts: Vec<Vec<Vec<i64>>> = (0..2)
        .map(|k| random_counts(40 + k, nranks, bound))
        .collect();
    for (rank, b) in buffers.iter().enumerate() {
        for (k, (send, recv, table)) in places.into_iter().enumerate() {
            // SAFETY: offsets inside the window.
            unsafe {
                put_bytes(b.base.add(send), &send_bytes(rank, k, bound * element));
                put_bytes(b.base.add(recv), &vec![0x33; bound * element]);
                put_bytes(b.base.add(table), &table_bytes(&all_counts[k][rank]));
            }
        }
    }
    check(symmGroupStart(), null_mut());
    for b in &buffers {
        for (send, recv, table) in places {
            // SAFETY: offsets inside the window.
            let result = unsafe {
                symmAlltoAllvDevice(
                    b.base.add(send).cast(),
                    bound,
                    b.base.add(recv).cast(),
                    bound,
                    b.base.add(table).cast(),
                    u16_type,
                    b.comm,
                    null_mut(),
                )
            };
            check(result, b.comm);
        }
    }
    check(symmGroupEnd(), null_mut());
    for (rank, b) in buffers.iter().enumerate() {
        for (k, (_, recv, table)) in places.into_iter().enumerate() {
            // SAFETY: offsets inside the window.
            let (got, rows) = unsafe {
                (
                    get_bytes(b.base.add(recv), bound * element),
                    table_of(&get_bytes(b.base.add(table), 24 * nranks)),
                )
            };
            let what = format!("call {k}, rank {rank}");
            let want = expected(rank, k, &all_counts[k], element, bound);
            check_rank(&got, &rows, &want, 0x33, &what);
        }
    }
    teardown(buffers);
}

/// The MoE pattern in one group: an all-to-all delivers each rank its counts (one int64 from
/// every rank) into the table of an all-to-all-v, after another all-to-all-v of the same type.
/// The second all-to-all-v would fuse with the first, which runs before the all-to-all, unless
/// its table counts as memory it reads: then it stays after the all-to-all (with the table
/// ignored, it would read zeros).
#[test]
fn counts_delivered_by_an_earlier_call_in_the_group() {
    setup();
    let nranks = 3;
    let comms = init_all(nranks);
    let buffers = alloc_windows(&comms, WINDOW);
    let i64_type = symmDataType_t::symmInt64 as i32;
    let counts = random_counts(77, nranks, 900);
    // The all-to-all: rank p sends rank r the count r will send p, so rank r receives its row
    // of `counts` (in rank order) into the table.
    let (early_table, column_at) = (REDUCE, REDUCE + 512);
    for (p, b) in buffers.iter().enumerate() {
        let column: Vec<i64> = (0..nranks).map(|r| counts[r][p]).collect();
        // SAFETY: offsets inside the window.
        unsafe {
            put_bytes(b.base.add(column_at), &table_bytes(&column));
            put_bytes(b.base.add(early_table), &table_bytes(&vec![0; nranks]));
            put_bytes(b.base.add(TABLE), &vec![0; 24 * nranks]);
            put_bytes(b.base.add(SEND), &send_bytes(p, 0, 900 * 8));
            put_bytes(b.base.add(RECV), &vec![0x44; 900 * 8]);
        }
    }
    check(symmGroupStart(), null_mut());
    for b in &buffers {
        // SAFETY: offsets inside the window.
        let results = unsafe {
            [
                // An all-to-all-v of nothing (its table's row 0 is zeros), before the rest.
                symmAlltoAllvDevice(
                    b.base.add(REDUCE + 1024).cast(),
                    8,
                    b.base.add(REDUCE + 2048).cast(),
                    8,
                    b.base.add(early_table).cast(),
                    i64_type,
                    b.comm,
                    null_mut(),
                ),
                symmAlltoAll(
                    b.base.add(column_at).cast(),
                    b.base.add(TABLE).cast(),
                    1,
                    i64_type,
                    b.comm,
                    null_mut(),
                ),
                symmAlltoAllvDevice(
                    b.base.add(SEND).cast(),
                    900,
                    b.base.add(RECV).cast(),
                    900,
                    b.base.add(TABLE).cast(),
                    i64_type,
                    b.comm,
                    null_mut(),
                ),
            ]
        };
        for result in results {
            check(result, b.comm);
        }
    }
    check(symmGroupEnd(), null_mut());
    for (rank, b) in buffers.iter().enumerate() {
        // SAFETY: offsets inside the window.
        let (got, table) = unsafe {
            (
                get_bytes(b.base.add(RECV), 900 * 8),
                table_of(&get_bytes(b.base.add(TABLE), 24 * nranks)),
            )
        };
        assert_eq!(
            &table[..nranks],
            &counts[rank][..],
            "rank {rank}: the delivered counts"
        );
        let what = format!("rank {rank}");
        check_rank(
            &got,
            &table,
            &expected(rank, 0, &counts, 8, 900),
            0x44,
            &what,
        );
    }
    teardown(buffers);
}

/// Rank threads, each on its own stream, make 24 calls on one window: all-to-all-v with new
/// counts each time, a fixed-count all-to-all every third call and an all-reduce every fourth,
/// ungrouped; every result checked.
#[test]
fn rank_threads_make_long_mixed_sequences() {
    setup();
    let nranks = 3;
    let comms = join_threads(new_unique_id(), nranks);
    on_rank_threads(&comms, |rank, comm| {
        let stream = RankStream::new();
        let s = stream.handle();
        let (buffer, window) = window_of_bytes(comm, WINDOW);
        let base = buffer as *mut u8;
        let at = |offset: usize| {
            // SAFETY: offsets inside the window.
            unsafe { base.add(offset) }
        };
        let f32_type = symmDataType_t::symmFloat32 as i32;
        for call in 0..24 {
            let (dtype, element) = DTYPES[call % DTYPES.len()];
            let bound = 1000 + call * 17;
            let counts = random_counts(7 + call as u64, nranks, bound);
            let filler = call as u8;
            stream.put_bytes(at(SEND), &send_bytes(rank, call, bound * element));
            stream.put_bytes(at(RECV), &vec![filler; bound * element]);
            stream.put_bytes(at(TABLE), &table_bytes(&counts[rank]));
            let result = symmAlltoAllvDevice(
                at(SEND).cast(),
                bound,
                at(RECV).cast(),
                bound,
                at(TABLE).cast(),
                dtype,
                comm,
                s,
            );
            check(stream.completed(comm, result), comm);
            let recv = stream.get_bytes(at(RECV), bound * element);
            let table = table_of(&stream.get_bytes(at(TABLE), 24 * nranks));
            let what = format!("call {call}, rank {rank}");
            check_rank(
                &recv,
                &table,
                &expected(rank, call, &counts, element, bound),
                filler,
                &what,
            );
            if call % 3 == 2 {
                let per_peer = 40;
                let send: Vec<f32> = (0..per_peer * nranks)
                    .map(|i| (rank * 1000 + i) as f32)
                    .collect();
                stream.put_f32(at(SEND), &send);
                let result = symmAlltoAll(
                    at(SEND).cast(),
                    at(RECV).cast(),
                    per_peer,
                    f32_type,
                    comm,
                    s,
                );
                check(stream.completed(comm, result), comm);
                let got = stream.get_f32(at(RECV), per_peer * nranks);
                for from in 0..nranks {
                    for i in 0..per_peer {
                        assert_eq!(
                            got[from * per_peer + i],
                            (from * 1000 + rank * per_peer + i) as f32
                        );
                    }
                }
            }
            if call % 4 == 3 {
                stream.put_f32(at(REDUCE), &vec![rank as f32 + 1.0; 99]);
                let result = symmAllReduce(
                    at(REDUCE).cast(),
                    at(REDUCE).cast(),
                    99,
                    f32_type,
                    symmRedOp_t::symmSum as i32,
                    comm,
                    s,
                );
                check(stream.completed(comm, result), comm);
                let want = (nranks * (nranks + 1) / 2) as f32;
                assert!(stream.get_f32(at(REDUCE), 99).iter().all(|v| *v == want));
            }
        }
        check(symmCommWindowDeregister(comm, window), comm);
        check(symmMemFree(comm, buffer), comm);
        check(symmCommDestroy(comm), null_mut());
    });
}

/// The counts that ranks send to rank 1 sum past the bound: every rank's call fails well
/// before the 20 s bound, naming rank 1 and the cause, and no receive buffer changes.
#[test]
fn counts_beyond_the_bound_fail_every_rank_promptly() {
    setup();
    let nranks = 3;
    let comms = join_threads(new_unique_id(), nranks);
    on_rank_threads(&comms, |rank, comm| {
        let stream = RankStream::new();
        let s = stream.handle();
        let (buffer, _window) = window_of_bytes(comm, WINDOW);
        let base = buffer as *mut u8;
        let at = |offset: usize| {
            // SAFETY: offsets inside the window.
            unsafe { base.add(offset) }
        };
        let bound = 100;
        let counts: Vec<i64> = (0..nranks)
            .map(|to| if to == 1 { 40 } else { 10 })
            .collect();
        stream.put_bytes(at(SEND), &send_bytes(rank, 0, bound * 4));
        stream.put_bytes(at(RECV), &vec![0x5A; bound * 4]);
        stream.put_bytes(at(TABLE), &table_bytes(&counts));
        let started = Instant::now();
        let result = symmAlltoAllvDevice(
            at(SEND).cast(),
            bound,
            at(RECV).cast(),
            bound,
            at(TABLE).cast(),
            symmDataType_t::symmFloat32 as i32,
            comm,
            s,
        );
        let result = stream.completed(comm, result);
        let took = started.elapsed();
        let message = last_error(comm);
        // The rank's own kernel refused (invalid argument), or a peer's host failed the
        // communicator first (remote error): either way the message carries the cause.
        assert!(
            [
                symmResult_t::symmInvalidArgument,
                symmResult_t::symmRemoteError
            ]
            .contains(&result),
            "rank {rank}: {result:?}: {message}"
        );
        assert!(
            took < Duration::from_secs(5),
            "rank {rank} failed after {took:?}"
        );
        assert!(
            message.contains("refused its counts on every rank")
                && message.contains("the counts sent to rank 1 sum to more elements"),
            "rank {rank}: {message}"
        );
        assert!(
            stream
                .get_bytes(at(RECV), bound * 4)
                .iter()
                .all(|b| *b == 0x5A)
        );
        let _ = symmCommDestroy(comm);
    });
}

/// Each bad argument is refused on the calling rank alone, naming it, before anything is
/// launched; the communicator stays usable (every rank refuses the same call, so they agree).
#[test]
fn bad_arguments_are_refused_and_leave_the_communicator_usable() {
    setup();
    let nranks = 2;
    let comms = init_all(nranks);
    let buffers = alloc_windows(&comms, WINDOW);
    let others = alloc_windows(&comms, 4096);
    let f32_type = symmDataType_t::symmFloat32 as i32;
    type Case = (
        &'static str,
        Box<dyn Fn(&RankBuffer, &RankBuffer) -> symmResult_t>,
        &'static str,
    );
    let call =
        |b: &RankBuffer, send: *mut u8, recv: *mut u8, table: *mut u8, count: usize, dtype: i32| {
            symmAlltoAllvDevice(
                send.cast(),
                count,
                recv.cast(),
                count,
                table.cast(),
                dtype,
                b.comm,
                null_mut(),
            )
        };
    // Every case's offsets lie inside the windows.
    let cases: Vec<Case> = vec![
        (
            "a NULL count table",
            Box::new(move |b, _| {
                call(
                    b,
                    b.base.wrapping_add(SEND),
                    b.base.wrapping_add(RECV),
                    null_mut(),
                    10,
                    f32_type,
                )
            }),
            "counts is NULL",
        ),
        (
            "a misaligned table",
            Box::new(move |b, _| {
                call(
                    b,
                    b.base.wrapping_add(SEND),
                    b.base.wrapping_add(RECV),
                    b.base.wrapping_add(TABLE + 4),
                    10,
                    f32_type,
                )
            }),
            "counts is at offset",
        ),
        (
            "a table inside recvbuff",
            Box::new(move |b, _| {
                call(
                    b,
                    b.base.wrapping_add(SEND),
                    b.base.wrapping_add(RECV),
                    b.base.wrapping_add(RECV + 16),
                    10,
                    f32_type,
                )
            }),
            "counts and recvbuff overlap",
        ),
        (
            "overlapping buffers",
            Box::new(move |b, _| {
                call(
                    b,
                    b.base.wrapping_add(RECV),
                    b.base.wrapping_add(RECV + 8),
                    b.base.wrapping_add(TABLE),
                    10,
                    f32_type,
                )
            }),
            "sendbuff and recvbuff overlap",
        ),
        (
            "a capacity past the window",
            Box::new(move |b, _| {
                call(
                    b,
                    b.base.wrapping_add(SEND),
                    b.base.wrapping_add(RECV),
                    b.base.wrapping_add(TABLE),
                    WINDOW,
                    f32_type,
                )
            }),
            "overruns its end",
        ),
        (
            "a bad data type",
            Box::new(move |b, _| {
                call(
                    b,
                    b.base.wrapping_add(SEND),
                    b.base.wrapping_add(RECV),
                    b.base.wrapping_add(TABLE),
                    10,
                    99,
                )
            }),
            "datatype = 99",
        ),
    ];
    for (what, case, names) in &cases {
        for (b, o) in buffers.iter().zip(&others) {
            let result = case(b, o);
            assert_eq!(result, symmResult_t::symmInvalidArgument, "{what}");
            let message = last_error(b.comm);
            assert!(message.contains(names), "{what}: {message}");
        }
    }
    // Capacities that differ between the ranks are refused on every rank before anything
    // runs (the kernel checks every rank's counts against the same bounds).
    check(symmGroupStart(), null_mut());
    for (rank, b) in buffers.iter().enumerate() {
        // SAFETY: offsets inside the window.
        let result = unsafe {
            symmAlltoAllvDevice(
                b.base.add(SEND).cast(),
                10 + rank,
                b.base.add(RECV).cast(),
                10,
                b.base.add(TABLE).cast(),
                f32_type,
                b.comm,
                null_mut(),
            )
        };
        check(result, b.comm);
    }
    let result = symmGroupEnd();
    assert_eq!(result, symmResult_t::symmInvalidUsage);
    let message = last_error(buffers[0].comm);
    assert!(message.contains("sendcount 10 vs 11"), "{message}");
    check(symmGroupStart(), null_mut());
    for (rank, b) in buffers.iter().enumerate() {
        let (send, recv) = (b.base.wrapping_add(SEND), b.base.wrapping_add(RECV));
        let table = b.base.wrapping_add(TABLE);
        let result = symmAlltoAllvDevice(
            send.cast(),
            10,
            recv.cast(),
            10 + rank,
            table.cast(),
            f32_type,
            b.comm,
            null_mut(),
        );
        check(result, b.comm);
    }
    assert_eq!(symmGroupEnd(), symmResult_t::symmInvalidUsage);
    let message = last_error(buffers[0].comm);
    assert!(message.contains("recvcount 10 vs 11"), "{message}");
    // So are count tables at different offsets, or in different windows: a peer reads a rank's
    // table where its own is.
    let others_base: Vec<*mut u8> = others.iter().map(|o| o.base).collect();
    type TableAt<'a> = Box<dyn Fn(usize, &RankBuffer) -> *mut u8 + 'a>;
    let tables: [(&str, TableAt); 2] = [
        (
            "count table at window offset",
            Box::new(|rank, b| b.base.wrapping_add(TABLE + 8 * rank)),
        ),
        (
            "count table in window registration",
            Box::new(|rank, b| {
                if rank == 0 {
                    b.base.wrapping_add(TABLE)
                } else {
                    others_base[rank]
                }
            }),
        ),
    ];
    for (names, table) in &tables {
        check(symmGroupStart(), null_mut());
        for (rank, b) in buffers.iter().enumerate() {
            let result = call(
                b,
                b.base.wrapping_add(SEND),
                b.base.wrapping_add(RECV),
                table(rank, b),
                10,
                f32_type,
            );
            check(result, b.comm);
        }
        assert_eq!(symmGroupEnd(), symmResult_t::symmInvalidUsage, "{names}");
        let message = last_error(buffers[0].comm);
        assert!(message.contains(names), "{message}");
    }
    // Still usable: a good call in a group.
    let counts = vec![vec![3i64; nranks]; nranks];
    for (rank, b) in buffers.iter().enumerate() {
        // SAFETY: offsets inside the window.
        unsafe {
            put_bytes(b.base.add(SEND), &send_bytes(rank, 0, 40));
            put_bytes(b.base.add(TABLE), &table_bytes(&counts[rank]));
        }
    }
    check(symmGroupStart(), null_mut());
    for b in &buffers {
        // SAFETY: offsets inside the window.
        check(
            unsafe {
                call(
                    b,
                    b.base.add(SEND),
                    b.base.add(RECV),
                    b.base.add(TABLE),
                    10,
                    f32_type,
                )
            },
            b.comm,
        );
    }
    check(symmGroupEnd(), null_mut());
    for (rank, b) in buffers.iter().enumerate() {
        // SAFETY: offsets inside the window.
        let got = unsafe { get_bytes(b.base.add(RECV), 24) };
        let (want, _) = expected(rank, 0, &counts, 4, 10);
        assert_eq!(got, want);
    }
    // The table in another window (as PyTorch's three symmetric tensors are): read and written
    // there.
    let counts = vec![vec![2i64, 4], vec![1, 0]];
    for (rank, (b, o)) in buffers.iter().zip(&others).enumerate() {
        // SAFETY: offsets inside the windows.
        unsafe {
            put_bytes(b.base.add(SEND), &send_bytes(rank, 1, 40));
            put_bytes(o.base.add(64), &table_bytes(&counts[rank]));
        }
    }
    check(symmGroupStart(), null_mut());
    for (b, o) in buffers.iter().zip(&others) {
        // SAFETY: offsets inside the windows.
        check(
            unsafe {
                call(
                    b,
                    b.base.add(SEND),
                    b.base.add(RECV),
                    o.base.add(64),
                    10,
                    f32_type,
                )
            },
            b.comm,
        );
    }
    check(symmGroupEnd(), null_mut());
    for (rank, (b, o)) in buffers.iter().zip(&others).enumerate() {
        let (want, rows) = expected(rank, 1, &counts, 4, 10);
        // SAFETY: offsets inside the windows.
        let (got, table) = unsafe {
            (
                get_bytes(b.base.add(RECV), want.len()),
                table_of(&get_bytes(o.base.add(64), 48)),
            )
        };
        assert_eq!(got, want, "rank {rank}, the table in another window");
        assert_eq!(
            &table[2..],
            &rows[..],
            "rank {rank}'s table in another window"
        );
    }
    for o in others {
        check(symmCommWindowDeregister(o.comm, o.window), o.comm);
        check(symmMemFree(o.comm, o.base.cast()), o.comm);
    }
    teardown(buffers);
}

const CHILD_ENV: &str = "SYMM_TEST_A2AV_RANK";
const ID_ENV: &str = "SYMM_TEST_A2AV_ID";

/// Two processes: ten calls with new counts each, checked; then rank 0 sends past rank 1's
/// bound, and both fail promptly naming the cause.
#[test]
fn a_process_per_rank() {
    setup();
    let id = new_unique_id();
    let ranks: Vec<Vec<(String, String)>> = (0..2)
        .map(|rank| {
            vec![
                (CHILD_ENV.to_string(), rank.to_string()),
                (ID_ENV.to_string(), id_to_hex(&id)),
                ("SYMM_TIMEOUT_MS".to_string(), "20000".to_string()),
            ]
        })
        .collect();
    let results = run_rank_processes("rank_process", &ranks, Duration::from_secs(300));
    for (rank, (ok, log)) in results.iter().enumerate() {
        assert!(ok, "rank process {rank} failed:\n{log}");
        let outcome =
            parse_outcome(rank, log).unwrap_or_else(|| panic!("rank {rank}: no outcome:\n{log}"));
        assert!(
            [
                symmResult_t::symmInvalidArgument,
                symmResult_t::symmRemoteError
            ]
            .contains(&outcome.result),
            "rank {rank}: {:?}: {}",
            outcome.result,
            outcome.message
        );
        assert!(
            outcome.took < Duration::from_secs(5),
            "rank {rank}: {:?}",
            outcome.took
        );
        assert!(
            outcome
                .message
                .contains("rank 0's counts sum to more elements"),
            "rank {rank}: {}",
            outcome.message
        );
    }
}

/// One rank of [`a_process_per_rank`] (run by it, in a process of its own).
#[test]
#[ignore = "a rank process of a_process_per_rank"]
fn rank_process() {
    let Ok(rank) = std::env::var(CHILD_ENV) else {
        return;
    };
    setup();
    let rank: usize = rank.parse().unwrap();
    let id = id_from_hex(&std::env::var(ID_ENV).unwrap());
    let mut comm = null_mut();
    // SAFETY: valid out-pointer.
    check(
        unsafe { symmCommInitRank(&mut comm, 2, id, rank as i32) },
        null_mut(),
    );
    let stream = RankStream::new();
    let s = stream.handle();
    let (buffer, _window) = window_of_bytes(comm, WINDOW);
    let base = buffer as *mut u8;
    let at = |offset: usize| {
        // SAFETY: offsets inside the window.
        unsafe { base.add(offset) }
    };
    let f64_type = symmDataType_t::symmFloat64 as i32;
    for call in 0..10 {
        let bound = 500 + call;
        let counts = random_counts(call as u64, 2, bound);
        stream.put_bytes(at(SEND), &send_bytes(rank, call, bound * 8));
        stream.put_bytes(at(RECV), &vec![0x11; bound * 8]);
        stream.put_bytes(at(TABLE), &table_bytes(&counts[rank]));
        let result = symmAlltoAllvDevice(
            at(SEND).cast(),
            bound,
            at(RECV).cast(),
            bound,
            at(TABLE).cast(),
            f64_type,
            comm,
            s,
        );
        check(stream.completed(comm, result), comm);
        let recv = stream.get_bytes(at(RECV), bound * 8);
        let table = table_of(&stream.get_bytes(at(TABLE), 48));
        check_rank(
            &recv,
            &table,
            &expected(rank, call, &counts, 8, bound),
            0x11,
            &format!("call {call}"),
        );
    }
    let over: Vec<i64> = if rank == 0 {
        vec![300, 300]
    } else {
        vec![1, 1]
    };
    stream.put_bytes(at(TABLE), &table_bytes(&over));
    let started = Instant::now();
    let result = symmAlltoAllvDevice(
        at(SEND).cast(),
        500,
        at(RECV).cast(),
        500,
        at(TABLE).cast(),
        f64_type,
        comm,
        s,
    );
    let result = stream.completed(comm, result);
    print_outcome(result, started.elapsed(), &last_error(comm));
    let _ = symmCommDestroy(comm);
}
