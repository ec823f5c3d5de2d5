//! [`QueueLayer`]: admits requests into a [`WorkQueue`] and answers at once.

use std::fmt;
use std::future::poll_fn;
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use bytes::{Bytes, BytesMut};
use http::header::CONTENT_TYPE;
use http::{Request, Response, StatusCode};
use serde_json::json;
use tower_layer::Layer;
use tower_service::Service;

use super::{Job, Pushed, WorkQueue};
use crate::decision::Decision;
use crate::error::ConfigError;
use crate::headers::{PolicyHeaders, RateLimitHeaders};
use crate::key::{KeyExtractor, PeerIp};
use crate::layer::DEFAULT_DEADLINE;
use crate::layer::{ResponseBody, ResponseFuture};
use crate::policy::Policy;
use crate::policy::Strategy;
use crate::quota::Quota;
use crate::response::{self, Refusal};
use crate::strategy::leaky_bucket::interval_micros;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The largest request body queued by default.
pub const DEFAULT_MAX_BODY: usize = 64 * 1024;

/// Put in the request's extensions for the handler behind a [`QueueLayer`]:
/// the request is queued, and this is its entry.
///
/// ```
/// use axum::Extension;
/// use tollgate::queue::Enqueued;
///
/// async fn accepted(Extension(q): Extension<Enqueued>) -> (axum::http::StatusCode, String) {
///     (axum::http::StatusCode::ACCEPTED, format!("queued as {} ({} waiting)", q.id, q.len))
/// }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Enqueued {
    /// The entry's id in the queue.
    pub id: String,
    /// Entries in the queue after this one was added.
    pub len: u64,
    /// The most the queue holds.
    pub capacity: u64,
}

/// Admits each request into a bounded [`WorkQueue`], then calls the wrapped
/// handler, which usually answers `202 Accepted` (it finds [`Enqueued`] in
/// the request's extensions). A full queue gets `429` with `Retry-After`.
///
/// The entry holds the caller's key (`key`, from the [`KeyExtractor`]),
/// `method`, `uri`, `content-type` when sent, and `body` (at most
/// [`max_body`](QueueLayerBuilder::max_body) bytes, else `413`). The
/// handler still receives the body.
///
/// Headers, as on every tollgate response: `X-RateLimit-Limit` is the
/// capacity, `-Used` the entries in the queue (waiting or being worked on),
/// `-Remaining` the free places, `-Reset` when the queue would be empty if
/// workers drain it at `drain_rate`, and a rejection's `Retry-After` when one
/// place will be free at that rate. The rate is what you tell the layer your
/// workers do: it only shapes these numbers.
///
/// There is no failure policy to choose: with the queue unreachable there is
/// nowhere to put the work, so the answer is `503` with `Retry-After: 1`.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// use std::num::NonZeroU32;
/// use axum::{body::Body, extract::connect_info::MockConnectInfo, http::{Request, StatusCode}, routing::post, Router};
/// use tower::ServiceExt;
/// use tollgate::Quota;
/// use tollgate::queue::{MemoryQueue, QueueLayer, QueueSpec};
///
/// let queue = MemoryQueue::new(QueueSpec::new("feeding", NonZeroU32::new(1).unwrap()).unwrap());
/// let drain = Quota::per_second(NonZeroU32::new(2).unwrap());
/// let app = Router::new()
///     .route("/feed", post(|| async { StatusCode::ACCEPTED }))
///     .layer(QueueLayer::builder(queue.clone(), drain).build().unwrap())
///     .layer(MockConnectInfo(std::net::SocketAddr::from(([127, 0, 0, 1], 1))));
///
/// let feed = || Request::post("/feed").body(Body::from("meat")).unwrap();
/// assert_eq!(app.clone().oneshot(feed()).await.unwrap().status(), StatusCode::ACCEPTED);
/// let full = app.oneshot(feed()).await.unwrap();
/// assert_eq!(full.status(), StatusCode::TOO_MANY_REQUESTS);
/// assert_eq!(full.headers()["retry-after"], "1");
/// assert_eq!(queue.pop(1)[0].job.get_str("body"), Some("meat"));
/// # }
/// ```
#[derive(Clone)]
pub struct QueueLayer {
    config: Arc<Config>,
}

struct Config {
    queue: Arc<dyn WorkQueue>,
    key: Arc<dyn KeyExtractor>,
    /// Names the headers: the queue's name, capacity and drain rate.
    policy: Policy,
    interval: u64,
    max_body: usize,
    deadline: Duration,
    headers: PolicyHeaders,
    limited_status: StatusCode,
    key_error_status: StatusCode,
}

impl fmt::Debug for QueueLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("QueueLayer")
            .field("queue", &self.config.queue)
            .field("max_body", &self.config.max_body)
            .finish_non_exhaustive()
    }
}

