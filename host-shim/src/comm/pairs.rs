//! A rank's point-to-point window and its table of windows (`docs/POINT_TO_POINT.md`): the
//! window whose buffers hold the pair regions (`symm_device::sync::p2p`), registered with the
//! rank's first window (registration is collective, so every rank makes it at the same
//! registration), and the device table through which a peer's send names one of the rank's
//! windows. A window enters the table when its registration completes and leaves it before it
//! is freed, after every point-to-point launch of the rank has ended.

use crate::comm::Comm;
use crate::error::Result;
use crate::log::{Level, Subsys};
use crate::window::Window;
use std::sync::Arc;
use symm_device::sync::p2p::{RegionLayout, WINDOW_TABLE_ENTRIES, WindowTable};

/// A rank's point-to-point window and its table of windows.
pub struct PointToPoint {
    /// The window whose buffers hold the pair regions.
    pub window: Arc<Window>,
    /// The `symmMemAlloc` allocation behind it (never the user's).
    pub allocation: u64,
    /// The registration number of the window in each entry of the device table.
    entries: Vec<Option<u64>>,
}

impl PointToPoint {
    /// The point-to-point window `window` over the allocation at `allocation`, its table empty.
    pub fn new(window: Arc<Window>, allocation: u64) -> PointToPoint {
        PointToPoint {
            window,
            allocation,
            entries: vec![None; WINDOW_TABLE_ENTRIES as usize],
        }
    }

    /// `true` when the table holds the window of registration number `seq`.
    pub fn holds(&self, seq: u64) -> bool {
        self.entries.contains(&Some(seq))
    }
}

/// The allocation of `comm`'s point-to-point window, if it has one (it stays with `comm` when
/// a shrink moves the rank's allocations).
pub fn allocation(comm: &Comm) -> Option<u64> {
    comm.lock().point_to_point.as_ref().map(|p| p.allocation)
}

/// Enter `window`, whose registration just completed, in `comm`'s window table, so that peers'
/// sends may name it. A full table leaves it out (a send from it is then refused).
pub fn enter_window(comm: &Comm, window: &Window) -> Result<()> {
    let Some(context) = window.context().map(|c| c.address) else {
        return Ok(());
    };
    let mut state = comm.lock();
    let Some(p2p) = state.point_to_point.as_mut() else {
        return Ok(());
    };
    let Some(table) = table_address(p2p) else {
        return Ok(());
    };
    let Some(index) = p2p.entries.iter().position(Option::is_none) else {
        crate::log!(
            Level::Warn,
            Subsys::Reg,
            Some(comm.rank),
            "window #{}: the point-to-point table is full ({WINDOW_TABLE_ENTRIES} windows); \
             sends from this window are refused",
            window.seq
        );
        return Ok(());
    };
    // The context first, then the tag that makes the entry used (each upload completes before
    // the next starts): a kernel scanning meanwhile never sees a tag with a torn context.
    let address = table + WindowTable::entry(index as u32);
    let backend = &comm.clique.backend;
    backend.upload(comm.device, address + 8, &context.to_ne_bytes())?;
    backend.upload(comm.device, address, &(window.seq + 1).to_ne_bytes())?;
    p2p.entries[index] = Some(window.seq);
    Ok(())
}

/// Take `window` out of `comm`'s window table, before its context is freed (every launch that
/// may read the table has ended: see [`wait_for_launches`]).
pub fn leave_window(comm: &Comm, window: &Window) -> Result<()> {
    let mut state = comm.lock();
    let Some(p2p) = state.point_to_point.as_mut() else {
        return Ok(());
    };
    let Some(table) = table_address(p2p) else {
        return Ok(());
    };
    let Some(index) = p2p.entries.iter().position(|e| *e == Some(window.seq)) else {
        return Ok(());
    };
    let address = table + WindowTable::entry(index as u32);
    // The tag first: the entry is unused before its context goes.
    let backend = &comm.clique.backend;
    backend.upload(comm.device, address, &[0u8; 8])?;
    backend.upload(comm.device, address + 8, &[0u8; 8])?;
    p2p.entries[index] = None;
    Ok(())
}

/// Wait until every point-to-point launch of `comm` has ended (they read the rank's window
/// table and its windows' contexts).
pub fn wait_for_launches(comm: &Comm) -> Result<()> {
    let window = comm
        .lock()
        .point_to_point
        .as_ref()
        .map(|p| p.window.clone());
    match window {
        Some(window) => window.wait_for_launches(),
        None => Ok(()),
    }
}

fn table_address(p2p: &PointToPoint) -> Option<u64> {
    let context = p2p.window.context()?;
    Some(context.host.local_base + RegionLayout::new(context.host.world_size).window_table())
}
