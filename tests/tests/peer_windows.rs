//! Windows over memory another library owns (`symmCommWindowRegisterPeers`): the owner maps
//! every rank's bytes and signal pad, and symm's collectives run on them as on its own windows.
//!
//! The "owner" here is this test: one allocation per rank that symm never saw (host memory on
//! the host backend, `cuMemAlloc` memory on the cuda backend), with the window at a non-zero
//! offset of it, the pad after the window, and guard bytes on both sides that no call may
//! touch. Every collective is checked against a reference computed in f64 or exactly, in a
//! thread per rank and with one thread driving the ranks in a group; descriptions that differ
//! between ranks, or that name a peer out of reach, are refused on every rank.
//!
//! On the host backend by default; with `SYMM_BACKEND=cuda` on the cuda backend (the simulated
//! GPU runs it in `cargo xtask sim --test`).

use std::ffi::c_void;
use std::ptr::null_mut;
use symm::*;
use symm_tests::*;

const F32: i32 = symmDataType_t::symmFloat32 as i32;
const SUM: i32 = symmRedOp_t::symmSum as i32;
/// Where the window starts in each rank's allocation (the owner's offset).
const OFFSET: usize = 4096;
/// Guard bytes before and after what symm may touch.
const GUARD: u8 = 0xA5;

/// One rank's allocation by the "owner": `[0, OFFSET)` guard, the window, the signal pad, a
/// trailing guard.
struct OwnerMemory {
    base: u64,
    bytes: usize,
    window_bytes: usize,
    pad_bytes: usize,
    /// The host backend's memory (16-byte aligned words).
    host: Option<Vec<u128>>,
}

// SAFETY: the memory is only an address range; the tests order its use across threads.
unsafe impl Send for OwnerMemory {}
// SAFETY: as above.
unsafe impl Sync for OwnerMemory {}

impl OwnerMemory {
    fn new(window_bytes: usize, pad_bytes: usize) -> OwnerMemory {
        let bytes = OFFSET + window_bytes.next_multiple_of(16) + pad_bytes + 256;
        let (base, host) = if on_cuda() {
            cuda_context();
            let mut pointer = 0;
            // SAFETY: a valid out-pointer; a context is current.
            unsafe { cudarc::driver::sys::cuMemAlloc_v2(&mut pointer, bytes) }
                .result()
                .unwrap();
            (pointer, None)
        } else {
            let mut words = vec![0u128; bytes / 16 + 1];
            (words.as_mut_ptr() as u64, Some(words))
        };
        let memory = OwnerMemory {
            base,
            bytes,
            window_bytes,
            pad_bytes,
            host,
        };
        put_bytes(memory.base as *mut u8, &vec![GUARD; bytes]);
        memory
    }

    fn window(&self) -> u64 {
        self.base + OFFSET as u64
    }

    fn pad(&self) -> u64 {
        self.window() + self.window_bytes.next_multiple_of(16) as u64
    }

    /// The guard bytes are intact: nothing was written outside the window and the pad.
    fn assert_guards(&self, case: &str) {
        let all = get_bytes(self.base as *const u8, self.bytes);
        assert!(
            all[..OFFSET].iter().all(|b| *b == GUARD),
            "{case}: bytes before the window were written"
        );
        let end = (self.pad() - self.base) as usize + self.pad_bytes;
        let pad_start = (self.pad() - self.base) as usize;
        let gap = (self.window() - self.base) as usize + self.window_bytes;
        assert!(
            all[gap..pad_start].iter().all(|b| *b == GUARD),
            "{case}: bytes between the window and the pad were written"
        );
        assert!(
            all[end..].iter().all(|b| *b == GUARD),
            "{case}: bytes after the pad were written"
        );
    }
}

impl Drop for OwnerMemory {
    fn drop(&mut self) {
        if self.host.is_none() {
            cuda_context();
            // SAFETY: allocated by `new`, freed once, after every window over it.
            let _ = unsafe { cudarc::driver::sys::cuMemFree_v2(self.base) };
        }
    }
}

/// The backend from the environment, and communicators that refuse a buffer outside every
/// window instead of staging it: every collective here must run on the owner's memory itself.
fn setup() {
    use_backend_from_env();
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // SAFETY: runs once, before any communicator of this process exists (Once blocks the
        // other tests until then); the library reads it when creating communicators.
        unsafe { std::env::set_var("SYMM_STRICT_WINDOWS", "1") };
    });
}

