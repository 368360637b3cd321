//! The launch schedule: what a launch does to CUDA streams, as pure data.
//!
//! [`schedule`] turns one launch (the parts it serves, the callers' streams and their kinds,
//! the internal stream and events, what is known about co-residency) into a list of
//! [`StreamOp`]s. Executors carry it out: the cuda backend by driver calls, the model backend
//! ([`crate::backend::model`]) by checking it against CUDA's ordering rules. Nothing here touches a
//! device, so every decision is testable without a GPU.

use crate::error::{Error, Result};
use crate::plan::KernelId;
use symm_device::symmetric::TaskArgs;

/// The legacy default stream (`NULL`, or `CU_STREAM_LEGACY`).
pub(crate) const LEGACY_STREAM: u64 = 0;
/// `CU_STREAM_LEGACY` as a handle.
pub(crate) const CU_STREAM_LEGACY: u64 = 1;
/// `CU_STREAM_PER_THREAD` as a handle.
pub(crate) const PER_THREAD_STREAM: u64 = 2;

/// How a stream orders itself with its device's legacy default stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StreamKind {
    /// The legacy default stream (handle 0 or `CU_STREAM_LEGACY`).
    Legacy,
    /// The per-thread default stream (`CU_STREAM_PER_THREAD`): synchronizes with the legacy
    /// stream.
    PerThread,
    /// A stream created without `CU_STREAM_NON_BLOCKING`: synchronizes with the legacy stream.
    Blocking,
    /// A stream created with `CU_STREAM_NON_BLOCKING`.
    NonBlocking,
}

impl StreamKind {
    /// The kind of the special handles (0, 1, 2), or `None` for a created stream.
    pub fn of_special_handle(handle: u64) -> Option<StreamKind> {
        match handle {
            LEGACY_STREAM | CU_STREAM_LEGACY => Some(StreamKind::Legacy),
            PER_THREAD_STREAM => Some(StreamKind::PerThread),
            _ => None,
        }
    }

    /// `true` unless the stream is non-blocking.
    pub fn is_blocking(self) -> bool {
        self != StreamKind::NonBlocking
    }
}

pub use super::InstanceId;

/// One rank served by a launch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Part {
    /// The rank.
    pub rank: usize,
    /// The collectives it takes part in (one per task of the launch: several when the launch
    /// fuses a group's collectives).
    pub instances: Vec<InstanceId>,
    /// The caller's stream.
    pub user_stream: u64,
    /// Its kind. Read only for a separate launch (see [`schedule`]); executors may leave it
    /// unasked otherwise.
    pub user_kind: StreamKind,
    /// This rank's "before" event (recorded on its stream when the launch waits for it).
    pub before_event: u64,
}

/// Everything [`schedule`] needs about one launch.
#[derive(Clone, Debug)]
pub struct LaunchInput {
    /// Device of every part.
    pub device: i32,
    /// The kernel.
    pub kernel: KernelId,
    /// Blocks per rank.
    pub grid: u32,
    /// Threads per block.
    pub block: u32,
    /// Device address of the work table.
    pub table: u64,
    /// The work table's entries (`task_count` per part, rank-major).
    pub tasks: Vec<TaskArgs>,
    /// Tasks per part.
    pub task_count: u32,
    /// The ranks served, in table order.
    pub parts: Vec<Part>,
    /// The first part's internal stream (non-blocking, the library's).
    pub internal_stream: u64,
    /// The first part's "after" event.
    pub after_event: u64,
    /// Ranks of the clique.
    pub clique_ranks: u32,
    /// Ranks of the clique on this device.
    pub ranks_on_device: u32,
    /// Blocks of this kernel that can be resident on the device at once (occupancy ×
    /// multiprocessors), when known.
    pub resident_blocks: Option<u32>,
}

