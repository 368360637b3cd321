//! Windows over NCCL's and NVSHMEM's memory (`symmCommWindowRegisterNccl`,
//! `symmCommWindowRegisterNvshmem`), a process per rank on the host backend, against a stand-in
//! for both engines' host libraries (`tests/fakes/fake_engines.c`, built here with the C
//! compiler): each process maps its own heap at one fixed address, as NVSHMEM's symmetric heap
//! is, and its peers' heaps at addresses of its own, and the engines' address queries answer
//! from those mappings. So a window whose peer table came from anywhere but the engine would
//! read the wrong process's memory.
//!
//! Each rank: windows at a non-zero offset of an NCCL window and inside NVSHMEM's heap, the
//! collectives on them exact, then deregistered with the engines' pads released; engine
//! windows of both, where a peer has no address (NCCL 2.32's with its device communicator);
//! and the refusals, on every rank: a peer without an address before NCCL 2.32 (named), an
//! NCCL without GIN, a device communicator one rank could not make, an NCCL too old, offsets
//! that differ between ranks, a call inside a group, NULL handles.

use std::ffi::{CString, c_char, c_int, c_void};
use std::path::{Path, PathBuf};
use std::ptr::null_mut;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use symm::*;
use symm_device::engine::Place;
use symm_tests::*;

const F32: i32 = symmDataType_t::symmFloat32 as i32;
const SUM: i32 = symmRedOp_t::symmSum as i32;
const RANKS: usize = 3;
const CHILD: &str = "engine_rank";

/// Build the stand-in library into this test's scratch directory.
fn fake_library() -> PathBuf {
    let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("fake-engines");
    build_fake_library("fake_engines.c", &out, "libfake_engines.so")
}

