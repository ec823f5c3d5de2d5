//! What this server last learned from the main store about each key, so
//! that a switch to the local fallback starts from it rather than from a
//! fresh budget.

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::{Mutex, MutexGuard};
use std::time::Instant;

use foldhash::fast::RandomState;

use crate::decision::Decision;
use crate::key::Key;

const SHARDS: usize = 16;

/// How many keys a layer remembers for its fallback: about 80 bytes each
/// plus the key, shared with the rest of the key's uses (it is an `Arc`).
pub(crate) const CAPACITY: usize = 10_000;

/// The newest decision of the main store per key, bounded: a full shard
/// first drops records whose window has ended, then any one record (that
/// key's fallback then starts from a fresh budget, as it did before
/// records).
///
/// Newest in Redis's order, not in the order this server handles replies:
/// the replies of one batch, and of calls in flight together, reach their
/// requests' tasks in no particular order, so the last one handled is often
/// not the last one decided (issue 35: a burst of 20 left a record of 11,
/// and one server admitted 59 in a window of 50). See [`Seen::is_newer_than`].
#[derive(Debug)]
pub(crate) struct Learned {
    shards: Box<[Mutex<HashMap<Key, Seen, RandomState>>]>,
    per_shard: usize,
    /// foldhash, as the stores' own tables: this runs on every decision
    /// of a main store.
    hasher: RandomState,
}

#[derive(Debug, Clone, Copy)]
struct Seen {
    /// Units spent in the reported quota, this decision's included.
    used: u64,
    /// Units left in the reported quota (its limit less `used`; a
    /// rejection's `remaining` says 0 even when a cheaper request fits).
    left: u64,
    /// When that quota is whole again, store time, µs.
    reset_at: u64,
    /// The store's time when it decided, µs.
    now: u64,
    /// When it was learned, on this machine's monotonic clock.
    learnt: Instant,
}

impl Seen {
    /// Whether the window it describes is still open, counting store time
    /// on from its `now` with this machine's monotonic clock (so skew
    /// between this machine and the store does not matter).
    fn is_open(&self) -> bool {
        let elapsed = self.learnt.elapsed().as_micros() as u64;
        self.now.saturating_add(elapsed) < self.reset_at
    }

    /// Whether Redis decided this after `other`, for the same key: at a
    /// later store time, or at the same time (one batch reads `TIME` once;
    /// a `ManualClock` stands still) with less left. At one instant every
    /// charge only adds to every quota's count, so what is left of the
    /// quota with least left (the one reported) only falls: within a
    /// window the newest reply is the highest count, whichever quota of
    /// the key it reports, and a new window's reply (decided after the
    /// old window ended) replaces the old window's. Strategies whose
    /// count falls with time (sliding window, GCRA, leaky bucket, sliding
    /// log) keep their latest count this way too.
    fn is_newer_than(&self, other: &Seen) -> bool {
        (self.now, std::cmp::Reverse(self.left)) > (other.now, std::cmp::Reverse(other.left))
    }
}

impl Learned {
    pub(crate) fn new(capacity: usize) -> Self {
        Self {
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
            per_shard: capacity.div_ceil(SHARDS).max(1),
            hasher: RandomState::default(),
        }
    }

    fn shard(&self, key: &Key) -> MutexGuard<'_, HashMap<Key, Seen, RandomState>> {
        let i = self.hasher.hash_one(key) as usize % SHARDS;
        self.shards[i].lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Remembers the main store's `decision` for `key`, unless this server
    /// already handled one that Redis decided after it.
    pub(crate) fn learn(&self, key: &Key, decision: &Decision) {
        let seen = Seen {
            used: decision.spent,
            left: decision.limit.saturating_sub(decision.spent),
            reset_at: decision.reset_at_micros,
            now: decision.now_micros,
            learnt: Instant::now(),
        };
        let mut shard = self.shard(key);
        if let Some(known) = shard.get_mut(key) {
            if seen.is_newer_than(known) {
                *known = seen;
            }
            return;
        }
        if seen.used == 0 {
            return;
        }
        if shard.len() >= self.per_shard {
            shard.retain(|_, s| s.is_open());
            if shard.len() >= self.per_shard {
                let any = shard.keys().next().cloned();
                if let Some(any) = any {
                    shard.remove(&any);
                }
            }
        }
        shard.insert(key.clone(), seen);
    }

    /// Drops `key`'s record (the caller was reset).
    pub(crate) fn forget(&self, key: &Key) {
        self.shard(key).remove(key);
    }

