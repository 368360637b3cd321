//! Users' kernels, launched from a [`Scope`]: a kernel written with `symm_device::kernel!`
//! runs on the cuda backend from the PTX its crate compiles to, and on the host backend as the
//! same function compiled for the host, on emulated threads. One call, [`Scope::launch`], for
//! both; the window arguments come from windows bound to the scope ([`Bound::kernel_arg`]), so
//! they outlive the launch.

use super::scope::{Bound, Scope};
use super::{Element, Result};
use crate::error::Error;
use std::marker::PhantomData;
use symm_device::kernel::WindowArg;

mod sealed {
    pub trait Sealed {}
}

/// One parameter of a kernel, as the launch passes it: a [`WindowArg`] or a number. Sealed.
pub trait KernelArg: Send + Sync + sealed::Sealed {
    /// The parameter's bytes (little-endian, its size), as `cuLaunchKernel` passes it.
    #[doc(hidden)]
    fn bytes(&self) -> Vec<u8>;
    /// The context address of a window argument, else `None`.
    #[doc(hidden)]
    fn window(&self) -> Option<u64>;
    /// The same argument again, for another emulated thread of the host backend.
    #[doc(hidden)]
    fn again(&self) -> Self;
}

macro_rules! number_arg {
    ($($t:ty),*) => {$(
        impl sealed::Sealed for $t {}
        impl KernelArg for $t {
            fn bytes(&self) -> Vec<u8> {
                self.to_le_bytes().to_vec()
            }
            fn window(&self) -> Option<u64> {
                None
            }
            fn again(&self) -> Self {
                *self
            }
        }
    )*};
}

number_arg!(u32, i32, u64, i64, f32, f64);

impl<T: symm_device::kernel::Element> sealed::Sealed for WindowArg<T> {}

impl<T: symm_device::kernel::Element> KernelArg for WindowArg<T> {
    fn bytes(&self) -> Vec<u8> {
        self.context_address().to_le_bytes().to_vec()
    }
    fn window(&self) -> Option<u64> {
        Some(self.context_address())
    }
    fn again(&self) -> Self {
        // SAFETY: the same context as `self`, which `Bound::kernel_arg` made from a window
        // bound to a scope, checked again by `Scope::launch` before any use.
        unsafe { WindowArg::from_context_address(self.context_address()) }
    }
}

/// A kernel's parameters: a tuple of [`KernelArg`]s, in the kernel's order.
pub trait KernelArgs: Send + Sync + sealed::Sealed {
    /// Each parameter's bytes, in order.
    #[doc(hidden)]
    fn each(&self) -> Vec<Vec<u8>>;
    /// The context addresses of the window parameters.
    #[doc(hidden)]
    fn windows(&self) -> Vec<u64>;
    /// The same arguments again.
    #[doc(hidden)]
    fn again(&self) -> Self;
}

macro_rules! args_tuple {
    ($($name:ident),+) => {
        impl<$($name: KernelArg),+> sealed::Sealed for ($($name,)+) {}
        impl<$($name: KernelArg),+> KernelArgs for ($($name,)+) {
            #[allow(non_snake_case)]
            fn each(&self) -> Vec<Vec<u8>> {
                let ($($name,)+) = self;
                vec![$($name.bytes()),+]
            }
            #[allow(non_snake_case)]
            fn windows(&self) -> Vec<u64> {
                let ($($name,)+) = self;
                [$($name.window()),+].into_iter().flatten().collect()
            }
            #[allow(non_snake_case)]
            fn again(&self) -> Self {
                let ($($name,)+) = self;
                ($($name.again(),)+)
            }
        }
    };
}

args_tuple!(A);
args_tuple!(A, B);
args_tuple!(A, B, C);
args_tuple!(A, B, C, D);
args_tuple!(A, B, C, D, E);
args_tuple!(A, B, C, D, E, F);
args_tuple!(A, B, C, D, E, F, G);
args_tuple!(A, B, C, D, E, F, G, H);

/// A user's kernel: its entry's name in the PTX of its crate (the cuda backend loads that
/// module once per device), and the same function compiled for the host (the host backend runs
/// it on every emulated thread of the grid). `A` is the tuple of its parameters.
pub struct Kernel<A: KernelArgs> {
    name: &'static str,
    ptx: &'static str,
    host: fn(A),
    arguments: PhantomData<fn(A)>,
}

impl<A: KernelArgs> Kernel<A> {
    /// The kernel `name` of `ptx` (the text its crate compiled to for `nvptx64-nvidia-cuda`),
    /// whose host form is `host` (the same `kernel!` function, taking its parameters as a
    /// tuple: `|(window, n)| my_kernel(window, n)`).
    pub const fn new(name: &'static str, ptx: &'static str, host: fn(A)) -> Self {
        Kernel {
            name,
            ptx,
            host,
            arguments: PhantomData,
        }
    }

    /// The entry's name.
    pub fn name(&self) -> &'static str {
        self.name
    }
}

impl<'s, T: Element + symm_device::kernel::Element> Bound<'s, T> {
    /// This window as a kernel parameter: the device address of this rank's context of it. The
    /// window stays bound, so alive, until the scope has synchronized every launch.
    pub fn kernel_arg(&self) -> WindowArg<T> {
        // SAFETY: the context of a window bound to the scope for the scope's whole life; every
        // launch that takes it is checked against the scope's windows (`Scope::launch`) and
        // completes before the scope returns.
        unsafe { WindowArg::from_context_address(self.context_address()) }
    }
}

