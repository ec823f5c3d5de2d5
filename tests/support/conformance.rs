//! The store conformance suite: written once, run against every backend.
//!
//! Each case is a table of steps at explicit times on a `ManualClock`; a
//! backend is any `Store` built on that clock. `conformance_suite!(factory)`
//! expands to one `#[tokio::test]` per case, so a topology opts in with one
//! line and a failure names the case and the backend's module.

use std::sync::Arc;
use std::time::Duration;

use tollgate::clock::ManualClock;
use tollgate::decision::Receipt;
use tollgate::{Decision, Key, Policy, Quota, Store};

/// The epoch the tables count from: 2023-11-14T22:13:20Z, in µs.
pub const T0: u64 = 1_700_000_000_000_000;

/// A store under test and the clock it reads.
pub struct Backend {
    pub store: Arc<dyn Store>,
    pub clock: ManualClock,
}

impl Backend {
    pub fn new(store: impl Store, clock: ManualClock) -> Self {
        Self {
            store: Arc::new(store),
            clock,
        }
    }
}

/// `n` per `secs` seconds.
pub fn quota(n: u32, secs: u64) -> Quota {
    Quota::new(n, Duration::from_secs(secs)).unwrap()
}

/// What a step does.
#[derive(Clone, Copy, Debug)]
pub enum Op {
    /// Charge `cost` to `key`.
    Check(&'static str, u64),
    /// Look at `key` without charging.
    Peek(&'static str),
    /// Refund the receipt of step number `n` (0-based) of this table.
    Refund(&'static str, usize),
}

/// What the step must answer. Times are ms after `T0`.
#[derive(Clone, Copy, Debug)]
pub enum Expect {
    /// Allowed, with `remaining` left and the window ending at `reset_ms`.
    Pass { remaining: u64, reset_ms: u64 },
    /// Allowed after waiting `delay_ms` for its turn (a leaky bucket's queue).
    Wait {
        remaining: u64,
        reset_ms: u64,
        delay_ms: u64,
    },
    /// Rejected, retry after `retry_ms`, the window ending at `reset_ms`.
    Limited { reset_ms: u64, retry_ms: u64 },
    /// No decision to check (refunds).
    Done,
}

pub use Expect::{Done, Limited, Pass, Wait};
pub use Op::{Check, Peek, Refund};

/// [`Expect::Pass`] in one short line: `remaining` left, reset at `reset_ms`.
pub const fn pass(remaining: u64, reset_ms: u64) -> Expect {
    Expect::Pass {
        remaining,
        reset_ms,
    }
}

/// [`Expect::Limited`] in one short line.
pub const fn limited(reset_ms: u64, retry_ms: u64) -> Expect {
    Expect::Limited { reset_ms, retry_ms }
}

// Each strategy's cases, beside this file.
pub mod gcra;
pub mod sliding_log;
pub mod sliding_window;
pub mod uniform_gate;

/// One row: at `at_ms` after `T0`, do `op`, expect `expect`.
pub type Step = (u64, Op, Expect);

/// Runs `steps` against `backend` under `policy` and checks every answer,
/// naming the step that disagreed.
pub async fn run(backend: &Backend, policy: &Policy, steps: &[Step]) -> Vec<Option<Decision>> {
    let mut seen: Vec<Option<Decision>> = Vec::new();
    for (i, &(at_ms, op, expect)) in steps.iter().enumerate() {
        backend.clock.set(T0 + at_ms * 1000);
        let decision = match op {
            Op::Check(key, cost) => Some(
                backend
                    .store
                    .check(policy, &Key::new(key), cost)
                    .await
                    .unwrap(),
            ),
            Op::Peek(key) => Some(backend.store.peek(policy, &Key::new(key)).await.unwrap()),
            Op::Refund(key, n) => {
                let receipt: Receipt = seen[n]
                    .as_ref()
                    .expect("refund of a step with a decision")
                    .receipt
                    .clone();
                backend
                    .store
                    .refund(policy, &Key::new(key), &receipt)
                    .await
                    .unwrap();
                None
            }
        };
        let here = format!("step {i} at +{at_ms} ms: {op:?}");
        match (expect, &decision) {
            (
                Expect::Pass {
                    remaining,
                    reset_ms,
                },
                Some(d),
            ) => {
                assert!(d.allowed, "{here}: expected a pass, got {d:?}");
                assert_eq!(d.remaining, remaining, "{here}: remaining");
                assert_eq!(d.used, d.limit - remaining, "{here}: used");
                assert_eq!(d.reset_at_micros, T0 + reset_ms * 1000, "{here}: reset-at");
                assert_eq!(d.retry_after, None, "{here}: retry-after");
                assert_eq!(d.delay, None, "{here}: delay");
            }
            (
                Expect::Wait {
                    remaining,
                    reset_ms,
                    delay_ms,
                },
                Some(d),
            ) => {
                assert!(d.allowed, "{here}: expected a pass, got {d:?}");
                assert_eq!(d.remaining, remaining, "{here}: remaining");
                assert_eq!(d.used, d.limit - remaining, "{here}: used");
                assert_eq!(d.reset_at_micros, T0 + reset_ms * 1000, "{here}: reset-at");
                assert_eq!(d.retry_after, None, "{here}: retry-after");
                assert_eq!(
                    d.delay,
                    Some(Duration::from_millis(delay_ms)),
                    "{here}: delay"
                );
            }
            (Expect::Limited { reset_ms, retry_ms }, Some(d)) => {
                assert!(!d.allowed, "{here}: expected a rejection, got {d:?}");
                assert_eq!(d.remaining, 0, "{here}: remaining");
                assert_eq!(d.reset_at_micros, T0 + reset_ms * 1000, "{here}: reset-at");
                assert_eq!(
                    d.retry_after,
                    Some(Duration::from_millis(retry_ms)),
                    "{here}: retry-after"
                );
            }
            (Expect::Done, None) => {}
            (e, d) => panic!("{here}: expected {e:?}, got {d:?}"),
        }
        seen.push(decision);
    }
    seen
}

pub mod fixed_window {
    //! Cases for GitHub's fixed window.
    use super::*;

    fn policy(quotas: &[Quota]) -> Policy {
        let mut p = Policy::fixed_window("core", quotas[0]);
        for q in &quotas[1..] {
            p = p.and(*q);
        }
        p
    }

    pub async fn window_opens_counts_down_and_rejects(b: Backend) {
        run(
            &b,
            &policy(&[quota(3, 10)]),
            &[
                (
                    0,
                    Check("bob", 1),
                    Pass {
                        remaining: 2,
                        reset_ms: 10_000,
                    },
                ),
                (
                    1_000,
                    Check("bob", 1),
                    Pass {
                        remaining: 1,
                        reset_ms: 10_000,
                    },
                ),
                (
                    2_500,
                    Check("bob", 1),
                    Pass {
                        remaining: 0,
                        reset_ms: 10_000,
                    },
                ),
                (
                    3_000,
                    Check("bob", 1),
                    Limited {
                        reset_ms: 10_000,
                        retry_ms: 7_000,
                    },
                ),
                (
                    9_999,
                    Check("bob", 1),
                    Limited {
                        reset_ms: 10_000,
                        retry_ms: 1,
                    },
                ),
            ],
        )
        .await;
    }

    pub async fn reset_at_is_stored_not_recomputed(b: Backend) {
        // Every response of one window names the same end, whenever it comes.
        let steps: Vec<Step> = (0..5)
            .map(|i| {
                (
                    i * 1_777,
                    Check("carol", 1),
                    Pass {
                        remaining: 9 - i,
                        reset_ms: 60_000,
                    },
                )
            })
            .collect();
        run(&b, &policy(&[quota(10, 60)]), &steps).await;
    }

    pub async fn window_rolls_over_at_its_stored_end(b: Backend) {
        run(
            &b,
            &policy(&[quota(2, 10)]),
            &[
                (
                    0,
                    Check("dan", 1),
                    Pass {
                        remaining: 1,
                        reset_ms: 10_000,
                    },
                ),
                (
                    5_000,
                    Check("dan", 1),
                    Pass {
                        remaining: 0,
                        reset_ms: 10_000,
                    },
                ),
                (
                    9_999,
                    Check("dan", 1),
                    Limited {
                        reset_ms: 10_000,
                        retry_ms: 1,
                    },
                ),
                // The stored end has passed: a new window opens at this request.
                (
                    10_000,
                    Check("dan", 1),
                    Pass {
                        remaining: 1,
                        reset_ms: 20_000,
                    },
                ),
                (
                    25_000,
                    Check("dan", 1),
                    Pass {
                        remaining: 1,
                        reset_ms: 35_000,
                    },
                ),
            ],
        )
        .await;
    }

    pub async fn rejections_charge_nothing(b: Backend) {
        run(
            &b,
            &policy(&[quota(2, 10)]),
            &[
                (
                    0,
                    Check("eve", 2),
                    Pass {
                        remaining: 0,
                        reset_ms: 10_000,
                    },
                ),
                (
                    1,
                    Check("eve", 1),
                    Limited {
                        reset_ms: 10_000,
                        retry_ms: 9_999,
                    },
                ),
                (
                    2,
                    Check("eve", 1),
                    Limited {
                        reset_ms: 10_000,
                        retry_ms: 9_998,
                    },
                ),
                (
                    10_000,
                    Check("eve", 1),
                    Pass {
                        remaining: 1,
                        reset_ms: 20_000,
                    },
                ),
            ],
        )
        .await;
    }

    pub async fn cost_counts_and_cost_above_limit_is_rejected(b: Backend) {
        run(
            &b,
            &policy(&[quota(10, 10)]),
            &[
                (
                    0,
                    Check("fay", 4),
                    Pass {
                        remaining: 6,
                        reset_ms: 10_000,
                    },
                ),
                (
                    1,
                    Check("fay", 7),
                    Limited {
                        reset_ms: 10_000,
                        retry_ms: 9_999,
                    },
                ),
                (
                    2,
                    Check("fay", 6),
                    Pass {
                        remaining: 0,
                        reset_ms: 10_000,
                    },
                ),
                (
                    3,
                    Check("gus", 11),
                    Limited {
                        reset_ms: 10_003,
                        retry_ms: 10_000,
                    },
                ),
            ],
        )
        .await;
    }

    pub async fn keys_are_independent(b: Backend) {
        run(
            &b,
            &policy(&[quota(1, 10)]),
            &[
                (
                    0,
                    Check("hal", 1),
                    Pass {
                        remaining: 0,
                        reset_ms: 10_000,
                    },
                ),
                (
                    1,
                    Check("hal", 1),
                    Limited {
                        reset_ms: 10_000,
                        retry_ms: 9_999,
                    },
                ),
                (
                    2,
                    Check("ida", 1),
                    Pass {
                        remaining: 0,
                        reset_ms: 10_002,
                    },
                ),
            ],
        )
        .await;
    }

    pub async fn peek_reports_without_charging(b: Backend) {
        run(
            &b,
            &policy(&[quota(3, 10)]),
            &[
                (
                    0,
                    Peek("jo"),
                    Pass {
                        remaining: 3,
                        reset_ms: 10_000,
                    },
                ),
                (
                    1,
                    Check("jo", 1),
                    Pass {
                        remaining: 2,
                        reset_ms: 10_001,
                    },
                ),
                (
                    2,
                    Peek("jo"),
                    Pass {
                        remaining: 2,
                        reset_ms: 10_001,
                    },
                ),
                (
                    3,
                    Peek("jo"),
                    Pass {
                        remaining: 2,
                        reset_ms: 10_001,
                    },
                ),
                (
                    4,
                    Check("jo", 1),
                    Pass {
                        remaining: 1,
                        reset_ms: 10_001,
                    },
                ),
                // A window whose stored end is past reads as empty, never exhausted
                // (replicas keep such keys until the primary expires them).
                (
                    10_001,
                    Peek("jo"),
                    Pass {
                        remaining: 3,
                        reset_ms: 20_001,
                    },
                ),
            ],
        )
        .await;
    }

    pub async fn refund_gives_back_inside_the_window_only(b: Backend) {
        run(
            &b,
            &policy(&[quota(2, 10)]),
            &[
                (
                    0,
                    Check("kim", 1),
                    Pass {
                        remaining: 1,
                        reset_ms: 10_000,
                    },
                ),
                (
                    1,
                    Check("kim", 1),
                    Pass {
                        remaining: 0,
                        reset_ms: 10_000,
                    },
                ),
                (2, Refund("kim", 1), Done),
                (
                    3,
                    Peek("kim"),
                    Pass {
                        remaining: 1,
                        reset_ms: 10_000,
                    },
                ),
                // Refunding the same receipt again never lifts Remaining above what
                // was really spent; refunding twice leaves zero spent, not less.
                (4, Refund("kim", 0), Done),
                (5, Refund("kim", 0), Done),
                (
                    6,
                    Peek("kim"),
                    Pass {
                        remaining: 2,
                        reset_ms: 10_000,
                    },
                ),
                (
                    7,
                    Check("kim", 1),
                    Pass {
                        remaining: 1,
                        reset_ms: 10_000,
                    },
                ),
                // A new window: the old window's receipt changes nothing.
                (
                    10_000,
                    Check("kim", 1),
                    Pass {
                        remaining: 1,
                        reset_ms: 20_000,
                    },
                ),
                (10_001, Refund("kim", 7), Done),
                (
                    10_002,
                    Peek("kim"),
                    Pass {
                        remaining: 1,
                        reset_ms: 20_000,
                    },
                ),
            ],
        )
        .await;
    }

    pub async fn several_quotas_are_all_or_nothing(b: Backend) {
        // 3 per second and 5 per minute: the minute quota runs out first.
        let p = policy(&[quota(3, 1), quota(5, 60)]);
        let d = run(
            &b,
            &p,
            &[
                (
                    0,
                    Check("lee", 1),
                    Pass {
                        remaining: 2,
                        reset_ms: 1_000,
                    },
                ),
                (
                    1,
                    Check("lee", 1),
                    Pass {
                        remaining: 1,
                        reset_ms: 1_000,
                    },
                ),
                (
                    2,
                    Check("lee", 1),
                    Pass {
                        remaining: 0,
                        reset_ms: 1_000,
                    },
                ),
                (
                    3,
                    Check("lee", 1),
                    Limited {
                        reset_ms: 1_000,
                        retry_ms: 997,
                    },
                ),
                // The minute quota (2 left) is now the tightest and is reported.
                (
                    1_000,
                    Check("lee", 1),
                    Pass {
                        remaining: 1,
                        reset_ms: 60_000,
                    },
                ),
                (
                    1_001,
                    Check("lee", 1),
                    Pass {
                        remaining: 0,
                        reset_ms: 60_000,
                    },
                ),
                // Both reject: the one that frees up last decides Retry-After, and
                // the per-second window is not charged by the rejection.
                (
                    1_002,
                    Check("lee", 1),
                    Limited {
                        reset_ms: 60_000,
                        retry_ms: 58_998,
                    },
                ),
            ],
        )
        .await;
        assert_eq!(d[6].as_ref().unwrap().quota, 1);
        assert_eq!(d[6].as_ref().unwrap().limit, 5);
    }

    pub async fn count_above_a_lowered_limit_keeps_rejecting(b: Backend) {
        // Regression (published scripts test `count == limit`): once a count
        // is above the limit, for instance after the limit was lowered, every
        // request must still be rejected.
        run(
            &b,
            &policy(&[quota(5, 10)]),
            &[(
                0,
                Check("max", 5),
                Pass {
                    remaining: 0,
                    reset_ms: 10_000,
                },
            )],
        )
        .await;
        run(
            &b,
            &policy(&[quota(3, 10)]),
            &[
                (
                    1,
                    Check("max", 1),
                    Limited {
                        reset_ms: 10_000,
                        retry_ms: 9_999,
                    },
                ),
                (
                    2,
                    Check("max", 1),
                    Limited {
                        reset_ms: 10_000,
                        retry_ms: 9_998,
                    },
                ),
            ],
        )
        .await;
    }
}

pub mod leaky_bucket {
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
                (
                    0,
                    Check("bob", 1),
                    Pass {
                        remaining: 2,
                        reset_ms: 100,
                    },
                ),
                (
                    0,
                    Check("bob", 1),
                    Wait {
                        remaining: 1,
                        reset_ms: 200,
                        delay_ms: 100,
                    },
                ),
                (
                    0,
                    Check("bob", 1),
                    Wait {
                        remaining: 0,
                        reset_ms: 300,
                        delay_ms: 200,
                    },
                ),
                (
                    0,
                    Check("bob", 1),
                    Limited {
                        reset_ms: 300,
                        retry_ms: 100,
                    },
                ),
                (
                    50,
                    Check("bob", 1),
                    Limited {
                        reset_ms: 300,
                        retry_ms: 50,
                    },
                ),
                // Rejections took no place: one has drained, so one more fits.
                (
                    100,
                    Check("bob", 1),
                    Wait {
                        remaining: 0,
                        reset_ms: 400,
                        delay_ms: 200,
                    },
                ),
            ],
        )
        .await;
    }

