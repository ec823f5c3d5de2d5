//! [`TieredLayer`] and its builder: the tiers, built and checked up front.

use std::fmt;
use std::sync::Arc;

use http::request::Parts;
use tower_layer::Layer;

use super::{ChooseFn, Tiered, Tiers, Unplaced};
use crate::decision::Decision;
use crate::error::{ConfigError, PeekError};
use crate::layer::RateLimitLayerBuilder;
use crate::policy::Policy;
use crate::store::{MemoryStore, Store};

/// Several named tiers on the same routes; a chooser picks the one that
/// counts each request. See the [module docs](crate::tier) for the why and
/// a GitHub-style example.
///
/// Like [`RateLimitLayer`](crate::RateLimitLayer) it holds configuration
/// only and is cheap to clone.
///
/// ```
/// use std::num::NonZeroU32;
/// use tollgate::{HeaderKey, PeerIp, Policy, Quota, RateLimitLayer, TieredLayer};
/// use tollgate::tier::Unplaced;
///
/// let per_hour = |n| Quota::per_hour(NonZeroU32::new(n).unwrap());
/// let layer = TieredLayer::builder()
///     .tier(RateLimitLayer::builder().policy(Policy::fixed_window("free", per_hour(60))).key(PeerIp::new()))
///     .tier(RateLimitLayer::builder().policy(Policy::fixed_window("pro", per_hour(5000))).key(HeaderKey::new("x-api-key")))
///     .choose(|parts| parts.headers.contains_key("x-api-key").then_some("pro"))
///     .unplaced(Unplaced::tier("free"))
///     .build()
///     .unwrap();
/// let names: Vec<&str> = layer.tiers().map(|p| p.name()).collect();
/// assert_eq!(names, ["free", "pro"]);
/// ```
#[derive(Clone)]
pub struct TieredLayer {
    tiers: Arc<Tiers>,
}

impl fmt::Debug for TieredLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TieredLayer")
            .field("tiers", &self.tiers().map(Policy::name).collect::<Vec<_>>())
            .field("unplaced", &self.tiers.unplaced)
            .finish_non_exhaustive()
    }
}

impl TieredLayer {
    /// Starts configuring a tiered layer.
    ///
    /// ```
    /// use std::num::NonZeroU32;
    /// use tollgate::{Policy, Quota, RateLimitLayer, TieredLayer};
    ///
    /// let per_hour = |n| Quota::per_hour(NonZeroU32::new(n).unwrap());
    /// let layer = TieredLayer::builder()
    ///     .tier(RateLimitLayer::builder().policy(Policy::fixed_window("free", per_hour(60))))
    ///     .tier(RateLimitLayer::builder().policy(Policy::fixed_window("pro", per_hour(5000))))
    ///     .choose(|parts| Some(if parts.headers.contains_key("x-api-key") { "pro" } else { "free" }))
    ///     .build()
    ///     .unwrap();
    /// assert_eq!(layer.tiers().count(), 2);
    /// ```
    pub fn builder() -> TieredLayerBuilder {
        TieredLayerBuilder::default()
    }

