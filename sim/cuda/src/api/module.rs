//! Modules (PTX text parsed by the simulator), functions, occupancy and kernel launches.

use crate::state::{self, FunctionEntry, KernelLaunch, ModuleEntry, OpKind};
use crate::util::{CuResult, Kind, entry, handle, non_null, not_supported, put};
use cudarc::driver::sys::{
    CUfunction, CUfunction_attribute as F, CUlaunchAttributeID as L, CUlaunchConfig, CUmodule,
    CUresult, CUstream, cudaError_enum as E,
};
use std::ffi::{CStr, c_char, c_int, c_uint, c_void};
use std::sync::Arc;
use symm_sim::{KernelId, Module};

/// `CU_JIT_INFO_LOG_BUFFER`.
const JIT_INFO_LOG: u32 = 3;
/// `CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES`.
const JIT_INFO_LOG_SIZE: u32 = 4;
/// `CU_JIT_ERROR_LOG_BUFFER`.
const JIT_ERROR_LOG: u32 = 5;
/// `CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES`.
const JIT_ERROR_LOG_SIZE: u32 = 6;

/// A JIT log buffer given with the options of `cuModuleLoadDataEx`.
#[derive(Clone, Copy)]
struct Log {
    buffer: *mut u8,
    /// Index of the size option's value slot (written back with the bytes used).
    size_slot: Option<usize>,
    size: usize,
}

impl Log {
    const NONE: Log = Log {
        buffer: std::ptr::null_mut(),
        size_slot: None,
        size: 0,
    };

    /// Write `text` (cut to fit, NUL-terminated) and the bytes used into the size slot.
    ///
    /// # Safety
    /// `buffer` holds `size` bytes; `values` is the option value array holding `size_slot`.
    unsafe fn write(&self, text: &str, values: *mut *mut c_void) {
        if self.buffer.is_null() || self.size == 0 {
            return;
        }
        let n = text.len().min(self.size - 1);
        // SAFETY: `n + 1 <= size` bytes of the caller's buffer (function contract); the slot
        // is an entry of the caller's value array.
        unsafe {
            std::ptr::copy_nonoverlapping(text.as_ptr(), self.buffer, n);
            self.buffer.add(n).write(0);
            if let Some(slot) = self.size_slot {
                values.add(slot).write(std::ptr::without_provenance_mut(n));
            }
        }
    }
}

fn load(
    out: *mut CUmodule,
    image: *const c_void,
    count: c_uint,
    options: *const u32,
    values: *mut *mut c_void,
) -> CuResult<()> {
    let driver = state::driver()?;
    let device = {
        let mut state = driver.lock();
        let d = state.current_healthy()?;
        state.check_capture_safe("cuModuleLoadDataEx")?;
        d
    };
    non_null(out)?;
    non_null(image)?;
    let (mut info, mut error) = (Log::NONE, Log::NONE);
    if count > 0 {
        non_null(options)?;
        non_null(values)?;
    }
    for i in 0..count as usize {
        // SAFETY: both arrays hold `count` entries (function contract).
        let (option, value) = unsafe { (options.add(i).read(), values.add(i).read()) };
        match option {
            JIT_INFO_LOG => info.buffer = value.cast(),
            JIT_INFO_LOG_SIZE => {
                info.size = value as usize;
                info.size_slot = Some(i);
            }
            JIT_ERROR_LOG => error.buffer = value.cast(),
            JIT_ERROR_LOG_SIZE => {
                error.size = value as usize;
                error.size_slot = Some(i);
            }
            _ => {}
        }
    }
    // SAFETY: a NUL-terminated image (function contract for PTX images).
    let bytes = unsafe { CStr::from_ptr(image.cast::<c_char>()) }.to_bytes();
    let fail = |message: String, code: CUresult| {
        // SAFETY: the log buffers and value array come from the caller with their sizes.
        unsafe { error.write(&message, values) };
        Err(code)
    };
    if bytes.starts_with(b"\x7fELF") || bytes.starts_with(&[0x50, 0xed, 0x55, 0xba]) {
        return fail(
            "symm-sim: only PTX text can be loaded on the simulated GPU (got a binary image)"
                .into(),
            E::CUDA_ERROR_INVALID_IMAGE,
        );
    }
    let Ok(text) = std::str::from_utf8(bytes) else {
        return fail(
            "symm-sim: the PTX image is not UTF-8 text".into(),
            E::CUDA_ERROR_INVALID_IMAGE,
        );
    };
    let edited;
    let text = if driver.options.ptx_edits.is_empty() {
        text
    } else {
        edited = state::edit_ptx(text, &driver.options.ptx_edits);
        edited.as_str()
    };
    let module = match Module::load(text) {
        Ok(m) => Arc::new(m),
        Err(e) => return fail(format!("symm-sim: {e}"), E::CUDA_ERROR_INVALID_PTX),
    };
    // SAFETY: as above.
    unsafe { info.write("", values) };
    for (name, address, size) in module.globals() {
        if size > 0 {
            driver.memory.map(
                address,
                size,
                &format!("module variable {name} on device {device}"),
                1u64.checked_shl(device).unwrap_or(0),
            );
        }
    }
    let mut state = driver.lock();
    let h = handle(Kind::Module, state.new_id());
    state.modules.insert(
        h,
        ModuleEntry {
            module,
            device,
            functions: Vec::new(),
        },
    );
    // SAFETY: the caller's output pointer.
    unsafe { put(out, h as CUmodule) }
}

