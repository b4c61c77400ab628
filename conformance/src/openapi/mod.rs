//! `idem-conformance openapi SPEC`: the operations of an OpenAPI 3.0 or 3.1 document that
//! take an idempotency key, each turned into a [`Target`] for the suite.
//!
//! An operation is taken when one of its parameters (its own or its path's, `$ref`s into
//! `#/components/parameters` followed) is a header named like the key header, or when it
//! is named with `--operation` (by `operationId`, or as `METHOD /path`). Its request is
//! built from the document: the method and path, the path's parameters and required query
//! parameters from their examples, the body from the request body's example (of
//! `application/json` when there is one), and the server from the operation's, the path's
//! or the document's `servers` (variables at their defaults) unless `--base-url` gives it.
//! An operation whose request cannot be built is skipped with the reason, never silently.
//!
//! A key header parameter (or the operation) may say which kind of key it takes with the
//! extension `x-idempotency-key-kind: opaque | time | counter | token`; the generic cases
//! run against an opaque one, the kind's family against the others.

use crate::suite::{KeyKind, Target};
use bytes::Bytes;
use hyper::header::{HeaderName, HeaderValue};
use hyper::Method;
use serde::Serialize;
use serde_json::Value;
use std::collections::BTreeMap;
use url::Url;

mod report;

pub use report::{Combined, OperationReport};

/// The extension that names the kind of key an operation takes.
pub const KIND_EXTENSION: &str = "x-idempotency-key-kind";

/// The methods an OpenAPI path item may hold, in the specification's order.
const METHODS: [&str; 8] = [
    "get", "put", "post", "delete", "options", "head", "patch", "trace",
];

/// An OpenAPI document, read from YAML or JSON.
#[derive(Debug)]
pub struct Document {
    root: Value,
}

/// One operation the suite may run against.
#[derive(Clone, Debug, Serialize)]
pub struct Operation {
    /// Its `operationId`, or `METHOD /path` without one.
    pub id: String,
    /// The method, upper-case.
    pub method: String,
    /// The path as the document writes it.
    pub path: String,
    /// The request URL, once it could be built.
    pub url: Option<String>,
    /// The kind of key it takes.
    pub key_kind: KeyKind,
    /// Why it is not run, if it is not.
    pub skipped: Option<String>,
    /// The body of a request that succeeds.
    #[serde(skip)]
    pub body: Bytes,
    /// Its `Content-Type`, if it has a body.
    #[serde(skip)]
    pub content_type: Option<String>,
    /// Headers the operation requires other than the key (from their examples).
    #[serde(skip)]
    pub headers: Vec<(String, String)>,
}

impl Operation {
    /// `target` (with the run's options) aimed at this operation; `None` when it is skipped.
    pub fn target(&self, base: &Target) -> Option<Target> {
        if self.skipped.is_some() {
            return None;
        }
        let url = Url::parse(self.url.as_deref()?).ok()?;
        let mut t = base.clone();
        // Relative oracle and kind URLs follow the operation's server.
        for u in [
            &mut t.count_url,
            &mut t.session_url,
            &mut t.token_url,
            &mut t.status_url,
        ]
        .into_iter()
        .flatten()
        {
            if u.host_str() == Some(OPTION_BASE_HOST) {
                if let Ok(joined) = url.join(&relative(u)) {
                    *u = joined;
                }
            }
        }
        t.url = url;
        t.method = self.method.parse().unwrap_or(Method::POST);
        t.body = self.body.clone();
        t.content_type = self
            .content_type
            .as_deref()
            .and_then(|c| HeaderValue::from_str(c).ok());
        for (n, v) in &self.headers {
            if let (Ok(n), Ok(v)) = (
                HeaderName::from_bytes(n.as_bytes()),
                HeaderValue::from_str(v),
            ) {
                if !t.headers.iter().any(|(m, _)| *m == n) {
                    t.headers.push((n, v));
                }
            }
        }
        t.key_kind = self.key_kind;
        if self.key_kind != KeyKind::Opaque {
            t.key_style = crate::suite::KeyStyle::Bare;
        }
        Some(t)
    }
}

