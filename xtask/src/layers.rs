//! `cargo xtask layers`: the layering rules of `docs/ARCHITECTURE.md`, checked.
//!
//! ARCHITECTURE.md states, per crate, its layers (a fenced block ```` ```layers <crate dir> ````,
//! one line per layer from the top: the modules of that layer) and the imports that still break
//! them (```` ```layer-debt <crate dir> ````, one `from -> to` per line). This check reads every
//! `.rs` file of the crate's `src/`, finds the crate-internal imports between top-level modules
//! (`crate::x` paths in code, not in comments or test modules), and fails when
//!
//! * a module imports one of a *higher* layer, or two modules of one layer import each other
//!   (a circle), and the edge is not listed as debt;
//! * a debt entry no longer occurs (remove it: the list only shrinks);
//! * a module is in no layer.
//!
//! It prints every edge that breaks the layers, so the remaining debt is visible. It also checks
//! that a user's kernel crate cannot reach symm-device's lower layers ([`LOWER_LAYERS_PROBE`]
//! must not compile).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use crate::root;

/// Layers of one crate: module → layer index (0 = top).
struct Rules {
    layer: BTreeMap<String, usize>,
    debt: BTreeSet<(String, String)>,
    /// The modules that may read the environment (`env-readers` block); `None`: no rule.
    env_readers: Option<BTreeSet<String>>,
}

/// Check every crate ARCHITECTURE.md gives layers for.
pub fn check() -> Result<(), String> {
    let doc_path = root().join("docs/ARCHITECTURE.md");
    let doc = std::fs::read_to_string(&doc_path)
        .map_err(|e| format!("reading {}: {e}", doc_path.display()))?;
    let crates = rules(&doc)?;
    if crates.is_empty() {
        return Err("docs/ARCHITECTURE.md states no layers (```layers <crate>)".into());
    }
    let mut problems = Vec::new();
    for (krate, rules) in &crates {
        let scan = scan_crate(&root().join(krate).join("src"))?;
        for (module, files) in &scan.asm {
            if module != "arch" {
                problems.push(format!(
                    "{krate}: inline assembly outside `arch`, in {}",
                    files.iter().cloned().collect::<Vec<_>>().join(", ")
                ));
            }
        }
        if let Some(readers) = &rules.env_readers {
            for (module, files) in &scan.env {
                if !readers.contains(module) {
                    problems.push(format!(
                        "{krate}: the environment is read outside {} (docs/ARCHITECTURE.md's \
                         env-readers), in {}",
                        readers.iter().cloned().collect::<Vec<_>>().join(", "),
                        files.iter().cloned().collect::<Vec<_>>().join(", ")
                    ));
                }
            }
        }
        let edges = scan.edges;
        let mut breaking = Vec::new();
        for module in edges.keys() {
            if !rules.layer.contains_key(module) {
                problems.push(format!("{krate}: module `{module}` is in no layer"));
            }
        }
        for (from, tos) in &edges {
            for to in tos {
                let (Some(&lf), Some(&lt)) = (rules.layer.get(from), rules.layer.get(to)) else {
                    continue;
                };
                let upward = lt < lf;
                let circle = lt == lf && edges.get(to).is_some_and(|back| back.contains(from));
                if upward || circle {
                    breaking.push((from.clone(), to.clone(), upward));
                }
            }
        }
        println!("layers: {krate}: {} edges break the layers", breaking.len());
        for (from, to, upward) in &breaking {
            let listed = rules.debt.contains(&(from.clone(), to.clone()));
            println!(
                "  {from} -> {to} ({}){}",
                if *upward {
                    "imports a higher layer"
                } else {
                    "a circle within a layer"
                },
                if listed { ", listed as debt" } else { "" }
            );
            if !listed {
                problems.push(format!(
                    "{krate}: `{from}` imports `{to}`, which breaks the layers of \
                     docs/ARCHITECTURE.md"
                ));
            }
        }
        for (from, to) in &rules.debt {
            if !breaking.iter().any(|(f, t, _)| f == from && t == to) {
                problems.push(format!(
                    "{krate}: the debt `{from} -> {to}` no longer occurs: remove it from \
                     docs/ARCHITECTURE.md"
                ));
            }
        }
    }
    problems.extend(lower_layers_stay_private()?);
    if problems.is_empty() {
        println!("layers: every import follows docs/ARCHITECTURE.md (or is listed debt)");
        Ok(())
    } else {
        Err(problems.join("\n"))
    }
}

