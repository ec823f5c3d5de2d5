//! The in-process store: the embedded default, no Redis needed.

use std::sync::{Arc, Mutex, MutexGuard};

use foldhash::fast::RandomState;

use super::{BoxFuture, Store};
use crate::clock::{Clock, SystemClock};
use crate::decision::{Decision, Receipt, Scope};
use crate::error::StoreError;
use crate::key::Key;
use crate::overrides::Override;
use crate::policy::Policy;
use crate::policy_limits::{PolicyLimit, PolicyLimits};
use crate::store::policy_limits::RuntimeLimits;

pub(crate) mod caller;
pub(crate) mod names;
pub(crate) mod shard;
pub(crate) mod state;

use names::KeyNames;
use shard::Shard;

const SHARDS: usize = 64;

/// Keeps limits in this process's memory, with the same semantics as Redis.
///
/// Each decision runs the strategy under one shard's lock, so concurrent
/// requests never over-admit. Limits are per process: two app servers with a
/// `MemoryStore` each allow twice the limit between them. Use
/// [`RedisStore`](crate::RedisStore) to share limits.
///
/// **Memory.** Entries expire like the Redis keys: a fixed window one second
/// after it ends, a leaky bucket one second after it empties, a concurrency
/// set one timeout after its last admission (and it never holds more than
/// `limit` slots), a uniform gate one second after it reopens, a GCRA bucket
/// one second after it is full again, a sliding-window counter one second
/// after the end of the window after its current one, and a sliding log one
/// second after its newest entry leaves the window (it never holds more than
/// its limit, one entry per unit). Each shard drops expired entries at most
/// once per second of its clock, when it is next used. Memory is bounded by
/// the callers active within that time.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// use std::{num::NonZeroU32, time::Duration};
/// use tollgate::{Key, MemoryStore, Policy, Quota, Store};
/// use tollgate::clock::ManualClock;
///
/// let clock = ManualClock::new(0);
/// let store = MemoryStore::with_clock(clock.clone());
/// let policy = Policy::fixed_window("core", Quota::per_second(NonZeroU32::new(1).unwrap()));
/// let key = Key::new("bob");
/// assert!(store.check(&policy, &key, 1).await.unwrap().allowed);
/// assert!(!store.check(&policy, &key, 1).await.unwrap().allowed);
/// clock.advance(Duration::from_secs(1));
/// assert!(store.check(&policy, &key, 1).await.unwrap().allowed);
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct MemoryStore {
    inner: Arc<Inner>,
}

