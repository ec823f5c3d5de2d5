//! The house's floors: every module of `src/` may name only modules on a
//! floor below its own (or its own). The order is declared once, in
//! [`FLOORS`]; this test reads each file's `crate::`, `super::` and
//! `self::` paths outside comments and unit tests and fails, naming the file
//! and line, when one reaches up. Floors are listed lowest first; a module
//! belongs to the longest prefix that names it.
//!
//! A floor is a module and everything inside it, so the floors alone let two
//! files of one folder (or of two folders on one floor) import each other.
//! The circles check reads the same paths file by file, follows each name to
//! the file that defines it (through any `use` that re-exports it), and fails
//! naming the files of every circle, whichever folders they are in.

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
    "quota",
    "overrides",
    "penalty",
    "policy",
    "policy_limits",
    // A decision's receipt names the policy in force that charged it.
    "decision",
    "headers",
    "metrics",
    "access",
    "response",
    "grpc",
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
    // An operator's way in: JSON routes over the limiters of the above.
    "admin",
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
    match module_of_file(&relative(file, src)).as_str() {
        "" => "lib".to_string(),
        module => module.to_string(),
    }
}

/// `src/a/b.rs` → `a/b.rs`, whatever the platform's separator.
fn relative(file: &Path, src: &Path) -> String {
    file.strip_prefix(src)
        .unwrap()
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .join("/")
}

/// The code of a file without comments and without its unit tests (a
/// `#[cfg(test)]` block, or `#[cfg(all(test, ..))]`, may reach anywhere to
/// set a case up).
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
    rooted_in(code, module)
        .into_iter()
        .map(|(_, path)| path)
        .collect()
}

/// [`paths_in`], each path with the name it is known by in `module`.
fn rooted_in(code: &str, module: &str) -> Vec<(String, String)> {
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
                    let mut parts = segments(module);
                    parts.pop();
                    parts
                }
                _ => segments(module),
            };
            expand_named(after, base, &mut found);
        }
    }
    found
}

/// A module path's segments; the crate root (`""`) has none.
fn segments(module: &str) -> Vec<String> {
    module
        .split("::")
        .filter(|s| !s.is_empty())
        .map(String::from)
        .collect()
}

fn expand(text: &str, base: Vec<String>, found: &mut Vec<String>) {
    let mut named = Vec::new();
    expand_named(text, base, &mut named);
    found.extend(named.into_iter().map(|(_, path)| path));
}