/// The crate of a user's kernel that reaches a lower layer of symm-device (a block barrier and a
/// thread index without the block's token), in a workspace of its own.
const LOWER_LAYERS_PROBE: &str = "xtask/fixtures/lower-layers";

/// Check that a user's kernel crate reaches symm-device only through its typed API: the probe
/// crate, which calls `symm_device::arch` directly, must fail to compile, and for that reason
/// (`arch` is private without the `internals` feature). The problem found, if any.
fn lower_layers_stay_private() -> Result<Option<String>, String> {
    let manifest = root().join(LOWER_LAYERS_PROBE).join("Cargo.toml");
    let output = crate::cargo()
        .args([
            "check",
            "--offline",
            "--message-format=short",
            "--manifest-path",
        ])
        .arg(&manifest)
        .arg("--target-dir")
        .arg(root().join("target/fixtures"))
        .output()
        .map_err(|e| format!("cannot start cargo check on {LOWER_LAYERS_PROBE}: {e}"))?;
    let stderr = String::from_utf8_lossy(&output.stderr);
    let refused = !output.status.success() && stderr.contains("module `arch` is private");
    println!(
        "layers: a user's kernel crate calling symm_device::arch: {}",
        if refused {
            "does not compile (E0603)"
        } else {
            "COMPILES"
        }
    );
    Ok((!refused).then(|| {
        format!(
            "{LOWER_LAYERS_PROBE} must not compile (symm-device's lower layers are public \
             only with the `internals` feature); cargo check said:\n{stderr}"
        )
    }))
}

/// The `layers` and `layer-debt` blocks of ARCHITECTURE.md, by crate directory.
fn rules(doc: &str) -> Result<BTreeMap<String, Rules>, String> {
    let mut out: BTreeMap<String, Rules> = BTreeMap::new();
    let mut lines = doc.lines();
    while let Some(line) = lines.next() {
        let Some(info) = line.trim().strip_prefix("```") else {
            continue;
        };
        let mut words = info.split_whitespace();
        let (Some(kind), Some(krate)) = (words.next(), words.next()) else {
            continue;
        };
        if kind != "layers" && kind != "layer-debt" && kind != "env-readers" {
            continue;
        }
        let entry = out.entry(krate.to_string()).or_insert_with(|| Rules {
            layer: BTreeMap::new(),
            debt: BTreeSet::new(),
            env_readers: None,
        });
        let mut index = 0;
        for body in lines.by_ref() {
            let body = body.trim();
            if body.starts_with("```") {
                break;
            }
            let body = body.split('#').next().unwrap_or("").trim();
            if body.is_empty() {
                continue;
            }
            if kind == "layers" {
                for module in body.split_whitespace() {
                    if entry.layer.insert(module.to_string(), index).is_some() {
                        return Err(format!("{krate}: `{module}` is in two layers"));
                    }
                }
                index += 1;
            } else if kind == "env-readers" {
                entry
                    .env_readers
                    .get_or_insert_with(BTreeSet::new)
                    .extend(body.split_whitespace().map(str::to_string));
            } else {
                let (from, to) = body
                    .split_once("->")
                    .ok_or_else(|| format!("{krate}: a debt line without `->`: {body}"))?;
                entry
                    .debt
                    .insert((from.trim().to_string(), to.trim().to_string()));
            }
        }
    }
    Ok(out)
}

/// What the scan of a crate's sources found: the crate-internal imports between its top-level
/// modules (module → the modules it uses), and the modules holding inline assembly or reading
/// the environment (module → the files where).
#[derive(Default)]
struct Scan {
    edges: BTreeMap<String, BTreeSet<String>>,
    asm: BTreeMap<String, BTreeSet<String>>,
    env: BTreeMap<String, BTreeSet<String>>,
}

/// Scan every `.rs` file of the crate whose sources are in `src` (parsed with `syn`; test items,
/// `#[cfg(test)]` or `#[cfg(all(test, …))]`, are skipped wherever they are).
fn scan_crate(src: &Path) -> Result<Scan, String> {
    let mut files = Vec::new();
    collect(src, &mut files)?;
    let mut out = Scan::default();
    for file in files {
        let rel = file.strip_prefix(src).expect("under src");
        let path = module_path(rel);
        let Some(module) = path.first().cloned() else {
            continue; // lib.rs, main.rs
        };
        let text = std::fs::read_to_string(&file)
            .map_err(|e| format!("reading {}: {e}", file.display()))?;
        let found = scan_file(&text, path).map_err(|e| format!("{}: {e}", file.display()))?;
        let name = rel.display().to_string();
        let used = out.edges.entry(module.clone()).or_default();
        used.extend(found.modules.into_iter().filter(|m| *m != module));
        if found.asm {
            out.asm
                .entry(module.clone())
                .or_default()
                .insert(name.clone());
        }
        if found.env {
            out.env.entry(module).or_default().insert(name);
        }
    }
    Ok(out)
}

