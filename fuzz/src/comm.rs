//! Communicators: creation (`symmCommInitAll`, or `symmGetUniqueId` and `symmCommInitRank`
//! with one thread per rank), the misuses of `symmCommInitRank`, `symmCommDestroy`, and the
//! queries on a comm (count, rank, device, backend, async error, device context, last error).

use crate::config::{FAST_TIMEOUT_MS, MAX_LIVE_RANKS, call_bound, timeout_ms, use_timeout};
use crate::driver::{INVALID_ARGUMENT, INVALID_USAGE, OK, c_text, last_error};
use crate::harness::Harness;
use crate::input::{BufSel, CommSel};
use crate::model::{Clique, Rank};
use std::ffi::{c_char, c_int, c_void};
use std::ptr::null_mut;
use std::time::Instant;
use symm::*;

impl Harness {
    /// `symmCommInitAll` of `n` ranks (`patient`: with the long timeout).
    pub(crate) fn init_all(&mut self, n: usize, patient: bool) {
        if self.live_ranks().len() + n > MAX_LIVE_RANKS {
            return;
        }
        use_timeout(if patient {
            timeout_ms()
        } else {
            FAST_TIMEOUT_MS
        });
        let mut comms = vec![null_mut(); n];
        let devices = vec![0 as c_int; n];
        // SAFETY: both arrays hold n elements.
        self.expect("symmCommInitAll", &[OK], null_mut(), || unsafe {
            symmCommInitAll(comms.as_mut_ptr(), n as c_int, devices.as_ptr())
        });
        self.add_clique(comms, false, patient);
    }

    /// Check that each of the new `comms` reports its rank and count, and model them.
    fn add_clique(&mut self, comms: Vec<symmComm_t>, linked: bool, patient: bool) {
        for (r, comm) in comms.iter().enumerate() {
            let mut count: c_int = 0;
            let mut rank: c_int = -1;
            // SAFETY: valid out-pointers.
            self.expect("symmCommCount", &[OK], *comm, || unsafe {
                symmCommCount(*comm, &mut count)
            });
            // SAFETY: valid out-pointers.
            self.expect("symmCommUserRank", &[OK], *comm, || unsafe {
                symmCommUserRank(*comm, &mut rank)
            });
            if count as usize != comms.len() || rank as usize != r {
                self.fail(format!(
                    "rank {r} of {} reports rank {rank} of {count}",
                    comms.len()
                ));
            }
        }
        self.cliques.push(Clique {
            ranks: comms
                .into_iter()
                .map(|handle| {
                    Some(Rank {
                        handle,
                        allocations: Vec::new(),
                        windows: Vec::new(),
                        next_seq: 0,
                        queued: 0,
                    })
                })
                .collect(),
            linked,
            tainted: false,
            patient,
        });
    }

    /// `symmGetUniqueId`, then `symmCommInitRank` of `n` ranks, one thread each.
    pub(crate) fn init_unique_id(&mut self, n: usize) {
        if self.live_ranks().len() + n > MAX_LIVE_RANKS || self.group_depth > 0 {
            return;
        }
        // Patient: the ranks' first exchange through the bootstrap is bounded by the timeout.
        use_timeout(timeout_ms());
        let mut id = symmUniqueId {
            internal: [0; SYMM_UNIQUE_ID_BYTES],
        };
        // SAFETY: valid out-pointer.
        self.expect("symmGetUniqueId", &[OK], null_mut(), || unsafe {
            symmGetUniqueId(&mut id)
        });
        let started = Instant::now();
        let results: Vec<(symmResult_t, usize, String)> = std::thread::scope(|scope| {
            let threads: Vec<_> = (0..n)
                .map(|rank| {
                    scope.spawn(move || {
                        let mut comm: symmComm_t = null_mut();
                        // SAFETY: valid out-pointer.
                        let result =
                            unsafe { symmCommInitRank(&mut comm, n as c_int, id, rank as c_int) };
                        (result, comm as usize, last_error(null_mut()))
                    })
                })
                .collect();
            threads
                .into_iter()
                .map(|t| t.join().expect("an init thread panicked"))
                .collect()
        });
        if started.elapsed() > call_bound() {
            self.fail(format!("symmCommInitRank took {:?}", started.elapsed()));
        }
        for (rank, (result, _, message)) in results.iter().enumerate() {
            if *result != OK {
                self.fail(format!(
                    "symmCommInitRank of rank {rank}: {result:?}: {message}"
                ));
            }
        }
        let comms = results
            .into_iter()
            .map(|(_, comm, _)| comm as symmComm_t)
            .collect();
        self.add_clique(comms, true, true);
    }

