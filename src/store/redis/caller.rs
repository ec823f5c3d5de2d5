//! The Redis store's side of a caller's own rules: the arguments and keys
//! `lua/caller.lua` takes after a strategy's, and the operator's calls
//! (`lua/override.lua`, `lua/block.lua`, and `lua/reset.lua` on the
//! penalty key alone to unblock).

use std::time::Duration;

use redis::Value;

use super::args::int;
use super::script::{Args, SCRIPTS};
use super::RedisStore;
use crate::error::StoreError;
use crate::key::Key;
use crate::overrides::Override;
use crate::policy::Policy;
use crate::store::keys::KeyList;

impl RedisStore {
    /// Appends what `lua/caller.lua` takes to a decision of `policy` for
    /// `key`: the override's and the penalty box's keys; for an overridable
    /// policy the cap's limits and their count; the penalty box's four;
    /// and where the quota arguments start (negated, for a policy with a
    /// penalty box).
    pub(super) fn add_caller_rules(
        &self,
        policy: &Policy,
        key: &Key,
        keys: &mut KeyList,
        args: &mut Args,
    ) {
        let at = if policy.is_overridable() {
            keys.push(self.keyspace().override_key(policy, key));
            // An operator's cap, which an override may not pass: its
            // limits, then how many (0: none).
            let cap = policy.cap().unwrap_or_default();
            args.extend(cap.iter().map(|&most| int(most)));
            args.push(int(cap.len()));
            let (offset, _) = policy.strategy().algorithm().quota_args(policy);
            int(offset + 1)
        } else {
            0
        };
        match policy.penalty_box() {
            Some(penalty) => {
                keys.push(self.keyspace().penalty_key(policy, key));
                args.extend(penalty.args().map(int));
                args.push(-at - 1);
            }
            None => args.push(at),
        }
    }

    /// One `override.lua` call on `key`, with `args` after the operation.
    async fn override_call(&self, key: String, args: &[&str]) -> Result<Value, StoreError> {
        let script = &SCRIPTS.overrides;
        self.connection()
            .eval(script, &[key], args, false)
            .await
            .map_err(|err| script.error(err))
    }

    pub(super) async fn set_caller_override(
        &self,
        policy: &Policy,
        key: &Key,
        o: &Override,
    ) -> Result<(), StoreError> {
        let overridden = policy.with_quotas(o.shared_quotas().clone());
        let (_, quota_args) = overridden.strategy().algorithm().quota_args(&overridden);
        let text = o.to_text();
        let mut value = o.until_micros().unwrap_or(0).to_string();
        for a in &quota_args {
            value.push(' ');
            value.push_str(&a.to_string());
        }
        value.push('|');
        value.push_str(&text);
        // An override with an end is kept a second past it (the script
        // stops honouring it at its end); one without is configuration.
        let px = match o.until_micros() {
            None => 0,
            Some(until) => {
                let now = self.now_micros_estimate();
                until.saturating_sub(now) / 1000 + 1000
            }
        };
        let px = px.to_string();
        self.override_call(
            self.keyspace().override_key(policy, key),
            &["set", &value, &px],
        )
        .await?;
        self.override_call(
            self.keyspace().overrides_list(policy),
            &["add", key.as_str(), &text],
        )
        .await?;
        Ok(())
    }

    pub(super) async fn get_caller_override(
        &self,
        policy: &Policy,
        key: &Key,
    ) -> Result<Option<Override>, StoreError> {
        let value = self
            .override_call(self.keyspace().override_key(policy, key), &["get"])
            .await?;
        let text: Option<String> = redis::from_redis_value(value)
            .map_err(|err| StoreError::protocol(format!("override: {err}")))?;
        let Some(text) = text else { return Ok(None) };
        let o = text
            .split_once('|')
            .and_then(|(_, o)| Override::from_text(o))
            .ok_or_else(|| StoreError::protocol(format!("malformed override {text:?}")))?;
        let now = self.now_micros_estimate();
        Ok(o.in_force(now).then_some(o))
    }

    pub(super) async fn clear_caller_override(
        &self,
        policy: &Policy,
        key: &Key,
    ) -> Result<bool, StoreError> {
        let in_force = self.get_caller_override(policy, key).await?.is_some();
        self.override_call(self.keyspace().override_key(policy, key), &["del"])
            .await?;
        self.override_call(
            self.keyspace().overrides_list(policy),
            &["remove", key.as_str()],
        )
        .await?;
        Ok(in_force)
    }

    pub(super) async fn list_caller_overrides(
        &self,
        policy: &Policy,
    ) -> Result<Vec<(Key, Override)>, StoreError> {
        let value = self
            .override_call(self.keyspace().overrides_list(policy), &["list"])
            .await?;
        let pairs: Vec<(String, String)> = redis::from_redis_value(value)
            .map_err(|err| StoreError::protocol(format!("overrides: {err}")))?;
        let now = self.now_micros_estimate();
        Ok(pairs
            .into_iter()
            .filter_map(|(caller, text)| Some((Key::escaped(caller), Override::from_text(&text)?)))
            .filter(|(_, o)| o.in_force(now))
            .collect())
    }

    pub(super) async fn block_caller(
        &self,
        policy: &Policy,
        key: &Key,
        block: Duration,
    ) -> Result<(), StoreError> {
        let Some(penalty) = policy.penalty_box() else {
            return Err(StoreError::new(
                crate::error::StoreErrorKind::Rejected,
                format!("policy {:?} has no penalty box", policy.name()),
            ));
        };
        let [_, _, _, cap] = penalty.args();
        let args = [self.script_now().arg(), int(block.as_micros()), int(cap)];
        let script = &SCRIPTS.block;
        self.connection()
            .eval(
                script,
                &[self.keyspace().penalty_key(policy, key)],
                &args,
                false,
            )
            .await
            .map_err(|err| script.error(err))?;
        Ok(())
    }

    /// One `DEL` of `key`'s penalty key under `policy` (lua/reset.lua, the
    /// reset's script, given that key alone): its counters and override
    /// stay. `true` if the key existed.
    pub(super) async fn unblock_caller(
        &self,
        policy: &Policy,
        key: &Key,
    ) -> Result<bool, StoreError> {
        let no_args: [i64; 0] = [];
        let script = &SCRIPTS.reset;
        let removed = self
            .connection()
            .eval(
                script,
                &[self.keyspace().penalty_key(policy, key)],
                &no_args,
                false,
            )
            .await
            .map_err(|err| script.error(err))?;
        let removed: i64 = redis::from_redis_value(removed)
            .map_err(|err| StoreError::protocol(format!("unblock: {err}")))?;
        Ok(removed > 0)
    }
}
