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
/// wrote nothing (`lua/timed.lua`, `lua/batch.lua`); Redis's time follows.
const LATE: i64 = -2;

/// A decision reply's first integer for a pass.
const PASSED: i64 = 1;

/// A decision reply's first integer for a caller in the penalty box
/// (`lua/caller.lua`): refused until the reply's reset.
const BLOCKED: i64 = 2;

/// [`BLOCKED`], by the rejection that started the block.
const BLOCK_STARTED: i64 = 3;

/// Where Redis's time (µs) is in a decided reply's head.
const NOW: usize = 5;

/// A decision script's reply, read once. Every path that calls one (a
/// decision alone or batched, a peek, a lease) reads it here; the positions
/// and sentinel integers of the reply stay in this file.
#[derive(Debug)]
pub(crate) enum Reply {
    /// The call ran after its request's deadline and wrote nothing.
    Late {
        /// Redis's time when it ran, µs.
        redis_now: i64,
    },
    /// The script decided.
    Decided(Decided),
}

/// How a script decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    Passed,
    Rejected,
    /// Refused: the caller is in the penalty box.
    Blocked,
    /// Refused, and this rejection started a block.
    BlockStarted,
}

/// A decided reply: its outcome, its head (limit, used, reset, retry,
/// Redis's time, the reported quota) and what follows (a pass's stamps,
/// then what a strategy or a lease adds).
#[derive(Debug)]
pub(crate) struct Decided {
    pub(crate) outcome: Outcome,
    ints: Ints,
}

impl Reply {
    /// Reads a decision script's integers; a malformed head is a protocol
    /// error.
    pub(crate) fn read(ints: Ints) -> Result<Reply, StoreError> {
        let malformed =
            |ints: &Ints| StoreError::protocol(format!("malformed decision reply {ints:?}"));
        let outcome = match ints.first() {
            Some(&LATE) => {
                let redis_now = *ints.get(1).ok_or_else(|| malformed(&ints))?;
                return Ok(Reply::Late { redis_now });
            }
            Some(&PASSED) => Outcome::Passed,
            Some(&0) => Outcome::Rejected,
            Some(&BLOCKED) => Outcome::Blocked,
            Some(&BLOCK_STARTED) => Outcome::BlockStarted,
            _ => return Err(malformed(&ints)),
        };
        if ints.len() < HEAD || ints[1..HEAD].iter().any(|&i| i < -1) {
            return Err(malformed(&ints));
        }
        Ok(Reply::Decided(Decided { outcome, ints }))
    }

    /// Redis's time when the script ran, µs.
    pub(crate) fn redis_now(&self) -> i64 {
        match self {
            Reply::Late { redis_now } => *redis_now,
            Reply::Decided(decided) => decided.ints[NOW],
        }
    }
}

/// Whether `ints`, a decision script's reply not otherwise read (a pass
/// that holds a slot, whose caller went away), is a pass.
pub(crate) fn passed(ints: &[i64]) -> bool {
    ints.first() == Some(&PASSED)
}

impl Decided {
    fn head(&self, i: usize) -> u64 {
        self.ints[i].max(0) as u64
    }

    /// The decision, with the integers after the head as a pass's
    /// receipt stamps.
    pub(crate) fn decision(self, cost: u64) -> Decision {
        let u = |i| self.head(i);
        let (limit, used, reset, retry, now) = (u(1), u(2), u(3), u(4), u(NOW));
        let decision = match self.outcome {
            Outcome::Passed => {
                let stamps = self.ints[HEAD..].iter().map(|&s| s.max(0) as u64);
                Decision::allowed(limit, used, reset, now).with_receipt(Receipt::of(cost, stamps))
            }
            Outcome::Rejected => Decision::rejected(limit, used, reset, now, retry),
            Outcome::Blocked | Outcome::BlockStarted => {
                Decision::rejected(limit, used, reset, now, retry).blocked_until(reset)
            }
        };
        decision.reporting(u(6) as usize)
    }