/// The host of the placeholder base that options given as paths (`--count-url /count`) are
/// joined to before an operation's URL is known.
pub const OPTION_BASE_HOST: &str = "operation.invalid";

/// The placeholder base for options given as paths.
pub fn option_base() -> Url {
    Url::parse(&format!("http://{OPTION_BASE_HOST}/")).expect("a valid URL")
}

/// The path, query and fragment of `u`, to join to another base.
fn relative(u: &Url) -> String {
    let mut s = u.path().to_owned();
    if let Some(q) = u.query() {
        s.push('?');
        s.push_str(q);
    }
    s
}

/// What selects and completes the operations.
#[derive(Clone, Copy, Debug)]
pub struct Selection<'a> {
    /// The key header's name.
    pub key_header: &'a str,
    /// `--operation`: the operations to run, whether or not they declare the key header.
    pub operations: &'a [String],
    /// `--base-url`: the server, instead of the document's.
    pub base_url: Option<&'a Url>,
    /// `--body-for`: bodies by operation.
    pub bodies: &'a BTreeMap<String, Bytes>,
}

impl Document {
    /// Reads `text`, JSON or YAML.
    pub fn parse(text: &str) -> Result<Document, String> {
        let root: Value = if text.trim_start().starts_with('{') {
            serde_json::from_str(text).map_err(|e| format!("not valid JSON: {e}"))?
        } else {
            yaml_serde::from_str(text).map_err(|e| format!("not valid YAML: {e}"))?
        };
        let version = root
            .get("openapi")
            .and_then(Value::as_str)
            .ok_or("not an OpenAPI document: it has no \"openapi\" version")?;
        if !(version.starts_with("3.0") || version.starts_with("3.1")) {
            return Err(format!(
                "OpenAPI {version} is not supported (3.0 and 3.1 are)"
            ));
        }
        if !root.get("paths").is_some_and(Value::is_object) {
            return Err("the document has no paths".into());
        }
        Ok(Document { root })
    }

