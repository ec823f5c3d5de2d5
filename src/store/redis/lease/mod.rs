//! Leased quotas on the Redis store (opt in with
//! [`RedisStoreBuilder::leases`](crate::store::RedisStoreBuilder::leases)): a hot
//! caller's decisions are made in this process from a slice of its budget
//! that Redis charged first.
//!
//! A caller decided often enough on this server (see [`Leases`]) gets a
//! lease with its next decision: the strategy's lease script
//! (`lua/<strategy>_lease.lua`, one `EVALSHA`) decides the request exactly
//! as the strategy's own script would, and on a pass also charges up to L
//! more units, never more than half of what the caller has left. The
//! server then spends those units in memory ([`Store::check_now`] answers
//! from them), and gives back what it did not spend when the lease ends,
//! in one refund call. Callers seen rarely go to Redis per decision, with
//! the strategy's own script, as without leases.
//!
//! One lease request is in flight per caller and server; requests that
//! find it in flight wait for it (at most one span), then spend from the
//! new lease or go to Redis alone.
//!
//! [`Store::check_now`]: crate::Store::check_now

mod options;
mod table;

pub use self::options::Leases;
pub(crate) use self::table::LeaseTable;

use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use self::table::{Ask, Lease, Refill, Returning};
use super::{args, local_micros, reply, Inner, RedisStore};
use crate::decision::{Decision, Receipt};
use crate::error::StoreError;
use crate::key::Key;
use crate::policy::Policy;
use crate::strategy::lease::{self, Spending};

impl RedisStore {
    /// The lease table, if this store leases and `policy` can.
    fn leasing(&self, policy: &Policy, cost: u64) -> Option<&LeaseTable> {
        let table = self.inner.leases.as_ref()?;
        (cost > 0 && lease::spending(policy).is_some()).then_some(table)
    }

    /// Time on the leases' clock, µs: the store's clock if it was given
    /// one, else this machine's monotonic clock (a lease's times are then
    /// counted from when it was asked for, before Redis charged it, so it
    /// ends no later than Redis would have it end).
    pub(super) fn lease_now(&self) -> u64 {
        match &self.inner.clock {
            Some(clock) => clock.now_micros(),
            None => local_micros(Instant::now()).max(0) as u64,
        }
    }

    /// The Redis store's `check_now`: a decision from the lease in hand.
    pub(super) fn spend_lease(&self, policy: &Policy, key: &Key, cost: u64) -> Option<Decision> {
        let table = self.leasing(policy, cost)?;
        table.spend(policy, key, cost, self.lease_now())
    }

    /// A refund the lease in hand takes back, without a call.
    pub(super) fn refund_to_lease(&self, policy: &Policy, key: &Key, receipt: &Receipt) -> bool {
        self.leasing(policy, receipt.cost())
            .is_some_and(|table| table.refund(policy, key, receipt, self.lease_now()))
    }

    /// A settle's part the lease in hand takes (see [`LeaseTable::settle`]):
    /// the actual cost left for Redis. A GCRA lease is given back first:
    /// Redis then judges the settle on the bucket the memory store would
    /// hold (GCRA floors a settle at the pass's own TAT, which a lease's
    /// units would move).
    pub(super) async fn settle_in_lease(
        &self,
        policy: &Policy,
        key: &Key,
        receipt: &Receipt,
        actual: u64,
    ) -> u64 {
        let Some(table) = self.leasing(policy, receipt.cost().max(actual)) else {
            return actual;
        };
        if let Some(Spending::Decaying { .. }) = lease::spending(policy) {
            self.end_lease(policy, key).await;
            return actual;
        }
        table.settle(policy, key, receipt, actual, self.lease_now())
    }

    /// A refund going to Redis: the lease in hand counts it (see
    /// [`LeaseTable::refunding_in_redis`]), or, a GCRA lease, is given
    /// back first (as for [`settle_in_lease`](Self::settle_in_lease)).
    pub(super) async fn refunding_in_redis(&self, policy: &Policy, key: &Key, receipt: &Receipt) {
        let Some(table) = self.leasing(policy, receipt.cost()) else {
            return;
        };
        match lease::spending(policy) {
            Some(Spending::Decaying { .. }) => self.end_lease(policy, key).await,
            _ => table.refunding_in_redis(policy, key, receipt, self.lease_now()),
        }
    }

    /// Drops `key`'s lease on this server (before a reset).
    pub(super) fn forget_lease(&self, policy: &Policy, key: &Key) {
        if let Some(table) = &self.inner.leases {
            table.forget(policy, key);
        }
    }

