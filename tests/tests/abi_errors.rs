//! Every entry point's error paths: each bad argument gives its code and a message naming the
//! argument, and touches no memory. The communicators here are strict
//! (`SYMM_STRICT_WINDOWS=1`): a buffer outside every window is refused, where by default the
//! call is staged (`tests/tests/staging.rs`).

use std::ffi::{CStr, c_void};
use std::ptr::{null, null_mut};
use symm::*;
use symm_tests::*;

const F32: i32 = symmDataType_t::symmFloat32 as i32;
const SUM: i32 = symmRedOp_t::symmSum as i32;

/// Assert `result` is `code` and the calling thread's last error mentions `needle`.
#[track_caller]
fn expect(result: symmResult_t, code: symmResult_t, needle: &str) {
    assert_eq!(result, code, "last error: {}", last_error(null_mut()));
    let message = last_error(null_mut());
    assert!(
        message.contains(needle),
        "message {message:?} does not mention {needle:?}"
    );
}

/// The host backend, and communicators that refuse buffers outside windows, for this test
/// process (before any communicator exists; every test calls it first).
fn use_strict_host_backend() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    use_host_backend();
    ONCE.call_once(|| {
        // SAFETY: runs once, before any communicator is created; the library reads the
        // environment only while creating communicators, which every test does after this call
        // returns (Once blocks concurrent callers until then).
        unsafe { std::env::set_var("SYMM_STRICT_WINDOWS", "1") };
    });
}

#[test]
fn version_and_error_strings() {
    let mut v = 0;
    // SAFETY: valid out-pointer.
    assert_eq!(unsafe { symmGetVersion(&mut v) }, symmResult_t::symmSuccess);
    assert_eq!(v, SYMM_VERSION_CODE);
    // SAFETY: NULL is allowed and reported.
    expect(
        unsafe { symmGetVersion(null_mut()) },
        symmResult_t::symmInvalidArgument,
        "version",
    );
    for code in [-1, 0, 3, 9, 10, 1000, i32::MIN] {
        let s = symmGetErrorString(code);
        assert!(!s.is_null());
        // SAFETY: never NULL, NUL-terminated.
        assert!(!unsafe { CStr::from_ptr(s) }.to_bytes().is_empty());
    }
    // SAFETY: never NULL, NUL-terminated.
    let unknown = unsafe { CStr::from_ptr(symmGetErrorString(77)) };
    assert!(unknown.to_string_lossy().contains("unknown"));
    assert!(!symmGetLastError(null_mut()).is_null());
    assert!(!symmGetLastError(0x1234 as symmComm_t).is_null());
}

#[test]
fn init_all_rejects_bad_arguments() {
    use_strict_host_backend();
    let mut comms = [null_mut(); 4];
    let devs = [0, -1, 0, 0];
    // SAFETY: NULL is reported before any write.
    expect(
        unsafe { symmCommInitAll(null_mut(), 2, null()) },
        symmResult_t::symmInvalidArgument,
        "comms",
    );
    for ndev in [0, -3] {
        // SAFETY: arrays hold 4 elements; ndev <= 0 is reported.
        expect(
            unsafe { symmCommInitAll(comms.as_mut_ptr(), ndev, null()) },
            symmResult_t::symmInvalidArgument,
            "ndev",
        );
    }
    // SAFETY: arrays hold 4 elements.
    expect(
        unsafe { symmCommInitAll(comms.as_mut_ptr(), 4, devs.as_ptr()) },
        symmResult_t::symmInvalidArgument,
        "devlist[1]",
    );
    let mut many = vec![null_mut(); 65];
    // SAFETY: 65 elements; devlist NULL.
    expect(
        unsafe { symmCommInitAll(many.as_mut_ptr(), 65, null()) },
        symmResult_t::symmInvalidArgument,
        "at most 64",
    );
    assert!(
        comms.iter().all(|c| c.is_null()),
        "nothing written on failure"
    );
}

#[test]
fn init_rank_rejects_bad_arguments() {
    use_strict_host_backend();
    let mut id = symmUniqueId {
        internal: [0; SYMM_UNIQUE_ID_BYTES],
    };
    // SAFETY: NULL reported.
    expect(
        unsafe { symmGetUniqueId(null_mut()) },
        symmResult_t::symmInvalidArgument,
        "uniqueId",
    );
    let mut comm = null_mut();
    // SAFETY: valid pointers from here on.
    unsafe {
        expect(
            symmCommInitRank(&mut comm, 2, id, 0),
            symmResult_t::symmInvalidArgument,
            "commId",
        );
        check(symmGetUniqueId(&mut id), null_mut());
        expect(
            symmCommInitRank(null_mut(), 2, id, 0),
            symmResult_t::symmInvalidArgument,
            "comm",
        );
        expect(
            symmCommInitRank(&mut comm, 0, id, 0),
            symmResult_t::symmInvalidArgument,
            "nranks",
        );
        expect(
            symmCommInitRank(&mut comm, 2, id, -1),
            symmResult_t::symmInvalidArgument,
            "rank",
        );
        expect(
            symmCommInitRank(&mut comm, 2, id, 2),
            symmResult_t::symmInvalidArgument,
            "rank",
        );
        let mut other_version = id;
        other_version.internal[8] = other_version.internal[8].wrapping_add(1);
        expect(
            symmCommInitRank(&mut comm, 1, other_version, 0),
            symmResult_t::symmInvalidArgument,
            "commId",
        );
        let mut bad_padding = id;
        bad_padding.internal[127] = 1;
        expect(
            symmCommInitRank(&mut comm, 1, bad_padding, 0),
            symmResult_t::symmInvalidArgument,
            "commId",
        );
    }
    assert!(comm.is_null());
}

