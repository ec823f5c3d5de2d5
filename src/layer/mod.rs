//! [`RateLimitLayer`]: configuration only, cheap to clone; the service and
//! future it makes, and what it leaves on a request. Its options are set by
//! [`RateLimitLayerBuilder`] (`layer/builder.rs`).

pub use crate::error::PeekError;
pub use crate::limiter::Fallback;
pub use crate::local::LocalCache;
pub use body::ResponseBody;
pub use builder::RateLimitLayerBuilder;
pub use future::ResponseFuture;
pub use service::RateLimit;

mod answer;
mod body;
mod builder;
mod future;
mod respond;
pub(crate) mod service;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use http::request::Parts;
use tower_layer::Layer;

use crate::decision::Decision;
use crate::error::ConfigError;
use crate::limiter::Limiter;
use crate::policy::Policy;
use crate::store::Store;

/// How long a decision may take before the failure policy applies.
pub const DEFAULT_DEADLINE: Duration = Duration::from_millis(100);

/// How long the store is skipped after it failed.
pub const DEFAULT_COOLDOWN: Duration = Duration::from_millis(500);

/// Applies a rate-limit [`Policy`] to every request of the wrapped service.
///
/// Works with `Router::layer`, `Router::route_layer` and `ServiceBuilder`.
/// The layer holds configuration only; every clone of its service shares one
/// budget per key, because the budget lives in the store, never in the
/// service.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// use std::num::NonZeroU32;
/// use axum::{body::Body, extract::connect_info::MockConnectInfo, http::Request, routing::get, Router};
/// use tower::ServiceExt;
/// use tollgate::{Policy, Quota, RateLimitLayer};
///
/// let layer = RateLimitLayer::builder()
///     .policy(Policy::fixed_window("core", Quota::per_minute(NonZeroU32::new(1).unwrap())))
///     .build()
///     .unwrap();
/// let app = Router::new()
///     .route("/", get(|| async { "hello" }))
///     .layer(layer)
///     .layer(MockConnectInfo(std::net::SocketAddr::from(([127, 0, 0, 1], 1))));
///
/// let first = app.clone().oneshot(Request::get("/").body(Body::empty()).unwrap()).await.unwrap();
/// assert_eq!(first.status(), 200);
/// assert_eq!(first.headers()["x-ratelimit-remaining"], "0");
/// let second = app.oneshot(Request::get("/").body(Body::empty()).unwrap()).await.unwrap();
/// assert_eq!(second.status(), 429);
/// # }
/// ```
#[derive(Clone)]
pub struct RateLimitLayer {
    pub(crate) limiter: Arc<Limiter>,
}

impl fmt::Debug for RateLimitLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitLayer")
            .field("policy", self.limiter.as_built())
            .field("store", &self.limiter.config.store)
            .field("deadline", &self.limiter.config.deadline)
            .field("shadow", &self.limiter.config.shadow)
            .field("access", &self.limiter.config.access)
            .finish_non_exhaustive()
    }
}

impl RateLimitLayer {
    /// The common case in one line: `policy` for each client IP (the TCP
    /// peer, IPv6 by /64), kept in `store`, with every other option at its
    /// default. Behind a proxy, or keyed by token, use the
    /// [`builder`](Self::builder).
    ///
    /// # Errors
    ///
    /// The policy's [`ConfigError`].
    ///
    /// ```
    /// use std::num::NonZeroU32;
    /// use axum::{routing::get, Router};
    /// use tollgate::{MemoryStore, Policy, Quota, RateLimitLayer};
    ///
    /// let per_ip = RateLimitLayer::new(
    ///     Policy::fixed_window("core", Quota::per_hour(NonZeroU32::new(60).unwrap())),
    ///     MemoryStore::new(), // or RedisStore::connect(url).await?
    /// )?;
    /// let app: Router = Router::new().route("/", get(|| async { "hi" })).layer(per_ip);
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    pub fn new(policy: Policy, store: impl Store) -> Result<Self, ConfigError> {
        Self::builder().policy(policy).store(store).build()
    }

    /// Starts configuring a layer.
    ///
    /// ```
    /// use std::num::NonZeroU32;
    /// use tollgate::{MemoryStore, PeerIp, Policy, Quota, RateLimitLayer};
    ///
    /// let layer = RateLimitLayer::builder()
    ///     .policy(Policy::fixed_window("core", Quota::per_minute(NonZeroU32::new(60).unwrap())))
    ///     .key(PeerIp::new())
    ///     .store(MemoryStore::new())
    ///     .build()
    ///     .unwrap();
    /// assert_eq!(layer.policy().name(), "core");
    /// assert!(RateLimitLayer::builder().build().is_err(), "a policy is required");
    /// ```
    pub fn builder() -> RateLimitLayerBuilder {
        RateLimitLayerBuilder::default()
    }

    /// The policy this layer enforces.
    pub fn policy(&self) -> &Policy {
        self.limiter.as_built()
    }

    /// The key a request of `caller` gets under this layer's extractor:
    /// see [`Caller`](crate::key::Caller) and
    /// [`RateLimiter::key_of`](crate::RateLimiter::key_of).
    ///
    /// ```
    /// use std::num::NonZeroU32;
    /// use tollgate::{key::Caller, Policy, Quota, RateLimitLayer};
    /// let layer = RateLimitLayer::new(
    ///     Policy::fixed_window("core", Quota::per_hour(NonZeroU32::new(60).unwrap())),
    ///     tollgate::MemoryStore::new(),
    /// ).unwrap(); // keyed by the peer's address
    /// let caller = Caller::new().ip("198.51.100.4".parse().unwrap());
    /// assert_eq!(layer.key_of(&caller).unwrap().as_str(), "ip:198.51.100.4");
    /// ```
    pub fn key_of(&self, caller: &crate::key::Caller) -> Result<crate::Key, crate::KeyError> {
        self.limiter.config.key.key_of(caller)
    }

    /// How many requests the [local cache](RateLimitLayerBuilder::local_cache)
    /// answered without the store: the Redis calls it saved.
    pub fn local_cache_hits(&self) -> u64 {
        self.limiter.running.local.cache_hits()
    }

    /// The caller's current state under this layer's policy, without charging:
    /// what GitHub's `GET /rate_limit` shows. On Redis this is one read-only
    /// script call, which replicas may serve. While the store fails, a peek
    /// follows the failure policy: a local fallback answers (from what the
    /// store last said, and what it decided since) with
    /// [`Decision::fallback`] set; with no fallback it is a
    /// [`PeekError::Store`].
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use std::num::NonZeroU32;
    /// use axum::{extract::ConnectInfo, http::Request};
    /// use tollgate::{Policy, Quota, RateLimitLayer};
    ///
    /// let layer = RateLimitLayer::builder()
    ///     .policy(Policy::fixed_window("core", Quota::per_hour(NonZeroU32::new(60).unwrap())))
    ///     .build().unwrap();
    /// let mut req = Request::get("/").body(()).unwrap();
    /// req.extensions_mut().insert(ConnectInfo(std::net::SocketAddr::from(([10, 0, 0, 1], 9))));
    /// let (parts, ()) = req.into_parts();
    /// assert_eq!(layer.peek(&parts).await.unwrap().remaining, 60);
    /// # }
    /// ```
    pub async fn peek(&self, parts: &Parts) -> Result<Decision, PeekError> {
        self.limiter.peek(parts).await
    }
}

impl<S> Layer<S> for RateLimitLayer {
    type Service = RateLimit<S>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimit::new(inner, self.limiter.clone())
    }
}
