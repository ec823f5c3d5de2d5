//! The admin API (`tollgate::admin`) and `RateLimiter::unblock`, on the
//! memory store and a real Redis: every route, every kind of bad input
//! refused naming its field with nothing stored, a store that times out
//! (504, and the write lands after) or refuses (503), and the OpenAPI
//! document held to the routes served.

#[path = "admin/callers.rs"]
mod callers;
#[path = "admin/in_force.rs"]
mod in_force;
#[path = "admin/note.rs"]
mod note;
#[path = "admin/peek.rs"]
mod peek;
#[path = "admin/restore.rs"]
mod restore;
#[path = "admin/round_trip.rs"]
mod round_trip;
mod support;
#[path = "admin/writes.rs"]
mod writes;

use std::collections::BTreeSet;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use axum::routing::get;
use axum::Router;
use http_body_util::BodyExt;
use serde_json::{json, Value};
use support::redis::RedisServer;
use tollgate::admin::AdminApi;
use tollgate::key::Caller;
use tollgate::{
    HeaderKey, Key, KeyExtractor, MemoryStore, Override, PeerIp, PenaltyBox, Policy, Quota,
    RateLimitLayer, RateLimiter, RedisStore, Store, TieredLayer,
};
use tower::ServiceExt;

fn n(x: u32) -> NonZeroU32 {
    NonZeroU32::new(x).unwrap()
}

fn per_hour(x: u32) -> Quota {
    Quota::per_hour(n(x))
}

fn penalty() -> PenaltyBox {
    PenaltyBox::new(n(3), Duration::from_secs(60), Duration::from_secs(60)).unwrap()
}

/// An app with the admin API under `/admin` over four policies on
/// `store`, keyed by `X-Api-Key` or else the peer's address:
/// - `api`: 100 an hour, overridable, with a penalty box (and `/` is
///   limited by it);
/// - `pair`: 10 a minute and 100 an hour, overridable;
/// - `gate`: a uniform gate, overridable;
/// - `plain`: neither overridable nor with a penalty box.
struct App {
    router: Router,
    api: RateLimitLayer,
    limiters: Vec<RateLimiter>,
}

fn app(store: Arc<dyn Store>) -> App {
    let key = || HeaderKey::new("x-api-key").or(PeerIp::new());
    let layer = |policy: Policy| {
        RateLimitLayer::builder()
            .policy(policy)
            .shared_store(store.clone())
            .key(key())
            .build()
            .unwrap()
    };
    let api = layer(
        Policy::fixed_window("api", per_hour(100))
            .overridable()
            .adjustable()
            .with_penalty_box(penalty()),
    );
    let pair = layer(
        Policy::fixed_window("pair", Quota::per_minute(n(10)))
            .and(per_hour(100))
            .overridable(),
    );
    let gate = layer(
        Policy::uniform_gate("gate", Duration::from_secs(10))
            .unwrap()
            .overridable(),
    );
    let plain = layer(Policy::fixed_window("plain", per_hour(100)));
    let admin = AdminApi::new()
        .layer(&api)
        .layer(&pair)
        .layer(&gate)
        .layer(&plain)
        .header_alias("api_key", "x-api-key")
        .router();
    let router = Router::new()
        .route("/", get(|| async { "ok" }).layer(api.clone()))
        .nest("/admin", admin);
    let limiters = [&api, &pair, &gate, &plain]
        .map(RateLimitLayer::limiter)
        .to_vec();
    App {
        router,
        api,
        limiters,
    }
}

/// `method uri` with `body`, answered: the status and the JSON body.
async fn call(app: &Router, method: &Method, uri: &str, body: Option<&str>) -> (StatusCode, Value) {
    let request = Request::builder()
        .method(method.clone())
        .uri(uri)
        .header("content-type", "application/json")
        .body(body.map_or_else(Body::empty, |b| Body::from(b.to_owned())))
        .unwrap();
    let response = app.clone().oneshot(request).await.unwrap();
    let status = response.status();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    let value = serde_json::from_slice(&bytes).unwrap_or_else(|_| {
        panic!(
            "{method} {uri}: not JSON: {}",
            String::from_utf8_lossy(&bytes)
        )
    });
    if let Some(path) = uri.strip_prefix("/admin") {
        assert_fits_its_schema(method, path, status, &value);
    }
    (status, value)
}

/// The admin API's document as written.
fn openapi() -> &'static Value {
    static DOC: std::sync::OnceLock<Value> = std::sync::OnceLock::new();
    DOC.get_or_init(|| serde_json::from_str(include_str!("../src/admin/openapi.json")).unwrap())
}

