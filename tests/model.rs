//! A model the code cannot share: random sequences of admissions, give-backs
//! (a `304`'s refund, settles below and above the estimate, releases),
//! resets and an operator's changes (a caller's override, a runtime limit
//! and a cap: set, cleared and expiring mid-sequence), with time moving,
//! driven through [`RateLimiter`] on the memory store, on Redis and on a
//! leasing Redis store. Every step is checked against invariants written
//! from the definitions, not from either implementation:
//!
//! - **The limit holds.** Over any span of one window, what passed minus
//!   what was honestly given back is at most what the limits in force over
//!   that span allow: twice the highest limit (two windows, or a full
//!   bucket and a window's refill) for the counting windows, GCRA, the
//!   leaky bucket and the uniform gate; the limit itself for the sliding
//!   log; and for the concurrency limit, the slots held at once.
//! - **A give-back never returns more than it charged.** At one instant,
//!   what a peek shows as remaining grows by at most the units given back.
//! - **The headers add up.** `used + remaining == limit` on every decision.
//! - **Reset never moves earlier** for a caller refused twice with nothing
//!   given back or changed in between.
//!
//! The limit in force is the model's own reading of the documented
//! precedence (a cap beats everything, and sets aside an override above it;
//! an override beats the runtime limit, which beats the policy as built).

mod support;

use std::num::NonZeroU32;
use std::time::Duration;

use proptest::prelude::*;
use support::conformance::T0;
use tollgate::clock::{Clock, ManualClock};
use tollgate::store::Leases;
use tollgate::{Decision, Key, MemoryStore, Override, Policy, Quota, RateLimiter, RedisStore};

use support::redis::{shared_connection as connection, PROPTEST_RUNTIME as RUNTIME};

/// Every policy's window, µs.
const WINDOW: u64 = 1_000_000;
/// The policies' limit as built.
const BUILT: u32 = 4;
/// How long a concurrency slot is held at most.
const SLOT_TIMEOUT: u64 = 2_000_000;

fn q(limit: u32) -> Quota {
    Quota::new(limit, Duration::from_micros(WINDOW)).unwrap()
}

/// How many units a strategy lets pass over one window, at a limit `l`.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Bound {
    /// At most twice the limit over any span of one window: two counting
    /// windows, or a full bucket and one window's refill.
    TwiceTheLimit,
    /// At most the limit over any span of one window.
    TheLimit,
    /// At most the limit held at once (slots end when given back, or after
    /// the slot's timeout).
    HeldAtOnce,
    /// One pass per span, whatever its cost: a uniform gate closes for as
    /// many spans as the pass cost.
    OnePass,
}

struct Case {
    policy: Policy,
    bound: Bound,
    /// Whether the strategy's units are time (GCRA, the leaky bucket): a
    /// unit is a window over the limit in force, so a unit given back
    /// after the limit changed is worth the new limit over the old in
    /// units of the new one.
    timed: bool,
    /// Whether an operator's limits apply (a uniform gate's limit is 1).
    adjustable: bool,
}

fn cases() -> Vec<Case> {
    let n = |x| NonZeroU32::new(x).unwrap();
    let both = |p: Policy| p.overridable().adjustable();
    vec![
        Case {
            policy: both(Policy::fixed_window("fixed", q(BUILT))),
            bound: Bound::TwiceTheLimit,
            timed: false,
            adjustable: true,
        },
        Case {
            policy: both(Policy::aligned_window("aligned", q(BUILT))),
            bound: Bound::TwiceTheLimit,
            timed: false,
            adjustable: true,
        },
        Case {
            policy: both(Policy::sliding_window("window", q(BUILT))),
            bound: Bound::TwiceTheLimit,
            timed: false,
            adjustable: true,
        },
        Case {
            policy: both(Policy::sliding_log("log", q(BUILT), q(BUILT))),
            bound: Bound::TheLimit,
            timed: false,
            adjustable: true,
        },
        Case {
            policy: both(Policy::gcra("gcra", q(BUILT), n(BUILT))),
            bound: Bound::TwiceTheLimit,
            timed: true,
            adjustable: true,
        },
        Case {
            policy: both(Policy::leaky_bucket("leaky", q(BUILT), n(BUILT))),
            bound: Bound::TwiceTheLimit,
            timed: true,
            adjustable: true,
        },
        Case {
            policy: both(Policy::uniform_gate("gate", Duration::from_micros(WINDOW)).unwrap()),
            bound: Bound::OnePass,
            timed: false,
            adjustable: false,
        },
        Case {
            policy: both(
                Policy::concurrency("slots", n(BUILT), Duration::from_micros(SLOT_TIMEOUT))
                    .unwrap(),
            ),
            bound: Bound::HeldAtOnce,
            timed: false,
            adjustable: true,
        },
    ]
}

