//! The leaky bucket as a work queue: the same admission from the memory,
//! Stream and List queues; a processor that drains, acknowledges, deletes
//! and reclaims a crashed worker's entries; keys with expiries; the layer.

mod support;

use std::net::SocketAddr;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::connect_info::MockConnectInfo;
use axum::http::{Request, StatusCode};
use axum::routing::post;
use axum::{Extension, Router};
use redis::aio::ConnectionManager;
use support::redis::{shared_url, unique_prefix};
use tollgate::clock::ManualClock;
use tollgate::queue::{
    Enqueued, Job, ListQueue, MemoryQueue, QueueLayer, QueueSpec, StreamProcessor, StreamQueue,
    WorkQueue,
};
use tollgate::Quota;
use tower::ServiceExt;

const T0: u64 = 1_700_000_000_000_000;

fn spec(prefix: &str, capacity: u32) -> QueueSpec {
    QueueSpec::new("feeding", NonZeroU32::new(capacity).unwrap())
        .unwrap()
        .prefix(prefix)
        .unwrap()
}

async fn manager() -> ConnectionManager {
    redis::Client::open(shared_url())
        .unwrap()
        .get_connection_manager()
        .await
        .unwrap()
}

fn redis_conn() -> redis::Connection {
    redis::Client::open(shared_url())
        .unwrap()
        .get_connection()
        .unwrap()
}

/// One queue under test and how to take `n` entries out of it.
enum Backend {
    Memory(MemoryQueue),
    Stream(StreamQueue, Box<StreamProcessor>),
    List(ListQueue),
}

impl Backend {
    fn queue(&self) -> &dyn WorkQueue {
        match self {
            Backend::Memory(q) => q,
            Backend::Stream(q, _) => q,
            Backend::List(q) => q,
        }
    }

    /// Takes `n` entries out and finishes them.
    async fn take(&mut self, n: usize) -> Vec<String> {
        match self {
            Backend::Memory(q) => q.pop(n).into_iter().map(|e| e.id).collect(),
            Backend::List(q) => q.pop(n).await.unwrap().into_iter().map(|e| e.id).collect(),
            Backend::Stream(_, p) => {
                let mut ids = Vec::new();
                while ids.len() < n {
                    let batch = p.next_batch().await.unwrap();
                    assert!(!batch.is_empty(), "entries expected");
                    ids.extend(batch.into_iter().map(|e| e.id));
                }
                p.finish(&ids).await.unwrap();
                ids
            }
        }
    }
}

async fn backends(tag: &str, capacity: u32) -> Vec<(&'static str, Backend)> {
    let clock = ManualClock::new(T0);
    let stream_spec = spec(&unique_prefix(tag), capacity);
    let processor = StreamProcessor::builder(&stream_spec, "keepers", "k1")
        .unwrap()
        .batch(1)
        .block(Duration::from_millis(10))
        .connect(&redis::Client::open(shared_url()).unwrap())
        .await
        .unwrap();
    vec![
        (
            "memory",
            Backend::Memory(MemoryQueue::with_clock(spec("m", capacity), clock.clone())),
        ),
        (
            "stream",
            Backend::Stream(
                StreamQueue::new(manager().await, stream_spec).clock(clock.clone()),
                Box::new(processor),
            ),
        ),
        (
            "list",
            Backend::List(
                ListQueue::new(manager().await, spec(&unique_prefix(tag), capacity))
                    .clock(clock.clone()),
            ),
        ),
    ]
}

#[tokio::test]
async fn every_queue_admits_up_to_its_capacity_and_again_once_drained() {
    for (name, mut backend) in backends("bound", 3).await {
        let job = Job::new().field("zone", "big cats");
        for expected_len in 1..=3 {
            let p = backend.queue().push(&job).await.unwrap();
            assert!(p.accepted(), "{name}: push {expected_len}");
            assert_eq!(
                (p.len, p.remaining(), p.now_micros),
                (expected_len, 3 - expected_len, T0),
                "{name}"
            );
        }
        let full = backend.queue().push(&job).await.unwrap();
        assert!(!full.accepted(), "{name}: full");
        assert_eq!(
            (full.id.clone(), full.len, full.remaining()),
            (None, 3, 0),
            "{name}"
        );
        // A finished entry leaves the queue: one more fits, not two.
        assert_eq!(backend.take(1).await.len(), 1, "{name}");
        assert!(
            backend.queue().push(&job).await.unwrap().accepted(),
            "{name}"
        );
        assert!(
            !backend.queue().push(&job).await.unwrap().accepted(),
            "{name}"
        );
    }
}

