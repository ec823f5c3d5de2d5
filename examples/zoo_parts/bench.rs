//! The zoo's bench routes (`ZOO_BENCH=1`), all at `/strategies/{name}`'s
//! depth and on the same handler, so that they differ from the limited
//! routes in the layer alone: the floors a limiter is read against, and
//! the in-memory peer, tower_governor, beside the strategies it competes
//! with, keyed as it is (by peer IP) and sending as many headers.
//!
//! For leases (issue 34), routes keyed by `X-Api-Key`, which
//! `scripts/load.sh` drives with one hot caller and with Zipf crowds of
//! callers, and leaves out of the strategies it lists:
//! `/strategies/api_key` (the fixed window on the zoo's store, GitHub's
//! five headers), `/strategies/api_key_leased` (the same on a Redis store
//! with leases; with `REDIS_URL` only), and, for a fair reading beside
//! tower_governor keyed the same way, `/strategies/api_key_no_headers` and
//! `_two_headers` beside `/strategies/governor_api_key_no_headers` and
//! `/strategies/governor_api_key` (its `use_headers()`: two).

use std::sync::Arc;
use std::time::Duration;

use axum::http::Request;
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, MethodRouter};
use axum::Router;
use tollgate::headers::{GithubHeader, RateLimitHeaders};
use tollgate::store::Leases;
use tollgate::{HeaderKey, PeerIp, Policy, Quota, RateLimitLayer, RedisStore, Store};
use tower::util::MapResponseLayer;
use tower_governor::governor::GovernorConfigBuilder;
use tower_governor::key_extractor::{KeyExtractor, PeerIpKeyExtractor};
use tower_governor::{GovernorError, GovernorLayer};

use super::{lineup, tigerfeeding, Zoo};

/// The strategies served beside tower_governor.
const BESIDE_GOVERNOR: [&str; 3] = ["fixed_window", "gcra", "sliding_window"];

/// The header loads they are served with, as `/strategies/{name}_{load}`:
/// none and two (Limit and Remaining) as tower_governor sends on a pass
/// without and with `use_headers()`, and GitHub's five.
const HEADER_LOADS: [(&str, RateLimitHeaders); 3] = [
    ("no_headers", RateLimitHeaders::NONE),
    (
        "two_headers",
        RateLimitHeaders::NONE.with_github_only(&[GithubHeader::Limit, GithubHeader::Remaining]),
    ),
    ("five_headers", RateLimitHeaders::GITHUB),
];

/// The routes `scripts/load.sh` reads as strategies (listed by
/// `/strategies`), and the floors and peers it always runs beside them.
pub struct Bench {
    pub router: Router<Zoo>,
    /// Names to list under `/strategies`, one a line.
    pub names: String,
    /// The leasing store of `/strategies/api_key_leased`, to give its
    /// leases back at shutdown.
    pub leasing: Option<RedisStore>,
}

/// The bench routes: the floors, each of [`BESIDE_GOVERNOR`] under `quota`
/// at each of [`HEADER_LOADS`], and tower_governor at the same rate (the
/// same budget: passing, or spent after one request, as the
/// strategies'), all keyed by peer IP.
pub async fn routes(
    quota: Quota,
    store: Arc<dyn Store>,
    redis_url: Option<&str>,
) -> Result<Bench, String> {
    let mut router = Router::new()
        .route("/unlimited", get(tigerfeeding))
        .route("/strategies/unlimited", get(tigerfeeding))
        .route(
            "/strategies/identity_layer",
            get(tigerfeeding).layer(MapResponseLayer::new(identity)),
        )
        .route(
            "/strategies/headers_only",
            get(tigerfeeding).layer(MapResponseLayer::new(headers_only)),
        );
    if let Some(url) = redis_url {
        router = router.route("/strategies/redis_ping", redis_ping(url).await?);
    }
    let mut names = String::new();
    for policy in lineup::lineup(quota) {
        if !BESIDE_GOVERNOR.contains(&policy.name()) {
            continue;
        }
        for (load, headers) in HEADER_LOADS {
            let name = format!("{}_{load}", policy.name());
            let limit = RateLimitLayer::builder()
                .policy(policy.clone())
                .shared_store(store.clone())
                .key(PeerIp::new())
                .headers(headers)
                .build()
                .map_err(|e| format!("{name}: {e}"))?;
            router = router.route(
                &format!("/strategies/{name}"),
                get(tigerfeeding).layer(limit),
            );
            names.push_str(&name);
            names.push('\n');
        }
    }
    router = router
        .route("/strategies/governor_no_headers", governor(quota, false)?)
        .route("/strategies/governor_two_headers", governor(quota, true)?)
        .route(
            "/strategies/governor_api_key",
            governor_by_api_key(quota, true)?,
        )
        .route(
            "/strategies/governor_api_key_no_headers",
            governor_by_api_key(quota, false)?,
        );
    for (load, headers) in HEADER_LOADS {
        let path = match load {
            "five_headers" => "/strategies/api_key".to_owned(),
            load => format!("/strategies/api_key_{load}"),
        };
        let limit = by_api_key(quota, store.clone(), headers)?;
        router = router.route(&path, get(tigerfeeding).layer(limit));
    }
    let mut leased = None;
    if let Some(url) = redis_url {
        let leasing = RedisStore::connect_builder(url)
            .await
            .map_err(|e| format!("cannot connect to Redis at {url}: {e}"))?
            .leases(Leases::new())
            .build()
            .map_err(|e| e.to_string())?;
        router = router.route(
            "/strategies/api_key_leased",
            get(tigerfeeding).layer(by_api_key(
                quota,
                Arc::new(leasing.clone()),
                RateLimitHeaders::GITHUB,
            )?),
        );
        leased = Some(leasing);
    }
    Ok(Bench {
        router,
        names,
        leasing: leased,
    })
}

