//! A store on the primary that Redis Sentinel names: its options, and
//! connecting to it (the connection that follows failovers is
//! `connection/sentinel.rs`).

use std::time::Duration;

use super::builder::RedisStoreBuilder;
use super::connection::sentinel::SentinelConnection;
use super::connection::Connection;
use super::RedisStore;
use crate::error::StoreError;

/// A [`RedisStore`](crate::RedisStore) on the primary that Redis Sentinel
/// names; made by [`RedisStore::sentinel`](crate::RedisStore::sentinel).
///
/// The store asks the sentinels for the primary, keeps one multiplexed
/// connection to it, and asks again when that connection breaks, the server
/// answers `READONLY` (it was demoted), or the sentinels name another primary:
/// a background task asks one of them every 250 ms. That last check matters
/// after an ordered failover: the old primary is alive and keeps accepting
/// writes until Sentinel gets round to demoting it (seconds later), and
/// everything written there meanwhile is discarded. Until Sentinel has
/// promoted a replica, decisions fail fast, and the layer's
/// [`FailurePolicy`](crate::FailurePolicy) answers them.
///
/// A failover may still lose the writes the old primary took just before
/// the switch and had not sent to its replica (replication is asynchronous):
/// callers may then get those few requests again.
///
/// With [`read_from_replicas`](Self::read_from_replicas), peeks and
/// pre-checks go to a replica the sentinels list.
///
/// ```no_run
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// use tollgate::RedisStore;
///
/// let store = RedisStore::sentinel(
///     ["redis://10.0.0.1:26379/", "redis://10.0.0.2:26379/", "redis://10.0.0.3:26379/"],
///     "mymaster",
/// )
/// .connect()
/// .await?
/// .build()?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
#[must_use]
pub struct SentinelConfig {
    sentinels: Vec<String>,
    master_name: String,
    read_from_replicas: bool,
    connection_timeout: Duration,
    response_timeout: Duration,
}

impl SentinelConfig {
    pub(crate) fn new(
        sentinels: impl IntoIterator<Item = impl Into<String>>,
        master_name: impl Into<String>,
    ) -> Self {
        Self {
            sentinels: sentinels.into_iter().map(Into::into).collect(),
            master_name: master_name.into(),
            read_from_replicas: false,
            connection_timeout: Duration::from_secs(1),
            response_timeout: Duration::from_secs(1),
        }
    }

    /// Sends peeks and pre-checks (`EVALSHA_RO`; see
    /// [`RedisStoreBuilder::pre_check`](crate::store::RedisStoreBuilder::pre_check))
    /// to one replica the sentinels list as healthy, and to the primary when
    /// there is none or it fails; the store looks for another in the
    /// background. Off by default. Charging scripts always go to the primary.
    ///
    /// A replica may lag a little, so a peek may show slightly older numbers;
    /// it never shows an ended window as exhausted, because the scripts treat
    /// a stored window end in the past as an empty window.
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// let store = tollgate::RedisStore::sentinel(["redis://127.0.0.1:26379/"], "mymaster")
    ///     .read_from_replicas(true)
    ///     .connect()
    ///     .await?
    ///     .build()?;
    /// # Ok(()) }
    /// ```
    pub fn read_from_replicas(mut self, yes: bool) -> Self {
        self.read_from_replicas = yes;
        self
    }

    /// How long to wait for a TCP connection, and for each reply (default
    /// 1 s each); asking the sentinels may take up to twice the first.
    pub fn timeouts(mut self, connection: Duration, response: Duration) -> Self {
        self.connection_timeout = connection;
        self.response_timeout = response;
        self
    }

    /// Asks the sentinels for the primary and connects to it; an error if no
    /// sentinel names a reachable primary now.
    pub async fn connect(self) -> Result<RedisStoreBuilder, StoreError> {
        let conn = SentinelConnection::connect(
            &self.sentinels,
            self.master_name,
            self.read_from_replicas,
            self.connection_timeout,
            self.response_timeout,
        )
        .await?;
        RedisStoreBuilder::new(Connection::Sentinel(conn))
            .check_server()
            .await
    }
}

impl RedisStore {
    #[cfg_attr(docsrs, doc(cfg(feature = "sentinel")))]
    /// The primary that the Redis Sentinels at `sentinels` monitor as
    /// `master_name`, followed through failovers; see [`SentinelConfig`].
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// let store = tollgate::RedisStore::sentinel(["redis://127.0.0.1:26379/"], "mymaster")
    ///     .connect()
    ///     .await?
    ///     .build()?;
    /// # Ok(()) }
    /// ```
    pub fn sentinel(
        sentinels: impl IntoIterator<Item = impl Into<String>>,
        master_name: impl Into<String>,
    ) -> SentinelConfig {
        SentinelConfig::new(sentinels, master_name)
    }
}