    pub async fn the_bucket_drains_at_the_rate(b: Backend) {
        run(
            &b,
            &policy(3),
            &[
                (
                    0,
                    Check("carol", 1),
                    Pass {
                        remaining: 2,
                        reset_ms: 100,
                    },
                ),
                (
                    0,
                    Check("carol", 1),
                    Wait {
                        remaining: 1,
                        reset_ms: 200,
                        delay_ms: 100,
                    },
                ),
                (
                    0,
                    Check("carol", 1),
                    Wait {
                        remaining: 0,
                        reset_ms: 300,
                        delay_ms: 200,
                    },
                ),
                // Half a place still draining counts as taken.
                (
                    150,
                    Peek("carol"),
                    Wait {
                        remaining: 1,
                        reset_ms: 300,
                        delay_ms: 150,
                    },
                ),
                (
                    250,
                    Peek("carol"),
                    Wait {
                        remaining: 2,
                        reset_ms: 300,
                        delay_ms: 50,
                    },
                ),
                // A stored end that has passed is an empty bucket, expired or not.
                (
                    300,
                    Peek("carol"),
                    Pass {
                        remaining: 3,
                        reset_ms: 300,
                    },
                ),
                (
                    1_000,
                    Check("carol", 1),
                    Pass {
                        remaining: 2,
                        reset_ms: 1_100,
                    },
                ),
            ],
        )
        .await;
    }

