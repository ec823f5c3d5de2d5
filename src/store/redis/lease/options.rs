//! The options of the Redis store's leases: when a caller is hot, how
//! much a lease asks for, and when it ends.

use std::num::NonZeroU32;
use std::time::Duration;

/// How the Redis store leases hot callers' budgets; off unless given to
/// [`RedisStoreBuilder::leases`](crate::store::RedisStoreBuilder::leases).
///
/// Leases apply to fixed window, aligned window (one quota each) and GCRA
/// policies; other policies decide in Redis every time.
///
/// A caller is *hot* on this server once it was decided `hot_after` times
/// within the last one to two spans: with the defaults, any caller asking
/// this server a few times a second, so a crowd's busy part leases, not
/// just its busiest caller. A lease asks for as many units as the caller
/// used here in its busier recent span (at least 1, at most `max_units`):
/// sized to its rate, to last about a span, and to the share of a span left
/// before its window ends; Redis grants at most half of what the caller
/// has left in the window after the request that asked. A lease ends when its window ends (GCRA: when it has decayed),
/// when `lifetime` has passed since it was granted, or when the caller
/// has been quiet for `quiet_after`; what is unspent then is given back.
///
/// ```
/// use std::{num::NonZeroU32, time::Duration};
/// use tollgate::Leases;
///
/// let leases = Leases::new()
///     .hot_after(NonZeroU32::new(8).unwrap())
///     .span(Duration::from_millis(100))
///     .max_units(NonZeroU32::new(1_000).unwrap());
/// # let _ = leases;
/// ```
#[derive(Debug, Clone)]
pub struct Leases {
    pub(super) hot_after: u64,
    pub(super) span: u64,
    pub(super) max_units: u64,
    pub(super) lifetime: u64,
    pub(super) quiet_after: u64,
}

impl Default for Leases {
    /// Hot after 4 decisions, a span of 1 s, at most 1,000 units a lease,
    /// a lifetime of 2 s, given back after 1 s of quiet.
    ///
    /// A lease costs two calls at most (the one that takes it, the one that
    /// gives back what is left), and a decision in Redis one batched
    /// call's share: a lease pays from a few units, when it lasts long
    /// enough to be spent (the span) and is not given back at the first
    /// pause of a caller that asks a few times a second (the quiet time).
    fn default() -> Self {
        Self {
            hot_after: 4,
            span: 1_000_000,
            max_units: 1_000,
            lifetime: 2_000_000,
            quiet_after: 1_000_000,
        }
    }
}

/// `d` in µs, at least 1.
fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX).max(1)
}

impl Leases {
    /// The defaults (see [`Leases::default`]).
    pub fn new() -> Self {
        Self::default()
    }

    /// How many decisions of one caller on this server, within the last
    /// one to two spans, make it hot.
    pub fn hot_after(mut self, decisions: NonZeroU32) -> Self {
        self.hot_after = u64::from(decisions.get());
        self
    }

    /// How long a lease should last at the caller's recent rate on this
    /// server; also the period over which that rate is counted.
    pub fn span(mut self, span: Duration) -> Self {
        self.span = micros(span);
        self
    }

    /// The most units one lease may ask for.
    pub fn max_units(mut self, units: NonZeroU32) -> Self {
        self.max_units = u64::from(units.get());
        self
    }

    /// The longest a lease is kept, however much is left of its window.
    pub fn lifetime(mut self, lifetime: Duration) -> Self {
        self.lifetime = micros(lifetime);
        self
    }

    /// How long a lease may go unused before it is given back.
    pub fn quiet_after(mut self, quiet: Duration) -> Self {
        self.quiet_after = micros(quiet);
        self
    }
}
