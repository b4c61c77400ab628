//! What a host needs beside the guarded request for the key kinds with state of their own:
//! the scope of a route, and the operations that issue a token and open a counter session,
//! driven like any request; then requests of those kinds through the same machine as opaque
//! keys.
use idem_core::*;
use std::time::Duration;

const T0: UnixMillis = UnixMillis(1_700_000_000_000);

fn engine() -> Engine {
    Engine::new(Config {
        response_ttl: Duration::from_secs(10),
        key_ttl: Duration::from_secs(30),
        lease: Duration::from_secs(5),
        unknown_outcome: UnknownOutcomePolicy::Reexecute,
        max_retry_after: DEFAULT_MAX_RETRY_AFTER,
    })
    .unwrap()
}

fn counters(bits: u8, window: u32) -> Policy {
    Policy::new(engine())
        .with_keys(KeyKind::Counter(CounterConfig { bits, window }))
        .unwrap()
}

fn tokens() -> Policy {
    Policy::new(engine())
        .with_keys(KeyKind::Token {
            secret: TokenSecret([7; 32]),
            ttl: Duration::from_secs(20),
        })
        .unwrap()
}

fn request(policy: &Policy, key: &str, low_water: Option<&str>, body: &str) -> Request {
    policy.request(
        &Intake {
            principal: Some("alice"),
            method: "POST",
            route: "/transfers",
            target: "/transfers",
            keys: &[key.as_bytes()],
            low_water,
            client: None,
            content_type: Some("application/json"),
            headers: &[],
            body: body.as_bytes(),
        },
        11,
    )
}

fn ok(body: &str) -> StoredResponse {
    StoredResponse {
        status: 201,
        headers: vec![("content-type".into(), "application/json".into())],
        body: body.as_bytes().to_vec(),
    }
}

/// Runs `req` to completion on `store` with a 201 of `body`; panics unless it runs.
fn run(req: &mut Request, store: &mut MemoryStore, now: UnixMillis, body: &str) {
    let mut waiters = Waiters::default();
    let Step::Run(_) = req.drive(store, now, &mut waiters).unwrap() else {
        panic!("the request runs: {:?}", req.reply().map(|r| r.status()));
    };
    req.handle_outcome(Outcome::Final(ok(body)));
    assert_eq!(
        req.drive(store, now, &mut waiters).unwrap(),
        Step::Done(Finish::Stored)
    );
}

fn refused(req: &mut Request, store: &mut MemoryStore, now: UnixMillis) -> Reply {
    let step = req.drive(store, now, &mut Waiters::default()).unwrap();
    assert_eq!(step, Step::Reply);
    req.reply().unwrap()
}

fn requirement(reply: &Reply) -> String {
    let v: serde_json::Value = serde_json::from_slice(reply.body()).unwrap();
    v["requirement"].as_str().unwrap().to_owned()
}

fn problem_type(reply: &Reply) -> String {
    let v: serde_json::Value = serde_json::from_slice(reply.body()).unwrap();
    v["type"].as_str().unwrap().to_owned()
}

#[test]
fn the_scope_is_the_one_requests_get_and_an_empty_principal_is_refused() {
    // IDEM-SCOPE-3
    let policy = counters(32, 8);
    let a = policy.scope(Some("alice"), "POST", "/transfers").unwrap();
    assert_eq!(
        a,
        policy.scope(Some("alice"), "POST", "/transfers").unwrap()
    );
    assert_ne!(a, policy.scope(Some("bob"), "POST", "/transfers").unwrap());
    assert_ne!(a, policy.scope(None, "POST", "/transfers").unwrap());
    let e = policy.scope(Some(""), "POST", "/transfers").unwrap_err();
    assert_eq!(e.problem, Problem::NO_PRINCIPAL);
}

const ALICE: Target<'static> = Target {
    principal: Some("alice"),
    method: "POST",
    route: "/transfers",
};

/// The JSON document of an operation's reply: 201, `application/json`, never cached.
fn document(reply: &Reply) -> serde_json::Value {
    assert_eq!(reply.status(), 201);
    let headers: Vec<_> = reply.headers().collect();
    assert_eq!(
        headers,
        [
            ("content-type", "application/json"),
            ("cache-control", "no-store")
        ]
    );
    serde_json::from_slice(reply.body()).unwrap()
}

