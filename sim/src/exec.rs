//! The interpreter core: runs one GPU thread until its next scheduling decision.

use std::sync::atomic::Ordering;

use crate::fx::FxMap;
use crate::ir::{GUARD_NEG, Inst, NO_GUARD, Op, atom, cmp, sem, slot};
use crate::memory::{MemView, host_load, host_rmw, host_store};
use crate::parse::Program;

/// Granule of spin tracking: 8 bytes.
#[inline]
pub(crate) fn granule(addr: u64) -> u64 {
    addr >> 3
}

/// What is known about stores to one granule.
#[derive(Default, Debug)]
pub(crate) struct GranuleInfo {
    /// Sequence number of the last store.
    pub last: u64,
    /// Sleeping threads watching it: (thread, park token).
    pub watchers: Vec<(u32, u32)>,
}

/// Stores seen by the simulation, for waking threads that spin on memory.
#[derive(Default, Debug)]
pub(crate) struct Stores {
    /// Stores so far.
    pub seq: u64,
    /// Per granule.
    pub map: FxMap<u64, GranuleInfo>,
    /// Sleepers that read too many locations to track: any store wakes them.
    pub any: Vec<(u32, u32)>,
    /// Threads to wake (filled by stores, drained by the scheduler).
    pub woken: Vec<(u32, u32)>,
}

impl Stores {
    #[inline(always)]
    fn on_store(&mut self, addr: u64) {
        self.seq += 1;
        let e = self.map.entry(granule(addr)).or_default();
        e.last = self.seq;
        if !e.watchers.is_empty() {
            self.woken.append(&mut e.watchers);
        }
        if !self.any.is_empty() {
            self.woken.append(&mut self.any);
        }
    }
}

/// At most this many distinct granules are tracked per thread between two sleeps.
pub(crate) const MAX_READS: usize = 64;

/// A call frame: where to return and which call site.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Frame {
    pub ret_pc: u32,
    pub site: u32,
}

/// Thread scheduling state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum TState {
    /// May run.
    Runnable,
    /// Parked by `nanosleep` until a watched store or its wake-up time.
    Sleeping,
    /// Waiting at a block barrier.
    Barrier,
    /// Done.
    Exited,
}

/// One GPU thread.
#[derive(Debug)]
pub(crate) struct Thread {
    pub regs: Box<[u64]>,
    pub pc: u32,
    pub frames: Vec<Frame>,
    /// Grid slot.
    pub grid: u32,
    /// Block slot.
    pub block: u32,
    /// Linear index in the block.
    pub lane: u32,
    /// Granules read since the last sleep with the store sequence number at the read.
    pub reads: Vec<(u64, u64)>,
    /// Set when more than [`MAX_READS`] granules were read: the store sequence then.
    pub reads_overflow: Option<u64>,
    /// Wake-up time while sleeping.
    pub wake_at: u64,
    /// Granules watched while sleeping.
    pub watch: Vec<u64>,
    /// Barrier: the destination register and this thread's predicate.
    pub bar_dest: u32,
    pub bar_pred: bool,
    /// The barrier instruction waited at.
    pub bar_pc: u32,
    /// Index of the weak-memory thread state (weak mode).
    pub weak_id: u32,
}

/// Why a thread stopped.
#[derive(Debug)]
pub(crate) enum Stop {
    /// Its interleaving points are used up (pc at the next memory instruction).
    Yield,
    /// The instruction cap was reached.
    Limit,
    /// It arrived at a barrier (pc after it).
    Barrier,
    /// `nanosleep` of that many ns (pc after it).
    Sleep(u64),
    /// A load or atomic from host memory while host reads cost time (pc after it): the
    /// thread waits for the PCIe round trip.
    HostRead,
    /// It exited.
    Exit,
    /// `trap` (pc at it).
    Trap,
    /// A fault (pc at the instruction).
    Fault(String),
}

/// What a thread's execution needs besides the thread itself.
pub(crate) struct Ctx<'a> {
    pub mem: &'a mut MemView,
    pub device: u32,
    pub params: &'a [u8],
    /// Virtual time at the start of the slice.
    pub now: u64,
    /// Instructions executed towards the next nanosecond.
    pub frac: u64,
    /// Live threads: every one runs one instruction per nanosecond.
    pub live: u64,
    pub stores: &'a mut Stores,
    pub weak: Option<&'a mut crate::weak::Weak>,
    /// Whether plain loads are interleaving points.
    pub plain_load_points: bool,
    /// Whether a load or atomic from host memory stops the thread ([`Stop::HostRead`]).
    pub host_reads_cost: bool,
    /// Loads and atomics from host memory executed in this slice.
    pub host_reads: u64,
}

#[inline(always)]
fn mask(bits: u8) -> u64 {
    if bits >= 64 {
        u64::MAX
    } else {
        (1u64 << bits) - 1
    }
}

#[inline(always)]
fn sext(v: u64, bits: u8) -> i64 {
    if bits >= 64 {
        v as i64
    } else {
        let s = 64 - bits as u32;
        ((v << s) as i64) >> s
    }
}

const NAN32: u64 = 0x7FFF_FFFF;
const NAN64: u64 = 0x7FFF_FFFF_FFFF_FFFF;

#[inline(always)]
fn f32r(v: f32) -> u64 {
    if v.is_nan() {
        NAN32
    } else {
        v.to_bits() as u64
    }
}

