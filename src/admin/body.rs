//! The JSON bodies the admin API takes, read field by field so that a bad
//! one is refused naming its field: an override (`{"limit": N}` or
//! `{"quotas": [{"limit": N, "window_secs": S}, ..]}`, either with
//! `"until"`, Unix seconds) and a block (`{"seconds": N}`).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::{Map, Value};

use super::error::ApiError;
use crate::overrides::Override;
use crate::policy::Policy;
use crate::quota::Quota;

/// The longest block, as the penalty box takes it: 366 days.
pub(super) const MAX_BLOCK_SECS: u64 = 366 * 24 * 3600;

/// The latest end an override takes: the last second of the year 9999.
const MAX_UNTIL_SECS: u64 = 253_402_300_799;

/// The fields of a JSON object body, or why it is not one.
pub(super) fn object(body: &[u8]) -> Result<Map<String, Value>, ApiError> {
    match serde_json::from_slice(body) {
        Ok(Value::Object(fields)) => Ok(fields),
        Ok(_) => Err(ApiError::invalid("body", "must be a JSON object")),
        Err(err) => Err(ApiError::invalid("body", format!("is not JSON: {err}"))),
    }
}

/// Refuses a field other than `known`, so a misspelt one is not ignored.
fn only(fields: &Map<String, Value>, known: &[&str]) -> Result<(), ApiError> {
    match fields.keys().find(|k| !known.contains(&k.as_str())) {
        Some(unknown) => Err(ApiError::invalid(
            unknown,
            format!("is not a field here; the fields are {}", known.join(", ")),
        )),
        None => Ok(()),
    }
}

/// `value` as a whole number from `min` to `max`, or why not, for `field`.
fn whole(field: &str, value: &Value, min: u64, max: u64) -> Result<u64, ApiError> {
    let n = match value {
        Value::Number(n) => n,
        Value::String(_) => return Err(ApiError::invalid(field, "must be a number, not a string")),
        other => {
            return Err(ApiError::invalid(
                field,
                format!("must be a whole number, got {other}"),
            ))
        }
    };
    if let Some(n) = n.as_u64() {
        return match n {
            n if n < min => Err(ApiError::invalid(
                field,
                format!("must be at least {min}, got {n}"),
            )),
            n if n > max => Err(ApiError::invalid(
                field,
                format!("must be at most {max}, got {n}"),
            )),
            n => Ok(n),
        };
    }
    if n.as_i64().is_some() {
        return Err(ApiError::invalid(
            field,
            format!("must be at least {min}, got {n}"),
        ));
    }
    match n.as_f64() {
        Some(f) if f.fract() != 0.0 => Err(ApiError::invalid(
            field,
            format!("must be a whole number, got {n}"),
        )),
        _ => Err(ApiError::invalid(
            field,
            format!("must be a whole number from {min} to {max}, got {n}"),
        )),
    }
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
    let fields = object(body)?;
    only(&fields, &["limit", "quotas", "until", "note"])?;
    let (quotas, field) = match (fields.get("limit"), fields.get("quotas")) {
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
    if let Some(at) = until_of(fields.get("until"), now)? {
        o = o.until(at);
    }
    if let Some(note) = note_of(fields.get("note"))? {
        o = o.with_note(note);
    }
    Ok((o, field))
}

/// `"note"`: free text kept with the override, at most
/// [`Override::MAX_NOTE_CHARS`] characters and no control character; absent
/// or `null` (as GET shows none) for none.
fn note_of(note: Option<&Value>) -> Result<Option<&str>, ApiError> {
    let note = match note {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::String(note)) => note,
        Some(other) => {
            return Err(ApiError::invalid(
                "note",
                format!("must be a string or null, got {other}"),
            ))
        }
    };
    if let Some(why) = Override::new(Quota::per_second(std::num::NonZeroU32::MIN))
        .with_note(note)
        .note_problem()
    {
        return Err(ApiError::invalid("note", why));
    }
    Ok(Some(note))
}

