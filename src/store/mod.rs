//! Where decisions are made: the [`Store`] trait and its backends.
//!
//! A store is coarse and atomic: one call decides and charges. On Redis that
//! call is one script, one round trip; in memory it is the same algorithm
//! under one lock.

pub(crate) mod keys;
pub(crate) mod memory;
pub(crate) mod policy_limits;
#[cfg(feature = "redis")]
pub(crate) mod redis;

pub use self::memory::MemoryStore;
#[cfg(feature = "cluster")]
#[cfg_attr(docsrs, doc(cfg(feature = "cluster")))]
pub use self::redis::ClusterConfig;
#[cfg(feature = "sentinel")]
#[cfg_attr(docsrs, doc(cfg(feature = "sentinel")))]
pub use self::redis::SentinelConfig;
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub use self::redis::{Leases, RedisStore, RedisStoreBuilder, Shard, ShardedConfig};
#[cfg(any(feature = "redis", feature = "queue"))]
pub(crate) use keys::KeySpace;

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Instant;

use crate::decision::{Decision, Receipt};
use crate::error::StoreError;
use crate::key::Key;
use crate::overrides::Override;
use crate::policy::Policy;
use crate::policy_limits::{PolicyLimit, PolicyLimits};

/// A boxed `Send` future, which keeps [`Store`] usable as `dyn Store`.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Decides whether a caller may proceed, and keeps the books.
///
/// Implementations must decide and charge atomically: two concurrent calls
/// for one key must never both take the last unit, even from different
/// processes. Being limited is an `Ok` [`Decision`] with `allowed == false`;
/// `Err` means the store could not decide.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// use std::num::NonZeroU32;
/// use tollgate::{Key, MemoryStore, Policy, Quota, Store};
///
/// let store = MemoryStore::new();
/// let policy = Policy::fixed_window("core", Quota::per_minute(NonZeroU32::new(1).unwrap()));
/// let bob = Key::new("bob");
/// assert!(store.check(&policy, &bob, 1).await.unwrap().allowed);
/// assert!(!store.check(&policy, &bob, 1).await.unwrap().allowed);
/// # }
/// ```
pub trait Store: Send + Sync + fmt::Debug + 'static {
    /// Decides for `cost` units of `key` under `policy`, charging on a pass.
    fn check<'a>(
        &'a self,
        policy: &'a Policy,
        key: &'a Key,
        cost: u64,
    ) -> BoxFuture<'a, Result<Decision, StoreError>>;

    /// [`check`](Store::check) for a caller that stops waiting at
    /// `deadline`: a store that can tell the call reached it later charges
    /// nothing and answers with an error, for the caller has decided
    /// without it by then. The default is `check`.
    ///
    /// The Redis store sends the deadline in Redis time, from the offset
    /// between this machine's clock and the `now` of Redis's replies.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use std::{num::NonZeroU32, time::{Duration, Instant}};
    /// use tollgate::{Key, MemoryStore, Policy, Quota, Store};
    ///
    /// let policy = Policy::fixed_window("core", Quota::per_minute(NonZeroU32::new(1).unwrap()));
    /// let deadline = Instant::now() + Duration::from_millis(100);
    /// let store = MemoryStore::new(); // in process: never late
    /// let decision = store.check_before(&policy, &Key::new("bob"), 1, deadline).await;
    /// assert!(decision.unwrap().allowed);
    /// # }
    /// ```
    fn check_before<'a>(
        &'a self,
        policy: &'a Policy,
        key: &'a Key,
        cost: u64,
        deadline: Instant,
    ) -> BoxFuture<'a, Result<Decision, StoreError>> {
        let _ = deadline;
        self.check(policy, key, cost)
    }

    /// Reports the current state without charging or writing anything.
    fn peek<'a>(
        &'a self,
        policy: &'a Policy,
        key: &'a Key,
    ) -> BoxFuture<'a, Result<Decision, StoreError>>;

    /// What a request of `cost` units would be told now, charging and
    /// writing nothing (a penalty box counts no strike): the wait and reset
    /// of a caller whose quota is used up, which a [`peek`](Self::peek)
    /// (a request of nothing) does not show. By default the peek's answer.
    fn peek_cost<'a>(
        &'a self,
        policy: &'a Policy,
        key: &'a Key,
        cost: u64,
    ) -> BoxFuture<'a, Result<Decision, StoreError>> {
        let _ = cost;
        self.peek(policy, key)
    }

    /// Gives back what `receipt` charged, if it is still in the window (or
    /// slot, or queue) it was charged to; never below zero.
    fn refund<'a>(
        &'a self,
        policy: &'a Policy,
        key: &'a Key,
        receipt: &'a Receipt,
    ) -> BoxFuture<'a, Result<(), StoreError>>;

    /// Settles what `receipt` charged to `actual` units, the request's real
    /// cost known once its response is done: gives back the difference when
    /// `actual` is less (a refund of part, or of all at zero), charges it
    /// when `actual` is more, without checking the limit (the units were
    /// spent; the caller is refused until the window frees enough). Either
    /// way only to what the receipt charged (its stamps: the same window,
    /// never a newer one), never below zero; a rejection's receipt charged
    /// nothing and settles nothing. One store call; on Redis one
    /// `EVALSHA` of the strategy's refund script, and none when `actual`
    /// is what was charged.
    ///
    /// By strategy: the fixed, aligned and sliding windows, GCRA, the leaky
    /// bucket and the uniform gate (closed for as many spans as the actual
    /// cost, from when the pass came) settle both ways; the sliding log
    /// gives back but does not charge more (its entries, one per unit, are
    /// bounded by its limit); the concurrency limit holds slots rather than
    /// spending them, and answers a
    /// [`Rejected`](crate::error::StoreErrorKind::Rejected) error.
    ///
    /// The default gives back through [`refund`](Store::refund) and
    /// refuses to charge more: a store of yours that cannot says so rather
    /// than pretending.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use std::num::NonZeroU32;
    /// use tollgate::{Key, MemoryStore, Policy, Quota, Store};
    ///
    /// let policy = Policy::fixed_window("tokens", Quota::per_minute(NonZeroU32::new(100).unwrap()));
    /// let store = MemoryStore::new();
    /// let bob = Key::new("bob");
    /// let pass = store.check(&policy, &bob, 1).await.unwrap(); // the estimate
    /// store.settle(&policy, &bob, &pass.receipt, 30).await.unwrap(); // the real cost
    /// assert_eq!(store.peek(&policy, &bob).await.unwrap().remaining, 70);
    /// # }
    /// ```
    fn settle<'a>(
        &'a self,
        policy: &'a Policy,
        key: &'a Key,
        receipt: &'a Receipt,
        actual: u64,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        let charged = receipt.cost();
        if actual > charged {
            return Box::pin(std::future::ready(Err(StoreError::new(
                crate::error::StoreErrorKind::Rejected,
                "this store cannot charge more after the fact",
            ))));
        }
        let back = receipt.for_units(charged - actual);
        Box::pin(async move {
            if back.is_empty() {
                return Ok(());
            }
            self.refund(policy, key, &back).await
        })
    }

    /// [`settle`](Store::settle) at once, if this store can; `None` (the
    /// default) means "await `settle`". See [`check_now`](Store::check_now).
    ///
    /// ```
    /// use std::num::NonZeroU32;
    /// use tollgate::{Key, MemoryStore, Policy, Quota, Store};
    ///
    /// let store = MemoryStore::new();
    /// let policy = Policy::fixed_window("tokens", Quota::per_minute(NonZeroU32::new(10).unwrap()));
    /// let bob = Key::new("bob");
    /// let pass = store.check_now(&policy, &bob, 1).unwrap().unwrap();
    /// assert!(store.settle_now(&policy, &bob, &pass.receipt, 12).unwrap().is_ok());
    /// assert!(!store.check_now(&policy, &bob, 1).unwrap().unwrap().allowed);
    /// ```
    fn settle_now(
        &self,
        policy: &Policy,
        key: &Key,
        receipt: &Receipt,
        actual: u64,
    ) -> Option<Result<(), StoreError>> {
        let _ = (policy, key, receipt, actual);
        None
    }

    /// Forgets `key`'s own state under `policy`, whatever its strategy: the
    /// operator's unblock. State every caller shares (a sliding log's
    /// resource quota) is kept. One atomic step: on Redis one `DEL` of the
    /// caller's keys. The default refuses: a store of yours that cannot
    /// forget says so rather than pretending.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use std::num::NonZeroU32;
    /// use tollgate::{Key, MemoryStore, Policy, Quota, Store};
    ///
    /// let policy = Policy::fixed_window("login", Quota::per_minute(NonZeroU32::new(1).unwrap()));
    /// let store = MemoryStore::new();
    /// let bob = Key::new("bob");
    /// assert!(store.check(&policy, &bob, 1).await.unwrap().allowed);
    /// assert!(!store.check(&policy, &bob, 1).await.unwrap().allowed);
    /// store.reset(&policy, &bob).await.unwrap();
    /// assert!(store.check(&policy, &bob, 1).await.unwrap().allowed);
    /// # }
    /// ```
    fn reset<'a>(
        &'a self,
        policy: &'a Policy,
        key: &'a Key,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        let _ = (policy, key);
        Box::pin(async { Err(cannot("reset a caller")) })
    }

    /// Gives `key` quotas of its own under `policy` (which must be
    /// [overridable](Policy::overridable); [`RateLimiter::set_override`](crate::RateLimiter::set_override)
    /// checks the override against it). An override is configuration: kept
    /// without an expiry unless it has an end. On Redis a `SET` of the
    /// caller's override key (in its hash slot) and an `HSET` of the
    /// policy's list of overrides. The default refuses.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use std::num::NonZeroU32;
    /// use tollgate::{Key, MemoryStore, Override, Policy, Quota, Store};
    ///
    /// let policy = Policy::fixed_window("api", Quota::per_hour(NonZeroU32::new(1).unwrap())).overridable();
    /// let store = MemoryStore::new();
    /// let vip = Key::new("vip");
    /// let more = Override::new(Quota::per_hour(NonZeroU32::new(2).unwrap()));
    /// store.set_override(&policy, &vip, &more).await.unwrap();
    /// assert_eq!(store.check(&policy, &vip, 1).await.unwrap().limit, 2);
    /// # }
    /// ```
    fn set_override<'a>(
        &'a self,
        policy: &'a Policy,
        key: &'a Key,
        quotas: &'a Override,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        let _ = (policy, key, quotas);
        Box::pin(async { Err(cannot("keep overrides")) })
    }

    /// `key`'s override under `policy`, if one is in force.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use std::num::NonZeroU32;
    /// use tollgate::{Key, MemoryStore, Policy, Quota, Store};
    /// let policy = Policy::fixed_window("api", Quota::per_hour(NonZeroU32::new(1).unwrap())).overridable();
    /// assert_eq!(MemoryStore::new().get_override(&policy, &Key::new("ann")).await.unwrap(), None);
    /// # }
    /// ```
    fn get_override<'a>(
        &'a self,
        policy: &'a Policy,
        key: &'a Key,
    ) -> BoxFuture<'a, Result<Option<Override>, StoreError>> {
        let _ = (policy, key);
        Box::pin(async { Err(cannot("keep overrides")) })
    }

    /// Removes `key`'s override under `policy`; `true` if there was one.
    /// On Redis a `DEL` and an `HDEL`.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use std::num::NonZeroU32;
    /// use tollgate::{Key, MemoryStore, Policy, Quota, Store};
    /// let policy = Policy::fixed_window("api", Quota::per_hour(NonZeroU32::new(1).unwrap())).overridable();
    /// assert!(!MemoryStore::new().clear_override(&policy, &Key::new("ann")).await.unwrap());
    /// # }
    /// ```
    fn clear_override<'a>(
        &'a self,
        policy: &'a Policy,
        key: &'a Key,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        let _ = (policy, key);
        Box::pin(async { Err(cannot("keep overrides")) })
    }

    /// Every override in force under `policy`, by caller. On Redis one
    /// `HGETALL` of the policy's list.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use std::num::NonZeroU32;
    /// use tollgate::{Key, MemoryStore, Policy, Quota, Store};
    /// let policy = Policy::fixed_window("api", Quota::per_hour(NonZeroU32::new(1).unwrap())).overridable();
    /// assert!(MemoryStore::new().list_overrides(&policy).await.unwrap().is_empty());
    /// # }
    /// ```
    fn list_overrides<'a>(
        &'a self,
        policy: &'a Policy,
    ) -> BoxFuture<'a, Result<Vec<(Key, Override)>, StoreError>> {
        let _ = policy;
        Box::pin(async { Err(cannot("keep overrides")) })
    }

    /// Puts `key` in `policy`'s penalty box for `block` from the store's
    /// now, as if it had struck out; [`reset`](Store::reset) lets it out.
    /// On Redis one `HSET` and one `PEXPIRE` in a script call.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use std::{num::NonZeroU32, time::Duration};
    /// use tollgate::{Key, MemoryStore, PenaltyBox, Policy, Quota, Store};
    /// let one = NonZeroU32::MIN;
    /// let b = PenaltyBox::new(one, Duration::from_secs(1), Duration::from_secs(60)).unwrap();
    /// let policy = Policy::fixed_window("api", Quota::per_hour(one)).with_penalty_box(b);
    /// let store = MemoryStore::new();
    /// let eve = Key::new("eve");
    /// store.block(&policy, &eve, Duration::from_secs(600)).await.unwrap();
    /// assert!(store.check(&policy, &eve, 1).await.unwrap().blocked);
    /// # }
    /// ```
    fn block<'a>(
        &'a self,
        policy: &'a Policy,
        key: &'a Key,
        block: std::time::Duration,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        let _ = (policy, key, block);
        Box::pin(async { Err(cannot("block callers")) })
    }

    /// `policy` with the limits an operator set at runtime for all its
    /// callers in force now (see [`PolicyLimits`]): its quotas replaced,
    /// capped; `None` when none is in force, the policy as built. Cheap and
    /// synchronous: the memory store's table, or a Redis store's copy of
    /// what Redis holds, refreshed in the background; shared, so a request
    /// clones a pointer, not the policy. The default keeps none.
    ///
    /// ```
    /// use std::num::NonZeroU32;
    /// use tollgate::{MemoryStore, Policy, Quota, Store};
    /// let policy = Policy::fixed_window("core", Quota::per_minute(NonZeroU32::new(5).unwrap()));
    /// assert!(MemoryStore::new().policy_in_force(&policy).is_none(), "none set");
    /// ```
    fn policy_in_force(&self, policy: &Policy) -> Option<Arc<Policy>> {
        let _ = policy;
        None
    }

    /// A number that changes whenever the runtime limits this store knows
    /// change (0 until one is set): a layer's cache of rejections forgets
    /// what it learnt under other limits.
    ///
    /// ```
    /// use tollgate::{MemoryStore, Store};
    /// assert_eq!(MemoryStore::new().policy_limits_version(), 0);
    /// ```
    fn policy_limits_version(&self) -> u64 {
        0
    }

    /// The runtime limits set for `policy`'s callers, as the store holds
    /// them now (those ended left out). On Redis one `HGETALL`.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use std::num::NonZeroU32;
    /// use tollgate::{MemoryStore, Override, Policy, PolicyLimit, Quota, Store};
    /// let per_min = |n| Quota::per_minute(NonZeroU32::new(n).unwrap());
    /// let policy = Policy::fixed_window("core", per_min(100));
    /// let store = MemoryStore::new();
    /// store.set_policy_limit(&policy, PolicyLimit::Limit, Some(&Override::new(per_min(10)))).await.unwrap();
    /// assert_eq!(store.policy_limits(&policy).await.unwrap().limit, Some(Override::new(per_min(10))));
    /// # }
    /// ```
    fn policy_limits<'a>(
        &'a self,
        policy: &'a Policy,
    ) -> BoxFuture<'a, Result<PolicyLimits, StoreError>> {
        let _ = policy;
        Box::pin(async { Ok(PolicyLimits::default()) })
    }

    /// The runtime limits of each of `policies`, in their order, read
    /// together: on Redis one `EVALSHA` (an `HGETALL` of the one hash every
    /// policy's limits live in), however many they are. The default reads
    /// each in turn with [`policy_limits`](Self::policy_limits).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use std::num::NonZeroU32;
    /// use tollgate::{MemoryStore, Override, Policy, PolicyLimit, Quota, Store};
    /// let per_min = |n| Quota::per_minute(NonZeroU32::new(n).unwrap());
    /// let (core, search) = (Policy::fixed_window("core", per_min(100)), Policy::fixed_window("search", per_min(50)));
    /// let store = MemoryStore::new();
    /// store.set_policy_limit(&search, PolicyLimit::Limit, Some(&Override::new(per_min(5)))).await.unwrap();
    /// let both = store.policies_limits(&[&core, &search]).await.unwrap();
    /// assert_eq!((both[0].limit.is_none(), both[1].limit.is_some()), (true, true));
    /// # }
    /// ```
    fn policies_limits<'a>(
        &'a self,
        policies: &'a [&'a Policy],
    ) -> BoxFuture<'a, Result<Vec<PolicyLimits>, StoreError>> {
        Box::pin(async move {
            let mut all = Vec::with_capacity(policies.len());
            for policy in policies {
                all.push(self.policy_limits(policy).await?);
            }
            Ok(all)
        })
    }

    /// Sets (`Some`) or clears (`None`) one of `policy`'s runtime limits
    /// (see [`PolicyLimits`]), for every caller on every app server; an
    /// [adjustable](Policy::adjustable) policy is judged by them. On
    /// Redis one `HSET` (or `HDEL`) of one hash, configuration without an
    /// expiry, which every app server reads every half second.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use std::num::NonZeroU32;
    /// use tollgate::{Key, MemoryStore, Override, Policy, PolicyLimit, Quota, Store};
    /// let per_min = |n| Quota::per_minute(NonZeroU32::new(n).unwrap());
    /// let policy = Policy::fixed_window("core", per_min(100)).adjustable();
    /// let store = MemoryStore::new();
    /// store.set_policy_limit(&policy, PolicyLimit::Limit, Some(&Override::new(per_min(10)))).await.unwrap();
    /// let judged = store.policy_in_force(&policy).unwrap();
    /// assert_eq!(store.check(&judged, &Key::new("bob"), 1).await.unwrap().limit, 10);
    /// # }
    /// ```
    fn set_policy_limit<'a>(
        &'a self,
        policy: &'a Policy,
        which: PolicyLimit,
        value: Option<&'a Override>,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        let _ = (policy, which, value);
        Box::pin(async { Err(cannot("keep runtime limits")) })
    }

    /// Lets `key` out of `policy`'s penalty box: removes its entry (a block,
    /// or strikes counting toward one) and keeps its counters, so the
    /// caller's quota still judges it. `true` if there was an entry. On
    /// Redis one `DEL` of the caller's penalty key in a script call. The
    /// default refuses, as [`block`](Store::block)'s does: a store of
    /// yours that cannot unblock says so rather than pretending.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use std::{num::NonZeroU32, time::Duration};
    /// use tollgate::{Key, MemoryStore, PenaltyBox, Policy, Quota, Store};
    /// let (one, three) = (NonZeroU32::MIN, NonZeroU32::new(3).unwrap());
    /// let b = PenaltyBox::new(three, Duration::from_secs(1), Duration::from_secs(60)).unwrap();
    /// let policy = Policy::fixed_window("api", Quota::per_hour(one)).with_penalty_box(b);
    /// let store = MemoryStore::new();
    /// let eve = Key::new("eve");
    /// assert!(store.check(&policy, &eve, 1).await.unwrap().allowed); // her one unit this hour
    /// store.block(&policy, &eve, Duration::from_secs(600)).await.unwrap();
    /// assert!(store.unblock(&policy, &eve).await.unwrap());
    /// let after = store.check(&policy, &eve, 1).await.unwrap();
    /// assert!(!after.blocked && !after.allowed, "unblocked, her quota still spent");
    /// # }
    /// ```
    fn unblock<'a>(
        &'a self,
        policy: &'a Policy,
        key: &'a Key,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        let _ = (policy, key);
        Box::pin(async { Err(cannot("unblock callers")) })
    }

    /// Whether this store decides inside this process, so it is never out
    /// of reach: a layer over it then keeps no record of its answers for a
    /// local fallback to start from. `false`, the default, is always safe.
    ///
    /// ```
    /// use tollgate::{MemoryStore, Store};
    /// assert!(MemoryStore::new().in_process());
    /// ```
    fn in_process(&self) -> bool {
        false
    }

    /// Decides at once, without awaiting, if this store can: an in-process
    /// store's fast path. `None` (the default) means "await [`check`](Store::check)".
    ///
    /// The layer asks this first, so a store that answers here spares every
    /// request a boxed future, a task wake-up and a deadline timer. Answering
    /// must charge exactly as `check` would.
    ///
    /// ```
    /// use std::num::NonZeroU32;
    /// use tollgate::{Key, MemoryStore, Policy, Quota, Store};
    ///
    /// let policy = Policy::fixed_window("core", Quota::per_minute(NonZeroU32::new(1).unwrap()));
    /// let decision = MemoryStore::new().check_now(&policy, &Key::new("bob"), 1);
    /// assert!(decision.unwrap().unwrap().allowed);
    /// ```
    fn check_now(
        &self,
        policy: &Policy,
        key: &Key,
        cost: u64,
    ) -> Option<Result<Decision, StoreError>> {
        let _ = (policy, key, cost);
        None
    }

    /// Gives `receipt` back at once, if this store can; `None` (the default)
    /// means "await [`refund`](Store::refund)". See [`check_now`](Store::check_now).
    ///
    /// `Some(Ok(()))` may also mean the store has committed to giving it
    /// back without anyone waiting: the Redis store queues a concurrency
    /// release this way when its calls are all busy, to go out with a
    /// later batch.
    ///
    /// ```
    /// use std::num::NonZeroU32;
    /// use tollgate::{Key, MemoryStore, Policy, Quota, Store};
    ///
    /// let store = MemoryStore::new();
    /// let policy = Policy::fixed_window("core", Quota::per_minute(NonZeroU32::new(1).unwrap()));
    /// let bob = Key::new("bob");
    /// let pass = store.check_now(&policy, &bob, 1).unwrap().unwrap();
    /// assert!(store.refund_now(&policy, &bob, &pass.receipt).unwrap().is_ok());
    /// assert!(store.check_now(&policy, &bob, 1).unwrap().unwrap().allowed);
    /// ```
    fn refund_now(
        &self,
        policy: &Policy,
        key: &Key,
        receipt: &Receipt,
    ) -> Option<Result<(), StoreError>> {
        let _ = (policy, key, receipt);
        None
    }
}

