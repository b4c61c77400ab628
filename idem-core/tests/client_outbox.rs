//! The client outbox: completion, retries with backoff and jitter, giving up as failed or
//! undetermined, payload changes, persistence, and a simulation against a real engine.
use idem_core::*;
use proptest::prelude::*;
use std::time::Duration;

mod common;

const T0: u64 = 1_700_000_000_000;
const PAYLOAD: [u8; 32] = [3; 32];

fn entry() -> OutboxEntry {
    OutboxEntry::new(uuid_v4_key([1; 16]), PAYLOAD).unwrap()
}

fn sent(now: u64) -> OutboxEntry {
    let mut e = entry();
    assert_eq!(e.send(UnixMillis(now), &PAYLOAD).unwrap(), 1);
    e
}

fn response(status: u16) -> ClientResponse {
    ClientResponse {
        status,
        retry_after_secs: None,
        answer: KeyAnswer::Unspecified,
    }
}

fn policy() -> RetryPolicy {
    RetryPolicy::default()
}

/// An entry sent a second time after the answer to its first send was lost (the first
/// attempt may have run), and when.
fn resent_after_a_lost_answer() -> (OutboxEntry, UnixMillis) {
    let mut e = sent(T0);
    let NextStep::Retry { at } = e
        .on_result(&policy(), UnixMillis(T0), 1, Err(NetworkError::Lost))
        .unwrap()
    else {
        panic!("a lost answer is retried")
    };
    e.send(at, &PAYLOAD).unwrap();
    (e, at)
}

#[test]
fn keys_are_uuids_and_entries_refuse_bad_keys() {
    // IDEM-CLIENT-1
    let k = uuid_v4_key(*b"0123456789abcdef");
    assert_eq!(parse_uuid(&k, Some(UuidVersion::V4)).unwrap(), k);
    assert_ne!(uuid_v4_key([1; 16]), uuid_v4_key([3; 16]));
    assert!(matches!(
        OutboxEntry::new("", PAYLOAD),
        Err(ClientError::InvalidKey(KeyError::Empty))
    ));
    assert!(matches!(
        OutboxEntry::new("a\u{7f}", PAYLOAD),
        Err(ClientError::InvalidKey(_))
    ));
    assert!(matches!(
        OutboxEntry::new("k".repeat(256), PAYLOAD),
        Err(ClientError::InvalidKey(_))
    ));
    let e = entry();
    assert_eq!(e.state(), EntryState::Created);
    assert_eq!(e.next_send(UnixMillis(T0)), Some(UnixMillis(T0)));
}

#[test]
fn a_changed_payload_is_never_sent() {
    // IDEM-CLIENT-1
    let mut e = entry();
    assert_eq!(
        e.send(UnixMillis(T0), &[4; 32]),
        Err(ClientError::PayloadChanged)
    );
    assert_eq!(e.state(), EntryState::Created);
    assert_eq!(e.attempts(), 0);
    e.send(UnixMillis(T0), &PAYLOAD).unwrap();
    let NextStep::Retry { at } = e
        .on_result(&policy(), UnixMillis(T0), 0, Err(NetworkError::Lost))
        .unwrap()
    else {
        panic!()
    };
    assert_eq!(e.send(at, &[4; 32]), Err(ClientError::PayloadChanged));
    assert_eq!(e.attempts(), 1);
    assert!(!ClientError::PayloadChanged.to_string().is_empty());
    assert_eq!(e.send(at, &PAYLOAD), Ok(2));
}

