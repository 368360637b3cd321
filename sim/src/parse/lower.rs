//! Lowering: one PTX instruction (its opcode, modifiers and operands) to the pre-decoded
//! [`Inst`] form, one function per instruction family, and the operand resolution they share
//! (registers, immediates as constant slots, special registers, addresses). Every opcode and
//! modifier combination not implemented is an error.

use super::{Opnd, PResult, Parser, Sym, Ty, ty};
use crate::ir::{CallSite, Inst, Op, atom, cmp, red, sem, slot};
use crate::lex::parse_int;

/// Fails unless there are exactly `n` operands.
fn need(ops: &[Opnd], n: usize) -> PResult<()> {
    if ops.len() == n {
        Ok(())
    } else {
        Err(format!("expected {n} operands, found {}", ops.len()))
    }
}

/// The type the last modifier names (`.u32`, `.f64`, `.pred`, …).
fn last_ty(mods: &[&str]) -> PResult<Ty> {
    mods.last()
        .and_then(|m| ty(m))
        .ok_or_else(|| "missing or unknown type".to_string())
}

/// Fails on a modifier not in `allowed`, the last `skip_last` modifiers (the types) aside.
fn only(mods: &[&str], allowed: &[&str], skip_last: usize) -> PResult<()> {
    for m in &mods[..mods.len().saturating_sub(skip_last)] {
        if !allowed.contains(m) {
            return Err(format!("unsupported modifier .{m}"));
        }
    }
    Ok(())
}

/// What the modifiers of an `ld` / `st` say besides its type.
#[derive(Clone, Copy)]
struct Access<'m> {
    /// The memory ordering (`sem::*`).
    sem: u8,
    /// The state space (`global`, `local`, `param`; empty: generic).
    space: &'m str,
    /// The vector length (1, 2 or 4).
    vec: u8,
}

/// The modifiers of an `ld` / `st` (`is_ld`) but its type. A scope goes with `.relaxed`,
/// `.acquire` and `.release` only.
fn access_modifiers<'m>(is_ld: bool, mods: &[&'m str]) -> PResult<Access<'m>> {
    let mut s = sem::WEAK;
    let mut space = "";
    let mut vec = 1u8;
    let mut scope_needed = false;
    let mut scope_seen = false;
    for &m in &mods[..mods.len() - 1] {
        match m {
            "weak" => s = sem::WEAK,
            "volatile" => s = sem::VOLATILE,
            "relaxed" => {
                s = sem::RELAXED;
                scope_needed = true
            }
            "acquire" if is_ld => {
                s = sem::ACQUIRE;
                scope_needed = true
            }
            "release" if !is_ld => {
                s = sem::RELEASE;
                scope_needed = true
            }
            "cta" | "gpu" | "sys" | "cluster" => scope_seen = true,
            "global" | "param" | "local" => space = m,
            // The non-coherent (read-only) path: a weak load, valid only for data no
            // thread writes while the kernel runs (module tables).
            "nc" if is_ld => s = sem::WEAK,
            "v2" => vec = 2,
            "v4" => vec = 4,
            _ => return Err(format!("unsupported modifier .{m}")),
        }
    }
    if scope_needed != scope_seen {
        return Err("a scope goes with .relaxed/.acquire/.release only".into());
    }
    Ok(Access { sem: s, space, vec })
}

impl<'a> Parser<'a> {
    // ---- operand resolution -------------------------------------------------------------

    /// A source operand as a slot: registers, immediates (as constants), special registers.
    fn src(&mut self, o: &Opnd<'a>, t: Ty) -> PResult<u32> {
        match o {
            Opnd::Name(n) if n.starts_with(|c: char| c.is_ascii_digit()) => {
                let v = parse_int(n).ok_or_else(|| format!("bad number `{n}`"))?;
                self.src(&Opnd::Int(v), t)
            }
            Opnd::Name(n) => self.src_name(n),
            Opnd::Int(v) => {
                let v = if t.pred {
                    (*v != 0) as u64
                } else if t.float {
                    // An integer literal in a float instruction is the value, converted.
                    if t.bits == 32 {
                        ((*v as i64) as f32).to_bits() as u64
                    } else {
                        ((*v as i64) as f64).to_bits()
                    }
                } else {
                    *v
                };
                Ok(self.konst(v))
            }
            Opnd::F32(b) => {
                let v = if t.bits == 64 {
                    (f32::from_bits(*b) as f64).to_bits()
                } else {
                    *b as u64
                };
                Ok(self.konst(v))
            }
            Opnd::F64(b) => {
                let v = if t.bits == 32 && t.float {
                    (f64::from_bits(*b) as f32).to_bits() as u64
                } else {
                    *b
                };
                Ok(self.konst(v))
            }
            _ => Err("expected a register or immediate operand".into()),
        }
    }

    /// A source operand given by name: a special register, a global variable's address, a
    /// register, or a local variable's address.
    fn src_name(&mut self, n: &str) -> PResult<u32> {
        if let Some(s) = special(n) {
            return Ok(s);
        }
        if let Some(address) = self.global_address(n) {
            return Ok(self.konst(address));
        }
        match self.lookup(n) {
            Some(Sym::Reg(s, _)) => Ok(s),
            Some(Sym::Local(address)) => Ok(self.konst(address)),
            Some(_) => Err(format!("{n} is not a register")),
            None => Err(format!("unknown register {n}")),
        }
    }

    /// A destination operand as a slot: a register, or `_` (the sink).
    fn dst(&mut self, o: &Opnd<'a>) -> PResult<u32> {
        match o {
            Opnd::Name("_") => Ok(slot::SINK),
            Opnd::Name(n) => match self.lookup(n) {
                Some(Sym::Reg(s, _)) => Ok(s),
                _ => Err(format!("destination {n} is not a register")),
            },
            _ => Err("destination must be a register".into()),
        }
    }

