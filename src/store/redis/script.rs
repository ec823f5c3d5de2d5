//! The Lua scripts, loaded once per process and called by SHA.

use std::fmt;
use std::sync::LazyLock;

use redis::aio::ConnectionLike;
use redis::{Cmd, ErrorKind, RedisError, RedisResult, ServerErrorKind, ToRedisArgs, Value};

use crate::error::{StoreError, StoreErrorKind};

/// A Redis error from inside a script, naming the script and the line of
/// its text that failed, and the command that prints that text, numbered,
/// exactly as Redis runs it.
#[derive(Debug)]
pub(crate) struct ScriptError {
    script: &'static str,
    line: Option<u32>,
    source: RedisError,
}

impl fmt::Display for ScriptError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "script {} (", self.script)?;
        if let Some(line) = self.line {
            write!(f, "line {line}; ")?;
        }
        write!(
            f,
            "`cargo run --all-features --example lua -- {}` prints it): {}",
            self.script, self.source
        )
    }
}

impl std::error::Error for ScriptError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.source)
    }
}

/// The line number in Redis's `@user_script:N:` (Redis 6.2) or
/// `@user_script:N.` (7.0 on) of an error from inside a script.
fn script_line(message: &str) -> Option<u32> {
    let at = message.find("user_script:")? + "user_script:".len();
    let digits: String = message[at..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().ok()
}

/// `name` with `suffix`, as a name that lives as long as the scripts (they
/// are built once per process, into a static).
fn suffixed(name: &str, suffix: &str) -> &'static str {
    Box::leak(format!("{name}{suffix}").into_boxed_str())
}

/// One Lua file: its source and SHA1, computed once.
#[derive(Debug)]
pub(crate) struct LuaScript {
    pub(crate) name: &'static str,
    source: String,
    sha: String,
    /// A read-only script's twin without the `no-writes` flag, for servers
    /// before Redis 7.0, which know no script flags.
    plain: Option<Box<LuaScript>>,
    /// The batch wrapper of a writing script that batches.
    batch: Option<Box<LuaScript>>,
    /// Where the script takes its request id among its arguments, if it
    /// takes one.
    id_at: Option<usize>,
    /// For a script whose pass holds something until given back: the
    /// script that gives it back, and its arguments, from the script's.
    give_back: Option<GiveBackOf>,
}

