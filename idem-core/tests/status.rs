//! The status query: what became of a key, from one read, never executing, never claiming,
//! never revealing another principal's record; and settling an unknown key so that a late
//! original is refused (IDEM-STATUS-1 to IDEM-STATUS-4).
use idem_core::*;
use std::time::Duration;

const T0: UnixMillis = UnixMillis(1_700_000_000_000);

fn at(ms: u64) -> UnixMillis {
    UnixMillis(T0.0 + ms)
}

fn engine(unknown_outcome: UnknownOutcomePolicy) -> Engine {
    Engine::new(Config {
        response_ttl: Duration::from_secs(10),
        key_ttl: Duration::from_secs(30),
        lease: Duration::from_secs(5),
        unknown_outcome,
        max_retry_after: Duration::from_secs(60),
    })
    .unwrap()
}

fn policy() -> Policy {
    Policy::new(engine(UnknownOutcomePolicy::Reexecute))
}

fn request(policy: &Policy, who: &str, key: &str, nonce: u64) -> Request {
    policy.request(
        &Intake {
            principal: Some(who),
            method: "POST",
            route: "/orders",
            target: "/orders",
            keys: &[key.as_bytes()],
            low_water: None,
            client: None,
            content_type: Some("application/json"),
            headers: &[],
            body: br#"{"amount":4200}"#,
        },
        nonce,
    )
}

fn drive(req: &mut Request, store: &mut MemoryStore, now: UnixMillis) -> Step {
    req.drive(store, now, &mut Waiters::default()).unwrap()
}

/// The status document of `key` asked by `who` with the field `field`, at `now`.
fn status(
    policy: &Policy,
    store: &mut MemoryStore,
    now: UnixMillis,
    who: &str,
    key: &str,
    field: &str,
) -> (Option<KeyStatus>, Reply) {
    let mut query = policy.status(
        &StatusQuery {
            principal: Some(who),
            route: "/orders",
            keys: &[key.as_bytes()],
            status: field.as_bytes(),
            client: None,
        },
        99,
    );
    assert_eq!(query.operation(), Operation::Status);
    assert_eq!(drive(&mut query, store, now), Step::Reply);
    (query.key_status().cloned(), query.reply().unwrap())
}

fn document(reply: &Reply) -> serde_json::Value {
    assert_eq!(reply.status(), 200);
    let headers: Vec<_> = reply.headers().collect();
    assert_eq!(headers[0], ("content-type", STATUS_MEDIA_TYPE));
    assert_eq!(headers[1], ("cache-control", "no-store"));
    serde_json::from_slice(reply.body()).unwrap()
}

fn completed(status: u16) -> Outcome {
    Outcome::classify(StoredResponse {
        status,
        headers: vec![],
        body: b"done".to_vec(),
    })
}

