//! Streams and events of the cuda backend: a communicator's internal stream and the events
//! that order it with its callers' streams ([`CommStream`]), streams made for callers, the
//! kind of a caller's stream, the event recorded after each launch on a caller's stream (and
//! the waits for it), and the guards that destroy a stream or an event an error path leaves
//! behind.

use super::CudaBackend;
use super::device::CudaDevice;
use crate::backend::driver::{driver, outside_capture};
use crate::error::Result;
use crate::launch::schedule::{self, StreamKind};
use cudarc::driver::{result, sys};
use std::sync::Arc;

/// A communicator's internal stream and the two events that order it with the caller's
/// stream. A launch serving several ranks on different callers' streams runs on the first
/// rank's internal stream, after every caller's stream and before its next work; a launch
/// serving one rank (or ranks all on one stream) goes directly on the caller's stream (see
/// [`schedule::schedule`]).
pub struct CommStream {
    /// The device the stream and events belong to.
    pub(super) device: Arc<CudaDevice>,
    /// The internal stream.
    pub(super) stream: sys::CUstream,
    /// Recorded on the rank's caller's stream when a launch on an internal stream waits for
    /// it.
    pub(super) before: sys::CUevent,
    /// Recorded on the internal stream after a launch there, for the callers' streams to wait
    /// on.
    pub(super) after: sys::CUevent,
}

// SAFETY: driver handles may be used from any thread.
unsafe impl Send for CommStream {}
// SAFETY: as above.
unsafe impl Sync for CommStream {}

impl Drop for CommStream {
    fn drop(&mut self) {
        // Destroy even when the context cannot be entered: the calls then fail harmlessly.
        let _context = self.device.context.enter();
        // SAFETY: the handles were created by `open_comm` and are destroyed once, here; each
        // is destroyed even when a call before it fails (the driver releases an event or a
        // stream with work still pending once that work completes).
        let _ = driver("destroying a stream", || unsafe {
            let synchronized = result::stream::synchronize(self.stream);
            let before = result::event::destroy(self.before);
            let after = result::event::destroy(self.after);
            let stream = result::stream::destroy(self.stream);
            synchronized.and(before).and(after).and(stream)
        });
    }
}

/// A stream created by [`OwnedStream::create`] in the current context, destroyed on drop (with
/// that context entered) unless handed over by [`OwnedStream::into_raw`]: what keeps an error
/// path that creates several handles from leaking the first ones.
pub(super) struct OwnedStream(sys::CUstream);

impl OwnedStream {
    /// A non-blocking stream of the current context.
    pub(super) fn create() -> Result<Self> {
        driver("cuStreamCreate", || {
            result::stream::create(result::stream::StreamKind::NonBlocking)
        })
        .map(Self)
    }

    /// The stream, now owned by the caller (who destroys it).
    pub(super) fn into_raw(self) -> sys::CUstream {
        let stream = self.0;
        std::mem::forget(self);
        stream
    }
}

impl Drop for OwnedStream {
    fn drop(&mut self) {
        // SAFETY: a stream created by `create`, not handed over, destroyed once, here.
        let _ = unsafe { result::stream::destroy(self.0) };
    }
}

/// An event of the current context, destroyed on drop unless handed over (as
/// [`OwnedStream`]).
pub(super) struct OwnedEvent(sys::CUevent);

impl OwnedEvent {
    /// An event of the current context with `flags`.
    pub(super) fn create(flags: sys::CUevent_flags) -> Result<Self> {
        driver("cuEventCreate", || result::event::create(flags)).map(Self)
    }

    /// The event, still owned by the guard.
    pub(super) fn handle(&self) -> sys::CUevent {
        self.0
    }

    /// The event, now owned by the caller (who destroys it).
    pub(super) fn into_raw(self) -> sys::CUevent {
        let event = self.0;
        std::mem::forget(self);
        event
    }
}

impl Drop for OwnedEvent {
    fn drop(&mut self) {
        // SAFETY: an event created by `create`, not handed over, destroyed once, here.
        let _ = unsafe { result::event::destroy(self.0) };
    }
}

