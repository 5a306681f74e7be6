//! Memory-model rules checked on the emitted PTX.
//!
//! Scopes and orderings are where GPU communication code breaks without a sound: a FIFO
//! publish at `.gpu` scope works until the proxy on the host reads a half-written trigger, a
//! `fence.sc` where acquire/release was meant costs a full system fence per message. The
//! device code writes these accesses as inline PTX in `arch::atomic`; these rules check that
//! what reaches the PTX is what the protocols need.
//!
//! Rules on every function of a module:
//! - `fence-sc`: no `fence.sc` (nor `membar`, its synonym): a release or acquire is meant;
//! - `local-atomic`: no `atom` / `red` on local memory, whether through `.local` or through a
//!   generic address computed from the stack frame (rust#146686);
//! - `vector-release`: no release vector store: the PTX memory model orders no element of a
//!   vector access before another, so a reader that acquires one element may miss the rest.
//!
//! Rules on every kernel, bound to the protocols' own accesses: each is found through the
//! kernel's parameters (a handle's words at the byte offsets [`crate::layouts`] takes from
//! the device crate), by data flow ([`crate::ptx_flow`]) to the address it touches, and
//! checked for order on the control-flow graph ([`crate::ptx_cfg`]):
//! - `fifo-publish`: every store into a FIFO's slots is half of a publish: a relaxed
//!   system-scope 64-bit store of the first word, then, on every path, a release system-scope
//!   64-bit store of the second word (the commit bit) at slot + 8, into the slot claimed by a
//!   device-scope `atom.add` on the FIFO's head that every path passes first;
//! - `signal`: a semaphore signal is a system-scope atomic add on the peer's inbound counter
//!   (a store of a count loses concurrent signals);
//! - `barrier-count`: as many block barriers as the kernel's source has barrier sites (see
//!   [`crate::barrier_sites`]); more means one was duplicated (rust-lang/rust#137086).
//!
//! Each [`Need`] that [`EXPECTATIONS`] lists for a kernel must be present, and is found the
//! same way (a semaphore wait is an acquire poll of an `inbound` counter, not any acquire
//! load; a wide copy is a loop of 128-bit global loads and stores between channel buffers,
//! not any vector access); an expectation that matches no kernel fails the check.
//! [`EXPECTATIONS`] names the shipped kernels, so it applies to their crate only
//! ([`expectations_for`]); the kernels of other kernel crates of the workspace (the
//! examples') get the rules on every kernel.
//!
//! The protocol accesses are looked for in the kernel's own body, where `#[inline(always)]`
//! puts them; the device functions it calls out of line (the cold failure paths) are only
//! under the module-wide rules, and count for `barrier-count`.

use crate::kernels::KernelFn;
use crate::layouts::{self, Field, Word};
use crate::ptx::{Function, Instruction, Module, names_in};
use crate::ptx_cfg::Cfg;
use crate::ptx_flow::{Base, Flow, ParamWord, Sources, elem_bits};
use std::collections::BTreeSet;
use std::fmt;

/// A protocol step a kernel must contain.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Need {
    /// Publishes a FIFO trigger: the pair of stores of the `fifo-publish` rule.
    FifoPublish,
    /// Waits for the proxy to execute a pushed trigger (`sync`, a flush): an acquire
    /// system-scope poll of the FIFO's `tail` that every path reaches through a publish.
    FifoSync,
    /// Waits on a semaphore: an acquire system-scope 64-bit load of a semaphore's `inbound`
    /// counter, polled (a branch of a loop around it depends on the value).
    SemaphoreWait,
    /// Signals a peer with release: `red.release.sys.global.add.u64` (or a release or
    /// acq_rel `atom`) on a semaphore's `remote_inbound` counter.
    ReleaseSignal,
    /// Signals a peer without ordering: a relaxed system-scope add on `remote_inbound`.
    RelaxedSignal,
    /// A memory channel `put`: a store into the `remote` buffer of a value loaded from the
    /// `local` one.
    MemoryPut,
    /// A memory channel `get`: a store into the `local` buffer of a value loaded from the
    /// `remote` one.
    MemoryGet,
    /// A copy between channel buffers 16 bytes at a time: in a loop, a weak 128-bit global
    /// store (`st.global.v2.u64` or `.v4.u32`) into a `remote` or `local` buffer of the value
    /// of a weak 128-bit global load (`ld.global.v2.u64` or `.v4.u32`) of one, in the same
    /// loop. Two 8-byte accesses per 16 bytes, or generic ones, are not it.
    WideCopy,
    /// Writes LL8 packets: every store of the flag into a `remote` buffer is one relaxed
    /// system-scope or volatile 8-byte store whose high word is the flag (`st.relaxed.sys`
    /// `.global.u64`, `st.volatile.global.v2.u32`), and there is at least one.
    Ll8Store,
    /// Writes LL16 packets: as [`Need::Ll8Store`] with one 16-byte store whose two halves
    /// each carry the flag (`st.volatile.global.v2.u64`).
    Ll16Store,
    /// Reads LL8 packets: an 8-byte relaxed system-scope or volatile load of a `packets`
    /// buffer, polled until its flag equals the kernel's flag.
    Ll8Poll,
    /// Reads LL16 packets: as [`Need::Ll8Poll`] with a 16-byte load.
    Ll16Poll,
    /// Publishes a block's copy: every path from a store into a `remote` buffer to a
    /// release signal passes a block barrier, so the signalling thread's release covers
    /// every thread's share.
    BarrierBeforeSignal,
}

impl Need {
    /// What the step looks like, for messages.
    pub fn describe(self) -> &'static str {
        match self {
            Need::FifoPublish => {
                "a FIFO publish (`st.relaxed.sys.global.u64` [slot], then \
                 `st.release.sys.global.u64` [slot+8], after the head's `atom.add`)"
            }
            Need::FifoSync => {
                "a FIFO sync (`ld.acquire.sys.global.u64` of the FIFO's `tail` in a polling loop, \
                 after the publish)"
            }
            Need::SemaphoreWait => {
                "a semaphore wait (`ld.acquire.sys.global.u64` of a semaphore's `inbound` in a \
                 polling loop)"
            }
            Need::ReleaseSignal => {
                "a release signal (`red.release.sys.global.add.u64` on a semaphore's \
                 `remote_inbound`)"
            }
            Need::RelaxedSignal => {
                "a relaxed signal (`red.relaxed.sys.global.add.u64` on a semaphore's \
                 `remote_inbound`)"
            }
            Need::MemoryPut => "a put (a store into a `remote` buffer of data loaded from `local`)",
            Need::MemoryGet => "a get (a store into a `local` buffer of data loaded from `remote`)",
            Need::WideCopy => {
                "a 128-bit copy loop (`ld.global.v2.u64` then `st.global.v2.u64`, or `.v4.u32`, \
                 between channel buffers, in a loop)"
            }
            Need::Ll8Store => {
                "an 8-byte packet store with the flag (`st.relaxed.sys.global.u64` or \
                 `st.volatile.global.v2.u32` into a `remote` buffer)"
            }
            Need::Ll16Store => {
                "a 16-byte packet store with a flag in each half (`st.volatile.global.v2.u64` \
                 into a `remote` buffer)"
            }
            Need::Ll8Poll => {
                "an 8-byte packet poll (`ld.relaxed.sys.global.u64` of a `packets` buffer in a \
                 loop that compares the flag)"
            }
            Need::Ll16Poll => {
                "a 16-byte packet poll (`ld.volatile.global.v2.u64` of a `packets` buffer in a \
                 loop that compares the flag)"
            }
            Need::BarrierBeforeSignal => {
                "a block barrier on every path from the data stores into a `remote` buffer to \
                 the release signal"
            }
        }
    }
}

/// Which kernels must contain which protocol steps: the kernel names (exact, or a prefix
/// followed by `*`) and the steps. The first matching line applies.
#[derive(Clone, Copy, Debug)]
pub struct Expectation {
    /// Kernel name, or name prefix followed by `*`.
    pub kernels: &'static str,
    /// Steps every matching kernel must contain.
    pub needs: &'static [Need],
}

/// The kernel crate whose kernels [`EXPECTATIONS`] names.
pub const SHIPPED_KERNELS: &str = "oxccl-kernels";

/// The expectations the module of kernel crate `package` is checked against:
/// [`EXPECTATIONS`] for the shipped kernels ([`SHIPPED_KERNELS`]), none for any other kernel
/// crate of the workspace (an example's), whose kernels get the rules on every kernel only.
/// Applying the shipped kernels' lines to another crate would fail its module for every
/// shipped kernel it does not hold (`unmatched-expectation`).
pub fn expectations_for(package: &str) -> &'static [Expectation] {
    if package == SHIPPED_KERNELS {
        EXPECTATIONS
    } else {
        &[]
    }
}

