//! Strategies that hold a charge after admission, through the layer: a leaky
//! bucket's request waits its turn (and gives its place back if the client
//! leaves), a concurrency slot is held until the response body ends (and is
//! given back on cancellation, or by the store after its timeout).

mod support;

use std::future::Future;
use std::net::SocketAddr;
use std::num::NonZeroU32;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::connect_info::MockConnectInfo;
use axum::http::{Request, Response, StatusCode};
use axum::routing::get;
use axum::Router;
use futures::FutureExt;
use http_body::Frame;
use http_body_util::BodyExt;
use tokio::sync::{oneshot, Notify};
use tollgate::clock::ManualClock;
use tollgate::{Key, MemoryStore, Policy, Quota, RateLimitLayer, RedisStore, Store};
use tower::ServiceExt;

const T0: u64 = 1_700_000_000_000_000;
const PEER: [u8; 4] = [192, 0, 2, 77];

fn peer_key() -> Key {
    // What `PeerIp` makes of PEER.
    Key::new("ip:192.0.2.77")
}

fn get_root() -> Request<Body> {
    Request::get("/").body(Body::empty()).unwrap()
}

fn header<'a>(res: &'a Response<Body>, name: &str) -> &'a str {
    res.headers()
        .get(name)
        .unwrap_or_else(|| panic!("no {name}"))
        .to_str()
        .unwrap()
}

