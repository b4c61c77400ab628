//! Native tests of the conversions: options, errors and their codes, list texts, writes,
//! replies, and the Durable Object wire format.

use idem_core::{
    Applied, Claimed, CompleteError, Config, Decision, Engine, Event, FingerprintSpec, Hold,
    InFlight, Intake, JsonMode, Lease, Outcome, Policy, RecordKey, RejectReason, RequestParts,
    Scope, Step, StoredResponse, Subject, Ticket, UnixMillis, UnknownOutcomePolicy, Waiters, Write,
};
use idem_wasm::interop::*;
use std::sync::Arc;
use std::time::Duration;

fn ticket() -> Ticket {
    let fingerprint = FingerprintSpec::default()
        .fingerprint(&RequestParts {
            method: "POST",
            target: "/orders",
            content_type: Some("application/json"),
            headers: &[],
            body: br#"{"amount":1,"note":"a"}"#,
        })
        .unwrap();
    Ticket {
        key: RecordKey::new(Scope::new("p", "POST", "/orders"), "k1"),
        fingerprint,
        subject: Subject::Record,
    }
}

/// What a policy does with one request: the refusal's requirement, or the key it claims.
fn identify(p: &Policy, key: &str) -> Result<String, &'static str> {
    let mut req = p.request(
        &Intake {
            principal: None,
            method: "POST",
            route: "/r",
            target: "/r",
            keys: &[key.as_bytes()],
            low_water: None,
            client: None,
            content_type: None,
            headers: &[],
            body: b"",
        },
        1,
    );
    match req.refusal() {
        Some(r) => Err(r.requirement),
        None => {
            let _ = req.poll(UnixMillis(0), &mut idem_core::Waiters::default());
            Ok(req.key().key.clone())
        }
    }
}

#[test]
fn options_default_to_the_core_defaults() {
    let p = policy(&EngineOptions::default()).unwrap();
    assert_eq!(p.engine().config(), &Config::default());
    assert_eq!(p.in_flight(), InFlight::Reject);
    let f = p.fingerprint_spec();
    assert_eq!(f.max_body, FingerprintSpec::default().max_body);
    assert!(f.headers.is_empty() && f.exclude.is_empty() && f.json == JsonMode::Auto);
    assert!(p.protects("POST", false) && p.protects("PATCH", true));
    assert!(!p.protects("GET", true) && !p.protects("PUT", true));
}

#[test]
fn options_convert_milliseconds_policies_and_fingerprint_settings() {
    let p = policy(&EngineOptions {
        response_ttl: Some(1000.0),
        key_ttl: Some(5000.0),
        lease: Some(250.0),
        unknown_outcome: Some("hold".into()),
        key_kind: Some("uuid-v7".into()),
        headers: vec!["X-Api-Version".into()],
        exclude: vec!["/ts".into(), "/a/*/b".into()],
        json: Some("never".into()),
        max_body: Some(10.0),
        in_flight: Some((2000.0, None)),
        methods: Some(vec!["post".into(), "DELETE".into()]),
        keys: Some("optional".into()),
        max_response_bytes: Some(4096.0),
        ..EngineOptions::default()
    })
    .unwrap();
    let c = p.engine().config();
    assert_eq!(c.response_ttl, Duration::from_secs(1));
    assert_eq!(c.key_ttl, Duration::from_secs(5));
    assert_eq!(c.lease, Duration::from_millis(250));
    assert_eq!(c.unknown_outcome, UnknownOutcomePolicy::Hold);
    let f = p.fingerprint_spec();
    assert_eq!(f.headers, ["x-api-version"]);
    assert_eq!(f.exclude, ["/ts", "/a/*/b"]);
    assert_eq!(f.json, JsonMode::Never);
    assert_eq!(f.max_body, 10);
    assert_eq!(
        p.in_flight(),
        InFlight::Wait {
            max: Duration::from_secs(2),
            poll: Duration::from_millis(25)
        }
    );
    assert!(p.protects("POST", true) && p.protects("DELETE", true));
    assert!(
        !p.protects("POST", false),
        "keys are optional: keyless requests pass"
    );
    assert!(
        !p.protects("PATCH", true),
        "the methods replace the default"
    );
    assert_eq!(p.max_response_bytes(), 4096);
    // The key kind parses as configured (IDEM-KEY-2, IDEM-KEY-4).
    let v4 = "9b2f1c3e-4a5d-4e6f-8a7b-0c1d2e3f4a5b";
    assert_eq!(identify(&p, v4), Err("IDEM-KEY-4"));
    let strict = policy(&EngineOptions {
        key_kind: Some("opaque-strict".into()),
        ..EngineOptions::default()
    })
    .unwrap();
    assert_eq!(identify(&strict, "bare"), Err("IDEM-KEY-1"));
    assert_eq!(identify(&strict, "\"quoted\""), Ok("quoted".into()));
    let uuid = policy(&EngineOptions {
        key_kind: Some("uuid".into()),
        ..EngineOptions::default()
    })
    .unwrap();
    assert_eq!(identify(&uuid, &v4.to_uppercase()), Ok(v4.into()));
}

