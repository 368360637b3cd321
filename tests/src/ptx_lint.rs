//! Static checks over the shipped PTX (`ptx-out/`, as libsymm embeds it), run by this crate's
//! tests:
//!
//! * **Instruction set**: every instruction of the sm_80 and sm_90 files is one the simulated
//!   GPU (`sim/`) executes ([`SIMULATED`]); sm_100a may add the cluster launch control
//!   instructions ([`SM100A_ONLY`]), which only hardware runs. A new instruction in a
//!   regenerated file fails here, naming it, before anything executes it unsimulated.
//! * **Spin loops**: every loop that sleeps (`nanosleep`) or reads `%globaltimer` (a bounded
//!   wait on another thread or rank) contains a strong load (`ld.acquire`, `ld.relaxed`,
//!   `ld.volatile`, an `atom`, an `mbarrier` wait, a block-wide vote `barrier.red`, or a call
//!   of a function that has one):
//!   a weak load there may be hoisted out of the loop, and the wait never sees the store.
//! * **Kernel parameters**: every `.entry` takes exactly the `.param` types the host passes
//!   when it launches it (`launched_param_types`, the cuda executor's).
//!
//! Pure text processing over the layout LLVM's NVPTX back end writes (see `symm_artifacts::split`).

use std::collections::{HashMap, HashSet};

/// The instructions (opcode with every modifier) the sm_80/sm_90 PTX may contain: those the
/// simulated GPU implements.
pub const SIMULATED: &[&str] = &[
    "add.cc.s64",
    "add.rn.f32",
    "add.rn.f64",
    "add.s16",
    "add.s32",
    "add.s64",
    "addc.cc.s64",
    "and.b16",
    "and.b32",
    "and.b64",
    "and.pred",
    "atom.relaxed.gpu.add.u32",
    "atom.relaxed.gpu.exch.b32",
    "atom.release.sys.cas.b32",
    "barrier.red.or.pred",
    "barrier.sync",
    "bfe.s64",
    "bfe.u32",
    "bfe.u64",
    "bra",
    "bra.uni",
    "call.uni",
    "clz.b32",
    "clz.b64",
    "cvt.f32.f16",
    "cvt.rn.f16.f32",
    "cvt.rn.f16x2.e4m3x2",
    "cvt.rn.f32.u32",
    "cvt.rn.f64.u32",
    "cvt.rn.satfinite.e4m3x2.f32",
    "cvt.s64.s32",
    "cvt.s64.s8",
    "cvt.u16.u32",
    "cvt.u16.u64",
    "cvt.u32.u16",
    "cvt.u32.u64",
    "cvt.u64.u16",
    "cvt.u64.u32",
    "cvta.global.u64",
    "cvta.to.global.u64",
    "div.rn.f32",
    "div.rn.f64",
    "div.s64",
    "div.u32",
    "div.u64",
    "exit",
    "ld.acquire.sys.u32",
    "ld.b16",
    "ld.b32",
    "ld.b64",
    "ld.b8",
    "ld.global.b32",
    "ld.global.b64",
    "ld.param.b32",
    "ld.param.b64",
    "ld.relaxed.sys.u32",
    "ld.relaxed.sys.v2.b64",
    "ld.s32",
    "ld.s8",
    "ld.v2.b32",
    "ld.v2.b64",
    "ld.v4.b32",
    "ld.volatile.b32",
    "ld.volatile.b64",
    "ld.volatile.global.b32",
    "mad.lo.s32",
    "mad.lo.s64",
    "max.f32",
    "max.f64",
    "max.s64",
    "max.u32",
    "max.u64",
    "min.f32",
    "min.f64",
    "min.s64",
    "min.u32",
    "min.u64",
    "mov.b16",
    "mov.b32",
    "mov.b64",
    "mov.pred",
    "mov.u32",
    "mov.u64",
    "mul.hi.u64",
    "mul.lo.s32",
    "mul.lo.s64",
    "mul.rn.f32",
    "mul.rn.f64",
    "mul.wide.u32",
    "nanosleep.u32",
    "neg.f32",
    "neg.s32",
    "not.b32",
    "not.b64",
    "not.pred",
    "or.b16",
    "or.b32",
    "or.b64",
    "or.pred",
    "rem.u32",
    "rem.u64",
    "ret",
    "selp.b16",
    "selp.b32",
    "selp.b64",
    "selp.f32",
    "selp.f64",
    "selp.u32",
    "setp.eq.b16",
    "setp.eq.b32",
    "setp.eq.b64",
    "setp.ge.u32",
    "setp.ge.u64",
    "setp.gt.s32",
    "setp.gt.s64",
    "setp.gt.u16",
    "setp.gt.u32",
    "setp.gt.u64",
    "setp.le.u32",
    "setp.le.u64",
    "setp.lt.s16",
    "setp.lt.s32",
    "setp.lt.s64",
    "setp.lt.u32",
    "setp.lt.u64",
    "setp.ne.b16",
    "setp.ne.b32",
    "setp.ne.b64",
    "setp.ne.u32",
    "setp.num.f32",
    "shf.l.wrap.b32",
    "shl.b16",
    "shl.b32",
    "shl.b64",
    "shr.s64",
    "shr.u16",
    "shr.u32",
    "shr.u64",
    "st.b16",
    "st.b32",
    "st.b64",
    "st.b8",
    "st.global.b32",
    "st.param.b32",
    "st.param.b64",
    "st.relaxed.sys.v2.b64",
    "st.release.sys.u32",
    "st.v2.b64",
    "st.v4.b32",
    "st.volatile.b32",
    "st.volatile.b64",
    "st.volatile.global.b32",
    "sub.cc.s64",
    "sub.s32",
    "sub.s64",
    "subc.cc.s64",
    "trap",
    "xor.b32",
    "xor.b64",
];

