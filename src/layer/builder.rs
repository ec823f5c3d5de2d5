//! [`RateLimitLayerBuilder`]: every option of a [`RateLimitLayer`], checked
//! once by `build`.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use http::request::Parts;
use http::StatusCode;

use crate::access::{Access, ClientIp};
use crate::error::ConfigError;
use crate::failure::FailurePolicy;
use crate::headers::{PolicyHeaders, RateLimitHeaders};
use crate::key::{KeyExtractor, PeerIp};
use crate::limiter::{Config, Limiter, Running};
use crate::local::seed::{self, Learned};
use crate::metrics::PolicyMetrics;
use crate::policy::Policy;
use crate::store::{MemoryStore, Store};

use super::{RateLimitLayer, DEFAULT_COOLDOWN, DEFAULT_DEADLINE};

/// Configures a [`RateLimitLayer`]. Only the policy is required.
///
/// | option | default |
/// |---|---|
/// | [`store`](Self::store) | a fresh [`MemoryStore`] |
/// | [`key`](Self::key) | [`PeerIp`] (IPv6 by /64) |
/// | [`cost`](Self::cost) | 1 per request |
/// | [`deadline`](Self::deadline) | [`DEFAULT_DEADLINE`] (100 ms) |
/// | [`on_store_failure`](Self::on_store_failure) | [`FailurePolicy::local`] |
/// | [`failure_cooldown`](Self::failure_cooldown) | [`DEFAULT_COOLDOWN`] (500 ms) |
/// | [`limited_status`](Self::limited_status) | 429 |
/// | [`key_error_status`](Self::key_error_status) | 400 |
/// | `grpc_limited_code` (feature `grpc`) | `RESOURCE_EXHAUSTED`, for a gRPC call |
/// | [`refund_when`](Self::refund_when) | status is `304 Not Modified` |
/// | [`settle_cost`](Self::settle_cost) | the response's [`ActualCost`](crate::ActualCost) extension, if any |
/// | [`headers`](Self::headers) | [`RateLimitHeaders::GITHUB`] |
/// | [`shadow`](Self::shadow) | off: rejections are enforced |
/// | [`decision_extension`](Self::decision_extension) | off: handlers are not handed the [`Decision`](crate::Decision) |
/// | [`allow`](Self::allow), [`allow_cidrs`](Self::allow_cidrs) | nobody skips the limit |
/// | [`deny`](Self::deny), [`deny_cidrs`](Self::deny_cidrs) | nobody is refused outright |
/// | [`cidr_address`](Self::cidr_address) | [`PeerIp`]: the TCP peer |
///
/// ```
/// use std::{num::NonZeroU32, time::Duration};
/// use axum::http::StatusCode;
/// use tollgate::{FailurePolicy, HeaderKey, KeyExtractor, MemoryStore, PeerIp, Policy, Quota, RateLimitLayer};
///
/// let layer = RateLimitLayer::builder()
///     .policy(Policy::fixed_window("search", Quota::per_minute(NonZeroU32::new(30).unwrap())))
///     .store(MemoryStore::new())
///     .key(HeaderKey::new("x-api-key").or(PeerIp::new()))
///     .cost(|parts| if parts.uri.path().starts_with("/search") { 10 } else { 1 })
///     .deadline(Duration::from_millis(50))
///     .on_store_failure(FailurePolicy::closed(Duration::from_secs(1)))
///     .limited_status(StatusCode::FORBIDDEN)
///     .refund_when(|status| status == StatusCode::NOT_MODIFIED || status.is_server_error())
///     .build()
///     .unwrap();
/// ```
#[must_use]
pub struct RateLimitLayerBuilder {
    policy: Option<Policy>,
    store: Option<Arc<dyn Store>>,
    key: Option<Arc<dyn KeyExtractor>>,
    cost: Option<Arc<crate::limiter::CostFn>>,
    request_limit: Option<crate::limiter::RequestLimit>,
    deadline: Duration,
    failure: FailurePolicy,
    limited_status: StatusCode,
    key_error_status: StatusCode,
    #[cfg(feature = "grpc")]
    grpc_limited: crate::grpc::LimitedCode,
    refund_when: crate::limiter::RefundWhen,
    settle_cost: Option<Arc<crate::limiter::SettleFn>>,
    headers: RateLimitHeaders,
    shadow: bool,
    decision_extension: bool,
    access: Access,
    cooldown: Duration,
    local: crate::local::LocalDecisions,
}