#[test]
fn init_from_env_rejects_bad_arguments() {
    use_strict_host_backend();
    let strings = |entries: &[&str]| -> Vec<std::ffi::CString> {
        entries
            .iter()
            .map(|e| std::ffi::CString::new(*e).unwrap())
            .collect()
    };
    let pointers = |entries: &[std::ffi::CString]| -> Vec<*const std::ffi::c_char> {
        entries
            .iter()
            .map(|e| e.as_ptr())
            .chain(std::iter::once(std::ptr::null()))
            .collect()
    };
    let mut comm = null_mut();
    let empty = pointers(&[]);
    // SAFETY: NULL reported.
    expect(
        unsafe { symmCommInitFromEnv(null_mut(), empty.as_ptr()) },
        symmResult_t::symmInvalidArgument,
        "comm",
    );
    let cases: [(&[&str], &str); 5] = [
        (&[], "none of RANK, SYMM_RANK"),
        (&["RANK=0", "WORLD_SIZE"], "none of WORLD_SIZE"),
        (
            &["RANK=1", "WORLD_SIZE=1", "SYMM_COMM_ID=127.0.0.1:1"],
            "rank = 1",
        ),
        (
            &["RANK=0", "WORLD_SIZE=0", "SYMM_COMM_ID=127.0.0.1:1"],
            "number of ranks = 0",
        ),
        (
            &["RANK=0", "WORLD_SIZE=2", "SYMM_COMM_ID=nohost"],
            "SYMM_COMM_ID",
        ),
    ];
    for (entries, message) in cases {
        let owned = strings(entries);
        let array = pointers(&owned);
        // SAFETY: a NULL-terminated array of C strings that outlive the call.
        expect(
            unsafe { symmCommInitFromEnv(&mut comm, array.as_ptr()) },
            symmResult_t::symmInvalidArgument,
            message,
        );
    }
    assert!(comm.is_null());
}

#[test]
fn comm_queries_and_destroy() {
    use_strict_host_backend();
    let comms = init_all(3);
    let (mut n, mut r, mut d) = (0, 0, -1);
    // SAFETY: valid out-pointers, or NULL to be reported.
    unsafe {
        check(symmCommCount(comms[1], &mut n), comms[1]);
        check(symmCommUserRank(comms[1], &mut r), comms[1]);
        check(symmCommCuDevice(comms[1], &mut d), comms[1]);
        assert_eq!((n, r, d), (3, 1, 0));
        expect(
            symmCommCount(comms[1], null_mut()),
            symmResult_t::symmInvalidArgument,
            "count",
        );
        expect(
            symmCommUserRank(comms[1], null_mut()),
            symmResult_t::symmInvalidArgument,
            "rank",
        );
        expect(
            symmCommCuDevice(comms[1], null_mut()),
            symmResult_t::symmInvalidArgument,
            "device",
        );
        expect(
            symmCommCount(null_mut(), &mut n),
            symmResult_t::symmInvalidArgument,
            "comm is NULL",
        );
        expect(
            symmCommCount(0xdead0 as symmComm_t, &mut n),
            symmResult_t::symmInvalidArgument,
            "not a live communicator",
        );
    }
    expect(
        symmCommDestroy(null_mut()),
        symmResult_t::symmInvalidArgument,
        "comm",
    );
    for c in &comms {
        check(symmCommDestroy(*c), null_mut());
    }
    expect(
        symmCommDestroy(comms[0]),
        symmResult_t::symmInvalidArgument,
        "not a live communicator",
    );
    // SAFETY: valid out-pointer; the handle is dead and reported as such.
    expect(
        unsafe { symmCommCount(comms[2], &mut n) },
        symmResult_t::symmInvalidArgument,
        "destroyed",
    );
}

