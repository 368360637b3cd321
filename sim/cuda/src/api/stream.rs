//! Streams, events, stream capture and graphs.

use crate::state::{
    self, Capture, Event, Exec, MODE_RELAXED, OpKind, StreamCapture, StreamKind, capture_mode,
    set_capture_mode, thread_id,
};
use crate::util::{CuResult, Kind, entry, handle, non_null, not_supported, put};
use cudarc::driver::sys::{
    CUevent, CUgraph, CUgraphExec, CUresult, CUstream, CUstreamCaptureStatus as S,
    cudaError_enum as E,
};
use std::collections::HashSet;
use std::ffi::{c_int, c_uint, c_ulonglong};
use std::sync::Arc;

/// `CU_STREAM_NON_BLOCKING`.
const NON_BLOCKING: u32 = 1;
/// `CU_EVENT_DISABLE_TIMING`.
const DISABLE_TIMING: u32 = 2;
/// `CU_EVENT_INTERPROCESS`.
const INTERPROCESS: u32 = 4;

/// `cuStreamCreate`: a blocking stream (flags 0) or a non-blocking one
/// (`CU_STREAM_NON_BLOCKING`) on the current context's device.
///
/// # Safety
/// `out` is valid for one write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamCreate(out: *mut CUstream, flags: c_uint) -> CUresult {
    entry("cuStreamCreate", || create_stream(out, flags))
}

fn create_stream(out: *mut CUstream, flags: c_uint) -> CuResult<()> {
    let mut state = state::driver()?.lock();
    let d = state.current_healthy()?;
    non_null(out)?;
    if flags & !NON_BLOCKING != 0 {
        return Err(E::CUDA_ERROR_INVALID_VALUE);
    }
    let kind = if flags & NON_BLOCKING != 0 {
        StreamKind::NonBlocking
    } else {
        StreamKind::Blocking
    };
    let h = state.new_stream(d, kind);
    // SAFETY: the caller's output pointer (contract of both creation functions).
    unsafe { put(out, h as CUstream) }
}

/// `cuStreamCreateWithPriority`: as [`cuStreamCreate`] (priorities are not modeled).
///
/// # Safety
/// `out` is valid for one write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamCreateWithPriority(
    out: *mut CUstream,
    flags: c_uint,
    _priority: c_int,
) -> CUresult {
    entry("cuStreamCreateWithPriority", || create_stream(out, flags))
}

/// `cuStreamDestroy_v2`: the handle becomes invalid at once; work already queued on the
/// stream still runs (as CUDA does).
///
/// # Safety
/// No pointer is dereferenced (the stream is a handle).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamDestroy_v2(stream: CUstream) -> CUresult {
    entry("cuStreamDestroy_v2", || {
        let mut state = state::driver()?.lock();
        let h = stream as u64;
        let s = match state.streams.get(&h) {
            Some(s) if matches!(s.kind, StreamKind::Blocking | StreamKind::NonBlocking) => s,
            _ => return Err(E::CUDA_ERROR_INVALID_HANDLE),
        };
        if let Some(c) = s.capture.as_ref().map(|c| c.id) {
            state.invalidate(c, "a capturing stream was destroyed");
            if let Some(cap) = state.captures.get_mut(&c) {
                cap.streams.retain(|&x| x != h);
            }
        }
        state.streams.remove(&h);
        Ok(())
    })
}

/// `cuStreamSynchronize`: wait for the stream's work (for the legacy stream, every blocking
/// stream's too). Refused on a capturing stream (which invalidates the capture).
///
/// # Safety
/// No pointer is dereferenced (the stream is a handle).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamSynchronize(stream: CUstream) -> CUresult {
    entry("cuStreamSynchronize", || {
        let driver = state::driver()?;
        let mut state = driver.lock();
        let sid = state.resolve_stream(stream as u64)?;
        state.refuse_if_capturing(sid, "cuStreamSynchronize")?;
        let device = state.streams[&sid].device;
        state.healthy(device)?;
        let targets = state.stream_targets(sid);
        driver.wait_ops(state, Some(device), &targets).map(|_| ())
    })
}

