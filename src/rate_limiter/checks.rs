//! Whether an operator's change fits a policy: an override, a runtime
//! limit or cap. A change that does not is refused with a
//! [`ConfigError`] before the store is asked.

use crate::error::ConfigError;
use crate::overrides::Override;
use crate::policy::Policy;
use crate::policy_limits::PolicyLimit;

/// Whether `quotas` can override `policy`'s.
pub(super) fn check_override(policy: &Policy, quotas: &Override) -> Result<(), ConfigError> {
    let invalid = |why: String| ConfigError::Override {
        policy: policy.name().to_owned(),
        why,
    };
    if !policy.is_overridable() {
        return Err(invalid(
            "the policy takes no overrides; build it with Policy::overridable".into(),
        ));
    }
    if let Some(why) = quotas.note_problem() {
        return Err(invalid(why));
    }
    quotas_fit(policy, quotas, "the override").map_err(invalid)
}

/// Why `quotas` (`what`: an override, a runtime limit) cannot judge
/// `policy`'s callers: not one quota per quota of the policy's, or not
/// valid for its strategy.
fn quotas_fit(policy: &Policy, quotas: &Override, what: &str) -> Result<(), String> {
    if quotas.quotas().len() != policy.quotas().len() {
        return Err(format!(
            "the policy has {} quota(s), {what} {}",
            policy.quotas().len(),
            quotas.quotas().len()
        ));
    }
    policy
        .with_quotas(quotas.shared_quotas().clone())
        .validate()
        .map_err(|e| e.reason().to_string())
}

/// Whether `value` fits `policy` as its runtime `which`: one quota per
/// quota of the policy's, valid for its strategy; a cap's windows the
/// policy's.
pub(super) fn check_policy_limit(
    policy: &Policy,
    which: PolicyLimit,
    value: &Override,
) -> Result<(), ConfigError> {
    let invalid = |why: String| ConfigError::PolicyLimit {
        policy: policy.name().to_owned(),
        which: which.as_str(),
        why,
    };
    if !policy.is_adjustable() {
        return Err(invalid(
            "the policy's limits are fixed; build it with Policy::adjustable".into(),
        ));
    }
    quotas_fit(policy, value, &format!("the {}", which.as_str())).map_err(invalid)?;
    if which == PolicyLimit::Cap {
        let windows = |qs: &[crate::Quota]| qs.iter().map(|q| q.window()).collect::<Vec<_>>();
        if windows(value.quotas()) != windows(policy.quotas()) {
            return Err(invalid(
                "give the policy's windows, one limit for each".into(),
            ));
        }
    }
    Ok(())
}
