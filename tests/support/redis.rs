//! Real `redis-server` processes for integration tests: single servers,
//! replicas, clusters and sentinels, each on a free loopback port in its own
//! temporary directory, with no persistence.
//!
//! The system Redis on 127.0.0.1:6379 is never used or touched.
//!
//! # Why no server outlives its test binary
//!
//! Each `redis-server` runs under a small `sh` supervisor ([`SUPERVISOR`])
//! whose stdin is a pipe whose only writer is the test process. A guard
//! subshell blocks reading that pipe:
//!
//! - [`RedisServer::stop`] and `Drop` write `stop\n` and close the pipe: the
//!   guard `kill -9`s the server and the supervisor reaps it, and we `wait` for
//!   the supervisor, so the port is free and nothing is left as a zombie.
//! - If the test process dies without running `Drop` (the [`shared_url`]
//!   server lives in a `static`, a test calls `process::exit`, or the binary is
//!   killed), the kernel closes the pipe, the guard reads EOF, kills the server
//!   and deletes its temporary directory.
//!
//! This needs neither `unsafe`, `libc` nor polling of the parent's pid.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::fs::{self, File, OpenOptions};
use std::io::Write as _;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock, PoisonError};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tempfile::TempDir;

/// How long to sleep between two polls of a server's state.
const POLL: Duration = Duration::from_millis(25);
/// How long a fresh process may take to answer PING.
const START_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a replica may take to catch up with its primary.
const REPLICATION_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a cluster may take to converge (creation, failover, rejoin).
const CLUSTER_TIMEOUT: Duration = Duration::from_secs(30);
/// How long sentinels may take to discover each other, or to fail over.
const SENTINEL_TIMEOUT: Duration = Duration::from_secs(30);
/// Boot attempts before giving up on port clashes.
const BOOT_ATTEMPTS: usize = 8;
/// The system Redis, which tests must never use.
const SYSTEM_REDIS_PORT: u16 = 6379;
/// Number of hash slots in a Redis Cluster.
const SLOTS: usize = 16384;

/// `sh -c` script that runs `$TOLLGATE_REDIS_SERVER` with `$2..` and kills it
/// when its stdin closes; on EOF without a `stop` line it also removes `$1`
/// (the server's temporary directory), because then no `Drop` will.
///
/// The binary comes through the environment so that the supervisor's own
/// command line does not match `pgrep -f redis-server`.
///
/// The guard records why it fired in `supervisor.state` *before* killing the
/// server, so once the server is reaped the supervisor knows whether to wait
/// for the guard (it fired) or to kill it (the server exited on its own).
const SUPERVISOR: &str = r#"
exec 3<&0 </dev/null
bin=$TOLLGATE_REDIS_SERVER
unset TOLLGATE_REDIS_SERVER
dir=$1
shift
mark="$dir/supervisor.state"
rm -f "$mark"
"$bin" "$@" 3<&- &
server=$!
(
  if read -r line <&3; then echo stop >"$mark"; else echo orphan >"$mark"; fi
  kill -9 "$server" 2>/dev/null
) &
guard=$!
exec 3<&-
wait "$server"
status=$?
if [ ! -e "$mark" ]; then kill "$guard" 2>/dev/null; fi
wait "$guard"
if [ "$(cat "$mark" 2>/dev/null)" = orphan ]; then rm -rf "$dir"; else rm -f "$mark"; fi
exit "$status"
"#;

/// One `redis-server` (or `redis-server --sentinel`) process on a free
/// loopback port, killed on drop.
pub struct RedisServer {
    port: u16,
    /// Cluster bus port, passed as `--cluster-port` when cluster mode is on.
    bus_port: Option<u16>,
    dir: TempDir,
    conf: PathBuf,
    sentinel: bool,
    extra: Vec<String>,
    process: Mutex<Option<Child>>,
}

impl RedisServer {
    /// Starts a standalone server and waits until it answers PING.
    pub fn start() -> RedisServer {
        RedisServer::start_with(&[])
    }

    /// Starts a server with extra config args (e.g. `["--cluster-enabled", "yes"]`).
    ///
    /// With `--cluster-enabled yes` and no `--cluster-port`, a free bus port is
    /// picked too, so nothing depends on `port + 10000` being free.
    pub fn start_with(args: &[&str]) -> RedisServer {
        let mut base = String::from(
            "save \"\"\n\
             appendonly no\n\
             repl-diskless-sync-delay 0\n",
        );
        // Before 7.0, DEBUG is always on and the setting does not exist.
        if server_version() >= (7, 0) {
            base.push_str("enable-debug-command yes\n");
        }
        let extra: Vec<String> = args.iter().map(ToString::to_string).collect();
        RedisServer::launch("redis.conf", &base, false, extra)
    }

    /// Starts a sentinel whose config file holds `body` after the common lines.
    fn start_sentinel(body: &str) -> RedisServer {
        RedisServer::launch("sentinel.conf", body, true, Vec::new())
    }

    fn launch(conf_name: &str, body: &str, sentinel: bool, extra: Vec<String>) -> RedisServer {
        let bin = redis_server_path();
        let dir = tempfile::Builder::new()
            .prefix("tollgate-redis-")
            .tempdir()
            .expect("create a temporary directory for redis-server");
        let conf = dir.path().join(conf_name);
        let conf_text = format!(
            "bind 127.0.0.1\n\
             protected-mode no\n\
             daemonize no\n\
             dir {}\n\
             logfile {}\n\
             {body}",
            conf_quote(dir.path()),
            conf_quote(&dir.path().join("redis.log")),
        );
        fs::write(&conf, conf_text).expect("write the redis-server config file");
        // `--cluster-port` came with 7.0; before, the bus is `port + 10000`.
        let wants_bus = cluster_enabled(&extra)
            && !extra.iter().any(|a| a == "--cluster-port")
            && server_version() >= (7, 0);
        let mut server = RedisServer {
            port: free_port(),
            bus_port: wants_bus.then(free_port),
            dir,
            conf,
            sentinel,
            extra,
            process: Mutex::new(None),
        };
        server.boot(bin, true);
        server
    }

