//! Give-backs under the policy in force: for each source of adjustment (a
//! runtime limit, a cap, a caller's override, a limit the request brought)
//! and each kind of give-back (a `304`'s refund, a settle below and above
//! the estimate, a queued pass's release, a reset), the bucket or window
//! moves by exactly what the pass charged, in the units it was charged in.
//! Every give-back is sent with the policy as built, as one that arrives
//! after the adjustment ended would be: the receipt, not the policy it is
//! sent with, says what was charged.
//!
//! Each source makes the policy in force 10 per second (GCRA's burst and
//! the leaky bucket's capacity 10: a unit is 100 ms of the bucket); the
//! policy as built is 4 per second (250 ms a unit), or 20 (50 ms) where
//! the source is a cap, which only lowers.

use std::num::NonZeroU32;

use super::*;

/// Where the policy in force comes from.
#[derive(Clone, Copy)]
pub enum Source {
    RuntimeLimit,
    Cap,
    Override,
    /// A limit the request brought: the store is asked with the policy
    /// it makes (as the limiter asks), and given back with the one as built.
    Request,
}

/// What is given back.
#[derive(Clone, Copy)]
pub enum GiveBack {
    /// A `304`'s refund of a pass that left at once.
    Refund,
    /// A queued pass's release (the client left before its turn).
    Release,
    /// Settled below the estimate: 3 charged, 1 spent.
    SettleBelow,
    /// Settled above the estimate: 1 charged, 3 spent.
    SettleAbove,
    /// The operator's reset.
    Reset,
}

/// The strategies whose give-backs the rows check.
#[derive(Clone, Copy)]
pub enum Kind {
    Gcra,
    LeakyBucket,
    FixedWindow,
}

fn built(kind: Kind, limit: u32) -> Policy {
    let n = NonZeroU32::new(limit).unwrap();
    let policy = match kind {
        Kind::Gcra => Policy::gcra("in_force", quota(limit, 1), n),
        Kind::LeakyBucket => Policy::leaky_bucket("in_force", quota(limit, 1), n),
        Kind::FixedWindow => Policy::fixed_window("in_force", quota(limit, 1)),
    };
    policy.adjustable().overridable()
}

/// The row for `kind` under `source`, giving back as `give_back` says.
pub fn row(kind: Kind, source: Source, give_back: GiveBack) -> Row {
    let as_built = built(kind, if let Source::Cap = source { 20 } else { 4 });
    // A pass of `cost` from an empty bucket or window at 0.
    let first = |cost: u64| match kind {
        Kind::FixedWindow => pass(10 - cost, 1_000),
        _ => pass(10 - cost, cost * 100),
    };
    let setup = match source {
        Source::RuntimeLimit => (0, SetPolicyLimit(10, 1, 0), Done),
        Source::Cap => (0, SetPolicyCap(10), Done),
        Source::Override => (0, SetOverride("ann", 10, 1, 0), Done),
        Source::Request => (0, Peek("ann"), first(0)),
    };
    // What ann is shown at 10 ms after the give-back, by strategy: the
    // bucket's (or window's) end at `end` ms, with `left` units left.
    let after = |left: u64, end: u64| match kind {
        Kind::FixedWindow => pass(left, 1_000),
        Kind::LeakyBucket if end > 10 => wait(left, end, end - 10),
        _ => pass(left, end),
    };
    let second = match kind {
        Kind::FixedWindow => pass(8, 1_000),
        Kind::LeakyBucket => wait(8, 200, 100),
        Kind::Gcra => pass(8, 200),
    };
    let steps = match give_back {
        GiveBack::Refund | GiveBack::Release => {
            // The release gives back the pass still queued (the leaky
            // bucket's second, waiting its turn), the refund one that left.
            let given = if let GiveBack::Release = give_back {
                2
            } else {
                1
            };
            // A bucket gets back what of the charge has not drained: of
            // the first pass's 100 ms, 90 are left at 10 ms.
            let end = match (kind, give_back) {
                (Kind::Gcra | Kind::LeakyBucket, GiveBack::Refund) => 110,
                _ => 100,
            };
            vec![
                setup,
                (0, Check("ann", 1), first(1)),
                (0, Check("ann", 1), second),
                (10, Refund("ann", given), Done),
                (10, Peek("ann"), after(9, end)),
            ]
        }
        GiveBack::SettleBelow => vec![
            setup,
            (0, Check("ann", 3), first(3)),
            (10, Settle("ann", 1, 1), Done),
            (10, Peek("ann"), after(9, 100)),
        ],
        GiveBack::SettleAbove => vec![
            setup,
            (0, Check("ann", 1), first(1)),
            (10, Settle("ann", 1, 3), Done),
            (10, Peek("ann"), after(7, 300)),
        ],
        GiveBack::Reset => vec![
            setup,
            (0, Check("ann", 3), first(3)),
            (10, Reset("ann"), Done),
            (
                10,
                Peek("ann"),
                pass(
                    10,
                    if let Kind::FixedWindow = kind {
                        1_010
                    } else {
                        10
                    },
                ),
            ),
            (
                10,
                Check("ann", 1),
                match kind {
                    Kind::FixedWindow => pass(9, 1_010),
                    _ => pass(9, 110),
                },
            ),
        ],
    };
    match source {
        // The request's limit judges it: as a limiter asks the store.
        Source::Request => Row::new(built(kind, 10), steps).giving_back_under(as_built),
        _ => Row::new(as_built, steps),
    }
}

