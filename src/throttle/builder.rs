//! [`ThrottleBuilder`]: a [`Throttle`]'s options, checked once by `build`.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::Arc;
use std::time::Duration;

use super::ring::{Ring, Shape};
use super::sync::RedisSync;
use super::{Inner, Throttle, MAX_MEMORY};
use crate::clock::{Clock, SystemClock};
use crate::error::ConfigError;
#[cfg(feature = "redis")]
use crate::store::RedisStore;

/// Configures a [`Throttle`]; only the threshold is required.
///
/// | option | default |
/// |---|---|
/// | [`capacity`](Self::capacity) | twice the threshold |
/// | [`false_positive_rate`](Self::false_positive_rate) | 0.01 at capacity |
/// | [`slots`](Self::slots) × [`slot_length`](Self::slot_length) | 30 × 1 minute |
/// | [`sync_every`](Self::sync_every) | 1 second |
/// | [`retry_after`](Self::retry_after) | one slot |
/// | [`redis`](Self::redis) | none: each server on its own |
/// | [`clock`](Self::clock) | [`SystemClock`] |
/// | [`seed`](Self::seed) | derived from the name |
///
/// ```
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// use tollgate::RedisStore;
/// use tollgate::throttle::Throttle;
/// let store = RedisStore::connect("redis://127.0.0.1:6379/").await?;
/// let throttle = Throttle::builder("sessions").threshold(50_000).redis(&store).build()?;
/// # Ok(()) }
/// ```
#[must_use]
pub struct ThrottleBuilder {
    name: Arc<str>,
    threshold: Option<u64>,
    capacity: Option<usize>,
    false_positive_rate: f64,
    slots: usize,
    slot_length: Duration,
    sync_every: Duration,
    retry_after: Option<Duration>,
    #[cfg(feature = "redis")]
    redis: Option<RedisStore>,
    clock: Arc<dyn Clock>,
    seed: Option<u128>,
}

impl fmt::Debug for ThrottleBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ThrottleBuilder")
            .field("name", &self.name)
            .field("threshold", &self.threshold)
            .field("capacity", &self.capacity)
            .finish_non_exhaustive()
    }
}

impl ThrottleBuilder {
    pub(super) fn new(name: Arc<str>) -> Self {
        Self {
            name,
            threshold: None,
            capacity: None,
            false_positive_rate: 0.01,
            slots: 30,
            slot_length: Duration::from_secs(60),
            sync_every: Duration::from_secs(1),
            retry_after: None,
            #[cfg(feature = "redis")]
            redis: None,
            clock: Arc::new(SystemClock),
            seed: None,
        }
    }

    /// Throttling starts when more than this many callers are active (required).
    pub fn threshold(mut self, callers: u64) -> Self {
        self.threshold = Some(callers);
        self
    }

    /// How many distinct callers in the window the filters are sized for;
    /// at least the threshold. Past it, false positives grow and the
    /// estimate saturates (and reads as throttling).
    pub fn capacity(mut self, callers: usize) -> Self {
        self.capacity = Some(callers);
        self
    }

    /// One filter's false-positive rate at capacity, in `(0, 1)`.
    pub fn false_positive_rate(mut self, rate: f64) -> Self {
        self.false_positive_rate = rate;
        self
    }

    /// How many slots the window has (1 to 1440).
    pub fn slots(mut self, slots: usize) -> Self {
        self.slots = slots;
        self
    }

    /// How long one slot lasts (at least 1 ms). The window is
    /// `slots × slot_length`.
    pub fn slot_length(mut self, length: Duration) -> Self {
        self.slot_length = length;
        self
    }

    /// How often the background task runs a round.
    pub fn sync_every(mut self, every: Duration) -> Self {
        self.sync_every = every;
        self
    }

    /// The `Retry-After` of refused callers (rounded up to whole seconds).
    pub fn retry_after(mut self, after: Duration) -> Self {
        self.retry_after = Some(after);
        self
    }

