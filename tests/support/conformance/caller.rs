//! Cases for a caller's own rules on every strategy: an operator's
//! override of its quotas, and the penalty box.

use std::num::NonZeroU32;

use super::*;
pub use std::time::Duration;
pub use tollgate::{PenaltyBox, Policy};

pub fn n(x: u32) -> NonZeroU32 {
    NonZeroU32::new(x).unwrap()
}

/// A fixed window of `limit` per `secs`, overridable.
pub fn window(limit: u32, secs: u64) -> Policy {
    Policy::fixed_window("core", quota(limit, secs)).overridable()
}

/// Two strikes within 5 s block for 30 s, doubling up to 100 s.
pub fn strict() -> PenaltyBox {
    PenaltyBox::new(n(2), Duration::from_secs(5), Duration::from_secs(30))
        .unwrap()
        .doubling_up_to(Duration::from_secs(100))
        .unwrap()
}

/// Every strategy, overridable, with a limit of one for callers without
/// an override (the sliding log's resource limit 100).
pub fn every_strategy() -> Vec<Policy> {
    let one = quota(1, 10);
    vec![
        Policy::fixed_window("core", one),
        Policy::aligned_window("core", one),
        Policy::sliding_window("core", one),
        Policy::sliding_log("core", quota(100, 10), one),
        Policy::gcra("core", one, n(1)),
        Policy::leaky_bucket("core", one, n(1)),
        Policy::concurrency("core", n(1), Duration::from_secs(10)).unwrap(),
    ]
    .into_iter()
    .map(Policy::overridable)
    .collect()
}