/// The rows, each one `#[tokio::test]` per backend (see
/// `conformance_suite!`): a strategy, a source, a give-back.
#[macro_export]
macro_rules! in_force_rows {
    ($factory:path) => {
        $crate::in_force_gcra_rows!($factory);
        $crate::in_force_counted_rows!($factory);
    };
}

/// GCRA's: a leasing store shows another reset (the TAT with the units
/// leased), so these run on the stores without leases; `tests/model.rs`
/// checks GCRA's give-backs through leases against the definitions.
#[macro_export]
macro_rules! in_force_gcra_rows {
    ($factory:path) => {
        $crate::conformance_rows! { in_force_gcra, $factory;
            gcra_runtime_limit_refund => row(Kind::Gcra, Source::RuntimeLimit, GiveBack::Refund),
            gcra_runtime_limit_settle_below => row(Kind::Gcra, Source::RuntimeLimit, GiveBack::SettleBelow),
            gcra_runtime_limit_settle_above => row(Kind::Gcra, Source::RuntimeLimit, GiveBack::SettleAbove),
            gcra_runtime_limit_reset => row(Kind::Gcra, Source::RuntimeLimit, GiveBack::Reset),
            gcra_cap_refund => row(Kind::Gcra, Source::Cap, GiveBack::Refund),
            gcra_cap_settle_below => row(Kind::Gcra, Source::Cap, GiveBack::SettleBelow),
            gcra_cap_settle_above => row(Kind::Gcra, Source::Cap, GiveBack::SettleAbove),
            gcra_cap_reset => row(Kind::Gcra, Source::Cap, GiveBack::Reset),
            gcra_override_refund => row(Kind::Gcra, Source::Override, GiveBack::Refund),
            gcra_override_settle_below => row(Kind::Gcra, Source::Override, GiveBack::SettleBelow),
            gcra_override_settle_above => row(Kind::Gcra, Source::Override, GiveBack::SettleAbove),
            gcra_override_reset => row(Kind::Gcra, Source::Override, GiveBack::Reset),
            gcra_request_limit_refund => row(Kind::Gcra, Source::Request, GiveBack::Refund),
            gcra_request_limit_settle_below => row(Kind::Gcra, Source::Request, GiveBack::SettleBelow),
            gcra_request_limit_settle_above => row(Kind::Gcra, Source::Request, GiveBack::SettleAbove),
            gcra_request_limit_reset => row(Kind::Gcra, Source::Request, GiveBack::Reset),
        }
    };
}

