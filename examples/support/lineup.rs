//! The strategies every comparison runs: one line per strategy.
//!
//! Shared by `benches/decision.rs`, the zoo's `/strategies/{name}` routes
//! (which `scripts/load.sh` drives) and `examples/lab`, through `#[path]`
//! includes. A strategy added here shows up in all of them.

use std::num::NonZeroU32;
use std::time::Duration;

use tollgate::{Policy, Quota};

/// The longest log a sliding log may keep (its limit's ceiling).
const MAX_LOG: u32 = 1_000_000;

/// One policy per strategy, each named after its strategy, all sized from
/// `quota` (`limit` per `window`):
///
/// - rate limits allow `limit` per `window` (the aligned window's windows
///   end at multiples of `window`); GCRA's burst is `limit` (and
///   its rate at most one per microsecond, its own ceiling);
/// - the sliding log has the same limit for everyone and for each caller,
///   at the same rate over a shorter window when `limit` is above its
///   ceiling of 1,000,000 entries;
/// - the uniform gate lets one call through every `window / limit` (at least
///   1 ms: it cannot pass more than 1,000 calls per second per caller);
/// - the leaky bucket drains at that rate and queues up to `limit`;
/// - the concurrency limit holds `limit` in flight; a request that holds its
///   slot for one window then admits `limit` per `window` too. Its timeout
///   (for slots of crashed servers) is two windows.
///
/// The name is the policy's resource name: it separates the strategies'
/// counters in a shared store and labels them in tables and charts.
pub fn lineup(quota: Quota) -> Vec<Policy> {
    let limit = NonZeroU32::new(quota.limit()).expect("a quota's limit is at least 1");
    let window = quota.window();
    let span = (window / limit.get()).max(Duration::from_millis(1));
    let log = if limit.get() <= MAX_LOG {
        quota
    } else {
        let shorter = window.mul_f64(f64::from(MAX_LOG) / f64::from(limit.get()));
        Quota::new(MAX_LOG, shorter.max(Duration::from_millis(1))).expect("a valid quota")
    };
    // GCRA emits at most one unit per microsecond.
    let gcra = if u128::from(limit.get()) <= window.as_micros() {
        quota
    } else {
        Quota::new(limit.get(), Duration::from_micros(limit.get().into())).expect("a valid quota")
    };
    let timeout = (window * 2).min(Duration::from_secs(365 * 24 * 3600));
    vec![
        Policy::fixed_window("fixed_window", quota),
        Policy::aligned_window("aligned_window", quota),
        Policy::sliding_window("sliding_window", quota),
        Policy::sliding_log("sliding_log", log, log),
        Policy::gcra("gcra", gcra, limit),
        Policy::uniform_gate("uniform_gate", span).expect("a span of 1 ms to a year"),
        Policy::leaky_bucket("leaky_bucket", quota, limit),
        Policy::concurrency("concurrency", limit, timeout).expect("a quota's window is valid"),
    ]
}
