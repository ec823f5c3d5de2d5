//! [`ResponseFuture`]: the future [`RateLimit`](crate::layer::RateLimit) returns.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use axum::body::Body;
use bytes::Bytes;
use http::Response;
use pin_project_lite::pin_project;

use super::body::ReleaseBody;
use crate::limiter::{Limiter, Pass, ReleaseGuard};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A response on its way back through the layer, as a boxed future.
pub(crate) type BoxedResponse<E> = Pin<Box<dyn Future<Output = Result<Response<Body>, E>> + Send>>;

pin_project! {
    /// Resolves to the inner service's response, or to the layer's own.
    ///
    /// A request decided without waiting (an in-process store, an allow or
    /// deny list) runs the inner service's future in place, with nothing
    /// allocated for the layer; one that awaits Redis runs boxed.
    ///
    /// Dropping it (a client that went away) cancels the store call too; no
    /// task is left behind.
    pub struct ResponseFuture<F, E> {
        #[pin]
        state: State<F, E>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F, E> {
        /// The layer answered (a 429, 400 or 503) without the inner service.
        Answered { response: Option<Response<Body>> },
        /// Admitted at once; the inner service runs, then the pass is settled.
        Inner {
            #[pin]
            future: F,
            settle: Option<Settle>,
        },
        /// Anything that awaits: the store, a queue's turn, a refund.
        Boxed { future: BoxedResponse<E> },
    }
}

/// What settling an admitted request takes once its response is in.
pub(crate) struct Settle {
    pub(crate) limiter: Arc<Limiter>,
    pub(crate) pass: Pass,
    /// Gives a concurrency slot back when the response body ends.
    pub(crate) guard: Option<ReleaseGuard>,
}

impl<F, E> ResponseFuture<F, E> {
    pub(crate) fn answered(response: Response<Body>) -> Self {
        Self {
            state: State::Answered {
                response: Some(response),
            },
        }
    }

    pub(crate) fn inner(future: F, settle: Settle) -> Self {
        Self {
            state: State::Inner {
                future,
                settle: Some(settle),
            },
        }
    }

    pub(crate) fn boxed(
        future: impl Future<Output = Result<Response<Body>, E>> + Send + 'static,
    ) -> Self {
        Self {
            state: State::Boxed {
                future: Box::pin(future),
            },
        }
    }
}

impl<F, E, B> Future for ResponseFuture<F, E>
where
    F: Future<Output = Result<Response<B>, E>>,
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
    E: 'static,
{
    type Output = Result<Response<Body>, E>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let refund = match self.as_mut().project().state.project() {
            StateProj::Answered { response } => {
                let response = response.take().expect("polled after completion");
                return Poll::Ready(Ok(response));
            }
            StateProj::Boxed { future } => return future.as_mut().poll(cx),
            StateProj::Inner { future, settle } => {
                let response = ready!(future.poll(cx))?;
                let (mut head, body) = response.into_parts();
                let Settle { limiter, pass, .. } =
                    settle.as_mut().expect("polled after completion");
                if limiter.settle_now(pass, &mut head) {
                    let guard = settle.as_mut().and_then(|s| s.guard.take());
                    *settle = None;
                    return Poll::Ready(Ok(Response::from_parts(head, body_of(body, guard))));
                }
                let settle = settle.take().expect("polled after completion");
                settle_later(settle, head, body)
            }
        };
        self.as_mut()
            .project()
            .state
            .set(State::Boxed { future: refund });
        self.poll(cx)
    }
}

/// Settles a response whose settle must be awaited (a 304 on Redis, or an
/// actual cost that differs from the estimate): boxed,
/// as the rare path it is.
fn settle_later<B, E>(settle: Settle, mut head: http::response::Parts, body: B) -> BoxedResponse<E>
where
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
    E: 'static,
{
    let Settle {
        limiter,
        pass,
        guard,
    } = settle;
    Box::pin(async move {
        limiter.settle(pass, &mut head).await;
        Ok(Response::from_parts(head, body_of(body, guard)))
    })
}

/// The response body, holding a concurrency slot until it ends.
pub(crate) fn body_of<B>(body: B, guard: Option<ReleaseGuard>) -> Body
where
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    match guard {
        Some(guard) => Body::new(ReleaseBody::new(body, guard)),
        None => Body::new(body),
    }
}

impl<F, E> fmt::Debug for ResponseFuture<F, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}
