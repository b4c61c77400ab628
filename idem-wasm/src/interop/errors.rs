//! Errors as JavaScript gets them: a class (`RangeError` for bad input), a stable `code` (the
//! ID of the requirement in `spec/requirements.toml` that the input broke) and a message,
//! from the core's errors.

use alloc::format;
use alloc::string::{String, ToString};
use idem_core::{CompleteError, ConfigError, DecodeError, KindConfigError, Refusal};

/// The `code` of an option the JS API refuses (`IDEM-JS-1`).
pub const CODE_OPTIONS: &str = "IDEM-JS-1";

/// The `code` of a wire message (Durable Object protocol) that does not decode (`IDEM-JS-2`).
pub const CODE_WIRE: &str = "IDEM-JS-2";

/// Which JavaScript error class to throw.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    /// `RangeError`: the caller passed something invalid.
    Range,
    /// `Error`: anything else.
    Error,
}

/// A JavaScript error before it is built: class, stable `code` (a requirement ID), message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ErrorParts {
    /// The error class.
    pub kind: ErrorKind,
    /// The stable `code` property: a requirement ID from `spec/requirements.toml`.
    pub code: &'static str,
    /// The message.
    pub message: String,
}

impl ErrorParts {
    /// A `RangeError` with this code.
    pub fn range(code: &'static str, message: impl Into<String>) -> ErrorParts {
        ErrorParts {
            kind: ErrorKind::Range,
            code,
            message: message.into(),
        }
    }

    /// A bad option.
    pub fn options(message: impl Into<String>) -> ErrorParts {
        ErrorParts::range(CODE_OPTIONS, message)
    }

    /// A `RangeError` whose message is `name` followed by `rest`: joined without
    /// `core::fmt`, which the client's module does not otherwise need.
    pub fn about(code: &'static str, name: &str, rest: &str) -> ErrorParts {
        let mut message = String::with_capacity(name.len() + rest.len());
        message.push_str(name);
        message.push_str(rest);
        ErrorParts::range(code, message)
    }

    /// A refusal as an error (the client side, which throws instead of answering): its
    /// requirement is the code.
    pub fn refusal(r: &Refusal) -> ErrorParts {
        ErrorParts::range(r.requirement, r.detail.clone())
    }

    /// Stored bytes that are not a record.
    pub fn record(e: &DecodeError) -> ErrorParts {
        ErrorParts::range("IDEM-REC-1", format!("stored value: {e}"))
    }

    /// Wire bytes that do not decode.
    pub fn wire(what: &str) -> ErrorParts {
        ErrorParts::range(CODE_WIRE, format!("malformed {what}"))
    }

    /// An engine configuration the core refuses.
    pub fn config(e: &ConfigError) -> ErrorParts {
        let code = match e {
            ConfigError::KeyTtlShorterThanResponseTtl => "IDEM-TTL-2",
            ConfigError::LeaseLongerThanKeyTtl => "IDEM-LEASE-4",
            _ => CODE_OPTIONS,
        };
        ErrorParts::range(code, e.to_string())
    }

    /// A key kind configuration the core refuses.
    pub fn kind_config(e: &KindConfigError) -> ErrorParts {
        ErrorParts::options(e.to_string())
    }

    /// A completion the core refuses.
    pub fn complete(e: &CompleteError) -> ErrorParts {
        let code = match e {
            CompleteError::LeaseExpired => "IDEM-LEASE-3",
            CompleteError::NotOutcomeUnknown => "IDEM-OUT-3",
            _ => "IDEM-OUT-1",
        };
        ErrorParts::range(code, e.to_string())
    }

    /// Builds the JavaScript error, with the `code` property.
    #[cfg(feature = "server")]
    pub fn into_js(self) -> wasm_bindgen::JsValue {
        use wasm_bindgen::JsValue;
        let error: js_sys::Error = match self.kind {
            ErrorKind::Range => js_sys::RangeError::new(&self.message).into(),
            ErrorKind::Error => js_sys::Error::new(&self.message),
        };
        // Setting a property on a fresh Error object cannot fail.
        let _ = js_sys::Reflect::set(&error, &JsValue::from_str("code"), &self.code.into());
        error.into()
    }
}

impl From<&Refusal> for ErrorParts {
    fn from(r: &Refusal) -> ErrorParts {
        ErrorParts::refusal(r)
    }
}
