//! Cases for the shaping leaky bucket. With 10 per second the interval is
//! 100 ms; `Wait` is a pass that leaves after `delay_ms`, `reset_ms` is
//! when the bucket is empty.

use std::num::NonZeroU32;

use super::*;

pub fn policy(capacity: u32) -> Policy {
    Policy::leaky_bucket("shape", quota(10, 1), NonZeroU32::new(capacity).unwrap())
}

/// Leaky bucket's rows, each one `#[tokio::test]` per backend (see
/// `conformance_suite!`).
#[macro_export]
macro_rules! leaky_bucket_rows {
    ($factory:path) => {
        $crate::conformance_rows! { leaky_bucket, $factory;
            a_burst_is_queued_at_the_rate_then_rejected => Row::new(policy(3), [
                (0, Check("bob", 1), pass(2, 100)),
                (0, Check("bob", 1), wait(1, 200, 100)),
                (0, Check("bob", 1), wait(0, 300, 200)),
                (0, Check("bob", 1), limited(300, 100)),
                (50, Check("bob", 1), limited(300, 50)),
                // Rejections took no place: one has drained, so one more fits.
                (100, Check("bob", 1), wait(0, 400, 200)),
            ]),

            the_bucket_drains_at_the_rate => Row::new(policy(3), [
                (0, Check("carol", 1), pass(2, 100)),
                (0, Check("carol", 1), wait(1, 200, 100)),
                (0, Check("carol", 1), wait(0, 300, 200)),
                // Half a place still draining counts as taken.
                (150, Peek("carol"), wait(1, 300, 150)),
                (250, Peek("carol"), wait(2, 300, 50)),
                // A stored end that has passed is an empty bucket, expired or not.
                (300, Peek("carol"), pass(3, 300)),
                (1_000, Check("carol", 1), pass(2, 1_100)),
            ]),

            cost_takes_as_many_places => Row::new(policy(3), [
                (0, Check("dan", 2), pass(1, 200)),
                (0, Check("dan", 2), limited(200, 100)),
                (0, Check("dan", 1), wait(0, 300, 200)),
                // More than the bucket holds never fits; Retry-After says by how much.
                (1_000, Check("dan", 4), limited(1_000, 100)),
            ]),

            keys_are_independent => Row::new(policy(1), [
                (0, Check("eve", 1), pass(0, 100)),
                (1, Check("eve", 1), limited(100, 99)),
                (2, Check("fay", 1), pass(0, 102)),
            ]),

            // A client that leaves while waiting gives its place back.
            refund_of_the_last_place_is_exact => Row::new(policy(3), [
                (0, Check("gus", 1), pass(2, 100)),
                (0, Check("gus", 1), wait(1, 200, 100)),
                (0, Check("gus", 1), wait(0, 300, 200)),
                (10, Refund("gus", 2), Done),
                (11, Check("gus", 1), wait(0, 300, 189)),
            ]),

            // Places already given keep their times; the freed one goes to the
            // next arrival, which leaves with the last in line (documented).
            refund_from_the_middle_frees_a_place_for_the_next_arrival => Row::new(policy(3), [
                (0, Check("hal", 1), pass(2, 100)),
                (0, Check("hal", 1), wait(1, 200, 100)),
                (0, Check("hal", 1), wait(0, 300, 200)),
                (10, Refund("hal", 1), Done),
                (11, Peek("hal"), wait(1, 200, 189)),
                (12, Check("hal", 1), wait(0, 300, 188)),
                (13, Check("hal", 1), limited(300, 87)),
            ]),

            refund_of_a_used_slot_changes_nothing => Row::new(policy(3), [
                (0, Check("ida", 1), pass(2, 100)),
                (0, Check("ida", 1), wait(1, 200, 100)),
                // The first slot ended at +100 ms: it was used, nothing to give back.
                (150, Refund("ida", 0), Done),
                (150, Peek("ida"), wait(2, 200, 50)),
                // The second is still running: a 304 may give it back, never below now.
                (160, Refund("ida", 1), Done),
                (160, Peek("ida"), pass(3, 160)),
            ]),

            a_lowered_capacity_keeps_rejecting => Row::new(policy(5), [
                (0, Check("jo", 1), pass(4, 100)),
                (0, Check("jo", 1), wait(3, 200, 100)),
                (0, Check("jo", 1), wait(2, 300, 200)),
                (0, Check("jo", 1), wait(1, 400, 300)),
                (0, Check("jo", 1), wait(0, 500, 400)),
            ])
            .then_under(policy(2), [
                (1, Check("jo", 1), limited(500, 399)),
                (2, Peek("jo"), limited(500, 298)),
            ]),

            settle_charges_the_difference_or_gives_it_back => Row::new(policy(3), [
                (0, Check("sam", 1), pass(2, 100)),
                // Spent 3: the bucket empties 200 ms later.
                (10, Settle("sam", 0, 3), Done),
                (10, Peek("sam"), wait(0, 300, 290)),
                (10, Check("sam", 1), limited(300, 90)),
                (300, Check("sam", 1), pass(2, 400)),
                (300, Settle("sam", 4, 0), Done),
                (300, Peek("sam"), pass(3, 300)),
                (300, Check("sam", 1), pass(2, 400)),
                // Would have drained by +600: nothing.
                (1_000, Settle("sam", 7, 3), Done),
                (1_000, Peek("sam"), pass(3, 1_000)),
            ]),
        }
    };
}
