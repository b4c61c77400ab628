//! Native tests of the host the JavaScript side drives: slots over the request machine, the
//! in-process store path, the asynchronous store path step by step, the Durable Object round
//! trip, and the generic store interface of the memory store.

use idem_core::{MemoryStore, MemoryStoreLimits, UnixMillis};
use idem_wasm::host::*;
use idem_wasm::interop::*;

fn host(options: EngineOptions) -> Host {
    Host::new(policy(&options).unwrap())
}

fn short() -> EngineOptions {
    EngineOptions {
        response_ttl: Some(1000.0),
        key_ttl: Some(5000.0),
        lease: Some(1000.0),
        ..EngineOptions::default()
    }
}

fn request<'a>(key: Option<&'a str>, principal: Option<&'a str>, body: &'a [u8]) -> Incoming<'a> {
    Incoming {
        key,
        principal,
        method: "POST",
        route: "/orders",
        target: "/orders?x=1",
        content_type: Some("application/json"),
        headers: "",
        body,
        low_water: None,
        client: None,
    }
}

fn at(ms: u64) -> UnixMillis {
    UnixMillis(1_700_000_000_000 + ms)
}

/// The reply bytes of a slot: status, headers, body. Its replay flag is checked against its
/// headers: a replay, and only a replay, ends with `Idempotent-Replayed: true`.
fn reply(h: &mut Host, t: u32) -> (u32, Vec<(String, String)>, Vec<u8>) {
    let bytes = h.reply(t).to_vec();
    let replayed = bytes[0] & ReplyFlag::Replayed as u8 != 0;
    let status = u32::from_le_bytes(bytes[1..5].try_into().unwrap());
    let len = u32::from_le_bytes(bytes[5..9].try_into().unwrap()) as usize;
    let head = pairs(std::str::from_utf8(&bytes[9..9 + len]).unwrap()).unwrap();
    let marked = head
        .last()
        .is_some_and(|(n, v)| n == idem_core::REPLAYED_HEADER && v == "true");
    assert_eq!(replayed, marked, "{head:?}");
    (status, head, bytes[9 + len..].to_vec())
}

fn events(h: &mut Host, t: u32) -> Vec<&'static str> {
    std::iter::from_fn(|| h.poll_event(t).unwrap())
        .map(|e| e.name())
        .collect()
}

