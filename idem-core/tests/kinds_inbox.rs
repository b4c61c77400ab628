//! The engine as an inbox: each delivery is an operation of the request machine; the first
//! delivery is processed, duplicates acknowledged.
use idem_core::*;
use std::collections::HashMap;
use std::time::Duration;

const T0: UnixMillis = UnixMillis(1_700_000_000_000);

fn at(t: UnixMillis, secs: u64) -> UnixMillis {
    t.saturating_add(Duration::from_secs(secs))
}

/// One delivery of `body` under `id` from `source`, driven until it runs or is answered.
fn deliver(
    inbox: &Inbox,
    store: &mut MemoryStore,
    now: UnixMillis,
    (source, id): (&str, &str),
    body: &str,
    nonce: u64,
) -> Request {
    let message = Message {
        source,
        id,
        content_type: Some("application/json"),
        body: body.as_bytes(),
    };
    let mut req = inbox.deliver(&message, nonce);
    assert_eq!(req.operation(), Operation::Deliver);
    let step = req.drive(store, now, &mut Waiters::default()).unwrap();
    assert!(
        matches!(step, Step::Run(_) | Step::Reply),
        "{step:?}: a delivery runs or is answered"
    );
    req
}

/// The result of a delivery that ran, once `outcome` is recorded.
fn finish(
    req: &mut Request,
    store: &mut MemoryStore,
    now: UnixMillis,
    outcome: Outcome,
) -> Delivery {
    assert_eq!(req.delivery(), None, "still running");
    req.handle_outcome(outcome);
    let step = req.drive(store, now, &mut Waiters::default()).unwrap();
    assert!(matches!(step, Step::Done(_)), "{step:?}");
    req.delivery().expect("over")
}

/// The receipt's status and JSON body.
fn receipt(req: &Request) -> (u16, serde_json::Value) {
    let reply = req.reply().expect("a receipt");
    (
        reply.status(),
        serde_json::from_slice(reply.body()).unwrap(),
    )
}

#[test]
fn the_first_delivery_is_processed_and_the_rest_acknowledged() {
    // IDEM-INBOX-1
    let inbox = Inbox::new(Engine::default());
    let mut store = MemoryStore::default();
    let mut first = deliver(&inbox, &mut store, T0, ("stripe", "evt_1"), "{}", 1);
    assert!(!first.context().unwrap().recovered);
    let done = finish(&mut first, &mut store, T0, Inbox::processed());
    assert_eq!(done, Delivery::Processed { recovered: false });
    assert!(done.acknowledge());
    let (status, body) = receipt(&first);
    assert_eq!(status, 200);
    assert_eq!(
        body,
        serde_json::json!({"outcome": "processed", "received": true})
    );
    let again = deliver(&inbox, &mut store, T0, ("stripe", "evt_1"), "{ }", 2);
    assert_eq!(again.delivery(), Some(Delivery::Duplicate));
    assert_eq!(receipt(&again).1["outcome"], "duplicate");
    // Other sources and ids are other messages.
    let mut other = deliver(&inbox, &mut store, T0, ("github", "evt_1"), "{}", 3);
    assert_eq!(
        finish(&mut other, &mut store, T0, Inbox::processed()),
        Delivery::Processed { recovered: false }
    );
    // Every host keeps the message under the same record: `<source>#inbox`, the raw id.
    let key = inbox.message_key("stripe", "evt_1").unwrap();
    assert_eq!(first.key(), &key);
    assert!(store.get(&key).is_some());
}

#[test]
fn a_redelivery_after_the_response_retention_and_inside_the_key_retention_is_a_duplicate() {
    // IDEM-INBOX-1: a sender redelivers for days (Stripe for up to three); the default
    // retention keeps a response 24 h and a key 7 days. Redeliveries at 2 h and at 27 h are
    // both acknowledged, and the message is processed once.
    let inbox = Inbox::new(Engine::default());
    let mut store = MemoryStore::default();
    let event = r#"{"id":"evt_7","type":"payment.succeeded","amount":4200}"#;
    let mut processed = 0;
    let mut first = deliver(&inbox, &mut store, T0, ("payments", "evt_7"), event, 1);
    processed += 1;
    finish(&mut first, &mut store, T0, Inbox::processed());
    for (hours, nonce) in [(2, 2), (27, 3)] {
        let now = at(T0, hours * 3600);
        store.sweep(now);
        let mut again = deliver(&inbox, &mut store, now, ("payments", "evt_7"), event, nonce);
        if again.delivery().is_none() {
            processed += 1;
            finish(&mut again, &mut store, now, Inbox::processed());
        }
        assert_eq!(again.delivery(), Some(Delivery::Duplicate), "at {hours} h");
        let (status, body) = receipt(&again);
        assert_eq!(status, 200, "at {hours} h: acknowledged");
        assert_eq!(body["received"], true);
    }
    assert_eq!(processed, 1);
    // By then the response is gone, and the id is still remembered.
    let key = inbox.message_key("payments", "evt_7").unwrap();
    assert!(matches!(
        store.get(&key).map(|r| &r.state),
        Some(RecordState::Tombstone)
    ));
}