/// `cuModuleLoadDataEx`: parse PTX text with the simulator. The JIT error log receives the
/// parser's message on failure (`CUDA_ERROR_INVALID_PTX`); binary images are refused
/// (`CUDA_ERROR_INVALID_IMAGE`). Other JIT options are ignored.
///
/// # Safety
/// `image` is NUL-terminated; `options` and `values` hold `count` entries; log buffers hold
/// the sizes given.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuModuleLoadDataEx(
    out: *mut CUmodule,
    image: *const c_void,
    count: c_uint,
    options: *mut u32,
    values: *mut *mut c_void,
) -> CUresult {
    entry("cuModuleLoadDataEx", || {
        load(out, image, count, options, values)
    })
}

/// `cuModuleLoadData`: as [`cuModuleLoadDataEx`] without options.
///
/// # Safety
/// `image` is NUL-terminated.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuModuleLoadData(out: *mut CUmodule, image: *const c_void) -> CUresult {
    entry("cuModuleLoadData", || {
        load(out, image, 0, std::ptr::null(), std::ptr::null_mut())
    })
}

/// `cuModuleGetFunction`: the `.entry` named `name` (`CUDA_ERROR_NOT_FOUND` if none).
///
/// # Safety
/// `name` is NUL-terminated; `out` is valid for one write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuModuleGetFunction(
    out: *mut CUfunction,
    module: CUmodule,
    name: *const c_char,
) -> CUresult {
    entry("cuModuleGetFunction", || {
        let mut state = state::driver()?.lock();
        non_null(out)?;
        non_null(name)?;
        // SAFETY: NUL-terminated (function contract).
        let name = unsafe { CStr::from_ptr(name) }
            .to_string_lossy()
            .into_owned();
        let m = module as u64;
        let entry = state.modules.get(&m).ok_or(E::CUDA_ERROR_INVALID_HANDLE)?;
        let existing = entry
            .functions
            .iter()
            .copied()
            .find(|f| state.functions.get(f).is_some_and(|f| f.name == name));
        let h = match existing {
            Some(h) => h,
            None => {
                let kernel = entry.module.kernel(&name).ok_or(E::CUDA_ERROR_NOT_FOUND)?;
                let (module_arc, device) = (entry.module.clone(), entry.device);
                let h = handle(Kind::Function, state.new_id());
                state.functions.insert(
                    h,
                    FunctionEntry {
                        module: module_arc,
                        kernel,
                        name,
                        device,
                    },
                );
                state.modules.get_mut(&m).expect("module").functions.push(h);
                h
            }
        };
        // SAFETY: the caller's output pointer.
        unsafe { put(out, h as CUfunction) }
    })
}

