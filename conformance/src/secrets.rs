//! Keeping credentials out of reports.
//!
//! A report goes to CI logs, artifacts and bug trackers, so by default it carries no
//! credential: the value of every header given with `-H`, `--header-env`, `--header-file`
//! or as a second credential, and of every header that commonly carries one
//! (`Authorization`, `Cookie`, API-key headers, and `Set-Cookie` in answers), is shown only
//! by its scheme and length. The same values are also cut out of every other text of the
//! report (bodies, URLs, expectations and observations), in case the server echoes them.
//! `--show-secrets` turns this off.

use crate::http::Exchange;
use crate::suite::{Report, Target};

/// Headers whose values are credentials whether or not the user gave them.
const SENSITIVE: &[&str] = &[
    "authorization",
    "proxy-authorization",
    "cookie",
    "set-cookie",
    "x-api-key",
    "api-key",
    "x-auth-token",
];

/// Parts of a credential shorter than this are not cut out of free text (a whole header
/// value always is, from [`MIN_VALUE`] characters).
const MIN_PART: usize = 6;
/// Whole credential values shorter than this are not cut out of free text: they would
/// mangle ordinary words and are no secret.
const MIN_VALUE: usize = 4;

/// What stands in for a cut-out secret.
const CUT: &str = "<redacted>";

/// Redacts the credentials of one target.
#[derive(Clone, Debug, Default)]
pub struct Redactor {
    /// Lower-case names of the headers whose values are never shown.
    names: Vec<String>,
    /// Secret strings, longest first.
    secrets: Vec<String>,
}

impl Redactor {
    /// The redactor for `target`'s credentials.
    pub fn for_target(target: &Target) -> Redactor {
        let mut names: Vec<String> = SENSITIVE.iter().map(|s| (*s).to_owned()).collect();
        let mut secrets = Vec::new();
        for (n, v) in target.headers.iter().chain(&target.second_credential) {
            let name = n.as_str().to_owned();
            if !names.contains(&name) {
                names.push(name);
            }
            let value = String::from_utf8_lossy(v.as_bytes()).into_owned();
            for part in value
                .split(|c: char| c.is_whitespace() || c == ';' || c == ',')
                .flat_map(|p| std::iter::once(p).chain(p.split_once('=').map(|(_, v)| v)))
                .map(str::trim)
                .filter(|p| p.len() >= MIN_PART)
            {
                secrets.push(part.to_owned());
            }
            if value.trim().len() >= MIN_VALUE {
                secrets.push(value.trim().to_owned());
            }
        }
        // Credentials in the URL (`https://user:password@host/`).
        for part in [target.url.username(), target.url.password().unwrap_or("")] {
            if part.len() >= MIN_VALUE {
                secrets.push(part.to_owned());
            }
        }
        secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
        secrets.dedup();
        Redactor { names, secrets }
    }

    /// Whether header `name`'s values are hidden.
    pub fn hides(&self, name: &str) -> bool {
        self.names.iter().any(|n| n.eq_ignore_ascii_case(name))
    }

    /// A hidden header value as shown: its scheme (for `Scheme token` values) and length.
    fn header_value(value: &str) -> String {
        match value.split_once(' ') {
            Some((scheme, rest))
                if !scheme.is_empty() && scheme.chars().all(|c| c.is_ascii_alphanumeric()) =>
            {
                format!("{scheme} <{} bytes redacted>", rest.len())
            }
            _ => format!("<{} bytes redacted>", value.len()),
        }
    }

    /// `text` with every secret cut out.
    pub fn text(&self, text: &str) -> String {
        let mut out = text.to_owned();
        for s in &self.secrets {
            if out.contains(s.as_str()) {
                out = out.replace(s.as_str(), CUT);
            }
        }
        out
    }

    fn in_place(&self, text: &mut String) {
        if self.secrets.iter().any(|s| text.contains(s.as_str())) {
            *text = self.text(text);
        }
    }

    fn headers(&self, headers: &mut [(String, String)]) {
        for (n, v) in headers {
            if self.hides(n) {
                *v = Redactor::header_value(v);
            } else {
                self.in_place(v);
            }
        }
    }

    fn exchange(&self, e: &mut Exchange) {
        self.in_place(&mut e.label);
        self.in_place(&mut e.request.url);
        self.headers(&mut e.request.headers);
        self.in_place(&mut e.request.body);
        if let Some(r) = &mut e.response {
            self.headers(&mut r.headers);
            self.in_place(&mut r.body);
        }
        if let Some(err) = &mut e.error {
            self.in_place(err);
        }
    }

    /// Redacts every credential in `report`.
    pub fn report(&self, report: &mut Report) {
        self.in_place(&mut report.target);
        for (name, value) in &mut report.options {
            match value.split_once(": ") {
                Some((header, v))
                    if (name == "header" || name == "second credential") && self.hides(header) =>
                {
                    *value = format!("{header}: {}", Redactor::header_value(v));
                }
                _ => self.in_place(value),
            }
        }
        for c in &mut report.cases {
            for s in [&mut c.reason, &mut c.expected, &mut c.observed]
                .into_iter()
                .flatten()
            {
                self.in_place(s);
            }
            for m in &mut c.missed {
                self.in_place(&mut m.expected);
                self.in_place(&mut m.observed);
            }
            for n in &mut c.notes {
                self.in_place(n);
            }
            for e in &mut c.exchanges {
                self.exchange(e);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hyper::header::{HeaderName, HeaderValue};

    fn target(headers: &[(&str, &str)]) -> Target {
        let mut t = Target::new(url::Url::parse("http://127.0.0.1:1/").expect("url"));
        t.headers = headers
            .iter()
            .map(|(n, v)| {
                (
                    HeaderName::from_bytes(n.as_bytes()).expect("name"),
                    HeaderValue::from_str(v).expect("value"),
                )
            })
            .collect();
        t
    }

    #[test]
    fn credentials_are_cut_from_headers_and_text() {
        let r = Redactor::for_target(&target(&[
            ("X-Tenant-Secret", "s3cr3t-tenant"),
            ("Cookie", "session=abcdef123456; theme=dark"),
            ("Authorization", "Bearer tok_live_123456"),
        ]));
        assert!(r.hides("x-tenant-secret") && r.hides("X-API-KEY") && r.hides("set-cookie"));
        assert!(!r.hides("content-type"));
        assert_eq!(
            Redactor::header_value("Bearer tok_live_123456"),
            "Bearer <15 bytes redacted>"
        );
        assert_eq!(
            Redactor::header_value("session=abcdef123456; theme=dark"),
            "<32 bytes redacted>"
        );
        let echoed = r.text("you sent tok_live_123456 and abcdef123456 as s3cr3t-tenant");
        assert!(
            !echoed.contains("tok_live")
                && !echoed.contains("abcdef")
                && !echoed.contains("s3cr3t")
        );
        // Short parts ("dark") stay: they are no secret and cutting them would mangle text.
        assert_eq!(r.text("dark mode"), "dark mode");
    }

    #[test]
    fn credentials_in_the_url_are_cut() {
        let mut t = target(&[]);
        t.url = url::Url::parse("https://deploy:pa55word-xyz@api.example/orders").expect("url");
        let r = Redactor::for_target(&t);
        let shown = r.text(t.url.as_str());
        assert!(
            !shown.contains("pa55word-xyz") && !shown.contains("deploy"),
            "{shown}"
        );
        assert!(shown.contains("api.example/orders"));
    }
}