#[test]
fn bad_options_are_range_errors_with_their_requirement() {
    let bad: Vec<(EngineOptions, &str)> = vec![
        (
            EngineOptions {
                lease: Some(0.0),
                ..Default::default()
            },
            "IDEM-JS-1",
        ),
        (
            EngineOptions {
                lease: Some(-5.0),
                ..Default::default()
            },
            "IDEM-JS-1",
        ),
        (
            EngineOptions {
                lease: Some(1.5),
                ..Default::default()
            },
            "IDEM-JS-1",
        ),
        (
            EngineOptions {
                response_ttl: Some(1e300),
                ..Default::default()
            },
            "IDEM-JS-1",
        ),
        (
            EngineOptions {
                key_ttl: Some(f64::INFINITY),
                ..Default::default()
            },
            "IDEM-JS-1",
        ),
        (
            EngineOptions {
                unknown_outcome: Some("retry".into()),
                ..Default::default()
            },
            "IDEM-JS-1",
        ),
        (
            EngineOptions {
                key_kind: Some("ulid".into()),
                ..Default::default()
            },
            "IDEM-JS-1",
        ),
        (
            EngineOptions {
                json: Some("xml".into()),
                ..Default::default()
            },
            "IDEM-JS-1",
        ),
        (
            EngineOptions {
                max_body: Some(-1.0),
                ..Default::default()
            },
            "IDEM-JS-1",
        ),
        (
            EngineOptions {
                in_flight: Some((f64::NAN, None)),
                ..Default::default()
            },
            "IDEM-JS-1",
        ),
        (
            EngineOptions {
                in_flight: Some((100.0, Some(0.0))),
                ..Default::default()
            },
            "IDEM-JS-1",
        ),
        (
            EngineOptions {
                keys: Some("sometimes".into()),
                ..Default::default()
            },
            "IDEM-JS-1",
        ),
        (
            EngineOptions {
                response_ttl: Some(5000.0),
                key_ttl: Some(1000.0),
                ..Default::default()
            },
            "IDEM-TTL-2",
        ),
        (
            EngineOptions {
                key_ttl: Some(86_400_000.0),
                response_ttl: Some(1000.0),
                lease: Some(86_400_001.0),
                ..Default::default()
            },
            "IDEM-LEASE-4",
        ),
    ];
    for (options, code) in bad {
        let e = policy(&options).map(|_| ()).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Range, "{options:?}");
        assert_eq!(e.code, code, "{options:?}");
    }
}

