//! Where every decision is written down: in memory, or as a Redis Stream.
//!
//! With Redis, each strategy's events go to their own stream with `XADD`
//! (pipelined, 512 per round trip); the stream gets an expiry of an hour like
//! every other key this project writes, and the lab reads it back with
//! `XRANGE` to aggregate, so the charts come from what Redis recorded.

use redis::aio::MultiplexedConnection;

/// One decision: when (µs from the start), for whom, and the verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Event {
    pub at: u64,
    pub caller: u32,
    pub admitted: bool,
}

/// Lets a pipeline of `XADD`s build up before sending it.
const BATCH: usize = 512;
/// How long a stream of events is kept, seconds.
const STREAM_TTL_SECS: i64 = 3600;

/// An event log for one strategy.
pub enum Log {
    Memory(Vec<Event>),
    Redis {
        conn: MultiplexedConnection,
        stream: String,
        pending: Vec<Event>,
        written: usize,
    },
}

impl Log {
    pub fn memory() -> Self {
        Log::Memory(Vec::new())
    }

    /// A fresh stream under `stream` (deleted first, in case of a rerun).
    pub async fn redis(
        mut conn: MultiplexedConnection,
        stream: String,
    ) -> redis::RedisResult<Self> {
        redis::cmd("DEL")
            .arg(&stream)
            .query_async::<()>(&mut conn)
            .await?;
        Ok(Log::Redis {
            conn,
            stream,
            pending: Vec::with_capacity(BATCH),
            written: 0,
        })
    }

    pub async fn record(&mut self, event: Event) -> redis::RedisResult<()> {
        match self {
            Log::Memory(events) => events.push(event),
            Log::Redis { pending, .. } => {
                pending.push(event);
                if pending.len() >= BATCH {
                    self.flush().await?;
                }
            }
        }
        Ok(())
    }

    async fn flush(&mut self) -> redis::RedisResult<()> {
        let Log::Redis {
            conn,
            stream,
            pending,
            written,
        } = self
        else {
            return Ok(());
        };
        if pending.is_empty() {
            return Ok(());
        }
        let mut pipe = redis::pipe();
        for e in pending.iter() {
            pipe.cmd("XADD")
                .arg(&*stream)
                .arg("*")
                .arg("at")
                .arg(e.at)
                .arg("caller")
                .arg(e.caller)
                .arg("admitted")
                .arg(u8::from(e.admitted))
                .ignore();
        }
        pipe.cmd("EXPIRE")
            .arg(&*stream)
            .arg(STREAM_TTL_SECS)
            .ignore();
        pipe.query_async::<()>(conn).await?;
        *written += pending.len();
        pending.clear();
        Ok(())
    }

    /// Every event recorded, in the order recorded.
    pub async fn read_all(mut self) -> redis::RedisResult<Vec<Event>> {
        self.flush().await?;
        match self {
            Log::Memory(events) => Ok(events),
            Log::Redis {
                mut conn,
                stream,
                written,
                ..
            } => {
                let mut events = Vec::with_capacity(written);
                let mut from = "-".to_owned();
                loop {
                    // [[id, [field, value, ...]], ...]
                    let page: Vec<(String, Vec<String>)> = redis::cmd("XRANGE")
                        .arg(&stream)
                        .arg(&from)
                        .arg("+")
                        .arg("COUNT")
                        .arg(4096)
                        .query_async(&mut conn)
                        .await?;
                    let Some((last, _)) = page.last() else { break };
                    from = format!("({last}");
                    for (id, fields) in &page {
                        events.push(parse(id, fields)?);
                    }
                }
                Ok(events)
            }
        }
    }
}

/// An entry's `at`, `caller` and `admitted` fields.
fn parse(id: &str, fields: &[String]) -> redis::RedisResult<Event> {
    let field = |name: &str| -> Option<u64> {
        let at = fields.iter().step_by(2).position(|f| f == name)?;
        fields.get(2 * at + 1)?.parse().ok()
    };
    match (field("at"), field("caller"), field("admitted")) {
        (Some(at), Some(caller), Some(admitted)) => Ok(Event {
            at,
            caller: u32::try_from(caller).unwrap_or(u32::MAX),
            admitted: admitted == 1,
        }),
        _ => Err(redis::RedisError::from((
            redis::ErrorKind::Parse,
            "malformed lab event",
            id.to_owned(),
        ))),
    }
}
