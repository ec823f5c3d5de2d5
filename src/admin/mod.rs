//! An admin API over your limits: an axum [`Router`] that serves JSON for
//! every policy and tier you give it, so an operator can read a policy,
//! give a caller its own quotas, block or unblock it, reset it and peek at
//! it, on every app server at once (the changes live in the store).
//!
//! **It has no authentication of its own.** Whoever reaches it can lift
//! any caller's limit: mount it behind your own authentication layer, as
//! below, and never on a public listener without one.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! use std::num::NonZeroU32;
//! use axum::{body::Body, http::{Request, StatusCode}, middleware::{self, Next}, response::Response, Router};
//! use tollgate::{admin::AdminApi, key::Caller, HeaderKey, MemoryStore, Policy, Quota, RateLimitLayer};
//! use tower::ServiceExt;
//!
//! let api_limit = RateLimitLayer::builder()
//!     .policy(Policy::fixed_window("api", Quota::per_hour(NonZeroU32::new(100).unwrap())).overridable())
//!     .key(HeaderKey::new("x-api-key"))
//!     .store(MemoryStore::new()) // or a RedisStore: every server sees the change
//!     .build()
//!     .unwrap();
//!
//! // Your authentication, in front of the whole API.
//! async fn operators_only(request: axum::extract::Request, next: Next) -> Result<Response, StatusCode> {
//!     let sent = request.headers().get("authorization").and_then(|v| v.to_str().ok());
//!     if sent != Some("Bearer operator-token") {
//!         return Err(StatusCode::FORBIDDEN);
//!     }
//!     Ok(next.run(request).await)
//! }
//! let admin = AdminApi::new()
//!     .layer(&api_limit)
//!     .header_alias("api_key", "x-api-key") // ?api_key=.. names the x-api-key header
//!     .router()
//!     .layer(middleware::from_fn(operators_only));
//! let app: Router = Router::new().nest("/admin", admin); // beside your routes, under `api_limit`
//!
//! // Acme gets 5,000 an hour, named as its requests name it.
//! let raise = |token: &str| {
//!     Request::put("/admin/policies/api/overrides/caller?api_key=acme-key")
//!         .header("authorization", format!("Bearer {token}"))
//!         .body(Body::from(r#"{"limit": 5000}"#))
//!         .unwrap()
//! };
//! assert_eq!(app.clone().oneshot(raise("guess")).await.unwrap().status(), StatusCode::FORBIDDEN);
//! assert_eq!(app.clone().oneshot(raise("operator-token")).await.unwrap().status(), StatusCode::OK);
//! let acme = api_limit.key_of(&Caller::new().header("x-api-key", "acme-key").unwrap()).unwrap();
//! assert_eq!(api_limit.limiter().peek(&acme).await.unwrap().limit, 5_000);
//! # }
//! ```
//!
//! # Routes
//!
//! | route | does | Redis |
//! |---|---|---|
//! | `GET /policies`, `GET /policies/{policy}` | the policies as built (strategy, quotas, overridable, penalty box) and an adjustable one's runtime limit and cap | the list: 1 `EVALSHA` (`HGETALL` of the hash all runtime limits live in) per store its policies share, within the deadline; a policy whose read failed shows `"runtime_error"` and other stores' policies are answered. One policy: 1 `EVALSHA` |
//! | `GET /policies/{policy}/overrides` | every override in force, by the caller's key as stored | 1 `EVALSHA` |
//! | `GET`, `PUT`, `DELETE /policies/{policy}/overrides/caller?..` | the caller's override: read, set (`{"limit": N}` or `{"quotas": [..]}`, optionally `"until"`), clear | 1, 3, 3 `EVALSHA` |
//! | `PUT`, `DELETE /policies/{policy}/block?..` | block the caller (`{"seconds": N}`), unblock it (counters kept) | 1 `EVALSHA` |
//! | `POST /policies/{policy}/reset?..` | forget the caller's counters and block | 1 `EVALSHA` |
//! | `GET /policies/{policy}/peek?..` | the caller's state, charging nothing; used up or blocked, the `Retry-After` and reset a request would be told | 1 `EVALSHA_RO`, 2 when used up |
//! | `PUT`, `DELETE /policies/{policy}/limit` | the runtime limit for every caller of an adjustable policy: set (as an override's body), clear | 1, 2 `EVALSHA` |
//! | `PUT`, `DELETE /policies/{policy}/cap` | the cap nothing exceeds, an override included: set (the policy's windows), clear | 1, 2 `EVALSHA` |
//! | `GET /openapi.json` | the OpenAPI 3.1 description of these routes | nothing |
//!
//! A caller is named as the policy's key extractor sees it, never by its
//! stored key: `?ip=203.0.113.9`, `?route=/search`,
//! `?header.x-api-key=acme`, or an alias ([`AdminApi::header_alias`]);
//! the API builds the key with [`RateLimiter::key_of`], hashing an API key
//! and grouping an IPv6 address exactly as for a request.
//!
//! # Errors
//!
//! Every error is JSON, `{"error": {"field": "limit", "message": ".."}}`
//! ([`ApiError`]), and a refused request stores nothing: `400` for bad
//! input (a limit of 0, negative, fractional, above 4294967295 or a string;
//! an end in the past; a bad address; `{` or `}` in a caller; no caller),
//! `404` for an unknown policy, `409` for a policy that takes no overrides
//! or has no penalty box, `413` for a body over the limit (16 KiB). A
//! write the store did not confirm answers `504` when it may have landed
//! (a timeout, a broken connection, a step refused after an earlier one
//! landed: `"applied": "unknown"`; every write is idempotent, so repeat
//! it) and `503` with `"applied": false` only when nothing can have been
//! written (the store refused the first step, or the connection was
//! refused). Whatever became of a write, the overrides listed are the ones
//! requests meet.

