//! Kernels loaded on a device: modules from the shipped SASS (one per GPU, loaded whole) or
//! from each kernel's own PTX module (JIT-compiled by the driver, its error and info logs
//! quoted when that fails), users' PTX modules, each function forced onto the device at once
//! rather than at its first launch, and the device's cache of the functions loaded.

use super::CudaBackend;
use super::device::CudaDevice;
use crate::backend::driver::{driver, outside_capture};
use crate::error::{Error, Result};
use crate::log::{Level, Subsys};
use crate::plan::KernelId;
use cudarc::driver::{DriverError, result, sys};
use std::ffi::{CStr, CString, c_void};
use std::panic::catch_unwind;
use std::sync::OnceLock;

/// Bytes of each JIT log buffer given to `cuModuleLoadDataEx`.
const JIT_LOG_BYTES: usize = 16 * 1024;

/// Most characters of a JIT log quoted in an error message.
const JIT_LOG_SHOWN: usize = 4000;

/// A JIT log buffer as text for an error message: up to its first NUL, trimmed, at most
/// [`JIT_LOG_SHOWN`] characters (then marked as cut); `None` when empty.
fn jit_log_text(buffer: &[u8]) -> Option<String> {
    let end = buffer.iter().position(|&b| b == 0).unwrap_or(buffer.len());
    let text = String::from_utf8_lossy(&buffer[..end]);
    let text = text.trim();
    if text.is_empty() {
        return None;
    }
    let mut shown: String = text.chars().take(JIT_LOG_SHOWN).collect();
    if shown.len() < text.len() {
        shown.push_str(" [...]");
    }
    Some(shown)
}

/// `message` followed by the JIT error and info logs that are not empty.
fn with_jit_logs(message: String, error_log: &[u8], info_log: &[u8]) -> String {
    let mut message = message;
    if let Some(log) = jit_log_text(error_log) {
        message.push_str("; JIT error log: ");
        message.push_str(&log);
    }
    if let Some(log) = jit_log_text(info_log) {
        message.push_str("; JIT info log: ");
        message.push_str(&log);
    }
    message
}

/// Load `image` (NUL-terminated PTX, or a cubin) as a module, the JIT writing its error and
/// info logs into the two buffers (`cuModuleLoadDataEx` with the log options).
///
/// # Safety
/// `image` is a NUL-terminated PTX text or a complete cubin; a context is current; nothing is
/// being captured on this thread in global mode (see [`outside_capture`]).
unsafe fn load_module(
    image: *const u8,
    error_log: &mut [u8],
    info_log: &mut [u8],
) -> std::result::Result<sys::CUmodule, DriverError> {
    use sys::CUjit_option::*;
    let mut options = [
        CU_JIT_ERROR_LOG_BUFFER,
        CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES,
        CU_JIT_INFO_LOG_BUFFER,
        CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES,
    ];
    // The size options are unsigned ints passed in the pointer-sized value slots, as the
    // driver API specifies for scalar option values.
    let mut values: [*mut c_void; 4] = [
        error_log.as_mut_ptr().cast(),
        std::ptr::without_provenance_mut(error_log.len()),
        info_log.as_mut_ptr().cast(),
        std::ptr::without_provenance_mut(info_log.len()),
    ];
    let mut module: sys::CUmodule = std::ptr::null_mut();
    // SAFETY: the image is complete (contract); the log buffers are valid for writes of the
    // sizes given and outlive the call; the option and value arrays have 4 entries each.
    unsafe {
        sys::cuModuleLoadDataEx(
            &mut module,
            image.cast(),
            options.len() as u32,
            options.as_mut_ptr(),
            values.as_mut_ptr(),
        )
    }
    .result()?;
    Ok(module)
}