    /// The tiers' policies, in the order they were added.
    ///
    /// ```
    /// use std::num::NonZeroU32;
    /// use tollgate::{Policy, Quota, RateLimitLayer, TieredLayer};
    ///
    /// let layer = TieredLayer::builder()
    ///     .tier(RateLimitLayer::builder().policy(Policy::fixed_window("free", Quota::per_hour(NonZeroU32::new(60).unwrap()))))
    ///     .choose(|_| Some("free"))
    ///     .build()
    ///     .unwrap();
    /// assert_eq!(layer.tiers().next().unwrap().quotas()[0].limit(), 60);
    /// ```
    pub fn tiers(&self) -> impl Iterator<Item = &Policy> + '_ {
        self.tiers.limiters.iter().map(|l| l.as_built())
    }

    /// A handle on tier `name`'s limits for code outside HTTP and for
    /// operators (see [`RateLimiter`](crate::RateLimiter)): it shares that
    /// tier's store, budget, breaker and fallback with the layer. `None` for
    /// a name that is not a tier.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use std::num::NonZeroU32;
    /// use tollgate::{Key, Policy, Quota, RateLimitLayer, TieredLayer};
    ///
    /// let layer = TieredLayer::builder()
    ///     .tier(RateLimitLayer::builder().policy(Policy::fixed_window("free", Quota::per_hour(NonZeroU32::new(60).unwrap()))))
    ///     .choose(|_| Some("free"))
    ///     .build()
    ///     .unwrap();
    /// let free = layer.limiter("free").unwrap();
    /// free.check(&Key::new("10.0.0.1"), 1).await.unwrap();
    /// free.reset(&Key::new("10.0.0.1")).await.unwrap();
    /// assert!(layer.limiter("gold").is_none());
    /// # }
    /// ```
    pub fn limiter(&self, name: &str) -> Option<crate::RateLimiter> {
        self.tiers.named(name).cloned().map(crate::RateLimiter::of)
    }

    /// The caller's tier and its current state there, without charging:
    /// what GitHub's `GET /rate_limit` shows. The tier is chosen as for a
    /// request, and the peek is that tier's
    /// ([`RateLimitLayer::peek`](crate::RateLimitLayer::peek)); a request
    /// the layer refuses as unplaced is [`PeekError::Unplaced`].
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use std::num::NonZeroU32;
    /// use axum::http::Request;
    /// use tollgate::{HeaderKey, Policy, Quota, RateLimitLayer, TieredLayer};
    /// use tollgate::layer::PeekError;
    ///
    /// let per_hour = |n| Quota::per_hour(NonZeroU32::new(n).unwrap());
    /// let layer = TieredLayer::builder()
    ///     .tier(RateLimitLayer::builder().policy(Policy::fixed_window("pro", per_hour(5000))).key(HeaderKey::new("x-api-key")))
    ///     .choose(|parts| parts.headers.contains_key("x-api-key").then_some("pro"))
    ///     .build() // unplaced requests get 401
    ///     .unwrap();
    /// let (pro, ()) = Request::get("/").header("x-api-key", "k1").body(()).unwrap().into_parts();
    /// let (tier, decision) = layer.peek(&pro).await.unwrap();
    /// assert_eq!((tier.name(), decision.remaining), ("pro", 5000));
    /// let (nobody, ()) = Request::get("/").body(()).unwrap().into_parts();
    /// assert!(matches!(layer.peek(&nobody).await, Err(PeekError::Unplaced)));
    /// # }
    /// ```
    pub async fn peek(&self, parts: &Parts) -> Result<(&Policy, Decision), PeekError> {
        let limiter = self.tiers.place(parts).map_err(|_| PeekError::Unplaced)?;
        let decision = limiter.peek(parts).await?;
        Ok((limiter.as_built(), decision))
    }
}

impl<S> Layer<S> for TieredLayer {
    type Service = Tiered<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Tiered::new(inner, self.tiers.clone())
    }
}

/// Configures a [`TieredLayer`]: at least one [`tier`](Self::tier) and a
/// [`choose`](Self::choose)r are required.
///
/// | option | default |
/// |---|---|
/// | [`store`](Self::store) | one fresh [`MemoryStore`] for every tier without a store of its own |
/// | [`unplaced`](Self::unplaced) | [`Unplaced::Status`] `401 Unauthorized` |
///
/// Everything else (key, failure policy, shadow mode, allow and deny lists,
/// headers, statuses) is each tier's own, set on its
/// [`RateLimitLayerBuilder`]: a deny-list set on one tier guards only the
/// callers placed in it.
///
/// [`build`](Self::build) fails with a [`ConfigError`] when there is no tier
/// or no chooser, two tiers share a name, the unplaced tier is not one of
/// them, the unplaced status is not a 4xx or 5xx, or any tier's own
/// configuration is invalid.
///
/// ```
/// use std::num::NonZeroU32;
/// use tollgate::{Policy, Quota, RateLimitLayer, TieredLayer};
/// use tollgate::tier::Unplaced;
///
/// let tier = |name: &'static str| RateLimitLayer::builder()
///     .policy(Policy::fixed_window(name, Quota::per_hour(NonZeroU32::new(60).unwrap())));
/// let twice = TieredLayer::builder().tier(tier("free")).tier(tier("free")).choose(|_| None).build();
/// assert!(twice.unwrap_err().to_string().contains("free"));
/// let unknown = TieredLayer::builder().tier(tier("free")).choose(|_| None).unplaced(Unplaced::tier("gold")).build();
/// assert!(unknown.unwrap_err().to_string().contains("gold"));
/// ```
#[must_use]
#[derive(Default)]
pub struct TieredLayerBuilder {
    tiers: Vec<RateLimitLayerBuilder>,
    choose: Option<Box<ChooseFn>>,
    unplaced: Unplaced,
    store: Option<Arc<dyn Store>>,
}

