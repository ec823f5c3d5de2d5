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

    /// What the hash tag of a decision's keys names: the policy and the
    /// caller, or the policy alone when a quota is shared by every caller.
    /// The memory store hashes this to pick a shard without building a tag.
    pub(crate) fn tagged<'a>(policy: &'a Policy, key: &'a Key) -> (&'a str, Option<&'a Key>) {
        if policy.strategy().has_resource_quota() {
            (policy.name(), None)
        } else {
            (policy.name(), Some(key))
        }
    }

    /// `{prefix}:{~throttle|name}`: the tag of a throttle's filters. `~`
    /// cannot occur in policy names, so no policy's tag can equal it.
    pub(crate) fn throttle_tag(&self, name: &str) -> String {
        format!("{}:{{~throttle|{name}}}", self.prefix)
    }

    /// One key per quota, named by strategy so that changing a policy's
    /// strategy never reads another algorithm's state.
    ///
    /// Each name is built in a string of its own, sized once: the Redis
    /// store sends them as they are, so this allocates a vector and one
    /// string per key, nothing else.
    pub(crate) fn quota_keys(&self, policy: &Policy, key: &Key) -> Vec<String> {
        let tagged = Self::tagged(policy, key);
        let strategy = policy.strategy().as_str();
        let stem = self.prefix.len() + tagged.0.len() + key.as_str().len() + strategy.len() + 6;
        let name = |part: &str, index: Option<usize>| {
            let mut name = String::with_capacity(stem + part.len() + 4);
            self.push_tag(&mut name, tagged);
            name.push(':');
            name.push_str(strategy);
            name.push(':');
            name.push_str(part);
            if let Some(i) = index {
                push_index(&mut name, i);
            }
            name
        };
        if policy.strategy().has_resource_quota() {
            // The resource's log, then this consumer's (quota 0, quota 1).
            return vec![
                name("resource", None),
                name("consumer:", None) + key.as_str(),
            ];
        }
        (0..policy.quotas().len())
            .map(|i| name("", Some(i)))
            .collect()
    }

    /// [`quota_keys`](Self::quota_keys), written into `names` (cleared
    /// first): the memory store reuses one `KeyNames` per shard, so naming a
    /// decision's keys allocates nothing once the buffer has grown.
    pub(crate) fn name_quota_keys(&self, policy: &Policy, key: &Key, names: &mut KeyNames) {
        names.text.clear();
        names.ends.clear();
        let strategy = policy.strategy().as_str();
        if policy.strategy().has_resource_quota() {
            // The resource's log, then this consumer's (quota 0, quota 1).
            for (i, part) in ["resource", "consumer:"].into_iter().enumerate() {
                self.push_tag(&mut names.text, Self::tagged(policy, key));
                names.text.push(':');
                names.text.push_str(strategy);
                names.text.push(':');
                names.text.push_str(part);
                if i == 1 {
                    names.text.push_str(key.as_str());
                }
                names.ends.push(names.text.len());
            }
            return;
        }
        for i in 0..policy.quotas().len() {
            self.push_tag(&mut names.text, Self::tagged(policy, key));
            names.text.push(':');
            names.text.push_str(strategy);
            names.text.push(':');
            push_index(&mut names.text, i);
            names.ends.push(names.text.len());
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

/// The names of one decision's keys, in one buffer: see
/// [`KeySpace::name_quota_keys`].
#[derive(Debug, Default)]
pub(crate) struct KeyNames {
    text: String,
    /// Where each name ends in `text`.
    ends: Vec<usize>,
}

impl KeyNames {
    /// The names, quota 0 first.
    pub(crate) fn iter(&self) -> impl Iterator<Item = &str> {
        let starts = std::iter::once(0).chain(self.ends.iter().copied());
        starts
            .zip(&self.ends)
            .map(|(start, &end)| &self.text[start..end])
    }

    /// Quota 0's name (empty for a policy without quotas, which cannot be
    /// built).
    pub(crate) fn first(&self) -> &str {
        self.ends.first().map_or("", |&end| &self.text[..end])
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
    }

    #[test]
    fn reused_key_names_hold_only_the_latest_decisions_keys() {
        let q = Quota::new(1, Duration::from_secs(1)).unwrap();
        let space = KeySpace::default();
        let mut names = KeyNames::default();
        let policies = [
            Policy::fixed_window("a", q).and(q).and(q),
            Policy::sliding_log("b", q, q),
            Policy::gcra("c", q, std::num::NonZeroU32::MIN),
        ];
        for policy in &policies {
            let key = Key::new("k");
            space.name_quota_keys(policy, &key, &mut names);
            let named: Vec<&str> = names.iter().collect();
            assert_eq!(named, space.quota_keys(policy, &key));
            assert_eq!(names.first(), named[0]);
        }
    }
}