/// Make `function` loaded on the device now rather than at its first launch. With lazy
/// loading (the driver's default since CUDA 12.2, `CUDA_MODULE_LOADING=LAZY`) a function
/// is loaded at first launch, which may happen inside a stream capture or while peers'
/// kernels already wait for this one. `cuFuncLoad` (CUDA 12.4) loads it; older drivers lack
/// it, and there `cuFuncGetAttribute`, which also loads a lazily loaded function, is used.
///
/// # Safety
/// `function` is a valid function handle; its context is current.
unsafe fn force_load(function: sys::CUfunction) -> std::result::Result<(), DriverError> {
    static HAS_FUNC_LOAD: OnceLock<bool> = OnceLock::new();
    let has_func_load = *HAS_FUNC_LOAD.get_or_init(|| {
        catch_unwind(|| {
            // SAFETY: only looks the symbol up in the already loaded driver library.
            unsafe {
                sys::culib()
                    .get::<unsafe extern "C" fn(sys::CUfunction) -> sys::CUresult>(b"cuFuncLoad")
                    .is_ok()
            }
        })
        .unwrap_or(false)
    });
    if has_func_load {
        // SAFETY: a valid function handle (caller's contract); the symbol exists.
        unsafe { sys::cuFuncLoad(function) }.result()
    } else {
        let mut registers = 0;
        // SAFETY: a valid function handle; writes one int.
        unsafe {
            sys::cuFuncGetAttribute(
                &mut registers,
                sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_NUM_REGS,
                function,
            )
        }
        .result()
    }
}

/// A module loaded from the shipped SASS, kept for the process (its functions are).
pub(super) struct SassModule(sys::CUmodule);

impl CudaDevice {
    /// The kernel `kernel`, loaded on the device (see [`CudaDevice::function_by_name`]).
    pub(super) fn function(&self, kernel: KernelId) -> Result<sys::CUfunction> {
        self.function_by_name(&kernel.ptx_name())
    }

    /// The kernel `name`, loaded on the device: the first time, its module is loaded
    /// (JIT-compiled by the driver, which caches the result on disk) and the function is
    /// forced onto the device (see [`force_load`]), with this thread's capture mode relaxed
    /// and this device's context current (the caller's context is restored). A JIT failure
    /// quotes the JIT's error log.
    pub(super) fn function_by_name(&self, name: &str) -> Result<sys::CUfunction> {
        let mut functions = self.functions.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(f) = functions.get(name) {
            return Ok(*f);
        }
        let c_name = CString::new(name).map_err(|_| Error::internal("kernel name has a NUL"))?;
        if let Some(f) = self.sass_function(name, &c_name) {
            functions.insert(name.to_string(), f);
            return Ok(f);
        }
        let module = crate::ptx::kernel_module(self.ptx_target, name).ok_or_else(|| {
            if crate::ptx::text(self.ptx_target).is_none() {
                Error::internal(format!(
                    "the embedded {} PTX does not decompress (a damaged build of libsymm)",
                    self.ptx_target
                ))
            } else {
                Error::internal(format!(
                    "kernel {name} is not in the {} PTX",
                    self.ptx_target
                ))
            }
        })?;
        let image =
            CString::new(module).map_err(|_| Error::internal("embedded PTX contains NUL"))?;
        let f = self.load_function(&image, &c_name, &format!("{name}, {} PTX", self.ptx_target))?;
        functions.insert(name.to_string(), f);
        Ok(f)
    }