#[test]
fn final_responses_complete_and_nothing_else_does() {
    // IDEM-CLIENT-2
    for (status, class) in [
        (200, Completion::Succeeded),
        (201, Completion::Succeeded),
        (204, Completion::Succeeded),
        (303, Completion::Succeeded),
        (400, Completion::Rejected),
        (404, Completion::Rejected),
        (410, Completion::Rejected),
        (412, Completion::Rejected),
        (422, Completion::Rejected),
    ] {
        let mut e = sent(T0);
        let next = e
            .on_result(&policy(), UnixMillis(T0), 7, Ok(&response(status)))
            .unwrap();
        assert_eq!(next, NextStep::Complete { class, status });
        assert_eq!(e.state(), EntryState::Answered { class, status });
        assert!(e.is_final());
        e.mark_processed().unwrap();
        assert_eq!(e.state(), EntryState::Processed { class, status });
        assert_eq!(e.next_send(UnixMillis(T0)), None);
    }
    for status in [408, 409, 425, 429, 500, 502, 503, 504] {
        let e = sent(T0);
        let next = e
            .decide(&policy(), UnixMillis(T0), 7, Ok(&response(status)))
            .unwrap();
        assert!(matches!(next, NextStep::Retry { .. }), "{status}: {next:?}");
    }
    for err in [NetworkError::NotSent, NetworkError::Lost] {
        let e = sent(T0);
        assert!(matches!(
            e.decide(&policy(), UnixMillis(T0), 7, Err(err)).unwrap(),
            NextStep::Retry { .. }
        ));
    }
    // A status no HTTP answer has: as a lost answer, retried, and the request may have run.
    for bad in [0, 99, 100, 101, 199, 600, 999] {
        let mut e = sent(T0);
        let next = e
            .on_result(&policy(), UnixMillis(T0), 7, Ok(&response(bad)))
            .unwrap();
        assert!(matches!(next, NextStep::Retry { .. }), "{bad}: {next:?}");
        assert!(e.maybe_processed(), "{bad}");
        assert_eq!(e.last_status(), None);
        assert_eq!(decode_entry(&encode_entry(&e)).unwrap(), e, "{bad}");
    }
}

#[test]
fn backoff_is_full_jitter_capped_and_honours_retry_after() {
    // IDEM-CLIENT-3
    let p = RetryPolicy {
        base: Duration::from_millis(100),
        cap: Duration::from_secs(5),
        ..RetryPolicy::default()
    };
    for attempt in 1..40 {
        let ceiling = (100u64 << (attempt - 1).min(40)).min(5_000);
        assert_eq!(backoff_ms(&p, attempt, 0, None), 0);
        assert_eq!(backoff_ms(&p, attempt, u64::MAX, None), ceiling);
        let mid = backoff_ms(&p, attempt, u64::MAX / 2, None);
        assert!(
            mid.abs_diff(ceiling / 2) <= 1,
            "{attempt}: {mid} vs {ceiling}"
        );
        assert_eq!(backoff_ms(&p, attempt, 0, Some(7)), 7_000);
        assert_eq!(
            backoff_ms(&p, attempt, u64::MAX, Some(1)),
            ceiling.max(1_000)
        );
    }
    // The entry uses it: the retry time is now + backoff, never before Retry-After.
    let mut e = sent(T0);
    let r = ClientResponse {
        status: 503,
        retry_after_secs: Some(30),
        answer: KeyAnswer::NotProcessed,
    };
    let next = e.on_result(&p, UnixMillis(T0 + 10), 0, Ok(&r)).unwrap();
    assert_eq!(
        next,
        NextStep::Retry {
            at: UnixMillis(T0 + 30_010)
        }
    );
    assert_eq!(e.next_send(UnixMillis(T0)), Some(UnixMillis(T0 + 30_010)));
    assert_eq!(
        e.send(UnixMillis(T0 + 30_009), &PAYLOAD),
        Err(ClientError::NotDue {
            at: UnixMillis(T0 + 30_010)
        })
    );
    assert_eq!(e.send(UnixMillis(T0 + 30_010), &PAYLOAD), Ok(2));
    assert_eq!(e.key(), entry().key(), "the same key on every attempt");
}

