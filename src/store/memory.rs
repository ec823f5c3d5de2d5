//! The in-process store: the embedded default, no Redis needed.

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::{Arc, Mutex, MutexGuard};

use foldhash::fast::RandomState;
use smallvec::SmallVec;

use super::keys::KeyNames;
use super::{BoxFuture, KeySpace, Store};
use crate::clock::{Clock, SystemClock};
use crate::decision::{Decision, Receipt, Scope};
use crate::error::StoreError;
use crate::key::Key;
use crate::quota::Policy;
use crate::strategy::concurrency::{self, InFlight};
use crate::strategy::fixed_window::{self, Window, EXPIRY_GRACE_MICROS};
use crate::strategy::sliding_log::{self, Log};
use crate::strategy::sliding_window::{self, Counter};
use crate::strategy::{gcra, leaky_bucket, uniform_gate, Strategy};

const SHARDS: usize = 64;
/// How often a shard drops expired entries, in µs of its clock.
const SWEEP_EVERY_MICROS: u64 = 1_000_000;

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
/// randomly seeded per process and per map: foldhash is "minimally
/// DoS-resistant", and colliding keys would have to be found without
/// seeing the seed, through a rate limiter.
#[derive(Debug)]
struct Inner {
    shards: Box<[Mutex<Shard>]>,
    hasher: RandomState,
    clock: Arc<dyn Clock>,
    keys: KeySpace,
}

#[derive(Debug, Default)]
pub(crate) struct Shard {
    entries: HashMap<String, Entry, RandomState>,
    next_sweep: u64,
    /// The names of the current decision's keys, kept to reuse the buffer.
    names: KeyNames,
}

#[derive(Debug)]
struct Entry {
    expires_at: u64,
    state: State,
}

