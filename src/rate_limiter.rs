//! [`RateLimiter`]: a layer's limits, called directly, for what a layer
//! cannot see (failed logins, WebSocket messages, jobs) and for operators.

use std::fmt;
use std::sync::Arc;

use http::request::Parts;

use crate::decision::Decision;
use crate::error::{AdminError, ConfigError, KeyError, StoreError};
use crate::failure::FailurePolicy;
use crate::key::{Caller, Key};
use crate::layer::RateLimitLayer;
use crate::limiter::Limiter;
use crate::overrides::Override;
use crate::policy::Policy;
use crate::policy_limits::{PolicyLimit, PolicyLimits};
use crate::store::Store;

mod checks;
mod together;
use checks::{check_override, check_policy_limit};

/// A cheap, cloneable handle on one policy's limits: `check`, `peek`,
/// `refund`, `settle` and `reset` a key yourself, with the same store, deadline,
/// failure policy and [`Decision`] as the layer it comes from.
///
/// Take one from a layer with [`RateLimitLayer::limiter`] (then the layer
/// and the handle share one budget, one circuit breaker and one local
/// fallback), or build one alone with [`RateLimiter::new`]. Each call is
/// one store call: on Redis one `EVALSHA` (a reset is one `DEL`).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// use std::num::NonZeroU32;
/// use tollgate::{Key, MemoryStore, Policy, Quota, RateLimiter};
///
/// // Count failed logins only: five per caller per hour.
/// let failed_logins = Policy::fixed_window("failed-logins", Quota::per_hour(NonZeroU32::new(5).unwrap()));
/// let limiter = RateLimiter::new(failed_logins, MemoryStore::new()).unwrap();
/// let caller = Key::new("203.0.113.9");
/// for _ in 0..5 {
///     assert!(limiter.check(&caller, 1).await.unwrap().allowed);
/// }
/// assert!(!limiter.check(&caller, 1).await.unwrap().allowed);
/// limiter.reset(&caller).await.unwrap(); // an operator unblocks the caller
/// assert_eq!(limiter.peek(&caller).await.unwrap().remaining, 5);
/// # }
/// ```
#[derive(Clone)]
pub struct RateLimiter {
    core: Arc<Limiter>,
}

impl fmt::Debug for RateLimiter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimiter")
            .field("policy", &self.core.name())
            .finish_non_exhaustive()
    }
}

impl RateLimiter {
    /// A limiter for `policy` on `store`, with the layer's defaults (a
    /// 100 ms deadline, a local fallback). For other options build a
    /// [`RateLimitLayer`] and take its [`limiter`](RateLimitLayer::limiter).
    ///
    /// # Errors
    ///
    /// The policy's [`ConfigError`], as the layer's builder reports it.
    ///
    /// ```
    /// use std::num::NonZeroU32;
    /// use tollgate::{MemoryStore, Policy, Quota, RateLimiter};
    ///
    /// let jobs = Policy::gcra("jobs", Quota::per_second(NonZeroU32::new(10).unwrap()), NonZeroU32::new(20).unwrap());
    /// let limiter = RateLimiter::new(jobs, MemoryStore::new()).unwrap();
    /// assert_eq!(limiter.policy().name(), "jobs");
    /// ```
    pub fn new(policy: Policy, store: impl Store) -> Result<Self, ConfigError> {
        let layer = RateLimitLayer::builder()
            .policy(policy)
            .store(store)
            // Never asked: a handle is given its keys.
            .key(|_: &Parts| Err(KeyError::Missing("key: a RateLimiter is given its keys")))
            .build()?;
        Ok(layer.limiter())
    }

    pub(crate) fn of(core: Arc<Limiter>) -> Self {
        Self { core }
    }

    /// The policy this limiter enforces.
    ///
    /// ```
    /// use std::num::NonZeroU32;
    /// use tollgate::{MemoryStore, Policy, Quota, RateLimiter};
    /// let policy = Policy::fixed_window("ws-messages", Quota::per_minute(NonZeroU32::new(600).unwrap()));
    /// let limiter = RateLimiter::new(policy, MemoryStore::new()).unwrap();
    /// assert_eq!(limiter.policy().name(), "ws-messages");
    /// ```
    pub fn policy(&self) -> &Policy {
        self.core.as_built()
    }

