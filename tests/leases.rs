//! Issue 34: leased quotas. A hot caller is decided from a slice of its
//! budget that Redis charged first, so no number of servers admits more
//! than the limit; what a lease leaves unspent is what the other servers
//! may under-admit, and what a dead server loses. Time is a `ManualClock`
//! throughout: nothing here waits for a lease to lapse.

mod support;

use std::num::NonZeroU32;
use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum::routing::get;
use axum::Router;
use support::conformance::T0;
use support::redis::{command_calls, shared_url, unique_prefix, RedisServer};
use tollgate::clock::ManualClock;
use tollgate::store::Leases;
use tollgate::{
    FailurePolicy, HeaderKey, Key, KeyExtractor, Override, PenaltyBox, Policy, Quota,
    RateLimitLayer, RedisStore, Store,
};
use tower::ServiceExt;

fn per_minute(n: u32) -> Quota {
    Quota::per_minute(NonZeroU32::new(n).unwrap())
}

/// Leases for a caller decided 4 times on a server.
fn leases() -> Leases {
    Leases::new().hot_after(NonZeroU32::new(4).unwrap())
}

async fn store(url: &str, prefix: &str, clock: &ManualClock, leases: Option<Leases>) -> RedisStore {
    let builder = RedisStore::connect_builder(url)
        .await
        .unwrap()
        .prefix(prefix)
        .clock(clock.clone());
    match leases {
        Some(leases) => builder.leases(leases),
        None => builder,
    }
    .build()
    .unwrap()
}

/// What Redis counts as spent by `key` (leases in hand included), read by a
/// store that holds none.
async fn used_in_redis(reader: &RedisStore, policy: &Policy, key: &Key) -> u64 {
    reader.peek(policy, key).await.unwrap().used
}

/// The key the layer's extractor gives `caller`'s requests.
fn caller(caller: &str) -> Key {
    let (parts, _) = Request::get("/")
        .header("x-api-key", caller)
        .body(())
        .unwrap()
        .into_parts();
    HeaderKey::new("x-api-key").extract(&parts).unwrap()
}

/// A server limiting by `X-Api-Key` on `store`; a decision that misses
/// `deadline` gets `failure`.
fn app(store: RedisStore, policy: &Policy, failure: FailurePolicy, deadline: Duration) -> Router {
    let layer = RateLimitLayer::builder()
        .policy(policy.clone())
        .store(store)
        .key(HeaderKey::new("x-api-key"))
        .on_store_failure(failure)
        .deadline(deadline)
        .build()
        .unwrap();
    Router::new()
        .route("/", get(|| async { "hi" }))
        .route("/unchanged", get(|| async { StatusCode::NOT_MODIFIED }))
        .route_layer(layer)
}

async fn hit(app: &Router, caller: &str) -> StatusCode {
    let req = Request::get("/")
        .header("x-api-key", caller)
        .body(Body::empty())
        .unwrap();
    app.clone().oneshot(req).await.unwrap().status()
}

/// `n` requests of `caller` at once, spread over `apps` in turn: how many
/// passed.
async fn crowd(apps: &[Router], caller: &str, n: usize) -> u64 {
    let calls: Vec<_> = (0..n)
        .map(|i| {
            let app = apps[i % apps.len()].clone();
            let caller = caller.to_owned();
            tokio::spawn(async move { hit(&app, &caller).await })
        })
        .collect();
    let mut passed = 0;
    for call in calls {
        passed += u64::from(call.await.unwrap() == StatusCode::OK);
    }
    passed
}