/// The give-back of what a pass of a script held, from the script's
/// arguments: the releasing script and its arguments.
pub(crate) type GiveBackOf = fn(&[i64]) -> Option<(&'static LuaScript, Args)>;

/// A decision script's arguments, all integers: inline for every one-quota
/// policy, so a decision allocates no argument list.
pub(crate) type Args = smallvec::SmallVec<[i64; 8]>;

impl LuaScript {
    pub(crate) fn new(name: &'static str, source: String) -> Self {
        let sha = redis::Script::new(&source).get_hash().to_owned();
        Self {
            name,
            source,
            sha,
            plain: None,
            batch: None,
            id_at: None,
            give_back: None,
        }
    }

    /// This script, sent in batches by `batch` (see [`batch_of`](Self::batch_of)
    /// and [`batch_with`](Self::batch_with)).
    pub(crate) fn batched(self, batch: LuaScript) -> Self {
        Self {
            batch: Some(Box::new(batch)),
            ..self
        }
    }

    /// This script, which takes its request id as its argument `at`
    /// (0-based: `ARGV[at + 1]`).
    pub(crate) fn taking_id_at(self, at: usize) -> Self {
        Self {
            id_at: Some(at),
            ..self
        }
    }

    /// This script, whose pass holds something until `give_back` says how
    /// to give it back.
    pub(crate) fn holding(self, give_back: GiveBackOf) -> Self {
        Self {
            give_back: Some(give_back),
            ..self
        }
    }

    /// The script's name, unique among the scripts: what an error names,
    /// its row in `lua/SENT.md`, and what `examples/lua.rs` prints it by.
    pub(crate) fn name(&self) -> &'static str {
        self.name
    }

    /// `err` from a call of this script, as the store reports it: an error
    /// the server raised while running the script names the script and its
    /// line; connection trouble stays as it is.
    pub(crate) fn error(&self, err: RedisError) -> StoreError {
        let kind = StoreErrorKind::of(&err);
        // Server replies carry a code (`ERR`, `WRONGTYPE`, ...); connection
        // trouble has none.
        if err.code().is_none() {
            return StoreError::from(err);
        }
        let line = script_line(&err.to_string());
        StoreError::new(
            kind,
            ScriptError {
                script: self.name,
                line,
                source: err,
            },
        )
    }

    /// The text exactly as Redis gets it (`SCRIPT LOAD`, `EVAL`).
    pub(crate) fn source(&self) -> &str {
        &self.source
    }

    /// This script without its `no-writes` flag (itself if it has none):
    /// what a server before Redis 7.0 runs, with `EVALSHA`.
    pub(crate) fn plain(&self) -> &LuaScript {
        self.plain.as_deref().unwrap_or(self)
    }

    /// The unflagged twin, where this script has one.
    pub(crate) fn unflagged(&self) -> Option<&LuaScript> {
        self.plain.as_deref()
    }

    /// The batch wrapper, where this script has one.
    pub(crate) fn batch(&self) -> Option<&LuaScript> {
        self.batch.as_deref()
    }

    /// A charging decision script whose integers come back packed in one
    /// string, which the client reads without a parser, and which charges
    /// nothing when it runs after the time its last argument gives
    /// (`lua/timed.lua`).
    pub(crate) fn decision(name: &'static str, source: &str) -> Self {
        Self::new(name, timed(source))
    }

    /// A [decision](Self::decision) script wrapped by a caller's rules
    /// (`lua/caller.lua`): what a policy with an override or a penalty box
    /// runs.
    pub(crate) fn decision_with_caller(name: &'static str, source: &str) -> Self {
        Self::new(name, timed_with_caller(source))
    }

    /// A script whose integers come back packed in one string
    /// (`lua/packed.lua`), with no time to keep: a give-back, which is
    /// right however late it runs.
    pub(crate) fn packed(name: &'static str, source: &str) -> Self {
        Self::new(name, packed(source))
    }

    /// A strategy's refund (or other give-back) script, after the
    /// helpers every strategy's script may use (`lua/prelude.lua`).
    pub(crate) fn refund(name: &'static str, source: &str) -> Self {
        Self::new(name, format!("{PRELUDE}{source}"))
    }

    /// A script flagged read-only, so Redis refuses any write and lets
    /// replicas run it (`EVALSHA_RO`).
    pub(crate) fn read_only(name: &'static str, source: &str) -> Self {
        Self {
            plain: Some(Box::new(Self::new(
                suffixed(name, ".noflags"),
                source.to_owned(),
            ))),
            ..Self::new(name, format!("#!lua flags=no-writes\n{source}"))
        }
    }

    /// The no-writes twin of a decision script, for peeks and pre-checks:
    /// [read-only](Self::read_only), run by `lua/peek.lua` with its
    /// `dry_run` argument true, so it decides as if charging the cost it
    /// is given and writes nothing; its reply packed as the
    /// [decision](Self::decision)'s is.
    pub(crate) fn dry_run(name: &'static str, source: &str) -> Self {
        Self::read_only(
            name,
            &(as_decide(source) + include_str!("../../../lua/peek.lua")),
        )
    }

    /// The batch wrapper of a decision script (`lua/batch.lua`): runs several
    /// decisions, each exactly as the script alone would, in one call.
    pub(crate) fn batch_of(name: &'static str, source: &str) -> Self {
        Self::batch_with(
            suffixed(name, "_batch"),
            &format!(
                "{}local function flush() end\n{}",
                as_function("run", source),
                include_str!("../../../lua/batch_decide.lua")
            ),
        )
    }

    /// [`batch_of`](Self::batch_of) with each decision wrapped by a
    /// caller's rules (`lua/caller.lua`).
    pub(crate) fn batch_of_caller(name: &'static str, source: &str) -> Self {
        Self::batch_with(
            suffixed(name, "_batch"),
            &format!(
                "{}{CALLER}run = with_caller(run)\nlocal function flush() end\n{}",
                as_function("run", source),
                include_str!("../../../lua/batch_decide.lua")
            ),
        )
    }

    /// `lua/batch.lua` after `decide_and_flush`, a strategy's own batch
    /// functions `decide(keys, args)` and `flush()`, which may use the
    /// helpers of `lua/batch_prelude.lua`.
    pub(crate) fn batch_with(name: &'static str, decide_and_flush: &str) -> Self {
        Self::new(
            name,
            format!(
                "{PRELUDE}{}\n{decide_and_flush}\n{}",
                include_str!("../../../lua/batch_prelude.lua"),
                include_str!("../../../lua/batch.lua")
            ),
        )
    }

    /// One round trip: `EVALSHA` (or `EVALSHA_RO`). Only when Redis answers
    /// `NOSCRIPT` (first use, `SCRIPT FLUSH`, a restarted or failed-over
    /// server) is the script loaded and the call repeated.
    pub(crate) async fn eval<C: ConnectionLike, A: ToRedisArgs + Sync>(
        &self,
        conn: &mut C,
        keys: &[String],
        args: &[A],
        read_only: bool,
    ) -> RedisResult<Value> {
        let cmd = self.evalsha_cmd(keys, args, read_only);
        match cmd.query_async(conn).await {
            Err(err) if err.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                // Boxed: the rare path's futures would otherwise enlarge
                // every call's.
                Box::pin(self.load_and_retry(conn, cmd)).await
            }
            other => other,
        }
    }

    /// After `NOSCRIPT`: loads the script and sends `cmd` again, once.
    async fn load_and_retry<C: ConnectionLike>(
        &self,
        conn: &mut C,
        cmd: Cmd,
    ) -> RedisResult<Value> {
        tracing::debug!(
            script = self.name,
            "NOSCRIPT: loading the script and retrying once"
        );
        crate::metrics::script_reload(self.name);
        let _: String = redis::cmd("SCRIPT")
            .arg("LOAD")
            .arg(&self.source)
            .query_async(conn)
            .await?;
        cmd.query_async(conn).await
    }

    /// `EVALSHA` (or `EVALSHA_RO`) of this script.
    pub(crate) fn evalsha_cmd<A: ToRedisArgs>(
        &self,
        keys: &[String],
        args: &[A],
        read_only: bool,
    ) -> Cmd {
        let mut cmd = redis::cmd(if read_only { "EVALSHA_RO" } else { "EVALSHA" });
        cmd.arg(&self.sha).arg(keys.len()).arg(keys).arg(args);
        cmd
    }

    #[cfg_attr(not(feature = "cluster"), allow(dead_code))]
    /// `EVAL` (or `EVAL_RO`) with the source: runs the script on a node that
    /// has not cached it, and caches it there.
    pub(crate) fn eval_cmd<A: ToRedisArgs>(
        &self,
        keys: &[String],
        args: &[A],
        read_only: bool,
    ) -> Cmd {
        let mut cmd = redis::cmd(if read_only { "EVAL_RO" } else { "EVAL" });
        cmd.arg(&self.source).arg(keys.len()).arg(keys).arg(args);
        cmd
    }
}

