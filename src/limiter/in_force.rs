//! The policy in force: the one value a request is judged by, computed once
//! per decision from every source of adjustment, and the only place the
//! policy as built is read.
//!
//! Precedence, lowest first (docs/operations.md has the table): the policy
//! as built; the runtime limit an operator set for every caller; a limit
//! the request brought; all of them under the operator's cap. A caller's
//! override is the store's to apply, in the same call that decides (it
//! beats all but the cap). The policy in force travels with the pass in
//! its receipt ([`Receipt::charged_under`]), so a give-back, a settle and
//! the headers of that pass use it, whatever is in force by then.

use std::sync::Arc;

use http::request::Parts;

use super::Limiter;
use crate::decision::Receipt;
use crate::policy::Policy;

impl Limiter {
    /// The policy in force for a request with head `parts` (`None`: a call
    /// outside HTTP, or a peek, which bring no limit of their own); `None`
    /// when it is the policy as built. A policy whose limits are fixed asks
    /// the store nothing.
    pub(crate) fn policy_in_force(&self, parts: Option<&Parts>) -> Option<Arc<Policy>> {
        let built = &self.config.as_built;
        let runtime = match built.is_adjustable() {
            true => self.config.store.policy_in_force(built),
            false => None,
        };
        let requested = self
            .config
            .request_limit
            .as_ref()
            .zip(parts)
            .and_then(|(limits, parts)| Some((limits.from)(parts)?.clamp(limits.min, limits.max)));
        match requested {
            None => runtime,
            Some(limit) => {
                let base = runtime.as_deref().unwrap_or(built);
                Some(Arc::new(base.with_request_limit(limit)))
            }
        }
    }

    /// The policy `adjusted` names: itself, or the policy as built.
    pub(crate) fn in_force<'a>(&'a self, adjusted: Option<&'a Arc<Policy>>) -> &'a Policy {
        adjusted.map_or(&self.config.as_built, |policy| policy)
    }

    /// The policy in force when `receipt` was charged: every give-back and
    /// settle of it is computed with this one.
    pub(crate) fn charged_under<'a>(&'a self, receipt: &'a Receipt) -> &'a Policy {
        self.in_force(receipt.charged_under())
    }

    /// The policy as built, for what no adjustment changes: its name, its
    /// strategy and the keys of its state, and where an operator's writes
    /// (overrides, blocks, runtime limits) go.
    pub(crate) fn as_built(&self) -> &Policy {
        &self.config.as_built
    }

    /// The policy's name, for logs and metrics.
    pub(crate) fn name(&self) -> &str {
        self.config.as_built.name()
    }
}
