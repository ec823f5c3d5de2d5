//! The Redis store: one script call, one round trip, per decision.

pub(crate) mod args;
mod batch;
mod batchers;
mod builder;
mod caller;
#[cfg(feature = "cluster")]
mod cluster;
pub(crate) mod connection;
mod decide;
mod give_back;
mod lease;
mod policy_limits;
pub(crate) mod reply;
pub(crate) mod script;
#[cfg(feature = "sentinel")]
mod sentinel;
pub(crate) mod server;
mod shards;

pub use self::builder::RedisStoreBuilder;
#[cfg(feature = "cluster")]
pub use self::cluster::ClusterConfig;
pub use self::lease::Leases;
#[cfg(feature = "sentinel")]
pub use self::sentinel::SentinelConfig;
pub use self::shards::{Shard, ShardedConfig};

use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use self::args::{int, GiveBack, ScriptNow};
use self::batchers::Batchers;
use self::connection::Connection;
use self::lease::LeaseTable;
use self::script::{LuaScript, SCRIPTS};
use self::server::Scripting;
use super::{BoxFuture, KeySpace, Store};
use crate::clock::Clock;
use crate::decision::{Decision, Receipt};
use crate::error::StoreError;
use crate::key::Key;
use crate::overrides::Override;
use crate::policy::Policy;
use crate::policy_limits::{PolicyLimit, PolicyLimits};
use crate::store::policy_limits::RuntimeLimits;

/// Keeps limits in Redis, shared by every app server that uses the same Redis.
///
/// Each decision is one `EVALSHA` of an atomic Lua script from `lua/`; after
/// `NOSCRIPT` (a flushed or restarted Redis) the script is loaded and the call
/// repeated, once. Every key written gets an expiry.
///
/// **Time.** By default the scripts read Redis `TIME`, so all app servers
/// share Redis's clock and their own clocks may drift freely. With
/// [`RedisStoreBuilder::clock`] the store sends its own time instead; tests
/// use that with a [`ManualClock`](crate::clock::ManualClock). A window's end is
/// written once, by the request that opens it, and read back by everyone.
///
/// **Leases** (off by default; [`RedisStoreBuilder::leases`]): a caller this
/// server decides often is decided in memory from a slice of its budget that
/// one script call charged in Redis first; what is unspent goes back when
/// the slice ends. No number of servers admits more than the limit; see
/// [`Leases`] and `docs/leases.md`.
///
/// Runs on Redis 6.2 and later, and on Valkey. Before Redis 7.0 (no script
/// flags, no `EVALSHA_RO`) peeks and pre-checks run on the primary with
/// `EVALSHA`; every `connect` reads the server's version and refuses one
/// older than 6.2 (see [`RedisStoreBuilder::check_server`]).
///
/// ```no_run
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// use tollgate::RedisStore;
///
/// // A self-healing connection (ConnectionManager), prefix "tollgate":
/// let store = RedisStore::connect("redis://127.0.0.1:6379/").await?;
///
/// // Or over an existing deadpool-redis pool, with a prefix of your own:
/// let pool = deadpool_redis::Config::from_url("redis://127.0.0.1:6379/")
///     .create_pool(Some(deadpool_redis::Runtime::Tokio1))?;
/// let store = RedisStore::from_pool(pool).prefix("myapp:rl").build()?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct RedisStore {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    conn: Connection,
    keys: KeySpace,
    clock: Option<Arc<dyn Clock>>,
    pre_check: bool,
    /// Whether peeks and pre-checks may use `EVALSHA_RO` (Redis 7.0 on).
    scripting: Arc<Scripting>,
    /// Sends concurrent charging calls together: one per server (a shard's
    /// primary) or, on a cluster, per set of keys; none when batching is off.
    batchers: Batchers,
    /// Redis time minus this machine's monotonic time, learnt from replies:
    /// how a request's deadline is told to the scripts.
    offset: ClockOffset,
    /// Hot callers' leases, when the store leases (`lease.rs`).
    leases: Option<LeaseTable>,
    /// This server's copy of every policy's runtime limits
    /// (`policy_limits.rs`), and whether the task that reads them runs.
    policy_limits: RuntimeLimits,
    watching_limits: AtomicBool,
}

/// The offset between Redis's clock and this machine's monotonic one, µs,
/// from the `now` each reply carries: Redis time when the script ran, less
/// the local time its reply arrived. A reply's travel makes each sample
/// early by its latency, so the largest is kept; one a second or more below
/// it means Redis's clock jumped back (a failover to another machine) and
/// replaces it.
#[derive(Debug)]
struct ClockOffset(AtomicI64);

