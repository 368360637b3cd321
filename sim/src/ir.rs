//! The pre-decoded instruction form the interpreter executes: every operand is an index into
//! the thread's register file (immediates live in constant slots of the same file), every
//! branch target is an instruction index.

/// The first slots of every register file: special registers and scratch cells.
pub(crate) mod slot {
    /// `%tid.x`, `.y`, `.z`.
    pub const TID: u32 = 0;
    /// `%ntid.x`, `.y`, `.z`.
    pub const NTID: u32 = 3;
    /// `%ctaid.x`, `.y`, `.z`.
    pub const CTAID: u32 = 6;
    /// `%nctaid.x`, `.y`, `.z`.
    pub const NCTAID: u32 = 9;
    /// The carry flag of `add.cc` / `addc` / `sub.cc` / `subc`.
    pub const CC: u32 = 12;
    /// Where the `_` sink writes.
    pub const SINK: u32 = 13;
    /// The constant 0.
    pub const ZERO: u32 = 14;
    /// The generic address of the thread's local memory (where `.local` address 0 is).
    pub const LOCAL_BASE: u32 = 15;
    /// The first slot after the fixed ones.
    pub const FIRST_FREE: u32 = 16;
}

/// No guard predicate.
pub(crate) const NO_GUARD: u32 = u32::MAX;
/// The guard bit meaning `@!%p`.
pub(crate) const GUARD_NEG: u32 = 1 << 31;

/// Comparison codes of `setp` (in [`Inst::flags`]).
pub(crate) mod cmp {
    pub const EQ: u8 = 0;
    pub const NE: u8 = 1;
    pub const LT: u8 = 2;
    pub const LE: u8 = 3;
    pub const GT: u8 = 4;
    pub const GE: u8 = 5;
    /// Unordered variants (floating point): true when either operand is NaN.
    pub const EQU: u8 = 6;
    pub const NEU: u8 = 7;
    pub const LTU: u8 = 8;
    pub const LEU: u8 = 9;
    pub const GTU: u8 = 10;
    pub const GEU: u8 = 11;
    /// Both operands are numbers.
    pub const NUM: u8 = 12;
    /// Either operand is NaN.
    pub const NAN: u8 = 13;
}

/// Memory orderings of loads, stores and atomics (in [`Inst::flags`]).
pub(crate) mod sem {
    /// A plain (weak) access.
    pub const WEAK: u8 = 0;
    /// `.volatile` (treated as `.relaxed.sys`).
    pub const VOLATILE: u8 = 1;
    /// `.relaxed`.
    pub const RELAXED: u8 = 2;
    /// `.acquire`.
    pub const ACQUIRE: u8 = 3;
    /// `.release`.
    pub const RELEASE: u8 = 4;
    /// `.acq_rel`.
    pub const ACQ_REL: u8 = 5;
}

/// Atomic operations (in [`Inst::aux`] of [`Op::Atom`]).
pub(crate) mod atom {
    pub const CAS: u8 = 0;
    pub const EXCH: u8 = 1;
    pub const ADD: u8 = 2;
    pub const AND: u8 = 3;
    pub const OR: u8 = 4;
    pub const XOR: u8 = 5;
    pub const MIN_U: u8 = 6;
    pub const MAX_U: u8 = 7;
    pub const MIN_S: u8 = 8;
    pub const MAX_S: u8 = 9;
    pub const INC: u8 = 10;
    pub const DEC: u8 = 11;
}

/// Reductions of `barrier.red` (in [`Inst::aux`]).
pub(crate) mod red {
    pub const NONE: u8 = 0;
    pub const OR: u8 = 1;
    pub const AND: u8 = 2;
    pub const POPC: u8 = 3;
}

