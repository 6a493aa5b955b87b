//! The server's layout: its files import one another without a circle, and
//! ARCHITECTURE.md names every folder of `server/src`.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Every `.rs` file under `dir`.
fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// A file's module path (`sql::db` for `sql/db.rs`, `wire` for `wire/mod.rs`).
fn module_of(src: &Path, file: &Path) -> String {
    let rel = file.strip_prefix(src).unwrap().with_extension("");
    let mut parts: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if parts.last().is_some_and(|p| p == "mod" || p == "lib") {
        parts.pop();
    }
    parts.join("::")
}

/// The files each file imports through `crate::…` paths (its own test module included,
/// as tests must not need a circle either).
fn imports(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mut files = Vec::new();
    sources(src, &mut files);
    let modules: BTreeSet<String> = files
        .iter()
        .filter(|f| !f.ends_with("main.rs"))
        .map(|f| module_of(src, f))
        .collect();
    let mut out = BTreeMap::new();
    for file in files.iter().filter(|f| !f.ends_with("main.rs")) {
        let me = module_of(src, file);
        let text = std::fs::read_to_string(file).unwrap();
        let mut uses = BTreeSet::new();
        for (i, _) in text.match_indices("crate::") {
            let path: String = text[i + "crate::".len()..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == ':')
                .collect();
            // The longest module the path names.
            let parts: Vec<&str> = path.split("::").filter(|p| !p.is_empty()).collect();
            let target = (1..=parts.len())
                .rev()
                .map(|n| parts[..n].join("::"))
                .find(|m| modules.contains(m));
            if let Some(t) = target.filter(|t| *t != me && !t.is_empty()) {
                uses.insert(t);
            }
        }
        out.insert(me, uses);
    }
    out
}

/// A circle of imports, if there is one.
fn circle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        state: &mut BTreeMap<String, u8>,
        stack: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        state.insert(node.to_string(), 1);
        stack.push(node.to_string());
        for next in graph.get(node).into_iter().flatten() {
            match state.get(next.as_str()) {
                Some(1) => {
                    let at = stack.iter().position(|n| n == next).unwrap();
                    let mut found = stack[at..].to_vec();
                    found.push(next.clone());
                    return Some(found);
                }
                Some(_) => {}
                None => {
                    if let Some(found) = visit(next, graph, state, stack) {
                        return Some(found);
                    }
                }
            }
        }
        stack.pop();
        state.insert(node.to_string(), 2);
        None
    }
    let mut state = BTreeMap::new();
    for node in graph.keys() {
        if !state.contains_key(node) {
            if let Some(found) = visit(node, graph, &mut state, &mut Vec::new()) {
                return Some(found);
            }
        }
    }
    None
}

#[test]
fn the_server_has_no_import_circle() {
    let src = common::repo().join("server/src");
    let graph = imports(&src);
    assert!(graph.contains_key("session::pg") && graph.contains_key("wire::auth"));
    assert!(
        graph["wire::auth"].contains("session::pg"),
        "the reader sees imports"
    );
    if let Some(found) = circle(&graph) {
        panic!("an import circle in server/src: {}", found.join(" -> "));
    }
    // The check finds a circle when there is one.
    let mut broken = graph.clone();
    broken
        .get_mut("session::pg")
        .unwrap()
        .insert("wire::auth".into());
    assert!(circle(&broken).is_some());
}

#[test]
fn architecture_names_every_server_folder() {
    let repo = common::repo();
    let architecture = std::fs::read_to_string(repo.join("ARCHITECTURE.md")).unwrap();
    let src = repo.join("server/src");
    let mut files = Vec::new();
    sources(&src, &mut files);
    let folders: BTreeSet<String> = files
        .iter()
        .filter_map(|f| f.parent())
        .filter(|d| *d != src)
        .map(|d| d.strip_prefix(&src).unwrap().to_string_lossy().into_owned())
        .collect();
    assert!(folders.len() >= 4, "{folders:?}");
    for folder in folders {
        assert!(
            architecture.contains(&format!("`{folder}/`")),
            "ARCHITECTURE.md does not name server/src/{folder}/"
        );
    }
}
