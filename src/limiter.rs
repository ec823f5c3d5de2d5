//! The request path's logic, apart from tower's plumbing: identify, decide
//! (within a deadline, with a failure policy), and settle refunds.

use std::future::poll_fn;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock};
use std::task::Poll;
use std::time::{Duration, Instant};

use axum::body::Body;
use http::header::{HeaderMap, HeaderName, HeaderValue};
use http::request::Parts;
use http::{Response, StatusCode};
use tracing::Instrument;

use crate::access::{Access, Listed};
use crate::decision::Decision;
use crate::error::{StoreError, StoreErrorKind};
use crate::failure::FailurePolicy;
use crate::headers::PolicyHeaders;
use crate::key::{Key, KeyExtractor};
use crate::metrics::{Outcome, PolicyMetrics, Stopwatch};
use crate::quota::Policy;
use crate::release::ReleaseGuard;
use crate::response;
use crate::store::{BoxFuture, Store};

static FALLBACK: HeaderName = HeaderName::from_static("x-ratelimit-fallback");

/// Price of a request in quota units, from its head.
pub(crate) type CostFn = dyn Fn(&Parts) -> u64 + Send + Sync;
/// Whether a response's status makes its charge refundable.
pub(crate) type RefundFn = dyn Fn(StatusCode) -> bool + Send + Sync;

/// Put in the request's extensions when the store failed and the request was
/// let through or decided locally, so handlers can tell.
///
/// ```
/// use tollgate::{StoreErrorKind, StoreUnavailable};
/// let marker = StoreUnavailable { kind: StoreErrorKind::Timeout };
/// assert_eq!(marker.kind.as_str(), "timeout");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoreUnavailable {
    /// What went wrong with the store.
    pub kind: StoreErrorKind,
}

/// Everything the layer was configured with; shared by all service clones.
pub(crate) struct Limiter {
    pub(crate) policy: Policy,
    pub(crate) store: Arc<dyn Store>,
    pub(crate) key: Arc<dyn KeyExtractor>,
    pub(crate) cost: Option<Arc<CostFn>>,
    pub(crate) deadline: Duration,
    pub(crate) failure: FailurePolicy,
    pub(crate) limited_status: StatusCode,
    pub(crate) key_error_status: StatusCode,
    pub(crate) refund_when: Arc<RefundFn>,
    pub(crate) headers: PolicyHeaders,
    /// Decide and count, but never reject (deny-lists aside).
    pub(crate) shadow: bool,
    pub(crate) access: Access,
    pub(crate) metrics: PolicyMetrics,
    pub(crate) cooldown: Duration,
    /// Until when (ns since [`EPOCH`]) the main store is skipped after a failure.
    pub(crate) skip_store_until: AtomicU64,
    /// Throttling mode and the local decision cache (high-volume mode).
    pub(crate) local: crate::local::LocalDecisions,
}

/// A process-wide monotonic origin for the breaker's timestamps.
static EPOCH: LazyLock<Instant> = LazyLock::new(Instant::now);

fn monotonic_nanos() -> u64 {
    EPOCH.elapsed().as_nanos() as u64
}

/// Which store decided a request; refunds go back to the same one.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Decider {
    Main,
    Fallback,
}

/// A request allowed through, with what is needed to settle it.
pub(crate) struct Pass {
    key: Option<Key>,
    decision: Option<Decision>,
    decider: Decider,
    degraded: Option<StoreErrorKind>,
}

impl Pass {
    /// How long the request waits for its turn (a leaky bucket's queue).
    pub(crate) fn delay(&self) -> Option<Duration> {
        self.decision.as_ref().and_then(|d| d.delay)
    }

    /// Through without a decision: nothing to settle, no headers.
    fn bare(degraded: Option<StoreErrorKind>) -> Self {
        Pass {
            key: None,
            decision: None,
            decider: Decider::Main,
            degraded,
        }
    }
}

/// The outcome of [`Limiter::admit`].
pub(crate) enum Verdict {
    Pass(Pass),
    Respond(Response<Body>),
}

impl Limiter {
    /// Identifies the caller and decides, never waiting past the deadline;
    /// counts the outcome, and traces it in a debug span with the policy,
    /// the hashed key and the outcome.
    pub(crate) async fn admit(&self, parts: &mut Parts) -> Verdict {
        let span = tracing::debug_span!(
            "rate_limit",
            policy = self.policy.name(),
            key = tracing::field::Empty,
            outcome = tracing::field::Empty,
            remaining = tracing::field::Empty,
        );
        // Instrumenting costs a move of the whole decision's future even
        // when nobody listens: only when the span is on.
        let (verdict, outcome) = if span.is_disabled() {
            self.decide(parts, &span).await
        } else {
            self.decide(parts, &span).instrument(span.clone()).await
        };
        self.metrics.decision(outcome);
        span.record("outcome", outcome.as_str());
        tracing::debug!(parent: &span, "rate limit decision");
        verdict
    }

