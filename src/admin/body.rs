//! The JSON bodies the admin API takes, one Rust type each, read with
//! serde: an override (`{"limit": N}` or `{"quotas": [{"limit": N,
//! "window_secs": S}, ..]}`, either with `"until"`, Unix seconds, and a
//! `"note"`) and a block (`{"seconds": N}`). Unknown fields are refused,
//! `null` is taken wherever GET shows it, and a bad body is refused naming
//! its field by its path (`quotas[1].limit`, through `serde_path_to_error`).
//! What depends on the policy (how many quotas) or on the time (an end to
//! come) is checked after, in [`override_of`].

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Deserializer};
use serde_json::Value;

use super::error::ApiError;
use crate::overrides::Override;
use crate::policy::Policy;
use crate::quota::Quota;

/// The longest block, as the penalty box takes it: 366 days.
pub(super) const MAX_BLOCK_SECS: u64 = 366 * 24 * 3600;

/// The latest end an override takes: the last second of the year 9999.
const MAX_UNTIL_SECS: u64 = 253_402_300_799;

/// `PUT .../overrides/caller`, `.../limit` and `.../cap`: the policy's one
/// limit, or every quota in its order; an end; a note.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct OverrideBody {
    #[serde(default, deserialize_with = "present")]
    limit: Option<Limit>,
    #[serde(default, deserialize_with = "present")]
    quotas: Option<Vec<QuotaBody>>,
    /// Absent or `null` (as GET shows it): no end.
    #[serde(default)]
    until: Option<Until>,
    /// Absent or `null`: none.
    #[serde(default)]
    note: Option<String>,
}

/// One quota of `"quotas"`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct QuotaBody {
    #[serde(default, deserialize_with = "present")]
    limit: Option<Limit>,
    #[serde(default, deserialize_with = "present")]
    window_secs: Option<WindowSecs>,
}

/// `PUT .../block`: how long, 1 s to 366 days.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct BlockBody {
    #[serde(default, deserialize_with = "present")]
    seconds: Option<BlockSecs>,
}

/// A field that is there, `null` included (which its type then refuses
/// or takes), as opposed to absent.
fn present<'de, D: Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<Option<T>, D::Error> {
    T::deserialize(d).map(Some)
}

/// A quota's limit: a whole number from 1 to 4294967295.
#[derive(Debug)]
struct Limit(u32);

/// A quota's window: seconds above 0.
#[derive(Debug)]
struct WindowSecs(Duration);

/// An end: Unix seconds, whole or to the microsecond (as GET shows it).
#[derive(Debug)]
struct Until(SystemTime);

/// A block's length: whole seconds, 1 to [`MAX_BLOCK_SECS`].
#[derive(Debug)]
struct BlockSecs(u64);

/// Each is read from any JSON value, so that what is wrong with it is said
/// in our words ("must be at least 1, got 0"), not serde's.
macro_rules! read_as {
    ($ty:ident, $read:expr) => {
        impl<'de> Deserialize<'de> for $ty {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let value = Value::deserialize(d)?;
                $read(&value).map($ty).map_err(serde::de::Error::custom)
            }
        }
    };
}

read_as!(Limit, |v: &Value| whole(v, 1, u64::from(u32::MAX))
    .map(|n| u32::try_from(n).unwrap_or(u32::MAX)));
read_as!(BlockSecs, |v: &Value| whole(v, 1, MAX_BLOCK_SECS));
read_as!(WindowSecs, |v: &Value| v
    .as_f64()
    .filter(|s| s.is_finite() && *s > 0.0)
    .and_then(|s| Duration::try_from_secs_f64(s).ok())
    .ok_or_else(|| format!(
        "must be a number of seconds above 0, got {v}"
    )));
read_as!(Until, until);

/// `value` as a whole number from `min` to `max`, or what is wrong with it.
fn whole(value: &Value, min: u64, max: u64) -> Result<u64, String> {
    let n = match value {
        Value::Number(n) => n,
        Value::String(_) => return Err("must be a number, not a string".into()),
        other => return Err(format!("must be a whole number, got {other}")),
    };
    if let Some(n) = n.as_u64() {
        return match n {
            n if n < min => Err(format!("must be at least {min}, got {n}")),
            n if n > max => Err(format!("must be at most {max}, got {n}")),
            n => Ok(n),
        };
    }
    if n.as_i64().is_some() {
        return Err(format!("must be at least {min}, got {n}"));
    }
    match n.as_f64() {
        Some(f) if f.fract() != 0.0 => Err(format!("must be a whole number, got {n}")),
        _ => Err(format!(
            "must be a whole number from {min} to {max}, got {n}"
        )),
    }
}

