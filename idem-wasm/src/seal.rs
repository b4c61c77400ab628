//! The sealed record format ([`idem_core::seal`]) for the JavaScript stores, which seal with
//! WebCrypto's AES-GCM: the head a key id starts a sealed record with, the data
//! authenticated with it, the frame, and a sealed record taken apart to be opened. The
//! format is idem-core's; only the cipher is JavaScript's.

use crate::interop::ErrorParts;
use crate::{js, JsResult};
use alloc::string::{String, ToString};
use alloc::vec::Vec;
use idem_core::seal;
use wasm_bindgen::prelude::*;

/// The start of a record sealed under `keyId` (`IDEM-SEAL-1`). Throws a `RangeError`
/// (`IDEM-JS-1`) for an id that is not 1 to 64 visible ASCII characters.
#[wasm_bindgen(js_name = sealHead)]
pub fn seal_head(key_id: &str) -> JsResult<Vec<u8>> {
    seal::head(key_id).map_err(|e| js(ErrorParts::options(e.to_string())))
}

/// The data authenticated with a record sealed with `head` under `storageKey`.
#[wasm_bindgen(js_name = sealAad)]
pub fn seal_aad(head: &[u8], storage_key: &str) -> Vec<u8> {
    seal::aad(head, storage_key)
}

/// A sealed record: `head`, the 12-byte `nonce`, and the ciphertext with its tag.
#[wasm_bindgen(js_name = sealFrame)]
pub fn seal_frame(head: &[u8], nonce: &[u8], ciphertext: &[u8]) -> JsResult<Vec<u8>> {
    let nonce: &[u8; seal::NONCE_LEN] = nonce
        .try_into()
        .map_err(|_| js(ErrorParts::options("a seal nonce is 12 bytes")))?;
    Ok(seal::frame(head, nonce, ciphertext))
}

/// A sealed record taken apart ([`sealedParts`](sealed_parts)).
#[wasm_bindgen]
pub struct SealedParts {
    key_id: String,
    nonce: Vec<u8>,
    aad: Vec<u8>,
    start: usize,
}

#[wasm_bindgen]
impl SealedParts {
    /// The id of the key it was sealed with.
    #[wasm_bindgen(getter, js_name = keyId)]
    pub fn key_id(&self) -> String {
        self.key_id.clone()
    }

    /// Its nonce.
    #[wasm_bindgen(getter)]
    pub fn nonce(&self) -> Vec<u8> {
        self.nonce.clone()
    }

    /// The data it was authenticated with, for the storage key it was read under.
    #[wasm_bindgen(getter)]
    pub fn aad(&self) -> Vec<u8> {
        self.aad.clone()
    }

    /// Where its ciphertext (with the tag) starts in the bytes it was taken from.
    #[wasm_bindgen(getter, js_name = ciphertextStart)]
    pub fn ciphertext_start(&self) -> usize {
        self.start
    }
}

/// Stored bytes read under `storageKey`, taken apart when they are a sealed record;
/// `undefined` for a record in clear. Throws a `RangeError` (`IDEM-SEAL-3`) for a sealed
/// record that is cut short or of an unknown version.
#[wasm_bindgen(js_name = sealedParts)]
pub fn sealed_parts(bytes: &[u8], storage_key: &str) -> JsResult<Option<SealedParts>> {
    let Some(sealed) = seal::Sealed::parse(bytes)
        .map_err(|e| js(ErrorParts::range("IDEM-SEAL-3", e.to_string())))?
    else {
        return Ok(None);
    };
    Ok(Some(SealedParts {
        key_id: sealed.key_id.to_string(),
        nonce: sealed.nonce.to_vec(),
        aad: sealed.aad(storage_key),
        start: bytes.len() - sealed.ciphertext.len(),
    }))
}

/// Checks seal keys as a store is given them (`IDEM-SEAL-2`): at least one, ids valid and
/// distinct, each key 32 bytes. Throws a `RangeError` (`IDEM-JS-1`) naming what is wrong.
#[wasm_bindgen(js_name = sealCheckKeys)]
pub fn seal_check_keys(ids: Vec<String>, lengths: Vec<u32>) -> JsResult<()> {
    seal::check_keys(
        ids.iter()
            .map(String::as_str)
            .zip(lengths.iter().map(|&n| n as usize)),
    )
    .map_err(|e| js(ErrorParts::options(e.to_string())))
}
