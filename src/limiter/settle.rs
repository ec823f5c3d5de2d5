//! Settling a request after the inner service answered: its charge
//! settled to what it really cost (a refunded status costs zero: the `304`
//! refund), and the headers, marked when the decision was degraded.

use http::header::{HeaderMap, HeaderName, HeaderValue};
use http::response::Parts;

use super::{Decider, Limiter, Pass};
use crate::decision::ActualCost;
use crate::error::{StoreError, StoreErrorKind};

static FALLBACK: HeaderName = HeaderName::from_static("x-ratelimit-fallback");

impl Limiter {
    /// After the inner service answered: settles the charge to the
    /// response's actual cost if it differs and the store can at once, then
    /// writes the headers. `false` when the settle must be awaited instead
    /// ([`settle`](Self::settle)); nothing was written then. The pass is
    /// settled where it lies: it is the largest thing a response carries,
    /// and moving it costs a copy.
    ///
    /// In line, up to the common case: nothing to settle and nothing to
    /// write (a layer without headers on a pass) returns at once.
    pub(crate) fn settle_now(&self, pass: &mut Pass, head: &mut Parts) -> bool {
        if let Some(actual) = self.actual_cost(pass, head) {
            return self.settle_now_and_write(pass, actual, &mut head.headers);
        }
        self.write_headers(pass, &mut head.headers);
        true
    }

    /// [`settle_now`](Self::settle_now) with a settle due.
    fn settle_now_and_write(&self, pass: &mut Pass, actual: u64, headers: &mut HeaderMap) -> bool {
        let settled = self.charge_of(pass).and_then(|(store, key, receipt)| {
            let policy = self.charged_under(receipt);
            match actual {
                0 => store.refund_now(policy, key, receipt),
                _ => store.settle_now(policy, key, receipt, actual),
            }
        });
        let Some(result) = settled else {
            return false;
        };
        self.settled(pass, actual, result);
        self.write_headers(pass, headers);
        true
    }

    /// [`settle_now`](Self::settle_now), awaiting the settle (never past
    /// the deadline).
    pub(crate) async fn settle(&self, mut pass: Pass, head: &mut Parts) {
        if let Some(actual) = self.actual_cost(&pass, head) {
            // Boxed, as the rare path it is: every request's future would
            // otherwise carry room for it.
            Box::pin(self.settle_to(&mut pass, actual)).await;
        }
        self.write_headers(&pass, &mut head.headers);
    }

    /// What `pass` really cost, the response's head being `head`, when
    /// that is to be settled: zero for a status the refund rule frees (a
    /// `304`), else what the layer's `settle_cost` reads, else the
    /// [`ActualCost`] the handler put in the response; `None` when it is
    /// what was charged, or there is nothing to settle.
    fn actual_cost(&self, pass: &Pass, head: &Parts) -> Option<u64> {
        // A held slot (concurrency) is given back when the body ends, by its
        // release guard, whatever the status. Releasing here as well would be
        // harmless (releases are by id) but a second round trip, and would
        // free the slot before the response is sent.
        if pass.key.is_none() || self.config.holds_until_response_ends {
            return None;
        }
        // A rejection (in shadow mode) charged nothing.
        let decision = pass.decision.as_ref().filter(|d| d.allowed)?;
        let charged = decision.receipt.cost();
        if self.config.refund_when.matches(head.status) {
            return (charged > 0).then_some(0);
        }
        let actual = match &self.config.settle_cost {
            Some(read) => read(head)?,
            None => head.extensions.get::<ActualCost>()?.0,
        };
        (actual != charged).then_some(actual)
    }

    /// Settles `pass`'s charge to `actual` units at the store that decided.
    async fn settle_to(&self, pass: &mut Pass, actual: u64) {
        let Some((store, key, receipt)) = self.charge_of(pass) else {
            return;
        };
        let policy = self.charged_under(receipt);
        let call = match actual {
            0 => store.refund(policy, key, receipt),
            _ => store.settle(policy, key, receipt, actual),
        };
        let result = self.within_deadline(call).await.0;
        self.settled(pass, actual, result);
    }

    /// Brings `pass` up to date with its settle to `actual`, which ended
    /// with `result`.
    fn settled(&self, pass: &mut Pass, actual: u64, result: Result<(), StoreError>) {
        let (Some(key), Some(decision)) = (&pass.key, pass.decision.take()) else {
            return;
        };
        let decision = match result {
            Ok(()) => {
                if pass.decider == Decider::Main {
                    self.note_answer();
                }
                let charged = decision.receipt.cost();
                if actual < charged {
                    // Units went back: a cached rejection may no longer hold.
                    self.running.local.refunded(key);
                }
                crate::metrics::settled(self.as_built(), charged, actual);
                match actual {
                    0 => decision.refunded(charged),
                    _ => decision.settled(actual),
                }
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
            let policy = self.charged_under(&decision.receipt);
            self.config.headers.apply(headers, policy, decision);
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
