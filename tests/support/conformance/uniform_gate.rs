//! Cases for the uniform gate: one call per caller per span.

use std::time::Duration;

use super::*;

pub fn gate(span_secs: u64) -> Policy {
    Policy::uniform_gate("feeding", Duration::from_secs(span_secs)).unwrap()
}

/// Uniform gate's rows, each one `#[tokio::test]` per backend (see
/// `conformance_suite!`).
#[macro_export]
macro_rules! uniform_gate_rows {
    ($factory:path) => {
        $crate::conformance_rows! { uniform_gate, $factory;
            one_call_per_caller_per_span => Row::new(gate(10), [
                (0, Check("bob", 1), pass(0, 10_000)),
                (1, Check("bob", 1), limited(10_000, 9_999)),
                (5_000, Check("bob", 1), limited(10_000, 5_000)),
                (5_001, Check("ann", 1), pass(0, 15_001)),
                // The stored time has passed (the key may still exist): open.
                (10_000, Check("bob", 1), pass(0, 20_000)),
                (10_001, Check("bob", 1), limited(20_000, 9_999)),
            ]),

            // Regression: published gates test `TTL key > 0`; Redis rounds TTL to
            // whole seconds, so with 400 ms left TTL reads 0 and the caller is let
            // in early. The stored reopening time decides here, to the microsecond.
            uniform_gate_is_not_open_a_second_early_like_ttl_checks => Row::new(gate(10), [
                (0, Check("bob", 1), pass(0, 10_000)),
                (9_600, Check("bob", 1), limited(10_000, 400)),
                (9_999, Check("bob", 1), limited(10_000, 1)),
                (10_000, Check("bob", 1), pass(0, 20_000)),
            ]),

            cost_closes_for_that_many_spans_and_peek_charges_nothing => Row::new(gate(10), [
                // Open: one call left, nothing to wait for.
                (0, Peek("bob"), pass(1, 0)),
                (0, Check("bob", 3), pass(0, 30_000)),
                (1, Peek("bob"), pass(0, 30_000)),
                (29_999, Check("bob", 1), limited(30_000, 1)),
                (30_000, Peek("bob"), pass(1, 30_000)),
                (30_000, Check("bob", 1), pass(0, 40_000)),
            ]),

            refund_reopens_only_for_its_own_pass => Row::new(gate(10), [
                (0, Check("bob", 1), pass(0, 10_000)),
                (1, Refund("bob", 0), Done),
                (2, Check("bob", 1), pass(0, 10_002)),
                (10_002, Check("bob", 1), pass(0, 20_002)),
                // The pass of step 2 no longer holds the gate: nothing reopens.
                (10_003, Refund("bob", 2), Done),
                (10_004, Check("bob", 1), limited(20_002, 9_998)),
            ]),

            // Regression (proptest): a settle to what was charged sends nothing.
            // Redis's had reopened a gate whose time had come, so a later settle
            // of the same pass closed the memory store's gate and not Redis's.
            settle_to_what_was_charged_changes_nothing => Row::new(gate(10), [
                (0, Check("sam", 1), pass(0, 10_000)),
                (10_000, Settle("sam", 0, 1), Done),
                (10_000, Settle("sam", 0, 3), Done),
                (10_000, Check("sam", 1), limited(30_000, 20_000)),
            ]),

            // A pass of cost c closes the gate for c spans; settled to a, for a
            // spans from when it came, while the gate is still closed by it.
            settle_moves_the_gate_by_whole_spans => Row::new(gate(10), [
                (0, Check("sam", 1), pass(0, 10_000)),
                (1, Settle("sam", 0, 3), Done),
                (2, Check("sam", 1), limited(30_000, 29_998)),
                (30_000, Check("sam", 2), pass(0, 50_000)),
                (30_001, Settle("sam", 3, 1), Done),
                (30_002, Check("sam", 1), limited(40_000, 9_998)),
                (40_000, Check("sam", 1), pass(0, 50_000)),
                // Settled to zero: the refund, the gate opens.
                (40_001, Settle("sam", 6, 0), Done),
                (40_002, Check("sam", 1), pass(0, 50_002)),
                // A second past its reopening the pass's key is gone: nothing.
                (51_002, Settle("sam", 8, 5), Done),
                (51_004, Check("sam", 1), pass(0, 61_004)),
                // An earlier pass's settle leaves a later closing alone.
                (51_005, Settle("sam", 3, 4), Done),
                (51_006, Check("sam", 1), limited(61_004, 9_998)),
            ]),
        }
    };
}
