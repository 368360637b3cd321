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
use crate::engine::{self, EngineWindow, NoEngine, SignalEngine};
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
    /// The context's backend tag is not one this function implements (a native function on an
    /// engine window, an engine function on a native one or on another engine's, a kernel
    /// without the engine linked on that engine's window, or an unknown tag). Fails the window as [`INVALID_ARGUMENT`] does.
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
    /// This code, [`UNKNOWN_BACKEND`], [`UNSUPPORTED_OP`] and [`UNSUPPORTED_DTYPE`] also fail
    /// the window: its abort word is raised (as for a kernel that refused its launch). A rank that skipped a call its
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

/// Which protocol a device-function call runs: symm's native one (loads and stores to every
/// peer), or the engine protocol of [`crate::engine`] through `E`.
pub enum Route<'e, E: SignalEngine> {
    /// The native protocol: the context's tag must be [`BackendTag::Native`].
    Native,
    /// The engine protocol: the context's tag must be the engine's ([`SignalEngine::TAG`]).
    Engine(&'e E),
}

impl<E: SignalEngine> Route<'_, E> {
    /// The tag a context must carry for this route.
    #[inline(always)]
    fn tag(&self) -> BackendTag {
        match self {
            Route::Native => BackendTag::Native,
            Route::Engine(_) => E::TAG,
        }
    }
}

/// The route of the context at `ctx` by its tag (the runtime dispatch of a kernel that links
/// `engine`), or the status.
///
/// # Safety
/// `ctx` is 0 or the address of a host-built context.
#[inline(always)]
unsafe fn route_by_tag<E: SignalEngine>(ctx: i64, engine: &E) -> Result<Route<'_, E>, i32> {
    if ctx == 0 {
        return Err(status::NULL_CONTEXT);
    }
    // SAFETY: a non-null ctx is a host-built context (caller's contract).
    let context = unsafe { &*(ctx as u64 as *const SymmContext) };
    if context.backend == BackendTag::Native as u32 {
        Ok(Route::Native)
    } else if context.backend == E::TAG as u32 && E::TAG != BackendTag::Native {
        Ok(Route::Engine(engine))
    } else if context_is_valid(context) {
        // SAFETY: a host-built context with this rank's entries (checked above).
        Err(unsafe { refuse(ctx, status::UNKNOWN_BACKEND) })
    } else {
        Err(status::UNKNOWN_BACKEND)
    }
}

/// The context at `ctx` if `route` can use it, else the status.
///
/// # Safety
/// `ctx` is 0 or the address of a host-built context.
#[inline(always)]
unsafe fn checked_context<'a, E: SignalEngine>(
    ctx: i64,
    route: &Route<'_, E>,
) -> Result<&'a SymmContext, i32> {
    if ctx == 0 {
        return Err(status::NULL_CONTEXT);
    }
    // SAFETY: a non-null ctx is a host-built context (caller's contract).
    let context = unsafe { &*(ctx as u64 as *const SymmContext) };
    if !context_is_valid(context) {
        // Nothing of the context can be trusted, not even where its abort word is.
        return Err(if context.backend != route.tag() as u32 {
            status::UNKNOWN_BACKEND
        } else {
            status::INVALID_ARGUMENT
        });
    }
    // A refusal of a valid context fails the window (see `status::INVALID_ARGUMENT`): a rank
    // that took another route than its peers must not leave them pairing calls.
    if context.backend != route.tag() as u32 {
        // SAFETY: a host-built context with this rank's entries.
        return Err(unsafe { refuse(ctx, status::UNKNOWN_BACKEND) });
    }
    if matches!(route, Route::Engine(_)) && !engine::context_is_usable::<E>(context) {
        // SAFETY: as above.
        return Err(unsafe { refuse(ctx, status::INVALID_ARGUMENT) });
    }
    Ok(context)
}

/// Refuse a call on the valid context `ctx` with `code`: raise the window's abort word (see
/// [`status::INVALID_ARGUMENT`]) and return `code`. Every thread of the program may call it; one
/// raises.
///
/// # Safety
/// `ctx` is the address of a host-built context (checked by `checked_context`).
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