/// [`expand`], keeping the name each path is known by where it is
/// imported: its last segment, or what follows `as`.
fn expand_named(text: &str, base: Vec<String>, found: &mut Vec<(String, String)>) {
    let mut segs = base;
    let mut rest = text;
    if let Some(group) = rest.strip_prefix('{') {
        for item in split_group(group) {
            expand_named(item.trim(), segs.clone(), found);
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
                        expand_named(item, segs.clone(), found);
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
    if let Some(last) = segs.last() {
        let name = match rest.trim_start().strip_prefix("as ") {
            Some(alias) => alias
                .trim_start()
                .split(|c: char| !(c.is_alphanumeric() || c == '_'))
                .next()
                .unwrap_or("")
                .to_string(),
            None => last.clone(),
        };
        found.push((name, segs.join("::")));
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

/// `a/b.rs` → `a::b`, `a/mod.rs` → `a`, and the crate root, `lib.rs`, → `""`.
fn module_of_file(file: &str) -> String {
    let path = file.strip_suffix(".rs").unwrap_or(file);
    let path = path.strip_suffix("/mod").unwrap_or(path);
    match path {
        "lib" | "mod" => String::new(),
        _ => path.replace('/', "::"),
    }
}

/// The folder a `mod.rs` (or the root's `lib.rs`) stands for, as a prefix of
/// the files inside it: `a/b/mod.rs` → `a/b/`, `lib.rs` → `""`.
fn folder_of(file: &str) -> Option<&str> {
    match file {
        "lib.rs" => Some(""),
        _ => file.strip_suffix("mod.rs").filter(|f| f.ends_with('/')),
    }
}

/// Every module path `code` names, in `module`: the `crate::`, `super::`
/// and `self::` paths, and a `use` of a child module by its bare name
/// (`use held::Held;` in a folder's `mod.rs`).
fn named_in(code: &str, module: &str, modules: &BTreeMap<String, String>) -> Vec<(String, String)> {
    let text = code.trim_start();
    let text = ["pub(crate) ", "pub(super) ", "pub "]
        .iter()
        .find_map(|v| text.strip_prefix(v))
        .unwrap_or(text);
    if let Some(rest) = text.strip_prefix("use ") {
        let first = rest
            .split(|c: char| !(c.is_alphanumeric() || c == '_'))
            .next()
            .unwrap_or("");
        let mut child = segments(module);
        child.push(first.to_string());
        if !["crate", "self", "super"].contains(&first) && modules.contains_key(&child.join("::")) {
            let mut found = Vec::new();
            expand_named(rest.trim_end_matches(';'), segments(module), &mut found);
            return found;
        }
    }
    rooted_in(code, module)
}

/// One file's import of another, where it is written.
struct Import {
    line: usize,
    path: String,
}

/// A file as the circles check reads it: its module, and each statement's
/// line with the paths it names (and the names it gives them).
struct Read<'a> {
    file: &'a str,
    module: String,
    named: Vec<(usize, Vec<(String, String)>)>,
}

/// The import graph of `files` (paths under `src/`, with their text): for
/// each file, the files it names and the first place it names each.
///
/// A name is followed to the file that defines it: `super::Connection`,
/// which a `mod.rs` imports from `connection.rs`, is an import of
/// `connection.rs`, so a re-export cannot hide a circle. A folder's
/// `mod.rs` and the files inside that folder are left out of each other's
/// imports: the parent declares its children and they may use what it
/// defines, which is how Rust builds a module, not a circle to break.
fn import_graph(files: &[(String, String)]) -> BTreeMap<String, BTreeMap<String, Import>> {
    let modules: BTreeMap<String, String> = files
        .iter()
        .map(|(file, _)| (module_of_file(file), file.clone()))
        .collect();
    let read: Vec<Read> = files
        .iter()
        .map(|(file, text)| {
            let module = module_of_file(file);
            let named = statements(code_lines(text))
                .into_iter()
                .map(|(n, code)| (n, named_in(&code, &module, &modules)))
                .collect();
            Read {
                file,
                module,
                named,
            }
        })
        .collect();
    // What each module's `use` statements bring in, by the name they give
    // it (a name imported twice, under two `cfg`s, stands for both).
    let mut names: Names = BTreeMap::new();
    for read in &read {
        for (name, path) in read.named.iter().flat_map(|(_, named)| named) {
            names
                .entry(read.module.as_str())
                .or_default()
                .entry(name.as_str())
                .or_default()
                .push(path.as_str());
        }
    }
    let within = |a: &str, b: &str| folder_of(a).is_some_and(|f| b.starts_with(f));
    let mut graph: BTreeMap<String, BTreeMap<String, Import>> = BTreeMap::new();
    for Read { file, named, .. } in &read {
        let edges = graph.entry(file.to_string()).or_default();
        for (line, path) in named
            .iter()
            .flat_map(|(line, named)| named.iter().map(move |(_, path)| (*line, path)))
        {
            for to in defined_in(path, &modules, &names, 0) {
                if to == *file || within(file, &to) || within(&to, file) {
                    continue;
                }
                edges.entry(to).or_insert_with(|| Import {
                    line,
                    path: path.clone(),
                });
            }
        }
    }
    graph
}

/// Per module, what its `use` statements name: name to the paths it stands for.
type Names<'a> = BTreeMap<&'a str, BTreeMap<&'a str, Vec<&'a str>>>;

/// The files that define what `path` names: the file of its longest module
/// prefix, or, when the next segment is a name that module imports, the
/// files that define what that import names.
fn defined_in(
    path: &str,
    modules: &BTreeMap<String, String>,
    names: &Names,
    depth: usize,
) -> Vec<String> {
    let segs: Vec<&str> = path.split("::").collect();
    let Some(k) = (0..=segs.len())
        .rev()
        .find(|&k| modules.contains_key(&segs[..k].join("::")))
    else {
        return Vec::new();
    };
    let module = segs[..k].join("::");
    let here = segs[..segs.len().min(k + 1)].join("::");
    let imported: Vec<&str> = segs
        .get(k)
        .and_then(|next| names.get(module.as_str())?.get(next))
        .into_iter()
        .flatten()
        .copied()
        // `use self::x;` of an inline module names what is already here.
        .filter(|full| *full != here)
        .collect();
    if imported.is_empty() || depth > 16 {
        return vec![modules[&module].clone()];
    }
    imported
        .iter()
        .flat_map(|full| {
            let path = [*full]
                .into_iter()
                .chain(segs[k + 1..].iter().copied())
                .collect::<Vec<_>>()
                .join("::");
            defined_in(&path, modules, names, depth + 1)
        })
        .collect()
}

/// Every circle of imports among `files`, one entry each: its files, then
/// each import that closes it, as `file:line: names path (in file)`.
fn circles(files: &[(String, String)]) -> Vec<String> {
    let graph = import_graph(files);
    let mut report = Vec::new();
    for tangle in tangles(&graph) {
        let mut lines = vec![format!(
            "{} files import one another in a circle: {}",
            tangle.len(),
            tangle.join(", ")
        )];
        for file in &tangle {
            for (to, import) in &graph[file] {
                if tangle.contains(to) {
                    lines.push(format!(
                        "  {file}:{}: names {} (in {to})",
                        import.line, import.path
                    ));
                }
            }
        }
        report.push(lines.join("\n"));
    }
    report
}

/// The graph's strongly connected parts of more than one file (Tarjan),
/// each sorted.
fn tangles(graph: &BTreeMap<String, BTreeMap<String, Import>>) -> Vec<Vec<String>> {
    struct Walk<'a> {
        graph: &'a BTreeMap<String, BTreeMap<String, Import>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        found: Vec<Vec<String>>,
    }
    fn visit<'a>(walk: &mut Walk<'a>, file: &'a str) {
        let at = walk.index.len();
        walk.index.insert(file, at);
        walk.low.insert(file, at);
        walk.stack.push(file);
        for to in walk.graph.get(file).into_iter().flat_map(|e| e.keys()) {
            if !walk.index.contains_key(to.as_str()) {
                visit(walk, to);
                let low = walk.low[file].min(walk.low[to.as_str()]);
                walk.low.insert(file, low);
            } else if walk.stack.contains(&to.as_str()) {
                let low = walk.low[file].min(walk.index[to.as_str()]);
                walk.low.insert(file, low);
            }
        }
        if walk.low[file] == at {
            let start = walk.stack.iter().rposition(|f| *f == file).unwrap();
            let mut part: Vec<String> = walk.stack.drain(start..).map(String::from).collect();
            if part.len() > 1 {
                part.sort();
                walk.found.push(part);
            }
        }
    }
    let mut walk = Walk {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        found: Vec::new(),
    };
    for file in graph.keys() {
        if !walk.index.contains_key(file.as_str()) {
            visit(&mut walk, file);
        }
    }
    walk.found.sort();
    walk.found
}

/// Every `.rs` file under `src/`, as its path there and its text.
fn sources() -> Vec<(String, String)> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files.sort();
    files
        .iter()
        .map(|file| (relative(file, &src), std::fs::read_to_string(file).unwrap()))
        .collect()
}

