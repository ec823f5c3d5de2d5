//! Issue 45, point 5: callers named exactly. A part the policy's key
//! extractor does not read, or a second name for a caller it keys by the
//! first, was ignored (`?api_key=bob&ip=1.2.3.4` keyed by bob alone,
//! `?ip=..&route=/x` dropped the route); `GET /overrides?api_key=bob`
//! ignored its filter; and `?route=/hello` answered "request has no peer
//! address (serve with into_make_service_with_connect_info)".

use std::sync::Arc;

use axum::http::{Method, StatusCode};
use serde_json::Value;
use tollgate::admin::AdminApi;
use tollgate::key::RouteKey;
use tollgate::{KeyExtractor, MemoryStore, PeerIp, Policy, RateLimitLayer};

use super::{app, call, per_hour};

async fn refused(uri: &str) -> (String, String) {
    let app = app(Arc::new(MemoryStore::new()));
    let (status, err) = call(&app.router, &Method::GET, uri, None).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{uri}: {err}");
    (
        err["error"]["field"].as_str().unwrap_or("").to_owned(),
        err["error"]["message"].as_str().unwrap().to_owned(),
    )
}

#[tokio::test]
async fn two_names_for_one_caller_are_refused_naming_the_one_ignored() {
    let (field, message) = refused("/admin/policies/api/peek?api_key=bob&ip=1.2.3.4").await;
    assert_eq!(field, "ip");
    assert!(message.contains("second way"), "{message}");
}

#[tokio::test]
async fn a_part_the_extractor_does_not_read_is_refused_listing_those_it_reads() {
    for (uri, at) in [
        ("/admin/policies/api/peek?ip=1.2.3.4&route=/x", "route"),
        // No key at all: the caller is at fault, the message names route.
        ("/admin/policies/api/peek?route=/hello", "caller"),
    ] {
        let (field, message) = refused(uri).await;
        assert_eq!(field, at, "{uri}");
        assert!(
            message.contains("route is not part") || field == "route",
            "{uri}: {message}"
        );
        assert!(
            message.contains("reads ip, api_key (header.x-api-key)"),
            "{uri}: {message}"
        );
        assert!(!message.contains("connect_info"), "{uri}: {message}");
    }
}

#[tokio::test]
async fn a_caller_keyed_by_route_and_address_needs_both() {
    let search = RateLimitLayer::builder()
        .policy(Policy::fixed_window("search", per_hour(10)))
        .key(RouteKey.and(PeerIp::new()))
        .store(MemoryStore::new())
        .build()
        .unwrap();
    let router = AdminApi::new().layer(&search).router();
    let both = "/policies/search/peek?route=/search&ip=192.0.2.7";
    let (status, state) = call(&router, &Method::GET, both, None).await;
    assert_eq!(status, StatusCode::OK, "{state}");
    assert_eq!(state["key"], "/search|ip:192.0.2.7");
    let (status, err) = call(
        &router,
        &Method::GET,
        "/policies/search/peek?ip=192.0.2.7",
        None,
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{err}");
    let message = err["error"]["message"].as_str().unwrap();
    assert!(message.contains("ip, route"), "{message}");
    assert!(!message.contains("connect_info"), "{message}");
}

#[tokio::test]
async fn the_list_of_overrides_is_filtered_by_the_caller_named_and_other_routes_take_no_query() {
    let app = app(Arc::new(MemoryStore::new()));
    for who in ["bob", "acme"] {
        let uri = format!("/admin/policies/api/overrides/caller?api_key={who}");
        let (status, _) = call(&app.router, &Method::PUT, &uri, Some(r#"{"limit": 7}"#)).await;
        assert_eq!(status, StatusCode::OK);
    }
    let (_, all) = call(
        &app.router,
        &Method::GET,
        "/admin/policies/api/overrides",
        None,
    )
    .await;
    assert_eq!(all["overrides"].as_array().unwrap().len(), 2);
    let (status, bob) = call(
        &app.router,
        &Method::GET,
        "/admin/policies/api/overrides?api_key=bob",
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{bob}");
    let (_, got) = call(
        &app.router,
        &Method::GET,
        "/admin/policies/api/overrides/caller?api_key=bob",
        None,
    )
    .await;
    let listed = bob["overrides"].as_array().unwrap();
    assert_eq!(listed.len(), 1, "{bob}");
    assert_eq!(listed[0]["key"], got["key"]);

    for (method, uri) in [
        (Method::GET, "/admin/policies?api_key=bob"),
        (Method::GET, "/admin/policies/api?api_key=bob"),
        (Method::DELETE, "/admin/policies/api/limit?api_key=bob"),
    ] {
        let (status, err) = call(&app.router, &method, uri, None).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{uri}: {err}");
        assert_eq!(err["error"]["field"], Value::from("api_key"), "{uri}");
    }
}
