//! Reconciling an undetermined entry with a status query (IDEM-CLIENT-8): what each answer
//! makes of the entry, the status document read back as the server wrote it, and every way a
//! lost request can end, against the real engine, with a late copy of it arriving after.
use idem_core::*;
use std::time::Duration;

const T0: UnixMillis = UnixMillis(1_700_000_000_000);
const PAYLOAD: [u8; 32] = [3; 32];
const BODY: &[u8] = br#"{"amount":4200}"#;

fn at(ms: u64) -> UnixMillis {
    UnixMillis(T0.0 + ms)
}

fn retry_policy(max_attempts: u32) -> RetryPolicy {
    RetryPolicy {
        max_attempts,
        ..RetryPolicy::default()
    }
}

/// An entry whose only send was lost: undetermined, its budget spent.
fn undetermined() -> OutboxEntry {
    let mut e = OutboxEntry::new("order-1", PAYLOAD).unwrap();
    e.send(T0, &PAYLOAD).unwrap();
    let next = e
        .on_result(&retry_policy(1), T0, 0, Err(NetworkError::Lost))
        .unwrap();
    assert_eq!(
        next,
        NextStep::Undetermined {
            reason: GiveUp::Budget
        }
    );
    e
}

#[test]
fn each_answer_makes_the_entry_definite_or_says_why_not() {
    // IDEM-CLIENT-8
    let p = retry_policy(3);
    let completed = |status, replayable| KeyStatus::Completed { status, replayable };
    let undetermined_budget = NextStep::Undetermined {
        reason: GiveUp::Budget,
    };
    let cases: &[(Option<KeyStatus>, bool, NextStep, EntryState)] = &[
        // A replay at hand is fetched with the same key.
        (
            Some(completed(201, true)),
            true,
            NextStep::Retry { at: at(5) },
            EntryState::Waiting { until: at(5) },
        ),
        (
            Some(completed(422, true)),
            true,
            NextStep::Retry { at: at(5) },
            EntryState::Waiting { until: at(5) },
        ),
        // Whatever its status: a replay is final (`KeyAnswer::Replayed`).
        (
            Some(completed(409, true)),
            true,
            NextStep::Retry { at: at(5) },
            EntryState::Waiting { until: at(5) },
        ),
        (
            Some(completed(201, true)),
            false,
            NextStep::Executed { status: Some(201) },
            EntryState::Executed { status: Some(201) },
        ),
        (
            Some(completed(201, false)),
            true,
            NextStep::Executed { status: Some(201) },
            EntryState::Executed { status: Some(201) },
        ),
        (
            Some(KeyStatus::Expired),
            true,
            NextStep::Executed { status: None },
            EntryState::Executed { status: None },
        ),
        (
            Some(KeyStatus::NotExecuted),
            false,
            NextStep::NotExecuted,
            EntryState::NotExecuted,
        ),
        (
            Some(KeyStatus::Released),
            true,
            undetermined_budget,
            EntryState::Undetermined {
                reason: GiveUp::Budget,
            },
        ),
        (
            Some(KeyStatus::Held),
            true,
            undetermined_budget,
            EntryState::Undetermined {
                reason: GiveUp::Budget,
            },
        ),
        (
            Some(KeyStatus::Unknown),
            true,
            undetermined_budget,
            EntryState::Undetermined {
                reason: GiveUp::Budget,
            },
        ),
        (
            None,
            true,
            undetermined_budget,
            EntryState::Undetermined {
                reason: GiveUp::Budget,
            },
        ),
    ];
    for (found, can_resend, next, state) in cases {
        let mut e = undetermined();
        let got = e.on_status(&p, at(5), 0, found.as_ref(), *can_resend);
        assert_eq!(got, Ok(*next), "{found:?} resend {can_resend}");
        assert_eq!(e.state(), *state, "{found:?} resend {can_resend}");
        let definite = matches!(state, EntryState::Executed { .. } | EntryState::NotExecuted);
        assert_eq!(e.is_final(), !matches!(state, EntryState::Waiting { .. }));
        if definite {
            assert_eq!(
                e.maybe_processed(),
                matches!(state, EntryState::Executed { .. })
            );
            // A definite outcome is never asked about again.
            assert_eq!(e.next_ask(at(6)), None);
            assert!(matches!(
                e.on_status(&p, at(6), 0, found.as_ref(), true),
                Err(ClientError::NothingToReconcile(_))
            ));
        }
    }
}

