//! Every launch pattern of the README and docs/USER_GUIDE.md, the C examples, symm-perf and the
//! GPU test set, driven through the C ABI into the model backend (`symm::internals::model`), which
//! plays each launch schedule against CUDA's ordering rules (legacy-stream synchronization,
//! events, kernels that spin on each other, co-residency, stream capture) and reports deadlocks.
//! No GPU needed.

use std::ffi::{c_int, c_void};
use symm::internals::model;
use symm::internals::{LaunchSchedule, StreamOp};
use symm::*;
use symm_tests::*;

const F32: i32 = symmDataType_t::symmFloat32 as i32;
const SUM: i32 = symmRedOp_t::symmSum as i32;

/// Serialize (the model is process-wide), reset the model and select it.
fn setup() -> std::sync::MutexGuard<'static, ()> {
    let guard = model::lock();
    model::activate();
    guard
}

fn init_on(devices: &[c_int]) -> Vec<symmComm_t> {
    let mut comms = vec![std::ptr::null_mut(); devices.len()];
    // SAFETY: both arrays hold devices.len() elements.
    check(
        unsafe { symmCommInitAll(comms.as_mut_ptr(), devices.len() as c_int, devices.as_ptr()) },
        std::ptr::null_mut(),
    );
    assert_eq!(backend(comms[0]), "model");
    comms
}

fn stream(handle: u64) -> symmStream_t {
    handle as usize as symmStream_t
}

fn at(b: &RankBuffer, offset: usize) -> *mut c_void {
    // SAFETY: offsets stay inside the allocation (callers size it).
    unsafe { b.base.add(offset).cast() }
}

#[track_caller]
fn quiescent() {
    if let Err(report) = model::run() {
        panic!("model: {report}");
    }
}

fn all_reduce(b: &RankBuffer, send: usize, recv: usize, count: usize, s: u64) -> symmResult_t {
    symmAllReduce(at(b, send), at(b, recv), count, F32, SUM, b.comm, stream(s))
}

/// One thread drives every rank with groups; all ranks on one device, one stream for all (the
/// NULL stream: `allreduce.c`; a blocking one: the GPU test set; a non-blocking one:
/// symm-perf), then one stream per rank (docs/USER_GUIDE.md), over every algorithm's size range and the
/// three collectives.
#[test]
fn group_all_ranks_on_one_device() {
    let _g = setup();
    let comms = init_on(&[0; 4]);
    let buffers = alloc_windows(&comms, 1 << 22);
    let shared = [
        0,
        model::create_stream(0, false),
        model::create_stream(0, true),
    ];
    let own: Vec<u64> = (0..4).map(|_| model::create_stream(0, false)).collect();
    for (count, shared) in [64usize, 4096, 200_000].into_iter().zip(shared) {
        check(symmGroupStart(), std::ptr::null_mut());
        for b in &buffers {
            check(all_reduce(b, 0, 0, count, shared), b.comm);
        }
        check(symmGroupEnd(), std::ptr::null_mut());
        check(symmGroupStart(), std::ptr::null_mut());
        for (r, b) in buffers.iter().enumerate() {
            check(all_reduce(b, 0, 4 * count, count, own[r]), b.comm);
            check(
                symmAllGather(
                    at(b, 0),
                    at(b, 1 << 20),
                    count / 4,
                    F32,
                    b.comm,
                    stream(own[r]),
                ),
                b.comm,
            );
            check(
                symmReduceScatter(
                    at(b, 0),
                    at(b, 1 << 21),
                    count / 4,
                    F32,
                    SUM,
                    b.comm,
                    stream(own[r]),
                ),
                b.comm,
            );
        }
        check(symmGroupEnd(), std::ptr::null_mut());
        quiescent();
    }
    teardown(buffers);
}