/// The kernels shipped in `oxccl-kernels` and what each must contain. Port-channel kernels
/// signal through the FIFO (the proxy raises the peer's semaphore), memory-channel kernels
/// raise the peer's semaphore themselves, LL kernels signal with the flag inside each packet.
/// The probes (`kernels::probes`) hold one primitive each.
pub const EXPECTATIONS: &[Expectation] = &[
    // port_ring_exchange, port_pingpong: they end with a flush.
    Expectation {
        kernels: "port_*",
        needs: &[Need::FifoPublish, Need::FifoSync, Need::SemaphoreWait],
    },
    // One port channel putting between two pairs of memories, then a flush and waits.
    Expectation {
        kernels: "put_between_memories",
        needs: &[Need::FifoPublish, Need::FifoSync, Need::SemaphoreWait],
    },
    // Threads of the block copy, thread 0 signals.
    Expectation {
        kernels: "memory_ring_exchange",
        needs: &[
            Need::MemoryPut,
            Need::WideCopy,
            Need::ReleaseSignal,
            Need::SemaphoreWait,
            Need::BarrierBeforeSignal,
        ],
    },
    // memory_pingpong: one thread writes, then signals.
    Expectation {
        kernels: "memory_*",
        needs: &[Need::ReleaseSignal, Need::SemaphoreWait],
    },
    // ring_all_reduce_sum_f32 and its siblings: collectives over memory channels.
    Expectation {
        kernels: "ring_all_reduce_*",
        needs: &[
            Need::MemoryPut,
            Need::WideCopy,
            Need::ReleaseSignal,
            Need::SemaphoreWait,
            Need::BarrierBeforeSignal,
        ],
    },
    Expectation {
        kernels: "ll8_*",
        needs: &[Need::Ll8Store, Need::Ll8Poll],
    },
    Expectation {
        kernels: "ll16_*",
        needs: &[Need::Ll16Store, Need::Ll16Poll],
    },
    // packet_all_reduce_sum_f32: every value travels as an LL16 packet.
    Expectation {
        kernels: "packet_all_reduce_*",
        needs: &[Need::Ll16Store, Need::Ll16Poll],
    },
    Expectation {
        kernels: "probe_fifo_push",
        needs: &[Need::FifoPublish],
    },
    Expectation {
        kernels: "probe_fifo_push_sync",
        needs: &[Need::FifoPublish, Need::FifoSync],
    },
    Expectation {
        kernels: "probe_port_put",
        needs: &[Need::FifoPublish],
    },
    Expectation {
        kernels: "probe_port_signal",
        needs: &[Need::FifoPublish],
    },
    Expectation {
        kernels: "probe_port_put_with_signal",
        needs: &[Need::FifoPublish],
    },
    Expectation {
        kernels: "probe_port_put_with_signal_and_flush",
        needs: &[Need::FifoPublish, Need::FifoSync],
    },
    Expectation {
        kernels: "probe_port_flush",
        needs: &[Need::FifoPublish, Need::FifoSync],
    },
    Expectation {
        kernels: "probe_port_wait",
        needs: &[Need::SemaphoreWait],
    },
    Expectation {
        kernels: "probe_semaphore_wait",
        needs: &[Need::SemaphoreWait],
    },
    // The copy's loop moves 16 bytes per load and per store, as MSCCL++'s does.
    Expectation {
        kernels: "probe_memory_put",
        needs: &[Need::MemoryPut, Need::WideCopy],
    },
    Expectation {
        kernels: "probe_memory_get",
        needs: &[Need::MemoryGet, Need::WideCopy],
    },
    Expectation {
        kernels: "probe_memory_signal",
        needs: &[Need::ReleaseSignal],
    },
    Expectation {
        kernels: "probe_memory_relaxed_signal",
        needs: &[Need::RelaxedSignal],
    },
    Expectation {
        kernels: "probe_memory_wait",
        needs: &[Need::SemaphoreWait],
    },
    Expectation {
        kernels: "probe_ll8_put_packets",
        needs: &[Need::Ll8Store],
    },
    Expectation {
        kernels: "probe_ll8_unpack_packets",
        needs: &[Need::Ll8Poll],
    },
    Expectation {
        kernels: "probe_ll8_write",
        needs: &[Need::Ll8Store],
    },
    Expectation {
        kernels: "probe_ll8_read",
        needs: &[Need::Ll8Poll],
    },
    Expectation {
        kernels: "probe_ll16_put_packets",
        needs: &[Need::Ll16Store],
    },
    Expectation {
        kernels: "probe_ll16_unpack_packets",
        needs: &[Need::Ll16Poll],
    },
    Expectation {
        kernels: "probe_ll16_write",
        needs: &[Need::Ll16Store],
    },
    Expectation {
        kernels: "probe_ll16_read",
        needs: &[Need::Ll16Poll],
    },
];

/// One broken rule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    /// Short rule name, e.g. `fence-sc`.
    pub rule: &'static str,
    /// Function (or kernel) where it was found or is missing.
    pub function: String,
    /// 1-based PTX line of the offending instruction, or of the kernel for a missing one.
    pub line: usize,
    /// What is wrong and what to do.
    pub message: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "[{}] `{}` (line {}): {}",
            self.rule, self.function, self.line, self.message
        )
    }
}

/// The outcome of [`check`]: violations, and notes on what could not be checked.
#[derive(Debug, Default)]
pub struct Report {
    /// Broken rules; empty if the module passes.
    pub violations: Vec<Violation>,
    /// Informational lines, e.g. kernels that no expectation names.
    pub notes: Vec<String>,
}

/// Checks `module` against the module-wide rules, the kernel rules and `expectations`.
/// `kernels` are the kernels of its sources (their parameters and barrier sites); a kernel
/// of the module that is not among them has no protocol words, so none of its needs can be
/// found.
pub fn check(module: &Module, kernels: &[KernelFn], expectations: &[Expectation]) -> Report {
    let mut report = Report::default();
    for f in &module.functions {
        check_function(f, &mut report.violations);
    }
    for entry in module.entries() {
        let source = kernels.iter().find(|k| k.name == entry.name);
        let k = Kernel::new(module, entry, source);
        let exp = expectations
            .iter()
            .find(|e| name_matches(e.kernels, &entry.name));
        k.check(exp, &mut report.violations);
        if exp.is_none() {
            report.notes.push(format!(
                "kernel `{}` matches no line of EXPECTATIONS: only the rules on every kernel apply",
                entry.name
            ));
        }
    }
    for e in expectations {
        if !module.entries().any(|k| name_matches(e.kernels, &k.name)) {
            report.violations.push(Violation {
                rule: "unmatched-expectation",
                function: e.kernels.to_string(),
                line: 0,
                message: format!(
                    "no kernel matches `{}`: a renamed or removed kernel would go unchecked; \
                     update EXPECTATIONS",
                    e.kernels
                ),
            });
        }
    }
    report
}

/// Whether kernel `name` matches `pattern` (exact, or `prefix*`).
pub fn name_matches(pattern: &str, name: &str) -> bool {
    match pattern.strip_suffix('*') {
        Some(prefix) => name.starts_with(prefix),
        None => name == pattern,
    }
}

fn check_function(f: &Function, out: &mut Vec<Violation>) {
    let stack = stack_derived(f);
    for ins in f.instructions.iter().filter(|i| !i.is_directive()) {
        let mut flag = |rule, message: String| {
            out.push(Violation {
                rule,
                function: f.name.clone(),
                line: ins.line,
                message,
            })
        };
        if (ins.op() == "fence" && ins.has("sc")) || ins.op() == "membar" {
            flag(
                "fence-sc",
                format!(
                    "`{}` is a sequentially consistent fence where a release or acquire is \
                     meant; use `arch::fence` (fence.acq_rel) or a scoped acquire load / release \
                     store from `arch::atomic` (a SeqCst Rust fence or atomic lowers to this; \
                     see rust#136480)",
                    ins.text()
                ),
            );
        }
        if matches!(ins.op(), "atom" | "red") {
            let address = ins.operands.iter().find(|o| o.starts_with('['));
            let on_stack = address.is_some_and(|a| {
                names_in(a).any(|n| stack.contains(n) || n.starts_with("__local_depot"))
            });
            if ins.has("local") || on_stack {
                flag(
                    "local-atomic",
                    format!(
                        "`{}` is an atomic on local (stack) memory, which other threads cannot \
                         see and nvptx miscompiles (rust#146686); keep atomics on global memory",
                        ins.text()
                    ),
                );
            }
        }
        if ins.op() == "st" && ins.has("release") && is_vector(ins) {
            flag(
                "vector-release",
                format!(
                    "`{}` is a release vector store: the PTX memory model orders no element of \
                     a vector access before another, so a reader that acquires one element may \
                     not see the others; store the other words relaxed, then the word the \
                     reader acquires with release (`arch::atomic::publish_pair`)",
                    ins.text()
                ),
            );
        }
    }
}

/// A kernel under check: its body's control flow and data flow, and where its parameters'
/// protocol words are.
struct Kernel<'m> {
    module: &'m Module,
    f: &'m Function,
    source: Option<&'m KernelFn>,
    cfg: Cfg,
    flow: Flow<'m>,
    /// Protocol words of parameter `i`.
    words: Vec<Vec<Word>>,
}

/// What the search for one protocol step found: the accesses that fit it, violations of
/// the rule that governs it, and near misses to explain an absence.
#[derive(Default)]
struct Found {
    fits: Vec<usize>,
    violations: Vec<Violation>,
    near: Vec<String>,
}

impl<'m> Kernel<'m> {
    fn new(module: &'m Module, f: &'m Function, source: Option<&'m KernelFn>) -> Kernel<'m> {
        let words = source
            .map(|k| {
                k.params
                    .iter()
                    .map(|p| layouts::param_words(&p.name, &p.ty))
                    .collect()
            })
            .unwrap_or_default();
        Kernel {
            module,
            f,
            source,
            cfg: Cfg::new(f),
            flow: Flow::new(f),
            words,
        }
    }

    fn ins(&self, i: usize) -> &'m Instruction {
        &self.f.instructions[i]
    }