    /// The key a request of `caller` gets under this limiter's layer's
    /// extractor (see [`Caller`]): how an operator names the caller an
    /// override, a block, a reset or a peek is for. A limiter built alone
    /// ([`RateLimiter::new`]) has no extractor and answers
    /// [`KeyError::Missing`].
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use std::num::NonZeroU32;
    /// use tollgate::{key::Caller, HeaderKey, MemoryStore, Override, Policy, Quota, RateLimitLayer};
    ///
    /// let hourly = |n| Quota::per_hour(NonZeroU32::new(n).unwrap());
    /// let layer = RateLimitLayer::builder()
    ///     .policy(Policy::fixed_window("api", hourly(100)).overridable())
    ///     .key(HeaderKey::new("x-api-key"))
    ///     .store(MemoryStore::new())
    ///     .build()
    ///     .unwrap();
    /// let api = layer.limiter();
    /// let acme = api.key_of(&Caller::new().header("x-api-key", "acme-key").unwrap()).unwrap();
    /// api.set_override(&acme, Override::new(hourly(5_000))).await.unwrap();
    /// assert_eq!(api.peek(&acme).await.unwrap().limit, 5_000);
    /// # }
    /// ```
    pub fn key_of(&self, caller: &Caller) -> Result<Key, KeyError> {
        self.core.config.key.key_of(caller)
    }

    /// Charges `cost` to `key` if it fits: the decision the layer would
    /// write its headers from. When the store fails or misses the deadline,
    /// a local fallback decides (with [`Decision::fallback`] set); with
    /// `FailurePolicy::Open` or `closed(..)` the store's error comes back
    /// for you to apply, as you would for a request.
    ///
    /// # Errors
    ///
    /// The store's [`StoreError`], when no local fallback decided instead.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use std::num::NonZeroU32;
    /// use tollgate::{Key, MemoryStore, Policy, Quota, RateLimiter};
    /// let policy = Policy::fixed_window("jobs", Quota::per_minute(NonZeroU32::new(10).unwrap()));
    /// let limiter = RateLimiter::new(policy, MemoryStore::new()).unwrap();
    /// let decision = limiter.check(&Key::new("tenant-7"), 4).await.unwrap();
    /// assert_eq!((decision.allowed, decision.remaining), (true, 6));
    /// # }
    /// ```
    pub async fn check(&self, key: &Key, cost: u64) -> Result<Decision, StoreError> {
        let core = &*self.core;
        let in_force = core.policy_in_force(None);
        let err = match core.ask_main(in_force.clone(), key, cost).await {
            Ok(decision) => {
                core.learn_from_main(key, cost, &decision);
                return Ok(decision);
            }
            Err(err) => err,
        };
        core.running.health.decided_without_store();
        let FailurePolicy::Local(local) = &core.config.failure else {
            return Err(err);
        };
        core.seed(local, core.in_force(in_force.as_ref()), key);
        let mut decision = core.ask(&**local, in_force, key, cost).await?;
        decision.fallback = true;
        Ok(decision)
    }

    /// `key`'s current state, charging nothing: on Redis one read-only
    /// script call, which replicas may serve. While the store fails, a local
    /// fallback answers, with [`Decision::fallback`] set.
    ///
    /// # Errors
    ///
    /// The store's [`StoreError`], when no local fallback answered instead.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use std::num::NonZeroU32;
    /// use tollgate::{Key, MemoryStore, Policy, Quota, RateLimiter};
    /// let policy = Policy::fixed_window("jobs", Quota::per_minute(NonZeroU32::new(10).unwrap()));
    /// let limiter = RateLimiter::new(policy, MemoryStore::new()).unwrap();
    /// assert_eq!(limiter.peek(&Key::new("tenant-7")).await.unwrap().remaining, 10);
    /// # }
    /// ```
    pub async fn peek(&self, key: &Key) -> Result<Decision, StoreError> {
        self.core.peek_key(key).await
    }

