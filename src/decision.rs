//! What a store answers: allowed or not, and the numbers for the headers.

use std::sync::Arc;
use std::time::Duration;

use crate::policy::Policy;

/// A store's answer for one request. Headers are built from this alone, so a
/// rejection's headers always come from the call that decided it.
///
/// Times are in the store's clock (Redis `TIME` by default), in microseconds
/// since the Unix epoch; durations are measured from `now_micros`, so a client
/// is never told to wait by a clock that disagrees with the one that decided.
///
/// ```
/// use std::time::Duration;
/// use tollgate::Decision;
///
/// let d = Decision::rejected(5, 5, 10_500_000, 1_000_000, 9_500_000);
/// assert_eq!(d.remaining, 0);
/// assert_eq!(d.reset_epoch_secs(), 11); // rounded up
/// assert_eq!(d.retry_after_secs(), Some(10)); // rounded up, never 0
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Decision {
    /// Whether the request may proceed.
    pub allowed: bool,
    /// The reported quota's limit (`X-RateLimit-Limit`).
    pub limit: u64,
    /// Units left in the reported quota (`X-RateLimit-Remaining`).
    pub remaining: u64,
    /// Units spent in the reported quota (`X-RateLimit-Used`), at most the
    /// limit: `used + remaining == limit` on every decision. A window that
    /// holds more (a response that cost more than its estimate, a limit
    /// lowered under a caller) shows `used == limit` and `remaining == 0`
    /// on the response that overspent and on every one after it, until
    /// the window frees enough; a block shows the same.
    pub used: u64,
    /// When the reported quota frees up, µs since the epoch (`X-RateLimit-Reset`).
    pub reset_at_micros: u64,
    /// The store's time when it decided, µs since the epoch.
    pub now_micros: u64,
    /// How long to wait before retrying; set on rejections.
    pub retry_after: Option<Duration>,
    /// How long an allowed request waits before it proceeds: its place in a
    /// leaky bucket's queue. `None` proceeds at once (every other strategy);
    /// the layer does not sleep for a wait under 0.1 ms either.
    pub delay: Option<Duration>,
    /// Which of the policy's quotas the numbers describe (0-based).
    pub quota: usize,
    /// Whose budget that quota is: the caller's own, or one shared by every
    /// caller of the resource (the sliding log's resource limit).
    pub scope: Scope,
    /// What to give back if the response turns out to be free.
    pub receipt: Receipt,
    /// Decided (for a peek: answered) by the layer's local fallback because
    /// the main store failed; the response says so with
    /// `X-RateLimit-Fallback: local`.
    pub fallback: bool,
    /// Refused by the policy's [penalty box](crate::PenaltyBox): the
    /// caller is blocked until `reset_at_micros`, whatever its counters say.
    pub blocked: bool,
    /// Units the reported quota holds as the store counted them (at most
    /// the limit): `used`, but for a rejection, which shows the limit
    /// used (nothing is left for it) whatever the window holds. The local
    /// fallback starts from this.
    pub(crate) spent: u64,
}

impl Decision {
    /// A pass with `used` of `limit` spent.
    ///
    /// ```
    /// use tollgate::Decision;
    /// let d = Decision::allowed(10, 3, 60_000_000, 1_000_000);
    /// assert!(d.allowed);
    /// assert_eq!(d.remaining, 7);
    /// assert_eq!(d.retry_after_secs(), None);
    /// ```
    #[inline]
    pub fn allowed(limit: u64, used: u64, reset_at_micros: u64, now_micros: u64) -> Self {
        Self {
            allowed: true,
            limit,
            remaining: limit.saturating_sub(used),
            used: used.min(limit),
            reset_at_micros,
            now_micros,
            retry_after: None,
            delay: None,
            quota: 0,
            scope: Scope::Consumer,
            receipt: Receipt::default(),
            fallback: false,
            blocked: false,
            spent: used.min(limit),
        }
    }