/// The fixed window at `quota` on `store`, keyed by `X-Api-Key`, sending
/// `headers`.
fn by_api_key(
    quota: Quota,
    store: Arc<dyn Store>,
    headers: RateLimitHeaders,
) -> Result<RateLimitLayer, String> {
    RateLimitLayer::builder()
        .policy(Policy::fixed_window("api_key", quota))
        .shared_store(store)
        .key(HeaderKey::new("x-api-key"))
        .headers(headers)
        .build()
        .map_err(|e| format!("api_key: {e}"))
}

/// tower_governor's key: the `X-Api-Key` header's value.
#[derive(Debug, Clone, Copy)]
struct ApiKey;

impl KeyExtractor for ApiKey {
    type Key = String;

    fn extract<T>(&self, req: &Request<T>) -> Result<String, GovernorError> {
        req.headers()
            .get("x-api-key")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
            .ok_or(GovernorError::UnableToExtractKey)
    }
}

/// tower_governor at `quota`'s rate, as [`governor`], keyed by `X-Api-Key`;
/// with its two headers when `headers`.
fn governor_by_api_key(quota: Quota, headers: bool) -> Result<MethodRouter<Zoo>, String> {
    governor_keyed(quota, ApiKey, headers)
}

/// tower_governor's GCRA at `quota`'s rate (one unit every `window /
/// limit`) with a burst of `limit`, keyed by the peer's IP; with
/// `use_headers()` (`x-ratelimit-limit` and `-remaining` on a pass) when
/// `headers`.
fn governor(quota: Quota, headers: bool) -> Result<MethodRouter<Zoo>, String> {
    governor_keyed(quota, PeerIpKeyExtractor, headers)
}

/// [`governor`], keyed by `key`.
fn governor_keyed<K>(quota: Quota, key: K, headers: bool) -> Result<MethodRouter<Zoo>, String>
where
    K: KeyExtractor + Send + Sync + 'static,
    K::Key: Send + Sync + 'static,
{
    let period = (quota.window() / quota.limit()).max(Duration::from_nanos(1));
    let mut builder = GovernorConfigBuilder::default().key_extractor(key);
    builder.period(period).burst_size(quota.limit());
    let invalid = || format!("tower_governor refuses {quota:?}");
    Ok(if headers {
        let config = builder.use_headers().finish().ok_or_else(invalid)?;
        get(tigerfeeding).layer(GovernorLayer::new(config))
    } else {
        let config = builder.finish().ok_or_else(invalid)?;
        get(tigerfeeding).layer(GovernorLayer::new(config))
    })
}

/// The layer of `/strategies/identity_layer`: hands the response back as is.
fn identity(response: Response) -> Response {
    response
}

/// The floor under any limiter that sends GitHub's headers: the same five
/// `X-RateLimit-*` headers, prebuilt, on every response, and nothing
/// decided. What a limited route costs beyond this is the limiter's.
fn headers_only(mut response: Response) -> Response {
    static HEADERS: [(HeaderName, HeaderValue); 5] = [
        (
            HeaderName::from_static("x-ratelimit-limit"),
            HeaderValue::from_static("3600000000"),
        ),
        (
            HeaderName::from_static("x-ratelimit-remaining"),
            HeaderValue::from_static("3599999999"),
        ),
        (
            HeaderName::from_static("x-ratelimit-used"),
            HeaderValue::from_static("1"),
        ),
        (
            HeaderName::from_static("x-ratelimit-reset"),
            HeaderValue::from_static("1795000000"),
        ),
        (
            HeaderName::from_static("x-ratelimit-resource"),
            HeaderValue::from_static("headers_only"),
        ),
    ];
    let headers = response.headers_mut();
    headers.reserve(HEADERS.len());
    for (name, value) in &HEADERS {
        headers.insert(name.clone(), value.clone());
    }
    response
}

/// The handler after one `PING` to Redis (with `REDIS_URL`): a Redis round
/// trip as this server sees it, at the load it is under, for the latency a
/// limiter adds to be compared with.
async fn redis_ping(url: &str) -> Result<MethodRouter<Zoo>, String> {
    let info = redis::IntoConnectionInfo::into_connection_info(url)
        .map_err(|e| e.to_string())?
        .set_tcp_settings(redis::io::tcp::TcpSettings::default().set_nodelay(true));
    let conn = redis::Client::open(info)
        .map_err(|e| e.to_string())?
        .get_connection_manager()
        .await
        .map_err(|e| format!("cannot connect to Redis at {url}: {e}"))?;
    Ok(get(move |headers: HeaderMap| {
        let mut conn = conn.clone();
        async move {
            match redis::cmd("PING").query_async::<String>(&mut conn).await {
                Ok(_) => tigerfeeding(headers).await,
                Err(e) => (StatusCode::SERVICE_UNAVAILABLE, e.to_string()).into_response(),
            }
        }
    }))
}