    /// The TCP port the server listens on (never 6379).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The URL of the server: `redis://127.0.0.1:PORT/`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// The server's temporary directory (config, `redis.log`, `console.log`).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// A `redis::Client` for this server.
    pub fn client(&self) -> redis::Client {
        redis::Client::open(self.url()).expect("a loopback redis URL is valid")
    }

    /// A new sync connection (2 s connect timeout, no read timeout).
    ///
    /// # Panics
    ///
    /// If the server does not accept the connection, e.g. after [`stop`](Self::stop).
    pub fn conn(&self) -> redis::Connection {
        self.client()
            .get_connection_with_timeout(Duration::from_secs(2))
            .unwrap_or_else(|e| panic!("connect to redis-server on port {}: {e}", self.port))
    }

    /// Holds every client's commands for `time` (`CLIENT PAUSE <ms> ALL`).
    ///
    /// In effect when this returns: a command sent after it waits out the
    /// rest of the pause unanswered, then runs. Unlike `DEBUG SLEEP` it
    /// never stops a script already running, and needs no thread or wait.
    pub fn pause_clients(&self, time: Duration) {
        let _: () = redis::cmd("CLIENT")
            .arg("PAUSE")
            .arg(time.as_millis() as u64)
            .arg("ALL")
            .query(&mut self.conn())
            .unwrap();
    }

    /// Kills the process (SIGKILL, like a crash) and reaps it; the port and
    /// directory are kept for [`restart`](Self::restart). Does nothing if stopped.
    pub fn stop(&mut self) {
        if let Some(child) = lock(&self.process).take() {
            shut(child);
        }
    }

    /// Starts the process again on the same port and directory and waits for
    /// PING; stops it first if it is running.
    pub fn restart(&mut self) {
        self.stop();
        self.boot(redis_server_path(), false);
    }

    /// Whether the process is alive (reaps it if it exited on its own).
    pub fn is_running(&self) -> bool {
        let mut process = lock(&self.process);
        let alive = match process.as_mut() {
            Some(child) => matches!(child.try_wait(), Ok(None)),
            None => false,
        };
        if !alive && let Some(child) = process.take() {
            shut(child);
        }
        alive
    }

    /// The last lines of the server log and console output, for panic messages.
    pub fn log_tail(&self) -> String {
        let mut out = String::new();
        for name in ["redis.log", "console.log"] {
            let text = fs::read_to_string(self.dir.path().join(name)).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            let tail = lines[lines.len().saturating_sub(25)..].join("\n");
            let _ = writeln!(out, "--- {name} (port {}) ---\n{tail}", self.port);
        }
        out
    }

    /// Spawns the process and waits for it; retries on a port clash, with new
    /// ports if `repick` and after a short pause otherwise.
    fn boot(&mut self, bin: &Path, repick: bool) {
        for attempt in 1..=BOOT_ATTEMPTS {
            match self.spawn_and_wait(bin) {
                Ok(child) => {
                    *lock(&self.process) = Some(child);
                    return;
                }
                Err(Boot::PortTaken) if attempt < BOOT_ATTEMPTS => {
                    if repick {
                        self.port = free_port();
                        if self.bus_port.is_some() {
                            self.bus_port = Some(free_port());
                        }
                    } else {
                        thread::sleep(Duration::from_millis(100));
                    }
                }
                Err(Boot::PortTaken) => panic!(
                    "redis-server: port {} still taken after {BOOT_ATTEMPTS} attempts\n{}",
                    self.port,
                    self.log_tail()
                ),
                Err(Boot::Failed(why)) => panic!("{why}\n{}", self.log_tail()),
            }
        }
    }

    fn spawn_and_wait(&self, bin: &Path) -> Result<Child, Boot> {
        let log = self.dir.path().join("redis.log");
        let console = self.dir.path().join("console.log");
        let seen_log = file_len(&log);
        let seen_console = file_len(&console);
        let out = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&console)
            .expect("open console.log");
        let err = out.try_clone().expect("clone console.log handle");
        let mut child = Command::new("/bin/sh")
            .arg("-c")
            .arg(SUPERVISOR)
            .arg("tollgate-redis")
            .arg(self.dir.path())
            .env("TOLLGATE_REDIS_SERVER", bin)
            .args(self.argv())
            .stdin(Stdio::piped())
            .stdout(out)
            .stderr(err)
            .spawn()
            .expect("spawn sh to supervise redis-server");

        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                let fresh = format!(
                    "{}{}",
                    read_from(&log, seen_log),
                    read_from(&console, seen_console)
                );
                shut(child);
                return Err(if fresh.contains("Address already in use") {
                    Boot::PortTaken
                } else {
                    Boot::Failed(format!(
                        "redis-server on port {} exited during startup ({status})",
                        self.port
                    ))
                });
            }
            if self.answers_as_itself() {
                return Ok(child);
            }
            if Instant::now() >= deadline {
                shut(child);
                return Err(Boot::Failed(format!(
                    "redis-server on port {} did not answer PING within {START_TIMEOUT:?}",
                    self.port
                )));
            }
            thread::sleep(POLL);
        }
    }

    /// PING works, and INFO names our config file, so the answer cannot come
    /// from some other server that owns the port.
    fn answers_as_itself(&self) -> bool {
        let Ok(mut conn) = admin(self.port) else {
            return false;
        };
        let pong: redis::RedisResult<String> = redis::cmd("PING").query(&mut conn);
        if pong.as_deref() != Ok("PONG") {
            return false;
        }
        match info(&mut conn, "server") {
            Ok(info) => info.get("config_file").map(String::as_str) == self.conf.to_str(),
            Err(_) => false,
        }
    }

    fn argv(&self) -> Vec<String> {
        let mut argv = vec![self.conf.display().to_string()];
        if self.sentinel {
            argv.push("--sentinel".into());
        }
        argv.push("--port".into());
        argv.push(self.port.to_string());
        if let Some(bus) = self.bus_port {
            argv.push("--cluster-port".into());
            argv.push(bus.to_string());
        }
        argv.extend(self.extra.iter().cloned());
        argv
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.stop();
    }
}

