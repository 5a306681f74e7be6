//! How many block barriers a kernel's Rust source has: the barrier sites a launch of it can
//! reach, counted through its call graph.
//!
//! A barrier site is a call of `arch::sync_threads` or `arch::sync_threads_or` (any path
//! ending in those names), or a call of a function that holds barrier sites, which counts as
//! many as that function holds (`block::block_agrees` holds one). A call in a loop is one
//! site: it is one barrier instruction in the PTX. Closures count where they are written (a
//! closure passed to `block_agrees` is inlined into it once).
//!
//! The PTX of a kernel built with every device function inlined has exactly one barrier
//! instruction per site; more means the compiler copied a barrier into the arms of a branch
//! (MIR jump threading does, rust-lang/rust#137086), so that threads of a block can wait at
//! different barriers.
//!
//! Calls are resolved by name, as a reader would, without type information: a call of a
//! parameter or a local binding (a closure: `step()`) is no function call, its closure
//! counted where it is written; a path call prefers a function of the same file; a method call looks at every method of that name.
//! Candidates that disagree on their count are told apart by their number of arguments; if
//! that does not settle it, counting fails and names the call. Items under `#[cfg(test)]`
//! are not device code and are skipped.

use anyhow::{Result, bail};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use syn::visit::Visit;

/// Names whose calls are block barriers.
pub const BARRIERS: &[&str] = &["sync_threads", "sync_threads_or"];

/// The functions of a crate's sources and the calls each makes.
#[derive(Debug, Default)]
pub struct CallGraph {
    fns: Vec<FnInfo>,
    files: Vec<PathBuf>,
}

#[derive(Debug)]
struct FnInfo {
    name: String,
    file: usize,
    has_self: bool,
    /// Parameters besides `self`.
    params: usize,
    calls: Vec<Call>,
}

#[derive(Clone, Debug)]
struct Call {
    name: String,
    /// `x.name(..)` rather than `path::name(..)`.
    method: bool,
    /// Arguments, receiver excluded for a method call.
    args: usize,
}

impl CallGraph {
    /// Reads every function (free, in an `impl`, or a trait's default method) of `files`.
    pub fn new(files: &[(PathBuf, syn::File)]) -> CallGraph {
        let mut graph = CallGraph::default();
        for (i, (path, file)) in files.iter().enumerate() {
            graph.files.push(path.clone());
            let mut v = FnCollector {
                file: i,
                out: &mut graph.fns,
            };
            v.visit_file(file);
        }
        graph
    }

    /// Barrier sites of the function `name` defined in `file` (a kernel).
    pub fn sites(&self, name: &str, file: &Path) -> Result<usize> {
        let Some(at) = self
            .fns
            .iter()
            .position(|f| f.name == name && self.files[f.file] == file)
        else {
            bail!("no function `{name}` in {}", file.display());
        };
        let mut memo = HashMap::new();
        self.sites_of(at, &mut memo)
    }

    fn sites_of(&self, at: usize, memo: &mut HashMap<usize, Option<usize>>) -> Result<usize> {
        match memo.get(&at) {
            Some(Some(n)) => return Ok(*n),
            // Recursion: a recursive device function holds no barrier site of its own on the
            // way back in.
            Some(None) => return Ok(0),
            None => {}
        }
        memo.insert(at, None);
        let f = &self.fns[at];
        let mut total = 0;
        for call in &f.calls {
            total += self.call_sites(f, call, memo)?;
        }
        memo.insert(at, Some(total));
        Ok(total)
    }

    fn call_sites(
        &self,
        caller: &FnInfo,
        call: &Call,
        memo: &mut HashMap<usize, Option<usize>>,
    ) -> Result<usize> {
        if BARRIERS.contains(&call.name.as_str()) {
            return Ok(1);
        }
        let mut candidates: Vec<usize> = (0..self.fns.len())
            .filter(|&i| self.fns[i].name == call.name && (!call.method || self.fns[i].has_self))
            .collect();
        if !call.method && candidates.iter().any(|&i| self.fns[i].file == caller.file) {
            candidates.retain(|&i| self.fns[i].file == caller.file);
        }
        let mut counted = Vec::new();
        for &c in &candidates {
            counted.push((c, self.sites_of(c, memo)?));
        }
        if counted.windows(2).all(|w| w[0].1 == w[1].1) {
            return Ok(counted.first().map_or(0, |c| c.1));
        }
        // They disagree: keep those whose parameters fit the call's arguments.
        counted.retain(|&(c, _)| {
            let f = &self.fns[c];
            let expected = if f.has_self && !call.method {
                f.params + 1
            } else {
                f.params
            };
            expected == call.args
        });
        if !counted.is_empty() && counted.windows(2).all(|w| w[0].1 == w[1].1) {
            return Ok(counted[0].1);
        }
        bail!(
            "cannot tell which `{}` `{}` ({}) calls: functions of that name hold different \
             numbers of block barriers; give one of them another name",
            call.name,
            caller.name,
            self.files[caller.file].display()
        )
    }
}

