//! TCP settings for every connection the store opens.

use redis::io::tcp::TcpSettings;
use redis::{Client, IntoConnectionInfo, RedisResult};

/// TCP settings for every connection the store opens: `TCP_NODELAY`, which
/// redis-rs leaves off. With Nagle's algorithm on, a script call written
/// while an earlier one is unacknowledged waits for that acknowledgement,
/// which under concurrent decisions adds a round trip to many of them.
pub(crate) fn tcp_settings() -> TcpSettings {
    TcpSettings::default().set_nodelay(true)
}

/// A client for `url` with [`tcp_settings`].
pub(crate) fn client(url: impl IntoConnectionInfo) -> RedisResult<Client> {
    let info = url.into_connection_info()?.set_tcp_settings(tcp_settings());
    Client::open(info)
}