    pub async fn cost_takes_as_many_places(b: Backend) {
        run(
            &b,
            &policy(3),
            &[
                (
                    0,
                    Check("dan", 2),
                    Pass {
                        remaining: 1,
                        reset_ms: 200,
                    },
                ),
                (
                    0,
                    Check("dan", 2),
                    Limited {
                        reset_ms: 200,
                        retry_ms: 100,
                    },
                ),
                (
                    0,
                    Check("dan", 1),
                    Wait {
                        remaining: 0,
                        reset_ms: 300,
                        delay_ms: 200,
                    },
                ),
                // More than the bucket holds never fits; Retry-After says by how much.
                (
                    1_000,
                    Check("dan", 4),
                    Limited {
                        reset_ms: 1_000,
                        retry_ms: 100,
                    },
                ),
            ],
        )
        .await;
    }

    pub async fn keys_are_independent(b: Backend) {
        run(
            &b,
            &policy(1),
            &[
                (
                    0,
                    Check("eve", 1),
                    Pass {
                        remaining: 0,
                        reset_ms: 100,
                    },
                ),
                (
                    1,
                    Check("eve", 1),
                    Limited {
                        reset_ms: 100,
                        retry_ms: 99,
                    },
                ),
                (
                    2,
                    Check("fay", 1),
                    Pass {
                        remaining: 0,
                        reset_ms: 102,
                    },
                ),
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
                (
                    0,
                    Check("gus", 1),
                    Pass {
                        remaining: 2,
                        reset_ms: 100,
                    },
                ),
                (
                    0,
                    Check("gus", 1),
                    Wait {
                        remaining: 1,
                        reset_ms: 200,
                        delay_ms: 100,
                    },
                ),
                (
                    0,
                    Check("gus", 1),
                    Wait {
                        remaining: 0,
                        reset_ms: 300,
                        delay_ms: 200,
                    },
                ),
                (10, Refund("gus", 2), Done),
                (
                    11,
                    Check("gus", 1),
                    Wait {
                        remaining: 0,
                        reset_ms: 300,
                        delay_ms: 189,
                    },
                ),
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
                (
                    0,
                    Check("hal", 1),
                    Pass {
                        remaining: 2,
                        reset_ms: 100,
                    },
                ),
                (
                    0,
                    Check("hal", 1),
                    Wait {
                        remaining: 1,
                        reset_ms: 200,
                        delay_ms: 100,
                    },
                ),
                (
                    0,
                    Check("hal", 1),
                    Wait {
                        remaining: 0,
                        reset_ms: 300,
                        delay_ms: 200,
                    },
                ),
                (10, Refund("hal", 1), Done),
                (
                    11,
                    Peek("hal"),
                    Wait {
                        remaining: 1,
                        reset_ms: 200,
                        delay_ms: 189,
                    },
                ),
                (
                    12,
                    Check("hal", 1),
                    Wait {
                        remaining: 0,
                        reset_ms: 300,
                        delay_ms: 188,
                    },
                ),
                (
                    13,
                    Check("hal", 1),
                    Limited {
                        reset_ms: 300,
                        retry_ms: 87,
                    },
                ),
            ],
        )
        .await;
    }

