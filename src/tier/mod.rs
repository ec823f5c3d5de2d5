//! Tiers: one layer, several policies, and the caller's plan picks the one
//! that counts a request, as GitHub's own limiter does (60 an hour by IP
//! for anonymous callers, 5,000 by token for authenticated ones).
//!
//! A [`TieredLayer`] holds a fixed set of tiers, each a complete
//! [`RateLimitLayerBuilder`](crate::RateLimitLayerBuilder) (policy, key
//! extractor, failure policy, shadow mode, allow and deny lists), built and
//! checked up front, and a chooser: a closure over the request head that
//! names the caller's tier, reading what an authentication layer left in the
//! extensions. Exactly one tier counts each request, in one store call: the
//! request then takes that tier's path as if its layer stood alone, so its
//! headers, its 429 body, its refunds and releases, and its peek are that
//! tier's. The tier's name is its policy's name, which `X-RateLimit-Resource`
//! and the 429 body carry, and which keeps the tiers' counters apart in the
//! store.
//!
//! Why not one layer per tier with `allow` predicates that skip each other:
//! a predicate that is wrong by one case counts a request twice or by no
//! one, and the headers come from whichever layer ran last.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! use std::{net::SocketAddr, num::NonZeroU32};
//! use axum::{body::Body, extract::connect_info::MockConnectInfo, http::Request, routing::get, Router};
//! use tower::ServiceExt;
//! use tollgate::{HeaderKey, MemoryStore, PeerIp, Policy, Quota, RateLimitLayer, TieredLayer};
//!
//! let per_hour = |n| Quota::per_hour(NonZeroU32::new(n).unwrap());
//! let tiers = TieredLayer::builder()
//!     .tier(RateLimitLayer::builder()
//!         .policy(Policy::fixed_window("anonymous", per_hour(60)))
//!         .key(PeerIp::new()))
//!     .tier(RateLimitLayer::builder()
//!         .policy(Policy::fixed_window("authenticated", per_hour(5000)))
//!         .key(HeaderKey::new("authorization")))
//!     // In production, read what your authentication layer verified.
//!     .choose(|parts| match parts.headers.contains_key("authorization") {
//!         true => Some("authenticated"),
//!         false => Some("anonymous"),
//!     })
//!     .store(MemoryStore::new()) // or a RedisStore, shared by every tier
//!     .build()
//!     .unwrap();
//! let app = Router::new()
//!     .route("/", get(|| async { "hi" }))
//!     .layer(tiers)
//!     .layer(MockConnectInfo(SocketAddr::from(([203, 0, 113, 7], 4000))));
//!
//! let anonymous = app.clone().oneshot(Request::get("/").body(Body::empty()).unwrap()).await.unwrap();
//! assert_eq!(anonymous.headers()["x-ratelimit-limit"], "60");
//! assert_eq!(anonymous.headers()["x-ratelimit-resource"], "anonymous");
//!
//! let token = Request::get("/").header("authorization", "Bearer ghp_x").body(Body::empty()).unwrap();
//! let authenticated = app.oneshot(token).await.unwrap();
//! assert_eq!(authenticated.headers()["x-ratelimit-limit"], "5000");
//! assert_eq!(authenticated.headers()["x-ratelimit-remaining"], "4999");
//! # }
//! ```

mod layer;
mod service;

pub use layer::{TieredLayer, TieredLayerBuilder};
pub use service::Tiered;

use std::sync::Arc;

use http::request::Parts;
use http::StatusCode;

use crate::limiter::Limiter;

/// What a [`TieredLayer`] does with a request its chooser cannot place: the
/// chooser answered `None`, or named a tier the layer does not have.
///
/// The default is [`Unplaced::Status`] with `401 Unauthorized`: a request
/// nobody counts is refused rather than let through unlimited.
///
/// ```
/// use axum::http::StatusCode;
/// use tollgate::tier::Unplaced;
///
/// let default_tier = Unplaced::tier("anonymous"); // counted as anonymous
/// let refuse = Unplaced::Status(StatusCode::FORBIDDEN); // 403, not counted
/// assert_ne!(default_tier, refuse);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Unplaced {
    /// Count it in the tier of this name, which must be one of the layer's.
    Tier(Arc<str>),
    /// Answer with this status (a 4xx or 5xx) and a JSON message, without
    /// counting it anywhere and without rate-limit headers.
    Status(StatusCode),
}

impl Unplaced {
    /// Counts unplaced requests in the tier named `name`.
    ///
    /// ```
    /// use tollgate::tier::Unplaced;
    /// assert_eq!(Unplaced::tier("free"), Unplaced::Tier("free".into()));
    /// ```
    pub fn tier(name: impl Into<Arc<str>>) -> Self {
        Unplaced::Tier(name.into())
    }
}

impl Default for Unplaced {
    fn default() -> Self {
        Unplaced::Status(StatusCode::UNAUTHORIZED)
    }
}

/// Names the caller's tier from the request head.
pub(crate) type ChooseFn = dyn for<'a> Fn(&'a Parts) -> Option<&'a str> + Send + Sync;

/// A tiered layer's configuration, shared by every clone of its service.
pub(crate) struct Tiers {
    /// One limiter per tier, in the order they were added; names distinct.
    limiters: Box<[Arc<Limiter>]>,
    choose: Box<ChooseFn>,
    /// The tier unplaced requests are counted in, or the status they get.
    unplaced: Result<usize, StatusCode>,
}

impl Tiers {
    /// The limiter of the tier named `name`.
    pub(crate) fn named(&self, name: &str) -> Option<&Arc<Limiter>> {
        self.limiters.iter().find(|l| l.name() == name)
    }

    /// The limiter of the request's tier, or the status an unplaced request
    /// gets. Never panics on what the chooser returns.
    pub(crate) fn place(&self, parts: &Parts) -> Result<&Arc<Limiter>, StatusCode> {
        let chosen = (self.choose)(parts);
        if let Some(name) = chosen {
            // A handful of tiers: a scan is cheaper than hashing the name.
            if let Some(limiter) = self.named(name) {
                return Ok(limiter);
            }
        }
        match self.unplaced {
            Ok(tier) => {
                let limiter = &self.limiters[tier];
                tracing::debug!(chosen = ?chosen, tier = limiter.name(),
                    "rate limit tier not found; counting in the default tier");
                Ok(limiter)
            }
            Err(status) => {
                tracing::debug!(chosen = ?chosen, %status,
                    "rate limit tier not found; refusing the request");
                Err(status)
            }
        }
    }
}