/// The device function's status for an engine-protocol outcome.
#[inline(always)]
fn engine_status(outcome: Result<(), engine::Aborted>) -> i32 {
    match outcome {
        Ok(()) => status::SUCCESS,
        Err(engine::Aborted) => status::TIMEOUT,
    }
}

/// In-place one-shot all-reduce of `num_elements` elements of `dtype` (a `symmDataType_t`) at
/// `byte_offset` of the window described by `ctx`, with `reduce_op` (a `symmRedOp_t`).
/// `local_ptr` is this rank's window base as the caller sees it, or 0 (not checked).
/// A native window only: any other tag returns [`status::UNKNOWN_BACKEND`].
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
    unsafe {
        all_reduce_routed::<NoEngine>(
            Route::Native,
            ctx,
            local_ptr,
            byte_offset,
            num_elements,
            reduce_op,
            dtype,
        )
    }
}

/// [`symm_all_reduce_device`] on an engine window (the engine's tag) through `engine`
/// ([`crate::engine`]); any other tag returns [`status::UNKNOWN_BACKEND`].
///
/// # Safety
/// As for [`symm_all_reduce_device`], in a kernel of the engine's job.
#[inline(always)]
pub unsafe fn symm_engine_all_reduce_device<E: SignalEngine>(
    engine: &E,
    ctx: i64,
    local_ptr: i64,
    byte_offset: i64,
    num_elements: i64,
    reduce_op: i32,
    dtype: i32,
) -> i32 {
    // SAFETY: forwarded contract.
    unsafe {
        all_reduce_routed(
            Route::Engine(engine),
            ctx,
            local_ptr,
            byte_offset,
            num_elements,
            reduce_op,
            dtype,
        )
    }
}

/// [`symm_all_reduce_device`] or [`symm_engine_all_reduce_device`], by the context's tag.
///
/// # Safety
/// As for [`symm_engine_all_reduce_device`].
#[inline(always)]
pub unsafe fn symm_any_all_reduce_device<E: SignalEngine>(
    engine: &E,
    ctx: i64,
    local_ptr: i64,
    byte_offset: i64,
    num_elements: i64,
    reduce_op: i32,
    dtype: i32,
) -> i32 {
    // SAFETY: forwarded contract.
    match unsafe { route_by_tag(ctx, engine) } {
        // SAFETY: forwarded contract; the route matches the context's tag.
        Ok(route) => unsafe {
            all_reduce_routed(
                route,
                ctx,
                local_ptr,
                byte_offset,
                num_elements,
                reduce_op,
                dtype,
            )
        },
        Err(code) => code,
    }
}