    /// Ends `key`'s lease on this server and gives back what it leaves
    /// (before an operator changes the caller's rules: the next lease is
    /// granted under the new ones).
    pub(super) async fn end_lease(&self, policy: &Policy, key: &Key) {
        let Some(table) = &self.inner.leases else {
            return;
        };
        if let Some(returning) = table.end(policy, key, self.lease_now()) {
            let _ = self.return_lease(returning).await;
        }
    }

    /// Ends `key`'s lease when it was granted under other quotas than
    /// `policy`'s, giving its units back (see [`end_lease`](Self::end_lease)).
    pub(super) async fn end_stale_lease(&self, policy: &Policy, key: &Key) {
        if self
            .inner
            .leases
            .as_ref()
            .is_some_and(|table| table.stale(policy, key))
        {
            self.end_lease(policy, key).await;
        }
    }

    /// A peek's decision with this server's unspent lease counted as
    /// remaining, as a decision from the lease would show it.
    pub(super) fn with_lease_in_hand(
        &self,
        policy: &Policy,
        key: &Key,
        mut decision: Decision,
    ) -> Decision {
        if let Some(table) = self.leasing(policy, 1) {
            let unspent = table.unspent(policy, key, self.lease_now());
            decision.remaining = (decision.remaining + unspent).min(decision.limit);
            decision.used = decision.limit - decision.remaining;
        }
        decision
    }

    /// A charging decision of a leasing store: from the lease in hand, by
    /// taking a lease, or (`None`) in Redis alone as without leases.
    pub(super) async fn charge_leasing(
        &self,
        policy: &Policy,
        key: &Key,
        cost: u64,
        deadline: Option<Instant>,
    ) -> Option<Result<Decision, StoreError>> {
        let table = self.leasing(policy, cost)?;
        // The sweeper also forgets callers long unseen, leased or not.
        if table.start_sweeping() {
            self.sweep_in_background();
        }
        let mut waited = false;
        // Waits for lease requests in flight end a span after the first.
        let mut give_up = None;
        loop {
            let (ask, returning) = table.ask(policy, key, cost, self.lease_now(), waited);
            if let Some(returning) = returning {
                // Within the request's deadline: a give-back cut short
                // still lands, or lapses with its window.
                let back = self.return_lease(returning);
                match deadline {
                    Some(deadline) => {
                        let _ = tokio::time::timeout_at(deadline.into(), back).await;
                    }
                    None => {
                        let _ = back.await;
                    }
                }
            }
            match ask {
                Ask::Spent(decision) => return Some(Ok(decision)),
                Ask::Plain => return None,
                Ask::Take { want } => {
                    return Some(
                        self.take_lease(table, policy, key, cost, want, deadline)
                            .await,
                    )
                }
                Ask::Wait(refill) => {
                    // Closed when the lease request ends.
                    let span = Duration::from_micros(table.options.span);
                    let until = *give_up.get_or_insert_with(|| tokio::time::Instant::now() + span);
                    if tokio::time::timeout_at(until, refill.acquire())
                        .await
                        .is_err()
                    {
                        return None;
                    }
                    waited = true;
                }
            }
        }
    }

