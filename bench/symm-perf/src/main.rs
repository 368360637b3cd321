//! `symm-perf`: nccl-tests-style benchmark of symm's collectives.
//!
//! ```text
//! symm-perf all_reduce|all_gather|reduce_scatter|broadcast|reduce -b 8 -e 128M -f 2 -g <ranks> -d float -o sum \
//!           -n iters -w warmup -c 1 [-r root] [-G graph-launches] [-a 0|1|2|3] [-z 0|1]
//! symm-perf all_reduce --minbytes 8 --maxbytes 128M --stepfactor 2 --ngpus 8 --datatype float ...
//! symm-perf clc -t tiles -i uniform|skew|heavy|all -p policy|all -n iters
//! symm-perf scale-model [--out DIR]
//! ```
//!
//! `scale-model` proves the PAT and direct all-gather / reduce-scatter schedules for every rank
//! count of its table, prints the table of steps and predicted times (`symm::internals::scale_model`), and
//! writes it with a plot to `DIR/scale_model.md` and `DIR/scale_model.svg` (default `bench`).
//!
//! All ranks live in this process on device 0 (one thread drives them, collectives grouped);
//! with `--procs N`, N processes of one rank each (this process starts them as copies of
//! itself, joined with `symmCommInitRank`; rank 0 prints the table, every rank checks its own
//! results), the layout of a torchrun or mpirun job.
//! Sizes are nccl-tests' (bytes of the whole result; all-gather and reduce-scatter: of the
//! gathered / scattered buffer; broadcast, from `-r`: of the buffer). On the cuda backend each
//! point is the median of CUDA-event timings of CUDA-graph replays (`-G 0`: of eager launches),
//! and a floor column compares it with the device-to-device copy bandwidth measured at start; on
//! the host backend, the median wall time of grouped calls. With `--procs`, `-a` picks which
//! rank's time a row shows (rank 0's, the mean, the min or the max, gathered with symm's own
//! all-reduce).

mod batch;
mod clc;
mod device;
mod options;
mod reference;
mod scale_model;

/// `symm-perf scale-model [--out DIR]`: print the scale model's table and write it, with the
/// plot, into `DIR` (default `bench`, relative to the current directory).
fn scale_model(args: &[String]) -> Result<(), String> {
    let dir = match args {
        [] => std::path::PathBuf::from("bench"),
        [flag, dir] if flag == "--out" => std::path::PathBuf::from(dir),
        _ => return Err("usage: symm-perf scale-model [--out DIR]".to_string()),
    };
    let table = scale_model::markdown()?;
    print!("{table}");
    for (name, text) in [
        ("scale_model.md", table),
        ("scale_model.svg", scale_model::svg()),
    ] {
        let path = dir.join(name);
        std::fs::write(&path, text).map_err(|e| format!("{}: {e}", path.display()))?;
        eprintln!("wrote {}", path.display());
    }
    Ok(())
}

use device::{Gpu, median};
use options::{Average, Operation, Options, op_name, table_header, type_name};
use reference::Reference;
use std::process::ExitCode;
use std::time::Instant;
use symm::*;
use symm_device::symmetric::Algorithm;
use symm_device::{DataType, RedOp};

struct Rank {
    comm: symmComm_t,
    base: u64,
    /// The window over `base` (`-R 2`); NULL when `base` is the process's own memory (`-R 0`).
    window: symmWindow_t,
}

/// Alignment of the process's own buffers (`-R 0`) on the host backend.
const OWN_ALIGN: usize = 4096;

/// `bytes` of the process's own memory (`-R 0`), in no window: `cuMemAlloc` on the cuda
/// backend, the heap on the host backend (freed by `Drop for Bench`).
fn own_alloc(gpu: Option<&Gpu>, bytes: usize) -> Result<u64, String> {
    if let Some(gpu) = gpu {
        return gpu.alloc(bytes);
    }
    let layout = std::alloc::Layout::from_size_align(bytes, OWN_ALIGN)
        .map_err(|e| format!("{bytes} bytes: {e}"))?;
    // SAFETY: a layout of non-zero size.
    let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
    if ptr.is_null() {
        return Err(format!("allocating {bytes} bytes failed"));
    }
    Ok(ptr as u64)
}

