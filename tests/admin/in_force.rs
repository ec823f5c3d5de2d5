//! Issue 45, point 6: a write that changes nothing in force says so. An
//! override above the policy's cap was stored and answered 200 with no
//! word that the cap sets it aside.

use std::sync::Arc;

use axum::http::{Method, StatusCode};
use serde_json::{json, Value};
use tollgate::{MemoryStore, RedisStore, Store};

use super::{app, call, limit_told};
use crate::support::redis::RedisServer;

const ACME: &str = "/admin/policies/api/overrides/caller?api_key=acme";

async fn an_override_above_the_cap_says_it_is_not_in_force(store: Arc<dyn Store>) {
    let app = app(store);
    let put = |uri: &'static str, body: &'static str| {
        let router = app.router.clone();
        async move { call(&router, &Method::PUT, uri, Some(body)).await }
    };
    let (status, _) = put("/admin/policies/api/cap", r#"{"limit": 50}"#).await;
    assert_eq!(status, StatusCode::OK);

    let (status, set) = put(ACME, r#"{"limit": 5000}"#).await;
    assert_eq!(status, StatusCode::OK, "{set}");
    assert_eq!(set["in_force"], json!(false), "{set}");
    let reason = set["reason"].as_str().unwrap();
    assert!(
        reason.contains("cap (50)") && reason.contains("set aside"),
        "{reason}"
    );
    assert_eq!(limit_told(&app, "acme").await, "50");
    let (_, got) = call(&app.router, &Method::GET, ACME, None).await;
    assert_eq!(
        (&got["in_force"], &got["reason"]),
        (&set["in_force"], &set["reason"])
    );
    let (_, listed) = call(
        &app.router,
        &Method::GET,
        "/admin/policies/api/overrides",
        None,
    )
    .await;
    assert_eq!(listed["overrides"][0]["in_force"], json!(false), "{listed}");

    let (_, under) = put(ACME, r#"{"limit": 20}"#).await;
    assert_eq!(
        (&under["in_force"], &under["reason"]),
        (&json!(true), &Value::Null)
    );
    assert_eq!(limit_told(&app, "acme").await, "20");

    put(ACME, r#"{"limit": 5000}"#).await;
    let (status, _) = call(
        &app.router,
        &Method::DELETE,
        "/admin/policies/api/cap",
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let (_, got) = call(&app.router, &Method::GET, ACME, None).await;
    assert_eq!(got["in_force"], json!(true), "the cap gone: {got}");
    assert_eq!(limit_told(&app, "acme").await, "5000");
}

#[tokio::test]
async fn an_override_above_the_cap_says_it_is_not_in_force_in_memory() {
    an_override_above_the_cap_says_it_is_not_in_force(Arc::new(MemoryStore::new())).await;
}

#[tokio::test]
async fn an_override_above_the_cap_says_it_is_not_in_force_on_redis() {
    let redis = RedisServer::start();
    let store = RedisStore::connect(&redis.url()).await.unwrap();
    an_override_above_the_cap_says_it_is_not_in_force(Arc::new(store)).await;
}
