//! Grids running together: message passing, residency deadlock, faults, determinism.

mod common;

use std::sync::Arc;

use common::*;
use symm_sim::{AddressSpace, RunOutcome, SimConfig, Simulator};

/// Producer: every thread writes `data[tid] = tid + 1`, then (after a barrier) thread 0 sets
/// the flag with `flag_store`. Consumer: thread 0 waits for the flag with `flag_load` and
/// `nanosleep`, then (after a barrier) every thread copies `data[tid]` to `out[tid]`.
fn message_passing(flag_store: &str, flag_load: &str) -> String {
    let producer = kernel(
        "producer",
        ".param .u64 .ptr .align 1 producer_param_0, .param .u64 .ptr .align 1 producer_param_1",
        &format!(
            "
	ld.param.b64 	%rd1, [producer_param_0];
	ld.param.b64 	%rd2, [producer_param_1];
	mov.u32 	%r1, %tid.x;
	add.s32 	%r2, %r1, 1;
	mul.wide.u32 	%rd3, %r1, 4;
	add.s64 	%rd4, %rd1, %rd3;
	st.b32 	[%rd4], %r2;
	barrier.sync 	0;
	setp.ne.b32 	%p1, %r1, 0;
	@%p1 bra 	$L__done;
	mov.b32 	%r3, 1;
	{flag_store} 	[%rd2], %r3;
$L__done:
"
        ),
    );
    let consumer = kernel(
        "consumer",
        ".param .u64 .ptr .align 1 consumer_param_0, .param .u64 .ptr .align 1 consumer_param_1, .param .u64 .ptr .align 1 consumer_param_2",
        &format!(
            "
	ld.param.b64 	%rd1, [consumer_param_0];
	ld.param.b64 	%rd2, [consumer_param_1];
	ld.param.b64 	%rd5, [consumer_param_2];
	mov.u32 	%r1, %tid.x;
	setp.ne.b32 	%p1, %r1, 0;
	@%p1 bra 	$L__wait;
$L__spin:
	{flag_load} 	%r4, [%rd2];
	setp.ne.b32 	%p2, %r4, 0;
	@%p2 bra 	$L__wait;
	nanosleep.u32 	100;
	bra.uni 	$L__spin;
$L__wait:
	barrier.sync 	0;
	mul.wide.u32 	%rd3, %r1, 4;
	add.s64 	%rd4, %rd1, %rd3;
	ld.b32 	%r2, [%rd4];
	add.s64 	%rd6, %rd5, %rd3;
	st.b32 	[%rd6], %r2;
"
        ),
    );
    // Two modules in one text: keep one header.
    let body = consumer.split_once(".address_size 64\n").expect("header").1;
    format!("{producer}{body}")
}

/// Run the message-passing pair with `seed`; the number of wrong values the consumer saw, or
/// the fault report (a data race, with `races`).
fn try_message_passing(text: &str, seed: u64, weak: bool, races: bool) -> Result<usize, String> {
    let config = SimConfig {
        seed,
        weak_memory: weak,
        races,
        ..SimConfig::default()
    };
    // The consumer starts first and spins; the producer runs on another device.
    let out = run_pair(text, config, ("consumer", true), ("producer", false))?;
    Ok((0..128).filter(|&i| out.get32(i) != i as u32 + 1).count())
}

/// Run two one-block kernels of `text` (128 threads each) over a `data` (64 words), `flag`
/// and `out` buffer to the end: `waiter` first on device 1, then `signaller` on device 0, each
/// named with whether it takes `out` after `data` and `flag`. Returns `out`.
fn run_pair(
    text: &str,
    config: SimConfig,
    waiter: (&str, bool),
    signaller: (&str, bool),
) -> Result<Buffer, String> {
    let m = module(text);
    let space = Arc::new(AddressSpace::new());
    let mut sim = Simulator::new(config, space.clone());
    let data = Buffer::new(&space, 64, "data");
    let flag = Buffer::new(&space, 1, "flag");
    let out = Buffer::new(&space, 64, "out");
    for (device, (name, takes_out)) in [(1, waiter), (0, signaller)] {
        let all = [data.addr(), flag.addr(), out.addr()];
        let params = if takes_out { &all[..] } else { &all[..2] };
        launch_on(&mut sim, device, &m, name, 1, 128, params);
    }
    run_to_end(&mut sim)?;
    Ok(out)
}

