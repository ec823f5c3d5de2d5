//! Rejections remembered in this process, so an exhausted caller costs no
//! Redis call until its quota frees up (as Envoy's and Upstash's local
//! caches do).

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::clock::Clock;
use crate::decision::Decision;
use crate::key::Key;
use crate::policy::Policy;

const SHARDS: usize = 16;
/// The longest a rejection of an overridable policy is kept: an override
/// set on another app server lets the caller through here within it (the
/// bug of Envoy ratelimit #1077, a cache keeping a caller out after its
/// limit was raised, bounded).
const OVERRIDABLE_MICROS: u64 = 1_000_000;
/// A full shard looks for expired entries at most this often (store time).
const SWEEP_EVERY_MICROS: u64 = 100_000;

/// Options of the local decision cache; see
/// [`RateLimitLayerBuilder::local_cache`](crate::RateLimitLayerBuilder::local_cache).
///
/// Once the store has rejected a key, or has let through the request that
/// spent its last unit, the layer rejects that key's later requests itself
/// until the quota frees up: no store call, the same status, headers and
/// body the store's rejection would have produced, with `Retry-After`
/// counted down from the store's own time (the decision's `now` plus time
/// elapsed here, measured with [`Instant`], so app-server clock skew does not
/// matter).
///
/// **Which strategies.** A strategy is cached only where the store's answer
/// cannot change before the time it gave:
///
/// | strategy | cached rejection | cached "last unit spent" |
/// |---|---|---|
/// | fixed window | until the window's reset | until the window's reset |
/// | leaky bucket | until `Retry-After` (the level only drains at the rate) | no: a place frees one interval later |
/// | concurrency | no: a finishing request frees a slot at any time | no |
/// | uniform gate | until it reopens (`Retry-After`) | until it reopens (`Reset`) |
/// | sliding log, sliding window, GCRA | until `Retry-After` (entries leave, the previous window decays, the bucket refills only with time) | no: one unit frees before `Reset` |
///
/// A cached rejection keeps the store's `X-RateLimit-Used`, which for the
/// sliding window and GCRA would have drifted down meanwhile. A sliding log's
/// rejection is cached per caller, but its resource limit is shared: other
/// callers filling it meanwhile keep this caller out longer than the cached
/// `Retry-After` says (the store then rejects again, with the later time),
/// and another caller's refund of the shared resource is not seen (see
/// refunds below).
///
/// Each strategy says so through `Strategy::rejection_is_stable` and
/// `Strategy::exhaustion_is_stable`, which a new strategy must answer (they
/// are required methods of its `Algorithm`).
/// A cached rejection applies to requests costing at least what the rejected
/// one cost; cheaper ones still ask the store.
///
/// **Sharp edge: refunds.** A refund (a `304`) made on this server removes the
/// key's entry. One made by another app server, or one that lands after a
/// rejection was cached here, is not seen: that caller may be refused up to
/// the refunded units until the window resets. Leave the cache off where
/// refunds are common and exact accounting matters more than Redis load.
///
/// **Memory** is bounded by `capacity` entries (a key and a decision, about
/// 150 bytes each plus the key). A full cache first drops expired entries;
/// if all are live, new rejections are simply not cached.
///
/// ```
/// use std::num::NonZeroU32;
/// use tollgate::{Policy, Quota, RateLimitLayer};
/// use tollgate::layer::LocalCache;
///
/// let layer = RateLimitLayer::builder()
///     .policy(Policy::fixed_window("core", Quota::per_hour(NonZeroU32::new(5000).unwrap())))
///     .local_cache(LocalCache::new(100_000))
///     .build()
///     .unwrap();
/// ```
#[derive(Debug, Clone)]
pub struct LocalCache {
    capacity: usize,
    clock: Option<Arc<dyn Clock>>,
}

impl Default for LocalCache {
    /// 10,000 entries.
    fn default() -> Self {
        Self::new(10_000)
    }
}