/// Two servers leasing with `leases` on one Redis, and an app on each.
/// Closed, with a deadline no call misses on a busy machine: every 200 is
/// a decision of the limit, and every lease reached its server.
async fn two_servers(
    url: &str,
    prefix: &str,
    clock: &ManualClock,
    policy: &Policy,
    leases: Leases,
) -> ([RedisStore; 2], Vec<Router>) {
    let servers = [
        store(url, prefix, clock, Some(leases.clone())).await,
        store(url, prefix, clock, Some(leases)).await,
    ];
    let closed = FailurePolicy::closed(Duration::from_secs(1));
    let apps = servers
        .iter()
        .map(|s| app(s.clone(), policy, closed.clone(), Duration::from_secs(10)))
        .collect();
    (servers, apps)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_servers_on_one_redis_admit_at_most_the_limit() {
    let redis = RedisServer::start();
    let (prefix, clock) = (unique_prefix("lease-two"), ManualClock::new(T0));
    let policy = Policy::fixed_window("core", per_minute(50));
    let url = redis.url();
    let (servers, apps) = two_servers(&url, &prefix, &clock, &policy, leases()).await;

    let admitted = crowd(&apps, "hot", 200).await;
    assert!(admitted <= 50, "admitted {admitted} of a limit of 50");
    let calls = evalsha_calls(&redis);

    // Every unit Redis charged was admitted or sits unspent in a lease.
    let reader = store(&url, &prefix, &clock, None).await;
    let charged = used_in_redis(&reader, &policy, &caller("hot")).await;
    let unspent = servers[0].return_leases().await + servers[1].return_leases().await;
    assert_eq!(charged, admitted + unspent);
    assert_eq!(
        used_in_redis(&reader, &policy, &caller("hot")).await,
        admitted
    );
    // The bound: under-admission at most the leases unspent at the end.
    let under = 50 - admitted;
    assert!(
        under <= unspent,
        "under-admitted {under}, leases held {unspent}"
    );
    eprintln!("two servers, 200 requests, limit 50: admitted {admitted}, under-admitted {under}, unspent leases given back {unspent}, {calls} script calls");

    // What went back is admitted now, and nothing more.
    let mut again = 0;
    for _ in 0..60 {
        again += u64::from(hit(&apps[0], "hot").await == StatusCode::OK);
    }
    assert_eq!(admitted + again, 50);
}

/// Issue 47: with the default leases, a crowd's busy callers lease, not
/// just its busiest, and at a low limit two servers together still admit
/// no caller more than its limit, each leased unit charged in Redis first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_servers_with_default_leases_hold_every_callers_limit_in_a_crowd() {
    let redis = RedisServer::start();
    let (prefix, clock) = (unique_prefix("lease-crowd"), ManualClock::new(T0));
    let policy = Policy::fixed_window("core", per_minute(40));
    let url = redis.url();
    let (servers, apps) = two_servers(&url, &prefix, &clock, &policy, Leases::new()).await;
    // A Zipf crowd in small: caller i asks 120 / i times (the first three
    // reach the limit), the requests of all of them interleaved and sent
    // to the two servers in turn.
    let asks: Vec<usize> = (1..=30).map(|i| 120 / i).collect();
    let mut order = Vec::new();
    for round in 0..asks[0] {
        order.extend((0..asks.len()).filter(|&i| round < asks[i]));
    }
    let calls_before = evalsha_calls(&redis);
    let mut admitted = vec![0u64; asks.len()];
    for (n, &i) in order.iter().enumerate() {
        let name = format!("caller-{i}");
        admitted[i] += u64::from(hit(&apps[n % 2], &name).await == StatusCode::OK);
    }
    let calls = evalsha_calls(&redis) - calls_before;
    for (i, &passed) in admitted.iter().enumerate() {
        assert!(
            passed <= 40,
            "caller-{i} admitted {passed} of a limit of 40"
        );
    }
    // Sent one at a time, each request would cost a script call without
    // leases: they saved at least a quarter (each caller's first few, and
    // its rejections, go to Redis), and callers well down the crowd held
    // leases (given back below).
    assert!(
        calls < order.len() as u64 * 3 / 4,
        "{calls} script calls for {} requests",
        order.len()
    );
    let reader = store(&url, &prefix, &clock, None).await;
    let mut leased_callers = 0;
    for (i, &passed) in admitted.iter().enumerate() {
        let key = caller(&format!("caller-{i}"));
        let charged = used_in_redis(&reader, &policy, &key).await;
        assert!(
            charged >= passed,
            "caller-{i}: {charged} charged, {passed} admitted"
        );
        leased_callers += u64::from(charged > passed);
    }
    assert!(leased_callers >= 3, "{leased_callers} callers held leases");
    servers[0].return_leases().await;
    servers[1].return_leases().await;
    // Given back, Redis counts exactly what was admitted.
    for (i, &passed) in admitted.iter().enumerate() {
        let key = caller(&format!("caller-{i}"));
        assert_eq!(
            used_in_redis(&reader, &policy, &key).await,
            passed,
            "caller-{i}"
        );
    }
}