    /// The cap this server's decisions apply now (its copy of the
    /// runtime limits), if one is in force: a limit per quota.
    #[cfg_attr(not(feature = "admin"), allow(dead_code))]
    pub(crate) fn cap_now(&self) -> Option<Vec<u32>> {
        let in_force = self.core.policy_in_force(None)?;
        in_force.cap().map(<[u32]>::to_vec)
    }

    /// [`peek`](Self::peek), with the wait and reset a request of one unit
    /// would be told when the caller's quota is used up (a peek, charging
    /// nothing, passes and shows none): one dry run more, then.
    #[cfg_attr(not(feature = "admin"), allow(dead_code))]
    pub(crate) async fn peek_as_request(&self, key: &Key) -> Result<Decision, StoreError> {
        let mut seen = self.peek(key).await?;
        if seen.fallback || seen.remaining > 0 || seen.blocked || seen.retry_after.is_some() {
            return Ok(seen);
        }
        let core = &*self.core;
        let in_force = core.policy_in_force(None);
        let one = core
            .config
            .store
            .peek_cost(core.in_force(in_force.as_ref()), key, 1);
        if let Ok(one) = core.within_deadline(one).await.0
            && !one.allowed
        {
            seen.retry_after = one.retry_after;
            seen.reset_at_micros = one.reset_at_micros;
            seen.blocked = one.blocked;
        }
        Ok(seen)
    }

    /// Gives back what `decision` charged to `key`, if its window (or slot,
    /// or place) is still the one charged: to the store that decided it,
    /// the local fallback included. A rejection charged nothing and gives
    /// nothing back. On Redis one `EVALSHA`.
    ///
    /// # Errors
    ///
    /// The deciding store's [`StoreError`].
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use std::num::NonZeroU32;
    /// use tollgate::{Key, MemoryStore, Policy, Quota, RateLimiter};
    /// let policy = Policy::fixed_window("jobs", Quota::per_minute(NonZeroU32::new(10).unwrap()));
    /// let limiter = RateLimiter::new(policy, MemoryStore::new()).unwrap();
    /// let tenant = Key::new("tenant-7");
    /// let charged = limiter.check(&tenant, 3).await.unwrap();
    /// limiter.refund(&tenant, &charged).await.unwrap(); // the job was never run
    /// assert_eq!(limiter.peek(&tenant).await.unwrap().remaining, 10);
    /// # }
    /// ```
    pub async fn refund(&self, key: &Key, decision: &Decision) -> Result<(), StoreError> {
        let core = &*self.core;
        if !decision.allowed || decision.receipt.is_empty() {
            return Ok(());
        }
        let store = match (&core.config.failure, decision.fallback) {
            (FailurePolicy::Local(local), true) => local,
            _ => &core.config.store,
        };
        let policy = core.charged_under(&decision.receipt);
        let refund = store.refund(policy, key, &decision.receipt);
        let result = core.within_deadline(refund).await.0;
        if result.is_ok() && !decision.fallback {
            core.running.local.refunded(key);
        }
        result
    }

    /// Settles what `decision` charged to `key` to `actual` units, the real
    /// cost known once the work is done: check with an estimate, then
    /// settle. The difference is charged (without checking the limit: the
    /// units were spent) or given back, in one store call, to the window
    /// the estimate was charged in (a window that has ended since is left
    /// alone), at the store that decided, the local fallback included.
    /// Returns `decision` as settled: `used` moved by the difference,
    /// `remaining` never below zero. A rejection charged nothing and is
    /// returned as it is. On Redis one `EVALSHA` of the strategy's refund
    /// script, none when `actual` is what was charged; what each strategy
    /// does is in [`Store::settle`].
    ///
    /// # Errors
    ///
    /// The deciding store's [`StoreError`]; the concurrency limit, whose
    /// slots are held rather than spent, refuses (give a slot back with
    /// [`refund`](Self::refund)).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use std::num::NonZeroU32;
    /// use tollgate::{Key, MemoryStore, Policy, Quota, RateLimiter};
    /// let policy = Policy::fixed_window("tokens", Quota::per_minute(NonZeroU32::new(100).unwrap()));
    /// let limiter = RateLimiter::new(policy, MemoryStore::new()).unwrap();
    /// let tenant = Key::new("tenant-7");
    /// let estimate = limiter.check(&tenant, 10).await.unwrap();
    /// let settled = limiter.settle(&tenant, &estimate, 130).await.unwrap(); // it took 130
    /// assert_eq!((settled.used, settled.remaining), (100, 0)); // Used shows at most the limit
    /// assert!(!limiter.check(&tenant, 1).await.unwrap().allowed);
    /// # }
    /// ```
    pub async fn settle(
        &self,
        key: &Key,
        decision: &Decision,
        actual: u64,
    ) -> Result<Decision, StoreError> {
        let core = &*self.core;
        let policy = core.charged_under(&decision.receipt);
        if let Some(refused) = policy.strategy().settle_refused() {
            return Err(refused);
        }
        let charged = decision.receipt.cost();
        if !decision.allowed || actual == charged {
            return Ok(decision.clone());
        }
        let store = match (&core.config.failure, decision.fallback) {
            (FailurePolicy::Local(local), true) => local,
            _ => &core.config.store,
        };
        let settle = store.settle(policy, key, &decision.receipt, actual);
        core.within_deadline(settle).await.0?;
        if actual < charged && !decision.fallback {
            core.running.local.refunded(key);
        }
        crate::metrics::settled(core.as_built(), charged, actual);
        Ok(decision.clone().settled(actual))
    }

