//! An axum app whose rate limit is counted in Prometheus format at `/metrics`.
//!
//! ```text
//! cargo run --example metrics --features metrics
//! for i in 1 2 3 4; do curl -s -o /dev/null -w '%{http_code}\n' localhost:3000/; done
//! curl -s localhost:3000/metrics | grep tollgate_
//! ```
//!
//! `/metrics` sits outside the limited routes (`route_layer` on the API
//! router only), so scrapes are never limited. Pass an address as the first
//! argument to listen elsewhere (`127.0.0.1:0` picks a free port).

use std::{net::SocketAddr, num::NonZeroU32, time::Duration};

use axum::{routing::get, Router};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
use tollgate::{Policy, Quota, RateLimitLayer};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // 1. Install the recorder before any request: layers look their metric
    //    handles up on first use. Buckets make the latency a real histogram.
    let prometheus = PrometheusBuilder::new()
        .set_buckets_for_metric(
            Matcher::Full(tollgate::metrics::STORE_LATENCY.into()),
            tollgate::metrics::LATENCY_BUCKETS,
        )?
        .install_recorder()?;
    tollgate::metrics::describe();

    // The exporter expects periodic upkeep (it drains histogram samples).
    let upkeep = prometheus.clone();
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_secs(5)).await;
            upkeep.run_upkeep();
        }
    });

    // 2. A limited API, and `/metrics` beside it.
    let limit = RateLimitLayer::builder()
        .policy(Policy::fixed_window(
            "core",
            Quota::per_minute(NonZeroU32::new(3).unwrap()),
        ))
        .allow(|parts| parts.uri.path() == "/healthz")
        .build()?;
    let api = Router::new()
        .route("/", get(|| async { "hello\n" }))
        .route("/healthz", get(|| async { "ok\n" }))
        .route_layer(limit);
    let app = api.route("/metrics", get(move || async move { prometheus.render() }));

    // 3. Serve with peer addresses, which the default key (PeerIp) needs.
    let addr = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:3000".into());
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    println!("listening on http://{}", listener.local_addr()?);
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await?;
    Ok(())
}
