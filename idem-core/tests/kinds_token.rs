//! Server-issued one-time tokens: issue, consume once, replay, forged, unknown and expired
//! tokens, and a real race for one token.
use idem_core::*;
use std::cell::Cell;
use std::sync::{Arc, Barrier, Mutex};
use std::time::Duration;

mod common;

const T0: u64 = 1_700_000_000_000;
const SECRET: TokenSecret = TokenSecret([7; 32]);

const ALICE: Target<'static> = Target {
    principal: Some("alice"),
    method: "POST",
    route: "/pay",
};

/// A host whose keys are tokens it issues, valid for an hour.
fn policy_with(secret: TokenSecret, ttl: Duration) -> Result<Policy, KindConfigError> {
    Policy::new(Engine::default()).with_keys(KeyKind::Token { secret, ttl })
}

fn policy() -> Policy {
    policy_with(SECRET, Duration::from_secs(3600)).unwrap()
}

fn ok(body: &str) -> Outcome {
    Outcome::Final(StoredResponse {
        status: 200,
        headers: vec![],
        body: body.as_bytes().to_vec(),
    })
}

/// A store that counts reads, to show that forged tokens never reach it.
struct Counting {
    inner: MemoryStore,
    loads: Cell<u32>,
}

impl Store for Counting {
    type Error = MemoryStoreError;
    fn load(&self, key: &RecordKey) -> Result<Option<Record>, MemoryStoreError> {
        self.loads.set(self.loads.get() + 1);
        self.inner.load(key)
    }
    fn apply(&mut self, now: UnixMillis, write: Write) -> Result<Applied, MemoryStoreError> {
        self.inner.apply(now, write)
    }
}

/// The token document a finished issuing answered with: the token and its expiry.
fn document(req: &Request) -> (String, UnixMillis) {
    let reply = req.reply().unwrap();
    assert_eq!(reply.status(), 201);
    let v: serde_json::Value = serde_json::from_slice(reply.body()).unwrap();
    (
        v["token"].as_str().unwrap().to_owned(),
        UnixMillis(v["expiresAt"].as_u64().unwrap()),
    )
}

/// Issues a token for `target`'s requests at `now` with the token operation over `store`.
fn issue_for(
    policy: &Policy,
    target: &Target<'_>,
    store: &mut impl Store<Error = MemoryStoreError>,
    now: UnixMillis,
    random: [u64; 2],
) -> String {
    let mut req = policy.issue_token(target, now, random);
    assert_eq!(
        req.drive(store, now, &mut Waiters::default()).unwrap(),
        Step::Reply
    );
    document(&req).0
}

fn issue(store: &mut impl Store<Error = MemoryStoreError>, now: UnixMillis, r: u64) -> String {
    issue_for(
        &policy(),
        &ALICE,
        store,
        now,
        [r, r.rotate_left(29) ^ 0xabcdef],
    )
}

/// A token issued for alice and never stored.
fn lost(policy: &Policy, now: UnixMillis, random: [u64; 2]) -> String {
    issue_for(policy, &ALICE, &mut MemoryStore::default(), now, random)
}

/// The machine of alice's request that presents `token` with `body`.
fn request(policy: &Policy, token: &str, body: &str, nonce: u64) -> Request {
    policy.request(
        &Intake {
            principal: Some("alice"),
            method: "POST",
            route: "/pay",
            target: "/pay",
            keys: &[token.as_bytes()],
            low_water: None,
            client: None,
            content_type: Some("application/json"),
            headers: &[],
            body: body.as_bytes(),
        },
        nonce,
    )
}

/// Alice's request with `token` and `body`, claimed at `now`: its machine and its claim.
fn claim(
    policy: &Policy,
    store: &mut impl Store<Error = MemoryStoreError>,
    now: UnixMillis,
    token: &str,
    body: &str,
    nonce: u64,
) -> (Request, Claimed) {
    let mut req = request(policy, token, body, nonce);
    let claimed = common::claim(&mut req, store, now).unwrap();
    (req, claimed)
}