    /// Forgets `key`'s state under this policy, atomically, whatever the
    /// strategy: the operator's unblock. On Redis one `DEL` of the caller's
    /// keys; state every caller shares (a sliding log's resource quota) is
    /// kept. The local fallback, the layer's cache of rejections and what
    /// the fallback would start from forget the key too.
    ///
    /// # Errors
    ///
    /// The main store's [`StoreError`]; a store of your own that does not
    /// implement [`Store::reset`] refuses.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use std::num::NonZeroU32;
    /// use tollgate::{Key, MemoryStore, Policy, Quota, RateLimiter};
    /// let policy = Policy::fixed_window("core", Quota::per_hour(NonZeroU32::new(1).unwrap()));
    /// let limiter = RateLimiter::new(policy, MemoryStore::new()).unwrap();
    /// let customer = Key::new("customer-42");
    /// limiter.check(&customer, 1).await.unwrap();
    /// limiter.reset(&customer).await.unwrap();
    /// assert!(limiter.check(&customer, 1).await.unwrap().allowed);
    /// # }
    /// ```
    pub async fn reset(&self, key: &Key) -> Result<(), StoreError> {
        let core = &*self.core;
        let result = core
            .within_deadline(core.config.store.reset(core.as_built(), key))
            .await
            .0;
        if let FailurePolicy::Local(local) = &core.config.failure {
            // Best effort: the fallback only matters during an outage.
            let _ = core
                .within_deadline(local.reset(core.as_built(), key))
                .await;
        }
        core.forget(key);
        result
    }
}

/// The operator's side: a caller's own quotas and the penalty box.
impl RateLimiter {
    /// Gives `key` quotas of its own (see [`Override`]), which beat the
    /// policy's, a tier's and a quota that came with the request, on every
    /// app server at its next decision. The policy must be
    /// [overridable](Policy::overridable). On Redis three calls, list
    /// first: the policy's list marks the caller pending, the override key
    /// is set, the list entry is confirmed; a write that stops part way
    /// leaves the entry pending, and the list reads the override key for
    /// it, so it never misses an override in force. This
    /// server's cache of rejections and fallback forget the key; another
    /// server's cache keeps a rejection of an overridable policy at most a
    /// second, so a raised limit lets the caller through there within a
    /// second.
    ///
    /// # Errors
    ///
    /// [`AdminError::Invalid`] when the policy is not overridable or the
    /// override does not fit it (nothing is stored); the store's error.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use std::num::NonZeroU32;
    /// use tollgate::{Key, MemoryStore, Override, Policy, Quota, RateLimiter};
    /// let hourly = |n| Quota::per_hour(NonZeroU32::new(n).unwrap());
    /// let policy = Policy::fixed_window("api", hourly(100)).overridable();
    /// let limiter = RateLimiter::new(policy, MemoryStore::new()).unwrap();
    /// let acme = Key::new("acme");
    /// limiter.set_override(&acme, Override::new(hourly(5_000))).await.unwrap();
    /// assert_eq!(limiter.check(&acme, 1).await.unwrap().limit, 5_000);
    /// # }
    /// ```
    pub async fn set_override(&self, key: &Key, quotas: Override) -> Result<(), AdminError> {
        let core = &*self.core;
        let policy = core.as_built();
        check_override(policy, &quotas)?;
        let set = core.config.store.set_override(policy, key, &quotas);
        core.within_deadline(set).await.0?;
        crate::metrics::override_changed(policy, "set");
        if let FailurePolicy::Local(local) = &core.config.failure {
            // Best effort: the fallback only matters during an outage.
            let _ = core
                .within_deadline(local.set_override(policy, key, &quotas))
                .await;
        }
        core.forget(key);
        Ok(())
    }