impl Scope<'_, '_> {
    /// Launch `kernel` with `grid` blocks of `block` threads on the rank and stream `on` is
    /// bound to, with `args`: on the cuda backend its entry in its PTX (loaded once per device,
    /// with the co-residency check symm's own launches get: `grid` blocks of every rank on the
    /// device must be resident at once, since frames wait on peers), on the host backend its
    /// host form on emulated threads (the call returns when it ran). Every window argument must
    /// be a window bound to this scope on that rank. Outside a group only (on the host backend
    /// a rank's grid runs in the calling thread: ranks need a thread each).
    pub fn launch<U: Element, A: KernelArgs>(
        &self,
        on: &Bound<'_, U>,
        kernel: &Kernel<A>,
        grid: u32,
        block: u32,
        args: A,
    ) -> Result<()> {
        let name = "Scope::launch";
        let comm = on.comm();
        let refuse =
            |message: String| comm.record(Error::invalid_argument(message).in_function(name));
        if crate::group::active() {
            return Err(comm.record(
                Error::invalid_usage(
                    "inside a group: a user's kernel is launched by the rank's own thread, \
                     outside groups",
                )
                .in_function(name),
            ));
        }
        if grid == 0 || block == 0 || block > 1024 {
            return Err(refuse(format!(
                "grid = {grid}, block = {block}: a launch has 1 or more blocks of 1 to 1024 \
                 threads"
            )));
        }
        let windows = args.windows();
        let slots = symm_device::sync::signal_pad::MAX_BLOCKS as u32;
        if !windows.is_empty() && grid > slots {
            return Err(refuse(format!(
                "grid = {grid} blocks for kernel {}: a kernel that takes windows runs at most \
                 {slots} blocks (a window has {slots} barrier slots; Block::window refuses more)",
                kernel.name
            )));
        }
        if !kernel.ptx.is_empty() && !declares_entry(kernel.ptx, kernel.name) {
            return Err(refuse(format!(
                "kernel {}: its PTX declares no entry of that name (the name given to Kernel::new \
                 must be the kernel! function's)",
                kernel.name
            )));
        }
        let bound = self.bound_contexts(comm);
        if let Some(foreign) = windows.iter().find(|c| !bound.iter().any(|(b, _)| b == *c)) {
            return Err(refuse(format!(
                "a window argument (context {foreign:#x}) is not a window bound to this scope on \
                 rank {}: pass Bound::kernel_arg of a window the scope holds",
                comm.rank()
            )));
        }
        if let Some(elsewhere) = windows
            .iter()
            .find(|c| !bound.contains(&(**c, on.stream_raw())))
        {
            return Err(refuse(format!(
                "a window argument (context {elsewhere:#x}) is bound to another stream than the \
                 launch's: a kernel and the window's other work must be in one stream's order \
                 (its barriers count the window's epochs)"
            )));
        }
        if let Some((i, twice)) = windows
            .iter()
            .enumerate()
            .find(|(i, c)| windows[..*i].contains(c))
        {
            return Err(refuse(format!(
                "window argument {} (counting from 1; context {twice:#x}) names a window an \
                 earlier argument already names: a kernel opens each window once (its barrier \
                 slots are one per block)",
                i + 1
            )));
        }
        crate::comm::failure::check(&comm.inner).map_err(|e| comm.record(e.in_function(name)))?;
        if comm.inner.span.get().is_some() {
            let error = crate::comm::span::unsupported("a kernel launch on the whole communicator");
            return Err(comm.record(error.in_function(name)));
        }
        let inner = &comm.inner;
        let launched = match inner.clique.backend.kind() {
            crate::backend::BackendKind::Host => {
                symm_device::arch::host::run_grid(grid, block, &|| (kernel.host)(args.again()));
                Ok(())
            }
            _ => inner.clique.backend.launch_user_kernel(
                inner.device,
                inner.clique.ranks_on_device(inner.device),
                (kernel.ptx, kernel.name),
                (grid, block),
                &args.each(),
                on.stream_raw(),
            ),
        };
        launched.map_err(|e| comm.record(e.in_function(name)))
    }
}

/// `true` when `ptx` declares the kernel entry `name` (`.entry name(`).
fn declares_entry(ptx: &str, name: &str) -> bool {
    ptx.match_indices(".entry ").any(|(at, entry)| {
        let rest = &ptx[at + entry.len()..];
        rest.strip_prefix(name)
            .is_some_and(|after| after.starts_with('(') || after.starts_with(char::is_whitespace))
    })
}

#[cfg(test)]
mod tests {
    use super::declares_entry;

    #[test]
    fn an_entry_is_found_by_its_whole_name() {
        let ptx = ".version 8.0\n.visible .entry ring_then_sum(\n\t.param .u64 p0\n)\n";
        assert!(declares_entry(ptx, "ring_then_sum"));
        assert!(!declares_entry(ptx, "ring_then"));
        assert!(!declares_entry(ptx, "ring_then_sum_2"));
        assert!(!declares_entry("", "ring_then_sum"));
    }
}