    pub async fn refund_of_a_used_slot_changes_nothing(b: Backend) {
        run(
            &b,
            &policy(3),
            &[
                (
                    0,
                    Check("ida", 1),
                    Pass {
                        remaining: 2,
                        reset_ms: 100,
                    },
                ),
                (
                    0,
                    Check("ida", 1),
                    Wait {
                        remaining: 1,
                        reset_ms: 200,
                        delay_ms: 100,
                    },
                ),
                // The first slot ended at +100 ms: it was used, nothing to give back.
                (150, Refund("ida", 0), Done),
                (
                    150,
                    Peek("ida"),
                    Wait {
                        remaining: 2,
                        reset_ms: 200,
                        delay_ms: 50,
                    },
                ),
                // The second is still running: a 304 may give it back, never below now.
                (160, Refund("ida", 1), Done),
                (
                    160,
                    Peek("ida"),
                    Pass {
                        remaining: 3,
                        reset_ms: 160,
                    },
                ),
            ],
        )
        .await;
    }

    pub async fn a_lowered_capacity_keeps_rejecting(b: Backend) {
        let burst: Vec<Step> = (0..5)
            .map(|i| {
                let expect = if i == 0 {
                    Pass {
                        remaining: 4,
                        reset_ms: 100,
                    }
                } else {
                    Wait {
                        remaining: 4 - i,
                        reset_ms: 100 * (i + 1),
                        delay_ms: 100 * i,
                    }
                };
                (0, Check("jo", 1), expect)
            })
            .collect();
        run(&b, &policy(5), &burst).await;
        run(
            &b,
            &policy(2),
            &[
                (
                    1,
                    Check("jo", 1),
                    Limited {
                        reset_ms: 500,
                        retry_ms: 399,
                    },
                ),
                (
                    2,
                    Peek("jo"),
                    Limited {
                        reset_ms: 500,
                        retry_ms: 298,
                    },
                ),
            ],
        )
        .await;
    }
}