/// One step of a sequence.
#[derive(Debug, Clone, Copy)]
enum Op {
    /// An admission of `cost` units.
    Check { cost: u64 },
    /// The `304`'s refund (or a release) of an earlier pass, picked modulo
    /// the passes not yet given back.
    GiveBack { pick: usize },
    /// An earlier pass settled to `actual` units (below or above its cost).
    Settle { pick: usize, actual: u64 },
    /// The caller's state forgotten.
    Reset,
    /// The caller's override: a limit, ending after `lasts` µs (0: never);
    /// `None` clears it.
    Override { limit: Option<u32>, lasts: u64 },
    /// The runtime limit for every caller; `None` clears it.
    Limit { limit: Option<u32>, lasts: u64 },
    /// The cap for every caller; `None` clears it.
    Cap { limit: Option<u32>, lasts: u64 },
    /// Time moves on, µs.
    Wait { micros: u64 },
}

fn limit() -> impl Strategy<Value = Option<u32>> {
    prop_oneof![1 => Just(None), 4 => prop::sample::select(vec![1u32, 2, 3, 8, 20, 40]).prop_map(Some)]
}

fn lasts() -> impl Strategy<Value = u64> {
    prop_oneof![2 => Just(0u64), 1 => 1..3 * WINDOW]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => prop_oneof![4 => Just(1u64), 1 => 2..4u64].prop_map(|cost| Op::Check { cost }),
        3 => any::<usize>().prop_map(|pick| Op::GiveBack { pick }),
        2 => (any::<usize>(), 0..7u64).prop_map(|(pick, actual)| Op::Settle { pick, actual }),
        1 => Just(Op::Reset),
        1 => (limit(), lasts()).prop_map(|(limit, lasts)| Op::Override { limit, lasts }),
        1 => (limit(), lasts()).prop_map(|(limit, lasts)| Op::Limit { limit, lasts }),
        1 => (limit(), lasts()).prop_map(|(limit, lasts)| Op::Cap { limit, lasts }),
        4 => prop_oneof![
            2 => 0..50_000u64,
            1 => 0..WINDOW,
            1 => (0..10u64).prop_map(|tenths| tenths * WINDOW / 10),
        ]
        .prop_map(|micros| Op::Wait { micros }),
    ]
}

/// A limit an operator set, and until when (µs; `None`: no end).
#[derive(Debug, Clone, Copy)]
struct Set {
    limit: u32,
    until: Option<u64>,
}

impl Set {
    fn at(self, now: u64) -> Option<u32> {
        self.until
            .is_none_or(|until| now < until)
            .then_some(self.limit)
    }
}

/// What the model knows: the operator's settings, and every pass with the
/// units it still holds.
#[derive(Default)]
struct Model {
    over: Option<Set>,
    runtime: Option<Set>,
    cap: Option<Set>,
    /// Passes since the last reset: (when, units still counted, decision,
    /// the limit in force when it was charged).
    passes: Vec<(u64, u64, Decision, u32)>,
    /// Given back or settled already: their index in `passes`.
    settled: Vec<bool>,
    /// The limit in force at each moment it changed (or was set), µs.
    history: Vec<(u64, u32)>,
    /// The last refusal's reset and cost, while nothing was given back or
    /// changed.
    refused_until: Option<(u64, u64)>,
}