impl LocalCache {
    /// A cache holding at most `capacity` keys.
    ///
    /// ```
    /// use tollgate::layer::LocalCache;
    /// let cache = LocalCache::new(50_000); // 0 would turn the cache off
    /// # let _ = cache;
    /// ```
    pub fn new(capacity: usize) -> Self {
        Self {
            capacity,
            clock: None,
        }
    }

    /// Counts time with this clock (the store's, in tests) instead of the
    /// decision's time plus [`Instant`] elapsed.
    ///
    /// ```
    /// use tollgate::clock::ManualClock;
    /// use tollgate::layer::LocalCache;
    /// let clock = ManualClock::new(0);
    /// let _cache = LocalCache::new(1000).clock(clock.clone());
    /// ```
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Some(Arc::new(clock));
        self
    }

    pub(crate) fn capacity(&self) -> usize {
        self.capacity
    }
}

/// The cache itself, owned by the limiter.
#[derive(Debug)]
pub(crate) struct DecisionCache {
    shards: Box<[Mutex<Shard>]>,
    per_shard: usize,
    hasher: RandomState,
    clock: Option<Arc<dyn Clock>>,
    hits: AtomicU64,
    /// The store's runtime limits' version the entries were learnt under.
    limits_version: AtomicU64,
}

#[derive(Debug, Default)]
struct Shard {
    entries: HashMap<Key, Entry>,
    next_sweep: u64,
}

#[derive(Debug)]
struct Entry {
    /// The rejection, as the store would give it (its `now` is when it was
    /// learnt, store time).
    rejection: Decision,
    /// Store time until which it holds, µs since the epoch.
    until: u64,
    /// Requests costing less may fit: they ask the store.
    min_cost: u64,
    /// When it was learnt, on this machine's monotonic clock.
    learnt: Instant,
}

impl DecisionCache {
    pub(crate) fn new(options: LocalCache) -> Self {
        Self {
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
            per_shard: options.capacity.div_ceil(SHARDS),
            hasher: RandomState::new(),
            clock: options.clock,
            hits: AtomicU64::new(0),
            limits_version: AtomicU64::new(0),
        }
    }

    /// Forgets every entry when the store's runtime limits changed since
    /// they were learnt (`version`, see
    /// [`Store::policy_limits_version`](crate::Store::policy_limits_version)):
    /// a rejection learnt under other limits may no longer hold.
    pub(crate) fn limits_are(&self, version: u64) {
        if self.limits_version.load(Relaxed) == version {
            return;
        }
        self.limits_version.store(version, Relaxed);
        for shard in self.shards.iter() {
            shard
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .entries
                .clear();
        }
    }

    /// The rejection for `cost` units of `key`, if one is known to hold now.
    pub(crate) fn rejection(&self, key: &Key, cost: u64) -> Option<Decision> {
        let mut shard = self.shard(key);
        let entry = shard.entries.get(key)?;
        let now = self.now(entry);
        if now >= entry.until {
            shard.entries.remove(key);
            return None;
        }
        if cost < entry.min_cost {
            return None;
        }
        // The store's rejection as it stands now: only the clock moved.
        let mut decision = entry.rejection.clone();
        decision.now_micros = now;
        decision.retry_after = Some(Duration::from_micros(entry.until - now));
        drop(shard);
        self.hits.fetch_add(1, Relaxed);
        Some(decision)
    }

