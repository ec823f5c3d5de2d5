//! Issue 45, point 9: where configuration lives. Runtime limits, caps,
//! overrides and blocks live only in Redis: an emptied Redis forgets them
//! all (docs/operations.md, "Where configuration lives"). A dump of
//! `GET /policies`, PUT back, re-applies the runtime limits and caps (on
//! 930178a the dump's `"until": null` was refused).

use std::sync::Arc;

use axum::http::{Method, StatusCode};
use serde_json::Value;
use tollgate::RedisStore;

use super::{app, call, limit_told};
use crate::support::redis::RedisServer;

#[tokio::test]
async fn an_emptied_redis_forgets_the_configuration_and_a_dump_put_back_restores_its_limits() {
    let redis = RedisServer::start();
    let app = app(Arc::new(RedisStore::connect(&redis.url()).await.unwrap()));
    for (uri, body) in [
        ("/admin/policies/api/limit", r#"{"limit": 40}"#),
        ("/admin/policies/api/cap", r#"{"limit": 30}"#),
        (
            "/admin/policies/api/overrides/caller?api_key=acme",
            r#"{"limit": 20, "note": "OPS-1"}"#,
        ),
    ] {
        let (status, answer) = call(&app.router, &Method::PUT, uri, Some(body)).await;
        assert_eq!(status, StatusCode::OK, "{uri}: {answer}");
    }
    assert_eq!(limit_told(&app, "acme").await, "20");
    assert_eq!(limit_told(&app, "anyone").await, "30");
    let (_, dump) = call(&app.router, &Method::GET, "/admin/policies", None).await;

    let _: () = redis::cmd("FLUSHALL").query(&mut redis.conn()).unwrap();
    let (_, empty) = call(&app.router, &Method::GET, "/admin/policies/api", None).await;
    assert_eq!(empty["runtime"]["limit"], Value::Null, "forgotten: {empty}");
    assert_eq!(empty["runtime"]["cap"], Value::Null);
    let (_, listed) = call(
        &app.router,
        &Method::GET,
        "/admin/policies/api/overrides",
        None,
    )
    .await;
    assert_eq!(listed["overrides"], serde_json::json!([]));

    // Re-applied from the dump: every runtime limit and cap, as GET showed it.
    for policy in dump["policies"].as_array().unwrap() {
        let name = policy["name"].as_str().unwrap();
        for which in ["limit", "cap"] {
            let value = &policy["runtime"][which];
            if value.is_null() {
                continue;
            }
            let uri = format!("/admin/policies/{name}/{which}");
            let (status, answer) =
                call(&app.router, &Method::PUT, &uri, Some(&value.to_string())).await;
            assert_eq!(status, StatusCode::OK, "{uri} {value}: {answer}");
        }
    }
    let (_, restored) = call(&app.router, &Method::GET, "/admin/policies/api", None).await;
    let before = dump["policies"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "api")
        .unwrap();
    assert_eq!(restored["runtime"], before["runtime"]);
    assert_eq!(limit_told(&app, "anyone").await, "30");
}
