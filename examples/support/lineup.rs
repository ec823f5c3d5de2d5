//! The strategies every comparison runs: one line per strategy.
//!
//! Shared by `benches/decision.rs`, the zoo's benchmark routes (which
//! `scripts/load.sh` drives) and `examples/lab.rs`, through `#[path]`
//! includes. A strategy added here shows up in all of them.

use tollgate::{Policy, Quota};

/// One policy per strategy, each named after its strategy, all with `quota`.
///
/// The name is the policy's resource name: it separates the strategies'
/// counters in a shared store and labels them in tables and charts.
pub fn lineup(quota: Quota) -> Vec<Policy> {
    vec![Policy::fixed_window("fixed_window", quota)]
}