/// `cuStreamQuery`: `CUDA_ERROR_NOT_READY` while the stream has work; refused on a
/// capturing stream.
///
/// # Safety
/// No pointer is dereferenced (the stream is a handle).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamQuery(stream: CUstream) -> CUresult {
    entry("cuStreamQuery", || {
        let mut state = state::driver()?.lock();
        let sid = state.resolve_stream(stream as u64)?;
        state.refuse_if_capturing(sid, "cuStreamQuery")?;
        state.healthy(state.streams[&sid].device)?;
        let targets = state.stream_targets(sid);
        if targets.iter().any(|t| state.ops.contains_key(t)) {
            Err(E::CUDA_ERROR_NOT_READY)
        } else {
            Ok(())
        }
    })
}

/// `cuStreamGetFlags`: `CU_STREAM_NON_BLOCKING` for non-blocking streams, else 0. Refused
/// (invalidating the capture) on a capturing stream and during a capture whose mode forbids
/// unsafe calls, as the driver does (an H200 with driver 580 answered
/// `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED` and invalidated the capture).
///
/// # Safety
/// `flags` is valid for one write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamGetFlags(stream: CUstream, flags: *mut c_uint) -> CUresult {
    entry("cuStreamGetFlags", || {
        let mut state = state::driver()?.lock();
        let sid = state.resolve_stream(stream as u64)?;
        state.refuse_if_capturing(sid, "cuStreamGetFlags")?;
        state.check_capture_safe("cuStreamGetFlags")?;
        let value = if state.streams[&sid].kind == StreamKind::NonBlocking {
            NON_BLOCKING
        } else {
            0
        };
        // SAFETY: the caller's output pointer.
        unsafe { put(flags, value) }
    })
}