struct Bench {
    options: Options,
    /// The ranks in this process.
    ranks: Vec<Rank>,
    /// Global rank of `ranks[0]` (the others follow).
    first_rank: usize,
    /// Ranks of the communicator.
    nranks: usize,
    gpu: Option<Gpu>,
    /// Bytes between the two regions of each window.
    region: u64,
}

/// Buffers and counts of one size.
#[derive(Clone, Copy, Debug)]
struct Shape {
    /// Elements of the whole result (all-reduce: count; others: per rank × ranks).
    total: u64,
    /// The count passed to the collective.
    count: u64,
}

fn fail(what: &str, r: symmResult_t, comm: symmComm_t) -> String {
    // SAFETY: never NULL, NUL-terminated.
    let message = unsafe { std::ffi::CStr::from_ptr(symmGetLastError(comm)) };
    format!("{what}: {r:?}: {}", message.to_string_lossy())
}

fn ok(what: &str, r: symmResult_t, comm: symmComm_t) -> Result<(), String> {
    if r == symmResult_t::symmSuccess {
        Ok(())
    } else {
        Err(fail(what, r, comm))
    }
}

impl Bench {
    /// All ranks in this process (`process` `None`), or this process's rank of a
    /// `--procs` run: `(rank, unique id)`.
    fn new(options: Options, process: Option<(usize, symmUniqueId)>) -> Result<Bench, String> {
        let n = options.ranks;
        let (comms, first_rank) = match process {
            None => {
                let mut comms = vec![std::ptr::null_mut(); n];
                let devices = vec![0; n];
                ok(
                    "symmCommInitAll",
                    // SAFETY: both arrays hold n elements.
                    unsafe { symmCommInitAll(comms.as_mut_ptr(), n as i32, devices.as_ptr()) },
                    std::ptr::null_mut(),
                )?;
                (comms, 0)
            }
            Some((rank, id)) => {
                let mut comm = std::ptr::null_mut();
                ok(
                    "symmCommInitRank",
                    // SAFETY: valid out-pointer.
                    unsafe { symmCommInitRank(&mut comm, n as i32, id, rank as i32) },
                    std::ptr::null_mut(),
                )?;
                (vec![comm], rank)
            }
        };
        let mut backend = std::ptr::null();
        ok(
            "symmCommGetBackend",
            // SAFETY: valid out-pointer.
            unsafe { symmCommGetBackend(comms[0], &mut backend) },
            comms[0],
        )?;
        // SAFETY: static NUL-terminated string.
        let cuda = unsafe { std::ffi::CStr::from_ptr(backend) }.to_bytes() == b"cuda";
        let gpu = if cuda { Some(Gpu::open()?) } else { None };
        let region = options.max_bytes.next_multiple_of(256);
        // `--batch N`: N pairs of regions, one per collective of a batch.
        let window = 2 * region as usize * options.batch.unwrap_or(1);
        let mut ranks = Vec::with_capacity(n);
        for comm in comms {
            let base = if options.in_windows {
                let mut ptr = std::ptr::null_mut();
                ok(
                    "symmMemAlloc",
                    // SAFETY: valid out-pointer.
                    unsafe { symmMemAlloc(comm, &mut ptr, window) },
                    comm,
                )?;
                ptr as u64
            } else {
                // `-R 0`: buffers the library does not know, which it stages.
                own_alloc(gpu.as_ref(), window)?
            };
            ranks.push(Rank {
                comm,
                base,
                window: std::ptr::null_mut(),
            });
        }
        if options.in_windows {
            ok("symmGroupStart", symmGroupStart(), std::ptr::null_mut())?;
            for r in &mut ranks {
                // SAFETY: valid out-pointer; a live allocation.
                let result = unsafe {
                    symmCommWindowRegister(
                        r.comm,
                        r.base as *mut _,
                        window,
                        &mut r.window,
                        SYMM_WIN_COLL_SYMMETRIC,
                    )
                };
                ok("symmCommWindowRegister", result, r.comm)?;
            }
            ok("symmGroupEnd", symmGroupEnd(), std::ptr::null_mut())?;
        }
        Ok(Bench {
            options,
            ranks,
            first_rank,
            nranks: n,
            gpu,
            region,
        })
    }

