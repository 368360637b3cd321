//! Each instruction family against values computed by hand (PTX ISA semantics).

mod common;

use common::*;
use symm_sim::Module;

/// Run `body` as a one-thread kernel whose parameter `%rd1` points at 64 zeroed words;
/// returns the words.
fn run1(body: &str) -> Vec<u64> {
    let text = kernel(
        "k",
        ".param .u64 .ptr .align 1 k_param_0",
        &format!("\tld.param.b64 \t%rd1, [k_param_0];\n{body}"),
    );
    let m = module(&text);
    let (mut sim, space) = sim(1);
    let out = Buffer::new(&space, 64, "out");
    launch(&mut sim, &m, "k", 1, 1, &[out.addr()]);
    run_to_end(&mut sim).unwrap_or_else(|e| panic!("{e}"));
    (0..64).map(|i| out.get(i)).collect()
}

#[test]
fn integer_carry_chains_and_multiplies() {
    let v = run1(
        "
	mov.b64 	%rd2, -1;
	add.cc.s64 	%rd3, %rd2, 1;
	addc.cc.s64 	%rd4, 5, 0;
	st.b64 	[%rd1], %rd3;
	st.b64 	[%rd1+8], %rd4;
	sub.cc.s64 	%rd5, 0, 1;
	subc.cc.s64 	%rd6, 6, 0;
	st.b64 	[%rd1+16], %rd5;
	st.b64 	[%rd1+24], %rd6;
	mul.hi.u64 	%rd7, %rd2, 2;
	st.b64 	[%rd1+32], %rd7;
	mov.b32 	%r1, -1;
	mul.wide.u32 	%rd8, %r1, %r1;
	st.b64 	[%rd1+40], %rd8;
	mul.lo.s32 	%r2, %r1, 3;
	st.b32 	[%rd1+48], %r2;
	mad.lo.s64 	%rd9, 3, 4, 5;
	st.b64 	[%rd1+56], %rd9;
	add.cc.s64 	%rd10, 1, 1;
	addc.cc.s64 	%rd11, 0, 0;
	st.b64 	[%rd1+64], %rd11;
	sub.cc.s64 	%rd12, 5, 3;
	subc.cc.s64 	%rd13, 0, 0;
	st.b64 	[%rd1+72], %rd13;
",
    );
    assert_eq!(v[0], 0);
    assert_eq!(v[1], 6, "carry propagates");
    assert_eq!(v[2], u64::MAX);
    assert_eq!(v[3], 5, "borrow propagates");
    assert_eq!(v[4], 1, "mul.hi.u64");
    assert_eq!(v[5], 0xFFFF_FFFE_0000_0001, "mul.wide.u32");
    assert_eq!(v[6], 0xFFFF_FFFD, "mul.lo.s32 of -1 * 3");
    assert_eq!(v[7], 17);
    assert_eq!(v[8], 0, "no carry");
    assert_eq!(v[9], 0, "no borrow");
}