/// `cuStreamWaitEvent`: later work on the stream waits for the event's latest record (none:
/// no wait). An event recorded in a capture makes the stream join that capture.
///
/// # Safety
/// No pointer is dereferenced (stream and event are handles).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamWaitEvent(
    stream: CUstream,
    event: CUevent,
    flags: c_uint,
) -> CUresult {
    entry("cuStreamWaitEvent", || {
        let driver = state::driver()?;
        let mut state = driver.lock();
        let sid = state.resolve_stream(stream as u64)?;
        let eh = event as u64;
        let e = state.events.get(&eh).ok_or(E::CUDA_ERROR_INVALID_HANDLE)?;
        if flags > 1 {
            return Err(E::CUDA_ERROR_INVALID_VALUE);
        }
        let (captured, last) = (e.captured.clone(), e.last_record);
        let (device, kind, stream_capture) = {
            let s = &state.streams[&sid];
            (s.device, s.kind, s.capture.clone())
        };
        state.healthy(device)?;
        match (captured, stream_capture) {
            (Some((c, deps)), Some(sc)) if sc.id == c => {
                if state.captures[&c].invalidated {
                    return Err(E::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
                }
                let sc = state
                    .streams
                    .get_mut(&sid)
                    .and_then(|s| s.capture.as_mut())
                    .expect("capturing");
                for d in deps {
                    if !sc.deps.contains(&d) {
                        sc.deps.push(d);
                    }
                }
                Ok(())
            }
            (Some((c, _)), Some(sc)) => {
                state.invalidate(
                    sc.id,
                    "a stream waited on an event recorded in another capture",
                );
                state.invalidate(c, "its event was waited on by a stream of another capture");
                Err(E::CUDA_ERROR_STREAM_CAPTURE_MERGE)
            }
            (Some((c, deps)), None) => {
                if kind == StreamKind::Legacy {
                    state.invalidate(c, "the legacy stream waited on an event of the capture");
                    return Err(E::CUDA_ERROR_STREAM_CAPTURE_IMPLICIT);
                }
                if state.captures[&c].invalidated {
                    return Err(E::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
                }
                state
                    .captures
                    .get_mut(&c)
                    .expect("capture")
                    .streams
                    .push(sid);
                state.streams.get_mut(&sid).expect("stream").capture =
                    Some(StreamCapture { id: c, deps });
                Ok(())
            }
            (None, Some(sc)) => {
                state.invalidate(
                    sc.id,
                    "a capturing stream waited on an event recorded outside the capture",
                );
                Err(E::CUDA_ERROR_STREAM_CAPTURE_ISOLATION)
            }
            (None, None) => {
                if kind == StreamKind::Legacy {
                    state.refuse_implicit_sync(device)?;
                }
                let extra: Vec<u64> = last.into_iter().collect();
                state.enqueue(sid, OpKind::Marker, &extra);
                driver.work.notify_all();
                Ok(())
            }
        }
    })
}

/// `cuStreamBeginCapture_v2`: start capturing `stream` in `mode` (not the legacy stream).
///
/// # Safety
/// No pointer is dereferenced (the stream is a handle).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamBeginCapture_v2(stream: CUstream, mode: u32) -> CUresult {
    entry("cuStreamBeginCapture_v2", || {
        let mut state = state::driver()?.lock();
        let sid = state.resolve_stream(stream as u64)?;
        if mode > MODE_RELAXED {
            return Err(E::CUDA_ERROR_INVALID_VALUE);
        }
        let (device, kind, capturing) = {
            let s = &state.streams[&sid];
            (s.device, s.kind, s.capture.is_some())
        };
        state.healthy(device)?;
        if kind == StreamKind::Legacy {
            return Err(E::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
        }
        if capturing {
            return Err(E::CUDA_ERROR_ILLEGAL_STATE);
        }
        let id = state.new_id();
        state.captures.insert(
            id,
            Capture {
                origin: sid,
                mode,
                thread: thread_id(),
                nodes: Vec::new(),
                invalidated: false,
                streams: vec![sid],
            },
        );
        state.streams.get_mut(&sid).expect("stream").capture = Some(StreamCapture {
            id,
            deps: Vec::new(),
        });
        Ok(())
    })
}

/// `cuStreamIsCapturing`: none, active or invalidated. For the legacy stream while a
/// blocking stream of its device captures, `CUDA_ERROR_STREAM_CAPTURE_IMPLICIT`.
///
/// # Safety
/// `status` is valid for one write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamIsCapturing(stream: CUstream, status: *mut S) -> CUresult {
    entry("cuStreamIsCapturing", || {
        let mut state = state::driver()?.lock();
        let sid = state.resolve_stream(stream as u64)?;
        let s = &state.streams[&sid];
        if s.kind == StreamKind::Legacy
            && state
                .streams
                .values()
                .any(|o| o.device == s.device && o.kind.is_blocking() && o.capture.is_some())
        {
            return Err(E::CUDA_ERROR_STREAM_CAPTURE_IMPLICIT);
        }
        let value = match &s.capture {
            None => S::CU_STREAM_CAPTURE_STATUS_NONE,
            Some(c) if state.captures.get(&c.id).is_none_or(|c| c.invalidated) => {
                S::CU_STREAM_CAPTURE_STATUS_INVALIDATED
            }
            Some(_) => S::CU_STREAM_CAPTURE_STATUS_ACTIVE,
        };
        // SAFETY: the caller's output pointer.
        unsafe { put(status, value) }
    })
}

/// `cuThreadExchangeStreamCaptureMode`: swap this thread's capture mode.
///
/// # Safety
/// `mode` is valid for one read and one write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuThreadExchangeStreamCaptureMode(mode: *mut u32) -> CUresult {
    entry("cuThreadExchangeStreamCaptureMode", || {
        state::driver()?;
        non_null(mode)?;
        // SAFETY: the caller's in/out pointer (function contract).
        let new = unsafe { mode.read_unaligned() };
        if new > MODE_RELAXED {
            return Err(E::CUDA_ERROR_INVALID_VALUE);
        }
        let old = capture_mode();
        set_capture_mode(new);
        // SAFETY: as above.
        unsafe { put(mode, old) }
    })
}

/// `true` when every node of `tips` is `target` or one of its ancestors among `nodes`.
fn joined(nodes: &[crate::state::Node], target: &[usize], tips: &[usize]) -> bool {
    let mut seen: HashSet<usize> = HashSet::new();
    let mut stack: Vec<usize> = target.to_vec();
    while let Some(n) = stack.pop() {
        if seen.insert(n) {
            stack.extend(nodes[n].deps.iter().copied());
        }
    }
    tips.iter().all(|t| seen.contains(t))
}