enum Boot {
    PortTaken,
    Failed(String),
}

/// Asks the supervisor to kill the server, then reaps the supervisor (which
/// has reaped the server), so the port is free when this returns.
fn shut(mut child: Child) {
    if let Some(mut stdin) = child.stdin.take() {
        // EPIPE just means the supervisor is already gone.
        let _ = stdin.write_all(b"stop\n");
    }
    let _ = child.wait();
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

fn cluster_enabled(args: &[String]) -> bool {
    args.windows(2)
        .any(|w| w[0] == "--cluster-enabled" && w[1].eq_ignore_ascii_case("yes"))
}

fn conf_quote(path: &Path) -> String {
    let s = path.display().to_string();
    format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\""))
}

fn file_len(path: &Path) -> u64 {
    fs::metadata(path).map_or(0, |m| m.len())
}

fn read_from(path: &Path, offset: u64) -> String {
    let bytes = fs::read(path).unwrap_or_default();
    let start = usize::try_from(offset).map_or(bytes.len(), |o| o.min(bytes.len()));
    String::from_utf8_lossy(&bytes[start..]).into_owned()
}

/// The environment variable that names the server binary the tests run:
/// a path, or a name looked up on `PATH` (`redis-server` when unset), so one
/// suite runs on Redis 6.2, 7.x and Valkey alike.
pub const SERVER_ENV: &str = "REDIS_SERVER";

/// The absolute path of the server binary ([`SERVER_ENV`], else
/// `redis-server` on `PATH`), looked up once per binary.
///
/// # Panics
///
/// With one clear line when it is not installed.
fn redis_server_path() -> &'static Path {
    static PATH: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    PATH.get_or_init(|| {
        let wanted = std::env::var_os(SERVER_ENV).unwrap_or_else(|| "redis-server".into());
        let wanted = PathBuf::from(wanted);
        if wanted.components().count() > 1 {
            return if wanted.is_file() {
                Ok(wanted)
            } else {
                Err(format!("{SERVER_ENV}={} is not a file", wanted.display()))
            };
        }
        let path = std::env::var_os("PATH").unwrap_or_default();
        std::env::split_paths(&path)
            .map(|dir| dir.join(&wanted))
            .find(|candidate| candidate.is_file())
            .ok_or_else(|| {
                format!(
                    "{} not found on PATH: install it with 'apt-get install -y redis-server', \
                     run scripts/test (which installs one), or set {SERVER_ENV} to a server binary",
                    wanted.display()
                )
            })
    })
    .as_deref()
    .unwrap_or_else(|why| panic!("{why}"))
}

/// The server binary's version, `(major, minor)`, as `--version` prints it
/// (`v=7.0.15`; Valkey prints its own, `v=9.1.2`), read once per binary.
pub fn server_version() -> (u32, u32) {
    static VERSION: OnceLock<(u32, u32)> = OnceLock::new();
    *VERSION.get_or_init(|| {
        let bin = redis_server_path();
        let out = Command::new(bin)
            .arg("--version")
            .output()
            .unwrap_or_else(|e| panic!("run {} --version: {e}", bin.display()));
        let text = String::from_utf8_lossy(&out.stdout);
        let version = text
            .split_whitespace()
            .find_map(|word| word.strip_prefix("v="))
            .unwrap_or_else(|| panic!("no v= in {} --version: {text}", bin.display()));
        let mut parts = version.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
        (parts.next().unwrap_or(0), parts.next().unwrap_or(0))
    })
}

/// Whether the server binary is Valkey rather than Redis.
pub fn is_valkey() -> bool {
    static VALKEY: OnceLock<bool> = OnceLock::new();
    *VALKEY.get_or_init(|| {
        Command::new(redis_server_path())
            .arg("--version")
            .output()
            .is_ok_and(|out| String::from_utf8_lossy(&out.stdout).starts_with("Valkey"))
    })
}

/// A loopback port that was free a moment ago and that this binary has not
/// handed out before (so parallel tests never race for the same one).
fn free_port() -> u16 {
    static HANDED_OUT: Mutex<Vec<u16>> = Mutex::new(Vec::new());
    loop {
        let port = TcpListener::bind(("127.0.0.1", 0))
            .and_then(|listener| listener.local_addr())
            .expect("bind 127.0.0.1:0 to find a free port")
            .port();
        // Before 7.0 a cluster node's bus port is always `port + 10000`:
        // keep that one free and unused too, whether or not it is needed.
        let bus = (server_version() < (7, 0)).then(|| port.checked_add(10_000));
        if bus == Some(None)
            || bus
                .flatten()
                .is_some_and(|bus| TcpListener::bind(("127.0.0.1", bus)).is_err())
        {
            continue;
        }
        let mut handed_out = lock(&HANDED_OUT);
        let bus = bus.flatten();
        if port != SYSTEM_REDIS_PORT
            && !handed_out.contains(&port)
            && bus.is_none_or(|bus| !handed_out.contains(&bus))
        {
            handed_out.push(port);
            handed_out.extend(bus);
            return port;
        }
    }
}