#[inline(always)]
fn f64r(v: f64) -> u64 {
    if v.is_nan() { NAN64 } else { v.to_bits() }
}

/// IEEE binary16 bits to f32 (exact).
fn f16_to_f32(h: u16) -> f32 {
    let sign = if h & 0x8000 != 0 { -1.0f32 } else { 1.0 };
    let exponent = (h >> 10) & 0x1F;
    let mantissa = (h & 0x3FF) as f32;
    match exponent {
        0 => sign * mantissa * 2f32.powi(-24),
        0x1F if mantissa == 0.0 => sign * f32::INFINITY,
        0x1F => f32::NAN,
        e => sign * (1024.0 + mantissa) * 2f32.powi(e as i32 - 25),
    }
}

/// OCP float8 e4m3 bits to f32 (exact; S.1111.111 is NaN, there is no infinity).
fn e4m3_to_f32(byte: u8) -> f32 {
    let sign = if byte & 0x80 != 0 { -1.0f32 } else { 1.0 };
    let exponent = (byte >> 3) & 0xF;
    let mantissa = (byte & 0x7) as f32;
    match exponent {
        0xF if byte & 0x7 == 0x7 => f32::NAN,
        0 => sign * mantissa * 2f32.powi(-9),
        e => sign * (8.0 + mantissa) * 2f32.powi(e as i32 - 10),
    }
}

/// f32 to OCP float8 e4m3 bits as `cvt.rn.satfinite.e4m3x2.f32` gives them: the nearest finite
/// code (ties to the even code), magnitudes above the largest (448, infinity included) to the
/// largest, NaN to `0x7F`. Found by search over the 127 finite magnitudes, not by formula.
fn f32_to_e4m3_satfinite(f: f32) -> u8 {
    if f.is_nan() {
        return 0x7F;
    }
    let sign = if f.is_sign_negative() { 0x80u8 } else { 0 };
    let x = (f as f64).abs();
    let mut best = 0u8;
    for code in 1u8..=0x7E {
        let (here, there) = (e4m3_to_f32(code) as f64, e4m3_to_f32(best) as f64);
        let (d, d_best) = ((x - here).abs(), (x - there).abs());
        if d < d_best || (d == d_best && code & 1 == 0) {
            best = code;
        }
    }
    sign | best
}

/// f32 to IEEE binary16 bits, rounded to nearest even (subnormals kept, overflow to infinity,
/// NaN to `0x7FFF` as the GPU gives).
fn f32_to_f16(f: f32) -> u16 {
    if f.is_nan() {
        return 0x7FFF;
    }
    let sign = if f.is_sign_negative() { 0x8000u16 } else { 0 };
    if f.is_infinite() {
        return sign | 0x7C00;
    }
    let bits = f.to_bits() & 0x7FFF_FFFF;
    // f32 subnormals (and zero) are far below half of f16's smallest subnormal.
    if bits < 0x0080_0000 {
        return sign;
    }
    let e = ((bits >> 23) as i32) - 127;
    // Units of the f16 step at this magnitude: 2^-24 for subnormals, else 2^(e - 10). The
    // quotient is exact in f64 (24 significant bits, a power-of-two divisor).
    let step_exponent = Ord::max(e, -14) - 10;
    let q = f.abs() as f64 / 2f64.powi(step_exponent);
    let mut n = q.floor();
    let rest = q - n;
    if rest > 0.5 || (rest == 0.5 && n % 2.0 == 1.0) {
        n += 1.0;
    }
    let n = n as u32;
    if e < -14 {
        // Subnormal (n = 1024 is the smallest normal, whose encoding is the same number).
        return sign | n as u16;
    }
    let (e, n) = if n == 2048 { (e + 1, 1024) } else { (e, n) };
    if e > 15 {
        return sign | 0x7C00;
    }
    sign | (((e + 15) as u16) << 10) | (n - 1024) as u16
}

#[inline(always)]
fn f32of(v: u64) -> f32 {
    f32::from_bits(v as u32)
}

#[inline(always)]
fn f64of(v: u64) -> f64 {
    f64::from_bits(v)
}

fn fmin32(a: f32, b: f32, max: bool) -> u64 {
    match (a.is_nan(), b.is_nan()) {
        (true, true) => NAN32,
        (true, false) => b.to_bits() as u64,
        (false, true) => a.to_bits() as u64,
        _ => {
            if a == b {
                // ±0: -0 < +0.
                let neg = a.is_sign_negative();
                let pick_a = if max { !neg } else { neg };
                (if pick_a { a } else { b }).to_bits() as u64
            } else if (a < b) != max {
                a.to_bits() as u64
            } else {
                b.to_bits() as u64
            }
        }
    }
}

fn fmin64(a: f64, b: f64, max: bool) -> u64 {
    match (a.is_nan(), b.is_nan()) {
        (true, true) => NAN64,
        (true, false) => b.to_bits(),
        (false, true) => a.to_bits(),
        _ => {
            if a == b {
                let neg = a.is_sign_negative();
                let pick_a = if max { !neg } else { neg };
                (if pick_a { a } else { b }).to_bits()
            } else if (a < b) != max {
                a.to_bits()
            } else {
                b.to_bits()
            }
        }
    }
}

