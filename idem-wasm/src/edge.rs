//! The answers of the HTTP edge a host sends on its own, rendered by the core: RFC 9457's
//! `about:blank` problems ([`Plain`](idem_core::Plain)) for what it refuses that idem has no
//! type of its own for (a route that does not exist, a method it does not take, a failure of
//! the host), as reply bytes (see [`interop`]).

use crate::interop::{self, ErrorParts};
use crate::{js, JsResult};
use alloc::format;
use alloc::vec::Vec;
use idem_core::Reply;
use wasm_bindgen::prelude::*;

/// The reply bytes of the `about:blank` problem with `status` (400, 404, 405, 500 or 503) and
/// `detail`. Throws a `RangeError` (`IDEM-JS-1`) for another status.
#[wasm_bindgen(js_name = plainReply)]
pub fn plain_reply(status: u16, detail: &str) -> JsResult<Vec<u8>> {
    let plain = interop::plain_of(status).ok_or_else(|| {
        js(ErrorParts::options(format!(
            "there is no about:blank problem of status {status}: use 400, 404, 405, 500 or 503"
        )))
    })?;
    Ok(interop::encode_reply(&Reply::plain(plain, detail)))
}

/// The reply bytes of 405, naming the methods the resource takes (`allow`) in `Allow`.
#[wasm_bindgen(js_name = methodNotAllowedReply)]
pub fn method_not_allowed_reply(allow: &str) -> Vec<u8> {
    interop::encode_reply(&Reply::method_not_allowed(allow))
}
