//! Which batcher sends a charging call: the one server's, a shard's, or on
//! Redis Cluster its keys' hash slot's, since one script call may only
//! touch keys of one slot.

use std::sync::OnceLock;

use super::batch::Batcher;
use super::connection::Connection;
use super::shards::hash_tag;

/// Hash slots in Redis Cluster.
const SLOTS: u16 = 16384;

/// The store's batchers, one per place a batch call may go.
#[derive(Debug)]
pub(crate) enum Batchers {
    /// Batching is off: every call goes alone.
    Off,
    /// One per server: the one Redis, or each shard's primary, in the
    /// shards' order.
    PerServer(Vec<Batcher>),
    /// Redis Cluster: one per hash slot, made when the slot is first used
    /// (a table of 16,384 empty cells, 256 KB). Each slot has one call in
    /// flight at a time, and a batch call holds one caller's decisions (see
    /// `one_tag_per_call` in `batch.rs`), so a flood on one caller batches
    /// while a crowd spread over the slots goes out call by call, as
    /// without batching.
    PerSlot(Connection, Box<[OnceLock<Batcher>]>),
}

impl Batchers {
    /// The batchers for `conn`, or none if `on` is false.
    pub(crate) fn new(conn: &Connection, on: bool) -> Self {
        match conn {
            _ if !on => Batchers::Off,
            Connection::Cluster(..) => {
                Batchers::PerSlot(conn.clone(), (0..SLOTS).map(|_| OnceLock::new()).collect())
            }
            Connection::Sharded(shards) => Batchers::PerServer(
                shards
                    .primaries()
                    .map(|primary| Batcher::new(Connection::Manager(primary)))
                    .collect(),
            ),
            _ => Batchers::PerServer(vec![Batcher::new(conn.clone())]),
        }
    }

    /// The batcher for a charging call on `keys` through `conn`, if the
    /// store batches.
    pub(crate) fn for_keys(&self, conn: &Connection, keys: &[String]) -> Option<&Batcher> {
        match (self, conn) {
            (Batchers::Off, _) => None,
            (Batchers::PerServer(all), Connection::Sharded(shards)) => {
                all.get(shards.shard_of(keys))
            }
            (Batchers::PerServer(all), _) => all.first(),
            (Batchers::PerSlot(conn, slots), _) => {
                let slot = slot_of(keys.first()?);
                Some(slots[usize::from(slot)].get_or_init(|| Batcher::new(conn.clone())))
            }
        }
    }

    /// Whether some batcher may have every call slot taken (a hint). On a
    /// cluster the answer is yes without looking, as 16,384 slots are too
    /// many to look at per call; the caller asks its own slot's batcher.
    pub(crate) fn any_busy(&self) -> bool {
        match self {
            Batchers::Off => false,
            Batchers::PerServer(all) => all.iter().any(Batcher::is_busy),
            Batchers::PerSlot(..) => true,
        }
    }
}

/// The Redis Cluster hash slot of `key`, as `CLUSTER KEYSLOT` computes it:
/// CRC16 (XMODEM) of its hash tag, or of the whole key without one.
pub(crate) fn slot_of(key: &str) -> u16 {
    crc16::State::<crc16::XMODEM>::calculate(hash_tag(key).as_bytes()) % SLOTS
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Slots as a Redis 7 cluster's `CLUSTER KEYSLOT` gives them.
    #[test]
    fn slots_match_redis_cluster() {
        for (key, slot) in [
            ("foo", 12182),
            ("bar", 5061),
            ("123456789", 12739),
            ("{user1000}.following", 3443),
            ("user1000", 3443),
            // An empty tag does not count: the whole key is hashed.
            ("a{}b", 13694),
            ("", 0),
            ("tollgate:{core|bob}:fixed_window:0", 10197),
        ] {
            assert_eq!(slot_of(key), slot, "{key}");
        }
    }
}