/// Keys are hashed with foldhash rather than std's SipHash, which cost
/// more than the strategy itself. Keys are partly chosen by callers (an
/// address, a header's digest, a custom extractor's text), so the hasher is
/// randomly seeded per process: foldhash is "minimally DoS-resistant", and
/// colliding keys would have to be found without seeing the seed, through
/// a rate limiter.
#[derive(Debug)]
struct Inner {
    shards: Box<[Mutex<Shard>]>,
    hasher: RandomState,
    clock: Arc<dyn Clock>,
    overrides: caller::Overrides,
    /// Limits operators set for every caller of a policy.
    policy_limits: RuntimeLimits,
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryStore {
    /// A store on the system clock.
    ///
    /// ```
    /// use tollgate::MemoryStore;
    /// let store = MemoryStore::new();
    /// assert!(store.is_empty());
    /// ```
    pub fn new() -> Self {
        Self::with_clock(SystemClock)
    }

    /// A store on `clock`; tests pass a [`ManualClock`](crate::clock::ManualClock).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use std::{num::NonZeroU32, time::Duration};
    /// use tollgate::{clock::ManualClock, Key, MemoryStore, Policy, Quota, RateLimiter};
    ///
    /// let clock = ManualClock::new(1_000_000);
    /// let policy = Policy::fixed_window("core", Quota::per_minute(NonZeroU32::new(1).unwrap()));
    /// let limiter = RateLimiter::new(policy, MemoryStore::with_clock(clock.clone())).unwrap();
    /// assert!(limiter.check(&Key::new("ann"), 1).await.unwrap().allowed);
    /// assert!(!limiter.check(&Key::new("ann"), 1).await.unwrap().allowed);
    /// clock.advance(Duration::from_secs(60)); // no sleeping: the window is over
    /// assert!(limiter.check(&Key::new("ann"), 1).await.unwrap().allowed);
    /// # }
    /// ```
    pub fn with_clock(clock: impl Clock) -> Self {
        Self {
            inner: Arc::new(Inner {
                shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
                hasher: RandomState::default(),
                clock: Arc::new(clock),
                overrides: caller::Overrides::default(),
                policy_limits: RuntimeLimits::default(),
            }),
        }
    }

    /// Live entries, after dropping expired ones. For tests and metrics.
    ///
    /// ```
    /// assert_eq!(tollgate::MemoryStore::new().len(), 0);
    /// ```
    pub fn len(&self) -> usize {
        let now = self.inner.clock.now_micros();
        self.inner
            .shards
            .iter()
            .map(|s| {
                let mut shard = lock(s);
                shard.sweep(now);
                shard.len()
            })
            .sum()
    }

    /// Whether no entry is live.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Runs `f` on the shard that holds the keys of `key` under `policy`,
    /// with their names, at the clock's now.
    fn with_shard<T>(
        &self,
        policy: &Policy,
        key: &Key,
        f: impl FnOnce(&mut Shard, &KeyNames<'_>, u64) -> T,
    ) -> T {
        let names = KeyNames::new(&self.inner.hasher, policy, key);
        let mut shard = lock(&self.inner.shards[names.shard(SHARDS)]);
        let now = self.inner.clock.now_micros();
        shard.sweep_if_due(now);
        f(&mut shard, &names, now)
    }

    fn decide(&self, policy: &Policy, key: &Key, cost: u64) -> Decision {
        if policy.has_caller_rules() {
            return self.decide_with_caller_rules(policy, key, cost);
        }
        let algorithm = policy.strategy().algorithm();
        // Returned as the algorithm made it (scope included): amended here,
        // the decision would be copied once more.
        self.with_shard(policy, key, |shard, keys, now| {
            algorithm.decide(policy, shard, keys, now, cost)
        })
    }

    /// A decision through the caller's own rules (`store/memory/caller.rs`).
    fn decide_with_caller_rules(&self, policy: &Policy, key: &Key, cost: u64) -> Decision {
        let now = self.inner.clock.now_micros();
        let overridden = policy
            .is_overridable()
            .then(|| self.inner.overrides.get(policy, key, now))
            .flatten();
        self.with_shard(policy, key, |shard, keys, now| {
            caller::decide(policy, overridden.as_ref(), shard, keys, now, cost)
        })
    }

    /// Removes `key`'s own entries under `policy` (its penalty-box entry
    /// too; not its override, which is configuration), under the shard's
    /// lock.
    fn forget(&self, policy: &Policy, key: &Key) {
        self.with_shard(policy, key, |shard, keys, _| {
            for (i, name) in keys.iter().enumerate() {
                if policy.strategy().scope_of(i) == Scope::Consumer {
                    shard.remove(name);
                }
            }
            shard.remove(keys.penalty());
        });
    }

    fn give_back(&self, policy: &Policy, key: &Key, receipt: &Receipt) {
        if receipt.is_empty() {
            return;
        }
        let algorithm = policy.strategy().algorithm();
        self.with_shard(policy, key, |shard, keys, now| {
            algorithm.give_back(policy, shard, keys, now, receipt)
        })
    }
}

impl MemoryStore {
    fn settle_units(
        &self,
        policy: &Policy,
        key: &Key,
        receipt: &Receipt,
        actual: u64,
    ) -> Result<(), StoreError> {
        if let Some(refused) = policy.strategy().settle_refused() {
            return Err(refused);
        }
        // A rejection's receipt names nothing: it charged nothing.
        if actual == receipt.cost() || receipt.stamps().is_empty() {
            return Ok(());
        }
        let algorithm = policy.strategy().algorithm();
        self.with_shard(policy, key, |shard, keys, now| {
            algorithm.settle(policy, shard, keys, now, receipt, actual)
        });
        Ok(())
    }
}

fn lock(shard: &Mutex<Shard>) -> MutexGuard<'_, Shard> {
    // A panic while holding the lock cannot leave a half-written entry that
    // matters more than refusing service; keep going with the data as is.
    shard
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Store for MemoryStore {
    fn check<'a>(
        &'a self,
        policy: &'a Policy,
        key: &'a Key,
        cost: u64,
    ) -> BoxFuture<'a, Result<Decision, StoreError>> {
        Box::pin(std::future::ready(Ok(self.decide(policy, key, cost))))
    }

