//! Concurrency slots: held slots, releases queued or given up, and checks
//! whose request went away give their slot back.

use std::collections::BTreeMap;
use std::num::NonZeroU32;
use std::time::{Duration, Instant};

use redis::Commands;
use tollgate::decision::Receipt;
use tollgate::{Key, Policy, RedisStore, Store};

use crate::common::*;
use crate::support::redis::{command_calls, reset_stats, script_loads, RedisServer};

/// A batching store on `server` with `n` slots of `policy` taken on key
/// "k": the store, the policy and the slots' receipts.
async fn holding(
    server: &RedisServer,
    policy: Policy,
    n: usize,
) -> (std::sync::Arc<RedisStore>, Policy, Vec<Receipt>) {
    let store = std::sync::Arc::new(batching_store(&server.url(), true).await);
    let mut held = Vec::new();
    for _ in 0..n {
        held.push(
            store
                .check(&policy, &Key::new("k"), 1)
                .await
                .unwrap()
                .receipt,
        );
    }
    (store, policy, held)
}

#[tokio::test]
async fn a_queued_release_goes_out_even_after_its_caller_gave_up() {
    let server = RedisServer::start();
    let (store, policy, held) = holding(&server, slots("held", 10), 3).await;
    let (slots, other) = (Key::new("k"), Key::new("other"));

    server.pause_clients(Duration::from_millis(300));
    // The releases queue, and their callers give up (as a release guard's
    // deadline would).
    let sent = take_every_slot(&store, &policy, &other).await;
    for receipt in &held {
        let gave_up = tokio::time::timeout(
            Duration::from_millis(10),
            store.refund(&policy, &slots, receipt),
        )
        .await;
        assert!(gave_up.is_err(), "Redis is paused: nothing can answer yet");
    }
    for d in sent {
        assert!(d.await.unwrap().unwrap().allowed);
    }
    // The releases go out in the next call (from a task of the batcher's).
    until_slots_held(&store, &policy, &slots, 0).await;
}