impl Default for RateLimitLayerBuilder {
    fn default() -> Self {
        Self {
            policy: None,
            store: None,
            key: None,
            cost: None,
            request_limit: None,
            deadline: DEFAULT_DEADLINE,
            failure: FailurePolicy::default(),
            limited_status: StatusCode::TOO_MANY_REQUESTS,
            key_error_status: StatusCode::BAD_REQUEST,
            #[cfg(feature = "grpc")]
            grpc_limited: crate::grpc::LimitedCode::ResourceExhausted,
            refund_when: crate::limiter::RefundWhen::NotModified,
            settle_cost: None,
            headers: RateLimitHeaders::default(),
            shadow: false,
            decision_extension: false,
            access: Access::default(),
            cooldown: DEFAULT_COOLDOWN,
            local: Default::default(),
        }
    }
}

impl fmt::Debug for RateLimitLayerBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitLayerBuilder")
            .field("policy", &self.policy)
            .field("deadline", &self.deadline)
            .field("shadow", &self.shadow)
            .field("decision_extension", &self.decision_extension)
            .field("access", &self.access)
            .finish_non_exhaustive()
    }
}

impl RateLimitLayerBuilder {
    /// The policy to enforce (required).
    pub fn policy(mut self, policy: Policy) -> Self {
        self.policy = Some(policy);
        self
    }

    /// Where decisions are made.
    pub fn store(mut self, store: impl Store) -> Self {
        self.store = Some(Arc::new(store));
        self
    }

    /// A store already shared with other layers.
    pub fn shared_store(mut self, store: Arc<dyn Store>) -> Self {
        self.store = Some(store);
        self
    }

    /// How callers are told apart.
    pub fn key(mut self, key: impl KeyExtractor) -> Self {
        self.key = Some(Arc::new(key));
        self
    }

    /// What a request costs, in quota units (a search 10, a read 1).
    pub fn cost(mut self, cost: impl Fn(&Parts) -> u64 + Send + Sync + 'static) -> Self {
        self.cost = Some(Arc::new(cost));
        self
    }

    /// Takes the caller's limit from each request (a plan an
    /// authentication layer looked up and put in the request's
    /// extensions), clamped to `bounds`; `None` keeps the policy's. The
    /// limit replaces the caller's own quota's (the first whose budget is
    /// the caller's), its window kept. The caller keeps one state whatever
    /// limit judges it, the headers show the limit used, and a stored
    /// [`Override`](crate::Override) beats it. Costs one quota list per
    /// request that brings a limit, and nothing in Redis.
    ///
    /// ```
    /// use std::num::NonZeroU32;
    /// use tollgate::{Policy, Quota, RateLimitLayer};
    ///
    /// #[derive(Clone)]
    /// struct Plan { per_hour: u32 }
    ///
    /// let layer = RateLimitLayer::builder()
    ///     .policy(Policy::fixed_window("api", Quota::per_hour(NonZeroU32::new(100).unwrap())))
    ///     .limit_from_request(10..=100_000, |parts| {
    ///         parts.extensions.get::<Plan>().map(|plan| plan.per_hour)
    ///     })
    ///     .build()
    ///     .unwrap();
    /// ```
    pub fn limit_from_request(
        mut self,
        bounds: std::ops::RangeInclusive<u32>,
        limit: impl Fn(&Parts) -> Option<u32> + Send + Sync + 'static,
    ) -> Self {
        self.request_limit = Some(crate::limiter::RequestLimit {
            min: *bounds.start(),
            max: *bounds.end(),
            from: Arc::new(limit),
        });
        self
    }

    /// The longest a decision may take before the failure policy applies.
    pub fn deadline(mut self, deadline: Duration) -> Self {
        self.deadline = deadline;
        self
    }

    /// What to do when the store fails or misses the deadline.
    pub fn on_store_failure(mut self, policy: FailurePolicy) -> Self {
        self.failure = policy;
        self
    }

