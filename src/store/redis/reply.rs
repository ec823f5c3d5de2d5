//! Turning script replies (integer arrays, or integers packed in a string,
//! alone or a batch's) into decisions.

use redis::{RedisResult, Value};
use smallvec::SmallVec;

use super::script::LuaScript;
use crate::decision::{Decision, Receipt};
use crate::error::StoreError;

/// A script's integers, inline for a one-quota decision (the head and one
/// stamp), so reading a reply allocates nothing.
pub(crate) type Ints = SmallVec<[i64; 8]>;

/// Fields every decision script returns first, in this order:
/// allowed, limit, used, reset_at µs, retry_after µs or -1, now µs, quota.
const HEAD: usize = 7;

/// The script's integers, as an array or packed in one string (8-byte
/// big-endian words, `lua/packed.lua`); anything else is a protocol error.
pub(crate) fn integers(value: Value) -> Result<Ints, StoreError> {
    match value {
        Value::BulkString(bytes) if bytes.len() % 8 == 0 && !bytes.is_empty() => {
            Ok(integers_of(&bytes))
        }
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

/// A lone call's reply (one decision's script, not a batch): its integers,
/// or the error it met, named after the script. Every route a decision can
/// go out alone by (a free slot, a task of its own, batching off, a batch
/// of one) reads its reply here.
pub(crate) fn lone_answer(
    script: &LuaScript,
    reply: RedisResult<Value>,
) -> Result<Ints, StoreError> {
    reply.map_err(|err| script.error(err)).and_then(integers)
}

/// One decision's reply at the start of a batch's reply (see
/// `lua/batch.lua`): its integers, or the error it met; and the replies
/// after it. `Err` when the bytes are not such a reply.
pub(crate) fn batch_entry(bytes: &[u8]) -> Result<(Result<Ints, StoreError>, &[u8]), String> {
    let malformed = || {
        format!(
            "malformed batch reply at {:?}",
            String::from_utf8_lossy(bytes)
        )
    };
    let (count, rest) = match bytes {
        [hi, lo, rest @ ..] => (usize::from(u16::from_be_bytes([*hi, *lo])), rest),
        _ => return Err(malformed()),
    };
    if count > 0 {
        let len = count * 8;
        let words = rest.get(..len).ok_or_else(malformed)?;
        return Ok((Ok(integers_of(words)), &rest[len..]));
    }
    let len = match rest {
        [hi, lo, ..] => usize::from(u16::from_be_bytes([*hi, *lo])),
        _ => return Err(malformed()),
    };
    let message = rest.get(2..2 + len).ok_or_else(malformed)?;
    let message = String::from_utf8_lossy(message);
    let (code, detail) = message.split_once(' ').unwrap_or((&message, ""));
    let err = redis::make_extension_error(code.to_owned(), Some(detail.to_owned()));
    Ok((Err(err.into()), &rest[2 + len..]))
}

/// 8-byte big-endian words, as integers.
fn integers_of(words: &[u8]) -> Ints {
    words
        .chunks_exact(8)
        .map(|word| {
            let mut be = [0; 8];
            be.copy_from_slice(word);
            i64::from_be_bytes(be)
        })
        .collect()
}

/// A charging script's first integer when it ran after its deadline and
/// wrote nothing (`lua/timed.lua`, `lua/batch.lua`); the store's `now`
/// follows.
pub(crate) const LATE: i64 = -2;

/// A decision reply's first integer for a caller in the penalty box
/// (`lua/caller.lua`): refused until the reply's reset.
const BLOCKED: i64 = 2;

/// [`BLOCKED`], by the rejection that started the block.
pub(crate) const BLOCK_STARTED: i64 = 3;

/// Decodes the shared reply head, with the remaining integers as the receipt.
pub(crate) fn decision(ints: Ints, cost: u64) -> Result<Decision, StoreError> {
    if ints.first() == Some(&LATE) {
        return Err(StoreError::late());
    }
    if ints.len() < HEAD || ints[..HEAD].iter().skip(1).any(|&i| i < -1) {
        return Err(StoreError::protocol(format!(
            "malformed decision reply {ints:?}"
        )));
    }
    let u = |i: usize| ints[i].max(0) as u64;
    let decision = if ints[0] == 1 {
        let stamps = ints[HEAD..].iter().map(|&s| s.max(0) as u64);
        Decision::allowed(u(1), u(2), u(3), u(5)).with_receipt(Receipt::of(cost, stamps))
    } else if ints[0] == BLOCKED || ints[0] == BLOCK_STARTED {
        Decision::rejected(u(1), u(2), u(3), u(5), u(4)).blocked_until(u(3))
    } else {
        Decision::rejected(u(1), u(2), u(3), u(5), u(4))
    };
    Ok(decision.reporting(u(6) as usize))
}

/// Decodes a leaky bucket's reply: the shared head, then on a pass the slot
/// end (the receipt's stamp) and the wait before leaving, µs.
pub(crate) fn shaped(ints: Ints, cost: u64) -> Result<Decision, StoreError> {
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
        assert_eq!(integers(Value::BulkString(packed)).unwrap()[..], ints);
        let array = Value::Array(ints.iter().map(|&i| Value::Int(i)).collect());
        assert_eq!(integers(array).unwrap()[..], ints);
        for bad in [
            Value::BulkString(vec![0; 7]),
            Value::BulkString(vec![]),
            Value::Nil,
        ] {
            assert!(integers(bad.clone()).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_batch_reply_splits_into_each_decisions_integers_or_error() {
        let pack = |ints: &[i64]| {
            let mut out = (ints.len() as u16).to_be_bytes().to_vec();
            out.extend(ints.iter().flat_map(|i| i.to_be_bytes()));
            out
        };
        let mut bytes = pack(&[1, 100, 3, 1_800_000_000_000_000, -1, 7, 0, i64::MAX]);
        let message = b"WRONGTYPE Operation against a key";
        bytes.extend([0, 0, 0, message.len() as u8]);
        bytes.extend(message);
        bytes.extend(pack(&[i64::MIN]));

        let (first, rest) = batch_entry(&bytes).unwrap();
        assert_eq!(
            first.unwrap()[..],
            [1, 100, 3, 1_800_000_000_000_000, -1, 7, 0, i64::MAX]
        );
        let (second, rest) = batch_entry(rest).unwrap();
        let err = second.unwrap_err().to_string();
        assert!(err.contains("WRONGTYPE"), "{err}");
        let (third, rest) = batch_entry(rest).unwrap();
        assert_eq!(third.unwrap()[..], [i64::MIN]);
        assert!(rest.is_empty());

        // Cut short anywhere, or an empty reply: malformed, never a panic.
        for cut in 0..bytes.len() {
            let mut rest = &bytes[..cut];
            let mut seen = 0;
            while !rest.is_empty() {
                match batch_entry(rest) {
                    Ok((_, after)) => rest = after,
                    Err(_) => break,
                }
                seen += 1;
            }
            assert!(seen < 3, "a reply cut at {cut} still read as whole");
        }
        assert!(batch_entry(b"").is_err());
    }
}