/// A connection for health checks and admin commands, with short timeouts.
fn admin(port: u16) -> redis::RedisResult<redis::Connection> {
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}/"))?;
    let conn = client.get_connection_with_timeout(Duration::from_millis(500))?;
    conn.set_read_timeout(Some(Duration::from_secs(5)))?;
    conn.set_write_timeout(Some(Duration::from_secs(5)))?;
    Ok(conn)
}

/// `INFO section` as a map of `field -> value`.
fn info(
    conn: &mut redis::Connection,
    section: &str,
) -> redis::RedisResult<HashMap<String, String>> {
    let text: String = redis::cmd("INFO").arg(section).query(conn)?;
    Ok(text
        .lines()
        .filter_map(|line| line.split_once(':'))
        .map(|(k, v)| (k.to_string(), v.trim().to_string()))
        .collect())
}

/// `INFO section` of the server on `port`, or `None` if it does not answer.
fn info_of(port: u16, section: &str) -> Option<HashMap<String, String>> {
    info(&mut admin(port).ok()?, section).ok()
}

/// Polls `check` every [`POLL`] until it returns `Ok`, or panics after
/// `timeout` with `what` and the last `Err` reason.
fn poll_until<T>(timeout: Duration, what: &str, mut check: impl FnMut() -> Result<T, String>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        match check() {
            Ok(value) => return value,
            Err(why) if Instant::now() >= deadline => {
                panic!("timed out after {timeout:?} waiting for {what}: {why}")
            }
            Err(_) => thread::sleep(POLL),
        }
    }
}

/// The URL of a Redis shared by every test in this binary: `$REDIS_URL` if
/// set, else one [`RedisServer`] started on first use.
///
/// That server lives in a `static`, so its `Drop` never runs; its supervisor
/// kills it and removes its directory when the test binary exits. Tests that
/// share it must keep their keys apart with [`unique_prefix`].
pub fn shared_url() -> String {
    static SHARED: OnceLock<RedisServer> = OnceLock::new();
    if let Ok(url) = std::env::var("REDIS_URL")
        && !url.trim().is_empty()
    {
        return url;
    }
    SHARED.get_or_init(RedisServer::start).url()
}

/// A key prefix unique to this call, binary run and process:
/// `t:{tag}:{counter}:{pid}-{start_ms}` (no braces, so no hash tag).
///
/// # Panics
///
/// If `tag` contains `{` or `}`, which would turn into a cluster hash tag.
pub fn unique_prefix(tag: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    static RUN: OnceLock<u128> = OnceLock::new();
    assert!(
        !tag.contains(['{', '}']),
        "unique_prefix: tag {tag:?} must not contain braces"
    );
    let run = RUN.get_or_init(|| {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis())
    });
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    format!("t:{tag}:{n}:{}-{run}", std::process::id())
}

/// Starts a replica of `primary` (`--replicaof 127.0.0.1 PORT`) and waits
/// until it has caught up.
pub fn start_replica_of(primary: &RedisServer) -> RedisServer {
    let port = primary.port().to_string();
    let replica = RedisServer::start_with(&["--replicaof", "127.0.0.1", &port]);
    wait_for_replication(primary, &replica);
    replica
}

/// Waits (max 10 s) until `replica`'s link to `primary` is up and it has
/// applied every write `primary` had accepted when this was called.
pub fn wait_for_replication(primary: &RedisServer, replica: &RedisServer) {
    let what = format!(
        "replica :{} to catch up with primary :{}",
        replica.port(),
        primary.port()
    );
    poll_until(REPLICATION_TIMEOUT, &what, || {
        let target = offset(&info_of(primary.port(), "replication").ok_or("primary is down")?)?;
        let r = info_of(replica.port(), "replication").ok_or("replica is down")?;
        let field = |name: &str| r.get(name).map_or("", String::as_str);
        if field("master_port") != primary.port().to_string() {
            return Err(format!("replica follows port {:?}", field("master_port")));
        }
        if field("master_link_status") != "up" {
            return Err(format!(
                "master_link_status:{}",
                field("master_link_status")
            ));
        }
        let applied = offset(&r)?;
        if applied < target {
            return Err(format!(
                "replica offset {applied} < primary offset {target}"
            ));
        }
        Ok(())
    });
}

fn offset(info: &HashMap<String, String>) -> Result<i64, String> {
    info.get("master_repl_offset")
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| "no master_repl_offset in INFO replication".to_string())
}

