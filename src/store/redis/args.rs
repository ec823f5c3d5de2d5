//! What the strategies hand the Redis store: a script's arguments (all
//! integers, for a decision) and how a receipt is given back.

use super::script::{Args, LuaScript};
use crate::decision::Receipt;
use crate::policy::Policy;

/// How a strategy gives a receipt back in Redis.
pub(crate) enum GiveBack {
    /// A refund script and its arguments, sent alone.
    Refund(&'static LuaScript, Vec<String>),
    /// The release of what a pass held until its response ended: batched,
    /// like the decisions that took it.
    Release(&'static LuaScript, Args),
}

/// Each quota's limit and window (µs), as integer script arguments.
pub(crate) fn quota_ints(policy: &Policy) -> impl Iterator<Item = i64> + '_ {
    policy
        .quotas()
        .iter()
        .flat_map(|q| [int(q.limit()), int(q.window_micros())])
}

/// `x` as a script argument: Lua numbers are doubles, so anything near
/// `i64::MAX` is already far past what a script can tell apart.
pub(crate) fn int(x: impl TryInto<i64>) -> i64 {
    x.try_into().unwrap_or(i64::MAX)
}

/// A receipt's stamps, as script arguments.
pub(crate) fn stamps(receipt: &Receipt) -> impl Iterator<Item = String> + '_ {
    receipt.stamps().iter().map(u64::to_string)
}