#[test]
fn the_edge_answers_its_own_problems_as_about_blank() {
    // IDEM-HTTP-2
    for (plain, status, title) in [
        (Plain::BadRequest, 400, "Bad Request"),
        (Plain::NotFound, 404, "Not Found"),
        (Plain::Internal, 500, "Internal Server Error"),
        (Plain::Unavailable, 503, "Service Unavailable"),
    ] {
        let reply = Reply::plain(plain, "what happened, with \"quotes\"");
        assert_eq!(reply.status(), status);
        assert_eq!(reply.problem_type(), Some(ABOUT_BLANK));
        assert_eq!(reply.requirement(), None);
        let headers: Vec<_> = reply.headers().collect();
        assert_eq!(headers, [("content-type", PROBLEM_JSON)]);
        assert_eq!(
            std::str::from_utf8(reply.body()).unwrap(),
            format!(
                r#"{{"detail":"what happened, with \"quotes\"","status":{status},"title":"{title}","type":"about:blank"}}"#
            )
        );
    }
    let reply = Reply::method_not_allowed("POST");
    assert_eq!(reply.status(), 405);
    let headers: Vec<_> = reply.headers().collect();
    assert_eq!(headers, [("content-type", PROBLEM_JSON), ("allow", "POST")]);
    let v: serde_json::Value = serde_json::from_slice(reply.body()).unwrap();
    assert_eq!(v["detail"], "use POST");
    assert_eq!(v["title"], "Method Not Allowed");
}