#[tokio::test]
async fn entries_come_out_first_in_first_out_with_their_fields() {
    for (name, mut backend) in backends("fifo", 10).await {
        let mut pushed = Vec::new();
        for zone in ["lions", "tigers", "bears"] {
            let job = Job::new().field("zone", zone).field("body", vec![0u8, 255]);
            pushed.push(backend.queue().push(&job).await.unwrap().id.unwrap());
        }
        assert_eq!(backend.take(3).await, pushed, "{name}");
    }
}

#[tokio::test]
async fn concurrent_pushes_from_two_app_servers_never_pass_the_capacity() {
    let stream_spec = spec(&unique_prefix("race"), 20);
    let list_spec = spec(&unique_prefix("race"), 20);
    let queues: Vec<Arc<dyn WorkQueue>> = vec![
        Arc::new(StreamQueue::new(manager().await, stream_spec.clone())),
        Arc::new(StreamQueue::new(manager().await, stream_spec)),
        Arc::new(ListQueue::new(manager().await, list_spec.clone())),
        Arc::new(ListQueue::new(manager().await, list_spec)),
    ];
    for pair in queues.chunks(2) {
        let tasks: Vec<_> = (0..80)
            .map(|i| {
                let q = pair[i % 2].clone();
                tokio::spawn(async move { q.push(&Job::new()).await.unwrap().accepted() })
            })
            .collect();
        let mut accepted = 0;
        for t in tasks {
            accepted += usize::from(t.await.unwrap());
        }
        assert_eq!(accepted, 20, "{:?}", pair[0]);
    }
}

#[tokio::test]
async fn queue_keys_always_have_an_expiry() {
    let stream_spec = spec(&unique_prefix("ttl"), 5)
        .ttl(Duration::from_secs(600))
        .unwrap();
    let list_spec = spec(&unique_prefix("ttl"), 5)
        .ttl(Duration::from_secs(600))
        .unwrap();
    // The processor starts first: MKSTREAM creates the stream, and the group
    // script gives it the queue's expiry.
    let mut processor = StreamProcessor::builder(&stream_spec, "keepers", "k1")
        .unwrap()
        .block(Duration::from_millis(10))
        .connect(&redis::Client::open(shared_url()).unwrap())
        .await
        .unwrap();
    let mut conn = redis_conn();
    let pttl = |conn: &mut redis::Connection, key: &str| -> i64 {
        redis::cmd("PTTL").arg(key).query(conn).unwrap()
    };
    let created = pttl(&mut conn, &stream_spec.stream_key());
    assert!(created > 590_000 && created <= 600_000, "{created}");

    StreamQueue::new(manager().await, stream_spec.clone())
        .push(&Job::new())
        .await
        .unwrap();
    ListQueue::new(manager().await, list_spec.clone())
        .push(&Job::new())
        .await
        .unwrap();
    for key in [stream_spec.stream_key(), list_spec.list_key()] {
        let ttl = pttl(&mut conn, &key);
        assert!(ttl > 590_000 && ttl <= 600_000, "{key}: {ttl}");
    }
    // Reading, acknowledging and deleting keep the expiry.
    let ids: Vec<_> = processor
        .next_batch()
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.id)
        .collect();
    assert_eq!(processor.finish(&ids).await.unwrap(), 1);
    let ttl = pttl(&mut conn, &stream_spec.stream_key());
    assert!(ttl > 590_000, "{ttl}");
}

