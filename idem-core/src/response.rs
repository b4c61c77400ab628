//! The response a record keeps for replay.

use alloc::string::String;
use alloc::vec::Vec;

/// A response kept for replay (`IDEM-REPLAY-1`): status, the headers the host chose to keep,
/// and the body, byte for byte.
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