#[test]
fn division_remainder_and_bit_fields() {
    let v = run1(
        "
	div.s64 	%rd2, -7, 2;
	st.b64 	[%rd1], %rd2;
	mov.b64 	%rd20, -7;
	mov.b64 	%rd21, 2;
	div.u64 	%rd3, %rd20, %rd21;
	st.b64 	[%rd1+8], %rd3;
	rem.u32 	%r1, 7, 3;
	st.b32 	[%rd1+16], %r1;
	div.u32 	%r2, 65536, 7;
	st.b32 	[%rd1+24], %r2;
	rem.u64 	%rd4, %rd20, 10;
	st.b64 	[%rd1+32], %rd4;
	bfe.u32 	%r3, 305419896, 8, 8;
	st.b32 	[%rd1+40], %r3;
	bfe.s64 	%rd5, 128, 4, 4;
	st.b64 	[%rd1+48], %rd5;
	bfe.u32 	%r4, -1, 28, 8;
	st.b32 	[%rd1+56], %r4;
	bfe.s64 	%rd6, -1, 3, 0;
	st.b64 	[%rd1+64], %rd6;
	shf.l.wrap.b32 	%r5, -2147483648, 1, 1;
	st.b32 	[%rd1+72], %r5;
	shf.l.wrap.b32 	%r6, 1, 2, 33;
	st.b32 	[%rd1+80], %r6;
	clz.b32 	%r7, 1;
	st.b32 	[%rd1+88], %r7;
	mov.b64 	%rd7, 0;
	clz.b64 	%r8, %rd7;
	st.b32 	[%rd1+96], %r8;
	shl.b32 	%r9, 1, 40;
	st.b32 	[%rd1+104], %r9;
	shr.s64 	%rd8, -8, 100;
	st.b64 	[%rd1+112], %rd8;
	shr.u64 	%rd9, -8, 64;
	st.b64 	[%rd1+120], %rd9;
	mov.b16 	%rs1, -32768;
	shr.u16 	%rs2, %rs1, 15;
	st.b16 	[%rd1+128], %rs2;
	not.b64 	%rd10, 0;
	st.b64 	[%rd1+136], %rd10;
	xor.b32 	%r10, 12, 10;
	st.b32 	[%rd1+144], %r10;
	neg.s32 	%r11, 5;
	st.b32 	[%rd1+152], %r11;
	min.s64 	%rd11, -1, 1;
	st.b64 	[%rd1+160], %rd11;
	min.u64 	%rd12, -1, 1;
	st.b64 	[%rd1+168], %rd12;
	max.u32 	%r12, -1, 1;
	st.b32 	[%rd1+176], %r12;
	max.s64 	%rd13, -1, 1;
	st.b64 	[%rd1+184], %rd13;
",
    );
    assert_eq!(v[0], (-3i64) as u64, "signed division truncates");
    assert_eq!(v[1], (u64::MAX - 6) / 2);
    assert_eq!(v[2], 1);
    assert_eq!(v[3], 65536 / 7);
    assert_eq!(v[4], (u64::MAX - 6) % 10);
    assert_eq!(v[5], 0x56, "bfe.u32");
    assert_eq!(v[6], (-8i64) as u64, "bfe.s64 sign-extends the field");
    assert_eq!(v[7], 0xF, "bfe past the msb");
    assert_eq!(v[8], 0, "bfe of length 0");
    assert_eq!(v[9], 3, "shf.l.wrap");
    assert_eq!(v[10], 4, "shf.l.wrap takes the amount mod 32");
    assert_eq!(v[11], 31);
    assert_eq!(v[12], 64);
    assert_eq!(v[13], 0, "shl by ≥ width");
    assert_eq!(v[14], u64::MAX, "shr.s by ≥ width keeps the sign");
    assert_eq!(v[15], 0, "shr.u by ≥ width");
    assert_eq!(v[16], 1);
    assert_eq!(v[17], u64::MAX);
    assert_eq!(v[18], 6);
    assert_eq!(v[19], (-5i32) as u32 as u64);
    assert_eq!(v[20], u64::MAX);
    assert_eq!(v[21], 1);
    assert_eq!(v[22], u32::MAX as u64);
    assert_eq!(v[23], 1);
}