#[tokio::test]
async fn a_crashed_workers_entries_are_reclaimed_by_another() {
    let spec = spec(&unique_prefix("claim"), 10);
    let client = redis::Client::open(shared_url()).unwrap();
    let queue = StreamQueue::new(manager().await, spec.clone());
    for zone in ["lions", "tigers"] {
        queue.push(&Job::new().field("zone", zone)).await.unwrap();
    }
    // Far longer than connecting the rescuer and its first read take, even
    // on a loaded machine: until then the entries must not be reclaimed.
    let min_idle = Duration::from_secs(1);
    let mut crashed = StreamProcessor::builder(&spec, "keepers", "crashed")
        .unwrap()
        .min_idle(min_idle)
        .block(Duration::from_millis(10))
        .connect(&client)
        .await
        .unwrap();
    let taken = crashed.next_batch().await.unwrap();
    assert_eq!(taken.len(), 2);
    drop(crashed); // read, never finished

    let mut rescuer = StreamProcessor::builder(&spec, "keepers", "rescuer")
        .unwrap()
        .min_idle(min_idle)
        .block(Duration::from_millis(10))
        .connect(&client)
        .await
        .unwrap();
    // Not idle long enough yet: nothing to reclaim, nothing new either.
    assert!(rescuer.next_batch().await.unwrap().is_empty());
    // Redis measures the idle time itself: wait it out.
    tokio::time::sleep(min_idle + Duration::from_millis(50)).await;
    let reclaimed = rescuer.reclaim().await.unwrap();
    let zones: Vec<_> = reclaimed
        .iter()
        .map(|e| e.job.get_str("zone").unwrap().to_owned())
        .collect();
    assert_eq!(zones, ["lions", "tigers"]);
    let ids: Vec<_> = reclaimed.into_iter().map(|e| e.id).collect();
    assert_eq!(rescuer.finish(&ids).await.unwrap(), 2);
    let mut conn = redis_conn();
    let len: u64 = redis::cmd("XLEN")
        .arg(spec.stream_key())
        .query(&mut conn)
        .unwrap();
    let pending: redis::Value = redis::cmd("XPENDING")
        .arg(spec.stream_key())
        .arg("keepers")
        .query(&mut conn)
        .unwrap();
    assert_eq!(len, 0, "finished entries are deleted");
    assert!(
        matches!(&pending, redis::Value::Array(v) if v.first() == Some(&redis::Value::Int(0))),
        "nothing pending: {pending:?}"
    );
}

#[tokio::test]
async fn run_drains_at_the_chosen_rate_and_retries_failures() {
    let spec = spec(&unique_prefix("run"), 10);
    let queue = StreamQueue::new(manager().await, spec.clone());
    for i in 0..4 {
        queue
            .push(&Job::new().field("n", i.to_string()))
            .await
            .unwrap();
    }
    let mut worker = StreamProcessor::builder(&spec, "keepers", "w1")
        .unwrap()
        .rate(Quota::per_second(NonZeroU32::new(20).unwrap())) // one per 50 ms
        .min_idle(Duration::from_millis(50))
        .block(Duration::from_millis(20))
        .connect(&redis::Client::open(shared_url()).unwrap())
        .await
        .unwrap();
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let log = seen.clone();
    let mut tx = Some(tx);
    let mut failed_once = false;
    let started = tokio::time::Instant::now();
    let finished = worker
        .run(
            move |entry| {
                let n = entry.job.get_str("n").unwrap().to_owned();
                let fail = n == "2" && !failed_once;
                failed_once |= fail;
                let mut log = log.lock().unwrap();
                log.push((n, started.elapsed()));
                if log.len() == 5 {
                    tx.take().unwrap().send(()).unwrap();
                }
                async move {
                    if fail {
                        Err("the keeper dropped the bucket")
                    } else {
                        Ok(())
                    }
                }
            },
            async {
                let _ = rx.await;
            },
        )
        .await
        .unwrap();
    assert_eq!(finished, 4);
    let seen = seen.lock().unwrap();
    let order: Vec<_> = seen.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        order,
        ["0", "1", "2", "3", "2"],
        "the failed entry came back"
    );
    for pair in seen.windows(2) {
        assert!(
            pair[1].1 - pair[0].1 >= Duration::from_millis(49),
            "faster than the rate: {seen:?}"
        );
    }
}

