//! [`ResponseFuture`]: the future [`RateLimit`](crate::layer::RateLimit)
//! returns, and the ways a request goes through it: answered by the layer,
//! waiting (for the store, or its turn) before the inner service runs, the
//! inner service running, and a settle that must be awaited.

use std::fmt;
use std::future::Future;
use std::ops::ControlFlow;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use http::request::Parts;
use http::{Request, Response};
use pin_project_lite::pin_project;
use tower_service::Service;

use super::answer::answer;
use super::body::ResponseBody;
use super::respond::{respond, Admitted, BoxedResponse, Responded};
use crate::limiter::{Limiter, Pending, ReleaseGuard, Step, Verdict};
use crate::response::Body;

/// A request waiting to be admitted, as a boxed future.
type BoxedWait<F> = Pin<Box<dyn Future<Output = Waited<F>> + Send>>;

pin_project! {
    /// Resolves to the inner service's response, or to the layer's own:
    /// a [`ResponseBody`] around the inner service's body `B`, or the
    /// layer's. `F` is the inner service's future, `E` its error.
    ///
    /// A request decided without waiting (an in-process store, an allow or
    /// deny list) runs the inner service's future in place, with nothing
    /// allocated for the layer; one that awaits Redis waits boxed, then
    /// runs the inner service's future in place as well.
    ///
    /// Dropping it (a client that went away) cancels the store call too; no
    /// task is left behind.
    pub struct ResponseFuture<F, B, E> {
        #[pin]
        state: State<F, B, E>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F, B, E> {
        /// The layer answered (a 429, 400 or 503) without the inner service.
        Answered { response: Option<Response<Body>> },
        /// Awaiting the store's answer, or a leaky bucket's turn; then the
        /// inner service is called.
        Waiting { future: BoxedWait<F> },
        /// Admitted; the inner service runs, then its response is settled.
        Inner {
            #[pin]
            future: F,
            admitted: Option<Admitted>,
        },
        /// Anything else that awaits: a settle, a work queue's push.
        Boxed { future: BoxedResponse<B, E> },
    }
}

/// How a wait ends: with the layer's answer, or the inner service called.
enum Waited<F> {
    Answered(Response<Body>),
    Admitted(F, Admitted),
}

impl<F, B, E> ResponseFuture<F, B, E> {
    pub(crate) fn answered(response: Response<Body>) -> Self {
        Self {
            state: State::Answered {
                response: Some(response),
            },
        }
    }

    /// The inner service's `future`, called for a request admitted at once.
    pub(crate) fn inner(future: F, admitted: Admitted) -> Self {
        Self {
            state: State::Inner {
                future,
                admitted: Some(admitted),
            },
        }
    }

    /// A request that waits before `inner` is called for it: for the
    /// store's answer ([`Limiter::admit_later`] goes on from `admission`),
    /// or for its turn in a leaky bucket's queue. From there on it goes
    /// the way a request admitted at once goes.
    pub(crate) fn waiting<S, ReqBody>(
        admission: Step<Pending>,
        limiter: Arc<Limiter>,
        inner: S,
        parts: Parts,
        body: ReqBody,
    ) -> Self
    where
        S: Service<Request<ReqBody>, Future = F> + Send + 'static,
        F: Send + 'static,
        ReqBody: Send + 'static,
    {
        Self {
            state: State::Waiting {
                // A verdict waits boxed only for a leaky bucket's turn: the
                // future then fits the allocator's small sizes.
                future: Box::pin(wait(
                    admission.map_break(|(verdict, _)| Box::new(verdict)),
                    limiter,
                    inner,
                    parts,
                    body,
                )),
            },
        }
    }

    /// Any other way to a response, boxed: the work queue's push.
    #[cfg_attr(not(feature = "queue"), allow(dead_code))]
    pub(crate) fn boxed(
        future: impl Future<Output = Result<Response<ResponseBody<B>>, E>> + Send + 'static,
    ) -> Self {
        Self {
            state: State::Boxed {
                future: Box::pin(future),
            },
        }
    }
}

/// [`ResponseFuture::waiting`]'s wait: the verdict, then the turn, then
/// the inner service called. An `async` block, not an `async fn`, which
/// would keep a second copy of its arguments in the future it boxes.
#[allow(clippy::manual_async_fn)]
fn wait<S, ReqBody>(
    admission: ControlFlow<Box<Verdict>, Pending>,
    limiter: Arc<Limiter>,
    mut inner: S,
    mut parts: Parts,
    body: ReqBody,
) -> impl Future<Output = Waited<S::Future>>
where
    S: Service<Request<ReqBody>>,
{
    async move {
        let verdict = match admission {
            ControlFlow::Break(verdict) => *verdict,
            ControlFlow::Continue(pending) => limiter.admit_later(&mut parts, pending).await,
        };
        let pass = match verdict {
            Verdict::Pass(pass) => pass,
            Verdict::Respond(response) => {
                return Waited::Answered(answer(&limiter, &parts, response))
            }
        };
        // Dropping this future from here on (the client left) drops the
        // guard, which gives the charge back without blocking.
        let guard = ReleaseGuard::for_pass(&limiter, &pass);
        if let Some(delay) = pass.delay() {
            // A leaky bucket's turn: wait without blocking the runtime.
            tokio::time::sleep(delay).await;
        }
        let guard = guard.and_then(ReleaseGuard::keep_if_held);
        let future = inner.call(Request::from_parts(parts, body));
        Waited::Admitted(
            future,
            Admitted {
                limiter,
                pass,
                guard,
            },
        )
    }
}

impl<F, B, E> Future for ResponseFuture<F, B, E>
where
    F: Future<Output = Result<Response<B>, E>>,
    B: Send + 'static,
    E: 'static,
{
    type Output = Result<Response<ResponseBody<B>>, E>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        loop {
            let next = match self.as_mut().project().state.project() {
                StateProj::Answered { response } => {
                    let response = response.take().expect("polled after completion");
                    return Poll::Ready(Ok(response.map(ResponseBody::own)));
                }
                StateProj::Boxed { future } => return future.as_mut().poll(cx),
                StateProj::Waiting { future } => match ready!(future.as_mut().poll(cx)) {
                    Waited::Answered(response) => {
                        return Poll::Ready(Ok(response.map(ResponseBody::own)))
                    }
                    Waited::Admitted(future, admitted) => State::Inner {
                        future,
                        admitted: Some(admitted),
                    },
                },
                StateProj::Inner { future, admitted } => {
                    let response = ready!(future.poll(cx))?;
                    match respond(admitted, response) {
                        Responded::Now(response) => return Poll::Ready(Ok(response)),
                        Responded::Later(future) => State::Boxed { future },
                    }
                }
            };
            self.as_mut().project().state.set(next);
        }
    }
}

impl<F, B, E> fmt::Debug for ResponseFuture<F, B, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}
