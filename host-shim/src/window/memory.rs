//! `symmMemAlloc` allocations and how long they live.
//!
//! The kernels of a rank write into the windows of the other ranks of its process directly
//! (same address space), so the memory under a window must outlive every peer window registered
//! over it, not only its owner's hold: a peer may launch a kernel after this rank failed,
//! deregistered and freed (its launch passed its checks before the failure was known), and
//! that kernel's first store into this rank's memory must not find it unmapped. So an
//! [`Allocation`] is shared: its owner holds it until `symmMemFree` (or `symmCommDestroy`), and
//! each window of another rank of this process registered over it holds it too, until that
//! window is torn down after its own launches ended. The memory is freed when the last holder
//! lets go. Ranks of other processes map the memory themselves (CUDA VMM, memfd), and their
//! mapping keeps it alive the same way.

use crate::backend::Backend;
use crate::transport::shareable::Shareable;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, Weak};

/// One `symmMemAlloc` allocation of a rank (the caller's, or a communicator's internal
/// window), freed when its last holder drops it.
pub struct Allocation {
    backend: Arc<Backend>,
    device: i32,
    /// Its address.
    pub address: u64,
    /// Its length in bytes.
    pub size: usize,
    /// The shareable memory behind it, when ranks of other processes map it (else it is the
    /// backend's memory, freed through the backend).
    shared: Option<Shareable>,
}

impl Allocation {
    /// Memory of `backend` on `device` at `address`, `size` bytes, owned from now on.
    pub fn from_backend(backend: &Arc<Backend>, device: i32, address: u64, size: usize) -> Self {
        Allocation {
            backend: backend.clone(),
            device,
            address,
            size,
            shared: None,
        }
    }

    /// Shareable memory, owned from now on.
    pub fn from_shared(
        backend: &Arc<Backend>,
        device: i32,
        memory: Shareable,
        size: usize,
    ) -> Self {
        Allocation {
            backend: backend.clone(),
            device,
            address: memory.address(),
            size,
            shared: Some(memory),
        }
    }

    /// The shareable memory behind it, if ranks of other processes map it.
    pub fn shared(&self) -> Option<&Shareable> {
        self.shared.as_ref()
    }

    /// `true` if `[address, address + bytes)` lies inside it.
    pub fn contains(&self, address: u64, bytes: u64) -> bool {
        address >= self.address
            && address
                .checked_add(bytes)
                .is_some_and(|end| end <= self.address + self.size as u64)
    }
}

impl Drop for Allocation {
    fn drop(&mut self) {
        if self.shared.is_none() {
            let _ = self.backend.free(self.device, self.address);
        }
    }
}

/// The live allocations of a clique's ranks in this process, by address, so that a window can
/// hold those of its peers (entries of freed allocations are dropped as new ones come).
#[derive(Default)]
pub struct Allocations(Mutex<BTreeMap<u64, Weak<Allocation>>>);

impl Allocations {
    /// Make `allocation` known to the clique's other ranks.
    pub fn insert(&self, allocation: &Arc<Allocation>) {
        let mut map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        map.retain(|_, a| a.strong_count() > 0);
        map.insert(allocation.address, Arc::downgrade(allocation));
    }

    /// The live allocation holding `[address, address + bytes)`.
    pub fn holding(&self, address: u64, bytes: u64) -> Option<Arc<Allocation>> {
        let map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        map.range(..=address)
            .next_back()
            .and_then(|(_, a)| a.upgrade())
            .filter(|a| a.contains(address, bytes))
    }
}
