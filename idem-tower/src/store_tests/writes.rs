//! The compare-and-set contract (`IDEM-STORE-1`), checked write by write: the engine's claims
//! applied to the store directly, racing and in turn.

use super::{apply, load, unique, Options};
use idem_core::{
    Applied, AsyncStore, Engine, Intake, Policy, Precondition, Step, UnixMillis, Waiters, Write,
    WriteOp,
};
use std::fmt;
use std::future::Future;
use std::sync::Arc;

/// `n` claims of one key (single tenant, `POST /orders`), as the engine writes them: each
/// an in-flight record with a version of its own.
pub fn claims(key: &str, n: usize) -> Vec<Write> {
    let policy = Policy::new(Engine::default());
    (0..n)
        .map(|_| {
            let quoted = format!("\"{key}\"");
            let keys: [&[u8]; 1] = [quoted.as_bytes()];
            let intake = Intake {
                principal: None,
                method: "POST",
                route: "/orders",
                target: "/orders",
                keys: &keys,
                low_water: None,
                client: None,
                content_type: Some("application/json"),
                headers: &[],
                body: b"{\"amount\":100}",
            };
            let mut request = policy.request(&intake, crate::drive::nonce());
            let mut waiters = Waiters::default();
            let now = UnixMillis::now();
            assert_eq!(request.poll(now, &mut waiters), Step::Claim);
            request.handle_record(now, None, &mut waiters);
            match request.poll(now, &mut waiters) {
                Step::Apply(write) => write,
                other => panic!("expected a claim write, got {other:?}"),
            }
        })
        .collect()
}

fn with_precondition(write: &Write, precondition: Precondition) -> Write {
    Write {
        precondition,
        ..write.clone()
    }
}

fn version_of(write: &Write) -> u64 {
    match &write.op {
        WriteOp::Put(r) => r.version,
        WriteOp::Delete => panic!("a claim is a put"),
    }
}

/// One of 32 racing claims of a key wins, then one of 31 racing updates, then one of 16
/// identical updates (`IDEM-STORE-1`).
pub async fn compare_and_set<St, F, Fut>(open: &F, options: &Options)
where
    St: AsyncStore + Send + Sync + 'static,
    St::Error: fmt::Display,
    F: Fn() -> Fut,
    Fut: Future<Output = St>,
{
    let stores = if options.shared {
        vec![Arc::new(open().await), Arc::new(open().await)]
    } else {
        vec![Arc::new(open().await)]
    };
    for round in 0..5 {
        let writes = claims(&unique("cas"), 32);
        let key = writes[0].key.clone();
        let results = race(&stores, writes.clone()).await;
        let won = applied(&results);
        assert_eq!(
            won.len(),
            1,
            "round {round}: {} of 32 claims applied",
            won.len()
        );
        let winner = &writes[won[0]];
        let stored = load(&*stores[0], &key).await.expect("the winner's record");
        assert_eq!(stored.version, version_of(winner));
        let updates: Vec<Write> = writes
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != won[0])
            .map(|(_, w)| with_precondition(w, Precondition::Version(version_of(winner))))
            .collect();
        let done = race(&stores, updates.clone()).await;
        let updated = applied(&done);
        assert_eq!(
            updated.len(),
            1,
            "round {round}: {} of 31 updates applied",
            updated.len()
        );
        let after = load(&*stores[stores.len() - 1], &key)
            .await
            .expect("a record");
        assert_eq!(after.version, version_of(&updates[updated[0]]));
        // 16 writes alike to the byte over one version, as two takeovers of one lease in the
        // same millisecond make: one is made.
        let same = writes
            .iter()
            .find(|w| version_of(w) != after.version)
            .map(|w| with_precondition(w, Precondition::Version(after.version)))
            .expect("a write of another version");
        let copies = race(&stores, vec![same; 16]).await;
        assert_eq!(
            applied(&copies).len(),
            1,
            "round {round}: {} of 16 identical updates applied",
            applied(&copies).len()
        );
    }
}

/// The indices of the writes that were applied.
fn applied(results: &[Applied]) -> Vec<usize> {
    (0..results.len())
        .filter(|&i| results[i] == Applied::Applied)
        .collect()
}

/// Applies the writes at once, spread over the stores, each in a task of its own.
async fn race<St>(stores: &[Arc<St>], writes: Vec<Write>) -> Vec<Applied>
where
    St: AsyncStore + Send + Sync + 'static,
    St::Error: fmt::Display,
{
    let barrier = Arc::new(tokio::sync::Barrier::new(writes.len()));
    let tasks: Vec<_> = writes
        .into_iter()
        .enumerate()
        .map(|(i, w)| {
            let store = Arc::clone(&stores[i % stores.len()]);
            let barrier = Arc::clone(&barrier);
            tokio::spawn(async move {
                barrier.wait().await;
                match store.apply(UnixMillis::now(), w).await {
                    Ok(a) => a,
                    Err(e) => panic!("apply: the store failed: {e}"),
                }
            })
        })
        .collect();
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.expect("a racing write panicked"));
    }
    out
}

/// A write with a stale or missing version changes nothing; a delete needs the version too.
pub async fn versions<St, F, Fut>(open: &F)
where
    St: AsyncStore,
    St::Error: fmt::Display,
    F: Fn() -> Fut,
    Fut: Future<Output = St>,
{
    let store = open().await;
    let writes = claims(&unique("ver"), 3);
    let (a, b, c) = (&writes[0], &writes[1], &writes[2]);
    let key = a.key.clone();
    let other = |v: u64| Precondition::Version(v.wrapping_add(12345));
    assert!(load(&store, &key).await.is_none());
    assert_eq!(
        apply(&store, with_precondition(b, other(version_of(b)))).await,
        Applied::Conflict
    );
    assert!(
        load(&store, &key).await.is_none(),
        "an update of a missing record created it"
    );
    assert_eq!(apply(&store, a.clone()).await, Applied::Applied);
    assert_eq!(
        apply(&store, b.clone()).await,
        Applied::Conflict,
        "a claim over a record"
    );
    assert_eq!(
        load(&store, &key).await.map(|r| r.version),
        Some(version_of(a))
    );
    assert_eq!(
        apply(&store, with_precondition(b, other(version_of(a)))).await,
        Applied::Conflict
    );
    assert_eq!(
        apply(
            &store,
            with_precondition(b, Precondition::Version(version_of(a)))
        )
        .await,
        Applied::Applied
    );
    let now = load(&store, &key).await.expect("b's record");
    assert_eq!(now.version, version_of(b));
    let delete = |v| Write {
        key: key.clone(),
        precondition: Precondition::Version(v),
        op: WriteOp::Delete,
    };
    assert_eq!(
        apply(&store, delete(version_of(a))).await,
        Applied::Conflict
    );
    assert!(load(&store, &key).await.is_some());
    assert_eq!(apply(&store, delete(version_of(b))).await, Applied::Applied);
    assert!(load(&store, &key).await.is_none());
    assert_eq!(
        apply(&store, c.clone()).await,
        Applied::Applied,
        "a deleted key is new again"
    );
}
