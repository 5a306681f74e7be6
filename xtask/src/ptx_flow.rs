//! Data flow in one PTX function: where a register's value comes from (which kernel
//! parameter words, which loads or atomics), where an address points, and what a branch's
//! condition is computed from.
//!
//! LLVM's PTX is close to SSA: a virtual register is written once, except for the copies
//! that stand for phi nodes, which write it once per incoming edge. The analysis here is
//! flow-insensitive: a register's value may come from any of its writes. That is what the
//! rules need ("this address can only be the semaphore's inbound counter"; "this branch
//! depends on that load"), and it needs no CFG.
//!
//! Kernel parameters are read with `ld.param` from the parameter's symbol
//! (`<kernel>_param_<i>`) at a byte offset, one scalar (or vector) at a time; a parameter word
//! is such a symbol and offset ([`ParamWord`]).

use crate::ptx::{Function, Instruction, names_in};
use std::collections::{BTreeSet, HashMap};

/// The value of a kernel (or function) parameter at a byte offset, as an `ld.param` reads it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ParamWord {
    /// The parameter's symbol, e.g. `port_pingpong_param_0`.
    pub param: String,
    /// Byte offset of the word within the parameter.
    pub offset: u64,
}

/// Where an address points: a base and a constant byte offset from it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Base {
    /// The value of a parameter word (a pointer held by a handle).
    Param(ParamWord),
    /// The address of a symbol (a parameter's own address, a global).
    Symbol(String),
    /// A register whose value the analysis does not take apart (a computed address).
    Reg(String),
}

/// What a value is computed from, through arithmetic, moves and conversions.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Sources {
    /// Parameter words among its inputs.
    pub params: BTreeSet<ParamWord>,
    /// Memory reads among its inputs: indices of the loads and atomics that produced them
    /// (parameter loads excepted: they are in `params`).
    pub reads: BTreeSet<usize>,
}

/// Def-use facts of one function.
pub struct Flow<'f> {
    f: &'f Function,
    /// For each register, the statements that write it.
    defs: HashMap<&'f str, Vec<usize>>,
}

impl<'f> Flow<'f> {
    /// Indexes the writes of every register of `f`.
    pub fn new(f: &'f Function) -> Flow<'f> {
        let mut defs: HashMap<&str, Vec<usize>> = HashMap::new();
        for (i, ins) in f.instructions.iter().enumerate() {
            if ins.is_directive() {
                continue;
            }
            for d in dests(ins) {
                defs.entry(d).or_default().push(i);
            }
        }
        Flow { f, defs }
    }

    /// The statement at index `i`.
    pub fn ins(&self, i: usize) -> &'f Instruction {
        &self.f.instructions[i]
    }

    /// The parameter words an address operand (`[%rd4]`, `[%rd4+8]`, or a register) is
    /// computed from through address arithmetic alone: moves, additions, `cvta`
    /// conversions and `and` with a constant mask (a pointer loaded from a handle, aligned
    /// down, plus offsets).
    pub fn address_origins(&self, operand: &str) -> BTreeSet<ParamWord> {
        let mut out = BTreeSet::new();
        let mut seen = BTreeSet::new();
        if let Some((name, _)) = split_address(operand) {
            self.address_origins_of(name, &mut seen, &mut out);
        }
        out
    }

    fn address_origins_of(
        &self,
        reg: &'f str,
        seen: &mut BTreeSet<&'f str>,
        out: &mut BTreeSet<ParamWord>,
    ) {
        if !seen.insert(reg) {
            return;
        }
        for &d in self.defs.get(reg).into_iter().flatten() {
            let ins = self.ins(d);
            match ins.op() {
                "ld" if ins.has("param") => out.extend(self.param_word(d, reg)),
                "mov" | "add" | "cvta" => {
                    for r in ins.operands[1..].iter().flat_map(|o| registers(o)) {
                        self.address_origins_of(r, seen, out);
                    }
                }
                // Aligning a pointer down to a slot (`and.b64 %rd2, %rd1, -16`); a mask in
                // a register is not address arithmetic.
                "and" if ins.operands[1..].iter().any(|o| immediate(o).is_some()) => {
                    for r in ins.operands[1..].iter().flat_map(|o| registers(o)) {
                        self.address_origins_of(r, seen, out);
                    }
                }
                _ => {}
            }
        }
    }