/// Waits (ten seconds at most) until `key` holds `n` slots of `policy`:
/// releases queued behind a paused Redis go out in a task of their own.
/// A slot never given back stays held for the policy's timeout (a minute
/// in these tests), far past the wait, which only absorbs a slow machine.
async fn until_slots_held(store: &RedisStore, policy: &Policy, key: &Key, n: u64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let used = store.peek(policy, key).await.unwrap().used;
        if used == n {
            return;
        }
        assert!(Instant::now() < deadline, "{used} slots held, not {n}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Takes and gives back a slot of `policy` (on a key of its own), so that
/// its scripts are loaded and a call needs no second try.
async fn warm_up(store: &RedisStore, policy: &Policy) {
    let key = Key::new("warm-up");
    let taken = store.check(policy, &key, 1).await.unwrap();
    store.refund(policy, &key, &taken.receipt).await.unwrap();
}

#[tokio::test]
async fn a_concurrency_check_given_up_on_its_way_gives_its_slot_back() {
    // The check reaches Redis, but its request has gone (a client that hung
    // up) before the answer comes: the slot it took is given back, batching
    // or not, rather than held until its timeout.
    let server = RedisServer::start();
    for batching in [true, false] {
        let store = store_with(&server.url(), &format!("gone{batching}"), None, batching).await;
        let (policy, key) = (slots("gone", 5), Key::new("k"));
        warm_up(&store, &policy).await;
        reset_stats(&server);
        server.pause_clients(Duration::from_millis(300));
        let check = tokio::time::timeout(Duration::from_millis(50), store.check(&policy, &key, 1));
        assert!(
            check.await.is_err(),
            "Redis is paused: the check is still on its way"
        );
        until_slots_held(&store, &policy, &key, 0).await;
        let calls = command_calls(&server);
        assert_eq!(calls.get("zadd"), Some(&1), "the slot was taken: {calls:?}");
        assert_eq!(calls.get("zrem"), Some(&1), "and given back: {calls:?}");
    }
}

/// A concurrency check goes from a task of its own, which must not outlive
/// a Redis that hangs: on a connection without a response timeout of its
/// own, the task gives up after 10 s (time paused and moved by hand once
/// the checks wait on a paused Redis).
#[tokio::test]
async fn a_check_on_a_task_of_its_own_waits_ten_seconds_for_a_hung_redis() {
    let server = RedisServer::start();
    let alive = || {
        tokio::runtime::Handle::current()
            .metrics()
            .num_alive_tasks()
    };
    for batching in [true, false] {
        let config = redis::AsyncConnectionConfig::new().set_response_timeout(None);
        let conn = redis::Client::open(server.url())
            .unwrap()
            .get_multiplexed_async_connection_with_config(&config)
            .await
            .unwrap();
        let store = RedisStore::from_connection(conn)
            .prefix(format!("hung{batching}"))
            .batching(batching)
            .build()
            .unwrap();
        let (policy, key) = (slots("hung", 5), Key::new("k"));
        warm_up(&store, &policy).await;
        let before = alive();
        server.pause_clients(Duration::from_millis(400));
        for _ in 0..3 {
            let check =
                tokio::time::timeout(Duration::from_millis(50), store.check(&policy, &key, 1));
            assert!(check.await.is_err(), "Redis is paused: no answer");
        }
        tokio::time::pause();
        tokio::time::advance(Duration::from_secs(9)).await;
        // Tasks whose timer fired run now (a bound under 9 s fails here).
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        assert_eq!(alive(), before + 3, "the checks' tasks wait for Redis");
        tokio::time::advance(Duration::from_secs(2)).await;
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        assert_eq!(alive(), before, "and give up after 10 s");
        // Redis wakes within 400 ms and runs the checks; their slots time
        // out in Redis, as documented for answers past 10 s.
        tokio::time::resume();
    }
}

#[tokio::test]
async fn a_concurrency_pass_that_comes_back_unread_is_given_back() {
    // The answer is in, but the request is dropped before it runs again to
    // read it (a client that hung up meanwhile): the pass is given back,
    // sent alone or not, batching or not, and queued in a batch.
    let server = RedisServer::start();
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    for batching in [true, false] {
        let store = store_with(&server.url(), &format!("unread{batching}"), None, batching).await;
        let (policy, key) = (slots("unread", 5), Key::new("k"));
        warm_up(&store, &policy).await;
        let mut check = store.check(&policy, &key, 1);
        assert!(check.as_mut().poll(&mut cx).is_pending());
        // The slot is taken: the check's answer came in before the peek's,
        // on the same connection, and is still unread.
        until_slots_held(&store, &policy, &key, 1).await;
        drop(check);
        until_slots_held(&store, &policy, &key, 0).await;
    }
    let store = std::sync::Arc::new(batching_store(&server.url(), true).await);
    let (policy, key) = (slots("unread_queued", 500), Key::new("k"));
    warm_up(&store, &policy).await;
    server.pause_clients(Duration::from_millis(200));
    let sent = take_every_slot(&store, &policy, &Key::new("other")).await;
    let (mut a, mut b) = (store.check(&policy, &key, 1), store.check(&policy, &key, 1));
    assert!(a.as_mut().poll(&mut cx).is_pending() && b.as_mut().poll(&mut cx).is_pending());
    for d in sent {
        assert!(d.await.unwrap().unwrap().allowed);
    }
    // Both pass, unread, once their batch has gone out (however long that
    // takes), and stay held while their requests live.
    until_slots_held(&store, &policy, &key, 2).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        store.peek(&policy, &key).await.unwrap().used,
        2,
        "both passed, unread"
    );
    drop((a, b));
    until_slots_held(&store, &policy, &key, 0).await;
}

#[tokio::test]
async fn concurrency_checks_given_up_at_random_leave_no_slot_taken() {
    // Redis kept slow, so checks queue, batch and fly while their requests
    // give up at every stage; every pass that is heard is released by its
    // request, every other is given back by the store. None stays taken.
    let server = RedisServer::start();
    let store = std::sync::Arc::new(batching_store(&server.url(), true).await);
    let (policy, key) = (slots("random", 100_000), Key::new("k"));
    warm_up(&store, &policy).await;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let slowing = {
        let (url, stop) = (server.url(), stop.clone());
        std::thread::spawn(move || {
            let mut conn = redis::Client::open(url).unwrap().get_connection().unwrap();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                // DEBUG SLEEP, not CLIENT PAUSE: a pause's end is seen only at
                // Redis's next event or cron tick (up to 100 ms), not 1 ms on.
                let _: () = redis::cmd("DEBUG")
                    .arg("SLEEP")
                    .arg("0.001")
                    .query(&mut conn)
                    .unwrap();
                std::thread::sleep(Duration::from_millis(1));
            }
        })
    };
    // Patience is measured against this machine's own check under the slow
    // Redis, so a loaded CI runner still sees some give up and some pass;
    // every eighth request waits for its answer whatever it takes.
    let typical = typical_check_time(&store, &policy).await;
    let requests: Vec<_> = (0..600u64)
        .map(|i| {
            let (store, policy, key) = (store.clone(), policy.clone(), key.clone());
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_micros(i * 20)).await;
                let patience = if i % 8 == 0 {
                    Duration::from_secs(10)
                } else {
                    typical * (3 + ((i * 7919) % 300) as u32) / 10
                };
                match tokio::time::timeout(patience, store.check(&policy, &key, 1)).await {
                    Ok(Ok(d)) => {
                        assert!(d.allowed);
                        store.refund(&policy, &key, &d.receipt).await.unwrap();
                        false
                    }
                    Ok(Err(err)) => panic!("{err}"),
                    Err(_) => true,
                }
            })
        })
        .collect();
    let mut gave_up = 0;
    for request in requests {
        gave_up += u32::from(request.await.unwrap());
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    slowing.join().unwrap();
    println!("{gave_up} of 600 gave up; a lone check takes {typical:?}");
    assert!(gave_up >= 20, "only {gave_up} of 600 gave up ({typical:?})");
    until_slots_held(&store, &policy, &key, 0).await;
}

