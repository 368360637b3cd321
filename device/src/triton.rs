//! Device functions for kernels that link the library instead of launching its kernels:
//! Triton kernels (through `extern_elementwise` and `extern_libs`, see `python/symm/triton.py`)
//! or any other device code that calls into the Triton-linkable LLVM IR in `ptx-out/`.
//!
//! Three functions, all with scalar 64/32-bit integer arguments and an `int32` status
//! ([`status`]):
//!
//! * `symm_all_reduce(ctx, local_ptr, byte_offset, n, op, dtype)`: in-place one-shot
//!   all-reduce of `n` elements at `byte_offset` of the window; every data type and operator
//!   of the C ABI;
//! * `symm_all_gather(ctx, send_byte_offset, recv_byte_offset, n_bytes)`: every rank's
//!   `n_bytes` at `send_byte_offset` land at `recv_byte_offset + rank * n_bytes` of every
//!   rank's window;
//! * `symm_barrier(ctx)`: program `p` of every rank meets program `p` of every other rank.
//!
//! # Rules for callers
//! * Every thread of every program calls with the same arguments, outside any branch (the
//!   functions contain block-wide barriers), and every rank makes the same sequence of calls
//!   with the same grid.
//! * The grid is one-dimensional with at most [`MAX_PROGRAMS`] programs, and blocks are
//!   one-dimensional (Triton's are). A 2-D or 3-D grid, or more programs, returns
//!   [`status::INVALID_ARGUMENT`] before anything is touched; the peers that did start then
//!   time out (bounded by the window's timeout) instead of hanging.
//! * The work is split among the programs of the grid: program `p` of every rank handles the
//!   same part, and the synchronization is between programs of the same index. So after
//!   `symm_barrier`, program `p` sees what program `p` of every rank wrote before it, not what
//!   other programs wrote (there is no grid-wide barrier without a cooperative launch).
//! * Each function is a collective in the window's sequence of collectives: it shares the
//!   window's barrier epochs with launched kernels, so calls and kernel launches on one window
//!   must be ordered the same way on every rank (one stream per rank, as for the C ABI).

use crate::arch;
use crate::context::{BackendTag, SymmContext};
use crate::numeric::element::{Bf16, Element, F8E4M3, F8E5M2, F16};
use crate::numeric::ops::{Avg, Max, Min, Prod, ReduceOp, Sum};
use crate::symmetric::all_gather::all_gather;
use crate::symmetric::all_reduce::one_shot_all_reduce;
use crate::symmetric::{
    Batch, FLAG_IN_PLACE, Grid, KernelStatus, TaskArgs, context_is_valid, raise_invalid_launch,
};
use crate::sync::barrier::CrossRankBarrier;
use crate::sync::signal_pad::MAX_BLOCKS;
use crate::types::{DataType, RedOp};

/// The most programs (blocks) a grid calling these functions may have: one barrier slot per
/// program index in the signal pad.
pub const MAX_PROGRAMS: u32 = MAX_BLOCKS as u32;

/// Status codes returned by the device functions (the same on every thread of a program).
pub mod status {
    /// Success.
    pub const SUCCESS: i32 = 0;
    /// The context pointer is null.
    pub const NULL_CONTEXT: i32 = -1;
    /// The context's backend tag is not one this library implements.
    pub const UNKNOWN_BACKEND: i32 = -2;
    /// The reduction operator is not one of the C ABI's `symmRedOp_t`.
    pub const UNSUPPORTED_OP: i32 = -3;
    /// The data type is not one of the C ABI's `symmDataType_t`.
    pub const UNSUPPORTED_DTYPE: i32 = -4;
    /// A peer did not arrive in time, or the window was already aborted; the abort word is
    /// set and the host reports `symmTimeout` for the window.
    pub const TIMEOUT: i32 = -5;
    /// A range leaves the window, is misaligned or overlaps where it must not, `local_ptr` is
    /// not this rank's window base, or the grid is not 1-D with at most [`super::MAX_PROGRAMS`]
    /// programs.
    ///
    /// This code, [`UNSUPPORTED_OP`] and [`UNSUPPORTED_DTYPE`] also fail the window: its abort
    /// word is raised (as for a kernel that refused its launch). A rank that skipped a call its
    /// peers make would otherwise pair its next call with their current one, and both would
    /// return success with each other's data; now its later calls on the window return
    /// [`TIMEOUT`] at once, its peers' waits end within the window's bound, and the host
    /// reports the window failed.
    pub const INVALID_ARGUMENT: i32 = -6;
}

