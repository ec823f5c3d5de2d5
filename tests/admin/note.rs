//! Issue 45, point 8: a note on an override. Overrides were listed by
//! hash only (`x-api-key:81b637d8…`); a note (who, why, a ticket) is kept
//! with one, shown in the list and in GET, bounded, and changes no key,
//! slot or limit.

use std::collections::BTreeSet;
use std::sync::Arc;

use axum::http::{Method, StatusCode};
use serde_json::{json, Value};
use tollgate::{MemoryStore, RedisStore, Store};

use super::{app, call, App};
use crate::support::redis::RedisServer;

const ACME: &str = "/admin/policies/api/overrides/caller?api_key=acme";

async fn put(app: &App, uri: &str, body: &str) -> (StatusCode, Value) {
    call(&app.router, &Method::PUT, uri, Some(body)).await
}

async fn a_note_is_kept_and_shown(app: &App) {
    let (status, set) = put(
        app,
        ACME,
        r#"{"limit": 500, "note": "acme launch week, OPS-42"}"#,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{set}");
    assert_eq!(set["override"]["note"], "acme launch week, OPS-42");
    let (_, got) = call(&app.router, &Method::GET, ACME, None).await;
    assert_eq!(got["override"], set["override"]);
    let (_, listed) = call(
        &app.router,
        &Method::GET,
        "/admin/policies/api/overrides",
        None,
    )
    .await;
    assert_eq!(
        listed["overrides"][0]["note"], "acme launch week, OPS-42",
        "{listed}"
    );
    assert_eq!(
        app.limiters[0]
            .get_override(&super::acme())
            .await
            .unwrap()
            .unwrap()
            .quotas()[0]
            .limit(),
        500
    );

    let long = format!(r#"{{"limit": 5, "note": "{}"}}"#, "x".repeat(257));
    for (uri, body) in [
        (ACME, long.as_str()),
        (ACME, r#"{"limit": 5, "note": "two\nlines"}"#),
        (
            "/admin/policies/api/limit",
            r#"{"limit": 5, "note": "not here"}"#,
        ),
    ] {
        let (status, err) = put(app, uri, body).await;
        assert_eq!(
            (status, &err["error"]["field"]),
            (StatusCode::BAD_REQUEST, &json!("note")),
            "{body}"
        );
    }
    let (_, got) = call(&app.router, &Method::GET, ACME, None).await;
    assert_eq!(
        got["override"], set["override"],
        "the refused ones changed nothing"
    );
}

#[tokio::test]
async fn a_note_is_kept_with_an_override_and_shown_in_memory() {
    a_note_is_kept_and_shown(&app(Arc::new(MemoryStore::new()))).await;
}

#[tokio::test]
async fn a_note_is_kept_with_an_override_and_shown_on_redis_and_changes_no_key() {
    let redis = RedisServer::start();
    let store: Arc<dyn Store> = Arc::new(RedisStore::connect(&redis.url()).await.unwrap());
    let app = app(store);
    let keys = || -> BTreeSet<String> {
        redis::cmd("KEYS")
            .arg("*")
            .query(&mut redis.conn())
            .unwrap()
    };
    let (status, _) = put(&app, ACME, r#"{"limit": 500}"#).await;
    assert_eq!(status, StatusCode::OK);
    let without = keys();
    a_note_is_kept_and_shown(&app).await;
    assert_eq!(keys(), without, "the same keys, in the same slots");

    // The scripts read the quotas up to the note, a cap included.
    for (cap, told) in [(100, "100"), (1000, "500")] {
        let (status, _) = put(
            &app,
            "/admin/policies/api/cap",
            &format!(r#"{{"limit": {cap}}}"#),
        )
        .await;
        assert_eq!(status, StatusCode::OK);
        let request = axum::http::Request::get("/")
            .header("x-api-key", "acme")
            .body(axum::body::Body::empty())
            .unwrap();
        let response = tower::ServiceExt::oneshot(app.router.clone(), request)
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        assert!(
            response.headers().get("x-ratelimit-fallback").is_none(),
            "Redis decided"
        );
        assert_eq!(response.headers()["x-ratelimit-limit"], told, "cap {cap}");
    }
}
