//! The typestate of a steal request. Every transition consumes its handle; the states are
//! sealed zero-sized types; misuse does not compile:
//!
//! | rule | how it is enforced |
//! |---|---|
//! | one elected thread submits | `submit` needs an [`Election`], constructible only by [`Election::thread_zero`]; the wrapper issues on the elected thread alone |
//! | the response is read only after the barrier wait | `query` exists only on [`Arrived`], which only `wait` produces |
//! | no request after an observed failure | a failure is [`Exhausted`], which has no method and does not give the handle back |
//! | several requests in flight before any is observed | `submit_another` on [`Submitted`] gives [`Submitted2`] |
//! | a failed response has no block id | [`Outcome::Exhausted`] carries none |
//! | fences | issued inside the transitions, never by the user |
//! | a stolen tile must run | [`Stolen`] is consumed only by [`Stolen::run`]; dropping it (or a request in flight) is a compile error |
//!
//! A policy may stop only in [`Ready`]: dropping a `Steal<_, Ready>` is allowed and ends
//! stealing for the block.

use super::TileId;
use super::source::{SLOTS, Source};
use crate::arch;
use core::marker::PhantomData;
use core::mem::ManuallyDrop;

mod sealed {
    pub trait Sealed {}
}

/// A state of a [`Steal`] handle.
pub trait State: sealed::Sealed {
    /// Whether a handle in this state may be dropped (only when no request is in flight).
    const DROPPABLE: bool;
}

/// No request in flight: may submit, or be dropped (the block stops stealing).
pub struct Ready;
/// One request in flight: must be waited for.
pub struct Submitted;
/// The barrier of the request completed: its response may be queried.
pub struct Arrived;
/// Two requests in flight: the older must be waited for.
pub struct Submitted2;
/// The older of two requests completed: it may be queried.
pub struct Arrived2;

macro_rules! states {
    ($($s:ident => $droppable:expr),*) => {$(
        impl sealed::Sealed for $s {}
        impl State for $s {
            const DROPPABLE: bool = $droppable;
        }
    )*};
}
states!(Ready => true, Submitted => false, Arrived => false, Submitted2 => false, Arrived2 => false);

/// Proof that exactly one thread of the block was elected to submit requests. Every thread
/// holds one (the handles are block-uniform); only the elected thread's says so, and the
/// wrapper issues the request from that thread alone.
pub struct Election {
    leader: bool,
}

impl Election {
    /// Elect thread 0 of the block.
    pub fn thread_zero() -> Election {
        Election {
            leader: arch::thread_idx_x() == 0,
        }
    }

    /// `true` on the elected thread.
    pub fn is_leader(&self) -> bool {
        self.leader
    }
}

/// A block's steal handle in state `St`. Block-uniform: every thread of the block holds one
/// and makes the same transitions.
#[must_use = "a steal handle in flight must be waited for and queried"]
pub struct Steal<S: Source, St: State> {
    source: S,
    /// The slot of the oldest request in flight (or the next to use, in `Ready`).
    slot: u32,
    _state: PhantomData<St>,
}

/// Dropping a handle in [`Ready`] ends stealing for the block (the source is finished);
/// dropping one with a request in flight does not compile.
impl<S: Source, St: State> Drop for Steal<S, St> {
    fn drop(&mut self) {
        const {
            assert!(
                St::DROPPABLE,
                "a steal request in flight must be waited for and queried before it is dropped"
            )
        }
        self.source.finish();
    }
}

impl<S: Source, St: State> Steal<S, St> {
    /// Consume the handle without dropping it and hand out its source. Transitions call the
    /// source only after this, and build the next handle with a struct literal, so no handle
    /// or stolen tile is ever alive across a call that could unwind (on the host) and need
    /// dropping.
    fn take(self) -> (S, u32) {
        let this = ManuallyDrop::new(self);
        // SAFETY: `this` is never used or dropped again; the source is moved out once.
        (unsafe { core::ptr::read(&this.source) }, this.slot)
    }
}

impl<S: Source> Steal<S, Ready> {
    /// The block's handle on `source` (which it owns from now on), before its first
    /// request.
    pub fn new(source: S) -> Self {
        Steal {
            source,
            slot: 0,
            _state: PhantomData,
        }
    }

    /// Block-wide: the tile this block runs first (its own), or `None` when another block
    /// already took it.
    pub fn first_tile(&mut self) -> Option<TileId> {
        self.source.first_tile()
    }

    /// Submit a request (every thread calls it; the elected thread issues it).
    pub fn submit(self, election: &Election) -> Steal<S, Submitted> {
        let (mut source, slot) = self.take();
        source.before_request();
        // SAFETY: in `Ready` the slot is free and no failure was observed (a failure consumes
        // the handle); every thread makes this call.
        unsafe { source.issue(slot, election.leader) };
        Steal {
            source,
            slot,
            _state: PhantomData,
        }
    }
}

