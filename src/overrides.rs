//! A caller's own quotas, set by an operator at runtime: an [`Override`].
//!
//! An override is configuration, not state: it lives in the store beside
//! the caller's counters (on Redis, in the same hash slot, read by the same
//! script call) and, unless it is given an end, without an expiry.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::quota::Quota;

/// One caller's own quotas under a policy, replacing the policy's (and a
/// tier's, and a quota that came with the request), optionally until a
/// time.
///
/// Give as many quotas as the policy has, in its order. On GCRA and the
/// leaky bucket an override's quota also sets the burst (capacity): `limit`
/// units per `window`, up to `limit` at once.
///
/// ```
/// use std::num::NonZeroU32;
/// use std::time::{Duration, SystemTime};
/// use tollgate::{Override, Quota};
///
/// let launch = Override::new(Quota::per_hour(NonZeroU32::new(5_000).unwrap()))
///     .until(SystemTime::now() + Duration::from_secs(3 * 24 * 3600));
/// assert_eq!(launch.quotas()[0].limit(), 5_000);
/// assert!(launch.until_micros().is_some());
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Override {
    quotas: Arc<[Quota]>,
    until_micros: Option<u64>,
    note: Option<Arc<str>>,
}

impl Override {
    /// An override of a one-quota policy's quota, with no end.
    ///
    /// ```
    /// use std::num::NonZeroU32;
    /// use tollgate::{Override, Quota};
    /// let cut = Override::new(Quota::per_hour(NonZeroU32::new(10).unwrap()));
    /// assert_eq!(cut.until_micros(), None);
    /// ```
    pub fn new(quota: Quota) -> Self {
        Self {
            quotas: Arc::from([quota]),
            until_micros: None,
            note: None,
        }
    }

    /// Adds the next quota, for a policy with several.
    ///
    /// ```
    /// use std::num::NonZeroU32;
    /// use tollgate::{Override, Quota};
    /// let both = Override::new(Quota::per_second(NonZeroU32::new(20).unwrap()))
    ///     .and(Quota::per_hour(NonZeroU32::new(10_000).unwrap()));
    /// assert_eq!(both.quotas().len(), 2);
    /// ```
    pub fn and(mut self, quota: Quota) -> Self {
        let mut quotas = self.quotas.to_vec();
        quotas.push(quota);
        self.quotas = quotas.into();
        self
    }

    /// Ends the override at `at`: from then on the caller is judged by the
    /// policy's quotas again. A time before the epoch ends it at once.
    ///
    /// ```
    /// use std::num::NonZeroU32;
    /// use std::time::{Duration, UNIX_EPOCH};
    /// use tollgate::{Override, Quota};
    /// let o = Override::new(Quota::per_hour(NonZeroU32::new(10).unwrap()))
    ///     .until(UNIX_EPOCH + Duration::from_secs(2));
    /// assert_eq!(o.until_micros(), Some(2_000_000));
    /// ```
    pub fn until(self, at: SystemTime) -> Self {
        let micros = at.duration_since(UNIX_EPOCH).unwrap_or(Duration::ZERO);
        self.ending_at_micros(u64::try_from(micros.as_micros()).unwrap_or(u64::MAX))
    }

    /// [`until`](Self::until) in µs since the epoch, the stores' clock
    /// (a [`ManualClock`](crate::clock::ManualClock)'s, in tests).
    ///
    /// ```
    /// use std::num::NonZeroU32;
    /// use tollgate::{Override, Quota};
    /// let o = Override::new(Quota::per_hour(NonZeroU32::new(10).unwrap())).ending_at_micros(5);
    /// assert_eq!(o.until_micros(), Some(5));
    /// ```
    pub fn ending_at_micros(self, at: u64) -> Self {
        Self {
            until_micros: Some(at.max(1)),
            ..self
        }
    }

    /// The most characters a note keeps.
    pub const MAX_NOTE_CHARS: usize = 256;

    /// Keeps `note` with the override: who set it, why, a ticket. It is
    /// shown wherever the override is (the admin API's lists and `GET`)
    /// and changes nothing else: not the caller's key, its hash slot or
    /// its quotas. At most [`MAX_NOTE_CHARS`](Self::MAX_NOTE_CHARS)
    /// characters, none of them control characters; setting a longer one
    /// is refused.
    ///
    /// ```
    /// use std::num::NonZeroU32;
    /// use tollgate::{Override, Quota};
    /// let o = Override::new(Quota::per_hour(NonZeroU32::new(5_000).unwrap())).with_note("launch week, OPS-42");
    /// assert_eq!(o.note(), Some("launch week, OPS-42"));
    /// ```
    pub fn with_note(self, note: impl AsRef<str>) -> Self {
        Self {
            note: Some(Arc::from(note.as_ref())),
            ..self
        }
    }

