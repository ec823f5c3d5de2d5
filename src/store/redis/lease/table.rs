//! This server's leases, in process: which callers are hot, the lease in
//! hand for each, spending it, taking units back into it, and what an
//! ended lease leaves to give back. Nothing here calls Redis; the store's
//! lease calls (`lease/mod.rs`) do.

use std::hash::{BuildHasher, Hash, Hasher};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use foldhash::fast::RandomState;
use hashbrown::{Equivalent, HashMap};
use tokio::sync::Semaphore;

use super::Leases;
use crate::decision::{Decision, Receipt};
use crate::key::Key;
use crate::metrics::LeaseDecisions;
use crate::policy::Policy;
use crate::strategy::lease::Spending;

/// A lease in hand: units Redis charged to the caller, spent here.
#[derive(Debug)]
pub(super) struct Lease {
    pub(super) policy: Policy,
    pub(super) spending: Spending,
    /// Units not yet spent (a GCRA lease loses more to decay, see
    /// [`Spending::decayed`]).
    pub(super) units: u64,
    /// Units spent from it and not refunded: what a refund may put back.
    pub(super) spent: u64,
    /// When the lease was asked for (this server's lease clock, µs).
    pub(super) asked_at: u64,
    /// When it ends, at the latest (lease clock, µs).
    pub(super) ends_at: u64,
    /// When its window ends (lease clock, µs; GCRA: never).
    pub(super) window_ends_at: u64,
    /// The refund stamp of what the lease charged.
    pub(super) stamp: u64,
    /// For GCRA, the bucket's `given` when the lease was charged (its
    /// receipt's second stamp, see `strategy/bucket.rs`); 0 for a window.
    pub(super) given: u64,
    pub(super) limit: u64,
    /// What Redis had left of the limit once the lease was charged, moved
    /// by what this server settled or refunded in Redis since in the
    /// lease's window; below zero when settles overspent it.
    pub(super) left_in_redis: i64,
    /// `Reset` from Redis, store time, µs.
    pub(super) reset_at: u64,
    /// Redis's (or the store clock's) time when the lease was charged, µs.
    pub(super) store_now: u64,
    pub(super) last_used: u64,
    /// Counts the requests it decides.
    pub(super) decided: LeaseDecisions,
}

impl Lease {
    /// Whether a request judged by `policy` may spend this lease: it was
    /// granted under the same quotas and the same cap (a cap sets a
    /// caller's override above it aside, in Redis: with the cap gone, the
    /// same quotas may no longer be what judges the caller).
    fn is_under(&self, policy: &Policy) -> bool {
        self.policy.quotas() == policy.quotas() && self.policy.cap() == policy.cap()
    }

    /// Units still spendable at `now`.
    fn available(&self, now: u64) -> u64 {
        let decayed = self.spending.decayed(now.saturating_sub(self.asked_at));
        self.units.saturating_sub(decayed)
    }

    fn ended(&self, now: u64) -> bool {
        now >= self.ends_at || self.available(now) == 0
    }

    /// Spends `cost` units at `now`, if the lease has them: the decision,
    /// its `Remaining` what Redis had left at the lease plus what is still
    /// unspent of it.
    fn spend(&mut self, now: u64, cost: u64) -> Option<Decision> {
        let available = self.available(now);
        if now >= self.ends_at || available < cost {
            return None;
        }
        self.units -= cost;
        self.spent += cost;
        self.last_used = now;
        self.decided.count();
        let remaining = self.remaining_with(available - cost);
        let store_now = self.store_now + now.saturating_sub(self.asked_at);
        let receipt = self
            .spending
            .pass_receipt(self.stamp, self.given, self.units, cost);
        Some(
            Decision::allowed(self.limit, self.limit - remaining, self.reset_at, store_now)
                .with_receipt(receipt),
        )
    }

    /// `Remaining` with `unspent` units of the lease left: what Redis had
    /// left plus them, between 0 and the limit.
    fn remaining_with(&self, unspent: u64) -> u64 {
        let left = self.left_in_redis.saturating_add_unsigned(unspent);
        left.clamp(0, self.limit as i64) as u64
    }

