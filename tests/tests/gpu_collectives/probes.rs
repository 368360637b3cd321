//! Probes of the simulated GPU (functions its fake libcuda exports besides the driver's,
//! absent from a real driver) and the tests that count with them: reads of pinned host memory
//! by the LL all-reduce, and driver calls per grouped all-reduce.

use crate::{cuda_ranks, run_group};
use cudarc::driver::sys;
use std::ffi::c_void;
use std::ptr::null_mut;
use symm::*;
use symm_tests::*;

/// The address of `symbol`, a function the fake libcuda of the simulated GPU exports besides
/// the driver's (sim/cuda/src/lib.rs); `None` on a real driver.
pub(crate) fn simulator_symbol(symbol: &std::ffi::CStr) -> Option<*mut c_void> {
    unsafe extern "C" {
        fn dlopen(name: *const std::ffi::c_char, flags: std::ffi::c_int) -> *mut c_void;
        fn dlsym(handle: *mut c_void, symbol: *const std::ffi::c_char) -> *mut c_void;
    }
    const RTLD_LAZY: std::ffi::c_int = 1;
    const RTLD_NOLOAD: std::ffi::c_int = 4;
    // SAFETY: looks up a library the process loaded already (NOLOAD) and one of its symbols.
    unsafe {
        [c"libcuda.so", c"libcuda.so.1"]
            .into_iter()
            .map(|name| dlopen(name.as_ptr(), RTLD_LAZY | RTLD_NOLOAD))
            .filter(|library| !library.is_null())
            .map(|library| dlsym(library, symbol.as_ptr()))
            .find(|address| !address.is_null())
    }
}

/// The simulated GPU's count of driver calls (`symm_sim_driver_calls`): `None` on a real
/// driver.
pub(crate) fn simulator_call_counter()
-> Option<unsafe extern "C" fn(*mut std::ffi::c_char, usize) -> u64> {
    simulator_symbol(c"symm_sim_driver_calls").map(|address| {
        // SAFETY: the fake libcuda's function has this signature.
        unsafe {
            std::mem::transmute::<
                *mut c_void,
                unsafe extern "C" fn(*mut std::ffi::c_char, usize) -> u64,
            >(address)
        }
    })
}

/// The simulated GPU's count of kernel reads of pinned host memory (`symm_sim_host_reads`):
/// `None` on a real driver.
fn simulator_host_reads() -> Option<extern "C" fn() -> u64> {
    simulator_symbol(c"symm_sim_host_reads").map(|address| {
        // SAFETY: the fake libcuda's function has this signature.
        unsafe { std::mem::transmute::<*mut c_void, extern "C" fn() -> u64>(address) }
    })
}

/// Driver calls so far, and the table by function.
pub(crate) fn driver_calls(
    counter: unsafe extern "C" fn(*mut std::ffi::c_char, usize) -> u64,
) -> (u64, Vec<(String, u64)>) {
    let mut text = vec![0 as std::ffi::c_char; 1 << 16];
    // SAFETY: the buffer holds its length in bytes.
    let total = unsafe { counter(text.as_mut_ptr(), text.len()) };
    // SAFETY: NUL-terminated by the counter.
    let text = unsafe { std::ffi::CStr::from_ptr(text.as_ptr()) }.to_string_lossy();
    let table = text
        .lines()
        .filter_map(|l| l.rsplit_once(' '))
        .map(|(name, n)| (name.to_string(), n.parse().unwrap()))
        .collect();
    (total, table)
}

/// Reads of pinned host memory (the abort word) per grouped LL all-reduce of 256 bytes on
/// `nranks` ranks of the one GPU, after a warm-up call, counted by the simulated GPU (`None` on
/// a real GPU).
fn ll_all_reduce_host_reads_per_call(nranks: usize) -> Option<f64> {
    let count = 64;
    let comms = cuda_ranks(nranks);
    let host_reads = simulator_host_reads()?;
    let buffers = alloc_windows(&comms, 8 * count);
    let grouped = || {
        run_group(
            |_, b| {
                // SAFETY: both halves of the window.
                let recv = unsafe { b.base.add(4 * count) };
                symmAllReduce(
                    b.base.cast(),
                    recv.cast(),
                    count,
                    symmDataType_t::symmFloat32 as i32,
                    symmRedOp_t::symmSum as i32,
                    b.comm,
                    null_mut(),
                )
            },
            &buffers,
        )
    };
    grouped();
    let calls = 5;
    let before = host_reads();
    for _ in 0..calls {
        grouped();
    }
    Some((host_reads() - before) as f64 / calls as f64)
}

