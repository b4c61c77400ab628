//! Criterion benchmarks for the key kinds and the client: `cargo bench -p idem-core --bench
//! kinds`. Counter-window decisions (the session record holds a full window), time-key and
//! token decisions, sub-key derivation, and the client's retry decisions. The decisions are a
//! request machine's, made from a ticket (its copy counted in the time) as hosts make them.
use criterion::{criterion_group, criterion_main, BatchSize, Criterion};
use idem_core::*;
use std::hint::black_box;

const NOW: UnixMillis = UnixMillis(1_700_000_000_000);

fn response() -> StoredResponse {
    StoredResponse {
        status: 201,
        headers: vec![("content-type".into(), "application/json".into())],
        body: br#"{"id":"ch_1","amount":900,"currency":"usd","status":"succeeded"}"#.to_vec(),
    }
}

fn fp(i: u64) -> Fingerprint {
    let mut d = [0u8; 32];
    d[..8].copy_from_slice(&i.to_le_bytes());
    Fingerprint::from_digest(d)
}

/// Whose requests the benches make: one tenant, so that no principal is hashed.
const TARGET: Target<'static> = Target {
    principal: None,
    method: "POST",
    route: "/v1/charges",
};

fn scope(policy: &Policy) -> Scope {
    policy
        .scope(TARGET.principal, TARGET.method, TARGET.route)
        .unwrap()
}

/// Drives `req` over `store` until it runs, then records a 201.
fn run(req: &mut Request, store: &mut MemoryStore) -> Finish {
    let mut waiters = Waiters::default();
    let Ok(Step::Run(_)) = req.drive(store, NOW, &mut waiters) else {
        unreachable!()
    };
    req.handle_outcome(Outcome::Final(response()));
    match req.drive(store, NOW, &mut waiters) {
        Ok(Step::Done(finish)) => finish,
        _ => unreachable!(),
    }
}

/// The request of counter client c1 with `seq` in `epoch` and fingerprint `f`, identified.
fn counter_ticket(
    policy: &Policy,
    session: &RecordKey,
    epoch: u64,
    seq: u64,
    f: Fingerprint,
) -> Ticket {
    Ticket {
        key: session.clone(),
        fingerprint: f,
        subject: Subject::Counter {
            scope: scope(policy),
            key: CounterKey {
                client: "c1".into(),
                epoch,
                seq,
            },
            low_water: None,
        },
    }
}

/// A session with `window` completed slots, the last one `next - 1`: the store, the
/// session's record key and its epoch.
fn full_session(policy: &Policy, window: u64) -> (MemoryStore, RecordKey, u64) {
    let mut store = MemoryStore::default();
    // Opened with the session operation on an empty store.
    let mut opening = policy.open_session(&TARGET, "c1", 0, 42);
    let Ok(Step::Reply) = opening.drive(&mut store, NOW, &mut Waiters::default()) else {
        unreachable!()
    };
    let session = opening.key().clone();
    let RecordState::Counter { session: s } = &store.get(&session).unwrap().state else {
        unreachable!()
    };
    let epoch = s.epoch;
    for seq in 0..window + 3 {
        let mut req = policy.resume(counter_ticket(policy, &session, epoch, seq, fp(seq)), seq);
        run(&mut req, &mut store);
    }
    (store, session, epoch)
}

