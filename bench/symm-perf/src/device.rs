//! The cuda side of the benchmark: copies into device buffers, CUDA events, CUDA graphs, and
//! the device-to-device copy bandwidth that serves as the floor. Used only when the
//! communicators run on the cuda backend.

use cudarc::driver::{result, sys};
use std::ffi::c_void;
use std::ptr::null_mut;

/// Result of a driver call, with the call named.
pub type CudaResult<T> = Result<T, String>;

fn check(what: &str, r: sys::CUresult) -> CudaResult<()> {
    if r == sys::cudaError_enum::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(format!("{what} failed: {r:?}"))
    }
}

/// Device 0's primary context, current on this thread, and a stream for the benchmark.
pub struct Gpu {
    /// The stream every rank's collective is issued on.
    pub stream: sys::CUstream,
}

impl Gpu {
    /// Make device 0's primary context current and create a stream.
    pub fn open() -> CudaResult<Gpu> {
        // SAFETY: plain driver calls with valid out-pointers; the library already initialized
        // the driver and retained this primary context.
        unsafe {
            let device = result::device::get(0).map_err(|e| format!("{e:?}"))?;
            let context = result::primary_ctx::retain(device).map_err(|e| format!("{e:?}"))?;
            result::ctx::set_current(context).map_err(|e| format!("{e:?}"))?;
            let mut stream = null_mut();
            check("cuStreamCreate", sys::cuStreamCreate(&mut stream, 1))?;
            Ok(Gpu { stream })
        }
    }

    /// Copy host bytes to device address `dst`, on the benchmark's stream (the one every
    /// collective is issued on), and wait for the copy: it is ordered after the collectives
    /// issued before (which may still read or write `dst`) and complete before the next one.
    pub fn upload(&self, dst: u64, bytes: &[u8]) -> CudaResult<()> {
        // SAFETY: `dst` is device memory from symmMemAlloc with room for `bytes`; `bytes`
        // outlives the copy, which is complete when the stream synchronization returns.
        unsafe {
            check(
                "cuMemcpyHtoDAsync",
                sys::cuMemcpyHtoDAsync_v2(dst, bytes.as_ptr().cast(), bytes.len(), self.stream),
            )?;
        }
        self.synchronize()
    }

    /// Copy `len` bytes from device address `src`, on the benchmark's stream: ordered after
    /// the collectives issued on it (the library makes the stream wait for them), complete
    /// when this returns.
    pub fn download(&self, src: u64, len: usize) -> CudaResult<Vec<u8>> {
        let mut out = vec![0u8; len];
        // SAFETY: `src` is device memory holding `len` bytes; `out` has room for `len` bytes
        // and outlives the copy, which is complete when the stream synchronization returns.
        unsafe {
            check(
                "cuMemcpyDtoHAsync",
                sys::cuMemcpyDtoHAsync_v2(out.as_mut_ptr().cast(), src, len, self.stream),
            )?
        };
        self.synchronize()?;
        Ok(out)
    }

    /// `bytes` of device memory of the caller's own (`cuMemAlloc`, in no window).
    pub fn alloc(&self, bytes: usize) -> CudaResult<u64> {
        let mut address = 0;
        // SAFETY: valid out-pointer; the primary context is current.
        unsafe { check("cuMemAlloc", sys::cuMemAlloc_v2(&mut address, bytes))? };
        Ok(address)
    }

    /// Free memory from [`Gpu::alloc`] once nothing uses it.
    pub fn free(&self, address: u64) -> CudaResult<()> {
        self.synchronize()?;
        // SAFETY: from `alloc`, freed once, after the stream's work.
        unsafe { check("cuMemFree", sys::cuMemFree_v2(address)) }
    }

    /// Wait for the stream.
    pub fn synchronize(&self) -> CudaResult<()> {
        // SAFETY: the stream is live.
        unsafe { check("cuStreamSynchronize", sys::cuStreamSynchronize(self.stream)) }
    }

    /// Capture `issue` (which enqueues one collective on every rank) into a CUDA graph, time
    /// `iterations` iterations of `launches` back-to-back replays each, and return the median
    /// time of one replay in µs (`-G launches`).
    pub fn time_graph(
        &self,
        iterations: usize,
        launches: usize,
        issue: &mut dyn FnMut() -> Result<(), String>,
    ) -> CudaResult<f64> {
        // SAFETY: capture, instantiate and launch on a live stream; events are created and
        // destroyed here.
        unsafe {
            check(
                "cuStreamBeginCapture",
                sys::cuStreamBeginCapture_v2(
                    self.stream,
                    sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED,
                ),
            )?;
            let issued = issue();
            let mut graph = null_mut();
            check(
                "cuStreamEndCapture",
                sys::cuStreamEndCapture(self.stream, &mut graph),
            )?;
            issued?;
            let mut exec = null_mut();
            check(
                "cuGraphInstantiate",
                sys::cuGraphInstantiateWithFlags(&mut exec, graph, 0),
            )?;
            let events = new_events(iterations + 1)?;
            check("cuEventRecord", sys::cuEventRecord(events[0], self.stream))?;
            for e in &events[1..] {
                for _ in 0..launches.max(1) {
                    check("cuGraphLaunch", sys::cuGraphLaunch(exec, self.stream))?;
                }
                check("cuEventRecord", sys::cuEventRecord(*e, self.stream))?;
            }
            let times = self.event_times(&events);
            sys::cuGraphExecDestroy(exec);
            sys::cuGraphDestroy(graph);
            Ok(median(&mut times?) / launches.max(1) as f64)
        }
    }

