//! Native tests of the host the JavaScript side drives: slots, the in-process store path
//! (claim and finish inside the module), the asynchronous store path (decide, write bytes,
//! commit), the Durable Object round trip, and the generic store interface of the memory
//! store.

use idem_core::{MemoryStore, MemoryStoreLimits, UnixMillis};
use idem_wasm::host::*;
use idem_wasm::interop::*;

const EXECUTE: u32 = Kind::Execute as u32;
const REPLAY: u32 = Kind::Replay as u32;
const IN_PROGRESS: u32 = Kind::InProgress as u32;
const MISMATCH: u32 = Kind::Mismatch as u32;

fn host(numbers: &[f64]) -> Host {
    Host::new(options(numbers, "", "").unwrap()).unwrap()
}

fn request<'a>(key: Option<&'a str>, principal: &'a str, body: &'a [u8]) -> Incoming<'a> {
    Incoming {
        key,
        principal,
        method: "POST",
        route: "/orders",
        target: "/orders?x=1",
        content_type: Some("application/json"),
        headers: "",
        body,
    }
}

fn at(ms: u64) -> UnixMillis {
    UnixMillis(1_700_000_000_000 + ms)
}

fn event(code: u32) -> &'static str {
    idem_core::Event::ALL[(code >> 4) as usize].name()
}

fn reply_status(bytes: &[u8]) -> u32 {
    u32::from_le_bytes(bytes[..4].try_into().unwrap())
}

fn reply_head(bytes: &[u8]) -> Vec<(String, String)> {
    let len = u32::from_le_bytes(bytes[4..8].try_into().unwrap()) as usize;
    pairs(std::str::from_utf8(&bytes[8..8 + len]).unwrap()).unwrap()
}

fn reply_body(bytes: &[u8]) -> &[u8] {
    let len = u32::from_le_bytes(bytes[4..8].try_into().unwrap()) as usize;
    &bytes[8 + len..]
}

#[test]
fn memory_path_claims_finishes_and_replays_in_two_calls_each() {
    // IDEM-EXEC-1, IDEM-REPLAY-1, IDEM-REPLAY-2, IDEM-OUT-5
    let mut h = host(&[]);
    let mut store = MemoryStore::default();
    let body = br#"{"amount":1,"note":"a"}"#;
    let t = h.begin(&request(Some("\"k1\""), "tok", body)).unwrap();
    assert_eq!(h.key(t).unwrap(), "k1");
    let code = h.claim_in(&mut store, t, at(0), 7).unwrap();
    assert_eq!((code & 7, event(code)), (EXECUTE, "executed"));
    assert_eq!(h.fence(t).unwrap(), 1);
    assert_eq!(h.expires(t).unwrap(), at(60_000));
    // A duplicate while the first runs: in progress, with Retry-After.
    let d = h.begin(&request(Some("k1"), "tok", body)).unwrap();
    let busy = h.claim_in(&mut store, d, at(1), 8).unwrap();
    assert_eq!(busy & 7, IN_PROGRESS);
    let r = h.reply(d as i32).to_vec();
    assert_eq!(reply_status(&r), 409);
    assert!(reply_head(&r).contains(&("retry-after".into(), "60".into())));
    h.end(d);

    let outcome = Host::outcome(0, 201, "12:content-type10:text/plain", b"made".to_vec()).unwrap();
    let ev = h.finish_in(&mut store, t, at(2), outcome).unwrap();
    assert_eq!(idem_core::Event::ALL[ev as usize].name(), "completed");
    h.end(t);
    assert_eq!(h.open_slots(), 0);

    let again = h
        .begin(&request(
            Some("k1"),
            "tok",
            br#"{ "note":"a", "amount":1 }"#,
        ))
        .unwrap();
    let code = h.claim_in(&mut store, again, at(3), 9).unwrap();
    assert_eq!((code & 7, event(code)), (REPLAY, "replayed"));
    let r = h.reply(again as i32).to_vec();
    assert_eq!(reply_status(&r), 201);
    assert_eq!(
        reply_head(&r),
        [
            ("content-type".into(), "text/plain".into()),
            ("idempotent-replayed".into(), "true".into())
        ]
    );
    assert_eq!(reply_body(&r), b"made");
    h.end(again);

    // The same key under another principal is another record (IDEM-SCOPE-1).
    let other = h.begin(&request(Some("k1"), "someone else", body)).unwrap();
    assert_eq!(
        h.claim_in(&mut store, other, at(4), 10).unwrap() & 7,
        EXECUTE
    );
    h.end(other);
}