impl Model {
    /// The limit in force at `now`, by the documented precedence: the cap
    /// beats all and sets aside an override above it; an override beats
    /// the runtime limit, which beats the policy as built.
    fn in_force(&self, now: u64, adjustable: bool) -> u32 {
        if !adjustable {
            return 1;
        }
        let cap = self.cap.and_then(|c| c.at(now));
        let over = self
            .over
            .and_then(|o| o.at(now))
            .filter(|o| cap.is_none_or(|c| o <= &c));
        let chosen = over
            .or_else(|| self.runtime.and_then(|r| r.at(now)))
            .unwrap_or(BUILT);
        cap.map_or(chosen, |c| chosen.min(c))
    }

    /// The highest limit in force at any moment of `[from, to]`, the
    /// moments the settings expire included.
    fn highest(&self, from: u64, to: u64, adjustable: bool) -> u32 {
        let mut moments = vec![from, to];
        moments.extend(self.history.iter().map(|&(t, _)| t));
        for set in [self.over, self.runtime, self.cap].into_iter().flatten() {
            moments.extend(set.until);
        }
        let mut highest = self
            .history
            .iter()
            .filter(|&&(t, _)| t >= from && t <= to)
            .map(|&(_, l)| l)
            .max()
            .unwrap_or(0);
        // The limit in force when the span began.
        let before = self.history.iter().rev().find(|&&(t, _)| t <= from);
        highest = highest.max(before.map_or(self.in_force(from, adjustable), |&(_, l)| l));
        for t in moments.into_iter().filter(|t| (from..=to).contains(t)) {
            highest = highest.max(self.in_force(t, adjustable));
        }
        highest
    }
}

/// The three stores a sequence runs on.
#[derive(Debug, Clone, Copy)]
enum On {
    Memory,
    Redis,
    Leasing,
}

async fn limiter(policy: &Policy, on: On, clock: &ManualClock) -> RateLimiter {
    let redis = |leases: bool| async move {
        let builder = RedisStore::from_manager(connection().await)
            .prefix(support::redis::unique_prefix("model"))
            .clock(clock.clone());
        let builder = if leases {
            builder.leases(Leases::new().hot_after(NonZeroU32::new(2).unwrap()))
        } else {
            builder
        };
        builder.build().unwrap()
    };
    match on {
        On::Memory => RateLimiter::new(policy.clone(), MemoryStore::with_clock(clock.clone())),
        On::Redis => RateLimiter::new(policy.clone(), redis(false).await),
        On::Leasing => RateLimiter::new(policy.clone(), redis(true).await),
    }
    .unwrap()
}

fn quota_of(policy: &Policy, limit: u32) -> Override {
    let quotas = policy.quotas();
    let quota = |q: &Quota| Quota::new(limit, q.window()).unwrap();
    quotas[1..]
        .iter()
        .fold(Override::new(quota(&quotas[0])), |o, q| o.and(quota(q)))
}

/// The numbers every decision must add up to.
fn adds_up(what: &str, d: &Decision) -> Result<(), TestCaseError> {
    prop_assert_eq!(
        d.used + d.remaining,
        d.limit,
        "{}: used {} + remaining {} != limit {}",
        what,
        d.used,
        d.remaining,
        d.limit
    );
    Ok(())
}