/// The module path of a file under `src/` (`a/b.rs` and `a/b/mod.rs`: `[a, b]`; `lib.rs` and
/// `main.rs`: empty).
fn module_path(rel: &Path) -> Vec<String> {
    let mut parts: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if let Some(last) = parts.pop() {
        let stem = last.strip_suffix(".rs").unwrap_or(&last).to_string();
        if !(stem == "mod" || (parts.is_empty() && (stem == "lib" || stem == "main"))) {
            parts.push(stem);
        }
    }
    parts
}

/// What one file holds outside its test items.
#[derive(Debug, Default, PartialEq)]
struct FileScan {
    /// Top-level modules its `crate::` and `super::` paths name (in code, `use` trees and
    /// macro arguments; a macro `crate::m!` names no module).
    modules: BTreeSet<String>,
    /// An `asm!`, `global_asm!` or `naked_asm!` invocation.
    asm: bool,
    /// A read of the environment (`env::var`, `var_os`, `vars`, `vars_os`).
    env: bool,
}

/// Scan `text`, the file of module `path`.
fn scan_file(text: &str, path: Vec<String>) -> Result<FileScan, String> {
    let file = syn::parse_file(text).map_err(|e| format!("not parsed: {e}"))?;
    let mut visitor = Visitor {
        module: path,
        found: FileScan::default(),
    };
    syn::visit::Visit::visit_file(&mut visitor, &file);
    Ok(visitor.found)
}

/// Whether `attrs` make an item test-only: `#[cfg(test)]` or `#[cfg(all(test, …))]`.
fn test_only(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|attr| {
        if !attr.path().is_ident("cfg") {
            return false;
        }
        let Ok(list) = attr.meta.require_list() else {
            return false;
        };
        let tokens: Vec<String> = list
            .tokens
            .clone()
            .into_iter()
            .map(|t| t.to_string())
            .collect();
        match tokens.first().map(String::as_str) {
            Some("test") => tokens.len() == 1,
            Some("all") => {
                let inner = tokens.get(1).map_or(String::new(), |g| g.replace(' ', ""));
                inner
                    .trim_start_matches('(')
                    .split(',')
                    .any(|part| part == "test" || part == "test)")
            }
            _ => false,
        }
    })
}

struct Visitor {
    /// The module path of the scope being visited (the file's, then inline modules').
    module: Vec<String>,
    found: FileScan,
}

impl Visitor {
    /// Record the module a path of `segments` names, resolved from the current module.
    fn path(&mut self, segments: &[String], is_macro: bool) {
        let mut at = self.module.clone();
        let mut rest = segments;
        match rest.first().map(String::as_str) {
            Some("crate") => {
                at.clear();
                rest = &rest[1..];
            }
            Some("super") => {
                while rest.first().map(String::as_str) == Some("super") {
                    at.pop();
                    rest = &rest[1..];
                }
            }
            Some("self") => rest = &rest[1..],
            _ => {
                self.env_read(segments);
                return;
            }
        }
        if at.is_empty() {
            // The first remaining segment is a top-level item: a module unless it is the
            // macro's own name or not a module's name (types and constants are capitalized).
            let named = if is_macro {
                rest.len() >= 2
            } else {
                !rest.is_empty()
            };
            if let Some(first) = rest.first().filter(|_| named)
                && first.chars().next().is_some_and(char::is_lowercase)
            {
                self.found.modules.insert(first.clone());
            }
        } else {
            self.found.modules.insert(at[0].clone());
        }
        self.env_read(segments);
    }

    /// Note a read of the environment: a path ending in `env::var` (or `var_os`, `vars`,
    /// `vars_os`).
    fn env_read(&mut self, segments: &[String]) {
        if let [.., env, read] = segments
            && env == "env"
            && matches!(read.as_str(), "var" | "var_os" | "vars" | "vars_os")
        {
            self.found.env = true;
        }
    }