    /// After a store failure, apply the failure policy straight away for this
    /// long instead of asking the store again (zero: ask every time). Keeps
    /// requests from each waiting out the deadline while Redis is down or
    /// drowning, and gives it room to recover.
    pub fn failure_cooldown(mut self, cooldown: Duration) -> Self {
        self.cooldown = cooldown;
        self
    }

    /// The status of rejections: 429 (default) or 403, as GitHub sends.
    pub fn limited_status(mut self, status: StatusCode) -> Self {
        self.limited_status = status;
        self
    }

    /// The status when no key can be taken from a request (default 400).
    pub fn key_error_status(mut self, status: StatusCode) -> Self {
        self.key_error_status = status;
        self
    }

    /// The gRPC status of a gRPC call refused for its quota (default
    /// `RESOURCE_EXHAUSTED`); see [`tollgate::grpc`](crate::grpc) for what
    /// every refusal of a gRPC call is.
    ///
    /// ```
    /// use std::num::NonZeroU32;
    /// use tollgate::grpc::LimitedCode;
    /// use tollgate::{Policy, Quota, RateLimitLayer};
    /// let layer = RateLimitLayer::builder()
    ///     .policy(Policy::fixed_window("core", Quota::per_second(NonZeroU32::new(5).unwrap())))
    ///     .grpc_limited_code(LimitedCode::Unavailable) // as Envoy answers
    ///     .build()
    ///     .unwrap();
    /// # let _ = layer;
    /// ```
    #[cfg(feature = "grpc")]
    #[cfg_attr(docsrs, doc(cfg(feature = "grpc")))]
    pub fn grpc_limited_code(mut self, code: crate::grpc::LimitedCode) -> Self {
        self.grpc_limited = code;
        self
    }

    /// Which response statuses get their charge back (default: 304 only).
    pub fn refund_when(
        mut self,
        refund: impl Fn(StatusCode) -> bool + Send + Sync + 'static,
    ) -> Self {
        self.refund_when = crate::limiter::RefundWhen::Custom(Arc::new(refund));
        self
    }

    /// Reads what a request really cost from its response's head, to
    /// settle its charge to that: the request is charged its estimate
    /// ([`cost`](Self::cost)) when it starts, and when the response is in,
    /// the difference is charged (unchecked: the units were spent) or
    /// given back, in one store call, to the window the estimate went to.
    /// `None` keeps the estimate. Without this option the layer reads the
    /// [`ActualCost`](crate::ActualCost) a handler put in the response's
    /// extensions. A status [`refund_when`](Self::refund_when) frees (a
    /// `304`) costs zero whatever this says.
    ///
    /// A request that overspends takes `X-RateLimit-Remaining` to 0 (never
    /// below) and the caller is refused until the window frees enough. The
    /// concurrency limit's slots are held, not spent, and are never
    /// settled; what the other strategies do is in
    /// [`Store::settle`](crate::Store::settle). On Redis a settle is one
    /// `EVALSHA` of the strategy's refund script, sent only when the
    /// actual cost differs from the estimate.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use std::num::NonZeroU32;
    /// use axum::{body::Body, extract::connect_info::MockConnectInfo, http::Request, routing::get, Router};
    /// use tower::ServiceExt;
    /// use tollgate::{Policy, Quota, RateLimitLayer};
    ///
    /// // Tokens per minute, settled from a header the upstream model sent.
    /// let layer = RateLimitLayer::builder()
    ///     .policy(Policy::fixed_window("tokens", Quota::per_minute(NonZeroU32::new(1_000).unwrap())))
    ///     .cost(|_| 100) // the estimate
    ///     .settle_cost(|head| head.headers.get("x-tokens-used")?.to_str().ok()?.parse().ok())
    ///     .build()
    ///     .unwrap();
    /// let app = Router::new()
    ///     .route("/", get(|| async { ([("x-tokens-used", "400")], "a long answer") }))
    ///     .layer(layer)
    ///     .layer(MockConnectInfo(std::net::SocketAddr::from(([127, 0, 0, 1], 1))));
    ///
    /// let res = app.oneshot(Request::get("/").body(Body::empty()).unwrap()).await.unwrap();
    /// assert_eq!(res.headers()["x-ratelimit-remaining"], "600");
    /// # }
    /// ```
    pub fn settle_cost(
        mut self,
        actual: impl Fn(&http::response::Parts) -> Option<u64> + Send + Sync + 'static,
    ) -> Self {
        self.settle_cost = Some(Arc::new(actual));
        self
    }