/// `cuModuleUnload`: forget the module and its functions (grids already queued keep it).
///
/// # Safety
/// No pointer is dereferenced (the module is a handle).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuModuleUnload(module: CUmodule) -> CUresult {
    entry("cuModuleUnload", || {
        let driver = state::driver()?;
        let mut state = driver.lock();
        state.check_capture_safe("cuModuleUnload")?;
        let entry = state
            .modules
            .remove(&(module as u64))
            .ok_or(E::CUDA_ERROR_INVALID_HANDLE)?;
        for (_, address, size) in entry.module.globals() {
            if size > 0 {
                driver.memory.unmap(address, size);
            }
        }
        for f in entry.functions {
            state.functions.remove(&f);
            state.occupancy.retain(|(g, _), _| *g != f);
        }
        Ok(())
    })
}

/// The function of handle `f`: (module, kernel, name, device).
fn function(f: CUfunction) -> CuResult<(Arc<Module>, KernelId, String, u32)> {
    let state = state::driver()?.lock();
    let entry = state
        .functions
        .get(&(f as u64))
        .ok_or(E::CUDA_ERROR_INVALID_HANDLE)?;
    Ok((
        entry.module.clone(),
        entry.kernel,
        entry.name.clone(),
        entry.device,
    ))
}

/// `cuFuncLoad`: functions are always loaded.
///
/// # Safety
/// No pointer is dereferenced (the function is a handle).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuFuncLoad(f: CUfunction) -> CUresult {
    entry("cuFuncLoad", || function(f).map(|_| ()))
}

/// `cuFuncGetAttribute`: 1024 threads per block, `SimConfig::registers_per_thread`
/// registers, no static shared, constant or local memory, PTX and binary version 9.0.
///
/// # Safety
/// `value` is valid for one write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuFuncGetAttribute(
    value: *mut c_int,
    attribute: u32,
    f: CUfunction,
) -> CUresult {
    entry("cuFuncGetAttribute", || {
        let driver = state::driver()?;
        function(f)?;
        let table: &[(F, c_int)] = &[
            (F::CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, 1024),
            (F::CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, 0),
            (F::CU_FUNC_ATTRIBUTE_CONST_SIZE_BYTES, 0),
            (F::CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES, 0),
            (
                F::CU_FUNC_ATTRIBUTE_NUM_REGS,
                driver.config.registers_per_thread as c_int,
            ),
            (F::CU_FUNC_ATTRIBUTE_PTX_VERSION, 90),
            (F::CU_FUNC_ATTRIBUTE_BINARY_VERSION, 90),
            (F::CU_FUNC_ATTRIBUTE_CACHE_MODE_CA, 0),
            (F::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, 49152),
            (F::CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT, -1),
        ];
        let v = table
            .iter()
            .find(|(a, _)| *a as u32 == attribute)
            .map(|&(_, v)| v)
            .ok_or(E::CUDA_ERROR_INVALID_VALUE)?;
        // SAFETY: the caller's output pointer.
        unsafe { put(value, v) }
    })
}

/// Blocks of `f` with `threads` threads that fit on one SM (asked of the simulator on the
/// device thread; cached).
fn blocks_per_sm(f: CUfunction, threads: u32) -> CuResult<u32> {
    let driver = state::driver()?;
    let key = (f as u64, threads);
    if let Some(&n) = driver.lock().occupancy.get(&key) {
        return Ok(n);
    }
    let (module, kernel, _, _) = function(f)?;
    let n = driver.on_device(move |sim| sim.blocks_per_sm(&module, kernel, threads));
    driver.lock().occupancy.insert(key, n);
    Ok(n)
}

