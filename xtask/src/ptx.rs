//! A small reader for the PTX that LLVM's NVPTX backend emits: the module's functions
//! (`.entry` kernels and `.func` device functions), each body as a list of instructions with
//! their line numbers, predicate guards and labels, and the call graph between them.
//!
//! It is not a PTX parser: it knows just enough of the syntax (comments, strings, `{ }`
//! scopes inside bodies, vector operands in braces, labels and predicates) to let
//! [`crate::ptx_rules`] ask "which instructions can this kernel execute?", and
//! [`crate::ptx_cfg`] and [`crate::ptx_flow`] follow its branches and registers.

use std::collections::{BTreeSet, HashMap};

/// One parsed PTX module.
#[derive(Debug, Default)]
pub struct Module {
    /// Every function with a body, in file order.
    pub functions: Vec<Function>,
}

/// A function with a body: a kernel (`.entry`) or a device function (`.func`).
#[derive(Debug)]
pub struct Function {
    /// Symbol name as it appears in the PTX.
    pub name: String,
    /// Whether this is a kernel entry point (`.entry`).
    pub is_entry: bool,
    /// 1-based line of the `.entry` / `.func` directive.
    pub line: usize,
    /// Statements of the body, directives (`.reg`, `.local`, ...) included.
    pub instructions: Vec<Instruction>,
    /// Each label of the body and the index in `instructions` of the statement it names
    /// (`instructions.len()` for a label at the very end).
    pub labels: HashMap<String, usize>,
}

/// One statement of a function body, without its label and predicate guard.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Instruction {
    /// 1-based line where the statement starts.
    pub line: usize,
    /// The predicate guard without its `@`, e.g. `%p1` or `!%p1`; `None` if unguarded.
    pub guard: Option<String>,
    /// The opcode with its modifiers, e.g. `st.release.sys.global.v2.u64`, or a directive
    /// such as `.reg`.
    pub opcode: String,
    /// Operands, split at top-level commas and trimmed, e.g. `["[%rd5]", "{%rd3, %rd4}"]`.
    pub operands: Vec<String>,
}

impl Instruction {
    /// The base operation: `st` for `st.release.sys.global.v2.u64`.
    pub fn op(&self) -> &str {
        self.opcode.split('.').next().unwrap_or("")
    }

    /// Whether `modifier` is one of the dot-separated modifiers after the base operation
    /// (`has("sys")` for `ld.acquire.sys.global.u64`).
    pub fn has(&self, modifier: &str) -> bool {
        self.opcode.split('.').skip(1).any(|m| m == modifier)
    }

    /// Whether this is a directive (`.reg`, `.local`, `.pragma`, ...) rather than an instruction.
    pub fn is_directive(&self) -> bool {
        self.opcode.starts_with('.')
    }

    /// The statement as it reads in PTX (opcode and operands), for messages.
    pub fn text(&self) -> String {
        if self.operands.is_empty() {
            format!("{};", self.opcode)
        } else {
            format!("{} {};", self.opcode, self.operands.join(", "))
        }
    }
}

impl Module {
    /// Parses PTX text. Never fails: text it does not understand is skipped.
    pub fn parse(text: &str) -> Module {
        Parser::new(text).run()
    }

    /// The kernel entry points, in file order.
    pub fn entries(&self) -> impl Iterator<Item = &Function> {
        self.functions.iter().filter(|f| f.is_entry)
    }

    /// The function named `name`, if it has a body in this module.
    #[cfg(test)]
    pub fn function(&self, name: &str) -> Option<&Function> {
        self.functions.iter().find(|f| f.name == name)
    }