/// A kernel launch in a schedule.
#[derive(Clone, Debug, PartialEq)]
pub struct KernelLaunch {
    /// Stream it is enqueued on.
    pub stream: u64,
    /// Device.
    pub device: i32,
    /// Kernel.
    pub kernel: KernelId,
    /// Blocks in all (blocks per rank × ranks served).
    pub grid: u32,
    /// Threads per block.
    pub block: u32,
    /// Launched cooperatively (all blocks resident at once, or refused).
    pub cooperative: bool,
    /// The ranks served.
    pub ranks: Vec<usize>,
    /// The collectives each served rank takes part in (`task_count` per rank, in the order of
    /// `ranks`).
    pub instances: Vec<InstanceId>,
    /// Ranks of the clique (parts of each instance).
    pub clique_ranks: u32,
    /// `true` when the occupancy check proved that every rank of the clique on this device can
    /// be resident at once, so that separate launches on the device may wait on each other.
    pub co_residency_proven: bool,
    /// Device address of the work table.
    pub table: u64,
    /// The work table's entries (`task_count` per rank, rank-major).
    pub tasks: Vec<TaskArgs>,
    /// Tasks per rank.
    pub task_count: u32,
}

/// One stream operation.
#[derive(Clone, Debug, PartialEq)]
pub enum StreamOp {
    /// `cuEventRecord(event, stream)`.
    RecordEvent {
        /// Event.
        event: u64,
        /// Stream.
        stream: u64,
        /// The stream's device.
        device: i32,
    },
    /// `cuStreamWaitEvent(stream, event)`.
    WaitEvent {
        /// Stream.
        stream: u64,
        /// Event.
        event: u64,
        /// The stream's device.
        device: i32,
    },
    /// A kernel launch.
    Launch(KernelLaunch),
}

/// The stream operations of one launch, in enqueue order.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LaunchSchedule {
    /// Operations.
    pub ops: Vec<StreamOp>,
}

