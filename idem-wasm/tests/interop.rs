//! Native tests of the conversions: options, keys, errors and their codes, writes, replies,
//! and the Durable Object wire format.

use idem_core::{
    Attempt, Claim, CompleteError, Config, Decision, Engine, Event, Fingerprint, FingerprintError,
    FingerprintSpec, JsonMode, KeyError, Outcome, Problem, RecordKey, RejectReason, RequestParts,
    StoredResponse, UnixMillis, UnknownOutcomePolicy,
};
use idem_wasm::interop::*;
use std::sync::Arc;
use std::time::Duration;

fn engine() -> Engine {
    Engine::new(Config::default()).unwrap()
}

fn attempt_parts() -> (RecordKey, Fingerprint) {
    let fp = FingerprintSpec::default()
        .fingerprint(&RequestParts {
            method: "POST",
            target: "/orders",
            content_type: Some("application/json"),
            headers: &[],
            body: br#"{"amount":1,"note":"a"}"#,
        })
        .unwrap();
    (RecordKey::new(scope("token", "POST", "/orders"), "k1"), fp)
}

/// Option numbers in the order of `opt`, `NaN` for the default.
fn numbers(set: &[(usize, f64)]) -> Vec<f64> {
    let mut n = vec![f64::NAN; 7];
    for (at, v) in set {
        n[*at] = *v;
    }
    n
}

#[test]
fn options_default_to_the_core_defaults() {
    for given in [vec![], numbers(&[])] {
        let o = options(&given, "", "").unwrap();
        assert_eq!(o.config, Config::default());
        assert_eq!(o.key_kind, KeyKind::Opaque);
        assert_eq!(o.fingerprint.max_body, FingerprintSpec::default().max_body);
        assert!(o.fingerprint.headers.is_empty() && o.fingerprint.exclude.is_empty());
    }
}

#[test]
fn options_convert_milliseconds_policies_and_fingerprint_settings() {
    let o = options(
        &numbers(&[
            (opt::RESPONSE_TTL, 1000.0),
            (opt::KEY_TTL, 5000.0),
            (opt::LEASE, 250.0),
            (opt::UNKNOWN_OUTCOME, 2.0),
            (opt::KEY_KIND, 4.0),
            (opt::JSON, 2.0),
            (opt::MAX_BODY, 10.0),
        ]),
        "13:x-api-version",
        "3:/ts6:/a/*/b",
    )
    .unwrap();
    assert_eq!(o.config.response_ttl, Duration::from_secs(1));
    assert_eq!(o.config.key_ttl, Duration::from_secs(5));
    assert_eq!(o.config.lease, Duration::from_millis(250));
    assert_eq!(o.config.unknown_outcome, UnknownOutcomePolicy::Hold);
    assert_eq!(o.key_kind, KeyKind::UuidV7);
    assert_eq!(o.fingerprint.headers, ["x-api-version"]);
    assert_eq!(o.fingerprint.exclude, ["/ts", "/a/*/b"]);
    assert_eq!(o.fingerprint.json, JsonMode::Never);
    assert_eq!(o.fingerprint.max_body, 10);
    let store = options(&numbers(&[(opt::UNKNOWN_OUTCOME, 1.0)]), "", "").unwrap();
    assert_eq!(store.config.unknown_outcome, UnknownOutcomePolicy::Store);
    for (n, kind) in [
        (0.0, KeyKind::Opaque),
        (1.0, KeyKind::OpaqueStrict),
        (2.0, KeyKind::Uuid),
        (3.0, KeyKind::UuidV4),
    ] {
        let o = options(&numbers(&[(opt::KEY_KIND, n)]), "", "").unwrap();
        assert_eq!(o.key_kind, kind);
    }
}