#[test]
fn errors_cite_their_requirements() {
    let e = idem_core::decode_record(b"xx").unwrap_err();
    assert_eq!(ErrorParts::record(&e).code, "IDEM-REC-1");
    assert_eq!(
        ErrorParts::complete(&CompleteError::LeaseExpired).code,
        "IDEM-LEASE-3"
    );
    assert_eq!(
        ErrorParts::complete(&CompleteError::InvalidStatus(9)).code,
        "IDEM-OUT-1"
    );
    let refusal = idem_core::Refusal::key(&idem_core::KeyError::List);
    assert_eq!(ErrorParts::refusal(&refusal).code, "IDEM-KEY-5");
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
    // Every width of UTF-8 character, counted as JavaScript counts `length`.
    for item in [
        "",
        "ascii",
        "é",
        "€\u{e000}\u{ffff}",
        "😀",
        "a😀é€\u{10ffff}z",
    ] {
        let mut text = String::new();
        push_item(&mut text, item);
        assert_eq!(text, format!("{}:{item}", item.encode_utf16().count()));
    }
    let p = pairs("1:a1:11:b1:21:c").unwrap();
    assert_eq!(p, vec![("a".into(), "1".into()), ("b".into(), "2".into())]);
    assert_eq!(flatten(&p), "1:a1:11:b1:2");
}

#[test]
fn replies_encode_status_head_and_body() {
    let reply = idem_core::Reply::replay(Arc::new(StoredResponse {
        status: 201,
        headers: vec![("content-type".into(), "text/plain; ü".into())],
        body: b"made".to_vec(),
    }));
    let bytes = encode_reply(&reply);
    assert_eq!(bytes[0], ReplyFlag::Replayed as u8);
    assert_eq!(&bytes[1..5], &201u32.to_le_bytes());
    let head_len = u32::from_le_bytes(bytes[5..9].try_into().unwrap()) as usize;
    let head = std::str::from_utf8(&bytes[9..9 + head_len]).unwrap();
    assert_eq!(
        pairs(head).unwrap(),
        [
            ("content-type".to_string(), "text/plain; ü".to_string()),
            (idem_core::REPLAYED_HEADER.to_string(), "true".to_string())
        ]
    );
    assert_eq!(&bytes[9 + head_len..], b"made");
    // A refusal is no replay, whatever its headers.
    let refusal = idem_core::Refusal::new(idem_core::Problem::IN_PROGRESS, "busy").reply();
    let bytes = encode_reply(&refusal);
    assert_eq!(bytes[0], 0);
    assert_eq!(&bytes[1..5], &409u32.to_le_bytes());
}

#[test]
fn storage_keys_parse_back_exactly() {
    let key = RecordKey::new(Scope::new("token", "POST", "/ördérs"), "k:1");
    assert_eq!(parse_storage_key(&key.storage_key()), Some(key));
    let custom = RecordKey::new(Scope::custom("t"), "");
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
        assert_eq!(event_index(*e), Some(i as u8));
        assert_eq!(security_mask() & (1 << i) != 0, e.is_security_relevant());
    }
    assert_eq!(event_index(Event::TookOver { fence: 9 }), Some(1));
}

/// The claim of `ticket`'s request on no record at `now`, as its machine makes it: the
/// lease and the write.
fn claim(ticket: &Ticket, nonce: u64, now: UnixMillis) -> (Lease, Write) {
    let mut waiters = Waiters::default();
    let mut req = Policy::new(Engine::default()).resume(ticket.clone(), nonce);
    assert_eq!(req.poll(now, &mut waiters), Step::Claim);
    req.handle_record(now, None, &mut waiters);
    let Step::Apply(write) = req.poll(now, &mut waiters) else {
        panic!("expected a claim")
    };
    req.handle_applied(now, Applied::Applied, &mut waiters);
    let Some(Hold::Record(lease)) = req.hold() else {
        panic!("expected a lease")
    };
    (lease, write)
}

/// The write a machine holding `lease` asks for to record `outcome` at `now`.
fn completion(ticket: &Ticket, lease: &Lease, outcome: Outcome, now: UnixMillis) -> Write {
    let mut waiters = Waiters::default();
    let mut req = Policy::new(Engine::default()).resume(ticket.clone(), 1);
    assert_eq!(req.poll(now, &mut waiters), Step::Claim);
    let hold = Hold::Record(lease.clone());
    req.handle_claimed(
        now,
        Claimed::Execute {
            hold,
            recovered: false,
        },
        &mut waiters,
    );
    assert!(matches!(req.poll(now, &mut waiters), Step::Run(_)));
    req.handle_outcome(outcome);
    let Step::Apply(write) = req.poll(now, &mut waiters) else {
        panic!("expected a completion")
    };
    write
}