impl ClockOffset {
    const UNKNOWN: i64 = i64::MIN;

    fn observe(&self, redis_now: i64) {
        let sample = redis_now.saturating_sub(local_micros(Instant::now()));
        let known = self.0.load(Ordering::Relaxed);
        if sample > known || sample < known.saturating_sub(1_000_000) {
            self.0.store(sample, Ordering::Relaxed);
        }
    }

    /// `deadline` in Redis time, µs; 0 (none) before the first reply.
    fn redis_time(&self, deadline: Instant) -> i64 {
        match self.0.load(Ordering::Relaxed) {
            Self::UNKNOWN => 0,
            offset => local_micros(deadline).saturating_add(offset).max(1),
        }
    }
}

/// `at` in µs on this process's monotonic clock.
fn local_micros(at: Instant) -> i64 {
    int(at
        .saturating_duration_since(*crate::clock::EPOCH)
        .as_micros())
}

/// Every script, each once, in a fixed order: each strategy's decision,
/// its no-writes twin and its refund or release, in the order of
/// [`ALL`](crate::strategy::ALL), then `reset`; the no-writes twins
/// unflagged, for Redis 6.2; the batches; the high-volume mode's sync.
fn every_script() -> Vec<&'static LuaScript> {
    let mut all = Vec::new();
    for algorithm in crate::strategy::ALL {
        let trio = algorithm.lua();
        all.extend([
            &trio.check,
            &trio.peek,
            &trio.refund,
            &trio.caller_check,
            &trio.caller_peek,
        ]);
    }
    all.extend([&SCRIPTS.reset, &SCRIPTS.overrides, &SCRIPTS.block]);
    all.extend(crate::strategy::lease::scripts());
    let twins: Vec<&LuaScript> = all.iter().filter_map(|s| s.unflagged()).collect();
    all.extend(twins);
    let batches: Vec<&LuaScript> = all.iter().filter_map(|s| s.batch()).collect();
    for batch in batches {
        if !all.iter().any(|s| s.name == batch.name) {
            all.push(batch);
        }
    }
    #[cfg(feature = "throttle")]
    {
        use self::script::{BLOOM_MERGE, BLOOM_READ};
        all.extend([&*BLOOM_READ, BLOOM_READ.plain(), &*BLOOM_MERGE]);
    }
    all
}

impl RedisStore {
    #[cfg_attr(not(feature = "throttle"), allow(dead_code))]
    /// The connection, shared with the throttle's sync task.
    pub(crate) fn connection(&self) -> &Connection {
        &self.inner.conn
    }

    /// Every Lua script this crate sends to Redis, exactly as sent, by a
    /// name unique among them: each strategy's decision, its no-writes twin
    /// for peeks and pre-checks (and that twin without flags, for Redis
    /// 6.2), its refund, its batch, the reset, and the throttle's. A Redis
    /// error from inside one names it and a line of this text. The work
    /// queues send their `lua/` files as they are.
    ///
    /// `cargo run --all-features --example lua -- NAME` prints one, its
    /// lines numbered; the repository keeps `lua/SENT.md`, a row per script
    /// with its SHA1 and line count, and a test fails when it is stale.
    ///
    /// ```
    /// let scripts = tollgate::RedisStore::scripts();
    /// let (_, text) = scripts.iter().find(|(name, _)| *name == "fixed_window_peek").unwrap();
    /// assert!(text.starts_with("#!lua flags=no-writes"));
    /// ```
    pub fn scripts() -> Vec<(&'static str, &'static str)> {
        every_script()
            .into_iter()
            .map(|s| (s.name(), s.source()))
            .collect()
    }

    /// What the servers' scripting can do, shared with the throttle's sync
    /// task.
    #[cfg_attr(not(feature = "throttle"), allow(dead_code))]
    pub(crate) fn scripting(&self) -> &Arc<Scripting> {
        &self.inner.scripting
    }

    #[cfg_attr(not(feature = "throttle"), allow(dead_code))]
    /// The key names, shared with the throttle's sync task.
    pub(crate) fn keyspace(&self) -> &KeySpace {
        &self.inner.keys
    }

    /// Where the scripts take their `now`: the store's clock, or Redis
    /// `TIME`.
    pub(super) fn script_now(&self) -> ScriptNow {
        match &self.inner.clock {
            Some(clock) => ScriptNow::Store(clock.now_micros()),
            None => ScriptNow::RedisTime,
        }
    }

