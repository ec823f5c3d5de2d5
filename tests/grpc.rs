//! The layer in front of a real tonic server, called by a real tonic client
//! (the health service tonic-health ships, generated without protoc): what
//! a gRPC client sees of a limit, on the memory store and on Redis, and one
//! budget for a caller over axum and gRPC alike.

use std::net::SocketAddr;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tollgate::{
    FailurePolicy, MemoryStore, PeerIp, Policy, Quota, RateLimitLayer, RedisStore, Store,
};
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Channel, Server};
use tonic::Code;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;
use tonic_types::StatusExt;

mod support;

use support::redis::RedisServer;

fn three_a_minute(store: Arc<dyn Store>) -> tollgate::RateLimitLayerBuilder {
    RateLimitLayer::builder()
        .policy(Policy::fixed_window(
            "api",
            Quota::per_minute(NonZeroU32::new(3).unwrap()),
        ))
        // The address tonic's server records, as axum's ConnectInfo.
        .key(PeerIp::new())
        .shared_store(store)
}

/// A tonic server with the layer in `Server::builder().layer(..)`, no
/// adapter, serving the health service on a free port.
async fn serve(layer: RateLimitLayer) -> SocketAddr {
    let (_reporter, health) = tonic_health::server::health_reporter();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let incoming = TcpIncoming::from(listener);
    tokio::spawn(async move {
        // Keeps the reporter (and so the service's status) alive.
        let _reporter = _reporter;
        Server::builder()
            .layer(layer)
            .add_service(health)
            .serve_with_incoming(incoming)
            .await
            .unwrap();
    });
    addr
}

async fn client(addr: SocketAddr) -> HealthClient<Channel> {
    let channel = Channel::from_shared(format!("http://{addr}")).unwrap();
    HealthClient::new(channel.connect().await.unwrap())
}

async fn check(client: &mut HealthClient<Channel>) -> Result<tonic::Response<()>, tonic::Status> {
    let request = HealthCheckRequest {
        service: String::new(),
    };
    client.check(request).await.map(|r| {
        let (metadata, _, extensions) = r.into_parts();
        tonic::Response::from_parts(metadata, (), extensions)
    })
}

#[tokio::test]
async fn a_unary_call_limited_to_three_is_ok_three_times_then_resource_exhausted() {
    let layer = three_a_minute(Arc::new(MemoryStore::new()))
        .build()
        .unwrap();
    let mut client = client(serve(layer).await).await;
    for remaining in ["2", "1", "0"] {
        let passed = check(&mut client).await.expect("within the limit");
        // The rate-limit headers are the call's initial metadata.
        let metadata = passed.metadata();
        assert_eq!(metadata.get("x-ratelimit-remaining").unwrap(), remaining);
        assert_eq!(metadata.get("x-ratelimit-limit").unwrap(), "3");
        assert_eq!(metadata.get("x-ratelimit-resource").unwrap(), "api");
    }
    let status = check(&mut client).await.expect_err("over the limit");
    let metadata = status.metadata();
    let pushback = metadata
        .get("grpc-retry-pushback-ms")
        .unwrap()
        .to_str()
        .unwrap();
    let retry = status
        .get_details_retry_info()
        .expect("RetryInfo in the status details");
    println!("the client's view of the limited call:");
    println!("  code: {:?}", status.code());
    println!("  message: {}", status.message());
    println!("  grpc-retry-pushback-ms: {pushback}");
    println!("  RetryInfo.retry_delay: {:?}", retry.retry_delay);
    for (name, value) in metadata.clone().into_headers().iter() {
        println!("  metadata {name}: {}", value.to_str().unwrap());
    }

    assert_eq!(status.code(), Code::ResourceExhausted);
    let pushback: u64 = pushback.parse().unwrap();
    assert!((1..=60_000).contains(&pushback), "{pushback}");
    assert_eq!(
        status.message(),
        format!("API rate limit exceeded for resource 'api'; retry in {pushback} ms")
    );
    let delay = retry.retry_delay.expect("a retry delay");
    assert!(delay.abs_diff(Duration::from_millis(pushback)) < Duration::from_millis(1));
    assert_eq!(metadata.get("x-ratelimit-remaining").unwrap(), "0");
    assert_eq!(metadata.get("x-ratelimit-limit").unwrap(), "3");
    assert!(metadata.get("retry-after").is_some());
}

