//! The response a record keeps for replay.

use alloc::string::String;
use alloc::vec::Vec;

/// A response kept for replay (`IDEM-REPLAY-1`): status, the headers the host chose to keep,
/// and the body, byte for byte. A header value is kept as text whose every character is one
/// byte of the field ([`StoredResponse::field_text`]), as Fetch's `Headers` and Node hold
/// them, so that any host replays the same bytes, from a record any host wrote.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct StoredResponse {
    /// HTTP status code, 100 to 599.
    pub status: u16,
    /// Header fields in order (name, value).
    pub headers: Vec<(String, String)>,
    /// The body.
    pub body: Vec<u8>,
}

impl StoredResponse {
    /// A header field value as it is kept: each byte as the character of the same number
    /// (ISO-8859-1), so that bytes that are not UTF-8 are kept too, and the text is the one
    /// a JavaScript host holds for the same field (`IDEM-REPLAY-1`).
    pub fn field_text(bytes: &[u8]) -> String {
        bytes.iter().map(|&b| char::from(b)).collect()
    }

    /// The bytes of a kept header value ([`field_text`](Self::field_text)'s inverse);
    /// `None` for text with a character above U+00FF, which no field's bytes give.
    pub fn field_bytes(text: &str) -> Option<Vec<u8>> {
        text.chars().map(|c| u8::try_from(c).ok()).collect()
    }

    /// Bytes held by this response, for store accounting.
    pub fn size(&self) -> usize {
        self.body.len()
            + self
                .headers
                .iter()
                .map(|(n, v)| n.len() + v.len() + 16)
                .sum::<usize>()
    }
}
