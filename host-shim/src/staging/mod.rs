//! Staging: a collective whose buffers lie outside every registered window runs through the
//! communicator's staging window. Its data is copied into the window on the caller's stream,
//! the collective runs there as a symmetric call, and the result is copied out, in chunks when
//! the call is larger than the window.
//!
//! Every rank makes its staging window when its communicator is created ([`attach`]), so the
//! window exists on every rank before any call needs it, and staging a call never waits for a
//! peer. Whether a call is staged is part of what the ranks agree on ([`crate::agree`]): a
//! staged rank never pairs with a rank whose buffers are in its windows, and a rank's chunks
//! pair with its peers' chunks (the chunking depends only on the call's shape and the window's
//! size, which registration checks is the same on every rank).
//!
//! Planning the chunks is pure ([`plan_chunks`]); the copies run where the launch runs
//! (`collective::execute`, through [`crate::backend::Backend::copy`]).

use crate::abi::{SYMM_WIN_COLL_SYMMETRIC, symmDataTypeRaw};
use crate::collective::{Request, data_type};
use crate::comm::{Comm, windows};
use crate::error::{Error, Result};
use crate::log::{Level, Subsys};
use crate::plan::Collective;
use crate::window::Window;
use std::ffi::c_int;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// Alignment of the receive region in the staging window.
const REGION_ALIGN: u64 = 256;

/// A communicator's staging window.
pub struct Staging {
    /// The window (registered like a user's, on every rank, at the communicator's creation).
    pub window: Arc<Window>,
    /// Set once the first staged call has been announced in the log.
    announced: AtomicBool,
}

/// Make the staging window of each of `comms` (ranks of one communicator that this thread
/// creates; one rank per thread, or every rank of an `symmCommInitAll`), of
/// `SYMM_STAGING_BYTES` (none when 0 or under `SYMM_STRICT_WINDOWS=1`). Every rank of the
/// communicator makes it at its creation, so that its registration pairs with the peers'.
pub fn attach(comms: &[Arc<Comm>]) -> Result<()> {
    let bytes = crate::config::staging_bytes()?;
    attach_with(comms, bytes)
}

/// [`attach`] with the window's size given (0: none).
pub fn attach_with(comms: &[Arc<Comm>], bytes: u64) -> Result<()> {
    if bytes == 0 {
        return Ok(());
    }
    let mut made = Vec::with_capacity(comms.len());
    for comm in comms {
        let address = comm.mem_alloc(bytes as usize)?;
        match windows::register(comm, address, bytes as usize, SYMM_WIN_COLL_SYMMETRIC) {
            Ok(window) => made.push((comm, window)),
            Err(e) => {
                let _ = comm.mem_free(address);
                return Err(staging_error(e));
            }
        }
    }
    // One thread completing several ranks' registrations starts every one before finishing
    // any (see `windows::start_completion`).
    let started: Vec<Result<()>> = made
        .iter()
        .map(|(comm, window)| windows::start_completion(comm, window))
        .collect();
    let mut first_error = None;
    for ((comm, window), started) in made.into_iter().zip(started) {
        match windows::finish_completion(comm, &window, started) {
            Ok(()) => {
                comm.lock().staging = Some(Arc::new(Staging {
                    window,
                    announced: AtomicBool::new(false),
                }))
            }
            Err(e) => {
                first_error.get_or_insert(staging_error(e));
            }
        }
    }
    first_error.map_or(Ok(()), Err)
}

fn staging_error(e: Error) -> Error {
    Error::new(
        e.code,
        format!(
            "the communicator's staging window (SYMM_STAGING_BYTES; 0 makes none): {}",
            e.message
        ),
    )
}

/// One copy of a staged call: `bytes` from `src` to `dst`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Copy {
    /// Destination address.
    pub dst: u64,
    /// Source address.
    pub src: u64,
    /// Bytes.
    pub bytes: u64,
}

