//! The runtime limits a store knows, by policy, and each policy with them
//! in force: an immutable snapshot that a request reads without writing
//! anything shared (one `ArcSwap` load, and a pointer's clone while a
//! limit is in force, for the pass to carry), replaced whole when a limit
//! changes or one ends. The memory store's own table; a Redis store's copy
//! of what Redis holds, refreshed in the background.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;

use crate::overrides::Override;
use crate::policy::Policy;
use crate::policy_limits::{PolicyLimit, PolicyLimits};
use crate::quota::Quota;

/// By policy name, then strategy.
type ByPolicy = HashMap<Arc<str>, HashMap<String, Known>>;

#[derive(Debug, Default, Clone)]
struct Known {
    limits: PolicyLimits,
    in_force: Option<InForce>,
}

/// The policy in force, kept: for the build-time quotas it was made from
/// (`base`), until when (µs) it holds; `None`: the policy as built.
#[derive(Debug, Clone)]
struct InForce {
    base: Arc<[Quota]>,
    policy: Option<Arc<Policy>>,
    until: u64,
}

/// See the module docs.
#[derive(Debug, Default)]
pub(crate) struct RuntimeLimits {
    /// Set once any limit was known: until then no request looks further.
    any: AtomicBool,
    /// Counts the changes.
    version: AtomicU64,
    /// Counts the changes made through this store (`set`): a read of Redis
    /// begun before one must not undo it.
    writes: AtomicU64,
    /// What requests read.
    snapshot: ArcSwap<ByPolicy>,
    /// Held by whoever replaces the snapshot, so no change is lost to
    /// another made at the same time.
    writing: Mutex<()>,
}

impl RuntimeLimits {
    /// `policy` with the limits in force at `now`; `None`: as built.
    /// `now` is read only once a limit is known.
    pub(crate) fn policy_in_force(
        &self,
        policy: &Policy,
        now: impl FnOnce() -> u64,
    ) -> Option<Arc<Policy>> {
        if !self.any.load(Ordering::Relaxed) {
            return None;
        }
        let now = now();
        let (name, strategy) = (policy.name(), policy.strategy().as_str());
        {
            let snapshot = self.snapshot.load();
            let known = snapshot.get(name)?.get(strategy)?;
            if let Some(kept) = &known.in_force
                && now < kept.until
                && *kept.base == *policy.quotas()
            {
                return kept.policy.clone();
            }
        }
        // A limit changed or ended since the policy in force was kept (or
        // none was yet): once per change, not per request.
        let _writing = self.writing.lock().unwrap_or_else(|p| p.into_inner());
        let mut fresh = ByPolicy::clone(&self.snapshot.load());
        let known = fresh.get_mut(name)?.get_mut(strategy)?;
        let in_force = known.limits.policy_in_force(policy, now).map(Arc::new);
        let until = known.limits.next_end_after(now).unwrap_or(u64::MAX);
        known.in_force = Some(InForce {
            base: policy.quotas().into(),
            policy: in_force.clone(),
            until,
        });
        self.snapshot.store(Arc::new(fresh));
        in_force
    }

    /// Counts the changes (0: none yet).
    pub(crate) fn version(&self) -> u64 {
        self.version.load(Ordering::Relaxed)
    }

    /// What is known of `policy`'s limits, those ended included.
    pub(crate) fn get(&self, policy: &Policy) -> PolicyLimits {
        self.snapshot
            .load()
            .get(policy.name())
            .and_then(|by_strategy| by_strategy.get(policy.strategy().as_str()))
            .map(|k| k.limits.clone())
            .unwrap_or_default()
    }

    /// Sets (or clears, `None`) one of `policy`'s limits.
    pub(crate) fn set(&self, policy: &Policy, which: PolicyLimit, value: Option<Override>) {
        let _writing = self.writing.lock().unwrap_or_else(|p| p.into_inner());
        let mut fresh = ByPolicy::clone(&self.snapshot.load());
        let known = fresh
            .entry(policy.shared_name().clone())
            .or_default()
            .entry(policy.strategy().as_str().to_owned())
            .or_default();
        known.limits.set(which, value);
        known.in_force = None;
        self.snapshot.store(Arc::new(fresh));
        self.any.store(true, Ordering::Relaxed);
        self.version.fetch_add(1, Ordering::Relaxed);
        self.writes.fetch_add(1, Ordering::SeqCst);
    }

    /// Counts the changes made through this store, for
    /// [`replace`](Self::replace).
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn writes(&self) -> u64 {
        self.writes.load(Ordering::SeqCst)
    }