    /// A rejection; `retry_after_micros` is how long until a retry can pass.
    /// Nothing is left for this request, so it shows `remaining` 0 and
    /// `used` the limit, whatever the window holds (the count, `used`, is
    /// kept for the local fallback to start from): a request of 7 units
    /// refused with 6 left is told 0 left, never 6, and the three numbers
    /// still add up.
    ///
    /// ```
    /// use tollgate::Decision;
    /// let d = Decision::rejected(10, 4, 10_000_000, 1_000_000, 9_000_000);
    /// assert_eq!((d.limit, d.used, d.remaining), (10, 10, 0));
    /// ```
    pub fn rejected(
        limit: u64,
        used: u64,
        reset_at_micros: u64,
        now_micros: u64,
        retry_after_micros: u64,
    ) -> Self {
        Self {
            allowed: false,
            limit,
            remaining: 0,
            used: limit,
            reset_at_micros,
            now_micros,
            retry_after: Some(Duration::from_micros(retry_after_micros)),
            delay: None,
            quota: 0,
            scope: Scope::Consumer,
            receipt: Receipt::default(),
            fallback: false,
            blocked: false,
            spent: used.min(limit),
        }
    }

    /// This decision as a [penalty box](crate::PenaltyBox)'s refusal: the
    /// caller is blocked until `until` (µs). Its reset and its retry are the
    /// moment a request would pass: the block's end, or later when the
    /// caller's own quota is still spent then (this decision, made with
    /// the request's cost and nothing written, says how long that takes).
    /// A block withholds the whole quota: `used` is the limit and
    /// `remaining` 0, so the three never contradict each other.
    ///
    /// ```
    /// use tollgate::Decision;
    /// // Blocked for 30 s; the window would have let it in after 1 s.
    /// let d = Decision::rejected(5, 5, 2_000_000, 1_000_000, 1_000_000).blocked_until(31_000_000);
    /// assert!(d.blocked && !d.allowed);
    /// assert_eq!((d.used, d.remaining), (5, 0));
    /// assert_eq!(d.retry_after_secs(), Some(30));
    /// // Blocked for 5 s, but the window is full for 55 s more: 55 s.
    /// let d = Decision::rejected(3, 3, 56_000_000, 1_000_000, 55_000_000).blocked_until(6_000_000);
    /// assert_eq!((d.retry_after_secs(), d.reset_epoch_secs()), (Some(55), 56));
    /// // A quota with room: the block's end.
    /// let d = Decision::allowed(50, 5, 60_000_000, 1_000_000).blocked_until(6_000_000);
    /// assert_eq!((d.limit, d.used, d.remaining, d.retry_after_secs()), (50, 50, 0, Some(5)));
    /// ```
    pub fn blocked_until(mut self, until: u64) -> Self {
        let passes_at = until.max(self.passes_at_micros());
        self.allowed = false;
        self.blocked = true;
        self.remaining = 0;
        self.used = self.limit;
        self.spent = self.limit;
        self.reset_at_micros = passes_at;
        self.retry_after = Some(Duration::from_micros(
            passes_at.saturating_sub(self.now_micros),
        ));
        self.receipt = Receipt::default();
        self.delay = None;
        self
    }

    /// When a request like this one would pass (µs, store time): now for
    /// a pass, after the retry for a rejection.
    fn passes_at_micros(&self) -> u64 {
        match (self.allowed, self.retry_after) {
            (false, Some(wait)) => self.now_micros.saturating_add(wait.as_micros() as u64),
            _ => self.now_micros,
        }
    }

    /// Says which quota (0-based) these numbers describe.
    #[inline]
    pub fn reporting(mut self, quota: usize) -> Self {
        self.quota = quota;
        self
    }

    /// Says whose budget the reported quota is.
    #[inline]
    pub fn scoped(mut self, scope: Scope) -> Self {
        self.scope = scope;
        self
    }

    /// Makes an allowed request wait `delay_micros` before it proceeds
    /// (0: at once).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::Decision;
    /// let d = Decision::allowed(5, 2, 3_000_000, 1_000_000).delayed(250_000);
    /// assert_eq!(d.delay, Some(Duration::from_millis(250)));
    /// assert_eq!(Decision::allowed(5, 1, 0, 0).delayed(0).delay, None);
    /// ```
    pub fn delayed(mut self, delay_micros: u64) -> Self {
        self.delay = (delay_micros > 0).then(|| Duration::from_micros(delay_micros));
        self
    }