/// The calling program's place in a 1-D grid of at most [`MAX_PROGRAMS`] programs of 1-D
/// blocks, or `None`.
#[inline(always)]
fn program_grid() -> Option<Grid> {
    let programs = arch::grid_dim_x();
    if !arch::launch_is_one_dimensional() || programs == 0 || programs > MAX_PROGRAMS {
        return None;
    }
    Some(Grid {
        block: arch::block_idx_x(),
        blocks: programs,
    })
}

/// The context at `ctx` if it is a native window this library can use, else the status.
///
/// # Safety
/// `ctx` is 0 or the address of a host-built context.
#[inline(always)]
unsafe fn native_context<'a>(ctx: i64) -> Result<&'a SymmContext, i32> {
    if ctx == 0 {
        return Err(status::NULL_CONTEXT);
    }
    // SAFETY: a non-null ctx is a host-built context (caller's contract).
    let context = unsafe { &*(ctx as u64 as *const SymmContext) };
    if context.backend != BackendTag::Native as u32 {
        return Err(status::UNKNOWN_BACKEND);
    }
    if !context_is_valid(context) {
        return Err(status::INVALID_ARGUMENT);
    }
    Ok(context)
}

/// Refuse a call on the valid context `ctx` with `code`: raise the window's abort word (see
/// [`status::INVALID_ARGUMENT`]) and return `code`. Every thread of the program may call it; one
/// raises.
///
/// # Safety
/// `ctx` is the address of a host-built context (checked by `native_context`).
#[inline(always)]
unsafe fn refuse(ctx: i64, code: i32) -> i32 {
    if arch::thread_idx_x() == 0 {
        // SAFETY: forwarded contract.
        unsafe { raise_invalid_launch(ctx as u64) };
    }
    code
}

/// `true` when `[offset, offset + bytes)` lies inside the window of `context`.
#[inline(always)]
fn in_window(context: &SymmContext, offset: i64, bytes: Option<i64>) -> bool {
    offset >= 0
        && bytes
            .filter(|b| *b >= 0)
            .and_then(|b| b.checked_add(offset))
            .is_some_and(|end| end as u64 <= context.window_size)
}

/// The one task of a device-function call: both buffers in the window of `ctx`, checked
/// (non-negative, inside the window) by the caller.
#[inline(always)]
fn window_task(ctx: i64, send_offset: i64, recv_offset: i64, count: i64, flags: u32) -> TaskArgs {
    TaskArgs::in_one_window(
        ctx as u64,
        send_offset as u64,
        recv_offset as u64,
        count as u64,
        flags,
    )
}

/// The device function's status for a kernel body's outcome.
#[inline(always)]
fn status_of(outcome: KernelStatus) -> i32 {
    match outcome {
        KernelStatus::Completed => status::SUCCESS,
        KernelStatus::Aborted => status::TIMEOUT,
        KernelStatus::InvalidLaunch => status::INVALID_ARGUMENT,
    }
}