    /// Takes `key`'s record and, if its window is still open with units
    /// spent, hands them to `charge` while no other request can take the
    /// record: a fallback decision for `key` that comes after then sees the
    /// seed charged.
    pub(crate) fn seed(&self, key: &Key, charge: impl FnOnce(u64)) {
        let mut shard = self.shard(key);
        let Some(seen) = shard.remove(key) else {
            return;
        };
        if seen.used > 0 && seen.is_open() {
            charge(seen.used);
        }
        drop(shard);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_seeds_once_and_only_while_its_window_is_open() {
        let learned = Learned::new(16);
        let key = Key::new("k");
        learned.learn(&key, &Decision::allowed(5, 2, 10_000_000, 1_000_000));
        let mut seeded = Vec::new();
        learned.seed(&key, |used| seeded.push(used));
        learned.seed(&key, |used| seeded.push(used));
        assert_eq!(seeded, [2]);

        learned.learn(&key, &Decision::allowed(5, 3, 1_000_000, 1_000_000));
        learned.seed(&key, |used| seeded.push(used));
        assert_eq!(seeded, [2], "a window that has ended seeds nothing");
    }

    /// What `learned` would charge the fallback for `key` now.
    fn seeded(learned: &Learned, key: &Key) -> Option<u64> {
        let mut seeded = None;
        learned.seed(key, |used| seeded = Some(used));
        seeded
    }

    /// Issue 35: the replies of a batched burst were handled in no order,
    /// and whichever came last was kept, so the fallback started from a
    /// count below what Redis had said.
    #[test]
    fn an_older_reply_handled_after_a_newer_one_does_not_lower_the_count() {
        let learned = Learned::new(16);
        let key = Key::new("k");
        let end = u64::MAX;
        // One batch, one `TIME`: counts 1..=20 handled out of order.
        for used in [3, 20, 7, 1, 19, 11] {
            learned.learn(&key, &Decision::allowed(50, used, end, 1_000_000));
        }
        assert_eq!(seeded(&learned, &key), Some(20));

        // A lone call decided earlier, handled after a later one.
        learned.learn(&key, &Decision::allowed(50, 8, end, 2_000_000));
        learned.learn(&key, &Decision::allowed(50, 9, end, 1_999_999));
        assert_eq!(seeded(&learned, &key), Some(8), "by Redis's time");

        // A rejection says `remaining: 0` even with units left for a
        // cheaper request; what is left of the limit orders it.
        learned.learn(&key, &Decision::rejected(50, 47, end, 3_000_000, 1));
        learned.learn(&key, &Decision::allowed(50, 48, end, 3_000_000));
        learned.learn(&key, &Decision::rejected(50, 47, end, 3_000_000, 1));
        assert_eq!(seeded(&learned, &key), Some(48));
    }

    #[test]
    fn a_new_windows_reply_replaces_an_old_windows_whatever_its_count() {
        let learned = Learned::new(16);
        let key = Key::new("k");
        let old = Decision::allowed(50, 40, 30_000_000, 29_000_000);
        let new = Decision::allowed(50, 2, u64::MAX, 30_000_000);
        learned.learn(&key, &old);
        learned.learn(&key, &new);
        learned.learn(&key, &old);
        assert_eq!(seeded(&learned, &key), Some(2));
    }

    /// A key several quotas share reports, at each decision, the quota with
    /// least left; at one instant that only falls, whichever quota it is.
    #[test]
    fn replies_reporting_different_quotas_of_a_key_keep_the_newest() {
        let learned = Learned::new(16);
        let key = Key::new("k");
        let end = u64::MAX;
        // 10 per second and 100 per minute: the minute's quota (95 of 100,
        // 5 left) is reported, then the second's (7 of 10, 3 left).
        let minute = Decision::allowed(100, 95, end, 1_000_000).reporting(1);
        let second = Decision::allowed(10, 7, end, 1_000_000).reporting(0);
        learned.learn(&key, &second);
        learned.learn(&key, &minute);
        assert_eq!(seeded(&learned, &key), Some(7));
    }

    #[test]
    fn memory_stays_within_capacity() {
        let learned = Learned::new(32);
        for i in 0..1000 {
            let decision = Decision::allowed(5, 1, u64::MAX, 0);
            learned.learn(&Key::new(format!("k{i}")), &decision);
        }
        let held: usize = learned.shards.iter().map(|s| s.lock().unwrap().len()).sum();
        assert!(held <= 32, "{held} records");
    }
}