    /// Room under the limit at `now`: what a give-back can add before the
    /// budget is whole (a full GCRA bucket takes no more).
    fn room(&self, now: u64) -> u64 {
        self.limit - self.remaining_with(self.available(now))
    }

    /// `units` spent from this lease are unspent again.
    fn take_back(&mut self, units: u64, now: u64) {
        self.spent -= units;
        self.units += units.min(self.room(now));
    }

    /// `units` were given back in Redis, to this lease's window.
    fn freed_in_redis(&mut self, units: u64, now: u64) {
        let units = units.min(self.room(now));
        self.left_in_redis = self.left_in_redis.saturating_add_unsigned(units);
    }

    /// Whether units given back from `receipt` may go into this lease: it
    /// names the lease's window. Not a GCRA lease's: GCRA floors a refund
    /// at the pass's own TAT, which a lease does not know (a settle or
    /// refund ends a GCRA lease first, see [`RedisStore::settle_in_lease`]).
    fn takes_back(&self, receipt: &Receipt) -> bool {
        matches!(self.spending, Spending::Window) && self.charged(receipt)
    }

    /// Whether `receipt` charged this lease's window (or, for GCRA, was
    /// spent from this lease): it names the lease's stamp.
    fn charged(&self, receipt: &Receipt) -> bool {
        receipt.stamps() == [self.stamp]
    }

    /// What to give back of this lease, if anything is left at `now`.
    fn returning(self, key: Key, now: u64) -> Option<Returning> {
        let returning = Returning { lease: self, key };
        (returning.units_at(now) > 0).then_some(returning)
    }
}

/// An ended lease whose unspent units are to go back to Redis.
#[derive(Debug)]
pub(crate) struct Returning {
    pub(super) lease: Lease,
    pub(super) key: Key,
}

impl Returning {
    /// Units to give back at `now`: nothing once the window has ended (the
    /// units went with it); a GCRA lease goes on decaying until the call
    /// is sent, as the bucket goes on refilling.
    pub(super) fn units_at(&self, now: u64) -> u64 {
        if now >= self.lease.window_ends_at {
            return 0;
        }
        self.lease.available(now)
    }

    /// The refund's receipt for `units`.
    pub(super) fn receipt(&self, units: u64) -> Receipt {
        // The lease's own charge, with nothing leased after it.
        let lease = &self.lease;
        lease
            .spending
            .pass_receipt(lease.stamp, lease.given, 0, units)
    }
}

/// One caller under one policy on this server.
#[derive(Debug, Default)]
struct Entry {
    /// Decisions counted in the current span and the one before it.
    period_start: u64,
    this: u64,
    prev: u64,
    last_seen: u64,
    lease: Option<Lease>,
    /// Closed when the lease request in flight has its answer.
    refill: Option<Arc<Semaphore>>,
    /// Until when (lease clock, µs) no lease is asked for: the last lease
    /// request got nothing (the caller had no room left).
    dry_until: u64,
}

impl Entry {
    /// Counts `cost` units decided at `now`.
    fn note(&mut self, now: u64, cost: u64, span: u64) {
        if now >= self.period_start.saturating_add(span) {
            let recent = now < self.period_start.saturating_add(2 * span);
            self.prev = if recent { self.this } else { 0 };
            self.this = 0;
            self.period_start = now;
        }
        self.this += cost;
        self.last_seen = now;
    }
}

/// What [`LeaseTable::ask`] found.
pub(crate) enum Ask {
    /// Spent from the lease in hand.
    Spent(Decision),
    /// A lease request is in flight: wait for it, then ask again.
    Wait(Arc<Semaphore>),
    /// Ask Redis for a lease of `want` units with this decision.
    Take { want: u64 },
    /// Decide in Redis alone, as without leases.
    Plain,
}

/// A policy's name and a caller: whose lease.
type Name = (Arc<str>, Key);

/// A [`Name`] borrowed, to look one up without cloning either part.
struct NameRef<'a>(&'a str, &'a Key);

impl Hash for NameRef<'_> {
    /// As the tuple hashes: each part in turn, the name as a `str`.
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.0.hash(state);
        self.1.hash(state);
    }
}

impl Equivalent<Name> for NameRef<'_> {
    fn equivalent(&self, (name, key): &Name) -> bool {
        self.0 == &**name && self.1 == key
    }
}

