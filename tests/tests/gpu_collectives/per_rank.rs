//! Driving each rank from its own thread: `GpuRank` (a rank's window, as integers that cross
//! threads) and work run on a thread and a non-blocking stream per rank.

use crate::{download, upload};
use cudarc::driver::sys;
use symm::*;
use symm_tests::*;

/// A rank's window of device memory, as integers (to cross threads); every method runs on a
/// thread with the device's context current and uses the caller's stream.
#[derive(Clone, Copy)]
pub(crate) struct GpuRank {
    comm: usize,
    base: usize,
}

impl GpuRank {
    pub(crate) fn of(buffers: &[RankBuffer]) -> Vec<GpuRank> {
        buffers
            .iter()
            .map(|b| GpuRank {
                comm: b.comm as usize,
                base: b.base as usize,
            })
            .collect()
    }

    pub(crate) fn comm(self) -> symmComm_t {
        self.comm as symmComm_t
    }

    fn at(self, bytes: usize) -> *mut u8 {
        (self.base + bytes) as *mut u8
    }

    /// Fill `count` floats at byte `offset` with `value`.
    pub(crate) fn fill(self, offset: usize, count: usize, value: f32) {
        upload(self.at(offset), &vec![value; count]);
    }

    /// `count` floats at byte `offset`, once `stream` has finished.
    pub(crate) fn read(self, offset: usize, count: usize, stream: sys::CUstream) -> Vec<f32> {
        // SAFETY: the stream is the caller's; a failed kernel ends, it does not fault.
        unsafe { sys::cuStreamSynchronize(stream) }
            .result()
            .unwrap();
        download(self.at(offset), count)
    }

    /// In-place all-reduce (sum) of `count` floats at byte `offset`, on `stream`.
    pub(crate) fn all_reduce(
        self,
        offset: usize,
        count: usize,
        stream: sys::CUstream,
    ) -> symmResult_t {
        let p = self.at(offset).cast();
        symmAllReduce(
            p,
            p,
            count,
            symmDataType_t::symmFloat32 as i32,
            symmRedOp_t::symmSum as i32,
            self.comm(),
            stream.cast(),
        )
    }
}

/// Run `work(stream)` on this thread with the device's context current and a new non-blocking
/// stream, then wait for the stream and destroy it.
pub(crate) fn on_own_stream<T>(work: impl FnOnce(sys::CUstream) -> T) -> T {
    cuda_context();
    let stream = non_blocking_stream();
    let out = work(stream);
    // SAFETY: the stream was created above and is used by nobody else.
    unsafe {
        sys::cuStreamSynchronize(stream).result().unwrap();
        sys::cuStreamDestroy_v2(stream).result().unwrap();
    }
    out
}

/// Run `work(rank, stream)` on one thread per rank, each with the device's context current and
/// its own non-blocking stream, and collect what each returns.
pub(crate) fn per_rank_on_streams<T: Send>(
    ranks: &[GpuRank],
    work: impl Fn(usize, GpuRank, sys::CUstream) -> T + Sync,
) -> Vec<T> {
    std::thread::scope(|scope| {
        let work = &work;
        let handles: Vec<_> = ranks
            .iter()
            .enumerate()
            .map(|(r, &rank)| scope.spawn(move || on_own_stream(|stream| work(r, rank, stream))))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}