    /// Reads the file at `path`.
    pub fn read(path: &std::path::Path) -> Result<Document, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        Document::parse(&text).map_err(|e| format!("{}: {e}", path.display()))
    }

    /// The operations that take the key header (or those `select` names), by path and then
    /// in the specification's order of methods, each with its request or the reason it has
    /// none.
    pub fn operations(&self, select: &Selection<'_>) -> Result<Vec<Operation>, String> {
        let mut out = Vec::new();
        let mut named: Vec<&String> = select.operations.iter().collect();
        let paths = self.root["paths"].as_object().into_iter().flatten();
        for (path, item) in paths {
            let item = self.resolve(item);
            for method in METHODS {
                let Some(op) = item.get(method).map(|o| self.resolve(o)) else {
                    continue;
                };
                let id = op.get("operationId").and_then(Value::as_str).map_or_else(
                    || format!("{} {path}", method.to_uppercase()),
                    str::to_owned,
                );
                let by_name =
                    |n: &&String| **n == id || n.eq_ignore_ascii_case(&format!("{method} {path}"));
                let wanted = named.iter().any(by_name);
                named.retain(|n| !by_name(n));
                let params = self.parameters(item, op);
                let key = params.iter().find(|p| {
                    p.get("in").and_then(Value::as_str) == Some("header")
                        && p.get("name")
                            .and_then(Value::as_str)
                            .is_some_and(|n| n.eq_ignore_ascii_case(select.key_header))
                });
                let take = if select.operations.is_empty() {
                    key.is_some()
                } else {
                    wanted
                };
                if take {
                    out.push(self.operation(select, path, method, id, item, op, &params, key));
                }
            }
        }
        if let Some(missing) = named.first() {
            return Err(format!(
                "--operation {missing:?}: no operation of the document has that operationId or METHOD /path"
            ));
        }
        if out.is_empty() {
            return Err(format!(
                "no operation of the document declares a {} header parameter: name the operations to test with --operation",
                select.key_header
            ));
        }
        Ok(out)
    }

    #[allow(clippy::too_many_arguments)]
    fn operation(
        &self,
        select: &Selection<'_>,
        path: &str,
        method: &str,
        id: String,
        item: &Value,
        op: &Value,
        params: &[&Value],
        key: Option<&&Value>,
    ) -> Operation {
        let mut o = Operation {
            method: method.to_uppercase(),
            path: path.to_owned(),
            url: None,
            key_kind: KeyKind::Opaque,
            skipped: None,
            body: Bytes::new(),
            content_type: None,
            headers: Vec::new(),
            id,
        };
        if let Err(why) = self.complete(&mut o, select, item, op, params, key) {
            o.skipped = Some(why);
        }
        o
    }

    /// Fills in `o`'s request, or says why it cannot be built.
    fn complete(
        &self,
        o: &mut Operation,
        select: &Selection<'_>,
        item: &Value,
        op: &Value,
        params: &[&Value],
        key: Option<&&Value>,
    ) -> Result<(), String> {
        let kind = key
            .and_then(|k| k.get(KIND_EXTENSION))
            .or_else(|| op.get(KIND_EXTENSION))
            .map(|v| v.as_str().unwrap_or_default().to_owned());
        o.key_kind = match kind.as_deref() {
            None | Some("opaque") => KeyKind::Opaque,
            Some("time") => KeyKind::Time,
            Some("counter") => KeyKind::Counter,
            Some("token") => KeyKind::Token,
            Some(other) => {
                return Err(format!(
                    "{KIND_EXTENSION}: {other:?} is not opaque, time, counter or token"
                ))
            }
        };
        // The path, with its parameters' examples.
        let mut path = o.path.clone();
        let mut query = Vec::new();
        for p in params {
            let name = p.get("name").and_then(Value::as_str).unwrap_or_default();
            let place = p.get("in").and_then(Value::as_str).unwrap_or_default();
            let required = p.get("required").and_then(Value::as_bool).unwrap_or(false);
            match place {
                "path" => {
                    let v = self.example_of(p).ok_or_else(|| {
                        format!("its path parameter {name:?} has no example to send")
                    })?;
                    path = path.replace(&format!("{{{name}}}"), &text(&v));
                }
                "query" if required => {
                    let v = self.example_of(p).ok_or_else(|| {
                        format!("its required query parameter {name:?} has no example to send")
                    })?;
                    query.push((name.to_owned(), text(&v)));
                }
                "header" if required && !name.eq_ignore_ascii_case(select.key_header) => {
                    if let Some(v) = self.example_of(p) {
                        o.headers.push((name.to_owned(), text(&v)));
                    }
                }
                _ => {}
            }
        }
        // The body.
        if let Some(body) = select.bodies.get(&o.id) {
            o.body = body.clone();
            o.content_type = Some(self.media_type(op).unwrap_or("application/json").to_owned());
        } else if let Some(request_body) = op.get("requestBody").map(|b| self.resolve(b)) {
            let (media, example) = self.body_example(request_body).ok_or_else(|| {
                format!(
                    "its request body has no example: give one with --body-for {}=@FILE",
                    o.id
                )
            })?;
            o.body = match &example {
                Value::String(s) if !media.contains("json") => Bytes::from(s.clone()),
                v => Bytes::from(v.to_string()),
            };
            o.content_type = Some(media.to_owned());
        }
        // The server.
        let base = match select.base_url {
            Some(b) => b.to_string(),
            None => {
                let server = [op, item, &self.root]
                    .into_iter()
                    .find_map(|v| v.get("servers").and_then(|s| s.get(0)))
                    .ok_or("the document names no server: give --base-url")?;
                server_url(server)?
            }
        };
        let mut url =
            Url::parse(&format!("{}{path}", base.trim_end_matches('/'))).map_err(|e| {
                if base.starts_with('/') || !base.contains("://") {
                    format!("the document's server {base:?} is relative: give --base-url")
                } else {
                    format!("{base}{path}: {e}")
                }
            })?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(format!(
                "{url}: only http:// and https:// servers are supported"
            ));
        }
        if !query.is_empty() {
            url.query_pairs_mut().extend_pairs(query);
        }
        o.url = Some(url.to_string());
        Ok(())
    }

    /// `v`, or what its `$ref` into this document points at.
    fn resolve<'a>(&'a self, v: &'a Value) -> &'a Value {
        let mut v = v;
        for _ in 0..16 {
            let Some(r) = v.get("$ref").and_then(Value::as_str) else {
                return v;
            };
            let Some(target) = r.strip_prefix('#').and_then(|p| self.root.pointer(p)) else {
                return v;
            };
            v = target;
        }
        v
    }

    /// The parameters of `op`, with those of its path item it does not override.
    fn parameters<'a>(&'a self, item: &'a Value, op: &'a Value) -> Vec<&'a Value> {
        let list = |v: &'a Value| -> Vec<&'a Value> {
            v.get("parameters")
                .and_then(Value::as_array)
                .map(|ps| ps.iter().map(|p| self.resolve(p)).collect())
                .unwrap_or_default()
        };
        let own = list(op);
        let id = |p: &Value| {
            (
                p.get("name")
                    .and_then(Value::as_str)
                    .map(str::to_ascii_lowercase),
                p.get("in").and_then(Value::as_str).map(str::to_owned),
            )
        };
        let mut all: Vec<&Value> = list(item)
            .into_iter()
            .filter(|p| !own.iter().any(|o| id(o) == id(p)))
            .collect();
        all.extend(own);
        all
    }

    /// A parameter's (or a schema's) example: `example`, the first of `examples`, then its
    /// schema's `example`, first `examples`, `default` or first `enum` value.
    fn example_of(&self, v: &Value) -> Option<Value> {
        if let Some(e) = v.get("example") {
            return Some(e.clone());
        }
        match v.get("examples") {
            Some(Value::Object(map)) => {
                if let Some(first) = map.values().next() {
                    if let Some(value) = self.resolve(first).get("value") {
                        return Some(value.clone());
                    }
                }
            }
            Some(Value::Array(list)) => {
                if let Some(first) = list.first() {
                    return Some(first.clone());
                }
            }
            _ => {}
        }
        let schema = self.resolve(v.get("schema")?);
        schema
            .get("example")
            .or_else(|| schema.get("examples").and_then(|e| e.get(0)))
            .or_else(|| schema.get("default"))
            .or_else(|| schema.get("enum").and_then(|e| e.get(0)))
            .cloned()
    }

    /// The media type of `op`'s request body: `application/json` when it has one, else the
    /// first.
    fn media_type<'a>(&'a self, op: &'a Value) -> Option<&'a str> {
        let content = self
            .resolve(op.get("requestBody")?)
            .get("content")?
            .as_object()?;
        if content.contains_key("application/json") {
            return Some("application/json");
        }
        content.keys().next().map(String::as_str)
    }

    /// The media type and example of a request body.
    fn body_example<'a>(&'a self, body: &'a Value) -> Option<(&'a str, Value)> {
        let content = body.get("content")?.as_object()?;
        let json = content
            .iter()
            .find(|(m, _)| m.as_str() == "application/json" || m.ends_with("+json"));
        let candidates = json.into_iter().chain(content.iter());
        for (media, m) in candidates {
            if let Some(e) = self.example_of(m) {
                return Some((media.as_str(), e));
            }
        }
        None
    }
}

