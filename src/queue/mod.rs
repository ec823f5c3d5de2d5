//! The leaky bucket as a work queue: admit requests into a bounded queue,
//! answer at once, and let workers drain it at the rate they choose.
//!
//! Where [`Strategy::LeakyBucket`] makes each
//! request *wait* for its turn, a work queue takes the request's details and
//! lets it go: [`QueueLayer`] appends them to a bounded queue (one atomic
//! script checks the length and appends) and calls your handler, which
//! usually answers `202 Accepted`; a full queue gets `429` with
//! `Retry-After`. Workers take the entries out:
//!
//! | queue | push (one `EVALSHA`) | take out | for |
//! |---|---|---|---|
//! | [`StreamQueue`] | `XLEN`, `XADD`, `PEXPIRE` | [`StreamProcessor`]: consumer group (`XREADGROUP`, `XACK` + `XDEL`, `XAUTOCLAIM` of a crashed worker's entries) | work that must not be lost |
//! | [`ListQueue`] | `LLEN`, `LPUSH`, `PEXPIRE` | [`ListQueue::pop`] (`RPOP`), [`ListQueue::pop_blocking`] (`BRPOP`) | just the gate: an entry taken by a worker that crashes is gone |
//! | [`MemoryQueue`] | a `VecDeque` under a lock | [`MemoryQueue::pop`] | one process, tests, the zoo without Redis |
//!
//! All three admit alike (proven by `tests/queue.rs`): the queue holds at
//! most `capacity` entries, waiting or being worked on (a stream entry counts
//! until its worker finishes it). The queue key expires `ttl` after the last
//! push (default a day), so an abandoned queue does not stay in Redis forever;
//! consumer groups live inside the stream key and expire with it.
//!
//! **One queue per name, shared by all callers.** The key extractor names the
//! caller in each entry (field `key`), it does not split the queue: put a
//! per-caller [`RateLimitLayer`](crate::RateLimitLayer) in front so one
//! caller cannot fill it for everyone.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! use std::num::NonZeroU32;
//! use tollgate::queue::{Job, MemoryQueue, QueueSpec, WorkQueue};
//!
//! let queue = MemoryQueue::new(QueueSpec::new("feeding", NonZeroU32::new(2).unwrap()).unwrap());
//! assert!(queue.push(&Job::new().field("zone", "big cats")).await.unwrap().accepted());
//! assert!(queue.push(&Job::new().field("zone", "reptiles")).await.unwrap().accepted());
//! assert!(!queue.push(&Job::new()).await.unwrap().accepted(), "full");
//! let taken = queue.pop(1);
//! assert_eq!(taken[0].job.get_str("zone"), Some("big cats"));
//! # }
//! ```

mod job;
mod layer;
#[cfg(feature = "redis")]
mod list;
mod memory;
#[cfg(feature = "redis")]
mod processor;
#[cfg(feature = "redis")]
mod stream;

pub use job::{Entry, Job};
pub use layer::{Enqueued, QueueLayer, QueueLayerBuilder, QueueService, DEFAULT_MAX_BODY};
#[cfg(feature = "redis")]
pub use list::ListQueue;
pub use memory::MemoryQueue;
#[cfg(feature = "redis")]
pub use processor::{StreamProcessor, StreamProcessorBuilder};
#[cfg(feature = "redis")]
pub use stream::StreamQueue;

use std::fmt;
use std::num::NonZeroU32;
use std::time::Duration;

use crate::error::{ConfigError, StoreError};
use crate::policy::Policy;
use crate::policy::Strategy;
use crate::quota::Quota;
use crate::store::{BoxFuture, KeySpace};

/// How long a queue key lives after the last push, unless set otherwise.
pub const DEFAULT_QUEUE_TTL: Duration = Duration::from_secs(24 * 3600);

/// A bounded queue that admits work. Dyn-compatible, like [`Store`](crate::Store).
///
/// `push` must check the length and append atomically: two concurrent pushes
/// into the last free place never both succeed, even from different
/// processes. A full queue is an `Ok` [`Pushed`] that was not accepted;
/// `Err` means the queue could not be reached.
pub trait WorkQueue: Send + Sync + fmt::Debug + 'static {
    /// Appends `job` if the queue has room.
    fn push<'a>(&'a self, job: &'a Job) -> BoxFuture<'a, Result<Pushed, StoreError>>;

    /// The name, capacity and expiry the queue was built with.
    fn spec(&self) -> &QueueSpec;
}

impl<Q: WorkQueue + ?Sized> WorkQueue for std::sync::Arc<Q> {
    fn push<'a>(&'a self, job: &'a Job) -> BoxFuture<'a, Result<Pushed, StoreError>> {
        (**self).push(job)
    }

    fn spec(&self) -> &QueueSpec {
        (**self).spec()
    }
}