#[test]
fn a_key_in_progress_is_asked_about_again_and_the_asks_are_bounded() {
    // IDEM-CLIENT-8
    let p = retry_policy(3);
    let mut e = undetermined();
    assert_eq!(e.next_ask(at(1)), Some(at(1)));
    let busy = KeyStatus::InProgress {
        retry_after_secs: 4,
    };
    let NextStep::AskStatus { at: first } = e.on_status(&p, at(0), 0, Some(&busy), true).unwrap()
    else {
        panic!("asks again")
    };
    assert!(
        first >= at(4_000),
        "never sooner than Retry-After: {first:?}"
    );
    assert!(!e.is_final());
    assert_eq!(e.next_ask(at(0)), Some(first));
    assert_eq!(e.next_send(at(0)), None, "asking is not sending");
    for ask in 2..MAX_STATUS_ASKS {
        let NextStep::AskStatus { .. } = e.on_status(&p, first, 0, Some(&busy), true).unwrap()
        else {
            panic!("ask {ask} asks again")
        };
    }
    // The last ask still finds it busy: the asks are spent, still undetermined.
    let last = e.on_status(&p, at(60_000), 0, Some(&busy), true).unwrap();
    assert_eq!(
        last,
        NextStep::Undetermined {
            reason: GiveUp::Budget
        }
    );
    // A later ask may still settle it.
    let found = KeyStatus::Completed {
        status: 201,
        replayable: false,
    };
    assert_eq!(
        e.on_status(&p, at(90_000), 0, Some(&found), true),
        Ok(NextStep::Executed { status: Some(201) })
    );
}

#[test]
fn a_key_in_progress_for_longer_than_the_deadline_is_not_waited_for() {
    // IDEM-CLIENT-4: no status ask waits longer than the deadline; the entry stays open.
    let p = RetryPolicy {
        deadline: Duration::from_secs(60),
        ..retry_policy(3)
    };
    let mut e = undetermined();
    let long = KeyStatus::InProgress {
        retry_after_secs: 30 * 86_400,
    };
    assert_eq!(
        e.on_status(&p, at(0), 0, Some(&long), true),
        Ok(NextStep::Undetermined {
            reason: GiveUp::Deadline
        })
    );
    assert!(matches!(e.state(), EntryState::Undetermined { .. }));
    assert_eq!(
        e.next_ask(at(0)),
        Some(at(0)),
        "open for a later reconciliation"
    );
    // Within the deadline it is asked about again.
    let short = KeyStatus::InProgress {
        retry_after_secs: 60,
    };
    let NextStep::AskStatus { at: next } = e.on_status(&p, at(1), 0, Some(&short), true).unwrap()
    else {
        panic!("asks again")
    };
    assert!(next >= at(60_001));
}