/// A parameter's value as it is sent: strings as they are, anything else as JSON.
fn text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// A server object's URL with its variables at their defaults.
fn server_url(server: &Value) -> Result<String, String> {
    let mut url = server
        .get("url")
        .and_then(Value::as_str)
        .ok_or("a server without a url")?
        .to_owned();
    if let Some(vars) = server.get("variables").and_then(Value::as_object) {
        for (name, var) in vars {
            if let Some(d) = var.get("default") {
                url = url.replace(&format!("{{{name}}}"), &text(d));
            }
        }
    }
    if url.contains('{') {
        return Err(format!(
            "the document's server {url:?} has a variable without a default: give --base-url"
        ));
    }
    Ok(url)
}

#[cfg(test)]
mod tests {
    use super::*;

    const DOC: &str = r##"
openapi: 3.1.0
info: { title: t, version: "1" }
servers: [{ url: "https://{host}/v1", variables: { host: { default: api.example } } }]
components:
  parameters:
    Key: { name: Idempotency-Key, in: header, required: true, schema: { type: string } }
  examples:
    Order: { value: { amount: 1 } }
paths:
  /orders:
    post:
      operationId: createOrder
      parameters: [{ $ref: "#/components/parameters/Key" }]
      requestBody:
        content:
          application/json:
            examples: { one: { $ref: "#/components/examples/Order" } }
    get:
      operationId: listOrders
  /orders/{id}/refunds:
    parameters: [{ name: id, in: path, required: true, schema: { type: string } }]
    post:
      parameters: [{ $ref: "#/components/parameters/Key" }]
  /payments:
    post:
      operationId: pay
      parameters:
        - { name: idempotency-key, in: header, x-idempotency-key-kind: time }
        - { name: currency, in: query, required: true, example: eur }
      requestBody: { content: { application/json: { schema: { example: { amount: 2 } } } } }
"##;