/// One key's state, per strategy.
#[derive(Debug, Clone)]
pub(crate) enum State {
    Window(Window),
    /// A uniform gate: when it opens again, µs.
    Gate(u64),
    /// A sliding log (resource or consumer).
    Log(Log),
    /// A sliding-window counter.
    Counter(Counter),
    /// A GCRA bucket's theoretical arrival time, µs.
    Tat(u64),
    /// A leaky bucket's `next_free`, µs.
    Leaky(u64),
    InFlight(InFlight),
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
                keys: KeySpace::default(),
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
                shard.entries.len()
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
        f: impl FnOnce(&mut Shard, &KeyNames, u64) -> T,
    ) -> T {
        // The hash of what the keys' hash tag names: one shard per tag, as
        // one Redis Cluster slot, without building the tag.
        let index = self.inner.hasher.hash_one(KeySpace::tagged(policy, key)) as usize % SHARDS;
        let mut shard = lock(&self.inner.shards[index]);
        let now = self.inner.clock.now_micros();
        if now >= shard.next_sweep {
            shard.sweep(now);
        }
        let mut names = std::mem::take(&mut shard.names);
        self.inner.keys.name_quota_keys(policy, key, &mut names);
        let result = f(&mut shard, &names, now);
        shard.names = names;
        result
    }

    fn decide(&self, policy: &Policy, key: &Key, cost: u64) -> Decision {
        let decision = self.with_shard(policy, key, |shard, keys, now| match policy.strategy() {
            Strategy::FixedWindow => with_slots(policy.quotas().len(), |windows| {
                for (slot, k) in windows.iter_mut().zip(keys.iter()) {
                    if let Some(State::Window(w)) = shard.get(k, now) {
                        *slot = Some(*w);
                    }
                }
                let decision = fixed_window::check(windows, policy.quotas(), now, cost);
                if decision.allowed && cost > 0 {
                    for (k, w) in keys.iter().zip(windows.iter()) {
                        if let Some(w) = *w {
                            shard.put(k, State::Window(w), w.reset_at + EXPIRY_GRACE_MICROS);
                        }
                    }
                }
                decision
            }),
            Strategy::UniformGate => {
                let quota = &policy.quotas()[0];
                let mut gate = match shard.get(keys.first(), now) {
                    Some(State::Gate(at)) => Some(*at),
                    _ => None,
                };
                let decision = uniform_gate::check(&mut gate, quota, now, cost);
                if let (true, Some(at)) = (decision.allowed && cost > 0, gate) {
                    shard.put(keys.first(), State::Gate(at), at + EXPIRY_GRACE_MICROS);
                }
                decision
            }
            Strategy::SlidingLog => {
                // Logs can be long: move them out of their entries, not
                // copies, and back in place (a rejection allocates nothing).
                let mut logs = SmallVec::<[Log; 2]>::new();
                let mut expiries = SmallVec::<[Option<u64>; 2]>::new();
                for k in keys.iter() {
                    let (log, expires_at) = shard.take_log(k, now).unzip();
                    logs.push(log.unwrap_or_default());
                    expiries.push(expires_at);
                }
                let id = sliding_log::request_id();
                let decision = sliding_log::check(&mut logs, policy.quotas(), now, cost, id);
                let charged = decision.allowed && cost > 0;
                for ((k, log), (q, expires_at)) in keys
                    .iter()
                    .zip(logs)
                    .zip(policy.quotas().iter().zip(expiries))
                {
                    let expires_at = match (charged, log.newest()) {
                        (true, Some(newest)) => {
                            Some(newest + q.window_micros() + EXPIRY_GRACE_MICROS)
                        }
                        _ => expires_at,
                    };
                    match expires_at.filter(|_| !log.is_empty()) {
                        Some(expires_at) => shard.put(k, State::Log(log), expires_at),
                        None => shard.remove(k),
                    }
                }
                decision
            }
            Strategy::SlidingWindow => with_slots(policy.quotas().len(), |counters| {
                for (slot, k) in counters.iter_mut().zip(keys.iter()) {
                    if let Some(State::Counter(c)) = shard.get(k, now) {
                        *slot = Some(*c);
                    }
                }
                let decision = sliding_window::check(counters, policy.quotas(), now, cost);
                if decision.allowed && cost > 0 {
                    let counters = counters.iter().copied();
                    for ((k, c), q) in keys.iter().zip(counters).zip(policy.quotas()) {
                        if let Some(c) = c {
                            let expires_at = c.stale_at(q.window_micros()) + EXPIRY_GRACE_MICROS;
                            shard.put(k, State::Counter(c), expires_at);
                        }
                    }
                }
                decision
            }),
            Strategy::Gcra { burst } => {
                let mut tat = match shard.get(keys.first(), now) {
                    Some(State::Tat(at)) => Some(*at),
                    _ => None,
                };
                let decision = gcra::check(&mut tat, &policy.quotas()[0], burst.get(), now, cost);
                if let (true, Some(at)) = (decision.allowed && cost > 0, tat) {
                    shard.put(keys.first(), State::Tat(at), at + EXPIRY_GRACE_MICROS);
                }
                decision
            }
            Strategy::LeakyBucket { capacity } => {
                let interval = leaky_bucket::interval_micros(&policy.quotas()[0]);
                let mut next_free = match shard.get(keys.first(), now) {
                    Some(State::Leaky(t)) => Some(*t),
                    _ => None,
                };
                let capacity = u64::from(capacity.get());
                let d = leaky_bucket::check(&mut next_free, capacity, interval, now, cost);
                if let (true, Some(t)) = (d.allowed && cost > 0, next_free) {
                    let expires = t + leaky_bucket::EXPIRY_GRACE_MICROS;
                    shard.put(keys.first(), State::Leaky(t), expires);
                }
                d
            }
            Strategy::Concurrency => {
                let quota = policy.quotas()[0];
                let (limit, timeout) = (u64::from(quota.limit()), quota.window_micros());
                let mut set = match shard.get(keys.first(), now) {
                    Some(State::InFlight(set)) => set.clone(),
                    _ => InFlight::default(),
                };
                let id = concurrency::new_id();
                let d = concurrency::check(&mut set, limit, timeout, now, cost, id);
                if d.allowed && cost > 0 {
                    let expires = now + concurrency::expiry_micros(timeout);
                    shard.put(keys.first(), State::InFlight(set), expires);
                }
                d
            }
        });
        let scope = policy.strategy().scope_of(decision.quota);
        decision.scoped(scope)
    }

    /// Removes `key`'s own entries under `policy`, under the shard's lock.
    fn forget(&self, policy: &Policy, key: &Key) {
        self.with_shard(policy, key, |shard, keys, _| {
            for (i, name) in keys.iter().enumerate() {
                if policy.strategy().scope_of(i) == Scope::Consumer {
                    shard.remove(name);
                }
            }
        });
    }

    fn give_back(&self, policy: &Policy, key: &Key, receipt: &Receipt) {
        if receipt.is_empty() {
            return;
        }
        self.with_shard(policy, key, |shard, keys, now| match policy.strategy() {
            Strategy::FixedWindow => {
                for (k, stamp) in keys.iter().zip(receipt.stamps()) {
                    if let Some(State::Window(w)) = shard.get_mut(k, now) {
                        let mut slot = [Some(*w)];
                        fixed_window::refund(&mut slot, &[*stamp], receipt.cost());
                        if let Some(refunded) = slot[0] {
                            *w = refunded;
                        }
                    }
                }
            }
            Strategy::UniformGate => {
                let stamp = receipt.stamps().first();
                if let (Some(State::Gate(at)), Some(&stamp)) = (shard.get(keys.first(), now), stamp)
                {
                    let mut gate = Some(*at);
                    uniform_gate::refund(&mut gate, stamp);
                    if gate.is_none() {
                        shard.remove(keys.first());
                    }
                }
            }
            Strategy::SlidingLog => {
                for k in keys.iter() {
                    if let Some(State::Log(log)) = shard.get_mut(k, now) {
                        sliding_log::refund(
                            std::slice::from_mut(log),
                            receipt.stamps(),
                            receipt.cost(),
                        );
                    }
                }
            }
            Strategy::SlidingWindow => {
                for ((k, q), stamp) in keys.iter().zip(policy.quotas()).zip(receipt.stamps()) {
                    if let Some(State::Counter(c)) = shard.get_mut(k, now) {
                        let mut slot = [Some(*c)];
                        sliding_window::refund(&mut slot, &[*q], &[*stamp], receipt.cost());
                        *c = slot[0].unwrap_or(*c);
                    }
                }
            }
            Strategy::Gcra { .. } => {
                let stamp = receipt.stamps().first();
                if let (Some(State::Tat(at)), Some(&stamp)) =
                    (shard.get_mut(keys.first(), now), stamp)
                {
                    let mut tat = Some(*at);
                    gcra::refund(&mut tat, &policy.quotas()[0], now, stamp, receipt.cost());
                    *at = tat.unwrap_or(*at);
                }
            }
            Strategy::LeakyBucket { .. } => {
                let interval = leaky_bucket::interval_micros(&policy.quotas()[0]);
                if let Some(State::Leaky(t)) = shard.get_mut(keys.first(), now) {
                    let mut next_free = Some(*t);
                    let stamp = receipt.stamps().first().copied().unwrap_or(0);
                    leaky_bucket::refund(&mut next_free, stamp, receipt.cost(), interval, now);
                    *t = next_free.unwrap_or(*t);
                }
            }
            Strategy::Concurrency => {
                if let Some(State::InFlight(set)) = shard.get_mut(keys.first(), now) {
                    let id = receipt.stamps().first().copied().unwrap_or(0);
                    concurrency::release(set, id);
                }
            }
        })
    }
}

