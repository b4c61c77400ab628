//! Unix-time keys: parsing, the window around `now`, collisions, retries, and a model test
//! with clock jumps and purges.
use idem_core::*;
use proptest::prelude::*;
use std::collections::HashMap;
use std::time::Duration;

mod common;

const T0: u64 = 1_700_000_000_000;

/// A host whose keys are client timestamps, over `engine`.
fn policy_with(engine: Engine, config: TimeKeyConfig) -> Result<Policy, KindConfigError> {
    Policy::new(engine).with_keys(KeyKind::Time(config))
}

fn policy() -> Policy {
    policy_with(Engine::default(), TimeKeyConfig::default()).unwrap()
}

/// The key as a client sends it.
fn text(key: &TimeKey) -> String {
    match &key.client {
        Some(client) => format!("{client}:{}", key.at.0),
        None => key.at.0.to_string(),
    }
}

/// The machine of a request from `principal` with the time key `key` and `body`.
fn request(policy: &Policy, principal: &str, key: &str, body: &str, nonce: u64) -> Request {
    policy.request(
        &Intake {
            principal: Some(principal),
            method: "POST",
            route: "/orders",
            target: "/orders",
            keys: &[key.as_bytes()],
            low_water: None,
            client: None,
            content_type: Some("application/json"),
            headers: &[],
            body: body.as_bytes(),
        },
        nonce,
    )
}

/// A request from alice with `key` and `body`, claimed at `now`: its machine and its claim.
fn claim(
    policy: &Policy,
    store: &mut MemoryStore,
    now: UnixMillis,
    key: &TimeKey,
    body: &str,
    nonce: u64,
) -> (Request, Claimed) {
    let mut req = request(policy, "alice", &text(key), body, nonce);
    let claimed = common::claim(&mut req, store, now).unwrap();
    (req, claimed)
}

fn response(body: &str) -> StoredResponse {
    StoredResponse {
        status: 201,
        headers: vec![],
        body: body.as_bytes().to_vec(),
    }
}

#[test]
fn parses_timestamps_with_and_without_client() {
    // IDEM-TIME-1
    assert_eq!(
        parse_time_key("1700000000000").unwrap(),
        TimeKey {
            client: None,
            at: UnixMillis(T0)
        }
    );
    assert_eq!(
        parse_time_key("dev-7.a_b~c:1700000000000").unwrap(),
        TimeKey {
            client: Some("dev-7.a_b~c".into()),
            at: UnixMillis(T0)
        }
    );
    assert_eq!(
        parse_time_key("18446744073709551615").unwrap().at,
        UnixMillis(u64::MAX)
    );
}

#[test]
fn refuses_bad_timestamps_with_a_clear_reason() {
    // IDEM-TIME-1
    let cases: &[(&str, KindKeyError)] = &[
        ("", KindKeyError::Empty),
        (
            "-1700000000000",
            KindKeyError::Negative { field: "timestamp" },
        ),
        ("c:-5", KindKeyError::Negative { field: "timestamp" }),
        (
            "+1700000000000",
            KindKeyError::NotNumeric { field: "timestamp" },
        ),
        (
            "17000000000a0",
            KindKeyError::NotNumeric { field: "timestamp" },
        ),
        ("1.5", KindKeyError::NotNumeric { field: "timestamp" }),
        ("1e12", KindKeyError::NotNumeric { field: "timestamp" }),
        (" 17", KindKeyError::NotNumeric { field: "timestamp" }),
        ("c:", KindKeyError::NotNumeric { field: "timestamp" }),
        ("c:1:2", KindKeyError::NotNumeric { field: "timestamp" }),
        (
            "18446744073709551616",
            KindKeyError::TooLarge { field: "timestamp" },
        ),
        (
            "99999999999999999999999999",
            KindKeyError::TooLarge { field: "timestamp" },
        ),
        (":1700000000000", KindKeyError::BadClientId),
        ("a b:1700000000000", KindKeyError::BadClientId),
        ("a/b:1700000000000", KindKeyError::BadClientId),
        ("é:1700000000000", KindKeyError::BadClientId),
    ];
    for (key, want) in cases {
        let err = parse_time_key(key).unwrap_err();
        assert_eq!(&err, want, "{key:?}");
        assert_eq!(err.problem(), Problem::MALFORMED_KEY);
        assert!(!err.to_string().is_empty());
    }
    let long = format!("{}:{T0}", "c".repeat(MAX_CLIENT_ID_LEN + 1));
    assert_eq!(parse_time_key(&long), Err(KindKeyError::BadClientId));
    let ok = format!("{}:{T0}", "c".repeat(MAX_CLIENT_ID_LEN));
    assert!(parse_time_key(&ok).is_ok());
}