/// One thread drives ranks spread over two devices, with groups.
#[test]
fn group_ranks_on_two_devices() {
    let _g = setup();
    let comms = init_on(&[0, 0, 1, 1]);
    let buffers = alloc_windows(&comms, 1 << 20);
    let streams = [
        model::create_stream(0, false),
        model::create_stream(1, false),
    ];
    for count in [64usize, 100_000] {
        check(symmGroupStart(), std::ptr::null_mut());
        for (r, b) in buffers.iter().enumerate() {
            check(all_reduce(b, 0, 0, count, streams[r / 2]), b.comm);
        }
        check(symmGroupEnd(), std::ptr::null_mut());
        quiescent();
    }
    // One launch per device per call, each serving that device's two ranks, the same grid.
    let launches = model::launches();
    assert_eq!(launches.len(), 4);
    for pair in launches.chunks(2) {
        assert_eq!((pair[0].device, pair[1].device), (0, 1));
        assert_eq!(
            (pair[0].ranks.clone(), pair[1].ranks.clone()),
            (vec![0, 1], vec![2, 3])
        );
        assert_eq!(pair[0].grid, pair[1].grid);
    }
    teardown(buffers);
}

/// One rank per device (every multi-process user): each launch goes on the caller's stream.
#[test]
fn one_rank_per_device_takes_the_short_path() {
    let _g = setup();
    let comms = init_on(&[0, 1]);
    let buffers = alloc_windows(&comms, 1 << 20);
    let streams = [
        model::create_stream(0, false),
        model::create_stream(1, false),
    ];
    check(symmGroupStart(), std::ptr::null_mut());
    for (r, b) in buffers.iter().enumerate() {
        check(all_reduce(b, 0, 0, 1000, streams[r]), b.comm);
    }
    check(symmGroupEnd(), std::ptr::null_mut());
    quiescent();
    let ops = model::operations();
    assert!(
        ops.iter().all(
            |op| matches!(op, symm::internals::StreamOp::Launch(l) if streams.contains(&l.stream))
        ),
        "expected only launches on the callers' streams, got {ops:#?}"
    );
    teardown(buffers);
}

/// Mixed in-place and out-of-place ranks of one all-reduce, in a group.
#[test]
fn group_mixed_in_place_all_reduce() {
    let _g = setup();
    let comms = init_on(&[0; 2]);
    let buffers = alloc_windows(&comms, 1 << 20);
    let s = model::create_stream(0, false);
    check(symmGroupStart(), std::ptr::null_mut());
    check(all_reduce(&buffers[0], 0, 0, 1000, s), buffers[0].comm);
    check(all_reduce(&buffers[1], 0, 8192, 1000, s), buffers[1].comm);
    check(symmGroupEnd(), std::ptr::null_mut());
    quiescent();
    // One cooperative launch serving both ranks, directly on the shared stream.
    let launches = model::launches();
    assert_eq!(launches.len(), 1, "{launches:?}");
    assert!(launches[0].cooperative && launches[0].ranks == [0, 1] && launches[0].stream == s);
    // One task per rank; each rank's entry holds its own offsets and flags.
    assert_eq!(launches[0].task_count, 1);
    assert_eq!(
        launches[0].tasks[0].flags,
        symm_device::symmetric::FLAG_IN_PLACE
    );
    assert_eq!(
        (launches[0].tasks[1].recv_offset, launches[0].tasks[1].flags),
        (8192, 0)
    );
    teardown(buffers);
}

/// In-place all-gather and reduce-scatter in a group, all ranks in place, then mixed.
#[test]
fn group_in_place_all_gather_and_reduce_scatter() {
    let _g = setup();
    let comms = init_on(&[0; 3]);
    let buffers = alloc_windows(&comms, 1 << 20);
    let s = model::create_stream(0, false);
    let count = 1000;
    for mixed in [false, true] {
        check(symmGroupStart(), std::ptr::null_mut());
        for (r, b) in buffers.iter().enumerate() {
            // All-gather in place: send = recv + rank·count.
            let send = if mixed && r == 1 {
                1 << 19
            } else {
                4 * r * count
            };
            check(
                symmAllGather(at(b, send), at(b, 0), count, F32, b.comm, stream(s)),
                b.comm,
            );
        }
        for (r, b) in buffers.iter().enumerate() {
            // Reduce-scatter in place: recv = send + rank·count.
            let recv = if mixed && r == 2 {
                1 << 19
            } else {
                4 * r * count
            };
            check(
                symmReduceScatter(at(b, 0), at(b, recv), count, F32, SUM, b.comm, stream(s)),
                b.comm,
            );
        }
        check(symmGroupEnd(), std::ptr::null_mut());
        quiescent();
    }
    teardown(buffers);
}