    /// Where an address operand points: each base it may be computed from with a constant
    /// offset (`[%rd4+8]` where `%rd4 = add %rd3, 8` and `%rd3` is loaded from a parameter
    /// gives that parameter word, offset 16). A register written from more than one base, or
    /// from anything but moves, constant additions and `cvta`, is its own base.
    pub fn pointer(&self, operand: &str) -> BTreeSet<(Base, i64)> {
        let mut out = BTreeSet::new();
        if let Some((name, off)) = split_address(operand) {
            let mut seen = BTreeSet::new();
            self.pointer_of(name, off, &mut seen, &mut out);
        }
        out
    }

    fn pointer_of(
        &self,
        reg: &'f str,
        off: i64,
        seen: &mut BTreeSet<&'f str>,
        out: &mut BTreeSet<(Base, i64)>,
    ) {
        if !reg.starts_with('%') {
            out.insert((Base::Symbol(reg.to_string()), off));
            return;
        }
        let opaque = (Base::Reg(reg.to_string()), off);
        // `seen` holds the registers on the way here: coming back to one is a loop.
        if !seen.insert(reg) {
            out.insert(opaque);
            return;
        }
        let defs = self.defs.get(reg).map(Vec::as_slice).unwrap_or_default();
        let mut resolved = BTreeSet::new();
        for &d in defs {
            let ins = self.ins(d);
            let srcs = &ins.operands[1..];
            let step = match (ins.op(), srcs) {
                ("ld", _) if ins.has("param") => {
                    self.param_word(d, reg).map(|w| vec![(Base::Param(w), off)])
                }
                ("mov" | "cvta", [src]) if immediate(src).is_none() => {
                    let mut sub = BTreeSet::new();
                    self.pointer_of(src, off, seen, &mut sub);
                    Some(sub.into_iter().collect())
                }
                ("add", [a, b]) => match (immediate(a), immediate(b)) {
                    (None, Some(k)) if a.starts_with('%') => {
                        let mut sub = BTreeSet::new();
                        self.pointer_of(a, off + k, seen, &mut sub);
                        Some(sub.into_iter().collect())
                    }
                    (Some(k), None) if b.starts_with('%') => {
                        let mut sub = BTreeSet::new();
                        self.pointer_of(b, off + k, seen, &mut sub);
                        Some(sub.into_iter().collect())
                    }
                    _ => None,
                },
                _ => None,
            };
            match step {
                Some(bases) => resolved.extend(bases),
                None => {
                    seen.remove(reg);
                    out.insert(opaque);
                    return;
                }
            }
        }
        seen.remove(reg);
        if resolved.is_empty() {
            out.insert(opaque);
        } else {
            out.extend(resolved);
        }
    }

    /// What register `reg`'s value is computed from: parameter words and memory reads,
    /// through any arithmetic (predicates excepted: a value chosen under a condition is not
    /// computed from what the condition tested).
    #[cfg(test)]
    pub fn sources(&self, reg: &str) -> Sources {
        let mut out = Sources::default();
        let mut seen = BTreeSet::new();
        self.sources_of(reg, &mut seen, &mut out);
        out
    }

    /// What every register an operand names is computed from (`{%rd1, %rd2}`, `[%rd3+8]`).
    pub fn operand_sources(&self, operand: &str) -> Sources {
        let mut out = Sources::default();
        let mut seen = BTreeSet::new();
        for r in registers(operand) {
            self.sources_of(r, &mut seen, &mut out);
        }
        out
    }