#[test]
fn mem_alloc_and_free_errors() {
    use_strict_host_backend();
    let comms = init_all(1);
    let comm = comms[0];
    let mut p: *mut c_void = null_mut();
    // SAFETY: valid out-pointers, or NULL to be reported.
    unsafe {
        expect(
            symmMemAlloc(comm, null_mut(), 16),
            symmResult_t::symmInvalidArgument,
            "ptr",
        );
        expect(
            symmMemAlloc(comm, &mut p, 0),
            symmResult_t::symmInvalidArgument,
            "size is 0",
        );
        expect(
            symmMemAlloc(comm, &mut p, usize::MAX),
            symmResult_t::symmInvalidArgument,
            "too large",
        );
        assert!(p.is_null());
        check(symmMemAlloc(comm, &mut p, 1024), comm);
    }
    let mut local = [0u8; 16];
    expect(
        symmMemFree(comm, null_mut()),
        symmResult_t::symmInvalidArgument,
        "ptr is NULL",
    );
    expect(
        symmMemFree(comm, local.as_mut_ptr().cast()),
        symmResult_t::symmInvalidArgument,
        "not returned by symmMemAlloc",
    );
    let mut win = null_mut();
    // SAFETY: valid out-pointer; live allocation.
    check(
        unsafe { symmCommWindowRegister(comm, p, 1024, &mut win, SYMM_WIN_COLL_SYMMETRIC) },
        comm,
    );
    expect(
        symmMemFree(comm, p),
        symmResult_t::symmInvalidUsage,
        "still registered",
    );
    check(symmCommWindowDeregister(comm, win), comm);
    check(symmMemFree(comm, p), comm);
    expect(
        symmMemFree(comm, p),
        symmResult_t::symmInvalidArgument,
        "already freed",
    );
    // The per-comm message is kept too.
    assert!(last_error(comm).contains("already freed"));
    check(symmCommDestroy(comm), null_mut());
}

#[test]
fn window_register_and_deregister_errors() {
    use_strict_host_backend();
    let comms = init_all(1);
    let comm = comms[0];
    let mut p: *mut c_void = null_mut();
    // SAFETY: valid out-pointer.
    check(unsafe { symmMemAlloc(comm, &mut p, 4096) }, comm);
    let mut win = null_mut();
    let mut stack = [0u8; 64];
    let flags = SYMM_WIN_COLL_SYMMETRIC;
    // SAFETY: every call either fails validation before touching memory or registers a live
    // allocation; out-pointers are valid or NULL.
    unsafe {
        expect(
            symmCommWindowRegister(comm, null_mut(), 16, &mut win, flags),
            symmResult_t::symmInvalidArgument,
            "buff is NULL",
        );
        expect(
            symmCommWindowRegister(comm, p, 0, &mut win, flags),
            symmResult_t::symmInvalidArgument,
            "size is 0",
        );
        expect(
            symmCommWindowRegister(comm, p, 16, null_mut(), flags),
            symmResult_t::symmInvalidArgument,
            "win is NULL",
        );
        expect(
            symmCommWindowRegister(comm, p, 16, &mut win, 0),
            symmResult_t::symmInvalidArgument,
            "winFlags",
        );
        expect(
            symmCommWindowRegister(comm, p, 16, &mut win, 3),
            symmResult_t::symmInvalidArgument,
            "winFlags",
        );
        expect(
            symmCommWindowRegister(comm, stack.as_mut_ptr().cast(), 64, &mut win, flags),
            symmResult_t::symmInvalidArgument,
            "symmMemAlloc",
        );
        expect(
            symmCommWindowRegister(comm, p, 4097, &mut win, flags),
            symmResult_t::symmInvalidArgument,
            "symmMemAlloc",
        );
        expect(
            symmCommWindowRegister(comm, usize::MAX as *mut c_void, 16, &mut win, flags),
            symmResult_t::symmInvalidArgument,
            "symmMemAlloc",
        );
        assert!(win.is_null());
        let misaligned = p.cast::<u8>().add(4);
        expect(
            symmCommWindowRegister(comm, misaligned.cast(), 16, &mut win, flags),
            symmResult_t::symmInvalidArgument,
            &format!("buff = {:#x} is not 16-byte aligned", misaligned as usize),
        );
        win = null_mut();
        check(symmCommWindowRegister(comm, p, 2048, &mut win, flags), comm);
        let mut other = null_mut();
        expect(
            symmCommWindowRegister(
                comm,
                p.cast::<u8>().add(1024).cast(),
                2048,
                &mut other,
                flags,
            ),
            symmResult_t::symmInvalidArgument,
            "overlaps",
        );
    }
    expect(
        symmCommWindowDeregister(comm, null_mut()),
        symmResult_t::symmInvalidArgument,
        "win is NULL",
    );
    expect(
        symmCommWindowDeregister(comm, 0x40 as symmWindow_t),
        symmResult_t::symmInvalidArgument,
        "not a window",
    );
    check(symmCommWindowDeregister(comm, win), comm);
    expect(
        symmCommWindowDeregister(comm, win),
        symmResult_t::symmInvalidArgument,
        "already deregistered",
    );
    check(symmMemFree(comm, p), comm);
    check(symmCommDestroy(comm), null_mut());
}