/// A sequence of calls on one window, outside and inside groups, several collectives per rank
/// in one group (per-rank call order kept).
#[test]
fn sequences_on_one_window() {
    let _g = setup();
    let comms = init_on(&[0; 2]);
    let buffers = alloc_windows(&comms, 1 << 20);
    let s = model::create_stream(0, false);
    for i in 0..5 {
        check(symmGroupStart(), std::ptr::null_mut());
        for b in &buffers {
            check(all_reduce(b, 0, 0, 10 + i * 1000, s), b.comm);
            check(all_reduce(b, 0, 1 << 18, 1000, s), b.comm);
            check(
                symmAllGather(at(b, 0), at(b, 1 << 19), 100, F32, b.comm, stream(s)),
                b.comm,
            );
        }
        check(symmGroupEnd(), std::ptr::null_mut());
    }
    quiescent();
    teardown(buffers);
}

/// Mismatched parts of one collective in a group: an error naming both ranks, nothing launched.
#[test]
fn group_with_mismatched_parts_is_refused_before_launching() {
    let _g = setup();
    let comms = init_on(&[0; 2]);
    let buffers = alloc_windows(&comms, 1 << 20);
    let s = model::create_stream(0, false);
    check(symmGroupStart(), std::ptr::null_mut());
    check(all_reduce(&buffers[0], 0, 0, 64, s), buffers[0].comm);
    check(all_reduce(&buffers[0], 0, 0, 1000, s), buffers[0].comm);
    check(all_reduce(&buffers[1], 0, 0, 64, s), buffers[1].comm);
    check(all_reduce(&buffers[1], 0, 0, 2000, s), buffers[1].comm);
    let result = symmGroupEnd();
    let message = last_error(std::ptr::null_mut());
    assert_eq!(result, symmResult_t::symmInvalidUsage, "{message}");
    assert!(
        message.contains("rank 0") && message.contains("rank 1") && message.contains("count"),
        "{message}"
    );
    assert!(
        model::launches().is_empty(),
        "launched: {:?}",
        model::launches()
    );
    quiescent();
    // The communicators stay usable: a matching group runs.
    check(symmGroupStart(), std::ptr::null_mut());
    for b in &buffers {
        check(all_reduce(b, 0, 0, 1000, s), b.comm);
    }
    check(symmGroupEnd(), std::ptr::null_mut());
    quiescent();
    assert_eq!(model::launches().len(), 1);
    teardown(buffers);
}

/// One thread per rank (`allreduce_pthreads.c`): ranks joined with symmCommInitRank, each
/// thread launching its own part on `make_stream()`'s stream; returns every rank's result.
fn threads_per_rank(nranks: usize, make_stream: fn(usize) -> u64) -> Vec<(symmResult_t, String)> {
    let mut id = symmUniqueId {
        internal: [0; SYMM_UNIQUE_ID_BYTES],
    };
    // SAFETY: valid out-pointer.
    check(unsafe { symmGetUniqueId(&mut id) }, std::ptr::null_mut());
    let streams: Vec<u64> = (0..nranks).map(make_stream).collect();
    let results: Vec<(symmResult_t, String)> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..nranks)
            .map(|r| {
                let s = streams[r];
                scope.spawn(move || {
                    let mut comm = std::ptr::null_mut();
                    // SAFETY: valid out-pointer.
                    check(
                        unsafe { symmCommInitRank(&mut comm, nranks as c_int, id, r as c_int) },
                        std::ptr::null_mut(),
                    );
                    let mut buffer = alloc(&[comm], 1 << 16).pop().unwrap();
                    // SAFETY: valid out-pointer; the buffer is this comm's allocation.
                    check(
                        unsafe {
                            symmCommWindowRegister(
                                comm,
                                buffer.base.cast(),
                                buffer.bytes,
                                &mut buffer.window,
                                SYMM_WIN_COLL_SYMMETRIC,
                            )
                        },
                        comm,
                    );
                    let result = all_reduce(&buffer, 0, 0, 1000, s);
                    let message = last_error(comm);
                    (result, message, buffer)
                })
            })
            .collect();
        let done: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        done.into_iter()
            .map(|(result, message, buffer)| {
                check(
                    symmCommWindowDeregister(buffer.comm, buffer.window),
                    buffer.comm,
                );
                check(symmMemFree(buffer.comm, buffer.base.cast()), buffer.comm);
                (result, message, buffer.comm)
            })
            .collect::<Vec<_>>()
            .into_iter()
            .map(|(result, message, comm)| {
                check(symmCommDestroy(comm), std::ptr::null_mut());
                (result, message)
            })
            .collect()
    });
    results
}