/// Waits (a bounded number of scheduler turns) until `done` holds: releases
/// run in spawned tasks.
async fn eventually(what: &str, mut done: impl AsyncFnMut() -> bool) {
    for _ in 0..200 {
        if done().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("never happened: {what}");
}

// ---------------------------------------------------------------- leaky bucket

fn leaky(store: &MemoryStore) -> (Router, Policy) {
    // 10 per second (one every 100 ms), at most 3 in the bucket.
    let policy = Policy::leaky_bucket(
        "feeding",
        Quota::per_second(NonZeroU32::new(10).unwrap()),
        NonZeroU32::new(3).unwrap(),
    );
    let layer = RateLimitLayer::builder()
        .policy(policy.clone())
        .store(store.clone())
        .build()
        .unwrap();
    let app = Router::new()
        .route("/", get(|| async { "fed" }))
        .layer(layer)
        .layer(MockConnectInfo(SocketAddr::from((PEER, 1))));
    (app, policy)
}

/// An app behind `policy` on `store` whose handler notes when it starts (on
/// the runtime's clock), and `requests` sent to it at once: the responses,
/// and each handler's start after the first request was sent, sorted, in µs.
async fn handler_starts(
    policy: Policy,
    store: MemoryStore,
    requests: usize,
) -> (Vec<Response<Body>>, Vec<u128>) {
    let started = Arc::new(Mutex::new(Vec::new()));
    let seen = started.clone();
    let layer = RateLimitLayer::builder()
        .policy(policy)
        .store(store)
        .build()
        .unwrap();
    let app = Router::new()
        .route(
            "/",
            get(move || {
                let seen = seen.clone();
                async move {
                    seen.lock().unwrap().push(tokio::time::Instant::now());
                    "fed"
                }
            }),
        )
        .layer(layer)
        .layer(MockConnectInfo(SocketAddr::from((PEER, 1))));
    let t0 = tokio::time::Instant::now();
    let calls: Vec<_> = (0..requests)
        .map(|_| app.clone().oneshot(get_root()))
        .collect();
    let responses = futures_join_all(calls).await;
    let mut offsets: Vec<_> = started
        .lock()
        .unwrap()
        .iter()
        .map(|t| t.duration_since(t0).as_micros())
        .collect();
    offsets.sort();
    (responses, offsets)
}

#[tokio::test(start_paused = true)]
async fn leaky_bucket_requests_wait_their_turn_and_the_overflow_gets_429() {
    let store = MemoryStore::with_clock(ManualClock::new(T0));
    let policy = Policy::leaky_bucket(
        "feeding",
        Quota::per_second(NonZeroU32::new(10).unwrap()),
        NonZeroU32::new(3).unwrap(),
    );
    let (responses, offsets) = handler_starts(policy, store, 4).await;
    let statuses: Vec<_> = responses.iter().map(|r| r.status()).collect();
    assert_eq!(
        statuses,
        [200, 200, 200, 429].map(|s| StatusCode::from_u16(s).unwrap())
    );
    let limited = &responses[3];
    assert_eq!(header(limited, "retry-after"), "1", "100 ms, rounded up");
    assert_eq!(header(limited, "x-ratelimit-remaining"), "0");
    assert_eq!(header(limited, "x-ratelimit-limit"), "3");
    assert_eq!(header(&responses[2], "x-ratelimit-remaining"), "0");
    assert_eq!(header(&responses[0], "x-ratelimit-remaining"), "2");

    // The handlers ran one interval apart, on the runtime's (paused) clock:
    // the waits were sleeps, not blocking.
    assert_eq!(offsets, [0, 100_000, 200_000]);
}

#[tokio::test(start_paused = true)]
async fn a_turn_less_than_a_tenth_of_a_timer_tick_away_is_not_slept() {
    // One every 25 µs, eight in the bucket: the first four turns fall within
    // 0.1 ms and start at once; the other four are slept, each to its turn
    // or later (Tokio's timer ticks once a millisecond).
    let store = MemoryStore::with_clock(ManualClock::new(T0));
    let policy = Policy::leaky_bucket(
        "feeding",
        Quota::per_second(NonZeroU32::new(40_000).unwrap()),
        NonZeroU32::new(8).unwrap(),
    );
    let (responses, offsets) = handler_starts(policy, store, 8).await;
    assert!(responses.iter().all(|r| r.status() == StatusCode::OK));
    assert_eq!(offsets[..4], [0, 0, 0, 0], "{offsets:?}");
    for (offset, turn) in offsets[4..].iter().zip([100, 125, 150, 175]) {
        assert!(*offset >= turn, "{offsets:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn a_client_that_leaves_while_waiting_gives_its_place_back() {
    let clock = ManualClock::new(T0);
    let store = MemoryStore::with_clock(clock.clone());
    let (app, policy) = leaky(&store);

    assert_eq!(app.clone().oneshot(get_root()).await.unwrap().status(), 200);
    // The second request would wait 100 ms; its client gives up after 10.
    let gave_up = tokio::time::timeout(Duration::from_millis(10), app.clone().oneshot(get_root()));
    assert!(gave_up.await.is_err(), "it was still waiting");

    let store = &store;
    let policy = &policy;
    eventually("the place is given back", async || {
        store.peek(policy, &peer_key()).await.unwrap().remaining == 2
    })
    .await;
    // Without the refund the bucket would now hold two places, not one.
    let d = store.peek(policy, &peer_key()).await.unwrap();
    assert_eq!(d.used, 1);
    assert_eq!(d.reset_at_micros, T0 + 100_000);
}

#[tokio::test(start_paused = true)]
async fn in_shadow_mode_the_leaky_bucket_records_the_wait_but_never_serves_it() {
    let store = MemoryStore::with_clock(ManualClock::new(T0));
    let layer = RateLimitLayer::builder()
        .policy(Policy::leaky_bucket(
            "feeding",
            Quota::per_second(NonZeroU32::new(1).unwrap()),
            NonZeroU32::new(3).unwrap(),
        ))
        .store(store)
        .shadow(true)
        .decision_extension(true)
        .build()
        .unwrap();
    let app = Router::new()
        .route(
            "/",
            get(
                |axum::Extension(d): axum::Extension<tollgate::Decision>| async move {
                    d.delay.unwrap_or_default().as_millis().to_string()
                },
            ),
        )
        .layer(layer)
        .layer(MockConnectInfo(SocketAddr::from((PEER, 1))));
    let t0 = tokio::time::Instant::now();
    let mut recorded = Vec::new();
    for _ in 0..3 {
        let res = app.clone().oneshot(get_root()).await.unwrap();
        assert_eq!(res.status(), StatusCode::OK);
        let body = axum::body::to_bytes(res.into_body(), 64).await.unwrap();
        recorded.push(String::from_utf8(body.to_vec()).unwrap());
    }
    assert_eq!(recorded, ["0", "1000", "2000"], "the waits are recorded");
    assert_eq!(t0.elapsed(), Duration::ZERO, "and none was served");
}

// ------------------------------------------------------------ concurrency limit

/// A response body that sends one chunk when its trigger fires, then ends.
struct Gated {
    trigger: Option<oneshot::Receiver<()>>,
}

impl http_body::Body for Gated {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let Some(trigger) = self.trigger.as_mut() else {
            return Poll::Ready(None);
        };
        match Pin::new(trigger).poll(cx) {
            Poll::Ready(_) => {
                self.trigger = None;
                Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(b"fed")))))
            }
            Poll::Pending => Poll::Pending,
        }
    }
}

/// The test's handles on the handlers: body triggers, and a signal when a
/// handler starts.
#[derive(Clone, Default)]
struct Feeders {
    triggers: Arc<Mutex<Vec<oneshot::Sender<()>>>>,
    entered: Arc<Notify>,
}