#[test]
fn concurrent_and_failed_deliveries() {
    // IDEM-INBOX-2
    let inbox = Inbox::new(Engine::default());
    let mut store = MemoryStore::default();
    let mut running = deliver(&inbox, &mut store, T0, ("queue", "m-1"), "1", 1);
    let busy = deliver(&inbox, &mut store, T0, ("queue", "m-1"), "1", 2);
    assert_eq!(
        busy.delivery(),
        Some(Delivery::InProgress {
            // The default bound on the time left of a 60 s lease (IDEM-CONC-4).
            retry_after_secs: 2
        })
    );
    assert!(
        !busy.delivery().unwrap().acknowledge(),
        "a busy message comes again"
    );
    let reply = busy.reply().unwrap();
    assert_eq!(reply.status(), 409);
    assert_eq!(reply.problem_type(), Some("urn:idem:problem:in-progress"));
    assert_eq!(reply.requirement(), Some("IDEM-INBOX-2"));
    assert!(reply.headers().any(|h| h == ("retry-after", "2")));
    // Processing that did nothing releases the message: the next delivery processes it.
    assert_eq!(
        finish(&mut running, &mut store, T0, Outcome::Retryable),
        Delivery::Failed
    );
    assert_eq!(running.reply().unwrap().status(), 500);
    let mut crashed = deliver(&inbox, &mut store, T0, ("queue", "m-1"), "1", 3);
    assert!(!crashed.context().unwrap().recovered);
    // A processing that crashed is taken over once its lease ends.
    let later = at(T0, 61);
    let mut second = deliver(&inbox, &mut store, later, ("queue", "m-1"), "1", 4);
    assert!(second.context().unwrap().recovered);
    // The crashed one's late completion is fenced out, and says what became of the message.
    let late = finish(&mut crashed, &mut store, later, Inbox::processed());
    assert_eq!(
        late,
        Delivery::InProgress {
            retry_after_secs: 2
        }
    );
    assert_eq!(
        finish(&mut second, &mut store, later, Inbox::processed()),
        Delivery::Processed { recovered: true }
    );
}

#[test]
fn a_delivery_whose_lease_was_taken_over_says_it_processed() {
    // IDEM-INBOX-1: a processing that outlived its lease (without `extend`) ran, and so did
    // the delivery that took it over. Both say processed: a message processed twice shows.
    let inbox = Inbox::new(Engine::default());
    let mut store = MemoryStore::default();
    let mut first = deliver(&inbox, &mut store, T0, ("queue", "m-2"), "1", 1);
    let later = at(T0, 61);
    let mut second = deliver(&inbox, &mut store, later, ("queue", "m-2"), "1", 2);
    assert!(second.context().unwrap().recovered);
    assert_eq!(
        finish(&mut second, &mut store, later, Inbox::processed()),
        Delivery::Processed { recovered: true }
    );
    assert_eq!(
        finish(&mut first, &mut store, later, Inbox::processed()),
        Delivery::Processed { recovered: false }
    );
    let (status, body) = receipt(&first);
    assert_eq!(status, 200);
    assert_eq!(body["outcome"], "processed");
    // A redelivery now is a duplicate.
    let again = deliver(&inbox, &mut store, later, ("queue", "m-2"), "1", 3);
    assert_eq!(again.delivery(), Some(Delivery::Duplicate));
}