#[test]
fn config_may_not_outlive_the_key_retention() {
    // IDEM-TIME-3
    let engine = Engine::default();
    let ttl = engine.config().key_ttl;
    let too_long = TimeKeyConfig {
        max_ahead: Duration::from_secs(60),
        max_age: ttl,
    };
    assert_eq!(
        policy_with(engine.clone(), too_long.clone()).unwrap_err(),
        KindConfigError::ExceedsKeyRetention("max_age + max_ahead")
    );
    let zero = TimeKeyConfig {
        max_ahead: Duration::from_secs(60),
        max_age: Duration::ZERO,
    };
    assert!(matches!(
        policy_with(engine.clone(), zero),
        Err(KindConfigError::ZeroDuration(_))
    ));
    let exact = TimeKeyConfig {
        max_ahead: Duration::from_secs(60),
        max_age: ttl - Duration::from_secs(60),
    };
    assert!(policy_with(engine.clone(), exact).is_ok());
    // A host whose settings come from elsewhere fits them to the retention instead.
    let fitted = too_long.fit(ttl);
    assert_eq!(fitted.max_ahead, Duration::from_secs(60));
    assert_eq!(fitted.max_age, ttl - Duration::from_secs(60));
    assert!(policy_with(engine, fitted).is_ok());
    let short = Duration::from_secs(4);
    let fitted = TimeKeyConfig::default().fit(short);
    assert_eq!(
        fitted.max_ahead,
        Duration::from_secs(1),
        "a quarter of the retention"
    );
    assert_eq!(fitted.max_age, Duration::from_secs(3), "what is left of it");
    let short_engine = Engine::new(Config {
        response_ttl: short,
        key_ttl: short,
        lease: Duration::from_secs(1),
        ..Config::default()
    })
    .unwrap();
    assert!(policy_with(short_engine.clone(), fitted).is_ok());
    // The same through a policy, with a token's validity too.
    let policy = |kind: KeyKind| Policy::new(short_engine.clone()).with_keys(kind.fit(short));
    assert!(policy(KeyKind::Time(TimeKeyConfig::default())).is_ok());
    assert!(policy(KeyKind::Token {
        secret: TokenSecret([1; 32]),
        ttl: Duration::from_secs(3600),
    })
    .is_ok());
    assert!(Policy::new(short_engine)
        .with_keys(KeyKind::Time(TimeKeyConfig::default()))
        .is_err());
}

#[test]
fn far_future_keys_are_refused_and_nothing_is_claimed() {
    // IDEM-TIME-2
    let policy = policy();
    let mut store = MemoryStore::default();
    let now = UnixMillis(T0);
    let skew = 5 * 60 * 1000;
    for ahead in [skew + 1, 3_600_000, u64::MAX - T0] {
        let key = TimeKey {
            client: None,
            at: UnixMillis(T0 + ahead),
        };
        let (mut req, claim) = claim(&policy, &mut store, now, &key, "{}", 1);
        let Claimed::Done(d) = claim else {
            panic!("executed a key from the future")
        };
        assert_eq!(
            d,
            Decision::Rejected(RejectReason::FromFuture { ahead_ms: ahead })
        );
        assert_eq!(d.problem(), Some(Problem::KEY_FROM_FUTURE));
        assert_eq!(d.problem().unwrap().status, 400);
        assert_eq!(common::events(&mut req), [Event::Rejected]);
    }
    // At the edge of the skew it runs.
    let edge = TimeKey {
        client: None,
        at: UnixMillis(T0 + skew),
    };
    assert!(matches!(
        claim(&policy, &mut store, now, &edge, "{}", 1).1,
        Claimed::Execute { .. }
    ));
    assert_eq!(store.stats().entries, 1);
}