#[test]
fn issued_tokens_are_valid_keys_with_an_expiry() {
    // IDEM-TOKEN-1 IDEM-KIND-1
    let policy = policy();
    let now = UnixMillis(T0);
    let mut store = MemoryStore::default();
    let mut waiters = Waiters::default();
    let mut issuing = policy.issue_token(&ALICE, now, [1, 2]);
    assert_eq!(issuing.operation(), Operation::IssueToken);
    // The token's record is written before the token is handed out.
    let Step::Apply(write) = issuing.poll(now, &mut waiters) else {
        panic!("the token is stored first")
    };
    let applied = store.apply(now, write.clone()).unwrap();
    issuing.handle_applied(now, applied, &mut waiters);
    assert_eq!(issuing.poll(now, &mut waiters), Step::Reply);
    let (token, expires) = document(&issuing);
    assert_eq!(token.len(), TOKEN_LEN);
    assert!(token.starts_with(TOKEN_PREFIX));
    assert_eq!(expires, UnixMillis(T0 + 3_600_000));
    assert_eq!(
        parse_opaque_strict(format!("\"{token}\"").as_bytes()).unwrap(),
        token
    );
    assert_eq!(parse_opaque_lenient(token.as_bytes()).unwrap(), token);
    assert_eq!(write.precondition, Precondition::Absent);
    let WriteOp::Put(record) = &write.op else {
        panic!()
    };
    assert_eq!(record.state, RecordState::Issued { expires });
    assert_eq!(record.key_expires, expires);
    assert_ne!(
        write.key.scope,
        policy.scope(Some("alice"), "POST", "/pay").unwrap(),
        "tokens live in their own scope"
    );
    // Other random bytes, another token; the same inputs, the same token.
    assert_ne!(lost(&policy, now, [1, 3]), token);
    assert_eq!(lost(&policy, now, [1, 2]), token);
    // The record survives the codec.
    assert_eq!(&decode_record(&encode_record(record)).unwrap(), record);
    // The secret does not show in logs.
    assert_eq!(format!("{SECRET:?}"), "TokenSecret(..)");
    // The token is a key its scope's requests run with.
    let (mut req, Claimed::Execute { .. }) = claim(&policy, &mut store, now, &token, "{}", 1)
    else {
        panic!("an issued token runs")
    };
    assert_eq!(req.key(), &write.key);
    assert_eq!(common::events(&mut req), [Event::Executed]);
}

#[test]
fn ttl_is_bounded_by_the_key_retention() {
    // IDEM-TOKEN-1
    let ttl = Engine::default().config().key_ttl;
    assert_eq!(
        policy_with(SECRET, ttl + Duration::from_secs(1)).unwrap_err(),
        KindConfigError::ExceedsKeyRetention("token ttl")
    );
    assert!(matches!(
        policy_with(SECRET, Duration::ZERO),
        Err(KindConfigError::ZeroDuration(_))
    ));
    assert!(policy_with(SECRET, ttl).is_ok());
}