#[test]
fn all_reduce_rejects_bad_arguments_without_touching_memory() {
    use_strict_host_backend();
    let comms = init_all(1);
    let buffers = alloc_windows(&comms, 1024);
    let b = &buffers[0];
    let comm = b.comm;
    // SAFETY: host memory of the window.
    unsafe { write_f32(b.base, &[7.0; 256]) };
    let base = b.base as *mut c_void;
    // SAFETY: offsets stay inside the 1024-byte window.
    let at = |bytes: usize| unsafe { b.base.add(bytes) } as *mut c_void;
    let mut unregistered: *mut c_void = null_mut();
    // SAFETY: valid out-pointer.
    check(unsafe { symmMemAlloc(comm, &mut unregistered, 256) }, comm);
    let mut not_from_symm = [0f32; 8];
    let foreign = not_from_symm.as_mut_ptr() as *mut c_void;
    let s = null_mut();
    type Call<'a> = Box<dyn Fn() -> symmResult_t + 'a>;
    let cases: Vec<(Call, symmResult_t, &str)> = vec![
        (
            Box::new(|| symmAllReduce(null(), base, 4, F32, SUM, comm, s)),
            symmResult_t::symmInvalidArgument,
            "sendbuff is NULL",
        ),
        (
            Box::new(|| symmAllReduce(base, null_mut(), 4, F32, SUM, comm, s)),
            symmResult_t::symmInvalidArgument,
            "recvbuff is NULL",
        ),
        (
            Box::new(|| symmAllReduce(base, base, 4, 12, SUM, comm, s)),
            symmResult_t::symmInvalidArgument,
            "datatype = 12",
        ),
        (
            Box::new(|| symmAllReduce(base, base, 4, -1, SUM, comm, s)),
            symmResult_t::symmInvalidArgument,
            "datatype = -1",
        ),
        (
            Box::new(|| symmAllReduce(base, base, 4, F32, 5, comm, s)),
            symmResult_t::symmInvalidArgument,
            "op = 5",
        ),
        (
            Box::new(|| symmAllReduce(base, base, 4, F32, -7, comm, s)),
            symmResult_t::symmInvalidArgument,
            "op = -7",
        ),
        (
            Box::new(|| symmAllReduce(base, base, usize::MAX, F32, SUM, comm, s)),
            symmResult_t::symmInvalidArgument,
            "count",
        ),
        (
            Box::new(|| symmAllReduce(base, base, 257, F32, SUM, comm, s)),
            symmResult_t::symmInvalidArgument,
            "overruns its end by 4 bytes",
        ),
        (
            Box::new(|| symmAllReduce(unregistered, unregistered, 4, F32, SUM, comm, s)),
            symmResult_t::symmInvalidArgument,
            "sendbuff",
        ),
        (
            Box::new(|| symmAllReduce(unregistered, unregistered, 4, F32, SUM, comm, s)),
            symmResult_t::symmInvalidArgument,
            "but in none of its windows (no window is registered in it)",
        ),
        (
            Box::new(|| symmAllReduce(foreign, foreign, 4, F32, SUM, comm, s)),
            symmResult_t::symmInvalidArgument,
            "is not memory from symmMemAlloc on this comm",
        ),
        (
            Box::new(|| symmAllReduce(base, unregistered, 4, F32, SUM, comm, s)),
            symmResult_t::symmInvalidArgument,
            "recvbuff",
        ),
        (
            Box::new(|| symmAllReduce(at(2), at(2), 4, F32, SUM, comm, s)),
            symmResult_t::symmInvalidArgument,
            "multiple of the element size",
        ),
        (
            Box::new(|| symmAllReduce(at(0), at(8), 4, F32, SUM, comm, s)),
            symmResult_t::symmInvalidArgument,
            "overlap",
        ),
        (
            Box::new(|| symmAllReduce(base, base, 4, F32, SUM, null_mut(), s)),
            symmResult_t::symmInvalidArgument,
            "comm is NULL",
        ),
    ];
    for (call, code, needle) in &cases {
        expect(call(), *code, needle);
    }
    assert_eq!(
        // SAFETY: host memory of the window.
        unsafe { read_f32(b.base, 256) },
        vec![7.0; 256],
        "no memory touched"
    );
    check(symmMemFree(comm, unregistered), comm);
    drop(cases);
    teardown(buffers);
}