/// The instructions of [`SIMULATED`] that only sm_89 and newer have: the float8 e4m3
/// conversions (`numeric::small_float`), in sm_90 and not in sm_80.
pub const SM89_CONVERSIONS: &[&str] = &["cvt.rn.f16x2.e4m3x2", "cvt.rn.satfinite.e4m3x2.f32"];

/// What sm_100a may add to [`SIMULATED`]: cluster launch control and the instructions the
/// compiler picks for Blackwell (not simulated; hardware only).
pub const SM100A_ONLY: &[&str] = &[
    "add.rn.f32x2",
    "barrier.cluster.arrive.release.aligned",
    "barrier.cluster.wait.acquire.aligned",
    "clusterlaunchcontrol.query_cancel.get_first_ctaid.v4.b32.b128",
    "clusterlaunchcontrol.query_cancel.is_canceled.pred.b128",
    "clusterlaunchcontrol.try_cancel.async.shared::cta.mbarrier::complete_tx::bytes.b128",
    "clusterlaunchcontrol.try_cancel.async.shared::cta.mbarrier::complete_tx::bytes.multicast::cluster::all.b128",
    "fence.mbarrier_init.release.cluster",
    "fence.proxy.async::generic.acquire.sync_restrict::shared::cluster.cluster",
    "fence.proxy.async::generic.release.sync_restrict::shared::cta.cluster",
    "ld.shared.b128",
    "mad.wide.u32",
    "mbarrier.arrive.expect_tx.relaxed.cta.shared::cta.b64",
    "mbarrier.init.shared::cta.b64",
    "mbarrier.try_wait.parity.acquire.cta.shared::cta.b64",
    "mul.rn.f32x2",
];

/// One instruction of a function body.
#[derive(Debug)]
struct Instruction<'a> {
    /// 1-based line in the file.
    line: usize,
    /// Opcode with its modifiers (`ld.acquire.sys.u32`).
    opcode: &'a str,
    /// The whole statement, guard and operands included.
    text: &'a str,
}

/// A function of the file: its name, whether it is a kernel, its parameter types, its body.
#[derive(Debug, Default)]
struct Function<'a> {
    name: &'a str,
    entry: bool,
    line: usize,
    param_types: Vec<&'a str>,
    body: Vec<Instruction<'a>>,
    /// Label → index in `body` of the first instruction after it.
    labels: HashMap<&'a str, usize>,
}

/// The name a function header line declares (`.visible .entry name(`, `.func (.param …) name(`).
fn declared_name(header: &str) -> &str {
    let mut rest = header;
    for directive in [".visible", ".weak", ".extern", ".entry", ".func"] {
        rest = rest.trim_start();
        if let Some(after) = rest.strip_prefix(directive) {
            rest = after;
        }
    }
    let mut rest = rest.trim_start();
    if rest.starts_with('(') {
        // A return parameter list: `(.param .b32 func_retval0)`.
        rest = rest.find(')').map_or("", |i| &rest[i + 1..]).trim_start();
    }
    let end = rest
        .find(|c: char| c == '(' || c == ';' || c.is_whitespace())
        .unwrap_or(rest.len());
    &rest[..end]
}