/// Whether `attrs` hold `#[cfg(test)]` (or a `cfg` that needs `test`).
fn is_test_only(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| {
        a.path().is_ident("cfg")
            && a.meta.require_list().is_ok_and(|l| {
                l.tokens
                    .to_string()
                    .split(|c: char| !c.is_alphanumeric() && c != '_')
                    .any(|t| t == "test")
            })
    })
}

struct FnCollector<'a> {
    file: usize,
    out: &'a mut Vec<FnInfo>,
}

impl FnCollector<'_> {
    fn add(&mut self, sig: &syn::Signature, body: &syn::Block) {
        let has_self = sig.receiver().is_some();
        let mut locals = Bindings::default();
        for input in &sig.inputs {
            locals.visit_fn_arg(input);
        }
        locals.visit_block(body);
        let mut calls = CallCollector {
            locals: locals.names,
            calls: Vec::new(),
        };
        calls.visit_block(body);
        self.out.push(FnInfo {
            name: sig.ident.to_string(),
            file: self.file,
            has_self,
            params: sig.inputs.len() - usize::from(has_self),
            calls: calls.calls,
        });
    }
}

impl<'ast> Visit<'ast> for FnCollector<'_> {
    fn visit_item_mod(&mut self, m: &'ast syn::ItemMod) {
        if !is_test_only(&m.attrs) {
            syn::visit::visit_item_mod(self, m);
        }
    }

    fn visit_item_fn(&mut self, f: &'ast syn::ItemFn) {
        if !is_test_only(&f.attrs) {
            self.add(&f.sig, &f.block);
            // Functions nested in the body are functions too.
            syn::visit::visit_block(self, &f.block);
        }
    }

    fn visit_impl_item_fn(&mut self, f: &'ast syn::ImplItemFn) {
        if !is_test_only(&f.attrs) {
            self.add(&f.sig, &f.block);
        }
    }

    fn visit_trait_item_fn(&mut self, f: &'ast syn::TraitItemFn) {
        if let (Some(body), false) = (&f.default, is_test_only(&f.attrs)) {
            self.add(&f.sig, body);
        }
    }

    fn visit_item_impl(&mut self, i: &'ast syn::ItemImpl) {
        if !is_test_only(&i.attrs) {
            syn::visit::visit_item_impl(self, i);
        }
    }
}

/// Names a function body binds: its parameters, `let`s, closure and pattern bindings.
#[derive(Default)]
struct Bindings {
    names: Vec<String>,
}

impl<'ast> Visit<'ast> for Bindings {
    fn visit_pat_ident(&mut self, p: &'ast syn::PatIdent) {
        self.names.push(p.ident.to_string());
        syn::visit::visit_pat_ident(self, p);
    }

    fn visit_item(&mut self, _: &'ast syn::Item) {}
}

struct CallCollector {
    locals: Vec<String>,
    calls: Vec<Call>,
}

impl<'ast> Visit<'ast> for CallCollector {
    fn visit_expr_call(&mut self, c: &'ast syn::ExprCall) {
        if let syn::Expr::Path(p) = &*c.func
            && let Some(last) = p.path.segments.last()
            && !(p.path.segments.len() == 1 && self.locals.contains(&last.ident.to_string()))
        {
            self.calls.push(Call {
                name: last.ident.to_string(),
                method: false,
                args: c.args.len(),
            });
        }
        syn::visit::visit_expr_call(self, c);
    }

    fn visit_expr_method_call(&mut self, c: &'ast syn::ExprMethodCall) {
        self.calls.push(Call {
            name: c.method.to_string(),
            method: true,
            args: c.args.len(),
        });
        syn::visit::visit_expr_method_call(self, c);
    }

    /// `dispatch_element!(dtype, T => body)` instantiates `body` once per element type:
    /// its calls count that many times, as the PTX holds that many copies of them.
    fn visit_macro(&mut self, m: &'ast syn::Macro) {
        let Some(name) = m.path.segments.last() else {
            return;
        };
        if name.ident != DISPATCH_MACRO {
            return;
        }
        let body = m.parse_body_with(|input: syn::parse::ParseStream<'_>| {
            let _dtype: syn::Expr = input.parse()?;
            input.parse::<syn::Token![,]>()?;
            let _ty: syn::Ident = input.parse()?;
            input.parse::<syn::Token![=>]>()?;
            input.parse::<syn::Expr>()
        });
        if let Ok(body) = body {
            let mut inner = CallCollector {
                locals: self.locals.clone(),
                calls: Vec::new(),
            };
            inner.visit_expr(&body);
            for _ in 0..DISPATCHED_TYPES {
                self.calls.extend(inner.calls.iter().cloned());
            }
        }
    }