#[test]
fn giving_up_is_undetermined_unless_nothing_can_have_run() {
    // IDEM-CLIENT-4
    let p = RetryPolicy {
        max_attempts: 3,
        ..RetryPolicy::default()
    };
    // Only refusals that did nothing: failed.
    let mut e = sent(T0);
    let mut now = T0;
    let not_processed = ClientResponse {
        status: 503,
        retry_after_secs: None,
        answer: KeyAnswer::NotProcessed,
    };
    for _ in 0..2 {
        let NextStep::Retry { at } = e
            .on_result(&p, UnixMillis(now), 1, Ok(&not_processed))
            .unwrap()
        else {
            panic!()
        };
        now = at.0;
        e.send(at, &PAYLOAD).unwrap();
    }
    let last = e
        .on_result(&p, UnixMillis(now), 1, Err(NetworkError::NotSent))
        .unwrap();
    assert_eq!(
        last,
        NextStep::Failed {
            reason: GiveUp::Budget
        }
    );
    assert_eq!(
        e.state(),
        EntryState::Failed {
            reason: GiveUp::Budget
        }
    );
    assert!(!e.maybe_processed());
    // One lost response among them: undetermined.
    for unknown in [
        Err(NetworkError::Lost),
        Ok(response(500)),
        Ok(response(409)),
        Ok(ClientResponse {
            status: 429,
            retry_after_secs: None,
            answer: KeyAnswer::KeyBusy,
        }),
    ] {
        let mut e = sent(T0);
        let r = unknown.as_ref().map_err(|e| *e);
        let NextStep::Retry { at } = e.on_result(&p, UnixMillis(T0), 1, r).unwrap() else {
            panic!()
        };
        assert!(e.maybe_processed(), "{unknown:?}");
        e.send(at, &PAYLOAD).unwrap();
        let NextStep::Retry { at } = e.on_result(&p, at, 1, Ok(&not_processed)).unwrap() else {
            panic!()
        };
        e.send(at, &PAYLOAD).unwrap();
        assert_eq!(
            e.on_result(&p, at, 1, Err(NetworkError::NotSent)).unwrap(),
            NextStep::Undetermined {
                reason: GiveUp::Budget
            }
        );
    }
    // The deadline: a retry that would come after it gives up now.
    let p = RetryPolicy {
        deadline: Duration::from_secs(10),
        ..RetryPolicy::default()
    };
    let mut e = sent(T0);
    let late = ClientResponse {
        status: 503,
        retry_after_secs: Some(11),
        answer: KeyAnswer::Unspecified,
    };
    assert_eq!(
        e.on_result(&p, UnixMillis(T0), 1, Ok(&late)).unwrap(),
        NextStep::Undetermined {
            reason: GiveUp::Deadline
        }
    );
    assert_eq!(e.deadline(&p), Some(UnixMillis(T0 + 10_000)));
    let mut e = sent(T0);
    assert_eq!(
        e.on_result(&p, UnixMillis(T0 + 10_001), 1, Err(NetworkError::NotSent))
            .unwrap(),
        NextStep::Failed {
            reason: GiveUp::Deadline
        }
    );
}

#[test]
fn a_forgotten_key_after_a_possible_execution_is_undetermined() {
    // IDEM-CLIENT-5
    for problem in [
        Problem::KEY_EXPIRED,
        Problem::KEY_STALE,
        Problem::UNKNOWN_CLIENT,
        Problem::STALE_EPOCH,
        Problem::UNKNOWN_EPOCH,
        Problem::TOKEN_UNKNOWN,
        Problem::TOKEN_EXPIRED,
        // It ran, and its response is not kept: the status query says so (expired).
        Problem::RESPONSE_NOT_STORED,
    ] {
        let answer = KeyAnswer::from_problem_type(problem.type_uri);
        assert_eq!(answer, KeyAnswer::Forgotten, "{}", problem.slug);
        let r = ClientResponse {
            status: problem.status,
            retry_after_secs: None,
            answer,
        };
        // First send: nothing can have run under this key, so it is a plain refusal.
        let mut e = sent(T0);
        assert_eq!(
            e.on_result(&policy(), UnixMillis(T0), 1, Ok(&r)).unwrap(),
            NextStep::Complete {
                class: Completion::Rejected,
                status: problem.status
            }
        );
        // After a lost response: the first attempt may have run; nobody can say.
        let (mut e, at) = resent_after_a_lost_answer();
        assert_eq!(
            e.on_result(&policy(), at, 1, Ok(&r)).unwrap(),
            NextStep::Undetermined {
                reason: GiveUp::KeyForgotten
            }
        );
        assert_eq!(e.last_status(), Some(problem.status));
    }
}

