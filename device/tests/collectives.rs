//! Every collective kernel × data type × operator on the host emulation of the GPU, checked
//! against references computed independently (f64 for floats, exact 128-bit integers for
//! integers) and for bitwise equality across ranks; epoch wrap; a missing rank. The broadcast
//! and the reduce from every root, in place and not, every alignment.

mod harness;

use harness::{Ranks, Rng};
use std::fmt::Debug;
use symm_device::numeric::element::{Bf16, Element, F8E4M3, F8E5M2, F16};
use symm_device::symmetric::Algorithm;
use symm_device::symmetric::all_reduce::FLAG_IN_PLACE;
use symm_device::symmetric::dispatch::kernel;
use symm_device::symmetric::{CollectiveArgs, FLAG_REDUCE_TO_ROOT, FLAG_ROOT, KernelStatus};
use symm_device::sync::abort::timed_out_peer;
use symm_device::sync::signal_pad::{LL_MAX_BYTES, PatCollective};
use symm_device::{DataType, RedOp};

const TIMEOUT_NS: u64 = 20_000_000_000;
const BLOCKS: u32 = 2;
const THREADS: u32 = 4;

/// What the tests need of an element type beyond the kernels' `Element`.
trait Sample: Element + Debug + PartialEq {
    /// Integers compare exactly, floats within a bound.
    const INTEGER: bool;
    /// Unit roundoff of the type (floats), or 0.
    const EPS: f64;
    /// Unit roundoff of the accumulator (floats), or 0.
    const ACC_EPS: f64;
    /// Smallest positive subnormal (floats), or 0.
    const TINY: f64;
    fn random(rng: &mut Rng, op: RedOp) -> Self;
    fn value(self) -> f64;
    fn exact(self) -> i128;
    fn wrap(v: i128) -> Self;
}

macro_rules! integer_sample {
    ($($t:ty),*) => {$(
        impl Sample for $t {
            const INTEGER: bool = true;
            const EPS: f64 = 0.0;
            const ACC_EPS: f64 = 0.0;
            const TINY: f64 = 0.0;
            fn random(rng: &mut Rng, _op: RedOp) -> Self { rng.next_u64() as $t }
            fn value(self) -> f64 { self as f64 }
            fn exact(self) -> i128 { self as i128 }
            fn wrap(v: i128) -> Self { v as $t }
        }
    )*};
}
integer_sample!(i8, u8, i32, u32, i64, u64);

/// The `count` a kernel of `algorithm` takes for `count` elements of `element_bytes` bytes:
/// the all-gathers count bytes, the reductions elements.
fn kernel_count(algorithm: Algorithm, count: usize, element_bytes: usize) -> u64 {
    if algorithm.is_data_type_agnostic() {
        (count * element_bytes) as u64
    } else {
        count as u64
    }
}