#[test]
fn only_an_entry_sent_and_still_open_is_reconciled() {
    // IDEM-CLIENT-8
    let p = retry_policy(3);
    let mut fresh = OutboxEntry::new("order-1", PAYLOAD).unwrap();
    assert_eq!(
        fresh.on_status(&p, T0, 0, Some(&KeyStatus::Unknown), true),
        Err(ClientError::NothingToReconcile(EntryState::Created))
    );
    // Found in flight after a restart: asked about instead of resent.
    let mut restarted = OutboxEntry::new("order-1", PAYLOAD).unwrap();
    restarted.send(T0, &PAYLOAD).unwrap();
    let mut unanswered = restarted.clone();
    assert_eq!(
        restarted.on_status(&p, at(1), 0, Some(&KeyStatus::NotExecuted), false),
        Ok(NextStep::NotExecuted)
    );
    // Asked after a restart, and the server could not tell: interrupted, not out of budget.
    assert_eq!(
        unanswered.on_status(&p, at(1), 0, None, true),
        Ok(NextStep::Undetermined {
            reason: GiveUp::Interrupted
        })
    );
    assert_eq!(unanswered.next_ask(at(2)), Some(at(2)));
    let mut answered = OutboxEntry::new("order-1", PAYLOAD).unwrap();
    answered.send(T0, &PAYLOAD).unwrap();
    let ok = ClientResponse {
        status: 201,
        retry_after_secs: None,
        answer: KeyAnswer::Unspecified,
    };
    let _ = answered.on_result(&p, T0, 0, Ok(&ok)).unwrap();
    assert!(matches!(
        answered.on_status(&p, at(1), 0, Some(&KeyStatus::Expired), true),
        Err(ClientError::NothingToReconcile(EntryState::Answered { .. }))
    ));
}

#[test]
fn reconciled_entries_persist_and_a_forged_status_is_refused() {
    // IDEM-CLIENT-6 IDEM-CLIENT-8
    let p = retry_policy(3);
    let busy = KeyStatus::InProgress {
        retry_after_secs: 1,
    };
    for found in [
        KeyStatus::Expired,
        KeyStatus::NotExecuted,
        KeyStatus::Completed {
            status: 201,
            replayable: false,
        },
        busy,
    ] {
        let mut e = undetermined();
        let _ = e.on_status(&p, at(1), 0, Some(&found), false).unwrap();
        assert_eq!(decode_entry(&encode_entry(&e)).unwrap(), e, "{found:?}");
    }
    // The status is the last byte-pair of the encoding: forge it out of range.
    let mut e = undetermined();
    let found = KeyStatus::Completed {
        status: 599,
        replayable: false,
    };
    let _ = e.on_status(&p, at(1), 0, Some(&found), false).unwrap();
    let mut bytes = encode_entry(&e);
    let forged = encode_entry(&e)
        .windows(2)
        .rposition(|w| w == [0xd7, 0x04])
        .expect("599 as a varint");
    bytes[forged] = 0xd8; // 600
    assert_eq!(
        decode_entry(&bytes),
        Err(EntryDecodeError::Invalid("status outside 200-599"))
    );
}

fn server() -> Policy {
    Policy::new(
        Engine::new(Config {
            response_ttl: Duration::from_secs(10),
            key_ttl: Duration::from_secs(30),
            lease: Duration::from_secs(5),
            unknown_outcome: UnknownOutcomePolicy::Reexecute,
            max_retry_after: Duration::from_secs(60),
        })
        .unwrap(),
    )
}

fn order(policy: &Policy, nonce: u64) -> Request {
    policy.request(
        &Intake {
            principal: Some("alice"),
            method: "POST",
            route: "/orders",
            target: "/orders",
            keys: &[b"\"order-1\""],
            low_water: None,
            client: None,
            content_type: Some("application/json"),
            headers: &[],
            body: BODY,
        },
        nonce,
    )
}

/// Asks about the key with `settle`, and reads the answer as a client does: from the bytes.
fn ask(policy: &Policy, store: &mut MemoryStore, now: UnixMillis) -> Option<KeyStatus> {
    let field = StatusQuery::field("POST", true);
    let mut query = policy.status(
        &StatusQuery {
            principal: Some("alice"),
            route: "/orders",
            keys: &[b"\"order-1\""],
            status: field.as_bytes(),
            client: None,
        },
        99,
    );
    let step = query.drive(store, now, &mut Waiters::default()).unwrap();
    assert_eq!(step, Step::Reply);
    let read = KeyStatus::from_document(query.reply().unwrap().body());
    assert_eq!(read.as_ref(), query.key_status(), "the document reads back");
    read
}