    async fn decide(&self, parts: &mut Parts, span: &tracing::Span) -> (Verdict, Outcome) {
        match self.access.check(parts) {
            None => {}
            Some(Listed::Allowed) => {
                return (Verdict::Pass(Pass::bare(None)), Outcome::AllowListed)
            }
            Some(Listed::Denied) => {
                let response = response::denied(self.limited_status, &self.policy);
                return (Verdict::Respond(response), Outcome::DenyListed);
            }
        }
        let key = match self.key.extract(parts) {
            Ok(key) => key,
            Err(err) => {
                tracing::debug!(policy = self.policy.name(), error = %err, "rate limit key not found");
                if self.shadow {
                    return (Verdict::Pass(Pass::bare(None)), Outcome::KeyError);
                }
                let response = response::unidentified(self.key_error_status, &err);
                return (Verdict::Respond(response), Outcome::KeyError);
            }
        };
        if !span.is_disabled() {
            span.record("key", key.hashed());
        }
        let cost = self.cost.as_ref().map_or(1, |f| f(parts));
        if let Some((response, outcome)) = self.local.before_store(self, &key, cost) {
            return (Verdict::Respond(response), outcome);
        }

        let (decision, decider, degraded) = match self.ask_main(&key, cost).await {
            Ok(decision) => (decision, Decider::Main, None),
            Err(err) => {
                tracing::warn!(policy = self.policy.name(), key = %key.hashed(), error = %err, kind = err.kind().as_str(),
                    "rate limit store failed; applying failure policy");
                let kind = err.kind();
                parts.extensions.insert(StoreUnavailable { kind });
                match &self.failure {
                    FailurePolicy::Open => {
                        return (Verdict::Pass(Pass::bare(Some(kind))), Outcome::FailOpen)
                    }
                    // Shadow mode never rejects: fail open instead.
                    FailurePolicy::Closed { .. } if self.shadow => {
                        return (Verdict::Pass(Pass::bare(Some(kind))), Outcome::FailOpen)
                    }
                    FailurePolicy::Closed { retry_after } => {
                        let secs = (retry_after.as_micros() as u64).div_ceil(1_000_000);
                        return (
                            Verdict::Respond(response::unavailable(secs)),
                            Outcome::FailClosed,
                        );
                    }
                    FailurePolicy::Local(local) => {
                        match Box::pin(self.ask(&**local, &key, cost)).await {
                            Ok(decision) => (decision, Decider::Fallback, Some(kind)),
                            Err(err) => {
                                tracing::warn!(policy = self.policy.name(), key = %key.hashed(), error = %err, "fallback store failed too; letting the request through");
                                return (Verdict::Pass(Pass::bare(Some(kind))), Outcome::FailOpen);
                            }
                        }
                    }
                }
            }
        };

        if decider == Decider::Main && !self.shadow {
            self.local.after_store(&self.policy, &key, cost, &decision);
        }
        span.record("remaining", decision.remaining);
        let outcome = match (decision.allowed, decider) {
            (true, Decider::Main) => Outcome::Allowed,
            (true, Decider::Fallback) => Outcome::Fallback,
            (false, _) if self.shadow => Outcome::ShadowLimited,
            (false, _) => Outcome::Limited,
        };
        if outcome == Outcome::Limited {
            let mut response =
                response::limited(self.limited_status, &self.policy, &decision, &self.headers);
            if let Some(kind) = degraded {
                mark_degraded(response.headers_mut(), kind, decider);
            }
            return (Verdict::Respond(response), outcome);
        }
        // A shadow-limited request goes on with `allowed == false` in its
        // extensions; its response shows the rejection's headers (Remaining 0)
        // without Retry-After. The store did not charge it.
        parts.extensions.insert(decision.clone());
        let mut decision = decision;
        decision.retry_after = None;
        if self.shadow {
            // Shadow mode never changes traffic: a leaky bucket's wait is
            // recorded (the extension shows it) but not served.
            decision.delay = None;
        }
        let pass = Pass {
            key: Some(key),
            decision: Some(decision),
            decider,
            degraded,
        };
        (Verdict::Pass(pass), outcome)
    }

    /// After the inner service answered: refund if its status says so, then
    /// write the headers.
    pub(crate) async fn settle(&self, pass: Pass, status: StatusCode, headers: &mut HeaderMap) {
        let Pass {
            key,
            decision,
            decider,
            degraded,
        } = pass;
        if let Some(kind) = degraded {
            mark_degraded(headers, kind, decider);
        }
        let (Some(key), Some(mut decision)) = (key, decision) else {
            return;
        };
        // A held slot (concurrency) is given back when the body ends, by its
        // release guard, whatever the status. Releasing here as well would be
        // harmless (releases are by id) but a second round trip, and would
        // free the slot before the response is sent.
        let held = self.policy.strategy().holds_until_response_ends();
        if (self.refund_when)(status) && !decision.receipt.is_empty() && !held {
            // Boxed, as the rare path it is: every request's future would
            // otherwise carry room for it.
            decision = Box::pin(self.refund(decider, &key, decision)).await;
        }
        self.headers.apply(headers, &self.policy, &decision);
    }

