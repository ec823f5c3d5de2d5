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

/// A list entry whose write did not finish: the override key says what is
/// in force.
const PENDING: &str = "?";

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

    /// Sets `key`'s override, list first, so that no override lands
    /// unlisted: the list marks the caller pending, the override key is
    /// written, then the list entry is confirmed (three `EVALSHA`). Over
    /// one connection to one server the first two are sent back to back
    /// (the server runs them in that order); elsewhere (a cluster, shards)
    /// the override waits for the mark. A write that stops after the mark
    /// leaves it pending, which a listing settles from the override key.
    pub(super) async fn set_caller_override(
        &self,
        policy: &Policy,
        key: &Key,
        o: &Override,
    ) -> Result<(), StoreError> {
        let overridden = policy.with_quotas(o.shared_quotas().clone());
        let (_, quota_args) = overridden.strategy().algorithm().quota_args(&overridden);
        let text = o.to_stored();
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
        let args = ["set", &value, &px];
        let write = self.override_call(self.keyspace().override_key(policy, key), &args);
        self.marked_then(policy, key, write).await?;
        self.override_call(
            self.keyspace().overrides_list(policy),
            &["add", key.as_str(), &text],
        )
        .await
        .map_err(StoreError::after_a_write)?;
        Ok(())
    }

    /// Marks `key` pending in `policy`'s list, then runs `write` on its
    /// override key: back to back over one ordered connection, else one
    /// after the other. An error after the mark landed says the store may
    /// have changed, whatever its kind.
    async fn marked_then(
        &self,
        policy: &Policy,
        key: &Key,
        write: impl std::future::Future<Output = Result<Value, StoreError>>,
    ) -> Result<Value, StoreError> {
        let args = ["add", key.as_str(), PENDING];
        let mark = self.override_call(self.keyspace().overrides_list(policy), &args);
        if self.connection().in_order() {
            let (marked, written) = tokio::join!(mark, write);
            marked?;
            written.map_err(StoreError::after_a_write)
        } else {
            mark.await?;
            write.await.map_err(StoreError::after_a_write)
        }
    }

    pub(super) async fn get_caller_override(
        &self,
        policy: &Policy,
        key: &Key,
    ) -> Result<Option<Override>, StoreError> {
        let value = self
            .override_call(self.keyspace().override_key(policy, key), &["get"])
            .await?;
        self.in_force(value)
    }

    /// The override an override key's value holds, if it is in force.
    fn in_force(&self, value: Value) -> Result<Option<Override>, StoreError> {
        let text: Option<String> = redis::from_redis_value(value)
            .map_err(|err| StoreError::protocol(format!("override: {err}")))?;
        let Some(text) = text else { return Ok(None) };
        let o = text
            .split_once('|')
            .and_then(|(_, o)| Override::from_stored(o))
            .ok_or_else(|| StoreError::protocol(format!("malformed override {text:?}")))?;
        let now = self.now_micros_estimate();
        Ok(o.in_force(now).then_some(o))
    }

    /// Clears `key`'s override, list first as a set does: the list marks
    /// it pending, the override key is deleted (its old value read in the
    /// same script), then the list entry removed (three `EVALSHA`).
    pub(super) async fn clear_caller_override(
        &self,
        policy: &Policy,
        key: &Key,
    ) -> Result<bool, StoreError> {
        let delete = self.override_call(self.keyspace().override_key(policy, key), &["del"]);
        let old = self.marked_then(policy, key, delete).await?;
        let in_force = self.in_force(old).map_err(StoreError::after_a_write)?;
        self.override_call(
            self.keyspace().overrides_list(policy),
            &["remove", key.as_str()],
        )
        .await
        .map_err(StoreError::after_a_write)?;
        Ok(in_force.is_some())
    }

    /// Every override in force: the list's confirmed entries, and for each
    /// pending one (a write that did not finish) what its override key
    /// holds, read from there: one `EVALSHA`, and one more per pending
    /// entry.
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
        let mut listed = Vec::with_capacity(pairs.len());
        for (caller, text) in pairs {
            let key = Key::escaped(caller);
            let found = if text == PENDING {
                self.get_caller_override(policy, &key).await?
            } else {
                Override::from_stored(&text).filter(|o| o.in_force(now))
            };
            if let Some(o) = found {
                listed.push((key, o));
            }
        }
        Ok(listed)
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