fn fcmp(c: u8, a: f64, b: f64) -> bool {
    let unordered = a.is_nan() || b.is_nan();
    match c {
        cmp::EQ => a == b,
        cmp::NE => !unordered && a != b,
        cmp::LT => a < b,
        cmp::LE => a <= b,
        cmp::GT => a > b,
        cmp::GE => a >= b,
        cmp::EQU => unordered || a == b,
        cmp::NEU => a != b,
        cmp::LTU => unordered || a < b,
        cmp::LEU => unordered || a <= b,
        cmp::GTU => unordered || a > b,
        cmp::GEU => unordered || a >= b,
        cmp::NUM => !unordered,
        _ => unordered,
    }
}

#[inline(always)]
fn icmp<T: PartialOrd>(c: u8, a: T, b: T) -> bool {
    match c {
        cmp::EQ => a == b,
        cmp::NE => a != b,
        cmp::LT => a < b,
        cmp::LE => a <= b,
        cmp::GT => a > b,
        _ => a >= b,
    }
}

fn bfe(a: u64, pos: u64, len: u64, bits: u8, signed: bool) -> u64 {
    let msb = bits as u64 - 1;
    let pos = pos & 0xff;
    let len = len & 0xff;
    let sbit = if !signed || len == 0 {
        0
    } else {
        (a >> (pos + len - 1).min(msb)) & 1
    };
    let mut d = 0u64;
    for i in 0..=msb {
        let bit = if i < len && pos + i <= msb {
            (a >> (pos + i)) & 1
        } else {
            sbit
        };
        d |= bit << i;
    }
    d
}

fn cvt_from_float(f: f64, bits: u8, signed: bool) -> u64 {
    // Round toward zero, saturate, NaN → 0 (Rust's `as` does exactly that).
    let v = match (bits, signed) {
        (8, true) => f as i8 as u64,
        (8, false) => f as u8 as u64,
        (16, true) => f as i16 as u64,
        (16, false) => f as u16 as u64,
        (32, true) => f as i32 as u64,
        (32, false) => f as u32 as u64,
        (64, true) => f as i64 as u64,
        _ => f as u64,
    };
    v & mask(bits)
}

/// Load `bytes` at a checked `addr` for `t`, through the weak model when there is one.
#[inline]
fn load(ctx: &mut Ctx, t: &mut Thread, addr: u64, bytes: u32, s: u8) -> u64 {
    let g = granule(addr);
    match t.reads.last() {
        Some(&(last, _)) if last == g => {}
        _ => {
            if t.reads.len() < MAX_READS {
                t.reads.push((g, ctx.stores.seq));
            } else if t.reads_overflow.is_none() {
                t.reads_overflow = Some(ctx.stores.seq);
            }
        }
    }
    if let Some(w) = ctx.weak.as_deref_mut() {
        return w.load(t.weak_id, addr, bytes, s);
    }
    let order = if s == sem::ACQUIRE {
        Ordering::Acquire
    } else {
        Ordering::Relaxed
    };
    // SAFETY: `addr` was checked against the address space (mapped, aligned, allowed).
    unsafe { host_load(addr, bytes, order) }
}

#[inline]
fn store(ctx: &mut Ctx, t: &Thread, addr: u64, bytes: u32, v: u64, s: u8) {
    if let Some(w) = ctx.weak.as_deref_mut() {
        w.store(t.weak_id, addr, bytes, v, s);
    } else {
        let order = if s == sem::RELEASE {
            Ordering::Release
        } else {
            Ordering::Relaxed
        };
        // SAFETY: `addr` was checked against the address space (mapped, aligned, allowed).
        unsafe { host_store(addr, bytes, v, order) };
    }
    ctx.stores.on_store(addr);
}

fn atomic(ctx: &mut Ctx, t: &Thread, i: &Inst, addr: u64, b: u64, c: u64) -> u64 {
    let bits = i.bits;
    let m = mask(bits);
    let op = i.aux;
    let f = move |old: u64| -> Option<u64> {
        let old = old & m;
        let new = match op {
            atom::CAS => {
                if old == b & m {
                    c
                } else {
                    return None;
                }
            }
            atom::EXCH => b,
            atom::ADD => old.wrapping_add(b),
            atom::AND => old & b,
            atom::OR => old | b,
            atom::XOR => old ^ b,
            atom::MIN_U => old.min(b & m),
            atom::MAX_U => old.max(b & m),
            atom::MIN_S => {
                if sext(old, bits) <= sext(b, bits) {
                    old
                } else {
                    b
                }
            }
            atom::MAX_S => {
                if sext(old, bits) >= sext(b, bits) {
                    old
                } else {
                    b
                }
            }
            atom::INC => {
                if old >= b & m {
                    0
                } else {
                    old + 1
                }
            }
            _ => {
                if old == 0 || old > b & m {
                    b
                } else {
                    old - 1
                }
            }
        };
        Some(new & m)
    };
    let bytes = bits as u32 / 8;
    let (old, wrote) = if let Some(w) = ctx.weak.as_deref_mut() {
        w.rmw(t.weak_id, addr, bytes, i.flags, &f)
    } else {
        let mut wrote = false;
        // SAFETY: `addr` was checked against the address space (mapped, aligned, allowed).
        let old = unsafe {
            host_rmw(addr, bytes, |o| {
                let r = f(o);
                wrote = r.is_some();
                r
            })
        };
        (old, wrote)
    };
    if wrote {
        ctx.stores.on_store(addr);
    }
    old
}

