//! The names and codes JavaScript reads from the server's module instead of writing them
//! itself: the header names (idem-core's), the engine option names, the event and delivery
//! names with their flags and the problem type prefix. (The client's JavaScript has the names
//! it needs as constants, `js/client-codes/names.js`, written from the same Rust by
//! `tests/client_codes.rs`.)

use crate::interop;
use alloc::string::String;
use wasm_bindgen::prelude::*;

/// The request header that carries the key, lowercase (idem-core's
/// [`KEY_HEADER`](idem_core::KEY_HEADER)): a server's default, the header a client sends.
#[wasm_bindgen(js_name = keyHeader)]
pub fn key_header() -> String {
    String::from(idem_core::KEY_HEADER)
}

/// The request header that carries a counter client's low-water mark, lowercase (idem-core's
/// [`LOW_WATER_HEADER`](idem_core::LOW_WATER_HEADER)).
#[wasm_bindgen(js_name = lowWaterHeader)]
pub fn low_water_header() -> String {
    String::from(idem_core::LOW_WATER_HEADER)
}

/// The field that makes a `GET` a status query, lowercase (idem-core's
/// [`STATUS_HEADER`](idem_core::STATUS_HEADER)).
#[wasm_bindgen(js_name = statusHeader)]
pub fn status_header() -> String {
    String::from(idem_core::STATUS_HEADER)
}

/// The media type of a status document (idem-core's
/// [`STATUS_MEDIA_TYPE`](idem_core::STATUS_MEDIA_TYPE)).
#[wasm_bindgen(js_name = statusMediaType)]
pub fn status_media_type() -> String {
    String::from(idem_core::STATUS_MEDIA_TYPE)
}

/// The media type of a problem answer (idem-core's [`PROBLEM_JSON`](idem_core::PROBLEM_JSON),
/// RFC 9457): a client reads an answer's problem `type` only from such a body.
#[wasm_bindgen(js_name = problemMediaType)]
pub fn problem_media_type() -> String {
    String::from(idem_core::PROBLEM_JSON)
}

/// The names of the engine options, comma-separated: the JavaScript side refuses any option
/// that is neither one of these nor one of its own (`IDEM-JS-1`).
#[cfg(feature = "server")]
#[wasm_bindgen(js_name = engineOptionNames)]
pub fn engine_option_names() -> String {
    interop::ENGINE_OPTIONS.join(",")
}

/// The names of the delivery outcomes in index order, comma-separated (a
/// [`DeliveryOutcome`](interop::DeliveryOutcome) is an index): the core's.
#[cfg(feature = "server")]
#[wasm_bindgen(js_name = deliveryNames)]
pub fn delivery_names() -> String {
    interop::delivery_names().0
}

/// The delivery outcomes whose sender is told the message was received, as a bit mask over
/// their indices.
#[cfg(feature = "server")]
#[wasm_bindgen(js_name = acknowledgedMask)]
pub fn acknowledged_mask() -> u32 {
    interop::delivery_names().1
}

/// The event names in index order, comma-separated (`IDEM-EVT-1`).
#[cfg(feature = "server")]
#[wasm_bindgen(js_name = eventNames)]
pub fn event_names() -> String {
    interop::event_names()
}

/// The security-relevant events as a bit mask over event indices (`IDEM-EVT-1`).
#[cfg(feature = "server")]
#[wasm_bindgen(js_name = securityMask)]
pub fn security_mask() -> u32 {
    interop::security_mask()
}

/// The telemetry's names (idem-core's [`telemetry`](idem_core::telemetry)), as JSON:
/// `spans` (in operation order, see `Engine.operationIndex`), `attributes`, `metrics`,
/// `storeOperations`, `storeDurationUnit` and `outcomes` (in index order, see
/// [`operation_outcome`]) (`IDEM-EVT-2`).
#[cfg(feature = "server")]
#[wasm_bindgen(js_name = telemetryNames)]
pub fn telemetry_names() -> String {
    let takeover = TAKEOVER_INDEX[takeover_index()];
    let mut out = String::new();
    for piece in NAMES_BEFORE_TAKEOVER
        .iter()
        .chain([&takeover])
        .chain(NAMES_AFTER_TAKEOVER.iter())
    {
        out.push_str(piece);
    }
    out
}

/// [`telemetry_names`]'s JSON up to the takeover's index, in pieces: a table in the module's
/// data rather than code.
#[cfg(feature = "server")]
static NAMES_BEFORE_TAKEOVER: [&str; 57] = {
    use idem_core::telemetry::{attr, metric, span, store_op, ERROR_TYPE_OTHER};
    [
        r#"{"spans":[""#,
        span::ALL[0],
        r#"",""#,
        span::ALL[1],
        r#"",""#,
        span::ALL[2],
        r#"",""#,
        span::ALL[3],
        r#"",""#,
        span::ALL[4],
        r#""],"operations":[""#,
        span::OPERATIONS[0],
        r#"",""#,
        span::OPERATIONS[1],
        r#"",""#,
        span::OPERATIONS[2],
        r#"",""#,
        span::OPERATIONS[3],
        r#"",""#,
        span::OPERATIONS[4],
        r#""],"attributes":{"keyDigest":""#,
        attr::KEY_DIGEST,
        r#"","decision":""#,
        attr::DECISION,
        r#"","outcome":""#,
        attr::OUTCOME,
        r#"","operation":""#,
        attr::OPERATION,
        r#"","storeOperation":""#,
        attr::STORE_OPERATION,
        r#"","httpRequestMethod":""#,
        attr::HTTP_REQUEST_METHOD,
        r#"","httpRoute":""#,
        attr::HTTP_ROUTE,
        r#"","httpResponseStatusCode":""#,
        attr::HTTP_RESPONSE_STATUS_CODE,
        r#"","errorType":""#,
        attr::ERROR_TYPE,
        r#""},"metrics":{"requests":""#,
        metric::REQUESTS,
        r#"","leaseTakeovers":""#,
        metric::LEASE_TAKEOVERS,
        r#"","storeDuration":""#,
        metric::STORE_DURATION,
        r#"","recordsWritten":""#,
        metric::RECORDS_WRITTEN,
        r#""},"storeOperations":{"load":""#,
        store_op::LOAD,
        r#"","apply":""#,
        store_op::APPLY,
        r#"","claim":""#,
        store_op::CLAIM,
        r#""},"storeDurationUnit":""#,
        metric::STORE_DURATION_UNIT,
        r#"","errorTypeOther":""#,
        ERROR_TYPE_OTHER,
        r#"","takeover":"#,
    ]
};

