//! The Zoo: a demo server for tollgate.
//!
//! ```text
//! cargo run --example zoo --all-features                                  # memory store
//! REDIS_URL=redis://127.0.0.1:6379/ cargo run --example zoo --all-features  # shared limits in Redis
//! ```
//!
//! Environment: `ZOO_ADDR` (default `127.0.0.1:3000`), `REDIS_URL`, `ZOO_LIMIT`
//! (default 5) requests per `ZOO_WINDOW_SECS` (default 10) per caller, and
//! `ZOO_TRUSTED_PROXIES` (comma-separated CIDRs whose `X-Forwarded-For` is
//! believed). Callers are told apart by `X-Api-Key`, else by client IP.
//! `ZOO_BENCH=1` adds `/unlimited`, `/strategies/identity_layer`,
//! `/strategies/headers_only` and (with Redis) `/strategies/redis_ping` for
//! `scripts/load.sh`.
//! `ZOO_HEADERS` picks the header dialect every limited route sends:
//! `github` (the default), `ietf` (draft-11's `RateLimit` and
//! `RateLimit-Policy`) or `both`.
//! `ZOO_CALLS_IN_FLIGHT` sets the Redis store's batching calls in flight
//! (`RedisStoreBuilder::calls_in_flight`; default 4).
//! `ZOO_LEASES=1` (with `REDIS_URL`) decides `/tigerfeeding` and
//! `/tokens/tigerfeeding` on a Redis store with leases (`tollgate::Leases`):
//! a hot caller is decided in memory from a slice of its budget that Redis
//! charged first, and a settle goes through its lease.
//!
//! Routes:
//! - `GET /tigerfeeding`: limited; 200 with an `ETag`, or 304 (refunded) when
//!   `If-None-Match` matches.
//! - `GET /aligned/tigerfeeding`: a fixed window aligned on the epoch,
//!   `ZOO_ALIGNED_LIMIT` (5) per `ZOO_ALIGNED_WINDOW_SECS` (10); every caller
//!   is told the same `Reset`.
//! - `GET /uniform/tigerfeeding`: a uniform gate, one call per caller per
//!   `ZOO_UNIFORM_SPAN_SECS` (10).
//! - `GET /sliding-log/tigerfeeding`: an exact sliding log selling
//!   `ZOO_LOG_RESOURCE_LIMIT` (100) per `ZOO_LOG_WINDOW_SECS` (10) to everyone
//!   and `ZOO_LOG_CONSUMER_LIMIT` (3) to each caller.
//! - `GET /sliding-window/tigerfeeding`: Cloudflare's sliding-window counter,
//!   `ZOO_SLIDING_LIMIT` (5) per `ZOO_SLIDING_WINDOW_SECS` (10).
//! - `GET /gcra/tigerfeeding`: GCRA, `ZOO_GCRA_LIMIT` (5) per
//!   `ZOO_GCRA_PERIOD_SECS` (10), up to `ZOO_GCRA_BURST` (3) at once.
//! - `GET /leaky/tigerfeeding`: a leaky bucket shaping to `ZOO_LEAKY_LIMIT`
//!   (2) per `ZOO_LEAKY_WINDOW_SECS` (1), holding `ZOO_LEAKY_CAPACITY` (5).
//! - `GET /concurrency/tigerfeeding`: at most `ZOO_CONCURRENCY_LIMIT` (2) in
//!   flight per caller, each taking `ZOO_CONCURRENCY_HOLD_MS` (2000), slots
//!   of crashed servers freed after `ZOO_CONCURRENCY_TIMEOUT_SECS` (60).
//! - `GET|POST /queue/tigerfeeding`: queued (202) into a work queue of
//!   `ZOO_QUEUE_CAPACITY` (10) drained at `ZOO_QUEUE_RATE` (1) per second; a
//!   Redis Stream (or List: `ZOO_QUEUE_KIND=list`) when `REDIS_URL` is set,
//!   drained by `cargo run --all-features --example queue_processor`, else in memory.
//! - `GET /strategies/{name}`: the same, limited by each strategy in turn
//!   (`examples/support/lineup.rs`); `GET /strategies` lists the names.
//! - `GET /unlimited` and `GET /strategies/unlimited` (only with
//!   `ZOO_BENCH=1`): the same handler with no limiter, the baseline the load
//!   test compares with (the second at the limited routes' depth).
//! - `GET /strategies/identity_layer` (only with `ZOO_BENCH=1`): that
//!   handler behind a layer that changes nothing: what any axum layer costs
//!   before it does anything (the router boxes and clones the layered
//!   service for every request).
//! - `GET /strategies/headers_only` and `GET /strategies/redis_ping` (only
//!   with `ZOO_BENCH=1`; the second only with Redis): that handler behind
//!   five prebuilt `X-RateLimit-*` headers, or after one Redis `PING`: the
//!   floors a limiter's cost and latency are read against.
//! - `GET /strategies/{fixed_window,gcra,sliding_window}_{no,two,five}_headers`
//!   and `GET /strategies/governor_{no,two}_headers` (only with
//!   `ZOO_BENCH=1`): those strategies keyed by peer IP and sending no
//!   rate-limit headers, two (Limit and Remaining) or GitHub's five, beside
//!   the in-memory peer, tower_governor, keyed by peer IP at the same rate
//!   and burst, without and with its `use_headers()` (two headers on a
//!   pass) (`zoo_parts/bench.rs`).
//! - `GET /tiers/tigerfeeding`: tiers, as GitHub's API (`zoo_parts/tiers.rs`).
//! - `GET /tokens/tigerfeeding?used=N`: a cost known only when the response
//!   is done: `ZOO_TOKENS_ESTIMATE` (1) charged at the start, settled to the
//!   `N` units the handler reports (`ActualCost`), `ZOO_TOKENS_LIMIT` (100)
//!   per `ZOO_TOKENS_WINDOW_SECS` (60) per caller; a bad `used` is a 400
//!   that keeps the estimate (`zoo_parts/tokens.rs`).
//! - `POST /login`: `X-Password: stripes` logs in; only failed attempts are
//!   counted, `ZOO_LOGIN_FAILURES` (3) per `ZOO_LOGIN_WINDOW_SECS` (60) per
//!   caller, with the `RateLimiter` handle (`zoo_parts/accounts.rs`).
//! - `GET /penalty/tigerfeeding`: `ZOO_PENALTY_LIMIT` (3) per
//!   `ZOO_PENALTY_WINDOW_SECS` (10) per caller; after `ZOO_PENALTY_STRIKES`
//!   (3) rejections, blocked for `ZOO_PENALTY_BLOCK_SECS` (30).
//! - `/admin/...` (only with `ZOO_ADMIN_TOKEN`, sent as `Authorization:
//!   Bearer`; 403 without it): the crate's admin API over every limit
//!   above and the tiers (`GET /admin/policies`, `PUT|DELETE
//!   /admin/policies/{policy}/overrides/caller?api_key=..|ip=..`, block,
//!   unblock, reset, peek; `GET /admin/openapi.json` describes them), and
//!   the zoo's own routes from before it (`zoo_parts/admin.rs`):
//!   - `PUT|DELETE /admin/limits?ip=..` or `?api_key=..`: `{"limit": N}`
//!     (and `"until"`, Unix seconds) overrides `/tigerfeeding`'s quota for
//!     that caller; `DELETE` clears it.
//!   - `POST /admin/reset?ip=..` or `?api_key=..`: resets that caller in
//!     every limit (the operator's unblock).
//! - `GET /rate_limit`: the caller's state, like GitHub's; never charged.
//! - `GET /metrics`: tollgate's counters and store latency, Prometheus format.
//!
//! On SIGTERM or Ctrl-C the zoo stops accepting connections, finishes the
//! requests in flight, then gives back the leases its leasing stores hold
//! (`RedisStore::return_leases`) and says how many units went back.