    /// Gives `decision`'s charge back to the store that decided, and returns
    /// the decision as it stands after that.
    async fn refund(&self, decider: Decider, key: &Key, decision: Decision) -> Decision {
        let store = self.store_for(decider);
        let refund = store.refund(&self.policy, key, &decision.receipt);
        match self.within_deadline(refund).await.0 {
            Ok(()) => {
                self.local.refunded(key);
                let cost = decision.receipt.cost();
                return decision.refunded(cost);
            }
            Err(err) if err.kind() == StoreErrorKind::Timeout => {
                self.metrics.store_error(StoreErrorKind::Timeout);
                tracing::warn!(policy = self.policy.name(), key = %key.hashed(), "rate limit refund timed out")
            }
            Err(err) => {
                self.metrics.store_error(err.kind());
                tracing::warn!(policy = self.policy.name(), key = %key.hashed(), error = %err, "rate limit refund failed")
            }
        }
        decision
    }

    /// A guard that gives `pass`'s charge back, without blocking, if it is
    /// dropped while armed: for a leaky bucket's pass while it waits its turn
    /// (the client may leave), for a concurrency slot until the response body
    /// ends. `None` when there is nothing to give back.
    pub(crate) fn release_guard(self: &Arc<Self>, pass: &Pass) -> Option<ReleaseGuard> {
        let (Some(key), Some(decision)) = (&pass.key, &pass.decision) else {
            return None;
        };
        let gives_back =
            decision.delay.is_some() || self.policy.strategy().holds_until_response_ends();
        if decision.receipt.is_empty() || !gives_back {
            return None;
        }
        let store = self.store_for(pass.decider);
        Some(ReleaseGuard::new(
            self.clone(),
            store,
            key.clone(),
            decision.receipt.clone(),
        ))
    }

    /// The store that decided: refunds and releases go back to it.
    fn store_for(&self, decider: Decider) -> Arc<dyn Store> {
        match (decider, &self.failure) {
            (Decider::Fallback, FailurePolicy::Local(local)) => local.clone(),
            _ => self.store.clone(),
        }
    }

    /// The caller's current state, without charging.
    pub(crate) async fn peek(&self, parts: &Parts) -> Result<Decision, crate::PeekError> {
        let key = self.key.extract(parts).map_err(crate::PeekError::Key)?;
        let peek = self.store.peek(&self.policy, &key);
        self.within_deadline(peek)
            .await
            .0
            .map_err(crate::PeekError::Store)
    }

    /// Asks the main store, unless it failed within the cooldown: then the
    /// failure policy applies at once instead of every request waiting out
    /// the deadline against a store that is down or drowning.
    async fn ask_main(&self, key: &Key, cost: u64) -> Result<Decision, StoreError> {
        // Zero until the store first fails: no clock read on the hot path.
        let skip_until = self.skip_store_until.load(Ordering::Relaxed);
        if skip_until != 0 && monotonic_nanos() < skip_until {
            return Err(StoreError::cooling_down());
        }
        let (result, waited) = self
            .within_deadline(self.store.check(&self.policy, key, cost))
            .await;
        self.metrics.store_latency(waited);
        if let Err(err) = &result {
            self.metrics.store_error(err.kind());
        }
        if result.is_err() && !self.cooldown.is_zero() {
            let until = monotonic_nanos() + self.cooldown.as_nanos() as u64;
            self.skip_store_until.fetch_max(until, Ordering::Relaxed);
        }
        result
    }

    async fn ask(&self, store: &dyn Store, key: &Key, cost: u64) -> Result<Decision, StoreError> {
        self.within_deadline(store.check(&self.policy, key, cost))
            .await
            .0
    }

    /// Awaits a store call until the deadline, timing the wait. A call that
    /// is ready when first polled (the memory store's, every time) arms no
    /// timer and reads no clock: it waited for nothing, and its stopwatch
    /// says zero. Otherwise the deadline counts from that first poll.
    async fn within_deadline<T>(
        &self,
        mut call: BoxFuture<'_, Result<T, StoreError>>,
    ) -> (Result<T, StoreError>, Stopwatch) {
        if let Poll::Ready(result) = poll_fn(|cx| Poll::Ready(call.as_mut().poll(cx))).await {
            return (result, Stopwatch::idle());
        }
        let watch = Stopwatch::start();
        // Boxed: the timer is large, and kept inline it would grow every
        // request's future past what the allocator serves from its fast,
        // per-thread cache, in-process stores included.
        match Box::pin(tokio::time::timeout(self.deadline, call)).await {
            Ok(result) => (result, watch),
            Err(_) => (Err(StoreError::timeout()), watch),
        }
    }
}

fn mark_degraded(headers: &mut HeaderMap, kind: StoreErrorKind, decider: Decider) {
    let how = if decider == Decider::Fallback {
        "local"
    } else {
        "open"
    };
    headers.insert(FALLBACK.clone(), HeaderValue::from_static(how));
    tracing::trace!(kind = kind.as_str(), how, "degraded rate limit decision");
}