/// Plan the stream operations of `input`.
///
/// * A launch serving every rank of the clique on its device (one rank alone on its device,
///   or a group's merged parts) needs nothing from the callers' streams: its parts wait only
///   for parts on other devices, which run on their own.
/// * A launch serving only some of the device's ranks (one thread per rank, or groups that
///   split a device's ranks) is a *separate launch*: its kernels wait for kernels of other
///   launches on the same device. That needs (1) non-blocking callers' streams — the legacy
///   default stream and blocking streams are serialized with each other, so one rank's kernel
///   could wait for a kernel queued behind it — and (2) proof from the occupancy API that every
///   rank of the device can be resident at once. Either missing is `symmInvalidUsage`.
/// * One part, or parts that all come on one stream: the kernel goes directly on the caller's
///   stream (no events). Otherwise on the first part's internal stream, ordered after every
///   caller's stream and before its next work by events.
/// * A launch serving several ranks is cooperative: all its blocks must be resident at once.
///   When the occupancy shows they cannot be (more ranks on the device than it holds blocks
///   of the kernel), it is `symmInvalidUsage` here, before the calls are numbered, rather than
///   the driver's `CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE` after (which fails the
///   communicator on every rank).
pub fn schedule(input: &LaunchInput) -> Result<LaunchSchedule> {
    let first = input
        .parts
        .first()
        .ok_or_else(|| Error::internal("launch without a rank"))?;
    let device = input.device;
    let served = input.parts.len() as u32;
    let separate = served < input.ranks_on_device;
    let mut co_residency_proven = false;
    if separate {
        if let Some(part) = input.parts.iter().find(|p| p.user_kind.is_blocking()) {
            let stream = match part.user_kind {
                StreamKind::Legacy => "the NULL (legacy default) stream".to_string(),
                StreamKind::PerThread => "the per-thread default stream".to_string(),
                _ => format!("stream {:#x}, a blocking stream", part.user_stream),
            };
            return Err(Error::invalid_usage(format!(
                "rank {} shares device {device} with {} other rank(s) of its communicator and \
                 launches its collective separately from them (its own thread, or a group that \
                 does not hold every rank of the device), on {stream}. The ranks' kernels wait \
                 for each other, and blocking streams are serialized with the legacy stream, so \
                 one could wait behind another forever. Give each rank its own non-blocking \
                 stream (cuStreamCreate(&s, CU_STREAM_NON_BLOCKING)), or drive all ranks of the \
                 device from one thread between symmGroupStart and symmGroupEnd",
                part.rank,
                input.ranks_on_device - 1,
            )));
        }
        let needed = input.ranks_on_device as u64 * input.grid as u64;
        match input.resident_blocks {
            Some(resident) if resident as u64 >= needed => co_residency_proven = true,
            resident => {
                return Err(Error::invalid_usage(format!(
                    "rank {} shares device {device} with {} other rank(s) and launches \
                     separately: their kernels wait for each other, so all {needed} blocks \
                     ({} ranks x {} blocks of {}) must be resident at once, but {}. Drive the \
                     ranks of the device from one thread between symmGroupStart and \
                     symmGroupEnd (one cooperative launch)",
                    first.rank,
                    input.ranks_on_device - 1,
                    input.ranks_on_device,
                    input.grid,
                    input.kernel.ptx_name(),
                    match resident {
                        Some(r) => format!("the device holds only {r}"),
                        None => "the occupancy is unknown".to_string(),
                    }
                )));
            }
        }
    }
    if served > 1
        && let Some(resident) = input.resident_blocks
    {
        let needed = served as u64 * input.grid as u64;
        if needed > resident as u64 {
            return Err(Error::invalid_usage(format!(
                "ranks {} of device {device} launch together (one cooperative launch), so all \
                 {needed} blocks ({served} ranks x {} blocks of {}) must be resident at once, \
                 but the device holds only {resident}. Put fewer ranks of the communicator on \
                 one GPU",
                rank_list(&input.parts),
                input.grid,
                input.kernel.ptx_name(),
            )));
        }
    }
    let direct = input
        .parts
        .iter()
        .all(|p| p.user_stream == first.user_stream);
    let stream = if direct {
        first.user_stream
    } else {
        input.internal_stream
    };
    let mut ops = Vec::new();
    if !direct {
        for part in &input.parts {
            ops.push(StreamOp::RecordEvent {
                event: part.before_event,
                stream: part.user_stream,
                device,
            });
            ops.push(StreamOp::WaitEvent {
                stream,
                event: part.before_event,
                device,
            });
        }
    }
    ops.push(StreamOp::Launch(KernelLaunch {
        stream,
        device,
        kernel: input.kernel,
        grid: input.grid * served,
        block: input.block,
        cooperative: served > 1,
        ranks: input.parts.iter().map(|p| p.rank).collect(),
        instances: input
            .parts
            .iter()
            .flat_map(|p| p.instances.iter().copied())
            .collect(),
        clique_ranks: input.clique_ranks,
        co_residency_proven,
        table: input.table,
        tasks: input.tasks.clone(),
        task_count: input.task_count,
    }));
    if !direct {
        ops.push(StreamOp::RecordEvent {
            event: input.after_event,
            stream,
            device,
        });
        for part in &input.parts {
            if crate::mutation::active(crate::mutation::Mutation::SkipCompletionWait) {
                continue;
            }
            ops.push(StreamOp::WaitEvent {
                stream: part.user_stream,
                event: input.after_event,
                device,
            });
        }
    }
    Ok(LaunchSchedule { ops })
}

