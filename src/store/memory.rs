//! The in-process store: the embedded default, no Redis needed.

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::{Arc, Mutex, MutexGuard};

use foldhash::fast::RandomState;

use super::keys::KeyNames;
use super::{BoxFuture, KeySpace, Store};
use crate::clock::{Clock, SystemClock};
use crate::decision::{Decision, Receipt, Scope};
use crate::error::StoreError;
use crate::key::Key;
use crate::quota::Policy;
use crate::strategy::concurrency::InFlight;
use crate::strategy::fixed_window::Window;
use crate::strategy::sliding_log::Log;
use crate::strategy::sliding_window::Counter;

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

/// One key's state: one variant per strategy, the memory store's one
/// registration of each; the strategy's file (`strategy/<name>.rs`) reads
/// and writes its own variant.
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
        let algorithm = policy.strategy().algorithm();
        let decision = self.with_shard(policy, key, |shard, keys, now| {
            algorithm.decide(policy, shard, keys, now, cost)
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
        let algorithm = policy.strategy().algorithm();
        self.with_shard(policy, key, |shard, keys, now| {
            algorithm.give_back(policy, shard, keys, now, receipt)
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

    /// Reads `key`'s live state (`None` when absent or expired) and writes
    /// the state and expiry (µs) `decide` returns beside its answer (`None`
    /// leaves the entry as it is). One hash and probe for a key already
    /// stored, where [`get`](Self::get) then [`put`](Self::put) take two: a
    /// hot key's decision.
    pub(crate) fn update<T>(
        &mut self,
        key: &str,
        now: u64,
        decide: impl FnOnce(Option<&State>) -> (T, Option<(State, u64)>),
    ) -> T {
        if let Some(entry) = self.entries.get_mut(key) {
            let live = (entry.expires_at > now).then_some(&entry.state);
            let (answer, write) = decide(live);
            if let Some((state, expires_at)) = write {
                *entry = Entry { expires_at, state };
            }
            return answer;
        }
        let (answer, write) = decide(None);
        if let Some((state, expires_at)) = write {
            self.entries
                .insert(key.to_owned(), Entry { expires_at, state });
        }
        answer
    }

    /// The live state under `key`, with its expiry (µs), to change in
    /// place: a strategy may move its state out and leave an empty one, so
    /// the key's name is not given up and allocated again.
    pub(crate) fn get_mut_with_expiry(&mut self, key: &str, now: u64) -> Option<(&mut State, u64)> {
        self.entries
            .get_mut(key)
            .filter(|e| e.expires_at > now)
            .map(|e| (&mut e.state, e.expires_at))
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
pub(crate) fn with_slots<T: Copy, R>(n: usize, f: impl FnOnce(&mut [Option<T>]) -> R) -> R {
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
