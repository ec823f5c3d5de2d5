//! Redis Cluster through redis-rs `cluster-async`, tuned for rate limiting:
//! short timeouts, quick retries, redirections followed.

use std::time::Duration;

use redis::cluster::ClusterClientBuilder;
use redis::cluster_read_routing::RoundRobinReplicaStrategy;

use super::{Connection, RedisStoreBuilder};
use crate::error::StoreError;

/// A [`RedisStore`](crate::RedisStore) on Redis Cluster; made by
/// [`RedisStore::cluster`](crate::RedisStore::cluster).
///
/// Every key of one decision carries the hash tag `{policy|key}`, and keys
/// escape `{` and `}`, so a script's keys always share one slot (no
/// `CROSSSLOT`) and no caller can aim at another caller's slot.
///
/// - `MOVED` and `ASK` (slot migrations, failovers) are followed by redis-rs,
///   which refreshes its slot map; `TRYAGAIN` and `CLUSTERDOWN` are retried
///   a few times, 10 to 500 ms apart.
/// - A node that has never seen a script (new, restarted or just promoted:
///   Redis does not replicate scripts) answers `NOSCRIPT`; the store then
///   sends the source with `EVAL`, routed by the same keys, so it reaches
///   that very node even while another node is down.
/// - With [`read_from_replicas`](Self::read_from_replicas), peeks
///   (`EVALSHA_RO`) go to replicas, round-robin per shard.
///
/// ```no_run
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// use tollgate::RedisStore;
///
/// let store = RedisStore::cluster(["redis://10.0.0.1:7000/", "redis://10.0.0.2:7000/"])
///     .read_from_replicas(true)
///     .connect()
///     .await?
///     .build()?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
#[must_use]
pub struct ClusterConfig {
    nodes: Vec<String>,
    read_from_replicas: bool,
    connection_timeout: Duration,
    response_timeout: Duration,
    retries: u32,
}

impl ClusterConfig {
    pub(crate) fn new(nodes: impl IntoIterator<Item = impl Into<String>>) -> Self {
        Self {
            nodes: nodes.into_iter().map(Into::into).collect(),
            read_from_replicas: false,
            connection_timeout: Duration::from_secs(1),
            response_timeout: Duration::from_secs(1),
            retries: 5,
        }
    }

    /// Sends peeks (`EVALSHA_RO`) to replicas, round-robin within each
    /// shard. Off by default; charging scripts always go to primaries.
    ///
    /// Replicas may lag a little, so a peek may show slightly older numbers;
    /// it never shows an ended window as exhausted, because the script treats
    /// a stored window end in the past as an empty window.
    pub fn read_from_replicas(mut self, yes: bool) -> Self {
        self.read_from_replicas = yes;
        self
    }

    /// How long to wait for a TCP connection, and for one command including
    /// its retries and redirections (default 1 s each). The layer's deadline
    /// still bounds every decision.
    pub fn timeouts(mut self, connection: Duration, response: Duration) -> Self {
        self.connection_timeout = connection;
        self.response_timeout = response;
        self
    }

    /// How many times one command is retried after a redirection, a
    /// connection error or `TRYAGAIN` (default 5).
    pub fn retries(mut self, retries: u32) -> Self {
        self.retries = retries;
        self
    }

    /// Connects to the cluster through any reachable seed node.
    pub async fn connect(self) -> Result<RedisStoreBuilder, StoreError> {
        let mut builder = ClusterClientBuilder::new(self.nodes)
            .connection_timeout(self.connection_timeout)
            .response_timeout(self.response_timeout)
            .retries(self.retries)
            // redis-rs waits 1.28 s or more between retries by default: longer
            // than any decision may take. A redirection needs no wait at all,
            // a failover a few hundred milliseconds.
            .min_retry_wait(10)
            .max_retry_wait(500)
            .retry_wait_formula(10, 2);
        if self.read_from_replicas {
            builder = builder.read_routing_strategy(RoundRobinReplicaStrategy::new());
        }
        let conn = builder.build()?.get_async_connection().await?;
        Ok(RedisStoreBuilder::new(Connection::Cluster(conn)))
    }
}