    fn element(&self) -> u64 {
        self.options.dtype.size_bytes() as u64
    }

    fn shape(&self, bytes: u64) -> Shape {
        let n = self.nranks as u64;
        match self.options.operation {
            Operation::AllReduce | Operation::Broadcast | Operation::Reduce => {
                let total = bytes / self.element();
                Shape {
                    total,
                    count: total,
                }
            }
            _ => {
                let count = bytes / (self.element() * n);
                Shape {
                    total: count * n,
                    count,
                }
            }
        }
    }

    /// (send, recv) addresses of `self.ranks[r]` for collective `item` of a batch.
    fn item_buffers(&self, r: usize, shape: Shape, in_place: bool, item: usize) -> (u64, u64) {
        let base = self.ranks[r].base + item as u64 * 2 * self.region;
        let segment = (self.first_rank + r) as u64 * shape.count * self.element();
        match (self.options.operation, in_place) {
            (Operation::AllReduce | Operation::Broadcast | Operation::Reduce, true) => (base, base),
            (Operation::AllReduce | Operation::Broadcast | Operation::Reduce, false) => {
                (base, base + self.region)
            }
            (Operation::AllGather, true) => (base + segment, base),
            (Operation::AllGather, false) => (base + self.region, base),
            (Operation::ReduceScatter, true) => (base, base + segment),
            (Operation::ReduceScatter, false) => (base, base + self.region),
        }
    }

    /// Issue the collective on every rank (one group).
    fn issue(&self, shape: Shape, in_place: bool) -> Result<(), String> {
        self.issue_items(shape, in_place, 0..1)
    }

    /// Issue collectives `items` of a batch on every rank, in one group.
    fn issue_items(
        &self,
        shape: Shape,
        in_place: bool,
        items: std::ops::Range<usize>,
    ) -> Result<(), String> {
        let stream = self
            .gpu
            .as_ref()
            .map_or(std::ptr::null_mut(), Gpu::symm_stream);
        let (dtype, op) = (self.options.dtype as i32, self.options.op as i32);
        if self.options.machines.is_some() {
            // A communicator across machines runs its calls one by one.
            for item in items {
                self.issue_one(shape, in_place, item, dtype, op, stream)?;
            }
            return Ok(());
        }
        ok("symmGroupStart", symmGroupStart(), std::ptr::null_mut())?;
        for item in items {
            self.issue_one(shape, in_place, item, dtype, op, stream)?;
        }
        ok("symmGroupEnd", symmGroupEnd(), std::ptr::null_mut())
    }

    /// Collective `item` of a batch on every rank (inside an open group).
    fn issue_one(
        &self,
        shape: Shape,
        in_place: bool,
        item: usize,
        dtype: i32,
        op: i32,
        stream: symmStream_t,
    ) -> Result<(), String> {
        for (r, rank) in self.ranks.iter().enumerate() {
            let (send, recv) = self.item_buffers(r, shape, in_place, item);
            let (send, recv) = (send as *const _, recv as *mut _);
            let c = shape.count as usize;
            let result = match self.options.operation {
                Operation::AllReduce => symmAllReduce(send, recv, c, dtype, op, rank.comm, stream),
                Operation::AllGather => symmAllGather(send, recv, c, dtype, rank.comm, stream),
                Operation::ReduceScatter => {
                    symmReduceScatter(send, recv, c, dtype, op, rank.comm, stream)
                }
                Operation::Broadcast => symmBroadcast(
                    send,
                    recv,
                    c,
                    dtype,
                    self.options.root as i32,
                    rank.comm,
                    stream,
                ),
                Operation::Reduce => symmReduce(
                    send,
                    recv,
                    c,
                    dtype,
                    op,
                    self.options.root as i32,
                    rank.comm,
                    stream,
                ),
            };
            ok("collective", result, rank.comm)?;
        }
        Ok(())
    }

    /// The inputs and expected outputs of `shape` (see [`Reference`]).
    fn reference(&self, shape: Shape) -> Reference {
        Reference {
            dtype: self.options.dtype,
            op: self.options.op,
            operation: self.options.operation,
            nranks: self.nranks,
            root: self.options.root,
            count: shape.count,
        }
    }