/// The caller-rule rows, each one `#[tokio::test]` per backend.
#[macro_export]
macro_rules! caller_rows {
    ($factory:path) => {
        $crate::conformance_rows! { caller, $factory;
            an_override_raises_and_lowers_one_callers_limit => Row::new(window(2, 10), [
                (0, Check("ann", 1), pass_of(2, 1)),
                (1, Check("ann", 1), pass_of(2, 0)),
                (2, Check("ann", 1), limited(10_000, 9_998)),
                (3, SetOverride("ann", 5, 10, 0), Done),
                // The same window, its count kept, judged against five.
                (4, Check("ann", 1), pass_of(5, 2)),
                (5, Check("bob", 1), pass_of(2, 1)),
                (6, SetOverride("ann", 1, 10, 0), Done),
                (7, Check("ann", 1), limited(10_000, 9_993)),
                (8, ClearOverride("ann"), Done),
                (9, Check("ann", 1), limited(10_000, 9_991)),
                (10_000, Check("ann", 1), pass_of(2, 1)),
            ]),

            an_override_ends_at_its_time => Row::new(window(2, 10), [
                (0, SetOverride("cy", 3, 10, 5_000), Done),
                (1, Check("cy", 1), pass_of(3, 2)),
                (4_999, Check("cy", 1), pass_of(3, 1)),
                (5_000, Check("cy", 1), limited(10_001, 5_001)),
            ]),

            a_reset_keeps_the_override => Row::new(window(1, 10), [
                (0, SetOverride("dee", 2, 10, 0), Done),
                (1, Check("dee", 2), pass_of(2, 0)),
                (2, Reset("dee"), Done),
                (3, Check("dee", 1), pass_of(2, 1)),
            ]),

            every_strategy_with_a_quota_honours_an_override => {
                let mut row = Row::new(Policy::uniform_gate("core", Duration::from_secs(10)).unwrap().overridable(), [
                    (0, SetOverride("ann", 1, 60, 0), Done),
                    (0, Check("ann", 1), pass_of(1, 0)),
                    (1, Check("ann", 1), limited(60_000, 59_999)),
                    (2, Check("bob", 1), pass_of(1, 0)),
                    (3, Check("bob", 1), limited(10_002, 9_999)),
                ]);
                for policy in every_strategy() {
                    row = row.then_under(policy, [
                        (5, SetOverride("ann", 10, 10, 0), Done),
                        (5, Check("ann", 1), pass_of(10, 9)),
                        (5, Peek("ann"), pass_of(10, 9)),
                        (5, Check("bob", 1), pass_of(1, 0)),
                    ]);
                }
                row
            },

            // Issue 41: limits for every caller, changed at runtime.
            a_policy_limit_changes_every_callers_limit_and_clears => Row::new(Policy::fixed_window("core", quota(2, 10)).adjustable(), [
                (0, Check("ann", 1), pass_of(2, 1)),
                (1, SetPolicyLimit(5, 10, 0), Done),
                // The same window, its count kept, judged against five.
                (2, Check("ann", 1), pass_of(5, 3)),
                (3, Check("bob", 1), pass_of(5, 4)),
                (4, Peek("bob"), pass_of(5, 4)),
                (5, SetPolicyLimit(1, 10, 0), Done),
                (6, Check("bob", 1), limited(10_003, 9_997)),
                (7, ClearPolicyLimit, Done),
                (8, Check("bob", 1), pass_of(2, 0)),
            ]),

            a_policy_limit_ends_at_its_time => Row::new(Policy::fixed_window("core", quota(2, 10)).adjustable(), [
                (0, SetPolicyLimit(3, 10, 5_000), Done),
                (1, Check("cy", 1), pass_of(3, 2)),
                (4_999, Check("cy", 1), pass_of(3, 1)),
                (5_000, Check("cy", 1), limited(10_001, 5_001)),
            ]),

            an_override_beats_the_policy_limit_and_the_cap_beats_both => Row::new(window(2, 10).adjustable(), [
                (0, SetPolicyLimit(10, 10, 0), Done),
                (1, SetOverride("vip", 20, 10, 0), Done),
                (2, Check("vip", 1), pass_of(20, 19)),
                (3, Check("ann", 1), pass_of(10, 9)),
                (4, SetPolicyCap(5), Done),
                // An override above the cap is set aside while it lasts:
                // the policy's limit, capped.
                (5, Check("vip", 1), pass_of(5, 3)),
                (6, Check("ann", 1), pass_of(5, 3)),
                // One under the cap still judges its caller.
                (7, SetOverride("low", 1, 10, 0), Done),
                (8, Check("low", 1), pass_of(1, 0)),
                (9, ClearPolicyCap, Done),
                (10, Check("vip", 1), pass_of(20, 17)),
                (11, ClearPolicyLimit, Done),
                (12, Check("ann", 1), limited(10_003, 9_991)),
            ]),

            every_strategy_honours_a_policy_limit_and_a_cap => {
                let mut row = Row::new(Policy::fixed_window("core", quota(1, 10)), [
                    (0, Check("zed", 1), pass_of(1, 0)),
                ]);
                for policy in every_strategy() {
                    row = row.then_under(policy.adjustable(), [
                        (5, SetPolicyLimit(10, 10, 0), Done),
                        (5, Check("ann", 1), pass_of(10, 9)),
                        (5, Peek("ann"), pass_of(10, 9)),
                        (5, SetPolicyCap(3), Done),
                        (5, Check("ann", 1), pass_of(3, 1)),
                        (5, Peek("ann"), pass_of(3, 1)),
                    ]);
                }
                row
            },

            the_penalty_box_blocks_after_strikes_and_doubles => {
                Row::new(Policy::fixed_window("core", quota(1, 10)).with_penalty_box(strict()), [
                    (0, Check("eve", 1), pass_of(1, 0)),
                    (1, Check("eve", 1), limited(10_000, 9_999)),
                    (2, Check("eve", 1), blocked(30_002, 1)),
                    (3, Check("eve", 1), blocked(30_002, 1)),
                    (4, Peek("eve"), blocked(30_002, 1)),
                    (5, Check("fay", 1), pass_of(1, 0)),
                    (30_002, Check("eve", 1), pass_of(1, 0)),
                    (30_003, Check("eve", 1), limited(40_002, 9_999)),
                    (30_004, Check("eve", 1), blocked(90_004, 1)),
                    (30_005, Reset("eve"), Done),
                    (30_006, Check("eve", 1), pass_of(1, 0)),
                ])
            },

            // Issue 39: a 5 s block started while the window was full for
            // 55 s more said "Retry-After: 5" and a Reset 55 s early; the
            // client that waited 5 s was refused again, and struck.
            a_block_never_tells_a_client_to_come_back_before_it_would_pass => {
                let three = PenaltyBox::new(n(3), Duration::from_secs(60), Duration::from_secs(5)).unwrap();
                Row::new(Policy::fixed_window("core", quota(3, 60)).with_penalty_box(three), [
                    (0, Check("joe", 1), pass_of(3, 2)),
                    (1, Check("joe", 1), pass_of(3, 1)),
                    (2, Check("joe", 1), pass_of(3, 0)),
                    (3, Check("joe", 1), limited(60_000, 59_997)),
                    (4, Check("joe", 1), limited(60_000, 59_996)),
                    (5, Check("joe", 1), blocked(60_000, 3)),
                    (6, Check("joe", 1), blocked(60_000, 3)),
                    (7, Peek("joe"), blocked(60_000, 3)),
                    (60_000, Check("joe", 1), pass_of(3, 2)),
                ])
            },

            strikes_age_out_of_their_span => {
                Row::new(Policy::fixed_window("core", quota(1, 10)).with_penalty_box(strict()), [
                    (0, Check("hal", 1), pass_of(1, 0)),
                    (1, Check("hal", 1), limited(10_000, 9_999)),
                    (5_002, Check("hal", 1), limited(10_000, 4_998)),
                    (5_003, Check("hal", 1), blocked(35_003, 1)),
                ])
            },

            an_operator_blocks_by_hand_and_a_reset_lets_out => {
                Row::new(Policy::gcra("core", quota(1, 10), n(1)).with_penalty_box(strict()), [
                    (0, Block("gil", 5_000), Done),
                    (1, Check("gil", 1), blocked(5_000, 1)),
                    (5_000, Check("gil", 1), pass_of(1, 0)),
                    (5_001, Block("gil", 60_000), Done),
                    (5_002, Check("gil", 1), blocked(65_001, 1)),
                    (5_003, Reset("gil"), Done),
                    (5_004, Check("gil", 1), pass_of(1, 0)),
                ])
            },

            an_override_and_the_penalty_box_together => {
                let policy = window(1, 10).with_penalty_box(strict());
                Row::new(policy, [
                    (0, SetOverride("ivy", 2, 10, 0), Done),
                    (1, Check("ivy", 1), pass_of(2, 1)),
                    (2, Check("ivy", 1), pass_of(2, 0)),
                    (3, Check("ivy", 1), limited(10_001, 9_998)),
                    (4, Check("ivy", 1), blocked(30_004, 2)),
                ])
            },
        }
    };
}