/// `cuOccupancyMaxActiveBlocksPerMultiprocessor`: `Simulator::blocks_per_sm` (dynamic
/// shared memory is not modeled and ignored).
///
/// # Safety
/// `out` is valid for one write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuOccupancyMaxActiveBlocksPerMultiprocessor(
    out: *mut c_int,
    f: CUfunction,
    block_size: c_int,
    _dynamic_shared_bytes: usize,
) -> CUresult {
    entry("cuOccupancyMaxActiveBlocksPerMultiprocessor", || {
        state::driver()?.lock().current_healthy()?;
        non_null(out)?;
        if block_size <= 0 || block_size > 1024 {
            return Err(E::CUDA_ERROR_INVALID_VALUE);
        }
        let n = blocks_per_sm(f, block_size as u32)?;
        // SAFETY: the caller's output pointer.
        unsafe { put(out, n as c_int) }
    })
}

/// A launch as the driver functions describe it.
struct LaunchArgs {
    call: &'static str,
    f: CUfunction,
    grid: [u32; 3],
    block: [u32; 3],
    shared_bytes: u32,
    stream: u64,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
    cooperative: bool,
    cluster: [u32; 3],
}

/// Validate, copy the parameters and submit a launch.
fn launch(args: LaunchArgs) -> CuResult<()> {
    let driver = state::driver()?;
    let (module, kernel, name, device) = function(args.f)?;
    if !args.extra.is_null() {
        return Err(not_supported(&format!(
            "{} with `extra` (packed) parameters",
            args.call
        )));
    }
    if args.shared_bytes > 0 {
        return Err(not_supported(&format!(
            "{} with dynamic shared memory",
            args.call
        )));
    }
    if args.cluster.iter().product::<u32>() > 1 {
        return Err(not_supported(&format!(
            "{} with thread block clusters ({:?})",
            args.call, args.cluster
        )));
    }
    let [gx, gy, gz] = args.grid;
    let [bx, by, bz] = args.block;
    let threads = bx as u64 * by as u64 * bz as u64;
    if gx == 0
        || gy == 0
        || gz == 0
        || threads == 0
        || threads > 1024
        || bx > 1024
        || by > 1024
        || bz > 64
        || gx > i32::MAX as u32
        || gy > 65535
        || gz > 65535
    {
        return Err(E::CUDA_ERROR_INVALID_VALUE);
    }
    let infos = module.kernel_params(kernel);
    if !infos.is_empty() {
        non_null(args.params)?;
    }
    let mut params = Vec::with_capacity(infos.len());
    for (i, info) in infos.iter().enumerate() {
        // SAFETY: `params` holds one pointer per kernel parameter (function contract).
        let p = unsafe { args.params.add(i).read() };
        non_null(p)?;
        // SAFETY: each pointer addresses a value of the parameter's size.
        params.push(unsafe { std::slice::from_raw_parts(p.cast::<u8>(), info.size) }.to_vec());
    }
    let per_sm = blocks_per_sm(args.f, threads as u32)?;
    if per_sm == 0 {
        eprintln!(
            "symm-sim: {}: a block of {threads} threads of {name} does not fit on a \
             multiprocessor at {} registers per thread",
            args.call, driver.config.registers_per_thread
        );
        return Err(E::CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES);
    }
    let blocks = gx as u64 * gy as u64 * gz as u64;
    if args.cooperative && blocks > per_sm as u64 * driver.config.sms as u64 {
        return Err(E::CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE);
    }
    let mut state = driver.lock();
    let sid = state.resolve_stream(args.stream)?;
    if state.streams[&sid].device != device {
        return Err(E::CUDA_ERROR_INVALID_HANDLE);
    }
    state.submit(
        sid,
        OpKind::Kernel(Arc::new(KernelLaunch {
            module,
            kernel,
            name,
            grid: args.grid,
            block: args.block,
            params,
        })),
    )?;
    driver.work.notify_all();
    Ok(())
}