/// What a [`WorkQueue::push`] answered.
///
/// ```
/// use tollgate::queue::Pushed;
/// let p = Pushed::new(Some("1700000000000-0".into()), 3, 10, 0);
/// assert!(p.accepted());
/// assert_eq!(p.remaining(), 7);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Pushed {
    /// The new entry's id (a stream entry id, or a generated one); `None`
    /// when the queue was full.
    pub id: Option<String>,
    /// Entries in the queue after the push (waiting or being worked on).
    pub len: u64,
    /// The most it holds.
    pub capacity: u64,
    /// The queue's time when it decided, µs since the epoch.
    pub now_micros: u64,
}

impl Pushed {
    /// An answer: `id` when accepted, and the length after the push.
    ///
    /// ```
    /// use tollgate::queue::Pushed;
    /// let full = Pushed::new(None, 10, 10, 1_000_000);
    /// assert!(!full.accepted());
    /// assert_eq!(full.remaining(), 0);
    /// ```
    pub fn new(id: Option<String>, len: u64, capacity: u64, now_micros: u64) -> Self {
        Self {
            id,
            len,
            capacity,
            now_micros,
        }
    }

    /// Whether the job was appended.
    pub fn accepted(&self) -> bool {
        self.id.is_some()
    }

    /// Free places after the push.
    pub fn remaining(&self) -> u64 {
        self.capacity.saturating_sub(self.len)
    }
}

/// A queue's name, capacity, key prefix and expiry: give the same spec to the
/// queue and to its [`StreamProcessor`] and they find the same Redis key.
///
/// ```
/// use std::{num::NonZeroU32, time::Duration};
/// use tollgate::queue::QueueSpec;
///
/// let spec = QueueSpec::new("feeding", NonZeroU32::new(100).unwrap())
///     .unwrap()
///     .prefix("zoo")
///     .unwrap()
///     .ttl(Duration::from_secs(3600))
///     .unwrap();
/// assert_eq!(spec.stream_key(), "zoo:{feeding}:queue:stream");
/// assert!(QueueSpec::new("bad name", NonZeroU32::new(1).unwrap()).is_err());
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueSpec {
    name: String,
    capacity: NonZeroU32,
    prefix: String,
    ttl: Duration,
}

impl QueueSpec {
    /// A queue called `name` (1-64 of `[A-Za-z0-9-_./]`) holding at most
    /// `capacity` entries, under prefix `tollgate`, expiring a day after the
    /// last push.
    ///
    /// ```
    /// use std::num::NonZeroU32;
    /// use tollgate::queue::{QueueSpec, DEFAULT_QUEUE_TTL};
    ///
    /// let spec = QueueSpec::new("feeding", NonZeroU32::new(100).unwrap()).unwrap();
    /// assert_eq!((spec.name(), spec.capacity()), ("feeding", 100));
    /// assert_eq!(spec.expiry(), DEFAULT_QUEUE_TTL);
    /// assert_eq!(spec.list_key(), "tollgate:{feeding}:queue:list");
    /// ```
    pub fn new(name: impl Into<String>, capacity: NonZeroU32) -> Result<Self, ConfigError> {
        let name = name.into();
        // The same rules as policy names, so it can name headers too.
        let probe = Quota::per_second(capacity);
        Policy::new(name.as_str(), Strategy::FixedWindow, probe).validate()?;
        Ok(Self {
            name,
            capacity,
            prefix: "tollgate".into(),
            ttl: DEFAULT_QUEUE_TTL,
        })
    }

    /// Puts the queue's key under `prefix` (no braces or `|`).
    pub fn prefix(mut self, prefix: impl Into<String>) -> Result<Self, ConfigError> {
        let prefix = prefix.into();
        KeySpace::new(prefix.as_str())?;
        self.prefix = prefix;
        Ok(self)
    }

    /// How long the queue key lives after the last push (1 s to a year).
    pub fn ttl(mut self, ttl: Duration) -> Result<Self, ConfigError> {
        if ttl < Duration::from_secs(1) || ttl > Duration::from_secs(366 * 24 * 3600) {
            return Err(ConfigError::QueueTtl { ttl });
        }
        self.ttl = ttl;
        Ok(self)
    }

    /// The queue's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The most entries it holds.
    pub fn capacity(&self) -> u64 {
        u64::from(self.capacity.get())
    }

    /// How long the key lives after the last push.
    pub fn expiry(&self) -> Duration {
        self.ttl
    }

    /// The Redis key of the [`StreamQueue`]: `{prefix}:{{name}}:queue:stream`.
    pub fn stream_key(&self) -> String {
        format!("{}:{{{}}}:queue:stream", self.prefix, self.name)
    }

    /// The Redis key of the [`ListQueue`]: `{prefix}:{{name}}:queue:list`.
    pub fn list_key(&self) -> String {
        format!("{}:{{{}}}:queue:list", self.prefix, self.name)
    }

    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn ttl_millis(&self) -> u64 {
        self.ttl.as_millis() as u64
    }
}
