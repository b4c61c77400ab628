//! Request fingerprints.
use idem_core::*;

fn parts<'a>(
    method: &'a str,
    target: &'a str,
    ct: Option<&'a str>,
    headers: &'a [(&'a str, &'a [u8])],
    body: &'a [u8],
) -> RequestParts<'a> {
    RequestParts {
        method,
        target,
        content_type: ct,
        headers,
        body,
    }
}

fn json(spec: &FingerprintSpec, body: &str) -> Fingerprint {
    spec.fingerprint(&parts(
        "POST",
        "/orders",
        Some("application/json"),
        &[],
        body.as_bytes(),
    ))
    .unwrap()
}

#[test]
fn every_component_counts() {
    // IDEM-FP-2
    let spec = FingerprintSpec {
        headers: vec!["X-Api-Version".into()],
        ..Default::default()
    };
    let h1: &[(&str, &[u8])] = &[("x-api-version", b"1")];
    let h2: &[(&str, &[u8])] = &[("X-API-VERSION", b"2")];
    let base = spec
        .fingerprint(&parts("POST", "/a?x=1", None, h1, b"body"))
        .unwrap();
    let variants = [
        parts("PUT", "/a?x=1", None, h1, b"body"),
        parts("POST", "/a?x=2", None, h1, b"body"),
        parts("POST", "/b?x=1", None, h1, b"body"),
        parts("POST", "/a?x=1", None, h2, b"body"),
        parts("POST", "/a?x=1", None, &[], b"body"),
        parts("POST", "/a?x=1", None, h1, b"body!"),
    ];
    for v in variants {
        assert!(!spec.fingerprint(&v).unwrap().matches(&base), "{v:?}");
    }
    // Unselected headers do not count; selected header names are case-insensitive.
    let other: &[(&str, &[u8])] = &[("X-Api-Version", b"1"), ("x-request-id", b"r-9")];
    assert!(spec
        .fingerprint(&parts("POST", "/a?x=1", None, other, b"body"))
        .unwrap()
        .matches(&base));
    // Length prefixes keep component boundaries: moving bytes between parts changes the digest.
    let a = spec
        .fingerprint(&parts("POST", "/ab", None, &[], b"c"))
        .unwrap();
    let b = spec
        .fingerprint(&parts("POST", "/a", None, &[], b"bc"))
        .unwrap();
    assert!(!a.matches(&b));
}

