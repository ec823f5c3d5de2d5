//! When the main store fails: the cooldown that skips it for a while (a
//! circuit breaker), logging an outage once by its state, the failure policy
//! (open, closed, or a local fallback, seeded from what the main store last
//! said), and the deadline every store call is awaited within.

use std::future::poll_fn;
use std::ops::ControlFlow;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::Poll;

use http::request::Parts;

use super::admit::{Judged, Step};
use super::{Decided, Decider, Fallback, Limiter, Pass, Verdict};
use crate::clock::monotonic_nanos;
use crate::decision::Decision;
use crate::error::{StoreError, StoreErrorKind};
use crate::failure::FailurePolicy;
use crate::key::Key;
use crate::metrics::{Outcome, Stopwatch};
use crate::policy::Policy;
use crate::response;
use crate::store::{BoxFuture, Store};

impl Limiter {
    /// Applies the failure policy to a failed main store: the verdict, or
    /// the local store to ask instead.
    pub(super) fn on_failure(
        &self,
        parts: &mut Parts,
        err: StoreError,
    ) -> Step<(&Arc<dyn Store>, StoreErrorKind)> {
        self.running.health.decided_without_store();
        let kind = err.kind();
        parts.extensions.insert(Fallback { kind });
        match &self.config.failure {
            FailurePolicy::Open => {
                ControlFlow::Break((Verdict::Pass(Pass::bare(Some(kind))), Outcome::FailOpen))
            }
            // Shadow mode never rejects: fail open instead.
            FailurePolicy::Closed { .. } if self.config.shadow => {
                ControlFlow::Break((Verdict::Pass(Pass::bare(Some(kind))), Outcome::FailOpen))
            }
            FailurePolicy::Closed { retry_after } => {
                let secs = (retry_after.as_micros() as u64).div_ceil(1_000_000);
                let response = response::unavailable(secs);
                ControlFlow::Break((Verdict::Respond(response), Outcome::FailClosed))
            }
            FailurePolicy::Local(local) => ControlFlow::Continue((local, kind)),
        }
    }

    /// The verdict of the local fallback store, asked because the main one
    /// failed with `kind`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn fallen_back(
        &self,
        parts: &mut Parts,
        key: Key,
        cost: u64,
        in_force: Option<Arc<Policy>>,
        kind: StoreErrorKind,
        result: Result<Decision, StoreError>,
        span: &tracing::Span,
    ) -> Decided {
        match result {
            Ok(decision) => {
                let judged = Judged {
                    key,
                    cost,
                    in_force,
                    decision,
                };
                self.judge(parts, judged, Decider::Fallback, Some(kind), span)
            }
            Err(err) => {
                tracing::warn!(policy = self.name(), key = %key.hashed(), error = %err, "fallback store failed too; letting the request through");
                (Verdict::Pass(Pass::bare(Some(kind))), Outcome::FailOpen)
            }
        }
    }

    /// Before the local fallback first decides (or shows) `key` in an
    /// outage: charges it what the main store last said was spent in the
    /// window still open, so this server does not hand out a fresh budget
    /// at the switch. Only a fallback that answers at once (the memory
    /// store) is seeded; the charge is made while the record is held, so
    /// no concurrent fallback decision for `key` can come before it.
    pub(crate) fn seed(&self, local: &Arc<dyn Store>, policy: &Policy, key: &Key) {
        let Some(learned) = &self.running.learned else {
            return;
        };
        learned.seed(key, |used| {
            if let Some(Err(err)) = local.check_now(policy, key, used) {
                tracing::debug!(policy = self.name(), error = %err,
                    "cannot seed the local fallback");
            }
        });
    }

    /// Whether the main store failed within the cooldown.
    pub(super) fn cooling_down(&self) -> bool {
        // Zero until the store first fails: no clock read on the hot path.
        let skip_until = self.running.skip_store_until.load(Ordering::Relaxed);
        skip_until != 0 && monotonic_nanos() < skip_until
    }

    /// Notes a main-store call's result: an answer (which may end an
    /// outage) or a failure ([`note_failure`](Self::note_failure)).
    pub(super) fn note_result<T>(&self, key: &Key, result: &Result<T, StoreError>) {
        match result {
            Ok(_) => self.note_answer(),
            Err(err) => self.note_failure(key, err),
        }
    }

    /// Counts a failed main-store call and starts the cooldown; logs it as
    /// a warning if it starts an outage, else at debug.
    pub(super) fn note_failure(&self, key: &Key, err: &StoreError) {
        self.note_error(key, err);
        if !self.config.cooldown.is_zero() {
            let until = monotonic_nanos() + self.config.cooldown.as_nanos() as u64;
            self.running
                .skip_store_until
                .fetch_max(until, Ordering::Relaxed);
        }
    }

    /// The main store answered: logs the end of an outage, if this ends one.
    pub(super) fn note_answer(&self) {
        if let Some((lasted, without)) = self.running.health.answered() {
            tracing::info!(
                policy = self.name(),
                outage_ms = lasted.as_millis() as u64,
                decided_without_store = without,
                "rate limit store answers again"
            );
        }
    }

    /// Counts a failed main-store call (a check, refund or release) and
    /// logs it: a warning if it starts an outage, else at debug.
    pub(crate) fn note_error(&self, key: &Key, err: &StoreError) {
        self.config.metrics.store_error(err.kind());
        if self.running.health.failed() {
            tracing::warn!(policy = self.name(), key = %key.hashed(), error = %err, kind = err.kind().as_str(),
                "rate limit store failed; applying failure policy until it answers again");
        } else {
            tracing::debug!(policy = self.name(), key = %key.hashed(), error = %err, kind = err.kind().as_str(),
                "rate limit store failed");
        }
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
        match tokio::time::timeout(self.config.deadline, call).await {
            Ok(result) => (result, watch),
            Err(_) => (Err(StoreError::timeout()), watch),
        }
    }
}
