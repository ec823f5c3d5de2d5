//! Issue 45, point 3: what GET shows can be PUT back. GET showed
//! `"until": null`, which a PUT refused; an override's or a runtime
//! limit's body as GET shows it, PUT back, is accepted and changes
//! nothing (a property test over quotas, windows and ends).

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::http::{Method, StatusCode};
use proptest::prelude::*;
use serde_json::{json, Value};
use tollgate::{MemoryStore, RedisStore, Store};

use super::{app, call, App};
use crate::support::redis::RedisServer;

/// A body of quotas (`(limit, window in µs)`) and an end (`None`: none;
/// else µs from now).
fn body(quotas: &[(u32, u64)], until: Option<u64>) -> String {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_micros() as u64;
    let quotas: Vec<Value> = quotas
        .iter()
        .map(|&(limit, us)| json!({"limit": limit, "window_secs": us as f64 / 1e6}))
        .collect();
    let until = until.map(|after| (now + after) as f64 / 1e6);
    json!({"quotas": quotas, "until": until}).to_string()
}

/// PUTs `body` to `put`, reads what `get` shows at `shown`, PUTs that
/// back and reads again: accepted, and nothing changed.
async fn put_back(app: &App, put: &str, get: &str, shown: &str, body: &str) {
    let (status, answer) = call(&app.router, &Method::PUT, put, Some(body)).await;
    assert_eq!(status, StatusCode::OK, "{body}: {answer}");
    let (_, first) = call(&app.router, &Method::GET, get, None).await;
    let first = first.pointer(shown).unwrap().clone();
    assert_ne!(first, Value::Null, "{body}");
    let (status, answer) = call(&app.router, &Method::PUT, put, Some(&first.to_string())).await;
    assert_eq!(status, StatusCode::OK, "{first} PUT back: {answer}");
    let (_, again) = call(&app.router, &Method::GET, get, None).await;
    assert_eq!(
        again.pointer(shown).unwrap(),
        &first,
        "{first} PUT back changed it"
    );
}

fn quotas(n: usize) -> impl Strategy<Value = Vec<(u32, u64)>> {
    prop::collection::vec((1..=u32::MAX, 1_000..=86_400_000_000u64), n)
}

fn until() -> impl Strategy<Value = Option<u64>> {
    prop::option::of(1_000_000..=400 * 86_400_000_000u64)
}

fn every_body_get_shows_puts_back_unchanged(store: Arc<dyn Store>, cases: u32) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let app = rt.block_on(async { app(store) });
    let caller = "/admin/policies/pair/overrides/caller?api_key=acme";
    let config = ProptestConfig::with_cases(cases);
    proptest!(config, |(pair in quotas(2), one in quotas(1), end in until())| {
        rt.block_on(async {
            put_back(&app, caller, caller, "/override", &body(&pair, end)).await;
            put_back(
                &app,
                "/admin/policies/api/limit",
                "/admin/policies/api",
                "/runtime/limit",
                &body(&one, end),
            )
            .await;
        });
    });
}

#[test]
fn every_body_get_shows_puts_back_unchanged_in_memory() {
    every_body_get_shows_puts_back_unchanged(Arc::new(MemoryStore::new()), 64);
}

#[test]
fn every_body_get_shows_puts_back_unchanged_on_redis() {
    let redis = RedisServer::start();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let store = rt.block_on(RedisStore::connect(&redis.url())).unwrap();
    every_body_get_shows_puts_back_unchanged(Arc::new(store), 24);
}

/// The bodies GET shows with `null` in them are taken as they are.
#[tokio::test]
async fn an_override_with_no_end_is_put_back_with_until_null() {
    let app = app(Arc::new(MemoryStore::new()));
    let uri = "/admin/policies/api/overrides/caller?api_key=acme";
    let (status, set) = call(&app.router, &Method::PUT, uri, Some(r#"{"limit": 7}"#)).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(set["override"]["until"], Value::Null);
    let back = set["override"].to_string();
    let (status, again) = call(&app.router, &Method::PUT, uri, Some(&back)).await;
    assert_eq!(
        (status, &again["override"]),
        (StatusCode::OK, &set["override"]),
        "{back}"
    );
}
