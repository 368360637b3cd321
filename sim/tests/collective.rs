//! A real collective of the shipped PTX: an 8-rank one-shot all-reduce of 64 KiB per rank,
//! each rank its own grid (as each rank's stream launches it), with the argument table and
//! window contexts the host library builds. Prints the simulation speed.

use symm_artifacts::{gzip, split};

mod common;

use std::sync::Arc;
use std::time::Instant;

use common::Buffer;
use symm_sim::{AddressSpace, GridId, Launch, Module, RunOutcome, SimConfig, Simulator};

/// The sm_90 module of `kernel`, cut as the CUDA backend cuts it, with `edit` applied.
fn kernel_module(kernel: &str, edit: fn(String) -> String) -> Module {
    let path = format!("{}/../ptx-out/symm_sm90.ptx.gz", env!("CARGO_MANIFEST_DIR"));
    let file = std::fs::read(path).expect("PTX");
    let text = gzip::decompress(&file).expect("inflates");
    let text = String::from_utf8(text).expect("UTF-8");
    let module = split::PtxIndex::new(&text)
        .kernel_module(kernel)
        .expect("kernel");
    Module::load(&edit(module)).expect("loads")
}

/// Bytes of one rank's signal pad for `world` ranks (device/src/sync/signal_pad.rs).
fn signal_pad_bytes(world: usize) -> usize {
    let ll_offset = 32 * 1024;
    let ll_lines = 16 * 1024 / 8;
    ll_offset + 2 * world * ll_lines * 16 + (world - 1) * 64 * 1024
}

struct World {
    _space: Arc<AddressSpace>,
    windows: Vec<Buffer>,
    pads: Vec<Buffer>,
    /// Peer bases, peer pads, abort words, contexts.
    tables: Vec<Buffer>,
    tasks: Vec<Buffer>,
}

const ONE_SHOT: &str = "symm_one_shot_all_reduce_f32_sum";
const TWO_SHOT: &str = "symm_two_shot_all_reduce_f32_sum";
const ONE_SHOT_LL: &str = "symm_one_shot_ll_all_reduce_f32_sum";
const PAT_ALL_GATHER: &str = "symm_pat_all_gather";
const WORLD: usize = 8;
const COUNT: usize = 16384; // f32 elements: 64 KiB per rank
const BYTES: usize = COUNT * 4;

/// Windows (send buffer at 0, receive buffer at `BYTES`), pads, contexts and one task per
/// rank; rank r's send value i is `r * 1000 + i % 1000`.
fn world(space: &Arc<AddressSpace>, timeout_ns: u64) -> World {
    let pad_bytes = signal_pad_bytes(WORLD);
    let mut windows: Vec<Buffer> = (0..WORLD)
        .map(|r| Buffer::new(space, 2 * BYTES / 8, &format!("window {r}")))
        .collect();
    let pads: Vec<Buffer> = (0..WORLD)
        .map(|r| Buffer::new(space, pad_bytes / 8, &format!("pad {r}")))
        .collect();
    let mut tables = Vec::new();
    let mut bases = Buffer::new(space, WORLD, "peer bases");
    let mut pad_table = Buffer::new(space, WORLD, "peer pads");
    let aborts = Buffer::new(space, WORLD, "aborts");
    let mut contexts = Buffer::new(space, 12 * WORLD, "contexts");
    let mut tasks = Vec::new();
    for r in 0..WORLD {
        for i in 0..COUNT {
            windows[r].set32(i, ((r * 1000 + i % 1000) as f32).to_bits());
        }
        bases.set(r, windows[r].addr());
        pad_table.set(r, pads[r].addr());
        let ctx = [
            1u64 << 32,
            r as u64 | (WORLD as u64) << 32,
            windows[r].addr(),
            2 * BYTES as u64,
            bases.addr(),
            pad_table.addr(),
            pad_bytes as u64,
            aborts.addr() + 4 * r as u64,
            timeout_ns,
            0,
            0,
            0,
        ];
        let ctx_addr = contexts.addr() + 96 * r as u64;
        for (k, v) in ctx.iter().enumerate() {
            contexts.set(12 * r + k, *v);
        }
        let mut task = Buffer::new(space, 7, &format!("task {r}"));
        let args = [ctx_addr, ctx_addr, 0, BYTES as u64, COUNT as u64, 0, 0];
        for (k, v) in args.iter().enumerate() {
            task.set(k, *v);
        }
        tasks.push(task);
    }
    tables.extend([bases, pad_table, aborts, contexts]);
    World {
        _space: space.clone(),
        windows,
        pads,
        tables,
        tasks,
    }
}

