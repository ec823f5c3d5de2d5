//! Issue 45, point 1: no write half-lands out of sight. An override's
//! write is a list entry and an override key in two hash slots; whatever
//! becomes of it (held past its deadline, stopped between the two,
//! refused by a replica, a replica promoted), the overrides an operator
//! lists are the ones requests meet, and `503` with `"applied": false`
//! comes only when nothing was written.

use std::sync::Arc;

use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use serde_json::{json, Value};
use tollgate::store::Shard;
use tollgate::{RedisStore, Store};
use tower::ServiceExt;

use super::{app, call, App};
use crate::support::redis::{start_replica_of, RedisServer};

const ACME: &str = "/admin/policies/api/overrides/caller?api_key=acme";

/// The limit a request of `acme` is told, and the limit the list shows
/// for it (`None`: not listed). They agree when the list is honest.
async fn seen(app: &App) -> (u64, Option<u64>) {
    let request = Request::get("/")
        .header("x-api-key", "acme")
        .body(Body::empty())
        .unwrap();
    let response = app.router.clone().oneshot(request).await.unwrap();
    let limit = response.headers()["x-ratelimit-limit"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    let (status, listed) = call(
        &app.router,
        &Method::GET,
        "/admin/policies/api/overrides",
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{listed}");
    let key = super::acme();
    let shown = listed["overrides"]
        .as_array()
        .unwrap()
        .iter()
        .find(|o| o["key"] == key.as_str())
        .map(|o| o["quotas"][0]["limit"].as_u64().unwrap());
    (limit, shown)
}

/// The list and the requests agree: listed with the limit requests get,
/// or unlisted and requests get the policy's 100.
async fn assert_agree(app: &App, why: &str) -> Option<u64> {
    let (limit, shown) = seen(app).await;
    match shown {
        Some(listed) => assert_eq!(
            listed, limit,
            "{why}: listed {listed}, requests get {limit}"
        ),
        None => assert_eq!(limit, 100, "{why}: unlisted, yet requests get {limit}"),
    }
    shown
}

fn pause_writes(server: &RedisServer) {
    let _: () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(60_000)
        .arg("WRITE")
        .query(&mut server.conn())
        .unwrap();
}

fn unpause(server: &RedisServer) {
    let _: () = redis::cmd("CLIENT")
        .arg("UNPAUSE")
        .query(&mut server.conn())
        .unwrap();
}

async fn put(app: &App, limit: u32) -> (StatusCode, Value) {
    let body = format!(r#"{{"limit": {limit}}}"#);
    call(&app.router, &Method::PUT, ACME, Some(&body)).await
}

/// Issue 45: with Redis holding writes, a `PUT` answered 504 and its
/// override landed once Redis went on, unlisted (the list's write was
/// never sent). Now both are sent before the answer is awaited, list
/// first: when it lands, it is listed, without a repeat.
#[tokio::test]
async fn a_write_held_past_its_deadline_is_listed_when_it_lands_without_a_repeat() {
    let redis = RedisServer::start();
    let app = app(Arc::new(RedisStore::connect(&redis.url()).await.unwrap()));
    assert_eq!(put(&app, 1).await.0, StatusCode::OK, "loads the scripts");
    assert_eq!(
        call(&app.router, &Method::DELETE, ACME, None).await.0,
        StatusCode::OK
    );

    pause_writes(&redis);
    let (status, body) = put(&app, 77).await;
    assert_eq!(status, StatusCode::GATEWAY_TIMEOUT, "{body}");
    assert_eq!(body["error"]["applied"], "unknown");
    unpause(&redis);
    assert_eq!(assert_agree(&app, "after a held set").await, Some(77));

    // A clear held the same way: gone from both once it lands.
    pause_writes(&redis);
    let (status, body) = call(&app.router, &Method::DELETE, ACME, None).await;
    assert_eq!(status, StatusCode::GATEWAY_TIMEOUT, "{body}");
    unpause(&redis);
    assert_eq!(assert_agree(&app, "after a held clear").await, None);
}

/// Two shards: the list on one, `acme`'s override key on the other,
/// and an app over them.
struct Split {
    list: RedisServer,
    caller: RedisServer,
    app: App,
}

async fn split() -> Split {
    let a = RedisServer::start();
    let b = RedisServer::start();
    let store = RedisStore::sharded([Shard::new("a", a.url()), Shard::new("b", b.url())])
        .connect()
        .await
        .unwrap()
        .build()
        .unwrap();
    let store: Arc<dyn Store> = Arc::new(store);
    let app = app(store);
    assert_eq!(put(&app, 1).await.0, StatusCode::OK);
    let holds = |server: &RedisServer, what: &str| {
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg(what)
            .query(&mut server.conn())
            .unwrap();
        !keys.is_empty()
    };
    let (list, caller) = match (holds(&a, "*~overrides*"), holds(&a, "*:override")) {
        (true, false) => (a, b),
        (false, true) => (b, a),
        // Both on one shard: rendezvous hashing put them together; the
        // test names another shard pair rather than another caller.
        other => panic!("list and override on the same shard: {other:?}"),
    };
    assert_eq!(
        call(&app.router, &Method::DELETE, ACME, None).await.0,
        StatusCode::OK
    );
    assert_eq!(assert_agree(&app, "cleared").await, None);
    Split { list, caller, app }
}

/// Issue 45: a write stopped between its two halves. With the override
/// key's server holding writes, the list's mark lands, the override waits
/// past the deadline (504), then lands; the entry, never confirmed, is
/// settled from the override key, so the list shows what requests meet.
/// With the list's server holding writes, nothing else is sent.
#[tokio::test]
async fn a_write_stopped_between_the_list_and_the_override_is_listed_as_requests_meet_it() {
    let Split { list, caller, app } = split().await;

    pause_writes(&caller);
    let (status, body) = put(&app, 77).await;
    assert_eq!(status, StatusCode::GATEWAY_TIMEOUT, "{body}");
    unpause(&caller);
    assert_eq!(
        assert_agree(&app, "the override landed after the mark").await,
        Some(77)
    );

    pause_writes(&list);
    let (status, body) = put(&app, 88).await;
    assert_eq!(status, StatusCode::GATEWAY_TIMEOUT, "{body}");
    unpause(&list);
    assert_eq!(
        assert_agree(&app, "the mark was held, the override never sent").await,
        Some(77)
    );

    pause_writes(&caller);
    let (status, body) = call(&app.router, &Method::DELETE, ACME, None).await;
    assert_eq!(status, StatusCode::GATEWAY_TIMEOUT, "{body}");
    unpause(&caller);
    assert_eq!(assert_agree(&app, "a clear stopped half-way").await, None);

    // Repeating completes it, and the list is confirmed.
    assert_eq!(put(&app, 99).await.0, StatusCode::OK);
    assert_eq!(assert_agree(&app, "repeated").await, Some(99));
}

/// Issue 45: `READONLY` mapped to 503 `"applied": false` even when the
/// first write had landed. A replica refuses the first write: 503, and
/// nothing is written; promoted (`REPLICAOF NO ONE`), it takes the write.
/// When the list's shard takes the mark and the caller's shard, a
/// replica, refuses the override, the answer is a 504: the list changed.
#[tokio::test]
async fn a_replica_refuses_with_503_only_when_nothing_was_written_and_takes_writes_once_promoted() {
    let primary = RedisServer::start();
    let replica = start_replica_of(&primary);
    let app = app(Arc::new(RedisStore::connect(&replica.url()).await.unwrap()));
    let (status, body) = put(&app, 77).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(body["error"]["applied"], json!(false));
    let _: () = redis::cmd("REPLICAOF")
        .arg("NO")
        .arg("ONE")
        .query(&mut replica.conn())
        .unwrap();
    assert_eq!(assert_agree(&app, "refused by the replica").await, None);
    let (status, body) = put(&app, 77).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(assert_agree(&app, "promoted").await, Some(77));

    let Split {
        caller,
        app,
        list: _list,
    } = split().await;
    let port = primary.port().to_string();
    let _: () = redis::cmd("REPLICAOF")
        .arg("127.0.0.1")
        .arg(&port)
        .query(&mut caller.conn())
        .unwrap();
    let (status, body) = put(&app, 55).await;
    assert_eq!(status, StatusCode::GATEWAY_TIMEOUT, "{body}");
    assert_eq!(
        body["error"]["applied"], "unknown",
        "the list's mark landed"
    );
    let _: () = redis::cmd("REPLICAOF")
        .arg("NO")
        .arg("ONE")
        .query(&mut caller.conn())
        .unwrap();
    assert_eq!(assert_agree(&app, "the override refused").await, None);
}

/// Issue 45, point 7: `GET /policies` read each adjustable policy's
/// runtime limits one after another, and one timeout failed the whole
/// list with a 504. Now the reads go at once, and a policy whose read
/// failed is shown as built, with `runtime_error`, beside the others.
#[tokio::test]
async fn a_read_redis_holds_fails_its_policy_in_the_list_not_the_list() {
    let redis = RedisServer::start();
    let app = app(Arc::new(RedisStore::connect(&redis.url()).await.unwrap()));
    let (status, _) = call(&app.router, &Method::GET, "/admin/policies", None).await;
    assert_eq!(status, StatusCode::OK, "loads the scripts");

    redis.pause_clients(std::time::Duration::from_millis(400));
    let (status, list) = call(&app.router, &Method::GET, "/admin/policies", None).await;
    assert_eq!(status, StatusCode::OK, "{list}");
    let policies = list["policies"].as_array().unwrap();
    assert_eq!(policies.len(), 4, "{list}");
    for policy in policies {
        if policy["name"] == "api" {
            assert_eq!(policy["runtime_error"]["status"], json!(504), "{policy}");
            assert_eq!(policy["runtime"], Value::Null);
        } else {
            assert!(policy.get("runtime_error").is_none(), "{policy}");
        }
    }
}

/// `GET /policies` reads the runtime limits of every adjustable policy on
/// one store in one call: they live in one hash. Three adjustable
/// policies on one Redis, one of them with a limit set: one `EVALSHA` for
/// the list, and each shows its own limits.
#[tokio::test]
async fn the_list_reads_every_runtime_limit_of_one_store_in_one_call() {
    use tollgate::admin::AdminApi;
    use tollgate::{Override, Policy, Quota, RateLimitLayer};
    let redis = RedisServer::start();
    let store: Arc<dyn Store> = Arc::new(RedisStore::connect(&redis.url()).await.unwrap());
    let per_hour = |n| Quota::per_hour(std::num::NonZeroU32::new(n).unwrap());
    let layers: Vec<RateLimitLayer> = ["search", "upload", "login"]
        .into_iter()
        .map(|name| {
            RateLimitLayer::builder()
                .policy(Policy::fixed_window(name, per_hour(100)).adjustable())
                .shared_store(store.clone())
                .build()
                .unwrap()
        })
        .collect();
    layers[1]
        .limiter()
        .set_policy_limit(Override::new(per_hour(7)))
        .await
        .unwrap();
    let admin = layers
        .iter()
        .fold(AdminApi::new(), |api, layer| api.layer(layer))
        .router();
    let (status, _) = call(&admin, &Method::GET, "/policies", None).await;
    assert_eq!(status, StatusCode::OK, "loads the script");
    let before = crate::support::redis::evalsha_calls(&redis);
    let (status, list) = call(&admin, &Method::GET, "/policies", None).await;
    assert_eq!(status, StatusCode::OK, "{list}");
    assert_eq!(
        crate::support::redis::evalsha_calls(&redis) - before,
        1,
        "one call for three policies"
    );
    let limit_of = |name: &str| {
        list["policies"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == name)
            .unwrap()["runtime"]["limit"]
            .clone()
    };
    assert_eq!(limit_of("upload")["quotas"][0]["limit"], json!(7), "{list}");
    assert_eq!(limit_of("search"), Value::Null, "{list}");
    assert_eq!(limit_of("login"), Value::Null, "{list}");
}