/// The key of a caller's stream in
/// [`CudaDevice::launch_events`](super::device::CudaDevice::launch_events): its handle, and for
/// `CU_STREAM_PER_THREAD` (one handle, a stream per thread) the calling thread too.
fn stream_key(stream: u64) -> (u64, u64) {
    static NEXT_THREAD: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    thread_local! {
        static THREAD: u64 = NEXT_THREAD.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
    if stream == schedule::PER_THREAD_STREAM {
        (stream, THREAD.with(|t| *t))
    } else {
        (stream, 0)
    }
}

/// Whether the caller's stream `handle` is being captured into a CUDA graph.
pub(super) fn is_capturing(handle: u64) -> Result<bool> {
    let mut capture = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    // SAFETY: a stream handle from the caller; one write. Allowed during any capture.
    driver("cuStreamIsCapturing", || unsafe {
        sys::cuStreamIsCapturing(handle as sys::CUstream, &mut capture).result()
    })?;
    Ok(capture != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE)
}

/// The kind of a caller's stream: the special handles by value, others by `cuStreamGetFlags`.
///
/// `cuStreamGetFlags` is refused on a stream being captured (and, in the default capture
/// mode, while this thread captures any stream): the refusal invalidates the caller's capture
/// (seen on an H200, driver 580). So a capturing stream is not asked: its kernel runs when the
/// graph is launched, on a stream the caller picks then, and the blocking-stream hazard the
/// kind guards against belongs to that launch, which this library never sees; it counts as
/// non-blocking. Another stream is asked with this thread's capture mode relaxed.
pub(super) fn stream_kind(handle: u64) -> Result<StreamKind> {
    if let Some(kind) = StreamKind::of_special_handle(handle) {
        return Ok(kind);
    }
    let mut capture = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    // SAFETY: a stream handle from the caller; one write. Allowed during any capture.
    driver("cuStreamIsCapturing", || unsafe {
        sys::cuStreamIsCapturing(handle as sys::CUstream, &mut capture).result()
    })?;
    if capture != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE {
        return Ok(StreamKind::NonBlocking);
    }
    let mut flags: std::ffi::c_uint = 0;
    outside_capture(|| {
        // SAFETY: a stream handle from the caller, queried for its flags (one write).
        driver("cuStreamGetFlags", || unsafe {
            sys::cuStreamGetFlags(handle as sys::CUstream, &mut flags).result()
        })
    })?;
    Ok(
        if flags & sys::CUstream_flags::CU_STREAM_NON_BLOCKING as std::ffi::c_uint != 0 {
            StreamKind::NonBlocking
        } else {
            StreamKind::Blocking
        },
    )
}

impl CudaBackend {
    /// See [`Backend::open_comm`](crate::backend::Backend::open_comm).
    pub fn open_comm(&self, ordinal: i32) -> Result<CommStream> {
        let device = self.device(ordinal)?;
        let entered = device.context.enter()?;
        let flags = sys::CUevent_flags::CU_EVENT_DISABLE_TIMING;
        // Destroyed again (with the context still entered) when a later creation fails.
        let stream = OwnedStream::create()?;
        let before = OwnedEvent::create(flags)?;
        let after = OwnedEvent::create(flags)?;
        let comm = CommStream {
            device: device.clone(),
            stream: stream.into_raw(),
            before: before.into_raw(),
            after: after.into_raw(),
        };
        drop(entered);
        Ok(comm)
    }

    /// A non-blocking stream of device `ordinal`'s context, owned by the caller (who destroys
    /// it with [`CudaBackend::destroy_stream`]).
    pub fn create_stream(&self, ordinal: i32) -> Result<u64> {
        let device = self.device(ordinal)?;
        let _context = device.context.enter()?;
        Ok(OwnedStream::create()?.into_raw() as u64)
    }

    /// Destroy a stream made by [`CudaBackend::create_stream`] on device `ordinal`.
    pub fn destroy_stream(&self, ordinal: i32, stream: u64) -> Result<()> {
        let device = self.device(ordinal)?;
        let _context = device.context.enter()?;
        // SAFETY: a stream `create_stream` made and handed over, destroyed once by its owner.
        driver("cuStreamDestroy", || unsafe {
            result::stream::destroy(stream as sys::CUstream)
        })
    }

    /// Wait for the communicator's stream.
    pub fn synchronize(&self, comm: &CommStream) -> Result<()> {
        let _context = comm.device.context.enter()?;
        // SAFETY: the stream belongs to this context.
        driver("cuStreamSynchronize", || unsafe {
            result::stream::synchronize(comm.stream)
        })
    }

    /// See [`Backend::mark_launch`](crate::backend::Backend::mark_launch): record the device's
    /// event of each distinct stream of `streams` on it, after the launch just enqueued there, and
    /// return the events. A stream being captured is skipped: its work runs when the graph is
    /// launched, on streams the caller chooses and waits for.
    pub fn mark_launch(&self, ordinal: i32, streams: &[u64]) -> Result<Vec<u64>> {
        let device = self.device(ordinal)?;
        let _context = device.context.enter()?;
        let mut keys: Vec<(u64, (u64, u64))> = Vec::with_capacity(streams.len());
        for &stream in streams {
            let key = stream_key(stream);
            if !keys.iter().any(|(_, k)| *k == key) {
                keys.push((stream, key));
            }
        }
        let mut recorded = Vec::with_capacity(keys.len());
        for (stream, key) in keys {
            let mut capture = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
            // SAFETY: a stream of this context (the caller's); one write.
            driver("cuStreamIsCapturing", || unsafe {
                sys::cuStreamIsCapturing(stream as sys::CUstream, &mut capture).result()
            })?;
            if capture != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE {
                continue;
            }
            let event = {
                let mut events = device
                    .launch_events
                    .lock()
                    .unwrap_or_else(|e| e.into_inner());
                match events.get(&key) {
                    Some(&event) => event,
                    None => {
                        let flags = sys::CUevent_flags::CU_EVENT_DISABLE_TIMING;
                        let event = driver("cuEventCreate", || result::event::create(flags))?;
                        events.insert(key, event);
                        event
                    }
                }
            };
            // SAFETY: an event of this context (never destroyed while the device lives) and
            // the caller's stream of this context.
            driver("cuEventRecord", || unsafe {
                result::event::record(event, stream as sys::CUstream)
            })?;
            recorded.push(event as u64);
        }
        Ok(recorded)
    }

    /// See [`Backend::wait_marks`](crate::backend::Backend::wait_marks): wait for every event of
    /// `events` (from [`CudaBackend::mark_launch`] on device `ordinal`).
    pub fn wait_marks(&self, ordinal: i32, events: &[u64]) -> Result<()> {
        if events.is_empty() {
            return Ok(());
        }
        let device = self.device(ordinal)?;
        let _context = device.context.enter()?;
        for &event in events {
            // SAFETY: an event of this context, alive while the device is.
            driver("cuEventSynchronize", || unsafe {
                result::event::synchronize(event as sys::CUevent)
            })?;
        }
        Ok(())
    }
}