#[path = "support/lineup.rs"]
mod lineup;

use std::net::SocketAddr;
use std::num::NonZeroUsize;
use std::process::ExitCode;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use axum::extract::State;
use axum::http::{request::Parts, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use serde_json::json;
#[path = "zoo_parts/accounts.rs"]
mod accounts;
#[path = "zoo_parts/admin.rs"]
mod admin;
#[path = "zoo_parts/bench.rs"]
mod bench;
#[path = "zoo_parts/holding.rs"]
mod holding;
#[path = "zoo_parts/instant.rs"]
mod instant;
#[path = "zoo_parts/tiers.rs"]
mod tiers;
#[path = "zoo_parts/tokens.rs"]
mod tokens;

use tollgate::headers::RateLimitHeaders;
use tollgate::Leases;
use tollgate::{
    ForwardedIp, HeaderKey, KeyExtractor, MemoryStore, PeerIp, Policy, Quota, RateLimitLayer,
    RedisStore, Store,
};

const ETAG: &str = "\"tiger-feeding-v1\"";

/// Everything read from the environment, checked before serving.
struct Settings {
    addr: SocketAddr,
    redis_url: Option<String>,
    quota: Quota,
    trusted_proxies: Option<String>,
    instant: instant::InstantSettings,
    bench: bool,
    holding: holding::HoldingSettings,
    tiers: tiers::TierSettings,
    accounts: accounts::AccountSettings,
    admin: admin::AdminSettings,
    tokens: tokens::TokenSettings,
    calls_in_flight: Option<NonZeroUsize>,
    /// `ZOO_LEASES=1`: `/tigerfeeding` on a leasing Redis store.
    leases: bool,
}

/// The header dialect every limited route sends (`ZOO_HEADERS`).
static DIALECT: OnceLock<RateLimitHeaders> = OnceLock::new();

/// `ZOO_HEADERS`: `github` (the default), `ietf` (draft-11's `RateLimit`
/// and `RateLimit-Policy`) or `both`.
fn read_dialect() -> Result<RateLimitHeaders, String> {
    let wanted = std::env::var("ZOO_HEADERS").unwrap_or_default();
    match wanted.trim() {
        "" | "github" => Ok(RateLimitHeaders::GITHUB),
        "ietf" => Ok(RateLimitHeaders::NONE.with_ietf_draft(true)),
        "both" => Ok(RateLimitHeaders::GITHUB.with_ietf_draft(true)),
        other => Err(format!("ZOO_HEADERS={other:?}: github, ietf or both")),
    }
}

/// The dialect read at start-up, for every route's layer.
fn dialect() -> RateLimitHeaders {
    DIALECT.get().copied().unwrap_or_default()
}

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> Result<T, String> {
    match std::env::var(name) {
        Ok(v) if !v.trim().is_empty() => v
            .trim()
            .parse()
            .map_err(|_| format!("{name}={v:?} is not valid")),
        _ => Ok(default),
    }
}

impl Settings {
    fn from_env() -> Result<Self, String> {
        let addr = env_or("ZOO_ADDR", SocketAddr::from(([127, 0, 0, 1], 3000)))?;
        let _ = DIALECT.set(read_dialect()?);
        let limit: u32 = env_or("ZOO_LIMIT", 5)?;
        let window: u64 = env_or("ZOO_WINDOW_SECS", 10)?;
        let quota = Quota::new(limit, Duration::from_secs(window)).map_err(|e| e.to_string())?;
        Ok(Self {
            addr,
            redis_url: std::env::var("REDIS_URL")
                .ok()
                .filter(|u| !u.trim().is_empty()),
            quota,
            trusted_proxies: std::env::var("ZOO_TRUSTED_PROXIES")
                .ok()
                .filter(|s| !s.trim().is_empty()),
            instant: instant::InstantSettings::from_env()?,
            bench: env_or("ZOO_BENCH", 0u8)? == 1,
            holding: holding::HoldingSettings::from_env()?,
            tiers: tiers::TierSettings::from_env()?,
            accounts: accounts::AccountSettings::from_env()?,
            admin: admin::AdminSettings::from_env(),
            tokens: tokens::TokenSettings::from_env()?,
            calls_in_flight: env_or("ZOO_CALLS_IN_FLIGHT", 0usize).map(NonZeroUsize::new)?,
            leases: env_or("ZOO_LEASES", 0u8)? == 1,
        })
    }

    /// `X-Api-Key` when present, else the client address.
    fn caller_key(&self) -> Result<Arc<dyn KeyExtractor>, String> {
        let api_key = HeaderKey::new("x-api-key");
        Ok(match &self.trusted_proxies {
            Some(list) => {
                let forwarded =
                    ForwardedIp::trusting(list.split(',')).map_err(|e| e.to_string())?;
                Arc::new(api_key.or(forwarded))
            }
            None => Arc::new(api_key.or(PeerIp::new())),
        })
    }
}

/// The limited routes' layers, kept for `/rate_limit` to peek with.
#[derive(Clone)]
struct Zoo {
    limits: Vec<RateLimitLayer>,
    tiers: tollgate::TieredLayer,
}

async fn tigerfeeding(headers: HeaderMap) -> Response {
    if headers
        .get("if-none-match")
        .is_some_and(|v| v.as_bytes() == ETAG.as_bytes())
    {
        return (StatusCode::NOT_MODIFIED, [("etag", ETAG)]).into_response();
    }
    (
        [("etag", ETAG), ("cache-control", "no-cache")],
        Json(json!({ "feeding": "tigers", "at": "12:00", "zone": "big cats" })),
    )
        .into_response()
}

/// GitHub's `GET /rate_limit`: every resource's state for this caller.
async fn rate_limit(State(zoo): State<Zoo>, parts: Parts) -> Response {
    let mut resources = serde_json::Map::new();
    // Redis down: the layers' local fallbacks answer (and decide) meanwhile.
    let mut fallback = false;
    for layer in &zoo.limits {
        match layer.peek(&parts).await {
            Ok(d) => {
                fallback |= d.fallback;
                resources.insert(
                    layer.policy().name().to_owned(),
                    json!({
                        "limit": d.limit,
                        "remaining": d.remaining,
                        "used": d.used,
                        "reset": d.reset_epoch_secs(),
                        "resource": layer.policy().name(),
                    }),
                );
            }
            Err(err) => {
                let body =
                    Json(json!({ "message": format!("rate limit state unavailable: {err}") }));
                return (StatusCode::SERVICE_UNAVAILABLE, body).into_response();
            }
        }
    }
    match tiers::peek(&zoo.tiers, &parts).await {
        Ok((name, state, local)) => {
            fallback |= local;
            resources.insert(name, state);
        }
        Err(err) => {
            let body = Json(json!({ "message": format!("rate limit state unavailable: {err}") }));
            return (StatusCode::SERVICE_UNAVAILABLE, body).into_response();
        }
    }
    let rate = resources.get("tigerfeeding").cloned().unwrap_or_default();
    let mut response = Json(json!({ "resources": resources, "rate": rate })).into_response();
    if fallback {
        // As the layer marks what its local fallback decided.
        response.headers_mut().insert(
            "x-ratelimit-fallback",
            axum::http::HeaderValue::from_static("local"),
        );
    }
    response
}

/// Installs the Prometheus recorder; must run before the first request.
fn install_metrics() -> Result<PrometheusHandle, String> {
    let handle = PrometheusBuilder::new()
        .set_buckets_for_metric(
            Matcher::Full(tollgate::metrics::STORE_LATENCY.into()),
            tollgate::metrics::LATENCY_BUCKETS,
        )
        .and_then(|b| b.install_recorder())
        .map_err(|e| format!("cannot install the metrics recorder: {e}"))?;
    tollgate::metrics::describe();
    let upkeep = handle.clone();
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_secs(5)).await;
            upkeep.run_upkeep();
        }
    });
    Ok(handle)
}