/// Every rank process: windows over both engines' memory and the refusals (see
/// `engine_rank`).
#[test]
fn windows_over_nccl_and_nvshmem_memory_in_a_process_per_rank() {
    let library = fake_library();
    let shm = Path::new("/dev/shm");
    let base = if shm.is_dir() {
        shm.to_path_buf()
    } else {
        PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
    };
    let dir = base.join(format!("symm-engines-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    use_host_backend();
    let id = id_to_hex(&new_unique_id());
    let ranks: Vec<Vec<(String, String)>> = (0..RANKS)
        .map(|rank| {
            vec![
                ("SYMM_BACKEND".into(), "host".into()),
                ("SYMM_TIMEOUT_MS".into(), "20000".into()),
                // A buffer outside every window is refused, not staged: the collectives here
                // must run on the engines' memory itself.
                ("SYMM_STRICT_WINDOWS".into(), "1".into()),
                ("SYMM_NCCL_LIBRARY".into(), library.display().to_string()),
                ("SYMM_NVSHMEM_LIBRARY".into(), library.display().to_string()),
                ("ENGINE_TEST_DIR".into(), dir.display().to_string()),
                ("ENGINE_TEST_ID".into(), id.clone()),
                ("ENGINE_TEST_RANK".into(), rank.to_string()),
            ]
        })
        .collect();
    let outcomes = run_rank_processes(CHILD, &ranks, Duration::from_secs(240));
    let _ = std::fs::remove_dir_all(&dir);
    for (rank, (ok, log)) in outcomes.iter().enumerate() {
        assert!(
            *ok && log.contains(&format!("engine rank {rank}: all checks OK")),
            "rank {rank}:\n{log}"
        );
    }
}

/// The stand-in's own functions, and the engines' calls a user makes before symm's.
struct Fake {
    init: unsafe extern "C" fn(*const c_char, c_int, c_int) -> c_int,
    nccl_comm: unsafe extern "C" fn() -> *mut c_void,
    live_allocations: unsafe extern "C" fn() -> c_int,
    live_windows: unsafe extern "C" fn() -> c_int,
    live_dev_comms: unsafe extern "C" fn() -> c_int,
    last_window_flags: unsafe extern "C" fn() -> c_int,
    window_registrations: unsafe extern "C" fn() -> c_int,
    mem_alloc: unsafe extern "C" fn(*mut *mut c_void, usize) -> c_int,
    window_register:
        unsafe extern "C" fn(*mut c_void, *mut c_void, usize, *mut *mut c_void, c_int) -> c_int,
    window_deregister: unsafe extern "C" fn(*mut c_void, *mut c_void) -> c_int,
    nvshmem_malloc: unsafe extern "C" fn(usize) -> *mut c_void,
    peer_heap: unsafe extern "C" fn(c_int) -> *mut c_void,
}

fn load_fake() -> Fake {
    let path = CString::new(std::env::var("SYMM_NCCL_LIBRARY").unwrap()).unwrap();
    // SAFETY: a NUL-terminated path; the stand-in has no initializers.
    let handle = unsafe { dlopen(path.as_ptr(), 2 | 0x100) };
    assert!(!handle.is_null(), "loading the stand-in");
    let symbol = |name: &str| {
        let name = CString::new(name).unwrap();
        // SAFETY: a handle from dlopen and a NUL-terminated name.
        let address = unsafe { dlsym(handle, name.as_ptr()) };
        assert!(!address.is_null(), "{name:?}");
        address
    };
    // SAFETY: each symbol is the stand-in's function of that C signature.
    unsafe {
        Fake {
            init: as_function(symbol("fake_engine_init")),
            nccl_comm: as_function(symbol("fake_engine_nccl_comm")),
            live_allocations: as_function(symbol("fake_engine_live_allocations")),
            live_windows: as_function(symbol("fake_engine_live_windows")),
            live_dev_comms: as_function(symbol("fake_engine_live_dev_comms")),
            last_window_flags: as_function(symbol("fake_engine_last_window_flags")),
            window_registrations: as_function(symbol("fake_engine_window_registrations")),
            mem_alloc: as_function(symbol("ncclMemAlloc")),
            window_register: as_function(symbol("ncclCommWindowRegister")),
            window_deregister: as_function(symbol("ncclCommWindowDeregister")),
            nvshmem_malloc: as_function(symbol("nvshmem_malloc")),
            peer_heap: as_function(symbol("fake_engine_peer_heap")),
        }
    }
}

/// `address` as a function of type `F`.
///
/// # Safety
/// `F` is the C type of the function at `address`.
unsafe fn as_function<F: Copy>(address: *mut c_void) -> F {
    // SAFETY: a function address of type `F` (the caller's contract), pointer-sized.
    unsafe { std::mem::transmute_copy(&address) }
}

unsafe extern "C" {
    fn dlopen(path: *const c_char, flags: c_int) -> *mut c_void;
    fn dlsym(handle: *mut c_void, name: *const c_char) -> *mut c_void;
}

/// Values whose sums are exact in f32.
fn value(rank: usize, i: usize, round: usize) -> f32 {
    ((rank * 5 + i * 3 + round * 7) % 64) as f32
}

/// The all-reduce and the all-gather on the window at `base` (`count` elements, then room for
/// `RANKS * count`), `rounds` times with new data.
fn collectives_on(comm: symmComm_t, rank: usize, base: *mut u8, count: usize, what: &str) {
    for round in 0..3 {
        let mine: Vec<f32> = (0..count).map(|i| value(rank, i, round)).collect();
        put_f32(base, &mine);
        let ptr = base.cast::<c_void>();
        check(
            symmAllReduce(ptr, ptr, count, F32, SUM, comm, null_mut()),
            comm,
        );
        let want: Vec<f64> = (0..count)
            .map(|i| (0..RANKS).map(|r| value(r, i, round) as f64).sum())
            .collect();
        let got = get_f32(base, count);
        for i in 0..count {
            assert_eq!(got[i] as f64, want[i], "{what}: all-reduce element {i}");
        }
        // SAFETY: inside the window.
        let recv = unsafe { base.add(4 * count) };
        check(
            symmAllGather(ptr, recv.cast(), count, F32, comm, null_mut()),
            comm,
        );
        let got = get_f32(recv, RANKS * count);
        for (i, g) in got.iter().enumerate() {
            assert_eq!(*g as f64, want[i % count], "{what}: all-gather element {i}");
        }
    }
}

/// NVSHMEM's device API as the stand-in provides it: a symmetric address is this process's
/// address in its own heap, and every PE's heap is mapped here (the stand-in's transport to a
/// PE it gives no address for). A put copies, then adds to the signal with release ordering.
struct HeapEngine {
    heaps: Vec<u64>,
    own: u64,
}

impl HeapEngine {
    fn translate(&self, address: u64, pe: u32) -> u64 {
        assert!(
            (self.own..self.own + (64 << 20)).contains(&address),
            "{address:#x}"
        );
        self.heaps[pe as usize] + (address - self.own)
    }
}

/// The symmetric address of `place` (as the NVSHMEM engine computes it from the context's
/// engine words).
fn symmetric(ctx: &symm_device::context::SymmContext, place: Place) -> u64 {
    use symm_device::context::{ENGINE_DATA, ENGINE_SIGNALS};
    match place {
        Place::Data(offset) => ctx.engine[ENGINE_DATA] + offset,
        Place::Pad(offset) => ctx.engine[ENGINE_SIGNALS] + offset,
    }
}

// SAFETY: copies complete before the signal add (release); adds are atomic (shared memory);
// puts are synchronous.
unsafe impl symm_device::engine::SignalEngine for HeapEngine {
    const TAG: symm_device::context::BackendTag = symm_device::context::BackendTag::Nvshmem;

    fn accepts(ctx: &symm_device::context::SymmContext) -> bool {
        ctx.engine[symm_device::context::ENGINE_SIGNALS].is_multiple_of(16)
    }

    unsafe fn put_with_signal(
        &self,
        ctx: &symm_device::context::SymmContext,
        dest: Place,
        src: u64,
        bytes: u64,
        signal: u64,
        pe: u32,
    ) {
        symm_device::arch::host::sync_threads();
        if symm_device::arch::host::thread_idx_x() == 0 {
            // SAFETY: both ranges lie in mapped heaps (symmetric addresses of the window).
            unsafe {
                std::ptr::copy(
                    (ctx.local_base + src) as *const u8,
                    self.translate(symmetric(ctx, dest), pe) as *mut u8,
                    bytes as usize,
                )
            };
            let word = self.translate(symmetric(ctx, Place::Pad(signal)), pe);
            // SAFETY: an aligned signal word of a mapped pad.
            unsafe { AtomicU64::from_ptr(word as *mut u64) }.fetch_add(1, Ordering::Release);
        }
        symm_device::arch::host::sync_threads();
    }

    unsafe fn signal_add(&self, ctx: &symm_device::context::SymmContext, signal: u64, pe: u32) {
        let word = self.translate(symmetric(ctx, Place::Pad(signal)), pe);
        // SAFETY: an aligned signal word of a mapped pad.
        unsafe { AtomicU64::from_ptr(word as *mut u64) }.fetch_add(1, Ordering::Release);
    }

    unsafe fn signal_reached(
        &self,
        ctx: &symm_device::context::SymmContext,
        signal: u64,
        target: u64,
    ) -> bool {
        let word = symmetric(ctx, Place::Pad(signal));
        // SAFETY: an aligned signal word of this rank's pad.
        unsafe { AtomicU64::from_ptr(word as *mut u64) }.load(Ordering::Acquire) >= target
    }

    unsafe fn quiet(&self, _: &symm_device::context::SymmContext) -> bool {
        true
    }
}

/// The device context of `window` (host memory on the host backend, living with the window).
fn host_context<'a>(
    comm: symmComm_t,
    window: symmWindow_t,
) -> &'a symm_device::context::SymmContext {
    let mut address: *const c_void = std::ptr::null();
    // SAFETY: a valid out-pointer.
    check(
        unsafe { symmCommGetDeviceContext(comm, window, &mut address) },
        comm,
    );
    // SAFETY: the host backend's contexts are host memory that lives with the window.
    unsafe { &*(address as *const symm_device::context::SymmContext) }
}

