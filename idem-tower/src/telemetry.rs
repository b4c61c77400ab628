//! Telemetry through `tracing`, under idem-core's names ([`idem_core::telemetry`]): one span
//! per operation, and metric events in the field conventions of tracing-opentelemetry's
//! `MetricsLayer`, so that this crate needs no OpenTelemetry dependency of its own. With no
//! subscriber interested in the `idem` target, a span is `Span::none()` and an event a
//! disabled callsite: the digest is never computed.
//!
//! `docs/observability.md` at the repository root shows the subscriber to install.

use idem_core::telemetry::{self, attr, metric};
use idem_core::{Event, Operation, RecordKey, Reply, Request};
use std::sync::Mutex;
use std::time::Instant;
use tracing::field::Empty;
use tracing::Span;

/// The target of every span and event of the layer's telemetry.
pub(crate) const TARGET: &str = "idem";

/// The telemetry of one operation: its span, and its deciding event once there is one.
pub(crate) struct Trace {
    span: Span,
    operation: Operation,
    decision: Mutex<Option<Event>>,
}

impl Trace {
    /// The span of `request`'s operation, with its key's digest, and the method and route of
    /// the HTTP request it serves where there is one.
    pub(crate) fn new(request: &Request, method: Option<&str>, route: Option<&str>) -> Trace {
        let operation = request.operation();
        let key = request.key();
        let span = tracing::info_span!(
            target: TARGET,
            "idem",
            otel.name = telemetry::span_name(operation),
            { attr::OPERATION } = telemetry::operation_name(operation),
            { attr::KEY_DIGEST } = digest(key),
            { attr::HTTP_REQUEST_METHOD } = method,
            { attr::HTTP_ROUTE } = route,
            { attr::DECISION } = Empty,
            { attr::OUTCOME } = Empty,
            { attr::HTTP_RESPONSE_STATUS_CODE } = Empty,
            { attr::ERROR_TYPE } = Empty,
        );
        Trace {
            span,
            operation,
            decision: Mutex::new(None),
        }
    }

    /// The span, for the futures that run inside it.
    pub(crate) fn span(&self) -> &Span {
        &self.span
    }

    /// Takes note of an event: the first that decides is the decision; a takeover is
    /// counted.
    pub(crate) fn observe(&self, event: &Event) {
        if matches!(event, Event::TookOver { .. }) {
            tracing::event!(target: TARGET, parent: &self.span, tracing::Level::INFO, { metric::field::LEASE_TAKEOVERS } = 1u64);
        }
        if self.span.is_disabled() || telemetry::outcome_of(event).is_none() {
            return;
        }
        let mut decision = self.decision.lock().unwrap_or_else(|e| e.into_inner());
        if decision.is_none() {
            *decision = Some(*event);
            self.span.record(attr::DECISION, event.name());
        }
    }

    /// Ends the operation with the answer the host sent: `reply` (the engine's), or the
    /// handler's `status`.
    pub(crate) fn answered(&self, reply: Option<&Reply>, status: u16) {
        let problem = reply.and_then(Reply::problem_type);
        self.finish(status, telemetry::error_type(status, problem).as_deref());
    }

    /// Ends the operation with no answer of its own: the inner service (or the process of a
    /// delivery) failed.
    pub(crate) fn failed(&self) {
        self.finish(0, Some(telemetry::ERROR_TYPE_OTHER));
    }

    fn finish(&self, status: u16, error: Option<&str>) {
        let decision = *self.decision.lock().unwrap_or_else(|e| e.into_inner());
        let outcome = telemetry::operation_outcome(decision.as_ref(), status);
        if status != 0 {
            self.span
                .record(attr::HTTP_RESPONSE_STATUS_CODE, i64::from(status));
        }
        if let Some(error) = error {
            self.span.record(attr::ERROR_TYPE, error);
        }
        self.span.record(attr::OUTCOME, outcome.name());
        tracing::event!(
            target: TARGET,
            parent: &self.span,
            tracing::Level::INFO,
            { metric::field::REQUESTS } = 1u64,
            { attr::OUTCOME } = outcome.name(),
            { attr::OPERATION } = telemetry::operation_name(self.operation),
        );
    }
}

/// The digest of a record for telemetry, or none for a request refused before it had a key.
fn digest(key: &RecordKey) -> Option<String> {
    (!key.key.is_empty()).then(|| key.digest())
}

/// Records how long a store call started at `since` took, and counts an applied write.
pub(crate) fn store_call(operation: &'static str, since: Instant, written: bool) {
    tracing::event!(
        target: TARGET,
        tracing::Level::INFO,
        { metric::field::STORE_DURATION } = since.elapsed().as_secs_f64(),
        { attr::STORE_OPERATION } = operation,
    );
    if written {
        tracing::event!(target: TARGET, tracing::Level::INFO, { metric::field::RECORDS_WRITTEN } = 1u64);
    }
}
