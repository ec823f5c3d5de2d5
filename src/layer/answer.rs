//! [`answer`]: the layer's own answer to a request it refuses, as
//! `response.rs` wrote it, or as the gRPC status it stands for; whichever
//! way the request was refused (at once, or after awaiting the store).

use http::request::Parts;
use http::Response;

use crate::limiter::Limiter;
use crate::response::Body;

/// The layer's own answer to the request `parts` heads: as written, or, for
/// a gRPC call (feature `grpc`), as the gRPC status it stands for
/// (`grpc.rs`). Asked only of a refusal: a request let through pays
/// nothing for it.
pub(crate) fn answer(limiter: &Limiter, parts: &Parts, response: Response<Body>) -> Response<Body> {
    #[cfg(feature = "grpc")]
    if crate::grpc::is_grpc(&parts.headers) {
        return crate::grpc::status(response, limiter.name(), limiter.config.grpc_limited);
    }
    #[cfg(not(feature = "grpc"))]
    let _ = (limiter, parts);
    response
}