const SHARDS: usize = 16;

/// This server's leases and the counts that tell hot callers.
#[derive(Debug)]
pub(crate) struct LeaseTable {
    pub(super) options: Leases,
    shards: Box<[Mutex<HashMap<Name, Entry, RandomState>>]>,
    hasher: RandomState,
    sweeping: AtomicBool,
}

impl LeaseTable {
    pub(crate) fn new(options: Leases) -> Self {
        Self {
            options,
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
            hasher: RandomState::default(),
            sweeping: AtomicBool::new(false),
        }
    }

    fn shard(&self, key: &Key) -> MutexGuard<'_, HashMap<Name, Entry, RandomState>> {
        let at = self.hasher.hash_one(key) as usize % SHARDS;
        self.shards[at]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn name(policy: &Policy, key: &Key) -> Name {
        (policy.shared_name().clone(), key.clone())
    }

    fn name_ref<'a>(policy: &'a Policy, key: &'a Key) -> NameRef<'a> {
        NameRef(policy.name(), key)
    }

    /// Spends from the lease in hand, if it covers `cost` and was taken
    /// under the quotas the request is judged by; touches nothing
    /// otherwise. The Redis store's `check_now`.
    pub(crate) fn spend(
        &self,
        policy: &Policy,
        key: &Key,
        cost: u64,
        now: u64,
    ) -> Option<Decision> {
        let mut shard = self.shard(key);
        let entry = shard.get_mut(&Self::name_ref(policy, key))?;
        let decision = entry
            .lease
            .as_mut()
            .filter(|l| l.is_under(policy))?
            .spend(now, cost)?;
        entry.note(now, cost, self.options.span);
        Some(decision)
    }

    /// What to do with a decision of `cost` at `now` that the lease in
    /// hand (if any) did not answer at once, and what an ended lease
    /// leaves to give back. `waited`: the caller already waited for a
    /// lease request, and is counted. While a lease request is in flight
    /// the answer is to wait for it (the caller bounds how long); while
    /// the last one got nothing, to decide in Redis alone.
    pub(crate) fn ask(
        &self,
        policy: &Policy,
        key: &Key,
        cost: u64,
        now: u64,
        waited: bool,
    ) -> (Ask, Option<Returning>) {
        let mut shard = self.shard(key);
        let entry = match shard.get_mut(&Self::name_ref(policy, key)) {
            Some(entry) => entry,
            None => shard.entry(Self::name(policy, key)).or_default(),
        };
        let mut returning = None;
        if let Some(lease) = entry.lease.as_mut() {
            // A request judged by other quotas (a limit it brought) cannot
            // spend a lease granted under these.
            let spent = match lease.is_under(policy) {
                true => lease.spend(now, cost),
                false => None,
            };
            if let Some(decision) = spent {
                if !waited {
                    entry.note(now, cost, self.options.span);
                }
                return (Ask::Spent(decision), None);
            }
            // A lease that cannot pay for this request ends, and what it
            // leaves goes back before Redis decides: Redis then sees every
            // unit this server holds, as a memory store would.
            returning = entry
                .lease
                .take()
                .and_then(|l| l.returning(key.clone(), now));
        }
        if !waited {
            entry.note(now, cost, self.options.span);
        }
        let ask = match &entry.refill {
            Some(refill) => Ask::Wait(refill.clone()),
            None if now < entry.dry_until => Ask::Plain,
            None if entry.prev + entry.this >= self.options.hot_after => {
                entry.refill = Some(Arc::new(Semaphore::new(0)));
                let want = entry.prev.max(entry.this);
                Ask::Take {
                    want: want.clamp(1, self.options.max_units),
                }
            }
            None => Ask::Plain,
        };
        (ask, returning)
    }

    /// The lease request for `key` has its answer (or was given up):
    /// wakes whoever waits for it. `dry_until`: it got nothing, and no
    /// other is asked for until then.
    pub(super) fn refilled(&self, policy: &Policy, key: &Key, dry_until: Option<u64>) {
        let refill = self
            .shard(key)
            .get_mut(&Self::name_ref(policy, key))
            .and_then(|entry| {
                if let Some(until) = dry_until {
                    entry.dry_until = until;
                }
                entry.refill.take()
            });
        if let Some(refill) = refill {
            refill.close();
        }
    }

