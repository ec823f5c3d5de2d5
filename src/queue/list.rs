//! [`ListQueue`]: a bounded Redis List, the gate without the bookkeeping.

use std::fmt;
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager};
use redis::Script;

use super::{Entry, Job, Pushed, QueueSpec, WorkQueue};
use crate::clock::Clock;
use crate::error::StoreError;
use crate::store::redis::reply;
use crate::store::BoxFuture;
use crate::strategy::concurrency::new_id;

static ENQUEUE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../lua/list_enqueue.lua")));

/// A bounded Redis List: each push is one `EVALSHA` that checks `LLEN`
/// against the capacity, `LPUSH`es the job (netstrings: `2:id,<id>` then
/// name, value, ...) and refreshes the key's expiry. Workers [`pop`](Self::pop)
/// from the other end, first in, first out.
///
/// For users who need only the gate: an element a worker popped is its own,
/// and lost if that worker crashes. Use a [`StreamQueue`](super::StreamQueue)
/// when work must survive a crash. Memory: at most `capacity` elements.
///
/// ```no_run
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// use std::num::NonZeroU32;
/// use tollgate::queue::{Job, ListQueue, QueueSpec, WorkQueue};
///
/// let conn = redis::Client::open("redis://127.0.0.1:6379/")?.get_connection_manager().await?;
/// let queue = ListQueue::new(conn, QueueSpec::new("feeding", NonZeroU32::new(100).unwrap())?);
/// queue.push(&Job::new().field("zone", "big cats")).await?;
/// for entry in queue.pop(10).await? {
///     println!("{}: {:?}", entry.id, entry.job.get_str("zone"));
/// }
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct ListQueue<C = ConnectionManager> {
    conn: C,
    spec: QueueSpec,
    key: String,
    clock: Option<Arc<dyn Clock>>,
}

impl<C> fmt::Debug for ListQueue<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ListQueue")
            .field("key", &self.key)
            .field("capacity", &self.spec.capacity())
            .finish_non_exhaustive()
    }
}

impl<C> ListQueue<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    /// The queue `spec` describes, over `conn`.
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// use std::num::NonZeroU32;
    /// use tollgate::queue::{ListQueue, QueueSpec, WorkQueue};
    ///
    /// let conn = redis::Client::open("redis://127.0.0.1:6379/")?.get_connection_manager().await?;
    /// let queue = ListQueue::new(conn, QueueSpec::new("emails", NonZeroU32::new(1000).unwrap())?);
    /// assert_eq!(queue.spec().list_key(), "tollgate:{emails}:queue:list");
    /// # Ok(()) }
    /// ```
    pub fn new(conn: C, spec: QueueSpec) -> Self {
        let key = spec.list_key();
        Self {
            conn,
            spec,
            key,
            clock: None,
        }
    }

    /// Uses this clock's time instead of Redis `TIME` (tests).
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Some(Arc::new(clock));
        self
    }

    /// Takes up to `count` entries, oldest first, without waiting (`RPOP`
    /// with a count, Redis 6.2 or later). Elements that cannot be decoded
    /// (not written by a `ListQueue`) are skipped with a warning.
    pub async fn pop(&self, count: usize) -> Result<Vec<Entry>, StoreError> {
        if count == 0 {
            return Ok(Vec::new());
        }
        let raw: Option<Vec<Vec<u8>>> = redis::cmd("RPOP")
            .arg(&self.key)
            .arg(count)
            .query_async(&mut self.conn.clone())
            .await?;
        Ok(raw
            .unwrap_or_default()
            .iter()
            .filter_map(|r| decode(r))
            .collect())
    }

    /// Waits up to `timeout` (whole seconds or parts of one) for one entry
    /// (`BRPOP`). The connection is blocked meanwhile: give this queue a
    /// connection of its own, without a response timeout shorter than
    /// `timeout`.
    pub async fn pop_blocking(&self, timeout: Duration) -> Result<Option<Entry>, StoreError> {
        let raw: Option<(String, Vec<u8>)> = redis::cmd("BRPOP")
            .arg(&self.key)
            .arg(timeout.as_secs_f64())
            .query_async(&mut self.conn.clone())
            .await?;
        Ok(raw.and_then(|(_, r)| decode(&r)))
    }

    async fn append(&self, job: &Job) -> Result<Pushed, StoreError> {
        let now = self.clock.as_ref().map_or(-1, |c| c.now_micros() as i64);
        let id = new_id().to_string();
        let ints = reply::integers(
            ENQUEUE
                .key(&self.key)
                .arg(now)
                .arg(self.spec.capacity())
                .arg(self.spec.ttl_millis())
                .arg(job.encode(&id))
                .invoke_async(&mut self.conn.clone())
                .await?,
        )?;
        let [accepted, len, now] = ints[..] else {
            return Err(StoreError::protocol(format!(
                "malformed enqueue reply {ints:?}"
            )));
        };
        let id = (accepted == 1).then_some(id);
        Ok(Pushed::new(
            id,
            len.max(0) as u64,
            self.spec.capacity(),
            now.max(0) as u64,
        ))
    }
}

fn decode(raw: &[u8]) -> Option<Entry> {
    match Job::decode(raw) {
        Some((id, job)) => Some(Entry::new(id, job)),
        None => {
            tracing::warn!("skipping a list element that is not a tollgate job");
            None
        }
    }
}

impl<C> WorkQueue for ListQueue<C>
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
