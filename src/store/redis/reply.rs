//! Turning script replies (integer arrays, or a batch's lines of integers)
//! into decisions.

use redis::Value;

use crate::decision::{Decision, Receipt};
use crate::error::StoreError;

/// Fields every decision script returns first, in this order:
/// allowed, limit, used, reset_at µs, retry_after µs or -1, now µs, quota.
const HEAD: usize = 7;

/// The script's integers, as an array or packed in one string (8-byte
/// big-endian words, `lua/packed.lua`); anything else is a protocol error.
pub(crate) fn integers(value: Value) -> Result<Vec<i64>, StoreError> {
    match value {
        Value::BulkString(bytes) if bytes.len() % 8 == 0 && !bytes.is_empty() => Ok(bytes
            .chunks_exact(8)
            .map(|word| {
                let mut be = [0; 8];
                be.copy_from_slice(word);
                i64::from_be_bytes(be)
            })
            .collect()),
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

/// A line of a batch reply (see `lua/batch.lua`): integers separated by
/// single spaces.
pub(crate) fn parse_integers(line: &[u8]) -> Result<Vec<i64>, StoreError> {
    let malformed = || {
        StoreError::protocol(format!(
            "expected integers, got {:?}",
            String::from_utf8_lossy(line)
        ))
    };
    // One pass over the bytes: this runs for every batched decision.
    let mut ints = Vec::with_capacity(8);
    let (mut n, mut digits, mut negative) = (0i64, 0usize, false);
    for &b in line {
        match b {
            b'0'..=b'9' => {
                // Any i64 (Lua formats up to 19 digits); past it, malformed.
                n = n
                    .checked_mul(10)
                    .and_then(|n| n.checked_add(i64::from(b - b'0')))
                    .ok_or_else(malformed)?;
                digits += 1;
            }
            b'-' if digits == 0 && !negative => negative = true,
            b' ' if digits > 0 => {
                ints.push(if negative { -n } else { n });
                (n, digits, negative) = (0, 0, false);
            }
            _ => return Err(malformed()),
        }
    }
    if digits == 0 {
        return Err(malformed());
    }
    ints.push(if negative { -n } else { n });
    Ok(ints)
}

/// Decodes the shared reply head, with the remaining integers as the receipt.
pub(crate) fn decision(ints: Vec<i64>, cost: u64) -> Result<Decision, StoreError> {
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
pub(crate) fn shaped(ints: Vec<i64>, cost: u64) -> Result<Decision, StoreError> {
    let mut decision = decision(ints, cost)?;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packed_words_and_arrays_give_the_same_integers() {
        let ints = [1, 100, 3, 1_800_000_000_000_000, -1, i64::MIN, 0, i64::MAX];
        let packed: Vec<u8> = ints.iter().flat_map(|i| i.to_be_bytes()).collect();
        assert_eq!(integers(Value::BulkString(packed)).unwrap(), ints);
        let array = Value::Array(ints.iter().map(|&i| Value::Int(i)).collect());
        assert_eq!(integers(array).unwrap(), ints);
        for bad in [
            Value::BulkString(vec![0; 7]),
            Value::BulkString(vec![]),
            Value::Nil,
        ] {
            assert!(integers(bad.clone()).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_batch_line_parses_to_its_integers() {
        let line = b"1 100 3 1800000000000000 -1 1799999999000000 0 1800000000000000";
        assert_eq!(
            parse_integers(line).unwrap(),
            [
                1,
                100,
                3,
                1_800_000_000_000_000,
                -1,
                1_799_999_999_000_000,
                0,
                1_800_000_000_000_000
            ]
        );
        // Every i64 a script can return, extremes included.
        assert_eq!(
            parse_integers(b"9223372036854775807 -9223372036854775807").unwrap(),
            [i64::MAX, -i64::MAX]
        );
        for bad in [
            &b""[..],
            b"1  2",
            b"1 x",
            b"-",
            b"1 2 ",
            b"9223372036854775808",
        ] {
            assert!(parse_integers(bad).is_err(), "{bad:?}");
        }
    }
}
