//! Random request traces (checks, peeks, refunds and settles) replayed
//! into the memory store and into Redis give identical decisions, for every
//! strategy: the property behind the conformance tables, searched by
//! proptest. With leases on (issue 34), decisions may differ, but never
//! admit more than the memory store.

mod support;

use std::num::NonZeroU32;
use std::time::Duration;

use proptest::prelude::*;
use support::conformance::T0;
use tollgate::clock::ManualClock;
use tollgate::decision::Receipt;
use tollgate::store::Leases;
use tollgate::{
    Decision, Key, MemoryStore, Override, PenaltyBox, Policy, PolicyLimit, Quota, RedisStore, Store,
};

use support::redis::{shared_connection as connection, PROPTEST_RUNTIME as RUNTIME};

fn q(limit: u32, millis: u64) -> Quota {
    Quota::new(limit, Duration::from_millis(millis)).unwrap()
}

/// Small limits and short, partly odd windows, so traces hit every branch.
fn policies() -> Vec<Policy> {
    vec![
        Policy::fixed_window("fixed", q(3, 1_000)).and(q(5, 3_000)),
        Policy::aligned_window("aligned", q(3, 1_000)).and(q(5, 3_000)),
        Policy::uniform_gate("gate", Duration::from_millis(700)).unwrap(),
        Policy::sliding_log("log", q(6, 2_000), q(3, 1_000)),
        Policy::sliding_window("window", q(4, 1_000)).and(q(7, 3_000)),
        Policy::sliding_window("window1", q(5, 1_500)),
        Policy::gcra("gcra", q(3, 1_000), NonZeroU32::new(4).unwrap()),
        Policy::leaky_bucket("leaky", q(5, 1_000), NonZeroU32::new(3).unwrap()),
        Policy::concurrency(
            "concurrency",
            NonZeroU32::new(2).unwrap(),
            Duration::from_secs(2),
        )
        .unwrap(),
    ]
}

/// [`policies`] with a caller's own rules: overridable, and a penalty box
/// of two strikes within a second, blocking half a second, doubling up to
/// two.
fn policies_with_caller_rules() -> Vec<Policy> {
    let penalty = PenaltyBox::new(
        NonZeroU32::new(2).unwrap(),
        Duration::from_secs(1),
        Duration::from_millis(500),
    )
    .unwrap()
    .doubling_up_to(Duration::from_secs(2))
    .unwrap();
    policies()
        .into_iter()
        .map(|p| p.overridable().adjustable().with_penalty_box(penalty))
        .collect()
}

/// An override of every quota of `policy` to `limit`, windows kept (a
/// uniform gate's limit stays 1).
fn override_of(policy: &Policy, limit: u32) -> Override {
    let quota = |q: &Quota| {
        let limit = if policy.name() == "gate" { 1 } else { limit };
        Quota::new(limit, q.window()).unwrap()
    };
    let quotas = policy.quotas();
    quotas[1..]
        .iter()
        .fold(Override::new(quota(&quotas[0])), |o, q| o.and(quota(q)))
}

/// What one step does.
#[derive(Debug, Clone, Copy)]
enum Op {
    Check {
        key: u8,
        cost: u64,
    },
    Peek {
        key: u8,
    },
    /// Refund the receipt of an earlier step (picked modulo their number).
    Refund {
        pick: usize,
    },
    /// Settle the receipt of an earlier step to `actual` units.
    Settle {
        pick: usize,
        actual: u64,
    },
    /// Give the caller its own limit (policies with caller rules only).
    SetOverride {
        key: u8,
        limit: u32,
    },
    ClearOverride {
        key: u8,
    },
    /// Replace the policy's quotas for every caller (issue 41), or clear.
    PolicyLimit {
        limit: Option<u32>,
    },
    /// Cap every caller (issue 41), or clear the cap.
    PolicyCap {
        limit: Option<u32>,
    },
}

/// [`op`], and now and then an operator's change to an override.
fn op_with_overrides() -> impl Strategy<Value = Op> {
    prop_oneof![
        9 => op(),
        1 => (0..3u8, 1..8u32).prop_map(|(key, limit)| Op::SetOverride { key, limit }),
        1 => (0..3u8).prop_map(|key| Op::ClearOverride { key }),
        1 => prop::option::of(1..8u32).prop_map(|limit| Op::PolicyLimit { limit }),
        1 => prop::option::of(1..8u32).prop_map(|limit| Op::PolicyCap { limit }),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0..3u8, prop_oneof![4 => Just(1u64), 1 => 0..5u64])
            .prop_map(|(key, cost)| Op::Check { key, cost }),
        1 => (0..3u8).prop_map(|key| Op::Peek { key }),
        2 => any::<usize>().prop_map(|pick| Op::Refund { pick }),
        2 => (any::<usize>(), 0..8u64).prop_map(|(pick, actual)| Op::Settle { pick, actual }),
    ]
}

