//! One kernel's own PTX module, cut out of a whole PTX file.
//!
//! The driver JIT-compiles a PTX module completely when it is loaded: the whole file (every
//! kernel for every dtype × op) would cost tens of seconds of compilation the first time a
//! process uses a GPU. Loading each kernel as its own small module (the kernel, the functions
//! it calls, the module's globals) costs only what the kernels actually used need.
//!
//! The cut works on the layout LLVM's NVPTX back end writes: top-level items start at column
//! 0 (`.version`, `.target`, `.address_size`, `.global …;`, and function declarations ending
//! in `;` or definitions, whose body runs up to the next top-level item: inline asm puts
//! braces at column 0 too, and LLVM writes its end-of-function comment before or after the
//! closing brace); calls are `call… name,` or `call… name;`.
//! Pure text processing, std only. libsymm loads kernels this way; `cargo xtask ptx` checks that
//! every kernel's module assembles with ptxas, and the simulated GPU's tests load each one.

use std::collections::{HashMap, HashSet};

/// Column-0 directives that open a top-level item (module-scope variables and functions).
const HEADER_DIRECTIVES: [&str; 3] = [".version", ".target", ".address_size"];
/// Column-0 directives of module-scope variables.
const VARIABLE_DIRECTIVES: [&str; 4] = [".global", ".const", ".shared", ".extern .shared"];
/// Column-0 directives of functions.
const FUNCTION_DIRECTIVES: [&str; 5] = [".visible", ".weak", ".extern", ".entry", ".func"];

/// Whether a line opens a top-level item.
fn starts_item(line: &str) -> bool {
    HEADER_DIRECTIVES
        .iter()
        .chain(&VARIABLE_DIRECTIVES)
        .chain(&FUNCTION_DIRECTIVES)
        .any(|p| line.starts_with(p))
}

/// What a top-level item of a PTX file is.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum ItemKind {
    /// `.version`, `.target`, `.address_size`.
    Header,
    /// A module-scope variable (`.global`, `.const`, `.shared`): kept in every module.
    Variable,
    /// A function prototype without a body.
    Declaration,
    /// A kernel or function with its body.
    Definition,
}

/// One top-level item: its kind, the function it names (if any), its text.
#[derive(Debug)]
struct Item<'a> {
    kind: ItemKind,
    name: &'a str,
    text: &'a str,
}

/// A PTX file taken apart into top-level items, ready to cut per kernel.
#[derive(Debug)]
pub struct PtxIndex<'a> {
    items: Vec<Item<'a>>,
    /// Function name → index of its definition in `items`.
    definitions: HashMap<&'a str, usize>,
}

/// Byte offsets of the starts of `text`'s lines, plus `text.len()`.
fn line_starts(text: &str) -> Vec<usize> {
    let mut starts = vec![0];
    starts.extend(text.match_indices('\n').map(|(i, _)| i + 1));
    if *starts.last().expect("non-empty") != text.len() {
        starts.push(text.len());
    }
    starts
}

/// The function name declared or defined by an item whose first line is `line`.
fn function_name(line: &str) -> &str {
    let mut rest = line.trim_start();
    for prefix in FUNCTION_DIRECTIVES {
        rest = rest.strip_prefix(prefix).unwrap_or(rest).trim_start();
    }
    if rest.starts_with('(') {
        // The return-value parameter list of a `.func`.
        rest = rest.split_once(')').map_or("", |(_, r)| r).trim_start();
    }
    let end = rest
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '$' || c == '.'))
        .unwrap_or(rest.len());
    &rest[..end]
}

/// Whether a column-0 line starts a function item.
fn starts_function(line: &str) -> bool {
    FUNCTION_DIRECTIVES.iter().any(|p| line.starts_with(p)) && !line.starts_with(".extern .shared")
}

impl<'a> PtxIndex<'a> {
    /// Take `ptx` apart. Unknown column-0 lines and comments are dropped.
    pub fn new(ptx: &'a str) -> Self {
        let starts = line_starts(ptx);
        let line = |i: usize| ptx[starts[i]..starts[i + 1]].trim_end_matches(['\n', '\r']);
        let lines = starts.len() - 1;
        let mut items = Vec::new();
        let mut i = 0;
        while i < lines {
            let first = line(i);
            let kind_and_end = if HEADER_DIRECTIVES.iter().any(|p| first.starts_with(p)) {
                Some((ItemKind::Header, i))
            } else if VARIABLE_DIRECTIVES.iter().any(|p| first.starts_with(p)) {
                let end = (i..lines)
                    .find(|&j| line(j).trim_end().ends_with(';'))
                    .unwrap_or(lines - 1);
                Some((ItemKind::Variable, end))
            } else if starts_function(first) {
                let mut end = None;
                let mut j = i;
                while j < lines {
                    let l = line(j).trim_end();
                    if l.starts_with('{') {
                        // The body runs up to the next top-level item: inline asm puts braces
                        // at column 0 too, and LLVM writes `// -- End function` before or
                        // after the closing brace.
                        let next = (j + 1..lines).find(|&k| starts_item(line(k)));
                        end = Some((ItemKind::Definition, next.map_or(lines - 1, |k| k - 1)));
                        break;
                    }
                    if l.ends_with(';') && !l.starts_with('\t') && !l.starts_with(' ') {
                        end = Some((ItemKind::Declaration, j));
                        break;
                    }
                    j += 1;
                }
                end
            } else {
                None
            };
            match kind_and_end {
                Some((kind, end)) => {
                    let name = match kind {
                        ItemKind::Declaration | ItemKind::Definition => function_name(first),
                        _ => "",
                    };
                    items.push(Item {
                        kind,
                        name,
                        text: &ptx[starts[i]..starts[end + 1]],
                    });
                    i = end + 1;
                }
                None => i += 1,
            }
        }
        let definitions = items
            .iter()
            .enumerate()
            .filter(|(_, item)| item.kind == ItemKind::Definition)
            .map(|(index, item)| (item.name, index))
            .collect();
        PtxIndex { items, definitions }
    }

