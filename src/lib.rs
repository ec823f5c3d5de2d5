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
//! - **Charged at the start, settled at the end.** The last allowed request
//!   cannot be overtaken while in flight; conditional requests (`304`) are
//!   free, and a request whose real cost only its response knows (tokens,
//!   bytes) is settled to it, [`ActualCost`], in one store call.
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
#![cfg_attr(docsrs, feature(doc_cfg))]
#![forbid(unsafe_code)]
#![deny(missing_docs)]
#![warn(missing_debug_implementations)]

pub mod access;
#[cfg(feature = "admin")]
#[cfg_attr(docsrs, doc(cfg(feature = "admin")))]
pub mod admin;
pub mod clock;
pub mod decision;
pub mod error;
mod failure;
#[cfg(feature = "grpc")]
#[cfg_attr(docsrs, doc(cfg(feature = "grpc")))]
pub mod grpc;
pub mod headers;
pub mod key;
pub mod layer;
mod limiter;
mod local;
#[cfg(feature = "metrics")]
#[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
pub mod metrics;
#[cfg(not(feature = "metrics"))]
mod metrics;
mod overrides;
mod penalty;
mod policy;
mod policy_limits;
#[cfg(feature = "queue")]
#[cfg_attr(docsrs, doc(cfg(feature = "queue")))]
pub mod queue;
mod quota;
mod rate_limiter;
mod response;
pub mod store;
mod strategy;
#[cfg(feature = "throttle")]
#[cfg_attr(docsrs, doc(cfg(feature = "throttle")))]
pub mod throttle;
pub mod tier;

pub use decision::{ActualCost, Decision};
pub use error::{AdminError, ConfigError, KeyError, StoreError};
pub use failure::FailurePolicy;
pub use key::{Caller, ForwardedIp, HeaderKey, Key, KeyExtractor, PeerIp};
pub use layer::{RateLimitLayer, RateLimitLayerBuilder};
pub use overrides::Override;
pub use penalty::PenaltyBox;
pub use policy::{Policy, Strategy};
pub use policy_limits::{PolicyLimit, PolicyLimits};
pub use quota::Quota;
pub use rate_limiter::RateLimiter;
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub use store::{Leases, RedisStore};
pub use store::{MemoryStore, Store};
pub use tier::TieredLayer;

/// The README's and docs/' examples, compiled as doctests so they cannot
/// rot; they use every feature, so they run with all of them.
#[cfg(all(
    doctest,
    feature = "redis",
    feature = "cluster",
    feature = "sentinel",
    feature = "deadpool",
    feature = "throttle",
    feature = "queue",
    feature = "metrics",
    feature = "admin",
    feature = "grpc",
    feature = "tonic"
))]
mod docs_doctests {
    #[doc = include_str!("../README.md")]
    struct Readme;
    #[doc = include_str!("../docs/strategies.md")]
    struct Strategies;
    #[doc = include_str!("../docs/topologies.md")]
    struct Topologies;
    #[doc = include_str!("../docs/operations.md")]
    struct Operations;
    #[doc = include_str!("../docs/high-volume.md")]
    struct HighVolume;
    #[doc = include_str!("../docs/zoo.md")]
    struct Zoo;
    #[doc = include_str!("../docs/benchmarks.md")]
    struct Benchmarks;
    #[doc = include_str!("../docs/tiers.md")]
    struct Tiers;
    #[doc = include_str!("../docs/leases.md")]
    struct Leases;
}