/// Run the all-reduce `calls` times with `config` (in place from the second call on each
/// rank's stream order: a rank's next call starts when its previous one finished); returns
/// (instructions, seconds), or the first wrong element.
struct Run {
    kernel: &'static str,
    config: SimConfig,
    blocks: u32,
    threads: u32,
    edit: fn(String) -> String,
    in_place: bool,
    calls: u32,
    count: usize,
}

/// A run of `kernel` under `config` with `blocks` × `threads` per rank, one out-of-place
/// call of the whole 64 KiB.
fn run(kernel: &'static str, config: SimConfig, blocks: u32, threads: u32) -> Run {
    Run {
        kernel,
        config,
        blocks,
        threads,
        edit: unchanged,
        in_place: false,
        calls: 1,
        count: COUNT,
    }
}

/// As [`run`], two in-place calls of 16 KiB with `edit` applied to the PTX.
fn twice_in_place(config: SimConfig, edit: fn(String) -> String) -> Run {
    Run {
        edit,
        in_place: true,
        calls: 2,
        count: 4096,
        ..run(ONE_SHOT, config, 2, 256)
    }
}

fn all_reduce(run: Run) -> Result<(u64, f64), String> {
    let Run {
        kernel: kernel_name,
        config,
        blocks,
        threads,
        edit,
        in_place,
        calls,
        count,
    } = run;
    assert!(count <= COUNT);
    let module = Arc::new(kernel_module(kernel_name, edit));
    let space = Arc::new(AddressSpace::new());
    let mut w = world(&space, 10_000_000_000);
    for task in &mut w.tasks {
        task.set(4, count as u64);
    }
    if in_place {
        for task in &mut w.tasks {
            let ctx = task.get(0);
            task.set(1, ctx);
            task.set(3, 0);
            task.set(6, 1); // FLAG_IN_PLACE
        }
    }
    let mut sim = Simulator::new(config.clone(), space.clone());
    let mut rank_of = std::collections::HashMap::new();
    let launch = |sim: &mut Simulator, r: usize| {
        launch_on(
            sim,
            r as u32,
            &module,
            kernel_name,
            blocks,
            threads,
            w.tasks[r].addr(),
        )
    };
    for r in 0..WORLD {
        let id = launch(&mut sim, r);
        rank_of.insert(id, (r, 1));
    }
    let start = Instant::now();
    let mut finished = 0;
    while finished < WORLD {
        match sim.run(u64::MAX) {
            RunOutcome::Finished(grids) => {
                for g in grids {
                    let (r, call) = rank_of[&g];
                    if call < calls {
                        let id = launch(&mut sim, r);
                        rank_of.insert(id, (r, call + 1));
                    } else {
                        finished += 1;
                    }
                }
            }
            RunOutcome::Fault(_, report) => return Err(report),
            other => panic!("seed {}: {other:?}", config.seed),
        }
    }
    let seconds = start.elapsed().as_secs_f64();
    let result = if in_place { 0 } else { COUNT };
    for r in 0..WORLD {
        for i in 0..count {
            let sum: f32 = (0..WORLD).map(|q| (q * 1000 + i % 1000) as f32).sum();
            let want = sum * (WORLD as f32).powi(calls as i32 - 1);
            let got = f32::from_bits(w.windows[r].get32(result + i));
            if got != want {
                return Err(format!(
                    "seed {} rank {r} element {i}: {got} instead of {want}",
                    config.seed
                ));
            }
        }
    }
    eprintln!("{:?} policy seed {}", sim.stats(), config.seed);
    Ok((sim.instructions(), seconds))
}

fn unchanged(text: String) -> String {
    text
}

/// The orderings of the cross-rank barriers relaxed (what a missing acquire/release would
/// do): `ld.acquire` → `ld.relaxed`, `st.release` → `st.relaxed`, `atom.release` →
/// `atom.relaxed`.
fn relaxed(text: String) -> String {
    text.replace("ld.acquire.sys.u32", "ld.relaxed.sys.u32")
        .replace("st.release.sys.u32", "st.relaxed.sys.u32")
        .replace("atom.release.sys.cas.b32", "atom.relaxed.sys.cas.b32")
}