#[test]
fn bad_options_are_range_errors_citing_idem_js_1() {
    let bad = [
        (opt::LEASE, 0.0),
        (opt::LEASE, -5.0),
        (opt::LEASE, 1.5),
        (opt::RESPONSE_TTL, 1e300),
        (opt::KEY_TTL, f64::INFINITY),
        (opt::UNKNOWN_OUTCOME, 3.0),
        (opt::UNKNOWN_OUTCOME, 0.5),
        (opt::KEY_KIND, 5.0),
        (opt::KEY_KIND, -1.0),
        (opt::JSON, 3.0),
        (opt::MAX_BODY, -1.0),
        (opt::MAX_BODY, 0.5),
    ];
    for (at, value) in bad {
        let e = options(&numbers(&[(at, value)]), "", "").unwrap_err();
        assert_eq!(e.kind, ErrorKind::Range, "{at}: {value}");
        assert_eq!(e.code, "IDEM-JS-1", "{at}: {value}");
        assert!(e.problem.is_none());
    }
    // A list text that is not one is the wire's error.
    assert_eq!(options(&[], "9:short", "").unwrap_err().code, "IDEM-JS-2");
}

#[test]
fn a_key_ttl_shorter_than_the_response_ttl_cites_idem_ttl_2() {
    let o = options(
        &numbers(&[(opt::RESPONSE_TTL, 5000.0), (opt::KEY_TTL, 1000.0)]),
        "",
        "",
    )
    .unwrap();
    let e = Engine::new(o.config).unwrap_err();
    let parts = ErrorParts::config(&e);
    assert_eq!(parts.code, "IDEM-TTL-2");
    assert_eq!(parts.kind, ErrorKind::Range);
}

#[test]
fn key_kinds_parse_as_configured() {
    assert_eq!(KeyKind::Opaque.parse(Some("abc")).unwrap(), "abc");
    assert_eq!(KeyKind::Opaque.parse(Some("\"abc\"")).unwrap(), "abc");
    assert_eq!(KeyKind::OpaqueStrict.parse(Some("\"abc\"")).unwrap(), "abc");
    assert_eq!(
        KeyKind::OpaqueStrict.parse(Some("abc")),
        Err(KeyError::NotString)
    );
    let v4 = "9B2F1C3E-4A5D-4E6F-8A7B-0C1D2E3F4A5B";
    assert_eq!(
        KeyKind::UuidV4.parse(Some(v4)).unwrap(),
        v4.to_ascii_lowercase()
    );
    assert!(matches!(
        KeyKind::UuidV7.parse(Some(v4)),
        Err(KeyError::WrongUuidVersion { found: 4, .. })
    ));
    assert_eq!(KeyKind::Uuid.parse(Some("nope")), Err(KeyError::NotUuid));
    assert_eq!(KeyKind::Opaque.parse(None), Err(KeyError::Empty));
}

#[test]
fn key_errors_carry_the_problem_and_the_requirement_id() {
    let missing = ErrorParts::key(&KeyError::Empty);
    assert_eq!(missing.code, "IDEM-KEY-3");
    assert_eq!(missing.problem, Some(Problem::MISSING_KEY));
    let list = ErrorParts::key(&KeyError::List);
    assert_eq!(list.code, "IDEM-KEY-5");
    assert_eq!(list.problem, Some(Problem::MALFORMED_KEY));
    let uuid = ErrorParts::key(&KeyError::NotUuid);
    assert_eq!(uuid.code, "IDEM-KEY-4");
    let long = ErrorParts::key(&KeyError::TooLong { len: 300 });
    assert_eq!(long.code, "IDEM-KEY-1");
    assert_eq!(long.kind, ErrorKind::Range);
    assert!(long.message.contains("300"));
}

#[test]
fn body_errors_map_to_413_and_400() {
    let big = ErrorParts::fingerprint(&FingerprintError::BodyTooLarge { len: 9, max: 8 });
    assert_eq!(big.code, "IDEM-LIMIT-1");
    assert_eq!(big.problem.unwrap().status, 413);
    let json = ErrorParts::fingerprint(&FingerprintError::InvalidJson { line: 1, column: 2 });
    assert_eq!(json.code, "IDEM-FP-6");
    assert_eq!(json.problem.unwrap().status, 400);
}