    /// Shares callers with every app server using the same Redis, prefix and
    /// throttle name, over `store`'s connection. Needs the `redis` feature.
    #[cfg(feature = "redis")]
    #[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
    pub fn redis(mut self, store: &RedisStore) -> Self {
        self.redis = Some(store.clone());
        self
    }

    /// Where slot boundaries come from. App servers should agree on time
    /// within a small part of a slot; a [`ManualClock`](crate::clock::ManualClock)
    /// lets tests move through slots without waiting.
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Arc::new(clock);
        self
    }

    /// The key hash's seed; must be the same on every app server.
    pub fn seed(mut self, seed: u128) -> Self {
        self.seed = Some(seed);
        self
    }

    /// The throttle, or why this configuration cannot work.
    pub fn build(self) -> Result<Throttle, ConfigError> {
        let name_ok = !self.name.is_empty()
            && self.name.len() <= 64
            && self
                .name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_./".contains(&b));
        if !name_ok {
            return Err(ConfigError::ThrottleName {
                name: self.name.to_string(),
            });
        }
        let threshold = self.threshold.ok_or(ConfigError::NoThreshold)?;
        let capacity = self
            .capacity
            .unwrap_or_else(|| usize::try_from(threshold.saturating_mul(2)).unwrap_or(usize::MAX))
            .max(1);
        if (capacity as u64) < threshold {
            return Err(ConfigError::CapacityBelowThreshold {
                capacity,
                threshold,
            });
        }
        let p = self.false_positive_rate;
        if !(p > 0.0 && p < 1.0) {
            return Err(ConfigError::FalsePositiveRate { rate: p });
        }
        if !(1..=1440).contains(&self.slots) {
            return Err(ConfigError::ThrottleSlots { slots: self.slots });
        }
        if self.slot_length < Duration::from_millis(1) || self.sync_every.is_zero() {
            return Err(ConfigError::ThrottleTiming {
                slot_length: self.slot_length,
                sync_every: self.sync_every,
            });
        }
        let seed = self.seed.unwrap_or_else(|| default_seed(&self.name));
        let shape = Shape::for_capacity(capacity, p, seed);
        let memory = shape.bits / 8 * (self.slots + 2);
        if memory > MAX_MEMORY {
            return Err(ConfigError::ThrottleMemory { bytes: memory });
        }
        let slot_micros = self.slot_length.as_micros() as u64;
        let slot_no = self.clock.now_micros() / slot_micros;
        #[cfg(not(feature = "redis"))]
        let redis: Option<RedisSync> = None;
        #[cfg(feature = "redis")]
        let redis = self.redis.map(|store| {
            let ttl_ms = (self.slot_length * (self.slots as u32 + 1)).as_millis() as u64;
            RedisSync::new(
                store.connection().clone(),
                store.scripting().clone(),
                store.keyspace().throttle_tag(&self.name),
                ttl_ms,
            )
        });
        Ok(Throttle {
            inner: Arc::new(Inner {
                name: self.name,
                ring: Ring::new(shape, self.slots, slot_no),
                clock: self.clock,
                slot_micros,
                threshold,
                capacity,
                retry_after: self.retry_after.unwrap_or(self.slot_length),
                sync_every: self.sync_every,
                throttling: AtomicBool::new(false),
                estimate: AtomicU64::new(0),
                round: tokio::sync::Mutex::new(redis),
                rounds: AtomicU64::new(0),
                redis_calls: AtomicU64::new(0),
                conflicts: AtomicU64::new(0),
                errors: AtomicU64::new(0),
                refused: AtomicU64::new(0),
                policies: Default::default(),
            }),
        })
    }
}

/// FNV-1a of the name, widened: the same on every server, different per name.
fn default_seed(name: &str) -> u128 {
    let mut h: u128 = 0x6c62_272e_07bb_0142_62b8_2175_6295_c58d;
    for b in name.bytes() {
        h ^= u128::from(b);
        h = h.wrapping_mul(0x0000_0000_0100_0000_0000_0000_0000_013B);
    }
    h
}