/// `"until"`: Unix seconds to come (fractional as GET shows an end set to
/// the microsecond), or absent or `null` (as GET shows it) for no end.
fn until_of(until: Option<&Value>, now: SystemTime) -> Result<Option<SystemTime>, ApiError> {
    let until = match until {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Number(n)) if n.as_u64().is_none() && n.as_f64().is_some_and(|f| f > 0.0) => {
            // Whole microseconds, as an override keeps its end: what GET
            // showed reads back to the same end.
            let micros = (n.as_f64().unwrap_or(0.0) * 1e6).round();
            if micros > (MAX_UNTIL_SECS * 1_000_000) as f64 {
                return Err(ApiError::invalid(
                    "until",
                    format!("must be at most {MAX_UNTIL_SECS}, got {n}"),
                ));
            }
            UNIX_EPOCH + Duration::from_micros(micros as u64)
        }
        Some(until) => UNIX_EPOCH + Duration::from_secs(whole("until", until, 1, MAX_UNTIL_SECS)?),
    };
    if until <= now {
        let secs = until
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs_f64();
        return Err(ApiError::invalid(
            "until",
            format!("{secs} is in the past: give a time to come, in Unix seconds"),
        ));
    }
    Ok(Some(until))
}

/// `{"limit": N}`: the policy's one quota with another limit.
fn limit_of(limit: &Value, policy: &Policy) -> Result<Quota, ApiError> {
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
    let n = whole("limit", limit, 1, u64::from(u32::MAX))?;
    quota_of("limit", n, quota.window())
}

/// `{"quotas": [{"limit": N, "window_secs": S}, ..]}`, as many as the
/// policy has.
fn quotas_of(quotas: &Value, policy: &Policy) -> Result<Vec<Quota>, ApiError> {
    let Value::Array(items) = quotas else {
        return Err(ApiError::invalid(
            "quotas",
            "must be an array of {\"limit\", \"window_secs\"}",
        ));
    };
    if items.len() != policy.quotas().len() {
        return Err(ApiError::invalid(
            "quotas",
            format!(
                "policy {:?} has {} quota(s), the body {}",
                policy.name(),
                policy.quotas().len(),
                items.len()
            ),
        ));
    }
    let mut out = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let at = |name: &str| format!("quotas[{i}].{name}");
        let Value::Object(fields) = item else {
            return Err(ApiError::invalid(
                &format!("quotas[{i}]"),
                "must be an object",
            ));
        };
        if let Some(unknown) = fields
            .keys()
            .find(|k| !matches!(k.as_str(), "limit" | "window_secs"))
        {
            return Err(ApiError::invalid(
                &at(unknown),
                "is not a field here; the fields are limit, window_secs",
            ));
        }
        let limit = fields
            .get("limit")
            .ok_or_else(|| ApiError::invalid(&at("limit"), "is missing"))?;
        let limit = whole(&at("limit"), limit, 1, u64::from(u32::MAX))?;
        let window = fields
            .get("window_secs")
            .ok_or_else(|| ApiError::invalid(&at("window_secs"), "is missing"))?;
        let window = window
            .as_f64()
            .filter(|s| s.is_finite() && *s > 0.0)
            .and_then(|s| Duration::try_from_secs_f64(s).ok())
            .ok_or_else(|| {
                ApiError::invalid(
                    &at("window_secs"),
                    format!("must be a number of seconds above 0, got {window}"),
                )
            })?;
        out.push(quota_of(&at("window_secs"), limit, window)?);
    }
    Ok(out)
}

fn quota_of(field: &str, limit: u64, window: Duration) -> Result<Quota, ApiError> {
    let limit =
        u32::try_from(limit).map_err(|_| ApiError::invalid(field, "is above 4294967295"))?;
    Quota::new(limit, window).map_err(|err| ApiError::invalid(field, err.reason().to_string()))
}

/// The block a `PUT .../block` body asks for: `{"seconds": N}`, 1 s to 366 days.
pub(super) fn block_of(body: &[u8]) -> Result<Duration, ApiError> {
    let fields = object(body)?;
    only(&fields, &["seconds"])?;
    let seconds = fields
        .get("seconds")
        .ok_or_else(|| ApiError::invalid("seconds", "is missing: how long to block, in seconds"))?;
    Ok(Duration::from_secs(whole(
        "seconds",
        seconds,
        1,
        MAX_BLOCK_SECS,
    )?))
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
