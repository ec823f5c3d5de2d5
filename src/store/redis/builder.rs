//! How a [`RedisStore`] is made: the builder every constructor returns, and
//! the constructors on one server or on a connection you pass (`connect`,
//! `from_*`). Each topology's own (`cluster`, `sharded`, `sentinel`) is in
//! its file, with its options.

use std::num::NonZeroUsize;
use std::sync::atomic::AtomicI64;
use std::sync::Arc;
use std::time::Duration;

#[cfg(feature = "deadpool")]
use deadpool_redis::Pool;
use redis::aio::{ConnectionManager, ConnectionManagerConfig, MultiplexedConnection};
#[cfg(feature = "cluster")]
use redis::cluster_async::ClusterConnection;

use super::batchers::Batchers;
#[cfg(feature = "cluster")]
use super::connection::cluster::{Cluster, DEFAULT_RETRIES};
#[cfg(feature = "deadpool")]
use super::connection::pool::PooledConnection;
use super::connection::{tcp, Connection};
use super::server::{Scripting, ServerVersion};
use super::{ClockOffset, Inner, RedisStore};
use crate::clock::Clock;
use crate::error::{ConfigError, StoreError};
use crate::store::KeySpace;

/// Options for a [`RedisStore`]; made by its `from_*` constructors.
///
/// ```no_run
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// use tollgate::RedisStore;
/// use tollgate::clock::ManualClock;
/// let client = redis::Client::open("redis://127.0.0.1:6379/")?;
/// let conn = client.get_multiplexed_async_connection().await?;
/// let store = RedisStore::from_connection(conn)
///     .prefix("test")
///     .clock(ManualClock::new(0))
///     .build()?;
/// # Ok(()) }
/// ```
#[derive(Debug)]
#[must_use]
pub struct RedisStoreBuilder {
    conn: Connection,
    prefix: Option<String>,
    clock: Option<Arc<dyn Clock>>,
    pre_check: bool,
    batching: bool,
    leases: Option<super::Leases>,
    calls_in_flight: NonZeroUsize,
    version: Option<ServerVersion>,
}

impl RedisStoreBuilder {
    pub(crate) fn new(conn: Connection) -> Self {
        Self {
            conn,
            prefix: None,
            clock: None,
            pre_check: false,
            batching: true,
            leases: None,
            calls_in_flight: super::batch::MAX_IN_FLIGHT,
            version: None,
        }
    }

    /// Reads the server's version (`INFO server`; every shard's primary), so
    /// a server too old fails here rather than at the first request, and
    /// the store knows whether peeks may use `EVALSHA_RO` (Redis 7.0 on) or
    /// must run on the primary with `EVALSHA` (6.2). Every `connect` of this
    /// crate does it; a store `from_*` a connection of yours learns the
    /// latter at its first peek instead, unless you call this.
    ///
    /// # Errors
    ///
    /// [`StoreErrorKind::Unsupported`](crate::error::StoreErrorKind::Unsupported)
    /// before Redis 6.2, naming the version found and the one needed; any
    /// error of the `INFO` call itself.
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// let client = redis::Client::open("redis://127.0.0.1:6379/")?;
    /// let conn = client.get_multiplexed_async_connection().await?;
    /// let store = tollgate::RedisStore::from_connection(conn)
    ///     .check_server()
    ///     .await?
    ///     .build()?;
    /// # Ok(()) }
    /// ```
    pub async fn check_server(mut self) -> Result<Self, StoreError> {
        self.version = Some(self.conn.server_version().await?);
        Ok(self)
    }