fn pad_bytes(comm: symmComm_t) -> usize {
    let mut bytes = 0;
    // SAFETY: a valid out-pointer.
    check(unsafe { symmWindowSignalPadBytes(comm, &mut bytes) }, comm);
    bytes
}

/// Rank `rank`'s description of the window over `memory` (every rank's, all in this process).
fn description(rank: usize, memory: &[OwnerMemory], tables: &Tables) -> symmPeerWindow_t {
    symmPeerWindow_t {
        size: std::mem::size_of::<symmPeerWindow_t>(),
        magic: SYMM_PEER_WINDOW_MAGIC,
        version: SYMM_VERSION_CODE as u32,
        owner: symmOwner_t::symmOwnerUser as i32,
        buff: memory[rank].window() as *mut c_void,
        bytes: memory[rank].window_bytes,
        ownerOffset: OFFSET,
        peerBuffs: tables.bases.as_ptr(),
        peerSignalPads: tables.pads.as_ptr(),
        signalPadBytes: memory[rank].pad_bytes,
    }
}

/// Every rank's window and pad, as this process addresses them.
struct Tables {
    bases: Vec<*mut c_void>,
    pads: Vec<*mut c_void>,
}

// SAFETY: addresses only.
unsafe impl Sync for Tables {}

impl Tables {
    /// Every entry of `peerBuffs` this rank's, with the pads kept.
    fn all_bytes_of(&self, rank: usize) -> Tables {
        Tables {
            bases: vec![self.bases[rank]; self.bases.len()],
            pads: self.pads.clone(),
        }
    }
}

fn tables(memory: &[OwnerMemory]) -> Tables {
    Tables {
        bases: memory.iter().map(|m| m.window() as *mut c_void).collect(),
        pads: memory.iter().map(|m| m.pad() as *mut c_void).collect(),
    }
}

fn register(comm: symmComm_t, desc: &symmPeerWindow_t) -> Result<symmWindow_t, String> {
    let mut window = null_mut();
    // SAFETY: a valid description whose tables hold nranks entries; a valid out-pointer.
    let result = unsafe { symmCommWindowRegisterPeers(comm, desc, &mut window) };
    if result == symmResult_t::symmSuccess {
        Ok(window)
    } else {
        Err(format!("{result:?}: {}", last_error(comm)))
    }
}

fn f32_at(base: u64, index: usize) -> *mut u8 {
    (base + 4 * index as u64) as *mut u8
}

/// Each collective on the window of `rank`, checked exactly (sums in f64 over values that add
/// exactly in f32). `round` varies the data so that a call reading an earlier call's data
/// fails.
fn every_collective(rank: usize, comm: symmComm_t, memory: &OwnerMemory, nranks: usize) {
    let stream = RankStream::new();
    let base = memory.window();
    let value = |r: usize, i: usize, round: usize| ((r * 7 + i * 3 + round * 11) % 64) as f32;
    for (round, count) in [17usize, 4099, 33, 20_000].into_iter().enumerate() {
        let case = format!("rank {rank}, {count} elements");
        // All-reduce in place.
        let mine: Vec<f32> = (0..count).map(|i| value(rank, i, round)).collect();
        stream.put_f32(f32_at(base, 0), &mine);
        let ptr = base as *mut c_void;
        let result = symmAllReduce(ptr, ptr, count, F32, SUM, comm, stream.handle());
        check(stream.completed(comm, result), comm);
        let got = stream.get_f32(f32_at(base, 0), count);
        for (i, g) in got.iter().enumerate() {
            let want: f64 = (0..nranks).map(|r| value(r, i, round) as f64).sum();
            assert_eq!(*g as f64, want, "{case}: all-reduce element {i}");
        }
        // All-gather: send at 0, receive after it.
        let recv = base + 4 * count.next_multiple_of(4) as u64;
        let result = symmAllGather(ptr, recv as *mut c_void, count, F32, comm, stream.handle());
        check(stream.completed(comm, result), comm);
        let got = stream.get_f32(recv as *const u8, count * nranks);
        for r in 0..nranks {
            for i in 0..count {
                let want: f64 = (0..nranks).map(|q| value(q, i, round) as f64).sum();
                assert_eq!(
                    got[r * count + i] as f64,
                    want,
                    "{case}: all-gather segment {r} element {i}"
                );
            }
        }
        // Broadcast from rank 1, in place at 0.
        let root_data: Vec<f32> = (0..count).map(|i| -value(rank, i, round)).collect();
        stream.put_f32(f32_at(base, 0), &root_data);
        let result = symmBroadcast(ptr, ptr, count, F32, 1, comm, stream.handle());
        check(stream.completed(comm, result), comm);
        let got = stream.get_f32(f32_at(base, 0), count);
        for (i, g) in got.iter().enumerate() {
            assert_eq!(*g, -value(1, i, round), "{case}: broadcast element {i}");
        }
        // Reduce-scatter: nranks segments at 0, this rank's result after them.
        let send: Vec<f32> = (0..count * nranks).map(|i| value(rank, i, round)).collect();
        stream.put_f32(f32_at(base, 0), &send);
        let out = base + 4 * (count * nranks).next_multiple_of(4) as u64;
        let result = symmReduceScatter(
            ptr,
            out as *mut c_void,
            count,
            F32,
            SUM,
            comm,
            stream.handle(),
        );
        check(stream.completed(comm, result), comm);
        let got = stream.get_f32(out as *const u8, count);
        for (i, g) in got.iter().enumerate() {
            let want: f64 = (0..nranks)
                .map(|r| value(r, rank * count + i, round) as f64)
                .sum();
            assert_eq!(*g as f64, want, "{case}: reduce-scatter element {i}");
        }
    }
}