pub mod concurrency {
    //! Cases for the concurrency limit: 2 slots, entries presumed crashed
    //! after 60 s. `Refund` is the release at the end of a response.
    use super::*;
    use std::num::NonZeroU32;

    fn policy(limit: u32) -> Policy {
        Policy::concurrency(
            "slots",
            NonZeroU32::new(limit).unwrap(),
            Duration::from_secs(60),
        )
        .unwrap()
    }

    pub async fn admits_up_to_the_limit_and_a_release_frees_a_slot(b: Backend) {
        run(
            &b,
            &policy(2),
            &[
                (
                    0,
                    Check("bob", 1),
                    Pass {
                        remaining: 1,
                        reset_ms: 60_000,
                    },
                ),
                (
                    1_000,
                    Check("bob", 1),
                    Pass {
                        remaining: 0,
                        reset_ms: 61_000,
                    },
                ),
                // Retry-After is a hint (1 s); Reset is when every slot is surely free.
                (
                    2_000,
                    Check("bob", 1),
                    Limited {
                        reset_ms: 61_000,
                        retry_ms: 1_000,
                    },
                ),
                (3_000, Refund("bob", 0), Done),
                (
                    4_000,
                    Check("bob", 1),
                    Pass {
                        remaining: 0,
                        reset_ms: 64_000,
                    },
                ),
            ],
        )
        .await;
    }

