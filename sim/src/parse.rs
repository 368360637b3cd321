//! PTX text → [`Program`]: a parser for the LLVM-NVPTX subset symm ships, lowering straight
//! to the pre-decoded [`Inst`] form. Every opcode and modifier combination not implemented
//! is an error naming the line. This module parses the module, its declarations and function
//! bodies; [`lower`] turns each instruction into [`Inst`]s.

mod lower;

use std::collections::HashMap;

use crate::ir::{CallSite, GUARD_NEG, Inst, NO_GUARD, Op, slot};
use crate::lex::{FloatLit, Kind, Tok, parse_float, parse_int, tokenize};

/// A function of a program.
#[derive(Clone, Debug)]
pub(crate) struct Func {
    /// Its PTX name.
    pub name: String,
    /// First instruction (`u32::MAX` while only declared).
    pub start: u32,
    /// One past the last instruction.
    pub end: u32,
    /// Whether it is a `.entry`.
    pub is_entry: bool,
    /// Parameter slots (functions) with their sizes.
    pub params: Vec<(String, u32, u32)>,
    /// The return-value slot, if any.
    pub ret: Option<(String, u32, u32)>,
    /// Whether a body was parsed.
    pub defined: bool,
}

/// A kernel: its function and its parameter layout.
#[derive(Clone, Debug)]
pub(crate) struct Kernel {
    /// Its name.
    pub name: String,
    /// Index into [`Program::funcs`].
    pub func: u32,
    /// Size and alignment per parameter.
    pub params: Vec<crate::ParamInfo>,
    /// Byte offset of each parameter in the parameter buffer.
    pub offsets: Vec<usize>,
    /// Bytes of the parameter buffer.
    pub param_bytes: usize,
}

/// A lowered module.
#[derive(Clone, Debug)]
pub(crate) struct Program {
    /// All instructions of all functions.
    pub code: Vec<Inst>,
    /// The PTX line of each instruction.
    pub lines: Vec<u32>,
    /// Functions in definition order (declared-only ones too).
    pub funcs: Vec<Func>,
    /// The `.entry` functions.
    pub kernels: Vec<Kernel>,
    /// Call sites.
    pub calls: Vec<CallSite>,
    /// The initial register file (constants filled in).
    pub template: Vec<u64>,
    /// The text of each line holding instructions.
    pub line_text: HashMap<u32, Box<str>>,
    /// Module-level `.global`/`.const` variables, in declaration order.
    pub globals: Vec<Global>,
    /// Bytes of local memory each thread needs: every function's `.local` variables at fixed
    /// offsets (there is no recursion, so one frame per function suffices).
    pub local_frame: u64,
}

/// A module-level variable (`.global` or `.const`): its bytes live in host memory owned by the
/// program, at an address fixed when the module is parsed (instructions hold it as a
/// constant); the driver maps the range into the simulated address space while the module is
/// loaded.
#[derive(Clone, Debug)]
pub(crate) struct Global {
    /// Its name in the PTX.
    pub name: String,
    /// Bytes declared.
    pub size: u64,
    /// Address of the first byte (inside `storage`, aligned as declared).
    pub address: u64,
    /// The backing words (shared by clones of the program, so the address stays valid):
    /// held, never read through this field.
    #[expect(dead_code, reason = "owns the bytes at `address`")]
    pub storage: std::sync::Arc<[std::sync::atomic::AtomicU64]>,
}

impl Program {
    /// The function holding instruction `pc`.
    pub fn func_at(&self, pc: u32) -> Option<&Func> {
        self.funcs
            .iter()
            .find(|f| f.defined && f.start <= pc && pc < f.end)
    }
}

type PResult<T> = Result<T, String>;

/// What a name in a scope stands for.
#[derive(Clone, Copy, Debug)]
enum Sym {
    /// A register: slot and declared width (1 = predicate).
    Reg(u32, u8),
    /// A `.param` of a function or a call sequence held in a slot: slot and size in bytes.
    Param(u32, u32),
    /// A kernel parameter: byte offset and size.
    KParam(u32, u32),
    /// A `.local` variable: its address in the local state space.
    Local(u64),
}