/// `cuStreamEndCapture`: end the capture begun on `stream` and return its graph. Fails (the
/// graph null) when the capture was invalidated, when a stream that joined it has work the
/// origin stream did not wait for (`CUDA_ERROR_STREAM_CAPTURE_UNJOINED`), and on the wrong
/// stream or thread.
///
/// # Safety
/// `graph` is valid for one write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamEndCapture(stream: CUstream, graph: *mut CUgraph) -> CUresult {
    entry("cuStreamEndCapture", || {
        let mut state = state::driver()?.lock();
        let sid = state.resolve_stream(stream as u64)?;
        non_null(graph)?;
        let c = state.streams[&sid]
            .capture
            .as_ref()
            .map(|c| c.id)
            .ok_or(E::CUDA_ERROR_ILLEGAL_STATE)?;
        let (origin, mode, thread) = {
            let cap = &state.captures[&c];
            (cap.origin, cap.mode, cap.thread)
        };
        if origin != sid {
            return Err(E::CUDA_ERROR_STREAM_CAPTURE_UNMATCHED);
        }
        if mode != MODE_RELAXED && thread != thread_id() {
            return Err(E::CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD);
        }
        let cap = state.captures.remove(&c).expect("capture");
        let mut tips: Vec<(u64, Vec<usize>)> = Vec::new();
        for s in &cap.streams {
            if let Some(stream) = state.streams.get_mut(s)
                && let Some(sc) = stream.capture.take()
            {
                tips.push((*s, sc.deps));
            }
        }
        for e in state.events.values_mut() {
            if e.captured.as_ref().is_some_and(|(id, _)| *id == c) {
                e.captured = None;
            }
        }
        // SAFETY: the caller's output pointer (null on every failure below).
        unsafe { put(graph, std::ptr::null_mut()) }?;
        if cap.invalidated {
            return Err(E::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
        }
        let origin_tips = tips
            .iter()
            .find(|(s, _)| *s == sid)
            .map(|(_, t)| t.clone())
            .unwrap_or_default();
        for (s, t) in &tips {
            if *s != sid && !joined(&cap.nodes, &origin_tips, t) {
                eprintln!(
                    "symm-sim: cuStreamEndCapture: stream {s:#x} joined the capture of stream \
                     {sid:#x} and has work the origin stream did not wait for"
                );
                return Err(E::CUDA_ERROR_STREAM_CAPTURE_UNJOINED);
            }
        }
        let h = handle(Kind::Graph, state.new_id());
        state.graphs.insert(h, Arc::new(cap.nodes));
        // SAFETY: the caller's output pointer.
        unsafe { put(graph, h as CUgraph) }
    })
}

/// `cuGraphInstantiateWithFlags`.
///
/// # Safety
/// `exec` is valid for one write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphInstantiateWithFlags(
    exec: *mut CUgraphExec,
    graph: CUgraph,
    _flags: c_ulonglong,
) -> CUresult {
    entry("cuGraphInstantiateWithFlags", || {
        let mut state = state::driver()?.lock();
        non_null(exec)?;
        let nodes = state
            .graphs
            .get(&(graph as u64))
            .ok_or(E::CUDA_ERROR_INVALID_VALUE)?
            .clone();
        let h = handle(Kind::GraphExec, state.new_id());
        state.execs.insert(h, Exec { nodes, last: None });
        // SAFETY: the caller's output pointer.
        unsafe { put(exec, h as CUgraphExec) }
    })
}

/// `cuGraphLaunch`: queue the graph's nodes after the stream's earlier work (and the previous
/// launch of the same graph), with their captured dependencies; later work on the stream
/// waits for all of them.
///
/// # Safety
/// No pointer is dereferenced (graph and stream are handles).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphLaunch(exec: CUgraphExec, stream: CUstream) -> CUresult {
    entry("cuGraphLaunch", || {
        let driver = state::driver()?;
        let mut state = driver.lock();
        let sid = state.resolve_stream(stream as u64)?;
        let (nodes, last) = {
            let e = state
                .execs
                .get(&(exec as u64))
                .ok_or(E::CUDA_ERROR_INVALID_VALUE)?;
            (e.nodes.clone(), e.last)
        };
        let (device, kind, capturing) = {
            let s = &state.streams[&sid];
            (s.device, s.kind, s.capture.is_some())
        };
        state.healthy(device)?;
        if capturing {
            return Err(not_supported("cuGraphLaunch into a capturing stream"));
        }
        if kind == StreamKind::Legacy {
            state.refuse_implicit_sync(device)?;
        }
        let mut head = state.entry_deps(sid);
        head.extend(last.filter(|l| state.ops.contains_key(l)));
        let mut ids: Vec<u64> = Vec::with_capacity(nodes.len());
        for node in nodes.iter() {
            let deps = if node.deps.is_empty() {
                head.clone()
            } else {
                node.deps.iter().map(|&d| ids[d]).collect()
            };
            let id = state.enqueue_free(node.device, node.kind.clone(), deps);
            ids.push(id);
        }
        let done = state.enqueue(sid, OpKind::Marker, &ids);
        state.execs.get_mut(&(exec as u64)).expect("exec").last = Some(done);
        driver.work.notify_all();
        Ok(())
    })
}

