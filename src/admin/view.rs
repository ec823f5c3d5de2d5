//! What the admin API shows: one type per JSON shape (a policy, its
//! quotas, an override, a caller's state, what a write did), each
//! serialized by its serde derive, so every route shows a shape the same
//! way and `openapi.json` describes one type. The tests check every answer
//! against the document, field by field (`additionalProperties: false`).

use std::time::Duration;

use serde::Serialize;

use crate::decision::Decision;
use crate::key::Key;
use crate::overrides::Override;
use crate::policy::{Policy, Strategy};
use crate::policy_limits::PolicyLimits;
use crate::quota::Quota;
use crate::rate_limiter::RateLimiter;

/// Seconds, whole when they are (`3600`), else fractional (`0.5`).
#[derive(Debug, Clone, Copy, Serialize)]
#[serde(untagged)]
pub(super) enum Secs {
    Whole(u64),
    Fraction(f64),
}

impl From<Duration> for Secs {
    fn from(d: Duration) -> Self {
        if d.subsec_nanos() == 0 {
            Secs::Whole(d.as_secs())
        } else {
            Secs::Fraction(d.as_secs_f64())
        }
    }
}

/// `{"limit": N, "window_secs": S}`.
#[derive(Debug, Serialize)]
pub(super) struct QuotaView {
    limit: u32,
    window_secs: Secs,
}

fn quotas(quotas: &[Quota]) -> Vec<QuotaView> {
    quotas
        .iter()
        .map(|q| QuotaView {
            limit: q.limit(),
            window_secs: q.window().into(),
        })
        .collect()
}

/// An override (a caller's, a runtime limit, a cap): its quotas, its end
/// (Unix seconds, or `null`) and its note, only when it has one.
#[derive(Debug, Serialize)]
pub(super) struct OverrideView {
    quotas: Vec<QuotaView>,
    until: Option<Secs>,
    #[serde(skip_serializing_if = "Option::is_none")]
    note: Option<String>,
}

impl From<&Override> for OverrideView {
    fn from(o: &Override) -> Self {
        Self {
            quotas: quotas(o.quotas()),
            until: o.until_micros().map(|us| Duration::from_micros(us).into()),
            note: o.note().map(str::to_owned),
        }
    }
}

/// A penalty box as built.
#[derive(Debug, Serialize)]
pub(super) struct PenaltyBoxView {
    strikes: u32,
    within_secs: Secs,
    block_secs: Secs,
    longest_block_secs: Secs,
}

/// The runtime limit and cap in force.
#[derive(Debug, Serialize)]
pub(super) struct RuntimeView {
    limit: Option<OverrideView>,
    cap: Option<OverrideView>,
}

/// Why a policy's runtime limits are not shown (in the list only).
#[derive(Debug, Serialize)]
pub(super) struct ReadError {
    pub status: u16,
    pub message: String,
}

/// A policy as built, and the limit and cap an operator set for every
/// caller at runtime (`runtime`: `null` for a policy that is not
/// adjustable, or whose read failed: then `runtime_error`).
///
/// ```json
/// {"name": "api", "strategy": "fixed_window", "quotas": [{"limit": 100, "window_secs": 3600}],
///  "overridable": true, "adjustable": true, "penalty_box": null,
///  "runtime": {"limit": {"quotas": [{"limit": 10, "window_secs": 3600}], "until": null}, "cap": null}}
/// ```
#[derive(Debug, Serialize)]
pub(super) struct PolicyView {
    name: String,
    strategy: &'static str,
    quotas: Vec<QuotaView>,
    #[serde(skip_serializing_if = "Option::is_none")]
    burst: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    capacity: Option<u32>,
    overridable: bool,
    adjustable: bool,
    penalty_box: Option<PenaltyBoxView>,
    runtime: Option<RuntimeView>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub runtime_error: Option<ReadError>,
}

pub(super) fn policy(limiter: &RateLimiter, runtime: &Option<PolicyLimits>) -> PolicyView {
    let policy = limiter.policy();
    let (burst, capacity) = match policy.strategy() {
        Strategy::Gcra { burst } => (Some(burst.get()), None),
        Strategy::LeakyBucket { capacity } => (None, Some(capacity.get())),
        _ => (None, None),
    };
    PolicyView {
        name: policy.name().to_owned(),
        strategy: policy.strategy().as_str(),
        quotas: quotas(policy.quotas()),
        burst,
        capacity,
        overridable: policy.is_overridable(),
        adjustable: policy.is_adjustable(),
        penalty_box: policy.penalty_box().map(|b| PenaltyBoxView {
            strikes: b.strikes().get(),
            within_secs: b.within().into(),
            block_secs: b.block().into(),
            longest_block_secs: b.cap().into(),
        }),
        runtime: runtime.as_ref().map(|limits| RuntimeView {
            limit: limits.limit.as_ref().map(OverrideView::from),
            cap: limits.cap.as_ref().map(OverrideView::from),
        }),
        runtime_error: None,
    }
}

