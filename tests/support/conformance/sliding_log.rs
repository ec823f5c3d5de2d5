//! Cases for the sliding log: a limit for the resource and one per consumer.

pub use tollgate::decision::Scope;

use super::*;

/// The resource sells `everyone` units per 10 s, each consumer `each`.
pub fn log(everyone: u32, each: u32) -> Policy {
    Policy::sliding_log("tigerfeeding", quota(everyone, 10), quota(each, 10))
}

pub fn scope(d: &[Option<Decision>], step: usize) -> (usize, Scope) {
    let d = d[step].as_ref().unwrap();
    (d.quota, d.scope)
}

/// Sliding log's rows, each one `#[tokio::test]` per backend (see
/// `conformance_suite!`).
#[macro_export]
macro_rules! sliding_log_rows {
    ($factory:path) => {
        $crate::conformance_rows! { sliding_log, $factory;
            resource_and_consumer_limits_both_apply_and_say_which_rejected => Row::new(log(5, 2), [
                // Bob's own limit is the tighter one: it is reported.
                (0, Check("bob", 1), pass(1, 10_000)),
                (1, Check("bob", 1), pass(0, 10_001)),
                (2, Check("bob", 1), limited(10_001, 9_998)),
                (3, Check("ann", 1), pass(1, 10_003)),
                (4, Check("ann", 1), pass(0, 10_004)),
                // The resource's fifth and last ticket: now it is the tighter.
                (5, Check("cat", 1), pass(0, 10_005)),
                (6, Check("dan", 1), limited(10_005, 9_994)),
                // Bob's first ticket left the window: one is free for anyone.
                (10_000, Check("dan", 1), pass(0, 20_000)),
            ])
            .then(|d| {
                assert_eq!(scope(d, 0), (1, Scope::Consumer));
                assert_eq!(scope(d, 2), (1, Scope::Consumer), "bob's own limit");
                assert_eq!(scope(d, 5), (0, Scope::Resource));
                assert_eq!(scope(d, 6), (0, Scope::Resource), "everyone's limit");
            }),

            the_window_slides_to_the_microsecond => Row::new(log(100, 2), [
                (0, Check("bob", 1), pass(1, 10_000)),
                (4_000, Check("bob", 1), pass(0, 14_000)),
                (9_999, Check("bob", 1), limited(14_000, 1)),
                // The entry at 0 is out of (now - 10 s, now].
                (10_000, Check("bob", 1), pass(0, 20_000)),
                (13_999, Check("bob", 1), limited(20_000, 1)),
                (14_000, Check("bob", 1), pass(0, 24_000)),
            ]),

            // Regression: published logs name members by the microsecond part of the
            // time, so requests in the same microsecond (or with the same one in
            // another second) collapse into one entry and callers get extra
            // requests. Here every unit of every request is its own member.
            sliding_log_members_do_not_collide_on_equal_microseconds => Row::new(log(100, 4), [
                (0, Check("bob", 1), pass(3, 10_000)),
                (0, Check("bob", 1), pass(2, 10_000)),
                (0, Check("bob", 2), pass(0, 10_000)),
                (0, Check("bob", 1), limited(10_000, 10_000)),
                // 1 s, 2 s, 3 s, 4 s: the same microsecond part, 000000.
                (1_000, Check("cat", 1), pass(3, 11_000)),
                (2_000, Check("cat", 1), pass(2, 12_000)),
                (3_000, Check("cat", 1), pass(1, 13_000)),
                (4_000, Check("cat", 1), pass(0, 14_000)),
                (5_000, Check("cat", 1), limited(14_000, 6_000)),
            ]),

            // Regression: published logs reject on `count == limit`; once a count is
            // above the limit (here the limit was lowered from 5 to 3) nothing is
            // ever rejected again.
            limit_compares_with_ge_not_eq => Row::new(
                log(100, 5),
                (0..5).map(|i| (i, Check("max", 1), pass(4 - i, 10_000 + i))),
            )
            .then_under(log(100, 3), [
                // 5 logged, 3 allowed: the 3rd oldest (at 2 ms) must leave first.
                (10, Check("max", 1), limited(10_004, 9_992)),
                (11, Check("max", 1), limited(10_004, 9_991)),
                (10_002, Check("max", 1), pass(0, 20_002)),
            ]),

            cost_counts_units_and_cost_above_the_limit_is_rejected => Row::new(log(100, 5), [
                (0, Check("fay", 3), pass(2, 10_000)),
                (1, Check("fay", 3), limited(10_000, 9_999)),
                (2, Check("fay", 2), pass(0, 10_002)),
                // More than the limit can never fit: told to wait a whole window.
                (3, Check("gus", 6), limited(3, 10_000)),
            ]),

            peek_and_refund_touch_only_their_own_entries => Row::new(log(5, 2), [
                (0, Peek("kim"), pass(2, 0)),
                (0, Check("kim", 1), pass(1, 10_000)),
                (1, Check("kim", 1), pass(0, 10_001)),
                (2, Peek("kim"), pass(0, 10_001)),
                (3, Refund("kim", 2), Done),
                (4, Peek("kim"), pass(1, 10_000)),
                // Refunding the same receipt again removes nothing more.
                (5, Refund("kim", 2), Done),
                (6, Peek("kim"), pass(1, 10_000)),
                (7, Check("kim", 1), pass(0, 10_007)),
                (8, Check("kim", 1), limited(10_007, 9_992)),
            ]),

            // A settle gives back what was charged over the real cost, from the
            // units after it, so a later refund finds its own; an overspend is
            // not charged (one entry per unit, bounded by the limit).
            settle_gives_back_but_never_charges_more => Row::new(log(10, 5), [
                (0, Check("sam", 3), pass(2, 10_000)),
                (1, Settle("sam", 0, 1), Done),
                (2, Peek("sam"), pass(4, 10_000)),
                (3, Settle("sam", 0, 9), Done),
                (4, Peek("sam"), pass(4, 10_000)),
                (5, Check("sam", 2), pass(2, 10_005)),
                (6, Settle("sam", 5, 0), Done),
                (7, Peek("sam"), pass(4, 10_000)),
                (8, Check("sam", 3), pass(1, 10_008)),
                (9, Settle("sam", 8, 1), Done),
                (10, Refund("sam", 8), Done),
                (11, Peek("sam"), pass(4, 10_000)),
            ]),
        }
    };
}
