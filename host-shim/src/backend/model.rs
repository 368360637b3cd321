//! A model of CUDA's ordering rules, to check launch schedules without a GPU.
//!
//! The model backend keeps memory in host memory (as the host backend) but does not run
//! kernels: it takes each launch's [`LaunchSchedule`] and plays it against a model of the
//! rules a GPU follows and the host backend hides:
//!
//! * per device a legacy default stream (handle 0; `CU_STREAM_PER_THREAD`, handle 2, is a
//!   blocking stream of its own), blocking and non-blocking streams (made with
//!   [`create_stream`]); each stream runs its operations in order;
//! * the legacy stream waits for the earlier work of every blocking stream of its device, and
//!   a blocking stream waits for the earlier work of the legacy stream; non-blocking streams
//!   are exempt;
//! * a wait on an event binds to the event's latest record at the time of the wait; a wait on
//!   an event never recorded waits for nothing;
//! * kernels of one collective instance (the same call of every rank of a clique) spin on each
//!   other: they complete only when all parts, on every device, run at once. Separate launches
//!   on one device may run at once only if their co-residency was proven (occupancy check);
//!   otherwise the model reports an error: the GPU does not guarantee it. A cooperative launch
//!   larger than the device is refused;
//! * stream capture: operations on a capturing stream (and on streams that joined the capture
//!   by waiting on an event recorded in it) go into a graph; [`launch_graph`] replays them.
//!
//! [`run`] runs to quiescence and reports a deadlock with the head of every stuck stream.
//! Tests select the model with [`activate`] (process-wide: communicators created afterwards
//! use it) and serialize themselves with [`lock`].

use super::host::HostBackend;
use crate::error::{Error, Result};
use crate::launch::schedule::{InstanceId, KernelLaunch, LaunchSchedule, StreamKind, StreamOp};
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard};

/// Multiprocessors of every model device.
pub(crate) const MULTIPROCESSORS: u32 = 132;
/// Resident blocks per multiprocessor of every kernel in the model (occupancy).
pub(crate) const BLOCKS_PER_MULTIPROCESSOR: u32 = 2;

static ACTIVE: AtomicBool = AtomicBool::new(false);
static STATE: Mutex<Option<State>> = Mutex::new(None);
static TEST_LOCK: Mutex<()> = Mutex::new(());

/// Make every communicator created from now on in this process use the model backend.
pub fn activate() {
    ACTIVE.store(true, Ordering::SeqCst);
}

/// `true` after [`activate`].
pub fn active() -> bool {
    ACTIVE.load(Ordering::SeqCst)
}

/// Serialize tests that use the model (its state is process-wide); resets the state.
pub fn lock() -> MutexGuard<'static, ()> {
    let guard = TEST_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    *state() = Some(State::default());
    guard
}

fn state() -> MutexGuard<'static, Option<State>> {
    STATE.lock().unwrap_or_else(|e| e.into_inner())
}

fn with<T>(f: impl FnOnce(&mut State) -> T) -> T {
    let mut guard = state();
    f(guard.get_or_insert_with(State::default))
}

/// Create a model stream on `device` (as `cuStreamCreate`, with or without
/// `CU_STREAM_NON_BLOCKING`); returns its handle.
pub fn create_stream(device: i32, non_blocking: bool) -> u64 {
    let kind = if non_blocking {
        StreamKind::NonBlocking
    } else {
        StreamKind::Blocking
    };
    with(|s| s.new_stream(device, kind, "user"))
}

/// Create a model event (as `cuEventCreate`); returns its handle.
pub fn create_event() -> u64 {
    with(|s| s.new_handle())
}

/// The kind of a stream handle used on `device`.
pub fn stream_kind(device: i32, handle: u64) -> Result<StreamKind> {
    if let Some(kind) = StreamKind::of_special_handle(handle) {
        return Ok(kind);
    }
    with(|s| {
        s.streams
            .get(&StreamKey::Created(handle))
            .filter(|st| st.device == device)
            .map(|st| st.kind)
            .ok_or_else(|| {
                Error::invalid_argument(format!(
                    "stream {handle:#x} is not a stream of device {device} (model)"
                ))
            })
    })
}

