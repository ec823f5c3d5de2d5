//! What happened to one request, whether or not metrics are compiled in.

/// What happened to one request; a metric label and a tracing field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    Allowed,
    Limited,
    ShadowLimited,
    KeyError,
    FailOpen,
    FailClosed,
    Fallback,
    AllowListed,
    DenyListed,
    Throttled,
}

impl Outcome {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Outcome::Allowed => "allowed",
            Outcome::Limited => "limited",
            Outcome::ShadowLimited => "shadow_limited",
            Outcome::KeyError => "key_error",
            Outcome::FailOpen => "fail_open",
            Outcome::FailClosed => "fail_closed",
            Outcome::Fallback => "fallback",
            Outcome::AllowListed => "allow_listed",
            Outcome::DenyListed => "deny_listed",
            Outcome::Throttled => "throttled",
        }
    }
}