/// [`try_message_passing`] without race reports; it must run to the end.
fn run_message_passing(text: &str, seed: u64, weak: bool) -> usize {
    try_message_passing(text, seed, weak, false).unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn release_acquire_message_passing_works_for_every_seed() {
    let text = message_passing("st.release.sys.u32", "ld.acquire.sys.u32");
    for seed in 0..20 {
        assert_eq!(run_message_passing(&text, seed, false), 0, "seed {seed}");
        assert_eq!(
            run_message_passing(&text, seed, true),
            0,
            "weak, seed {seed}"
        );
    }
}

#[test]
fn relaxed_message_passing_is_caught_by_the_weak_model() {
    let text = message_passing("st.relaxed.sys.u32", "ld.relaxed.sys.u32");
    let mut caught = 0;
    for seed in 0..8 {
        assert_eq!(
            run_message_passing(&text, seed, false),
            0,
            "SC, seed {seed}"
        );
        if run_message_passing(&text, seed, true) > 0 {
            caught += 1;
        }
    }
    assert!(
        caught > 0,
        "the weak model never let the consumer read stale data"
    );
}

#[test]
fn plain_accesses_ordered_only_by_relaxed_flags_are_reported_as_races() {
    let relaxed = message_passing("st.relaxed.sys.u32", "ld.relaxed.sys.u32");
    for seed in 0..4 {
        let report = try_message_passing(&relaxed, seed, true, true)
            .expect_err("the racy program ran without a report");
        assert!(
            report.starts_with("data race: a plain load of 4 bytes")
                && report.contains("plain store of it by kernel producer")
                && report.contains("kernel consumer"),
            "seed {seed}: {report}"
        );
    }
    // Release/acquire orders the same plain accesses: no report, every seed.
    let ordered = message_passing("st.release.sys.u32", "ld.acquire.sys.u32");
    for seed in 0..8 {
        assert_eq!(
            try_message_passing(&ordered, seed, true, true),
            Ok(0),
            "seed {seed}"
        );
    }
}

/// Every block adds 1 to a counter, then waits (spinning with nanosleep) until all blocks
/// did: a grid-wide barrier, which needs every block resident at once.
fn grid_barrier() -> String {
    kernel(
        "gb",
        ".param .u64 .ptr .align 1 gb_param_0",
        "
	ld.param.b64 	%rd1, [gb_param_0];
	mov.u32 	%r1, %tid.x;
	mov.u32 	%r2, %nctaid.x;
	setp.ne.b32 	%p1, %r1, 0;
	@%p1 bra 	$L__wait;
	atom.relaxed.gpu.add.u32 	%r3, [%rd1], 1;
$L__spin:
	ld.acquire.sys.u32 	%r4, [%rd1];
	setp.ge.u32 	%p2, %r4, %r2;
	@%p2 bra 	$L__wait;
	nanosleep.u32 	1000;
	bra.uni 	$L__spin;
$L__wait:
	barrier.sync 	0;
",
    )
}

#[test]
fn a_grid_needing_more_resident_blocks_than_fit_is_reported_stalled() {
    let m = module(&grid_barrier());
    let space = Arc::new(AddressSpace::new());
    let config = SimConfig {
        seed: 9,
        sms: 2,
        ..SimConfig::default()
    };
    // 512 threads at 80 registers: one block per SM, so 2 of the 3 blocks are resident.
    let mut sim = Simulator::new(config.clone(), space.clone());
    let counter = Buffer::new(&space, 1, "counter");
    launch(&mut sim, &m, "gb", 3, 512, &[counter.addr()]);
    let report = match sim.run(1 << 24) {
        RunOutcome::Stalled => sim.stall_report(),
        other => panic!("expected a stall, got {other:?}"),
    };
    assert!(
        report.contains("1 blocks waiting for residency"),
        "{report}"
    );
    assert!(report.contains("sleep at line"), "{report}");
    assert!(report.contains("wait at the barrier"), "{report}");
    assert!(report.contains("seed 9"), "{report}");
    // Time passing does not help.
    let t = sim.next_wakeup_ns().expect("sleepers");
    sim.advance_time_to(t);
    assert!(matches!(sim.run(1 << 24), RunOutcome::Stalled));

    // With room for all three blocks it completes.
    let mut sim = Simulator::new(SimConfig { sms: 3, ..config }, space.clone());
    let counter = Buffer::new(&space, 1, "counter");
    launch(&mut sim, &m, "gb", 3, 512, &[counter.addr()]);
    run_to_end(&mut sim).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(counter.get32(0), 3);
}

#[test]
fn a_trap_names_the_panic_block_thread_and_line() {
    let text = ".version 7.8\n.target sm_90\n.address_size 64\n\
.func _RNvNtCsby7Xz2y7qhS_4core9panicking9panic_fmt\n(\n\t.param .b64 p_0\n)\n.noreturn;\n\
.func _RNvNtNtCsby7Xz2y7qhS_4core9panicking11panic_const23panic_const_div_by_zero\n(\n\t.param .b64 q_0\n)\n.noreturn;\n\
.visible .entry k()\n{\n\t.reg .pred \t%p<4>;\n\t.reg .b32 \t%r<8>;\n\
\tmov.u32 \t%r1, %tid.x;\n\tmov.u32 \t%r2, %ctaid.x;\n\tadd.s32 \t%r3, %r1, %r2;\n\
\tsetp.ne.b32 \t%p1, %r3, 4;\n\t@%p1 bra \t$L__ok;\n\
\t{ // callseq 0, 0\n\t.param .b64 \tparam0;\n\
\tcall.uni _RNvNtNtCsby7Xz2y7qhS_4core9panicking11panic_const23panic_const_div_by_zero, (param0);\n\t} // callseq 0\n\
$L__ok:\n\tret;\n}\n\
.func _RNvNtCsby7Xz2y7qhS_4core9panicking9panic_fmt(\n\t.param .b64 p_0\n)\n.noreturn\n{\n\ttrap;\n\texit;\n}\n\
.func _RNvNtNtCsby7Xz2y7qhS_4core9panicking11panic_const23panic_const_div_by_zero(\n\t.param .b64 q_0\n)\n.noreturn\n{\n\
\t{\n\t.param .b64 \tparam0;\n\tcall.uni _RNvNtCsby7Xz2y7qhS_4core9panicking9panic_fmt, (param0);\n\t}\n\texit;\n}\n";
    let m = module(text);
    let (mut sim, _space) = sim(11);
    let grid = launch(&mut sim, &m, "k", 2, 4, &[]);
    let (g, report) = loop {
        match sim.run(1 << 20) {
            RunOutcome::Fault(g, r) => break (g, r),
            RunOutcome::Finished(_) => continue,
            other => panic!("expected a fault, got {other:?}"),
        }
    };
    assert_eq!(g, grid);
    assert!(report.contains("panic_const_div_by_zero"), "{report}");
    assert!(
        report.contains("block (1, 0, 0), thread (3, 0, 0)"),
        "{report}"
    );
    assert!(report.contains("kernel k"), "{report}");
    assert!(report.contains("line 35: trap;"), "{report}");
    assert!(report.contains("seed 11"), "{report}");
    assert!(
        matches!(sim.run(1 << 20), RunOutcome::Idle),
        "the grid is gone"
    );
}

#[test]
fn bad_accesses_fault_with_block_thread_and_line() {
    let text = kernel(
        "k",
        ".param .u64 .ptr .align 1 k_param_0, .param .u64 k_param_1",
        "
	ld.param.b64 	%rd1, [k_param_0];
	ld.param.b64 	%rd2, [k_param_1];
	mov.u32 	%r1, %tid.x;
	setp.ne.b32 	%p1, %r1, 5;
	@%p1 bra 	$L__ok;
	add.s64 	%rd3, %rd1, %rd2;
	ld.v4.b32 	{%r2, %r3, %r4, %r5}, [%rd3];
$L__ok:
",
    );
    let m = module(&text);
    for (offset, expect) in [
        (1 << 20, "out-of-bounds"),
        (4, "misaligned"),
        (512, "out-of-bounds"),
    ] {
        let (mut sim, space) = sim(2);
        let buf = Buffer::new(&space, 64, "buf");
        launch(&mut sim, &m, "k", 1, 32, &[buf.addr(), offset]);
        let report = match sim.run(1 << 20) {
            RunOutcome::Fault(_, r) => r,
            other => panic!("expected a fault, got {other:?}"),
        };
        assert!(report.contains(expect), "{report}");
        assert!(report.contains("thread (5, 0, 0)"), "{report}");
        assert!(report.contains("ld.v4.b32"), "{report}");
        assert!(report.contains("line 19"), "{report}");
    }
    // A range another device may not touch.
    let (mut sim, space) = sim(2);
    let buf = Buffer::new(&space, 64, "buf");
    space.set_devices(buf.addr(), 512, 1 << 3);
    launch(&mut sim, &m, "k", 1, 32, &[buf.addr(), 0]);
    match sim.run(1 << 20) {
        RunOutcome::Fault(_, r) => assert!(r.contains("may not access"), "{r}"),
        other => panic!("expected a fault, got {other:?}"),
    }
}

/// The trace hash of the grid-barrier kernel and an atomic counter run with `seed`.
fn trace(seed: u64) -> (u64, u64) {
    let m = module(&grid_barrier());
    let space = Arc::new(AddressSpace::new());
    let config = SimConfig {
        seed,
        sms: 8,
        ..SimConfig::default()
    };
    let mut sim = Simulator::new(config, space.clone());
    let counter = Buffer::new(&space, 1, "counter");
    launch(&mut sim, &m, "gb", 4, 256, &[counter.addr()]);
    launch(&mut sim, &m, "gb", 4, 64, &[counter.addr() + 4]);
    run_to_end(&mut sim).unwrap_or_else(|e| panic!("{e}"));
    (sim.trace_hash(), sim.instructions())
}

#[test]
fn the_same_seed_replays_the_same_execution() {
    let a = trace(42);
    assert_eq!(a, trace(42));
    let others: Vec<_> = (43..47).map(trace).collect();
    assert!(
        others.iter().any(|o| o.0 != a.0),
        "seeds change the schedule"
    );
}

/// Reader: every thread loads `data[tid]` (plain) into `out[tid]`, then (after a barrier)
/// thread 0 sets the flag with `flag_store`. Writer: thread 0 waits for the flag with
/// `flag_load`, then (after a barrier) every thread overwrites `data[tid]` (plain): a store
/// that must come after the other grid's loads.
fn overwrite_after_read(flag_store: &str, flag_load: &str) -> String {
    let reader = kernel(
        "reader",
        ".param .u64 .ptr .align 1 reader_param_0, .param .u64 .ptr .align 1 reader_param_1, .param .u64 .ptr .align 1 reader_param_2",
        &format!(
            "
	ld.param.b64 	%rd1, [reader_param_0];
	ld.param.b64 	%rd2, [reader_param_1];
	ld.param.b64 	%rd5, [reader_param_2];
	mov.u32 	%r1, %tid.x;
	mul.wide.u32 	%rd3, %r1, 4;
	add.s64 	%rd4, %rd1, %rd3;
	ld.b32 	%r2, [%rd4];
	add.s64 	%rd6, %rd5, %rd3;
	st.b32 	[%rd6], %r2;
	barrier.sync 	0;
	setp.ne.b32 	%p1, %r1, 0;
	@%p1 bra 	$L__done;
	mov.b32 	%r3, 1;
	{flag_store} 	[%rd2], %r3;
$L__done:
"
        ),
    );
    let writer = kernel(
        "writer",
        ".param .u64 .ptr .align 1 writer_param_0, .param .u64 .ptr .align 1 writer_param_1",
        &format!(
            "
	ld.param.b64 	%rd1, [writer_param_0];
	ld.param.b64 	%rd2, [writer_param_1];
	mov.u32 	%r1, %tid.x;
	setp.ne.b32 	%p1, %r1, 0;
	@%p1 bra 	$L__wait;
$L__spin:
	{flag_load} 	%r4, [%rd2];
	setp.ne.b32 	%p2, %r4, 0;
	@%p2 bra 	$L__wait;
	nanosleep.u32 	100;
	bra.uni 	$L__spin;
$L__wait:
	barrier.sync 	0;
	mul.wide.u32 	%rd3, %r1, 4;
	add.s64 	%rd4, %rd1, %rd3;
	mov.b32 	%r2, 7;
	st.b32 	[%rd4], %r2;
"
        ),
    );
    let body = writer.split_once(".address_size 64\n").expect("header").1;
    format!("{reader}{body}")
}

/// Run [`overwrite_after_read`] under weak memory with race reports.
fn try_overwrite_after_read(text: &str, seed: u64) -> Result<(), String> {
    let config = SimConfig {
        seed,
        weak_memory: true,
        ..SimConfig::default()
    };
    run_pair(text, config, ("writer", false), ("reader", true)).map(drop)
}

#[test]
fn a_store_not_ordered_after_another_threads_load_is_reported_as_a_race() {
    let relaxed = overwrite_after_read("st.relaxed.sys.u32", "ld.relaxed.sys.u32");
    for seed in 0..4 {
        let report = try_overwrite_after_read(&relaxed, seed)
            .expect_err("the racy program ran without a report");
        assert!(
            report.starts_with("data race: a plain store of 4 bytes")
                && report.contains("plain load of it by kernel reader")
                && report.contains("kernel writer"),
            "seed {seed}: {report}"
        );
    }
    let ordered = overwrite_after_read("st.release.sys.u32", "ld.acquire.sys.u32");
    for seed in 0..8 {
        assert_eq!(
            try_overwrite_after_read(&ordered, seed),
            Ok(()),
            "seed {seed}"
        );
    }
}

/// 128 threads each load a word of `src` and store it to `dst`, once.
fn copy_once() -> String {
    kernel(
        "copy",
        ".param .u64 .ptr .align 1 copy_param_0, .param .u64 .ptr .align 1 copy_param_1",
        "
	ld.param.b64 	%rd1, [copy_param_0];
	ld.param.b64 	%rd2, [copy_param_1];
	mov.u32 	%r1, %tid.x;
	mul.wide.u32 	%rd3, %r1, 8;
	add.s64 	%rd4, %rd1, %rd3;
	ld.relaxed.sys.b64 	%rd5, [%rd4];
	add.s64 	%rd6, %rd2, %rd3;
	st.b64 	[%rd6], %rd5;
",
    )
}

/// Run [`copy_once`] from a source in host memory (`host`) or not; the virtual time it took
/// and the host reads counted.
fn copy_time(config: &SimConfig, host: bool) -> (u64, u64) {
    let m = module(&copy_once());
    let space = Arc::new(AddressSpace::new());
    let mut sim = Simulator::new(config.clone(), space.clone());
    let mut src = vec![0u64; 128].into_boxed_slice();
    for (i, w) in src.iter_mut().enumerate() {
        *w = i as u64 * 3;
    }
    let (base, len) = (src.as_ptr() as u64, 128 * 8);
    if host {
        space.map_host(base, len, "pinned source", u64::MAX);
    } else {
        space.map(base, len, "device source", u64::MAX);
    }
    let dst = Buffer::new(&space, 128, "dst");
    launch(&mut sim, &m, "copy", 1, 128, &[base, dst.addr()]);
    run_to_end(&mut sim).unwrap();
    assert!((0..128).all(|i| dst.get(i) == i as u64 * 3));
    (sim.now_ns(), sim.stats().host_reads)
}

/// Loads from pinned host memory are counted; with `host_read_ns` each waits for a PCIe
/// round trip, and with `host_read_gap_ns` the reads of many threads queue on the link, so
/// that a kernel doing many of them takes as long as it would on a GPU.
#[test]
fn host_memory_reads_cost_a_round_trip_and_queue_on_the_link() {
    let free = SimConfig::default();
    let (device_time, device_reads) = copy_time(&free, false);
    assert_eq!(device_reads, 0);
    let (host_time, host_reads) = copy_time(&free, true);
    assert_eq!(host_reads, 128);
    assert_eq!(host_time, device_time, "free by default");
    let costly = SimConfig {
        host_read_ns: 1000,
        host_read_gap_ns: 10,
        ..SimConfig::default()
    };
    let (time, reads) = copy_time(&costly, true);
    assert_eq!(reads, 128);
    // The last of 128 reads leaves the link after 128 gaps, then takes the round trip.
    assert!(time >= 128 * 10 + 1000, "{time} ns");
    assert!(time < 128 * 10 + 1000 + 1000, "{time} ns");
    assert_eq!(
        copy_time(&costly, false).0,
        device_time,
        "device memory stays free"
    );
}