    /// `key`'s override, if one is in force. On Redis one `GET`.
    ///
    /// # Errors
    ///
    /// The store's [`StoreError`].
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use std::num::NonZeroU32;
    /// use tollgate::{Key, MemoryStore, Policy, Quota, RateLimiter};
    /// let policy = Policy::fixed_window("api", Quota::per_hour(NonZeroU32::new(100).unwrap())).overridable();
    /// let limiter = RateLimiter::new(policy, MemoryStore::new()).unwrap();
    /// assert_eq!(limiter.get_override(&Key::new("acme")).await.unwrap(), None);
    /// # }
    /// ```
    pub async fn get_override(&self, key: &Key) -> Result<Option<Override>, StoreError> {
        let core = &*self.core;
        let get = core.config.store.get_override(core.as_built(), key);
        core.within_deadline(get).await.0
    }

    /// Removes `key`'s override: the policy's quotas judge it again at its
    /// next decision. `true` if one was in force. On Redis three calls, list
    /// first as [`set_override`](Self::set_override)'s: the list's mark, a
    /// `GET` and `DEL` of the override key, an `HDEL`.
    ///
    /// # Errors
    ///
    /// The store's [`StoreError`].
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use std::num::NonZeroU32;
    /// use tollgate::{Key, MemoryStore, Override, Policy, Quota, RateLimiter};
    /// let hourly = |n| Quota::per_hour(NonZeroU32::new(n).unwrap());
    /// let limiter = RateLimiter::new(Policy::fixed_window("api", hourly(100)).overridable(), MemoryStore::new()).unwrap();
    /// let acme = Key::new("acme");
    /// limiter.set_override(&acme, Override::new(hourly(5))).await.unwrap();
    /// assert!(limiter.clear_override(&acme).await.unwrap());
    /// assert_eq!(limiter.check(&acme, 1).await.unwrap().limit, 100);
    /// # }
    /// ```
    pub async fn clear_override(&self, key: &Key) -> Result<bool, StoreError> {
        let core = &*self.core;
        let policy = core.as_built();
        let clear = core.config.store.clear_override(policy, key);
        let cleared = core.within_deadline(clear).await.0?;
        crate::metrics::override_changed(policy, "cleared");
        if let FailurePolicy::Local(local) = &core.config.failure {
            let _ = core
                .within_deadline(local.clear_override(policy, key))
                .await;
        }
        core.forget(key);
        Ok(cleared)
    }

    /// Every override in force under this policy, by caller (its key as
    /// stored). On Redis one `HGETALL` of the policy's list.
    ///
    /// # Errors
    ///
    /// The store's [`StoreError`].
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use std::num::NonZeroU32;
    /// use tollgate::{Key, MemoryStore, Override, Policy, Quota, RateLimiter};
    /// let hourly = |n| Quota::per_hour(NonZeroU32::new(n).unwrap());
    /// let limiter = RateLimiter::new(Policy::fixed_window("api", hourly(100)).overridable(), MemoryStore::new()).unwrap();
    /// limiter.set_override(&Key::new("acme"), Override::new(hourly(5))).await.unwrap();
    /// let all = limiter.list_overrides().await.unwrap();
    /// assert_eq!(all, vec![(Key::new("acme"), Override::new(hourly(5)))]);
    /// # }
    /// ```
    pub async fn list_overrides(&self) -> Result<Vec<(Key, Override)>, StoreError> {
        let core = &*self.core;
        let list = core.config.store.list_overrides(core.as_built());
        core.within_deadline(list).await.0
    }

