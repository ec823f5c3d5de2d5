//! Admitting a request: identify the caller and the cost, check the access
//! lists and the local deciders, ask the main store, and judge its decision
//! into a verdict. Also the peek, which asks without charging, and what the
//! process remembers of the main store's decisions.

use std::sync::Arc;

use axum::body::Body;
use http::request::Parts;
use http::Response;
use tracing::Instrument;

use super::settle::mark_degraded;
use super::{Decided, Decider, Limiter, Pass, Verdict};
use crate::access::Listed;
use crate::decision::Decision;
use crate::error::{KeyError, StoreError, StoreErrorKind};
use crate::failure::FailurePolicy;
use crate::key::Key;
use crate::metrics::{Outcome, Stopwatch};
use crate::response;
use crate::store::Store;

/// The span of a request decided while no subscriber takes debug spans:
/// disabled, and shared, so the untraced path neither makes nor drops one.
static UNTRACED: tracing::Span = tracing::Span::none();

/// A request [`Limiter::admit_now`] could not decide without awaiting the
/// store; [`Limiter::admit_later`] goes on from here.
pub(crate) struct Pending {
    waiting: Waiting,
    span: tracing::Span,
}

impl Pending {
    /// Deciding stopped at `key`'s store call, inside `span`.
    fn new(key: Key, cost: u64, failed: Option<StoreErrorKind>, span: &tracing::Span) -> Self {
        Self {
            waiting: Waiting { key, cost, failed },
            span: span.clone(),
        }
    }
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
    ///
    /// Two steps rather than one awaited path: an answer given in process
    /// then builds and polls no future (BENCHMARKS.md, "One decision path,
    /// awaited", measures what one path would add). The steps share all
    /// but the await.
    ///
    /// The verdict goes back with its outcome, as the decision built it:
    /// re-wrapped into another type it would be copied.
    pub(crate) fn admit_now(&self, parts: &mut Parts) -> Result<Decided, Pending> {
        // No subscriber takes debug spans: none is made (nor dropped).
        if tracing::level_enabled!(tracing::Level::DEBUG) {
            return self.admit_now_traced(parts);
        }
        let admitted = self.decide_now(parts, &UNTRACED);
        if let Ok((_, outcome)) = &admitted {
            self.metrics.decision(*outcome);
        }
        admitted
    }

    /// [`admit_now`](Self::admit_now) inside its span, when a subscriber
    /// may listen at debug level. Out of line and marked cold so that the
    /// untraced path, every request's in production, is one compact run
    /// of code rather than interleaved with a second copy of the decision.
    #[cold]
    #[inline(never)]
    fn admit_now_traced(&self, parts: &mut Parts) -> Result<Decided, Pending> {
        let span = tracing::debug_span!(
            "rate_limit",
            policy = self.policy.name(),
            key = tracing::field::Empty,
            outcome = tracing::field::Empty,
            remaining = tracing::field::Empty,
        );
        let admitted = {
            let _entered = span.enter();
            self.decide_now(parts, &span)
        };
        if let Ok((_, outcome)) = &admitted {
            self.record(*outcome, &span);
        }
        admitted
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
        self.record(outcome, &span);
        verdict
    }

    fn record(&self, outcome: Outcome, span: &tracing::Span) {
        self.metrics.decision(outcome);
        // Recording into a disabled span still walks its fields: skipped.
        if !span.is_disabled() {
            span.record("outcome", outcome.as_str());
            tracing::debug!(parent: span, "rate limit decision");
        }
    }