/// The zoo's routes, and the leasing stores whose leases it gives back
/// when it stops.
struct Built {
    router: Router,
    leasing: Vec<RedisStore>,
}

async fn build(settings: &Settings) -> Result<Built, String> {
    let prometheus = install_metrics()?;
    let store: Arc<dyn Store> = match &settings.redis_url {
        Some(url) => Arc::new(
            redis_store(url, settings.calls_in_flight)
                .await
                .map_err(|e| format!("cannot connect to Redis at {url}: {e}"))?,
        ),
        None => Arc::new(MemoryStore::new()),
    };
    let key = settings.caller_key()?;

    // With ZOO_LEASES=1, /tigerfeeding's and /tokens/tigerfeeding's own
    // store leases hot callers.
    let mut leasing = Vec::new();
    let tiger_store: Arc<dyn Store> = match (&settings.redis_url, settings.leases) {
        (Some(url), true) => {
            let store = RedisStore::connect_builder(url)
                .await
                .map_err(|e| format!("cannot connect to Redis at {url}: {e}"))?
                .leases(Leases::new())
                .build()
                .map_err(|e| e.to_string())?;
            leasing.push(store.clone());
            Arc::new(store)
        }
        _ => store.clone(),
    };
    let tiger_limit = RateLimitLayer::builder()
        .headers(dialect())
        .policy(
            Policy::fixed_window("tigerfeeding", settings.quota)
                .overridable()
                .adjustable(),
        )
        .shared_store(tiger_store.clone())
        .key(key.clone())
        .build()
        .map_err(|e| e.to_string())?;

    let tiger_limiter = tiger_limit.limiter();
    let instant = instant::routes(&settings.instant, store.clone(), key.clone())?;
    let holding = holding::routes(
        &settings.holding,
        store.clone(),
        key.clone(),
        settings.redis_url.as_deref(),
    )
    .await?;
    let tiers = tiers::routes(
        &settings.tiers,
        store.clone(),
        settings.trusted_proxies.as_deref(),
    )?;

    let tokens = tokens::routes(&settings.tokens, tiger_store.clone(), key.clone())?;

    let mut zoo = Zoo {
        limits: vec![tiger_limit.clone()],
        tiers: tiers.layer,
    };
    zoo.limits.extend(instant.limits);
    zoo.limits.extend(holding.limits);
    zoo.limits.push(tokens.limit);
    let mut router = Router::new()
        .route("/tigerfeeding", get(tigerfeeding).layer(tiger_limit))
        .merge(instant.router)
        .merge(holding.router)
        .merge(tiers.router)
        .merge(tokens.router);
    let mut names = String::new();
    for policy in lineup::lineup(settings.quota) {
        let (path, name) = (
            format!("/strategies/{}", policy.name()),
            policy.name().to_owned(),
        );
        // Operators change every caller's limit at runtime
        // (`PUT /admin/policies/{name}/limit`).
        let limit = RateLimitLayer::builder()
            .headers(dialect())
            .policy(policy.adjustable())
            .shared_store(store.clone())
            .key(key.clone())
            .build()
            .map_err(|e| format!("strategy {name}: {e}"))?;
        router = router.route(&path, get(tigerfeeding).layer(limit.clone()));
        zoo.limits.push(limit);
        names.push_str(&name);
        names.push('\n');
    }
    if settings.bench {
        let bench =
            bench::routes(settings.quota, store.clone(), settings.redis_url.as_deref()).await?;
        router = router.merge(bench.router);
        names.push_str(&bench.names);
        leasing.extend(bench.leasing);
    }
    router = router.route("/strategies", get(move || async move { names }));
    let login = accounts::routes(&settings.accounts, store.clone(), key.clone())?;
    router = router.merge(login.router);
    // The admin API serves every limit: the routes', the tiers' and the
    // failed logins'; `POST /admin/reset` resets them all.
    let mut api = tollgate::admin::AdminApi::new()
        .tiers(&zoo.tiers)
        .limiter(login.failed_logins.clone());
    for layer in &zoo.limits {
        api = api.layer(layer);
    }
    let resettable = zoo
        .limits
        .iter()
        .map(RateLimitLayer::limiter)
        .chain(
            zoo.tiers
                .tiers()
                .filter_map(|policy| zoo.tiers.limiter(policy.name())),
        )
        .chain([login.failed_logins])
        .collect();
    router = router.merge(admin::routes(
        &settings.admin,
        api,
        key.clone(),
        resettable,
        tiger_limiter,
    ));
    let router = router
        .route("/rate_limit", get(rate_limit))
        .route("/metrics", get(move || async move { prometheus.render() }))
        .with_state(zoo);
    Ok(Built { router, leasing })
}

