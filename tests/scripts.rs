//! What Redis runs stays reviewable: `lua/SENT.md` lists every script the
//! store sends with its SHA1 and line count, `examples/lua.rs` prints any
//! one of them numbered, and a Redis error from inside one names it and a
//! line of that text.

#[path = "../examples/support/manifest.rs"]
mod manifest;
mod support;

use std::collections::BTreeSet;
use std::num::NonZeroU32;

use support::redis::{unique_prefix, RedisServer};
use tollgate::{Key, Policy, Quota, RedisStore, Store};

#[test]
fn lua_sent_md_lists_every_script_exactly_as_sent() {
    let scripts = RedisStore::scripts();
    let names: BTreeSet<&str> = scripts.iter().map(|(name, _)| *name).collect();
    assert_eq!(names.len(), scripts.len(), "script names are unique");
    let refresh = format!("run `{}` and commit lua/SENT.md", manifest::REFRESH);
    let kept = std::fs::read_to_string(manifest::PATH)
        .unwrap_or_else(|e| panic!("{}: {e}; {refresh}", manifest::PATH));
    let now = manifest::render(&scripts);
    // The rows that differ, so a failure says which scripts changed.
    let gone: Vec<&str> = kept
        .lines()
        .filter(|l| !now.lines().any(|n| n == *l))
        .collect();
    let new: Vec<&str> = now
        .lines()
        .filter(|l| !kept.lines().any(|k| k == *l))
        .collect();
    assert!(
        kept == now,
        "lua/SENT.md is stale (no longer sent: {gone:#?}; sent, not listed: {new:#?}); {refresh}"
    );
}

#[test]
fn no_lua_source_contains_another_so_each_row_names_its_sources() {
    let sources = manifest::sources();
    for (outer, outer_text) in &sources {
        for (inner, inner_text) in &sources {
            assert!(
                outer == inner || !outer_text.contains(inner_text.as_str()),
                "lua/{outer}.lua contains lua/{inner}.lua: lua/SENT.md would name both"
            );
        }
    }
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
    // lua/SENT.md's SHA1 is the one the store ran it by.
    let loaded: Vec<i64> = redis::cmd("SCRIPT")
        .arg("EXISTS")
        .arg(manifest::sha(sent))
        .query(&mut server.conn())
        .unwrap();
    assert_eq!(
        loaded,
        [1],
        "fixed_window ran by another SHA1 than lua/SENT.md's"
    );
}