    /// Statements that are instructions, with their indices.
    fn instructions(&self) -> impl Iterator<Item = (usize, &'m Instruction)> + 'm {
        self.f
            .instructions
            .iter()
            .enumerate()
            .filter(|(_, i)| !i.is_directive())
    }

    /// The protocol word parameter word `w` is, if any.
    fn word(&self, w: &ParamWord) -> Option<&Word> {
        let prefix = format!("{}_param_", self.f.name);
        let i: usize = w.param.strip_prefix(&prefix)?.parse().ok()?;
        self.words.get(i)?.iter().find(|x| x.offset == w.offset)
    }

    /// The fields an address operand is computed from (a pointer from a handle, plus any
    /// offsets): `RemoteBuffer` for `[remote + i * 16]`.
    fn fields_at(&self, operand: &str) -> BTreeSet<Field> {
        self.flow
            .address_origins(operand)
            .iter()
            .filter_map(|w| self.word(w).map(|x| x.field))
            .collect()
    }

    /// The cell an address operand is exactly (the pointer held by one kind of protocol
    /// word, at offset 0), and where that word is.
    fn cell_at(&self, operand: &str) -> Option<(Field, String)> {
        let mut cell: Option<(Field, String)> = None;
        for (base, off) in self.flow.pointer(operand) {
            let (Base::Param(w), 0) = (base, off) else {
                return None;
            };
            let word = self.word(&w)?;
            match &cell {
                Some((f, _)) if *f != word.field => return None,
                Some(_) => {}
                None => cell = Some((word.field, word.path.clone())),
            }
        }
        cell
    }

    /// The flag words of the kernel's parameters.
    fn flags(&self) -> Vec<ParamWord> {
        let mut out = Vec::new();
        for (i, words) in self.words.iter().enumerate() {
            for w in words.iter().filter(|w| w.field == Field::Flag) {
                out.push(ParamWord {
                    param: format!("{}_param_{i}", self.f.name),
                    offset: w.offset,
                });
            }
        }
        out
    }

    /// Whether load `i` is polled: a conditional branch on a cycle through the load's block
    /// depends on the loaded value (and, with `flags`, compares it with one of them).
    fn polled(&self, i: usize, flags: Option<&[ParamWord]>) -> bool {
        let at = self.cfg.block_of(i);
        self.instructions().any(|(j, b)| {
            let Some(guard) = (b.op() == "bra").then_some(b.guard.as_deref()).flatten() else {
                return false;
            };
            if !self.cfg.same_cycle(at, self.cfg.block_of(j)) {
                return false;
            }
            let cond = self.flow.condition_sources(guard);
            cond.reads.contains(&i)
                && flags.is_none_or(|f| f.iter().any(|w| cond.params.contains(w)))
        })
    }

    fn violation(&self, rule: &'static str, i: usize, message: String) -> Violation {
        Violation {
            rule,
            function: self.f.name.clone(),
            line: self.ins(i).line,
            message,
        }
    }

    fn check(&self, exp: Option<&Expectation>, out: &mut Vec<Violation>) {
        let publish = self.fifo_publishes();
        let signals = self.signals();
        out.extend(publish.violations.iter().cloned());
        out.extend(signals.violations.iter().cloned());
        self.barrier_count(out);
        let Some(exp) = exp else {
            return;
        };
        for &need in exp.needs {
            let found = match need {
                Need::FifoPublish => Found {
                    fits: publish.fits.clone(),
                    near: publish.near.clone(),
                    ..Found::default()
                },
                Need::FifoSync => self.fifo_sync(&publish.fits),
                Need::SemaphoreWait => self.acquire_polls(Field::SemaphoreInbound, "inbound"),
                Need::ReleaseSignal | Need::RelaxedSignal => {
                    self.signal_kind(need == Need::ReleaseSignal)
                }
                Need::MemoryPut => self.copies(Field::RemoteBuffer, Field::LocalBuffer),
                Need::MemoryGet => self.copies(Field::LocalBuffer, Field::RemoteBuffer),
                Need::WideCopy => self.wide_copies(),
                Need::Ll8Store => self.packet_stores(Packet::Ll8),
                Need::Ll16Store => self.packet_stores(Packet::Ll16),
                Need::Ll8Poll => self.packet_polls(Packet::Ll8),
                Need::Ll16Poll => self.packet_polls(Packet::Ll16),
                Need::BarrierBeforeSignal => self.barrier_before_signal(),
            };
            out.extend(found.violations);
            if found.fits.is_empty() {
                let why = if self.source.is_none() {
                    " (no `#[kernel]` source describes its parameters)".to_string()
                } else if found.near.is_empty() {
                    String::new()
                } else {
                    format!("; {}", found.near.join("; "))
                };
                out.push(Violation {
                    rule: "expected-step",
                    function: self.f.name.clone(),
                    line: self.f.line,
                    message: format!(
                        "kernels matching `{}` must contain {}, and this one does not{why}",
                        exp.kernels,
                        need.describe()
                    ),
                });
            }
        }
    }

    /// The `fifo-publish` rule: every store into a FIFO's slots; `fits` are the release
    /// stores of well-formed publishes.
    fn fifo_publishes(&self) -> Found {
        let mut found = Found::default();
        let slot_stores: Vec<usize> = self
            .instructions()
            .filter(|(_, ins)| ins.op() == "st" && in_global_or_generic(ins))
            .filter(|(_, ins)| {
                self.fields_at(&ins.operands[0])
                    .contains(&Field::FifoTriggers)
            })
            .map(|(i, _)| i)
            .collect();
        let head_rmws: Vec<usize> = self
            .instructions()
            .filter(|(_, ins)| matches!(ins.op(), "atom" | "red") && ins.has("add"))
            .filter(|(_, ins)| {
                let address = ins.operands.iter().find(|o| o.starts_with('['));
                address.and_then(|a| self.cell_at(a)).map(|c| c.0) == Some(Field::FifoHead)
            })
            .map(|(i, _)| i)
            .collect();
        let head_adds: Vec<usize> = head_rmws
            .iter()
            .copied()
            .filter(|&i| {
                let ins = self.ins(i);
                ins.op() == "atom" && !ins.has("sys") && !ins.has("cta")
            })
            .collect();
        for &i in head_rmws.iter().filter(|i| !head_adds.contains(i)) {
            found.violations.push(self.violation(
                "fifo-publish",
                i,
                format!(
                    "`{}` claims a FIFO slot outside device scope; only kernel threads contend \
                     on the head, so claim it with `atom.relaxed.gpu.global.add.u64` (a \
                     system-scope RMW costs every push a round trip to the host's coherence)",
                    self.ins(i).text()
                ),
            ));
        }
        let word = |i: usize, order: &str| {
            let ins = self.ins(i);
            ins.has(order) && ins.has("sys") && !is_vector(ins) && elem_bits(ins) == Some(64)
        };
        let at = |i: usize, shift: i64| -> BTreeSet<(Base, i64)> {
            self.flow
                .pointer(&self.ins(i).operands[0])
                .into_iter()
                .map(|(b, o)| (b, o + shift))
                .collect()
        };
        let seconds: Vec<usize> = slot_stores
            .iter()
            .copied()
            .filter(|&i| word(i, "release"))
            .collect();
        let firsts: Vec<usize> = slot_stores
            .iter()
            .copied()
            .filter(|&i| word(i, "relaxed"))
            .collect();
        for &i in &slot_stores {
            let text = self.ins(i).text();
            if seconds.contains(&i) {
                let own: Vec<usize> = firsts
                    .iter()
                    .copied()
                    .filter(|&j| at(j, 8) == at(i, 0))
                    .collect();
                if own.is_empty() {
                    found.violations.push(self.violation(
                        "fifo-publish",
                        i,
                        format!(
                            "`{text}` releases a FIFO slot's second word, but no relaxed \
                             store of its first word at slot+8 - 8 exists: a publish is \
                             `st.relaxed.sys.global.u64` [slot], then \
                             `st.release.sys.global.u64` [slot+8]"
                        ),
                    ));
                } else if self.cfg.path_avoiding(None, i, |x| own.contains(&x)) {
                    found.violations.push(self.violation(
                        "fifo-publish",
                        i,
                        format!(
                            "a path reaches `{text}` (the commit word) without storing the \
                             first word before it: the proxy may take the slot and read a \
                             stale first word"
                        ),
                    ));
                } else {
                    found.fits.push(i);
                }
            } else if firsts.contains(&i) {
                let problem = if !seconds.iter().any(|&j| at(i, 8) == at(j, 0)) {
                    Some(format!(
                        "`{text}` stores a FIFO slot's first word, but no release store of the \
                         second word follows at slot+8: the trigger is never committed"
                    ))
                } else if head_adds.is_empty() {
                    Some(format!(
                        "`{text}` publishes into a FIFO slot, but the kernel never claims one \
                         with a device-scope `atom.add` on the FIFO's head"
                    ))
                } else if self.cfg.path_avoiding(None, i, |x| head_adds.contains(&x)) {
                    Some(format!(
                        "a path reaches `{text}` without claiming the slot first (an \
                         `atom.add` on the FIFO's head)"
                    ))
                } else if !self
                    .flow
                    .operand_sources(&self.ins(i).operands[0])
                    .reads
                    .iter()
                    .any(|r| head_adds.contains(r))
                {
                    Some(format!(
                        "`{text}` writes a slot whose address is not computed from the claimed \
                         position (the head add's result): another pusher may own it"
                    ))
                } else {
                    None
                };
                if let Some(p) = problem {
                    found.violations.push(self.violation("fifo-publish", i, p));
                }
            } else {
                let why = if is_vector(self.ins(i)) {
                    "a vector store's elements are unordered in the PTX memory model, so the \
                     proxy may see the commit bit before the first word"
                } else {
                    "the host proxy is ordered only by system-scope stores"
                };
                found.violations.push(self.violation(
                    "fifo-publish",
                    i,
                    format!(
                        "`{text}` writes a FIFO slot, but a publish is a relaxed system-scope \
                         store of the first word, then a release system-scope store of the \
                         second word at slot+8 (`arch::atomic::publish_pair`): {why}"
                    ),
                ));
            }
        }
        if slot_stores.is_empty() {
            found
                .near
                .push("nothing stores into a FIFO's `triggers`".to_string());
        }
        // A publish with a broken half fits nothing.
        if found.violations.iter().any(|v| v.rule == "fifo-publish") {
            found.fits.clear();
            found
                .near
                .push("its publish breaks the `fifo-publish` rule".into());
        }
        found
    }

    /// `FifoSync`: acquire polls of the tail that every path reaches through a publish.
    fn fifo_sync(&self, publishes: &[usize]) -> Found {
        let mut polls = self.acquire_polls(Field::FifoTail, "tail");
        let (after, before): (Vec<usize>, Vec<usize>) = polls
            .fits
            .iter()
            .partition(|&&i| !self.cfg.path_avoiding(None, i, |x| publishes.contains(&x)));
        for i in before {
            polls.near.push(format!(
                "the poll of the `tail` at line {} can run before any publish (a push's wait \
                 for room, not a sync)",
                self.ins(i).line
            ));
        }
        polls.fits = after;
        polls
    }

    /// Acquire polls of the cell of kind `field` (named `name` in messages).
    fn acquire_polls(&self, field: Field, name: &str) -> Found {
        let mut found = Found::default();
        for (i, ins) in self.instructions().filter(|(_, i)| i.op() == "ld") {
            let Some((f, path)) = ins.operands.get(1).and_then(|a| self.cell_at(a)) else {
                continue;
            };
            if f != field {
                continue;
            }
            let shape = ins.has("acquire")
                && ins.has("sys")
                && !is_vector(ins)
                && elem_bits(ins) == Some(64)
                && in_global_or_generic(ins);
            if !shape {
                found.near.push(format!(
                    "`{}` (line {}) reads `{path}` but is not an acquire at system scope",
                    ins.text(),
                    ins.line
                ));
            } else if !self.polled(i, None) {
                found.near.push(format!(
                    "`{}` (line {}) reads `{path}` but is not polled: no branch of a loop around \
                     it depends on its value",
                    ins.text(),
                    ins.line
                ));
            } else {
                found.fits.push(i);
            }
        }
        if found.fits.is_empty() && found.near.is_empty() {
            found.near.push(format!("no load of a `{name}` counter"));
        }
        found
    }

    /// The `signal` rule: every access to a `remote_inbound` counter. `fits` are unused.
    fn signals(&self) -> Found {
        let mut found = Found::default();
        for (i, ins) in self.instructions() {
            let address = ins.operands.iter().find(|o| o.starts_with('['));
            let Some((Field::SemaphoreRemoteInbound, path)) = address.and_then(|a| self.cell_at(a))
            else {
                continue;
            };
            let message = match ins.op() {
                "st" => format!(
                    "`{}` stores into `{path}`: a signal must be an atomic add (`red.add`), since \
                     a stored count moves backwards under concurrent signallers",
                    ins.text()
                ),
                "red" | "atom" if !ins.has("sys") => format!(
                    "`{}` signals `{path}` below system scope: the peer's wait is not ordered \
                     by it",
                    ins.text()
                ),
                _ => continue,
            };
            found.violations.push(self.violation("signal", i, message));
        }
        found
    }

    /// Release (or relaxed) system-scope adds on a `remote_inbound` counter.
    fn signal_kind(&self, release: bool) -> Found {
        let mut found = Found::default();
        for (i, ins) in self.instructions() {
            if !matches!(ins.op(), "red" | "atom") || !ins.has("add") || elem_bits(ins) != Some(64)
            {
                continue;
            }
            let address = ins.operands.iter().find(|o| o.starts_with('['));
            let cell = address.and_then(|a| self.cell_at(a));
            let is_release = ins.has("release") || ins.has("acq_rel");
            match cell {
                Some((Field::SemaphoreRemoteInbound, path)) if ins.has("sys") => {
                    if is_release == release {
                        found.fits.push(i);
                    } else {
                        found.near.push(format!(
                            "`{}` (line {}) adds to `{path}` {}",
                            ins.text(),
                            ins.line,
                            if release {
                                "without release"
                            } else {
                                "with release"
                            }
                        ));
                    }
                }
                Some((_, path)) => found.near.push(format!(
                    "`{}` (line {}) adds to `{path}`, not to a semaphore's `remote_inbound`",
                    ins.text(),
                    ins.line
                )),
                None => {}
            }
        }
        if found.fits.is_empty() && found.near.is_empty() {
            found
                .near
                .push("no add on a semaphore's `remote_inbound`".into());
        }
        found
    }

    /// Stores into a buffer of kind `dst` of values loaded from a buffer of kind `src`.
    fn copies(&self, dst: Field, src: Field) -> Found {
        let mut found = Found::default();
        let name = |f: Field| {
            if f == Field::RemoteBuffer {
                "remote"
            } else {
                "local"
            }
        };
        for (i, ins) in self.instructions().filter(|(_, i)| i.op() == "st") {
            if !self.fields_at(&ins.operands[0]).contains(&dst) {
                continue;
            }
            let from_src = ins.operands[1..].iter().any(|v| {
                self.flow.operand_sources(v).reads.iter().any(|&r| {
                    let load = self.ins(r);
                    load.op() == "ld"
                        && load
                            .operands
                            .get(1)
                            .is_some_and(|a| self.fields_at(a).contains(&src))
                })
            });
            if from_src {
                found.fits.push(i);
            }
        }
        if found.fits.is_empty() {
            found.near.push(format!(
                "no store into a `{}` buffer of data loaded from a `{}` one",
                name(dst),
                name(src)
            ));
        }
        found
    }

    /// `WideCopy`: stores, in a loop, into a channel buffer of values loaded in the same
    /// loop from one; `fits` are those whose store and load are weak 128-bit global
    /// accesses, `near` says what the others move instead.
    fn wide_copies(&self) -> Found {
        let mut found = Found::default();
        let in_buffer = |operand: &str| {
            self.fields_at(operand)
                .iter()
                .any(|f| matches!(f, Field::RemoteBuffer | Field::LocalBuffer))
        };
        // The narrow copies seen, once per pair of opcodes: (load, store, line).
        let mut narrow: Vec<(&Instruction, &Instruction)> = Vec::new();
        for (i, st) in self.instructions().filter(|(_, i)| i.op() == "st") {
            let at = self.cfg.block_of(i);
            if !in_buffer(&st.operands[0]) || !self.cfg.same_cycle(at, at) {
                continue;
            }
            let loads: Vec<&Instruction> = st.operands[1..]
                .iter()
                .flat_map(|v| self.flow.operand_sources(v).reads)
                .filter(|&r| self.cfg.same_cycle(at, self.cfg.block_of(r)))
                .map(|r| self.ins(r))
                .filter(|ld| ld.op() == "ld" && ld.operands.get(1).is_some_and(|a| in_buffer(a)))
                .collect();
            let Some(&ld) = loads.iter().find(|l| !is_wide_data(l)).or(loads.first()) else {
                continue;
            };
            if is_wide_data(st) && is_wide_data(ld) {
                found.fits.push(i);
            } else if !narrow
                .iter()
                .any(|(l, s)| l.opcode == ld.opcode && s.opcode == st.opcode)
            {
                narrow.push((ld, st));
            }
        }
        if !narrow.is_empty() {
            let seen: Vec<String> = narrow
                .iter()
                .map(|(ld, st)| {
                    format!(
                        "`{}` to `{}` at line {} ({})",
                        ld.opcode,
                        st.opcode,
                        st.line,
                        access_kind(if is_wide_data(st) { ld } else { st })
                    )
                })
                .collect();
            found.near.push(format!(
                "its copy loops move data with {}, not one weak 128-bit global load and store \
                 per 16 bytes",
                seen.join(", ")
            ));
        } else if found.fits.is_empty() {
            found.near.push(
                "no loop stores into a `remote` or `local` buffer what it loads from one".into(),
            );
        }
        found
    }

    /// Packet stores: stores of a flag into a `remote` buffer, each of the packet's shape.
    fn packet_stores(&self, packet: Packet) -> Found {
        let mut found = Found::default();
        let flags = self.flags();
        if flags.is_empty() {
            found
                .near
                .push("the kernel has no `flag` parameter to find its packets by".into());
            return found;
        }
        let carries_flag = |operand: &str| {
            let s: Sources = self.flow.operand_sources(operand);
            flags.iter().any(|w| s.params.contains(w))
        };
        for (i, ins) in self.instructions().filter(|(_, i)| i.op() == "st") {
            if !self
                .fields_at(&ins.operands[0])
                .contains(&Field::RemoteBuffer)
            {
                continue;
            }
            let values: Vec<&str> = ins.operands[1..]
                .iter()
                .flat_map(|v| vector_elements(v))
                .collect();
            if !values.iter().any(|v| carries_flag(v)) {
                continue;
            }
            let flagged = |at: &[usize]| {
                at.iter()
                    .all(|&e| values.get(e).is_some_and(|v| carries_flag(v)))
            };
            let bits = elem_bits(ins);
            let shape = is_unbuffered_store(ins)
                && in_global_or_generic(ins)
                && match (packet, vector_width(ins), bits) {
                    (Packet::Ll8, 1, Some(64)) => flagged(&[0]),
                    (Packet::Ll8, 2, Some(32)) => flagged(&[1]),
                    (Packet::Ll16, 2, Some(64)) => flagged(&[0, 1]),
                    (Packet::Ll16, 4, Some(32)) => flagged(&[1, 3]),
                    _ => false,
                };
            if shape {
                found.fits.push(i);
            } else {
                found.violations.push(self.violation(
                    packet.store_rule(),
                    i,
                    format!(
                        "`{}` stores the packet flag, but {}: the reader must see data and flag \
                         arrive together",
                        ins.text(),
                        packet.store_shape()
                    ),
                ));
            }
        }
        if found.fits.is_empty() {
            found.near.push(format!(
                "no {} store of the flag into a `remote` buffer",
                packet.bytes()
            ));
        }
        found
    }

    /// Packet polls: loads of a `packets` buffer of the packet's size, polled against the
    /// flag.
    fn packet_polls(&self, packet: Packet) -> Found {
        let mut found = Found::default();
        let flags = self.flags();
        for (i, ins) in self.instructions().filter(|(_, i)| i.op() == "ld") {
            let Some(address) = ins.operands.get(1) else {
                continue;
            };
            if !self.fields_at(address).contains(&Field::PacketBuffer) {
                continue;
            }
            let size = match (vector_width(ins), elem_bits(ins)) {
                (1, Some(64)) | (2, Some(32)) => Packet::Ll8,
                (2, Some(64)) | (4, Some(32)) => Packet::Ll16,
                _ => continue,
            };
            let unbuffered = ins.has("volatile")
                || ((ins.has("relaxed") || ins.has("acquire")) && ins.has("sys"));
            if size != packet || !unbuffered || !in_global_or_generic(ins) {
                found.near.push(format!(
                    "`{}` (line {}) reads a packet but is not {}",
                    ins.text(),
                    ins.line,
                    packet.load_shape()
                ));
            } else if !self.polled(i, None) {
                found.near.push(format!(
                    "`{}` (line {}) reads a packet but is not polled",
                    ins.text(),
                    ins.line
                ));
            } else if !self.polled(i, Some(&flags)) {
                found.near.push(format!(
                    "`{}` (line {}) is polled, but the loop never compares it with the flag",
                    ins.text(),
                    ins.line
                ));
            } else {
                found.fits.push(i);
            }
        }
        if found.fits.is_empty() && found.near.is_empty() {
            found.near.push("no load of a `packets` buffer".into());
        }
        found
    }

    /// `BarrierBeforeSignal`: every path from a store into a `remote` buffer to a release
    /// signal passes a block barrier.
    fn barrier_before_signal(&self) -> Found {
        let mut found = Found::default();
        let stores: Vec<usize> = self
            .instructions()
            .filter(|(_, i)| i.op() == "st" && in_global_or_generic(i))
            .filter(|(_, i)| {
                self.fields_at(&i.operands[0])
                    .contains(&Field::RemoteBuffer)
            })
            .map(|(i, _)| i)
            .collect();
        let signals = self.signal_kind(true).fits;
        if stores.is_empty() {
            found
                .near
                .push("no data store into a `remote` buffer to order".into());
        }
        if signals.is_empty() {
            found
                .near
                .push("no release signal to order it before".into());
        }
        for &s in &stores {
            for &r in &signals {
                if self
                    .cfg
                    .path_avoiding(Some(s), r, |i| is_block_barrier(self.ins(i)))
                {
                    found.violations.push(self.violation(
                        "barrier-before-signal",
                        r,
                        format!(
                            "a path runs from the data store `{}` (line {}) to the signal `{}` \
                             without a block barrier: the signalling thread's release does not \
                             cover the other threads' shares of the put; call \
                             `arch::sync_threads` between them",
                            self.ins(s).text(),
                            self.ins(s).line,
                            self.ins(r).text()
                        ),
                    ));
                }
            }
        }
        if !stores.is_empty() && !signals.is_empty() && found.violations.is_empty() {
            found.fits = signals;
        }
        found
    }

    /// The `barrier-count` rule.
    fn barrier_count(&self, out: &mut Vec<Violation>) {
        let Some(source) = self.source else {
            return;
        };
        let ptx: usize = self
            .module
            .reachable_from(self.f)
            .iter()
            .flat_map(|f| f.instructions.iter())
            .filter(|i| is_block_barrier(i))
            .count();
        if ptx != source.barrier_sites {
            out.push(Violation {
                rule: "barrier-count",
                function: self.f.name.clone(),
                line: self.f.line,
                message: format!(
                    "the PTX has {ptx} block barriers, the source {} barrier sites \
                     (`sync_threads`, `sync_threads_or` and helpers holding them): a barrier was \
                     duplicated into the arms of a branch (MIR jump threading, \
                     rust-lang/rust#137086), so threads of a block may wait at different \
                     barriers, or one was lost",
                    source.barrier_sites
                ),
            });
        }
    }
}

/// The two LL packet formats.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Packet {
    Ll8,
    Ll16,
}