/// µs to wait before a step: often nothing, mostly short, sometimes windows;
/// often whole tenths of a second, so that steps land exactly on window
/// ends, reopening gates and entries leaving a log.
fn gap() -> impl Strategy<Value = u64> {
    prop_oneof![
        2 => Just(0u64),
        3 => 0..60_000u64,
        2 => 0..1_500_000u64,
        1 => 0..6_000_000u64,
        4 => (0..16u64).prop_map(|tenths| tenths * 100_000),
    ]
}

/// The decision with the parts that may differ masked: the sliding log's
/// and the concurrency limit's request ids are random per store, and a
/// bucket's `given` (its receipts' second stamp) counts from when the key
/// was made, which differs: under the injected clock a Redis key outlives
/// the memory store's entry. Only differences of `given` within a store
/// count, and the refunds' outcomes are compared step by step.
fn comparable(policy: &Policy, mut d: Decision) -> Decision {
    if policy.name() == "concurrency" {
        d.receipt = Receipt::new(d.receipt.cost(), Vec::new());
    }
    if matches!(policy.name(), "log" | "gcra" | "leaky") {
        let stamps = d.receipt.stamps().iter().take(1).copied().collect();
        d.receipt = Receipt::new(d.receipt.cost(), stamps);
    }
    d
}

async fn replay(
    policies: Vec<Policy>,
    start: u64,
    steps: &[(u64, Op)],
) -> Result<(), TestCaseError> {
    for policy in policies {
        let clock = ManualClock::new(start);
        let memory = MemoryStore::with_clock(clock.clone());
        let redis = RedisStore::from_manager(connection().await)
            .prefix(support::redis::unique_prefix("eq"))
            .clock(clock.clone())
            .build()
            .unwrap();
        let stores: [&dyn Store; 2] = [&memory, &redis];
        // Each store's own receipts, with the key they were charged to.
        let mut receipts: [Vec<(Key, Receipt)>; 2] = [Vec::new(), Vec::new()];
        for (i, &(gap, op)) in steps.iter().enumerate() {
            clock.advance(Duration::from_micros(gap));
            let mut answers = Vec::new();
            for (s, store) in stores.iter().enumerate() {
                // Judged by the limits set at runtime, as a layer judges.
                let in_force = store.policy_in_force(&policy);
                let judged = in_force.as_deref().unwrap_or(&policy);
                let answer = match op {
                    Op::Check { key, cost } => {
                        let key = Key::new(format!("k{key}"));
                        let d = store.check(judged, &key, cost).await.unwrap();
                        receipts[s].push((key, d.receipt.clone()));
                        Some(d)
                    }
                    Op::Peek { key } => Some(
                        store
                            .peek(judged, &Key::new(format!("k{key}")))
                            .await
                            .unwrap(),
                    ),
                    Op::Refund { pick } if !receipts[s].is_empty() => {
                        let (key, receipt) = &receipts[s][pick % receipts[s].len()];
                        store.refund(&policy, key, receipt).await.unwrap();
                        None
                    }
                    Op::Refund { .. } => None,
                    Op::Settle { pick, actual } if !receipts[s].is_empty() => {
                        let (key, receipt) = &receipts[s][pick % receipts[s].len()];
                        let settled = store.settle(&policy, key, receipt, actual).await;
                        // Slots are held, not spent: both stores refuse.
                        let refused = policy.name() == "concurrency";
                        prop_assert_eq!(settled.is_err(), refused, "{:?}", settled);
                        None
                    }
                    Op::Settle { .. } => None,
                    Op::SetOverride { key, limit } => {
                        let key = Key::new(format!("k{key}"));
                        let quotas = override_of(&policy, limit);
                        store.set_override(&policy, &key, &quotas).await.unwrap();
                        None
                    }
                    Op::ClearOverride { key } => {
                        let key = Key::new(format!("k{key}"));
                        store.clear_override(&policy, &key).await.unwrap();
                        None
                    }
                    Op::PolicyLimit { limit } | Op::PolicyCap { limit } => {
                        let which = match op {
                            Op::PolicyLimit { .. } => PolicyLimit::Limit,
                            _ => PolicyLimit::Cap,
                        };
                        // The policy's windows, as a cap must keep.
                        let value = limit.map(|limit| override_of(&policy, limit));
                        store
                            .set_policy_limit(&policy, which, value.as_ref())
                            .await
                            .unwrap();
                        None
                    }
                };
                answers.push(answer.map(|d| comparable(&policy, d)));
            }
            prop_assert_eq!(
                &answers[0],
                &answers[1],
                "policy {} step {} {:?}: memory, then Redis",
                policy.name(),
                i,
                op
            );
        }
    }
    Ok(())
}

