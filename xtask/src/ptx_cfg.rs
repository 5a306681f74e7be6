//! The control-flow graph of one PTX function: its basic blocks, the branches between them,
//! and the questions the rules of [`crate::ptx_rules`] ask of them: is this instruction in a
//! loop, does every path to that one pass through a third.
//!
//! Blocks start at the function's first statement, at every label and after every branch or
//! exit; a block ends where the next one starts. A `bra` goes to its label (and, when
//! guarded, also falls through); `ret`, `exit` and `trap` end a path (a guarded one also falls
//! through); `brx.idx` goes to every label of its `.branchtargets` table. A `call` returns to
//! the next statement. Directives (`.reg`, `.param`, ...) are statements that do nothing.
//!
//! Path queries follow predicates that hold constants: LLVM often keeps a branch's outcome
//! in a predicate (`mov.pred %p93, -1;` on one way in, `0` on the other) and branches on it
//! in a block both ways share. A path that set `%p93` to true cannot fall through
//! `@%p93 bra`, and [`Cfg::path_avoiding`] does not pretend it can. Constants flow through
//! predicate logic (`and`, `or`, `xor`, `not` of `.pred`s): `or.pred %p17, %p1, %p93;` is
//! true on that path too.

use crate::ptx::{Function, Instruction};
use crate::ptx_flow::{dests, immediate};
use std::collections::{BTreeMap, BTreeSet, HashSet};

/// One basic block: statements `start..end` of the function, and the blocks control may
/// pass to when it leaves this one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Block {
    /// Index in [`Function::instructions`] of the block's first statement.
    pub start: usize,
    /// One past the index of its last statement.
    pub end: usize,
    /// Indices (in [`Cfg::blocks`]) of the blocks that may run next.
    pub succs: Vec<usize>,
    /// The predicate its last statement branches on, if it is a guarded branch.
    cond: Option<Cond>,
}

/// A guarded branch's predicate, and where each outcome goes.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Cond {
    /// The predicate register, without `!`.
    pred: String,
    /// Whether the guard is `@!%p`.
    negated: bool,
    /// Blocks when the guard holds.
    taken: Vec<usize>,
    /// Blocks when it does not.
    not_taken: Vec<usize>,
}

/// What a statement does to predicate registers.
#[derive(Debug, Clone, PartialEq, Eq)]
enum PredWrite {
    /// Nothing.
    None,
    /// Sets one to a constant (`mov.pred %p1, -1;`).
    Const(String, bool),
    /// Sets one from others (`or.pred %p3, %p1, !%p2;`, `not.pred %p4, %p3;`): known on a
    /// path where enough of its operands are.
    Logic(String, LogicOp, Vec<PredOperand>),
    /// Sets these to values not known here.
    Unknown(Vec<String>),
}

/// A predicate operation of [`PredWrite::Logic`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LogicOp {
    And,
    Or,
    Xor,
    Not,
}

/// An operand of a predicate operation: a register, perhaps negated (`!%p2`).
#[derive(Debug, Clone, PartialEq, Eq)]
struct PredOperand {
    pred: String,
    negated: bool,
}

impl LogicOp {
    /// The result, given what is known of the operands (`None`: not known), if it follows.
    fn eval(self, operands: &[Option<bool>]) -> Option<bool> {
        match (self, operands) {
            (LogicOp::Not, [a]) => a.map(|a| !a),
            (LogicOp::And, [a, b]) => match (a, b) {
                (Some(false), _) | (_, Some(false)) => Some(false),
                (Some(true), Some(true)) => Some(true),
                _ => None,
            },
            (LogicOp::Or, [a, b]) => match (a, b) {
                (Some(true), _) | (_, Some(true)) => Some(true),
                (Some(false), Some(false)) => Some(false),
                _ => None,
            },
            (LogicOp::Xor, [Some(a), Some(b)]) => Some(a != b),
            _ => None,
        }
    }
}

/// The control-flow graph of a function. Block 0 is the entry.
#[derive(Debug)]
pub struct Cfg {
    /// The basic blocks, in the order of their statements.
    pub blocks: Vec<Block>,
    /// For each statement of the function, the block holding it.
    block_of: Vec<usize>,
    /// For each block, the blocks reachable from it through at least one edge.
    reach: Vec<BTreeSet<usize>>,
    /// For each statement, what it does to predicates.
    pred_writes: Vec<PredWrite>,
}