#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "slow without optimizations: run with --release"
)]
fn eight_rank_one_shot_all_reduce_of_64_kib() {
    for seed in 0..3 {
        let config = SimConfig {
            seed,
            ..SimConfig::default()
        };
        let (instructions, seconds) = all_reduce(run(ONE_SHOT, config, 4, 512)).unwrap();
        eprintln!(
            "seed {seed}: {instructions} instructions in {seconds:.3} s: {:.1} M instructions/s",
            instructions as f64 / seconds / 1e6
        );
    }
}

#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "slow without optimizations: run with --release"
)]
fn eight_rank_two_shot_all_reduce_sc_and_weak() {
    for seed in 0..2 {
        let config = SimConfig {
            seed,
            weak_memory: seed == 1,
            ..SimConfig::default()
        };
        all_reduce(run(TWO_SHOT, config, 2, 256)).unwrap();
    }
}

#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "slow without optimizations: run with --release"
)]
fn eight_rank_one_shot_all_reduce_on_few_sms() {
    // 8 grids of 2 blocks on 2 SMs per device: every block still fits.
    let config = SimConfig {
        seed: 77,
        sms: 2,
        ..SimConfig::default()
    };
    all_reduce(run(ONE_SHOT, config, 2, 256)).unwrap();
}

#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "slow without optimizations: run with --release"
)]
fn eight_rank_one_shot_all_reduce_is_correct_under_weak_memory() {
    for seed in 0..3 {
        let config = SimConfig {
            seed,
            weak_memory: true,
            ..SimConfig::default()
        };
        let (instructions, seconds) = all_reduce(run(ONE_SHOT, config.clone(), 2, 256)).unwrap();
        let (i2, s2) = all_reduce(twice_in_place(config, unchanged)).unwrap();
        eprintln!("weak, in place twice (16 KiB), seed {seed}: {i2} instructions in {s2:.3} s");
        eprintln!(
            "weak, seed {seed}: {instructions} instructions in {seconds:.3} s: {:.1} M instructions/s",
            instructions as f64 / seconds / 1e6
        );
    }
}

#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "slow without optimizations: run with --release"
)]
fn relaxing_the_barrier_orderings_is_caught_under_weak_memory() {
    // Sequential consistency hides the missing orderings.
    let config = SimConfig {
        seed: 0,
        ..SimConfig::default()
    };
    all_reduce(twice_in_place(config, relaxed)).expect("SC");
    // A few seeds of weak memory expose them.
    let caught = (0..4).find_map(|seed| {
        let weak = SimConfig {
            seed,
            weak_memory: true,
            ..SimConfig::default()
        };
        all_reduce(twice_in_place(weak, relaxed)).err()
    });
    eprintln!("caught: {caught:?}");
    assert!(caught.is_some(), "no seed exposed the relaxed barrier");
}

#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "slow without optimizations: run with --release"
)]
fn a_missing_rank_stalls_then_times_out_when_time_passes() {
    let module = Arc::new(kernel_module(ONE_SHOT, unchanged));
    let space = Arc::new(AddressSpace::new());
    let w = world(&space, 200_000);
    let config = SimConfig {
        seed: 5,
        ..SimConfig::default()
    };
    let mut sim = Simulator::new(config, space.clone());
    // Rank 7 never launches.
    for r in 0..WORLD - 1 {
        launch_on(
            &mut sim,
            r as u32,
            &module,
            ONE_SHOT,
            2,
            128,
            w.tasks[r].addr(),
        );
    }
    let report = match sim.run(u64::MAX) {
        RunOutcome::Stalled => sim.stall_report(),
        other => panic!("expected a stall, got {other:?}"),
    };
    assert!(report.contains("sleep at line"), "{report}");
    assert!(report.contains("seed 5"), "{report}");
    // Letting virtual time pass, the waits time out and every kernel gives up.
    finish(&mut sim, WORLD - 1).unwrap();
    assert!(sim.now_ns() >= 200_000);
    // Each rank's abort word says it timed out waiting for rank 7.
    let aborts = &w.tables[2];
    for r in 0..WORLD - 1 {
        assert_eq!(aborts.get32(r), 1 | 8 << 8, "rank {r}");
    }
}

