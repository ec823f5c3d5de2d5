use axum::extract::MatchedPath;
use http::request::Parts;

use super::{Caller, Key, KeyExtractor};
use crate::error::KeyError;

/// Keys by the matched route template (`/users/{id}`), not the raw path, so
/// `/users/1` and `/users/2` share one budget.
///
/// Axum records the matched route only once routing is done: use this under
/// `Router::route_layer`, not `Router::layer`.
///
/// ```
/// use axum::{routing::get, Router};
/// use tollgate::{KeyExtractor, PeerIp};
/// use tollgate::key::RouteKey;
///
/// let _key = RouteKey.and(PeerIp::new()); // one budget per caller per route
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct RouteKey;

impl KeyExtractor for RouteKey {
    fn extract(&self, parts: &Parts) -> Result<Key, KeyError> {
        let path = parts
            .extensions
            .get::<MatchedPath>()
            .ok_or(KeyError::Missing("matched route (use Router::route_layer)"))?;
        Ok(Key::new(path.as_str()))
    }

    fn key_of(&self, caller: &Caller) -> Result<Key, KeyError> {
        let route = caller
            .route_template()
            .ok_or(KeyError::Missing("route (Caller::route)"))?;
        Ok(Key::new(route))
    }
}
