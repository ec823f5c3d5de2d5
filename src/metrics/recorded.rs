//! The metrics, recorded (feature `metrics`): their names, their
//! descriptions, one layer's cached handles, and the counts other modules
//! make. `off.rs` has the same crate-private functions, doing nothing.

use super::outcome::Outcome;
use crate::error::StoreErrorKind;
use crate::policy::Policy;

/// Counter name: requests by `policy` and `outcome`.
///
/// ```
/// assert_eq!(tollgate::metrics::DECISIONS, "tollgate_decisions_total");
/// ```
pub const DECISIONS: &str = "tollgate_decisions_total";

/// Counter name: overrides set or cleared, by `policy` and `change`.
///
/// ```
/// assert_eq!(tollgate::metrics::OVERRIDES, "tollgate_overrides_total");
/// ```
pub const OVERRIDES: &str = "tollgate_overrides_total";

/// Counter name: runtime limits and caps set or cleared for every caller
/// of a policy, by `policy`, `limit` (`limit` or `cap`) and `change`.
///
/// ```
/// assert_eq!(tollgate::metrics::POLICY_LIMITS, "tollgate_policy_limits_total");
/// ```
pub const POLICY_LIMITS: &str = "tollgate_policy_limits_total";

/// Counter name: penalty-box blocks started, by `policy` and `by`.
///
/// ```
/// assert_eq!(tollgate::metrics::BLOCKS, "tollgate_blocks_total");
/// ```
pub const BLOCKS: &str = "tollgate_blocks_total";

/// Counter name: failed store calls by `policy` and `kind`.
///
/// ```
/// assert_eq!(tollgate::metrics::STORE_ERRORS, "tollgate_store_errors_total");
/// ```
pub const STORE_ERRORS: &str = "tollgate_store_errors_total";

/// Histogram name: seconds waited on the main store per decision, by
/// `policy`; only for a store that is awaited (not the memory store).
///
/// ```
/// assert_eq!(tollgate::metrics::STORE_LATENCY, "tollgate_store_latency_seconds");
/// ```
pub const STORE_LATENCY: &str = "tollgate_store_latency_seconds";

/// Counter name: decisions served from the in-process cache, by `policy`.
///
/// ```
/// assert_eq!(tollgate::metrics::LOCAL_CACHE_HITS, "tollgate_local_cache_hits_total");
/// ```
pub const LOCAL_CACHE_HITS: &str = "tollgate_local_cache_hits_total";

/// Gauge name: estimated distinct callers recently seen, by `policy`.
///
/// ```
/// assert_eq!(tollgate::metrics::ACTIVE_CALLERS, "tollgate_active_callers");
/// ```
pub const ACTIVE_CALLERS: &str = "tollgate_active_callers";

/// Counter name: `NOSCRIPT` answers after which a script was loaded again,
/// by `script`.
///
/// ```
/// assert_eq!(tollgate::metrics::SCRIPT_RELOADS, "tollgate_script_reloads_total");
/// ```
pub const SCRIPT_RELOADS: &str = "tollgate_script_reloads_total";

/// Counter name: read-only calls a replica failed, sent to the primary.
///
/// ```
/// assert_eq!(tollgate::metrics::REPLICA_FALLBACKS, "tollgate_replica_fallbacks_total");
/// ```
pub const REPLICA_FALLBACKS: &str = "tollgate_replica_fallbacks_total";

/// Counter name: leases taken, by `policy`.
///
/// ```
/// assert_eq!(tollgate::metrics::LEASES, "tollgate_leases_total");
/// ```
pub const LEASES: &str = "tollgate_leases_total";

/// Counter name: units leased (beyond the requests that asked), by `policy`.
///
/// ```
/// assert_eq!(tollgate::metrics::LEASED_UNITS, "tollgate_leased_units_total");
/// ```
pub const LEASED_UNITS: &str = "tollgate_leased_units_total";

/// Counter name: requests decided from a lease in hand, without a call
/// to Redis, by `policy`: beside [`DECISIONS`], the share of a policy's
/// requests that leases decide.
///
/// ```
/// assert_eq!(tollgate::metrics::LEASE_DECISIONS, "tollgate_lease_decisions_total");
/// ```
pub const LEASE_DECISIONS: &str = "tollgate_lease_decisions_total";

/// Counter name: unspent lease units given back, by `policy`.
///
/// ```
/// assert_eq!(tollgate::metrics::LEASE_UNITS_RETURNED, "tollgate_lease_units_returned_total");
/// ```
pub const LEASE_UNITS_RETURNED: &str = "tollgate_lease_units_returned_total";

