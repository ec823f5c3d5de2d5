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
use crate::quota::Policy;

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

impl KeySpace {
    pub(crate) fn new(prefix: impl Into<String>) -> Result<Self, ConfigError> {
        let prefix = prefix.into();
        if prefix.is_empty()
            || prefix.len() > 64
            || prefix.contains(['{', '}', '|'])
            || prefix.chars().any(char::is_control)
        {
            return Err(ConfigError::new(format!(
                "key prefix {prefix:?} must be 1-64 characters without braces, '|' or control characters"
            )));
        }
        Ok(Self { prefix })
    }

    /// `{prefix}:{{policy|key}}`: the part every key of one decision shares;
    /// `{prefix}:{{policy}}` when a quota is shared by every caller.
    pub(crate) fn tag(&self, policy: &Policy, key: &Key) -> String {
        if policy.strategy().has_resource_quota() {
            let name = policy.name();
            let mut tag = String::with_capacity(self.prefix.len() + name.len() + 3);
            tag.push_str(&self.prefix);
            tag.push_str(":{");
            tag.push_str(name);
            tag.push('}');
            return tag;
        }
        self.tag_with_room(policy, key, 0)
    }

    /// `{prefix}:{{policy|key}}` in a string with `room` bytes to spare.
    /// Built with `push_str`: `format!` was the memory store's largest cost
    /// per decision.
    fn tag_with_room(&self, policy: &Policy, key: &Key, room: usize) -> String {
        let (name, key) = (policy.name(), key.as_str());
        let mut tag = String::with_capacity(self.prefix.len() + name.len() + key.len() + 4 + room);
        tag.push_str(&self.prefix);
        tag.push_str(":{");
        tag.push_str(name);
        tag.push('|');
        tag.push_str(key);
        tag.push('}');
        tag
    }

    /// `{prefix}:{~throttle|name}`: the tag of a throttle's filters. `~`
    /// cannot occur in policy names, so no policy's tag can equal it.
    pub(crate) fn throttle_tag(&self, name: &str) -> String {
        format!("{}:{{~throttle|{name}}}", self.prefix)
    }

    /// One key per quota, named by strategy so that changing a policy's
    /// strategy never reads another algorithm's state.
    pub(crate) fn quota_keys(&self, policy: &Policy, key: &Key) -> Vec<String> {
        let strategy = policy.strategy().as_str();
        if policy.strategy().has_resource_quota() {
            let tag = self.tag(policy, key);
            // The resource's log, then this consumer's (quota 0, quota 1).
            return vec![
                format!("{tag}:{strategy}:resource"),
                format!("{tag}:{strategy}:consumer:{}", key.as_str()),
            ];
        }
        let count = policy.quotas().len();
        // ":{strategy}:{i}", with i < 10 for every strategy's quota limit.
        let suffix = strategy.len() + 4;
        let mut stem = self.tag_with_room(policy, key, suffix);
        stem.push(':');
        stem.push_str(strategy);
        stem.push(':');
        let mut keys = Vec::with_capacity(count);
        for i in 0..count.saturating_sub(1) {
            let mut k = String::with_capacity(stem.len() + 2);
            k.push_str(&stem);
            push_index(&mut k, i);
            keys.push(k);
        }
        if count > 0 {
            // The last key takes the stem itself: one allocation per key.
            push_index(&mut stem, count - 1);
            keys.push(stem);
        }
        keys
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
            keys,
            [
                "tollgate:{tigerfeeding}:sliding_log:resource",
                "tollgate:{tigerfeeding}:sliding_log:consumer:%7Bbob%7D",
            ]
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
        assert_eq!(keys, expected);
        assert_eq!(
            KeySpace::default().tag(&policy, &Key::new("k")),
            "tollgate:{p|k}"
        );
    }
}