/// `cuGraphExecDestroy`.
///
/// # Safety
/// No pointer is dereferenced (the graph is a handle).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphExecDestroy(exec: CUgraphExec) -> CUresult {
    entry("cuGraphExecDestroy", || {
        let mut state = state::driver()?.lock();
        state
            .execs
            .remove(&(exec as u64))
            .map(|_| ())
            .ok_or(E::CUDA_ERROR_INVALID_VALUE)
    })
}

/// `cuGraphDestroy`.
///
/// # Safety
/// No pointer is dereferenced (the graph is a handle).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphDestroy(graph: CUgraph) -> CUresult {
    entry("cuGraphDestroy", || {
        let mut state = state::driver()?.lock();
        state
            .graphs
            .remove(&(graph as u64))
            .map(|_| ())
            .ok_or(E::CUDA_ERROR_INVALID_VALUE)
    })
}

/// `cuEventCreate`: flags `BLOCKING_SYNC` and `DISABLE_TIMING`; interprocess events are not
/// supported.
///
/// # Safety
/// `out` is valid for one write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuEventCreate(out: *mut CUevent, flags: c_uint) -> CUresult {
    entry("cuEventCreate", || {
        let mut state = state::driver()?.lock();
        let d = state.current_healthy()?;
        non_null(out)?;
        if flags & !(1 | DISABLE_TIMING | INTERPROCESS) != 0 {
            return Err(E::CUDA_ERROR_INVALID_VALUE);
        }
        if flags & INTERPROCESS != 0 {
            return Err(not_supported("cuEventCreate with CU_EVENT_INTERPROCESS"));
        }
        let h = handle(Kind::Event, state.new_id());
        state.events.insert(
            h,
            Event {
                device: d,
                flags,
                last_record: None,
                time_ns: None,
                captured: None,
            },
        );
        // SAFETY: the caller's output pointer.
        unsafe { put(out, h as CUevent) }
    })
}

/// `cuEventDestroy_v2`.
///
/// # Safety
/// No pointer is dereferenced (the event is a handle).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuEventDestroy_v2(event: CUevent) -> CUresult {
    entry("cuEventDestroy_v2", || {
        let mut state = state::driver()?.lock();
        state
            .events
            .remove(&(event as u64))
            .map(|_| ())
            .ok_or(E::CUDA_ERROR_INVALID_HANDLE)
    })
}

/// `cuEventRecord`: the event completes when the stream's earlier work has; recorded in a
/// capturing stream, it marks the capture's current nodes instead.
///
/// # Safety
/// No pointer is dereferenced (event and stream are handles).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuEventRecord(event: CUevent, stream: CUstream) -> CUresult {
    entry("cuEventRecord", || {
        let driver = state::driver()?;
        let mut state = driver.lock();
        let sid = state.resolve_stream(stream as u64)?;
        let eh = event as u64;
        let event_device = state
            .events
            .get(&eh)
            .ok_or(E::CUDA_ERROR_INVALID_HANDLE)?
            .device;
        let (device, kind, capture) = {
            let s = &state.streams[&sid];
            (s.device, s.kind, s.capture.clone())
        };
        if device != event_device {
            return Err(E::CUDA_ERROR_INVALID_HANDLE);
        }
        state.healthy(device)?;
        if let Some(sc) = capture {
            if state.captures[&sc.id].invalidated {
                return Err(E::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
            }
            state.events.get_mut(&eh).expect("event").captured = Some((sc.id, sc.deps));
            return Ok(());
        }
        if kind == StreamKind::Legacy {
            state.refuse_implicit_sync(device)?;
        }
        let op = state.enqueue(sid, OpKind::Record { event: eh }, &[]);
        let e = state.events.get_mut(&eh).expect("event");
        e.last_record = Some(op);
        e.time_ns = None;
        e.captured = None;
        driver.work.notify_all();
        Ok(())
    })
}