#[test]
fn record_and_completion_errors_cite_their_requirements() {
    let e = idem_core::decode_record(b"xx").unwrap_err();
    assert_eq!(ErrorParts::record(&e).code, "IDEM-REC-1");
    assert_eq!(
        ErrorParts::complete(&CompleteError::LeaseExpired).code,
        "IDEM-LEASE-3"
    );
}

#[test]
fn milliseconds_clamp_and_halves_join() {
    assert_eq!(millis(1500.9), UnixMillis(1500));
    assert_eq!(millis(-3.0), UnixMillis::ZERO);
    assert_eq!(millis(f64::NAN), UnixMillis::ZERO);
    assert_eq!(u64_from_halves(1, 2), (1 << 32) | 2);
    assert_eq!(u64_from_halves(u32::MAX, u32::MAX), u64::MAX);
}

#[test]
fn scopes_hide_the_principal_and_separate_principals() {
    let a = scope("Bearer secret-token", "POST", "/orders");
    assert!(!a.as_str().contains("secret"));
    assert_ne!(a, scope("Bearer other", "POST", "/orders"));
    assert_ne!(a, scope("Bearer secret-token", "PATCH", "/orders"));
    assert_ne!(a, scope("Bearer secret-token", "POST", "/refunds"));
    assert_eq!(a, scope("Bearer secret-token", "POST", "/orders"));
}

#[test]
fn list_texts_count_utf16_units_and_refuse_damage() {
    // IDEM-JS-2: the layout JavaScript writes with `listText` (lengths are string lengths).
    assert_eq!(list("").unwrap(), Vec::<&str>::new());
    assert_eq!(list("2:ab0:1:c").unwrap(), ["ab", "", "c"]);
    // "é" is one UTF-16 unit and two UTF-8 bytes; "😀" is two units and four bytes; a
    // colon inside an item is just a character.
    assert_eq!(list("2:é:2:😀3:a:b").unwrap(), ["é:", "😀", "a:b"]);
    for bad in ["3:ab", "x:ab", "2ab", ":ab", "1:😀", "-1:a"] {
        assert_eq!(list(bad).unwrap_err().code, "IDEM-JS-2", "{bad}");
    }
    let mut text = String::new();
    for item in ["content-type", "text/plain; charset=ü", "😀"] {
        push_item(&mut text, item);
    }
    assert_eq!(
        list(&text).unwrap(),
        ["content-type", "text/plain; charset=ü", "😀"]
    );
}

#[test]
fn header_lists_pair_and_flatten() {
    let p = pairs("1:a1:11:b1:21:c").unwrap();
    assert_eq!(p, vec![("a".into(), "1".into()), ("b".into(), "2".into())]);
    assert_eq!(flatten(&p), "1:a1:11:b1:2");
    assert!(pairs("2:a").is_err());
}

#[test]
fn replies_encode_status_head_and_body() {
    let reply = Reply {
        status: 201,
        headers: vec![("content-type".into(), "text/plain; ü".into())],
        body: b"made".to_vec(),
    };
    let bytes = reply.encode();
    assert_eq!(&bytes[..4], &201u32.to_le_bytes());
    let head_len = u32::from_le_bytes(bytes[4..8].try_into().unwrap()) as usize;
    let head = std::str::from_utf8(&bytes[8..8 + head_len]).unwrap();
    assert_eq!(pairs(head).unwrap(), reply.headers);
    assert_eq!(&bytes[8 + head_len..], b"made");
}

