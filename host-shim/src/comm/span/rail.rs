//! A rank's legs on a rail of sockets (the ranks of its local rank, one per machine), over the
//! rail's bootstrap: all-gathers of at most `MAX_CONTRIBUTION_BYTES` each, every wait bounded and
//! ended by the rank's failure. Values combine on the host in machine order, with symm's
//! element arithmetic (narrow floats in f32, integers wrapping), so every rank of a rail gets
//! the same bits.

use super::Shared;
use crate::error::{Error, Result};
use crate::transport::bootstrap::wire::MAX_CONTRIBUTION_BYTES;
use std::sync::atomic::Ordering;
use symm_device::numeric::element::{Bf16, Element, F8E4M3, F8E5M2, F16};
use symm_device::numeric::ops::{Accumulator, Avg, Max, Min, Prod, ReduceOp, Sum};
use symm_device::{DataType, RedOp};

/// One rank's rail, for one call.
pub(super) struct Rail<'a> {
    pub shared: &'a Shared,
    /// The rail's bootstrap connection.
    pub client: &'a crate::transport::bootstrap::Client,
    pub machines: usize,
    pub machine: usize,
    pub dtype: DataType,
    pub op: RedOp,
    /// Ranks of the spanning communicator (an average's divisor).
    pub nranks: usize,
}

impl Rail<'_> {
    /// Every machine's `bytes` (this rank's, `len` bytes long on every machine that sends;
    /// empty from a machine that sends nothing), by machine, in pieces the bootstrap carries.
    fn exchange(&self, mine: &[u8], len: usize) -> Result<Vec<Vec<u8>>> {
        let mut out = vec![Vec::new(); self.machines];
        let pieces = len.div_ceil(MAX_CONTRIBUTION_BYTES).max(1);
        for piece in 0..pieces {
            let range = (piece * MAX_CONTRIBUTION_BYTES).min(mine.len())
                ..((piece + 1) * MAX_CONTRIBUTION_BYTES).min(mine.len());
            let tag = self.shared.rail_gathers.fetch_add(1, Ordering::Relaxed);
            self.client.contribute(tag, &mine[range])?;
            let gathered = self.shared.wait(self.client, tag, &|| {
                format!("the rail's all-gather {tag} (every machine's rank of this local rank)")
            })?;
            for (m, bytes) in gathered.into_iter().enumerate() {
                out[m].extend_from_slice(&bytes);
            }
        }
        Ok(out)
    }

    /// Every machine's `mine`, checked to be as long as this rank's.
    fn gather(&self, mine: &[u8]) -> Result<Vec<Vec<u8>>> {
        let all = self.exchange(mine, mine.len())?;
        if let Some(m) = all.iter().position(|b| b.len() != mine.len()) {
            return Err(Error::internal(format!(
                "the rail's machine {m} sent {} bytes where machine {} sent {}",
                all[m].len(),
                self.machine,
                mine.len()
            )));
        }
        Ok(all)
    }

    /// The rail's all-reduce of `mine`.
    pub fn all_reduce(&self, mine: &[u8]) -> Result<Vec<u8>> {
        let all = self.gather(mine)?;
        let inputs: Vec<&[u8]> = all.iter().map(Vec::as_slice).collect();
        let mut out = vec![0u8; mine.len()];
        combine(self.dtype, self.op, self.nranks, &inputs, &mut out);
        Ok(out)
    }

    /// The rail's all-gather of `mine`: every machine's, by machine.
    pub fn all_gather(&self, mine: &[u8]) -> Result<Vec<Vec<u8>>> {
        self.gather(mine)
    }

    /// The rail's reduce-scatter: `mine` holds a block per machine; block `machine` of every
    /// machine, combined.
    pub fn reduce_scatter(&self, mine: &[u8]) -> Result<Vec<u8>> {
        let all = self.gather(mine)?;
        let block = mine.len() / self.machines;
        let range = self.machine * block..(self.machine + 1) * block;
        let inputs: Vec<&[u8]> = all.iter().map(|b| &b[range.clone()]).collect();
        let mut out = vec![0u8; block];
        combine(self.dtype, self.op, self.nranks, &inputs, &mut out);
        Ok(out)
    }

    /// The rail's broadcast from `root_machine` of `len` bytes (`mine` there, empty
    /// elsewhere).
    pub fn broadcast(&self, root_machine: usize, mine: &[u8], len: usize) -> Result<Vec<u8>> {
        let mut all = self.exchange(mine, len)?;
        let data = std::mem::take(&mut all[root_machine]);
        if data.len() != len {
            return Err(Error::internal(format!(
                "the rail's root machine {root_machine} sent {} bytes of {len}",
                data.len()
            )));
        }
        Ok(data)
    }
}

