//! The engine's transitions, one requirement at a time, with the reference store.
use idem_core::*;
use std::time::Duration;

const T0: UnixMillis = UnixMillis(1_000_000_000);

fn fp(body: &str) -> Fingerprint {
    FingerprintSpec::default()
        .fingerprint(&RequestParts {
            method: "POST",
            target: "/orders",
            content_type: Some("application/json"),
            headers: &[],
            body: body.as_bytes(),
        })
        .unwrap()
}

fn key(principal: &str, k: &str) -> RecordKey {
    RecordKey::new(Scope::new(principal, "POST", "/orders"), k)
}

fn ok(status: u16, body: &str) -> StoredResponse {
    StoredResponse {
        status,
        headers: vec![("content-type".into(), "text/plain".into())],
        body: body.as_bytes().to_vec(),
    }
}

fn at(ms: u64) -> UnixMillis {
    UnixMillis(T0.0 + ms)
}

struct Rig {
    engine: Engine,
    store: MemoryStore,
    nonce: u64,
}

impl Rig {
    fn new(config: Config) -> Rig {
        Rig {
            engine: Engine::new(config).unwrap(),
            store: MemoryStore::default(),
            nonce: 0,
        }
    }
    fn claim(&mut self, now: UnixMillis, key: &RecordKey, fp: &Fingerprint) -> Claim {
        self.nonce = self
            .nonce
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.store
            .claim(
                &self.engine,
                now,
                &Attempt {
                    key,
                    fingerprint: fp,
                    nonce: self.nonce,
                },
            )
            .unwrap()
    }
    fn lease(&mut self, now: UnixMillis, key: &RecordKey, fp: &Fingerprint) -> Lease {
        match self.claim(now, key, fp) {
            Claim::Execute { lease, .. } => *lease,
            other => panic!("expected execute, got {other:?}"),
        }
    }
    fn finish(&mut self, now: UnixMillis, lease: &Lease, outcome: Outcome) -> Finish {
        self.store
            .finish(&self.engine, now, lease, outcome)
            .unwrap()
    }
}

fn short() -> Config {
    Config {
        response_ttl: Duration::from_secs(10),
        key_ttl: Duration::from_secs(100),
        lease: Duration::from_secs(5),
        unknown_outcome: UnknownOutcomePolicy::Reexecute,
        // Above the lease: a duplicate is told the time left of it.
        max_retry_after: Duration::from_secs(60),
    }
}

