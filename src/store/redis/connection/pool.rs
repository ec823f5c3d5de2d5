//! A deadpool-redis pool, used without a checkout per decision.

use std::sync::Mutex;

use deadpool_redis::Pool;
use redis::aio::MultiplexedConnection;
use redis::{RedisResult, ToRedisArgs, Value};

use crate::store::redis::script::LuaScript;

/// deadpool-redis checks every connection it hands out with `UNWATCH` +
/// `PING`: a round trip per decision if we checked one out per request.
/// A multiplexed connection serves any number of concurrent requests, so we
/// check one out once, keep a clone, and only go back to the pool when that
/// connection breaks.
pub(crate) struct PooledConnection {
    pool: Pool,
    cached: Mutex<Option<MultiplexedConnection>>,
}

impl PooledConnection {
    pub(crate) fn new(pool: Pool) -> Self {
        Self {
            pool,
            cached: Mutex::new(None),
        }
    }

    pub(crate) async fn connection(&self) -> RedisResult<MultiplexedConnection> {
        let cached = self.lock().clone();
        match cached {
            Some(conn) => Ok(conn),
            // Boxed: deadpool's checkout is a future of kilobytes, which
            // every call's future would otherwise carry and move.
            None => Box::pin(self.check_out()).await,
        }
    }

    /// A connection from the pool, kept for the calls that follow.
    async fn check_out(&self) -> RedisResult<MultiplexedConnection> {
        let object = self.pool.get().await.map_err(|err| {
            redis::RedisError::from((
                redis::ErrorKind::Io,
                "deadpool-redis could not hand out a connection",
                err.to_string(),
            ))
        })?;
        let conn: MultiplexedConnection = object.as_ref().clone();
        *self.lock() = Some(conn.clone());
        Ok(conn)
    }

    pub(crate) async fn eval<A: ToRedisArgs + Sync>(
        &self,
        script: &LuaScript,
        keys: &[String],
        args: &[A],
        read_only: bool,
    ) -> RedisResult<Value> {
        let mut conn = self.connection().await?;
        let result = script.eval(&mut conn, keys, args, read_only).await;
        if let Err(err) = &result
            && (err.is_io_error() || err.is_connection_dropped() || err.is_unrecoverable_error())
        {
            self.lock().take();
        }
        result
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<MultiplexedConnection>> {
        self.cached.lock().unwrap_or_else(|p| p.into_inner())
    }
}
