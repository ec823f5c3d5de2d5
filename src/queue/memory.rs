//! [`MemoryQueue`]: the work queue inside one process.

use std::collections::VecDeque;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};

use super::{Entry, Job, Pushed, QueueSpec, WorkQueue};
use crate::clock::{Clock, SystemClock};
use crate::error::StoreError;
use crate::store::BoxFuture;

/// A bounded queue in this process, admitting exactly like the Redis ones:
/// at most `capacity` entries, and everything dropped once `ttl` passes
/// without a push (as the Redis key would expire). Ids are `{ms}-{seq}`,
/// like stream ids. Cloning shares the queue.
///
/// Work taken out with [`pop`](Self::pop) is the caller's; nothing is
/// reclaimed. For one process, tests, and the zoo without Redis.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// use std::num::NonZeroU32;
/// use tollgate::queue::{Job, MemoryQueue, QueueSpec, WorkQueue};
///
/// let queue = MemoryQueue::new(QueueSpec::new("q", NonZeroU32::new(1).unwrap()).unwrap());
/// let first = queue.push(&Job::new()).await.unwrap();
/// assert_eq!(first.len, 1);
/// assert!(!queue.push(&Job::new()).await.unwrap().accepted());
/// assert_eq!(queue.pop(5)[0].id, first.id.unwrap());
/// assert!(queue.push(&Job::new()).await.unwrap().accepted());
/// # }
/// ```
#[derive(Clone)]
pub struct MemoryQueue {
    inner: Arc<Inner>,
}

struct Inner {
    spec: QueueSpec,
    clock: Arc<dyn Clock>,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    entries: VecDeque<Entry>,
    expires_at: u64,
    last_ms: u64,
    seq: u64,
}

impl fmt::Debug for MemoryQueue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryQueue")
            .field("name", &self.inner.spec.name())
            .field("capacity", &self.inner.spec.capacity())
            .finish_non_exhaustive()
    }
}

impl MemoryQueue {
    /// The queue `spec` describes, on the system clock.
    ///
    /// ```
    /// use std::num::NonZeroU32;
    /// use tollgate::queue::{MemoryQueue, QueueSpec, WorkQueue};
    /// let queue = MemoryQueue::new(QueueSpec::new("feeding", NonZeroU32::new(10).unwrap()).unwrap());
    /// assert!(queue.is_empty());
    /// assert_eq!(queue.spec().capacity(), 10);
    /// ```
    pub fn new(spec: QueueSpec) -> Self {
        Self::with_clock(spec, SystemClock)
    }

    /// On `clock`; tests pass a [`ManualClock`](crate::clock::ManualClock).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use std::{num::NonZeroU32, time::Duration};
    /// use tollgate::{clock::ManualClock, queue::{Job, MemoryQueue, QueueSpec, WorkQueue}};
    ///
    /// let clock = ManualClock::new(1_000_000);
    /// let spec = QueueSpec::new("q", NonZeroU32::new(5).unwrap()).unwrap().ttl(Duration::from_secs(60)).unwrap();
    /// let queue = MemoryQueue::with_clock(spec, clock.clone());
    /// queue.push(&Job::new()).await.unwrap();
    /// clock.advance(Duration::from_secs(60)); // a minute without a push: the queue expired
    /// assert!(queue.is_empty());
    /// # }
    /// ```
    pub fn with_clock(spec: QueueSpec, clock: impl Clock) -> Self {
        Self {
            inner: Arc::new(Inner {
                spec,
                clock: Arc::new(clock),
                state: Mutex::default(),
            }),
        }
    }

    /// Takes up to `count` entries, oldest first.
    pub fn pop(&self, count: usize) -> Vec<Entry> {
        let mut state = self.state();
        let n = count.min(state.entries.len());
        state.entries.drain(..n).collect()
    }

    /// Entries in the queue now.
    pub fn len(&self) -> usize {
        self.state().entries.len()
    }

    /// Whether the queue is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The state at the clock's now, emptied if the queue expired.
    fn state(&self) -> MutexGuard<'_, State> {
        let now = self.inner.clock.now_micros();
        let mut state = self
            .inner
            .state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if now >= state.expires_at {
            state.entries.clear();
        }
        state
    }

    fn append(&self, job: &Job) -> Pushed {
        let now = self.inner.clock.now_micros();
        let spec = &self.inner.spec;
        let mut state = self.state();
        let len = state.entries.len() as u64;
        if len >= spec.capacity() {
            return Pushed::new(None, len, spec.capacity(), now);
        }
        let ms = now / 1000;
        if ms > state.last_ms {
            (state.last_ms, state.seq) = (ms, 0);
        } else {
            state.seq += 1;
        }
        let id = format!("{}-{}", state.last_ms, state.seq);
        state.entries.push_back(Entry::new(id.clone(), job.clone()));
        state.expires_at = now + spec.expiry().as_micros() as u64;
        Pushed::new(Some(id), len + 1, spec.capacity(), now)
    }
}

impl WorkQueue for MemoryQueue {
    fn push<'a>(&'a self, job: &'a Job) -> BoxFuture<'a, Result<Pushed, StoreError>> {
        Box::pin(std::future::ready(Ok(self.append(job))))
    }

    fn spec(&self) -> &QueueSpec {
        &self.inner.spec
    }
}