    /// Which rate-limit header dialects to send.
    pub fn headers(mut self, headers: RateLimitHeaders) -> Self {
        self.headers = headers;
        self
    }

    /// Shadow mode, for rolling a limit out safely: every request is decided,
    /// counted and given its headers as usual, but none is refused by the
    /// limit. Watch the `shadow_limited` outcome of `tollgate_decisions_total`
    /// (feature `metrics`) and the debug events, then turn it off.
    ///
    /// - An over-limit request reaches your handler with
    ///   `X-RateLimit-Remaining: 0` and no `Retry-After`; the [`Decision`](crate::Decision) in
    ///   its extensions (with [`decision_extension`](Self::decision_extension))
    ///   says `allowed: false`. Like any rejection it was
    ///   **not charged**, so the store's counts are exactly those the
    ///   enforced limit would have produced.
    /// - A request without a key passes (no headers) instead of getting the
    ///   key-error status; a store failure under [`FailurePolicy::Closed`]
    ///   fails open instead.
    /// - Deny-lists are still enforced: they are deliberate, not a limit
    ///   being tried out.
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
    ///     .shadow(true)
    ///     .build()
    ///     .unwrap();
    /// let app = Router::new()
    ///     .route("/", get(|| async { "hello" }))
    ///     .layer(layer)
    ///     .layer(MockConnectInfo(std::net::SocketAddr::from(([127, 0, 0, 1], 1))));
    ///
    /// let _ = app.clone().oneshot(Request::get("/").body(Body::empty()).unwrap()).await.unwrap();
    /// let over = app.oneshot(Request::get("/").body(Body::empty()).unwrap()).await.unwrap();
    /// assert_eq!(over.status(), 200); // would have been 429
    /// assert_eq!(over.headers()["x-ratelimit-remaining"], "0");
    /// # }
    /// ```
    pub fn shadow(mut self, on: bool) -> Self {
        self.shadow = on;
        self
    }

    /// Puts each admitted request's [`Decision`](crate::Decision) in its
    /// extensions, for handlers to read (`Extension<Decision>`): how long a
    /// leaky bucket made it wait, what is left, whether shadow mode would
    /// have refused it. Off by default: it costs every request an
    /// allocation, and the response's headers already carry the numbers.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use std::num::NonZeroU32;
    /// use axum::{body::Body, extract::connect_info::MockConnectInfo, http::Request, routing::get, Extension, Router};
    /// use tower::ServiceExt;
    /// use tollgate::{Decision, Policy, Quota, RateLimitLayer};
    ///
    /// let layer = RateLimitLayer::builder()
    ///     .policy(Policy::fixed_window("core", Quota::per_minute(NonZeroU32::new(10).unwrap())))
    ///     .decision_extension(true)
    ///     .build()
    ///     .unwrap();
    /// let app = Router::new()
    ///     .route("/", get(|Extension(d): Extension<Decision>| async move { d.remaining.to_string() }))
    ///     .layer(layer)
    ///     .layer(MockConnectInfo(std::net::SocketAddr::from(([127, 0, 0, 1], 1))));
    ///
    /// let res = app.oneshot(Request::get("/").body(Body::empty()).unwrap()).await.unwrap();
    /// let body = axum::body::to_bytes(res.into_body(), 16).await.unwrap();
    /// assert_eq!(&body[..], b"9");
    /// # }
    /// ```
    pub fn decision_extension(mut self, on: bool) -> Self {
        self.decision_extension = on;
        self
    }