    /// Puts every key under `prefix` (default `tollgate`); no braces or `|`.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = Some(prefix.into());
        self
    }

    /// Sends this clock's time to the scripts instead of using Redis `TIME`.
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Some(Arc::new(clock));
        self
    }

    /// Asks a replica first whether a charge would fit, and only then the
    /// primary; off by default.
    ///
    /// Under a flood most requests are rejections. With a pre-check they are
    /// decided by a read-only run of the same script, with the same cost, on
    /// a replica (`EVALSHA_RO`, see `read_from_replicas` on
    /// [`ClusterConfig`](super::ClusterConfig),
    /// [`ShardedConfig`](super::ShardedConfig) and
    /// [`SentinelConfig`](super::SentinelConfig)), so the
    /// primaries only see requests that will probably pass. A rejection's
    /// headers come from that one reply. A request the replica admits is then
    /// charged, and decided, by the primary as usual: the primary alone ever
    /// admits, so the limit holds however far a replica lags.
    ///
    /// The price: a request that passes costs two round trips, and a replica
    /// a few milliseconds behind may reject a request the primary would just
    /// have admitted (a refund or a window that ended on the primary since;
    /// a window whose stored end is past is empty on every server). Not used
    /// for the concurrency limit, whose rejections end whenever a response
    /// does. Without replica reads the pre-check goes to the primary too,
    /// which only adds a round trip; `build` then logs a warning.
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// use tollgate::RedisStore;
    /// use tollgate::store::Shard;
    ///
    /// let store = RedisStore::sharded([
    ///     Shard::new("a", "redis://10.0.0.1:6379/").replica("redis://10.0.0.2:6379/"),
    /// ])
    /// .read_from_replicas(true)
    /// .connect()
    /// .await?
    /// .pre_check(true)
    /// .build()?;
    /// # Ok(()) }
    /// ```
    pub fn pre_check(mut self, yes: bool) -> Self {
        self.pre_check = yes;
        self
    }

    /// Sends the decisions of concurrent requests together, in one script
    /// call per server (on by default). On Redis Cluster a call may only
    /// touch one hash slot's keys, so decisions batch per set of keys (one
    /// caller's, in practice), one call in flight for each: a flood from
    /// one caller batches, a crowd of callers does not (each decision goes
    /// alone: one `EVALSHA`, with a little bookkeeping on top).
    ///
    /// A decision that finds fewer than four calls on their way (see
    /// [`calls_in_flight`](Self::calls_in_flight); on a cluster, none for
    /// its keys) goes out at once, alone, as without
    /// batching. Past that, decisions queue, and a
    /// call that comes back hands its slot to whatever queued: one call of
    /// `lua/batch.lua`, which runs each decision exactly as its own script
    /// would, one after the other. Redis then parses, dispatches, replies
    /// and reads `TIME` once per batch rather than once per decision. A
    /// queued decision whose request gave up is dropped, never charged.
    /// Turn it off to see one `EVALSHA` per decision in `INFO commandstats`.
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// let client = redis::Client::open("redis://127.0.0.1:6379/")?;
    /// let conn = client.get_multiplexed_async_connection().await?;
    /// let store = tollgate::RedisStore::from_connection(conn).batching(false).build()?;
    /// # Ok(()) }
    /// ```
    pub fn batching(mut self, yes: bool) -> Self {
        self.batching = yes;
        self
    }

    /// How many batching calls may be on their way to one server (a shard's
    /// primary) before concurrent decisions queue for the next batch; 4 by
    /// default. Redis Cluster keeps one per set of keys whatever is set here.
    ///
    /// Fewer calls make bigger batches, so Redis and the app spend less CPU
    /// per decision, at the price of waits: a decision that finds every
    /// call taken waits for one to come back. Choose 1 or 2 where Redis's
    /// CPU, or a core the app shares with it, is what runs out: fewer calls
    /// serve more decisions per second there, at a higher p99. Over a
    /// network a wait costs a round trip, so keep the default there.
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// use std::num::NonZeroUsize;
    /// let client = redis::Client::open("redis://127.0.0.1:6379/")?;
    /// let conn = client.get_multiplexed_async_connection().await?;
    /// let store = tollgate::RedisStore::from_connection(conn)
    ///     .calls_in_flight(NonZeroUsize::MIN)
    ///     .build()?;
    /// # Ok(()) }
    /// ```
    pub fn calls_in_flight(mut self, calls: NonZeroUsize) -> Self {
        self.calls_in_flight = calls;
        self
    }

    /// Leases hot callers' budgets ([`Leases`](super::Leases)): a caller
    /// decided often on this server is decided from a slice of its budget
    /// that Redis charged first, in memory, and what is unspent is given
    /// back. Off by default; fixed window, aligned window (one quota) and
    /// GCRA policies lease, others decide in Redis every time.
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// use tollgate::{Leases, RedisStore};
    /// let store = RedisStore::connect_builder("redis://127.0.0.1:6379/")
    ///     .await?
    ///     .leases(Leases::new())
    ///     .build()?;
    /// # let _ = store; Ok(()) }
    /// ```
    pub fn leases(mut self, leases: super::Leases) -> Self {
        self.leases = Some(leases);
        self
    }

    /// The store, or why the options cannot work.
    pub fn build(self) -> Result<RedisStore, ConfigError> {
        if self.pre_check && !self.conn.reads_from_replicas() {
            tracing::warn!(
                "pre-check on without replica reads: it runs on the primary and only adds a round trip"
            );
        }
        let keys = match self.prefix {
            Some(prefix) => KeySpace::new(prefix)?,
            None => KeySpace::default(),
        };
        let batchers = Batchers::new(&self.conn, self.batching, self.calls_in_flight);
        Ok(RedisStore {
            inner: Arc::new(Inner {
                batchers,
                conn: self.conn,
                keys,
                clock: self.clock,
                pre_check: self.pre_check,
                scripting: Arc::new(Scripting::new(self.version)),
                offset: ClockOffset(AtomicI64::new(ClockOffset::UNKNOWN)),
                leases: self.leases.map(super::lease::LeaseTable::new),
                policy_limits: Default::default(),
                watching_limits: Default::default(),
            }),
        })
    }
}