    /// The names of the kernels (`.entry`) in the file, in file order.
    pub fn kernels(&self) -> Vec<&'a str> {
        self.items
            .iter()
            .filter(|item| {
                item.kind == ItemKind::Definition
                    && item
                        .text
                        .lines()
                        .next()
                        .is_some_and(|l| l.contains(".entry"))
            })
            .map(|item| item.name)
            .collect()
    }

    /// The functions a definition calls.
    fn callees(&self, definition: &Item<'a>) -> Vec<&'a str> {
        let mut out = Vec::new();
        for line in definition.text.lines() {
            let code = line.trim_start();
            if !code.starts_with("call") {
                continue;
            }
            for token in
                code.split(|c: char| c.is_whitespace() || matches!(c, ',' | ';' | '(' | ')'))
            {
                if let Some((name, _)) = self.definitions.get_key_value(token) {
                    out.push(*name);
                }
            }
        }
        out
    }

    /// A self-contained module holding kernel `kernel`, every function it calls (transitively)
    /// and the file's header and module-scope variables, in file order; `None` if the file
    /// defines no such kernel.
    pub fn kernel_module(&self, kernel: &str) -> Option<String> {
        let root = *self.definitions.get(kernel)?;
        let mut needed: HashSet<&str> = HashSet::new();
        let mut pending = vec![root];
        while let Some(index) = pending.pop() {
            let item = &self.items[index];
            if !needed.insert(item.name) {
                continue;
            }
            for callee in self.callees(item) {
                if !needed.contains(callee) {
                    pending.push(self.definitions[callee]);
                }
            }
        }
        let mut module = String::new();
        for item in &self.items {
            let keep = match item.kind {
                ItemKind::Header | ItemKind::Variable => true,
                ItemKind::Declaration | ItemKind::Definition => needed.contains(item.name),
            };
            if keep {
                module.push_str(item.text);
                if !item.text.ends_with('\n') {
                    module.push('\n');
                }
            }
        }
        Some(module)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "//\n// Generated by LLVM NVPTX Back-End\n//\n\n.version 7.8\n.target sm_90\n\
.address_size 64\n\n\t// .globl\tk_one // -- Begin function k_one\n\
.func  (.param .b32 func_retval0) helper\n(\n\t.param .b64 helper_param_0\n)\n;\n\
.func panic\n(\n\t.param .b64 panic_param_0\n)\n.noreturn;\n\
.global .align 4 .b8 table[4] = {0, 1, 2, 3};\n\
\t\t// @k_one\n.visible .entry k_one(\n\t.param .u64 k_one_param_0\n)\n{\n\
\t.reg .b32 \t%r<3>;\n\t{ // callseq 0, 0\n\tcall.uni (retval0), helper, (param0);\n\
\t} // callseq 0\n\t// begin inline asm\n\t{\n.reg .b64 %x;\n}\n\t// end inline asm\n\tret;\n\n}\n\
\t// -- End function\n.visible .entry k_two(\n\t.param .u64 k_two_param_0\n)\n{\n\tret;\n\n}\n\t// -- End function\n\
.func  (.param .b32 func_retval0) helper(\n\t.param .b64 helper_param_0\n)\n{\n\
\tcall.uni panic, (param0);\n\tret;\n\n}\n\t// -- End function\n\
.func panic(\n\t.param .b64 panic_param_0\n)\n.noreturn\n{\n\ttrap;\n\t// -- End function\n}\n";

    #[test]
    fn items_are_found_with_their_names() {
        let index = PtxIndex::new(SAMPLE);
        assert_eq!(index.kernels(), ["k_one", "k_two"]);
        let kinds: Vec<_> = index.items.iter().map(|i| (i.kind, i.name)).collect();
        assert_eq!(
            kinds,
            [
                (ItemKind::Header, ""),
                (ItemKind::Header, ""),
                (ItemKind::Header, ""),
                (ItemKind::Declaration, "helper"),
                (ItemKind::Declaration, "panic"),
                (ItemKind::Variable, ""),
                (ItemKind::Definition, "k_one"),
                (ItemKind::Definition, "k_two"),
                (ItemKind::Definition, "helper"),
                (ItemKind::Definition, "panic"),
            ]
        );
    }

    #[test]
    fn a_kernel_module_holds_its_callees_transitively_and_nothing_else() {
        let index = PtxIndex::new(SAMPLE);
        let one = index.kernel_module("k_one").expect("k_one");
        assert!(one.starts_with(".version 7.8\n.target sm_90\n.address_size 64\n"));
        assert!(one.contains(".global .align 4 .b8 table[4]"));
        assert!(one.contains(".visible .entry k_one("));
        assert!(!one.contains("k_two"));
        assert!(one.contains(".reg .b64 %x;\n}\n\t// end inline asm\n\tret;"));
        assert_eq!(one.matches("helper\n(").count(), 1, "declaration kept");
        assert_eq!(one.matches("helper(").count(), 1, "definition kept");
        assert!(
            one.contains("trap;\n\t// -- End function\n}\n"),
            "callee of a callee kept"
        );
        let two = index.kernel_module("k_two").expect("k_two");
        assert!(!two.contains("helper") && !two.contains("panic"));
        assert!(index.kernel_module("k_three").is_none());
        assert!(
            index
                .kernel_module("helper")
                .is_some_and(|m| m.contains("trap;"))
        );
    }
}
