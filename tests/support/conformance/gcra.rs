//! Cases for GCRA, the token bucket kept as one timestamp.

use std::num::NonZeroU32;

use super::*;

/// `limit` per `secs` seconds, `burst` at once.
pub fn bucket(limit: u32, secs: u64, burst: u32) -> Policy {
    Policy::gcra(
        "feeding",
        quota(limit, secs),
        NonZeroU32::new(burst).unwrap(),
    )
}

/// GCRA's rows, each one `#[tokio::test]` per backend (see
/// `conformance_suite!`).
#[macro_export]
macro_rules! gcra_rows {
    ($factory:path) => {
        $crate::conformance_rows! { gcra, $factory;
            a_full_bucket_passes_its_burst_then_one_per_interval => Row::new(bucket(1, 1, 3), [
                // Reset is the TAT: when the bucket is full again.
                (0, Check("bob", 1), pass(2, 1_000)),
                (0, Check("bob", 1), pass(1, 2_000)),
                (0, Check("bob", 1), pass(0, 3_000)),
                (0, Check("bob", 1), limited(3_000, 1_000)),
                (999, Check("bob", 1), limited(3_000, 1)),
                (1_000, Check("bob", 1), pass(0, 4_000)),
                (1_500, Check("bob", 1), limited(4_000, 500)),
                (4_000, Check("bob", 1), pass(2, 5_000)),
                (10_000, Check("bob", 1), pass(2, 11_000)),
            ]),

            cost_and_peek => Row::new(bucket(1, 1, 5), [
                (0, Peek("fay"), pass(5, 0)),
                (0, Check("fay", 3), pass(2, 3_000)),
                (1, Check("fay", 3), limited(3_000, 999)),
                // More than the burst never conforms: wait until full, at least T.
                (2, Check("fay", 6), limited(3_000, 2_998)),
                (500, Peek("fay"), pass(2, 3_000)),
                (500, Check("fay", 2), pass(0, 5_000)),
            ]),

            refund_moves_tat_back_but_never_before_its_charge => Row::new(bucket(1, 1, 2), [
                (0, Check("kim", 1), pass(1, 1_000)),
                (0, Check("kim", 1), pass(0, 2_000)),
                (1, Refund("kim", 1), Done),
                (2, Peek("kim"), pass(1, 1_000)),
                // The same receipt again: not below the start of its charge.
                (3, Refund("kim", 1), Done),
                (4, Peek("kim"), pass(1, 1_000)),
                // Never before now: a full bucket, nothing owed.
                (5, Refund("kim", 0), Done),
                (6, Peek("kim"), pass(2, 6)),
                (7, Check("kim", 1), pass(1, 1_007)),
            ]),

            a_lowered_burst_keeps_rejecting => Row::new(bucket(1, 1, 5), [
                (0, Check("max", 5), pass(0, 5_000)),
            ])
            .then_under(bucket(1, 1, 2), [
                (0, Check("max", 1), limited(5_000, 4_000)),
                (3_000, Check("max", 1), limited(5_000, 1_000)),
                (4_000, Check("max", 1), pass(0, 6_000)),
            ]),

            // 3 per 10 s: one unit every 3,333,334 µs, never faster than the quota.
            emission_interval_rounds_up_to_whole_microseconds => Row::new(bucket(3, 10, 1), [
                (0, Check("ivy", 1), pass(0, 3_333_334)),
                (3_333_333, Check("ivy", 1), limited(3_333_334, 1)),
                (3_333_334, Check("ivy", 1), pass(0, 6_666_668)),
            ])
            .in_micros(),

            // An overspend moves the TAT on by the difference; one that would
            // have drained by the time it arrives changes nothing.
            settle_charges_the_difference_or_gives_it_back => Row::new(bucket(1, 1, 2), [
                (0, Check("sam", 1), pass(1, 1_000)),
                (0, Settle("sam", 0, 2), Done),
                (0, Peek("sam"), pass(0, 2_000)),
                (1, Check("sam", 1), limited(2_000, 999)),
                (5_000, Check("sam", 1), pass(1, 6_000)),
                (9_000, Settle("sam", 4, 3), Done),
                (9_000, Peek("sam"), pass(2, 9_000)),
                (9_000, Check("sam", 2), pass(0, 11_000)),
                (9_500, Settle("sam", 7, 0), Done),
                (9_500, Peek("sam"), pass(2, 9_500)),
            ]),
        }
    };
}
