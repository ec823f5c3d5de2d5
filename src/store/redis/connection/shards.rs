//! Sharding in the application, the layout GitHub describes: several
//! independent Redis primaries, each caller's keys on one of them, writes to
//! that primary and (optionally) read-only peeks to its replicas.
//!
//! A decision's keys all share one hash tag (`{policy|key}`, see
//! [`KeySpace`](crate::store::KeySpace)), so the tag picks the shard and one
//! decision never spans two shards. Here, which shard owns a tag and how a
//! call reaches it; the shard list and its options are
//! [`ShardedConfig`](crate::store::ShardedConfig)'s.

use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};

use redis::aio::ConnectionManager;
use redis::{RedisResult, ToRedisArgs, Value};
use sha2::{Digest, Sha256};

use crate::store::redis::script::LuaScript;

/// The connected shards; what [`Connection::Sharded`](super::Connection::Sharded) holds.
pub(crate) struct Shards {
    ring: Rendezvous,
    nodes: Vec<ShardNodes>,
    read_from_replicas: bool,
}

/// One shard's connections: its primary, and its replicas in turn.
pub(crate) struct ShardNodes {
    name: String,
    primary: ConnectionManager,
    replicas: Vec<ConnectionManager>,
    next_replica: AtomicUsize,
}

impl ShardNodes {
    pub(crate) fn new(
        name: String,
        primary: ConnectionManager,
        replicas: Vec<ConnectionManager>,
    ) -> Self {
        Self {
            name,
            primary,
            replicas,
            next_replica: AtomicUsize::new(0),
        }
    }
}

impl fmt::Debug for Shards {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Shards")
            .field("names", &self.ring.names)
            .field(
                "replicas",
                &self
                    .nodes
                    .iter()
                    .map(|n| n.replicas.len())
                    .collect::<Vec<_>>(),
            )
            .field("read_from_replicas", &self.read_from_replicas)
            .finish()
    }
}

impl Shards {
    /// The shards `ring` names, connected as `nodes` (in the ring's order).
    pub(crate) fn new(ring: Rendezvous, nodes: Vec<ShardNodes>, read_from_replicas: bool) -> Self {
        Self {
            ring,
            nodes,
            read_from_replicas,
        }
    }

    /// Whether read-only calls may go to a replica.
    pub(crate) fn reads_from_replicas(&self) -> bool {
        self.read_from_replicas && self.nodes.iter().any(|n| !n.replicas.is_empty())
    }

    /// Each shard's primary, in the order [`shard_of`](Self::shard_of) counts.
    pub(crate) fn primaries(&self) -> impl Iterator<Item = ConnectionManager> + '_ {
        self.nodes.iter().map(|n| n.primary.clone())
    }

    /// The index of the shard that owns `keys` (their shared hash tag).
    pub(crate) fn shard_of(&self, keys: &[String]) -> usize {
        let tag = keys.first().map_or("", |k| hash_tag(k));
        debug_assert!(keys.iter().all(|k| hash_tag(k) == tag), "{keys:?}");
        self.ring.pick(tag)
    }

    /// Runs `script` on the shard that owns `keys` (their shared hash tag):
    /// on its primary, or for a read-only call on a replica when configured,
    /// falling back to the primary if the replica fails.
    pub(crate) async fn eval<A: ToRedisArgs + Sync>(
        &self,
        script: &LuaScript,
        keys: &[String],
        args: &[A],
        read_only: bool,
    ) -> RedisResult<Value> {
        let node = &self.nodes[self.shard_of(keys)];
        if read_only && self.read_from_replicas && !node.replicas.is_empty() {
            let i = node.next_replica.fetch_add(1, Ordering::Relaxed) % node.replicas.len();
            match script
                .eval(&mut node.replicas[i].clone(), keys, args, true)
                .await
            {
                Ok(value) => return Ok(value),
                Err(err) => {
                    crate::metrics::replica_fallback();
                    tracing::debug!(
                    shard = node.name,
                    replica = i,
                    error = %err,
                    "replica failed a peek; asking the primary"
                    )
                }
            }
        }
        script
            .eval(&mut node.primary.clone(), keys, args, read_only)
            .await
    }
}