    fn write(&self, address: u64, bytes: &[u8]) -> Result<(), String> {
        match &self.gpu {
            Some(gpu) => gpu.upload(address, bytes),
            None => {
                // SAFETY: host memory of a window, with room (callers size the ranges).
                unsafe {
                    std::ptr::copy_nonoverlapping(bytes.as_ptr(), address as *mut u8, bytes.len())
                };
                Ok(())
            }
        }
    }

    fn read(&self, address: u64, len: usize) -> Result<Vec<u8>, String> {
        match &self.gpu {
            Some(gpu) => gpu.download(address, len),
            None => {
                // SAFETY: host memory of a window holding `len` bytes.
                Ok(unsafe { std::slice::from_raw_parts(address as *const u8, len) }.to_vec())
            }
        }
    }

    /// Fill the inputs, run once, and count wrong elements.
    fn check(&self, shape: Shape, in_place: bool) -> Result<u64, String> {
        self.check_items(shape, in_place, 1, &|| self.issue(shape, in_place))
    }

    /// Fill the inputs of the first `items` collectives of a batch, run `issue`, and count
    /// wrong elements of all of them.
    fn check_items(
        &self,
        shape: Shape,
        in_place: bool,
        items: usize,
        issue: &dyn Fn() -> Result<(), String>,
    ) -> Result<u64, String> {
        let size = self.element() as usize;
        let reference = self.reference(shape);
        let inputs = match self.options.operation {
            Operation::AllGather => shape.count,
            _ => shape.total,
        };
        for item in 0..items {
            for r in 0..self.ranks.len() {
                let bytes = reference.encoded_inputs(self.first_rank + r, inputs as usize);
                self.write(self.item_buffers(r, shape, in_place, item).0, &bytes)?;
            }
        }
        issue()?;
        let outputs = match self.options.operation {
            Operation::ReduceScatter => shape.count,
            _ => shape.total,
        };
        let mut wrong = 0;
        for (item, local) in (0..items).flat_map(|k| (0..self.ranks.len()).map(move |l| (k, l))) {
            let got = self.read(
                self.item_buffers(local, shape, in_place, item).1,
                outputs as usize * size,
            )?;
            wrong += reference.count_wrong(self.first_rank + local, &got);
        }
        Ok(wrong)
    }

    /// Median µs of one collective on every rank.
    fn time(&self, shape: Shape, in_place: bool) -> Result<f64, String> {
        self.time_with(&|| self.issue(shape, in_place))
    }

    /// Median µs of `issue` (after the warm-up).
    fn time_with(&self, issue: &dyn Fn() -> Result<(), String>) -> Result<f64, String> {
        for _ in 0..self.options.warmup.max(1) {
            issue()?;
        }
        match &self.gpu {
            Some(gpu) => {
                gpu.synchronize()?;
                match self.options.graph_launches {
                    Some(0) => {
                        gpu.time_eager(self.options.iterations, self.options.blocking, &mut || {
                            issue()
                        })
                    }
                    launches => {
                        gpu.time_graph(self.options.iterations, launches.unwrap_or(1), &mut || {
                            issue()
                        })
                    }
                }
            }
            None => {
                let mut times = Vec::with_capacity(self.options.iterations);
                for _ in 0..self.options.iterations {
                    let start = Instant::now();
                    issue()?;
                    times.push(start.elapsed().as_secs_f64() * 1e6);
                }
                Ok(median(&mut times))
            }
        }
    }

