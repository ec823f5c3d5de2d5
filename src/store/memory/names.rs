//! The memory store's names for a decision's keys: the same keys the Redis
//! store names `{prefix}:{{policy|key}}:{strategy}:{i}` (see
//! [`KeySpace`](crate::store::keys::KeySpace)), as their parts, hashed once.
//!
//! A decision names its keys without writing any text: each name is the
//! policy, the strategy, the quota's index and the caller's key, and one
//! hash of the policy and the key picks the shard and, mixed with the index,
//! finds the entry. Two names are equal exactly when the Redis store's
//! names for them are: its prefix is the same for every key, the caller's
//! key is escaped, and a policy name cannot contain the separators.

use std::hash::BuildHasher;
use std::sync::Arc;

use foldhash::fast::RandomState;

use crate::key::Key;
use crate::policy::Policy;
use crate::store::keys::{key_count, KeySpace};

/// One decision's key names: the policy and the caller, with the hashes
/// they share. Built on the stack for each decision; borrows both.
#[derive(Debug, Clone, Copy)]
pub(crate) struct KeyNames<'a> {
    policy: &'a Policy,
    key: &'a Key,
    /// What the names' hash tag names (the policy and the caller, or the
    /// policy alone for a limit every caller shares), hashed.
    tag: u64,
    /// For a policy with a limit every caller shares (the sliding log),
    /// the hash of the policy and the caller, for the consumer's name,
    /// which holds the caller after the strategy rather than in the tag.
    consumer: Option<u64>,
}

impl<'a> KeyNames<'a> {
    /// The names of `policy`'s keys for `key`, hashed with `hasher`.
    #[inline]
    pub(crate) fn new(hasher: &RandomState, policy: &'a Policy, key: &'a Key) -> Self {
        let tag = hasher.hash_one(KeySpace::tagged(policy, key));
        // A tag without the caller: the consumer's name holds it instead.
        let consumer = policy
            .strategy()
            .has_resource_quota()
            .then(|| hasher.hash_one((policy.name(), Some(key))));
        Self {
            policy,
            key,
            tag,
            consumer,
        }
    }

    /// Which of `shards` shards holds these keys: one per hash tag, as one
    /// Redis Cluster slot holds them. Taken from bits that the table inside
    /// the shard does not place entries by, so that the keys of one shard
    /// still spread over its table.
    pub(crate) fn shard(&self, shards: usize) -> usize {
        (self.tag >> 32) as usize % shards
    }

    /// Quota 0's name.
    pub(crate) fn first(&self) -> Name<'a> {
        self.name(0)
    }

    /// The names, quota 0 first: one per quota, or for the sliding log the
    /// resource's and then the consumer's.
    pub(crate) fn iter(&self) -> impl Iterator<Item = Name<'a>> + '_ {
        (0..key_count(self.policy)).map(|i| self.name(i))
    }

    /// The caller's entry in the policy's penalty box: beside its
    /// counters, in their shard, under the caller's own name even where
    /// the counters' tag holds the policy alone.
    pub(crate) fn penalty(&self) -> Name<'a> {
        Name {
            hash: mix(self.consumer.unwrap_or(self.tag), PENALTY as usize),
            policy: self.policy.shared_name(),
            strategy: "penalty",
            index: PENALTY,
            caller: Some(self.key),
        }
    }

    fn name(&self, index: usize) -> Name<'a> {
        let (hash, caller) = match self.consumer {
            None => (self.tag, Some(self.key)),
            Some(consumer) if index == 1 => (consumer, Some(self.key)),
            Some(_) => (self.tag, None),
        };
        Name {
            hash: mix(hash, index),
            policy: self.policy.shared_name(),
            strategy: self.policy.strategy().as_str(),
            index: index as u32,
            caller,
        }
    }
}

/// The index of a caller's penalty-box entry: past any quota's.
const PENALTY: u32 = u32::MAX;

