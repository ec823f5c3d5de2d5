//! [`StreamProcessor`]: drains a [`StreamQueue`](super::StreamQueue) through a
//! consumer group, at the rate the worker chooses.

use std::fmt;
use std::future::Future;
use std::sync::LazyLock;
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, RedisError, Script, Value};
use tokio::time::Instant;

use super::{Entry, Job, QueueSpec};
use crate::error::{ConfigError, StoreError};
use crate::quota::Quota;
use crate::strategy::leaky_bucket::interval_micros;

static GROUP: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../lua/stream_group.lua")));
static FINISH: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../lua/stream_finish.lua")));

/// A worker on a [`StreamQueue`](super::StreamQueue): reads entries through a
/// consumer group, hands them to your code at the rate you choose, and
/// acknowledges and deletes what your code finished (so it leaves the
/// queue's length). Entries a crashed worker read but never finished are
/// reclaimed with `XAUTOCLAIM` once idle for `min_idle`, by any worker of
/// the group; so are entries whose handler failed. Run as many workers
/// (distinct `consumer` names) as you like.
///
/// | step | Redis |
/// |---|---|
/// | start | one `EVALSHA`: `XGROUP CREATE .. 0 MKSTREAM` (an existing group is fine), `PEXPIRE` if the stream had no expiry |
/// | read | `XAUTOCLAIM` (every `min_idle / 2`), else `XREADGROUP .. COUNT batch BLOCK block .. >` |
/// | finish | one `EVALSHA`: `XACK` + `XDEL` of the finished ids |
///
/// The processor blocks its connection while it waits for entries, so it
/// opens one of its own from the [`redis::Client`] (single Redis or a
/// replica set's primary; not Redis Cluster).
///
/// ```no_run
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// use std::{num::NonZeroU32, time::Duration};
/// use tollgate::Quota;
/// use tollgate::queue::{QueueSpec, StreamProcessor};
///
/// let client = redis::Client::open("redis://127.0.0.1:6379/")?;
/// let spec = QueueSpec::new("feeding", NonZeroU32::new(100).unwrap())?;
/// let mut worker = StreamProcessor::builder(&spec, "keepers", "keeper-1")?
///     .rate(Quota::per_second(NonZeroU32::new(2).unwrap())) // 2 entries per second at most
///     .min_idle(Duration::from_secs(30))
///     .connect(&client)
///     .await?;
/// let done = worker
///     .run(
///         |entry| async move {
///             println!("feeding {:?}", entry.job.get_str("uri"));
///             Ok::<(), std::io::Error>(())
///         },
///         async { let _ = tokio::signal::ctrl_c().await; },
///     )
///     .await?;
/// println!("{done} entries processed");
/// # Ok(()) }
/// ```
pub struct StreamProcessor {
    conn: MultiplexedConnection,
    key: String,
    ttl_millis: u64,
    options: Options,
    cursor: String,
    next_reclaim: Instant,
    next_start: Option<Instant>,
}

#[derive(Debug, Clone)]
struct Options {
    group: String,
    consumer: String,
    batch: usize,
    block: Duration,
    min_idle: Duration,
    interval: Option<Duration>,
}

impl fmt::Debug for StreamProcessor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StreamProcessor")
            .field("key", &self.key)
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

/// Options for a [`StreamProcessor`]; made by [`StreamProcessor::builder`].
///
/// | option | default |
/// |---|---|
/// | [`rate`](Self::rate) | as fast as the handler goes |
/// | [`batch`](Self::batch) | 10 entries per read |
/// | [`block`](Self::block) | wait up to 1 s for new entries |
/// | [`min_idle`](Self::min_idle) | reclaim entries idle for 30 s |
#[derive(Debug)]
#[must_use]
pub struct StreamProcessorBuilder {
    key: String,
    ttl_millis: u64,
    options: Options,
}