/// The all-reduce on `route`: arguments checked, then one (type, operator) instance.
///
/// # Safety
/// As for [`symm_engine_all_reduce_device`].
#[inline(always)]
unsafe fn all_reduce_routed<E: SignalEngine>(
    route: Route<'_, E>,
    ctx: i64,
    local_ptr: i64,
    byte_offset: i64,
    num_elements: i64,
    reduce_op: i32,
    dtype: i32,
) -> i32 {
    // SAFETY: forwarded contract.
    let context = match unsafe { checked_context(ctx, &route) } {
        Ok(context) => context,
        Err(code) => return code,
    };
    let Some(dtype) = u32::try_from(dtype).ok().and_then(DataType::from_raw) else {
        // SAFETY: `checked_context` checked the context.
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
    /// One (type, operator) instance on the route. Inlined: a call would pass the batch
    /// through local memory and spill around the call; a caller that gives `op` and `dtype` as
    /// compile-time constants (Triton `tl.constexpr`) keeps only its one instance.
    #[inline(always)]
    fn reduce<T: Element, O: ReduceOp, E: SignalEngine>(
        route: &Route<'_, E>,
        ctx: i64,
        context: &SymmContext,
        byte_offset: i64,
        num_elements: i64,
        grid: Grid,
    ) -> i32 {
        match route {
            Route::Native => {
                let task = window_task(ctx, byte_offset, byte_offset, num_elements, FLAG_IN_PLACE);
                // SAFETY: one task whose context (the same for both buffers) was checked
                // native and valid; held by value, so the task stays in registers.
                let batch = unsafe { Batch::open_one(task) };
                // SAFETY: the context is host-built (checked non-null, native, within the
                // kernels' limits); the range lies in the window and is aligned for T.
                status_of(unsafe { one_shot_all_reduce::<T, O>(&batch, grid) })
            }
            Route::Engine(engine) => {
                // SAFETY: an engine context checked usable; grid.block < MAX_PROGRAMS; every
                // thread of the program calls alike (the module's rules).
                let window = unsafe { EngineWindow::new(*engine, context, grid) };
                engine_status(window.all_reduce::<T, O>(byte_offset as u64, num_elements as u64))
            }
        }
    }
    #[inline(always)]
    fn by_op<T: Element, E: SignalEngine>(
        op: RedOp,
        route: &Route<'_, E>,
        ctx: i64,
        context: &SymmContext,
        byte_offset: i64,
        num_elements: i64,
        grid: Grid,
    ) -> i32 {
        let args = (route, ctx, context, byte_offset, num_elements, grid);
        match op {
            RedOp::Sum => reduce::<T, Sum, E>(args.0, args.1, args.2, args.3, args.4, args.5),
            RedOp::Prod => reduce::<T, Prod, E>(args.0, args.1, args.2, args.3, args.4, args.5),
            RedOp::Max => reduce::<T, Max, E>(args.0, args.1, args.2, args.3, args.4, args.5),
            RedOp::Min => reduce::<T, Min, E>(args.0, args.1, args.2, args.3, args.4, args.5),
            RedOp::Avg => reduce::<T, Avg, E>(args.0, args.1, args.2, args.3, args.4, args.5),
        }
    }
    let route = &route;
    let a = (ctx, context, byte_offset, num_elements, grid);
    match dtype {
        DataType::Int8 => by_op::<i8, E>(op, route, a.0, a.1, a.2, a.3, a.4),
        DataType::Uint8 => by_op::<u8, E>(op, route, a.0, a.1, a.2, a.3, a.4),
        DataType::Int32 => by_op::<i32, E>(op, route, a.0, a.1, a.2, a.3, a.4),
        DataType::Uint32 => by_op::<u32, E>(op, route, a.0, a.1, a.2, a.3, a.4),
        DataType::Int64 => by_op::<i64, E>(op, route, a.0, a.1, a.2, a.3, a.4),
        DataType::Uint64 => by_op::<u64, E>(op, route, a.0, a.1, a.2, a.3, a.4),
        DataType::Float16 => by_op::<F16, E>(op, route, a.0, a.1, a.2, a.3, a.4),
        DataType::Float32 => by_op::<f32, E>(op, route, a.0, a.1, a.2, a.3, a.4),
        DataType::Float64 => by_op::<f64, E>(op, route, a.0, a.1, a.2, a.3, a.4),
        DataType::Bfloat16 => by_op::<Bf16, E>(op, route, a.0, a.1, a.2, a.3, a.4),
        DataType::Float8E4M3 => by_op::<F8E4M3, E>(op, route, a.0, a.1, a.2, a.3, a.4),
        DataType::Float8E5M2 => by_op::<F8E5M2, E>(op, route, a.0, a.1, a.2, a.3, a.4),
    }
}

/// All-gather within the window described by `ctx`: this rank's `n_bytes` at
/// `send_byte_offset` are stored at `recv_byte_offset + rank * n_bytes` of every rank's window.
/// In place when the send range is exactly this rank's segment of the receive range; any other
/// overlap of the two ranges is refused. A native window only.
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
    unsafe {
        all_gather_routed::<NoEngine>(
            Route::Native,
            ctx,
            send_byte_offset,
            recv_byte_offset,
            n_bytes,
        )
    }
}

/// [`symm_all_gather_device`] on an engine window through `engine`.
///
/// # Safety
/// As for [`symm_engine_all_reduce_device`].
#[inline(always)]
pub unsafe fn symm_engine_all_gather_device<E: SignalEngine>(
    engine: &E,
    ctx: i64,
    send_byte_offset: i64,
    recv_byte_offset: i64,
    n_bytes: i64,
) -> i32 {
    // SAFETY: forwarded contract.
    unsafe {
        all_gather_routed(
            Route::Engine(engine),
            ctx,
            send_byte_offset,
            recv_byte_offset,
            n_bytes,
        )
    }
}