    /// As far as the request can be decided without awaiting.
    #[inline(always)]
    fn decide_now(&self, parts: &mut Parts, span: &tracing::Span) -> Result<Decided, Pending> {
        let (key, cost) = match self.identify(parts, span) {
            Ok(identified) => identified,
            Err(decided) => return Ok(decided),
        };
        // The store's answer is matched where the call leaves it and noted
        // in its arm: each binding or re-wrapping of the decision would
        // copy it. Not timed: the latency histogram measures waits on a
        // store out of process, and an answer in process has none to show.
        let err = if self.cooling_down() {
            StoreError::cooling_down()
        } else {
            match self.store.check_now(&self.policy, &key, cost) {
                Some(Ok(decision)) => {
                    self.note_answer();
                    return Ok(self.judge(parts, key, cost, decision, Decider::Main, None, span));
                }
                Some(Err(err)) => {
                    self.note_failure(&key, &err);
                    err
                }
                None => return Err(Pending::new(key, cost, None, span)),
            }
        };
        let (key, local, kind) = match self.after_failure(parts, key, err) {
            Ok(decided) => return Ok(decided),
            Err(fallback) => fallback,
        };
        self.seed(local, &key);
        match local.check_now(&self.policy, &key, cost) {
            Some(result) => Ok(self.fallen_back(parts, key, cost, kind, result, span)),
            None => Err(Pending::new(key, cost, Some(kind), span)),
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
        let (key, local, kind) = match failed {
            Some(kind) => match &self.failure {
                FailurePolicy::Local(local) => (key, local, kind),
                // Only a local failure policy leaves a request waiting on a fallback.
                _ => return (Verdict::Pass(Pass::bare(Some(kind))), Outcome::FailOpen),
            },
            None => {
                let err = match self.ask_main(&key, cost).await {
                    Ok(decision) => {
                        return self.judge(parts, key, cost, decision, Decider::Main, None, span)
                    }
                    Err(err) => err,
                };
                match self.after_failure(parts, key, err) {
                    Ok(decided) => return decided,
                    Err(fallback) => fallback,
                }
            }
        };
        // `decide_now`'s tail, awaited: sharing it would add a future to the path that answers at once.
        self.seed(local, &key);
        let result = Box::pin(self.ask(&**local, &key, cost)).await;
        self.fallen_back(parts, key, cost, kind, result, span)
    }

    /// What a failure of the main store comes to, whether it answered at
    /// once ([`decide_now`](Self::decide_now)) or was awaited
    /// ([`decide_later`](Self::decide_later)): the failure policy's
    /// verdict, or (a local fallback) the key handed back with the store to
    /// ask instead.
    // Not boxed: the verdict goes back by value, as on the paths that
    // answer at once, which must not allocate.
    #[allow(clippy::result_large_err)]
    fn after_failure(
        &self,
        parts: &mut Parts,
        key: Key,
        err: StoreError,
    ) -> Result<Decided, (Key, &Arc<dyn Store>, StoreErrorKind)> {
        match self.on_failure(parts, err) {
            Ok((local, kind)) => Err((key, local, kind)),
            Err(decided) => Ok(decided),
        }
    }

    /// The caller's key and the request's cost; or the verdict, when the
    /// store need not (allow and deny lists, throttling) or cannot (no key)
    /// be asked.
    // Not boxed: a verdict is every request's result, and boxing it would
    // allocate on the path this split exists to keep allocation-free.
    #[allow(clippy::result_large_err)]
    #[inline(always)]
    fn identify(&self, parts: &mut Parts, span: &tracing::Span) -> Result<(Key, u64), Decided> {
        if let Some(listed) = self.access.check(parts) {
            return Err(self.listed(listed));
        }
        let key = match self.key.extract(parts) {
            Ok(key) => key,
            Err(err) => return Err(self.unidentified(err)),
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

    /// The verdict for a request on an access list: through undecided, or
    /// refused. Out of line, to keep the decision's path compact.
    #[inline(never)]
    fn listed(&self, listed: Listed) -> Decided {
        match listed {
            Listed::Allowed => (Verdict::Pass(Pass::bare(None)), Outcome::AllowListed),
            Listed::Denied => {
                let response = response::denied(self.limited_status, &self.policy);
                (Verdict::Respond(response), Outcome::DenyListed)
            }
        }
    }

    /// The verdict for a request whose key could not be taken: the key
    /// error's response, or (in shadow mode) through undecided.
    #[cold]
    #[inline(never)]
    fn unidentified(&self, err: KeyError) -> Decided {
        tracing::debug!(policy = self.policy.name(), error = %err, "rate limit key not found");
        if self.shadow {
            return (Verdict::Pass(Pass::bare(None)), Outcome::KeyError);
        }
        let response = response::unidentified(self.key_error_status, &err);
        (Verdict::Respond(response), Outcome::KeyError)
    }

    /// Turns a store's decision into the verdict: a rejection's response,
    /// or a pass carrying what settling it needs.
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    pub(super) fn judge(
        &self,
        parts: &mut Parts,
        key: Key,
        cost: u64,
        decision: Decision,
        decider: Decider,
        degraded: Option<StoreErrorKind>,
        span: &tracing::Span,
    ) -> Decided {
        if decider == Decider::Main {
            self.learn_from_main(&key, cost, &decision);
        }
        if !span.is_disabled() {
            span.record("remaining", decision.remaining);
        }
        let outcome = match (decision.allowed, decider) {
            (true, Decider::Main) => Outcome::Allowed,
            (true, Decider::Fallback) => Outcome::Fallback,
            (false, _) if self.shadow => Outcome::ShadowLimited,
            (false, _) => Outcome::Limited,
        };
        let fallback = decider == Decider::Fallback;
        if outcome == Outcome::Limited {
            let response = self.rejection(&decision, decider, degraded);
            return (Verdict::Respond(response), outcome);
        }
        // A shadow-limited request goes on with `allowed == false` in its
        // extensions (if asked for); its response shows the rejection's
        // headers (Remaining 0) without Retry-After. The store did not
        // charge it.
        if self.decision_extension {
            put_in_extensions(parts, &decision, fallback);
        }
        // The decision goes into the pass as it came from the store and is
        // amended there: each move of it on the way is a copy.
        let mut pass = Pass {
            key: Some(key),
            decision: Some(decision),
            decider,
            degraded,
        };
        if let Some(decision) = &mut pass.decision {
            decision.fallback = fallback;
            decision.retry_after = None;
            if self.shadow {
                // Shadow mode never changes traffic: a leaky bucket's wait
                // is recorded (the extension shows it) but not served.
                decision.delay = None;
            }
        }
        (Verdict::Pass(pass), outcome)
    }

    /// A rejection's response, marked when the decision was degraded. Out
    /// of line: a 429 is answered by this call, a pass skips its code.
    #[inline(never)]
    fn rejection(
        &self,
        decision: &Decision,
        decider: Decider,
        degraded: Option<StoreErrorKind>,
    ) -> Response<Body> {
        let mut response =
            response::limited(self.limited_status, &self.policy, decision, &self.headers);
        if let Some(kind) = degraded {
            mark_degraded(response.headers_mut(), kind, decider);
        }
        response
    }

    /// The caller's current state, without charging. It follows the
    /// failure policy: while the main store fails (or within the cooldown
    /// after it did), a local fallback answers, and the decision says so
    /// ([`Decision::fallback`]); other policies have no state to show.
    pub(crate) async fn peek(&self, parts: &Parts) -> Result<Decision, crate::error::PeekError> {
        let key = self
            .key
            .extract(parts)
            .map_err(crate::error::PeekError::Key)?;
        self.peek_key(&key)
            .await
            .map_err(crate::error::PeekError::Store)
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
        self.answered_main(key, result, waited)
    }

    /// What [`ask_main`](Self::ask_main) does with the main store's
    /// answer: time it, and note a failure (starting the cooldown) or an
    /// answer.
    fn answered_main(
        &self,
        key: &Key,
        result: Result<Decision, StoreError>,
        waited: Stopwatch,
    ) -> Result<Decision, StoreError> {
        self.metrics.store_latency(waited);
        self.note_result(key, &result);
        result
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
}

/// Puts a copy of `decision` in the request's extensions, for handlers
/// ([`RateLimitLayerBuilder::decision_extension`](crate::layer::RateLimitLayerBuilder::decision_extension)).
/// Out of line: most layers do not ask for it.
#[inline(never)]
fn put_in_extensions(parts: &mut Parts, decision: &Decision, fallback: bool) {
    let mut decision = decision.clone();
    decision.fallback = fallback;
    parts.extensions.insert(decision);
}
