//! A store over several independent Redis primaries: the shards you name
//! ([`Shard`]), the options ([`ShardedConfig`]), and connecting to them
//! (which shard owns a caller's keys, and how a call reaches it, is
//! `connection/shards.rs`).

use std::sync::Arc;
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{ErrorKind, RedisError, RedisResult};

use super::builder::RedisStoreBuilder;
use super::connection::shards::{Rendezvous, ShardNodes, Shards};
use super::connection::tcp;
use super::connection::Connection;
use super::RedisStore;
use crate::error::StoreError;

/// One shard: a Redis primary that takes every charging script for its keys,
/// and replicas that may answer read-only peeks.
///
/// The **name** decides which keys the shard owns, not the URL: move a
/// shard to another host under the same name and no key changes shard.
///
/// ```
/// use tollgate::store::Shard;
///
/// let a = Shard::new("a", "redis://10.0.0.1:6379/").replica("redis://10.0.0.2:6379/");
/// let b = Shard::new("b", "redis://10.0.1.1:6379/");
/// # let _ = (a, b);
/// ```
#[derive(Debug, Clone)]
pub struct Shard {
    name: String,
    primary: String,
    replicas: Vec<String>,
}

impl Shard {
    /// A shard called `name` whose primary is at `primary_url`.
    ///
    /// ```
    /// use tollgate::store::Shard;
    /// // Keys follow the name "eu-1", whichever host its URL points at.
    /// let shard = Shard::new("eu-1", "redis://10.0.0.1:6379/");
    /// # let _ = shard;
    /// ```
    pub fn new(name: impl Into<String>, primary_url: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            primary: primary_url.into(),
            replicas: Vec::new(),
        }
    }

    /// Adds a replica of this shard's primary, for peeks (see
    /// [`ShardedConfig::read_from_replicas`]).
    pub fn replica(mut self, url: impl Into<String>) -> Self {
        self.replicas.push(url.into());
        self
    }
}

/// A [`RedisStore`](crate::RedisStore) over several independent primaries;
/// made by [`RedisStore::sharded`](crate::RedisStore::sharded).
///
/// Keys map to shards by rendezvous (highest random weight) hashing of their
/// hash tag, so adding a shard moves only the keys the new shard wins, about
/// 1/N of them, and every app server computes the same map without talking to
/// the others. Every app server must list the same shard names.
///
/// Changing the shard list moves callers to fresh counters: for the window
/// in progress they get up to their limit again on the new shard.
///
/// ```no_run
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// use tollgate::RedisStore;
/// use tollgate::store::Shard;
///
/// let store = RedisStore::sharded([
///     Shard::new("a", "redis://10.0.0.1:6379/").replica("redis://10.0.0.2:6379/"),
///     Shard::new("b", "redis://10.0.1.1:6379/").replica("redis://10.0.1.2:6379/"),
/// ])
/// .read_from_replicas(true)
/// .connect()
/// .await?
/// .prefix("myapp")
/// .build()?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
#[must_use]
pub struct ShardedConfig {
    shards: Vec<Shard>,
    read_from_replicas: bool,
    connection_timeout: Duration,
    response_timeout: Duration,
}

impl ShardedConfig {
    pub(crate) fn new(shards: impl IntoIterator<Item = Shard>) -> Self {
        Self {
            shards: shards.into_iter().collect(),
            read_from_replicas: false,
            connection_timeout: Duration::from_secs(1),
            response_timeout: Duration::from_secs(1),
        }
    }

    /// Sends peeks and pre-checks (`EVALSHA_RO`; see
    /// [`RedisStoreBuilder::pre_check`](crate::store::RedisStoreBuilder::pre_check))
    /// to the shard's replicas, round-robin, and to the primary when a
    /// replica fails or the shard has none. Off by default. Charging scripts
    /// always go to the primary.
    ///
    /// A replica may lag a little behind, so a peek may show slightly older
    /// numbers; it never shows an ended window as exhausted, because the
    /// script treats a stored window end in the past as an empty window,
    /// whether or not the key has expired (replicas do not expire keys).
    pub fn read_from_replicas(mut self, yes: bool) -> Self {
        self.read_from_replicas = yes;
        self
    }

    /// How long to wait for a TCP connection, and for each reply (default
    /// 1 s each). The layer's own deadline still bounds every decision.
    pub fn timeouts(mut self, connection: Duration, response: Duration) -> Self {
        self.connection_timeout = connection;
        self.response_timeout = response;
        self
    }

    /// Connects to every primary (an unreachable primary is an error) and,
    /// lazily, to the replicas (one that is down only sends peeks to its
    /// primary).
    ///
    /// Errors when there are no shards, a name is empty, repeated or holds
    /// control characters, or a URL is invalid.
    pub async fn connect(self) -> Result<RedisStoreBuilder, StoreError> {
        let names: Vec<&str> = self.shards.iter().map(|s| s.name.as_str()).collect();
        let ring = Rendezvous::new(&names).map_err(invalid)?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(self.connection_timeout))
            .set_response_timeout(Some(self.response_timeout))
            .set_number_of_retries(2)
            .set_max_delay(Duration::from_millis(500));
        let mut nodes = Vec::with_capacity(self.shards.len());
        for shard in &self.shards {
            let client = tcp::client(shard.primary.as_str())?;
            let primary = ConnectionManager::new_with_config(client, config.clone())
                .await
                .map_err(|err| {
                    tracing::warn!(shard = shard.name, error = %err, "cannot reach a shard's primary");
                    err
                })?;
            let replicas = shard
                .replicas
                .iter()
                .map(|url| {
                    let client = tcp::client(url.as_str())?;
                    ConnectionManager::new_lazy_with_config(client, config.clone())
                })
                .collect::<RedisResult<Vec<_>>>()?;
            nodes.push(ShardNodes::new(shard.name.clone(), primary, replicas));
        }
        let shards = Shards::new(ring, nodes, self.read_from_replicas);
        RedisStoreBuilder::new(Connection::Sharded(Arc::new(shards)))
            .check_server()
            .await
    }
}

fn invalid(why: String) -> RedisError {
    RedisError::from((ErrorKind::InvalidClientConfig, "invalid shard list", why))
}

impl RedisStore {
    /// Several independent primaries (each optionally with replicas), keys
    /// spread by rendezvous hashing of their hash tag; see [`ShardedConfig`].
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// use tollgate::RedisStore;
    /// use tollgate::store::Shard;
    /// let store = RedisStore::sharded([
    ///     Shard::new("a", "redis://127.0.0.1:7000/"),
    ///     Shard::new("b", "redis://127.0.0.1:7001/"),
    /// ])
    /// .connect()
    /// .await?
    /// .build()?;
    /// # Ok(()) }
    /// ```
    pub fn sharded(shards: impl IntoIterator<Item = Shard>) -> ShardedConfig {
        ShardedConfig::new(shards)
    }
}