    fn peek<'a>(
        &'a self,
        policy: &'a Policy,
        key: &'a Key,
    ) -> BoxFuture<'a, Result<Decision, StoreError>> {
        Box::pin(std::future::ready(Ok(self.decide(policy, key, 0))))
    }

    fn peek_cost<'a>(
        &'a self,
        policy: &'a Policy,
        key: &'a Key,
        cost: u64,
    ) -> BoxFuture<'a, Result<Decision, StoreError>> {
        let now = self.inner.clock.now_micros();
        let overridden = policy
            .is_overridable()
            .then(|| self.inner.overrides.get(policy, key, now))
            .flatten();
        let decision = self.with_shard(policy, key, |shard, keys, now| {
            caller::dry_run(policy, overridden.as_ref(), shard, keys, now, cost)
        });
        Box::pin(std::future::ready(Ok(decision)))
    }

    fn reset<'a>(
        &'a self,
        policy: &'a Policy,
        key: &'a Key,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        self.forget(policy, key);
        Box::pin(std::future::ready(Ok(())))
    }

    fn refund<'a>(
        &'a self,
        policy: &'a Policy,
        key: &'a Key,
        receipt: &'a Receipt,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        self.give_back(policy, key, receipt);
        Box::pin(std::future::ready(Ok(())))
    }

    fn settle<'a>(
        &'a self,
        policy: &'a Policy,
        key: &'a Key,
        receipt: &'a Receipt,
        actual: u64,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(std::future::ready(
            self.settle_units(policy, key, receipt, actual),
        ))
    }

    fn settle_now(
        &self,
        policy: &Policy,
        key: &Key,
        receipt: &Receipt,
        actual: u64,
    ) -> Option<Result<(), StoreError>> {
        Some(self.settle_units(policy, key, receipt, actual))
    }

    fn set_override<'a>(
        &'a self,
        policy: &'a Policy,
        key: &'a Key,
        quotas: &'a Override,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(std::future::ready(
            self.inner.overrides.set(policy, key, quotas),
        ))
    }

    fn get_override<'a>(
        &'a self,
        policy: &'a Policy,
        key: &'a Key,
    ) -> BoxFuture<'a, Result<Option<Override>, StoreError>> {
        let now = self.inner.clock.now_micros();
        Box::pin(std::future::ready(Ok(self
            .inner
            .overrides
            .get(policy, key, now))))
    }

    fn clear_override<'a>(
        &'a self,
        policy: &'a Policy,
        key: &'a Key,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        let now = self.inner.clock.now_micros();
        Box::pin(std::future::ready(Ok(self
            .inner
            .overrides
            .clear(policy, key, now))))
    }

    fn list_overrides<'a>(
        &'a self,
        policy: &'a Policy,
    ) -> BoxFuture<'a, Result<Vec<(Key, Override)>, StoreError>> {
        let now = self.inner.clock.now_micros();
        Box::pin(std::future::ready(Ok(self
            .inner
            .overrides
            .list(policy, now))))
    }

    /// Applies at once: the next decision is judged by it.
    fn policy_in_force(&self, policy: &Policy) -> Option<Arc<Policy>> {
        if !policy.is_adjustable() {
            return None;
        }
        let clock = &self.inner.clock;
        self.inner
            .policy_limits
            .policy_in_force(policy, || clock.now_micros())
    }

    fn policy_limits_version(&self) -> u64 {
        self.inner.policy_limits.version()
    }

    fn policy_limits<'a>(
        &'a self,
        policy: &'a Policy,
    ) -> BoxFuture<'a, Result<PolicyLimits, StoreError>> {
        let now = self.inner.clock.now_micros();
        let limits = self.inner.policy_limits.get(policy).in_force(now);
        Box::pin(std::future::ready(Ok(limits)))
    }

    fn set_policy_limit<'a>(
        &'a self,
        policy: &'a Policy,
        which: PolicyLimit,
        value: Option<&'a Override>,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        self.inner.policy_limits.set(policy, which, value.cloned());
        Box::pin(std::future::ready(Ok(())))
    }

    fn block<'a>(
        &'a self,
        policy: &'a Policy,
        key: &'a Key,
        block: std::time::Duration,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        let result = match policy.penalty_box() {
            None => Err(StoreError::new(
                crate::error::StoreErrorKind::Rejected,
                format!("policy {:?} has no penalty box", policy.name()),
            )),
            Some(_) => {
                let micros = u64::try_from(block.as_micros()).unwrap_or(u64::MAX);
                self.with_shard(policy, key, |shard, keys, now| {
                    caller::block(policy, shard, keys, now, now.saturating_add(micros))
                });
                Ok(())
            }
        };
        Box::pin(std::future::ready(result))
    }

    fn unblock<'a>(
        &'a self,
        policy: &'a Policy,
        key: &'a Key,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        let had = self.with_shard(policy, key, |shard, keys, now| {
            let had = shard.get(keys.penalty(), now).is_some();
            shard.remove(keys.penalty());
            had
        });
        Box::pin(std::future::ready(Ok(had)))
    }

    fn in_process(&self) -> bool {
        true
    }

    fn check_now(
        &self,
        policy: &Policy,
        key: &Key,
        cost: u64,
    ) -> Option<Result<Decision, StoreError>> {
        Some(Ok(self.decide(policy, key, cost)))
    }

    fn refund_now(
        &self,
        policy: &Policy,
        key: &Key,
        receipt: &Receipt,
    ) -> Option<Result<(), StoreError>> {
        self.give_back(policy, key, receipt);
        Some(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;
    use crate::quota::Quota;
    use std::time::Duration;

    fn check(store: &MemoryStore, policy: &Policy, key: &str) -> Decision {
        store.decide(policy, &Key::new(key), 1)
    }

    #[test]
    fn expired_entries_are_swept_so_memory_follows_active_callers() {
        let clock = ManualClock::new(1_000_000_000);
        let store = MemoryStore::with_clock(clock.clone());
        let policy = Policy::fixed_window("core", Quota::new(5, Duration::from_secs(10)).unwrap());
        for i in 0..10_000 {
            check(&store, &policy, &format!("caller{i}"));
        }
        let held: usize = store.inner.shards.iter().map(|s| lock(s).len()).sum();
        assert_eq!(held, 10_000);

        // One second past the windows' end the entries are dead; the next use
        // of each shard drops them without anyone calling len(). (5,000 keys
        // miss one of the 64 shards with odds of about 1e-34.)
        clock.advance(Duration::from_secs(11));
        for i in 0..5_000 {
            check(&store, &policy, &format!("newcomer{i}"));
        }
        let held: usize = store.inner.shards.iter().map(|s| lock(s).len()).sum();
        assert_eq!(held, 5_000, "only the live callers are kept");
        assert_eq!(store.len(), 5_000);
    }

    #[test]
    fn an_expired_entry_reads_as_absent_before_it_is_swept() {
        let clock = ManualClock::new(1_000_000_000);
        let store = MemoryStore::with_clock(clock.clone());
        let policy = Policy::fixed_window("core", Quota::new(1, Duration::from_secs(10)).unwrap());
        assert!(check(&store, &policy, "bob").allowed);
        assert!(!check(&store, &policy, "bob").allowed);
        clock.advance(Duration::from_secs(10));
        assert!(
            check(&store, &policy, "bob").allowed,
            "a new window, swept or not"
        );
    }
}
