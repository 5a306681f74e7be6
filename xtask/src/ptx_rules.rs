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
//! - `publish-scope`: a 128-bit release store (a FIFO publish) is at system scope.
//!
//! Rules on every kernel, over the code it can execute (its body and the device functions
//! it calls):
//! - `publish-needs-head-add`: a kernel that publishes a trigger also claims its slot with a
//!   device-scope (`.gpu`) add on the FIFO head;
//! - each [`Need`] that [`EXPECTATIONS`] lists for the kernel's name is present. This is
//!   the one place that says which kernels push, signal and wait: a `port_*` kernel that
//!   publishes nothing fails here, instead of passing because there is nothing to check.

use crate::ptx::{Function, Instruction, Module, names_in};
use std::collections::BTreeSet;
use std::fmt;

/// A protocol step whose instruction a kernel must contain.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Need {
    /// Publishes a FIFO trigger: one 128-bit release store at system scope
    /// (`st.release.sys.global.v2.u64`), read by the host proxy.
    FifoPublish,
    /// Claims a FIFO slot: an atomic add on the head at device scope
    /// (`atom.relaxed.gpu.global.add.u64`); only kernel threads contend on it.
    HeadAdd,
    /// Waits on a semaphore: an acquire load at system scope (`ld.acquire.sys.global.u64`),
    /// since the proxy or a peer GPU raises it.
    AcquireWait,
    /// Signals a peer's semaphore: a release store at system scope
    /// (`st.release.sys.global.u64`), or a release RMW at system scope.
    ReleaseSignal,
    /// Writes an LL8 packet: data and flag in one 8-byte volatile or relaxed store
    /// (`st.volatile.global.v2.u32`, or a scalar 64-bit store).
    Ll8Store,
    /// Writes an LL16 packet: data and flags in one 16-byte volatile or relaxed store
    /// (`st.volatile.global.v2.u64` or `.v4.u32`).
    Ll16Store,
}

impl Need {
    /// Whether `ins` is an instruction that satisfies this need.
    pub fn satisfied_by(self, ins: &Instruction) -> bool {
        match self {
            Need::FifoPublish => is_fifo_publish(ins),
            Need::HeadAdd => is_head_add(ins),
            Need::AcquireWait => {
                ins.op() == "ld"
                    && ins.has("acquire")
                    && ins.has("sys")
                    && !is_vector(ins)
                    && elem_bits(ins) == Some(64)
                    && in_global_or_generic(ins)
            }
            Need::ReleaseSignal => {
                let store = ins.op() == "st"
                    && ins.has("release")
                    && !is_vector(ins)
                    && elem_bits(ins) == Some(64);
                let rmw = matches!(ins.op(), "atom" | "red")
                    && (ins.has("release") || ins.has("acq_rel"));
                (store || rmw) && ins.has("sys") && in_global_or_generic(ins)
            }
            Need::Ll8Store => {
                ins.op() == "st"
                    && is_unbuffered(ins)
                    && in_global_or_generic(ins)
                    && matches!(
                        (vector_width(ins), elem_bits(ins)),
                        (1, Some(64)) | (2, Some(32))
                    )
            }
            Need::Ll16Store => {
                ins.op() == "st"
                    && is_unbuffered(ins)
                    && in_global_or_generic(ins)
                    && is_128_bit(ins)
            }
        }
    }