#[test]
fn all_gather_and_reduce_scatter_reject_bad_arguments() {
    use_strict_host_backend();
    let comms = init_all(2);
    let buffers = alloc_windows(&comms, 256);
    let (comm, base) = (buffers[1].comm, buffers[1].base);
    // SAFETY: offsets inside the 256-byte window.
    let at = |bytes: usize| unsafe { base.add(bytes) } as *mut c_void;
    let s = null_mut();
    // SAFETY: host memory of the window.
    unsafe { write_f32(base, &[3.0; 64]) };
    type Call<'a> = Box<dyn Fn() -> symmResult_t + 'a>;
    let cases: Vec<(Call, symmResult_t, &str)> = vec![
        (
            Box::new(|| symmAllGather(null(), at(64), 4, F32, comm, s)),
            symmResult_t::symmInvalidArgument,
            "sendbuff is NULL",
        ),
        (
            Box::new(|| symmAllGather(at(0), null_mut(), 4, F32, comm, s)),
            symmResult_t::symmInvalidArgument,
            "recvbuff is NULL",
        ),
        (
            Box::new(|| symmAllGather(at(0), at(64), 4, 40, comm, s)),
            symmResult_t::symmInvalidArgument,
            "datatype = 40",
        ),
        (
            Box::new(|| symmAllGather(at(0), at(64), 4, F32, null_mut(), s)),
            symmResult_t::symmInvalidArgument,
            "comm is NULL",
        ),
        (
            Box::new(|| symmAllGather(at(0), at(64), usize::MAX / 2, F32, comm, s)),
            symmResult_t::symmInvalidArgument,
            "overflow",
        ),
        // 2 ranks × 32 floats = 256 bytes do not fit after offset 64.
        (
            Box::new(|| symmAllGather(at(0), at(64), 32, F32, comm, s)),
            symmResult_t::symmInvalidArgument,
            "recvbuff",
        ),
        // Overlapping, but not this rank's (rank 1) segment.
        (
            Box::new(|| symmAllGather(at(64), at(64), 4, F32, comm, s)),
            symmResult_t::symmInvalidArgument,
            "rank × sendcount",
        ),
        (
            Box::new(|| symmAllGather(at(2), at(64), 4, F32, comm, s)),
            symmResult_t::symmInvalidArgument,
            "element size",
        ),
        (
            Box::new(|| symmReduceScatter(null(), at(64), 4, F32, SUM, comm, s)),
            symmResult_t::symmInvalidArgument,
            "sendbuff is NULL",
        ),
        (
            Box::new(|| symmReduceScatter(at(0), at(64), 4, F32, 9, comm, s)),
            symmResult_t::symmInvalidArgument,
            "op = 9",
        ),
        (
            Box::new(|| symmReduceScatter(at(0), at(64), 4, -2, SUM, comm, s)),
            symmResult_t::symmInvalidArgument,
            "datatype = -2",
        ),
        (
            Box::new(|| symmReduceScatter(at(64), at(0), 32, F32, SUM, comm, s)),
            symmResult_t::symmInvalidArgument,
            "sendbuff",
        ),
        (
            Box::new(|| symmReduceScatter(at(0), at(0), 4, F32, SUM, comm, s)),
            symmResult_t::symmInvalidArgument,
            "rank × recvcount",
        ),
        (
            Box::new(|| symmReduceScatter(at(0), at(64), 4, F32, SUM, null_mut(), s)),
            symmResult_t::symmInvalidArgument,
            "comm is NULL",
        ),
    ];
    for (call, code, needle) in &cases {
        expect(call(), *code, needle);
    }
    assert_eq!(
        // SAFETY: host memory of the window.
        unsafe { read_f32(base, 64) },
        vec![3.0; 64],
        "no memory touched"
    );
    drop(cases);
    teardown(buffers);
}

