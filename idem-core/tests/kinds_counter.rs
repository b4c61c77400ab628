//! Wrapping counter keys: parsing, serial arithmetic, sessions and epochs, the window, the
//! low-water mark, fencing, a real race, and a model test with 8-bit counters so that wraps
//! happen.
use idem_core::*;
use proptest::prelude::*;
use std::collections::HashMap;
use std::sync::{Arc, Barrier, Mutex};
use std::time::Duration;

const T0: u64 = 1_700_000_000_000;

fn fp(body: &str) -> Fingerprint {
    Fingerprint::from_digest(*blake(body))
}

/// A fingerprint per payload string, without going through the JSON canonicaliser.
fn blake(body: &str) -> Box<[u8; 32]> {
    let spec = FingerprintSpec {
        json: JsonMode::Never,
        ..FingerprintSpec::default()
    };
    let f = spec
        .fingerprint(&RequestParts {
            method: "POST",
            target: "/t",
            content_type: None,
            headers: &[],
            body: body.as_bytes(),
        })
        .unwrap();
    Box::new(f.digest)
}

fn resp(body: &str) -> StoredResponse {
    StoredResponse {
        status: 200,
        headers: vec![],
        body: body.as_bytes().to_vec(),
    }
}

/// Opens the session of `client` with the rule, as the session operation does: read, open on
/// top, apply, and again after a lost race. Its epoch.
fn open_session<S: Store>(
    counters: &Counters,
    store: &mut S,
    now: UnixMillis,
    scope: &Scope,
    client: &str,
    first: u64,
    nonce: u64,
) -> u64
where
    S::Error: std::fmt::Debug,
{
    loop {
        let stored = store.load(&counters.session_key(scope, client)).unwrap();
        let opened = counters
            .open(now, scope, client, first, stored.as_ref(), nonce)
            .unwrap();
        if store.apply(now, opened.write).unwrap() == Applied::Applied {
            return opened.epoch;
        }
    }
}

struct H {
    counters: Counters,
    store: MemoryStore,
    scope: Scope,
    now: UnixMillis,
    epoch: u64,
}

impl H {
    fn new(bits: u8, window: u32) -> H {
        H::with_engine(bits, window, Config::default())
    }

    fn with_engine(bits: u8, window: u32, config: Config) -> H {
        let counters =
            Counters::new(Engine::new(config).unwrap(), CounterConfig { bits, window }).unwrap();
        let mut h = H {
            counters,
            store: MemoryStore::default(),
            scope: Scope::new("alice", "POST", "/transfer"),
            now: UnixMillis(T0),
            epoch: 0,
        };
        h.epoch = h.open(0);
        h
    }

    fn open(&mut self, first: u64) -> u64 {
        open_session(
            &self.counters,
            &mut self.store,
            self.now,
            &self.scope,
            "c1",
            first,
            0xdead_beef_u64,
        )
    }

    fn key(&self, seq: u64) -> CounterKey {
        CounterKey {
            client: "c1".into(),
            epoch: self.epoch,
            seq,
        }
    }

    fn claim_with(&mut self, key: &CounterKey, body: &str, low_water: Option<u64>) -> CounterClaim {
        let f = fp(body);
        let attempt = CounterAttempt {
            scope: &self.scope,
            key,
            fingerprint: &f,
            low_water,
        };
        self.counters
            .claim(&mut self.store, self.now, &attempt)
            .unwrap()
    }

    fn claim(&mut self, seq: u64, body: &str) -> CounterClaim {
        let key = self.key(seq);
        self.claim_with(&key, body, None)
    }

    fn run(&mut self, seq: u64, body: &str) -> CounterLease {
        match self.claim(seq, body) {
            CounterClaim::Execute {
                lease,
                recovered: false,
            } => lease,
            other => panic!("seq {seq}: {other:?}"),
        }
    }

    fn finish(&mut self, lease: &CounterLease, body: &str) -> Finish {
        self.counters
            .finish(&mut self.store, self.now, lease, Outcome::Final(resp(body)))
            .unwrap()
    }

    fn run_done(&mut self, seq: u64, body: &str) {
        let lease = self.run(seq, body);
        assert_eq!(self.finish(&lease, body), Finish::Stored);
    }

    fn session(&self) -> CounterSession {
        let r = self
            .store
            .get(&self.counters.session_key(&self.scope, "c1"))
            .unwrap();
        match &r.state {
            RecordState::Counter { session } => (**session).clone(),
            other => panic!("{other:?}"),
        }
    }

    fn rejected(&mut self, seq: u64, body: &str) -> RejectReason {
        match self.claim(seq, body) {
            CounterClaim::Done(CounterDecision::Rejected(r)) => r,
            other => panic!("seq {seq}: {other:?}"),
        }
    }
}