/// How a launch of a shipped kernel is made to refuse itself.
#[derive(Clone, Copy, Debug)]
enum Refusal {
    /// The one-shot kernel launched with 65 blocks for one rank (at most `MAX_BLOCKS`, 64):
    /// `resolve_launch` refuses before any body runs.
    TooManyBlocks,
    /// The LL kernel asked for 64 KiB per rank (its lines hold 16 KiB): the body refuses.
    LinesDoNotFit,
}

/// Launch `kernel` once on rank 0's device and let virtual time pass until it finishes
/// (waits that sleep are woken); `Err` on a fault or past 100 000 time steps.
fn run_alone(
    sim: &mut Simulator,
    module: &Arc<Module>,
    kernel: &'static str,
    grid: u32,
    block: u32,
    task: u64,
) -> Result<(), String> {
    launch_on(sim, 0, module, kernel, grid, block, task);
    finish(sim, 1)
}

/// Launch `kernel` with `grid` × `block` threads on device `device`, with the one-task table
/// at `task`.
fn launch_on(
    sim: &mut Simulator,
    device: u32,
    module: &Arc<Module>,
    kernel: &str,
    grid: u32,
    block: u32,
    task: u64,
) -> GridId {
    let kernel = module.kernel(kernel).expect("kernel");
    sim.launch(Launch {
        device,
        module: module.clone(),
        kernel,
        grid: [grid, 1, 1],
        block: [block, 1, 1],
        params: vec![
            task.to_le_bytes().to_vec(),
            1u32.to_le_bytes().to_vec(),
            1u32.to_le_bytes().to_vec(),
        ],
    })
    .expect("launch")
}

/// Run until `grids` launched grids finished, letting virtual time pass when every thread
/// sleeps; `Err` on a fault or past 100 000 time steps.
fn finish(sim: &mut Simulator, grids: usize) -> Result<(), String> {
    let mut finished = 0;
    let mut advances = 0;
    while finished < grids {
        match sim.run(u64::MAX) {
            RunOutcome::Finished(done) => finished += done.len(),
            RunOutcome::Stalled => {
                advances += 1;
                if advances > 100_000 {
                    return Err(format!("never finished: {}", sim.stall_report()));
                }
                let t = sim.next_wakeup_ns().expect("sleepers");
                sim.advance_time_to(t);
            }
            RunOutcome::Fault(_, report) => return Err(report),
            other => return Err(format!("{other:?}")),
        }
    }
    Ok(())
}

/// The exported kernels' wiring of a refused launch, as the shipped PTX runs it: rank 0
/// launches a kernel that refuses itself (`refusal`), then a valid one-shot all-reduce while
/// its peers launch nothing. The refusal must raise rank 0's abort word with
/// `ABORT_INVALID_LAUNCH` and set its window's out-of-step mark, touching no peer's pad; the
/// next launch must then give up without announcing its start barrier into any peer's pad.
/// Returns what went wrong (empty when nothing did), or `Err` when a launch faulted or never
/// finished.
fn refused_launch_then_next(
    edit: fn(String) -> String,
    refusal: Refusal,
) -> Result<Vec<Finding>, String> {
    use symm_device::sync::abort::ABORT_INVALID_LAUNCH;
    use symm_device::sync::signal_pad::OUT_OF_STEP_OFFSET;
    let one_shot = Arc::new(kernel_module(ONE_SHOT, edit));
    let space = Arc::new(AddressSpace::new());
    let mut w = world(&space, 200_000);
    let config = SimConfig {
        seed: 11,
        ..SimConfig::default()
    };
    let mut sim = Simulator::new(config, space.clone());
    let task = w.tasks[0].addr();
    let before: Vec<Vec<u64>> = w.pads.iter().map(|p| p.data.to_vec()).collect();
    let peers_changed = |w: &World| -> bool {
        (1..WORLD).any(|r| (0..before[r].len()).any(|i| w.pads[r].get(i) != before[r][i]))
    };
    match refusal {
        Refusal::TooManyBlocks => run_alone(&mut sim, &one_shot, ONE_SHOT, 65, 32, task)?,
        Refusal::LinesDoNotFit => {
            let ll = Arc::new(kernel_module(ONE_SHOT_LL, edit));
            w.tasks[0].set(4, COUNT as u64);
            run_alone(&mut sim, &ll, ONE_SHOT_LL, 1, 128, task)?
        }
    }
    let mut findings = Vec::new();
    if w.tables[2].get32(0) != ABORT_INVALID_LAUNCH {
        findings.push(Finding::AbortWordNotRaised);
    }
    if w.pads[0].get32(OUT_OF_STEP_OFFSET / 4) == 0 {
        findings.push(Finding::WindowNotMarked);
    }
    if peers_changed(&w) {
        findings.push(Finding::RefusalWroteIntoPeers);
    }
    // The next call, valid, with the peers silent: no announcement may reach them.
    w.tasks[0].set(4, 1024);
    run_alone(&mut sim, &one_shot, ONE_SHOT, 2, 128, task)?;
    if peers_changed(&w) {
        findings.push(Finding::NextLaunchAnnounced);
    }
    Ok(findings)
}

