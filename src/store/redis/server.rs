//! Which server the store talks to, and what its scripting can do.
//!
//! tollgate runs on Redis 6.2 and later (and Valkey, which reports a
//! compatible `redis_version`). Every decision, refund and release script
//! uses only what 6.2 has. One thing differs by version: from 7.0 on, a
//! script can be flagged `no-writes` and run with `EVALSHA_RO`, which is what
//! lets peeks and pre-checks go to replicas. On 6.2 the same script runs
//! unflagged with `EVALSHA`, on the primary.

use std::fmt;
use std::sync::atomic::{AtomicU8, Ordering};

#[cfg(feature = "cluster")]
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use redis::{RedisError, RedisResult, ToRedisArgs, Value};

use super::connection::Connection;
use super::script::LuaScript;
use crate::error::{StoreError, StoreErrorKind};

/// A server's `redis_version`, as `INFO server` reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct ServerVersion(pub(crate) u32, pub(crate) u32, pub(crate) u32);

/// The oldest server the scripts run on.
pub(crate) const OLDEST_SUPPORTED: ServerVersion = ServerVersion(6, 2, 0);

/// The first server with script flags and `EVALSHA_RO`.
const READ_ONLY_SCRIPTS: ServerVersion = ServerVersion(7, 0, 0);

impl fmt::Display for ServerVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.0, self.1, self.2)
    }
}

impl ServerVersion {
    /// Reads `redis_version:x.y.z` out of an `INFO server` reply.
    pub(crate) fn from_info(info: &str) -> Option<Self> {
        let version = info
            .lines()
            .find_map(|line| line.strip_prefix("redis_version:"))?
            .trim();
        let mut parts = version.split('.').map(|part| part.parse::<u32>().ok());
        let major = parts.next()??;
        let minor = parts.next().flatten().unwrap_or(0);
        let patch = parts.next().flatten().unwrap_or(0);
        Some(Self(major, minor, patch))
    }

    /// The version, or why the store cannot run on it.
    pub(crate) fn supported(self) -> Result<Self, StoreError> {
        if self >= OLDEST_SUPPORTED {
            Ok(self)
        } else {
            Err(StoreError::new(
                StoreErrorKind::Unsupported,
                format!("the server runs Redis {self}; tollgate needs Redis {OLDEST_SUPPORTED} or later"),
            ))
        }
    }
}

/// Whether read-only calls may use `EVALSHA_RO` on this store's servers:
/// known from the version read at connect, or learned from the first
/// read-only call when the caller made the connection.
#[derive(Debug)]
pub(crate) struct Scripting(AtomicU8);

const UNKNOWN: u8 = 0;
const FLAGS: u8 = 1;
const PLAIN: u8 = 2;

impl Scripting {
    /// For a server of `version`, or of a version still to be learned.
    pub(crate) fn new(version: Option<ServerVersion>) -> Self {
        Self(AtomicU8::new(match version {
            None => UNKNOWN,
            Some(v) if v >= READ_ONLY_SCRIPTS => FLAGS,
            Some(_) => PLAIN,
        }))
    }

    /// Runs a read-only `script`: flagged with `EVALSHA_RO` (replicas may
    /// answer), or on servers before 7.0 its unflagged twin with `EVALSHA`
    /// on the primary. A store that does not know yet tries the first, and
    /// on "unknown command" settles on the second for good.
    pub(crate) async fn eval_read_only<A: ToRedisArgs + Sync>(
        &self,
        conn: &Connection,
        script: &LuaScript,
        keys: &[String],
        args: &[A],
    ) -> RedisResult<Value> {
        let plain = script.plain();
        if self.0.load(Ordering::Relaxed) == PLAIN {
            return conn.eval(plain, keys, args, false).await;
        }
        match conn.eval(script, keys, args, true).await {
            Err(err) if is_before_read_only_scripts(&err) => {
                if self.0.swap(PLAIN, Ordering::Relaxed) != PLAIN {
                    tracing::info!(
                        "the server predates Redis 7.0: peeks and pre-checks run on the primary with EVALSHA"
                    );
                }
                conn.eval(plain, keys, args, false).await
            }
            Ok(value) => {
                self.0.store(FLAGS, Ordering::Relaxed);
                Ok(value)
            }
            other => other,
        }
    }
}