    /// Function `c_name` of the PTX `image`, loaded on the device: the module JIT-compiled (a
    /// failure quotes the JIT's logs; `what` names the kernel in messages) and the function
    /// forced onto the device, with this thread's capture mode relaxed and this device's
    /// context current. The module stays loaded for the process once a function of it is kept.
    fn load_function(&self, image: &CString, c_name: &CStr, what: &str) -> Result<sys::CUfunction> {
        let annotate = |e: Error| Error::new(e.code, format!("{} ({what})", e.message));
        let _context = self.context.enter()?;
        let mut error_log = vec![0u8; JIT_LOG_BYTES];
        let mut info_log = vec![0u8; JIT_LOG_BYTES];
        // Loading enqueues nothing on any stream.
        let module = outside_capture(|| {
            // SAFETY: a NUL-terminated PTX image; logs as `load_module` requires; this
            // device's context is current and the capture mode relaxed.
            driver("loading a kernel (cuModuleLoadDataEx)", || unsafe {
                load_module(image.as_ptr().cast(), &mut error_log, &mut info_log)
            })
        })
        .map_err(|e| {
            let e = annotate(e);
            Error::new(e.code, with_jit_logs(e.message, &error_log, &info_log))
        })?;
        // Loading a function enqueues nothing on any stream.
        // SAFETY: `module` was just loaded in the current context; it is never unloaded once a
        // function of it is kept, so the function stays valid for the process.
        let loaded = unsafe { loaded_function(module, c_name) };
        match loaded {
            Ok(f) => Ok(f),
            Err(e) => {
                let _ = outside_capture(|| {
                    // SAFETY: the module was loaded above and none of its functions is kept.
                    driver("cuModuleUnload", || unsafe {
                        result::module::unload(module)
                    })
                });
                Err(annotate(e))
            }
        }
    }

    /// Kernel `name` of a user's PTX module `ptx`, loaded on the device (see
    /// [`CudaDevice::load_function`]) the first time and kept for the process.
    pub(super) fn user_function(&self, ptx: &str, name: &str) -> Result<sys::CUfunction> {
        let key = format!("user {:#x}+{}:{name}", ptx.as_ptr() as usize, ptx.len());
        let mut functions = self.functions.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(f) = functions.get(&key) {
            return Ok(*f);
        }
        let c_name = CString::new(name)
            .map_err(|_| Error::invalid_argument(format!("kernel name {name:?} holds a NUL")))?;
        let image = CString::new(ptx).map_err(|_| {
            Error::invalid_argument(format!("the PTX of kernel {name} holds a NUL"))
        })?;
        let f = self.load_function(&image, &c_name, &format!("the user's kernel {name}"))?;
        functions.insert(key, f);
        Ok(f)
    }

    /// Kernel `name` from the shipped SASS, loaded on the device, or `None` (the caller then
    /// JIT-compiles its PTX): no SASS runs on this GPU, the driver refused the SASS (logged
    /// once), or the function does not load (logged). The first call loads the whole SASS as
    /// one module (the driver loads each function at its first use, or here by `force_load`).
    fn sass_function(&self, name: &str, c_name: &CStr) -> Option<sys::CUfunction> {
        let module = self.sass.get_or_init(|| self.load_sass()).as_ref()?.0;
        let _context = self.context.enter().ok()?;
        // SAFETY: `module` is loaded in this device's context, which is current, and never
        // unloaded.
        let loaded = unsafe { loaded_function(module, c_name) };
        match loaded {
            Ok(f) => Some(f),
            Err(e) => {
                crate::log!(
                    Level::Warn,
                    Subsys::Init,
                    None,
                    "device {}: {name} does not load from the shipped SASS ({}); JIT-compiling \
                     its PTX",
                    self.ordinal,
                    e.message
                );
                None
            }
        }
    }

    /// Load the shipped SASS that runs on this GPU as one module (see
    /// [`CudaDevice::sass_function`]).
    fn load_sass(&self) -> Option<SassModule> {
        let (major, minor) = self.capability;
        let target = crate::ptx::sass_target_for_capability(major, minor)?;
        if crate::config::jit_ptx() {
            return None;
        }
        let image = crate::ptx::sass(target)?;
        let _context = self.context.enter().ok()?;
        let mut error_log = vec![0u8; JIT_LOG_BYTES];
        let mut info_log = vec![0u8; JIT_LOG_BYTES];
        let loaded = outside_capture(|| {
            // SAFETY: a complete cubin that lives for the process; logs as `load_module`
            // requires; this device's context is current and the capture mode relaxed.
            driver("loading the shipped SASS (cuModuleLoadDataEx)", || unsafe {
                load_module(image.as_ptr(), &mut error_log, &mut info_log)
            })
        });
        match loaded {
            Ok(module) => {
                crate::log!(
                    Level::Info,
                    Subsys::Init,
                    None,
                    "device {}: kernels load from the shipped {target} SASS",
                    self.ordinal
                );
                Some(SassModule(module))
            }
            Err(e) => {
                crate::log!(
                    Level::Info,
                    Subsys::Init,
                    None,
                    "device {}: the driver refused the shipped {target} SASS ({}); kernels are \
                     JIT-compiled from the PTX at first use",
                    self.ordinal,
                    with_jit_logs(e.message, &error_log, &info_log)
                );
                None
            }
        }
    }
}