/// The median time a lone check takes on `store`, on a key of its own.
async fn typical_check_time(store: &RedisStore, policy: &Policy) -> Duration {
    let key = Key::new("timed");
    let mut times = Vec::new();
    for _ in 0..21 {
        let started = Instant::now();
        let taken = store.check(policy, &key, 1).await.unwrap();
        times.push(started.elapsed());
        store.refund(policy, &key, &taken.receipt).await.unwrap();
    }
    times.sort();
    times[times.len() / 2]
}

#[tokio::test]
async fn a_release_behind_busy_calls_is_queued_and_answered_at_once() {
    let server = RedisServer::start();
    let (store, policy, mut held) = holding(&server, slots("held", 10), 4).await;
    let (slots, other) = (Key::new("k"), Key::new("other"));
    let kept = held.pop().unwrap();
    assert!(
        store.refund_now(&policy, &slots, &kept).is_none(),
        "with a slot free a release is sent by its caller, not queued"
    );
    assert!(store
        .refund_now(&Policy::fixed_window("core", per_minute(5)), &slots, &kept)
        .is_none());

    server.pause_clients(Duration::from_millis(300));
    let sent = take_every_slot(&store, &policy, &other).await;
    for receipt in &held {
        let answered = store.refund_now(&policy, &slots, receipt);
        assert!(
            matches!(answered, Some(Ok(()))),
            "Redis is paused, yet a queued release needs no wait: {answered:?}"
        );
    }
    for d in sent {
        assert!(d.await.unwrap().unwrap().allowed);
    }
    // The queued releases go out in the next call; the kept slot stays.
    until_slots_held(&store, &policy, &slots, 1).await;
}

#[tokio::test]
async fn a_release_queued_after_a_check_goes_out_before_it() {
    // Both wait in one batch; the release only frees room, so it goes first
    // and the check finds the slot free (either order is a valid history of
    // two concurrent calls; this one never rejects for nothing).
    let server = RedisServer::start();
    let (store, policy, mut held) = holding(&server, slots("one", 1), 1).await;
    let (slot, other) = (Key::new("k"), Key::new("other"));
    let held = held.pop().unwrap();
    let unrelated = slots("many", 10);

    server.pause_clients(Duration::from_millis(200));
    let sent = take_every_slot(&store, &unrelated, &other).await;
    let check = {
        let (store, policy, slot) = (store.clone(), policy.clone(), slot.clone());
        tokio::spawn(async move { store.check(&policy, &slot, 1).await })
    };
    tokio::task::yield_now().await;
    let release = {
        let (store, policy) = (store.clone(), policy.clone());
        tokio::spawn(async move { store.refund(&policy, &slot, &held).await })
    };
    for d in sent {
        assert!(d.await.unwrap().unwrap().allowed);
    }
    release.await.unwrap().unwrap();
    let d = check.await.unwrap().unwrap();
    assert!(d.allowed, "the release went first: {d:?}");
}