    /// `root` and every function it calls, directly or not, that has a body here: the code a
    /// launch of `root` can execute.
    pub fn reachable_from<'a>(&'a self, root: &'a Function) -> Vec<&'a Function> {
        let by_name: HashMap<&str, &Function> = self
            .functions
            .iter()
            .map(|f| (f.name.as_str(), f))
            .collect();
        let mut seen = BTreeSet::new();
        let mut order = Vec::new();
        let mut stack = vec![root];
        while let Some(f) = stack.pop() {
            if !seen.insert(f.name.as_str()) {
                continue;
            }
            order.push(f);
            for callee in f.callees() {
                if let Some(g) = by_name.get(callee) {
                    stack.push(g);
                }
            }
        }
        order
    }
}

impl Function {
    /// Names of the functions this one calls directly (`call` instructions).
    pub fn callees(&self) -> Vec<&str> {
        let mut out = Vec::new();
        for ins in self.instructions.iter().filter(|i| i.op() == "call") {
            // `call.uni (retval0), name, (param0, ...);` or `call.uni name, (...);`: the callee
            // is the first operand that is not a parenthesised parameter list.
            if let Some(name) = ins.operands.iter().find(|o| !o.starts_with('(')) {
                out.push(name.as_str());
            }
        }
        out
    }
}

struct Parser<'t> {
    chars: std::iter::Peekable<std::str::Chars<'t>>,
    line: usize,
    module: Module,
}

impl<'t> Parser<'t> {
    fn new(text: &'t str) -> Self {
        Parser {
            chars: text.chars().peekable(),
            line: 1,
            module: Module::default(),
        }
    }

    fn next_char(&mut self) -> Option<char> {
        let c = self.chars.next()?;
        if c == '\n' {
            self.line += 1;
        }
        Some(c)
    }

    /// Consumes a comment if one starts at `c` (already taken); returns whether it did.
    /// A comment counts as whitespace, except that a line comment keeps its newline.
    fn skip_comment(&mut self, c: char) -> bool {
        if c != '/' {
            return false;
        }
        match self.chars.peek() {
            Some('/') => {
                while let Some(&n) = self.chars.peek() {
                    if n == '\n' {
                        break;
                    }
                    self.chars.next();
                }
                true
            }
            Some('*') => {
                self.chars.next();
                let mut prev = ' ';
                while let Some(n) = self.next_char() {
                    if prev == '*' && n == '/' {
                        break;
                    }
                    prev = n;
                }
                true
            }
            _ => false,
        }
    }

    fn run(mut self) -> Module {
        // Top level: directives end with `;`; a `{` opens either a function body (when the
        // text since the last statement declared an `.entry` / `.func`) or an initializer.
        let mut header = String::new();
        let mut header_line = self.line;
        let mut init_depth = 0usize;
        while let Some(c) = self.next_char() {
            if self.skip_comment(c) {
                continue;
            }
            match c {
                '"' => self.skip_string(&mut header),
                '{' if init_depth > 0 => init_depth += 1,
                '}' if init_depth > 0 => init_depth -= 1,
                '{' => match function_header(&header) {
                    Some((name, is_entry)) => {
                        let (instructions, labels) = self.body();
                        self.module.functions.push(Function {
                            name,
                            is_entry,
                            line: header_line,
                            instructions,
                            labels,
                        });
                        header.clear();
                    }
                    None => init_depth = 1,
                },
                ';' => header.clear(),
                _ => {
                    if header.trim().is_empty() && !c.is_whitespace() {
                        header.clear();
                        header_line = self.line;
                    }
                    header.push(c);
                }
            }
        }
        self.module
    }

    fn skip_string(&mut self, into: &mut String) {
        into.push('"');
        while let Some(c) = self.next_char() {
            into.push(c);
            if c == '"' {
                break;
            }
        }
    }