/// What [`refused_launch_then_next`] found wrong.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Finding {
    /// The refusing rank's abort word does not hold `ABORT_INVALID_LAUNCH`.
    AbortWordNotRaised,
    /// The window's out-of-step mark is clear after the refusal.
    WindowNotMarked,
    /// The refused launch changed a peer's signal pad.
    RefusalWroteIntoPeers,
    /// The launch after the refusal announced into a peer's signal pad.
    NextLaunchAnnounced,
}

/// The first operand (the destination) of an instruction's `operands` text.
fn first_operand(operands: &str) -> &str {
    operands.trim().split(',').next().unwrap_or("").trim()
}

/// The line that replaces an instruction whose `operands` start with a 32-bit destination: a
/// move of 0 into it.
fn zero_into_destination(operands: &str) -> String {
    format!("\tmov.b32 \t{}, 0;", first_operand(operands))
}

/// `text` with the out-of-step mark's accesses (addresses pad + `OUT_OF_STEP_OFFSET`) removed:
/// with `stores`, its `st.release.sys.u32` (nothing marks a window); else its
/// `ld.relaxed.sys.u32` made a move of 0 (no barrier sees a mark).
fn without_mark_accesses(text: String, stores: bool) -> String {
    let offset = format!(", {};", symm_device::sync::signal_pad::OUT_OF_STEP_OFFSET);
    let mut marked: Vec<String> = Vec::new();
    let mut out: Vec<String> = Vec::new();
    let mut removed = 0;
    for line in text.lines() {
        let t = line.trim();
        let at_mark = |prefix: &str| t.starts_with(prefix) && marked.iter().any(|m| t.contains(m));
        if t.starts_with("add.s64") && t.ends_with(&offset) {
            marked.push(format!("[{}]", first_operand(&t["add.s64".len()..])));
        } else if stores && at_mark("st.release.sys.u32") {
            removed += 1;
            continue;
        } else if !stores && at_mark("ld.relaxed.sys.u32") {
            out.push(zero_into_destination(&t["ld.relaxed.sys.u32".len()..]));
            removed += 1;
            continue;
        }
        out.push(line.to_string());
    }
    assert!(removed > 0, "the mutant changed no access to the mark");
    out.join("\n")
}

fn no_mark_stores(text: String) -> String {
    without_mark_accesses(text, true)
}

fn no_mark_reads(text: String) -> String {
    without_mark_accesses(text, false)
}

/// `text` with every compare-and-swap that raises `ABORT_INVALID_LAUNCH` (its new value a
/// register just set to 2) made a plain move of 0: a refusal raises nothing.
fn no_refusal_raise(text: String) -> String {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::with_capacity(lines.len());
    let mut removed = 0;
    for (i, line) in lines.iter().enumerate() {
        let t = line.trim();
        if let Some(rest) = t.strip_prefix("atom.release.sys.cas.b32") {
            let operands: Vec<&str> = rest
                .trim_end_matches(';')
                .split(',')
                .map(str::trim)
                .collect();
            let new_value = operands.last().copied().unwrap_or("");
            let set_to_two = format!("mov.b32 \t{new_value}, 2;");
            if lines[i.saturating_sub(4)..i]
                .iter()
                .any(|l| l.trim() == set_to_two)
            {
                out.push(zero_into_destination(rest));
                removed += 1;
                continue;
            }
        }
        out.push(line.to_string());
    }
    assert!(removed > 0, "the mutant removed no raise");
    out.join("\n")
}

