//! The host backend: host memory, kernels run on CPU threads: on the calling thread by
//! `arch::host::run_on_this_thread` when a launch is one thread in all (the fast mode, one
//! rank), else on OS threads by `arch::host::run_grid`. Calls complete before they return.

use crate::abi::symmResult_t;
use crate::error::{Error, Result};
use crate::launch::Launch;
use crate::plan::KernelId;
use std::alloc::Layout;
use std::collections::BTreeMap;
use std::sync::Mutex;
use symm_device::arch::host::{run_grid, run_on_this_thread};
use symm_device::symmetric::dispatch;
use symm_device::symmetric::{KernelStatus, TaskArgs, for_virtual_rank, report_invalid_launch};

/// Alignment of every host allocation (a page, as device allocations are at least that).
const ALIGNMENT: usize = 4096;

/// Host memory and CPU kernels.
pub struct HostBackend {
    /// Live allocations by address (an ordered map, whose memory follows its entries: a hash
    /// map's capacity grows with the removals it has seen).
    allocations: Mutex<BTreeMap<u64, Layout>>,
}

impl HostBackend {
    /// A host backend with no allocations.
    pub fn new() -> Self {
        HostBackend {
            allocations: Mutex::new(BTreeMap::new()),
        }
    }

    /// Allocate zeroed, page-aligned host memory.
    pub fn alloc_zeroed(&self, bytes: usize) -> Result<u64> {
        let layout = Layout::from_size_align(bytes.max(1), ALIGNMENT)
            .map_err(|_| Error::invalid_argument(format!("size {bytes} is too large")))?;
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        if ptr.is_null() {
            return Err(Error::new(
                symmResult_t::symmOutOfMemory,
                format!("host allocation of {bytes} bytes failed"),
            ));
        }
        let address = ptr as u64;
        self.lock().insert(address, layout);
        Ok(address)
    }

    /// Free an allocation of this backend.
    pub fn free(&self, address: u64) -> Result<()> {
        let layout = self
            .lock()
            .remove(&address)
            .ok_or_else(|| Error::internal(format!("host free of unknown address {address:#x}")))?;
        // SAFETY: `address` came from `alloc_zeroed` with this layout and is freed once (it was
        // just removed from the table).
        unsafe { std::alloc::dealloc(address as *mut u8, layout) };
        Ok(())
    }

    /// Copy bytes into host memory of this backend.
    pub fn upload(&self, address: u64, bytes: &[u8]) -> Result<()> {
        // SAFETY: callers pass an address inside one of their allocations with room for
        // `bytes` (the window/context builders size the allocation from the same data).
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), address as *mut u8, bytes.len()) };
        Ok(())
    }

    /// Copy bytes out of host memory of this backend.
    pub fn download(&self, address: u64, out: &mut [u8]) -> Result<()> {
        // SAFETY: callers pass an address inside one of their allocations holding `out.len()`
        // bytes; `out` is a distinct Rust buffer.
        unsafe { std::ptr::copy_nonoverlapping(address as *const u8, out.as_mut_ptr(), out.len()) };
        Ok(())
    }

    /// Run `launch` on CPU threads and return when every emulated thread has finished:
    /// whether every one completed its collective (`false`: some gave up, or refused the
    /// launch, and the abort word says why).
    pub fn launch(&self, launch: &Launch) -> Result<bool> {
        let KernelId {
            algorithm,
            dtype,
            op,
        } = launch.kernel;
        let body = dispatch::kernel(algorithm, dtype, op);
        let ranks = launch.rank_ids.len() as u32;
        let task_count = launch.task_count;
        let table: &[TaskArgs] = &launch.tasks;
        if ranks == 0 || table.len() != ranks as usize * task_count as usize {
            return Err(Error::internal(format!(
                "a work table of {} entries for {ranks} ranks x {task_count} tasks",
                table.len()
            )));
        }
        let completed = std::sync::atomic::AtomicBool::new(true);
        let kernel = || {
            // SAFETY: the table holds `ranks × task_count` entries whose contexts were built
            // by `windows::complete`, alive while the tasks hold their windows; the arguments
            // were validated against the windows.
            unsafe {
                let status = for_virtual_rank(table.as_ptr(), task_count, ranks, |batch, grid| {
                    body(batch, grid)
                });
                if status == KernelStatus::InvalidLaunch {
                    report_invalid_launch(table.as_ptr(), task_count, ranks);
                }
                if status != KernelStatus::Completed {
                    completed.store(false, std::sync::atomic::Ordering::Relaxed);
                }
            }
        };
        if launch.grid * ranks == 1 && launch.block == 1 {
            // One thread in all (the fast mode, one rank): no thread to create.
            run_on_this_thread(&kernel);
        } else {
            run_grid(launch.grid * ranks, launch.block, &kernel);
        }
        Ok(completed.into_inner())
    }

    /// `true` while `address` is an allocation of this backend.
    #[cfg(test)]
    pub fn is_allocated(&self, address: u64) -> bool {
        self.lock().contains_key(&address)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, Layout>> {
        self.allocations.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Default for HostBackend {
    fn default() -> Self {
        Self::new()
    }
}