/// The circles check's verdict on `files`: what it prints when it fails.
fn check_circles(files: &[(String, String)]) -> Result<(), String> {
    let report = circles(files);
    if report.is_empty() {
        return Ok(());
    }
    Err(format!(
        "{} import circle(s) in src/ (move each thing to the file whose job it is):\n{}",
        report.len(),
        report.join("\n")
    ))
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

#[test]
fn no_files_import_one_another_in_a_circle() {
    if let Err(message) = check_circles(&sources()) {
        panic!("{message}");
    }
}

#[test]
fn the_circles_check_names_the_files_of_a_planted_circle() {
    // Planted files (path under `src/`, text), and what the check's message
    // must say of them (nothing: no circle).
    type Row<'a> = (&'a str, &'a [(&'a str, &'a str)], &'a [&'a str]);
    let rows: [Row; 4] = [
        (
            "two files",
            &[
                ("a.rs", "use crate::b::beta;\n\npub(crate) struct Alpha;\n"),
                (
                    "b.rs",
                    "//! b\n\npub(crate) fn beta() -> crate::a::Alpha {\n    crate::a::Alpha\n}\n",
                ),
            ],
            &[
                "1 import circle(s) in src/",
                "2 files import one another in a circle: a.rs, b.rs",
                "  a.rs:1: names b::beta (in b.rs)",
                "  b.rs:3: names a::Alpha (in a.rs)",
            ],
        ),
        (
            "through a parent's re-export, which must not hide it",
            &[
                ("lib.rs", "mod store;\n"),
                (
                    "store/mod.rs",
                    "mod a;\nmod b;\npub(crate) use self::a::Alpha;\n",
                ),
                (
                    "store/a.rs",
                    "use super::b::beta;\npub(crate) struct Alpha;\n",
                ),
                (
                    "store/b.rs",
                    "pub(crate) fn beta() -> super::Alpha {\n    super::Alpha\n}\n",
                ),
            ],
            &[
                "store/a.rs:1: names store::b::beta (in store/b.rs)",
                "store/b.rs:1: names store::Alpha (in store/a.rs)",
            ],
        ),
        (
            "files of two folders",
            &[
                ("x/mod.rs", "mod one;\n"),
                (
                    "x/one.rs",
                    "use crate::y::two::Two;\npub(crate) struct One;\n",
                ),
                ("y/mod.rs", "mod two;\n"),
                ("y/two.rs", "pub(crate) struct Two(crate::x::one::One);\n"),
            ],
            &["2 files import one another in a circle: x/one.rs, y/two.rs"],
        ),
        (
            "a folder's mod.rs and its own files, by design",
            &[
                (
                    "store/mod.rs",
                    "mod a;\nuse self::a::Alpha;\npub(crate) struct Shared;\n",
                ),
                ("store/a.rs", "pub(crate) struct Alpha(super::Shared);\n"),
            ],
            &[],
        ),
    ];
    for (case, files, expected) in rows {
        let files: Vec<(String, String)> = files
            .iter()
            .map(|(file, text)| (file.to_string(), text.to_string()))
            .collect();
        let message = check_circles(&files).err().unwrap_or_default();
        println!("{case}:\n{message}\n");
        for line in expected {
            assert!(message.contains(line), "{case}: {line:?} not in\n{message}");
        }
        assert_eq!(message.is_empty(), expected.is_empty(), "{case}: {message}");
    }
}

/// Issue 45: each file has one job, and none grows past 800 lines
/// (`src/error.rs` held every subsystem's errors in 804); and no
/// configuration error is turned into text to have its prefix trimmed off
/// (`ConfigError::reason` says what is wrong without it).
#[test]
fn no_source_file_is_over_800_lines_and_no_error_is_trimmed_as_text() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut long = Vec::new();
    let mut trimmed = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        let lines = text.lines().count();
        if lines > 800 {
            long.push(format!("{}: {lines} lines", relative(file, &src)));
        }
        if text.contains("trim_start_matches(\"invalid rate limit configuration") {
            trimmed.push(relative(file, &src));
        }
    }
    assert!(long.is_empty(), "over 800 lines: {long:#?}");
    assert!(
        trimmed.is_empty(),
        "a ConfigError trimmed as text in: {trimmed:#?}"
    );
}