    /// The store's now, µs: its clock's, or Redis's as last seen (this
    /// machine's wall clock before any reply). For an override's end.
    pub(super) fn now_micros_estimate(&self) -> u64 {
        match &self.inner.clock {
            Some(clock) => clock.now_micros(),
            None => match self.inner.offset.redis_time(Instant::now()) {
                0 => crate::clock::SystemClock.now_micros(),
                now => now.max(0) as u64,
            },
        }
    }

    /// `deadline` as the scripts' `until`: store time, µs, after which a
    /// charge is no longer wanted; 0 for none (no deadline, or no estimate
    /// of Redis time yet).
    fn until(&self, deadline: Option<Instant>) -> i64 {
        let Some(deadline) = deadline else { return 0 };
        match &self.inner.clock {
            // The clock the scripts are given: its now, plus the time left.
            Some(clock) => {
                let left = deadline.saturating_duration_since(Instant::now());
                int(clock.now_micros()).saturating_add(int(left.as_micros()))
            }
            None => self.inner.offset.redis_time(deadline),
        }
    }
}

impl Store for RedisStore {
    fn policy_in_force(&self, policy: &Policy) -> Option<Arc<Policy>> {
        self.policy_in_force_known(policy)
    }

    fn policy_limits_version(&self) -> u64 {
        self.inner.policy_limits.version()
    }

    fn policy_limits<'a>(
        &'a self,
        policy: &'a Policy,
    ) -> BoxFuture<'a, Result<PolicyLimits, StoreError>> {
        Box::pin(self.fresh_policy_limits(policy))
    }

    fn policies_limits<'a>(
        &'a self,
        policies: &'a [&'a Policy],
    ) -> BoxFuture<'a, Result<Vec<PolicyLimits>, StoreError>> {
        Box::pin(self.fresh_policies_limits(policies))
    }

    fn set_policy_limit<'a>(
        &'a self,
        policy: &'a Policy,
        which: PolicyLimit,
        value: Option<&'a Override>,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(self.write_policy_limit(policy, which, value))
    }

    fn check<'a>(
        &'a self,
        policy: &'a Policy,
        key: &'a Key,
        cost: u64,
    ) -> BoxFuture<'a, Result<Decision, StoreError>> {
        Box::pin(self.charge(policy, key, cost, None))
    }

    fn check_before<'a>(
        &'a self,
        policy: &'a Policy,
        key: &'a Key,
        cost: u64,
        deadline: Instant,
    ) -> BoxFuture<'a, Result<Decision, StoreError>> {
        Box::pin(self.charge(policy, key, cost, Some(deadline)))
    }

    fn peek<'a>(
        &'a self,
        policy: &'a Policy,
        key: &'a Key,
    ) -> BoxFuture<'a, Result<Decision, StoreError>> {
        if self.inner.leases.is_none() {
            return Box::pin(self.decide(policy, key, 0, true, 0));
        }
        Box::pin(async move {
            // A lease granted under other quotas is not spent by requests
            // judged by these: it goes back first, as a request's would,
            // so the peek counts its units in the quotas in force.
            self.end_stale_lease(policy, key).await;
            let decision = self.decide(policy, key, 0, true, 0).await?;
            Ok(self.with_lease_in_hand(policy, key, decision))
        })
    }

    fn peek_cost<'a>(
        &'a self,
        policy: &'a Policy,
        key: &'a Key,
        cost: u64,
    ) -> BoxFuture<'a, Result<Decision, StoreError>> {
        // The no-writes twin, deciding as if charging `cost`.
        Box::pin(self.decide(policy, key, cost, true, 0))
    }

    /// A decision from this server's lease of `key`, when it holds one
    /// that covers `cost` (see [`Leases`]); otherwise `None`: Redis decides.
    fn check_now(
        &self,
        policy: &Policy,
        key: &Key,
        cost: u64,
    ) -> Option<Result<Decision, StoreError>> {
        self.inner.leases.as_ref()?;
        self.spend_lease(policy, key, cost).map(Ok)
    }

    fn reset<'a>(
        &'a self,
        policy: &'a Policy,
        key: &'a Key,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(self.forget(policy, key))
    }

    fn set_override<'a>(
        &'a self,
        policy: &'a Policy,
        key: &'a Key,
        quotas: &'a Override,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            self.end_lease(policy, key).await;
            self.set_caller_override(policy, key, quotas).await
        })
    }

    fn get_override<'a>(
        &'a self,
        policy: &'a Policy,
        key: &'a Key,
    ) -> BoxFuture<'a, Result<Option<Override>, StoreError>> {
        Box::pin(self.get_caller_override(policy, key))
    }

    fn clear_override<'a>(
        &'a self,
        policy: &'a Policy,
        key: &'a Key,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(async move {
            self.end_lease(policy, key).await;
            self.clear_caller_override(policy, key).await
        })
    }

    fn list_overrides<'a>(
        &'a self,
        policy: &'a Policy,
    ) -> BoxFuture<'a, Result<Vec<(Key, Override)>, StoreError>> {
        Box::pin(self.list_caller_overrides(policy))
    }

    fn block<'a>(
        &'a self,
        policy: &'a Policy,
        key: &'a Key,
        block: std::time::Duration,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            self.end_lease(policy, key).await;
            self.block_caller(policy, key, block).await
        })
    }

    fn unblock<'a>(
        &'a self,
        policy: &'a Policy,
        key: &'a Key,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(self.unblock_caller(policy, key))
    }

    fn refund<'a>(
        &'a self,
        policy: &'a Policy,
        key: &'a Key,
        receipt: &'a Receipt,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        // A slot's release, on every request of a concurrency limit, boxes
        // only its own future.
        let algorithm = policy.strategy().algorithm();
        if algorithm.holds_until_response_ends()
            && !receipt.is_empty()
            && let GiveBack::Release(script, args) =
                algorithm.give_back_call(policy, self.script_now(), receipt)
        {
            let keys = self.inner.keys.quota_keys(policy, key);
            return Box::pin(self.release(keys, script, args));
        }
        Box::pin(self.give_back(policy, key, receipt))
    }

    fn settle<'a>(
        &'a self,
        policy: &'a Policy,
        key: &'a Key,
        receipt: &'a Receipt,
        actual: u64,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(self.settle_units(policy, key, receipt, actual))
    }

    /// A concurrency slot's release that would queue behind the calls in
    /// flight is queued and answered at once: it goes out in its turn,
    /// ahead of the charges in the batch it joins, whatever becomes of its
    /// caller, so nothing needs to wait for it (no task, no timer); a
    /// failure is logged when the batch returns.
    /// Anything else is `None`: await [`refund`](Store::refund).
    fn refund_now(
        &self,
        policy: &Policy,
        key: &Key,
        receipt: &Receipt,
    ) -> Option<Result<(), StoreError>> {
        let algorithm = policy.strategy().algorithm();
        if self.inner.leases.is_some() && self.refund_to_lease(policy, key, receipt) {
            return Some(Ok(()));
        }
        if !algorithm.holds_until_response_ends() || receipt.is_empty() {
            return None;
        }
        // With a slot free (low load) the caller sends it: build nothing.
        if !self.inner.batchers.any_busy() {
            return None;
        }
        let GiveBack::Release(script, args) =
            algorithm.give_back_call(policy, self.script_now(), receipt)
        else {
            return None;
        };
        let keys = self.inner.keys.quota_keys(policy, key);
        let batcher = self.batcher_for(&keys)?;
        batcher
            .queue_give_back(script, keys, args)
            .then_some(Ok(()))
    }
}