#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "slow without optimizations: run with --release"
)]
fn a_refused_launch_of_the_shipped_ptx_marks_its_window_and_the_next_launch_announces_nothing() {
    use Finding::*;
    for refusal in [Refusal::TooManyBlocks, Refusal::LinesDoNotFit] {
        assert_eq!(
            refused_launch_then_next(unchanged, refusal),
            Ok(vec![]),
            "{refusal:?}"
        );
        // Each part of the wiring is needed: each mutant is caught by what it breaks.
        type Mutant = (&'static str, fn(String) -> String, &'static [Finding]);
        let mutants: [Mutant; 3] = [
            (
                "no mark stored",
                no_mark_stores,
                &[WindowNotMarked, NextLaunchAnnounced],
            ),
            ("no mark read", no_mark_reads, &[NextLaunchAnnounced]),
            (
                "no abort word raised",
                no_refusal_raise,
                &[AbortWordNotRaised],
            ),
        ];
        for (what, edit, expected) in mutants {
            let found = refused_launch_then_next(edit, refusal);
            eprintln!("{refusal:?}, {what}: {found:?}");
            assert_eq!(found, Ok(expected.to_vec()), "{refusal:?}, {what}");
        }
    }
}

/// A PAT all-gather of the shipped PTX that starts after the host failed its rank's
/// communicator, while every peer has already made the same call, posted its readiness and
/// timed out (rank 0 never came): rank 0's first readiness wait is satisfied by those stale
/// flags, and rank 0 must give up there, before storing into any peer's receive buffer.
/// `Ok(true)` when a peer's receive buffer changed.
fn late_pat_kernel_stores_into_a_peer(edit: fn(String) -> String) -> Result<bool, String> {
    use symm_device::sync::abort::ABORT_PEER_FAILED;
    let module = Arc::new(kernel_module(PAT_ALL_GATHER, edit));
    let space = Arc::new(AddressSpace::new());
    let mut w = world(&space, 200_000);
    let bytes = 1024u64; // per rank: the 8 segments fill 8 KiB of the receive buffer
    for task in &mut w.tasks {
        task.set(4, bytes);
    }
    let config = SimConfig {
        seed: 13,
        ..SimConfig::default()
    };
    let mut sim = Simulator::new(config, space.clone());
    for r in 1..WORLD {
        let task = w.tasks[r].addr();
        launch_on(&mut sim, r as u32, &module, PAT_ALL_GATHER, 2, 128, task);
    }
    finish(&mut sim, WORLD - 1)?;
    w.tables[2].set32(0, ABORT_PEER_FAILED);
    let pattern = 0xA5A5_A5A5_A5A5_A5A5u64;
    let received = BYTES / 8..BYTES / 8 + WORLD * bytes as usize / 8;
    for window in &mut w.windows[1..] {
        for i in received.clone() {
            window.set(i, pattern);
        }
    }
    let task = w.tasks[0].addr();
    run_alone(&mut sim, &module, PAT_ALL_GATHER, 2, 128, task)?;
    Ok(w.windows[1..]
        .iter()
        .any(|window| received.clone().any(|i| window.get(i) != pattern)))
}

/// `text` with every `ld.relaxed.sys.u32` made a move of 0: in the PAT kernels, the look at
/// the abort word that the first readiness wait compares (their waits poll with acquire
/// loads).
fn no_relaxed_loads(text: String) -> String {
    let mut removed = 0;
    let out: Vec<String> = text
        .lines()
        .map(
            |line| match line.trim().strip_prefix("ld.relaxed.sys.u32") {
                Some(rest) => {
                    removed += 1;
                    zero_into_destination(rest)
                }
                None => line.to_string(),
            },
        )
        .collect();
    assert!(removed > 0, "the mutant changed no load");
    out.join("\n")
}

#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "slow without optimizations: run with --release"
)]
fn a_late_pat_kernel_on_a_failed_communicator_stores_into_no_peer() {
    assert_eq!(late_pat_kernel_stores_into_a_peer(unchanged), Ok(false));
    // Without the look, the late kernel stores its segment into the peer that posted its
    // readiness.
    assert_eq!(
        late_pat_kernel_stores_into_a_peer(no_relaxed_loads),
        Ok(true)
    );
}