/// [`symm_all_gather_device`] or [`symm_engine_all_gather_device`], by the context's tag.
///
/// # Safety
/// As for [`symm_engine_all_reduce_device`].
#[inline(always)]
pub unsafe fn symm_any_all_gather_device<E: SignalEngine>(
    engine: &E,
    ctx: i64,
    send_byte_offset: i64,
    recv_byte_offset: i64,
    n_bytes: i64,
) -> i32 {
    // SAFETY: forwarded contract.
    match unsafe { route_by_tag(ctx, engine) } {
        // SAFETY: forwarded contract; the route matches the context's tag.
        Ok(route) => unsafe {
            all_gather_routed(route, ctx, send_byte_offset, recv_byte_offset, n_bytes)
        },
        Err(code) => code,
    }
}

/// The all-gather on `route`.
///
/// # Safety
/// As for [`symm_engine_all_reduce_device`].
#[inline(always)]
unsafe fn all_gather_routed<E: SignalEngine>(
    route: Route<'_, E>,
    ctx: i64,
    send_byte_offset: i64,
    recv_byte_offset: i64,
    n_bytes: i64,
) -> i32 {
    // SAFETY: forwarded contract.
    let context = match unsafe { checked_context(ctx, &route) } {
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
        // SAFETY: `checked_context` checked the context.
        return unsafe { refuse(ctx, status::INVALID_ARGUMENT) };
    };
    match route {
        Route::Native => {
            let flags = if in_place { FLAG_IN_PLACE } else { 0 };
            let task = window_task(ctx, send_byte_offset, recv_byte_offset, n_bytes, flags);
            // SAFETY: one task whose context (the same for both buffers) was checked above;
            // held by value.
            let batch = unsafe { Batch::open_one(task) };
            // SAFETY: the context is host-built; both ranges lie in the window and do not
            // overlap unless in place (checked above).
            status_of(unsafe { all_gather(&batch, grid) })
        }
        Route::Engine(engine) => {
            // SAFETY: an engine context checked usable; grid.block < MAX_PROGRAMS.
            let window = unsafe { EngineWindow::new(engine, context, grid) };
            engine_status(window.all_gather(
                send_byte_offset as u64,
                recv_byte_offset as u64,
                n_bytes as u64,
                in_place,
            ))
        }
    }
}

/// Barrier among the programs of one index: program `p` of this rank returns once program `p`
/// of every rank has called it; what program `p` of any rank wrote (to its own or a peer's
/// window) before the call is visible to program `p` of every rank after it. A native window
/// only.
///
/// # Safety
/// As for [`symm_all_reduce_device`].
#[inline(always)]
pub unsafe fn symm_barrier_device(ctx: i64) -> i32 {
    // SAFETY: forwarded contract.
    unsafe { barrier_routed::<NoEngine>(Route::Native, ctx) }
}

/// [`symm_barrier_device`] on an engine window through `engine`: what program `p` put through
/// the engine or stored before the call is complete and visible to program `p` of every rank
/// after it.
///
/// # Safety
/// As for [`symm_engine_all_reduce_device`].
#[inline(always)]
pub unsafe fn symm_engine_barrier_device<E: SignalEngine>(engine: &E, ctx: i64) -> i32 {
    // SAFETY: forwarded contract.
    unsafe { barrier_routed(Route::Engine(engine), ctx) }
}

/// [`symm_barrier_device`] or [`symm_engine_barrier_device`], by the context's tag.
///
/// # Safety
/// As for [`symm_engine_all_reduce_device`].
#[inline(always)]
pub unsafe fn symm_any_barrier_device<E: SignalEngine>(engine: &E, ctx: i64) -> i32 {
    // SAFETY: forwarded contract.
    match unsafe { route_by_tag(ctx, engine) } {
        // SAFETY: forwarded contract; the route matches the context's tag.
        Ok(route) => unsafe { barrier_routed(route, ctx) },
        Err(code) => code,
    }
}

