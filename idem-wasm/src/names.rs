//! The names and codes JavaScript reads from the module instead of writing them itself: the
//! header names (idem-core's), the engine option names, the event and delivery names with
//! their flags, the problem type prefix, and the client's outcome names.

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

/// The names of the outcomes of `idempotentFetch` in index order, comma-separated (a
/// [`FetchOutcome`](interop::FetchOutcome) is an index).
#[cfg(feature = "client")]
#[wasm_bindgen(js_name = outcomeNames)]
pub fn outcome_names() -> String {
    interop::outcome_names()
}
