//! A script call on Redis Cluster, tuned for rate limiting: quick retries,
//! and redirections followed by the store itself, so that `ASKING` always
//! travels with the command it is for (see
//! [`ClusterConfig`](crate::store::ClusterConfig) for why).

use std::time::{Duration, Instant};

use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use redis::{Cmd, ErrorKind, RedisError, RedisResult, ServerErrorKind, ToRedisArgs, Value};

use crate::store::redis::script::LuaScript;

/// Retries of one script call when
/// [`ClusterConfig`](crate::store::ClusterConfig) does not say.
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

/// Redis Cluster as the store reaches it: redis-rs's connection, which
/// routes each script by its keys' hash slot; how hard one call tries; and
/// whether read-only calls may go to replicas.
#[derive(Clone)]
pub(crate) struct Cluster {
    pub(crate) conn: ClusterConnection,
    pub(crate) retries: Retries,
    pub(crate) read_from_replicas: bool,
}

impl Cluster {
    /// Runs `script` on the node that owns `keys`, following redirections,
    /// answering `NOSCRIPT` with `EVAL`, and retrying as [`Retries`] says.
    pub(crate) async fn eval<A: ToRedisArgs>(
        &self,
        script: &LuaScript,
        keys: &[String],
        args: &[A],
        read_only: bool,
    ) -> RedisResult<Value> {
        let conn = &mut self.conn.clone();
        let retries = self.retries;
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
