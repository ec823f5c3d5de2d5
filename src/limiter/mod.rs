//! The request path's logic, apart from tower's plumbing, a file per job:
//! [`admit`] identifies the caller and decides, [`breaker`] keeps a failing
//! store at bay and applies the failure policy (within a deadline), and
//! [`settle`] settles the charge to the response's actual cost (a `304`'s
//! refund among them) and writes the headers, [`release`] gives a held
//! charge back without blocking. This file holds what they share: the
//! limiter (its [`Config`] and what it keeps [`Running`]), and the pass a
//! request carries from admitting to settling.

use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use http::request::Parts;
use http::{Response, StatusCode};

use crate::access::Access;
use crate::decision::{Decision, Receipt};
use crate::error::StoreErrorKind;
use crate::failure::{FailurePolicy, Health};
use crate::headers::PolicyHeaders;
use crate::key::{Key, KeyExtractor};
use crate::local::seed::Learned;
use crate::local::LocalDecisions;
use crate::metrics::{Outcome, PolicyMetrics};
use crate::policy::Policy;
use crate::response::Body;
use crate::store::Store;

mod admit;
mod breaker;
mod in_force;
mod release;
mod settle;

pub(crate) use admit::{Pending, Step};
pub(crate) use release::ReleaseGuard;

/// Price of a request in quota units, from its head.
pub(crate) type CostFn = dyn Fn(&Parts) -> u64 + Send + Sync;

/// A request's own limit for the caller's quota, read from its head.
pub(crate) type LimitFn = dyn Fn(&Parts) -> Option<u32> + Send + Sync;

/// Limits that come with the request (a plan an auth layer looked up),
/// within bounds fixed at build time.
#[derive(Clone)]
pub(crate) struct RequestLimit {
    pub(crate) min: u32,
    pub(crate) max: u32,
    pub(crate) from: Arc<LimitFn>,
}
/// Whether a response's status makes its charge refundable.
pub(crate) type RefundFn = dyn Fn(StatusCode) -> bool + Send + Sync;
/// What a request really cost, from its response's head; `None` keeps the
/// charge as it is.
pub(crate) type SettleFn = dyn Fn(&http::response::Parts) -> Option<u64> + Send + Sync;

/// Which statuses are refunded: the default, checked in line on every
/// response, or the caller's own rule.
#[derive(Clone)]
pub(crate) enum RefundWhen {
    /// `304 Not Modified` only.
    NotModified,
    /// [`RateLimitLayerBuilder::refund_when`](crate::layer::RateLimitLayerBuilder::refund_when)'s rule.
    Custom(Arc<RefundFn>),
}

impl RefundWhen {
    pub(crate) fn matches(&self, status: StatusCode) -> bool {
        match self {
            RefundWhen::NotModified => status == StatusCode::NOT_MODIFIED,
            RefundWhen::Custom(refund) => refund(status),
        }
    }
}

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

/// One policy's limiter, shared by all service clones: what it was
/// configured with, and what it keeps while it runs.
pub(crate) struct Limiter {
    pub(crate) config: Config,
    pub(crate) running: Running,
}

/// What the builder configured; never changes.
pub(crate) struct Config {
    /// The policy as built: read only in `in_force.rs`, where the policy
    /// in force is computed from it.
    pub(crate) as_built: Policy,
    pub(crate) store: Arc<dyn Store>,
    pub(crate) key: Arc<dyn KeyExtractor>,
    pub(crate) cost: Option<Arc<CostFn>>,
    pub(crate) request_limit: Option<RequestLimit>,
    pub(crate) deadline: Duration,
    pub(crate) failure: FailurePolicy,
    pub(crate) limited_status: StatusCode,
    pub(crate) key_error_status: StatusCode,
    /// The gRPC status of a call refused for its quota.
    #[cfg(feature = "grpc")]
    pub(crate) grpc_limited: crate::grpc::LimitedCode,
    pub(crate) refund_when: RefundWhen,
    /// Reads a response's actual cost; `None` reads its
    /// [`ActualCost`](crate::decision::ActualCost) extension.
    pub(crate) settle_cost: Option<Arc<SettleFn>>,
    pub(crate) headers: PolicyHeaders,
    /// Decide and count, but never reject (deny-lists aside).
    pub(crate) shadow: bool,
    /// Put each pass's decision in the request's extensions.
    pub(crate) decision_extension: bool,
    /// The policy's strategy holds a pass's charge until its response
    /// ends (the concurrency limit), asked once rather than per request.
    pub(crate) holds_until_response_ends: bool,
    pub(crate) access: Access,
    pub(crate) metrics: PolicyMetrics,
    pub(crate) cooldown: Duration,
}

/// What the limiter keeps while it runs: the breaker's state and what it
/// remembers of the main store's answers.
pub(crate) struct Running {
    /// Until when (ns since [`EPOCH`](crate::clock::EPOCH)) the main
    /// store is skipped after a failure.
    pub(crate) skip_store_until: AtomicU64,
    /// Whether the main store is failing, for logging outages once.
    pub(crate) health: Health,
    /// The main store's last word per key, which the local fallback starts
    /// from; `None` without a local fallback, or for the concurrency limit.
    pub(crate) learned: Option<Learned>,
    /// Throttling mode and the local decision cache (high-volume mode).
    pub(crate) local: LocalDecisions,
}

impl Running {
    pub(crate) fn new(local: LocalDecisions, learned: Option<Learned>) -> Self {
        Self {
            skip_store_until: AtomicU64::new(0),
            health: Health::default(),
            learned,
            local,
        }
    }
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

impl Limiter {
    /// What `pass` charged and where: the store that decided (settles,
    /// refunds and releases go back to it), the key and the receipt; `None`
    /// for a pass let through without a decision. The one place the settle
    /// at once ([`settle_now`](Self::settle_now)), the awaited one and the
    /// release guard ([`ReleaseGuard::for_pass`]) find what to give back.
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

/// The outcome of admitting a request.
pub(crate) enum Verdict {
    Pass(Pass),
    Respond(Response<Body>),
}

/// A verdict and how it is counted.
type Decided = (Verdict, Outcome);