gpu_test! {
    /// Reads of pinned host memory by the kernels of a grouped LL all-reduce of 256 bytes (the
    /// planner's LL size; one block per rank), counted by the simulated GPU when its host reads
    /// cost time (`SYMM_SIM_HOST_READ_NS`; skipped otherwise, and on a real GPU). Each is a round
    /// trip across PCIe on a GPU.
    /// * 1 rank, whose kernel never waits: none. The kernels looked at the abort word at their
    ///   start (one read per block, on the critical path of every call): 1 per call.
    /// * 8 ranks: only waits that last past `POLLS_PER_ABORT_LOOK` polls read it, which the
    ///   simulated threads reach far sooner than a GPU's (their polls cost little virtual time):
    ///   0 to 167 per call over seeds 1-8, with the same spread at 2 ranks (0 to 16). A wait
    ///   that read the word after every miss made 482 at the `sim --test` seed (and the LL
    ///   all-reduce 10-40x slower on an H200).
    fn gpu_ll_all_reduce_reads_host_memory_only_when_a_wait_lasts() {
        let costed = std::env::var("SYMM_SIM_HOST_READ_NS")
            .ok()
            .and_then(|v| v.trim().parse::<u64>().ok())
            .is_some_and(|ns| ns > 0);
        if !costed {
            eprintln!("skipped: needs the simulated GPU with SYMM_SIM_HOST_READ_NS set");
            return;
        }
        let Some(one) = ll_all_reduce_host_reads_per_call(1) else {
            eprintln!("skipped: counts host-memory reads on the simulated GPU only");
            return;
        };
        eprintln!("host-memory reads per 1-rank LL all-reduce of 256 bytes: {one:.1}");
        assert!(one < 0.5, "{one} host-memory reads per 1-rank call");
        let eight = ll_all_reduce_host_reads_per_call(8).expect("the simulated GPU");
        eprintln!("host-memory reads per 8-rank LL all-reduce of 256 bytes: {eight:.1}");
        assert!(eight <= 256.0, "{eight} host-memory reads per 8-rank call");
    }
}

/// Most driver calls one grouped all-reduce of 8 ranks on one GPU may make, after the
/// first (NCCL makes about one launch per device).
const DRIVER_CALLS_PER_GROUPED_ALL_REDUCE: u64 = 10;

gpu_test! {
    /// The host path's cost in driver calls: a grouped all-reduce of 1 KiB on each of 8 ranks of
    /// one GPU, after a warm-up, counted by the simulated GPU's driver (skipped on a real one).
    fn gpu_driver_calls_per_grouped_all_reduce() {
        let nranks = 8;
        let count = 256;
        let comms = cuda_ranks(nranks);
        let Some(counter) = simulator_call_counter() else {
            eprintln!("skipped: counts driver calls on the simulated GPU only");
            return;
        };
        let buffers = alloc_windows(&comms, 8 * count);
        let stream = non_blocking_stream();
        let grouped = || {
            check(symmGroupStart(), null_mut());
            for b in &buffers {
                // SAFETY: both halves of the window.
                let recv = unsafe { b.base.add(4 * count) };
                let r = symmAllReduce(
                    b.base.cast(),
                    recv.cast(),
                    count,
                    symmDataType_t::symmFloat32 as i32,
                    symmRedOp_t::symmSum as i32,
                    b.comm,
                    stream.cast(),
                );
                check(r, b.comm);
            }
            check(symmGroupEnd(), null_mut());
        };
        for _ in 0..3 {
            grouped();
        }
        // SAFETY: the stream was created above.
        unsafe { sys::cuStreamSynchronize(stream) }
            .result()
            .unwrap();
        let calls = 10;
        let (before, table_before) = driver_calls(counter);
        for _ in 0..calls {
            grouped();
        }
        let (after, table_after) = driver_calls(counter);
        // SAFETY: created above; idle after the synchronization.
        unsafe {
            sys::cuStreamSynchronize(stream).result().unwrap();
            sys::cuStreamDestroy_v2(stream).result().unwrap();
        }
        let per_call = (after - before) as f64 / calls as f64;
        let mut breakdown: Vec<String> = table_after
            .iter()
            .filter_map(|(name, n)| {
                let old = table_before
                    .iter()
                    .find(|(o, _)| o == name)
                    .map_or(0, |(_, o)| *o);
                (*n > old).then(|| format!("{name} {:.1}", (*n - old) as f64 / calls as f64))
            })
            .collect();
        breakdown.sort();
        eprintln!(
            "driver calls per grouped all-reduce of {nranks} ranks x {} bytes: {per_call:.1} ({})",
            4 * count,
            breakdown.join(", ")
        );
        assert!(
            per_call <= DRIVER_CALLS_PER_GROUPED_ALL_REDUCE as f64,
            "{per_call:.1} driver calls per grouped all-reduce ({}), at most {DRIVER_CALLS_PER_GROUPED_ALL_REDUCE}",
            breakdown.join(", ")
        );
        teardown(buffers);
    }
}