    pub async fn entries_of_crashed_servers_time_out(b: Backend) {
        run(
            &b,
            &policy(2),
            &[
                (
                    0,
                    Check("carol", 1),
                    Pass {
                        remaining: 1,
                        reset_ms: 60_000,
                    },
                ),
                (
                    1,
                    Check("carol", 1),
                    Pass {
                        remaining: 0,
                        reset_ms: 60_001,
                    },
                ),
                // The oldest entry times out in 1 ms: the hint says so.
                (
                    59_999,
                    Check("carol", 1),
                    Limited {
                        reset_ms: 60_001,
                        retry_ms: 1,
                    },
                ),
                (
                    60_000,
                    Check("carol", 1),
                    Pass {
                        remaining: 0,
                        reset_ms: 120_000,
                    },
                ),
            ],
        )
        .await;
    }

    pub async fn peek_reports_without_taking_a_slot(b: Backend) {
        run(
            &b,
            &policy(2),
            &[
                (
                    0,
                    Peek("dan"),
                    Pass {
                        remaining: 2,
                        reset_ms: 0,
                    },
                ),
                (
                    5,
                    Check("dan", 1),
                    Pass {
                        remaining: 1,
                        reset_ms: 60_005,
                    },
                ),
                (
                    6,
                    Peek("dan"),
                    Pass {
                        remaining: 1,
                        reset_ms: 60_005,
                    },
                ),
                (
                    7,
                    Peek("dan"),
                    Pass {
                        remaining: 1,
                        reset_ms: 60_005,
                    },
                ),
                // A timed-out entry never counts, removed yet or not.
                (
                    60_005,
                    Peek("dan"),
                    Pass {
                        remaining: 2,
                        reset_ms: 60_005,
                    },
                ),
            ],
        )
        .await;
    }