/// Runs `req` to its end at `now`; a handler that runs counts an effect and answers 201.
fn run(req: &mut Request, store: &mut MemoryStore, now: UnixMillis, effects: &mut u32) {
    let mut waiters = Waiters::default();
    loop {
        match req.drive(store, now, &mut waiters).unwrap() {
            Step::Run(_) => {
                *effects += 1;
                req.handle_outcome(Outcome::classify(StoredResponse {
                    status: 201,
                    headers: vec![],
                    body: b"made".to_vec(),
                }));
            }
            Step::Reply | Step::Done(_) => return,
            other => panic!("unexpected {other:?}"),
        }
    }
}

/// How the one lost send ended on the server, before the client asks.
#[derive(Clone, Copy, Debug)]
enum Lost {
    /// It never arrived (it may still arrive late).
    NeverArrived,
    /// It ran and its response was lost.
    RanResponseGone,
    /// It is still running when the client asks; it completes afterwards.
    StillRunning,
    /// Its process died holding the lease.
    Crashed,
}

#[test]
fn every_lost_request_ends_definite_or_undetermined_never_wrong() {
    // IDEM-CLIENT-8 IDEM-STATUS-3: whatever happened to the lost send, and whenever the
    // client asks, the entry ends executed only if the handler ran, not executed only if it
    // never ran and never will (a late copy arriving after is refused), and undetermined
    // otherwise; with the payload at hand a completed key's replay completes the entry.
    let p = retry_policy(4);
    for lost in [
        Lost::NeverArrived,
        Lost::RanResponseGone,
        Lost::StillRunning,
        Lost::Crashed,
    ] {
        for asked_at in [at(1_000), at(8_000), at(20_000)] {
            for can_resend in [false, true] {
                let policy = server();
                let mut store = MemoryStore::default();
                let mut effects = 0;
                let mut original = order(&policy, 1);
                let mut waiters = Waiters::default();
                match lost {
                    Lost::NeverArrived => {}
                    Lost::RanResponseGone => run(&mut original, &mut store, T0, &mut effects),
                    Lost::StillRunning | Lost::Crashed => {
                        let step = original.drive(&mut store, T0, &mut waiters).unwrap();
                        assert!(matches!(step, Step::Run(_)));
                        effects += 1;
                    }
                }
                let mut entry = undetermined();
                let mut now = asked_at;
                let mut next = entry
                    .on_status(
                        &p,
                        now,
                        0,
                        ask(&policy, &mut store, now).as_ref(),
                        can_resend,
                    )
                    .unwrap();
                while let NextStep::AskStatus { at: later } = next {
                    if let Lost::StillRunning = lost {
                        // It completes while the client waits to ask again.
                        original.handle_outcome(Outcome::classify(StoredResponse {
                            status: 201,
                            headers: vec![],
                            body: b"made".to_vec(),
                        }));
                        let _ = original.drive(&mut store, now, &mut waiters).unwrap();
                    }
                    now = later;
                    let found = ask(&policy, &mut store, now);
                    next = entry
                        .on_status(&p, now, 0, found.as_ref(), can_resend)
                        .unwrap();
                }
                if let NextStep::Retry { at: when } = next {
                    // Fetch the replay with the same key and payload.
                    entry.send(when, &PAYLOAD).unwrap();
                    let mut retry = order(&policy, 2);
                    run(&mut retry, &mut store, when, &mut effects);
                    let reply = retry.reply().expect("a replay");
                    assert!(reply.is_replay(), "{lost:?}");
                    let response = ClientResponse {
                        status: reply.status(),
                        retry_after_secs: None,
                        answer: KeyAnswer::Unspecified,
                    };
                    next = entry.on_result(&p, when, 0, Ok(&response)).unwrap();
                }
                // A late copy of the lost send arrives now.
                if let Lost::NeverArrived = lost {
                    run(&mut original, &mut store, now, &mut effects);
                }
                let case = format!("{lost:?} asked at {asked_at:?} resend {can_resend}: {next:?}");
                match next {
                    NextStep::Complete {
                        class: Completion::Succeeded,
                        status: 201,
                    } => assert_eq!(effects, 1, "{case}"),
                    NextStep::Executed { .. } => assert_eq!(effects, 1, "{case}"),
                    NextStep::NotExecuted => assert_eq!(effects, 0, "{case}"),
                    NextStep::Undetermined { .. } => {}
                    other => panic!("{case}: unexpected {other:?}"),
                }
                assert!(effects <= 1, "{case}");
                // What each case must come to: definite whenever the server knows.
                let definite = !matches!(next, NextStep::Undetermined { .. });
                let expect_definite = match lost {
                    // Settled before the late copy arrives.
                    Lost::NeverArrived => true,
                    // Ran; replayed, or expired after 10 s: either way it ran.
                    Lost::RanResponseGone => true,
                    // Asked while its lease (5 s) runs, the client waits for its outcome;
                    // after, the attempt is released (its completion is fenced out) and
                    // nobody knows what it did.
                    Lost::StillRunning => asked_at < at(5_000),
                    Lost::Crashed => false,
                };
                assert_eq!(definite, expect_definite, "{case}");
            }
        }
    }
}