/// The part of `key` Redis Cluster hashes: the text between the first `{`
/// and the next `}` when that is not empty, else the whole key.
fn hash_tag(key: &str) -> &str {
    key.find('{')
        .and_then(|open| {
            let rest = &key[open + 1..];
            rest.find('}')
                .filter(|&close| close > 0)
                .map(|close| &rest[..close])
        })
        .unwrap_or(key)
}

/// Rendezvous (highest random weight) hashing over named shards.
///
/// Written here rather than taken from a crate because the map must be
/// identical on every app server, whatever Rust version built it: a caller
/// mapped to two different shards by two servers gets twice the limit. The
/// crates at hand hash through std's `Hash` trait, whose byte stream Rust
/// does not promise to keep (and `hrw` seeds it randomly per process);
/// `rendezvous_hash` is unmaintained since 2019. Here every input is fixed
/// forever: the tag's SHA-256 (already a dependency) gives 64 bits, each
/// shard's name gives a 64-bit seed the same way, and a shard's score is
/// `fmix64(tag ^ seed)` (MurmurHash3's finaliser, a bijection that spreads
/// every input bit over the output), so scores for one tag look independent
/// across shards. One hash per decision plus a few multiplications per shard.
#[derive(Clone)]
pub(crate) struct Rendezvous {
    names: Vec<String>,
    seeds: Vec<u64>,
}

impl Rendezvous {
    /// Shards called `names`, in any order (the map does not depend on it).
    pub(crate) fn new(names: &[&str]) -> Result<Self, String> {
        if names.is_empty() {
            return Err("a sharded store needs at least one shard".into());
        }
        for (i, name) in names.iter().enumerate() {
            if name.is_empty() || name.chars().any(char::is_control) {
                return Err(format!(
                    "shard name {name:?} must be non-empty, without control characters"
                ));
            }
            if names[..i].contains(name) {
                return Err(format!("shard name {name:?} is used twice"));
            }
        }
        Ok(Self {
            names: names.iter().map(ToString::to_string).collect(),
            seeds: names.iter().map(|name| digest64(name)).collect(),
        })
    }

    /// Index of the shard that owns `tag`.
    pub(crate) fn pick(&self, tag: &str) -> usize {
        self.pick_digest(digest64(tag))
    }

    /// Index of the shard scoring highest for a tag whose [`digest64`] is
    /// `tag`; ties (a 2^-64 chance) go to the smaller name, so the order of
    /// the list never matters.
    fn pick_digest(&self, tag: u64) -> usize {
        let mut best = 0;
        let mut best_score = fmix64(tag ^ self.seeds[0]);
        for (i, &seed) in self.seeds.iter().enumerate().skip(1) {
            let score = fmix64(tag ^ seed);
            if score > best_score || (score == best_score && self.names[i] < self.names[best]) {
                best = i;
                best_score = score;
            }
        }
        best
    }
}

/// The first 8 bytes of SHA-256, big-endian.
fn digest64(text: &str) -> u64 {
    let digest = Sha256::digest(text.as_bytes());
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    u64::from_be_bytes(first)
}

