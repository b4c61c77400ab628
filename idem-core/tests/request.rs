//! The per-request machine, driven step by step the way hosts drive it: a synchronous store,
//! an asynchronous store whose calls really interleave, store failures, the wait policy,
//! heartbeats racing completions, and the one renderer of every answer.
use idem_core::*;
use std::cell::RefCell;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context as TaskContext, Poll};
use std::time::Duration;

const T0: UnixMillis = UnixMillis(1_000_000_000);

fn at(ms: u64) -> UnixMillis {
    UnixMillis(T0.0 + ms)
}

fn config() -> Config {
    Config {
        response_ttl: Duration::from_secs(10),
        key_ttl: Duration::from_secs(30),
        lease: Duration::from_secs(5),
        unknown_outcome: UnknownOutcomePolicy::Reexecute,
        // Above the lease: a duplicate is told the time left of it.
        max_retry_after: Duration::from_secs(60),
    }
}

fn policy() -> Policy {
    Policy::new(Engine::new(config()).unwrap())
}

fn intake<'a>(principal: Option<&'a str>, keys: &'a [&'a [u8]], body: &'a [u8]) -> Intake<'a> {
    Intake {
        principal,
        method: "POST",
        route: "/orders",
        target: "/orders",
        keys,
        low_water: None,
        client: None,
        content_type: Some("application/json"),
        headers: &[],
        body,
    }
}

fn ok(body: &str) -> StoredResponse {
    StoredResponse {
        status: 201,
        headers: vec![("content-type".into(), "application/json".into())],
        body: body.as_bytes().to_vec(),
    }
}

fn request(policy: &Policy, key: &str, body: &str, nonce: u64) -> Request {
    policy.request(
        &intake(Some("alice"), &[key.as_bytes()], body.as_bytes()),
        nonce,
    )
}

/// Drives a request to its first non-store step on a MemoryStore.
fn drive(req: &mut Request, store: &mut MemoryStore, now: UnixMillis) -> Step {
    req.drive(store, now, &mut Waiters::default()).unwrap()
}

fn events(req: &mut Request) -> Vec<&'static str> {
    std::iter::from_fn(|| req.poll_event())
        .map(|e| e.name())
        .collect()
}