impl StreamProcessor {
    /// A worker called `consumer` in consumer group `group` of the queue
    /// `spec` names.
    pub fn builder(
        spec: &QueueSpec,
        group: &str,
        consumer: &str,
    ) -> Result<StreamProcessorBuilder, ConfigError> {
        for (what, name) in [("group", group), ("consumer", consumer)] {
            if name.is_empty() || name.len() > 128 || name.chars().any(char::is_control) {
                let name = name.to_owned();
                return Err(ConfigError::ProcessorName { what, name });
            }
        }
        Ok(StreamProcessorBuilder {
            key: spec.stream_key(),
            ttl_millis: spec.ttl_millis(),
            options: Options {
                group: group.to_owned(),
                consumer: consumer.to_owned(),
                batch: 10,
                block: Duration::from_secs(1),
                min_idle: Duration::from_secs(30),
                interval: None,
            },
        })
    }

    /// Makes sure the consumer group exists (it is created reading from the
    /// stream's first entry). [`next_batch`](Self::next_batch) calls this
    /// again by itself when the stream expired with its group.
    pub async fn ensure_group(&mut self) -> Result<(), StoreError> {
        GROUP
            .key(&self.key)
            .arg(&self.options.group)
            .arg(self.ttl_millis)
            .invoke_async::<i64>(&mut self.conn)
            .await?;
        Ok(())
    }

    /// The next entries to work on: ones reclaimed from crashed workers when
    /// a reclaim is due and finds any, else new ones (waiting up to `block`).
    /// Empty when nothing arrived in time.
    pub async fn next_batch(&mut self) -> Result<Vec<Entry>, StoreError> {
        if Instant::now() >= self.next_reclaim {
            let reclaimed = self.reclaim().await?;
            if !reclaimed.is_empty() {
                return Ok(reclaimed);
            }
        }
        match self.read_new().await {
            Err(err) if err.code() == Some("NOGROUP") => {
                // The stream expired (no push for its ttl), taking the group.
                self.ensure_group().await?;
                Ok(self.read_new().await?)
            }
            other => Ok(other?),
        }
    }

    /// Takes over entries that other workers (or this one, before a restart)
    /// read but did not finish within `min_idle` (`XAUTOCLAIM`).
    pub async fn reclaim(&mut self) -> Result<Vec<Entry>, StoreError> {
        self.next_reclaim = Instant::now() + self.options.min_idle / 2;
        let reply: Value = match redis::cmd("XAUTOCLAIM")
            .arg(&self.key)
            .arg(&self.options.group)
            .arg(&self.options.consumer)
            .arg(self.options.min_idle.as_millis() as u64)
            .arg(&self.cursor)
            .arg("COUNT")
            .arg(self.options.batch)
            .query_async(&mut self.conn)
            .await
        {
            Err(err) if err.code() == Some("NOGROUP") => {
                self.ensure_group().await?;
                return Ok(Vec::new());
            }
            other => other?,
        };
        let mut parts = items(reply).into_iter();
        let (Some(cursor), Some(claimed)) = (parts.next(), parts.next()) else {
            return Err(StoreError::protocol("malformed XAUTOCLAIM reply"));
        };
        self.cursor = text(cursor).unwrap_or_else(|| "0-0".into());
        let entries = entries(claimed)?;
        if !entries.is_empty() {
            tracing::info!(
                stream = %self.key,
                count = entries.len(),
                "reclaimed entries of a worker that did not finish them"
            );
        }
        Ok(entries)
    }