/// The copies around one chunk of a staged call, on the caller's stream.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Copies {
    /// Into the staging window, before the chunk's launch.
    pub before: Vec<Copy>,
    /// Out of the staging window, after it.
    pub after: Vec<Copy>,
}

impl Copies {
    /// Bytes copied in all.
    pub fn bytes(&self) -> u64 {
        self.before.iter().chain(&self.after).map(|c| c.bytes).sum()
    }
}

/// How a collective's buffers are made of segments of `count` elements: how many the send
/// and the receive buffer hold, and whether this rank uses each.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shape {
    /// Segments of the send buffer (all-gather: 1; reduce-scatter: nranks).
    pub send_segments: u64,
    /// Segments of the receive buffer.
    pub recv_segments: u64,
    /// This rank reads its send buffer (not a broadcast's or a scatter's non-root).
    pub uses_send: bool,
    /// This rank's receive buffer is written (not a reduce's or a gather's non-root).
    pub uses_recv: bool,
}

impl Shape {
    /// The shape of `collective` on `rank` of `nranks` with `root`; `None` for a collective
    /// that is not staged (all-to-all-v: its counts are known only on the device).
    pub fn of(collective: Collective, nranks: u64, rank: usize, root: usize) -> Option<Shape> {
        let is_root = rank == root;
        let (send_segments, recv_segments, uses_send, uses_recv) = match collective {
            Collective::AllReduce => (1, 1, true, true),
            Collective::Reduce => (1, 1, true, is_root),
            Collective::Broadcast => (1, 1, is_root, true),
            Collective::AllGather => (1, nranks, true, true),
            Collective::ReduceScatter => (nranks, 1, true, true),
            Collective::AllToAll => (nranks, nranks, true, true),
            Collective::Gather => (1, nranks, true, is_root),
            Collective::Scatter => (nranks, 1, is_root, true),
            Collective::AllToAllV => return None,
        };
        Some(Shape {
            send_segments,
            recv_segments,
            uses_send,
            uses_recv,
        })
    }
}

/// One chunk of a staged call: `count` elements per segment from element `first` of each.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Chunk {
    /// First element of the chunk in each segment.
    pub first: u64,
    /// Elements per segment.
    pub count: u64,
    /// Its copies.
    pub copies: Copies,
}

/// The staged form of a call: where its send and receive buffers lie in the staging window
/// (the same for every chunk) and its chunks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChunkPlan {
    /// The send region's address in the staging window.
    pub send: u64,
    /// The receive region's address.
    pub recv: u64,
    /// Most elements per segment of one chunk.
    pub capacity: u64,
    /// The chunks, in order (one of count 0 for a call of count 0).
    pub chunks: Vec<Chunk>,
}

/// Cut a call of `count` elements per segment of `element` bytes, shaped `shape`, whose
/// buffers are `user = (send, recv)`, into chunks through the staging region
/// `staging = (base, bytes)`: the send region first, the receive region after it (aligned).
/// Pure: the same on every rank for the same call and window size.
pub fn plan_chunks(
    shape: Shape,
    count: u64,
    element: u64,
    staging: (u64, u64),
    user: (u64, u64),
) -> Result<ChunkPlan> {
    let (base, bytes) = staging;
    let (send, recv) = user;
    let per_element = (shape.send_segments + shape.recv_segments) * element;
    let capacity = bytes.saturating_sub(REGION_ALIGN) / per_element;
    if capacity == 0 {
        return Err(Error::invalid_argument(format!(
            "the staging window ({bytes} bytes, SYMM_STAGING_BYTES) holds no element of this \
             call ({per_element} bytes per element with every segment)"
        )));
    }
    let send_region = shape.send_segments * capacity * element;
    let recv_at = base + send_region.div_ceil(REGION_ALIGN) * REGION_ALIGN;
    let mut chunks = Vec::new();
    let mut first = 0;
    loop {
        let n = capacity.min(count - first);
        let chunk_bytes = n * element;
        let mut copies = Copies::default();
        // Segment `j` of a chunk sits at `j × n` in the staging region and at `j × count +
        // first` in the user's buffer; a chunk of the whole call is one contiguous copy.
        let segments = |segments: u64| {
            if n == count {
                vec![(0, 0, segments * chunk_bytes)]
            } else {
                (0..segments)
                    .map(|j| (j * chunk_bytes, (j * count + first) * element, chunk_bytes))
                    .collect()
            }
        };
        if n > 0 && shape.uses_send {
            for (staged, at, bytes) in segments(shape.send_segments) {
                copies.before.push(Copy {
                    dst: base + staged,
                    src: send + at,
                    bytes,
                });
            }
        }
        if n > 0 && shape.uses_recv {
            for (staged, at, bytes) in segments(shape.recv_segments) {
                copies.after.push(Copy {
                    dst: recv + at,
                    src: recv_at + staged,
                    bytes,
                });
            }
        }
        chunks.push(Chunk {
            first,
            count: n,
            copies,
        });
        first += n;
        if first >= count {
            break;
        }
    }
    Ok(ChunkPlan {
        send: base,
        recv: recv_at,
        capacity,
        chunks,
    })
}

