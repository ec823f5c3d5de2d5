//! [`Tiered`]: the service a [`TieredLayer`](crate::TieredLayer) wraps
//! around yours.

use std::sync::Arc;
use std::task::{Context, Poll};

use http::header::{HeaderValue, CONTENT_TYPE};
use http::{Request, Response, StatusCode};
use tower_service::Service;

use super::Tiers;
use crate::layer::{ResponseBody, ResponseFuture};
use crate::response::{Body, Refusal};

/// Rate-limits requests to `S` under the tier each one is placed in. Made by
/// [`TieredLayer`](crate::TieredLayer).
///
/// Picks the request's tier, then takes exactly the path a
/// [`RateLimit`](crate::layer::RateLimit) of that tier alone would: one store call,
/// that tier's headers, refunds and releases. Like it, it holds no limiter
/// state, and its errors are only the inner service's.
///
/// ```
/// use std::num::NonZeroU32;
/// use tower::ServiceBuilder;
/// use tollgate::{Policy, Quota, RateLimitLayer, TieredLayer};
///
/// let layer = TieredLayer::builder()
///     .tier(RateLimitLayer::builder().policy(Policy::fixed_window("free", Quota::per_second(NonZeroU32::new(5).unwrap()))))
///     .choose(|_| Some("free"))
///     .build()
///     .unwrap();
/// let _svc = ServiceBuilder::new().layer(layer).service(tower::service_fn(
///     |_req: axum::http::Request<axum::body::Body>| async {
///         Ok::<_, std::convert::Infallible>(axum::http::Response::new(axum::body::Body::empty()))
///     },
/// ));
/// ```
#[derive(Clone)]
pub struct Tiered<S> {
    inner: S,
    tiers: Arc<Tiers>,
}

impl<S> Tiered<S> {
    pub(crate) fn new(inner: S, tiers: Arc<Tiers>) -> Self {
        Self { inner, tiers }
    }
}

impl<S: std::fmt::Debug> std::fmt::Debug for Tiered<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = self.tiers.limiters.iter().map(|l| l.name()).collect();
        f.debug_struct("Tiered")
            .field("inner", &self.inner)
            .field("tiers", &names)
            .finish()
    }
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for Tiered<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ReqBody: Send + 'static,
    ResBody: Send + 'static,
{
    type Response = Response<ResponseBody<ResBody>>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future, ResBody, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        let (parts, body) = request.into_parts();
        match self.tiers.place(&parts) {
            Ok(limiter) => crate::layer::service::limit(&mut self.inner, limiter, parts, body),
            Err(status) => ResponseFuture::answered(unplaced(status, &parts)),
        }
    }
}

/// The answer to a request no tier counts.
fn unplaced(status: StatusCode, parts: &http::request::Parts) -> Response<Body> {
    let mut response = Response::new(Body::new(
        r#"{"message":"cannot place the caller in a rate-limit tier"}"#,
        Refusal::Unplaced,
    ));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    #[cfg(feature = "grpc")]
    if crate::grpc::is_grpc(&parts.headers) {
        // No tier, so no limit to name: the status is INVALID_ARGUMENT.
        let limited = crate::grpc::LimitedCode::default();
        return crate::grpc::status(response, "", limited);
    }
    #[cfg(not(feature = "grpc"))]
    let _ = parts;
    response
}