/// A whole script as the local function `name(KEYS, ARGV, dry_run)`, for
/// a wrapper that follows to call: its `return`s then hand a value to the
/// wrapper, and the wrapper says whether it may write.
fn as_function(name: &str, source: &str) -> String {
    format!("local function {name}(KEYS, ARGV, dry_run)\n{source}\nend\n")
}

/// A lone script `source` as the function `decide(KEYS, ARGV, dry_run)`,
/// the prelude (`lua/prelude.lua`) inside it, first: its helpers are then
/// the function's own locals, as cheap to call as if the script defined
/// them itself; as the script's upvalues, every helper call would be an
/// upvalue lookup in Redis.
fn as_decide(source: &str) -> String {
    as_function("decide", &format!("{PRELUDE}{source}"))
}

/// `source` as the function `decide`, its reply packed by `lua/packed.lua`.
fn packed(source: &str) -> String {
    as_decide(source) + include_str!("../../../lua/packed.lua")
}

/// `source` as the function `decide`, run by `lua/timed.lua`.
fn timed(source: &str) -> String {
    as_decide(source) + include_str!("../../../lua/timed.lua")
}

/// `source` as the function `decide`, wrapped by a caller's rules
/// (`lua/caller.lua`).
fn with_caller(source: &str) -> String {
    format!(
        "{}{CALLER}decide = with_caller(decide)\n",
        as_decide(source)
    )
}

/// [`with_caller`], run by `lua/timed.lua`.
fn timed_with_caller(source: &str) -> String {
    with_caller(source) + include_str!("../../../lua/timed.lua")
}

/// A caller's own rules around a decision: an override, the penalty box.
const CALLER: &str = include_str!("../../../lua/caller.lua");

/// What every strategy's script starts with: the helpers they share.
const PRELUDE: &str = include_str!("../../../lua/prelude.lua");