#[test]
fn a_replay_is_final_whatever_its_status() {
    // IDEM-CLIENT-2
    for (status, class) in [
        (201, Completion::Succeeded),
        (303, Completion::Succeeded),
        (409, Completion::Rejected),
        (429, Completion::Rejected),
        (500, Completion::Rejected),
    ] {
        let r = ClientResponse {
            answer: KeyAnswer::Replayed,
            ..response(status)
        };
        let mut e = sent(T0);
        assert_eq!(
            e.on_result(&policy(), UnixMillis(T0), 1, Ok(&r)).unwrap(),
            NextStep::Complete { class, status }
        );
        assert!(e.maybe_processed(), "a replayed request ran");
    }
}

#[test]
fn a_refusal_after_a_possible_execution_is_undetermined() {
    // IDEM-CLIENT-5: a 401 of an expired credential, in front of the server, after a lost
    // answer, says nothing of the key.
    let (mut e, at) = resent_after_a_lost_answer();
    assert_eq!(
        e.on_result(&policy(), at, 1, Ok(&response(401))).unwrap(),
        NextStep::Undetermined {
            reason: GiveUp::Refused
        }
    );
    assert_eq!(e.last_status(), Some(401));
    // Before any attempt could run, the same refusal is the request's.
    let mut e = sent(T0);
    assert_eq!(
        e.on_result(&policy(), UnixMillis(T0), 1, Ok(&response(401)))
            .unwrap(),
        NextStep::Complete {
            class: Completion::Rejected,
            status: 401
        }
    );
    // A refusal the server says did nothing (`NotProcessed`) stays a refusal.
    let r = ClientResponse {
        answer: KeyAnswer::NotProcessed,
        ..response(413)
    };
    let (mut e, at) = resent_after_a_lost_answer();
    assert!(matches!(
        e.on_result(&policy(), at, 1, Ok(&r)).unwrap(),
        NextStep::Complete { .. }
    ));
}

#[test]
fn a_final_answer_whose_body_broke_off_is_lost() {
    // IDEM-CLIENT-2: the answer is the application's once its body arrived.
    let mut e = sent(T0);
    assert!(matches!(
        e.on_result(&policy(), UnixMillis(T0), 1, Ok(&response(201)))
            .unwrap(),
        NextStep::Complete { .. }
    ));
    assert_eq!(
        e.on_result(&policy(), UnixMillis(T0), 1, Err(NetworkError::NotSent)),
        Err(ClientError::NothingInFlight(EntryState::Answered {
            class: Completion::Succeeded,
            status: 201
        }))
    );
    let NextStep::Retry { at } = e
        .on_result(&policy(), UnixMillis(T0), 1, Err(NetworkError::Lost))
        .unwrap()
    else {
        panic!()
    };
    assert!(e.maybe_processed());
    assert_eq!(e.send(at, &PAYLOAD).unwrap(), 2);
    // Once processed, nothing is in flight.
    let mut e = sent(T0);
    assert!(matches!(
        e.on_result(&policy(), UnixMillis(T0), 1, Ok(&response(201))),
        Ok(NextStep::Complete { .. })
    ));
    e.mark_processed().unwrap();
    assert!(e
        .on_result(&policy(), UnixMillis(T0), 1, Err(NetworkError::Lost))
        .is_err());
}