    /// Refuses `key` for `block` (1 ms to a year) on every app server, as
    /// the policy's [penalty box](crate::PenaltyBox) would;
    /// [`unblock`](Self::unblock) lets it out (and [`reset`](Self::reset),
    /// which forgets its counters too). On Redis one `EVALSHA` (`HSET`
    /// and `PEXPIRE`).
    ///
    /// # Errors
    ///
    /// [`AdminError::Invalid`] when the policy has no penalty box or the
    /// block is out of bounds; the store's error.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use std::{num::NonZeroU32, time::Duration};
    /// use tollgate::{Key, MemoryStore, PenaltyBox, Policy, Quota, RateLimiter};
    /// let one = NonZeroU32::MIN;
    /// let penalty = PenaltyBox::new(one, Duration::from_secs(60), Duration::from_secs(60)).unwrap();
    /// let policy = Policy::fixed_window("login", Quota::per_minute(one)).with_penalty_box(penalty);
    /// let limiter = RateLimiter::new(policy, MemoryStore::new()).unwrap();
    /// let mallory = Key::new("mallory");
    /// limiter.block(&mallory, Duration::from_secs(3600)).await.unwrap();
    /// assert!(limiter.check(&mallory, 1).await.unwrap().blocked);
    /// limiter.reset(&mallory).await.unwrap();
    /// assert!(limiter.check(&mallory, 1).await.unwrap().allowed);
    /// # }
    /// ```
    pub async fn block(&self, key: &Key, block: std::time::Duration) -> Result<(), AdminError> {
        let core = &*self.core;
        let policy = core.as_built();
        let Some(penalty) = policy.penalty_box() else {
            return Err(ConfigError::PenaltyBox {
                why: format!("policy {:?} has no penalty box to block in", policy.name()),
            }
            .into());
        };
        crate::penalty::PenaltyBox::new(penalty.strikes(), block, block)?;
        let blocked = core.config.store.block(policy, key, block);
        core.within_deadline(blocked).await.0?;
        crate::metrics::block_started(policy, "operator");
        if let FailurePolicy::Local(local) = &core.config.failure {
            let _ = core.within_deadline(local.block(policy, key, block)).await;
        }
        core.forget(key);
        Ok(())
    }

    /// Lets `key` out of the penalty box, whether a block by hand or by
    /// its strikes put it there, on every app server at its next decision,
    /// and clears its strikes; its counters stay (unlike
    /// [`reset`](Self::reset), which forgets them too), so the caller's
    /// quota still judges it. `true` if the caller had an entry (a block,
    /// or strikes toward one). A policy without a penalty box has none:
    /// `false`, with no store call. On Redis one `EVALSHA` (a `DEL` of the
    /// caller's penalty key). This server's cache of rejections and
    /// fallback forget the key; another server's cache of rejections keeps
    /// repeating a block it saw until the block's end.
    ///
    /// # Errors
    ///
    /// The main store's [`StoreError`]; a store of your own that does not
    /// implement [`Store::unblock`] refuses.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use std::{num::NonZeroU32, time::Duration};
    /// use tollgate::{Key, MemoryStore, PenaltyBox, Policy, Quota, RateLimiter};
    /// let ten = NonZeroU32::new(10).unwrap();
    /// let penalty = PenaltyBox::new(ten, Duration::from_secs(60), Duration::from_secs(60)).unwrap();
    /// let policy = Policy::fixed_window("login", Quota::per_minute(ten)).with_penalty_box(penalty);
    /// let limiter = RateLimiter::new(policy, MemoryStore::new()).unwrap();
    /// let mallory = Key::new("mallory");
    /// limiter.check(&mallory, 4).await.unwrap();
    /// limiter.block(&mallory, Duration::from_secs(3600)).await.unwrap();
    /// assert!(limiter.unblock(&mallory).await.unwrap());
    /// let next = limiter.check(&mallory, 1).await.unwrap();
    /// assert!(next.allowed && next.used == 5, "out of the box, the 4 units it spent still count");
    /// # }
    /// ```
    pub async fn unblock(&self, key: &Key) -> Result<bool, StoreError> {
        let core = &*self.core;
        let policy = core.as_built();
        if policy.penalty_box().is_none() {
            return Ok(false);
        }
        let unblock = core.config.store.unblock(policy, key);
        let had = core.within_deadline(unblock).await.0?;
        if let FailurePolicy::Local(local) = &core.config.failure {
            // Best effort: the fallback only matters during an outage.
            let _ = core.within_deadline(local.unblock(policy, key)).await;
        }
        core.forget(key);
        Ok(had)
    }
}