    /// Lets requests for which `allow` returns true through untouched: no
    /// store call, no charge, no headers. Health checks, internal callers.
    /// May be called several times; any match allows. Deny-lists win.
    ///
    /// ```
    /// use std::num::NonZeroU32;
    /// use tollgate::{Policy, Quota, RateLimitLayer};
    ///
    /// let layer = RateLimitLayer::builder()
    ///     .policy(Policy::fixed_window("core", Quota::per_minute(NonZeroU32::new(60).unwrap())))
    ///     .allow(|parts| parts.uri.path() == "/healthz")
    ///     .allow(|parts| parts.headers.contains_key("x-internal-token")) // checked by an earlier layer
    ///     .build();
    /// assert!(layer.is_ok());
    /// ```
    pub fn allow(mut self, allow: impl Fn(&Parts) -> bool + Send + Sync + 'static) -> Self {
        self.access.allow(Arc::new(allow));
        self
    }

    /// Lets requests from these networks (`"10.0.0.0/8"`, `"::1"`) through
    /// untouched, like [`allow`](Self::allow). Matched against the address
    /// [`cidr_address`](Self::cidr_address) finds: by default the TCP peer,
    /// which behind a proxy is the proxy. An invalid network fails
    /// [`build`](Self::build).
    ///
    /// ```
    /// use std::num::NonZeroU32;
    /// use tollgate::{Policy, Quota, RateLimitLayer};
    ///
    /// let policy = Policy::fixed_window("core", Quota::per_minute(NonZeroU32::new(60).unwrap()));
    /// let ok = RateLimitLayer::builder().policy(policy.clone()).allow_cidrs(["10.0.0.0/8", "::1"]).build();
    /// assert!(ok.is_ok());
    /// let bad = RateLimitLayer::builder().policy(policy).allow_cidrs(["10.0.0.0/33"]).build();
    /// assert!(bad.unwrap_err().to_string().contains("10.0.0.0/33"));
    /// ```
    pub fn allow_cidrs<I, S>(mut self, networks: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        self.access.allow_networks(networks);
        self
    }

    /// Refuses requests for which `deny` returns true, before the store is
    /// asked: the [limited status](Self::limited_status) and a JSON message,
    /// without rate-limit headers or `Retry-After`. Enforced in
    /// [shadow mode](Self::shadow) too. May be called several times; any
    /// match denies.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use std::num::NonZeroU32;
    /// use axum::{body::Body, extract::connect_info::MockConnectInfo, http::Request, routing::get, Router};
    /// use tower::ServiceExt;
    /// use tollgate::{Policy, Quota, RateLimitLayer};
    ///
    /// let layer = RateLimitLayer::builder()
    ///     .policy(Policy::fixed_window("core", Quota::per_minute(NonZeroU32::new(60).unwrap())))
    ///     .deny(|parts| parts.headers.get("user-agent").is_some_and(|ua| ua == "BadBot/1.0"))
    ///     .build()
    ///     .unwrap();
    /// let app = Router::new()
    ///     .route("/", get(|| async { "hello" }))
    ///     .layer(layer)
    ///     .layer(MockConnectInfo(std::net::SocketAddr::from(([127, 0, 0, 1], 1))));
    ///
    /// let bot = Request::get("/").header("user-agent", "BadBot/1.0").body(Body::empty()).unwrap();
    /// assert_eq!(app.oneshot(bot).await.unwrap().status(), 429);
    /// # }
    /// ```
    pub fn deny(mut self, deny: impl Fn(&Parts) -> bool + Send + Sync + 'static) -> Self {
        self.access.deny(Arc::new(deny));
        self
    }

    /// Refuses requests from these networks, like [`deny`](Self::deny).
    /// Matched against the address [`cidr_address`](Self::cidr_address)
    /// finds. An invalid network fails [`build`](Self::build).
    ///
    /// ```
    /// use std::num::NonZeroU32;
    /// use tollgate::{Policy, Quota, RateLimitLayer};
    ///
    /// let layer = RateLimitLayer::builder()
    ///     .policy(Policy::fixed_window("core", Quota::per_minute(NonZeroU32::new(60).unwrap())))
    ///     .deny_cidrs(["203.0.113.0/24", "2001:db8:bad::/48"])
    ///     .build();
    /// assert!(layer.is_ok());
    /// ```
    pub fn deny_cidrs<I, S>(mut self, networks: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        self.access.deny_networks(networks);
        self
    }