#[test]
fn memory_path_runs_once_and_replays() {
    // IDEM-EXEC-1 IDEM-REPLAY-1 IDEM-REPLAY-2 IDEM-OUT-5
    let mut h = host(EngineOptions::default());
    let mut store = MemoryStore::default();
    let body = br#"{"amount":1,"note":"a"}"#;
    let t = h
        .begin(&request(Some("\"k1\""), Some("alice"), body), 1)
        .unwrap();
    assert_eq!(h.drive_in(&mut store, t, at(0)).unwrap(), StepKind::Run);
    assert_eq!(h.key(t).unwrap(), "k1");
    let ctx = h.context(t).unwrap();
    assert_eq!((ctx.recovered, ctx.fence), (false, 1));
    h.outcome(
        t,
        Ran::Answered,
        201,
        "12:content-type10:text/plain",
        b"made".to_vec(),
    )
    .unwrap();
    assert_eq!(h.drive_in(&mut store, t, at(1)).unwrap(), StepKind::Done);
    assert_eq!(events(&mut h, t), ["executed", "completed"]);
    h.end(t);

    let r = h
        .begin(
            &request(Some("k1"), Some("alice"), br#"{"note":"a","amount":1}"#),
            2,
        )
        .unwrap();
    assert_eq!(h.drive_in(&mut store, r, at(2)).unwrap(), StepKind::Reply);
    let (status, head, body) = reply(&mut h, r);
    assert_eq!(status, 201);
    assert_eq!(
        head,
        [
            ("content-type".to_string(), "text/plain".to_string()),
            ("idempotent-replayed".to_string(), "true".to_string())
        ]
    );
    assert_eq!(body, b"made");
    h.end(r);
    assert_eq!(h.open_slots(), 0);
}

#[test]
fn refusals_get_a_slot_of_their_own() {
    // IDEM-KEY-3 IDEM-KEY-5 IDEM-LIMIT-1 IDEM-SCOPE-3
    let mut h = host(EngineOptions {
        max_body: Some(10.0),
        ..EngineOptions::default()
    });
    let mut store = MemoryStore::default();
    let missing = h.begin(&request(None, Some("a"), b"{}"), 1).unwrap();
    let two = h
        .begin(&request(Some("a, b"), Some("a"), b"{}"), 2)
        .unwrap();
    let nobody = h.begin(&request(Some("k"), Some(""), b"{}"), 3).unwrap();
    let large = h.refuse_body(11.0).unwrap();
    assert_eq!(h.refuse_body(10.0), None);
    // Each keeps its own answer, whatever order they are answered in.
    for (t, status, requirement) in [
        (large, 413, "IDEM-LIMIT-1"),
        (nobody, 500, "IDEM-SCOPE-3"),
        (two, 400, "IDEM-KEY-5"),
        (missing, 400, "IDEM-KEY-3"),
    ] {
        assert_eq!(h.drive_in(&mut store, t, at(0)).unwrap(), StepKind::Reply);
        assert_eq!(h.refusal(t).unwrap().unwrap().requirement, requirement);
        let (s, _, body) = reply(&mut h, t);
        assert_eq!(s, status);
        let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(body["requirement"], requirement);
        assert_eq!(events(&mut h, t), ["rejected"]);
    }
    assert_eq!(store.stats().entries, 0, "nothing was claimed");
}

#[test]
fn slots_are_reused_and_stale_slots_are_errors_not_panics() {
    let mut h = host(EngineOptions::default());
    let a = h.begin(&request(Some("a"), None, b"{}"), 1).unwrap();
    h.end(a);
    h.end(a);
    let b = h.begin(&request(Some("b"), None, b"{}"), 2).unwrap();
    assert_eq!(a, b, "the slot is reused");
    h.end(b);
    assert_eq!(h.poll(b, at(0)).unwrap_err().code, CODE_OPTIONS);
    assert_eq!(h.key(99).unwrap_err().code, CODE_OPTIONS);
    assert!(h.take_write(b).is_err());
    assert!(h.reply(99).is_empty());
}

#[test]
fn asynchronous_path_reads_writes_and_completes_step_by_step() {
    // IDEM-STORE-1 IDEM-EXEC-1 IDEM-OUT-5
    let mut h = host(short());
    let mut store = MemoryStore::default();
    let t = h.begin(&request(Some("k"), Some("a"), b"{}"), 7).unwrap();
    let key = h.storage_key(t).unwrap();
    assert_eq!(h.poll(t, at(0)).unwrap(), StepKind::Claim);
    h.record(t, at(0), None).unwrap();
    assert_eq!(h.poll(t, at(0)).unwrap(), StepKind::Apply);
    let claim = h.take_write(t).unwrap();
    assert_eq!(
        (claim.expect.as_deref(), claim.version.as_str()),
        (None, "7")
    );
    // The write as JavaScript hands it to a store.
    let applied = store_apply(&mut store, at(0), &key, None, claim.value.as_deref()).unwrap();
    h.applied(t, at(0), applied == StoreApplied::Applied)
        .unwrap();
    assert_eq!(h.poll(t, at(0)).unwrap(), StepKind::Run);
    h.outcome(t, Ran::Answered, 200, "", b"ok".to_vec())
        .unwrap();
    assert_eq!(h.poll(t, at(1)).unwrap(), StepKind::Apply);
    let done = h.take_write(t).unwrap();
    assert_eq!(done.expect.as_deref(), Some("7"));
    assert_eq!(done.deadline, 1_700_000_001_001.0, "the response deadline");
    assert_eq!(
        store_apply(&mut store, at(1), &key, Some("7"), done.value.as_deref()).unwrap(),
        StoreApplied::Applied
    );
    h.applied(t, at(1), true).unwrap();
    assert_eq!(h.poll(t, at(1)).unwrap(), StepKind::Done);
    assert_eq!(h.done(t).unwrap(), Some(idem_core::Finish::Stored));

    // Bytes that are not a record are an error, never a claim (IDEM-REC-1).
    let u = h.begin(&request(Some("u"), Some("a"), b"{}"), 8).unwrap();
    assert_eq!(h.poll(u, at(2)).unwrap(), StepKind::Claim);
    assert_eq!(
        h.record(u, at(2), Some(b"junk")).unwrap_err().code,
        "IDEM-REC-1"
    );
    // A store failure before anything ran answers 503.
    h.store_failed(u, idem_core::StoreFailure::Unavailable)
        .unwrap();
    assert_eq!(h.poll(u, at(2)).unwrap(), StepKind::Reply);
    assert_eq!(reply(&mut h, u).0, 503);
}

#[test]
fn a_durable_object_claims_for_the_worker() {
    // IDEM-JS-2 IDEM-JS-3 IDEM-EXEC-1
    let options = short();
    let mut worker = host(options.clone());
    let mut object = host(options);
    let mut storage = MemoryStore::default();
    let round = |worker: &mut Host, object: &mut Host, storage: &mut MemoryStore, nonce: u64| {
        let t = worker
            .begin(&request(Some("k"), Some("a"), b"{}"), nonce)
            .unwrap();
        assert_eq!(worker.poll(t, at(0)).unwrap(), StepKind::Claim);
        let ticket = worker.ticket(t, nonce).unwrap();
        // On the object's side: the same machine, against its own storage.
        let s = object.resume(&ticket, nonce).unwrap();
        assert!(matches!(
            object.drive_in(storage, s, at(0)).unwrap(),
            StepKind::Run | StepKind::Reply
        ));
        let claimed = object.claimed_bytes(s).unwrap();
        object.end(s);
        worker.claimed(t, at(0), &claimed).unwrap();
        (t, worker.poll(t, at(0)).unwrap())
    };
    let (first, step) = round(&mut worker, &mut object, &mut storage, 1);
    assert_eq!(step, StepKind::Run);
    let (second, step) = round(&mut worker, &mut object, &mut storage, 2);
    assert_eq!(step, StepKind::Reply);
    assert_eq!(reply(&mut worker, second).0, 409);
    assert!(worker.context(first).is_ok());
    for bad in [&b""[..], b"T", b"Cxx", b"\x00\x01"] {
        assert_eq!(object.resume(bad, 1).unwrap_err().code, "IDEM-JS-2");
        let t = worker.begin(&request(Some("z"), None, b"{}"), 3).unwrap();
        assert_eq!(worker.poll(t, at(0)).unwrap(), StepKind::Claim);
        assert_eq!(worker.claimed(t, at(0), bad).unwrap_err().code, "IDEM-JS-2");
    }
}

#[test]
fn a_full_memory_store_refuses_new_claims_only() {
    // IDEM-STORE-3
    let mut h = host(EngineOptions::default());
    let mut store = MemoryStore::new(MemoryStoreLimits {
        max_entries: 1,
        max_bytes: 1 << 20,
    });
    let a = h.begin(&request(Some("a"), None, b"{}"), 1).unwrap();
    assert_eq!(h.drive_in(&mut store, a, at(0)).unwrap(), StepKind::Run);
    let b = h.begin(&request(Some("b"), None, b"{}"), 2).unwrap();
    assert_eq!(h.drive_in(&mut store, b, at(0)).unwrap(), StepKind::Reply);
    let (status, head, _) = reply(&mut h, b);
    assert_eq!(status, 503);
    assert!(head.contains(&("retry-after".to_string(), "1".to_string())));
    h.outcome(a, Ran::Answered, 200, "", b"x".to_vec()).unwrap();
    assert_eq!(h.drive_in(&mut store, a, at(1)).unwrap(), StepKind::Done);
    assert_eq!(h.done(a).unwrap(), Some(idem_core::Finish::Stored));
}

#[test]
fn heartbeats_and_takeovers_through_the_host() {
    // IDEM-LEASE-1 IDEM-LEASE-2 IDEM-LEASE-3 IDEM-LEASE-4
    let mut h = host(short());
    let mut store = MemoryStore::default();
    let z = h.begin(&request(Some("k"), None, b"{}"), 1).unwrap();
    assert_eq!(h.drive_in(&mut store, z, at(0)).unwrap(), StepKind::Run);
    assert_eq!(h.heartbeat(z, at(900)).unwrap(), HeartbeatState::Quiet);
    assert_eq!(h.drive_in(&mut store, z, at(900)).unwrap(), StepKind::Idle);
    assert_eq!(h.heartbeat_state(z).unwrap(), HeartbeatState::Extended);
    assert_eq!(h.context(z).unwrap().lease_expires, at(1900));
    // The lease ends; another attempt takes over.
    let t = h.begin(&request(Some("k"), None, b"{}"), 2).unwrap();
    assert_eq!(h.drive_in(&mut store, t, at(1900)).unwrap(), StepKind::Run);
    assert!(h.context(t).unwrap().recovered);
    assert_eq!(h.heartbeat(z, at(2000)).unwrap(), HeartbeatState::Expired);
    h.outcome(z, Ran::Answered, 200, "", b"zombie".to_vec())
        .unwrap();
    assert_eq!(h.drive_in(&mut store, z, at(2000)).unwrap(), StepKind::Done);
    assert_eq!(h.done(z).unwrap(), Some(idem_core::Finish::FencedOut));
    assert_eq!(h.heartbeat(z, at(2000)).unwrap(), HeartbeatState::FencedOut);
}

#[test]
fn the_memory_store_speaks_the_generic_interface_too() {
    // IDEM-STORE-1 IDEM-TTL-4
    let mut h = host(EngineOptions::default());
    let mut store = MemoryStore::default();
    let t = h.begin(&request(Some("k"), None, b"{}"), 3).unwrap();
    assert_eq!(h.poll(t, at(0)).unwrap(), StepKind::Claim);
    h.record(t, at(0), None).unwrap();
    assert_eq!(h.poll(t, at(0)).unwrap(), StepKind::Apply);
    let w = h.take_write(t).unwrap();
    let value = w.value.clone().unwrap();
    let key = h.storage_key(t).unwrap();
    assert_eq!(store_load(&store, &key), None);
    assert_eq!(
        store_apply(&mut store, at(0), &key, Some("1"), Some(&value)).unwrap(),
        StoreApplied::Conflict
    );
    assert_eq!(
        store_apply(&mut store, at(0), &key, None, Some(&value)).unwrap(),
        StoreApplied::Applied
    );
    let (v, bytes) = store_load(&store, &key).unwrap();
    assert_eq!(v.to_string(), w.version);
    assert_eq!(bytes, value);
    // The in-memory path sees what the generic path wrote.
    let d = h.begin(&request(Some("k"), None, b"{}"), 4).unwrap();
    assert_eq!(h.drive_in(&mut store, d, at(1)).unwrap(), StepKind::Reply);
    assert_eq!(reply(&mut h, d).0, 409);
    for (k, expect) in [("not a storage key", None), (key.as_str(), Some("seven"))] {
        assert_eq!(
            store_apply(&mut store, at(0), k, expect, Some(&value))
                .unwrap_err()
                .code,
            "IDEM-JS-1"
        );
    }
    assert_eq!(
        store_apply(&mut store, at(0), &key, Some(&w.version), Some(b"junk"))
            .unwrap_err()
            .code,
        "IDEM-REC-1"
    );
    assert_eq!(
        store_apply(&mut store, at(0), &key, Some(&w.version), None).unwrap(),
        StoreApplied::Applied
    );
    assert_eq!(store_load(&store, &key), None);
}

#[test]
fn expiry_writes_tombstone_then_delete() {
    // IDEM-TTL-1 IDEM-TTL-2 IDEM-TTL-4
    let mut h = host(short());
    let mut store = MemoryStore::default();
    let t = h.begin(&request(Some("k"), None, b"{}"), 3).unwrap();
    assert_eq!(h.drive_in(&mut store, t, at(0)).unwrap(), StepKind::Run);
    h.outcome(t, Ran::Answered, 200, "", b"x".to_vec()).unwrap();
    assert_eq!(h.drive_in(&mut store, t, at(10)).unwrap(), StepKind::Done);
    let (_, record) = store_load(&store, &h.storage_key(t).unwrap()).unwrap();
    assert_eq!(expire(at(500), &record).unwrap(), None);
    let tomb = expire(at(1010), &record).unwrap().unwrap();
    assert!(tomb.value.is_some(), "the tombstone replaces the record");
    let gone = expire(at(5010), &tomb.value.unwrap()).unwrap().unwrap();
    assert_eq!(gone.value, None, "then the key is deleted");
    assert_eq!(expire(at(0), b"junk").unwrap_err().code, "IDEM-REC-1");
}

fn counter_host() -> Host {
    host(EngineOptions {
        key_kind: Some("counter".into()),
        counter: (Some(8.0), Some(4.0)),
        ..short()
    })
}

fn counter_request<'a>(key: &'a str, low_water: Option<&'a str>, body: &'a [u8]) -> Incoming<'a> {
    Incoming {
        low_water,
        route: "/transfers",
        target: "/transfers",
        ..request(Some(key), Some("alice"), body)
    }
}

