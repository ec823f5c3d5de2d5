//! The Redis store: one script call, one round trip, per decision.

pub(crate) mod args;
mod batch;
mod batchers;
mod builder;
mod caller;
#[cfg(feature = "cluster")]
mod cluster;
pub(crate) mod connection;
mod lease;
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

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use self::args::{int, GiveBack};
use self::batchers::Batchers;
use self::connection::Connection;
use self::lease::LeaseTable;
use self::script::Args;
use self::script::{LuaScript, SCRIPTS};
use self::server::Scripting;
use super::keys::KeyList;
use super::{BoxFuture, KeySpace, Store};
use crate::clock::Clock;
use crate::decision::{Decision, Receipt, Scope};
use crate::error::StoreError;
use crate::key::Key;
use crate::overrides::Override;
use crate::policy::Policy;

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

    /// `now` for the scripts: the store's clock, or -1 for Redis `TIME`.
    /// Decision arguments are all integers, sent without a string of their
    /// own each.
    fn now_int(&self) -> i64 {
        match &self.inner.clock {
            Some(clock) => int(clock.now_micros()),
            None => -1,
        }
    }

    /// The store's now, µs: its clock's, or Redis's as last seen (this
    /// machine's wall clock before any reply). For an override's end.
    fn now_micros_estimate(&self) -> u64 {
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

    async fn decide(
        &self,
        policy: &Policy,
        key: &Key,
        cost: u64,
        read_only: bool,
        until: i64,
    ) -> Result<Decision, StoreError> {
        let (script, keys, mut args) = self.call_for(policy, key, cost, read_only);
        let batcher = match read_only {
            true => None,
            false => self.batcher_for(&keys),
        };
        let reply = match batcher {
            Some(batcher) => batcher.eval(script, keys, args, until).await?,
            None if !read_only && SCRIPTS.give_back_of(script, &args).is_some() => {
                batch::with_until(&mut args, until);
                batch::eval_holding(&self.inner.conn, script, keys, args).await?
            }
            None if read_only => reply::integers(
                self.inner
                    .scripting
                    .eval_read_only(&self.inner.conn, script, &keys, &args)
                    .await
                    .map_err(|err| script.error(err))?,
            )?,
            None => {
                batch::with_until(&mut args, until);
                let reply = self.inner.conn.eval(script, &keys, &args, false).await;
                reply::integers(reply.map_err(|err| script.error(err))?)?
            }
        };
        if reply.first() == Some(&reply::BLOCK_STARTED) {
            crate::metrics::block_started(policy, "strikes");
        }
        let now_at = if reply.first() == Some(&reply::LATE) {
            1
        } else {
            5
        };
        if let Some(&now) = reply.get(now_at) {
            self.inner.offset.observe(now);
        }
        let decision = policy.strategy().algorithm().reply(reply, cost)?;
        let scope = policy.strategy().scope_of(decision.quota);
        Ok(decision.scoped(scope))
    }

    /// The batcher for a writing call on `keys`, if the store batches.
    fn batcher_for(&self, keys: &[String]) -> Option<&batch::Batcher> {
        self.inner.batchers.for_keys(&self.inner.conn, keys)
    }

    /// The script, keys and arguments one decision needs.
    fn call_for(
        &self,
        policy: &Policy,
        key: &Key,
        cost: u64,
        read_only: bool,
    ) -> (&'static LuaScript, KeyList, Args) {
        let algorithm = policy.strategy().algorithm();
        let (script, mut args) = algorithm.call(policy, self.now_int(), cost, read_only);
        let mut keys = self.inner.keys.quota_keys(policy, key);
        if !policy.has_caller_rules() {
            return (script, keys, args);
        }
        self.add_caller_rules(policy, key, &mut keys, &mut args);
        (algorithm.lua().decide_with_caller(read_only), keys, args)
    }

    /// Frees what a pass held until its response ended (a concurrency
    /// limit's slot) with `script` and `args`: batched, when the store
    /// batches, like the decisions that take slots, so a crowd frees them
    /// at the same cost.
    async fn release(
        &self,
        keys: KeyList,
        script: &'static LuaScript,
        args: Args,
    ) -> Result<(), StoreError> {
        match self.batcher_for(&keys) {
            Some(batcher) => {
                batcher.give_back(script, keys, args).await?;
            }
            None => {
                self.inner
                    .conn
                    .eval(script, &keys, &args, false)
                    .await
                    .map_err(|err| script.error(err))?;
            }
        }
        Ok(())
    }

    /// One `DEL` of `key`'s own keys under `policy` (lua/reset.lua), its
    /// penalty-box entry with them (not its override, which is
    /// configuration): its keys share one hash tag, so one call on one
    /// node clears them all.
    async fn forget(&self, policy: &Policy, key: &Key) -> Result<(), StoreError> {
        self.forget_lease(policy, key);
        let mut keys: KeyList = self
            .inner
            .keys
            .quota_keys(policy, key)
            .into_iter()
            .enumerate()
            .filter(|(i, _)| policy.strategy().scope_of(*i) == Scope::Consumer)
            .map(|(_, name)| name)
            .collect();
        if policy.penalty_box().is_some() {
            keys.push(self.inner.keys.penalty_key(policy, key));
        }
        if keys.is_empty() {
            return Ok(());
        }
        let no_args: [i64; 0] = [];
        self.inner
            .conn
            .eval(&SCRIPTS.reset, &keys, &no_args, false)
            .await
            .map_err(|err| SCRIPTS.reset.error(err))?;
        Ok(())
    }

    async fn give_back(
        &self,
        policy: &Policy,
        key: &Key,
        receipt: &Receipt,
    ) -> Result<(), StoreError> {
        if receipt.is_empty() || self.refund_to_lease(policy, key, receipt) {
            return Ok(());
        }
        self.refunding_in_redis(policy, key, receipt).await;
        self.refund_in_redis(policy, key, receipt).await
    }

    /// The strategy's refund script for `receipt`, in Redis.
    async fn refund_in_redis(
        &self,
        policy: &Policy,
        key: &Key,
        receipt: &Receipt,
    ) -> Result<(), StoreError> {
        let keys = self.inner.keys.quota_keys(policy, key);
        let algorithm = policy.strategy().algorithm();
        let (script, args) = match algorithm.give_back_call(policy, self.now_int(), receipt) {
            GiveBack::Release(script, args) => return self.release(keys, script, args).await,
            GiveBack::Refund(script, args) => (script, args),
        };
        self.inner
            .conn
            .eval(script, &keys, &args, false)
            .await
            .map_err(|err| script.error(err))?;
        Ok(())
    }
}