/// `symmBroadcast` on rank 1 of two: a root that is no rank, and every buffer error, on the
/// root (whose `sendbuff` is checked) and off it (whose `sendbuff` is ignored, even NULL or
/// foreign, while its `recvbuff` is checked). Nothing is launched (rank 0 never calls), and no
/// memory is touched.
#[test]
fn broadcast_rejects_bad_arguments() {
    use_strict_host_backend();
    let comms = init_all(2);
    let buffers = alloc_windows(&comms, 256);
    let (comm, base) = (buffers[1].comm, buffers[1].base);
    // SAFETY: offsets inside the 256-byte window.
    let at = |bytes: usize| unsafe { base.add(bytes) } as *mut c_void;
    let s = null_mut();
    let mut unregistered: *mut c_void = null_mut();
    // SAFETY: valid out-pointer.
    check(unsafe { symmMemAlloc(comm, &mut unregistered, 256) }, comm);
    let mut not_from_symm = [0f32; 8];
    let foreign = not_from_symm.as_mut_ptr() as *mut c_void;
    // SAFETY: host memory of the window.
    unsafe { write_f32(base, &[3.0; 64]) };
    type Call<'a> = Box<dyn Fn() -> symmResult_t + 'a>;
    let invalid = symmResult_t::symmInvalidArgument;
    let cases: Vec<(Call, symmResult_t, &str)> = vec![
        (
            Box::new(|| symmBroadcast(at(0), at(64), 4, F32, -1, comm, s)),
            invalid,
            "root = -1 is not a rank of this comm (it has 2 ranks",
        ),
        (
            Box::new(|| symmBroadcast(at(0), at(64), 4, F32, 2, comm, s)),
            invalid,
            "root = 2",
        ),
        (
            Box::new(|| symmBroadcast(at(0), at(64), 4, F32, i32::MAX, comm, s)),
            invalid,
            "root = 2147483647",
        ),
        // A bad root is named before anything else.
        (
            Box::new(|| symmBroadcast(null(), null_mut(), 4, 99, 7, comm, s)),
            invalid,
            "root = 7",
        ),
        (
            Box::new(|| symmBroadcast(at(0), at(64), 4, F32, 0, null_mut(), s)),
            invalid,
            "comm is NULL",
        ),
        (
            Box::new(|| symmBroadcast(at(0), at(64), 4, 12, 1, comm, s)),
            invalid,
            "datatype = 12",
        ),
        // On the root (rank 1): its sendbuff.
        (
            Box::new(|| symmBroadcast(null(), at(64), 4, F32, 1, comm, s)),
            invalid,
            "sendbuff is NULL",
        ),
        (
            Box::new(|| symmBroadcast(foreign, at(64), 4, F32, 1, comm, s)),
            invalid,
            "sendbuff = ",
        ),
        (
            Box::new(|| symmBroadcast(unregistered, at(64), 4, F32, 1, comm, s)),
            invalid,
            "sendbuff",
        ),
        (
            Box::new(|| symmBroadcast(at(200), at(0), 16, F32, 1, comm, s)),
            invalid,
            "sendbuff [",
        ),
        (
            Box::new(|| symmBroadcast(at(2), at(64), 4, F32, 1, comm, s)),
            invalid,
            "element size",
        ),
        (
            Box::new(|| symmBroadcast(at(0), at(8), 4, F32, 1, comm, s)),
            invalid,
            "overlap on the root",
        ),
        // Off the root (root 0): sendbuff is not looked at, recvbuff is.
        (
            Box::new(|| symmBroadcast(foreign, null_mut(), 4, F32, 0, comm, s)),
            invalid,
            "recvbuff is NULL",
        ),
        (
            Box::new(|| symmBroadcast(null(), at(192), 32, F32, 0, comm, s)),
            invalid,
            "recvbuff [",
        ),
        (
            Box::new(|| symmBroadcast(null(), unregistered, 4, F32, 0, comm, s)),
            invalid,
            "recvbuff",
        ),
        (
            Box::new(|| symmBroadcast(null(), at(66), 4, F32, 0, comm, s)),
            invalid,
            "element size",
        ),
        (
            Box::new(|| symmBroadcast(null(), at(0), usize::MAX / 2, F32, 0, comm, s)),
            invalid,
            "count = ",
        ),
    ];
    for (call, code, needle) in &cases {
        expect(call(), *code, needle);
    }
    // The comm's own last error says the same.
    assert!(
        last_error(comm).contains("count = "),
        "{}",
        last_error(comm)
    );
    assert_eq!(
        // SAFETY: host memory of the window.
        unsafe { read_f32(base, 64) },
        vec![3.0; 64],
        "no memory touched"
    );
    assert_eq!(not_from_symm, [0.0; 8]);
    drop(cases);
    check(symmMemFree(comm, unregistered), comm);
    teardown(buffers);
}

#[test]
fn group_end_without_start() {
    expect(
        symmGroupEnd(),
        symmResult_t::symmInvalidUsage,
        "without a matching symmGroupStart",
    );
    check(symmGroupStart(), null_mut());
    check(symmGroupStart(), null_mut());
    check(symmGroupEnd(), null_mut());
    check(symmGroupEnd(), null_mut());
    expect(
        symmGroupEnd(),
        symmResult_t::symmInvalidUsage,
        "symmGroupStart",
    );
}