#[test]
fn storage_keys_parse_back_exactly() {
    let key = RecordKey::new(scope("token", "POST", "/ördérs"), "k:1");
    assert_eq!(parse_storage_key(&key.storage_key()), Some(key));
    let custom = RecordKey::new(idem_core::Scope::custom("t"), "");
    assert_eq!(parse_storage_key(&custom.storage_key()), Some(custom));
    for bad in ["", "x", "5:abc", "02:abc", "1:é", "-1:a", "abc:def"] {
        assert_eq!(parse_storage_key(bad), None, "{bad}");
    }
}

#[test]
fn events_cross_as_indices_into_the_cores_list() {
    // IDEM-EVT-1
    let names: Vec<&str> = Event::ALL.iter().map(Event::name).collect();
    assert_eq!(event_names(), names.join(","));
    for (i, e) in Event::ALL.iter().enumerate() {
        assert_eq!(event_index(*e) as usize, i);
        assert_eq!(security_mask() & (1 << i) != 0, e.is_security_relevant());
    }
    assert_eq!(event_index(Event::TookOver { fence: 9 }), 1);
    let code = code(Kind::Execute, true, Event::TookOver { fence: 2 });
    assert_eq!((code & 7, code & 8, code >> 4), (0, 8, 1));
}

#[test]
fn writes_carry_versions_as_decimal_strings_and_the_deadline() {
    let (key, fp) = attempt_parts();
    let e = engine();
    let d = e.decide(
        UnixMillis(1000),
        &Attempt {
            key: &key,
            fingerprint: &fp,
            nonce: u64::MAX - 1,
        },
        None,
    );
    let Decision::Execute { write, lease, .. } = d else {
        panic!("expected execute")
    };
    let w = StoreWrite::from_core(&write);
    assert_eq!(w.expect, None);
    assert_eq!(w.version, (u64::MAX - 1).to_string());
    let bytes = w.value.clone().unwrap();
    let record = idem_core::decode_record(&bytes).unwrap();
    assert_eq!(w.deadline, to_ms(record.next_deadline()));
    // The write bytes JavaScript reads (`readWrite`).
    let enc = w.encode(Some(Event::Executed));
    assert_eq!(enc[0], 2, "put, no expected version");
    assert_eq!(enc[1], event_index(Event::Executed));
    assert_eq!((enc[2], enc[3] as usize), (0, w.version.len()));
    assert_eq!(
        f64::from_le_bytes(enc[4..12].try_into().unwrap()),
        w.deadline
    );
    assert_eq!(&enc[12..12 + w.version.len()], w.version.as_bytes());
    assert_eq!(&enc[12 + w.version.len()..], &bytes[..]);

    let done = e
        .complete(
            UnixMillis(2000),
            &lease,
            Outcome::classify(StoredResponse {
                status: 201,
                headers: vec![],
                body: b"ok".to_vec(),
            }),
        )
        .unwrap();
    let w2 = StoreWrite::from_core(&done);
    assert_eq!(w2.expect.as_deref(), Some(w.version.as_str()));
    assert_eq!(w2.version, u64::MAX.to_string());
    assert_eq!(completion_event(&done), Event::Completed);

    let released = e
        .complete(UnixMillis(2000), &lease, Outcome::Retryable)
        .unwrap();
    let w3 = StoreWrite::from_core(&released);
    let enc = w3.encode(None);
    assert_eq!(enc[0], 1, "delete, with an expected version");
    assert_eq!(enc[1], NO_EVENT);
    assert_eq!(&enc[12..12 + enc[2] as usize], w.version.as_bytes());
    assert_eq!(enc.len(), 12 + enc[2] as usize);
    assert_eq!((w3.value, w3.deadline), (None, 0.0));
    assert_eq!(completion_event(&released), Event::Released);
    let unknown = e
        .complete(UnixMillis(2000), &lease, Outcome::Unknown(None))
        .unwrap();
    assert_eq!(completion_event(&unknown), Event::OutcomeUnknown);
}