/// In-place one-shot all-reduce of `num_elements` elements of `dtype` (a `symmDataType_t`) at
/// `byte_offset` of the window described by `ctx`, with `reduce_op` (a `symmRedOp_t`).
/// `local_ptr` is this rank's window base as the caller sees it, or 0 (not checked).
///
/// # Safety
/// `ctx` must be 0 or the address of a context built by the host for this rank, and the
/// caller keeps the module's rules (every thread, same arguments, 1-D grid).
#[inline(always)]
pub unsafe fn symm_all_reduce_device(
    ctx: i64,
    local_ptr: i64,
    byte_offset: i64,
    num_elements: i64,
    reduce_op: i32,
    dtype: i32,
) -> i32 {
    // SAFETY: forwarded contract.
    let context = match unsafe { native_context(ctx) } {
        Ok(context) => context,
        Err(code) => return code,
    };
    let Some(dtype) = u32::try_from(dtype).ok().and_then(DataType::from_raw) else {
        // SAFETY: `native_context` checked the context.
        return unsafe { refuse(ctx, status::UNSUPPORTED_DTYPE) };
    };
    let Some(op) = u32::try_from(reduce_op).ok().and_then(RedOp::from_raw) else {
        // SAFETY: as above.
        return unsafe { refuse(ctx, status::UNSUPPORTED_OP) };
    };
    let size = dtype.size_bytes() as i64;
    let valid = in_window(context, byte_offset, num_elements.checked_mul(size))
        && (local_ptr == 0 || local_ptr as u64 == context.local_base)
        && byte_offset % size == 0
        && context.local_base.wrapping_add(byte_offset as u64) % size as u64 == 0;
    let Some(grid) = program_grid().filter(|_| valid) else {
        // SAFETY: as above.
        return unsafe { refuse(ctx, status::INVALID_ARGUMENT) };
    };
    let task = window_task(ctx, byte_offset, byte_offset, num_elements, FLAG_IN_PLACE);
    // SAFETY: one task whose context (the same for both buffers) `native_context` checked
    // above. Held by value: the task stays in registers.
    let batch = unsafe { Batch::open_one(task) };
    /// One (type, operator) instance. Inlined: a call would pass the batch through local
    /// memory and spill around the call; a caller that gives `op` and `dtype` as compile-time
    /// constants (Triton `tl.constexpr`) keeps only its one instance.
    #[inline(always)]
    fn reduce<T: Element, O: ReduceOp>(batch: &Batch<'_>, grid: Grid) -> i32 {
        // SAFETY: the context is host-built (checked non-null, native, within the kernels'
        // limits); the range lies in the window and is aligned for T (checked above).
        status_of(unsafe { one_shot_all_reduce::<T, O>(batch, grid) })
    }
    #[inline(always)]
    fn by_op<T: Element>(op: RedOp, batch: &Batch<'_>, grid: Grid) -> i32 {
        match op {
            RedOp::Sum => reduce::<T, Sum>(batch, grid),
            RedOp::Prod => reduce::<T, Prod>(batch, grid),
            RedOp::Max => reduce::<T, Max>(batch, grid),
            RedOp::Min => reduce::<T, Min>(batch, grid),
            RedOp::Avg => reduce::<T, Avg>(batch, grid),
        }
    }
    let batch = &batch;
    match dtype {
        DataType::Int8 => by_op::<i8>(op, batch, grid),
        DataType::Uint8 => by_op::<u8>(op, batch, grid),
        DataType::Int32 => by_op::<i32>(op, batch, grid),
        DataType::Uint32 => by_op::<u32>(op, batch, grid),
        DataType::Int64 => by_op::<i64>(op, batch, grid),
        DataType::Uint64 => by_op::<u64>(op, batch, grid),
        DataType::Float16 => by_op::<F16>(op, batch, grid),
        DataType::Float32 => by_op::<f32>(op, batch, grid),
        DataType::Float64 => by_op::<f64>(op, batch, grid),
        DataType::Bfloat16 => by_op::<Bf16>(op, batch, grid),
        DataType::Float8E4M3 => by_op::<F8E4M3>(op, batch, grid),
        DataType::Float8E5M2 => by_op::<F8E5M2>(op, batch, grid),
    }
}