#[test]
fn the_first_presentation_consumes_the_token_and_later_ones_are_retries() {
    // IDEM-TOKEN-2
    let policy = policy();
    let mut store = MemoryStore::default();
    let now = UnixMillis(T0);
    let token = issue(&mut store, now, 11);
    let (mut first, Claimed::Execute { hold, recovered }) =
        claim(&policy, &mut store, now, &token, r#"{"amount":5}"#, 1)
    else {
        panic!()
    };
    assert!(!recovered);
    assert_eq!(hold.fence(), 1);
    assert_eq!(
        claim(&policy, &mut store, now, &token, r#"{"amount":5}"#, 2).1,
        Claimed::Done(Decision::InProgress {
            // The default bound on the time left of a 60 s lease (IDEM-CONC-4).
            retry_after_secs: 2
        })
    );
    assert_eq!(
        common::finish(&mut first, &mut store, now, ok("paid")).unwrap(),
        Finish::Stored
    );
    // Replayed, even after the token itself would have expired.
    for later in [0, 3_600_000, 3_600_001, 20 * 3_600_000] {
        let at = UnixMillis(T0 + later);
        match claim(&policy, &mut store, at, &token, r#"{ "amount": 5 }"#, 3).1 {
            Claimed::Done(Decision::Replay(r)) => assert_eq!(r.body, b"paid"),
            other => panic!("{later}: {other:?}"),
        }
    }
    match claim(&policy, &mut store, now, &token, r#"{"amount":6}"#, 4).1 {
        Claimed::Done(d @ Decision::Mismatch { .. }) => {
            assert_eq!(d.problem(), Some(Problem::MISMATCH))
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_token_released_for_a_retry_can_be_presented_again() {
    // IDEM-TOKEN-2: a later presentation is a retry, decided as for an opaque key, which runs
    // again after its attempt was released (a 429, a 503 the handler chose to answer).
    let policy = policy();
    let mut store = MemoryStore::default();
    let now = UnixMillis(T0);
    let token = issue(&mut store, now, 21);
    let (mut first, Claimed::Execute { .. }) =
        claim(&policy, &mut store, now, &token, r#"{"amount":5}"#, 1)
    else {
        panic!("the first presentation consumes the token")
    };
    assert_eq!(
        common::finish(&mut first, &mut store, now, Outcome::Retryable).unwrap(),
        Finish::Released
    );
    let later = UnixMillis(T0 + 1_000);
    let (mut retry, claimed) = claim(&policy, &mut store, later, &token, r#"{"amount":5}"#, 2);
    let Claimed::Execute { recovered, .. } = claimed else {
        panic!("the retry runs: {claimed:?}")
    };
    assert!(!recovered);
    assert_eq!(
        common::finish(&mut retry, &mut store, later, ok("paid")).unwrap(),
        Finish::Stored
    );
    match claim(&policy, &mut store, later, &token, r#"{"amount":5}"#, 3).1 {
        Claimed::Done(Decision::Replay(r)) => assert_eq!(r.body, b"paid"),
        other => panic!("{other:?}"),
    }
    // Released and never presented again, it expires with the token itself.
    let token = issue(&mut store, now, 22);
    let (mut first, _) = claim(&policy, &mut store, now, &token, "{}", 4);
    common::finish(&mut first, &mut store, now, Outcome::Retryable).unwrap();
    assert_eq!(
        claim(
            &policy,
            &mut store,
            UnixMillis(T0 + 3_600_000),
            &token,
            "{}",
            5
        )
        .1,
        Claimed::Done(Decision::Rejected(RejectReason::TokenExpired))
    );
}

#[test]
fn forged_tokens_are_refused_without_reading_the_store() {
    // IDEM-TOKEN-3
    let policy = policy();
    let mut store = Counting {
        inner: MemoryStore::default(),
        loads: Cell::new(0),
    };
    let now = UnixMillis(T0);
    let token = issue(&mut store, now, 12);
    let other_secret = policy_with(TokenSecret([8; 32]), Duration::from_secs(3600)).unwrap();
    let foreign = lost(&other_secret, now, [12, 13]);
    let bob = Target {
        principal: Some("bob"),
        ..ALICE
    };
    let other_scope = issue_for(&policy, &bob, &mut MemoryStore::default(), now, [12, 13]);
    let mut flipped = token.clone().into_bytes();
    let last = flipped.len() - 1;
    flipped[last] = if flipped[last] == b'0' { b'1' } else { b'0' };
    let mut flipped_expiry = token.clone().into_bytes();
    flipped_expiry[TOKEN_PREFIX.len() + 40] ^= 1;
    let forged = [
        "tok_".into(),
        "hello".into(),
        token[..TOKEN_LEN - 1].to_string(),
        format!("{token}0"),
        token.to_uppercase(),
        token.replace("tok_", "tok-"),
        String::from_utf8(flipped).unwrap(),
        String::from_utf8(flipped_expiry).unwrap(),
        foreign,
        other_scope,
        format!("tok_{}", "g".repeat(64)),
    ];
    for f in &forged {
        let (mut req, claim) = claim(&policy, &mut store, now, f, "{}", 1);
        let Claimed::Done(d) = claim else {
            panic!("a forged token executed: {f:?}")
        };
        assert_eq!(d, Decision::Rejected(RejectReason::TokenForged), "{f:?}");
        assert_eq!(d.problem(), Some(Problem::TOKEN_FORGED));
        assert_eq!(d.problem().unwrap().status, 400);
        let [event] = common::events(&mut req)[..] else {
            panic!("one event")
        };
        assert_eq!(event, Event::Forged);
        assert!(event.is_security_relevant());
    }
    // An empty key is refused before it is a token at all.
    let mut empty = request(&policy, "", "{}", 1);
    assert_eq!(
        empty.drive(&mut store, now, &mut Waiters::default()),
        Ok(Step::Reply)
    );
    assert_eq!(empty.refusal().unwrap().problem, Problem::MISSING_KEY);
    assert_eq!(store.loads.get(), 0, "no forged token reached the store");
    // The real one still works.
    assert!(matches!(
        claim(&policy, &mut store, now, &token, "{}", 1).1,
        Claimed::Execute { .. }
    ));
}

#[test]
fn unknown_and_expired_tokens_are_refused() {
    // IDEM-TOKEN-4
    let policy = policy();
    let mut store = MemoryStore::default();
    let now = UnixMillis(T0);
    // Issued but never stored: authentic, unknown.
    let lost = lost(&policy, now, [21, 22]);
    let Claimed::Done(d) = claim(&policy, &mut store, now, &lost, "{}", 1).1 else {
        panic!()
    };
    assert_eq!(d, Decision::Rejected(RejectReason::TokenUnknown));
    assert_eq!(d.problem(), Some(Problem::TOKEN_UNKNOWN));
    assert_eq!(d.problem().unwrap().status, 400);
    // Stored and not used: refused from its expiry on, whether or not the store swept it.
    let token = issue(&mut store, now, 23);
    let expiry = UnixMillis(T0 + 3_600_000);
    for (at, sweep) in [
        (expiry, false),
        (UnixMillis(T0 + 3_600_001), false),
        (UnixMillis(T0 + 7_200_000), true),
    ] {
        if sweep {
            store.sweep(at);
            assert_eq!(store.stats().entries, 0);
        }
        let Claimed::Done(d) = claim(&policy, &mut store, at, &token, "{}", 1).1 else {
            panic!("an expired token executed")
        };
        assert_eq!(d, Decision::Rejected(RejectReason::TokenExpired));
        assert_eq!(d.problem(), Some(Problem::TOKEN_EXPIRED));
        assert_eq!(d.problem().unwrap().status, 410);
    }
    // The lost token expires too.
    assert_eq!(
        claim(&policy, &mut store, expiry, &lost, "{}", 1).1,
        Claimed::Done(Decision::Rejected(RejectReason::TokenExpired))
    );
    // An issued record is refused past its expiry, whatever the record's own retention
    // says (a store that keeps it longer).
    let mut store = MemoryStore::default();
    let mut waiters = Waiters::default();
    let mut issuing = policy.issue_token(&ALICE, now, [31, 32]);
    let Step::Apply(mut write) = issuing.poll(now, &mut waiters) else {
        panic!()
    };
    let WriteOp::Put(record) = &mut write.op else {
        panic!()
    };
    record.key_expires = UnixMillis(u64::MAX);
    let applied = store.apply(now, write).unwrap();
    issuing.handle_applied(now, applied, &mut waiters);
    let (kept, _) = document(&issuing);
    assert_eq!(
        claim(&policy, &mut store, expiry, &kept, "{}", 1).1,
        Claimed::Done(Decision::Rejected(RejectReason::TokenExpired))
    );
}

#[test]
fn racing_presentations_consume_a_token_once() {
    // IDEM-TOKEN-2
    struct Shared(Arc<Mutex<MemoryStore>>);
    impl Store for Shared {
        type Error = MemoryStoreError;
        fn load(&self, key: &RecordKey) -> Result<Option<Record>, MemoryStoreError> {
            self.0.lock().unwrap().load(key)
        }
        fn apply(&mut self, now: UnixMillis, write: Write) -> Result<Applied, MemoryStoreError> {
            self.0.lock().unwrap().apply(now, write)
        }
    }
    for round in 0..50u64 {
        let policy = policy();
        let shared = Arc::new(Mutex::new(MemoryStore::default()));
        let now = UnixMillis(T0);
        let token = issue(&mut Shared(Arc::clone(&shared)), now, round);
        let n = 8;
        let barrier = Arc::new(Barrier::new(n));
        let handles: Vec<_> = (0..n)
            .map(|i| {
                let (policy, token, barrier) =
                    (policy.clone(), token.clone(), Arc::clone(&barrier));
                let mut store = Shared(Arc::clone(&shared));
                std::thread::spawn(move || {
                    let mut req = request(&policy, &token, "{}", i as u64);
                    barrier.wait();
                    common::claim(&mut req, &mut store, now).unwrap()
                })
            })
            .collect();
        let claims: Vec<Claimed> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        let executed = claims
            .iter()
            .filter(|c| matches!(c, Claimed::Execute { .. }))
            .count();
        assert_eq!(executed, 1, "{claims:?}");
        assert!(claims.iter().all(|c| matches!(
            c,
            Claimed::Execute { .. } | Claimed::Done(Decision::InProgress { .. })
        )));
    }
}
