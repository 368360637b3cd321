//! A typed symmetric window: `len` elements of `T` allocated and registered on every rank.

use super::{Comm, Element, Result};
use crate::abi::SYMM_WIN_COLL_SYMMETRIC;
use crate::comm::windows;
use crate::error::Error;
use crate::log::{Level, Subsys};
use std::marker::PhantomData;
use std::sync::Arc;

/// `len` elements of `T` in symmetric memory of a communicator, registered as a window on every
/// rank (device memory on the cuda backend, host memory on the host backend). Collectives use it
/// inside a [`super::scope`]; outside one it is idle, and its contents are read and written with
/// [`Window::read`] and [`Window::write`]. Dropping it deregisters and frees it, after every
/// launch that used it has ended.
pub struct Window<'c, T: Element> {
    comm: &'c Comm,
    window: Arc<crate::window::Window>,
    address: u64,
    len: usize,
    element: PhantomData<T>,
}

impl Comm {
    /// A window of `len` elements of `T` on this rank. Collective: every rank makes its
    /// windows in the same order, with the same length (one thread driving several ranks:
    /// inside a [`super::group`], where the registration completes at the group's end).
    pub fn window<T: Element>(&self, len: usize) -> Result<Window<'_, T>> {
        let name = "Comm::window";
        let bytes = len
            .checked_mul(size_of::<T>())
            .filter(|b| *b > 0 && *b <= isize::MAX as usize - 4096)
            .ok_or_else(|| {
                self.record(
                    Error::invalid_argument(format!(
                        "len = {len}: a window holds at least one element and at most \
                         isize::MAX bytes"
                    ))
                    .in_function(name),
                )
            })?;
        // A communicator spanning machines keeps its windows on its machine's communicator.
        let machine = self.inner.machine();
        let c = &machine;
        let address = c
            .mem_alloc(bytes)
            .map_err(|e| self.record(e.in_function(name)))?;
        let window = crate::group::register_window(c, address, bytes, SYMM_WIN_COLL_SYMMETRIC)
            .map_err(|e| {
                // A registration that did not complete is undone with its memory.
                if let Some(window) = windows::find(c, address, bytes as u64) {
                    let _ = windows::deregister(c, window.handle());
                }
                let _ = c.mem_free(address);
                self.record(e.in_function(name))
            })?;
        Ok(Window {
            comm: self,
            window,
            address,
            len,
            element: PhantomData,
        })
    }
}

impl<'c, T: Element> Window<'c, T> {
    /// Elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// `false`: a window holds at least one element.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The rank it belongs to.
    pub fn comm(&self) -> &'c Comm {
        self.comm
    }

    /// Its first element's address on this rank (a device address on the cuda backend), for
    /// the C ABI or a kernel. Reading or writing through it while a scope holds the window is
    /// the caller's responsibility.
    pub fn as_ptr(&self) -> u64 {
        self.address
    }

    fn range(&self, what: &str, offset: usize, count: usize) -> Result<u64> {
        match offset.checked_add(count) {
            Some(end) if end <= self.len => Ok(self.address + (offset * size_of::<T>()) as u64),
            _ => Err(self.comm.record(
                Error::invalid_argument(format!(
                    "{count} elements at offset {offset}: the window holds {}",
                    self.len
                ))
                .in_function(what),
            )),
        }
    }

    /// Copy `data` into the window from element `offset` on.
    pub fn write(&mut self, offset: usize, data: &[T]) -> Result<()> {
        let address = self.range("Window::write", offset, data.len())?;
        // SAFETY: `T` is a plain number type (sealed `Element`): its values are bytes with no
        // padding, so viewing `data` as bytes reads only initialized memory.
        let bytes =
            unsafe { std::slice::from_raw_parts(data.as_ptr().cast::<u8>(), size_of_val(data)) };
        let c = &self.comm.inner;
        c.clique
            .backend
            .upload(c.device, address, bytes)
            .map_err(|e| self.comm.record(e.in_function("Window::write")))
    }

    /// Copy `out.len()` elements of the window, from element `offset` on, into `out`.
    pub fn read(&self, offset: usize, out: &mut [T]) -> Result<()> {
        let address = self.range("Window::read", offset, out.len())?;
        // SAFETY: `T` is a plain number type (sealed `Element`) for which every bit pattern is
        // a value, so `out` may be written as bytes.
        let bytes = unsafe {
            std::slice::from_raw_parts_mut(out.as_mut_ptr().cast::<u8>(), size_of_val(out))
        };
        let c = &self.comm.inner;
        c.clique
            .backend
            .download(c.device, address, bytes)
            .map_err(|e| self.comm.record(e.in_function("Window::read")))
    }

    /// The whole window, copied out.
    pub fn to_vec(&self) -> Result<Vec<T>> {
        let mut out = vec![T::default(); self.len];
        self.read(0, &mut out)?;
        Ok(out)
    }
}

impl<T: Element> Drop for Window<'_, T> {
    fn drop(&mut self) {
        let machine = self.comm.inner.machine();
        let c = &machine;
        let freed =
            windows::deregister(c, self.window.handle()).and_then(|()| c.mem_free(self.address));
        if let Err(e) = freed {
            crate::log!(
                Level::Warn,
                Subsys::Reg,
                Some(c.rank),
                "dropping a Window: {e}; its memory stays allocated until the communicator is \
                 destroyed"
            );
        }
    }
}

impl<T: Element> std::fmt::Debug for Window<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Window")
            .field("rank", &self.comm.rank())
            .field("len", &self.len)
            .field("element", &std::any::type_name::<T>())
            .finish()
    }
}
