//! What symm-perf fills each rank's inputs with and what every output element must be, as
//! plain data with no GPU or communicator in it, so that filling and checking run on every
//! host thread: at 64 MiB × 8 ranks they, not the collective, were most of a sweep's time
//! (the bfloat16 8-rank sweep ran past 45 s at 64 MiB on an H100 machine, one thread).

use crate::options::Operation;
use symm_device::numeric::dynamic::{decode, encode, representable};
use symm_device::{DataType, RedOp};

/// The inputs and expected outputs of one collective shape.
#[derive(Clone, Copy, Debug)]
pub struct Reference {
    /// Element type.
    pub dtype: DataType,
    /// Reduction operator (all-reduce, reduce-scatter).
    pub op: RedOp,
    /// The collective.
    pub operation: Operation,
    /// Ranks of the communicator.
    pub nranks: usize,
    /// Broadcast root.
    pub root: usize,
    /// The count passed to the collective (all-gather: per rank; reduce-scatter: per rank).
    pub count: u64,
}

impl Reference {
    /// Input element `index` of rank `rank`: 1..=3 (1..=2 for prod, so products stay exact).
    pub fn input(&self, rank: usize, index: u64) -> f64 {
        let period = if self.op == RedOp::Prod { 2 } else { 3 };
        1.0 + ((rank as u64 + index) % period) as f64
    }

    /// The reduction over every rank of input element `index`, as the kernels define it, in
    /// the element type.
    fn reduce(&self, index: u64) -> f64 {
        let n = self.nranks;
        let values = (0..n).map(|q| self.input(q, index));
        let sum = || (0..n).map(|q| self.input(q, index)).sum::<f64>();
        let exact = match self.op {
            RedOp::Sum => sum(),
            RedOp::Prod => values.product(),
            RedOp::Max => values.fold(f64::MIN, f64::max),
            RedOp::Min => values.fold(f64::MAX, f64::min),
            RedOp::Avg if !self.dtype.is_float() => (sum() / n as f64).trunc(),
            RedOp::Avg => sum() / n as f64,
        };
        representable(self.dtype, exact)
    }

    /// What element `i` of rank `rank`'s output must be.
    pub fn expected(&self, rank: usize, i: u64) -> f64 {
        match self.operation {
            Operation::AllReduce | Operation::Reduce => self.reduce(i),
            Operation::ReduceScatter => self.reduce(rank as u64 * self.count + i),
            Operation::AllGather => representable(
                self.dtype,
                self.input((i / self.count) as usize, i % self.count),
            ),
            Operation::Broadcast => representable(self.dtype, self.input(self.root, i)),
        }
    }

    /// Relative error accepted (the types whose accumulation rounds).
    pub fn tolerance(&self) -> f64 {
        match self.dtype {
            DataType::Float16 => 1.0 / 1024.0,
            DataType::Bfloat16 => 1.0 / 128.0,
            DataType::Float8E4M3 => 1.0 / 8.0,
            DataType::Float8E5M2 => 1.0 / 4.0,
            DataType::Float32 => 1e-6,
            _ => 0.0,
        }
    }

    /// Rank `rank`'s first `elements` inputs, encoded.
    pub fn encoded_inputs(&self, rank: usize, elements: usize) -> Vec<u8> {
        let size = self.dtype.size_bytes();
        let mut bytes = vec![0u8; elements * size];
        let per = part_elements(elements);
        std::thread::scope(|scope| {
            for (p, part) in bytes.chunks_mut(per * size).enumerate() {
                scope.spawn(move || {
                    for (k, chunk) in part.chunks_mut(size).enumerate() {
                        encode(self.dtype, self.input(rank, (p * per + k) as u64), chunk);
                    }
                });
            }
        });
        bytes
    }

    /// Wrong elements of rank `rank`'s output `got`.
    pub fn count_wrong(&self, rank: usize, got: &[u8]) -> u64 {
        if self.operation == Operation::Reduce && rank != self.root {
            // Off the root a reduce's receive buffer is not written: nothing to check.
            return 0;
        }
        let size = self.dtype.size_bytes();
        let tolerance = self.tolerance();
        let per = part_elements(got.len() / size);
        std::thread::scope(|scope| {
            let parts: Vec<_> = got
                .chunks(per * size)
                .enumerate()
                .map(|(p, part)| {
                    scope.spawn(move || {
                        part.chunks(size)
                            .enumerate()
                            .filter(|(k, chunk)| {
                                let expected = self.expected(rank, (p * per + k) as u64);
                                let value = decode(self.dtype, chunk);
                                let error = (value - expected).abs();
                                error.is_nan() || error > tolerance * expected.abs()
                            })
                            .count() as u64
                    })
                })
                .collect();
            parts
                .into_iter()
                .map(|part| part.join().expect("a check thread panicked"))
                .sum()
        })
    }
}