    /// `symmCommInitRank` misuse `what` (see [`crate::input::Op::InitRankMisuse`]).
    pub(crate) fn init_rank_misuse(&mut self, what: u8) {
        let zero = symmUniqueId {
            internal: [0; SYMM_UNIQUE_ID_BYTES],
        };
        let mut comm: symmComm_t = null_mut();
        let (nranks, rank, in_group, expected) = match what % 4 {
            0 => (2, 0, true, INVALID_USAGE),
            1 => (2, 2, false, INVALID_ARGUMENT),
            2 => (1, 0, false, INVALID_ARGUMENT),
            _ => (
                if what & 4 != 0 { 0 } else { 100_000 },
                0,
                false,
                INVALID_ARGUMENT,
            ),
        };
        let open_here = in_group && self.group_depth == 0;
        if open_here {
            self.expect("symmGroupStart", &[OK], null_mut(), || symmGroupStart());
        }
        // A group open for other reasons refuses the call before its arguments are read.
        let expected = if in_group || self.group_depth > 0 {
            INVALID_USAGE
        } else {
            expected
        };
        // SAFETY: valid out-pointer.
        self.expect("symmCommInitRank", &[expected], null_mut(), || unsafe {
            symmCommInitRank(&mut comm, nranks, zero, rank)
        });
        if open_here {
            self.expect("symmGroupEnd", &[OK], null_mut(), || symmGroupEnd());
        }
    }

    /// `symmCommDestroy` of `handle`.
    pub(crate) fn destroy(&mut self, handle: symmComm_t) {
        let at = self.locate(handle);
        let expected = match at {
            None => vec![INVALID_ARGUMENT],
            Some(at) if self.rank(at).queued > 0 => vec![INVALID_USAGE],
            Some(_) => vec![OK],
        };
        let result = self.expect("symmCommDestroy", &expected, handle, || {
            symmCommDestroy(handle)
        });
        if result == OK {
            let at = at.expect("a live rank");
            let rank = self.cliques[at.0].ranks[at.1].take().expect("a live rank");
            for a in &rank.allocations {
                self.mark_pointer_stale(a.base);
            }
            self.mark_comm_stale(handle);
        }
    }

    /// Query `what` (see [`crate::input::Op::Query`]) on the comm `sel` names.
    pub(crate) fn query(&mut self, sel: CommSel, what: u8, win: BufSel) {
        let handle = self.pick_comm(sel);
        let at = self.locate(handle);
        let null_out = what & 8 != 0;
        let expected = if at.is_none() || null_out {
            vec![INVALID_ARGUMENT]
        } else {
            vec![OK]
        };
        match what % 7 {
            0..=2 => self.query_int(handle, at, what % 7, null_out, &expected),
            3 => self.query_backend(handle, null_out, &expected),
            4 => self.query_async_error(handle, at, null_out, &expected),
            5 => self.query_device_context(handle, at, win, null_out),
            _ => {
                let text = last_error(handle);
                let _ = text;
            }
        }
    }

    /// `symmCommCount` (`which` 0), `symmCommUserRank` (1) or `symmCommCuDevice` (2).
    fn query_int(
        &self,
        handle: symmComm_t,
        at: Option<(usize, usize)>,
        which: u8,
        null_out: bool,
        expected: &[symmResult_t],
    ) {
        let mut value: c_int = -1;
        let out = if null_out {
            null_mut()
        } else {
            &mut value as *mut c_int
        };
        let (name, f): (
            &str,
            unsafe extern "C" fn(symmComm_t, *mut c_int) -> symmResult_t,
        ) = match which {
            0 => ("symmCommCount", symmCommCount),
            1 => ("symmCommUserRank", symmCommUserRank),
            _ => ("symmCommCuDevice", symmCommCuDevice),
        };
        // SAFETY: `out` is NULL or a valid out-pointer.
        let result = self.expect(name, expected, handle, || unsafe { f(handle, out) });
        if result == OK {
            let at = at.expect("a live rank");
            let want = match which {
                0 => self.cliques[at.0].nranks() as c_int,
                1 => at.1 as c_int,
                _ => 0,
            };
            if value != want {
                self.fail(format!("{name} gave {value}, expected {want}"));
            }
        }
    }

