//! The memory store's half of `lua/caller.lua`: a caller's own rules around
//! its strategy's decision. An operator's [`Override`] replaces the
//! policy's quotas; the [`PenaltyBox`](crate::PenaltyBox) refuses a caller
//! blocked, and counts each rejection as a strike. Mirrors the script line
//! for line; change both together.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use super::names::KeyNames;
use super::shard::Shard;
use super::state::State;
use crate::decision::Decision;
use crate::error::{StoreError, StoreErrorKind};
use crate::key::Key;
use crate::overrides::Override;
use crate::penalty::Record;
use crate::policy::Policy;

/// Kept past its last use, as the Redis key is: cleanup only.
const GRACE_MICROS: u64 = 1_000_000;

/// The most overrides one memory store keeps: configuration an operator
/// writes, so a full store refuses a new one rather than forgetting one.
pub(crate) const MAX_OVERRIDES: usize = 100_000;

/// Whose override: the policy, its strategy and the caller.
type Owner = (Arc<str>, &'static str, Key);

/// Every override the store keeps, apart from the counters: they never
/// expire unless given an end, and are read only for an overridable policy.
#[derive(Debug, Default)]
pub(crate) struct Overrides {
    by_owner: RwLock<HashMap<Owner, Override>>,
}

fn owner(policy: &Policy, key: &Key) -> Owner {
    (
        policy.shared_name().clone(),
        policy.strategy().as_str(),
        key.clone(),
    )
}

impl Overrides {
    /// `key`'s override under `policy`, in force at `now`.
    pub(crate) fn get(&self, policy: &Policy, key: &Key, now: u64) -> Option<Override> {
        let map = self.by_owner.read().unwrap_or_else(|p| p.into_inner());
        map.get(&owner(policy, key))
            .filter(|o| o.in_force(now))
            .cloned()
    }

    pub(crate) fn set(&self, policy: &Policy, key: &Key, o: &Override) -> Result<(), StoreError> {
        let mut map = self.by_owner.write().unwrap_or_else(|p| p.into_inner());
        let owner = owner(policy, key);
        if map.len() >= MAX_OVERRIDES && !map.contains_key(&owner) {
            return Err(StoreError::new(
                StoreErrorKind::Rejected,
                format!("the memory store keeps at most {MAX_OVERRIDES} overrides"),
            ));
        }
        map.insert(owner, o.clone());
        Ok(())
    }

    pub(crate) fn clear(&self, policy: &Policy, key: &Key, now: u64) -> bool {
        let mut map = self.by_owner.write().unwrap_or_else(|p| p.into_inner());
        map.remove(&owner(policy, key))
            .is_some_and(|o| o.in_force(now))
    }

    /// Every override in force under `policy`; ended ones are dropped.
    pub(crate) fn list(&self, policy: &Policy, now: u64) -> Vec<(Key, Override)> {
        let mut map = self.by_owner.write().unwrap_or_else(|p| p.into_inner());
        map.retain(|_, o| o.in_force(now));
        map.iter()
            .filter(|((name, strategy, _), _)| {
                **name == *policy.name() && *strategy == policy.strategy().as_str()
            })
            .map(|((_, _, key), o)| (key.clone(), o.clone()))
            .collect()
    }
}

/// `policy` with `overridden`'s quotas in force; `None` without one, or
/// for one above an operator's cap, which is set aside while it lasts.
fn with_override(policy: &Policy, overridden: Option<&Override>) -> Option<Policy> {
    overridden
        .filter(|o| policy.cap().is_none_or(|cap| !o.exceeds(cap)))
        .map(|o| policy.with_quotas(o.shared_quotas().clone()))
}

/// What a request of `cost` units would be told, as a dry run (nothing
/// written, no strike counted, as `lua/caller.lua` dry-runs it): judged by
/// `overridden`'s quotas when given (unless above the cap), and held by a
/// block in force.
pub(crate) fn dry_run(
    policy: &Policy,
    overridden: Option<&Override>,
    shard: &mut Shard,
    keys: &KeyNames<'_>,
    now: u64,
    cost: u64,
) -> Decision {
    let in_force = with_override(policy, overridden);
    let policy = in_force.as_ref().unwrap_or(policy);
    let decision = shard.dry_run(keys.iter(), |shard| {
        policy
            .strategy()
            .algorithm()
            .decide(policy, shard, keys, now, cost)
    });
    let blocked_until = match (policy.penalty_box(), shard.get(keys.penalty(), now)) {
        (Some(penalty), Some(State::Penalty(record))) if penalty.keep_until(record) > now => {
            record.blocked_until
        }
        _ => 0,
    };
    if blocked_until > now {
        return decision.blocked_until(blocked_until);
    }
    decision
}

/// The decision for `cost` units under `policy`, judged by `overridden`'s
/// quotas when given, and through the policy's penalty box when it has
/// one, under the lock of `shard`.
pub(crate) fn decide(
    policy: &Policy,
    overridden: Option<&Override>,
    shard: &mut Shard,
    keys: &KeyNames<'_>,
    now: u64,
    cost: u64,
) -> Decision {
    let in_force = with_override(policy, overridden);
    let policy = in_force.as_ref().unwrap_or(policy);
    let algorithm = policy.strategy().algorithm();
    let Some(penalty) = policy.penalty_box() else {
        return algorithm.decide(policy, shard, keys, now, cost);
    };
    let record = match shard.get(keys.penalty(), now) {
        Some(State::Penalty(record)) if penalty.keep_until(record) > now => *record,
        _ => Record::default(),
    };
    if record.blocked_until > now {
        // The request decided as if charged, nothing written: how long its
        // quota would still hold it after the block. A peek (cost 0) asks
        // when a request of one unit would pass.
        let unblocked = shard.dry_run(keys.iter(), |shard| {
            algorithm.decide(policy, shard, keys, now, cost.max(1))
        });
        return unblocked.blocked_until(record.blocked_until);
    }
    let decision = algorithm.decide(policy, shard, keys, now, cost);
    if decision.allowed || cost == 0 {
        return decision;
    }
    let record = penalty.strike(record, now);
    let keep = penalty.keep_until(&record) + GRACE_MICROS;
    shard.put(keys.penalty(), State::Penalty(record), keep);
    if record.blocked_until > now {
        crate::metrics::block_started(policy, "strikes");
        return decision.blocked_until(record.blocked_until);
    }
    decision
}

/// Blocks the caller of `keys` until `until` (µs), keeping its count of
/// blocks so a repeat still doubles.
pub(crate) fn block(policy: &Policy, shard: &mut Shard, keys: &KeyNames<'_>, now: u64, until: u64) {
    let Some(penalty) = policy.penalty_box() else {
        return;
    };
    let mut record = match shard.get(keys.penalty(), now) {
        Some(State::Penalty(record)) if penalty.keep_until(record) > now => *record,
        _ => Record::default(),
    };
    record.blocked_until = until;
    record.strikes = 0;
    let keep = penalty.keep_until(&record) + GRACE_MICROS;
    shard.put(keys.penalty(), State::Penalty(record), keep);
}