/// Every collective, in a thread per rank, on windows at a non-zero offset of memory symm
/// never allocated; the bytes around each window and pad stay untouched; the owner frees its
/// memory after the windows are gone.
#[test]
fn collectives_run_on_memory_another_owner_mapped() {
    setup();
    for nranks in [2usize, 3] {
        let comms = init_all(nranks);
        let pad = pad_bytes(comms[0]);
        let window_bytes = 4 * 20_000 * (nranks + 1) + 8;
        let memory: Vec<OwnerMemory> = (0..nranks)
            .map(|_| OwnerMemory::new(window_bytes, pad))
            .collect();
        let tables = tables(&memory);
        let windows = on_rank_threads(&comms, |rank, comm| {
            let window = register(comm, &description(rank, &memory, &tables))
                .unwrap_or_else(|e| panic!("rank {rank}: {e}"));
            every_collective(rank, comm, &memory[rank], nranks);
            window as usize
        });
        for (rank, (&comm, window)) in comms.iter().zip(windows).enumerate() {
            check(symmCommWindowDeregister(comm, window as symmWindow_t), comm);
            memory[rank].assert_guards(&format!("{nranks} ranks, rank {rank}"));
        }
        for comm in comms {
            check(symmCommDestroy(comm), null_mut());
        }
        drop(memory);
    }
}

/// One thread drives every rank: the registrations and an all-reduce in groups.
#[test]
fn one_thread_registers_and_reduces_in_a_group() {
    setup();
    let nranks = 4;
    let comms = init_all(nranks);
    let pad = pad_bytes(comms[0]);
    let count = 1000;
    let memory: Vec<OwnerMemory> = (0..nranks)
        .map(|_| OwnerMemory::new(4 * count, pad))
        .collect();
    let tables = tables(&memory);
    let mut windows = vec![null_mut(); nranks];
    check(symmGroupStart(), null_mut());
    for (rank, &comm) in comms.iter().enumerate() {
        let desc = description(rank, &memory, &tables);
        // SAFETY: a valid description and out-pointer.
        check(
            unsafe { symmCommWindowRegisterPeers(comm, &desc, &mut windows[rank]) },
            comm,
        );
    }
    check(symmGroupEnd(), null_mut());
    for (rank, m) in memory.iter().enumerate() {
        let data: Vec<f32> = (0..count).map(|i| (rank * count + i) as f32).collect();
        put_f32(m.window() as *mut u8, &data);
    }
    check(symmGroupStart(), null_mut());
    for (rank, &comm) in comms.iter().enumerate() {
        let ptr = memory[rank].window() as *mut c_void;
        check(
            symmAllReduce(ptr, ptr, count, F32, SUM, comm, null_mut()),
            comm,
        );
    }
    check(symmGroupEnd(), null_mut());
    for m in &memory {
        let got = get_f32(m.window() as *const u8, count);
        for (i, g) in got.iter().enumerate() {
            let want: f64 = (0..nranks).map(|r| (r * count + i) as f64).sum();
            assert_eq!(*g as f64, want, "element {i}");
        }
    }
    for (&comm, &window) in comms.iter().zip(&windows) {
        check(symmCommWindowDeregister(comm, window), comm);
        check(symmCommDestroy(comm), null_mut());
    }
    for m in &memory {
        m.assert_guards("grouped");
    }
}