    /// Time `iterations` eager calls of `issue` with CUDA events around each (`-G 0`); with
    /// `blocking` (`-z 1`), wait for each collective before issuing the next. The median time
    /// of one call in µs.
    pub fn time_eager(
        &self,
        iterations: usize,
        blocking: bool,
        issue: &mut dyn FnMut() -> Result<(), String>,
    ) -> CudaResult<f64> {
        // SAFETY: events created here are recorded on the live stream and destroyed by
        // `event_times`.
        unsafe {
            let events = new_events(iterations + 1)?;
            check("cuEventRecord", sys::cuEventRecord(events[0], self.stream))?;
            for e in &events[1..] {
                issue()?;
                check("cuEventRecord", sys::cuEventRecord(*e, self.stream))?;
                if blocking {
                    self.synchronize()?;
                }
            }
            Ok(median(&mut self.event_times(&events)?))
        }
    }

    /// Wait for the stream, then the µs between consecutive `events`; destroys them.
    ///
    /// # Safety
    /// `events` are live events recorded on this stream.
    unsafe fn event_times(&self, events: &[sys::CUevent]) -> CudaResult<Vec<f64>> {
        let synchronized = self.synchronize();
        let mut times = Vec::with_capacity(events.len().saturating_sub(1));
        let mut failure = synchronized.err();
        for pair in events.windows(2) {
            let mut ms = 0f32;
            // SAFETY: both events are live and, the stream being synchronized, complete.
            let r = unsafe { sys::cuEventElapsedTime(&mut ms, pair[0], pair[1]) };
            match check("cuEventElapsedTime", r) {
                Ok(()) => times.push(ms as f64 * 1e3),
                Err(e) => failure = failure.or(Some(e)),
            }
        }
        for e in events {
            // SAFETY: live events, destroyed once.
            unsafe { sys::cuEventDestroy_v2(*e) };
        }
        match failure {
            Some(e) => Err(e),
            None => Ok(times),
        }
    }

    /// Device-to-device copy bandwidth in GB/s (bytes copied per second), median of 5.
    pub fn copy_bandwidth_gbps(&self, bytes: usize) -> CudaResult<f64> {
        // SAFETY: two fresh allocations of `bytes`, freed here; events as in `time_graph`.
        unsafe {
            let src = result::malloc_sync(bytes).map_err(|e| format!("{e:?}"))?;
            let dst = result::malloc_sync(bytes).map_err(|e| format!("{e:?}"))?;
            let (mut start, mut stop) = (null_mut(), null_mut());
            check("cuEventCreate", sys::cuEventCreate(&mut start, 0))?;
            check("cuEventCreate", sys::cuEventCreate(&mut stop, 0))?;
            let mut rates = Vec::new();
            for _ in 0..6 {
                check("cuEventRecord", sys::cuEventRecord(start, self.stream))?;
                check(
                    "cuMemcpyDtoDAsync",
                    sys::cuMemcpyDtoDAsync_v2(dst, src, bytes, self.stream),
                )?;
                check("cuEventRecord", sys::cuEventRecord(stop, self.stream))?;
                self.synchronize()?;
                let mut ms = 0f32;
                check(
                    "cuEventElapsedTime",
                    sys::cuEventElapsedTime(&mut ms, start, stop),
                )?;
                rates.push(bytes as f64 / (ms as f64 * 1e-3) / 1e9);
            }
            rates.remove(0);
            sys::cuEventDestroy_v2(start);
            sys::cuEventDestroy_v2(stop);
            result::free_sync(src).map_err(|e| format!("{e:?}"))?;
            result::free_sync(dst).map_err(|e| format!("{e:?}"))?;
            Ok(median(&mut rates))
        }
    }

    /// The stream as the C ABI takes it.
    pub fn symm_stream(&self) -> symm::symmStream_t {
        self.stream as *mut c_void as symm::symmStream_t
    }
}

/// `count` new timing events of the current context (destroyed by [`Gpu::event_times`]).
fn new_events(count: usize) -> CudaResult<Vec<sys::CUevent>> {
    let mut events = Vec::with_capacity(count);
    for _ in 0..count {
        let mut e = null_mut();
        // SAFETY: writes one event handle; a context is current (`Gpu::open`).
        check("cuEventCreate", unsafe { sys::cuEventCreate(&mut e, 0) })?;
        events.push(e);
    }
    Ok(events)
}

/// Median of `values` (sorted in place).
pub fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    if n == 0 {
        0.0
    } else if n % 2 == 1 {
        values[n / 2]
    } else {
        (values[n / 2 - 1] + values[n / 2]) / 2.0
    }
}