/// All-gather within the window described by `ctx`: this rank's `n_bytes` at
/// `send_byte_offset` are stored at `recv_byte_offset + rank * n_bytes` of every rank's window.
/// In place when the send range is exactly this rank's segment of the receive range; any other
/// overlap of the two ranges is refused.
///
/// # Safety
/// As for [`symm_all_reduce_device`].
#[inline(always)]
pub unsafe fn symm_all_gather_device(
    ctx: i64,
    send_byte_offset: i64,
    recv_byte_offset: i64,
    n_bytes: i64,
) -> i32 {
    // SAFETY: forwarded contract.
    let context = match unsafe { native_context(ctx) } {
        Ok(context) => context,
        Err(code) => return code,
    };
    let world = context.world_size as i64;
    let recv_bytes = n_bytes.checked_mul(world);
    let own_segment = recv_bytes
        .and_then(|_| (context.rank as i64).checked_mul(n_bytes))
        .and_then(|s| s.checked_add(recv_byte_offset));
    let in_place = own_segment == Some(send_byte_offset);
    let disjoint = match recv_bytes {
        // Both ranges are in the window (checked below), so these sums do not overflow.
        Some(total) => {
            send_byte_offset.saturating_add(n_bytes) <= recv_byte_offset
                || recv_byte_offset.saturating_add(total) <= send_byte_offset
        }
        None => false,
    };
    let valid = in_window(context, send_byte_offset, Some(n_bytes))
        && in_window(context, recv_byte_offset, recv_bytes)
        && (in_place || disjoint || n_bytes == 0);
    let Some(grid) = program_grid().filter(|_| valid) else {
        // SAFETY: `native_context` checked the context.
        return unsafe { refuse(ctx, status::INVALID_ARGUMENT) };
    };
    let flags = if in_place { FLAG_IN_PLACE } else { 0 };
    let task = window_task(ctx, send_byte_offset, recv_byte_offset, n_bytes, flags);
    // SAFETY: one task whose context (the same for both buffers) `native_context` checked
    // above; held by value.
    let batch = unsafe { Batch::open_one(task) };
    // SAFETY: the context is host-built; both ranges lie in the window and do not overlap
    // unless in place (checked above).
    status_of(unsafe { all_gather(&batch, grid) })
}

/// Barrier among the programs of one index: program `p` of this rank returns once program `p`
/// of every rank has called it; what program `p` of any rank wrote (to its own or a peer's
/// window) before the call is visible to program `p` of every rank after it.
///
/// # Safety
/// As for [`symm_all_reduce_device`].
#[inline(always)]
pub unsafe fn symm_barrier_device(ctx: i64) -> i32 {
    // SAFETY: forwarded contract.
    let context = match unsafe { native_context(ctx) } {
        Ok(context) => context,
        Err(code) => return code,
    };
    let Some(grid) = program_grid() else {
        // SAFETY: `native_context` checked the context.
        return unsafe { refuse(ctx, status::INVALID_ARGUMENT) };
    };
    // No look at the abort word before announcing (it would leave this rank a barrier behind
    // its peers, with its window not marked out of step): `start` refuses a window out of step
    // and looks at the word while it waits (see `sync::barrier`).
    // SAFETY: grid.block < MAX_BLOCKS and the world size is within the pad's limits (checked
    // by `native_context` and `program_grid`); every thread of the block runs this sequence.
    match unsafe { CrossRankBarrier::open(context, grid.block) }.start() {
        Ok(barrier) => {
            barrier.finish();
            status::SUCCESS
        }
        Err(_) => status::TIMEOUT,
    }
}

/// The exported symbols, in the Triton-linkable library only (`cargo xtask ptx` builds the
/// device crate with the `triton-library` feature for it); the kernel PTX does not carry them.
#[cfg(all(target_arch = "nvptx64", feature = "triton-library"))]
mod exported {
    /// See [`super::symm_all_reduce_device`].
    ///
    /// # Safety
    /// As for [`super::symm_all_reduce_device`].
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
            super::symm_all_reduce_device(
                ctx,
                local_ptr,
                byte_offset,
                num_elements,
                reduce_op,
                dtype,
            )
        }
    }

    /// See [`super::symm_all_gather_device`].
    ///
    /// # Safety
    /// As for [`super::symm_all_gather_device`].
    #[unsafe(no_mangle)]
    pub unsafe extern "C" fn symm_all_gather(
        ctx: i64,
        send_byte_offset: i64,
        recv_byte_offset: i64,
        n_bytes: i64,
    ) -> i32 {
        // SAFETY: forwarded contract.
        unsafe { super::symm_all_gather_device(ctx, send_byte_offset, recv_byte_offset, n_bytes) }
    }

    /// See [`super::symm_barrier_device`].
    ///
    /// # Safety
    /// As for [`super::symm_barrier_device`].
    #[unsafe(no_mangle)]
    pub unsafe extern "C" fn symm_barrier(ctx: i64) -> i32 {
        // SAFETY: forwarded contract.
        unsafe { super::symm_barrier_device(ctx) }
    }
}