    /// Where the network lists of [`allow_cidrs`](Self::allow_cidrs) and
    /// [`deny_cidrs`](Self::deny_cidrs) find the client's address. The
    /// default, [`PeerIp`], is the TCP peer. Behind reverse proxies use
    /// [`ForwardedIp`](crate::ForwardedIp), which reads `X-Forwarded-For`
    /// only from your proxies; never trust that header from anyone else, or
    /// any client can claim an allow-listed address. A request whose address
    /// cannot be found matches no network.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use std::{net::SocketAddr, num::NonZeroU32};
    /// use axum::{body::Body, extract::connect_info::MockConnectInfo, http::Request, routing::get, Router};
    /// use tower::ServiceExt;
    /// use tollgate::{ForwardedIp, Policy, Quota, RateLimitLayer};
    ///
    /// let proxies = ForwardedIp::trusting(["10.0.0.0/8"]).unwrap();
    /// let layer = RateLimitLayer::builder()
    ///     .policy(Policy::fixed_window("core", Quota::per_minute(NonZeroU32::new(60).unwrap())))
    ///     .key(proxies.clone())
    ///     .deny_cidrs(["203.0.113.0/24"])
    ///     .cidr_address(proxies)
    ///     .build()
    ///     .unwrap();
    /// let app = Router::new()
    ///     .route("/", get(|| async { "hello" }))
    ///     .layer(layer)
    ///     .layer(MockConnectInfo(SocketAddr::from(([10, 0, 0, 1], 443)))); // our proxy
    ///
    /// let via_proxy = Request::get("/").header("x-forwarded-for", "203.0.113.7").body(Body::empty()).unwrap();
    /// assert_eq!(app.oneshot(via_proxy).await.unwrap().status(), 429);
    /// # }
    /// ```
    pub fn cidr_address(mut self, source: impl ClientIp) -> Self {
        self.access.address(Arc::new(source));
        self
    }

    #[cfg(feature = "throttle")]
    /// Throttling mode: while more callers are active than the throttle's
    /// threshold, callers new to the window get `limited_status` (429) with
    /// `Retry-After`, before any store call; those in a session go on to the
    /// policy as usual. Keep the throttle's [`SyncTask`](crate::throttle::SyncTask)
    /// running. See [`Throttle`](crate::throttle::Throttle).
    ///
    /// An option here rather than a layer of its own, so the gate and the
    /// limit identify a caller once, with one key extractor, and answer in
    /// one style; the gate itself lives in `throttle/`.
    ///
    /// ```
    /// use std::num::NonZeroU32;
    /// use tollgate::{Policy, Quota, RateLimitLayer};
    /// use tollgate::throttle::Throttle;
    ///
    /// let throttle = Throttle::builder("sessions").threshold(50_000).build().unwrap();
    /// let layer = RateLimitLayer::builder()
    ///     .policy(Policy::fixed_window("core", Quota::per_minute(NonZeroU32::new(600).unwrap())))
    ///     .throttle(throttle.clone())
    ///     .build()
    ///     .unwrap();
    /// ```
    pub fn throttle(mut self, throttle: crate::throttle::Throttle) -> Self {
        self.local.set_throttle(throttle);
        self
    }

    /// Rejects keys the store has found exhausted in this process until they
    /// free up, without a store call and with the same response. Off by
    /// default. See [`LocalCache`](super::LocalCache) for which strategies
    /// use it and its sharp edges.
    pub fn local_cache(mut self, cache: crate::local::LocalCache) -> Self {
        self.local.set_cache(cache);
        self
    }

    /// `store` unless a store was given: how a tiered layer's tiers share one.
    pub(crate) fn or_store(mut self, store: &Arc<dyn Store>) -> Self {
        self.store.get_or_insert_with(|| store.clone());
        self
    }

