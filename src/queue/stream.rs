//! [`StreamQueue`]: a bounded Redis Stream that admits work.

use std::fmt;
use std::sync::{Arc, LazyLock};

use redis::aio::{ConnectionLike, ConnectionManager};
use redis::Script;

use super::{Job, Pushed, QueueSpec, WorkQueue};
use crate::clock::Clock;
use crate::error::StoreError;
use crate::store::redis::reply;
use crate::store::BoxFuture;

static ENQUEUE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../lua/stream_enqueue.lua")));

/// A bounded Redis Stream: each push is one `EVALSHA` that checks `XLEN`
/// against the capacity, `XADD`s the job's fields (plus `at`, the push time
/// in µs) and refreshes the key's expiry. Drain it with a
/// [`StreamProcessor`](super::StreamProcessor).
///
/// Works over any redis-rs async connection: a [`ConnectionManager`] (the
/// default type), a `MultiplexedConnection`, or a Redis Cluster connection
/// (one key per queue). Memory: the entries' fields, at most `capacity` of
/// them, plus the consumer group's pending list.
///
/// ```no_run
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// use std::num::NonZeroU32;
/// use tollgate::queue::{Job, QueueSpec, StreamQueue, WorkQueue};
///
/// let conn = redis::Client::open("redis://127.0.0.1:6379/")?.get_connection_manager().await?;
/// let queue = StreamQueue::new(conn, QueueSpec::new("feeding", NonZeroU32::new(100).unwrap())?);
/// let pushed = queue.push(&Job::new().field("zone", "big cats")).await?;
/// println!("queued as {:?}, {} waiting", pushed.id, pushed.len);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct StreamQueue<C = ConnectionManager> {
    conn: C,
    spec: QueueSpec,
    key: String,
    clock: Option<Arc<dyn Clock>>,
}

impl<C> fmt::Debug for StreamQueue<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StreamQueue")
            .field("key", &self.key)
            .field("capacity", &self.spec.capacity())
            .finish_non_exhaustive()
    }
}

impl<C> StreamQueue<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    /// The queue `spec` describes, over `conn`.
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// use std::num::NonZeroU32;
    /// use tollgate::queue::{QueueSpec, StreamQueue, WorkQueue};
    ///
    /// let conn = redis::Client::open("redis://127.0.0.1:6379/")?.get_connection_manager().await?;
    /// let queue = StreamQueue::new(conn, QueueSpec::new("emails", NonZeroU32::new(1000).unwrap())?);
    /// assert_eq!(queue.spec().stream_key(), "tollgate:{emails}:queue:stream");
    /// # Ok(()) }
    /// ```
    pub fn new(conn: C, spec: QueueSpec) -> Self {
        let key = spec.stream_key();
        Self {
            conn,
            spec,
            key,
            clock: None,
        }
    }

    /// Records this clock's time in `at` instead of Redis `TIME` (tests).
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Some(Arc::new(clock));
        self
    }

    async fn append(&self, job: &Job) -> Result<Pushed, StoreError> {
        let now = self.clock.as_ref().map_or(-1, |c| c.now_micros() as i64);
        let mut call = ENQUEUE.prepare_invoke();
        call.key(&self.key)
            .arg(now)
            .arg(self.spec.capacity())
            .arg(self.spec.ttl_millis());
        for (name, value) in job.fields() {
            call.arg(name.as_str()).arg(value.as_ref());
        }
        let ints = reply::integers(call.invoke_async(&mut self.conn.clone()).await?)?;
        let [accepted, len, now, ms, seq] = ints[..] else {
            return Err(StoreError::protocol(format!(
                "malformed enqueue reply {ints:?}"
            )));
        };
        let id = (accepted == 1).then(|| format!("{ms}-{seq}"));
        Ok(Pushed::new(
            id,
            len.max(0) as u64,
            self.spec.capacity(),
            now.max(0) as u64,
        ))
    }
}

impl<C> WorkQueue for StreamQueue<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    fn push<'a>(&'a self, job: &'a Job) -> BoxFuture<'a, Result<Pushed, StoreError>> {
        Box::pin(self.append(job))
    }

    fn spec(&self) -> &QueueSpec {
        &self.spec
    }
}