    /// Puts a new lease in hand; what the old one leaves is to be given back.
    pub(super) fn install(&self, key: &Key, lease: Lease, now: u64) -> Option<Returning> {
        let mut shard = self.shard(key);
        let entry = shard.entry(Self::name(&lease.policy, key)).or_default();
        let old = entry.lease.replace(lease);
        old.and_then(|old| old.returning(key.clone(), now))
    }

    /// The lease in hand for `key`, while it lasts.
    fn live_lease<'s>(
        shard: &'s mut HashMap<Name, Entry, RandomState>,
        policy: &Policy,
        key: &Key,
        now: u64,
    ) -> Option<&'s mut Lease> {
        shard
            .get_mut(&Self::name_ref(policy, key))
            .and_then(|e| e.lease.as_mut())
            .filter(|lease| !lease.ended(now))
    }

    /// Gives `receipt` back to the lease in hand, if it was spent from it
    /// (its window, and no more than was spent) and the lease has not
    /// ended: the unit was charged in Redis with the lease and is unspent
    /// again. `false`: it is Redis's to refund.
    pub(crate) fn refund(&self, policy: &Policy, key: &Key, receipt: &Receipt, now: u64) -> bool {
        let mut shard = self.shard(key);
        let Some(lease) = Self::live_lease(&mut shard, policy, key, now) else {
            return false;
        };
        let cost = receipt.cost();
        if !lease.takes_back(receipt) || lease.spent < cost {
            return false;
        }
        lease.take_back(cost, now);
        true
    }

    /// `receipt` is being refunded in Redis: in the lease's window, what
    /// Redis has left grows by it.
    pub(crate) fn refunding_in_redis(
        &self,
        policy: &Policy,
        key: &Key,
        receipt: &Receipt,
        now: u64,
    ) {
        let mut shard = self.shard(key);
        if let Some(lease) = Self::live_lease(&mut shard, policy, key, now)
            && lease.charged(receipt)
        {
            lease.freed_in_redis(receipt.cost(), now);
        }
    }

    /// Settles `receipt` to `actual` units against the lease in hand, as
    /// far as it can, and answers the actual cost left for Redis to settle
    /// (`receipt.cost()`: nothing). Units given back go into the lease when
    /// they were spent from it; an overspend is spent from the lease first.
    /// What goes to Redis in the lease's window moves what Redis has left,
    /// so the lease's next decisions show what a memory store would.
    pub(crate) fn settle(
        &self,
        policy: &Policy,
        key: &Key,
        receipt: &Receipt,
        actual: u64,
        now: u64,
    ) -> u64 {
        let charged = receipt.cost();
        let mut shard = self.shard(key);
        let Some(lease) = Self::live_lease(&mut shard, policy, key, now) else {
            return actual;
        };
        if !matches!(lease.spending, Spending::Window) || !lease.charged(receipt) {
            return actual;
        }
        let from_this_lease = lease.takes_back(receipt);
        if actual < charged {
            let back = charged - actual;
            if from_this_lease && lease.spent >= back {
                lease.take_back(back, now);
                return charged;
            }
            lease.freed_in_redis(back, now);
            return actual;
        }
        let more = actual - charged;
        let from_lease = more.min(lease.available(now));
        lease.units -= from_lease;
        lease.spent += from_lease;
        lease.left_in_redis = lease
            .left_in_redis
            .saturating_sub_unsigned(more - from_lease);
        actual - from_lease
    }

    /// Drops `key`'s lease without giving it back (a reset clears Redis).
    pub(crate) fn forget(&self, policy: &Policy, key: &Key) {
        self.shard(key).remove(&Self::name_ref(policy, key));
    }

    /// Ends `key`'s lease now: what it leaves to give back.
    pub(super) fn end(&self, policy: &Policy, key: &Key, now: u64) -> Option<Returning> {
        let mut shard = self.shard(key);
        let entry = shard.get_mut(&Self::name_ref(policy, key))?;
        entry.lease.take()?.returning(key.clone(), now)
    }

    /// Whether `key` holds a lease granted under other quotas than
    /// `policy`'s (the policy in force changed since).
    pub(crate) fn stale(&self, policy: &Policy, key: &Key) -> bool {
        let shard = self.shard(key);
        shard
            .get(&Self::name_ref(policy, key))
            .and_then(|e| e.lease.as_ref())
            .is_some_and(|l| !l.is_under(policy))
    }

    /// Units of `key`'s lease still unspent at `now`.
    pub(crate) fn unspent(&self, policy: &Policy, key: &Key, now: u64) -> u64 {
        let shard = self.shard(key);
        shard
            .get(&Self::name_ref(policy, key))
            .and_then(|e| e.lease.as_ref())
            .filter(|l| !l.ended(now))
            .map_or(0, |l| l.available(now))
    }

    /// Ends the leases that ended by `now` or whose caller went quiet
    /// (every lease when `all`), and forgets callers long unseen: what
    /// they leave to give back.
    pub(super) fn sweep(&self, now: u64, all: bool) -> Vec<Returning> {
        let quiet = self.options.quiet_after;
        let forget_after = quiet.max(2 * self.options.span);
        let mut returning = Vec::new();
        for shard in self.shards.iter() {
            let mut shard = shard.lock().unwrap_or_else(PoisonError::into_inner);
            shard.retain(|(_, key), entry| {
                let ends = entry.lease.as_ref().is_some_and(|l| {
                    all || l.ended(now) || now >= l.last_used.saturating_add(quiet)
                });
                if ends {
                    let lease = entry.lease.take();
                    returning.extend(lease.and_then(|l| l.returning(key.clone(), now)));
                }
                entry.lease.is_some()
                    || entry.refill.is_some()
                    || now < entry.last_seen.saturating_add(forget_after)
            });
        }
        returning
    }

    /// Whether a sweeper task runs; starts one the first time.
    pub(super) fn start_sweeping(&self) -> bool {
        !self.sweeping.swap(true, Ordering::Relaxed)
    }
}