    /// Replaces what is known with `all` (a Redis store's refresh): by
    /// policy name and strategy. `writes` is [`writes`](Self::writes) when
    /// the read began: if this store changed a limit since, the read may
    /// predate it, and is dropped (the next one brings both). An unchanged
    /// read leaves the snapshot as it is.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn replace(&self, all: HashMap<(String, String), PolicyLimits>, writes: u64) {
        let _writing = self.writing.lock().unwrap_or_else(|p| p.into_inner());
        if self.writes() != writes {
            return;
        }
        let old = self.snapshot.load();
        let mut fresh = ByPolicy::new();
        let mut changed = false;
        for ((name, strategy), limits) in all {
            let kept = old
                .get(name.as_str())
                .and_then(|by_strategy| by_strategy.get(&strategy));
            // Unchanged limits keep the policy they put in force.
            let in_force = match kept {
                Some(kept) if kept.limits == limits => kept.in_force.clone(),
                _ => {
                    changed = true;
                    None
                }
            };
            let known = Known { limits, in_force };
            fresh
                .entry(name.into())
                .or_default()
                .insert(strategy, known);
        }
        let count = |m: &ByPolicy| m.values().map(HashMap::len).sum::<usize>();
        if !changed && count(&fresh) == count(&old) {
            return;
        }
        self.snapshot.store(Arc::new(fresh));
        self.any.store(true, Ordering::Relaxed);
        self.version.fetch_add(1, Ordering::Relaxed);
    }
}

/// The field of `policy`'s `which` limit in a Redis store's hash of
/// runtime limits: `name|strategy|limit` (names hold no `|`).
#[cfg_attr(not(feature = "redis"), allow(dead_code))]
pub(crate) fn field(policy: &Policy, which: PolicyLimit) -> String {
    format!(
        "{}|{}|{}",
        policy.name(),
        policy.strategy().as_str(),
        which.as_str()
    )
}

/// Reads the hash of runtime limits back (see [`field`]): by policy name
/// and strategy; fields or values it cannot read are skipped.
#[cfg_attr(not(feature = "redis"), allow(dead_code))]
pub(crate) fn read_fields(pairs: Vec<(String, String)>) -> HashMap<(String, String), PolicyLimits> {
    let mut all: HashMap<(String, String), PolicyLimits> = HashMap::new();
    for (field, text) in pairs {
        let mut parts = field.rsplitn(3, '|');
        let (Some(which), Some(strategy), Some(name)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        let which = match which {
            "limit" => PolicyLimit::Limit,
            "cap" => PolicyLimit::Cap,
            _ => continue,
        };
        let Some(value) = Override::from_text(&text) else {
            continue;
        };
        all.entry((name.to_owned(), strategy.to_owned()))
            .or_default()
            .set(which, Some(value));
    }
    all
}

#[cfg(test)]
mod tests {
    use std::num::NonZeroU32;

    use super::*;

    /// A refresh read before this store's own change landed must not undo
    /// it (the equivalence proptest found one that did).
    #[test]
    fn a_read_older_than_a_change_made_here_does_not_undo_it() {
        let per_min = |n| Quota::per_minute(NonZeroU32::new(n).unwrap());
        let policy = Policy::fixed_window("search", per_min(100)).adjustable();
        let limits = RuntimeLimits::default();
        let before = limits.writes();
        limits.set(&policy, PolicyLimit::Limit, Some(Override::new(per_min(4))));
        limits.replace(HashMap::new(), before);
        let in_force = limits
            .policy_in_force(&policy, || 0)
            .expect("the change stands");
        assert_eq!(in_force.quotas()[0].limit(), 4);
        limits.replace(HashMap::new(), limits.writes());
        assert!(
            limits.policy_in_force(&policy, || 0).is_none(),
            "a newer read does"
        );
    }

    /// A cap kept while a limit that had already ended was on record still
    /// ends on time (the model proptest found one kept forever).
    #[test]
    fn a_kept_limit_ends_on_time_beside_one_that_ended_already() {
        let per_min = |n| Quota::per_minute(NonZeroU32::new(n).unwrap());
        let policy = Policy::fixed_window("search", per_min(100)).adjustable();
        let limits = RuntimeLimits::default();
        let limit = Override::new(per_min(1)).ending_at_micros(1);
        limits.set(&policy, PolicyLimit::Limit, Some(limit));
        let cap = Override::new(per_min(3)).ending_at_micros(1_000);
        limits.set(&policy, PolicyLimit::Cap, Some(cap));
        let capped = limits.policy_in_force(&policy, || 500);
        assert_eq!(capped.expect("the cap is in force").quotas()[0].limit(), 3);
        assert!(
            limits.policy_in_force(&policy, || 1_000).is_none(),
            "the cap ended at 1,000 µs"
        );
    }
}