impl<S: Source> Steal<S, Submitted> {
    /// Submit a second request before observing the first (pipelining).
    pub fn submit_another(self, election: &Election) -> Steal<S, Submitted2> {
        let (mut source, slot) = self.take();
        source.before_request();
        // SAFETY: the other slot is free (one request is in flight); no failure observed.
        unsafe { source.issue((slot + 1) % SLOTS, election.leader) };
        Steal {
            source,
            slot,
            _state: PhantomData,
        }
    }

    /// Wait for the response (block-wide).
    pub fn wait(self) -> Steal<S, Arrived> {
        let (mut source, slot) = self.take();
        // SAFETY: a request was issued into `slot` and not yet waited for.
        unsafe { source.wait(slot) };
        Steal {
            source,
            slot,
            _state: PhantomData,
        }
    }

    /// Run `f` while the request is in flight (to hide its latency).
    pub fn overlap<R>(self, f: impl FnOnce() -> R) -> (Self, R) {
        let (source, slot) = self.take();
        let result = f();
        (
            Steal {
                source,
                slot,
                _state: PhantomData,
            },
            result,
        )
    }
}

impl<S: Source> Steal<S, Arrived> {
    /// Read the response: a stolen tile (and the handle back, ready for the next request), or
    /// the end of the work.
    pub fn query(self) -> Outcome<S, Ready> {
        let (mut source, slot) = self.take();
        let next_slot = (slot + 1) % SLOTS;
        // SAFETY: the slot was waited for and not decoded yet.
        match unsafe { source.decode(slot) } {
            Some(tile) => Outcome::Stolen(
                Stolen {
                    tile,
                    _source: PhantomData,
                },
                Steal {
                    source,
                    slot: next_slot,
                    _state: PhantomData,
                },
            ),
            None => {
                source.finish();
                Outcome::Exhausted(Exhausted { _private: () })
            }
        }
    }
}

impl<S: Source> Steal<S, Submitted2> {
    /// Wait for the older response.
    pub fn wait(self) -> Steal<S, Arrived2> {
        let (mut source, slot) = self.take();
        // SAFETY: a request was issued into `slot` and not yet waited for.
        unsafe { source.wait(slot) };
        Steal {
            source,
            slot,
            _state: PhantomData,
        }
    }
}

impl<S: Source> Steal<S, Arrived2> {
    /// Read the older response. On success the younger request is still in flight; on
    /// failure the younger one is waited for and discarded (requests are served in order, so
    /// a request submitted after one that failed fails too) and the handle ends.
    pub fn query(self) -> Outcome<S, Submitted> {
        let (mut source, slot) = self.take();
        let younger = (slot + 1) % SLOTS;
        // SAFETY: the older slot was waited for and not decoded yet.
        match unsafe { source.decode(slot) } {
            Some(tile) => Outcome::Stolen(
                Stolen {
                    tile,
                    _source: PhantomData,
                },
                Steal {
                    source,
                    slot: younger,
                    _state: PhantomData,
                },
            ),
            None => {
                // SAFETY: the younger request is in flight; it completes before the block may
                // exit, and its (failed) response is decoded to release the slot.
                unsafe {
                    source.wait(younger);
                    let _ = source.decode(younger);
                }
                source.finish();
                Outcome::Exhausted(Exhausted { _private: () })
            }
        }
    }
}

/// The response of a request.
pub enum Outcome<S: Source, Next: State> {
    /// A tile was stolen: run it; the handle continues in state `Next`.
    Stolen(Stolen<S>, Steal<S, Next>),
    /// No work is left. No further request is possible.
    Exhausted(Exhausted),
}

/// The end of stealing for this block: nothing can be submitted any more.
pub struct Exhausted {
    _private: (),
}

/// A stolen tile: an obligation. It is consumed only by [`Stolen::run`]; dropping it does not
/// compile.
#[must_use = "a stolen tile must be run: call Stolen::run"]
pub struct Stolen<S> {
    tile: TileId,
    _source: PhantomData<fn() -> S>,
}

impl<S> Stolen<S> {
    /// The stolen tile's id, for policies and statistics.
    pub fn tile(&self) -> TileId {
        self.tile
    }

    /// Run the tile: the only way to discharge the obligation.
    pub fn run<R>(self, work: impl FnOnce(TileId) -> R) -> R {
        let tile = ManuallyDrop::new(self).tile;
        work(tile)
    }
}

impl<S> Drop for Stolen<S> {
    fn drop(&mut self) {
        const { panic!("a stolen tile must be run: call Stolen::run") }
    }
}