/// Create an internal (library) stream and `events` events on `device`.
pub fn create_internal(device: i32, events: usize) -> (u64, Vec<u64>) {
    with(|s| {
        let stream = s.new_stream(device, StreamKind::NonBlocking, "internal");
        let events = (0..events).map(|_| s.new_handle()).collect();
        (stream, events)
    })
}

/// Enqueue a launch's schedule.
pub fn enqueue(schedule: &LaunchSchedule) -> Result<()> {
    with(|s| {
        for op in &schedule.ops {
            s.enqueue(op.clone(), 0)?;
        }
        s.progress();
        Ok(())
    })
}

/// Begin capturing `stream` (as `cuStreamBeginCapture`).
pub fn begin_capture(device: i32, stream: u64) -> Result<()> {
    with(|s| {
        let key = StreamKey::of(stream, device);
        s.stream_mut(key)?;
        let graph = s.graphs.len();
        s.graphs.push(Graph {
            origin: key,
            ops: Vec::new(),
            joined: vec![key],
        });
        s.stream_mut(key)?.capture = Some(graph);
        Ok(())
    })
}

/// End the capture of `stream`; returns the graph.
pub fn end_capture(device: i32, stream: u64) -> Result<usize> {
    with(|s| {
        let key = StreamKey::of(stream, device);
        let graph = s.stream_mut(key)?.capture.ok_or_else(|| {
            Error::invalid_usage(format!("stream {stream:#x} is not capturing (model)"))
        })?;
        if s.graphs[graph].origin != key {
            return Err(Error::invalid_usage(
                "capture ended on a stream that joined it, not its origin (model)",
            ));
        }
        let joined = s.graphs[graph].joined.clone();
        for k in &joined {
            s.stream_mut(*k)?.capture = None;
        }
        // Every stream that joined must have been joined back into the origin: its last
        // captured operation records an event that a joined-back stream (the origin, or one
        // joined back itself) waits on later.
        let ops = &s.graphs[graph].ops;
        let mut rejoined = vec![key];
        loop {
            let before = rejoined.len();
            for k in &joined {
                if rejoined.contains(k) {
                    continue;
                }
                let last = ops.iter().rposition(|(sk, _)| sk == k);
                let back = last.is_some_and(|i| match &ops[i].1 {
                    StreamOp::RecordEvent { event, .. } => ops[i + 1..].iter().any(|(sk, op)| {
                        rejoined.contains(sk)
                            && matches!(op, StreamOp::WaitEvent { event: e, .. } if e == event)
                    }),
                    _ => false,
                });
                if back {
                    rejoined.push(*k);
                }
            }
            if rejoined.len() == before {
                break;
            }
        }
        if let Some(k) = joined.iter().find(|k| !rejoined.contains(k)) {
            return Err(Error::invalid_usage(format!(
                "capture: {} joined the capture and was not joined back \
                 (CUDA_ERROR_STREAM_CAPTURE_UNJOINED)",
                s.describe_stream(*k)
            )));
        }
        Ok(graph)
    })
}

/// Launch a captured graph on `stream` (as `cuGraphLaunch`).
pub fn launch_graph(graph: usize, device: i32, stream: u64) -> Result<()> {
    with(|s| {
        let g = s
            .graphs
            .get(graph)
            .cloned()
            .ok_or_else(|| Error::invalid_argument("no such graph (model)"))?;
        s.generation += 1;
        let generation = s.generation;
        let target = StreamKey::of(stream, device);
        let mut streams: HashMap<StreamKey, u64> = HashMap::new();
        let mut events: HashMap<u64, u64> = HashMap::new();
        for (key, op) in &g.ops {
            let mapped = if *key == g.origin {
                stream
            } else {
                let device = s.stream_mut(*key)?.device;
                match streams.get(key) {
                    Some(h) => *h,
                    None => {
                        let h = s.new_stream(device, StreamKind::NonBlocking, "graph node");
                        streams.insert(*key, h);
                        h
                    }
                }
            };
            let mut event =
                |e: u64, s: &mut State| *events.entry(e).or_insert_with(|| s.new_handle());
            let op = match op.clone() {
                StreamOp::RecordEvent {
                    event: e, device, ..
                } => StreamOp::RecordEvent {
                    event: event(e, s),
                    stream: mapped,
                    device,
                },
                StreamOp::WaitEvent {
                    event: e, device, ..
                } => StreamOp::WaitEvent {
                    event: event(e, s),
                    stream: mapped,
                    device,
                },
                StreamOp::Launch(mut l) => {
                    l.stream = mapped;
                    StreamOp::Launch(l)
                }
            };
            s.enqueue(op, generation)?;
        }
        // The graph launch completes when all its nodes have.
        let target_device = s.stream_mut(target)?.device;
        for h in streams.values() {
            let e = s.new_handle();
            let d = s.stream_mut(StreamKey::Created(*h))?.device;
            s.enqueue(
                StreamOp::RecordEvent {
                    event: e,
                    stream: *h,
                    device: d,
                },
                generation,
            )?;
            s.enqueue(
                StreamOp::WaitEvent {
                    event: e,
                    stream,
                    device: target_device,
                },
                generation,
            )?;
        }
        s.progress();
        Ok(())
    })
}

