//! The request path's logic, apart from tower's plumbing: identify, decide
//! (within a deadline, with a failure policy), and settle refunds.

use std::future::poll_fn;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use axum::body::Body;
use http::header::{HeaderMap, HeaderName, HeaderValue};
use http::request::Parts;
use http::{Response, StatusCode};
use tracing::Instrument;

use crate::access::{Access, Listed};
use crate::decision::Decision;
use crate::error::{StoreError, StoreErrorKind};
use crate::failure::{monotonic_nanos, FailurePolicy, Health};
use crate::headers::PolicyHeaders;
use crate::key::{Key, KeyExtractor};
use crate::local::seed::Learned;
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
/// use tollgate::error::StoreErrorKind;
/// use tollgate::layer::Fallback;
/// let marker = Fallback { kind: StoreErrorKind::Timeout };
/// assert_eq!(marker.kind.as_str(), "timeout");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fallback {
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
    /// Until when (ns since [`EPOCH`](crate::failure::EPOCH)) the main
    /// store is skipped after a failure.
    pub(crate) skip_store_until: AtomicU64,
    /// Whether the main store is failing, for logging outages once.
    pub(crate) health: Health,
    /// The main store's last word per key, which the local fallback starts
    /// from; `None` without a local fallback, or for the concurrency limit.
    pub(crate) learned: Option<Learned>,
    /// Throttling mode and the local decision cache (high-volume mode).
    pub(crate) local: crate::local::LocalDecisions,
}

/// Which store decided a request; refunds go back to the same one.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Decider {
    Main,
    Fallback,
}

/// The shortest wait a leaky bucket's pass is made to serve: a tenth of
/// Tokio's timer tick. Any sleep ends on a tick, once a millisecond, so a
/// flood at a high rate (turns microseconds apart) would otherwise arm a
/// timer per request and wait up to a millisecond for a turn a few
/// microseconds away. Passing such a request at once starts it at most
/// 0.1 ms early, well inside the timer's own resolution. The turn itself,
/// and the bucket's rate, are the store's and do not change.
const SHORTEST_WAIT: Duration = Duration::from_micros(100);

/// A request allowed through, with what is needed to settle it.
pub(crate) struct Pass {
    key: Option<Key>,
    decision: Option<Decision>,
    decider: Decider,
    degraded: Option<StoreErrorKind>,
}