/// The operator's side for every caller: a policy's limits changed at
/// runtime ([`PolicyLimits`]).
impl RateLimiter {
    /// Replaces the policy's quotas (this limiter's policy or tier's) for
    /// every caller, optionally until a time ([`Override::until`]): as many
    /// quotas as the policy has. The memory store applies it at once; on
    /// Redis it is one `HSET` of one hash (configuration, no expiry), which
    /// this server applies at once and every other app server within a
    /// second. A caller's override and a limit from the request beat it;
    /// the cap beats all (see [`PolicyLimits`]).
    ///
    /// # Errors
    ///
    /// [`AdminError::Invalid`] when the quotas do not fit the policy
    /// (nothing is stored); the store's error (a timeout may have landed:
    /// the write is idempotent, repeat it).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use std::num::NonZeroU32;
    /// use tollgate::{Key, MemoryStore, Override, Policy, Quota, RateLimiter};
    /// let per_min = |n| Quota::per_minute(NonZeroU32::new(n).unwrap());
    /// let search = RateLimiter::new(Policy::fixed_window("search", per_min(100)).adjustable(), MemoryStore::new()).unwrap();
    /// search.set_policy_limit(Override::new(per_min(10))).await.unwrap(); // an incident
    /// assert_eq!(search.check(&Key::new("anyone"), 1).await.unwrap().limit, 10);
    /// assert!(search.clear_policy_limit().await.unwrap());
    /// assert_eq!(search.check(&Key::new("anyone"), 1).await.unwrap().limit, 100);
    /// # }
    /// ```
    pub async fn set_policy_limit(&self, limit: Override) -> Result<(), AdminError> {
        self.change_policy_limit(PolicyLimit::Limit, Some(limit))
            .await
    }

    /// Caps every quota's limit for every caller, optionally until a time:
    /// nothing exceeds it, not the runtime limit, a caller's override (an
    /// override above the cap is set aside while it lasts) or a limit from
    /// the request. Give the policy's quotas' windows, one limit each. Load
    /// shedding during an incident. Cost and reach as
    /// [`set_policy_limit`](Self::set_policy_limit).
    ///
    /// # Errors
    ///
    /// As [`set_policy_limit`](Self::set_policy_limit), and when a window
    /// is not the policy's.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use std::num::NonZeroU32;
    /// use tollgate::{Key, MemoryStore, Override, Policy, Quota, RateLimiter};
    /// let per_min = |n| Quota::per_minute(NonZeroU32::new(n).unwrap());
    /// let api = RateLimiter::new(Policy::fixed_window("api", per_min(100)).overridable().adjustable(), MemoryStore::new()).unwrap();
    /// api.set_override(&Key::new("acme"), Override::new(per_min(1_000))).await.unwrap();
    /// api.set_policy_cap(Override::new(per_min(50))).await.unwrap();
    /// assert_eq!(api.check(&Key::new("acme"), 1).await.unwrap().limit, 50);
    /// # }
    /// ```
    pub async fn set_policy_cap(&self, cap: Override) -> Result<(), AdminError> {
        self.change_policy_limit(PolicyLimit::Cap, Some(cap)).await
    }

    /// Clears the runtime limit: the policy's own quotas judge again.
    /// `true` if one was in force. On Redis an `HGETALL` and an `HDEL`.
    ///
    /// # Errors
    ///
    /// The store's [`StoreError`].
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use std::num::NonZeroU32;
    /// use tollgate::{MemoryStore, Policy, Quota, RateLimiter};
    /// let limiter = RateLimiter::new(Policy::fixed_window("api", Quota::per_minute(NonZeroU32::MIN)), MemoryStore::new()).unwrap();
    /// assert!(!limiter.clear_policy_limit().await.unwrap(), "none was set");
    /// # }
    /// ```
    pub async fn clear_policy_limit(&self) -> Result<bool, StoreError> {
        self.clear(PolicyLimit::Limit).await
    }