// ---- integer arithmetic -----------------------------------------------------------------

/// `add.cc` / `addc` / `sub.cc` / `subc` (`flags` as [`Op::AddSubCarry`] says): `d` and
/// perhaps the carry flag.
#[inline(always)]
fn add_sub_carry(i: &Inst, r: &mut [u64], m: u64) {
    let o = &i.o;
    let cin = if i.flags & 1 != 0 {
        r[slot::CC as usize] & 1
    } else {
        0
    };
    let (x, y) = (r[o[1] as usize] & m, r[o[2] as usize] & m);
    let (v, carry) = if i.flags & 4 == 0 {
        let full = x as u128 + y as u128 + cin as u128;
        (full as u64 & m, (full >> i.bits) as u64 & 1)
    } else {
        let v = x.wrapping_sub(y).wrapping_sub(cin) & m;
        (v, ((x as u128) < y as u128 + cin as u128) as u64)
    };
    r[o[0] as usize] = v;
    if i.flags & 2 != 0 {
        r[slot::CC as usize] = carry;
    }
}

/// The high half of the unsigned product of `a` and `b`, `bits` wide.
#[inline(always)]
fn mul_hi_u(a: u64, b: u64, bits: u8, m: u64) -> u64 {
    let p = (a & m) as u128 * (b & m) as u128;
    (p >> bits) as u64 & m
}

/// The high half of the signed product of `a` and `b`, `bits` wide.
#[inline(always)]
fn mul_hi_s(a: u64, b: u64, bits: u8, m: u64) -> u64 {
    let p = sext(a, bits) as i128 * sext(b, bits) as i128;
    (p >> bits) as u64 & m
}

/// The signed product of `a` and `b` (`bits` wide) at twice the width.
#[inline(always)]
fn mul_wide_s(a: u64, b: u64, bits: u8) -> u64 {
    (sext(a, bits).wrapping_mul(sext(b, bits))) as u64 & mask(bits * 2)
}

/// Unsigned `a / b` at the width of mask `m`; all ones for a zero divisor.
#[inline(always)]
fn div_u(a: u64, b: u64, m: u64) -> u64 {
    let (a, b) = (a & m, b & m);
    a.checked_div(b).unwrap_or(m)
}

/// Signed `a / b`, `bits` wide; all ones for a zero divisor.
#[inline(always)]
fn div_s(a: u64, b: u64, bits: u8, m: u64) -> u64 {
    let (a, b) = (sext(a, bits), sext(b, bits));
    if b == 0 {
        m
    } else {
        a.wrapping_div(b) as u64 & m
    }
}

/// Unsigned `a % b` at the width of mask `m`; `a` for a zero divisor.
#[inline(always)]
fn rem_u(a: u64, b: u64, m: u64) -> u64 {
    let (a, b) = (a & m, b & m);
    a.checked_rem(b).unwrap_or(a)
}

/// Signed `a % b`, `bits` wide; `a` for a zero divisor.
#[inline(always)]
fn rem_s(a: u64, b: u64, bits: u8, m: u64) -> u64 {
    let (a, b) = (sext(a, bits), sext(b, bits));
    if b == 0 {
        a as u64 & m
    } else {
        a.wrapping_rem(b) as u64 & m
    }
}

// ---- bit operations ---------------------------------------------------------------------

/// `a << s`, `bits` wide; 0 for a shift of the width or more.
#[inline(always)]
fn shl(a: u64, s: u64, bits: u8, m: u64) -> u64 {
    let s = s as u32;
    if s >= bits as u32 { 0 } else { (a << s) & m }
}

/// Logical `a >> s`, `bits` wide; 0 for a shift of the width or more.
#[inline(always)]
fn shr_u(a: u64, s: u64, bits: u8, m: u64) -> u64 {
    let s = s as u32;
    if s >= bits as u32 { 0 } else { (a & m) >> s }
}

/// Arithmetic `a >> s`, `bits` wide (shifts clamped to the width).
#[inline(always)]
fn shr_s(a: u64, s: u64, bits: u8, m: u64) -> u64 {
    let s = (s as u32).min(bits as u32 - 1);
    (sext(a, bits) >> s) as u64 & m
}

/// `shf`: the 64-bit pair `b:a` shifted by `c` (`flags` bit 0: right, else left; bit 1:
/// clamp the amount to 32, else take it modulo 32): the upper 32 bits of a left shift, the
/// lower 32 bits of a right shift.
#[inline(always)]
fn funnel_shift(a: u64, b: u64, c: u64, flags: u8) -> u64 {
    let v = (b & 0xFFFF_FFFF) << 32 | (a & 0xFFFF_FFFF);
    let c = c as u32;
    let s = if flags & 2 != 0 { c.min(32) } else { c & 31 };
    if flags & 1 == 0 {
        (v << s) >> 32
    } else {
        (v >> s) & 0xFFFF_FFFF
    }
}

/// Leading zeros of `a`, `bits` wide.
#[inline(always)]
fn clz(a: u64, bits: u8, m: u64) -> u64 {
    let v = a & m;
    (v.leading_zeros() - (64 - bits as u32)) as u64
}

// ---- conversions ------------------------------------------------------------------------

/// `cvt` between integers: `a`, `aux` bits wide (`flags` bit 0: signed), to `bits`.
#[inline(always)]
fn cvt_int(i: &Inst, a: u64, m: u64) -> u64 {
    let v = if i.flags & 1 != 0 {
        sext(a, i.aux) as u64
    } else {
        a & mask(i.aux)
    };
    v & m
}