/// A rank whose window lies at another offset of its owner's allocation (or has another
/// owner) pairs other bytes than its peers think: every rank's registration is refused,
/// naming the difference, and no window exists.
#[test]
fn ranks_at_different_owner_offsets_are_refused_on_every_rank() {
    setup();
    let nranks = 2;
    for (field, change) in [
        (
            "ownerOffset",
            (|d: &mut symmPeerWindow_t| d.ownerOffset += 16) as fn(&mut _),
        ),
        ("owner", |d: &mut symmPeerWindow_t| {
            d.owner = symmOwner_t::symmOwnerTorch as i32
        }),
    ] {
        let comms = init_all(nranks);
        let pad = pad_bytes(comms[0]);
        let memory: Vec<OwnerMemory> = (0..nranks).map(|_| OwnerMemory::new(256, pad)).collect();
        let tables = tables(&memory);
        let outcomes = on_rank_threads(&comms, |rank, comm| {
            let mut desc = description(rank, &memory, &tables);
            if rank == 1 {
                change(&mut desc);
            }
            register(comm, &desc).map(|window| window as usize)
        });
        for (rank, outcome) in outcomes.iter().enumerate() {
            let error = outcome
                .as_ref()
                .expect_err(&format!("{field}: rank {rank}'s registration succeeded"));
            assert!(
                error.contains("symmInvalidArgument") && error.contains("every rank"),
                "{field}: rank {rank}: {error}"
            );
        }
        for comm in comms {
            check(symmCommDestroy(comm), null_mut());
        }
    }
}

/// Descriptions refused before anything is written, each naming the bad field; every rank
/// passes the same tables here, so every rank refuses on its own.
#[test]
fn bad_descriptions_are_refused_by_name() {
    setup();
    let nranks = 2;
    let comms = init_all(nranks);
    let pad = pad_bytes(comms[0]);
    assert!(pad >= 29_720, "a pad of {pad} bytes");
    let memory: Vec<OwnerMemory> = (0..nranks).map(|_| OwnerMemory::new(1024, pad)).collect();
    let good = tables(&memory);
    let unreachable = Tables {
        bases: vec![good.bases[0], null_mut()],
        pads: good.pads.clone(),
    };
    let misaligned = Tables {
        bases: good.bases.clone(),
        pads: vec![good.pads[0], (memory[1].pad() + 8) as *mut c_void],
    };
    let overlapping = Tables {
        bases: good.bases.clone(),
        pads: vec![good.pads[0], (memory[1].window() + 512) as *mut c_void],
    };
    let shared_pad = Tables {
        bases: good.bases.clone(),
        pads: vec![good.pads[0], good.pads[0]],
    };
    type Edit = fn(&mut symmPeerWindow_t);
    let cases: [(&str, &Tables, Edit); 9] = [
        (
            "peerBuffs[1] is NULL: rank 1's memory is not reachable",
            &unreachable,
            |_| {},
        ),
        ("peerSignalPads[1]", &misaligned, |_| {}),
        ("overlaps peerSignalPads[1]", &overlapping, |_| {}),
        ("peerSignalPads[0] [", &shared_pad, |_| {}),
        ("signalPadBytes", &good, |d| d.signalPadBytes = 64),
        ("desc->size", &good, |d| d.size = 8),
        ("desc->magic", &good, |d| d.magic = 0),
        ("desc->owner", &good, |d| d.owner = 77),
        ("bytes is 0", &good, |d| d.bytes = 0),
    ];
    for (needle, tables, edit) in cases {
        let errors = on_rank_threads(&comms, |rank, comm| {
            let mut desc = description(rank, &memory, tables);
            edit(&mut desc);
            register(comm, &desc).map(|w| w as usize)
        });
        for (rank, error) in errors.into_iter().enumerate() {
            let error = error.expect_err(needle);
            assert!(
                error.contains("symmInvalidArgument") && error.contains(needle),
                "rank {rank}: {error} does not name {needle:?}"
            );
        }
    }
    let desc = description(0, &memory, &good);
    // SAFETY: NULL arguments are refused before use.
    unsafe {
        let mut window = null_mut();
        assert_eq!(
            symmCommWindowRegisterPeers(comms[0], std::ptr::null(), &mut window),
            symmResult_t::symmInvalidArgument
        );
        assert!(last_error(comms[0]).contains("desc is NULL"));
        assert_eq!(
            symmCommWindowRegisterPeers(comms[0], &desc, null_mut()),
            symmResult_t::symmInvalidArgument
        );
        assert!(last_error(comms[0]).contains("win"));
    }
    for m in &memory {
        m.assert_guards("refused");
    }
    for comm in comms {
        check(symmCommDestroy(comm), null_mut());
    }
}

