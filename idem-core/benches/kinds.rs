//! Criterion benchmarks for the key kinds and the client: `cargo bench -p idem-core --bench
//! kinds`. Counter-window decisions (the session record holds a full window), time-key and
//! token decisions, sub-key derivation, and the client's retry decisions.
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

/// A session with `window` completed slots, the last one `next - 1`.
fn full_session(counters: &Counters, scope: &Scope, window: u64) -> (MemoryStore, u64) {
    let mut store = MemoryStore::default();
    // Opened with the rule, as the session operation does on an empty store.
    let opened = counters.open(NOW, scope, "c1", 0, None, 42).unwrap();
    assert_eq!(store.apply(NOW, opened.write).unwrap(), Applied::Applied);
    let epoch = opened.epoch;
    for seq in 0..window + 3 {
        let key = CounterKey {
            client: "c1".into(),
            epoch,
            seq,
        };
        let f = fp(seq);
        let attempt = CounterAttempt {
            scope,
            key: &key,
            fingerprint: &f,
            low_water: None,
        };
        let CounterClaim::Execute { lease, .. } =
            counters.claim(&mut store, NOW, &attempt).unwrap()
        else {
            unreachable!()
        };
        let _ = counters
            .finish(&mut store, NOW, &lease, Outcome::Final(response()))
            .unwrap();
    }
    (store, epoch)
}

fn counter_window(c: &mut Criterion) {
    let mut g = c.benchmark_group("counter");
    for window in [8u32, 64] {
        let counters =
            Counters::new(Engine::default(), CounterConfig { bits: 32, window }).unwrap();
        let scope = Scope::new("tenant-42", "POST", "/v1/charges");
        let (store, epoch) = full_session(&counters, &scope, u64::from(window));
        let record = store
            .get(&counters.session_key(&scope, "c1"))
            .cloned()
            .unwrap();
        let next = u64::from(window) + 3;
        let (scope_ref, counters_ref, record_ref) = (&scope, &counters, &record);
        let decide = |seq: u64, f: Fingerprint| {
            let (scope, counters, record) = (scope_ref, counters_ref, record_ref);
            let key = CounterKey {
                client: "c1".into(),
                epoch,
                seq,
            };
            move |b: &mut criterion::Bencher<'_>| {
                let attempt = CounterAttempt {
                    scope,
                    key: &key,
                    fingerprint: &f,
                    low_water: None,
                };
                b.iter(|| black_box(counters.decide(NOW, black_box(&attempt), Some(record))))
            }
        };
        g.bench_function(
            format!("replay (window {window})"),
            decide(next - 2, fp(next - 2)),
        );
        g.bench_function(
            format!("execute next, slide (window {window})"),
            decide(next, fp(next)),
        );
        g.bench_function(
            format!("collision (window {window})"),
            decide(next - 1, fp(7)),
        );
        g.bench_function(format!("stale (window {window})"), decide(0, fp(0)));
        g.bench_function(
            format!("gap (window {window})"),
            decide(next + 3 * u64::from(window), fp(1)),
        );
        // The whole cycle through a store: claim the next number, store its response.
        g.bench_function(
            format!("claim + finish via MemoryStore (window {window})"),
            |b| {
                b.iter_batched(
                    || (full_session(&counters, &scope, u64::from(window)).0, next),
                    |(mut store, seq)| {
                        let key = CounterKey {
                            client: "c1".into(),
                            epoch,
                            seq,
                        };
                        let f = fp(seq);
                        let attempt = CounterAttempt {
                            scope: &scope,
                            key: &key,
                            fingerprint: &f,
                            low_water: None,
                        };
                        let CounterClaim::Execute { lease, .. } =
                            counters.claim(&mut store, NOW, &attempt).unwrap()
                        else {
                            unreachable!()
                        };
                        black_box(
                            counters
                                .finish(&mut store, NOW, &lease, Outcome::Final(response()))
                                .unwrap(),
                        );
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
    let tk = TimeKeys::new(Engine::default(), TimeKeyConfig::default()).unwrap();
    let scope = Scope::new("tenant-42", "POST", "/v1/charges");
    let key = parse_time_key("c1:1700000000000").unwrap();
    let rk = tk.record_key(&scope, &key);
    let f = fp(1);
    let attempt = Attempt {
        key: &rk,
        fingerprint: &f,
        nonce: 1,
    };
    let Decision::Execute { lease, .. } = tk.decide(NOW, &key, &attempt, None) else {
        unreachable!()
    };
    let WriteOp::Put(done) = tk
        .engine()
        .complete(NOW, &lease, Outcome::Final(response()))
        .unwrap()
        .op
    else {
        unreachable!()
    };
    g.bench_function("time key: parse", |b| {
        b.iter(|| black_box(parse_time_key(black_box("c1:1700000000000"))))
    });
    g.bench_function("time key: replay decision", |b| {
        b.iter(|| black_box(tk.decide(NOW, &key, black_box(&attempt), Some(&done))))
    });
    let other = fp(2);
    let collide = Attempt {
        fingerprint: &other,
        ..attempt
    };
    g.bench_function("time key: collision decision", |b| {
        b.iter(|| black_box(tk.decide(NOW, &key, black_box(&collide), Some(&done))))
    });
    let tokens = Tokens::new(
        Engine::default(),
        TokenSecret([7; 32]),
        std::time::Duration::from_secs(3600),
    )
    .unwrap();
    g.bench_function("token: issue", |b| {
        b.iter(|| black_box(tokens.issue(NOW, &scope, black_box([1, 2]))))
    });
    let token = tokens.issue(NOW, &scope, [1, 2]).token;
    g.bench_function("token: verify", |b| {
        b.iter(|| black_box(tokens.verify(&scope, black_box(&token))))
    });
    g.bench_function("token: refuse a forged one", |b| {
        let forged = token.replace('a', "b");
        b.iter(|| black_box(tokens.verify(&scope, black_box(&forged))))
    });
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
    let mut sent = OutboxEntry::new(uuid_v4_key([1, 2]), payload).unwrap();
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