impl Packet {
    fn store_rule(self) -> &'static str {
        match self {
            Packet::Ll8 => "ll8-store",
            Packet::Ll16 => "ll16-store",
        }
    }

    fn bytes(self) -> &'static str {
        match self {
            Packet::Ll8 => "8-byte",
            Packet::Ll16 => "16-byte",
        }
    }

    fn store_shape(self) -> &'static str {
        match self {
            Packet::Ll8 => {
                "an LL8 packet is one relaxed system-scope or volatile 8-byte store with the \
                 flag in its high word (`st.relaxed.sys.global.u64`, `st.volatile.global.v2.u32`)"
            }
            Packet::Ll16 => {
                "an LL16 packet is one volatile 16-byte store with the flag in each 8-byte half \
                 (`st.volatile.global.v2.u64`)"
            }
        }
    }

    fn load_shape(self) -> &'static str {
        match self {
            Packet::Ll8 => "one relaxed system-scope or volatile 8-byte load",
            Packet::Ll16 => "one volatile 16-byte load",
        }
    }
}

/// Whether `ins` is a block-wide barrier that waits (`bar.sync`, `bar.red`, `barrier.sync`,
/// `barrier.cta.red`, ...), not a warp barrier nor an arrive.
fn is_block_barrier(ins: &Instruction) -> bool {
    matches!(ins.op(), "bar" | "barrier")
        && !ins.has("warp")
        && !ins.has("arrive")
        && (ins.has("sync") || ins.has("red") || ins.opcode == "bar" || ins.opcode == "barrier")
}

