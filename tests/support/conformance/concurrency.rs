//! Cases for the concurrency limit: 2 slots, entries presumed crashed
//! after 60 s. `Refund` is the release at the end of a response.

use std::num::NonZeroU32;

use super::*;

pub fn policy(limit: u32) -> Policy {
    Policy::concurrency(
        "slots",
        NonZeroU32::new(limit).unwrap(),
        Duration::from_secs(60),
    )
    .unwrap()
}

/// Concurrency's rows, each one `#[tokio::test]` per backend (see
/// `conformance_suite!`).
#[macro_export]
macro_rules! concurrency_rows {
    ($factory:path) => {
        $crate::conformance_rows! { concurrency, $factory;
            admits_up_to_the_limit_and_a_release_frees_a_slot => Row::new(policy(2), [
                (0, Check("bob", 1), pass(1, 60_000)),
                (1_000, Check("bob", 1), pass(0, 61_000)),
                // Retry-After is a hint (1 s); Reset is when every slot is surely free.
                (2_000, Check("bob", 1), limited(61_000, 1_000)),
                (3_000, Refund("bob", 0), Done),
                (4_000, Check("bob", 1), pass(0, 64_000)),
            ]),

            entries_of_crashed_servers_time_out => Row::new(policy(2), [
                (0, Check("carol", 1), pass(1, 60_000)),
                (1, Check("carol", 1), pass(0, 60_001)),
                // The oldest entry times out in 1 ms: the hint says so.
                (59_999, Check("carol", 1), limited(60_001, 1)),
                (60_000, Check("carol", 1), pass(0, 120_000)),
            ]),

            peek_reports_without_taking_a_slot => Row::new(policy(2), [
                (0, Peek("dan"), pass(2, 0)),
                (5, Check("dan", 1), pass(1, 60_005)),
                (6, Peek("dan"), pass(1, 60_005)),
                (7, Peek("dan"), pass(1, 60_005)),
                // A timed-out entry never counts, removed yet or not.
                (60_005, Peek("dan"), pass(2, 60_005)),
            ]),

            cost_takes_as_many_slots => Row::new(policy(2), [
                (0, Check("eve", 2), pass(0, 60_000)),
                (1, Check("eve", 1), limited(60_000, 1_000)),
                (2, Refund("eve", 0), Done),
                (3, Peek("eve"), pass(2, 3)),
                // More than the limit never fits.
                (4, Check("eve", 3), limited(4, 1_000)),
            ]),

            releases_are_idempotent_and_never_free_another_request => Row::new(policy(2), [
                (0, Check("fay", 1), pass(1, 60_000)),
                (1, Check("fay", 1), pass(0, 60_001)),
                (2, Refund("fay", 0), Done),
                (3, Refund("fay", 0), Done),
                (4, Peek("fay"), pass(1, 60_001)),
                (5, Check("fay", 1), pass(0, 60_005)),
                (6, Refund("fay", 0), Done),
                (7, Check("fay", 1), limited(60_005, 1_000)),
            ]),

            keys_are_independent => Row::new(policy(1), [
                (0, Check("gus", 1), pass(0, 60_000)),
                (1, Check("gus", 1), limited(60_000, 1_000)),
                (2, Check("hal", 1), pass(0, 60_002)),
            ]),

            a_lowered_limit_keeps_rejecting => Row::new(policy(3), [
                (0, Check("ida", 1), pass(2, 60_000)),
                (1, Check("ida", 1), pass(1, 60_001)),
                (2, Check("ida", 1), pass(0, 60_002)),
            ])
            // Releases under the lowered limit free room only once below it.
            .then_under(policy(2), [
                (3, Check("ida", 1), limited(60_002, 1_000)),
                (3, Refund("ida", 0), Done),
                (4, Check("ida", 1), limited(60_002, 1_000)),
                (4, Refund("ida", 1), Done),
                (5, Check("ida", 1), pass(0, 60_005)),
            ]),

            // A slot is held, not spent: nothing to settle, and the store says so.
            settle_is_refused_and_the_slot_kept => Row::new(policy(1), [
                (0, Check("sam", 1), pass(0, 60_000)),
                (1, Settle("sam", 0, 0), Refused),
                (2, Check("sam", 1), limited(60_000, 1_000)),
                (3, Refund("sam", 0), Done),
                (4, Check("sam", 1), pass(0, 60_004)),
            ]),
        }
    };
}