impl RedisStore {
    /// One `EVALSHA` of the strategy's refund script with the difference
    /// (negative: a charge); none when there is nothing to send. Sent
    /// without a deadline: like a refund it applies however late, to what
    /// the receipt charged or not at all.
    async fn settle_units(
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
        // The lease in hand settles what it can; Redis the rest.
        let actual = self.settle_in_lease(policy, key, receipt, actual).await;
        if actual == receipt.cost() {
            return Ok(());
        }
        let algorithm = policy.strategy().algorithm();
        let call = algorithm.settle_call(policy, self.now_int(), receipt, actual);
        let (script, args) = match call {
            None => return Ok(()),
            Some(GiveBack::Refund(script, args)) => (script, args),
            Some(GiveBack::Release(..)) => return Ok(()),
        };
        let keys = self.inner.keys.quota_keys(policy, key);
        self.inner
            .conn
            .eval(script, &keys, &args, false)
            .await
            .map_err(|err| script.error(err))?;
        Ok(())
    }
}

impl RedisStore {
    /// A charging decision, with a pre-check first if configured; a call
    /// that reaches Redis after `deadline` charges nothing.
    async fn charge(
        &self,
        policy: &Policy,
        key: &Key,
        cost: u64,
        deadline: Option<Instant>,
    ) -> Result<Decision, StoreError> {
        {
            if self.inner.leases.is_some() {
                // Boxed: a store without leases carries none of its future.
                let leasing = Box::pin(self.charge_leasing(policy, key, cost, deadline));
                if let Some(answer) = leasing.await {
                    return answer;
                }
            }
            // A penalty box counts rejections where they are decided: a
            // pre-check's would not count.
            if self.inner.pre_check
                && cost > 0
                && policy.strategy().rejection_is_stable()
                && policy.penalty_box().is_none()
            {
                match self.decide(policy, key, cost, true, 0).await {
                    Ok(decision) if !decision.allowed => return Ok(decision),
                    Ok(_) => {}
                    Err(err) => {
                        crate::metrics::replica_fallback();
                        tracing::debug!(error = %err, "pre-check failed; asking the primary")
                    }
                }
            }
            self.decide(policy, key, cost, false, self.until(deadline))
                .await
        }
    }
}

impl Store for RedisStore {
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
            let decision = self.decide(policy, key, 0, true, 0).await?;
            Ok(self.with_lease_in_hand(policy, key, decision))
        })
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
        if algorithm.holds_until_response_ends() && !receipt.is_empty() {
            if let GiveBack::Release(script, args) =
                algorithm.give_back_call(policy, self.now_int(), receipt)
            {
                let keys = self.inner.keys.quota_keys(policy, key);
                return Box::pin(self.release(keys, script, args));
            }
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
            algorithm.give_back_call(policy, self.now_int(), receipt)
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
