//! What only a real Redis can show: round trips, expiries, script reloads,
//! and what the layer does when Redis is gone or slow.
//!
//! One binary, a file per topic under `tests/redis_store/`.

mod support;

#[path = "redis_store/batch_scripts.rs"]
mod batch_scripts;
#[path = "redis_store/batching.rs"]
mod batching;
#[path = "redis_store/common.rs"]
mod common;
#[path = "redis_store/concurrency_slots.rs"]
mod concurrency_slots;
#[path = "redis_store/expiry.rs"]
mod expiry;
#[path = "redis_store/failure.rs"]
mod failure;
#[path = "redis_store/round_trips.rs"]
mod round_trips;