/// Counter name: units a settle charged or gave back, by `policy` and
/// `direction` (`charged`: the response cost more than was charged when
/// the request started; `given_back`: less, a refunded `304` included).
///
/// ```
/// assert_eq!(tollgate::metrics::SETTLED_UNITS, "tollgate_settled_units_total");
/// ```
pub const SETTLED_UNITS: &str = "tollgate_settled_units_total";

/// Histogram buckets (seconds) suited to [`STORE_LATENCY`]: 100 µs to 1 s,
/// dense around the default 100 ms deadline. Prometheus exporters render
/// histograms as summaries unless given buckets.
///
/// ```
/// use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
/// use tollgate::metrics::{LATENCY_BUCKETS, STORE_LATENCY};
///
/// let builder = PrometheusBuilder::new()
///     .set_buckets_for_metric(Matcher::Full(STORE_LATENCY.into()), LATENCY_BUCKETS)
///     .unwrap();
/// # let _ = builder;
/// ```
pub const LATENCY_BUCKETS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0,
];

/// Gives every tollgate metric its unit and help text in the recorder
/// installed now (Prometheus prints them as `# HELP` lines). Optional; call
/// it once after installing the recorder.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// use std::num::NonZeroU32;
/// use axum::{body::Body, extract::connect_info::MockConnectInfo, http::Request, routing::get, Router};
/// use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
/// use tower::ServiceExt;
/// use tollgate::{Policy, Quota, RateLimitLayer};
///
/// // At start-up, before serving:
/// let prometheus = PrometheusBuilder::new()
///     .set_buckets_for_metric(
///         Matcher::Full(tollgate::metrics::STORE_LATENCY.into()),
///         tollgate::metrics::LATENCY_BUCKETS,
///     )
///     .unwrap()
///     .install_recorder()
///     .expect("no other recorder installed");
/// tollgate::metrics::describe();
///
/// let layer = RateLimitLayer::builder()
///     .policy(Policy::fixed_window("core", Quota::per_minute(NonZeroU32::new(60).unwrap())))
///     .build()
///     .unwrap();
/// let api = Router::new().route("/", get(|| async { "hi" })).route_layer(layer);
/// // `/metrics` beside the limited routes, so scrapes are not limited:
/// let app = api
///     .route("/metrics", get(move || async move { prometheus.render() }))
///     .layer(MockConnectInfo(std::net::SocketAddr::from(([127, 0, 0, 1], 1))));
///
/// app.clone().oneshot(Request::get("/").body(Body::empty()).unwrap()).await.unwrap();
/// let scrape = app.oneshot(Request::get("/metrics").body(Body::empty()).unwrap()).await.unwrap();
/// let text = axum::body::to_bytes(scrape.into_body(), 1 << 20).await.unwrap();
/// let text = std::str::from_utf8(&text).unwrap();
/// assert!(text.contains("# HELP tollgate_decisions_total"));
/// assert!(text.contains(r#"tollgate_decisions_total{policy="core",outcome="allowed"} 1"#));
/// // The memory store answers in process: no wait to time, no latency sample.
/// assert!(!text.contains(r#"tollgate_store_latency_seconds_bucket{policy="core",le="0.1"} 1"#));
/// # }
/// ```
pub fn describe() {
    use ::metrics::{describe_counter, describe_gauge, describe_histogram, Unit};
    describe_counter!(
        DECISIONS,
        Unit::Count,
        "Requests seen by a tollgate rate limit, by policy and outcome"
    );
    describe_counter!(
        STORE_ERRORS,
        Unit::Count,
        "Rate limit store calls that failed or missed the deadline, by policy and kind"
    );
    describe_histogram!(
        STORE_LATENCY,
        Unit::Seconds,
        "Time waited on the rate limit store per decision, failures included"
    );
    describe_counter!(
        LOCAL_CACHE_HITS,
        Unit::Count,
        "Rate limit decisions answered from the in-process cache"
    );
    describe_counter!(
        SCRIPT_RELOADS,
        Unit::Count,
        "Scripts loaded again after Redis answered NOSCRIPT"
    );
    describe_counter!(
        REPLICA_FALLBACKS,
        Unit::Count,
        "Read-only rate limit calls a replica failed, asked of the primary"
    );
    describe_counter!(
        LEASES,
        Unit::Count,
        "Leases of hot callers' budgets taken from Redis"
    );
    describe_counter!(
        LEASED_UNITS,
        Unit::Count,
        "Units charged in Redis by leases beyond the requests that asked"
    );
    describe_counter!(
        LEASE_DECISIONS,
        Unit::Count,
        "Rate limit decisions made from a lease in hand, without a call to Redis"
    );
    describe_counter!(
        LEASE_UNITS_RETURNED,
        Unit::Count,
        "Unspent lease units given back to Redis"
    );
    describe_counter!(
        SETTLED_UNITS,
        Unit::Count,
        "Units charged or given back when a response settled its request's cost, by policy and direction"
    );
    describe_counter!(
        OVERRIDES,
        Unit::Count,
        "Per-caller quota overrides set or cleared by an operator"
    );
    describe_counter!(
        POLICY_LIMITS,
        Unit::Count,
        "Runtime limits and caps for every caller of a policy, set or cleared by an operator"
    );
    describe_counter!(
        BLOCKS,
        Unit::Count,
        "Penalty-box blocks started, by the caller's strikes or an operator"
    );
    describe_gauge!(
        ACTIVE_CALLERS,
        Unit::Count,
        "Estimated distinct callers recently seen by a rate limit policy"
    );
}

