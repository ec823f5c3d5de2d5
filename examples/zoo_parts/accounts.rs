//! The zoo's routes for limits a layer cannot see, counted with the
//! [`RateLimiter`] handle: a login that charges only failed attempts, and
//! the operator's routes that reset a caller and change its limit.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Query, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{post, put};
use axum::{Json, Router};
use serde_json::json;
use tollgate::{
    AdminError, Caller, Decision, Key, KeyExtractor, Override, Policy, Quota, RateLimitLayer,
    RateLimiter, Store,
};

use super::env_or;

/// The zoo keeper's password; any other is a failed attempt.
const PASSWORD: &str = "stripes";

/// What the two routes need.
pub struct AccountSettings {
    failed_logins: Quota,
    admin_token: Option<String>,
}

impl AccountSettings {
    /// `ZOO_LOGIN_FAILURES` (3) failed logins per `ZOO_LOGIN_WINDOW_SECS`
    /// (60) per caller; `ZOO_ADMIN_TOKEN` turns the admin route on.
    pub fn from_env() -> Result<Self, String> {
        let window = Duration::from_secs(env_or("ZOO_LOGIN_WINDOW_SECS", 60)?);
        let failed_logins = Quota::new(env_or("ZOO_LOGIN_FAILURES", 3)?, window)
            .map_err(|e| format!("ZOO_LOGIN_FAILURES: {e}"))?;
        let admin_token = std::env::var("ZOO_ADMIN_TOKEN")
            .ok()
            .filter(|t| !t.trim().is_empty());
        Ok(Self {
            failed_logins,
            admin_token,
        })
    }

    /// Lines for the start-up banner.
    pub fn describe(&self) -> Vec<String> {
        vec![
            format!(
                "POST /login: {} failed attempts per {:?} per caller (X-Password: {PASSWORD} succeeds)",
                self.failed_logins.limit(),
                self.failed_logins.window()
            ),
            match &self.admin_token {
                Some(_) => "POST /admin/reset?ip=..|api_key=..: resets a caller (Authorization: Bearer $ZOO_ADMIN_TOKEN)".into(),
                None => "POST /admin/reset: off (set ZOO_ADMIN_TOKEN)".into(),
            },
            match &self.admin_token {
                Some(_) => "PUT|DELETE /admin/limits?ip=..|api_key=..: {\"limit\": N, \"until\": unix secs} overrides /tigerfeeding's quota for a caller".into(),
                None => "PUT|DELETE /admin/limits: off (set ZOO_ADMIN_TOKEN)".into(),
            },
        ]
    }
}

#[derive(Clone)]
struct Accounts {
    failed_logins: RateLimiter,
    key: Arc<dyn KeyExtractor>,
    /// Every limit the admin route resets, failed logins included.
    resettable: Arc<[RateLimiter]>,
    /// The limit `/admin/limits` overrides: `/tigerfeeding`'s.
    overridable: RateLimiter,
    admin_token: Option<Arc<str>>,
}

/// `POST /login` and `POST /admin/reset`, over `store` and the zoo's caller
/// key; the admin route resets `limits` and the failed logins.
pub fn routes<S: Clone + Send + Sync + 'static>(
    settings: &AccountSettings,
    store: Arc<dyn Store>,
    key: Arc<dyn KeyExtractor>,
    limits: Vec<RateLimiter>,
    overridable: RateLimiter,
) -> Result<Router<S>, String> {
    let failed_logins = RateLimitLayer::builder()
        .policy(Policy::fixed_window(
            "failed-logins",
            settings.failed_logins,
        ))
        .shared_store(store)
        .key(key.clone())
        .build()
        .map_err(|e| format!("failed logins: {e}"))?
        .limiter();
    let resettable = limits.into_iter().chain([failed_logins.clone()]).collect();
    let accounts = Accounts {
        failed_logins,
        key,
        resettable,
        overridable,
        admin_token: settings.admin_token.as_deref().map(Arc::from),
    };
    Ok(Router::new()
        .route("/login", post(login))
        .route("/admin/reset", post(reset))
        .route("/admin/limits", put(set_limit).delete(clear_limit))
        .with_state(accounts))
}

/// A caller locked out by failed attempts gets 429 before the password is
/// looked at; a failed attempt is charged; a success costs nothing.
async fn login(State(accounts): State<Accounts>, parts: Parts) -> Response {
    let key = match accounts.key.extract(&parts) {
        Ok(key) => key,
        Err(err) => return (StatusCode::BAD_REQUEST, err.to_string()).into_response(),
    };
    let limiter = &accounts.failed_logins;
    match limiter.peek(&key).await {
        Ok(state) if state.remaining == 0 => return locked_out(&state),
        Ok(_) => {}
        Err(err) => return unavailable(&err),
    }
    let password = parts.headers.get("x-password").map(|v| v.as_bytes());
    if password == Some(PASSWORD.as_bytes()) {
        return Json(json!({ "message": "welcome, keeper" })).into_response();
    }
    match limiter.check(&key, 1).await {
        Ok(failure) if failure.allowed => (
            StatusCode::UNAUTHORIZED,
            Json(json!({
                "message": "wrong password",
                "attempts_left": failure.remaining,
            })),
        )
            .into_response(),
        Ok(rejected) => locked_out(&rejected),
        Err(err) => unavailable(&err),
    }
}