#[tokio::test]
async fn two_servers_on_redis_share_one_budget() {
    let redis = RedisServer::start();
    let mut addrs = Vec::new();
    for _ in 0..2 {
        let store: Arc<dyn Store> = Arc::new(RedisStore::connect(&redis.url()).await.unwrap());
        addrs.push(serve(three_a_minute(store).build().unwrap()).await);
    }
    let mut first = client(addrs[0]).await;
    let mut second = client(addrs[1]).await;
    check(&mut first).await.unwrap();
    check(&mut second).await.unwrap();
    let third = check(&mut first).await.unwrap();
    assert_eq!(third.metadata().get("x-ratelimit-remaining").unwrap(), "0");
    let fourth = check(&mut second)
        .await
        .expect_err("the shared budget is spent");
    assert_eq!(fourth.code(), Code::ResourceExhausted);
    assert_eq!(
        check(&mut first).await.unwrap_err().code(),
        Code::ResourceExhausted
    );
}

#[tokio::test]
async fn a_fail_closed_outage_is_unavailable() {
    let mut redis = RedisServer::start();
    let store: Arc<dyn Store> = Arc::new(RedisStore::connect(&redis.url()).await.unwrap());
    let layer = three_a_minute(store)
        .on_store_failure(FailurePolicy::closed(Duration::from_secs(2)))
        .build()
        .unwrap();
    let mut client = client(serve(layer).await).await;
    check(&mut client).await.expect("Redis is up");
    redis.stop();
    let status = check(&mut client).await.expect_err("Redis is down");
    assert_eq!(status.code(), Code::Unavailable);
    assert_eq!(
        status.message(),
        "rate limiting is unavailable; retry in 2000 ms"
    );
    assert_eq!(
        status.metadata().get("grpc-retry-pushback-ms").unwrap(),
        "2000"
    );
}

/// An HTTP GET through hyper's client: the status and the remaining budget.
async fn get(addr: SocketAddr, path: &str) -> (http::StatusCode, String) {
    use http_body_util::Empty;
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let io = hyper_util::rt::TokioIo::new(tcp);
    let (mut sender, connection) = hyper::client::conn::http1::handshake(io).await.unwrap();
    tokio::spawn(connection);
    let request = http::Request::get(path)
        .header("host", "tollgate")
        .body(Empty::<bytes::Bytes>::new())
        .unwrap();
    let response = sender.send_request(request).await.unwrap();
    let remaining = response.headers()["x-ratelimit-remaining"]
        .to_str()
        .unwrap()
        .to_owned();
    (response.status(), remaining)
}

#[tokio::test]
async fn a_caller_has_one_budget_over_axum_and_grpc() {
    use axum::routing::get as route;
    // One store, and the same policy and key (the peer's address) on both
    // ways in: the caller is `ip:127.0.0.1` over HTTP and over gRPC.
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let grpc = serve(three_a_minute(store.clone()).build().unwrap()).await;
    let app = axum::Router::new()
        .route("/health", route(|| async { "SERVING" }))
        .layer(three_a_minute(store).build().unwrap());
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let http = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let app = app.into_make_service_with_connect_info::<SocketAddr>();
        axum::serve(listener, app).await.unwrap();
    });

    let mut client = client(grpc).await;
    assert_eq!(
        get(http, "/health").await,
        (http::StatusCode::OK, "2".into())
    );
    let over_grpc = check(&mut client).await.unwrap();
    assert_eq!(
        over_grpc.metadata().get("x-ratelimit-remaining").unwrap(),
        "1"
    );
    assert_eq!(
        get(http, "/health").await,
        (http::StatusCode::OK, "0".into())
    );
    // Spent over HTTP: switching to gRPC buys no second quota, and back.
    let refused = check(&mut client).await.unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted);
    assert_eq!(
        get(http, "/health").await,
        (http::StatusCode::TOO_MANY_REQUESTS, "0".into())
    );
}

/// A health service of our own, to show what a handler's give-backs do:
/// `Check` costs 2, said with `ActualCost` on its response as an HTTP
/// handler says it; `Watch` is a stream of 3 messages whose cost (one a
/// message) is known only when it ends, and settled then by the handler.
struct Costly {
    limiter: tollgate::RateLimiter,
}

type Messages = std::pin::Pin<
    Box<
        dyn futures::Stream<Item = Result<tonic_health::pb::HealthCheckResponse, tonic::Status>>
            + Send,
    >,
>;