fn concurrency_app(store: impl Store, feeders: &Feeders, limit: u32) -> (Router, Policy) {
    let policy = Policy::concurrency(
        "keepers",
        NonZeroU32::new(limit).unwrap(),
        Duration::from_secs(60),
    )
    .unwrap();
    let layer = RateLimitLayer::builder()
        .policy(policy.clone())
        .store(store)
        .build()
        .unwrap();
    let stream = feeders.clone();
    let stuck = feeders.clone();
    let app = Router::new()
        .route(
            "/",
            get(move || {
                let f = stream.clone();
                async move {
                    let (tx, rx) = oneshot::channel();
                    f.triggers.lock().unwrap().push(tx);
                    Body::new(Gated { trigger: Some(rx) })
                }
            }),
        )
        .route(
            "/stuck",
            get(move || {
                let f = stuck.clone();
                async move {
                    f.entered.notify_one();
                    std::future::pending::<()>().await;
                    "never"
                }
            }),
        )
        .layer(layer)
        .layer(MockConnectInfo(SocketAddr::from((PEER, 1))));
    (app, policy)
}

#[tokio::test]
async fn a_concurrency_slot_is_held_until_the_body_ends_then_released() {
    let clock = ManualClock::new(T0);
    let store = MemoryStore::with_clock(clock.clone());
    let feeders = Feeders::default();
    let (app, policy) = concurrency_app(store.clone(), &feeders, 2);

    let first = app.clone().oneshot(get_root()).await.unwrap();
    let second = app.clone().oneshot(get_root()).await.unwrap();
    assert_eq!(
        (first.status(), second.status()),
        (StatusCode::OK, StatusCode::OK)
    );
    assert_eq!(header(&second, "x-ratelimit-remaining"), "0");
    assert_eq!(header(&second, "x-ratelimit-used"), "2");
    // Both responses have headers but their bodies are still streaming.
    let third = app.clone().oneshot(get_root()).await.unwrap();
    assert_eq!(third.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&third, "retry-after"), "1");

    // The first body ends: its slot is free again, while the body (as a
    // server would) is still held.
    let trigger = feeders.triggers.lock().unwrap().remove(0);
    trigger.send(()).unwrap();
    let mut body = first.into_body();
    let chunk = body.frame().await.unwrap().unwrap().into_data().unwrap();
    assert_eq!(chunk, "fed");
    assert!(body.frame().await.is_none(), "the body ended");
    let (store_ref, policy_ref) = (&store, &policy);
    eventually("body end releases", async || {
        store_ref
            .peek(policy_ref, &peer_key())
            .await
            .unwrap()
            .remaining
            == 1
    })
    .await;
    drop(body);

    // The second is dropped unread (the client went away mid-download).
    drop(second);
    eventually("a dropped body releases", async || {
        store_ref
            .peek(policy_ref, &peer_key())
            .await
            .unwrap()
            .remaining
            == 2
    })
    .await;
    assert_eq!(
        app.clone().oneshot(get_root()).await.unwrap().status(),
        StatusCode::OK
    );
}

#[tokio::test(flavor = "current_thread")]
async fn an_in_process_store_frees_a_slot_as_the_body_is_dropped_without_a_task() {
    let store = MemoryStore::with_clock(ManualClock::new(T0));
    let feeders = Feeders::default();
    let (app, policy) = concurrency_app(store.clone(), &feeders, 1);
    let response = app.oneshot(get_root()).await.unwrap();
    assert_eq!(header(&response, "x-ratelimit-remaining"), "0");
    drop(response);
    // No await since the drop: on this one thread no task could have run.
    let now = store.peek(&policy, &peer_key()).now_or_never();
    assert_eq!(now.unwrap().unwrap().remaining, 1);
}

#[tokio::test]
async fn a_cancelled_request_releases_its_concurrency_slot() {
    let clock = ManualClock::new(T0);
    let store = MemoryStore::with_clock(clock.clone());
    let feeders = Feeders::default();
    let (app, policy) = concurrency_app(store.clone(), &feeders, 1);

    let entered = feeders.entered.notified();
    let stuck = tokio::spawn(
        app.clone()
            .oneshot(Request::get("/stuck").body(Body::empty()).unwrap()),
    );
    entered.await;
    assert_eq!(store.peek(&policy, &peer_key()).await.unwrap().remaining, 0);
    stuck.abort();
    let (store_ref, policy_ref) = (&store, &policy);
    eventually("cancellation releases", async || {
        store_ref
            .peek(policy_ref, &peer_key())
            .await
            .unwrap()
            .remaining
            == 1
    })
    .await;
}