/// The barrier on `route`.
///
/// # Safety
/// As for [`symm_engine_all_reduce_device`].
#[inline(always)]
unsafe fn barrier_routed<E: SignalEngine>(route: Route<'_, E>, ctx: i64) -> i32 {
    // SAFETY: forwarded contract.
    let context = match unsafe { checked_context(ctx, &route) } {
        Ok(context) => context,
        Err(code) => return code,
    };
    let Some(grid) = program_grid() else {
        // SAFETY: `checked_context` checked the context.
        return unsafe { refuse(ctx, status::INVALID_ARGUMENT) };
    };
    match route {
        Route::Native => {
            // No look at the abort word before announcing (it would leave this rank a barrier
            // behind its peers, with its window not marked out of step): `start` refuses a
            // window out of step and looks at the word while it waits (see `sync::barrier`).
            // SAFETY: grid.block < MAX_BLOCKS and the world size is within the pad's limits
            // (checked by `checked_context` and `program_grid`); every thread of the block runs
            // this sequence.
            match unsafe { CrossRankBarrier::open(context, grid.block) }.start() {
                Ok(barrier) => {
                    barrier.finish();
                    status::SUCCESS
                }
                Err(_) => status::TIMEOUT,
            }
        }
        Route::Engine(engine) => {
            // SAFETY: an engine context checked usable; grid.block < MAX_PROGRAMS.
            let window = unsafe { EngineWindow::new(engine, context, grid) };
            engine_status(window.barrier())
        }
    }
}