#[test]
fn json_is_canonicalised() {
    // IDEM-FP-3
    let spec = FingerprintSpec::default();
    let a = json(
        &spec,
        r#"{"b":[1,2,{"y":1,"x":2}],"a":"\u00e9\n","c":1.0,"d":1e2}"#,
    );
    let b = json(
        &spec,
        "{ \"a\" : \"é\\n\",\n  \"d\": 100, \"c\": 1, \"b\": [1, 2, {\"x\": 2, \"y\": 1}] }",
    );
    assert!(a.matches(&b));
    assert!(
        !json(&spec, r#"{"b":[2,1]}"#).matches(&json(&spec, r#"{"b":[1,2]}"#)),
        "array order counts"
    );
    assert!(!json(&spec, r#"{"a":1.5}"#).matches(&json(&spec, r#"{"a":1}"#)));
    assert!(!json(&spec, r#"{"a":"1"}"#).matches(&json(&spec, r#"{"a":1}"#)));
    // +json media types and parameters are recognised; other types hash raw bytes.
    let fp = |ct: &str, body: &str| {
        spec.fingerprint(&parts("POST", "/orders", Some(ct), &[], body.as_bytes()))
            .unwrap()
    };
    assert!(fp(
        "application/vnd.api+json; charset=utf-8",
        r#"{"a":1, "b":2}"#
    )
    .matches(&fp("application/json", r#"{"b":2,"a":1}"#)));
    assert!(!fp("text/plain", r#"{"a":1, "b":2}"#).matches(&fp("text/plain", r#"{"b":2,"a":1}"#)));
    // JsonMode::Always and Never override the content type.
    let always = FingerprintSpec {
        json: JsonMode::Always,
        ..Default::default()
    };
    let never = FingerprintSpec {
        json: JsonMode::Never,
        ..Default::default()
    };
    let raw = |s: &FingerprintSpec, body: &str| {
        s.fingerprint(&parts("POST", "/", None, &[], body.as_bytes()))
            .unwrap()
    };
    assert!(raw(&always, r#"{"a":1, "b":2}"#).matches(&raw(&always, r#"{"b":2,"a":1}"#)));
    assert!(!raw(&never, r#"{"a":1, "b":2}"#).matches(&raw(&never, r#"{"b":2,"a":1}"#)));
}

#[test]
fn volatile_fields_are_excluded() {
    // IDEM-FP-5
    let spec = FingerprintSpec {
        exclude: vec![
            "sent_at".into(),
            "/meta/trace".into(),
            "/items/*/ts".into(),
            "/a~1b".into(),
        ],
        ..Default::default()
    };
    let a = json(
        &spec,
        r#"{"amount":5,"sent_at":"10:00","meta":{"trace":"t1","v":1},"items":[{"ts":1,"n":1},{"ts":2,"n":2}],"a/b":1}"#,
    );
    let b = json(
        &spec,
        r#"{"amount":5,"sent_at":"10:05","meta":{"trace":"t2","v":1},"items":[{"ts":9,"n":1},{"ts":8,"n":2}],"a/b":2}"#,
    );
    assert!(a.matches(&b));
    let c = json(
        &spec,
        r#"{"amount":6,"sent_at":"10:00","meta":{"trace":"t1","v":1},"items":[{"ts":1,"n":1},{"ts":2,"n":2}]}"#,
    );
    assert!(!a.matches(&c));
    let d = json(
        &spec,
        r#"{"amount":5,"sent_at":"10:00","meta":{"trace":"t1","v":2},"items":[{"ts":1,"n":1},{"ts":2,"n":2}]}"#,
    );
    assert!(!a.matches(&d), "only the named nested field is excluded");
}

#[test]
fn mismatches_name_the_fields() {
    // IDEM-FP-4
    let spec = FingerprintSpec::default();
    let a = json(&spec, r#"{"amount":5,"to":"bob","memo":"x"}"#);
    let b = json(&spec, r#"{"amount":6,"to":"bob","note":"y"}"#);
    assert_eq!(a.differing_fields(&b), vec!["amount", "memo", "note"]);
    assert!(a.differing_fields(&a).is_empty());
    let raw = spec
        .fingerprint(&parts("POST", "/", None, &[], b"x"))
        .unwrap();
    assert!(raw.fields.is_empty());
}

#[test]
fn bad_bodies() {
    // IDEM-FP-6 IDEM-LIMIT-1
    let spec = FingerprintSpec {
        max_body: 16,
        ..Default::default()
    };
    let err = spec
        .fingerprint(&parts(
            "POST",
            "/",
            Some("application/json"),
            &[],
            b"{\"a\":",
        ))
        .unwrap_err();
    assert_eq!(err, FingerprintError::InvalidJson { line: 1, column: 5 });
    assert_eq!(Problem::for_fingerprint_error(&err).status, 400);
    let err = spec
        .fingerprint(&parts("POST", "/", None, &[], &[0; 17]))
        .unwrap_err();
    assert_eq!(err, FingerprintError::BodyTooLarge { len: 17, max: 16 });
    assert_eq!(Problem::for_fingerprint_error(&err).status, 413);
    // Deep nesting is an error, not a stack overflow.
    let deep = "[".repeat(100_000);
    let spec = FingerprintSpec {
        max_body: 1 << 20,
        ..Default::default()
    };
    assert!(matches!(
        spec.fingerprint(&parts(
            "POST",
            "/",
            Some("application/json"),
            &[],
            deep.as_bytes()
        )),
        Err(FingerprintError::InvalidJson { .. })
    ));
}

mod canonical_forms {
    //! Property: any two serialisations of the same JSON value (member order, whitespace,
    //! escapes, integral floats) have the same fingerprint; changing a leaf changes it.
    use super::*;
    use proptest::prelude::*;
    use serde_json::Value;

    fn value() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::from),
            (-1e6f64..1e6).prop_map(Value::from),
            "[a-z\"\\\\\u{0}-\u{1f}é😀]{0,8}".prop_map(Value::String),
        ];
        leaf.prop_recursive(4, 48, 6, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
                proptest::collection::btree_map("[a-z_]{1,6}", inner, 0..6)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    /// Writes members in reverse order, with whitespace, escaping every non-ASCII character
    /// and writing integers as floats where that is exact.
    fn other_form(v: &Value, out: &mut String) {
        match v {
            Value::Object(m) => {
                out.push_str("{ ");
                for (i, (k, v)) in m.iter().rev().enumerate() {
                    if i > 0 {
                        out.push_str(" ,\n ");
                    }
                    escaped(k, out);
                    out.push_str(" : ");
                    other_form(v, out);
                }
                out.push_str(" }");
            }
            Value::Array(a) => {
                out.push_str("[ ");
                for (i, v) in a.iter().enumerate() {
                    if i > 0 {
                        out.push_str(" , ");
                    }
                    other_form(v, out);
                }
                out.push_str(" ]");
            }
            Value::String(s) => escaped(s, out),
            Value::Number(n) if n.as_i64().is_some_and(|i| i.unsigned_abs() < 1 << 50) => {
                out.push_str(&format!("{}.0", n.as_i64().unwrap()))
            }
            other => out.push_str(&other.to_string()),
        }
    }

    fn escaped(s: &str, out: &mut String) {
        out.push('"');
        for c in s.chars() {
            match c {
                '"' => out.push_str("\\\""),
                '\\' => out.push_str("\\\\"),
                c if c.is_ascii() && !c.is_ascii_control() => out.push(c),
                c => {
                    let mut buf = [0u16; 2];
                    for unit in c.encode_utf16(&mut buf) {
                        out.push_str(&format!("\\u{unit:04X}"));
                    }
                }
            }
        }
        out.push('"');
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 500, ..ProptestConfig::default() })]

        /// IDEM-FP-3
        #[test]
        fn equal_values_have_equal_fingerprints(v in value()) {
            let spec = FingerprintSpec::default();
            let compact = serde_json::to_string(&v).unwrap();
            let mut other = String::new();
            other_form(&v, &mut other);
            let a = json(&spec, &compact);
            let b = json(&spec, &other);
            prop_assert!(a.matches(&b), "{} vs {}", compact, other);
            prop_assert_eq!(&a.fields, &b.fields);
            let changed = json(&spec, &serde_json::to_string(&serde_json::json!({ "wrapped": v })).unwrap());
            prop_assert!(!changed.matches(&a));
        }
    }
}