/// Issue 45: every answer a test gets is checked against the schema
/// `openapi.json` gives its route and status (a status it does not list
/// fails); an answer of no route (`404`, `405`) against `Error`.
fn assert_fits_its_schema(method: &Method, uri: &str, status: StatusCode, body: &Value) {
    let doc = openapi();
    let path = uri.split('?').next().unwrap();
    let template = doc["paths"].as_object().unwrap().iter().find(|(t, _)| {
        let (t, p): (Vec<&str>, Vec<&str>) = (t.split('/').collect(), path.split('/').collect());
        t.len() == p.len() && t.iter().zip(&p).all(|(t, p)| t.starts_with('{') || t == p)
    });
    let operation = template.and_then(|(_, item)| item.get(method.as_str().to_lowercase()));
    let schema = match operation {
        None => json!({ "$ref": "#/components/schemas/Error" }),
        Some(operation) => {
            let Some(mut response) = operation["responses"].get(status.as_str()) else {
                panic!("{method} {uri}: {status} is not in openapi.json: {body}");
            };
            if let Some(at) = response["$ref"].as_str() {
                response = doc.pointer(at.trim_start_matches('#')).unwrap();
            }
            response["content"]["application/json"]["schema"].clone()
        }
    };
    let mut root = schema;
    root["$schema"] = json!("https://json-schema.org/draft/2020-12/schema");
    root["components"] = doc["components"].clone();
    let validator = jsonschema::validator_for(&root)
        .unwrap_or_else(|err| panic!("{method} {uri}: the schema does not compile: {err}"));
    let errors: Vec<String> = validator
        .iter_errors(body)
        .map(|e| format!("{} at {}", e, e.instance_path()))
        .collect();
    assert!(
        errors.is_empty(),
        "{method} {uri} {status}: the answer does not fit openapi.json: {errors:#?}\n{body}"
    );
}

fn acme() -> Key {
    HeaderKey::new("x-api-key")
        .or(PeerIp::new())
        .key_of(&Caller::new().header("x-api-key", "acme").unwrap())
        .unwrap()
}

fn later(secs: u64) -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
        + secs
}

// ---- unblock

async fn unblock_lets_a_caller_out_and_keeps_its_counters(store: Arc<dyn Store>) {
    let limiter = RateLimiter::new(
        Policy::fixed_window("login", Quota::per_minute(n(10))).with_penalty_box(penalty()),
        store.clone(),
    )
    .unwrap();
    let mallory = Key::new("mallory");
    assert!(
        !limiter.unblock(&mallory).await.unwrap(),
        "nothing to unblock yet"
    );
    limiter.check(&mallory, 4).await.unwrap();
    limiter
        .block(&mallory, Duration::from_secs(600))
        .await
        .unwrap();
    assert!(limiter.check(&mallory, 1).await.unwrap().blocked);

    assert!(limiter.unblock(&mallory).await.unwrap());
    let next = limiter.check(&mallory, 1).await.unwrap();
    assert!(next.allowed && !next.blocked, "{next:?}");
    assert_eq!(
        next.used, 5,
        "the 4 units spent before the block still count"
    );
    assert!(!limiter.unblock(&mallory).await.unwrap(), "already out");

    // Strikes are cleared too: three rejections start a block, two do not.
    limiter.check(&mallory, 5).await.unwrap();
    for _ in 0..2 {
        assert!(!limiter.check(&mallory, 1).await.unwrap().allowed);
    }
    assert!(
        limiter.unblock(&mallory).await.unwrap(),
        "two strikes were an entry"
    );
    assert!(!limiter.check(&mallory, 1).await.unwrap().blocked);
    assert!(
        !limiter.check(&mallory, 1).await.unwrap().blocked,
        "counting from one again"
    );

    let plain = RateLimiter::new(Policy::fixed_window("plain", per_hour(1)), store).unwrap();
    assert!(
        !plain.unblock(&mallory).await.unwrap(),
        "no penalty box, nothing to unblock"
    );
}

#[tokio::test]
async fn unblock_on_the_memory_store() {
    unblock_lets_a_caller_out_and_keeps_its_counters(Arc::new(MemoryStore::new())).await;
}

#[tokio::test]
async fn unblock_on_redis_deletes_only_the_penalty_key() {
    let redis = RedisServer::start();
    let store = RedisStore::connect(&redis.url()).await.unwrap();
    unblock_lets_a_caller_out_and_keeps_its_counters(Arc::new(store.clone())).await;

    let limiter = RateLimiter::new(
        Policy::fixed_window("one", Quota::per_minute(n(10))).with_penalty_box(penalty()),
        store,
    )
    .unwrap();
    let eve = Key::new("eve");
    limiter.check(&eve, 1).await.unwrap();
    limiter.block(&eve, Duration::from_secs(60)).await.unwrap();
    let mut keys: Vec<String> = redis::cmd("KEYS")
        .arg("*one*")
        .query(&mut redis.conn())
        .unwrap();
    keys.sort();
    assert_eq!(
        keys,
        [
            "tollgate:{one|eve}:fixed_window:0",
            "tollgate:{one|eve}:penalty"
        ]
    );
    assert!(limiter.unblock(&eve).await.unwrap());
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("*one*")
        .query(&mut redis.conn())
        .unwrap();
    assert_eq!(
        keys,
        ["tollgate:{one|eve}:fixed_window:0"],
        "the counter stays"
    );
}

// ---- the routes

