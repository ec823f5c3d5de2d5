//! Self-tests for the Redis test harness in `tests/support/redis.rs`.

mod support;

use std::process::Command;
use std::time::{Duration, Instant};

use support::redis::{
    key_slot, shared_url, start_replica_of, unique_prefix, wait_for_replication, RedisCluster,
    RedisServer, SentinelSet,
};

fn ping(conn: &mut redis::Connection) -> String {
    redis::cmd("PING").query(conn).expect("PING")
}

fn set(conn: &mut redis::Connection, key: &str, value: &str) {
    redis::cmd("SET")
        .arg(key)
        .arg(value)
        .exec(conn)
        .expect("SET");
}

fn get(conn: &mut redis::Connection, key: &str) -> Option<String> {
    redis::cmd("GET").arg(key).query(conn).expect("GET")
}

/// Polls until nothing accepts connections on `port`, or gives up after 5 s.
fn port_goes_quiet(port: u16) -> bool {
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    false
}

#[test]
fn single_server_answers_ping_and_set_get() {
    let server = RedisServer::start();
    assert_ne!(server.port(), 6379, "must never use the system Redis");
    assert_eq!(
        server.url(),
        format!("redis://127.0.0.1:{}/", server.port())
    );
    assert!(server.is_running());

    let mut conn = server.conn();
    assert_eq!(ping(&mut conn), "PONG");
    set(&mut conn, "greeting", "hello");
    assert_eq!(get(&mut conn, "greeting").as_deref(), Some("hello"));

    // The configuration the brief asks for is really in effect.
    let save: Vec<String> = redis::cmd("CONFIG")
        .arg("GET")
        .arg("save")
        .query(&mut conn)
        .unwrap();
    assert_eq!(save, ["save", ""]);
    let () = redis::cmd("DEBUG")
        .arg("SLEEP")
        .arg(0)
        .query(&mut conn)
        .unwrap();
}

#[test]
fn stop_makes_connections_fail_and_restart_brings_it_back() {
    let mut server = RedisServer::start();
    let port = server.port();
    set(&mut server.conn(), "before", "stop");

    server.stop();
    assert!(!server.is_running());
    assert!(
        server
            .client()
            .get_connection_with_timeout(Duration::from_secs(1))
            .is_err(),
        "a stopped server must refuse connections"
    );

    server.restart();
    assert!(server.is_running());
    assert_eq!(server.port(), port, "restart keeps the port");
    let mut conn = server.conn();
    assert_eq!(ping(&mut conn), "PONG");
    assert_eq!(
        get(&mut conn, "before"),
        None,
        "no persistence across restarts"
    );
}

#[test]
fn dropping_a_server_kills_it() {
    let server = RedisServer::start();
    let port = server.port();
    let dir = server.dir().to_path_buf();
    drop(server);
    assert!(std::net::TcpStream::connect(("127.0.0.1", port)).is_err());
    assert!(!dir.exists(), "the temporary directory is removed");
}

#[test]
fn shared_url_is_one_server_and_prefixes_are_unique() {
    let url = shared_url();
    assert_eq!(url, shared_url(), "one shared server per binary");
    let mut conn = redis::Client::open(url.as_str())
        .unwrap()
        .get_connection()
        .unwrap();
    assert_eq!(ping(&mut conn), "PONG");
    if std::env::var_os("REDIS_URL").is_none() {
        assert!(!url.ends_with(":6379/"), "must never use the system Redis");
    }

    let a = unique_prefix("shared");
    let b = unique_prefix("shared");
    assert_ne!(a, b);
    assert!(a.starts_with("t:shared:"), "{a}");
    assert!(!a.contains(['{', '}']), "{a}");
}

#[test]
#[should_panic(expected = "must not contain braces")]
fn unique_prefix_rejects_hash_tags() {
    unique_prefix("{tag}");
}

#[test]
fn replica_receives_a_write() {
    let primary = RedisServer::start();
    let replica = start_replica_of(&primary);

    set(&mut primary.conn(), "replicated", "yes");
    wait_for_replication(&primary, &replica);

    let mut conn = replica.conn();
    assert_eq!(get(&mut conn, "replicated").as_deref(), Some("yes"));
    let write: redis::RedisResult<()> = redis::cmd("SET").arg("x").arg("1").query(&mut conn);
    assert!(write.is_err(), "a replica is read-only");
}

#[test]
fn key_slot_matches_the_hash_tag_rules() {
    // Values from the `CLUSTER KEYSLOT` documentation and the CRC16 check value.
    assert_eq!(key_slot("somekey"), 11058);
    assert_eq!(key_slot("foo{hash_tag}"), 2515);
    assert_eq!(key_slot("bar{hash_tag}"), 2515);
    assert_eq!(key_slot("123456789"), 0x31C3);
    assert_eq!(key_slot("user:{42}:a"), key_slot("42"));
    assert_eq!(key_slot("foo{bar}{zap}"), key_slot("bar"));
    assert_eq!(key_slot("foo{{bar}}zap"), key_slot("{bar"));
}