#[test]
fn a_changed_payload_is_a_mismatch_naming_the_field() {
    // IDEM-FP-1, IDEM-FP-4
    let mut h = host(&[]);
    let mut store = MemoryStore::default();
    let t = h
        .begin(&request(Some("k"), "", br#"{"amount":1,"c":"eur"}"#))
        .unwrap();
    assert_eq!(h.claim_in(&mut store, t, at(0), 1).unwrap() & 7, EXECUTE);
    h.finish_in(
        &mut store,
        t,
        at(1),
        Host::outcome(0, 200, "", vec![]).unwrap(),
    )
    .unwrap();
    h.end(t);
    let m = h
        .begin(&request(Some("k"), "", br#"{"amount":2,"c":"eur"}"#))
        .unwrap();
    let code = h.claim_in(&mut store, m, at(2), 2).unwrap();
    assert_eq!((code & 7, event(code)), (MISMATCH, "mismatch"));
    let r = h.reply(m as i32).to_vec();
    assert_eq!(reply_status(&r), 422);
    assert!(String::from_utf8_lossy(reply_body(&r)).contains("amount"));
}

#[test]
fn refused_requests_keep_their_problem_for_reply_minus_one() {
    // IDEM-KEY-3, IDEM-FP-6, IDEM-LIMIT-1
    let mut h = host(&[
        f64::NAN,
        f64::NAN,
        f64::NAN,
        f64::NAN,
        f64::NAN,
        f64::NAN,
        8.0,
    ]);
    for (req, status, code) in [
        (request(None, "", b"{}"), 400, "IDEM-KEY-3"),
        (request(Some("k"), "", b"{nope"), 400, "IDEM-FP-6"),
        (request(Some("k"), "", b"0123456789"), 413, "IDEM-LIMIT-1"),
    ] {
        let e = h.begin(&req).unwrap_err();
        assert_eq!(e.code, code);
        h.fail_with(e);
        assert_eq!(h.problem_code(), code);
        let r = h.reply(-1).to_vec();
        assert_eq!(reply_status(&r), status);
        assert!(
            reply_head(&r).contains(&("content-type".into(), "application/problem+json".into()))
        );
    }
    assert!(h.check_body_size(8.0).is_ok());
    assert_eq!(h.check_body_size(9.0).unwrap_err().code, "IDEM-LIMIT-1");
    assert_eq!(h.open_slots(), 0);
}

#[test]
fn slots_are_reused_and_stale_slots_are_errors_not_panics() {
    let mut h = host(&[]);
    let a = h.begin(&request(Some("a"), "", b"{}")).unwrap();
    let b = h.begin(&request(Some("b"), "", b"{}")).unwrap();
    assert_ne!(a, b);
    h.end(a);
    h.end(a); // twice is harmless
    assert!(h.key(a).is_err());
    assert!(h.fence(b).is_err(), "no lease before a claim");
    assert!(h.commit(b).is_err(), "nothing pending");
    assert!(h.reply(b as i32).is_empty());
    let c = h.begin(&request(Some("c"), "", b"{}")).unwrap();
    assert_eq!(c, a, "a freed slot is reused");
    assert!(h.key(99).is_err());
    assert_eq!(h.open_slots(), 2);
}

#[test]
fn async_path_decides_on_bytes_and_holds_the_lease_after_commit() {
    // IDEM-STORE-1, IDEM-JS-3
    let mut h = host(&[]);
    let t = h.begin(&request(Some("k"), "", b"{}")).unwrap();
    let code = h.decide(t, at(0), 5, None).unwrap();
    assert_eq!(code & 7, EXECUTE);
    let claim = h.take_write();
    assert_eq!(claim[0], 2, "put when absent");
    assert!(h.take_write().is_empty(), "taken once");
    assert!(h.fence(t).is_ok(), "the pending lease is readable");
    h.commit(t).unwrap();
    let stored = claim[12 + claim[3] as usize..].to_vec();
    // A second attempt sees the record in flight.
    let d = h.begin(&request(Some("k"), "", b"{}")).unwrap();
    assert_eq!(
        h.decide(d, at(1), 6, Some(&stored)).unwrap() & 7,
        IN_PROGRESS
    );
    // Completion: a compare-and-set on the claim's version, stored and replayed.
    let done = h.complete_write(t, at(2));
    assert_eq!(done[0], 3, "put with an expected version");
    assert_eq!(idem_core::Event::ALL[done[1] as usize].name(), "completed");
    let record = done[12 + done[2] as usize + done[3] as usize..].to_vec();
    assert_eq!(h.decide(d, at(3), 7, Some(&record)).unwrap() & 7, REPLAY);
    // Bytes that are not a record are refused, never decided on (IDEM-REC-1).
    assert_eq!(
        h.decide(d, at(3), 7, Some(b"junk")).unwrap_err().code,
        "IDEM-REC-1"
    );
    // A heartbeat moves the lease once committed (IDEM-LEASE-3).
    h.extend(t, at(10_000)).unwrap();
    assert_eq!(
        idem_core::Event::ALL[h.take_write()[1] as usize].name(),
        "extended"
    );
    h.commit(t).unwrap();
    assert_eq!(h.expires(t).unwrap(), at(70_000));
}

trait CompleteWrite {
    fn complete_write(&mut self, t: u32, now: UnixMillis) -> Vec<u8>;
}

impl CompleteWrite for Host {
    fn complete_write(&mut self, t: u32, now: UnixMillis) -> Vec<u8> {
        let outcome = Host::outcome(0, 201, "", b"ok".to_vec()).unwrap();
        self.complete(t, now, outcome).unwrap();
        self.take_write()
    }
}

#[test]
fn a_durable_object_round_trip_carries_the_claim() {
    // IDEM-JS-2, IDEM-JS-3
    let mut worker = host(&[]);
    let mut object = host(&[]);
    let t = worker.begin(&request(Some("k"), "tok", b"{}")).unwrap();
    let sent = object
        .begin_encoded(&worker.encode_attempt(t).unwrap())
        .unwrap();
    assert_eq!(
        object.storage_key(sent).unwrap(),
        worker.storage_key(t).unwrap()
    );
    assert_eq!(object.decide(sent, at(0), 1, None).unwrap() & 7, EXECUTE);
    let claim = object.encode_claim(sent).unwrap();
    object.end(sent);
    let code = worker.claim_encoded(t, &claim).unwrap();
    assert_eq!(code & 7, EXECUTE);
    assert_eq!(worker.fence(t).unwrap(), 1);
    // A claim that was never decided is "in progress", never an execution.
    let idle = object
        .begin_encoded(&worker.encode_attempt(t).unwrap())
        .unwrap();
    let contended = worker
        .claim_encoded(t, &object.encode_claim(idle).unwrap())
        .unwrap();
    assert_eq!(contended & 7, IN_PROGRESS);
    assert_eq!(object.begin_encoded(b"junk").unwrap_err().code, "IDEM-JS-2");
    assert_eq!(
        worker.claim_encoded(t, b"junk").unwrap_err().code,
        "IDEM-JS-2"
    );
}

#[test]
fn a_full_memory_store_refuses_new_claims_only() {
    // IDEM-STORE-3
    let mut h = host(&[]);
    let mut store = MemoryStore::new(MemoryStoreLimits {
        max_entries: 1,
        max_bytes: 1 << 20,
    });
    let a = h.begin(&request(Some("a"), "", b"{}")).unwrap();
    assert_eq!(h.claim_in(&mut store, a, at(0), 1).unwrap() & 7, EXECUTE);
    let b = h.begin(&request(Some("b"), "", b"{}")).unwrap();
    assert_eq!(
        h.claim_in(&mut store, b, at(0), 2).unwrap() & 7,
        Kind::Full as u32
    );
    // The record in flight still completes.
    let ev = h
        .finish_in(
            &mut store,
            a,
            at(1),
            Host::outcome(0, 200, "", vec![]).unwrap(),
        )
        .unwrap();
    assert_eq!(idem_core::Event::ALL[ev as usize].name(), "completed");
}

#[test]
fn leases_expire_into_takeovers_and_fence_out_the_old_completion() {
    // IDEM-LEASE-1, IDEM-LEASE-2
    let mut h = host(&[f64::NAN, f64::NAN, 1000.0]);
    let mut store = MemoryStore::default();
    let first = h.begin(&request(Some("k"), "", b"{}")).unwrap();
    h.claim_in(&mut store, first, at(0), 1).unwrap();
    let second = h.begin(&request(Some("k"), "", b"{}")).unwrap();
    let code = h.claim_in(&mut store, second, at(1000), 2).unwrap();
    assert_eq!((code & 7, code & 8, event(code)), (EXECUTE, 8, "took-over"));
    assert_eq!(h.fence(second).unwrap(), 2);
    // A heartbeat under the old lease is refused: the record moved on.
    assert!(!h.extend_in(&mut store, first, at(999)).unwrap());
    let ev = h
        .finish_in(
            &mut store,
            first,
            at(1001),
            Host::outcome(1, 0, "", vec![]).unwrap(),
        )
        .unwrap();
    assert_eq!(idem_core::Event::ALL[ev as usize].name(), "fenced-out");
    assert!(h.extend_in(&mut store, second, at(1500)).unwrap());
    assert_eq!(h.expires(second).unwrap(), at(2500));
    assert_eq!(
        h.extend_in(&mut store, second, at(2500)).unwrap_err().code,
        "IDEM-LEASE-3"
    );
}

#[test]
fn the_memory_store_speaks_the_generic_interface_too() {
    // IDEM-STORE-1, IDEM-TTL-4
    let mut h = host(&[f64::NAN, f64::NAN, f64::NAN]);
    let mut store = MemoryStore::default();
    let t = h.begin(&request(Some("k"), "", b"{}")).unwrap();
    h.decide(t, at(0), 3, None).unwrap();
    let w = h.take_write();
    let version = std::str::from_utf8(&w[12..12 + w[3] as usize])
        .unwrap()
        .to_string();
    let value = &w[12 + w[3] as usize..];
    let key = h.storage_key(t).unwrap();
    assert_eq!(store_load(&store, &key), None);
    assert_eq!(
        store_apply(&mut store, at(0), &key, Some("1"), Some(value)).unwrap(),
        StoreApplied::Conflict
    );
    assert_eq!(
        store_apply(&mut store, at(0), &key, None, Some(value)).unwrap(),
        StoreApplied::Applied
    );
    let (v, bytes) = store_load(&store, &key).unwrap();
    assert_eq!(v.to_string(), version);
    assert_eq!(bytes, value);
    // The engine's in-memory path sees what the generic path wrote.
    let d = h.begin(&request(Some("k"), "", b"{}")).unwrap();
    assert_eq!(
        h.claim_in(&mut store, d, at(1), 4).unwrap() & 7,
        IN_PROGRESS
    );
    for (k, expect, v) in [
        ("not a storage key", None, Some(value)),
        (key.as_str(), Some("seven"), Some(value)),
    ] {
        assert_eq!(
            store_apply(&mut store, at(0), k, expect, v)
                .unwrap_err()
                .code,
            "IDEM-JS-1"
        );
    }
    assert_eq!(
        store_apply(&mut store, at(0), &key, Some(&version), Some(b"junk"))
            .unwrap_err()
            .code,
        "IDEM-REC-1"
    );
    assert_eq!(
        store_apply(&mut store, at(0), &key, Some(&version), None).unwrap(),
        StoreApplied::Applied
    );
    assert_eq!(store_load(&store, &key), None);
}

#[test]
fn expiry_writes_tombstone_then_delete() {
    // IDEM-TTL-1, IDEM-TTL-2, IDEM-TTL-4
    let mut h = host(&[1000.0, 5000.0]);
    let t = h.begin(&request(Some("k"), "", b"{}")).unwrap();
    h.decide(t, at(0), 3, None).unwrap();
    let _ = h.take_write();
    let done = h.complete_write(t, at(10));
    let record = &done[12 + done[2] as usize + done[3] as usize..];
    assert_eq!(expire(at(500), record).unwrap(), None);
    let tomb = expire(at(1010), record).unwrap().unwrap();
    assert_eq!(tomb[0], 3, "the tombstone replaces the record");
    assert_eq!(tomb[1], NO_EVENT);
    let tomb_record = &tomb[12 + tomb[2] as usize + tomb[3] as usize..];
    let gone = expire(at(5010), tomb_record).unwrap().unwrap();
    assert_eq!(gone[0], 1, "then the key is deleted");
    assert_eq!(expire(at(0), b"junk").unwrap_err().code, "IDEM-REC-1");
}