    /// The note kept with the override, if any.
    pub fn note(&self) -> Option<&str> {
        self.note.as_deref()
    }

    /// Why the note cannot be kept, if it cannot.
    pub(crate) fn note_problem(&self) -> Option<String> {
        let note = self.note.as_deref()?;
        let chars = note.chars().count();
        if chars > Self::MAX_NOTE_CHARS {
            return Some(format!(
                "the note has {chars} characters, at most {} are kept",
                Self::MAX_NOTE_CHARS
            ));
        }
        note.chars()
            .any(char::is_control)
            .then(|| "the note has a control character (a line break, a tab, ...)".to_owned())
    }

    /// The quotas, in the policy's order.
    pub fn quotas(&self) -> &[Quota] {
        &self.quotas
    }

    /// The quotas, shared.
    pub(crate) fn shared_quotas(&self) -> &Arc<[Quota]> {
        &self.quotas
    }

    /// When the override ends, µs since the epoch; `None` for never.
    pub fn until_micros(&self) -> Option<u64> {
        self.until_micros
    }

    /// Whether any of its quotas' limits is above `cap`'s (a limit per
    /// quota, see [`PolicyLimits`](crate::PolicyLimits)).
    pub(crate) fn exceeds(&self, cap: &[u32]) -> bool {
        self.quotas
            .iter()
            .zip(cap)
            .any(|(q, &most)| q.limit() > most)
    }

    /// Whether the override is in force at `now` (µs).
    pub(crate) fn in_force(&self, now: u64) -> bool {
        self.until_micros.is_none_or(|until| until > now)
    }

    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    /// The override as stored text: its end (0 for none), then each
    /// quota's limit and window (µs), space-separated.
    pub(crate) fn to_text(&self) -> String {
        let mut text = self.until_micros.unwrap_or(0).to_string();
        for q in self.quotas.iter() {
            text.push_str(&format!(" {} {}", q.limit(), q.window_micros()));
        }
        text
    }

    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    /// Reads [`to_text`](Self::to_text) back; `None` when it is not one.
    pub(crate) fn from_text(text: &str) -> Option<Self> {
        let mut numbers = text.split_ascii_whitespace().map(str::parse::<u64>);
        let until = numbers.next()?.ok()?;
        let mut quotas = Vec::new();
        while let Some(limit) = numbers.next() {
            let window = numbers.next()?.ok()?;
            let limit = u32::try_from(limit.ok()?).ok()?;
            quotas.push(Quota::new(limit, Duration::from_micros(window)).ok()?);
        }
        if quotas.is_empty() {
            return None;
        }
        Some(Self {
            quotas: quotas.into(),
            until_micros: (until > 0).then_some(until),
            note: None,
        })
    }

    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    /// [`to_text`](Self::to_text), then the note after a line break: what
    /// a caller's override is stored as (the scripts read up to the break).
    pub(crate) fn to_stored(&self) -> String {
        let mut text = self.to_text();
        if let Some(note) = &self.note {
            text.push('\n');
            text.push_str(note);
        }
        text
    }

    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    /// Reads [`to_stored`](Self::to_stored) back.
    pub(crate) fn from_stored(text: &str) -> Option<Self> {
        match text.split_once('\n') {
            Some((numbers, note)) => Some(Self::from_text(numbers)?.with_note(note)),
            None => Self::from_text(text),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::num::NonZeroU32;

    #[test]
    fn text_round_trips_and_rejects_garbage() {
        let o = Override::new(Quota::per_minute(NonZeroU32::new(7).unwrap()))
            .and(Quota::per_hour(NonZeroU32::new(70).unwrap()))
            .ending_at_micros(123);
        assert_eq!(Override::from_text(&o.to_text()), Some(o));
        let forever = Override::new(Quota::per_second(NonZeroU32::MIN));
        assert_eq!(Override::from_text(&forever.to_text()), Some(forever));
        for bad in ["", "0", "x 1 2", "0 1", "0 0 1000000", "0 1 -5"] {
            assert_eq!(Override::from_text(bad), None, "{bad:?}");
        }
    }
}