fn locked_out(state: &Decision) -> Response {
    let retry = state.reset_epoch_secs().saturating_sub(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
    );
    (
        StatusCode::TOO_MANY_REQUESTS,
        [("retry-after", retry.max(1).to_string())],
        Json(json!({ "message": "too many failed logins", "reset": state.reset_epoch_secs() })),
    )
        .into_response()
}

fn unavailable(err: &tollgate::StoreError) -> Response {
    let body = Json(json!({ "message": format!("rate limit store unavailable: {err}") }));
    (StatusCode::SERVICE_UNAVAILABLE, body).into_response()
}

/// Whom to reset: the address or the API key the caller sends.
struct Whom {
    ip: Option<IpAddr>,
    api_key: Option<String>,
}

impl Whom {
    fn from_query(query: &HashMap<String, String>) -> Result<Self, String> {
        let ip = match query.get("ip") {
            Some(ip) => Some(
                ip.parse()
                    .map_err(|_| format!("ip={ip:?} is not an address"))?,
            ),
            None => None,
        };
        Ok(Self {
            ip,
            api_key: query.get("api_key").cloned(),
        })
    }
}

/// The caller an admin request names, once its token is checked; or the
/// response refusing it (404 when the admin routes are off, 403 without
/// the token, 400 without a caller).
fn admitted(
    accounts: &Accounts,
    headers: &HeaderMap,
    query: &HashMap<String, String>,
) -> Result<Key, (StatusCode, String)> {
    let Some(token) = &accounts.admin_token else {
        return Err((
            StatusCode::NOT_FOUND,
            "the admin route is off: set ZOO_ADMIN_TOKEN".into(),
        ));
    };
    let sent = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    if sent.map(str::as_bytes) != Some(token.as_bytes()) {
        return Err((StatusCode::FORBIDDEN, "wrong or missing admin token".into()));
    }
    Whom::from_query(query)
        .and_then(|whom| caller(accounts, &whom))
        .map_err(|why| (StatusCode::BAD_REQUEST, why))
}

/// The operator's unblock: resets the caller named by `ip` or `api_key` in
/// every zoo limit, keyed exactly as the limits key its requests.
async fn reset(
    State(accounts): State<Accounts>,
    headers: HeaderMap,
    Query(query): Query<HashMap<String, String>>,
) -> Response {
    let key = match admitted(&accounts, &headers, &query) {
        Ok(key) => key,
        Err(refused) => return refused.into_response(),
    };
    let mut reset = Vec::new();
    for limiter in accounts.resettable.iter() {
        if let Err(err) = limiter.reset(&key).await {
            return unavailable(&err);
        }
        reset.push(limiter.policy().name().to_owned());
    }
    Json(json!({ "reset": reset })).into_response()
}

/// `PUT /admin/limits`: `{"limit": N}` (and `"until"`, Unix seconds)
/// becomes the caller's own quota on `/tigerfeeding`, its window kept.
async fn set_limit(
    State(accounts): State<Accounts>,
    headers: HeaderMap,
    Query(query): Query<HashMap<String, String>>,
    body: axum::body::Bytes,
) -> Response {
    let key = match admitted(&accounts, &headers, &query) {
        Ok(key) => key,
        Err(refused) => return refused.into_response(),
    };
    let window = accounts.overridable.policy().quotas()[0].window();
    let quotas = match override_of(&body, window) {
        Ok(quotas) => quotas,
        Err(why) => return (StatusCode::BAD_REQUEST, why).into_response(),
    };
    match accounts
        .overridable
        .set_override(&key, quotas.clone())
        .await
    {
        Ok(()) => Json(json!({
            "limit": quotas.quotas()[0].limit(),
            "window_secs": window.as_secs_f64(),
            "until": quotas.until_micros().map(|us| us / 1_000_000),
        }))
        .into_response(),
        Err(AdminError::Invalid(err)) => (StatusCode::BAD_REQUEST, err.to_string()).into_response(),
        Err(AdminError::Store(err)) => unavailable(&err),
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
    State(accounts): State<Accounts>,
    headers: HeaderMap,
    Query(query): Query<HashMap<String, String>>,
) -> Response {
    let key = match admitted(&accounts, &headers, &query) {
        Ok(key) => key,
        Err(refused) => return refused.into_response(),
    };
    match accounts.overridable.clear_override(&key).await {
        Ok(true) => Json(json!({ "cleared": true })).into_response(),
        Ok(false) => (StatusCode::NOT_FOUND, "that caller has no override").into_response(),
        Err(err) => unavailable(&err),
    }
}

/// The key the zoo's extractor gives a request from `whom`
/// (`KeyExtractor::key_of`): an address grouped and an API key hashed
/// exactly as on the limited routes.
fn caller(accounts: &Accounts, whom: &Whom) -> Result<Key, String> {
    let mut caller = Caller::new();
    if let Some(api_key) = &whom.api_key {
        caller = caller
            .header("x-api-key", api_key)
            .map_err(|e| format!("bad api_key: {e}"))?;
    } else if whom.ip.is_none() {
        return Err("name the caller: ?ip=.. or ?api_key=..".into());
    }
    if let Some(ip) = whom.ip {
        caller = caller.ip(ip);
    }
    accounts.key.key_of(&caller).map_err(|e| e.to_string())
}