/// Run to quiescence. `Err` describes a deadlock (the head of every stuck stream and what it
/// waits for) or a violated rule (separate launches that must be co-resident without proof).
pub fn run() -> std::result::Result<(), String> {
    with(|s| {
        s.progress();
        let mut report = Vec::new();
        if !s.errors.is_empty() {
            report.push(s.errors.join("\n"));
        }
        if let Some(deadlock) = s.deadlock() {
            report.push(deadlock);
        }
        if report.is_empty() {
            Ok(())
        } else {
            Err(report.join("\n"))
        }
    })
}

/// Every kernel launch enqueued so far (graph replays included), in enqueue order.
pub fn launches() -> Vec<KernelLaunch> {
    with(|s| {
        s.ops
            .iter()
            .filter_map(|op| match &op.op {
                StreamOp::Launch(l) => Some(l.clone()),
                _ => None,
            })
            .collect()
    })
}

/// Every stream operation enqueued so far, in enqueue order.
pub fn operations() -> Vec<StreamOp> {
    with(|s| s.ops.iter().map(|o| o.op.clone()).collect())
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum StreamKey {
    /// A special handle (0, 1, 2) on a device.
    Special(u64, i32),
    /// A created stream.
    Created(u64),
}

impl StreamKey {
    fn of(handle: u64, device: i32) -> StreamKey {
        match StreamKind::of_special_handle(handle) {
            Some(StreamKind::Legacy) => StreamKey::Special(0, device),
            Some(_) => StreamKey::Special(handle, device),
            None => StreamKey::Created(handle),
        }
    }
}

struct Stream {
    device: i32,
    kind: StreamKind,
    label: &'static str,
    queue: VecDeque<usize>,
    capture: Option<usize>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Progress {
    Pending,
    Running,
    Done,
}

struct Op {
    op: StreamOp,
    stream: StreamKey,
    deps: Vec<usize>,
    progress: Progress,
    generation: u64,
}

#[derive(Clone)]
struct Graph {
    origin: StreamKey,
    ops: Vec<(StreamKey, StreamOp)>,
    joined: Vec<StreamKey>,
}

#[derive(Clone, Copy)]
enum EventState {
    Recorded(usize),
    Captured(usize),
}

#[derive(Default)]
struct State {
    streams: HashMap<StreamKey, Stream>,
    events: HashMap<u64, EventState>,
    ops: Vec<Op>,
    graphs: Vec<Graph>,
    errors: Vec<String>,
    reported: HashSet<String>,
    next_handle: u64,
    generation: u64,
}

impl State {
    fn new_handle(&mut self) -> u64 {
        self.next_handle += 1;
        0x1000 + 16 * self.next_handle
    }

    fn new_stream(&mut self, device: i32, kind: StreamKind, label: &'static str) -> u64 {
        let handle = self.new_handle();
        self.streams.insert(
            StreamKey::Created(handle),
            Stream {
                device,
                kind,
                label,
                queue: VecDeque::new(),
                capture: None,
            },
        );
        handle
    }

    fn stream_mut(&mut self, key: StreamKey) -> Result<&mut Stream> {
        if let StreamKey::Special(handle, device) = key {
            let kind = StreamKind::of_special_handle(handle).unwrap_or(StreamKind::Blocking);
            return Ok(self.streams.entry(key).or_insert(Stream {
                device,
                kind,
                label: "default",
                queue: VecDeque::new(),
                capture: None,
            }));
        }
        self.streams
            .get_mut(&key)
            .ok_or_else(|| Error::invalid_argument(format!("unknown stream {key:?} (model)")))
    }

    fn describe_stream(&self, key: StreamKey) -> String {
        match key {
            StreamKey::Special(0, d) => format!("the legacy default stream of device {d}"),
            StreamKey::Special(h, d) => format!("the per-thread stream ({h}) of device {d}"),
            StreamKey::Created(h) => match self.streams.get(&key) {
                Some(s) => format!(
                    "{} stream {h:#x} ({:?}, device {})",
                    s.label, s.kind, s.device
                ),
                None => format!("stream {h:#x}"),
            },
        }
    }

    fn enqueue(&mut self, op: StreamOp, generation: u64) -> Result<()> {
        let (handle, device) = match &op {
            StreamOp::RecordEvent { stream, device, .. }
            | StreamOp::WaitEvent { stream, device, .. } => (*stream, *device),
            StreamOp::Launch(l) => (l.stream, l.device),
        };
        let key = StreamKey::of(handle, device);
        let (kind, capture, stream_device) = {
            let s = self.stream_mut(key)?;
            (s.kind, s.capture, s.device)
        };
        if stream_device != device {
            return Err(Error::invalid_usage(format!(
                "{} used for an operation on device {device} (model)",
                self.describe_stream(key)
            )));
        }
        // Capture: a wait on an event recorded in a capture joins the capture.
        let capture = match (&op, capture) {
            (StreamOp::WaitEvent { event, .. }, None) => match self.events.get(event) {
                Some(EventState::Captured(g)) => {
                    let g = *g;
                    self.graphs[g].joined.push(key);
                    self.stream_mut(key)?.capture = Some(g);
                    Some(g)
                }
                _ => None,
            },
            _ => capture,
        };
        if let Some(g) = capture {
            match &op {
                StreamOp::RecordEvent { event, .. } => {
                    self.events.insert(*event, EventState::Captured(g));
                }
                StreamOp::WaitEvent { event, .. } => {
                    if let Some(EventState::Recorded(_)) = self.events.get(event) {
                        return Err(Error::invalid_usage(format!(
                            "capture: {} waits on an event recorded outside the capture \
                             (CUDA_ERROR_STREAM_CAPTURE_ISOLATION)",
                            self.describe_stream(key)
                        )));
                    }
                }
                StreamOp::Launch(_) => {}
            }
            self.graphs[g].ops.push((key, op));
            return Ok(());
        }
        let mut deps = Vec::new();
        let tail = |s: &State, k: &StreamKey| {
            s.streams[k]
                .queue
                .back()
                .copied()
                .filter(|i| s.ops[*i].progress != Progress::Done)
        };
        match kind {
            StreamKind::Legacy => {
                let blocking: Vec<StreamKey> = self
                    .streams
                    .iter()
                    .filter(|(k, s)| {
                        **k != key
                            && s.device == device
                            && matches!(s.kind, StreamKind::Blocking | StreamKind::PerThread)
                    })
                    .map(|(k, _)| *k)
                    .collect();
                deps.extend(blocking.iter().filter_map(|k| tail(self, k)));
            }
            StreamKind::Blocking | StreamKind::PerThread => {
                let legacy = StreamKey::Special(0, device);
                self.stream_mut(legacy)?;
                deps.extend(tail(self, &legacy));
            }
            StreamKind::NonBlocking => {}
        }
        match &op {
            StreamOp::WaitEvent { event, .. } => {
                if let Some(EventState::Recorded(i)) = self.events.get(event) {
                    deps.push(*i);
                } else if let Some(EventState::Captured(_)) = self.events.get(event) {
                    return Err(Error::invalid_usage(
                        "a stream outside a capture waits on an event recorded inside it (model)",
                    ));
                }
            }
            StreamOp::RecordEvent { event, .. } => {
                self.events
                    .insert(*event, EventState::Recorded(self.ops.len()));
            }
            StreamOp::Launch(l) => {
                let capacity = MULTIPROCESSORS * BLOCKS_PER_MULTIPROCESSOR;
                if l.cooperative && l.grid > capacity {
                    return Err(Error::new(
                        crate::abi::symmResult_t::symmUnhandledCudaError,
                        format!(
                            "cooperative launch of {} blocks exceeds the {capacity} resident \
                             blocks of device {device} (CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE, model)",
                            l.grid
                        ),
                    ));
                }
            }
        }
        let index = self.ops.len();
        self.ops.push(Op {
            op,
            stream: key,
            deps,
            progress: Progress::Pending,
            generation,
        });
        self.stream_mut(key)?.queue.push_back(index);
        Ok(())
    }

    fn progress(&mut self) {
        loop {
            let mut progressed = false;
            let heads: Vec<usize> = self
                .streams
                .values()
                .filter_map(|s| s.queue.front().copied())
                .collect();
            for i in heads {
                let op = &self.ops[i];
                if op.progress != Progress::Pending
                    || !op
                        .deps
                        .iter()
                        .all(|d| self.ops[*d].progress == Progress::Done)
                {
                    continue;
                }
                progressed = true;
                if matches!(op.op, StreamOp::Launch(_)) {
                    self.ops[i].progress = Progress::Running;
                } else {
                    self.finish(i);
                }
            }
            // Running kernels complete when every part of each of their instances runs.
            let running: Vec<usize> = (0..self.ops.len())
                .filter(|i| self.ops[*i].progress == Progress::Running)
                .collect();
            let mut parts: HashMap<(InstanceId, u64), Vec<usize>> = HashMap::new();
            for &i in &running {
                if let StreamOp::Launch(l) = &self.ops[i].op {
                    for instance in &l.instances {
                        let launches = parts
                            .entry((*instance, self.ops[i].generation))
                            .or_default();
                        if !launches.contains(&i) {
                            launches.push(i);
                        }
                    }
                }
            }
            let mut done = Vec::new();
            for &i in &running {
                let StreamOp::Launch(l) = &self.ops[i].op else {
                    continue;
                };
                let generation = self.ops[i].generation;
                let complete = l.instances.iter().all(|inst| {
                    parts[&(*inst, generation)]
                        .iter()
                        .map(|j| match &self.ops[*j].op {
                            StreamOp::Launch(m) => {
                                m.instances.iter().filter(|x| *x == inst).count()
                            }
                            _ => 0,
                        })
                        .sum::<usize>()
                        == l.clique_ranks as usize
                });
                if complete {
                    done.push(i);
                }
            }
            for &i in &done {
                self.check_co_residency(i, &parts);
            }
            for i in done {
                self.finish(i);
                progressed = true;
            }
            if !progressed {
                break;
            }
        }
    }

    /// Separate launches on one device that must run at once need proven co-residency.
    fn check_co_residency(&mut self, i: usize, parts: &HashMap<(InstanceId, u64), Vec<usize>>) {
        let StreamOp::Launch(l) = &self.ops[i].op else {
            return;
        };
        let generation = self.ops[i].generation;
        for inst in &l.instances {
            let mut same_device: Vec<usize> = parts[&(*inst, generation)]
                .iter()
                .copied()
                .filter(|j| matches!(&self.ops[*j].op, StreamOp::Launch(m) if m.device == l.device))
                .collect();
            same_device.sort_unstable();
            same_device.dedup();
            if same_device.len() < 2 {
                continue;
            }
            let launches: Vec<&KernelLaunch> = same_device
                .iter()
                .filter_map(|j| match &self.ops[*j].op {
                    StreamOp::Launch(m) => Some(m),
                    _ => None,
                })
                .collect();
            let blocks: u32 = launches.iter().map(|m| m.grid).sum();
            let capacity = MULTIPROCESSORS * BLOCKS_PER_MULTIPROCESSOR;
            let message = if !launches.iter().all(|m| m.co_residency_proven) {
                format!(
                    "co-residency not guaranteed: collective (clique {:#x}, call {}) needs {} \
                     separate launches on device {} (ranks {:?}) running at once, and their \
                     co-residency was not proven; the GPU may run them one after the other \
                     (deadlock)",
                    inst.clique,
                    inst.seq,
                    launches.len(),
                    l.device,
                    launches.iter().map(|m| m.ranks.clone()).collect::<Vec<_>>()
                )
            } else if blocks > capacity {
                format!(
                    "co-residency claimed but impossible: {blocks} blocks on device {} \
                     (capacity {capacity})",
                    l.device
                )
            } else {
                continue;
            };
            if self.reported.insert(message.clone()) {
                self.errors.push(message);
            }
        }
    }

    fn finish(&mut self, i: usize) {
        self.ops[i].progress = Progress::Done;
        let key = self.ops[i].stream;
        if let Some(s) = self.streams.get_mut(&key)
            && s.queue.front() == Some(&i)
        {
            s.queue.pop_front();
        }
    }

    fn describe_op(&self, i: usize) -> String {
        let op = &self.ops[i];
        let what = match &op.op {
            StreamOp::RecordEvent { event, .. } => format!("record event {event:#x}"),
            StreamOp::WaitEvent { event, .. } => format!("wait for event {event:#x}"),
            StreamOp::Launch(l) => format!(
                "kernel {} for ranks {:?} (calls {:?})",
                l.kernel.ptx_name(),
                l.ranks,
                l.instances.iter().map(|x| x.seq).collect::<Vec<_>>()
            ),
        };
        format!("#{i} {what} on {}", self.describe_stream(op.stream))
    }

    fn deadlock(&self) -> Option<String> {
        let mut stuck: Vec<(&StreamKey, &Stream)> = self
            .streams
            .iter()
            .filter(|(_, s)| !s.queue.is_empty())
            .collect();
        if stuck.is_empty() {
            return None;
        }
        stuck.sort_by_key(|(_, s)| s.queue[0]);
        let mut lines = vec![format!(
            "deadlock: {} stream(s) cannot make progress:",
            stuck.len()
        )];
        for (_, s) in stuck {
            let head = s.queue[0];
            let op = &self.ops[head];
            let why = match op.progress {
                Progress::Running => {
                    let StreamOp::Launch(l) = &op.op else {
                        unreachable!("only launches run")
                    };
                    let running: HashSet<usize> = (0..self.ops.len())
                        .filter(|j| self.ops[*j].progress == Progress::Running)
                        .filter_map(|j| match &self.ops[j].op {
                            StreamOp::Launch(m)
                                if m.instances.iter().any(|x| l.instances.contains(x)) =>
                            {
                                Some(m.ranks.clone())
                            }
                            _ => None,
                        })
                        .flatten()
                        .collect();
                    let missing: Vec<usize> = (0..l.clique_ranks as usize)
                        .filter(|r| !running.contains(r))
                        .collect();
                    let queued: Vec<String> = (0..self.ops.len())
                        .filter(|j| self.ops[*j].progress == Progress::Pending)
                        .filter(|j| matches!(&self.ops[*j].op, StreamOp::Launch(m) if m.instances.iter().any(|x| l.instances.contains(x))))
                        .map(|j| self.describe_op(j))
                        .collect();
                    format!(
                        "running, spinning on ranks {missing:?} of the same collective, which are \
                         not running{}",
                        if queued.is_empty() {
                            String::from(" (never launched)")
                        } else {
                            format!(" (queued: {})", queued.join("; "))
                        }
                    )
                }
                _ => {
                    let waits: Vec<String> = op
                        .deps
                        .iter()
                        .filter(|d| self.ops[**d].progress != Progress::Done)
                        .map(|d| self.describe_op(*d))
                        .collect();
                    format!("waiting for {}", waits.join(" and "))
                }
            };
            lines.push(format!("  head {}: {why}", self.describe_op(head)));
        }
        Some(lines.join("\n"))
    }
}

/// The model backend: host memory, launches checked by the model.
pub struct ModelBackend {
    /// Memory.
    pub memory: HostBackend,
}

impl ModelBackend {
    /// A model backend.
    pub fn new() -> Self {
        ModelBackend {
            memory: HostBackend::new(),
        }
    }

    /// Enqueue a schedule.
    pub fn execute(&self, schedule: &LaunchSchedule) -> Result<()> {
        enqueue(schedule)
    }
}

impl Default for ModelBackend {
    fn default() -> Self {
        Self::new()
    }
}
