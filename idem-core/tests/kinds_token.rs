//! Server-issued one-time tokens: issue, consume once, replay, forged, unknown and expired
//! tokens, and a real race for one token.
use idem_core::*;
use std::cell::Cell;
use std::sync::{Arc, Barrier, Mutex};
use std::time::Duration;

const T0: u64 = 1_700_000_000_000;
const SECRET: TokenSecret = TokenSecret([7; 32]);

fn fp(body: &str) -> Fingerprint {
    FingerprintSpec::default()
        .fingerprint(&RequestParts {
            method: "POST",
            target: "/pay",
            content_type: Some("application/json"),
            headers: &[],
            body: body.as_bytes(),
        })
        .unwrap()
}

fn tokens() -> Tokens {
    Tokens::new(Engine::default(), SECRET, Duration::from_secs(3600)).unwrap()
}

fn scope() -> Scope {
    Scope::new("alice", "POST", "/pay")
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

fn issue(
    t: &Tokens,
    store: &mut impl Store<Error = MemoryStoreError>,
    now: UnixMillis,
    r: u64,
) -> String {
    let issued = t.issue(now, &scope(), [r, r.rotate_left(29) ^ 0xabcdef]);
    assert_eq!(store.apply(now, issued.write).unwrap(), Applied::Applied);
    issued.token
}

#[test]
fn issued_tokens_are_valid_keys_with_an_expiry() {
    // IDEM-TOKEN-1 IDEM-KIND-1
    let t = tokens();
    let now = UnixMillis(T0);
    let issued = t.issue(now, &scope(), [1, 2]);
    assert_eq!(issued.token.len(), TOKEN_LEN);
    assert!(issued.token.starts_with(TOKEN_PREFIX));
    assert_eq!(issued.expires, UnixMillis(T0 + 3_600_000));
    assert_eq!(
        parse_opaque_strict(format!("\"{}\"", issued.token).as_bytes()).unwrap(),
        issued.token
    );
    assert_eq!(
        parse_opaque_lenient(issued.token.as_bytes()).unwrap(),
        issued.token
    );
    assert_eq!(t.verify(&scope(), &issued.token), Ok(issued.expires));
    assert_eq!(issued.write.precondition, Precondition::Absent);
    let WriteOp::Put(record) = &issued.write.op else {
        panic!()
    };
    assert_eq!(
        record.state,
        RecordState::Issued {
            expires: issued.expires
        }
    );
    assert_eq!(record.key_expires, issued.expires);
    assert_ne!(
        issued.write.key.scope,
        scope(),
        "tokens live in their own scope"
    );
    // Other random bytes, another token; the same inputs, the same token.
    assert_ne!(t.issue(now, &scope(), [1, 3]).token, issued.token);
    assert_eq!(t.issue(now, &scope(), [1, 2]).token, issued.token);
    // The record survives the codec.
    assert_eq!(&decode_record(&encode_record(record)).unwrap(), record);
    // The secret does not show in logs.
    assert_eq!(format!("{SECRET:?}"), "TokenSecret(..)");
}

#[test]
fn ttl_is_bounded_by_the_key_retention() {
    // IDEM-TOKEN-1
    let e = Engine::default();
    let ttl = e.config().key_ttl;
    assert_eq!(
        Tokens::new(e.clone(), SECRET, ttl + Duration::from_secs(1)).unwrap_err(),
        KindConfigError::ExceedsKeyRetention("token ttl")
    );
    assert!(matches!(
        Tokens::new(e.clone(), SECRET, Duration::ZERO),
        Err(KindConfigError::ZeroDuration(_))
    ));
    assert!(Tokens::new(e, SECRET, ttl).is_ok());
}

#[test]
fn the_first_presentation_consumes_the_token_and_later_ones_are_retries() {
    // IDEM-TOKEN-2
    let t = tokens();
    let engine = t.engine().clone();
    let mut store = MemoryStore::default();
    let now = UnixMillis(T0);
    let token = issue(&t, &mut store, now, 11);
    let Claim::Execute { lease, recovered } = t
        .claim(&mut store, now, &scope(), &token, &fp(r#"{"amount":5}"#), 1)
        .unwrap()
    else {
        panic!()
    };
    assert!(!recovered);
    assert_eq!(lease.fence, 1);
    assert_eq!(
        t.claim(&mut store, now, &scope(), &token, &fp(r#"{"amount":5}"#), 2)
            .unwrap(),
        Claim::Done(Decision::InProgress {
            // The default bound on the time left of a 60 s lease (IDEM-CONC-4).
            retry_after_secs: 2
        })
    );
    assert_eq!(
        store.finish(&engine, now, &lease, ok("paid")).unwrap(),
        Finish::Stored
    );
    // Replayed, even after the token itself would have expired.
    for later in [0, 3_600_000, 3_600_001, 20 * 3_600_000] {
        let at = UnixMillis(T0 + later);
        match t
            .claim(
                &mut store,
                at,
                &scope(),
                &token,
                &fp(r#"{ "amount": 5 }"#),
                3,
            )
            .unwrap()
        {
            Claim::Done(Decision::Replay(r)) => assert_eq!(r.body, b"paid"),
            other => panic!("{later}: {other:?}"),
        }
    }
    match t
        .claim(&mut store, now, &scope(), &token, &fp(r#"{"amount":6}"#), 4)
        .unwrap()
    {
        Claim::Done(d @ Decision::Mismatch { .. }) => {
            assert_eq!(d.problem(), Some(Problem::MISMATCH))
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn forged_tokens_are_refused_without_reading_the_store() {
    // IDEM-TOKEN-3
    let t = tokens();
    let mut store = Counting {
        inner: MemoryStore::default(),
        loads: Cell::new(0),
    };
    let now = UnixMillis(T0);
    let token = issue(&t, &mut store, now, 12);
    let other_secret = Tokens::new(
        Engine::default(),
        TokenSecret([8; 32]),
        Duration::from_secs(3600),
    )
    .unwrap();
    let foreign = other_secret.issue(now, &scope(), [12, 13]).token;
    let other_scope = t
        .issue(now, &Scope::new("bob", "POST", "/pay"), [12, 13])
        .token;
    let mut flipped = token.clone().into_bytes();
    let last = flipped.len() - 1;
    flipped[last] = if flipped[last] == b'0' { b'1' } else { b'0' };
    let mut flipped_expiry = token.clone().into_bytes();
    flipped_expiry[TOKEN_PREFIX.len() + 40] ^= 1;
    let forged = [
        String::new(),
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
        let claim = t.claim(&mut store, now, &scope(), f, &fp("{}"), 1).unwrap();
        let Claim::Done(d) = claim else {
            panic!("a forged token executed: {f:?}")
        };
        assert_eq!(d, Decision::Rejected(RejectReason::TokenForged), "{f:?}");
        assert_eq!(d.problem(), Some(Problem::TOKEN_FORGED));
        assert_eq!(d.problem().unwrap().status, 400);
        assert_eq!(d.event(), Event::Forged);
        assert!(d.event().is_security_relevant());
    }
    assert_eq!(store.loads.get(), 0, "no forged token reached the store");
    // The engine-level decision agrees.
    let key = t.record_key(&scope(), "tok_x");
    let f = fp("{}");
    let attempt = Attempt {
        key: &key,
        fingerprint: &f,
        nonce: 1,
    };
    assert_eq!(
        t.decide(now, &scope(), "tok_x", &attempt, None),
        Decision::Rejected(RejectReason::TokenForged)
    );
    // The real one still works.
    assert!(matches!(
        t.claim(&mut store, now, &scope(), &token, &fp("{}"), 1)
            .unwrap(),
        Claim::Execute { .. }
    ));
}

#[test]
fn unknown_and_expired_tokens_are_refused() {
    // IDEM-TOKEN-4
    let t = tokens();
    let mut store = MemoryStore::default();
    let now = UnixMillis(T0);
    // Issued but never stored: authentic, unknown.
    let lost = t.issue(now, &scope(), [21, 22]).token;
    let Claim::Done(d) = t
        .claim(&mut store, now, &scope(), &lost, &fp("{}"), 1)
        .unwrap()
    else {
        panic!()
    };
    assert_eq!(d, Decision::Rejected(RejectReason::TokenUnknown));
    assert_eq!(d.problem(), Some(Problem::TOKEN_UNKNOWN));
    assert_eq!(d.problem().unwrap().status, 400);
    // Stored and not used: refused from its expiry on, whether or not the store swept it.
    let token = issue(&t, &mut store, now, 23);
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
        let Claim::Done(d) = t
            .claim(&mut store, at, &scope(), &token, &fp("{}"), 1)
            .unwrap()
        else {
            panic!("an expired token executed")
        };
        assert_eq!(d, Decision::Rejected(RejectReason::TokenExpired));
        assert_eq!(d.problem(), Some(Problem::TOKEN_EXPIRED));
        assert_eq!(d.problem().unwrap().status, 410);
    }
    // The lost token expires too.
    assert_eq!(
        t.claim(&mut store, expiry, &scope(), &lost, &fp("{}"), 1)
            .unwrap(),
        Claim::Done(Decision::Rejected(RejectReason::TokenExpired))
    );
    // The engine itself refuses an issued record past its expiry.
    let issued = t.issue(now, &scope(), [31, 32]);
    let WriteOp::Put(record) = issued.write.op.clone() else {
        panic!()
    };
    let stale = Record {
        key_expires: UnixMillis(u64::MAX),
        ..record
    };
    let f = fp("{}");
    let attempt = Attempt {
        key: &issued.write.key,
        fingerprint: &f,
        nonce: 1,
    };
    assert_eq!(
        Engine::default().decide(expiry, &attempt, Some(&stale)),
        Decision::Rejected(RejectReason::TokenExpired)
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
        let t = tokens();
        let shared = Arc::new(Mutex::new(MemoryStore::default()));
        let now = UnixMillis(T0);
        let token = issue(&t, &mut Shared(Arc::clone(&shared)), now, round);
        let n = 8;
        let barrier = Arc::new(Barrier::new(n));
        let handles: Vec<_> = (0..n)
            .map(|i| {
                let (t, token, barrier) = (t.clone(), token.clone(), Arc::clone(&barrier));
                let mut store = Shared(Arc::clone(&shared));
                std::thread::spawn(move || {
                    barrier.wait();
                    t.claim(&mut store, now, &scope(), &token, &fp("{}"), i as u64)
                        .unwrap()
                })
            })
            .collect();
        let claims: Vec<Claim> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        let executed = claims
            .iter()
            .filter(|c| matches!(c, Claim::Execute { .. }))
            .count();
        assert_eq!(executed, 1, "{claims:?}");
        assert!(claims.iter().all(|c| matches!(
            c,
            Claim::Execute { .. } | Claim::Done(Decision::InProgress { .. })
        )));
    }
}
