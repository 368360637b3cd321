//! The Rust API: typed, safe, on the same internals as the C ABI (every collective goes through
//! `group::entry`, every window through the same registration).
//!
//! - [`Comm`]: a rank of a communicator ([`Comm::init_rank`] with a [`UniqueId`],
//!   [`Comm::init_all`] for every rank in one process).
//! - [`Window`]: `len` elements of one [`Element`] type in symmetric memory, registered on
//!   every rank; the data type comes from the type, the length from the window.
//! - [`scope`]: where collectives run. A window is bound to the scope for the scope's whole
//!   life ([`Scope::bind`]), so no code outside touches it while a collective may use it, and
//!   `scope` returns only after every stream it used has run its work, also when the closure
//!   panics: leaking a value (`std::mem::forget`) cannot end a borrow early, since the borrow
//!   is the scope's, not a guard's.
//! - [`group`]: calls made in the closure run together at its end (`symmGroupStart` /
//!   `symmGroupEnd`), as one thread driving several ranks needs.
//! - [`Kernel`] and [`Scope::launch`]: a user's kernel (written with `symm_device::kernel!`),
//!   from its crate's PTX on the cuda backend and as the same function on emulated threads on
//!   the host backend; window parameters from [`Bound::kernel_arg`].

mod comm;
mod element;
mod kernel;
mod scope;
mod window;

pub use crate::error::Error;
pub use comm::{Comm, ShrinkMode, UniqueId, group};
pub use element::{Element, ReduceOp};
pub use kernel::{Kernel, KernelArg, KernelArgs};
pub use scope::{Bound, Scope, Span, Stream, scope};
pub use symm_device::kernel::WindowArg;
pub use window::Window;

/// The result of every call of the Rust API: `std::result::Result<T, symm::Error>` (not
/// exported, so that `use symm::*` leaves `Result` alone).
pub(crate) type Result<T> = std::result::Result<T, Error>;