/// A random float in ±[0.5, 2) for products (no underflow), else in [-2, 2).
fn random_unit(rng: &mut Rng, op: RedOp) -> f64 {
    let t = (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
    let sign = if rng.next_u64() & 1 == 0 { 1.0 } else { -1.0 };
    match op {
        RedOp::Prod => sign * (0.5 + 1.5 * t),
        _ => sign * 2.0 * t,
    }
}

macro_rules! float_sample {
    ($($t:ty, $eps:expr, $acc:expr, $tiny:expr);* $(;)?) => {$(
        impl Sample for $t {
            const INTEGER: bool = false;
            const EPS: f64 = $eps;
            const ACC_EPS: f64 = $acc;
            const TINY: f64 = $tiny;
            fn random(rng: &mut Rng, op: RedOp) -> Self {
                <$t as Element>::narrow(random_unit(rng, op) as _)
            }
            fn value(self) -> f64 { self.widen() as f64 }
            fn exact(self) -> i128 { unreachable!() }
            fn wrap(_: i128) -> Self { unreachable!() }
        }
    )*};
}
const F32_EPS: f64 = f32::EPSILON as f64 / 2.0;
float_sample! {
    f32, F32_EPS, F32_EPS, 1.4e-45;
    f64, f64::EPSILON / 2.0, f64::EPSILON / 2.0, 5e-324;
    F16, 1.0 / 2048.0, F32_EPS, 6.0e-8;
    Bf16, 1.0 / 256.0, F32_EPS, 9.2e-41;
    F8E4M3, 1.0 / 16.0, F32_EPS, 1.0 / 512.0;
    F8E5M2, 1.0 / 8.0, F32_EPS, 1.0 / 65536.0;
}

/// The sum of `values` with Neumaier's compensation (error about one rounding of the result).
fn compensated_sum(values: impl Iterator<Item = f64>) -> f64 {
    let (mut sum, mut compensation) = (0.0f64, 0.0f64);
    for v in values {
        let t = sum + v;
        compensation += if sum.abs() >= v.abs() {
            (sum - t) + v
        } else {
            (v - t) + sum
        };
        sum = t;
    }
    sum + compensation
}

/// Check `got` against the reduction of `inputs` (one value per rank) with `op`.
/// `what` names the case in a failure message (built only on failure).
fn check_reduction<T: Sample>(inputs: &[T], op: RedOp, got: T, what: &dyn Fn() -> String) {
    let n = inputs.len();
    if T::INTEGER {
        let values = inputs.iter().map(|x| x.exact());
        let exact = match op {
            RedOp::Sum => values.fold(0i128, i128::wrapping_add),
            RedOp::Prod => values.fold(1i128, i128::wrapping_mul),
            RedOp::Max => values.max().unwrap(),
            RedOp::Min => values.min().unwrap(),
            RedOp::Avg => values.sum::<i128>() / n as i128,
        };
        assert_eq!(got, T::wrap(exact), "{}: inputs {inputs:?}", what());
        return;
    }
    let values = || inputs.iter().map(|x| x.value());
    let got = got.value();
    let (exact, accumulated_error) = match op {
        RedOp::Max => (values().fold(f64::MIN, f64::max), 0.0),
        RedOp::Min => (values().fold(f64::MAX, f64::min), 0.0),
        RedOp::Sum | RedOp::Avg => {
            // Compensated (Neumaier) summation: the reference must not carry an error of its
            // own order, since the kernels may sum in another order (PAT's trees) than this.
            let sum = compensated_sum(values());
            let magnitude: f64 = values().map(f64::abs).sum();
            let error = (n as f64 - 1.0) * T::ACC_EPS * magnitude;
            if op == RedOp::Avg {
                (
                    sum / n as f64,
                    error / n as f64 + T::ACC_EPS * magnitude / n as f64,
                )
            } else {
                (sum, error)
            }
        }
        RedOp::Prod => {
            let product: f64 = values().product();
            (product, 2.0 * n as f64 * T::ACC_EPS * product.abs())
        }
    };
    let bound = accumulated_error + T::EPS * (exact.abs() + accumulated_error) + T::TINY;
    assert!(
        (got - exact).abs() <= bound,
        "{}: got {got}, expected {exact} ± {bound}, inputs {:?}",
        what(),
        values().collect::<Vec<_>>()
    );
}

/// Where a case puts its buffers (bytes from the window base).
#[derive(Clone, Copy, Debug)]
struct Placement {
    send: usize,
    recv: usize,
}

/// Run one collective and check every rank's result.
fn run_case<T: Sample>(
    world: usize,
    algorithm: Algorithm,
    op: RedOp,
    count: usize,
    in_place: bool,
    seed: u64,
) {
    if algorithm == Algorithm::Broadcast {
        let root = (seed % world as u64) as usize;
        return run_broadcast_case::<T>(world, root, count, in_place, seed);
    }
    if matches!(
        algorithm,
        Algorithm::AllToAll | Algorithm::Gather | Algorithm::Scatter
    ) {
        let root = (seed % world as u64) as usize;
        return run_segments_case(
            world,
            algorithm,
            root,
            count * std::mem::size_of::<T>(),
            in_place,
            seed,
        );
    }
    if in_place
        && matches!(
            algorithm,
            Algorithm::ReduceScatter
                | Algorithm::PatReduceScatter
                | Algorithm::AllGather
                | Algorithm::LlAllGather
                | Algorithm::PatAllGather
        )
    {
        return run_in_place_segment_case::<T>(world, algorithm, op, count, seed);
    }
    let size = std::mem::size_of::<T>();
    let per_rank_input = match algorithm {
        Algorithm::ReduceScatter | Algorithm::PatReduceScatter => world * count,
        _ => count,
    };
    let output = if algorithm.is_data_type_agnostic() {
        world * count
    } else {
        count
    };
    let region = (per_rank_input.max(output) * size).next_multiple_of(16) + 64;
    // Even seeds: 16-byte aligned buffers (the vector paths); odd seeds: offsets that are
    // multiples of the element size but not of 16 (the element paths).
    let lead = if seed.is_multiple_of(2) { 16 } else { size * 3 };
    let at = if in_place {
        Placement {
            send: lead,
            recv: lead,
        }
    } else {
        Placement {
            send: lead,
            recv: lead + region,
        }
    };
    let mut ranks = Ranks::new(world, 2 * region + 2 * lead + 64, TIMEOUT_NS);
    let mut rng = Rng(seed);
    let inputs: Vec<Vec<T>> = (0..world)
        .map(|_| {
            (0..per_rank_input)
                .map(|_| T::random(&mut rng, op))
                .collect()
        })
        .collect();
    for (rank, input) in inputs.iter().enumerate() {
        ranks.write(rank, at.send, input);
    }
    let args = CollectiveArgs {
        send_offset: at.send as u64,
        recv_offset: at.recv as u64,
        count: kernel_count(algorithm, count, size),
        flags: if in_place { FLAG_IN_PLACE } else { 0 },
    };
    // Blocks of THREADS threads, or of one for odd counts (the host backend's fast mode).
    let threads = if count % 2 == 1 { 1 } else { THREADS };
    let statuses = ranks.launch(kernel(algorithm, T::DTYPE, op), args, BLOCKS, threads, None);
    let low_latency = matches!(
        algorithm,
        Algorithm::OneShotLlAllReduce | Algorithm::LlAllGather
    );
    if low_latency && count * size > LL_MAX_BYTES {
        // Beyond the LL buffers: refused, nothing touched.
        assert!(
            statuses.iter().all(|s| *s == KernelStatus::InvalidLaunch),
            "{statuses:?}"
        );
        return;
    }
    assert!(
        statuses.iter().all(|s| *s == KernelStatus::Completed),
        "{statuses:?} {} {:?} {op:?} world {world} count {count} in_place {in_place}",
        algorithm.name(),
        T::DTYPE
    );
    let outputs: Vec<Vec<T>> = (0..world)
        .map(|rank| ranks.read(rank, at.recv, output))
        .collect();
    let what = |rank: usize, i: usize| {
        format!(
            "{} {:?} {:?} world {world} count {count} in_place {in_place} rank {rank} index {i}",
            algorithm.name(),
            T::DTYPE,
            op
        )
    };
    // Every rank must hold the same bits (reduce-scatter: each its own segment); then the
    // reference check needs only one rank's copy, except for reduce-scatter.
    if !is_reduce_scatter(algorithm) {
        for out in &outputs[1..] {
            assert!(
                bytemuck_bits(out) == bytemuck_bits(&outputs[0]),
                "ranks differ: {} {:?} {:?}",
                algorithm.name(),
                T::DTYPE,
                op
            );
        }
    }
    let checked = if is_reduce_scatter(algorithm) {
        &outputs[..]
    } else {
        &outputs[..1]
    };
    let mut column: Vec<T> = Vec::with_capacity(world);
    for (rank, out) in checked.iter().enumerate() {
        for (i, got) in out.iter().enumerate() {
            match algorithm {
                Algorithm::AllGather | Algorithm::LlAllGather | Algorithm::PatAllGather => {
                    let (source, j) = (i / count.max(1), i % count.max(1));
                    assert_eq!(*got, inputs[source][j], "{}", what(rank, i));
                }
                Algorithm::ReduceScatter | Algorithm::PatReduceScatter => {
                    column.clear();
                    column.extend(inputs.iter().map(|x| x[rank * count + i]));
                    check_reduction(&column, op, *got, &|| what(rank, i));
                }
                _ => {
                    column.clear();
                    column.extend(inputs.iter().map(|x| x[i]));
                    check_reduction(&column, op, *got, &|| what(rank, i));
                }
            }
        }
    }
}

/// Broadcast of `count` elements from `root` (in place on the root, or not; the other ranks'
/// send buffers hold other data, which must neither arrive anywhere nor change), checked bit
/// for bit on every rank; a guard element after every receive buffer must not change.
fn run_broadcast_case<T: Sample>(
    world: usize,
    root: usize,
    count: usize,
    in_place: bool,
    seed: u64,
) {
    let size = std::mem::size_of::<T>();
    let region = (count * size).next_multiple_of(16) + 64;
    // Even seeds: 16-byte aligned buffers; odd seeds: multiples of the element size only.
    let lead = if seed.is_multiple_of(2) { 16 } else { size * 3 };
    let send = lead;
    let recv = if in_place { lead } else { lead + region };
    let mut ranks = Ranks::new(world, 2 * region + 2 * lead + 64, TIMEOUT_NS);
    let mut rng = Rng(seed);
    let mut random =
        |n: usize| -> Vec<T> { (0..n).map(|_| T::random(&mut rng, RedOp::Sum)).collect() };
    let inputs: Vec<Vec<T>> = (0..world).map(|_| random(count)).collect();
    let guards: Vec<Vec<T>> = (0..world).map(|_| random(1)).collect();
    let stale: Vec<Vec<T>> = (0..world).map(|_| random(count)).collect();
    for rank in 0..world {
        ranks.write(rank, send, &inputs[rank]);
        if !in_place {
            ranks.write(rank, recv, &stale[rank]);
        }
        ranks.write(rank, recv + count * size, &guards[rank]);
    }
    let args = CollectiveArgs {
        send_offset: send as u64,
        recv_offset: recv as u64,
        count: kernel_count(Algorithm::Broadcast, count, size),
        flags: 0,
    };
    let rank_flags: Vec<u32> = (0..world)
        .map(|r| match (r == root, in_place) {
            (true, true) => FLAG_ROOT | FLAG_IN_PLACE,
            (true, false) => FLAG_ROOT,
            (false, _) => 0,
        })
        .collect();
    // Blocks of THREADS threads, or of one for half the seeds of each alignment (the host
    // backend's fast mode, whose copies move whole ranges).
    let threads = if seed % 4 >= 2 { 1 } else { THREADS };
    let statuses = ranks.launch_with_rank_flags(
        kernel(Algorithm::Broadcast, T::DTYPE, RedOp::Sum),
        args,
        BLOCKS,
        threads,
        None,
        &rank_flags,
    );
    let case = format!(
        "broadcast {:?} world {world} root {root} count {count} in_place {in_place} seed {seed}",
        T::DTYPE
    );
    assert!(
        statuses.iter().all(|s| *s == KernelStatus::Completed),
        "{case}: {statuses:?}"
    );
    for rank in 0..world {
        let out: Vec<T> = ranks.read(rank, recv, count);
        assert!(
            bytemuck_bits(&out) == bytemuck_bits(&inputs[root]),
            "{case}: rank {rank}"
        );
        let guard: Vec<T> = ranks.read(rank, recv + count * size, 1);
        assert!(
            bytemuck_bits(&guard) == bytemuck_bits(&guards[rank]),
            "{case}: rank {rank} wrote past the end"
        );
        if !in_place {
            let sent: Vec<T> = ranks.read(rank, send, count);
            assert!(
                bytemuck_bits(&sent) == bytemuck_bits(&inputs[rank]),
                "{case}: rank {rank}'s send buffer changed"
            );
        }
    }
}

/// Which ranks of a reduce carry `FLAG_IN_PLACE`: the flag means nothing off the root, and a
/// kernel must not act on it there.
#[derive(Clone, Copy, Debug)]
enum ReduceInPlace {
    /// Nobody.
    None,
    /// The root only.
    Root,
    /// Every rank (with a part longer than one in-place round: the start barrier's vote).
    Every,
}

/// Reduce of `count` elements to `root` on the one-shot kernel (`FLAG_REDUCE_TO_ROOT`),
/// checked on the root against the f64 / exact reference; the other ranks' buffers (send and
/// receive) and the guard after the root's receive buffer must not change.
fn run_reduce_case<T: Sample>(
    world: usize,
    root: usize,
    op: RedOp,
    count: usize,
    in_place: ReduceInPlace,
    seed: u64,
) {
    let size = std::mem::size_of::<T>();
    let region = (count * size).next_multiple_of(16) + 64;
    let lead = if seed.is_multiple_of(2) { 16 } else { size * 3 };
    let root_in_place = !matches!(in_place, ReduceInPlace::None);
    let send = lead;
    let recv = if root_in_place { lead } else { lead + region };
    let mut ranks = Ranks::new(world, 2 * region + 2 * lead + 64, TIMEOUT_NS);
    let mut rng = Rng(seed);
    let mut random = |n: usize| -> Vec<T> { (0..n).map(|_| T::random(&mut rng, op)).collect() };
    let inputs: Vec<Vec<T>> = (0..world).map(|_| random(count)).collect();
    let stale: Vec<Vec<T>> = (0..world).map(|_| random(count + 1)).collect();
    for rank in 0..world {
        ranks.write(rank, send, &inputs[rank]);
        // Out of place, a receive buffer and a guard element; in place, the guard after the
        // send buffer.
        if root_in_place {
            ranks.write(rank, send + count * size, &stale[rank][..1]);
        } else {
            ranks.write(rank, recv, &stale[rank]);
        }
    }
    let args = CollectiveArgs {
        send_offset: send as u64,
        recv_offset: recv as u64,
        count: count as u64,
        flags: FLAG_REDUCE_TO_ROOT,
    };
    let rank_flags: Vec<u32> = (0..world)
        .map(|r| {
            let root_flag = if r == root { FLAG_ROOT } else { 0 };
            let in_place_flag = match in_place {
                ReduceInPlace::None => 0,
                ReduceInPlace::Root if r != root => 0,
                _ => FLAG_IN_PLACE,
            };
            root_flag | in_place_flag
        })
        .collect();
    let statuses = ranks.launch_with_rank_flags(
        kernel(Algorithm::OneShotAllReduce, T::DTYPE, op),
        args,
        BLOCKS,
        THREADS,
        None,
        &rank_flags,
    );
    let case = format!(
        "reduce {:?} {op:?} world {world} root {root} count {count} {in_place:?} seed {seed}",
        T::DTYPE
    );
    assert!(
        statuses.iter().all(|s| *s == KernelStatus::Completed),
        "{case}: {statuses:?}"
    );
    let out: Vec<T> = ranks.read(root, recv, count);
    let mut column: Vec<T> = Vec::with_capacity(world);
    for (i, got) in out.iter().enumerate() {
        column.clear();
        column.extend(inputs.iter().map(|x| x[i]));
        check_reduction(&column, op, *got, &|| format!("{case}: index {i}"));
    }
    for rank in 0..world {
        if rank != root || !root_in_place {
            let sent: Vec<T> = ranks.read(rank, send, count);
            assert!(
                bytemuck_bits(&sent) == bytemuck_bits(&inputs[rank]),
                "{case}: rank {rank}'s send buffer changed"
            );
        }
        if root_in_place {
            let guard: Vec<T> = ranks.read(rank, send + count * size, 1);
            assert!(
                bytemuck_bits(&guard) == bytemuck_bits(&stale[rank][..1]),
                "{case}: rank {rank}: the element after the buffer changed"
            );
        } else {
            let received: Vec<T> = ranks.read(rank, recv, count + 1);
            let expected_tail = if rank == root { count } else { 0 };
            assert!(
                bytemuck_bits(&received[expected_tail..])
                    == bytemuck_bits(&stale[rank][expected_tail..]),
                "{case}: rank {rank} wrote where it must not"
            );
        }
    }
}

/// [`run_reduce_case`] for the Rust type of `dtype`.
fn reduce_case(
    dtype: DataType,
    world: usize,
    root: usize,
    op: RedOp,
    count: usize,
    in_place: ReduceInPlace,
    seed: u64,
) {
    let case = match dtype {
        DataType::Int8 => run_reduce_case::<i8>,
        DataType::Uint8 => run_reduce_case::<u8>,
        DataType::Int32 => run_reduce_case::<i32>,
        DataType::Uint32 => run_reduce_case::<u32>,
        DataType::Int64 => run_reduce_case::<i64>,
        DataType::Uint64 => run_reduce_case::<u64>,
        DataType::Float16 => run_reduce_case::<F16>,
        DataType::Float32 => run_reduce_case::<f32>,
        DataType::Float64 => run_reduce_case::<f64>,
        DataType::Bfloat16 => run_reduce_case::<Bf16>,
        DataType::Float8E4M3 => run_reduce_case::<F8E4M3>,
        DataType::Float8E5M2 => run_reduce_case::<F8E5M2>,
    };
    case(world, root, op, count, in_place, seed);
}

/// All-to-all, gather or scatter of `bytes` per segment from `root` (in place on the root
/// for gather and scatter when `in_place`; all-to-all has no in-place form and runs out of
/// place), checked byte for byte over every rank's whole window (`device/tests/segments.rs`
/// covers these kernels in depth; here they join the random and mixed sequences).
fn run_segments_case(
    world: usize,
    algorithm: Algorithm,
    root: usize,
    bytes: usize,
    in_place: bool,
    seed: u64,
) {
    let whole = world * bytes;
    let in_place = in_place && algorithm != Algorithm::AllToAll;
    let lead = if seed.is_multiple_of(2) { 16 } else { 3 };
    let (send, recv) = match (algorithm, in_place) {
        (Algorithm::Gather, true) => (lead + root * bytes, lead),
        (Algorithm::Scatter, true) => (lead, lead + root * bytes),
        _ => (lead, lead + whole + 16),
    };
    let window = 2 * lead + 2 * whole + 64;
    let mut ranks = Ranks::new(world, window, TIMEOUT_NS);
    let mut rng = Rng(seed);
    let before: Vec<Vec<u8>> = (0..world)
        .map(|rank| {
            let data: Vec<u8> = (0..window).map(|_| rng.next_u64() as u8).collect();
            ranks.write(rank, 0, &data);
            data
        })
        .collect();
    let args = CollectiveArgs {
        send_offset: send as u64,
        recv_offset: recv as u64,
        count: bytes as u64,
        flags: 0,
    };
    let rank_flags: Vec<u32> = (0..world)
        .map(|r| match (algorithm, r == root, in_place) {
            (Algorithm::AllToAll, _, _) | (_, false, _) => 0,
            (_, true, true) => FLAG_ROOT | FLAG_IN_PLACE,
            (_, true, false) => FLAG_ROOT,
        })
        .collect();
    // Blocks of THREADS threads, or of one for half the seeds of each alignment (the host
    // backend's fast mode, whose copies move whole ranges).
    let threads = if seed % 4 >= 2 { 1 } else { THREADS };
    let statuses = ranks.launch_with_rank_flags(
        kernel(algorithm, DataType::Uint8, RedOp::Sum),
        args,
        BLOCKS,
        threads,
        None,
        &rank_flags,
    );
    let case = format!(
        "{} world {world} root {root} bytes {bytes} in_place {in_place} seed {seed}",
        algorithm.name()
    );
    assert!(
        statuses.iter().all(|s| *s == KernelStatus::Completed),
        "{case}: {statuses:?}"
    );
    let mut want = before.clone();
    for (p, window) in want.iter_mut().enumerate() {
        for (r, sender) in before.iter().enumerate() {
            match algorithm {
                Algorithm::AllToAll => window[recv + r * bytes..][..bytes]
                    .copy_from_slice(&sender[send + p * bytes..][..bytes]),
                Algorithm::Gather if p == root => {
                    window[recv + r * bytes..][..bytes].copy_from_slice(&sender[send..][..bytes])
                }
                Algorithm::Scatter if r == root => {
                    window[recv..][..bytes].copy_from_slice(&sender[send + p * bytes..][..bytes])
                }
                _ => {}
            }
        }
    }
    for (rank, want) in want.iter().enumerate() {
        let got: Vec<u8> = ranks.read(rank, 0, window);
        if let Some(at) = (0..window).find(|&i| got[i] != want[i]) {
            panic!(
                "{case}: rank {rank}, byte {at}: {} instead of {}",
                got[at], want[at]
            );
        }
    }
}

/// In-place reduce-scatter (recv = send + rank·count) and all-gather (send = recv +
/// rank·count): the receive (resp. send) offset differs per rank, which the kernels derive
/// from the symmetric base offset; checked separately.
fn run_in_place_segment_case<T: Sample>(
    world: usize,
    algorithm: Algorithm,
    op: RedOp,
    count: usize,
    seed: u64,
) {
    let size = std::mem::size_of::<T>();
    let total = world * count;
    let lead = 16;
    let mut ranks = Ranks::new(world, lead + total * size + 64, TIMEOUT_NS);
    let mut rng = Rng(seed);
    let inputs: Vec<Vec<T>> = (0..world)
        .map(|_| (0..total).map(|_| T::random(&mut rng, op)).collect())
        .collect();
    for (rank, input) in inputs.iter().enumerate() {
        ranks.write(rank, lead, input);
    }
    let statuses: Vec<KernelStatus> = match algorithm {
        Algorithm::ReduceScatter | Algorithm::PatReduceScatter => {
            // Each rank's recv is its own segment: recv_offset differs per rank, so launch
            // each rank with its own arguments, all at once (one grid per rank, concurrently).
            launch_per_rank(&ranks, algorithm, T::DTYPE, op, world, |rank| {
                CollectiveArgs {
                    send_offset: lead as u64,
                    recv_offset: (lead + rank * count * size) as u64,
                    count: count as u64,
                    flags: 0,
                }
            })
        }
        _ => launch_per_rank(&ranks, algorithm, T::DTYPE, op, world, |rank| {
            CollectiveArgs {
                send_offset: (lead + rank * count * size) as u64,
                recv_offset: lead as u64,
                count: (count * size) as u64,
                flags: 0,
            }
        }),
    };
    if algorithm == Algorithm::LlAllGather && count * size > LL_MAX_BYTES {
        assert!(statuses.iter().all(|s| *s == KernelStatus::InvalidLaunch));
        return;
    }
    assert!(statuses.iter().all(|s| *s == KernelStatus::Completed));
    for rank in 0..world {
        match algorithm {
            Algorithm::ReduceScatter | Algorithm::PatReduceScatter => {
                let out: Vec<T> = ranks.read(rank, lead + rank * count * size, count);
                for (i, got) in out.iter().enumerate() {
                    let column: Vec<T> = inputs.iter().map(|x| x[rank * count + i]).collect();
                    let what = || format!("in-place reduce_scatter rank {rank} index {i}");
                    check_reduction(&column, op, *got, &what);
                }
            }
            _ => {
                let out: Vec<T> = ranks.read(rank, lead, total);
                for (i, got) in out.iter().enumerate() {
                    let source = i / count;
                    assert_eq!(
                        *got, inputs[source][i],
                        "in-place all_gather rank {rank} {i}"
                    );
                }
            }
        }
    }
}

/// Launch each rank in its own emulated grid, all concurrently (per-rank arguments).
fn launch_per_rank(
    ranks: &Ranks,
    algorithm: Algorithm,
    dtype: DataType,
    op: RedOp,
    world: usize,
    args: impl Fn(usize) -> CollectiveArgs + Sync,
) -> Vec<KernelStatus> {
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..world)
            .map(|rank| {
                let args = &args;
                scope.spawn(move || {
                    ranks.launch(
                        kernel(algorithm, dtype, op),
                        args(rank),
                        BLOCKS,
                        THREADS,
                        Some(&[rank]),
                    )[0]
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

fn bytemuck_bits<T: Copy>(values: &[T]) -> Vec<u8> {
    // SAFETY: the element types are plain data without padding.
    unsafe {
        std::slice::from_raw_parts(values.as_ptr().cast::<u8>(), std::mem::size_of_val(values))
    }
    .to_vec()
}

/// A test case for one element type: (world, algorithm, op, count, in place, seed).
type Case<'a> = &'a dyn Fn(usize, Algorithm, RedOp, usize, bool, u64);

/// Run `case` for the Rust type of `dtype`.
fn for_type(dtype: DataType, case: &mut dyn FnMut(Case<'_>)) {
    match dtype {
        DataType::Int8 => case(&run_case::<i8>),
        DataType::Uint8 => case(&run_case::<u8>),
        DataType::Int32 => case(&run_case::<i32>),
        DataType::Uint32 => case(&run_case::<u32>),
        DataType::Int64 => case(&run_case::<i64>),
        DataType::Uint64 => case(&run_case::<u64>),
        DataType::Float16 => case(&run_case::<F16>),
        DataType::Float32 => case(&run_case::<f32>),
        DataType::Float64 => case(&run_case::<f64>),
        DataType::Bfloat16 => case(&run_case::<Bf16>),
        DataType::Float8E4M3 => case(&run_case::<F8E4M3>),
        DataType::Float8E5M2 => case(&run_case::<F8E5M2>),
    }
}

/// `true` for the reduce-scatter kernels (each rank checks its own segment).
fn is_reduce_scatter(algorithm: Algorithm) -> bool {
    matches!(
        algorithm,
        Algorithm::ReduceScatter | Algorithm::PatReduceScatter
    )
}

const REDUCTIONS: [Algorithm; 5] = [
    Algorithm::OneShotAllReduce,
    Algorithm::OneShotLlAllReduce,
    Algorithm::TwoShotAllReduce,
    Algorithm::ReduceScatter,
    Algorithm::PatReduceScatter,
];

#[test]
fn every_dtype_op_and_reduction_for_1_to_8_ranks() {
    let mut seed = 1;
    for world in 1..=8 {
        for dtype in DataType::ALL {
            for op in RedOp::ALL {
                for algorithm in REDUCTIONS {
                    for (k, count) in [1usize, 7, 1023, 4099].into_iter().enumerate() {
                        // Alternate placements so every (world, dtype, op, algorithm) sees both.
                        let in_place = (k + world) % 2 == 0;
                        seed += 1;
                        for_type(dtype, &mut |case| {
                            case(world, algorithm, op, count, in_place, seed)
                        });
                    }
                }
            }
        }
    }
}

/// More ranks than one group of loads in flight (`vector::reduce_pack` loads up to 8 ranks'
/// packs at once for two-shot and reduce-scatter, 4 for one-shot, and the rest in groups of up
/// to 4): every remainder of the later groups (9 = 8 + 1, 10 = 8 + 2, 11 = 8 + 3, 12 = 8 + 4,
/// 17 = 8 + 4 + 4 + 1), with the widths that group (2, 4, 8 bytes) and one that does not.
#[test]
fn pack_reductions_for_9_to_17_ranks() {
    let mut seed = 7000;
    for world in [9, 10, 11, 12, 17] {
        for dtype in [
            DataType::Bfloat16,
            DataType::Float32,
            DataType::Int64,
            DataType::Uint8,
        ] {
            for op in [RedOp::Sum, RedOp::Max] {
                for algorithm in [
                    Algorithm::OneShotAllReduce,
                    Algorithm::TwoShotAllReduce,
                    Algorithm::ReduceScatter,
                ] {
                    for (k, count) in [1usize, 1029].into_iter().enumerate() {
                        let in_place = (k + world) % 2 == 0;
                        seed += 1;
                        for_type(dtype, &mut |case| {
                            case(world, algorithm, op, count, in_place, seed)
                        });
                    }
                }
            }
        }
    }
}

#[test]
fn all_gather_for_1_to_8_ranks_every_alignment() {
    for world in 1..=8 {
        for dtype in [
            DataType::Int8,
            DataType::Float16,
            DataType::Float32,
            DataType::Float64,
        ] {
            for count in [0usize, 1, 7, 1023, 4099] {
                for in_place in [false, true] {
                    if count == 0 && in_place {
                        continue;
                    }
                    for_type(dtype, &mut |case| {
                        case(world, Algorithm::AllGather, RedOp::Sum, count, in_place, 9)
                    });
                }
            }
        }
    }
}

/// All-gather of 1 Mi + 5 elements per rank (reductions at that size: below), aligned and
/// unaligned, in place and out of place.
#[test]
fn all_gather_at_a_mebi_element_and_a_tail() {
    let count = (1 << 20) + 5;
    for world in [3, 8] {
        for in_place in [false, true] {
            for dtype in [DataType::Uint8, DataType::Bfloat16, DataType::Float64] {
                // Odd seeds: unaligned offsets; even: 16-byte aligned.
                let seed = world as u64 + in_place as u64 + dtype.size_bytes() as u64;
                for_type(dtype, &mut |case| {
                    case(
                        world,
                        Algorithm::AllGather,
                        RedOp::Sum,
                        count,
                        in_place,
                        seed,
                    )
                });
            }
        }
    }
}

/// 1 Mi + 5 elements (full packs plus a tail) for every dtype × op × reduction at 3 and 8
/// ranks; in place and out of place alternate with the op, so every (dtype, algorithm, ranks)
/// sees both. Reduce-scatter receives 1 Mi / ranks + 5 elements per rank (a send buffer of
/// about 1 Mi elements, as in nccl-tests' sizes).
#[test]
fn every_dtype_op_and_reduction_at_a_mebi_element_and_a_tail() {
    for world in [3, 8] {
        for dtype in DataType::ALL {
            for op in RedOp::ALL {
                for algorithm in REDUCTIONS {
                    if algorithm == Algorithm::OneShotLlAllReduce && world == 8 {
                        // Refused beyond the LL buffers (that refusal is checked at 3 ranks).
                        continue;
                    }
                    if algorithm == Algorithm::PatReduceScatter {
                        // No 16-byte path to reach; its many rounds per block are checked in
                        // pat_reduce_scatter_in_many_rounds.
                        continue;
                    }
                    let count = if is_reduce_scatter(algorithm) {
                        (1 << 20) / world + 5
                    } else {
                        (1 << 20) + 5
                    };
                    let in_place = (op as usize + world).is_multiple_of(2);
                    let seed = (world * 100 + op as usize) as u64;
                    for_type(dtype, &mut |case| {
                        case(world, algorithm, op, count, in_place, seed)
                    });
                }
            }
        }
    }
}

/// The broadcast from every root of 1 to 8 ranks, one data type of each size (its kernel moves
/// bytes: the sizes give the alignments; every type goes through the C ABI), odd counts, in
/// place and out of place.
#[test]
fn broadcast_from_every_root_for_1_to_8_ranks() {
    let mut seed = 0;
    for world in 1..=8 {
        for root in 0..world {
            for dtype in [
                DataType::Uint8,
                DataType::Bfloat16,
                DataType::Float32,
                DataType::Int64,
            ] {
                for count in [0usize, 1, 7, 1023, 4099] {
                    for in_place in [false, true] {
                        seed += 1;
                        for_type(dtype, &mut |case| {
                            // `run_case` takes the root from the seed.
                            let seed = seed * world as u64 + root as u64;
                            case(
                                world,
                                Algorithm::Broadcast,
                                RedOp::Sum,
                                count,
                                in_place,
                                seed,
                            )
                        });
                    }
                }
            }
        }
    }
}

/// Reduce on every root of 1 to 6 ranks, every data type and operator, in place on the root or
/// not, with the in-place flag also on the other ranks, which must ignore it.
#[test]
fn reduce_to_every_root_for_1_to_6_ranks() {
    let mut seed = 0;
    for world in 1..=6 {
        for root in 0..world {
            for dtype in DataType::ALL {
                for (k, count) in [1usize, 7, 1023, 4099].into_iter().enumerate() {
                    seed += 1;
                    let op = RedOp::ALL[(seed as usize + k) % RedOp::ALL.len()];
                    let in_place = [
                        ReduceInPlace::None,
                        ReduceInPlace::Root,
                        ReduceInPlace::Every,
                    ][(seed as usize) % 3];
                    reduce_case(dtype, world, root, op, count, in_place, seed);
                }
            }
        }
    }
}

/// A reduce whose block parts are longer than one in-place round of packs, every rank flagged
/// in place: the start barrier's vote must not let the ranks share the reduction out (which
/// would store into every rank).
#[test]
fn reduce_longer_than_an_in_place_round() {
    let count =
        (BLOCKS * THREADS) as usize * symm_device::symmetric::all_reduce::UNROLL as usize * 8 + 5;
    for (world, root) in [(2, 1), (3, 0), (4, 2)] {
        for in_place in [
            ReduceInPlace::Every,
            ReduceInPlace::Root,
            ReduceInPlace::None,
        ] {
            reduce_case(
                DataType::Float32,
                world,
                root,
                RedOp::Sum,
                count,
                in_place,
                2,
            );
            reduce_case(
                DataType::Bfloat16,
                world,
                root,
                RedOp::Max,
                count,
                in_place,
                3,
            );
        }
    }
}

#[test]
fn count_zero_touches_nothing() {
    for algorithm in REDUCTIONS {
        run_case::<f32>(4, algorithm, RedOp::Sum, 0, false, 1);
    }
}

#[test]
fn a_thousand_calls_across_the_epoch_wrap() {
    let world = 4;
    let count = 37;
    let mut ranks = Ranks::new(world, 4096, TIMEOUT_NS);
    // Cross the u32 wrap of the barrier epochs (the LL flag period is crossed in
    // tests/low_latency.rs).
    ranks.set_epochs(u32::MAX - 1500, 0xFFFF_FFFF - 700);
    let mut rng = Rng(77);
    for iteration in 0..1000 {
        let algorithm = [
            Algorithm::OneShotAllReduce,
            Algorithm::OneShotLlAllReduce,
            Algorithm::TwoShotAllReduce,
        ][iteration % 3];
        let inputs: Vec<Vec<i32>> = (0..world)
            .map(|_| (0..count).map(|_| (rng.next_u64() % 1000) as i32).collect())
            .collect();
        for (rank, input) in inputs.iter().enumerate() {
            ranks.write(rank, 64, input);
        }
        let args = CollectiveArgs {
            send_offset: 64,
            recv_offset: 64,
            count: count as u64,
            flags: FLAG_IN_PLACE,
        };
        let statuses = ranks.launch(
            kernel(algorithm, DataType::Int32, RedOp::Sum),
            args,
            2,
            4,
            None,
        );
        assert!(
            statuses.iter().all(|s| *s == KernelStatus::Completed),
            "iteration {iteration}"
        );
        for rank in 0..world {
            let out: Vec<i32> = ranks.read(rank, 64, count);
            for (i, v) in out.iter().enumerate() {
                assert_eq!(
                    *v,
                    inputs.iter().map(|x| x[i]).sum::<i32>(),
                    "iteration {iteration}"
                );
            }
        }
    }
}

#[test]
fn a_missing_rank_makes_the_others_time_out_not_hang() {
    let timeout_ns = 50_000_000;
    // Every kernel, the reduce (the one-shot kernel with its flag, the missing rank its root)
    // among them.
    let cases = Algorithm::COLLECTIVES
        .map(|algorithm| (algorithm, 0))
        .into_iter()
        .chain([(Algorithm::OneShotAllReduce, FLAG_REDUCE_TO_ROOT)]);
    for (algorithm, flags) in cases {
        let ranks = Ranks::new(3, 4096, timeout_ns);
        let args = CollectiveArgs {
            send_offset: 0,
            recv_offset: 1024,
            count: 16,
            flags,
        };
        let start = std::time::Instant::now();
        let statuses = ranks.launch(
            kernel(algorithm, DataType::Float32, RedOp::Sum),
            args,
            2,
            4,
            Some(&[0, 2]),
        );
        let elapsed = start.elapsed();
        assert_eq!(statuses, vec![KernelStatus::Aborted; 2]);
        assert!(ranks.aborted(0) && ranks.aborted(2) && !ranks.aborted(1));
        if matches!(
            algorithm,
            Algorithm::OneShotLlAllReduce | Algorithm::LlAllGather
        ) {
            // The LL waits time out on a line of the missing rank (or see the other rank's
            // abort first): a timed-out wait names rank 1.
            let named: Vec<Option<u32>> = [0, 2]
                .map(|r| timed_out_peer(ranks.abort_word(r)))
                .into_iter()
                .collect();
            assert!(
                named.contains(&Some(1)) && named.iter().all(|n| n.is_none() || *n == Some(1)),
                "{algorithm:?}: abort words name {named:?}, want rank 1"
            );
        }
        assert!(
            elapsed >= std::time::Duration::from_millis(50),
            "{elapsed:?}"
        );
        assert!(elapsed < std::time::Duration::from_secs(5), "{elapsed:?}");
        // An aborted window refuses further work at once.
        let again = ranks.launch(
            kernel(algorithm, DataType::Float32, RedOp::Sum),
            args,
            2,
            4,
            Some(&[0]),
        );
        assert_eq!(again, vec![KernelStatus::Aborted]);
    }
}

/// The epoch each of blocks 0 and 1 of rank `from` last announced in rank `rank`'s inbox.
fn announced_to(ranks: &Ranks, rank: usize, from: u32) -> Vec<u32> {
    (0..2).map(|b| ranks.inbox(rank, b, from)).collect()
}

/// Fill `len` bytes at offset 1024 of rank `rank`'s window with `byte`; returns what was
/// written, to compare the window with after a launch that must not store there.
fn plant(ranks: &mut Ranks, rank: usize, byte: u8, len: usize) -> Vec<u8> {
    let pattern = vec![byte; len];
    ranks.window(rank)[1024..1024 + len].copy_from_slice(&pattern);
    pattern
}

/// The failure tests' call: 64 elements from offset 0 of the window into offset 1024.
const SMALL_CALL: CollectiveArgs = CollectiveArgs {
    send_offset: 0,
    recv_offset: 1024,
    count: 64,
    flags: 0,
};

/// Launch `algorithm` (float32 sum) of [`SMALL_CALL`] on 2 blocks of 4 threads on the ranks in
/// `active` (`None`: every rank); each rank's status.
fn launch_small_call(
    ranks: &Ranks,
    algorithm: Algorithm,
    active: Option<&[usize]>,
) -> Vec<KernelStatus> {
    ranks.launch(
        kernel(algorithm, DataType::Float32, RedOp::Sum),
        SMALL_CALL,
        2,
        4,
        active,
    )
}

/// A rank whose block gave up a barrier after announcing it has its epoch ahead of a late peer.
/// Rank 1's start announcement is planted (as if it had passed the start barrier and stalled);
/// rank 0 runs the two-shot all-reduce (start and end barrier) alone, stores its reduced half
/// into rank 1's window, and gives up at the end barrier (epoch 2). Rank 1's late call then
/// completes on rank 0's announcements (rank 0 did its part), while rank 0's next launch runs:
/// that launch must announce nothing, since its start (epoch 3) is what rank 1's next call
/// waits for, which would then store its half into rank 0's window for a call that rank 0 gave
/// up and returned. Fails without the out-of-step mark that the abandoning block sets, or
/// without the start barrier's read of it.
#[test]
fn a_block_that_gave_up_a_barrier_never_releases_a_late_peer() {
    // A bound long enough that both blocks of a launch have started (and announced) before
    // either gives up: a block that starts after another gave up finds the window out of step.
    let mut ranks = Ranks::new(2, 4096, 200_000_000);
    let launch = |ranks: &Ranks, active: &[usize]| {
        launch_small_call(ranks, Algorithm::TwoShotAllReduce, Some(active))
    };
    for block in 0..2 {
        let slot = symm_device::sync::signal_pad::inbox_slot(ranks.pad_address(0), block, 1);
        // SAFETY: a slot inside rank 0's pad; no kernel runs.
        unsafe { slot.write_volatile(1) };
    }
    assert_eq!(launch(&ranks, &[0]), vec![KernelStatus::Aborted]);
    let announced = announced_to(&ranks, 1, 0);
    assert_eq!(announced, [2, 2], "rank 0 gave up at its end barrier");
    let start = std::time::Instant::now();
    assert_eq!(
        launch(&ranks, &[0, 1]),
        vec![KernelStatus::Aborted, KernelStatus::Completed],
        "rank 0's next launch, rank 1's late call"
    );
    let after = announced_to(&ranks, 1, 0);
    assert_eq!(after, announced, "rank 0's next launch announced");
    // Rank 1's next call finds no start announcement of rank 0's and stores nothing into it.
    let pattern = plant(&mut ranks, 0, 0xC3, 64 * 4);
    assert_eq!(launch(&ranks, &[1]), vec![KernelStatus::Aborted]);
    assert_eq!(
        &ranks.window(0)[1024..1024 + pattern.len()],
        &pattern[..],
        "rank 1 stored into rank 0's window"
    );
    assert!(start.elapsed() < std::time::Duration::from_secs(5));
}

/// A kernel that starts after the host failed its rank's communicator (the abort word raised,
/// this rank's epochs still in step) while a peer's block has already announced the start of
/// the same call and given up: the kernel passes its start barrier on that stale announcement,
/// and must give up there, before its body stores into the peer's window (the peer's call has
/// returned; its memory may hold anything by now). Fails without the start barrier's look at
/// the abort word (`first_barrier_round`).
#[test]
fn a_kernel_starting_on_a_failed_communicator_stores_nothing_into_a_peer() {
    let mut ranks = Ranks::new(2, 4096, 50_000_000);
    let launch = |ranks: &Ranks, active: &[usize]| {
        launch_small_call(ranks, Algorithm::AllGather, Some(active))
    };
    // Rank 1 makes the call alone: it announces the start barrier and times out.
    assert_eq!(launch(&ranks, &[1]), vec![KernelStatus::Aborted]);
    assert!((0..2).all(|b| ranks.inbox(0, b, 1) == 1));
    // The host fails rank 0's communicator; rank 0's call starts only now.
    ranks.raise_abort(0, symm_device::symmetric::ABORT_PEER_FAILED);
    let pattern = plant(&mut ranks, 1, 0xA5, 2 * 64 * 4);
    let start = std::time::Instant::now();
    assert_eq!(launch(&ranks, &[0]), vec![KernelStatus::Aborted]);
    assert_eq!(
        &ranks.window(1)[1024..1024 + pattern.len()],
        &pattern[..],
        "rank 0 stored into rank 1's window after the communicator failed"
    );
    assert!(start.elapsed() < std::time::Duration::from_secs(5));
    // Rank 0's blocks announced the start and gave up (a block that ran after another had
    // given up found the window out of step and announced nothing): the window is out of step,
    // and the next launch announces nothing (its slots in rank 1's inbox are cleared first: an
    // abandoned start stores no epoch, so an announcement would carry the same value).
    let seen = announced_to(&ranks, 1, 0);
    assert!(
        seen.iter().all(|e| *e <= 1) && seen.contains(&1),
        "{seen:?}"
    );
    let mark = symm_device::sync::signal_pad::out_of_step_slot(ranks.pad_address(0));
    // SAFETY: slots inside the pads; no kernel runs.
    unsafe {
        assert_eq!(mark.read_volatile(), 1, "rank 0's window is not marked");
        for block in 0..2 {
            symm_device::sync::signal_pad::inbox_slot(ranks.pad_address(1), block, 0)
                .write_volatile(0);
        }
    }
    assert_eq!(launch(&ranks, &[0]), vec![KernelStatus::Aborted]);
    let again = announced_to(&ranks, 1, 0);
    assert_eq!(again, [0, 0], "the next launch announced");
}

/// A PAT kernel that starts after the host failed its rank's communicator, while a peer has
/// already posted its readiness for the same call and given up: the kernel's first readiness
/// wait is satisfied by that stale flag, and the kernel must give up there, before storing
/// into the peer (all-gather: its receive buffer; reduce-scatter: the inbox in its pad). Fails
/// without the look at the abort word that the first readiness wait compares
/// (`PatRounds::look_at_abort`).
#[test]
fn a_pat_kernel_starting_on_a_failed_communicator_stores_nothing_into_a_peer() {
    use symm_device::sync::signal_pad::{PAT_SLOT_BYTES, pat_staging_offset};
    for algorithm in [Algorithm::PatAllGather, Algorithm::PatReduceScatter] {
        let mut ranks = Ranks::new(2, 4096, 50_000_000);
        let launch =
            |ranks: &Ranks, active: &[usize]| launch_small_call(ranks, algorithm, Some(active));
        // Rank 1 makes the call alone: it posts its readiness and times out.
        assert_eq!(
            launch(&ranks, &[1]),
            vec![KernelStatus::Aborted],
            "{algorithm:?}"
        );
        // The host fails rank 0's communicator; rank 0's call starts only now. Rank 1's
        // receive buffer and inbox hold a pattern that no store of rank 0 may change.
        ranks.raise_abort(0, symm_device::symmetric::ABORT_PEER_FAILED);
        let pattern = plant(&mut ranks, 1, 0xA5, 2 * 64 * 4);
        let inbox = (ranks.pad_address(1) as usize + pat_staging_offset(2)) as *mut u8;
        // SAFETY: the staging area of rank 1's pad (one slot for 2 ranks); no kernel runs.
        unsafe { inbox.write_bytes(0x5A, PAT_SLOT_BYTES) };
        let start = std::time::Instant::now();
        assert_eq!(
            launch(&ranks, &[0]),
            vec![KernelStatus::Aborted],
            "{algorithm:?}"
        );
        assert!(start.elapsed() < std::time::Duration::from_secs(5));
        assert_eq!(
            &ranks.window(1)[1024..1024 + pattern.len()],
            &pattern[..],
            "{algorithm:?}: rank 0 stored into rank 1's window after the communicator failed"
        );
        // SAFETY: as above.
        let staged = unsafe { std::slice::from_raw_parts(inbox, PAT_SLOT_BYTES) };
        assert!(
            staged.iter().all(|b| *b == 0x5A),
            "{algorithm:?}: rank 0 stored into rank 1's inbox after the communicator failed"
        );
    }
}

/// A launch that refused its arguments announced nothing that its peers, who made the same call
/// with valid arguments, wait for: the rank's next launch must not announce either, or the
/// peer's waiting call would pass its start barrier and store into this rank's window for a
/// call this rank never made. The refusal marks the window out of step. Fails without the
/// mark (`report_invalid_launch`) or without the first round's read of it.
#[test]
fn a_refused_launch_keeps_the_next_launch_from_announcing() {
    use symm_device::symmetric::{TaskArgs, report_invalid_launch};
    let mut ranks = Ranks::new(2, 4096, 50_000_000);
    let context = ranks.context_address(0) as u64;
    let table = [TaskArgs {
        send_context: context,
        recv_context: context,
        send_offset: 0,
        recv_offset: 1024,
        count: 64,
        first_cell: 0,
        flags: 0,
        reserved: 0,
        counts_context: 0,
        counts_offset: 0,
        send_capacity: 0,
    }];
    let refused = ranks.run_per_rank(2, 4, Some(&[0]), &|_| {
        // SAFETY: a one-rank table of one task over a live context.
        unsafe { report_invalid_launch(table.as_ptr(), 1, 1) };
        0
    });
    assert_eq!(refused, vec![0]);
    assert_eq!(
        ranks.abort_word(0),
        symm_device::symmetric::ABORT_INVALID_LAUNCH
    );
    let pattern = plant(&mut ranks, 0, 0x5A, 2 * 64 * 4);
    // Rank 1 makes the refused call now; rank 0 its next one.
    let statuses = launch_small_call(&ranks, Algorithm::AllGather, None);
    assert_eq!(statuses, vec![KernelStatus::Aborted; 2]);
    assert!(
        (0..2).all(|b| ranks.inbox(1, b, 0) == 0),
        "rank 0's next launch announced"
    );
    assert_eq!(
        &ranks.window(0)[1024..1024 + pattern.len()],
        &pattern[..],
        "rank 1 stored into rank 0's window"
    );
}

/// A one-shot launch on a window out of step must not write its vote: a peer of the abandoned
/// call may still read the vote this rank wrote there (`sync_unanimous`), and a changed vote
/// could send that peer down the wrong branch. The launch gives up before the vote and
/// announces nothing.
#[test]
fn a_launch_on_a_window_out_of_step_writes_no_vote() {
    use symm_device::sync::signal_pad::{out_of_step_slot, vote_slot};
    let ranks = Ranks::new(2, 1 << 16, 50_000_000);
    let pad = ranks.pad_address(0);
    // SAFETY: slots inside rank 0's pad; no kernel runs.
    unsafe {
        out_of_step_slot(pad).write_volatile(1);
        vote_slot(pad, 0).write_volatile(7);
        vote_slot(pad, 1).write_volatile(7);
    }
    // In place on both ranks, and long enough per block to vote.
    let args = CollectiveArgs {
        send_offset: 0,
        recv_offset: 0,
        count: 8192,
        flags: FLAG_IN_PLACE,
    };
    let statuses = ranks.launch(
        kernel(Algorithm::OneShotAllReduce, DataType::Float32, RedOp::Sum),
        args,
        2,
        4,
        Some(&[0]),
    );
    assert_eq!(statuses, vec![KernelStatus::Aborted]);
    // SAFETY: as above.
    let votes = unsafe {
        [
            vote_slot(pad, 0).read_volatile(),
            vote_slot(pad, 1).read_volatile(),
        ]
    };
    assert_eq!(votes, [7, 7], "the launch wrote its vote");
    assert!((0..2).all(|b| ranks.inbox(1, b, 0) == 0), "it announced");
}

/// The host raises the abort word of a rank whose communicator failed elsewhere: a launch of
/// that rank gives up long before its bound, every time (the first launch at its start
/// barrier's look at the word, the second before announcing: the first left its window out of
/// step).
#[test]
fn a_raised_abort_word_ends_a_wait_early_and_later_launches_refuse() {
    let mut ranks = Ranks::new(2, 4096, 20_000_000_000);
    ranks.raise_abort(0, symm_device::symmetric::ABORT_PEER_FAILED);
    for _ in 0..2 {
        let start = std::time::Instant::now();
        let statuses = launch_small_call(&ranks, Algorithm::TwoShotAllReduce, Some(&[0]));
        assert_eq!(statuses, vec![KernelStatus::Aborted]);
        assert!(start.elapsed() < std::time::Duration::from_secs(5));
    }
    assert_eq!(
        ranks.abort_word(0),
        symm_device::symmetric::ABORT_PEER_FAILED,
        "the host's cause stays"
    );
}

/// PAT all-gather and reduce-scatter for every world size from 1 to 64 (every step count up to
/// 6, powers of two and not), small odd counts, a dtype of each width in turn, in place and out
/// of place.
#[test]
fn pat_for_1_to_64_ranks() {
    let cases = [
        (DataType::Int8, RedOp::Sum),
        (DataType::Float16, RedOp::Avg),
        (DataType::Uint32, RedOp::Max),
        (DataType::Float32, RedOp::Sum),
        (DataType::Int64, RedOp::Avg),
        (DataType::Float64, RedOp::Prod),
    ];
    for world in 1..=64usize {
        for (i, algorithm) in [Algorithm::PatAllGather, Algorithm::PatReduceScatter]
            .into_iter()
            .enumerate()
        {
            let (dtype, op) = cases[(world + 3 * i) % cases.len()];
            let seed = (world * 2 + i) as u64;
            let count = 1 + (world * 7 + i) % 13;
            let in_place = (world + i) % 3 == 0;
            for_type(dtype, &mut |case| {
                case(world, algorithm, op, count, in_place, seed)
            });
        }
    }
}

/// Reduce-scatter counts far beyond one inbox slot (many rounds per block), for several grids.
#[test]
fn pat_reduce_scatter_in_many_rounds() {
    for world in [2, 5, 8] {
        for (dtype, op) in [
            (DataType::Float32, RedOp::Sum),
            (DataType::Int64, RedOp::Sum),
            (DataType::Bfloat16, RedOp::Max),
        ] {
            let count = 40_000 + world;
            for_type(dtype, &mut |case| {
                case(
                    world,
                    Algorithm::PatReduceScatter,
                    op,
                    count,
                    world % 2 == 0,
                    world as u64,
                )
            });
        }
    }
}

/// PAT calls mixed with every other algorithm on one window, with changing grids and counts,
/// across the u32 wrap of the PAT round counters and the barrier epochs: every result exact.
#[test]
fn pat_mixed_with_every_algorithm_on_one_window() {
    for world in [3, 6, 8] {
        let mut ranks = Ranks::new(world, 1 << 16, TIMEOUT_NS);
        ranks.set_epochs(u32::MAX - 300, 0xFFFF_FFFF - 150);
        ranks.set_pat_rounds(u32::MAX - 40);
        let mut rng = Rng(world as u64 * 31);
        for iteration in 0..240 {
            let algorithm =
                Algorithm::COLLECTIVES[rng.next_u64() as usize % Algorithm::COLLECTIVES.len()];
            let blocks = 1 + (rng.next_u64() % 4) as u32;
            let count = 1 + (rng.next_u64() % 300) as usize;
            let (send, recv) = (64usize, 64 + 4 * world * count + 64);
            let input_len = match algorithm {
                _ if is_reduce_scatter(algorithm) => world * count,
                Algorithm::AllToAll | Algorithm::Scatter => world * count,
                _ => count,
            };
            let inputs: Vec<Vec<i32>> = (0..world)
                .map(|_| {
                    (0..input_len)
                        .map(|_| (rng.next_u64() % 2001) as i32 - 1000)
                        .collect()
                })
                .collect();
            for (rank, input) in inputs.iter().enumerate() {
                ranks.write(rank, send, input);
            }
            let args = CollectiveArgs {
                send_offset: send as u64,
                recv_offset: recv as u64,
                count: kernel_count(algorithm, count, 4),
                flags: 0,
            };
            // A broadcast's root: its entry carries the flag.
            let root = iteration % world;
            let rank_flags: Vec<u32> = (0..world)
                .map(|r| match algorithm {
                    Algorithm::Broadcast | Algorithm::Gather | Algorithm::Scatter if r == root => {
                        FLAG_ROOT
                    }
                    _ => 0,
                })
                .collect();
            if algorithm == Algorithm::Gather {
                // Off the root the receive buffer keeps what it held: make it known.
                for rank in 0..world {
                    ranks.write(rank, recv, &vec![7i32; world * count]);
                }
            }
            let statuses = ranks.launch_with_rank_flags(
                kernel(algorithm, DataType::Int32, RedOp::Sum),
                args,
                blocks,
                4,
                None,
                &rank_flags,
            );
            assert!(
                statuses.iter().all(|s| *s == KernelStatus::Completed),
                "world {world} iteration {iteration} {} {statuses:?}",
                algorithm.name()
            );
            for rank in 0..world {
                let what = || {
                    format!(
                        "world {world} iteration {iteration} {} rank {rank}",
                        algorithm.name()
                    )
                };
                if algorithm == Algorithm::Broadcast {
                    let out: Vec<i32> = ranks.read(rank, recv, count);
                    assert_eq!(out, inputs[root], "{}", what());
                } else if algorithm == Algorithm::AllToAll {
                    let out: Vec<i32> = ranks.read(rank, recv, world * count);
                    let expected: Vec<i32> = inputs
                        .iter()
                        .flat_map(|x| x[rank * count..(rank + 1) * count].to_vec())
                        .collect();
                    assert_eq!(out, expected, "{}", what());
                } else if algorithm == Algorithm::Gather {
                    let out: Vec<i32> = ranks.read(rank, recv, world * count);
                    let expected: Vec<i32> = if rank == root {
                        inputs.concat()
                    } else {
                        vec![7; world * count]
                    };
                    assert_eq!(out, expected, "{}", what());
                } else if algorithm == Algorithm::Scatter {
                    let out: Vec<i32> = ranks.read(rank, recv, count);
                    assert_eq!(
                        out,
                        inputs[root][rank * count..(rank + 1) * count],
                        "{}",
                        what()
                    );
                } else if algorithm.is_data_type_agnostic() {
                    let out: Vec<i32> = ranks.read(rank, recv, world * count);
                    let expected: Vec<i32> = inputs.concat();
                    assert_eq!(out, expected, "{}", what());
                } else if is_reduce_scatter(algorithm) {
                    let out: Vec<i32> = ranks.read(rank, recv, count);
                    let expected: Vec<i32> = (0..count)
                        .map(|i| inputs.iter().map(|x| x[rank * count + i]).sum())
                        .collect();
                    assert_eq!(out, expected, "{}", what());
                } else {
                    let out: Vec<i32> = ranks.read(rank, recv, count);
                    let expected: Vec<i32> = (0..count)
                        .map(|i| inputs.iter().map(|x| x[i]).sum())
                        .collect();
                    assert_eq!(out, expected, "{}", what());
                }
            }
        }
        // Every block index counted the same rounds on every rank.
        for collective in [PatCollective::Gather, PatCollective::Scatter] {
            for block in 0..4 {
                let first = ranks.pat_rounds(0, collective, block);
                for rank in 1..world {
                    assert_eq!(
                        ranks.pat_rounds(rank, collective, block),
                        first,
                        "{collective:?} block {block}"
                    );
                }
            }
        }
    }
}

/// PAT all-gather with send buffers of different alignment on different ranks (a window may be
/// registered at any offset of an allocation), so ranks copy in different units: each block
/// must still forward exactly the bytes whose arrival it waited for. Fresh bytes every call,
/// so a forwarded stale byte shows; every rank's result is compared exactly.
#[test]
fn pat_all_gather_with_differently_aligned_send_buffers() {
    let shift_sets: [&[usize]; 3] = [&[0, 4], &[0, 4, 0, 8, 0, 0, 12, 0], &[8, 0, 4, 1]];
    for world in 2..=8usize {
        for shifts in shift_sets {
            for bytes in [48usize, 1000, 4100] {
                let mut send = Ranks::with_base_shifts(world, bytes, TIMEOUT_NS, shifts);
                let mut recv = Ranks::new(world, world * bytes + 64, TIMEOUT_NS);
                let mut rng = Rng((world * 1000 + bytes + shifts.len()) as u64);
                for call in 0..40 {
                    let blocks = 2 + (call % 3) as u32;
                    let threads = 1 + (call % 2) as u32;
                    let inputs: Vec<Vec<u8>> = (0..world)
                        .map(|_| (0..bytes).map(|_| rng.next_u64() as u8).collect())
                        .collect();
                    for (rank, input) in inputs.iter().enumerate() {
                        send.write(rank, 0, input);
                    }
                    let args = CollectiveArgs {
                        send_offset: 0,
                        recv_offset: 16,
                        count: bytes as u64,
                        flags: 0,
                    };
                    let statuses = recv.launch_with_send_windows(
                        &send,
                        kernel(Algorithm::PatAllGather, DataType::Int8, RedOp::Sum),
                        args,
                        blocks,
                        threads,
                    );
                    assert!(
                        statuses.iter().all(|s| *s == KernelStatus::Completed),
                        "{statuses:?}"
                    );
                    let expected = inputs.concat();
                    for rank in 0..world {
                        let out: Vec<u8> = recv.read(rank, 16, world * bytes);
                        assert!(
                            out == expected,
                            "world {world} shifts {shifts:?} bytes {bytes} call {call} rank {rank}: \
                             first wrong byte {:?}",
                            out.iter().zip(&expected).position(|(a, b)| a != b)
                        );
                    }
                }
            }
        }
    }
}

/// Each PAT collective counts its own rounds: with the reduce-scatter counters and flags far
/// ahead (half the u32 range and more, as after that many reduce-scatter rounds and no
/// all-gather), all-gather still waits for this call's data, and the reverse. A rank that
/// stays out must make the others time out rather than complete on stale flags.
#[test]
fn pat_collectives_count_rounds_apart() {
    let world = 4;
    let count = 100;
    for (ahead, behind) in [
        (PatCollective::Scatter, PatCollective::Gather),
        (PatCollective::Gather, PatCollective::Scatter),
    ] {
        for lead in [1u32 << 31, (1u32 << 31) + 7, u32::MAX - 3] {
            let mut ranks = Ranks::new(world, 1 << 16, 300_000_000);
            ranks.set_pat_rounds_of(ahead, lead);
            let algorithm = match behind {
                PatCollective::Gather => Algorithm::PatAllGather,
                PatCollective::Scatter => Algorithm::PatReduceScatter,
            };
            let args = CollectiveArgs {
                send_offset: 0,
                recv_offset: 32 * 1024,
                count: kernel_count(algorithm, count, 4),
                flags: 0,
            };
            // Rank 3 stays out: the others cannot finish.
            let statuses = ranks.launch(
                kernel(algorithm, DataType::Int32, RedOp::Sum),
                args,
                2,
                2,
                Some(&[0, 1, 2]),
            );
            assert!(
                statuses.iter().all(|s| *s == KernelStatus::Aborted),
                "{behind:?} behind {ahead:?} by {lead}: {statuses:?}"
            );
        }
    }
}

/// PAT reduce-scatter of floats is deterministic: the same inputs give the same bits in every
/// call, whatever the grid (the combination order depends only on the world size).
#[test]
fn pat_reduce_scatter_is_deterministic_across_grids() {
    let world = 7;
    let count = 333;
    let mut ranks = Ranks::new(world, 1 << 16, TIMEOUT_NS);
    let mut rng = Rng(3);
    let inputs: Vec<Vec<f32>> = (0..world)
        .map(|_| {
            (0..world * count)
                .map(|_| f32::random(&mut rng, RedOp::Sum))
                .collect()
        })
        .collect();
    for (rank, input) in inputs.iter().enumerate() {
        ranks.write(rank, 0, input);
    }
    let recv = 4 * world * count + 16;
    let mut first: Option<Vec<Vec<f32>>> = None;
    for blocks in [1, 3, 4, 2] {
        let args = CollectiveArgs {
            send_offset: 0,
            recv_offset: recv as u64,
            count: count as u64,
            flags: 0,
        };
        let statuses = ranks.launch(
            kernel(Algorithm::PatReduceScatter, DataType::Float32, RedOp::Sum),
            args,
            blocks,
            4,
            None,
        );
        assert!(statuses.iter().all(|s| *s == KernelStatus::Completed));
        let outputs: Vec<Vec<f32>> = (0..world).map(|r| ranks.read(r, recv, count)).collect();
        match &first {
            None => first = Some(outputs),
            Some(first) => {
                for (a, b) in first.iter().zip(&outputs) {
                    assert_eq!(bytemuck_bits(a), bytemuck_bits(b), "blocks {blocks}");
                }
            }
        }
    }
}

mod randomized {
    use super::*;
    use proptest::prelude::*;

    fn dtype() -> impl Strategy<Value = DataType> {
        (0usize..12).prop_map(|i| DataType::ALL[i])
    }

    fn op() -> impl Strategy<Value = RedOp> {
        (0usize..5).prop_map(|i| RedOp::ALL[i])
    }

    fn algorithm() -> impl Strategy<Value = Algorithm> {
        (0..Algorithm::COLLECTIVES.len()).prop_map(|i| Algorithm::COLLECTIVES[i])
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 48, .. ProptestConfig::default() })]

        /// Random ranks, counts, placements, data types, operators and algorithms.
        #[test]
        fn random_collectives_match_the_reference(
            world in 1usize..=8,
            count in 0usize..3000,
            dtype in dtype(),
            op in op(),
            algorithm in algorithm(),
            in_place in any::<bool>(),
            seed in any::<u64>(),
        ) {
            let in_place = in_place && count > 0;
            for_type(dtype, &mut |case| case(world, algorithm, op, count, in_place, seed));
        }
    }
}