#[test]
fn parses_counter_keys_and_refuses_bad_ones() {
    // IDEM-CTR-1
    assert_eq!(
        parse_counter_key("dev-1:7:255", 8).unwrap(),
        CounterKey {
            client: "dev-1".into(),
            epoch: 7,
            seq: 255
        }
    );
    assert_eq!(
        parse_counter_key("c:0:18446744073709551615", 64)
            .unwrap()
            .seq,
        u64::MAX
    );
    let cases: &[(&str, u8, KindKeyError)] = &[
        ("", 8, KindKeyError::Empty),
        ("c:1", 8, KindKeyError::Malformed),
        ("c:1:2:3", 8, KindKeyError::Malformed),
        ("c", 8, KindKeyError::Malformed),
        (":1:2", 8, KindKeyError::BadClientId),
        ("c d:1:2", 8, KindKeyError::BadClientId),
        ("c:-1:2", 8, KindKeyError::Negative { field: "epoch" }),
        (
            "c:1:-2",
            8,
            KindKeyError::Negative {
                field: "sequence number",
            },
        ),
        ("c:x:2", 8, KindKeyError::NotNumeric { field: "epoch" }),
        (
            "c:1:2.0",
            8,
            KindKeyError::NotNumeric {
                field: "sequence number",
            },
        ),
        (
            "c:1:",
            8,
            KindKeyError::NotNumeric {
                field: "sequence number",
            },
        ),
        (
            "c:18446744073709551616:1",
            8,
            KindKeyError::TooLarge { field: "epoch" },
        ),
        (
            "c:1:18446744073709551616",
            64,
            KindKeyError::TooLarge {
                field: "sequence number",
            },
        ),
        (
            "c:1:256",
            8,
            KindKeyError::SequenceBeyondBits { seq: 256, bits: 8 },
        ),
        (
            "c:1:65536",
            16,
            KindKeyError::SequenceBeyondBits {
                seq: 65536,
                bits: 16,
            },
        ),
    ];
    for (key, bits, want) in cases {
        let err = parse_counter_key(key, *bits).unwrap_err();
        assert_eq!(&err, want, "{key:?}");
        assert_eq!(err.problem().status, 400);
        assert!(!err.to_string().is_empty());
    }
}

#[test]
fn serial_numbers_compare_across_the_wrap() {
    // IDEM-CTR-2
    use std::cmp::Ordering::*;
    assert_eq!(serial_cmp(255, 0, 8), Some(Less));
    assert_eq!(serial_cmp(0, 255, 8), Some(Greater));
    assert_eq!(serial_cmp(200, 10, 8), Some(Less));
    assert_eq!(serial_cmp(0, 127, 8), Some(Less));
    assert_eq!(serial_cmp(0, 128, 8), None, "undefined at half the range");
    assert_eq!(serial_cmp(5, 5, 8), Some(Equal));
    assert_eq!(serial_cmp(256, 0, 8), None, "beyond the bits");
    assert_eq!(serial_cmp(u64::MAX, 0, 64), Some(Less));
    assert_eq!(serial_cmp(0, 1 << 63, 64), None);
}

#[test]
fn config_bounds_the_width_and_the_window() {
    // IDEM-CTR-1 IDEM-CTR-2
    let e = Engine::default();
    let c = |bits, window| Counters::new(e.clone(), CounterConfig { bits, window });
    assert_eq!(c(7, 4).unwrap_err(), KindConfigError::BitsOutOfRange(7));
    assert_eq!(c(65, 4).unwrap_err(), KindConfigError::BitsOutOfRange(65));
    assert_eq!(
        c(8, 65).unwrap_err(),
        KindConfigError::WindowOutOfRange {
            window: 65,
            max: 64
        }
    );
    assert!(matches!(
        c(8, 0),
        Err(KindConfigError::WindowOutOfRange { .. })
    ));
    assert!(matches!(
        c(64, MAX_WINDOW + 1),
        Err(KindConfigError::WindowOutOfRange { .. })
    ));
    assert!(c(8, 64).is_ok());
    assert!(c(64, MAX_WINDOW).is_ok());
    assert_eq!(
        Counters::new(e, CounterConfig::default())
            .unwrap()
            .config()
            .bits,
        32
    );
}

#[test]
fn unknown_clients_are_refused_until_they_open_a_session() {
    // IDEM-CTR-3
    let mut h = H::new(8, 4);
    let stranger = CounterKey {
        client: "c2".into(),
        epoch: h.epoch,
        seq: 0,
    };
    let CounterClaim::Done(d) = h.claim_with(&stranger, "x", None) else {
        panic!("an unknown client executed")
    };
    assert_eq!(d, CounterDecision::Rejected(RejectReason::UnknownClient));
    assert_eq!(d.problem(), Some(Problem::UNKNOWN_CLIENT));
    assert_eq!(d.problem().unwrap().status, 412);
    assert!(h
        .store
        .get(&h.counters.session_key(&h.scope, "c2"))
        .is_none());
    // A session that expired is unknown again, and its reopening has another epoch.
    h.run_done(0, "a");
    h.now = h.now.saturating_add(Duration::from_secs(7 * 24 * 3600));
    assert_eq!(h.rejected(1, "b"), RejectReason::UnknownClient);
    let old = h.epoch;
    let reopened = open_session(
        &h.counters,
        &mut h.store,
        h.now,
        &h.scope,
        "c1",
        0,
        0x1234_5678_9abc,
    );
    assert_ne!(reopened, old);
    // The request that ran under the old session never runs again.
    assert!(matches!(
        h.rejected(0, "a"),
        RejectReason::StaleEpoch | RejectReason::UnknownEpoch
    ));
    // Bad client ids and first numbers are refused at open.
    assert_eq!(
        h.counters
            .open(h.now, &h.scope, "no way", 0, None, 1)
            .unwrap_err(),
        CounterError::BadClientId
    );
    assert_eq!(
        h.counters
            .open(h.now, &h.scope, "c3", 256, None, 1)
            .unwrap_err(),
        CounterError::SequenceBeyondBits { seq: 256, bits: 8 }
    );
}