    pub async fn cost_takes_as_many_slots(b: Backend) {
        run(
            &b,
            &policy(2),
            &[
                (
                    0,
                    Check("eve", 2),
                    Pass {
                        remaining: 0,
                        reset_ms: 60_000,
                    },
                ),
                (
                    1,
                    Check("eve", 1),
                    Limited {
                        reset_ms: 60_000,
                        retry_ms: 1_000,
                    },
                ),
                (2, Refund("eve", 0), Done),
                (
                    3,
                    Peek("eve"),
                    Pass {
                        remaining: 2,
                        reset_ms: 3,
                    },
                ),
                // More than the limit never fits.
                (
                    4,
                    Check("eve", 3),
                    Limited {
                        reset_ms: 4,
                        retry_ms: 1_000,
                    },
                ),
            ],
        )
        .await;
    }

    pub async fn releases_are_idempotent_and_never_free_another_request(b: Backend) {
        run(
            &b,
            &policy(2),
            &[
                (
                    0,
                    Check("fay", 1),
                    Pass {
                        remaining: 1,
                        reset_ms: 60_000,
                    },
                ),
                (
                    1,
                    Check("fay", 1),
                    Pass {
                        remaining: 0,
                        reset_ms: 60_001,
                    },
                ),
                (2, Refund("fay", 0), Done),
                (3, Refund("fay", 0), Done),
                (
                    4,
                    Peek("fay"),
                    Pass {
                        remaining: 1,
                        reset_ms: 60_001,
                    },
                ),
                (
                    5,
                    Check("fay", 1),
                    Pass {
                        remaining: 0,
                        reset_ms: 60_005,
                    },
                ),
                (6, Refund("fay", 0), Done),
                (
                    7,
                    Check("fay", 1),
                    Limited {
                        reset_ms: 60_005,
                        retry_ms: 1_000,
                    },
                ),
            ],
        )
        .await;
    }

    pub async fn keys_are_independent(b: Backend) {
        run(
            &b,
            &policy(1),
            &[
                (
                    0,
                    Check("gus", 1),
                    Pass {
                        remaining: 0,
                        reset_ms: 60_000,
                    },
                ),
                (
                    1,
                    Check("gus", 1),
                    Limited {
                        reset_ms: 60_000,
                        retry_ms: 1_000,
                    },
                ),
                (
                    2,
                    Check("hal", 1),
                    Pass {
                        remaining: 0,
                        reset_ms: 60_002,
                    },
                ),
            ],
        )
        .await;
    }