    /// The paths in a macro's arguments (`a :: b :: c` token runs), which `syn` leaves
    /// unparsed.
    fn tokens(&mut self, tokens: proc_macro2::TokenStream) {
        let mut run: Vec<String> = Vec::new();
        let mut colons = 0;
        for token in tokens {
            match token {
                proc_macro2::TokenTree::Ident(ident) => {
                    if run.is_empty() || colons != 2 {
                        self.flush(&mut run);
                    }
                    run.push(ident.to_string());
                    colons = 0;
                }
                proc_macro2::TokenTree::Punct(p) if p.as_char() == ':' && colons < 2 => {
                    colons += 1;
                }
                proc_macro2::TokenTree::Group(group) => {
                    self.flush(&mut run);
                    colons = 0;
                    self.tokens(group.stream());
                }
                _ => {
                    self.flush(&mut run);
                    colons = 0;
                }
            }
        }
        self.flush(&mut run);
    }

    /// Record a token run of two or more segments as a path.
    fn flush(&mut self, run: &mut Vec<String>) {
        let segments = std::mem::take(run);
        if segments.len() >= 2 {
            self.path(&segments, false);
        }
    }

    /// The paths a `use` tree names, `prefix` being the segments above it.
    fn use_tree(&mut self, tree: &syn::UseTree, prefix: &mut Vec<String>) {
        match tree {
            syn::UseTree::Path(p) => {
                prefix.push(p.ident.to_string());
                self.use_tree(&p.tree, prefix);
                prefix.pop();
            }
            syn::UseTree::Name(syn::UseName { ident, .. })
            | syn::UseTree::Rename(syn::UseRename { ident, .. }) => {
                let mut segments = prefix.clone();
                segments.push(ident.to_string());
                self.path(&segments, false);
            }
            syn::UseTree::Glob(_) => {
                let mut segments = prefix.clone();
                segments.push("*".into());
                self.path(&segments, false);
            }
            syn::UseTree::Group(g) => {
                for tree in &g.items {
                    self.use_tree(tree, prefix);
                }
            }
        }
    }
}

impl<'ast> syn::visit::Visit<'ast> for Visitor {
    fn visit_item(&mut self, item: &'ast syn::Item) {
        let attrs: &[syn::Attribute] = match item {
            syn::Item::Const(i) => &i.attrs,
            syn::Item::Enum(i) => &i.attrs,
            syn::Item::ExternCrate(i) => &i.attrs,
            syn::Item::Fn(i) => &i.attrs,
            syn::Item::ForeignMod(i) => &i.attrs,
            syn::Item::Impl(i) => &i.attrs,
            syn::Item::Macro(i) => &i.attrs,
            syn::Item::Mod(i) => &i.attrs,
            syn::Item::Static(i) => &i.attrs,
            syn::Item::Struct(i) => &i.attrs,
            syn::Item::Trait(i) => &i.attrs,
            syn::Item::TraitAlias(i) => &i.attrs,
            syn::Item::Type(i) => &i.attrs,
            syn::Item::Union(i) => &i.attrs,
            syn::Item::Use(i) => &i.attrs,
            _ => &[],
        };
        if !test_only(attrs) {
            syn::visit::visit_item(self, item);
        }
    }

    fn visit_item_mod(&mut self, item: &'ast syn::ItemMod) {
        self.module.push(item.ident.to_string());
        syn::visit::visit_item_mod(self, item);
        self.module.pop();
    }

    fn visit_impl_item(&mut self, item: &'ast syn::ImplItem) {
        let attrs: &[syn::Attribute] = match item {
            syn::ImplItem::Const(i) => &i.attrs,
            syn::ImplItem::Fn(i) => &i.attrs,
            syn::ImplItem::Type(i) => &i.attrs,
            syn::ImplItem::Macro(i) => &i.attrs,
            _ => &[],
        };
        if !test_only(attrs) {
            syn::visit::visit_impl_item(self, item);
        }
    }

    fn visit_stmt(&mut self, stmt: &'ast syn::Stmt) {
        let attrs: &[syn::Attribute] = match stmt {
            syn::Stmt::Local(l) => &l.attrs,
            syn::Stmt::Macro(m) => &m.attrs,
            _ => &[],
        };
        if !test_only(attrs) {
            syn::visit::visit_stmt(self, stmt);
        }
    }

    fn visit_item_use(&mut self, item: &'ast syn::ItemUse) {
        self.use_tree(&item.tree, &mut Vec::new());
    }

    fn visit_path(&mut self, path: &'ast syn::Path) {
        let segments: Vec<String> = path.segments.iter().map(|s| s.ident.to_string()).collect();
        self.path(&segments, false);
        syn::visit::visit_path(self, path);
    }