/// MurmurHash3's 64-bit finaliser.
fn fmix64(mut k: u64) -> u64 {
    k ^= k >> 33;
    k = k.wrapping_mul(0xff51_afd7_ed55_8ccd);
    k ^= k >> 33;
    k = k.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    k ^ (k >> 33)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::key::Key;
    use crate::policy::Policy;
    use crate::quota::Quota;
    use crate::store::KeySpace;

    /// The tags of real decision keys for `n` random callers.
    fn tags(n: usize) -> Vec<String> {
        let policy = Policy::fixed_window("core", Quota::new(10, Duration::from_secs(1)).unwrap());
        let space = KeySpace::default();
        // A small xorshift: random-looking callers, the same on every run.
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let key = Key::new(format!("caller-{x:016x}"));
                hash_tag(&space.quota_keys(&policy, &key)[0]).to_owned()
            })
            .collect()
    }

    #[test]
    fn hash_tag_follows_redis_rules() {
        assert_eq!(hash_tag("tollgate:{core|bob}:fixed_window:0"), "core|bob");
        assert_eq!(hash_tag("a{}b{c}"), "a{}b{c}");
        assert_eq!(hash_tag("plain"), "plain");
        assert_eq!(hash_tag("x{open"), "x{open");
    }

    /// The digests of `tags(100_000)`, computed once for the tests below.
    fn digests() -> &'static [u64] {
        static DIGESTS: std::sync::OnceLock<Vec<u64>> = std::sync::OnceLock::new();
        DIGESTS.get_or_init(|| tags(100_000).iter().map(|t| digest64(t)).collect())
    }

    #[test]
    fn callers_spread_within_ten_percent_of_even() {
        let tags = digests();
        for n in [2usize, 3] {
            let names: Vec<String> = (0..n).map(|i| format!("shard-{i}")).collect();
            let names: Vec<&str> = names.iter().map(String::as_str).collect();
            let ring = Rendezvous::new(&names).unwrap();
            let mut counts = vec![0usize; n];
            for &tag in tags {
                counts[ring.pick_digest(tag)] += 1;
            }
            let even = tags.len() / n;
            println!("{n} shards, {} callers: {counts:?}", tags.len());
            for &c in &counts {
                assert!(c.abs_diff(even) * 10 <= even, "{n} shards: {counts:?}");
            }
        }
    }

    #[test]
    fn adding_a_shard_moves_only_its_share_and_only_to_it() {
        let tags = digests();
        for n in [2usize, 3, 4] {
            let before: Vec<String> = (0..n).map(|i| format!("shard-{i}")).collect();
            let mut after = before.clone();
            after.push(format!("shard-{n}"));
            let before_ring =
                Rendezvous::new(&before.iter().map(String::as_str).collect::<Vec<_>>()).unwrap();
            let after_ring =
                Rendezvous::new(&after.iter().map(String::as_str).collect::<Vec<_>>()).unwrap();
            let mut moved = 0;
            for &tag in tags {
                let (old, new) = (before_ring.pick_digest(tag), after_ring.pick_digest(tag));
                if old != new {
                    assert_eq!(new, n, "a key moved between two old shards");
                    moved += 1;
                }
            }
            let share = moved as f64 / tags.len() as f64;
            let ideal = 1.0 / (n + 1) as f64;
            println!(
                "{n} -> {} shards: {share:.4} of keys moved (1/N = {ideal:.4})",
                n + 1
            );
            assert!(
                share <= ideal + 0.01 && share >= ideal - 0.01,
                "{n} -> {} shards moved {share:.4}, ideal {ideal:.4}",
                n + 1
            );
        }
    }

    #[test]
    fn the_map_depends_on_names_not_their_order() {
        let ab = Rendezvous::new(&["a", "b", "c"]).unwrap();
        let ba = Rendezvous::new(&["c", "a", "b"]).unwrap();
        for tag in tags(2_000) {
            assert_eq!(ab.names[ab.pick(&tag)], ba.names[ba.pick(&tag)]);
        }
    }

    #[test]
    fn the_map_is_pinned_across_releases() {
        // If this fails, the hash changed: every deployed app server would
        // disagree with the new build about where callers live.
        let ring = Rendezvous::new(&["a", "b", "c"]).unwrap();
        let picks: String = [
            "core|bob",
            "core|alice",
            "core|1.2.3.4",
            "core|2001:db8::/64",
            "search|k",
            "search|sha256:0123456789abcdef",
            "graphql|carol",
            "core|dave",
        ]
        .iter()
        .map(|t| ring.names[ring.pick(t)].as_str())
        .collect();
        assert_eq!(picks, PINNED);
    }

    const PINNED: &str = "baacacbb";

    #[test]
    fn bad_shard_lists_are_refused() {
        assert!(Rendezvous::new(&[]).is_err());
        assert!(Rendezvous::new(&["a", "a"]).is_err());
        assert!(Rendezvous::new(&[""]).is_err());
        assert!(Rendezvous::new(&["a\n"]).is_err());
    }
}
