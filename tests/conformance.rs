//! The conformance suite against the memory store and a single Redis (with
//! and without the pre-check).
//! (Cluster and sharded topologies run it from `tests/topologies.rs`.)

mod support;

use support::conformance::{Backend, T0};
use tollgate::clock::ManualClock;
use tollgate::{MemoryStore, RedisStore};

async fn memory() -> Backend {
    let clock = ManualClock::new(T0);
    Backend::new(MemoryStore::with_clock(clock.clone()), clock)
}

async fn single_redis() -> Backend {
    let clock = ManualClock::new(T0);
    let client = redis::Client::open(support::redis::shared_url()).unwrap();
    let conn = client.get_connection_manager().await.unwrap();
    let store = RedisStore::from_manager(conn)
        .prefix(support::redis::unique_prefix("conf"))
        .clock(clock.clone())
        .build()
        .unwrap();
    Backend::new(store, clock)
}

/// A store that asks first with the read-only twin of each script, the same
/// cost and no writes, then charges: every table must decide as without it.
async fn pre_checking_redis() -> Backend {
    let clock = ManualClock::new(T0);
    let client = redis::Client::open(support::redis::shared_url()).unwrap();
    let conn = client.get_connection_manager().await.unwrap();
    let store = RedisStore::from_manager(conn)
        .prefix(support::redis::unique_prefix("conf-pre"))
        .clock(clock.clone())
        .pre_check(true)
        .build()
        .unwrap();
    Backend::new(store, clock)
}

mod memory_store {
    crate::conformance_suite!(crate::memory);
}

mod redis_store {
    crate::conformance_suite!(crate::single_redis);
}

mod pre_checking_redis_store {
    crate::conformance_suite!(crate::pre_checking_redis);
}

/// A Redis store leasing to a caller from its first decision: the
/// give-back rows (`in_force`), whose passes come from a lease after the
/// first, must read as they do on a store without leases.
async fn leasing_redis() -> Backend {
    let clock = ManualClock::new(T0);
    let client = redis::Client::open(support::redis::shared_url()).unwrap();
    let conn = client.get_connection_manager().await.unwrap();
    let store = RedisStore::from_manager(conn)
        .prefix(support::redis::unique_prefix("conf-lease"))
        .clock(clock.clone())
        .leases(tollgate::store::Leases::new().hot_after(std::num::NonZeroU32::MIN))
        .build()
        .unwrap();
    Backend::new(store, clock)
}

mod leasing_redis_store {
    crate::in_force_counted_rows!(crate::leasing_redis);
}
