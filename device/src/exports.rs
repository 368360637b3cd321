//! What the PTX and the bitcode export: kernel entry points (`extern "ptx-kernel"`) and the
//! device function Triton kernels link against. The bodies are target-independent functions,
//! so the host backend and the tests run exactly what the GPU runs.

use crate::context::{BackendTag, SymmContext};
use crate::symmetric::KernelStatus;
use crate::symmetric::all_reduce::{AllReduceArgs, FLAG_OVERLAP, one_shot_all_reduce};
use crate::symmetric::reduce::Sum;
use crate::types::{DataType, RedOp};

/// PTX name of the one-shot f32 sum all-reduce kernel. Parameters, in order:
/// `(const SymmContext* ctx, u64 send_offset, u64 recv_offset, u64 count, u32 flags)`.
pub const ONE_SHOT_ALL_REDUCE_F32_SUM: &str = "symm_one_shot_all_reduce_f32_sum";

/// Return codes of [`symm_all_reduce_device`] (and of the exported `symm_all_reduce`).
pub mod device_status {
    /// Success.
    pub const SUCCESS: i32 = 0;
    /// The context pointer is null.
    pub const NULL_CONTEXT: i32 = -1;
    /// The context's backend tag is not one this library implements.
    pub const UNKNOWN_BACKEND: i32 = -2;
    /// The reduction is not supported for this type by this version.
    pub const UNSUPPORTED_OP: i32 = -3;
    /// The data type is not supported by this version.
    pub const UNSUPPORTED_DTYPE: i32 = -4;
    /// A peer did not arrive in time (or the window was aborted); the abort word is set.
    pub const TIMEOUT: i32 = -5;
    /// `local_ptr` is not this rank's window base, the range leaves the window, or the grid is
    /// larger than the signal pad allows.
    pub const INVALID_ARGUMENT: i32 = -6;
}

/// In-place all-reduce of `num_elements` elements at `byte_offset` of the window described by
/// `ctx`, for device code that links the bitcode (Triton). Every thread of every block of the
/// calling grid must call it with the same arguments, and every rank must make the same call.
///
/// `local_ptr` is this rank's window base (as Triton sees it) or 0.
///
/// # Safety
/// `ctx` must be 0 or the address of a context built by the host for this rank.
#[inline(always)]
pub unsafe fn symm_all_reduce_device(
    ctx: i64,
    local_ptr: i64,
    byte_offset: i64,
    num_elements: i64,
    reduce_op: i32,
    dtype: i32,
) -> i32 {
    use device_status::*;
    if ctx == 0 {
        return NULL_CONTEXT;
    }
    // SAFETY: a non-null ctx is a host-built context (caller's contract).
    let ctx = unsafe { &*(ctx as u64 as *const SymmContext) };
    if ctx.backend != BackendTag::Native as u32 {
        return UNKNOWN_BACKEND;
    }
    if DataType::from_raw(dtype as u32) != Some(DataType::Float32) {
        return UNSUPPORTED_DTYPE;
    }
    if RedOp::from_raw(reduce_op as u32) != Some(RedOp::Sum) {
        return UNSUPPORTED_OP;
    }
    let bytes = (num_elements as u64).checked_mul(4);
    let in_window = match (byte_offset >= 0, num_elements >= 0, bytes) {
        (true, true, Some(bytes)) => (byte_offset as u64)
            .checked_add(bytes)
            .is_some_and(|end| end <= ctx.window_size),
        _ => false,
    };
    if !in_window || (local_ptr != 0 && local_ptr as u64 != ctx.local_base) || byte_offset % 4 != 0
    {
        return INVALID_ARGUMENT;
    }
    let args = AllReduceArgs {
        send_offset: byte_offset as u64,
        recv_offset: byte_offset as u64,
        count: num_elements as u64,
        flags: FLAG_OVERLAP,
    };
    // SAFETY: range checked against the window above; the context is host-built.
    match unsafe { one_shot_all_reduce::<f32, Sum>(ctx, &args) } {
        KernelStatus::Completed => SUCCESS,
        KernelStatus::Aborted => TIMEOUT,
        KernelStatus::InvalidLaunch => INVALID_ARGUMENT,
    }
}

#[cfg(target_arch = "nvptx64")]
mod ptx {
    use super::*;

    /// One-shot f32 sum all-reduce. See [`ONE_SHOT_ALL_REDUCE_F32_SUM`].
    ///
    /// # Safety
    /// Launched by the host shim with a context and offsets it validated.
    #[unsafe(no_mangle)]
    pub unsafe extern "ptx-kernel" fn symm_one_shot_all_reduce_f32_sum(
        ctx: *const SymmContext,
        send_offset: u64,
        recv_offset: u64,
        count: u64,
        flags: u32,
    ) {
        let args = AllReduceArgs {
            send_offset,
            recv_offset,
            count,
            flags,
        };
        // SAFETY: the host validated the context and ranges before launching; the outcome is
        // reported through the context's abort word.
        let _ = unsafe { one_shot_all_reduce::<f32, Sum>(&*ctx, &args) };
    }

    /// Device function for Triton: see [`symm_all_reduce_device`].
    ///
    /// # Safety
    /// As for [`symm_all_reduce_device`].
    #[unsafe(no_mangle)]
    pub unsafe extern "C" fn symm_all_reduce(
        ctx: i64,
        local_ptr: i64,
        byte_offset: i64,
        num_elements: i64,
        reduce_op: i32,
        dtype: i32,
    ) -> i32 {
        // SAFETY: forwarded contract.
        unsafe {
            symm_all_reduce_device(ctx, local_ptr, byte_offset, num_elements, reduce_op, dtype)
        }
    }
}