    fn sources_of<'a>(&'a self, reg: &'a str, seen: &mut BTreeSet<&'a str>, out: &mut Sources) {
        if is_predicate(reg) || !seen.insert(reg) {
            return;
        }
        for &d in self.defs.get(reg).into_iter().flatten() {
            let ins = self.ins(d);
            match ins.op() {
                "ld" if ins.has("param") => out.params.extend(self.param_word(d, reg)),
                "ld" | "atom" | "call" | "tex" | "suld" => {
                    out.reads.insert(d);
                }
                _ => {
                    for o in &ins.operands[1..] {
                        for r in registers(o) {
                            self.sources_of(r, seen, out);
                        }
                    }
                }
            }
        }
    }

    /// What the condition in predicate `pred` is computed from: the [`Sources`] of the
    /// values compared (by `setp`, through `and`/`or`/`not` of predicates and predicate
    /// moves), e.g. the load and the flag of `setp.eq.b32 %p1, %r8, %r26`.
    pub fn condition_sources(&self, pred: &str) -> Sources {
        let mut out = Sources::default();
        let mut seen_preds = BTreeSet::new();
        let mut seen = BTreeSet::new();
        let mut work = vec![pred.trim_start_matches('!')];
        while let Some(p) = work.pop() {
            if !seen_preds.insert(p) {
                continue;
            }
            for &d in self.defs.get(p).into_iter().flatten() {
                for o in &self.ins(d).operands[1..] {
                    for r in registers(o) {
                        if is_predicate(r) {
                            work.push(r);
                        } else {
                            self.sources_of(r, &mut seen, &mut out);
                        }
                    }
                }
            }
        }
        out
    }

    /// The parameter word statement `d` (an `ld.param`) writes into `reg`.
    fn param_word(&self, d: usize, reg: &str) -> Option<ParamWord> {
        let ins = self.ins(d);
        let elem = dest_elements(ins).iter().position(|e| *e == reg)? as u64;
        let bytes = elem_bits(ins).unwrap_or(64) as u64 / 8;
        let (name, off) = split_address(ins.operands.get(1)?)?;
        // `[%rd1+8]` where `%rd1` holds the parameter's address (`mov.b64 %rd1, k_param_0`).
        let (param, base) = if name.starts_with('%') {
            let mut bases = self.pointer(name).into_iter();
            match (bases.next(), bases.next()) {
                (Some((Base::Symbol(sym), k)), None) => (sym, k),
                _ => return None,
            }
        } else {
            (name.to_string(), 0)
        };
        let offset = u64::try_from(base + off).ok()? + elem * bytes;
        Some(ParamWord { param, offset })
    }
}

/// Registers an instruction writes: its first operand, for instructions that write one
/// (`{%rd1, %rd2}` for a vector, `%p1|%p2` for a `setp` pair; `_` is a discarded element).
pub fn dests(ins: &Instruction) -> Vec<&str> {
    if ins.is_directive() || !writes_first_operand(ins) {
        return Vec::new();
    }
    dest_elements(ins)
        .into_iter()
        .filter(|d| d.starts_with('%'))
        .collect()
}

/// The elements of the first operand, in order (`_` kept, so positions match a vector).
fn dest_elements(ins: &Instruction) -> Vec<&str> {
    let Some(first) = ins.operands.first() else {
        return Vec::new();
    };
    first
        .trim_matches(|c| c == '{' || c == '}')
        .split([',', '|'])
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect()
}

/// Whether `ins`'s first operand is a register it writes.
fn writes_first_operand(ins: &Instruction) -> bool {
    !matches!(
        ins.op(),
        "st" | "red"
            | "bra"
            | "brx"
            | "ret"
            | "exit"
            | "trap"
            | "call"
            | "bar"
            | "barrier"
            | "fence"
            | "membar"
            | "nanosleep"
            | "prefetch"
            | "prefetchu"
    ) && ins
        .operands
        .first()
        .is_some_and(|o| !o.starts_with('[') && !o.starts_with('('))
}

/// Register names (`%...`) an operand mentions, `%SP`-style frame registers included.
fn registers(operand: &str) -> impl Iterator<Item = &str> {
    names_in(operand).filter(|n| n.starts_with('%'))
}

fn is_predicate(reg: &str) -> bool {
    reg.starts_with("%p")
}

/// `[%rd4+8]` → (`%rd4`, 8); `[k_param_0]` → (`k_param_0`, 0); `%rd4` → (`%rd4`, 0).
pub fn split_address(operand: &str) -> Option<(&str, i64)> {
    let inner = operand.trim().trim_start_matches('[').trim_end_matches(']');
    let inner = inner.trim();
    let (name, off) = match inner.find(['+', '-']) {
        Some(at) if at > 0 => {
            let off = inner[at..].trim_start_matches('+').replace(' ', "");
            (inner[..at].trim(), off.parse().ok()?)
        }
        _ => (inner, 0),
    };
    (!name.is_empty() && immediate(name).is_none()).then_some((name, off))
}