/// The scripts every strategy shares; each strategy's own are in its file
/// (`strategy/<name>.rs`), as a [`Trio`].
#[derive(Debug)]
pub(crate) struct Scripts {
    /// Forgets a caller's state under a policy (lua/reset.lua).
    pub(crate) reset: LuaScript,
    /// An operator's change to an override (lua/override.lua).
    pub(crate) overrides: LuaScript,
    /// An operator's block of a caller (lua/block.lua).
    pub(crate) block: LuaScript,
}

impl Scripts {
    /// For a script whose pass holds something until given back (the
    /// concurrency check's slots): the script that gives it back, and its
    /// arguments, from the check's `args`; the strategy says which.
    pub(crate) fn give_back_of(
        &self,
        script: &LuaScript,
        args: &[i64],
    ) -> Option<(&'static LuaScript, Args)> {
        script.give_back?(args)
    }

    /// Where the writing script `script` takes its request id among its
    /// arguments, if it takes one (its strategy says where): in a flood,
    /// the one argument that differs from the decision before, and all a
    /// batch sends of it.
    pub(crate) fn id_at(&self, script: &LuaScript) -> Option<usize> {
        script.id_at
    }
}

/// A strategy's scripts: its decision script (batched), the same flagged
/// read-only for peeks, its refund (or release) script, and the decision
/// and peek wrapped by a caller's own rules (`lua/caller.lua`), for a
/// policy that has them.
#[derive(Debug)]
pub(crate) struct Trio {
    pub(crate) check: LuaScript,
    pub(crate) peek: LuaScript,
    pub(crate) refund: LuaScript,
    pub(crate) caller_check: LuaScript,
    pub(crate) caller_peek: LuaScript,
}

impl Trio {
    /// The decision script `check` named `name`, its no-writes twin
    /// `<name>_peek`, and `refund`. Its batches run `own_batch` (a
    /// strategy's `lua/<name>_batch.lua`, which reads and writes each key
    /// once per call, not per decision), or else each decision's script.
    pub(crate) fn new(
        name: &'static str,
        check: &str,
        own_batch: Option<&str>,
        refund: LuaScript,
    ) -> Self {
        let batch = match own_batch {
            Some(source) => LuaScript::batch_with(suffixed(name, "_batch"), source),
            None => LuaScript::batch_of(name, check),
        };
        let caller = suffixed(name, "_caller");
        Self {
            check: LuaScript::decision(name, check).batched(batch),
            peek: LuaScript::dry_run(suffixed(name, "_peek"), check),
            refund,
            caller_check: LuaScript::new(caller, timed_with_caller(check))
                .batched(LuaScript::batch_of_caller(caller, check)),
            caller_peek: LuaScript::read_only(
                suffixed(name, "_caller_peek"),
                &(with_caller(check) + include_str!("../../../lua/peek.lua")),
            ),
        }
    }

    /// The decision script wrapped by a caller's rules, or its read-only
    /// twin.
    pub(crate) fn decide_with_caller(&self, read_only: bool) -> &LuaScript {
        if read_only {
            &self.caller_peek
        } else {
            &self.caller_check
        }
    }

    /// The decision script, or its read-only twin.
    pub(crate) fn decide(&self, read_only: bool) -> &LuaScript {
        if read_only {
            &self.peek
        } else {
            &self.check
        }
    }
}

pub(crate) static SCRIPTS: LazyLock<Scripts> = LazyLock::new(|| Scripts {
    reset: LuaScript::new("reset", include_str!("../../../lua/reset.lua").into()),
    overrides: LuaScript::new("override", include_str!("../../../lua/override.lua").into()),
    block: LuaScript::new("block", include_str!("../../../lua/block.lua").into()),
});

/// The high-volume mode's bloom-filter sync: merges this server's callers
/// into a shared slot (`lua/bloom_merge.lua`).
#[cfg(feature = "throttle")]
pub(crate) static BLOOM_MERGE: LazyLock<LuaScript> = LazyLock::new(|| {
    LuaScript::new(
        "bloom_merge",
        include_str!("../../../lua/bloom_merge.lua").into(),
    )
});

/// Reads the shared slots back (`lua/bloom_read.lua`).
#[cfg(feature = "throttle")]
pub(crate) static BLOOM_READ: LazyLock<LuaScript> = LazyLock::new(|| {
    LuaScript::read_only("bloom_read", include_str!("../../../lua/bloom_read.lua"))
});