impl QueueLayer {
    /// Starts configuring a layer that admits into `queue`, whose workers
    /// drain it at about `drain_rate`.
    ///
    /// ```
    /// use std::num::NonZeroU32;
    /// use tollgate::{HeaderKey, Quota};
    /// use tollgate::queue::{MemoryQueue, QueueLayer, QueueSpec};
    ///
    /// let queue = MemoryQueue::new(QueueSpec::new("uploads", NonZeroU32::new(100).unwrap()).unwrap());
    /// let layer = QueueLayer::builder(queue, Quota::per_second(NonZeroU32::new(10).unwrap()))
    ///     .key(HeaderKey::new("x-api-key"))
    ///     .max_body(1024 * 1024)
    ///     .build();
    /// assert!(layer.is_ok());
    /// ```
    pub fn builder(queue: impl WorkQueue, drain_rate: Quota) -> QueueLayerBuilder {
        QueueLayerBuilder {
            queue: Arc::new(queue),
            drain_rate,
            key: None,
            max_body: DEFAULT_MAX_BODY,
            deadline: DEFAULT_DEADLINE,
            headers: RateLimitHeaders::default(),
            limited_status: StatusCode::TOO_MANY_REQUESTS,
        }
    }
}

impl<S> Layer<S> for QueueLayer {
    type Service = QueueService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        QueueService {
            inner,
            config: self.config.clone(),
        }
    }
}

/// Configures a [`QueueLayer`].
///
/// | option | default |
/// |---|---|
/// | [`key`](Self::key) | [`PeerIp`] |
/// | [`max_body`](Self::max_body) | [`DEFAULT_MAX_BODY`] (64 KiB) |
/// | [`deadline`](Self::deadline) | 100 ms |
/// | [`headers`](Self::headers) | GitHub's |
/// | [`limited_status`](Self::limited_status) | 429 |
#[must_use]
pub struct QueueLayerBuilder {
    queue: Arc<dyn WorkQueue>,
    drain_rate: Quota,
    key: Option<Arc<dyn KeyExtractor>>,
    max_body: usize,
    deadline: Duration,
    headers: RateLimitHeaders,
    limited_status: StatusCode,
}

impl fmt::Debug for QueueLayerBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("QueueLayerBuilder")
            .field("queue", &self.queue)
            .finish_non_exhaustive()
    }
}

impl QueueLayerBuilder {
    /// How callers are named in the entries (and refused when unnamed).
    pub fn key(mut self, key: impl KeyExtractor) -> Self {
        self.key = Some(Arc::new(key));
        self
    }

    /// The largest body queued; larger requests get `413`.
    pub fn max_body(mut self, bytes: usize) -> Self {
        self.max_body = bytes;
        self
    }

    /// The longest a push may take before the answer is `503`.
    pub fn deadline(mut self, deadline: Duration) -> Self {
        self.deadline = deadline;
        self
    }

    /// Which rate-limit header dialects to send.
    pub fn headers(mut self, headers: RateLimitHeaders) -> Self {
        self.headers = headers;
        self
    }

    /// The status when the queue is full: 429 (default) or 503.
    pub fn limited_status(mut self, status: StatusCode) -> Self {
        self.limited_status = status;
        self
    }

    /// The layer, or why this configuration cannot work.
    pub fn build(self) -> Result<QueueLayer, ConfigError> {
        let spec = self.queue.spec();
        let capacity = std::num::NonZeroU32::new(spec.capacity() as u32)
            .ok_or(ConfigError::QueueCapacityZero)?;
        let policy = Policy::new(
            spec.name(),
            Strategy::LeakyBucket { capacity },
            self.drain_rate,
        );
        policy.validate()?;
        if self.deadline.is_zero() {
            return Err(ConfigError::DeadlineZero { what: "queue" });
        }
        if !(self.limited_status.is_client_error() || self.limited_status.is_server_error()) {
            return Err(ConfigError::StatusNotAnError {
                what: "limited",
                status: self.limited_status,
            });
        }
        Ok(QueueLayer {
            config: Arc::new(Config {
                queue: self.queue,
                key: self.key.unwrap_or_else(|| Arc::new(PeerIp::new())),
                interval: interval_micros(&self.drain_rate),
                headers: PolicyHeaders::new(self.headers, &policy),
                policy,
                max_body: self.max_body,
                deadline: self.deadline,
                limited_status: self.limited_status,
                key_error_status: StatusCode::BAD_REQUEST,
            }),
        })
    }
}

/// The service [`QueueLayer`] wraps around a handler.
#[derive(Clone)]
pub struct QueueService<S> {
    inner: S,
    config: Arc<Config>,
}