/// An end in Unix seconds: whole, or fractional to the microsecond (an
/// override keeps its end in whole microseconds, so what GET showed reads
/// back to the same end).
fn until(value: &Value) -> Result<SystemTime, String> {
    match value {
        Value::Number(n) if n.as_u64().is_none() && n.as_f64().is_some_and(|f| f > 0.0) => {
            let micros = (n.as_f64().unwrap_or(0.0) * 1e6).round();
            if micros > (MAX_UNTIL_SECS * 1_000_000) as f64 {
                return Err(format!("must be at most {MAX_UNTIL_SECS}, got {n}"));
            }
            Ok(UNIX_EPOCH + Duration::from_micros(micros as u64))
        }
        _ => Ok(UNIX_EPOCH + Duration::from_secs(whole(value, 1, MAX_UNTIL_SECS)?)),
    }
}

/// `body` as a `T`: a JSON object, or a 400 naming the field by its path.
fn read<T: for<'de> Deserialize<'de>>(body: &[u8]) -> Result<T, ApiError> {
    let value = match serde_json::from_slice(body) {
        Ok(value @ Value::Object(_)) => value,
        Ok(_) => return Err(ApiError::invalid("body", "must be a JSON object")),
        Err(err) => return Err(ApiError::invalid("body", format!("is not JSON: {err}"))),
    };
    serde_path_to_error::deserialize(value).map_err(|err| {
        let field = err.path().to_string();
        let field = if field == "." {
            "body".to_owned()
        } else {
            field
        };
        ApiError::invalid(&field, err.into_inner().to_string())
    })
}

/// The override a `PUT .../overrides/caller` body asks for under `policy`,
/// and the field that gave its quotas (for the limiter's own refusal).
/// `"limit"` keeps the window of a one-quota policy; `"quotas"` gives every
/// quota, in the policy's order. The strategy's own checks (a uniform
/// gate's limit of 1, a sliding log's bound) are the limiter's, after this.
pub(super) fn override_of(
    body: &[u8],
    policy: &Policy,
    now: SystemTime,
) -> Result<(Override, &'static str), ApiError> {
    let body: OverrideBody = read(body)?;
    let (quotas, field) = match (body.limit, body.quotas) {
        (Some(limit), None) => (vec![limit_of(limit, policy)?], "limit"),
        (None, Some(quotas)) => (quotas_of(quotas, policy)?, "quotas"),
        (Some(_), Some(_)) => {
            return Err(ApiError::invalid(
                "limit",
                "give \"limit\" or \"quotas\", not both",
            ))
        }
        (None, None) => {
            return Err(ApiError::invalid(
                "limit",
                "is missing: give \"limit\" (a one-quota policy) or \"quotas\"",
            ))
        }
    };
    let mut quotas = quotas.into_iter();
    let first = quotas
        .next()
        .ok_or_else(|| ApiError::invalid("quotas", "is empty"))?;
    let mut o = quotas.fold(Override::new(first), Override::and);
    if let Some(Until(at)) = body.until {
        if at <= now {
            let secs = at
                .duration_since(UNIX_EPOCH)
                .unwrap_or_default()
                .as_secs_f64();
            return Err(ApiError::invalid(
                "until",
                format!("{secs} is in the past: give a time to come, in Unix seconds"),
            ));
        }
        o = o.until(at);
    }
    if let Some(note) = body.note {
        o = o.with_note(note);
        if let Some(why) = o.note_problem() {
            return Err(ApiError::invalid("note", why));
        }
    }
    Ok((o, field))
}

/// `{"limit": N}`: the policy's one quota with another limit.
fn limit_of(Limit(limit): Limit, policy: &Policy) -> Result<Quota, ApiError> {
    let [quota] = policy.quotas() else {
        return Err(ApiError::invalid(
            "limit",
            format!(
                "policy {:?} has {} quotas: give \"quotas\", one per quota in its order",
                policy.name(),
                policy.quotas().len()
            ),
        ));
    };
    quota_of("limit", limit, quota.window())
}