    /// `us` as `-a` asks, over every rank: with all ranks in this process they were timed
    /// together (one time); with `--procs`, the ranks' own times are combined with an
    /// all-reduce of one double (rank 0's: a broadcast from rank 0) in the window.
    fn across_ranks(&self, us: f64) -> Result<f64, String> {
        if self.ranks.len() == self.nranks {
            return Ok(us);
        }
        let rank = &self.ranks[0];
        let stream = self
            .gpu
            .as_ref()
            .map_or(std::ptr::null_mut(), Gpu::symm_stream);
        let double = DataType::Float64 as i32;
        self.write(rank.base, &us.to_ne_bytes())?;
        let at = rank.base as *mut std::ffi::c_void;
        let result = match self.options.average {
            Average::Rank0 => symmBroadcast(at, at, 1, double, 0, rank.comm, stream),
            average => {
                let op = match average {
                    Average::Min => RedOp::Min,
                    Average::Max => RedOp::Max,
                    _ => RedOp::Avg,
                };
                symmAllReduce(at, at, 1, double, op as i32, rank.comm, stream)
            }
        };
        ok("symmAllReduce of the ranks' times", result, rank.comm)?;
        let bytes = self.read(rank.base, 8)?;
        Ok(f64::from_ne_bytes(bytes.try_into().expect("8 bytes")))
    }

    /// The algorithm of the kernel the first rank launched last.
    fn last_kernel(&self) -> String {
        symm::internals::Comm::from_handle(self.ranks[0].comm)
            .ok()
            .and_then(|c| c.lock().last_kernel.clone())
            .map(|k| k.trim_start_matches("symm_").to_string())
            .unwrap_or_default()
    }

    /// The algorithm the planner picks, and the bytes all ranks read and write with it.
    fn algorithm_and_traffic(&self, shape: Shape) -> (Algorithm, f64) {
        let comm = symm::internals::Comm::from_handle(self.ranks[0].comm).expect("live comm");
        let collective = match self.options.operation {
            Operation::AllReduce => symm::internals::Collective::AllReduce,
            Operation::AllGather => symm::internals::Collective::AllGather,
            Operation::ReduceScatter => symm::internals::Collective::ReduceScatter,
            Operation::Broadcast => symm::internals::Collective::Broadcast,
            Operation::Reduce => symm::internals::Collective::Reduce,
        };
        let plan = symm::internals::plan(
            collective,
            self.options.dtype,
            self.options.op,
            shape.count,
            self.nranks as u32,
            comm.clique.backend.kind(),
            symm::internals::Limits {
                max_blocks: comm.max_blocks,
                min_blocks: comm.clique.min_blocks,
                ranks_per_gpu: comm.clique.ranks_per_gpu,
                forced: comm.clique.forced_algorithm,
            },
        )
        .expect("valid request");
        let n = self.nranks as f64;
        let s = (shape.total * self.element()) as f64;
        let per_rank = match plan.kernel.algorithm {
            // Lines of 16 bytes per 8 written into every rank, then read from every rank.
            Algorithm::OneShotLlAllReduce => 2.0 * n * 2.0 * s + s,
            Algorithm::LlAllGather => 2.0 * 2.0 * s + s,
            Algorithm::OneShotAllReduce => n * s + s,
            Algorithm::TwoShotAllReduce => 2.0 * s,
            Algorithm::ReduceScatter => s + s / n,
            Algorithm::AllGather => 2.0 * s,
            // Reads each held segment and writes it to one peer (own: also a local copy).
            Algorithm::PatAllGather => 2.0 * s,
            // Reads its send buffer, writes and reads back a partial per other rank (in the
            // element's width here; wider accumulators move more), writes its result.
            Algorithm::PatReduceScatter => s + 2.0 * s * (n - 1.0) / n + s / n,
            // The root reads its buffer once and writes it into every rank (spread over the
            // ranks).
            Algorithm::Broadcast => s / n + s,
            // Not measured by symm-perf (it has no such operation): each rank reads and
            // writes its share.
            Algorithm::AllToAll
            | Algorithm::AllToAllV
            | Algorithm::Gather
            | Algorithm::Scatter
            | Algorithm::SendReceive => 2.0 * s,
        };
        (plan.kernel.algorithm, n * per_rank)
    }
}

impl Drop for Bench {
    fn drop(&mut self) {
        let own = 2 * self.region as usize * self.options.batch.unwrap_or(1);
        for r in &self.ranks {
            if !self.options.in_windows {
                match &self.gpu {
                    Some(gpu) => {
                        let _ = gpu.free(r.base);
                    }
                    None => {
                        if let Ok(layout) = std::alloc::Layout::from_size_align(own, OWN_ALIGN) {
                            // SAFETY: allocated in `Bench::new` with this layout; every
                            // collective on it has completed (host backend).
                            unsafe { std::alloc::dealloc(r.base as *mut u8, layout) };
                        }
                    }
                }
            } else {
                symmCommWindowDeregister(r.comm, r.window);
                symmMemFree(r.comm, r.base as *mut _);
            }
            symmCommDestroy(r.comm);
        }
    }
}

