//! `lua/SENT.md`: one row per Lua script the Redis store sends, in place of
//! a copy of each. A row names the script, the SHA1 `EVALSHA` calls it by,
//! its line count and the files of `lua/` it is put together from, so a
//! change to what Redis runs shows in a diff without the assembled texts
//! living in the tree.
//!
//! Shared by `examples/lua.rs`, which writes the file, and
//! `tests/scripts.rs`, which fails when it is stale, through `#[path]`
//! includes: both render it with the same code.

use std::path::Path;

/// Where the manifest lives.
pub const PATH: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/lua/SENT.md");

/// The command that rewrites the manifest.
pub const REFRESH: &str = "cargo run --all-features --example lua -- --manifest";

/// The SHA1 of a script's text, as Redis computes it for `SCRIPT LOAD` and
/// `EVALSHA` (and the store, through `redis::Script`).
pub fn sha(text: &str) -> String {
    redis::Script::new(text).get_hash().to_owned()
}

/// The manifest of `scripts` (name, text), a row each, sorted by name.
pub fn render(scripts: &[(&str, &str)]) -> String {
    let sources = sources();
    let mut rows: Vec<&(&str, &str)> = scripts.iter().collect();
    rows.sort_by_key(|(name, _)| *name);
    let mut out = format!(
        "# What tollgate sends to Redis\n\
         \n\
         Every Lua script the Redis store sends, one row each: the SHA1 `EVALSHA`\n\
         calls it by, its lines, and the files of `lua/` it is assembled from, in\n\
         order (`src/store/redis/script.rs` adds the glue between them).\n\
         Generated; `tests/scripts.rs` fails when it is stale.\n\
         \n\
         ```sh\n\
         {:<52}  # the script, lines numbered\n\
         {REFRESH}  # rewrite this file\n\
         ```\n\
         \n\
         | script | sha1 | lines | from `lua/` |\n\
         |---|---|---:|---|\n",
        "cargo run --all-features --example lua -- NAME"
    );
    for (name, text) in rows {
        out += &format!(
            "| {name} | {} | {} | {} |\n",
            sha(text),
            text.lines().count(),
            assembled_from(text, &sources).join(" + ")
        );
    }
    out
}

/// Every `lua/*.lua` file: its name without the extension, and its text.
pub fn sources() -> Vec<(String, String)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("lua");
    let mut sources = Vec::new();
    for entry in std::fs::read_dir(&dir).expect("lua/ is readable") {
        let path = entry.expect("lua/ is readable").path();
        if path.extension().is_some_and(|ext| ext == "lua") {
            let name = path.file_stem().unwrap().to_string_lossy().into_owned();
            let text = std::fs::read_to_string(&path).expect("a lua/ file is readable");
            sources.push((name, text));
        }
    }
    sources
}

/// The sources whose whole text appears in `text`, in the order they first
/// appear. Every script includes its files verbatim (`include_str!`), and
/// no file of `lua/` contains another, so this is exactly what it is
/// assembled from.
fn assembled_from<'a>(text: &str, sources: &'a [(String, String)]) -> Vec<&'a str> {
    let mut found: Vec<(usize, &str)> = sources
        .iter()
        .filter_map(|(name, source)| Some((text.find(source.as_str())?, name.as_str())))
        .collect();
    found.sort();
    found.into_iter().map(|(_, name)| name).collect()
}
