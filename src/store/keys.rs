//! Store key names, shared by every backend.
//!
//! All keys of one decision share the hash tag `{policy|key}`, so they live in
//! one Redis Cluster slot and in one memory-store shard. A strategy with a
//! limit shared by every caller (the sliding log) tags all of a policy's keys
//! `{policy}` instead: `{prefix}:{{policy}}:sliding_log:resource` and
//! `{prefix}:{{policy}}:sliding_log:consumer:{key}`. [`Key`] escapes braces
//! and `|`, and policy names and prefixes cannot contain them, so no caller
//! can choose another caller's tag.

use crate::error::ConfigError;
use crate::key::Key;
use crate::policy::Policy;

#[cfg_attr(not(feature = "redis"), allow(dead_code))]
/// One decision's key names for Redis, inline up to two (every strategy's
/// one-quota form; the sliding log's resource and consumer): no list to
/// allocate per request.
pub(crate) type KeyList = smallvec::SmallVec<[String; 2]>;

/// Names keys under a prefix: `{prefix}:{{policy|key}}:{strategy}:{i}`.
#[derive(Debug, Clone)]
pub(crate) struct KeySpace {
    prefix: String,
}

impl Default for KeySpace {
    fn default() -> Self {
        Self {
            prefix: "tollgate".into(),
        }
    }
}

#[cfg_attr(not(feature = "redis"), allow(dead_code))]
impl KeySpace {
    pub(crate) fn new(prefix: impl Into<String>) -> Result<Self, ConfigError> {
        let prefix = prefix.into();
        if prefix.is_empty()
            || prefix.len() > 64
            || prefix.contains(['{', '}', '|'])
            || prefix.chars().any(char::is_control)
        {
            return Err(ConfigError::KeyPrefix { prefix });
        }
        Ok(Self { prefix })
    }

    /// What the hash tag of a decision's keys names: the policy and the
    /// caller, or the policy alone when a quota is shared by every caller.
    /// The memory store hashes this to pick a shard and find entries
    /// without building a tag.
    pub(crate) fn tagged<'a>(policy: &'a Policy, key: &'a Key) -> (&'a str, Option<&'a Key>) {
        if policy.strategy().has_resource_quota() {
            (policy.name(), None)
        } else {
            (policy.name(), Some(key))
        }
    }

    #[cfg_attr(not(feature = "throttle"), allow(dead_code))]
    /// `{prefix}:{~throttle|name}`: the tag of a throttle's filters. `~`
    /// cannot occur in policy names, so no policy's tag can equal it.
    pub(crate) fn throttle_tag(&self, name: &str) -> String {
        format!("{}:{{~throttle|{name}}}", self.prefix)
    }

    /// One key per quota, named by strategy so that changing a policy's
    /// strategy never reads another algorithm's state.
    ///
    /// Each name is built in a string of its own, sized once: the Redis
    /// store sends them as they are, so this allocates one string per key
    /// (the list itself is inline up to two), nothing else.
    pub(crate) fn quota_keys(&self, policy: &Policy, key: &Key) -> KeyList {
        // The key can appear twice: in the tag, and in a consumer's name.
        let room = self.prefix.len() + policy.name().len() + 2 * key.len() + 40;
        (0..key_count(policy))
            .map(|i| {
                let mut name = String::with_capacity(room);
                self.push_name(&mut name, policy, key, i);
                name
            })
            .collect()
    }

    /// The key of `key`'s override under `policy`, beside its counters (in
    /// their hash tag) and named by strategy as they are:
    /// `{prefix}:{{policy|key}}:{strategy}:override`, or for a policy whose
    /// tag holds the policy alone `...:{strategy}:override:{key}`.
    pub(crate) fn override_key(&self, policy: &Policy, key: &Key) -> String {
        self.caller_key(policy, key, policy.strategy().as_str(), ":override")
    }

    /// The key of `key`'s penalty-box entry under `policy`:
    /// `{prefix}:{{policy|key}}:penalty` (or `...:penalty:{key}`).
    pub(crate) fn penalty_key(&self, policy: &Policy, key: &Key) -> String {
        self.caller_key(policy, key, "penalty", "")
    }

    /// The list of `policy`'s overrides, a hash from caller to override
    /// (`{prefix}:{~overrides|policy}:{strategy}`), which
    /// [`list_overrides`](crate::Store::list_overrides) reads; `~` cannot
    /// occur in policy names, so no policy's tag can equal it.
    pub(crate) fn overrides_list(&self, policy: &Policy) -> String {
        format!(
            "{}:{{~overrides|{}}}:{}",
            self.prefix,
            policy.name(),
            policy.strategy().as_str()
        )
    }

    /// The hash of every policy's runtime limits (`{prefix}:{~limits}`,
    /// see [`PolicyLimits`](crate::PolicyLimits)): one key, read whole by
    /// every app server, written by operators; configuration, no expiry.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn policy_limits_key(&self) -> String {
        format!("{}:{{~limits}}", self.prefix)
    }

    fn caller_key(&self, policy: &Policy, key: &Key, kind: &str, suffix: &str) -> String {
        let tagged = Self::tagged(policy, key);
        let mut out = String::new();
        self.push_tag(&mut out, tagged);
        out.push(':');
        out.push_str(kind);
        out.push_str(suffix);
        if tagged.1.is_none() {
            out.push(':');
            out.push_str(key.as_str());
        }
        out
    }

    /// Appends the name of quota `i`'s key: the tag, the strategy, then the
    /// quota's index, or for a policy with a resource quota (the sliding
    /// log) the resource's log (0) or this consumer's (1).
    fn push_name(&self, out: &mut String, policy: &Policy, key: &Key, i: usize) {
        self.push_tag(out, Self::tagged(policy, key));
        out.push(':');
        out.push_str(policy.strategy().as_str());
        out.push(':');
        if !policy.strategy().has_resource_quota() {
            push_index(out, i);
        } else if i == 0 {
            out.push_str("resource");
        } else {
            out.push_str("consumer:");
            out.push_str(key.as_str());
        }
    }

    /// Appends the hash tag: `{prefix}:{{policy|key}}`, the part every key of
    /// one decision shares, or `{prefix}:{{policy}}` (see [`Self::tagged`]).
    fn push_tag(&self, out: &mut String, (name, key): (&str, Option<&Key>)) {
        out.push_str(&self.prefix);
        out.push_str(":{");
        out.push_str(name);
        if let Some(key) = key {
            out.push('|');
            out.push_str(key.as_str());
        }
        out.push('}');
    }
}