/// Environment of a `--procs` child: `rank,id-in-hex`.
const PROCESS_ENV: &str = "SYMM_PERF_PROCESS";

/// `--procs N`: start N copies of this program, one rank each, and wait for them; rank 0's
/// output is this run's output.
fn run_processes(args: &[String], nranks: usize, machines: Option<usize>) -> Result<bool, String> {
    let mut id = symmUniqueId {
        internal: [0; SYMM_UNIQUE_ID_BYTES],
    };
    ok(
        "symmGetUniqueId",
        // SAFETY: valid out-pointer.
        unsafe { symmGetUniqueId(&mut id) },
        std::ptr::null_mut(),
    )?;
    let hex: String = id
        .internal
        .iter()
        .map(|b| format!("{:02x}", *b as u8))
        .collect();
    let exe = std::env::current_exe().map_err(|e| format!("finding this program: {e}"))?;
    let mut children = Vec::with_capacity(nranks);
    for rank in 0..nranks {
        let mut command = std::process::Command::new(&exe);
        command.args(args).env(PROCESS_ENV, format!("{rank},{hex}"));
        if let Some(machines) = machines {
            // Consecutive ranks per machine, as a launcher assigns them.
            let machine = rank / (nranks / machines);
            command.env("SYMM_HOST_ID", format!("symm-perf-machine-{machine}"));
        }
        if rank != 0 {
            command.stdout(std::process::Stdio::null());
        }
        let child = command
            .spawn()
            .map_err(|e| format!("starting rank {rank}: {e}"))?;
        children.push(child);
    }
    let mut all_right = true;
    for (rank, mut child) in children.into_iter().enumerate() {
        let status = child
            .wait()
            .map_err(|e| format!("waiting for rank {rank}: {e}"))?;
        if !status.success() {
            eprintln!("symm-perf: rank {rank} failed ({status})");
            all_right = false;
        }
    }
    Ok(all_right)
}

/// This process's rank and the unique id, when it is a `--procs` child.
fn process_rank() -> Result<Option<(usize, symmUniqueId)>, String> {
    let Ok(text) = std::env::var(PROCESS_ENV) else {
        return Ok(None);
    };
    let bad = || format!("{PROCESS_ENV}={text:?} is malformed");
    let (rank, hex) = text.split_once(',').ok_or_else(bad)?;
    let rank: usize = rank.parse().map_err(|_| bad())?;
    if hex.len() != 2 * SYMM_UNIQUE_ID_BYTES {
        return Err(bad());
    }
    let mut id = symmUniqueId {
        internal: [0; SYMM_UNIQUE_ID_BYTES],
    };
    for (i, c) in id.internal.iter_mut().enumerate() {
        *c = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).map_err(|_| bad())? as std::ffi::c_char;
    }
    Ok(Some((rank, id)))
}