impl Shard {
    /// The live state under `key`; an expired entry reads as absent, as in Redis.
    pub(crate) fn get(&self, key: &str, now: u64) -> Option<&State> {
        self.entries
            .get(key)
            .filter(|e| e.expires_at > now)
            .map(|e| &e.state)
    }

    pub(crate) fn get_mut(&mut self, key: &str, now: u64) -> Option<&mut State> {
        self.entries
            .get_mut(key)
            .filter(|e| e.expires_at > now)
            .map(|e| &mut e.state)
    }

    /// Stores `state` under `key` until `expires_at` (µs).
    pub(crate) fn put(&mut self, key: &str, state: State, expires_at: u64) {
        match self.entries.get_mut(key) {
            Some(entry) => *entry = Entry { expires_at, state },
            None => {
                self.entries
                    .insert(key.to_owned(), Entry { expires_at, state });
            }
        }
    }

    /// The live log under `key`, with its expiry (µs), moved out: an empty
    /// log stays in its place until [`put`](Self::put) or
    /// [`remove`](Self::remove), so the key's name is not given up and
    /// allocated again.
    pub(crate) fn take_log(&mut self, key: &str, now: u64) -> Option<(Log, u64)> {
        match self.entries.get_mut(key) {
            Some(Entry {
                expires_at,
                state: State::Log(log),
            }) if *expires_at > now => Some((std::mem::take(log), *expires_at)),
            _ => None,
        }
    }

    pub(crate) fn remove(&mut self, key: &str) {
        self.entries.remove(key);
    }

    fn sweep(&mut self, now: u64) {
        self.entries.retain(|_, e| e.expires_at > now);
        self.next_sweep = now + SWEEP_EVERY_MICROS;
    }
}

/// Runs `f` on `n` empty slots, one per quota: on the stack for every
/// policy a layer accepts (at most 8 quotas), on the heap beyond.
fn with_slots<T: Copy, R>(n: usize, f: impl FnOnce(&mut [Option<T>]) -> R) -> R {
    let mut stack = [None; 8];
    match stack.get_mut(..n) {
        Some(slots) => f(slots),
        None => f(&mut vec![None; n]),
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
        let held: usize = store
            .inner
            .shards
            .iter()
            .map(|s| lock(s).entries.len())
            .sum();
        assert_eq!(held, 10_000);

        // One second past the windows' end the entries are dead; the next use
        // of each shard drops them without anyone calling len(). (5,000 keys
        // miss one of the 64 shards with odds of about 1e-34.)
        clock.advance(Duration::from_secs(11));
        for i in 0..5_000 {
            check(&store, &policy, &format!("newcomer{i}"));
        }
        let held: usize = store
            .inner
            .shards
            .iter()
            .map(|s| lock(s).entries.len())
            .sum();
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
