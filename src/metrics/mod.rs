//! Metrics through the [`metrics`](https://docs.rs/metrics) facade (feature
//! `metrics`): what the limiter decided, how the store is doing, and how fast.
//!
//! tollgate only emits; your application installs a recorder, e.g.
//! `metrics-exporter-prometheus`, and serves its rendering at `/metrics`
//! (see [`describe`] for the setup and `examples/metrics.rs` for an axum app).
//! Without a recorder every emission is a no-op. Install the recorder before
//! the first request: each layer looks its metric handles up once, on first
//! use, and keeps them.
//!
//! | metric | type | labels | what |
//! |---|---|---|---|
//! | [`tollgate_decisions_total`](DECISIONS) | counter | `policy`, `outcome` | one per request, by what happened to it |
//! | [`tollgate_store_errors_total`](STORE_ERRORS) | counter | `policy`, `kind` | store calls (checks and refunds) that failed or missed the deadline; `kind` is `timeout`, `unavailable`, `protocol` or `rejected` |
//! | [`tollgate_store_latency_seconds`](STORE_LATENCY) | histogram | `policy` | time waited on a main store that is awaited (Redis, or a store of yours without [`check_now`](crate::Store::check_now)) per decision, failures and timeouts included; an in-process store (the memory store) answers without waiting and is not timed |
//! | [`tollgate_local_cache_hits_total`](LOCAL_CACHE_HITS) | counter | `policy` | decisions answered from the in-process cache without a store call |
//! | [`tollgate_active_callers`](ACTIVE_CALLERS) | gauge | `policy` | a [`Throttle`](crate::throttle::Throttle)'s estimate of distinct callers in its window, set every round for each policy it gates |
//! | [`tollgate_script_reloads_total`](SCRIPT_RELOADS) | counter | `script` | Redis answered `NOSCRIPT` (first use, `SCRIPT FLUSH`, a restart or failover) and the script was sent again |
//! | [`tollgate_replica_fallbacks_total`](REPLICA_FALLBACKS) | counter | | a read-only call (peek or pre-check) a replica failed, asked of the primary instead |
//! | [`tollgate_leases_total`](LEASES) | counter | `policy` | leases a Redis store with [leases](crate::store::Leases) took for hot callers |
//! | [`tollgate_leased_units_total`](LEASED_UNITS) | counter | `policy` | units those leases charged in Redis beyond the requests that asked |
//! | [`tollgate_lease_decisions_total`](LEASE_DECISIONS) | counter | `policy` | requests decided from a lease in hand, without a call to Redis: beside `tollgate_decisions_total`, the share that leases decide |
//! | [`tollgate_lease_units_returned_total`](LEASE_UNITS_RETURNED) | counter | `policy` | unspent lease units given back to Redis when their lease ended |
//! | [`tollgate_settled_units_total`](SETTLED_UNITS) | counter | `policy`, `direction` | units a response's actual cost ([`ActualCost`](crate::ActualCost)) charged beyond the estimate (`charged`) or gave back (`given_back`, refunded `304`s included), counted when the store took them |
//! | [`tollgate_overrides_total`](OVERRIDES) | counter | `policy`, `change` | overrides an operator `set` or `cleared` through a [`RateLimiter`](crate::RateLimiter) |
//! | [`tollgate_policy_limits_total`](POLICY_LIMITS) | counter | `policy`, `limit`, `change` | runtime limits (`limit`) and caps (`cap`) for every caller an operator `set` or `cleared` |
//! | [`tollgate_blocks_total`](BLOCKS) | counter | `policy`, `by` | blocks a [penalty box](crate::PenaltyBox) started, `by` the caller's `strikes` or an `operator` |
//!
//! Store failures are logged by state, not by call: a warning when the
//! store starts failing, an info line when it answers again; the counters
//! above count every call in between. `NOSCRIPT` reloads and replica
//! fallbacks are debug events.
//!
//! `outcome` is one of:
//!
//! | outcome | the request | in [shadow mode](crate::RateLimitLayerBuilder::shadow) |
//! |---|---|---|
//! | `allowed` | passed: the store said yes | same |
//! | `limited` | rejected (429/403): over the limit, by the store or the local fallback | never; counted as `shadow_limited` |
//! | `shadow_limited` | passed although over the limit (not charged) | |
//! | `key_error` | rejected (400): no key could be taken from it | passes, still counted as `key_error` |
//! | `fail_open` | passed: the store failed and the failure policy let it through | also what fail-closed does |
//! | `fail_closed` | rejected (503): the store failed and the failure policy is closed | never; counted as `fail_open` |
//! | `fallback` | passed: the store failed and the local fallback said yes | same |
//! | `allow_listed` | passed without asking the store | same |
//! | `deny_listed` | rejected without asking the store | same: deny lists are enforced |
//! | `throttled` | rejected (429) without asking the store: a new caller while [throttling](crate::throttle::Throttle) | passes on to the limit; see `Throttle::stats().refused` |
//!
//! Labels are bounded: `policy` is a policy's name, never a caller's key.
//! Handles are cached per layer, so counting a request allocates nothing.

// The metrics recorded when the feature is on, or their no-op twin (the
// same crate-private functions, with empty bodies) when it is off: `imp` is
// whichever is compiled, so callers name neither.
#[cfg(not(feature = "metrics"))]
mod off;
mod outcome;
#[cfg(feature = "metrics")]
mod recorded;

#[cfg(not(feature = "metrics"))]
use self::off as imp;
#[cfg(feature = "metrics")]
use self::recorded as imp;

// The Redis store counts reloads, replica fallbacks and leases, the throttle
// its active callers; without them those counts go unused (their
// definitions say so too).
#[cfg_attr(
    not(all(feature = "redis", feature = "throttle")),
    allow(unused_imports)
)]
pub(crate) use self::imp::{
    active_callers, block_started, lease_returned, lease_taken, local_cache_hit, override_changed,
    policy_limit_changed, replica_fallback, script_reload, settled, LeaseDecisions, PolicyMetrics,
    Stopwatch,
};
pub(crate) use self::outcome::Outcome;
#[cfg(feature = "metrics")]
pub use self::recorded::{
    describe, ACTIVE_CALLERS, BLOCKS, DECISIONS, LATENCY_BUCKETS, LEASED_UNITS, LEASES,
    LEASE_DECISIONS, LEASE_UNITS_RETURNED, LOCAL_CACHE_HITS, OVERRIDES, POLICY_LIMITS,
    REPLICA_FALLBACKS, SCRIPT_RELOADS, SETTLED_UNITS, STORE_ERRORS, STORE_LATENCY,
};