    /// The reply of a strategy whose units are time (GCRA): the head,
    /// then on a pass its two stamps (the TAT set, the bucket's `given`)
    /// and the µs each unit was charged as, which the receipt keeps for
    /// its give-back.
    pub(crate) fn timed(self, cost: u64) -> Result<Decision, StoreError> {
        if self.outcome != Outcome::Passed {
            return Ok(self.decision(cost));
        }
        if self.ints.len() != HEAD + 3 {
            return Err(StoreError::protocol(format!(
                "malformed reply {:?}: a pass without its stamps and unit",
                self.ints
            )));
        }
        Ok(self.decision_in_units(cost))
    }

    /// [`decision`](Self::decision), its last integer being the µs each
    /// unit of the receipt was charged as.
    fn decision_in_units(mut self, cost: u64) -> Decision {
        let unit = self.ints.pop().map_or(0, |u| u.max(0) as u64);
        let mut decision = self.decision(cost);
        decision.receipt = decision.receipt.in_units_of(unit);
        decision
    }

    /// A leaky bucket's reply: the head, then on a pass the slot end and
    /// the bucket's `given` (the receipt's stamps), the µs each unit was
    /// charged as, and the wait before leaving, µs.
    pub(crate) fn shaped(mut self, cost: u64) -> Result<Decision, StoreError> {
        if self.outcome != Outcome::Passed {
            return Ok(self.decision(cost));
        }
        if self.ints.len() != HEAD + 4 {
            return Err(StoreError::protocol(
                "leaky bucket reply without slot, unit and delay",
            ));
        }
        let delay = self.ints.pop().map_or(0, |d| d.max(0) as u64);
        Ok(self.decision_in_units(cost).delayed(delay))
    }

    /// A lease script's reply: the decision, and on a pass the units
    /// leased beyond it, after its stamp (for a strategy whose units are
    /// time, its two stamps and the µs each unit was charged as).
    pub(crate) fn leased(mut self, cost: u64) -> Result<(Decision, u64), StoreError> {
        if self.outcome != Outcome::Passed {
            return Ok((self.decision(cost), 0));
        }
        let timed = match self.ints.len() - HEAD {
            2 => false,
            4 => true,
            _ => {
                return Err(StoreError::protocol(format!(
                    "malformed lease reply {:?}",
                    self.ints
                )));
            }
        };
        let leased = self.ints.pop().map_or(0, |n| n.max(0) as u64);
        let decision = match timed {
            true => self.decision_in_units(cost),
            false => self.decision(cost),
        };
        Ok((decision, leased))
    }
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
    fn a_reply_is_read_once_into_its_outcome_and_redis_time() {
        let ints = |v: &[i64]| Ints::from_slice(v);
        let late = Reply::read(ints(&[-2, 1_700])).unwrap();
        assert!(matches!(late, Reply::Late { redis_now: 1_700 }));
        let rows = [
            (1, Outcome::Passed),
            (0, Outcome::Rejected),
            (2, Outcome::Blocked),
            (3, Outcome::BlockStarted),
        ];
        for (head, outcome) in rows {
            let reply =
                Reply::read(ints(&[head, 5, 5, 9_000_000, 4_000_000, 5_000_000, 0])).unwrap();
            assert_eq!(reply.redis_now(), 5_000_000);
            let Reply::Decided(decided) = reply else {
                panic!("{head}: not decided")
            };
            assert_eq!(decided.outcome, outcome);
            let decision = decided.decision(1);
            assert_eq!(decision.allowed, outcome == Outcome::Passed, "{head}");
            assert_eq!(
                decision.blocked,
                matches!(outcome, Outcome::Blocked | Outcome::BlockStarted)
            );
        }
        for bad in [
            &[][..],
            &[7, 1, 1, 1, 1, 1, 0],
            &[1, 5, 5],
            &[0, -3, 5, 1, 1, 1, 0],
            &[-2],
        ] {
            assert!(Reply::read(ints(bad)).is_err(), "{bad:?}");
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
