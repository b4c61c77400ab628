//! Requests written byte for byte on a connection of their own, and their answers, for the
//! tests that talk to the layer over loopback HTTP/1.1.
#![allow(dead_code, unreachable_pub)]

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// An answer: its status, its header fields (names in lower case) and its body.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Answer {
    /// The first value of header `name`.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The body as JSON.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("{e}: {}", self.body))
    }

    /// The `type` of a problem+json answer, checking that it is one and that its `status` is
    /// the answer's.
    pub fn problem_type(&self) -> String {
        assert_eq!(
            self.header("content-type"),
            Some("application/problem+json"),
            "{}",
            self.body
        );
        let v = self.json();
        assert_eq!(v["status"].as_u64(), Some(u64::from(self.status)));
        v["type"].as_str().expect("a type").to_owned()
    }
}

/// Writes `request` (head and body) on a connection of its own to 127.0.0.1:`port`, and
/// reads the answer until the server closes it (send `connection: close`).
pub async fn exchange(port: u16, request: &[u8]) -> Answer {
    let mut stream = TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("a connection");
    stream.write_all(request).await.expect("the request");
    let mut out = Vec::new();
    let _ = stream.read_to_end(&mut out).await;
    parse(&out)
}

/// A request with `method` to `path`, the header lines `head` (without Host, Connection and
/// Content-Length) and `body`, closing its connection after the answer.
pub fn request(method: &str, path: &str, head: &[&str], body: &[u8]) -> Vec<u8> {
    let mut out = format!(
        "{method} {path} HTTP/1.1\r\nhost: 127.0.0.1\r\nconnection: close\r\ncontent-length: {}\r\n",
        body.len()
    )
    .into_bytes();
    for line in head {
        out.extend_from_slice(line.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(body);
    out
}

/// An HTTP/1.1 answer as read (a body that is not chunked).
pub fn parse(bytes: &[u8]) -> Answer {
    let text = String::from_utf8_lossy(bytes);
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    Answer {
        status,
        headers,
        body: body.to_owned(),
    }
}