/// A crowd's leases ride in batches with its other decisions (the fixed
/// window's batch twin takes them): 64 callers each taking a lease at once
/// cost far fewer script calls than one a lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crowds_lease_requests_go_out_in_batches() {
    let redis = RedisServer::start();
    let (prefix, clock) = (unique_prefix("lease-batched"), ManualClock::new(T0));
    let policy = Policy::fixed_window("core", per_minute(1_000));
    let url = redis.url();
    let server = store(&url, &prefix, &clock, Some(Leases::new())).await;
    let closed = FailurePolicy::closed(Duration::from_secs(1));
    let app = app(server.clone(), &policy, closed, Duration::from_secs(10));
    let calls_before = evalsha_calls(&redis);
    // Each caller is decided 6 times: its fourth decision takes a lease of
    // four, two of which it spends.
    let requests: Vec<_> = (0..6)
        .flat_map(|_| 0..64)
        .map(|i| {
            let app = app.clone();
            tokio::spawn(async move { hit(&app, &format!("caller-{i}")).await })
        })
        .collect();
    for request in requests {
        assert_eq!(request.await.unwrap(), StatusCode::OK);
    }
    let calls = evalsha_calls(&redis) - calls_before;
    let reader = store(&url, &prefix, &clock, None).await;
    let mut leased = 0;
    for i in 0..64 {
        let charged = used_in_redis(&reader, &policy, &caller(&format!("caller-{i}"))).await;
        leased += u64::from(charged > 6);
    }
    assert!(leased >= 32, "{leased} of 64 callers took a lease");
    assert!(
        calls < leased,
        "{calls} script calls for {leased} leases and more decisions"
    );
}

