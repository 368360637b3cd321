//! A host-memory model of `world` ranks for testing kernels directly: per-rank windows, signal
//! pads, abort words and contexts, and a launcher that runs every rank's blocks in one emulated
//! grid (as the host backend's group launch does).

#![allow(dead_code)]

use std::vec::Vec;
use symm_device::arch::host::run_grid;
use symm_device::context::{BackendTag, CONTEXT_VERSION, SymmContext};
use symm_device::symmetric::dispatch::KernelFn;
use symm_device::symmetric::{CollectiveArgs, KernelStatus, TaskArgs, for_virtual_rank};
use symm_device::sync::signal_pad::{
    EPOCHS_OFFSET, MAX_BLOCKS, MAX_RANKS, PAT_MAX_STEPS, PatCollective, PatFlag, ll_count_slot,
    ll_parity_lines, pat_flag_slot, pat_round_slot, signal_pad_bytes,
};

/// 16-byte aligned storage.
#[derive(Clone, Copy)]
#[repr(C, align(16))]
struct Chunk([u8; 16]);

fn aligned(bytes: usize) -> Vec<Chunk> {
    vec![Chunk([0; 16]); bytes.div_ceil(16)]
}

/// `world` ranks, each with a window of `window_bytes`.
pub struct Ranks {
    windows: Vec<Vec<Chunk>>,
    pads: Vec<Vec<Chunk>>,
    aborts: Vec<u32>,
    bases: Vec<u64>,
    pad_addresses: Vec<u64>,
    contexts: Vec<SymmContext>,
    /// Bytes per window.
    pub window_bytes: usize,
}

impl Ranks {
    /// `world` ranks with zeroed windows and pads; waits bounded by `timeout_ns`.
    pub fn new(world: usize, window_bytes: usize, timeout_ns: u64) -> Box<Ranks> {
        Ranks::with_base_shifts(world, window_bytes, timeout_ns, &[])
    }

    /// As [`Ranks::new`], with rank `r`'s window starting `shifts[r]` bytes (less than 16;
    /// missing entries are 0) past a 16-byte boundary, as a window registered at an offset
    /// inside an allocation does.
    pub fn with_base_shifts(
        world: usize,
        window_bytes: usize,
        timeout_ns: u64,
        shifts: &[usize],
    ) -> Box<Ranks> {
        assert!((1..=MAX_RANKS).contains(&world));
        assert!(shifts.iter().all(|s| *s < 16));
        let mut windows: Vec<Vec<Chunk>> = (0..world).map(|_| aligned(window_bytes + 16)).collect();
        let mut pads: Vec<Vec<Chunk>> = (0..world)
            .map(|_| aligned(signal_pad_bytes(world)))
            .collect();
        let mut aborts: Vec<u32> = vec![0; world];
        let bases: Vec<u64> = windows
            .iter_mut()
            .enumerate()
            .map(|(rank, w)| w.as_mut_ptr() as u64 + shifts.get(rank).copied().unwrap_or(0) as u64)
            .collect();
        let pad_addresses: Vec<u64> = pads.iter_mut().map(|p| p.as_mut_ptr() as u64).collect();
        let mut ranks = Box::new(Ranks {
            windows,
            pads,
            aborts: Vec::new(),
            bases,
            pad_addresses,
            contexts: Vec::new(),
            window_bytes,
        });
        let peer_bases = ranks.bases.as_ptr() as u64;
        let peer_pads = ranks.pad_addresses.as_ptr() as u64;
        for (rank, abort) in aborts.iter_mut().enumerate() {
            let abort = abort as *mut u32 as u64;
            ranks.contexts.push(SymmContext {
                backend: BackendTag::Native as u32,
                version: CONTEXT_VERSION,
                rank: rank as u32,
                world_size: world as u32,
                local_base: ranks.bases[rank],
                window_size: window_bytes as u64,
                peer_bases,
                peer_signal_pads: peer_pads,
                signal_pad_size: signal_pad_bytes(world) as u64,
                abort_flag: abort,
                timeout_ns,
                engine: [0; 3],
            });
        }
        ranks.aborts = aborts;
        ranks
    }

    /// Number of ranks.
    pub fn world(&self) -> usize {
        self.windows.len()
    }

    /// Rank `rank`'s window bytes.
    pub fn window(&mut self, rank: usize) -> &mut [u8] {
        let bytes = self.window_bytes;
        // SAFETY: the window starts at most 15 bytes into its chunks of plain bytes, which are
        // 16 bytes longer than the window.
        unsafe { std::slice::from_raw_parts_mut(self.bases[rank] as *mut u8, bytes) }
    }

