//! What the strategies hand the Redis store: a script's arguments (all
//! integers, for a decision) and how a receipt is given back.

use super::script::{Args, LuaScript};
use crate::decision::Receipt;
use crate::policy::Policy;

/// Where a script takes its `now` (`ARGV[1]` of every decision and
/// refund script, µs): the one integer that carries it is written and read
/// here only.
///
/// On the wire: -1 is Redis `TIME`; below -1, Redis `TIME` with a deadline
/// folded in (`-until`, `lua/timed.lua`); 0 or more, the store's own clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ScriptNow {
    /// Redis `TIME`: every app server judged by one clock.
    RedisTime,
    /// Redis `TIME`, and the call is no longer wanted once Redis's time
    /// passes `until` (µs): a charging script that runs later writes
    /// nothing and says so (its request was already answered).
    RedisTimeUntil(u64),
    /// The store's own clock's now (a `ManualClock` in tests), µs.
    Store(u64),
}

impl ScriptNow {
    /// As the script's `ARGV[1]`.
    pub(crate) fn arg(self) -> i64 {
        match self {
            ScriptNow::RedisTime => -1,
            // Never -1 or above: an `until` of 0 or 1 means no deadline.
            ScriptNow::RedisTimeUntil(until) if until > 1 => -int(until),
            ScriptNow::RedisTimeUntil(_) => -1,
            ScriptNow::Store(now) => int(now),
        }
    }

    /// Reads `ARGV[1]` back.
    fn of_arg(arg: i64) -> Self {
        match arg {
            -1 => ScriptNow::RedisTime,
            until if until < -1 => ScriptNow::RedisTimeUntil(until.unsigned_abs()),
            now => ScriptNow::Store(now.max(0) as u64),
        }
    }

    /// This source with a deadline: Redis's time gets `until` (Redis time,
    /// µs; 0 for none); a store clock keeps no deadline in a lone call.
    pub(crate) fn until(self, until: i64) -> Self {
        match self {
            ScriptNow::RedisTime if until > 1 => ScriptNow::RedisTimeUntil(until as u64),
            other => other,
        }
    }
}

/// Where a decision script's cost is in its arguments (`ARGV[2]`).
const COST: usize = 1;

/// The cost a decision script's `args` charge.
pub(crate) fn cost_of(args: &[i64]) -> i64 {
    args.get(COST).copied().unwrap_or(0)
}

/// A lone charge's arguments with its `until` (`lua/timed.lua`): folded
/// into `now`, so the deadline costs Redis no argument of its own.
/// Batches send each decision's `until` beside its arguments instead.
pub(crate) fn with_until(args: &mut [i64], until: i64) {
    if let Some(now) = args.first_mut() {
        *now = ScriptNow::of_arg(*now).until(until).arg();
    }
}

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_scripts_now_is_one_integer_with_three_meanings_read_and_written_here() {
        assert_eq!(ScriptNow::RedisTime.arg(), -1);
        assert_eq!(ScriptNow::RedisTimeUntil(1_700_000).arg(), -1_700_000);
        assert_eq!(ScriptNow::Store(42).arg(), 42);
        for now in [
            ScriptNow::RedisTime,
            ScriptNow::RedisTimeUntil(9),
            ScriptNow::Store(0),
        ] {
            assert_eq!(ScriptNow::of_arg(now.arg()), now);
        }
        // A deadline folds into Redis's time only, and only a real one.
        assert_eq!(
            ScriptNow::RedisTime.until(5_000),
            ScriptNow::RedisTimeUntil(5_000)
        );
        assert_eq!(ScriptNow::RedisTime.until(0), ScriptNow::RedisTime);
        assert_eq!(ScriptNow::Store(7).until(5_000), ScriptNow::Store(7));
        let mut args = [ScriptNow::RedisTime.arg(), 1, 10];
        with_until(&mut args, 5_000);
        assert_eq!((args, cost_of(&args)), ([-5_000, 1, 10], 1));
    }
}
