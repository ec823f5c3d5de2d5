//! The runtime limits of several limiters' policies, read together: one
//! store call per store they share, as `GET /policies` lists them.

use std::sync::Arc;

use super::RateLimiter;
use crate::error::StoreError;
use crate::policy::Policy;
use crate::policy_limits::PolicyLimits;

impl RateLimiter {
    /// The runtime limits of each of `limiters`' policies, in their order:
    /// one [`Store::policies_limits`](crate::Store::policies_limits) call
    /// per store they share (on Redis one `EVALSHA` for them all), each
    /// within its deadline. A store whose read fails or times out fails its
    /// own policies' entries, not the others'.
    #[cfg_attr(not(feature = "admin"), allow(dead_code))]
    pub(crate) async fn policy_limits_of(
        limiters: &[&RateLimiter],
    ) -> Vec<Result<PolicyLimits, Arc<StoreError>>> {
        let mut read: Vec<Option<Result<PolicyLimits, Arc<StoreError>>>> =
            limiters.iter().map(|_| None).collect();
        for (i, first) in limiters.iter().enumerate() {
            if read[i].is_some() {
                continue;
            }
            let store = &first.core.config.store;
            let sharing: Vec<usize> = (i..limiters.len())
                .filter(|&j| Arc::ptr_eq(&limiters[j].core.config.store, store))
                .collect();
            let policies: Vec<&Policy> = sharing.iter().map(|&j| limiters[j].policy()).collect();
            let answer = first
                .core
                .within_deadline(store.policies_limits(&policies))
                .await
                .0;
            match answer {
                Ok(all) => {
                    for (&j, limits) in sharing.iter().zip(all) {
                        read[j] = Some(Ok(limits));
                    }
                }
                Err(err) => {
                    let err = Arc::new(err);
                    for &j in &sharing {
                        read[j] = Some(Err(err.clone()));
                    }
                }
            }
        }
        read.into_iter()
            .map(|r| r.unwrap_or_else(|| Ok(PolicyLimits::default())))
            .collect()
    }
}