/// Ends a lease request when dropped, answered or not: who waits for it
/// goes on.
pub(super) struct Refill<'a> {
    pub(super) table: &'a LeaseTable,
    pub(super) policy: &'a Policy,
    pub(super) key: &'a Key,
    /// Until when no other lease is asked for, unless one was granted.
    pub(super) dry_until: Option<u64>,
}

impl Drop for Refill<'_> {
    fn drop(&mut self) {
        self.table.refilled(self.policy, self.key, self.dry_until);
    }
}

#[cfg(test)]
mod tests {
    use std::num::NonZeroU32;
    use std::time::Duration;

    use super::*;
    use crate::quota::Quota;

    const SECOND: u64 = 1_000_000;

    fn policy() -> Policy {
        Policy::fixed_window("core", Quota::per_minute(NonZeroU32::new(100).unwrap()))
    }

    /// A window lease of `units`, asked for at `at`, its window ending at
    /// `window_end` (lease clock and store clock alike).
    fn lease(units: u64, at: u64, window_end: u64, lifetime: u64) -> Lease {
        Lease {
            policy: policy(),
            spending: Spending::Window,
            units,
            spent: 0,
            asked_at: at,
            ends_at: window_end.min(at + lifetime),
            window_ends_at: window_end,
            stamp: window_end,
            given: 0,
            limit: 100,
            left_in_redis: 50,
            reset_at: window_end,
            store_now: at,
            last_used: at,
            decided: LeaseDecisions::of(&policy()),
        }
    }

    fn table() -> LeaseTable {
        LeaseTable::new(
            Leases::new()
                .hot_after(NonZeroU32::new(3).unwrap())
                .span(Duration::from_secs(1))
                .quiet_after(Duration::from_secs(2)),
        )
    }

    fn hold(table: &LeaseTable, key: &Key, lease: Lease) {
        let now = lease.asked_at;
        assert!(table.install(key, lease, now).is_none());
    }

    #[test]
    fn remaining_is_what_redis_had_left_plus_the_unspent_lease() {
        let mut lease = lease(10, 0, 60 * SECOND, 60 * SECOND);
        let d = lease.spend(SECOND, 3).unwrap();
        assert_eq!((d.remaining, d.used, d.limit), (57, 43, 100));
        assert_eq!(d.now_micros, SECOND);
        assert_eq!(d.receipt.stamps(), [60 * SECOND]);
        assert!(lease.spend(SECOND, 8).is_none(), "7 left");
        assert!(lease.spend(60 * SECOND, 1).is_none(), "the window ended");
    }