#[cfg(all(test, feature = "deadpool"))]
mod tests {
    use std::num::NonZeroU32;
    use std::time::Duration;

    use super::*;

    /// Every decision waiting on Redis holds its boxed future, and every
    /// slot's release one more. The rare paths' large futures (a pool
    /// checkout, finding Sentinel's primary, a cluster's retries, loading a
    /// script after `NOSCRIPT`) are boxed apart, so the common ones stay
    /// small: 960 and 952 bytes with rustc 1.95, under the 1,032 that glibc
    /// serves from its per-thread cache (7.8 KB each before). The bound
    /// leaves room for other compilers' layouts and still fails on the old
    /// sizes.
    #[tokio::test]
    async fn a_pending_decision_holds_a_small_future() {
        let pool = deadpool_redis::Config::from_url("redis://127.0.0.1:1")
            .create_pool(Some(deadpool_redis::Runtime::Tokio1))
            .unwrap();
        let store = RedisStore::from_pool(pool).build().unwrap();
        let one = NonZeroU32::new(1).unwrap();
        let policy = Policy::concurrency("c", one, Duration::from_secs(1)).unwrap();
        let key = Key::new("k");
        let receipt = Receipt::new(1, vec![7]);
        let check = store.check(&policy, &key, 1);
        let release = store.refund(&policy, &key, &receipt);
        let (check, release) = (size_of_val(&*check), size_of_val(&*release));
        assert!(check <= 1280, "a decision's future is {check} bytes");
        assert!(release <= 1280, "a release's future is {release} bytes");
    }
}