/// One thread per rank on one device, each on the NULL (legacy) stream: refused.
#[test]
fn threads_per_rank_on_the_null_stream_are_refused() {
    let _g = setup();
    let results = threads_per_rank(2, |_| 0);
    quiescent();
    for (result, message) in results {
        assert_eq!(result, symmResult_t::symmInvalidUsage, "{message}");
        assert!(message.contains("non-blocking"), "{message}");
    }
}

/// One thread per rank on one device, each on its own blocking stream: refused.
#[test]
fn threads_per_rank_on_blocking_streams_are_refused() {
    let _g = setup();
    let results = threads_per_rank(2, |_| model::create_stream(0, false));
    quiescent();
    for (result, message) in results {
        assert_eq!(result, symmResult_t::symmInvalidUsage, "{message}");
        assert!(message.contains("non-blocking"), "{message}");
    }
}

/// One thread per rank on one device, each on its own non-blocking stream: runs.
#[test]
fn threads_per_rank_on_non_blocking_streams_run() {
    let _g = setup();
    let results = threads_per_rank(4, |_| model::create_stream(0, true));
    for (result, message) in &results {
        assert_eq!(*result, symmResult_t::symmSuccess, "{message}");
    }
    quiescent();
}

fn record(device: i32, stream: u64) -> u64 {
    let event = model::create_event();
    model::enqueue(&LaunchSchedule {
        ops: vec![StreamOp::RecordEvent {
            event,
            stream,
            device,
        }],
    })
    .unwrap();
    event
}

fn wait(device: i32, stream: u64, event: u64) {
    model::enqueue(&LaunchSchedule {
        ops: vec![StreamOp::WaitEvent {
            stream,
            event,
            device,
        }],
    })
    .unwrap();
}

/// CUDA-graph capture of a group, replayed 200 times (the GPU set): all ranks on the capturing
/// stream; then every rank on its own stream forked from and joined back into the capturing
/// one (the library's internal stream and events inside a capture).
#[test]
fn graph_capture_then_replay() {
    let _g = setup();
    let comms = init_on(&[0; 4]);
    let buffers = alloc_windows(&comms, 1 << 20);
    for per_rank_streams in [false, true] {
        let s = model::create_stream(0, false);
        let own: Vec<u64> = (0..4).map(|_| model::create_stream(0, true)).collect();
        model::begin_capture(0, s).unwrap();
        if per_rank_streams {
            let fork = record(0, s);
            for o in &own {
                wait(0, *o, fork);
            }
        }
        check(symmGroupStart(), std::ptr::null_mut());
        for (r, b) in buffers.iter().enumerate() {
            let on = if per_rank_streams { own[r] } else { s };
            check(all_reduce(b, 0, 0, 5000, on), b.comm);
        }
        check(symmGroupEnd(), std::ptr::null_mut());
        if per_rank_streams {
            for o in &own {
                let join = record(0, *o);
                wait(0, s, join);
            }
        }
        let graph = model::end_capture(0, s).unwrap();
        for _ in 0..200 {
            model::launch_graph(graph, 0, s).unwrap();
        }
        quiescent();
    }
    assert_eq!(model::launches().len(), 400);
    teardown(buffers);
}

