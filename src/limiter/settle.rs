//! Settling a request after the inner service answered: the refund its
//! status may earn, the guard that releases a held slot or a waiting pass,
//! and the headers, marked when the decision was degraded.

use std::sync::Arc;

use http::header::{HeaderMap, HeaderName, HeaderValue};
use http::StatusCode;

use super::release::ReleaseGuard;
use super::{Decider, Limiter, Pass};
use crate::decision::Receipt;
use crate::error::{StoreError, StoreErrorKind};
use crate::failure::FailurePolicy;
use crate::key::Key;
use crate::store::Store;

static FALLBACK: HeaderName = HeaderName::from_static("x-ratelimit-fallback");

impl Limiter {
    /// After the inner service answered: refunds if its status says so and
    /// the store can at once, then writes the headers. `false` when the
    /// refund must be awaited instead ([`settle`](Self::settle)); nothing
    /// was written then. The pass is settled where it lies: it is the
    /// largest thing a response carries, and moving it costs a copy.
    ///
    /// In line, up to the common case: nothing to give back and nothing to
    /// write (a layer without headers on a pass) returns at once.
    pub(crate) fn settle_now(
        &self,
        pass: &mut Pass,
        status: StatusCode,
        headers: &mut HeaderMap,
    ) -> bool {
        if self.refund_due(pass, status) {
            return self.refund_now_and_write(pass, headers);
        }
        self.write_headers(pass, headers);
        true
    }

    /// [`settle_now`](Self::settle_now) with a refund due.
    fn refund_now_and_write(&self, pass: &mut Pass, headers: &mut HeaderMap) -> bool {
        let refunded = self
            .charge_of(pass)
            .and_then(|(store, key, receipt)| store.refund_now(&self.config.policy, key, receipt));
        let Some(result) = refunded else {
            return false;
        };
        self.refunded(pass, result);
        self.write_headers(pass, headers);
        true
    }

    /// [`settle_now`](Self::settle_now), awaiting the refund (never past the
    /// deadline).
    pub(crate) async fn settle(&self, mut pass: Pass, status: StatusCode, headers: &mut HeaderMap) {
        if self.refund_due(&pass, status) {
            // Boxed, as the rare path it is: every request's future would
            // otherwise carry room for it.
            Box::pin(self.refund(&mut pass)).await;
        }
        self.write_headers(&pass, headers);
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
            && self.config.refund_when.matches(status)
            && !self.config.holds_until_response_ends
    }

    /// Gives `pass`'s charge back to the store that decided.
    async fn refund(&self, pass: &mut Pass) {
        let Some((store, key, receipt)) = self.charge_of(pass) else {
            return;
        };
        let call = store.refund(&self.config.policy, key, receipt);
        let result = self.within_deadline(call).await.0;
        self.refunded(pass, result);
    }

    /// Brings `pass` up to date with its refund, which ended with `result`.
    fn refunded(&self, pass: &mut Pass, result: Result<(), StoreError>) {
        let (Some(key), Some(decision)) = (&pass.key, pass.decision.take()) else {
            return;
        };
        let decision = match result {
            Ok(()) => {
                if pass.decider == Decider::Main {
                    self.note_answer();
                }
                self.running.local.refunded(key);
                let cost = decision.receipt.cost();
                decision.refunded(cost)
            }
            Err(err) => {
                self.note_error(key, &err);
                decision
            }
        };
        pass.decision = Some(decision);
    }

    /// The headers a settled pass shows. In line: most passes show none,
    /// and return at its first two checks.
    fn write_headers(&self, pass: &Pass, headers: &mut HeaderMap) {
        if let Some(kind) = pass.degraded {
            mark_degraded(headers, kind, pass.decider);
        }
        if !self.config.headers.on_a_pass() {
            return;
        }
        if let (Some(_), Some(decision)) = (&pass.key, &pass.decision) {
            self.config
                .headers
                .apply(headers, &self.config.policy, decision);
        }
    }

    /// A guard that gives `pass`'s charge back, without blocking, if it is
    /// dropped while armed: for a leaky bucket's pass while it waits its turn
    /// (the client may leave), for a concurrency slot until the response body
    /// ends. `None` when there is nothing to give back.
    pub(crate) fn release_guard(self: &Arc<Self>, pass: &Pass) -> Option<ReleaseGuard> {
        let gives_back = pass.delay().is_some() || self.config.holds_until_response_ends;
        if !gives_back {
            return None;
        }
        self.guard_for(pass)
    }

    /// [`release_guard`](Self::release_guard) past its quick "nothing to
    /// give back", the answer for nearly every pass.
    fn guard_for(self: &Arc<Self>, pass: &Pass) -> Option<ReleaseGuard> {
        let (store, key, receipt) = self.charge_of(pass)?;
        if receipt.is_empty() {
            return None;
        }
        Some(ReleaseGuard::new(
            self.clone(),
            store.clone(),
            key.clone(),
            receipt.clone(),
        ))
    }

    /// What `pass` charged and where: the store that decided (refunds and
    /// releases go back to it), the key and the receipt; `None` for a pass
    /// let through without a decision. The one place the refund at once
    /// ([`settle_now`](Self::settle_now)), the awaited one and the release
    /// guard find what to give back.
    fn charge_of<'a>(
        &'a self,
        pass: &'a Pass,
    ) -> Option<(&'a Arc<dyn Store>, &'a Key, &'a Receipt)> {
        match (&pass.key, &pass.decision) {
            (Some(key), Some(decision)) => {
                Some((self.store_of(pass.decider), key, &decision.receipt))
            }
            _ => None,
        }
    }

    fn store_of(&self, decider: Decider) -> &Arc<dyn Store> {
        match (decider, &self.config.failure) {
            (Decider::Fallback, FailurePolicy::Local(local)) => local,
            _ => &self.config.store,
        }
    }
}

pub(super) fn mark_degraded(headers: &mut HeaderMap, kind: StoreErrorKind, decider: Decider) {
    let how = if decider == Decider::Fallback {
        "local"
    } else {
        "open"
    };
    headers.insert(FALLBACK.clone(), HeaderValue::from_static(how));
    tracing::trace!(kind = kind.as_str(), how, "degraded rate limit decision");
}
