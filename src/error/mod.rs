//! Errors: bad configuration, unusable keys, store trouble, and why a peek
//! has no answer, one file per subsystem (`config.rs`, `key.rs`,
//! `store.rs`, `admin.rs`), all on the ground floor so every other floor can
//! name them; each is re-exported here, so `tollgate::error::X` and
//! `crate::error::X` name it as before.
//!
//! Being rate limited is not an error; it is a [`Decision`](crate::Decision)
//! with `allowed == false`.

mod admin;
mod config;
mod key;
mod store;

pub use self::admin::{AdminError, PeekError};
pub use self::config::ConfigError;
pub use self::key::KeyError;
pub use self::store::{StoreError, StoreErrorKind};

#[cfg(test)]
mod tests {
    use std::error::Error as StdError;
    use std::num::NonZeroU32;
    use std::time::Duration;

    use super::*;
    use crate::{Policy, Quota, RateLimitLayer, Strategy, TieredLayer};

    fn quota(limit: u32, secs: u64) -> Quota {
        Quota::new(limit, Duration::from_secs(secs)).unwrap()
    }

    #[test]
    fn the_constructors_report_variants_a_caller_can_match() {
        let err = Quota::new(0, Duration::from_secs(1)).unwrap_err();
        assert_eq!(err, ConfigError::LimitZero);
        let err = Quota::new(1, Duration::from_micros(10)).unwrap_err();
        assert_eq!(
            err,
            ConfigError::WindowTooShort {
                window: Duration::from_micros(10)
            }
        );
        assert_eq!(
            err.to_string(),
            "invalid rate limit configuration: window must be at least 1 ms, got 10µs"
        );

        let err = Policy::fixed_window("bad name", quota(1, 1))
            .validate()
            .unwrap_err();
        assert!(matches!(&err, ConfigError::PolicyName { name } if name == "bad name"));
        assert_eq!(
            err.to_string(),
            "invalid rate limit configuration: policy name \"bad name\" must be 1-64 characters of [A-Za-z0-9-_./]"
        );

        let burst = NonZeroU32::new(2).unwrap();
        let err = Policy::gcra("g", quota(2_000_000, 1), burst)
            .validate()
            .unwrap_err();
        assert_eq!(
            err,
            ConfigError::QuotaTooFast {
                limit: 2_000_000,
                window: Duration::from_secs(1)
            }
        );

        let err = Policy::gcra("g", quota(1, 1), burst)
            .and(quota(5, 60))
            .validate()
            .unwrap_err();
        assert!(matches!(
            &err,
            ConfigError::TooManyQuotas { strategy: "gcra", policy, max: 1, got: 2 } if policy == "g"
        ));
        assert_eq!(
            err.to_string(),
            "invalid rate limit configuration: strategy gcra takes at most 1 quota(s), policy \"g\" has 2"
        );

        let err = Policy::new("gate", Strategy::UniformGate, quota(2, 10))
            .validate()
            .unwrap_err();
        assert_eq!(err, ConfigError::UniformGateLimit { limit: 2 });

        let err = crate::PeerIp::new().ipv6_prefix(0).unwrap_err();
        assert_eq!(err, ConfigError::Ipv6Prefix { bits: 0 });
    }

    #[test]
    fn layer_mistakes_are_variants_too() {
        let err = RateLimitLayer::builder().build().unwrap_err();
        assert_eq!(err, ConfigError::NoPolicy);
        assert_eq!(
            err.to_string(),
            "invalid rate limit configuration: a policy is required: call .policy(..)"
        );
        let err = RateLimitLayer::builder()
            .policy(Policy::fixed_window("core", quota(1, 1)))
            .limited_status(http::StatusCode::OK)
            .build()
            .unwrap_err();
        assert_eq!(
            err,
            ConfigError::StatusNotAnError {
                what: "limited",
                status: http::StatusCode::OK
            }
        );
        assert_eq!(
            err.to_string(),
            "invalid rate limit configuration: the limited status must be a 4xx or 5xx, got 200 OK"
        );
    }

    #[test]
    fn a_tier_keeps_its_layers_error_as_the_source() {
        let err = TieredLayer::builder()
            .tier(RateLimitLayer::builder())
            .choose(|_| None)
            .build()
            .unwrap_err();
        assert!(
            matches!(&err, ConfigError::Tier { tier: 1, source } if **source == ConfigError::NoPolicy)
        );
        assert_eq!(
            err.source().map(ToString::to_string),
            Some(ConfigError::NoPolicy.to_string())
        );
        // Today's message, the inner one repeated whole.
        assert_eq!(
            err.to_string(),
            "invalid rate limit configuration: tier 1: \
             invalid rate limit configuration: a policy is required: call .policy(..)"
        );
    }
}
