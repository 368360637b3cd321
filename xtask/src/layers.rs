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
//! It prints every edge that breaks the layers, so the remaining debt is visible.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use crate::root;

/// Layers of one crate: module → layer index (0 = top).
struct Rules {
    layer: BTreeMap<String, usize>,
    debt: BTreeSet<(String, String)>,
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
        let edges = imports(&root().join(krate).join("src"))?;
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
    if problems.is_empty() {
        println!("layers: every import follows docs/ARCHITECTURE.md (or is listed debt)");
        Ok(())
    } else {
        Err(problems.join("\n"))
    }
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
        if kind != "layers" && kind != "layer-debt" {
            continue;
        }
        let entry = out.entry(krate.to_string()).or_insert_with(|| Rules {
            layer: BTreeMap::new(),
            debt: BTreeSet::new(),
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

/// Crate-internal imports between the top-level modules of the crate whose sources are in
/// `src`: module → the modules it uses.
fn imports(src: &Path) -> Result<BTreeMap<String, BTreeSet<String>>, String> {
    let mut files = Vec::new();
    collect(src, &mut files)?;
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in files {
        let rel = file.strip_prefix(src).expect("under src");
        let first = rel
            .components()
            .next()
            .expect("a path")
            .as_os_str()
            .to_string_lossy()
            .into_owned();
        let module = first.strip_suffix(".rs").unwrap_or(&first).to_string();
        if module == "lib" || module == "main" {
            continue;
        }
        let text = std::fs::read_to_string(&file)
            .map_err(|e| format!("reading {}: {e}", file.display()))?;
        let used = edges.entry(module.clone()).or_default();
        for name in crate_paths(&code_only(&text)) {
            if name != module {
                used.insert(name);
            }
        }
    }
    Ok(edges)
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

/// `text` without comments and without its test modules (a `#[cfg(test)]` or
/// `#[cfg(all(test, …))]` item and everything after it: they come last in this code base).
fn code_only(text: &str) -> String {
    let mut out = String::new();
    for line in text.lines() {
        let trimmed = line.trim_start();
        if trimmed.starts_with("#[cfg(test)]") || trimmed.starts_with("#[cfg(all(test") {
            break;
        }
        if trimmed.starts_with("//") {
            continue;
        }
        out.push_str(line);
        out.push('\n');
    }
    out
}

/// The top-level module names of `crate::` paths in `code` (`crate::a::…`, `crate::{a, b::…}`);
/// macros (`crate::m!`) are not modules.
fn crate_paths(code: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut rest = code;
    while let Some(at) = rest.find("crate::") {
        let after = &rest[at + "crate::".len()..];
        if let Some(group) = after.strip_prefix('{') {
            // Top-level names in the braces, at depth 0.
            let mut depth = 0;
            let mut word = String::new();
            let mut expect_name = true;
            for c in group.chars() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        if !word.is_empty() {
                            names.insert(std::mem::take(&mut word));
                        }
                        expect_name = true;
                    }
                    c if c.is_alphanumeric() || c == '_' => {
                        if depth == 0 && expect_name {
                            word.push(c);
                        }
                    }
                    _ => {
                        if !word.is_empty() {
                            names.insert(std::mem::take(&mut word));
                            expect_name = false;
                        }
                    }
                }
            }
            if !word.is_empty() {
                names.insert(word);
            }
        } else {
            let name: String = after
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            let is_macro = after[name.len()..].starts_with('!');
            if !name.is_empty() && !is_macro {
                names.insert(name);
            }
        }
        rest = after;
    }
    names.retain(|n| n.chars().next().is_some_and(|c| c.is_lowercase()) && n != "self");
    names
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_paths_and_groups_but_not_macros_or_comments() {
        let code = code_only(
            "use crate::a::X;\nuse crate::{b, c::{D, e}, f::G};\n// crate::h\nlet x = \
             crate::i::j();\ncrate::m!(x);\n#[cfg(test)]\nmod tests { use crate::k; }\n",
        );
        let names: Vec<String> = crate_paths(&code).into_iter().collect();
        assert_eq!(names, ["a", "b", "c", "f", "i"]);
    }

    #[test]
    fn reads_layers_and_debt() {
        let doc = "x\n```layers host-shim\nffi   # top\ngroup fusion\nabi\n```\n\
                   ```layer-debt host-shim\nabi -> ffi\n```\n";
        let rules = rules(doc).unwrap();
        let r = &rules["host-shim"];
        assert_eq!(r.layer["ffi"], 0);
        assert_eq!(r.layer["fusion"], 1);
        assert_eq!(r.layer["abi"], 2);
        assert!(r.debt.contains(&("abi".to_string(), "ffi".to_string())));
    }
}