#[test]
fn device_context_describes_the_window() {
    use_strict_host_backend();
    let nranks = 3;
    let comms = init_all(nranks);
    let mut buffers: Vec<RankBuffer> = Vec::new();
    check(symmGroupStart(), null_mut());
    for &comm in &comms {
        let mut p = null_mut();
        let mut win = null_mut();
        // SAFETY: valid out-pointers; live allocation.
        unsafe {
            check(symmMemAlloc(comm, &mut p, 512), comm);
            check(
                symmCommWindowRegister(comm, p, 512, &mut win, SYMM_WIN_COLL_SYMMETRIC),
                comm,
            );
            let mut ctx = null();
            expect(
                symmCommGetDeviceContext(comm, win, &mut ctx),
                symmResult_t::symmInvalidUsage,
                "has not completed",
            );
        }
        buffers.push(RankBuffer {
            comm,
            base: p.cast(),
            bytes: 512,
            window: win,
        });
    }
    check(symmGroupEnd(), null_mut());
    let bases: Vec<u64> = buffers.iter().map(|b| b.base as u64).collect();
    for (rank, b) in buffers.iter().enumerate() {
        let mut ctx: *const c_void = null();
        // SAFETY: valid out-pointers or NULL to be reported.
        unsafe {
            expect(
                symmCommGetDeviceContext(b.comm, b.window, null_mut()),
                symmResult_t::symmInvalidArgument,
                "devCtx",
            );
            expect(
                symmCommGetDeviceContext(b.comm, null_mut(), &mut ctx),
                symmResult_t::symmInvalidArgument,
                "win",
            );
            check(symmCommGetDeviceContext(b.comm, b.window, &mut ctx), b.comm);
        }
        assert!(!ctx.is_null());
        // SAFETY: on the host backend the context is host memory with this layout.
        let c = unsafe { &*(ctx as *const symmDeviceContext) };
        assert_eq!(
            (c.backend, c.version, c.rank, c.world_size),
            (0, 1, rank as u32, nranks as u32)
        );
        assert_eq!((c.local_base, c.window_size), (b.base as u64, 512));
        assert_eq!(c.timeout_ns, 10_000_000_000);
        // A native window's engine words are zero (docs/ARCHITECTURE.md, the engine words).
        assert_eq!(c.engine, [0; 3]);
        // SAFETY: the peer table holds world_size entries.
        let table = unsafe { std::slice::from_raw_parts(c.peer_bases as *const u64, nranks) };
        assert_eq!(table, &bases[..]);
        // SAFETY: the abort word is a live u32.
        assert_eq!(unsafe { *(c.abort_flag as *const u32) }, 0);
    }
    // Another rank's window handle is not this comm's window.
    let mut ctx = null();
    // SAFETY: valid out-pointer.
    expect(
        unsafe { symmCommGetDeviceContext(buffers[0].comm, buffers[1].window, &mut ctx) },
        symmResult_t::symmInvalidArgument,
        "not a window registered on this comm",
    );
    teardown(buffers);
}

/// `symmAlltoAll`, `symmGather` and `symmScatter` on rank 1 of two: a root that is no rank,
/// a NULL comm, a bad datatype, and the buffer errors of the buffers each rank's call uses
/// (a gather's `recvbuff` and a scatter's `sendbuff` only on the root; off it they are not
/// looked at, even NULL or foreign). Nothing is launched (rank 0 never calls), and no memory
/// is touched.
#[test]
fn all_to_all_gather_and_scatter_reject_bad_arguments() {
    use_strict_host_backend();
    let comms = init_all(2);
    let buffers = alloc_windows(&comms, 256);
    let (comm, base) = (buffers[1].comm, buffers[1].base);
    // SAFETY: offsets inside the 256-byte window.
    let at = |bytes: usize| unsafe { base.add(bytes) } as *mut c_void;
    let s = null_mut();
    let mut unregistered: *mut c_void = null_mut();
    // SAFETY: valid out-pointer.
    check(unsafe { symmMemAlloc(comm, &mut unregistered, 256) }, comm);
    let mut not_from_symm = [0f32; 8];
    let foreign = not_from_symm.as_mut_ptr() as *mut c_void;
    // SAFETY: host memory of the window.
    unsafe { write_f32(base, &[3.0; 64]) };
    type Call<'a> = Box<dyn Fn() -> symmResult_t + 'a>;
    let invalid = symmResult_t::symmInvalidArgument;
    let cases: Vec<(Call, symmResult_t, &str)> = vec![
        // All-to-all: both buffers hold 2 × count elements.
        (
            Box::new(|| symmAlltoAll(at(0), at(64), 4, F32, null_mut(), s)),
            invalid,
            "comm is NULL",
        ),
        (
            Box::new(|| symmAlltoAll(at(0), at(64), 4, 12, comm, s)),
            invalid,
            "datatype = 12",
        ),
        (
            Box::new(|| symmAlltoAll(null(), at(64), 4, F32, comm, s)),
            invalid,
            "sendbuff is NULL",
        ),
        (
            Box::new(|| symmAlltoAll(foreign, at(64), 4, F32, comm, s)),
            invalid,
            "sendbuff = ",
        ),
        (
            Box::new(|| symmAlltoAll(at(0), at(192), 16, F32, comm, s)),
            invalid,
            "recvbuff [",
        ),
        (
            Box::new(|| symmAlltoAll(at(0), at(2), 4, F32, comm, s)),
            invalid,
            "element size",
        ),
        (
            Box::new(|| symmAlltoAll(at(0), at(16), 4, F32, comm, s)),
            invalid,
            "overlap",
        ),
        // Gather: a bad root first; on the root (rank 1) both buffers.
        (
            Box::new(|| symmGather(null(), null_mut(), 4, 99, 2, comm, s)),
            invalid,
            "root = 2",
        ),
        (
            Box::new(|| symmGather(at(0), null_mut(), 4, F32, 1, comm, s)),
            invalid,
            "recvbuff is NULL",
        ),
        (
            Box::new(|| symmGather(at(0), at(224), 8, F32, 1, comm, s)),
            invalid,
            "recvbuff [",
        ),
        (
            Box::new(|| symmGather(at(68), at(64), 4, F32, 1, comm, s)),
            invalid,
            "overlaps",
        ),
        // Off the root (root 0): recvbuff is not looked at, sendbuff is.
        (
            Box::new(|| symmGather(null(), foreign, 4, F32, 0, comm, s)),
            invalid,
            "sendbuff is NULL",
        ),
        (
            Box::new(|| symmGather(unregistered, null_mut(), 4, F32, 0, comm, s)),
            invalid,
            "sendbuff",
        ),
        // Scatter: a bad root first; on the root both buffers.
        (
            Box::new(|| symmScatter(null(), null_mut(), 4, 99, -3, comm, s)),
            invalid,
            "root = -3",
        ),
        (
            Box::new(|| symmScatter(null(), at(64), 4, F32, 1, comm, s)),
            invalid,
            "sendbuff is NULL",
        ),
        (
            Box::new(|| symmScatter(at(224), at(0), 8, F32, 1, comm, s)),
            invalid,
            "sendbuff [",
        ),
        (
            Box::new(|| symmScatter(at(64), at(68), 4, F32, 1, comm, s)),
            invalid,
            "overlaps",
        ),
        // Off the root: sendbuff is not looked at, recvbuff is.
        (
            Box::new(|| symmScatter(foreign, null_mut(), 4, F32, 0, comm, s)),
            invalid,
            "recvbuff is NULL",
        ),
        (
            Box::new(|| symmScatter(null(), at(0), usize::MAX / 2, F32, 0, comm, s)),
            invalid,
            "count = ",
        ),
    ];
    for (call, code, needle) in &cases {
        expect(call(), *code, needle);
    }
    assert_eq!(
        // SAFETY: host memory of the window.
        unsafe { read_f32(base, 64) },
        vec![3.0; 64],
        "no memory touched"
    );
    assert_eq!(not_from_symm, [0.0; 8]);
    drop(cases);
    check(symmMemFree(comm, unregistered), comm);
    teardown(buffers);
}