/// A collective call as its caller made it: which collective, the caller's buffers, the
/// elements per segment, the data type and (rooted collectives) the root.
pub struct UserCall {
    /// The collective.
    pub collective: Collective,
    /// The C function's name, for messages.
    pub name: &'static str,
    /// `sendbuff`.
    pub send: u64,
    /// `recvbuff`.
    pub recv: u64,
    /// Elements per segment (the call's `count`, `sendcount` or `recvcount`).
    pub count: usize,
    /// `datatype`.
    pub datatype: symmDataTypeRaw,
    /// `root`, for a reduce, broadcast, gather or scatter.
    pub root: Option<c_int>,
}

/// Where a call runs.
pub enum Route {
    /// In the caller's windows.
    Windows(Request),
    /// Through the staging window: one request per chunk, in order, each with its copies.
    Staged(Vec<Request>),
}

/// Route `call` of `comm`: in its windows when every buffer this rank uses lies wholly in one
/// registered window (or when the call's arguments are wrong in a way its validation names,
/// such as a buffer that overruns a window or an allocation of the communicator), else through
/// the staging window (none: the validation's refusal, which says why). `validate`
/// is the collective's validation, given the send buffer, the receive buffer and the count.
pub fn route(
    comm: &Comm,
    call: &UserCall,
    validate: impl Fn(u64, u64, usize) -> Result<Request>,
) -> Result<Route> {
    let in_windows = || validate(call.send, call.recv, call.count).map(Route::Windows);
    let staging = comm.lock().staging.clone();
    let Some(staging) = staging else {
        return in_windows().map_err(strict_hint);
    };
    let Some(staged) = staged_form(comm, call) else {
        return in_windows();
    };
    let (shape, element, outside) = staged?;
    let plan = plan_chunks(
        shape,
        call.count as u64,
        element,
        (staging.window.base, staging.window.size),
        (call.send, call.recv),
    )?;
    let requests = plan
        .chunks
        .iter()
        .map(|chunk| {
            validate(plan.send, plan.recv, chunk.count as usize)
                .map(|request| request.staged(chunk.copies.clone()))
        })
        .collect::<Result<Vec<_>>>()?;
    if !staging.announced.swap(true, Ordering::Relaxed) {
        crate::log!(
            Level::Info,
            Subsys::Coll,
            Some(comm.rank),
            "{} of {} elements staged through the communicator's staging window ({} bytes): {} \
             is in no registered window; {} chunk(s) of up to {} elements, {} bytes copied; \
             later staged calls are not logged; SYMM_STRICT_WINDOWS=1 refuses such calls",
            call.name,
            call.count,
            staging.window.size,
            outside,
            plan.chunks.len(),
            plan.capacity,
            plan.chunks.iter().map(|c| c.copies.bytes()).sum::<u64>()
        );
    }
    Ok(Route::Staged(requests))
}