/// The functions defined in `ptx`, with their bodies as instructions.
fn functions(ptx: &str) -> Vec<Function<'_>> {
    let mut out: Vec<Function<'_>> = Vec::new();
    let mut in_params = false;
    for (index, raw) in ptx.lines().enumerate() {
        let line = index + 1;
        let code = raw.split("//").next().unwrap_or("");
        let is_function = [".visible", ".weak", ".entry", ".func"]
            .iter()
            .any(|d| raw.starts_with(d));
        // A definition's header ends with its parameter list's `(`; a declaration's does not
        // (its parameters follow on their own lines, then `;`).
        if is_function && code.trim_end().ends_with('(') {
            out.push(Function {
                name: declared_name(code),
                entry: code.contains(".entry"),
                line,
                ..Function::default()
            });
            in_params = true;
            continue;
        }
        if is_function
            || [
                ".version",
                ".target",
                ".address_size",
                ".global",
                ".shared",
                ".extern",
            ]
            .iter()
            .any(|d| raw.starts_with(d))
        {
            // A top-level item that is not a definition ends the current function.
            out.push(Function::default());
            in_params = false;
            continue;
        }
        let Some(function) = out.last_mut() else {
            continue;
        };
        if function.name.is_empty() {
            continue;
        }
        if in_params {
            let trimmed = code.trim();
            if trimmed.starts_with(')') {
                in_params = false;
            } else if let Some(declaration) = trimmed.strip_prefix(".param") {
                let ty = declaration.split_whitespace().next().unwrap_or("");
                function.param_types.push(ty.trim_start_matches('.'));
            }
            continue;
        }
        for statement in code.split(';') {
            let statement = statement.trim().trim_start_matches(['{', '}']).trim();
            if statement.is_empty() || statement.starts_with('.') || statement.starts_with(')') {
                continue;
            }
            if let Some(label) = statement.strip_suffix(':') {
                function.labels.insert(label, function.body.len());
                continue;
            }
            let unguarded = if statement.starts_with('@') {
                statement
                    .split_once(char::is_whitespace)
                    .map_or("", |(_, rest)| rest.trim_start())
            } else {
                statement
            };
            let opcode = unguarded.split_whitespace().next().unwrap_or("");
            if opcode.is_empty() {
                continue;
            }
            function.body.push(Instruction {
                line,
                opcode,
                text: statement,
            });
        }
    }
    out.retain(|f| !f.name.is_empty());
    out
}

/// Whether an instruction is a strong read another thread's store becomes visible to (or a
/// block-wide vote, which reads the other threads' contributions).
fn is_strong_read(opcode: &str) -> bool {
    (opcode.starts_with("ld.")
        && [".acquire", ".relaxed", ".volatile"]
            .iter()
            .any(|m| opcode.contains(m)))
        || opcode.starts_with("atom.")
        || opcode.starts_with("mbarrier.try_wait")
        // A block-wide vote: the loop waits on what other threads of the block contribute.
        || opcode.starts_with("barrier.red")
}

/// The function a `call` instruction calls.
fn callee<'a>(instruction: &Instruction<'a>) -> Option<&'a str> {
    // call.uni (retval0), name, (param0, …);  or  call.uni name, (…);
    let operands = instruction.text.split_once(char::is_whitespace)?.1;
    operands
        .split(',')
        .map(str::trim)
        .find(|operand| !operand.starts_with('(') && !operand.is_empty())
}

/// What [`lint`] found and how much it checked.
#[derive(Debug, Default)]
pub struct LintReport {
    /// One message per finding (empty: the file passes).
    pub findings: Vec<String>,
    /// Kernels whose parameters were checked.
    pub kernels: usize,
    /// Waiting loops (with `nanosleep` or `%globaltimer`) checked for a strong load.
    pub waiting_loops: usize,
}