/// Run `body` on every thread of a `programs × 4` grid of the host emulation, as a launch of
/// a kernel calling a device function; its status (every thread's, checked equal).
fn launch(programs: u32, body: &(dyn Fn() -> i32 + Sync)) -> i32 {
    let statuses = std::sync::Mutex::new(Vec::new());
    symm_device::arch::host::run_grid(programs, 4, &|| {
        let status = body();
        statuses.lock().unwrap().push(status);
    });
    let statuses = statuses.into_inner().unwrap();
    assert!(statuses.iter().all(|s| *s == statuses[0]), "{statuses:?}");
    statuses[0]
}

/// The NVSHMEM engine window `window` of `comm` (this rank has no address for `hidden`, if
/// any): its context is tagged for NVSHMEM with the engine's handles, symm's collectives are
/// refused naming why, and the device functions' engine protocol gives exact results across
/// the rank processes.
fn engine_window_on(
    fake: &Fake,
    comm: symmComm_t,
    window: symmWindow_t,
    rank: usize,
    base: *mut u8,
    count: usize,
    hidden: Option<usize>,
) {
    use symm_device::context::{BackendTag, ENGINE_DATA, ENGINE_SIGNALS, SymmContext};
    use symm_device::triton::{
        status, symm_engine_all_gather_device, symm_engine_all_reduce_device,
        symm_engine_barrier_device,
    };
    let context = host_context(comm, window);
    assert_eq!(context.backend, BackendTag::Nvshmem as u32);
    assert_eq!(context.engine[ENGINE_DATA], base as u64);
    assert_ne!(context.engine[ENGINE_SIGNALS], 0);
    // SAFETY: a table of RANKS entries.
    let peer_bases = unsafe { std::slice::from_raw_parts(context.peer_bases as *const u64, RANKS) };
    if let Some(hidden) = hidden {
        assert_eq!(
            peer_bases[hidden], 0,
            "the peer NVSHMEM gives no address for"
        );
    }
    assert_eq!(peer_bases[rank], base as u64);

    let ptr = base.cast::<c_void>();
    let result = symmAllReduce(ptr, ptr, count, F32, SUM, comm, null_mut());
    assert_ne!(result, symmResult_t::symmSuccess);
    let message = last_error(comm);
    assert!(
        message.contains("peers reachable only through NVSHMEM")
            && message.contains("device functions linked with the engine"),
        "{message}"
    );

    let engine = HeapEngine {
        // SAFETY: the stand-in is initialized.
        heaps: (0..RANKS)
            .map(|pe| unsafe { (fake.peer_heap)(pe as c_int) } as u64)
            .collect(),
        // SAFETY: as above.
        own: unsafe { (fake.peer_heap)(rank as c_int) } as u64,
    };
    let ctx = context as *const SymmContext as i64;
    for round in 0..4 {
        let mine: Vec<f32> = (0..count).map(|i| value(rank, i, round)).collect();
        put_f32(base, &mine);
        let programs = 1 + (round as u32 % 3);
        // SAFETY: this rank's engine context; the range lies in the window.
        let reduced = launch(programs, &|| unsafe {
            symm_engine_all_reduce_device(&engine, ctx, 0, 0, count as i64, SUM, F32)
        });
        assert_eq!(reduced, status::SUCCESS, "round {round}");
        let want: Vec<f32> = (0..count)
            .map(|i| (0..RANKS).map(|r| value(r, i, round)).sum())
            .collect();
        assert_eq!(
            get_f32(base, count),
            want,
            "engine all-reduce, round {round}"
        );
        // SAFETY: as above; the receive range follows the send range.
        let gathered = launch(programs, &|| unsafe {
            symm_engine_all_gather_device(&engine, ctx, 0, 4 * count as i64, 4 * count as i64)
        });
        assert_eq!(gathered, status::SUCCESS, "round {round}");
        // SAFETY: inside the window.
        let got = get_f32(unsafe { base.add(4 * count) }, RANKS * count);
        for (i, g) in got.iter().enumerate() {
            assert_eq!(
                *g,
                want[i % count],
                "engine all-gather element {i}, round {round}"
            );
        }
        // SAFETY: this rank's engine context.
        let met = launch(programs, &|| unsafe {
            symm_engine_barrier_device(&engine, ctx)
        });
        assert_eq!(met, status::SUCCESS, "round {round}");
    }
}

