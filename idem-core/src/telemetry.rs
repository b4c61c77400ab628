//! The names of idem's telemetry, defined once for every host (`IDEM-EVT-2`).
//!
//! Each operation a host serves (a guarded request, a status query, a token issue, a
//! session open, an inbox delivery) is one span named by [`span_name`], carrying the record
//! key's digest ([`RecordKey::digest`], never the key or the principal), the decision (the
//! name of the first deciding [`Event`]), the [`Outcome`] and, where a host has them, the
//! OpenTelemetry HTTP attributes ([`attr`]). The metrics ([`metric`]) count operations by
//! outcome, lease takeovers and records written, and time every store call.
//!
//! The tower layer emits these through `tracing` (spans, and metric events in the field
//! conventions of tracing-opentelemetry's `MetricsLayer`: [`metric::field`]); the npm package
//! reads the same names from its module and hands them to `@opentelemetry/api`. This crate
//! only names and classifies: it records nothing.
//!
//! [`RecordKey::digest`]: crate::RecordKey::digest

use crate::{Event, Operation};
use alloc::string::String;

/// Defines each span name from its operation's name (`idem.<operation>`), from one literal.
macro_rules! spans {
    ($($(#[$doc:meta])* $name:ident = $operation:literal;)*) => {
        $($(#[$doc])* pub const $name: &str = concat!("idem.", $operation);)*
        /// Every span name, in the order of [`super::OPERATIONS`].
        pub const ALL: [&str; 5] = [$($name),*];
        /// The values of [`attr::OPERATION`](super::attr::OPERATION): each span's name without
        /// `idem.`, in the same order.
        pub const OPERATIONS: [&str; 5] = [$($operation),*];
    };
}

/// The span of each [`Operation`].
pub mod span {
    spans! {
        /// A guarded request ([`Operation::Guard`](crate::Operation::Guard)).
        REQUEST = "request";
        /// A status query ([`Operation::Status`](crate::Operation::Status)).
        STATUS = "status";
        /// Issuing a one-time token ([`Operation::IssueToken`](crate::Operation::IssueToken)).
        TOKEN_ISSUE = "token.issue";
        /// Opening a counter session
        /// ([`Operation::OpenSession`](crate::Operation::OpenSession)).
        SESSION_OPEN = "session.open";
        /// One delivery to an inbox ([`Operation::Deliver`](crate::Operation::Deliver)).
        INBOX_DELIVERY = "inbox.delivery";
    }
}

/// The attributes of spans and metrics: OpenTelemetry's semantic conventions where they
/// exist, the `idem.` namespace for the rest.
pub mod attr {
    /// The record key's digest ([`RecordKey::digest`](crate::RecordKey::digest)): 32 hex
    /// digits, the same for every retry of one key in one scope, and neither the key nor
    /// the principal.
    pub const KEY_DIGEST: &str = "idem.key.digest";
    /// The decision: the name of the operation's deciding [`Event`](crate::Event)
    /// (`executed`, `took-over`, `replayed`, `in-progress`, `mismatch`, `rejected`, …).
    pub const DECISION: &str = "idem.decision";
    /// The [`Outcome`](super::Outcome)'s name; also an attribute of
    /// [`metric::REQUESTS`](super::metric::REQUESTS).
    pub const OUTCOME: &str = "idem.outcome";
    /// The operation (the span name without its `idem.` prefix would do, but a metric has no
    /// span): one of [`operation_name`](super::operation_name)'s values.
    pub const OPERATION: &str = "idem.operation";
    /// What a store call did: `load`, `apply` or `claim`, on
    /// [`metric::STORE_DURATION`](super::metric::STORE_DURATION).
    pub const STORE_OPERATION: &str = "idem.store.operation";
    /// The request's method (OpenTelemetry HTTP semantic conventions).
    pub const HTTP_REQUEST_METHOD: &str = "http.request.method";
    /// The route template (OpenTelemetry HTTP semantic conventions).
    pub const HTTP_ROUTE: &str = "http.route";
    /// The status of the answer sent (OpenTelemetry HTTP semantic conventions).
    pub const HTTP_RESPONSE_STATUS_CODE: &str = "http.response.status_code";
    /// Why the operation failed ([`error_type`](super::error_type); OpenTelemetry's general
    /// attribute): absent when it did not.
    pub const ERROR_TYPE: &str = "error.type";
    /// Every attribute name.
    pub const ALL: [&str; 9] = [
        KEY_DIGEST,
        DECISION,
        OUTCOME,
        OPERATION,
        STORE_OPERATION,
        HTTP_REQUEST_METHOD,
        HTTP_ROUTE,
        HTTP_RESPONSE_STATUS_CODE,
        ERROR_TYPE,
    ];
}

/// Defines a metric name and the `tracing` field that carries it for tracing-opentelemetry's
/// `MetricsLayer` (`<kind>.<name>`), from one literal.
macro_rules! metrics {
    ($($(#[$doc:meta])* $name:ident / $field:ident = $kind:literal $value:literal;)*) => {
        $($(#[$doc])* pub const $name: &str = $value;)*
        /// The `tracing` fields of the metrics, in the conventions of tracing-opentelemetry's
        /// `MetricsLayer`: an event with `monotonic_counter.<name> = n` adds `n` to the
        /// counter `<name>`, one with `histogram.<name> = x` records `x`; the event's other
        /// fields are the point's attributes.
        pub mod field {
            $(#[doc = concat!("`", $kind, ".", $value, "`: [`", stringify!($name), "`](super::", stringify!($name), ").")]
            pub const $field: &str = concat!($kind, ".", $value);)*
        }
        /// Every metric name.
        pub const ALL: &[&str] = &[$($value),*];
    };
}

/// The metrics.
pub mod metric {
    metrics! {
        /// Operations by [`attr::OUTCOME`](super::attr::OUTCOME) and
        /// [`attr::OPERATION`](super::attr::OPERATION) (a counter, `{operation}`).
        REQUESTS / REQUESTS = "monotonic_counter" "idem.requests";
        /// Leases taken over from an attempt whose lease had ended (a counter, `{takeover}`).
        LEASE_TAKEOVERS / LEASE_TAKEOVERS = "monotonic_counter" "idem.lease.takeovers";
        /// How long each store call took, by
        /// [`attr::STORE_OPERATION`](super::attr::STORE_OPERATION) (a histogram, in
        /// [`STORE_DURATION_UNIT`]).
        STORE_DURATION / STORE_DURATION = "histogram" "idem.store.duration";
        /// Records written: compare-and-set writes the store applied (a counter,
        /// `{record}`).
        RECORDS_WRITTEN / RECORDS_WRITTEN = "monotonic_counter" "idem.records.written";
    }
    /// The unit of [`STORE_DURATION`]: seconds, as OpenTelemetry's conventions time
    /// durations.
    pub const STORE_DURATION_UNIT: &str = "s";
}

/// The values of [`attr::STORE_OPERATION`].
pub mod store_op {
    /// Reading a record.
    pub const LOAD: &str = "load";
    /// Applying a compare-and-set write.
    pub const APPLY: &str = "apply";
    /// A store that claims for the host (a Durable Object).
    pub const CLAIM: &str = "claim";
}

/// The operations in the order of [`span::ALL`] and [`operation_name`]'s values.
pub const OPERATIONS: [Operation; 5] = [
    Operation::Guard,
    Operation::Status,
    Operation::IssueToken,
    Operation::OpenSession,
    Operation::Deliver,
];

/// The span of an operation.
pub fn span_name(operation: Operation) -> &'static str {
    match operation {
        Operation::Guard => span::REQUEST,
        Operation::Status => span::STATUS,
        Operation::IssueToken => span::TOKEN_ISSUE,
        Operation::OpenSession => span::SESSION_OPEN,
        Operation::Deliver => span::INBOX_DELIVERY,
    }
}

/// The value of [`attr::OPERATION`] for an operation: its span name without `idem.`.
pub fn operation_name(operation: Operation) -> &'static str {
    let index = OPERATIONS.iter().position(|o| *o == operation).unwrap_or(0);
    span::OPERATIONS[index]
}

/// What became of an operation, as the metrics count it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// The work ran (a fresh key claimed, a token issued, a status answered).
    Executed,
    /// A stored answer was replayed (a retry; an inbox duplicate).
    Replayed,
    /// A duplicate arrived while another attempt held the key's lease.
    Conflict,
    /// The key named another payload (a mismatch; a time or counter key's collision).
    Mismatch,
    /// Refused before any work: a bad or missing key, an expired or stale or forged one, a
    /// key held as outcome-unknown, a store that failed.
    Refused,
    /// The work ran after taking over an attempt whose lease had ended.
    Recovered,
}

impl Outcome {
    /// Every outcome, in the order of their indices.
    pub const ALL: [Outcome; 6] = [
        Outcome::Executed,
        Outcome::Replayed,
        Outcome::Conflict,
        Outcome::Mismatch,
        Outcome::Refused,
        Outcome::Recovered,
    ];

    /// The value of [`attr::OUTCOME`].
    pub const fn name(self) -> &'static str {
        match self {
            Outcome::Executed => "executed",
            Outcome::Replayed => "replayed",
            Outcome::Conflict => "conflict",
            Outcome::Mismatch => "mismatch",
            Outcome::Refused => "refused",
            Outcome::Recovered => "recovered",
        }
    }
}

/// The outcome an event decides, or `None` for an event that decides nothing (a
/// completion, a release, a heartbeat, a fenced-out completion): the operation's first
/// deciding event is its [`attr::DECISION`].
pub fn outcome_of(event: &Event) -> Option<Outcome> {
    Some(match event {
        Event::Executed => Outcome::Executed,
        Event::TookOver { .. } => Outcome::Recovered,
        Event::Replayed | Event::Duplicate => Outcome::Replayed,
        Event::InProgress => Outcome::Conflict,
        Event::Mismatch | Event::Collision => Outcome::Mismatch,
        Event::TombstoneHit
        | Event::OutcomeUnknownHit
        | Event::Rejected
        | Event::Stale
        | Event::Forged => Outcome::Refused,
        Event::Completed
        | Event::Released
        | Event::OutcomeUnknown
        | Event::FencedOut
        | Event::Extended => return None,
    })
}

/// The outcome of an operation whose deciding event was `decision` and whose answer had
/// `status`: the decision's, or for an operation that decides nothing (a status query, a
/// token, a session), executed for an answer below 400 and refused otherwise.
pub fn operation_outcome(decision: Option<&Event>, status: u16) -> Outcome {
    match decision.and_then(outcome_of) {
        Some(outcome) => outcome,
        None if status < 400 => Outcome::Executed,
        None => Outcome::Refused,
    }
}

/// The value of [`attr::ERROR_TYPE`] for an operation that ended with no answer of its own
/// (the handler failed or threw): OpenTelemetry's fallback value.
pub const ERROR_TYPE_OTHER: &str = "_OTHER";

/// The value of [`attr::ERROR_TYPE`] for an answer with `status` and problem `type` URI
/// `problem_type` (the engine's own refusals have one): the problem's slug for idem's
/// problems (`key-reuse-mismatch`, `in-progress`, …), the status code for any other
/// answer of 500 or more (OpenTelemetry's HTTP conventions), `None` otherwise.
pub fn error_type(status: u16, problem_type: Option<&str>) -> Option<String> {
    let prefix = crate::Problem::MISSING_KEY
        .type_uri
        .strip_suffix(crate::Problem::MISSING_KEY.slug);
    if status >= 400 {
        if let (Some(t), Some(prefix)) = (problem_type, prefix) {
            if let Some(slug) = t.strip_prefix(prefix) {
                return Some(String::from(slug));
            }
        }
    }
    // Decimal, not `to_string`: the integer formatting of `core::fmt` is not linked into the
    // WebAssembly module for this.
    (status >= 500).then(|| String::from(crate::canon::Decimal::new(u64::from(status)).as_str()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{RecordKey, Scope};
    use std::vec::Vec;

    #[test]
    fn every_event_maps_and_every_outcome_is_reached() {
        // IDEM-EVT-2
        let reached: Vec<Outcome> = Event::ALL.iter().filter_map(outcome_of).collect();
        for o in Outcome::ALL {
            assert!(reached.contains(&o), "{} is never reached", o.name());
        }
        assert_eq!(outcome_of(&Event::InProgress), Some(Outcome::Conflict));
        assert_eq!(
            outcome_of(&Event::TookOver { fence: 9 }),
            Some(Outcome::Recovered)
        );
        assert_eq!(outcome_of(&Event::Completed), None);
        assert_eq!(operation_outcome(None, 201), Outcome::Executed);
        assert_eq!(operation_outcome(None, 400), Outcome::Refused);
        assert_eq!(
            operation_outcome(Some(&Event::Replayed), 500),
            Outcome::Replayed
        );
    }

    #[test]
    fn names_are_distinct_and_namespaced() {
        let mut names: Vec<&str> = span::ALL.to_vec();
        names.extend(attr::ALL);
        names.extend(metric::ALL);
        let count = names.len();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), count, "a name is used twice");
        for n in span::ALL.iter().chain(metric::ALL) {
            assert!(n.starts_with("idem."), "{n}");
        }
        for (op, span) in OPERATIONS.iter().zip(span::ALL) {
            assert_eq!(span_name(*op), span);
            assert_eq!(alloc::format!("idem.{}", operation_name(*op)), span);
        }
        assert_eq!(metric::field::REQUESTS, "monotonic_counter.idem.requests");
        assert_eq!(
            metric::field::STORE_DURATION,
            "histogram.idem.store.duration"
        );
        let mut outcomes: Vec<&str> = Outcome::ALL.iter().map(|o| o.name()).collect();
        outcomes.sort_unstable();
        outcomes.dedup();
        assert_eq!(outcomes.len(), 6);
    }

    #[test]
    fn error_type_is_the_problem_slug_or_a_server_error_status() {
        let p = crate::Problem::MISSING_KEY;
        assert_eq!(
            error_type(p.status, Some(p.type_uri)).as_deref(),
            Some(p.slug)
        );
        assert_eq!(error_type(503, Some("about:blank")).as_deref(), Some("503"));
        assert_eq!(error_type(502, None).as_deref(), Some("502"));
        assert_eq!(error_type(404, Some("about:blank")), None);
        assert_eq!(error_type(200, None), None);
    }

    #[test]
    fn the_digest_names_the_record_without_its_key_or_principal() {
        // IDEM-EVT-2
        // Even a scope with the principal in clear (a custom one) does not show through.
        let a = RecordKey::new(Scope::new("user-7", "POST", "/orders"), "order-123");
        let d = a.digest();
        assert_eq!(d.len(), 32);
        assert!(d.bytes().all(|b| b.is_ascii_hexdigit()));
        assert!(!d.contains("order-123") && !d.contains("user-7"));
        assert_eq!(d, a.clone().digest(), "one record, one digest");
        let other = RecordKey::new(Scope::new("other", "POST", "/orders"), "order-123");
        assert_ne!(other.digest(), d, "another scope, another digest");
    }
}
