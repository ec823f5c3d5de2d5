//! The zoo's operator routes under `/admin`, all behind `Authorization:
//! Bearer $ZOO_ADMIN_TOKEN` (403 without it; 404 when no token is set):
//! the crate's admin API (`tollgate::admin`) over every zoo limit, and the
//! two routes the zoo served before it, kept as they were for the scripts
//! that call them: `PUT|DELETE /admin/limits` (an override of
//! `/tigerfeeding`) and `POST /admin/reset` (every limit).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Query, Request, State};
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{post, put};
use axum::{Json, Router};
use serde_json::json;
use tollgate::admin::{AdminApi, ApiError};
use tollgate::{AdminError, Caller, Key, KeyExtractor, Override, Quota, RateLimiter};

/// `ZOO_ADMIN_TOKEN`: the operators' bearer token; no token, no routes.
pub struct AdminSettings {
    token: Option<String>,
}

impl AdminSettings {
    pub fn from_env() -> Self {
        let token = std::env::var("ZOO_ADMIN_TOKEN")
            .ok()
            .filter(|t| !t.trim().is_empty());
        Self { token }
    }

    /// Lines for the start-up banner.
    pub fn describe(&self) -> Vec<String> {
        match &self.token {
            Some(_) => vec![
                "/admin/policies/..: the admin API, described at /admin/openapi.json (Authorization: Bearer $ZOO_ADMIN_TOKEN)".into(),
                "POST /admin/reset?ip=..|api_key=..: resets a caller in every limit".into(),
                "PUT|DELETE /admin/limits?ip=..|api_key=..: {\"limit\": N, \"until\": unix secs} overrides /tigerfeeding's quota for a caller".into(),
            ],
            None => vec!["/admin/..: off (set ZOO_ADMIN_TOKEN)".into()],
        }
    }
}

/// What the two routes kept from before the admin API need.
#[derive(Clone)]
struct Legacy {
    key: Arc<dyn KeyExtractor>,
    /// Every limit `POST /admin/reset` resets.
    resettable: Arc<[RateLimiter]>,
    /// The limit `/admin/limits` overrides: `/tigerfeeding`'s.
    overridable: RateLimiter,
}

/// Everything under `/admin`: `api` (the crate's admin API, already given
/// the zoo's limits) and the routes kept from before it, behind the
/// token; or, without a token, a 404 for every path.
pub fn routes<S: Clone + Send + Sync + 'static>(
    settings: &AdminSettings,
    api: AdminApi,
    key: Arc<dyn KeyExtractor>,
    resettable: Vec<RateLimiter>,
    overridable: RateLimiter,
) -> Router<S> {
    let Some(token) = &settings.token else {
        let off = Router::new().fallback(|| async {
            (
                StatusCode::NOT_FOUND,
                "the admin route is off: set ZOO_ADMIN_TOKEN",
            )
        });
        return Router::new().nest("/admin", off);
    };
    let legacy = Legacy {
        key,
        resettable: resettable.into(),
        overridable,
    };
    let kept = Router::new()
        .route("/reset", post(reset))
        .route("/limits", put(set_limit).delete(clear_limit))
        .with_state(legacy);
    let admin = api
        .header_alias("api_key", "x-api-key")
        .router()
        .merge(kept)
        .layer(middleware::from_fn_with_state(
            Arc::<str>::from(token.as_str()),
            bearer_only,
        ));
    Router::new().nest("/admin", admin)
}

/// 403 unless the request carries `Authorization: Bearer <token>`.
async fn bearer_only(State(token): State<Arc<str>>, request: Request, next: Next) -> Response {
    let sent = request
        .headers()
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    if sent.map(str::as_bytes) != Some(token.as_bytes()) {
        return (StatusCode::FORBIDDEN, "wrong or missing admin token").into_response();
    }
    next.run(request).await
}

/// The operator's unblock: resets the caller named by `ip` or `api_key` in
/// every zoo limit, keyed exactly as the limits key its requests.
async fn reset(
    State(legacy): State<Legacy>,
    Query(query): Query<HashMap<String, String>>,
) -> Response {
    let key = match caller(&legacy, &query) {
        Ok(key) => key,
        Err(why) => return (StatusCode::BAD_REQUEST, why).into_response(),
    };
    let mut reset = Vec::new();
    for limiter in legacy.resettable.iter() {
        if let Err(err) = limiter.reset(&key).await {
            return ApiError::write_failed(&err).into_response();
        }
        reset.push(limiter.policy().name().to_owned());
    }
    Json(json!({ "reset": reset })).into_response()
}