/// The CRC16 (XMODEM) that Redis Cluster hashes keys with.
fn crc16(bytes: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &byte in bytes {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

/// The cluster hash slot of `key`, with hash-tag rules (same as `CLUSTER KEYSLOT`).
pub fn key_slot(key: &str) -> u16 {
    let bytes = key.as_bytes();
    let hashed = bytes
        .iter()
        .position(|&b| b == b'{')
        .and_then(|open| {
            let rest = &bytes[open + 1..];
            let close = rest.iter().position(|&b| b == b'}')?;
            (close > 0).then(|| &rest[..close])
        })
        .unwrap_or(bytes);
    // Same as `% 16384`.
    crc16(hashed) & 0x3FFF
}

/// One line of `CLUSTER NODES`.
#[derive(Debug)]
struct NodeLine {
    port: u16,
    flags: Vec<String>,
    slots: Vec<(u16, u16)>,
}

impl NodeLine {
    fn is_primary(&self) -> bool {
        self.flags.iter().any(|f| f == "master")
    }

    fn is_replica(&self) -> bool {
        self.flags.iter().any(|f| f == "slave")
    }

    /// Flagged failing, unreachable or not yet met.
    fn is_troubled(&self) -> bool {
        self.flags
            .iter()
            .any(|f| matches!(f.as_str(), "fail" | "fail?" | "handshake" | "noaddr"))
    }

    fn slot_count(&self) -> usize {
        self.slots
            .iter()
            .map(|&(lo, hi)| usize::from(hi - lo) + 1)
            .sum()
    }
}

fn cluster_nodes(port: u16) -> Result<Vec<NodeLine>, String> {
    let mut conn = admin(port).map_err(|e| format!(":{port} is down ({e})"))?;
    let text: String = redis::cmd("CLUSTER")
        .arg("NODES")
        .query(&mut conn)
        .map_err(|e| format!(":{port} CLUSTER NODES: {e}"))?;
    Ok(text.lines().filter_map(parse_node_line).collect())
}

fn parse_node_line(line: &str) -> Option<NodeLine> {
    let fields: Vec<&str> = line.split_whitespace().collect();
    let addr = fields.get(1)?.split([',', '@']).next()?;
    let port = addr.rsplit_once(':')?.1.parse().ok()?;
    let flags = fields.get(2)?.split(',').map(str::to_string).collect();
    let slots = fields
        .iter()
        .skip(8)
        .filter(|s| !s.starts_with('['))
        .filter_map(|s| match s.split_once('-') {
            Some((lo, hi)) => Some((lo.parse().ok()?, hi.parse().ok()?)),
            None => s.parse().ok().map(|one| (one, one)),
        })
        .collect();
    Some(NodeLine { port, flags, slots })
}

fn cluster_info(port: u16) -> Result<HashMap<String, String>, String> {
    let mut conn = admin(port).map_err(|e| format!(":{port} is down ({e})"))?;
    let text: String = redis::cmd("CLUSTER")
        .arg("INFO")
        .query(&mut conn)
        .map_err(|e| format!(":{port} CLUSTER INFO: {e}"))?;
    Ok(text
        .lines()
        .filter_map(|line| line.split_once(':'))
        .map(|(k, v)| (k.to_string(), v.trim().to_string()))
        .collect())
}

fn admin_cmd(port: u16, cmd: &redis::Cmd) -> Result<redis::Value, String> {
    let mut conn = admin(port).map_err(|e| format!(":{port} is down ({e})"))?;
    cmd.query(&mut conn).map_err(|e| format!(":{port}: {e}"))
}

/// A Redis Cluster of real processes on loopback, built node by node.
///
/// `nodes()[i]` for `i < primaries` are the initial primaries, owning equal
/// slot ranges in order; the replica at `primaries + r * primaries + p`
/// follows primary `p`.
pub struct RedisCluster {
    nodes: Vec<RedisServer>,
    primaries: usize,
    replicas_per_primary: usize,
}

impl RedisCluster {
    /// Starts a cluster with a 2 s node timeout and waits until it is healthy.
    pub fn start(primaries: usize, replicas_per_primary: usize) -> RedisCluster {
        RedisCluster::start_with_timeout(primaries, replicas_per_primary, Duration::from_secs(2))
    }

    /// Starts a cluster with `--cluster-node-timeout node_timeout` (failure
    /// detection takes about that long) and waits until it is healthy.
    ///
    /// Nodes also get `--cluster-replica-validity-factor 0`, so a replica may
    /// always take over in failover tests.
    pub fn start_with_timeout(
        primaries: usize,
        replicas_per_primary: usize,
        node_timeout: Duration,
    ) -> RedisCluster {
        assert!(primaries >= 1, "a cluster needs at least one primary");
        let timeout_ms = node_timeout.as_millis().max(1).to_string();
        let args = [
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            "nodes.conf",
            "--cluster-node-timeout",
            &timeout_ms,
            "--cluster-replica-validity-factor",
            "0",
        ];
        let total = primaries * (1 + replicas_per_primary);
        let nodes: Vec<RedisServer> = (0..total).map(|_| RedisServer::start_with(&args)).collect();
        let cluster = RedisCluster {
            nodes,
            primaries,
            replicas_per_primary,
        };
        cluster.create();
        cluster
    }

    /// What `redis-cli --cluster create` does, but with a known layout and
    /// without its one-second sleeps.
    fn create(&self) {
        let must = |port: u16, cmd: &redis::Cmd| {
            admin_cmd(port, cmd).unwrap_or_else(|e| panic!("cluster create: {e}"));
        };
        for (i, node) in self.nodes.iter().enumerate() {
            must(
                node.port(),
                redis::cmd("CLUSTER").arg("SET-CONFIG-EPOCH").arg(i + 1),
            );
        }
        for (p, node) in self.nodes[..self.primaries].iter().enumerate() {
            let lo = p * SLOTS / self.primaries;
            let hi = (p + 1) * SLOTS / self.primaries - 1;
            // `ADDSLOTSRANGE` came with 7.0; `ADDSLOTS` takes every slot.
            let mut add = redis::cmd("CLUSTER");
            if server_version() >= (7, 0) {
                add.arg("ADDSLOTSRANGE").arg(lo).arg(hi);
            } else {
                add.arg("ADDSLOTS").arg((lo..=hi).collect::<Vec<_>>());
            }
            must(node.port(), &add);
        }
        let first = self.nodes[0].port();
        for node in &self.nodes[1..] {
            let bus = node.bus_port.unwrap_or(node.port() + 10_000);
            must(
                first,
                redis::cmd("CLUSTER")
                    .arg("MEET")
                    .arg("127.0.0.1")
                    .arg(node.port())
                    .arg(bus),
            );
        }
        let total = self.nodes.len();
        poll_until(CLUSTER_TIMEOUT, "cluster nodes to meet", || {
            for node in &self.nodes {
                let view = cluster_nodes(node.port())?;
                let met = view
                    .iter()
                    .filter(|n| !n.flags.iter().any(|f| f == "handshake"))
                    .count();
                if met != total {
                    return Err(format!(":{} knows {met} of {total} nodes", node.port()));
                }
            }
            Ok(())
        });
        let ids: Vec<String> = self.nodes[..self.primaries]
            .iter()
            .map(|node| {
                let mut conn = admin(node.port()).expect("connect to a cluster node");
                redis::cmd("CLUSTER")
                    .arg("MYID")
                    .query(&mut conn)
                    .expect("CLUSTER MYID")
            })
            .collect();
        for (j, replica) in self.nodes[self.primaries..].iter().enumerate() {
            let id = &ids[j % self.primaries];
            poll_until(CLUSTER_TIMEOUT, "CLUSTER REPLICATE to succeed", || {
                admin_cmd(
                    replica.port(),
                    redis::cmd("CLUSTER").arg("REPLICATE").arg(id),
                )
                .map(drop)
            });
        }
        self.wait_converged();
    }

    /// Every node sees the full layout: state ok, all slots, the expected
    /// primaries and replicas, nobody failing, every replica link up.
    fn wait_converged(&self) {
        let total = self.nodes.len();
        let want_replicas = self.primaries * self.replicas_per_primary;
        poll_until(CLUSTER_TIMEOUT, "the new cluster to converge", || {
            for node in &self.nodes {
                let port = node.port();
                let info = cluster_info(port)?;
                let get = |k: &str| info.get(k).map_or("", String::as_str);
                if get("cluster_state") != "ok"
                    || get("cluster_slots_ok") != SLOTS.to_string()
                    || get("cluster_known_nodes") != total.to_string()
                {
                    return Err(format!(":{port} cluster info {info:?}"));
                }
                let view = cluster_nodes(port)?;
                let primaries = view
                    .iter()
                    .filter(|n| n.is_primary() && n.slot_count() > 0)
                    .count();
                let replicas = view.iter().filter(|n| n.is_replica()).count();
                if primaries != self.primaries
                    || replicas != want_replicas
                    || view.iter().any(NodeLine::is_troubled)
                {
                    return Err(format!(":{port} sees {view:?}"));
                }
            }
            for replica in &self.nodes[self.primaries..] {
                let info = info_of(replica.port(), "replication").ok_or("replica is down")?;
                if info.get("master_link_status").map(String::as_str) != Some("up") {
                    return Err(format!(":{} link is not up", replica.port()));
                }
            }
            Ok(())
        });
    }

    /// URLs of all nodes, in `nodes()` order (stopped ones included).
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    /// URLs of the nodes that currently serve slots, as a running node sees it.
    pub fn primary_urls(&self) -> Vec<String> {
        let view = self.view();
        self.nodes
            .iter()
            .filter(|node| {
                view.iter().any(|n| {
                    n.port == node.port()
                        && n.is_primary()
                        && n.slot_count() > 0
                        && !n.is_troubled()
                })
            })
            .map(RedisServer::url)
            .collect()
    }

    /// All nodes: initial primaries first, then replicas.
    pub fn nodes(&self) -> &[RedisServer] {
        &self.nodes
    }

    /// All nodes, mutably, to [`stop`](RedisServer::stop) or
    /// [`restart`](RedisServer::restart) one.
    pub fn nodes_mut(&mut self) -> &mut [RedisServer] {
        &mut self.nodes
    }

    /// Index in `nodes()` of the primary serving `slot` now, as a running node
    /// sees it (call [`wait_healthy`](Self::wait_healthy) after a failover).
    pub fn node_for_slot(&self, slot: u16) -> usize {
        let view = self.view();
        let owner = view
            .iter()
            .find(|n| {
                n.is_primary()
                    && !n.is_troubled()
                    && n.slots.iter().any(|&(lo, hi)| (lo..=hi).contains(&slot))
            })
            .unwrap_or_else(|| panic!("no healthy primary serves slot {slot}: {view:?}"));
        self.index_of(owner.port)
    }

    /// Waits until every running node reports `cluster_state:ok` and sees all
    /// slots served by running, non-failing primaries of this cluster.
    ///
    /// Right after a `stop()` this waits out the failover instead of
    /// returning before anyone has noticed.
    pub fn wait_healthy(&self) {
        poll_until(CLUSTER_TIMEOUT, "the cluster to be healthy", || {
            for node in self.nodes.iter().filter(|n| n.is_running()) {
                let port = node.port();
                let info = cluster_info(port)?;
                if info.get("cluster_state").map(String::as_str) != Some("ok") {
                    return Err(format!(":{port} cluster_state is not ok"));
                }
                let served: usize = cluster_nodes(port)?
                    .iter()
                    .filter(|n| n.is_primary() && !n.is_troubled())
                    .filter(|n| {
                        self.nodes
                            .iter()
                            .any(|s| s.port() == n.port && s.is_running())
                    })
                    .map(NodeLine::slot_count)
                    .sum();
                if served != SLOTS {
                    return Err(format!(":{port} sees {served} slots on running primaries"));
                }
            }
            Ok(())
        });
    }

    /// `CLUSTER NODES` from the first running node that answers.
    fn view(&self) -> Vec<NodeLine> {
        self.nodes
            .iter()
            .filter(|n| n.is_running())
            .find_map(|n| cluster_nodes(n.port()).ok())
            .expect("no running cluster node answers CLUSTER NODES")
    }

    fn index_of(&self, port: u16) -> usize {
        self.nodes
            .iter()
            .position(|n| n.port() == port)
            .unwrap_or_else(|| panic!("port {port} is not a node of this cluster"))
    }
}

/// A set of `redis-server --sentinel` processes watching one primary.
pub struct SentinelSet {
    sentinels: Vec<RedisServer>,
    master_name: String,
}

impl SentinelSet {
    /// Starts `count` sentinels monitoring `primary` as `master_name` (quorum
    /// `count / 2 + 1`, down after 1 s, failover timeout 5 s), and waits until
    /// each one knows the primary, every replica and the other sentinels.
    pub fn start(
        primary: &RedisServer,
        replicas: &[&RedisServer],
        count: usize,
        master_name: &str,
    ) -> SentinelSet {
        assert!(count >= 1, "a sentinel set needs at least one sentinel");
        assert!(
            !master_name.is_empty()
                && master_name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c)),
            "master name {master_name:?} must be plain [A-Za-z0-9._-]"
        );
        for replica in replicas {
            // Sentinels learn replicas from the primary's INFO, at start-up
            // and then only every 10 s, so they must be attached first.
            wait_for_replication(primary, replica);
        }
        let quorum = count / 2 + 1;
        let body = format!(
            "sentinel resolve-hostnames no\n\
             sentinel monitor {master_name} 127.0.0.1 {port} {quorum}\n\
             sentinel down-after-milliseconds {master_name} 1000\n\
             sentinel failover-timeout {master_name} 5000\n",
            port = primary.port(),
        );
        let sentinels = (0..count)
            .map(|_| RedisServer::start_sentinel(&body))
            .collect();
        let set = SentinelSet {
            sentinels,
            master_name: master_name.to_string(),
        };
        let replica_ports: Vec<u16> = replicas.iter().map(|r| r.port()).collect();
        set.wait_ready(primary.port(), &replica_ports);
        set
    }

    fn wait_ready(&self, primary: u16, replicas: &[u16]) {
        let others = (self.sentinels.len() - 1).to_string();
        poll_until(SENTINEL_TIMEOUT, "sentinels to see the topology", || {
            for sentinel in &self.sentinels {
                let port = sentinel.port();
                let mut conn = admin(port).map_err(|e| format!("sentinel :{port}: {e}"))?;
                let master: HashMap<String, String> = redis::cmd("SENTINEL")
                    .arg("MASTER")
                    .arg(&self.master_name)
                    .query(&mut conn)
                    .map_err(|e| format!("sentinel :{port}: {e}"))?;
                let get = |k: &str| master.get(k).map_or("", String::as_str);
                if get("flags") != "master"
                    || get("port") != primary.to_string()
                    || get("num-other-sentinels") != others
                {
                    return Err(format!("sentinel :{port} sees master {master:?}"));
                }
                let known: Vec<HashMap<String, String>> = redis::cmd("SENTINEL")
                    .arg("REPLICAS")
                    .arg(&self.master_name)
                    .query(&mut conn)
                    .map_err(|e| format!("sentinel :{port}: {e}"))?;
                for replica in replicas {
                    let healthy = known.iter().any(|r| {
                        r.get("port") == Some(&replica.to_string())
                            && r.get("flags").map(String::as_str) == Some("slave")
                    });
                    if !healthy {
                        return Err(format!(
                            "sentinel :{port} does not see replica :{replica}: {known:?}"
                        ));
                    }
                }
            }
            Ok(())
        });
    }

    /// URLs of all sentinels (`redis://127.0.0.1:PORT/`).
    pub fn urls(&self) -> Vec<String> {
        self.sentinels.iter().map(RedisServer::url).collect()
    }

    /// The name the primary is monitored under.
    pub fn master_name(&self) -> &str {
        &self.master_name
    }

    /// The sentinel processes themselves, e.g. to stop one.
    pub fn sentinels(&self) -> &[RedisServer] {
        &self.sentinels
    }

    /// The sentinel processes, mutably.
    pub fn sentinels_mut(&mut self) -> &mut [RedisServer] {
        &mut self.sentinels
    }

    /// The master port reported by the first running sentinel that answers
    /// `SENTINEL GET-MASTER-ADDR-BY-NAME`.
    pub fn current_master_port(&self) -> u16 {
        self.sentinels
            .iter()
            .filter(|s| s.is_running())
            .find_map(|s| self.master_port_from(s.port()))
            .expect("no running sentinel reports a master address")
    }

    /// Waits until every running sentinel reports a master port other than
    /// `old_port`, all the same one, and returns it.
    pub fn wait_for_new_master(&self, old_port: u16) -> u16 {
        poll_until(SENTINEL_TIMEOUT, "sentinels to fail over", || {
            let ports: Vec<Option<u16>> = self
                .sentinels
                .iter()
                .filter(|s| s.is_running())
                .map(|s| self.master_port_from(s.port()))
                .collect();
            match ports.first() {
                Some(&Some(port)) if port != old_port && ports.iter().all(|p| *p == Some(port)) => {
                    Ok(port)
                }
                _ => Err(format!("sentinels report {ports:?}")),
            }
        })
    }

    fn master_port_from(&self, sentinel_port: u16) -> Option<u16> {
        let mut conn = admin(sentinel_port).ok()?;
        let addr: Option<(String, String)> = redis::cmd("SENTINEL")
            .arg("GET-MASTER-ADDR-BY-NAME")
            .arg(&self.master_name)
            .query(&mut conn)
            .ok()?;
        addr?.1.parse().ok()
    }
}