/// `cvt.rn.f32` of integer `a`, `aux` bits wide (`flags` bit 0: signed).
#[inline(always)]
fn cvt_f32_from_int(i: &Inst, a: u64) -> u64 {
    let f = if i.flags & 1 != 0 {
        sext(a, i.aux) as f32
    } else {
        (a & mask(i.aux)) as f32
    };
    f.to_bits() as u64
}

/// `cvt.rn.f64` of integer `a`, `aux` bits wide (`flags` bit 0: signed).
#[inline(always)]
fn cvt_f64_from_int(i: &Inst, a: u64) -> u64 {
    let f = if i.flags & 1 != 0 {
        sext(a, i.aux) as f64
    } else {
        (a & mask(i.aux)) as f64
    };
    f.to_bits()
}

/// `cvt.rn.satfinite.e4m3x2.f32`: f32 `a` to the high byte, `b` to the low byte.
#[inline(always)]
fn cvt_e4m3x2_from_f32(a: u64, b: u64) -> u64 {
    (f32_to_e4m3_satfinite(f32of(a)) as u64) << 8 | f32_to_e4m3_satfinite(f32of(b)) as u64
}

/// `cvt.rn.f16x2.e4m3x2`: each byte of `a` to binary16, the high byte to the high half.
#[inline(always)]
fn cvt_f16x2_from_e4m3x2(a: u64) -> u64 {
    let pair = a as u16;
    let half = |byte: u16| f32_to_f16(e4m3_to_f32(byte as u8)) as u64;
    half(pair >> 8) << 16 | half(pair & 0xFF)
}

// ---- moves ------------------------------------------------------------------------------

/// `mov` of a vector into one register: `aux` elements of `bits` each from `o[1..]` into `d`.
#[inline(always)]
fn pack(i: &Inst, regs: &mut [u64], m: u64) {
    let o = &i.o;
    let mut v = 0u64;
    for k in 0..i.aux as usize {
        v |= (regs[o[k + 1] as usize] & m) << (k as u32 * i.bits as u32);
    }
    regs[o[0] as usize] = v;
}

/// `mov` of one register into a vector: `o[5]` split into `aux` elements of `bits` each,
/// written to `o[0..aux]`.
#[inline(always)]
fn unpack(i: &Inst, regs: &mut [u64], m: u64) {
    let o = &i.o;
    let v = regs[o[5] as usize];
    for k in 0..i.aux as usize {
        regs[o[k] as usize] = (v >> (k as u32 * i.bits as u32)) & m;
    }
}

/// The kernel parameter `ld.param` reads: `bits` wide at byte offset `o[1]` of `params`,
/// sign-extended when `flags` bit 0 says so.
#[inline(always)]
fn kernel_param(i: &Inst, params: &[u8]) -> u64 {
    let off = i.o[1] as usize;
    let bytes = (i.bits as usize / 8).max(1);
    let mut buf = [0u8; 8];
    buf[..bytes].copy_from_slice(&params[off..off + bytes]);
    let v = u64::from_le_bytes(buf);
    if i.flags & 1 != 0 {
        sext(v, i.bits) as u64
    } else {
        v
    }
}

// ---- memory, synchronisation and control flow -------------------------------------------

/// How a memory access ended.
enum Access {
    /// It happened; the thread goes on.
    Done,
    /// The address space refused it: the instruction did not execute.
    Refused(String),
    /// It happened and is a data race (the report points at it).
    Race(String),
    /// It happened on host memory, a load or atomic: the thread waits for the answer.
    HostRead,
}

/// Whether memory instruction `i` is an interleaving point. Plain loads are one only when the
/// policy says so: for data-race-free code they cannot change an outcome (weak mode explores
/// the racy reads).
#[inline(always)]
fn is_interleaving_point(i: &Inst, ctx: &Ctx) -> bool {
    i.op != Op::Ld || i.flags & 0x7f != sem::WEAK || ctx.plain_load_points
}

/// Execute `ld`, `st` or `atom` `i` (at `pc`) for `t`: check the address, access every
/// element, then note a data race or a read from host memory.
#[inline(always)]
fn access_memory(t: &mut Thread, prog: &Program, ctx: &mut Ctx, i: &Inst, pc: usize) -> Access {
    let o = &i.o;
    let m = mask(i.bits);
    let addr = t.regs[o[4] as usize].wrapping_add(o[5] as i32 as i64 as u64);
    let eb = i.bits as u32 / 8;
    let total = if i.op == Op::Atom {
        eb as u64
    } else {
        eb as u64 * i.aux as u64
    };
    let what = match i.op {
        Op::Ld => "load",
        Op::St => "store",
        _ => "atomic",
    };
    let host = match ctx.mem.check(addr, total, total, ctx.device, what) {
        Ok(host) => host,
        Err(e) => return Access::Refused(e),
    };
    let s = i.flags & 0x7f;
    if let Some(w) = ctx.weak.as_deref_mut() {
        w.line = prog.lines.get(pc).copied().unwrap_or(0);
    }
    match i.op {
        Op::Ld => {
            for (k, &dst) in o[..i.aux as usize].iter().enumerate() {
                let v = load(ctx, t, addr + k as u64 * eb as u64, eb, s);
                let v = if i.flags & 0x80 != 0 {
                    sext(v, i.bits) as u64
                } else {
                    v
                };
                t.regs[dst as usize] = v;
            }
        }
        Op::St => {
            for (k, &src) in o[..i.aux as usize].iter().enumerate() {
                let v = t.regs[src as usize] & m;
                store(ctx, t, addr + k as u64 * eb as u64, eb, v, s);
            }
        }
        _ => {
            let (bv, cv) = (t.regs[o[1] as usize], t.regs[o[2] as usize]);
            let old = atomic(ctx, t, i, addr, bv, cv);
            t.regs[o[0] as usize] = old;
        }
    }
    if let Some(race) = ctx.weak.as_deref_mut().and_then(|w| w.race.take()) {
        return Access::Race(race);
    }
    // Stores to host memory are posted; a load or atomic waits for its answer.
    if host && i.op != Op::St {
        ctx.host_reads += 1;
        if ctx.host_reads_cost {
            return Access::HostRead;
        }
    }
    Access::Done
}