/// `{"quotas": [{"limit": N, "window_secs": S}, ..]}`, as many as the
/// policy has.
fn quotas_of(quotas: Vec<QuotaBody>, policy: &Policy) -> Result<Vec<Quota>, ApiError> {
    if quotas.len() != policy.quotas().len() {
        return Err(ApiError::invalid(
            "quotas",
            format!(
                "policy {:?} has {} quota(s), the body {}",
                policy.name(),
                policy.quotas().len(),
                quotas.len()
            ),
        ));
    }
    quotas
        .into_iter()
        .enumerate()
        .map(|(i, q)| {
            let at = |name: &str| format!("quotas[{i}].{name}");
            let Limit(limit) = q
                .limit
                .ok_or_else(|| ApiError::invalid(&at("limit"), "is missing"))?;
            let WindowSecs(window) = q
                .window_secs
                .ok_or_else(|| ApiError::invalid(&at("window_secs"), "is missing"))?;
            quota_of(&at("window_secs"), limit, window)
        })
        .collect()
}

fn quota_of(field: &str, limit: u32, window: Duration) -> Result<Quota, ApiError> {
    Quota::new(limit, window).map_err(|err| ApiError::invalid(field, err.reason().to_string()))
}

/// The block a `PUT .../block` body asks for: `{"seconds": N}`, 1 s to 366 days.
pub(super) fn block_of(body: &[u8]) -> Result<Duration, ApiError> {
    let body: BlockBody = read(body)?;
    let BlockSecs(seconds) = body
        .seconds
        .ok_or_else(|| ApiError::invalid("seconds", "is missing: how long to block, in seconds"))?;
    Ok(Duration::from_secs(seconds))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::num::NonZeroU32;

    fn one_quota() -> Policy {
        Policy::fixed_window("api", Quota::per_minute(NonZeroU32::new(10).unwrap())).overridable()
    }

    fn refused(body: &str) -> (String, String) {
        let err = override_of(body.as_bytes(), &one_quota(), SystemTime::now()).unwrap_err();
        assert_eq!(err.status().as_u16(), 400, "{body}");
        (err.field().unwrap().to_owned(), err.message().to_owned())
    }

    #[test]
    fn a_limit_keeps_the_policys_window() {
        let (o, field) =
            override_of(br#"{"limit": 4294967295}"#, &one_quota(), SystemTime::now()).unwrap();
        assert_eq!(field, "limit");
        assert_eq!(o.quotas()[0].limit(), u32::MAX);
        assert_eq!(o.quotas()[0].window(), Duration::from_secs(60));
        assert_eq!(o.until_micros(), None);
    }

    #[test]
    fn each_bad_limit_says_what_is_wrong_with_it() {
        for (body, says) in [
            (r#"{"limit": 0}"#, "at least 1, got 0"),
            (r#"{"limit": -3}"#, "at least 1, got -3"),
            (r#"{"limit": 4294967296}"#, "at most 4294967295"),
            (r#"{"limit": 1e30}"#, "from 1 to 4294967295"),
            (r#"{"limit": 2.5}"#, "whole number, got 2.5"),
            (r#"{"limit": "5"}"#, "not a string"),
            (r#"{"limit": null}"#, "whole number, got null"),
        ] {
            let (field, message) = refused(body);
            assert_eq!(field, "limit", "{body}");
            assert!(message.contains(says), "{body}: {message}");
        }
    }

    #[test]
    fn quotas_are_checked_one_by_one() {
        let two = one_quota().and(Quota::per_hour(NonZeroU32::new(100).unwrap()));
        let now = SystemTime::now();
        let ok = br#"{"quotas": [{"limit": 5, "window_secs": 0.5}, {"limit": 50, "window_secs": 3600}]}"#;
        let (o, _) = override_of(ok, &two, now).unwrap();
        assert_eq!(o.quotas()[0].window(), Duration::from_millis(500));
        for (body, field) in [
            (r#"{"limit": 5}"#, "limit"),
            (r#"{"quotas": [{"limit": 5, "window_secs": 1}]}"#, "quotas"),
            (
                r#"{"quotas": [{"limit": 5, "window_secs": 1}, {"limit": 0, "window_secs": 1}]}"#,
                "quotas[1].limit",
            ),
            (
                r#"{"quotas": [{"limit": 5, "window_secs": 0}, {"limit": 1, "window_secs": 1}]}"#,
                "quotas[0].window_secs",
            ),
            (
                r#"{"quotas": [{"limit": 5, "window_secs": 0.0001}, {"limit": 1, "window_secs": 1}]}"#,
                "quotas[0].window_secs",
            ),
            (
                r#"{"quotas": [{"limit": 5, "window": 1}, {"limit": 1, "window_secs": 1}]}"#,
                "quotas[0].window",
            ),
            (r#"{"quotas": 5}"#, "quotas"),
        ] {
            let err = override_of(body.as_bytes(), &two, now).unwrap_err();
            assert_eq!(err.field(), Some(field), "{body}: {}", err.message());
        }
    }

    #[test]
    fn until_must_be_to_come() {
        assert_eq!(refused(r#"{"limit": 5, "until": 1}"#).0, "until");
        assert_eq!(refused(r#"{"limit": 5, "until": "tomorrow"}"#).0, "until");
        let later = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs()
            + 60;
        let body = format!(r#"{{"limit": 5, "until": {later}}}"#);
        let (o, _) = override_of(body.as_bytes(), &one_quota(), SystemTime::now()).unwrap();
        assert_eq!(o.until_micros(), Some(later * 1_000_000));
    }

    /// Issue 45: GET shows `"until": null` for an override with no end,
    /// and a PUT of it answered 400 "must be a whole number, got null".
    #[test]
    fn until_is_null_or_fractional_as_get_shows_it() {
        let (o, _) = override_of(
            br#"{"limit": 5, "until": null}"#,
            &one_quota(),
            SystemTime::now(),
        )
        .unwrap();
        assert_eq!(o.until_micros(), None);
        let later = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs()
            + 60;
        let body = format!(r#"{{"limit": 5, "until": {later}.123456}}"#);
        let (o, _) = override_of(body.as_bytes(), &one_quota(), SystemTime::now()).unwrap();
        assert_eq!(o.until_micros(), Some(later * 1_000_000 + 123_456));
        assert_eq!(refused(r#"{"limit": 5, "until": 1.5}"#).0, "until");
        assert_eq!(refused(r#"{"limit": 5, "until": -1.5}"#).0, "until");
        assert_eq!(refused(r#"{"limit": 5, "until": 1e300}"#).0, "until");
    }

    /// Issue 45: a note kept with an override, bounded.
    #[test]
    fn a_note_is_bounded_text_or_null() {
        let (o, _) = override_of(
            br#"{"limit": 5, "note": "acme launch, OPS-42"}"#,
            &one_quota(),
            SystemTime::now(),
        )
        .unwrap();
        assert_eq!(o.note(), Some("acme launch, OPS-42"));
        let (o, _) = override_of(
            br#"{"limit": 5, "note": null}"#,
            &one_quota(),
            SystemTime::now(),
        )
        .unwrap();
        assert_eq!(o.note(), None);
        let long = format!(r#"{{"limit": 5, "note": "{}"}}"#, "é".repeat(257));
        assert_eq!(refused(&long).0, "note");
        assert_eq!(refused(r#"{"limit": 5, "note": "a\nb"}"#).0, "note");
        assert_eq!(refused(r#"{"limit": 5, "note": 7}"#).0, "note");
    }

    #[test]
    fn bodies_that_are_not_objects_or_misspell_a_field_are_refused() {
        assert_eq!(refused("{").0, "body");
        assert_eq!(refused("[1]").0, "body");
        assert_eq!(refused(r#"{"limt": 5}"#).0, "limt");
        assert_eq!(refused(r#"{}"#).0, "limit");
        assert_eq!(refused(r#"{"limit": 5, "quotas": []}"#).0, "limit");
    }

    #[test]
    fn a_block_is_whole_seconds_up_to_366_days() {
        assert_eq!(
            block_of(br#"{"seconds": 60}"#).unwrap(),
            Duration::from_secs(60)
        );
        for body in [
            r#"{"seconds": 0}"#,
            r#"{"seconds": 1.5}"#,
            r#"{"seconds": 31622401}"#,
            r#"{}"#,
        ] {
            assert_eq!(
                block_of(body.as_bytes()).unwrap_err().field(),
                Some("seconds"),
                "{body}"
            );
        }
    }
}