#[test]
fn a_session_opens_by_machine_and_its_counter_keys_run_through_the_request_machine() {
    // IDEM-CTR-3 IDEM-CTR-5 IDEM-CTR-6 IDEM-CTR-11 IDEM-HTTP-2
    let policy = counters(8, 4);
    let mut store = MemoryStore::default();
    let mut waiters = Waiters::default();
    // Without a session the client is unknown.
    let r = refused(&mut request(&policy, "c1:5:0", None, "{}"), &mut store, T0);
    assert_eq!(problem_type(&r), "urn:idem:problem:unknown-client");

    let mut opening = policy.open_session(&ALICE, "c1", 0, 0xfeed);
    assert_eq!(opening.operation(), Operation::OpenSession);
    assert_eq!(opening.poll(T0, &mut waiters), Step::Load, "reads first");
    // Polling again before the record arrives asks for nothing new.
    assert_eq!(opening.poll(T0, &mut waiters), Step::Idle);
    let stored = store.load(opening.key()).unwrap();
    opening.handle_record(T0, stored.as_ref(), &mut waiters);
    let Step::Apply(write) = opening.poll(T0, &mut waiters) else {
        panic!("then writes")
    };
    opening.handle_applied(T0, store.apply(T0, write).unwrap(), &mut waiters);
    assert_eq!(opening.poll(T0, &mut waiters), Step::Reply);
    let session = document(&opening.reply().unwrap());
    assert_eq!(session["client"], "c1");
    assert_eq!(session["firstSeq"], "0");
    let epoch: u64 = session["epoch"].as_str().unwrap().parse().unwrap();

    let key0 = format!("c1:{epoch}:0");
    run(
        &mut request(&policy, &key0, None, r#"{"n":0}"#),
        &mut store,
        T0,
        "zero",
    );
    let mut replay = request(&policy, &key0, None, r#"{"n":0}"#);
    let r = refused(&mut replay, &mut store, T0);
    assert!(r.is_replay());
    assert_eq!(r.body(), b"zero");
    // The next number runs, and its low-water mark makes 0 stale.
    let key1 = format!("c1:{epoch}:1");
    run(
        &mut request(&policy, &key1, Some("1"), r#"{"n":1}"#),
        &mut store,
        T0,
        "one",
    );
    // Another payload for a number in the window collides, citing the counter rule.
    let r = refused(
        &mut request(&policy, &key1, None, r#"{"n":9}"#),
        &mut store,
        T0,
    );
    assert_eq!(problem_type(&r), "urn:idem:problem:key-collision");
    assert_eq!(requirement(&r), "IDEM-CTR-7");
    let r = refused(
        &mut request(&policy, &key0, None, r#"{"n":0}"#),
        &mut store,
        T0,
    );
    assert_eq!(problem_type(&r), "urn:idem:problem:key-stale");
    assert_eq!(requirement(&r), "IDEM-CTR-6");
    // Opening again moves the session to the next epoch: the old one is stale.
    let next = open(&policy, &mut store, br#"{"client":"c1"}"#);
    assert_eq!(next, epoch.wrapping_add(1));
    let r = refused(
        &mut request(&policy, &format!("c1:{epoch}:2"), None, "{}"),
        &mut store,
        T0,
    );
    assert_eq!(problem_type(&r), "urn:idem:problem:stale-epoch");
}

/// Opens a session from the body of a session endpoint on a MemoryStore: its epoch.
fn open(policy: &Policy, store: &mut MemoryStore, body: &[u8]) -> u64 {
    let mut opening = policy.open_session_from(&ALICE, body, 99);
    assert_eq!(
        opening.drive(store, T0, &mut Waiters::default()).unwrap(),
        Step::Reply
    );
    let session = document(&opening.reply().unwrap());
    session["epoch"].as_str().unwrap().parse().unwrap()
}

#[test]
fn a_session_endpoint_takes_its_body_and_refuses_what_is_not_one() {
    // IDEM-CTR-1
    let policy = counters(32, 8);
    let mut store = MemoryStore::default();
    let mut answer = |body: &str| {
        let mut opening = policy.open_session_from(&ALICE, body.as_bytes(), 7);
        assert_eq!(
            opening
                .drive(&mut store, T0, &mut Waiters::default())
                .unwrap(),
            Step::Reply
        );
        opening.reply().unwrap()
    };
    for (body, first) in [
        (r#"{"client":"c1","firstSeq":42}"#, "42"),
        (r#"{"client":"c2","firstSeq":"18446744073709551615"}"#, ""),
        (r#"{"firstSeq":7,"client":"c3","extra":[1]}"#, "7"),
        (r#"{"client":"c4"}"#, "0"),
    ] {
        let reply = answer(body);
        if first.is_empty() {
            // Beyond 32 bits: the counter's rule refuses it.
            assert_eq!(reply.status(), 400, "{body}");
            assert_eq!(requirement(&reply), "IDEM-CTR-1");
        } else {
            assert_eq!(document(&reply)["firstSeq"], first, "{body}");
        }
    }
    for body in ["", "not json", "[]", r#"{"client":7}"#, r#"{"firstSeq":1}"#] {
        let reply = answer(body);
        assert_eq!(reply.status(), 400, "{body}");
        assert_eq!(reply.problem_type(), Some(ABOUT_BLANK), "{body}");
        let v: serde_json::Value = serde_json::from_slice(reply.body()).unwrap();
        assert_eq!(v["title"], "Bad Request");
        assert_eq!(v["status"], 400);
    }
    for body in [
        r#"{"client":"c1","firstSeq":-1}"#,
        r#"{"client":"c1","firstSeq":1.5}"#,
        r#"{"client":"c1","firstSeq":null}"#,
        r#"{"client":"c1","firstSeq":"x"}"#,
    ] {
        let reply = answer(body);
        assert_eq!(
            problem_type(&reply),
            "urn:idem:problem:malformed-key",
            "{body}"
        );
        assert_eq!(requirement(&reply), "IDEM-CTR-1", "{body}");
    }
    // A client id the rules refuse: 400 malformed-key, after the read.
    let reply = answer(r#"{"client":"no spaces"}"#);
    assert_eq!(problem_type(&reply), "urn:idem:problem:malformed-key");
    assert_eq!(requirement(&reply), "IDEM-CTR-1");
}

#[test]
fn an_opening_that_keeps_losing_races_gives_up_as_contended() {
    // IDEM-CTR-12
    let policy = counters(32, 8);
    let mut opening = policy.open_session(&ALICE, "c1", 0, 1);
    let mut waiters = Waiters::default();
    let mut rounds = 0;
    loop {
        match opening.poll(T0, &mut waiters) {
            Step::Load => opening.handle_record(T0, None, &mut waiters),
            Step::Apply(_) => {
                rounds += 1;
                opening.handle_applied(T0, Applied::Conflict, &mut waiters);
            }
            Step::Reply => break,
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(rounds, MAX_COMPLETION_ROUNDS);
    let reply = opening.reply().unwrap();
    assert_eq!(reply.status(), 409);
    assert_eq!(requirement(&reply), "IDEM-CTR-12");
    assert!(reply.headers().any(|h| h == ("retry-after", "1")));
    // A store that fails: 503, nothing opened.
    let mut failing = policy.open_session(&ALICE, "c1", 0, 1);
    assert_eq!(failing.poll(T0, &mut waiters), Step::Load);
    failing.handle_store_error(StoreFailure::Unavailable, &mut waiters);
    assert_eq!(failing.poll(T0, &mut waiters), Step::Reply);
    assert_eq!(
        problem_type(&failing.reply().unwrap()),
        "urn:idem:problem:store-unavailable"
    );
}

#[test]
fn a_token_is_issued_for_a_scope_and_consumed_once_through_the_request_machine() {
    // IDEM-TOKEN-1 IDEM-TOKEN-2 IDEM-TOKEN-3
    let policy = tokens();
    let mut store = MemoryStore::default();
    let issue = |store: &mut MemoryStore, target: &Target<'_>, random| {
        let mut issuing = policy.issue_token(target, T0, random);
        assert_eq!(issuing.operation(), Operation::IssueToken);
        assert_eq!(
            issuing.drive(store, T0, &mut Waiters::default()).unwrap(),
            Step::Reply
        );
        document(&issuing.reply().unwrap())
    };
    let issued = issue(&mut store, &ALICE, [1, 2]);
    assert_eq!(issued["expiresAt"], T0.0 + 20_000);
    assert_eq!(issued["ttl"], 20_000);
    let token = issued["token"].as_str().unwrap();
    run(
        &mut request(&policy, token, None, "{}"),
        &mut store,
        T0,
        "paid",
    );
    let r = refused(&mut request(&policy, token, None, "{}"), &mut store, T0);
    assert!(r.is_replay());
    // A token issued for another principal's scope does not verify here.
    let bob = Target {
        principal: Some("bob"),
        ..ALICE
    };
    let other = issue(&mut store, &bob, [3, 4]);
    let r = refused(
        &mut request(&policy, other["token"].as_str().unwrap(), None, "{}"),
        &mut store,
        T0,
    );
    assert_eq!(problem_type(&r), "urn:idem:problem:token-forged");
    // An empty principal is refused before anything is written.
    let nobody = Target {
        principal: Some(""),
        ..ALICE
    };
    let mut refused_issue = policy.issue_token(&nobody, T0, [5, 6]);
    assert_eq!(refused_issue.poll(T0, &mut Waiters::default()), Step::Reply);
    assert_eq!(
        problem_type(&refused_issue.reply().unwrap()),
        "urn:idem:problem:no-principal"
    );
}

#[test]
fn only_the_kind_that_has_them_issues_tokens_or_opens_sessions() {
    let opaque = Policy::new(engine());
    let target = Target {
        principal: None,
        method: "POST",
        route: "/orders",
    };
    for mut op in [
        opaque.issue_token(&target, T0, [1, 2]),
        opaque.open_session(&target, "c1", 0, 1),
        tokens().open_session(&target, "c1", 0, 1),
        counters(32, 8).issue_token(&target, T0, [1, 2]),
    ] {
        assert_eq!(op.poll(T0, &mut Waiters::default()), Step::Reply);
        let reply = op.reply().unwrap();
        assert_eq!(reply.status(), 500);
        assert_eq!(reply.problem_type(), Some(ABOUT_BLANK));
    }
}

#[test]
fn a_client_sequence_never_reuses_an_open_number_and_its_mark_trails_the_oldest_open_one() {
    // IDEM-CTR-2 IDEM-CTR-11
    let mut seq = CounterSequence::new("app-7", 42, 8, 254).unwrap();
    assert_eq!(seq.low_water(), 254);
    let a = seq.take().unwrap();
    let b = seq.take().unwrap();
    let c = seq.take().unwrap();
    assert_eq!((a, b, c), (254, 255, 0), "the numbers wrap at 2^bits");
    assert_eq!(seq.key(c), "app-7:42:0");
    assert_eq!(seq.key(u64::MAX), "app-7:42:18446744073709551615");
    assert_eq!(seq.key(1_000_200), "app-7:42:1000200");
    assert_eq!(seq.low_water(), 254);
    seq.done(b);
    assert_eq!(seq.low_water(), 254, "an older answer is still missing");
    seq.done(a);
    assert_eq!(seq.low_water(), 0);
    seq.done(c);
    assert_eq!(seq.low_water(), 1, "none open: the next number");
    // A restarted client continues where it stopped.
    let saved = serde_json::to_vec(&seq).unwrap();
    let mut again: CounterSequence = serde_json::from_slice(&saved).unwrap();
    assert_eq!(again.take(), Some(1));
    // All the way round (2^8 numbers) onto a number still open: refused, never handed out
    // again for a second request while the server may hold the first.
    let mut round = CounterSequence::new("app-7", 42, 8, 0).unwrap();
    let stuck = round.take().unwrap();
    for _ in 1..256 {
        let n = round.take().unwrap();
        round.done(n);
    }
    assert_eq!(round.take(), None, "number {stuck} is still open");
    assert_eq!(round.take(), None);
    round.done(stuck);
    assert_eq!(round.take(), Some(0));
    assert!(CounterSequence::new("no spaces", 1, 8, 0).is_err());
    assert!(CounterSequence::new("c", 1, 8, 256).is_err());
    assert!(CounterSequence::new("c", 1, 7, 0).is_err());
}

/// A request to `/forms` with `keys` (none: keyless).
fn form<'a>(keys: &'a [&'a [u8]], body: &'a str) -> Intake<'a> {
    Intake {
        principal: Some("alice"),
        method: "POST",
        route: "/forms",
        target: "/forms",
        keys,
        low_water: None,
        client: None,
        content_type: Some("application/json"),
        headers: &[],
        body: body.as_bytes(),
    }
}

fn keyless(policy: &Policy, body: &str) -> Request {
    policy.request(&form(&[], body), 5)
}

#[test]
fn derived_keys_make_two_identical_keyless_requests_one_and_a_header_still_wins() {
    // IDEM-DERIVE-4 IDEM-DERIVE-1
    let policy = Policy::new(engine())
        .with_fingerprint(FingerprintSpec {
            exclude: vec!["/sentAt".into()],
            ..FingerprintSpec::default()
        })
        .with_key_fallback(KeyFallback::Derived);
    assert!(
        policy.protects("POST", false),
        "keyless requests are guarded"
    );
    let mut store = MemoryStore::default();
    let mut first = keyless(&policy, r#"{"item":"a","sentAt":1}"#);
    assert!(first.key().key.starts_with(DERIVED_PREFIX));
    run(&mut first, &mut store, T0, "made");
    // A double submit, its timestamp changed: the same derived key, replayed.
    let r = refused(
        &mut keyless(&policy, r#"{"sentAt":2,"item":"a"}"#),
        &mut store,
        T0,
    );
    assert!(r.is_replay());
    // Another payload is another request.
    run(
        &mut keyless(&policy, r#"{"item":"b"}"#),
        &mut store,
        T0,
        "made b",
    );
    // The derived record lives in a scope of its own: an explicit key equal to the derived
    // one is a new request.
    let explicit = first.key().key.clone();
    let mut with_header = policy.request(
        &form(&[explicit.as_bytes()], r#"{"item":"a","sentAt":1}"#),
        6,
    );
    run(&mut with_header, &mut store, T0, "explicit");
}

#[test]
fn a_key_pointer_reads_the_key_from_the_body_and_refuses_a_body_without_one() {
    // IDEM-KEY-7
    let policy =
        Policy::new(engine()).with_key_fallback(KeyFallback::JsonPointer("/meta/key".into()));
    let mut store = MemoryStore::default();
    run(
        &mut keyless(&policy, r#"{"meta":{"key":"k-1"},"item":"a"}"#),
        &mut store,
        T0,
        "made",
    );
    let r = refused(
        &mut keyless(&policy, r#"{"meta":{"key":"k-1"},"item":"a"}"#),
        &mut store,
        T0,
    );
    assert!(r.is_replay());
    for (body, kind) in [
        (r#"{"item":"a"}"#, "urn:idem:problem:missing-key"),
        ("not json", "urn:idem:problem:missing-key"),
        (r#"{"meta":{"key":7}}"#, "urn:idem:problem:malformed-key"),
        (
            r#"{"meta":{"key":"bad\u0001key"}}"#,
            "urn:idem:problem:malformed-key",
        ),
    ] {
        let r = refused(&mut keyless(&policy, body), &mut store, T0);
        assert_eq!(r.status(), 400, "{body}");
        assert_eq!(problem_type(&r), kind, "{body}");
    }
}