    #[test]
    fn a_caller_is_hot_after_enough_decisions_within_a_span_or_two() {
        let (table, policy, bob) = (table(), policy(), Key::new("bob"));
        for at in [0, 1] {
            assert!(matches!(
                table.ask(&policy, &bob, 1, at, false).0,
                Ask::Plain
            ));
        }
        // A span later the count before still counts; two spans later not.
        match table.ask(&policy, &bob, 1, SECOND + 1, false).0 {
            Ask::Take { want } => assert_eq!(want, 2, "as many as the busier span"),
            _ => panic!("hot after three"),
        }
        // While that lease request is in flight, others wait for it.
        assert!(matches!(
            table.ask(&policy, &bob, 1, SECOND + 2, false).0,
            Ask::Wait(_)
        ));
        table.refilled(&policy, &bob, Some(SECOND + 10));
        assert!(
            matches!(table.ask(&policy, &bob, 1, SECOND + 3, false).0, Ask::Plain),
            "dry"
        );
        assert!(
            matches!(table.ask(&policy, &bob, 1, 5 * SECOND, false).0, Ask::Plain),
            "cold"
        );
    }

    #[test]
    fn a_lease_ended_by_its_lifetime_is_given_back_and_one_ended_by_its_window_is_not() {
        let (table, policy, bob) = (table(), policy(), Key::new("bob"));
        hold(&table, &bob, lease(10, 0, 60 * SECOND, 5 * SECOND));
        let (_, returning) = table.ask(&policy, &bob, 1, 5 * SECOND, false);
        assert_eq!(returning.unwrap().units_at(5 * SECOND), 10);

        hold(&table, &bob, lease(10, 0, 60 * SECOND, 600 * SECOND));
        let (_, returning) = table.ask(&policy, &bob, 1, 60 * SECOND, false);
        assert!(returning.is_none(), "the units went with the window");
    }

    #[test]
    fn the_sweep_ends_quiet_leases_and_forgets_callers_long_unseen() {
        let (table, policy) = (table(), policy());
        let (quiet, busy) = (Key::new("quiet"), Key::new("busy"));
        hold(&table, &quiet, lease(10, 0, 60 * SECOND, 60 * SECOND));
        hold(&table, &busy, lease(10, 0, 60 * SECOND, 60 * SECOND));
        table.spend(&policy, &busy, 1, SECOND).unwrap();
        let returning = table.sweep(2 * SECOND, false);
        assert_eq!(returning.len(), 1, "only the quiet lease");
        assert_eq!(returning[0].key, quiet);
        assert_eq!(table.unspent(&policy, &busy, 2 * SECOND), 9);
        // Everything, for a shutdown.
        let returning = table.sweep(2 * SECOND, true);
        assert_eq!(returning[0].units_at(2 * SECOND), 9);
        // Unseen for longer than the quiet time and two spans: forgotten.
        assert!(table.sweep(10 * SECOND, false).is_empty());
        assert!(table.shards.iter().all(|s| s.lock().unwrap().is_empty()));
    }

    #[test]
    fn a_refund_returns_to_the_lease_that_charged_it_only() {
        let (table, policy, bob) = (table(), policy(), Key::new("bob"));
        hold(&table, &bob, lease(10, 0, 60 * SECOND, 60 * SECOND));
        let spent = table.spend(&policy, &bob, 2, SECOND).unwrap();
        assert!(table.refund(&policy, &bob, &spent.receipt, SECOND));
        assert_eq!(table.unspent(&policy, &bob, SECOND), 10);
        let other_window = Receipt::of(1, [120 * SECOND]);
        assert!(!table.refund(&policy, &bob, &other_window, SECOND));
        // Only what was spent from it: a second refund of the same receipt
        // (or a plain decision's) is Redis's.
        assert!(!table.refund(&policy, &bob, &spent.receipt, SECOND));
        table.forget(&policy, &bob);
        assert!(!table.refund(&policy, &bob, &spent.receipt, SECOND));
    }
}