    fn ops(select: &Selection<'_>) -> Result<Vec<Operation>, String> {
        Document::parse(DOC)?.operations(select)
    }

    #[test]
    fn operations_that_declare_the_key_header_are_built_or_skipped_with_a_reason() {
        let bodies = BTreeMap::new();
        let select = Selection {
            key_header: "Idempotency-Key",
            operations: &[],
            base_url: None,
            bodies: &bodies,
        };
        let ops = ops(&select).expect("operations");
        let ids: Vec<&str> = ops.iter().map(|o| o.id.as_str()).collect();
        assert_eq!(ids, ["createOrder", "POST /orders/{id}/refunds", "pay"]);
        assert_eq!(ops[0].url.as_deref(), Some("https://api.example/v1/orders"));
        assert_eq!(&ops[0].body[..], br#"{"amount":1}"#);
        assert!(ops[1]
            .skipped
            .as_deref()
            .is_some_and(|s| s.contains("\"id\"")));
        assert_eq!(ops[2].key_kind, KeyKind::Time);
        assert_eq!(
            ops[2].url.as_deref(),
            Some("https://api.example/v1/payments?currency=eur")
        );
    }

    #[test]
    fn named_operations_bodies_and_base_urls_come_from_the_options() {
        let mut bodies = BTreeMap::new();
        bodies.insert("listOrders".to_owned(), Bytes::from_static(b"{}"));
        let named = vec![
            "listOrders".to_owned(),
            "post /orders/{id}/refunds".to_owned(),
        ];
        let base = Url::parse("http://127.0.0.1:9/").expect("url");
        let select = Selection {
            key_header: "Idempotency-Key",
            operations: &named,
            base_url: Some(&base),
            bodies: &bodies,
        };
        let ops = ops(&select).expect("operations");
        assert_eq!(ops.len(), 2);
        assert_eq!(ops[0].url.as_deref(), Some("http://127.0.0.1:9/orders"));
        assert_eq!(ops[0].method, "GET");
        let unknown = vec!["nope".to_owned()];
        let select = Selection {
            operations: &unknown,
            ..select
        };
        assert!(ops_err(&select).contains("nope"));
    }

    fn ops_err(select: &Selection<'_>) -> String {
        ops(select).expect_err("an error")
    }

    #[test]
    fn documents_that_are_not_openapi_3_are_refused() {
        assert!(Document::parse("{}").is_err());
        assert!(Document::parse("swagger: '2.0'\npaths: {}").is_err());
        assert!(Document::parse("openapi: 2.0.0\npaths: {}").is_err());
        assert!(Document::parse("openapi: [").is_err());
        assert!(Document::parse(r#"{"openapi":"3.0.3","paths":{}}"#).is_ok());
    }
}
