//! Raw interpreter speed: an arithmetic loop and a memory loop, printed. A benchmark, not a
//! test: `cargo bench -p symm-sim --bench speed`.

#[path = "../tests/common/mod.rs"]
mod common;

use std::time::Instant;

use common::*;

fn measure(body: &str, threads: u32, name: &str) {
    let text = kernel(
        "k",
        ".param .u64 .ptr .align 1 k_param_0",
        &format!("\tld.param.b64 \t%rd1, [k_param_0];\n{body}"),
    );
    let m = module(&text);
    let (mut sim, space) = sim(1);
    let out = Buffer::new(&space, 4096, "out");
    launch(&mut sim, &m, "k", 1, threads, &[out.addr()]);
    let start = Instant::now();
    run_to_end(&mut sim).unwrap_or_else(|e| panic!("{e}"));
    let s = start.elapsed().as_secs_f64();
    let stats = sim.stats();
    eprintln!(
        "{name}: {} instructions, {} slices in {s:.3} s: {:.1} M instructions/s",
        stats.instructions,
        stats.slices,
        stats.instructions as f64 / s / 1e6
    );
}

fn main() {
    // 8 instructions per iteration, no memory.
    measure(
        "
	mov.b32 	%r1, 0;
	mov.b64 	%rd2, 1;
$L__loop:
	add.s32 	%r1, %r1, 1;
	mul.lo.s64 	%rd2, %rd2, 3;
	xor.b64 	%rd3, %rd2, %rd1;
	shr.u64 	%rd4, %rd3, 7;
	add.s64 	%rd2, %rd2, %rd4;
	setp.lt.u32 	%p1, %r1, 1000000;
	@%p1 bra 	$L__loop;
	st.b64 	[%rd1], %rd2;
",
        1,
        "arithmetic",
    );
    // Loads and stores over a 32 KiB buffer, 64 threads.
    measure(
        "
	mov.u32 	%r2, %tid.x;
	mov.b32 	%r1, 0;
$L__loop:
	add.s32 	%r3, %r1, %r2;
	and.b32 	%r4, %r3, 4095;
	mul.wide.u32 	%rd5, %r4, 8;
	add.s64 	%rd6, %rd1, %rd5;
	ld.b64 	%rd7, [%rd6];
	add.s64 	%rd8, %rd7, 1;
	st.b64 	[%rd6], %rd8;
	add.s32 	%r1, %r1, 1;
	setp.lt.u32 	%p1, %r1, 20000;
	@%p1 bra 	$L__loop;
",
        64,
        "memory",
    );
}
