//! The penalty box: a caller rejected `strikes` times within a span is
//! refused for a block time, optionally doubling for each repeat up to a
//! cap. [`PenaltyBox`] is the policy's option; [`Record`] is one caller's
//! entry and the model `lua/caller.lua` mirrors line for line.

use std::num::NonZeroU32;
use std::time::Duration;

use crate::error::ConfigError;

/// A policy option: after `strikes` rejections within `within`, the caller
/// is refused for `block`, on every app server (the block lives in the
/// store). Each block after the first doubles, up to
/// [`doubling_up_to`](Self::doubling_up_to)'s cap; a caller quiet for the
/// cap after a block ends starts again at `block`.
///
/// Rejections are counted where they are decided, in the store, so a
/// policy with a penalty box keeps no local copy of an ordinary rejection;
/// the local cache repeats only blocks, which last until they end whatever
/// the strategy.
///
/// ```
/// use std::num::NonZeroU32;
/// use std::time::Duration;
/// use tollgate::{PenaltyBox, Policy, Quota};
///
/// let three = NonZeroU32::new(3).unwrap();
/// let penalty = PenaltyBox::new(three, Duration::from_secs(10), Duration::from_secs(30))
///     .unwrap()
///     .doubling_up_to(Duration::from_secs(3600))
///     .unwrap();
/// let policy = Policy::fixed_window("login", Quota::per_minute(three)).with_penalty_box(penalty);
/// assert_eq!(policy.penalty_box(), Some(&penalty));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PenaltyBox {
    strikes: NonZeroU32,
    within_micros: u64,
    block_micros: u64,
    cap_micros: u64,
}

/// The longest span, block or cap: a year, in µs.
const MAX_MICROS: u64 = 366 * 24 * 3600 * 1_000_000;

fn micros(what: &'static str, d: Duration) -> Result<u64, ConfigError> {
    let us = u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
    if !(1_000..=MAX_MICROS).contains(&us) {
        return Err(ConfigError::PenaltyBox {
            why: format!("{what} must be between 1 ms and a year, got {d:?}"),
        });
    }
    Ok(us)
}

impl PenaltyBox {
    /// Blocks for `block` after `strikes` rejections within `within`; each
    /// of the two spans between 1 ms and a year.
    ///
    /// ```
    /// use std::num::NonZeroU32;
    /// use std::time::Duration;
    /// use tollgate::PenaltyBox;
    /// let one = NonZeroU32::MIN;
    /// assert!(PenaltyBox::new(one, Duration::from_secs(1), Duration::from_secs(60)).is_ok());
    /// assert!(PenaltyBox::new(one, Duration::ZERO, Duration::from_secs(60)).is_err());
    /// ```
    pub fn new(
        strikes: NonZeroU32,
        within: Duration,
        block: Duration,
    ) -> Result<Self, ConfigError> {
        let block_micros = micros("the block", block)?;
        Ok(Self {
            strikes,
            within_micros: micros("the span strikes are counted in", within)?,
            block_micros,
            cap_micros: block_micros,
        })
    }

    /// Doubles each block after the first, up to `cap` (at least the
    /// first block, at most a year).
    ///
    /// ```
    /// use std::num::NonZeroU32;
    /// use std::time::Duration;
    /// use tollgate::PenaltyBox;
    /// let b = PenaltyBox::new(NonZeroU32::MIN, Duration::from_secs(1), Duration::from_secs(60)).unwrap();
    /// assert!(b.doubling_up_to(Duration::from_secs(30)).is_err());
    /// assert!(b.doubling_up_to(Duration::from_secs(600)).is_ok());
    /// ```
    pub fn doubling_up_to(self, cap: Duration) -> Result<Self, ConfigError> {
        let cap_micros = micros("the longest block", cap)?;
        if cap_micros < self.block_micros {
            return Err(ConfigError::PenaltyBox {
                why: format!("the longest block ({cap:?}) is shorter than the first"),
            });
        }
        Ok(Self { cap_micros, ..self })
    }

