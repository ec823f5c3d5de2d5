//! [`RateLimit`]: the service the layer wraps around yours.

use std::ops::ControlFlow;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::request::Parts;
use http::{Request, Response};
use tower_service::Service;

use super::answer::answer;
use super::body::ResponseBody;
use super::future::ResponseFuture;
use super::respond::Admitted;
use crate::limiter::{Limiter, ReleaseGuard, Verdict};

/// Rate-limits requests to `S`. Made by [`RateLimitLayer`](crate::RateLimitLayer).
///
/// Holds no limiter state of its own (that lives in the store), so cloning it
/// (axum clones per request) never splits a budget. Every outcome is a
/// response; errors are only ever the inner service's. It answers the inner
/// service's body as it is, in a [`ResponseBody`] (the layer's own for its
/// rejections), so it wraps any tower service of `http` requests: an axum
/// router or handler, a hyper service, a tonic server.
///
/// ```
/// use std::num::NonZeroU32;
/// use tower::ServiceBuilder;
/// use tollgate::{Policy, Quota, RateLimitLayer};
///
/// let layer = RateLimitLayer::builder()
///     .policy(Policy::fixed_window("core", Quota::per_second(NonZeroU32::new(5).unwrap())))
///     .build().unwrap();
/// let _svc = ServiceBuilder::new().layer(layer).service(tower::service_fn(
///     |_req: axum::http::Request<axum::body::Body>| async {
///         Ok::<_, std::convert::Infallible>(axum::http::Response::new(axum::body::Body::empty()))
///     },
/// ));
/// ```
#[derive(Clone)]
pub struct RateLimit<S> {
    inner: S,
    limiter: Arc<Limiter>,
}

impl<S> RateLimit<S> {
    pub(crate) fn new(inner: S, limiter: Arc<Limiter>) -> Self {
        Self { inner, limiter }
    }
}

impl<S: std::fmt::Debug> std::fmt::Debug for RateLimit<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RateLimit")
            .field("inner", &self.inner)
            .field("policy", self.limiter.as_built())
            .finish()
    }
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for RateLimit<S>
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
        limit(&mut self.inner, &self.limiter, parts, body)
    }
}

/// The request path under one limiter: [`RateLimit`]'s, and that of any
/// service that picks a limiter per request. It dispatches on what
/// admitting the request says at once (answered, admitted, or must wait);
/// from there every way in goes through [`ResponseFuture`]'s one response
/// path (`layer/respond.rs`).
pub(crate) fn limit<S, ReqBody, ResBody>(
    inner: &mut S,
    limiter: &Arc<Limiter>,
    mut parts: Parts,
    body: ReqBody,
) -> ResponseFuture<S::Future, ResBody, S::Error>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ReqBody: Send + 'static,
    ResBody: Send + 'static,
{
    match limiter.admit_now(&mut parts) {
        ControlFlow::Break((Verdict::Respond(response), _)) => {
            ResponseFuture::answered(answer(limiter, &parts, response))
        }
        // Decided without waiting (an in-process store): the inner
        // service, made ready in `poll_ready`, runs in place.
        ControlFlow::Break((Verdict::Pass(pass), _)) if pass.delay().is_none() => {
            let guard = ReleaseGuard::for_pass(limiter, &pass);
            let future = inner.call(Request::from_parts(parts, body));
            let limiter = limiter.clone();
            ResponseFuture::inner(
                future,
                Admitted {
                    limiter,
                    pass,
                    guard,
                },
            )
        }
        // Waits for the store's answer, or its turn in a leaky bucket's
        // queue. The inner service is called later: take the one driven to
        // readiness and leave a fresh clone behind (tower's "be careful
        // when cloning inner services").
        admission => {
            let clone = inner.clone();
            let inner = std::mem::replace(inner, clone);
            ResponseFuture::waiting(admission, limiter.clone(), inner, parts, body)
        }
    }
}