#[tokio::test]
async fn queued_releases_and_checks_of_a_concurrency_limit_share_one_call() {
    // Three slots held; two releases and three checks queue together. They
    // go out in one script call, the releases first, and decide as they
    // would one by one: two checks take the freed slots, the third waits.
    let server = RedisServer::start();
    let (store, policy, held) = holding(&server, slots("shared", 3), 3).await;
    let (slot, other) = (Key::new("k"), Key::new("other"));
    reset_stats(&server);

    server.pause_clients(Duration::from_millis(300));
    let sent = take_every_slot(&store, &slots("many", 10), &other).await;
    for receipt in &held[..2] {
        let answered = store.refund_now(&policy, &slot, receipt);
        assert!(matches!(answered, Some(Ok(()))), "queued: {answered:?}");
    }
    let checks: Vec<_> = (0..3)
        .map(|_| {
            let (store, policy, slot) = (store.clone(), policy.clone(), slot.clone());
            tokio::spawn(async move { store.check(&policy, &slot, 1).await })
        })
        .collect();
    tokio::task::yield_now().await;
    for d in sent {
        assert!(d.await.unwrap().unwrap().allowed);
    }
    let mut allowed = 0;
    for check in checks {
        let d = check.await.unwrap().unwrap();
        allowed += u32::from(d.allowed);
    }
    assert_eq!(allowed, 2, "the two released slots, and no more");

    let calls = command_calls(&server);
    assert_eq!(calls.get("zrem"), Some(&2), "{calls:?}");
    // The batch script's first call meets NOSCRIPT, loads it and goes again.
    let loads = script_loads(&calls, 0).unwrap_or(0);
    assert_eq!(
        calls.get("evalsha").copied().unwrap_or(0) - loads,
        5,
        "four lone calls, then the releases and checks in one: {calls:?}"
    );
    assert_eq!(calls.get("time"), Some(&5), "{calls:?}");
    until_slots_held(&store, &policy, &slot, 3).await;
}

#[tokio::test]
async fn thousands_of_concurrency_slots_are_taken_and_given_back_alone_or_batched() {
    // More members than one `unpack` may hold, alone and in a batch.
    let server = RedisServer::start();
    let store = std::sync::Arc::new(batching_store(&server.url(), true).await);
    let policy = slots("big", 100_000);
    let key = Key::new("k");
    let alone = store.check(&policy, &key, 9_000).await.unwrap();
    assert!(alone.allowed, "{alone:?}");
    let batched: Vec<_> = (0..8)
        .map(|_| {
            let (store, policy, key) = (store.clone(), policy.clone(), key.clone());
            tokio::spawn(async move { store.check(&policy, &key, 9_000).await })
        })
        .collect();
    let mut receipts = vec![alone.receipt];
    for d in batched {
        let d = d.await.unwrap().unwrap();
        assert!(d.allowed, "{d:?}");
        receipts.push(d.receipt);
    }
    let name = "batch:{big|k}:concurrency:0";
    let members: u64 = server.conn().zcard(name).unwrap();
    assert_eq!(members, 9 * 9_000);
    let releases: Vec<_> = receipts
        .into_iter()
        .map(|receipt| {
            let (store, policy, key) = (store.clone(), policy.clone(), key.clone());
            tokio::spawn(async move { store.refund(&policy, &key, &receipt).await })
        })
        .collect();
    for r in releases {
        r.await.unwrap().unwrap();
    }
    let members: u64 = server.conn().zcard(name).unwrap();
    assert_eq!(members, 0, "every slot given back");
}

#[tokio::test]
async fn concurrency_decisions_at_time_zero_batch_as_alone() {
    // On an app clock at 0 the floor (now - timeout, at least 0) is 0 too:
    // slots started then never count, alone or batched.
    let server = RedisServer::start();
    let policy = slots("zero", 2);
    let mut runs = Vec::new();
    for batching in [false, true] {
        let clock = tollgate::clock::ManualClock::new(0);
        let prefix = format!("zero-{batching}");
        let store =
            std::sync::Arc::new(store_with(&server.url(), &prefix, Some(&clock), batching).await);
        let decisions: Vec<_> = (0..12)
            .map(|_| {
                let store = store.clone();
                let policy = policy.clone();
                tokio::spawn(async move { store.check(&policy, &Key::new("k"), 1).await })
            })
            .collect();
        let mut seen = Vec::new();
        for d in decisions {
            let mut d = d.await.unwrap().unwrap();
            d.receipt = Receipt::default();
            seen.push(d);
        }
        runs.push(seen);
    }
    assert_eq!(runs[0], runs[1]);
    assert!(runs[1].iter().all(|d| d.allowed), "{:?}", runs[1]);
}

