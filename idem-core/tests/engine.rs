//! The engine's transitions, one requirement at a time, with the reference store.
use common::{events, lease};
use idem_core::*;
use std::time::Duration;

mod common;

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

/// A host with a policy over the reference store: every attempt is a request machine,
/// claimed by driving it over the store, its handler's outcome recorded through it.
struct Rig {
    policy: Policy,
    store: MemoryStore,
    nonce: u64,
}

impl Rig {
    fn new(config: Config) -> Rig {
        Rig {
            policy: Policy::new(Engine::new(config).unwrap()),
            store: MemoryStore::default(),
            nonce: 0,
        }
    }
    fn engine(&self) -> &Engine {
        self.policy.engine()
    }
    /// An attempt at `key` with fingerprint `fp`: its machine, and what its claim came to.
    fn attempt(
        &mut self,
        now: UnixMillis,
        key: &RecordKey,
        fp: &Fingerprint,
    ) -> (Request, Claimed) {
        self.nonce = self
            .nonce
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let ticket = Ticket {
            key: key.clone(),
            fingerprint: fp.clone(),
            subject: Subject::Record,
        };
        let mut req = self.policy.resume(ticket, self.nonce);
        let claimed = common::claim(&mut req, &mut self.store, now).unwrap();
        (req, claimed)
    }
    fn claim(&mut self, now: UnixMillis, key: &RecordKey, fp: &Fingerprint) -> Claimed {
        self.attempt(now, key, fp).1
    }
    /// The machine of an attempt that runs its handler.
    fn run(&mut self, now: UnixMillis, key: &RecordKey, fp: &Fingerprint) -> Request {
        match self.attempt(now, key, fp) {
            (req, Claimed::Execute { .. }) => req,
            (_, other) => panic!("expected execute, got {other:?}"),
        }
    }
    fn finish(&mut self, now: UnixMillis, req: &mut Request, outcome: Outcome) -> Finish {
        common::finish(req, &mut self.store, now, outcome).unwrap()
    }
    /// A machine holding `lease` for the request of `like` (a lease kept from before).
    fn holding(&self, now: UnixMillis, like: &Request, lease: &Lease) -> Request {
        common::holding(
            &self.policy,
            like.ticket(),
            Hold::Record(lease.clone()),
            now,
        )
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
    let (mut first, claimed) = rig.attempt(T0, &k, &f);
    assert!(matches!(
        claimed,
        Claimed::Execute {
            recovered: false,
            ..
        }
    ));
    assert_eq!(events(&mut first), [Event::Executed]);
    for (ms, secs) in [(0, 5), (1, 5), (4_000, 1), (4_999, 1)] {
        let (mut dup, c) = rig.attempt(at(ms), &k, &f);
        assert_eq!(
            c,
            Claimed::Done(Decision::InProgress {
                retry_after_secs: secs
            }),
            "at {ms}"
        );
        assert_eq!(events(&mut dup), [Event::InProgress]);
        let Claimed::Done(d) = c else { unreachable!() };
        assert_eq!(d.problem().unwrap(), Problem::IN_PROGRESS);
        assert_eq!(Problem::IN_PROGRESS.status, 409);
    }
}

#[test]
fn completed_requests_replay_byte_for_byte() {
    // IDEM-REPLAY-1 IDEM-OUT-1 IDEM-TTL-1 IDEM-EVT-1
    let mut rig = Rig::new(short());
    let (k, f) = (key("a", "k"), fp("{}"));
    let mut req = rig.run(T0, &k, &f);
    let resp = ok(201, "created #1");
    assert_eq!(
        rig.finish(at(10), &mut req, Outcome::Final(resp.clone())),
        Finish::Stored
    );
    assert_eq!(events(&mut req), [Event::Executed, Event::Completed]);
    assert_eq!(Finish::Stored.event(), Event::Completed);
    for ms in [10, 5_000, 10_009] {
        let (mut retry, c) = rig.attempt(at(ms), &k, &f);
        match c {
            Claimed::Done(d @ Decision::Replay(_)) => {
                assert_eq!(d.event(), Event::Replayed);
                assert_eq!(events(&mut retry), [Event::Replayed]);
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
    let mut req = rig.run(T0, &k1, &f);
    assert_eq!(
        rig.finish(T0, &mut req, Outcome::classify(ok(402, "card declined"))),
        Finish::Stored
    );
    assert!(
        matches!(rig.claim(T0, &k1, &f), Claimed::Done(Decision::Replay(r)) if r.status == 402)
    );

    for status in [408, 425, 429] {
        let k = key("a", &format!("retryable-{status}"));
        let mut req = rig.run(T0, &k, &f);
        assert_eq!(
            rig.finish(T0, &mut req, Outcome::classify(ok(status, ""))),
            Finish::Released
        );
        assert!(
            matches!(
                rig.claim(T0, &k, &f),
                Claimed::Execute {
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
        rig.engine().config().unknown_outcome,
        UnknownOutcomePolicy::Reexecute
    );
    let mut req = rig.run(T0, &k, &f);
    let fence = lease(&req).fence;
    assert_eq!(
        rig.finish(T0, &mut req, Outcome::classify(ok(502, "bad gateway"))),
        Finish::OutcomeUnknown
    );
    match rig.claim(at(1), &k, &f) {
        Claimed::Execute {
            recovered: true,
            hold,
        } => assert_eq!(hold.fence(), fence + 1),
        other => panic!("{other:?}"),
    }

    // Store: the 5xx is replayed.
    let mut rig = Rig::new(Config {
        unknown_outcome: UnknownOutcomePolicy::Store,
        ..short()
    });
    let mut req = rig.run(T0, &k, &f);
    assert_eq!(
        rig.finish(T0, &mut req, Outcome::classify(ok(502, "bad gateway"))),
        Finish::Stored
    );
    assert!(
        matches!(rig.claim(at(1), &k, &f), Claimed::Done(Decision::Replay(r)) if r.status == 502)
    );

    // Hold: refused, also long after the lease, until the host reconciles the record (the
    // reconciliation itself is a unit test of the engine).
    let mut rig = Rig::new(Config {
        unknown_outcome: UnknownOutcomePolicy::Hold,
        ..short()
    });
    let mut req = rig.run(T0, &k, &f);
    assert_eq!(
        rig.finish(T0, &mut req, Outcome::Unknown(None)),
        Finish::OutcomeUnknown
    );
    assert!(matches!(
        rig.store.get(&k).unwrap().state,
        RecordState::OutcomeUnknown { .. }
    ));
    let (mut retry, c) = rig.attempt(at(60_000), &k, &f);
    assert_eq!(
        c,
        Claimed::Done(Decision::Rejected(RejectReason::OutcomeUnknown))
    );
    assert_eq!(events(&mut retry), [Event::OutcomeUnknownHit]);
    let Claimed::Done(d) = c else { unreachable!() };
    assert_eq!(d.problem().unwrap(), Problem::OUTCOME_UNKNOWN);
}

#[test]
fn payload_mismatch_never_executes_and_leaves_the_original() {
    // IDEM-FP-1 IDEM-FP-4 IDEM-EVT-1
    let mut rig = Rig::new(short());
    let k = key("a", "k");
    let (a, b) = (fp(r#"{"amount":5}"#), fp(r#"{"amount":6}"#));
    let mut req = rig.run(T0, &k, &a);
    // While in flight.
    let (mut other, c) = rig.attempt(T0, &k, &b);
    assert_eq!(
        c,
        Claimed::Done(Decision::Mismatch {
            differing: vec!["amount".into()],
            processed: false,
        })
    );
    let [event] = events(&mut other)[..] else {
        panic!("one event")
    };
    assert_eq!(event, Event::Mismatch);
    assert!(event.is_security_relevant());
    assert_eq!(
        rig.finish(T0, &mut req, Outcome::Final(ok(200, "five"))),
        Finish::Stored
    );
    let before = rig.store.get(&k).unwrap().clone();
    // After completion.
    let Claimed::Done(d) = rig.claim(at(1), &k, &b) else {
        panic!()
    };
    assert_eq!(d.problem().unwrap().status, 422);
    assert_eq!(
        rig.store.get(&k).unwrap(),
        &before,
        "the original record is unchanged"
    );
    assert!(
        matches!(rig.claim(at(2), &k, &a), Claimed::Done(Decision::Replay(r)) if r.body == b"five")
    );
}

#[test]
fn expired_lease_is_taken_over_and_the_zombie_is_fenced_out() {
    // IDEM-LEASE-1 IDEM-LEASE-2 IDEM-STORE-1 IDEM-EVT-1
    let mut rig = Rig::new(short());
    let (k, f) = (key("a", "k"), fp("{}"));
    let mut zombie = rig.run(T0, &k, &f);
    let zombie_lease = lease(&zombie);
    assert_eq!(zombie_lease.fence, 1);
    let (mut winner, c) = rig.attempt(at(5_000), &k, &f);
    let Claimed::Execute {
        hold,
        recovered: true,
    } = c
    else {
        panic!("{c:?}")
    };
    assert_eq!(events(&mut winner), [Event::TookOver { fence: 2 }]);
    assert_eq!(hold.fence(), 2);
    let before = rig.store.get(&k).unwrap().clone();
    // A heartbeat the zombie asked for before its lease ended is refused by the store, and
    // the zombie learns that it was taken over...
    let mut waiters = Waiters::default();
    zombie.heartbeat(at(4_999)).unwrap();
    let Step::Apply(w) = zombie.poll(at(4_999), &mut waiters) else {
        panic!("a heartbeat writes")
    };
    let applied = rig.store.apply(at(5_002), w).unwrap();
    assert_eq!(applied, Applied::Conflict);
    assert_eq!(rig.store.get(&k).unwrap(), &before);
    zombie.handle_applied(at(5_002), applied, &mut waiters);
    assert_eq!(
        zombie
            .drive(&mut rig.store, at(5_002), &mut waiters)
            .unwrap(),
        Step::Idle
    );
    assert_eq!(zombie.heartbeat_state(), Heartbeat::FencedOut);
    // ...and one asked for after its lease ended is refused by the machine itself.
    let mut late = rig.holding(at(5_001), &zombie, &zombie_lease);
    assert_eq!(late.heartbeat(at(5_001)), Err(Heartbeat::Expired));
    // The zombie's completion is refused and changes nothing.
    assert_eq!(
        rig.finish(at(5_001), &mut zombie, Outcome::Final(ok(200, "zombie"))),
        Finish::FencedOut
    );
    assert!(events(&mut zombie).contains(&Event::FencedOut));
    assert_eq!(Finish::FencedOut.event(), Event::FencedOut);
    assert_eq!(rig.store.get(&k).unwrap(), &before);
    assert_eq!(
        rig.finish(at(5_003), &mut winner, Outcome::Final(ok(200, "winner"))),
        Finish::Stored
    );
    assert!(
        matches!(rig.claim(at(5_004), &k, &f), Claimed::Done(Decision::Replay(r)) if r.body == b"winner")
    );
}

#[test]
fn heartbeats_extend_the_lease() {
    // IDEM-LEASE-3
    let mut rig = Rig::new(short());
    let (k, f) = (key("a", "k"), fp("{}"));
    let mut req = rig.run(T0, &k, &f);
    let first = lease(&req);
    assert_eq!(
        common::heartbeat(&mut req, &mut rig.store, at(4_000)).unwrap(),
        Heartbeat::Extended(at(9_000))
    );
    let extended = lease(&req);
    assert_eq!(extended.expires, at(9_000));
    assert_eq!(extended.fence, first.fence);
    assert_eq!(
        rig.claim(at(6_000), &k, &f),
        Claimed::Done(Decision::InProgress {
            retry_after_secs: 3
        })
    );
    // A completion that still carries the lease from before the heartbeat (whose answer was
    // lost) is the same holder's (same fence): it completes from the extended record
    // (IDEM-LEASE-4), and the lease is then spent.
    let mut before = rig.holding(at(6_000), &req, &first);
    assert_eq!(
        rig.finish(at(6_000), &mut before, Outcome::Final(ok(200, "first"))),
        Finish::Stored
    );
    let mut after = rig.holding(at(6_000), &req, &extended);
    assert_eq!(
        rig.finish(at(6_000), &mut after, Outcome::Final(ok(200, "second"))),
        Finish::FencedOut
    );
    assert!(
        matches!(rig.claim(at(6_001), &k, &f), Claimed::Done(Decision::Replay(r)) if r.body == b"first")
    );
}

#[test]
fn two_layer_expiry() {
    // IDEM-TTL-1 IDEM-TTL-2 IDEM-TTL-3 IDEM-TTL-4 IDEM-EVT-1
    let mut rig = Rig::new(short());
    let (k, f) = (key("a", "k"), fp("{}"));
    let mut req = rig.run(T0, &k, &f);
    assert_eq!(
        rig.finish(T0, &mut req, Outcome::Final(ok(200, "x"))),
        Finish::Stored
    );
    let record = rig.store.get(&k).unwrap().clone();
    assert_eq!(rig.engine().next_deadline(&record), at(10_000));
    // A store's own time-to-live comes from the key's expiry, not the response's.
    assert_eq!(record.retained_until(), at(100_000));
    assert_eq!(rig.engine().expire(at(9_999), &k, &record), None);
    // The engine reads expiry from the record even before the store sweeps.
    let (mut late, c) = rig.attempt(at(10_000), &k, &f);
    assert_eq!(
        c,
        Claimed::Done(Decision::Rejected(RejectReason::KeyExpired))
    );
    let [event] = events(&mut late)[..] else {
        panic!("one event")
    };
    assert_eq!(event, Event::TombstoneHit);
    assert!(event.is_security_relevant());
    let Claimed::Done(d) = c else { unreachable!() };
    assert_eq!(d.problem().unwrap(), Problem::KEY_EXPIRED);
    assert_eq!(Problem::KEY_EXPIRED.status, 410);
    // The sweep compacts the record to a tombstone, which still refuses the key.
    assert_eq!(rig.store.sweep(at(10_000)), 1);
    let t = rig.store.get(&k).unwrap();
    assert_eq!(t.state, RecordState::Tombstone);
    assert_eq!(t.next_deadline(), at(100_000));
    assert_eq!(
        rig.claim(at(99_999), &k, &f),
        Claimed::Done(Decision::Rejected(RejectReason::KeyExpired))
    );
    // After the key retention the key is new again, swept or not.
    assert!(matches!(
        rig.claim(at(100_000), &k, &f),
        Claimed::Execute {
            recovered: false,
            ..
        }
    ));
    let k2 = key("a", "k2");
    let mut req = rig.run(T0, &k2, &f);
    assert_eq!(
        rig.finish(T0, &mut req, Outcome::Final(ok(200, "x"))),
        Finish::Stored
    );
    let rec = rig.store.get(&k2).unwrap().clone();
    assert_eq!(rec.expire(at(100_000)), Expiry::Delete);
    assert!(matches!(
        rig.engine().expire(at(100_000), &k2, &rec),
        Some(Write {
            op: WriteOp::Delete,
            ..
        })
    ));
    rig.store.sweep(at(100_000));
    assert!(rig.store.get(&k2).is_none());
    // An abandoned in-flight record is forgotten at key expiry too.
    let k3 = key("a", "k3");
    let _abandoned = rig.run(at(200_000), &k3, &f);
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
    let mut req = rig.run(T0, &alice, &f);
    assert!(
        matches!(
            rig.claim(T0, &bob, &f),
            Claimed::Execute {
                recovered: false,
                ..
            }
        ),
        "no conflict across scopes"
    );
    assert_eq!(
        rig.finish(T0, &mut req, Outcome::Final(ok(200, "alice's"))),
        Finish::Stored
    );
    let other_route = RecordKey::new(Scope::new("alice", "POST", "/refunds"), "same");
    let other_method = RecordKey::new(Scope::new("alice", "PUT", "/orders"), "same");
    for k in [&other_route, &other_method] {
        assert!(
            matches!(
                rig.claim(T0, k, &fp(r#"{"other":1}"#)),
                Claimed::Execute { .. }
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
fn a_long_route_enters_the_scope_as_its_digest() {
    // IDEM-SCOPE-1: a request path of any length keeps the storage key short enough for every
    // store to index (a Postgres primary key holds about 2.7 KB), and distinct routes apart.
    let path = |n: usize, c: char| format!("/{}", core::iter::repeat_n(c, n).collect::<String>());
    let longest = path(MAX_IN_CLEAR - 1, 'a');
    assert!(Scope::new("p", "POST", &longest)
        .as_str()
        .ends_with(&longest));
    let key = "k".repeat(MAX_KEY_LEN);
    let mut seen = std::collections::HashSet::new();
    for route in [
        path(MAX_IN_CLEAR, 'a'),
        path(100_000, 'a'),
        path(100_000, 'b'),
    ] {
        let stored = RecordKey::new(Scope::new("p", "POST", &route), key.as_str()).storage_key();
        assert!(stored.len() < 400, "{} bytes", stored.len());
        assert!(seen.insert(stored), "distinct routes, distinct records");
    }
    // The digest's form is no route's: a route that reads like it is another scope.
    let digested = Scope::new("p", "POST", &path(100_000, 'a'));
    let tail = digested.as_str().rsplit_once("h:").unwrap().1;
    assert_ne!(Scope::new("p", "POST", &format!("h:{tail}")), digested);
}

#[test]
fn versions_never_repeat_across_incarnations() {
    // IDEM-STORE-2 IDEM-LEASE-2
    let mut rig = Rig::new(short());
    let (k, f) = (key("a", "k"), fp("{}"));
    let mut old = rig.run(T0, &k, &f);
    let old_lease = lease(&old);
    assert_eq!(
        rig.finish(T0, &mut old, Outcome::Retryable),
        Finish::Released
    );
    assert!(rig.store.get(&k).is_none());
    let new = rig.run(at(1), &k, &f);
    assert_ne!(
        lease(&new).version,
        old_lease.version,
        "a new incarnation starts from the caller's nonce"
    );
    // The released lease cannot complete the new incarnation.
    let mut stale = rig.holding(at(2), &new, &old_lease);
    assert_eq!(
        rig.finish(at(2), &mut stale, Outcome::Final(ok(200, "stale"))),
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
    let policy = Policy::new(Engine::new(short()).unwrap());
    let mut store = MemoryStore::new(MemoryStoreLimits {
        max_entries: 2,
        max_bytes: 1 << 20,
    });
    let f = fp("{}");
    let attempt = |k: &RecordKey| {
        let ticket = Ticket {
            key: k.clone(),
            fingerprint: f.clone(),
            subject: Subject::Record,
        };
        policy.resume(ticket, 1)
    };
    let mut first = attempt(&key("a", "1"));
    let Claimed::Execute { .. } = common::claim(&mut first, &mut store, T0).unwrap() else {
        panic!()
    };
    let _ = common::claim(&mut attempt(&key("a", "2")), &mut store, T0).unwrap();
    let mut third = attempt(&key("a", "3"));
    assert_eq!(
        common::claim(&mut third, &mut store, T0),
        Err(MemoryStoreError::Full {
            entries: 2,
            bytes: store.stats().bytes
        })
    );
    assert_eq!(third.reply().unwrap().status(), 503);
    assert_eq!(store.stats().refused, 1);
    assert_eq!(Problem::STORE_FULL.status, 503);
    // The in-flight record can still be completed, with a large body, past the byte limit.
    let big = StoredResponse {
        status: 200,
        headers: vec![],
        body: vec![7; 2 << 20],
    };
    assert_eq!(
        common::finish(&mut first, &mut store, T0, Outcome::Final(big)).unwrap(),
        Finish::Stored
    );
    // Once keys expire there is room again.
    assert!(matches!(
        common::claim(&mut attempt(&key("a", "3")), &mut store, at(100_000)).unwrap(),
        Claimed::Execute { .. }
    ));
    let small = MemoryStoreLimits {
        max_entries: 10,
        max_bytes: 10,
    };
    let mut store = MemoryStore::new(small);
    assert!(matches!(
        common::claim(&mut attempt(&key("a", "1")), &mut store, T0),
        Err(MemoryStoreError::Full { .. })
    ));
}

#[test]
fn invalid_statuses_and_configs_are_refused() {
    // IDEM-OUT-1
    let mut rig = Rig::new(short());
    let (k, f) = (key("a", "k"), fp("{}"));
    let req = rig.run(T0, &k, &f);
    for status in [0, 99, 600, 999] {
        let mut holder = rig.holding(T0, &req, &lease(&req));
        assert_eq!(
            rig.finish(T0, &mut holder, Outcome::Final(ok(status, ""))),
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
    let policy = Policy::new(Engine::default());
    let ticket = Ticket {
        key: key("a", "k"),
        fingerprint: fp("{}"),
        subject: Subject::Record,
    };
    // The steps of one request on an empty store: its claim, its handler's context, and the
    // completion of a 200 three milliseconds later.
    let steps = |nonce: u64| {
        let mut waiters = Waiters::default();
        let mut req = policy.resume(ticket.clone(), nonce);
        assert_eq!(req.poll(T0, &mut waiters), Step::Claim);
        req.handle_record(T0, None, &mut waiters);
        let claim = req.poll(T0, &mut waiters);
        req.handle_applied(T0, Applied::Applied, &mut waiters);
        let run = req.poll(T0, &mut waiters);
        req.handle_outcome(Outcome::Final(ok(200, "a")));
        let complete = req.poll(at(3), &mut waiters);
        assert!(matches!(
            (&claim, &run, &complete),
            (Step::Apply(_), Step::Run(_), Step::Apply(_))
        ));
        (claim, run, complete)
    };
    let first = steps(99);
    let _ = steps(1);
    assert_eq!(steps(99), first);
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
        Problem::SEALED,
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
    let _req = rig.run(T0, &k, &f);
    let mut record = rig.store.get(&k).unwrap().clone();
    assert_eq!(record.retained_until(), at(100_000));
    record.state = RecordState::InFlight {
        lease_expires: at(150_000),
    };
    assert_eq!(record.retained_until(), at(150_000));
    assert_eq!(record.expire(at(120_000)), Expiry::Keep(Some(at(150_000))));
}