impl fmt::Debug for TieredLayerBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TieredLayerBuilder")
            .field("tiers", &self.tiers)
            .field("unplaced", &self.unplaced)
            .finish_non_exhaustive()
    }
}

impl TieredLayerBuilder {
    /// Adds a tier: a complete layer configuration, named by its policy.
    /// Without a store of its own it gets the one given to
    /// [`store`](Self::store).
    pub fn tier(mut self, tier: RateLimitLayerBuilder) -> Self {
        self.tiers.push(tier);
        self
    }

    /// Names the caller's tier from the request head (required): usually
    /// from what an authentication layer put in the extensions, a plan or a
    /// user. `None`, or a name the layer has no tier for, makes the request
    /// [unplaced](Self::unplaced).
    ///
    /// ```
    /// use std::num::NonZeroU32;
    /// use tollgate::{HeaderKey, PeerIp, Policy, Quota, RateLimitLayer, TieredLayer};
    ///
    /// /// What an authentication layer leaves in the extensions.
    /// #[derive(Clone)]
    /// struct Plan(String);
    ///
    /// let per_hour = |n| Quota::per_hour(NonZeroU32::new(n).unwrap());
    /// let layer = TieredLayer::builder()
    ///     .tier(RateLimitLayer::builder().policy(Policy::fixed_window("free", per_hour(60))).key(PeerIp::new()))
    ///     .tier(RateLimitLayer::builder().policy(Policy::fixed_window("team", per_hour(5000))).key(HeaderKey::new("authorization")))
    ///     .choose(|parts| match parts.extensions.get::<Plan>() {
    ///         Some(Plan(plan)) => Some(plan.as_str()),
    ///         None => Some("free"),
    ///     })
    ///     .build();
    /// assert!(layer.is_ok());
    /// ```
    pub fn choose<F>(mut self, choose: F) -> Self
    where
        F: for<'a> Fn(&'a Parts) -> Option<&'a str> + Send + Sync + 'static,
    {
        self.choose = Some(Box::new(choose));
        self
    }

    /// What a request the chooser cannot place gets: a default tier, or a
    /// status (default: 401).
    pub fn unplaced(mut self, unplaced: Unplaced) -> Self {
        self.unplaced = unplaced;
        self
    }

    /// The store of every tier that has none of its own. Tiers' counters
    /// never collide in it: each is kept under its tier's policy name.
    pub fn store(mut self, store: impl Store) -> Self {
        self.store = Some(Arc::new(store));
        self
    }

    /// [`store`](Self::store), for a store already shared with other layers.
    pub fn shared_store(mut self, store: Arc<dyn Store>) -> Self {
        self.store = Some(store);
        self
    }

    /// The layer, or why this configuration cannot work.
    pub fn build(self) -> Result<TieredLayer, ConfigError> {
        if self.tiers.is_empty() {
            return Err(ConfigError::NoTiers);
        }
        let choose = self.choose.ok_or(ConfigError::NoChooser)?;
        let store = self
            .store
            .unwrap_or_else(|| Arc::new(MemoryStore::new()) as Arc<dyn Store>);
        let mut limiters = Vec::with_capacity(self.tiers.len());
        for (i, tier) in self.tiers.into_iter().enumerate() {
            let layer = tier
                .or_store(&store)
                .build()
                .map_err(|e| ConfigError::Tier {
                    tier: i + 1,
                    source: Box::new(e),
                })?;
            let name = layer.policy().name();
            if limiters
                .iter()
                .any(|l: &Arc<crate::limiter::Limiter>| l.name() == name)
            {
                let name = name.to_string();
                return Err(ConfigError::DuplicateTier { name });
            }
            limiters.push(layer.limiter);
        }
        let unplaced = match self.unplaced {
            Unplaced::Tier(name) => Ok(limiters
                .iter()
                .position(|l| l.name() == &*name)
                .ok_or_else(|| ConfigError::UnknownUnplacedTier {
                    name: name.to_string(),
                })?),
            Unplaced::Status(status) if status.is_client_error() || status.is_server_error() => {
                Err(status)
            }
            Unplaced::Status(status) => {
                return Err(ConfigError::StatusNotAnError {
                    what: "unplaced",
                    status,
                })
            }
        };
        Ok(TieredLayer {
            tiers: Arc::new(Tiers {
                limiters: limiters.into_boxed_slice(),
                choose,
                unplaced,
            }),
        })
    }
}
