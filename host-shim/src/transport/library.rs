//! Shared libraries of other engines (NCCL, NVSHMEM), opened at run time with `dlopen`, never
//! a build dependency: the engine adapters' and the rails' between machines.

use crate::error::{Error, Result};
use std::collections::HashMap;
use std::ffi::{CStr, CString, c_void};
use std::sync::{Arc, Mutex};

/// A shared library opened with `dlopen`, kept open for the process (its functions may be
/// held by windows until the process ends).
pub struct Library {
    handle: usize,
    /// The name or path it was opened by.
    pub name: String,
}

impl Library {
    /// The address of `symbol`, or an error naming the library and the symbol.
    pub fn symbol(&self, symbol: &str) -> Result<*mut c_void> {
        let name = CString::new(symbol).map_err(|_| Error::internal("a symbol with a NUL"))?;
        // SAFETY: `handle` came from a successful dlopen and is never closed; `name` is a
        // NUL-terminated string.
        let address = unsafe { libc::dlsym(self.handle as *mut c_void, name.as_ptr()) };
        if address.is_null() {
            return Err(Error::new(
                crate::abi::symmResult_t::symmSystemError,
                format!("{} has no {symbol}: too old a library?", self.name),
            ));
        }
        Ok(address)
    }
}

/// Libraries opened so far, by the name they were asked for.
static OPENED: Mutex<Option<HashMap<String, Arc<Library>>>> = Mutex::new(None);

/// The engine library: `requested` (its setting, named `override_env` in messages) when set,
/// else `soname` if the process loaded it already (PyTorch loads its NCCL, say), else `soname`
/// found by the dynamic loader.
pub fn open(
    what: &str,
    soname: &str,
    requested: Option<String>,
    override_env: &str,
) -> Result<Arc<Library>> {
    let key = requested.clone().unwrap_or_else(|| soname.to_string());
    let mut opened = OPENED.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(library) = opened.get_or_insert_with(HashMap::new).get(&key) {
        return Ok(library.clone());
    }
    let name = CString::new(key.clone())
        .map_err(|_| Error::invalid_argument(format!("{override_env} contains a NUL byte")))?;
    let mut handle = if requested.is_none() {
        // SAFETY: a NUL-terminated name; dlopen has no other precondition.
        unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD) }
    } else {
        std::ptr::null_mut()
    };
    if handle.is_null() {
        // SAFETY: as above.
        handle = unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) };
    }
    if handle.is_null() {
        // SAFETY: dlerror returns NULL or a NUL-terminated string valid until the next call.
        let reason = unsafe {
            let text = libc::dlerror();
            if text.is_null() {
                String::from("unknown reason")
            } else {
                CStr::from_ptr(text).to_string_lossy().into_owned()
            }
        };
        return Err(Error::new(
            crate::abi::symmResult_t::symmSystemError,
            format!(
                "{what} could not be loaded ({reason}): install it, or name its library in \
                 {override_env}"
            ),
        ));
    }
    let library = Arc::new(Library {
        handle: handle as usize,
        name: key.clone(),
    });
    opened
        .get_or_insert_with(HashMap::new)
        .insert(key, library.clone());
    Ok(library)
}

/// Resolve `symbol` of `library` as a function of type `F` (a `unsafe extern "C" fn`).
///
/// # Safety
/// `F` must be the symbol's C signature.
pub unsafe fn function<F: Copy>(library: &Library, symbol: &str) -> Result<F> {
    let address = library.symbol(symbol)?;
    debug_assert_eq!(std::mem::size_of::<F>(), std::mem::size_of::<*mut c_void>());
    // SAFETY: a non-NULL function address; the caller vouches for its type.
    Ok(unsafe { std::mem::transmute_copy::<*mut c_void, F>(&address) })
}