    // Items nested in a body are not part of it.
    fn visit_item(&mut self, _: &'ast syn::Item) {}
}

/// The macro that instantiates its body once per element type
/// (`oxccl_device::dispatch_element!`).
pub const DISPATCH_MACRO: &str = "dispatch_element";

/// Element types `dispatch_element!` instantiates its body for: the arms of the macro in
/// `device-kernels/src/reduce.rs` (a test checks they agree).
pub const DISPATCHED_TYPES: usize = 10;

#[cfg(test)]
mod tests {
    use super::*;

    fn graph(files: &[(&str, &str)]) -> CallGraph {
        let parsed: Vec<(PathBuf, syn::File)> = files
            .iter()
            .map(|(p, text)| (PathBuf::from(p), syn::parse_file(text).unwrap()))
            .collect();
        CallGraph::new(&parsed)
    }

    const LIB: &str = r#"
        pub fn block_agrees(step: impl FnOnce() -> bool) -> bool {
            let mine = if arch::thread_rank_in_block() == 0 { step() } else { false };
            arch::sync_threads_or(mine)
        }
        impl SyncCoop for Block {
            fn sync(&self) { arch::sync_threads() }
        }
        impl Fifo {
            fn sync(&self, position: u64) -> bool { self.wait(position) }
        }
        #[cfg(test)]
        mod tests {
            fn exchange() { sync_threads(); sync_threads(); }
        }
    "#;

    /// Guards against the count the PTX is compared with being wrong: sites through helpers,
    /// in loops and closures count once each; a helper called twice counts twice.
    #[test]
    fn counts_sites_through_helpers() {
        let g = graph(&[
            ("src/lib.rs", LIB),
            (
                "src/k.rs",
                r#"
                #[kernel]
                fn ring(n: u32) {
                    block_agrees(|| true);
                    for _ in 0..n {
                        arch::sync_threads();
                        block_agrees(|| { block_agrees(|| false) });
                        step();
                    }
                    Block.sync();
                    fifo.sync(3);
                }
                fn step() { exchange(); exchange(); }
                fn exchange() { arch::sync_threads(); }
                "#,
            ),
        ]);
        // 1 + 1 + 2 (nested closures: two calls) + 2 (step) + 1 (Block.sync) + 0.
        assert_eq!(g.sites("ring", Path::new("src/k.rs")).unwrap(), 7);
        assert_eq!(g.sites("block_agrees", Path::new("src/lib.rs")).unwrap(), 1);
    }

    /// Guards against the body of `dispatch_element!` being skipped (it is a macro, not a
    /// call) or counted once although the PTX holds one copy per element type, and
    /// against the type count drifting from the macro's arms.
    #[test]
    fn dispatched_bodies_count_once_per_type() {
        let g = graph(&[(
            "src/k.rs",
            r#"
            #[kernel]
            fn k(dtype: DataType) {
                arch::sync_threads();
                oxccl_device::dispatch_element!(dtype, T => run::<T>(1))
            }
            fn run<T>(x: u32) { arch::sync_threads(); arch::sync_threads(); }
            "#,
        )]);
        assert_eq!(
            g.sites("k", Path::new("src/k.rs")).unwrap(),
            1 + 2 * DISPATCHED_TYPES
        );
        let reduce = std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../device-kernels/src/reduce.rs"),
        )
        .unwrap();
        let start = reduce.find("macro_rules! dispatch_element").unwrap();
        let arms = reduce[start..]
            .lines()
            .take_while(|l| *l != "}")
            .filter(|l| l.trim_start().starts_with("$crate::reduce::DataType::"))
            .count();
        assert_eq!(arms, DISPATCHED_TYPES);
    }

    /// Guards against a name shared by two functions being counted as the wrong one: the
    /// same file wins for path calls, argument counts tell methods apart, and what cannot be
    /// told apart is an error rather than a guess.
    #[test]
    fn resolves_or_refuses_shared_names() {
        let g = graph(&[
            ("src/lib.rs", LIB),
            (
                "src/a.rs",
                "fn all_reduce() { sync_threads(); } #[kernel] fn ka() { all_reduce(); }",
            ),
            (
                "src/b.rs",
                "fn all_reduce() {} #[kernel] fn kb() { all_reduce(); }",
            ),
            (
                "src/c.rs",
                "#[kernel] fn kc(c: impl SyncCoop) { c.sync(); }",
            ),
        ]);
        assert_eq!(g.sites("ka", Path::new("src/a.rs")).unwrap(), 1);
        assert_eq!(g.sites("kb", Path::new("src/b.rs")).unwrap(), 0);
        // `c.sync()` has no argument: `Block::sync`, not `Fifo::sync`.
        assert_eq!(g.sites("kc", Path::new("src/c.rs")).unwrap(), 1);

        let g = graph(&[
            ("src/lib.rs", LIB),
            (
                "src/d.rs",
                "impl Thread { fn sync(&self) {} } #[kernel] fn kd(c: X) { c.sync(); }",
            ),
        ]);
        let err = g
            .sites("kd", Path::new("src/d.rs"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("cannot tell which `sync`"), "{err}");
    }
}