    /// One call of the lease script: this request's decision, and on a pass
    /// a lease put in hand. The decision's `Remaining` counts the lease.
    async fn take_lease(
        &self,
        table: &LeaseTable,
        policy: &Policy,
        key: &Key,
        cost: u64,
        want: u64,
        deadline: Option<Instant>,
    ) -> Result<Decision, StoreError> {
        let asked_at = self.lease_now();
        let mut refill = Refill {
            table,
            policy,
            key,
            dry_until: Some(asked_at.saturating_add(table.options.span)),
        };
        let (script, mut args) =
            lease::call(policy, self.script_now(), cost, want, table.options.span);
        let until = self.until(deadline);
        let mut keys = self.inner.keys.quota_keys(policy, key);
        if policy.has_caller_rules() {
            self.add_caller_rules(policy, key, &mut keys, &mut args);
        }
        // In a batch where the strategy's batch twin takes leases (the
        // fixed window's), else alone.
        let batcher = script.batch().and(self.batcher_for(&keys));
        let ints = match batcher {
            Some(batcher) => batcher.eval(script, keys, args, until).await?,
            None => {
                args::with_until(&mut args, until);
                let call = Box::pin(self.inner.conn.eval(script, &keys, &args, false));
                reply::integers(call.await.map_err(|err| script.error(err))?)?
            }
        };
        let (mut decision, leased) = self.heard(policy, ints)?.leased(cost)?;
        if decision.allowed && leased > 0 {
            let spending = lease::spending(policy)
                .expect("only leasing policies take leases")
                .in_units_of(decision.receipt.unit_micros());
            let stamp = |i: usize| decision.receipt.stamps().get(i).copied().unwrap_or(0);
            // A window's one stamp; GCRA's TAT and `given` (`strategy/bucket.rs`).
            let (lease_stamp, lease_given) = (stamp(0), stamp(1));
            let lifetime = asked_at.saturating_add(table.options.lifetime);
            let window_left = decision.reset_at_micros.saturating_sub(decision.now_micros);
            let window_ends_at = match spending {
                Spending::Window => asked_at.saturating_add(window_left),
                Spending::Decaying { .. } => u64::MAX,
            };
            let spent_by = match spending {
                Spending::Window => window_ends_at,
                Spending::Decaying { interval } => {
                    asked_at.saturating_add(leased.saturating_mul(interval))
                }
            };
            let lease = Lease {
                policy: policy.clone(),
                spending,
                units: leased,
                spent: 0,
                asked_at,
                ends_at: lifetime.min(spent_by),
                window_ends_at,
                stamp: lease_stamp,
                given: lease_given,
                limit: decision.limit,
                left_in_redis: decision.remaining as i64,
                reset_at: decision.reset_at_micros,
                store_now: decision.now_micros,
                last_used: asked_at,
                decided: crate::metrics::LeaseDecisions::of(policy),
            };
            refill.dry_until = None;
            if let Some(returning) = table.install(key, lease, asked_at) {
                self.return_in_background(returning);
            }
            crate::metrics::lease_taken(policy, leased);
            tracing::debug!(
                policy = policy.name(),
                units = leased,
                "rate limit lease taken for a hot caller"
            );
            decision.remaining = (decision.remaining + leased).min(decision.limit);
            decision.used = decision.limit - decision.remaining;
            decision.spent = decision.used;
            decision.receipt = spending.pass_receipt(lease_stamp, lease_given, leased, cost);
        }
        let scope = policy.strategy().scope_of(decision.quota);
        Ok(decision.scoped(scope))
    }

    /// Gives back what an ended lease left, in a task of its own.
    fn return_in_background(&self, returning: Returning) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let store = self.clone();
        runtime.spawn(async move { store.return_lease(returning).await });
    }

    /// One refund call: the unspent units back to the window (or bucket)
    /// the lease charged.
    async fn return_lease(&self, returning: Returning) -> Result<u64, StoreError> {
        let units = returning.units_at(self.lease_now());
        if units == 0 {
            return Ok(0);
        }
        let (policy, key) = (&returning.lease.policy, &returning.key);
        match self
            .refund_in_redis(policy, key, &returning.receipt(units))
            .await
        {
            Ok(()) => {
                crate::metrics::lease_returned(policy, units);
                Ok(units)
            }
            Err(err) => {
                tracing::debug!(policy = policy.name(), error = %err,
                    "could not give back a lease's unspent units; they lapse with its window");
                Err(err)
            }
        }
    }

    /// A task that ends quiet and lapsed leases every half `quiet_after`,
    /// while the store lives.
    fn sweep_in_background(&self) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let Some(table) = &self.inner.leases else {
            return;
        };
        let every = Duration::from_micros((table.options.quiet_after / 2).max(10_000));
        let store: Weak<Inner> = Arc::downgrade(&self.inner);
        runtime.spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                let Some(inner) = store.upgrade() else { return };
                let store = RedisStore { inner };
                store.end_leases(false).await;
            }
        });
    }

    /// Ends leases (all of them, or those lapsed and quiet) and gives back
    /// what they leave, one refund call each: the units given back.
    async fn end_leases(&self, all: bool) -> u64 {
        let Some(table) = &self.inner.leases else {
            return 0;
        };
        let mut given = 0;
        for returning in table.sweep(self.lease_now(), all) {
            given += self.return_lease(returning).await.unwrap_or(0);
        }
        given
    }

    /// Gives back every lease this store holds, one refund call each, and
    /// answers how many units went back: for a graceful shutdown (a store
    /// dropped holding leases loses them, each at most until its window
    /// ends). Units whose give-back fails lapse with their window.
    ///
    /// ```no_run
    /// # async fn run(store: tollgate::RedisStore) {
    /// let given_back = store.return_leases().await;
    /// # let _ = given_back; }
    /// ```
    pub async fn return_leases(&self) -> u64 {
        self.end_leases(true).await
    }
}