    /// Attaches what a refund would give back.
    #[inline]
    pub fn with_receipt(mut self, receipt: Receipt) -> Self {
        self.receipt = receipt;
        self
    }

    /// `X-RateLimit-Reset`: the reset time in whole epoch seconds, rounded up
    /// so that a client waiting until then is never early.
    pub fn reset_epoch_secs(&self) -> u64 {
        self.reset_at_micros.div_ceil(1_000_000)
    }

    /// Time from the decision until reset.
    pub fn reset_after(&self) -> Duration {
        Duration::from_micros(self.reset_at_micros.saturating_sub(self.now_micros))
    }

    /// `Retry-After` in whole seconds: rounded up, never 0.
    pub fn retry_after_secs(&self) -> Option<u64> {
        self.retry_after
            .map(|d| (d.as_micros() as u64).div_ceil(1_000_000).max(1))
    }

    /// The decision after a refund of `cost` units was applied.
    pub(crate) fn refunded(mut self, cost: u64) -> Self {
        let back = cost.min(self.used);
        self.used -= back;
        self.used = self.used.min(self.limit);
        self.remaining = self.limit.saturating_sub(self.used);
        self.spent = self.used;
        self.receipt.cost = 0;
        self
    }

    /// The decision after its charge was settled to `actual` units: `used`
    /// moves by the difference (never below zero, never above the limit),
    /// `remaining` follows, and the receipt now holds `actual`, so a later
    /// settle or refund starts from there.
    ///
    /// ```
    /// use tollgate::Decision;
    /// let pass = Decision::allowed(10, 9, 60_000_000, 1_000_000)
    ///     .with_receipt(tollgate::decision::Receipt::new(1, vec![60_000_000]));
    /// let over = pass.clone().settled(4); // 12 spent of 10: all of it shown
    /// assert_eq!((over.used, over.remaining, over.receipt.cost()), (10, 0, 4));
    /// let under = pass.settled(0);
    /// assert_eq!((under.used, under.remaining), (8, 2));
    /// ```
    pub fn settled(mut self, actual: u64) -> Self {
        let charged = self.receipt.cost;
        self.used = if actual >= charged {
            self.used.saturating_add(actual - charged)
        } else {
            self.used.saturating_sub(charged - actual)
        };
        self.remaining = self.limit.saturating_sub(self.used);
        self.used = self.used.min(self.limit);
        self.spent = self.used;
        self.receipt.cost = actual;
        self
    }
}

/// What a request really cost, in quota units (a `u64`: write
/// `ActualCost(u64::from(tokens))` for a `u32` count), known once its
/// response is done (tokens generated, bytes sent, rows scanned): a
/// handler puts it in its response's extensions, and the layer settles the
/// request's charge to it. The request was charged its estimate (the layer's
/// [`cost`](crate::RateLimitLayerBuilder::cost), 1 by default) when it
/// started; the difference is charged, or given back, in one store call,
/// to the window the estimate was charged in. A request that overspends
/// takes `X-RateLimit-Remaining` to 0, never below, and the caller is
/// refused until the window frees enough. See
/// [`Store::settle`](crate::Store::settle) for what each strategy does, and
/// [`settle_cost`](crate::RateLimitLayerBuilder::settle_cost) to read the
/// cost from the response head instead.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// use std::num::NonZeroU32;
/// use axum::{body::Body, extract::connect_info::MockConnectInfo, http::Request};
/// use axum::{response::IntoResponse, routing::get, Extension, Router};
/// use tower::ServiceExt;
/// use tollgate::{ActualCost, Policy, Quota, RateLimitLayer};
///
/// let layer = RateLimitLayer::builder()
///     .policy(Policy::fixed_window("tokens", Quota::per_minute(NonZeroU32::new(100).unwrap())))
///     .build() // charges the default estimate, 1, when a request starts
///     .unwrap();
/// let app = Router::new()
///     .route("/complete", get(|| async { (Extension(ActualCost(30)), "30 tokens").into_response() }))
///     .layer(layer)
///     .layer(MockConnectInfo(std::net::SocketAddr::from(([127, 0, 0, 1], 1))));
///
/// let res = app.oneshot(Request::get("/complete").body(Body::empty()).unwrap()).await.unwrap();
/// assert_eq!(res.headers()["x-ratelimit-remaining"], "70"); // settled to 30
/// # }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ActualCost(pub u64);

