//! Every Lua script tollgate sends to Redis, exactly as sent.
//!
//! ```sh
//! cargo run --all-features --example lua               # print them, each after a header line
//! cargo run --all-features --example lua -- lua/sent   # write lua/sent/<name>.lua
//! ```
//!
//! The scripts are assembled from the sources in `lua/` (a decision inside
//! its reply wrapper, the no-writes twin with its flag, batches inside the
//! batch driver); this is the text Redis runs, so a Redis error's
//! `@user_script:N` is line N of `lua/sent/<name>.lua`. The repository
//! keeps that copy, and `tests/scripts.rs` fails when it is stale.

use std::path::PathBuf;
use std::process::ExitCode;

fn main() -> ExitCode {
    let scripts = tollgate::RedisStore::scripts();
    let Some(dir) = std::env::args_os().nth(1).map(PathBuf::from) else {
        for (name, text) in &scripts {
            println!(
                "-- ======== {name} ({} lines) ========",
                text.lines().count()
            );
            println!("{text}");
        }
        return ExitCode::SUCCESS;
    };
    if let Err(err) = std::fs::create_dir_all(&dir) {
        eprintln!("lua: cannot create {}: {err}", dir.display());
        return ExitCode::FAILURE;
    }
    for (name, text) in &scripts {
        let path = dir.join(format!("{name}.lua"));
        if let Err(err) = std::fs::write(&path, text) {
            eprintln!("lua: cannot write {}: {err}", path.display());
            return ExitCode::FAILURE;
        }
    }
    println!("lua: wrote {} scripts to {}", scripts.len(), dir.display());
    ExitCode::SUCCESS
}