async fn run(case: &Case, on: On, steps: &[Op]) -> Result<(), TestCaseError> {
    let clock = ManualClock::new(T0);
    let limiter = limiter(&case.policy, on, &clock).await;
    let caller = Key::new("caller");
    let mut model = Model::default();
    model
        .history
        .push((T0, model.in_force(T0, case.adjustable)));
    let name = case.policy.name();
    for (i, &op) in steps.iter().enumerate() {
        let now = clock.now_micros();
        let before = model.in_force(now, case.adjustable);
        match op {
            Op::Check { cost } => {
                let d = limiter.check(&caller, cost).await.unwrap();
                adds_up(&format!("{name} on {on:?}, step {i} {op:?}"), &d)?;
                if d.allowed {
                    model.passes.push((now, cost, d, before));
                    model.settled.push(false);
                } else if cost <= u64::from(before) {
                    // When a request like this one would pass can only
                    // move later while nothing is given back or changed:
                    // for one costing as much or more, and that can fit.
                    let reset = d.reset_at_micros;
                    if let Some((earlier, earlier_cost)) = model.refused_until
                        && cost >= earlier_cost
                    {
                        prop_assert!(
                            reset >= earlier,
                            "{} on {:?}, step {}: a refused caller's reset moved from {} to {}",
                            name,
                            on,
                            i,
                            earlier,
                            reset
                        );
                    }
                    model.refused_until = Some((reset, cost));
                }
            }
            Op::GiveBack { pick } | Op::Settle { pick, .. } => {
                let open: Vec<usize> = (0..model.passes.len())
                    .filter(|&j| !model.settled[j])
                    .collect();
                if open.is_empty() {
                    continue;
                }
                let j = open[pick % open.len()];
                let (_, charged, decision, charged_under) = model.passes[j].clone();
                let actual = match op {
                    Op::Settle { actual, .. } if case.bound != Bound::HeldAtOnce => actual,
                    _ => 0,
                };
                let peek_before = limiter.peek(&caller).await.unwrap();
                if actual == 0 {
                    limiter.refund(&caller, &decision).await.unwrap();
                } else {
                    let settled = limiter.settle(&caller, &decision, actual).await.unwrap();
                    adds_up(
                        &format!("{name} on {on:?}, step {i} {op:?} (settled)"),
                        &settled,
                    )?;
                }
                let peek_after = limiter.peek(&caller).await.unwrap();
                let given = charged.saturating_sub(actual);
                // In the units of the limit in force now: a unit of time
                // charged under another limit is worth `before / charged_under`.
                let worth = match case.timed {
                    true => (given * u64::from(before)).div_ceil(u64::from(charged_under)),
                    false => given,
                };
                prop_assert!(
                    peek_after.remaining <= peek_before.remaining + worth,
                    "{} on {:?}, step {}: giving back {} of {} units (charged at a limit of {}, \
                     {} now) raised remaining from {} to {}",
                    name,
                    on,
                    i,
                    given,
                    charged,
                    charged_under,
                    before,
                    peek_before.remaining,
                    peek_after.remaining
                );
                model.passes[j].1 = charged.min(actual);
                model.settled[j] = true;
                if given > 0 {
                    model.refused_until = None;
                }
            }
            Op::Reset => {
                limiter.reset(&caller).await.unwrap();
                model.passes.clear();
                model.settled.clear();
                model.refused_until = None;
            }
            Op::Override { limit, lasts }
            | Op::Limit { limit, lasts }
            | Op::Cap { limit, lasts } => {
                if !case.adjustable {
                    continue;
                }
                let until = (lasts > 0).then_some(now + lasts);
                let set = limit.map(|limit| Set { limit, until });
                let value = limit.map(|l| {
                    let o = quota_of(&case.policy, l);
                    match until {
                        Some(until) => o.ending_at_micros(until),
                        None => o,
                    }
                });
                match (op, value) {
                    (Op::Override { .. }, Some(o)) => {
                        limiter.set_override(&caller, o).await.unwrap()
                    }
                    (Op::Override { .. }, None) => {
                        limiter.clear_override(&caller).await.unwrap();
                    }
                    (Op::Limit { .. }, Some(o)) => limiter.set_policy_limit(o).await.unwrap(),
                    (Op::Limit { .. }, None) => {
                        limiter.clear_policy_limit().await.unwrap();
                    }
                    (_, Some(o)) => limiter.set_policy_cap(o).await.unwrap(),
                    (_, None) => {
                        limiter.clear_policy_cap().await.unwrap();
                    }
                }
                match op {
                    Op::Override { .. } => model.over = set,
                    Op::Limit { .. } => model.runtime = set,
                    _ => model.cap = set,
                }
            }
            Op::Wait { micros } => clock.advance(Duration::from_micros(micros)),
        }
        let now = clock.now_micros();
        let after = model.in_force(now, case.adjustable);
        if after != before || !matches!(op, Op::Check { .. } | Op::Wait { .. }) {
            model.history.push((now, after));
        }
        if after != before {
            model.refused_until = None;
        }
        check_the_limit(case, on, &model, now, i)?;
    }
    Ok(())
}

