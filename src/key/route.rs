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
/// A gRPC call (feature `grpc`: `content-type: application/grpc...`) has no
/// template but needs none: its path is its method, `/package.Service/Method`,
/// with no caller's data in it, and that is the route. A path of another
/// shape is a key error (`INVALID_ARGUMENT`). Each distinct path a client
/// sends is a key, as with any key: a server that rejects unknown methods
/// (tonic answers `UNIMPLEMENTED`) still counted them.
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
        let Some(path) = parts.extensions.get::<MatchedPath>() else {
            #[cfg(feature = "grpc")]
            if let Some(method) = grpc_method(parts) {
                return method;
            }
            return Err(KeyError::Missing("matched route (use Router::route_layer)"));
        };
        Ok(Key::new(path.as_str()))
    }

    fn key_of(&self, caller: &Caller) -> Result<Key, KeyError> {
        let route = caller
            .route_template()
            .ok_or(KeyError::Missing("route (Caller::route)"))?;
        Ok(Key::new(route))
    }
}

/// A gRPC call's method, `/package.Service/Method`, as its route; `None` for
/// a request that is not gRPC. (`grpc.rs` tells a gRPC call the same way; it
/// sits on a floor above the keys.)
#[cfg(feature = "grpc")]
fn grpc_method(parts: &Parts) -> Option<Result<Key, KeyError>> {
    let kind = parts.headers.get(http::header::CONTENT_TYPE)?;
    if !kind.as_bytes().starts_with(b"application/grpc") {
        return None;
    }
    let path = parts.uri.path();
    let well_formed = path
        .strip_prefix('/')
        .and_then(|rest| rest.split_once('/'))
        .is_some_and(|(service, method)| {
            !service.is_empty() && !method.is_empty() && !method.contains('/')
        });
    Some(if well_formed {
        Ok(Key::new(path))
    } else {
        Err(KeyError::Invalid(
            "gRPC method path (/package.Service/Method)",
        ))
    })
}