    /// Reads a function body after its opening `{`, up to the matching `}`: its statements,
    /// and where each label points.
    fn body(&mut self) -> (Vec<Instruction>, HashMap<String, usize>) {
        let mut out = Body::default();
        let mut stmt = String::new();
        let mut stmt_line = self.line;
        let mut scope_depth = 1usize;
        // Braces inside a statement: vector operands such as `{%rd1, %rd2}`.
        let mut operand_braces = 0usize;
        while let Some(c) = self.next_char() {
            if self.skip_comment(c) {
                continue;
            }
            let empty = stmt.trim().is_empty() || is_only_labels(&stmt);
            match c {
                '"' => self.skip_string(&mut stmt),
                '{' if empty => {
                    // A nested scope, as LLVM emits around call sequences.
                    out.push_statement(&stmt, stmt_line);
                    stmt.clear();
                    scope_depth += 1;
                }
                '{' => {
                    operand_braces += 1;
                    stmt.push(c);
                }
                '}' if operand_braces > 0 => {
                    operand_braces -= 1;
                    stmt.push(c);
                }
                '}' => {
                    out.push_statement(&stmt, stmt_line);
                    stmt.clear();
                    scope_depth -= 1;
                    if scope_depth == 0 {
                        return out.finish();
                    }
                }
                ';' => {
                    out.push_statement(&stmt, stmt_line);
                    stmt.clear();
                    operand_braces = 0;
                }
                _ => {
                    if stmt.trim().is_empty() && !c.is_whitespace() {
                        stmt.clear();
                        stmt_line = self.line;
                    }
                    stmt.push(c);
                }
            }
        }
        out.push_statement(&stmt, stmt_line);
        out.finish()
    }
}

/// A body being read: its statements, and labels waiting for the statement they name.
#[derive(Default)]
struct Body {
    instructions: Vec<Instruction>,
    labels: HashMap<String, usize>,
}

impl Body {
    /// Adds `stmt` (which starts on line `line`); its labels name the next statement added,
    /// which is this one unless it holds nothing but labels.
    fn push_statement(&mut self, stmt: &str, line: usize) {
        let start = stmt.trim_start();
        let mut s = start;
        while let Some((label, after)) = split_label(s) {
            self.labels
                .insert(label.to_string(), self.instructions.len());
            s = after.trim_start();
        }
        // A predicate guard: `@%p1 bra ...` or `@!%p1 ...`.
        let mut guard = None;
        if let Some(guarded) = s.strip_prefix('@') {
            let (g, rest) = guarded
                .split_once(char::is_whitespace)
                .unwrap_or((guarded, ""));
            guard = Some(g.to_string());
            s = rest.trim_start();
        }
        // A label on its own line moves the instruction to a later line.
        let line = line + start[..start.len() - s.len()].matches('\n').count();
        let s = s.trim_end();
        if s.is_empty() {
            return;
        }
        let (opcode, operands) = match s.split_once(char::is_whitespace) {
            Some((op, rest)) => (op, split_operands(rest)),
            None => (s, Vec::new()),
        };
        self.instructions.push(Instruction {
            line,
            guard,
            opcode: opcode.to_string(),
            operands,
        });
    }

    fn finish(self) -> (Vec<Instruction>, HashMap<String, usize>) {
        (self.instructions, self.labels)
    }
}

/// If `header` (the text before a `{` at top level) declares a function, its name and whether
/// it is an entry.
fn function_header(header: &str) -> Option<(String, bool)> {
    let tokens: Vec<&str> = header.split_whitespace().collect();
    let (pos, is_entry) = tokens
        .iter()
        .position(|t| *t == ".entry" || *t == ".func")
        .map(|p| (p, tokens[p] == ".entry"))?;
    // Everything after the keyword, e.g. `(.param .b64 r) helper(.param .b64 a)`.
    let rest = tokens[pos + 1..].join(" ");
    let mut rest = rest.trim_start();
    if rest.starts_with('(') {
        // A `.func` return-value list.
        let close = rest.find(')')?;
        rest = rest[close + 1..].trim_start();
    }
    let name: String = rest.chars().take_while(|c| is_ident_char(*c)).collect();
    (!name.is_empty()).then_some((name, is_entry))
}

fn is_ident_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == '$' || c == '%'
}