#[test]
fn writes_carry_versions_as_decimal_strings_and_the_deadline() {
    let t = ticket();
    let (lease, write) = claim(&t, u64::MAX - 1, UnixMillis(1000));
    let w = StoreWrite::from_core(&write);
    assert_eq!(w.expect, None);
    assert_eq!(w.version, (u64::MAX - 1).to_string());
    let record = idem_core::decode_record(w.value.as_deref().unwrap()).unwrap();
    assert_eq!(w.deadline, to_ms(record.next_deadline()));
    let done = completion(
        &t,
        &lease,
        Outcome::classify(StoredResponse {
            status: 201,
            headers: vec![],
            body: b"ok".to_vec(),
        }),
        UnixMillis(2000),
    );
    let w2 = StoreWrite::from_core(&done);
    assert_eq!(w2.expect.as_deref(), Some(w.version.as_str()));
    assert_eq!(w2.version, u64::MAX.to_string());
    let released = StoreWrite::from_core(&completion(
        &t,
        &lease,
        Outcome::Retryable,
        UnixMillis(2000),
    ));
    assert_eq!((released.value, released.deadline), (None, 0.0));
    // In flight: the claim, and an attempt that threw left for a retry to take over; not a
    // completion or a release (IDEM-STORE-8).
    let threw = StoreWrite::from_core(&completion(
        &t,
        &lease,
        Outcome::Unknown(None),
        UnixMillis(2000),
    ));
    assert_eq!(
        (
            w.in_flight,
            threw.in_flight,
            w2.in_flight,
            released.in_flight
        ),
        (true, true, false, false)
    );
}

#[test]
fn tickets_and_claims_round_trip_through_the_wire_format() {
    let t = ticket();
    assert_eq!(decode_ticket(&encode_ticket(&t)).unwrap(), t);
    let (lease, write) = claim(&t, 42, UnixMillis(10));
    let execute = Decision::Execute {
        lease: Box::new(lease.clone()),
        write: Box::new(write),
        recovered: false,
    };
    let claimed = Claimed::Execute {
        hold: Hold::Record(lease),
        recovered: false,
    };
    assert_eq!(decode_claimed(&encode_claimed(&claimed)).unwrap(), claimed);
    for done in [
        Decision::InProgress {
            retry_after_secs: 3,
        },
        Decision::Mismatch {
            differing: vec!["a".into()],
            processed: true,
        },
        Decision::Rejected(RejectReason::KeyExpired),
        Decision::Replay(Arc::new(StoredResponse {
            status: 200,
            headers: vec![],
            body: vec![1, 2, 3],
        })),
    ] {
        let claimed = Claimed::Done(done);
        assert_eq!(decode_claimed(&encode_claimed(&claimed)).unwrap(), claimed);
    }
    // Damaged bytes are refused with IDEM-JS-2.
    let bytes = encode_ticket(&t);
    let mut trailing = bytes.clone();
    trailing.push(0);
    let claim = encode_claimed(&Claimed::Done(Decision::CONTENDED));
    for bad in [
        &[][..],
        &bytes[..bytes.len() - 1],
        &trailing,
        &claim,
        &[b'T', 0xff, 0xff],
    ] {
        let e = decode_ticket(bad).unwrap_err();
        assert_eq!((e.code, e.kind), ("IDEM-JS-2", ErrorKind::Range));
    }
    assert_eq!(decode_claimed(&bytes).unwrap_err().code, "IDEM-JS-2");
    // An execute inside a done claim carries a write no object applied: refused too.
    let e = decode_claimed(&encode_claimed(&Claimed::Done(execute))).unwrap_err();
    assert_eq!((e.code, e.kind), ("IDEM-JS-2", ErrorKind::Range));
}