/// Scripts Redis ran (`EVALSHA`) since it started.
fn evalsha_calls(redis: &RedisServer) -> u64 {
    command_calls(redis).get("evalsha").copied().unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hot_caller_costs_a_few_calls_not_one_a_request() {
    let redis = RedisServer::start();
    let (prefix, clock) = (unique_prefix("lease-calls"), ManualClock::new(T0));
    let policy = Policy::fixed_window("core", per_minute(100_000));
    let server = store(&redis.url(), &prefix, &clock, Some(leases())).await;
    let bob = Key::new("bob");
    for _ in 0..2_000 {
        let decided = match server.check_now(&policy, &bob, 1) {
            Some(decision) => decision,
            None => server.check(&policy, &bob, 1).await,
        };
        assert!(decided.unwrap().allowed);
    }
    // Three alone, then leases that double with the caller's count (4, 8,
    // ... 1,000 units): about a dozen calls for 2,000 decisions.
    let calls = evalsha_calls(&redis);
    assert!(calls <= 16, "{calls} script calls for 2,000 decisions");
}

/// A lease asks for what the caller would spend in a span; with half a
/// span left of its window, for half of that (the rest would be lost with
/// the window, and withheld from the other servers until then).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_near_its_windows_end_asks_for_what_the_time_left_spends() {
    let (prefix, clock) = (unique_prefix("lease-end"), ManualClock::new(T0));
    let policy = Policy::fixed_window("core", per_minute(1_000));
    let url = shared_url();
    let server = store(&url, &prefix, &clock, Some(leases())).await;
    let reader = store(&url, &prefix, &clock, None).await;
    let (early, late) = (Key::new("early"), Key::new("late"));
    // Each window opens with its caller's first request.
    server.check(&policy, &late, 1).await.unwrap();
    // Four decisions in a span: the fourth takes a lease of four.
    for _ in 0..4 {
        server.check(&policy, &early, 1).await.unwrap();
    }
    assert_eq!(used_in_redis(&reader, &policy, &early).await, 4 + 4);
    // The same four with half a second of `late`'s window left: two.
    clock.advance(Duration::from_millis(59_500));
    for _ in 0..4 {
        server.check(&policy, &late, 1).await.unwrap();
    }
    assert_eq!(used_in_redis(&reader, &policy, &late).await, 1 + 4 + 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_serves_a_hot_caller_without_redis_and_its_headers_add_up() {
    let (prefix, clock) = (unique_prefix("lease-one"), ManualClock::new(T0));
    let policy = Policy::fixed_window("core", per_minute(100));
    let url = shared_url();
    let server = store(&url, &prefix, &clock, Some(leases())).await;
    let reader = store(&url, &prefix, &clock, None).await;
    let bob = Key::new("bob");

    // Three decisions in Redis alone; the fourth makes bob hot and takes a
    // lease of what he used (4 units), at most half of what is left.
    for used in 1..=3 {
        let d = server.check(&policy, &bob, 1).await.unwrap();
        assert_eq!((d.allowed, d.remaining), (true, 100 - used));
        assert_eq!(used_in_redis(&reader, &policy, &bob).await, used);
    }
    let d = server.check(&policy, &bob, 1).await.unwrap();
    assert_eq!(used_in_redis(&reader, &policy, &bob).await, 4 + 4);
    // Remaining: what Redis had left at the lease (92) plus the unspent
    // lease (4): what a memory store would say.
    assert_eq!((d.allowed, d.remaining, d.used), (true, 96, 4));

    // Spent in memory, with no call: Redis's count does not move.
    for left in (92..96).rev() {
        let d = server.check_now(&policy, &bob, 1).unwrap().unwrap();
        assert_eq!(d.remaining, left);
        assert_eq!(d.reset_at_micros, T0 + 60_000_000, "Reset from Redis");
    }
    assert!(server.check_now(&policy, &bob, 1).is_none(), "spent");
    assert_eq!(used_in_redis(&reader, &policy, &bob).await, 8);
    // A peek counts the lease in hand as remaining.
    assert_eq!(server.peek(&policy, &bob).await.unwrap().remaining, 92);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refund_goes_back_into_the_lease_and_a_reset_drops_it() {
    let (prefix, clock) = (unique_prefix("lease-refund"), ManualClock::new(T0));
    let policy = Policy::fixed_window("core", per_minute(100));
    let url = shared_url();
    let server = store(&url, &prefix, &clock, Some(leases())).await;
    let reader = store(&url, &prefix, &clock, None).await;
    let bob = Key::new("bob");
    for _ in 0..4 {
        server.check(&policy, &bob, 1).await.unwrap();
    }
    let spent = server.check(&policy, &bob, 1).await.unwrap();
    assert_eq!(spent.remaining, 95);
    // A 304's refund of a leased unit: back in the lease, at once, with no
    // call; Redis still counts it, as part of the lease.
    assert!(matches!(
        server.refund_now(&policy, &bob, &spent.receipt),
        Some(Ok(()))
    ));
    assert_eq!(used_in_redis(&reader, &policy, &bob).await, 8);
    assert_eq!(server.check(&policy, &bob, 1).await.unwrap().remaining, 95);

    // A reset through this server drops its lease: nothing is decided
    // from it, and Redis starts from nothing.
    server.reset(&policy, &bob).await.unwrap();
    assert!(server.check_now(&policy, &bob, 1).is_none());
    assert_eq!(used_in_redis(&reader, &policy, &bob).await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_304_through_the_layer_is_refunded_into_the_lease_and_costs_nothing() {
    let (prefix, clock) = (unique_prefix("lease-304"), ManualClock::new(T0));
    let policy = Policy::fixed_window("core", per_minute(100));
    let url = shared_url();
    let server = store(&url, &prefix, &clock, Some(leases())).await;
    let reader = store(&url, &prefix, &clock, None).await;
    let app = app(
        server.clone(),
        &policy,
        FailurePolicy::Open,
        Duration::from_secs(10),
    );
    for _ in 0..4 {
        assert_eq!(hit(&app, "bob").await, StatusCode::OK);
    }
    let bob = caller("bob");
    assert_eq!(
        used_in_redis(&reader, &policy, &bob).await,
        8,
        "4 and a lease of 4"
    );
    let req = Request::get("/unchanged")
        .header("x-api-key", "bob")
        .body(Body::empty())
        .unwrap();
    let res = app.clone().oneshot(req).await.unwrap();
    assert_eq!(res.status(), StatusCode::NOT_MODIFIED);
    // Spent from the lease and given back to it: Remaining as before.
    assert_eq!(res.headers()["x-ratelimit-remaining"], "96");
    assert_eq!(server.peek(&policy, &bob).await.unwrap().remaining, 96);
    assert_eq!(server.return_leases().await, 4);
    assert_eq!(used_in_redis(&reader, &policy, &bob).await, 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_killed_holding_a_lease_loses_at_most_that_lease_until_its_window_ends() {
    let (prefix, clock) = (unique_prefix("lease-dead"), ManualClock::new(T0));
    let policy = Policy::fixed_window("core", per_minute(50));
    let url = shared_url();
    let reader = store(&url, &prefix, &clock, None).await;
    let bob = Key::new("bob");
    let dying = store(&url, &prefix, &clock, Some(leases())).await;
    let mut admitted_by_dying = 0;
    for _ in 0..6 {
        admitted_by_dying += u64::from(dying.check(&policy, &bob, 1).await.unwrap().allowed);
    }
    let charged = used_in_redis(&reader, &policy, &bob).await;
    let lease = charged - admitted_by_dying;
    assert!(lease > 0, "the dying server holds a lease");
    drop(dying); // killed: nothing given back

    let survivor = store(&url, &prefix, &clock, Some(leases())).await;
    let mut admitted = 0;
    for _ in 0..60 {
        admitted += u64::from(survivor.check(&policy, &bob, 1).await.unwrap().allowed);
    }
    assert_eq!(
        admitted_by_dying + admitted,
        50 - lease,
        "lost exactly the lease"
    );
    assert!(
        lease <= 25,
        "a lease is never more than half of what is left"
    );

    // The window ends, and the lost lease with it.
    clock.advance(Duration::from_secs(60));
    let mut next_window = 0;
    for _ in 0..60 {
        next_window += u64::from(survivor.check(&policy, &bob, 1).await.unwrap().allowed);
    }
    assert_eq!(next_window, 50);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_admission_is_at_most_what_other_servers_hold_unspent() {
    let (prefix, clock) = (unique_prefix("lease-under"), ManualClock::new(T0));
    let policy = Policy::fixed_window("core", per_minute(50));
    let url = shared_url();
    let reader = store(&url, &prefix, &clock, None).await;
    let bob = Key::new("bob");
    let (a, b) = (
        store(&url, &prefix, &clock, Some(leases())).await,
        store(&url, &prefix, &clock, Some(leases())).await,
    );
    let mut by_a = 0;
    for _ in 0..4 {
        by_a += u64::from(a.check(&policy, &bob, 1).await.unwrap().allowed);
    }
    let held_by_a = used_in_redis(&reader, &policy, &bob).await - by_a;
    assert!(held_by_a > 0);

    // B is refused once Redis is spent, while A still holds its lease.
    let mut by_b = 0;
    for _ in 0..100 {
        by_b += u64::from(b.check(&policy, &bob, 1).await.unwrap().allowed);
    }
    assert_eq!(by_a + by_b, 50 - held_by_a, "under-admitted by A's lease");
    // A spends it: nothing was lost.
    for _ in 0..100 {
        by_a += u64::from(a.check(&policy, &bob, 1).await.unwrap().allowed);
    }
    assert_eq!(by_a + by_b, 50);
}

/// One decision from `server`: from its lease in hand, else from Redis.
async fn decide(server: &RedisStore, policy: &Policy, key: &Key) -> tollgate::Decision {
    match server.check_now(policy, key, 1) {
        Some(decision) => decision.unwrap(),
        None => server.check(policy, key, 1).await.unwrap(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_is_granted_against_the_callers_override() {
    let (prefix, clock) = (unique_prefix("lease-override"), ManualClock::new(T0));
    let policy = Policy::fixed_window("core", per_minute(100)).overridable();
    let url = shared_url();
    let servers = [
        store(&url, &prefix, &clock, Some(leases())).await,
        store(&url, &prefix, &clock, Some(leases())).await,
    ];
    let bob = Key::new("bob");
    servers[0]
        .set_override(&policy, &bob, &Override::new(per_minute(20)))
        .await
        .unwrap();
    let mut admitted = 0;
    for i in 0..80 {
        let d = decide(&servers[i % 2], &policy, &bob).await;
        assert_eq!(d.limit, 20, "the override's limit, leased or not");
        admitted += u64::from(d.allowed);
    }
    assert_eq!(admitted, 20);

    // Clearing it through a server ends that server's lease first; the
    // next window is judged by the policy's own limit.
    servers[0].clear_override(&policy, &bob).await.unwrap();
    clock.advance(Duration::from_secs(60));
    let mut admitted = 0;
    for i in 0..150 {
        admitted += u64::from(decide(&servers[i % 2], &policy, &bob).await.allowed);
    }
    assert_eq!(admitted, 100);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_block_through_a_server_gives_its_lease_back_and_refuses_the_caller() {
    let (prefix, clock) = (unique_prefix("lease-block"), ManualClock::new(T0));
    let minute = Duration::from_secs(60);
    let penalty = PenaltyBox::new(NonZeroU32::new(3).unwrap(), minute, minute).unwrap();
    // The same counters without the box: a blocked caller's peek shows
    // its whole quota withheld, not what Redis counts.
    let counters = Policy::fixed_window("core", per_minute(100));
    let policy = counters.clone().with_penalty_box(penalty);
    let url = shared_url();
    let server = store(&url, &prefix, &clock, Some(leases())).await;
    let reader = store(&url, &prefix, &clock, None).await;
    let bob = Key::new("bob");
    for _ in 0..4 {
        assert!(decide(&server, &policy, &bob).await.allowed);
    }
    assert_eq!(
        used_in_redis(&reader, &counters, &bob).await,
        8,
        "4 and a lease of 4"
    );
    server.block(&policy, &bob, minute).await.unwrap();
    assert_eq!(
        used_in_redis(&reader, &counters, &bob).await,
        4,
        "the lease went back"
    );
    let refused = decide(&server, &policy, &bob).await;
    assert!(!refused.allowed && refused.blocked);
    assert_eq!(refused.reset_at_micros, T0 + 60_000_000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_in_hand_keeps_deciding_while_redis_is_paused_then_the_failure_policy_applies() {
    let server = RedisServer::start();
    let (prefix, clock) = (unique_prefix("lease-pause"), ManualClock::new(T0));
    let policy = Policy::fixed_window("core", per_minute(1_000));
    let leasing = store(&server.url(), &prefix, &clock, Some(leases())).await;
    let reader = store(&server.url(), &prefix, &clock, None).await;
    let app = app(
        leasing.clone(),
        &policy,
        FailurePolicy::closed(Duration::from_secs(1)),
        Duration::from_millis(100),
    );
    let bob = caller("bob");
    for _ in 0..4 {
        assert_eq!(hit(&app, "bob").await, StatusCode::OK);
    }
    let lease = used_in_redis(&reader, &policy, &bob).await - 4;
    assert!(lease > 0);

    server.pause_clients(Duration::from_millis(1_500));
    for i in 0..lease {
        assert_eq!(hit(&app, "bob").await, StatusCode::OK, "leased unit {i}");
    }
    // Spent: the next decision needs Redis, misses the deadline, and the
    // failure policy (closed) answers.
    assert_eq!(hit(&app, "bob").await, StatusCode::SERVICE_UNAVAILABLE);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gcra_lease_decays_as_the_bucket_refills() {
    let (prefix, clock) = (unique_prefix("lease-gcra"), ManualClock::new(T0));
    // One unit every 10 ms, a bucket of 100.
    let policy = Policy::gcra(
        "gcra",
        Quota::per_second(NonZeroU32::new(100).unwrap()),
        NonZeroU32::new(100).unwrap(),
    );
    let url = shared_url();
    let server = store(&url, &prefix, &clock, Some(leases())).await;
    let bob = Key::new("bob");
    for _ in 0..4 {
        assert!(server.check(&policy, &bob, 1).await.unwrap().allowed);
    }
    // The fourth took a lease of 4: spendable now, gone 4 emission
    // intervals later (the bucket refilled them meanwhile).
    assert!(server.check_now(&policy, &bob, 1).is_some());
    clock.advance(Duration::from_millis(30));
    assert!(server.check_now(&policy, &bob, 1).is_none(), "decayed");
}

/// Issue 39: one server, a lease in hand, limit 100, a route whose cost is
/// settled from the response. `Remaining` went 80, 50 (settled to 30), then
/// 78 and 77 while Redis held 52 of 100. Now the lease settles what it can
/// (an overspend is spent from it first, the rest charged in Redis and
/// counted), and every response shows what the memory store shows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_settle_through_a_lease_shows_what_the_memory_store_shows() {
    let policy = Policy::fixed_window("llm", per_minute(100));
    let clock = ManualClock::new(T0);
    let prefix = unique_prefix("lease-settle");
    let leasing = store(&shared_url(), &prefix, &clock, Some(leases())).await;
    let memory = tollgate::MemoryStore::with_clock(clock.clone());
    let mut seen = Vec::new();
    for on_redis in [false, true] {
        let builder = RateLimitLayer::builder()
            .policy(policy.clone())
            .key(HeaderKey::new("x-api-key"));
        let layer = match on_redis {
            true => builder.store(leasing.clone()),
            false => builder.store(memory.clone()),
        };
        let app = Router::new()
            .route(
                "/llm",
                get(
                    |axum::extract::RawQuery(q): axum::extract::RawQuery| async move {
                        let used = q
                            .and_then(|q| q.strip_prefix("used=")?.parse().ok())
                            .unwrap_or(1);
                        (axum::Extension(tollgate::ActualCost(used)), "done")
                    },
                ),
            )
            .layer(layer.build().unwrap());
        let mut remaining = Vec::new();
        for used in [1; 20].into_iter().chain([30, 1, 1, 0, 5, 1]) {
            let req = Request::get(format!("/llm?used={used}"))
                .header("x-api-key", "acme")
                .body(Body::empty())
                .unwrap();
            let res = app.clone().oneshot(req).await.unwrap();
            assert_eq!(res.status(), StatusCode::OK);
            remaining.push(
                res.headers()["x-ratelimit-remaining"]
                    .to_str()
                    .unwrap()
                    .to_owned(),
            );
        }
        seen.push(remaining);
    }
    assert_eq!(seen[0][19..22], ["80", "50", "49"], "memory");
    assert_eq!(seen[1], seen[0], "the leasing server, then memory");
    assert_eq!(seen[1].last().map(String::as_str), Some("42"), "58 spent");
    let reader = store(&shared_url(), &prefix, &clock, None).await;
    let in_redis = used_in_redis(&reader, &policy, &caller("acme")).await;
    assert!(
        (58..=100).contains(&in_redis),
        "Redis counts what was spent and what is leased: {in_redis}"
    );
}

/// Issue 40: the lease path decoded its reply apart from the decision
/// path and never counted a block it started. Every script reply now goes
/// through one reader and one post-step, so a penalty-box block started by
/// a lease request is counted in `tollgate_blocks_total`.
#[cfg(feature = "metrics")]
#[tokio::test]
async fn a_block_started_by_a_lease_request_is_counted() {
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};

    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    // One thread: every call below records here.
    let _local = metrics::set_default_local_recorder(&recorder);
    let clock = ManualClock::new(T0);
    let one = NonZeroU32::new(1).unwrap();
    let minute = Duration::from_secs(60);
    let policy = Policy::fixed_window("login", per_minute(2))
        .with_penalty_box(PenaltyBox::new(one, minute, minute).unwrap());
    let eager = Leases::new().hot_after(one);
    let server = store(
        &shared_url(),
        &unique_prefix("lease-block-metric"),
        &clock,
        Some(eager),
    )
    .await;
    let bob = Key::new("bob");
    // The first asks for a lease (hot at once) and gets none: the caller
    // has no room to spare; the second goes to Redis alone.
    assert!(decide(&server, &policy, &bob).await.allowed);
    assert!(decide(&server, &policy, &bob).await.allowed);
    // A span later the next asks for a lease again: refused, the strike
    // that starts a block, decided by the lease script.
    clock.advance(Duration::from_millis(250));
    let refused = decide(&server, &policy, &bob).await;
    assert!(refused.blocked, "{refused:?}");
    let blocks: Vec<_> = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .filter(|(key, ..)| key.key().name() == tollgate::metrics::BLOCKS)
        .map(|(key, _, _, value)| {
            let labels = key
                .key()
                .labels()
                .map(|l| format!("{}={}", l.key(), l.value()));
            (labels.collect::<Vec<_>>(), value)
        })
        .collect();
    assert_eq!(
        blocks,
        vec![(
            vec!["policy=login".to_owned(), "by=strikes".to_owned()],
            DebugValue::Counter(1)
        )]
    );
}

/// Issue 41: a lease granted under a policy's old quotas is not spent by a
/// request judged by a runtime limit set since: it ends, its unspent units
/// go back, and Redis judges the request by the new limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_granted_under_an_older_quota_ends_when_the_policy_limit_changes() {
    let clock = ManualClock::new(T0);
    let prefix = unique_prefix("lease-policy-limit");
    let server = store(&shared_url(), &prefix, &clock, Some(leases())).await;
    let reader = store(&shared_url(), &prefix, &clock, None).await;
    let policy = Policy::fixed_window("core", per_minute(100)).adjustable();
    let bob = Key::new("bob");
    for _ in 0..4 {
        assert!(decide(&server, &policy, &bob).await.allowed);
    }
    assert_eq!(
        used_in_redis(&reader, &policy, &bob).await,
        8,
        "4 and a lease of 4"
    );
    let limit = Override::new(per_minute(10));
    server
        .set_policy_limit(&policy, tollgate::PolicyLimit::Limit, Some(&limit))
        .await
        .unwrap();
    let judged = server.policy_in_force(&policy).unwrap();
    let d = decide(&server, &judged, &bob).await;
    assert_eq!(
        (d.allowed, d.limit, d.remaining),
        (true, 10, 5),
        "judged by 10 in Redis"
    );
    // The old lease's 4 went back; 5 are spent, and a new lease granted
    // under the new limit holds at most half of the 5 left.
    let in_redis = used_in_redis(&reader, &policy, &bob).await;
    assert!(
        (5..=7).contains(&in_redis),
        "the old lease went back: {in_redis}"
    );
}
