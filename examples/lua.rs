//! Every Lua script tollgate sends to Redis, exactly as sent.
//!
//! ```sh
//! cargo run --all-features --example lua                          # the list: name, lines, SHA1
//! cargo run --all-features --example lua -- fixed_window          # that script, lines numbered
//! cargo run --all-features --example lua -- --raw fixed_window    # that script, exactly as sent
//! cargo run --all-features --example lua -- --manifest            # rewrite lua/SENT.md
//! ```
//!
//! The scripts are assembled from the sources in `lua/` (a decision inside
//! its reply wrapper, the no-writes twin with its flag, batches inside the
//! batch driver); this is the text Redis runs, so a Redis error's
//! `@user_script:N` is line N of what this prints. The repository keeps
//! no copy of it, only `lua/SENT.md`: a row per script with its SHA1 and
//! line count, which `tests/scripts.rs` keeps current.

#[path = "support/manifest.rs"]
mod manifest;

use std::fmt::Write as _;
use std::io::Write as _;
use std::process::ExitCode;

fn main() -> ExitCode {
    let scripts = tollgate::RedisStore::scripts();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let find = |name: &str| {
        let found = scripts.iter().find(|(n, _)| *n == name).map(|(_, t)| *t);
        if found.is_none() {
            eprintln!("lua: no script {name}; `cargo run --all-features --example lua` lists them");
        }
        found
    };
    // Written at the end in one go, so `| head` ends it quietly.
    let mut out = String::new();
    match args[..] {
        [] => {
            let mut rows: Vec<&(&str, &str)> = scripts.iter().collect();
            rows.sort_by_key(|(name, _)| *name);
            let width = rows.iter().map(|(name, _)| name.len()).max().unwrap_or(0);
            for (name, text) in rows {
                let lines = text.lines().count();
                let sha = manifest::sha(text);
                writeln!(out, "{name:width$} {lines:>5} {sha}").unwrap();
            }
        }
        ["--manifest"] => {
            if let Err(err) = std::fs::write(manifest::PATH, manifest::render(&scripts)) {
                eprintln!("lua: cannot write {}: {err}", manifest::PATH);
                return ExitCode::FAILURE;
            }
            let listed = scripts.len();
            writeln!(out, "lua: {listed} scripts listed in {}", manifest::PATH).unwrap();
        }
        ["--raw", name] => {
            let Some(text) = find(name) else {
                return ExitCode::FAILURE;
            };
            out += text;
        }
        [name] if !name.starts_with('-') => {
            let Some(text) = find(name) else {
                return ExitCode::FAILURE;
            };
            for (n, line) in text.lines().enumerate() {
                writeln!(out, "{:>4}  {line}", n + 1).unwrap();
            }
        }
        _ => {
            eprintln!("usage: lua [NAME | --raw NAME | --manifest]");
            return ExitCode::FAILURE;
        }
    }
    match std::io::stdout().write_all(out.as_bytes()) {
        Err(err) if err.kind() != std::io::ErrorKind::BrokenPipe => {
            eprintln!("lua: {err}");
            ExitCode::FAILURE
        }
        _ => ExitCode::SUCCESS,
    }
}
