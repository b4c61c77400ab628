//! What a host needs beside the request machine for the key kinds with state of their own:
//! the scope of a route, issuing a token, and opening a counter session as a sans-IO machine,
//! then requests of those kinds through the same machine as opaque keys.
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

fn request(policy: &Policy, key: &str, low_water: Option<&str>, body: &str) -> Request<'static> {
    policy.request(
        &Intake {
            principal: Some("alice"),
            method: "POST",
            route: "/transfers",
            target: "/transfers",
            keys: &[key.as_bytes()],
            low_water,
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
fn run(req: &mut Request<'_>, store: &mut MemoryStore, now: UnixMillis, body: &str) {
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

fn refused(req: &mut Request<'_>, store: &mut MemoryStore, now: UnixMillis) -> Reply {
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

#[test]
fn a_session_opens_by_machine_and_its_counter_keys_run_through_the_request_machine() {
    // IDEM-CTR-3 IDEM-CTR-5 IDEM-CTR-6 IDEM-CTR-11
    let policy = counters(8, 4);
    let scope = policy.scope(Some("alice"), "POST", "/transfers").unwrap();
    let mut store = MemoryStore::default();
    // Without a session the client is unknown.
    let r = refused(&mut request(&policy, "c1:5:0", None, "{}"), &mut store, T0);
    assert_eq!(problem_type(&r), "urn:idem:problem:unknown-client");

    let mut opening = policy.open_session(&scope, "c1", 0, 0xfeed).unwrap();
    let OpenStep::Load(key) = opening.poll() else {
        panic!("reads first")
    };
    assert_eq!(key, opening.key());
    opening.handle_record(T0, store.load(&key).unwrap().as_ref());
    let OpenStep::Apply(write) = opening.poll() else {
        panic!("then writes")
    };
    // Polling again before the result asks for the same write.
    assert_eq!(opening.poll(), OpenStep::Apply(write.clone()));
    opening.handle_applied(store.apply(T0, write).unwrap());
    let OpenStep::Opened(epoch) = opening.poll() else {
        panic!("open")
    };

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
    let next = open(&policy, &mut store, &scope, "c1");
    assert_eq!(next, epoch.wrapping_add(1));
    let r = refused(
        &mut request(&policy, &format!("c1:{epoch}:2"), None, "{}"),
        &mut store,
        T0,
    );
    assert_eq!(problem_type(&r), "urn:idem:problem:stale-epoch");
}

/// Drives a session opening on a MemoryStore.
fn open(policy: &Policy, store: &mut MemoryStore, scope: &Scope, client: &str) -> u64 {
    let mut opening = policy
        .open_session(scope, client, 0, 99)
        .expect("counter keys");
    loop {
        match opening.poll() {
            OpenStep::Load(key) => {
                let stored = store.load(&key).unwrap();
                opening.handle_record(T0, stored.as_ref());
            }
            OpenStep::Apply(write) => {
                let applied = store.apply(T0, write).unwrap();
                opening.handle_applied(applied);
            }
            OpenStep::Opened(epoch) => return epoch,
            OpenStep::Failed(e) => panic!("{e}"),
        }
    }
}

#[test]
fn an_opening_that_keeps_losing_races_gives_up_as_contended() {
    // IDEM-CTR-12
    let policy = counters(32, 8);
    let scope = policy.scope(None, "POST", "/transfers").unwrap();
    let mut opening = policy.open_session(&scope, "c1", 0, 1).unwrap();
    let mut rounds = 0;
    let error = loop {
        match opening.poll() {
            OpenStep::Load(_) => opening.handle_record(T0, None),
            OpenStep::Apply(_) => {
                rounds += 1;
                opening.handle_applied(Applied::Conflict);
            }
            OpenStep::Opened(_) => panic!("never applied"),
            OpenStep::Failed(e) => break e,
        }
    };
    assert_eq!(error, CounterError::Contended);
    assert_eq!(rounds, MAX_COMPLETION_ROUNDS);
    let refusal = Refusal::session(&error);
    assert_eq!(
        (refusal.problem.status, refusal.retry_after),
        (409, Some(1))
    );
    // A bad client id or first number is the client's error: 400.
    let mut bad = policy.open_session(&scope, "no spaces", 0, 1).unwrap();
    bad.handle_record(T0, None);
    let OpenStep::Failed(e) = bad.poll() else {
        panic!("refused")
    };
    assert_eq!(Refusal::session(&e).problem, Problem::MALFORMED_KEY);
    assert_eq!(Refusal::session(&e).requirement, "IDEM-CTR-1");
}

#[test]
fn a_token_is_issued_for_a_scope_and_consumed_once_through_the_request_machine() {
    // IDEM-TOKEN-1 IDEM-TOKEN-2 IDEM-TOKEN-3
    let policy = tokens();
    let mut store = MemoryStore::default();
    let scope = policy.scope(Some("alice"), "POST", "/transfers").unwrap();
    let issued = policy.issue_token(T0, &scope, [1, 2]).unwrap();
    assert_eq!(issued.expires, UnixMillis(T0.0 + 20_000));
    assert_eq!(store.apply(T0, issued.write).unwrap(), Applied::Applied);
    run(
        &mut request(&policy, &issued.token, None, "{}"),
        &mut store,
        T0,
        "paid",
    );
    let r = refused(
        &mut request(&policy, &issued.token, None, "{}"),
        &mut store,
        T0,
    );
    assert!(r.is_replay());
    // A token issued for another principal's scope does not verify here.
    let other = policy
        .issue_token(
            T0,
            &policy.scope(Some("bob"), "POST", "/transfers").unwrap(),
            [3, 4],
        )
        .unwrap();
    assert_eq!(store.apply(T0, other.write).unwrap(), Applied::Applied);
    let r = refused(
        &mut request(&policy, &other.token, None, "{}"),
        &mut store,
        T0,
    );
    assert_eq!(problem_type(&r), "urn:idem:problem:token-forged");
}

#[test]
fn only_the_kind_that_has_them_issues_tokens_or_opens_sessions() {
    let opaque = Policy::new(engine());
    let scope = opaque.scope(None, "POST", "/orders").unwrap();
    assert!(opaque.issue_token(T0, &scope, [1, 2]).is_none());
    assert!(opaque.open_session(&scope, "c1", 0, 1).is_none());
    assert!(tokens().open_session(&scope, "c1", 0, 1).is_none());
    assert!(counters(32, 8).issue_token(T0, &scope, [1, 2]).is_none());
}

#[test]
fn a_client_sequence_never_reuses_an_open_number_and_its_mark_trails_the_oldest_open_one() {
    // IDEM-CTR-2 IDEM-CTR-11
    let mut seq = CounterSequence::new("app-7", 42, 8, 254).unwrap();
    assert_eq!(seq.low_water(), 254);
    let a = seq.take();
    let b = seq.take();
    let c = seq.take();
    assert_eq!((a, b, c), (254, 255, 0), "the numbers wrap at 2^bits");
    assert_eq!(seq.key(c), "app-7:42:0");
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
    assert_eq!(again.take(), 1);
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
        content_type: Some("application/json"),
        headers: &[],
        body: body.as_bytes(),
    }
}

fn keyless(policy: &Policy, body: &str) -> Request<'static> {
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
