//! The zoo's routes for the strategies that decide at once: the uniform
//! gate, the sliding log (resource and consumer), the sliding-window counter
//! and GCRA, and a fixed window with a penalty box. Each serves the tiger
//! feeding under its own policy, read from the environment.

use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use axum::routing::get;
use axum::Router;
use tollgate::{KeyExtractor, PenaltyBox, Policy, Quota, RateLimitLayer, Store};

use super::{env_or, tigerfeeding};

/// The policies, checked before serving.
pub struct InstantSettings {
    policies: Vec<(&'static str, Policy)>,
}

fn quota(limit: &str, default_limit: u32, secs: &str, default_secs: u64) -> Result<Quota, String> {
    let window = Duration::from_secs(env_or(secs, default_secs)?);
    Quota::new(env_or(limit, default_limit)?, window).map_err(|e| format!("{limit}/{secs}: {e}"))
}

impl InstantSettings {
    pub fn from_env() -> Result<Self, String> {
        let span = Duration::from_secs(env_or("ZOO_UNIFORM_SPAN_SECS", 10)?);
        let uniform = Policy::uniform_gate("tigerfeeding.uniform", span)
            .map_err(|e| format!("ZOO_UNIFORM_SPAN_SECS: {e}"))?;
        let log = Policy::sliding_log(
            "tigerfeeding.sliding-log",
            quota("ZOO_LOG_RESOURCE_LIMIT", 100, "ZOO_LOG_WINDOW_SECS", 10)?,
            quota("ZOO_LOG_CONSUMER_LIMIT", 3, "ZOO_LOG_WINDOW_SECS", 10)?,
        );
        let window = Policy::sliding_window(
            "tigerfeeding.sliding-window",
            quota("ZOO_SLIDING_LIMIT", 5, "ZOO_SLIDING_WINDOW_SECS", 10)?,
        );
        let burst = NonZeroU32::new(env_or("ZOO_GCRA_BURST", 3)?)
            .ok_or("ZOO_GCRA_BURST must be at least 1")?;
        let gcra = Policy::gcra(
            "tigerfeeding.gcra",
            quota("ZOO_GCRA_LIMIT", 5, "ZOO_GCRA_PERIOD_SECS", 10)?,
            burst,
        );
        let aligned = Policy::aligned_window(
            "tigerfeeding.aligned",
            quota("ZOO_ALIGNED_LIMIT", 5, "ZOO_ALIGNED_WINDOW_SECS", 10)?,
        );
        let penalty_window = quota("ZOO_PENALTY_LIMIT", 3, "ZOO_PENALTY_WINDOW_SECS", 10)?;
        let strikes = NonZeroU32::new(env_or("ZOO_PENALTY_STRIKES", 3)?)
            .ok_or("ZOO_PENALTY_STRIKES must be at least 1")?;
        let block = Duration::from_secs(env_or("ZOO_PENALTY_BLOCK_SECS", 30)?);
        let penalty = PenaltyBox::new(strikes, penalty_window.window(), block)
            .map_err(|e| format!("ZOO_PENALTY_*: {e}"))?;
        let penalized =
            Policy::fixed_window("tigerfeeding.penalty", penalty_window).with_penalty_box(penalty);
        let policies = vec![
            ("/aligned/tigerfeeding", aligned),
            ("/uniform/tigerfeeding", uniform),
            ("/sliding-log/tigerfeeding", log),
            ("/sliding-window/tigerfeeding", window),
            ("/gcra/tigerfeeding", gcra),
            ("/penalty/tigerfeeding", penalized),
        ];
        for (path, policy) in &policies {
            policy.validate().map_err(|e| format!("{path}: {e}"))?;
        }
        Ok(Self { policies })
    }

    /// One line per route, for the start-up banner.
    pub fn describe(&self) -> Vec<String> {
        self.policies
            .iter()
            .map(|(path, p)| {
                let q = p.quotas();
                let what = match p.strategy() {
                    tollgate::Strategy::UniformGate => format!("once per {:?}", q[0].window()),
                    tollgate::Strategy::SlidingLog => format!(
                        "{} per {:?} for everyone, {} per {:?} each",
                        q[0].limit(),
                        q[0].window(),
                        q[1].limit(),
                        q[1].window()
                    ),
                    tollgate::Strategy::Gcra { burst } => format!(
                        "{} per {:?}, up to {burst} at once",
                        q[0].limit(),
                        q[0].window()
                    ),
                    tollgate::Strategy::AlignedWindow => format!(
                        "{} per {:?}, windows aligned on the epoch",
                        q[0].limit(),
                        q[0].window()
                    ),
                    tollgate::Strategy::FixedWindow => match p.penalty_box() {
                        Some(b) => format!(
                            "{} per {:?}; after {} rejections within it, blocked for {:?}",
                            q[0].limit(),
                            q[0].window(),
                            b.strikes(),
                            b.block()
                        ),
                        None => format!("{} per {:?}", q[0].limit(), q[0].window()),
                    },
                    _ => format!("{} per sliding {:?}", q[0].limit(), q[0].window()),
                };
                format!("{path}: {what}")
            })
            .collect()
    }
}

/// The routes and the layers `/rate_limit` should peek with.
pub struct Instant<S> {
    pub router: Router<S>,
    pub limits: Vec<RateLimitLayer>,
}

pub fn routes<S: Clone + Send + Sync + 'static>(
    settings: &InstantSettings,
    store: Arc<dyn Store>,
    key: Arc<dyn KeyExtractor>,
) -> Result<Instant<S>, String> {
    let mut router = Router::new();
    let mut limits = Vec::new();
    for (path, policy) in &settings.policies {
        let layer = RateLimitLayer::builder()
            .headers(super::dialect())
            .policy(policy.clone())
            .shared_store(store.clone())
            .key(key.clone())
            .build()
            .map_err(|e| format!("{path}: {e}"))?;
        router = router.route(path, get(tigerfeeding).layer(layer.clone()));
        limits.push(layer);
    }
    Ok(Instant { router, limits })
}
