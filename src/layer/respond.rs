//! [`respond`]: what an admitted request's response goes through on its
//! way out, whichever way the request was admitted (at once, or after
//! awaiting the store or its turn): its charge settled to what it really
//! cost (the `304` refund among them), its headers written, and its body
//! holding a concurrency slot until it ends.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use http::response::Parts;
use http::Response;

use super::body::ResponseBody;
use crate::limiter::{Limiter, Pass, ReleaseGuard};

/// A response on its way back through the layer, as a boxed future.
pub(crate) type BoxedResponse<B, E> =
    Pin<Box<dyn Future<Output = Result<Response<ResponseBody<B>>, E>> + Send>>;

/// An admitted request, from the moment the inner service is called for
/// it until its response is settled: what settling it takes. Built where
/// the request is admitted, at once (`layer/service.rs`) or after a wait
/// (`layer/future.rs`).
pub(crate) struct Admitted {
    pub(super) limiter: Arc<Limiter>,
    pub(super) pass: Pass,
    /// Gives a concurrency slot back when the response body ends.
    pub(super) guard: Option<ReleaseGuard>,
}

/// The response, ready; or, when its settle must be awaited, the rest of
/// the way, boxed.
pub(crate) enum Responded<B, E> {
    Now(Response<ResponseBody<B>>),
    Later(BoxedResponse<B, E>),
}

/// Settles an admitted request once the inner service answered, writes
/// its headers and wraps its body. The settle is made where the request
/// lies (`admitted`, emptied here): the pass is the largest thing a
/// response carries, and moving it costs a copy. A store that settles at
/// once (in process, or with nothing to settle) answers
/// [`Responded::Now`], with nothing allocated.
pub(crate) fn respond<B, E>(
    admitted: &mut Option<Admitted>,
    response: Response<B>,
) -> Responded<B, E>
where
    B: Send + 'static,
    E: 'static,
{
    let (mut head, body) = response.into_parts();
    let Admitted { limiter, pass, .. } = admitted.as_mut().expect("polled after completion");
    if !limiter.settle_now(pass, &mut head) {
        let admitted = admitted.take().expect("polled after completion");
        return Responded::Later(settle_later(admitted, head, body));
    }
    let guard = admitted.as_mut().and_then(|a| a.guard.take());
    *admitted = None;
    Responded::Now(Response::from_parts(head, ResponseBody::inner(body, guard)))
}

/// [`respond`] for a settle that must be awaited (a 304 on Redis, or an
/// actual cost that differs from the estimate): boxed, as the rare path
/// it is.
fn settle_later<B, E>(admitted: Admitted, mut head: Parts, body: B) -> BoxedResponse<B, E>
where
    B: Send + 'static,
    E: 'static,
{
    let Admitted {
        limiter,
        pass,
        guard,
    } = admitted;
    Box::pin(async move {
        limiter.settle(pass, &mut head).await;
        Ok(Response::from_parts(head, ResponseBody::inner(body, guard)))
    })
}