    /// What the instruction looks like, for messages.
    pub fn describe(self) -> &'static str {
        match self {
            Need::FifoPublish => "a FIFO publish (`st.release.sys.global.v2.u64`)",
            Need::HeadAdd => "a device-scope FIFO head add (`atom.relaxed.gpu.global.add.u64`)",
            Need::AcquireWait => "a system-scope acquire load (`ld.acquire.sys.global.u64`)",
            Need::ReleaseSignal => "a system-scope release store (`st.release.sys.global.u64`)",
            Need::Ll8Store => "an 8-byte packet store (`st.volatile.global.v2.u32`)",
            Need::Ll16Store => "a 16-byte packet store (`st.volatile.global.v2.u64`)",
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

/// The kernels shipped in `oxccl-device` and what each must contain. Port-channel kernels
/// signal through the FIFO (the proxy raises the peer's semaphore), memory-channel kernels
/// raise the peer's semaphore themselves, LL kernels signal with the flag inside each packet.
pub const EXPECTATIONS: &[Expectation] = &[
    // port_ring_exchange, port_pingpong, and any later PortChannel kernel.
    Expectation {
        kernels: "port_*",
        needs: &[Need::FifoPublish, Need::HeadAdd, Need::AcquireWait],
    },
    // memory_ring_exchange, memory_pingpong.
    Expectation {
        kernels: "memory_*",
        needs: &[Need::ReleaseSignal, Need::AcquireWait],
    },
    // ring_all_reduce_sum_f32 and its siblings: collectives over memory channels.
    Expectation {
        kernels: "ring_all_reduce_*",
        needs: &[Need::ReleaseSignal, Need::AcquireWait],
    },
    Expectation {
        kernels: "ll8_*",
        needs: &[Need::Ll8Store],
    },
    Expectation {
        kernels: "ll16_*",
        needs: &[Need::Ll16Store],
    },
    // packet_all_reduce_sum_f32: every value travels as an LL16 packet.
    Expectation {
        kernels: "packet_all_reduce_*",
        needs: &[Need::Ll16Store],
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
    /// Informational lines, e.g. expectations that matched no kernel yet.
    pub notes: Vec<String>,
}

/// Checks `module` against the module-wide rules and `expectations`.
pub fn check(module: &Module, expectations: &[Expectation]) -> Report {
    let mut report = Report::default();
    for f in &module.functions {
        check_function(f, &mut report.violations);
    }
    for entry in module.entries() {
        check_entry(module, entry, expectations, &mut report.violations);
    }
    for k in module.entries() {
        if !expectations
            .iter()
            .any(|e| name_matches(e.kernels, &k.name))
        {
            report.notes.push(format!(
                "kernel `{}` matches no line of EXPECTATIONS: only the module-wide rules apply",
                k.name
            ));
        }
    }
    for e in expectations {
        if !module.entries().any(|k| name_matches(e.kernels, &k.name)) {
            report.notes.push(format!(
                "no kernel matches `{}` yet: its required steps are not checked",
                e.kernels
            ));
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
        if ins.op() == "st" && ins.has("release") && is_128_bit(ins) && !ins.has("sys") {
            flag(
                "publish-scope",
                format!(
                    "`{}` publishes 128 bits below system scope: the host proxy is not ordered \
                     by it; a FIFO publish is `st.release.sys.global.v2.u64`",
                    ins.text()
                ),
            );
        }
    }
}

fn check_entry(module: &Module, entry: &Function, exp: &[Expectation], out: &mut Vec<Violation>) {
    let reach = module.reachable_from(entry);
    let all = || reach.iter().flat_map(|f| f.instructions.iter());
    let has = |need: Need| all().any(|i| need.satisfied_by(i));

    if has(Need::FifoPublish) && !has(Need::HeadAdd) {
        let other_scope: Vec<String> = all()
            .filter(|i| i.op() == "atom" && i.has("add") && elem_bits(i) == Some(64))
            .map(|i| format!("`{}` (line {})", i.text(), i.line))
            .collect();
        let found = if other_scope.is_empty() {
            String::new()
        } else {
            format!("; found only {}", other_scope.join(", "))
        };
        out.push(Violation {
            rule: "publish-needs-head-add",
            function: entry.name.clone(),
            line: entry.line,
            message: format!(
                "publishes a FIFO trigger but claims no slot with {}{found}",
                Need::HeadAdd.describe()
            ),
        });
    }

    if let Some(e) = exp.iter().find(|e| name_matches(e.kernels, &entry.name)) {
        for &need in e.needs {
            if !has(need) {
                out.push(Violation {
                    rule: "expected-step",
                    function: entry.name.clone(),
                    line: entry.line,
                    message: format!(
                        "kernels matching `{}` must contain {}, and this one does not",
                        e.kernels,
                        need.describe()
                    ),
                });
            }
        }
    }
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

fn is_fifo_publish(ins: &Instruction) -> bool {
    ins.op() == "st"
        && ins.has("release")
        && ins.has("sys")
        && is_128_bit(ins)
        && in_global_or_generic(ins)
}

fn is_head_add(ins: &Instruction) -> bool {
    ins.op() == "atom" && ins.has("gpu") && ins.has("add") && elem_bits(ins) == Some(64)
}

/// Element width in bits, from the type modifier (`u64`, `b32`, `f16`, ...).
fn elem_bits(ins: &Instruction) -> Option<u32> {
    ins.opcode.rsplit('.').find_map(|m| {
        let (kind, bits) = m.split_at(1.min(m.len()));
        matches!(kind, "u" | "s" | "b" | "f")
            .then(|| bits.parse().ok())
            .flatten()
    })
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

fn is_128_bit(ins: &Instruction) -> bool {
    elem_bits(ins).is_some_and(|b| b * vector_width(ins) == 128)
}

fn in_global_or_generic(ins: &Instruction) -> bool {
    !["local", "shared", "param", "const"]
        .iter()
        .any(|s| ins.has(s))
        && !ins.opcode.contains(".shared::")
}

/// Volatile, relaxed or release: a store the hardware makes visible as one access.
fn is_unbuffered(ins: &Instruction) -> bool {
    ins.has("volatile") || ins.has("relaxed") || ins.has("release")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn module(bodies: &[(&str, &str)]) -> Module {
        let mut text = String::from(".version 6.0\n.target sm_70\n.address_size 64\n");
        for (name, body) in bodies {
            text.push_str(&format!(
                ".visible .entry {name}(\n.param .u64 p\n)\n{{\n{body}\nret;\n}}\n"
            ));
        }
        Module::parse(&text)
    }

    fn rules(report: &Report) -> Vec<(&'static str, String)> {
        report
            .violations
            .iter()
            .map(|v| (v.rule, v.function.clone()))
            .collect()
    }

    const PUSH: &str = "atom.relaxed.gpu.global.add.u64 %rd1, [%rd2], 1;\n\
                        st.release.sys.global.v2.u64 [%rd5], {%rd3, %rd4};";
    const WAIT: &str = "ld.acquire.sys.global.u64 %rd7, [%rd6];";
    const SIGNAL: &str = "st.release.sys.global.u64 [%rd6], %rd8;";

    #[test]
    fn port_kernel_with_push_and_wait_passes() {
        let m = module(&[("port_ring_exchange", &format!("{PUSH}\n{WAIT}"))]);
        let r = check(&m, EXPECTATIONS);
        assert!(r.violations.is_empty(), "{:?}", r.violations);
    }

    #[test]
    fn port_kernel_without_publish_fails() {
        // Guards against the rule passing vacuously once port kernels exist.
        let m = module(&[("port_pingpong", WAIT)]);
        let r = check(&m, EXPECTATIONS);
        assert_eq!(
            rules(&r),
            [
                ("expected-step", "port_pingpong".to_string()),
                ("expected-step", "port_pingpong".to_string())
            ]
        );
        assert!(
            r.violations[0]
                .message
                .contains("st.release.sys.global.v2.u64")
        );
    }

    #[test]
    fn publish_at_gpu_scope_fails() {
        let m = module(&[(
            "port_x",
            "atom.relaxed.gpu.global.add.u64 %rd1, [%rd2], 1;\n\
             st.release.gpu.global.v2.u64 [%rd5], {%rd3, %rd4};\n\
             ld.acquire.sys.global.u64 %rd7, [%rd6];",
        )]);
        let got = rules(&check(&m, EXPECTATIONS));
        assert!(got.contains(&("publish-scope", "port_x".into())), "{got:?}");
        assert!(got.contains(&("expected-step", "port_x".into())), "{got:?}");
    }

    #[test]
    fn publish_with_system_scope_head_add_fails() {
        // A `.sys` head add works but makes every push a system-scope RMW on host memory.
        let m = module(&[(
            "some_kernel",
            "atom.relaxed.sys.global.add.u64 %rd1, [%rd2], 1;\n\
             st.release.sys.global.v2.u64 [%rd5], {%rd3, %rd4};",
        )]);
        let r = check(&m, EXPECTATIONS);
        assert_eq!(
            rules(&r),
            [("publish-needs-head-add", "some_kernel".into())]
        );
        assert!(
            r.violations[0]
                .message
                .contains("atom.relaxed.sys.global.add.u64")
        );
    }

    #[test]
    fn head_add_may_live_in_a_called_function() {
        let text = ".func push(.param .b64 a)\n{\n\
                    atom.relaxed.gpu.global.add.u64 %rd1, [%rd2], 1;\nret;\n}\n\
                    .visible .entry port_k()\n{\n{\ncall.uni push, (param0);\n}\n\
                    st.release.sys.global.v2.u64 [%rd5], {%rd3, %rd4};\n\
                    ld.acquire.sys.global.u64 %rd7, [%rd6];\nret;\n}\n";
        let r = check(&Module::parse(text), EXPECTATIONS);
        assert!(r.violations.is_empty(), "{:?}", r.violations);
    }

    #[test]
    fn memory_kernel_needs_release_signal_and_acquire_wait() {
        let ok = module(&[("memory_ring_exchange", &format!("{SIGNAL}\n{WAIT}"))]);
        assert!(check(&ok, EXPECTATIONS).violations.is_empty());

        // A relaxed signal, and a wait that acquires at gpu scope only: both miss.
        let bad = module(&[(
            "memory_pingpong",
            "st.relaxed.sys.global.u64 [%rd6], %rd8;\nld.acquire.gpu.global.u64 %rd7, [%rd6];",
        )]);
        let r = check(&bad, EXPECTATIONS);
        let msgs: Vec<_> = r.violations.iter().map(|v| v.message.as_str()).collect();
        assert_eq!(msgs.len(), 2, "{msgs:?}");
        assert!(msgs[0].contains("st.release.sys.global.u64"));
        assert!(msgs[1].contains("ld.acquire.sys.global.u64"));
    }

    #[test]
    fn release_rmw_at_system_scope_counts_as_signal() {
        let m = module(&[(
            "memory_k",
            "atom.release.sys.global.add.u64 %rd1, [%rd2], 1;\nld.acquire.sys.u64 %rd3, [%rd2];",
        )]);
        assert!(check(&m, EXPECTATIONS).violations.is_empty());
    }

    #[test]
    fn ll_packets_need_single_stores() {
        let m = module(&[
            (
                "ll8_exchange",
                "st.volatile.global.v2.u32 [%rd1], {%r1, %r2};",
            ),
            (
                "ll16_exchange",
                "st.volatile.global.v2.u64 [%rd1], {%rd2, %rd3};",
            ),
        ]);
        assert!(check(&m, EXPECTATIONS).violations.is_empty());
        // Two separate 8-byte stores: the flag no longer rides with the data.
        let m = module(&[(
            "ll16_exchange",
            "st.volatile.global.u64 [%rd1], %rd2;\nst.volatile.global.u64 [%rd1+8], %rd3;",
        )]);
        assert_eq!(
            rules(&check(&m, EXPECTATIONS)),
            [("expected-step", "ll16_exchange".into())]
        );
        // A weak store may be split or reordered.
        let m = module(&[("ll8_exchange", "st.global.v2.u32 [%rd1], {%r1, %r2};")]);
        assert_eq!(
            rules(&check(&m, EXPECTATIONS)),
            [("expected-step", "ll8_exchange".into())]
        );
    }

    #[test]
    fn fence_sc_and_membar_fail_anywhere() {
        let m = module(&[
            ("a", "fence.sc.sys;"),
            ("b", "membar.gl;"),
            ("c", "fence.acq_rel.sys;"),
        ]);
        assert_eq!(
            rules(&check(&m, &[])),
            [("fence-sc", "a".into()), ("fence-sc", "b".into())]
        );
    }

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
        assert_eq!(
            rules(&check(&m, &[])),
            [
                ("local-atomic", "explicit".into()),
                ("local-atomic", "generic".into()),
                ("local-atomic", "via_depot".into()),
            ]
        );
    }

    #[test]
    fn atomics_on_parameters_pass() {
        let m = module(&[(
            "k",
            "ld.param.b64 %rd7, [p];\ncvta.to.global.u64 %rd8, %rd7;\n\
             atom.global.add.u64 %rd3, [%rd8], 3;",
        )]);
        assert!(check(&m, &[]).violations.is_empty());
    }

    #[test]
    fn unmatched_expectations_and_kernels_are_noted() {
        let r = check(&module(&[]), EXPECTATIONS);
        assert!(r.violations.is_empty());
        assert_eq!(r.notes.len(), EXPECTATIONS.len());
        let r = check(&module(&[("tree_broadcast", "")]), &EXPECTATIONS[..1]);
        assert!(r.violations.is_empty());
        assert_eq!(r.notes.len(), 2, "{:?}", r.notes);
        assert!(r.notes[0].contains("`tree_broadcast` matches no line"));
    }

    #[test]
    fn patterns() {
        assert!(name_matches("port_*", "port_pingpong"));
        assert!(!name_matches("port_*", "memory_pingpong"));
        assert!(name_matches("ll8_exchange", "ll8_exchange"));
        assert!(!name_matches("ll8_exchange", "ll8_exchange2"));
    }

    #[test]
    fn element_widths() {
        let i = |op: &str| Instruction {
            line: 1,
            guard: None,
            opcode: op.into(),
            operands: vec![],
        };
        assert_eq!(elem_bits(&i("st.release.sys.global.v2.u64")), Some(64));
        assert_eq!(elem_bits(&i("st.volatile.global.v4.b32")), Some(32));
        assert_eq!(elem_bits(&i("fence.sc.sys")), None);
        assert!(is_128_bit(&i("st.release.sys.global.v4.u32")));
        assert!(!is_128_bit(&i("st.release.sys.global.u64")));
    }
}