    /// The rejections within the span that start a block.
    pub fn strikes(&self) -> NonZeroU32 {
        self.strikes
    }

    /// The first block.
    pub fn block(&self) -> Duration {
        Duration::from_micros(self.block_micros)
    }

    /// The span rejections are counted in.
    ///
    /// ```
    /// use std::{num::NonZeroU32, time::Duration};
    /// use tollgate::PenaltyBox;
    /// let b = PenaltyBox::new(NonZeroU32::MIN, Duration::from_secs(10), Duration::from_secs(60)).unwrap();
    /// assert_eq!(b.within(), Duration::from_secs(10));
    /// ```
    pub fn within(&self) -> Duration {
        Duration::from_micros(self.within_micros)
    }

    /// The longest block: the first, unless blocks double
    /// ([`doubling_up_to`](Self::doubling_up_to)).
    ///
    /// ```
    /// use std::{num::NonZeroU32, time::Duration};
    /// use tollgate::PenaltyBox;
    /// let b = PenaltyBox::new(NonZeroU32::MIN, Duration::from_secs(10), Duration::from_secs(60)).unwrap();
    /// assert_eq!(b.cap(), Duration::from_secs(60));
    /// assert_eq!(b.doubling_up_to(Duration::from_secs(600)).unwrap().cap(), Duration::from_secs(600));
    /// ```
    pub fn cap(&self) -> Duration {
        Duration::from_micros(self.cap_micros)
    }

    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    /// The script's arguments: strikes, span, block and cap (µs).
    pub(crate) fn args(&self) -> [u64; 4] {
        [
            u64::from(self.strikes.get()),
            self.within_micros,
            self.block_micros,
            self.cap_micros,
        ]
    }

    /// `record` after a rejection at `now`: the strike counted, and a block
    /// started if it was the last one allowed.
    pub(crate) fn strike(&self, mut record: Record, now: u64) -> Record {
        if record.strikes_end > now {
            record.strikes += 1;
        } else {
            record.strikes = 1;
            record.strikes_end = now + self.within_micros;
        }
        if record.strikes >= u64::from(self.strikes.get()) {
            let doubled = (self.block_micros as f64) * 2f64.powf(record.blocks as f64);
            record.blocked_until = now + (doubled.min(self.cap_micros as f64) as u64);
            record.blocks += 1;
            record.strikes = 0;
        }
        record
    }

    /// Until when `record` must be kept (µs): while its strikes count, and
    /// for a cap after its block ends, when a repeat still doubles.
    pub(crate) fn keep_until(&self, record: &Record) -> u64 {
        record
            .strikes_end
            .max(record.blocked_until.saturating_add(self.cap_micros))
    }
}

/// One caller's entry in the penalty box (µs since the epoch).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Record {
    /// Refused until then.
    pub blocked_until: u64,
    /// Rejections counted since `strikes_end - span`.
    pub strikes: u64,
    pub strikes_end: u64,
    /// Blocks so far: the next lasts `block × 2^blocks`, up to the cap.
    pub blocks: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_double_up_to_the_cap_and_strikes_age_out() {
        let s = Duration::from_secs(1);
        let b = PenaltyBox::new(NonZeroU32::new(2).unwrap(), 10 * s, 30 * s)
            .unwrap()
            .doubling_up_to(100 * s)
            .unwrap();
        let sec = 1_000_000;
        let r = b.strike(Record::default(), 0);
        assert_eq!(r.blocked_until, 0, "one strike of two");
        let r = b.strike(r, 11 * sec);
        assert_eq!((r.strikes, r.blocked_until), (1, 0), "the first aged out");
        let r = b.strike(r, 12 * sec);
        assert_eq!(r.blocked_until, 42 * sec);
        let r = b.strike(b.strike(r, 50 * sec), 50 * sec);
        assert_eq!(r.blocked_until, 110 * sec, "doubled");
        let r = b.strike(b.strike(r, 120 * sec), 120 * sec);
        assert_eq!(r.blocked_until, 220 * sec, "capped");
        assert_eq!(b.keep_until(&r), 320 * sec);
    }
}