// ------------------------------------------------------------ command counts

/// Commands that open a connection (redis-rs sends `CLIENT SETINFO` on
/// every one, which servers from 7.2 on count) or that measuring itself
/// sends: never what a decision, refund or peek sends.
const NOT_THE_PRODUCTS: [&str; 6] = ["hello", "client", "select", "auth", "info", "config"];

/// Calls per command from `INFO commandstats` (subcommands as Redis names
/// them from 7.0 on, e.g. `script|load`; 6.2 counts `script`), leaving out
/// the connection handshake and the `INFO` and `CONFIG RESETSTAT` that
/// measuring itself sends ([`NOT_THE_PRODUCTS`]). Counts commands run
/// inside scripts too.
pub fn command_calls(server: &RedisServer) -> std::collections::BTreeMap<String, u64> {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(&mut server.conn())
        .unwrap();
    info.lines()
        .filter_map(|line| {
            let (name, rest) = line.strip_prefix("cmdstat_")?.split_once(':')?;
            let calls = rest.split(',').find_map(|kv| kv.strip_prefix("calls="))?;
            Some((name.to_owned(), calls.parse().ok()?))
        })
        .filter(|(name, _)| {
            let base = name.split('|').next().unwrap_or(name);
            !NOT_THE_PRODUCTS.contains(&base)
        })
        .collect()
}

