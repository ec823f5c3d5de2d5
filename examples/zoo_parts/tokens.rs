//! The zoo's route whose cost is known only when its response is done:
//! `GET /tokens/tigerfeeding?used=N`. The layer charges an estimate when a
//! request starts; the handler reports the units it really used in the
//! response's `ActualCost` extension, and the layer settles the charge to
//! them in one store call.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::RawQuery;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Extension, Json, Router};
use serde_json::json;
use tollgate::{ActualCost, KeyExtractor, Policy, Quota, RateLimitLayer, Store};

use super::env_or;

/// The most one request may report: a bound on what a typo (or a caller)
/// can charge at once.
const MOST_USED: u64 = 1_000_000;

/// `ZOO_TOKENS_LIMIT` (100) per `ZOO_TOKENS_WINDOW_SECS` (60) per caller,
/// `ZOO_TOKENS_ESTIMATE` (1) charged when a request starts.
pub struct TokenSettings {
    policy: Policy,
    estimate: u64,
}

impl TokenSettings {
    pub fn from_env() -> Result<Self, String> {
        let window = Duration::from_secs(env_or("ZOO_TOKENS_WINDOW_SECS", 60)?);
        let quota = Quota::new(env_or("ZOO_TOKENS_LIMIT", 100)?, window)
            .map_err(|e| format!("ZOO_TOKENS_LIMIT/ZOO_TOKENS_WINDOW_SECS: {e}"))?;
        let policy = Policy::fixed_window("tigerfeeding.tokens", quota);
        policy
            .validate()
            .map_err(|e| format!("/tokens/tigerfeeding: {e}"))?;
        Ok(Self {
            policy,
            estimate: env_or("ZOO_TOKENS_ESTIMATE", 1)?,
        })
    }

    /// The start-up banner's line.
    pub fn describe(&self) -> String {
        let q = self.policy.quotas()[0];
        format!(
            "/tokens/tigerfeeding?used=N: {} units per {:?} per caller, {} charged at the start, settled to N",
            q.limit(),
            q.window(),
            self.estimate
        )
    }
}

/// The route and the layer `/rate_limit` should peek with.
pub struct Tokens<S> {
    pub router: Router<S>,
    pub limit: RateLimitLayer,
}

pub fn routes<S: Clone + Send + Sync + 'static>(
    settings: &TokenSettings,
    store: Arc<dyn Store>,
    key: Arc<dyn KeyExtractor>,
) -> Result<Tokens<S>, String> {
    let estimate = settings.estimate;
    let limit = RateLimitLayer::builder()
        .headers(super::dialect())
        .policy(settings.policy.clone())
        .shared_store(store)
        .key(key)
        .cost(move |_| estimate)
        .build()
        .map_err(|e| format!("/tokens/tigerfeeding: {e}"))?;
    let router = Router::new().route("/tokens/tigerfeeding", get(feed).layer(limit.clone()));
    Ok(Tokens { router, limit })
}

/// Feeds the tigers `used` units and says so in `ActualCost`; a `used`
/// that is missing, not a whole number, negative or above [`MOST_USED`] is
/// a 400 that reports nothing, so only the estimate stays charged.
async fn feed(RawQuery(query): RawQuery) -> Response {
    let used = query
        .as_deref()
        .unwrap_or("")
        .split('&')
        .find_map(|pair| pair.strip_prefix("used="));
    let used = match used.map(|n| (n, n.parse::<u64>())) {
        Some((_, Ok(n))) if n <= MOST_USED => n,
        Some((_, Ok(n))) => return bad(format!("used={n} is more than {MOST_USED}")),
        Some((n, Err(_))) => {
            return bad(format!(
                "used={n:?} is not a whole number of units from 0 to {MOST_USED}"
            ))
        }
        None => return bad("give the units used as ?used=N".to_owned()),
    };
    let body = Json(json!({ "feeding": "tigers", "used": used }));
    (Extension(ActualCost(used)), body).into_response()
}

fn bad(message: String) -> Response {
    (StatusCode::BAD_REQUEST, Json(json!({ "message": message }))).into_response()
}