impl RedisStore {
    /// Connects to `url` with a [`ConnectionManager`], which reconnects in
    /// the background when Redis restarts, and fails fast while it is gone.
    ///
    /// Without redis-rs's response timeout: the layer's deadline already
    /// bounds every call the store makes for a request, and a second timer
    /// per call would cost each lone decision a wake-up of the runtime (a
    /// timeout does not make redis-rs reconnect either way).
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// use std::num::NonZeroU32;
    /// use tollgate::{Policy, Quota, RateLimitLayer, RedisStore};
    ///
    /// let store = RedisStore::connect("redis://127.0.0.1:6379/").await?;
    /// let layer = RateLimitLayer::builder()
    ///     .policy(Policy::fixed_window("core", Quota::per_hour(NonZeroU32::new(5000).unwrap())))
    ///     .store(store)
    ///     .build()?;
    /// # let _ = layer;
    /// # Ok(()) }
    /// ```
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        Ok(Self::connect_builder(url)
            .await?
            .build()
            .expect("the default options are valid"))
    }

    /// Connects as [`connect`](Self::connect) does, and hands back the
    /// builder, for a store on that connection with options of its own.
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// let store = tollgate::RedisStore::connect_builder("redis://127.0.0.1:6379/")
    ///     .await?
    ///     .prefix("zoo")
    ///     .build()?;
    /// # Ok(()) }
    /// ```
    pub async fn connect_builder(url: &str) -> Result<RedisStoreBuilder, StoreError> {
        let client = tcp::client(url)?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(Duration::from_secs(1)))
            .set_response_timeout(None)
            .set_number_of_retries(2)
            .set_max_delay(Duration::from_millis(500));
        let manager = ConnectionManager::new_with_config(client, config).await?;
        Self::from_manager(manager).check_server().await
    }

    /// Over a [`ConnectionManager`].
    ///
    /// Connections you make yourself should turn on `TCP_NODELAY`, which
    /// redis-rs leaves off (the store's own constructors turn it on):
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// use redis::io::tcp::TcpSettings;
    /// use redis::IntoConnectionInfo;
    ///
    /// let info = "redis://127.0.0.1:6379/"
    ///     .into_connection_info()?
    ///     .set_tcp_settings(TcpSettings::default().set_nodelay(true));
    /// let manager = redis::Client::open(info)?.get_connection_manager().await?;
    /// let store = tollgate::RedisStore::from_manager(manager).build()?;
    /// # Ok(()) }
    /// ```
    pub fn from_manager(conn: ConnectionManager) -> RedisStoreBuilder {
        RedisStoreBuilder::new(Connection::Manager(conn))
    }

    /// Over one [`MultiplexedConnection`]; it does not reconnect by itself.
    /// Turn on `TCP_NODELAY` (see [`from_manager`](Self::from_manager)).
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// use redis::io::tcp::TcpSettings;
    /// use redis::IntoConnectionInfo;
    ///
    /// let info = "redis://127.0.0.1:6379/"
    ///     .into_connection_info()?
    ///     .set_tcp_settings(TcpSettings::default().set_nodelay(true));
    /// let conn = redis::Client::open(info)?.get_multiplexed_async_connection().await?;
    /// let store = tollgate::RedisStore::from_connection(conn).prefix("myapp").build()?;
    /// # Ok(()) }
    /// ```
    pub fn from_connection(conn: MultiplexedConnection) -> RedisStoreBuilder {
        RedisStoreBuilder::new(Connection::Multiplexed(conn))
    }

    #[cfg(feature = "deadpool")]
    #[cfg_attr(docsrs, doc(cfg(feature = "deadpool")))]
    /// Over a deadpool-redis pool (with `TCP_NODELAY`, see
    /// [`from_manager`](Self::from_manager)). One connection is checked out and shared
    /// (it is multiplexed) until it breaks, so the pool's health check does
    /// not add a round trip to every decision.
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// use deadpool_redis::{Config, Runtime};
    ///
    /// let pool = Config::from_url("redis://127.0.0.1:6379/").create_pool(Some(Runtime::Tokio1))?;
    /// let store = tollgate::RedisStore::from_pool(pool).build()?;
    /// # Ok(()) }
    /// ```
    pub fn from_pool(pool: Pool) -> RedisStoreBuilder {
        RedisStoreBuilder::new(Connection::Pool(Arc::new(PooledConnection::new(pool))))
    }

    #[cfg(feature = "cluster")]
    #[cfg_attr(docsrs, doc(cfg(feature = "cluster")))]
    /// Over a Redis Cluster connection: each decision's keys share a hash tag,
    /// so a script always runs on the one node that owns them, and the store
    /// follows redirections itself (see [`ClusterConfig`](super::ClusterConfig)). Prefer
    /// [`RedisStore::cluster`]: it also turns off redis-rs's own retries,
    /// which wait 1.28 s or more between attempts by default and can lose
    /// `ASKING` to a concurrent request during a slot migration.
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// let client = redis::cluster::ClusterClient::new(["redis://127.0.0.1:7000/"])?;
    /// let conn = client.get_async_connection().await?;
    /// let store = tollgate::RedisStore::from_cluster(conn).build()?;
    /// # Ok(()) }
    /// ```
    pub fn from_cluster(conn: ClusterConnection) -> RedisStoreBuilder {
        RedisStoreBuilder::new(Connection::Cluster(Cluster {
            conn,
            retries: DEFAULT_RETRIES,
            // Its read routing is the caller's: assume it may use replicas.
            read_from_replicas: true,
        }))
    }
}