/// Runs a request on the memory path with a 201 of `made`; its step after the handler.
fn run_in(h: &mut Host, store: &mut MemoryStore, req: &Incoming<'_>, now: UnixMillis) -> StepKind {
    let t = h.begin(req, 1).unwrap();
    let step = h.drive_in(store, t, now).unwrap();
    if step != StepKind::Run {
        return step;
    }
    h.outcome(t, Ran::Answered, 201, "", b"made".to_vec())
        .unwrap();
    let done = h.drive_in(store, t, now).unwrap();
    h.end(t);
    done
}

/// Drives an operation's slot on the memory path to its reply, and ends it: the status and
/// the body as JSON.
fn operate(
    h: &mut Host,
    store: &mut MemoryStore,
    t: u32,
    now: UnixMillis,
) -> (u32, serde_json::Value) {
    assert_eq!(h.drive_in(store, t, now).unwrap(), StepKind::Reply);
    let (status, _, body) = reply(h, t);
    h.end(t);
    (status, serde_json::from_slice(&body).unwrap())
}

#[test]
fn a_counter_session_opens_in_the_memory_store_and_its_keys_run() {
    // IDEM-CTR-3 IDEM-CTR-5 IDEM-CTR-6 IDEM-CTR-11
    let mut h = counter_host();
    let mut store = MemoryStore::default();
    let op = h.open_session(Some("alice"), "POST", "/transfers", "c1", "0", 0x42);
    let (status, session) = operate(&mut h, &mut store, op, at(0));
    assert_eq!(status, 201);
    assert_eq!(session["firstSeq"], "0");
    let epoch = session["epoch"].as_str().unwrap().to_owned();
    let key0 = format!("c1:{epoch}:0");
    let key1 = format!("c1:{epoch}:1");
    assert_eq!(
        run_in(
            &mut h,
            &mut store,
            &counter_request(&key0, None, b"{}"),
            at(1)
        ),
        StepKind::Done
    );
    // The low-water mark of the next request makes 0 stale.
    assert_eq!(
        run_in(
            &mut h,
            &mut store,
            &counter_request(&key1, Some("1"), b"{}"),
            at(2)
        ),
        StepKind::Done
    );
    let t = h.begin(&counter_request(&key0, None, b"{}"), 3).unwrap();
    assert_eq!(h.drive_in(&mut store, t, at(3)).unwrap(), StepKind::Reply);
    let (status, _, body) = reply(&mut h, t);
    assert_eq!(status, 412);
    assert!(String::from_utf8_lossy(&body).contains("urn:idem:problem:key-stale"));
}