/// An NCCL engine window of `comm` over `nccl_window` (NCCL 2.32, this rank without an address
/// for `hidden`, the ranks in two load/store teams): the context is tagged for NCCL with the
/// data's and the pads' NCCL windows and a device copy of the device communicator NCCL made,
/// the pads are registered for GIN's VA signals, symm's collectives are refused naming NCCL,
/// and deregistration destroys the device communicator and releases the pads.
fn nccl_engine_window_on(
    fake: &Fake,
    comm: symmComm_t,
    rank: usize,
    nccl_comm: *mut c_void,
    nccl_window: *mut c_void,
    base: *mut u8,
    hidden: usize,
) {
    use symm_device::context::{BackendTag, ENGINE_COMM, ENGINE_DATA, ENGINE_SIGNALS};
    // SAFETY: the stand-in reads them at each call; this process's rank runs no other thread.
    unsafe {
        std::env::set_var("FAKE_NCCL_VERSION", "23203");
        std::env::set_var("FAKE_ENGINE_UNREACHABLE", hidden.to_string());
    }
    // SAFETY: the stand-in is initialized.
    let live = || unsafe {
        (
            (fake.live_allocations)(),
            (fake.live_windows)(),
            (fake.live_dev_comms)(),
        )
    };
    let before = live();
    let count = 1000;
    let bytes = 4 * count * (RANKS + 1);
    let mut window = null_mut();
    // SAFETY: NCCL's handles of this rank; a valid out-pointer.
    check(
        unsafe {
            symmCommWindowRegisterNccl(comm, nccl_comm, nccl_window, 4096, bytes, &mut window)
        },
        comm,
    );
    assert_eq!(
        live(),
        (before.0 + 1, before.1 + 1, before.2 + 1),
        "the pads (an allocation and an NCCL window) and a device communicator"
    );
    // SAFETY: the stand-in is initialized.
    let flags = unsafe { (fake.last_window_flags)() };
    assert_eq!(
        flags, 3,
        "the pads are registered NCCL_WIN_COLL_SYMMETRIC | NCCL_WIN_STRICT_ORDERING"
    );
    let context = host_context(comm, window);
    assert_eq!(context.backend, BackendTag::Nccl as u32);
    assert_eq!(context.engine[ENGINE_DATA], nccl_window as u64);
    assert_ne!(context.engine[ENGINE_SIGNALS], 0);
    assert_ne!(context.engine[ENGINE_SIGNALS], nccl_window as u64);
    // SAFETY: the device copy of the device communicator (host memory on the host backend),
    // 248 bytes: the stand-in's magic, version, rank and ranks, then its pattern.
    let dev_comm =
        unsafe { std::slice::from_raw_parts(context.engine[ENGINE_COMM] as *const u8, 248) };
    let words: Vec<u32> = dev_comm[..16]
        .chunks(4)
        .map(|w| u32::from_ne_bytes(w.try_into().unwrap()))
        .collect();
    assert_eq!(words, [0xcafe_beef, 23203, rank as u32, RANKS as u32]);
    for (i, byte) in dev_comm.iter().enumerate().skip(16) {
        assert_eq!(
            *byte,
            (i * 7 + rank) as u8,
            "byte {i} of the device communicator"
        );
    }
    // SAFETY: a table of RANKS entries.
    let peer_bases = unsafe { std::slice::from_raw_parts(context.peer_bases as *const u64, RANKS) };
    assert_eq!(peer_bases[hidden], 0, "the peer NCCL gives no address for");
    assert_eq!(peer_bases[rank], base as u64);
    let ptr = base.cast::<c_void>();
    let result = symmAllReduce(ptr, ptr, count, F32, SUM, comm, null_mut());
    assert_ne!(result, symmResult_t::symmSuccess);
    let message = last_error(comm);
    assert!(
        message.contains("an NCCL engine window") && message.contains("engines=(\"nccl\",)"),
        "{message}"
    );
    check(symmCommWindowDeregister(comm, window), comm);
    assert_eq!(
        live(),
        before,
        "the device communicator is destroyed and the pads released"
    );
}