    /// Write `values` at byte `offset` of rank `rank`'s window.
    pub fn write<T: Copy>(&mut self, rank: usize, offset: usize, values: &[T]) {
        let size = std::mem::size_of_val(values);
        assert!(offset + size <= self.window_bytes);
        let dst = self.window(rank)[offset..].as_mut_ptr() as *mut T;
        // SAFETY: in bounds (checked); offsets used by the tests are aligned for T.
        unsafe { std::ptr::copy_nonoverlapping(values.as_ptr(), dst, values.len()) };
    }

    /// Read `count` values at byte `offset` of rank `rank`'s window.
    pub fn read<T: Copy>(&mut self, rank: usize, offset: usize, count: usize) -> Vec<T> {
        assert!(offset + count * std::mem::size_of::<T>() <= self.window_bytes);
        let src = self.window(rank)[offset..].as_ptr() as *const T;
        // SAFETY: in bounds (checked); aligned offsets.
        (0..count).map(|i| unsafe { src.add(i).read() }).collect()
    }

    /// Set every barrier epoch and inbox slot of every rank to `epoch` (as after `epoch`
    /// barriers), e.g. to cross the u32 wrap, and every LL call counter to `ll_calls`.
    pub fn set_epochs(&mut self, epoch: u32, ll_calls: u64) {
        for pad in &mut self.pads {
            let words: &mut [u32] = bytemuck_words(pad);
            for w in &mut words[..(EPOCHS_OFFSET + MAX_BLOCKS * 4) / 4] {
                *w = epoch;
            }
            let base = pad.as_mut_ptr() as u64;
            for block in 0..MAX_BLOCKS as u32 {
                // SAFETY: the counter lies inside the pad.
                unsafe { ll_count_slot(base, block).write(ll_calls) };
            }
        }
    }

    /// Set every PAT round counter and PAT flag of every rank to `rounds` (as after `rounds`
    /// rounds of each PAT collective on every block index), e.g. to cross the u32 wrap.
    pub fn set_pat_rounds(&mut self, rounds: u32) {
        self.set_pat_rounds_of(PatCollective::Gather, rounds);
        self.set_pat_rounds_of(PatCollective::Scatter, rounds);
    }

    /// Set the round counters and flags of `collective` only, on every rank and block index, to
    /// `rounds` (as after `rounds` rounds of that collective).
    pub fn set_pat_rounds_of(&mut self, collective: PatCollective, rounds: u32) {
        let kinds = match collective {
            PatCollective::Gather => [PatFlag::GatherData, PatFlag::GatherReady],
            PatCollective::Scatter => [PatFlag::ScatterData, PatFlag::ScatterReady],
        };
        for pad in &mut self.pads {
            let base = pad.as_mut_ptr() as u64;
            for block in 0..MAX_BLOCKS as u32 {
                // SAFETY: the slots lie inside the pad; no kernel runs meanwhile.
                unsafe {
                    pat_round_slot(base, collective, block).write(rounds);
                    for kind in kinds {
                        for step in 0..PAT_MAX_STEPS as u32 {
                            pat_flag_slot(base, kind, block, step).write(rounds);
                        }
                    }
                }
            }
        }
    }

    /// The round counter of `collective` for block index `block` in rank `rank`'s pad.
    pub fn pat_rounds(&self, rank: usize, collective: PatCollective, block: u32) -> u32 {
        // SAFETY: the counter lies inside the pad; no kernel runs during this read.
        unsafe {
            pat_round_slot(self.pads[rank].as_ptr() as u64, collective, block).read_volatile()
        }
    }

    /// Fill every LL line of every rank (both parities, every source) with `data` and `flag`:
    /// stale lines, as an old call would have left them.
    pub fn plant_ll_lines(&mut self, flag: u32, data: u64) {
        let world = self.world() as u32;
        for pad in &mut self.pads {
            let base = pad.as_mut_ptr() as u64;
            for parity in 0..2 {
                let (lines, total) = ll_parity_lines(base, world, parity);
                for line in 0..total as usize {
                    // SAFETY: the line lies inside the pad; no kernel runs meanwhile.
                    unsafe {
                        lines
                            .add(line)
                            .write([data as u32, flag, (data >> 32) as u32, flag])
                    };
                }
            }
        }
    }

    /// The LL call number held by block index `block`'s copy in rank `rank`'s pad.
    pub fn ll_calls(&self, rank: usize, block: u32) -> u64 {
        // SAFETY: the counter lies inside the pad; no kernel runs during this read.
        unsafe { ll_count_slot(self.pads[rank].as_ptr() as u64, block).read_volatile() }
    }

