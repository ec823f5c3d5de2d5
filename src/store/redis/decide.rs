//! The Redis store's decisions: a charge (from a lease, after a replica's
//! pre-check, or alone), the script call that decides, and the one step
//! every script reply goes through.

use std::time::Instant;

use super::reply::{self, Decided, Outcome, Reply};
use super::script::{Args, LuaScript, SCRIPTS};
use super::{args, batch, RedisStore};
use crate::decision::Decision;
use crate::error::StoreError;
use crate::key::Key;
use crate::policy::Policy;
use crate::store::keys::KeyList;

impl RedisStore {
    /// A charging decision, with a pre-check first if configured; a call
    /// that reaches Redis after `deadline` charges nothing.
    pub(super) async fn charge(
        &self,
        policy: &Policy,
        key: &Key,
        cost: u64,
        deadline: Option<Instant>,
    ) -> Result<Decision, StoreError> {
        {
            if self.inner.leases.is_some() {
                // Boxed: a store without leases carries none of its future.
                let leasing = Box::pin(self.charge_leasing(policy, key, cost, deadline));
                if let Some(answer) = leasing.await {
                    return answer;
                }
            }
            // A penalty box counts rejections where they are decided: a
            // pre-check's would not count.
            if self.inner.pre_check
                && cost > 0
                && policy.strategy().rejection_is_stable()
                && policy.penalty_box().is_none()
            {
                match self.decide(policy, key, cost, true, 0).await {
                    Ok(decision) if !decision.allowed => return Ok(decision),
                    Ok(_) => {}
                    Err(err) => {
                        crate::metrics::replica_fallback();
                        tracing::debug!(error = %err, "pre-check failed; asking the primary")
                    }
                }
            }
            self.decide(policy, key, cost, false, self.until(deadline))
                .await
        }
    }

    pub(super) async fn decide(
        &self,
        policy: &Policy,
        key: &Key,
        cost: u64,
        read_only: bool,
        until: i64,
    ) -> Result<Decision, StoreError> {
        let (script, keys, mut args) = self.call_for(policy, key, cost, read_only);
        let batcher = match read_only {
            true => None,
            false => self.batcher_for(&keys),
        };
        let reply = match batcher {
            Some(batcher) => batcher.eval(script, keys, args, until).await?,
            // The calls below are boxed: each future is larger than the
            // batcher's, and the store's future would carry the largest.
            None if !read_only && SCRIPTS.give_back_of(script, &args).is_some() => {
                args::with_until(&mut args, until);
                Box::pin(batch::eval_holding(&self.inner.conn, script, keys, args)).await?
            }
            None if read_only => {
                let scripting = &self.inner.scripting;
                let call =
                    Box::pin(scripting.eval_read_only(&self.inner.conn, script, &keys, &args));
                reply::integers(call.await.map_err(|err| script.error(err))?)?
            }
            None => {
                args::with_until(&mut args, until);
                let reply = Box::pin(self.inner.conn.eval(script, &keys, &args, false)).await;
                reply::integers(reply.map_err(|err| script.error(err))?)?
            }
        };
        let decided = self.heard(policy, reply)?;
        let decision = policy.strategy().algorithm().reply(decided, cost)?;
        let scope = policy.strategy().scope_of(decision.quota);
        Ok(decision.scoped(scope))
    }

    /// What every decision script's reply goes through, whichever path
    /// called it (alone, batched, a peek, a lease): read once
    /// ([`Reply::read`]); Redis's time learnt from it; a block it started
    /// counted. A call that ran too late is [`StoreError::late`].
    pub(super) fn heard(&self, policy: &Policy, ints: reply::Ints) -> Result<Decided, StoreError> {
        let reply = Reply::read(ints)?;
        self.inner.offset.observe(reply.redis_now());
        match reply {
            Reply::Late { .. } => Err(StoreError::late()),
            Reply::Decided(decided) => {
                if decided.outcome == Outcome::BlockStarted {
                    crate::metrics::block_started(policy, "strikes");
                }
                Ok(decided)
            }
        }
    }

    /// The batcher for a writing call on `keys`, if the store batches.
    pub(super) fn batcher_for(&self, keys: &[String]) -> Option<&batch::Batcher> {
        self.inner.batchers.for_keys(&self.inner.conn, keys)
    }

    /// The script, keys and arguments one decision needs.
    pub(super) fn call_for(
        &self,
        policy: &Policy,
        key: &Key,
        cost: u64,
        read_only: bool,
    ) -> (&'static LuaScript, KeyList, Args) {
        let algorithm = policy.strategy().algorithm();
        let (script, mut args) = algorithm.call(policy, self.script_now(), cost, read_only);
        let mut keys = self.inner.keys.quota_keys(policy, key);
        if !policy.has_caller_rules() {
            return (script, keys, args);
        }
        self.add_caller_rules(policy, key, &mut keys, &mut args);
        (algorithm.lua().decide_with_caller(read_only), keys, args)
    }
}
