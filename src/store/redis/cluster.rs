//! A store on Redis Cluster: its options, and connecting to it through
//! redis-rs `cluster-async` with short timeouts and redis-rs's own retries
//! off (the store's script calls retry and follow redirections themselves,
//! `connection/cluster.rs`).

use std::time::Duration;

use redis::cluster::ClusterClientBuilder;
use redis::cluster_read_routing::RoundRobinReplicaStrategy;

use super::builder::RedisStoreBuilder;
use super::connection::cluster::{Cluster, Retries, DEFAULT_RETRIES};
use super::connection::tcp::tcp_settings;
use super::connection::Connection;
use super::RedisStore;
use crate::error::StoreError;

/// A [`RedisStore`](crate::RedisStore) on Redis Cluster; made by
/// [`RedisStore::cluster`](crate::RedisStore::cluster).
///
/// Every key of one decision carries the hash tag `{policy|key}`, and keys
/// escape `{` and `}`, so a script's keys always share one slot (no
/// `CROSSSLOT`) and no caller can aim at another caller's slot.
///
/// - `MOVED` and `ASK` (slot migrations, failovers) are followed by the store
///   (redis-rs then refreshes its slot map); `CLUSTERDOWN` and broken
///   connections are retried a few times, 10 to 160 ms apart. `TRYAGAIN`,
///   which a node answers while a decision's keys are split between two
///   nodes mid-migration, is retried every 10 to 40 ms until the response
///   timeout, as many times as it takes, so a live migration decides every
///   request in Redis (within the layer's deadline). The
///   store follows `ASK` itself because redis-rs sends `ASKING` as a request
///   of its own on a connection other requests share: under load another
///   command slips in between, takes the one-shot `ASKING`, and the target
///   answers `MOVED` back, until the retries run out (lettuce had the same
///   race). Here `ASKING` and the script go out as one pipeline.
/// - A node that has never seen a script (new, restarted or just promoted:
///   Redis does not replicate scripts) answers `NOSCRIPT`; the store then
///   sends the source with `EVAL` to that same node. `SCRIPT LOAD` would not
///   do: redis-rs sends it to every node and fails it if any node is down,
///   which is exactly the case after a primary dies.
/// - With [`read_from_replicas`](Self::read_from_replicas), peeks and
///   pre-checks (`EVALSHA_RO`) go to replicas, round-robin per shard.
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
            retries: DEFAULT_RETRIES.redirections,
        }
    }

    /// Sends peeks and pre-checks (`EVALSHA_RO`; see
    /// [`RedisStoreBuilder::pre_check`](crate::store::RedisStoreBuilder::pre_check))
    /// to replicas, round-robin within each shard. Off by default; charging
    /// scripts always go to primaries.
    ///
    /// Replicas may lag a little, so a peek may show slightly older numbers;
    /// it never shows an ended window as exhausted, because the script treats
    /// a stored window end in the past as an empty window.
    ///
    /// redis-rs learns the replicas from `CLUSTER SLOTS` when it connects and
    /// when a redirection or error makes it refresh; Redis 7 lists a replica
    /// only once it has received something from its primary, so a store
    /// connected to a brand-new, idle cluster reads from primaries until its
    /// first refresh.
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

    /// How many times one script call is retried after a redirection, a
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
            .tcp_settings(tcp_settings())
            // The store retries and follows redirections itself (see above).
            .retries(0);
        if self.read_from_replicas {
            builder = builder.read_routing_strategy(RoundRobinReplicaStrategy::new());
        }
        let conn = builder.build()?.get_async_connection().await?;
        RedisStoreBuilder::new(Connection::Cluster(Cluster {
            conn,
            retries: Retries {
                redirections: self.retries,
                patience: self.response_timeout,
            },
            read_from_replicas: self.read_from_replicas,
        }))
        .check_server()
        .await
    }
}

impl RedisStore {
    #[cfg_attr(docsrs, doc(cfg(feature = "cluster")))]
    /// Redis Cluster, reached through any of the seed `nodes`; see
    /// [`ClusterConfig`] for what it follows and retries.
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// let store = tollgate::RedisStore::cluster(["redis://127.0.0.1:7000/"])
    ///     .connect()
    ///     .await?
    ///     .build()?;
    /// # Ok(()) }
    /// ```
    pub fn cluster(nodes: impl IntoIterator<Item = impl Into<String>>) -> ClusterConfig {
        ClusterConfig::new(nodes)
    }
}
