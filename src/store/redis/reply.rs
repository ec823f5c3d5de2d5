//! Turning script replies (integer arrays) into decisions.

use redis::Value;

use crate::decision::{Decision, Receipt};
use crate::error::StoreError;

/// Fields every decision script returns first, in this order:
/// allowed, limit, used, reset_at µs, retry_after µs or -1, now µs, quota.
const HEAD: usize = 7;

/// The script's integers; anything else is a protocol error.
pub(crate) fn integers(value: Value) -> Result<Vec<i64>, StoreError> {
    match value {
        Value::Array(items) => items
            .into_iter()
            .map(|v| match v {
                Value::Int(i) => Ok(i),
                other => Err(StoreError::protocol(format!(
                    "expected an integer, got {other:?}"
                ))),
            })
            .collect(),
        other => Err(StoreError::protocol(format!(
            "expected an array, got {other:?}"
        ))),
    }
}

/// Decodes the shared reply head, with the remaining integers as the receipt.
pub(crate) fn decision(value: Value, cost: u64) -> Result<Decision, StoreError> {
    let ints = integers(value)?;
    if ints.len() < HEAD || ints[..HEAD].iter().skip(1).any(|&i| i < -1) {
        return Err(StoreError::protocol(format!(
            "malformed decision reply {ints:?}"
        )));
    }
    let u = |i: usize| ints[i].max(0) as u64;
    let decision = if ints[0] == 1 {
        let stamps = ints[HEAD..].iter().map(|&s| s.max(0) as u64).collect();
        Decision::allowed(u(1), u(2), u(3), u(5)).with_receipt(Receipt::new(cost, stamps))
    } else {
        Decision::rejected(u(1), u(2), u(3), u(5), u(4))
    };
    Ok(decision.reporting(u(6) as usize))
}

/// Decodes a leaky bucket's reply: the shared head, then on a pass the slot
/// end (the receipt's stamp) and the wait before leaving, µs.
pub(crate) fn shaped(value: Value, cost: u64) -> Result<Decision, StoreError> {
    let mut decision = decision(value, cost)?;
    if decision.allowed {
        let delay = decision
            .receipt
            .stamps
            .pop()
            .filter(|_| decision.receipt.stamps.len() == 1)
            .ok_or_else(|| StoreError::protocol("leaky bucket reply without slot and delay"))?;
        decision = decision.delayed(delay);
    }
    Ok(decision)
}