/// Check the PTX of target `target` ("sm_80", "sm_90" or "sm_100a"); `launched` gives the
/// `.param` types the host passes to a kernel (or `None` for one the host never launches).
pub fn lint(
    target: &str,
    ptx: &str,
    launched: impl Fn(&str) -> Option<&'static [&'static str]>,
) -> LintReport {
    let mut report = LintReport::default();
    let findings = &mut report.findings;
    let allowed: HashSet<&str> = SIMULATED
        .iter()
        .chain(if target == "sm_100a" {
            SM100A_ONLY
        } else {
            &[]
        })
        .copied()
        .collect();
    let functions = functions(ptx);
    if functions.is_empty() {
        findings.push(format!("{target}: no function found in the PTX"));
    }
    let strong_functions: HashSet<&str> = functions
        .iter()
        .filter(|f| f.body.iter().any(|i| is_strong_read(i.opcode)))
        .map(|f| f.name)
        .collect();
    let mut unknown: HashMap<&str, usize> = HashMap::new();
    for function in &functions {
        for instruction in &function.body {
            if !allowed.contains(instruction.opcode) && !unknown.contains_key(instruction.opcode) {
                unknown.insert(instruction.opcode, instruction.line);
                findings.push(format!(
                    "{target} line {}: `{}` (in {}) is not an instruction the simulated GPU \
                     executes{}",
                    instruction.line,
                    instruction.opcode,
                    function.name,
                    if target == "sm_100a" {
                        ""
                    } else {
                        " (teach sim/ the instruction, then add it to SIMULATED in tests/src/ptx_lint.rs)"
                    }
                ));
            }
        }
        for (end, instruction) in function.body.iter().enumerate() {
            if !instruction.opcode.starts_with("bra") {
                continue;
            }
            let Some(label) = instruction.text.split_whitespace().last() else {
                continue;
            };
            let Some(&start) = function.labels.get(label) else {
                findings.push(format!(
                    "{target} line {}: branch to undefined label {label} in {}",
                    instruction.line, function.name
                ));
                continue;
            };
            if start > end {
                continue; // a forward branch
            }
            if !closes_a_loop(function, start, end) {
                continue; // a loop's exit to a block laid out before it
            }
            let body = &function.body[start..=end];
            let waits = body
                .iter()
                .any(|i| i.opcode.starts_with("nanosleep") || i.text.contains("%globaltimer"));
            let strong = body.iter().any(|i| {
                is_strong_read(i.opcode)
                    || (i.opcode.starts_with("call")
                        && callee(i).is_some_and(|c| strong_functions.contains(c)))
            });
            report.waiting_loops += usize::from(waits);
            if waits && !strong {
                findings.push(format!(
                    "{target} lines {}-{}: a waiting loop in {} has no strong load (ld.acquire, \
                     ld.relaxed, ld.volatile or atom): its loads may be hoisted out of the loop",
                    body[0].line, instruction.line, function.name
                ));
            }
        }
        if function.entry {
            report.kernels += 1;
            match launched(function.name) {
                Some(expected) if function.param_types != expected => findings.push(format!(
                    "{target} line {}: kernel {} takes ({}) but the host launches it with ({})",
                    function.line,
                    function.name,
                    function.param_types.join(", "),
                    expected.join(", ")
                )),
                Some(_) => {}
                None => findings.push(format!(
                    "{target} line {}: kernel {} is not one the host launches",
                    function.line, function.name
                )),
            }
        }
    }
    report
}