/// Every [`Outcome`], in the order of its discriminants (the index of its
/// counter in [`Handles`]).
const OUTCOMES: [Outcome; 10] = [
    Outcome::Allowed,
    Outcome::Limited,
    Outcome::ShadowLimited,
    Outcome::KeyError,
    Outcome::FailOpen,
    Outcome::FailClosed,
    Outcome::Fallback,
    Outcome::AllowListed,
    Outcome::DenyListed,
    Outcome::Throttled,
];

const KINDS: [StoreErrorKind; 5] = [
    StoreErrorKind::Timeout,
    StoreErrorKind::Unavailable,
    StoreErrorKind::Protocol,
    StoreErrorKind::Rejected,
    StoreErrorKind::Unsupported,
];

fn kind_index(kind: StoreErrorKind) -> usize {
    match kind {
        StoreErrorKind::Timeout => 0,
        StoreErrorKind::Unavailable => 1,
        StoreErrorKind::Protocol => 2,
        StoreErrorKind::Rejected => 3,
        StoreErrorKind::Unsupported => 4,
    }
}

/// One layer's metric handles, looked up on first use and then reused, so
/// the request path only bumps atomics.
pub(crate) struct PolicyMetrics {
    policy: ::metrics::SharedString,
    handles: std::sync::OnceLock<Handles>,
}

struct Handles {
    decisions: [::metrics::Counter; OUTCOMES.len()],
    store_errors: [::metrics::Counter; KINDS.len()],
    store_latency: ::metrics::Histogram,
}

impl PolicyMetrics {
    pub(crate) fn new(policy: &Policy) -> Self {
        Self {
            policy: policy.shared_name().clone().into(),
            handles: std::sync::OnceLock::new(),
        }
    }

    /// Handles from the recorder installed at first use (global, or a
    /// thread-local one in tests).
    fn handles(&self) -> &Handles {
        self.handles.get_or_init(|| {
            let policy = &self.policy;
            Handles {
                decisions: OUTCOMES.map(|outcome| {
                    ::metrics::counter!(DECISIONS, "policy" => policy.clone(), "outcome" => outcome.as_str())
                }),
                store_errors: KINDS.map(|kind| {
                    ::metrics::counter!(STORE_ERRORS, "policy" => policy.clone(), "kind" => kind.as_str())
                }),
                store_latency: ::metrics::histogram!(STORE_LATENCY, "policy" => policy.clone()),
            }
        })
    }

    /// Counts one request under `outcome`.
    #[inline]
    pub(crate) fn decision(&self, outcome: Outcome) {
        self.handles().decisions[outcome as usize].increment(1);
    }

    /// Counts one failed store call.
    #[inline]
    pub(crate) fn store_error(&self, kind: StoreErrorKind) {
        self.handles().store_errors[kind_index(kind)].increment(1);
    }

    /// Records the time since `watch` started as one store call's latency.
    #[inline]
    pub(crate) fn store_latency(&self, watch: Stopwatch) {
        self.handles()
            .store_latency
            .record(watch.elapsed().as_secs_f64());
    }
}

/// When a store call started, for its latency (without the `metrics`
/// feature, a stopwatch that reads no clock).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Stopwatch {
    /// `None`: nothing was waited for.
    started: Option<std::time::Instant>,
}

