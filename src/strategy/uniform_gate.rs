//! The uniform gate: one call per caller per span.
//!
//! Mirrors `lua/uniform_gate.lua`; change both together.
//!
//! The gate's state is the moment it opens again, in µs. Published versions
//! test `TTL key > 0`, which rounds to seconds and lets a caller in up to a
//! second early, and check then set in two round trips; here the stored time
//! decides, to the microsecond, and check-and-set is one atomic step.

use super::fixed_window::EXPIRY_GRACE_MICROS;
use super::MAX_SPAN_MICROS;
use super::{Algorithm, Settles, Strategy};
use crate::decision::{Decision, Receipt};
use crate::error::ConfigError;
use crate::policy::Policy;
use crate::quota::Quota;
use crate::store::memory::names::KeyNames;
use crate::store::memory::shard::Shard;
use crate::store::memory::state::State;
#[cfg(feature = "redis")]
use crate::store::redis::args::{int, stamps, GiveBack, ScriptNow};
#[cfg(feature = "redis")]
use crate::store::redis::script::{Args, LuaScript, Trio};
use std::num::NonZeroU32;
use std::sync::Arc;
#[cfg(feature = "redis")]
use std::sync::LazyLock;
use std::time::Duration;

/// The gate takes one quota whose limit is 1: its window is the span.
pub(crate) fn validate(quotas: &[Quota]) -> Result<(), ConfigError> {
    match quotas {
        [q] if q.limit() == 1 => Ok(()),
        [q] => Err(ConfigError::UniformGateLimit { limit: q.limit() }),
        _ => Err(ConfigError::UniformGateQuotas { got: quotas.len() }),
    }
}

/// How long a pass of `cost` closes the gate: `cost` spans, at most a year.
pub(crate) fn closing(span: u64, cost: u64) -> u64 {
    cost.saturating_mul(span).min(MAX_SPAN_MICROS)
}

/// Decides, and on a pass closes the gate: `reopen_at` becomes
/// `now + cost × span`. A stored time that is not after `now` counts as open,
/// whether or not the store has expired it yet. With `cost == 0` nothing is
/// written (a peek): open reads as 1 remaining, closed as 0.
pub(crate) fn check(reopen_at: &mut Option<u64>, quota: &Quota, now: u64, cost: u64) -> Decision {
    let closed_until = reopen_at.filter(|&at| at > now);
    match closed_until {
        Some(at) if cost > 0 => Decision::rejected(1, 1, at, now, at - now),
        Some(at) => Decision::allowed(1, 1, at, now),
        None if cost == 0 => Decision::allowed(1, 0, now, now),
        None => {
            let at = now + closing(quota.window_micros(), cost);
            *reopen_at = Some(at);
            Decision::allowed(1, 1, at, now).with_receipt(Receipt::of(cost, [at]))
        }
    }
}

/// Opens the gate again if it is still closed by the pass that `stamp`
/// names (its reopening time); a later pass's closing is left alone.
pub(crate) fn refund(reopen_at: &mut Option<u64>, stamp: u64) {
    if *reopen_at == Some(stamp) {
        *reopen_at = None;
    }
}

/// When the gate reopens once the pass stamped `stamp`, which closed it
/// for `cost` spans, is settled to `actual` spans: `actual` spans from
/// when that pass came.
pub(crate) fn settled_reopening(span: u64, stamp: u64, cost: u64, actual: u64) -> u64 {
    stamp - closing(span, cost) + closing(span, actual)
}

/// Settles the pass stamped `stamp`: if the gate is still closed by it, it
/// reopens at `reopening` instead (open now, if that has passed); a later
/// pass's closing is left alone.
pub(crate) fn settle(reopen_at: &mut Option<u64>, stamp: u64, reopening: u64, now: u64) {
    if *reopen_at == Some(stamp) {
        *reopen_at = (reopening > now).then_some(reopening);
    }
}

/// This strategy's scripts, built once.
#[cfg(feature = "redis")]
static LUA: LazyLock<Trio> = LazyLock::new(|| {
    Trio::new(
        "uniform_gate",
        include_str!("../../lua/uniform_gate.lua"),
        None,
        LuaScript::refund(
            "uniform_gate_refund",
            include_str!("../../lua/uniform_gate_refund.lua"),
        ),
    )
});

/// The uniform gate's home (see [`Algorithm`]).
pub(crate) struct UniformGate;

impl Algorithm for UniformGate {
    fn max_quotas(&self) -> usize {
        1
    }

    /// Only time reopens it.
    fn rejection_is_stable(&self) -> bool {
        true
    }

    /// It reopens at `reset_at`.
    fn exhaustion_is_stable(&self) -> bool {
        true
    }

    fn validate(&self, _strategy: &Strategy, quotas: &[Quota]) -> Result<(), ConfigError> {
        validate(quotas)
    }

    /// A pass of cost `c` closes the gate for `c` spans; settled to `a`,
    /// for `a` spans from when it came, while the gate is still closed by
    /// it (and its key lives: one second past its reopening).
    fn settles(&self) -> Settles {
        Settles::Both
    }

