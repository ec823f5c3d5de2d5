//! A tonic gRPC server behind `RateLimitLayer`, beside the zoo's axum one:
//! the health service tonic-health ships, 3 calls a minute per caller
//! (the peer's address, from tonic's `TcpConnectInfo`), and a client that
//! calls it four times and prints what it sees of the limit.
//!
//! ```text
//! cargo run --example grpc --features tonic          # on 127.0.0.1:50051, memory store
//! REDIS_URL=redis://127.0.0.1:6379/ cargo run --example grpc --features tonic
//! grpcurl -plaintext 127.0.0.1:50051 grpc.health.v1.Health/Check   # from outside
//! ```

use std::net::SocketAddr;
use std::num::NonZeroU32;
use std::sync::Arc;

use tollgate::{MemoryStore, PeerIp, Policy, Quota, RateLimitLayer, RedisStore, Store};
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Channel, Server};
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;
use tonic_types::StatusExt;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let addr: SocketAddr = std::env::var("GRPC_ADDR")
        .unwrap_or_else(|_| "127.0.0.1:50051".into())
        .parse()?;
    let store: Arc<dyn Store> = match std::env::var("REDIS_URL") {
        Ok(url) if !url.is_empty() => Arc::new(RedisStore::connect(&url).await?),
        _ => Arc::new(MemoryStore::new()),
    };
    let limit = RateLimitLayer::builder()
        .policy(Policy::fixed_window(
            "health",
            Quota::per_minute(NonZeroU32::new(3).unwrap()),
        ))
        .key(PeerIp::new())
        .shared_store(store)
        .build()?;

    let (_reporter, health) = tonic_health::server::health_reporter();
    // Listening before the client below calls.
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let server = Server::builder()
        .layer(limit)
        .add_service(health)
        .serve_with_incoming(TcpIncoming::from(listener));
    let server = tokio::spawn(server);
    println!("serving grpc.health.v1.Health on {addr}");

    // The client's view, four calls.
    let channel = Channel::from_shared(format!("http://{addr}"))?;
    let mut client = HealthClient::new(channel.connect_lazy());
    for call in 1..=4 {
        let request = HealthCheckRequest {
            service: String::new(),
        };
        match client.check(request).await {
            Ok(response) => {
                let metadata = response.metadata();
                let remaining = metadata.get("x-ratelimit-remaining");
                println!("call {call}: Ok, x-ratelimit-remaining {remaining:?}");
            }
            Err(status) => {
                println!("call {call}: {:?}: {}", status.code(), status.message());
                let pushback = status.metadata().get("grpc-retry-pushback-ms");
                println!("  grpc-retry-pushback-ms: {pushback:?}");
                let retry = status.get_details_retry_info().and_then(|r| r.retry_delay);
                println!("  RetryInfo retry_delay: {retry:?}");
                for (name, value) in status.metadata().clone().into_headers().iter() {
                    println!("  {name}: {value:?}");
                }
            }
        }
    }
    println!("still serving; Ctrl-C to stop");
    server.await??;
    Ok(())
}
