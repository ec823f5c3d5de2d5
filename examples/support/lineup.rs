//! The strategies every comparison runs: one line per strategy.
//!
//! Shared by `benches/decision.rs`, the zoo's `/strategies/{name}` routes
//! (which `scripts/load.sh` drives) and `examples/lab`, through `#[path]`
//! includes. A strategy added here shows up in all of them.

use std::num::NonZeroU32;
use std::time::Duration;

use tollgate::{Policy, Quota};

/// One policy per strategy, each named after its strategy, all sized from
/// `quota` (`limit` per `window`):
///
/// - rate limits allow `limit` per `window`;
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
    let timeout = (window * 2).min(Duration::from_secs(365 * 24 * 3600));
    vec![
        Policy::fixed_window("fixed_window", quota),
        Policy::leaky_bucket("leaky_bucket", quota, limit),
        Policy::concurrency("concurrency", limit, timeout).expect("a quota's window is valid"),
    ]
}