    /// The layer, or why this configuration cannot work.
    pub fn build(self) -> Result<RateLimitLayer, ConfigError> {
        let policy = self.policy.ok_or(ConfigError::NoPolicy)?;
        policy.validate()?;
        if self.deadline.is_zero() {
            return Err(ConfigError::DeadlineZero { what: "store" });
        }
        for (what, status) in [
            ("limited", self.limited_status),
            ("key error", self.key_error_status),
        ] {
            if !(status.is_client_error() || status.is_server_error()) {
                return Err(ConfigError::StatusNotAnError { what, status });
            }
        }
        if let Some(limits) = &self.request_limit {
            if limits.min == 0 || limits.min > limits.max {
                return Err(ConfigError::RequestLimits {
                    min: limits.min,
                    max: limits.max,
                });
            }
            for bound in [limits.min, limits.max] {
                policy.with_request_limit(bound).validate()?;
            }
        }
        let access = self.access.validate()?;
        // The fallback starts from what the main store last said (see
        // `Limiter::seed`); held charges (a concurrency limit's slots) are
        // given back to the store that took them, so its fallback starts
        // empty; a store in this process never fails over, so nothing is
        // recorded for it.
        let learned = (matches!(self.failure, FailurePolicy::Local(_))
            && !policy.strategy().holds_until_response_ends()
            && !self.store.as_ref().is_none_or(|store| store.in_process()))
        .then(|| Learned::new(seed::CAPACITY));
        let running = Running::new(self.local.gating(&policy), learned);
        Ok(RateLimitLayer {
            limiter: Arc::new(Limiter {
                config: Config {
                    metrics: PolicyMetrics::new(&policy),
                    headers: PolicyHeaders::new(self.headers, &policy),
                    holds_until_response_ends: policy.strategy().holds_until_response_ends(),
                    as_built: policy,
                    store: self.store.unwrap_or_else(|| Arc::new(MemoryStore::new())),
                    key: self.key.unwrap_or_else(|| Arc::new(PeerIp::new())),
                    cost: self.cost,
                    request_limit: self.request_limit,
                    deadline: self.deadline,
                    failure: self.failure,
                    limited_status: self.limited_status,
                    key_error_status: self.key_error_status,
                    #[cfg(feature = "grpc")]
                    grpc_limited: self.grpc_limited,
                    refund_when: self.refund_when,
                    settle_cost: self.settle_cost,
                    shadow: self.shadow,
                    decision_extension: self.decision_extension,
                    access,
                    cooldown: self.cooldown,
                },
                running,
            }),
        })
    }
}

#[cfg(test)]
mod tests {
    use std::num::NonZeroU32;

    use super::*;
    use crate::decision::{Decision, Receipt};
    use crate::error::StoreError;
    use crate::key::Key;
    use crate::quota::Quota;
    use crate::store::BoxFuture;

    /// A store out of this process, as far as the layer can tell.
    #[derive(Debug)]
    struct Remote(MemoryStore);

    impl Store for Remote {
        fn check<'a>(
            &'a self,
            policy: &'a Policy,
            key: &'a Key,
            cost: u64,
        ) -> BoxFuture<'a, Result<Decision, StoreError>> {
            self.0.check(policy, key, cost)
        }

        fn peek<'a>(
            &'a self,
            policy: &'a Policy,
            key: &'a Key,
        ) -> BoxFuture<'a, Result<Decision, StoreError>> {
            self.0.peek(policy, key)
        }

        fn refund<'a>(
            &'a self,
            policy: &'a Policy,
            key: &'a Key,
            receipt: &'a Receipt,
        ) -> BoxFuture<'a, Result<(), StoreError>> {
            self.0.refund(policy, key, receipt)
        }
    }

    #[test]
    fn only_a_store_that_can_fail_over_is_remembered_for_the_fallback() {
        let policy = Policy::fixed_window("core", Quota::per_minute(NonZeroU32::MIN));
        let layer = |store: Arc<dyn Store>| {
            RateLimitLayer::builder()
                .policy(policy.clone())
                .shared_store(store)
                .build()
                .unwrap()
        };
        let memory = layer(Arc::new(MemoryStore::new()));
        assert!(
            memory.limiter.running.learned.is_none(),
            "the memory store never fails over"
        );
        let remote = layer(Arc::new(Remote(MemoryStore::new())));
        assert!(remote.limiter.running.learned.is_some());
        let default = RateLimitLayer::builder().policy(policy).build().unwrap();
        assert!(
            default.limiter.running.learned.is_none(),
            "the default store is in memory"
        );
    }
}