    /// Raise rank `rank`'s abort word to `value`, as the host does when the communicator
    /// failed.
    #[allow(dead_code)] // not every test binary raises it
    pub fn raise_abort(&mut self, rank: usize, value: u32) {
        // SAFETY: no kernel runs meanwhile.
        unsafe { std::ptr::write_volatile(&mut self.aborts[rank], value) };
    }

    /// The barrier epoch rank `from`'s block `block` last announced in rank `rank`'s inbox.
    #[allow(dead_code)] // not every test binary reads it
    pub fn inbox(&self, rank: usize, block: u32, from: u32) -> u32 {
        // SAFETY: the slot lies inside the pad; no kernel runs during this read.
        unsafe {
            symm_device::sync::signal_pad::inbox_slot(self.pads[rank].as_ptr() as u64, block, from)
                .read_volatile()
        }
    }

    /// Address of rank `rank`'s signal pad (to read or plant its slots while no kernel runs).
    #[allow(dead_code)] // not every test binary reads it
    pub fn pad_address(&self, rank: usize) -> u64 {
        self.pads[rank].as_ptr() as u64
    }

    /// `true` if rank `rank`'s abort word is raised.
    pub fn aborted(&self, rank: usize) -> bool {
        self.abort_word(rank) != 0
    }

    /// The value of rank `rank`'s abort word (0: not aborted).
    #[allow(dead_code)] // not every test binary reads it
    pub fn abort_word(&self, rank: usize) -> u32 {
        // SAFETY: kernels write the word atomically; no kernel runs during this read.
        unsafe { std::ptr::read_volatile(&self.aborts[rank]) }
    }

    /// Run `kernel` on the ranks in `active` (every rank when `None`), `blocks` blocks of
    /// `threads` threads each, in one emulated grid. Returns each active rank's status.
    pub fn launch(
        &self,
        kernel: KernelFn,
        args: CollectiveArgs,
        blocks: u32,
        threads: u32,
        active: Option<&[usize]>,
    ) -> Vec<KernelStatus> {
        self.launch_with_rank_flags(kernel, args, blocks, threads, active, &[])
    }

    /// Run `kernel` on every rank with the send buffers in `send`'s windows (rank `r`'s send
    /// window is `send`'s window `r`) and the receive buffers in this model's, `blocks` blocks
    /// of `threads` threads each, in one emulated grid. Returns each rank's status.
    pub fn launch_with_send_windows(
        &self,
        send: &Ranks,
        kernel: KernelFn,
        args: CollectiveArgs,
        blocks: u32,
        threads: u32,
    ) -> Vec<KernelStatus> {
        assert_eq!(send.world(), self.world());
        let table: Vec<TaskArgs> = (0..self.world())
            .map(|r| TaskArgs {
                send_context: &send.contexts[r] as *const SymmContext as u64,
                recv_context: &self.contexts[r] as *const SymmContext as u64,
                send_offset: args.send_offset,
                recv_offset: args.recv_offset,
                count: args.count,
                first_cell: 0,
                flags: args.flags,
                reserved: 0,
                counts_context: 0,
                counts_offset: 0,
                send_capacity: 0,
            })
            .collect();
        self.run_table(&table, 1, kernel, blocks, threads)
    }

    /// As [`Ranks::launch`], with per-rank flags (`rank_flags[i]` for the `i`-th active rank;
    /// missing entries are 0), e.g. some ranks in place and others not.
    pub fn launch_with_rank_flags(
        &self,
        kernel: KernelFn,
        args: CollectiveArgs,
        blocks: u32,
        threads: u32,
        active: Option<&[usize]>,
        rank_flags: &[u32],
    ) -> Vec<KernelStatus> {
        let all: Vec<usize> = (0..self.world()).collect();
        let active = active.unwrap_or(&all);
        let flags: Vec<Vec<u32>> = (0..active.len())
            .map(|i| vec![args.flags | rank_flags.get(i).copied().unwrap_or(0)])
            .collect();
        let task = BatchTask {
            args,
            first_cell: 0,
        };
        self.launch_batch(kernel, &[task], &flags, blocks, threads, Some(active))
    }