/// `symmCallRefused`: NULL arguments are refused by name and count as no call; a refusal is
/// the rank's collective, so a peer whose all-reduce is right fails at once, naming the
/// reason, instead of waiting for it until the timeout.
#[test]
fn a_front_end_refusal_is_the_rank_s_call() {
    use_strict_host_backend();
    let comms = init_all(2);
    let call = c"symmAllReduce";
    let reason = c"recv is read-only";
    // SAFETY: NUL-terminated strings, or NULL to be reported.
    unsafe {
        expect(
            symmCallRefused(null(), reason.as_ptr(), comms[0]),
            symmResult_t::symmInvalidArgument,
            "call is NULL",
        );
        expect(
            symmCallRefused(call.as_ptr(), null(), comms[0]),
            symmResult_t::symmInvalidArgument,
            "reason is NULL",
        );
        expect(
            symmCallRefused(call.as_ptr(), reason.as_ptr(), null_mut()),
            symmResult_t::symmInvalidArgument,
            "comm is NULL",
        );
    }
    // Every rank's registration completes before any rank goes on (and later deregisters).
    let registered = std::sync::Barrier::new(comms.len());
    let outcomes = on_rank_threads(&comms, |rank, comm| {
        let (buffer, window) = window_of_bytes(comm, 256);
        registered.wait();
        let started = std::time::Instant::now();
        let result = if rank == 1 {
            // SAFETY: NUL-terminated strings.
            unsafe { symmCallRefused(call.as_ptr(), reason.as_ptr(), comm) }
        } else {
            symmAllReduce(buffer, buffer, 64, F32, SUM, comm, null_mut())
        };
        let outcome = (result, last_error(null_mut()), started.elapsed());
        symmCommWindowDeregister(comm, window);
        symmMemFree(comm, buffer);
        outcome
    });
    for (rank, (result, message, took)) in outcomes.iter().enumerate() {
        assert_ne!(*result, symmResult_t::symmSuccess, "rank {rank}");
        assert!(took.as_secs() < 5, "rank {rank} took {took:?}: {message}");
        assert!(
            message.contains("symmAllReduce: recv is read-only"),
            "rank {rank}: {message}"
        );
    }
    for c in comms {
        let _ = symmCommDestroy(c);
    }
}