fn run(options: Options, process: Option<(usize, symmUniqueId)>) -> Result<bool, String> {
    let bench = Bench::new(options.clone(), process)?;
    let n = bench.nranks;
    let backend = if bench.gpu.is_some() { "cuda" } else { "host" };
    let layout = if process.is_some() {
        "one process per rank"
    } else {
        "one thread drives all"
    };
    let copy_gbps = match &bench.gpu {
        Some(gpu) => Some(gpu.copy_bandwidth_gbps(256 << 20)?),
        None => None,
    };
    let timing = match (bench.gpu.is_some(), options.graph_launches) {
        (true, Some(0)) if options.blocking => {
            "eager launches timed with CUDA events, each waited for (-z 1)".to_string()
        }
        (true, Some(0)) => "eager launches timed with CUDA events (-G 0)".to_string(),
        (true, launches) => format!(
            "CUDA-graph replays timed with CUDA events, {} per iteration (-G)",
            launches.unwrap_or(1)
        ),
        (false, _) => "wall time (-G and -z apply to the cuda backend)".to_string(),
    };
    let ranks_time = match (process.is_some(), options.average) {
        (false, _) => "all ranks timed together",
        (true, Average::Rank0) => "rank 0's time (-a 0)",
        (true, Average::Mean) => "mean over ranks (-a 1)",
        (true, Average::Min) => "min over ranks (-a 2)",
        (true, Average::Max) => "max over ranks (-a 3)",
    };
    println!(
        "# symm-perf {:?}: {n} ranks on device 0 ({layout}), backend {backend}, {} {}, median of {} iterations after {} warm-up, {timing}, {ranks_time}",
        options.operation,
        type_name(options.dtype),
        op_name(options.operation, options.op),
        options.iterations,
        options.warmup,
    );
    match copy_gbps {
        Some(bw) => println!(
            "# device-to-device copy bandwidth: {bw:.1} GB/s; floor (%) = the time that copy rate needs for the algorithm's reads+writes / measured time"
        ),
        None => println!("# no copy-bandwidth floor on the host backend"),
    }
    println!("#");
    for line in table_header(copy_gbps.is_some()) {
        println!("{line}");
    }
    let mut busbw_sum = 0.0;
    let mut points = 0;
    let mut all_right = true;
    for size in options.sizes() {
        let shape = bench.shape(size);
        if shape.count == 0 {
            continue;
        }
        let bytes = shape.total * bench.element();
        let (algorithm, traffic) = bench.algorithm_and_traffic(shape);
        let root = if options.operation.rooted() {
            options.root as i64
        } else {
            -1
        };
        let mut line = format!(
            "  {:>12} {:>12} {:>8} {:>6} {:>6} {:>22}",
            bytes,
            shape.total,
            type_name(options.dtype),
            op_name(options.operation, options.op),
            root,
            algorithm.name()
        );
        for in_place in [false, true] {
            let wrong = if options.check {
                bench.check(shape, in_place)?
            } else {
                0
            };
            all_right &= wrong == 0;
            let us = bench.across_ranks(bench.time(shape, in_place)?)?;
            let algbw = bytes as f64 / (us * 1e3);
            let busbw = algbw * options.operation.bus_factor(n);
            busbw_sum += busbw;
            points += 1;
            line += &format!(" | {us:>10.2} {algbw:>9.2} {busbw:>9.2} {wrong:>6}");
            if let Some(bw) = copy_gbps {
                let floor = 100.0 * (traffic / 2.0 / (bw * 1e3)) / us;
                line += &format!(" {floor:>6.0}");
            }
        }
        println!("{line}");
    }
    println!(
        "# Out of bounds values : {}",
        if all_right { "0 OK" } else { "FAILED" }
    );
    println!(
        "# Avg bus bandwidth    : {:.3} GB/s",
        busbw_sum / points.max(1) as f64
    );
    Ok(all_right)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("scale-model") {
        return match scale_model(&args[1..]) {
            Ok(()) => ExitCode::SUCCESS,
            Err(message) => {
                eprintln!("symm-perf scale-model: {message}");
                ExitCode::FAILURE
            }
        };
    }
    if args.first().map(String::as_str) == Some("clc") {
        return match clc::main(&args[1..]) {
            Ok(true) => ExitCode::SUCCESS,
            Ok(false) => {
                eprintln!("symm-perf clc: a tile did not run exactly once");
                ExitCode::FAILURE
            }
            Err(message) => {
                eprintln!("symm-perf clc: {message}");
                ExitCode::FAILURE
            }
        };
    }
    let options = match Options::parse(&args) {
        Ok(o) => o,
        Err(message) => {
            eprintln!("{message}");
            return ExitCode::from(2);
        }
    };
    let outcome = match process_rank() {
        Err(message) => Err(message),
        Ok(None) if options.procs.is_some() => {
            run_processes(&args, options.ranks, options.machines)
        }
        Ok(None) if options.batch.is_some() => batch::run(options),
        Ok(process) => run(options, process),
    };
    match outcome {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => {
            eprintln!("symm-perf: wrong results");
            ExitCode::FAILURE
        }
        Err(message) => {
            eprintln!("symm-perf: {message}");
            ExitCode::FAILURE
        }
    }
}
