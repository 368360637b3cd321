//! The chunks of a staged call (see `collective::route`): a collective whose buffers lie
//! outside every registered window runs through the communicator's staging window, its data
//! copied in before each chunk's launch and out after it. Pure: the same chunks on every rank
//! for the same call and window size.

use crate::error::{Error, Result};
use crate::plan::Collective;

/// Alignment of regions in the staging window (a staged call's receive region, a staged
/// send's or receive's region: `plan::peer_staging`).
pub(crate) const REGION_ALIGN: u64 = 256;

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
    /// Which chunk of which call: the call's elements per segment and the chunk's first
    /// element (every rank's chunk must name the same: see `agree::Signature::staged`).
    pub of_call: ChunkOf,
}

/// A chunk's place in its staged call.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ChunkOf {
    /// The call's elements per segment.
    pub count: u64,
    /// The chunk's first element in each segment.
    pub first: u64,
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
    /// The send segment is staged into the receive region and the chunk runs in place: a
    /// broadcast, whose root's send buffer is the one segment every rank receives. The
    /// staging window then has no send region (the same on every rank, so that the chunks
    /// are), the root copies its data in once and, when its own call is in place, not out
    /// (its receive buffer already holds the data).
    pub send_in_recv: bool,
}

impl Shape {
    /// The shape of `collective` on `rank` of `nranks` with `root`; `None` for a collective
    /// that is not staged (all-to-all-v: its counts are known only on the device).
    pub fn of(collective: Collective, nranks: u64, rank: usize, root: usize) -> Option<Shape> {
        let is_root = rank == root;
        let send_in_recv = collective == Collective::Broadcast;
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
            send_in_recv,
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
    /// The send region's address in the staging window (the receive region's, for a call that
    /// stages its send segment there: [`Shape::send_in_recv`]).
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
/// `staging = (base, bytes)`: the send region first, the receive region after it (aligned;
/// no send region for a [`Shape::send_in_recv`] call).
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
    let staged_send_segments = if shape.send_in_recv {
        0
    } else {
        shape.send_segments
    };
    let per_element = (staged_send_segments + shape.recv_segments) * element;
    // A send region is followed by the receive region's alignment.
    let usable = if staged_send_segments == 0 {
        bytes
    } else {
        bytes.saturating_sub(REGION_ALIGN)
    };
    let capacity = usable / per_element;
    if capacity == 0 {
        return Err(Error::invalid_argument(format!(
            "the staging window ({bytes} bytes, SYMM_STAGING_BYTES) holds no element of this \
             call ({per_element} bytes per element with every segment)"
        )));
    }
    let send_region = staged_send_segments * capacity * element;
    let recv_at = base + send_region.div_ceil(REGION_ALIGN) * REGION_ALIGN;
    let send_at = if shape.send_in_recv { recv_at } else { base };
    // In place on the root of a `send_in_recv` call: its receive buffer already holds what the
    // chunk leaves in the receive region.
    let copies_out = shape.uses_recv && !(shape.send_in_recv && shape.uses_send && send == recv);
    let mut chunks = Vec::new();
    let mut first = 0;
    loop {
        let n = capacity.min(count - first);
        let chunk_bytes = n * element;
        // Segment `j` of a chunk sits at `j × n` in the staging region and at `j × count +
        // first` in the user's buffer; a chunk of the whole call is one contiguous copy.
        let segments = |segments: u64, used: bool| -> Vec<(u64, u64, u64)> {
            if n == 0 || !used {
                Vec::new()
            } else if n == count {
                vec![(0, 0, segments * chunk_bytes)]
            } else {
                (0..segments)
                    .map(|j| (j * chunk_bytes, (j * count + first) * element, chunk_bytes))
                    .collect()
            }
        };
        let copies = Copies {
            before: segments(shape.send_segments, shape.uses_send)
                .into_iter()
                .map(|(staged, at, bytes)| Copy {
                    dst: send_at + staged,
                    src: send + at,
                    bytes,
                })
                .collect(),
            after: segments(shape.recv_segments, copies_out)
                .into_iter()
                .map(|(staged, at, bytes)| Copy {
                    dst: recv + at,
                    src: recv_at + staged,
                    bytes,
                })
                .collect(),
            of_call: ChunkOf { count, first },
        };
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
        send: send_at,
        recv: recv_at,
        capacity,
        chunks,
    })
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
                if shape.send_in_recv {
                    assert!(c.dst >= plan.recv && c.dst + c.bytes <= BASE + bytes);
                } else {
                    assert!(c.dst >= plan.send && c.dst + c.bytes <= plan.recv);
                }
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
        assert_eq!(
            plan.chunks[0].copies,
            Copies {
                of_call: ChunkOf { count: 0, first: 0 },
                ..Copies::default()
            }
        );
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
    fn a_broadcast_stages_its_root_s_data_in_the_receive_region() {
        // Every rank: no send region, so a chunk takes the whole window.
        for rank in [0, 2] {
            let s = shape(Collective::Broadcast, 4, rank, 0);
            let plan = plan_chunks(s, 2048, 4, (BASE, 4096), (0x5000, 0x5000)).unwrap();
            assert_eq!((plan.send, plan.recv, plan.capacity), (BASE, BASE, 1024));
            assert_eq!(plan.chunks.len(), 2);
        }
        // The root in place: its data goes in once and never comes back out.
        let s = shape(Collective::Broadcast, 4, 0, 0);
        let plan = plan_chunks(s, 1000, 4, (BASE, 4096), (0x5000, 0x5000)).unwrap();
        let copies = &plan.chunks[0].copies;
        assert_eq!(
            copies.before,
            [Copy {
                dst: BASE,
                src: 0x5000,
                bytes: 4000
            }]
        );
        assert!(copies.after.is_empty());
        // Out of place, the receive buffer is written from the receive region.
        let plan = plan_chunks(s, 1000, 4, (BASE, 4096), (0x5000, 0x9000)).unwrap();
        assert_eq!(
            plan.chunks[0].copies.after,
            [Copy {
                dst: 0x9000,
                src: BASE,
                bytes: 4000
            }]
        );
    }

    #[test]
    fn a_window_too_small_for_one_element_is_refused() {
        let s = shape(Collective::AllToAll, 256, 0, 0);
        let e = plan_chunks(s, 10, 8, (BASE, 4096), (0x5000, 0x9000)).unwrap_err();
        assert!(e.message.contains("SYMM_STAGING_BYTES"), "{}", e.message);
    }
}