#[test]
fn problem_types_map_to_what_they_say_about_the_key() {
    // IDEM-CLIENT-3 IDEM-CLIENT-5
    use KeyAnswer::*;
    for (p, want) in [
        (Problem::IN_PROGRESS, KeyBusy),
        (Problem::OUTCOME_UNKNOWN, KeyBusy),
        (Problem::MISSING_KEY, NotProcessed),
        (Problem::MALFORMED_KEY, NotProcessed),
        (Problem::MISMATCH, NotProcessed),
        (Problem::KEY_COLLISION, NotProcessed),
        (Problem::KEY_FROM_FUTURE, NotProcessed),
        (Problem::INVALID_LOW_WATER, NotProcessed),
        (Problem::COUNTER_GAP, NotProcessed),
        (Problem::COUNTER_WINDOW_FULL, NotProcessed),
        (Problem::TOKEN_FORGED, NotProcessed),
        (Problem::STORE_FULL, NotProcessed),
        (Problem::STORE_UNAVAILABLE, NotProcessed),
        (Problem::BODY_TOO_LARGE, NotProcessed),
        (Problem::INVALID_JSON, NotProcessed),
        (Problem::KEY_EXPIRED, Forgotten),
    ] {
        assert_eq!(KeyAnswer::from_problem_type(p.type_uri), want, "{}", p.slug);
    }
    assert_eq!(KeyAnswer::from_problem_type("about:blank"), Unspecified);
    assert_eq!(
        KeyAnswer::from_problem_type("urn:idem:problem:nope"),
        Unspecified
    );
    assert_eq!(KeyAnswer::from_problem_type("in-progress"), Unspecified);
    // A counter gap is a 409 that says this key never ran: the retry does not make the
    // outcome uncertain.
    let e = sent(T0);
    let gap = ClientResponse {
        status: 409,
        retry_after_secs: Some(1),
        answer: KeyAnswer::from_problem_type(Problem::COUNTER_GAP.type_uri),
    };
    let mut e2 = e.clone();
    assert!(matches!(
        e2.on_result(&policy(), UnixMillis(T0), 1, Ok(&gap))
            .unwrap(),
        NextStep::Retry { .. }
    ));
    assert!(!e2.maybe_processed());
}

#[test]
fn entries_refuse_calls_out_of_order() {
    // IDEM-CLIENT-7
    let mut e = entry();
    assert_eq!(
        e.on_result(&policy(), UnixMillis(T0), 1, Err(NetworkError::Lost)),
        Err(ClientError::NothingInFlight(EntryState::Created))
    );
    assert_eq!(
        e.mark_processed(),
        Err(ClientError::NotAnswered(EntryState::Created))
    );
    e.send(UnixMillis(T0), &PAYLOAD).unwrap();
    assert_eq!(
        e.send(UnixMillis(T0), &PAYLOAD),
        Err(ClientError::NotSendable(EntryState::Sent))
    );
    let _ = e
        .on_result(&policy(), UnixMillis(T0), 1, Ok(&response(201)))
        .unwrap();
    let answered = e.state();
    assert_eq!(
        e.send(UnixMillis(T0), &PAYLOAD),
        Err(ClientError::NotSendable(answered))
    );
    assert_eq!(
        e.on_result(&policy(), UnixMillis(T0), 1, Ok(&response(201))),
        Err(ClientError::NothingInFlight(answered))
    );
    e.mark_processed().unwrap();
    assert!(matches!(
        e.mark_processed(),
        Err(ClientError::NotAnswered(_))
    ));
    let mut failed = sent(T0);
    let _ = failed
        .on_result(
            &RetryPolicy {
                max_attempts: 1,
                ..policy()
            },
            UnixMillis(T0),
            1,
            Err(NetworkError::NotSent),
        )
        .unwrap();
    assert!(matches!(
        failed.send(UnixMillis(T0), &PAYLOAD),
        Err(ClientError::NotSendable(EntryState::Failed { .. }))
    ));
    assert!(!ClientError::NotDue { at: UnixMillis(1) }
        .to_string()
        .is_empty());
}

