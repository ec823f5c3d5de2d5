//! The ways to reach Redis, behind one `eval`.

use std::fmt;
use std::sync::Arc;
#[cfg(feature = "deadpool")]
use std::sync::Mutex;

#[cfg(feature = "deadpool")]
use deadpool_redis::Pool;
use redis::aio::{ConnectionManager, MultiplexedConnection};
#[cfg(feature = "cluster")]
use redis::cluster_async::ClusterConnection;
use redis::io::tcp::TcpSettings;
use redis::{Client, IntoConnectionInfo, RedisResult, ToRedisArgs, Value};

use super::script::LuaScript;
#[cfg(feature = "sentinel")]
use super::sentinel::SentinelConnection;
use super::shards::Shards;

/// TCP settings for every connection the store opens: `TCP_NODELAY`, which
/// redis-rs leaves off. With Nagle's algorithm on, a script call written
/// while an earlier one is unacknowledged waits for that acknowledgement,
/// which under concurrent decisions adds a round trip to many of them.
pub(crate) fn tcp_settings() -> TcpSettings {
    TcpSettings::default().set_nodelay(true)
}

/// A client for `url` with [`tcp_settings`].
pub(crate) fn client(url: impl IntoConnectionInfo) -> RedisResult<Client> {
    let info = url.into_connection_info()?.set_tcp_settings(tcp_settings());
    Client::open(info)
}

/// A handle to Redis that can run a script. Cloning is cheap.
#[derive(Clone)]
pub(crate) enum Connection {
    /// Reconnects by itself after Redis restarts; the default.
    Manager(ConnectionManager),
    /// One multiplexed connection, shared by all requests.
    Multiplexed(MultiplexedConnection),
    /// A deadpool-redis pool, used without a checkout per decision.
    #[cfg(feature = "deadpool")]
    Pool(Arc<PooledConnection>),
    /// Redis Cluster: routes each script by its keys' hash slot, with this
    /// many retries; whether read-only calls may go to replicas.
    #[cfg(feature = "cluster")]
    Cluster(ClusterConnection, super::cluster::Retries, bool),
    /// Independent primaries (and replicas), picked by the keys' hash tag.
    Sharded(Arc<Shards>),
    /// The primary Redis Sentinel names, rediscovered after a failover.
    #[cfg(feature = "sentinel")]
    Sentinel(Arc<SentinelConnection>),
}

impl fmt::Debug for Connection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Connection::Manager(_) => "Connection::Manager",
            Connection::Multiplexed(_) => "Connection::Multiplexed",
            #[cfg(feature = "deadpool")]
            Connection::Pool(_) => "Connection::Pool",
            #[cfg(feature = "cluster")]
            Connection::Cluster(..) => "Connection::Cluster",
            Connection::Sharded(_) => "Connection::Sharded",
            #[cfg(feature = "sentinel")]
            Connection::Sentinel(_) => "Connection::Sentinel",
        })
    }
}

impl Connection {
    /// Whether read-only calls (peeks, pre-checks) may go to replicas.
    pub(crate) fn reads_from_replicas(&self) -> bool {
        match self {
            Connection::Manager(_) | Connection::Multiplexed(_) => false,
            #[cfg(feature = "deadpool")]
            Connection::Pool(_) => false,
            #[cfg(feature = "cluster")]
            Connection::Cluster(_, _, replicas) => *replicas,
            Connection::Sharded(s) => s.reads_from_replicas(),
            #[cfg(feature = "sentinel")]
            Connection::Sentinel(s) => s.reads_from_replicas(),
        }
    }

    /// Runs `script` in one round trip (see [`LuaScript::eval`]).
    pub(crate) async fn eval<A: ToRedisArgs + Sync>(
        &self,
        script: &LuaScript,
        keys: &[String],
        args: &[A],
        read_only: bool,
    ) -> RedisResult<Value> {
        match self {
            Connection::Manager(c) => script.eval(&mut c.clone(), keys, args, read_only).await,
            Connection::Multiplexed(c) => script.eval(&mut c.clone(), keys, args, read_only).await,
            // Boxed, with its redirections and retries: as large as that
            // future is, every call's future would otherwise carry and move
            // it, whatever the connection.
            #[cfg(feature = "cluster")]
            Connection::Cluster(c, retries, _) => {
                Box::pin(super::cluster::eval(
                    &mut c.clone(),
                    *retries,
                    script,
                    keys,
                    args,
                    read_only,
                ))
                .await
            }
            #[cfg(feature = "deadpool")]
            Connection::Pool(p) => p.eval(script, keys, args, read_only).await,
            Connection::Sharded(s) => s.eval(script, keys, args, read_only).await,
            #[cfg(feature = "sentinel")]
            Connection::Sentinel(s) => s.eval(script, keys, args, read_only).await,
        }
    }
}

#[cfg(feature = "deadpool")]
/// deadpool-redis checks every connection it hands out with `UNWATCH` +
/// `PING`: a round trip per decision if we checked one out per request.
/// A multiplexed connection serves any number of concurrent requests, so we
/// check one out once, keep a clone, and only go back to the pool when that
/// connection breaks.
pub(crate) struct PooledConnection {
    pool: Pool,
    cached: Mutex<Option<MultiplexedConnection>>,
}

#[cfg(feature = "deadpool")]
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

    async fn eval<A: ToRedisArgs + Sync>(
        &self,
        script: &LuaScript,
        keys: &[String],
        args: &[A],
        read_only: bool,
    ) -> RedisResult<Value> {
        let mut conn = self.connection().await?;
        let result = script.eval(&mut conn, keys, args, read_only).await;
        if let Err(err) = &result {
            if err.is_io_error() || err.is_connection_dropped() || err.is_unrecoverable_error() {
                self.lock().take();
            }
        }
        result
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<MultiplexedConnection>> {
        self.cached.lock().unwrap_or_else(|p| p.into_inner())
    }
}
