//! Admitting a request, in the order a request meets the steps:
//! [`Limiter::admit_now`] checks the access lists, identifies the caller,
//! asks the local deciders, then the main store, and judges its decision;
//! a step that can answer the request breaks off with the answer
//! ([`ControlFlow::Break`]), and `?` returns it. When the
//! store must be awaited (Redis), [`Limiter::admit_later`] goes on from
//! there. Also the peek, which asks without charging, and what the process
//! remembers of the main store's decisions.

use std::future::Future;
use std::ops::ControlFlow;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use http::request::Parts;
use http::Response;
use pin_project_lite::pin_project;
use tracing::instrument::Instrumented;
use tracing::Instrument;

use super::settle::mark_degraded;
use super::{Decided, Decider, Limiter, Pass, Verdict};
use crate::access::Listed;
use crate::decision::Decision;
use crate::error::{KeyError, PeekError, StoreError, StoreErrorKind};
use crate::failure::FailurePolicy;
use crate::key::Key;
use crate::local::LocalAnswer;
use crate::metrics::{Outcome, Stopwatch};
use crate::policy::Policy;
use crate::response::{self, Body};
use crate::store::Store;

/// One step of admission: the request is answered now
/// ([`Break`](ControlFlow::Break), with a verdict and how it is counted),
/// or goes on ([`Continue`](ControlFlow::Continue)) with what the next
/// step needs. `?` on a step returns its answer from the steps that called it.
pub(crate) type Step<T> = ControlFlow<Decided, T>;

/// A store's decision for a request, with what judging it needs.
pub(super) struct Judged {
    pub(super) key: Key,
    pub(super) cost: u64,
    /// The policy in force, when it is not the policy as built.
    pub(super) in_force: Option<Arc<Policy>>,
    pub(super) decision: Decision,
}

pin_project! {
    /// [`Limiter::admit_later`]'s future: the decision, in the request's
    /// span, counted once made.
    struct Recorded<'a, F> {
        limiter: &'a Limiter,
        #[pin]
        decided: Instrumented<F>,
    }
}

impl<F: Future<Output = Decided>> Future for Recorded<'_, F> {
    type Output = Verdict;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Verdict> {
        let mut this = self.project();
        let (verdict, outcome) = ready!(this.decided.as_mut().poll(cx));
        this.limiter
            .record(outcome, this.decided.as_ref().get_ref().span());
        Poll::Ready(verdict)
    }
}

/// A request [`Limiter::admit_now`] could not decide without awaiting a
/// store; [`Limiter::admit_later`] goes on from here.
pub(crate) struct Pending {
    key: Key,
    cost: u64,
    /// The policy in force, when it is not the policy as built.
    in_force: Option<Arc<Policy>>,
    /// `Some`: the main store failed so, and the local fallback is awaited.
    failed: Option<StoreErrorKind>,
    span: tracing::Span,
}

impl Pending {
    fn new(
        key: Key,
        cost: u64,
        in_force: Option<Arc<Policy>>,
        failed: Option<StoreErrorKind>,
        span: &tracing::Span,
    ) -> Self {
        let span = span.clone();
        Self {
            key,
            cost,
            in_force,
            failed,
            span,
        }
    }
}

impl Limiter {
    /// Admits a request as far as that needs no waiting, inside a debug span
    /// with the policy, the hashed key and the outcome: answered, or pending
    /// on a store that must be awaited. An in-process store answers here,
    /// so its requests build and poll no future of the limiter's.
    pub(crate) fn admit_now(&self, parts: &mut Parts) -> Step<Pending> {
        let span = tracing::debug_span!(
            "rate_limit",
            policy = self.name(),
            key = tracing::field::Empty,
            outcome = tracing::field::Empty,
            remaining = tracing::field::Empty,
        );
        let step = span.in_scope(|| self.decide_now(parts, &span));
        if let ControlFlow::Break((_, outcome)) = &step {
            self.record(*outcome, &span);
        }
        step
    }