#[test]
fn first_request_executes_and_duplicates_wait() {
    // IDEM-EXEC-1 IDEM-CONC-1 IDEM-EVT-1
    let mut rig = Rig::new(short());
    let (k, f) = (key("a", "k"), fp(r#"{"n":1}"#));
    let first = rig.claim(T0, &k, &f);
    assert_eq!(first.event(), Event::Executed);
    for (ms, secs) in [(0, 5), (1, 5), (4_000, 1), (4_999, 1)] {
        let c = rig.claim(at(ms), &k, &f);
        assert_eq!(
            c,
            Claim::Done(Decision::InProgress {
                retry_after_secs: secs
            }),
            "at {ms}"
        );
        assert_eq!(c.event(), Event::InProgress);
        let Claim::Done(d) = c else { unreachable!() };
        assert_eq!(d.problem().unwrap(), Problem::IN_PROGRESS);
        assert_eq!(Problem::IN_PROGRESS.status, 409);
    }
}

#[test]
fn completed_requests_replay_byte_for_byte() {
    // IDEM-REPLAY-1 IDEM-OUT-1 IDEM-TTL-1 IDEM-EVT-1
    let mut rig = Rig::new(short());
    let (k, f) = (key("a", "k"), fp("{}"));
    let lease = rig.lease(T0, &k, &f);
    let resp = ok(201, "created #1");
    assert_eq!(
        rig.finish(at(10), &lease, Outcome::Final(resp.clone())),
        Finish::Stored
    );
    assert_eq!(Finish::Stored.event(), Event::Completed);
    for ms in [10, 5_000, 10_009] {
        match rig.claim(at(ms), &k, &f) {
            Claim::Done(d @ Decision::Replay(_)) => {
                assert_eq!(d.event(), Event::Replayed);
                assert!(d.problem().is_none());
                let Decision::Replay(r) = d else {
                    unreachable!()
                };
                assert_eq!(*r, resp);
            }
            other => panic!("at {ms}: {other:?}"),
        }
    }
}

#[test]
fn deterministic_errors_are_replayed_and_retryable_ones_released() {
    // IDEM-REPLAY-3 IDEM-OUT-2 IDEM-OUT-4
    let mut rig = Rig::new(short());
    let f = fp("{}");
    let k1 = key("a", "k1");
    let lease = rig.lease(T0, &k1, &f);
    assert_eq!(
        rig.finish(T0, &lease, Outcome::classify(ok(402, "card declined"))),
        Finish::Stored
    );
    assert!(matches!(rig.claim(T0, &k1, &f), Claim::Done(Decision::Replay(r)) if r.status == 402));

    for status in [408, 425, 429] {
        let k = key("a", &format!("retryable-{status}"));
        let lease = rig.lease(T0, &k, &f);
        assert_eq!(
            rig.finish(T0, &lease, Outcome::classify(ok(status, ""))),
            Finish::Released
        );
        assert!(
            matches!(
                rig.claim(T0, &k, &f),
                Claim::Execute {
                    recovered: false,
                    ..
                }
            ),
            "{status}"
        );
    }
    assert_eq!(Outcome::classify(ok(200, "")), Outcome::Final(ok(200, "")));
    assert_eq!(Outcome::classify(ok(302, "")), Outcome::Final(ok(302, "")));
    assert_eq!(Outcome::classify(ok(409, "")), Outcome::Final(ok(409, "")));
    assert_eq!(
        Outcome::classify(ok(500, "")),
        Outcome::Unknown(Some(ok(500, "")))
    );
    assert_eq!(
        Outcome::classify(ok(503, "")),
        Outcome::Unknown(Some(ok(503, "")))
    );
}

#[test]
fn unknown_outcomes_follow_the_policy() {
    // IDEM-OUT-3 IDEM-OUT-4 IDEM-LEASE-1
    let f = fp("{}");
    let k = key("a", "k");

    // Default: re-execute with recovery; a 5xx is never replayed.
    let mut rig = Rig::new(short());
    assert_eq!(
        rig.engine.config().unknown_outcome,
        UnknownOutcomePolicy::Reexecute
    );
    let lease = rig.lease(T0, &k, &f);
    assert_eq!(
        rig.finish(T0, &lease, Outcome::classify(ok(502, "bad gateway"))),
        Finish::OutcomeUnknown
    );
    match rig.claim(at(1), &k, &f) {
        Claim::Execute {
            recovered: true,
            lease: l2,
        } => assert_eq!(l2.fence, lease.fence + 1),
        other => panic!("{other:?}"),
    }

    // Store: the 5xx is replayed.
    let mut rig = Rig::new(Config {
        unknown_outcome: UnknownOutcomePolicy::Store,
        ..short()
    });
    let lease = rig.lease(T0, &k, &f);
    assert_eq!(
        rig.finish(T0, &lease, Outcome::classify(ok(502, "bad gateway"))),
        Finish::Stored
    );
    assert!(
        matches!(rig.claim(at(1), &k, &f), Claim::Done(Decision::Replay(r)) if r.status == 502)
    );

    // Hold: refused until reconciled, then replayed (or released).
    let mut rig = Rig::new(Config {
        unknown_outcome: UnknownOutcomePolicy::Hold,
        ..short()
    });
    let lease = rig.lease(T0, &k, &f);
    assert_eq!(
        rig.finish(T0, &lease, Outcome::Unknown(None)),
        Finish::OutcomeUnknown
    );
    let c = rig.claim(at(60_000), &k, &f);
    assert_eq!(
        c,
        Claim::Done(Decision::Rejected(RejectReason::OutcomeUnknown))
    );
    assert_eq!(c.event(), Event::OutcomeUnknownHit);
    let Claim::Done(d) = c else { unreachable!() };
    assert_eq!(d.problem().unwrap(), Problem::OUTCOME_UNKNOWN);
    let record = rig.store.get(&k).unwrap().clone();
    let w = rig
        .engine
        .resolve(
            at(60_000),
            &k,
            &record,
            Outcome::Final(ok(200, "reconciled")),
        )
        .unwrap();
    assert_eq!(rig.store.apply(at(60_000), w).unwrap(), Applied::Applied);
    assert!(
        matches!(rig.claim(at(60_001), &k, &f), Claim::Done(Decision::Replay(r)) if r.body == b"reconciled")
    );
    let record = rig.store.get(&k).unwrap().clone();
    assert_eq!(
        rig.engine.resolve(at(1), &k, &record, Outcome::Retryable),
        Err(CompleteError::NotOutcomeUnknown)
    );

    let k2 = key("a", "k2");
    let lease = rig.lease(T0, &k2, &f);
    assert_eq!(
        rig.finish(T0, &lease, Outcome::Unknown(None)),
        Finish::OutcomeUnknown
    );
    let record = rig.store.get(&k2).unwrap().clone();
    let w = rig
        .engine
        .resolve(at(1), &k2, &record, Outcome::Retryable)
        .unwrap();
    assert_eq!(rig.store.apply(at(1), w).unwrap(), Applied::Applied);
    assert!(matches!(
        rig.claim(at(2), &k2, &f),
        Claim::Execute {
            recovered: false,
            ..
        }
    ));
}

#[test]
fn payload_mismatch_never_executes_and_leaves_the_original() {
    // IDEM-FP-1 IDEM-FP-4 IDEM-EVT-1
    let mut rig = Rig::new(short());
    let k = key("a", "k");
    let (a, b) = (fp(r#"{"amount":5}"#), fp(r#"{"amount":6}"#));
    let lease = rig.lease(T0, &k, &a);
    // While in flight.
    let c = rig.claim(T0, &k, &b);
    assert_eq!(
        c,
        Claim::Done(Decision::Mismatch {
            differing: vec!["amount".into()]
        })
    );
    assert_eq!(c.event(), Event::Mismatch);
    assert!(c.event().is_security_relevant());
    assert_eq!(
        rig.finish(T0, &lease, Outcome::Final(ok(200, "five"))),
        Finish::Stored
    );
    let before = rig.store.get(&k).unwrap().clone();
    // After completion.
    let Claim::Done(d) = rig.claim(at(1), &k, &b) else {
        panic!()
    };
    assert_eq!(d.problem().unwrap().status, 422);
    assert_eq!(
        rig.store.get(&k).unwrap(),
        &before,
        "the original record is unchanged"
    );
    assert!(
        matches!(rig.claim(at(2), &k, &a), Claim::Done(Decision::Replay(r)) if r.body == b"five")
    );
}

#[test]
fn expired_lease_is_taken_over_and_the_zombie_is_fenced_out() {
    // IDEM-LEASE-1 IDEM-LEASE-2 IDEM-STORE-1 IDEM-EVT-1
    let mut rig = Rig::new(short());
    let (k, f) = (key("a", "k"), fp("{}"));
    let zombie = rig.lease(T0, &k, &f);
    assert_eq!(zombie.fence, 1);
    let c = rig.claim(at(5_000), &k, &f);
    let Claim::Execute {
        lease: winner,
        recovered: true,
    } = c.clone()
    else {
        panic!("{c:?}")
    };
    assert_eq!(c.event(), Event::TookOver { fence: 2 });
    assert_eq!(winner.fence, 2);
    let before = rig.store.get(&k).unwrap().clone();
    // The zombie's completion and heartbeat are refused and change nothing.
    assert_eq!(
        rig.finish(at(5_001), &zombie, Outcome::Final(ok(200, "zombie"))),
        Finish::FencedOut
    );
    assert_eq!(Finish::FencedOut.event(), Event::FencedOut);
    assert_eq!(rig.store.get(&k).unwrap(), &before);
    // A heartbeat after the zombie's lease ended is refused by the engine itself...
    assert_eq!(
        rig.engine.extend(at(5_001), &zombie),
        Err(CompleteError::LeaseExpired)
    );
    // ...and one built before it ended is refused by the store.
    let (_, w) = rig.engine.extend(at(4_999), &zombie).unwrap();
    assert_eq!(rig.store.apply(at(5_002), w).unwrap(), Applied::Conflict);
    assert_eq!(rig.store.get(&k).unwrap(), &before);
    assert_eq!(
        rig.finish(at(5_003), &winner, Outcome::Final(ok(200, "winner"))),
        Finish::Stored
    );
    assert!(
        matches!(rig.claim(at(5_004), &k, &f), Claim::Done(Decision::Replay(r)) if r.body == b"winner")
    );
}

#[test]
fn heartbeats_extend_the_lease() {
    // IDEM-LEASE-3
    let mut rig = Rig::new(short());
    let (k, f) = (key("a", "k"), fp("{}"));
    let lease = rig.lease(T0, &k, &f);
    let (lease2, w) = rig.engine.extend(at(4_000), &lease).unwrap();
    assert_eq!(lease2.expires, at(9_000));
    assert_eq!(lease2.fence, lease.fence);
    assert_eq!(rig.store.apply(at(4_000), w).unwrap(), Applied::Applied);
    assert_eq!(
        rig.claim(at(6_000), &k, &f),
        Claim::Done(Decision::InProgress {
            retry_after_secs: 3
        })
    );
    // A completion that still carries the lease from before the heartbeat is the same
    // holder's (same fence): it completes from the extended record (IDEM-LEASE-4), and the
    // lease is then spent.
    assert_eq!(
        rig.finish(at(6_000), &lease, Outcome::Final(ok(200, "first"))),
        Finish::Stored
    );
    assert_eq!(
        rig.finish(at(6_000), &lease2, Outcome::Final(ok(200, "second"))),
        Finish::FencedOut
    );
    assert!(
        matches!(rig.claim(at(6_001), &k, &f), Claim::Done(Decision::Replay(r)) if r.body == b"first")
    );
}

#[test]
fn two_layer_expiry() {
    // IDEM-TTL-1 IDEM-TTL-2 IDEM-TTL-3 IDEM-TTL-4 IDEM-EVT-1
    let mut rig = Rig::new(short());
    let (k, f) = (key("a", "k"), fp("{}"));
    let lease = rig.lease(T0, &k, &f);
    assert_eq!(
        rig.finish(T0, &lease, Outcome::Final(ok(200, "x"))),
        Finish::Stored
    );
    let record = rig.store.get(&k).unwrap().clone();
    assert_eq!(rig.engine.next_deadline(&record), at(10_000));
    // A store's own time-to-live comes from the key's expiry, not the response's.
    assert_eq!(record.retained_until(), at(100_000));
    assert_eq!(rig.engine.expire(at(9_999), &k, &record), None);
    // The engine reads expiry from the record even before the store sweeps.
    let c = rig.claim(at(10_000), &k, &f);
    assert_eq!(c, Claim::Done(Decision::Rejected(RejectReason::KeyExpired)));
    assert_eq!(c.event(), Event::TombstoneHit);
    assert!(c.event().is_security_relevant());
    let Claim::Done(d) = c else { unreachable!() };
    assert_eq!(d.problem().unwrap(), Problem::KEY_EXPIRED);
    assert_eq!(Problem::KEY_EXPIRED.status, 410);
    // The sweep compacts the record to a tombstone, which still refuses the key.
    assert_eq!(rig.store.sweep(at(10_000)), 1);
    let t = rig.store.get(&k).unwrap();
    assert_eq!(t.state, RecordState::Tombstone);
    assert_eq!(t.next_deadline(), at(100_000));
    assert_eq!(
        rig.claim(at(99_999), &k, &f),
        Claim::Done(Decision::Rejected(RejectReason::KeyExpired))
    );
    // After the key retention the key is new again, swept or not.
    assert!(matches!(
        rig.claim(at(100_000), &k, &f),
        Claim::Execute {
            recovered: false,
            ..
        }
    ));
    let k2 = key("a", "k2");
    let lease = rig.lease(T0, &k2, &f);
    assert_eq!(
        rig.finish(T0, &lease, Outcome::Final(ok(200, "x"))),
        Finish::Stored
    );
    let rec = rig.store.get(&k2).unwrap().clone();
    assert_eq!(rec.expire(at(100_000)), Expiry::Delete);
    assert!(matches!(
        rig.engine.expire(at(100_000), &k2, &rec),
        Some(Write {
            op: WriteOp::Delete,
            ..
        })
    ));
    rig.store.sweep(at(100_000));
    assert!(rig.store.get(&k2).is_none());
    // An abandoned in-flight record is forgotten at key expiry too.
    let k3 = key("a", "k3");
    let _abandoned = rig.lease(at(200_000), &k3, &f);
    assert_eq!(rig.store.sweep(at(299_999)), 0);
    assert_eq!(rig.store.sweep(at(300_000)), 1);
    assert!(rig.store.get(&k3).is_none());
}

#[test]
fn scopes_never_share_records() {
    // IDEM-SCOPE-1 IDEM-SCOPE-2
    let mut rig = Rig::new(short());
    let f = fp("{}");
    let (alice, bob) = (key("alice", "same"), key("bob", "same"));
    let lease = rig.lease(T0, &alice, &f);
    assert!(
        matches!(
            rig.claim(T0, &bob, &f),
            Claim::Execute {
                recovered: false,
                ..
            }
        ),
        "no conflict across scopes"
    );
    assert_eq!(
        rig.finish(T0, &lease, Outcome::Final(ok(200, "alice's"))),
        Finish::Stored
    );
    let other_route = RecordKey::new(Scope::new("alice", "POST", "/refunds"), "same");
    let other_method = RecordKey::new(Scope::new("alice", "PUT", "/orders"), "same");
    for k in [&other_route, &other_method] {
        assert!(
            matches!(
                rig.claim(T0, k, &fp(r#"{"other":1}"#)),
                Claim::Execute { .. }
            ),
            "{k:?}"
        );
    }
    // Length prefixes: principal "a:b" + method "c" is not principal "a" + method "b:c".
    assert_ne!(Scope::new("a:b", "c", "/"), Scope::new("a", "b:c", "/"));
    assert_ne!(
        RecordKey::new(Scope::custom("ab"), "c").storage_key(),
        RecordKey::new(Scope::custom("a"), "bc").storage_key()
    );
}

#[test]
fn versions_never_repeat_across_incarnations() {
    // IDEM-STORE-2 IDEM-LEASE-2
    let mut rig = Rig::new(short());
    let (k, f) = (key("a", "k"), fp("{}"));
    let old = rig.lease(T0, &k, &f);
    assert_eq!(rig.finish(T0, &old, Outcome::Retryable), Finish::Released);
    assert!(rig.store.get(&k).is_none());
    let new = rig.lease(at(1), &k, &f);
    assert_ne!(
        new.version, old.version,
        "a new incarnation starts from the caller's nonce"
    );
    // The released lease cannot complete the new incarnation.
    assert_eq!(
        rig.finish(at(2), &old, Outcome::Final(ok(200, "stale"))),
        Finish::FencedOut
    );
    assert!(matches!(
        rig.store.get(&k).unwrap().state,
        RecordState::InFlight { .. }
    ));
}

#[test]
fn full_store_refuses_new_claims_but_finishes_old_ones() {
    // IDEM-STORE-3
    let engine = Engine::new(short()).unwrap();
    let mut store = MemoryStore::new(MemoryStoreLimits {
        max_entries: 2,
        max_bytes: 1 << 20,
    });
    let f = fp("{}");
    let claim = |store: &mut MemoryStore, now, k: &RecordKey| {
        store.claim(
            &engine,
            now,
            &Attempt {
                key: k,
                fingerprint: &f,
                nonce: 1,
            },
        )
    };
    let Claim::Execute { lease, .. } = claim(&mut store, T0, &key("a", "1")).unwrap() else {
        panic!()
    };
    let _ = claim(&mut store, T0, &key("a", "2")).unwrap();
    assert_eq!(
        claim(&mut store, T0, &key("a", "3")),
        Err(MemoryStoreError::Full {
            entries: 2,
            bytes: store.stats().bytes
        })
    );
    assert_eq!(store.stats().refused, 1);
    assert_eq!(Problem::STORE_FULL.status, 503);
    // The in-flight record can still be completed, with a large body, past the byte limit.
    let big = StoredResponse {
        status: 200,
        headers: vec![],
        body: vec![7; 2 << 20],
    };
    assert_eq!(
        store
            .finish(&engine, T0, &lease, Outcome::Final(big))
            .unwrap(),
        Finish::Stored
    );
    // Once keys expire there is room again.
    assert!(matches!(
        claim(&mut store, at(100_000), &key("a", "3")).unwrap(),
        Claim::Execute { .. }
    ));
    let small = MemoryStoreLimits {
        max_entries: 10,
        max_bytes: 10,
    };
    let mut store = MemoryStore::new(small);
    assert!(matches!(
        claim(&mut store, T0, &key("a", "1")),
        Err(MemoryStoreError::Full { .. })
    ));
}

#[test]
fn invalid_statuses_and_configs_are_refused() {
    // IDEM-OUT-1
    let mut rig = Rig::new(short());
    let (k, f) = (key("a", "k"), fp("{}"));
    let lease = rig.lease(T0, &k, &f);
    for status in [0, 99, 600, 999] {
        assert_eq!(
            rig.finish(T0, &lease, Outcome::Final(ok(status, ""))),
            Finish::Invalid(CompleteError::InvalidStatus(status))
        );
    }
    assert!(matches!(
        rig.store.get(&k).unwrap().state,
        RecordState::InFlight { .. }
    ));
    assert_eq!(
        Engine::new(Config {
            key_ttl: Duration::from_secs(1),
            ..short()
        })
        .unwrap_err(),
        ConfigError::KeyTtlShorterThanResponseTtl
    );
    assert_eq!(
        Engine::new(Config {
            lease: Duration::ZERO,
            ..short()
        })
        .unwrap_err(),
        ConfigError::ZeroDuration("lease")
    );
    let d = Config::default();
    assert_eq!(
        (
            d.response_ttl.as_secs(),
            d.key_ttl.as_secs(),
            d.lease.as_secs()
        ),
        (86_400, 604_800, 60)
    );
}

#[test]
fn the_engine_is_a_pure_function() {
    // IDEM-CORE-1: same inputs, same decisions and writes, whatever happened in between.
    let engine = Engine::default();
    let (k, f) = (key("a", "k"), fp("{}"));
    let attempt = Attempt {
        key: &k,
        fingerprint: &f,
        nonce: 99,
    };
    let d1 = engine.decide(T0, &attempt, None);
    let _ = engine.decide(
        at(5),
        &Attempt {
            nonce: 1,
            ..attempt
        },
        None,
    );
    let d2 = engine.decide(T0, &attempt, None);
    assert_eq!(d1, d2);
    let Decision::Execute { lease, .. } = d1 else {
        panic!()
    };
    assert_eq!(
        engine.complete(at(3), &lease, Outcome::Final(ok(200, "a"))),
        engine.complete(at(3), &lease, Outcome::Final(ok(200, "a")))
    );
}

#[test]
fn problems_render_as_problem_json() {
    // IDEM-KEY-1 IDEM-KEY-3
    let v: serde_json::Value =
        serde_json::from_str(&Problem::MISMATCH.to_json("field amount differs")).unwrap();
    assert_eq!(v["type"], "urn:idem:problem:key-reuse-mismatch");
    assert_eq!(v["status"], 422);
    assert_eq!(v["detail"], "field amount differs");
    assert_eq!(v["requirement"], "IDEM-FP-1");
    assert_eq!(
        Problem::for_key_error(&KeyError::Empty),
        Problem::MISSING_KEY
    );
    assert_eq!(
        Problem::for_key_error(&KeyError::NotString),
        Problem::MALFORMED_KEY
    );
    for p in [
        Problem::MISSING_KEY,
        Problem::MALFORMED_KEY,
        Problem::IN_PROGRESS,
        Problem::MISMATCH,
        Problem::KEY_EXPIRED,
        Problem::OUTCOME_UNKNOWN,
        Problem::STORE_FULL,
        Problem::STORE_UNAVAILABLE,
        Problem::BODY_TOO_LARGE,
        Problem::INVALID_JSON,
    ] {
        let req = idem_spec::get(p.requirement)
            .unwrap_or_else(|| panic!("{} cites unknown {}", p.slug, p.requirement));
        assert_eq!(req.status, Some(p.status), "{}", p.slug);
        assert_eq!(req.problem.as_deref(), Some(p.type_uri), "{}", p.slug);
    }
}

#[test]
fn a_store_keeps_a_record_in_flight_while_its_lease_lives() {
    // IDEM-STORE-6: a time-to-live never ends a record whose lease is live.
    let mut rig = Rig::new(short());
    let (k, f) = (key("a", "k"), fp("{}"));
    let _lease = rig.lease(T0, &k, &f);
    let mut record = rig.store.get(&k).unwrap().clone();
    assert_eq!(record.retained_until(), at(100_000));
    record.state = RecordState::InFlight {
        lease_expires: at(150_000),
    };
    assert_eq!(record.retained_until(), at(150_000));
    assert_eq!(record.expire(at(120_000)), Expiry::Keep(Some(at(150_000))));
}