/// `true` when the backward branch at `end` (to the label at `start`) closes a loop laid out
/// in `start..=end`: control that enters at `start` can come back to it without leaving the
/// range. A backward branch can also leave an inner loop for a block of the outer one that
/// LLVM placed earlier (the outer loop then reaches the branch only through its own header,
/// outside the range).
fn closes_a_loop(function: &Function<'_>, start: usize, end: usize) -> bool {
    let mut seen = vec![false; end - start + 1];
    let mut work = vec![start];
    while let Some(at) = work.pop() {
        if at < start || at > end || std::mem::replace(&mut seen[at - start], true) {
            continue;
        }
        if at == end {
            return true;
        }
        let instruction = &function.body[at];
        let opcode = instruction.opcode;
        if opcode.starts_with("ret") || opcode.starts_with("exit") || opcode.starts_with("trap") {
            continue;
        }
        if opcode.starts_with("bra") {
            let target = instruction.text.split_whitespace().last();
            if let Some(&to) = target.and_then(|l| function.labels.get(l.trim_end_matches(';'))) {
                work.push(to);
            }
            if !instruction.text.trim_start().starts_with('@') {
                continue; // unconditional: no fall-through
            }
        }
        work.push(at + 1);
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use symm::internals::{launched_param_types, ptx_text};

    /// The `.param` types the host passes to kernel `name`: the library's own launches, and
    /// the benchmark's work-stealing kernels.
    fn host_launches(name: &str) -> Option<&'static [&'static str]> {
        if name.starts_with("symm_clc_") {
            Some(&symm_perf::work_stealing::PTX_PARAM_TYPES)
        } else {
            launched_param_types(name)
        }
    }

    /// The shipped PTX of every target passes.
    #[test]
    fn shipped_ptx_passes() {
        for target in ["sm_80", "sm_90", "sm_100a"] {
            let ptx = ptx_text(target).expect("embedded PTX");
            let functions = functions(ptx);
            assert!(
                functions.iter().filter(|f| f.entry).count() > 300,
                "{target}: kernels found"
            );
            let report = lint(target, ptx, host_launches);
            assert!(
                report.findings.is_empty(),
                "{target}:\n{}",
                report.findings.join("\n")
            );
            assert!(report.kernels > 300, "{target}: {report:?}");
            // Every collective waits on its peers: hundreds of bounded waits per file.
            assert!(report.waiting_loops > 300, "{target}: {report:?}");
        }
    }

    /// Every instruction of [`SIMULATED`] is used somewhere (the list says what the PTX needs,
    /// no more), and the sm_100a extras only there.
    #[test]
    fn instruction_lists_are_what_the_ptx_uses() {
        let used = |target: &str| -> HashSet<String> {
            functions(ptx_text(target).unwrap())
                .iter()
                .flat_map(|f| f.body.iter().map(|i| i.opcode.to_string()))
                .collect()
        };
        let (sm80, sm90) = (used("sm_80"), used("sm_90"));
        for opcode in SIMULATED {
            assert!(
                sm80.contains(*opcode) || sm90.contains(*opcode),
                "{opcode} is used by neither sm_80 nor sm_90"
            );
        }
        // The float8 e4m3 conversions exist from sm_89 on: sm_90 uses them, sm_80 cannot.
        for opcode in SM89_CONVERSIONS {
            assert!(sm90.contains(*opcode), "{opcode} is not used by sm_90");
            assert!(!sm80.contains(*opcode), "{opcode} is used by sm_80");
        }
        let sm100a = used("sm_100a");
        for opcode in SM100A_ONLY {
            assert!(sm100a.contains(*opcode), "{opcode} is not used by sm_100a");
        }
    }

    const HEADER: &str = ".version 7.8\n.target sm_90\n.address_size 64\n\n";

    fn kernel(params: &str, body: &str) -> String {
        format!(
            "{HEADER}.visible .entry symm_test_kernel(\n{params}\n)\n{{\n\t.reg .b32 %r<9>;\n\t.reg .b64 %rd<9>;\n\t.reg .pred %p<9>;\n{body}\n\tret;\n}}\n"
        )
    }

    const PARAMS: &str = "\t.param .u64 .ptr .align 1 symm_test_kernel_param_0,\n\t.param .u32 symm_test_kernel_param_1,\n\t.param .u32 symm_test_kernel_param_2";

    fn spin(load: &str) -> String {
        kernel(
            PARAMS,
            &format!(
                "$L__BB0_1:\n\t{load} \t%r1, [%rd1];\n\tmov.u64 \t%rd2, %globaltimer;\n\tnanosleep.u32 %r2;\n\tsetp.eq.b32 \t%p1, %r1, 0;\n\t@%p1 bra \t$L__BB0_1;"
            ),
        )
    }

    #[test]
    fn a_spin_loop_with_an_acquire_load_passes() {
        assert_eq!(
            lint("sm_90", &spin("ld.acquire.sys.u32"), launched_param_types).findings,
            Vec::<String>::new()
        );
    }

    /// Mutation: the spin loop's acquire load turned into a weak load.
    #[test]
    fn a_spin_loop_with_only_weak_loads_is_found() {
        let findings = lint("sm_90", &spin("ld.b32"), launched_param_types).findings;
        assert_eq!(findings.len(), 1, "{findings:?}");
        assert!(findings[0].contains("has no strong load"), "{findings:?}");
    }

    /// A backward branch that leaves a waiting loop for a block laid out before it (LLVM
    /// places an outer loop's blocks so) is no loop of its own: the range it spans has no
    /// strong load, but the loop it leaves has one. A weak loop whose header is reached back
    /// through an unconditional branch is still found.
    #[test]
    fn a_loop_exit_to_an_earlier_block_is_not_a_loop() {
        let exit_before = kernel(
            PARAMS,
            "	bra.uni 	$L__BB0_3;
$L__BB0_1:
	st.release.sys.u32 	[%rd2], %r3;
	bra.uni 	$L__BB0_5;
$L__BB0_2:
	mov.u64 	%rd3, %globaltimer;
	setp.gt.u64 	%p2, %rd3, %rd4;
	@%p2 bra 	$L__BB0_1;
	nanosleep.u32 %r2;
$L__BB0_3:
	ld.acquire.sys.u32 	%r1, [%rd1];
	setp.eq.b32 	%p1, %r1, 0;
	@%p1 bra 	$L__BB0_2;
$L__BB0_5:",
        );
        assert_eq!(
            lint("sm_90", &exit_before, launched_param_types).findings,
            Vec::<String>::new()
        );
        let weak = kernel(
            PARAMS,
            "$L__BB0_1:
	ld.b32 	%r1, [%rd1];
	setp.eq.b32 	%p1, %r1, 0;
	@%p1 bra 	$L__BB0_2;
	bra.uni 	$L__BB0_3;
$L__BB0_2:
	nanosleep.u32 %r2;
	bra.uni 	$L__BB0_1;
$L__BB0_3:",
        );
        let findings = lint("sm_90", &weak, launched_param_types).findings;
        assert_eq!(findings.len(), 1, "{findings:?}");
        assert!(findings[0].contains("has no strong load"), "{findings:?}");
    }

    /// A loop whose strong load is in a called function passes.
    #[test]
    fn a_spin_loop_calling_a_strong_function_passes() {
        let ptx = format!(
            "{HEADER}.func  (.param .b32 func_retval0) wait_helper(\n\t.param .b64 wait_helper_param_0\n)\n{{\n\t.reg .b32 %r<3>;\n\t.reg .b64 %rd<3>;\n\tld.param.b64 \t%rd1, [wait_helper_param_0];\n\tld.volatile.b32 \t%r1, [%rd1];\n\tst.param.b32 \t[func_retval0], %r1;\n\tret;\n}}\n{}",
            kernel(
                PARAMS,
                "$L__BB0_1:\n\t{ // callseq 0, 0\n\t.param .b64 param0;\n\tst.param.b64 \t[param0], %rd1;\n\t.param .b32 retval0;\n\tcall.uni (retval0), wait_helper, (param0);\n\tld.param.b32 \t%r1, [retval0];\n\t} // callseq 0\n\tnanosleep.u32 %r2;\n\tsetp.eq.b32 \t%p1, %r1, 0;\n\t@%p1 bra \t$L__BB0_1;"
            )
            .trim_start_matches(HEADER)
        );
        assert_eq!(
            lint("sm_90", &ptx, launched_param_types).findings,
            Vec::<String>::new()
        );
    }

    /// Mutation: an instruction the simulator does not execute.
    #[test]
    fn an_unsimulated_instruction_is_found() {
        let ptx = kernel(PARAMS, "\tfma.rn.f32 \t%r1, %r2, %r3, %r4;");
        let findings = lint("sm_90", &ptx, launched_param_types).findings;
        assert_eq!(findings.len(), 1, "{findings:?}");
        assert!(findings[0].contains("`fma.rn.f32`"), "{findings:?}");
        // The CLC instructions are allowed in sm_100a only.
        let clc = kernel(PARAMS, "\tmbarrier.init.shared::cta.b64 \t[%rd1], %r1;");
        assert_eq!(
            lint("sm_100a", &clc, launched_param_types).findings.len(),
            0
        );
        assert_eq!(lint("sm_90", &clc, launched_param_types).findings.len(), 1);
    }

    /// Mutation: the kernel's parameters differ from what the host passes.
    #[test]
    fn a_parameter_list_the_host_does_not_pass_is_found() {
        let swapped = "\t.param .u32 symm_test_kernel_param_0,\n\t.param .u64 .ptr .align 1 symm_test_kernel_param_1,\n\t.param .u32 symm_test_kernel_param_2";
        let findings = lint("sm_90", &kernel(swapped, ""), launched_param_types).findings;
        assert_eq!(findings.len(), 1, "{findings:?}");
        assert!(
            findings[0]
                .contains("takes (u32, u64, u32) but the host launches it with (u64, u32, u32)"),
            "{findings:?}"
        );
        let missing = "\t.param .u64 .ptr .align 1 symm_test_kernel_param_0,\n\t.param .u32 symm_test_kernel_param_1";
        assert_eq!(
            lint("sm_90", &kernel(missing, ""), launched_param_types)
                .findings
                .len(),
            1
        );
    }
}