/// `0, 1, 2` (at most eight ranks, then `…`): the ranks `parts` serve, for messages.
fn rank_list(parts: &[Part]) -> String {
    let mut ranks: Vec<String> = parts.iter().take(8).map(|p| p.rank.to_string()).collect();
    if parts.len() > 8 {
        ranks.push("…".to_string());
    }
    ranks.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use symm_device::symmetric::Algorithm;
    use symm_device::{DataType, RedOp};

    fn input(
        streams: &[(u64, StreamKind)],
        ranks_on_device: u32,
        resident: Option<u32>,
    ) -> LaunchInput {
        LaunchInput {
            device: 0,
            kernel: KernelId {
                algorithm: Algorithm::OneShotAllReduce,
                dtype: DataType::Float32,
                op: RedOp::Sum,
            },
            grid: 8,
            block: 512,
            table: 0x100,
            tasks: vec![
                TaskArgs {
                    count: 1000,
                    ..bytemuck::Zeroable::zeroed()
                };
                streams.len()
            ],
            task_count: 1,
            parts: streams
                .iter()
                .enumerate()
                .map(|(rank, (user_stream, user_kind))| Part {
                    rank,
                    instances: vec![InstanceId { clique: 1, seq: 0 }],
                    user_stream: *user_stream,
                    user_kind: *user_kind,
                    before_event: 0x900 + rank as u64,
                })
                .collect(),
            internal_stream: 0x500,
            after_event: 0x600,
            clique_ranks: 4,
            ranks_on_device,
            resident_blocks: resident,
        }
    }

    #[test]
    fn one_rank_alone_on_its_device_launches_on_the_callers_stream_even_the_null_one() {
        for kind in [
            StreamKind::Legacy,
            StreamKind::Blocking,
            StreamKind::NonBlocking,
        ] {
            let s = schedule(&input(&[(0x42, kind)], 1, None)).unwrap();
            assert_eq!(s.ops.len(), 1);
            let StreamOp::Launch(l) = &s.ops[0] else {
                panic!("{s:?}")
            };
            assert_eq!((l.stream, l.grid, l.cooperative), (0x42, 8, false));
        }
    }

    #[test]
    fn merged_parts_on_distinct_streams_go_through_the_internal_stream() {
        let nb = StreamKind::NonBlocking;
        let s = schedule(&input(&[(0x42, nb), (0x43, StreamKind::Legacy)], 2, None)).unwrap();
        // record+wait per part, launch, record, wait per part.
        assert_eq!(s.ops.len(), 2 * 2 + 1 + 1 + 2);
        let StreamOp::Launch(l) = &s.ops[4] else {
            panic!("{s:?}")
        };
        assert_eq!((l.stream, l.grid, l.cooperative), (0x500, 16, true));
        // All parts on one stream: directly there.
        let s = schedule(&input(&[(0x42, nb), (0x42, nb)], 2, None)).unwrap();
        assert_eq!(s.ops.len(), 1);
    }

    #[test]
    fn separate_launches_on_a_shared_device_need_non_blocking_streams_and_proof() {
        for kind in [
            StreamKind::Legacy,
            StreamKind::PerThread,
            StreamKind::Blocking,
        ] {
            let e = schedule(&input(&[(0x42, kind)], 2, Some(1000))).unwrap_err();
            assert!(e.message.contains("non-blocking"), "{}", e.message);
        }
        let nb = StreamKind::NonBlocking;
        let e = schedule(&input(&[(0x42, nb)], 2, Some(15))).unwrap_err();
        assert!(e.message.contains("resident"), "{}", e.message);
        let e = schedule(&input(&[(0x42, nb)], 2, None)).unwrap_err();
        assert!(e.message.contains("occupancy"), "{}", e.message);
        let s = schedule(&input(&[(0x42, nb)], 2, Some(16))).unwrap();
        let StreamOp::Launch(l) = &s.ops[0] else {
            panic!("{s:?}")
        };
        assert!(l.co_residency_proven && l.stream == 0x42);
    }

    #[test]
    fn a_cooperative_launch_larger_than_the_device_holds_is_refused_before_it_is_enqueued() {
        let nb = StreamKind::NonBlocking;
        let three = [(0x42, nb), (0x43, nb), (0x44, nb)];
        // Three ranks x 8 blocks = 24.
        let e = schedule(&input(&three, 3, Some(23))).unwrap_err();
        assert_eq!(
            e.code,
            crate::abi::symmResult_t::symmInvalidUsage,
            "{}",
            e.message
        );
        assert!(
            e.message.contains("ranks 0, 1, 2 of device 0")
                && e.message.contains("24 blocks")
                && e.message.contains("holds only 23"),
            "{}",
            e.message
        );
        let s = schedule(&input(&three, 3, Some(24))).unwrap();
        assert!(
            s.ops
                .iter()
                .any(|op| matches!(op, StreamOp::Launch(l) if l.cooperative && l.grid == 24)),
            "{s:?}"
        );
        // Occupancy unknown (not asked): left to the driver.
        assert!(schedule(&input(&three, 3, None)).is_ok());
        // One rank alone is not cooperative: nothing to refuse.
        assert!(schedule(&input(&[(0x42, nb)], 1, Some(1))).is_ok());
    }
}