/// Every rank's entry of `peerBuffs` is this rank's own bytes (a common slip): refused, since
/// ranks sharing bytes would reduce one rank's data twice and return success.
#[test]
fn a_table_naming_one_rank_s_bytes_for_every_rank_is_refused() {
    setup();
    let nranks = 3;
    let comms = init_all(nranks);
    let pad = pad_bytes(comms[0]);
    let memory: Vec<OwnerMemory> = (0..nranks).map(|_| OwnerMemory::new(256, pad)).collect();
    let good = tables(&memory);
    let errors = on_rank_threads(&comms, |rank, comm| {
        let own = good.all_bytes_of(rank);
        register(comm, &description(rank, &memory, &own)).map(|w| w as usize)
    });
    for (rank, error) in errors.into_iter().enumerate() {
        let error = error.expect_err("a table of one rank's bytes");
        assert!(
            error.contains("overlaps peerBuffs["),
            "rank {rank}: {error}"
        );
    }
    for comm in comms {
        check(symmCommDestroy(comm), null_mut());
    }
}

/// A description only one rank refuses (its `buff` is not its own entry of the table) is that
/// rank's registration: every other rank's registration of the window fails at once naming it,
/// not after the timeout, in a thread per rank and with one thread driving the ranks in a group;
/// then every rank registers again and the window works.
#[test]
fn a_description_one_rank_refuses_fails_every_rank_at_once() {
    setup();
    let nranks = 3;
    let count = 64;
    for grouped in [false, true] {
        let comms = init_all(nranks);
        let pad = pad_bytes(comms[0]);
        let memory: Vec<OwnerMemory> = (0..nranks)
            .map(|_| OwnerMemory::new(4 * count, pad))
            .collect();
        let good = tables(&memory);
        let bad = |rank: usize| {
            let mut desc = description(rank, &memory, &good);
            if rank == 1 {
                desc.buff = memory[0].window() as *mut c_void;
            }
            desc
        };
        let began = std::time::Instant::now();
        let outcomes: Vec<Result<usize, String>> = if grouped {
            check(symmGroupStart(), null_mut());
            let calls: Vec<Result<usize, String>> = comms
                .iter()
                .enumerate()
                .map(|(rank, &comm)| register(comm, &bad(rank)).map(|w| w as usize))
                .collect();
            let end = symmGroupEnd();
            assert_ne!(end, symmResult_t::symmSuccess, "the group's registrations");
            let message = last_error(null_mut());
            assert!(message.contains("rank 1 refused"), "{message}");
            calls
        } else {
            on_rank_threads(&comms, |rank, comm| {
                register(comm, &bad(rank)).map(|w| w as usize)
            })
        };
        let took = began.elapsed();
        assert!(
            took < std::time::Duration::from_secs(3),
            "grouped {grouped}: the refusal reached the peers after {took:?}"
        );
        let own = outcomes[1].as_ref().expect_err("rank 1's own refusal");
        assert!(own.contains("is not buff"), "{own}");
        if !grouped {
            for rank in [0, 2] {
                let error = outcomes[rank].as_ref().expect_err("a peer of the refusal");
                assert!(error.contains("rank 1 refused"), "rank {rank}: {error}");
            }
        }
        // Every rank registers again: the ranks are in step.
        let windows = on_rank_threads(&comms, |rank, comm| {
            let window = register(comm, &description(rank, &memory, &good))
                .unwrap_or_else(|e| panic!("rank {rank}: {e}"));
            let data: Vec<f32> = (0..count).map(|i| (rank * count + i) as f32).collect();
            let stream = RankStream::new();
            stream.put_f32(memory[rank].window() as *mut u8, &data);
            let ptr = memory[rank].window() as *mut c_void;
            let result = symmAllReduce(ptr, ptr, count, F32, SUM, comm, stream.handle());
            check(stream.completed(comm, result), comm);
            let got = stream.get_f32(memory[rank].window() as *const u8, count);
            for (i, g) in got.iter().enumerate() {
                let want: f64 = (0..nranks).map(|r| (r * count + i) as f64).sum();
                assert_eq!(*g as f64, want, "rank {rank} element {i}");
            }
            window as usize
        });
        for (&comm, window) in comms.iter().zip(windows) {
            check(symmCommWindowDeregister(comm, window as symmWindow_t), comm);
            check(symmCommDestroy(comm), null_mut());
        }
    }
}