/// Note barrier instruction `i` at `pc` for the scheduler: the destination of a reduction and
/// this thread's predicate (`flags` bit 0 negates it).
#[inline(always)]
fn note_barrier(i: &Inst, t: &mut Thread, pc: usize) {
    t.bar_dest = i.o[0];
    t.bar_pred = (t.regs[i.o[1] as usize] != 0) != (i.flags & 1 != 0);
    t.bar_pc = pc as u32;
}

/// `call` through call site `site` at `pc`: copy the arguments, push the frame. Returns the
/// callee's first instruction.
#[inline(always)]
fn call(t: &mut Thread, prog: &Program, site: u32, pc: usize) -> usize {
    let call_site = &prog.calls[site as usize];
    for &(from, to) in &call_site.args {
        t.regs[to as usize] = t.regs[from as usize];
    }
    t.frames.push(Frame {
        ret_pc: pc as u32 + 1,
        site,
    });
    call_site.target as usize
}

/// `ret` to the caller: copy the return value, pop the frame. Returns where the caller goes
/// on, `None` in the kernel itself (the thread exits).
#[inline(always)]
fn ret(t: &mut Thread, prog: &Program) -> Option<usize> {
    let f = t.frames.pop()?;
    if let Some((from, to)) = prog.calls[f.site as usize].ret {
        t.regs[to as usize] = t.regs[from as usize];
    }
    Some(f.ret_pc as usize)
}

// ---- the interpreter loop ---------------------------------------------------------------

