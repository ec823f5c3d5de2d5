//! What the admin API shows, as JSON: a policy, its quotas, an override, a
//! caller's state. One function per shape, so every route shows each the
//! same way.

use std::time::Duration;

use serde_json::{json, Value};

use crate::decision::Decision;
use crate::key::Key;
use crate::overrides::Override;
use crate::policy::{Policy, Strategy};
use crate::policy_limits::PolicyLimits;
use crate::quota::Quota;
use crate::rate_limiter::RateLimiter;

/// A policy as built, and the limit and cap an operator set for every
/// caller at runtime (`runtime`: `null` for a policy that is not
/// adjustable).
///
/// ```json
/// {"name": "api", "strategy": "fixed_window", "quotas": [{"limit": 100, "window_secs": 3600}],
///  "overridable": true, "adjustable": true, "penalty_box": null,
///  "runtime": {"limit": {"quotas": [{"limit": 10, "window_secs": 3600}], "until": null}, "cap": null}}
/// ```
pub(super) fn policy(limiter: &RateLimiter, runtime: &Option<PolicyLimits>) -> Value {
    let policy = limiter.policy();
    let mut shown = json!({
        "name": policy.name(),
        "strategy": policy.strategy().as_str(),
        "quotas": quotas(policy.quotas()),
        "overridable": policy.is_overridable(),
        "adjustable": policy.is_adjustable(),
        "penalty_box": policy.penalty_box().map(|b| json!({
            "strikes": b.strikes().get(),
            "within_secs": secs(b.within()),
            "block_secs": secs(b.block()),
            "longest_block_secs": secs(b.cap()),
        })),
        "runtime": runtime.as_ref().map(|limits| json!({
            "limit": limits.limit.as_ref().map(override_of),
            "cap": limits.cap.as_ref().map(override_of),
        })),
    });
    match policy.strategy() {
        Strategy::Gcra { burst } => shown["burst"] = json!(burst.get()),
        Strategy::LeakyBucket { capacity } => shown["capacity"] = json!(capacity.get()),
        _ => {}
    }
    shown
}

/// Quotas as `[{"limit": N, "window_secs": S}]`.
pub(super) fn quotas(quotas: &[Quota]) -> Value {
    quotas
        .iter()
        .map(|q| json!({ "limit": q.limit(), "window_secs": secs(q.window()) }))
        .collect()
}

/// A caller's override: its quotas, its end (Unix seconds, or `null`) and
/// its note, when it has one.
pub(super) fn override_of(o: &Override) -> Value {
    let mut shown = json!({
        "quotas": quotas(o.quotas()),
        "until": o.until_micros().map(|us| secs(Duration::from_micros(us))),
    });
    // Only when there is one: an override without a note looks as before.
    if let Some(note) = o.note() {
        shown["note"] = json!(note);
    }
    shown
}

/// An override in a policy's list: the caller's key as stored, with it,
/// and whether it judges the caller's requests now ([`in_force`]).
pub(super) fn listed(key: &Key, o: &Override, cap: Option<&[u32]>) -> Value {
    let mut shown = override_of(o);
    shown["key"] = json!(key.as_str());
    let (in_force, reason) = in_force(Some(o), cap);
    shown["in_force"] = json!(in_force);
    shown["reason"] = json!(reason);
    shown
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

/// A caller's state under a policy, as a peek found it.
pub(super) fn state(policy: &Policy, key: &Key, d: &Decision) -> Value {
    json!({
        "policy": policy.name(),
        "key": key.as_str(),
        "limit": d.limit,
        "remaining": d.remaining,
        "used": d.used,
        "reset": d.reset_epoch_secs(),
        "quota": d.quota,
        "scope": d.scope.as_str(),
        "blocked": d.blocked,
        "retry_after_secs": d.retry_after_secs(),
        "fallback": d.fallback,
    })
}

/// Seconds, whole when they are.
fn secs(d: Duration) -> Value {
    if d.subsec_nanos() == 0 {
        json!(d.as_secs())
    } else {
        json!(d.as_secs_f64())
    }
}