/// How many keys one decision of `policy` uses.
pub(crate) fn key_count(policy: &Policy) -> usize {
    if policy.strategy().has_resource_quota() {
        2
    } else {
        policy.quotas().len()
    }
}

/// Appends `i` in decimal without going through `fmt`.
fn push_index(out: &mut String, i: usize) {
    if i >= 10 {
        push_index(out, i / 10);
    }
    out.push(char::from(b'0' + (i % 10) as u8));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quota::Quota;
    use std::time::Duration;

    #[test]
    fn keys_of_one_decision_share_exactly_one_hash_tag() {
        let q = Quota::new(1, Duration::from_secs(1)).unwrap();
        let policy = Policy::fixed_window("core", q).and(q);
        let keys = KeySpace::default().quota_keys(&policy, &Key::new("{evil}"));
        for k in &keys {
            assert_eq!(k.matches('{').count(), 1, "{k}");
            assert!(
                k.starts_with("tollgate:{core|%7Bevil%7D}:fixed_window:"),
                "{k}"
            );
        }
        assert!(KeySpace::new("a{b").is_err());
    }

    #[test]
    fn a_sliding_logs_resource_and_consumer_keys_share_the_policys_tag() {
        let q = Quota::new(1, Duration::from_secs(1)).unwrap();
        let policy = Policy::sliding_log("tigerfeeding", q, q);
        let keys = KeySpace::default().quota_keys(&policy, &Key::new("{bob}"));
        assert_eq!(
            keys[..],
            [
                "tollgate:{tigerfeeding}:sliding_log:resource",
                "tollgate:{tigerfeeding}:sliding_log:consumer:%7Bbob%7D",
            ]
        );
    }

    #[test]
    fn a_callers_own_rules_live_in_its_counters_hash_tag() {
        let q = Quota::new(1, Duration::from_secs(1)).unwrap();
        let space = KeySpace::default();
        let bob = Key::new("{bob}");
        let window = Policy::fixed_window("api", q);
        assert_eq!(
            space.override_key(&window, &bob),
            "tollgate:{api|%7Bbob%7D}:fixed_window:override"
        );
        assert_eq!(
            space.penalty_key(&window, &bob),
            "tollgate:{api|%7Bbob%7D}:penalty"
        );
        let log = Policy::sliding_log("api", q, q);
        assert_eq!(
            space.override_key(&log, &bob),
            "tollgate:{api}:sliding_log:override:%7Bbob%7D"
        );
        assert_eq!(
            space.penalty_key(&log, &bob),
            "tollgate:{api}:penalty:%7Bbob%7D"
        );
        assert_eq!(
            space.overrides_list(&window),
            "tollgate:{~overrides|api}:fixed_window"
        );
    }

    #[test]
    fn quota_keys_are_numbered_in_order_from_one_shared_stem() {
        let q = Quota::new(1, Duration::from_secs(1)).unwrap();
        let policy = (0..11).fold(Policy::fixed_window("p", q), |p, _| p.and(q));
        let keys = KeySpace::new("x")
            .unwrap()
            .quota_keys(&policy, &Key::new("k"));
        let expected: Vec<String> = (0..12)
            .map(|i| format!("x:{{p|k}}:fixed_window:{i}"))
            .collect();
        assert_eq!(keys[..], expected[..]);
    }
}
