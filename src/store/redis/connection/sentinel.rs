//! The primary Redis Sentinel names, followed through failovers (see
//! [`SentinelConfig`](crate::store::SentinelConfig) for how and why).

use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;
use redis::sentinel::{SentinelClient, SentinelNodeConnectionInfo, SentinelServerType};
use redis::{
    AsyncConnectionConfig, ConnectionAddr, ErrorKind, RedisError, RedisResult, ServerErrorKind,
    ToRedisArgs, Value,
};

use super::tcp::{self, tcp_settings};
use crate::store::redis::script::LuaScript;

/// How long to wait between two rounds of asking the sentinels: while they
/// name no usable primary, decisions fail fast (the layer's failure policy
/// answers them) instead of each one asking the sentinels.
const REDISCOVER_AFTER: Duration = Duration::from_millis(100);

/// How often a background task asks a sentinel which server is primary.
const WATCH_EVERY: Duration = Duration::from_millis(250);

/// How to connect to the servers the sentinels name.
fn node_settings() -> SentinelNodeConnectionInfo {
    SentinelNodeConnectionInfo::default().set_tcp_settings(tcp_settings())
}

/// The connection to whichever server Sentinel calls the primary.
pub(crate) struct SentinelConnection {
    /// Serialises discovery: one request asks, the others wait for it.
    client: tokio::sync::Mutex<SentinelClient>,
    master_name: String,
    config: AsyncConnectionConfig,
    discovery_timeout: Duration,
    state: Mutex<State>,
    /// Where read-only calls go, when asked to read from replicas.
    replicas: Option<Replicas>,
}

/// A connection to one replica the sentinels named, for read-only calls.
struct Replicas {
    /// Asks the sentinels for a healthy replica (one at a time).
    client: tokio::sync::Mutex<SentinelClient>,
    current: Mutex<Option<MultiplexedConnection>>,
}

impl Replicas {
    fn current(&self) -> std::sync::MutexGuard<'_, Option<MultiplexedConnection>> {
        self.current.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A server's host and port.
type Addr = (String, u16);

/// The connection in use, which discovery made it, and where it goes.
struct Primary {
    conn: MultiplexedConnection,
    generation: u64,
    addr: Option<Addr>,
}

struct State {
    current: Option<Primary>,
    generation: u64,
    /// No discovery before this, after one failed.
    retry_at: Option<Instant>,
    /// The primary the sentinels named last, if it differs from `current`.
    hint: Option<Addr>,
}

impl std::fmt::Debug for SentinelConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SentinelConnection")
            .field("master_name", &self.master_name)
            .finish_non_exhaustive()
    }
}

