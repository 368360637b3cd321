//! Windows over the memory of another communication engine, NCCL's registered windows
//! ([`nccl`]) and NVSHMEM's symmetric heap ([`nvshmem`]): each adapter asks the engine's host
//! library, loaded at run time (never a build dependency), where every rank's bytes are mapped
//! in this process, allocates the window's signal pads through the same engine, and registers
//! the whole as a window over another owner's memory
//! ([`crate::comm::windows::register_peers`]). symm's kernels then run on it unchanged.

pub mod nccl;
pub mod nvshmem;

use crate::comm::Comm;
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

/// Tag space of the adapters' agreements ([`agree_prepared`]), apart from the other
/// all-gathers of a communicator.
const ENGINE_TAG: u64 = 1 << 59;

/// Before any rank enters the engine's own collective calls (which wait for every rank,
/// unbounded), every rank says whether its local preparation of `call` (`prepared`: loading
/// the engine, checking the ranks, allocating what it can alone) worked. `Ok` on every rank
/// when all did; else each rank fails at once, a rank whose preparation failed with its own
/// error, the others naming the first such rank and its error: none enters the engine's
/// collectives, none is left waiting in them. Bounded by the communicator's timeout.
pub fn agree_prepared(comm: &Comm, call: &str, prepared: &Result<()>) -> Result<()> {
    // Every rank makes its registrations in one order and this one has not taken its number
    // yet: the next number is the same on every rank.
    let seq = comm.lock().next_window_seq;
    let payload = match prepared {
        Ok(()) => vec![1],
        Err(e) => [&[0][..], e.message.as_bytes()].concat(),
    };
    let parts = crate::comm::split::gather(comm, call, ENGINE_TAG | seq, &payload)?;
    prepared.clone()?;
    match parts
        .iter()
        .enumerate()
        .find(|(_, part)| part.first() != Some(&1))
    {
        Some((rank, part)) => Err(Error::new(
            crate::abi::symmResult_t::symmRemoteError,
            format!(
                "rank {rank} could not prepare its part of {call} ({}): no rank entered the \
                 engine's collective calls",
                String::from_utf8_lossy(part.get(1..).unwrap_or_default())
            ),
        )),
        None => Ok(()),
    }
}

/// Refuse an adapter call inside a group: the engine's own registration of the window's pads is
/// collective and runs in the call, so one thread cannot do it for several ranks.
pub fn refuse_in_group(call: &str) -> Result<()> {
    if crate::group::active() {
        return Err(Error::invalid_usage(format!(
            "{call} inside symmGroupStart/symmGroupEnd: the engine's registration of the \
             window's signal pads is collective and runs in the call, so every rank calls it \
             from a thread (or process) of its own, outside a group"
        )));
    }
    Ok(())
}