#[test]
fn each_state_of_a_key_is_reported_from_one_read_and_nothing_runs() {
    // IDEM-STATUS-1
    let policy = policy();
    let mut store = MemoryStore::default();
    let (found, reply) = status(&policy, &mut store, T0, "alice", "\"k1\"", "POST");
    assert_eq!(found, Some(KeyStatus::Unknown));
    assert_eq!(
        document(&reply),
        serde_json::json!({"key": "k1", "status": "unknown"})
    );
    assert_eq!(store.stats().entries, 0, "a query claims nothing");

    let mut first = request(&policy, "alice", "\"k1\"", 1);
    assert!(matches!(drive(&mut first, &mut store, T0), Step::Run(_)));
    let (found, reply) = status(&policy, &mut store, at(1_000), "alice", "\"k1\"", "POST");
    assert_eq!(
        found,
        Some(KeyStatus::InProgress {
            retry_after_secs: 4
        })
    );
    assert_eq!(
        document(&reply),
        serde_json::json!({"key": "k1", "retryAfter": 4, "status": "in-progress"})
    );
    assert!(reply.headers().any(|h| h == ("retry-after", "4")));

    first.handle_outcome(completed(201));
    assert!(matches!(
        drive(&mut first, &mut store, at(1_000)),
        Step::Done(_)
    ));
    let (found, reply) = status(&policy, &mut store, at(2_000), "alice", "\"k1\"", "POST");
    assert_eq!(
        found,
        Some(KeyStatus::Completed {
            status: 201,
            replayable: true
        })
    );
    assert_eq!(
        document(&reply),
        serde_json::json!({"key": "k1", "response": {"replayable": true, "status": 201}, "status": "completed"})
    );
    // After the response retention, before the key's: it ran, its response is gone.
    let (found, _) = status(&policy, &mut store, at(12_000), "alice", "\"k1\"", "POST");
    assert_eq!(found, Some(KeyStatus::Expired));
    store.sweep(at(12_000));
    let (found, _) = status(&policy, &mut store, at(12_000), "alice", "\"k1\"", "POST");
    assert_eq!(
        found,
        Some(KeyStatus::Expired),
        "also once swept to a tombstone"
    );
    // After the key retention: forgotten.
    let (found, _) = status(&policy, &mut store, at(40_000), "alice", "\"k1\"", "POST");
    assert_eq!(found, Some(KeyStatus::Unknown));

    // An attempt whose outcome is unknown: under the default policy a retry runs again.
    let mut failed = request(&policy, "alice", "\"k2\"", 2);
    assert!(matches!(drive(&mut failed, &mut store, T0), Step::Run(_)));
    failed.handle_outcome(Outcome::Unknown(None));
    assert!(matches!(drive(&mut failed, &mut store, T0), Step::Done(_)));
    let (found, _) = status(&policy, &mut store, at(1), "alice", "\"k2\"", "POST");
    assert_eq!(found, Some(KeyStatus::Released));
    // Under the hold policy it is held.
    let holding = Policy::new(engine(UnknownOutcomePolicy::Hold));
    let mut held = request(&holding, "alice", "\"k3\"", 3);
    assert!(matches!(drive(&mut held, &mut store, T0), Step::Run(_)));
    held.handle_outcome(Outcome::Unknown(None));
    assert!(matches!(drive(&mut held, &mut store, T0), Step::Done(_)));
    let (found, _) = status(&holding, &mut store, at(1), "alice", "\"k3\"", "POST");
    assert_eq!(found, Some(KeyStatus::Held));
    // A crashed attempt whose lease ended is released too.
    let mut crashed = request(&policy, "alice", "\"k4\"", 4);
    assert!(matches!(drive(&mut crashed, &mut store, T0), Step::Run(_)));
    let (found, _) = status(&policy, &mut store, at(6_000), "alice", "\"k4\"", "POST");
    assert_eq!(found, Some(KeyStatus::Released));
}

#[test]
fn a_key_whose_response_was_too_large_to_keep_is_expired_not_completed() {
    // IDEM-STATUS-1 IDEM-STORE-5: it ran, and its response is gone; "completed" would send
    // the client to fetch a replay that is only the response-not-stored answer.
    let policy = policy().with_max_response_bytes(16);
    let mut store = MemoryStore::default();
    let answers: [fn(&mut Request); 2] = [
        // Held whole, past the limit.
        |req| {
            req.handle_outcome(Outcome::Final(StoredResponse {
                status: 201,
                headers: vec![],
                body: vec![b'x'; 64],
            }))
        },
        // Passed through as it streamed, past the limit.
        |req| req.handle_oversized(201),
    ];
    for (i, answer) in answers.into_iter().enumerate() {
        let key = format!("big-{i}");
        let mut req = request(&policy, "alice", &key, 20 + i as u64);
        assert!(matches!(drive(&mut req, &mut store, T0), Step::Run(_)));
        answer(&mut req);
        assert!(matches!(drive(&mut req, &mut store, T0), Step::Done(_)));
        let (found, reply) = status(&policy, &mut store, at(1), "alice", &key, "POST; settle");
        assert_eq!(found, Some(KeyStatus::Expired), "{key}");
        assert_eq!(document(&reply)["status"], "expired");
    }
    // A small response is completed, as ever.
    let mut req = request(&policy, "alice", "small", 30);
    assert!(matches!(drive(&mut req, &mut store, T0), Step::Run(_)));
    req.handle_outcome(completed(201));
    assert!(matches!(drive(&mut req, &mut store, T0), Step::Done(_)));
    let (found, _) = status(&policy, &mut store, at(1), "alice", "small", "POST");
    assert!(matches!(
        found,
        Some(KeyStatus::Completed { status: 201, .. })
    ));
}