/// Whether this server runs flagged read-only scripts (`EVALSHA_RO`, from
/// Redis 7.0 on), which is what lets peeks and pre-checks go to replicas.
/// Before 7.0 the store sends them to the primary with `EVALSHA`.
pub fn replicas_run_scripts() -> bool {
    server_version() >= (7, 0)
}

/// Script call counts as this server names them: `counts` as Redis 7 has
/// them, with read-only calls (`evalsha_ro`) merged into `evalsha` before
/// 7.0, where the store sends peeks as plain `EVALSHA`.
pub fn as_served(counts: &[(&str, u64)]) -> std::collections::BTreeMap<String, u64> {
    let mut served = std::collections::BTreeMap::new();
    for &(name, calls) in counts {
        let name = match name {
            "evalsha_ro" if !replicas_run_scripts() => "evalsha",
            "eval_ro" if !replicas_run_scripts() => "eval",
            other => other,
        };
        *served.entry(name.to_owned()).or_insert(0) += calls;
    }
    served
}

/// How many `SCRIPT LOAD`s `calls` holds: `script|load` from Redis 7.0 on;
/// before, `script` counts every subcommand, so `other_script_calls` (the
/// test's own `SCRIPT FLUSH`, say) are taken off.
pub fn script_loads(
    calls: &std::collections::BTreeMap<String, u64>,
    other_script_calls: u64,
) -> Option<u64> {
    if server_version() >= (7, 0) {
        calls.get("script|load").copied()
    } else {
        calls.get("script").map(|n| n - other_script_calls)
    }
}

