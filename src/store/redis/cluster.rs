//! Redis Cluster through redis-rs `cluster-async`, tuned for rate limiting:
//! short timeouts, quick retries, and redirections followed by the store
//! itself, so that `ASKING` always travels with the command it is for.

use std::time::{Duration, Instant};

use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use redis::cluster_read_routing::RoundRobinReplicaStrategy;
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use redis::{Cmd, ErrorKind, RedisError, RedisResult, ServerErrorKind, ToRedisArgs, Value};

use super::script::LuaScript;
use super::{Connection, RedisStoreBuilder};
use crate::error::StoreError;

/// Retries of one script call when [`ClusterConfig`] does not say.
pub(crate) const DEFAULT_RETRIES: Retries = Retries {
    redirections: 5,
    patience: Duration::from_secs(1),
};

/// How hard one script call tries before it fails.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Retries {
    /// Attempts after a redirection, `CLUSTERDOWN` or a broken connection.
    pub(crate) redirections: u32,
    /// How long `TRYAGAIN` (a multi-key call meeting a slot whose keys are
    /// half moved) is retried, however many times: a migration ends, and
    /// the layer's deadline still bounds every request.
    pub(crate) patience: Duration,
}

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
            .tcp_settings(super::connection::tcp_settings())
            // The store retries and follows redirections itself (see above).
            .retries(0);
        if self.read_from_replicas {
            builder = builder.read_routing_strategy(RoundRobinReplicaStrategy::new());
        }
        let conn = builder.build()?.get_async_connection().await?;
        RedisStoreBuilder::new(Connection::Cluster(
            conn,
            Retries {
                redirections: self.retries,
                patience: self.response_timeout,
            },
            self.read_from_replicas,
        ))
        .check_server()
        .await
    }
}

/// Where the next attempt goes.
enum Target {
    /// Wherever redis-rs's slot map sends the keys.
    Keys,
    /// A node that answered `MOVED` names: it owns the slot now.
    Moved(String, u16),
    /// A node that answered `ASK` names: `ASKING` first, in one pipeline.
    Ask(String, u16),
}

/// Runs `script` on the node that owns `keys`, following redirections,
/// answering `NOSCRIPT` with `EVAL`, and retrying up to `retries` times.
pub(crate) async fn eval<A: ToRedisArgs>(
    conn: &mut ClusterConnection,
    retries: Retries,
    script: &LuaScript,
    keys: &[String],
    args: &[A],
    read_only: bool,
) -> RedisResult<Value> {
    let mut target = Target::Keys;
    let mut with_source = false;
    let mut attempt = 0;
    let mut waited_for_migration = 0;
    let started = Instant::now();
    loop {
        let cmd = if with_source {
            script.eval_cmd(keys, args, read_only)
        } else {
            script.evalsha_cmd(keys, args, read_only)
        };
        let err = match send(conn, cmd, &target).await {
            Ok(value) => return Ok(value),
            Err(err) => err,
        };
        if err.kind() == ErrorKind::Server(ServerErrorKind::NoScript) && !with_source {
            tracing::debug!(
                script = script.name,
                "NOSCRIPT on a cluster node: sending the source"
            );
            crate::metrics::script_reload(script.name);
            with_source = true;
            continue;
        }
        if err.kind() == ErrorKind::Server(ServerErrorKind::TryAgain)
            && started.elapsed() < retries.patience
        {
            // Again where it was sent: the keys' owner, or the `ASK` target
            // still importing the rest of them.
            waited_for_migration += 1;
            tokio::time::sleep(Duration::from_millis(
                10 << waited_for_migration.min(3) >> 1,
            ))
            .await;
            continue;
        }
        if attempt >= retries.redirections {
            return Err(err);
        }
        attempt += 1;
        let redirect = err
            .redirect_node()
            .and_then(|(addr, _slot)| addr.rsplit_once(':'))
            .and_then(|(host, port)| Some((host.to_owned(), port.parse().ok()?)));
        match (err.kind(), redirect) {
            (ErrorKind::Server(ServerErrorKind::Ask), Some((host, port))) => {
                target = Target::Ask(host, port);
            }
            (ErrorKind::Server(ServerErrorKind::Moved), Some((host, port))) => {
                target = Target::Moved(host, port);
            }
            _ if is_transient(&err) => {
                target = Target::Keys;
                tokio::time::sleep(backoff(attempt)).await;
            }
            _ => return Err(err),
        }
        tracing::debug!(script = script.name, attempt, error = %err, "retrying on the cluster");
    }
}

async fn send(conn: &mut ClusterConnection, cmd: Cmd, target: &Target) -> RedisResult<Value> {
    match target {
        Target::Keys => cmd.query_async(conn).await,
        Target::Moved(host, port) => {
            let node = SingleNodeRoutingInfo::ByAddress {
                host: host.clone(),
                port: *port,
            };
            // Unlike `query_async`, routed calls hand back error replies as
            // values.
            conn.route_command(cmd, RoutingInfo::SingleNode(node))
                .await?
                .extract_error()
        }
        Target::Ask(host, port) => {
            let node = SingleNodeRoutingInfo::ByAddress {
                host: host.clone(),
                port: *port,
            };
            let mut pipe = redis::pipe();
            pipe.cmd("ASKING").add_command(cmd);
            let mut replies = conn.route_pipeline(pipe, 1, 1, node).await?;
            replies.pop().unwrap_or(Value::Nil).extract_error()
        }
    }
}

/// Errors that another attempt, a moment later, may not meet: a slot in
/// migration, a failover in progress, a connection being repaired.
///
/// Not a timeout: the script may have run, and the deadline that matters
/// (the layer's) is gone by then anyway. A connection that broke after the
/// script was sent may still make a retry charge twice (every decision of a
/// batch call, and a concurrency check's slot stays taken until its
/// timeout); that errs on the side of the limit (a caller waits a little
/// longer), never past it.
fn is_transient(err: &RedisError) -> bool {
    matches!(
        err.kind(),
        ErrorKind::Server(
            ServerErrorKind::TryAgain
                | ServerErrorKind::ClusterDown
                | ServerErrorKind::MasterDown
                | ServerErrorKind::BusyLoading
                | ServerErrorKind::ReadOnly
        ) | ErrorKind::ClusterConnectionNotFound
    ) || (!err.is_timeout()
        && (err.is_io_error() || err.is_connection_dropped() || err.is_connection_refusal()))
}

/// 10, 20, 40, 80, then 160 ms.
fn backoff(attempt: u32) -> Duration {
    Duration::from_millis(10 << attempt.saturating_sub(1).min(4))
}