/// Registers of `f` that hold an address into its own stack frame: seeded by `%SP`, `%SPL`,
/// `__local_depot*` and `cvta.local`, and carried through arithmetic and moves (loads carry
/// the value read, not the address, so they stop it).
fn stack_derived(f: &Function) -> BTreeSet<String> {
    let mut set: BTreeSet<String> = ["%SP", "%SPL"].iter().map(|s| s.to_string()).collect();
    let is_stack = |set: &BTreeSet<String>, operand: &str| {
        names_in(operand).any(|n| set.contains(n) || n.starts_with("__local_depot"))
    };
    loop {
        let before = set.len();
        for ins in f.instructions.iter().filter(|i| !i.is_directive()) {
            let Some(dest) = ins.operands.first() else {
                continue;
            };
            let derives = match ins.op() {
                "ld" | "st" | "atom" | "red" | "call" | "bra" | "ret" | "setp" => false,
                "cvta" if ins.has("local") => true,
                _ => ins.operands[1..].iter().any(|o| is_stack(&set, o)),
            };
            if derives && !dest.starts_with('[') {
                set.insert(dest.clone());
            }
        }
        if set.len() == before {
            return set;
        }
    }
}

/// The elements of a vector operand (`{%rd1, %rd2}`), or the operand itself.
fn vector_elements(operand: &str) -> Vec<&str> {
    operand
        .trim()
        .trim_start_matches('{')
        .trim_end_matches('}')
        .split(',')
        .map(str::trim)
        .collect()
}

fn vector_width(ins: &Instruction) -> u32 {
    if ins.has("v4") {
        4
    } else if ins.has("v2") {
        2
    } else if ins.has("v8") {
        8
    } else {
        1
    }
}

fn is_vector(ins: &Instruction) -> bool {
    vector_width(ins) > 1
}

/// The modifiers that make an access more than weak: volatile, or a memory order.
const ORDERED: [&str; 5] = ["volatile", "relaxed", "acquire", "release", "mmio"];

/// Whether `ins` is a weak 128-bit access of global memory (`ld.global.v2.u64`,
/// `st.global.v4.u32`, ...): plain data, 16 bytes in one access, no `.volatile` and no
/// memory order.
fn is_wide_data(ins: &Instruction) -> bool {
    ins.has("global")
        && !ORDERED.iter().any(|m| ins.has(m))
        && matches!(
            (vector_width(ins), elem_bits(ins)),
            (2, Some(64)) | (4, Some(32))
        )
}

/// How much one access moves, and how, for messages: `8 bytes, generic`.
fn access_kind(ins: &Instruction) -> String {
    let bytes = vector_width(ins) * elem_bits(ins).unwrap_or(0) / 8;
    let space = if ins.has("global") {
        "global"
    } else if in_global_or_generic(ins) {
        "generic"
    } else {
        "not global"
    };
    let unit = if bytes == 1 { "byte" } else { "bytes" };
    match ORDERED.iter().find(|m| ins.has(m)) {
        Some(m) => format!("{bytes} {unit}, {space}, {m}"),
        None => format!("{bytes} {unit}, {space}"),
    }
}

fn in_global_or_generic(ins: &Instruction) -> bool {
    !["local", "shared", "param", "const"]
        .iter()
        .any(|s| ins.has(s))
        && !ins.opcode.contains(".shared::")
}