#[test]
fn cluster_3x1_reaches_ok_and_routes_keys() {
    let cluster = RedisCluster::start(3, 1);
    assert_eq!(cluster.nodes().len(), 6);
    assert_eq!(cluster.urls().len(), 6);
    let primaries = cluster.primary_urls();
    assert_eq!(primaries, cluster.urls()[..3]);

    for node in cluster.nodes() {
        let info: String = redis::cmd("CLUSTER")
            .arg("INFO")
            .query(&mut node.conn())
            .unwrap();
        assert!(info.contains("cluster_state:ok"), "{info}");
    }

    // The harness's slot maths agree with the server's.
    let mut any = cluster.nodes()[0].conn();
    for key in [
        "foo",
        "rate:{user:7}:a",
        "{}x",
        "foo{{bar}}zap",
        "plain:key:1",
    ] {
        let server_slot: u16 = redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(key)
            .query(&mut any)
            .unwrap();
        assert_eq!(key_slot(key), server_slot, "slot of {key:?}");
    }

    // `-c` semantics: a cluster client follows MOVED to the owner.
    let client = redis::cluster::ClusterClient::new(cluster.urls()).unwrap();
    let mut routed = client.get_connection().unwrap();
    let key = format!("{}:routed", unique_prefix("cluster"));
    let () = redis::cmd("SET")
        .arg(&key)
        .arg("here")
        .query(&mut routed)
        .unwrap();
    let value: String = redis::cmd("GET").arg(&key).query(&mut routed).unwrap();
    assert_eq!(value, "here");

    let owner = cluster.node_for_slot(key_slot(&key));
    assert!(owner < 3, "slot owners are the initial primaries");
    assert_eq!(
        get(&mut cluster.nodes()[owner].conn(), &key).as_deref(),
        Some("here")
    );
    let elsewhere = (owner + 1) % 3;
    let moved: redis::RedisResult<Option<String>> = redis::cmd("GET")
        .arg(&key)
        .query(&mut cluster.nodes()[elsewhere].conn());
    let err = moved.expect_err("another primary answers MOVED");
    let owner_addr = format!("127.0.0.1:{}", cluster.nodes()[owner].port());
    assert_eq!(
        err.redirect_node(),
        Some((owner_addr.as_str(), key_slot(&key))),
        "{err}"
    );
}

#[test]
fn cluster_fails_over_to_the_replica_and_takes_the_old_primary_back() {
    let mut cluster = RedisCluster::start(3, 1);
    let slot = 0;
    assert_eq!(cluster.node_for_slot(slot), 0);

    cluster.nodes_mut()[0].stop();
    cluster.wait_healthy();
    // Replica r of primary p sits at 3 + p.
    assert_eq!(cluster.node_for_slot(slot), 3, "the replica took over");

    cluster.nodes_mut()[0].restart();
    cluster.wait_healthy();
    assert_eq!(
        cluster.node_for_slot(slot),
        3,
        "the old primary came back as a replica"
    );
    assert_eq!(cluster.primary_urls().len(), 3);
}

#[test]
fn sentinel_set_reports_and_follows_the_master() {
    let mut primary = RedisServer::start();
    let replica = start_replica_of(&primary);
    let sentinels = SentinelSet::start(&primary, &[&replica], 3, "tollgate");
    assert_eq!(sentinels.urls().len(), 3);
    assert_eq!(sentinels.master_name(), "tollgate");
    assert_eq!(sentinels.current_master_port(), primary.port());

    let old = primary.port();
    primary.stop();
    assert_eq!(sentinels.wait_for_new_master(old), replica.port());
    let role: Vec<redis::Value> = redis::cmd("ROLE").query(&mut replica.conn()).unwrap();
    assert_eq!(
        role.first(),
        Some(&redis::Value::BulkString(b"master".to_vec()))
    );
}

/// Environment variable that turns [`orphan_probe`] into the child side of
/// [`servers_die_with_their_test_process`].
const PROBE: &str = "TOLLGATE_HARNESS_ORPHAN_PROBE";

/// Does nothing in a normal run. As a child process, it starts a server and
/// the shared server, prints their ports and exits without running any Drop.
#[test]
fn orphan_probe() {
    if std::env::var_os(PROBE).is_none() {
        return;
    }
    let server = RedisServer::start();
    let shared = shared_url();
    println!(
        "PROBE port={} dir={}",
        server.port(),
        server.dir().display()
    );
    println!("PROBE shared={shared}");
    std::mem::forget(server);
    std::process::exit(0);
}

#[test]
fn servers_die_with_their_test_process() {
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "orphan_probe", "--nocapture", "--test-threads=1"])
        .env(PROBE, "1")
        .env_remove("REDIS_URL")
        .output()
        .expect("run the orphan probe");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let field = |name: &str| {
        stdout
            .split_whitespace()
            .find_map(|w| w.strip_prefix(name))
            .unwrap_or_else(|| panic!("no {name} in probe output:\n{stdout}"))
            .to_string()
    };
    let port: u16 = field("port=").parse().unwrap();
    let dir = std::path::PathBuf::from(field("dir="));
    let shared_port: u16 = field("shared=")
        .trim_end_matches('/')
        .rsplit(':')
        .next()
        .unwrap()
        .parse()
        .unwrap();

    assert!(
        port_goes_quiet(port),
        "the leaked server on :{port} is still up"
    );
    assert!(
        port_goes_quiet(shared_port),
        "the shared server on :{shared_port} is still up"
    );
    let deadline = Instant::now() + Duration::from_secs(5);
    while dir.exists() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(25));
    }
    assert!(!dir.exists(), "{} was left behind", dir.display());
}