    async fn read_new(&mut self) -> Result<Vec<Entry>, RedisError> {
        let reply: Value = redis::cmd("XREADGROUP")
            .arg("GROUP")
            .arg(&self.options.group)
            .arg(&self.options.consumer)
            .arg("COUNT")
            .arg(self.options.batch)
            .arg("BLOCK")
            .arg(self.options.block.as_millis() as u64)
            .arg("STREAMS")
            .arg(&self.key)
            .arg(">")
            .query_async(&mut self.conn)
            .await?;
        // [[stream, [entries]]], or nil after BLOCK with nothing new.
        let mut found = Vec::new();
        for stream in items(reply) {
            let mut pair = items(stream).into_iter();
            if let (Some(_name), Some(list)) = (pair.next(), pair.next()) {
                found.extend(entries(list).map_err(|e| {
                    RedisError::from((redis::ErrorKind::Parse, "XREADGROUP", e.to_string()))
                })?);
            }
        }
        Ok(found)
    }

    /// Acknowledges and deletes finished entries in one round trip; returns
    /// how many were deleted.
    pub async fn finish(&mut self, ids: &[String]) -> Result<u64, StoreError> {
        if ids.is_empty() {
            return Ok(0);
        }
        let deleted: i64 = FINISH
            .key(&self.key)
            .arg(&self.options.group)
            .arg(ids)
            .invoke_async(&mut self.conn)
            .await?;
        Ok(deleted.max(0) as u64)
    }

    /// Waits until the next entry may start, keeping to the chosen rate.
    async fn pace(&mut self) {
        let Some(interval) = self.options.interval else {
            return;
        };
        if let Some(start) = self.next_start {
            tokio::time::sleep_until(start).await;
        }
        // From when this entry really starts: a late timer never lets the
        // next one start sooner than one interval after it.
        self.next_start = Some(Instant::now() + interval);
    }

    /// Works until `shutdown` completes: each entry goes to `handler` (at
    /// most at the chosen rate); entries it finishes with `Ok` are
    /// acknowledged and deleted after each batch, entries it fails are left
    /// for a reclaim after `min_idle`. Redis errors are logged and retried
    /// after a second. Returns how many entries were finished.
    ///
    /// `shutdown` is honoured between entries; entries read but not started
    /// when it fires are not lost: a worker reclaims them after `min_idle`. A handler that always fails sees its entry
    /// again every `min_idle`; return `Ok` for work you give up on.
    pub async fn run<F, Fut, E>(
        &mut self,
        mut handler: F,
        shutdown: impl Future<Output = ()>,
    ) -> Result<u64, StoreError>
    where
        F: FnMut(Entry) -> Fut,
        Fut: Future<Output = Result<(), E>>,
        E: fmt::Display,
    {
        tokio::pin!(shutdown);
        let mut finished = 0;
        tokio::select! {
            () = &mut shutdown => return Ok(0),
            started = self.ensure_group() => started?,
        }
        loop {
            let batch = tokio::select! {
                () = &mut shutdown => return Ok(finished),
                batch = self.next_batch() => batch,
            };
            let batch = match batch {
                Ok(batch) => batch,
                Err(err) => {
                    tracing::warn!(stream = %self.key, error = %err, "work queue read failed; retrying in 1 s");
                    tokio::select! {
                        () = &mut shutdown => return Ok(finished),
                        () = tokio::time::sleep(Duration::from_secs(1)) => continue,
                    }
                }
            };
            let mut done = Vec::with_capacity(batch.len());
            let mut stopping = false;
            for entry in batch {
                // Stop between entries, never in the middle of one.
                tokio::select! {
                    () = &mut shutdown => { stopping = true; break }
                    () = self.pace() => {}
                }
                let id = entry.id.clone();
                match handler(entry).await {
                    Ok(()) => done.push(id),
                    Err(err) => tracing::warn!(stream = %self.key, entry = %id, error = %err,
                        "work queue handler failed; the entry will be reclaimed"),
                }
            }
            match self.finish(&done).await {
                Ok(_) => finished += done.len() as u64,
                Err(err) => tracing::warn!(stream = %self.key, error = %err,
                    "could not acknowledge finished entries; they will be reclaimed and run again"),
            }
            if stopping || shutdown_ready(&mut shutdown).await {
                return Ok(finished);
            }
        }
    }
}

