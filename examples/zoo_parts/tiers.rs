//! The zoo's tiered route, `/tiers/tigerfeeding`, as GitHub limits its API:
//! anonymous callers get a small budget by address, callers with an
//! `X-Api-Key` a larger one by key, and `ent-` keys the enterprise budget.
//! One layer, three policies; exactly one counts each request, and the
//! headers (and `/rate_limit`) show the caller's own tier.

use std::sync::Arc;
use std::time::Duration;

use axum::http::request::Parts;
use axum::routing::get;
use axum::Router;
use serde_json::json;
use tollgate::layer::PeekError;
use tollgate::tier::Unplaced;
use tollgate::{
    ForwardedIp, HeaderKey, KeyExtractor, PeerIp, Policy, Quota, RateLimitLayer, Store, TieredLayer,
};

use super::{env_or, tigerfeeding};

const ANONYMOUS: &str = "tigerfeeding.anonymous";
const KEY: &str = "tigerfeeding.key";
const ENTERPRISE: &str = "tigerfeeding.enterprise";

/// The three tiers' quotas, checked before serving.
pub struct TierSettings {
    tiers: [(&'static str, Quota); 3],
}

impl TierSettings {
    /// `ZOO_TIER_ANONYMOUS_LIMIT` (3), `ZOO_TIER_KEY_LIMIT` (10) and
    /// `ZOO_TIER_ENTERPRISE_LIMIT` (30) per `ZOO_TIER_WINDOW_SECS` (60).
    pub fn from_env() -> Result<Self, String> {
        let window = Duration::from_secs(env_or("ZOO_TIER_WINDOW_SECS", 60)?);
        let quota = |var: &str, default: u32| -> Result<Quota, String> {
            Quota::new(env_or(var, default)?, window).map_err(|e| format!("{var}: {e}"))
        };
        Ok(Self {
            tiers: [
                (ANONYMOUS, quota("ZOO_TIER_ANONYMOUS_LIMIT", 3)?),
                (KEY, quota("ZOO_TIER_KEY_LIMIT", 10)?),
                (ENTERPRISE, quota("ZOO_TIER_ENTERPRISE_LIMIT", 30)?),
            ],
        })
    }

    /// One line for the start-up banner.
    pub fn describe(&self) -> String {
        let [anonymous, key, enterprise] = self.tiers.map(|(_, q)| q);
        format!(
            "/tiers/tigerfeeding: {} per {:?} by address, {} with an X-Api-Key, {} with an ent- key",
            anonymous.limit(),
            anonymous.window(),
            key.limit(),
            enterprise.limit()
        )
    }
}

/// The caller's tier: by the `X-Api-Key` header, which a real API would
/// have checked in an authentication layer first.
fn choose(parts: &Parts) -> Option<&str> {
    match parts.headers.get("x-api-key").map(|v| v.as_bytes()) {
        None | Some(b"") => Some(ANONYMOUS),
        Some(key) if key.starts_with(b"ent-") => Some(ENTERPRISE),
        Some(_) => Some(KEY),
    }
}

/// The route and the layer `/rate_limit` should peek with.
pub struct Tiers<S> {
    pub router: Router<S>,
    pub layer: TieredLayer,
}

pub fn routes<S: Clone + Send + Sync + 'static>(
    settings: &TierSettings,
    store: Arc<dyn Store>,
    trusted_proxies: Option<&str>,
) -> Result<Tiers<S>, String> {
    let address: Arc<dyn KeyExtractor> = match trusted_proxies {
        Some(list) => Arc::new(ForwardedIp::trusting(list.split(',')).map_err(|e| e.to_string())?),
        None => Arc::new(PeerIp::new()),
    };
    let mut builder = TieredLayer::builder()
        .choose(choose)
        .unplaced(Unplaced::tier(ANONYMOUS))
        .shared_store(store);
    for (name, quota) in &settings.tiers {
        let by: Arc<dyn KeyExtractor> = match *name {
            ANONYMOUS => address.clone(),
            _ => Arc::new(HeaderKey::new("x-api-key")),
        };
        builder = builder.tier(
            RateLimitLayer::builder()
                .headers(super::dialect())
                .policy(Policy::fixed_window(*name, *quota))
                .key(by),
        );
    }
    let layer = builder
        .build()
        .map_err(|e| format!("/tiers/tigerfeeding: {e}"))?;
    let router = Router::new().route(
        "/tiers/tigerfeeding",
        get(tigerfeeding).layer(layer.clone()),
    );
    Ok(Tiers { router, layer })
}

/// The caller's tier as `/rate_limit` shows it: its name, its state, and
/// whether a local fallback answered.
pub async fn peek(
    layer: &TieredLayer,
    parts: &Parts,
) -> Result<(String, serde_json::Value, bool), PeekError> {
    let (policy, d) = layer.peek(parts).await?;
    let state = json!({
        "limit": d.limit,
        "remaining": d.remaining,
        "used": d.used,
        "reset": d.reset_epoch_secs(),
        "resource": policy.name(),
    });
    Ok((policy.name().to_owned(), state, d.fallback))
}
