//! Criterion benchmarks for idem-core: `cargo bench -p idem-core --bench core`.
//!
//! Besides the timings, the run prints the MemoryStore's resident bytes per retained key,
//! measured from the process's resident set size around building a 1,000,000-key store, and
//! the cost of a new key while a store grows from a million keys to two, beside a std
//! HashMap growing alike.
//!
//! Every decision, claim and completion is a request machine's, as hosts drive it: made from
//! the request's ticket (its own copy of the key and fingerprint, counted in the time), then
//! polled, fed what the store answered, and dropped.
use criterion::{criterion_group, BatchSize, Criterion, Throughput};
use idem_core::*;
use std::hint::black_box;
use std::time::Duration;

const NOW: UnixMillis = UnixMillis(1_700_000_000_000);

fn key(i: u64) -> RecordKey {
    RecordKey::new(
        Scope::new("tenant-42", "POST", "/v1/charges"),
        format!("{i:036}"),
    )
}

/// A key as the floors' std HashMap holds it: scope and key as one string.
fn flat(k: &RecordKey) -> String {
    format!("{}{}", k.scope.as_str(), k.key)
}

/// The floors' std HashMap holding the first `n` keys, each to a 32-byte digest.
fn filled_map(n: u64) -> std::collections::HashMap<String, [u8; 32]> {
    (0..n).map(|j| (flat(&key(j)), [3; 32])).collect()
}

fn response() -> StoredResponse {
    StoredResponse {
        status: 201,
        headers: vec![("content-type".into(), "application/json".into())],
        body: br#"{"id":"ch_1","amount":900,"currency":"usd","status":"succeeded"}"#.to_vec(),
    }
}

/// The request of key `k` with fingerprint `fp`, as a host identified it.
fn ticket(k: &RecordKey, fp: &Fingerprint) -> Ticket {
    Ticket {
        key: k.clone(),
        fingerprint: fp.clone(),
        subject: Subject::Record,
    }
}

/// The record a request with fingerprint `fp` leaves under `engine` when it is claimed and
/// completed at `NOW`, written by its machine. A record does not name its key: stores fill
/// many keys with copies of it.
fn completed(engine: &Engine, fp: &Fingerprint) -> Record {
    let k = key(u64::MAX);
    let mut store = MemoryStore::default();
    let mut req = Policy::new(engine.clone()).resume(ticket(&k, fp), 1);
    let mut waiters = Waiters::default();
    let Ok(Step::Run(_)) = req.drive(&mut store, NOW, &mut waiters) else {
        unreachable!()
    };
    req.handle_outcome(Outcome::Final(response()));
    let Ok(Step::Done(Finish::Stored)) = req.drive(&mut store, NOW, &mut waiters) else {
        unreachable!()
    };
    store.get(&k).cloned().unwrap()
}

fn decisions(c: &mut Criterion) {
    let engine = Engine::default();
    let policy = Policy::new(engine.clone());
    let k = key(1);
    let fp = Fingerprint::from_digest([9; 32]);
    let record = completed(&engine, &fp);
    let ticket = ticket(&k, &fp);
    let mut waiters = Waiters::default();
    let mut req = policy.resume(ticket.clone(), 5);
    let _ = req.poll(NOW, &mut waiters);
    req.handle_record(NOW, Some(&record), &mut waiters);
    assert!(matches!(req.decision(), Some(Decision::Replay(_))));
    let mut g = c.benchmark_group("engine");
    // The machine's decision on the record it read: a replay. A request owns its key and
    // fingerprint, so their copy from the ticket is part of the work.
    g.bench_function("replay decision", |b| {
        b.iter(|| {
            let mut req = policy.resume(ticket.clone(), 5);
            let _ = req.poll(NOW, &mut waiters);
            req.handle_record(NOW, Some(black_box(&record)), &mut waiters);
            black_box(req.decision().is_some())
        })
    });
    // The machine's claim on no record, then its completion: both writes, no store.
    g.bench_function("execute + complete", |b| {
        b.iter_batched(
            response,
            |resp| {
                let mut req = policy.resume(black_box(&ticket).clone(), 5);
                let _ = req.poll(NOW, &mut waiters);
                req.handle_record(NOW, None, &mut waiters);
                let claim = req.poll(NOW, &mut waiters);
                req.handle_applied(NOW, Applied::Applied, &mut waiters);
                let _ = req.poll(NOW, &mut waiters);
                req.handle_outcome(Outcome::Final(resp));
                let complete = req.poll(NOW, &mut waiters);
                (black_box(claim), black_box(complete))
            },
            BatchSize::SmallInput,
        )
    });
    g.finish();
}