/// The value of an integer literal operand (`8`, `-8`, `0x10`), if it is one.
pub fn immediate(operand: &str) -> Option<i64> {
    let s = operand.trim();
    let (neg, digits) = match s.strip_prefix('-') {
        Some(d) => (true, d),
        None => (false, s),
    };
    let v = if let Some(hex) = digits
        .strip_prefix("0x")
        .or_else(|| digits.strip_prefix("0X"))
    {
        i64::from_str_radix(hex.trim_end_matches(['U', 'u']), 16).ok()?
    } else {
        digits.trim_end_matches(['U', 'u']).parse::<i64>().ok()?
    };
    Some(if neg { -v } else { v })
}

/// Element width in bits, from the type modifier (`u64`, `b32`, `f16`, ...).
pub fn elem_bits(ins: &Instruction) -> Option<u32> {
    ins.opcode.rsplit('.').find_map(|m| {
        let (kind, bits) = m.split_at(1.min(m.len()));
        matches!(kind, "u" | "s" | "b" | "f")
            .then(|| bits.parse().ok())
            .flatten()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ptx::Module;

    fn function(body: &str) -> Function {
        let text =
            format!(".visible .entry k(\n.param .align 8 .b8 k_param_0[104]\n)\n{{\n{body}\n}}\n");
        Module::parse(&text).functions.remove(0)
    }

    fn word(offset: u64) -> ParamWord {
        ParamWord {
            param: "k_param_0".into(),
            offset,
        }
    }

    fn index_of(f: &Function, op: &str) -> usize {
        f.instructions
            .iter()
            .position(|i| i.opcode.starts_with(op))
            .unwrap()
    }

    /// Guards against an address taken for a handle's field when it only passed near one:
    /// moves, `cvta` and constant additions keep the base, a computed index does not.
    #[test]
    fn pointers_follow_moves_and_constant_offsets() {
        let f = function(
            "ld.param.b64 %rd1, [k_param_0+80];\n\
             cvta.to.global.u64 %rd2, %rd1;\n\
             add.s64 %rd3, %rd2, 8;\n\
             mov.b64 %rd4, %rd3;\n\
             add.s64 %rd5, %rd4, %rd9;\n\
             ld.acquire.sys.global.u64 %rd6, [%rd4+8];",
        );
        let flow = Flow::new(&f);
        let p = |o: &str| flow.pointer(o).into_iter().collect::<Vec<_>>();
        assert_eq!(p("[%rd4+8]"), [(Base::Param(word(80)), 16)]);
        assert_eq!(p("[%rd1]"), [(Base::Param(word(80)), 0)]);
        assert_eq!(p("[%rd5]"), [(Base::Reg("%rd5".into()), 0)]);
        // Address arithmetic: the computed address still comes from the field.
        assert_eq!(
            flow.address_origins("[%rd5]")
                .into_iter()
                .collect::<Vec<_>>(),
            [word(80)]
        );
        // A loaded pointer is not the field it was loaded through.
        assert!(flow.address_origins("%rd6").is_empty());
    }

    /// Guards against a copy's slots losing their buffer when the pointer is aligned down
    /// first (`dst & !15`), and a register mask passing for alignment.
    #[test]
    fn address_origins_follow_alignment_masks() {
        let f = function(
            "ld.param.b64 %rd1, [k_param_0+56];
             and.b64 %rd2, %rd1, -16;
             add.s64 %rd3, %rd2, %rd9;
             and.b64 %rd4, %rd1, %rd8;",
        );
        let flow = Flow::new(&f);
        let origins = |o: &str| flow.address_origins(o).into_iter().collect::<Vec<_>>();
        assert_eq!(origins("[%rd3]"), [word(56)]);
        assert!(origins("[%rd4]").is_empty());
    }

    /// Guards against phi copies hiding where a pointer comes from, or making two fields
    /// look like one.
    #[test]
    fn registers_written_twice_have_every_origin() {
        let f = function(
            "ld.param.b64 %rd1, [k_param_0];\n\
             ld.param.b64 %rd2, [k_param_0+56];\n\
             mov.b64 %rd3, %rd1;\n\
             mov.b64 %rd3, %rd2;\n\
             add.s64 %rd4, %rd4, 8;\n\
             mov.b64 %rd4, %rd1;",
        );
        let flow = Flow::new(&f);
        let got: Vec<_> = flow.pointer("[%rd3]").into_iter().collect();
        assert_eq!(got, [(Base::Param(word(0)), 0), (Base::Param(word(56)), 0)]);
        // An induction variable is its own base, not the field plus any offset.
        assert!(
            flow.pointer("[%rd4]")
                .contains(&(Base::Reg("%rd4".into()), 8))
        );
    }

    /// Guards against vector and indirect parameter loads read as the wrong word.
    #[test]
    fn parameter_words_of_vector_and_indirect_loads() {
        let f = function(
            "ld.param.v2.b64 {%rd1, %rd2}, [k_param_0+16];\n\
             mov.b64 %rd3, k_param_0;\n\
             ld.param.b32 %r1, [%rd3+40];\n\
             ld.param.v4.b32 {%r2, _, %r3, %r4}, [k_param_0+48];",
        );
        let flow = Flow::new(&f);
        let params = |r: &str| flow.sources(r).params.into_iter().collect::<Vec<_>>();
        assert_eq!(params("%rd1"), [word(16)]);
        assert_eq!(params("%rd2"), [word(24)]);
        assert_eq!(params("%r1"), [word(40)]);
        assert_eq!(params("%r3"), [word(56)]);
        assert_eq!(params("%r4"), [word(60)]);
    }

    /// Guards against a stored value credited to a parameter it was only compared with,
    /// and against loads being looked through.
    #[test]
    fn value_sources_stop_at_loads_and_predicates() {
        let f = function(
            "ld.param.b32 %r1, [k_param_0+96];\n\
             ld.param.b64 %rd1, [k_param_0+56];\n\
             ld.b32 %rd2, [%rd1];\n\
             cvt.u64.u32 %rd3, %r1;\n\
             shl.b64 %rd4, %rd3, 32;\n\
             or.b64 %rd5, %rd4, %rd2;\n\
             setp.eq.b32 %p1, %r1, 7;\n\
             selp.b64 %rd6, %rd2, 0, %p1;",
        );
        let flow = Flow::new(&f);
        let s = flow.sources("%rd5");
        assert_eq!(s.params.into_iter().collect::<Vec<_>>(), [word(96)]);
        assert_eq!(
            s.reads.into_iter().collect::<Vec<_>>(),
            [index_of(&f, "ld.b32")]
        );
        assert!(flow.sources("%rd6").params.is_empty());
        assert_eq!(
            flow.operand_sources("{%rd5, %rd6}").reads.len(),
            1,
            "one load feeds both"
        );
    }

    /// Guards against a branch missed as depending on a load (through unpacking, a
    /// comparison and predicate logic), or credited to a value that was only stored.
    #[test]
    fn conditions_reach_back_to_loads_and_parameters() {
        let f = function(
            "ld.param.b32 %r7, [k_param_0+96];\n\
             ld.relaxed.sys.global.u64 %rd1, [%rd9];\n\
             mov.b64 {_, %r1}, %rd1;\n\
             setp.eq.b32 %p1|%p2, %r1, %r7;\n\
             st.b32 [%rd8], %r1;\n\
             ld.b32 %r2, [%rd8];\n\
             setp.ne.b32 %p3, %r2, 0;\n\
             and.pred %p4, %p1, %p3;\n\
             @!%p4 bra $L__BB0_1;\n\
             $L__BB0_1:\n\
             ret;",
        );
        let flow = Flow::new(&f);
        let c = flow.condition_sources("!%p4");
        assert_eq!(c.params.into_iter().collect::<Vec<_>>(), [word(96)]);
        let reads: Vec<_> = c.reads.into_iter().collect();
        assert_eq!(reads, [1, 5]);
        assert_eq!(flow.condition_sources("%p1").reads.len(), 1);
    }

    /// Guards against offsets and literals misread (`[%rd1+-8]`, hex), and a literal
    /// address taken for a register.
    #[test]
    fn literals_and_addresses() {
        assert_eq!(immediate("8"), Some(8));
        assert_eq!(immediate("-8"), Some(-8));
        assert_eq!(immediate("0x10"), Some(16));
        assert_eq!(immediate("%rd1"), None);
        assert_eq!(split_address("[%rd1+-8]"), Some(("%rd1", -8)));
        assert_eq!(split_address("[k_param_0+80]"), Some(("k_param_0", 80)));
        assert_eq!(split_address("[%rd2]"), Some(("%rd2", 0)));
        assert_eq!(split_address("%rd2"), Some(("%rd2", 0)));
        assert_eq!(split_address("[8]"), None);
    }
}