impl SentinelConnection {
    /// Asks `sentinels` for the primary they monitor as `master_name` and
    /// connects to it (and to a replica, when `read_from_replicas`), then
    /// watches the sentinels in the background until the connection is
    /// dropped; an error if no sentinel names a reachable primary now.
    pub(crate) async fn connect(
        sentinels: &[String],
        master_name: String,
        read_from_replicas: bool,
        connection_timeout: Duration,
        response_timeout: Duration,
    ) -> RedisResult<Arc<Self>> {
        if sentinels.is_empty() {
            return Err(RedisError::from((
                ErrorKind::InvalidClientConfig,
                "a sentinel store needs at least one sentinel URL",
            )));
        }
        let client = SentinelClient::build(
            sentinels.iter().map(String::as_str).collect(),
            master_name.clone(),
            Some(node_settings()),
            SentinelServerType::Master,
        )?;
        let replicas = if read_from_replicas {
            Some(Replicas {
                client: tokio::sync::Mutex::new(SentinelClient::build(
                    sentinels.iter().map(String::as_str).collect(),
                    master_name.clone(),
                    Some(node_settings()),
                    SentinelServerType::Replica,
                )?),
                current: Mutex::new(None),
            })
        } else {
            None
        };
        let watched = sentinels
            .iter()
            .map(|url| redis::Client::open(url.as_str()))
            .collect::<RedisResult<Vec<_>>>()?;
        let conn = SentinelConnection {
            client: tokio::sync::Mutex::new(client),
            master_name,
            config: AsyncConnectionConfig::new()
                .set_connection_timeout(Some(connection_timeout))
                .set_response_timeout(Some(response_timeout)),
            discovery_timeout: connection_timeout * 2,
            state: Mutex::new(State {
                current: None,
                generation: 0,
                retry_at: None,
                hint: None,
            }),
            replicas,
        };
        conn.connection().await?;
        conn.find_replica().await;
        let conn = Arc::new(conn);
        tokio::spawn(watch(Arc::downgrade(&conn), watched));
        Ok(conn)
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn cached(&self) -> Option<(MultiplexedConnection, u64)> {
        self.state()
            .current
            .as_ref()
            .map(|p| (p.conn.clone(), p.generation))
    }

    /// The primary's connection, asking the sentinels if there is none.
    /// The primary's connection, found through the sentinels if need be.
    pub(crate) async fn primary(&self) -> RedisResult<MultiplexedConnection> {
        Ok(self.connection().await?.0)
    }

    async fn connection(&self) -> RedisResult<(MultiplexedConnection, u64)> {
        match self.cached() {
            Some(current) => Ok(current),
            // Boxed: finding the primary takes a future of kilobytes, which
            // every call's future would otherwise carry and move.
            None => Box::pin(self.discover()).await,
        }
    }

    /// Asks the sentinels for the primary and connects to it, unless
    /// another request did meanwhile or the last attempt was too recent.
    async fn discover(&self) -> RedisResult<(MultiplexedConnection, u64)> {
        let mut client = self.client.lock().await;
        if let Some(current) = self.cached() {
            return Ok(current); // another request found it while we waited
        }
        if let Some(at) = self.state().retry_at
            && Instant::now() < at
        {
            return Err(RedisError::from((
                ErrorKind::Io,
                "no reachable primary named by the sentinels; asking again shortly",
            )));
        }
        let hint = self.state().hint.take();
        let found = tokio::time::timeout(self.discovery_timeout, async {
            // The watcher saw the sentinels name a new primary: go there
            // directly. Asking the sentinels again could still name the old
            // one, which believes it is primary until it is demoted.
            let primary = match hint {
                Some((host, port)) => tcp::client((host.as_str(), port))?,
                None => client.async_get_client().await?,
            };
            let addr = match primary.get_connection_info().addr() {
                ConnectionAddr::Tcp(host, port) | ConnectionAddr::TcpTls { host, port, .. } => {
                    Some((host.clone(), *port))
                }
                _ => None,
            };
            let conn = primary
                .get_multiplexed_async_connection_with_config(&self.config)
                .await?;
            Ok((conn, addr))
        })
        .await
        .unwrap_or_else(|_| {
            Err(RedisError::from((
                ErrorKind::Io,
                "the sentinels did not name a reachable primary in time",
            )))
        });
        let mut state = self.state();
        match found {
            Ok((conn, addr)) => {
                state.generation += 1;
                state.retry_at = Some(Instant::now() + REDISCOVER_AFTER);
                tracing::info!(master = self.master_name, primary = ?addr,
                    "connected to the primary named by Sentinel");
                state.current = Some(Primary {
                    conn: conn.clone(),
                    generation: state.generation,
                    addr,
                });
                Ok((conn, state.generation))
            }
            Err(err) => {
                state.retry_at = Some(Instant::now() + REDISCOVER_AFTER);
                Err(err)
            }
        }
    }

    /// Whether read-only calls may go to a replica.
    pub(crate) fn reads_from_replicas(&self) -> bool {
        self.replicas.is_some()
    }

    /// Connects to a replica the sentinels name, when reading from replicas
    /// and none is connected; leaves reads on the primary if none answers.
    async fn find_replica(&self) {
        let Some(replicas) = &self.replicas else {
            return;
        };
        if replicas.current().is_some() {
            return;
        }
        let mut client = replicas.client.lock().await;
        let found = tokio::time::timeout(self.discovery_timeout, async {
            client
                .async_get_client()
                .await?
                .get_multiplexed_async_connection_with_config(&self.config)
                .await
        })
        .await;
        match found {
            Ok(Ok(conn)) => {
                tracing::info!(master = self.master_name, "reading from a replica");
                *replicas.current() = Some(conn);
            }
            Ok(Err(err)) => {
                tracing::debug!(master = self.master_name, error = %err, "no replica to read from");
            }
            Err(_) => tracing::debug!(master = self.master_name, "no replica named in time"),
        }
    }

    /// Runs a read-only `script` on the replica in use, if any; forgets the
    /// replica when it fails (the watcher finds another).
    async fn eval_on_replica<A: ToRedisArgs + Sync>(
        &self,
        script: &LuaScript,
        keys: &[String],
        args: &[A],
    ) -> Option<Value> {
        let replicas = self.replicas.as_ref()?;
        let mut conn = replicas.current().clone()?;
        match script.eval(&mut conn, keys, args, true).await {
            Ok(value) => Some(value),
            Err(err) => {
                crate::metrics::replica_fallback();
                tracing::debug!(master = self.master_name, error = %err,
                    "a replica failed a read; asking the primary");
                if !matches!(
                    err.kind(),
                    ErrorKind::Server(ServerErrorKind::ResponseError)
                ) {
                    replicas.current().take();
                }
                None
            }
        }
    }

    /// Runs `script` on the primary (a read-only one on a replica first, when
    /// configured); forgets the primary's connection when it broke or
    /// reached a server that is no longer primary, so the next call asks the
    /// sentinels again.
    pub(crate) async fn eval<A: ToRedisArgs + Sync>(
        &self,
        script: &LuaScript,
        keys: &[String],
        args: &[A],
        read_only: bool,
    ) -> RedisResult<Value> {
        if read_only {
            // Boxed: reads are the rare call, and their future would
            // otherwise enlarge every call's.
            if let Some(value) = Box::pin(self.eval_on_replica(script, keys, args)).await {
                return Ok(value);
            }
        }
        let (mut conn, generation) = self.connection().await?;
        let result = script.eval(&mut conn, keys, args, read_only).await;
        if let Err(err) = &result {
            let stale = err.is_io_error()
                || err.is_connection_dropped()
                || err.is_connection_refusal()
                || err.is_timeout()
                || err.is_unrecoverable_error()
                || matches!(
                    err.kind(),
                    ErrorKind::Server(ServerErrorKind::ReadOnly | ServerErrorKind::MasterDown)
                );
            if stale {
                let mut state = self.state();
                if state.current.as_ref().map(|p| p.generation) == Some(generation) {
                    tracing::warn!(master = self.master_name, error = %err,
                        "lost the primary; asking the sentinels again");
                    state.current = None;
                }
            }
        }
        result
    }

    /// The sentinels name `primary`: forget a connection to any other server.
    fn primary_is(&self, primary: Addr) {
        let mut state = self.state();
        let moved = state
            .current
            .as_ref()
            .is_some_and(|p| p.addr.as_ref().is_some_and(|a| *a != primary));
        if moved {
            tracing::warn!(master = self.master_name, new = ?primary,
                "Sentinel names another primary; switching");
            state.current = None;
            state.retry_at = None;
            state.hint = Some(primary);
        }
    }
}

/// Asks the sentinels in turn, every [`WATCH_EVERY`], which server is
/// primary, until the store is dropped.
async fn watch(store: Weak<SentinelConnection>, sentinels: Vec<redis::Client>) {
    let mut conn: Option<MultiplexedConnection> = None;
    let mut next = 0;
    loop {
        tokio::time::sleep(WATCH_EVERY).await;
        let Some(store) = store.upgrade() else {
            return;
        };
        store.find_replica().await;
        if conn.is_none() {
            let client = &sentinels[next % sentinels.len()];
            next += 1;
            conn = client
                .get_multiplexed_async_connection_with_config(&store.config)
                .await
                .ok();
        }
        let Some(c) = conn.as_mut() else { continue };
        let mut ask = redis::cmd("SENTINEL");
        ask.arg("GET-MASTER-ADDR-BY-NAME").arg(&store.master_name);
        let asked = ask.query_async::<Option<Addr>>(c);
        match tokio::time::timeout(store.discovery_timeout, asked).await {
            Ok(Ok(Some(primary))) => store.primary_is(primary),
            // This sentinel does not know, or is gone: ask the next one.
            _ => conn = None,
        }
    }
}
