//! Wrapping counter keys: parsing, serial arithmetic, sessions and epochs, the window, the
//! low-water mark, fencing, a real race, and a model test with 8-bit counters so that wraps
//! happen.
use idem_core::*;
use proptest::prelude::*;
use std::collections::HashMap;
use std::sync::{Arc, Barrier, Mutex};
use std::time::Duration;

mod common;

const T0: u64 = 1_700_000_000_000;

/// What goes into fingerprints here: the raw body, without the JSON canonicaliser.
fn spec() -> FingerprintSpec {
    FingerprintSpec {
        json: JsonMode::Never,
        ..FingerprintSpec::default()
    }
}

/// The fingerprint of a request with `body`, as the policy computes it.
fn fp(body: &str) -> Fingerprint {
    spec()
        .fingerprint(&RequestParts {
            method: "POST",
            target: "/t",
            content_type: None,
            headers: &[],
            body: body.as_bytes(),
        })
        .unwrap()
}

fn resp(body: &str) -> StoredResponse {
    StoredResponse {
        status: 200,
        headers: vec![],
        body: body.as_bytes().to_vec(),
    }
}

/// A host whose keys are counters of `bits` bits with a window of `window`, over `engine`.
fn policy(bits: u8, window: u32, engine: Engine) -> Result<Policy, KindConfigError> {
    Ok(Policy::new(engine)
        .with_keys(KeyKind::Counter(CounterConfig { bits, window }))?
        .with_fingerprint(spec()))
}

const ALICE: Target<'static> = Target {
    principal: Some("alice"),
    method: "POST",
    route: "/transfer",
};

/// Opens the session of `client` for alice with the session operation, and returns its
/// epoch and where the session lives.
fn open_session<S: Store>(
    policy: &Policy,
    store: &mut S,
    now: UnixMillis,
    client: &str,
    first: u64,
    nonce: u64,
) -> (u64, RecordKey)
where
    S::Error: std::fmt::Debug,
{
    let mut req = policy.open_session(&ALICE, client, first, nonce);
    assert_eq!(
        req.drive(store, now, &mut Waiters::default()).unwrap(),
        Step::Reply
    );
    let reply = req.reply().unwrap();
    assert_eq!(reply.status(), 201, "{:?}", req.refusal());
    let v: serde_json::Value = serde_json::from_slice(reply.body()).unwrap();
    let epoch = v["epoch"].as_str().unwrap().parse().unwrap();
    (epoch, req.key().clone())
}

/// The machine of alice's request with the counter key `key`, `body`, and the low-water
/// mark `low_water` if any.
fn request(policy: &Policy, key: &CounterKey, body: &str, low_water: Option<u64>) -> Request {
    let text = format!("{}:{}:{}", key.client, key.epoch, key.seq);
    let mark = low_water.map(|w| w.to_string());
    policy.request(
        &Intake {
            principal: Some("alice"),
            method: "POST",
            route: "/transfer",
            target: "/t",
            keys: &[text.as_bytes()],
            low_water: mark.as_deref(),
            client: None,
            content_type: None,
            headers: &[],
            body: body.as_bytes(),
        },
        key.seq ^ 0x5eed,
    )
}

struct H {
    policy: Policy,
    store: MemoryStore,
    now: UnixMillis,
    epoch: u64,
    /// Where c1's session lives.
    session_key: RecordKey,
}

impl H {
    fn new(bits: u8, window: u32) -> H {
        H::with_engine(bits, window, Config::default())
    }

    fn with_engine(bits: u8, window: u32, config: Config) -> H {
        let policy = policy(bits, window, Engine::new(config).unwrap()).unwrap();
        let mut store = MemoryStore::default();
        let now = UnixMillis(T0);
        let (epoch, session_key) = open_session(&policy, &mut store, now, "c1", 0, 0xdead_beef);
        H {
            policy,
            store,
            now,
            epoch,
            session_key,
        }
    }

    fn open(&mut self, first: u64) -> u64 {
        open_session(
            &self.policy,
            &mut self.store,
            self.now,
            "c1",
            first,
            0xdead_beef_u64,
        )
        .0
    }

    fn key(&self, seq: u64) -> CounterKey {
        CounterKey {
            client: "c1".into(),
            epoch: self.epoch,
            seq,
        }
    }