#[test]
fn conversions_floats_and_comparisons() {
    let v = run1(
        "
	mov.b16 	%rs1, 255;
	cvt.s64.s8 	%rd2, %rs1;
	st.b64 	[%rd1], %rd2;
	mov.b32 	%r1, 74565;
	cvt.u16.u32 	%rs2, %r1;
	st.b16 	[%rd1+8], %rs2;
	mov.b32 	%r2, 16777217;
	cvt.rn.f32.u32 	%r3, %r2;
	st.b32 	[%rd1+16], %r3;
	min.f32 	%r4, 0f7FC00000, 0f3F800000;
	st.b32 	[%rd1+24], %r4;
	max.f32 	%r5, 0f7FC00001, 0f7FC00000;
	st.b32 	[%rd1+32], %r5;
	setp.nan.f32 	%p1, 0f7FC00000, 0f3F800000;
	selp.b32 	%r6, 1, 0, %p1;
	st.b32 	[%rd1+40], %r6;
	setp.ltu.f32 	%p2, 0f7FC00000, 0f3F800000;
	selp.b32 	%r7, 1, 0, %p2;
	st.b32 	[%rd1+48], %r7;
	setp.lt.f32 	%p3, 0f7FC00000, 0f3F800000;
	selp.b32 	%r8, 1, 2, %p3;
	st.b32 	[%rd1+56], %r8;
	neg.f32 	%r9, 0f3F800000;
	st.b32 	[%rd1+64], %r9;
	add.rn.f64 	%rd3, 0d3FF0000000000000, 0d3FF0000000000000;
	st.b64 	[%rd1+72], %rd3;
	div.rn.f32 	%r10, 0f3F800000, 0f40400000;
	st.b32 	[%rd1+80], %r10;
	mul.rn.f32 	%r11, 0f7F800000, 0f00000000;
	st.b32 	[%rd1+88], %r11;
	cvt.rn.f64.u32 	%rd4, %r2;
	st.b64 	[%rd1+96], %rd4;
	mov.b16 	%rs3, -1;
	setp.gt.s16 	%p4, %rs3, 0;
	selp.b32 	%r12, 1, 0, %p4;
	st.b32 	[%rd1+104], %r12;
	setp.gt.u32 	%p5, %r1, 7;
	setp.eq.b64 	%p6, %rd2, -1;
	and.pred 	%p7, %p5, %p6;
	not.pred 	%p8, %p7;
	selp.b64 	%rd5, 7, 9, %p8;
	st.b64 	[%rd1+112], %rd5;
	mov.b64 	%rd6, 1234605616436508552;
	mov.b64 	{%r13, %r14}, %rd6;
	st.b32 	[%rd1+120], %r13;
	mov.b64 	%rd7, {%r14, %r13};
	st.b64 	[%rd1+128], %rd7;
	mov.b64 	{_, %r15}, %rd6;
	st.b32 	[%rd1+136], %r15;
	{ .reg .b32 tmp; mov.b64 {tmp, %r16}, %rd6; }
	st.b32 	[%rd1+144], %r16;
	min.f32 	%r17, 0f00000000, 0f80000000;
	st.b32 	[%rd1+152], %r17;
	max.f64 	%rd8, 0d7FF8000000000000, 0d4000000000000000;
	st.b64 	[%rd1+160], %rd8;
	cvt.u32.u64 	%r18, %rd6;
	st.b32 	[%rd1+168], %r18;
	cvt.s64.s32 	%rd9, %r11;
	cvt.s64.s32 	%rd10, %r9;
	st.b64 	[%rd1+176], %rd10;
	cvt.u64.u16 	%rd11, %rs3;
	st.b64 	[%rd1+184], %rd11;
	setp.ne.b16 	%p9, %rs3, -1;
	selp.b16 	%rs4, 3, 4, %p9;
	st.b16 	[%rd1+192], %rs4;
	@!%p9 bra 	$L__skip;
	st.b32 	[%rd1+200], 1;
$L__skip:
	@%p9 st.b32 	[%rd1+208], 1;
	@!%p9 st.b32 	[%rd1+216], 1;
",
    );
    assert_eq!(v[0], u64::MAX, "cvt.s64.s8 sign-extends");
    assert_eq!(v[1], 0x2345, "cvt.u16.u32 truncates");
    assert_eq!(v[2], 0x4B80_0000, "cvt.rn.f32.u32 rounds to nearest even");
    assert_eq!(v[3], 0x3F80_0000, "min with one NaN is the number");
    assert_eq!(v[4], 0x7FFF_FFFF, "max of NaNs is the canonical NaN");
    assert_eq!(v[5], 1);
    assert_eq!(v[6], 1, "unordered compare is true on NaN");
    assert_eq!(v[7], 2, "ordered compare is false on NaN");
    assert_eq!(v[8], 0xBF80_0000);
    assert_eq!(v[9], 2.0f64.to_bits());
    assert_eq!(v[10], (1.0f32 / 3.0).to_bits() as u64);
    assert_eq!(v[11], 0x7FFF_FFFF, "inf * 0 is the canonical NaN");
    assert_eq!(v[12], 16777217f64.to_bits());
    assert_eq!(v[13], 0, "setp.gt.s16 of -1");
    assert_eq!(v[14], 9);
    assert_eq!(v[15], 0x5566_7788, "unpack: first element is the low half");
    assert_eq!(v[16], 0x5566_7788_1122_3344);
    assert_eq!(v[17], 0x1122_3344, "sink");
    assert_eq!(v[18], 0x1122_3344, "scoped tmp register");
    assert_eq!(v[19], 0x8000_0000, "min(+0, -0) is -0");
    assert_eq!(v[20], 2.0f64.to_bits());
    assert_eq!(v[21], 0x5566_7788);
    assert_eq!(v[22], 0xFFFF_FFFF_BF80_0000, "cvt.s64.s32 sign-extends");
    assert_eq!(v[23], 0xFFFF);
    assert_eq!(v[24], 4);
    assert_eq!(v[25], 0, "@!p bra taken on a false p");
    assert_eq!(v[26], 0);
    assert_eq!(v[27], 1);
}