/// Refuse (invalidating the capture) a query of or wait on an event recorded in a capture
/// under way.
fn refuse_captured(state: &mut state::State, event: u64, call: &str) -> CuResult<()> {
    let captured = state
        .events
        .get(&event)
        .ok_or(E::CUDA_ERROR_INVALID_HANDLE)?
        .captured
        .as_ref()
        .map(|(c, _)| *c);
    if let Some(c) = captured {
        state.invalidate(c, &format!("{call} on an event recorded in the capture"));
        return Err(E::CUDA_ERROR_CAPTURED_EVENT);
    }
    Ok(())
}

/// `cuEventQuery`: `CUDA_ERROR_NOT_READY` until the latest record completed.
///
/// # Safety
/// No pointer is dereferenced (the event is a handle).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuEventQuery(event: CUevent) -> CUresult {
    entry("cuEventQuery", || {
        let mut state = state::driver()?.lock();
        let eh = event as u64;
        refuse_captured(&mut state, eh, "cuEventQuery")?;
        let e = &state.events[&eh];
        state.healthy(e.device)?;
        if state.pending(e.last_record) {
            Err(E::CUDA_ERROR_NOT_READY)
        } else {
            Ok(())
        }
    })
}

/// `cuEventSynchronize`: wait for the latest record.
///
/// # Safety
/// No pointer is dereferenced (the event is a handle).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuEventSynchronize(event: CUevent) -> CUresult {
    entry("cuEventSynchronize", || {
        let driver = state::driver()?;
        let mut state = driver.lock();
        let eh = event as u64;
        refuse_captured(&mut state, eh, "cuEventSynchronize")?;
        let (device, last) = {
            let e = &state.events[&eh];
            (e.device, e.last_record)
        };
        state.healthy(device)?;
        let targets: Vec<u64> = last.into_iter().collect();
        driver.wait_ops(state, Some(device), &targets).map(|_| ())
    })
}

fn elapsed(ms: *mut f32, start: CUevent, end: CUevent) -> CuResult<()> {
    let state = state::driver()?.lock();
    non_null(ms)?;
    let get = |h: CUevent| -> CuResult<&Event> {
        state
            .events
            .get(&(h as u64))
            .ok_or(E::CUDA_ERROR_INVALID_HANDLE)
    };
    let (a, b) = (get(start)?, get(end)?);
    state.healthy(a.device)?;
    for e in [a, b] {
        if e.flags & DISABLE_TIMING != 0 || e.last_record.is_none() || e.captured.is_some() {
            return Err(E::CUDA_ERROR_INVALID_HANDLE);
        }
        if state.pending(e.last_record) {
            return Err(E::CUDA_ERROR_NOT_READY);
        }
    }
    let (Some(t0), Some(t1)) = (a.time_ns, b.time_ns) else {
        return Err(E::CUDA_ERROR_INVALID_HANDLE);
    };
    let value = (t1 as f64 - t0 as f64) / 1e6;
    // SAFETY: the caller's output pointer.
    unsafe { put(ms, value as f32) }
}

/// `cuEventElapsedTime`: milliseconds of the simulator's virtual time between two completed
/// records.
///
/// # Safety
/// `ms` is valid for one write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuEventElapsedTime(
    ms: *mut f32,
    start: CUevent,
    end: CUevent,
) -> CUresult {
    entry("cuEventElapsedTime", || elapsed(ms, start, end))
}

/// `cuEventElapsedTime_v2`: as [`cuEventElapsedTime`].
///
/// # Safety
/// `ms` is valid for one write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuEventElapsedTime_v2(
    ms: *mut f32,
    start: CUevent,
    end: CUevent,
) -> CUresult {
    entry("cuEventElapsedTime_v2", || elapsed(ms, start, end))
}