/// `cuLaunchKernel`: queue a grid on `stream`; parameters are copied now.
///
/// # Safety
/// `params` holds one pointer per kernel parameter, each to a value of its size.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLaunchKernel(
    f: CUfunction,
    grid_x: c_uint,
    grid_y: c_uint,
    grid_z: c_uint,
    block_x: c_uint,
    block_y: c_uint,
    block_z: c_uint,
    shared_bytes: c_uint,
    stream: CUstream,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CUresult {
    entry("cuLaunchKernel", || {
        launch(LaunchArgs {
            call: "cuLaunchKernel",
            f,
            grid: [grid_x, grid_y, grid_z],
            block: [block_x, block_y, block_z],
            shared_bytes,
            stream: stream as u64,
            params,
            extra,
            cooperative: false,
            cluster: [1, 1, 1],
        })
    })
}

/// `cuLaunchCooperativeKernel`: as [`cuLaunchKernel`], refused with
/// `CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE` when the grid cannot be resident at once.
///
/// # Safety
/// As [`cuLaunchKernel`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLaunchCooperativeKernel(
    f: CUfunction,
    grid_x: c_uint,
    grid_y: c_uint,
    grid_z: c_uint,
    block_x: c_uint,
    block_y: c_uint,
    block_z: c_uint,
    shared_bytes: c_uint,
    stream: CUstream,
    params: *mut *mut c_void,
) -> CUresult {
    entry("cuLaunchCooperativeKernel", || {
        launch(LaunchArgs {
            call: "cuLaunchCooperativeKernel",
            f,
            grid: [grid_x, grid_y, grid_z],
            block: [block_x, block_y, block_z],
            shared_bytes,
            stream: stream as u64,
            params,
            extra: std::ptr::null_mut(),
            cooperative: true,
            cluster: [1, 1, 1],
        })
    })
}

/// `cuLaunchKernelEx`: attributes `COOPERATIVE` (refused with
/// `CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE` when the grid cannot be resident at once),
/// `CLUSTER_DIMENSION` (1 only), `PRIORITY` and `IGNORE`; others are not supported.
///
/// # Safety
/// `config` points to a launch configuration whose `attrs` holds `numAttrs` attributes;
/// `params` as for [`cuLaunchKernel`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLaunchKernelEx(
    config: *const CUlaunchConfig,
    f: CUfunction,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CUresult {
    entry("cuLaunchKernelEx", || {
        non_null(config)?;
        // SAFETY: a valid configuration (function contract); it has no enum fields.
        let c = unsafe { config.read() };
        let mut cooperative = false;
        let mut cluster = [1, 1, 1];
        if c.numAttrs > 0 {
            non_null(c.attrs)?;
        }
        for i in 0..c.numAttrs as usize {
            // SAFETY: `attrs` holds `numAttrs` attributes (function contract); the id is read
            // as an integer, the value by the union member the id selects.
            let a = unsafe { c.attrs.add(i) };
            // SAFETY: as above.
            let id = unsafe { std::ptr::addr_of!((*a).id).cast::<u32>().read() };
            if id == L::CU_LAUNCH_ATTRIBUTE_COOPERATIVE as u32 {
                // SAFETY: the cooperative member for this id.
                cooperative = unsafe { (*a).value.cooperative } != 0;
            } else if id == L::CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION as u32 {
                // SAFETY: the cluster member for this id.
                let d = unsafe { (*a).value.clusterDim };
                cluster = [d.x, d.y, d.z];
            } else if id != L::CU_LAUNCH_ATTRIBUTE_IGNORE as u32
                && id != L::CU_LAUNCH_ATTRIBUTE_PRIORITY as u32
            {
                return Err(not_supported(&format!(
                    "cuLaunchKernelEx with launch attribute {id}"
                )));
            }
        }
        launch(LaunchArgs {
            call: "cuLaunchKernelEx",
            f,
            grid: [c.gridDimX, c.gridDimY, c.gridDimZ],
            block: [c.blockDimX, c.blockDimY, c.blockDimZ],
            shared_bytes: c.sharedMemBytes,
            stream: c.hStream as u64,
            params,
            extra,
            cooperative,
            cluster,
        })
    })
}