#[test]
fn vectors_and_signed_loads() {
    let v = run1(
        "
	mov.b32 	%r1, 1;
	mov.b32 	%r2, 2;
	mov.b32 	%r3, 3;
	mov.b32 	%r4, -4;
	st.v4.b32 	[%rd1], {%r1, %r2, %r3, %r4};
	ld.v4.b32 	{%r5, %r6, %r7, %r8}, [%rd1];
	add.s32 	%r9, %r5, %r8;
	st.b32 	[%rd1+16], %r9;
	ld.v2.b64 	{%rd2, %rd3}, [%rd1];
	st.v2.b64 	[%rd1+32], {%rd3, %rd2};
	ld.s8 	%rs1, [%rd1+12];
	cvt.s64.s8 	%rd4, %rs1;
	st.b64 	[%rd1+48], %rd4;
	ld.s32 	%rd5, [%rd1+12];
	st.b64 	[%rd1+56], %rd5;
	ld.b8 	%rs2, [%rd1+12];
	st.b8 	[%rd1+64], %rs2;
	ld.v2.b32 	{%r10, %r11}, [%rd1+8];
	st.relaxed.sys.v2.b64 	[%rd1+80], {%rd2, %rd3};
	ld.relaxed.sys.v2.b64 	{%rd6, %rd7}, [%rd1+80];
	st.b64 	[%rd1+96], %rd7;
	st.b32 	[%rd1+104], %r11;
	ld.volatile.b32 	%r12, [%rd1];
	st.volatile.b32 	[%rd1+112], %r12;
	ld.acquire.sys.u32 	%r13, [%rd1+4];
	st.release.sys.u32 	[%rd1+120], %r13;
	ld.global.b64 	%rd8, [%rd1+32];
	st.global.b32 	[%rd1+128], 7;
",
    );
    assert_eq!(v[0], 2 << 32 | 1);
    assert_eq!(v[1], (0xFFFF_FFFCu64) << 32 | 3);
    assert_eq!(v[2], 0xFFFF_FFFD);
    assert_eq!(v[4], v[1]);
    assert_eq!(v[5], v[0]);
    assert_eq!(v[6], (-4i64) as u64, "ld.s8 sign-extends");
    assert_eq!(
        v[7],
        (-4i64) as u64,
        "ld.s32 into a 64-bit register sign-extends"
    );
    assert_eq!(v[8], 0xFC);
    assert_eq!(v[10], v[0]);
    assert_eq!(v[11], v[1]);
    assert_eq!(v[12], v[1]);
    assert_eq!(v[13], 0xFFFF_FFFC);
    assert_eq!(v[14], 1);
    assert_eq!(v[15], 2);
    assert_eq!(v[16], 7);
}