/// Whether `stmt` holds only labels (`$L__BB0_1:`), which belong to the next statement.
fn is_only_labels(stmt: &str) -> bool {
    let mut rest = stmt.trim();
    while let Some((_, after)) = split_label(rest) {
        rest = after.trim_start();
    }
    rest.is_empty()
}

/// Splits one leading label `name:` (not `::`, as in `.shared::cta`) from `s`: the label's
/// name and what follows its colon.
fn split_label(s: &str) -> Option<(&str, &str)> {
    let end = s.find(|c: char| !is_ident_char(c))?;
    if end == 0 {
        return None;
    }
    let after = &s[end..];
    (after.starts_with(':') && !after.starts_with("::")).then(|| (&s[..end], &after[1..]))
}

/// Splits operands at commas that are not inside `[]`, `{}` or `()`.
fn split_operands(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut depth = 0i32;
    let mut cur = String::new();
    for c in s.chars() {
        match c {
            '[' | '{' | '(' => depth += 1,
            ']' | '}' | ')' => depth -= 1,
            ',' if depth == 0 => {
                out.push(cur.trim().to_string());
                cur.clear();
                continue;
            }
            _ => {}
        }
        cur.push(c);
    }
    if !cur.trim().is_empty() {
        out.push(cur.trim().to_string());
    }
    out
}