#[tokio::test]
async fn the_layer_queues_the_request_and_answers_with_the_handlers_response() {
    let spec = spec(&unique_prefix("layer"), 2);
    let queue = StreamQueue::new(manager().await, spec.clone());
    let layer = QueueLayer::builder(queue, Quota::per_second(NonZeroU32::new(4).unwrap()))
        .max_body(16)
        .build()
        .unwrap();
    let app = Router::new()
        .route(
            "/feed",
            post(
                |Extension(q): Extension<Enqueued>, body: String| async move {
                    (StatusCode::ACCEPTED, format!("{} {} {body}", q.id, q.len))
                },
            ),
        )
        .layer(layer)
        .layer(MockConnectInfo(SocketAddr::from(([192, 0, 2, 9], 1))));
    let feed = |body: &'static str| {
        Request::post("/feed?zone=cats")
            .header("content-type", "text/plain")
            .body(Body::from(body))
            .unwrap()
    };

    let res = app.clone().oneshot(feed("meat")).await.unwrap();
    assert_eq!(res.status(), StatusCode::ACCEPTED);
    assert_eq!(res.headers()["x-ratelimit-limit"], "2");
    assert_eq!(res.headers()["x-ratelimit-remaining"], "1");
    assert_eq!(res.headers()["x-ratelimit-used"], "1");
    let text = String::from_utf8(
        axum::body::to_bytes(res.into_body(), 1024)
            .await
            .unwrap()
            .to_vec(),
    )
    .unwrap();
    assert!(text.ends_with(" 1 meat"), "{text}");

    let too_big = app
        .clone()
        .oneshot(feed("a whole zebra, bones and all"))
        .await
        .unwrap();
    assert_eq!(too_big.status(), StatusCode::PAYLOAD_TOO_LARGE);

    assert_eq!(
        app.clone().oneshot(feed("fish")).await.unwrap().status(),
        StatusCode::ACCEPTED
    );
    let full = app.clone().oneshot(feed("more")).await.unwrap();
    assert_eq!(full.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(full.headers()["x-ratelimit-remaining"], "0");
    // Drained at 4 per second, a place frees in 250 ms: rounded up to 1 s.
    assert_eq!(full.headers()["retry-after"], "1");

    let mut worker = StreamProcessor::builder(&spec, "keepers", "w")
        .unwrap()
        .block(Duration::from_millis(10))
        .connect(&redis::Client::open(shared_url()).unwrap())
        .await
        .unwrap();
    let batch = worker.next_batch().await.unwrap();
    let first = &batch[0].job;
    assert_eq!(first.get_str("key"), Some("ip:192.0.2.9"));
    assert_eq!(first.get_str("method"), Some("POST"));
    assert_eq!(first.get_str("uri"), Some("/feed?zone=cats"));
    assert_eq!(first.get_str("content-type"), Some("text/plain"));
    assert_eq!(first.get_str("body"), Some("meat"));
    assert!(first.get_str("at").is_some(), "push time recorded");
}

#[tokio::test]
async fn the_layer_answers_503_when_redis_is_gone() {
    let mut server = support::redis::RedisServer::start();
    let conn = redis::Client::open(server.url())
        .unwrap()
        .get_connection_manager()
        .await
        .unwrap();
    let queue = StreamQueue::new(conn, spec("gone", 5));
    let app = Router::new()
        .route("/feed", post(|| async { StatusCode::ACCEPTED }))
        .layer(
            QueueLayer::builder(queue, Quota::per_second(NonZeroU32::new(1).unwrap()))
                .build()
                .unwrap(),
        )
        .layer(MockConnectInfo(SocketAddr::from(([192, 0, 2, 10], 1))));
    server.stop();
    let started = std::time::Instant::now();
    let res = app
        .oneshot(Request::post("/feed").body(Body::empty()).unwrap())
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(res.headers()["retry-after"], "1");
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "{:?}",
        started.elapsed()
    );
}