#[test]
fn atomics_count_every_thread() {
    let text = kernel(
        "k",
        ".param .u64 .ptr .align 1 k_param_0",
        "
	ld.param.b64 	%rd1, [k_param_0];
	atom.relaxed.gpu.add.u32 	%r1, [%rd1], 1;
	mov.u32 	%r2, %tid.x;
	mul.wide.u32 	%rd2, %r2, 4;
	add.s64 	%rd3, %rd1, %rd2;
	st.b32 	[%rd3+16], %r1;
$L__retry:
	ld.volatile.b32 	%r3, [%rd1+8];
	add.s32 	%r4, %r3, 2;
	atom.release.sys.cas.b32 	%r5, [%rd1+8], %r3, %r4;
	setp.ne.b32 	%p1, %r5, %r3;
	@%p1 bra 	$L__retry;
	atom.relaxed.gpu.exch.b32 	%r6, [%rd1+12], %r2;
",
    );
    let m = module(&text);
    for seed in 0..4 {
        let (mut sim, space) = sim(seed);
        let out = Buffer::new(&space, 64, "out");
        launch(&mut sim, &m, "k", 1, 96, &[out.addr()]);
        run_to_end(&mut sim).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(out.get32(0), 96, "atom.add");
        assert_eq!(out.get32(2), 192, "cas loop");
        assert!(out.get32(3) < 96, "exch");
        let mut seen: Vec<u32> = (0..96).map(|i| out.get32(4 + i)).collect();
        seen.sort();
        assert_eq!(seen, (0..96).collect::<Vec<u32>>(), "each old value once");
    }
}

#[test]
fn call_and_return_copy_parameters() {
    let text = ".version 7.8\n.target sm_90\n.address_size 64\n\
.func  (.param .b32 func_retval0) f\n(\n\t.param .b64 f_param_0,\n\t.param .b32 f_param_1\n)\n;\n\
.visible .entry k(\n\t.param .u64 .ptr .align 1 k_param_0\n)\n{\n\
\t.reg .b32 \t%r<8>;\n\t.reg .b64 \t%rd<8>;\n\
\tld.param.b64 \t%rd1, [k_param_0];\n\tmov.b32 \t%r1, 40;\n\
\t{ // callseq 0, 0\n\t.param .b64 \tparam0;\n\t.param .b32 \tparam1;\n\t.param .b32 \tretval0;\n\
\tst.param.b64 \t[param0], %rd1;\n\tst.param.b32 \t[param1], %r1;\n\
\tcall.uni (retval0), f, (param0, param1);\n\tld.param.b32 \t%r2, [retval0];\n\t} // callseq 0\n\
\tst.b32 \t[%rd1+8], %r2;\n\tret;\n}\n\
.func  (.param .b32 func_retval0) f(\n\t.param .b64 f_param_0,\n\t.param .b32 f_param_1\n)\n{\n\
\t.reg .b32 \t%r<4>;\n\t.reg .b64 \t%rd<4>;\n\
\tld.param.b64 \t%rd1, [f_param_0];\n\tld.param.b32 \t%r1, [f_param_1];\n\
\tadd.s32 \t%r2, %r1, 2;\n\tst.b32 \t[%rd1], %r2;\n\tst.param.b32 \t[func_retval0], %r2;\n\tret;\n}\n";
    let m = module(text);
    let (mut sim, space) = sim(3);
    let out = Buffer::new(&space, 4, "out");
    launch(&mut sim, &m, "k", 1, 1, &[out.addr()]);
    run_to_end(&mut sim).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(out.get32(0), 42, "callee saw its arguments");
    assert_eq!(out.get32(2), 42, "caller got the return value");
}

