//! The admin API's routes: one table of method, path and handler, which
//! the router is built from and `openapi.json` is checked against, and
//! the handlers, each a few lines over a [`RateLimiter`] call.

use std::time::SystemTime;

use axum::handler::Handler;
use axum::routing::{on, MethodFilter, MethodRouter};
use axum::Json;
use http::Method;

use super::body;
use super::error::ApiError;
use super::extract::{Body, Filtered, Named, NoQuery, Target};
use super::openapi;
use super::view::{self, Did};
use super::Api;
use crate::error::AdminError;
use crate::policy_limits::{PolicyLimit, PolicyLimits};
use crate::rate_limiter::RateLimiter;

/// One route: what it answers and who answers it.
pub(super) struct Route {
    /// Also in `handler`; kept to hold `openapi.json` to the table.
    #[cfg_attr(not(test), allow(dead_code))]
    pub method: Method,
    pub path: &'static str,
    pub handler: MethodRouter<Api>,
}

fn route<H, T>(method: Method, path: &'static str, handler: H) -> Route
where
    H: Handler<T, Api>,
    T: 'static,
{
    let filter = MethodFilter::try_from(method.clone()).expect("a method axum routes");
    Route {
        method,
        path,
        handler: on(filter, handler),
    }
}

/// Every route the API serves. A new one is a line here, its handler
/// below, and its operation in `openapi.json` (a test holds the two equal).
pub(super) fn table() -> Vec<Route> {
    const POLICY: &str = "/policies/{policy}";
    const OVERRIDE: &str = "/policies/{policy}/overrides/caller";
    vec![
        route(Method::GET, "/openapi.json", openapi::document),
        route(Method::GET, "/policies", list_policies),
        route(Method::GET, POLICY, get_policy),
        route(Method::GET, "/policies/{policy}/overrides", list_overrides),
        route(Method::GET, OVERRIDE, get_override),
        route(Method::PUT, OVERRIDE, set_override),
        route(Method::DELETE, OVERRIDE, clear_override),
        route(Method::PUT, "/policies/{policy}/block", block),
        route(Method::DELETE, "/policies/{policy}/block", unblock),
        route(Method::POST, "/policies/{policy}/reset", reset),
        route(Method::GET, "/policies/{policy}/peek", peek),
        route(Method::PUT, "/policies/{policy}/limit", set_policy_limit),
        route(
            Method::DELETE,
            "/policies/{policy}/limit",
            clear_policy_limit,
        ),
        route(Method::PUT, "/policies/{policy}/cap", set_policy_cap),
        route(Method::DELETE, "/policies/{policy}/cap", clear_policy_cap),
    ]
}

/// `404` for a path the table does not have.
pub(super) async fn no_route() -> ApiError {
    ApiError::not_found(None, "no such admin route; see openapi.json")
}

/// `405` for a method the path does not take.
pub(super) async fn wrong_method() -> ApiError {
    ApiError::method_not_allowed()
}

/// A route's answer: one of the shapes in `view.rs`, or an error.
type Answer<T> = Result<Json<T>, ApiError>;

/// Every policy. The adjustable ones' runtime limits are read together:
/// one store call per store they share (on Redis one `EVALSHA` for the
/// whole list, the hash every policy's limits live in), each within its
/// deadline; a policy whose read failed is shown as built, with
/// `"runtime": null` and `"runtime_error"` saying why, and the policies of
/// other stores are not held back by it.
async fn list_policies(
    _: NoQuery,
    axum::extract::State(api): axum::extract::State<Api>,
) -> Answer<view::Policies> {
    let adjustable: Vec<&RateLimiter> = api
        .policies
        .values()
        .filter(|l| l.policy().is_adjustable())
        .collect();
    let mut read = RateLimiter::policy_limits_of(&adjustable).await.into_iter();
    let policies: Vec<view::PolicyView> = api
        .policies
        .values()
        .map(|limiter| {
            if !limiter.policy().is_adjustable() {
                return view::policy(limiter, &None);
            }
            match read.next() {
                Some(Ok(runtime)) => view::policy(limiter, &Some(runtime)),
                Some(Err(err)) => {
                    let err = ApiError::read_failed(&err);
                    let mut shown = view::policy(limiter, &None);
                    shown.runtime_error = Some(view::ReadError {
                        status: err.status().as_u16(),
                        message: err.message().to_owned(),
                    });
                    shown
                }
                None => view::policy(limiter, &None),
            }
        })
        .collect();
    Ok(Json(view::Policies { policies }))
}

async fn get_policy(Named(limiter): Named, _: NoQuery) -> Answer<view::PolicyView> {
    let runtime = runtime_of(&limiter).await?;
    Ok(Json(view::policy(&limiter, &runtime)))
}

/// The runtime limit and cap in force, read from the store, for an
/// adjustable policy.
async fn runtime_of(limiter: &RateLimiter) -> Result<Option<PolicyLimits>, ApiError> {
    if !limiter.policy().is_adjustable() {
        return Ok(None);
    }
    let limits = limiter
        .policy_limits()
        .await
        .map_err(|err| ApiError::read_failed(&err))?;
    Ok(Some(limits))
}

async fn set_policy_limit(
    Named(limiter): Named,
    _: NoQuery,
    Body(bytes): Body,
) -> Answer<view::PolicyWideSet> {
    set_policy_wide(limiter, bytes, PolicyLimit::Limit).await
}

async fn set_policy_cap(
    Named(limiter): Named,
    _: NoQuery,
    Body(bytes): Body,
) -> Answer<view::PolicyWideSet> {
    set_policy_wide(limiter, bytes, PolicyLimit::Cap).await
}

async fn clear_policy_limit(Named(limiter): Named, _: NoQuery) -> Answer<view::PolicyWideCleared> {
    clear_policy_wide(limiter, PolicyLimit::Limit).await
}

async fn clear_policy_cap(Named(limiter): Named, _: NoQuery) -> Answer<view::PolicyWideCleared> {
    clear_policy_wide(limiter, PolicyLimit::Cap).await
}

/// `PUT .../limit` and `.../cap`: the body as an override's
/// (`{"limit": N, "until": secs}` or `{"quotas": [..]}`).
async fn set_policy_wide(
    limiter: RateLimiter,
    bytes: bytes::Bytes,
    which: PolicyLimit,
) -> Answer<view::PolicyWideSet> {
    adjustable(&limiter)?;
    let (value, field) = body::override_of(&bytes, limiter.policy(), SystemTime::now())?;
    if value.note().is_some() {
        return Err(ApiError::invalid(
            "note",
            "a note is kept with a caller's override only; give null or leave it out",
        ));
    }
    let set = match which {
        PolicyLimit::Limit => limiter.set_policy_limit(value.clone()).await,
        PolicyLimit::Cap => limiter.set_policy_cap(value.clone()).await,
    };
    match set {
        Ok(()) => Ok(Json(view::PolicyWideSet {
            policy: limiter.policy().name().to_owned(),
            which: which.as_str(),
            value: (&value).into(),
        })),
        Err(err) => Err(admin_failed(&err, field)),
    }
}

async fn clear_policy_wide(
    limiter: RateLimiter,
    which: PolicyLimit,
) -> Answer<view::PolicyWideCleared> {
    adjustable(&limiter)?;
    let cleared = match which {
        PolicyLimit::Limit => limiter.clear_policy_limit().await,
        PolicyLimit::Cap => limiter.clear_policy_cap().await,
    }
    .map_err(|err| ApiError::write_failed(&err))?;
    Ok(Json(view::PolicyWideCleared {
        policy: limiter.policy().name().to_owned(),
        which: which.as_str(),
        cleared,
    }))
}

/// `409` unless the policy's limits may change at runtime.
fn adjustable(limiter: &RateLimiter) -> Result<(), ApiError> {
    if limiter.policy().is_adjustable() {
        return Ok(());
    }
    Err(ApiError::conflict(
        "policy",
        format!(
            "policy {:?} has fixed limits (it is built without Policy::adjustable)",
            limiter.policy().name()
        ),
    ))
}

async fn list_overrides(Filtered { limiter, key }: Filtered) -> Answer<view::Listed> {
    overridable(&limiter)?;
    let cap = limiter.cap_now();
    let all = limiter
        .list_overrides()
        .await
        .map_err(|err| ApiError::read_failed(&err))?;
    let overrides: Vec<view::ListedView> = all
        .iter()
        .filter(|(k, _)| key.as_ref().is_none_or(|key| key == k))
        .map(|(key, o)| view::listed(key, o, cap.as_deref()))
        .collect();
    Ok(Json(view::Listed {
        policy: limiter.policy().name().to_owned(),
        overrides,
    }))
}

async fn get_override(Target { limiter, key }: Target) -> Answer<view::CallerOverride> {
    overridable(&limiter)?;
    let found = limiter
        .get_override(&key)
        .await
        .map_err(|err| ApiError::read_failed(&err))?;
    Ok(Json(view::caller_override(&limiter, &key, found.as_ref())))
}

async fn set_override(
    Target { limiter, key }: Target,
    Body(bytes): Body,
) -> Answer<view::CallerOverride> {
    overridable(&limiter)?;
    let (quotas, field) = body::override_of(&bytes, limiter.policy(), SystemTime::now())?;
    match limiter.set_override(&key, quotas.clone()).await {
        Ok(()) => Ok(Json(view::caller_override(&limiter, &key, Some(&quotas)))),
        Err(err) => Err(admin_failed(&err, field)),
    }
}

async fn clear_override(Target { limiter, key }: Target) -> Answer<view::CallerChanged> {
    overridable(&limiter)?;
    let cleared = limiter
        .clear_override(&key)
        .await
        .map_err(|err| ApiError::write_failed(&err))?;
    Ok(Json(view::caller_changed(
        &limiter,
        &key,
        Did::Cleared(cleared),
    )))
}

async fn block(Target { limiter, key }: Target, Body(bytes): Body) -> Answer<view::CallerChanged> {
    has_penalty_box(&limiter)?;
    let seconds = body::block_of(&bytes)?;
    limiter
        .block(&key, seconds)
        .await
        .map_err(|err| admin_failed(&err, "seconds"))?;
    Ok(Json(view::caller_changed(
        &limiter,
        &key,
        Did::Blocked(seconds.as_secs()),
    )))
}

async fn unblock(Target { limiter, key }: Target) -> Answer<view::CallerChanged> {
    has_penalty_box(&limiter)?;
    let unblocked = limiter
        .unblock(&key)
        .await
        .map_err(|err| ApiError::write_failed(&err))?;
    Ok(Json(view::caller_changed(
        &limiter,
        &key,
        Did::Unblocked(unblocked),
    )))
}

async fn reset(Target { limiter, key }: Target) -> Answer<view::CallerChanged> {
    limiter
        .reset(&key)
        .await
        .map_err(|err| ApiError::write_failed(&err))?;
    Ok(Json(view::caller_changed(&limiter, &key, Did::Reset(true))))
}

async fn peek(Target { limiter, key }: Target) -> Answer<view::State> {
    let state = limiter
        .peek_as_request(&key)
        .await
        .map_err(|err| ApiError::read_failed(&err))?;
    Ok(Json(view::state(limiter.policy(), &key, &state)))
}

/// `409` unless the policy takes overrides.
fn overridable(limiter: &RateLimiter) -> Result<(), ApiError> {
    if limiter.policy().is_overridable() {
        return Ok(());
    }
    Err(ApiError::conflict(
        "policy",
        format!(
            "policy {:?} takes no overrides (it is built without Policy::overridable)",
            limiter.policy().name()
        ),
    ))
}

/// `409` unless the policy has a penalty box.
fn has_penalty_box(limiter: &RateLimiter) -> Result<(), ApiError> {
    if limiter.policy().penalty_box().is_some() {
        return Ok(());
    }
    Err(ApiError::conflict(
        "policy",
        format!(
            "policy {:?} has no penalty box (it is built without Policy::with_penalty_box)",
            limiter.policy().name()
        ),
    ))
}

/// An operator's change the limiter did not make: `field` did not fit the
/// policy (`400`), or the store failed.
fn admin_failed(err: &AdminError, field: &str) -> ApiError {
    match err {
        AdminError::Invalid(invalid) => ApiError::invalid(field, invalid.reason().to_string()),
        AdminError::Store(store) => ApiError::write_failed(store),
    }
}