/// What an instruction does. Operands are in [`Inst::o`]; `d` = `o[0]`, `a` = `o[1]`,
/// `b` = `o[2]`, `c` = `o[3]`. Integer widths are in [`Inst::bits`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Op {
    /// `d = a` (masked to `bits`).
    Mov,
    /// `d = a + b`.
    Add,
    /// `d = a - b`.
    Sub,
    /// Carry arithmetic: `flags` bit 0 = add carry-in, bit 1 = write carry-out, bit 2 =
    /// subtract.
    AddSubCarry,
    /// `d = (a * b)` low bits.
    MulLo,
    /// High half, unsigned.
    MulHiU,
    /// High half, signed.
    MulHiS,
    /// `d = a * b` at twice the width, unsigned (`bits` = source width).
    MulWideU,
    /// Signed wide multiply.
    MulWideS,
    /// `d = a * b + c` low bits.
    MadLo,
    /// Unsigned division.
    DivU,
    /// Signed division.
    DivS,
    /// Unsigned remainder.
    RemU,
    /// Signed remainder.
    RemS,
    /// Unsigned minimum.
    MinU,
    /// Signed minimum.
    MinS,
    /// Unsigned maximum.
    MaxU,
    /// Signed maximum.
    MaxS,
    /// Bitwise and (also `.pred`).
    And,
    /// Bitwise or.
    Or,
    /// Bitwise xor.
    Xor,
    /// Bitwise not (`.pred`: `bits` = 1).
    Not,
    /// Two's complement negation.
    Neg,
    /// Shift left (amounts ≥ width give 0).
    Shl,
    /// Logical shift right.
    ShrU,
    /// Arithmetic shift right.
    ShrS,
    /// Funnel shift: `flags` bit 0 = right, bit 1 = clamp (else wrap).
    Shf,
    /// Bit field extract, unsigned.
    BfeU,
    /// Bit field extract, signed.
    BfeS,
    /// Count leading zeros.
    Clz,
    /// Population count.
    Popc,
    /// Unsigned compare (`flags` = cmp code), result 0/1.
    SetpU,
    /// Signed compare.
    SetpS,
    /// f32 compare.
    SetpF32,
    /// f64 compare.
    SetpF64,
    /// `d = c ? a : b`.
    Selp,
    /// Integer conversion: `aux` = source bits, `flags` bit 0 = source signed; `bits` =
    /// destination bits.
    CvtInt,
    /// Integer → f32: `aux` = source bits, `flags` bit 0 = signed.
    CvtF32FromInt,
    /// Integer → f64.
    CvtF64FromInt,
    /// f32 → integer, round toward zero, saturating: `bits` = destination, `flags` bit 0 =
    /// signed.
    CvtIntFromF32,
    /// f64 → integer.
    CvtIntFromF64,
    /// f32 → f64.
    CvtF64FromF32,
    /// f64 → f32 (`.rn`).
    CvtF32FromF64,
    /// `cvt.f32.f16`: exact (NaN: the canonical one).
    CvtF32FromF16,
    /// `cvt.rn.f16.f32`: round to nearest even; overflow gives infinity, NaN `0x7FFF`.
    CvtF16FromF32,
    /// `cvt.rn.satfinite.e4m3x2.f32 d, a, b` (sm_89+): `a` to the high byte, `b` to the low
    /// byte; nearest even, saturating to ±448, NaN `0x7F`.
    CvtE4m3x2FromF32,
    /// `cvt.rn.f16x2.e4m3x2 d, a` (sm_89+): each byte of `a` to binary16 (exact), the high byte
    /// to the high half.
    CvtF16x2FromE4m3x2,
    /// f32 add.
    FAdd32,
    /// f32 subtract.
    FSub32,
    /// f32 multiply.
    FMul32,
    /// f32 divide.
    FDiv32,
    /// f32 fused multiply-add.
    FFma32,
    /// f32 minimum (NaN inputs are missing data).
    FMin32,
    /// f32 maximum.
    FMax32,
    /// f32 negate.
    FNeg32,
    /// f32 absolute value.
    FAbs32,
    /// f64 add.
    FAdd64,
    /// f64 subtract.
    FSub64,
    /// f64 multiply.
    FMul64,
    /// f64 divide.
    FDiv64,
    /// f64 fused multiply-add.
    FFma64,
    /// f64 minimum.
    FMin64,
    /// f64 maximum.
    FMax64,
    /// f64 negate.
    FNeg64,
    /// f64 absolute value.
    FAbs64,
    /// Pack `aux` elements of `bits` each from `o[1..]` into `d`.
    Pack,
    /// Unpack `a` into `aux` elements of `bits` each, written to `o[1..]`... (`o[5]` = source).
    Unpack,
    /// `d = %globaltimer`.
    GlobalTimer,
    /// Load from the kernel's parameters: `o[1]` = byte offset, `bits` = width, `flags` bit
    /// 0 = signed.
    LdKernelParam,
    /// Load from memory: `aux` = vector length, `bits` = element width, `flags` = sem, bit 7
    /// = signed; dests `o[0..4]`, address `o[4]` + offset `o[5]` (as i32).
    Ld,
    /// Store: sources `o[0..4]`, address `o[4]` + offset `o[5]`.
    St,
    /// Atomic: `aux` = atom op, `flags` = sem; `d` = `o[0]`, `b` = `o[1]`, `c` = `o[2]`,
    /// address `o[4]` + offset `o[5]`.
    Atom,
    /// `barrier.sync` / `barrier.red`: `aux` = reduction, `o[0]` = destination, `o[1]` =
    /// predicate source, `flags` bit 0 = negate the predicate, bit 1 = `.aligned`, bit 2 =
    /// `.popc` result.
    Bar,
    /// `nanosleep a`.
    Nanosleep,
    /// Branch to `o[0]`.
    Bra,
    /// Call: `o[0]` = index into [`crate::parse::Program::calls`].
    Call,
    /// Return from a function (exit in a kernel).
    Ret,
    /// Thread exit.
    Exit,
    /// Trap.
    Trap,
}

/// One pre-decoded instruction (32 bytes).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Inst {
    /// The operation.
    pub op: Op,
    /// Operand width in bits (1 for predicates).
    pub bits: u8,
    /// Operation-specific flags.
    pub flags: u8,
    /// Operation-specific extra field.
    pub aux: u8,
    /// Guard predicate slot ([`NO_GUARD`], or a slot with [`GUARD_NEG`]).
    pub guard: u32,
    /// Operands.
    pub o: [u32; 6],
}

impl Inst {
    /// An instruction without operands.
    pub fn new(op: Op, bits: u8) -> Inst {
        Inst {
            op,
            bits,
            flags: 0,
            aux: 0,
            guard: NO_GUARD,
            o: [0; 6],
        }
    }
}

/// A call site: the callee and the `.param` slot copies.
#[derive(Clone, Debug)]
pub(crate) struct CallSite {
    /// The callee's function index.
    pub func: u32,
    /// The callee's first instruction (resolved after parsing).
    pub target: u32,
    /// `(caller slot, callee slot)` per argument.
    pub args: Vec<(u32, u32)>,
    /// `(callee slot, caller slot)` of the return value.
    pub ret: Option<(u32, u32)>,
}