#[test]
fn a_session_opens_step_by_step_on_a_store_of_the_javascript_side() {
    // IDEM-CTR-3 IDEM-CTR-12
    let mut h = counter_host();
    let mut store = MemoryStore::default();
    let op = h.open_session(None, "POST", "/transfers", "c1", "250", 7);
    let key = h.storage_key(op).unwrap();
    assert_eq!(h.poll(op, at(0)).unwrap(), StepKind::Load);
    h.record(
        op,
        at(0),
        store_load(&store, &key).map(|(_, v)| v).as_deref(),
    )
    .unwrap();
    assert_eq!(h.poll(op, at(0)).unwrap(), StepKind::Apply);
    let write = h.take_write(op).unwrap();
    // Another writer got there first: the operation reads again.
    h.applied(op, at(0), false).unwrap();
    assert_eq!(h.poll(op, at(0)).unwrap(), StepKind::Load);
    h.record(op, at(0), None).unwrap();
    let write = {
        assert_eq!(h.poll(op, at(0)).unwrap(), StepKind::Apply);
        let again = h.take_write(op).unwrap();
        assert_eq!(again.expect, write.expect);
        again
    };
    let applied = store_apply(
        &mut store,
        at(0),
        &key,
        write.expect.as_deref(),
        write.value.as_deref(),
    )
    .unwrap();
    h.applied(op, at(0), applied == StoreApplied::Applied)
        .unwrap();
    assert_eq!(h.poll(op, at(0)).unwrap(), StepKind::Reply);
    let (status, _, body) = reply(&mut h, op);
    assert_eq!(status, 201);
    let session: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert!(session["epoch"].as_str().unwrap().parse::<u64>().is_ok());
    h.end(op);
    // A first number beyond the bits, not a number at all, an empty principal: the core's
    // refusals, with the requirement they cite.
    for (principal, first, status, requirement) in [
        (None, "256", 400, "IDEM-CTR-1"),
        (None, "-1", 400, "IDEM-CTR-1"),
        (None, "+1", 400, "IDEM-CTR-1"),
        (None, "1.5", 400, "IDEM-CTR-1"),
        (None, "", 400, "IDEM-CTR-1"),
        (None, "99999999999999999999", 400, "IDEM-CTR-1"),
        (Some(""), "0", 500, "IDEM-SCOPE-3"),
    ] {
        let bad = h.open_session(principal, "POST", "/t", "c1", first, 8);
        let (got, problem) = operate(&mut h, &mut store, bad, at(1));
        assert_eq!(
            (got, problem["requirement"].as_str()),
            (status, Some(requirement)),
            "{first:?}"
        );
    }
    // Another key kind: the host routed the endpoint to the wrong policy.
    let mut opaque = host(short());
    for op in [
        opaque.open_session(None, "POST", "/t", "c1", "0", 9),
        opaque.issue_token(None, "POST", "/t", at(0), [1, 2]),
    ] {
        let (status, problem) = operate(&mut opaque, &mut store, op, at(1));
        assert_eq!(
            (status, problem["type"].as_str()),
            (500, Some("about:blank"))
        );
    }
}