/// An operand as written.
#[derive(Clone, Debug)]
enum Opnd<'a> {
    /// A name (register, label, function, parameter, special register).
    Name(&'a str),
    /// An integer literal (two's complement bits).
    Int(u64),
    /// A float literal.
    F32(u32),
    F64(u64),
    /// `[base + off]`.
    Addr(&'a str, i64),
    /// `[imm]`.
    AbsAddr(u64),
    /// `{a, b, ...}` (`_` allowed).
    Vector(Vec<&'a str>),
    /// `(a, b, ...)` (call lists).
    List(Vec<&'a str>),
    /// `!%p` (negated predicate operand).
    NotName(&'a str),
}

/// Names declared in one `{ }` scope: single names and `%r<N>` ranges.
#[derive(Default)]
struct Scope<'a> {
    names: HashMap<&'a str, Sym>,
    /// Range base → (first slot, count, width).
    ranges: HashMap<&'a str, (u32, u32, u8)>,
}

struct Parser<'a> {
    toks: Vec<Tok<'a>>,
    pos: usize,
    prog: Program,
    consts: HashMap<u64, u32>,
    func_index: HashMap<String, u32>,
    /// Pending branch fixups: (instruction, label, line, function).
    branches: Vec<(usize, &'a str, u32)>,
    labels: HashMap<&'a str, u32>,
    scopes: Vec<Scope<'a>>,
    /// The function being parsed.
    cur: u32,
    next_slot: u32,
    /// Call graph edges (caller, callee, line) for the recursion check.
    edges: Vec<(u32, u32, u32)>,
    /// `.branchtargets` lists of the function being parsed, by their label.
    brx_tables: HashMap<&'a str, Vec<&'a str>>,
}

fn err<T>(line: u32, msg: impl std::fmt::Display) -> PResult<T> {
    Err(format!("line {line}: {msg}"))
}

/// Parse and lower `text`.
pub(crate) fn parse(text: &str) -> PResult<Program> {
    let toks = tokenize(text).map_err(|(line, m)| format!("line {line}: {m}"))?;
    let mut p = Parser {
        toks,
        pos: 0,
        prog: Program {
            code: Vec::new(),
            lines: Vec::new(),
            funcs: Vec::new(),
            kernels: Vec::new(),
            calls: Vec::new(),
            template: vec![0; slot::FIRST_FREE as usize],
            line_text: HashMap::new(),
            globals: Vec::new(),
            local_frame: 0,
        },
        brx_tables: HashMap::new(),
        consts: HashMap::new(),
        func_index: HashMap::new(),
        branches: Vec::new(),
        labels: HashMap::new(),
        scopes: Vec::new(),
        cur: 0,
        next_slot: slot::FIRST_FREE,
        edges: Vec::new(),
    };
    p.module()?;
    // Resolve call targets, reject undefined callees and recursion.
    for i in 0..p.prog.calls.len() {
        let f = &p.prog.funcs[p.prog.calls[i].func as usize];
        if !f.defined {
            return Err(format!(
                "function {} is called but not defined in this module",
                f.name
            ));
        }
        p.prog.calls[i].target = f.start;
    }
    check_recursion(&p.prog.funcs, &p.edges)?;
    p.prog.template.resize(p.next_slot as usize, 0);
    compact(&mut p.prog)?;
    let lines: Vec<&str> = text.lines().collect();
    for &l in &p.prog.lines {
        p.prog
            .line_text
            .entry(l)
            .or_insert_with(|| lines.get(l as usize - 1).unwrap_or(&"").trim().into());
    }
    Ok(p.prog)
}

/// The positions in [`Inst::o`] that hold register slots.
fn slot_positions(i: &Inst) -> ([u8; 6], usize) {
    let mut out = [0u8; 6];
    let mut n = 0;
    let mut add = |p: u8| {
        out[n] = p;
        n += 1;
    };
    match i.op {
        Op::Ld | Op::St => {
            for k in 0..i.aux.min(4) {
                add(k);
            }
            add(4);
        }
        Op::Atom => [0, 1, 2, 4].into_iter().for_each(add),
        Op::Bar => [0, 1].into_iter().for_each(add),
        Op::Nanosleep => add(1),
        Op::Bra | Op::Call | Op::Ret | Op::Exit | Op::Trap => {}
        Op::LdKernelParam | Op::GlobalTimer => add(0),
        Op::Pack => {
            for k in 0..=i.aux.min(4) {
                add(k);
            }
        }
        Op::Unpack => {
            for k in 0..i.aux.min(4) {
                add(k);
            }
            add(5);
        }
        _ => [0, 1, 2, 3].into_iter().for_each(add),
    }
    (out, n)
}

/// Renumber register slots in order of first use (the registers a stretch of code uses share
/// cache lines), drop unused ones, and check that every slot lies in the register file.
fn compact(prog: &mut Program) -> PResult<()> {
    let n = prog.template.len();
    let mut map = vec![u32::MAX; n];
    for (s, m) in map.iter_mut().enumerate().take(slot::FIRST_FREE as usize) {
        *m = s as u32;
    }
    let mut next = slot::FIRST_FREE;
    let mut visit = |s: u32, map: &mut Vec<u32>| -> PResult<u32> {
        let m = map
            .get_mut(s as usize)
            .ok_or_else(|| format!("internal error: register slot {s} out of range"))?;
        if *m == u32::MAX {
            *m = next;
            next += 1;
        }
        Ok(*m)
    };
    for pc in 0..prog.code.len() {
        let mut i = prog.code[pc];
        if i.guard != NO_GUARD {
            i.guard = visit(i.guard & !GUARD_NEG, &mut map)? | (i.guard & GUARD_NEG);
        }
        let (pos, k) = slot_positions(&i);
        for &p in &pos[..k] {
            i.o[p as usize] = visit(i.o[p as usize], &mut map)?;
        }
        if i.op == Op::Call {
            let site = &mut prog.calls[i.o[0] as usize];
            for (a, b) in &mut site.args {
                *a = visit(*a, &mut map)?;
                *b = visit(*b, &mut map)?;
            }
            if let Some((a, b)) = &mut site.ret {
                *a = visit(*a, &mut map)?;
                *b = visit(*b, &mut map)?;
            }
        }
        prog.code[pc] = i;
    }
    let mut template = vec![0u64; next as usize];
    for (old, &new) in map.iter().enumerate() {
        if new != u32::MAX {
            template[new as usize] = prog.template[old];
        }
    }
    prog.template = template;
    Ok(())
}

fn check_recursion(funcs: &[Func], edges: &[(u32, u32, u32)]) -> PResult<()> {
    // Depth-first search for a cycle; registers are allocated statically per function.
    let n = funcs.len();
    let mut adj = vec![Vec::new(); n];
    for &(a, b, line) in edges {
        adj[a as usize].push((b, line));
    }
    let mut state = vec![0u8; n];
    fn visit(v: usize, adj: &[Vec<(u32, u32)>], state: &mut [u8], funcs: &[Func]) -> PResult<()> {
        state[v] = 1;
        for &(w, line) in &adj[v] {
            match state[w as usize] {
                1 => {
                    return err(
                        line,
                        format!(
                            "recursive call of {} is not supported",
                            funcs[w as usize].name
                        ),
                    );
                }
                0 => visit(w as usize, adj, state, funcs)?,
                _ => {}
            }
        }
        state[v] = 2;
        Ok(())
    }
    for v in 0..n {
        if state[v] == 0 {
            visit(v, &adj, &mut state, funcs)?;
        }
    }
    Ok(())
}

/// Size in bytes and bits of a type name (without the dot), and whether it is signed /
/// float.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Ty {
    bits: u8,
    signed: bool,
    float: bool,
    pred: bool,
}

fn ty(name: &str) -> Option<Ty> {
    let t = |bits, signed, float| {
        Some(Ty {
            bits,
            signed,
            float,
            pred: false,
        })
    };
    match name {
        "b8" | "u8" => t(8, false, false),
        "s8" => t(8, true, false),
        "b16" | "u16" => t(16, false, false),
        "s16" => t(16, true, false),
        "b32" | "u32" => t(32, false, false),
        "s32" => t(32, true, false),
        "b64" | "u64" => t(64, false, false),
        "s64" => t(64, true, false),
        "f32" => t(32, false, true),
        "f64" => t(64, false, true),
        "pred" => Some(Ty {
            bits: 1,
            signed: false,
            float: false,
            pred: true,
        }),
        _ => None,
    }
}

impl<'a> Parser<'a> {
    fn peek(&self) -> Option<&Tok<'a>> {
        self.toks.get(self.pos)
    }

    fn line(&self) -> u32 {
        self.toks
            .get(self.pos)
            .or(self.toks.last())
            .map_or(0, |t| t.line)
    }

    fn next(&mut self) -> PResult<Tok<'a>> {
        let t = self
            .toks
            .get(self.pos)
            .copied()
            .ok_or_else(|| format!("line {}: unexpected end of text", self.line()))?;
        self.pos += 1;
        Ok(t)
    }

    fn expect(&mut self, p: &str) -> PResult<()> {
        let t = self.next()?;
        if t.is(p) {
            Ok(())
        } else {
            err(t.line, format!("expected `{p}`, found `{}`", t.text))
        }
    }

    fn eat(&mut self, p: &str) -> bool {
        if self.peek().is_some_and(|t| t.is(p)) {
            self.pos += 1;
            true
        } else {
            false
        }
    }

    fn ident(&mut self) -> PResult<Tok<'a>> {
        let t = self.next()?;
        if t.kind == Kind::Ident {
            Ok(t)
        } else {
            err(t.line, format!("expected a name, found `{}`", t.text))
        }
    }

    fn number(&mut self) -> PResult<u64> {
        let t = self.next()?;
        if t.kind == Kind::Num {
            parse_int(t.text).ok_or_else(|| format!("line {}: bad number `{}`", t.line, t.text))
        } else {
            err(t.line, format!("expected a number, found `{}`", t.text))
        }
    }

    fn alloc(&mut self) -> u32 {
        let s = self.next_slot;
        self.next_slot += 1;
        s
    }

    fn konst(&mut self, v: u64) -> u32 {
        if v == 0 {
            return slot::ZERO;
        }
        if let Some(&s) = self.consts.get(&v) {
            return s;
        }
        let s = self.alloc();
        let t = &mut self.prog.template;
        if t.len() <= s as usize {
            t.resize(s as usize + 1, 0);
        }
        t[s as usize] = v;
        self.consts.insert(v, s);
        s
    }

    fn module(&mut self) -> PResult<()> {
        let mut saw_version = false;
        while let Some(t) = self.peek().copied() {
            match t.text {
                ".version" => {
                    self.pos += 1;
                    let v = self.next()?;
                    if v.kind != Kind::Num {
                        return err(v.line, "bad .version");
                    }
                    saw_version = true;
                }
                ".target" => {
                    self.pos += 1;
                    self.ident()?;
                    while self.eat(",") {
                        self.ident()?;
                    }
                }
                ".address_size" => {
                    self.pos += 1;
                    if self.number()? != 64 {
                        return err(t.line, "only .address_size 64 is supported");
                    }
                }
                ".visible" | ".weak" | ".extern" => self.pos += 1,
                ".entry" | ".func" => self.function()?,
                ".global" | ".const" => self.global_decl()?,
                _ => {
                    return err(
                        t.line,
                        format!("unsupported module-level statement `{}`", t.text),
                    );
                }
            }
        }
        if !saw_version {
            return Err("no .version directive: not PTX".into());
        }
        Ok(())
    }

    /// `.param` declaration list items: returns (name, size, align, line).
    fn param_decl(&mut self) -> PResult<(&'a str, u32, u32, u32)> {
        let t = self.ident()?;
        if t.text != ".param" {
            return err(t.line, format!("expected .param, found `{}`", t.text));
        }
        let mut size = 0u32;
        let mut align = 0u32;
        let mut after_ptr = false;
        loop {
            let t = self.ident()?;
            match t.text {
                ".ptr" => after_ptr = true,
                ".global" | ".const" | ".shared" | ".local" if after_ptr => {}
                ".align" => {
                    let n = self.number()? as u32;
                    if !after_ptr {
                        align = n;
                    }
                }
                s if s.starts_with('.') => {
                    let ty = ty(&s[1..])
                        .ok_or_else(|| format!("line {}: unknown .param type {s}", t.line))?;
                    size = (ty.bits as u32).max(8) / 8;
                }
                name => {
                    let mut count = 1;
                    if self.eat("[") {
                        count = self.number()? as u32;
                        self.expect("]")?;
                    }
                    if size == 0 {
                        return err(t.line, "parameter without a type");
                    }
                    let elem = size;
                    if align == 0 {
                        align = elem;
                    }
                    return Ok((name, elem * count, align, t.line));
                }
            }
        }
    }

    fn function(&mut self) -> PResult<()> {
        let kw = self.next()?;
        let is_entry = kw.text == ".entry";
        let mut ret_decl = None;
        if !is_entry && self.eat("(") {
            ret_decl = Some(self.param_decl()?);
            self.expect(")")?;
        }
        let name_tok = self.ident()?;
        let name = name_tok.text;
        let mut params = Vec::new();
        if self.eat("(") && !self.eat(")") {
            loop {
                params.push(self.param_decl()?);
                if self.eat(")") {
                    break;
                }
                self.expect(",")?;
            }
        }
        // Attributes before the body or the `;`.
        loop {
            let Some(t) = self.peek().copied() else {
                return err(
                    name_tok.line,
                    "unexpected end of text after function header",
                );
            };
            match t.text {
                ".noreturn" => self.pos += 1,
                ".maxntid" | ".reqntid" | ".minnctapersm" | ".maxnreg" | ".maxnctapersm" => {
                    self.pos += 1;
                    self.number()?;
                    while self.eat(",") {
                        self.number()?;
                    }
                }
                _ => break,
            }
        }
        // Find or create the function record.
        let index = match self.func_index.get(name) {
            Some(&i) => i,
            None => {
                let i = self.prog.funcs.len() as u32;
                let mut f = Func {
                    name: name.to_string(),
                    start: u32::MAX,
                    end: u32::MAX,
                    is_entry,
                    params: Vec::new(),
                    ret: None,
                    defined: false,
                };
                if !is_entry {
                    for &(pname, size, _, line) in &params {
                        if size > 8 {
                            return err(line, "function parameters over 8 bytes are not supported");
                        }
                        let s = self.alloc();
                        f.params.push((pname.to_string(), s, size));
                    }
                    if let Some((rname, size, _, line)) = ret_decl {
                        if size > 8 {
                            return err(line, "return values over 8 bytes are not supported");
                        }
                        let s = self.alloc();
                        f.ret = Some((rname.to_string(), s, size));
                    }
                }
                self.prog.funcs.push(f);
                self.func_index.insert(name.to_string(), i);
                i
            }
        };
        if self.eat(";") {
            return Ok(());
        }
        let open = self.next()?;
        if !open.is("{") {
            return err(
                open.line,
                format!("expected `{{` or `;`, found `{}`", open.text),
            );
        }
        if self.prog.funcs[index as usize].defined {
            return err(name_tok.line, format!("{name} defined twice"));
        }
        // Parameter names of this definition (they may differ from the declaration's).
        let mut top: HashMap<&'a str, Sym> = HashMap::new();
        if is_entry {
            let mut off = 0usize;
            let mut infos = Vec::new();
            let mut offsets = Vec::new();
            for &(pname, size, align, _) in &params {
                let align = align.max(1) as usize;
                off = off.div_ceil(align) * align;
                top.insert(pname, Sym::KParam(off as u32, size));
                offsets.push(off);
                infos.push(crate::ParamInfo {
                    size: size as usize,
                    align,
                });
                off += size as usize;
            }
            self.prog.kernels.push(Kernel {
                name: name.to_string(),
                func: index,
                params: infos,
                offsets,
                param_bytes: off,
            });
        } else {
            let f = &self.prog.funcs[index as usize];
            if f.params.len() != params.len() {
                return err(name_tok.line, "definition does not match its declaration");
            }
            for (i, &(pname, _, _, _)) in params.iter().enumerate() {
                let (_, s, size) = f.params[i];
                top.insert(pname, Sym::Param(s, size));
            }
            if let (Some((rname, _, _, _)), Some((_, s, size))) = (ret_decl, &f.ret) {
                top.insert(rname, Sym::Param(*s, *size));
            }
        }
        self.cur = index;
        self.scopes = vec![Scope {
            names: top,
            ranges: HashMap::new(),
        }];
        self.labels.clear();
        self.branches.clear();
        self.brx_tables.clear();
        let start = self.prog.code.len() as u32;
        self.prog.funcs[index as usize].start = start;
        self.body()?;
        // Falling off the end returns (exits in a kernel).
        let end_line = self.toks[self.pos - 1].line;
        self.push(Inst::new(Op::Ret, 0), end_line);
        for (at, label, line) in std::mem::take(&mut self.branches) {
            let Some(&target) = self.labels.get(label) else {
                return err(line, format!("undefined label {label}"));
            };
            self.prog.code[at].o[0] = target;
        }
        let f = &mut self.prog.funcs[index as usize];
        f.end = self.prog.code.len() as u32;
        f.defined = true;
        Ok(())
    }

    /// The address of the module variable `name`, if there is one.
    fn global_address(&self, name: &str) -> Option<u64> {
        self.prog
            .globals
            .iter()
            .find(|g| g.name == name)
            .map(|g| g.address)
    }

    /// A module-level `.global`/`.const` variable (the state space token is next):
    /// `[.align N] .type name[\[count\]] [= value | = {v, ...}];`. Integer and float bit
    /// initializers are stored little-endian in elements of the declared type's size;
    /// uninitialized variables are zero.
    fn global_decl(&mut self) -> PResult<()> {
        let space = self.next()?;
        let mut align = 1u64;
        if self.peek().is_some_and(|t| t.text == ".align") {
            self.pos += 1;
            align = self.number()?;
            if !align.is_power_of_two() || align > 256 {
                return err(space.line, format!("bad alignment {align}"));
            }
        }
        let type_tok = self.ident()?;
        let element = match type_tok.text.strip_prefix('.').and_then(ty) {
            Some(t) if !t.pred => u64::from(t.bits / 8).max(1),
            _ => {
                return err(
                    type_tok.line,
                    format!("unsupported variable type {}", type_tok.text),
                );
            }
        };
        let align = align.max(element);
        let name = self.ident()?;
        let mut count: Option<u64> = Some(1);
        if self.eat("[") {
            count = if self.eat("]") {
                None
            } else {
                let n = self.number()?;
                self.expect("]")?;
                Some(n)
            };
        }
        let mut values: Vec<u64> = Vec::new();
        if self.eat("=") {
            let braced = self.eat("{");
            loop {
                let v = match self.operand()? {
                    Opnd::Int(v) => v,
                    Opnd::F32(b) => u64::from(b),
                    Opnd::F64(b) => b,
                    _ => return err(name.line, "unsupported initializer"),
                };
                values.push(v);
                if !braced || self.eat("}") {
                    break;
                }
                self.expect(",")?;
            }
        }
        self.expect(";")?;
        let count = count.unwrap_or(values.len() as u64);
        if values.len() as u64 > count {
            return err(
                name.line,
                format!("{} has more initializers than elements", name.text),
            );
        }
        if self.global_address(name.text).is_some() {
            return err(name.line, format!("{} defined twice", name.text));
        }
        let size = count
            .checked_mul(element)
            .filter(|s| *s <= 1 << 30)
            .ok_or_else(|| format!("line {}: {} is too large", name.line, name.text))?;
        // Words enough for the bytes plus the alignment slack.
        let words = (size + align).div_ceil(8) as usize;
        let storage: std::sync::Arc<[std::sync::atomic::AtomicU64]> =
            (0..words.max(1)).map(|_| Default::default()).collect();
        let base = storage.as_ptr() as u64;
        let address = base.div_ceil(align) * align;
        for (k, v) in values.iter().enumerate() {
            for b in 0..element {
                let byte = (v >> (8 * b)) as u8;
                let at = address - base + k as u64 * element + b;
                let (word, shift) = ((at / 8) as usize, 8 * (at % 8));
                storage[word].fetch_or(
                    u64::from(byte) << shift,
                    std::sync::atomic::Ordering::Relaxed,
                );
            }
        }
        self.prog.globals.push(Global {
            name: name.text.to_string(),
            size,
            address,
            storage,
        });
        Ok(())
    }

    fn push(&mut self, inst: Inst, line: u32) {
        self.prog.code.push(inst);
        self.prog.lines.push(line);
    }

    fn lookup(&self, name: &str) -> Option<Sym> {
        let digits = name.len() - name.trim_end_matches(|c: char| c.is_ascii_digit()).len();
        let (base, index) = name.split_at(name.len() - digits);
        let index: Option<u32> = if digits > 0 { index.parse().ok() } else { None };
        for scope in self.scopes.iter().rev() {
            if let Some(&s) = scope.names.get(name) {
                return Some(s);
            }
            if let Some(i) = index
                && let Some(&(first, n, bits)) = scope.ranges.get(base)
                && i < n
            {
                return Some(Sym::Reg(first + i, bits));
            }
        }
        None
    }

    fn body(&mut self) -> PResult<()> {
        let mut depth = 1;
        loop {
            let t = self.next()?;
            if t.is("{") {
                depth += 1;
                self.scopes.push(Scope::default());
                continue;
            }
            if t.is("}") {
                depth -= 1;
                if depth == 0 {
                    return Ok(());
                }
                self.scopes.pop();
                continue;
            }
            if t.kind != Kind::Ident && !t.is("@") {
                return err(t.line, format!("unexpected `{}`", t.text));
            }
            match t.text {
                ".reg" => self.reg_decl(t.line)?,
                ".param" => {
                    self.pos -= 1;
                    let (name, size, _, line) = self.param_decl()?;
                    if size > 8 {
                        return err(line, "call parameters over 8 bytes are not supported");
                    }
                    self.expect(";")?;
                    let s = self.alloc();
                    self.scopes
                        .last_mut()
                        .expect("scope")
                        .names
                        .insert(name, Sym::Param(s, size));
                }
                ".pragma" => {
                    while !self.eat(";") {
                        self.next()?;
                    }
                }
                ".local" => self.local_decl(t.line)?,
                ".shared" | ".const" | ".global" => {
                    return err(t.line, format!("{} variables are not supported", t.text));
                }
                _ if self.peek().is_some_and(|n| n.is(":")) && !t.is("@") => {
                    self.pos += 1;
                    if self.peek().is_some_and(|n| n.text == ".branchtargets") {
                        self.pos += 1;
                        let mut targets = Vec::new();
                        loop {
                            targets.push(self.ident()?.text);
                            if self.eat(";") {
                                break;
                            }
                            self.expect(",")?;
                        }
                        self.brx_tables.insert(t.text, targets);
                        continue;
                    }
                    if self
                        .labels
                        .insert(t.text, self.prog.code.len() as u32)
                        .is_some()
                    {
                        return err(t.line, format!("label {} defined twice", t.text));
                    }
                }
                _ => {
                    self.pos -= 1;
                    self.instruction()?;
                }
            }
        }
    }

    fn reg_decl(&mut self, line: u32) -> PResult<()> {
        let t = self.ident()?;
        let ty = t
            .text
            .strip_prefix('.')
            .and_then(ty)
            .ok_or_else(|| format!("line {line}: unknown register type {}", t.text))?;
        loop {
            let name = self.ident()?;
            if self.eat("<") {
                let n = self.number()?;
                self.expect(">")?;
                let first = self.next_slot;
                self.next_slot += n as u32;
                self.scopes
                    .last_mut()
                    .expect("scope")
                    .ranges
                    .insert(name.text, (first, n as u32, ty.bits));
            } else {
                let s = self.alloc();
                self.scopes
                    .last_mut()
                    .expect("scope")
                    .names
                    .insert(name.text, Sym::Reg(s, ty.bits));
            }
            if self.eat(";") {
                return Ok(());
            }
            self.expect(",")?;
        }
    }

    /// A `.local` variable of the function being parsed: `[.align N] .type name[count];`,
    /// placed at the next aligned offset of the module's per-thread local frame.
    fn local_decl(&mut self, line: u32) -> PResult<()> {
        let mut align = 1u64;
        if self.peek().is_some_and(|t| t.text == ".align") {
            self.pos += 1;
            align = self.number()?;
            if !align.is_power_of_two() || align > 256 {
                return err(line, format!("bad alignment {align}"));
            }
        }
        let type_tok = self.ident()?;
        let element = match type_tok.text.strip_prefix('.').and_then(ty) {
            Some(t) if !t.pred => u64::from(t.bits / 8).max(1),
            _ => return err(line, format!("unsupported variable type {}", type_tok.text)),
        };
        let name = self.ident()?;
        let mut count = 1u64;
        if self.eat("[") {
            count = self.number()?;
            self.expect("]")?;
        }
        self.expect(";")?;
        let align = align.max(element);
        let size = count
            .checked_mul(element)
            .filter(|s| *s <= 1 << 20)
            .ok_or_else(|| format!("line {line}: {} is too large", name.text))?;
        let offset = self.prog.local_frame.div_ceil(align) * align;
        self.prog.local_frame = offset + size;
        self.scopes
            .last_mut()
            .expect("scope")
            .names
            .insert(name.text, Sym::Local(offset));
        Ok(())
    }

    fn operand(&mut self) -> PResult<Opnd<'a>> {
        let t = self.next()?;
        if t.is("-") {
            let n = self.next()?;
            if n.kind != Kind::Num {
                return err(n.line, "expected a number after `-`");
            }
            if let Some(f) = parse_float(n.text) {
                return Ok(match f {
                    FloatLit::F32(b) => Opnd::F32(b ^ 0x8000_0000),
                    FloatLit::F64(b) => Opnd::F64(b ^ (1 << 63)),
                });
            }
            let v = parse_int(n.text).ok_or_else(|| format!("line {}: bad number", n.line))?;
            return Ok(Opnd::Int(v.wrapping_neg()));
        }
        if t.is("!") {
            let n = self.ident()?;
            return Ok(Opnd::NotName(n.text));
        }
        if t.kind == Kind::Num {
            if let Some(f) = parse_float(t.text) {
                return Ok(match f {
                    FloatLit::F32(b) => Opnd::F32(b),
                    FloatLit::F64(b) => Opnd::F64(b),
                });
            }
            let v = parse_int(t.text).ok_or_else(|| format!("line {}: bad number", t.line))?;
            return Ok(Opnd::Int(v));
        }
        if t.is("[") {
            let b = self.next()?;
            if b.kind == Kind::Num {
                let v = parse_int(b.text).ok_or_else(|| format!("line {}: bad address", b.line))?;
                self.expect("]")?;
                return Ok(Opnd::AbsAddr(v));
            }
            if b.kind != Kind::Ident {
                return err(b.line, "bad address operand");
            }
            let mut off: i64 = 0;
            if self.eat("+") {
                let neg = self.eat("-");
                let v = self.number()? as i64;
                off = if neg { v.wrapping_neg() } else { v };
            } else if self.eat("-") {
                off = (self.number()? as i64).wrapping_neg();
            }
            self.expect("]")?;
            return Ok(Opnd::Addr(b.text, off));
        }
        if t.is("{") {
            let mut v = Vec::new();
            loop {
                // Names, or integer literals (stored as their text: a store of a vector may
                // take immediates, `{%r1, 0}`).
                let e = self.next()?;
                if e.kind != Kind::Ident && e.kind != Kind::Num {
                    return err(e.line, format!("expected a name, found `{}`", e.text));
                }
                v.push(e.text);
                if self.eat("}") {
                    break;
                }
                self.expect(",")?;
            }
            return Ok(Opnd::Vector(v));
        }
        if t.is("(") {
            let mut v = Vec::new();
            if self.eat(")") {
                return Ok(Opnd::List(v));
            }
            loop {
                v.push(self.ident()?.text);
                if self.eat(")") {
                    break;
                }
                self.expect(",")?;
            }
            return Ok(Opnd::List(v));
        }
        if t.kind == Kind::Ident {
            return Ok(Opnd::Name(t.text));
        }
        err(t.line, format!("bad operand `{}`", t.text))
    }

    fn instruction(&mut self) -> PResult<()> {
        let first = self.peek().copied().expect("token");
        let line = first.line;
        let mut guard = NO_GUARD;
        if self.eat("@") {
            let neg = self.eat("!");
            let p = self.ident()?;
            match self.lookup(p.text) {
                Some(Sym::Reg(s, 1)) => guard = s | if neg { GUARD_NEG } else { 0 },
                _ => {
                    return err(
                        line,
                        format!("guard {} is not a predicate register", p.text),
                    );
                }
            }
        }
        let opc = self.ident()?;
        let mut ops = Vec::new();
        if !self.eat(";") {
            loop {
                ops.push(self.operand()?);
                if self.eat(";") {
                    break;
                }
                let t = self.next()?;
                if !t.is(",") {
                    return err(t.line, format!("expected `,` or `;`, found `{}`", t.text));
                }
            }
        }
        let mut parts = opc.text.split('.');
        let base = parts.next().unwrap_or("");
        let mods: Vec<&str> = parts.collect();
        let result = self.lower(base, &mods, &ops, line);
        match result {
            Ok(mut insts) => {
                // A guard applies to every part, unless a part has its own (a branch chain).
                let own_guards = insts.iter().any(|i| i.guard != NO_GUARD);
                if insts.len() > 1 && guard != NO_GUARD && own_guards {
                    return err(line, "guarded multi-part instruction");
                }
                for i in &mut insts {
                    if i.guard == NO_GUARD {
                        i.guard = guard;
                    }
                }
                for i in insts {
                    self.push(i, line);
                }
                Ok(())
            }
            Err(e) => err(line, format!("`{}`: {e}", opc.text)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_small_kernel() {
        let text = ".version 7.8\n.target sm_90\n.address_size 64\n\
.visible .entry k(\n\t.param .u64 .ptr .align 1 k_param_0,\n\t.param .u32 k_param_1\n)\n{\n\
\t.reg .pred %p<2>;\n\t.reg .b32 %r<4>;\n\t.reg .b64 %rd<3>;\n\
\tld.param.b64 %rd1, [k_param_0];\n\tld.param.b32 %r1, [k_param_1];\n\
\tsetp.eq.b32 %p1, %r1, 0;\n\t@%p1 bra $L__BB0_2;\n\tst.b32 [%rd1+4], %r1;\n\
$L__BB0_2:\n\tret;\n}\n";
        let p = parse(text).expect("parses");
        assert_eq!(p.kernels.len(), 1);
        assert_eq!(p.kernels[0].params[0].size, 8);
        assert_eq!(p.kernels[0].params[0].align, 8);
        assert_eq!(p.kernels[0].offsets, [0, 8]);
        assert_eq!(p.code[3].op, Op::Bra);
        assert_eq!(p.code[3].o[0], 5);
    }

    #[test]
    fn rejects_unknown_instructions_with_the_line() {
        let text = ".version 7.8\n.target sm_90\n.address_size 64\n\
.visible .entry k()\n{\n\t.reg .b32 %r<4>;\n\tprmt.b32 %r1, %r2, %r3, 0;\n\tret;\n}\n";
        let e = parse(text).unwrap_err();
        assert!(e.contains("line 7") && e.contains("prmt"), "{e}");
    }
}