/// One rank process of `windows_over_nccl_and_nvshmem_memory_in_a_process_per_rank`.
#[test]
#[ignore = "a rank process of windows_over_nccl_and_nvshmem_memory_in_a_process_per_rank"]
fn engine_rank() {
    let rank: usize = std::env::var("ENGINE_TEST_RANK").unwrap().parse().unwrap();
    let id = id_from_hex(&std::env::var("ENGINE_TEST_ID").unwrap());
    let fake = load_fake();
    let dir = CString::new(std::env::var("ENGINE_TEST_DIR").unwrap()).unwrap();
    // SAFETY: a NUL-terminated directory.
    let initialized = unsafe { (fake.init)(dir.as_ptr(), rank as c_int, RANKS as c_int) };
    assert_eq!(initialized, 0);
    let mut comm = null_mut();
    // SAFETY: a valid out-pointer.
    check(
        unsafe { symmCommInitRank(&mut comm, RANKS as i32, id, rank as i32) },
        null_mut(),
    );
    // SAFETY: the stand-in is initialized.
    let nccl_comm = unsafe { (fake.nccl_comm)() };
    // SAFETY: as above.
    let live = || unsafe { ((fake.live_allocations)(), (fake.live_windows)()) };

    // -- an NCCL window, the symm window 4096 bytes into it -----------------------------------
    let count = 1000;
    let bytes = 4 * count * (RANKS + 1);
    let mut buffer = null_mut();
    let mut nccl_window = null_mut();
    // SAFETY: valid out-pointers; memory from ncclMemAlloc.
    unsafe {
        assert_eq!((fake.mem_alloc)(&mut buffer, 4096 + bytes), 0);
        assert_eq!(
            (fake.window_register)(nccl_comm, buffer, 4096 + bytes, &mut nccl_window, 1),
            0
        );
    }
    let before = live();
    let mut window = null_mut();
    // SAFETY: NCCL's handles of this rank; a valid out-pointer.
    check(
        unsafe {
            symmCommWindowRegisterNccl(comm, nccl_comm, nccl_window, 4096, bytes, &mut window)
        },
        comm,
    );
    assert_eq!(
        live(),
        (before.0 + 1, before.1 + 1),
        "the pads: one allocation, one NCCL window"
    );
    // SAFETY: the stand-in is initialized.
    let flags = unsafe { (fake.last_window_flags)() };
    assert_eq!(
        flags, 1,
        "a native window's pads: NCCL_WIN_COLL_SYMMETRIC only"
    );
    // SAFETY: inside the NCCL window's allocation.
    let base = unsafe { buffer.cast::<u8>().add(4096) };
    collectives_on(comm, rank, base, count, "NCCL window");
    check(symmCommWindowDeregister(comm, window), comm);
    assert_eq!(live(), before, "the pads are deregistered and freed");
    // NCCL 2.32.0 to 2.32.2 refuse 2.32.3's structures: no engine windows there, and no query
    // of them for a window whose peers are all reachable.
    // SAFETY: the stand-in reads it at each call; this process's rank runs no other thread.
    unsafe { std::env::set_var("FAKE_NCCL_VERSION", "23202") };
    // SAFETY: NCCL's handles of this rank; a valid out-pointer.
    check(
        unsafe {
            symmCommWindowRegisterNccl(comm, nccl_comm, nccl_window, 4096, bytes, &mut window)
        },
        comm,
    );
    check(symmCommWindowDeregister(comm, window), comm);
    // SAFETY: as above.
    unsafe { std::env::remove_var("FAKE_NCCL_VERSION") };

    // -- NVSHMEM's heap ---------------------------------------------------------------------------
    // SAFETY: collective over the stand-in's PEs (every rank allocates in the same order).
    let symmetric = unsafe { (fake.nvshmem_malloc)(bytes + 64) };
    assert!(!symmetric.is_null());
    // SAFETY: 64 bytes into a symmetric allocation.
    let inside = unsafe { symmetric.cast::<u8>().add(64) };
    let before = live();
    // SAFETY: a symmetric address with `bytes` bytes; a valid out-pointer.
    check(
        unsafe { symmCommWindowRegisterNvshmem(comm, inside.cast(), bytes, &mut window) },
        comm,
    );
    collectives_on(comm, rank, inside, count, "NVSHMEM heap");
    check(symmCommWindowDeregister(comm, window), comm);
    assert_eq!(live(), before, "the pad is freed");

    // -- refusals, on every rank ------------------------------------------------------------------
    let refused = |comm: symmComm_t, result: symmResult_t, needles: &[&str]| {
        let message = last_error(comm);
        assert_ne!(result, symmResult_t::symmSuccess, "{needles:?}");
        for needle in needles {
            assert!(message.contains(needle), "{message:?} lacks {needle:?}");
        }
    };
    // Refused before anything is asked of the engine or of the peers: an NCCL without
    // ncclGetPeerDevicePointer, a call inside a group, NULL handles.
    // SAFETY: the stand-in reads it at each call; this process's rank runs no other thread.
    unsafe { std::env::set_var("FAKE_NCCL_VERSION", "22803") };
    // SAFETY: NCCL's handles of this rank; a valid out-pointer.
    let result = unsafe {
        symmCommWindowRegisterNccl(comm, nccl_comm, nccl_window, 4096, bytes, &mut window)
    };
    refused(comm, result, &["22803", "NCCL 2.29"]);
    // SAFETY: as above.
    unsafe { std::env::remove_var("FAKE_NCCL_VERSION") };
    check(symmGroupStart(), null_mut());
    // SAFETY: as above.
    let result = unsafe {
        symmCommWindowRegisterNccl(comm, nccl_comm, nccl_window, 4096, bytes, &mut window)
    };
    check(symmGroupEnd(), null_mut());
    refused(comm, result, &["inside symmGroupStart"]);
    // SAFETY: NULL arguments are refused before use.
    unsafe {
        let result = symmCommWindowRegisterNccl(comm, null_mut(), nccl_window, 0, 16, &mut window);
        refused(comm, result, &["ncclComm is NULL"]);
        let result = symmCommWindowRegisterNvshmem(comm, null_mut(), 16, &mut window);
        refused(comm, result, &["symAddr is NULL"]);
    }
    // The communicator still works on a window of the NCCL memory after those.
    // SAFETY: as above.
    check(
        unsafe {
            symmCommWindowRegisterNccl(comm, nccl_comm, nccl_window, 4096, bytes, &mut window)
        },
        comm,
    );
    collectives_on(comm, rank, base, count, "after the refusals");
    check(symmCommWindowDeregister(comm, window), comm);
    // Refusals of a registration every rank takes part in: a failed registration of a
    // communicator with ranks in other processes leaves it refusing later ones ("create a new
    // communicator"), so each case gets a communicator of its own (a split of the first).
    let split = || {
        let mut child = null_mut();
        // SAFETY: a valid out-pointer; every rank splits (collective), NULL config.
        let result =
            unsafe { symmCommSplit(comm, 0, rank as i32, &mut child, std::ptr::null_mut()) };
        check(result, comm);
        child
    };
    // A peer the engine gives no address for: named, by both adapters.
    let hidden = (rank + 1) % RANKS;
    // SAFETY: as above.
    unsafe { std::env::set_var("FAKE_ENGINE_UNREACHABLE", hidden.to_string()) };
    let first = split();
    // SAFETY: as above.
    let result = unsafe {
        symmCommWindowRegisterNccl(first, nccl_comm, nccl_window, 4096, bytes, &mut window)
    };
    refused(
        first,
        result,
        &[
            &format!("peerBuffs[{hidden}] is NULL"),
            "not reachable",
            "an NCCL window",
            "NCCL 2.32.3 or newer reaches such peers through GIN",
        ],
    );
    // A multi-process communicator whose registration failed refuses the next one.
    // SAFETY: as above.
    let result = unsafe {
        symmCommWindowRegisterNccl(first, nccl_comm, nccl_window, 4096, bytes, &mut window)
    };
    refused(first, result, &["create a new communicator"]);
    // NVSHMEM reaches the peer itself: an engine window, on which symm's collectives are
    // refused and the engine protocol of the device functions runs.
    let second = split();
    // SAFETY: a symmetric address with `bytes` bytes; a valid out-pointer.
    check(
        unsafe { symmCommWindowRegisterNvshmem(second, inside.cast(), bytes, &mut window) },
        second,
    );
    engine_window_on(&fake, second, window, rank, inside, count, Some(hidden));
    check(symmCommWindowDeregister(second, window), second);
    // SAFETY: as above.
    unsafe { std::env::remove_var("FAKE_ENGINE_UNREACHABLE") };
    // One rank alone lacks an address for a peer (1 and 2 reach everyone): the window is an
    // engine window on every rank, so that all run the same protocol.
    let unreachable = (rank == 0).then_some(2);
    if let Some(peer) = unreachable {
        // SAFETY: as above.
        unsafe { std::env::set_var("FAKE_ENGINE_UNREACHABLE", peer.to_string()) };
    }
    let fourth = split();
    // SAFETY: a symmetric address with `bytes` bytes; a valid out-pointer.
    check(
        unsafe { symmCommWindowRegisterNvshmem(fourth, inside.cast(), bytes, &mut window) },
        fourth,
    );
    engine_window_on(&fake, fourth, window, rank, inside, count, unreachable);
    check(symmCommWindowDeregister(fourth, window), fourth);
    // SAFETY: as above.
    unsafe { std::env::remove_var("FAKE_ENGINE_UNREACHABLE") };
    // NCCL 2.32: a communicator whose ranks span two load/store teams makes engine windows.
    let fifth = split();
    nccl_engine_window_on(&fake, fifth, rank, nccl_comm, nccl_window, base, hidden);
    let sixth = split();
    // SAFETY: as above.
    unsafe { std::env::set_var("FAKE_NCCL_NO_GIN", "1") };
    // SAFETY: NCCL's handles; a valid out-pointer.
    let result = unsafe {
        symmCommWindowRegisterNccl(sixth, nccl_comm, nccl_window, 4096, bytes, &mut window)
    };
    refused(sixth, result, &["2 load/store teams", "no GIN"]);
    // SAFETY: as above.
    unsafe { std::env::remove_var("FAKE_NCCL_NO_GIN") };
    // One rank cannot make the device communicator: every rank's registration fails at once
    // (not at the timeout), the others naming that rank.
    let seventh = split();
    if rank == 1 {
        // SAFETY: as above.
        unsafe { std::env::set_var("FAKE_NCCL_DEVCOMM_FAILS", "1") };
    }
    let before = live();
    let started = std::time::Instant::now();
    // SAFETY: NCCL's handles; a valid out-pointer.
    let result = unsafe {
        symmCommWindowRegisterNccl(seventh, nccl_comm, nccl_window, 4096, bytes, &mut window)
    };
    if rank == 1 {
        refused(seventh, result, &["ncclDevCommCreate", "fake NCCL error"]);
        // SAFETY: as above.
        unsafe { std::env::remove_var("FAKE_NCCL_DEVCOMM_FAILS") };
    } else {
        refused(seventh, result, &["rank 1 refused its description"]);
    }
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "the refusal took {:?} (the timeout is 20 s)",
        started.elapsed()
    );
    assert_eq!(
        live(),
        before,
        "the failed registration's pads are released"
    );
    // SAFETY: the stand-in is initialized.
    assert_eq!(unsafe { (fake.live_dev_comms)() }, 0);
    // SAFETY: as above.
    unsafe {
        std::env::remove_var("FAKE_ENGINE_UNREACHABLE");
        std::env::remove_var("FAKE_NCCL_VERSION");
    }
    // One rank's nvshmem_malloc of the pads fails (NVSHMEM's collective, after the ranks
    // agreed): the others, already past it, fail at once, naming that rank.
    let ninth = split();
    if rank == 0 {
        // SAFETY: as above.
        unsafe { std::env::set_var("FAKE_NVSHMEM_MALLOC_FAILS", "1") };
    }
    let started = std::time::Instant::now();
    // SAFETY: a symmetric address with `bytes` bytes; a valid out-pointer.
    let result = unsafe { symmCommWindowRegisterNvshmem(ninth, inside.cast(), bytes, &mut window) };
    if rank == 0 {
        refused(ninth, result, &["nvshmem_malloc", "signal pad failed"]);
        // SAFETY: as above.
        unsafe { std::env::remove_var("FAKE_NVSHMEM_MALLOC_FAILS") };
    } else {
        refused(ninth, result, &["rank 0 refused its description"]);
    }
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    // One rank cannot prepare alone (its ncclMemAlloc fails): every rank fails at once, before
    // any enters NCCL's collective calls (the pads' window registration), and the
    // communicator registers the next window as if nothing happened.
    let eighth = split();
    if rank == 2 {
        // SAFETY: as above.
        unsafe { std::env::set_var("FAKE_NCCL_MEM_ALLOC_FAILS", "1") };
    }
    let before = live();
    // SAFETY: the stand-in is initialized.
    let registrations = unsafe { (fake.window_registrations)() };
    let started = std::time::Instant::now();
    // SAFETY: NCCL's handles; a valid out-pointer.
    let result = unsafe {
        symmCommWindowRegisterNccl(eighth, nccl_comm, nccl_window, 4096, bytes, &mut window)
    };
    if rank == 2 {
        refused(eighth, result, &["ncclMemAlloc failed", "fake NCCL error"]);
        // SAFETY: as above.
        unsafe { std::env::remove_var("FAKE_NCCL_MEM_ALLOC_FAILS") };
    } else {
        refused(
            eighth,
            result,
            &[
                "rank 2 could not prepare its part of symmCommWindowRegisterNccl",
                "ncclMemAlloc failed",
                "no rank entered the engine's collective calls",
            ],
        );
    }
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    // SAFETY: as above.
    let after = unsafe { (fake.window_registrations)() };
    assert_eq!(
        after, registrations,
        "no rank entered ncclCommWindowRegister"
    );
    assert_eq!(live(), before, "the prepared allocations are released");
    // SAFETY: NCCL's handles; a valid out-pointer.
    check(
        unsafe {
            symmCommWindowRegisterNccl(eighth, nccl_comm, nccl_window, 4096, bytes, &mut window)
        },
        eighth,
    );
    collectives_on(eighth, rank, base, count, "after a failed preparation");
    check(symmCommWindowDeregister(eighth, window), eighth);
    // Offsets that differ between ranks: refused on every rank, once all registered.
    let third = split();
    // SAFETY: NCCL's handles; a valid out-pointer.
    let result = unsafe {
        symmCommWindowRegisterNccl(
            third,
            nccl_comm,
            nccl_window,
            4096 - 16 * (rank % 2),
            4 * count,
            &mut window,
        )
    };
    refused(third, result, &["every rank", "an NCCL window at offset"]);
    for child in [
        first, second, third, fourth, fifth, sixth, seventh, eighth, ninth,
    ] {
        check(symmCommDestroy(child), null_mut());
    }
    // SAFETY: the user's NCCL window, deregistered once.
    let deregistered = unsafe { (fake.window_deregister)(nccl_comm, nccl_window) };
    assert_eq!(deregistered, 0);
    check(symmCommDestroy(comm), null_mut());
    println!("engine rank {rank}: all checks OK");
}
