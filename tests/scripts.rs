//! What Redis runs is visible: `lua/sent/` holds every script exactly as the
//! store sends it, and a Redis error from inside one names it and a line of
//! that text.

mod support;

use std::collections::BTreeSet;
use std::num::NonZeroU32;
use std::path::Path;

use support::redis::{unique_prefix, RedisServer};
use tollgate::{Key, Policy, Quota, RedisStore, Store};

const SENT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/lua/sent");
const REFRESH: &str =
    "run `cargo run --all-features --example lua -- lua/sent` and commit lua/sent";

#[test]
fn lua_sent_holds_every_script_exactly_as_sent() {
    let scripts = RedisStore::scripts();
    let names: BTreeSet<&str> = scripts.iter().map(|(name, _)| *name).collect();
    assert_eq!(names.len(), scripts.len(), "script names are unique");
    for (name, text) in &scripts {
        let path = Path::new(SENT).join(format!("{name}.lua"));
        let kept = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("{}: {e}; {REFRESH}", path.display()));
        assert!(
            kept == *text,
            "{} differs from what is sent; {REFRESH}",
            path.display()
        );
    }
    let files: BTreeSet<String> = std::fs::read_dir(SENT)
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    let expected: BTreeSet<String> = names.iter().map(|n| format!("{n}.lua")).collect();
    assert_eq!(files, expected, "no stale file in lua/sent; {REFRESH}");
}

#[tokio::test]
async fn a_script_error_names_the_script_and_a_line_of_its_sent_text() {
    let server = RedisServer::start();
    let prefix = unique_prefix("script-error");
    let store = RedisStore::connect_builder(&server.url())
        .await
        .unwrap()
        .prefix(&prefix)
        .build()
        .unwrap();
    let policy = Policy::fixed_window("core", Quota::per_minute(NonZeroU32::new(5).unwrap()));
    // The caller's window key holds a list, not a hash: HMGET fails.
    let key = format!("{prefix}:{{core|bob}}:fixed_window:0");
    let _: () = redis::cmd("RPUSH")
        .arg(&key)
        .arg("not a window")
        .query(&mut server.conn())
        .unwrap();
    let err = store.check(&policy, &Key::new("bob"), 1).await.unwrap_err();
    let message = err.to_string();
    assert!(message.contains("script fixed_window (line "), "{message}");
    assert!(
        message.contains("`cargo run --all-features --example lua -- fixed_window` prints it"),
        "{message}"
    );
    let line: usize = message
        .split("line ")
        .nth(1)
        .and_then(|rest| rest.split(';').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no line in {message}"));
    // The text that command prints, numbered.
    let scripts = RedisStore::scripts();
    let (_, sent) = scripts
        .iter()
        .find(|(name, _)| *name == "fixed_window")
        .unwrap();
    let failing = sent.lines().nth(line - 1).unwrap_or_default();
    assert!(
        failing.contains("redis.call('HMGET'"),
        "line {line} of fixed_window as sent is {failing:?}, not the HMGET that failed"
    );
}
