//! CUDA-graph capture and replay: `replay_graph` and the `Capture` guard, an all-reduce
//! replayed with new inputs, and a reduce, a gather, a scatter and an all-to-all captured in
//! one graph.

use crate::{
    cuda_ranks, download, download_bytes, forced_low_latency, repeats, upload, upload_bytes,
};
use cudarc::driver::sys;
use std::ffi::c_void;
use std::ptr::null_mut;
use symm::*;
use symm_device::DataType;
use symm_tests::*;

/// Capture `issue(stream)` (calls on a new stream) into a CUDA graph, then `replays` times run
/// `replay(k, run)`, where `run` launches the graph and waits for it; then every rank's
/// asynchronous error must be success.
pub(crate) fn replay_graph(
    buffers: &[RankBuffer],
    replays: u64,
    issue: impl FnOnce(sys::CUstream),
    mut replay: impl FnMut(u64, &dyn Fn()),
) {
    // SAFETY: stream, graph and exec handles are created, used and destroyed here, in the
    // current context.
    unsafe {
        let mut stream = null_mut();
        sys::cuStreamCreate(&mut stream, 0).result().unwrap();
        let capture = Capture::begin(stream);
        issue(stream);
        let graph = capture.end();
        let mut exec = null_mut();
        sys::cuGraphInstantiateWithFlags(&mut exec, graph, 0)
            .result()
            .unwrap();
        for k in 0..replays {
            replay(k, &|| {
                sys::cuGraphLaunch(exec, stream).result().unwrap();
                sys::cuStreamSynchronize(stream).result().unwrap();
            });
        }
        sys::cuGraphExecDestroy(exec).result().unwrap();
        sys::cuGraphDestroy(graph).result().unwrap();
        sys::cuStreamDestroy_v2(stream).result().unwrap();
    }
    for b in buffers {
        let mut error = symmResult_t::symmSuccess;
        // SAFETY: valid out-pointer.
        check(unsafe { symmCommGetAsyncError(b.comm, &mut error) }, b.comm);
        assert_eq!(error, symmResult_t::symmSuccess);
    }
}

/// A stream capture in the global mode (as PyTorch's graphs capture), ended when dropped: a
/// test that fails inside it would otherwise leave it open, and every later test of the run
/// would fail allocating (`CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED` from the driver's
/// allocations while a global capture is open).
struct Capture(sys::CUstream);

impl Capture {
    fn begin(stream: sys::CUstream) -> Capture {
        let mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL;
        // SAFETY: a stream of the current context, not capturing.
        unsafe { sys::cuStreamBeginCapture_v2(stream, mode) }
            .result()
            .unwrap();
        Capture(stream)
    }

    /// End the capture and return its graph.
    fn end(self) -> sys::CUgraph {
        let stream = self.0;
        std::mem::forget(self);
        let mut graph = null_mut();
        // SAFETY: the stream is capturing (begun by `begin`, not ended since).
        unsafe { sys::cuStreamEndCapture(stream, &mut graph) }
            .result()
            .unwrap();
        graph
    }
}

impl Drop for Capture {
    fn drop(&mut self) {
        let mut graph = null_mut();
        // SAFETY: as in `end`; an invalidated capture ends with an error and no graph.
        unsafe {
            if sys::cuStreamEndCapture(self.0, &mut graph) == sys::CUresult::CUDA_SUCCESS
                && !graph.is_null()
            {
                sys::cuGraphDestroy(graph);
            }
        }
    }
}

gpu_test! {
    fn gpu_graph_capture_then_replay_with_new_inputs() {
        let nranks = 4;
        // An odd count with a tail; under SYMM_ALGO=ll, one that fits the LL buffers.
        let count = if forced_low_latency() { 4091 } else { 4099 };
        let comms = cuda_ranks(nranks);
        let buffers = alloc_windows(&comms, 4 * count + 4096);
        replay_graph(
            &buffers,
            repeats(200),
            |stream| {
                check(symmGroupStart(), null_mut());
                for b in &buffers {
                    let r = symmAllReduce(
                        b.base.cast(),
                        b.base.cast(),
                        count,
                        DataType::Float32 as i32,
                        0,
                        b.comm,
                        stream.cast(),
                    );
                    check(r, b.comm);
                }
                check(symmGroupEnd(), null_mut());
            },
            |replay, run| {
                let inputs = random_inputs(nranks, count, replay);
                for (b, input) in buffers.iter().zip(&inputs) {
                    upload(b.base, input);
                }
                run();
                let results: Vec<Vec<f32>> = buffers.iter().map(|b| download(b.base, count)).collect();
                assert_matches_f64_sum(&inputs, &results, &format!("graph replay {replay}"));
            },
        );
        teardown(buffers);
    }
}