/// The leaky bucket's and the fixed window's, on every store, leasing
/// ones included.
#[macro_export]
macro_rules! in_force_counted_rows {
    ($factory:path) => {
        $crate::conformance_rows! { in_force_counted, $factory;
            leaky_runtime_limit_refund => row(Kind::LeakyBucket, Source::RuntimeLimit, GiveBack::Refund),
            leaky_runtime_limit_release => row(Kind::LeakyBucket, Source::RuntimeLimit, GiveBack::Release),
            leaky_runtime_limit_settle_below => row(Kind::LeakyBucket, Source::RuntimeLimit, GiveBack::SettleBelow),
            leaky_runtime_limit_settle_above => row(Kind::LeakyBucket, Source::RuntimeLimit, GiveBack::SettleAbove),
            leaky_runtime_limit_reset => row(Kind::LeakyBucket, Source::RuntimeLimit, GiveBack::Reset),
            leaky_cap_refund => row(Kind::LeakyBucket, Source::Cap, GiveBack::Refund),
            leaky_cap_release => row(Kind::LeakyBucket, Source::Cap, GiveBack::Release),
            leaky_cap_settle_below => row(Kind::LeakyBucket, Source::Cap, GiveBack::SettleBelow),
            leaky_cap_settle_above => row(Kind::LeakyBucket, Source::Cap, GiveBack::SettleAbove),
            leaky_cap_reset => row(Kind::LeakyBucket, Source::Cap, GiveBack::Reset),
            leaky_override_refund => row(Kind::LeakyBucket, Source::Override, GiveBack::Refund),
            leaky_override_release => row(Kind::LeakyBucket, Source::Override, GiveBack::Release),
            leaky_override_settle_below => row(Kind::LeakyBucket, Source::Override, GiveBack::SettleBelow),
            leaky_override_settle_above => row(Kind::LeakyBucket, Source::Override, GiveBack::SettleAbove),
            leaky_override_reset => row(Kind::LeakyBucket, Source::Override, GiveBack::Reset),
            leaky_request_limit_refund => row(Kind::LeakyBucket, Source::Request, GiveBack::Refund),
            leaky_request_limit_release => row(Kind::LeakyBucket, Source::Request, GiveBack::Release),
            leaky_request_limit_settle_below => row(Kind::LeakyBucket, Source::Request, GiveBack::SettleBelow),
            leaky_request_limit_settle_above => row(Kind::LeakyBucket, Source::Request, GiveBack::SettleAbove),
            leaky_request_limit_reset => row(Kind::LeakyBucket, Source::Request, GiveBack::Reset),
            window_runtime_limit_refund => row(Kind::FixedWindow, Source::RuntimeLimit, GiveBack::Refund),
            window_runtime_limit_settle_below => row(Kind::FixedWindow, Source::RuntimeLimit, GiveBack::SettleBelow),
            window_runtime_limit_settle_above => row(Kind::FixedWindow, Source::RuntimeLimit, GiveBack::SettleAbove),
            window_runtime_limit_reset => row(Kind::FixedWindow, Source::RuntimeLimit, GiveBack::Reset),
            window_cap_refund => row(Kind::FixedWindow, Source::Cap, GiveBack::Refund),
            window_cap_settle_below => row(Kind::FixedWindow, Source::Cap, GiveBack::SettleBelow),
            window_cap_settle_above => row(Kind::FixedWindow, Source::Cap, GiveBack::SettleAbove),
            window_cap_reset => row(Kind::FixedWindow, Source::Cap, GiveBack::Reset),
            window_override_refund => row(Kind::FixedWindow, Source::Override, GiveBack::Refund),
            window_override_settle_below => row(Kind::FixedWindow, Source::Override, GiveBack::SettleBelow),
            window_override_settle_above => row(Kind::FixedWindow, Source::Override, GiveBack::SettleAbove),
            window_override_reset => row(Kind::FixedWindow, Source::Override, GiveBack::Reset),
            window_request_limit_refund => row(Kind::FixedWindow, Source::Request, GiveBack::Refund),
            window_request_limit_settle_below => row(Kind::FixedWindow, Source::Request, GiveBack::SettleBelow),
            window_request_limit_settle_above => row(Kind::FixedWindow, Source::Request, GiveBack::SettleAbove),
            window_request_limit_reset => row(Kind::FixedWindow, Source::Request, GiveBack::Reset),
        }
    };
}