#[test]
fn another_principals_key_is_unknown_and_a_settle_stays_in_the_askers_scope() {
    // IDEM-STATUS-2
    let policy = policy();
    let mut store = MemoryStore::default();
    let mut alice = request(&policy, "alice", "\"shared\"", 1);
    assert!(matches!(drive(&mut alice, &mut store, T0), Step::Run(_)));
    alice.handle_outcome(completed(201));
    assert!(matches!(drive(&mut alice, &mut store, T0), Step::Done(_)));
    let (found, reply) = status(&policy, &mut store, at(1), "bob", "\"shared\"", "POST");
    assert_eq!(found, Some(KeyStatus::Unknown));
    assert!(!String::from_utf8_lossy(reply.body()).contains("201"));
    // Bob settles the key in his scope: Alice's record is untouched, Bob's request refused.
    let (found, _) = status(
        &policy,
        &mut store,
        at(2),
        "bob",
        "\"shared\"",
        "POST; settle",
    );
    assert_eq!(found, Some(KeyStatus::NotExecuted));
    let (found, _) = status(&policy, &mut store, at(3), "alice", "\"shared\"", "POST");
    assert!(matches!(
        found,
        Some(KeyStatus::Completed { status: 201, .. })
    ));
    let mut replay = request(&policy, "alice", "\"shared\"", 2);
    assert_eq!(drive(&mut replay, &mut store, at(4)), Step::Reply);
    assert!(replay.reply().unwrap().is_replay());
}

#[test]
fn a_settled_key_refuses_a_late_original_and_never_runs_it() {
    // IDEM-STATUS-3
    let policy = policy();
    let mut store = MemoryStore::default();
    let (found, reply) = status(&policy, &mut store, T0, "alice", "\"lost\"", "POST; settle");
    assert_eq!(found, Some(KeyStatus::NotExecuted));
    assert_eq!(
        document(&reply),
        serde_json::json!({"key": "lost", "status": "not-executed"})
    );
    let mut late = request(&policy, "alice", "\"lost\"", 1);
    assert_eq!(drive(&mut late, &mut store, at(1_000)), Step::Reply);
    let refused = late.reply().unwrap();
    assert_eq!(refused.status(), 409);
    assert_eq!(refused.problem_type(), Some("urn:idem:problem:key-settled"));
    assert_eq!(refused.requirement(), Some("IDEM-STATUS-3"));
    // Asked again, with or without settle: still not executed.
    for field in ["POST", "POST; settle"] {
        let (found, _) = status(&policy, &mut store, at(2_000), "alice", "\"lost\"", field);
        assert_eq!(found, Some(KeyStatus::NotExecuted));
    }
    // A key that ran is never settled: the query reports what ran.
    let mut ran = request(&policy, "alice", "\"ran\"", 2);
    assert!(matches!(drive(&mut ran, &mut store, T0), Step::Run(_)));
    ran.handle_outcome(completed(201));
    assert!(matches!(drive(&mut ran, &mut store, T0), Step::Done(_)));
    let (found, _) = status(
        &policy,
        &mut store,
        at(1),
        "alice",
        "\"ran\"",
        "POST; settle",
    );
    assert!(matches!(found, Some(KeyStatus::Completed { .. })));
    // The settled key is forgotten with the key retention, like any key.
    let mut after = request(&policy, "alice", "\"lost\"", 3);
    assert!(matches!(
        drive(&mut after, &mut store, at(31_000)),
        Step::Run(_)
    ));
}

/// Drives `query` (a settling status query) and `original` against each other with their
/// reads first and their writes in the order `settle_first` says: one compare-and-set wins.
fn race(settle_first: bool) -> (Option<KeyStatus>, Option<u16>, bool) {
    let policy = policy();
    let mut store = MemoryStore::default();
    let mut waiters = Waiters::default();
    let mut query = policy.status(
        &StatusQuery {
            principal: Some("alice"),
            route: "/orders",
            keys: &[b"\"race\""],
            status: b"POST; settle",
            client: None,
        },
        7,
    );
    let mut original = request(&policy, "alice", "\"race\"", 8);
    // Both read the key absent.
    assert_eq!(query.poll(T0, &mut waiters), Step::Load);
    assert_eq!(original.poll(T0, &mut waiters), Step::Claim);
    let key = query.key().clone();
    query.handle_record(T0, store.load(&key).unwrap().as_ref(), &mut waiters);
    original.handle_record(T0, store.load(&key).unwrap().as_ref(), &mut waiters);
    let Step::Apply(settle) = query.poll(T0, &mut waiters) else {
        panic!("the query settles")
    };
    let Step::Apply(claim) = original.poll(T0, &mut waiters) else {
        panic!("the original claims")
    };
    let (settled, claimed) = if settle_first {
        let settled = store.apply(T0, settle).unwrap();
        (settled, store.apply(T0, claim).unwrap())
    } else {
        let claimed = store.apply(T0, claim).unwrap();
        (store.apply(T0, settle).unwrap(), claimed)
    };
    assert_ne!(settled, claimed, "exactly one compare-and-set applies");
    query.handle_applied(T0, settled, &mut waiters);
    original.handle_applied(T0, claimed, &mut waiters);
    let query_step = query.drive(&mut store, T0, &mut waiters).unwrap();
    assert_eq!(query_step, Step::Reply);
    let ran = matches!(
        original.drive(&mut store, T0, &mut waiters).unwrap(),
        Step::Run(_)
    );
    let refused = original.reply().map(|r| r.status());
    (query.key_status().cloned(), refused, ran)
}