#[test]
fn a_token_is_stored_by_its_operation_and_consumed_once() {
    // IDEM-TOKEN-1 IDEM-TOKEN-2 IDEM-TOKEN-4
    let mut h = host(EngineOptions {
        key_kind: Some("token".into()),
        token: (Some("ab".repeat(32)), Some(2000.0)),
        ..short()
    });
    let mut store = MemoryStore::default();
    let op = h.issue_token(Some("alice"), "POST", "/orders", at(0), [5, 6]);
    let (status, issued) = operate(&mut h, &mut store, op, at(0));
    assert_eq!(status, 201);
    let token = issued["token"].as_str().unwrap().to_owned();
    assert!(token.starts_with("tok_"));
    assert_eq!(issued["expiresAt"], at(2000).0);
    assert_eq!(issued["ttl"], 2000);
    let req = request(Some(token.as_str()), Some("alice"), b"{}");
    assert_eq!(run_in(&mut h, &mut store, &req, at(1)), StepKind::Done);
    let t = h.begin(&req, 2).unwrap();
    assert_eq!(h.drive_in(&mut store, t, at(2)).unwrap(), StepKind::Reply);
    assert_eq!(reply(&mut h, t).0, 201, "a replay");
    // A token never stored is unknown until its expiry, then expired.
    let lost = h.issue_token(Some("alice"), "POST", "/orders", at(0), [7, 8]);
    let lost_token = {
        assert_eq!(h.poll(lost, at(0)).unwrap(), StepKind::Apply);
        let w = h.take_write(lost).unwrap();
        assert!(w.value.is_some());
        h.applied(lost, at(0), true).unwrap();
        assert_eq!(h.poll(lost, at(0)).unwrap(), StepKind::Reply);
        let (_, _, body) = reply(&mut h, lost);
        h.end(lost);
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        v["token"].as_str().unwrap().to_owned()
    };
    for (now, status) in [(at(10), 400), (at(2001), 410)] {
        let t = h
            .begin(&request(Some(lost_token.as_str()), Some("alice"), b"{}"), 3)
            .unwrap();
        assert_eq!(h.drive_in(&mut store, t, now).unwrap(), StepKind::Reply);
        assert_eq!(reply(&mut h, t).0, status);
        h.end(t);
    }
    // Token options: a secret of 64 hex digits and a TTL, for keyKind "token" only.
    for (secret, ttl) in [
        (None, Some(1.0)),
        (Some("ab".repeat(31)), Some(1.0)),
        (Some("zz".repeat(32)), Some(1.0)),
        (Some("ab".repeat(32)), None),
    ] {
        let e = policy(&EngineOptions {
            key_kind: Some("token".into()),
            token: (secret, ttl),
            ..short()
        })
        .err();
        assert_eq!(e.map(|e| e.code), Some("IDEM-JS-1"));
    }
    assert!(policy(&EngineOptions {
        token: (Some("ab".repeat(32)), Some(1.0)),
        ..short()
    })
    .is_err());
}