    /// A request with `key`: its machine, and what its claim came to.
    fn attempt_with(
        &mut self,
        key: &CounterKey,
        body: &str,
        low_water: Option<u64>,
    ) -> (Request, Claimed) {
        let mut req = request(&self.policy, key, body, low_water);
        let claimed = common::claim(&mut req, &mut self.store, self.now).unwrap();
        (req, claimed)
    }

    fn claim_with(&mut self, key: &CounterKey, body: &str, low_water: Option<u64>) -> Claimed {
        self.attempt_with(key, body, low_water).1
    }

    fn attempt(&mut self, seq: u64, body: &str) -> (Request, Claimed) {
        let key = self.key(seq);
        self.attempt_with(&key, body, None)
    }

    fn claim(&mut self, seq: u64, body: &str) -> Claimed {
        self.attempt(seq, body).1
    }

    /// The machine of a new request that runs.
    fn run(&mut self, seq: u64, body: &str) -> Request {
        match self.attempt(seq, body) {
            (
                req,
                Claimed::Execute {
                    hold: Hold::Slot(_),
                    recovered: false,
                },
            ) => req,
            (_, other) => panic!("seq {seq}: {other:?}"),
        }
    }

    fn finish_with(&mut self, req: &mut Request, outcome: Outcome) -> Finish {
        common::finish(req, &mut self.store, self.now, outcome).unwrap()
    }

    fn finish(&mut self, req: &mut Request, body: &str) -> Finish {
        self.finish_with(req, Outcome::Final(resp(body)))
    }

    fn run_done(&mut self, seq: u64, body: &str) {
        let mut req = self.run(seq, body);
        assert_eq!(self.finish(&mut req, body), Finish::Stored);
    }

    fn session(&self) -> CounterSession {
        let r = self.store.get(&self.session_key).unwrap();
        match &r.state {
            RecordState::Counter { session } => (**session).clone(),
            other => panic!("{other:?}"),
        }
    }