#[test]
fn barrier_red_or_returns_the_or_over_the_block() {
    let text = kernel(
        "k",
        ".param .u64 .ptr .align 1 k_param_0",
        "
	ld.param.b64 	%rd1, [k_param_0];
	mov.u32 	%r1, %tid.x;
	setp.eq.b32 	%p1, %r1, 37;
	barrier.red.or.pred 	%p2, 0, %p1;
	selp.u32 	%r2, 1, 0, %p2;
	setp.eq.b32 	%p3, %r1, 1000;
	barrier.red.or.pred 	%p4, 0, %p3;
	selp.u32 	%r3, 2, 0, %p4;
	add.s32 	%r4, %r2, %r3;
	mul.wide.u32 	%rd2, %r1, 4;
	add.s64 	%rd3, %rd1, %rd2;
	st.b32 	[%rd3], %r4;
	barrier.sync 	0;
	ld.b32 	%r5, [%rd1+4];
	st.b32 	[%rd3+512], %r5;
",
    );
    let m = module(&text);
    let (mut sim, space) = sim(5);
    let out = Buffer::new(&space, 128, "out");
    launch(&mut sim, &m, "k", 1, 64, &[out.addr()]);
    run_to_end(&mut sim).unwrap_or_else(|e| panic!("{e}"));
    for i in 0..64 {
        assert_eq!(out.get32(i), 1, "thread {i}");
        assert_eq!(out.get32(128 + i), 1, "barrier.sync orders the stores");
    }
}

#[test]
fn unsupported_instructions_are_rejected_naming_the_line() {
    let text = kernel("k", "", "\tprmt.b32 \t%r1, %r2, %r3, 0;");
    let e = symm_sim::Module::load(&text).unwrap_err();
    assert!(
        e.message.contains("line 12") && e.message.contains("prmt"),
        "{e}"
    );
    let text = kernel("k", "", "\tadd.sat.s32 \t%r1, %r2, %r3;");
    let e = symm_sim::Module::load(&text).unwrap_err();
    assert!(e.message.contains("sat"), "{e}");
    let text = kernel("k", "", "\tld.shared.b32 \t%r1, [%rd2];");
    assert!(symm_sim::Module::load(&text).is_err());
}

#[test]
fn module_variables_are_initialized_addressable_and_mapped_by_the_loader() {
    // Tables as LLVM emits them for `match` lookups: byte arrays, read through `mov` of the
    // name and `ld.global.nc`, and a direct `[name+offset]` address.
    let text = format!(
        ".version 7.8\n.target sm_90\n.address_size 64\n\
         .global .align 4 .b8 anon_$_t_$_0[12] = {{7, 0, 0, 0, 8, 0, 0, 0, 9}};\n\
         .global .align 8 .u64 wide[2] = {{1, -2}};\n\
         .global .align 4 .b32 zeroed[3];\n{}",
        kernel(
            "k",
            ".param .u64 .ptr .align 1 k_param_0",
            "\tld.param.b64 \t%rd1, [k_param_0];\n\
             \tmov.b64 \t%rd2, anon_$_t_$_0;\n\
             \tld.global.nc.b32 \t%r1, [%rd2+8];\n\
             \tst.b64 \t[%rd1], %r1;\n\
             \tld.global.b64 \t%rd3, [wide+8];\n\
             \tst.b64 \t[%rd1+8], %rd3;\n\
             \tmov.b64 \t%rd4, zeroed;\n\
             \tst.global.b32 \t[%rd4+4], 5;\n\
             \tld.global.b32 \t%r2, [%rd4+4];\n\
             \tst.b64 \t[%rd1+16], %r2;\n\
             \tand.b64 \t%rd5, %rd2, 3;\n\
             \tst.b64 \t[%rd1+24], %rd5;",
        )
    );
    let m = module(&text);
    let globals: Vec<(String, u64, u64)> =
        m.globals().map(|(n, a, s)| (n.to_string(), a, s)).collect();
    assert_eq!(
        globals
            .iter()
            .map(|g| (g.0.as_str(), g.2))
            .collect::<Vec<_>>(),
        [("anon_$_t_$_0", 12), ("wide", 16), ("zeroed", 12)]
    );
    assert_eq!(globals[1].1 % 8, 0, "declared alignment");
    let (mut simulator, space) = sim(1);
    for (name, address, size) in &globals {
        space.map(*address, *size, name, u64::MAX);
    }
    let out = Buffer::new(&space, 4, "out");
    launch(&mut simulator, &m, "k", 1, 1, &[out.addr()]);
    run_to_end(&mut simulator).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(out.get(0) as u32, 9, "third word of the byte table");
    assert_eq!(
        out.get(1),
        (-2i64) as u64,
        "signed initializer, direct address"
    );
    assert_eq!(
        out.get(2) as u32,
        5,
        "zero-initialized variables are writable"
    );
    assert_eq!(out.get(3), 0, "aligned as declared");

    // Without the loader's mapping, the access is a fault naming the address.
    let (mut simulator, space) = sim(1);
    let out = Buffer::new(&space, 4, "out");
    launch(&mut simulator, &m, "k", 1, 1, &[out.addr()]);
    assert!(
        run_to_end(&mut simulator).is_err(),
        "unmapped module variable must fault"
    );
}