impl<S: fmt::Debug> fmt::Debug for QueueService<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("QueueService")
            .field("inner", &self.inner)
            .field("queue", &self.config.queue)
            .finish()
    }
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for QueueService<S>
where
    S: Service<Request<Body>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ReqBody: http_body::Body<Data = Bytes> + Send + 'static,
    ReqBody::Error: Into<BoxError>,
    ResBody: Send + 'static,
{
    type Response = Response<ResponseBody<ResBody>>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future, ResBody, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        // Take the service driven to readiness, leave a clone (tower's "be
        // careful when cloning inner services").
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let config = self.config.clone();
        ResponseFuture::boxed(async move {
            let (mut parts, body) = request.into_parts();
            let key = match config.key.extract(&parts) {
                Ok(key) => key,
                Err(err) => {
                    let answer = response::unidentified(config.key_error_status, &err);
                    return Ok(answer.map(ResponseBody::own));
                }
            };
            let body = match read_body(body, config.max_body).await {
                Ok(body) => body,
                Err(status) => {
                    return Ok(body_refused(status, config.max_body).map(ResponseBody::own))
                }
            };
            let mut job = Job::new()
                .field("key", key.as_str().to_owned())
                .field("method", parts.method.as_str().to_owned())
                .field("uri", parts.uri.to_string());
            if let Some(kind) = parts.headers.get(CONTENT_TYPE) {
                job = job.field("content-type", Bytes::copy_from_slice(kind.as_bytes()));
            }
            let job = job.field("body", body.clone());

            let pushed = match tokio::time::timeout(config.deadline, config.queue.push(&job)).await
            {
                Ok(Ok(pushed)) => pushed,
                Ok(Err(err)) => {
                    tracing::warn!(queue = config.policy.name(), error = %err, "work queue push failed");
                    return Ok(response::unavailable(1).map(ResponseBody::own));
                }
                Err(_) => {
                    tracing::warn!(queue = config.policy.name(), "work queue push timed out");
                    return Ok(response::unavailable(1).map(ResponseBody::own));
                }
            };
            let decision = config.decision(&pushed);
            let Some(id) = pushed.id.clone() else {
                tracing::debug!(
                    queue = config.policy.name(),
                    len = pushed.len,
                    "work queue full"
                );
                let answer = response::limited(
                    config.limited_status,
                    &config.policy,
                    &decision,
                    &config.headers,
                );
                return Ok(answer.map(ResponseBody::own));
            };
            parts.extensions.insert(Enqueued {
                id,
                len: pushed.len,
                capacity: pushed.capacity,
            });
            parts.extensions.insert(decision.clone());
            let response = inner
                .call(Request::from_parts(parts, Body::from(body)))
                .await?;
            let (mut head, body) = response.into_parts();
            config
                .headers
                .apply(&mut head.headers, &config.policy, &decision);
            Ok(Response::from_parts(head, ResponseBody::inner(body, None)))
        })
    }
}

impl Config {
    /// The push as a decision, for the headers: the queue drains one entry
    /// per interval of the drain rate.
    fn decision(&self, pushed: &Pushed) -> Decision {
        let (len, cap, now) = (pushed.len, pushed.capacity, pushed.now_micros);
        let empty_at = now + len * self.interval;
        if pushed.accepted() {
            Decision::allowed(cap, len, empty_at, now)
        } else {
            let wait = (len + 1).saturating_sub(cap).max(1) * self.interval;
            Decision::rejected(cap, len.min(cap), empty_at, now, wait)
        }
    }
}

/// Reads at most `max` bytes of `body`; `413` when it is longer, `400` when
/// it cannot be read.
async fn read_body<B>(body: B, max: usize) -> Result<Bytes, StatusCode>
where
    B: http_body::Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    if body.size_hint().lower() > max as u64 {
        return Err(StatusCode::PAYLOAD_TOO_LARGE);
    }
    let mut body = pin!(body);
    let mut out = BytesMut::new();
    while let Some(frame) = poll_fn(|cx| body.as_mut().poll_frame(cx)).await {
        let frame = frame.map_err(|_| StatusCode::BAD_REQUEST)?;
        if let Ok(data) = frame.into_data() {
            if out.len() + data.len() > max {
                return Err(StatusCode::PAYLOAD_TOO_LARGE);
            }
            out.extend_from_slice(&data);
        }
    }
    Ok(out.freeze())
}

fn body_refused(status: StatusCode, max: usize) -> Response<response::Body> {
    let message = if status == StatusCode::PAYLOAD_TOO_LARGE {
        format!("the request body is larger than {max} bytes")
    } else {
        "the request body could not be read".to_owned()
    };
    let body = response::Body::new(
        json!({ "message": message }).to_string(),
        Refusal::Malformed,
    );
    let mut response = Response::new(body);
    *response.status_mut() = status;
    response.headers_mut().insert(
        CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    response
}