impl Stopwatch {
    #[inline]
    pub(crate) fn start() -> Self {
        Self {
            started: Some(std::time::Instant::now()),
        }
    }

    /// For an answer that came without waiting: reads as zero, and reading
    /// no clock.
    #[inline]
    pub(crate) fn idle() -> Self {
        Self { started: None }
    }

    fn elapsed(&self) -> std::time::Duration {
        self.started
            .map_or(std::time::Duration::ZERO, |s| s.elapsed())
    }
}

/// Counts a decision answered from the in-process cache, without a store call.
/// For code paths without the layer's cached handles at hand.
#[inline]
pub(crate) fn local_cache_hit(policy: &Policy) {
    ::metrics::counter!(LOCAL_CACHE_HITS, "policy" => policy.shared_name().clone()).increment(1);
}

/// Counts what settling a request to its actual cost moved: `actual`
/// units against `charged` when the request started. Nothing when equal.
#[inline]
pub(crate) fn settled(policy: &Policy, charged: u64, actual: u64) {
    let (direction, units) = if actual >= charged {
        ("charged", actual - charged)
    } else {
        ("given_back", charged - actual)
    };
    if units > 0 {
        ::metrics::counter!(SETTLED_UNITS, "policy" => policy.shared_name().clone(), "direction" => direction)
            .increment(units);
    }
}

#[cfg_attr(not(feature = "redis"), allow(dead_code))]
/// Counts a script loaded again after `NOSCRIPT`.
#[inline]
pub(crate) fn script_reload(script: &'static str) {
    ::metrics::counter!(SCRIPT_RELOADS, "script" => script).increment(1);
}

#[cfg_attr(not(feature = "redis"), allow(dead_code))]
/// Counts a read-only call a replica failed, sent to the primary.
#[inline]
pub(crate) fn replica_fallback() {
    ::metrics::counter!(REPLICA_FALLBACKS).increment(1);
}

#[cfg_attr(not(feature = "redis"), allow(dead_code))]
/// Counts a lease taken, and the units it charged beyond its request.
#[inline]
pub(crate) fn lease_taken(policy: &Policy, units: u64) {
    ::metrics::counter!(LEASES, "policy" => policy.shared_name().clone()).increment(1);
    ::metrics::counter!(LEASED_UNITS, "policy" => policy.shared_name().clone()).increment(units);
}

/// One lease's count of the requests it decides: the handle is looked up
/// when the lease is taken, so a decision from it bumps an atomic only.
#[derive(Clone)]
pub(crate) struct LeaseDecisions(::metrics::Counter);

#[cfg_attr(not(feature = "redis"), allow(dead_code))]
impl LeaseDecisions {
    pub(crate) fn of(policy: &Policy) -> Self {
        Self(::metrics::counter!(LEASE_DECISIONS, "policy" => policy.shared_name().clone()))
    }

    /// Counts one request decided from the lease.
    #[inline]
    pub(crate) fn count(&self) {
        self.0.increment(1);
    }
}

impl std::fmt::Debug for LeaseDecisions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LeaseDecisions")
    }
}

#[cfg_attr(not(feature = "redis"), allow(dead_code))]
/// Counts unspent lease units given back.
#[inline]
pub(crate) fn lease_returned(policy: &Policy, units: u64) {
    ::metrics::counter!(LEASE_UNITS_RETURNED, "policy" => policy.shared_name().clone())
        .increment(units);
}

#[cfg_attr(not(feature = "throttle"), allow(dead_code))]
/// Sets the estimate of distinct callers recently seen under `policy`.
#[inline]
pub(crate) fn active_callers(policy: &Policy, estimate: f64) {
    ::metrics::gauge!(ACTIVE_CALLERS, "policy" => policy.shared_name().clone()).set(estimate);
}

/// Counts an operator's change to an override: `set` or `cleared`.
#[inline]
pub(crate) fn override_changed(policy: &Policy, change: &'static str) {
    ::metrics::counter!(OVERRIDES, "policy" => policy.shared_name().clone(), "change" => change)
        .increment(1);
}

/// Counts a runtime limit or cap (`limit`) set or cleared (`change`).
#[inline]
pub(crate) fn policy_limit_changed(policy: &Policy, limit: &'static str, change: &'static str) {
    ::metrics::counter!(POLICY_LIMITS, "policy" => policy.shared_name().clone(), "limit" => limit, "change" => change)
        .increment(1);
}

/// Counts a penalty-box block started, `by` the caller's `strikes` or an
/// `operator`.
#[inline]
pub(crate) fn block_started(policy: &Policy, by: &'static str) {
    ::metrics::counter!(BLOCKS, "policy" => policy.shared_name().clone(), "by" => by).increment(1);
}