/// The exported symbols, in the Triton-linkable library only (`cargo xtask ptx` builds the
/// device crate with the `triton-library` feature for it); the kernel PTX does not carry them.
///
/// * `symm_all_reduce`, `symm_all_gather`, `symm_barrier`: native windows;
/// * `symm_nvshmem_*`: NVSHMEM engine windows, for a kernel linked with NVSHMEM's device
///   bitcode;
/// * `symm_dispatch_nvshmem_*`: either, by the context's tag (same link requirement);
/// * `symm_nccl_*`, `symm_dispatch_nccl_*`: the same for NCCL engine windows, for a kernel
///   linked with NCCL's device bitcode.
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

    /// The engine protocol's exports for one engine: `$prefix` (`symm_<engine>_*`) on engine
    /// windows, `$dispatch` (`symm_dispatch_<engine>_*`) on either kind by the context's tag.
    /// `$engine` makes the engine for one call.
    ///
    /// A dispatching function calls the native export or the engine's (as
    /// `symm_any_*_device` would, minus their inlining): each library that Triton links holds
    /// one copy of each path, and the engine's library only declares the native functions,
    /// which the native library defines. Triton inlines every call when it compiles a kernel,
    /// so a constant type and operator still select one instance.
    macro_rules! engine_exports {
        ($name:literal, $engine:expr,
         [$all_reduce:literal, $all_gather:literal, $barrier:literal],
         [$any_all_reduce:literal, $any_all_gather:literal, $any_barrier:literal]) => {
            #[doc = concat!("See [`super::super::symm_engine_all_reduce_device`], through ", $name, ".")]
            ///
            /// # Safety
            /// As for [`super::super::symm_engine_all_reduce_device`].
            #[unsafe(export_name = $all_reduce)]
            pub unsafe extern "C" fn all_reduce(
                ctx: i64,
                local_ptr: i64,
                byte_offset: i64,
                num_elements: i64,
                reduce_op: i32,
                dtype: i32,
            ) -> i32 {
                // SAFETY: forwarded contract.
                unsafe {
                    super::super::symm_engine_all_reduce_device(
                        &$engine,
                        ctx,
                        local_ptr,
                        byte_offset,
                        num_elements,
                        reduce_op,
                        dtype,
                    )
                }
            }

            #[doc = concat!("See [`super::super::symm_engine_all_gather_device`], through ", $name, ".")]
            ///
            /// # Safety
            /// As for [`super::super::symm_engine_all_gather_device`].
            #[unsafe(export_name = $all_gather)]
            pub unsafe extern "C" fn all_gather(
                ctx: i64,
                send_byte_offset: i64,
                recv_byte_offset: i64,
                n_bytes: i64,
            ) -> i32 {
                // SAFETY: forwarded contract.
                unsafe {
                    super::super::symm_engine_all_gather_device(
                        &$engine,
                        ctx,
                        send_byte_offset,
                        recv_byte_offset,
                        n_bytes,
                    )
                }
            }

            #[doc = concat!("See [`super::super::symm_engine_barrier_device`], through ", $name, ".")]
            ///
            /// # Safety
            /// As for [`super::super::symm_engine_barrier_device`].
            #[unsafe(export_name = $barrier)]
            pub unsafe extern "C" fn barrier(ctx: i64) -> i32 {
                // SAFETY: forwarded contract.
                unsafe { super::super::symm_engine_barrier_device(&$engine, ctx) }
            }

            #[doc = concat!("See [`super::super::symm_any_all_reduce_device`], with ", $name, " as the engine.")]
            ///
            /// # Safety
            /// As for [`super::super::symm_any_all_reduce_device`].
            #[unsafe(export_name = $any_all_reduce)]
            pub unsafe extern "C" fn any_all_reduce(
                ctx: i64,
                local_ptr: i64,
                byte_offset: i64,
                num_elements: i64,
                reduce_op: i32,
                dtype: i32,
            ) -> i32 {
                // SAFETY: forwarded contract (the route matches the context's tag).
                unsafe {
                    match super::super::route_by_tag(ctx, &$engine) {
                        Ok(super::super::Route::Native) => super::symm_all_reduce(
                            ctx,
                            local_ptr,
                            byte_offset,
                            num_elements,
                            reduce_op,
                            dtype,
                        ),
                        Ok(super::super::Route::Engine(_)) => {
                            all_reduce(ctx, local_ptr, byte_offset, num_elements, reduce_op, dtype)
                        }
                        Err(code) => code,
                    }
                }
            }

            #[doc = concat!("See [`super::super::symm_any_all_gather_device`], with ", $name, " as the engine.")]
            ///
            /// # Safety
            /// As for [`super::super::symm_any_all_gather_device`].
            #[unsafe(export_name = $any_all_gather)]
            pub unsafe extern "C" fn any_all_gather(
                ctx: i64,
                send_byte_offset: i64,
                recv_byte_offset: i64,
                n_bytes: i64,
            ) -> i32 {
                // SAFETY: forwarded contract (the route matches the context's tag).
                unsafe {
                    match super::super::route_by_tag(ctx, &$engine) {
                        Ok(super::super::Route::Native) => super::symm_all_gather(
                            ctx,
                            send_byte_offset,
                            recv_byte_offset,
                            n_bytes,
                        ),
                        Ok(super::super::Route::Engine(_)) => {
                            all_gather(ctx, send_byte_offset, recv_byte_offset, n_bytes)
                        }
                        Err(code) => code,
                    }
                }
            }

            #[doc = concat!("See [`super::super::symm_any_barrier_device`], with ", $name, " as the engine.")]
            ///
            /// # Safety
            /// As for [`super::super::symm_any_barrier_device`].
            #[unsafe(export_name = $any_barrier)]
            pub unsafe extern "C" fn any_barrier(ctx: i64) -> i32 {
                // SAFETY: forwarded contract (the route matches the context's tag).
                unsafe {
                    match super::super::route_by_tag(ctx, &$engine) {
                        Ok(super::super::Route::Native) => super::symm_barrier(ctx),
                        Ok(super::super::Route::Engine(_)) => barrier(ctx),
                        Err(code) => code,
                    }
                }
            }
        };
    }

    /// NVSHMEM engine windows.
    mod nvshmem {
        use crate::engine::nvshmem::Nvshmem;

        engine_exports!(
            "NVSHMEM",
            Nvshmem,
            [
                "symm_nvshmem_all_reduce",
                "symm_nvshmem_all_gather",
                "symm_nvshmem_barrier"
            ],
            [
                "symm_dispatch_nvshmem_all_reduce",
                "symm_dispatch_nvshmem_all_gather",
                "symm_dispatch_nvshmem_barrier"
            ]
        );
    }

    /// NCCL engine windows (GIN).
    mod nccl {
        use crate::engine::nccl::Nccl;

        engine_exports!(
            "NCCL",
            Nccl::default(),
            [
                "symm_nccl_all_reduce",
                "symm_nccl_all_gather",
                "symm_nccl_barrier"
            ],
            [
                "symm_dispatch_nccl_all_reduce",
                "symm_dispatch_nccl_all_gather",
                "symm_dispatch_nccl_barrier"
            ]
        );
    }
}