/// `GET /policies`.
#[derive(Debug, Serialize)]
pub(super) struct Policies {
    pub policies: Vec<PolicyView>,
}

/// An override in a policy's list: the caller's key as stored, with it,
/// and whether it judges the caller's requests now ([`in_force`]).
#[derive(Debug, Serialize)]
pub(super) struct ListedView {
    key: String,
    #[serde(flatten)]
    shown: OverrideView,
    in_force: bool,
    reason: Option<String>,
}

pub(super) fn listed(key: &Key, o: &Override, cap: Option<&[u32]>) -> ListedView {
    let (in_force, reason) = in_force(Some(o), cap);
    ListedView {
        key: key.as_str().to_owned(),
        shown: o.into(),
        in_force,
        reason,
    }
}

/// `GET /policies/{policy}/overrides`.
#[derive(Debug, Serialize)]
pub(super) struct Listed {
    pub policy: String,
    pub overrides: Vec<ListedView>,
}

/// A caller's override as `GET` and `PUT` show it.
#[derive(Debug, Serialize)]
pub(super) struct CallerOverride {
    policy: String,
    key: String,
    #[serde(rename = "override")]
    shown: Option<OverrideView>,
    in_force: bool,
    reason: Option<String>,
}

pub(super) fn caller_override(
    limiter: &RateLimiter,
    key: &Key,
    o: Option<&Override>,
) -> CallerOverride {
    let (in_force, reason) = in_force(o, limiter.cap_now().as_deref());
    CallerOverride {
        policy: limiter.policy().name().to_owned(),
        key: key.as_str().to_owned(),
        shown: o.map(OverrideView::from),
        in_force,
        reason,
    }
}

/// Whether `o` judges its caller's requests now, and if not, why: an
/// override above an operator's cap is set aside while the cap lasts
/// (`cap`: the cap this server applies, a limit per quota).
pub(super) fn in_force(o: Option<&Override>, cap: Option<&[u32]>) -> (bool, Option<String>) {
    let Some(o) = o else {
        return (false, Some("no override is set for this caller".to_owned()));
    };
    match cap {
        Some(cap) if o.exceeds(cap) => {
            let cap: Vec<String> = cap.iter().map(u32::to_string).collect();
            (
                false,
                Some(format!(
                    "above the policy's cap ({}): set aside while the cap lasts; \
                     the cap judges the caller's requests",
                    cap.join(", ")
                )),
            )
        }
        _ => (true, None),
    }
}

/// What a write to one caller did: `{"policy", "key"}` and the one field
/// the route names (`cleared`, `blocked_secs`, `unblocked`, `reset`).
#[derive(Debug, Serialize)]
pub(super) struct CallerChanged {
    policy: String,
    key: String,
    #[serde(flatten)]
    did: Did,
}

/// The field a caller's write answers with.
#[derive(Debug, Serialize)]
pub(super) enum Did {
    #[serde(rename = "cleared")]
    Cleared(bool),
    #[serde(rename = "blocked_secs")]
    Blocked(u64),
    #[serde(rename = "unblocked")]
    Unblocked(bool),
    #[serde(rename = "reset")]
    Reset(bool),
}

pub(super) fn caller_changed(limiter: &RateLimiter, key: &Key, did: Did) -> CallerChanged {
    CallerChanged {
        policy: limiter.policy().name().to_owned(),
        key: key.as_str().to_owned(),
        did,
    }
}

/// `PUT /policies/{policy}/limit` and `/cap`.
#[derive(Debug, Serialize)]
pub(super) struct PolicyWideSet {
    pub policy: String,
    pub which: &'static str,
    pub value: OverrideView,
}

/// `DELETE /policies/{policy}/limit` and `/cap`.
#[derive(Debug, Serialize)]
pub(super) struct PolicyWideCleared {
    pub policy: String,
    pub which: &'static str,
    pub cleared: bool,
}

/// A caller's state under a policy, as a peek found it.
#[derive(Debug, Serialize)]
pub(super) struct State {
    policy: String,
    key: String,
    limit: u64,
    remaining: u64,
    used: u64,
    reset: u64,
    quota: usize,
    scope: &'static str,
    blocked: bool,
    retry_after_secs: Option<u64>,
    fallback: bool,
}

pub(super) fn state(policy: &Policy, key: &Key, d: &Decision) -> State {
    State {
        policy: policy.name().to_owned(),
        key: key.as_str().to_owned(),
        limit: d.limit,
        remaining: d.remaining,
        used: d.used,
        reset: d.reset_epoch_secs(),
        quota: d.quota,
        scope: d.scope.as_str(),
        blocked: d.blocked,
        retry_after_secs: d.retry_after_secs(),
        fallback: d.fallback,
    }
}