    fn settle(
        &self,
        policy: &Policy,
        shard: &mut Shard,
        keys: &KeyNames<'_>,
        now: u64,
        receipt: &Receipt,
        actual: u64,
    ) {
        let Some(&stamp) = receipt.stamps().first() else {
            return;
        };
        let span = policy.quotas()[0].window_micros();
        let reopening = settled_reopening(span, stamp, receipt.cost(), actual);
        if let Some(State::Gate(at)) = shard.get(keys.first(), now) {
            let mut gate = Some(*at);
            settle(&mut gate, stamp, reopening, now);
            match gate {
                Some(at) => shard.put(keys.first(), State::Gate(at), at + EXPIRY_GRACE_MICROS),
                None => shard.remove(keys.first()),
            }
        }
    }

    fn decide(
        &self,
        policy: &Policy,
        shard: &mut Shard,
        keys: &KeyNames<'_>,
        now: u64,
        cost: u64,
    ) -> Decision {
        let quota = &policy.quotas()[0];
        let mut gate = match shard.get(keys.first(), now) {
            Some(State::Gate(at)) => Some(*at),
            _ => None,
        };
        let decision = check(&mut gate, quota, now, cost);
        if let (true, Some(at)) = (decision.allowed && cost > 0, gate) {
            shard.put(keys.first(), State::Gate(at), at + EXPIRY_GRACE_MICROS);
        }
        decision
    }

    fn give_back(
        &self,
        _policy: &Policy,
        shard: &mut Shard,
        keys: &KeyNames<'_>,
        now: u64,
        receipt: &Receipt,
    ) {
        let stamp = receipt.stamps().first();
        if let (Some(State::Gate(at)), Some(&stamp)) = (shard.get(keys.first(), now), stamp) {
            let mut gate = Some(*at);
            refund(&mut gate, stamp);
            if gate.is_none() {
                shard.remove(keys.first());
            }
        }
    }

    #[cfg(feature = "redis")]
    fn lua(&self) -> &'static Trio {
        &LUA
    }

    #[cfg(feature = "redis")]
    fn call(
        &self,
        policy: &Policy,
        now: ScriptNow,
        cost: u64,
        read_only: bool,
    ) -> (&'static LuaScript, Args) {
        let span = policy.quotas()[0].window_micros();
        let args = Args::from_slice(&[now.arg(), int(cost), int(span), int(MAX_SPAN_MICROS)]);
        (LUA.decide(read_only), args)
    }

    #[cfg(feature = "redis")]
    fn quota_args(&self, policy: &Policy) -> (usize, Args) {
        (
            2,
            Args::from_slice(&[int(policy.quotas()[0].window_micros())]),
        )
    }

    #[cfg(feature = "redis")]
    fn give_back_call(&self, _policy: &Policy, _now: ScriptNow, receipt: &Receipt) -> GiveBack {
        let args = stamps(receipt).collect();
        GiveBack::Refund(&LUA.refund, args)
    }

    /// The refund script with `now` and the settled reopening time.
    #[cfg(feature = "redis")]
    fn settle_call(
        &self,
        policy: &Policy,
        now: ScriptNow,
        receipt: &Receipt,
        actual: u64,
    ) -> Option<GiveBack> {
        let &stamp = receipt.stamps().first()?;
        let span = policy.quotas()[0].window_micros();
        let reopening = settled_reopening(span, stamp, receipt.cost(), actual);
        let args = vec![
            stamp.to_string(),
            now.arg().to_string(),
            reopening.to_string(),
        ];
        Some(GiveBack::Refund(&LUA.refund, args))
    }
}

impl Policy {
    /// A uniform gate: one call per caller per `span`, to the microsecond
    /// (Bob may buy tiger-feeding tickets once every 10 s). A request of cost
    /// `c` closes the gate for `c` spans. The span must be 1 ms to a year.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::Policy;
    ///
    /// let policy = Policy::uniform_gate("tigerfeeding", Duration::from_secs(10)).unwrap();
    /// assert_eq!(policy.quotas()[0].limit(), 1);
    /// assert!(Policy::uniform_gate("tigerfeeding", Duration::ZERO).is_err());
    /// ```
    pub fn uniform_gate(name: impl Into<Arc<str>>, span: Duration) -> Result<Self, ConfigError> {
        let once = Quota::with_window(NonZeroU32::MIN, span)?;
        Ok(Self::new(name, Strategy::UniformGate, once))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn span(secs: u64) -> Quota {
        Quota::new(1, Duration::from_secs(secs)).unwrap()
    }

    #[test]
    fn closed_to_the_microsecond_then_open() {
        let mut gate = None;
        assert!(check(&mut gate, &span(10), 0, 1).allowed);
        let early = check(&mut gate, &span(10), 9_999_999, 1);
        assert!(!early.allowed);
        assert_eq!(early.retry_after, Some(Duration::from_micros(1)));
        assert!(check(&mut gate, &span(10), 10_000_000, 1).allowed);
    }

    #[test]
    fn cost_closes_for_that_many_spans_and_refund_reopens() {
        let mut gate = None;
        let d = check(&mut gate, &span(10), 0, 3);
        assert_eq!(d.reset_at_micros, 30_000_000);
        refund(&mut gate, 29_999_999);
        assert_eq!(
            gate,
            Some(30_000_000),
            "another pass's stamp changes nothing"
        );
        refund(&mut gate, d.receipt.stamps()[0]);
        assert!(check(&mut gate, &span(10), 1, 1).allowed);
        assert!(validate(&[Quota::new(2, Duration::from_secs(1)).unwrap()]).is_err());
    }
}