/// Whose budget a quota is.
///
/// Most quotas are per caller ([`Scope::Consumer`]). A sliding log also has a
/// limit shared by every caller of the resource ([`Scope::Resource`]): the
/// tiger feeding sells 100 tickets per 10 s to everyone, and each caller at
/// most 3 of them. A rejection says which one ran out, in the `429` body and
/// in `X-RateLimit-Scope`.
///
/// ```
/// use tollgate::Decision;
/// use tollgate::decision::Scope;
/// let d = Decision::rejected(100, 100, 10_000_000, 1_000_000, 9_000_000).scoped(Scope::Resource);
/// assert_eq!(d.scope.as_str(), "resource");
/// assert_eq!(Scope::default(), Scope::Consumer);
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Scope {
    /// The caller's own budget.
    #[default]
    Consumer,
    /// A budget shared by every caller of the policy.
    Resource,
}

impl Scope {
    /// `"consumer"` or `"resource"`, as sent to clients.
    pub fn as_str(&self) -> &'static str {
        match self {
            Scope::Consumer => "consumer",
            Scope::Resource => "resource",
        }
    }
}

/// What a pass charged, so that exactly that can be given back.
///
/// `stamps` identify *which* window, slot or entry was charged (for a fixed
/// window, the window's stored end), so a refund that arrives after the
/// window rolled over changes nothing. A bucket's (GCRA, the leaky bucket)
/// are the TAT the charge set and how far refunds had moved the bucket back
/// by then, so a refund gives back only what of the charge has not drained.
///
/// ```
/// use tollgate::decision::Receipt;
/// let r = Receipt::new(1, vec![10_000_000]);
/// assert_eq!(r.cost(), 1);
/// assert!(!r.is_empty());
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Receipt {
    pub(crate) cost: u64,
    pub(crate) stamps: Stamps,
    /// For the strategies whose units are time (GCRA, the leaky bucket):
    /// how many µs of the bucket each unit was charged as, under the
    /// policy in force when it was charged (an override, a runtime limit,
    /// a cap or a request's limit each change it). A give-back moves the
    /// bucket by exactly that, whatever judges the caller by then. 0 for
    /// the strategies that count units.
    pub(crate) unit_micros: u64,
    /// The policy in force when it was charged, when it was not the
    /// policy as built (a runtime limit, a cap, a limit from the request):
    /// a give-back or a settle of this receipt is computed with it.
    pub(crate) charged_under: Option<Arc<Policy>>,
}

impl Receipt {
    /// A receipt for `cost` units charged to the entries named by `stamps`.
    ///
    /// ```
    /// use tollgate::decision::Receipt;
    /// let r = Receipt::new(2, vec![10_000_000, 20_000_000]);
    /// assert_eq!(r.cost(), 2);
    /// assert_eq!(r.stamps(), &[10_000_000, 20_000_000]);
    /// ```
    pub fn new(cost: u64, stamps: Vec<u64>) -> Self {
        Self::of(cost, stamps)
    }

    /// This receipt, for units of `micros` µs each (see
    /// [`unit_micros`](Self::unit_micros)).
    ///
    /// ```
    /// use tollgate::decision::Receipt;
    /// let r = Receipt::new(2, vec![10_000_000]).in_units_of(250_000);
    /// assert_eq!(r.unit_micros(), Some(250_000));
    /// ```
    pub fn in_units_of(mut self, micros: u64) -> Self {
        self.unit_micros = micros;
        self
    }

    /// How many µs of the bucket each unit was charged as, for the
    /// strategies whose units are time (GCRA, the leaky bucket): the
    /// policy in force at the charge fixed it, and a give-back moves the
    /// bucket by exactly that. `None` for the strategies that count units,
    /// and for a receipt built without it (a give-back then takes the unit
    /// from the policy it is given).
    ///
    /// ```
    /// use tollgate::decision::Receipt;
    /// assert_eq!(Receipt::new(1, vec![10_000_000]).unit_micros(), None);
    /// ```
    pub fn unit_micros(&self) -> Option<u64> {
        (self.unit_micros > 0).then_some(self.unit_micros)
    }

