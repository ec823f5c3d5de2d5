//! The Redis store's give-backs: a refund (a `304`), a settle to the
//! response's actual cost, a held slot's release, and a reset.

use super::args::GiveBack;
use super::script::{Args, LuaScript, SCRIPTS};
use super::RedisStore;
use crate::decision::{Receipt, Scope};
use crate::error::StoreError;
use crate::key::Key;
use crate::policy::Policy;
use crate::store::keys::KeyList;

impl RedisStore {
    pub(super) async fn give_back(
        &self,
        policy: &Policy,
        key: &Key,
        receipt: &Receipt,
    ) -> Result<(), StoreError> {
        if receipt.is_empty() || self.refund_to_lease(policy, key, receipt) {
            return Ok(());
        }
        self.refunding_in_redis(policy, key, receipt).await;
        self.refund_in_redis(policy, key, receipt).await
    }

    /// The strategy's refund script for `receipt`, in Redis.
    pub(super) async fn refund_in_redis(
        &self,
        policy: &Policy,
        key: &Key,
        receipt: &Receipt,
    ) -> Result<(), StoreError> {
        let keys = self.inner.keys.quota_keys(policy, key);
        let algorithm = policy.strategy().algorithm();
        match algorithm.give_back_call(policy, self.script_now(), receipt) {
            GiveBack::Release(script, args) => self.release(keys, script, args).await,
            GiveBack::Refund(script, args) => self.send_refund(script, &keys, &args).await,
        }
    }

    /// One call of a strategy's refund script, alone (refunds and settles
    /// are never batched: they apply however late).
    async fn send_refund(
        &self,
        script: &'static LuaScript,
        keys: &[String],
        args: &[String],
    ) -> Result<(), StoreError> {
        self.inner
            .conn
            .eval(script, keys, args, false)
            .await
            .map_err(|err| script.error(err))?;
        Ok(())
    }

    /// One `EVALSHA` of the strategy's refund script with the difference
    /// (negative: a charge); none when there is nothing to send. Sent
    /// without a deadline: like a refund it applies however late, to what
    /// the receipt charged or not at all.
    pub(super) async fn settle_units(
        &self,
        policy: &Policy,
        key: &Key,
        receipt: &Receipt,
        actual: u64,
    ) -> Result<(), StoreError> {
        if let Some(refused) = policy.strategy().settle_refused() {
            return Err(refused);
        }
        // A rejection's receipt names nothing: it charged nothing.
        if actual == receipt.cost() || receipt.stamps().is_empty() {
            return Ok(());
        }
        // The lease in hand settles what it can; Redis the rest.
        let actual = self.settle_in_lease(policy, key, receipt, actual).await;
        if actual == receipt.cost() {
            return Ok(());
        }
        let algorithm = policy.strategy().algorithm();
        let call = algorithm.settle_call(policy, self.script_now(), receipt, actual);
        let Some(GiveBack::Refund(script, args)) = call else {
            return Ok(());
        };
        let keys = self.inner.keys.quota_keys(policy, key);
        self.send_refund(script, &keys, &args).await
    }

    /// Frees what a pass held until its response ended (a concurrency
    /// limit's slot) with `script` and `args`: batched, when the store
    /// batches, like the decisions that take slots, so a crowd frees them
    /// at the same cost.
    pub(super) async fn release(
        &self,
        keys: KeyList,
        script: &'static LuaScript,
        args: Args,
    ) -> Result<(), StoreError> {
        match self.batcher_for(&keys) {
            Some(batcher) => {
                batcher.give_back(script, keys, args).await?;
            }
            None => {
                self.inner
                    .conn
                    .eval(script, &keys, &args, false)
                    .await
                    .map_err(|err| script.error(err))?;
            }
        }
        Ok(())
    }

    /// One `DEL` of `key`'s own keys under `policy` (lua/reset.lua), its
    /// penalty-box entry with them (not its override, which is
    /// configuration): its keys share one hash tag, so one call on one
    /// node clears them all.
    pub(super) async fn forget(&self, policy: &Policy, key: &Key) -> Result<(), StoreError> {
        self.forget_lease(policy, key);
        let mut keys: KeyList = self
            .inner
            .keys
            .quota_keys(policy, key)
            .into_iter()
            .enumerate()
            .filter(|(i, _)| policy.strategy().scope_of(*i) == Scope::Consumer)
            .map(|(_, name)| name)
            .collect();
        if policy.penalty_box().is_some() {
            keys.push(self.inner.keys.penalty_key(policy, key));
        }
        if keys.is_empty() {
            return Ok(());
        }
        let no_args: [i64; 0] = [];
        self.inner
            .conn
            .eval(&SCRIPTS.reset, &keys, &no_args, false)
            .await
            .map_err(|err| SCRIPTS.reset.error(err))?;
        Ok(())
    }
}
