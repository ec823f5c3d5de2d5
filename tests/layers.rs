//! The house's floors: every module of `src/` may name only modules on a
//! floor below its own (or its own). The order is declared once, in
//! [`FLOORS`]; this test reads each file's `crate::`, `super::` and
//! `self::` paths outside comments and unit tests and fails, naming the file
//! and line, when one reaches up. Floors are listed lowest first; a module
//! belongs to the longest prefix that names it.

use std::collections::BTreeMap;
use std::path::Path;

/// Lowest first. Each line is one floor; a module may use its own floor's
/// modules only if it is that module (or inside it), so the order among
/// them is what keeps circles out.
const FLOORS: &[&str] = &[
    // The ground: what every other floor speaks in.
    "error",
    "clock",
    "key",
    "decision",
    "quota",
    "overrides",
    "penalty",
    "policy",
    "headers",
    "metrics",
    "access",
    "response",
    // The parts the strategies build on.
    "store",
    "store::keys",
    "store::memory::state",
    "store::memory::names",
    "store::memory::shard",
    "store::redis::script",
    "store::redis::args",
    "store::redis::reply",
    // Each strategy's home, and the registry the stores dispatch through.
    "strategy",
    // The stores.
    "store::memory",
    "store::redis",
    // What decides beside or instead of a store.
    "failure",
    "throttle",
    "local",
    // The request path, then the ways in.
    "limiter",
    "layer",
    "rate_limiter",
    "tier",
    "queue",
    "lib",
];

/// The floor of module `path` (`a::b::c`): its longest listed prefix.
fn floor_of(path: &str) -> Option<(usize, &'static str)> {
    FLOORS
        .iter()
        .enumerate()
        .filter(|(_, prefix)| path == **prefix || path.starts_with(&format!("{prefix}::")))
        .max_by_key(|(_, prefix)| prefix.len())
        .map(|(i, prefix)| (i, *prefix))
}

/// `src/a/b.rs` → `a::b`, `src/a/mod.rs` → `a`, `src/lib.rs` → `lib`.
fn module_of(file: &Path, src: &Path) -> String {
    let rel = file.strip_prefix(src).unwrap().with_extension("");
    let mut parts: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if parts.last().is_some_and(|p| p == "mod") {
        parts.pop();
    }
    parts.join("::")
}

/// The code of a file without comments and without its unit tests (a
/// `#[cfg(test)]` block, or one under `#[cfg(all(test, ..))]`, may reach
/// anywhere to set a case up).
fn code_lines(text: &str) -> Vec<(usize, String)> {
    let mut lines = Vec::new();
    let mut skip_depth: Option<i32> = None;
    let mut pending_test = false;
    for (n, line) in text.lines().enumerate() {
        let code = line.split("//").next().unwrap_or("");
        if let Some(depth) = &mut skip_depth {
            *depth += code.matches('{').count() as i32 - code.matches('}').count() as i32;
            if *depth <= 0 && code.contains('}') {
                skip_depth = None;
            }
            continue;
        }
        let attribute = code.trim();
        if attribute == "#[cfg(test)]" || attribute.starts_with("#[cfg(all(test,") {
            pending_test = true;
            continue;
        }
        if pending_test {
            pending_test = false;
            if code.contains('{') {
                let depth = code.matches('{').count() as i32 - code.matches('}').count() as i32;
                if depth > 0 {
                    skip_depth = Some(depth);
                }
                continue;
            }
            // An attribute on a single item (a `use`, a field): skip that line.
            continue;
        }
        lines.push((n + 1, code.to_string()));
    }
    lines
}

/// Every path a line names after `crate::`, `super::` or `self::`, braces
/// expanded: `use crate::{a::{b, c}, d}` gives `a::b`, `a::c`, `d`, each
/// resolved against `module` for `super`/`self`.
fn paths_in(code: &str, module: &str) -> Vec<String> {
    let mut found = Vec::new();
    for root in ["crate::", "super::", "self::"] {
        let mut rest = code;
        while let Some(at) = rest.find(root) {
            let before = rest[..at].chars().last();
            let after = &rest[at + root.len()..];
            rest = after;
            if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
                continue;
            }
            let base = match root {
                "crate::" => Vec::new(),
                "super::" => {
                    let mut parts: Vec<&str> = module.split("::").collect();
                    parts.pop();
                    parts.into_iter().map(String::from).collect()
                }
                _ => module.split("::").map(String::from).collect(),
            };
            expand(after, base, &mut found);
        }
    }
    found
}

fn expand(text: &str, base: Vec<String>, found: &mut Vec<String>) {
    let mut segs = base;
    let mut rest = text;
    if let Some(group) = rest.strip_prefix('{') {
        for item in split_group(group) {
            expand(item.trim(), segs.clone(), found);
        }
        return;
    }
    loop {
        let end = rest
            .find(|c: char| !(c.is_alphanumeric() || c == '_'))
            .unwrap_or(rest.len());
        let seg = &rest[..end];
        if seg == "super" {
            segs.pop();
        } else if !seg.is_empty() && seg != "self" {
            segs.push(seg.to_string());
        }
        rest = &rest[end..];
        if let Some(next) = rest.strip_prefix("::") {
            if let Some(group) = next.strip_prefix('{') {
                for item in split_group(group).into_iter().map(str::trim) {
                    if !item.is_empty() {
                        expand(item, segs.clone(), found);
                    }
                }
                return;
            }
            rest = next;
            continue;
        }
        break;
    }
    // Only module paths matter: a trailing item (a type, a function) is
    // still resolved by its longest listed prefix.
    if !segs.is_empty() {
        found.push(segs.join("::"));
    }
}