#[tokio::test]
async fn batched_concurrency_checks_and_releases_leave_what_lone_ones_do() {
    let server = RedisServer::start();
    let policy = Policy::concurrency(
        "slots",
        NonZeroU32::new(5).unwrap(),
        Duration::from_secs(10),
    )
    .unwrap();
    // Seconds after the start, each round's second half 6 s later: a round
    // 4 s on, when the first's slots are held unless given back, and whose
    // second half finds the first's first half stale (a crashed server's,
    // left out and removed); one 11 s after it; one set back before the
    // last, on a clock that stepped back.
    let rounds = [0, 4, 15, 13];
    let (mut states, mut decisions_seen) = (Vec::new(), Vec::new());
    for batching in [false, true] {
        let prefix = format!("slots-{batching}");
        let clock = tollgate::clock::ManualClock::new(1_800_000_000_000_000);
        let store =
            std::sync::Arc::new(store_with(&server.url(), &prefix, Some(&clock), batching).await);
        store.check(&policy, &Key::new("warm"), 1).await.unwrap();
        reset_stats(&server);
        // Each pass's id, by the order of its decision, so two runs' random
        // ids compare.
        let mut ids = BTreeMap::new();
        let mut seen = Vec::new();
        for secs in rounds {
            clock.set(1_800_000_000_000_000 + secs * 1_000_000);
            let mut decisions = Vec::new();
            for i in 0..24 {
                if i == 12 {
                    // The first half on its way (four alone, the rest
                    // queued), the second half 6 s later: a batch then
                    // holds decisions at two times.
                    tokio::task::yield_now().await;
                    clock.set(1_800_000_000_000_000 + (secs + 6) * 1_000_000);
                }
                decisions.push({
                    let (store, policy) = (store.clone(), policy.clone());
                    let (key, cost) = caller_and_cost(i, 6);
                    tokio::spawn(async move {
                        let d = store.check(&policy, &Key::new(&key), cost).await;
                        (key, d)
                    })
                });
            }
            let mut passed = Vec::new();
            for d in decisions {
                let (key, d) = d.await.unwrap();
                let mut d = d.unwrap();
                if !d.receipt.is_empty() {
                    passed.push((key, d.receipt.clone()));
                }
                // A look's pass carries an id too, though it holds nothing.
                if let Some(&id) = d.receipt.stamps().first() {
                    let pass = seen.len();
                    assert!(ids.insert(id, pass).is_none(), "request id {id} twice");
                    d.receipt = Receipt::new(d.receipt.cost(), vec![pass as u64]);
                }
                seen.push(d);
            }
            // Every other pass gives its slots back, all at once.
            let releases: Vec<_> = passed
                .into_iter()
                .step_by(2)
                .map(|(key, receipt)| {
                    let (store, policy) = (store.clone(), policy.clone());
                    tokio::spawn(
                        async move { store.refund(&policy, &Key::new(key), &receipt).await },
                    )
                })
                .collect();
            for r in releases {
                r.await.unwrap().unwrap();
            }
        }
        let calls = command_calls(&server);
        let scripts = calls.get("evalsha").copied().unwrap_or(0);
        if batching {
            assert!(scripts < 4 * 24, "checks and releases batched: {calls:?}");
        } else {
            assert!(scripts > 4 * 24, "{calls:?}");
        }
        // The warm-up's slot, held, is the one member of no pass seen.
        let warm: Vec<String> = server
            .conn()
            .keys(format!("{prefix}:{{slots|warm}}*"))
            .unwrap();
        let _: () = server.conn().del(warm).unwrap();
        let state = key_states(&server, &prefix, &ids);
        states.push(state);
        decisions_seen.push(seen);
    }
    for (i, (a, b)) in decisions_seen[0].iter().zip(&decisions_seen[1]).enumerate() {
        assert_eq!(a, b, "decision {i}");
    }
    let passes = decisions_seen[1].iter().filter(|d| d.allowed).count();
    let rejections = decisions_seen[1].len() - passes;
    assert!(passes > 30 && rejections > 10, "{passes} passes");
    let (alone, batched) = (&states[0], &states[1]);
    assert_eq!(alone.len(), batched.len(), "{alone:?}\n{batched:?}");
    // The held slots of "k", "new", the four lone callers and the warm-up.
    assert!(alone.len() >= 3, "{alone:?}");
    for (a, b) in alone.iter().zip(batched) {
        assert_eq!((&a.0, &a.1), (&b.0, &b.1));
        assert!(a.2 > 0 && (a.2 - b.2).abs() < 500, "{a:?} {b:?}");
    }
}