/// `PUT /admin/limits`: `{"limit": N}` (and `"until"`, Unix seconds)
/// becomes the caller's own quota on `/tigerfeeding`, its window kept.
async fn set_limit(
    State(legacy): State<Legacy>,
    Query(query): Query<HashMap<String, String>>,
    body: axum::body::Bytes,
) -> Response {
    let key = match caller(&legacy, &query) {
        Ok(key) => key,
        Err(why) => return (StatusCode::BAD_REQUEST, why).into_response(),
    };
    let window = legacy.overridable.policy().quotas()[0].window();
    let quotas = match override_of(&body, window) {
        Ok(quotas) => quotas,
        Err(why) => return (StatusCode::BAD_REQUEST, why).into_response(),
    };
    match legacy.overridable.set_override(&key, quotas.clone()).await {
        Ok(()) => Json(json!({
            "limit": quotas.quotas()[0].limit(),
            "window_secs": window.as_secs_f64(),
            "until": quotas.until_micros().map(|us| us / 1_000_000),
        }))
        .into_response(),
        Err(AdminError::Invalid(err)) => (StatusCode::BAD_REQUEST, err.to_string()).into_response(),
        Err(AdminError::Store(err)) => ApiError::write_failed(&err).into_response(),
        Err(err) => (StatusCode::INTERNAL_SERVER_ERROR, err.to_string()).into_response(),
    }
}

/// The override a `PUT /admin/limits` body asks for.
fn override_of(body: &[u8], window: Duration) -> Result<Override, String> {
    let value: serde_json::Value =
        serde_json::from_slice(body).map_err(|e| format!("the body is not JSON: {e}"))?;
    let limit = value
        .get("limit")
        .ok_or("the body needs a \"limit\"")?
        .as_u64()
        .filter(|&n| n >= 1)
        .and_then(|n| u32::try_from(n).ok())
        .ok_or("\"limit\" must be a whole number from 1 to 4294967295")?;
    let quota = Quota::new(limit, window).map_err(|e| e.to_string())?;
    let mut quotas = Override::new(quota);
    if let Some(until) = value.get("until") {
        let secs = until
            .as_u64()
            .ok_or("\"until\" must be a time in Unix seconds")?;
        let at = std::time::UNIX_EPOCH
            .checked_add(Duration::from_secs(secs))
            .filter(|at| *at > std::time::SystemTime::now())
            .ok_or("\"until\" must be a time in the future, in Unix seconds")?;
        quotas = quotas.until(at);
    }
    Ok(quotas)
}

/// `DELETE /admin/limits`: the caller is judged by the policy again; 404
/// when it had no override.
async fn clear_limit(
    State(legacy): State<Legacy>,
    Query(query): Query<HashMap<String, String>>,
) -> Response {
    let key = match caller(&legacy, &query) {
        Ok(key) => key,
        Err(why) => return (StatusCode::BAD_REQUEST, why).into_response(),
    };
    match legacy.overridable.clear_override(&key).await {
        Ok(true) => Json(json!({ "cleared": true })).into_response(),
        Ok(false) => (StatusCode::NOT_FOUND, "that caller has no override").into_response(),
        Err(err) => ApiError::write_failed(&err).into_response(),
    }
}

/// The key the zoo's extractor gives a request from the caller the query
/// names (`?ip=..`, `?api_key=..`): an address grouped and an API key
/// hashed exactly as on the limited routes.
fn caller(legacy: &Legacy, query: &HashMap<String, String>) -> Result<Key, String> {
    let mut caller = Caller::new();
    if let Some(api_key) = query.get("api_key") {
        caller = caller
            .header("x-api-key", api_key)
            .map_err(|e| format!("bad api_key: {e}"))?;
    }
    match query.get("ip") {
        Some(ip) => {
            let ip: IpAddr = ip
                .parse()
                .map_err(|_| format!("ip={ip:?} is not an address"))?;
            caller = caller.ip(ip);
        }
        None if !query.contains_key("api_key") => {
            return Err("name the caller: ?ip=.. or ?api_key=..".into())
        }
        None => {}
    }
    legacy.key.key_of(&caller).map_err(|e| e.to_string())
}