fn fingerprints(c: &mut Criterion) {
    let mut g = c.benchmark_group("fingerprint");
    for size in [1024usize, 64 * 1024] {
        let raw: Vec<u8> = (0..size).map(|i| (i * 31 % 251) as u8).collect();
        // A JSON object of about the same size: many small members.
        let mut json = String::from("{");
        let mut i = 0;
        while json.len() < size - 40 {
            if i > 0 {
                json.push(',');
            }
            json.push_str(&format!(
                "\"field_{i}\":{{\"amount\":{},\"label\":\"item {i}\"}}",
                i * 7
            ));
            i += 1;
        }
        json.push('}');
        // An order as APIs receive it: nested objects, arrays of line items, decimals,
        // escaped text, members out of order.
        let mut order = String::from(
            r#"{"customer":{"id":"cus_8f2k","email":"ana@example.com","address":{"line1":"1 Rue \"Neuve\"","city":"Lyon","postal_code":"69001","country":"FR"}},"currency":"eur","note":"Leave at the door\nRing twice","items":["#,
        );
        let mut n = 0;
        while order.len() < size - 120 {
            if n > 0 {
                order.push(',');
            }
            order.push_str(&format!(
                r#"{{"sku":"sku_{n:05}","quantity":{},"unit_price":{}.{:02},"tags":["gift","fragile"],"options":{{"wrap":false,"engraving":null}}}}"#,
                n % 5 + 1,
                n * 3 + 1,
                n % 100
            ));
            n += 1;
        }
        order.push_str(r#"],"total":1234.56,"metadata":{"source":"web","campaign":"winter"}}"#);
        let spec = FingerprintSpec::default();
        let kib = size / 1024;
        let bodies: [(String, &str, &[u8]); 3] = [
            (format!("raw {kib} KiB"), "application/octet-stream", &raw),
            (
                format!("json {kib} KiB"),
                "application/json",
                json.as_bytes(),
            ),
            (
                format!("json order {kib} KiB"),
                "application/json",
                order.as_bytes(),
            ),
        ];
        for (name, content_type, body) in bodies {
            g.throughput(Throughput::Bytes(body.len() as u64));
            g.bench_function(name, |b| {
                b.iter(|| {
                    spec.fingerprint(&RequestParts {
                        method: "POST",
                        target: "/v1/charges",
                        content_type: Some(content_type),
                        headers: &[],
                        body: black_box(body),
                    })
                })
            });
        }
    }
    g.finish();
}

const MILLION: u64 = 1_000_000;

fn filled_store(engine: &Engine, n: u64) -> MemoryStore {
    let mut store = MemoryStore::new(MemoryStoreLimits {
        max_entries: usize::MAX,
        max_bytes: usize::MAX,
    });
    let fp = Fingerprint::from_digest([3; 32]);
    // Every record shares one response body, so the measurement is of per-key overhead.
    let record = completed(engine, &fp);
    for i in 0..n {
        let k = key(i);
        let r = record.clone();
        let _ = store
            .apply(
                NOW,
                Write {
                    key: k,
                    precondition: Precondition::Absent,
                    op: WriteOp::Put(r),
                },
            )
            .unwrap();
    }
    store
}

/// A request with the new key `key(n)` at `now`: its machine's claim, then its finish with
/// a response.
fn new_key(
    store: &mut MemoryStore,
    policy: &Policy,
    now: UnixMillis,
    n: u64,
    fp: &Fingerprint,
) -> Finish {
    let ticket = Ticket {
        key: key(n),
        fingerprint: fp.clone(),
        subject: Subject::Record,
    };
    let mut req = policy.resume(ticket, n);
    let mut waiters = Waiters::default();
    let Ok(Step::Run(_)) = req.drive(store, now, &mut waiters) else {
        unreachable!()
    };
    req.handle_outcome(Outcome::Final(response()));
    match req.drive(store, now, &mut waiters) {
        Ok(Step::Done(finish)) => finish,
        _ => unreachable!(),
    }
}

fn store(c: &mut Criterion) {
    let engine = Engine::default();
    let policy = Policy::new(engine.clone());
    let mut store = filled_store(&engine, MILLION);
    let fp = Fingerprint::from_digest([3; 32]);
    let mut g = c.benchmark_group("memory store (1M keys)");
    g.throughput(Throughput::Elements(1));
    // Keys are built before timing: a spread of 4096 of the million, visited in turn.
    let keys: Vec<RecordKey> = (0..4096u64).map(|j| key(j * 244_140 % MILLION)).collect();
    let tickets: Vec<Ticket> = keys.iter().map(|k| ticket(k, &fp)).collect();
    let mut i = 0usize;
    let mut waiters = Waiters::default();
    let mut req = policy.resume(tickets[0].clone(), 7);
    assert_eq!(req.drive(&mut store, NOW, &mut waiters), Ok(Step::Reply));
    assert!(matches!(req.decision(), Some(Decision::Replay(_))));
    // The machine's claim of a request whose key is completed: it reads the record, decides
    // a replay, and has its reply. The request owns its key (copied from the ticket).
    g.bench_function("replay (claim of a completed key)", |b| {
        b.iter(|| {
            i = (i + 1) % tickets.len();
            let mut req = policy.resume(tickets[i].clone(), 7);
            black_box(req.drive(&mut store, NOW, &mut waiters).unwrap())
        })
    });
    let mut n = MILLION;
    g.bench_function("new key: claim + finish", |b| {
        b.iter(|| {
            n += 1;
            black_box(new_key(&mut store, &policy, NOW, n, &fp))
        })
    });
    g.finish();

    // The floor, in the same run: a std HashMap of the same million keys (scope and key as
    // one string) to a 32-byte digest, its lookup and its insert of a new key.
    let mut map = filled_map(MILLION);
    let flat_keys: Vec<String> = keys.iter().map(flat).collect();
    let mut g = c.benchmark_group("floor: std HashMap<String, [u8; 32]> (1M keys)");
    g.throughput(Throughput::Elements(1));
    let mut i = 0usize;
    g.bench_function("lookup", |b| {
        b.iter(|| {
            i = (i + 1) % flat_keys.len();
            black_box(map.get(black_box(&flat_keys[i])).copied())
        })
    });
    let mut n = MILLION;
    g.bench_function("insert of a new key", |b| {
        b.iter(|| {
            n += 1;
            let k = key(n);
            black_box(map.insert(flat(&k), [3; 32]))
        })
    });
    g.finish();
    drop(map);

    let mut g = c.benchmark_group("expiry sweep");
    for expiring in [1_000u64, 10_000] {
        g.throughput(Throughput::Elements(expiring));
        g.bench_function(format!("{expiring} due among 100k"), |b| {
            b.iter_batched(
                || {
                    let mut s = filled_store(&engine, 100_000);
                    // Give `expiring` of them a response that ends sooner.
                    let short = Engine::new(Config {
                        response_ttl: Duration::from_secs(1),
                        ..Config::default()
                    })
                    .unwrap();
                    let r = completed(&short, &fp);
                    for j in 0..expiring {
                        let k = key(200_000 + j);
                        let r = r.clone();
                        let _ = s
                            .apply(
                                NOW,
                                Write {
                                    key: k,
                                    precondition: Precondition::Absent,
                                    op: WriteOp::Put(r),
                                },
                            )
                            .unwrap();
                    }
                    s
                },
                // The store is returned so that dropping it is not timed.
                |mut s| {
                    (
                        black_box(s.sweep(NOW.saturating_add(Duration::from_secs(2)))),
                        s,
                    )
                },
                BatchSize::LargeInput,
            )
        });
    }
    g.finish();
}

fn rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

fn memory_report() {
    let engine = Engine::default();
    let before = rss_bytes();
    let store = filled_store(&engine, MILLION);
    let after = rss_bytes();
    let stats = store.stats();
    let key_bytes = key(0).scope.as_str().len() + key(0).key.len();
    if let (Some(b), Some(a)) = (before, after) {
        let per_key = (a.saturating_sub(b)) as f64 / MILLION as f64;
        println!(
            "memory store: {} keys, resident {:.0} bytes/key in all, {:.0} beyond the {} key bytes (response body shared); accounted {} bytes/key",
            stats.entries,
            per_key,
            per_key - key_bytes as f64,
            key_bytes,
            stats.bytes / stats.entries
        );
    }
    drop(store);
}

/// The growing store, in a shape both sides share: a million keys, then a million new keys
/// timed as one run, so that the store and the std HashMap floor each cross the same table
/// doublings (where criterion's growing rows time a number of keys of their own choosing,
/// and a doubling falls inside one side's samples and not the other's). Printed per key,
/// each side run twice, the two taking turns.
fn growth_report() {
    let engine = Engine::default();
    let policy = Policy::new(engine.clone());
    let fp = Fingerprint::from_digest([3; 32]);
    let per_key = |start: std::time::Instant| start.elapsed().as_secs_f64() * 1e6 / MILLION as f64;
    for _ in 0..2 {
        let mut store = filled_store(&engine, MILLION);
        let start = std::time::Instant::now();
        for n in MILLION..2 * MILLION {
            black_box(new_key(&mut store, &policy, NOW, n, &fp));
        }
        let store_us = per_key(start);
        drop(store);

        let mut map = filled_map(MILLION);
        let start = std::time::Instant::now();
        for n in MILLION..2 * MILLION {
            black_box(map.insert(flat(&key(n)), [3; 32]));
        }
        let map_us = per_key(start);
        drop(map);
        println!(
            "growing from 1M to 2M keys, per new key: memory store claim + finish {store_us:.2} µs, std HashMap insert {map_us:.2} µs ({:.2}x)",
            store_us / map_us
        );
    }
}

/// A store at its steady state, as a server that has run longer than its retention: a
/// million records, one written per millisecond, whose responses and keys expire a million
/// milliseconds after their write. Each new key's write therefore also expires the oldest
/// record (the sweep every write makes), so a new key costs its claim and finish plus one
/// expiry, with the deadline index at a million entries.
fn steady(c: &mut Criterion) {
    let ttl = Duration::from_millis(MILLION);
    let engine = Engine::new(Config {
        response_ttl: ttl,
        key_ttl: ttl,
        ..Config::default()
    })
    .unwrap();
    let policy = Policy::new(engine);
    let mut store = MemoryStore::new(MemoryStoreLimits {
        max_entries: usize::MAX,
        max_bytes: usize::MAX,
    });
    let fp = Fingerprint::from_digest([3; 32]);
    let add = |store: &mut MemoryStore, n: u64| {
        new_key(
            store,
            &policy,
            NOW.saturating_add(Duration::from_millis(n)),
            n,
            &fp,
        )
    };
    for n in 0..MILLION {
        add(&mut store, n);
    }
    let mut n = MILLION;
    let mut g = c.benchmark_group("memory store (1M keys, steady state)");
    g.throughput(Throughput::Elements(1));
    g.bench_function("new key: claim + finish, the oldest expiring", |b| {
        b.iter(|| {
            n += 1;
            black_box(add(&mut store, n))
        })
    });
    g.finish();
    // Every write expired as many records as it added.
    assert!(store.stats().entries <= MILLION as usize + 1);
    drop(store);

    // The floor at the same steady state: the std HashMap of the growing floor above, a
    // million keys, each new key's insert paired with the removal of the oldest key (its
    // string built again, as the insert's is).
    let mut map = filled_map(MILLION);
    let mut n = MILLION;
    let mut g = c.benchmark_group("floor: std HashMap<String, [u8; 32]> (1M keys, steady state)");
    g.throughput(Throughput::Elements(1));
    g.bench_function("insert of a new key, the oldest removed", |b| {
        b.iter(|| {
            let old = map.remove(&flat(&key(n - MILLION)));
            n += 1;
            black_box((map.insert(flat(&key(n - 1)), [3; 32]), old))
        })
    });
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().measurement_time(Duration::from_secs(3)).warm_up_time(Duration::from_secs(1));
    targets = decisions, fingerprints, store, steady
}

fn main() {
    memory_report();
    growth_report();
    benches();
    Criterion::default().configure_from_args().final_summary();
}