#[test]
fn a_changed_payload_under_a_known_id_is_a_conflict() {
    // IDEM-INBOX-3
    let inbox = Inbox::new(Engine::default());
    let mut store = MemoryStore::default();
    let mut first = deliver(&inbox, &mut store, T0, ("hooks", "evt_9"), r#"{"a":1}"#, 1);
    finish(&mut first, &mut store, T0, Inbox::processed());
    let changed = deliver(&inbox, &mut store, T0, ("hooks", "evt_9"), r#"{"a":2}"#, 2);
    let Some(d @ Delivery::Conflict { .. }) = changed.delivery() else {
        panic!("{:?}", changed.delivery())
    };
    assert!(d.acknowledge());
    assert_eq!(
        d,
        Delivery::Conflict {
            differing: vec!["a".into()]
        }
    );
    assert_eq!(receipt(&changed).1["outcome"], "conflict");
    let mut events = Vec::new();
    let mut changed = changed;
    while let Some(e) = changed.poll_event() {
        events.push(e);
    }
    assert!(events.iter().any(Event::is_security_relevant), "{events:?}");
}

#[test]
fn another_payload_under_a_message_not_processed_is_refused_unacknowledged() {
    // IDEM-INBOX-3: acknowledged, a message in flight or whose processing failed would never
    // be processed.
    let inbox = Inbox::new(Engine::default());
    let mut store = MemoryStore::default();
    let mut first = deliver(&inbox, &mut store, T0, ("hooks", "evt_5"), r#"{"a":1}"#, 1);
    // While the first is processed.
    let during = deliver(&inbox, &mut store, T0, ("hooks", "evt_5"), r#"{"a":2}"#, 2);
    assert_eq!(during.delivery(), Some(Delivery::Refused));
    assert!(!during.delivery().unwrap().acknowledge());
    let reply = during.reply().unwrap();
    assert_eq!(reply.status(), 422);
    assert_eq!(reply.problem_type(), Some(Problem::MISMATCH.type_uri));
    // Its processing throws, its effect unknown: another payload is still refused, and the
    // first one's next delivery processes it as a recovery.
    assert_eq!(
        finish(&mut first, &mut store, T0, Outcome::Unknown(None)),
        Delivery::Failed
    );
    let after = deliver(&inbox, &mut store, T0, ("hooks", "evt_5"), r#"{"a":2}"#, 3);
    assert_eq!(after.delivery(), Some(Delivery::Refused));
    assert!(!after.delivery().unwrap().acknowledge());
    let mut again = deliver(&inbox, &mut store, T0, ("hooks", "evt_5"), r#"{"a":1}"#, 4);
    assert_eq!(
        finish(&mut again, &mut store, T0, Inbox::processed()),
        Delivery::Processed { recovered: true }
    );
    // Processed: another payload now is a conflict, acknowledged.
    let conflict = deliver(&inbox, &mut store, T0, ("hooks", "evt_5"), r#"{"a":2}"#, 5);
    assert!(matches!(
        conflict.delivery(),
        Some(Delivery::Conflict { .. })
    ));
    assert!(conflict.delivery().unwrap().acknowledge());
}

#[test]
fn a_long_source_keeps_the_storage_key_short_and_sources_apart() {
    // IDEM-INBOX-1, IDEM-SCOPE-1: a source of any length keeps the record's storage key short
    // enough for every store to index (a Postgres key holds about 2.7 KB).
    let inbox = Inbox::default();
    let id = "x".repeat(MAX_KEY_LEN);
    let keys: Vec<String> = ["a".repeat(6_000), "b".repeat(6_000), "a".repeat(257)]
        .iter()
        .map(|source| inbox.message_key(source, &id).unwrap().storage_key())
        .collect();
    for key in &keys {
        assert!(key.len() < 400, "{} bytes", key.len());
    }
    assert_ne!(keys[0], keys[1]);
    assert_ne!(keys[0], keys[2]);
    // Up to the bound, the source is kept as it is.
    let short = inbox.message_key(&"a".repeat(256), "evt").unwrap();
    assert!(short.scope.as_str().starts_with(&"a".repeat(256)));
    // A short source that reads as a long one's digest names messages of its own.
    let long = inbox.message_key(&"a".repeat(6_000), "evt").unwrap();
    let digest = long
        .scope
        .as_str()
        .strip_suffix("#inbox")
        .unwrap_or(long.scope.as_str());
    assert!(digest.starts_with("h:"), "{digest}");
    let lookalike = inbox.message_key(digest, "evt").unwrap();
    assert_ne!(lookalike.storage_key(), long.storage_key());
    assert_ne!(lookalike.scope, long.scope);
}

#[test]
fn bad_message_ids_are_refused() {
    // IDEM-INBOX-1
    let inbox = Inbox::default();
    assert_eq!(inbox.message_key("s", ""), Err(KeyError::Empty));
    assert_eq!(
        inbox.message_key("s", &"x".repeat(256)),
        Err(KeyError::TooLong { len: 256 })
    );
    assert_eq!(
        inbox.message_key("s", "a\nb"),
        Err(KeyError::InvalidByte { at: 1, byte: b'\n' })
    );
    assert!(inbox.message_key("s", &"x".repeat(255)).is_ok());
    // A delivery with such an id is refused at once, with the key's problem.
    let mut store = MemoryStore::default();
    let refused = deliver(&inbox, &mut store, T0, ("s", "a\nb"), "{}", 1);
    assert_eq!(refused.delivery(), Some(Delivery::Refused));
    let reply = refused.reply().unwrap();
    assert_eq!(reply.status(), 400);
    assert_eq!(reply.problem_type(), Some("urn:idem:problem:malformed-key"));
    assert_eq!(store.stats().entries, 0);
}

#[test]
fn held_outcomes_are_neither_processed_nor_acknowledged() {
    // IDEM-INBOX-2 IDEM-OUT-3
    let inbox = Inbox::new(
        Engine::new(Config {
            unknown_outcome: UnknownOutcomePolicy::Hold,
            ..Config::default()
        })
        .unwrap(),
    );
    let mut store = MemoryStore::default();
    let mut first = deliver(&inbox, &mut store, T0, ("q", "m"), "1", 1);
    assert_eq!(
        finish(&mut first, &mut store, T0, Outcome::Unknown(None)),
        Delivery::Failed
    );
    let held = deliver(&inbox, &mut store, T0, ("q", "m"), "1", 2);
    assert_eq!(held.delivery(), Some(Delivery::Held));
    assert!(!held.delivery().unwrap().acknowledge());
    let reply = held.reply().unwrap();
    assert_eq!(reply.status(), 409);
    assert_eq!(
        reply.problem_type(),
        Some("urn:idem:problem:outcome-unknown")
    );
}

/// A queue that redelivers: each message arrives one to four times, interleaved, and some
/// processings crash or fail. Every message is processed exactly once to completion.
#[test]
fn redelivery_simulation_processes_each_message_once() {
    // IDEM-INBOX-1 IDEM-INBOX-2
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut rnd = move |n: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % n
    };
    for _ in 0..20 {
        let inbox = Inbox::new(
            Engine::new(Config {
                lease: Duration::from_secs(5),
                ..Config::default()
            })
            .unwrap(),
        );
        let mut store = MemoryStore::default();
        let mut now = T0.0;
        let mut queue: Vec<u64> = Vec::new();
        for m in 0..40 {
            for _ in 0..=rnd(4) {
                queue.push(m);
            }
        }
        let mut effects: HashMap<u64, u32> = HashMap::new();
        while !queue.is_empty() {
            let m = queue.remove(rnd(queue.len() as u64) as usize);
            now += rnd(3_000);
            let t = UnixMillis(now);
            let id = format!("m{m}");
            let mut d = deliver(&inbox, &mut store, t, ("q", &id), &format!("{m}"), now);
            match d.delivery() {
                None => {
                    let recovered = d.context().unwrap().recovered;
                    match rnd(10) {
                        0 => queue.push(m), // crash before the effect: redelivered later
                        1 => {
                            finish(&mut d, &mut store, t, Outcome::Retryable);
                            queue.push(m);
                        }
                        _ => {
                            // The effect is idempotent on recovery: a recovered run checks first.
                            let count = effects.entry(m).or_default();
                            if !recovered || *count == 0 {
                                *count += 1;
                            }
                            assert!(matches!(
                                finish(&mut d, &mut store, t, Inbox::processed()),
                                Delivery::Processed { .. }
                            ));
                        }
                    }
                }
                Some(Delivery::Duplicate) => assert_eq!(effects.get(&m), Some(&1)),
                Some(Delivery::InProgress { .. }) => queue.push(m),
                other => panic!("{other:?}"),
            }
        }
        // A crashed or failed processing is always delivered again, so every message ends
        // processed, and none twice.
        assert!(effects.values().all(|c| *c == 1));
        assert_eq!(effects.len(), 40);
    }
}
