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

/// [`Expect::Wait`] in one short line.
pub const fn wait(remaining: u64, reset_ms: u64, delay_ms: u64) -> Expect {
    Expect::Wait {
        remaining,
        reset_ms,
        delay_ms,
    }
}

/// [`Expect::Limited`] in one short line.
pub const fn limited(reset_ms: u64, retry_ms: u64) -> Expect {
    Expect::Limited { reset_ms, retry_ms }
}

// Each strategy's cases, beside this file.
pub mod concurrency;
pub mod fixed_window;
pub mod gcra;
pub mod leaky_bucket;
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