/// Elements per part when `elements` are split over the host threads (at most 16), each part
/// at least 65536 elements (below that, spawning costs more than it saves).
fn part_elements(elements: usize) -> usize {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get().min(16));
    elements.div_ceil(threads).max(1 << 16)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reference(operation: Operation, dtype: DataType, op: RedOp) -> Reference {
        Reference {
            dtype,
            op,
            operation,
            nranks: 3,
            root: 2,
            count: 100_003,
        }
    }

    /// The parallel fill writes every element as the serial definition says, and the check
    /// counts exactly the elements made wrong, wherever they are (every part boundary).
    #[test]
    fn fill_and_check_cover_every_element_once() {
        for (operation, dtype, op) in [
            (Operation::AllReduce, DataType::Float32, RedOp::Sum),
            (Operation::AllReduce, DataType::Bfloat16, RedOp::Avg),
            (Operation::AllReduce, DataType::Int32, RedOp::Avg),
            (Operation::ReduceScatter, DataType::Float16, RedOp::Max),
            (Operation::AllGather, DataType::Int8, RedOp::Sum),
            (Operation::Broadcast, DataType::Float64, RedOp::Prod),
        ] {
            let r = reference(operation, dtype, op);
            let size = dtype.size_bytes();
            let elements = match operation {
                Operation::AllGather => 3 * r.count as usize,
                _ => r.count as usize,
            };
            let inputs = r.encoded_inputs(1, elements);
            for i in [0, 1, 65_535, 65_536, elements - 1] {
                let want = representable(dtype, r.input(1, i as u64));
                assert_eq!(decode(dtype, &inputs[i * size..(i + 1) * size]), want);
            }
            let mut output = vec![0u8; elements * size];
            for i in 0..elements {
                encode(
                    dtype,
                    r.expected(1, i as u64),
                    &mut output[i * size..(i + 1) * size],
                );
            }
            assert_eq!(
                r.count_wrong(1, &output),
                0,
                "{operation:?} {dtype:?} {op:?}"
            );
            let bad = [0, 65_535, 65_536, 65_537, elements / 2, elements - 1];
            for &i in &bad {
                let off = r.expected(1, i as u64) + 64.0;
                encode(dtype, off, &mut output[i * size..(i + 1) * size]);
            }
            assert_eq!(
                r.count_wrong(1, &output),
                bad.len() as u64,
                "{operation:?} {dtype:?}"
            );
        }
    }

    /// A reduce is checked on its root (the reduction) and not elsewhere (the receive buffer
    /// is not written off the root).
    #[test]
    fn a_reduce_is_checked_on_its_root_only() {
        let r = reference(Operation::Reduce, DataType::Int32, RedOp::Max);
        let size = DataType::Int32.size_bytes();
        let mut output = vec![0u8; r.count as usize * size];
        for i in 0..r.count as usize {
            let want = r.expected(r.root, i as u64);
            assert_eq!(want, r.reduce(i as u64));
            encode(DataType::Int32, want, &mut output[i * size..(i + 1) * size]);
        }
        assert_eq!(r.count_wrong(r.root, &output), 0);
        encode(
            DataType::Int32,
            r.expected(r.root, 7) + 1.0,
            &mut output[7 * size..8 * size],
        );
        assert_eq!(r.count_wrong(r.root, &output), 1);
        assert_eq!(r.count_wrong(0, &vec![0xA5; output.len()]), 0);
    }

    #[test]
    fn reductions_follow_the_operator() {
        let r = reference(Operation::AllReduce, DataType::Float64, RedOp::Sum);
        // Element 0 of ranks 0, 1, 2: 1, 2, 3.
        assert_eq!(r.expected(0, 0), 6.0);
        let avg = Reference {
            op: RedOp::Avg,
            ..r
        };
        assert_eq!(avg.expected(0, 0), 2.0);
        let max = Reference {
            op: RedOp::Max,
            ..r
        };
        assert_eq!(max.expected(0, 0), 3.0);
        let min = Reference {
            op: RedOp::Min,
            ..r
        };
        assert_eq!(min.expected(0, 0), 1.0);
        // Prod has period 2: element 0 of ranks 0, 1, 2 is 1, 2, 1.
        let prod = Reference {
            op: RedOp::Prod,
            ..r
        };
        assert_eq!(prod.expected(0, 0), 2.0);
        let int_avg = Reference {
            op: RedOp::Avg,
            dtype: DataType::Int32,
            ..r
        };
        // Element 1: 2, 3, 1 -> 6 / 3.
        assert_eq!(int_avg.expected(0, 1), 2.0);
    }
}