/// Whether `shutdown` has completed, without waiting for it.
async fn shutdown_ready(shutdown: &mut std::pin::Pin<&mut impl Future<Output = ()>>) -> bool {
    tokio::select! {
        biased;
        () = shutdown.as_mut() => true,
        () = std::future::ready(()) => false,
    }
}

impl StreamProcessorBuilder {
    /// Handles at most `rate.limit()` entries per `rate.window()`: each
    /// entry starts at least `window / limit` after the one before (rounded
    /// up to the microsecond, as the leaky bucket does).
    pub fn rate(mut self, rate: Quota) -> Self {
        self.options.interval = Some(Duration::from_micros(interval_micros(&rate)));
        self
    }

    /// Entries per read (1 to 10,000).
    pub fn batch(mut self, batch: usize) -> Self {
        self.options.batch = batch.clamp(1, 10_000);
        self
    }

    /// How long a read waits for new entries (1 ms to 60 s).
    pub fn block(mut self, block: Duration) -> Self {
        self.options.block = block.clamp(Duration::from_millis(1), Duration::from_secs(60));
        self
    }

    /// How long an entry must sit unfinished with another worker before it
    /// is reclaimed (at least 1 ms); longer than your slowest handler.
    pub fn min_idle(mut self, min_idle: Duration) -> Self {
        self.options.min_idle = min_idle.max(Duration::from_millis(1));
        self
    }

    /// Opens the processor's own connection and makes sure the group exists.
    pub async fn connect(self, client: &redis::Client) -> Result<StreamProcessor, StoreError> {
        // Reads block for up to `block`: the response timeout must be longer.
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(Duration::from_secs(2)))
            .set_response_timeout(Some(self.options.block + Duration::from_secs(2)));
        let conn = client
            .get_multiplexed_async_connection_with_config(&config)
            .await?;
        let mut processor = StreamProcessor {
            conn,
            key: self.key,
            ttl_millis: self.ttl_millis,
            options: self.options,
            cursor: "0-0".into(),
            next_reclaim: Instant::now(),
            next_start: None,
        };
        processor.ensure_group().await?;
        Ok(processor)
    }
}

/// The elements of an array reply (RESP2 or RESP3); nothing for nil.
fn items(value: Value) -> Vec<Value> {
    match value {
        Value::Array(items) | Value::Set(items) => items,
        Value::Map(pairs) => pairs.into_iter().flat_map(|(k, v)| [k, v]).collect(),
        _ => Vec::new(),
    }
}

fn text(value: Value) -> Option<String> {
    match value {
        Value::BulkString(b) => String::from_utf8(b).ok(),
        Value::SimpleString(s) => Some(s),
        _ => None,
    }
}

fn bytes(value: Value) -> Option<bytes::Bytes> {
    match value {
        Value::BulkString(b) => Some(b.into()),
        Value::SimpleString(s) => Some(s.into_bytes().into()),
        Value::Int(i) => Some(i.to_string().into_bytes().into()),
        _ => None,
    }
}

/// `[[id, [field, value, ...]], ...]` into entries; an entry whose fields
/// are nil (deleted meanwhile) is skipped.
fn entries(value: Value) -> Result<Vec<Entry>, StoreError> {
    let mut out = Vec::new();
    for raw in items(value) {
        let mut pair = items(raw).into_iter();
        let id = pair
            .next()
            .and_then(text)
            .ok_or_else(|| StoreError::protocol("stream entry without an id"))?;
        let Some(fields) = pair.next().filter(|f| *f != Value::Nil) else {
            continue;
        };
        let mut job = Job::new();
        let mut fields = items(fields).into_iter();
        while let (Some(name), Some(value)) = (fields.next(), fields.next()) {
            if let (Some(name), Some(value)) = (text(name), bytes(value)) {
                job = job.field(name, value);
            }
        }
        out.push(Entry::new(id, job));
    }
    Ok(out)
}