    /// Clears the cap. `true` if one was in force.
    ///
    /// # Errors
    ///
    /// The store's [`StoreError`].
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use std::num::NonZeroU32;
    /// use tollgate::{MemoryStore, Policy, Quota, RateLimiter};
    /// let limiter = RateLimiter::new(Policy::fixed_window("api", Quota::per_minute(NonZeroU32::MIN)), MemoryStore::new()).unwrap();
    /// assert!(!limiter.clear_policy_cap().await.unwrap());
    /// # }
    /// ```
    pub async fn clear_policy_cap(&self) -> Result<bool, StoreError> {
        self.clear(PolicyLimit::Cap).await
    }

    /// The runtime limit and cap in force, as the store holds them (on
    /// Redis one `HGETALL`). The quotas the policy was built with are
    /// [`policy`](Self::policy)'s.
    ///
    /// # Errors
    ///
    /// The store's [`StoreError`].
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use std::num::NonZeroU32;
    /// use tollgate::{MemoryStore, Policy, PolicyLimits, Quota, RateLimiter};
    /// let limiter = RateLimiter::new(Policy::fixed_window("api", Quota::per_minute(NonZeroU32::MIN)), MemoryStore::new()).unwrap();
    /// assert_eq!(limiter.policy_limits().await.unwrap(), PolicyLimits::default());
    /// # }
    /// ```
    pub async fn policy_limits(&self) -> Result<PolicyLimits, StoreError> {
        let core = &*self.core;
        let read = core.config.store.policy_limits(core.as_built());
        core.within_deadline(read).await.0
    }

    async fn change_policy_limit(
        &self,
        which: PolicyLimit,
        value: Option<Override>,
    ) -> Result<(), AdminError> {
        let core = &*self.core;
        let policy = core.as_built();
        if let Some(value) = &value {
            check_policy_limit(policy, which, value)?;
        }
        let set = core
            .config
            .store
            .set_policy_limit(policy, which, value.as_ref());
        core.within_deadline(set).await.0?;
        crate::metrics::policy_limit_changed(
            policy,
            which.as_str(),
            if value.is_some() { "set" } else { "cleared" },
        );
        if let FailurePolicy::Local(local) = &core.config.failure {
            // Best effort: the fallback judges by the main store's limits.
            let _ = core
                .within_deadline(local.set_policy_limit(policy, which, value.as_ref()))
                .await;
        }
        Ok(())
    }

    async fn clear(&self, which: PolicyLimit) -> Result<bool, StoreError> {
        let was = self.policy_limits().await?.get(which).is_some();
        match self.change_policy_limit(which, None).await {
            Ok(()) => Ok(was),
            Err(AdminError::Store(err)) => Err(err),
            Err(AdminError::Invalid(err)) => Err(StoreError::new(
                crate::error::StoreErrorKind::Rejected,
                err.to_string(),
            )),
        }
    }
}

/// The layer's side of [`RateLimiter`]: here rather than in `layer/`, so
/// that the layer need not know the type it hands out.
impl RateLimitLayer {
    /// A handle on this layer's limits for code outside HTTP (failed
    /// logins, WebSocket messages, jobs) and for operators: it shares the
    /// layer's store, budget, breaker and fallback.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use std::num::NonZeroU32;
    /// use tollgate::{Key, Policy, Quota, RateLimitLayer};
    ///
    /// let layer = RateLimitLayer::builder()
    ///     .policy(Policy::fixed_window("core", Quota::per_hour(NonZeroU32::new(60).unwrap())))
    ///     .build().unwrap();
    /// let limiter = layer.limiter();
    /// limiter.check(&Key::new("10.0.0.1"), 1).await.unwrap();
    /// assert_eq!(limiter.peek(&Key::new("10.0.0.1")).await.unwrap().remaining, 59);
    /// # }
    /// ```
    pub fn limiter(&self) -> RateLimiter {
        RateLimiter::of(self.limiter.clone())
    }
}