#[test]
fn a_settle_racing_the_original_one_of_them_wins() {
    // IDEM-STATUS-3: the compare-and-set decides. The settle first: the original is refused,
    // never run. The original first: it runs, and the query reports it in progress.
    let (found, refused, ran) = race(true);
    assert_eq!(found, Some(KeyStatus::NotExecuted));
    assert_eq!((refused, ran), (Some(409), false));
    let (found, refused, ran) = race(false);
    assert!(
        matches!(found, Some(KeyStatus::InProgress { .. })),
        "{found:?}"
    );
    assert_eq!((refused, ran), (None, true));
}

#[test]
fn tokens_time_keys_and_counters_are_asked_about_by_their_own_keys() {
    // IDEM-STATUS-1 IDEM-STATUS-3
    let mut store = MemoryStore::default();
    let tokens = policy()
        .with_keys(KeyKind::Token {
            secret: TokenSecret([3; 32]),
            ttl: Duration::from_secs(20),
        })
        .unwrap();
    let target = Target {
        principal: Some("alice"),
        method: "POST",
        route: "/orders",
    };
    let mut issuing = tokens.issue_token(&target, T0, [1, 2]);
    assert_eq!(drive(&mut issuing, &mut store, T0), Step::Reply);
    let doc: serde_json::Value = serde_json::from_slice(issuing.reply().unwrap().body()).unwrap();
    let token = doc["token"].as_str().unwrap().to_owned();
    let (found, _) = status(&tokens, &mut store, at(1), "alice", &token, "POST");
    assert_eq!(found, Some(KeyStatus::Unknown), "issued, never presented");
    // Settling an unused token consumes it: presented later, it is refused.
    let (found, _) = status(&tokens, &mut store, at(2), "alice", &token, "POST; settle");
    assert_eq!(found, Some(KeyStatus::NotExecuted));
    let mut late = request(&tokens, "alice", &token, 5);
    assert_eq!(drive(&mut late, &mut store, at(3)), Step::Reply);
    assert_eq!(
        late.reply().unwrap().problem_type(),
        Some("urn:idem:problem:key-settled")
    );
    // A forged token is refused, not looked up.
    let forged = format!("{}0", &token[..token.len() - 1]);
    let (found, reply) = status(&tokens, &mut store, at(4), "alice", &forged, "POST");
    assert_eq!(found, None);
    assert_eq!(reply.problem_type(), Some("urn:idem:problem:token-forged"));

    // Counters: the slot of a number, read only.
    let counters = policy()
        .with_keys(KeyKind::Counter(CounterConfig {
            bits: 16,
            window: 4,
        }))
        .unwrap();
    let mut opening = counters.open_session(&target, "c1", 0, 11);
    assert_eq!(drive(&mut opening, &mut store, T0), Step::Reply);
    let doc: serde_json::Value = serde_json::from_slice(opening.reply().unwrap().body()).unwrap();
    let epoch = doc["epoch"].as_str().unwrap().to_owned();
    let key0 = format!("c1:{epoch}:0");
    let mut first = request(&counters, "alice", &key0, 12);
    assert!(matches!(drive(&mut first, &mut store, T0), Step::Run(_)));
    let (found, _) = status(&counters, &mut store, at(1), "alice", &key0, "POST");
    assert!(matches!(found, Some(KeyStatus::InProgress { .. })));
    first.handle_outcome(completed(201));
    assert!(matches!(
        drive(&mut first, &mut store, at(1)),
        Step::Done(_)
    ));
    let (found, _) = status(&counters, &mut store, at(2), "alice", &key0, "POST; settle");
    assert!(matches!(
        found,
        Some(KeyStatus::Completed { status: 201, .. })
    ));
    let key9 = format!("c1:{epoch}:9");
    let (found, _) = status(&counters, &mut store, at(3), "alice", &key9, "POST; settle");
    assert_eq!(
        found,
        Some(KeyStatus::Unknown),
        "counter keys are never settled"
    );
    // The session moves to its next epoch, whose number 0 runs another request: the old
    // epoch's key 0 is not that request (IDEM-CTR-5), and what became of it is unknown.
    let mut reopening = counters.open_session(&target, "c1", 0, 13);
    assert_eq!(drive(&mut reopening, &mut store, at(4)), Step::Reply);
    let doc: serde_json::Value = serde_json::from_slice(reopening.reply().unwrap().body()).unwrap();
    let next = format!("c1:{}:0", doc["epoch"].as_str().unwrap());
    assert_ne!(next, key0);
    let mut second = request(&counters, "alice", &next, 14);
    assert!(matches!(
        drive(&mut second, &mut store, at(5)),
        Step::Run(_)
    ));
    second.handle_outcome(completed(202));
    assert!(matches!(
        drive(&mut second, &mut store, at(5)),
        Step::Done(_)
    ));
    let (found, _) = status(&counters, &mut store, at(6), "alice", &next, "POST");
    assert!(matches!(
        found,
        Some(KeyStatus::Completed { status: 202, .. })
    ));
    let (found, _) = status(&counters, &mut store, at(6), "alice", &key0, "POST; settle");
    assert_eq!(found, Some(KeyStatus::Unknown), "another epoch's number 0");
}