    /// Learns from a store's decision for `cost` units of `key`.
    pub(crate) fn learn(&self, policy: &Policy, key: &Key, cost: u64, decision: &Decision) {
        let strategy = policy.strategy();
        let now = decision.now_micros;
        let (rejection, until, min_cost) = if decision.blocked {
            // A block holds until a request would pass (its reset),
            // whatever the strategy.
            (decision.clone(), decision.reset_at_micros, 1)
        } else if policy.penalty_box().is_some() {
            // Rejections count as strikes where they are decided.
            return;
        } else if !decision.allowed {
            if !strategy.rejection_is_stable() {
                return;
            }
            let Some(after) = decision.retry_after else {
                return;
            };
            let until = now.saturating_add(after.as_micros() as u64);
            (decision.clone(), until, cost.max(1))
        } else if decision.remaining == 0 && strategy.exhaustion_is_stable() {
            let until = decision.reset_at_micros;
            let rejection = Decision::rejected(
                decision.limit,
                decision.used,
                until,
                now,
                until.saturating_sub(now),
            )
            .reporting(decision.quota);
            (rejection, until, 1)
        } else {
            return;
        };
        let until = match policy.is_overridable() && !decision.blocked {
            true => until.min(now.saturating_add(OVERRIDABLE_MICROS)),
            false => until,
        };
        if until <= now {
            return;
        }
        let entry = Entry {
            rejection,
            until,
            min_cost,
            learnt: Instant::now(),
        };
        let mut shard = self.shard(key);
        if shard.entries.len() >= self.per_shard && !shard.entries.contains_key(key) {
            if now >= shard.next_sweep {
                shard.next_sweep = now + SWEEP_EVERY_MICROS;
                shard.entries.retain(|_, e| self.now(e) < e.until);
            }
            if shard.entries.len() >= self.per_shard {
                return;
            }
        }
        shard.entries.insert(key.clone(), entry);
    }

    /// Drops what is known of `key` (a refund gave units back).
    pub(crate) fn forget(&self, key: &Key) {
        self.shard(key).entries.remove(key);
    }

    /// Requests answered from the cache so far.
    pub(crate) fn hits(&self) -> u64 {
        self.hits.load(Relaxed)
    }

    /// Entries held, live or not yet swept.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.shards.iter().map(|s| lock(s).entries.len()).sum()
    }

    /// Store time now, as seen from `entry`.
    fn now(&self, entry: &Entry) -> u64 {
        match &self.clock {
            Some(clock) => clock.now_micros(),
            None => {
                let elapsed = entry.learnt.elapsed().min(Duration::from_secs(1 << 32));
                entry
                    .rejection
                    .now_micros
                    .saturating_add(elapsed.as_micros() as u64)
            }
        }
    }

    fn shard(&self, key: &Key) -> MutexGuard<'_, Shard> {
        let i = self.hasher.hash_one(key) as usize % self.shards.len();
        lock(&self.shards[i])
    }
}