#[test]
fn retry_options_and_entry_outcomes() {
    // IDEM-CLIENT-2
    let d = retry_policy(&RetryOptions::default()).unwrap();
    assert_eq!(d, idem_core::RetryPolicy::default());
    let p = retry_policy(&RetryOptions {
        base: Some(50.0),
        max_attempts: Some(3.0),
        ..RetryOptions::default()
    })
    .unwrap();
    assert_eq!((p.base, p.max_attempts), (Duration::from_millis(50), 3));
    for bad in [
        RetryOptions {
            max_attempts: Some(0.0),
            ..Default::default()
        },
        RetryOptions {
            base: Some(-1.0),
            ..Default::default()
        },
    ] {
        assert_eq!(retry_policy(&bad).unwrap_err().code, "IDEM-JS-1");
    }
    use idem_core::{Completion, EntryState, GiveUp};
    let cases = [
        (
            EntryState::Answered {
                class: Completion::Succeeded,
                status: 201,
            },
            Some("completed"),
        ),
        (
            EntryState::Processed {
                class: Completion::Rejected,
                status: 402,
            },
            Some("rejected"),
        ),
        (
            EntryState::Answered {
                class: Completion::Rejected,
                status: 404,
            },
            Some("rejected"),
        ),
        (
            EntryState::Failed {
                reason: GiveUp::Budget,
            },
            Some("failed"),
        ),
        (
            EntryState::Undetermined {
                reason: GiveUp::Deadline,
            },
            Some("undetermined"),
        ),
        (EntryState::Executed { status: Some(201) }, Some("executed")),
        (EntryState::Executed { status: None }, Some("executed")),
        (EntryState::NotExecuted, Some("not-executed")),
        (
            EntryState::Asking {
                until: idem_core::UnixMillis(5),
                asks: 1,
            },
            None,
        ),
        (EntryState::Sent, None),
        (EntryState::Created, None),
    ];
    for (state, outcome) in cases {
        let of_state = FetchOutcome::of_state(&state);
        assert_eq!(of_state.map(FetchOutcome::name), outcome, "{state:?}");
        // The state's own name crosses as an enum of the same meaning.
        let (kind, over) = match state {
            EntryState::Answered { .. } => (OutboxState::Answered, true),
            EntryState::Processed { .. } => (OutboxState::Processed, true),
            EntryState::Failed { .. } => (OutboxState::Failed, true),
            EntryState::Undetermined { .. } => (OutboxState::Undetermined, true),
            EntryState::Sent => (OutboxState::Sent, false),
            EntryState::Created => (OutboxState::Created, false),
            EntryState::Waiting { .. } => (OutboxState::Waiting, false),
            EntryState::Asking { .. } => (OutboxState::Asking, false),
            EntryState::Executed { .. } => (OutboxState::Executed, true),
            EntryState::NotExecuted => (OutboxState::NotExecuted, true),
        };
        assert_eq!((OutboxState::of(&state), of_state.is_some()), (kind, over));
    }
    // A next step ends with the outcome its entry has. (The names JavaScript reports are
    // written from `FetchOutcome::ALL` by tests/client_codes.rs.)
    let complete = idem_core::NextStep::Complete {
        class: Completion::Rejected,
        status: 409,
    };
    assert_eq!(NextKind::of(&complete), NextKind::Complete);
    assert_eq!(
        FetchOutcome::of_next(&complete),
        Some(FetchOutcome::Rejected)
    );
    let retry = idem_core::NextStep::Retry {
        at: idem_core::UnixMillis(5),
    };
    assert_eq!(
        (NextKind::of(&retry), FetchOutcome::of_next(&retry)),
        (NextKind::Retry, None)
    );
    let steps = [
        (
            idem_core::NextStep::AskStatus {
                at: idem_core::UnixMillis(5),
            },
            NextKind::AskStatus,
            None,
        ),
        (
            idem_core::NextStep::Executed { status: None },
            NextKind::Executed,
            Some(FetchOutcome::Executed),
        ),
        (
            idem_core::NextStep::NotExecuted,
            NextKind::NotExecuted,
            Some(FetchOutcome::NotExecuted),
        ),
    ];
    for (step, kind, outcome) in steps {
        assert_eq!(
            (NextKind::of(&step), FetchOutcome::of_next(&step)),
            (kind, outcome)
        );
    }
}
