//! [`ReleaseBody`]: a response body that gives its request's held charge
//! back (a concurrency slot) when it ends, fails, or is dropped.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

use crate::limiter::ReleaseGuard;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The response body, holding a concurrency slot until it ends.
pub(crate) fn body_of<B>(body: B, guard: Option<ReleaseGuard>) -> axum::body::Body
where
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    match guard {
        Some(guard) => axum::body::Body::new(ReleaseBody::new(body, guard)),
        None => axum::body::Body::new(body),
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