#[test]
fn epochs_going_backwards_or_never_opened_are_refused() {
    // IDEM-CTR-4
    let mut h = H::new(8, 4);
    h.run_done(0, "a");
    let e = h.epoch;
    for (epoch, want) in [
        (e - 1, RejectReason::StaleEpoch),
        (0, RejectReason::StaleEpoch),
        (e + 1, RejectReason::UnknownEpoch),
        (u64::MAX, RejectReason::UnknownEpoch),
    ] {
        let key = CounterKey {
            client: "c1".into(),
            epoch,
            seq: 1,
        };
        let CounterClaim::Done(d) = h.claim_with(&key, "b", None) else {
            panic!("epoch {epoch} executed")
        };
        assert_eq!(d, CounterDecision::Rejected(want.clone()));
        assert_eq!(d.problem().unwrap().status, 412);
    }
    assert_eq!(h.session().next, 1, "nothing claimed");
}

#[test]
fn a_new_epoch_resets_the_window_and_fences_the_old_one() {
    // IDEM-CTR-5 IDEM-CTR-13
    let mut h = H::new(8, 4);
    h.run_done(0, "a");
    let running = h.run(1, "b");
    let old = h.epoch;
    h.epoch = h.open(100);
    assert_eq!(h.epoch, old + 1);
    let s = h.session();
    assert_eq!((s.low, s.next, s.slots.len()), (100, 100, 0));
    // The handler of the old epoch cannot store its result.
    assert_eq!(h.finish(&running, "b"), Finish::FencedOut);
    // Old requests are refused, the new epoch starts at its first number.
    let old_key = CounterKey {
        client: "c1".into(),
        epoch: old,
        seq: 0,
    };
    assert!(matches!(
        h.claim_with(&old_key, "a", None),
        CounterClaim::Done(CounterDecision::Rejected(RejectReason::StaleEpoch))
    ));
    assert_eq!(h.rejected(99, "z"), RejectReason::Stale);
    h.run_done(100, "c");
}

#[test]
fn numbers_below_the_low_water_mark_are_stale() {
    // IDEM-CTR-6
    let mut h = H::new(8, 4);
    for seq in 0..10 {
        h.run_done(seq, &format!("p{seq}"));
    }
    let s = h.session();
    assert_eq!((s.low, s.next), (6, 10));
    for seq in [0, 5, 200, 138] {
        let CounterClaim::Done(d) = h.claim(seq, &format!("p{seq}")) else {
            panic!("a stale number executed")
        };
        assert_eq!(d, CounterDecision::Rejected(RejectReason::Stale));
        assert_eq!(d.problem(), Some(Problem::KEY_STALE));
        assert_eq!(d.event(), Event::Stale);
    }
    assert_eq!(h.session(), s, "nothing changed");
}

#[test]
fn inside_the_window_a_match_is_a_retry_and_a_mismatch_a_collision() {
    // IDEM-CTR-7
    let mut h = H::with_engine(
        8,
        4,
        Config {
            lease: Duration::from_secs(10),
            // Above the lease: a duplicate is told the time left of it.
            max_retry_after: Duration::from_secs(60),
            ..Config::default()
        },
    );
    h.run_done(0, "a");
    let lease = h.run(1, "b");
    match h.claim(0, "a") {
        CounterClaim::Done(CounterDecision::Replay(r)) => assert_eq!(r.body, b"a"),
        other => panic!("{other:?}"),
    }
    assert_eq!(
        h.claim(1, "b"),
        CounterClaim::Done(CounterDecision::InProgress {
            retry_after_secs: 10
        })
    );
    let before = h.session();
    for (seq, body) in [(0, "other"), (1, "other")] {
        let CounterClaim::Done(d) = h.claim(seq, body) else {
            panic!("a collision executed")
        };
        assert_eq!(d, CounterDecision::Rejected(RejectReason::Collision));
        assert_eq!(d.problem(), Some(Problem::KEY_COLLISION));
        assert_eq!(d.event(), Event::Collision);
    }
    assert_eq!(h.session(), before, "a collision changes nothing");
    // After the lease ends, the same request takes over with a higher fence.
    h.now = h.now.saturating_add(Duration::from_secs(11));
    let CounterClaim::Execute {
        lease: second,
        recovered: true,
    } = h.claim(1, "b")
    else {
        panic!()
    };
    assert_eq!(second.fence, lease.fence + 1);
    assert_eq!(h.finish(&lease, "zombie"), Finish::FencedOut);
    assert_eq!(h.finish(&second, "b"), Finish::Stored);
}