impl CudaBackend {
    /// Where device `ordinal`'s kernels come from: `Some(true)` the shipped SASS, `Some(false)`
    /// the PTX (no SASS runs on the GPU, `SYMM_JIT_PTX`, or the driver refused it), `None`
    /// while the device has loaded no kernel yet.
    pub fn kernels_from_sass(&self, ordinal: i32) -> Option<bool> {
        let devices = self.devices.lock().unwrap_or_else(|e| e.into_inner());
        let device = devices.get(&ordinal)?;
        device.sass.get().map(Option::is_some)
    }

    /// See [`Backend::prepare`](crate::backend::Backend::prepare): load `kernel` on device
    /// `ordinal` now (module, JIT, function on the device), with the capture mode relaxed, so that
    /// no launch has to load it. Later calls for the same kernel only look it up.
    pub fn prepare(&self, ordinal: i32, kernel: KernelId) -> Result<()> {
        self.device(ordinal)?.function(kernel).map(|_| ())
    }
}

/// Function `c_name` of `module`, loaded now (`cuModuleGetFunction`, then `cuFuncLoad`), outside
/// any stream capture (loading enqueues nothing on any stream).
///
/// # Safety
/// `module` is loaded in the current context and stays loaded while the function is used.
unsafe fn loaded_function(module: sys::CUmodule, c_name: &CStr) -> Result<sys::CUfunction> {
    outside_capture(|| {
        // SAFETY: forwarded contract.
        driver(
            "loading a kernel (cuModuleGetFunction, cuFuncLoad)",
            || unsafe {
                let f = result::module::get_function(module, c_name.to_owned())?;
                force_load(f)?;
                Ok(f)
            },
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jit_logs_are_cut_at_the_nul_trimmed_and_bounded() {
        let mut buffer = vec![0u8; 64];
        buffer[..12].copy_from_slice(b"\n error: x\n ");
        assert_eq!(jit_log_text(&buffer).as_deref(), Some("error: x"));
        assert_eq!(jit_log_text(&[0; 16]), None);
        assert_eq!(jit_log_text(b"  \n\t"), None);
        assert_eq!(jit_log_text(b"no nul").as_deref(), Some("no nul"));
        assert_eq!(jit_log_text(b"a\xffb\0junk").as_deref(), Some("a\u{fffd}b"));
        let long = "y".repeat(JIT_LOG_SHOWN + 10);
        let shown = jit_log_text(long.as_bytes()).unwrap();
        assert_eq!(shown, format!("{} [...]", "y".repeat(JIT_LOG_SHOWN)));
        let exact = "z".repeat(JIT_LOG_SHOWN);
        assert_eq!(jit_log_text(exact.as_bytes()), Some(exact));
    }

    #[test]
    fn load_failures_quote_the_logs_that_are_not_empty() {
        let base = "loading a kernel failed".to_string();
        assert_eq!(with_jit_logs(base.clone(), &[0; 8], &[0; 8]), base);
        assert_eq!(
            with_jit_logs(base.clone(), b"ptxas fatal\0", &[0; 8]),
            "loading a kernel failed; JIT error log: ptxas fatal"
        );
        assert_eq!(
            with_jit_logs(base, b"bad\0", b"info\0"),
            "loading a kernel failed; JIT error log: bad; JIT info log: info"
        );
    }
}