/// The policies that lease: one quota each, small, so leases run out.
fn leasing_policies() -> Vec<Policy> {
    vec![
        Policy::fixed_window("fixed", q(6, 1_000)),
        Policy::aligned_window("aligned", q(6, 1_000)),
        Policy::gcra("gcra", q(10, 1_000), NonZeroU32::new(6).unwrap()),
    ]
}

/// Eager leases: a caller is hot after two decisions, and leases end soon.
fn eager_leases() -> Leases {
    Leases::new()
        .hot_after(NonZeroU32::new(2).unwrap())
        .span(Duration::from_millis(200))
        .lifetime(Duration::from_millis(700))
        .quiet_after(Duration::from_millis(300))
}

/// One step of a leased trace: after `gap` µs, `key` asks `server` (of
/// two) for one unit; `Return` gives every lease back.
#[derive(Debug, Clone, Copy)]
enum Leased {
    Check { key: u8, server: u8 },
    Return,
}

fn leased() -> impl Strategy<Value = Leased> {
    prop_oneof![
        12 => (0..2u8, 0..2u8).prop_map(|(key, server)| Leased::Check { key, server }),
        1 => Just(Leased::Return),
    ]
}

/// Replays `steps` into the memory store and into two leasing Redis
/// stores (two servers on one Redis): for each caller, the servers
/// together never admitted more than the memory store after any step.
async fn replay_leased(start: u64, steps: &[(u64, Leased)]) -> Result<(), TestCaseError> {
    for policy in leasing_policies() {
        let clock = ManualClock::new(start);
        let memory = MemoryStore::with_clock(clock.clone());
        let prefix = support::redis::unique_prefix("eq-lease");
        let mut servers = Vec::new();
        for _ in 0..2 {
            let store = RedisStore::from_manager(connection().await)
                .prefix(&prefix)
                .clock(clock.clone())
                .leases(eager_leases())
                .build()
                .unwrap();
            servers.push(store);
        }
        let (mut by_memory, mut by_servers) = ([0u64; 2], [0u64; 2]);
        for (i, &(gap, step)) in steps.iter().enumerate() {
            clock.advance(Duration::from_micros(gap));
            let (key, server) = match step {
                Leased::Check { key, server } => (key, server),
                Leased::Return => {
                    for server in &servers {
                        server.return_leases().await;
                    }
                    continue;
                }
            };
            let k = Key::new(format!("k{key}"));
            let server = &servers[usize::from(server)];
            let decided = match server.check_now(&policy, &k, 1) {
                Some(decision) => decision,
                None => server.check(&policy, &k, 1).await,
            };
            by_servers[usize::from(key)] += u64::from(decided.unwrap().allowed);
            by_memory[usize::from(key)] +=
                u64::from(memory.check(&policy, &k, 1).await.unwrap().allowed);
            prop_assert!(
                by_servers[usize::from(key)] <= by_memory[usize::from(key)],
                "policy {} step {}: the servers admitted {} for k{}, the memory store {}",
                policy.name(),
                i,
                by_servers[usize::from(key)],
                key,
                by_memory[usize::from(key)]
            );
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 48,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn leasing_servers_never_admit_more_than_the_memory_store(
        offset in prop_oneof![Just(0u64), 0..10_000_000u64],
        steps in prop::collection::vec((gap(), leased()), 1..80),
    ) {
        RUNTIME.block_on(replay_leased(T0 + offset, &steps))?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 48,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn memory_and_redis_decide_alike_on_random_traces(
        offset in prop_oneof![Just(0u64), 0..10_000_000u64],
        steps in prop::collection::vec((gap(), op()), 1..60),
    ) {
        RUNTIME.block_on(replay(policies(), T0 + offset, &steps))?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 24,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    /// The same, with overrides set and cleared in the trace and a penalty
    /// box counting the rejections (lua/caller.lua against
    /// store/memory/caller.rs).
    #[test]
    fn memory_and_redis_decide_alike_with_overrides_and_a_penalty_box(
        offset in prop_oneof![Just(0u64), 0..10_000_000u64],
        steps in prop::collection::vec((gap(), op_with_overrides()), 1..60),
    ) {
        RUNTIME.block_on(replay(policies_with_caller_rules(), T0 + offset, &steps))?;
    }
}

/// One step of a trace on one leasing server: a check, a settle or a
/// refund of an earlier pass, or an operator's reset.
#[derive(Debug, Clone, Copy)]
enum OnOne {
    Check { key: u8, cost: u64 },
    Settle { pick: usize, actual: u64 },
    Refund { pick: usize },
    Reset { key: u8 },
}

fn on_one() -> impl Strategy<Value = OnOne> {
    prop_oneof![
        10 => (0..2u8, prop_oneof![4 => Just(1u64), 1 => 1..4u64])
            .prop_map(|(key, cost)| OnOne::Check { key, cost }),
        3 => (any::<usize>(), 0..12u64).prop_map(|(pick, actual)| OnOne::Settle { pick, actual }),
        1 => any::<usize>().prop_map(|pick| OnOne::Refund { pick }),
        1 => (0..2u8).prop_map(|key| OnOne::Reset { key }),
    ]
}

/// What a client sees of a decision: whether it passed, and the headers.
/// A GCRA lease's `Reset` is the one Redis gave with the lease (the
/// bucket's fill time then), so only the windows' is compared.
fn headers(policy: &Policy, d: &Decision) -> (bool, u64, u64, u64, Option<u64>) {
    let reset = (policy.name() != "gcra").then(|| d.reset_epoch_secs());
    (d.allowed, d.limit, d.remaining, d.used, reset)
}

/// Replays `steps` into the memory store and into one leasing Redis store:
/// every decision shows the same headers (issue 39: a settle through a
/// lease left `Remaining` at 78 where the memory store said 49). Steps
/// come at one instant (`gaps` false) or spread over windows; a GCRA
/// lease decays as time passes where the memory bucket refills, so GCRA
/// runs at one instant.
async fn replay_on_one(start: u64, steps: &[(u64, OnOne)]) -> Result<(), TestCaseError> {
    for policy in leasing_policies() {
        let clock = ManualClock::new(start);
        let memory = MemoryStore::with_clock(clock.clone());
        let server = RedisStore::from_manager(connection().await)
            .prefix(support::redis::unique_prefix("eq-one"))
            .clock(clock.clone())
            .leases(eager_leases())
            .build()
            .unwrap();
        let stores: [&dyn Store; 2] = [&memory, &server];
        let mut receipts: [Vec<(Key, Receipt)>; 2] = [Vec::new(), Vec::new()];
        let gcra = policy.name() == "gcra";
        for (i, &(gap, step)) in steps.iter().enumerate() {
            if !gcra {
                clock.advance(Duration::from_micros(gap));
            }
            let mut seen = Vec::new();
            for (s, store) in stores.iter().enumerate() {
                let receipts = &mut receipts[s];
                match step {
                    OnOne::Check { key, cost } => {
                        let key = Key::new(format!("k{key}"));
                        let d = match store.check_now(&policy, &key, cost) {
                            Some(d) => d,
                            None => store.check(&policy, &key, cost).await,
                        }
                        .unwrap();
                        seen.push(Some(headers(&policy, &d)));
                        if d.allowed {
                            receipts.push((key, d.receipt));
                        }
                    }
                    OnOne::Settle { pick, actual } if !receipts.is_empty() => {
                        let n = receipts.len();
                        let (key, receipt) = &mut receipts[pick % n];
                        store.settle(&policy, key, receipt, actual).await.unwrap();
                        *receipt = Receipt::new(actual, receipt.stamps().to_vec());
                        seen.push(None);
                    }
                    OnOne::Refund { pick } if !receipts.is_empty() => {
                        let n = receipts.len();
                        let (key, receipt) = receipts.remove(pick % n);
                        store.refund(&policy, &key, &receipt).await.unwrap();
                        seen.push(None);
                    }
                    OnOne::Reset { key } => {
                        let key = Key::new(format!("k{key}"));
                        store.reset(&policy, &key).await.unwrap();
                        receipts.retain(|(k, _)| *k != key);
                        seen.push(None);
                    }
                    OnOne::Settle { .. } | OnOne::Refund { .. } => seen.push(None),
                }
            }
            prop_assert_eq!(
                &seen[0],
                &seen[1],
                "policy {} step {} {:?}: memory, then the leasing server",
                policy.name(),
                i,
                step
            );
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 48,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn one_leasing_server_shows_the_memory_stores_headers(
        offset in prop_oneof![Just(0u64), 0..10_000_000u64],
        steps in prop::collection::vec((gap(), on_one()), 1..80),
    ) {
        RUNTIME.block_on(replay_on_one(T0 + offset, &steps))?;
    }
}