#[test]
fn a_wrapped_counter_never_lands_on_a_live_slot() {
    // IDEM-CTR-7 IDEM-CTR-10
    let mut h = H::new(8, 4);
    // Run far enough to wrap twice.
    for i in 0..600u64 {
        h.run_done(i % 256, &format!("n{i}"));
    }
    let s = h.session();
    assert_eq!(s.next, 600 % 256);
    assert_eq!(s.low, (600 - 4) % 256);
    // A client that wrapped around (or lost count) sends numbers of the retained window with
    // new payloads: collisions, the retained results untouched. Running 600 slid the window
    // to [597, 600], so 596 is stale.
    let in_flight = h.run(s.next, "live");
    for back in 1..=3u64 {
        let seq = (600 - back) % 256;
        assert_eq!(h.rejected(seq, "new payload"), RejectReason::Collision);
        match h.claim(seq, &format!("n{}", 600 - back)) {
            CounterClaim::Done(CounterDecision::Replay(r)) => {
                assert_eq!(r.body, format!("n{}", 600 - back).into_bytes())
            }
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(
        h.rejected((600 - 4) % 256, "new payload"),
        RejectReason::Stale
    );
    assert_eq!(h.rejected(s.next, "new payload"), RejectReason::Collision);
    let after = h.session();
    let slot = after.slots.iter().find(|sl| sl.seq == s.next).unwrap();
    assert_eq!(slot.fingerprint, fp("live"));
    assert!(matches!(slot.state, SlotState::InFlight { .. }));
    assert_eq!(h.finish(&in_flight, "live"), Finish::Stored);
}

#[test]
fn the_next_number_runs_and_skipped_ones_may_follow() {
    // IDEM-CTR-8
    let mut h = H::new(8, 4);
    h.run_done(0, "a");
    // Skip 1 and 2 (fewer than the window): 3 runs, then 1 and 2 still run.
    h.run_done(3, "d");
    assert_eq!(h.session().next, 4);
    h.run_done(1, "b");
    h.run_done(2, "c");
    assert_eq!(h.session().slots.len(), 4);
    for (seq, body) in [(0, "a"), (1, "b"), (2, "c"), (3, "d")] {
        assert!(matches!(
            h.claim(seq, body),
            CounterClaim::Done(CounterDecision::Replay(_))
        ));
    }
}

#[test]
fn a_gap_of_a_whole_window_is_refused() {
    // IDEM-CTR-9
    let mut h = H::new(8, 4);
    h.run_done(0, "a");
    for seq in [5, 6, 100] {
        let CounterClaim::Done(d) = h.claim(seq, "x") else {
            panic!("{seq} executed across a gap")
        };
        assert_eq!(
            d,
            CounterDecision::Rejected(RejectReason::SequenceGap { next: 1 })
        );
        assert_eq!(d.problem(), Some(Problem::COUNTER_GAP));
        assert_eq!(d.problem().unwrap().status, 409);
        let CounterDecision::Rejected(r) = d else {
            unreachable!()
        };
        assert_eq!(r.retry_after_secs(), Some(1));
    }
    // Skipping three (less than the window) is fine.
    h.run_done(4, "e");
}

#[test]
fn the_window_never_slides_over_a_slot_in_flight() {
    // IDEM-CTR-10
    let mut h = H::new(8, 4);
    let oldest = h.run(0, "a");
    for seq in 1..4 {
        h.run_done(seq, "x");
    }
    h.now = h.now.saturating_add(Duration::from_secs(20));
    let CounterClaim::Done(d) = h.claim(4, "y") else {
        panic!("the window slid over an in-flight slot")
    };
    assert_eq!(
        d,
        // 40 s of the blocking slot's lease are left; the client is told to come back
        // within the default bound (IDEM-CONC-4).
        CounterDecision::Rejected(RejectReason::WindowFull {
            retry_after_secs: 2
        })
    );
    assert_eq!(d.problem(), Some(Problem::COUNTER_WINDOW_FULL));
    assert_eq!(d.problem().unwrap().status, 409);
    let s = h.session();
    assert_eq!((s.low, s.next), (0, 4));
    assert!(matches!(s.slots[0].state, SlotState::InFlight { .. }));
    assert_eq!(h.finish(&oldest, "a"), Finish::Stored);
    h.run_done(4, "y");
    assert_eq!(h.session().low, 1);
}

#[test]
fn the_client_moves_its_low_water_mark_forward_only() {
    // IDEM-CTR-11
    let mut h = H::new(8, 8);
    for seq in 0..4 {
        h.run_done(seq, &format!("p{seq}"));
    }
    // Mark 2: results 0 and 1 are dropped with the next write.
    let k4 = h.key(4);
    assert!(matches!(
        h.claim_with(&k4, "p4", Some(2)),
        CounterClaim::Execute { .. }
    ));
    assert_eq!(h.session().low, 2);
    assert_eq!(h.rejected(1, "p1"), RejectReason::Stale);
    // A mark behind the current one changes nothing.
    let k5 = h.key(5);
    assert!(matches!(
        h.claim_with(&k5, "p5", Some(0)),
        CounterClaim::Execute { .. }
    ));
    assert_eq!(h.session().low, 2);
    // A mark beyond the next number is refused, nothing runs.
    let k6 = h.key(6);
    let CounterClaim::Done(d) = h.claim_with(&k6, "p6", Some(7)) else {
        panic!()
    };
    assert_eq!(d, CounterDecision::Rejected(RejectReason::InvalidLowWater));
    assert_eq!(d.problem(), Some(Problem::INVALID_LOW_WATER));
    assert_eq!(h.session().next, 6);
    // A mark never passes a slot in flight (4 is in flight: it stops there).
    let CounterClaim::Execute { .. } = h.claim_with(&k6, "p6", Some(6)) else {
        panic!()
    };
    assert_eq!(h.session().low, 4);
    // A mark or a number beyond the bits is malformed.
    let CounterClaim::Done(d) = h.claim_with(&h.key(300), "x", None) else {
        panic!()
    };
    assert_eq!(d, CounterDecision::Rejected(RejectReason::InvalidSequence));
    assert_eq!(d.problem(), Some(Problem::MALFORMED_KEY));
    let CounterClaim::Done(d) = h.claim_with(&h.key(7), "x", Some(256)) else {
        panic!()
    };
    assert_eq!(d, CounterDecision::Rejected(RejectReason::InvalidSequence));
}

#[test]
fn fenced_completions_and_heartbeats_change_nothing() {
    // IDEM-CTR-13
    let mut h = H::with_engine(
        8,
        4,
        Config {
            lease: Duration::from_secs(10),
            // Above the lease: a duplicate is told the time left of it.
            max_retry_after: Duration::from_secs(60),
            ..Config::default()
        },
    );
    let first = h.run(0, "a");
    let key = h.counters.session_key(&h.scope, "c1");
    // A heartbeat in time extends the lease.
    h.now = h.now.saturating_add(Duration::from_secs(5));
    let stored = h.store.get(&key).cloned();
    let (extended, write) = h.counters.extend(h.now, &first, stored.as_ref()).unwrap();
    assert_eq!(h.store.apply(h.now, write).unwrap(), Applied::Applied);
    assert_eq!(
        extended.expires,
        h.now.saturating_add(Duration::from_secs(10))
    );
    assert_eq!(
        h.claim(0, "a"),
        CounterClaim::Done(CounterDecision::InProgress {
            retry_after_secs: 10
        })
    );
    // After it ends, a retry takes over; the first lease is fenced out.
    h.now = h.now.saturating_add(Duration::from_secs(11));
    let stored = h.store.get(&key).cloned();
    assert_eq!(
        h.counters
            .extend(h.now, &extended, stored.as_ref())
            .unwrap_err(),
        CounterError::LeaseExpired
    );
    let CounterClaim::Execute { lease: second, .. } = h.claim(0, "a") else {
        panic!()
    };
    let before = h.session();
    let stored = h.store.get(&key).cloned();
    assert_eq!(
        h.counters
            .complete(
                h.now,
                &extended,
                Outcome::Final(resp("zombie")),
                stored.as_ref()
            )
            .unwrap_err(),
        CounterError::FencedOut
    );
    let mut early = extended.clone();
    early.expires = h.now.saturating_add(Duration::from_secs(1));
    assert_eq!(
        h.counters
            .extend(h.now, &early, stored.as_ref())
            .unwrap_err(),
        CounterError::FencedOut
    );
    assert_eq!(h.finish(&extended, "zombie"), Finish::FencedOut);
    assert_eq!(h.session(), before);
    // Invalid statuses are refused.
    assert_eq!(
        h.counters
            .finish(
                &mut h.store,
                h.now,
                &second,
                Outcome::Final(StoredResponse {
                    status: 99,
                    headers: vec![],
                    body: vec![]
                })
            )
            .unwrap(),
        Finish::Invalid(CompleteError::InvalidStatus(99))
    );
    assert_eq!(h.finish(&second, "a"), Finish::Stored);
}

#[test]
fn retryable_outcomes_free_the_number_and_unknown_ones_follow_the_policy() {
    // IDEM-CTR-8 IDEM-OUT-2 IDEM-OUT-3
    let mut h = H::new(8, 4);
    let lease = h.run(0, "a");
    assert_eq!(
        h.counters
            .finish(&mut h.store, h.now, &lease, Outcome::Retryable)
            .unwrap(),
        Finish::Released
    );
    // The same number runs again, even with another payload (nothing happened).
    let lease = h.run(0, "b");
    // Default policy: an unknown outcome ends the lease; the retry takes over, recovered.
    assert_eq!(
        h.counters
            .finish(&mut h.store, h.now, &lease, Outcome::Unknown(None))
            .unwrap(),
        Finish::OutcomeUnknown
    );
    assert!(matches!(
        h.claim(0, "b"),
        CounterClaim::Execute {
            recovered: true,
            ..
        }
    ));

    // Hold: the slot is refused until resolved.
    let mut h = H::with_engine(
        8,
        4,
        Config {
            unknown_outcome: UnknownOutcomePolicy::Hold,
            ..Config::default()
        },
    );
    let lease = h.run(0, "a");
    assert_eq!(
        h.counters
            .finish(&mut h.store, h.now, &lease, Outcome::Unknown(None))
            .unwrap(),
        Finish::OutcomeUnknown
    );
    assert_eq!(h.rejected(0, "a"), RejectReason::OutcomeUnknown);
    // An unknown slot blocks the window like one in flight.
    for seq in 1..4 {
        h.run_done(seq, "x");
    }
    assert!(matches!(
        h.rejected(4, "y"),
        RejectReason::WindowFull { .. }
    ));
    let key = h.counters.session_key(&h.scope, "c1");
    let stored = h.store.get(&key).cloned();
    assert_eq!(
        h.counters
            .resolve(h.now, &key, 1, Outcome::Retryable, stored.as_ref())
            .unwrap_err(),
        CounterError::NotOutcomeUnknown
    );
    let w = h
        .counters
        .resolve(h.now, &key, 0, Outcome::Final(resp("a")), stored.as_ref())
        .unwrap();
    assert_eq!(h.store.apply(h.now, w).unwrap(), Applied::Applied);
    assert!(matches!(
        h.claim(0, "a"),
        CounterClaim::Done(CounterDecision::Replay(_))
    ));
    h.run_done(4, "y");

    // Store: an unknown outcome with a response is replayed.
    let mut h = H::with_engine(
        8,
        4,
        Config {
            unknown_outcome: UnknownOutcomePolicy::Store,
            ..Config::default()
        },
    );
    let lease = h.run(0, "a");
    let failed = StoredResponse {
        status: 502,
        headers: vec![],
        body: b"bad gateway".to_vec(),
    };
    assert_eq!(
        h.counters
            .finish(&mut h.store, h.now, &lease, Outcome::Unknown(Some(failed)))
            .unwrap(),
        Finish::Stored
    );
    match h.claim(0, "a") {
        CounterClaim::Done(CounterDecision::Replay(r)) => assert_eq!(r.status, 502),
        other => panic!("{other:?}"),
    }
}

#[test]
fn sessions_survive_the_record_codec_and_damage_is_refused() {
    // IDEM-REC-1 IDEM-CTR-12
    let mut h = H::new(8, 4);
    h.run_done(0, "a");
    let _running = h.run(1, "b");
    let key = h.counters.session_key(&h.scope, "c1");
    let record = h.store.get(&key).cloned().unwrap();
    let bytes = encode_record(&record);
    assert_eq!(decode_record(&bytes).unwrap(), record);
    for cut in 0..bytes.len() {
        assert!(decode_record(&bytes[..cut]).is_err());
    }
    let session = h.session();
    let damaged = [
        CounterSession {
            bits: 7,
            ..session.clone()
        },
        CounterSession {
            window: 65,
            ..session.clone()
        },
        CounterSession {
            next: 300,
            ..session.clone()
        },
        CounterSession {
            next: 9,
            ..session.clone()
        },
        CounterSession {
            slots: session.slots.iter().rev().cloned().collect(),
            ..session.clone()
        },
        CounterSession {
            low: 2,
            ..session.clone()
        },
    ];
    for s in damaged {
        let bad = Record {
            state: RecordState::Counter {
                session: Arc::new(s.clone()),
            },
            ..record.clone()
        };
        assert!(
            matches!(
                decode_record(&encode_record(&bad)),
                Err(DecodeError::Invalid(_))
            ),
            "{s:?}"
        );
    }
    // The engine never treats a session as a key.
    let f = fp("a");
    let attempt = Attempt {
        key: &key,
        fingerprint: &f,
        nonce: 1,
    };
    assert_eq!(
        Engine::default().decide(h.now, &attempt, Some(&record)),
        Decision::Rejected(RejectReason::Collision)
    );
}

#[test]
fn racing_requests_of_one_client_each_run_once() {
    // IDEM-CTR-12
    // Threads share a store behind a lock held only for one load or one apply, so that
    // decisions really interleave between the read and the write.
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
    for round in 0..20u64 {
        let counters = Counters::new(
            Engine::default(),
            CounterConfig {
                bits: 8,
                window: 16,
            },
        )
        .unwrap();
        let scope = Scope::new("alice", "POST", "/t");
        let shared = Arc::new(Mutex::new(MemoryStore::default()));
        let now = UnixMillis(T0);
        let epoch = open_session(
            &counters,
            &mut Shared(Arc::clone(&shared)),
            now,
            &scope,
            "c1",
            250,
            round,
        );
        let threads = 8;
        let barrier = Arc::new(Barrier::new(threads));
        let executed = Arc::new(Mutex::new(Vec::new()));
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let (counters, scope, barrier, executed) = (
                    counters.clone(),
                    scope.clone(),
                    Arc::clone(&barrier),
                    Arc::clone(&executed),
                );
                let mut store = Shared(Arc::clone(&shared));
                std::thread::spawn(move || {
                    barrier.wait();
                    // Each sequence number (wrapping past 255) is sent by two threads.
                    for i in 0..12u64 {
                        let seq = (250 + (i * 2 + (t as u64 % 2)) % 12) % 256;
                        let key = CounterKey {
                            client: "c1".into(),
                            epoch,
                            seq,
                        };
                        let f = fp(&format!("s{seq}"));
                        let attempt = CounterAttempt {
                            scope: &scope,
                            key: &key,
                            fingerprint: &f,
                            low_water: None,
                        };
                        loop {
                            match counters.claim(&mut store, now, &attempt).unwrap() {
                                CounterClaim::Execute { lease, .. } => {
                                    executed.lock().unwrap().push(seq);
                                    let fin = counters
                                        .finish(
                                            &mut store,
                                            now,
                                            &lease,
                                            Outcome::Final(resp(&format!("s{seq}"))),
                                        )
                                        .unwrap();
                                    assert_eq!(fin, Finish::Stored);
                                    break;
                                }
                                CounterClaim::Done(CounterDecision::Replay(r)) => {
                                    assert_eq!(r.body, format!("s{seq}").into_bytes());
                                    break;
                                }
                                CounterClaim::Done(CounterDecision::InProgress { .. }) => {
                                    std::thread::yield_now()
                                }
                                other => panic!("{other:?}"),
                            }
                        }
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
        let mut ran = executed.lock().unwrap().clone();
        ran.sort();
        let mut want: Vec<u64> = (0..12).map(|i| (250 + i) % 256).collect();
        want.sort();
        assert_eq!(ran, want, "each number ran exactly once");
    }
}

// --- Model test with 8-bit counters -------------------------------------------------------

#[derive(Clone, Debug)]
enum Op {
    /// Send the next logical request, possibly skipping some numbers.
    New { skip: u8 },
    /// Retry a logical request sent at most 127 numbers ago (a client never has more than
    /// its window outstanding, so older retries are already stale).
    Retry { pick: usize },
    /// Send a new payload under the number of a slot the session holds (a counter that
    /// wrapped around, or a client that lost count).
    Wrap { pick: usize },
    /// Finish a running handler (zombies included): final, retryable, unknown, or crash.
    Finish { pick: usize, how: u8 },
    /// Retry with the request's own number as low-water mark.
    Mark { pick: usize },
    /// Move the clock (leases expire; backward jumps too).
    Clock { jump_s: i32 },
    /// Open a new epoch.
    NewEpoch,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0u8..6).prop_map(|skip| Op::New { skip: if skip > 3 { 0 } else { skip } }),
        4 => any::<usize>().prop_map(|pick| Op::Retry { pick }),
        1 => any::<usize>().prop_map(|pick| Op::Wrap { pick }),
        6 => (any::<usize>(), 0u8..10).prop_map(|(pick, how)| Op::Finish { pick, how }),
        1 => any::<usize>().prop_map(|pick| Op::Mark { pick }),
        2 => (-30i32..90).prop_map(|jump_s| Op::Clock { jump_s }),
        1 => Just(Op::NewEpoch),
    ]
}

struct Logical {
    epoch: u64,
    abs: u64,
    payload: String,
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// With 8-bit counters (wraps every 256 numbers), random interleavings of new requests,
    /// retries, wrapped numbers, crashes, zombies, lease expiry, clock jumps, low-water marks
    /// and epoch changes: no collision is ever replayed or executed, nothing below the
    /// low-water mark ever executes, an in-flight slot is never dropped or overwritten, the
    /// mark never moves back, fenced completions change nothing, and each logical request
    /// executes from scratch at most once.
    #[test]
    fn counters_hold_their_invariants(window in 1u32..=16, ops in proptest::collection::vec(op(), 1..300)) {
        // IDEM-CTR-5 IDEM-CTR-6 IDEM-CTR-7 IDEM-CTR-10 IDEM-CTR-12 IDEM-CTR-13
        let engine = Engine::new(Config { lease: Duration::from_secs(30), ..Config::default() }).unwrap();
        let counters = Counters::new(engine, CounterConfig { bits: 8, window }).unwrap();
        let scope = Scope::new("p", "POST", "/t");
        let key = counters.session_key(&scope, "c1");
        let mut store = MemoryStore::default();
        let mut now = T0;
        let mut nonce = 7u64;
        // Start close to the end of the 8-bit range so that most runs wrap.
        let mut epoch = open_session(&counters, &mut store, UnixMillis(now), &scope, "c1", 230, nonce);
        let mut next_abs = 230u64;
        let mut logical: Vec<Logical> = Vec::new();
        // (epoch, abs) -> payload that ran first
        let mut ran: HashMap<(u64, u64), String> = HashMap::new();
        // Handlers that hold (or held) a lease: lease, logical index.
        let mut running: Vec<(CounterLease, usize)> = Vec::new();
        // The current epoch's low-water mark: absolute number, and as a sequence.
        let mut low = (230u64, 230u64);

        let session = |store: &MemoryStore| -> Option<CounterSession> {
            match &store.get(&key)?.state {
                RecordState::Counter { session } => Some((**session).clone()),
                _ => None,
            }
        };

        for op in ops {
            let mut send: Option<(CounterKey, String, Option<u64>, Option<usize>)> = None;
            match op {
                Op::New { skip } => {
                    next_abs += u64::from(skip);
                    let payload = format!("e{epoch}-n{next_abs}");
                    logical.push(Logical { epoch, abs: next_abs, payload: payload.clone() });
                    let k = CounterKey { client: "c1".into(), epoch, seq: next_abs % 256 };
                    send = Some((k, payload, None, Some(logical.len() - 1)));
                    next_abs += 1;
                }
                Op::Retry { pick } | Op::Mark { pick } => {
                    let recent: Vec<usize> = (0..logical.len()).filter(|i| logical[*i].abs + 128 > next_abs).collect();
                    if !recent.is_empty() {
                        let i = recent[pick % recent.len()];
                        let l = &logical[i];
                        let k = CounterKey { client: "c1".into(), epoch: l.epoch, seq: l.abs % 256 };
                        let mark = matches!(op, Op::Mark { .. }).then_some(l.abs % 256);
                        send = Some((k, l.payload.clone(), mark, Some(i)));
                    }
                }
                Op::Wrap { pick } => {
                    if let Some(s) = session(&store).filter(|s| !s.slots.is_empty()) {
                        let seq = s.slots[pick % s.slots.len()].seq;
                        let k = CounterKey { client: "c1".into(), epoch: s.epoch, seq };
                        send = Some((k, format!("wrapped-{seq}-{pick}"), None, None));
                    }
                }
                Op::Finish { pick, how } if !running.is_empty() => {
                    let (lease, i) = running.remove(pick % running.len());
                    let outcome = match how {
                        0..=5 => Some(Outcome::Final(resp(&logical[i].payload))),
                        6 => Some(Outcome::Retryable),
                        7 => Some(Outcome::Unknown(None)),
                        _ => None, // a crash: the lease will expire
                    };
                    if let Some(outcome) = outcome {
                        let before = session(&store);
                        let released = matches!(outcome, Outcome::Retryable);
                        let fin = counters.finish(&mut store, UnixMillis(now), &lease, outcome).unwrap();
                        if fin == Finish::FencedOut {
                            prop_assert_eq!(session(&store), before, "a fenced completion wrote");
                        } else if released {
                            // Nothing happened: the number may run again from scratch.
                            ran.remove(&(lease.epoch, logical[i].abs));
                        }
                    }
                }
                Op::Finish { .. } => {}
                Op::Clock { jump_s } => {
                    now = (now as i64 + i64::from(jump_s) * 1000) as u64;
                }
                Op::NewEpoch => {
                    nonce += 1;
                    let old = session(&store);
                    epoch = open_session(&counters, &mut store, UnixMillis(now), &scope, "c1", next_abs % 256, nonce);
                    prop_assert_eq!(epoch, old.unwrap().epoch + 1);
                    low = (next_abs, next_abs % 256);
                }
            }
            let Some((k, payload, mark, logical_index)) = send else { continue };
            let f = fp(&payload);
            let attempt = CounterAttempt { scope: &scope, key: &k, fingerprint: &f, low_water: mark };
            let before = session(&store);
            let claim = counters.claim(&mut store, UnixMillis(now), &attempt).unwrap();
            let after = session(&store).unwrap();
            prop_assert_eq!(after.epoch, epoch);
            // Track the mark in absolute numbers: it moves by less than 256 per write.
            let moved = after.low.wrapping_sub(low.1) & 255;
            prop_assert!(moved < 128, "the low-water mark moved back");
            low = (low.0 + moved, after.low);
            match &claim {
                CounterClaim::Execute { lease, recovered } => {
                    prop_assert_eq!(k.epoch, epoch, "an old epoch executed");
                    let i = logical_index.expect("only a logical request may execute");
                    let abs = logical[i].abs;
                    prop_assert!(abs >= low.0, "{} ran below the low-water mark {}", abs, low.0);
                    match ran.get(&(epoch, abs)) {
                        Some(first) => {
                            prop_assert!(*recovered, "{} ran twice from scratch", abs);
                            prop_assert_eq!(first, &payload);
                        }
                        None => {
                            prop_assert!(!*recovered);
                            ran.insert((epoch, abs), payload.clone());
                        }
                    }
                    if let Some(slot) = before.as_ref().and_then(|b| b.slots.iter().find(|s| s.seq == k.seq)) {
                        prop_assert_eq!(&slot.fingerprint, &f, "a live slot was overwritten");
                    }
                    running.push((lease.clone(), i));
                }
                CounterClaim::Done(CounterDecision::Replay(r)) => {
                    prop_assert_eq!(r.body.clone(), payload.clone().into_bytes(), "a collision was replayed");
                }
                CounterClaim::Done(CounterDecision::Rejected(RejectReason::Collision)) => {
                    let slot = before.as_ref().and_then(|b| b.slots.iter().find(|s| s.seq == k.seq));
                    prop_assert!(slot.is_some_and(|s| s.fingerprint != f));
                }
                CounterClaim::Done(_) => {}
            }
            if logical_index.is_none() {
                prop_assert!(
                    matches!(claim, CounterClaim::Done(CounterDecision::Rejected(RejectReason::Collision))),
                    "a wrap onto a held slot was not a collision: {:?}", claim
                );
            }
            // Every unsettled slot survives every claim.
            if let Some(b) = &before {
                if b.epoch == after.epoch {
                    for s in b.slots.iter().filter(|s| !matches!(s.state, SlotState::Completed { .. })) {
                        let kept = after.slots.iter().find(|x| x.seq == s.seq);
                        prop_assert!(kept.is_some_and(|x| x.fingerprint == s.fingerprint), "an unsettled slot was dropped or overwritten");
                    }
                }
            }
        }
    }
}