    fn visit_macro(&mut self, mac: &'ast syn::Macro) {
        let segments: Vec<String> = mac
            .path
            .segments
            .iter()
            .map(|s| s.ident.to_string())
            .collect();
        if matches!(
            segments.last().map(String::as_str),
            Some("asm" | "global_asm" | "naked_asm")
        ) {
            self.found.asm = true;
        }
        self.path(&segments, true);
        self.tokens(mac.tokens.clone());
    }
}

fn collect(dir: &Path, out: &mut Vec<std::path::PathBuf>) -> Result<(), String> {
    let entries = std::fs::read_dir(dir).map_err(|e| format!("reading {}: {e}", dir.display()))?;
    for entry in entries {
        let path = entry.map_err(|e| e.to_string())?.path();
        if path.is_dir() {
            collect(&path, out)?;
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
    out.sort();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scan(text: &str, path: &[&str]) -> FileScan {
        scan_file(text, path.iter().map(|p| p.to_string()).collect()).unwrap()
    }

    fn names(found: &FileScan) -> Vec<&str> {
        found.modules.iter().map(String::as_str).collect()
    }

    #[test]
    fn finds_paths_groups_and_macro_arguments_but_not_macros_comments_or_tests() {
        let found = scan(
            "use crate::a::X;\nuse crate::{b, c::{D, e}, f::G};\n// crate::h\n/* crate::n */\n\
             fn x() { crate::i::j(); crate::m!(x); crate::o::p!(y); q!(crate::r::S, 3); }\n\
             #[cfg(test)]\nmod tests { use crate::k; }\n\
             #[cfg(all(test, feature = \"x\"))]\nfn t() { crate::l::f(); }\n\
             #[cfg(not(test))]\nfn u() { crate::s::f(); }\n",
            &["z"],
        );
        assert_eq!(names(&found), ["a", "b", "c", "f", "i", "o", "r", "s"]);
        assert!(!found.asm && !found.env);
    }

    #[test]
    fn resolves_super_paths_from_the_file_and_inline_modules() {
        // In module a::b: `super::super::c` is the top-level c, `super::d` stays in a.
        let found = scan(
            "use super::super::c::X;\nuse super::d;\nmod inner { use super::super::super::e; }\n\
             fn f() { self::g(); }\n",
            &["a", "b"],
        );
        assert_eq!(names(&found), ["a", "c", "e"]);
        // A test-only item in the middle of a file hides only itself.
        let found = scan(
            "fn a() {}\n#[cfg(test)]\nfn b() { crate::x::y(); }\nfn c() { crate::w::v(); }\n",
            &["m"],
        );
        assert_eq!(names(&found), ["w"]);
    }

    #[test]
    fn finds_inline_assembly_and_environment_reads() {
        let found = scan(
            "fn f() { unsafe { core::arch::asm!(\"nop\") } }\nfn g() { std::env::var(\"X\"); }\n",
            &["m"],
        );
        assert!(found.asm && found.env);
        let found = scan(
            "use std::env;\nfn g() { let _ = env::var_os(\"X\"); }\n\
             #[cfg(test)]\nmod tests { fn h() { std::env::var(\"Y\"); asm!(\"\"); } }\n",
            &["m"],
        );
        assert!(found.env && !found.asm);
        let found = scan("fn g() { let _ = std::env::args(); }\n", &["m"]);
        assert!(!found.env);
    }

    #[test]
    fn module_paths_of_files() {
        let path = |p: &str| module_path(Path::new(p));
        assert_eq!(path("lib.rs"), Vec::<String>::new());
        assert_eq!(path("a.rs"), ["a"]);
        assert_eq!(path("a/mod.rs"), ["a"]);
        assert_eq!(path("a/b.rs"), ["a", "b"]);
        assert_eq!(path("a/b/mod.rs"), ["a", "b"]);
    }

    #[test]
    fn reads_layers_and_debt() {
        let doc = "x\n```layers host-shim\nffi   # top\ngroup fusion\nabi\n```\n\
                   ```layer-debt host-shim\nabi -> ffi\n```\n```env-readers host-shim\nabi\n```\n";
        let rules = rules(doc).unwrap();
        let r = &rules["host-shim"];
        assert_eq!(r.layer["ffi"], 0);
        assert_eq!(r.layer["fusion"], 1);
        assert_eq!(r.layer["abi"], 2);
        assert!(r.debt.contains(&("abi".to_string(), "ffi".to_string())));
        assert_eq!(r.env_readers.as_ref().unwrap().len(), 1);
    }
}