#[test]
fn replies_render_replays_and_problems() {
    let replay = decision_reply(&Decision::Replay(Arc::new(StoredResponse {
        status: 201,
        headers: vec![("content-type".into(), "text/plain".into())],
        body: b"made".to_vec(),
    })))
    .unwrap();
    assert_eq!(replay.status, 201);
    assert_eq!(replay.body, b"made");
    assert!(replay
        .headers
        .contains(&("idempotent-replayed".into(), "true".into())));

    let busy = decision_reply(&Decision::InProgress {
        retry_after_secs: 7,
    })
    .unwrap();
    assert_eq!(busy.status, 409);
    assert!(busy.headers.contains(&("retry-after".into(), "7".into())));
    let body: serde_json::Value = serde_json::from_slice(&busy.body).unwrap();
    assert_eq!(body["type"], "urn:idem:problem:in-progress");
    assert_eq!(body["requirement"], "IDEM-CONC-1");

    let mismatch = decision_reply(&Decision::Mismatch {
        differing: vec!["amount".into()],
    })
    .unwrap();
    assert_eq!(mismatch.status, 422);
    assert!(String::from_utf8(mismatch.body).unwrap().contains("amount"));

    let gone = decision_reply(&Decision::Rejected(RejectReason::KeyExpired)).unwrap();
    assert_eq!(gone.status, 410);
    let full = store_reply(true, "full");
    assert_eq!(full.status, 503);
    assert!(String::from_utf8(full.body).unwrap().contains("store-full"));
    let down = store_reply(false, "down");
    assert!(String::from_utf8(down.body)
        .unwrap()
        .contains("store-unavailable"));
}

#[test]
fn attempts_and_claims_round_trip_through_the_wire_format() {
    let (key, fp) = attempt_parts();
    let bytes = encode_attempt(&key, &fp);
    assert_eq!(decode_attempt(&bytes).unwrap(), (key.clone(), fp.clone()));

    let d = engine().decide(
        UnixMillis(10),
        &Attempt {
            key: &key,
            fingerprint: &fp,
            nonce: 42,
        },
        None,
    );
    let Decision::Execute {
        lease, recovered, ..
    } = d
    else {
        panic!("expected execute")
    };
    let claim = Claim::Execute { lease, recovered };
    assert_eq!(decode_claim(&encode_claim(&claim)).unwrap(), claim);
    for done in [
        Decision::InProgress {
            retry_after_secs: 3,
        },
        Decision::Mismatch {
            differing: vec!["a".into()],
        },
        Decision::Rejected(RejectReason::KeyExpired),
        Decision::Rejected(RejectReason::OutcomeUnknown),
        Decision::Replay(Arc::new(StoredResponse {
            status: 200,
            headers: vec![],
            body: vec![1, 2, 3],
        })),
    ] {
        let claim = Claim::Done(done);
        assert_eq!(decode_claim(&encode_claim(&claim)).unwrap(), claim);
    }
}

#[test]
fn damaged_wire_bytes_are_refused_with_idem_js_2() {
    let (key, fp) = attempt_parts();
    let bytes = encode_attempt(&key, &fp);
    let claim = encode_claim(&Claim::Done(Decision::InProgress {
        retry_after_secs: 1,
    }));
    let mut trailing = bytes.clone();
    trailing.push(0);
    for bad in [
        &[][..],
        &bytes[..bytes.len() - 1],
        &trailing,
        &claim, // a claim where an attempt is expected
        &[b'A', 0xff, 0xff, 0xff],
    ] {
        let e = decode_attempt(bad).unwrap_err();
        assert_eq!(e.code, "IDEM-JS-2");
        assert_eq!(e.kind, ErrorKind::Range);
    }
    assert_eq!(decode_claim(&bytes).unwrap_err().code, "IDEM-JS-2");
    assert_eq!(decode_claim(&[b'D', 9]).unwrap_err().code, "IDEM-JS-2");
}
