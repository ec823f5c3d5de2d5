//! Which batcher sends a charging call: the one server's, a shard's, or on
//! Redis Cluster one chosen by the call's keys, since one script call may
//! only touch keys of one hash slot.

use std::hash::BuildHasher;
use std::num::NonZeroUsize;
use std::sync::OnceLock;

use foldhash::fast::RandomState;

use super::batch::Batcher;
use super::connection::Connection;

/// Batchers on Redis Cluster: enough that two callers busy at once rarely
/// share one (64 calls in flight meet one another on one or two calls in a
/// hundred).
const CELLS: usize = 4096;

/// The store's batchers, one per place a batch call may go.
#[derive(Debug)]
pub(crate) enum Batchers {
    /// Batching is off: every call goes alone.
    Off,
    /// One per server: the one Redis, or each shard's primary, in the
    /// shards' order.
    PerServer(Vec<Batcher>),
    #[cfg_attr(not(feature = "cluster"), allow(dead_code))]
    /// Redis Cluster: one per cell of a table (64 KB), picked by a hash of
    /// the call's keys and made when the cell is first used. A cell has one
    /// call in flight at a time, and a batch call holds decisions on one
    /// set of keys (one caller's, in practice), so a flood on one caller
    /// batches, a crowd goes out call by call as without batching, and a
    /// call never touches keys that a slot migration may have split apart
    /// more than the lone decision's own. Callers who share a quota's key
    /// (a resource-wide quota) still have keys of their own beside it, so
    /// they batch apart and do not queue behind one another.
    PerKeys(Connection, RandomState, Box<[OnceLock<Batcher>]>),
}

impl Batchers {
    /// The batchers for `conn`, or none if `on` is false; a server's allow
    /// `calls_in_flight` calls on their way before decisions queue.
    pub(crate) fn new(conn: &Connection, on: bool, calls_in_flight: NonZeroUsize) -> Self {
        match conn {
            _ if !on => Batchers::Off,
            #[cfg(feature = "cluster")]
            Connection::Cluster(_) => Batchers::PerKeys(
                conn.clone(),
                RandomState::default(),
                (0..CELLS).map(|_| OnceLock::new()).collect(),
            ),
            Connection::Sharded(shards) => Batchers::PerServer(
                shards
                    .primaries()
                    .map(|primary| Batcher::new(Connection::Manager(primary), calls_in_flight))
                    .collect(),
            ),
            _ => Batchers::PerServer(vec![Batcher::new(conn.clone(), calls_in_flight)]),
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
            (Batchers::PerKeys(conn, hasher, cells), _) => {
                let cell = hasher.hash_one(keys) as usize % CELLS;
                Some(cells[cell].get_or_init(|| Batcher::for_key_sets(conn.clone())))
            }
        }
    }

    /// Whether some batcher may have every call slot taken (a hint). On a
    /// cluster the answer is yes without looking, as its cells are too many
    /// to look at per call; the caller asks its own cell's batcher.
    pub(crate) fn any_busy(&self) -> bool {
        match self {
            Batchers::Off => false,
            Batchers::PerServer(all) => all.iter().any(Batcher::is_busy),
            Batchers::PerKeys(..) => true,
        }
    }
}
