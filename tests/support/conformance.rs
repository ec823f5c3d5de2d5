//! The store conformance suite: written once, run against every backend.
//!
//! Each case is one [`Row`]: a policy and steps at explicit times on a
//! `ManualClock`, and what each step must answer. A strategy's rows live in
//! its own file beside this one, named once in its `<strategy>_rows!`
//! table; a backend is any `Store` built on that clock.
//! `conformance_suite!(factory)` expands to one `#[tokio::test]` per row, so
//! a topology opts in with one line and a failure names the row, the
//! strategy and the backend's module.

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

/// An override of each of `policy`'s quotas, each made by `of`.
fn every_quota(policy: &Policy, of: impl Fn(&Quota) -> Quota) -> tollgate::Override {
    let quotas = policy.quotas();
    quotas[1..]
        .iter()
        .fold(tollgate::Override::new(of(&quotas[0])), |o, q| o.and(of(q)))
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
    /// Settle the receipt of step number `n` to an actual cost of `units`.
    Settle(&'static str, usize, u64),
    /// Give `key` an override: `limit` per `secs` seconds for each of the
    /// policy's quotas, until `until` ms after `T0` (0: no end).
    SetOverride(&'static str, u32, u64, u64),
    /// Clear `key`'s override.
    ClearOverride(&'static str),
    /// Block `key` for `ms` (the operator's block).
    Block(&'static str, u64),
    /// Forget `key`'s state (the operator's reset).
    Reset(&'static str),
    /// Replace the policy's quotas for every caller: `limit` per `secs`
    /// seconds for each quota, until `until` ms after `T0` (0: no end).
    SetPolicyLimit(u32, u64, u64),
    /// Cap every caller at `limit` per quota (the policy's windows).
    SetPolicyCap(u32),
    /// Clear the policy's runtime limit.
    ClearPolicyLimit,
    /// Clear the policy's cap.
    ClearPolicyCap,
}

/// What the step must answer. Times are ms after `T0` (µs in a
/// [`Row::in_micros`] row).
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
    /// Refused by the penalty box until `until_ms`, with the limit it was
    /// judged against.
    Blocked { until_ms: u64, limit: u64 },
    /// Allowed, judged against `limit`, with `remaining` left.
    PassOf { limit: u64, remaining: u64 },
    /// No decision to check (refunds, settles).
    Done,
    /// The store refused the call (a settle with nothing to settle).
    Refused,
}

pub use Expect::{Done, Limited, Pass, Refused, Wait};
pub use Op::{
    Block, Check, ClearOverride, ClearPolicyCap, ClearPolicyLimit, Peek, Refund, Reset,
    SetOverride, SetPolicyCap, SetPolicyLimit, Settle,
};

/// [`Expect::Blocked`] in one short line.
pub const fn blocked(until_ms: u64, limit: u64) -> Expect {
    Expect::Blocked { until_ms, limit }
}

/// [`Expect::PassOf`] in one short line.
pub const fn pass_of(limit: u64, remaining: u64) -> Expect {
    Expect::PassOf { limit, remaining }
}

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
pub mod aligned_window;
pub mod caller;
pub mod concurrency;
pub mod fixed_window;
pub mod gcra;
pub mod in_force;
// The give-back rows run as two tables (see `in_force_rows!`), each
// named after its module.
pub use in_force as in_force_counted;
pub use in_force as in_force_gcra;
pub mod leaky_bucket;
pub mod sliding_log;
pub mod sliding_window;
pub mod uniform_gate;

/// One step: at `at` (ms after `T0`, or µs in a [`Row::in_micros`] row),
/// do `op`, expect `expect`.
pub type Step = (u64, Op, Expect);

/// What a row asserts beyond each step's answer, given every decision.
pub type Then = Box<dyn Fn(&[Option<Decision>])>;

/// One conformance case: steps under a policy, then perhaps more steps
/// under a changed one (a lowered limit), and perhaps an assertion on the
/// decisions seen. `Refund(key, n)` refunds step `n` of the whole row.
pub struct Row {
    phases: Vec<(Policy, Vec<Step>)>,
    then: Vec<Then>,
    unit_us: u64,
    /// The policy refunds, settles and resets are sent with, when not the
    /// phase's: a give-back made under another policy than the one that
    /// charged (a limit the request brought, gone by then).
    give_back_under: Option<Policy>,
}

impl Row {
    /// `steps` under `policy`, times in ms.
    pub fn new(policy: Policy, steps: impl IntoIterator<Item = Step>) -> Row {
        Row {
            phases: vec![(policy, steps.into_iter().collect())],
            then: Vec::new(),
            unit_us: 1_000,
            give_back_under: None,
        }
    }

    /// Sends refunds, settles and resets with `policy` instead of the
    /// phase's.
    pub fn giving_back_under(mut self, policy: Policy) -> Row {
        self.give_back_under = Some(policy);
        self
    }

    /// Then `steps` under `policy`: the same keys, the policy changed.
    pub fn then_under(mut self, policy: Policy, steps: impl IntoIterator<Item = Step>) -> Row {
        self.phases.push((policy, steps.into_iter().collect()));
        self
    }

    /// Then asserts `check` of every step's decision (`None` for refunds).
    pub fn then(mut self, check: impl Fn(&[Option<Decision>]) + 'static) -> Row {
        self.then.push(Box::new(check));
        self
    }

    /// Times, resets, retries and delays in µs, not ms.
    pub fn in_micros(mut self) -> Row {
        self.unit_us = 1;
        self
    }

    /// Runs the row against `backend` and checks every answer, naming the
    /// step that disagreed.
    pub async fn run(self, backend: &Backend) {
        let mut seen: Vec<Option<Decision>> = Vec::new();
        for (policy, steps) in &self.phases {
            for &step in steps {
                let under = self.give_back_under.as_ref().unwrap_or(policy);
                let decision = run_step(backend, (policy, under), step, self.unit_us, &seen).await;
                seen.push(decision);
            }
        }
        for check in &self.then {
            check(&seen);
        }
    }
}

/// Runs step number `seen.len()` and checks its answer.
async fn run_step(
    backend: &Backend,
    (policy, give_back_under): (&Policy, &Policy),
    (at, op, expect): Step,
    unit_us: u64,
    seen: &[Option<Decision>],
) -> Option<Decision> {
    let i = seen.len();
    let us = |n: u64| n * unit_us;
    let time = |n: u64| Duration::from_micros(us(n));
    backend.clock.set(T0 + us(at));
    // Decisions and peeks are judged by the limits set at runtime, as a
    // layer judges them.
    let in_force = backend.store.policy_in_force(policy);
    let judged = in_force.as_deref().unwrap_or(policy);
    let decision = match op {
        Op::Check(key, cost) => Some(
            backend
                .store
                .check(judged, &Key::new(key), cost)
                .await
                .unwrap(),
        ),
        Op::Peek(key) => Some(backend.store.peek(judged, &Key::new(key)).await.unwrap()),
        Op::Refund(key, n) => {
            let receipt: Receipt = seen[n]
                .as_ref()
                .expect("refund of a step with a decision")
                .receipt
                .clone();
            backend
                .store
                .refund(give_back_under, &Key::new(key), &receipt)
                .await
                .unwrap();
            None
        }
        Op::Settle(key, n, units) => {
            let receipt: Receipt = seen[n]
                .as_ref()
                .expect("settle of a step with a decision")
                .receipt
                .clone();
            let settled = backend
                .store
                .settle(give_back_under, &Key::new(key), &receipt, units)
                .await;
            if let (Expect::Refused, Err(_)) = (expect, &settled) {
                return None;
            }
            settled.unwrap();
            None
        }
        Op::SetOverride(key, limit, secs, until) => {
            let q = quota(limit, secs);
            let mut o = tollgate::Override::new(q);
            for _ in 1..policy.quotas().len() {
                o = o.and(q);
            }
            if until > 0 {
                o = o.ending_at_micros(T0 + us(until));
            }
            backend
                .store
                .set_override(policy, &Key::new(key), &o)
                .await
                .unwrap();
            let read = backend.store.get_override(policy, &Key::new(key)).await;
            assert_eq!(read.unwrap(), Some(o), "the override reads back");
            None
        }
        Op::ClearOverride(key) => {
            backend
                .store
                .clear_override(policy, &Key::new(key))
                .await
                .unwrap();
            None
        }
        Op::Block(key, ms) => {
            backend
                .store
                .block(policy, &Key::new(key), time(ms))
                .await
                .unwrap();
            None
        }
        Op::Reset(key) => {
            backend
                .store
                .reset(give_back_under, &Key::new(key))
                .await
                .unwrap();
            None
        }
        Op::SetPolicyLimit(limit, secs, until) => {
            let mut o = every_quota(policy, |_| quota(limit, secs));
            if until > 0 {
                o = o.ending_at_micros(T0 + us(until));
            }
            let which = tollgate::PolicyLimit::Limit;
            backend
                .store
                .set_policy_limit(policy, which, Some(&o))
                .await
                .unwrap();
            let read = backend.store.policy_limits(policy).await.unwrap();
            assert_eq!(read.limit, Some(o), "the limit reads back");
            None
        }
        Op::SetPolicyCap(limit) => {
            let o = every_quota(policy, |q| Quota::new(limit, q.window()).unwrap());
            let which = tollgate::PolicyLimit::Cap;
            backend
                .store
                .set_policy_limit(policy, which, Some(&o))
                .await
                .unwrap();
            None
        }
        Op::ClearPolicyLimit | Op::ClearPolicyCap => {
            let which = match op {
                Op::ClearPolicyLimit => tollgate::PolicyLimit::Limit,
                _ => tollgate::PolicyLimit::Cap,
            };
            backend
                .store
                .set_policy_limit(policy, which, None)
                .await
                .unwrap();
            None
        }
    };
    let here = format!("step {i} at +{at}: {op:?}");
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
            assert_eq!(d.reset_at_micros, T0 + us(reset_ms), "{here}: reset-at");
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
            assert_eq!(d.reset_at_micros, T0 + us(reset_ms), "{here}: reset-at");
            assert_eq!(d.retry_after, None, "{here}: retry-after");
            assert_eq!(d.delay, Some(time(delay_ms)), "{here}: delay");
        }
        (Expect::Limited { reset_ms, retry_ms }, Some(d)) => {
            assert!(!d.allowed, "{here}: expected a rejection, got {d:?}");
            assert_eq!(d.remaining, 0, "{here}: remaining");
            assert_eq!(d.reset_at_micros, T0 + us(reset_ms), "{here}: reset-at");
            assert_eq!(d.retry_after, Some(time(retry_ms)), "{here}: retry-after");
        }
        (Expect::Blocked { until_ms, limit }, Some(d)) => {
            assert!(
                !d.allowed && d.blocked,
                "{here}: expected a block, got {d:?}"
            );
            assert_eq!(d.remaining, 0, "{here}: remaining");
            assert_eq!(d.limit, limit, "{here}: limit");
            assert_eq!(d.used, limit, "{here}: a block withholds the whole quota");
            assert_eq!(d.reset_at_micros, T0 + us(until_ms), "{here}: reset-at");
            assert_eq!(
                d.retry_after,
                Some(time(until_ms - at)),
                "{here}: retry-after"
            );
        }
        (Expect::PassOf { limit, remaining }, Some(d)) => {
            assert!(
                d.allowed && !d.blocked,
                "{here}: expected a pass, got {d:?}"
            );
            assert_eq!(d.limit, limit, "{here}: limit");
            assert_eq!(d.remaining, remaining, "{here}: remaining");
        }
        (Expect::Done, None) => {}
        (e, d) => panic!("{here}: expected {e:?}, got {d:?}"),
    }
    decision
}

/// One `#[tokio::test]` per row of every strategy for the backend built by
/// `$factory` (an `async fn() -> Backend`, named by an absolute path such as
/// `crate::memory`: the tests live in nested modules, one per strategy).
/// A new strategy adds its `<name>_rows!` here.
#[macro_export]
macro_rules! conformance_suite {
    ($factory:path) => {
        $crate::fixed_window_rows!($factory);
        $crate::uniform_gate_rows!($factory);
        $crate::sliding_log_rows!($factory);
        $crate::sliding_window_rows!($factory);
        $crate::gcra_rows!($factory);
        $crate::leaky_bucket_rows!($factory);
        $crate::concurrency_rows!($factory);
        $crate::aligned_window_rows!($factory);
        $crate::caller_rows!($factory);
        $crate::in_force_rows!($factory);
    };
}

/// A strategy's table, `name => row, ...`, as one `#[tokio::test]` per row
/// in a module named after the strategy. Each strategy's `<name>_rows!`
/// passes its rows here; the rows see that strategy's file and this one.
#[macro_export]
macro_rules! conformance_rows {
    ($strategy:ident, $factory:path; $($name:ident => $row:expr),* $(,)?) => {
        mod $strategy {
            #[allow(unused_imports)]
            use $crate::support::conformance::{$strategy::*, *};
            $(
                #[tokio::test]
                async fn $name() {
                    let row: Row = $row;
                    row.run(&$factory().await).await;
                }
            )*
        }
    };
}