fn lock(m: &Mutex<Shard>) -> MutexGuard<'_, Shard> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::Strategy;
    use crate::quota::Quota;

    /// A policy of `strategy`, its quota beside the point here.
    fn of(strategy: Strategy) -> Policy {
        Policy::new(
            "p",
            strategy,
            Quota::new(1, Duration::from_secs(1)).unwrap(),
        )
    }
    use crate::clock::ManualClock;

    const S: u64 = 1_000_000;

    fn cache(capacity: usize, clock: &ManualClock) -> DecisionCache {
        DecisionCache::new(LocalCache::new(capacity).clock(clock.clone()))
    }

    #[test]
    fn a_rejection_holds_until_reset_with_retry_after_counting_down() {
        let clock = ManualClock::new(10 * S);
        let c = cache(100, &clock);
        let bob = Key::new("bob");
        let store_said = Decision::rejected(5, 5, 70 * S, 10 * S, 60 * S);
        c.learn(&of(Strategy::FixedWindow), &bob, 1, &store_said);
        assert_eq!(
            c.rejection(&bob, 1).unwrap(),
            store_said,
            "identical at once"
        );

        clock.advance(Duration::from_millis(30_500));
        let later = c.rejection(&bob, 1).unwrap();
        assert_eq!(later.reset_at_micros, 70 * S);
        assert_eq!(later.retry_after_secs(), Some(30));
        clock.set(70 * S);
        assert!(c.rejection(&bob, 1).is_none(), "freed at reset");
        assert_eq!(c.len(), 0);
    }

    #[test]
    fn spending_the_last_unit_is_cached_as_the_rejection_the_store_would_give() {
        let clock = ManualClock::new(10 * S);
        let c = cache(100, &clock);
        let ann = Key::new("ann");
        c.learn(
            &of(Strategy::FixedWindow),
            &ann,
            1,
            &Decision::allowed(5, 4, 70 * S, 10 * S),
        );
        assert!(c.rejection(&ann, 1).is_none(), "one unit left");
        c.learn(
            &of(Strategy::FixedWindow),
            &ann,
            1,
            &Decision::allowed(5, 5, 70 * S, 10 * S),
        );
        let cached = c.rejection(&ann, 1).unwrap();
        assert_eq!(cached, Decision::rejected(5, 5, 70 * S, 10 * S, 60 * S));
        c.forget(&ann);
        assert!(c.rejection(&ann, 1).is_none(), "a refund frees it");
    }

    #[test]
    fn only_strategies_whose_answers_hold_are_cached() {
        let clock = ManualClock::new(0);
        let c = cache(100, &clock);
        let capacity = std::num::NonZeroU32::new(5).unwrap();
        let bucket = Strategy::LeakyBucket { capacity };
        let rejected = Decision::rejected(5, 5, 10 * S, 0, S);
        let full = Decision::allowed(5, 5, 10 * S, 0);
        let (a, b, d, e) = (Key::new("a"), Key::new("b"), Key::new("d"), Key::new("e"));
        c.learn(&of(bucket.clone()), &a, 1, &rejected);
        assert!(
            c.rejection(&a, 1).is_some(),
            "a bucket drains only at its rate"
        );
        c.learn(&of(bucket.clone()), &b, 1, &full);
        assert!(
            c.rejection(&b, 1).is_none(),
            "a place frees long before reset"
        );
        c.learn(&of(Strategy::Concurrency), &d, 1, &rejected);
        assert!(
            c.rejection(&d, 1).is_none(),
            "a slot frees when any response ends"
        );
        c.learn(&of(Strategy::Concurrency), &e, 1, &full);
        assert!(c.rejection(&e, 1).is_none());
    }

    #[test]
    fn cheaper_requests_still_ask_the_store() {
        let clock = ManualClock::new(0);
        let c = cache(100, &clock);
        let k = Key::new("k");
        c.learn(
            &of(Strategy::FixedWindow),
            &k,
            10,
            &Decision::rejected(20, 15, 60 * S, 0, 60 * S),
        );
        assert!(c.rejection(&k, 10).is_some());
        assert!(c.rejection(&k, 5).is_none());
    }

    #[test]
    fn memory_is_bounded_and_expired_entries_go_first() {
        let clock = ManualClock::new(0);
        let c = cache(SHARDS, &clock); // one entry per shard
        for i in 0..1000 {
            let d = Decision::rejected(1, 1, S, 0, S);
            c.learn(
                &of(Strategy::FixedWindow),
                &Key::new(format!("k{i}")),
                1,
                &d,
            );
        }
        assert!(c.len() <= SHARDS);
        clock.set(2 * S);
        let fresh = Key::new("fresh");
        c.learn(
            &of(Strategy::FixedWindow),
            &fresh,
            1,
            &Decision::rejected(1, 1, 9 * S, 2 * S, 7 * S),
        );
        assert!(
            c.rejection(&fresh, 1).is_some(),
            "expired entries made room"
        );
        assert!(c.len() <= SHARDS);
    }

    #[test]
    fn without_a_clock_time_is_the_stores_plus_local_elapsed() {
        let c = DecisionCache::new(LocalCache::new(10));
        let k = Key::new("k");
        // The store's clock is far from this machine's: it does not matter.
        c.learn(
            &of(Strategy::FixedWindow),
            &k,
            1,
            &Decision::rejected(1, 1, 5 * S, 2 * S, 3 * S),
        );
        let d = c.rejection(&k, 1).unwrap();
        assert!(d.now_micros >= 2 * S && d.now_micros < 3 * S);
        assert_eq!(d.retry_after_secs(), Some(3));
    }
}
