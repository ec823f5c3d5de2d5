//! The Lua scripts, loaded once per process and called by SHA.

use std::sync::LazyLock;

use redis::aio::ConnectionLike;
use redis::{ErrorKind, RedisResult, ServerErrorKind, Value};

/// One Lua file: its source and SHA1, computed once.
#[derive(Debug)]
pub(crate) struct LuaScript {
    pub(crate) name: &'static str,
    source: String,
    sha: String,
}

impl LuaScript {
    fn new(name: &'static str, source: String) -> Self {
        let sha = redis::Script::new(&source).get_hash().to_owned();
        Self { name, source, sha }
    }

    /// Peek scripts run unchanged but flagged read-only, so Redis refuses any
    /// write they might attempt and lets replicas run them (`EVALSHA_RO`).
    fn read_only(name: &'static str, source: &str) -> Self {
        Self::new(name, format!("#!lua flags=no-writes\n{source}"))
    }

    /// One round trip: `EVALSHA` (or `EVALSHA_RO`). Only when Redis answers
    /// `NOSCRIPT` (first use, `SCRIPT FLUSH`, a restarted or failed-over
    /// server) is the script loaded and the call repeated.
    pub(crate) async fn eval<C: ConnectionLike>(
        &self,
        conn: &mut C,
        keys: &[String],
        args: &[String],
        read_only: bool,
    ) -> RedisResult<Value> {
        let mut cmd = redis::cmd(if read_only { "EVALSHA_RO" } else { "EVALSHA" });
        cmd.arg(&self.sha).arg(keys.len()).arg(keys).arg(args);
        match cmd.query_async(conn).await {
            Err(err) if err.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                tracing::debug!(
                    script = self.name,
                    "NOSCRIPT: loading the script and retrying once"
                );
                let _: String = redis::cmd("SCRIPT")
                    .arg("LOAD")
                    .arg(&self.source)
                    .query_async(conn)
                    .await?;
                cmd.query_async(conn).await
            }
            other => other,
        }
    }

    /// Like [`eval`](Self::eval), but after `NOSCRIPT` sends the source with
    /// `EVAL` (or `EVAL_RO`) instead of `SCRIPT LOAD` + `EVALSHA`.
    ///
    /// For Redis Cluster. redis-rs routes `SCRIPT LOAD` to *every* node and
    /// fails it if any node fails, which is exactly the situation after a
    /// primary dies (Redis 7 does not replicate scripts, so the promoted
    /// replica answers `NOSCRIPT`); and with replica reads the repeated
    /// `EVALSHA_RO` could land on another replica than the one that lacked
    /// the script. `EVAL` is routed by the same keys as the `EVALSHA` it
    /// replaces, so it reaches the node that owns them (following `MOVED`
    /// and `ASK`), runs there, and leaves the script in that node's cache.
    pub(crate) async fn eval_routed_by_keys<C: ConnectionLike>(
        &self,
        conn: &mut C,
        keys: &[String],
        args: &[String],
        read_only: bool,
    ) -> RedisResult<Value> {
        let mut cmd = redis::cmd(if read_only { "EVALSHA_RO" } else { "EVALSHA" });
        cmd.arg(&self.sha).arg(keys.len()).arg(keys).arg(args);
        match cmd.query_async(conn).await {
            Err(err) if err.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                tracing::debug!(
                    script = self.name,
                    "NOSCRIPT on a cluster node: sending the source with EVAL"
                );
                redis::cmd(if read_only { "EVAL_RO" } else { "EVAL" })
                    .arg(&self.source)
                    .arg(keys.len())
                    .arg(keys)
                    .arg(args)
                    .query_async(conn)
                    .await
            }
            other => other,
        }
    }
}

/// Every script this crate runs.
#[derive(Debug)]
pub(crate) struct Scripts {
    pub(crate) fixed_window: LuaScript,
    pub(crate) fixed_window_peek: LuaScript,
    pub(crate) fixed_window_refund: LuaScript,
}

pub(crate) static SCRIPTS: LazyLock<Scripts> = LazyLock::new(|| {
    let fixed_window = include_str!("../../../lua/fixed_window.lua");
    Scripts {
        fixed_window: LuaScript::new("fixed_window", fixed_window.into()),
        fixed_window_peek: LuaScript::read_only("fixed_window_peek", fixed_window),
        fixed_window_refund: LuaScript::new(
            "fixed_window_refund",
            include_str!("../../../lua/fixed_window_refund.lua").into(),
        ),
    }
});