    /// [`Receipt::new`] from any stamps, allocating only for more than two.
    #[inline]
    pub(crate) fn of(cost: u64, stamps: impl IntoIterator<Item = u64>) -> Self {
        let mut stamps = stamps.into_iter().fuse();
        let stamps = match (stamps.next(), stamps.next()) {
            (None, _) => Stamps::Inline(0, [0; 2]),
            (Some(a), None) => Stamps::Inline(1, [a, 0]),
            (Some(a), Some(b)) => match stamps.next() {
                None => Stamps::Inline(2, [a, b]),
                Some(c) => Stamps::Heap([a, b, c].into_iter().chain(stamps).collect()),
            },
        };
        Self {
            cost,
            stamps,
            unit_micros: 0,
            charged_under: None,
        }
    }

    /// This receipt, charged under `policy` (`None`: the policy as built).
    pub(crate) fn under(mut self, policy: Option<Arc<Policy>>) -> Self {
        self.charged_under = policy;
        self
    }

    /// The policy in force when it was charged; `None`: the policy as built.
    pub(crate) fn charged_under(&self) -> Option<&Arc<Policy>> {
        self.charged_under.as_ref()
    }

    /// Units charged.
    pub fn cost(&self) -> u64 {
        self.cost
    }

    /// Per-quota identities of what was charged.
    pub fn stamps(&self) -> &[u64] {
        self.stamps.as_slice()
    }

    /// Nothing to give back.
    pub fn is_empty(&self) -> bool {
        self.cost == 0
    }

    /// This receipt's stamps for `cost` units: what a settle down to
    /// `self.cost - cost` gives back.
    pub(crate) fn for_units(&self, cost: u64) -> Receipt {
        Receipt {
            cost,
            stamps: self.stamps.clone(),
            unit_micros: self.unit_micros,
            charged_under: self.charged_under.clone(),
        }
    }
}

/// A receipt's stamps: up to two inline, which is every strategy's with one
/// quota and the sliding log's pair, so that a decision (and any copy of
/// it, as in the request's extensions) allocates nothing for them; more on
/// the heap.
#[derive(Clone)]
pub(crate) enum Stamps {
    Inline(u8, [u64; 2]),
    Heap(Vec<u64>),
}

impl Default for Stamps {
    fn default() -> Self {
        Stamps::Inline(0, [0; 2])
    }
}

impl Stamps {
    fn as_slice(&self) -> &[u64] {
        match self {
            Stamps::Inline(len, stamps) => &stamps[..usize::from(*len)],
            Stamps::Heap(stamps) => stamps,
        }
    }
}

#[cfg(test)]
impl Stamps {
    fn len(&self) -> usize {
        self.as_slice().len()
    }

    /// Takes the last stamp off.
    fn pop(&mut self) -> Option<u64> {
        match self {
            Stamps::Inline(0, _) => None,
            Stamps::Inline(len, stamps) => {
                *len -= 1;
                Some(stamps[usize::from(*len)])
            }
            Stamps::Heap(stamps) => stamps.pop(),
        }
    }
}

impl PartialEq for Stamps {
    fn eq(&self, other: &Self) -> bool {
        self.as_slice() == other.as_slice()
    }
}

impl Eq for Stamps {}

impl std::fmt::Debug for Stamps {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.as_slice().fmt(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn receipts_keep_every_stamp_in_order_inline_or_not() {
        for n in 0..6u64 {
            let stamps: Vec<u64> = (1..=n).collect();
            let mut receipt = Receipt::of(1, stamps.iter().copied());
            assert_eq!(receipt.stamps(), stamps, "{n} stamps");
            assert_eq!(receipt, Receipt::new(1, stamps.clone()));
            assert_eq!(
                format!("{receipt:?}"),
                format!(
                    "Receipt {{ cost: 1, stamps: {stamps:?}, unit_micros: 0, charged_under: None }}"
                )
            );
            assert_eq!(receipt.stamps.pop(), stamps.last().copied());
            assert_eq!(receipt.stamps.len(), stamps.len().saturating_sub(1));
        }
    }
}