#[test]
fn stale_keys_are_refused_and_never_run() {
    // IDEM-TIME-3
    let policy = policy();
    let mut store = MemoryStore::default();
    let now = UnixMillis(T0);
    let age = 24 * 3600 * 1000;
    for old in [0, 1, T0 - age, T0 - age - 1] {
        let key = TimeKey {
            client: Some("c1".into()),
            at: UnixMillis(old),
        };
        let (mut req, claim) = claim(&policy, &mut store, now, &key, "{}", 1);
        assert_eq!(
            claim,
            Claimed::Done(Decision::Rejected(RejectReason::Stale))
        );
        let Claimed::Done(d) = claim else {
            unreachable!()
        };
        assert_eq!(d.problem(), Some(Problem::KEY_STALE));
        assert_eq!(d.problem().unwrap().status, 412);
        let [event] = common::events(&mut req)[..] else {
            panic!("one event")
        };
        assert!(event.is_security_relevant());
    }
    assert_eq!(store.stats().entries, 0, "nothing was claimed");
    let young = TimeKey {
        client: Some("c1".into()),
        at: UnixMillis(T0 - age + 1),
    };
    assert!(matches!(
        claim(&policy, &mut store, now, &young, "{}", 1).1,
        Claimed::Execute { .. }
    ));
}

#[test]
fn a_purged_key_can_never_run_again() {
    // IDEM-TIME-3
    let policy = policy();
    let mut store = MemoryStore::default();
    let key = TimeKey {
        client: Some("c1".into()),
        at: UnixMillis(T0),
    };
    let now = UnixMillis(T0);
    let (mut first, Claimed::Execute { .. }) = claim(&policy, &mut store, now, &key, "{}", 9)
    else {
        panic!()
    };
    let _ = common::finish(&mut first, &mut store, now, Outcome::Final(response("a"))).unwrap();
    // Every later time, up to and past the purge of the record, refuses or replays.
    let ttl = policy.engine().config().key_ttl.as_millis() as u64;
    for later in [1, 3_600_000, 86_399_999, 86_400_000, ttl, ttl + 1, 10 * ttl] {
        let at = UnixMillis(T0 + later);
        store.sweep(at);
        match claim(&policy, &mut store, at, &key, "{}", 9).1 {
            Claimed::Done(Decision::Replay(r)) => assert_eq!(r.body, b"a"),
            Claimed::Done(Decision::Rejected(RejectReason::Stale | RejectReason::KeyExpired)) => {}
            other => panic!("{later}: {other:?}"),
        }
    }
    assert_eq!(store.stats().entries, 0, "the record was purged");
}