/// A store the hardware makes visible to other agents as one access, at system scope:
/// volatile (relaxed at system scope from sm_70 on), or relaxed or stronger at `.sys`.
fn is_unbuffered_store(ins: &Instruction) -> bool {
    ins.has("volatile") || ((ins.has("relaxed") || ins.has("release")) && ins.has("sys"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::KernelParam;

    /// A kernel as its source describes it: parameters `(name, type)` and barrier sites.
    fn source(name: &str, params: &[(&str, &str)], barrier_sites: usize) -> KernelFn {
        KernelFn {
            name: name.into(),
            params: params
                .iter()
                .map(|(n, t)| KernelParam {
                    name: n.to_string(),
                    ty: t.to_string(),
                })
                .collect(),
            barrier_sites,
            ..Default::default()
        }
    }

    /// A module of kernels `(name, body)`; `K_` in a body stands for the kernel's name, so
    /// `[K_param_0+80]` reads word 80 of its first parameter.
    fn module(bodies: &[(&str, &str)]) -> Module {
        let mut text = String::from(".version 7.8\n.target sm_90\n.address_size 64\n");
        for (name, body) in bodies {
            let body = body.replace("K_", &format!("{name}_"));
            text.push_str(&format!(".visible .entry {name}()\n{{\n{body}\nret;\n}}\n"));
        }
        Module::parse(&text)
    }

    /// Checks one kernel `name` with `body` and parameters `params` against `needs`; its
    /// source has as many barrier sites as the body has barriers.
    fn check_one(
        name: &str,
        params: &[(&str, &str)],
        needs: &'static [Need],
        body: &str,
    ) -> Report {
        let m = module(&[(name, body)]);
        let exp = [Expectation {
            kernels: "*",
            needs,
        }];
        let sites = m.functions[0]
            .instructions
            .iter()
            .filter(|i| is_block_barrier(i))
            .count();
        check(&m, &[source(name, params, sites)], &exp)
    }

    fn rules(report: &Report) -> Vec<&'static str> {
        report.violations.iter().map(|v| v.rule).collect()
    }

    fn assert_passes(report: &Report) {
        assert!(report.violations.is_empty(), "{:#?}", report.violations);
    }

    /// Asserts `report` has a violation of `rule` whose message contains `says`.
    fn assert_fails(report: &Report, rule: &str, says: &str) {
        assert!(
            report
                .violations
                .iter()
                .any(|v| v.rule == rule && v.message.contains(says)),
            "expected [{rule}] saying {says:?}, got {:#?}",
            report.violations
        );
    }

    const PORT: &[(&str, &str)] = &[("chan", "PortChannelDeviceHandle")];
    const MEMORY: &[(&str, &str)] = &[("chan", "MemoryChannelDeviceHandle")];
    const LL: &[(&str, &str)] = &[("chan", "MemoryChannelDeviceHandle"), ("flag", "u32")];

    /// A push through the port channel of parameter 0 (triggers at +0, head at +8): the
    /// head add claims position %rd4, the slot is triggers + (position & 15) * 16.
    const PUSH: &str = "ld.param.b64 %rd1, [K_param_0];\n\
        ld.param.b64 %rd2, [K_param_0+8];\n\
        mov.b64 %rd3, 1;\n\
        atom.relaxed.gpu.global.add.u64 %rd4, [%rd2], %rd3;\n\
        and.b64 %rd5, %rd4, 15;\n\
        shl.b64 %rd6, %rd5, 4;\n\
        add.s64 %rd7, %rd1, %rd6;\n\
        st.relaxed.sys.global.u64 [%rd7], %rd8;\n\
        add.s64 %rd9, %rd7, 8;\n\
        st.release.sys.global.u64 [%rd9], %rd10;";

    /// A wait on the port channel's semaphore (inbound at +80), as LLVM lays out the loop.
    const PORT_WAIT: &str = "ld.param.b64 %rd20, [K_param_0+80];\n\
        $L__W1:\n\
        ld.acquire.sys.global.u64 %rd21, [%rd20];\n\
        setp.lt.u64 %p1, %rd21, %rd22;\n\
        @%p1 bra $L__W1;";

    /// A flush's wait for the tail (at +16) to pass the pushed position %rd4.
    const SYNC: &str = "ld.param.b64 %rd30, [K_param_0+16];\n\
        $L__S1:\n\
        ld.acquire.sys.global.u64 %rd31, [%rd30];\n\
        setp.le.u64 %p2, %rd31, %rd4;\n\
        @%p2 bra $L__S1;";

    // --- FIFO publish ---

    /// Guards against the publish rule refusing the protocol's own shape, as LLVM emits it:
    /// head add, slot from the claimed position, relaxed first word, release word at +8.
    #[test]
    fn push_publishes_two_words_after_the_head_add() {
        assert_passes(&check_one("port_k", PORT, &[Need::FifoPublish], PUSH));
    }

    /// Guards against the publish of one vector release store: the PTX memory model orders
    /// no element of a vector access before another, so the proxy may see the commit bit
    /// before the first word.
    #[test]
    fn vector_publish_fails() {
        let body = PUSH.replace(
            "st.relaxed.sys.global.u64 [%rd7], %rd8;\n\
             add.s64 %rd9, %rd7, 8;\n\
             st.release.sys.global.u64 [%rd9], %rd10;",
            "st.release.sys.global.v2.u64 [%rd7], {%rd8, %rd10};",
        );
        let r = check_one("port_k", PORT, &[Need::FifoPublish], &body);
        assert_fails(&r, "fifo-publish", "unordered");
        assert_fails(&r, "expected-step", "FIFO publish");
    }

    /// Guards against the two stores in the wrong order: the commit word released before
    /// the first word is written.
    #[test]
    fn commit_word_before_first_word_fails() {
        let body = PUSH.replace(
            "st.relaxed.sys.global.u64 [%rd7], %rd8;\n\
             add.s64 %rd9, %rd7, 8;\n\
             st.release.sys.global.u64 [%rd9], %rd10;",
            "add.s64 %rd9, %rd7, 8;\n\
             st.release.sys.global.u64 [%rd9], %rd10;\n\
             st.relaxed.sys.global.u64 [%rd7], %rd8;",
        );
        let r = check_one("port_k", PORT, &[Need::FifoPublish], &body);
        assert_fails(&r, "fifo-publish", "without storing the first word");
    }

    /// Guards against a path that skips the first word: in order on every path, not just on
    /// one.
    #[test]
    fn first_word_on_one_path_only_fails() {
        let body = PUSH.replace(
            "st.relaxed.sys.global.u64 [%rd7], %rd8;",
            "@%p9 bra $L__SKIP;\nst.relaxed.sys.global.u64 [%rd7], %rd8;\n$L__SKIP:",
        );
        let r = check_one("port_k", PORT, &[Need::FifoPublish], &body);
        assert_fails(&r, "fifo-publish", "without storing the first word");
    }

    /// Guards against the words landing in two different slots.
    #[test]
    fn words_sixteen_bytes_apart_fail() {
        let body = PUSH.replace("add.s64 %rd9, %rd7, 8;", "add.s64 %rd9, %rd7, 16;");
        let r = check_one("port_k", PORT, &[Need::FifoPublish], &body);
        assert_fails(&r, "fifo-publish", "slot+8");
        assert_fails(&r, "expected-step", "FIFO publish");
    }

    /// Guards against a publish below system scope: the host proxy is not ordered by it.
    #[test]
    fn gpu_scope_commit_fails() {
        let body = PUSH.replace("st.release.sys", "st.release.gpu");
        let r = check_one("port_k", PORT, &[Need::FifoPublish], &body);
        assert_fails(&r, "fifo-publish", "st.release.gpu.global.u64");
    }

    /// Guards against a publish whose slot was not claimed first (the head add after the
    /// stores), or claimed with a system-scope add (a system-scope RMW on every push).
    #[test]
    fn head_add_missing_late_or_system_scope_fails() {
        let late = PUSH.replace("atom.relaxed.gpu.global.add.u64 %rd4, [%rd2], %rd3;\n", "")
            + "\natom.relaxed.gpu.global.add.u64 %rd4, [%rd2], %rd3;";
        let r = check_one("port_k", PORT, &[Need::FifoPublish], &late);
        assert_fails(&r, "fifo-publish", "claiming");
        let sys = PUSH.replace("atom.relaxed.gpu", "atom.relaxed.sys");
        let r = check_one("port_k", PORT, &[Need::FifoPublish], &sys);
        assert_fails(&r, "fifo-publish", "atom.relaxed.sys.global.add.u64");
    }

    /// Guards against a slot that is not the claimed one: the address does not come from
    /// the position the head add returned.
    #[test]
    fn slot_not_from_the_claimed_position_fails() {
        let body = PUSH.replace("and.b64 %rd5, %rd4, 15;", "and.b64 %rd5, %rd40, 15;");
        let r = check_one("port_k", PORT, &[Need::FifoPublish], &body);
        assert_fails(&r, "fifo-publish", "claimed position");
    }

    /// Guards against the publish being credited to stores that are not into the FIFO's
    /// slots (here: into the tail cache's address, at +24).
    #[test]
    fn stores_elsewhere_are_no_publish() {
        let body = PUSH.replace("[K_param_0];", "[K_param_0+24];");
        let r = check_one("port_k", PORT, &[Need::FifoPublish], &body);
        assert_eq!(rules(&r), ["expected-step"], "{r:#?}");
    }

    // --- FIFO sync ---

    /// Guards against a flush (push, then a poll of the tail) not being recognised as a sync.
    #[test]
    fn flush_waits_for_the_tail_after_its_publish() {
        let r = check_one(
            "port_k",
            PORT,
            &[Need::FifoPublish, Need::FifoSync],
            &format!("{PUSH}\n{SYNC}"),
        );
        assert_passes(&r);
    }

    /// Guards against a push's own wait for room (a tail poll before the publish) passing
    /// for a flush.
    #[test]
    fn tail_poll_before_the_publish_is_no_sync() {
        let r = check_one(
            "port_k",
            PORT,
            &[Need::FifoPublish, Need::FifoSync],
            &format!("{}\n{PUSH}", SYNC.replace("%rd4;", "%rd3;")),
        );
        assert_fails(&r, "expected-step", "tail");
    }

    // --- semaphore wait ---

    /// Guards against the wait rule refusing a real wait: the loop's header after its latch
    /// in the text, the inbound counter at byte 80 of a port channel.
    #[test]
    fn semaphore_wait_polls_the_inbound_counter() {
        assert_passes(&check_one("k", PORT, &[Need::SemaphoreWait], PORT_WAIT));
    }

    /// Guards against the wait rule passing on the FIFO's tail poll (an acquire load in a
    /// loop, at system scope, of another cell).
    #[test]
    fn tail_poll_is_no_semaphore_wait() {
        let r = check_one(
            "k",
            PORT,
            &[Need::SemaphoreWait],
            &format!("{PUSH}\n{SYNC}"),
        );
        assert_fails(&r, "expected-step", "inbound");
    }

    /// Guards against a wait that is not a wait: one acquire load, no loop around it.
    #[test]
    fn single_acquire_of_inbound_is_no_wait() {
        let body = PORT_WAIT.replace("@%p1 bra $L__W1;", "");
        let r = check_one("k", PORT, &[Need::SemaphoreWait], &body);
        assert_fails(&r, "expected-step", "not polled");
    }

    /// Guards against a loop whose exit does not depend on the acquired value.
    #[test]
    fn loop_not_deciding_on_the_load_is_no_wait() {
        let body = PORT_WAIT.replace(
            "setp.lt.u64 %p1, %rd21, %rd22;",
            "setp.lt.u64 %p1, %rd23, %rd22;",
        );
        let r = check_one("k", PORT, &[Need::SemaphoreWait], &body);
        assert_fails(&r, "expected-step", "not polled");
    }

    /// Guards against a relaxed or device-scope poll of the inbound counter: the data sent
    /// before the signal is not ordered before what follows.
    #[test]
    fn weak_poll_of_inbound_is_no_wait() {
        for weak in ["ld.relaxed.sys", "ld.acquire.gpu"] {
            let body = PORT_WAIT.replace("ld.acquire.sys", weak);
            let r = check_one("k", PORT, &[Need::SemaphoreWait], &body);
            assert_fails(&r, "expected-step", weak);
        }
    }

    // --- memory channel signals ---

    /// The release signal of a memory channel's semaphore (remote_inbound at +16).
    const SIGNAL: &str = "ld.param.b64 %rd40, [K_param_0+16];\n\
        mov.b64 %rd41, 1;\n\
        red.release.sys.global.add.u64 [%rd40], %rd41;";

    /// Guards against the signal rules refusing the fire-and-forget `red` on the peer's
    /// counter (byte 16 of a memory channel), release or relaxed as asked.
    #[test]
    fn release_signal_adds_to_the_peer_counter() {
        assert_passes(&check_one("k", MEMORY, &[Need::ReleaseSignal], SIGNAL));
        let relaxed = SIGNAL.replace("red.release", "red.relaxed");
        assert_passes(&check_one("k", MEMORY, &[Need::RelaxedSignal], &relaxed));
    }

    /// Guards against a relaxed signal where a release one is needed (the data before it
    /// is not published), and against a release add on another cell counting as the signal.
    #[test]
    fn relaxed_or_misplaced_signal_is_no_release_signal() {
        let relaxed = SIGNAL.replace("red.release", "red.relaxed");
        let r = check_one("k", MEMORY, &[Need::ReleaseSignal], &relaxed);
        assert_fails(&r, "expected-step", "release");
        let inbound = SIGNAL.replace("[K_param_0+16]", "[K_param_0]");
        let r = check_one("k", MEMORY, &[Need::ReleaseSignal], &inbound);
        assert_fails(&r, "expected-step", "remote_inbound");
    }

    /// Guards against the old signal (a store of a count kept here: concurrent signallers
    /// move the counter backwards) and against a signal below system scope.
    #[test]
    fn store_or_gpu_scope_signal_fails() {
        let store = SIGNAL.replace(
            "red.release.sys.global.add.u64 [%rd40], %rd41;",
            "st.release.sys.global.u64 [%rd40], %rd41;",
        );
        let r = check_one("k", MEMORY, &[Need::ReleaseSignal], &store);
        assert_fails(&r, "signal", "atomic add");
        let gpu = SIGNAL.replace("red.release.sys", "red.release.gpu");
        let r = check_one("k", MEMORY, &[], &gpu);
        assert_fails(&r, "signal", "system scope");
    }

    // --- data stores, barrier, signal ---

    /// A put's copy loop into the remote buffer (+56), from the local buffer (+72).
    const PUT: &str = "ld.param.b64 %rd50, [K_param_0+56];\n\
        ld.param.b64 %rd51, [K_param_0+72];\n\
        $L__P1:\n\
        add.s64 %rd52, %rd50, %rd59;\n\
        add.s64 %rd53, %rd51, %rd59;\n\
        ld.b64 %rd54, [%rd53];\n\
        st.b64 [%rd52], %rd54;\n\
        setp.lt.u64 %p5, %rd59, %rd58;\n\
        @%p5 bra $L__P1;";

    /// Guards against the barrier rule refusing a put whose copy loop is followed by a
    /// barrier, then the signal.
    #[test]
    fn put_then_barrier_then_signal_passes() {
        let body = format!("{PUT}\nbar.sync 0;\n{SIGNAL}");
        let r = check_one(
            "k",
            MEMORY,
            &[
                Need::MemoryPut,
                Need::ReleaseSignal,
                Need::BarrierBeforeSignal,
            ],
            &body,
        );
        assert_passes(&r);
    }

    /// Guards against a signal that other threads' shares of the put may not have reached:
    /// no barrier between the data stores and the release signal, on some path.
    #[test]
    fn signal_without_barrier_on_some_path_fails() {
        let none = format!("{PUT}\n{SIGNAL}");
        let r = check_one("k", MEMORY, &[Need::BarrierBeforeSignal], &none);
        assert_fails(&r, "barrier-before-signal", "without a block barrier");
        let one_arm = format!("{PUT}\n@%p7 bra $L__B1;\nbar.sync 0;\n$L__B1:\n{SIGNAL}");
        let r = check_one("k", MEMORY, &[Need::BarrierBeforeSignal], &one_arm);
        assert_fails(&r, "barrier-before-signal", "without a block barrier");
    }

    /// Guards against the barrier rule passing with nothing to order (no put, or no signal).
    #[test]
    fn barrier_rule_needs_a_put_and_a_signal() {
        let r = check_one("k", MEMORY, &[Need::BarrierBeforeSignal], "bar.sync 0;");
        assert_fails(&r, "expected-step", "`remote` buffer");
    }

    /// Guards against a get counted as a put (data into our own buffer), and a put as a get.
    #[test]
    fn put_and_get_go_their_own_ways() {
        assert_passes(&check_one("k", MEMORY, &[Need::MemoryPut], PUT));
        let get = PUT
            .replace("[K_param_0+56]", "[K_param_0+999]")
            .replace("[K_param_0+72]", "[K_param_0+56]")
            .replace("[K_param_0+999]", "[K_param_0+72]");
        assert_passes(&check_one("k", MEMORY, &[Need::MemoryGet], &get));
        assert_fails(
            &check_one("k", MEMORY, &[Need::MemoryPut], &get),
            "expected-step",
            "remote",
        );
        assert_fails(
            &check_one("k", MEMORY, &[Need::MemoryGet], PUT),
            "expected-step",
            "local",
        );
    }

    // --- wide copies ---

    /// A put's copy loop as `copy` emits it: slots aligned down from the buffers (`and`
    /// with -16), one 128-bit global load from `local` (+72) and one 128-bit global store
    /// into `remote` (+56) per slot.
    const WIDE_PUT: &str = "ld.param.b64 %rd50, [K_param_0+56];\n\
        ld.param.b64 %rd51, [K_param_0+72];\n\
        and.b64 %rd52, %rd50, -16;\n\
        and.b64 %rd53, %rd51, -16;\n\
        add.s64 %rd54, %rd52, %rd57;\n\
        add.s64 %rd55, %rd53, %rd57;\n\
        $L__C1:\n\
        ld.global.v2.u64 {%rd60, %rd61}, [%rd55];\n\
        st.global.v2.u64 [%rd54], {%rd60, %rd61};\n\
        add.s64 %rd54, %rd54, %rd58;\n\
        add.s64 %rd55, %rd55, %rd58;\n\
        setp.lt.u64 %p5, %rd54, %rd59;\n\
        @%p5 bra $L__C1;";

    /// The loop of [`WIDE_PUT`] as LLVM lowers a copy of a 16-byte struct: two generic
    /// 8-byte loads and stores per unit.
    const SPLIT_PUT: &str = "ld.param.b64 %rd50, [K_param_0+56];\n\
        ld.param.b64 %rd51, [K_param_0+72];\n\
        $L__C1:\n\
        add.s64 %rd52, %rd50, %rd55;\n\
        add.s64 %rd53, %rd51, %rd55;\n\
        ld.b64 %rd60, [%rd53];\n\
        st.b64 [%rd52], %rd60;\n\
        ld.b64 %rd61, [%rd53+8];\n\
        st.b64 [%rd52+8], %rd61;\n\
        add.s64 %rd55, %rd55, %rd58;\n\
        setp.lt.u64 %p5, %rd55, %rd59;\n\
        @%p5 bra $L__C1;";

    /// Guards against the wide-copy rule refusing the copy loop's own shape, either vector
    /// form, in either direction.
    #[test]
    fn wide_copy_loop_passes() {
        let put = &[Need::MemoryPut, Need::WideCopy];
        assert_passes(&check_one("k", MEMORY, put, WIDE_PUT));
        let v4 = WIDE_PUT
            .replace(
                "ld.global.v2.u64 {%rd60, %rd61}",
                "ld.global.v4.u32 {%r1, %r2, %r3, %r4}",
            )
            .replace(
                "st.global.v2.u64 [%rd54], {%rd60, %rd61}",
                "st.global.v4.u32 [%rd54], {%r1, %r2, %r3, %r4}",
            );
        assert_passes(&check_one("k", MEMORY, put, &v4));
        let get = WIDE_PUT
            .replace("[K_param_0+56]", "[K_param_0+999]")
            .replace("[K_param_0+72]", "[K_param_0+56]")
            .replace("[K_param_0+999]", "[K_param_0+72]");
        assert_passes(&check_one(
            "k",
            MEMORY,
            &[Need::MemoryGet, Need::WideCopy],
            &get,
        ));
    }

    /// Guards against the copy's 16-byte units passing while LLVM splits each into two
    /// generic 8-byte loads and stores: still a put, but not a wide one.
    #[test]
    fn split_copy_fails() {
        assert_passes(&check_one("k", MEMORY, &[Need::MemoryPut], SPLIT_PUT));
        let r = check_one("k", MEMORY, &[Need::WideCopy], SPLIT_PUT);
        assert_fails(&r, "expected-step", "128-bit copy loop");
        assert_fails(
            &r,
            "expected-step",
            "`ld.b64` to `st.b64` at line 12 (8 bytes, generic)",
        );
    }

    /// Guards against wide accesses counting where they are not the copy's loop: outside
    /// any loop, generic rather than global, volatile rather than plain data, or storing
    /// something not loaded from a channel buffer.
    #[test]
    fn wide_copy_outside_a_loop_generic_volatile_or_unrelated_fails() {
        let once = WIDE_PUT.replace("@%p5 bra $L__C1;", "");
        let r = check_one("k", MEMORY, &[Need::WideCopy], &once);
        assert_fails(&r, "expected-step", "no loop stores into");
        let generic = WIDE_PUT.replace("ld.global.v2", "ld.v2");
        let r = check_one("k", MEMORY, &[Need::WideCopy], &generic);
        assert_fails(&r, "expected-step", "(16 bytes, generic)");
        let volatile = WIDE_PUT.replace("st.global.v2", "st.volatile.global.v2");
        let r = check_one("k", MEMORY, &[Need::WideCopy], &volatile);
        assert_fails(&r, "expected-step", "(16 bytes, global, volatile)");
        let unrelated = WIDE_PUT.replace("[K_param_0+72]", "[K_param_1]");
        let r = check_one("k", MEMORY, &[Need::WideCopy], &unrelated);
        assert_fails(&r, "expected-step", "no loop stores into");
    }

    // --- LL packets ---

    /// An LL8 store into the remote buffer: data | flag << 32, one relaxed 64-bit store.
    const LL8_STORE: &str = "ld.param.b64 %rd60, [K_param_0+56];\n\
        ld.param.b32 %r1, [K_param_1];\n\
        cvt.u64.u32 %rd61, %r1;\n\
        shl.b64 %rd62, %rd61, 32;\n\
        ld.b32 %rd63, [%rd69];\n\
        or.b64 %rd64, %rd62, %rd63;\n\
        add.s64 %rd65, %rd60, %rd68;\n\
        st.relaxed.sys.global.u64 [%rd65], %rd64;";

    /// Guards against the LL8 rule refusing either packet store the device code may emit
    /// (a relaxed 64-bit store, or a volatile pair of 32-bit words with the flag second).
    #[test]
    fn ll8_packet_is_one_store_with_its_flag() {
        assert_passes(&check_one("k", LL, &[Need::Ll8Store], LL8_STORE));
        let volatile = LL8_STORE.replace(
            "st.relaxed.sys.global.u64 [%rd65], %rd64;",
            "st.volatile.global.v2.u32 [%rd65], {%r2, %r1};",
        );
        assert_passes(&check_one("k", LL, &[Need::Ll8Store], &volatile));
    }

    /// Guards against the LL8 rule passing on an unrelated store (any 8-byte volatile store
    /// satisfied it), while the flag travels in a store of its own.
    #[test]
    fn ll8_flag_in_its_own_store_fails() {
        let body = "ld.param.b64 %rd60, [K_param_0+56];\n\
            ld.param.b64 %rd70, [K_param_0+72];\n\
            ld.param.b32 %r1, [K_param_1];\n\
            st.volatile.global.v2.u32 [%rd70], {%r2, %r3};\n\
            st.volatile.global.u32 [%rd60], %r2;\n\
            st.volatile.global.u32 [%rd60+4], %r1;";
        let r = check_one("k", LL, &[Need::Ll8Store], body);
        assert_fails(&r, "ll8-store", "st.volatile.global.u32");
        assert_fails(&r, "expected-step", "flag");
    }

    /// Guards against a weak packet store, which may be split or reordered.
    #[test]
    fn ll8_weak_store_fails() {
        let body = LL8_STORE.replace("st.relaxed.sys.global.u64", "st.global.u64");
        let r = check_one("k", LL, &[Need::Ll8Store], &body);
        assert_fails(&r, "ll8-store", "st.global.u64");
    }

    /// An LL16 store: both 64-bit halves carry the flag, one 128-bit volatile store.
    const LL16_STORE: &str = "ld.param.b64 %rd60, [K_param_0+56];\n\
        ld.param.b32 %r1, [K_param_1];\n\
        cvt.u64.u32 %rd61, %r1;\n\
        shl.b64 %rd62, %rd61, 32;\n\
        or.b64 %rd64, %rd62, %rd63;\n\
        or.b64 %rd66, %rd62, %rd67;\n\
        add.s64 %rd65, %rd60, %rd68;\n\
        st.volatile.global.v2.u64 [%rd65], {%rd64, %rd66};";

    /// Guards against the LL16 rule refusing the one volatile 16-byte store of a packet.
    #[test]
    fn ll16_packet_is_one_store_with_a_flag_per_half() {
        assert_passes(&check_one("k", LL, &[Need::Ll16Store], LL16_STORE));
    }

    /// Guards against an LL16 packet written as two 8-byte stores (the halves may arrive
    /// apart) or with the flag in one half only.
    #[test]
    fn ll16_split_or_half_flagged_fails() {
        let split = LL16_STORE.replace(
            "st.volatile.global.v2.u64 [%rd65], {%rd64, %rd66};",
            "st.volatile.global.u64 [%rd65], %rd64;\nst.volatile.global.u64 [%rd65+8], %rd66;",
        );
        let r = check_one("k", LL, &[Need::Ll16Store], &split);
        assert_fails(&r, "ll16-store", "st.volatile.global.u64");
        assert_fails(&r, "expected-step", "16-byte");
        let half = LL16_STORE.replace("or.b64 %rd66, %rd62, %rd67;", "mov.b64 %rd66, %rd67;");
        let r = check_one("k", LL, &[Need::Ll16Store], &half);
        assert_fails(&r, "expected-step", "16-byte");
    }

    /// An LL8 poll of the packet buffer (+88): relaxed load, flag compared, in a loop.
    const LL8_POLL: &str = "ld.param.b64 %rd80, [K_param_0+88];\n\
        ld.param.b32 %r8, [K_param_1];\n\
        $L__R1:\n\
        ld.relaxed.sys.global.u64 %rd82, [%rd80];\n\
        mov.b64 {_, %r26}, %rd82;\n\
        setp.ne.b32 %p36, %r8, %r26;\n\
        @%p36 bra $L__R1;";

    /// Guards against the poll rules refusing a real poll: the flag half unpacked with
    /// `mov.b64 {_, %r}`, compared with the flag, in a loop.
    #[test]
    fn ll8_poll_compares_the_flag_in_a_loop() {
        assert_passes(&check_one("k", LL, &[Need::Ll8Poll], LL8_POLL));
        let ll16 = LL8_POLL.replace(
            "ld.relaxed.sys.global.u64 %rd82, [%rd80];\nmov.b64 {_, %r26}, %rd82;",
            "ld.volatile.global.v2.u64 {%rd82, %rd83}, [%rd80];\nmov.b64 {_, %r26}, %rd82;",
        );
        assert_passes(&check_one("k", LL, &[Need::Ll16Poll], &ll16));
    }

    /// Guards against a poll that never looks at the flag, or a load of the packet buffer
    /// outside any loop.
    #[test]
    fn ll8_poll_without_flag_or_loop_fails() {
        let no_flag =
            LL8_POLL.replace("setp.ne.b32 %p36, %r8, %r26;", "setp.ne.b32 %p36, 7, %r26;");
        let r = check_one("k", LL, &[Need::Ll8Poll], &no_flag);
        assert_fails(&r, "expected-step", "flag");
        let no_loop = LL8_POLL.replace("@%p36 bra $L__R1;", "");
        let r = check_one("k", LL, &[Need::Ll8Poll], &no_loop);
        assert_fails(&r, "expected-step", "not polled");
    }

    // --- barrier count ---

    /// Guards against a block barrier duplicated into both arms of a branch (MIR jump
    /// threading, rust-lang/rust#137086) or dropped: the PTX must have one barrier per
    /// source site.
    #[test]
    fn barriers_match_source_sites() {
        let one = "bar.red.or.pred %p2, 0, %p1;";
        let dup = "@%p3 bra $L__A;\nbar.red.or.pred %p2, 0, %p1;\nbra.uni $L__B;\n\
                   $L__A:\nbar.red.or.pred %p2, 0, %p1;\n$L__B:";
        let m = module(&[("k", one), ("d", dup), ("z", "")]);
        let srcs = [
            source("k", &[], 1),
            source("d", &[], 1),
            source("z", &[], 1),
        ];
        let r = check(
            &m,
            &srcs,
            &[Expectation {
                kernels: "*",
                needs: &[],
            }],
        );
        let got: Vec<(&str, &str)> = r
            .violations
            .iter()
            .map(|v| (v.rule, v.function.as_str()))
            .collect();
        assert_eq!(got, [("barrier-count", "d"), ("barrier-count", "z")]);
        assert!(
            r.violations[0].message.contains("2 block barriers"),
            "{r:#?}"
        );
    }

    // --- module-wide rules and expectations ---

    /// Guards against an expectation that no kernel matches passing silently (a renamed
    /// kernel would no longer be checked).
    #[test]
    fn unmatched_expectation_fails() {
        let m = module(&[("tree_broadcast", "")]);
        let exp = [
            Expectation {
                kernels: "port_*",
                needs: &[Need::FifoPublish],
            },
            Expectation {
                kernels: "tree_*",
                needs: &[],
            },
        ];
        let r = check(&m, &[source("tree_broadcast", &[], 0)], &exp);
        assert_eq!(rules(&r), ["unmatched-expectation"]);
        assert!(r.violations[0].message.contains("port_*"));
        let r = check(&m, &[source("tree_broadcast", &[], 0)], &exp[..1]);
        assert!(
            r.notes[0].contains("`tree_broadcast` matches no line"),
            "{:?}",
            r.notes
        );
    }

    /// Guards against a sequentially consistent fence (a SeqCst Rust atomic, rust#136480)
    /// slipping in where an acquire or release is meant.
    #[test]
    fn fence_sc_and_membar_fail_anywhere() {
        let m = module(&[
            ("a", "fence.sc.sys;"),
            ("b", "membar.gl;"),
            ("c", "fence.acq_rel.sys;"),
        ]);
        let r = check(&m, &[], &[]);
        assert_eq!(rules(&r), ["fence-sc", "fence-sc"]);
    }

    /// Guards against a release vector store anywhere: its elements are unordered.
    #[test]
    fn vector_release_fails_anywhere() {
        let m = module(&[("a", "st.release.sys.global.v2.u64 [%rd1], {%rd2, %rd3};")]);
        assert_eq!(rules(&check(&m, &[], &[])), ["vector-release"]);
    }

    /// Guards against atomics on the stack (rust#146686), explicit or through a generic
    /// address of the frame, and against a pointer loaded from the stack taken for one.
    #[test]
    fn atomics_on_the_stack_fail() {
        let m = module(&[
            ("explicit", "atom.local.add.u64 %rd1, [%rd2], 1;"),
            (
                "generic",
                ".local .align 8 .b8 __local_depot1[16];\n\
                 mov.b64 %SPL, __local_depot1;\n\
                 cvta.local.u64 %SP, %SPL;\n\
                 add.u64 %rd2, %SP, 8;\n\
                 mov.b64 %rd3, %rd2;\n\
                 atom.add.u64 %rd1, [%rd3], 1;",
            ),
            (
                "via_depot",
                "add.u64 %rd4, __local_depot2, 0;\nred.global.add.u64 [%rd4+8], 1;",
            ),
            (
                // A value loaded from the stack is not a stack address.
                "loaded_pointer",
                "add.u64 %rd2, %SPL, 0;\nld.local.u64 %rd3, [%rd2];\n\
                 atom.global.add.u64 %rd1, [%rd3], 1;",
            ),
        ]);
        let r = check(&m, &[], &[]);
        let got: Vec<(&str, &str)> = r
            .violations
            .iter()
            .map(|v| (v.rule, v.function.as_str()))
            .collect();
        assert_eq!(
            got,
            [
                ("local-atomic", "explicit"),
                ("local-atomic", "generic"),
                ("local-atomic", "via_depot"),
            ]
        );
    }

    /// Guards against an expectation line matching the wrong kernels.
    #[test]
    fn patterns() {
        assert!(name_matches("port_*", "port_pingpong"));
        assert!(!name_matches("port_*", "memory_pingpong"));
        assert!(name_matches("ll8_exchange", "ll8_exchange"));
        assert!(!name_matches("ll8_exchange", "ll8_exchange2"));
    }

    /// Guards against a second kernel crate in the workspace (an example's) failing
    /// `build-ptx --check` because the shipped kernels' expectations match none of its
    /// kernels: only the shipped crate is held to them.
    #[test]
    fn only_the_shipped_crate_is_held_to_its_expectations() {
        assert_eq!(expectations_for(SHIPPED_KERNELS).len(), EXPECTATIONS.len());
        let m = module(&[("memory_all_gather", "")]);
        let own = [source("memory_all_gather", &[], 0)];
        let r = check(&m, &own, expectations_for("custom-collective-kernels"));
        assert!(r.violations.is_empty(), "{:#?}", r.violations);
        assert!(r.notes[0].contains("matches no line"), "{:?}", r.notes);
        let r = check(&m, &own, expectations_for(SHIPPED_KERNELS));
        assert!(rules(&r).contains(&"unmatched-expectation"));
    }

    /// Guards against a probe or a shipped kernel left without the steps it must contain:
    /// every expectation names kernels that exist in the shipped kernel crate's sources.
    #[test]
    fn every_expectation_names_a_shipped_kernel() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../device-kernels");
        let kernels =
            crate::kernels::scan_dir(&root.join("kernels/src"), Some(&root.join("src"))).unwrap();
        for e in EXPECTATIONS {
            assert!(
                kernels.iter().any(|k| name_matches(e.kernels, &k.name)),
                "`{}` matches no kernel",
                e.kernels
            );
        }
    }
}
