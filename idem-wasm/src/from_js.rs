//! What reads JavaScript values: the options objects, member by member, into the plain Rust
//! of `interop`, which checks them.

use crate::interop::{self, ErrorParts};
use js_sys::Reflect;
use wasm_bindgen::prelude::*;
use {
    crate::interop::EngineOptions,
    alloc::string::String,
    alloc::vec::Vec,
    js_sys::{Array, Object},
};

pub(crate) fn get(object: &JsValue, name: &str) -> JsValue {
    Reflect::get(object, &JsValue::from_str(name)).unwrap_or(JsValue::UNDEFINED)
}

pub(crate) fn given(v: &JsValue) -> bool {
    !(v.is_undefined() || v.is_null())
}

pub(crate) fn number(object: &JsValue, name: &str) -> Result<Option<f64>, ErrorParts> {
    let v = get(object, name);
    if !given(&v) {
        return Ok(None);
    }
    v.as_f64()
        .map(Some)
        .ok_or_else(|| ErrorParts::about(interop::CODE_OPTIONS, name, " must be a number"))
}

fn text(object: &JsValue, name: &str) -> Result<Option<String>, ErrorParts> {
    let v = get(object, name);
    if !given(&v) {
        return Ok(None);
    }
    v.as_string()
        .map(Some)
        .ok_or_else(|| ErrorParts::options(alloc::format!("{name} must be a string")))
}

fn strings(object: &JsValue, name: &str, label: &str) -> Result<Option<Vec<String>>, ErrorParts> {
    let v = get(object, name);
    if !given(&v) {
        return Ok(None);
    }
    let bad = || ErrorParts::options(alloc::format!("{label} must be an array of strings"));
    if !Array::is_array(&v) {
        return Err(bad());
    }
    Array::from(&v)
        .iter()
        .map(|item| item.as_string().ok_or_else(bad))
        .collect::<Result<Vec<_>, _>>()
        .map(Some)
}

/// The engine options from the options object, by the names in
/// [`interop::ENGINE_OPTIONS`] (other members are the JavaScript side's).
pub(crate) fn engine_options(o: &JsValue) -> Result<EngineOptions, ErrorParts> {
    if !o.is_object() {
        return Err(ErrorParts::options("options must be an object"));
    }
    let f = get(o, "fingerprint");
    if given(&f) {
        if !f.is_object() {
            return Err(ErrorParts::options("options.fingerprint must be an object"));
        }
        for name in Object::keys(&Object::from(f.clone())).iter() {
            let name = name.as_string().unwrap_or_default();
            if !interop::FINGERPRINT_OPTIONS.contains(&name.as_str()) {
                return Err(ErrorParts::options(alloc::format!(
                    "unknown option \"fingerprint.{name}\""
                )));
            }
        }
    }
    let mut kinds = Vec::new();
    for (name, members) in interop::KIND_OPTIONS {
        let v = get(o, name);
        if given(&v) {
            if !v.is_object() || Array::is_array(&v) {
                return Err(ErrorParts::options(alloc::format!(
                    "options.{name} must be an object"
                )));
            }
            for member in Object::keys(&Object::from(v.clone())).iter() {
                let member = member.as_string().unwrap_or_default();
                if !members.contains(&member.as_str()) {
                    return Err(ErrorParts::options(alloc::format!(
                        "unknown option \"{name}.{member}\""
                    )));
                }
            }
        }
        kinds.push(v);
    }
    let member = |i: usize, name: &str| -> Result<Option<f64>, ErrorParts> {
        if given(&kinds[i]) {
            number(&kinds[i], name)
        } else {
            Ok(None)
        }
    };
    let time_keys = (member(0, "maxAhead")?, member(0, "maxAge")?);
    let counter = (member(1, "bits")?, member(1, "window")?);
    let token = (
        if given(&kinds[2]) {
            text(&kinds[2], "secret")?
        } else {
            None
        },
        member(2, "ttl")?,
    );
    let fallback = get(o, "keyFallback");
    let key_fallback =
        if !given(&fallback) {
            None
        } else if fallback.as_string().as_deref() == Some("derive") {
            Some(idem_core::KeyFallback::Derived)
        } else {
            match text(&fallback, "jsonPointer") {
                Ok(Some(p)) if fallback.is_object() && (p.is_empty() || p.starts_with('/')) => {
                    Some(idem_core::KeyFallback::JsonPointer(p))
                }
                _ => return Err(ErrorParts::options(
                    "options.keyFallback must be \"derive\" or { jsonPointer: \"/path/to/key\" }",
                )),
            }
        };
    let in_flight = get(o, "inFlight");
    let in_flight = if !given(&in_flight) || in_flight.as_string().as_deref() == Some("reject") {
        None
    } else if in_flight.is_object() && !Array::is_array(&in_flight) {
        let wait = number(&in_flight, "wait")?;
        let poll = number(&in_flight, "poll")?;
        Some((wait.unwrap_or(f64::NAN), poll))
    } else {
        return Err(ErrorParts::options(
            "options.inFlight must be \"reject\" or { wait: ms, poll?: ms }",
        ));
    };
    Ok(EngineOptions {
        response_ttl: number(o, "responseTtl")?,
        key_ttl: number(o, "keyTtl")?,
        lease: number(o, "lease")?,
        max_retry_after: number(o, "maxRetryAfter")?,
        unknown_outcome: text(o, "unknownOutcome")?,
        key_kind: text(o, "keyKind")?,
        time_keys,
        counter,
        token,
        key_fallback,
        headers: if given(&f) {
            strings(&f, "headers", "fingerprint.headers")?.unwrap_or_default()
        } else {
            Vec::new()
        },
        exclude: if given(&f) {
            strings(&f, "exclude", "fingerprint.exclude")?.unwrap_or_default()
        } else {
            Vec::new()
        },
        json: if given(&f) { text(&f, "json")? } else { None },
        max_body: if given(&f) {
            number(&f, "maxBody")?
        } else {
            None
        },
        in_flight,
        methods: strings(o, "methods", "options.methods")?,
        keys: text(o, "keys")?,
        max_response_bytes: number(o, "maxResponseBytes")?,
    })
}