fn counter_window(c: &mut Criterion) {
    let mut g = c.benchmark_group("counter");
    let mut waiters = Waiters::default();
    for window in [8u32, 64] {
        let policy = Policy::new(Engine::default())
            .with_keys(KeyKind::Counter(CounterConfig { bits: 32, window }))
            .unwrap();
        let (store, session, epoch) = full_session(&policy, u64::from(window));
        let record = store.get(&session).cloned().unwrap();
        let next = u64::from(window) + 3;
        // The machine's decision on the session record it read.
        let mut decide = |name: String, seq: u64, f: Fingerprint, want: &str| {
            let ticket = counter_ticket(&policy, &session, epoch, seq, f);
            let mut req = policy.resume(ticket.clone(), 1);
            let _ = req.poll(NOW, &mut waiters);
            req.handle_record(NOW, Some(&record), &mut waiters);
            let answer = match req.decision() {
                Some(d) => format!("{d:?}"),
                None => format!("{:?}", req.poll(NOW, &mut waiters)),
            };
            assert!(answer.starts_with(want), "{name}: {answer}");
            g.bench_function(name, |b| {
                b.iter(|| {
                    let mut req = policy.resume(ticket.clone(), 1);
                    let _ = req.poll(NOW, &mut waiters);
                    req.handle_record(NOW, Some(black_box(&record)), &mut waiters);
                    black_box(req.poll(NOW, &mut waiters))
                })
            });
        };
        decide(
            format!("replay (window {window})"),
            next - 2,
            fp(next - 2),
            "Replay",
        );
        decide(
            format!("execute next, slide (window {window})"),
            next,
            fp(next),
            "Apply",
        );
        decide(
            format!("collision (window {window})"),
            next - 1,
            fp(7),
            "Rejected(Collision)",
        );
        decide(
            format!("stale (window {window})"),
            0,
            fp(0),
            "Rejected(Stale)",
        );
        decide(
            format!("gap (window {window})"),
            next + 3 * u64::from(window),
            fp(1),
            "Rejected(SequenceGap",
        );
        // The whole cycle through a store: claim the next number, store its response.
        g.bench_function(
            format!("claim + finish via MemoryStore (window {window})"),
            |b| {
                b.iter_batched(
                    || {
                        let store = full_session(&policy, u64::from(window)).0;
                        (
                            store,
                            counter_ticket(&policy, &session, epoch, next, fp(next)),
                        )
                    },
                    |(mut store, ticket)| {
                        let mut req = policy.resume(ticket, next);
                        black_box(run(&mut req, &mut store));
                        store
                    },
                    BatchSize::SmallInput,
                )
            },
        );
    }
    g.finish();
}

fn time_and_tokens(c: &mut Criterion) {
    let mut g = c.benchmark_group("kinds");
    let mut waiters = Waiters::default();
    let times = Policy::new(Engine::default())
        .with_keys(KeyKind::Time(TimeKeyConfig::default()))
        .unwrap();
    let text = "c1:1700000000000";
    let key = parse_time_key(text).unwrap();
    // Where the key's record lives, as the policy identifies a request with it.
    let record_key = times
        .request(
            &Intake {
                principal: TARGET.principal,
                method: TARGET.method,
                route: TARGET.route,
                target: TARGET.route,
                keys: &[text.as_bytes()],
                low_water: None,
                client: None,
                content_type: None,
                headers: &[],
                body: b"",
            },
            1,
        )
        .key()
        .clone();
    let ticket = |f: Fingerprint| Ticket {
        key: record_key.clone(),
        fingerprint: f,
        subject: Subject::Time(key.clone()),
    };
    let mut store = MemoryStore::default();
    run(&mut times.resume(ticket(fp(1)), 1), &mut store);
    let done = store.get(&record_key).cloned().unwrap();
    g.bench_function("time key: parse", |b| {
        b.iter(|| black_box(parse_time_key(black_box("c1:1700000000000"))))
    });
    // The machine checks the key's window, then decides on the record it read.
    let mut decide = |name: &str, t: Ticket, want: &str| {
        let mut req = times.resume(t.clone(), 1);
        let _ = req.poll(NOW, &mut waiters);
        req.handle_record(NOW, Some(&done), &mut waiters);
        let answer = format!("{:?}", req.decision());
        assert!(answer.starts_with(want), "{name}: {answer}");
        g.bench_function(name, |b| {
            b.iter(|| {
                let mut req = times.resume(t.clone(), 1);
                let _ = req.poll(NOW, &mut waiters);
                req.handle_record(NOW, Some(black_box(&done)), &mut waiters);
                black_box(req.poll(NOW, &mut waiters))
            })
        });
    };
    decide("time key: replay decision", ticket(fp(1)), "Some(Replay");
    decide(
        "time key: collision decision",
        ticket(fp(2)),
        "Some(Rejected(Collision))",
    );
    let tokens = Policy::new(Engine::default())
        .with_keys(KeyKind::Token {
            secret: TokenSecret([7; 32]),
            ttl: std::time::Duration::from_secs(3600),
        })
        .unwrap();
    // The token operation up to the write that stores the token.
    g.bench_function("token: issue", |b| {
        b.iter(|| {
            let mut req = tokens.issue_token(&TARGET, NOW, black_box([1, 2]));
            let step = req.poll(NOW, &mut waiters);
            (req, black_box(step))
        })
    });
    let mut issuing = tokens.issue_token(&TARGET, NOW, [1, 2]);
    let Ok(Step::Reply) = issuing.drive(&mut MemoryStore::default(), NOW, &mut waiters) else {
        unreachable!()
    };
    let document: serde_json::Value =
        serde_json::from_slice(issuing.reply().unwrap().body()).unwrap();
    let token = document["token"].as_str().unwrap().to_owned();
    let presented = |token: &str| Ticket {
        key: issuing.key().clone(),
        fingerprint: fp(1),
        subject: Subject::Token {
            scope: scope(&tokens),
            token: token.to_owned(),
        },
    };
    // The machine verifies a presented token before it reads anything: the first poll asks
    // for the record (authentic) or answers (forged).
    let mut verify = |name: &str, t: Ticket, want: Step| {
        assert_eq!(tokens.resume(t.clone(), 1).poll(NOW, &mut waiters), want);
        g.bench_function(name, |b| {
            b.iter(|| {
                let mut req = tokens.resume(t.clone(), 1);
                black_box(req.poll(NOW, &mut waiters))
            })
        });
    };
    verify("token: verify", presented(&token), Step::Claim);
    verify(
        "token: refuse a forged one",
        presented(&token.replace('a', "b")),
        Step::Reply,
    );
    g.bench_function("sub_key", |b| {
        b.iter(|| {
            black_box(sub_key(
                black_box("order-7f3a-1234"),
                black_box("charge card"),
            ))
        })
    });
    g.finish();
}