#[tokio::test]
async fn policies_are_listed_as_built() {
    let app = app(Arc::new(MemoryStore::new()));
    let (status, body) = call(&app.router, &Method::GET, "/admin/policies", None).await;
    assert_eq!(status, StatusCode::OK);
    let names: Vec<&str> = body["policies"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["api", "gate", "pair", "plain"]);
    let (status, api) = call(&app.router, &Method::GET, "/admin/policies/api", None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        api,
        json!({
            "name": "api",
            "strategy": "fixed_window",
            "quotas": [{"limit": 100, "window_secs": 3600}],
            "overridable": true,
            "adjustable": true,
            "penalty_box": {"strikes": 3, "within_secs": 60, "block_secs": 60, "longest_block_secs": 60},
            "runtime": {"limit": null, "cap": null},
        })
    );
    let (_, plain) = call(&app.router, &Method::GET, "/admin/policies/plain", None).await;
    assert_eq!(
        (&plain["overridable"], &plain["penalty_box"]),
        (&json!(false), &Value::Null)
    );
    assert_eq!(
        (&plain["adjustable"], &plain["runtime"]),
        (&json!(false), &Value::Null)
    );
}

#[tokio::test]
async fn an_override_set_for_a_caller_named_by_alias_judges_its_requests() {
    let app = app(Arc::new(MemoryStore::new()));
    let until = later(3600);
    let body = format!(r#"{{"limit": 5000, "until": {until}}}"#);
    let uri = "/admin/policies/api/overrides/caller?api_key=acme";
    let (status, set) = call(&app.router, &Method::PUT, uri, Some(&body)).await;
    assert_eq!(status, StatusCode::OK, "{set}");
    let key = acme();
    assert_eq!(set["key"], key.as_str());
    assert_eq!(
        set["override"],
        json!({"quotas": [{"limit": 5000, "window_secs": 3600}], "until": until})
    );

    // A request of that caller is judged by it.
    let request = Request::get("/")
        .header("x-api-key", "acme")
        .body(Body::empty())
        .unwrap();
    let response = app.router.clone().oneshot(request).await.unwrap();
    assert_eq!(response.headers()["x-ratelimit-limit"], "5000");

    // The same caller, spelt as its header.
    let spelt = "/admin/policies/api/overrides/caller?header.x-api-key=acme";
    let (status, got) = call(&app.router, &Method::GET, spelt, None).await;
    assert_eq!(
        (status, &got["override"]),
        (StatusCode::OK, &set["override"])
    );
    let (_, listed) = call(
        &app.router,
        &Method::GET,
        "/admin/policies/api/overrides",
        None,
    )
    .await;
    assert_eq!(listed["overrides"][0]["key"], key.as_str());
    let (_, state) = call(
        &app.router,
        &Method::GET,
        "/admin/policies/api/peek?api_key=acme",
        None,
    )
    .await;
    assert_eq!(
        (state["limit"].as_u64(), state["used"].as_u64()),
        (Some(5000), Some(1))
    );

    let (status, cleared) = call(&app.router, &Method::DELETE, uri, None).await;
    assert_eq!(
        (status, &cleared["cleared"]),
        (StatusCode::OK, &json!(true))
    );
    let (status, again) = call(&app.router, &Method::DELETE, uri, None).await;
    assert_eq!(
        (status, &again["cleared"]),
        (StatusCode::OK, &json!(false)),
        "a repeat is harmless"
    );
    assert_eq!(app.limiters[0].get_override(&key).await.unwrap(), None);
}

#[tokio::test]
async fn every_quota_of_a_policy_is_overridden_by_quotas() {
    let app = app(Arc::new(MemoryStore::new()));
    let body =
        r#"{"quotas": [{"limit": 20, "window_secs": 60}, {"limit": 1000, "window_secs": 3600}]}"#;
    let uri = "/admin/policies/pair/overrides/caller?ip=203.0.113.9";
    let (status, set) = call(&app.router, &Method::PUT, uri, Some(body)).await;
    assert_eq!(status, StatusCode::OK, "{set}");
    assert_eq!(set["key"], "ip:203.0.113.9");
    let o = app.limiters[1]
        .get_override(&Key::new("ip:203.0.113.9"))
        .await
        .unwrap();
    assert_eq!(
        o,
        Some(Override::new(Quota::per_minute(n(20))).and(per_hour(1000)))
    );
}

#[tokio::test]
async fn a_block_refuses_the_caller_until_unblocked_and_a_reset_forgets_it() {
    let app = app(Arc::new(MemoryStore::new()));
    let uri = "/admin/policies/api/block?ip=198.51.100.7";
    let (status, blocked) = call(&app.router, &Method::PUT, uri, Some(r#"{"seconds": 600}"#)).await;
    assert_eq!(
        (status, &blocked["blocked_secs"]),
        (StatusCode::OK, &json!(600))
    );
    let peek = "/admin/policies/api/peek?ip=198.51.100.7";
    let (_, state) = call(&app.router, &Method::GET, peek, None).await;
    assert_eq!(state["blocked"], true);
    assert!(state["retry_after_secs"].as_u64().unwrap() > 590, "{state}");

    let (status, out) = call(&app.router, &Method::DELETE, uri, None).await;
    assert_eq!((status, &out["unblocked"]), (StatusCode::OK, &json!(true)));
    let (_, state) = call(&app.router, &Method::GET, peek, None).await;
    assert_eq!(state["blocked"], false);

    let ip = Key::new("ip:198.51.100.7");
    app.limiters[0].check(&ip, 7).await.unwrap();
    let (status, reset) = call(
        &app.router,
        &Method::POST,
        "/admin/policies/api/reset?ip=198.51.100.7",
        None,
    )
    .await;
    assert_eq!((status, &reset["reset"]), (StatusCode::OK, &json!(true)));
    assert_eq!(app.limiters[0].peek(&ip).await.unwrap().used, 0);
}

#[tokio::test]
async fn tiers_are_served_under_their_policies_names() {
    let tiered = TieredLayer::builder()
        .tier(
            RateLimitLayer::builder()
                .policy(Policy::fixed_window("free", per_hour(60)))
                .key(PeerIp::new()),
        )
        .tier(
            RateLimitLayer::builder()
                .policy(Policy::fixed_window("pro", per_hour(5000)).overridable())
                .key(HeaderKey::new("x-api-key")),
        )
        .choose(|parts| {
            Some(if parts.headers.contains_key("x-api-key") {
                "pro"
            } else {
                "free"
            })
        })
        .build()
        .unwrap();
    let admin: Router = AdminApi::new().tiers(&tiered).router();
    let (status, set) = call(
        &admin,
        &Method::PUT,
        "/policies/pro/overrides/caller?header.x-api-key=acme",
        Some(r#"{"limit": 9000}"#),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{set}");
    let pro = tiered.limiter("pro").unwrap();
    assert_eq!(pro.peek(&acme_under(&pro)).await.unwrap().limit, 9000);
    let (status, err) = call(
        &admin,
        &Method::GET,
        "/policies/pro/peek?ip=192.0.2.1",
        None,
    )
    .await;
    assert_eq!(
        (status, &err["error"]["field"]),
        (StatusCode::BAD_REQUEST, &json!("caller")),
        "pro is keyed by its header alone"
    );
}

fn acme_under(limiter: &RateLimiter) -> Key {
    limiter
        .key_of(&Caller::new().header("x-api-key", "acme").unwrap())
        .unwrap()
}

// ---- bad input

/// One kind of bad input: the request, and the status and field it gets.
struct Bad {
    what: &'static str,
    method: Method,
    uri: String,
    body: Option<String>,
    status: u16,
    field: &'static str,
}

fn bad(
    what: &'static str,
    method: Method,
    uri: &str,
    body: Option<&str>,
    status: u16,
    field: &'static str,
) -> Bad {
    Bad {
        what,
        method,
        uri: uri.to_owned(),
        body: body.map(str::to_owned),
        status,
        field,
    }
}

fn bad_inputs() -> Vec<Bad> {
    const ACME: &str = "/admin/policies/api/overrides/caller?api_key=acme";
    const PAIR: &str = "/admin/policies/pair/overrides/caller?api_key=acme";
    const BLOCK: &str = "/admin/policies/api/block?api_key=acme";
    let put = Method::PUT;
    let past = format!(r#"{{"limit": 5, "until": {}}}"#, later(0) - 60);
    let oversized = format!(r#"{{"limit": 5, "pad": "{}"}}"#, "x".repeat(17 * 1024));
    let mut rows = vec![
        bad(
            "a limit of 0",
            put.clone(),
            ACME,
            Some(r#"{"limit": 0}"#),
            400,
            "limit",
        ),
        bad(
            "a negative limit",
            put.clone(),
            ACME,
            Some(r#"{"limit": -1}"#),
            400,
            "limit",
        ),
        bad(
            "a limit above u32::MAX",
            put.clone(),
            ACME,
            Some(r#"{"limit": 4294967296}"#),
            400,
            "limit",
        ),
        bad(
            "a fractional limit",
            put.clone(),
            ACME,
            Some(r#"{"limit": 2.5}"#),
            400,
            "limit",
        ),
        bad(
            "a limit as a string",
            put.clone(),
            ACME,
            Some(r#"{"limit": "5"}"#),
            400,
            "limit",
        ),
        bad(
            "a limit the strategy refuses",
            put.clone(),
            "/admin/policies/gate/overrides/caller?api_key=acme",
            Some(r#"{"limit": 2}"#),
            400,
            "limit",
        ),
        bad(
            "malformed JSON",
            put.clone(),
            ACME,
            Some(r#"{"limit": 5"#),
            400,
            "body",
        ),
        bad(
            "a body that is not an object",
            put.clone(),
            ACME,
            Some("[5]"),
            400,
            "body",
        ),
        bad("an empty body", put.clone(), ACME, None, 400, "body"),
        bad(
            "a misspelt field",
            put.clone(),
            ACME,
            Some(r#"{"limt": 5}"#),
            400,
            "limt",
        ),
        bad(
            "an end in the past",
            put.clone(),
            ACME,
            Some(&past),
            400,
            "until",
        ),
        bad(
            "quotas of the wrong number",
            put.clone(),
            PAIR,
            Some(r#"{"quotas": [{"limit": 5, "window_secs": 60}]}"#),
            400,
            "quotas",
        ),
        bad(
            "a quota's limit of 0",
            put.clone(),
            PAIR,
            Some(
                r#"{"quotas": [{"limit": 5, "window_secs": 60}, {"limit": 0, "window_secs": 60}]}"#,
            ),
            400,
            "quotas[1].limit",
        ),
        bad(
            "a quota's window of 0",
            put.clone(),
            PAIR,
            Some(
                r#"{"quotas": [{"limit": 5, "window_secs": 0}, {"limit": 5, "window_secs": 60}]}"#,
            ),
            400,
            "quotas[0].window_secs",
        ),
        bad(
            "a limit for a policy of two quotas",
            put.clone(),
            PAIR,
            Some(r#"{"limit": 5}"#),
            400,
            "limit",
        ),
        bad(
            "an unknown policy",
            put.clone(),
            "/admin/policies/nope/overrides/caller?api_key=acme",
            Some(r#"{"limit": 5}"#),
            404,
            "policy",
        ),
        bad(
            "a bad IP",
            put.clone(),
            "/admin/policies/api/overrides/caller?ip=203.0.113.300",
            Some(r#"{"limit": 5}"#),
            400,
            "ip",
        ),
        bad(
            "an IP given twice",
            put.clone(),
            "/admin/policies/api/overrides/caller?ip=192.0.2.1&ip=192.0.2.2",
            Some(r#"{"limit": 5}"#),
            400,
            "ip",
        ),
        bad(
            "a hash tag in an alias",
            put.clone(),
            "/admin/policies/api/overrides/caller?api_key=%7Bacme%7D",
            Some(r#"{"limit": 5}"#),
            400,
            "api_key",
        ),
        bad(
            "a hash tag in a header",
            put.clone(),
            "/admin/policies/api/overrides/caller?header.x-api-key=a%7Db",
            Some(r#"{"limit": 5}"#),
            400,
            "header.x-api-key",
        ),
        bad(
            "no caller named",
            put.clone(),
            "/admin/policies/api/overrides/caller",
            Some(r#"{"limit": 5}"#),
            400,
            "caller",
        ),
        bad(
            "an unknown parameter",
            put.clone(),
            "/admin/policies/api/overrides/caller?ipp=192.0.2.1",
            Some(r#"{"limit": 5}"#),
            400,
            "ipp",
        ),
        bad(
            "an override of a policy that takes none",
            put.clone(),
            "/admin/policies/plain/overrides/caller?api_key=acme",
            Some(r#"{"limit": 5}"#),
            409,
            "policy",
        ),
        bad(
            "a block of 0 seconds",
            put.clone(),
            BLOCK,
            Some(r#"{"seconds": 0}"#),
            400,
            "seconds",
        ),
        bad(
            "a fractional block",
            put.clone(),
            BLOCK,
            Some(r#"{"seconds": 1.5}"#),
            400,
            "seconds",
        ),
        bad(
            "a block over 366 days",
            put.clone(),
            BLOCK,
            Some(r#"{"seconds": 31622401}"#),
            400,
            "seconds",
        ),
        bad(
            "a block with a bad IP",
            put.clone(),
            "/admin/policies/api/block?ip=nope",
            Some(r#"{"seconds": 60}"#),
            400,
            "ip",
        ),
        bad(
            "a block in a policy without a penalty box",
            put.clone(),
            "/admin/policies/plain/block?api_key=acme",
            Some(r#"{"seconds": 60}"#),
            409,
            "policy",
        ),
        bad(
            "a reset of an unknown policy",
            Method::POST,
            "/admin/policies/nope/reset?api_key=acme",
            None,
            404,
            "policy",
        ),
        bad(
            "a reset naming no caller",
            Method::POST,
            "/admin/policies/api/reset",
            None,
            400,
            "caller",
        ),
    ];
    rows.push(Bad {
        what: "an oversized body",
        method: put,
        uri: ACME.to_owned(),
        body: Some(oversized),
        status: 413,
        field: "body",
    });
    rows
}

/// Runs every row of [`bad_inputs`] against `app` and checks, through
/// the store, that nothing was stored.
async fn refuses_bad_input_and_stores_nothing(app: &App) {
    let key = acme();
    let callers = [
        key.clone(),
        Key::new("ip:203.0.113.9"),
        Key::new("ip:192.0.2.1"),
    ];
    for row in bad_inputs() {
        let (status, body) = call(&app.router, &row.method, &row.uri, row.body.as_deref()).await;
        assert_eq!(status.as_u16(), row.status, "{}: {body}", row.what);
        assert_eq!(body["error"]["field"], row.field, "{}: {body}", row.what);
        assert!(
            body["error"]["message"]
                .as_str()
                .is_some_and(|m| !m.is_empty()),
            "{}",
            row.what
        );
        for limiter in &app.limiters {
            let name = limiter.policy().name();
            if limiter.policy().is_overridable() {
                assert!(
                    limiter.list_overrides().await.unwrap().is_empty(),
                    "{}: {name}",
                    row.what
                );
            }
            for caller in &callers {
                if limiter.policy().is_overridable() {
                    assert_eq!(
                        limiter.get_override(caller).await.unwrap(),
                        None,
                        "{}",
                        row.what
                    );
                }
                let state = limiter.peek(caller).await.unwrap();
                assert!(
                    !state.blocked && state.used == 0,
                    "{}: {name}: {state:?}",
                    row.what
                );
            }
        }
    }
    let _ = &app.api;
}

#[tokio::test]
async fn bad_input_is_refused_naming_its_field_and_nothing_is_stored_in_memory() {
    refuses_bad_input_and_stores_nothing(&app(Arc::new(MemoryStore::new()))).await;
}

#[tokio::test]
async fn bad_input_is_refused_naming_its_field_and_nothing_is_stored_in_redis() {
    let redis = RedisServer::start();
    let store = RedisStore::connect(&redis.url()).await.unwrap();
    refuses_bad_input_and_stores_nothing(&app(Arc::new(store))).await;
    let size: u64 = redis::cmd("DBSIZE").query(&mut redis.conn()).unwrap();
    assert_eq!(size, 0, "Redis holds no key at all");
}

// ---- store failures

#[tokio::test]
async fn a_write_redis_holds_past_the_deadline_is_a_504_and_lands_when_redis_lets_it() {
    let redis = RedisServer::start();
    let store = RedisStore::connect(&redis.url()).await.unwrap();
    let app = app(Arc::new(store));
    let uri = "/admin/policies/api/overrides/caller?api_key=acme";
    // Loads the scripts, so the held call is the write itself.
    let warm = "/admin/policies/api/overrides/caller?api_key=warm";
    assert_eq!(
        call(&app.router, &Method::PUT, warm, Some(r#"{"limit": 1}"#))
            .await
            .0,
        StatusCode::OK
    );

    let _: () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(600)
        .arg("WRITE")
        .query(&mut redis.conn())
        .unwrap();
    let (status, body) = call(&app.router, &Method::PUT, uri, Some(r#"{"limit": 5000}"#)).await;
    assert_eq!(status, StatusCode::GATEWAY_TIMEOUT, "{body}");
    assert_eq!(body["error"]["applied"], "unknown");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("may or may not have been applied") && message.contains("idempotent"),
        "{message}"
    );

    tokio::time::sleep(Duration::from_millis(800)).await;
    let limiter = &app.limiters[0];
    let landed = limiter.get_override(&acme()).await.unwrap();
    assert_eq!(
        landed,
        Some(Override::new(per_hour(5000))),
        "the held write ran once Redis went on"
    );

    // Repeating it is safe, and completes what the 504 left undone.
    let (status, _) = call(&app.router, &Method::PUT, uri, Some(r#"{"limit": 5000}"#)).await;
    assert_eq!(status, StatusCode::OK);
    let listed: BTreeSet<String> = limiter
        .list_overrides()
        .await
        .unwrap()
        .into_iter()
        .map(|(k, _)| k.as_str().to_owned())
        .collect();
    assert!(listed.contains(acme().as_str()), "{listed:?}");
}

#[tokio::test]
async fn a_store_that_refuses_is_a_503_that_applied_nothing() {
    use support::counters_only::CountersOnly;

    let app = app(Arc::new(CountersOnly(MemoryStore::new())));
    for (method, uri, body) in [
        (
            Method::PUT,
            "/admin/policies/api/overrides/caller?api_key=acme",
            Some(r#"{"limit": 5}"#),
        ),
        (
            Method::PUT,
            "/admin/policies/api/block?api_key=acme",
            Some(r#"{"seconds": 60}"#),
        ),
        (
            Method::DELETE,
            "/admin/policies/api/block?api_key=acme",
            None,
        ),
    ] {
        let (status, err) = call(&app.router, &method, uri, body).await;
        assert_eq!(
            status,
            StatusCode::SERVICE_UNAVAILABLE,
            "{method} {uri}: {err}"
        );
        assert_eq!(err["error"]["applied"], false);
        assert!(
            err["error"]["message"]
                .as_str()
                .unwrap()
                .contains("this store cannot"),
            "{err}"
        );
    }
    let (status, err) = call(
        &app.router,
        &Method::GET,
        "/admin/policies/api/overrides",
        None,
    )
    .await;
    assert_eq!(
        status,
        StatusCode::SERVICE_UNAVAILABLE,
        "a read the store refuses: {err}"
    );
    assert!(err["error"].get("applied").is_none());
}

// ---- the OpenAPI document

/// Every (method, path) `openapi.json` describes.
fn documented(doc: &Value) -> BTreeSet<(Method, String)> {
    let mut out = BTreeSet::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for method in [
            Method::GET,
            Method::PUT,
            Method::POST,
            Method::DELETE,
            Method::PATCH,
        ] {
            if item.get(method.as_str().to_lowercase()).is_some() {
                out.insert((method, path.clone()));
            }
        }
    }
    out
}

#[tokio::test]
async fn every_documented_route_is_served_and_every_other_method_or_path_is_not() {
    let app = app(Arc::new(MemoryStore::new()));
    let (status, doc) = call(&app.router, &Method::GET, "/admin/openapi.json", None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(doc["openapi"], "3.1.0");
    let routes = documented(&doc);
    assert_eq!(routes.len(), 15, "{routes:?}");
    let paths: BTreeSet<&String> = routes.iter().map(|(_, p)| p).collect();
    for path in paths {
        let uri = format!("/admin{}?api_key=probe", path.replace("{policy}", "api"));
        for method in [
            Method::GET,
            Method::PUT,
            Method::POST,
            Method::DELETE,
            Method::PATCH,
        ] {
            let body = (method == Method::PUT).then_some("{}");
            let (status, answer) = call(&app.router, &method, &uri, body).await;
            let served = routes.contains(&(method.clone(), path.clone()));
            if served {
                assert_ne!(
                    status,
                    StatusCode::METHOD_NOT_ALLOWED,
                    "{method} {path}: {answer}"
                );
                assert!(
                    status != StatusCode::NOT_FOUND || answer["error"]["field"] == "policy",
                    "{method} {path} is served: {answer}"
                );
            } else {
                assert_eq!(
                    status,
                    StatusCode::METHOD_NOT_ALLOWED,
                    "{method} {path}: {answer}"
                );
                assert_eq!(answer["error"]["field"], Value::Null);
            }
        }
    }
    let (status, answer) = call(
        &app.router,
        &Method::GET,
        "/admin/policies/api/nothing",
        None,
    )
    .await;
    assert_eq!(
        (status, &answer["error"]["field"]),
        (StatusCode::NOT_FOUND, &Value::Null)
    );
    // The alias the API was built with is a parameter of each caller route.
    let peek = doc["paths"]["/policies/{policy}/peek"]["parameters"]
        .as_array()
        .unwrap();
    assert!(peek.contains(&json!({"$ref": "#/components/parameters/alias.api_key"})));
}

/// Issue 41: a policy's limit and cap for every caller through the API:
/// set, shown in `GET /policies/{policy}` and in the decisions, cleared;
/// refused with the field named for bad input, with a 409 for a policy
/// whose limits are fixed; nothing stored when refused.
#[tokio::test]
async fn a_policy_limit_and_cap_are_set_shown_and_cleared() {
    let app = app(Arc::new(MemoryStore::new()));
    let api = &app.limiters[0];
    let put = |path: &'static str, body: &'static str| {
        let router = app.router.clone();
        async move { call(&router, &Method::PUT, path, Some(body)).await }
    };
    let (status, set) = put("/admin/policies/api/limit", r#"{"limit": 10}"#).await;
    assert_eq!(status, StatusCode::OK, "{set}");
    assert_eq!(
        set["value"]["quotas"],
        json!([{"limit": 10, "window_secs": 3600}])
    );
    assert_eq!(api.check(&Key::new("anyone"), 1).await.unwrap().limit, 10);
    let until = later(3_600);
    let body = Box::leak(format!(r#"{{"limit": 5, "until": {until}}}"#).into_boxed_str());
    let (status, _) = put("/admin/policies/api/cap", body).await;
    assert_eq!(status, StatusCode::OK);
    let (_, shown) = call(&app.router, &Method::GET, "/admin/policies/api", None).await;
    assert_eq!(shown["runtime"]["limit"]["quotas"][0]["limit"], 10);
    assert_eq!(shown["runtime"]["cap"]["quotas"][0]["limit"], 5);
    assert_eq!(shown["runtime"]["cap"]["until"], until);
    assert_eq!(api.check(&Key::new("anyone"), 1).await.unwrap().limit, 5);

    for (body, field) in [
        (r#"{"limit": 0}"#, "limit"),
        (r#"{"limit": -3}"#, "limit"),
        (r#"{"limit": 1.5}"#, "limit"),
        (r#"{"limit": "ten"}"#, "limit"),
        (r#"{"limit": 99999999999}"#, "limit"),
        (r#"{"limit": 7, "until": 1}"#, "until"),
        ("not json", "body"),
    ] {
        let (status, err) = put("/admin/policies/api/limit", body).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}: {err}");
        assert_eq!(err["error"]["field"], field, "{body}");
    }
    let (status, err) = put("/admin/policies/plain/limit", r#"{"limit": 7}"#).await;
    assert_eq!(
        (status, &err["error"]["field"]),
        (StatusCode::CONFLICT, &json!("policy"))
    );
    let (status, _) = put("/admin/policies/nope/limit", r#"{"limit": 7}"#).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(
        api.policy_limits().await.unwrap().limit,
        Some(Override::new(per_hour(10))),
        "the refused ones stored nothing"
    );

    for which in ["cap", "limit"] {
        let path = format!("/admin/policies/api/{which}");
        let (status, cleared) = call(&app.router, &Method::DELETE, &path, None).await;
        assert_eq!(
            (status, &cleared["cleared"]),
            (StatusCode::OK, &json!(true)),
            "{which}"
        );
        let (_, again) = call(&app.router, &Method::DELETE, &path, None).await;
        assert_eq!(again["cleared"], json!(false), "{which}");
    }
    assert_eq!(api.check(&Key::new("anyone"), 1).await.unwrap().limit, 100);
}

/// Issue 45: the document served (with this API's alias) passes a real
/// OpenAPI 3.1 validator, `openapi-spec-validator` (PyPI; `scripts/test`
/// installs it). Before, every path without parameters carried
/// `"parameters": null`. Without python3 or the validator the test says so
/// loudly and checks nothing more.
#[tokio::test]
async fn the_served_document_passes_an_openapi_3_1_validator() {
    let app = app(Arc::new(MemoryStore::new()));
    let (status, doc) = call(&app.router, &Method::GET, "/admin/openapi.json", None).await;
    assert_eq!(status, StatusCode::OK);
    let file = tempfile::Builder::new().suffix(".json").tempfile().unwrap();
    std::fs::write(file.path(), doc.to_string()).unwrap();
    let run = std::process::Command::new("python3")
        .args(["-m", "openapi_spec_validator", "--schema", "3.1"])
        .arg(file.path())
        .output();
    let out = match run {
        Ok(out) => out,
        Err(err) => {
            eprintln!("\n!!! SKIPPED: no python3 ({err}); `scripts/test` installs the validator\n");
            return;
        }
    };
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if said.contains("No module named openapi_spec_validator") {
        eprintln!(
            "\n!!! SKIPPED: openapi-spec-validator is not installed; \
             `pip install openapi-spec-validator==0.9.0` (scripts/test does)\n"
        );
        return;
    }
    assert!(out.status.success(), "openapi-spec-validator: {said}");
    assert!(said.trim_end().ends_with(": OK"), "{said}");
}

/// The check every answer above goes through refuses one that does not
/// fit: a field the schema does not name, a wrong type.
#[test]
#[should_panic(expected = "does not fit openapi.json")]
fn an_answer_that_does_not_fit_its_schema_fails_the_test() {
    let body = json!({"policy": "api", "key": "k", "override": null, "extra": 1});
    assert_fits_its_schema(
        &Method::GET,
        "/policies/api/overrides/caller?ip=1.2.3.4",
        StatusCode::OK,
        &body,
    );
}

/// `body` fits the document's schema `name` (`#/components/schemas/...`).
fn fits_request_schema(name: &str, body: &Value) -> bool {
    let doc = openapi();
    let mut root = json!({ "$ref": format!("#/components/schemas/{name}") });
    root["$schema"] = json!("https://json-schema.org/draft/2020-12/schema");
    root["components"] = doc["components"].clone();
    jsonschema::validator_for(&root).unwrap().is_valid(body)
}

/// Issue 45: a request body's type (`admin/body.rs`, serde) and its
/// schema in openapi.json take the same bodies, field by field: each body
/// below, good or bad in one field, is accepted by the API exactly when the
/// document says it fits (values the document cannot judge, a quota
/// count or an end in the past, are left out).
#[tokio::test]
async fn request_bodies_are_taken_exactly_when_the_document_says_they_fit() {
    let app = app(Arc::new(MemoryStore::new()));
    let until = later(3_600);
    let overrides = [
        json!({"limit": 5}),
        json!({"limit": 5, "until": null, "note": null}),
        json!({"limit": 5, "until": until, "note": "OPS-42"}),
        json!({"limit": 5, "until": (until as f64) + 0.5}),
        json!({"quotas": [{"limit": 5, "window_secs": 3600}]}),
        json!({"quotas": [{"limit": 5, "window_secs": 1.5}]}),
        json!({"limit": 0}),
        json!({"limit": 4_294_967_296u64}),
        json!({"limit": "5"}),
        json!({"limit": null}),
        json!({"limit": 2.5}),
        json!({"limit": 5, "limt": 5}),
        json!({"limit": 5, "note": 7}),
        json!({"limit": 5, "until": "tomorrow"}),
        json!({"quotas": [{"limit": 5, "window_secs": 3600, "window": 1}]}),
        json!({"quotas": [{"limit": 5}]}),
        json!({"quotas": [{"limit": 0, "window_secs": 3600}]}),
        json!({"quotas": 5}),
        json!({"limit": 5, "quotas": [{"limit": 5, "window_secs": 3600}]}),
        json!({}),
        json!([1]),
    ];
    for body in overrides {
        let (status, answer) = call(
            &app.router,
            &Method::PUT,
            "/admin/policies/api/overrides/caller?api_key=acme",
            Some(&body.to_string()),
        )
        .await;
        assert_eq!(
            status == StatusCode::OK,
            fits_request_schema("OverrideBody", &body),
            "{body}: {status} {answer}"
        );
    }
    for body in [
        json!({"seconds": 60}),
        json!({"seconds": 0}),
        json!({"seconds": 1.5}),
        json!({"seconds": 31_622_401}),
        json!({"seconds": null}),
        json!({"seconds": 60, "reason": "spam"}),
        json!({}),
    ] {
        let (status, answer) = call(
            &app.router,
            &Method::PUT,
            "/admin/policies/api/block?api_key=acme",
            Some(&body.to_string()),
        )
        .await;
        assert_eq!(
            status == StatusCode::OK,
            fits_request_schema("BlockBody", &body),
            "{body}: {status} {answer}"
        );
    }
}

/// The `X-RateLimit-Limit` a request of `who` (its `X-Api-Key`) is told.
pub(crate) async fn limit_told(app: &App, who: &str) -> String {
    let request = Request::get("/")
        .header("x-api-key", who)
        .body(Body::empty())
        .unwrap();
    let response = app.router.clone().oneshot(request).await.unwrap();
    response.headers()["x-ratelimit-limit"]
        .to_str()
        .unwrap()
        .to_owned()
}