/// Register or symbol names mentioned in an operand: `[%rd8+16]` gives `%rd8`.
pub fn names_in(operand: &str) -> impl Iterator<Item = &str> {
    operand.split(|c: char| !is_ident_char(c)).filter(|t| {
        t.starts_with('%') || t.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Abridged from what rustc's NVPTX backend emits for two kernels and a helper.
    const SAMPLE: &str = r#"//
// Generated by LLVM NVPTX Back-End
//

.version 6.0
.target sm_70
.address_size 64

.global .align 8 .b8 table[16] = {1, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0};

.func (.param .b64 func_retval0) helper(
	.param .b64 helper_param_0
)
{
	.reg .b64 	%rd<3>;
	ld.param.b64 	%rd1, [helper_param_0];
	// begin inline asm
	ld.acquire.sys.global.u64 %rd2, [%rd1];
	// end inline asm
	st.param.b64 	[func_retval0], %rd2;
	ret;
}
	// .globl	port_push               // -- Begin function port_push
.visible .entry port_push(
	.param .u64 .ptr .align 1 port_push_param_0,
	.param .u64 port_push_param_1
)
{
	.reg .pred 	%p<2>;
	.reg .b64 	%rd<9>;

// %bb.0:
	ld.param.b64 	%rd6, [port_push_param_0];
$L__BB0_1:
	// begin inline asm
	atom.relaxed.gpu.global.add.u64 %rd1, [%rd6], 1;
	// end inline asm
	@%p1 bra 	$L__BB0_1;
	{ // callseq 0, 0
	.param .b64 param0;
	st.param.b64 	[param0], %rd6;
	.param .b64 retval0;
	call.uni (retval0), helper, (param0);
	ld.param.b64 	%rd7, [retval0];
	} // callseq 0
	// begin inline asm
	st.release.sys.global.v2.u64 [%rd5], {%rd3, %rd4};
	// end inline asm
	ret;
                                        // -- End function
}
.visible .entry empty()
{
	ret;
}
"#;

    /// Guards against functions missed or misnamed (a `.func` with a return list, an
    /// initializer's braces taken for a body) and wrong line numbers in messages.
    #[test]
    fn finds_functions_entries_and_lines() {
        let m = Module::parse(SAMPLE);
        let names: Vec<_> = m
            .functions
            .iter()
            .map(|f| (f.name.as_str(), f.is_entry))
            .collect();
        assert_eq!(
            names,
            [("helper", false), ("port_push", true), ("empty", true)]
        );
        assert_eq!(m.function("helper").unwrap().line, 11);
        assert_eq!(m.entries().count(), 2);
    }

    /// Guards against labels or guards left in opcodes, vector operands split at their
    /// commas, and a body cut short at a call sequence's closing brace.
    #[test]
    fn statements_lose_labels_and_guards_and_keep_vector_operands() {
        let m = Module::parse(SAMPLE);
        let f = m.function("port_push").unwrap();
        let ops: Vec<&str> = f.instructions.iter().map(|i| i.opcode.as_str()).collect();
        assert!(ops.contains(&"atom.relaxed.gpu.global.add.u64"), "{ops:?}");
        assert!(ops.contains(&"bra"), "{ops:?}");
        let publish = f
            .instructions
            .iter()
            .find(|i| i.opcode == "st.release.sys.global.v2.u64")
            .unwrap();
        assert_eq!(publish.operands, ["[%rd5]", "{%rd3, %rd4}"]);
        let atom = f.instructions.iter().find(|i| i.op() == "atom").unwrap();
        assert_eq!(atom.line, 36);
        assert!(atom.has("gpu") && atom.has("add") && !atom.has("sys"));
        // The body ended at its own closing brace, not at the call sequence's.
        assert_eq!(f.instructions.last().unwrap().opcode, "ret");
    }

    /// Guards against branches that cannot be followed: each label must name the statement
    /// after it (also across a call sequence's scope and at the end of a body), and a
    /// guarded branch must keep its predicate.
    #[test]
    fn labels_name_statements_and_guards_are_kept() {
        let m = Module::parse(SAMPLE);
        let f = m.function("port_push").unwrap();
        let at = f.labels["$L__BB0_1"];
        assert_eq!(f.instructions[at].opcode, "atom.relaxed.gpu.global.add.u64");
        let bra = f.instructions.iter().find(|i| i.op() == "bra").unwrap();
        assert_eq!(bra.guard.as_deref(), Some("%p1"));
        assert_eq!(bra.operands, ["$L__BB0_1"]);
        assert_eq!(f.instructions[at].guard, None);

        let m = Module::parse(
            ".entry k()\n{\n@!%p2 bra $L__BB1_3;\n$L__BB1_2:\n{ // callseq\n\
             call.uni f, ();\n}\n$L__BB1_3: $L__BB1_4:\n}\n",
        );
        let f = &m.functions[0];
        assert_eq!(f.instructions[0].guard.as_deref(), Some("!%p2"));
        assert_eq!(f.instructions[f.labels["$L__BB1_2"]].op(), "call");
        assert_eq!(f.labels["$L__BB1_3"], f.instructions.len());
        assert_eq!(f.labels["$L__BB1_4"], f.instructions.len());
    }

    /// Guards against a kernel's callees left out of what it can execute.
    #[test]
    fn call_graph_reaches_callees() {
        let m = Module::parse(SAMPLE);
        let root = m.function("port_push").unwrap();
        assert_eq!(root.callees(), ["helper"]);
        let reach: Vec<_> = m
            .reachable_from(root)
            .iter()
            .map(|f| f.name.as_str())
            .collect();
        assert_eq!(reach, ["port_push", "helper"]);
    }

    /// Guards against malformed PTX crashing the reader.
    #[test]
    fn empty_and_garbage_input_give_no_functions() {
        assert!(Module::parse("").functions.is_empty());
        assert!(Module::parse("}}}{{ ; .entry").functions.is_empty());
        // An unterminated body still yields what was read.
        let m = Module::parse(".visible .entry k() { ld.acquire.sys.global.u64 %rd1, [%rd2];");
        assert_eq!(m.functions[0].instructions.len(), 1);
    }

    /// Guards against registers inside address operands not being found.
    #[test]
    fn operand_names() {
        let names: Vec<_> = names_in("[%rd8+16]").collect();
        assert_eq!(names, ["%rd8"]);
        let names: Vec<_> = names_in("__local_depot1").collect();
        assert_eq!(names, ["__local_depot1"]);
    }
}