#[test]
fn a_time_key_ahead_of_its_window_is_read_and_never_settled() {
    // IDEM-STATUS-3 IDEM-TIME-2: refused now, it may run once the window reaches it, after a
    // settled record (kept for the key's retention) would have gone: a settle would say
    // not-executed of a request that runs later.
    let mut store = MemoryStore::default();
    let times = policy()
        .with_keys(KeyKind::Time(TimeKeyConfig {
            max_ahead: Duration::from_secs(1),
            max_age: Duration::from_secs(10),
        }))
        .unwrap();
    let ahead = (T0.0 + 40_000).to_string();
    let (found, _) = status(&times, &mut store, T0, "alice", &ahead, "POST; settle");
    assert_eq!(found, Some(KeyStatus::Unknown));
    // Once in its window, it runs.
    let later = UnixMillis(T0.0 + 39_500);
    let mut original = request(&times, "alice", &ahead, 5);
    assert!(matches!(
        drive(&mut original, &mut store, later),
        Step::Run(_)
    ));
    // A key inside its window is settled as any other.
    let now = T0.0.to_string();
    let (found, _) = status(&times, &mut store, T0, "alice", &now, "POST; settle");
    assert_eq!(found, Some(KeyStatus::NotExecuted));
}

#[test]
fn bad_queries_are_refused_with_problems_and_nothing_is_read() {
    // IDEM-STATUS-4 IDEM-KEY-3 IDEM-KEY-5
    let policy = policy();
    let refused = |keys: &[&[u8]], field: &str, who: Option<&str>| {
        let mut query = policy.status(
            &StatusQuery {
                principal: who,
                route: "/orders",
                keys,
                status: field.as_bytes(),
                client: None,
            },
            1,
        );
        assert_eq!(
            query.poll(T0, &mut Waiters::default()),
            Step::Reply,
            "{field}"
        );
        assert_eq!(query.key_status(), None);
        query.reply().unwrap()
    };
    assert_eq!(
        refused(&[], "POST", Some("a")).problem_type(),
        Some("urn:idem:problem:missing-key")
    );
    assert_eq!(
        refused(&[b"\"a\"", b"\"b\""], "POST", Some("a")).problem_type(),
        Some("urn:idem:problem:malformed-key")
    );
    for field in ["", "POST; now", "PO ST", "POST;", "\u{e9}"] {
        let reply = refused(&[b"\"k\""], field, Some("a"));
        assert_eq!(
            (reply.status(), reply.problem_type()),
            (400, Some(ABOUT_BLANK)),
            "{field:?}"
        );
    }
    // A method whose requests are not guarded here.
    assert_eq!(refused(&[b"\"k\""], "GET", Some("a")).status(), 400);
    assert_eq!(
        refused(&[b"\"k\""], "POST", Some("")).problem_type(),
        Some("urn:idem:problem:no-principal")
    );
}
