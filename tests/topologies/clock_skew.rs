//! Two app servers whose clocks disagree, on one Redis.
//!
//! With client time a window's end is written once, by the request that
//! opens the window, and read back by every server: a server whose clock runs
//! ahead opens the next window early, one running behind joins the window
//! the other opened, and nobody ever counts in a window of its own.

use std::collections::BTreeMap;
use std::num::NonZeroU32;
use std::time::Duration;

use crate::support::conformance::T0;
use crate::support::redis::{shared_url, unique_prefix};
use tollgate::clock::ManualClock;
use tollgate::{Decision, Key, Policy, Quota, RedisStore, Store};

const LIMIT: u64 = 10;
const WINDOW: Duration = Duration::from_secs(10);
const SKEW: Duration = Duration::from_secs(2);

async fn store(prefix: &str, clock: Option<ManualClock>) -> RedisStore {
    let conn = redis::Client::open(shared_url())
        .unwrap()
        .get_connection_manager()
        .await
        .unwrap();
    let builder = RedisStore::from_manager(conn).prefix(prefix);
    match clock {
        Some(clock) => builder.clock(clock).build().unwrap(),
        None => builder.build().unwrap(),
    }
}

fn policy() -> Policy {
    Policy::fixed_window(
        "core",
        Quota::with_window(NonZeroU32::new(LIMIT as u32).unwrap(), WINDOW).unwrap(),
    )
}

#[tokio::test]
async fn two_stores_2s_apart_never_admit_more_than_the_limit_in_one_window() {
    let prefix = unique_prefix("skew");
    let (behind, ahead) = (
        ManualClock::new(T0),
        ManualClock::new(T0 + SKEW.as_micros() as u64),
    );
    let stores = [
        store(&prefix, Some(behind.clone())).await,
        store(&prefix, Some(ahead.clone())).await,
    ];
    let policy = policy();
    let key = Key::new("shared-caller");

    // 60 s of real time in 100 ms steps; each server sends one request per
    // step, alternating which goes first. Demand (20/s) is far above the
    // limit (1/s on average), so every window is filled.
    let mut seen: Vec<(usize, Decision)> = Vec::new();
    for step in 0..600u64 {
        for i in 0..2 {
            let s = ((step as usize) + i) % 2;
            seen.push((s, stores[s].check(&policy, &key, 1).await.unwrap()));
        }
        behind.advance(Duration::from_millis(100));
        ahead.advance(Duration::from_millis(100));
    }

    // A window is named by its stored end, which every decision reports.
    let mut admitted: BTreeMap<u64, u64> = BTreeMap::new();
    let mut reporters: BTreeMap<u64, [bool; 2]> = BTreeMap::new();
    for (s, d) in &seen {
        if d.allowed {
            *admitted.entry(d.reset_at_micros).or_default() += 1;
        }
        reporters.entry(d.reset_at_micros).or_default()[*s] = true;
    }
    for (end, n) in &admitted {
        assert!(*n <= LIMIT, "window ending {end} admitted {n}");
    }
    // Headers are stable: the window end never goes back, so the two servers
    // never alternate between two answers, and both report every window.
    for pair in seen.windows(2) {
        assert!(
            pair[1].1.reset_at_micros >= pair[0].1.reset_at_micros,
            "reset-at went back: {:?} then {:?}",
            pair[0],
            pair[1]
        );
    }
    assert!(
        reporters.values().all(|both| both[0] && both[1]),
        "{reporters:?}"
    );
    // The server running ahead opens each window 2 s early by the other's
    // clock, so windows are 10 s apart on its clock: 60 s hold 6 (or 7).
    assert!((6..=7).contains(&admitted.len()), "{admitted:?}");
    let total: u64 = admitted.values().sum();
    assert_eq!(total, LIMIT * admitted.len() as u64);
    println!(
        "[clock skew 2 s] {} windows, admitted per window {:?}",
        admitted.len(),
        admitted.values().collect::<Vec<_>>()
    );
}

#[tokio::test]
async fn with_redis_time_two_stores_share_one_clock() {
    let prefix = unique_prefix("skew-time");
    let (a, b) = (store(&prefix, None).await, store(&prefix, None).await);
    let policy = policy();
    let key = Key::new("shared-caller");
    let first = a.check(&policy, &key, 1).await.unwrap();
    let second = b.check(&policy, &key, 1).await.unwrap();
    assert_eq!(first.reset_at_micros, second.reset_at_micros);
    assert!(second.now_micros >= first.now_micros);
    assert_eq!(second.used, 2);
}
