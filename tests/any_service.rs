//! The layer around services that are not axum's: a `tower::service_fn`
//! answering `http_body_util::Full`, served by hyper alone over TCP. Its
//! body comes back as it was (a `ResponseBody` around it, nothing boxed),
//! and its rejections are the layer's own.

use std::convert::Infallible;
use std::num::NonZeroU32;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Empty, Full};
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use tollgate::layer::ResponseBody;
use tollgate::{HeaderKey, MemoryStore, Policy, Quota, RateLimitLayer};
use tower::{ServiceBuilder, ServiceExt};

fn two_a_minute() -> RateLimitLayer {
    RateLimitLayer::builder()
        .policy(Policy::fixed_window(
            "core",
            Quota::per_minute(NonZeroU32::new(2).unwrap()),
        ))
        .key(HeaderKey::new("x-api-key"))
        .store(MemoryStore::new())
        .build()
        .unwrap()
}

async fn hello(_req: Request<hyper::body::Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    Ok(Response::new(Full::new(Bytes::from_static(b"hello"))))
}

#[tokio::test]
async fn a_hyper_server_serves_a_limited_tower_service_with_its_own_body() {
    let service = ServiceBuilder::new()
        .layer(two_a_minute())
        .service_fn(hello);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (tcp, _) = listener.accept().await.unwrap();
            let service = TowerToHyperService::new(service.clone());
            tokio::spawn(
                hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tcp), service),
            );
        }
    });

    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (mut client, connection) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
        .await
        .unwrap();
    tokio::spawn(connection);
    let mut answers = Vec::new();
    for _ in 0..3 {
        let request = Request::get("/")
            .header("host", "tollgate")
            .header("x-api-key", "k1")
            .body(Empty::<Bytes>::new())
            .unwrap();
        let response = client.send_request(request).await.unwrap();
        let (head, body) = response.into_parts();
        let body = body.collect().await.unwrap().to_bytes();
        answers.push((head.status, head.headers, body));
    }
    assert_eq!(answers[0].0, StatusCode::OK);
    assert_eq!(answers[0].1["x-ratelimit-remaining"], "1");
    assert_eq!(answers[0].2, "hello");
    assert_eq!(answers[1].1["x-ratelimit-remaining"], "0");
    assert_eq!(answers[2].0, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(answers[2].1["content-type"], "application/json");
    assert!(answers[2].1.contains_key("retry-after"));
    let rejection: serde_json::Value = serde_json::from_slice(&answers[2].2).unwrap();
    assert_eq!(
        rejection["message"],
        "API rate limit exceeded for resource 'core'."
    );
}

#[tokio::test]
async fn the_inner_body_passes_through_unboxed() {
    let service =
        ServiceBuilder::new()
            .layer(two_a_minute())
            .service_fn(|_req: Request<()>| async {
                Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"hello"))))
            });
    let request = || {
        Request::get("/")
            .header("x-api-key", "k1")
            .body(())
            .unwrap()
    };
    // The response's type names the inner body: nothing erased it.
    let passed: Response<ResponseBody<Full<Bytes>>> =
        service.clone().oneshot(request()).await.unwrap();
    assert_eq!(passed.status(), StatusCode::OK);
    assert_eq!(http_body::Body::size_hint(passed.body()).exact(), Some(5));
    assert_eq!(
        passed.into_body().collect().await.unwrap().to_bytes(),
        "hello"
    );
    service.clone().oneshot(request()).await.unwrap();
    let limited = service.oneshot(request()).await.unwrap();
    assert_eq!(limited.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(limited.headers()["x-ratelimit-remaining"], "0");
}
