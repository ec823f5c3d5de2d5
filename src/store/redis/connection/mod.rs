//! The ways to reach Redis, behind one `eval`: a file for each way that is
//! more than a redis-rs connection (a pool, a cluster, shards, a primary
//! Sentinel names), and the TCP settings every connection the store opens
//! uses.

#[cfg(feature = "cluster")]
pub(crate) mod cluster;
#[cfg(feature = "deadpool")]
pub(crate) mod pool;
#[cfg(feature = "sentinel")]
pub(crate) mod sentinel;
pub(crate) mod shards;
pub(crate) mod tcp;

use std::fmt;
use std::sync::Arc;

use redis::aio::{ConnectionManager, MultiplexedConnection};
use redis::{RedisResult, ToRedisArgs, Value};

#[cfg(feature = "cluster")]
use self::cluster::Cluster;
#[cfg(feature = "deadpool")]
use self::pool::PooledConnection;
#[cfg(feature = "sentinel")]
use self::sentinel::SentinelConnection;
use self::shards::Shards;
use super::script::LuaScript;

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
    /// Redis Cluster: each script routed by its keys' hash slot.
    #[cfg(feature = "cluster")]
    Cluster(Cluster),
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
            Connection::Cluster(_) => "Connection::Cluster",
            Connection::Sharded(_) => "Connection::Sharded",
            #[cfg(feature = "sentinel")]
            Connection::Sentinel(_) => "Connection::Sentinel",
        })
    }
}

impl Connection {
    /// Whether every call goes down one connection to one server, which
    /// runs them in the order they were sent: two calls sent back to back
    /// need not wait for each other's answer to keep their order.
    pub(crate) fn in_order(&self) -> bool {
        matches!(self, Connection::Manager(_) | Connection::Multiplexed(_))
    }

    /// Whether read-only calls (peeks, pre-checks) may go to replicas.
    pub(crate) fn reads_from_replicas(&self) -> bool {
        match self {
            Connection::Manager(_) | Connection::Multiplexed(_) => false,
            #[cfg(feature = "deadpool")]
            Connection::Pool(_) => false,
            #[cfg(feature = "cluster")]
            Connection::Cluster(c) => c.read_from_replicas,
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
            Connection::Cluster(c) => Box::pin(c.eval(script, keys, args, read_only)).await,
            #[cfg(feature = "deadpool")]
            Connection::Pool(p) => p.eval(script, keys, args, read_only).await,
            Connection::Sharded(s) => s.eval(script, keys, args, read_only).await,
            #[cfg(feature = "sentinel")]
            Connection::Sentinel(s) => s.eval(script, keys, args, read_only).await,
        }
    }
}