/// Two threads, each driving half of one device's ranks with groups (each group a cooperative
/// launch of two ranks, separate from the other): runs on non-blocking streams, refused on a
/// blocking one.
#[test]
fn groups_that_split_a_device_between_threads() {
    let _g = setup();
    for non_blocking in [true, false] {
        let comms = init_on(&[0; 4]);
        let buffers = alloc_windows(&comms, 1 << 20);
        let streams = [
            model::create_stream(0, non_blocking),
            model::create_stream(0, non_blocking),
        ];
        // Handles and addresses as integers, to cross threads.
        let ranks: Vec<(usize, usize)> = buffers
            .iter()
            .map(|b| (b.comm as usize, b.base as usize))
            .collect();
        let results: Vec<symmResult_t> = std::thread::scope(|scope| {
            let handles: Vec<_> = ranks
                .chunks(2)
                .zip(streams)
                .map(|(half, s)| {
                    scope.spawn(move || {
                        check(symmGroupStart(), std::ptr::null_mut());
                        for &(comm, base) in half {
                            let (comm, p) = (comm as symmComm_t, base as *mut c_void);
                            check(symmAllReduce(p, p, 50_000, F32, SUM, comm, stream(s)), comm);
                        }
                        symmGroupEnd()
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let expected = if non_blocking {
            symmResult_t::symmSuccess
        } else {
            symmResult_t::symmInvalidUsage
        };
        assert_eq!(
            results,
            vec![expected; 2],
            "{}",
            last_error(buffers[0].comm)
        );
        quiescent();
        if non_blocking {
            let launches = model::launches();
            assert_eq!(launches.len(), 2);
            assert!(
                launches
                    .iter()
                    .all(|l| l.cooperative && l.co_residency_proven)
            );
        }
        teardown(buffers);
    }
}

/// Devices unequally crowded (three ranks on device 0, one on device 1): every rank plans the
/// same grid (the clique's block cap), so the parts of one collective agree.
#[test]
fn every_rank_plans_the_same_grid_whatever_its_device_crowding() {
    let _g = setup();
    let comms = init_on(&[0, 0, 0, 1]);
    for &c in &comms {
        // 132 multiprocessors shared by 3 ranks on device 0: the cap of every rank.
        assert_eq!(
            symm::internals::Comm::from_handle(c).unwrap().max_blocks,
            44
        );
    }
    let buffers = alloc_windows(&comms, 1 << 26);
    let streams = [model::create_stream(0, true), model::create_stream(1, true)];
    check(symmGroupStart(), std::ptr::null_mut());
    for (r, b) in buffers.iter().enumerate() {
        check(
            all_reduce(b, 0, 1 << 25, 1 << 23, streams[usize::from(r == 3)]),
            b.comm,
        );
    }
    check(symmGroupEnd(), std::ptr::null_mut());
    quiescent();
    let launches = model::launches();
    assert_eq!(launches.len(), 2);
    let per_rank: Vec<u32> = launches
        .iter()
        .map(|l| l.grid / l.ranks.len() as u32)
        .collect();
    assert_eq!(per_rank[0], per_rank[1], "{launches:?}");
    assert!(per_rank[0] * 3 <= 132, "{per_rank:?}");
    teardown(buffers);
}

/// The ranks on one GPU share its bandwidth (`plan::GPU_MODEL`): 2 ranks alone on a GPU take
/// more blocks for a large all-reduce than 8 ranks sharing one, and a GPU per rank keeps the
/// links' cap.
#[test]
fn ranks_that_share_a_gpu_split_its_bandwidth() {
    let _g = setup();
    for (devices, expected) in [
        (&[0, 0][..], 43),
        (&[0; 8][..], 11),
        (&[0, 1][..], 11),
        (&[0, 0, 1, 1][..], 11),
    ] {
        let comms = init_on(devices);
        let buffers = alloc_windows(&comms, 1 << 25);
        let streams: Vec<u64> = (0..2).map(|d| model::create_stream(d, true)).collect();
        let before = model::launches().len();
        check(symmGroupStart(), std::ptr::null_mut());
        for (r, b) in buffers.iter().enumerate() {
            let s = streams[devices[r] as usize];
            check(all_reduce(b, 0, 0, 1 << 23, s), b.comm);
        }
        check(symmGroupEnd(), std::ptr::null_mut());
        quiescent();
        let launches = model::launches();
        assert!(launches.len() > before, "{devices:?}: nothing launched");
        for l in &launches[before..] {
            assert_eq!(
                l.grid / l.ranks.len() as u32,
                expected,
                "{devices:?}: {l:?}"
            );
        }
        teardown(buffers);
    }
}
