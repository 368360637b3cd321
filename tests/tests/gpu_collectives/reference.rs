//! The host reference the sweeps check against: inputs exact in every data type, the
//! reduction as the kernels define it (computed in f64, rounded to the type), encoding to and
//! from device bytes, and the parallel host-side helpers that keep the check fast at the
//! largest count.

use crate::sweep::RANKS;
use symm_device::DataType;
use symm_device::numeric::dynamic::{decode, encode, representable};

pub(crate) fn encode_all(dtype: DataType, values: &[f64]) -> Vec<u8> {
    let size = dtype.size_bytes();
    let mut bytes = vec![0u8; values.len() * size];
    for (chunk, v) in bytes.chunks_mut(size).zip(values) {
        encode(dtype, *v, chunk);
    }
    bytes
}

pub(crate) fn decode_all(dtype: DataType, bytes: &[u8]) -> Vec<f64> {
    bytes
        .chunks(dtype.size_bytes())
        .map(|chunk| decode(dtype, chunk))
        .collect()
}

/// Threads for the sweeps' host-side work (inputs, encoding, the reference check): at the
/// largest count that work, not the GPU, is most of a sweep's time (3600 all-reduces of up
/// to 8 ranks x 8 MiB took 78.6 s on an H100 machine, one thread).
fn host_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get().min(16))
}

/// `[f(0), .., f(n - 1)]`, computed on up to [`host_threads`] threads.
pub(crate) fn parallel_map<T: Send>(n: usize, f: impl Fn(usize) -> T + Sync) -> Vec<T> {
    let threads = host_threads().min(n).max(1);
    let per = n.div_ceil(threads);
    std::thread::scope(|scope| {
        let f = &f;
        let parts: Vec<_> = (0..threads)
            .map(|t| scope.spawn(move || (t * per..((t + 1) * per).min(n)).map(f).collect()))
            .collect();
        parts
            .into_iter()
            .flat_map(|part| -> Vec<T> { part.join().expect("a host worker panicked") })
            .collect()
    })
}

/// The message of the first `i` in `0..n` (lowest index) for which `wrong(i)` has one, the
/// indices checked in parallel chunks.
fn first_wrong(n: usize, wrong: impl Fn(usize) -> Option<String> + Sync) -> Option<String> {
    let chunks = (host_threads() * 4).min(n).max(1);
    let per = n.div_ceil(chunks);
    parallel_map(chunks, |c| {
        (c * per..((c + 1) * per).min(n)).find_map(&wrong)
    })
    .into_iter()
    .flatten()
    .next()
}

/// Each rank's `count` inputs ([`input_value`] at `seed`), generated in parallel.
pub(crate) fn rank_inputs(
    dtype: DataType,
    nranks: usize,
    count: usize,
    seed: u64,
) -> Vec<Vec<f64>> {
    parallel_map(nranks, |r| {
        (0..count).map(|i| input_value(dtype, r, i, seed)).collect()
    })
}

/// `None` when every element `i` of `got` is the reduction with `op` of element `first + i`
/// of every rank's `inputs`; else the first wrong element, named with `case`.
pub(crate) fn wrong_reduction(
    dtype: DataType,
    op: i32,
    inputs: &[Vec<f64>],
    first: usize,
    got: &[f64],
    case: &str,
) -> Option<String> {
    assert!(inputs.len() <= MAX_TEST_RANKS);
    first_wrong(got.len(), |i| {
        let mut column = [0.0f64; MAX_TEST_RANKS];
        for (c, x) in column.iter_mut().zip(inputs) {
            *c = x[first + i];
        }
        let want = expected(dtype, op, &column[..inputs.len()]);
        (got[i] != want).then(|| format!("{case}: element {i}: got {}, expected {want}", got[i]))
    })
}

/// Most ranks a sweep runs (the largest of [`RANKS`]), for the reference check's stack column.
const MAX_TEST_RANKS: usize = {
    let mut most = 0;
    let mut i = 0;
    while i < RANKS.len() {
        if RANKS[i] > most {
            most = RANKS[i];
        }
        i += 1;
    }
    most
};

fn is_integer(dtype: DataType) -> bool {
    matches!(
        dtype,
        DataType::Int8
            | DataType::Uint8
            | DataType::Int32
            | DataType::Uint32
            | DataType::Int64
            | DataType::Uint64
    )
}

/// Inputs whose sums, products, minima and maxima are exact in every type for up to 8 ranks
/// (|sum| <= 8 or <= 16 unsigned, products of {-1, 0, 1} or wrapping integers), so the
/// expected value is exact: {-1, 0, 1}, or {0, 1, 2} for unsigned types.
pub(crate) fn input_value(dtype: DataType, rank: usize, index: usize, seed: u64) -> f64 {
    let pick = (index as u64)
        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
        .wrapping_add(seed ^ (rank as u64 * 0xBF58_476D))
        >> 61;
    let v = (pick % 3) as f64;
    if matches!(dtype, DataType::Uint8 | DataType::Uint32 | DataType::Uint64) {
        v
    } else {
        v - 1.0
    }
}

/// The reduction of `column` with `op` as the kernels define it: integers exact then wrapped
/// (avg: exact sum / n, truncated); floats accumulated in f32 (f64 for float64) then rounded
/// to the type, avg = sum / n in the accumulator.
fn expected(dtype: DataType, op: i32, column: &[f64]) -> f64 {
    let n = column.len() as f64;
    let sum: f64 = column.iter().sum();
    let value = match op {
        0 => sum,
        1 => column.iter().product(),
        2 => column.iter().copied().fold(f64::MIN, f64::max),
        3 => column.iter().copied().fold(f64::MAX, f64::min),
        _ if is_integer(dtype) => (sum / n).trunc(),
        _ if dtype == DataType::Float64 => sum / n,
        _ => (sum as f32 / n as f32) as f64,
    };
    representable(dtype, value)
}

/// The sweeps' parallel host-side helpers (no GPU): results in order, the lowest wrong index
/// reported whichever chunk finds it, and a single wrong element anywhere is found.
#[test]
fn host_helpers_keep_order_and_find_the_first_wrong_element() {
    let n = 10_007;
    assert_eq!(
        parallel_map(n, |i| i * 3),
        (0..n).map(|i| i * 3).collect::<Vec<_>>()
    );
    assert_eq!(parallel_map(0, |i| i), Vec::<usize>::new());
    assert_eq!(first_wrong(n, |_| None::<String>), None);
    let wrong_from =
        |k: usize| move |i: usize| (i >= k && i.is_multiple_of(7)).then(|| i.to_string());
    assert_eq!(first_wrong(n, wrong_from(9_000)), Some("9002".to_string()));
    assert_eq!(first_wrong(n, wrong_from(0)), Some("0".to_string()));
    let dtype = DataType::Float32;
    let inputs = rank_inputs(dtype, 3, 2 * n, 7);
    let got: Vec<f64> = (0..n)
        .map(|i| {
            expected(
                dtype,
                0,
                &[inputs[0][n + i], inputs[1][n + i], inputs[2][n + i]],
            )
        })
        .collect();
    assert_eq!(wrong_reduction(dtype, 0, &inputs, n, &got, "c"), None);
    for bad in [0, n / 2, n - 1] {
        let mut off = got.clone();
        off[bad] += 1.0;
        let message = wrong_reduction(dtype, 0, &inputs, n, &off, "c").expect("caught");
        assert!(
            message.starts_with(&format!("c: element {bad}:")),
            "{message}"
        );
    }
    // The wrong segment (offset) is caught too.
    assert!(wrong_reduction(dtype, 0, &inputs, 0, &got, "c").is_some());
}