/// `RedisStore::connect`'s store, with `calls` (`ZOO_CALLS_IN_FLIGHT`)
/// batching calls in flight if given.
async fn redis_store(
    url: &str,
    calls: Option<NonZeroUsize>,
) -> Result<RedisStore, Box<dyn std::error::Error>> {
    let mut builder = RedisStore::connect_builder(url).await?;
    if let Some(calls) = calls {
        builder = builder.calls_in_flight(calls);
    }
    Ok(builder.build()?)
}

/// On one core (say under `taskset`) a current-thread runtime, else Tokio's
/// multi-thread one. With a single worker, the multi-thread scheduler runs a
/// task it just woke next (its LIFO slot), so redis-rs's connection task wakes
/// after every request and writes each script call on its own; on one thread
/// the calls of requests that arrive together leave in one write, and
/// Redis-backed requests per second go up (`scripts/load.sh` measures it).
fn main() -> ExitCode {
    let one_core = std::thread::available_parallelism().is_ok_and(|n| n.get() == 1);
    let mut builder = if one_core {
        tokio::runtime::Builder::new_current_thread()
    } else {
        tokio::runtime::Builder::new_multi_thread()
    };
    match builder.enable_all().build() {
        Ok(runtime) => runtime.block_on(serve()),
        Err(e) => {
            eprintln!("zoo: cannot start the Tokio runtime: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn serve() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "info,tollgate=info".into()),
        )
        .init();
    let settings = match Settings::from_env() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("zoo: {e}");
            return ExitCode::from(2);
        }
    };
    let Built {
        router: app,
        leasing,
    } = match build(&settings).await {
        Ok(built) => built,
        Err(e) => {
            eprintln!("zoo: {e}");
            return ExitCode::from(2);
        }
    };
    let listener = match tokio::net::TcpListener::bind(settings.addr).await {
        Ok(l) => l,
        Err(e) => {
            eprintln!("zoo: cannot listen on {}: {e}", settings.addr);
            return ExitCode::from(2);
        }
    };
    let store = if settings.redis_url.is_some() {
        "redis"
    } else {
        "memory"
    };
    println!(
        "zoo listening on http://{} (store: {store}; {} requests per {:?} per caller)",
        settings.addr,
        settings.quota.limit(),
        settings.quota.window()
    );
    for line in settings.instant.describe() {
        println!("  {line}");
    }
    for line in settings.holding.describe(settings.redis_url.is_some()) {
        println!("  {line}");
    }
    println!("  {}", settings.tiers.describe());
    println!("  {}", settings.tokens.describe());
    println!("  {}", settings.accounts.describe());
    for line in settings.admin.describe() {
        println!("  {line}");
    }
    // Stop accepting, finish the requests in flight, then give back what
    // the leasing stores hold: a lease kept would be lost until its window
    // ends, and other servers would under-admit meanwhile.
    let served = axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .with_graceful_shutdown(stop_signal())
    .await;
    for store in &leasing {
        let units = store.return_leases().await;
        println!("zoo: gave back {units} leased unit(s)");
    }
    match served {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("zoo: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Resolves at the first SIGTERM (what `kill`, systemd and Kubernetes
/// send) or Ctrl-C.
async fn stop_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let terminate = async {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                term.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {}
        () = terminate => {}
    }
    println!("zoo: stopping: finishing the requests in flight");
}