impl Cfg {
    /// Builds the graph of `f`'s body.
    pub fn new(f: &Function) -> Cfg {
        let n = f.instructions.len();
        let mut leader = vec![false; n + 1];
        leader[0] = true;
        for &at in f.labels.values() {
            leader[at] = true;
        }
        for (i, ins) in f.instructions.iter().enumerate() {
            if ends_block(ins) {
                leader[i + 1] = true;
            }
        }
        // A label at the very end names an empty block of its own.
        let ends_with_label = f.labels.values().any(|&at| at == n);
        let starts: Vec<usize> = (0..n)
            .filter(|&i| leader[i])
            .chain(ends_with_label.then_some(n))
            .collect();
        let mut block_of = vec![0; n];
        let mut blocks: Vec<Block> = Vec::with_capacity(starts.len());
        for (b, &start) in starts.iter().enumerate() {
            let end = starts.get(b + 1).copied().unwrap_or(n).max(start);
            block_of[start..end].fill(b);
            blocks.push(Block {
                start,
                end,
                succs: Vec::new(),
                cond: None,
            });
        }
        let block_at = |at: usize| -> Option<usize> {
            if at < n {
                Some(block_of[at])
            } else {
                starts.iter().position(|&s| s == n)
            }
        };
        for block in &mut blocks {
            let (start, end) = (block.start, block.end);
            let last = (start < end).then(|| &f.instructions[end - 1]);
            let mut taken = Vec::new();
            let falls_through = match last {
                None => true,
                Some(ins) => {
                    for target in branch_targets(f, ins) {
                        taken.extend(f.labels.get(target).and_then(|&at| block_at(at)));
                    }
                    !ends_block(ins) || ins.guard.is_some()
                }
            };
            let mut next = Vec::new();
            if falls_through && end < n {
                next.push(block_of[end]);
            } else if falls_through && end == n && start < n {
                next.extend(block_at(n));
            }
            let guard = last
                .filter(|i| ends_block(i))
                .and_then(|i| i.guard.as_deref());
            block.cond = guard.map(|g| Cond {
                pred: g.trim_start_matches('!').to_string(),
                negated: g.starts_with('!'),
                taken: taken.clone(),
                not_taken: next.clone(),
            });
            let mut succs: Vec<usize> = taken.into_iter().chain(next).collect();
            succs.sort_unstable();
            succs.dedup();
            block.succs = succs;
        }
        let reach = (0..blocks.len()).map(|b| reachable(&blocks, b)).collect();
        let pred_writes = f.instructions.iter().map(pred_write).collect();
        Cfg {
            blocks,
            block_of,
            reach,
            pred_writes,
        }
    }

    /// The block holding statement `ins` (an index into the function's instructions).
    pub fn block_of(&self, ins: usize) -> usize {
        self.block_of[ins]
    }

    /// Whether blocks `a` and `b` lie on one cycle: each can reach the other (a block on a
    /// loop shares a cycle with itself).
    pub fn same_cycle(&self, a: usize, b: usize) -> bool {
        self.reach[a].contains(&b) && self.reach[b].contains(&a)
    }