impl Pass {
    /// How long the request waits for its turn (a leaky bucket's queue),
    /// if at least [`SHORTEST_WAIT`].
    pub(crate) fn delay(&self) -> Option<Duration> {
        let delay = self.decision.as_ref().and_then(|d| d.delay)?;
        (delay >= SHORTEST_WAIT).then_some(delay)
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

/// The outcome of admitting a request.
pub(crate) enum Verdict {
    Pass(Pass),
    Respond(Response<Body>),
}

/// A verdict and how it is counted.
type Decided = (Verdict, Outcome);

/// A request [`Limiter::admit_now`] could not decide without awaiting the
/// store; [`Limiter::admit_later`] goes on from here.
pub(crate) struct Pending {
    waiting: Waiting,
    span: tracing::Span,
}

/// Where deciding stopped to await a store.
struct Waiting {
    key: Key,
    cost: u64,
    /// `Some`: the main store failed so, and the local fallback is awaited.
    failed: Option<StoreErrorKind>,
}

impl Limiter {
    /// Identifies the caller and decides, if that needs no waiting: the
    /// store answers at once (an in-process store) or is not asked at all
    /// (allow and deny lists, a missing key, throttling). Otherwise hands
    /// back what [`admit_later`](Self::admit_later) needs to go on. Either
    /// way the outcome is counted once, and traced in a debug span with the
    /// policy, the hashed key and the outcome.
    pub(crate) fn admit_now(&self, parts: &mut Parts) -> Result<Verdict, Pending> {
        let span = tracing::debug_span!(
            "rate_limit",
            policy = self.policy.name(),
            key = tracing::field::Empty,
            outcome = tracing::field::Empty,
            remaining = tracing::field::Empty,
        );
        let step = if span.is_disabled() {
            self.decide_now(parts, &span)
        } else {
            let _entered = span.enter();
            self.decide_now(parts, &span)
        };
        match step {
            Ok((verdict, outcome)) => Ok(self.record(verdict, outcome, &span)),
            Err(Waiting { key, cost, failed }) => Err(Pending {
                waiting: Waiting { key, cost, failed },
                span,
            }),
        }
    }

    /// Goes on where [`admit_now`](Self::admit_now) stopped, awaiting the
    /// store (never past the deadline).
    pub(crate) async fn admit_later(&self, parts: &mut Parts, pending: Pending) -> Verdict {
        let Pending { waiting, span } = pending;
        // Instrumenting costs a move of the whole decision's future even
        // when nobody listens: only when the span is on.
        let (verdict, outcome) = if span.is_disabled() {
            self.decide_later(parts, waiting, &span).await
        } else {
            self.decide_later(parts, waiting, &span)
                .instrument(span.clone())
                .await
        };
        self.record(verdict, outcome, &span)
    }

    fn record(&self, verdict: Verdict, outcome: Outcome, span: &tracing::Span) -> Verdict {
        self.metrics.decision(outcome);
        span.record("outcome", outcome.as_str());
        tracing::debug!(parent: span, "rate limit decision");
        verdict
    }

    /// As far as the request can be decided without awaiting.
    fn decide_now(&self, parts: &mut Parts, span: &tracing::Span) -> Result<Decided, Waiting> {
        let (key, cost) = match self.identify(parts, span) {
            Ok(identified) => identified,
            Err(decided) => return Ok(decided),
        };
        let Some(result) = self.ask_main_now(&key, cost) else {
            return Err(Waiting {
                key,
                cost,
                failed: None,
            });
        };
        let err = match result {
            Ok(decision) => {
                return Ok(self.judge(parts, key, cost, decision, Decider::Main, None, span))
            }
            Err(err) => err,
        };
        let (local, kind) = match self.on_failure(parts, err) {
            Ok(fallback) => fallback,
            Err(decided) => return Ok(decided),
        };
        self.seed(local, &key);
        match local.check_now(&self.policy, &key, cost) {
            Some(result) => Ok(self.fallen_back(parts, key, cost, kind, result, span)),
            None => Err(Waiting {
                key,
                cost,
                failed: Some(kind),
            }),
        }
    }

    /// The rest of [`decide_now`](Self::decide_now), awaiting the store.
    async fn decide_later(
        &self,
        parts: &mut Parts,
        waiting: Waiting,
        span: &tracing::Span,
    ) -> Decided {
        let Waiting { key, cost, failed } = waiting;
        let kind = match failed {
            Some(kind) => kind,
            None => {
                let err = match self.ask_main(&key, cost).await {
                    Ok(decision) => {
                        return self.judge(parts, key, cost, decision, Decider::Main, None, span)
                    }
                    Err(err) => err,
                };
                match self.on_failure(parts, err) {
                    Ok((_, kind)) => kind,
                    Err(decided) => return decided,
                }
            }
        };
        let FailurePolicy::Local(local) = &self.failure else {
            // Only a local failure policy leaves a request waiting on a fallback.
            return (Verdict::Pass(Pass::bare(Some(kind))), Outcome::FailOpen);
        };
        self.seed(local, &key);
        let result = Box::pin(self.ask(&**local, &key, cost)).await;
        self.fallen_back(parts, key, cost, kind, result, span)
    }

    /// The caller's key and the request's cost; or the verdict, when the
    /// store need not (allow and deny lists, throttling) or cannot (no key)
    /// be asked.
    // Not boxed: a verdict is every request's result, and boxing it would
    // allocate on the path this split exists to keep allocation-free.
    #[allow(clippy::result_large_err)]
    fn identify(&self, parts: &mut Parts, span: &tracing::Span) -> Result<(Key, u64), Decided> {
        match self.access.check(parts) {
            None => {}
            Some(Listed::Allowed) => {
                return Err((Verdict::Pass(Pass::bare(None)), Outcome::AllowListed))
            }
            Some(Listed::Denied) => {
                let response = response::denied(self.limited_status, &self.policy);
                return Err((Verdict::Respond(response), Outcome::DenyListed));
            }
        }
        let key = match self.key.extract(parts) {
            Ok(key) => key,
            Err(err) => {
                tracing::debug!(policy = self.policy.name(), error = %err, "rate limit key not found");
                if self.shadow {
                    return Err((Verdict::Pass(Pass::bare(None)), Outcome::KeyError));
                }
                let response = response::unidentified(self.key_error_status, &err);
                return Err((Verdict::Respond(response), Outcome::KeyError));
            }
        };
        if !span.is_disabled() {
            span.record("key", key.hashed());
        }
        let cost = self.cost.as_ref().map_or(1, |f| f(parts));
        if let Some((response, outcome)) = self.local.before_store(self, &key, cost) {
            return Err((Verdict::Respond(response), outcome));
        }
        Ok((key, cost))
    }

    /// Applies the failure policy to a failed main store: the verdict, or
    /// the local store to ask instead.
    // Not boxed: a verdict is every request's result, and boxing it would
    // allocate on the path this split exists to keep allocation-free.
    #[allow(clippy::result_large_err)]
    fn on_failure(
        &self,
        parts: &mut Parts,
        err: StoreError,
    ) -> Result<(&Arc<dyn Store>, StoreErrorKind), Decided> {
        self.health.decided_without_store();
        let kind = err.kind();
        parts.extensions.insert(Fallback { kind });
        match &self.failure {
            FailurePolicy::Open => Err((Verdict::Pass(Pass::bare(Some(kind))), Outcome::FailOpen)),
            // Shadow mode never rejects: fail open instead.
            FailurePolicy::Closed { .. } if self.shadow => {
                Err((Verdict::Pass(Pass::bare(Some(kind))), Outcome::FailOpen))
            }
            FailurePolicy::Closed { retry_after } => {
                let secs = (retry_after.as_micros() as u64).div_ceil(1_000_000);
                Err((
                    Verdict::Respond(response::unavailable(secs)),
                    Outcome::FailClosed,
                ))
            }
            FailurePolicy::Local(local) => Ok((local, kind)),
        }
    }

    /// The verdict of the local fallback store, asked because the main one
    /// failed with `kind`.
    fn fallen_back(
        &self,
        parts: &mut Parts,
        key: Key,
        cost: u64,
        kind: StoreErrorKind,
        result: Result<Decision, StoreError>,
        span: &tracing::Span,
    ) -> Decided {
        match result {
            Ok(decision) => self.judge(
                parts,
                key,
                cost,
                decision,
                Decider::Fallback,
                Some(kind),
                span,
            ),
            Err(err) => {
                tracing::warn!(policy = self.policy.name(), key = %key.hashed(), error = %err, "fallback store failed too; letting the request through");
                (Verdict::Pass(Pass::bare(Some(kind))), Outcome::FailOpen)
            }
        }
    }

    /// Turns a store's decision into the verdict: a rejection's response,
    /// or a pass carrying what settling it needs.
    #[allow(clippy::too_many_arguments)]
    fn judge(
        &self,
        parts: &mut Parts,
        key: Key,
        cost: u64,
        decision: Decision,
        decider: Decider,
        degraded: Option<StoreErrorKind>,
        span: &tracing::Span,
    ) -> Decided {
        if decider == Decider::Main && !self.shadow {
            self.local.after_store(&self.policy, &key, cost, &decision);
            if let Some(learned) = &self.learned {
                learned.learn(&key, &decision);
            }
        }
        let mut decision = decision;
        decision.fallback = decider == Decider::Fallback;
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

    /// After the inner service answered: refunds if its status says so and
    /// the store can at once, then writes the headers. Hands `pass` back
    /// when the refund must be awaited ([`settle`](Self::settle)).
    // Not boxed: a verdict is every request's result, and boxing it would
    // allocate on the path this split exists to keep allocation-free.
    #[allow(clippy::result_large_err)]
    pub(crate) fn settle_now(
        &self,
        pass: Pass,
        status: StatusCode,
        headers: &mut HeaderMap,
    ) -> Result<(), Pass> {
        if self.refund_due(&pass, status) {
            let refunded = match (&pass.key, &pass.decision) {
                (Some(key), Some(decision)) => {
                    self.store_of(pass.decider)
                        .refund_now(&self.policy, key, &decision.receipt)
                }
                _ => None,
            };
            let Some(result) = refunded else {
                return Err(pass);
            };
            let pass = self.refunded(pass, result);
            self.write_headers(pass, headers);
        } else {
            self.write_headers(pass, headers);
        }
        Ok(())
    }

    /// [`settle_now`](Self::settle_now), awaiting the refund (never past the
    /// deadline).
    pub(crate) async fn settle(&self, pass: Pass, status: StatusCode, headers: &mut HeaderMap) {
        let pass = if self.refund_due(&pass, status) {
            // Boxed, as the rare path it is: every request's future would
            // otherwise carry room for it.
            Box::pin(self.refund(pass)).await
        } else {
            pass
        };
        self.write_headers(pass, headers);
    }

    /// Whether `pass`'s charge goes back, the response being `status`.
    fn refund_due(&self, pass: &Pass, status: StatusCode) -> bool {
        // A held slot (concurrency) is given back when the body ends, by its
        // release guard, whatever the status. Releasing here as well would be
        // harmless (releases are by id) but a second round trip, and would
        // free the slot before the response is sent.
        pass.key.is_some()
            && pass
                .decision
                .as_ref()
                .is_some_and(|d| !d.receipt.is_empty())
            && (self.refund_when)(status)
            && !self.policy.strategy().holds_until_response_ends()
    }

    /// Gives `pass`'s charge back to the store that decided.
    async fn refund(&self, pass: Pass) -> Pass {
        let result = match (&pass.key, &pass.decision) {
            (Some(key), Some(decision)) => {
                let call = self
                    .store_of(pass.decider)
                    .refund(&self.policy, key, &decision.receipt);
                self.within_deadline(call).await.0
            }
            _ => return pass,
        };
        self.refunded(pass, result)
    }

    /// `pass` as it stands after its refund ended with `result`.
    fn refunded(&self, mut pass: Pass, result: Result<(), StoreError>) -> Pass {
        let (Some(key), Some(decision)) = (&pass.key, pass.decision.take()) else {
            return pass;
        };
        let decision = match result {
            Ok(()) => {
                if pass.decider == Decider::Main {
                    self.note_answer();
                }
                self.local.refunded(key);
                let cost = decision.receipt.cost();
                decision.refunded(cost)
            }
            Err(err) => {
                self.note_error(key, &err);
                decision
            }
        };
        pass.decision = Some(decision);
        pass
    }

    /// The headers a settled pass shows.
    fn write_headers(&self, pass: Pass, headers: &mut HeaderMap) {
        if let Some(kind) = pass.degraded {
            mark_degraded(headers, kind, pass.decider);
        }
        if let (Some(_), Some(decision)) = (&pass.key, &pass.decision) {
            self.headers.apply(headers, &self.policy, decision);
        }
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
            pass.delay().is_some() || self.policy.strategy().holds_until_response_ends();
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
        self.store_of(decider).clone()
    }

    fn store_of(&self, decider: Decider) -> &Arc<dyn Store> {
        match (decider, &self.failure) {
            (Decider::Fallback, FailurePolicy::Local(local)) => local,
            _ => &self.store,
        }
    }

    /// The caller's current state, without charging. It follows the
    /// failure policy: while the main store fails (or within the cooldown
    /// after it did), a local fallback answers, and the decision says so
    /// ([`Decision::fallback`]); other policies have no state to show.
    pub(crate) async fn peek(&self, parts: &Parts) -> Result<Decision, crate::layer::PeekError> {
        let key = self
            .key
            .extract(parts)
            .map_err(crate::layer::PeekError::Key)?;
        self.peek_key(&key)
            .await
            .map_err(crate::layer::PeekError::Store)
    }

    /// `key`'s state, charging nothing: the main store within the deadline,
    /// else (with a local fallback) the fallback, marked as such.
    pub(crate) async fn peek_key(&self, key: &Key) -> Result<Decision, StoreError> {
        let err = if self.cooling_down() {
            StoreError::cooling_down()
        } else {
            let peek = self.store.peek(&self.policy, key);
            match self.within_deadline(peek).await.0 {
                Ok(decision) => return Ok(decision),
                Err(err) => err,
            }
        };
        let FailurePolicy::Local(local) = &self.failure else {
            return Err(err);
        };
        tracing::debug!(policy = self.policy.name(), key = %key.hashed(), error = %err,
            "rate limit store failed a peek; answering from the local fallback");
        self.seed(local, key);
        let peek = local.peek(&self.policy, key);
        match self.within_deadline(peek).await.0 {
            Ok(mut decision) => {
                decision.fallback = true;
                Ok(decision)
            }
            Err(_) => Err(err),
        }
    }

    /// What the main store decided, remembered as the layer would: for the
    /// cache of rejections and the fallback's starting point.
    pub(crate) fn learn_from_main(&self, key: &Key, cost: u64, decision: &Decision) {
        if self.shadow {
            return;
        }
        self.local.after_store(&self.policy, key, cost, decision);
        if let Some(learned) = &self.learned {
            learned.learn(key, decision);
        }
    }

    /// Forgets what this process remembers of `key` (after a reset).
    pub(crate) fn forget(&self, key: &Key) {
        self.local.refunded(key);
        if let Some(learned) = &self.learned {
            learned.forget(key);
        }
    }

    /// Before the local fallback first decides (or shows) `key` in an
    /// outage: charges it what the main store last said was spent in the
    /// window still open, so this server does not hand out a fresh budget
    /// at the switch. Only a fallback that answers at once (the memory
    /// store) is seeded; the charge is made while the record is held, so
    /// no concurrent fallback decision for `key` can come before it.
    pub(crate) fn seed(&self, local: &Arc<dyn Store>, key: &Key) {
        let Some(learned) = &self.learned else { return };
        learned.seed(key, |used| {
            if let Some(Err(err)) = local.check_now(&self.policy, key, used) {
                tracing::debug!(policy = self.policy.name(), error = %err,
                    "cannot seed the local fallback");
            }
        });
    }

    /// Asks the main store, unless it failed within the cooldown: then the
    /// failure policy applies at once instead of every request waiting out
    /// the deadline against a store that is down or drowning.
    pub(crate) async fn ask_main(&self, key: &Key, cost: u64) -> Result<Decision, StoreError> {
        if self.cooling_down() {
            return Err(StoreError::cooling_down());
        }
        let (result, waited) = self
            .within_deadline(self.store.check_before(
                &self.policy,
                key,
                cost,
                std::time::Instant::now() + self.deadline,
            ))
            .await;
        self.metrics.store_latency(waited);
        self.note_failure(key, &result);
        result
    }

    /// [`ask_main`](Self::ask_main) for a store that answers at once; `None`
    /// if it cannot.
    fn ask_main_now(&self, key: &Key, cost: u64) -> Option<Result<Decision, StoreError>> {
        if self.cooling_down() {
            return Some(Err(StoreError::cooling_down()));
        }
        let result = self.store.check_now(&self.policy, key, cost)?;
        self.metrics.store_latency(Stopwatch::idle());
        self.note_failure(key, &result);
        Some(result)
    }

    /// Whether the main store failed within the cooldown.
    fn cooling_down(&self) -> bool {
        // Zero until the store first fails: no clock read on the hot path.
        let skip_until = self.skip_store_until.load(Ordering::Relaxed);
        skip_until != 0 && monotonic_nanos() < skip_until
    }

    /// Counts a failed main-store call and starts the cooldown; logs the
    /// start of an outage (a warning) and its end (an info line), calls in
    /// between at debug.
    fn note_failure<T>(&self, key: &Key, result: &Result<T, StoreError>) {
        let err = match result {
            Ok(_) => return self.note_answer(),
            Err(err) => err,
        };
        self.note_error(key, err);
        if !self.cooldown.is_zero() {
            let until = monotonic_nanos() + self.cooldown.as_nanos() as u64;
            self.skip_store_until.fetch_max(until, Ordering::Relaxed);
        }
    }

    /// The main store answered: logs the end of an outage, if this ends one.
    #[inline]
    fn note_answer(&self) {
        if let Some((lasted, without)) = self.health.answered() {
            tracing::info!(
                policy = self.policy.name(),
                outage_ms = lasted.as_millis() as u64,
                decided_without_store = without,
                "rate limit store answers again"
            );
        }
    }

    /// Counts a failed main-store call (a check, refund or release) and
    /// logs it: a warning if it starts an outage, else at debug.
    pub(crate) fn note_error(&self, key: &Key, err: &StoreError) {
        self.metrics.store_error(err.kind());
        if self.health.failed() {
            tracing::warn!(policy = self.policy.name(), key = %key.hashed(), error = %err, kind = err.kind().as_str(),
                "rate limit store failed; applying failure policy until it answers again");
        } else {
            tracing::debug!(policy = self.policy.name(), key = %key.hashed(), error = %err, kind = err.kind().as_str(),
                "rate limit store failed");
        }
    }

    pub(crate) async fn ask(
        &self,
        store: &dyn Store,
        key: &Key,
        cost: u64,
    ) -> Result<Decision, StoreError> {
        self.within_deadline(store.check(&self.policy, key, cost))
            .await
            .0
    }

    /// Awaits a store call until the deadline, timing the wait. A call that
    /// is ready when first polled (the memory store's, every time) arms no
    /// timer and reads no clock: it waited for nothing, and its stopwatch
    /// says zero. Otherwise the deadline counts from that first poll.
    pub(crate) async fn within_deadline<T>(
        &self,
        mut call: BoxFuture<'_, Result<T, StoreError>>,
    ) -> (Result<T, StoreError>, Stopwatch) {
        if let Poll::Ready(result) = poll_fn(|cx| Poll::Ready(call.as_mut().poll(cx))).await {
            return (result, Stopwatch::idle());
        }
        let watch = Stopwatch::start();
        // Inline, not boxed: only a store that keeps a request waiting (Redis)
        // gets here, inside the one future the layer boxes for it anyway.
        match tokio::time::timeout(self.deadline, call).await {
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
