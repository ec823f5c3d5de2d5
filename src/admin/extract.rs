//! What an admin route takes from its request, each refused with an
//! [`ApiError`] naming what is wrong: the policy in the path (`404`), the
//! caller in the query (`400`), the body (`413` over the limit).

use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, Path, Request};
use http::request::Parts;
use http::StatusCode;

use super::caller;
use super::error::ApiError;
use super::Api;
use crate::key::Key;
use crate::rate_limiter::RateLimiter;

/// The policy `{policy}` names.
pub(super) struct Named(pub RateLimiter);

impl FromRequestParts<Api> for Named {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, api: &Api) -> Result<Self, ApiError> {
        let Path(name) = Path::<String>::from_request_parts(parts, api)
            .await
            .map_err(|err| ApiError::invalid("policy", err.body_text()))?;
        match api.policies.get(&name) {
            Some(limiter) => Ok(Self(limiter.clone())),
            None => Err(ApiError::not_found(
                Some("policy"),
                format!("no policy {name:?} here; GET /policies lists them"),
            )),
        }
    }
}

/// The policy `{policy}` names and the key of the caller the query names.
pub(super) struct Target {
    pub limiter: RateLimiter,
    pub key: Key,
}

impl FromRequestParts<Api> for Target {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, api: &Api) -> Result<Self, ApiError> {
        let Named(limiter) = Named::from_request_parts(parts, api).await?;
        let key = caller::key_of(&parts.uri, &api.aliases, &limiter)?;
        Ok(Self { limiter, key })
    }
}

/// A route that names no caller takes no query: a parameter is a `400`
/// naming it, rather than ignored (an operator who added `?api_key=..`
/// meant something by it).
pub(super) struct NoQuery;

impl FromRequestParts<Api> for NoQuery {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &Api) -> Result<Self, ApiError> {
        let query = parts.uri.query().unwrap_or("");
        match form_urlencoded::parse(query.as_bytes()).next() {
            None => Ok(Self),
            Some((name, _)) => Err(ApiError::invalid(
                &name,
                "this route names no caller and takes no query parameter",
            )),
        }
    }
}

/// The policy `{policy}` names and, when the query names a caller, its
/// key: a filter.
pub(super) struct Filtered {
    pub limiter: RateLimiter,
    pub key: Option<Key>,
}

impl FromRequestParts<Api> for Filtered {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, api: &Api) -> Result<Self, ApiError> {
        let Named(limiter) = Named::from_request_parts(parts, api).await?;
        let key = match parts.uri.query() {
            None | Some("") => None,
            Some(_) => Some(caller::key_of(&parts.uri, &api.aliases, &limiter)?),
        };
        Ok(Self { limiter, key })
    }
}

/// The request's body, at most the API's body limit.
pub(super) struct Body(pub Bytes);

impl FromRequest<Api> for Body {
    type Rejection = ApiError;

    async fn from_request(request: Request, api: &Api) -> Result<Self, ApiError> {
        match Bytes::from_request(request, api).await {
            Ok(bytes) => Ok(Self(bytes)),
            Err(err) if err.status() == StatusCode::PAYLOAD_TOO_LARGE => {
                Err(ApiError::too_large(api.body_limit))
            }
            Err(err) => Err(ApiError::invalid("body", err.body_text())),
        }
    }
}