    /// `symmCommGetBackend`: the host backend.
    fn query_backend(&self, handle: symmComm_t, null_out: bool, expected: &[symmResult_t]) {
        let mut name: *const c_char = std::ptr::null();
        let out = if null_out {
            null_mut()
        } else {
            &mut name as *mut *const c_char
        };
        // SAFETY: `out` is NULL or a valid out-pointer.
        let result = self.expect("symmCommGetBackend", expected, handle, || unsafe {
            symmCommGetBackend(handle, out)
        });
        if result == OK && c_text(name) != "host" {
            self.fail(format!("backend {:?}", c_text(name)));
        }
    }

    /// `symmCommGetAsyncError`: success, unless the communicator is tainted.
    fn query_async_error(
        &self,
        handle: symmComm_t,
        at: Option<(usize, usize)>,
        null_out: bool,
        expected: &[symmResult_t],
    ) {
        let mut state = symmResult_t::symmInternalError;
        let out = if null_out {
            null_mut()
        } else {
            &mut state as *mut symmResult_t
        };
        // SAFETY: `out` is NULL or a valid out-pointer.
        let result = self.expect("symmCommGetAsyncError", expected, handle, || unsafe {
            symmCommGetAsyncError(handle, out)
        });
        if result == OK {
            let at = at.expect("a live rank");
            let tainted = self.cliques[at.0].tainted;
            if state == symmResult_t::symmInternalError || (!tainted && state != OK) {
                self.fail(format!("symmCommGetAsyncError reported {state:?}"));
            }
        }
    }

    /// `symmCommGetDeviceContext` of the window `win` names: only a completed window has one.
    fn query_device_context(
        &self,
        handle: symmComm_t,
        at: Option<(usize, usize)>,
        win: BufSel,
        null_out: bool,
    ) {
        let window = self.pick_window(at, win);
        let expected = match at {
            None => vec![INVALID_ARGUMENT],
            Some(_) if null_out => vec![INVALID_ARGUMENT],
            Some(at) => match self
                .rank(at)
                .windows
                .iter()
                .find(|w| w.handle == window as usize)
            {
                None => vec![INVALID_ARGUMENT],
                Some(_) if self.cliques[at.0].tainted => vec![OK, INVALID_USAGE],
                Some(w) if w.complete => vec![OK],
                Some(_) => vec![INVALID_USAGE],
            },
        };
        let mut context: *const c_void = std::ptr::null();
        let out = if null_out {
            null_mut()
        } else {
            &mut context as *mut *const c_void
        };
        // SAFETY: `out` is NULL or a valid out-pointer.
        let result = self.expect("symmCommGetDeviceContext", &expected, handle, || unsafe {
            symmCommGetDeviceContext(handle, window, out)
        });
        if result == OK {
            self.check_context(at.expect("a live rank"), window, context);
        }
    }

    /// A completed window's device context (host memory here) describes the window.
    fn check_context(&self, at: (usize, usize), window: symmWindow_t, context: *const c_void) {
        let w = *self
            .rank(at)
            .windows
            .iter()
            .find(|w| w.handle == window as usize)
            .expect("a window of this rank");
        if context.is_null() {
            self.fail("symmCommGetDeviceContext gave NULL".into());
        }
        // SAFETY: on the host backend the device context is host memory holding a
        // symmDeviceContext, alive while the window is registered.
        let ctx = unsafe { (context as *const symmDeviceContext).read_unaligned() };
        let nranks = self.cliques[at.0].nranks() as u32;
        if ctx.rank != at.1 as u32
            || ctx.world_size != nranks
            || ctx.local_base != w.base
            || ctx.window_size != w.size
        {
            self.fail(format!(
                "device context {ctx:?} does not describe window {w:?}"
            ));
        }
    }
}
