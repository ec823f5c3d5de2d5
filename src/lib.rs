//! Rate limiting for axum and tower, kept in Redis or in memory.
//!
//! `tollgate` puts a [`RateLimitLayer`] in front of your routes. Each request
//! is identified by a [`KeyExtractor`] (peer IP, client IP behind trusted
//! proxies, an API-key header, the route, or any closure), a [`Store`] decides
//! atomically whether it fits the [`Policy`], and the answer is either your
//! handler's response with GitHub-style `X-RateLimit-*` headers, or a `429`
//! with `Retry-After`.
//!
//! - **One round trip.** On Redis a decision is one `EVALSHA` of a Lua script;
//!   nothing is read-then-written from the app, so nothing over-admits under
//!   concurrency or across app servers.
//! - **Honest headers.** A window's end is stored beside its counter and read
//!   back, so `X-RateLimit-Reset` is identical on every response of a window.
//! - **Charged at the start, refunded for `304`.** The last allowed request
//!   cannot be overtaken while in flight, and conditional requests are free.
//! - **Still working when Redis is not.** Every store call has a deadline; then
//!   a [`FailurePolicy`] lets requests through, refuses them, or (the default)
//!   limits them in this process until Redis is back.
//!
//! # Quick start
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! use std::{net::SocketAddr, num::NonZeroU32};
//! use axum::{routing::get, Router};
//! use tollgate::{HeaderKey, KeyExtractor, MemoryStore, PeerIp, Policy, Quota, RateLimitLayer};
//!
//! let limit = RateLimitLayer::builder()
//!     .policy(Policy::fixed_window("core", Quota::per_hour(NonZeroU32::new(5000).unwrap())))
//!     .key(HeaderKey::new("x-api-key").or(PeerIp::new()))
//!     .store(MemoryStore::new()) // or RedisStore::connect(url).await?
//!     .build()
//!     .expect("valid rate limit");
//!
//! let app: Router = Router::new().route("/", get(|| async { "hi" })).layer(limit);
//! // axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>())
//! # let _ = app; }
//! ```
#![forbid(unsafe_code)]
#![warn(missing_docs, missing_debug_implementations)]

mod access;
mod clock;
mod decision;
mod error;
mod failure;
mod future;
mod headers;
mod key;
mod layer;
mod limiter;
mod local;
#[cfg(feature = "metrics")]
pub mod metrics;
#[cfg(not(feature = "metrics"))]
mod metrics;
pub mod queue;
mod quota;
mod release;
mod response;
mod service;
mod store;
mod strategy;
mod throttle;
pub mod tier;

pub use access::ClientIp;
pub use clock::{Clock, ManualClock, SystemClock};
pub use decision::{Decision, Receipt, Scope};
pub use error::{ConfigError, KeyError, StoreError, StoreErrorKind};
pub use failure::FailurePolicy;
pub use future::ResponseFuture;
pub use headers::RateLimitHeaders;
pub use key::{
    And, ForwardedHeader, ForwardedIp, HeaderKey, Key, KeyExtractor, Or, PeerIp, RouteKey,
};
pub use layer::{
    PeekError, RateLimitLayer, RateLimitLayerBuilder, DEFAULT_COOLDOWN, DEFAULT_DEADLINE,
};
pub use limiter::StoreUnavailable;
pub use local::LocalCache;
pub use quota::{Policy, Quota};
pub use service::RateLimit;
pub use store::{
    BoxFuture, ClusterConfig, MemoryStore, RedisStore, RedisStoreBuilder, SentinelConfig, Shard,
    ShardedConfig, Store,
};
pub use strategy::Strategy;
pub use throttle::{SyncReport, SyncTask, Throttle, ThrottleBuilder, ThrottleStats};
pub use tier::{Tiered, TieredLayer, TieredLayerBuilder, Unplaced};

/// The README's examples, compiled as doctests so they cannot rot.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