#[test]
fn entries_persist_and_damage_is_refused() {
    // IDEM-CLIENT-6
    let mut e = sent(T0);
    let _ = e
        .on_result(&policy(), UnixMillis(T0), 99, Err(NetworkError::Lost))
        .unwrap();
    for entry in [entry(), sent(T0), e.clone()] {
        let bytes = encode_entry(&entry);
        assert_eq!(decode_entry(&bytes).unwrap(), entry);
        for cut in 0..bytes.len() {
            assert!(decode_entry(&bytes[..cut]).is_err(), "cut at {cut}");
        }
        for i in 0..bytes.len() {
            for bit in 0..8 {
                let mut b = bytes.clone();
                b[i] ^= 1 << bit;
                // Either an error or a consistent entry; never a panic.
                if let Ok(d) = decode_entry(&b) {
                    assert_eq!(decode_entry(&encode_entry(&d)).unwrap(), d);
                }
            }
        }
    }
    let bytes = encode_entry(&e);
    assert_eq!(decode_entry(b"xx\x01"), Err(EntryDecodeError::NotAnEntry));
    let mut v = bytes.clone();
    v[2] = 9;
    assert_eq!(
        decode_entry(&v),
        Err(EntryDecodeError::UnsupportedVersion(9))
    );
    let mut v = bytes.clone();
    v.push(0);
    assert_eq!(decode_entry(&v), Err(EntryDecodeError::Malformed));
    assert!(matches!(
        decode_entry(&vec![0u8; MAX_ENTRY_BYTES + 1]),
        Err(EntryDecodeError::TooLarge { .. })
    ));
    // Inconsistent fields are refused: a created entry with attempts.
    let created = encode_entry(&entry());
    let sent_bytes = encode_entry(&sent(T0));
    assert_ne!(created, sent_bytes);
    let mut forged = sent_bytes.clone();
    // The state tag follows the key and the 32-byte payload; make it "created".
    let key_len = entry().key().len();
    let state_at = 3 + 1 + key_len + 32;
    assert_eq!(forged[state_at], 1, "state Sent");
    forged[state_at] = 0;
    assert!(matches!(
        decode_entry(&forged),
        Err(EntryDecodeError::Invalid(_))
    ));
}

// --- Simulation against a real engine -------------------------------------------------------

#[derive(Clone, Debug)]
struct Fate {
    /// 0: the request never leaves; 1: the response is lost; 2: delivered.
    network: u8,
    /// 0: the handler succeeds; 1: crashes after the effect; 2: crashes before it;
    /// 3: refuses (400); 4: refuses before acting (503, not processed).
    handler: u8,
    random: u64,
    /// Time between events.
    wait_ms: u32,
}