mod body;
mod caller;
mod error;
mod extract;
mod openapi;
mod routes;
mod view;

use std::collections::BTreeMap;
use std::fmt;
use std::ops::Deref;
use std::sync::Arc;

use axum::extract::DefaultBodyLimit;
use axum::Router;

pub use self::error::ApiError;
use crate::layer::RateLimitLayer;
use crate::rate_limiter::RateLimiter;
use crate::tier::TieredLayer;

/// The largest body the API reads by default: 16 KiB.
const BODY_LIMIT: usize = 16 * 1024;

/// Builds the admin API's [`Router`] over the policies it is given; see
/// the [module](self) for the routes and an example.
///
/// ```
/// use std::num::NonZeroU32;
/// use tollgate::{admin::AdminApi, Policy, Quota, RateLimitLayer, TieredLayer};
///
/// let per_hour = |n| Quota::per_hour(NonZeroU32::new(n).unwrap());
/// let search = RateLimitLayer::builder().policy(Policy::fixed_window("search", per_hour(30))).build().unwrap();
/// let tiers = TieredLayer::builder()
///     .tier(RateLimitLayer::builder().policy(Policy::fixed_window("free", per_hour(60))))
///     .tier(RateLimitLayer::builder().policy(Policy::fixed_window("pro", per_hour(5000)).overridable()))
///     .choose(|parts| Some(if parts.headers.contains_key("x-api-key") { "pro" } else { "free" }))
///     .build()
///     .unwrap();
/// let admin: axum::Router = AdminApi::new().layer(&search).tiers(&tiers).router();
/// # let _ = admin;
/// ```
#[derive(Clone, Default)]
pub struct AdminApi {
    policies: BTreeMap<String, RateLimiter>,
    aliases: caller::Aliases,
    body_limit: Option<usize>,
}

impl fmt::Debug for AdminApi {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AdminApi")
            .field("policies", &self.policies.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

impl AdminApi {
    /// An API serving no policy yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Serves `layer`'s policy, through its [`limiter`](RateLimitLayer::limiter):
    /// the same store, key extractor and fallback as the layer's requests.
    ///
    /// # Panics
    ///
    /// If a policy of the same name was given before: the routes name
    /// policies by name.
    pub fn layer(self, layer: &RateLimitLayer) -> Self {
        self.limiter(layer.limiter())
    }

    /// Serves every tier of `tiered`, each under its policy's name.
    ///
    /// # Panics
    ///
    /// As [`layer`](Self::layer), if a tier's name was given before.
    pub fn tiers(mut self, tiered: &TieredLayer) -> Self {
        let names: Vec<String> = tiered.tiers().map(|p| p.name().to_owned()).collect();
        for name in names {
            if let Some(limiter) = tiered.limiter(&name) {
                self = self.limiter(limiter);
            }
        }
        self
    }

    /// Serves `limiter`'s policy. A limiter built alone
    /// ([`RateLimiter::new`]) has no key extractor, so the routes that name
    /// a caller answer `400` for it; take limiters from layers.
    ///
    /// # Panics
    ///
    /// As [`layer`](Self::layer), if its policy's name was given before.
    pub fn limiter(mut self, limiter: RateLimiter) -> Self {
        let name = limiter.policy().name().to_owned();
        assert!(
            !self.policies.contains_key(&name),
            "AdminApi: policy {name:?} given twice; the routes name policies by name"
        );
        self.policies.insert(name, limiter);
        self
    }

    /// Lets the query name the header `header` as `name`: with
    /// `header_alias("api_key", "x-api-key")`, `?api_key=acme` is
    /// `?header.x-api-key=acme`. `openapi.json` lists it.
    ///
    /// # Panics
    ///
    /// If `header` is not a header name, or `name` is empty, `ip`,
    /// `route`, an alias given before, or starts with `header.`.
    ///
    /// ```
    /// use tollgate::admin::AdminApi;
    /// let admin: axum::Router = AdminApi::new().header_alias("api_key", "x-api-key").router();
    /// # let _ = admin;
    /// ```
    pub fn header_alias(mut self, name: &str, header: &str) -> Self {
        self.aliases.add(name, header);
        self
    }

    /// The largest body a route reads (16 KiB by default); a larger one is
    /// a `413`.
    pub fn body_limit(mut self, bytes: usize) -> Self {
        self.body_limit = Some(bytes);
        self
    }

    /// The router, to nest where you like (`Router::nest("/admin", ..)`)
    /// behind your authentication. Its paths are in the [module](self)'s
    /// table; any other answers a JSON `404` (`405` for a method a path
    /// does not take).
    pub fn router<S: Clone + Send + Sync + 'static>(self) -> Router<S> {
        let body_limit = self.body_limit.unwrap_or(BODY_LIMIT);
        let api = Api(Arc::new(Inner {
            openapi: openapi::document_with(&self.aliases),
            policies: self.policies,
            aliases: self.aliases,
            body_limit,
        }));
        let mut router = Router::new();
        for route in routes::table() {
            router = router.route(route.path, route.handler);
        }
        router
            .fallback(routes::no_route)
            .method_not_allowed_fallback(routes::wrong_method)
            .layer(DefaultBodyLimit::max(body_limit))
            .with_state(api)
    }
}

/// What every route reads: the policies by name, how callers are named,
/// the body limit and the document served.
#[derive(Clone)]
struct Api(Arc<Inner>);

struct Inner {
    policies: BTreeMap<String, RateLimiter>,
    aliases: caller::Aliases,
    body_limit: usize,
    openapi: String,
}

impl Deref for Api {
    type Target = Inner;

    fn deref(&self) -> &Inner {
        &self.0
    }
}
