//! [`ResponseBody`]: the body of every response the layer's services
//! answer: the inner service's own, holding a concurrency slot when its
//! request holds one ([`ReleaseBody`]), or the layer's (a 429's message).

use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

use crate::limiter::ReleaseGuard;
use crate::response;

pin_project! {
    /// The body of a response from [`RateLimit`](crate::layer::RateLimit)
    /// (and the other services of this crate): the inner service's body `B`,
    /// unchanged and unboxed, or the layer's own (a rejection's short JSON
    /// message; nothing at all for a gRPC status). Its errors are `B`'s.
    ///
    /// Like tower-http's bodies, it fits any stack: axum takes it as it takes
    /// any body, hyper serves it, and a tonic server's routes answer it.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use std::num::NonZeroU32;
    /// use bytes::Bytes;
    /// use http_body_util::{BodyExt, Full};
    /// use tower::{ServiceBuilder, ServiceExt};
    /// use tollgate::layer::ResponseBody;
    /// use tollgate::{Policy, Quota, RateLimitLayer};
    ///
    /// let layer = RateLimitLayer::builder()
    ///     .policy(Policy::fixed_window("core", Quota::per_minute(NonZeroU32::new(1).unwrap())))
    ///     .key(|_: &http::request::Parts| Ok::<_, tollgate::KeyError>(tollgate::Key::new("everyone")))
    ///     .build()
    ///     .unwrap();
    /// let service = ServiceBuilder::new().layer(layer).service_fn(|_req: http::Request<()>| async {
    ///     Ok::<_, std::convert::Infallible>(http::Response::new(Full::new(Bytes::from("hello"))))
    /// });
    /// let response: http::Response<ResponseBody<Full<Bytes>>> =
    ///     service.clone().oneshot(http::Request::new(())).await.unwrap();
    /// assert_eq!(response.into_body().collect().await.unwrap().to_bytes(), "hello");
    /// let limited = service.oneshot(http::Request::new(())).await.unwrap();
    /// assert_eq!(limited.status(), 429);
    /// # }
    /// ```
    pub struct ResponseBody<B> {
        #[pin]
        kind: Kind<B>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<B> {
        /// The inner service's body, as it is.
        Inner { #[pin] body: B },
        /// The inner service's body, giving a held charge back when it ends.
        Held { #[pin] body: ReleaseBody<B> },
        /// The layer's own answer.
        Own { body: response::Body },
    }
}

impl<B> ResponseBody<B> {
    /// The inner service's body, holding a concurrency slot until it ends
    /// when `guard` holds one.
    pub(crate) fn inner(body: B, guard: Option<ReleaseGuard>) -> Self {
        let kind = match guard {
            Some(guard) => Kind::Held {
                body: ReleaseBody::new(body, guard),
            },
            None => Kind::Inner { body },
        };
        Self { kind }
    }

    /// The layer's own answer.
    pub(crate) fn own(body: response::Body) -> Self {
        Self {
            kind: Kind::Own { body },
        }
    }
}

impl<B> Body for ResponseBody<B>
where
    B: Body<Data = Bytes>,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        match self.project().kind.project() {
            KindProj::Inner { body } => body.poll_frame(cx),
            KindProj::Held { body } => body.poll_frame(cx),
            KindProj::Own { body } => match Pin::new(body).poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => Poll::Ready(Some(Ok(frame))),
                Poll::Ready(Some(Err(never))) => match never {},
                Poll::Ready(None) => Poll::Ready(None),
                Poll::Pending => Poll::Pending,
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Inner { body } => body.is_end_stream(),
            Kind::Held { body } => body.is_end_stream(),
            Kind::Own { body } => body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Inner { body } => body.size_hint(),
            Kind::Held { body } => body.size_hint(),
            Kind::Own { body } => body.size_hint(),
        }
    }
}

impl<B> fmt::Debug for ResponseBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match &self.kind {
            Kind::Inner { .. } => "inner",
            Kind::Held { .. } => "inner, holding a slot",
            Kind::Own { .. } => "the layer's",
        };
        f.debug_tuple("ResponseBody").field(&kind).finish()
    }
}

pin_project! {
    /// A response body that releases its request's concurrency slot when it
    /// ends, fails, or is dropped (a client that went away mid-download).
    pub(crate) struct ReleaseBody<B> {
        #[pin]
        inner: B,
        guard: ReleaseGuard,
    }
}

impl<B> ReleaseBody<B> {
    fn new(inner: B, guard: ReleaseGuard) -> Self {
        Self { inner, guard }
    }
}

impl<B: Body> Body for ReleaseBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let mut this = self.project();
        let polled = this.inner.as_mut().poll_frame(cx);
        let ended = match &polled {
            Poll::Ready(None) | Poll::Ready(Some(Err(_))) => true,
            Poll::Ready(Some(Ok(_))) => this.inner.is_end_stream(),
            Poll::Pending => false,
        };
        if ended {
            this.guard.release();
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