#[test]
fn a_status_document_that_is_not_one_reads_as_none() {
    // IDEM-CLIENT-8 IDEM-STATUS-4
    for bad in [
        &b""[..],
        b"not json",
        br#"{"status":"completed"}"#,
        br#"{"status":"completed","response":{"status":200}}"#,
        br#"{"status":"completed","response":{"status":99,"replayable":true}}"#,
        br#"{"status":"completed","response":{"status":70000,"replayable":true}}"#,
        br#"{"status":"vanished"}"#,
        br#"{"status":7}"#,
        br#"{"id":"ch_1","amount":4200}"#,
    ] {
        assert_eq!(
            KeyStatus::from_document(bad),
            None,
            "{}",
            String::from_utf8_lossy(bad)
        );
    }
    assert_eq!(
        KeyStatus::from_document(br#"{"status":"in-progress"}"#),
        Some(KeyStatus::InProgress {
            retry_after_secs: RETRY_SOON_SECS
        })
    );
}

/// A status document as a host that parses it itself passes it: the value at each of
/// `DOCUMENT_MEMBERS`, serialised again by its own serialiser (serde_json here, as
/// `JSON.stringify` in JavaScript).
fn host_values(body: &[u8]) -> [Option<String>; 4] {
    let doc: Option<serde_json::Value> = serde_json::from_slice(body).ok();
    KeyStatus::DOCUMENT_MEMBERS.map(|path| {
        let mut v = doc.as_ref();
        for name in path {
            v = v.and_then(|v| v.as_object()).and_then(|o| o.get(*name));
        }
        v.map(|v| serde_json::to_string(v).unwrap())
    })
}

#[test]
fn a_status_document_parsed_by_the_host_reads_as_its_text() {
    // IDEM-CLIENT-8
    let documents: [&[u8]; 14] = [
        br#"{"key":"k","status":"completed","response":{"status":201,"replayable":true}}"#,
        br#"{ "response" : { "replayable" : false , "x" : [ {} ] , "status" : 599 } , "status" : "compl\u0065ted" }"#,
        br#"{"status":"unknown","status":"in-progress","retryAfter":7}"#,
        br#"{"status":"in-progress"}"#,
        br#"{"status":"in-progress","retryAfter":"7"}"#,
        br#"{"status":"not-executed"}"#,
        br#"{"status":"released","response":null}"#,
        br#"{"status":"completed","response":{"status":"201","replayable":true}}"#,
        br#"{"status":"completed","response":{"status":200,"replayable":1}}"#,
        br#"{"status":"completed","response":{"status":600,"replayable":true}}"#,
        br#"{"status":"Completed"}"#,
        br#"{"status":["held"]}"#,
        br#"["status"]"#,
        b"not json",
    ];
    let mut read = 0;
    for body in documents {
        let values = host_values(body);
        let parsed = KeyStatus::from_values([0, 1, 2, 3].map(|i| values[i].as_deref()));
        let text = KeyStatus::from_document(body);
        assert_eq!(parsed, text, "{}", String::from_utf8_lossy(body));
        read += usize::from(text.is_some());
    }
    assert_eq!(read, 7, "seven of the documents are status documents");
}
