//! The Redis store's runtime limits (see
//! [`PolicyLimits`](crate::PolicyLimits)): one hash holds every policy's,
//! written by operators; each app server keeps a copy, read again every
//! [`REFRESH`] by a task of the store, and judges requests by it without a
//! call. While Redis is out of reach a server keeps the copy it has; one
//! that starts then judges by the quotas the policies were built with, and
//! says so once.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;

use redis::Value;

use super::script::SCRIPTS;
use super::{Inner, RedisStore};
use crate::error::StoreError;
use crate::overrides::Override;
use crate::policy::Policy;
use crate::policy_limits::{PolicyLimit, PolicyLimits};
use crate::store::policy_limits::{field, read_fields};

/// How often each app server reads the hash again: a change made through
/// another server reaches it within this and one round trip.
pub(crate) const REFRESH: Duration = Duration::from_millis(500);

impl RedisStore {
    /// `policy` with the runtime limits this server knows in force.
    pub(super) fn policy_in_force_known(&self, policy: &Policy) -> Option<Arc<Policy>> {
        if !policy.is_adjustable() {
            return None;
        }
        self.watch_policy_limits();
        self.inner
            .policy_limits
            .policy_in_force(policy, || self.now_micros_estimate())
    }

    /// Reads the hash: every policy's limits.
    async fn read_policy_limits(
        &self,
    ) -> Result<std::collections::HashMap<(String, String), PolicyLimits>, StoreError> {
        let script = &SCRIPTS.overrides;
        let value = self
            .connection()
            .eval(
                script,
                &[self.keyspace().policy_limits_key()],
                &["list"],
                false,
            )
            .await
            .map_err(|err| script.error(err))?;
        let pairs: Vec<(String, String)> = redis::from_redis_value(value)
            .map_err(|err| StoreError::protocol(format!("runtime limits: {err}")))?;
        Ok(read_fields(pairs))
    }

    /// `policy`'s limits as Redis holds them now, those in force.
    pub(super) async fn fresh_policy_limits(
        &self,
        policy: &Policy,
    ) -> Result<PolicyLimits, StoreError> {
        let all = self.read_policy_limits().await?;
        let owner = (
            policy.name().to_owned(),
            policy.strategy().as_str().to_owned(),
        );
        let limits = all.get(&owner).cloned().unwrap_or_default();
        Ok(limits.in_force(self.now_micros_estimate()))
    }

    /// Each of `policies`' limits as Redis holds them now, from one read of
    /// the hash.
    pub(super) async fn fresh_policies_limits(
        &self,
        policies: &[&Policy],
    ) -> Result<Vec<PolicyLimits>, StoreError> {
        let all = self.read_policy_limits().await?;
        let now = self.now_micros_estimate();
        Ok(policies
            .iter()
            .map(|policy| {
                let owner = (
                    policy.name().to_owned(),
                    policy.strategy().as_str().to_owned(),
                );
                all.get(&owner).cloned().unwrap_or_default().in_force(now)
            })
            .collect())
    }

    /// One `HSET` (or `HDEL`) of the hash; this server applies it at once.
    pub(super) async fn write_policy_limit(
        &self,
        policy: &Policy,
        which: PolicyLimit,
        value: Option<&Override>,
    ) -> Result<(), StoreError> {
        let script = &SCRIPTS.overrides;
        let field = field(policy, which);
        let text;
        let args: Vec<&str> = match value {
            Some(value) => {
                text = value.to_text();
                vec!["add", &field, &text]
            }
            None => vec!["remove", &field],
        };
        let _: Value = self
            .connection()
            .eval(script, &[self.keyspace().policy_limits_key()], &args, false)
            .await
            .map_err(|err| script.error(err))?;
        self.inner.policy_limits.set(policy, which, value.cloned());
        Ok(())
    }

    /// Starts the task that reads the hash every [`REFRESH`], once, while
    /// the store lives (it needs a Tokio runtime; without one, limits set
    /// through this server still apply here).
    fn watch_policy_limits(&self) {
        // A load on every request; the swap, a write to a line every core
        // shares, only until the task runs.
        if self.inner.watching_limits.load(Ordering::Relaxed)
            || self.inner.watching_limits.swap(true, Ordering::Relaxed)
        {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            self.inner.watching_limits.store(false, Ordering::Relaxed);
            return;
        };
        let store: Weak<Inner> = std::sync::Arc::downgrade(&self.inner);
        runtime.spawn(async move {
            let mut heard = None;
            loop {
                let Some(inner) = store.upgrade() else { return };
                let store = RedisStore { inner };
                let writes = store.inner.policy_limits.writes();
                match store.read_policy_limits().await {
                    Ok(all) => {
                        if heard == Some(false) {
                            tracing::info!("runtime limits read from Redis again");
                        }
                        store.inner.policy_limits.replace(all, writes);
                        heard = Some(true);
                    }
                    Err(err) if heard.is_none() => {
                        tracing::warn!(error = %err,
                            "cannot read the runtime limits from Redis: judging by the quotas the policies were built with until it answers");
                        heard = Some(false);
                    }
                    Err(err) => {
                        tracing::debug!(error = %err,
                            "cannot read the runtime limits from Redis: keeping the last ones read");
                    }
                }
                drop(store);
                tokio::time::sleep(REFRESH).await;
            }
        });
    }
}