/// The limit holds over the window that ends now.
fn check_the_limit(
    case: &Case,
    on: On,
    model: &Model,
    now: u64,
    step: usize,
) -> Result<(), TestCaseError> {
    let span = match case.bound {
        Bound::HeldAtOnce => SLOT_TIMEOUT,
        _ => WINDOW,
    };
    let from = now.saturating_sub(span);
    let highest = u64::from(model.highest(from, now, case.adjustable));
    let allowed = match case.bound {
        Bound::TwiceTheLimit => 2 * highest,
        Bound::TheLimit | Bound::HeldAtOnce | Bound::OnePass => highest,
    };
    let counted: u64 = model
        .passes
        .iter()
        .filter(|(at, ..)| match case.bound {
            // A slot still held: not given back, not timed out.
            Bound::HeldAtOnce => now - at < SLOT_TIMEOUT,
            _ => *at > from,
        })
        .map(|&(_, units, ..)| match case.bound {
            Bound::OnePass => u64::from(units > 0),
            _ => units,
        })
        .sum();
    prop_assert!(
        counted <= allowed,
        "{} on {:?}, step {}: {} units passed in the {} µs before {} where the limits in force allow {}",
        case.policy.name(),
        on,
        step,
        counted,
        span,
        now,
        allowed
    );
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 48,
        max_shrink_iters: 200,
        ..ProptestConfig::default()
    })]

    #[test]
    fn the_limit_in_force_holds_under_every_combination(steps in prop::collection::vec(op(), 1..60)) {
        RUNTIME.block_on(async {
            for case in cases() {
                for on in [On::Memory, On::Redis, On::Leasing] {
                    run(&case, on, &steps).await?;
                }
            }
            Ok::<(), TestCaseError>(())
        })?;
    }
}

/// Sequences that once let too much through, each run on every strategy
/// and store.
#[test]
fn sequences_that_once_broke_the_limit_hold() {
    use Op::*;
    let check = |cost| Check { cost };
    let back = |pick| GiveBack { pick };
    let wait = |micros| Wait { micros };
    let over = |limit| Override {
        limit: Some(limit),
        lasts: 0,
    };
    let rows: Vec<(&str, Vec<Op>)> = vec![
        (
            "a charge given back after it drained, under a later limit",
            vec![
                check(1),
                check(3),
                over(20),
                wait(144_645),
                check(1),
                wait(300_000),
                check(1),
                check(1),
                check(1),
                back(2),
                back(2),
                check(1),
                over(3),
                back(4),
                wait(386_740),
                check(1),
                back(2),
                wait(36_184),
                back(2),
                wait(132_431),
                check(1),
                check(1),
                back(1),
                check(1),
                wait(600_000),
                check(1),
                check(1),
                check(1),
            ],
        ),
        (
            "a lease taken under a cap, then the cap cleared, an override above it",
            vec![
                Limit {
                    limit: Some(8),
                    lasts: 0,
                },
                check(1),
                check(1),
                over(20),
                back(0),
                Cap {
                    limit: Some(8),
                    lasts: 0,
                },
                check(1),
                Cap {
                    limit: None,
                    lasts: 0,
                },
                back(0),
            ],
        ),
        (
            "a charge given back after one before it was: its stamp is stale",
            vec![
                check(2),
                check(2),
                wait(100_000),
                back(0),
                wait(400_000),
                check(1),
                check(1),
                check(1),
                check(1),
                wait(50_000),
                back(0),
                check(1),
                check(1),
                check(1),
                check(1),
                wait(850_000),
                check(1),
                check(1),
                check(1),
                check(1),
                wait(90_000),
                check(1),
                check(1),
                check(1),
                check(1),
            ],
        ),
    ];
    RUNTIME.block_on(async {
        for (row, steps) in &rows {
            for case in cases() {
                for on in [On::Memory, On::Redis, On::Leasing] {
                    if let Err(e) = run(&case, on, steps).await {
                        panic!("{row}: {e}");
                    }
                }
            }
        }
    });
}