/// A refusal of a buffer outside every window on a communicator without a staging window,
/// with the reason it has none.
fn strict_hint(e: Error) -> Error {
    if e.message.contains("registered with symmCommWindowRegister") {
        Error::new(
            e.code,
            format!(
                "{} (this communicator stages no call: it was made with SYMM_STRICT_WINDOWS=1 \
                 or SYMM_STAGING_BYTES=0)",
                e.message
            ),
        )
    } else {
        e
    }
}

/// The shape, element size and offending buffer's description of `call` when it is to be
/// staged; `None` when it runs in the windows (its buffers are there, or its arguments are
/// wrong in a way the collective's validation names); an error for buffers that overlap
/// other than in place.
fn staged_form(comm: &Comm, call: &UserCall) -> Option<Result<(Shape, u64, String)>> {
    let nranks = comm.clique.nranks as u64;
    let element = data_type(call.datatype).ok()?.size_bytes() as u64;
    let root = match call.root {
        None => 0,
        Some(root) => usize::try_from(root)
            .ok()
            .filter(|r| (*r as u64) < nranks)?,
    };
    let shape = Shape::of(call.collective, nranks, comm.rank, root)?;
    let segment = (call.count as u64).checked_mul(element)?;
    let send_bytes = segment.checked_mul(shape.send_segments)?;
    let recv_bytes = segment.checked_mul(shape.recv_segments)?;
    let used = [
        ("sendbuff", call.send, send_bytes, shape.uses_send),
        ("recvbuff", call.recv, recv_bytes, shape.uses_recv),
    ];
    let mut outside = Vec::new();
    for (name, address, bytes, uses) in used {
        if !uses {
            continue;
        }
        if address == 0 || address.checked_add(bytes).is_none() {
            return None;
        }
        if windows::overruns_own_memory(comm, address, bytes) {
            return None;
        }
        if windows::find(comm, address, bytes.max(1)).is_none() {
            outside.push(format!("{name} [{address:#x}, +{bytes} bytes)"));
        }
    }
    if outside.is_empty() {
        return None;
    }
    if shape.uses_send && shape.uses_recv {
        let in_place_at = match call.collective {
            Collective::AllGather => call.recv.checked_add(comm.rank as u64 * segment),
            Collective::ReduceScatter => call.send.checked_add(comm.rank as u64 * segment),
            Collective::Gather => call.recv.checked_add(root as u64 * segment),
            Collective::Scatter => call.send.checked_add(root as u64 * segment),
            Collective::AllToAll => None,
            _ => Some(call.recv),
        };
        let in_place = match call.collective {
            Collective::ReduceScatter | Collective::Scatter => in_place_at == Some(call.recv),
            _ => in_place_at == Some(call.send),
        };
        let overlaps = crate::window::ranges_overlap(
            &(call.send..call.send + send_bytes),
            &(call.recv..call.recv + recv_bytes),
        );
        if overlaps && !in_place {
            return Some(Err(Error::invalid_argument(format!(
                "sendbuff and recvbuff of {} overlap without being in place (the form in place \
                 is the one of a call in windows)",
                call.name
            ))));
        }
    }
    Some(Ok((shape, element, outside.join(" and "))))
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: u64 = 0x10_0000;

    fn shape(collective: Collective, nranks: u64, rank: usize, root: usize) -> Shape {
        Shape::of(collective, nranks, rank, root).unwrap()
    }

    /// Simulate the chunks on byte arrays: every send segment's elements reach the staging
    /// send region where the chunk's kernel reads them, and the receive region's reach every
    /// receive segment, each element once.
    fn check_covers(shape: Shape, count: u64, element: u64, bytes: u64) {
        let (send, recv) = (0x1000_0000u64, 0x2000_0000u64);
        let plan = plan_chunks(shape, count, element, (BASE, bytes), (send, recv)).unwrap();
        let mut sent = vec![0u32; (count * shape.send_segments * element) as usize];
        let mut received = vec![0u32; (count * shape.recv_segments * element) as usize];
        let mut next = 0;
        for chunk in &plan.chunks {
            assert_eq!(chunk.first, next);
            assert!(chunk.count <= plan.capacity);
            next += chunk.count;
            for c in &chunk.copies.before {
                assert!(c.dst >= plan.send && c.dst + c.bytes <= plan.recv);
                for b in c.src - send..c.src - send + c.bytes {
                    sent[b as usize] += 1;
                }
            }
            for c in &chunk.copies.after {
                assert!(c.src >= plan.recv && c.src + c.bytes <= BASE + bytes);
                for b in c.dst - recv..c.dst - recv + c.bytes {
                    received[b as usize] += 1;
                }
            }
        }
        assert_eq!(next, count);
        let expect = |uses: bool| u32::from(uses);
        assert!(sent.iter().all(|n| *n == expect(shape.uses_send)));
        assert!(received.iter().all(|n| *n == expect(shape.uses_recv)));
    }

    #[test]
    fn chunks_cover_every_element_once() {
        for collective in [
            Collective::AllReduce,
            Collective::Reduce,
            Collective::Broadcast,
            Collective::AllGather,
            Collective::ReduceScatter,
            Collective::AllToAll,
            Collective::Gather,
            Collective::Scatter,
        ] {
            for nranks in [1, 2, 3, 8] {
                for (rank, root) in [(0, 0), (nranks as usize - 1, 0)] {
                    let shape = shape(collective, nranks, rank, root);
                    for count in [1, 7, 255, 256, 1000, 4099] {
                        for element in [1, 2, 8] {
                            check_covers(shape, count, element, 4096);
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn a_call_that_fits_is_one_chunk_of_contiguous_copies() {
        let s = shape(Collective::AllGather, 4, 1, 0);
        let plan = plan_chunks(s, 100, 4, (BASE, 1 << 20), (0x5000, 0x9000)).unwrap();
        assert_eq!(plan.chunks.len(), 1);
        let copies = &plan.chunks[0].copies;
        assert_eq!(
            copies.before,
            [Copy {
                dst: BASE,
                src: 0x5000,
                bytes: 400
            }]
        );
        assert_eq!(
            copies.after,
            [Copy {
                dst: 0x9000,
                src: plan.recv,
                bytes: 1600
            }]
        );
        assert_eq!(plan.recv % REGION_ALIGN, 0);
    }

    #[test]
    fn a_call_of_count_zero_is_one_empty_chunk() {
        let s = shape(Collective::AllReduce, 2, 0, 0);
        let plan = plan_chunks(s, 0, 4, (BASE, 4096), (0x5000, 0x9000)).unwrap();
        assert_eq!(plan.chunks.len(), 1);
        assert_eq!(plan.chunks[0].count, 0);
        assert_eq!(plan.chunks[0].copies, Copies::default());
    }

    #[test]
    fn non_roots_copy_only_what_they_use() {
        let s = shape(Collective::Broadcast, 4, 2, 0);
        let plan = plan_chunks(s, 10, 4, (BASE, 4096), (0x5000, 0x9000)).unwrap();
        assert!(plan.chunks[0].copies.before.is_empty());
        let s = shape(Collective::Reduce, 4, 2, 0);
        let plan = plan_chunks(s, 10, 4, (BASE, 4096), (0x5000, 0x9000)).unwrap();
        assert!(plan.chunks[0].copies.after.is_empty());
    }

    #[test]
    fn a_window_too_small_for_one_element_is_refused() {
        let s = shape(Collective::AllToAll, 256, 0, 0);
        let e = plan_chunks(s, 10, 8, (BASE, 4096), (0x5000, 0x9000)).unwrap_err();
        assert!(e.message.contains("SYMM_STAGING_BYTES"), "{}", e.message);
    }
}