    /// Whether some path of execution reaches statement `to` without executing a statement
    /// for which `blocked` holds, starting just after statement `from`, or at the function's
    /// entry when `from` is `None`. `to` itself is reached before it could block.
    ///
    /// "Every path from the entry to `x` passes a `y`" is
    /// `!path_avoiding(None, x, |i| is_y(i))`.
    pub fn path_avoiding(
        &self,
        from: Option<usize>,
        to: usize,
        blocked: impl Fn(usize) -> bool,
    ) -> bool {
        if self.blocks.is_empty() {
            return false;
        }
        // A state is where a path is and the predicates it has set to constants on the way.
        type Known = BTreeMap<String, bool>;
        let mut entered: HashSet<(usize, Known)> = HashSet::new();
        let mut work: Vec<(usize, usize, Known)> = match from {
            Some(i) => vec![(self.block_of[i], i + 1, Known::new())],
            None => {
                entered.insert((0, Known::new()));
                vec![(0, self.blocks[0].start, Known::new())]
            }
        };
        while let Some((b, first, mut known)) = work.pop() {
            let block = &self.blocks[b];
            let mut open = true;
            for i in first..block.end {
                if i == to {
                    return true;
                }
                if blocked(i) {
                    open = false;
                    break;
                }
                match &self.pred_writes[i] {
                    PredWrite::None => {}
                    PredWrite::Const(p, v) => {
                        known.insert(p.clone(), *v);
                    }
                    PredWrite::Logic(p, op, operands) => {
                        let values: Vec<Option<bool>> = operands
                            .iter()
                            .map(|o| known.get(&o.pred).map(|&v| v != o.negated))
                            .collect();
                        match op.eval(&values) {
                            Some(v) => known.insert(p.clone(), v),
                            None => known.remove(p),
                        };
                    }
                    PredWrite::Unknown(ps) => {
                        for p in ps {
                            known.remove(p);
                        }
                    }
                }
            }
            if !open {
                continue;
            }
            let succs = match &block.cond {
                Some(c) => match known.get(&c.pred) {
                    Some(&v) if v != c.negated => &c.taken,
                    Some(_) => &c.not_taken,
                    None => &block.succs,
                },
                None => &block.succs,
            };
            for &s in succs {
                // Past this many states the graph is explored without predicates: a path
                // found then may be one no execution takes, never the other way round.
                let state = if entered.len() < 100_000 {
                    known.clone()
                } else {
                    Known::new()
                };
                if entered.insert((s, state.clone())) {
                    work.push((s, self.blocks[s].start, state));
                }
            }
        }
        false
    }
}

/// What `ins` does to predicate registers.
fn pred_write(ins: &Instruction) -> PredWrite {
    let preds: Vec<String> = dests(ins)
        .into_iter()
        .filter(|d| d.starts_with("%p"))
        .map(str::to_string)
        .collect();
    if preds.is_empty() {
        return PredWrite::None;
    }
    if ins.guard.is_none()
        && ins.op() == "mov"
        && ins.has("pred")
        && preds.len() == 1
        && let Some(v) = ins.operands.get(1).and_then(|o| immediate(o))
    {
        return PredWrite::Const(preds[0].clone(), v != 0);
    }
    let logic = match ins.op() {
        "and" => Some(LogicOp::And),
        "or" => Some(LogicOp::Or),
        "xor" => Some(LogicOp::Xor),
        "not" => Some(LogicOp::Not),
        _ => None,
    };
    if let Some(op) = logic
        && ins.guard.is_none()
        && ins.has("pred")
        && preds.len() == 1
    {
        let operands: Option<Vec<PredOperand>> = ins.operands[1..]
            .iter()
            .map(|o| {
                let o = o.trim();
                let (negated, pred) = match o.strip_prefix('!') {
                    Some(p) => (true, p.trim()),
                    None => (false, o),
                };
                pred.starts_with("%p").then(|| PredOperand {
                    pred: pred.to_string(),
                    negated,
                })
            })
            .collect();
        if let Some(operands) = operands {
            return PredWrite::Logic(preds[0].clone(), op, operands);
        }
    }
    PredWrite::Unknown(preds)
}

/// Whether `ins` ends a basic block: a branch, a return or an exit.
fn ends_block(ins: &Instruction) -> bool {
    matches!(ins.op(), "bra" | "brx" | "ret" | "exit" | "trap")
}

/// Labels `ins` may jump to.
fn branch_targets<'f>(f: &'f Function, ins: &'f Instruction) -> Vec<&'f str> {
    match ins.op() {
        "bra" => ins
            .operands
            .first()
            .map(String::as_str)
            .into_iter()
            .collect(),
        // `brx.idx %r1, $L_brx_0;` names a `$L_brx_0: .branchtargets $L1, $L2;` table.
        "brx" => ins
            .operands
            .last()
            .and_then(|table| f.labels.get(table.as_str()))
            .and_then(|&at| f.instructions.get(at))
            .filter(|t| t.opcode == ".branchtargets")
            .map(|t| t.operands.iter().map(|o| o.trim()).collect())
            .unwrap_or_default(),
        _ => Vec::new(),
    }
}