#[tokio::test]
async fn a_crashed_servers_slots_free_up_after_the_timeout() {
    let clock = ManualClock::new(T0);
    let store = MemoryStore::with_clock(clock.clone());
    let feeders = Feeders::default();
    let (app, policy) = concurrency_app(store.clone(), &feeders, 1);
    // Another app server took the slot and died without releasing it.
    assert!(store.check(&policy, &peer_key(), 1).await.unwrap().allowed);
    assert_eq!(
        app.clone().oneshot(get_root()).await.unwrap().status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    clock.advance(Duration::from_secs(60));
    assert_eq!(
        app.clone().oneshot(get_root()).await.unwrap().status(),
        StatusCode::OK
    );
}

#[tokio::test]
async fn concurrency_slots_are_released_in_redis_too() {
    let conn = redis::Client::open(support::redis::shared_url())
        .unwrap()
        .get_connection_manager()
        .await
        .unwrap();
    let store = RedisStore::from_manager(conn)
        .prefix(support::redis::unique_prefix("release"))
        .build()
        .unwrap();
    let feeders = Feeders::default();
    let (app, policy) = concurrency_app(store.clone(), &feeders, 1);
    let held = app.clone().oneshot(get_root()).await.unwrap();
    assert_eq!(held.status(), StatusCode::OK);
    assert_eq!(
        app.clone().oneshot(get_root()).await.unwrap().status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    drop(held);
    let (store_ref, policy_ref) = (&store, &policy);
    eventually("the slot is released in Redis", async || {
        store_ref
            .peek(policy_ref, &peer_key())
            .await
            .unwrap()
            .remaining
            == 1
    })
    .await;
}

/// Polls all futures together on this task (no `futures` dependency).
async fn futures_join_all<F: Future<Output = Result<Response<Body>, std::convert::Infallible>>>(
    calls: Vec<F>,
) -> Vec<Response<Body>> {
    let handles: Vec<_> = calls.into_iter().map(Box::pin).collect();
    let mut handles: Vec<_> = handles.into_iter().map(Some).collect();
    let mut out: Vec<Option<Response<Body>>> = (0..handles.len()).map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (slot, done) in handles.iter_mut().zip(out.iter_mut()) {
            if let Some(f) = slot {
                match f.as_mut().poll(cx) {
                    Poll::Ready(res) => {
                        *done = Some(res.unwrap());
                        *slot = None;
                    }
                    Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            Poll::Pending
        } else {
            Poll::Ready(())
        }
    })
    .await;
    out.into_iter().map(Option::unwrap).collect()
}

// ------------------------------------------------------------------- in Redis

#[tokio::test]
async fn each_decision_and_each_give_back_is_one_evalsha_and_every_key_expires() {
    let server = support::redis::RedisServer::start();
    let conn = redis::Client::open(server.url())
        .unwrap()
        .get_connection_manager()
        .await
        .unwrap();
    let store = RedisStore::from_manager(conn).build().unwrap();
    let leaky = Policy::leaky_bucket(
        "feeding",
        Quota::per_second(NonZeroU32::new(10).unwrap()),
        NonZeroU32::new(50).unwrap(),
    );
    let slots = Policy::concurrency(
        "keepers",
        NonZeroU32::new(5).unwrap(),
        Duration::from_secs(30),
    )
    .unwrap();
    let key = Key::new("bob");
    // Load each script once (NOSCRIPT, SCRIPT LOAD, retry).
    for policy in [&leaky, &slots] {
        let d = store.check(policy, &key, 1).await.unwrap();
        store.refund(policy, &key, &d.receipt).await.unwrap();
    }
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query(&mut server.conn())
        .unwrap();

    for _ in 0..10 {
        let d = store.check(&leaky, &key, 1).await.unwrap();
        assert!(d.allowed);
        store.refund(&leaky, &key, &d.receipt).await.unwrap();
        let d = store.check(&slots, &key, 1).await.unwrap();
        assert!(d.allowed);
        store.refund(&slots, &key, &d.receipt).await.unwrap();
    }
    assert_eq!(support::redis::evalsha_calls(&server), 40);
    let held = store.check(&leaky, &key, 3).await.unwrap();
    let slot = store.check(&slots, &key, 1).await.unwrap();
    assert!(held.allowed && slot.allowed);

    let mut conn = server.conn();
    let keys: Vec<String> = redis::cmd("KEYS").arg("*").query(&mut conn).unwrap();
    assert_eq!(keys.len(), 2, "{keys:?}");
    for k in keys {
        let ttl: i64 = redis::cmd("PTTL").arg(&k).query(&mut conn).unwrap();
        if k.contains(":leaky_bucket:") {
            // Three places at 100 ms each, plus the one-second grace.
            assert!((1_000..=1_300).contains(&ttl), "{k}: {ttl}");
        } else {
            assert!((29_000..=30_000).contains(&ttl), "{k}: {ttl}");
        }
    }
    let calls: Vec<String> = support::redis::command_calls(&server).into_keys().collect();
    assert!(
        !calls.iter().any(|c| c.starts_with("script")),
        "no reloads: {calls:?}"
    );
}