impl<S: Store + ?Sized> Store for Arc<S> {
    fn policy_in_force(&self, policy: &Policy) -> Option<Arc<Policy>> {
        (**self).policy_in_force(policy)
    }

    fn policies_limits<'a>(
        &'a self,
        policies: &'a [&'a Policy],
    ) -> BoxFuture<'a, Result<Vec<PolicyLimits>, StoreError>> {
        (**self).policies_limits(policies)
    }

    fn policy_limits_version(&self) -> u64 {
        (**self).policy_limits_version()
    }

    fn policy_limits<'a>(
        &'a self,
        policy: &'a Policy,
    ) -> BoxFuture<'a, Result<PolicyLimits, StoreError>> {
        (**self).policy_limits(policy)
    }

    fn set_policy_limit<'a>(
        &'a self,
        policy: &'a Policy,
        which: PolicyLimit,
        value: Option<&'a Override>,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        (**self).set_policy_limit(policy, which, value)
    }

    fn check<'a>(
        &'a self,
        policy: &'a Policy,
        key: &'a Key,
        cost: u64,
    ) -> BoxFuture<'a, Result<Decision, StoreError>> {
        (**self).check(policy, key, cost)
    }

    fn check_before<'a>(
        &'a self,
        policy: &'a Policy,
        key: &'a Key,
        cost: u64,
        deadline: Instant,
    ) -> BoxFuture<'a, Result<Decision, StoreError>> {
        (**self).check_before(policy, key, cost, deadline)
    }

    fn peek<'a>(
        &'a self,
        policy: &'a Policy,
        key: &'a Key,
    ) -> BoxFuture<'a, Result<Decision, StoreError>> {
        (**self).peek(policy, key)
    }

    fn peek_cost<'a>(
        &'a self,
        policy: &'a Policy,
        key: &'a Key,
        cost: u64,
    ) -> BoxFuture<'a, Result<Decision, StoreError>> {
        (**self).peek_cost(policy, key, cost)
    }

    fn refund<'a>(
        &'a self,
        policy: &'a Policy,
        key: &'a Key,
        receipt: &'a Receipt,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        (**self).refund(policy, key, receipt)
    }

    fn settle<'a>(
        &'a self,
        policy: &'a Policy,
        key: &'a Key,
        receipt: &'a Receipt,
        actual: u64,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        (**self).settle(policy, key, receipt, actual)
    }

    fn settle_now(
        &self,
        policy: &Policy,
        key: &Key,
        receipt: &Receipt,
        actual: u64,
    ) -> Option<Result<(), StoreError>> {
        (**self).settle_now(policy, key, receipt, actual)
    }

    fn reset<'a>(
        &'a self,
        policy: &'a Policy,
        key: &'a Key,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        (**self).reset(policy, key)
    }

    fn set_override<'a>(
        &'a self,
        policy: &'a Policy,
        key: &'a Key,
        quotas: &'a Override,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        (**self).set_override(policy, key, quotas)
    }

    fn get_override<'a>(
        &'a self,
        policy: &'a Policy,
        key: &'a Key,
    ) -> BoxFuture<'a, Result<Option<Override>, StoreError>> {
        (**self).get_override(policy, key)
    }

    fn clear_override<'a>(
        &'a self,
        policy: &'a Policy,
        key: &'a Key,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        (**self).clear_override(policy, key)
    }

    fn list_overrides<'a>(
        &'a self,
        policy: &'a Policy,
    ) -> BoxFuture<'a, Result<Vec<(Key, Override)>, StoreError>> {
        (**self).list_overrides(policy)
    }

    fn block<'a>(
        &'a self,
        policy: &'a Policy,
        key: &'a Key,
        block: std::time::Duration,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        (**self).block(policy, key, block)
    }

    fn unblock<'a>(
        &'a self,
        policy: &'a Policy,
        key: &'a Key,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        (**self).unblock(policy, key)
    }

    fn in_process(&self) -> bool {
        (**self).in_process()
    }

    fn check_now(
        &self,
        policy: &Policy,
        key: &Key,
        cost: u64,
    ) -> Option<Result<Decision, StoreError>> {
        (**self).check_now(policy, key, cost)
    }

    fn refund_now(
        &self,
        policy: &Policy,
        key: &Key,
        receipt: &Receipt,
    ) -> Option<Result<(), StoreError>> {
        (**self).refund_now(policy, key, receipt)
    }
}

/// A store's refusal of what it cannot do.
fn cannot(what: &str) -> StoreError {
    StoreError::new(
        crate::error::StoreErrorKind::Rejected,
        format!("this store cannot {what}"),
    )
}
