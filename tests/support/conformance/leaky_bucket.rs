//! Cases for the shaping leaky bucket. With 10 per second the interval is
//! 100 ms; `Wait` is a pass that leaves after `delay_ms`, `reset_ms` is
//! when the bucket is empty.
use super::*;
use std::num::NonZeroU32;

fn policy(capacity: u32) -> Policy {
    Policy::leaky_bucket("shape", quota(10, 1), NonZeroU32::new(capacity).unwrap())
}

pub async fn a_burst_is_queued_at_the_rate_then_rejected(b: Backend) {
    run(
        &b,
        &policy(3),
        &[
            (0, Check("bob", 1), pass(2, 100)),
            (0, Check("bob", 1), wait(1, 200, 100)),
            (0, Check("bob", 1), wait(0, 300, 200)),
            (0, Check("bob", 1), limited(300, 100)),
            (50, Check("bob", 1), limited(300, 50)),
            // Rejections took no place: one has drained, so one more fits.
            (100, Check("bob", 1), wait(0, 400, 200)),
        ],
    )
    .await;
}

pub async fn the_bucket_drains_at_the_rate(b: Backend) {
    run(
        &b,
        &policy(3),
        &[
            (0, Check("carol", 1), pass(2, 100)),
            (0, Check("carol", 1), wait(1, 200, 100)),
            (0, Check("carol", 1), wait(0, 300, 200)),
            // Half a place still draining counts as taken.
            (150, Peek("carol"), wait(1, 300, 150)),
            (250, Peek("carol"), wait(2, 300, 50)),
            // A stored end that has passed is an empty bucket, expired or not.
            (300, Peek("carol"), pass(3, 300)),
            (1_000, Check("carol", 1), pass(2, 1_100)),
        ],
    )
    .await;
}

pub async fn cost_takes_as_many_places(b: Backend) {
    run(
        &b,
        &policy(3),
        &[
            (0, Check("dan", 2), pass(1, 200)),
            (0, Check("dan", 2), limited(200, 100)),
            (0, Check("dan", 1), wait(0, 300, 200)),
            // More than the bucket holds never fits; Retry-After says by how much.
            (1_000, Check("dan", 4), limited(1_000, 100)),
        ],
    )
    .await;
}

pub async fn keys_are_independent(b: Backend) {
    run(
        &b,
        &policy(1),
        &[
            (0, Check("eve", 1), pass(0, 100)),
            (1, Check("eve", 1), limited(100, 99)),
            (2, Check("fay", 1), pass(0, 102)),
        ],
    )
    .await;
}

pub async fn refund_of_the_last_place_is_exact(b: Backend) {
    // A client that leaves while waiting gives its place back.
    run(
        &b,
        &policy(3),
        &[
            (0, Check("gus", 1), pass(2, 100)),
            (0, Check("gus", 1), wait(1, 200, 100)),
            (0, Check("gus", 1), wait(0, 300, 200)),
            (10, Refund("gus", 2), Done),
            (11, Check("gus", 1), wait(0, 300, 189)),
        ],
    )
    .await;
}

pub async fn refund_from_the_middle_frees_a_place_for_the_next_arrival(b: Backend) {
    // Places already given keep their times; the freed one goes to the
    // next arrival, which leaves with the last in line (documented).
    run(
        &b,
        &policy(3),
        &[
            (0, Check("hal", 1), pass(2, 100)),
            (0, Check("hal", 1), wait(1, 200, 100)),
            (0, Check("hal", 1), wait(0, 300, 200)),
            (10, Refund("hal", 1), Done),
            (11, Peek("hal"), wait(1, 200, 189)),
            (12, Check("hal", 1), wait(0, 300, 188)),
            (13, Check("hal", 1), limited(300, 87)),
        ],
    )
    .await;
}

pub async fn refund_of_a_used_slot_changes_nothing(b: Backend) {
    run(
        &b,
        &policy(3),
        &[
            (0, Check("ida", 1), pass(2, 100)),
            (0, Check("ida", 1), wait(1, 200, 100)),
            // The first slot ended at +100 ms: it was used, nothing to give back.
            (150, Refund("ida", 0), Done),
            (150, Peek("ida"), wait(2, 200, 50)),
            // The second is still running: a 304 may give it back, never below now.
            (160, Refund("ida", 1), Done),
            (160, Peek("ida"), pass(3, 160)),
        ],
    )
    .await;
}

pub async fn a_lowered_capacity_keeps_rejecting(b: Backend) {
    let burst: Vec<Step> = (0..5)
        .map(|i| {
            let expect = if i == 0 {
                pass(4, 100)
            } else {
                wait(4 - i, 100 * (i + 1), 100 * i)
            };
            (0, Check("jo", 1), expect)
        })
        .collect();
    run(&b, &policy(5), &burst).await;
    run(
        &b,
        &policy(2),
        &[
            (1, Check("jo", 1), limited(500, 399)),
            (2, Peek("jo"), limited(500, 298)),
        ],
    )
    .await;
}