/// What clients sent: [`command_calls`] without the commands our Lua
/// scripts run inside Redis, which `INFO commandstats` counts as well. The
/// list is read from `lua/*.lua`, so a script that starts using a command
/// can never make a test count it as a round trip.
pub fn client_calls(server: &RedisServer) -> std::collections::BTreeMap<String, u64> {
    command_calls(server)
        .into_iter()
        .filter(|(name, _)| {
            let base = name.split('|').next().unwrap_or(name);
            !commands_run_by_scripts().contains(base)
        })
        .collect()
}

/// `EVALSHA` plus `EVALSHA_RO` calls: one per decision, refund or peek.
pub fn evalsha_calls(server: &RedisServer) -> u64 {
    let calls = command_calls(server);
    calls.get("evalsha").copied().unwrap_or(0) + calls.get("evalsha_ro").copied().unwrap_or(0)
}

/// Zeroes `INFO commandstats`.
pub fn reset_stats(server: &RedisServer) {
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query(&mut server.conn())
        .unwrap();
}

/// Every command named in a `redis.call(..)` or `redis.pcall(..)` in `lua/`,
/// lower-cased as `INFO commandstats` names them.
pub fn commands_run_by_scripts() -> &'static std::collections::BTreeSet<String> {
    static COMMANDS: OnceLock<std::collections::BTreeSet<String>> = OnceLock::new();
    COMMANDS.get_or_init(|| {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("lua");
        let mut commands = std::collections::BTreeSet::new();
        for entry in fs::read_dir(&dir).expect("lua/ is readable") {
            let path = entry.unwrap().path();
            // The Lua sources only, not lua/SENT.md.
            if path.extension().is_none_or(|ext| ext != "lua") {
                continue;
            }
            let source = fs::read_to_string(path).unwrap();
            for call in source.split("redis.").skip(1) {
                let Some(args) = call
                    .strip_prefix("call(")
                    .or_else(|| call.strip_prefix("pcall("))
                else {
                    continue;
                };
                let quoted = args.trim_start();
                let Some(quote) = quoted.chars().next().filter(|c| *c == '\'' || *c == '"') else {
                    continue;
                };
                if let Some(name) = quoted[1..].split(quote).next() {
                    commands.insert(name.to_ascii_lowercase());
                }
            }
        }
        assert!(
            commands.contains("time"),
            "no redis.call found in {dir:?}: {commands:?}"
        );
        commands
    })
}

/// One runtime for every case of a property test, so the shared
/// connection's tasks keep running between cases.
pub static PROPTEST_RUNTIME: std::sync::LazyLock<tokio::runtime::Runtime> =
    std::sync::LazyLock::new(|| {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    });

/// A connection manager to [`shared_url`], made once per test binary (on
/// [`PROPTEST_RUNTIME`] in a property test).
pub async fn shared_connection() -> redis::aio::ConnectionManager {
    static CONNECTION: tokio::sync::OnceCell<redis::aio::ConnectionManager> =
        tokio::sync::OnceCell::const_new();
    let connect = || async {
        redis::Client::open(shared_url())
            .unwrap()
            .get_connection_manager()
            .await
            .unwrap()
    };
    CONNECTION.get_or_init(connect).await.clone()
}