#[cfg(test)]
mod tests {
    use std::num::NonZeroU32;

    use metrics_util::debugging::{DebugValue, DebuggingRecorder};

    use super::*;
    use crate::quota::Quota;

    #[test]
    fn helpers_for_other_modules_label_by_policy() {
        let policy = Policy::fixed_window("core", Quota::per_second(NonZeroU32::new(1).unwrap()));
        let recorder = DebuggingRecorder::new();
        ::metrics::with_local_recorder(&recorder, || {
            local_cache_hit(&policy);
            local_cache_hit(&policy);
            active_callers(&policy, 42.0);
            lease_taken(&policy, 40);
            lease_taken(&policy, 20);
            lease_returned(&policy, 7);
            let decided = LeaseDecisions::of(&policy);
            decided.count();
            decided.count();
            decided.count();
        });
        // One snapshot: taking one drains the recorder.
        let mut seen: Vec<(String, Vec<String>, DebugValue)> = recorder
            .snapshotter()
            .snapshot()
            .into_vec()
            .into_iter()
            .map(|(key, _, _, value)| {
                let labels = key
                    .key()
                    .labels()
                    .map(|l| format!("{}={}", l.key(), l.value()));
                (key.key().name().to_owned(), labels.collect(), value)
            })
            .collect();
        seen.sort_by(|a, b| a.0.cmp(&b.0));
        let core = vec!["policy=core".to_owned()];
        assert_eq!(
            seen,
            vec![
                (
                    ACTIVE_CALLERS.to_owned(),
                    core.clone(),
                    DebugValue::Gauge(42.0.into())
                ),
                (
                    LEASE_DECISIONS.to_owned(),
                    core.clone(),
                    DebugValue::Counter(3)
                ),
                (
                    LEASE_UNITS_RETURNED.to_owned(),
                    core.clone(),
                    DebugValue::Counter(7)
                ),
                (
                    LEASED_UNITS.to_owned(),
                    core.clone(),
                    DebugValue::Counter(60)
                ),
                (LEASES.to_owned(), core.clone(), DebugValue::Counter(2)),
                (LOCAL_CACHE_HITS.to_owned(), core, DebugValue::Counter(2)),
            ]
        );
    }

    #[test]
    fn overrides_and_blocks_are_counted_by_policy_and_cause() {
        use crate::key::Key;
        use crate::penalty::PenaltyBox;
        use crate::store::{MemoryStore, Store};
        use std::time::Duration;

        let one = NonZeroU32::new(1).unwrap();
        let penalty =
            PenaltyBox::new(one, Duration::from_secs(60), Duration::from_secs(60)).unwrap();
        let policy =
            Policy::fixed_window("login", Quota::per_minute(one)).with_penalty_box(penalty);
        let store = MemoryStore::new();
        let eve = Key::new("eve");
        let recorder = DebuggingRecorder::new();
        ::metrics::with_local_recorder(&recorder, || {
            override_changed(&policy, "set");
            for _ in 0..3 {
                // A pass, the rejection that starts the block, a refusal.
                store.check_now(&policy, &eve, 1).unwrap().unwrap();
            }
        });
        let mut seen: Vec<(String, Vec<String>, DebugValue)> = recorder
            .snapshotter()
            .snapshot()
            .into_vec()
            .into_iter()
            .map(|(key, _, _, value)| {
                let labels = key
                    .key()
                    .labels()
                    .map(|l| format!("{}={}", l.key(), l.value()));
                (key.key().name().to_owned(), labels.collect(), value)
            })
            .collect();
        seen.sort_by(|a, b| a.0.cmp(&b.0));
        let labels = |more: &str| vec!["policy=login".to_owned(), more.to_owned()];
        assert_eq!(
            seen,
            vec![
                (
                    BLOCKS.to_owned(),
                    labels("by=strikes"),
                    DebugValue::Counter(1)
                ),
                (
                    OVERRIDES.to_owned(),
                    labels("change=set"),
                    DebugValue::Counter(1)
                ),
            ]
        );
    }

    #[test]
    fn outcome_and_kind_tables_match_their_indices() {
        for (i, outcome) in OUTCOMES.iter().enumerate() {
            assert_eq!(*outcome as usize, i);
        }
        for (i, kind) in KINDS.iter().enumerate() {
            assert_eq!(kind_index(*kind), i);
        }
    }
}