/// Run `t` until it has passed `points` interleaving points (memory and synchronisation
/// instructions; it stops *before* the next one), stops for another reason, or has executed
/// about `limit` instructions. Returns why and how many instructions ran.
pub(crate) fn run(
    t: &mut Thread,
    prog: &Program,
    ctx: &mut Ctx,
    mut points: u32,
    limit: u64,
) -> (Stop, u64) {
    let code = &prog.code[..];
    let mut pc = t.pc as usize;
    let mut n: u64 = 0;
    let stop = loop {
        let i = &code[pc];
        n += 1;
        if i.guard != NO_GUARD {
            let p = t.regs[(i.guard & !GUARD_NEG) as usize] != 0;
            if p == (i.guard & GUARD_NEG != 0) {
                pc += 1;
                continue;
            }
        }
        // The operands are read and written in place (`a!()` = `o[1]`, `b!()`, `c!()`, `set!`
        // writes `o[0]`), and every instruction is one arm of one flat `match`: a struct of the
        // register file and the operand slots, or a `match` per instruction family, costs
        // several instructions (and indirect jumps) per interpreted instruction.
        let r = &mut t.regs;
        let o = &i.o;
        macro_rules! a {
            () => {
                r[o[1] as usize]
            };
        }
        macro_rules! b {
            () => {
                r[o[2] as usize]
            };
        }
        macro_rules! c {
            () => {
                r[o[3] as usize]
            };
        }
        macro_rules! set {
            ($v:expr) => {{
                let v = $v;
                r[o[0] as usize] = v;
            }};
        }
        let m = mask(i.bits);
        match i.op {
            // Integer arithmetic.
            Op::Mov => set!(a!() & m),
            Op::Add => set!(a!().wrapping_add(b!()) & m),
            Op::Sub => set!(a!().wrapping_sub(b!()) & m),
            Op::AddSubCarry => add_sub_carry(i, r, m),
            Op::MulLo => set!(a!().wrapping_mul(b!()) & m),
            Op::MulHiU => set!(mul_hi_u(a!(), b!(), i.bits, m)),
            Op::MulHiS => set!(mul_hi_s(a!(), b!(), i.bits, m)),
            Op::MulWideU => set!((a!() & m).wrapping_mul(b!() & m) & mask(i.bits * 2)),
            Op::MulWideS => set!(mul_wide_s(a!(), b!(), i.bits)),
            Op::MadLo => set!(a!().wrapping_mul(b!()).wrapping_add(c!()) & m),
            Op::DivU => set!(div_u(a!(), b!(), m)),
            Op::DivS => set!(div_s(a!(), b!(), i.bits, m)),
            Op::RemU => set!(rem_u(a!(), b!(), m)),
            Op::RemS => set!(rem_s(a!(), b!(), i.bits, m)),
            Op::MinU => set!((a!() & m).min(b!() & m)),
            Op::MaxU => set!((a!() & m).max(b!() & m)),
            Op::MinS => set!(sext(a!(), i.bits).min(sext(b!(), i.bits)) as u64 & m),
            Op::MaxS => set!(sext(a!(), i.bits).max(sext(b!(), i.bits)) as u64 & m),
            Op::Neg => set!(a!().wrapping_neg() & m),
            // Bit operations.
            Op::And => set!(a!() & b!() & m),
            Op::Or => set!((a!() | b!()) & m),
            Op::Xor => set!((a!() ^ b!()) & m),
            Op::Not => set!(!a!() & m),
            Op::Shl => set!(shl(a!(), b!(), i.bits, m)),
            Op::ShrU => set!(shr_u(a!(), b!(), i.bits, m)),
            Op::ShrS => set!(shr_s(a!(), b!(), i.bits, m)),
            Op::Shf => set!(funnel_shift(a!(), b!(), c!(), i.flags)),
            Op::BfeU => set!(bfe(a!(), b!(), c!(), i.bits, false)),
            Op::BfeS => set!(bfe(a!(), b!(), c!(), i.bits, true)),
            Op::Clz => set!(clz(a!(), i.bits, m)),
            Op::Popc => set!((a!() & m).count_ones() as u64),
            // Comparison and selection.
            Op::SetpU => set!(icmp(i.flags, a!() & m, b!() & m) as u64),
            Op::SetpS => set!(icmp(i.flags, sext(a!(), i.bits), sext(b!(), i.bits)) as u64),
            Op::SetpF32 => set!(fcmp(i.flags, f32of(a!()) as f64, f32of(b!()) as f64) as u64),
            Op::SetpF64 => set!(fcmp(i.flags, f64of(a!()), f64of(b!())) as u64),
            Op::Selp => set!(if c!() != 0 { a!() } else { b!() } & m),
            // Conversions.
            Op::CvtInt => set!(cvt_int(i, a!(), m)),
            Op::CvtF32FromInt => set!(cvt_f32_from_int(i, a!())),
            Op::CvtF64FromInt => set!(cvt_f64_from_int(i, a!())),
            Op::CvtIntFromF32 => set!(cvt_from_float(f32of(a!()) as f64, i.bits, i.flags & 1 != 0)),
            Op::CvtIntFromF64 => set!(cvt_from_float(f64of(a!()), i.bits, i.flags & 1 != 0)),
            Op::CvtF64FromF32 => set!(f64r(f32of(a!()) as f64)),
            Op::CvtF32FromF64 => set!(f32r(f64of(a!()) as f32)),
            Op::CvtF32FromF16 => set!(f32r(f16_to_f32(a!() as u16))),
            Op::CvtF16FromF32 => set!(f32_to_f16(f32of(a!())) as u64),
            Op::CvtE4m3x2FromF32 => set!(cvt_e4m3x2_from_f32(a!(), b!())),
            Op::CvtF16x2FromE4m3x2 => set!(cvt_f16x2_from_e4m3x2(a!())),
            // Floating-point arithmetic.
            Op::FAdd32 => set!(f32r(f32of(a!()) + f32of(b!()))),
            Op::FSub32 => set!(f32r(f32of(a!()) - f32of(b!()))),
            Op::FMul32 => set!(f32r(f32of(a!()) * f32of(b!()))),
            Op::FDiv32 => set!(f32r(f32of(a!()) / f32of(b!()))),
            Op::FFma32 => set!(f32r(f32of(a!()).mul_add(f32of(b!()), f32of(c!())))),
            Op::FMin32 => set!(fmin32(f32of(a!()), f32of(b!()), false)),
            Op::FMax32 => set!(fmin32(f32of(a!()), f32of(b!()), true)),
            Op::FNeg32 => set!((a!() ^ 0x8000_0000) & 0xFFFF_FFFF),
            Op::FAbs32 => set!(a!() & 0x7FFF_FFFF),
            Op::FAdd64 => set!(f64r(f64of(a!()) + f64of(b!()))),
            Op::FSub64 => set!(f64r(f64of(a!()) - f64of(b!()))),
            Op::FMul64 => set!(f64r(f64of(a!()) * f64of(b!()))),
            Op::FDiv64 => set!(f64r(f64of(a!()) / f64of(b!()))),
            Op::FFma64 => set!(f64r(f64of(a!()).mul_add(f64of(b!()), f64of(c!())))),
            Op::FMin64 => set!(fmin64(f64of(a!()), f64of(b!()), false)),
            Op::FMax64 => set!(fmin64(f64of(a!()), f64of(b!()), true)),
            Op::FNeg64 => set!(a!() ^ (1 << 63)),
            Op::FAbs64 => set!(a!() & !(1 << 63)),
            // Moves and special reads.
            Op::Pack => pack(i, r, m),
            Op::Unpack => unpack(i, r, m),
            Op::GlobalTimer => set!(ctx.now + (ctx.frac + n) / ctx.live),
            Op::LdKernelParam => set!(kernel_param(i, ctx.params)),
            // Memory and synchronisation: the interleaving points.
            Op::Ld | Op::St | Op::Atom => {
                if is_interleaving_point(i, ctx) {
                    if points == 0 {
                        n -= 1;
                        break Stop::Yield;
                    }
                    points -= 1;
                }
                match access_memory(t, prog, ctx, i, pc) {
                    Access::Done => {}
                    Access::Refused(e) => {
                        n -= 1;
                        break Stop::Fault(e);
                    }
                    Access::Race(race) => break Stop::Fault(race),
                    Access::HostRead => {
                        pc += 1;
                        break Stop::HostRead;
                    }
                }
            }
            Op::Bar => {
                if points == 0 {
                    n -= 1;
                    break Stop::Yield;
                }
                note_barrier(i, t, pc);
                pc += 1;
                break Stop::Barrier;
            }
            Op::Nanosleep => {
                if points == 0 {
                    n -= 1;
                    break Stop::Yield;
                }
                let ns = a!() & 0xFFFF_FFFF;
                pc += 1;
                break Stop::Sleep(ns);
            }
            // Control flow.
            Op::Bra => {
                pc = i.o[0] as usize;
                if n >= limit {
                    break Stop::Limit;
                }
                continue;
            }
            Op::Call => {
                pc = call(t, prog, i.o[0], pc);
                continue;
            }
            Op::Ret => match ret(t, prog) {
                Some(to) => {
                    pc = to;
                    continue;
                }
                None => break Stop::Exit,
            },
            Op::Exit => break Stop::Exit,
            Op::Trap => break Stop::Trap,
        }
        pc += 1;
    };
    t.pc = pc as u32;
    (stop, n)
}