#[test]
fn a_new_key_runs_once_and_a_retry_replays_what_was_stored() {
    // IDEM-EXEC-1 IDEM-REPLAY-1 IDEM-REPLAY-2 IDEM-OUT-5 IDEM-EVT-1
    let policy = policy();
    let mut store = MemoryStore::default();
    let mut first = request(&policy, "k1", r#"{"a":1}"#, 7);
    let Step::Run(ctx) = drive(&mut first, &mut store, T0) else {
        panic!("a new key runs");
    };
    assert_eq!((ctx.recovered, ctx.fence), (false, 1));
    assert_eq!(ctx.lease_expires, at(5_000));
    first.handle_outcome(Outcome::Final(ok(r#"{"id":1}"#)));
    assert_eq!(
        drive(&mut first, &mut store, T0),
        Step::Done(Finish::Stored)
    );
    assert_eq!(events(&mut first), ["executed", "completed"]);

    let mut retry = request(&policy, "k1", r#"{ "a": 1 }"#, 8);
    assert_eq!(drive(&mut retry, &mut store, at(1)), Step::Reply);
    let reply = retry.reply().unwrap();
    assert!(reply.is_replay());
    assert_eq!(reply.status(), 201);
    assert_eq!(reply.body(), br#"{"id":1}"#);
    let headers: Vec<_> = reply.headers().collect();
    assert_eq!(
        headers,
        [
            ("content-type", "application/json"),
            (REPLAYED_HEADER, "true")
        ]
    );
    assert_eq!(events(&mut retry), ["replayed"]);
}

#[test]
fn a_replay_carries_the_stored_headers_but_not_those_of_the_connection() {
    // IDEM-REPLAY-4
    let policy = policy();
    let mut store = MemoryStore::default();
    let mut first = request(&policy, "k1", "{}", 7);
    assert!(matches!(drive(&mut first, &mut store, T0), Step::Run(_)));
    let sent = [
        ("Location", "/orders/1"),
        ("Set-Cookie", "a=1"),
        ("Set-Cookie", "b=2"),
        ("Content-Length", "8"),
        ("Transfer-Encoding", "chunked"),
        ("connection", "close"),
        ("Keep-Alive", "timeout=5"),
        ("TE", "trailers"),
        ("upgrade", "h2c"),
        ("Proxy-Connection", "keep-alive"),
        ("x-request-cost", "3"),
    ];
    first.handle_outcome(Outcome::Final(StoredResponse {
        status: 201,
        headers: sent
            .iter()
            .map(|(n, v)| ((*n).to_owned(), (*v).to_owned()))
            .collect(),
        body: br#"{"id":1}"#.to_vec(),
    }));
    assert_eq!(
        drive(&mut first, &mut store, T0),
        Step::Done(Finish::Stored)
    );
    let mut retry = request(&policy, "k1", "{}", 8);
    assert_eq!(drive(&mut retry, &mut store, at(1)), Step::Reply);
    let reply = retry.reply().unwrap();
    let headers: Vec<_> = reply.headers().collect();
    assert_eq!(
        headers,
        [
            ("Location", "/orders/1"),
            ("Set-Cookie", "a=1"),
            ("Set-Cookie", "b=2"),
            ("x-request-cost", "3"),
            (REPLAYED_HEADER, "true")
        ]
    );
}

#[test]
fn every_refusal_is_problem_json_with_its_type_and_requirement() {
    // IDEM-KEY-1 IDEM-KEY-3 IDEM-KEY-5 IDEM-FP-6 IDEM-SCOPE-3 IDEM-CONC-1 IDEM-FP-1
    let policy = policy();
    let mut store = MemoryStore::default();
    let refused = |keys: &[&[u8]], principal: Option<&str>, body: &str| {
        let mut req = policy.request(&intake(principal, keys, body.as_bytes()), 1);
        assert_eq!(
            req.poll(T0, &mut Waiters::default()),
            Step::Reply,
            "refused at once"
        );
        assert_eq!(events(&mut req), ["rejected"]);
        req.reply().unwrap()
    };
    let check = |reply: Reply, status: u16, slug: &str, requirement: &str| {
        assert_eq!(reply.status(), status);
        assert_eq!(
            reply.problem_type(),
            Some(format!("urn:idem:problem:{slug}").as_str())
        );
        assert_eq!(reply.requirement(), Some(requirement));
        let body: serde_json::Value = serde_json::from_slice(reply.body()).unwrap();
        assert_eq!(body["requirement"], requirement);
        assert_eq!(body["status"], status);
        assert!(reply
            .headers()
            .any(|h| h == ("content-type", "application/problem+json")));
    };
    check(
        refused(&[], Some("a"), "{}"),
        400,
        "missing-key",
        "IDEM-KEY-3",
    );
    check(
        refused(&[b""], Some("a"), "{}"),
        400,
        "missing-key",
        "IDEM-KEY-3",
    );
    check(
        refused(&[b"a", b"b"], Some("a"), "{}"),
        400,
        "malformed-key",
        "IDEM-KEY-5",
    );
    check(
        refused(&[b"\"a\", \"b\""], Some("a"), "{}"),
        400,
        "malformed-key",
        "IDEM-KEY-5",
    );
    check(
        refused(&[b"k\x01"], Some("a"), "{}"),
        400,
        "malformed-key",
        "IDEM-KEY-1",
    );
    check(
        refused(&[b"k"], Some("a"), "{"),
        400,
        "invalid-json",
        "IDEM-FP-6",
    );
    check(
        refused(&[b"k"], Some(""), "{}"),
        500,
        "no-principal",
        "IDEM-SCOPE-3",
    );

    // A duplicate in flight: 409 with Retry-After (IDEM-CONC-3); a changed payload: 422
    // naming fields.
    let mut first = request(&policy, "k", r#"{"a":1,"b":2}"#, 1);
    assert!(matches!(drive(&mut first, &mut store, T0), Step::Run(_)));
    let mut dup = request(&policy, "k", r#"{"a":1,"b":2}"#, 2);
    assert_eq!(drive(&mut dup, &mut store, at(1_500)), Step::Reply);
    let reply = dup.reply().unwrap();
    check(reply.clone(), 409, "in-progress", "IDEM-CONC-1");
    assert!(reply.headers().any(|h| h == ("retry-after", "4")));
    let mut changed = request(&policy, "k", r#"{"a":1,"b":3}"#, 3);
    assert_eq!(drive(&mut changed, &mut store, at(1)), Step::Reply);
    let reply = changed.reply().unwrap();
    check(reply.clone(), 422, "key-reuse-mismatch", "IDEM-FP-1");
    let body: serde_json::Value = serde_json::from_slice(reply.body()).unwrap();
    assert!(body["detail"]
        .as_str()
        .unwrap()
        .ends_with("differing fields: b"));
}

#[test]
fn principals_scope_keys_and_one_tenant_is_said_explicitly() {
    // IDEM-SCOPE-1 IDEM-SCOPE-2 IDEM-SCOPE-3
    let policy = policy();
    let key = |p: Option<&str>| policy.request(&intake(p, &[b"k"], b"{}"), 1).key().clone();
    assert_ne!(key(Some("alice")), key(Some("bob")));
    assert_ne!(key(None), key(Some("alice")));
    assert_eq!(key(Some("alice")), key(Some("alice")));
    // The principal reaches the store only as a digest.
    assert!(!key(Some("secret-token"))
        .storage_key()
        .contains("secret-token"));
}

#[test]
fn a_claim_that_keeps_losing_races_answers_in_progress() {
    // IDEM-CONC-1 IDEM-STORE-1
    struct Fights(MemoryStore, usize);
    impl Store for Fights {
        type Error = MemoryStoreError;
        fn load(&self, key: &RecordKey) -> Result<Option<Record>, MemoryStoreError> {
            self.0.load(key)
        }
        fn apply(&mut self, _: UnixMillis, _: Write) -> Result<Applied, MemoryStoreError> {
            self.1 += 1;
            Ok(Applied::Conflict)
        }
    }
    let mut store = Fights(MemoryStore::default(), 0);
    let mut req = request(&policy(), "k", "{}", 1);
    assert_eq!(
        req.drive(&mut store, T0, &mut Waiters::default()).unwrap(),
        Step::Reply
    );
    assert_eq!(store.1, MAX_LOST_RACES);
    assert_eq!(req.decision(), Some(&Decision::CONTENDED));
    assert_eq!(req.reply().unwrap().status(), 409);
}

#[test]
fn store_failures_answer_503_before_running_and_leave_the_lease_after() {
    // IDEM-STORE-3 IDEM-STORE-4 IDEM-OUT-5
    struct Down;
    impl Store for Down {
        type Error = &'static str;
        fn load(&self, _: &RecordKey) -> Result<Option<Record>, &'static str> {
            Err("down")
        }
        fn apply(&mut self, _: UnixMillis, _: Write) -> Result<Applied, &'static str> {
            Err("down")
        }
    }
    let mut waiters = Waiters::default();
    let mut req = request(&policy(), "k", "{}", 1);
    assert_eq!(req.drive(&mut Down, T0, &mut waiters), Err("down"));
    assert_eq!(req.poll(T0, &mut waiters), Step::Reply);
    let reply = req.reply().unwrap();
    assert_eq!(reply.status(), 503);
    assert_eq!(
        reply.problem_type(),
        Some("urn:idem:problem:store-unavailable")
    );
    assert!(reply.headers().any(|h| h == ("retry-after", "1")));

    // A full MemoryStore answers store-full.
    let mut full = MemoryStore::new(MemoryStoreLimits {
        max_entries: 1,
        max_bytes: 1 << 20,
    });
    let policy = policy();
    let mut a = request(&policy, "a", "{}", 1);
    assert!(matches!(drive(&mut a, &mut full, T0), Step::Run(_)));
    let mut b = request(&policy, "b", "{}", 2);
    assert!(b.drive(&mut full, T0, &mut waiters).is_err());
    assert_eq!(b.poll(T0, &mut waiters), Step::Reply);
    assert_eq!(
        b.reply().unwrap().problem_type(),
        Some("urn:idem:problem:store-full")
    );

    // The completion fails: the response is still sent, nothing is stored.
    let mut c = request(&policy, "c", "{}", 3);
    let mut store = MemoryStore::default();
    assert!(matches!(drive(&mut c, &mut store, T0), Step::Run(_)));
    c.handle_outcome(Outcome::Final(ok("x")));
    assert!(matches!(c.poll(T0, &mut waiters), Step::Apply(_)));
    c.handle_store_error(StoreFailure::Unavailable, &mut waiters);
    assert_eq!(
        c.poll(T0, &mut waiters),
        Step::Done(Finish::StoreFailed(StoreFailure::Unavailable))
    );
}

#[test]
fn a_claim_whose_answer_was_lost_is_withdrawn_before_the_503() {
    // IDEM-STORE-12 IDEM-STORE-4: the store wrote the claim, the host saw a timeout.
    let policy = policy();
    let mut store = MemoryStore::default();
    let mut waiters = Waiters::default();
    let mut req = request(&policy, "k", "{}", 1);
    assert_eq!(req.poll(T0, &mut waiters), Step::Claim);
    req.handle_record(T0, None, &mut waiters);
    let Step::Apply(claim) = req.poll(T0, &mut waiters) else {
        panic!("the claim's write");
    };
    let WriteOp::Put(created) = &claim.op else {
        panic!("a claim writes a record");
    };
    let version = created.version;
    assert_eq!(store.apply(T0, claim).unwrap(), Applied::Applied);
    req.handle_store_error(StoreFailure::Unavailable, &mut waiters);
    let Step::Apply(withdrawal) = req.poll(at(1), &mut waiters) else {
        panic!("the withdrawal comes before the answer");
    };
    assert_eq!(withdrawal.key, *req.key());
    assert_eq!(withdrawal.precondition, Precondition::Version(version));
    assert_eq!(withdrawal.op, WriteOp::Delete);
    // Its own result changes nothing of the answer: applied here, lost or refused elsewhere.
    let applied = store.apply(at(1), withdrawal).unwrap();
    assert_eq!(applied, Applied::Applied);
    req.handle_applied(at(1), applied, &mut waiters);
    assert_eq!(req.poll(at(1), &mut waiters), Step::Reply);
    assert_eq!(req.reply().unwrap().status(), 503);
    assert_eq!(events(&mut req), ["rejected"]);
    // The retry runs at once, as a first attempt: the key is not held until the lease ends.
    let mut retry = request(&policy, "k", "{}", 2);
    let Step::Run(ctx) = drive(&mut retry, &mut store, at(2)) else {
        panic!("the retry runs");
    };
    assert!(!ctx.recovered);

    // The same through `drive`, over a store that writes and then fails: the withdrawal is
    // applied before the error is returned.
    struct Lost(MemoryStore);
    impl Store for Lost {
        type Error = &'static str;
        fn load(&self, key: &RecordKey) -> Result<Option<Record>, &'static str> {
            Ok(self.0.get(key).cloned())
        }
        fn apply(&mut self, now: UnixMillis, write: Write) -> Result<Applied, &'static str> {
            let deletes = write.op == WriteOp::Delete;
            let applied = self.0.apply(now, write).unwrap();
            if deletes {
                Ok(applied)
            } else {
                Err("timed out")
            }
        }
    }
    let mut lost = Lost(MemoryStore::default());
    let mut req = request(&policy, "j", "{}", 3);
    assert_eq!(req.drive(&mut lost, T0, &mut waiters), Err("timed out"));
    assert_eq!(req.poll(T0, &mut waiters), Step::Reply);
    assert!(lost.0.get(req.key()).is_none(), "withdrawn");
}

#[test]
fn a_store_claim_whose_answer_was_lost_is_withdrawn_by_the_nonce_it_was_given() {
    // IDEM-STORE-12: a store that claims for the host (a Durable Object) made the claim with
    // the nonce it was given; its answer never came back.
    let policy = policy();
    let mut store = MemoryStore::default();
    let mut waiters = Waiters::default();
    let mut req = request(&policy, "k", "{}", 1);
    assert_eq!(req.poll(T0, &mut waiters), Step::Claim);
    let ticket = req.claim_ticket(77);
    let mut there = policy.resume(ticket, 77);
    assert!(matches!(drive(&mut there, &mut store, T0), Step::Run(_)));
    assert_eq!(store.get(req.key()).map(|r| r.version), Some(77));
    req.handle_store_error(StoreFailure::Unavailable, &mut waiters);
    let Step::Apply(withdrawal) = req.poll(at(1), &mut waiters) else {
        panic!("the withdrawal comes before the answer");
    };
    assert_eq!(withdrawal.precondition, Precondition::Version(77));
    assert_eq!(withdrawal.op, WriteOp::Delete);
    let applied = store.apply(at(1), withdrawal).unwrap();
    req.handle_applied(at(1), applied, &mut waiters);
    assert_eq!(req.poll(at(1), &mut waiters), Step::Reply);
    assert_eq!(req.reply().unwrap().status(), 503);
    let mut retry = request(&policy, "k", "{}", 2);
    assert!(matches!(drive(&mut retry, &mut store, at(2)), Step::Run(_)));

    // A plain read that failed wrote nothing: no withdrawal.
    let mut read = request(&policy, "r", "{}", 3);
    assert_eq!(read.poll(T0, &mut waiters), Step::Claim);
    read.handle_store_error(StoreFailure::Unavailable, &mut waiters);
    assert_eq!(read.poll(T0, &mut waiters), Step::Reply);
}

#[test]
fn a_claim_that_no_store_wrote_or_that_replaced_a_record_is_not_withdrawn() {
    // IDEM-STORE-12: a full store wrote nothing; a takeover's claim keeps the lease it took,
    // so that the next attempt is still told it recovers.
    let policy = policy();
    let mut waiters = Waiters::default();
    let mut req = request(&policy, "k", "{}", 1);
    assert_eq!(req.poll(T0, &mut waiters), Step::Claim);
    req.handle_record(T0, None, &mut waiters);
    assert!(matches!(req.poll(T0, &mut waiters), Step::Apply(_)));
    req.handle_store_error(StoreFailure::Full, &mut waiters);
    assert_eq!(req.poll(T0, &mut waiters), Step::Reply);

    let mut store = MemoryStore::default();
    let mut crashed = request(&policy, "t", "{}", 2);
    assert!(matches!(drive(&mut crashed, &mut store, T0), Step::Run(_)));
    // The lease (5 s) ends without an outcome; the next attempt's claim replaces the record.
    let mut next = request(&policy, "t", "{}", 3);
    assert_eq!(next.poll(at(6_000), &mut waiters), Step::Claim);
    let record = store.get(next.key()).cloned();
    next.handle_record(at(6_000), record.as_ref(), &mut waiters);
    let Step::Apply(takeover) = next.poll(at(6_000), &mut waiters) else {
        panic!("the takeover's write");
    };
    assert!(matches!(takeover.precondition, Precondition::Version(_)));
    assert_eq!(store.apply(at(6_000), takeover).unwrap(), Applied::Applied);
    next.handle_store_error(StoreFailure::Unavailable, &mut waiters);
    assert_eq!(next.poll(at(6_001), &mut waiters), Step::Reply);
    // Its lease ends it, and the attempt after that recovers.
    let mut last = request(&policy, "t", "{}", 4);
    let Step::Run(ctx) = drive(&mut last, &mut store, at(12_000)) else {
        panic!("the attempt after the lease runs");
    };
    assert!(ctx.recovered);
}

#[test]
fn a_heartbeat_on_its_way_when_the_handler_returns_never_fences_out_the_completion() {
    // IDEM-LEASE-3 IDEM-LEASE-4
    let policy = policy();
    let mut store = MemoryStore::default();
    let mut waiters = Waiters::default();
    let mut req = request(&policy, "k", "{}", 1);
    assert!(matches!(drive(&mut req, &mut store, T0), Step::Run(_)));
    req.heartbeat(at(4_000)).unwrap();
    let Step::Apply(extension) = req.poll(at(4_000), &mut waiters) else {
        panic!("the heartbeat's write");
    };
    // The handler returns while the heartbeat's write is still on its way.
    req.handle_outcome(Outcome::Final(ok("done")));
    assert_eq!(
        req.poll(at(4_001), &mut waiters),
        Step::Idle,
        "one write at a time"
    );
    assert_eq!(store.apply(at(4_001), extension).unwrap(), Applied::Applied);
    req.handle_applied(at(4_001), Applied::Applied, &mut waiters);
    // The completion carries the extended lease and is stored.
    assert_eq!(
        drive(&mut req, &mut store, at(4_002)),
        Step::Done(Finish::Stored)
    );
    assert_eq!(events(&mut req), ["executed", "extended", "completed"]);
    // A heartbeat after the outcome is refused, not written.
    assert!(req.heartbeat(at(4_003)).is_err());
}

#[test]
fn the_answer_is_due_by_the_end_of_the_lease_as_heartbeats_extend_it() {
    // IDEM-OUT-7
    let policy = policy();
    let mut store = MemoryStore::default();
    let mut waiters = Waiters::default();
    let mut req = request(&policy, "k", "{}", 1);
    assert_eq!(req.answer_due(), None, "no lease before the claim");
    let Step::Run(ctx) = drive(&mut req, &mut store, T0) else {
        panic!("the claim");
    };
    assert_eq!(ctx.lease_expires, at(5_000));
    assert_eq!(req.answer_due(), Some(at(5_000)));
    req.heartbeat(at(4_000)).unwrap();
    let Step::Apply(extension) = req.poll(at(4_000), &mut waiters) else {
        panic!("the heartbeat's write");
    };
    assert_eq!(req.answer_due(), Some(at(5_000)), "not until it is written");
    assert_eq!(store.apply(at(4_000), extension).unwrap(), Applied::Applied);
    req.handle_applied(at(4_000), Applied::Applied, &mut waiters);
    assert_eq!(req.answer_due(), Some(at(9_000)), "extended by one lease");
    // An answer let go at its due time is an unknown outcome; nothing more is due.
    req.handle_outcome(Outcome::Unknown(None));
    assert_eq!(req.answer_due(), None);
    assert_eq!(
        drive(&mut req, &mut store, at(9_000)),
        Step::Done(Finish::OutcomeUnknown)
    );
    assert_eq!(req.answer_due(), None);
}

#[test]
fn a_completion_that_may_not_have_committed_the_handlers_writes_replaces_its_response() {
    // IDEM-STORE-7 IDEM-OUT-5: a failed completion leaves the handler's response to go out,
    // unless the write was to commit the handler's own writes.
    for (failure, replaced) in [
        (StoreFailure::Unavailable, false),
        (StoreFailure::Uncommitted, true),
    ] {
        let policy = policy();
        let mut store = MemoryStore::default();
        let mut waiters = Waiters::default();
        let mut req = request(&policy, "k", "{}", 1);
        assert!(matches!(drive(&mut req, &mut store, T0), Step::Run(_)));
        req.handle_outcome(Outcome::Final(ok("done")));
        let Step::Apply(_) = req.poll(at(1), &mut waiters) else {
            panic!("the completion's write");
        };
        req.handle_store_error(failure, &mut waiters);
        assert_eq!(
            req.poll(at(2), &mut waiters),
            Step::Done(Finish::StoreFailed(failure))
        );
        let reply = req.reply();
        assert_eq!(reply.is_some(), replaced, "{failure:?}");
        if let Some(reply) = reply {
            assert_eq!(reply.status(), 503);
            let body: serde_json::Value = serde_json::from_slice(reply.body()).unwrap();
            assert_eq!(body["type"], "urn:idem:problem:store-unavailable");
            assert_eq!(body["requirement"], "IDEM-STORE-7");
        }
    }
}

#[test]
fn a_heartbeat_whose_answer_was_lost_does_not_fence_out_its_own_completion() {
    // IDEM-LEASE-4
    let policy = policy();
    let mut store = MemoryStore::default();
    let mut waiters = Waiters::default();
    let mut req = request(&policy, "k", "{}", 1);
    assert!(matches!(drive(&mut req, &mut store, T0), Step::Run(_)));
    req.heartbeat(at(1_000)).unwrap();
    let Step::Apply(extension) = req.poll(at(1_000), &mut waiters) else {
        panic!("the heartbeat's write");
    };
    // The store applied it, but the host saw a timeout.
    assert_eq!(store.apply(at(1_000), extension).unwrap(), Applied::Applied);
    req.handle_store_error(StoreFailure::Unavailable, &mut waiters);
    assert_eq!(
        req.heartbeat_state(),
        Heartbeat::Failed(StoreFailure::Unavailable)
    );
    req.handle_outcome(Outcome::Final(ok("done")));
    // The completion conflicts, reads the record, finds it still its own and completes.
    assert_eq!(
        drive(&mut req, &mut store, at(2_000)),
        Step::Done(Finish::Stored)
    );
    let mut retry = request(&policy, "k", "{}", 2);
    assert_eq!(drive(&mut retry, &mut store, at(2_001)), Step::Reply);
    assert_eq!(retry.reply().unwrap().body(), b"done");
}

#[test]
fn a_completion_that_landed_and_was_sent_again_is_its_own() {
    // IDEM-STORE-1 IDEM-LEASE-2: the store made the completion, its answer was lost, and the
    // client sent it again (ioredis does), which found the record already changed: what it
    // finds is this lease's own completion, not another attempt's.
    let policy = policy();
    let mut store = MemoryStore::default();
    let mut waiters = Waiters::default();
    let mut req = request(&policy, "k", "{}", 1);
    assert!(matches!(drive(&mut req, &mut store, T0), Step::Run(_)));
    let _ = events(&mut req);
    req.handle_outcome(Outcome::Final(ok("done")));
    let Step::Apply(completion) = req.poll(at(1_000), &mut waiters) else {
        panic!("the completion's write");
    };
    assert_eq!(
        store.apply(at(1_000), completion.clone()).unwrap(),
        Applied::Applied
    );
    // Sent again: its precondition no longer holds.
    assert_eq!(
        store.apply(at(1_000), completion).unwrap(),
        Applied::Conflict
    );
    req.handle_applied(at(1_000), Applied::Conflict, &mut waiters);
    assert_eq!(
        drive(&mut req, &mut store, at(1_000)),
        Step::Done(Finish::Stored)
    );
    let names = events(&mut req);
    assert!(!names.contains(&"fenced-out"), "{names:?}");
    // The handler's own answer goes out, not the key's outcome as a replay.
    assert!(req.reply().is_none());
    let mut retry = request(&policy, "k", "{}", 2);
    assert_eq!(drive(&mut retry, &mut store, at(1_001)), Step::Reply);
    assert_eq!(retry.reply().unwrap().body(), b"done");
}

#[test]
fn a_completion_after_a_takeover_is_fenced_out() {
    // IDEM-LEASE-1 IDEM-LEASE-2
    let policy = policy();
    let mut store = MemoryStore::default();
    let mut zombie = request(&policy, "k", "{}", 1);
    assert!(matches!(drive(&mut zombie, &mut store, T0), Step::Run(_)));
    let mut second = request(&policy, "k", "{}", 2);
    let Step::Run(ctx) = drive(&mut second, &mut store, at(5_000)) else {
        panic!("the lease ended: a retry takes over");
    };
    assert_eq!((ctx.recovered, ctx.fence), (true, 2));
    zombie.handle_outcome(Outcome::Final(ok("zombie")));
    assert_eq!(
        drive(&mut zombie, &mut store, at(5_001)),
        Step::Done(Finish::FencedOut)
    );
    assert_eq!(events(&mut zombie), ["executed", "fenced-out"]);
    assert_eq!(zombie.heartbeat(at(5_002)), Err(Heartbeat::FencedOut));
    second.handle_outcome(Outcome::Final(ok("second")));
    assert_eq!(
        drive(&mut second, &mut store, at(5_002)),
        Step::Done(Finish::Stored)
    );
    // The zombie's heartbeat, had it come first, would have been fenced out too.
    let mut z2 = request(&policy, "z", "{}", 3);
    assert!(matches!(drive(&mut z2, &mut store, T0), Step::Run(_)));
    let mut t2 = request(&policy, "z", "{}", 4);
    assert!(matches!(
        drive(&mut t2, &mut store, at(6_000)),
        Step::Run(_)
    ));
    assert_eq!(z2.heartbeat(at(6_001)), Err(Heartbeat::Expired));
}

#[test]
fn a_body_is_read_within_the_limit_and_refused_past_it() {
    // IDEM-LIMIT-1: a declared length past the limit before anything is read, an undeclared
    // body as soon as it goes past it; both the core's 413.
    let policy = policy().with_fingerprint(FingerprintSpec {
        max_body: 8,
        ..FingerprintSpec::default()
    });
    let too_large = policy.read_body(Some(9)).unwrap_err();
    assert_eq!(too_large.status(), 413);
    assert_eq!(
        too_large.problem_type(),
        Some("urn:idem:problem:body-too-large")
    );
    let mut exact = policy.read_body(Some(8)).unwrap();
    exact.push(b"1234").unwrap();
    exact.push(b"5678").unwrap();
    assert_eq!(exact.finish(), b"12345678");
    let mut chunked = policy.read_body(None).unwrap();
    chunked.push(b"12345").unwrap();
    let past = chunked.push(b"6789").unwrap_err();
    assert_eq!(past.status(), 413);
    assert_eq!(past.requirement(), Some("IDEM-LIMIT-1"));
}

#[test]
fn a_superseded_attempt_answers_with_the_keys_outcome() {
    // IDEM-LEASE-5: the caller of an attempt whose lease was taken over is told what a retry
    // would be told, never the handler's own answer.
    let policy = policy();
    let mut store = MemoryStore::default();
    let superseded = |key: &str, successor: Option<Outcome>| {
        let mut store = MemoryStore::default();
        let mut zombie = request(&policy, key, "{}", 1);
        assert!(matches!(drive(&mut zombie, &mut store, T0), Step::Run(_)));
        let mut second = request(&policy, key, "{}", 2);
        assert!(matches!(
            drive(&mut second, &mut store, at(5_000)),
            Step::Run(_)
        ));
        if let Some(outcome) = successor {
            second.handle_outcome(outcome);
            assert!(matches!(
                drive(&mut second, &mut store, at(5_001)),
                Step::Done(_)
            ));
        }
        zombie.handle_outcome(Outcome::Final(ok("zombie")));
        assert_eq!(
            drive(&mut zombie, &mut store, at(5_002)),
            Step::Done(Finish::FencedOut)
        );
        zombie
            .reply()
            .expect("the answer that replaces the handler's")
    };
    // The successor stored its response: it is replayed.
    let replay = superseded("done", Some(Outcome::Final(ok("second"))));
    assert!(replay.is_replay());
    assert_eq!((replay.status(), replay.body()), (201, &b"second"[..]));
    // The successor still runs: 409 in-progress, with the time left of its lease.
    let busy = superseded("busy", None);
    assert_eq!(busy.problem_type(), Some("urn:idem:problem:in-progress"));
    assert!(busy.headers().any(|h| h == ("retry-after", "5")));
    // The successor released the key: nothing is recorded, 409 superseded.
    let released = superseded("released", Some(Outcome::Retryable));
    assert_eq!(released.status(), 409);
    assert_eq!(released.problem_type(), Some("urn:idem:problem:superseded"));
    assert_eq!(released.requirement(), Some("IDEM-LEASE-5"));
    assert!(released.headers().any(|h| h == ("retry-after", "1")));
    // A request that completed normally has no such answer.
    let mut fine = request(&policy, "fine", "{}", 5);
    assert!(matches!(drive(&mut fine, &mut store, T0), Step::Run(_)));
    fine.handle_outcome(Outcome::Final(ok("fine")));
    assert_eq!(drive(&mut fine, &mut store, T0), Step::Done(Finish::Stored));
    assert_eq!(fine.reply(), None);
}

#[test]
fn an_in_flight_duplicate_is_told_to_come_back_within_the_bound() {
    // IDEM-CONC-3 IDEM-CONC-4: the time left of the lease, never more than the bound.
    let mut store = MemoryStore::default();
    for (lease, bound, expected) in [(60, 2, "2"), (60, 5, "5"), (3, 60, "3"), (60, 0, "1")] {
        let policy = Policy::new(
            Engine::new(Config {
                lease: Duration::from_secs(lease),
                max_retry_after: Duration::from_millis(bound * 1000 + 1),
                ..Config::default()
            })
            .unwrap(),
        );
        let key = format!("bound-{lease}-{bound}");
        let mut first = request(&policy, &key, "{}", 1);
        assert!(matches!(drive(&mut first, &mut store, T0), Step::Run(_)));
        let mut dup = request(&policy, &key, "{}", 2);
        assert_eq!(drive(&mut dup, &mut store, at(10)), Step::Reply);
        let reply = dup.reply().unwrap();
        assert!(
            reply.headers().any(|h| h == ("retry-after", expected)),
            "lease {lease} s, bound {bound} s: {:?}",
            reply.header_pairs()
        );
    }
    let zero = Engine::new(Config {
        max_retry_after: Duration::ZERO,
        ..Config::default()
    });
    assert_eq!(
        zero.unwrap_err(),
        ConfigError::ZeroDuration("max_retry_after")
    );
}

#[test]
fn a_lease_never_outlives_its_key() {
    // IDEM-LEASE-4 IDEM-STORE-3 IDEM-TTL-2
    // A lease longer than the key retention is refused.
    let long = Config {
        lease: Duration::from_secs(31),
        ..config()
    };
    assert_eq!(
        Engine::new(long).unwrap_err(),
        ConfigError::LeaseLongerThanKeyTtl
    );

    // Heartbeats carry the key's retention with them.
    let policy = policy();
    let mut store = MemoryStore::default();
    let mut req = request(&policy, "k", "{}", 1);
    assert!(matches!(drive(&mut req, &mut store, T0), Step::Run(_)));
    let mut now = T0;
    for _ in 0..10 {
        now = UnixMillis(now.0 + 4_000);
        req.heartbeat(now).unwrap();
        assert!(matches!(drive(&mut req, &mut store, now), Step::Idle));
        assert!(matches!(req.heartbeat_state(), Heartbeat::Extended(_)));
        store.sweep(now);
    }
    // 40 s in: past the first key expiry (30 s), the key is still remembered and held.
    let record = store.get(req.key()).unwrap().clone();
    assert_eq!(record.key_expires, UnixMillis(now.0 + 30_000));
    let mut dup = request(&policy, "k", "{}", 2);
    assert_eq!(drive(&mut dup, &mut store, now), Step::Reply);
    assert_eq!(dup.reply().unwrap().status(), 409);
    req.handle_outcome(Outcome::Final(ok("late")));
    assert_eq!(drive(&mut req, &mut store, now), Step::Done(Finish::Stored));

    // A record whose key has expired while its lease is live (written by a host with other
    // settings) is still present: never absent, never swept.
    let k = RecordKey::new(Scope::new("a", "POST", "/x"), "old");
    let fp = Fingerprint::from_digest([1; 32]);
    let held = Record {
        version: 9,
        fence: 3,
        fingerprint: fp.clone(),
        created: T0,
        key_expires: at(1_000),
        state: RecordState::InFlight {
            lease_expires: at(9_000),
        },
    };
    assert!(held.is_live(at(5_000)));
    assert_eq!(held.next_deadline(), at(9_000));
    assert!(matches!(held.expire(at(5_000)), Expiry::Keep(Some(t)) if t == at(9_000)));
    let mut store = MemoryStore::default();
    let put = Write {
        key: k.clone(),
        precondition: Precondition::Absent,
        op: WriteOp::Put(held),
    };
    assert_eq!(store.apply(T0, put).unwrap(), Applied::Applied);
    let ticket = Ticket {
        key: k.clone(),
        fingerprint: fp,
        subject: Subject::Record,
    };
    let mut dup = policy.resume(ticket, 1);
    assert_eq!(drive(&mut dup, &mut store, at(5_000)), Step::Reply);
    assert!(matches!(dup.decision(), Some(Decision::InProgress { .. })));
    assert_eq!(store.sweep(at(5_000)), 0);
    assert!(store.get(&k).is_some(), "a live lease is never swept");
    assert_eq!(store.sweep(at(9_000)), 1);
    assert!(store.get(&k).is_none());
}

#[test]
fn the_latest_waiter_waits_and_an_earlier_one_is_answered() {
    // IDEM-CONC-1 IDEM-CONC-2
    let policy = policy()
        .with_in_flight(InFlight::Wait {
            max: Duration::from_secs(3),
            poll: Duration::from_millis(100),
        })
        .unwrap();
    let mut store = MemoryStore::default();
    let mut waiters = Waiters::default();
    let mut first = request(&policy, "k", "{}", 1);
    assert!(matches!(
        first.drive(&mut store, T0, &mut waiters).unwrap(),
        Step::Run(_)
    ));
    let mut early = request(&policy, "k", "{}", 2);
    assert_eq!(
        early.drive(&mut store, at(10), &mut waiters).unwrap(),
        Step::WaitUntil(at(110))
    );
    let mut late = request(&policy, "k", "{}", 3);
    assert_eq!(
        late.drive(&mut store, at(50), &mut waiters).unwrap(),
        Step::WaitUntil(at(150))
    );
    // The earlier waiter's client has retried: it is answered at its next look.
    assert_eq!(
        early.drive(&mut store, at(110), &mut waiters).unwrap(),
        Step::Reply
    );
    assert_eq!(early.reply().unwrap().status(), 409);
    // The latest keeps waiting, and gets the first attempt's result once it is stored.
    assert_eq!(
        late.drive(&mut store, at(150), &mut waiters).unwrap(),
        Step::WaitUntil(at(250))
    );
    first.handle_outcome(Outcome::Final(ok("first")));
    assert_eq!(
        first.drive(&mut store, at(200), &mut waiters).unwrap(),
        Step::Done(Finish::Stored)
    );
    assert_eq!(
        late.drive(&mut store, at(250), &mut waiters).unwrap(),
        Step::Reply
    );
    assert_eq!(late.reply().unwrap().body(), b"first");
    assert!(waiters.is_empty(), "finished waiters leave");

    // Past the bound the answer is 409.
    let mut blocker = request(&policy, "b", "{}", 4);
    assert!(matches!(
        blocker.drive(&mut store, T0, &mut waiters).unwrap(),
        Step::Run(_)
    ));
    let mut waiter = request(&policy, "b", "{}", 5);
    let mut now = T0;
    let step = loop {
        match waiter.drive(&mut store, now, &mut waiters).unwrap() {
            Step::WaitUntil(t) => now = t,
            other => break other,
        }
    };
    assert_eq!(step, Step::Reply);
    assert_eq!(now, at(3_000));
    assert_eq!(waiter.reply().unwrap().status(), 409);
    assert!(waiters.is_empty());
}

#[test]
fn a_response_too_large_for_the_store_is_held_with_a_problem_never_run_again() {
    // IDEM-STORE-5
    let policy = policy().with_max_response_bytes(1_000);
    let mut store = MemoryStore::default();
    let mut first = request(&policy, "k", "{}", 1);
    assert!(matches!(drive(&mut first, &mut store, T0), Step::Run(_)));
    first.handle_outcome(Outcome::Final(StoredResponse {
        status: 200,
        headers: vec![],
        body: vec![b'x'; 5_000],
    }));
    assert_eq!(
        drive(&mut first, &mut store, T0),
        Step::Done(Finish::Stored)
    );
    let mut retry = request(&policy, "k", "{}", 2);
    assert_eq!(
        drive(&mut retry, &mut store, at(1)),
        Step::Reply,
        "never runs again"
    );
    let reply = retry.reply().unwrap();
    assert_eq!(reply.status(), 410);
    let body: serde_json::Value = serde_json::from_slice(reply.body()).unwrap();
    assert_eq!(body["type"], "urn:idem:problem:response-not-stored");
    assert_eq!(body["requirement"], "IDEM-STORE-5");
}

#[test]
fn a_response_streamed_past_the_limit_is_held_with_a_problem_by_its_status() {
    // IDEM-STORE-5: a host that passes a long body through reports it without the bytes.
    let policy = policy().with_max_response_bytes(1_000);
    let mut store = MemoryStore::default();
    let mut first = request(&policy, "k", "{}", 1);
    assert!(matches!(drive(&mut first, &mut store, T0), Step::Run(_)));
    assert_eq!(first.max_response_bytes(), 1_000);
    first.handle_oversized(201);
    assert_eq!(
        drive(&mut first, &mut store, T0),
        Step::Done(Finish::Stored)
    );
    let mut retry = request(&policy, "k", "{}", 2);
    assert_eq!(drive(&mut retry, &mut store, at(1)), Step::Reply);
    let reply = retry.reply().unwrap();
    assert_eq!(reply.status(), 410);
    let body: serde_json::Value = serde_json::from_slice(reply.body()).unwrap();
    assert_eq!(body["type"], "urn:idem:problem:response-not-stored");
    assert!(body["detail"].as_str().unwrap().contains("1000 bytes"));

    // A retryable status releases the key, however long its body: the next attempt runs.
    let mut busy = request(&policy, "r", "{}", 3);
    assert!(matches!(drive(&mut busy, &mut store, T0), Step::Run(_)));
    busy.handle_oversized(429);
    assert!(matches!(drive(&mut busy, &mut store, T0), Step::Done(_)));
    let mut again = request(&policy, "r", "{}", 4);
    assert!(matches!(drive(&mut again, &mut store, at(1)), Step::Run(_)));

    // An answer with trailer fields, however short, is not kept either, and says why.
    let mut trailed = request(&policy, "t", "{}", 5);
    assert!(matches!(drive(&mut trailed, &mut store, T0), Step::Run(_)));
    trailed.handle_with_trailers(200);
    assert_eq!(
        drive(&mut trailed, &mut store, T0),
        Step::Done(Finish::Stored)
    );
    let mut retry = request(&policy, "t", "{}", 6);
    assert_eq!(drive(&mut retry, &mut store, at(1)), Step::Reply);
    let reply = retry.reply().unwrap();
    assert_eq!(reply.status(), 410);
    let body: serde_json::Value = serde_json::from_slice(reply.body()).unwrap();
    assert_eq!(body["type"], "urn:idem:problem:response-not-stored");
    assert!(body["detail"].as_str().unwrap().contains("trailer fields"));
}

/// An asynchronous store over a shared MemoryStore whose every call yields once before it
/// completes, so that concurrent requests really interleave between a read and a write.
#[derive(Clone)]
struct Yielding(Rc<RefCell<MemoryStore>>);

struct YieldOnce<T>(Option<T>, bool);
impl<T: Unpin> Future for YieldOnce<T> {
    type Output = T;
    fn poll(mut self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<T> {
        if !self.1 {
            self.1 = true;
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        Poll::Ready(self.0.take().unwrap())
    }
}

impl Yielding {
    // The value is read when the call starts (as a database reads a snapshot); the answer
    // arrives one turn later.
    async fn load(&self, key: &RecordKey) -> Result<Option<Record>, MemoryStoreError> {
        let value = self.0.borrow().load(key);
        YieldOnce(Some(value), false).await
    }
    async fn apply(&self, now: UnixMillis, write: Write) -> Result<Applied, MemoryStoreError> {
        YieldOnce(Some(()), false).await;
        self.0.borrow_mut().apply(now, write)
    }
}

/// The host's loop for an asynchronous store: the same steps, one await each.
async fn handle(
    policy: &Policy,
    store: Yielding,
    waiters: Rc<RefCell<Waiters>>,
    runs: Rc<RefCell<u32>>,
    nonce: u64,
) -> (u16, bool) {
    let mut req = request(policy, "raced", "{}", nonce);
    let now = T0;
    loop {
        let step = req.poll(now, &mut waiters.borrow_mut());
        match step {
            Step::Claim | Step::Load => {
                let r = store.load(req.key()).await.unwrap();
                req.handle_record(now, r.as_ref(), &mut waiters.borrow_mut());
            }
            Step::Apply(w) => {
                let a = store.apply(now, w).await.unwrap();
                req.handle_applied(now, a, &mut waiters.borrow_mut());
            }
            Step::Run(_) => {
                *runs.borrow_mut() += 1;
                YieldOnce(Some(()), false).await;
                req.handle_outcome(Outcome::Final(ok("once")));
            }
            Step::Reply => {
                let r = req.reply().unwrap();
                return (r.status(), r.is_replay());
            }
            Step::Done(f) => {
                assert_eq!(f, Finish::Stored);
                return (201, false);
            }
            Step::WaitUntil(_) | Step::Idle => panic!("unexpected {step:?}"),
        }
    }
}

/// Runs futures round-robin to completion on one thread.
fn run_all<F: Future>(futures: Vec<F>) -> Vec<F::Output> {
    let mut futures: Vec<_> = futures.into_iter().map(Box::pin).collect();
    let mut out: Vec<Option<F::Output>> = futures.iter().map(|_| None).collect();
    let mut cx = TaskContext::from_waker(std::task::Waker::noop());
    while out.iter().any(Option::is_none) {
        for (i, f) in futures.iter_mut().enumerate() {
            if out[i].is_none() {
                if let Poll::Ready(v) = f.as_mut().poll(&mut cx) {
                    out[i] = Some(v);
                }
            }
        }
    }
    out.into_iter().map(Option::unwrap).collect()
}

#[test]
fn racing_requests_on_an_asynchronous_store_run_the_handler_once() {
    // IDEM-EXEC-1 IDEM-CONC-1 IDEM-STORE-1
    let policy = policy();
    for n in [2usize, 8, 32] {
        let store = Yielding(Rc::new(RefCell::new(MemoryStore::default())));
        let waiters = Rc::new(RefCell::new(Waiters::default()));
        let runs = Rc::new(RefCell::new(0));
        let results = run_all(
            (0..n)
                .map(|i| {
                    handle(
                        &policy,
                        store.clone(),
                        waiters.clone(),
                        runs.clone(),
                        i as u64,
                    )
                })
                .collect(),
        );
        assert_eq!(*runs.borrow(), 1, "{n} racing requests: one execution");
        assert_eq!(results.iter().filter(|r| **r == (201, false)).count(), 1);
        // Every load settled before any write: the others lost the race, decided again and
        // found the key in flight.
        assert!(results.iter().all(|r| *r == (201, false) || r.0 == 409));
    }
}

/// A store that claims for the host answers an execute as `Claimed::Execute`, with its write
/// already applied. An execute inside `Claimed::Done` (bytes that are not a claim) must not
/// make the host apply that write or run the handler: it reads as contended.
#[test]
fn an_execute_inside_a_done_claim_applies_nothing_and_reads_as_contended() {
    // IDEM-CONC-1
    let policy = policy();
    // An execute as a machine decides it on an empty store: its lease and its claim write.
    let mut other = request(&policy, "k", "{}", 1);
    let mut waiters = Waiters::default();
    assert_eq!(other.poll(T0, &mut waiters), Step::Claim);
    other.handle_record(T0, None, &mut waiters);
    let Step::Apply(write) = other.poll(T0, &mut waiters) else {
        panic!("a new key is claimed")
    };
    other.handle_applied(T0, Applied::Applied, &mut waiters);
    let Some(Hold::Record(lease)) = other.hold() else {
        panic!("the claim holds a lease")
    };
    let decision = Decision::Execute {
        lease: Box::new(lease),
        write: Box::new(write),
        recovered: false,
    };
    let mut req = request(&policy, "k", "{}", 1);
    let mut waiters = Waiters::default();
    assert_eq!(req.poll(T0, &mut waiters), Step::Claim);
    req.handle_claimed(T0, Claimed::Done(decision), &mut waiters);
    assert_eq!(req.poll(T0, &mut waiters), Step::Reply);
    let reply = req.reply().unwrap();
    assert_eq!(reply.status(), 409);
    assert!(reply
        .headers()
        .any(|(name, value)| name.eq_ignore_ascii_case("retry-after") && value == "1"));
    assert!(!reply.is_replay());
}