/// [`telemetry_names`]'s JSON after the takeover's index.
#[cfg(feature = "server")]
static NAMES_AFTER_TAKEOVER: [&str; 13] = {
    use idem_core::telemetry::Outcome;
    [
        r#","outcomes":[""#,
        Outcome::ALL[0].name(),
        r#"",""#,
        Outcome::ALL[1].name(),
        r#"",""#,
        Outcome::ALL[2].name(),
        r#"",""#,
        Outcome::ALL[3].name(),
        r#"",""#,
        Outcome::ALL[4].name(),
        r#"",""#,
        Outcome::ALL[5].name(),
        r#""]}"#,
    ]
};

/// Event indices as text (an index is below 32: the masks are u32), for [`telemetry_names`].
#[cfg(feature = "server")]
const TAKEOVER_INDEX: [&str; 32] = [
    "0", "1", "2", "3", "4", "5", "6", "7", "8", "9", "10", "11", "12", "13", "14", "15", "16",
    "17", "18", "19", "20", "21", "22", "23", "24", "25", "26", "27", "28", "29", "30", "31",
];

/// The index of the event that counts as a lease takeover.
#[cfg(feature = "server")]
fn takeover_index() -> usize {
    idem_core::Event::ALL
        .iter()
        .position(|e| matches!(e, idem_core::Event::TookOver { .. }))
        .unwrap_or(0)
}

/// The events that decide an operation (its `idem.decision`), as a bit mask over event
/// indices: idem-core's [`outcome_of`](idem_core::telemetry::outcome_of) is some.
#[cfg(feature = "server")]
#[wasm_bindgen(js_name = decisionMask)]
pub fn decision_mask() -> u32 {
    idem_core::Event::ALL
        .iter()
        .enumerate()
        .filter(|(_, e)| idem_core::telemetry::outcome_of(e).is_some())
        .fold(0, |mask, (i, _)| mask | (1 << i))
}

/// The outcome of an operation (an index into `telemetryNames().outcomes`) whose deciding
/// event has index `event` (-1 for none) and whose answer had `status`: idem-core's
/// [`operation_outcome`](idem_core::telemetry::operation_outcome).
#[cfg(feature = "server")]
#[wasm_bindgen(js_name = operationOutcome)]
pub fn operation_outcome(event: i32, status: u16) -> u32 {
    use idem_core::telemetry::{self, Outcome};
    let decision = usize::try_from(event)
        .ok()
        .and_then(|i| idem_core::Event::ALL.get(i));
    let outcome = telemetry::operation_outcome(decision, status);
    Outcome::ALL.iter().position(|o| *o == outcome).unwrap_or(0) as u32
}

/// The header a replay carries, lowercase (idem-core's
/// [`REPLAYED_HEADER`](idem_core::REPLAYED_HEADER)). JavaScript learns that a reply is a
/// replay from its [`ReplyFlag`](interop::ReplyFlag), never from its headers; this is for
/// the checks that both agree.
#[cfg(feature = "server")]
#[wasm_bindgen(js_name = replayedHeader)]
pub fn replayed_header() -> String {
    String::from(idem_core::REPLAYED_HEADER)
}

/// What every problem `type` of idem's own starts with (`urn:idem:problem:`): the core's
/// [`Problem`](idem_core::Problem) types, as one of them writes it.
#[cfg(feature = "server")]
#[wasm_bindgen(js_name = problemTypePrefix)]
pub fn problem_type_prefix() -> String {
    let p = idem_core::Problem::MISSING_KEY;
    String::from(p.type_uri.strip_suffix(p.slug).unwrap_or(p.type_uri))
}

/// The in-process stores' accounting, idem-core's: the bytes counted per record beyond its
/// key and its bytes ([`ENTRY_OVERHEAD`](idem_core::ENTRY_OVERHEAD)) and the due records a
/// write expires first ([`SWEEP_PER_WRITE`](idem_core::SWEEP_PER_WRITE)), for the stores
/// that keep records in JavaScript (a sealed `MemoryStore`).
#[cfg(feature = "server")]
#[wasm_bindgen(js_name = memoryAccounting)]
pub fn memory_accounting() -> alloc::vec::Vec<u32> {
    alloc::vec![
        idem_core::ENTRY_OVERHEAD as u32,
        idem_core::SWEEP_PER_WRITE as u32
    ]
}
