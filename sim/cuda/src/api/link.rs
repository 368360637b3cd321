//! Linking at run time (`cuLinkCreate` … `cuLinkComplete`): PTX inputs, and the PTX inside a
//! fatbinary, a host object or an archive of objects ([`device_code`]: the simulated GPU runs
//! the PTX where a GPU would take the SASS). The linked image is the inputs' PTX in the order
//! added, one module's text after another; the simulator's
//! parser then resolves each `.extern .func` declaration against the definition another input
//! made `.visible`, as the driver's JIT linker resolves relocatable PTX. The image is checked
//! at `cuLinkComplete` (a missing or doubly defined function fails there, with the parser's
//! message in the error log), and `cuModuleLoadData` loads it like any PTX.

use super::device_code::{self, DeviceCodeError};
use crate::state::{self, LinkSession};
use crate::util::{CuResult, Kind, entry, handle, handle_id, non_null, put};
use cudarc::driver::sys::{CUresult, cudaError_enum as E};
use std::ffi::{CStr, CString, c_char, c_uint, c_void};
use symm_sim::Module;

/// `CU_JIT_ERROR_LOG_BUFFER`.
const JIT_ERROR_LOG: u32 = 5;
/// `CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES`.
const JIT_ERROR_LOG_SIZE: u32 = 6;

/// An opaque `CUlinkState`.
pub type CUlinkState = *mut c_void;

fn session_id(link: CUlinkState) -> CuResult<u64> {
    handle_id(Kind::Link, link as u64).ok_or(E::CUDA_ERROR_INVALID_HANDLE)
}

/// Add one input's PTX to the session (one text per fatbin; for an archive, those of every
/// member with device code). What yields no PTX is refused as the driver refuses it, with the
/// reason in the session's error log. The input is read before the driver's lock is taken, so
/// a large archive does not stall the other threads' driver calls.
fn add(link: CUlinkState, kind: u32, name: String, bytes: &[u8]) -> CuResult<()> {
    let id = session_id(link)?;
    let texts = device_code::ptx_of_input(kind, bytes);
    let mut state = state::driver()?.lock();
    let session = state
        .links
        .get_mut(&id)
        .ok_or(E::CUDA_ERROR_INVALID_HANDLE)?;
    if session.image.is_some() {
        return Err(E::CUDA_ERROR_INVALID_VALUE);
    }
    let texts = texts.map_err(|e| {
        write_log(session.error_log, &format!("symm-sim: {name}: {e}"));
        match e {
            DeviceCodeError::InvalidKind(_) => E::CUDA_ERROR_INVALID_VALUE,
            DeviceCodeError::NotText => E::CUDA_ERROR_INVALID_PTX,
            DeviceCodeError::NoCodeForGpu(_) => E::CUDA_ERROR_NO_BINARY_FOR_GPU,
            DeviceCodeError::Unsupported(_) => E::CUDA_ERROR_NOT_SUPPORTED,
            DeviceCodeError::Malformed(_) => E::CUDA_ERROR_INVALID_IMAGE,
        }
    })?;
    let several = texts.len() > 1;
    for (i, text) in texts.into_iter().enumerate() {
        let input = if several {
            format!("{name} (device code {i})")
        } else {
            name.clone()
        };
        session.inputs.push((input, text));
    }
    Ok(())
}

/// Write `message`, cut to fit and NUL-terminated, into the error log buffer (address,
/// capacity) given at `cuLinkCreate`; nothing when none was given.
fn write_log(log: (usize, usize), message: &str) {
    let (buffer, capacity) = log;
    if buffer != 0 && capacity > 0 {
        let n = message.len().min(capacity - 1);
        // SAFETY: the error log buffer of `capacity` bytes the caller gave at cuLinkCreate
        // and keeps valid for the session (cuLinkCreate's contract).
        unsafe {
            let out = std::ptr::with_exposed_provenance_mut::<u8>(buffer);
            std::ptr::copy_nonoverlapping(message.as_ptr(), out, n);
            out.add(n).write(0);
        }
    }
}

/// `cuLinkCreate_v2`: a new session. The error log options are remembered (the log is written
/// when an input is refused and when completion fails); other options are ignored.
///
/// # Safety
/// `options` and `values` hold `count` entries; `out` is valid for one write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLinkCreate_v2(
    count: c_uint,
    options: *mut u32,
    values: *mut *mut c_void,
    out: *mut CUlinkState,
) -> CUresult {
    entry("cuLinkCreate_v2", || {
        non_null(out)?;
        if count > 0 {
            non_null(options)?;
            non_null(values)?;
        }
        let mut state = state::driver()?.lock();
        state.current_healthy()?;
        let mut session = LinkSession::default();
        for i in 0..count as usize {
            // SAFETY: both arrays hold `count` entries (function contract).
            let (option, value) = unsafe { (options.add(i).read(), values.add(i).read()) };
            match option {
                JIT_ERROR_LOG => session.error_log.0 = value as usize,
                // An unsigned int option: only the low 32 bits of the slot are the value.
                JIT_ERROR_LOG_SIZE => session.error_log.1 = value as usize as u32 as usize,
                _ => {}
            }
        }
        let id = state.new_id();
        state.links.insert(id, session);
        // SAFETY: the caller's output pointer.
        unsafe { put(out, handle(Kind::Link, id) as CUlinkState) }
    })
}