#[tonic::async_trait]
impl tonic_health::pb::health_server::Health for Costly {
    async fn check(
        &self,
        _: tonic::Request<HealthCheckRequest>,
    ) -> Result<tonic::Response<tonic_health::pb::HealthCheckResponse>, tonic::Status> {
        let mut response = tonic::Response::new(serving());
        response.extensions_mut().insert(tollgate::ActualCost(2));
        Ok(response)
    }

    type WatchStream = Messages;

    async fn watch(
        &self,
        request: tonic::Request<HealthCheckRequest>,
    ) -> Result<tonic::Response<Messages>, tonic::Status> {
        use futures::StreamExt;
        use tollgate::key::Caller;
        use tollgate::KeyExtractor;
        // What the layer charged when the call started, and whose it was.
        let charged = request
            .extensions()
            .get::<tollgate::Decision>()
            .cloned()
            .unwrap();
        let peer = request.remote_addr().unwrap().ip();
        let key = PeerIp::new().key_of(&Caller::new().ip(peer)).unwrap();
        let limiter = self.limiter.clone();
        let messages = futures::stream::iter((0..3).map(|_| Ok(serving())));
        let settled = futures::stream::once(async move {
            // The stream is over: it cost one a message.
            limiter.settle(&key, &charged, 3).await.unwrap();
            None
        })
        .filter_map(|end: Option<Result<_, tonic::Status>>| async move { end });
        Ok(tonic::Response::new(Box::pin(messages.chain(settled))))
    }
}

fn serving() -> tonic_health::pb::HealthCheckResponse {
    tonic_health::pb::HealthCheckResponse {
        status: tonic_health::pb::health_check_response::ServingStatus::Serving as i32,
    }
}

#[tokio::test]
async fn a_handlers_actual_cost_settles_and_a_stream_is_charged_at_its_start_and_settled_at_its_end(
) {
    let layer = RateLimitLayer::builder()
        .policy(Policy::fixed_window(
            "api",
            Quota::per_minute(NonZeroU32::new(10).unwrap()),
        ))
        .key(PeerIp::new())
        .decision_extension(true)
        .build()
        .unwrap();
    let service = tonic_health::pb::health_server::HealthServer::new(Costly {
        limiter: layer.limiter(),
    });
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(
        Server::builder()
            .layer(layer)
            .add_service(service)
            .serve_with_incoming(TcpIncoming::from(listener)),
    );
    let mut client = client(addr).await;
    let remaining = |metadata: &tonic::metadata::MetadataMap| {
        metadata
            .get("x-ratelimit-remaining")
            .unwrap()
            .to_str()
            .unwrap()
            .to_owned()
    };

    // Charged 1, settled to the 2 the handler said, in the same response.
    let checked = check(&mut client).await.unwrap();
    assert_eq!(remaining(checked.metadata()), "8");

    // A stream is charged when it starts: its initial metadata says so.
    let request = HealthCheckRequest {
        service: String::new(),
    };
    let watch = client.watch(request).await.unwrap();
    assert_eq!(remaining(watch.metadata()), "7");
    let mut messages = watch.into_inner();
    let mut received = 0;
    while let Some(message) = messages.message().await.unwrap() {
        assert_eq!(message, serving());
        received += 1;
    }
    assert_eq!(received, 3);
    // Settled to 3 when it ended: 10 - 2 - 3, then this call's 2.
    let after = check(&mut client).await.unwrap();
    assert_eq!(remaining(after.metadata()), "3");
}

#[tokio::test]
async fn a_failed_call_is_given_back_when_settle_cost_reads_its_grpc_status() {
    // gRPC has no 304: every answer is an HTTP 200. What stands in is the
    // status, in the head of a call that failed at once (trailers-only).
    let layer = three_a_minute(Arc::new(MemoryStore::new()))
        .settle_cost(|head| {
            let status = head.headers.get("grpc-status")?;
            (status != "0").then_some(0)
        })
        .build()
        .unwrap();
    let mut client = client(serve(layer).await).await;
    for _ in 0..5 {
        let request = HealthCheckRequest {
            service: "unknown".into(),
        };
        let status = client.check(request).await.unwrap_err();
        assert_eq!(status.code(), Code::NotFound);
    }
    let passed = check(&mut client).await.expect("failed calls cost nothing");
    assert_eq!(passed.metadata().get("x-ratelimit-remaining").unwrap(), "2");
}
