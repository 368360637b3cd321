//! `symm-perf <collective> --batch N`: for each size S, a group of N collectives of S bytes
//! each (fused into one launch per device) timed next to the same N collectives as N separate
//! calls (a group of one each: one launch per call), both checked. Each row also gives what
//! the GPU cost model (`symm::internals::GPU_MODEL`, Hopper constants) predicts for the fused
//! launch, for one call and for the N separate calls: until the kernels have run on a GPU,
//! those are the GPU numbers we have, and they are predictions, not measurements.

use super::{Bench, Operation, Options, op_name, type_name};
use symm::internals::BackendKind;
use symm::internals::Comm;
use symm::internals::{BatchRequest, plan_batch};
use symm::internals::{Collective, Limits, Plan, plan};

/// Launches the first rank made so far.
fn launches(bench: &Bench) -> Result<u64, String> {
    Comm::from_handle(bench.ranks[0].comm)
        .map(|c| c.launch_count())
        .map_err(|e| e.message)
}

/// The GPU model's plans for one call of `count` and for a batch of `items` of them, on
/// `nranks` ranks, each on its own GPU, with 64 blocks allowed.
fn gpu_model(options: &Options, count: u64, items: usize, nranks: u32) -> (Plan, Plan) {
    let collective = match options.operation {
        Operation::AllReduce => Collective::AllReduce,
        Operation::AllGather => Collective::AllGather,
        Operation::ReduceScatter => Collective::ReduceScatter,
        Operation::Broadcast => Collective::Broadcast,
        Operation::Reduce => Collective::Reduce,
    };
    let limits = Limits {
        max_blocks: 64,
        min_blocks: 1,
        ranks_per_gpu: 1,
        forced: None,
    };
    let single = plan(
        collective,
        options.dtype,
        options.op,
        count,
        nranks,
        BackendKind::Cuda,
        limits,
    )
    .expect("a valid request");
    let counts = vec![count; items];
    let request = BatchRequest {
        collective,
        dtype: options.dtype,
        op: options.op,
        counts: &counts,
        nranks,
    };
    let fused = plan_batch(&request, BackendKind::Cuda, limits).expect("a valid request");
    (single, fused)
}

/// Run the batch mode; `false` when a result was wrong.
pub fn run(options: Options) -> Result<bool, String> {
    let items = options.batch.unwrap_or(1);
    let bench = Bench::new(options.clone(), None)?;
    let n = bench.nranks;
    let backend = if bench.gpu.is_some() { "cuda" } else { "host" };
    println!(
        "# symm-perf {:?} --batch {items}: {n} ranks on device 0, backend {backend}, {} {}, \
         out of place, median of {} iterations after {} warm-up{}",
        options.operation,
        type_name(options.dtype),
        op_name(options.operation, options.op),
        options.iterations,
        options.warmup,
        if bench.gpu.is_some() {
            ", CUDA-graph replays timed with CUDA events"
        } else {
            ", wall time"
        }
    );
    println!(
        "# fused: one group of {items} calls per rank; separate: {items} groups of one call; \
         launches: per rank per iteration; gpu-model: predicted by the cost model with Hopper \
         constants (not measured)"
    );
    println!(
        "# {:>10} {:>9} {:>6} {:>5} | {:>22} {:>8} {:>10} | {:>22} {:>8} {:>10} | {:>7} | {:>9} {:>9} {:>9} | {:>6}",
        "size(B)",
        "count",
        "type",
        "redop",
        "fused kernel",
        "launches",
        "time(us)",
        "separate kernel",
        "launches",
        "time(us)",
        "speedup",
        "model:1",
        "model:N",
        "model:fused",
        "#wrong"
    );
    let mut all_right = true;
    for size in options.sizes() {
        let shape = bench.shape(size);
        if shape.count == 0 {
            continue;
        }
        let bytes = shape.total * bench.element();
        let fused = || bench.issue_items(shape, false, 0..items);
        let separate = || (0..items).try_for_each(|k| bench.issue_items(shape, false, k..k + 1));
        let mut wrong = 0;
        if options.check {
            wrong += bench.check_items(shape, false, items, &fused)?;
            wrong += bench.check_items(shape, false, items, &separate)?;
        }
        all_right &= wrong == 0;
        let before = launches(&bench)?;
        fused()?;
        let fused_launches = launches(&bench)? - before;
        let fused_kernel = bench.last_kernel();
        let fused_us = bench.time_with(&fused)?;
        let before = launches(&bench)?;
        separate()?;
        let separate_launches = launches(&bench)? - before;
        let separate_kernel = bench.last_kernel();
        let separate_us = bench.time_with(&separate)?;
        let (single, batch) = gpu_model(&options, shape.count, items, n as u32);
        println!(
            "  {:>10} {:>9} {:>6} {:>5} | {:>22} {:>8} {:>10.2} | {:>22} {:>8} {:>10.2} | {:>6.1}x | {:>9.2} {:>9.2} {:>11.2} | {:>6}",
            bytes,
            shape.total,
            type_name(options.dtype),
            op_name(options.operation, options.op),
            fused_kernel,
            fused_launches,
            fused_us,
            separate_kernel,
            separate_launches,
            separate_us,
            separate_us / fused_us,
            single.predicted_us,
            items as f64 * single.predicted_us,
            batch.predicted_us,
            wrong
        );
        println!(
            "#   gpu-model fused launch: {} on {} blocks x {} threads; fused / one call = {:.2}, \
             {items} separate / fused = {:.1}",
            batch.kernel.algorithm.name(),
            batch.grid,
            batch.block,
            batch.predicted_us / single.predicted_us,
            items as f64 * single.predicted_us / batch.predicted_us
        );
    }
    println!(
        "# Out of bounds values : {}",
        if all_right { "0 OK" } else { "FAILED" }
    );
    Ok(all_right)
}