fn client(c: &mut Criterion) {
    let mut g = c.benchmark_group("client");
    let policy = RetryPolicy::default();
    let payload = [3u8; 32];
    let mut sent = OutboxEntry::new(uuid_v4_key([1; 16]), payload).unwrap();
    sent.send(NOW, &payload).unwrap();
    let ok = ClientResponse {
        status: 201,
        retry_after_secs: None,
        answer: KeyAnswer::Unspecified,
    };
    let busy = ClientResponse {
        status: 409,
        retry_after_secs: Some(2),
        answer: KeyAnswer::from_problem_type("urn:idem:problem:in-progress"),
    };
    g.bench_function("decide: lost response -> retry", |b| {
        let mut r = 0u64;
        b.iter(|| {
            r = r.wrapping_add(0x9e37_79b9_7f4a_7c15);
            black_box(sent.decide(&policy, NOW, r, Err(NetworkError::Lost)))
        })
    });
    g.bench_function("decide: 409 with Retry-After -> retry", |b| {
        b.iter(|| black_box(sent.decide(&policy, NOW, 12345, Ok(black_box(&busy)))))
    });
    g.bench_function("decide: 201 -> complete", |b| {
        b.iter(|| black_box(sent.decide(&policy, NOW, 12345, Ok(black_box(&ok)))))
    });
    g.bench_function("send + on_result (lost) cycle", |b| {
        b.iter_batched(
            || sent.clone(),
            |mut e| {
                let next = e
                    .on_result(&policy, NOW, 99, Err(NetworkError::Lost))
                    .unwrap();
                let NextStep::Retry { at } = next else {
                    unreachable!()
                };
                black_box(e.send(at, &payload).unwrap());
                e
            },
            BatchSize::SmallInput,
        )
    });
    g.bench_function("backoff_ms", |b| {
        b.iter(|| {
            black_box(backoff_ms(
                &policy,
                black_box(5),
                black_box(u64::MAX / 3),
                None,
            ))
        })
    });
    g.bench_function("problem type -> key answer", |b| {
        b.iter(|| {
            black_box(KeyAnswer::from_problem_type(black_box(
                "urn:idem:problem:key-stale",
            )))
        })
    });
    let bytes = encode_entry(&sent);
    println!("outbox entry: {} bytes encoded", bytes.len());
    g.bench_function("encode entry", |b| {
        b.iter(|| black_box(encode_entry(black_box(&sent))))
    });
    g.bench_function("decode entry", |b| {
        b.iter(|| black_box(decode_entry(black_box(&bytes))))
    });
    g.finish();
}

criterion_group!(benches, counter_window, time_and_tokens, client);
criterion_main!(benches);