fn fate() -> impl Strategy<Value = Fate> {
    (0u8..10, 0u8..10, any::<u64>(), 0u32..20_000).prop_map(|(n, h, random, wait_ms)| Fate {
        network: match n {
            0 => 0,
            1..=3 => 1,
            _ => 2,
        },
        handler: match h {
            0..=4 => 0,
            5 => 1,
            6 => 2,
            7 => 3,
            _ => 4,
        },
        random,
        wait_ms,
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// A client entry against a server running the engine over a MemoryStore, with lost
    /// requests, lost responses, crashes and refusals: the client completes only on a final
    /// response it received, reports success only when the effect happened exactly once,
    /// reports failure only when it never happened, and the effect never happens twice.
    #[test]
    fn the_client_never_reports_more_than_it_knows(fates in proptest::collection::vec(fate(), 1..40)) {
        // IDEM-CLIENT-2 IDEM-CLIENT-3 IDEM-CLIENT-4 IDEM-EXEC-1
        let server = Policy::new(Engine::new(Config { lease: Duration::from_secs(5), ..Config::default() }).unwrap());
        let policy = RetryPolicy { max_attempts: 8, deadline: Duration::from_secs(120), ..RetryPolicy::default() };
        let mut store = MemoryStore::default();
        let mut entry = OutboxEntry::new(uuid_v4_key([5; 16]), PAYLOAD).unwrap();
        let key = RecordKey::new(Scope::new("c", "POST", "/x"), entry.key());
        let fingerprint = Fingerprint::from_digest(*entry.payload());
        let mut now = T0;
        let mut effects = 0u32;
        let mut last_delivered: Option<u16> = None;
        let mut outcome = None;
        for (i, f) in fates.iter().enumerate() {
            now += u64::from(f.wait_ms);
            if let Some(at) = entry.next_send(UnixMillis(now)) {
                now = now.max(at.0);
            }
            prop_assert_eq!(entry.send(UnixMillis(now), &PAYLOAD).unwrap(), entry.attempts());
            let result: Result<ClientResponse, NetworkError> = if f.network == 0 {
                Err(NetworkError::NotSent)
            } else {
                let ticket = Ticket { key: key.clone(), fingerprint: fingerprint.clone(), subject: Subject::Record };
                let mut req = server.resume(ticket, i as u64);
                let reply = match common::claim(&mut req, &mut store, UnixMillis(now)).unwrap() {
                    Claimed::Execute { recovered, .. } => {
                        let stored = |status: u16| StoredResponse { status, headers: vec![], body: vec![] };
                        // A recovered handler reconciles first: if the effect happened, it
                        // reports success instead of refusing.
                        let handler = if recovered && effects > 0 { 0 } else { f.handler };
                        match handler {
                            0 => {
                                // A recovered handler reconciles: the effect happens once.
                                if !recovered || effects == 0 { effects += 1; }
                                let _ = common::finish(&mut req, &mut store, UnixMillis(now), Outcome::Final(stored(201))).unwrap();
                                Some(ClientResponse { status: 201, retry_after_secs: None, answer: KeyAnswer::Unspecified })
                            }
                            1 => {
                                if !recovered || effects == 0 { effects += 1; }
                                None
                            }
                            2 => None,
                            3 => {
                                let _ = common::finish(&mut req, &mut store, UnixMillis(now), Outcome::Final(stored(400))).unwrap();
                                Some(response(400))
                            }
                            _ => {
                                let _ = common::finish(&mut req, &mut store, UnixMillis(now), Outcome::Retryable).unwrap();
                                Some(ClientResponse {
                                    status: 503,
                                    retry_after_secs: Some(1),
                                    answer: KeyAnswer::from_problem_type(Problem::STORE_UNAVAILABLE.type_uri),
                                })
                            }
                        }
                    }
                    Claimed::Done(Decision::Replay(r)) => Some(response(r.status)),
                    Claimed::Done(d) => {
                        let p = d.problem().unwrap();
                        Some(ClientResponse {
                            status: p.status,
                            retry_after_secs: match d { Decision::InProgress { retry_after_secs } => Some(retry_after_secs), _ => None },
                            answer: KeyAnswer::from_problem_type(p.type_uri),
                        })
                    }
                };
                match (reply, f.network) {
                    (Some(r), 2) => Ok(r),
                    // A crash reaches the client as a 502 from a proxy, or as a lost connection.
                    (None, 2) => Ok(response(502)),
                    _ => Err(NetworkError::Lost),
                }
            };
            if let Ok(r) = &result {
                last_delivered = Some(r.status);
            }
            let next = entry.on_result(&policy, UnixMillis(now), f.random, result.as_ref().map_err(|e| *e)).unwrap();
            match next {
                NextStep::Retry { at } => {
                    prop_assert!(at.0 >= now);
                    prop_assert!(at.0 <= now + 20_000.max(result.as_ref().ok().and_then(|r| r.retry_after_secs).unwrap_or(0) * 1000));
                    continue;
                }
                other => {
                    outcome = Some(other);
                    break;
                }
            }
        }
        prop_assert!(effects <= 1, "the effect happened twice");
        match outcome {
            Some(NextStep::Complete { class, status }) => {
                prop_assert_eq!(Some(status), last_delivered, "complete without a final response");
                match class {
                    Completion::Succeeded => prop_assert_eq!(effects, 1),
                    Completion::Rejected => prop_assert!((400..500).contains(&status)),
                }
            }
            Some(NextStep::Failed { .. }) => prop_assert_eq!(effects, 0, "reported failed after an effect"),
            Some(NextStep::Undetermined { .. }) => prop_assert!(entry.maybe_processed()),
            Some(other) => prop_assert!(false, "a send's result never asks the server: {:?}", other),
            None => prop_assert!(!entry.is_final()),
        }
    }
}
