//! The crate's layering, checked from its sources: `envs` imports neither `pool`, `text` nor
//! `python`; `text` imports neither `envs`, `pool` nor `python`; `pool` imports no `text` or
//! `python`; and the modules of one layer (`text::prompt`, `text::chat`, ...) form no cycle.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// Source files under `dir`, recursively.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The module a source file belongs to, two levels deep: `src/text/prompt.rs` -> `text::prompt`,
/// `src/envs/alfworld/grammar.rs` -> `envs::alfworld`, `src/pool/slot.rs` -> `pool::slot`.
fn module_of(src: &Path, file: &Path) -> String {
    let rel = file.strip_prefix(src).unwrap();
    let parts: Vec<String> = rel
        .iter()
        .map(|p| p.to_string_lossy().trim_end_matches(".rs").to_string())
        .filter(|p| p != "mod")
        .collect();
    parts.into_iter().take(2).collect::<Vec<_>>().join("::")
}

/// Every `crate::a::b` path a file names (the first two segments after `crate::`).
fn crate_paths(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut rest = text;
    while let Some(at) = rest.find("crate::") {
        rest = &rest[at + "crate::".len()..];
        let path: String = rest
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == ':')
            .collect();
        let segs: Vec<&str> = path.split("::").filter(|s| !s.is_empty()).take(2).collect();
        if !segs.is_empty() {
            out.insert(segs.join("::"));
        }
    }
    out
}

fn graph() -> BTreeMap<String, BTreeSet<String>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut deps: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in files {
        let module = module_of(&src, &file);
        let text = fs::read_to_string(&file).unwrap();
        let entry = deps.entry(module.clone()).or_default();
        for target in crate_paths(&text) {
            if target != module {
                entry.insert(target);
            }
        }
    }
    deps
}

fn layer(module: &str) -> &str {
    module.split("::").next().unwrap()
}

#[test]
fn layers_import_downwards_only() {
    // What each layer may not import.
    let forbidden: &[(&str, &[&str])] = &[
        ("envs", &["pool", "text", "python"]),
        ("text", &["envs", "pool", "python"]),
        ("pool", &["text", "python"]),
        ("version", &["envs", "pool", "text", "python"]),
    ];
    let deps = graph();
    assert!(
        deps.keys().any(|m| m.starts_with("envs")),
        "no envs modules found: {deps:?}"
    );
    let mut bad = Vec::new();
    for (module, targets) in &deps {
        for (from, banned) in forbidden {
            if layer(module) != *from {
                continue;
            }
            for target in targets {
                if banned.contains(&layer(target)) {
                    bad.push(format!("{module} imports {target}"));
                }
            }
        }
    }
    assert!(bad.is_empty(), "imports against the layering: {bad:#?}");
}

#[test]
fn no_cycles_between_modules() {
    let deps = graph();
    // Depth-first search for a back edge; modules are nodes, `crate::` paths the edges (a path
    // to a layer's root, e.g. `crate::envs`, is an edge to that node).
    fn visit(
        node: &str,
        deps: &BTreeMap<String, BTreeSet<String>>,
        state: &mut BTreeMap<String, u8>,
        stack: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        match state.get(node) {
            Some(1) => {
                let at = stack.iter().position(|n| n == node).unwrap();
                let mut cycle = stack[at..].to_vec();
                cycle.push(node.to_string());
                return Some(cycle);
            }
            Some(2) => return None,
            _ => {}
        }
        state.insert(node.to_string(), 1);
        stack.push(node.to_string());
        for next in deps.get(node).into_iter().flatten() {
            if let Some(cycle) = visit(next, deps, state, stack) {
                return Some(cycle);
            }
        }
        stack.pop();
        state.insert(node.to_string(), 2);
        None
    }
    let mut state = BTreeMap::new();
    for node in deps.keys() {
        let mut stack = Vec::new();
        if let Some(cycle) = visit(node, &deps, &mut state, &mut stack) {
            panic!("import cycle: {}", cycle.join(" -> "));
        }
    }
}

#[test]
fn the_checks_see_a_planted_cycle() {
    // The search must find what it is looking for: a cycle planted into the real graph.
    let mut deps = graph();
    deps.entry("text::chat".into())
        .or_default()
        .insert("text::prompt".into());
    deps.entry("text::prompt".into())
        .or_default()
        .insert("text::chat".into());
    assert!(crate_paths("use crate::text::chat::{A, B};").contains("text::chat"));
    let mut found = false;
    for node in deps.keys() {
        let mut seen = std::collections::BTreeSet::new();
        let mut stack = vec![(node.clone(), vec![node.clone()])];
        while let Some((at, path)) = stack.pop() {
            for next in deps.get(&at).into_iter().flatten() {
                if next == node {
                    found = true;
                }
                if seen.insert(next.clone()) {
                    let mut p = path.clone();
                    p.push(next.clone());
                    stack.push((next.clone(), p));
                }
            }
        }
    }
    assert!(found);
}
