//! The flat address space kernels access: ranges of host memory registered by the driver,
//! each with the devices allowed to touch it, and the checked host accesses themselves.

use std::sync::atomic::{AtomicU8, AtomicU16, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// One mapped range.
#[derive(Clone, Debug)]
pub(crate) struct MapRange {
    /// First byte.
    pub base: u64,
    /// One past the last byte.
    pub end: u64,
    /// Device mask.
    pub devices: u64,
    /// Its name in reports.
    pub what: Arc<str>,
    /// Host memory the GPU reaches across PCIe (`cuMemHostAlloc`): a GPU thread's load from
    /// it costs [`crate::SimConfig::host_read_ns`].
    pub host: bool,
}

/// The shared state behind [`AddressSpace`].
#[derive(Debug, Default)]
pub(crate) struct Ranges {
    /// Sorted, non-overlapping ranges and a snapshot of them for the simulators.
    inner: Mutex<(Vec<MapRange>, Arc<[MapRange]>)>,
    /// Bumped on every change.
    generation: AtomicU64,
}

impl Ranges {
    fn edit(&self, f: impl FnOnce(&mut Vec<MapRange>)) {
        let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        f(&mut g.0);
        g.0.sort_by_key(|r| r.base);
        g.1 = g.0.clone().into();
        self.generation.fetch_add(1, Ordering::Release);
    }

    /// Remove `[base, end)` from every range, splitting ranges that straddle it.
    fn cut(v: &mut Vec<MapRange>, base: u64, end: u64) {
        let mut out = Vec::with_capacity(v.len() + 1);
        for r in v.drain(..) {
            if r.end <= base || r.base >= end {
                out.push(r);
                continue;
            }
            if r.base < base {
                out.push(MapRange {
                    end: base,
                    ..r.clone()
                });
            }
            if r.end > end {
                out.push(MapRange { base: end, ..r });
            }
        }
        *v = out;
    }

    pub fn map(&self, base: u64, len: u64, what: &str, devices: u64, host: bool) {
        let end = base.saturating_add(len);
        self.edit(|v| {
            Self::cut(v, base, end);
            if len > 0 {
                v.push(MapRange {
                    base,
                    end,
                    devices,
                    what: what.into(),
                    host,
                });
            }
        });
    }

    pub fn set_devices(&self, base: u64, len: u64, devices: u64) {
        let end = base.saturating_add(len);
        self.edit(|v| {
            let mut changed = Vec::new();
            for r in v.iter() {
                if r.end > base && r.base < end {
                    changed.push(MapRange {
                        base: r.base.max(base),
                        end: r.end.min(end),
                        devices,
                        what: r.what.clone(),
                        host: r.host,
                    });
                }
            }
            Self::cut(v, base, end);
            v.extend(changed);
        });
    }

    pub fn unmap(&self, base: u64, len: u64) {
        let end = base.saturating_add(len);
        self.edit(|v| Self::cut(v, base, end));
    }

    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    pub fn snapshot(&self) -> (u64, Arc<[MapRange]>) {
        let g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        (self.generation(), g.1.clone())
    }
}

/// The memory kernels may touch: ranges the driver registered (device allocations, mapped
/// host memory, VMM mappings). Shared between the driver's threads.
///
/// Kernels read and write a mapped range directly (a device address is a host address):
/// whoever maps a range must keep it valid, readable and writable host memory until it is
/// unmapped, and must not unmap it while a kernel that may touch it runs.
#[derive(Debug, Default)]
pub struct AddressSpace {
    ranges: Ranges,
}

impl AddressSpace {
    /// An empty address space.
    pub fn new() -> AddressSpace {
        AddressSpace::default()
    }

    /// Allow kernels running on the devices of mask `devices` (bit d: device d; `u64::MAX`:
    /// all) to access `[base, base + len)`; `what` names it in reports.
    pub fn map(&self, base: u64, len: u64, what: &str, devices: u64) {
        self.ranges.map(base, len, what, devices, false);
    }

    /// [`AddressSpace::map`] for host memory that GPUs reach across PCIe (pinned host
    /// allocations): a GPU thread's load from it costs [`SimConfig::host_read_ns`].
    ///
    /// [`SimConfig::host_read_ns`]: crate::SimConfig::host_read_ns
    pub fn map_host(&self, base: u64, len: u64, what: &str, devices: u64) {
        self.ranges.map(base, len, what, devices, true);
    }

    /// Change which devices may access the mapped range starting at `base` (as
    /// `cuMemSetAccess` does); an access from another device is a fault.
    pub fn set_devices(&self, base: u64, len: u64, devices: u64) {
        self.ranges.set_devices(base, len, devices);
    }

    /// Forbid `[base, base + len)` again.
    pub fn unmap(&self, base: u64, len: u64) {
        self.ranges.unmap(base, len);
    }
}

/// Ranges remembered by a [`MemView`] (the kernels of a collective touch one window per
/// peer in turn).
const CACHED: usize = 16;

/// A simulator's view of the address space: a snapshot refreshed when the driver changes it,
/// and a small cache of the ranges hit last.
#[derive(Debug)]
pub(crate) struct MemView {
    pub space: Arc<AddressSpace>,
    generation: u64,
    ranges: Arc<[MapRange]>,
    /// (first byte, one past the last, device mask, host memory) of recently hit ranges.
    cache: [(u64, u64, u64, bool); CACHED],
    next: usize,
}

impl MemView {
    pub fn new(space: Arc<AddressSpace>) -> MemView {
        let (generation, ranges) = space.ranges.snapshot();
        MemView {
            space,
            generation,
            ranges,
            cache: [(1, 0, 0, false); CACHED],
            next: 0,
        }
    }

    /// Take a new snapshot if the driver changed the mappings.
    pub fn refresh(&mut self) {
        if self.space.ranges.generation() != self.generation {
            let (g, r) = self.space.ranges.snapshot();
            self.generation = g;
            self.ranges = r;
            self.cache = [(1, 0, 0, false); CACHED];
        }
    }

    /// Check an access of `size` bytes at `addr` (alignment `align`, a power of two) from
    /// `device`: `Ok(true)` when it touches host memory across PCIe, `Err` describes the
    /// fault.
    #[inline]
    pub fn check(
        &mut self,
        addr: u64,
        size: u64,
        align: u64,
        device: u32,
        what: &str,
    ) -> Result<bool, String> {
        let dev = 1u64.checked_shl(device).unwrap_or(0);
        let end = addr.wrapping_add(size);
        if addr & (align - 1) == 0 && end > addr {
            for &(lo, hi, devices, host) in &self.cache {
                if addr >= lo && end <= hi && devices & dev != 0 {
                    return Ok(host);
                }
            }
        }
        self.check_slow(addr, size, align, dev, device, what)
    }

    #[cold]
    fn check_slow(
        &mut self,
        addr: u64,
        size: u64,
        align: u64,
        dev: u64,
        device: u32,
        what: &str,
    ) -> Result<bool, String> {
        if addr & (align - 1) != 0 {
            return Err(format!(
                "misaligned address: {what} of {size} bytes at {addr:#x} (needs {align}-byte alignment)"
            ));
        }
        let i = self.ranges.partition_point(|r| r.base <= addr);
        let end = addr.checked_add(size);
        if i > 0 {
            let r = &self.ranges[i - 1];
            if end.is_some_and(|e| e <= r.end) {
                if r.devices & dev == 0 {
                    return Err(format!(
                        "illegal address: {what} of {size} bytes at {addr:#x} in '{}' [{:#x}, {:#x}) from device {device}, which may not access it",
                        r.what, r.base, r.end
                    ));
                }
                self.cache[self.next] = (r.base, r.end, r.devices, r.host);
                self.next = (self.next + 1) % CACHED;
                return Ok(r.host);
            }
        }
        let near = if i > 0 {
            let r = &self.ranges[i - 1];
            format!(
                " (nearest mapping below: '{}' [{:#x}, {:#x}))",
                r.what, r.base, r.end
            )
        } else {
            String::new()
        };
        Err(format!(
            "illegal address: out-of-bounds {what} of {size} bytes at {addr:#x}{near}"
        ))
    }
}

// The host accesses. All go through atomics so that other OS threads and processes sharing
// the memory see every value whole.

/// Load `bytes` (1, 2, 4 or 8) at `addr`.
///
/// # Safety
/// `addr` must be checked by [`MemView::check`] (mapped, aligned): the driver guarantees that
/// mapped ranges are valid host memory while mapped.
#[inline]
pub(crate) unsafe fn host_load(addr: u64, bytes: u32, order: Ordering) -> u64 {
    // SAFETY: the caller guarantees `addr` is valid, aligned memory of `bytes` bytes; all
    // concurrent accesses to it are atomic or from other processes.
    unsafe {
        match bytes {
            1 => AtomicU8::from_ptr(addr as *mut u8).load(order) as u64,
            2 => AtomicU16::from_ptr(addr as *mut u16).load(order) as u64,
            4 => AtomicU32::from_ptr(addr as *mut u32).load(order) as u64,
            _ => AtomicU64::from_ptr(addr as *mut u64).load(order),
        }
    }
}

/// Store the low `bytes` of `v` at `addr`.
///
/// # Safety
/// As [`host_load`].
#[inline]
pub(crate) unsafe fn host_store(addr: u64, bytes: u32, v: u64, order: Ordering) {
    // SAFETY: as in `host_load`.
    unsafe {
        match bytes {
            1 => AtomicU8::from_ptr(addr as *mut u8).store(v as u8, order),
            2 => AtomicU16::from_ptr(addr as *mut u16).store(v as u16, order),
            4 => AtomicU32::from_ptr(addr as *mut u32).store(v as u32, order),
            _ => AtomicU64::from_ptr(addr as *mut u64).store(v, order),
        }
    }
}

/// Atomic read-modify-write with `f(old) -> Some(new)` (or `None`: no write), 4 or 8 bytes;
/// returns the old value.
///
/// # Safety
/// As [`host_load`].
#[inline]
pub(crate) unsafe fn host_rmw(addr: u64, bytes: u32, mut f: impl FnMut(u64) -> Option<u64>) -> u64 {
    let ord = Ordering::SeqCst;
    // SAFETY: as in `host_load`.
    unsafe {
        if bytes == 4 {
            let a = AtomicU32::from_ptr(addr as *mut u32);
            match a.fetch_update(ord, ord, |old| f(old as u64).map(|n| n as u32)) {
                Ok(v) | Err(v) => v as u64,
            }
        } else {
            let a = AtomicU64::from_ptr(addr as *mut u64);
            match a.fetch_update(ord, ord, f) {
                Ok(v) | Err(v) => v,
            }
        }
    }
}