/// `cuLinkAddData_v2`: add `size` bytes named `name`: PTX (`CU_JIT_INPUT_PTX`), or the PTX
/// of a fatbinary, object or library (`CU_JIT_INPUT_FATBINARY`, `_OBJECT`, `_LIBRARY`). A
/// cubin, or a container with no PTX for compute_90 or older, is refused with
/// `CUDA_ERROR_NO_BINARY_FOR_GPU`; a malformed one with `CUDA_ERROR_INVALID_IMAGE`.
///
/// # Safety
/// `data` holds `size` bytes; `name` is NULL or NUL-terminated.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLinkAddData_v2(
    link: CUlinkState,
    kind: u32,
    data: *mut c_void,
    size: usize,
    name: *const c_char,
    _count: c_uint,
    _options: *mut u32,
    _values: *mut *mut c_void,
) -> CUresult {
    entry("cuLinkAddData_v2", || {
        non_null(data)?;
        // SAFETY: `size` bytes at `data`; a NUL-terminated name (function contract).
        let (bytes, name) = unsafe {
            (
                std::slice::from_raw_parts(data.cast::<u8>(), size),
                name_of(name),
            )
        };
        add(link, kind, name, bytes)
    })
}

/// `cuLinkAddFile_v2`: add the file at `path`, of any kind `cuLinkAddData_v2` takes.
///
/// # Safety
/// `path` is NUL-terminated.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLinkAddFile_v2(
    link: CUlinkState,
    kind: u32,
    path: *const c_char,
    _count: c_uint,
    _options: *mut u32,
    _values: *mut *mut c_void,
) -> CUresult {
    entry("cuLinkAddFile_v2", || {
        non_null(path)?;
        // SAFETY: NUL-terminated (function contract).
        let path = unsafe { name_of(path) };
        let bytes = std::fs::read(&path).map_err(|_| E::CUDA_ERROR_FILE_NOT_FOUND)?;
        add(link, kind, path, &bytes)
    })
}

/// `cuLinkComplete`: the linked image (NUL-terminated PTX, owned by the session until
/// `cuLinkDestroy`) and its size. A link error (an undefined or doubly defined function, PTX
/// the simulator does not take) returns `CUDA_ERROR_INVALID_PTX`, with the message in the
/// error log given at `cuLinkCreate`.
///
/// # Safety
/// `image` and `size` are valid for one write each; the error log buffer given at creation
/// is still valid.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLinkComplete(
    link: CUlinkState,
    image: *mut *mut c_void,
    size: *mut usize,
) -> CUresult {
    entry("cuLinkComplete", || {
        non_null(image)?;
        non_null(size)?;
        let id = session_id(link)?;
        let driver = state::driver()?;
        let (text, log) = {
            let state = driver.lock();
            let session = state.links.get(&id).ok_or(E::CUDA_ERROR_INVALID_HANDLE)?;
            if session.inputs.is_empty() {
                return Err(E::CUDA_ERROR_INVALID_VALUE);
            }
            let mut text = String::new();
            for (name, ptx) in &session.inputs {
                text.push_str(&format!("// symm-sim link input: {name}\n"));
                text.push_str(ptx);
                text.push('\n');
            }
            (text, session.error_log)
        };
        if let Err(e) = Module::load(&text) {
            write_log(log, &format!("symm-sim: link failed: {e}"));
            return Err(E::CUDA_ERROR_INVALID_PTX);
        }
        let linked = CString::new(text).map_err(|_| E::CUDA_ERROR_INVALID_PTX)?;
        let mut state = driver.lock();
        let session = state
            .links
            .get_mut(&id)
            .ok_or(E::CUDA_ERROR_INVALID_HANDLE)?;
        let bytes = linked.as_bytes_with_nul().len();
        let at = linked.as_ptr() as *mut c_void;
        session.image = Some(linked);
        // SAFETY: the caller's output pointers.
        unsafe {
            put(size, bytes)?;
            put(image, at)
        }
    })
}

/// `cuLinkDestroy`: end the session and free its image.
///
/// # Safety
/// No pointer is dereferenced.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLinkDestroy(link: CUlinkState) -> CUresult {
    entry("cuLinkDestroy", || {
        let id = session_id(link)?;
        state::driver()?
            .lock()
            .links
            .remove(&id)
            .map(drop)
            .ok_or(E::CUDA_ERROR_INVALID_HANDLE)
    })
}

/// A NUL-terminated C string as text (empty for NULL).
///
/// # Safety
/// `p` is NULL or NUL-terminated.
unsafe fn name_of(p: *const c_char) -> String {
    if p.is_null() {
        return String::new();
    }
    // SAFETY: NUL-terminated (caller's contract).
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}