/// Blocks reachable from `from` through at least one edge.
fn reachable(blocks: &[Block], from: usize) -> BTreeSet<usize> {
    let mut seen = BTreeSet::new();
    let mut work: Vec<usize> = blocks[from].succs.clone();
    while let Some(b) = work.pop() {
        if seen.insert(b) {
            work.extend(&blocks[b].succs);
        }
    }
    seen
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ptx::Module;

    fn function(body: &str) -> Function {
        let text = format!(".visible .entry k()\n{{\n{body}\n}}\n");
        Module::parse(&text).functions.remove(0)
    }

    /// Index of the first statement whose opcode starts with `op`.
    fn at(f: &Function, op: &str) -> usize {
        f.instructions
            .iter()
            .position(|i| i.opcode.starts_with(op))
            .unwrap()
    }

    /// A polling loop as LLVM lays it out: the header after the latch in the text.
    const LOOP: &str = "ld.param.b64 %rd1, [k_param_0];\n\
                        bra.uni $L__BB0_2;\n\
                        $L__BB0_1:\n\
                        ld.acquire.sys.global.u64 %rd2, [%rd1];\n\
                        setp.lt.u64 %p1, %rd2, 5;\n\
                        @%p1 bra $L__BB0_2;\n\
                        bra.uni $L__BB0_3;\n\
                        $L__BB0_2:\n\
                        nanosleep.u32 100;\n\
                        bra.uni $L__BB0_1;\n\
                        $L__BB0_3:\n\
                        st.relaxed.sys.global.u64 [%rd1], %rd2;\n\
                        ret;";

    /// Guards against blocks split in the wrong places or branches sent to the wrong block:
    /// a guarded branch both jumps and falls through, an unguarded one only jumps.
    #[test]
    fn blocks_and_edges() {
        let f = function(LOOP);
        let cfg = Cfg::new(&f);
        let starts: Vec<usize> = cfg.blocks.iter().map(|b| b.start).collect();
        // entry, BB0_1 (load..guarded bra), the fall-through `bra.uni $L__BB0_3`, BB0_2, BB0_3.
        assert_eq!(starts, [0, 2, 5, 6, 8]);
        let succs: Vec<&[usize]> = cfg.blocks.iter().map(|b| b.succs.as_slice()).collect();
        assert_eq!(succs, [&[3][..], &[2, 3], &[4], &[1], &[]]);
    }

    /// Guards against a loop that is not recognised as one when its header comes after its
    /// latch in the text, and against straight-line code taken for a loop.
    #[test]
    fn cycles() {
        let f = function(LOOP);
        let cfg = Cfg::new(&f);
        let load = cfg.block_of(at(&f, "ld.acquire"));
        let sleep = cfg.block_of(at(&f, "nanosleep"));
        let store = cfg.block_of(at(&f, "st.relaxed"));
        assert!(cfg.same_cycle(load, load));
        assert!(cfg.same_cycle(load, sleep));
        assert!(!cfg.same_cycle(store, store));
        assert!(!cfg.same_cycle(0, load));
    }

    /// Guards against a path query that misses a way around the blocker (through a loop's
    /// back edge, or from the middle of a block back to its start), or finds one that
    /// does not exist.
    #[test]
    fn paths_avoiding_a_statement() {
        let f = function(LOOP);
        let cfg = Cfg::new(&f);
        let (load, sleep, store) = (at(&f, "ld.acquire"), at(&f, "nanosleep"), at(&f, "st."));
        // Every path from the entry to the load passes the nanosleep...
        assert!(!cfg.path_avoiding(None, load, |i| i == sleep));
        // ...but not every path from the load to the store (it may exit at once).
        assert!(cfg.path_avoiding(Some(load), store, |i| i == sleep));
        // From the load, around the loop, back to the load without the setp? No: the setp
        // follows the load in its block.
        let setp = at(&f, "setp");
        assert!(!cfg.path_avoiding(Some(load), load, |i| i == setp));
        assert!(cfg.path_avoiding(Some(setp), load, |i| i == store));
        // Nothing follows `ret`.
        assert!(!cfg.path_avoiding(Some(store), load, |_| false));
    }

    /// Guards against a path that no execution takes: a predicate set to a constant decides
    /// the branch on it, as when LLVM merges two ways into one block and branches apart
    /// again on a flag (here: the error way never reaches the store).
    #[test]
    fn constant_predicates_decide_their_branches() {
        let f = function(
            "@%p1 bra $L__ERR;\n\
             st.relaxed.sys.global.u64 [%rd1], %rd2;\n\
             mov.pred %p9, 0;\n\
             bra.uni $L__JOIN;\n\
             $L__ERR:\n\
             mov.pred %p9, -1;\n\
             $L__JOIN:\n\
             @%p9 bra $L__OUT;\n\
             ld.acquire.sys.global.u64 %rd3, [%rd4];\n\
             $L__OUT:\n\
             ret;",
        );
        let cfg = Cfg::new(&f);
        let (store, load) = (at(&f, "st."), at(&f, "ld.acquire"));
        // Every path to the load passes the store: the other way in set %p9.
        assert!(!cfg.path_avoiding(None, load, |i| i == store));
        // Without the constant it would not.
        let unknown = function(&f_text_without_constant());
        let cfg = Cfg::new(&unknown);
        let (store, load) = (at(&unknown, "st."), at(&unknown, "ld.acquire"));
        assert!(cfg.path_avoiding(None, load, |i| i == store));
    }

    /// Guards against losing a constant through predicate logic: LLVM joins an error flag
    /// with another condition (`or.pred %p17, %p1, %p34;`) and branches on the result, so
    /// a path that set the flag must take the branch whatever the other condition is.
    #[test]
    fn constants_flow_through_predicate_logic() {
        let f = function(
            "mov.pred %p34, -1;\n\
             @%p1 bra $L__JOIN;\n\
             st.relaxed.sys.global.u64 [%rd1], %rd2;\n\
             mov.pred %p34, 0;\n\
             $L__JOIN:\n\
             or.pred %p17, %p2, %p34;\n\
             not.pred %p18, %p17;\n\
             @!%p18 bra $L__OUT;\n\
             ld.acquire.sys.global.u64 %rd3, [%rd4];\n\
             $L__OUT:\n\
             ret;",
        );
        let cfg = Cfg::new(&f);
        let (store, load) = (at(&f, "st."), at(&f, "ld.acquire"));
        // The way around the store keeps %p34 true, so %p17 is true and %p18 false: it
        // branches past the load.
        assert!(!cfg.path_avoiding(None, load, |i| i == store));
        // After the store %p34 is false and %p17 unknown: the load is reachable.
        assert!(cfg.path_avoiding(Some(store), load, |_| false));
        // `and` with a false operand is false, whatever the other one is.
        let g = function(
            "mov.pred %p3, 0;\n\
             and.pred %p4, %p3, %p9;\n\
             @%p4 bra $L__OUT;\n\
             bra.uni $L__END;\n\
             $L__OUT:\n\
             ld.acquire.sys.global.u64 %rd3, [%rd4];\n\
             $L__END:\n\
             ret;",
        );
        let cfg = Cfg::new(&g);
        assert!(!cfg.path_avoiding(None, at(&g, "ld.acquire"), |_| false));
    }

    fn f_text_without_constant() -> String {
        "@%p1 bra $L__ERR;\n\
         st.relaxed.sys.global.u64 [%rd1], %rd2;\n\
         mov.pred %p9, 0;\n\
         bra.uni $L__JOIN;\n\
         $L__ERR:\n\
         setp.ne.b32 %p9, %r1, 0;\n\
         $L__JOIN:\n\
         @%p9 bra $L__OUT;\n\
         ld.acquire.sys.global.u64 %rd3, [%rd4];\n\
         $L__OUT:\n\
         ret;"
            .to_string()
    }

    /// Guards against jump tables and labels at the end of a body being dropped.
    #[test]
    fn jump_tables_and_trailing_labels() {
        let f = function(
            "brx.idx %r1, $L_brx_0;\n\
             $L_brx_0: .branchtargets $L__BB0_1, $L__BB0_2;\n\
             $L__BB0_1:\n\
             ret;\n\
             $L__BB0_2:\n\
             @%p1 bra $L__BB0_9;\n\
             exit;\n\
             $L__BB0_9:",
        );
        let cfg = Cfg::new(&f);
        let b1 = cfg.block_of(f.labels["$L__BB0_1"]);
        let b2 = cfg.block_of(f.labels["$L__BB0_2"]);
        assert_eq!(cfg.blocks[0].succs, [b1, b2]);
        let end = cfg.blocks.len() - 1;
        assert_eq!(cfg.blocks[end].start, f.instructions.len());
        assert_eq!(cfg.blocks[b2].succs.len(), 2, "{:?}", cfg.blocks);
        assert!(cfg.blocks[b2].succs.contains(&end));
    }
}