    pub async fn a_lowered_limit_keeps_rejecting(b: Backend) {
        let d = run(
            &b,
            &policy(3),
            &[
                (
                    0,
                    Check("ida", 1),
                    Pass {
                        remaining: 2,
                        reset_ms: 60_000,
                    },
                ),
                (
                    1,
                    Check("ida", 1),
                    Pass {
                        remaining: 1,
                        reset_ms: 60_001,
                    },
                ),
                (
                    2,
                    Check("ida", 1),
                    Pass {
                        remaining: 0,
                        reset_ms: 60_002,
                    },
                ),
            ],
        )
        .await;
        let lowered = policy(2);
        run(
            &b,
            &lowered,
            &[(
                3,
                Check("ida", 1),
                Limited {
                    reset_ms: 60_002,
                    retry_ms: 1_000,
                },
            )],
        )
        .await;
        b.store
            .refund(&lowered, &Key::new("ida"), &d[0].as_ref().unwrap().receipt)
            .await
            .unwrap();
        run(
            &b,
            &lowered,
            &[(
                4,
                Check("ida", 1),
                Limited {
                    reset_ms: 60_002,
                    retry_ms: 1_000,
                },
            )],
        )
        .await;
        b.store
            .refund(&lowered, &Key::new("ida"), &d[1].as_ref().unwrap().receipt)
            .await
            .unwrap();
        run(
            &b,
            &lowered,
            &[(
                5,
                Check("ida", 1),
                Pass {
                    remaining: 0,
                    reset_ms: 60_005,
                },
            )],
        )
        .await;
    }
}

/// One `#[tokio::test]` per case for the backend built by `$factory`
/// (an `async fn() -> Backend`, named by an absolute path such as
/// `crate::memory`: the cases live in nested modules, one per strategy).
#[macro_export]
macro_rules! conformance_suite {
    ($factory:path) => {
        $crate::conformance_suite!(@cases $factory; fixed_window;
            window_opens_counts_down_and_rejects,
            reset_at_is_stored_not_recomputed,
            window_rolls_over_at_its_stored_end,
            rejections_charge_nothing,
            cost_counts_and_cost_above_limit_is_rejected,
            keys_are_independent,
            peek_reports_without_charging,
            refund_gives_back_inside_the_window_only,
            several_quotas_are_all_or_nothing,
            count_above_a_lowered_limit_keeps_rejecting,
        );
        $crate::conformance_suite!(@cases $factory; uniform_gate;
            one_call_per_caller_per_span,
            uniform_gate_is_not_open_a_second_early_like_ttl_checks,
            cost_closes_for_that_many_spans_and_peek_charges_nothing,
            refund_reopens_only_for_its_own_pass,
        );
        $crate::conformance_suite!(@cases $factory; sliding_log;
            resource_and_consumer_limits_both_apply_and_say_which_rejected,
            the_window_slides_to_the_microsecond,
            sliding_log_members_do_not_collide_on_equal_microseconds,
            limit_compares_with_ge_not_eq,
            cost_counts_units_and_cost_above_the_limit_is_rejected,
            peek_and_refund_touch_only_their_own_entries,
        );
        $crate::conformance_suite!(@cases $factory; sliding_window;
            the_previous_window_weighs_by_its_overlap,
            peek_and_cost,
            several_quotas_are_all_or_nothing,
            refund_goes_back_to_the_charged_window,
            count_above_a_lowered_limit_keeps_rejecting,
        );
        $crate::conformance_suite!(@cases $factory; gcra;
            a_full_bucket_passes_its_burst_then_one_per_interval,
            cost_and_peek,
            refund_moves_tat_back_but_never_before_its_charge,
            a_lowered_burst_keeps_rejecting,
            emission_interval_rounds_up_to_whole_microseconds,
        );
        $crate::conformance_suite!(@cases $factory; leaky_bucket;
            a_burst_is_queued_at_the_rate_then_rejected,
            the_bucket_drains_at_the_rate,
            cost_takes_as_many_places,
            keys_are_independent,
            refund_of_the_last_place_is_exact,
            refund_from_the_middle_frees_a_place_for_the_next_arrival,
            refund_of_a_used_slot_changes_nothing,
            a_lowered_capacity_keeps_rejecting,
        );
        $crate::conformance_suite!(@cases $factory; concurrency;
            admits_up_to_the_limit_and_a_release_frees_a_slot,
            entries_of_crashed_servers_time_out,
            peek_reports_without_taking_a_slot,
            cost_takes_as_many_slots,
            releases_are_idempotent_and_never_free_another_request,
            keys_are_independent,
            a_lowered_limit_keeps_rejecting,
        );
    };
    (@cases $factory:path; $strategy:ident; $($case:ident),* $(,)?) => {
        mod $strategy {
            $(
                #[tokio::test]
                async fn $case() {
                    $crate::support::conformance::$strategy::$case($factory().await).await;
                }
            )*
        }
    };
}