    /// Goes on where [`admit_now`](Self::admit_now) stopped, awaiting the
    /// store (never past the deadline).
    pub(crate) fn admit_later<'a>(
        &'a self,
        parts: &'a mut Parts,
        pending: Pending,
    ) -> impl Future<Output = Verdict> + 'a {
        let span = pending.span.clone();
        Recorded {
            limiter: self,
            decided: self.decide_later(parts, pending).instrument(span),
        }
    }

    /// The steps, in order, each answering the request or handing the
    /// next what it needs.
    fn decide_now(&self, parts: &mut Parts, span: &tracing::Span) -> Step<Pending> {
        self.check_lists(parts)?;
        let key = self.identify(parts, span)?;
        let cost = self.cost_of(parts);
        let in_force = self.policy_in_force(Some(parts));
        self.ask_local_deciders(self.in_force(in_force.as_ref()), &key, cost)?;
        match self.ask_main_now(self.in_force(in_force.as_ref()), &key, cost) {
            Some(Ok(decision)) => {
                ControlFlow::Break(self.judge_main(parts, key, cost, in_force, decision, span))
            }
            Some(Err(err)) => self.fall_back_now(parts, key, cost, in_force, err, span),
            None => ControlFlow::Continue(Pending::new(key, cost, in_force, None, span)),
        }
    }

    /// The rest of [`decide_now`](Self::decide_now), awaiting the store it
    /// stopped at: the main store, or after its failure the local fallback.
    /// Its future is an `async` block over `pending`'s parts: an `async fn`
    /// would keep `pending` twice, in the future the layer boxes.
    fn decide_later<'a>(
        &'a self,
        parts: &'a mut Parts,
        pending: Pending,
    ) -> impl Future<Output = Decided> + 'a {
        let Pending {
            key,
            cost,
            in_force,
            failed,
            span,
        } = pending;
        async move {
            let policy = self.in_force(in_force.as_ref());
            let (local, kind) = match failed {
                None => match self.ask_main_as(policy, &key, cost).await {
                    Ok(decision) => {
                        return self.judge_main(parts, key, cost, in_force, decision, &span);
                    }
                    Err(err) => match self.on_failure(parts, err) {
                        ControlFlow::Continue(fallback) => fallback,
                        ControlFlow::Break(decided) => return decided,
                    },
                },
                Some(kind) => match &self.config.failure {
                    FailurePolicy::Local(local) => (local, kind),
                    // Only a local failure policy leaves a request waiting on a fallback.
                    _ => return (Verdict::Pass(Pass::bare(Some(kind))), Outcome::FailOpen),
                },
            };
            self.seed(local, policy, &key);
            let result = self.ask_as(policy, &**local, &key, cost).await;
            self.fallen_back(parts, key, cost, in_force, kind, result, &span)
        }
    }

    fn record(&self, outcome: Outcome, span: &tracing::Span) {
        self.config.metrics.decision(outcome);
        if !span.is_disabled() {
            span.record("outcome", outcome.as_str());
            tracing::debug!(parent: span, "rate limit decision");
        }
    }

    /// The allow and deny lists: through undecided, or refused.
    fn check_lists(&self, parts: &Parts) -> Step<()> {
        match self.config.access.check(parts) {
            None => ControlFlow::Continue(()),
            Some(Listed::Allowed) => {
                ControlFlow::Break((Verdict::Pass(Pass::bare(None)), Outcome::AllowListed))
            }
            Some(Listed::Denied) => {
                let response = response::denied(self.config.limited_status, self.as_built());
                ControlFlow::Break((Verdict::Respond(response), Outcome::DenyListed))
            }
        }
    }

    /// The caller's key; without one, the key error's response, or (in
    /// shadow mode) through undecided.
    fn identify(&self, parts: &Parts, span: &tracing::Span) -> Step<Key> {
        match self.config.key.extract(parts) {
            Ok(key) => {
                // Hashing the key costs more than the rest of a decision in
                // memory: only for a span that records it.
                if !span.is_disabled() {
                    span.record("key", key.hashed());
                }
                ControlFlow::Continue(key)
            }
            Err(err) => ControlFlow::Break(self.unidentified(err)),
        }
    }

    fn unidentified(&self, err: KeyError) -> Decided {
        tracing::debug!(policy = self.name(), error = %err, "rate limit key not found");
        if self.config.shadow {
            return (Verdict::Pass(Pass::bare(None)), Outcome::KeyError);
        }
        let response = response::unidentified(self.config.key_error_status, &err);
        (Verdict::Respond(response), Outcome::KeyError)
    }

    /// The request's price in quota units: 1, or the layer's cost function's.
    fn cost_of(&self, parts: &Parts) -> u64 {
        self.config.cost.as_ref().map_or(1, |f| f(parts))
    }

    /// Throttling mode and the cache of known rejections, which may answer
    /// without the store.
    /// `policy` is the one in force, whose quotas a cached rejection's
    /// headers show.
    fn ask_local_deciders(&self, policy: &Policy, key: &Key, cost: u64) -> Step<()> {
        if self.as_built().is_adjustable() {
            self.running
                .local
                .limits_are(self.config.store.policy_limits_version());
        }
        let answer =
            self.running
                .local
                .before_store(self.as_built(), key, cost, self.config.shadow);
        match answer {
            None => ControlFlow::Continue(()),
            Some(LocalAnswer::Throttled { retry_after }) => {
                let response = response::throttled(self.config.limited_status, retry_after);
                ControlFlow::Break((Verdict::Respond(response), Outcome::Throttled))
            }
            Some(LocalAnswer::Rejected(decision)) => {
                let response = response::limited(
                    self.config.limited_status,
                    policy,
                    &decision,
                    &self.config.headers,
                );
                ControlFlow::Break((Verdict::Respond(response), Outcome::Limited))
            }
        }
    }

    /// The main store's answer if it gives one without waiting (an
    /// in-process store, or a Redis store's lease in hand), noted; `None`
    /// when it must be awaited. Within the cooldown after a failure only a
    /// store out of process is asked, and only for what it answers without
    /// waiting: a lease in hand keeps deciding through an outage.
    fn ask_main_now(
        &self,
        policy: &Policy,
        key: &Key,
        cost: u64,
    ) -> Option<Result<Decision, StoreError>> {
        let store = &self.config.store;
        let cooling = self.cooling_down();
        if cooling && store.in_process() {
            return Some(Err(StoreError::cooling_down()));
        }
        // Not timed: the latency histogram measures waits on a store out of
        // process, and an answer in process has none to show.
        match store.check_now(policy, key, cost) {
            // Decided in this process for a store out of it (a lease): it
            // says nothing of whether the store answers.
            Some(Ok(decision)) if !store.in_process() => Some(Ok(decision)),
            Some(answer) => {
                self.note_result(key, &answer);
                Some(answer)
            }
            None if cooling => Some(Err(StoreError::cooling_down())),
            None => None,
        }
    }

    /// The main store failed: the failure policy's verdict, or (a local
    /// fallback) its answer, if it gives one without waiting.
    fn fall_back_now(
        &self,
        parts: &mut Parts,
        key: Key,
        cost: u64,
        in_force: Option<Arc<Policy>>,
        err: StoreError,
        span: &tracing::Span,
    ) -> Step<Pending> {
        let (local, kind) = self.on_failure(parts, err)?;
        let policy = self.in_force(in_force.as_ref());
        self.seed(local, policy, &key);
        match local.check_now(policy, &key, cost) {
            Some(result) => {
                ControlFlow::Break(self.fallen_back(parts, key, cost, in_force, kind, result, span))
            }
            None => ControlFlow::Continue(Pending::new(key, cost, in_force, Some(kind), span)),
        }
    }

    /// [`judge`](Self::judge) for the main store's decision.
    fn judge_main(
        &self,
        parts: &mut Parts,
        key: Key,
        cost: u64,
        in_force: Option<Arc<Policy>>,
        decision: Decision,
        span: &tracing::Span,
    ) -> Decided {
        let judged = Judged {
            key,
            cost,
            in_force,
            decision,
        };
        self.judge(parts, judged, Decider::Main, None, span)
    }

    /// Turns a store's decision into the verdict: a rejection's response,
    /// or a pass carrying what settling it needs, its receipt marked with
    /// the policy in force.
    pub(super) fn judge(
        &self,
        parts: &mut Parts,
        judged: Judged,
        decider: Decider,
        degraded: Option<StoreErrorKind>,
        span: &tracing::Span,
    ) -> Decided {
        let Judged {
            key,
            cost,
            in_force,
            mut decision,
        } = judged;
        if decider == Decider::Main {
            self.learn_from_main(&key, cost, &decision);
        }
        if !span.is_disabled() {
            span.record("remaining", decision.remaining);
        }
        let outcome = match (decision.allowed, decider) {
            (true, Decider::Main) => Outcome::Allowed,
            (true, Decider::Fallback) => Outcome::Fallback,
            (false, _) if self.config.shadow => Outcome::ShadowLimited,
            (false, _) => Outcome::Limited,
        };
        if outcome == Outcome::Limited {
            let policy = self.in_force(in_force.as_ref());
            let response = self.rejection(policy, &decision, decider, degraded);
            return (Verdict::Respond(response), outcome);
        }
        decision.receipt = decision.receipt.under(in_force);
        // A shadow-limited request goes on with `allowed == false` in its
        // extensions (if asked for); its response shows the rejection's
        // headers (Remaining 0) without Retry-After. The store did not
        // charge it.
        decision.fallback = decider == Decider::Fallback;
        if self.config.decision_extension {
            parts.extensions.insert(decision.clone());
        }
        decision.retry_after = None;
        if self.config.shadow {
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

    /// A rejection's response, marked when the decision was degraded.
    fn rejection(
        &self,
        policy: &Policy,
        decision: &Decision,
        decider: Decider,
        degraded: Option<StoreErrorKind>,
    ) -> Response<Body> {
        let mut response = response::limited(
            self.config.limited_status,
            policy,
            decision,
            &self.config.headers,
        );
        if let Some(kind) = degraded {
            mark_degraded(response.headers_mut(), kind, decider);
        }
        response
    }

    /// The caller's current state, without charging. It follows the
    /// failure policy: while the main store fails (or within the cooldown
    /// after it did), a local fallback answers, and the decision says so
    /// ([`Decision::fallback`]); other policies have no state to show.
    pub(crate) async fn peek(&self, parts: &Parts) -> Result<Decision, PeekError> {
        let key = self.config.key.extract(parts).map_err(PeekError::Key)?;
        self.peek_key(&key).await.map_err(PeekError::Store)
    }

    /// `key`'s state, charging nothing: the main store within the deadline,
    /// else (with a local fallback) the fallback, marked as such.
    pub(crate) async fn peek_key(&self, key: &Key) -> Result<Decision, StoreError> {
        let in_force = self.policy_in_force(None);
        let policy = self.in_force(in_force.as_ref());
        let err = if self.cooling_down() {
            StoreError::cooling_down()
        } else {
            let peek = self.config.store.peek(policy, key);
            match self.within_deadline(peek).await.0 {
                Ok(decision) => return Ok(decision),
                Err(err) => err,
            }
        };
        let FailurePolicy::Local(local) = &self.config.failure else {
            return Err(err);
        };
        tracing::debug!(policy = self.name(), key = %key.hashed(), error = %err,
            "rate limit store failed a peek; answering from the local fallback");
        self.seed(local, policy, key);
        let peek = local.peek(policy, key);
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
        if self.config.shadow {
            return;
        }
        self.running
            .local
            .after_store(self.as_built(), key, cost, decision);
        if let Some(learned) = &self.running.learned {
            learned.learn(key, decision);
        }
    }

    /// Forgets what this process remembers of `key` (after a reset).
    pub(crate) fn forget(&self, key: &Key) {
        self.running.local.refunded(key);
        if let Some(learned) = &self.running.learned {
            learned.forget(key);
        }
    }

    /// Asks the main store under the policy in force, unless it failed
    /// within the cooldown: then the failure policy applies at once instead
    /// of every request waiting out the deadline against a store that is
    /// down or drowning. A pass's receipt carries the policy in force.
    pub(crate) async fn ask_main(
        &self,
        in_force: Option<Arc<Policy>>,
        key: &Key,
        cost: u64,
    ) -> Result<Decision, StoreError> {
        let mut decision = self
            .ask_main_as(self.in_force(in_force.as_ref()), key, cost)
            .await?;
        decision.receipt = decision.receipt.under(in_force);
        Ok(decision)
    }

    /// [`ask_main`](Self::ask_main) under `policy`, the policy in force.
    async fn ask_main_as(
        &self,
        policy: &Policy,
        key: &Key,
        cost: u64,
    ) -> Result<Decision, StoreError> {
        if self.cooling_down() {
            return Err(StoreError::cooling_down());
        }
        let (result, waited) = self
            .within_deadline(self.config.store.check_before(
                policy,
                key,
                cost,
                std::time::Instant::now() + self.config.deadline,
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
        self.config.metrics.store_latency(waited);
        self.note_result(key, &result);
        result
    }

    /// [`ask_main`](Self::ask_main) of `store` (the local fallback).
    pub(crate) async fn ask(
        &self,
        store: &dyn Store,
        in_force: Option<Arc<Policy>>,
        key: &Key,
        cost: u64,
    ) -> Result<Decision, StoreError> {
        let policy = self.in_force(in_force.as_ref());
        let mut decision = self.ask_as(policy, store, key, cost).await?;
        decision.receipt = decision.receipt.under(in_force);
        Ok(decision)
    }

    /// [`ask`](Self::ask) under `policy`.
    async fn ask_as(
        &self,
        policy: &Policy,
        store: &dyn Store,
        key: &Key,
        cost: u64,
    ) -> Result<Decision, StoreError> {
        self.within_deadline(store.check(policy, key, cost)).await.0
    }
}
