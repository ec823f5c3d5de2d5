//! What this server last learned from the main store about each key, so
//! that a switch to the local fallback starts from it rather than from a
//! fresh budget.

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::sync::{Mutex, MutexGuard};
use std::time::Instant;

use crate::decision::Decision;
use crate::key::Key;

const SHARDS: usize = 16;

/// How many keys a layer remembers for its fallback: about 80 bytes each
/// plus the key, shared with the rest of the key's uses (it is an `Arc`).
pub(crate) const CAPACITY: usize = 10_000;

/// The last decision of the main store per key, bounded: a full shard first
/// drops records whose window has ended, then any one record (that key's
/// fallback then starts from a fresh budget, as it did before records).
#[derive(Debug)]
pub(crate) struct Learned {
    shards: Box<[Mutex<HashMap<Key, Seen>>]>,
    per_shard: usize,
    hasher: RandomState,
}

#[derive(Debug, Clone, Copy)]
struct Seen {
    /// Units spent in the reported quota, this decision's included.
    used: u64,
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
}

impl Learned {
    pub(crate) fn new(capacity: usize) -> Self {
        Self {
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
            per_shard: capacity.div_ceil(SHARDS).max(1),
            hasher: RandomState::new(),
        }
    }

    fn shard(&self, key: &Key) -> MutexGuard<'_, HashMap<Key, Seen>> {
        let i = self.hasher.hash_one(key) as usize % SHARDS;
        self.shards[i].lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Remembers the main store's `decision` for `key`.
    pub(crate) fn learn(&self, key: &Key, decision: &Decision) {
        let seen = Seen {
            used: decision.used,
            reset_at: decision.reset_at_micros,
            now: decision.now_micros,
            learnt: Instant::now(),
        };
        let mut shard = self.shard(key);
        if let Some(known) = shard.get_mut(key) {
            *known = seen;
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