#[test]
fn an_extern_function_resolves_against_a_later_module_text() {
    // What a run-time link makes: a kernel that declares a function, then the library text
    // that defines it (its own .version header again).
    let library = ".version 7.0\n.target sm_80\n.address_size 64\n\
        .visible .func (.param .b32 func_retval0) twice(.param .b64 twice_param_0)\n{\n\
        \t.reg .b32 %r<3>;\n\t.reg .b64 %rd<3>;\n\
        \tld.param.b64 %rd1, [twice_param_0];\n\tcvt.u32.u64 %r1, %rd1;\n\
        \tshl.b32 %r2, %r1, 1;\n\tst.param.b32 [func_retval0], %r2;\n\tret;\n}\n";
    let user = kernel(
        "k",
        ".param .u64 .ptr .align 1 k_param_0",
        "\tld.param.b64 \t%rd1, [k_param_0];\n\
         \t{\n\t.param .b64 param0;\n\tst.param.b64 [param0], 21;\n\
         \t.param .b32 retval0;\n\tcall.uni (retval0), twice, (param0);\n\
         \tld.param.b32 %r1, [retval0];\n\t}\n\
         \tst.b64 \t[%rd1], %r1;",
    )
    .replace(
        ".visible .entry",
        ".extern .func (.param .b32 func_retval0) twice(.param .b64 twice_param_0);\n\
         .visible .entry",
    );
    assert!(
        Module::load(&user).is_err(),
        "a declared function with no definition is refused"
    );
    let m = module(&format!("{user}\n{library}"));
    let (mut sim, space) = sim(1);
    let out = Buffer::new(&space, 1, "out");
    launch(&mut sim, &m, "k", 1, 1, &[out.addr()]);
    run_to_end(&mut sim).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(out.get(0) as u32, 42);
}

#[test]
fn local_memory_is_per_thread_and_reachable_through_generic_addresses() {
    // A frame as LLVM lays it out: `.local` depot, `%SPL` (local address) and `%SP` (generic),
    // stores through both and loads back, on 64 threads at once.
    let text = kernel(
        "k",
        ".param .u64 .ptr .align 1 k_param_0",
        "\t.local .align 8 .b8 \t__local_depot0[24];\n\
         \t.reg .b64 \t%SP;\n\t.reg .b64 \t%SPL;\n\
         \tld.param.b64 \t%rd1, [k_param_0];\n\
         \tmov.b64 \t%SPL, __local_depot0;\n\
         \tcvta.local.u64 \t%SP, %SPL;\n\
         \tmov.u32 \t%r1, %tid.x;\n\
         \tst.local.b32 \t[%SPL+8], %r1;\n\
         \tst.local.v2.b32 \t[%SPL+16], {%r1, 7};\n\
         \tbar.sync \t0;\n\
         \tld.b32 \t%r2, [%SP+8];\n\
         \tld.local.v2.b32 \t{%r3, %r4}, [%SPL+16];\n\
         \tadd.s32 \t%r5, %r2, %r3;\n\
         \tadd.s32 \t%r5, %r5, %r4;\n\
         \tmul.wide.u32 \t%rd2, %r1, 8;\n\
         \tadd.s64 \t%rd3, %rd1, %rd2;\n\
         \tst.b64 \t[%rd3], %r5;",
    );
    let m = module(&text);
    let (mut simulator, space) = sim(3);
    let out = Buffer::new(&space, 64, "out");
    launch(&mut simulator, &m, "k", 1, 64, &[out.addr()]);
    run_to_end(&mut simulator).unwrap_or_else(|e| panic!("{e}"));
    for t in 0..64u64 {
        assert_eq!(out.get(t as usize) as u32, (2 * t + 7) as u32, "thread {t}");
    }
}