/// The items of a brace group up to its closing brace, split at top-level commas.
fn split_group(text: &str) -> Vec<&str> {
    let mut items = Vec::new();
    let mut depth = 0;
    let mut start = 0;
    for (i, c) in text.char_indices() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => {
                items.push(&text[start..i]);
                return items;
            }
            '}' => depth -= 1,
            ',' if depth == 0 => {
                items.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    items.push(&text[start..]);
    items
}

fn rust_files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// Joins `use` statements that span lines, so a brace group is read whole.
fn statements(lines: Vec<(usize, String)>) -> Vec<(usize, String)> {
    let mut joined: Vec<(usize, String)> = Vec::new();
    let mut open: Option<(usize, String)> = None;
    for (n, line) in lines {
        if let Some((start, mut text)) = open.take() {
            text.push(' ');
            text.push_str(line.trim());
            if text.contains(';') {
                joined.push((start, text));
            } else {
                open = Some((start, text));
            }
            continue;
        }
        let trimmed = line.trim_start();
        let is_use = trimmed.starts_with("use ")
            || trimmed.starts_with("pub use ")
            || trimmed.starts_with("pub(crate) use ")
            || trimmed.starts_with("pub(super) use ");
        if is_use && !line.contains(';') {
            open = Some((n, line));
        } else {
            joined.push((n, line));
        }
    }
    joined.extend(open);
    joined
}

/// The crate root's re-exports (`pub use store::MemoryStore;` in lib.rs):
/// item name to the module path it stands for, so that `crate::MemoryStore`
/// is placed on its module's floor, not passed over.
fn root_reexports(src: &Path) -> BTreeMap<String, String> {
    let lib = std::fs::read_to_string(src.join("lib.rs")).unwrap();
    let mut names = BTreeMap::new();
    for (_, code) in statements(code_lines(&lib)) {
        let Some(rest) = code.trim_start().strip_prefix("pub use ") else {
            continue;
        };
        let mut found = Vec::new();
        expand(rest.trim_end_matches(';'), Vec::new(), &mut found);
        for path in found {
            let name = path.rsplit("::").next().unwrap().to_string();
            names.insert(name, path);
        }
    }
    names
}

#[test]
fn every_module_imports_only_modules_below_it() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let reexports = root_reexports(&src);
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files.sort();
    let mut unplaced = Vec::new();
    let mut upward: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for file in &files {
        let module = module_of(file, &src);
        let Some((floor, home)) = floor_of(&module) else {
            unplaced.push(module);
            continue;
        };
        let text = std::fs::read_to_string(file).unwrap();
        for (n, code) in statements(code_lines(&text)) {
            for path in paths_in(&code, &module) {
                let first = path.split("::").next().unwrap();
                let path = match reexports.get(first) {
                    Some(full) => path.replacen(first, full, 1),
                    None => path,
                };
                let Some((to, target_home)) = floor_of(&path) else {
                    continue; // a macro or a name from outside the crate
                };
                if to > floor && !target_home.starts_with(home) {
                    upward.entry(module.clone()).or_default().push(format!(
                        "{}:{n}: {home} (floor {floor}) uses {path} ({target_home}, floor {to})",
                        file.strip_prefix(&src).unwrap().display()
                    ));
                }
            }
        }
    }
    assert!(
        unplaced.is_empty(),
        "modules on no floor (add them to FLOORS): {unplaced:?}"
    );
    let report: Vec<String> = upward.into_values().flatten().collect();
    assert!(
        report.is_empty(),
        "{} imports reach above their floor:\n{}",
        report.len(),
        report.join("\n")
    );
}

#[test]
fn paths_are_read_as_written() {
    assert_eq!(
        paths_in("use crate::{a::{b, c}, d::E};", "x"),
        ["a::b", "a::c", "d::E"]
    );
    assert_eq!(
        paths_in("use super::shard::Shard;", "store::memory::names"),
        ["store::memory::shard::Shard"]
    );
    assert_eq!(
        paths_in("let x = crate::metrics::hit(p);", "local"),
        ["metrics::hit"]
    );
    assert_eq!(
        floor_of("store::memory::shard::Shard").unwrap().1,
        "store::memory::shard"
    );
    assert_eq!(
        floor_of("store::memory::MemoryStore").unwrap().1,
        "store::memory"
    );
    assert!(floor_of("limiter").unwrap().0 > floor_of("local").unwrap().0);
}

#[test]
fn the_roots_reexports_are_placed_on_their_modules_floors() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let reexports = root_reexports(&src);
    assert_eq!(reexports["MemoryStore"], "store::MemoryStore");
    assert_eq!(reexports["RateLimiter"], "rate_limiter::RateLimiter");
    assert_eq!(floor_of(&reexports["Policy"]).unwrap().1, "policy");
}