/// Combine `inputs` (each as long as `out`) element by element in order with `op`, into
/// `out`; an average divides the sum by `nranks`.
pub(super) fn combine(dtype: DataType, op: RedOp, nranks: usize, inputs: &[&[u8]], out: &mut [u8]) {
    fn typed<T: Element + bytemuck::Pod, O: ReduceOp>(
        nranks: usize,
        inputs: &[&[u8]],
        out: &mut [u8],
    ) {
        let size = std::mem::size_of::<T>();
        for (e, slot) in out.chunks_exact_mut(size).enumerate() {
            let value = |input: &[u8]| -> T {
                bytemuck::pod_read_unaligned(&input[e * size..(e + 1) * size])
            };
            let mut acc = value(inputs[0]).widen();
            for input in &inputs[1..] {
                acc = O::combine(acc, value(input).widen());
            }
            let result = T::narrow(O::finish(acc, nranks as u32));
            slot.copy_from_slice(bytemuck::bytes_of(&result));
        }
    }
    fn by_op<T: Element + bytemuck::Pod>(
        op: RedOp,
        nranks: usize,
        inputs: &[&[u8]],
        out: &mut [u8],
    ) {
        match op {
            RedOp::Sum => typed::<T, Sum>(nranks, inputs, out),
            RedOp::Prod => typed::<T, Prod>(nranks, inputs, out),
            RedOp::Max => typed::<T, Max>(nranks, inputs, out),
            RedOp::Min => typed::<T, Min>(nranks, inputs, out),
            RedOp::Avg => typed::<T, Avg>(nranks, inputs, out),
        }
    }
    let _ = <f32 as Accumulator>::ZERO;
    match dtype {
        DataType::Int8 => by_op::<i8>(op, nranks, inputs, out),
        DataType::Uint8 => by_op::<u8>(op, nranks, inputs, out),
        DataType::Int32 => by_op::<i32>(op, nranks, inputs, out),
        DataType::Uint32 => by_op::<u32>(op, nranks, inputs, out),
        DataType::Int64 => by_op::<i64>(op, nranks, inputs, out),
        DataType::Uint64 => by_op::<u64>(op, nranks, inputs, out),
        DataType::Float16 => by_op::<F16>(op, nranks, inputs, out),
        DataType::Float32 => by_op::<f32>(op, nranks, inputs, out),
        DataType::Float64 => by_op::<f64>(op, nranks, inputs, out),
        DataType::Bfloat16 => by_op::<Bf16>(op, nranks, inputs, out),
        DataType::Float8E4M3 => by_op::<F8E4M3>(op, nranks, inputs, out),
        DataType::Float8E5M2 => by_op::<F8E5M2>(op, nranks, inputs, out),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use symm_device::numeric::dynamic::{decode, encode};

    fn bytes(dtype: DataType, values: &[f64]) -> Vec<u8> {
        let size = dtype.size_bytes();
        let mut out = vec![0u8; values.len() * size];
        for (v, slot) in values.iter().zip(out.chunks_exact_mut(size)) {
            encode(dtype, *v, slot);
        }
        out
    }

    #[test]
    fn machines_combine_in_order_with_the_kernels_arithmetic() {
        for dtype in DataType::ALL {
            for (op, want) in [
                (RedOp::Sum, [6.0, -3.0]),
                (RedOp::Prod, [6.0, 4.0]),
                (RedOp::Max, [3.0, 1.0]),
                (RedOp::Min, [1.0, -2.0]),
            ] {
                let unsigned =
                    matches!(dtype, DataType::Uint8 | DataType::Uint32 | DataType::Uint64);
                let inputs = [
                    bytes(dtype, &[1.0, -2.0]),
                    bytes(dtype, &[2.0, 1.0]),
                    bytes(dtype, &[3.0, -2.0]),
                ];
                let refs: Vec<&[u8]> = inputs.iter().map(Vec::as_slice).collect();
                let mut out = vec![0u8; inputs[0].len()];
                combine(dtype, op, 3, &refs, &mut out);
                let size = dtype.size_bytes();
                let got: Vec<f64> = out.chunks_exact(size).map(|b| decode(dtype, b)).collect();
                if unsigned {
                    // The negatives wrap; only the first element is checked.
                    assert_eq!(got[0], want[0], "{dtype:?} {op:?}");
                } else {
                    assert_eq!(got, want, "{dtype:?} {op:?}");
                }
            }
        }
        // An average divides once by every rank; integers wrap.
        let inputs = [
            bytes(DataType::Float32, &[3.0]),
            bytes(DataType::Float32, &[5.0]),
        ];
        let refs: Vec<&[u8]> = inputs.iter().map(Vec::as_slice).collect();
        let mut out = vec![0u8; 4];
        combine(DataType::Float32, RedOp::Avg, 4, &refs, &mut out);
        assert_eq!(decode(DataType::Float32, &out), 2.0);
        let inputs = [
            bytes(DataType::Int8, &[100.0]),
            bytes(DataType::Int8, &[100.0]),
        ];
        let refs: Vec<&[u8]> = inputs.iter().map(Vec::as_slice).collect();
        let mut out = vec![0u8; 1];
        combine(DataType::Int8, RedOp::Sum, 2, &refs, &mut out);
        assert_eq!(decode(DataType::Int8, &out), -56.0);
    }
}