    fn rejected(&mut self, seq: u64, body: &str) -> RejectReason {
        match self.claim(seq, body) {
            Claimed::Done(Decision::Rejected(r)) => r,
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
    let c = |bits, window| policy(bits, window, Engine::default());
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
    assert_eq!(CounterConfig::default().bits, 32);
    assert!(Policy::new(Engine::default())
        .with_keys(KeyKind::Counter(CounterConfig::default()))
        .is_ok());
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
    let (req, Claimed::Done(d)) = h.attempt_with(&stranger, "x", None) else {
        panic!("an unknown client executed")
    };
    assert_eq!(d, Decision::Rejected(RejectReason::UnknownClient));
    assert_eq!(d.problem(), Some(Problem::UNKNOWN_CLIENT));
    assert_eq!(d.problem().unwrap().status, 412);
    assert!(h.store.get(req.key()).is_none());
    // A session that expired is unknown again, and its reopening has another epoch.
    h.run_done(0, "a");
    h.now = h.now.saturating_add(Duration::from_secs(7 * 24 * 3600));
    assert_eq!(h.rejected(1, "b"), RejectReason::UnknownClient);
    let old = h.epoch;
    let (reopened, _) = open_session(&h.policy, &mut h.store, h.now, "c1", 0, 0x1234_5678_9abc);
    assert_ne!(reopened, old);
    // The request that ran under the old session never runs again.
    assert!(matches!(
        h.rejected(0, "a"),
        RejectReason::StaleEpoch | RejectReason::UnknownEpoch
    ));
    // Bad client ids and first numbers are refused at open, and nothing is written.
    for (client, first, why) in [
        ("no way", 0, CounterError::BadClientId),
        (
            "c3",
            256,
            CounterError::SequenceBeyondBits { seq: 256, bits: 8 },
        ),
    ] {
        let entries = h.store.stats().entries;
        let mut opening = h.policy.open_session(&ALICE, client, first, 1);
        assert_eq!(
            opening.drive(&mut h.store, h.now, &mut Waiters::default()),
            Ok(Step::Reply)
        );
        assert_eq!(h.store.stats().entries, entries);
        let refusal = opening.refusal().unwrap();
        assert_eq!(refusal.problem, Problem::MALFORMED_KEY);
        assert_eq!(refusal.requirement, "IDEM-CTR-1");
        assert_eq!(refusal.detail, why.to_string());
    }
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
        let Claimed::Done(d) = h.claim_with(&key, "b", None) else {
            panic!("epoch {epoch} executed")
        };
        assert_eq!(d, Decision::Rejected(want.clone()));
        assert_eq!(d.problem().unwrap().status, 412);
    }
    assert_eq!(h.session().next, 1, "nothing claimed");
}

#[test]
fn a_new_epoch_resets_the_window_and_fences_the_old_one() {
    // IDEM-CTR-5 IDEM-CTR-13
    let mut h = H::new(8, 4);
    h.run_done(0, "a");
    let mut running = h.run(1, "b");
    let old = h.epoch;
    h.epoch = h.open(100);
    assert_eq!(h.epoch, old + 1);
    let s = h.session();
    assert_eq!((s.low, s.next, s.slots.len()), (100, 100, 0));
    // The handler of the old epoch cannot store its result.
    assert_eq!(h.finish(&mut running, "b"), Finish::FencedOut);
    // Old requests are refused, the new epoch starts at its first number.
    let old_key = CounterKey {
        client: "c1".into(),
        epoch: old,
        seq: 0,
    };
    assert!(matches!(
        h.claim_with(&old_key, "a", None),
        Claimed::Done(Decision::Rejected(RejectReason::StaleEpoch))
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
        let (mut req, Claimed::Done(d)) = h.attempt(seq, &format!("p{seq}")) else {
            panic!("a stale number executed")
        };
        assert_eq!(d, Decision::Rejected(RejectReason::Stale));
        assert_eq!(d.problem(), Some(Problem::KEY_STALE));
        assert_eq!(common::events(&mut req), [Event::Stale]);
        // A counter's staleness cites the counter rule.
        assert_eq!(req.reply().unwrap().requirement(), Some("IDEM-CTR-6"));
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
    let mut first = h.run(1, "b");
    match h.claim(0, "a") {
        Claimed::Done(Decision::Replay(r)) => assert_eq!(r.body, b"a"),
        other => panic!("{other:?}"),
    }
    assert_eq!(
        h.claim(1, "b"),
        Claimed::Done(Decision::InProgress {
            retry_after_secs: 10
        })
    );
    let before = h.session();
    for (seq, body) in [(0, "other"), (1, "other")] {
        let (mut req, Claimed::Done(d)) = h.attempt(seq, body) else {
            panic!("a collision executed")
        };
        assert_eq!(d, Decision::Rejected(RejectReason::Collision));
        assert_eq!(d.problem(), Some(Problem::KEY_COLLISION));
        assert_eq!(common::events(&mut req), [Event::Collision]);
        assert_eq!(req.reply().unwrap().requirement(), Some("IDEM-CTR-7"));
    }
    assert_eq!(h.session(), before, "a collision changes nothing");
    // After the lease ends, the same request takes over with a higher fence.
    h.now = h.now.saturating_add(Duration::from_secs(11));
    let (
        mut second,
        Claimed::Execute {
            hold: Hold::Slot(taken),
            recovered: true,
        },
    ) = h.attempt(1, "b")
    else {
        panic!()
    };
    assert_eq!(taken.fence, common::slot(&first).fence + 1);
    assert_eq!(h.finish(&mut first, "zombie"), Finish::FencedOut);
    assert_eq!(h.finish(&mut second, "b"), Finish::Stored);
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
    let mut in_flight = h.run(s.next, "live");
    for back in 1..=3u64 {
        let seq = (600 - back) % 256;
        assert_eq!(h.rejected(seq, "new payload"), RejectReason::Collision);
        match h.claim(seq, &format!("n{}", 600 - back)) {
            Claimed::Done(Decision::Replay(r)) => {
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
    assert_eq!(h.finish(&mut in_flight, "live"), Finish::Stored);
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
            Claimed::Done(Decision::Replay(_))
        ));
    }
}

#[test]
fn a_gap_of_a_whole_window_is_refused() {
    // IDEM-CTR-9
    let mut h = H::new(8, 4);
    h.run_done(0, "a");
    for seq in [5, 6, 100] {
        let (req, Claimed::Done(d)) = h.attempt(seq, "x") else {
            panic!("{seq} executed across a gap")
        };
        assert_eq!(d, Decision::Rejected(RejectReason::SequenceGap { next: 1 }));
        assert_eq!(d.problem(), Some(Problem::COUNTER_GAP));
        assert_eq!(d.problem().unwrap().status, 409);
        let Decision::Rejected(r) = d else {
            unreachable!()
        };
        assert_eq!(r.retry_after_secs(), Some(1));
        assert!(req
            .reply()
            .unwrap()
            .headers()
            .any(|h| h == ("retry-after", "1")));
    }
    // Skipping three (less than the window) is fine.
    h.run_done(4, "e");
}

#[test]
fn the_window_never_slides_over_a_slot_in_flight() {
    // IDEM-CTR-10
    let mut h = H::new(8, 4);
    let mut oldest = h.run(0, "a");
    for seq in 1..4 {
        h.run_done(seq, "x");
    }
    h.now = h.now.saturating_add(Duration::from_secs(20));
    let Claimed::Done(d) = h.claim(4, "y") else {
        panic!("the window slid over an in-flight slot")
    };
    assert_eq!(
        d,
        // 40 s of the blocking slot's lease are left; the client is told to come back
        // within the default bound (IDEM-CONC-4).
        Decision::Rejected(RejectReason::WindowFull {
            retry_after_secs: 2
        })
    );
    assert_eq!(d.problem(), Some(Problem::COUNTER_WINDOW_FULL));
    assert_eq!(d.problem().unwrap().status, 409);
    let s = h.session();
    assert_eq!((s.low, s.next), (0, 4));
    assert!(matches!(s.slots[0].state, SlotState::InFlight { .. }));
    assert_eq!(h.finish(&mut oldest, "a"), Finish::Stored);
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
        Claimed::Execute { .. }
    ));
    assert_eq!(h.session().low, 2);
    assert_eq!(h.rejected(1, "p1"), RejectReason::Stale);
    // A mark behind the current one changes nothing.
    let k5 = h.key(5);
    assert!(matches!(
        h.claim_with(&k5, "p5", Some(0)),
        Claimed::Execute { .. }
    ));
    assert_eq!(h.session().low, 2);
    // A mark beyond the next number is refused, nothing runs.
    let k6 = h.key(6);
    let Claimed::Done(d) = h.claim_with(&k6, "p6", Some(7)) else {
        panic!()
    };
    assert_eq!(d, Decision::Rejected(RejectReason::InvalidLowWater));
    assert_eq!(d.problem(), Some(Problem::INVALID_LOW_WATER));
    assert_eq!(h.session().next, 6);
    // A mark never passes a slot in flight (4 is in flight: it stops there).
    let Claimed::Execute { .. } = h.claim_with(&k6, "p6", Some(6)) else {
        panic!()
    };
    assert_eq!(h.session().low, 4);
    // A mark or a number beyond the bits is malformed: a number that does not fit is
    // refused with the key, before the session is read.
    let mut beyond = request(&h.policy, &h.key(300), "x", None);
    assert_eq!(
        beyond.drive(&mut h.store, h.now, &mut Waiters::default()),
        Ok(Step::Reply)
    );
    let refusal = beyond.refusal().unwrap();
    assert_eq!(refusal.problem, Problem::MALFORMED_KEY);
    assert_eq!(refusal.requirement, "IDEM-CTR-1");
    let Claimed::Done(d) = h.claim_with(&h.key(7), "x", Some(256)) else {
        panic!()
    };
    assert_eq!(d, Decision::Rejected(RejectReason::InvalidSequence));
    assert_eq!(d.problem(), Some(Problem::MALFORMED_KEY));
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
    let mut first = h.run(0, "a");
    // A heartbeat in time extends the lease.
    h.now = h.now.saturating_add(Duration::from_secs(5));
    let until = h.now.saturating_add(Duration::from_secs(10));
    assert_eq!(
        common::heartbeat(&mut first, &mut h.store, h.now).unwrap(),
        Heartbeat::Extended(until)
    );
    let extended = common::slot(&first);
    assert_eq!(extended.expires, until);
    assert_eq!(
        h.claim(0, "a"),
        Claimed::Done(Decision::InProgress {
            retry_after_secs: 10
        })
    );
    // After it ends, a heartbeat is refused, a retry takes over, and the first lease is
    // fenced out.
    h.now = h.now.saturating_add(Duration::from_secs(11));
    assert_eq!(first.heartbeat(h.now), Err(Heartbeat::Expired));
    let (mut second, Claimed::Execute { .. }) = h.attempt(0, "a") else {
        panic!()
    };
    let before = h.session();
    // A heartbeat of the first lease from a clock that thinks it still runs finds its slot
    // taken over, and writes nothing.
    let mut early = extended.clone();
    early.expires = h.now.saturating_add(Duration::from_secs(1));
    let mut behind = common::holding(&h.policy, first.ticket(), Hold::Slot(early), h.now);
    assert_eq!(
        common::heartbeat(&mut behind, &mut h.store, h.now).unwrap(),
        Heartbeat::FencedOut
    );
    assert_eq!(h.session(), before);
    // Nor does its completion.
    assert_eq!(h.finish(&mut first, "zombie"), Finish::FencedOut);
    assert_eq!(h.session(), before);
    // Invalid statuses are refused.
    let mut invalid = common::holding(
        &h.policy,
        second.ticket(),
        Hold::Slot(common::slot(&second)),
        h.now,
    );
    assert_eq!(
        h.finish_with(
            &mut invalid,
            Outcome::Final(StoredResponse {
                status: 99,
                headers: vec![],
                body: vec![]
            })
        ),
        Finish::Invalid(CompleteError::InvalidStatus(99))
    );
    assert_eq!(h.finish(&mut second, "a"), Finish::Stored);
}

#[test]
fn retryable_outcomes_free_the_number_and_unknown_ones_follow_the_policy() {
    // IDEM-CTR-8 IDEM-OUT-2 IDEM-OUT-3
    let mut h = H::new(8, 4);
    let mut req = h.run(0, "a");
    assert_eq!(
        h.finish_with(&mut req, Outcome::Retryable),
        Finish::Released
    );
    // The same number runs again, even with another payload (nothing happened).
    let mut req = h.run(0, "b");
    // Default policy: an unknown outcome ends the lease; the retry takes over, recovered.
    assert_eq!(
        h.finish_with(&mut req, Outcome::Unknown(None)),
        Finish::OutcomeUnknown
    );
    assert!(matches!(
        h.claim(0, "b"),
        Claimed::Execute {
            recovered: true,
            ..
        }
    ));

    // Hold: the slot is refused until it is reconciled (the reconciliation itself is a unit
    // test of the counter rules).
    let mut h = H::with_engine(
        8,
        4,
        Config {
            unknown_outcome: UnknownOutcomePolicy::Hold,
            ..Config::default()
        },
    );
    let mut req = h.run(0, "a");
    assert_eq!(
        h.finish_with(&mut req, Outcome::Unknown(None)),
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
    assert!(matches!(
        h.session().slots[0].state,
        SlotState::OutcomeUnknown { .. }
    ));

    // Store: an unknown outcome with a response is replayed.
    let mut h = H::with_engine(
        8,
        4,
        Config {
            unknown_outcome: UnknownOutcomePolicy::Store,
            ..Config::default()
        },
    );
    let mut req = h.run(0, "a");
    let failed = StoredResponse {
        status: 502,
        headers: vec![],
        body: b"bad gateway".to_vec(),
    };
    assert_eq!(
        h.finish_with(&mut req, Outcome::Unknown(Some(failed))),
        Finish::Stored
    );
    match h.claim(0, "a") {
        Claimed::Done(Decision::Replay(r)) => assert_eq!(r.status, 502),
        other => panic!("{other:?}"),
    }
}

#[test]
fn sessions_survive_the_record_codec_and_damage_is_refused() {
    // IDEM-REC-1 IDEM-CTR-12
    let mut h = H::new(8, 4);
    h.run_done(0, "a");
    let _running = h.run(1, "b");
    let key = h.session_key.clone();
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
    // A request whose key names the session's record as a key of its own never treats the
    // session as one.
    let keys = Policy::new(Engine::default());
    let ticket = Ticket {
        key,
        fingerprint: fp("a"),
        subject: Subject::Record,
    };
    assert_eq!(
        common::claim(&mut keys.resume(ticket, 1), &mut h.store, h.now).unwrap(),
        Claimed::Done(Decision::Rejected(RejectReason::Collision))
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
        let policy = policy(8, 16, Engine::default()).unwrap();
        let shared = Arc::new(Mutex::new(MemoryStore::default()));
        let now = UnixMillis(T0);
        let (epoch, _) = open_session(
            &policy,
            &mut Shared(Arc::clone(&shared)),
            now,
            "c1",
            250,
            round,
        );
        let threads = 8;
        let barrier = Arc::new(Barrier::new(threads));
        let executed = Arc::new(Mutex::new(Vec::new()));
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let (policy, barrier, executed) =
                    (policy.clone(), Arc::clone(&barrier), Arc::clone(&executed));
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
                        let body = format!("s{seq}");
                        loop {
                            let mut req = request(&policy, &key, &body, None);
                            match common::claim(&mut req, &mut store, now).unwrap() {
                                Claimed::Execute { .. } => {
                                    executed.lock().unwrap().push(seq);
                                    let fin = common::finish(
                                        &mut req,
                                        &mut store,
                                        now,
                                        Outcome::Final(resp(&body)),
                                    )
                                    .unwrap();
                                    assert_eq!(fin, Finish::Stored);
                                    break;
                                }
                                Claimed::Done(Decision::Replay(r)) => {
                                    assert_eq!(r.body, body.clone().into_bytes());
                                    break;
                                }
                                Claimed::Done(Decision::InProgress { .. }) => {
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
        let policy = policy(8, window, engine).unwrap();
        let mut store = MemoryStore::default();
        let mut now = T0;
        let mut nonce = 7u64;
        // Start close to the end of the 8-bit range so that most runs wrap.
        let (mut epoch, key) = open_session(&policy, &mut store, UnixMillis(now), "c1", 230, nonce);
        let mut next_abs = 230u64;
        let mut logical: Vec<Logical> = Vec::new();
        // (epoch, abs) -> payload that ran first
        let mut ran: HashMap<(u64, u64), String> = HashMap::new();
        // Handlers that hold (or held) a lease: their request's machine, logical index.
        let mut running: Vec<(Request, usize)> = Vec::new();
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
                    let (mut req, i) = running.remove(pick % running.len());
                    let lease_epoch = common::slot(&req).epoch;
                    let outcome = match how {
                        0..=5 => Some(Outcome::Final(resp(&logical[i].payload))),
                        6 => Some(Outcome::Retryable),
                        7 => Some(Outcome::Unknown(None)),
                        _ => None, // a crash: the lease will expire
                    };
                    if let Some(outcome) = outcome {
                        let before = session(&store);
                        let released = matches!(outcome, Outcome::Retryable);
                        let fin = common::finish(&mut req, &mut store, UnixMillis(now), outcome).unwrap();
                        if fin == Finish::FencedOut {
                            prop_assert_eq!(session(&store), before, "a fenced completion wrote");
                        } else if released {
                            // Nothing happened: the number may run again from scratch.
                            ran.remove(&(lease_epoch, logical[i].abs));
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
                    epoch = open_session(&policy, &mut store, UnixMillis(now), "c1", next_abs % 256, nonce).0;
                    prop_assert_eq!(epoch, old.unwrap().epoch + 1);
                    low = (next_abs, next_abs % 256);
                }
            }
            let Some((k, payload, mark, logical_index)) = send else { continue };
            let f = fp(&payload);
            let before = session(&store);
            let mut req = request(&policy, &k, &payload, mark);
            let claim = common::claim(&mut req, &mut store, UnixMillis(now)).unwrap();
            let after = session(&store).unwrap();
            prop_assert_eq!(after.epoch, epoch);
            // Track the mark in absolute numbers: it moves by less than 256 per write.
            let moved = after.low.wrapping_sub(low.1) & 255;
            prop_assert!(moved < 128, "the low-water mark moved back");
            low = (low.0 + moved, after.low);
            match &claim {
                Claimed::Execute { recovered, .. } => {
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
                    running.push((req, i));
                }
                Claimed::Done(Decision::Replay(r)) => {
                    prop_assert_eq!(r.body.clone(), payload.clone().into_bytes(), "a collision was replayed");
                }
                Claimed::Done(Decision::Rejected(RejectReason::Collision)) => {
                    let slot = before.as_ref().and_then(|b| b.slots.iter().find(|s| s.seq == k.seq));
                    prop_assert!(slot.is_some_and(|s| s.fingerprint != f));
                }
                Claimed::Done(_) => {}
            }
            if logical_index.is_none() {
                prop_assert!(
                    matches!(claim, Claimed::Done(Decision::Rejected(RejectReason::Collision))),
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