/// One key's name, as a decision looks its entry up.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Name<'a> {
    hash: u64,
    policy: &'a Arc<str>,
    strategy: &'static str,
    index: u32,
    /// The caller, where the Redis name holds it: in the tag, or after the
    /// strategy for the sliding log's consumer.
    caller: Option<&'a Key>,
}

impl Name<'_> {
    /// The hash the shard's table places this name by.
    pub(crate) fn hash(&self) -> u64 {
        self.hash
    }

    /// This name, owned, to keep in a new entry: the policy's name shared,
    /// the caller's key copied (inline when short).
    pub(crate) fn owned(self) -> OwnedName {
        OwnedName {
            policy: self.policy.clone(),
            strategy: self.strategy,
            index: self.index,
            caller: self.caller.cloned(),
        }
    }
}

/// A key's name kept in its entry.
#[derive(Debug)]
pub(crate) struct OwnedName {
    policy: Arc<str>,
    strategy: &'static str,
    index: u32,
    caller: Option<Key>,
}

impl OwnedName {
    /// Whether this is `name`'s entry.
    #[inline]
    pub(crate) fn is(&self, name: &Name<'_>) -> bool {
        // The policy's name and the strategy's are most often the very
        // same text: compared by address first.
        self.index == name.index
            && (Arc::ptr_eq(&self.policy, name.policy) || self.policy == *name.policy)
            && (std::ptr::eq(self.strategy, name.strategy) || self.strategy == name.strategy)
            && self.caller.as_ref() == name.caller
    }
}

/// The hash of quota `index`'s name, from its tag's: a different odd
/// multiple xored in per index, so every name of one tag hashes apart.
fn mix(tag: u64, index: usize) -> u64 {
    tag ^ (index as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quota::Quota;
    use crate::store::keys::KeySpace;
    use std::num::NonZeroU32;
    use std::time::Duration;

    /// The memory store's names stand for the Redis store's: as many, in
    /// the same order, and equal exactly when the Redis names are, across
    /// policies that share a name or a strategy and keys that look alike.
    #[test]
    fn names_are_equal_exactly_when_the_redis_names_are() {
        let q = Quota::new(1, Duration::from_secs(1)).unwrap();
        let policies = [
            Policy::fixed_window("a", q).and(q).and(q),
            Policy::fixed_window("a", q),
            Policy::aligned_window("a", q),
            Policy::sliding_log("a", q, q),
            Policy::sliding_log("b", q, q),
            Policy::gcra("c", q, NonZeroU32::MIN),
            Policy::gcra("a|k", q, NonZeroU32::MIN),
        ];
        let keys = ["k", "k2", "a|k", "{k}", ""].map(Key::new);
        let hasher = RandomState::default();
        let space = KeySpace::default();
        let mut all = Vec::new();
        for policy in &policies {
            for key in &keys {
                let names = KeyNames::new(&hasher, policy, key);
                let redis = space.quota_keys(policy, key);
                let ours: Vec<Name<'_>> = names.iter().collect();
                assert_eq!(ours.len(), redis.len(), "{policy:?} {key:?}");
                assert!(names.first().owned().is(&ours[0]));
                all.extend(ours.into_iter().zip(redis));
            }
        }
        for (a, a_redis) in &all {
            for (b, b_redis) in &all {
                let same = a.owned().is(b);
                assert_eq!(same, a_redis == b_redis, "{a_redis} against {b_redis}");
                if same {
                    assert_eq!(a.hash(), b.hash(), "{a_redis}");
                }
            }
        }
    }

    #[test]
    fn the_names_of_one_tag_hash_apart() {
        let q = Quota::new(1, Duration::from_secs(1)).unwrap();
        let policy = (0..7).fold(Policy::fixed_window("p", q), |p, _| p.and(q));
        let key = Key::new("k");
        let names = KeyNames::new(&RandomState::default(), &policy, &key);
        let mut hashes: Vec<u64> = names.iter().map(|n| n.hash()).collect();
        hashes.sort_unstable();
        hashes.dedup();
        assert_eq!(hashes.len(), 8);
    }
}