gpu_test! {
    /// A reduce, a gather, a scatter and an all-to-all (each its own group over 4 ranks, roots 1,
    /// 2 and 3) captured in one graph, replayed with new int32 inputs each time: every result
    /// exact, every replay.
    fn gpu_graph_capture_of_rooted_and_segment_collectives() {
        let nranks: usize = 4;
        let count: usize = 257;
        let int32 = DataType::Int32 as i32;
        let whole = 4 * nranks * count;
        // The send region, then the receive regions of the reduce, gather, scatter, all-to-all.
        let region = whole.next_multiple_of(256);
        let (send, reduced, gathered, scattered, exchanged) =
            (0, region, 2 * region, 3 * region, 4 * region);
        let comms = cuda_ranks(nranks);
        let buffers = alloc_windows(&comms, 5 * region + 4096);
        let (reduce_root, gather_root, scatter_root) = (1usize, 2usize, 3usize);
        let at = |b: &RankBuffer, offset: usize| -> *mut c_void {
            // SAFETY: offsets inside the window (5 regions).
            unsafe { b.base.add(offset).cast() }
        };
        let ints = |bytes: Vec<u8>| -> Vec<i32> {
            bytes
                .chunks(4)
                .map(|c| i32::from_ne_bytes(c.try_into().unwrap()))
                .collect()
        };
        replay_graph(
            &buffers,
            repeats(50),
            |stream| {
                let s = stream.cast();
                for call in 0..4 {
                    check(symmGroupStart(), null_mut());
                    for b in &buffers {
                        let r = match call {
                            0 => symmReduce(
                                at(b, send),
                                at(b, reduced),
                                count,
                                int32,
                                0,
                                reduce_root as i32,
                                b.comm,
                                s,
                            ),
                            1 => symmGather(
                                at(b, send),
                                at(b, gathered),
                                count,
                                int32,
                                gather_root as i32,
                                b.comm,
                                s,
                            ),
                            2 => symmScatter(
                                at(b, send),
                                at(b, scattered),
                                count,
                                int32,
                                scatter_root as i32,
                                b.comm,
                                s,
                            ),
                            _ => symmAlltoAll(at(b, send), at(b, exchanged), count, int32, b.comm, s),
                        };
                        check(r, b.comm);
                    }
                    check(symmGroupEnd(), null_mut());
                }
            },
            |replay, run| {
                let mut rng = Rng(replay + 1);
                let inputs: Vec<Vec<i32>> = (0..nranks)
                    .map(|_| (0..nranks * count).map(|_| rng.next_u64() as i32).collect())
                    .collect();
                for (b, input) in buffers.iter().zip(&inputs) {
                    let bytes: Vec<u8> = input.iter().flat_map(|v| v.to_ne_bytes()).collect();
                    upload_bytes(at(b, send).cast(), &bytes);
                }
                run();
                let case = format!("graph replay {replay}");
                let sum: Vec<i32> = (0..count)
                    .map(|i| inputs.iter().fold(0i32, |a, x| a.wrapping_add(x[i])))
                    .collect();
                let got = ints(download_bytes(
                    at(&buffers[reduce_root], reduced).cast(),
                    4 * count,
                ));
                assert!(got == sum, "{case}: reduce");
                let got = ints(download_bytes(
                    at(&buffers[gather_root], gathered).cast(),
                    whole,
                ));
                let want: Vec<i32> = inputs.iter().flat_map(|x| x[..count].to_vec()).collect();
                assert!(got == want, "{case}: gather");
                for (p, b) in buffers.iter().enumerate() {
                    let got = ints(download_bytes(at(b, scattered).cast(), 4 * count));
                    assert!(
                        got == inputs[scatter_root][p * count..][..count],
                        "{case}: scatter to {p}"
                    );
                    let got = ints(download_bytes(at(b, exchanged).cast(), whole));
                    let want: Vec<i32> = inputs
                        .iter()
                        .flat_map(|x| x[p * count..][..count].to_vec())
                        .collect();
                    assert!(got == want, "{case}: all-to-all at {p}");
                }
            },
        );
        teardown(buffers);
    }
}
