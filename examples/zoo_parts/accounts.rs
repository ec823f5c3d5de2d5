//! The zoo's login, a limit a layer cannot see, counted with the
//! [`RateLimiter`] handle: only failed attempts are charged.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::request::Parts;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use serde_json::json;
use tollgate::{Decision, KeyExtractor, Policy, Quota, RateLimitLayer, RateLimiter, Store};

use super::env_or;

/// The zoo keeper's password; any other is a failed attempt.
const PASSWORD: &str = "stripes";

/// The login's limit.
pub struct AccountSettings {
    failed_logins: Quota,
}

impl AccountSettings {
    /// `ZOO_LOGIN_FAILURES` (3) failed logins per `ZOO_LOGIN_WINDOW_SECS`
    /// (60) per caller.
    pub fn from_env() -> Result<Self, String> {
        let window = Duration::from_secs(env_or("ZOO_LOGIN_WINDOW_SECS", 60)?);
        let failed_logins = Quota::new(env_or("ZOO_LOGIN_FAILURES", 3)?, window)
            .map_err(|e| format!("ZOO_LOGIN_FAILURES: {e}"))?;
        Ok(Self { failed_logins })
    }

    /// A line for the start-up banner.
    pub fn describe(&self) -> String {
        format!(
            "POST /login: {} failed attempts per {:?} per caller (X-Password: {PASSWORD} succeeds)",
            self.failed_logins.limit(),
            self.failed_logins.window()
        )
    }
}

#[derive(Clone)]
struct Accounts {
    failed_logins: RateLimiter,
    key: Arc<dyn KeyExtractor>,
}

/// `POST /login` over `store` and the zoo's caller key, and its limit of
/// failed logins, for the operator's routes.
pub struct Login<S> {
    pub router: Router<S>,
    pub failed_logins: RateLimiter,
}

pub fn routes<S: Clone + Send + Sync + 'static>(
    settings: &AccountSettings,
    store: Arc<dyn Store>,
    key: Arc<dyn KeyExtractor>,
) -> Result<Login<S>, String> {
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
    let accounts = Accounts {
        failed_logins: failed_logins.clone(),
        key,
    };
    let router = Router::new()
        .route("/login", post(login))
        .with_state(accounts);
    Ok(Login {
        router,
        failed_logins,
    })
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