/// Whether `err` is a server before 7.0 refusing `EVALSHA_RO` (or `EVAL_RO`,
/// which a cluster node that lacks the script is sent).
fn is_before_read_only_scripts(err: &RedisError) -> bool {
    let text = err.to_string().to_ascii_lowercase();
    text.contains("unknown command") && (text.contains("evalsha_ro") || text.contains("eval_ro"))
}

impl Connection {
    /// The oldest `redis_version` among the servers that decide (every
    /// shard's primary; on a cluster, one node, as nodes of one cluster run
    /// one version), refused when older than [`OLDEST_SUPPORTED`].
    pub(crate) async fn server_version(&self) -> Result<ServerVersion, StoreError> {
        let infos = self.info_server().await?;
        let mut oldest: Option<ServerVersion> = None;
        for info in &infos {
            let version = ServerVersion::from_info(info)
                .ok_or_else(|| StoreError::protocol("INFO server names no redis_version"))?;
            oldest = Some(oldest.map_or(version, |o| o.min(version)));
        }
        oldest
            .ok_or_else(|| StoreError::protocol("no server answered INFO server"))?
            .supported()
    }
}

impl Connection {
    /// `INFO server` from each server that decides.
    async fn info_server(&self) -> Result<Vec<String>, StoreError> {
        let mut cmd = redis::cmd("INFO");
        cmd.arg("server");
        let one = match self {
            Connection::Manager(c) => cmd.query_async(&mut c.clone()).await?,
            Connection::Multiplexed(c) => cmd.query_async(&mut c.clone()).await?,
            #[cfg(feature = "deadpool")]
            Connection::Pool(p) => cmd.query_async(&mut p.connection().await?).await?,
            #[cfg(feature = "cluster")]
            Connection::Cluster(cluster) => {
                let reply = cluster
                    .conn
                    .clone()
                    .route_command(cmd, RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random))
                    .await?
                    .extract_error()?;
                redis::from_redis_value(reply).map_err(|e| StoreError::protocol(e.to_string()))?
            }
            Connection::Sharded(shards) => {
                let mut all = Vec::new();
                for mut primary in shards.primaries() {
                    all.push(cmd.query_async(&mut primary).await?);
                }
                return Ok(all);
            }
            #[cfg(feature = "sentinel")]
            Connection::Sentinel(s) => cmd.query_async(&mut s.primary().await?).await?,
        };
        Ok(vec![one])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_redis_and_valkey_versions() {
        let redis = "# Server\r\nredis_version:7.0.15\r\nredis_mode:standalone\r\n";
        assert_eq!(
            ServerVersion::from_info(redis),
            Some(ServerVersion(7, 0, 15))
        );
        let valkey =
            "# Server\r\nredis_version:7.2.4\r\nserver_name:valkey\r\nvalkey_version:9.1.2\r\n";
        assert_eq!(
            ServerVersion::from_info(valkey),
            Some(ServerVersion(7, 2, 4))
        );
        assert_eq!(ServerVersion::from_info("# Server\r\n"), None);
    }

    #[test]
    fn a_server_before_6_2_is_refused_with_both_versions_named() {
        let err = ServerVersion(6, 0, 16).supported().unwrap_err();
        assert_eq!(err.kind(), StoreErrorKind::Unsupported);
        let text = err.to_string();
        assert!(text.contains("6.0.16") && text.contains("6.2.0"), "{text}");
        assert!(ServerVersion(6, 2, 14).supported().is_ok());
    }

    #[test]
    fn scripting_follows_the_version() {
        let state = |v| Scripting::new(v).0.into_inner();
        assert_eq!(state(Some(ServerVersion(6, 2, 14))), PLAIN);
        assert_eq!(state(Some(ServerVersion(7, 0, 0))), FLAGS);
        assert_eq!(state(None), UNKNOWN);
    }
}