    /// A predicate source as a slot and whether it is negated (`!%p`).
    fn pred_src(&mut self, o: &Opnd<'a>) -> PResult<(u32, bool)> {
        match o {
            Opnd::NotName(n) => Ok((self.src_name(n)?, true)),
            Opnd::Int(v) => Ok((self.konst((*v != 0) as u64), false)),
            _ => Ok((self.src(o, ty("pred").expect("pred"))?, false)),
        }
    }

    /// `i`'s destination `d` from `ops[0]` and its sources `a`, `b`, `c` from the further
    /// operands, all of type `t`.
    fn dst_and_sources(&mut self, i: &mut Inst, ops: &[Opnd<'a>], t: Ty) -> PResult<()> {
        i.o[0] = self.dst(&ops[0])?;
        for (k, o) in ops.iter().enumerate().skip(1) {
            i.o[k] = self.src(o, t)?;
        }
        Ok(())
    }

    // ---- lowering -----------------------------------------------------------------------

    /// One instruction, `base.mods… ops`, lowered to [`Inst`]s (more than one for a local
    /// access or a `brx.idx`), by its family; an error says what is not supported.
    pub(super) fn lower(
        &mut self,
        base: &str,
        mods: &[&str],
        ops: &[Opnd<'a>],
        line: u32,
    ) -> PResult<Vec<Inst>> {
        match base {
            "add" | "sub" => self.lower_add_sub(base, mods, ops),
            "addc" | "subc" => self.lower_add_sub_carry_in(base, mods, ops),
            "mul" => self.lower_mul(mods, ops),
            "mad" | "fma" => self.lower_mad_fma(base, mods, ops),
            "div" | "rem" => self.lower_div_rem(base, mods, ops),
            "min" | "max" => self.lower_min_max(base, mods, ops),
            "and" | "or" | "xor" => self.lower_logic(base, mods, ops),
            "not" | "neg" | "clz" | "popc" | "abs" => self.lower_unary(base, mods, ops),
            "shl" | "shr" => self.lower_shift(base, mods, ops),
            "shf" => self.lower_funnel_shift(mods, ops),
            "bfe" => self.lower_bfe(mods, ops),
            "setp" => self.lower_setp(mods, ops),
            "selp" => self.lower_selp(mods, ops),
            "cvt" if matches!(mods, ["rn", "satfinite", "e4m3x2", "f32"]) => {
                self.lower_cvt_e4m3x2_from_f32(ops)
            }
            "cvt" if matches!(mods, ["rn", "f16x2", "e4m3x2"]) => {
                self.lower_cvt_f16x2_from_e4m3x2(ops)
            }
            "cvt" => self.lower_cvt(mods, ops),
            "cvta" if matches!(mods, ["local", "u64"] | ["to", "local", "u64"]) => {
                self.lower_cvta_local(mods, ops)
            }
            "brx" => self.lower_brx(mods, ops, line),
            "cvta" => self.lower_cvta_global(mods, ops),
            "mov" => self.lower_mov(mods, ops),
            "ld" | "st" => self.lower_ld_st(base == "ld", mods, ops),
            "atom" => self.lower_atom(mods, ops),
            "bar" | "barrier" => self.lower_barrier(base, mods, ops),
            "nanosleep" => self.lower_nanosleep(mods, ops),
            "bra" => self.lower_bra(mods, ops, line),
            "call" => {
                only(mods, &["uni"], 0)?;
                self.lower_call(ops, line)
            }
            "ret" => {
                only(mods, &["uni"], 0)?;
                need(ops, 0)?;
                Ok(vec![Inst::new(Op::Ret, 0)])
            }
            "exit" => {
                need(ops, 0)?;
                only(mods, &[], 0)?;
                Ok(vec![Inst::new(Op::Exit, 0)])
            }
            "trap" => {
                need(ops, 0)?;
                only(mods, &[], 0)?;
                Ok(vec![Inst::new(Op::Trap, 0)])
            }
            _ => Err("unsupported instruction".into()),
        }
    }

    // ---- integer and floating-point arithmetic ------------------------------------------

    /// `add` / `sub`: float (`.rn`), with carry-out (`.cc`), or integer.
    fn lower_add_sub(&mut self, base: &str, mods: &[&str], ops: &[Opnd<'a>]) -> PResult<Vec<Inst>> {
        let t = last_ty(mods)?;
        let mut i;
        if t.float {
            only(mods, &["rn"], 1)?;
            need(ops, 3)?;
            i = Inst::new(
                match (base, t.bits) {
                    ("add", 32) => Op::FAdd32,
                    ("add", 64) => Op::FAdd64,
                    ("sub", 32) => Op::FSub32,
                    _ => Op::FSub64,
                },
                t.bits,
            );
        } else if mods.contains(&"cc") {
            only(mods, &["cc"], 1)?;
            need(ops, 3)?;
            if t.bits < 32 {
                return Err("carry arithmetic needs 32 or 64 bits".into());
            }
            i = Inst::new(Op::AddSubCarry, t.bits);
            i.flags = 2 | if base == "sub" { 4 } else { 0 };
        } else {
            only(mods, &[], 1)?;
            need(ops, 3)?;
            if t.pred {
                return Err("no predicate arithmetic".into());
            }
            i = Inst::new(if base == "add" { Op::Add } else { Op::Sub }, t.bits);
        }
        self.dst_and_sources(&mut i, ops, t)?;
        Ok(vec![i])
    }

    /// `addc` / `subc`: with carry-in (and carry-out with `.cc`), 32- or 64-bit integers.
    fn lower_add_sub_carry_in(
        &mut self,
        base: &str,
        mods: &[&str],
        ops: &[Opnd<'a>],
    ) -> PResult<Vec<Inst>> {
        let t = last_ty(mods)?;
        only(mods, &["cc"], 1)?;
        need(ops, 3)?;
        if t.float || t.bits < 32 {
            return Err("carry arithmetic needs 32- or 64-bit integers".into());
        }
        let mut i = Inst::new(Op::AddSubCarry, t.bits);
        i.flags = 1 | if mods.contains(&"cc") { 2 } else { 0 } | if base == "subc" { 4 } else { 0 };
        self.dst_and_sources(&mut i, ops, t)?;
        Ok(vec![i])
    }

    /// `mul`: float (`.rn`), or integer `.lo`, `.hi`, `.wide`.
    fn lower_mul(&mut self, mods: &[&str], ops: &[Opnd<'a>]) -> PResult<Vec<Inst>> {
        let t = last_ty(mods)?;
        need(ops, 3)?;
        let mut i;
        if t.float {
            only(mods, &["rn"], 1)?;
            i = Inst::new(if t.bits == 32 { Op::FMul32 } else { Op::FMul64 }, t.bits);
        } else {
            let mode = if mods.len() == 2 { mods[0] } else { "" };
            if mods.len() != 2 || t.pred || t.bits < 16 {
                return Err("mul needs .lo, .hi or .wide and an integer type".into());
            }
            let op = match (mode, t.signed) {
                ("lo", _) => Op::MulLo,
                ("hi", false) => Op::MulHiU,
                ("hi", true) => Op::MulHiS,
                ("wide", false) if t.bits <= 32 => Op::MulWideU,
                ("wide", true) if t.bits <= 32 => Op::MulWideS,
                _ => return Err(format!("unsupported mul mode .{mode}")),
            };
            i = Inst::new(op, t.bits);
        }
        self.dst_and_sources(&mut i, ops, t)?;
        Ok(vec![i])
    }

    /// `fma.rn` / `mad.rn` on floats, `mad.lo` on integers.
    fn lower_mad_fma(&mut self, base: &str, mods: &[&str], ops: &[Opnd<'a>]) -> PResult<Vec<Inst>> {
        let t = last_ty(mods)?;
        need(ops, 4)?;
        let mut i;
        if t.float {
            only(mods, &["rn"], 1)?;
            if !mods.contains(&"rn") {
                return Err("fused multiply-add needs .rn".into());
            }
            i = Inst::new(if t.bits == 32 { Op::FFma32 } else { Op::FFma64 }, t.bits);
        } else {
            if base != "mad" || mods.len() != 2 || mods[0] != "lo" || t.pred {
                return Err("only mad.lo on integers is supported".into());
            }
            i = Inst::new(Op::MadLo, t.bits);
        }
        self.dst_and_sources(&mut i, ops, t)?;
        Ok(vec![i])
    }

    /// `div` / `rem`: `div.rn` on floats, both on integers.
    fn lower_div_rem(&mut self, base: &str, mods: &[&str], ops: &[Opnd<'a>]) -> PResult<Vec<Inst>> {
        let t = last_ty(mods)?;
        need(ops, 3)?;
        let mut i;
        if t.float {
            if base == "rem" || mods.len() != 2 || mods[0] != "rn" {
                return Err("only div.rn on floats is supported".into());
            }
            i = Inst::new(if t.bits == 32 { Op::FDiv32 } else { Op::FDiv64 }, t.bits);
        } else {
            only(mods, &[], 1)?;
            if t.pred || t.bits < 16 {
                return Err("bad type".into());
            }
            let op = match (base, t.signed) {
                ("div", false) => Op::DivU,
                ("div", true) => Op::DivS,
                ("rem", false) => Op::RemU,
                _ => Op::RemS,
            };
            i = Inst::new(op, t.bits);
        }
        self.dst_and_sources(&mut i, ops, t)?;
        Ok(vec![i])
    }

    /// `min` / `max`: float, signed or unsigned.
    fn lower_min_max(&mut self, base: &str, mods: &[&str], ops: &[Opnd<'a>]) -> PResult<Vec<Inst>> {
        let t = last_ty(mods)?;
        need(ops, 3)?;
        only(mods, &[], 1)?;
        let op = match (base, t.float, t.bits, t.signed) {
            ("min", true, 32, _) => Op::FMin32,
            ("min", true, 64, _) => Op::FMin64,
            ("max", true, 32, _) => Op::FMax32,
            ("max", true, 64, _) => Op::FMax64,
            ("min", false, _, false) => Op::MinU,
            ("min", false, _, true) => Op::MinS,
            ("max", false, _, false) => Op::MaxU,
            _ => Op::MaxS,
        };
        if t.pred || (!t.float && t.bits < 16) {
            return Err("bad type".into());
        }
        let mut i = Inst::new(op, t.bits);
        self.dst_and_sources(&mut i, ops, t)?;
        Ok(vec![i])
    }

    // ---- bit operations -----------------------------------------------------------------

    /// `and` / `or` / `xor` on `.b` and `.pred` types.
    fn lower_logic(&mut self, base: &str, mods: &[&str], ops: &[Opnd<'a>]) -> PResult<Vec<Inst>> {
        let t = last_ty(mods)?;
        need(ops, 3)?;
        only(mods, &[], 1)?;
        if t.float || t.signed {
            return Err("logic ops take .b or .pred types".into());
        }
        let mut i = Inst::new(
            match base {
                "and" => Op::And,
                "or" => Op::Or,
                _ => Op::Xor,
            },
            t.bits,
        );
        self.dst_and_sources(&mut i, ops, t)?;
        Ok(vec![i])
    }

    /// The one-source operations: `not`, `neg`, `clz`, `popc`, `abs`.
    fn lower_unary(&mut self, base: &str, mods: &[&str], ops: &[Opnd<'a>]) -> PResult<Vec<Inst>> {
        let t = last_ty(mods)?;
        need(ops, 2)?;
        only(mods, &[], 1)?;
        let op = match (base, t.float, t.bits) {
            ("not", false, _) if !t.signed => Op::Not,
            ("neg", true, 32) => Op::FNeg32,
            ("neg", true, 64) => Op::FNeg64,
            ("abs", true, 32) => Op::FAbs32,
            ("abs", true, 64) => Op::FAbs64,
            ("neg", false, _) if t.signed => Op::Neg,
            ("clz", false, 32 | 64) if !t.signed => Op::Clz,
            ("popc", false, 32 | 64) if !t.signed => Op::Popc,
            _ => return Err("unsupported type".into()),
        };
        let mut i = Inst::new(op, t.bits);
        self.dst_and_sources(&mut i, ops, t)?;
        Ok(vec![i])
    }

    /// `shl` / `shr` (the amount is `.u32`).
    fn lower_shift(&mut self, base: &str, mods: &[&str], ops: &[Opnd<'a>]) -> PResult<Vec<Inst>> {
        let t = last_ty(mods)?;
        need(ops, 3)?;
        only(mods, &[], 1)?;
        if t.float || t.pred || t.bits < 16 {
            return Err("bad type".into());
        }
        let op = match (base, t.signed) {
            ("shl", false) => Op::Shl,
            ("shr", false) => Op::ShrU,
            ("shr", true) => Op::ShrS,
            _ => return Err("shl takes .b types".into()),
        };
        let mut i = Inst::new(op, t.bits);
        i.o[0] = self.dst(&ops[0])?;
        i.o[1] = self.src(&ops[1], t)?;
        i.o[2] = self.src(&ops[2], ty("u32").expect("u32"))?;
        Ok(vec![i])
    }

    /// `shf.{l,r}.{wrap,clamp}.b32`.
    fn lower_funnel_shift(&mut self, mods: &[&str], ops: &[Opnd<'a>]) -> PResult<Vec<Inst>> {
        need(ops, 4)?;
        if mods.len() != 3 || mods[2] != "b32" {
            return Err("shf needs .l/.r, .wrap/.clamp and .b32".into());
        }
        let mut i = Inst::new(Op::Shf, 32);
        i.flags = match (mods[0], mods[1]) {
            ("l", "wrap") => 0,
            ("r", "wrap") => 1,
            ("l", "clamp") => 2,
            ("r", "clamp") => 3,
            _ => return Err("shf needs .l/.r and .wrap/.clamp".into()),
        };
        let t = ty("b32").expect("b32");
        self.dst_and_sources(&mut i, ops, t)?;
        Ok(vec![i])
    }

    /// `bfe` (bit field extract) on 32- and 64-bit integers.
    fn lower_bfe(&mut self, mods: &[&str], ops: &[Opnd<'a>]) -> PResult<Vec<Inst>> {
        let t = last_ty(mods)?;
        need(ops, 4)?;
        only(mods, &[], 1)?;
        if t.float || t.pred || t.bits < 32 {
            return Err("bfe takes .u32/.s32/.u64/.s64".into());
        }
        let mut i = Inst::new(if t.signed { Op::BfeS } else { Op::BfeU }, t.bits);
        let u = ty("u32").expect("u32");
        i.o[0] = self.dst(&ops[0])?;
        i.o[1] = self.src(&ops[1], t)?;
        i.o[2] = self.src(&ops[2], u)?;
        i.o[3] = self.src(&ops[3], u)?;
        Ok(vec![i])
    }

    // ---- comparison and selection -------------------------------------------------------

    /// `setp.<cmp>.<type>` with one destination.
    fn lower_setp(&mut self, mods: &[&str], ops: &[Opnd<'a>]) -> PResult<Vec<Inst>> {
        let t = last_ty(mods)?;
        need(ops, 3)?;
        if mods.len() != 2 {
            return Err("setp needs a comparison and a type (no boolean combine)".into());
        }
        let c = match mods[0] {
            "eq" => cmp::EQ,
            "ne" => cmp::NE,
            "lt" | "lo" => cmp::LT,
            "le" | "ls" => cmp::LE,
            "gt" | "hi" => cmp::GT,
            "ge" | "hs" => cmp::GE,
            "equ" => cmp::EQU,
            "neu" => cmp::NEU,
            "ltu" => cmp::LTU,
            "leu" => cmp::LEU,
            "gtu" => cmp::GTU,
            "geu" => cmp::GEU,
            "num" => cmp::NUM,
            "nan" => cmp::NAN,
            m => return Err(format!("unknown comparison .{m}")),
        };
        let op = if t.float {
            if t.bits == 32 {
                Op::SetpF32
            } else {
                Op::SetpF64
            }
        } else {
            if c > cmp::GE || t.pred {
                return Err("unordered comparisons need a float type".into());
            }
            let bty = mods[1].starts_with('b');
            if bty && c != cmp::EQ && c != cmp::NE {
                return Err(".b types compare only with eq/ne".into());
            }
            if t.signed { Op::SetpS } else { Op::SetpU }
        };
        let mut i = Inst::new(op, t.bits);
        i.flags = c;
        if matches!(ops[0], Opnd::Name(n) if n.contains('|')) {
            return Err("two-destination setp is not supported".into());
        }
        self.dst_and_sources(&mut i, ops, t)?;
        Ok(vec![i])
    }

    /// `selp` (a negated predicate swaps the sources).
    fn lower_selp(&mut self, mods: &[&str], ops: &[Opnd<'a>]) -> PResult<Vec<Inst>> {
        let t = last_ty(mods)?;
        need(ops, 4)?;
        only(mods, &[], 1)?;
        if t.pred {
            return Err("bad type".into());
        }
        let mut i = Inst::new(Op::Selp, t.bits);
        i.o[0] = self.dst(&ops[0])?;
        i.o[1] = self.src(&ops[1], t)?;
        i.o[2] = self.src(&ops[2], t)?;
        let (p, neg) = self.pred_src(&ops[3])?;
        if neg {
            // selp d, a, b, !p == selp d, b, a, p
            i.o.swap(1, 2);
        }
        i.o[3] = p;
        Ok(vec![i])
    }

    // ---- conversions --------------------------------------------------------------------

    /// `cvt.rn.satfinite.e4m3x2.f32`: two f32 to a float8 pair.
    fn lower_cvt_e4m3x2_from_f32(&mut self, ops: &[Opnd<'a>]) -> PResult<Vec<Inst>> {
        need(ops, 3)?;
        let f32_ty = ty("f32").expect("f32");
        let mut i = Inst::new(Op::CvtE4m3x2FromF32, 16);
        i.o[0] = self.dst(&ops[0])?;
        i.o[1] = self.src(&ops[1], f32_ty)?;
        i.o[2] = self.src(&ops[2], f32_ty)?;
        Ok(vec![i])
    }

    /// `cvt.rn.f16x2.e4m3x2`: a float8 pair to two halves.
    fn lower_cvt_f16x2_from_e4m3x2(&mut self, ops: &[Opnd<'a>]) -> PResult<Vec<Inst>> {
        need(ops, 2)?;
        let mut i = Inst::new(Op::CvtF16x2FromE4m3x2, 32);
        i.o[0] = self.dst(&ops[0])?;
        i.o[1] = self.src(&ops[1], ty("b16").expect("b16"))?;
        Ok(vec![i])
    }

    /// `cvt` between integers, floats and halves.
    fn lower_cvt(&mut self, mods: &[&str], ops: &[Opnd<'a>]) -> PResult<Vec<Inst>> {
        need(ops, 2)?;
        // Half precision exists here only as a conversion's type: its bits travel in
        // `.b16` registers, and no other instruction takes `.f16`.
        let cvt_ty = |name: &str| {
            if name == "f16" {
                Some(Ty {
                    bits: 16,
                    signed: false,
                    float: true,
                    pred: false,
                })
            } else {
                ty(name)
            }
        };
        let (dt, st) = match mods {
            [.., d, s] => (
                cvt_ty(d).ok_or("unknown destination type")?,
                cvt_ty(s).ok_or("unknown source type")?,
            ),
            _ => return Err("cvt needs two types".into()),
        };
        let rnd: Vec<&str> = mods[..mods.len() - 2].to_vec();
        if dt.pred || st.pred {
            return Err("cvt of predicates".into());
        }
        let mut i = match (dt.float, st.float) {
            (false, false) => {
                if !rnd.is_empty() {
                    return Err("rounding or saturation on integer cvt".into());
                }
                let mut i = Inst::new(Op::CvtInt, dt.bits);
                i.aux = st.bits;
                i.flags = st.signed as u8;
                i
            }
            (true, false) => {
                if rnd != ["rn"] {
                    return Err("integer → float needs .rn".into());
                }
                let mut i = Inst::new(
                    if dt.bits == 32 {
                        Op::CvtF32FromInt
                    } else {
                        Op::CvtF64FromInt
                    },
                    dt.bits,
                );
                i.aux = st.bits;
                i.flags = st.signed as u8;
                i
            }
            (false, true) => {
                if rnd != ["rzi"] {
                    return Err("float → integer needs .rzi".into());
                }
                let mut i = Inst::new(
                    if st.bits == 32 {
                        Op::CvtIntFromF32
                    } else {
                        Op::CvtIntFromF64
                    },
                    dt.bits,
                );
                i.flags = dt.signed as u8;
                i
            }
            (true, true) => match (dt.bits, st.bits) {
                (64, 32) if rnd.is_empty() => Inst::new(Op::CvtF64FromF32, 64),
                (32, 64) if rnd == ["rn"] => Inst::new(Op::CvtF32FromF64, 32),
                (32, 16) if rnd.is_empty() => Inst::new(Op::CvtF32FromF16, 32),
                (16, 32) if rnd == ["rn"] => Inst::new(Op::CvtF16FromF32, 16),
                _ => return Err("unsupported float conversion".into()),
            },
        };
        let st = if st.float && st.bits == 16 {
            ty("b16").expect("b16")
        } else {
            st
        };
        i.o[0] = self.dst(&ops[0])?;
        i.o[1] = self.src(&ops[1], st)?;
        Ok(vec![i])
    }

    /// `cvta{.to}.local.u64`: local addresses are offsets in the thread's frame, whose generic
    /// address is the `LOCAL_BASE` slot.
    fn lower_cvta_local(&mut self, mods: &[&str], ops: &[Opnd<'a>]) -> PResult<Vec<Inst>> {
        need(ops, 2)?;
        let t = ty("u64").expect("u64");
        let mut i = Inst::new(if mods[0] == "to" { Op::Sub } else { Op::Add }, 64);
        i.o[0] = self.dst(&ops[0])?;
        i.o[1] = self.src(&ops[1], t)?;
        i.o[2] = slot::LOCAL_BASE;
        Ok(vec![i])
    }

    /// `cvta{.to}.global.u64`: global addresses are generic already (a move).
    fn lower_cvta_global(&mut self, mods: &[&str], ops: &[Opnd<'a>]) -> PResult<Vec<Inst>> {
        need(ops, 2)?;
        let ok = matches!(mods, ["to", "global", "u64"] | ["global", "u64"]);
        if !ok {
            return Err("only cvta{.to}.global.u64 and cvta{.to}.local.u64 are supported".into());
        }
        let t = ty("u64").expect("u64");
        let mut i = Inst::new(Op::Mov, 64);
        self.dst_and_sources(&mut i, ops, t)?;
        Ok(vec![i])
    }

    // ---- moves --------------------------------------------------------------------------

    /// `mov`: a register, an immediate, a vector pack or unpack, `%globaltimer`.
    fn lower_mov(&mut self, mods: &[&str], ops: &[Opnd<'a>]) -> PResult<Vec<Inst>> {
        let t = last_ty(mods)?;
        need(ops, 2)?;
        only(mods, &[], 1)?;
        match (&ops[0], &ops[1]) {
            (Opnd::Vector(names), src) => {
                let n = names.len();
                if !matches!(n, 2 | 4) || t.bits < 32 {
                    return Err("bad unpack".into());
                }
                let mut i = Inst::new(Op::Unpack, t.bits / n as u8);
                i.aux = n as u8;
                for (k, name) in names.iter().enumerate() {
                    i.o[k] = self.dst(&Opnd::Name(name))?;
                }
                i.o[5] = self.src(src, t)?;
                Ok(vec![i])
            }
            (d, Opnd::Vector(names)) => {
                let n = names.len();
                if !matches!(n, 2 | 4) || t.bits < 32 {
                    return Err("bad pack".into());
                }
                let mut i = Inst::new(Op::Pack, t.bits / n as u8);
                i.aux = n as u8;
                i.o[0] = self.dst(d)?;
                for (k, name) in names.iter().enumerate() {
                    i.o[k + 1] = self.src_name(name)?;
                }
                Ok(vec![i])
            }
            (d, Opnd::Name("%globaltimer")) => {
                if t.bits != 64 {
                    return Err("%globaltimer is 64-bit".into());
                }
                let mut i = Inst::new(Op::GlobalTimer, 64);
                i.o[0] = self.dst(d)?;
                Ok(vec![i])
            }
            (d, s) => {
                let mut i = Inst::new(Op::Mov, t.bits);
                i.o[0] = self.dst(d)?;
                i.o[1] = self.src(s, t)?;
                Ok(vec![i])
            }
        }
    }

    // ---- memory -------------------------------------------------------------------------

    /// `ld` / `st` (`is_ld`): of a parameter, or of memory (global, local or generic).
    fn lower_ld_st(&mut self, is_ld: bool, mods: &[&str], ops: &[Opnd<'a>]) -> PResult<Vec<Inst>> {
        if ops.len() != 2 {
            return Err("expected 2 operands".into());
        }
        let t = mods
            .last()
            .and_then(|m| ty(m))
            .ok_or("missing or unknown type")?;
        if t.pred {
            return Err("predicate loads".into());
        }
        let access = access_modifiers(is_ld, mods)?;
        let (vals, addr) = if is_ld {
            (&ops[0], &ops[1])
        } else {
            (&ops[1], &ops[0])
        };
        if access.space == "param" {
            self.lower_param_access(is_ld, t, access, vals, addr)
        } else {
            self.lower_memory_access(is_ld, t, access, vals, addr)
        }
    }

    /// `ld.param` / `st.param` of `vals` at `addr`: a kernel parameter (read from the
    /// parameter buffer) or a function's `.param` held in a slot (a move).
    fn lower_param_access(
        &mut self,
        is_ld: bool,
        t: Ty,
        access: Access,
        vals: &Opnd<'a>,
        addr: &Opnd<'a>,
    ) -> PResult<Vec<Inst>> {
        if access.vec != 1 || access.sem != sem::WEAK {
            return Err("vector or ordered .param accesses are not supported".into());
        }
        let Opnd::Addr(name, off) = addr else {
            return Err("bad .param address".into());
        };
        let bytes = (t.bits as u32 / 8).max(1);
        match self.lookup(name) {
            Some(Sym::KParam(o, size)) if is_ld => {
                if *off < 0 || *off as u32 + bytes > size {
                    return Err("kernel parameter access out of bounds".into());
                }
                let mut i = Inst::new(Op::LdKernelParam, t.bits);
                i.flags = t.signed as u8;
                i.o[0] = self.dst(vals)?;
                i.o[1] = o + *off as u32;
                Ok(vec![i])
            }
            Some(Sym::Param(slot_, size)) => {
                if *off != 0 || bytes > size {
                    return Err("parameter access with an offset or wider than it".into());
                }
                // A function parameter held in a slot: a move (sign-extending loads).
                let mut i;
                if is_ld {
                    if t.signed {
                        i = Inst::new(Op::CvtInt, 64);
                        i.aux = t.bits;
                        i.flags = 1;
                    } else {
                        i = Inst::new(Op::Mov, t.bits);
                    }
                    i.o[0] = self.dst(vals)?;
                    i.o[1] = slot_;
                } else {
                    i = Inst::new(Op::Mov, t.bits);
                    i.o[0] = slot_;
                    i.o[1] = self.src(vals, t)?;
                }
                Ok(vec![i])
            }
            Some(Sym::KParam(..)) => Err("stores to kernel parameters".into()),
            _ => Err(format!("unknown parameter {name}")),
        }
    }

    /// `ld` / `st` of `vals` at `addr` in global, local (the thread's frame, made generic by
    /// adding its base) or generic memory.
    fn lower_memory_access(
        &mut self,
        is_ld: bool,
        t: Ty,
        access: Access,
        vals: &Opnd<'a>,
        addr: &Opnd<'a>,
    ) -> PResult<Vec<Inst>> {
        let Access { sem: s, space, vec } = access;
        if t.bits < 8 {
            return Err("bad type".into());
        }
        let mut i = Inst::new(if is_ld { Op::Ld } else { Op::St }, t.bits);
        i.aux = vec;
        i.flags = s | if t.signed && is_ld { 0x80 } else { 0 };
        if vec > 1 && s != sem::WEAK && s != sem::RELAXED && s != sem::VOLATILE {
            return Err("vector acquire/release accesses are not supported".into());
        }
        match vals {
            Opnd::Vector(names) => {
                if names.len() != vec as usize {
                    return Err("vector length does not match".into());
                }
                for (k, n) in names.iter().enumerate() {
                    i.o[k] = if is_ld {
                        self.dst(&Opnd::Name(n))?
                    } else {
                        self.src(&Opnd::Name(n), t)?
                    };
                }
            }
            v => {
                if vec != 1 {
                    return Err("vector access needs a vector operand".into());
                }
                i.o[0] = if is_ld { self.dst(v)? } else { self.src(v, t)? };
            }
        }
        if space == "local" {
            // A local address plus the thread's LOCAL_BASE: a generic access.
            let Opnd::Addr(name, off) = addr else {
                return Err("bad .local address".into());
            };
            let base = match self.lookup(name) {
                Some(Sym::Reg(s, 64)) => s,
                Some(Sym::Local(address)) => self.konst(address),
                _ => return Err(format!("{name} is not a local address")),
            };
            let generic = self.alloc();
            let mut add = Inst::new(Op::Add, 64);
            add.o[0] = generic;
            add.o[1] = base;
            add.o[2] = slot::LOCAL_BASE;
            i.o[4] = generic;
            i.o[5] = i32::try_from(*off).map_err(|_| "address offset too large")? as u32;
            return Ok(vec![add, i]);
        }
        self.address(addr, &mut i)?;
        Ok(vec![i])
    }

    /// The address operand `addr` of memory instruction `i` (`[reg+off]`, `[global+off]`,
    /// `[imm]`): the base slot to `o[4]`, the offset to `o[5]`.
    fn address(&mut self, addr: &Opnd<'a>, i: &mut Inst) -> PResult<()> {
        match addr {
            Opnd::Addr(name, off) if self.lookup(name).is_none() => {
                let Some(base) = self.global_address(name) else {
                    return Err(format!("{name} is not an address register"));
                };
                i.o[4] = self.konst(base.wrapping_add(*off as u64));
                i.o[5] = 0;
            }
            Opnd::Addr(name, off) => {
                i.o[4] = match self.lookup(name) {
                    Some(Sym::Reg(s, 64)) => s,
                    Some(Sym::Reg(..)) => return Err("address register must be 64-bit".into()),
                    _ => return Err(format!("{name} is not an address register")),
                };
                i.o[5] = i32::try_from(*off).map_err(|_| "address offset too large")? as u32;
            }
            Opnd::AbsAddr(v) => {
                i.o[4] = self.konst(*v);
                i.o[5] = 0;
            }
            _ => return Err("expected an address `[...]`".into()),
        }
        Ok(())
    }

    /// `atom.<op>.<type>` on 32- and 64-bit integers (`inc` / `dec` on `.u32` only).
    fn lower_atom(&mut self, mods: &[&str], ops: &[Opnd<'a>]) -> PResult<Vec<Inst>> {
        let t = mods
            .last()
            .and_then(|m| ty(m))
            .ok_or("missing or unknown type")?;
        let mut s = sem::RELAXED;
        let mut op = None;
        for &m in &mods[..mods.len() - 1] {
            match m {
                "relaxed" => s = sem::RELAXED,
                "acquire" => s = sem::ACQUIRE,
                "release" => s = sem::RELEASE,
                "acq_rel" => s = sem::ACQ_REL,
                "cta" | "gpu" | "sys" | "cluster" | "global" => {}
                "cas" | "exch" | "add" | "and" | "or" | "xor" | "min" | "max" | "inc" | "dec" => {
                    if op.is_some() {
                        return Err("two atomic operations".into());
                    }
                    op = Some(m)
                }
                _ => return Err(format!("unsupported modifier .{m}")),
            }
        }
        let op = op.ok_or("no atomic operation")?;
        if t.pred || t.float || !(t.bits == 32 || t.bits == 64) {
            return Err("atomics on 32/64-bit integers only".into());
        }
        let code = match (op, t.signed) {
            ("cas", _) => atom::CAS,
            ("exch", _) => atom::EXCH,
            ("add", _) => atom::ADD,
            ("and", _) => atom::AND,
            ("or", _) => atom::OR,
            ("xor", _) => atom::XOR,
            ("min", false) => atom::MIN_U,
            ("max", false) => atom::MAX_U,
            ("min", true) => atom::MIN_S,
            ("max", true) => atom::MAX_S,
            ("inc", false) if t.bits == 32 => atom::INC,
            ("dec", false) if t.bits == 32 => atom::DEC,
            _ => return Err("unsupported atomic operation/type".into()),
        };
        let n = if code == atom::CAS { 4 } else { 3 };
        if ops.len() != n {
            return Err(format!("expected {n} operands"));
        }
        let mut i = Inst::new(Op::Atom, t.bits);
        i.aux = code;
        i.flags = s;
        i.o[0] = self.dst(&ops[0])?;
        self.address(&ops[1], &mut i)?;
        i.o[1] = self.src(&ops[2], t)?;
        if n == 4 {
            i.o[2] = self.src(&ops[3], t)?;
        }
        Ok(vec![i])
    }

    // ---- synchronisation ----------------------------------------------------------------

    /// `bar.sync` / `barrier.sync` / `barrier.red` on barrier 0.
    fn lower_barrier(&mut self, base: &str, mods: &[&str], ops: &[Opnd<'a>]) -> PResult<Vec<Inst>> {
        let mut m: Vec<&str> = mods.to_vec();
        m.retain(|x| *x != "cta");
        let aligned = base == "bar" || m.contains(&"aligned");
        m.retain(|x| *x != "aligned");
        let mut i = Inst::new(Op::Bar, 0);
        i.flags = if aligned { 2 } else { 0 };
        let id = |o: &Opnd<'a>| match o {
            Opnd::Int(0) => Ok(()),
            _ => Err("only barrier 0 (immediate) is supported".to_string()),
        };
        match m.as_slice() {
            ["sync"] => {
                need(ops, 1)?;
                id(&ops[0])?;
                i.aux = red::NONE;
                i.o[0] = slot::SINK;
            }
            ["red", op, "pred"] | ["red", op, "u32"] => {
                need(ops, 3)?;
                id(&ops[1])?;
                i.aux = match *op {
                    "or" => red::OR,
                    "and" => red::AND,
                    "popc" => red::POPC,
                    _ => return Err(format!("unknown reduction .{op}")),
                };
                if (i.aux == red::POPC) != (m[2] == "u32") {
                    return Err("popc reduces to .u32, and/or to .pred".into());
                }
                i.o[0] = self.dst(&ops[0])?;
                let (p, neg) = self.pred_src(&ops[2])?;
                i.o[1] = p;
                i.flags |= neg as u8;
            }
            _ => return Err("unsupported barrier form".into()),
        }
        Ok(vec![i])
    }

    /// `nanosleep.u32`.
    fn lower_nanosleep(&mut self, mods: &[&str], ops: &[Opnd<'a>]) -> PResult<Vec<Inst>> {
        need(ops, 1)?;
        if mods != ["u32"] {
            return Err("nanosleep takes .u32".into());
        }
        let mut i = Inst::new(Op::Nanosleep, 32);
        i.o[1] = self.src(&ops[0], ty("u32").expect("u32"))?;
        Ok(vec![i])
    }

    // ---- control flow -------------------------------------------------------------------

    /// `bra` to a label (resolved when the function ends).
    fn lower_bra(&mut self, mods: &[&str], ops: &[Opnd<'a>], line: u32) -> PResult<Vec<Inst>> {
        need(ops, 1)?;
        only(mods, &["uni"], 0)?;
        let Opnd::Name(label) = ops[0] else {
            return Err("branch target must be a label".into());
        };
        let at = self.prog.code.len();
        self.branches.push((at, label, line));
        Ok(vec![Inst::new(Op::Bra, 0)])
    }

    /// `brx.idx`: an indexed branch through a `.branchtargets` list, lowered to a chain of
    /// compares and branches (an index outside the list traps).
    fn lower_brx(&mut self, mods: &[&str], ops: &[Opnd<'a>], line: u32) -> PResult<Vec<Inst>> {
        need(ops, 2)?;
        only(mods, &["idx", "uni"], 0)?;
        let Opnd::Name(table) = ops[1] else {
            return Err("brx.idx needs a .branchtargets label".into());
        };
        let targets = self
            .brx_tables
            .get(table)
            .cloned()
            .ok_or_else(|| format!("{table} is not a .branchtargets list"))?;
        let index = self.src(&ops[0], ty("u32").expect("u32"))?;
        let pred = self.alloc();
        let mut out = Vec::with_capacity(2 * targets.len() + 1);
        for (k, label) in targets.iter().enumerate() {
            let mut c = Inst::new(Op::SetpU, 32);
            c.flags = cmp::EQ;
            c.o[0] = pred;
            c.o[1] = index;
            c.o[2] = self.konst(k as u64);
            out.push(c);
            let at = self.prog.code.len() + out.len();
            self.branches.push((at, label, line));
            let mut b = Inst::new(Op::Bra, 0);
            b.guard = pred;
            out.push(b);
        }
        out.push(Inst::new(Op::Trap, 0));
        Ok(out)
    }

    /// `call` of a declared function (no kernels, no indirect calls): its `.param` arguments
    /// and return value matched to the callee's, the call graph edge noted.
    fn lower_call(&mut self, ops: &[Opnd<'a>], line: u32) -> PResult<Vec<Inst>> {
        // call (ret), name, (args);  call name, (args);  call name;
        let mut k = 0;
        let mut ret = None;
        if let Some(Opnd::List(r)) = ops.first() {
            if r.len() != 1 {
                return Err("one return value expected".into());
            }
            ret = Some(r[0]);
            k = 1;
        }
        let Some(Opnd::Name(callee)) = ops.get(k) else {
            return Err("call needs a function name".into());
        };
        let args: Vec<&str> = match ops.get(k + 1) {
            Some(Opnd::List(a)) => a.clone(),
            None => Vec::new(),
            _ => return Err("bad argument list".into()),
        };
        if ops.len() > k + 2 {
            return Err("indirect calls are not supported".into());
        }
        let &fi = self
            .func_index
            .get(*callee)
            .ok_or_else(|| format!("call of undeclared function {callee}"))?;
        let f = self.prog.funcs[fi as usize].clone();
        if f.is_entry {
            return Err("call of a kernel".into());
        }
        if f.params.len() != args.len() {
            return Err(format!("{callee} takes {} arguments", f.params.len()));
        }
        let mut site = CallSite {
            func: fi,
            target: 0,
            args: Vec::new(),
            ret: None,
        };
        for (a, (_, cs, csize)) in args.iter().zip(&f.params) {
            match self.lookup(a) {
                Some(Sym::Param(s, size)) if size == *csize => site.args.push((s, *cs)),
                Some(Sym::Param(..)) => return Err(format!("argument {a} has the wrong size")),
                _ => return Err(format!("argument {a} is not a .param")),
            }
        }
        match (ret, &f.ret) {
            (Some(r), Some((_, cs, csize))) => match self.lookup(r) {
                Some(Sym::Param(s, size)) if size == *csize => site.ret = Some((*cs, s)),
                _ => return Err(format!("return value {r} is not a matching .param")),
            },
            (None, _) => {}
            (Some(_), None) => return Err(format!("{callee} returns nothing")),
        }
        self.edges.push((self.cur, fi, line));
        let idx = self.prog.calls.len() as u32;
        self.prog.calls.push(site);
        let mut i = Inst::new(Op::Call, 0);
        i.o[0] = idx;
        Ok(vec![i])
    }
}

/// The slot of a special register name.
fn special(n: &str) -> Option<u32> {
    let (base, dim) = n.rsplit_once('.')?;
    let d = match dim {
        "x" => 0,
        "y" => 1,
        "z" => 2,
        _ => return None,
    };
    let b = match base {
        "%tid" => slot::TID,
        "%ntid" => slot::NTID,
        "%ctaid" => slot::CTAID,
        "%nctaid" => slot::NCTAID,
        _ => return None,
    };
    Some(b + d)
}