    /// Run `kernel` on a batch of `tasks` (their `first_cell`s as the host computes them) on
    /// the ranks in `active` (every rank when `None`); `flags[i][t]` is the `i`-th active rank's
    /// flags for task `t` (or-ed with the task's). Returns each active rank's status.
    pub fn launch_batch(
        &self,
        kernel: KernelFn,
        tasks: &[BatchTask],
        flags: &[Vec<u32>],
        blocks: u32,
        threads: u32,
        active: Option<&[usize]>,
    ) -> Vec<KernelStatus> {
        let all: Vec<usize> = (0..self.world()).collect();
        let active = active.unwrap_or(&all);
        let table: Vec<TaskArgs> = active
            .iter()
            .enumerate()
            .flat_map(|(i, r)| {
                let context = &self.contexts[*r] as *const SymmContext as u64;
                tasks.iter().enumerate().map(move |(t, task)| TaskArgs {
                    send_context: context,
                    recv_context: context,
                    send_offset: task.args.send_offset,
                    recv_offset: task.args.recv_offset,
                    count: task.args.count,
                    first_cell: task.first_cell,
                    flags: task.args.flags
                        | flags.get(i).and_then(|f| f.get(t)).copied().unwrap_or(0),
                    reserved: 0,
                    counts_context: 0,
                    counts_offset: 0,
                    send_capacity: 0,
                })
            })
            .collect();
        self.run_table(&table, tasks.len() as u32, kernel, blocks, threads)
    }

    /// Run `kernel` on the work table `table` (`task_count` tasks per rank, rank-major;
    /// `blocks` blocks per rank) in one emulated grid. Returns each rank's status.
    pub fn run_table(
        &self,
        table: &[TaskArgs],
        task_count: u32,
        kernel: KernelFn,
        blocks: u32,
        threads: u32,
    ) -> Vec<KernelStatus> {
        let ranks = (table.len() / task_count.max(1) as usize) as u32;
        let statuses: Vec<std::sync::Mutex<Option<KernelStatus>>> =
            (0..ranks).map(|_| std::sync::Mutex::new(None)).collect();
        run_grid(blocks * ranks, threads, &|| {
            // SAFETY: the table holds live contexts of this model; the tests pass arguments
            // that fit the windows.
            let status = unsafe {
                for_virtual_rank(table.as_ptr(), task_count, ranks, |batch, grid| {
                    kernel(batch, grid)
                })
            };
            let slot = symm_device::arch::block_idx_x() / blocks;
            let mut s = statuses[slot as usize].lock().unwrap();
            match *s {
                Some(previous) if previous != KernelStatus::Completed => {}
                _ => *s = Some(status),
            }
        });
        statuses
            .into_iter()
            .map(|s| s.into_inner().unwrap().unwrap())
            .collect()
    }
}

impl Ranks {
    /// Address of rank `rank`'s context, as device code receives it (`int64 ctx`).
    pub fn context_address(&self, rank: usize) -> i64 {
        &self.contexts[rank] as *const SymmContext as i64
    }

    /// Address of rank `rank`'s window base.
    pub fn base(&self, rank: usize) -> i64 {
        self.bases[rank] as i64
    }

    /// Run `body(rank)` on every thread of a separate `blocks × threads` grid per rank in
    /// `active` (every rank when `None`), the grids concurrently, as independent launches of a
    /// kernel that calls a device function. Returns each active rank's result; every thread of
    /// a rank's grid must return the same value (checked).
    pub fn run_per_rank(
        &self,
        blocks: u32,
        threads: u32,
        active: Option<&[usize]>,
        body: &(dyn Fn(usize) -> i32 + Sync),
    ) -> Vec<i32> {
        let all: Vec<usize> = (0..self.world()).collect();
        let active = active.unwrap_or(&all);
        std::thread::scope(|scope| {
            let handles: Vec<_> = active
                .iter()
                .map(|&rank| {
                    scope.spawn(move || {
                        let results = std::sync::Mutex::new(Vec::new());
                        run_grid(blocks, threads, &|| {
                            let result = body(rank);
                            results.lock().unwrap().push(result);
                        });
                        let results = results.into_inner().unwrap();
                        assert!(
                            results.iter().all(|r| *r == results[0]),
                            "rank {rank}: threads disagree on the status: {results:?}"
                        );
                        results[0]
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        })
    }
}

/// One task of a batch launched by [`Ranks::launch_batch`].
#[derive(Clone, Copy, Debug)]
pub struct BatchTask {
    /// Offsets, count and flags (every rank's).
    pub args: CollectiveArgs,
    /// Its first cell among the batch's (`symm_device::symmetric::batch::task_cells`).
    pub first_cell: u64,
}

fn bytemuck_words(chunks: &mut [Chunk]) -> &mut [u32] {
    // SAFETY: 16-byte aligned plain bytes viewed as u32.
    unsafe { std::slice::from_raw_parts_mut(chunks.as_mut_ptr().cast(), chunks.len() * 4) }
}

/// A small deterministic generator (SplitMix64).
pub struct Rng(pub u64);

impl Rng {
    /// Next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}