#[test]
fn an_indexed_branch_takes_the_listed_target() {
    let text = kernel(
        "k",
        ".param .u64 .ptr .align 1 k_param_0",
        "\tld.param.b64 \t%rd1, [k_param_0];\n\
         \tmov.u32 \t%r1, %tid.x;\n\
         \t$L_brx_0: .branchtargets\n\t\t$L_a,\n\t\t$L_b,\n\t\t$L_c;\n\
         \tbrx.idx \t%r1, $L_brx_0;\n\
         $L_a:\n\tmov.b32 \t%r2, 10;\n\tbra.uni \t$L_end;\n\
         $L_b:\n\tmov.b32 \t%r2, 20;\n\tbra.uni \t$L_end;\n\
         $L_c:\n\tmov.b32 \t%r2, 30;\n\
         $L_end:\n\
         \tmul.wide.u32 \t%rd2, %r1, 8;\n\
         \tadd.s64 \t%rd3, %rd1, %rd2;\n\
         \tst.b64 \t[%rd3], %r2;",
    );
    let m = module(&text);
    let (mut simulator, space) = sim(1);
    let out = Buffer::new(&space, 3, "out");
    launch(&mut simulator, &m, "k", 1, 3, &[out.addr()]);
    run_to_end(&mut simulator).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!([out.get(0), out.get(1), out.get(2)], [10, 20, 30]);
}

/// The 16-bit arithmetic and compares and the 32-bit multiply-add of the all-to-all-v kernel's
/// sm_80 PTX: results wrap at their width, compares are unsigned at 16 bits.
#[test]
fn sixteen_bit_add_and_compare_and_mad_lo_s32() {
    let v = run1(
        "
	mov.b16 	%rs1, 32767;
	add.s16 	%rs2, %rs1, 2;
	st.b16 	[%rd1], %rs2;
	mov.b16 	%rs3, -1;
	setp.gt.u16 	%p1, %rs3, 1;
	selp.b32 	%r1, 1, 0, %p1;
	st.b32 	[%rd1+8], %r1;
	setp.gt.u16 	%p2, %rs1, %rs3;
	selp.b32 	%r2, 1, 0, %p2;
	st.b32 	[%rd1+16], %r2;
	mov.b32 	%r3, -2;
	mad.lo.s32 	%r4, %r3, 3, 10;
	st.b32 	[%rd1+24], %r4;
	mov.b32 	%r5, 65536;
	mad.lo.s32 	%r6, %r5, %r5, 7;
	st.b32 	[%rd1+32], %r6;
",
    );
    assert_eq!(v[0] & 0xFFFF, 0x8001, "add.s16 wraps at 16 bits");
    assert_eq!(v[1], 1, "0xFFFF > 1 unsigned");
    assert_eq!(v[2], 0, "0x7FFF > 0xFFFF is false unsigned");
    assert_eq!(v[3] & 0xFFFF_FFFF, 4, "-2 * 3 + 10");
    assert_eq!(v[4] & 0xFFFF_FFFF, 7, "the low 32 bits of 2^32 + 7");
}