#[test]
fn a_different_payload_is_a_collision_never_replayed_never_run() {
    // IDEM-TIME-4
    let policy = policy();
    let mut store = MemoryStore::default();
    let now = UnixMillis(T0);
    let key = TimeKey {
        client: Some("c1".into()),
        at: UnixMillis(T0 - 10),
    };
    let (mut first, Claimed::Execute { .. }) =
        claim(&policy, &mut store, now, &key, r#"{"n":1}"#, 1)
    else {
        panic!()
    };
    let record = first.key().clone();
    // While the first is in flight: a collision, not "in progress".
    let other = claim(&policy, &mut store, now, &key, r#"{"n":2}"#, 2).1;
    assert_eq!(
        other,
        Claimed::Done(Decision::Rejected(RejectReason::Collision))
    );
    let before = store.get(&record).cloned();
    let _ = common::finish(
        &mut first,
        &mut store,
        now,
        Outcome::Final(response("first")),
    )
    .unwrap();
    let done = store.get(&record).cloned().unwrap();
    assert_ne!(Some(&done), before.as_ref());
    // After completion: still a collision, and the record is unchanged by it.
    let (mut again, Claimed::Done(d)) = claim(&policy, &mut store, now, &key, r#"{"n":2}"#, 2)
    else {
        panic!("a collision executed")
    };
    assert_eq!(d, Decision::Rejected(RejectReason::Collision));
    assert_eq!(d.problem(), Some(Problem::KEY_COLLISION));
    assert_eq!(d.problem().unwrap().status, 422);
    assert_eq!(common::events(&mut again), [Event::Collision]);
    assert_eq!(store.get(&record), Some(&done));
    // The original still replays.
    match claim(&policy, &mut store, now, &key, r#"{"n":1}"#, 3).1 {
        Claimed::Done(Decision::Replay(r)) => assert_eq!(r.body, b"first"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn clients_and_scopes_keep_timestamps_apart() {
    // IDEM-TIME-4 IDEM-KIND-1
    let policy = policy();
    let mut store = MemoryStore::default();
    let now = UnixMillis(T0);
    let at = UnixMillis(T0);
    let anon = TimeKey { client: None, at };
    let c1 = TimeKey {
        client: Some("c1".into()),
        at,
    };
    let c2 = TimeKey {
        client: Some("c2".into()),
        at,
    };
    for k in [&anon, &c1, &c2] {
        assert!(matches!(
            claim(&policy, &mut store, now, k, "{}", 1).1,
            Claimed::Execute { .. }
        ));
    }
    let mut bob = request(&policy, "bob", &text(&c1), "{}", 1);
    assert!(matches!(
        common::claim(&mut bob, &mut store, now).unwrap(),
        Claimed::Execute { .. }
    ));
    // A time key never shares a record with an opaque key of the same text.
    let scope = policy.scope(Some("alice"), "POST", "/orders").unwrap();
    let rk = request(&policy, "alice", &text(&anon), "{}", 1)
        .key()
        .clone();
    assert_ne!(rk.scope, scope);
    let opaque = RecordKey::new(scope, rk.key.clone());
    assert!(store.get(&opaque).is_none());
    // Leading zeros name the same record.
    assert_eq!(
        request(&policy, "alice", &format!("c1:000{T0}"), "{}", 1).key(),
        request(&policy, "alice", &text(&c1), "{}", 1).key()
    );
}

#[test]
fn the_same_payload_is_a_retry() {
    // IDEM-TIME-5
    let policy = policy();
    let mut store = MemoryStore::default();
    let now = UnixMillis(T0);
    let key = parse_time_key(&format!("c1:{T0}")).unwrap();
    let body = r#"{"a":1,"b":2}"#;
    let (mut first, Claimed::Execute { hold, recovered }) =
        claim(&policy, &mut store, now, &key, body, 1)
    else {
        panic!()
    };
    assert!(!recovered);
    assert_eq!(
        claim(&policy, &mut store, now, &key, body, 2).1,
        Claimed::Done(Decision::InProgress {
            // The default bound on the time left of a 60 s lease (IDEM-CONC-4).
            retry_after_secs: 2
        })
    );
    // After the lease ends, a retry takes over.
    let later = UnixMillis(T0 + 61_000);
    let (
        mut second,
        Claimed::Execute {
            hold: taken,
            recovered,
        },
    ) = claim(&policy, &mut store, later, &key, r#"{ "b":2, "a":1 }"#, 3)
    else {
        panic!()
    };
    assert!(recovered);
    assert_eq!(taken.fence(), hold.fence() + 1);
    assert_eq!(
        common::finish(
            &mut first,
            &mut store,
            later,
            Outcome::Final(response("zombie"))
        )
        .unwrap(),
        Finish::FencedOut
    );
    let _ = common::finish(
        &mut second,
        &mut store,
        later,
        Outcome::Final(response("ok")),
    )
    .unwrap();
    match claim(&policy, &mut store, later, &key, body, 4).1 {
        Claimed::Done(Decision::Replay(r)) => assert_eq!(r.body, b"ok"),
        other => panic!("{other:?}"),
    }
}

// --- Model test ---------------------------------------------------------------------------

#[derive(Clone, Debug)]
enum Op {
    /// A request from `client` with a timestamp `offset_ms` from now and payload `payload`.
    Send {
        client: u8,
        offset_ms: i64,
        payload: u8,
    },
    /// Repeat an earlier request exactly (a client retry).
    Retry { pick: usize },
    /// Finish the oldest running handler (final response) or let it crash.
    Finish { crash: bool },
    /// Move the clock; backward jumps stay within the margin the config allows.
    Clock { jump_ms: i64 },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0u8..3, -120_000i64..20_000, 0u8..3)
            .prop_map(|(client, offset_ms, payload)| Op::Send { client, offset_ms, payload }),
        3 => any::<usize>().prop_map(|pick| Op::Retry { pick }),
        3 => any::<bool>().prop_map(|crash| Op::Finish { crash }),
        2 => prop_oneof![
            -200_000i64..200_000,
            Just(1_000_000i64),
            Just(5_000_000i64),
        ]
        .prop_map(|jump_ms| Op::Clock { jump_ms }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// For random interleavings with clock jumps and purges: no collision is ever replayed or
    /// executed, a (scope, client, timestamp) runs for one payload only, and never runs again
    /// from scratch once it ran (even after its record was purged).
    #[test]
    fn time_keys_never_run_twice_or_replay_a_collision(ops in proptest::collection::vec(op(), 1..120)) {
        // IDEM-TIME-3 IDEM-TIME-4 IDEM-TIME-5
        let engine = Engine::new(Config {
            response_ttl: Duration::from_secs(300),
            key_ttl: Duration::from_secs(1_000),
            lease: Duration::from_secs(30),
            ..Config::default()
        }).unwrap();
        let config = TimeKeyConfig {
            max_ahead: Duration::from_secs(10),
            max_age: Duration::from_secs(100),
        };
        // Backward jumps up to key_ttl - max_age - max_ahead keep the guarantee.
        let margin_ms = 890_000i64;
        let policy = policy_with(engine, config).unwrap();
        let mut store = MemoryStore::default();
        let mut now = T0;
        let mut max_now = T0;
        let mut sent: Vec<(TimeKey, u8)> = Vec::new();
        // (client, timestamp) -> the payload that ran first
        let mut ran: HashMap<(Option<String>, u64), u8> = HashMap::new();
        // The machines of the requests whose handlers run, and their payloads.
        let mut running: Vec<(Request, u8)> = Vec::new();
        for op in ops {
            let request = match op {
                Op::Send { client, offset_ms, payload } => {
                    let at = (now as i64 + offset_ms) as u64;
                    let key = TimeKey { client: (client > 0).then(|| format!("c{client}")), at: UnixMillis(at) };
                    sent.push((key.clone(), payload));
                    Some((key, payload))
                }
                Op::Retry { pick } if !sent.is_empty() => Some(sent[pick % sent.len()].clone()),
                Op::Retry { .. } => None,
                Op::Finish { crash } => {
                    if !running.is_empty() {
                        let (mut req, payload) = running.remove(0);
                        if !crash {
                            let body = format!("payload-{payload}");
                            let _ = common::finish(&mut req, &mut store, UnixMillis(now), Outcome::Final(response(&body))).unwrap();
                        }
                    }
                    None
                }
                Op::Clock { jump_ms } => {
                    let floor = max_now as i64 - margin_ms;
                    now = (now as i64 + jump_ms).max(floor).max(0) as u64;
                    max_now = max_now.max(now);
                    store.sweep(UnixMillis(now));
                    None
                }
            };
            let Some((key, payload)) = request else { continue };
            let body = format!("{{\"p\":{payload}}}");
            let (req, claim) = claim(&policy, &mut store, UnixMillis(now), &key, &body, now ^ 0x5555);
            let id = (key.client.clone(), key.at.0);
            match claim {
                Claimed::Execute { recovered, .. } => {
                    // Inside the window, always.
                    prop_assert!(key.at.0 <= now + 10_000 && now - key.at.0.min(now) < 100_000);
                    match ran.get(&id) {
                        // Once a (client, timestamp) ran, only a takeover of the same
                        // request may run it again.
                        Some(first) => {
                            prop_assert!(recovered, "{id:?} ran again from scratch");
                            prop_assert_eq!(*first, payload, "a collision executed");
                        }
                        None => {
                            prop_assert!(!recovered);
                            ran.insert(id, payload);
                        }
                    }
                    running.retain(|(r, _)| r.key() != req.key());
                    running.push((req, payload));
                }
                Claimed::Done(Decision::Replay(r)) => {
                    prop_assert_eq!(ran.get(&id), Some(&payload));
                    prop_assert_eq!(r.body.clone(), format!("payload-{payload}").into_bytes(), "a collision was replayed");
                }
                Claimed::Done(Decision::Rejected(RejectReason::Collision)) => {
                    prop_assert!(ran.get(&id).is_some_and(|p| *p != payload));
                }
                Claimed::Done(Decision::InProgress { .. }) => {
                    prop_assert_eq!(ran.get(&id), Some(&payload));
                }
                Claimed::Done(Decision::Rejected(
                    RejectReason::Stale | RejectReason::FromFuture { .. } | RejectReason::KeyExpired,
                )) => {}
                Claimed::Done(other) => prop_assert!(false, "unexpected {:?}", other),
            }
        }
    }
}

/// A client named beside the key (a host's client header) is the client of a key that names
/// none; a key that names its own keeps it; a bad one is refused as in the key (IDEM-TIME-1).
#[test]
fn a_client_beside_the_key_names_a_bare_timestamp() {
    use idem_core::{time_key_of, TimeKey, UnixMillis};
    let bare = time_key_of("1700000000000", Some(" device-a ")).unwrap();
    assert_eq!(
        bare,
        TimeKey {
            client: Some("device-a".into()),
            at: UnixMillis(1_700_000_000_000)
        }
    );
    let own = time_key_of("device-b:1700000000000", Some("device-a")).unwrap();
    assert_eq!(own.client.as_deref(), Some("device-b"));
    assert_eq!(time_key_of("17", None).unwrap().client, None);
    assert!(time_key_of("17", Some("a b")).is_err());
    assert!(time_key_of("17", Some("")).is_err());
}