#[cfg(test)]
mod tests {
    use super::{e4m3_to_f32, f16_to_f32, f32_to_e4m3_satfinite, f32_to_f16};
    use symm_device::numeric::small_float::{FLOAT8_E4M3, FLOAT16};

    #[test]
    fn every_e4m3_widens_exactly_and_narrows_back() {
        for byte in 0..=u8::MAX {
            let wide = e4m3_to_f32(byte);
            let reference = FLOAT8_E4M3.to_f32(byte as u32);
            if reference.is_nan() {
                assert!(wide.is_nan(), "{byte:#04x}");
                assert_eq!(f32_to_e4m3_satfinite(wide), 0x7F);
            } else {
                assert_eq!(wide.to_bits(), reference.to_bits(), "{byte:#04x}");
                assert_eq!(f32_to_e4m3_satfinite(wide), byte, "{byte:#04x}");
                // Every e4m3 value is a binary16 value: the f16x2 path is exact too.
                assert_eq!(f16_to_f32(f32_to_f16(wide)).to_bits(), wide.to_bits());
            }
        }
    }

    #[test]
    fn e4m3_narrowing_saturates_and_rounds_as_the_software_conversion() {
        // Magnitudes from far below the smallest subnormal (2^-9) to far above the largest
        // finite (448), ties included (the mantissas step past every 2^-4 of a binade).
        let mut checked = 0;
        for exponent in 100u32..=140 {
            for mantissa in (0u32..1 << 23)
                .step_by(1 << 15)
                .chain([0x8_0000, 0x7F_FFFF])
            {
                for sign in [0, 1u32 << 31] {
                    let f = f32::from_bits(sign | exponent << 23 | mantissa);
                    let want = FLOAT8_E4M3.from_f32(f) as u8;
                    assert_eq!(f32_to_e4m3_satfinite(f), want, "{f:e}");
                    checked += 1;
                }
            }
        }
        assert!(checked > 20_000);
        assert_eq!(f32_to_e4m3_satfinite(f32::INFINITY), 0x7E);
        assert_eq!(f32_to_e4m3_satfinite(f32::NEG_INFINITY), 0xFE);
        assert_eq!(f32_to_e4m3_satfinite(1e9), 0x7E);
        assert_eq!(f32_to_e4m3_satfinite(-0.0), 0x80);
    }

    #[test]
    fn every_half_widens_exactly_and_narrows_back() {
        for h in 0..=u16::MAX {
            let wide = f16_to_f32(h);
            let reference = FLOAT16.to_f32(h as u32);
            if reference.is_nan() {
                assert!(wide.is_nan(), "{h:#06x}");
                assert_eq!(f32_to_f16(wide), 0x7FFF);
            } else {
                assert_eq!(wide.to_bits(), reference.to_bits(), "{h:#06x}");
                assert_eq!(f32_to_f16(wide), h, "{h:#06x}");
            }
        }
    }

    #[test]
    fn narrowing_rounds_to_nearest_even_as_the_software_conversion() {
        // Every f32 exponent that reaches f16 (and some beyond), with mantissas around the
        // rounding points: exact ties, one ulp either side, and scattered bits.
        let mut checked = 0;
        for exponent in 90u32..=160 {
            for mantissa in (0u32..1 << 23).step_by(4093).chain([
                0x1000, 0x0FFF, 0x1001, 0x3000, 0x2000, 0x7F_E000, 0x7F_F000, 0x7F_FFFF,
            ]) {
                for sign in [0, 1u32 << 31] {
                    let f = f32::from_bits(sign | exponent << 23 | mantissa);
                    let want = FLOAT16.from_f32(f) as u16;
                    assert_eq!(f32_to_f16(f), want, "{f:e} ({:#010x})", f.to_bits());
                    checked += 1;
                }
            }
        }
        assert!(checked > 100_000);
        assert_eq!(f32_to_f16(f32::INFINITY), 0x7C00);
        assert_eq!(f32_to_f16(-0.0), 0x8000);
        assert_eq!(f32_to_f16(f32::from_bits(1)), 0);
    }
}
